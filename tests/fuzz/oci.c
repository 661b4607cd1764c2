/* oci.c - fuzz entry point for what an OCI registry says in its headers and tag names
 * (registry/common/oci.c, oci_kiln.c): a WWW-Authenticate challenge's parameters, a Link
 * header's next page, and a tag read as a channel record's _ch.CHANNEL.SEQ. The input is split
 * at its first three NUL bytes into a challenge, a Link header and a tag (missing parts empty).
 * Checked beyond "no crash, leak or UB": a parameter found fits its buffer; a next page is a
 * string inside the header; a record tag gives a non-empty channel of at most 64 bytes and a
 * seq of at least 1 whose decimal form ends the tag. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "oci_int.h"

int kiln_fuzz_oci(const uint8_t *data, size_t size);

int kiln_fuzz_oci(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 4);
    if (!buf) return 0;
    memcpy(buf, data, size);
    memset(buf + size, 0, 4);
    const char *part[3];
    const char *p = buf, *end = buf + size;
    for (int i = 0; i < 3; i++) {
        part[i] = p;
        p += strlen(p);
        if (p < end) p++;
    }
    const char *names[] = {"realm", "service", "scope"};
    for (size_t i = 0; i < 3; i++) {
        char out[64];
        if (reg_oci_challenge_param(part[0], names[i], out, sizeof out) &&
            strlen(out) >= sizeof out)
            __builtin_trap();
    }
    char *next = reg_oci_link_next(part[1]);
    if (next && strlen(next) >= strlen(part[1])) __builtin_trap();
    free(next);
    char ch[KILN_REGISTRY_NAME_MAX + 1];
    int64_t seq = 0;
    if (reg_oci_record_tag(part[2], ch, &seq)) {
        char tail[32];
        snprintf(tail, sizeof tail, ".%" PRId64, seq);
        size_t tl = strlen(part[2]), sl = strlen(tail);
        if (!ch[0] || strlen(ch) > KILN_REGISTRY_NAME_MAX || seq < 1 || tl < sl ||
            strcmp(part[2] + tl - sl, tail))
            __builtin_trap();
    }
    free(buf);
    return 0;
}

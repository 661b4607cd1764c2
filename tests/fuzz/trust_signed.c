/* trust_signed.c - fuzz entry point for signed trust policies: parse (as a --trust file is
 * read), then check as the successor of a fixed version 1 whose one root key (the vector
 * key) signed the seed documents, describe the change, and read an accepted document's
 * canonical policy back as the same policy. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "fuzz.h"
#include "sign.h"

int kiln_fuzz_trust_signed(const uint8_t *data, size_t size);

static const char v1[] =
    "{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"vector\",\"pubkey\":\"" KILN_FUZZ_PUBKEY
    "\",\"roles\":[\"root\",\"promote\",\"release\"]}],\"channels\":{\"production\":{"
    "\"threshold\":1}}}";

int kiln_fuzz_trust_signed(const uint8_t *data, size_t size) {
    kiln_sign_trust *t = NULL, *cur = NULL, *next = NULL;
    if (kiln_sign_trust_parse((const char *)data, size, "fuzz.json", &t) == KILN_OK) {
        uint64_t v = kiln_sign_trust_version(t);
        if (v < 1 || v > KILN_SIGN_TRUST_VERSION_MAX) __builtin_trap();
        int rt = kiln_sign_trust_root_threshold(t);
        if (rt < 1 || (kiln_sign_trust_role_count(t, KILN_SIGN_ROLE_ROOT) &&
                       rt > kiln_sign_trust_role_count(t, KILN_SIGN_ROLE_ROOT)))
            __builtin_trap();
        if (kiln_sign_trust_signatures(t) > KILN_SIGN_TRUST_MAX_SIGS) __builtin_trap();
    }
    if (kiln_sign_trust_parse(v1, sizeof v1 - 1, "v1", &cur) != KILN_OK) __builtin_trap();
    kiln_sign_trust_update_result res;
    kiln_err rc = kiln_sign_trust_update(cur, (const char *)data, size, "fuzz.json", &next, &res);
    if (rc == KILN_OK) {
        /* Accepted: the next version, both quorums met, every signature counted somewhere. */
        if (!next || kiln_sign_trust_version(next) != 2 || res.nold < 1 ||
            res.nnew < (size_t)kiln_sign_trust_root_threshold(next) || res.nsigs < 1 ||
            !t || kiln_sign_trust_signatures(t) != res.nsigs)
            __builtin_trap();
        for (size_t i = 0; i < res.nsigs; i++)
            if (!res.sigs[i].old_root && !res.sigs[i].new_root) __builtin_trap();
        char *d = kiln_sign_trust_diff(cur, next);
        if (!d) __builtin_trap();
        free(d);
        /* What was signed (the canonical text of the parsed policy) means what was accepted:
         * read back alone, it is the same policy. */
        json_t *j = json_loadb((const char *)data, size, 0, NULL);
        char *canon = j ? kiln_json_canonical(json_object_get(j, "policy")) : NULL;
        kiln_sign_trust *back = NULL;
        if (!canon || kiln_sign_trust_parse(canon, strlen(canon), "canonical", &back) != KILN_OK ||
            kiln_sign_trust_version(back) != kiln_sign_trust_version(next))
            __builtin_trap();
        d = kiln_sign_trust_diff(next, back);
        if (!d || *d) __builtin_trap();
        free(d);
        free(canon);
        json_decref(j);
        kiln_sign_trust_free(back);
    } else if (next) {
        __builtin_trap();
    }
    kiln_sign_trust_free(next);
    kiln_sign_trust_free(cur);
    kiln_sign_trust_free(t);
    kiln_errclear();
    return 0;
}

/* fuzz.h - shared by the fuzz entry points in tests/fuzz/NAME.c: each defines
 * int kiln_fuzz_NAME(const uint8_t *data, size_t size), which takes any bytes, never
 * crashes or leaks, and returns 0. `make fuzz` runs them under libFuzzer;
 * tests/test_fuzz_replay.c replays tests/fuzz/corpus/NAME/ through them in `make test`. */
#ifndef KILN_FUZZ_H
#define KILN_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core.h"

/* The public key of tests/vectors/minisign/test.pub, which signed the seed inputs. */
#define KILN_FUZZ_PUBKEY "RWSZOapHYy2q7zXTxbL987oMDpT8r5AkK2m4nBviI9hT6h4CWkywdCKn"
/* What the seed signatures sign (tests/vectors/minisign/msg.txt). */
#define KILN_FUZZ_MESSAGE "hello model\n"

/* For readers that take a path: write the bytes to a new file $TMPDIR/kiln-fuzz-TAG-XXXXXX
 * (unique per call) and return its path, or NULL if that failed. The caller unlinks it
 * (kiln_fuzz_tmp_done) on every path. */
static inline char *kiln_fuzz_tmp_write(const char *tag, const uint8_t *data, size_t size) {
    const char *dir = getenv("TMPDIR");
    char *path = kiln_asprintf("%s/kiln-fuzz-%s-XXXXXX", dir && *dir ? dir : "/tmp", tag);
    if (!path) return NULL;
    int fd = mkstemp(path);
    if (fd < 0) {
        free(path);
        return NULL;
    }
    size_t off = 0;
    while (off < size) {
        ssize_t n = write(fd, data + off, size - off);
        if (n <= 0) break;
        off += (size_t)n;
    }
    close(fd);
    if (off != size) {
        unlink(path);
        free(path);
        return NULL;
    }
    return path;
}

static inline void kiln_fuzz_tmp_done(char *path) {
    if (path) unlink(path);
    free(path);
}

#endif

/* test_fuzz_replay.c - replay the saved fuzz corpus in `make test`: every file under
 * tests/fuzz/corpus/NAME/ goes through kiln_fuzz_NAME (under ASan+UBSan in the second run).
 * The table of entry points is generated from the files tests/fuzz/NAME.c (build/fuzz-targets.inc):
 * adding a target is adding tests/fuzz/NAME.c and tests/fuzz/corpus/NAME/. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

#define F(n) int kiln_fuzz_##n(const uint8_t *data, size_t size);
#include "fuzz-targets.inc"
#undef F

static const struct {
    const char *name;
    int (*fn)(const uint8_t *data, size_t size);
} targets[] = {
#define F(n) {#n, kiln_fuzz_##n},
#include "fuzz-targets.inc"
#undef F
};

#define CORPUS "tests/fuzz/corpus"

/* Replay every file of one corpus directory; returns how many. */
static size_t replay_dir(const char *dir, int (*fn)(const uint8_t *, size_t)) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *p = kiln_path_join(dir, e->d_name), *buf = NULL;
        size_t len = 0;
        if (CHECK("corpus file reads", p && kiln_read_file(p, 1u << 20, &buf, &len) == KILN_OK)) {
            /* A private copy of exactly len bytes, so ASan sees any read past the end. */
            uint8_t *exact = malloc(len ? len : 1);
            if (exact) memcpy(exact, buf, len);
            if (!CHECK("entry point returns 0", exact && fn(exact, len) == 0))
                fprintf(stderr, "    input: %s\n", p);
            free(exact);
            n++;
        }
        free(buf);
        free(p);
    }
    closedir(d);
    return n;
}

KILN_TEST(fuzz_replay_corpus) {
    /* Every entry point has a non-empty saved corpus... */
    for (size_t i = 0; i < KILN_ARRAY_LEN(targets); i++) {
        char *dir = kiln_path_join(CORPUS, targets[i].name);
        size_t n = dir ? replay_dir(dir, targets[i].fn) : 0;
        if (!CHECK("each fuzz target has a saved corpus", n > 0))
            fprintf(stderr, "    no inputs in %s\n", dir ? dir : targets[i].name);
        free(dir);
    }
    /* ...and every corpus directory has an entry point. */
    DIR *d = opendir(CORPUS);
    if (!CHECK("corpus directory exists", d)) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        bool known = false;
        for (size_t i = 0; i < KILN_ARRAY_LEN(targets); i++)
            known = known || !strcmp(targets[i].name, e->d_name);
        if (!CHECK("each corpus directory has an entry point tests/fuzz/NAME.c", known))
            fprintf(stderr, "    %s/%s\n", CORPUS, e->d_name);
    }
    closedir(d);
}

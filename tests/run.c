/* run.c - the test runner: tests/run [--shuffle[=SEED]] [name...] runs all tests, or those
 * named (a name matches by prefix). Prints "N passed, N failed" last; exits 1 on failure.
 * --shuffle runs them in an order drawn from SEED (from the clock when none is given; the
 * seed is printed first, so a failing order can be run again): a test whose numbers depend
 * on what an earlier test left behind (a library's state, a cached choice) fails in some
 * order (issue 28). */
#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"

#define T(n) void test_##n(void);
#include "tests.inc"
#undef T

static const struct {
    const char *name;
    void (*fn)(void);
} tests[] = {
#define T(n) {#n, test_##n},
#include "tests.inc"
#undef T
};

static int failures;
static char root[2048], dir[4096];

bool kiln_check(bool ok, const char *descr, const char *file, int line) {
    if (!ok) {
        failures++;
        fprintf(stderr, "    FAIL %s:%d: %s", file, line, descr);
        if (*kiln_errmsg()) fprintf(stderr, " [last error: %s]", kiln_errmsg());
        fputc('\n', stderr);
    }
    return ok;
}

const char *kiln_test_dir(void) { return dir; }

char *kiln_test_path(const char *name) { return kiln_path_join(dir, name); }

char *kiln_test_vector(const char *name) {
    const char *v = getenv("KILN_VECTORS");
    return kiln_path_join(v && *v ? v : "tests/vectors", name);
}

bool kiln_test_sanitized(void) {
#if defined(__SANITIZE_ADDRESS__)
    return true;
#else
    return false;
#endif
}

char *kiln_test_write(const char *name, const void *data, size_t len) {
    char *p = kiln_test_path(name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(data, 1, len, f) != len) {
        fprintf(stderr, "    cannot write test file %s\n", p);
        failures++;
    }
    if (f) fclose(f);
    return p;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

int main(int argc, char **argv) {
    const char *tmp = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/kiln-tests-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 2;
    }
    enum { N_TESTS = sizeof tests / sizeof tests[0] };
    size_t order[N_TESTS];
    for (size_t i = 0; i < N_TESTS; i++)
        order[i] = i;
    int names = 0;
    for (int a = 1; a < argc; a++) {
        if (strncmp(argv[a], "--shuffle", 9) != 0) {
            argv[++names] = argv[a]; /* the names, moved to the front */
            continue;
        }
        uint64_t seed = kiln_now_ns() % 1000000;
        char *end = NULL;
        if (argv[a][9] == '=') seed = strtoull(argv[a] + 10, &end, 10);
        if ((argv[a][9] && argv[a][9] != '=') || (end && (*end || end == argv[a] + 10))) {
            fprintf(stderr, "run-tests: '%s': expected --shuffle or --shuffle=SEED (a number)\n",
                    argv[a]);
            return 2;
        }
        fprintf(stderr, "run-tests: shuffled with --shuffle=%llu\n", (unsigned long long)seed);
        uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1; /* xorshift64*, Fisher-Yates */
        for (size_t i = N_TESTS - 1; i > 0; i--) {
            x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
            size_t j = (size_t)((x * 0x2545F4914F6CDD1Dull) >> 33) % (i + 1), t = order[i];
            order[i] = order[j], order[j] = t;
        }
    }
    int passed = 0, failed = 0;
    for (size_t o = 0; o < N_TESTS; o++) {
        size_t i = order[o];
        bool want = names == 0;
        for (int a = 1; a <= names; a++)
            if (strncmp(tests[i].name, argv[a], strlen(argv[a])) == 0) want = true;
        if (!want) continue;
        snprintf(dir, sizeof dir, "%s/%s", root, tests[i].name);
        mkdir(dir, 0700);
        failures = 0;
        kiln_errclear();
        uint64_t t0 = kiln_now_ns();
        tests[i].fn();
        double secs = (double)(kiln_now_ns() - t0) / 1e9;
        if (failures) {
            failed++;
            fprintf(stderr, "FAIL %s (%.2fs; files kept in %s)\n", tests[i].name, secs, dir);
        } else {
            passed++;
            fprintf(stderr, "ok   %s (%.2fs)\n", tests[i].name, secs);
            nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        }
    }
    if (!failed) nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

/* test_core.c - errors, hashing, the generator, JSON, atomic files. */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <sodium.h>

#include "test.h"

KILN_TEST(core_philox_known_answers) {
    /* Random123's kat_vectors for philox4x32-10. */
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(kat); i++) {
        uint32_t out[4];
        kiln_philox4x32_10(kat[i].ctr, kat[i].key, out);
        CHECK("philox4x32-10 matches Random123", memcmp(out, kat[i].out, sizeof out) == 0);
    }
    uint32_t a[4], b[4];
    kiln_philox(42, 7, 1000, a);
    kiln_philox(42, 7, 1000, b);
    CHECK("pure function of (seed, stream, counter)", memcmp(a, b, sizeof a) == 0);
    kiln_philox(42, 8, 1000, b);
    CHECK("another stream gives other words", memcmp(a, b, sizeof a) != 0);
    CHECK("unit interval is open", kiln_u32_to_unit(0) > 0 && kiln_u32_to_unit(0xffffffffu) < 1);
}

KILN_TEST(core_hashes) {
    uint8_t d[32];
    char hex[65];
    kiln_sha256("abc", 3, d);
    kiln_hex(d, 32, hex);
    CHECK("sha256(abc)", strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0);
    uint8_t back[32];
    CHECK("unhex round trip", kiln_unhex(hex, back, 32) && memcmp(back, d, 32) == 0);
    CHECK("unhex refuses short", !kiln_unhex("abcd", back, 3));
    CHECK("unhex refuses non-hex", !kiln_unhex("zz", back, 1));
    char *p = kiln_test_write("abc", "abc", 3);
    uint8_t f[32];
    CHECK("sha256 of a file", kiln_sha256_file(p, f) == KILN_OK && memcmp(f, d, 32) == 0);
    free(p);
    uint8_t b2[64];
    kiln_blake2b("abc", 3, b2, 64);
    kiln_hex(b2, 4, hex);
    CHECK("blake2b-512(abc) prefix", strcmp(hex, "ba80a53f") == 0);
}

/* SHA-256 is libcrypto's now: the two-block FIPS 180-2 vector, the streamed form against
 * the one-shot, and both against libsodium's (the digests archives were signed with). */
KILN_TEST(core_sha256_streamed) {
    static const char two[] = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    uint8_t d[32];
    char hex[65];
    kiln_sha256(two, strlen(two), d);
    kiln_hex(d, 32, hex);
    CHECK("sha256 of the two-block vector",
          strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1") == 0);
    size_t n = (1u << 20) + 12345;
    uint8_t *buf = malloc(n);
    CHECK("buffer", buf != NULL);
    if (!buf) return;
    for (size_t i = 0; i < n; i += 16) {
        uint32_t w[4];
        kiln_philox(7, 1, i / 16, w);
        memcpy(buf + i, w, n - i < 16 ? n - i : 16);
    }
    uint8_t one[32], streamed[32], sodium[32];
    kiln_sha256(buf, n, one);
    kiln_sha256_state st;
    kiln_sha256_init(&st);
    size_t step = 1, off = 0;
    while (off < n) { /* pieces of 1, 3, 7, ... bytes: every offset within a block */
        size_t k = step < n - off ? step : n - off;
        kiln_sha256_update(&st, buf + off, k);
        off += k;
        step = step * 2 + 1;
        if (step > 100000) step = 5;
    }
    kiln_sha256_final(&st, streamed);
    crypto_hash_sha256(sodium, buf, n);
    CHECK("streamed equals one-shot", memcmp(one, streamed, 32) == 0);
    CHECK("equals libsodium's", memcmp(one, sodium, 32) == 0);
    buf[n / 2] ^= 1;
    kiln_sha256(buf, n, streamed);
    CHECK("a flipped bit changes it", memcmp(one, streamed, 32) != 0);
    free(buf);
}

KILN_TEST(core_json_strict) {
    json_t *j = NULL;
    CHECK("duplicate keys refused", kiln_json_parse("{\"a\":1,\"a\":2}", 13, "x.json", &j) == KILN_ERR_FORMAT);
    CHECK("message names the source", strstr(kiln_errmsg(), "x.json") != NULL);
    CHECK("trailing garbage refused", kiln_json_parse("{} x", 4, "y", &j) == KILN_ERR_FORMAT);
    CHECK("valid parses", kiln_json_parse("{\"b\":1,\"a\":[true]}", 18, "z", &j) == KILN_OK);
    char *c = kiln_json_canonical(j);
    CHECK("canonical is sorted and compact", c && strcmp(c, "{\"a\":[true],\"b\":1}") == 0);
    free(c);
    json_decref(j);
}

KILN_TEST(core_atomic_write) {
    char *p = kiln_test_path("f.txt");
    CHECK("write", kiln_write_file_atomic(p, "one", 3) == KILN_OK);
    kiln_atomic a;
    CHECK("begin", kiln_atomic_begin(&a, p) == KILN_OK);
    CHECK("write", kiln_atomic_write(&a, "two!", 4) == KILN_OK);
    kiln_atomic_abort(&a);
    char *buf;
    size_t len;
    CHECK("aborted write leaves the old file", kiln_read_file(p, 100, &buf, &len) == KILN_OK && len == 3 &&
                                                   memcmp(buf, "one", 3) == 0);
    free(buf);
    CHECK("read limit enforced", kiln_read_file(p, 2, &buf, &len) == KILN_ERR_LIMIT);
    char *d = kiln_test_path("x/y/z");
    CHECK("mkdir -p", kiln_mkdir_p(d) == KILN_OK && kiln_mkdir_p(d) == KILN_OK);
    char *bad = kiln_test_path("nodir/file");
    CHECK("missing directory is an error", kiln_write_file_atomic(bad, "x", 1) == KILN_ERR_IO);
    free(bad);
    free(d);
    free(p);
}

KILN_TEST(core_alloc_failure) {
    kiln_alloc_fail_after(1);
    void *p = kiln_malloc(10);
    CHECK("injected failure", p == NULL);
    CHECK("reported as out of memory", strstr(kiln_errmsg(), "out of memory") != NULL);
    p = kiln_malloc(10);
    CHECK("next allocation works", p != NULL);
    free(p);
}

/* ---- errors ---- */

static bool has(const char *s) {
    return strstr(kiln_errmsg(), s) != NULL;
}

/* ---- libraries opened on first use ---- */

static kiln_dl_lib *dl_race_lib;
static kiln_err dl_race_rc[4];

static void *dl_race(void *arg) {
    dl_race_rc[(size_t)arg] = kiln_dl_load(dl_race_lib);
    return NULL;
}

/* Which errno an error came from: set by kiln_fail_errno, kept by kiln_errprefix, cleared by
 * kiln_fail and kiln_errclear. */
KILN_TEST(core_err_errno) {
    errno = ENOSPC;
    kiln_fail_errno(KILN_ERR_IO, "writing '%s'", "x");
    CHECK("recorded", kiln_err_errno() == ENOSPC && strstr(kiln_errmsg(), "No space left"));
    kiln_errprefix(KILN_ERR_IO, "upload: ");
    CHECK("kept through a prefix", kiln_err_errno() == ENOSPC);
    kiln_fail(KILN_ERR_IO, "something else");
    CHECK("cleared by kiln_fail", kiln_err_errno() == 0);
    errno = EACCES;
    kiln_fail_errno(KILN_ERR_IO, "opening");
    kiln_errclear();
    CHECK("cleared by kiln_errclear", kiln_err_errno() == 0);
}

KILN_TEST(core_dl_load) {
    /* A library that is there (libm), from four threads at once: one load, one answer. */
    static const char *const names[] = {"cos", "sqrt"};
    void *fns[2] = {0};
    kiln_dl_lib m = {.soname = "libm.so.6", .what = "libm", .names = names, .n = 2, .fns = fns};
    dl_race_lib = &m;
    pthread_t t[4];
    int started = 0;
    for (size_t i = 0; i < 4; i++)
        started += !pthread_create(&t[i], NULL, dl_race, (void *)i);
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    CHECK("every thread loaded it", started == 4 && !dl_race_rc[0] && !dl_race_rc[1] &&
                                        !dl_race_rc[2] && !dl_race_rc[3]);
    if (CHECK("resolved", fns[0] && fns[1])) {
        double (*c)(double) = (double (*)(double))fns[1];
        CHECK("and callable", c(16.0) == 4.0);
    }
    CHECK("a second call answers at once", kiln_dl_load(&m) == KILN_OK && m.state == 1);
    /* A library that is not there, and one without a symbol asked for: the library, what
     * went wrong, and the same answer again later. */
    kiln_dl_lib none = {
        .soname = "libkiln-none.so.7", .what = "NoSuchLib", .names = names, .n = 2, .fns = fns};
    CHECK("missing library", kiln_dl_load(&none) == KILN_ERR_DEVICE && has("NoSuchLib") &&
                                 has("libkiln-none.so.7") && has("LD_LIBRARY_PATH"));
    CHECK("missing again", kiln_dl_load(&none) == KILN_ERR_DEVICE && has("NoSuchLib"));
    kiln_dl_lib hinted = {.soname = "libkiln-none.so.7",
                          .what = "NoSuchLib",
                          .names = names,
                          .n = 2,
                          .fns = fns,
                          .hint = "install kiln-none"};
    CHECK("a library's own hint", kiln_dl_load(&hinted) == KILN_ERR_DEVICE &&
                                      has("install kiln-none") && !has("LD_LIBRARY_PATH"));
    /* Opened RTLD_GLOBAL, its symbols serve later lookups of the whole process (libcrypt:
     * on every Debian, loaded by nothing else in this binary). */
    static const char *const cn[] = {"crypt_preferred_method"};
    void *cf[1] = {0};
    CHECK("libcrypt not loaded yet", !dlsym(RTLD_DEFAULT, "crypt_preferred_method"));
    kiln_dl_lib cr = {
        .soname = "libcrypt.so.1", .what = "libcrypt", .names = cn, .n = 1, .fns = cf, .global = true};
    CHECK("global", kiln_dl_load(&cr) == KILN_OK &&
                        dlsym(RTLD_DEFAULT, "crypt_preferred_method") == cf[0]);
    static const char *const bad[] = {"cos", "kiln_no_such_symbol"};
    kiln_dl_lib sym = {.soname = "libm.so.6", .what = "libm", .names = bad, .n = 2, .fns = fns};
    CHECK("missing symbol", kiln_dl_load(&sym) == KILN_ERR_DEVICE &&
                                has("no symbol 'kiln_no_such_symbol'"));
}

KILN_TEST(core_path_dir_state) {
    char *d = kiln_test_path("d"), *f = kiln_test_path("d/f"), *none = kiln_test_path("none");
    CHECK("absent", kiln_path_dir_state(none) == KILN_DIR_ABSENT);
    CHECK("mkdir", kiln_mkdir_p(d) == KILN_OK);
    CHECK("empty", kiln_path_dir_state(d) == KILN_DIR_EMPTY);
    CHECK("write", kiln_write_file_atomic(f, "x", 1) == KILN_OK);
    CHECK("full", kiln_path_dir_state(d) == KILN_DIR_FULL);
    CHECK("a file is other", kiln_path_dir_state(f) == KILN_DIR_OTHER);
    free(d), free(f), free(none);
}

KILN_TEST(core_ckpt_names) {
    /* One rule for the trainer, runs/ and export/: at least 8 digits, more past 99999999 (runs/
     * once read exactly 8 and missed such a checkpoint that export/ froze). */
    char name[KILN_CKPT_NAME_MAX];
    kiln_ckpt_name(42, name);
    CHECK("8 digits", !strcmp(name, "step-00000042.safetensors"));
    kiln_ckpt_name(123456789, name);
    CHECK("more past 99999999", !strcmp(name, "step-123456789.safetensors"));
    char *dir = kiln_test_path("ckpt");
    CHECK("mkdir", kiln_mkdir_p(dir) == KILN_OK);
    const char *files[] = {"step-123456789.safetensors", "step-00000005.safetensors",
                           "step-5.safetensors", "step-00000007.safetensors.tmp",
                           "step-0000000x.safetensors", "run.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char *p = kiln_path_join(dir, files[i]);
        CHECK(files[i], p && kiln_write_file_atomic(p, "x", 1) == KILN_OK);
        free(p);
    }
    long *steps = NULL;
    size_t n = 0;
    CHECK("listed ascending, only checkpoints", kiln_ckpt_steps(dir, &steps, &n) == KILN_OK &&
                                                    n == 2 && steps[0] == 5 &&
                                                    steps[1] == 123456789);
    free(steps);
    char *none = kiln_test_path("no-such-ckpt");
    CHECK("a missing folder holds none",
          kiln_ckpt_steps(none, &steps, &n) == KILN_OK && n == 0 && !steps);
    free(none);
    free(dir);
}

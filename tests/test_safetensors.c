/* test_safetensors.c - the reader refuses every malformed file with a message that
 * names the file and the tensor; the writer round-trips and is byte-stable. */
#include <stdlib.h>
#include <string.h>

#include "test.h"

/* A file from a header text and n data bytes. */
static char *make_st(const char *name, const char *header, size_t ndata) {
    size_t hl = strlen(header);
    unsigned char *buf = calloc(1, 8 + hl + ndata);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    char *p = kiln_test_write(name, buf, 8 + hl + ndata);
    free(buf);
    return p;
}

static kiln_err open_st(const char *header, size_t ndata) {
    char *p = make_st("t.safetensors", header, ndata);
    kiln_st *st = NULL;
    kiln_err rc = kiln_st_open(p, &st);
    kiln_st_close(st);
    free(p);
    return rc;
}

KILN_TEST(safetensors_round_trip) {
    float a[6] = {1, 2, 3, 4, 5, 6};
    int32_t b[2] = {7, -8};
    uint16_t c[3] = {kiln_f32_to_bf16(1.5f), kiln_f32_to_bf16(-2.0f), kiln_f32_to_bf16(0.1f)};
    kiln_st_writer *w;
    CHECK("writer", kiln_st_writer_new(&w) == KILN_OK);
    CHECK("add a", kiln_st_writer_add(w, "zeta", KILN_F32, 2, (int64_t[]){2, 3}, a) == KILN_OK);
    CHECK("add b", kiln_st_writer_add(w, "alpha", KILN_I32, 1, (int64_t[]){2}, b) == KILN_OK);
    CHECK("add c", kiln_st_writer_add(w, "mid", KILN_BF16, 1, (int64_t[]){3}, c) == KILN_OK);
    CHECK("add empty", kiln_st_writer_add(w, "empty", KILN_F32, 2, (int64_t[]){0, 4}, a) == KILN_OK);
    CHECK("duplicate refused", kiln_st_writer_add(w, "alpha", KILN_I32, 1, (int64_t[]){2}, b) != KILN_OK);
    CHECK("meta", kiln_st_writer_meta(w, "k", "v") == KILN_OK);
    char *p = kiln_test_path("rt.safetensors"), *q = kiln_test_path("rt2.safetensors");
    CHECK("write", kiln_st_writer_write(w, p) == KILN_OK);
    CHECK("write again", kiln_st_writer_write(w, q) == KILN_OK);
    kiln_st_writer_free(w);
    char *b1, *b2;
    size_t l1, l2;
    CHECK("same bytes twice", kiln_read_file(p, 1 << 20, &b1, &l1) == KILN_OK &&
                                  kiln_read_file(q, 1 << 20, &b2, &l2) == KILN_OK && l1 == l2 &&
                                  memcmp(b1, b2, l1) == 0);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | (unsigned char)b1[i];
    CHECK("header padded to 8", hl % 8 == 0);
    CHECK("metadata first, tensors by name",
          strstr(b1 + 8, "{\"__metadata__\":{\"k\":\"v\"},\"alpha\":") == b1 + 8 &&
              strstr(b1 + 8, "\"empty\"") < strstr(b1 + 8, "\"mid\"") &&
              strstr(b1 + 8, "\"mid\"") < strstr(b1 + 8, "\"zeta\""));
    free(b1);
    free(b2);
    kiln_st *st;
    if (!CHECK("read back", kiln_st_open(p, &st) == KILN_OK)) return;
    CHECK("count", kiln_st_count(st) == 4);
    const kiln_tensor *t;
    CHECK("expect zeta", kiln_st_expect(st, "zeta", KILN_F32, 2, (int64_t[]){2, 3}, &t) == KILN_OK &&
                             memcmp(t->data, a, sizeof a) == 0);
    CHECK("wrong shape named", kiln_st_expect(st, "zeta", KILN_F32, 2, (int64_t[]){3, 2}, &t) ==
                                       KILN_ERR_FORMAT &&
                                   strstr(kiln_errmsg(), "'zeta'") && strstr(kiln_errmsg(), "[2,3]"));
    CHECK("missing named", kiln_st_expect(st, "nope", KILN_F32, 0, NULL, NULL) == KILN_ERR_FORMAT &&
                               strstr(kiln_errmsg(), "'nope'"));
    t = kiln_st_find(st, "mid");
    float f[3];
    CHECK("bf16 to f32", t && kiln_tensor_to_f32(t, f) == KILN_OK && f[0] == 1.5f && f[1] == -2.0f &&
                             f[2] > 0.0996f && f[2] < 0.1004f);
    CHECK("meta", kiln_st_meta(st, "k") && strcmp(kiln_st_meta(st, "k"), "v") == 0);
    kiln_st_close(st);
    free(p);
    free(q);
}

KILN_TEST(safetensors_refuses_malformed) {
    CHECK("valid baseline", open_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8) == KILN_OK);
    CHECK("truncated data", open_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4) ==
                                KILN_ERR_FORMAT && strstr(kiln_errmsg(), "'a'"));
    CHECK("trailing bytes", open_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12) ==
                                KILN_ERR_FORMAT && strstr(kiln_errmsg(), "data section"));
    CHECK("offsets out of range",
          open_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 8) == KILN_ERR_FORMAT &&
              strstr(kiln_errmsg(), "'a'") && strstr(kiln_errmsg(), "out of range"));
    CHECK("length disagrees with shape",
          open_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8) == KILN_ERR_FORMAT &&
              strstr(kiln_errmsg(), "'a'"));
    CHECK("duplicate name", open_st("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                                    "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                                    2) == KILN_ERR_FORMAT &&
                                strstr(kiln_errmsg(), "duplicate"));
    CHECK("gap", open_st("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                         "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}",
                         3) == KILN_ERR_FORMAT &&
                     strstr(kiln_errmsg(), "'b'") && strstr(kiln_errmsg(), "gap"));
    CHECK("overlap", open_st("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                             "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}",
                             3) == KILN_ERR_FORMAT &&
                         strstr(kiln_errmsg(), "overlaps"));
    CHECK("unknown dtype", open_st("{\"a\":{\"dtype\":\"F8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1) ==
                               KILN_ERR_FORMAT && strstr(kiln_errmsg(), "dtype"));
    CHECK("negative dim", open_st("{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1) ==
                              KILN_ERR_FORMAT);
    CHECK("overflowing shape",
          open_st("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8) ==
                  KILN_ERR_FORMAT && strstr(kiln_errmsg(), "overflow"));
    CHECK("metadata must be strings", open_st("{\"__metadata__\":{\"a\":1}}", 0) == KILN_ERR_FORMAT);
    CHECK("not JSON", open_st("{\"a\":", 0) == KILN_ERR_FORMAT);
    CHECK("not an object", open_st("[1,2]   ", 0) == KILN_ERR_FORMAT);
    CHECK("empty header object is fine", open_st("{}", 0) == KILN_OK);

    /* Header length past the end of the file, and over the 100 MB limit. */
    unsigned char big[16] = {0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, '{', '}'};
    char *p = kiln_test_write("big.safetensors", big, 10);
    kiln_st *st = NULL;
    CHECK("header over the limit", kiln_st_open(p, &st) == KILN_ERR_FORMAT && strstr(kiln_errmsg(), "limit") &&
                                       strstr(kiln_errmsg(), "big.safetensors"));
    free(p);
    unsigned char past[16] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    p = kiln_test_write("past.safetensors", past, 10);
    CHECK("header past the end", kiln_st_open(p, &st) == KILN_ERR_FORMAT && strstr(kiln_errmsg(), "truncated"));
    free(p);
    p = kiln_test_write("short.safetensors", past, 5);
    CHECK("shorter than 8 bytes", kiln_st_open(p, &st) == KILN_ERR_FORMAT);
    free(p);
    CHECK("missing file", kiln_st_open("/nonexistent/x.safetensors", &st) == KILN_ERR_IO &&
                              strstr(kiln_errmsg(), "/nonexistent/x.safetensors"));
}

KILN_TEST(safetensors_reads_vectors) {
    const char *files[] = {"tsmoe-moe.model.safetensors", "tsmoe-moe.io.safetensors",
                           "tsmoe-dense.model.safetensors", "tsmoe-dense.io.safetensors"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(files); i++) {
        char *p = kiln_test_vector(files[i]);
        kiln_st *st = NULL;
        CHECK(files[i], kiln_st_open(p, &st) == KILN_OK && kiln_st_count(st) > 0);
        kiln_st_close(st);
        free(p);
    }
}

KILN_TEST(safetensors_alloc_failures) {
    /* Every allocation the reader makes may fail; each failure is an error, not a crash or leak. */
    char *p = kiln_test_vector("tsmoe-moe.model.safetensors");
    int failures_seen = 0;
    for (long n = 1; n < 400; n++) {
        kiln_alloc_fail_after(n);
        kiln_st *st = NULL;
        kiln_err rc = kiln_st_open(p, &st);
        kiln_alloc_fail_after(0);
        kiln_st_close(st);
        if (rc == KILN_OK) break;
        failures_seen++;
        if (!CHECK("failure is NOMEM", rc == KILN_ERR_NOMEM)) break;
    }
    CHECK("some allocations were failed", failures_seen > 0);
    free(p);
}

/* A CSV, a JSON file or other text where a tensor file goes is named for what it is, with
 * what to do about a CSV, instead of "header length 8317701201201488228" (issue 30). */
KILN_TEST(safetensors_names_text_files) {
    static const struct {
        const char *name, *text, *want;
    } cases[] = {
        {"prices.csv", "time,price,volume\n1,2,3\n",
         "is a CSV file, not a dataset or model (safetensors)\nit begins \"time,price,volume\"; a "
         "CSV becomes a dataset with kiln data import --csv"},
        {"notes.txt", "these are my notes on the run\n",
         "is a text file, not a dataset or model (safetensors)"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        char *p = kiln_test_write(cases[i].name, cases[i].text, strlen(cases[i].text));
        kiln_st *st = NULL;
        CHECK(cases[i].name, kiln_st_open(p, &st) == KILN_ERR_FORMAT && !st &&
                                 strstr(kiln_errmsg(), cases[i].want));
        kiln_st_close(st);
        free(p);
    }
}

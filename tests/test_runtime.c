/* test_runtime.c - the inference runtime: batch and streaming forward against the vectors
 * and against each other, constant per-tick work, bf16 weights, bad models, threads, and
 * no allocation per tick. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "route.h"
#include "runtime.h"
#include "runtime_int.h"
#include "test.h"
#include "testutil.h"
#include "validate.h"

/* ---- helpers ---- */

static kiln_model_config config(int D, int L, int H, int Fh, int E, int K, int S, int W, int F,
                                int O) {
    kiln_model_config c = {.n_features = F,
                           .n_outputs = O,
                           .d_model = D,
                           .n_layers = L,
                           .n_heads = H,
                           .d_ff = Fh,
                           .n_experts = E,
                           .top_k = K,
                           .seq_len = S,
                           .attn_window = W,
                           .norm_eps = 1e-5f};
    return c;
}

/* A random model written to the test directory and opened. */
static kiln_model *random_model(const char *name, const kiln_model_config *c, uint64_t seed,
                                bool bf16) {
    char *p = kiln_test_path(name);
    kiln_model *m = NULL;
    if (CHECK("write random model", kiln_rt_random_model(p, c, seed, bf16) == KILN_OK))
        CHECK("open random model", kiln_model_open(p, &m) == KILN_OK);
    free(p);
    return m;
}

/* n values ~ N(0, 2^2), from Philox. */
static float *random_inputs(size_t n, uint64_t seed) {
    float *x = kiln_malloc(n * sizeof *x);
    for (size_t i = 0; x && i < n; i++)
        x[i] = (float)(2.0 * kiln_rt_normal(seed, i));
    return x;
}

/* ---- against the float64 vectors ---- */

KILN_TEST(runtime_vectors_batch_and_stream) {
    const char *names[] = {"tsmoe-moe", "tsmoe-dense"};
    for (size_t v = 0; v < 2; v++) {
        char file[64];
        snprintf(file, sizeof file, "%s.model.safetensors", names[v]);
        char *mp = kiln_test_vector(file);
        snprintf(file, sizeof file, "%s.io.safetensors", names[v]);
        char *iop = kiln_test_vector(file);
        kiln_model *m = NULL;
        kiln_st *io = NULL;
        if (CHECK("open model", kiln_model_open(mp, &m) == KILN_OK) &&
            CHECK("open io", kiln_st_open(iop, &io) == KILN_OK)) {
            const kiln_model_config *c = kiln_model_config_get(m);
            const kiln_tensor *xi = kiln_st_find(io, "inputs"), *yo = kiln_st_find(io, "outputs");
            CHECK("model not bf16", !kiln_model_is_bf16(m));
            if (CHECK("io tensors", xi && yo && xi->ndim == 3 && xi->shape[2] == c->n_features)) {
                int B = (int)xi->shape[0], S = (int)xi->shape[1];
                float *x = kiln_malloc(xi->numel * 4), *want = kiln_malloc(yo->numel * 4);
                float *y = kiln_calloc(yo->numel, 4), *ys = kiln_calloc(yo->numel, 4);
                CHECK("read io", kiln_tensor_to_f32(xi, x) == KILN_OK &&
                                     kiln_tensor_to_f32(yo, want) == KILN_OK);
                CHECK("batch forward", kiln_model_forward(m, x, B, S, y) == KILN_OK);
                CHECK("batch matches vectors (1e-5)", kiln_test_rel_err(y, want, yo->numel) < 1e-5);
                CHECK("stream forward", kiln_test_stream_all(m, x, B, S, ys));
                CHECK("stream matches vectors (1e-5)",
                      kiln_test_rel_err(ys, want, yo->numel) < 1e-5);
                /* The same model from its directory. */
                char *dir = kiln_test_path(names[v]),
                     *dst = kiln_path_join(dir, "model.safetensors");
                char *buf;
                size_t len;
                kiln_model *m2 = NULL;
                if (CHECK("copy into a model dir",
                          kiln_mkdir_p(dir) == KILN_OK &&
                              kiln_read_file(mp, 1 << 24, &buf, &len) == KILN_OK)) {
                    CHECK("write", kiln_write_file_atomic(dst, buf, len) == KILN_OK);
                    free(buf);
                    CHECK("open by directory", kiln_model_open(dir, &m2) == KILN_OK &&
                                                   kiln_model_forward(m2, x, B, S, ys) == KILN_OK &&
                                                   memcmp(ys, y, yo->numel * 4) == 0);
                }
                kiln_model_free(m2);
                free(dir);
                free(dst);
                free(x);
                free(want);
                free(y);
                free(ys);
            }
        }
        kiln_st_close(io);
        kiln_model_free(m);
        free(mp);
        free(iop);
    }
}

/* ---- streaming equals batch ---- */

KILN_TEST(runtime_stream_equals_batch) {
    const int S = kiln_test_sanitized() ? 5 : 8;
    for (int moe = 0; moe < 2; moe++)
        for (int W = 1; W <= S; W++) {
            kiln_model_config c = config(16, 2, 4, 24, moe ? 4 : 0, moe ? 2 : 0, S, W, 5, 3);
            char name[32];
            snprintf(name, sizeof name, "m%d-%d.safetensors", moe, W);
            kiln_model *m = random_model(name, &c, 100 + (uint64_t)W, false);
            if (!m) return;
            const int T = 10 * W, B = 2;
            const size_t n = (size_t)B * T * c.n_outputs;
            float *x = random_inputs((size_t)B * T * c.n_features, (uint64_t)W);
            float *yb = kiln_calloc(n, 4), *ys = kiln_calloc(n, 4);
            CHECK("batch", kiln_model_forward(m, x, B, T, yb) == KILN_OK);
            CHECK("stream", kiln_test_stream_all(m, x, B, T, ys));
            double e = kiln_test_rel_err(ys, yb, n);
            if (!CHECK("stream == batch over 10*W ticks (1e-5)", e < 1e-5))
                fprintf(stderr, "    moe=%d W=%d: relative error %g\n", moe, W, e);
            /* Outputs are O(1), so the comparison is not between tiny numbers. */
            double rms = 0;
            for (size_t i = 0; i < n; i++)
                rms += (double)yb[i] * yb[i];
            CHECK("outputs are not trivially small", sqrt(rms / (double)n) > 0.1);
            free(x);
            free(yb);
            free(ys);
            kiln_model_free(m);
        }
}

/* A sequence longer than the batch forward's block goes through in chunks that carry the
 * window's keys and values; it must still be the stream's answer. */
KILN_TEST(runtime_long_sequence_chunked) {
    const int T = kiln_test_sanitized() ? 1300 : 2600;
    const int windows[] = {3, 1100};
    for (size_t w = 0; w < 2; w++) {
        kiln_model_config c = config(8, 2, 2, 16, 3, 2, 2048, windows[w], 3, 2);
        kiln_model *m = random_model("long.safetensors", &c, 7, false);
        if (!m) return;
        const size_t n = (size_t)T * c.n_outputs;
        float *x = random_inputs((size_t)T * c.n_features, 99);
        float *yb = kiln_calloc(n, 4), *ys = kiln_calloc(n, 4);
        CHECK("batch", kiln_model_forward(m, x, 1, T, yb) == KILN_OK);
        CHECK("stream", kiln_test_stream_all(m, x, 1, T, ys));
        CHECK("chunked batch == stream (1e-5)", kiln_test_rel_err(ys, yb, n) < 1e-5);
        free(x);
        free(yb);
        free(ys);
        kiln_model_free(m);
    }
}

/* ---- the work of a tick does not grow with the stream ---- */

static uint64_t expected_madds(const kiln_model_config *c, int keys_per_layer) {
    uint64_t D = (uint64_t)c->d_model, Fh = (uint64_t)c->d_ff, L = (uint64_t)c->n_layers;
    uint64_t ffn =
        c->n_experts ? (uint64_t)c->n_experts * D + (uint64_t)c->top_k * 2 * Fh * D : 2 * Fh * D;
    return D * (uint64_t)c->n_features +
           L * (3 * D * D + 2 * D * (uint64_t)keys_per_layer + D * D + ffn) +
           (uint64_t)c->n_outputs * D;
}

KILN_TEST(runtime_stream_cost_constant) {
    for (int moe = 0; moe < 2; moe++) {
        const int W = 6;
        kiln_model_config c = config(16, 3, 4, 24, moe ? 5 : 0, moe ? 2 : 0, 8, W, 4, 2);
        kiln_model *m = random_model("cost.safetensors", &c, 5, false);
        kiln_stream *s;
        if (!m || !CHECK("open stream", kiln_stream_open(m, &s) == KILN_OK)) {
            kiln_model_free(m);
            return;
        }
        float x[4] = {0.5f, -1, 2, 0}, y[2];
        kiln_rt_cost at_w = {0, 0, 0}, first = {0, 0, 0};
        bool formula = true;
        for (int t = 1; t <= 10 * W; t++) {
            CHECK("push", kiln_stream_push(s, x, y) == KILN_OK);
            kiln_rt_cost k = kiln_rt_stream_last_cost(s);
            int keys = t < W ? t : W;
            formula &=
                k.keys == (uint64_t)(keys * c.n_layers) && k.madds == expected_madds(&c, keys);
            if (t == 1) first = k;
            if (t == W) at_w = k;
            if (t == 10 * W) {
                CHECK("tick 10W attends as many keys as tick W", k.keys == at_w.keys);
                CHECK("tick 10W costs the same multiply-adds as tick W", k.madds == at_w.madds);
            }
        }
        CHECK("every tick's count matches the closed form", formula);
        CHECK("the counter sees the window fill (tick 1 < tick W)", first.madds < at_w.madds);
        CHECK("ticks counted", kiln_stream_ticks(s) == (uint64_t)(10 * W));
        kiln_stream_reset(s);
        CHECK("reset", kiln_stream_ticks(s) == 0);
        kiln_stream_free(s);
        kiln_model_free(m);
    }
}

/* ---- no allocation per tick ---- */

KILN_TEST(runtime_stream_push_allocates_nothing) {
    kiln_model_config c = config(16, 2, 4, 24, 4, 2, 8, 4, 5, 3);
    kiln_model *m = random_model("alloc.safetensors", &c, 3, false);
    kiln_stream *s;
    if (!m || !CHECK("open stream", kiln_stream_open(m, &s) == KILN_OK)) {
        kiln_model_free(m);
        return;
    }
    float *x = random_inputs(100 * 5, 1), y[3];
    /* Arm the allocator to fail its very next allocation; if no push allocates, the armed
     * failure is still waiting afterwards. */
    kiln_alloc_fail_after(1);
    bool ok = true;
    for (int t = 0; t < 100; t++)
        ok &= kiln_stream_push(s, x + t * 5, y) == KILN_OK;
    kiln_stream_reset(s);
    ok &= kiln_stream_push(s, x, y) == KILN_OK;
    void *probe = kiln_malloc(16);
    kiln_alloc_fail_after(0);
    CHECK("every push succeeded with allocation armed to fail", ok);
    CHECK("no push consumed an allocation", probe == NULL);
    free(probe);
    free(x);
    kiln_stream_free(s);
    kiln_model_free(m);
}

KILN_TEST(runtime_open_survives_allocation_failures) {
    char *p = kiln_test_vector("tsmoe-moe.model.safetensors");
    bool opened = false;
    for (long n = 1; n < 200 && !opened; n++) {
        kiln_model *m = NULL;
        kiln_stream *s = NULL;
        kiln_alloc_fail_after(n);
        kiln_err rc = kiln_model_open(p, &m);
        if (rc == KILN_OK) rc = kiln_stream_open(m, &s);
        kiln_alloc_fail_after(0);
        if (rc != KILN_OK) CHECK("an allocation failure fails with NOMEM", rc == KILN_ERR_NOMEM);
        opened = rc == KILN_OK;
        kiln_stream_free(s);
        kiln_model_free(m);
    }
    CHECK("eventually opens", opened);
    free(p);
}

/* ---- refusing bad input without damage ---- */

KILN_TEST(runtime_stream_refuses_nonfinite) {
    kiln_model_config c = config(8, 2, 2, 16, 0, 0, 6, 3, 3, 2);
    kiln_model *m = random_model("nf.safetensors", &c, 11, false);
    kiln_stream *a, *b;
    if (!m || !CHECK("streams",
                     kiln_stream_open(m, &a) == KILN_OK && kiln_stream_open(m, &b) == KILN_OK)) {
        kiln_model_free(m);
        return;
    }
    float *x = random_inputs(20 * 3, 4), ya[2], yb[2], bad[3] = {1, NAN, 0};
    bool same = true;
    for (int t = 0; t < 20; t++) {
        if (t == 7) {
            CHECK("NaN refused", kiln_stream_push(b, bad, yb) == KILN_ERR_NUMERIC &&
                                     strstr(kiln_errmsg(), "feature 1"));
            bad[1] = INFINITY;
            CHECK("inf refused", kiln_stream_push(b, bad, yb) == KILN_ERR_NUMERIC);
        }
        same &= kiln_stream_push(a, x + t * 3, ya) == KILN_OK &&
                kiln_stream_push(b, x + t * 3, yb) == KILN_OK && memcmp(ya, yb, sizeof ya) == 0;
    }
    CHECK("a refused tick leaves the stream as it was", same);
    float y6[12];
    x[4] = NAN;
    CHECK("batch refuses NaN naming the position",
          kiln_model_forward(m, x, 2, 3, y6) == KILN_ERR_NUMERIC &&
              strstr(kiln_errmsg(), "[0,1,1]"));
    char small[16];
    CHECK("small workspace refused",
          kiln_model_forward_ws(m, x + 6, 1, 2, y6, small, sizeof small) == KILN_ERR_USAGE);
    CHECK("bad shape refused", kiln_model_forward(m, x, 0, 3, y6) == KILN_ERR_USAGE);
    free(x);
    kiln_stream_free(a);
    kiln_stream_free(b);
    kiln_model_free(m);
}

/* Rewrite a model file with changes: drop a tensor, change one's dtype or shape, add one,
 * replace the config. Tensors are converted through f32. */
typedef struct edit {
    const char *drop;
    const char *retype;  /* to I32 */
    const char *reshape; /* transposed / flattened */
    const char *add;
    const char *config;
    const char *nan;  /* a NaN in this tensor */
    const char *zero; /* zeros in this tensor */
    int bf16;         /* 1: all BF16; 2: all BF16 but norm.in_* F32; 3: F32 rounded through bf16 */
    const char *keep_f32; /* with bf16: this one tensor stays F32 */
    bool no_config;       /* leave kiln.config out */
} edit;

static char *rewrite(const char *src, const char *name, const edit *e) {
    kiln_st *st = NULL;
    kiln_st_writer *w = NULL;
    char *out = kiln_test_path(name);
    size_t n = 0;
    void **bufs = NULL;
    bool ok = kiln_st_open(src, &st) == KILN_OK && kiln_st_writer_new(&w) == KILN_OK;
    if (ok) {
        n = kiln_st_count(st);
        bufs = kiln_calloc(n + 1, sizeof *bufs);
    }
    for (size_t i = 0; ok && i < n; i++) {
        const kiln_tensor *t = kiln_st_at(st, i);
        if (e->drop && !strcmp(t->name, e->drop)) continue;
        float *f = kiln_malloc(t->numel * 4 + 4);
        bufs[i] = f;
        ok = kiln_tensor_to_f32(t, f) == KILN_OK;
        if (e->nan && !strcmp(t->name, e->nan)) f[t->numel - 1] = NAN;
        if (e->zero && !strcmp(t->name, e->zero)) memset(f, 0, t->numel * 4);
        int64_t shape[KILN_ST_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        int ndim = t->ndim;
        if (e->reshape && !strcmp(t->name, e->reshape)) {
            if (ndim == 2) {
                int64_t s0 = shape[0];
                shape[0] = shape[1];
                shape[1] = s0;
            } else {
                ndim = 2;
                shape[1] = 1;
            }
        }
        kiln_dtype dt = KILN_F32;
        const void *data = f;
        bool in_norm = !strncmp(t->name, "norm.in_", 8);
        bool to_bf16 = (e->bf16 == 1 || (e->bf16 == 2 && !in_norm)) &&
                       !(e->keep_f32 && !strcmp(t->name, e->keep_f32));
        if (to_bf16) {
            uint16_t *h = kiln_malloc(t->numel * 2 + 2);
            for (size_t j = 0; j < t->numel; j++)
                h[j] = kiln_f32_to_bf16(f[j]);
            free(f);
            bufs[i] = h;
            data = h;
            dt = KILN_BF16;
        } else if (e->bf16 == 3) {
            for (size_t j = 0; j < t->numel; j++)
                f[j] = kiln_bf16_to_f32(kiln_f32_to_bf16(f[j]));
        }
        if (e->retype && !strcmp(t->name, e->retype)) dt = KILN_I32;
        ok = kiln_st_writer_add(w, t->name, dt, ndim, shape, data) == KILN_OK;
    }
    if (ok && e->add) {
        static const float extra[4] = {1, 2, 3, 4};
        ok = kiln_st_writer_add(w, e->add, KILN_F32, 1, (int64_t[]){4}, extra) == KILN_OK;
    }
    const char *cfg = e->config ? e->config : (st ? kiln_st_meta(st, "kiln.config") : NULL);
    if (ok && cfg && !e->no_config) ok = kiln_st_writer_meta(w, "kiln.config", cfg) == KILN_OK;
    if (ok) ok = kiln_st_writer_write(w, out) == KILN_OK;
    CHECK("rewrite model", ok);
    for (size_t i = 0; bufs && i < n; i++)
        free(bufs[i]);
    free(bufs);
    kiln_st_writer_free(w);
    kiln_st_close(st);
    return out;
}

/* Opening fails with the expected code and a message naming the file and every word. */
static void expect_bad(const char *path, kiln_err code, const char *w1, const char *w2,
                       const char *what) {
    uint8_t before[32], after[32];
    bool hashed = kiln_sha256_file(path, before) == KILN_OK;
    kiln_model *m = (kiln_model *)&before; /* must be reset to NULL */
    kiln_err rc = kiln_model_open(path, &m);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", kiln_errmsg());
    bool ok = rc == code && m == NULL && strstr(msg, path) && (!w1 || strstr(msg, w1)) &&
              (!w2 || strstr(msg, w2));
    if (!CHECK(what, ok)) fprintf(stderr, "    got %d: %s\n", rc, msg);
    if (hashed)
        CHECK("model file left intact",
              kiln_sha256_file(path, after) == KILN_OK && !memcmp(before, after, 32));
    if (rc == KILN_OK) kiln_model_free(m);
}

KILN_TEST(runtime_bad_models) {
    char *src = kiln_test_vector("tsmoe-dense.model.safetensors");
    char *p;
    p = rewrite(src, "missing.safetensors", &(edit){.drop = "blocks.1.attn.out.bias"});
    expect_bad(p, KILN_ERR_FORMAT, "missing tensor", "'blocks.1.attn.out.bias'", "missing tensor");
    free(p);
    p = rewrite(src, "shape.safetensors", &(edit){.reshape = "head.weight"});
    expect_bad(p, KILN_ERR_FORMAT, "'head.weight' has shape [8,1], expected [1,8]", NULL,
               "wrong shape");
    free(p);
    p = rewrite(src, "rank.safetensors", &(edit){.reshape = "final_norm.weight"});
    expect_bad(p, KILN_ERR_FORMAT, "'final_norm.weight' has shape [8,1], expected [8]", NULL,
               "wrong rank");
    free(p);
    p = rewrite(src, "dtype.safetensors", &(edit){.retype = "embed.bias"});
    expect_bad(p, KILN_ERR_FORMAT, "'embed.bias' has dtype I32", "F32 or BF16", "wrong dtype");
    free(p);
    p = rewrite(src, "mixed.safetensors", &(edit){.bf16 = 1, .keep_f32 = "blocks.0.ffn.fc.weight"});
    expect_bad(p, KILN_ERR_FORMAT, "'blocks.0.ffn.fc.weight' has dtype F32", "expected BF16",
               "mixed dtypes");
    free(p);
    p = rewrite(src, "extra.safetensors", &(edit){.add = "blocks.2.attn.out.bias"});
    expect_bad(p, KILN_ERR_FORMAT, "extra tensor 'blocks.2.attn.out.bias'", NULL, "extra tensor");
    free(p);
    p = rewrite(src, "moe-in-dense.safetensors", &(edit){.add = "blocks.0.moe.router.weight"});
    expect_bad(p, KILN_ERR_FORMAT, "extra tensor 'blocks.0.moe.router.weight'", NULL,
               "tensor of another config");
    free(p);
    const char *heads =
        "{\"attn_window\":5,\"d_ff\":16,\"d_model\":8,\"format\":\"kiln-tsmoe/1\",\"n_experts\":0,"
        "\"n_features\":4,\"n_heads\":3,\"n_layers\":2,\"n_outputs\":1,\"seq_len\":5,\"top_k\":0}";
    p = rewrite(src, "config.safetensors", &(edit){.config = heads});
    expect_bad(p, KILN_ERR_CONFIG, "n_heads 3", NULL, "bad config value");
    free(p);
    const char *unknown =
        "{\"attn_window\":5,\"d_ff\":16,\"d_model\":8,\"format\":\"kiln-tsmoe/1\",\"n_experts\":0,"
        "\"n_features\":4,\"n_heads\":2,\"n_layers\":2,\"n_outputs\":1,\"seq_len\":5,\"top_k\":0,"
        "\"dropout\":0.1}";
    p = rewrite(src, "config2.safetensors", &(edit){.config = unknown});
    expect_bad(p, KILN_ERR_CONFIG, "'dropout'", NULL, "unknown config key");
    free(p);
    const char *layers =
        "{\"attn_window\":5,\"d_ff\":16,\"d_model\":8,\"format\":\"kiln-tsmoe/1\",\"n_experts\":0,"
        "\"n_features\":4,\"n_heads\":2,\"n_layers\":3,\"n_outputs\":1,\"seq_len\":5,\"top_k\":0}";
    p = rewrite(src, "config3.safetensors", &(edit){.config = layers});
    expect_bad(p, KILN_ERR_FORMAT, "missing tensor 'blocks.2.attn_norm.weight'", NULL,
               "config with more layers");
    free(p);
    p = rewrite(src, "noconfig.safetensors", &(edit){.no_config = true});
    expect_bad(p, KILN_ERR_FORMAT, "kiln.config", NULL, "no config");
    free(p);
    p = rewrite(src, "nan.safetensors", &(edit){.nan = "blocks.0.attn.qkv.weight"});
    expect_bad(p, KILN_ERR_NUMERIC, "'blocks.0.attn.qkv.weight'", "not finite", "NaN weight");
    free(p);
    p = rewrite(src, "std.safetensors", &(edit){.zero = "norm.in_std"});
    expect_bad(p, KILN_ERR_FORMAT, "'norm.in_std'", "must be positive", "zero norm.in_std");
    free(p);
    char *none = kiln_test_path("no-such-model");
    kiln_model *m = NULL;
    CHECK("missing path fails naming it", kiln_model_open(none, &m) != KILN_OK && m == NULL &&
                                              strstr(kiln_errmsg(), "no-such-model"));
    CHECK("empty directory fails naming model.safetensors",
          kiln_model_open(kiln_test_dir(), &m) != KILN_OK &&
              strstr(kiln_errmsg(), "model.safetensors"));
    free(none);
    free(src);
}

/* ---- bf16 ---- */

KILN_TEST(runtime_bf16_weights) {
    char *src = kiln_test_vector("tsmoe-moe.model.safetensors");
    char *io_path = kiln_test_vector("tsmoe-moe.io.safetensors");
    char *p1 = rewrite(src, "bf16.safetensors", &(edit){.bf16 = 1});
    char *p2 = rewrite(src, "bf16-f32norm.safetensors", &(edit){.bf16 = 2});
    char *p3 = rewrite(src, "rounded.safetensors", &(edit){.bf16 = 3});
    kiln_model *f = NULL, *b1 = NULL, *b2 = NULL, *r = NULL;
    kiln_st *io = NULL;
    bool ok = CHECK("f32 opens", kiln_model_open(src, &f) == KILN_OK) &&
              CHECK("bf16 opens", kiln_model_open(p1, &b1) == KILN_OK) &&
              CHECK("bf16 with f32 norm.in_* opens", kiln_model_open(p2, &b2) == KILN_OK) &&
              CHECK("rounded f32 opens", kiln_model_open(p3, &r) == KILN_OK) &&
              CHECK("io", kiln_st_open(io_path, &io) == KILN_OK);
    if (ok) {
        CHECK("bf16 kept as bf16",
              kiln_model_is_bf16(b1) && kiln_model_is_bf16(b2) && !kiln_model_is_bf16(r));
        const kiln_tensor *xi = kiln_st_find(io, "inputs");
        int B = (int)xi->shape[0], S = (int)xi->shape[1];
        size_t n = (size_t)B * S * f->cfg.n_outputs;
        float *x = kiln_malloc(xi->numel * 4), *yf = kiln_calloc(n, 4), *yb = kiln_calloc(n, 4);
        float *ybs = kiln_calloc(n, 4), *yr = kiln_calloc(n, 4), *yb2 = kiln_calloc(n, 4);
        CHECK("inputs", kiln_tensor_to_f32(xi, x) == KILN_OK);
        CHECK("forwards", kiln_model_forward(f, x, B, S, yf) == KILN_OK &&
                              kiln_model_forward(b1, x, B, S, yb) == KILN_OK &&
                              kiln_model_forward(b2, x, B, S, yb2) == KILN_OK &&
                              kiln_model_forward(r, x, B, S, yr) == KILN_OK &&
                              kiln_test_stream_all(b1, x, B, S, ybs));
        /* bf16 has 8 bits of mantissa: each weight is off by up to 2^-9 relative. */
        double e = kiln_test_rel_err(yb, yf, n);
        if (!CHECK("bf16 agrees with f32 within 2e-2", e < 2e-2))
            fprintf(stderr, "    error %g\n", e);
        CHECK("bf16 is not bitwise f32 (the test can tell)", memcmp(yb, yf, n * 4) != 0);
        /* The same rounded weights held as f32 must give the bf16 model's answer to float
         * rounding: the bf16 kernels widen exactly. */
        CHECK("bf16 batch == f32 of the same rounded weights (1e-5)",
              kiln_test_rel_err(yb, yr, n) < 1e-5);
        CHECK("bf16 stream == f32 of the same rounded weights (1e-5)",
              kiln_test_rel_err(ybs, yr, n) < 1e-5);
        CHECK("f32 norm.in_* changes little", kiln_test_rel_err(yb2, yr, n) < 1e-2);
        free(x);
        free(yf);
        free(yb);
        free(ybs);
        free(yr);
        free(yb2);
    }
    /* A random model written as bf16 from the start, D a multiple of the vector width. */
    kiln_model_config c = config(64, 2, 4, 96, 4, 2, 16, 8, 7, 3);
    kiln_model *rb = random_model("rand-bf16.safetensors", &c, 21, true);
    if (rb) {
        float *x = random_inputs(40 * 7, 8), *yb = kiln_calloc(40 * 3, 4),
              *ys = kiln_calloc(40 * 3, 4);
        CHECK("random bf16 model",
              kiln_model_is_bf16(rb) && kiln_model_forward(rb, x, 1, 40, yb) == KILN_OK &&
                  kiln_test_stream_all(rb, x, 1, 40, ys) && kiln_test_rel_err(ys, yb, 120) < 1e-5);
        free(x);
        free(yb);
        free(ys);
    }
    kiln_model_free(rb);
    kiln_st_close(io);
    kiln_model_free(f);
    kiln_model_free(b1);
    kiln_model_free(b2);
    kiln_model_free(r);
    free(p1);
    free(p2);
    free(p3);
    free(src);
    free(io_path);
}

/* The vectorised per-tick kernel against double sums, on sizes with ragged tails, on
 * this machine's path and the portable one. */
KILN_TEST(runtime_matvec_paths) {
    const int rows = 11, cols = 37;
    float w[11 * 37], x[37], b[11], y1[11], y2[11];
    uint16_t wh[11 * 37];
    for (int i = 0; i < rows * cols; i++) {
        w[i] = (float)kiln_rt_normal(1, (uint64_t)i);
        wh[i] = kiln_f32_to_bf16(w[i]);
    }
    for (int i = 0; i < cols; i++)
        x[i] = (float)kiln_rt_normal(2, (uint64_t)i);
    for (int i = 0; i < rows; i++)
        b[i] = (float)kiln_rt_normal(3, (uint64_t)i);
    for (int bf = 0; bf < 2; bf++) {
        kiln_model m = {.bf16 = bf, .wsize = bf ? 2 : 4};
        const void *W = bf ? (const void *)wh : (const void *)w;
        kiln_rt_matvec(&m, y1, W, b, x, rows, cols);
        kiln_rt_matvec_portable(&m, y2, W, b, x, rows, cols);
        double worst = 0;
        for (int r = 0; r < rows; r++) {
            double s = b[r];
            for (int c = 0; c < cols; c++)
                s += (double)(bf ? kiln_bf16_to_f32(wh[r * cols + c]) : w[r * cols + c]) * x[c];
            worst = fmax(worst, fmax(fabs(y1[r] - s), fabs(y2[r] - s)));
        }
        CHECK(bf ? "bf16 matvec" : "f32 matvec", worst < 1e-4);
    }
}

/* The head-by-head attention loop (each head over every key), as docs/model.md reads. */
static void attend_by_head(const kiln_model *m, float *o, float *scores, const float *q,
                           const kiln_rt_kv *runs, int nruns) {
    const int D = m->cfg.d_model, H = m->cfg.n_heads, Dh = D / H;
    int nk = 0;
    for (int r = 0; r < nruns; r++)
        nk += runs[r].n;
    for (int h = 0; h < H; h++) {
        float mx = -INFINITY;
        for (int r = 0, j = 0; r < nruns; r++)
            for (int i = 0; i < runs[r].n; i++, j++) {
                const float *kh = runs[r].k + (size_t)i * runs[r].stride + h * Dh;
                float s = kiln_row_dot(q + h * Dh, kh, Dh) * m->attn_scale -
                          m->slopes[h] * (float)(nk - 1 - j);
                scores[j] = s;
                mx = s > mx ? s : mx;
            }
        float sum = 0;
        for (int j = 0; j < nk; j++)
            sum += (scores[j] = expf(scores[j] - mx));
        float inv = 1.0f / sum;
        for (int d = 0; d < Dh; d++)
            o[h * Dh + d] = 0;
        for (int r = 0, j = 0; r < nruns; r++)
            for (int i = 0; i < runs[r].n; i++, j++)
                for (int d = 0; d < Dh; d++)
                    o[h * Dh + d] += scores[j] * inv *
                                     runs[r].v[(size_t)i * runs[r].stride + (size_t)(h * Dh + d)];
    }
}

/* kiln_rt_attend walks the keys row by row (a ring is read once, not a column per head);
 * every head must still get the head-by-head loop's numbers, bit for bit: runs of a ring's
 * two halves and the new row, Dh = 13 (a tail for kiln_row_dot), 1 to W keys. */
KILN_TEST(runtime_attend_rows_equal_heads) {
    enum { H = 3, Dh = 13, D = H * Dh, W = 9 };
    float slopes[H], kv[2][W][D], q[D], o1[D], o2[D], scores[H * W + 2 * H];
    for (int h = 0; h < H; h++)
        slopes[h] = exp2f(-8.0f * (float)(h + 1) / H);
    kiln_model m = {.cfg = {.d_model = D, .n_heads = H},
                    .slopes = slopes,
                    .attn_scale = 1.0f / sqrtf((float)Dh)};
    uint64_t c = 0;
    for (int i = 0; i < D; i++)
        q[i] = (float)(3.0 * kiln_rt_normal(8, c++));
    for (int i = 0; i < 2 * W * D; i++)
        (&kv[0][0][0])[i] = (float)(3.0 * kiln_rt_normal(8, c++));
    bool same = true;
    for (int nk = 1; nk <= W; nk++) {
        int older = (nk - 1) / 2, newer = nk - 1 - older; /* the ring's two halves */
        kiln_rt_kv runs[3] = {
            {kv[0][0], kv[1][0], older, D},
            {kv[0][older], kv[1][older], newer, D},
            {kv[0][W - 1], kv[1][W - 1], 1, 0},
        };
        memset(o1, 0, sizeof o1);
        attend_by_head(&m, o1, scores, q, runs, 3);
        same &= kiln_rt_attend(&m, o2, scores, q, runs, 3) == nk && !memcmp(o1, o2, sizeof o1);
    }
    CHECK("row-by-row attention == head-by-head attention, bit for bit", same);
}

/* The runtime's RMSNorm (kiln_rmsnorm_f64_forward, which the batch and the stream share) sums
 * the squares in double: on a row where a float sum loses the small terms beside a large one
 * (and on an ordinary row) its output is the double sum's, bit for bit. */
KILN_TEST(runtime_rmsnorm_sums_in_double) {
    enum { D = 4096 };
    static float x[2 * D], g[D], y[2 * D];
    const float eps = 1e-5f;
    for (int i = 0; i < D; i++) {
        x[i] = i == 0 ? 1000.0f : 0.1f;
        x[D + i] = (float)kiln_rt_normal(3, (uint64_t)i);
        g[i] = 1.0f + 0.01f * (float)(i % 7);
    }
    kiln_rmsnorm_f64_forward(y, x, g, eps, 2, D);
    bool same = true, float_differs = false;
    for (int n = 0; n < 2; n++) {
        const float *xr = x + (size_t)n * D;
        double ss = 0;
        float fs = 0;
        for (int i = 0; i < D; i++) {
            ss += (double)xr[i] * xr[i];
            fs += xr[i] * xr[i];
        }
        float r = (float)(1.0 / sqrt(ss / D + (double)eps));
        float_differs |= n == 0 && r != (float)(1.0 / sqrt((double)fs / D + (double)eps));
        for (int i = 0; i < D; i++)
            same &= y[(size_t)n * D + i] == xr[i] * r * g[i];
    }
    CHECK("a float sum of squares would give the first row another scale", float_differs);
    CHECK("kiln_rmsnorm_f64_forward == x / sqrt(double sum of squares / D + eps) * g, bitwise",
          same);
}

/* ---- threads: one model, a stream per thread ---- */

typedef struct job {
    const kiln_model *m;
    const float *x;
    int T;
    float *y;  /* [T,O] */
    float *yb; /* [T,O] batch */
    bool ok;
} job;

static void *run_job(void *arg) {
    job *j = arg;
    j->ok = kiln_test_stream_all(j->m, j->x, 1, j->T, j->y) &&
            kiln_model_forward(j->m, j->x, 1, j->T, j->yb) == KILN_OK;
    return NULL;
}

KILN_TEST(runtime_threads_share_a_model) {
    kiln_model_config c = config(32, 2, 4, 48, 4, 2, 16, 8, 6, 2);
    kiln_model *m = random_model("threads.safetensors", &c, 17, false);
    if (!m) return;
    enum { NT = 4 };
    const int T = kiln_test_sanitized() ? 60 : 300;
    job jobs[NT], solo[NT];
    pthread_t th[NT];
    for (int i = 0; i < NT; i++) {
        float *x = random_inputs((size_t)T * 6, 50 + (uint64_t)i);
        jobs[i] =
            (job){m, x, T, kiln_calloc((size_t)T * 2, 4), kiln_calloc((size_t)T * 2, 4), false};
        solo[i] =
            (job){m, x, T, kiln_calloc((size_t)T * 2, 4), kiln_calloc((size_t)T * 2, 4), false};
        run_job(&solo[i]);
    }
    bool started = true;
    for (int i = 0; i < NT; i++)
        started &= pthread_create(&th[i], NULL, run_job, &jobs[i]) == 0;
    CHECK("threads started", started);
    for (int i = 0; i < NT && started; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < NT; i++) {
        CHECK("thread ran", jobs[i].ok && solo[i].ok);
        CHECK("a thread's stream gives one thread's answer, bit for bit",
              !memcmp(jobs[i].y, solo[i].y, (size_t)T * 2 * 4));
        CHECK("a thread's batch forward agrees",
              kiln_test_rel_err(jobs[i].yb, solo[i].yb, (size_t)T * 2) < 1e-6);
        CHECK("and sequences differ between threads",
              i == 0 || memcmp(jobs[i].y, jobs[0].y, (size_t)T * 8));
    }
    for (int i = 0; i < NT; i++) {
        free((void *)jobs[i].x);
        free(jobs[i].y);
        free(jobs[i].yb);
        free(solo[i].y);
        free(solo[i].yb);
    }
    kiln_model_free(m);
}

/* Router logits that overflowed (a NaN or an infinity makes every softmax probability NaN)
 * still give K distinct experts in range: the first K, in index order. Finite logits keep
 * (p descending, index ascending). */
KILN_TEST(runtime_route_nan) {
    float p[4] = {1.0f, NAN, 3.0f, 2.0f};
    int32_t idx[3] = {-7, -7, -7};
    float gate[3];
    kiln_route_stream(p, 4, 3, idx, gate);
    CHECK("a NaN logit: the first K experts", idx[0] == 0 && idx[1] == 1 && idx[2] == 2);
    float q[4] = {1.0f, INFINITY, INFINITY, 2.0f};
    idx[0] = idx[1] = idx[2] = -7;
    kiln_route_stream(q, 4, 3, idx, gate);
    CHECK("infinite logits: the first K experts", idx[0] == 0 && idx[1] == 1 && idx[2] == 2);
    float r[4] = {0.5f, 2.0f, 2.0f, -1.0f};
    kiln_route_stream(r, 4, 3, idx, gate);
    CHECK("finite: p descending, ties to the lower index",
          idx[0] == 1 && idx[1] == 2 && idx[2] == 0 && fabsf(gate[0] - gate[1]) < 1e-6f);
}

/* ---- many streams in one call (kiln_stream_push_many) ---- */

enum { MAXN = 17 };

/* Stream i's raw inputs at tick t: its own Philox sequence. */
static void tick_input(float *x, int F, size_t i, uint64_t t) {
    for (int f = 0; f < F; f++)
        x[f] = (float)(2.0 * kiln_rt_normal(1000 + i, t * (uint64_t)F + (uint64_t)f));
}

/* Give stream i a history that depends on i: fresh, half a window, rings wrapped (past W),
 * or wrapped and then reset with a tick or two since. */
static bool give_history(kiln_stream *s, const kiln_model_config *c, size_t i) {
    const int W = c->attn_window;
    float x[16], y[16];
    int ticks[4] = {0, W / 2 + 1, 3 * W + (int)i, 2 * W};
    bool ok = true;
    for (int t = 0; t < ticks[i % 4]; t++) {
        tick_input(x, c->n_features, i, (uint64_t)t + 500);
        ok &= kiln_stream_push(s, x, y) == KILN_OK;
    }
    if (i % 4 == 3) {
        kiln_stream_reset(s);
        for (int t = 0; t < (int)(i % 3); t++) {
            tick_input(x, c->n_features, i, (uint64_t)t + 900);
            ok &= kiln_stream_push(s, x, y) == KILN_OK;
        }
    }
    return ok;
}

/* Two twin sets of n streams with the same histories. */
static bool open_twins(const kiln_model *m, size_t n, kiln_stream **a, kiln_stream **b) {
    bool ok = true;
    for (size_t i = 0; i < n; i++) {
        a[i] = b[i] = NULL;
        ok &= kiln_stream_open(m, &a[i]) == KILN_OK && kiln_stream_open(m, &b[i]) == KILN_OK;
        ok &= ok && give_history(a[i], &m->cfg, i) && give_history(b[i], &m->cfg, i);
    }
    return ok;
}

static void free_streams(kiln_stream **s, size_t n) {
    for (size_t i = 0; i < n; i++)
        kiln_stream_free(s[i]);
}

/* One tick for the set a through push_many and for its twins b one push at a time: true
 * when the call succeeds and every output, tick count and cost (multiply-adds, keys) is
 * the same, bit for bit. */
static bool tick_twins(kiln_stream **a, kiln_stream **b, size_t n, const kiln_model_config *c,
                       uint64_t t) {
    const int F = c->n_features, O = c->n_outputs;
    float x[MAXN * 16] = {0}, ya[MAXN * 16], yb[MAXN * 16];
    for (size_t i = 0; i < n; i++)
        tick_input(x + i * F, F, i, t);
    memset(ya, 0xa5, sizeof ya);
    memset(yb, 0x5a, sizeof yb);
    bool ok = kiln_stream_push_many(a, n, x, ya) == KILN_OK;
    for (size_t i = 0; i < n; i++) {
        ok &= kiln_stream_push(b[i], x + i * F, yb + i * O) == KILN_OK;
        kiln_rt_cost ka = kiln_rt_stream_last_cost(a[i]), kb = kiln_rt_stream_last_cost(b[i]);
        ok &= ka.madds == kb.madds && ka.keys == kb.keys;
        ok &= kiln_stream_ticks(a[i]) == kiln_stream_ticks(b[i]);
    }
    return ok && memcmp(ya, yb, n * (size_t)O * sizeof *ya) == 0;
}

/* Dense and mixture, f32 and bf16 weights, this machine's kernels and the portable ones, 1, 3
 * and 17 streams at different fills: push_many gives what single pushes give, bit for bit,
 * tick after tick, and after some streams are reset midway. D = 68 leaves a column tail for
 * both kernels' vector widths, d_ff = 101 and E = 5 a row tail, and the qkv, out, fc and
 * proj matrices span several of push_many's row blocks. */
KILN_TEST(runtime_push_many_bitwise) {
    const size_t ns[] = {1, 3, MAXN};
    const int T = kiln_test_sanitized() ? 8 : 20;
    for (int moe = 0; moe < 2; moe++)
        for (int bf = 0; bf < 2; bf++) {
            kiln_model_config c = config(68, 2, 4, 101, moe ? 5 : 0, moe ? 3 : 0, 8, 5, 6, 3);
            char name[48];
            snprintf(name, sizeof name, "many%d%d.safetensors", moe, bf);
            kiln_model *m = random_model(name, &c, 60 + (uint64_t)(2 * moe + bf), bf);
            if (!m) return;
            for (int portable = 0; portable < 2; portable++) {
                m->portable = portable;
                for (size_t k = 0; k < KILN_ARRAY_LEN(ns); k++) {
                    const size_t n = ns[k];
                    kiln_stream *a[MAXN], *b[MAXN];
                    bool ok = open_twins(m, n, a, b);
                    for (int t = 0; ok && t < T; t++) {
                        if (t == T / 2)
                            for (size_t i = 1; i < n; i += 5) {
                                kiln_stream_reset(a[i]);
                                kiln_stream_reset(b[i]);
                            }
                        ok = tick_twins(a, b, n, &c, (uint64_t)t);
                    }
                    char what[160];
                    snprintf(what, sizeof what,
                             "%s %s %s, %zu streams: push_many == single pushes, bit for bit",
                             moe ? "moe" : "dense", bf ? "bf16" : "f32",
                             portable ? "portable" : "native", n);
                    CHECK(what, ok);
                    free_streams(a, n);
                    free_streams(b, n);
                }
            }
            kiln_model_free(m);
        }
}

enum { MV_R = 203, MV_C = 77, MV_N = 4 };

typedef struct mv_vecs {
    float (*y)[MV_R];
    float (*x)[MV_C];
} mv_vecs;

/* Vector 1 declines (it takes no part), as a stream that did not choose an expert. */
static bool vec_of(void *ctx, size_t i, float **y, const float **x) {
    mv_vecs *v = ctx;
    *y = v->y[i];
    *x = v->x[i];
    return i != 1;
}

static bool vec_none(void *ctx, size_t i, float **y, const float **x) {
    return false;
}

/* The kernel entry point itself: several vectors against one matrix in row blocks, two at a
 * time, equal one kiln_rt_matvec per vector, on both paths, with row and column tails (203
 * rows are several 16 KiB blocks plus a tail of 3, 77 columns a tail for 4- and 8-wide
 * vectors). */
KILN_TEST(runtime_matvec_many_equals_matvec) {
    enum { R = MV_R, C = MV_C, N = MV_N };
    float *w = kiln_malloc(R * C * 4), b[R], x[N][C], y1[N][R], y2[N][R];
    uint16_t *wh = kiln_malloc(R * C * 2);
    if (!CHECK("buffers", w && wh)) {
        free(w), free(wh);
        return;
    }
    for (int i = 0; i < R * C; i++)
        wh[i] = kiln_f32_to_bf16(w[i] = (float)kiln_rt_normal(4, (uint64_t)i));
    for (int i = 0; i < R; i++)
        b[i] = (float)kiln_rt_normal(5, (uint64_t)i);
    for (int v = 0; v < N; v++)
        for (int i = 0; i < C; i++)
            x[v][i] = (float)kiln_rt_normal(6 + (uint64_t)v, (uint64_t)i);
    mv_vecs vs = {y2, x};
    for (int bf = 0; bf < 2; bf++)
        for (int portable = 0; portable < 2; portable++) {
            kiln_model m = {.bf16 = bf, .wsize = bf ? 2 : 4, .portable = portable};
            const void *W = bf ? (const void *)wh : (const void *)w;
            for (int v = 0; v < N; v++)
                kiln_rt_matvec(&m, y1[v], W, b, x[v], R, C);
            memset(y2, 0, sizeof y2);
            size_t rows = kiln_rt_matvec_many(&m, N, vec_of, &vs, W, b, R, C);
            /* Vectors 0 and 2 go through the two-vector kernel, 3 through the one-vector. */
            CHECK("matvec_many == matvec per vector, bit for bit",
                  rows == R && !memcmp(y1[0], y2[0], sizeof y1[0]) &&
                      !memcmp(y1[2], y2[2], sizeof y1[2]) && !memcmp(y1[3], y2[3], sizeof y1[3]));
            bool untouched = true;
            for (int r = 0; r < R; r++)
                untouched &= y2[1][r] == 0;
            CHECK("a vector that declines is left alone", untouched);
            CHECK("every vector declines: no row read",
                  kiln_rt_matvec_many(&m, N, vec_none, NULL, W, b, R, C) == 0);
        }
    free(w);
    free(wh);
}

/* Every refusal names its cause and leaves every stream as it was: after it, the set still
 * ticks exactly as its twins that never saw the bad call. */
KILN_TEST(runtime_push_many_refusals) {
    kiln_model_config c = config(16, 2, 4, 24, 4, 2, 8, 4, 5, 3);
    kiln_model *m = random_model("refuse.safetensors", &c, 71, false);
    kiln_model *other = random_model("other.safetensors", &c, 72, false);
    enum { N = 5 };
    kiln_stream *a[N] = {0}, *b[N] = {0}, *alien = NULL;
    if (!m || !other || !CHECK("streams", open_twins(m, N, a, b)) ||
        !CHECK("a stream on another model", kiln_stream_open(other, &alien) == KILN_OK))
        goto out;
    float x[N * 5], y[N * 3];
    for (size_t i = 0; i < N; i++)
        tick_input(x + i * 5, 5, i, 40);
    CHECK("n = 0 is a no-op", kiln_stream_push_many(NULL, 0, NULL, NULL) == KILN_OK &&
                                  kiln_stream_push_many(a, 0, x, y) == KILN_OK);
    CHECK("null arrays refused", kiln_stream_push_many(NULL, 2, x, y) == KILN_ERR_USAGE &&
                                     kiln_test_msg_has("null streams", NULL) &&
                                     kiln_stream_push_many(a, 2, NULL, y) == KILN_ERR_USAGE &&
                                     kiln_test_msg_has("null features", NULL) &&
                                     kiln_stream_push_many(a, 2, x, NULL) == KILN_ERR_USAGE &&
                                     kiln_test_msg_has("null outputs", NULL));
    kiln_stream *with_null[N] = {a[0], a[1], NULL, a[3], a[4]};
    CHECK("a null stream refused, naming it",
          kiln_stream_push_many(with_null, N, x, y) == KILN_ERR_USAGE &&
              kiln_test_msg_has("streams[2] is null", "no stream was changed"));
    kiln_stream *mixed[N] = {a[0], a[1], a[2], alien, a[4]};
    char *op = kiln_test_path("other.safetensors");
    CHECK("streams of another model refused, naming it and both files",
          kiln_stream_push_many(mixed, N, x, y) == KILN_ERR_USAGE &&
              kiln_test_msg_has("streams[3] is on model", op) &&
              kiln_test_msg_has("refuse.safetensors", NULL));
    free(op);
    kiln_stream *twice[N] = {a[0], a[1], a[2], a[3], a[1]};
    CHECK("the same stream twice refused, naming both places",
          kiln_stream_push_many(twice, N, x, y) == KILN_ERR_USAGE &&
              kiln_test_msg_has("streams[4] is streams[1] again", "no stream was changed"));
    kiln_stream *same[2] = {a[0], a[0]};
    CHECK("one stream in both places refused",
          kiln_stream_push_many(same, 2, x, y) == KILN_ERR_USAGE &&
              kiln_test_msg_has("streams[1] is streams[0] again", NULL));
    /* A bad value in the last row: nothing may have been touched for the rows before it. */
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (size_t v = 0; v < 3; v++) {
        float xb[N * 5];
        memcpy(xb, x, sizeof xb);
        xb[4 * 5 + 1] = bad[v];
        CHECK("a non-finite feature refused, naming the stream and the feature",
              kiln_stream_push_many(a, N, xb, y) == KILN_ERR_NUMERIC &&
                  kiln_test_msg_has("streams[4]", "feature 1 is not finite") &&
                  kiln_test_msg_has("no stream was changed", NULL));
    }
    bool ticks_same = true;
    for (size_t i = 0; i < N; i++)
        ticks_same &= kiln_stream_ticks(a[i]) == kiln_stream_ticks(b[i]);
    CHECK("no refused call counted a tick", ticks_same);
    bool same_after = true;
    for (int t = 0; t < 3 * c.attn_window; t++)
        same_after &= tick_twins(a, b, N, &c, 100 + (uint64_t)t);
    CHECK("after every refusal, each stream ticks as its twin that never saw one, bit for bit",
          same_after);
out:
    kiln_stream_free(alien);
    free_streams(a, N);
    free_streams(b, N);
    kiln_model_free(m);
    kiln_model_free(other);
}

KILN_TEST(runtime_push_many_allocates_nothing) {
    kiln_model_config c = config(16, 2, 4, 24, 4, 2, 8, 4, 5, 3);
    kiln_model *m = random_model("many-alloc.safetensors", &c, 73, false);
    enum { N = 6 };
    kiln_stream *a[N], *b[N];
    if (!m || !CHECK("streams", open_twins(m, N, a, b))) {
        kiln_model_free(m);
        return;
    }
    kiln_stream *twice[2] = {a[0], a[0]};
    float x[N * 5] = {0}, y[N * 3];
    /* The first call, then the armed allocator: no later call may take an allocation. */
    bool ok = kiln_stream_push_many(a, N, x, y) == KILN_OK;
    kiln_alloc_fail_after(1);
    for (int t = 0; t < 50; t++) {
        tick_input(x + (size_t)(t % N) * 5, 5, (size_t)t, 7);
        ok &= kiln_stream_push_many(a, N, x, y) == KILN_OK;
    }
    ok &= kiln_stream_push_many(twice, 2, x, y) == KILN_ERR_USAGE; /* a refusal allocates neither */
    void *probe = kiln_malloc(16);
    kiln_alloc_fail_after(0);
    CHECK("every call succeeded with allocation armed to fail", ok);
    CHECK("no call consumed an allocation", probe == NULL);
    free(probe);
    free_streams(a, N);
    free_streams(b, N);
    kiln_model_free(m);
}

/* The rows of weight matrices a call reads (kiln_rt_cost.wrows, summed over its streams):
 * every shared matrix once, each expert that any stream chose once (at most E per layer),
 * where n single pushes read everything n times. */
KILN_TEST(runtime_push_many_reads_weights_once) {
    enum { N = 12 };
    for (int moe = 0; moe < 2; moe++) {
        kiln_model_config c = config(32, 3, 4, 40, moe ? 6 : 0, moe ? 2 : 0, 8, 4, 5, 3);
        kiln_model *m = random_model("rows.safetensors", &c, 74 + (uint64_t)moe, false);
        kiln_stream *a[N], *b[N];
        if (!m || !CHECK("streams", open_twins(m, N, a, b))) {
            kiln_model_free(m);
            return;
        }
        const uint64_t D = 32, Fh = 40, L = 3, E = (uint64_t)c.n_experts, K = (uint64_t)c.top_k;
        /* Rows of the matrices every tick reads: embed, qkv, out, router or dense ffn, head. */
        const uint64_t shared = D + L * (3 * D + D + (moe ? E : Fh + D)) + (uint64_t)c.n_outputs;
        const uint64_t expert = Fh + D; /* one expert's fc and proj */
        bool many_ok = true, single_ok = true, leader = true, varied = false;
        for (int t = 0; t < 10; t++) {
            CHECK("tick", tick_twins(a, b, N, &c, 300 + (uint64_t)t));
            uint64_t many = 0, single = 0;
            for (size_t i = 0; i < N; i++) {
                many += kiln_rt_stream_last_cost(a[i]).wrows;
                single += kiln_rt_stream_last_cost(b[i]).wrows;
                leader &= i == 0 || kiln_rt_stream_last_cost(a[i]).wrows == 0;
            }
            if (moe) {
                /* Between every expert chosen (K distinct per layer at least) and all E. */
                many_ok &= many >= shared + L * K * expert && many <= shared + L * E * expert;
                varied |= many > shared + L * K * expert;
            } else {
                many_ok &= many == shared;
            }
            single_ok &= single == N * (shared + (moe ? L * K * expert : 0));
        }
        CHECK(moe ? "moe: push_many reads each matrix and each chosen expert once"
                  : "dense: push_many reads each matrix once",
              many_ok);
        CHECK("single pushes read them once per stream", single_ok);
        CHECK("the call's rows are charged to its first stream", leader);
        if (moe) CHECK("the streams chose more than one set of experts", varied);
        free_streams(a, N);
        free_streams(b, N);
        kiln_model_free(m);
    }
}

/* Two threads push disjoint sets of streams on one model at once, each through push_many:
 * the same bits as one thread pushing each stream alone. */
typedef struct many_job {
    kiln_stream **s;
    size_t n, first; /* streams[first..first+n) of the whole fleet */
    const kiln_model_config *c;
    int T;
    float *y; /* [T, n, O] */
    bool ok;
} many_job;

static void *run_many(void *arg) {
    many_job *j = arg;
    const int F = j->c->n_features, O = j->c->n_outputs;
    float x[MAXN * 16];
    j->ok = true;
    for (int t = 0; t < j->T; t++) {
        for (size_t i = 0; i < j->n; i++)
            tick_input(x + i * F, F, j->first + i, (uint64_t)t);
        j->ok &= kiln_stream_push_many(j->s, j->n, x, j->y + (size_t)t * j->n * O) == KILN_OK;
    }
    return NULL;
}

KILN_TEST(runtime_push_many_threads) {
    kiln_model_config c = config(32, 2, 4, 48, 4, 2, 16, 6, 6, 2);
    kiln_model *m = random_model("many-threads.safetensors", &c, 75, false);
    enum { N = 8 };
    const int T = kiln_test_sanitized() ? 20 : 60;
    kiln_stream *a[N], *b[N];
    if (!m || !CHECK("streams", open_twins(m, N, a, b))) {
        kiln_model_free(m);
        return;
    }
    float *ya = kiln_calloc((size_t)T * N * 2, 4), *yb = kiln_calloc((size_t)T * N * 2, 4);
    many_job jobs[2] = {{a, 3, 0, &c, T, ya, false},
                        {a + 3, N - 3, 3, &c, T, ya + (size_t)T * 3 * 2, false}};
    pthread_t th[2];
    bool started = pthread_create(&th[0], NULL, run_many, &jobs[0]) == 0;
    if (started && pthread_create(&th[1], NULL, run_many, &jobs[1]) != 0) {
        pthread_join(th[0], NULL);
        started = false;
    }
    if (CHECK("threads started", started)) {
        pthread_join(th[0], NULL);
        pthread_join(th[1], NULL);
    }
    /* The same ticks, one stream at a time, laid out as the jobs laid theirs. */
    bool ok = true;
    float x[16];
    for (int j = 0; j < 2; j++)
        for (int t = 0; t < T; t++)
            for (size_t i = 0; i < jobs[j].n; i++) {
                size_t s = jobs[j].first + i;
                tick_input(x, 6, s, (uint64_t)t);
                ok &= kiln_stream_push(b[s], x,
                                       yb + (jobs[j].y - ya) + ((size_t)t * jobs[j].n + i) * 2) ==
                      KILN_OK;
            }
    CHECK("both threads' calls succeeded", started && jobs[0].ok && jobs[1].ok && ok);
    CHECK("each thread's streams give one thread's single pushes, bit for bit",
          !memcmp(ya, yb, (size_t)T * N * 2 * 4));
    free(ya);
    free(yb);
    free_streams(a, N);
    free_streams(b, N);
    kiln_model_free(m);
}

/* ---- router near-ties (runtime.h; docs/validation.md "Router ties") ---- */

KILN_TEST(runtime_router_margins) {
    enum { B = 3, S = 40, F = 5, O = 2, L = 3, E = 4, D = 16 };
    kiln_model_config c = config(D, L, 2, 24, E, 2, S, 6, F, O);
    kiln_model *m = random_model("margins.safetensors", &c, 41, false);
    float *x = random_inputs((size_t)B * S * F, 42);
    float *y = kiln_malloc((size_t)B * S * O * 4), *y2 = kiln_malloc((size_t)B * S * O * 4),
          *ys = kiln_malloc((size_t)B * S * O * 4);
    float *mg = kiln_malloc((size_t)B * S * L * 4), *mg1 = kiln_malloc((size_t)S * L * 4),
          *mg2 = kiln_malloc((size_t)B * S * L * 4);
    uint8_t *reach = kiln_malloc((size_t)B * S);
    if (!m || !x || !y || !y2 || !ys || !mg || !mg1 || !mg2 || !reach) goto out;
    CHECK("forward", kiln_model_forward(m, x, B, S, y) == KILN_OK);
    CHECK("forward with margins", kiln_runtime_forward_margins(m, x, B, S, y2, mg) == KILN_OK);
    CHECK("the same outputs, bitwise", !memcmp(y, y2, (size_t)B * S * O * 4));
    bool pos = true;
    for (size_t i = 0; i < (size_t)B * S * L; i++)
        pos &= isfinite(mg[i]) && mg[i] >= 0;
    CHECK("every margin finite and >= 0", pos);
    CHECK("a sequence alone has the margins it had in the batch",
          kiln_runtime_forward_margins(m, x + (size_t)S * F, 1, S, y2, mg1) == KILN_OK &&
              !memcmp(mg1, mg + (size_t)S * L, (size_t)S * L * 4));
    CHECK("and the outputs it had in the batch, bit for bit",
          !memcmp(y2, y + (size_t)S * O, (size_t)S * O * 4));

    /* Experts 1 and 2 of the last layer given one router row: their logits are then equal,
     * so wherever they are the K-th and (K+1)-th experts the margin is 0, and nowhere else
     * (the earlier layers' margins do not move). */
    float *rw = (float *)m->layers[L - 1].router_w; /* the model's own copy (aligned_alloc) */
    memcpy(rw + 2 * D, rw + 1 * D, D * sizeof *rw);
    CHECK("forward, tied", kiln_runtime_forward_margins(m, x, B, S, y2, mg2) == KILN_OK);
    size_t zero = 0, moved = 0;
    for (size_t r = 0; r < (size_t)B * S; r++) {
        zero += mg2[r * L + L - 1] == 0;
        for (int l = 0; l < L - 1; l++)
            moved += mg2[r * L + l] != mg[r * L + l];
    }
    CHECK("some rows tie in the last layer, not all", zero > 0 && zero < (size_t)B * S);
    CHECK("the earlier layers' margins did not move", moved == 0);

    /* Streams that break exact ties the other way differ from the batch there, and only
     * where a near-tie reaches. */
    kiln_rt_ties_high = true;
    bool streamed = kiln_test_stream_all(m, x, B, S, ys);
    kiln_rt_ties_high = false;
    CHECK("streamed", streamed);
    size_t near = kiln_runtime_tie_reach(&c, mg2, B, S, 1e-5, reach);
    CHECK("every row with a zero margin is near a tie", near >= zero);
    kiln_thresholds th;
    kiln_thresholds_default(&th);
    kiln_compare cmp;
    kiln_compare_f32(ys, y2, (size_t)B * S * O, &th.stream, &cmp);
    CHECK("the tie-high streams differ from the batch", !cmp.passed);
    kiln_compare_f32_excused(ys, y2, (size_t)B * S * O, &th.stream, reach, O, &cmp);
    CHECK("... only where a near-tie reaches", cmp.passed && cmp.excused > 0);
    size_t far = 0;
    while (far < (size_t)B * S && reach[far])
        far++;
    if (CHECK("a row no near-tie reaches", far < (size_t)B * S)) {
        ys[far * O] *= 1.01f;
        kiln_compare_f32_excused(ys, y2, (size_t)B * S * O, &th.stream, reach, O, &cmp);
        CHECK("a difference there is not excused", !cmp.passed && cmp.worst == far * O);
    }

    /* Nothing can tie in a dense model or with every expert chosen. */
    kiln_model_config cd = config(D, 2, 2, 24, 0, 0, S, 6, F, O),
                      ck = config(D, 2, 2, 24, 3, 3, S, 6, F, O);
    kiln_model *md = random_model("margins-dense.safetensors", &cd, 43, false),
               *mk = random_model("margins-all.safetensors", &ck, 44, true);
    bool inf = md && mk;
    for (int v = 0; inf && v < 2; v++) {
        inf = kiln_runtime_forward_margins(v ? mk : md, x, 1, S, y2, mg) == KILN_OK;
        for (size_t i = 0; inf && i < (size_t)S * 2; i++)
            inf = isinf(mg[i]) && mg[i] > 0;
    }
    CHECK("dense and top_k == n_experts: every margin +inf", inf);
    kiln_model_free(md);
    kiln_model_free(mk);
out:
    free(x), free(y), free(y2), free(ys), free(mg), free(mg1), free(mg2), free(reach);
    kiln_model_free(m);
}

/* A bf16 model's margins come from its widened router matrix: those of an f32 model holding
 * the same values. */
KILN_TEST(runtime_router_margins_bf16) {
    enum { S = 30, F = 4, O = 2, L = 2 };
    kiln_model_config c = config(16, L, 2, 24, 6, 2, S, 5, F, O);
    kiln_model *mb = random_model("mb.safetensors", &c, 51, true);
    char *pf = kiln_test_path("mb-f32.safetensors");
    kiln_model *mf = NULL;
    float *x = random_inputs((size_t)S * F, 52), *y = kiln_malloc((size_t)2 * S * O * 4),
          *mg = kiln_malloc((size_t)2 * S * L * 4);
    if (!mb || !x || !y || !mg) goto out;
    /* The same weights as f32: the bf16 model's matrices widened, vectors as they are. */
    kiln_st_writer *w = NULL;
    kiln_st *st = NULL;
    char *bp = kiln_test_path("mb.safetensors");
    bool ok = kiln_st_open(bp, &st) == KILN_OK && kiln_st_writer_new(&w) == KILN_OK;
    float **wide = ok ? calloc(kiln_st_count(st), sizeof *wide) : NULL;
    for (size_t i = 0; ok && wide && i < kiln_st_count(st); i++) {
        const kiln_tensor *t = kiln_st_at(st, i);
        wide[i] = kiln_malloc(t->numel * 4 + 4);
        ok = wide[i] && kiln_tensor_to_f32(t, wide[i]) == KILN_OK &&
             kiln_st_writer_add(w, t->name, KILN_F32, t->ndim, t->shape, wide[i]) == KILN_OK;
    }
    for (size_t i = 0; ok && i < kiln_st_meta_count(st); i++) {
        const char *k, *v;
        kiln_st_meta_at(st, i, &k, &v);
        ok = kiln_st_writer_meta(w, k, v) == KILN_OK;
    }
    ok = ok && wide && kiln_st_writer_write(w, pf) == KILN_OK && kiln_model_open(pf, &mf) == KILN_OK;
    for (size_t i = 0; wide && st && i < kiln_st_count(st); i++)
        free(wide[i]);
    free(wide);
    kiln_st_writer_free(w);
    kiln_st_close(st);
    free(bp);
    if (!CHECK("an f32 twin of the bf16 model", ok)) goto out;
    CHECK("margins of both", kiln_runtime_forward_margins(mb, x, 1, S, y, mg) == KILN_OK &&
                                 kiln_runtime_forward_margins(mf, x, 1, S, y + S * O,
                                                              mg + S * L) == KILN_OK);
    CHECK("the same outputs", !memcmp(y, y + S * O, (size_t)S * O * 4));
    CHECK("the same margins", !memcmp(mg, mg + S * L, (size_t)S * L * 4));
out:
    free(x), free(y), free(mg), free(pf);
    kiln_model_free(mb);
    kiln_model_free(mf);
}

KILN_TEST(runtime_tie_reach) {
    /* L = 3, W = 4: a near-tie at layer l reaches (L-1-l)*(W-1) rows past its own. */
    kiln_model_config c = config(8, 3, 2, 8, 4, 2, 20, 4, 2, 1);
    enum { S = 20, L = 3 };
    float mg[2 * S * L];
    uint8_t reach[2 * S];
    for (size_t i = 0; i < 2 * S * L; i++)
        mg[i] = 0.5f;
    mg[(0 * S + 5) * L + 0] = 1e-6f; /* sequence 0, row 5, layer 0: rows 5..11 */
    mg[(0 * S + 18) * L + 1] = 0;    /* row 18, layer 1: rows 18..21, cut at 19 */
    mg[(1 * S + 2) * L + 2] = NAN;   /* sequence 1, row 2, last layer: row 2 alone */
    mg[(1 * S + 9) * L + 2] = 2e-5f; /* above ties.rtol 1e-5: no tie */
    size_t near = kiln_runtime_tie_reach(&c, mg, 2, S, 1e-5, reach);
    CHECK("three rows near a tie", near == 3);
    char got[2 * S + 1];
    for (size_t i = 0; i < 2 * S; i++)
        got[i] = reach[i] ? '1' : '0';
    got[2 * S] = 0;
    const char *want = "0000011111110000001100100000000000000000";
    if (!CHECK("the rows reached", !strcmp(got, want)))
        fprintf(stderr, "    got  %s\n    want %s\n", got, want);
}

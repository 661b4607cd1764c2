/* A model's attn_window sizes nothing up front (issue 16): a stream's rings grow as the
 * stream ages, up to the window, with bitwise the numbers of rings made whole at open; the
 * batch forward's workspace is sized by the call's sequence length where that is shorter. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime_int.h"
#include "test.h"
#include "testutil.h"

static kiln_model *window_model(const char *name, int W, uint64_t seed) {
    kiln_model_config c = {.n_features = 3,
                           .n_outputs = 2,
                           .d_model = 8,
                           .n_layers = 2,
                           .n_heads = 2,
                           .d_ff = 16,
                           .n_experts = 4,
                           .top_k = 2,
                           .seq_len = W,
                           .attn_window = W,
                           .norm_eps = 1e-5f};
    char *p = kiln_test_path(name);
    kiln_model *m = NULL;
    if (CHECK("write random model", kiln_rt_random_model(p, &c, seed, false) == KILN_OK))
        CHECK("open random model", kiln_model_open(p, &m) == KILN_OK);
    free(p);
    return m;
}

static float *inputs(size_t n, uint64_t seed) {
    float *x = kiln_malloc(n * sizeof *x);
    for (size_t i = 0; x && i < n; i++)
        x[i] = (float)(2.0 * kiln_rt_normal(seed, i));
    return x;
}

static long vm_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmSize:", 7)) kb = strtol(line + 7, NULL, 10);
    if (f) fclose(f);
    return kb;
}

/* attn_window 2^20 on a model of d_model 8: a stream used to take 2 x 2 x 2^20 x 8 floats of
 * rings at open (136 MiB with the scores); now it takes what it has seen, and its outputs
 * are the batch forward's. */
KILN_TEST(runtime_huge_window_costs_what_is_used) {
    kiln_model *m = window_model("huge.safetensors", 1 << 20, 31);
    if (!m) return;
    const int T = 600;
    CHECK("the batch workspace for 600 rows is under 1 MiB",
          kiln_model_workspace_size(m, 1, T) < (1u << 20));
    long before = vm_kb();
    kiln_stream *s = NULL;
    if (!CHECK("open a stream", kiln_stream_open(m, &s) == KILN_OK)) goto out;
    long grew = vm_kb() - before;
    if (!CHECK("opening it takes under 16 MiB", before > 0 && grew < 16 * 1024))
        fprintf(stderr, "    VmSize grew by %ld KiB\n", grew);
    float *x = inputs((size_t)T * 3, 5), *ys = kiln_calloc((size_t)T * 2, 4),
          *yb = kiln_calloc((size_t)T * 2, 4);
    bool ok = x && ys && yb;
    for (int t = 0; ok && t < T; t++)
        ok = kiln_stream_push(s, x + (size_t)t * 3, ys + (size_t)t * 2) == KILN_OK;
    CHECK("600 ticks pushed (the rings grew twice)", ok);
    CHECK("batch", ok && kiln_model_forward(m, x, 1, T, yb) == KILN_OK);
    CHECK("stream == batch (1e-5)", ok && kiln_test_rel_err(ys, yb, (size_t)T * 2) < 1e-5);
    free(x), free(ys), free(yb);
out:
    kiln_stream_free(s);
    kiln_model_free(m);
}

/* Rings grown from one entry (1, 2, 4, ... W-1, through a reset and into wrapping) give the
 * same bits as rings made whole at open, pushed alone and in a set. */
KILN_TEST(runtime_stream_ring_growth_bitwise) {
    const int W = 300, T = kiln_test_sanitized() ? 700 : 1300;
    kiln_model *m = window_model("grow.safetensors", W, 32);
    if (!m) return;
    float *x = inputs((size_t)T * 3, 6), *ya = kiln_calloc((size_t)T * 2, 4),
          *yb = kiln_calloc((size_t)T * 2, 4), *yc = kiln_calloc((size_t)T * 2, 4);
    kiln_stream *a = NULL, *b = NULL, *c = NULL;
    int saved = kiln_rt_ring_start;
    kiln_rt_ring_start = 1 << 30; /* whole at open: the rings as they always were */
    bool ok = x && ya && yb && yc && kiln_stream_open(m, &a) == KILN_OK;
    kiln_rt_ring_start = 1;
    ok = ok && kiln_stream_open(m, &b) == KILN_OK && kiln_stream_open(m, &c) == KILN_OK;
    kiln_rt_ring_start = saved;
    if (!CHECK("three streams", ok)) goto out;
    /* b is reset after 100 ticks (its grown rings kept) and pushes the sequence from the start */
    for (int t = 0; ok && t < 100; t++)
        ok = kiln_stream_push(b, x + (size_t)t * 3, yb + (size_t)t * 2) == KILN_OK;
    kiln_stream_reset(b);
    for (int t = 0; ok && t < T; t++) {
        ok = kiln_stream_push(a, x + (size_t)t * 3, ya + (size_t)t * 2) == KILN_OK &&
             kiln_stream_push(b, x + (size_t)t * 3, yb + (size_t)t * 2) == KILN_OK;
        kiln_stream *set[1] = {c};
        ok = ok && kiln_stream_push_many(set, 1, x + (size_t)t * 3, yc + (size_t)t * 2) == KILN_OK;
    }
    CHECK("pushed", ok);
    CHECK("grown rings: the same bits as whole ones",
          ok && !memcmp(ya, yb, (size_t)T * 2 * sizeof(float)));
    CHECK("grown rings in a set: the same bits",
          ok && !memcmp(ya, yc, (size_t)T * 2 * sizeof(float)));
out:
    free(x), free(ya), free(yb), free(yc);
    kiln_stream_free(a), kiln_stream_free(b), kiln_stream_free(c);
    kiln_model_free(m);
}

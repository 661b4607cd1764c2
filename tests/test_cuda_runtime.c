/* test_cuda_runtime.c - the runtime on a CUDA device (kiln_model_open_opts with a device).
 * Without a GPU, or in a build without CUDA, opening on a device fails cleanly with the file
 * named and nothing returned. With a GPU (the emulator: `make gpu-emu`): the batch forward
 * (whole sequences, and long ones in chunks) and the streams (one CUDA graph per tick) equal
 * the CPU runtime to f32 rounding, for mixture and dense models, f32 and bf16 weights,
 * W = 1 and W = S, and a stream equals the batch forward, after a reset too; push_many on
 * device streams equals single pushes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime_int.h"
#include "test.h"
#include "testutil.h"
#ifdef KILN_HAVE_CUDA
#include "kernels.h"
#endif

typedef struct rcase {
    const char *name;
    int D, L, H, Fh, E, K, W;
    bool bf16;
} rcase;

static void one_case(const rcase *rc, int idx) {
    kiln_model_config c = {.n_features = 5,
                           .n_outputs = 3,
                           .d_model = rc->D,
                           .n_layers = rc->L,
                           .n_heads = rc->H,
                           .d_ff = rc->Fh,
                           .n_experts = rc->E,
                           .top_k = rc->K,
                           .seq_len = 12,
                           .attn_window = rc->W,
                           .norm_eps = 1e-5f};
    char file[64], what[160];
    snprintf(file, sizeof file, "m%d.safetensors", idx);
    char *p = kiln_test_path(file);
    kiln_model *cpu = NULL, *gpu = NULL;
    const int B = 3, S = 14, T = 40; /* S > seq_len: any length works */
    const size_t nx = (size_t)B * S * 5, ny = (size_t)B * S * 3, nlx = (size_t)T * 5,
                 nly = (size_t)T * 3;
    float *x = kiln_malloc((nx + nlx) * 4), *yc = kiln_malloc((ny + nly) * 4),
          *yg = kiln_malloc((ny + nly) * 4), *ys = kiln_malloc((ny + nly) * 4);
    kiln_model_opts o = {.device = 0};
    if (!CHECK("buffers", x && yc && yg && ys) ||
        !CHECK("model", kiln_rt_random_model(p, &c, 40 + (uint64_t)idx, rc->bf16) == KILN_OK) ||
        !CHECK("open on the cpu", kiln_model_open(p, &cpu) == KILN_OK) ||
        !CHECK("open on the gpu", kiln_model_open_opts(p, &o, &gpu) == KILN_OK))
        goto out;
    CHECK("the devices", kiln_model_device(cpu) == KILN_DEVICE_CPU && kiln_model_device(gpu) == 0);
    for (size_t i = 0; i < nx + nlx; i++)
        x[i] = (float)(2.0 * kiln_rt_normal(7 + (uint64_t)idx, i));
    /* Batch, whole sequences. */
    CHECK("cpu batch", kiln_model_forward(cpu, x, B, S, yc) == KILN_OK);
    CHECK("gpu batch", kiln_model_forward(gpu, x, B, S, yg) == KILN_OK);
    double e = kiln_test_rel_err(yg, yc, ny);
    snprintf(what, sizeof what, "%s: gpu batch = cpu batch (1e-5; %.2g)", rc->name, e);
    CHECK(what, e <= 1e-5);
    /* A long sequence in small chunks: each piece recomputes the L*(W-1) rows before it. */
    const int ctx = rc->L * (rc->W - 1);
    CHECK("small chunks", kiln_rt_dev_set_chunk(gpu, 2 * ctx + 1 + 3) == KILN_OK);
    CHECK("cpu long", kiln_model_forward(cpu, x + nx, 1, T, yc + ny) == KILN_OK);
    CHECK("gpu long", kiln_model_forward(gpu, x + nx, 1, T, yg + ny) == KILN_OK);
    e = kiln_test_rel_err(yg + ny, yc + ny, nly);
    snprintf(what, sizeof what, "%s: gpu chunked = cpu (1e-5; %.2g)", rc->name, e);
    CHECK(what, e <= 1e-5);
    /* Streams: one graph launch a tick, a reset between sequences. */
    CHECK("gpu streams", kiln_test_stream_all(gpu, x, B, S, ys));
    e = kiln_test_rel_err(ys, yc, ny);
    snprintf(what, sizeof what, "%s: gpu stream = cpu batch (1e-5; %.2g)", rc->name, e);
    CHECK(what, e <= 1e-5);
    e = kiln_test_rel_err(ys, yg, ny);
    snprintf(what, sizeof what, "%s: gpu stream = gpu batch (1e-5; %.2g)", rc->name, e);
    CHECK(what, e <= 1e-5);
    kiln_stream *s = NULL;
    float bad[5] = {0, NAN, 0, 0, 0}, out3[3];
    if (CHECK("stream", kiln_stream_open(gpu, &s) == KILN_OK)) {
        CHECK("a non-finite feature is refused",
              kiln_stream_push(s, bad, out3) == KILN_ERR_NUMERIC);
        CHECK("and not counted", kiln_stream_ticks(s) == 0);
        CHECK("the first tick after it is a first tick",
              kiln_stream_push(s, x, out3) == KILN_OK && kiln_test_rel_err(out3, yc, 3) <= 1e-5);
    }
    kiln_stream_free(s);
    /* push_many on device streams pushes each in turn: what single pushes give, bit for bit. */
    kiln_stream *ab[2] = {NULL, NULL}, *cd[2] = {NULL, NULL};
    if (CHECK("streams for push_many", kiln_stream_open(gpu, &ab[0]) == KILN_OK &&
                                           kiln_stream_open(gpu, &ab[1]) == KILN_OK &&
                                           kiln_stream_open(gpu, &cd[0]) == KILN_OK &&
                                           kiln_stream_open(gpu, &cd[1]) == KILN_OK)) {
        bool same = true;
        float ym[6], y1[6];
        for (int t = 0; t < S; t++) {
            const float *xt = x + (size_t)t * 5, *xu = x + ((size_t)S + t) * 5;
            float two[10];
            memcpy(two, xt, 5 * sizeof *two);
            memcpy(two + 5, xu, 5 * sizeof *two);
            same &= kiln_stream_push_many(ab, 2, two, ym) == KILN_OK &&
                    kiln_stream_push(cd[0], xt, y1) == KILN_OK &&
                    kiln_stream_push(cd[1], xu, y1 + 3) == KILN_OK && !memcmp(ym, y1, sizeof ym);
        }
        snprintf(what, sizeof what, "%s: push_many on the gpu == single pushes, bit for bit",
                 rc->name);
        CHECK(what, same && kiln_stream_ticks(ab[1]) == (uint64_t)S);
        float bad[10] = {0};
        bad[7] = NAN;
        CHECK("push_many on the gpu refuses a non-finite feature",
              kiln_stream_push_many(ab, 2, bad, ym) == KILN_ERR_NUMERIC &&
                  kiln_stream_ticks(ab[0]) == (uint64_t)S);
    }
    for (int i = 0; i < 2; i++)
        kiln_stream_free(ab[i]), kiln_stream_free(cd[i]);
out:
    kiln_model_free(cpu);
    kiln_model_free(gpu);
    free(x), free(yc), free(yg), free(ys), free(p);
}

KILN_TEST(cuda_runtime_device) {
    if (!kiln_test_gpu_present()) {
        kiln_model_config c = {5, 3, 16, 1, 2, 24, 4, 2, 8, 4, 1e-5f};
        char *p = kiln_test_path("m.safetensors");
        kiln_model *m = (kiln_model *)p; /* must come back NULL */
        kiln_model_opts o = {.device = 0};
        if (CHECK("model", kiln_rt_random_model(p, &c, 1, false) == KILN_OK)) {
            kiln_err rc = kiln_model_open_opts(p, &o, &m);
#ifdef KILN_HAVE_CUDA
            CHECK("no GPU: a device error",
                  rc == KILN_ERR_DEVICE && strstr(kiln_errmsg(), "no usable CUDA device"));
#else
            CHECK("no CUDA: unsupported",
                  rc == KILN_ERR_UNSUPPORTED && strstr(kiln_errmsg(), "has no CUDA"));
#endif
            CHECK("the file is named", strstr(kiln_errmsg(), p) != NULL);
            CHECK("nothing returned", m == NULL);
            o.device = -2;
            CHECK("a bad device index", kiln_model_open_opts(p, &o, &m) == KILN_ERR_USAGE);
            CHECK("the cpu still works", kiln_model_open_opts(p, NULL, &m) == KILN_OK &&
                                             kiln_model_device(m) == KILN_DEVICE_CPU);
            kiln_model_free(m);
        }
        free(p);
        return;
    }
    const rcase cases[] = {
        {"moe", 16, 2, 4, 24, 4, 2, 4, false},
        {"moe K=E W=1", 16, 1, 2, 16, 3, 3, 1, false},
        {"dense W=S", 24, 2, 3, 32, 0, 0, 12, false},
        {"moe bf16", 16, 2, 4, 24, 4, 2, 5, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        one_case(&cases[i], (int)i);
}

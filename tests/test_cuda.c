/* test_cuda.c - the CUDA-enabled library links and degrades cleanly: without a GPU (or in a
 * build without CUDA) creating a device network fails with a clear error and no leak, and
 * the ops refuse to run without a context. With a GPU, a small network on the device matches
 * the CPU network (tests/gpu/check.c does the full comparison). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "test.h"
#include "train.h"

static kiln_model_config small_config(void) {
    kiln_model_config c = {.n_features = 3,
                           .n_outputs = 2,
                           .d_model = 16,
                           .n_layers = 2,
                           .n_heads = 2,
                           .d_ff = 24,
                           .n_experts = 4,
                           .top_k = 2,
                           .seq_len = 8,
                           .attn_window = 4,
                           .norm_eps = 1e-5f};
    return c;
}

KILN_TEST(cuda_config_errors_come_first) {
    kiln_model_config c = small_config();
    c.n_heads = 5; /* 16 % 5 != 0 */
    kiln_tsmoe_cuda *m = NULL;
    kiln_err rc = kiln_tsmoe_cuda_create(&c, 2, NULL, &m);
#ifdef KILN_HAVE_CUDA
    CHECK("a bad config is a config error, GPU or not", rc == KILN_ERR_CONFIG);
    CHECK("the message names the config", strstr(kiln_errmsg(), "model config") != NULL);
#else
    CHECK("no CUDA in this build", rc == KILN_ERR_UNSUPPORTED || rc == KILN_ERR_CONFIG);
#endif
    CHECK("nothing returned", m == NULL);
    kiln_tsmoe_cuda_free(NULL);
}

#ifdef KILN_HAVE_CUDA
/* A GPU is present: one forward and backward against the CPU network. */
static void compare_with_cpu(void) {
    kiln_model_config c = small_config();
    kiln_tsmoe *cpu = NULL;
    kiln_tsmoe_cuda *gpu = NULL;
    float *x = NULL, *t = NULL, *y = NULL, *g = NULL;
    if (!CHECK("cpu network", kiln_tsmoe_create(&c, 2, &cpu) == KILN_OK)) goto out;
    if (!CHECK("cuda network", kiln_tsmoe_cuda_create(&c, 2, NULL, &gpu) == KILN_OK)) goto out;
    kiln_tsmoe_init(cpu, 7);
    size_t N = 2 * (size_t)c.seq_len, numel = kiln_tsmoe_numel(cpu);
    x = malloc(N * c.n_features * sizeof *x);
    t = malloc(N * c.n_outputs * sizeof *t);
    y = malloc(N * c.n_outputs * sizeof *y);
    g = malloc(numel * sizeof *g);
    if (!CHECK("buffers", x && t && y && g)) goto out;
    for (size_t i = 0; i < N * c.n_features; i++)
        x[i] = sinf((float)i * 0.37f);
    for (size_t i = 0; i < N * c.n_outputs; i++)
        t[i] = cosf((float)i * 0.11f);
    kiln_loss lc, lg;
    CHECK("upload", kiln_tsmoe_cuda_upload_params(gpu, kiln_tsmoe_params(cpu)) == KILN_OK);
    CHECK("cpu forward", kiln_tsmoe_forward(cpu, x, t, 2, NULL, &lc) == KILN_OK);
    CHECK("cuda forward", kiln_tsmoe_cuda_forward(gpu, x, t, 2, NULL, &lg) == KILN_OK);
    CHECK("loss agrees", fabs(lc.loss - lg.loss) <= 1e-5 * fabs(lc.loss));
    kiln_tsmoe_zero_grads(cpu);
    CHECK("cpu backward", kiln_tsmoe_backward(cpu, 1.0f) == KILN_OK);
    CHECK("cuda backward", kiln_tsmoe_cuda_backward(gpu, 1.0f) == KILN_OK);
    CHECK("download", kiln_tsmoe_cuda_download_grads(gpu, g) == KILN_OK);
    double big = 0, err = 0;
    for (size_t i = 0; i < numel; i++) {
        big = fmax(big, fabs(kiln_tsmoe_grads(cpu)[i]));
        err = fmax(err, fabs(g[i] - kiln_tsmoe_grads(cpu)[i]));
    }
    CHECK("gradients agree", big > 0 && err <= 1e-4 * big);
out:
    free(x);
    free(t);
    free(y);
    free(g);
    kiln_tsmoe_free(cpu);
    kiln_tsmoe_cuda_free(gpu);
}
#endif

KILN_TEST(cuda_degrades_cleanly) {
    kiln_model_config c = small_config();
    kiln_tsmoe_cuda *m = (kiln_tsmoe_cuda *)&c; /* must be reset to NULL on failure */
#ifdef KILN_HAVE_CUDA
    if (kiln_cuda_device_count() > 0) {
        compare_with_cpu();
        return;
    }
    kiln_err rc = kiln_tsmoe_cuda_create(&c, 2, NULL, &m);
    CHECK("no GPU: create fails with a device error", rc == KILN_ERR_DEVICE);
    CHECK("the message says there is no usable device",
          strstr(kiln_errmsg(), "'cuda network': cuda: no usable CUDA device") != NULL);
    CHECK("nothing returned", m == NULL);
    CHECK("init fails the same way", kiln_cuda_init(0) == KILN_ERR_DEVICE);
    /* Without a context an op that needs cuBLAS refuses, naming itself; it touches no
     * memory (the pointers are never dereferenced on the host). */
    float dummy = 0;
    CHECK("an op without a context is refused",
          kiln_cuda_linear_forward(&dummy, &dummy, &dummy, NULL, 1, 1, 1) == KILN_ERR_USAGE &&
              strstr(kiln_errmsg(), "'linear_forward'") != NULL);
    CHECK("scratch without a context is refused", kiln_cuda_reserve(1024) == KILN_ERR_USAGE);
    CHECK("release without init does nothing", (kiln_cuda_release(), true));
#else
    kiln_err rc = kiln_tsmoe_cuda_create(&c, 2, NULL, &m);
    CHECK("a build without CUDA says so",
          rc == KILN_ERR_UNSUPPORTED && strstr(kiln_errmsg(), "has no CUDA") != NULL);
    CHECK("nothing returned", m == NULL);
#endif
}

#if defined(KILN_HAVE_CUDA) && defined(KILN_HAVE_NCCL)
kiln_err kiln_nccl_load(void); /* train/nccl_dl.c (train_int.h) */
#endif

/* cuBLAS and NCCL are opened on first use (kernels/cuda/blas_dl.c, train/nccl_dl.c), not
 * linked: the toolkit this was built with has them, so every call kiln makes must resolve
 * in them, with or without a GPU. */
KILN_TEST(cuda_vendor_libraries_open_on_use) {
#ifdef KILN_HAVE_CUDA
    kiln_err rc = kiln_cuda_blas_load();
    CHECK("libcublas opens and has every call kiln makes", rc == KILN_OK);
    if (rc) fprintf(stderr, "    %s\n", kiln_errmsg());
#ifdef KILN_HAVE_NCCL
    rc = kiln_nccl_load();
    CHECK("libnccl opens and has every call kiln makes", rc == KILN_OK);
    if (rc) fprintf(stderr, "    %s\n", kiln_errmsg());
#endif
#else
    kiln_model_config c = small_config();
    kiln_tsmoe_cuda *m = NULL;
    CHECK("a build without CUDA opens nothing and says so",
          kiln_tsmoe_cuda_create(&c, 2, NULL, &m) == KILN_ERR_UNSUPPORTED && !m);
#endif
}

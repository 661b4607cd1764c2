/*
 * bench_stream.c - per-tick latency of kiln_stream_push, one thread, against a baseline
 * measured in the same run: one OpenBLAS sgemv (one thread) over as many f32 weights as
 * a tick reads (every non-expert matrix plus top_k experts per layer). The ratio says how
 * close a tick comes to streaming its weights once; the absolute figures say what the
 * machine does. Usage: bench_stream DIR (models are written there); results on stdout.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime_int.h"
#include "train.h"

typedef struct {
    const char *name;
    kiln_model_config cfg;
    bool bf16;
    int ticks;
} bench_case;

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

typedef struct {
    double p50, p99, max; /* microseconds */
} stats;

static stats summarise(uint64_t *ns, int n) {
    qsort(ns, (size_t)n, sizeof *ns, cmp_u64);
    return (stats){ns[n / 2] / 1e3, ns[(size_t)(0.99 * (n - 1))] / 1e3, ns[n - 1] / 1e3};
}

/* Weights a tick reads, in elements. */
static size_t tick_weights(const kiln_model_config *c) {
    size_t D = (size_t)c->d_model, Fh = (size_t)c->d_ff;
    size_t ffn =
        c->n_experts ? (size_t)c->n_experts * D + (size_t)c->top_k * 2 * Fh * D : 2 * Fh * D;
    return D * (size_t)c->n_features + (size_t)c->n_layers * (4 * D * D + ffn) +
           (size_t)c->n_outputs * D;
}

static void cpu_name(char *out, size_t len) {
    snprintf(out, len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!strncmp(line, "model name", 10) && colon) {
            snprintf(out, len, "%s", colon + 2);
            out[strcspn(out, "\n")] = 0;
            break;
        }
    }
    if (f) fclose(f);
}

static int run_case(const char *dir, const bench_case *bc) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, bc->name);
    kiln_model *m = NULL;
    kiln_stream *s = NULL;
    if (kiln_rt_random_model(path, &bc->cfg, 1, bc->bf16) != KILN_OK ||
        kiln_model_open(path, &m) != KILN_OK || kiln_stream_open(m, &s) != KILN_OK) {
        fprintf(stderr, "bench_stream: %s\n", kiln_errmsg());
        kiln_model_free(m);
        return 1;
    }
    const kiln_model_config *c = &bc->cfg;
    const int F = c->n_features, warm = bc->ticks / 10, n = bc->ticks;
    float *x = kiln_malloc((size_t)1024 * F * sizeof *x), y[64];
    uint64_t *ns = kiln_malloc((size_t)n * sizeof *ns);
    for (int i = 0; i < 1024 * F; i++)
        x[i] = (float)kiln_rt_normal(9, (uint64_t)i);
    int failed = 0;
    for (int t = 0; t < warm + n; t++) {
        uint64_t t0 = kiln_now_ns();
        failed |= kiln_stream_push(s, x + (size_t)(t % 1024) * F, y) != KILN_OK;
        uint64_t dt = kiln_now_ns() - t0;
        if (t >= warm) ns[t - warm] = dt;
    }
    stats push = summarise(ns, n);

    /* Baseline: y = A x over the same number of f32 weights, A [rows, D]. */
    const int cols = c->d_model, rows = (int)(tick_weights(c) / (size_t)cols);
    float *A = kiln_malloc((size_t)rows * cols * sizeof *A),
          *v = kiln_malloc((size_t)cols * sizeof *v);
    float *out = kiln_malloc((size_t)rows * sizeof *out);
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        A[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (int i = 0; i < cols; i++)
        v[i] = 1.0f / (float)(i + 1);
    for (int t = 0; t < warm + n; t++) {
        uint64_t t0 = kiln_now_ns();
        cblas_sgemv(CblasRowMajor, CblasNoTrans, rows, cols, 1.0f, A, cols, v, 1, 0.0f, out, 1);
        uint64_t dt = kiln_now_ns() - t0;
        if (t >= warm) ns[t - warm] = dt;
    }
    stats gemv = summarise(ns, n);
    printf("%-10s %-4s %8.3f MB  %7d  %9.2f %9.2f %9.2f  %9.2f  %6.2f\n", bc->name,
           bc->bf16 ? "bf16" : "f32", (double)tick_weights(c) * (double)m->wsize / 1e6, n, push.p50,
           push.p99, push.max, gemv.p50, push.p50 / gemv.p50);
    free(A);
    free(v);
    free(out);
    free(x);
    free(ns);
    kiln_stream_free(s);
    kiln_model_free(m);
    return failed;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: bench_stream DIR\n");
        return 2;
    }
    openblas_set_num_threads(1); /* the baseline runs on one thread, like a stream */
    /* The tiny model is the trainer's default config (what the demo trains), with the
     * demo dataset's 8 features and 2 targets. */
    kiln_train_config defaults;
    kiln_train_config_default(&defaults);
    kiln_model_config tiny = defaults.model;
    tiny.n_features = 8;
    tiny.n_outputs = 2;
    const kiln_model_config big = {.n_features = 8,
                                   .n_outputs = 2,
                                   .d_model = 256,
                                   .n_layers = 4,
                                   .n_heads = 8,
                                   .d_ff = 1024,
                                   .n_experts = 8,
                                   .top_k = 2,
                                   .seq_len = 128,
                                   .attn_window = 128,
                                   .norm_eps = 1e-5f};
    const bench_case cases[] = {
        {"tiny", tiny, false, 100000},
        {"d256", big, false, 4000},
        {"d256", big, true, 4000},
    };
    char cpu[256], date[21];
    cpu_name(cpu, sizeof cpu);
    kiln_format_time(kiln_unix_time(), date);
    printf("# kiln stream push latency, one thread: %s, %s, kiln %s\n", cpu, date, kiln_version());
    printf("# ticks after 10%% warm-up; baseline = one OpenBLAS sgemv (1 thread) over the f32 "
           "weights a tick "
           "reads; ratio = push p50 / sgemv p50\n");
    printf("%-10s %-4s %11s  %7s  %9s %9s %9s  %9s  %6s\n", "model", "wts", "bytes/tick", "ticks",
           "p50_us", "p99_us", "max_us", "sgemv_us", "ratio");
    int failed = 0;
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++)
        failed |= run_case(argv[1], &cases[i]);
    return failed;
}

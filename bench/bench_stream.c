/*
 * bench_stream.c - per-tick latency of kiln_stream_push, one thread, against a baseline
 * measured in the same run: one OpenBLAS sgemv (one thread) over as many f32 weights as
 * a tick reads (every non-expert matrix plus top_k experts per layer). The ratio says how
 * close a tick comes to streaming its weights once; the absolute figures say what the
 * machine does.
 *
 * Then kiln_stream_push_many against kiln_stream_push on the same streams: one tick for n
 * streams in one call, or n calls, in interleaved rounds of the same run.
 *
 * Usage: bench_stream DIR (models are written there); results on stdout.
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

/* Read a buffer twice the size of the last-level cache, so that what comes next finds none
 * of the model's weights or rings in cache. */
enum { SCRUB_BYTES = 64 << 20 };
static float scrub_sink;
static void scrub(const float *buf) {
    float acc = 0;
    for (size_t i = 0; i < SCRUB_BYTES / sizeof *buf; i += 16) /* a float per cache line */
        acc += buf[i];
    scrub_sink += acc;
}

/* push_many against single pushes for n = 1, 8, 64, 256 streams of one model. One set of
 * 256 streams, filled past the window first (so every tick attends W keys, as in a running
 * service); each case uses the first n. A round times one push_many over the n streams and
 * then n kiln_stream_push calls, one per stream, with the next tick's features; each of the
 * two starts with the caches scrubbed, so that neither finds what the other just read, and
 * the rounds interleave them so that the machine's load falls on both alike. Medians over
 * rounds. */
static int run_many_case(const char *dir, const bench_case *bc) {
    enum { NMAX = 256 };
    static const size_t ns[] = {1, 8, 64, NMAX};
    char path[1024];
    snprintf(path, sizeof path, "%s/%s-many-%s.safetensors", dir, bc->name,
             bc->bf16 ? "bf16" : "f32");
    const kiln_model_config *c = &bc->cfg;
    const int F = c->n_features, O = c->n_outputs;
    kiln_model *m = NULL;
    kiln_stream **s = kiln_calloc(NMAX, sizeof *s);
    float *x = kiln_malloc((size_t)NMAX * F * sizeof *x);
    float *y = kiln_malloc((size_t)NMAX * O * sizeof *y);
    uint64_t *many = kiln_malloc(1000 * sizeof *many), *single = kiln_malloc(1000 * sizeof *single);
    float *junk = kiln_malloc(SCRUB_BYTES);
    int failed = !s || !x || !y || !many || !single || !junk;
    if (junk)
        for (size_t i = 0; i < SCRUB_BYTES / sizeof *junk; i++)
            junk[i] = (float)(i & 7);
    if (!failed && (kiln_rt_random_model(path, c, 1, bc->bf16) != KILN_OK ||
                    kiln_model_open(path, &m) != KILN_OK))
        failed = 1;
    for (size_t i = 0; !failed && i < NMAX; i++)
        failed = kiln_stream_open(m, &s[i]) != KILN_OK;
    if (failed) {
        fprintf(stderr, "bench_stream: %s\n", kiln_errmsg());
        goto out;
    }
    uint64_t tick = 0;
    for (; tick < (uint64_t)c->attn_window; tick++) {
        for (size_t i = 0; i < (size_t)NMAX * F; i++)
            x[i] = (float)kiln_rt_normal(11, tick * NMAX * F + i);
        failed |= kiln_stream_push_many(s, NMAX, x, y) != KILN_OK;
    }
    for (size_t k = 0; k < KILN_ARRAY_LEN(ns); k++) {
        const size_t n = ns[k];
        /* About the same time per case: ~400 stream-ticks each way, at least 7 rounds. */
        int rounds = (int)(400 / n) < 7 ? 7 : (int)(400 / n);
        for (int r = 0; r < rounds; r++, tick++) {
            for (size_t i = 0; i < n * F; i++)
                x[i] = (float)kiln_rt_normal(12, tick * NMAX * F + i);
            scrub(junk);
            uint64_t t0 = kiln_now_ns();
            failed |= kiln_stream_push_many(s, n, x, y) != KILN_OK;
            many[r] = kiln_now_ns() - t0;
            scrub(junk);
            t0 = kiln_now_ns();
            for (size_t i = 0; i < n; i++)
                failed |= kiln_stream_push(s[i], x + i * F, y + i * O) != KILN_OK;
            single[r] = kiln_now_ns() - t0;
        }
        stats sm = summarise(many, rounds), ss = summarise(single, rounds);
        /* summarise gives microseconds per round: a round is one call, or n calls. */
        printf("%-10s %-4s %4zu  %6d  %12.3f  %12.2f  %14.2f  %6.2f\n", bc->name,
               bc->bf16 ? "bf16" : "f32", n, rounds, sm.p50 / 1e3, sm.p50 / (double)n,
               ss.p50 / (double)n, ss.p50 / sm.p50);
    }
out:
    for (size_t i = 0; s && i < NMAX; i++)
        kiln_stream_free(s[i]);
    free(s);
    free(x);
    free(y);
    free(many);
    free(single);
    free(junk);
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
    printf("\n# kiln_stream_push_many: one tick for n streams of one model in one call, against n "
           "kiln_stream_push calls on the same streams, in interleaved rounds, each from "
           "scrubbed caches (medians); us/tick = per stream-tick; ratio = single us/tick / many "
           "us/tick\n");
    printf("%-10s %-4s %4s  %6s  %12s  %12s  %14s  %6s\n", "model", "wts", "n", "rounds",
           "many_ms/call", "many_us/tick", "single_us/tick", "ratio");
    for (size_t i = 1; i < KILN_ARRAY_LEN(cases); i++) /* the d256 cases */
        failed |= run_many_case(argv[1], &cases[i]);
    return failed;
}

/*
 * bench_train.c - CPU training throughput on 1 and 2 threads, against baselines measured in
 * the same run: OpenBLAS sgemm on as many threads (OpenBLAS's own threading) at the step's
 * largest GEMM shape (the tokens of a step times d_model times d_ff, the FFN's first layer).
 * A step is what the trainer does for one batch: zero the gradients, forward with the loss,
 * backward, AdamW over every trained tensor, with the trainer's `threads`. GFLOP/s counts
 * kiln_tsmoe_flops_per_token (the figure behind the GPU's MFU) per token; `ratio` to the
 * sgemm's GFLOP/s on the same thread count says how close a step comes to doing nothing but
 * GEMMs at the BLAS's speed; `speedup` is the 1-thread step's mean over this one's; `cpu_ms`
 * is the process's user + system CPU time per step (on a shared machine a thread that got
 * no core shows as a mean near the 1-thread one with cpu_ms near mean_ms). best_ratio and
 * best_speedup are ratio and speedup over the best step instead of the mean: the sgemm is a
 * best of ten calls, so on a machine shared with other work the best step is its like (the
 * mean counts every time a neighbour took the core, the best the fewest). Usage:
 * bench_train [MODEL...] (all models, or those whose name starts with one of the arguments:
 * `bench_train d128` runs the two d128 rows); results on stdout. KILN_BENCH_STEPS=N times N
 * steps of every model instead of its own count, KILN_BENCH_THREADS=N only the row of N
 * threads (its speedup then nan): for a profiler.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "runtime_int.h"
#include "train.h"
#include "train_int.h"

typedef struct {
    const char *name;
    kiln_model_config cfg;
    int batch, steps;
} bench_case;

static double now_s(void) {
    return (double)kiln_now_ns() / 1e9;
}

/* Standard normal draws (the runtime's Philox normal, as bench_stream's inputs): inputs
 * only need to be O(1) and fixed; seed picks the stream. */
static void fill(float *x, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++)
        x[i] = (float)kiln_rt_normal(seed, (uint64_t)i);
}

static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

/* OpenBLAS's own (driver/others/blas_server.c): stops and joins its worker threads, which
 * otherwise spin on sched_yield for a while after each threaded call and take the second core
 * from whatever is timed next (kiln's 2-thread rows measured after a 2-thread sgemm did not
 * scale at all). Weak: another CBLAS links too. */
extern int blas_thread_shutdown_(void) __attribute__((weak));

/* GFLOP/s of sgemm C[M,N] = A[M,K] B[K,N] on OpenBLAS's `threads` threads: the best of
 * several timed calls. OpenBLAS goes back to one thread after, its workers stopped. */
static double sgemm_gflops(int M, int N, int K, int threads) {
    float *a = malloc((size_t)M * K * sizeof *a), *b = malloc((size_t)K * N * sizeof *b),
          *c = malloc((size_t)M * N * sizeof *c);
    double best = INFINITY;
    if (a && b && c) {
        fill(a, (size_t)M * K, 7);
        fill(b, (size_t)K * N, 8);
        openblas_set_num_threads(threads);
        for (int r = 0; r < 12; r++) {
            double t0 = now_s();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N, 0.0f,
                        c, N);
            double t = now_s() - t0;
            if (r > 1 && t < best) best = t;
        }
        openblas_set_num_threads(1);
        if (blas_thread_shutdown_) (void)blas_thread_shutdown_();
    }
    free(a), free(b), free(c);
    return isfinite(best) ? 2.0 * M * N * K / best / 1e9 : NAN;
}

/* kiln_gemm alone at C[M,N] = A[M,K] B[K,N] on `threads` threads: the rows cut into
 * `threads` equal pieces, one a pool item, as the trainer cuts its products (the bits do not
 * depend on the cut); GFLOP/s of the best of several calls, as sgemm_gflops. */
typedef struct {
    int M, N, K, pieces;
    const float *a, *b;
    float *c;
} gemm_job;

static void gemm_piece(void *ctx, int item) {
    const gemm_job *j = ctx;
    int r0 = (int)((long)j->M * item / j->pieces), r1 = (int)((long)j->M * (item + 1) / j->pieces);
    kiln_gemm(r1 - r0, j->N, j->K, j->a + (size_t)r0 * j->K, (size_t)j->K, 1, j->b, (size_t)j->N, 1,
              j->c + (size_t)r0 * j->N, (size_t)j->N, false);
}

static double kiln_gemm_gflops(int M, int N, int K, int threads) {
    float *a = malloc((size_t)M * K * sizeof *a), *b = malloc((size_t)K * N * sizeof *b),
          *c = malloc((size_t)M * N * sizeof *c);
    kiln_pool *pool = NULL;
    double best = INFINITY;
    if (a && b && c && kiln_pool_create(threads, &pool) == KILN_OK) {
        fill(a, (size_t)M * K, 7);
        fill(b, (size_t)K * N, 8);
        gemm_job j = {M, N, K, threads, a, b, c};
        for (int r = 0; r < 12; r++) {
            double t0 = now_s();
            kiln_pool_run(pool, threads, gemm_piece, &j);
            double t = now_s() - t0;
            if (r > 1 && t < best) best = t;
        }
    }
    kiln_pool_free(pool);
    free(a), free(b), free(c);
    return isfinite(best) ? 2.0 * M * N * K / best / 1e9 : NAN;
}

/* The GEMM table: kiln_gemm against OpenBLAS sgemm at the step's products of a model. */
static void gemm_rows(const char *name, const kiln_model_config *m, int batch) {
    const int N = batch * m->seq_len;
    const struct {
        const char *what;
        int M, N, K;
    } shapes[] = {
        {"ffn up", N, m->d_ff, m->d_model},
        {"ffn down", N, m->d_model, m->d_ff},
        {"qkv", N, 3 * m->d_model, m->d_model},
        {"dW ffn up", m->d_ff, m->d_model, N},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (int t = 1; t <= 2; t++) {
            double k = kiln_gemm_gflops(shapes[i].M, shapes[i].N, shapes[i].K, t),
                   o = sgemm_gflops(shapes[i].M, shapes[i].N, shapes[i].K, t);
            printf("%-11s %-10s %6d %6d %6d %7d %10.2f %10.2f %7.3f\n", name, shapes[i].what,
                   shapes[i].M, shapes[i].N, shapes[i].K, t, k, o, k / o);
        }
}

/* One case on `threads` threads; *mean1 and *best1 are the 1-thread mean and best step (set
 * by the 1-thread run). */
static int run(const bench_case *bc, int threads, double *mean1, double *best1) {
    const kiln_model_config *m = &bc->cfg;
    const int B = bc->batch, N = B * m->seq_len;
    kiln_tsmoe *net = NULL;
    kiln_train_config tc;
    kiln_train_config_default(&tc);
    tc.model = *m;
    tc.batch_size = B;
    tc.threads = threads;
    if (kiln_tsmoe_create(m, B, &net) != KILN_OK) {
        fprintf(stderr, "bench_train: %s: %s\n", bc->name, kiln_errmsg());
        return 1;
    }
    if (kiln_tsmoe_set_threads(net, threads) != KILN_OK) {
        fprintf(stderr, "bench_train: %s: %s\n", bc->name, kiln_errmsg());
        kiln_tsmoe_free(net);
        return 1;
    }
    kiln_tsmoe_init(net, 1);
    size_t np, numel = kiln_tsmoe_numel(net);
    const kiln_param *tab = kiln_tsmoe_param_table(net, &np);
    float *x = malloc((size_t)N * m->n_features * sizeof *x),
          *t = malloc((size_t)N * m->n_outputs * sizeof *t), *mom = calloc(2 * numel, sizeof *mom);
    int rc = 1;
    if (!x || !t || !mom) goto out;
    fill(x, (size_t)N * m->n_features, 1);
    fill(t, (size_t)N * m->n_outputs, 2);
    const kiln_loss_opts lo = {0.01f, 0.001f, 0.0f};
    kiln_loss loss = {0};
    double t0 = 0, c0 = 0, best = INFINITY;
    for (int i = -2; i < bc->steps; i++) { /* two warm-up steps */
        double ts = now_s();
        if (i == 0) t0 = ts, c0 = cpu_s();
        kiln_tsmoe_zero_grads(net);
        if (kiln_tsmoe_forward(net, x, t, B, &lo, &loss) != KILN_OK ||
            kiln_tsmoe_backward(net, 1.0f) != KILN_OK) {
            fprintf(stderr, "bench_train: %s: %s\n", bc->name, kiln_errmsg());
            goto out;
        }
        kiln_train_optim_run(kiln_tsmoe_pool(net), &tc, tab, np, kiln_tsmoe_params(net),
                             kiln_tsmoe_grads(net), mom, mom + numel, i + 3, 1e-3, NULL, NULL);
        if (i >= 0 && now_s() - ts < best) best = now_s() - ts;
    }
    const double mean = (now_s() - t0) / bc->steps, cpu = (cpu_s() - c0) / bc->steps;
    if (threads == 1) *mean1 = mean, *best1 = best;
    double active, fpt = kiln_tsmoe_flops_per_token(m, &active);
    const double tps = N / mean, gf = tps * fpt / 1e9;
    const double base = sgemm_gflops(N, m->d_ff, m->d_model, threads);
    printf("%-11s %7d %8.3g %8.3g %6d %6d %9.2f %9.2f %9.2f %10.0f %8.2f %8.2f %7.3f %7.2f %10.3f "
           "%12.2f  %.4g\n",
           bc->name, threads, (double)numel, active, N, bc->steps, mean * 1e3, best * 1e3,
           cpu * 1e3, tps, gf, base, gf / base, *mean1 / mean, gf * mean / best / base,
           *best1 / best, loss.loss);
    rc = isfinite(loss.loss) ? 0 : 1;
out:
    free(x), free(t), free(mom);
    kiln_tsmoe_free(net);
    return rc;
}

/* Whether a model is wanted: no arguments, or one that starts its name. */
static int wanted(const char *name, int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strncmp(name, argv[i], strlen(argv[i]))) return 1;
    return argc < 2;
}

int main(int argc, char **argv) {
    openblas_set_num_threads(1);
    const int threads[] = {1, 2};
    /* F, O, D, L, H, Fh, E, K, S, W, eps */
    const bench_case cases[] = {
        /* The trainer's defaults (kiln train with no --set): the model of make demo. */
        {"tiny", {0}, 16, 300},
        {"d128 moe", {8, 2, 128, 4, 4, 512, 8, 2, 64, 64, 1e-5f}, 16, 20},
        {"d128 dense", {8, 2, 128, 4, 4, 512, 0, 0, 64, 64, 1e-5f}, 16, 20},
    };
    bench_case c0 = cases[0];
    kiln_train_config def;
    kiln_train_config_default(&def);
    c0.cfg = def.model;
    c0.batch = def.batch_size;
    /* The dataset sets these in a run; the demo's market data has 8 features, 2 targets. */
    c0.cfg.n_features = 8;
    c0.cfg.n_outputs = 2;
    const char *steps = getenv("KILN_BENCH_STEPS"), *only = getenv("KILN_BENCH_THREADS");
    int rc = 0;
    printf("# kiln_gemm (kernel %s; one fmaf chain per output, the same bits on every CPU) "
           "against OpenBLAS sgemm on as many threads, C[M,N] = A[M,K] B[K,N], best of 10.\n",
           kiln_gemm_isa_name(kiln_gemm_isa_used()));
    printf("%-11s %-10s %6s %6s %6s %7s %10s %10s %7s\n", "model", "product", "M", "N", "K",
           "threads", "kiln_GF/s", "sgemm_GF/s", "ratio");
    for (size_t i = 0; !only && !steps && i < sizeof cases / sizeof *cases; i++) {
        bench_case bc = i ? cases[i] : c0;
        if (wanted(bc.name, argc, argv) && strcmp(bc.name, "d128 dense"))
            gemm_rows(bc.name, &bc.cfg, bc.batch);
    }
    printf("\n");
    printf("# kiln CPU training step (zero grads, forward + loss, backward, AdamW) on `threads`\n"
           "# threads, against OpenBLAS sgemm on as many threads at [tokens x d_model] x "
           "[d_model x d_ff] in the same run.\n"
           "# GFLOP/s = tokens/s x kiln_tsmoe_flops_per_token (6 x active weights + 12 L D "
           "mean window).\n");
    printf("%-11s %7s %8s %8s %6s %6s %9s %9s %9s %10s %8s %8s %7s %7s %10s %12s  %s\n", "model",
           "threads", "params", "active", "tokens", "steps", "mean_ms", "best_ms", "cpu_ms",
           "tokens/s", "GFLOP/s", "sgemm", "ratio", "speedup", "best_ratio", "best_speedup",
           "loss");

    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bench_case bc = i ? cases[i] : c0;
        if (!wanted(bc.name, argc, argv)) continue;
        if (steps && atoi(steps) > 0) bc.steps = atoi(steps);
        double mean1 = NAN, best1 = NAN;
        for (size_t j = 0; j < sizeof threads / sizeof *threads; j++)
            if (!only || atoi(only) == threads[j]) rc |= run(&bc, threads[j], &mean1, &best1);
    }
    return rc;
}

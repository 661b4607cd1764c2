/*
 * bench_metrics_log.c - what the trainer's metrics logging costs a step: kiln_run_metrics_step
 * (runs/metrics.c) as the trainer calls it after every step, with a model of 4 layers of 8
 * experts and 40 tensors (a steps row, 4 layers rows, 40 tensors rows, one transaction),
 * validation every 100 steps. Usage:
 *   bench_metrics_log time DIR [STEPS]   STEPS steps (default 20000) into a new
 *                                        DIR/metrics.db, three times; each round's mean,
 *                                        median and p99 of the per-step times and the CPU
 *                                        time a step (user + system), in microseconds
 *   bench_metrics_log summarize DB       bring DB's step_sums up to its steps table, as
 *                                        the trainer does after each step: for a metrics.db
 *                                        written by other means (tests/e2e/gen-run.sh)
 * Results on stdout.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "runs.h"

#define L 4
#define E 8
#define T 40

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

/* The process's user + system CPU time (a shared machine's waits do not count). */
static double cpu_us(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One round: steps steps into path (removed first); per-step times into us. */
static kiln_err round_once(const char *path, long steps, double *us) {
    char wal[4200], shm[4200];
    snprintf(wal, sizeof wal, "%s-wal", path);
    snprintf(shm, sizeof shm, "%s-shm", path);
    unlink(path), unlink(wal), unlink(shm);
    kiln_run_metrics *mx = NULL;
    KILN_TRY(kiln_run_metrics_open(path, false, &mx));
    float ae[L], re[L], load[L * E], of[L], rms[L];
    char names[T][48];
    kiln_run_metrics_tensor ts[T];
    for (int t = 0; t < T; t++) {
        snprintf(names[t], sizeof names[t], "blocks.%d.tensor%d.weight", t / 10, t % 10);
        ts[t].name = names[t];
    }
    kiln_tsmoe_stats st = {.n_layers = L,
                           .n_experts = E,
                           .attn_entropy = ae,
                           .router_entropy = re,
                           .expert_load = load,
                           .overflow = of,
                           .act_rms = rms};
    kiln_err rc = KILN_OK;
    unsigned r = 1;
    for (long s = 1; s <= steps && !rc; s++) {
        double u = (double)((r = r * 1103515245u + 12345u) >> 8 & 0xffff) / 65536.0;
        for (int l = 0; l < L; l++) {
            ae[l] = (float)(2 - u), re[l] = (float)(1.3 + 0.1 * u), of[l] = (float)(0.01 * u);
            rms[l] = (float)(1 + u);
            for (int e = 0; e < E; e++)
                load[l * E + e] = (float)(1.0 / E + (e == l ? 0.05 * u : -0.05 * u / (E - 1)));
        }
        for (int t = 0; t < T; t++)
            ts[t].grad_norm = 0.1 * (t + 1) * (1 + u), ts[t].update_ratio = 1e-4 * (1 + u);
        kiln_train_progress p = {.step = s,
                                 .steps = steps,
                                 .first_step = 1,
                                 .loss = 2 * exp(-6.0 * s / steps) + 0.02 * u,
                                 .mse = 0.5 * u,
                                 .load_balance = 0.01,
                                 .z = 0.001,
                                 .lr = 1e-3,
                                 .grad_norm = u,
                                 .applied = true,
                                 .tokens_per_s = 1e5,
                                 .stats = &st,
                                 .has_val = s % 100 == 0,
                                 .val_loss = 1 + u,
                                 .val_r2 = 0.5};
        double t0 = now_us();
        rc = kiln_run_metrics_step(mx, &p, ts, T);
        us[s - 1] = now_us() - t0;
    }
    kiln_run_metrics_close(mx);
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "summarize")) {
        kiln_run_metrics *mx = NULL;
        kiln_err rc = kiln_run_metrics_open(argv[2], false, &mx);
        if (!rc) rc = kiln_run_metrics_summarize(mx);
        kiln_run_metrics_close(mx);
        if (rc) fprintf(stderr, "bench_metrics_log: %s\n", kiln_errmsg());
        return rc ? 2 : 0;
    }
    if (argc < 3 || strcmp(argv[1], "time")) {
        fprintf(stderr, "usage: bench_metrics_log time DIR [STEPS] | summarize DB\n");
        return 2;
    }
    long steps = argc > 3 ? atol(argv[3]) : 20000;
    if (steps < 1) steps = 1;
    char path[4096];
    snprintf(path, sizeof path, "%s/bench-metrics-log.db", argv[2]);
    double *us = malloc((size_t)steps * sizeof *us);
    if (!us) return 2;
    printf(
        "kiln_run_metrics_step: %ld steps of %d layers x %d experts, %d tensors, validation every "
        "100 steps\n",
        steps, L, E, T);
    for (int k = 0; k < 3; k++) {
        double c0 = cpu_us();
        kiln_err rc = round_once(path, steps, us);
        double cpu = (cpu_us() - c0) / (double)steps;
        if (rc) {
            fprintf(stderr, "bench_metrics_log: %s\n", kiln_errmsg());
            free(us);
            return 2;
        }
        double sum = 0;
        for (long s = 0; s < steps; s++)
            sum += us[s];
        qsort(us, (size_t)steps, sizeof *us, cmp_double);
        printf("  round %d: mean %.1f us a step, median %.1f us, p99 %.1f us; CPU %.1f us a step\n",
               k + 1, sum / steps, us[steps / 2], us[steps * 99 / 100], cpu);
    }
    free(us);
    return 0;
}

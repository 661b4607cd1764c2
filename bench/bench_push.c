/*
 * bench_push.c - the C side of bench/bench_python.py: kiln_stream_push and kiln_model_forward
 * on a model directory and a dataset's rows, through include/kiln.h only (what the Python
 * bindings call), so that the Python figures have their C floor measured on the same model,
 * rows and machine.
 *
 * Usage: bench_push MODEL DATA ROUNDS
 * Prints "push_ns P50" (the median over ROUNDS of the mean time of one push over every row of
 * DATA, one stream from its first row each round) and "forward_ms P50" (the median over
 * ROUNDS of one kiln_model_forward over every row as one sequence, as kiln infer runs it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kiln.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int fail(const char *what) {
    fprintf(stderr, "bench_push: %s: %s\n", what, kiln_errmsg());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 4 || atoi(argv[3]) < 1) {
        fprintf(stderr, "usage: bench_push MODEL DATA ROUNDS\n");
        return 2;
    }
    const int rounds = atoi(argv[3]);
    kiln_model *m = NULL;
    kiln_data *d = NULL;
    if (kiln_model_open(argv[1], &m)) return fail(argv[1]);
    if (kiln_data_open(argv[2], &d)) return fail(argv[2]);
    size_t rows;
    int F;
    kiln_data_shape(d, &rows, &F, NULL);
    const kiln_model_config *c = kiln_model_config_get(m);
    if (F != c->n_features) {
        fprintf(stderr, "bench_push: '%s' has %d features, the model takes %d\n", argv[2], F,
                c->n_features);
        return 2;
    }
    const float *x = kiln_data_features(d);
    float *y = malloc(rows * (size_t)c->n_outputs * sizeof *y);
    double *push = malloc((size_t)rounds * sizeof *push), *fwd = malloc((size_t)rounds * sizeof *fwd);
    if (!y || !push || !fwd) return 2;
    for (int r = 0; r < rounds; r++) {
        kiln_stream *s;
        if (kiln_stream_open(m, &s)) return fail("stream");
        double t0 = now_s();
        for (size_t t = 0; t < rows; t++)
            if (kiln_stream_push(s, x + t * (size_t)F, y)) return fail("push");
        push[r] = (now_s() - t0) / (double)rows * 1e9;
        kiln_stream_free(s);
        t0 = now_s();
        if (kiln_model_forward(m, x, 1, (int)rows, y)) return fail("forward");
        fwd[r] = (now_s() - t0) * 1e3;
    }
    qsort(push, (size_t)rounds, sizeof *push, cmp_double);
    qsort(fwd, (size_t)rounds, sizeof *fwd, cmp_double);
    printf("push_ns %.1f\nforward_ms %.3f\n", push[rounds / 2], fwd[rounds / 2]);
    free(y);
    free(push);
    free(fwd);
    kiln_data_free(d);
    kiln_model_free(m);
    return 0;
}

/*
 * bench_push.c - the C side of bench/bench_python.py: kiln_stream_push and kiln_model_forward
 * on a model directory and a dataset's rows, through include/kiln.h only (what the Python
 * bindings call), so that the Python figures have their C floor measured on the same model,
 * rows and machine.
 *
 * Usage: bench_push MODEL DATA ROUNDS
 * Prints "push_ns NS": one push's mean time over the fastest CHUNK consecutive pushes of ROUNDS
 * passes over every row of DATA (one stream from its first row each pass): on a shared machine
 * the least disturbed stretch is the closest to the push's own cost, and bench_python.py times
 * Stream.push the same way. And "forward_ms MS": the fastest of ROUNDS kiln_model_forward calls
 * over every row as one sequence, as kiln infer runs it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kiln.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define CHUNK 1000

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
    if (!y) return 2;
    double push = INFINITY, fwd = INFINITY;
    for (int r = 0; r < rounds; r++) {
        kiln_stream *s;
        if (kiln_stream_open(m, &s)) return fail("stream");
        for (size_t t = 0; t + CHUNK <= rows; t += CHUNK) {
            double t0 = now_s();
            for (size_t i = t; i < t + CHUNK; i++)
                if (kiln_stream_push(s, x + i * (size_t)F, y)) return fail("push");
            double ns = (now_s() - t0) / CHUNK * 1e9;
            if (ns < push) push = ns;
        }
        kiln_stream_free(s);
        double t0 = now_s();
        if (kiln_model_forward(m, x, 1, (int)rows, y)) return fail("forward");
        if ((now_s() - t0) * 1e3 < fwd) fwd = (now_s() - t0) * 1e3;
    }
    printf("push_ns %.1f\nforward_ms %.3f\n", push, fwd);
    free(y);
    kiln_data_free(d);
    kiln_model_free(m);
    return 0;
}

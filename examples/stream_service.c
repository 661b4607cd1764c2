/*
 * stream_service.c - the smallest useful streaming service on libkiln.
 *
 *   stream_service MODEL [INSTRUMENTS] < ticks.csv > predictions.csv
 *
 * Loads a model (a model directory or its model.safetensors), reads one tick per line
 * on stdin (n_features comma-separated numbers), and writes that tick's prediction
 * (n_outputs comma-separated numbers) on stdout. At exit it prints the latency of the
 * push (p50, p99, max, in microseconds) on stderr.
 *
 * A real service opens one kiln_stream per instrument on one shared kiln_model; each
 * stream belongs to one thread at a time. With INSTRUMENTS = k (default 1) this one opens
 * k streams, a line holds the k instruments' features one after the other (k * n_features
 * numbers) and its prediction the k instruments' outputs; the k ticks go through one
 * kiln_stream_push_many call, which reads the weights once for all k and gives each
 * instrument exactly what kiln_stream_push would. Only include/kiln.h is used.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln.h"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Parse exactly n comma-separated numbers; 0 on success. */
static int parse_tick(char *line, float *out, int n) {
    char *p = line, *end;
    for (int i = 0; i < n; i++) {
        errno = 0;
        out[i] = strtof(p, &end);
        if (end == p || errno) return -1;
        p = end;
        if (i < n - 1 && *p++ != ',') return -1;
    }
    while (*p == ' ' || *p == '\r' || *p == '\n')
        p++;
    return *p ? -1 : 0;
}

int main(int argc, char **argv) {
    int k = argc == 3 ? atoi(argv[2]) : 1; /* instruments */
    if (argc < 2 || argc > 3 || k < 1 || k > 4096) {
        fprintf(stderr, "usage: %s MODEL [INSTRUMENTS] < ticks.csv > predictions.csv\n", argv[0]);
        return 2;
    }
    kiln_model *model;
    if (kiln_model_open(argv[1], &model) != KILN_OK) {
        fprintf(stderr, "error: %s\n", kiln_errmsg());
        return 2;
    }
    kiln_stream **streams = calloc((size_t)k, sizeof *streams); /* one per instrument */
    for (int i = 0; i < k; i++)
        if (!streams || kiln_stream_open(model, &streams[i]) != KILN_OK) {
            fprintf(stderr, "error: %s\n", streams ? kiln_errmsg() : "out of memory");
            for (int j = 0; streams && j < i; j++)
                kiln_stream_free(streams[j]);
            free(streams);
            kiln_model_free(model);
            return 2;
        }
    const kiln_model_config *cfg = kiln_model_config_get(model);
    const int nf = k * cfg->n_features, no = k * cfg->n_outputs; /* numbers in, out per line */
    float *features = calloc((size_t)nf, sizeof *features);
    float *outputs = calloc((size_t)no, sizeof *outputs);
    size_t n = 0, cap = 4096;
    double *lat = malloc(cap * sizeof *lat); /* per-tick push latency, microseconds */
    char *line = NULL;
    size_t len = 0;
    long lineno = 0;
    int rc = 0;
    if (!features || !outputs || !lat) {
        fprintf(stderr, "error: out of memory\n");
        rc = 2;
        goto done;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* a prediction leaves as soon as it is made */

    while (getline(&line, &len, stdin) > 0) {
        lineno++;
        if (parse_tick(line, features, nf)) {
            fprintf(stderr, "line %ld: expected %d comma-separated numbers; skipped\n", lineno, nf);
            continue;
        }
        double t0 = now_us();
        kiln_err err = kiln_stream_push_many(streams, (size_t)k, features, outputs);
        double dt = now_us() - t0;
        if (err != KILN_OK) { /* a refused tick leaves every stream as it was */
            fprintf(stderr, "line %ld: %s; skipped\n", lineno, kiln_errmsg());
            continue;
        }
        if (n == cap) {
            double *grown = realloc(lat, 2 * cap * sizeof *lat);
            if (!grown) {
                fprintf(stderr, "error: out of memory\n");
                rc = 2;
                break;
            }
            lat = grown;
            cap *= 2;
        }
        lat[n++] = dt;
        for (int o = 0; o < no; o++)
            printf(o ? ",%.9g" : "%.9g", outputs[o]);
        putchar('\n');
    }
    if (n) {
        qsort(lat, n, sizeof *lat, cmp_double);
        fprintf(stderr, "ticks %zu  push latency (us): p50 %.2f  p99 %.2f  max %.2f\n", n,
                lat[n / 2], lat[(size_t)(0.99 * (double)(n - 1))], lat[n - 1]);
    }
done:
    free(line);
    free(lat);
    free(features);
    free(outputs);
    for (int i = 0; i < k; i++)
        kiln_stream_free(streams[i]);
    free(streams);
    kiln_model_free(model);
    return rc;
}

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
 *
 *   stream_service --watch NAME@CHANNEL --registry URL [--registry MIRROR]... --trust FILE
 *                  --state DIR --dir DIR [--metrics FILE.prom] [INSTRUMENTS] < ticks.csv >
 * predictions.csv
 *
 * follows a registry channel instead (kiln_watch): the channel's model is pulled, verified and
 * loaded before the first tick; each new version promoted while the service runs is swapped
 * in between two ticks (the streams reopened on it); what the watch hears goes to stderr. A
 * restart reuses the model kept in --dir, and starts with it when no registry answers.
 * --metrics FILE.prom: the watch rewrites it after every poll (kiln_watch_metrics: the
 * version in service, its record's expiry, polls and failures) for node_exporter's textfile
 * collector.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdbool.h>
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

/* What the watch hears, one line on stderr. */
static void on_update(void *ctx, kiln_err rc, const char *message, const kiln_pull_result *r) {
    (void)ctx;
    if (r)
        fprintf(stderr, "watch: now serving %s@%s (%s seq %lld)\n", r->model, r->version,
                r->channel, (long long)r->seq);
    else
        fprintf(stderr, "watch: %s%s\n", rc ? "" : "note: ", message);
}

static void streams_free(kiln_stream **streams, int k) {
    for (int i = 0; streams && i < k; i++)
        kiln_stream_free(streams[i]);
    free(streams);
}

/* k new streams on m (one per instrument), or NULL (said on stderr). */
static kiln_stream **streams_open(const kiln_model *m, int k) {
    kiln_stream **streams = calloc((size_t)k, sizeof *streams);
    for (int i = 0; streams && i < k; i++)
        if (kiln_stream_open(m, &streams[i]) != KILN_OK) {
            fprintf(stderr, "error: %s\n", kiln_errmsg());
            streams_free(streams, k);
            return NULL;
        }
    if (!streams) fprintf(stderr, "error: out of memory\n");
    return streams;
}

#define MAX_REGISTRIES 8

static int usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s MODEL [INSTRUMENTS] < ticks.csv > predictions.csv\n"
            "       %s --watch NAME@CHANNEL --registry URL [--registry URL]... --trust FILE "
            "--state DIR --dir DIR [--metrics FILE.prom] [INSTRUMENTS] < ticks.csv > "
            "predictions.csv\n",
            argv0, argv0);
    return 2;
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *urls[MAX_REGISTRIES];
    kiln_watch_opts wo = {.interval_ms = 1000, .on_update = on_update};
    size_t nurls = 0;
    int k = 1, npos = 0; /* instruments */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strncmp(a, "--", 2) && !v) return usage(argv[0]);
        if (!strcmp(a, "--watch"))
            wo.pull.ref = argv[++i];
        else if (!strcmp(a, "--registry") && nurls < MAX_REGISTRIES)
            urls[nurls++] = argv[++i];
        else if (!strcmp(a, "--trust"))
            wo.pull.trust = argv[++i];
        else if (!strcmp(a, "--state"))
            wo.pull.state = argv[++i];
        else if (!strcmp(a, "--dir"))
            wo.pull.out = argv[++i];
        else if (!strcmp(a, "--metrics"))
            wo.metrics_file = argv[++i];
        else if (!strncmp(a, "--", 2))
            return usage(argv[0]);
        else if (npos++ == 0 && !wo.pull.ref)
            model_path = a;
        else
            k = atoi(a);
    }
    if (k < 1 || k > 4096 || (!model_path) == (!wo.pull.ref) ||
        (wo.pull.ref && (!nurls || !wo.pull.trust || !wo.pull.out)))
        return usage(argv[0]);
    kiln_model *model = NULL; /* MODEL: ours; --watch: the watch's, held */
    const kiln_model *serving;
    kiln_watch *watch = NULL;
    uint64_t gen = 0, misfit = 0;
    if (wo.pull.ref) {
        wo.pull.registries = urls;
        wo.pull.nregistries = nurls;
        if (kiln_watch_start(&wo, &watch) != KILN_OK) {
            fprintf(stderr, "error: %s\n", kiln_errmsg());
            return 2;
        }
        serving = kiln_watch_acquire(watch, &gen);
        kiln_pull_result what;
        if (kiln_watch_serving(watch, gen, &what) == KILN_OK)
            fprintf(stderr, "watch: serving %s@%s (%s seq %lld)\n", what.model, what.version,
                    what.channel, (long long)what.seq);
    } else {
        if (kiln_model_open(model_path, &model) != KILN_OK) {
            fprintf(stderr, "error: %s\n", kiln_errmsg());
            return 2;
        }
        serving = model;
    }
    kiln_stream **streams = streams_open(serving, k);
    if (!streams) {
        if (watch) kiln_watch_release(watch, serving);
        kiln_watch_stop(watch);
        kiln_model_free(model);
        return 2;
    }
    const kiln_model_config *cfg = kiln_model_config_get(serving);
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
        if (watch) { /* a new version: swapped in between two ticks */
            uint64_t g;
            const kiln_model *m = kiln_watch_acquire(watch, &g);
            const kiln_model_config *c = kiln_model_config_get(m);
            bool fits = c->n_features * k == nf && c->n_outputs * k == no;
            if (g != gen && !fits && g != misfit) {
                fprintf(stderr,
                        "watch: the new model reads %d features and writes %d outputs, "
                        "not this service's %d and %d; the old one stays\n",
                        c->n_features, c->n_outputs, nf / k, no / k);
                misfit = g;
            }
            kiln_stream **fresh = g != gen && fits ? streams_open(m, k) : NULL;
            if (fresh) {
                streams_free(streams, k);
                streams = fresh;
                kiln_watch_release(watch, serving);
                serving = m;
                gen = g;
            } else {
                kiln_watch_release(watch, m);
            }
        }
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
    streams_free(streams, k);
    if (watch) kiln_watch_release(watch, serving);
    kiln_watch_stop(watch);
    kiln_model_free(model);
    return rc;
}

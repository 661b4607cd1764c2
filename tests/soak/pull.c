/*
 * pull.c - the registry soak's client (tests/soak/registry.sh drives it; docs/soak.md).
 *
 *   soak_pull URL TRUST WORKDIR THREADS
 *
 * What a long-lived service does with a registry, in one process the script samples (resident
 * memory, fds): THREADS threads pulling with kiln_pull, and a kiln_watch following
 * soak@staging whose every swap is checked, while the main thread acquires the model in
 * service each round, streams on it, and holds it until the next round ends (so swaps retire
 * models that are still held).
 * WORKDIR/pub/VERSION is the model directory published as soak@VERSION (the script links it
 * once the publish succeeded). Commands on stdin, one per line, each answered by one line on
 * stdout:
 *
 *   round N  each thread pulls N times (one in four a version picked at random from
 *            WORKDIR/pub, the rest soak@staging), opens the pulled model and requires its
 *            predictions on a fixed input to be bitwise those of WORKDIR/pub/VERSION;
 *            answers "ok PULLS FAILURES RSS_KB FDS SWAPS" once every thread is idle (FDS:
 *            the fewest of ten readings 5 ms apart, so a watcher poll in flight is not
 *            counted)
 *   quit     prints the summary ("== summary", pull latency percentiles, swaps) and exits 0,
 *            or 1 if anything failed
 *
 * Each thread pulls into WORKDIR/pull/tN with its own anti-rollback state WORKDIR/state/tN.
 */
#include <dirent.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "kiln.h"
#include "soak_util.h"

#define MAX_THREADS 64
#define LAT_MAX (1u << 20) /* pull latencies kept, in microseconds */
#define IN_ROWS 24         /* the prediction check: [2, IN_ROWS, F] */

static const char *url, *trust, *work;
static int n_threads, per_round;
static atomic_int stop;
static atomic_long pulls, version_pulls, failures, swaps;
static pthread_barrier_t go, done;
static pthread_mutex_t err_mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t *lat; /* [LAT_MAX] */
static atomic_uint n_lat;

static void fail(const char *fmt, ...) KILN_PRINTF(1, 2);
static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&err_mu);
    fprintf(stderr, "FAIL: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    pthread_mutex_unlock(&err_mu);
    va_end(ap);
    atomic_fetch_add(&failures, 1);
}

/* m's predictions on the fixed input: a new [2*IN_ROWS*O] array, or NULL (with the failure
 * reported). */
static float *predict(const kiln_model *m, const char *what) {
    const kiln_model_config *c = kiln_model_config_get(m);
    size_t nx = (size_t)2 * IN_ROWS * c->n_features, ny = (size_t)2 * IN_ROWS * c->n_outputs;
    float *x = kiln_malloc(nx * sizeof *x), *y = kiln_malloc(ny * sizeof *y);
    if (!x || !y) {
        fail("%s: out of memory", what);
        free(x), free(y);
        return NULL;
    }
    for (size_t i = 0; i < nx; i++)
        x[i] = (float)((double)((i * 2654435761u) % 2001) / 1000.0 - 1.0);
    if (kiln_model_forward(m, x, 2, IN_ROWS, y)) {
        fail("%s: forward: %s", what, kiln_errmsg());
        free(y);
        y = NULL;
    }
    free(x);
    return y;
}

/* The predictions of m equal those of WORKDIR/pub/version. */
static void check_model(const kiln_model *m, const char *version, const char *what) {
    char ref[1024];
    snprintf(ref, sizeof ref, "%s/pub/%s", work, version);
    kiln_model *r = NULL;
    if (kiln_model_open(ref, &r)) {
        fail("%s: the published model '%s': %s", what, ref, kiln_errmsg());
        return;
    }
    const kiln_model_config *c = kiln_model_config_get(m);
    float *a = predict(m, what), *b = predict(r, ref);
    if (a && b && memcmp(a, b, (size_t)2 * IN_ROWS * c->n_outputs * sizeof *a))
        fail("%s: predictions differ from the published %s's", what, version);
    free(a), free(b);
    kiln_model_free(r);
}

/* A published version picked at random, or "" if none yet. */
static void pick_version(uint64_t *rng, char out[128]) {
    out[0] = 0;
    char p[1024];
    snprintf(p, sizeof p, "%s/pub", work);
    DIR *d = opendir(p);
    if (!d) return;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.' && soak_rng(rng) % (uint64_t)++n == 0) /* reservoir of one */
            snprintf(out, 128, "%.127s", e->d_name);
    closedir(d);
}

typedef struct {
    int id;
    char out[1024], state[1024];
    uint64_t rng;
} puller;

static void one_pull(puller *p) {
    char ref[160], version[128] = "";
    if (soak_rng(&p->rng) % 4 == 0) pick_version(&p->rng, version);
    snprintf(ref, sizeof ref, "soak@%s", version[0] ? version : "staging");
    kiln_pull_opts o = {
        .registry = url, .ref = ref, .trust = trust, .out = p->out, .state = p->state};
    kiln_pull_result r;
    uint64_t t0 = kiln_now_ns();
    kiln_err rc = kiln_pull(&o, &r);
    uint64_t us = (kiln_now_ns() - t0) / 1000;
    atomic_fetch_add(&pulls, 1);
    if (version[0]) atomic_fetch_add(&version_pulls, 1);
    unsigned i = atomic_fetch_add(&n_lat, 1);
    if (i < LAT_MAX) lat[i] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
    char what[256];
    snprintf(what, sizeof what, "thread %d: pull %s", p->id, ref);
    if (rc) {
        fail("%s: %s", what, kiln_errmsg());
        return;
    }
    if (strcmp(r.model, "soak") || (version[0] && strcmp(r.version, version))) {
        fail("%s: got %s@%s", what, r.model, r.version);
        return;
    }
    kiln_model *m = NULL;
    if (kiln_model_open(p->out, &m)) {
        fail("%s: open: %s", what, kiln_errmsg());
        return;
    }
    check_model(m, r.version, what);
    kiln_model_free(m);
}

static void *pull_main(void *arg) {
    puller *p = arg;
    for (;;) {
        pthread_barrier_wait(&go);
        if (atomic_load(&stop)) break;
        for (int i = 0; i < per_round; i++)
            one_pull(p);
        pthread_barrier_wait(&done);
    }
    return NULL;
}

/* Called by the watcher's thread after each update: a swap is checked against what was
 * published under its version. */
static void on_update(void *ctx, kiln_err rc, const char *message, const kiln_pull_result *r) {
    kiln_watch **w = ctx;
    if (rc) {
        fail("watch: update failed: %s", message);
        return;
    }
    if (!r) return; /* a new version of the trust policy: not a swap */
    atomic_fetch_add(&swaps, 1);
    if (!*w) return; /* the first load, inside kiln_watch_start */
    const kiln_model *m = kiln_watch_acquire(*w, NULL);
    char what[160];
    snprintf(what, sizeof what, "watch: swap to %s", r->version);
    check_model(m, r->version, what);
    kiln_watch_release(*w, m);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 5 || atoi(argv[4]) < 1 || atoi(argv[4]) > MAX_THREADS) {
        fprintf(stderr, "usage: soak_pull URL TRUST WORKDIR THREADS (1-%d)\n", MAX_THREADS);
        return 2;
    }
    url = argv[1], trust = argv[2], work = argv[3], n_threads = atoi(argv[4]);
    lat = kiln_malloc(LAT_MAX * sizeof *lat);
    if (!lat) return 2;
    memset(lat, 0, LAT_MAX * sizeof *lat); /* resident now, not as pulls accumulate */
    setvbuf(stdout, NULL, _IOLBF, 0);

    char wout[1024], wstate[1024];
    snprintf(wout, sizeof wout, "%s/watch", work);
    snprintf(wstate, sizeof wstate, "%s/state/watch", work);
    kiln_watch *w = NULL;
    kiln_watch_opts wo = {.pull = {.registry = url,
                                   .ref = "soak@staging",
                                   .trust = trust,
                                   .out = wout,
                                   .state = wstate},
                          .interval_ms = 200,
                          .on_update = on_update,
                          .ctx = &w};
    if (kiln_watch_start(&wo, &w)) {
        fprintf(stderr, "soak_pull: kiln_watch_start: %s\n", kiln_errmsg());
        return 2;
    }

    puller ps[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    pthread_barrier_init(&go, NULL, (unsigned)n_threads + 1);
    pthread_barrier_init(&done, NULL, (unsigned)n_threads + 1);
    for (int i = 0; i < n_threads; i++) {
        ps[i].id = i;
        ps[i].rng = 0x5eed0000u + (uint64_t)i;
        snprintf(ps[i].out, sizeof ps[i].out, "%s/pull/t%d", work, i);
        snprintf(ps[i].state, sizeof ps[i].state, "%s/state/t%d", work, i);
        if (pthread_create(&th[i], NULL, pull_main, &ps[i])) {
            fprintf(stderr, "soak_pull: cannot start a thread\n");
            return 2;
        }
    }

    char line[128];
    long rounds = 0, held_swaps = 0;
    uint64_t ticks = 0, held_gen = 0;
    const kiln_model *held = NULL; /* the previous round's model, still in service */
    while (fgets(line, sizeof line, stdin)) {
        int n;
        if (sscanf(line, "round %d", &n) == 1 && n > 0) {
            per_round = n;
            /* The service: it acquires the model in service at each round and keeps the
             * previous round's until this one ends, so versions promoted between rounds
             * swap while the old model is held (and is freed at its release). */
            uint64_t gen;
            const kiln_model *m = kiln_watch_acquire(w, &gen);
            pthread_barrier_wait(&go);
            kiln_stream *s = NULL;
            if (kiln_stream_open(m, &s)) fail("service: stream open: %s", kiln_errmsg());
            const kiln_model_config *c = kiln_model_config_get(m);
            float x[256] = {0}, y[256];
            for (int t = 0; s && t < 200 && c->n_features <= 256 && c->n_outputs <= 256; t++) {
                x[t % c->n_features] = (float)(t % 7) / 7.0f;
                if (kiln_stream_push(s, x, y)) {
                    fail("service: push: %s", kiln_errmsg());
                    break;
                }
                ticks++;
            }
            kiln_stream_free(s);
            pthread_barrier_wait(&done);
            if (held && held_gen != gen) held_swaps++;
            kiln_watch_release(w, held);
            held = m;
            held_gen = gen;
            rounds++;
            int fds = 1 << 30;
            for (int i = 0; i < 10; i++) {
                int f = soak_fd_count();
                if (f < fds) fds = f;
                usleep(5000);
            }
            printf("ok %ld %ld %ld %d %ld\n", atomic_load(&pulls), atomic_load(&failures), soak_rss_kb(),
                   fds, atomic_load(&swaps));
        } else if (!strncmp(line, "quit", 4)) {
            break;
        } else {
            fprintf(stderr, "soak_pull: unknown command '%s'\n", line);
            printf("error\n");
        }
    }
    kiln_watch_release(w, held);
    atomic_store(&stop, 1);
    pthread_barrier_wait(&go);
    for (int i = 0; i < n_threads; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
    pthread_barrier_destroy(&done);
    kiln_watch_stop(w);

    unsigned n = atomic_load(&n_lat);
    if (n > LAT_MAX) n = LAT_MAX;
    qsort(lat, n, sizeof *lat, cmp_u32);
    printf("== summary\n");
    printf("  pulls                   %ld by %d threads in %ld rounds (%ld by version, the rest "
           "soak@staging), each model's predictions bitwise the published one's\n",
           atomic_load(&pulls), n_threads, rounds, atomic_load(&version_pulls));
    if (n)
        printf("  pull_latency            p50 %.1f ms  p90 %.1f ms  p99 %.1f ms  max %.1f ms "
               "(kiln_pull, download and every check, %d at a time)\n",
               lat[n / 2] / 1e3, lat[(size_t)(0.9 * (n - 1))] / 1e3,
               lat[(size_t)(0.99 * (n - 1))] / 1e3, lat[n - 1] / 1e3, n_threads);
    printf("  watch                   %ld swaps checked (%ld while the service held the model "
           "swapped out), %llu service ticks\n",
           atomic_load(&swaps), held_swaps, (unsigned long long)ticks);
    printf("  client_failures         %ld\n", atomic_load(&failures));
    free(lat);
    return atomic_load(&failures) ? 1 : 0;
}

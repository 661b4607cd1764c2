/* bench_watch.c - what a model swap costs a service's tick path. A thread ticks one stream
 * every TICK_US the way examples/stream_service.c does (kiln_watch_acquire; on a new
 * generation, a stream opened on it and the old model released; one kiln_stream_push)
 * while the channel moves to another version. The acquire and release calls and the whole
 * tick are timed: for a second before (idle), and from then until the old generation's
 * directory has been removed, by the watcher's thread, and half a second more (swap).
 *
 * usage: bench_watch REF URL TRUST STATE_DIR OUT_DIR
 * Prints "ready" on its own line (stdout, flushed) when the idle second is over: the caller
 * then promotes another version. The figures follow on stdout. Exit 0; 2 on any failure, or
 * when no swap came within 120 s. bench/bench_registry.sh runs it (make bench-registry). */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "kiln.h"

#define TICK_US 200
#define MAX_TICKS (4u << 20)

enum { IDLE, SWAP, N_PHASES };

typedef struct sample {
    uint32_t acquire_ns, release_ns, tick_ns;
    uint8_t phase, released; /* released: this tick released a model */
} sample;

typedef struct bench {
    kiln_watch *w;
    atomic_int phase, stop;
    atomic_ullong generation; /* the generation the ticks run on */
    sample *s;
    size_t n;
    uint64_t old_release_ns; /* the release of the generation swapped out */
    int failed;
} bench;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The ticker's buffers hold 256 features and outputs. */
static bool fits(const kiln_model_config *c, bench *b) {
    if (c->n_features <= 256 && c->n_outputs <= 256) return true;
    fprintf(stderr, "bench_watch: a model of over 256 features or outputs\n");
    b->failed = 1;
    return false;
}

static void *ticker(void *arg) {
    bench *b = arg;
    uint64_t gen = 0;
    const kiln_model *serving = kiln_watch_acquire(b->w, &gen);
    kiln_stream *st = NULL;
    if (kiln_stream_open(serving, &st)) {
        fprintf(stderr, "bench_watch: %s\n", kiln_errmsg());
        b->failed = 1;
        kiln_watch_release(b->w, serving);
        return NULL;
    }
    atomic_store(&b->generation, gen);
    const kiln_model_config *c = kiln_model_config_get(serving); /* the serving model's */
    float in[256] = {0}, out[256];
    fits(c, b);
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    for (uint64_t k = 0; !b->failed && !atomic_load(&b->stop) && b->n < MAX_TICKS; k++) {
        next.tv_nsec += TICK_US * 1000;
        if (next.tv_nsec >= 1000000000) {
            next.tv_nsec -= 1000000000;
            next.tv_sec++;
        }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
        sample *s = &b->s[b->n];
        memset(s, 0, sizeof *s);
        s->phase = (uint8_t)atomic_load(&b->phase);
        uint64_t t0 = now_ns(), g;
        const kiln_model *m = kiln_watch_acquire(b->w, &g);
        uint64_t t1 = now_ns(), t2 = t1, t3;
        if (g != gen) { /* a new version: its stream, and the old model let go */
            kiln_stream *fresh = NULL;
            if (kiln_stream_open(m, &fresh)) {
                fprintf(stderr, "bench_watch: %s\n", kiln_errmsg());
                kiln_watch_release(b->w, m);
                b->failed = 1;
                break;
            }
            kiln_stream_free(st);
            st = fresh;
            t2 = now_ns();
            kiln_watch_release(b->w, serving);
            t3 = now_ns();
            b->old_release_ns = t3 - t2;
            serving = m;
            c = kiln_model_config_get(serving); /* the old one's went with it */
            if (!fits(c, b)) break;
            gen = g;
            atomic_store(&b->generation, gen);
        } else {
            kiln_watch_release(b->w, m);
            t3 = now_ns();
        }
        s->released = 1;
        s->release_ns = (uint32_t)(t3 - t2 > UINT32_MAX ? UINT32_MAX : t3 - t2);
        for (int f = 0; f < c->n_features; f++)
            in[f] = (float)((k * 7 + (uint64_t)f) % 13) * 0.1f;
        if (kiln_stream_push(st, in, out)) {
            fprintf(stderr, "bench_watch: %s\n", kiln_errmsg());
            b->failed = 1;
        }
        uint64_t t4 = now_ns();
        s->acquire_ns = (uint32_t)(t1 - t0);
        s->tick_ns = (uint32_t)(t4 - t0 > UINT32_MAX ? UINT32_MAX : t4 - t0);
        b->n++;
    }
    kiln_stream_free(st);
    kiln_watch_release(b->w, serving);
    return NULL;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* p50, p99, p99.9 and max in microseconds of one field over one phase's samples. */
static void quantiles(const bench *b, int phase, size_t field, double q[4]) {
    uint32_t *v = malloc(b->n * sizeof *v);
    size_t n = 0;
    for (size_t i = 0; v && i < b->n; i++)
        if (b->s[i].phase == phase) v[n++] = *(const uint32_t *)((const char *)&b->s[i] + field);
    for (int k = 0; k < 4; k++)
        q[k] = 0;
    if (n) {
        qsort(v, n, sizeof *v, cmp_u32);
        const double at[3] = {0.5, 0.99, 0.999};
        for (int k = 0; k < 3; k++)
            q[k] = v[(size_t)(at[k] * (double)(n - 1))] / 1e3;
        q[3] = v[n - 1] / 1e3;
    }
    free(v);
}

/* The one gen-N directory under out (its name into name), or 0 when there is not one. */
static int the_generation(const char *out, char *name, size_t len) {
    DIR *d = opendir(out);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "gen-", 4)) {
            snprintf(name, len, "%s/%s", out, e->d_name);
            n++;
        }
    closedir(d);
    return n == 1;
}

static void sleep_ms(unsigned ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: bench_watch REF URL TRUST STATE_DIR OUT_DIR\n");
        return 2;
    }
    kiln_watch_opts o = {.pull = {.ref = argv[1],
                                  .registry = argv[2],
                                  .trust = argv[3],
                                  .state = argv[4],
                                  .out = argv[5]},
                         .interval_ms = 100};
    bench b = {.s = calloc(MAX_TICKS, sizeof(sample))};
    if (!b.s) return 2;
    uint64_t t0 = now_ns();
    if (kiln_watch_start(&o, &b.w)) {
        fprintf(stderr, "bench_watch: %s\n", kiln_errmsg());
        free(b.s);
        return 2;
    }
    const double start_s = (double)(now_ns() - t0) * 1e-9;
    char old_dir[4096];
    if (!the_generation(argv[5], old_dir, sizeof old_dir)) {
        fprintf(stderr, "bench_watch: '%s' does not hold one gen-N directory\n", argv[5]);
        kiln_watch_stop(b.w);
        free(b.s);
        return 2;
    }
    pthread_t th;
    if (pthread_create(&th, NULL, ticker, &b)) {
        kiln_watch_stop(b.w);
        free(b.s);
        return 2;
    }
    sleep_ms(1000);
    const uint64_t gen0 = atomic_load(&b.generation);
    atomic_store(&b.phase, SWAP);
    printf("ready\n");
    fflush(stdout);
    const uint64_t t_ready = now_ns();
    uint64_t t_swapped = 0, t_gone = 0;
    struct stat sb;
    while (!b.failed && now_ns() - t_ready < 120000000000ull) {
        if (!t_swapped && atomic_load(&b.generation) != gen0) t_swapped = now_ns();
        if (t_swapped && stat(old_dir, &sb) && errno == ENOENT) {
            t_gone = now_ns();
            break;
        }
        sleep_ms(1);
    }
    if (t_gone) sleep_ms(500);
    atomic_store(&b.stop, 1);
    pthread_join(th, NULL);
    kiln_pull_result r;
    const int served = kiln_watch_serving(b.w, 0, &r) == KILN_OK;
    kiln_watch_stop(b.w);
    if (b.failed || !t_gone) {
        if (!b.failed)
            fprintf(stderr, "bench_watch: %s\n",
                    t_swapped ? "the old generation's directory was not removed within 120 s"
                              : "no new version was swapped in within 120 s");
        free(b.s);
        return 2;
    }
    printf("start (pull and load): %.3f s; then serving %s\n", start_s, served ? r.version : "?");
    size_t n_in[N_PHASES] = {0};
    for (size_t i = 0; i < b.n; i++)
        n_in[b.s[i].phase]++;
    double q[4];
    static const struct {
        const char *what;
        size_t field;
    } fields[] = {{"whole tick", offsetof(sample, tick_ns)},
                  {"kiln_watch_acquire", offsetof(sample, acquire_ns)},
                  {"kiln_watch_release", offsetof(sample, release_ns)}};
    printf("ticks every %d us: %zu idle (a second before the promotion), %zu from the promotion "
           "until the old generation's directory was gone and half a second more\n",
           TICK_US, n_in[IDLE], n_in[SWAP]);
    printf("%-8s %-20s %9s %9s %9s %9s\n", "phase", "us per call", "p50", "p99", "p99.9", "max");
    for (int ph = 0; ph < N_PHASES; ph++)
        for (size_t f = 0; f < sizeof fields / sizeof *fields; f++) {
            quantiles(&b, ph, fields[f].field, q);
            printf("%-8s %-20s %9.1f %9.1f %9.1f %9.1f\n", ph == IDLE ? "idle" : "swap",
                   fields[f].what, q[0], q[1], q[2], q[3]);
        }
    printf("the swapped-out model's last release: %.1f us\n", (double)b.old_release_ns / 1e3);
    printf("ready to the new version in service: %.3f s (the promotion, a poll, its pull and "
           "load); old generation's directory "
           "removed by the watcher %.3f s after the swap\n",
           (double)(t_swapped - t_ready) * 1e-9, (double)(t_gone - t_swapped) * 1e-9);
    free(b.s);
    return 0;
}

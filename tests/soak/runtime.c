/*
 * runtime.c - the runtime soak (make soak runs it through tests/soak/soak.sh; docs/soak.md).
 *
 *   soak_runtime DIR SECONDS [--no-rss]
 *
 * Three phases share SECONDS (70/15/15 %), each sampling this process's resident memory
 * (/proc/self/statm) and open file descriptors (/proc/self/fd) as it goes:
 *
 *   streams  five streams (four on a tiny f32 MoE model, one on its bf16 twin) pushed round
 *            robin for the whole phase, never reset: millions of ticks each. Every few
 *            thousand ticks a stream's last 2*L*(W-1)+1 inputs go through the batch forward
 *            and the last L*(W-1)+1 rows (those that depend on the window alone, docs/model.md)
 *            must match what the stream gave at those ticks within the validation gate's
 *            stream tolerance (stream.rtol, stream.atol), except where a router near-tie
 *            reaches (ties.rtol; docs/validation.md "Router ties"): such a check is printed
 *            and counted, not failed. Every push is timed.
 *   cycles   stream open, n ticks, batch check, reset, the same n ticks (bitwise what the
 *            fresh stream gave), free, thousands of times.
 *   reopen   model open (a file, a directory, f32, bf16), a stream and a batch forward that
 *            must give bitwise what the first open gave, free; and a truncated model file
 *            that must be refused; thousands of times.
 *
 * Failures: a parity miss, an API error, the fd count differing from the phase's start, and
 * (unless --no-rss, for sanitizer builds whose quarantine grows on purpose) resident memory
 * above the warm-up's maximum plus RSS_SLACK_KB after warm-up (the first fifth of a phase).
 * Prints a line per sample, then "== summary" and key/value lines; exits 1 on any failure,
 * 2 on usage or setup errors. Seeded (SOAK_SEED, default 1): the same seed pushes the same
 * ticks and checks at the same ticks.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime.h"
#include "runtime_int.h"
#include "train.h"
#include "validate.h"
#include "soak_util.h"

/* Allowed resident growth after warm-up. Nothing in a stream's or a model's life should keep
 * memory, and in the runs so far none did (flat to the kB, docs/soak.md); the slack is room
 * for glibc, whose trimming and mmap threshold decide whether the batch forward's workspace
 * (~100 kB) and a model's blocks (~150 kB) come back to the kernel when freed. At the soak's
 * rates a leak of 8 bytes per push crosses it in about a second, one of 100 bytes per stream
 * cycle or model open within 10 to 25 s. */
#define RSS_SLACK_KB 1024L
#define TABLE_ROWS 65536 /* input rows, a power of two (streams walk it with odd steps) */
#define LAT_NS 10        /* latency histogram bucket width */
#define LAT_N 50000      /* buckets: 10 ns .. 500 us; slower pushes land in the last */
#define N_STREAMS 5

static int failures;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        printf("FAIL: " __VA_ARGS__);                                                              \
        printf("\n");                                                                              \
        fflush(stdout);                                                                            \
        failures++;                                                                                \
    } while (0)

/* ---- small helpers ---- */

static uint64_t rng_state;
static uint64_t rng(void) {
    return soak_rng(&rng_state);
}

static double secs(uint64_t ns) {
    return (double)ns / 1e9;
}

typedef struct {
    uint64_t *c, n, max;
} hist;

static void hist_clear(hist *h) {
    memset(h->c, 0, LAT_N * sizeof *h->c);
    h->n = h->max = 0;
}
/* Every page written now: a calloc'd histogram would otherwise fault its pages in as the
 * latencies reach new buckets, which is resident growth of the soak's own making. */
static void hist_init(hist *h) {
    h->c = kiln_malloc(LAT_N * sizeof *h->c);
    if (!h->c) {
        fprintf(stderr, "soak_runtime: out of memory\n");
        exit(2);
    }
    hist_clear(h);
}
static inline void hist_add(hist *h, uint64_t ns) {
    uint64_t b = ns / LAT_NS;
    h->c[b < LAT_N ? b : LAT_N - 1]++;
    h->n++;
    if (ns > h->max) h->max = ns;
}
/* The q-quantile in microseconds: the upper edge of its bucket (the max past the last). */
static double hist_q(const hist *h, double q) {
    if (!h->n) return 0;
    uint64_t want = (uint64_t)ceil(q * (double)h->n), seen = 0;
    if (!want) want = 1;
    for (size_t b = 0; b < LAT_N; b++) {
        seen += h->c[b];
        if (seen >= want)
            return b == LAT_N - 1 ? (double)h->max / 1e3 : (double)(b + 1) * LAT_NS / 1e3;
    }
    return (double)h->max / 1e3;
}

/* ---- sampling: resident memory and fds against the phase's warm-up ---- */

typedef struct {
    const char *phase;
    uint64_t t0, warm_until, every, next;
    bool check_rss;
    int fd_base;
    long rss_start, rss_warm_max, rss_max, rss_last;
    int samples;
} monitor;

static void mon_start(monitor *m, const char *phase, uint64_t now, double dur, bool check_rss) {
    memset(m, 0, sizeof *m);
    m->phase = phase;
    m->t0 = now;
    m->warm_until = now + (uint64_t)(dur * 0.2 * 1e9);
    double every = fmin(5.0, fmax(0.5, dur / 20));
    m->every = (uint64_t)(every * 1e9);
    m->next = now + m->every;
    m->check_rss = check_rss;
    m->fd_base = soak_fd_count();
    m->rss_start = m->rss_warm_max = m->rss_max = m->rss_last = soak_rss_kb();
}

/* One sample: prints "phase t=... rss=... fds=... <extra>" and checks it. */
static void mon_sample(monitor *m, uint64_t now, const char *extra) {
    long rss = soak_rss_kb();
    int fds = soak_fd_count();
    bool warm = now < m->warm_until;
    m->samples++;
    m->rss_last = rss;
    if (warm && rss > m->rss_warm_max) m->rss_warm_max = rss;
    if (!warm && rss > m->rss_max) m->rss_max = rss;
    const char *verdict = "ok";
    if (fds != m->fd_base)
        verdict = "FAIL fds";
    else if (!warm && m->check_rss && rss > m->rss_warm_max + RSS_SLACK_KB)
        verdict = "FAIL rss";
    printf("%-7s t=%7.1fs %s rss=%ldkB (%+ld) fds=%d%s %s\n", m->phase, secs(now - m->t0), extra,
           rss, rss - m->rss_warm_max, fds, warm ? " warm-up" : "", verdict);
    fflush(stdout);
    if (fds != m->fd_base)
        FAIL("%s: %d open fds, %d at the phase's start", m->phase, fds, m->fd_base);
    else if (strcmp(verdict, "ok"))
        FAIL("%s: resident %ld kB, more than the warm-up's %ld kB + %ld kB slack", m->phase, rss,
             m->rss_warm_max, RSS_SLACK_KB);
    m->next = now + m->every;
}

static void mon_summary(const monitor *m) {
    printf("  %s_rss_kb            start %ld, warm-up max %ld, max after %ld, last %ld (growth "
           "%+ld, slack %ld%s)\n",
           m->phase, m->rss_start, m->rss_warm_max, m->rss_max, m->rss_last,
           m->rss_max - m->rss_warm_max, RSS_SLACK_KB, m->check_rss ? "" : ", not checked");
    printf("  %s_fds               %d throughout (%d samples)\n", m->phase, m->fd_base, m->samples);
}

/* ---- the models and inputs ---- */

static float *table; /* [TABLE_ROWS, F] */

typedef struct {
    const char *name;
    kiln_model *m;
    int F, O, warm, N; /* warm = L*(W-1): rows before a window's exact ones; N = 2*warm+1 */
    void *ws;
    size_t ws_size;
    float *x, *y; /* [N,F], [N,O] scratch for checks */
    float *y2, *mg;  /* [4N,O], [4N,L]: a check's second forward, with router margins */
    uint8_t *reach;  /* [4N] rows a router near-tie reaches */
    int L;
    hist all, first, last, recent;
} model_ctx;

static kiln_thresholds thr;
static double worst_rel, worst_abs;
static uint64_t checks;
/* Checks that differed only where a router near-tie reaches (docs/validation.md, "Router
 * ties"), the outputs excused, and the smallest margin among the near-ties found there. */
static uint64_t tie_checks, tie_outputs;
static double tie_min_margin = INFINITY;

static void die(const char *what) {
    fprintf(stderr, "soak_runtime: %s: %s\n", what, kiln_errmsg());
    exit(2);
}

static void model_ctx_init(model_ctx *c, const char *name, const char *path) {
    memset(c, 0, sizeof *c);
    c->name = name;
    if (kiln_model_open(path, &c->m)) die(path);
    const kiln_model_config *k = kiln_model_config_get(c->m);
    c->F = k->n_features;
    c->O = k->n_outputs;
    c->warm = k->n_layers * (k->attn_window - 1);
    c->N = 2 * c->warm + 1;
    c->ws_size = kiln_model_workspace_size(c->m, 1, 4 * c->N);
    c->ws = kiln_malloc(c->ws_size);
    c->x = kiln_malloc((size_t)4 * c->N * c->F * sizeof *c->x);
    c->y = kiln_malloc((size_t)4 * c->N * c->O * sizeof *c->y);
    c->L = k->n_layers;
    c->y2 = kiln_malloc((size_t)4 * c->N * c->O * sizeof *c->y2);
    c->mg = kiln_malloc((size_t)4 * c->N * c->L * sizeof *c->mg);
    c->reach = kiln_malloc((size_t)4 * c->N);
    if (!c->ws || !c->x || !c->y || !c->y2 || !c->mg || !c->reach) die("allocating");
    hist_init(&c->all);
    hist_init(&c->first);
    hist_init(&c->last);
    hist_init(&c->recent);
}

static void model_ctx_release(model_ctx *c) {
    free(c->ws), free(c->x), free(c->y), free(c->y2), free(c->mg), free(c->reach);
    free(c->all.c), free(c->first.c), free(c->last.c), free(c->recent.c);
    kiln_model_free(c->m);
}

/* Compare stream outputs ys [rows,O] with the batch forward over x [rows,F] from row `from`;
 * alternate between the allocating and the caller-workspace batch forward. */
static void check_rows(model_ctx *c, const char *what, const float *x, const float *ys, int rows,
                       int from) {
    kiln_err rc = checks & 1 ? kiln_model_forward(c->m, x, 1, rows, c->y)
                             : kiln_model_forward_ws(c->m, x, 1, rows, c->y, c->ws, c->ws_size);
    checks++;
    if (rc) {
        FAIL("%s: %s: batch forward: %s", c->name, what, kiln_errmsg());
        return;
    }
    kiln_compare cmp;
    size_t off = (size_t)from * c->O, n = (size_t)(rows - from) * c->O;
    kiln_compare_f32(ys + off, c->y + off, n, &thr.stream, &cmp);
    if (!cmp.passed && !cmp.nonfinite) {
        /* A router near-tie? The batch forward again, with each row's router margins (the
         * same outputs, bitwise), and the difference excused only where a near-tie reaches,
         * as kiln validate's parity checks do. */
        if (kiln_runtime_forward_margins(c->m, x, 1, rows, c->y2, c->mg)) {
            FAIL("%s: %s: batch forward with margins: %s", c->name, what, kiln_errmsg());
            return;
        }
        if (memcmp(c->y2, c->y, (size_t)rows * c->O * sizeof *c->y)) {
            FAIL("%s: %s: the batch forward with router margins gave other outputs", c->name,
                 what);
            return;
        }
        kiln_runtime_tie_reach(kiln_model_config_get(c->m), c->mg, 1, rows, thr.ties_rtol,
                               c->reach);
        kiln_compare_f32_excused(ys + off, c->y + off, n, &thr.stream, c->reach + from,
                                 (size_t)c->O, &cmp);
        if (cmp.passed) {
            double g = INFINITY;
            for (size_t i = 0; i < (size_t)rows * c->L; i++)
                if (c->mg[i] <= thr.ties_rtol && c->mg[i] < g) g = c->mg[i];
            tie_checks++;
            tie_outputs += cmp.excused;
            if (g < tie_min_margin) tie_min_margin = g;
            printf("router tie: %s: %s: %zu outputs differ only where a near-tie reaches "
                   "(smallest margin %.3g, ties.rtol %g; max relative error there %.3g): "
                   "excused\n",
                   c->name, what, cmp.excused, g, thr.ties_rtol, cmp.excused_max_rel);
            fflush(stdout);
        }
    }
    if (cmp.max_rel > worst_rel) worst_rel = cmp.max_rel;
    if (cmp.max_abs > worst_abs) worst_abs = cmp.max_abs;
    if (!cmp.passed)
        FAIL("%s: %s: stream and batch differ: max relative %.3g (stream.rtol %g), element %zu: "
             "%.9g vs %.9g",
             c->name, what, cmp.max_rel, thr.stream.rtol, cmp.worst, ys[off + cmp.worst],
             c->y[off + cmp.worst]);
}

/* The phase's excused checks: those since the counts c0, o0 at its start. */
static void print_ties(uint64_t c0, uint64_t o0) {
    printf("  router_ties_excused     %llu checks, %llu outputs (smallest margin so far %.3g; "
           "ties.rtol %g)\n",
           (unsigned long long)(tie_checks - c0), (unsigned long long)(tie_outputs - o0),
           tie_checks ? tie_min_margin : 0.0, thr.ties_rtol);
}

/* ---- phase 1: long streams ---- */

typedef struct {
    model_ctx *c;
    kiln_stream *s;
    uint64_t row, step; /* table row of the next tick, and the walk's odd step */
    uint64_t next_check;
    float *hx, *hy; /* rings of the last N inputs and outputs */
    float *cx, *cy; /* the same in time order, for a check */
} stream_ctx;

static void stream_check(stream_ctx *st) {
    model_ctx *c = st->c;
    uint64_t t = kiln_stream_ticks(st->s);
    int rows = t < (uint64_t)c->N ? (int)t : c->N;
    for (int r = 0; r < rows; r++) {
        uint64_t tick = t - (uint64_t)rows + (uint64_t)r, slot = tick % (uint64_t)c->N;
        memcpy(st->cx + (size_t)r * c->F, st->hx + slot * c->F, (size_t)c->F * sizeof(float));
        memcpy(st->cy + (size_t)r * c->O, st->hy + slot * c->O, (size_t)c->O * sizeof(float));
    }
    char what[64];
    snprintf(what, sizeof what, "tick %llu", (unsigned long long)t);
    check_rows(c, what, st->cx, st->cy, rows, t > (uint64_t)rows ? c->warm : 0);
}

static void phase_streams(model_ctx *a, model_ctx *b, double dur, bool check_rss,
                          uint64_t *ticks_out) {
    stream_ctx st[N_STREAMS];
    for (int i = 0; i < N_STREAMS; i++) {
        stream_ctx *s = &st[i];
        memset(s, 0, sizeof *s);
        s->c = i < N_STREAMS - 1 ? a : b;
        if (kiln_stream_open(s->c->m, &s->s)) die("opening a stream");
        s->row = rng() % TABLE_ROWS;
        s->step = (rng() % TABLE_ROWS) | 1;
        s->next_check = 1000 + rng() % 8000;
        size_t N = (size_t)s->c->N;
        s->hx = kiln_malloc(N * s->c->F * sizeof(float));
        s->hy = kiln_malloc(N * s->c->O * sizeof(float));
        s->cx = kiln_malloc(N * s->c->F * sizeof(float));
        s->cy = kiln_malloc(N * s->c->O * sizeof(float));
        if (!s->hx || !s->hy || !s->cx || !s->cy) die("allocating");
    }
    monitor mon;
    uint64_t t0 = kiln_now_ns(), end = t0 + (uint64_t)(dur * 1e9);
    double win = fmin(60.0, dur / 4);
    uint64_t first_end = t0 + (uint64_t)(win * 1e9), last_start = end - (uint64_t)(win * 1e9);
    mon_start(&mon, "streams", t0, dur, check_rss);
    uint64_t ticks = 0, last_ticks = 0, last_t = t0, now = t0;
    while (now < end) {
        for (int i = 0; i < N_STREAMS; i++) {
            stream_ctx *s = &st[i];
            model_ctx *c = s->c;
            uint64_t slot = kiln_stream_ticks(s->s) % (uint64_t)c->N;
            const float *x = table + s->row * c->F;
            float *y = s->hy + slot * c->O;
            uint64_t a0 = kiln_now_ns();
            kiln_err rc = kiln_stream_push(s->s, x, y);
            now = kiln_now_ns();
            uint64_t dt = now - a0;
            if (rc) {
                FAIL("%s stream %d: push: %s", c->name, i, kiln_errmsg());
                goto out;
            }
            hist_add(&c->all, dt);
            hist_add(&c->recent, dt);
            if (now < first_end) hist_add(&c->first, dt);
            if (now >= last_start) hist_add(&c->last, dt);
            memcpy(s->hx + slot * c->F, x, (size_t)c->F * sizeof(float));
            s->row = (s->row + s->step) & (TABLE_ROWS - 1);
            ticks++;
            if (kiln_stream_ticks(s->s) >= s->next_check) {
                stream_check(s);
                s->next_check = kiln_stream_ticks(s->s) + 1000 + rng() % 8000;
            }
        }
        if (now >= mon.next) {
            char extra[256];
            snprintf(extra, sizeof extra,
                     "ticks=%llu ticks/s=%.0f p50=%.2fus p99=%.2fus max=%.1fus checks=%llu "
                     "max_rel=%.2g",
                     (unsigned long long)ticks, (double)(ticks - last_ticks) / secs(now - last_t),
                     hist_q(&a->recent, 0.5), hist_q(&a->recent, 0.99), (double)a->recent.max / 1e3,
                     (unsigned long long)checks, worst_rel);
            mon_sample(&mon, now, extra);
            hist_clear(&a->recent);
            hist_clear(&b->recent);
            last_ticks = ticks;
            last_t = now;
        }
    }
    mon_sample(&mon, now, "end");
out:
    for (int i = 0; i < N_STREAMS; i++) {
        if (st[i].s) {
            /* Each stream's last window is checked once more at the end. */
            if (kiln_stream_ticks(st[i].s)) stream_check(&st[i]);
            kiln_stream_free(st[i].s);
        }
        free(st[i].hx), free(st[i].hy), free(st[i].cx), free(st[i].cy);
    }
    double el = secs(now - t0);
    printf("== summary\n");
    printf("  streams_seconds         %.1f\n", el);
    printf("  streams_ticks           %llu (%d streams: %d on %s, 1 on %s; %.1fM ticks per "
           "stream)\n",
           (unsigned long long)ticks, N_STREAMS, N_STREAMS - 1, a->name, b->name,
           (double)ticks / N_STREAMS / 1e6);
    printf("  streams_ticks_per_s     %.0f (wall, with the soak's own checks)\n",
           (double)ticks / el);
    model_ctx *cs[2] = {a, b};
    for (int i = 0; i < 2; i++)
        printf("  latency_%-4s           p50 %.2f us  p99 %.2f us  max %.1f us  (%llu pushes)\n",
               cs[i]->name, hist_q(&cs[i]->all, 0.5), hist_q(&cs[i]->all, 0.99),
               (double)cs[i]->all.max / 1e3, (unsigned long long)cs[i]->all.n);
    for (int i = 0; i < 2; i++)
        printf("  drift_%-4s             p99 first %.0f s %.2f us, last %.0f s %.2f us (%+.1f%%); "
               "p50 %.2f -> %.2f us\n",
               cs[i]->name, win, hist_q(&cs[i]->first, 0.99), win, hist_q(&cs[i]->last, 0.99),
               100.0 * (hist_q(&cs[i]->last, 0.99) / hist_q(&cs[i]->first, 0.99) - 1),
               hist_q(&cs[i]->first, 0.5), hist_q(&cs[i]->last, 0.5));
    printf("  parity_checks           %llu, max relative error %.3g, max abs %.3g (stream.rtol "
           "%g, stream.atol %g)\n",
           (unsigned long long)checks, worst_rel, worst_abs, thr.stream.rtol, thr.stream.atol);
    print_ties(0, 0);
    mon_summary(&mon);
    *ticks_out = ticks;
}

/* ---- phase 2: stream open / reset / free cycles ---- */

static void phase_cycles(model_ctx *a, model_ctx *b, double dur, bool check_rss) {
    monitor mon;
    uint64_t t0 = kiln_now_ns(), end = t0 + (uint64_t)(dur * 1e9), now = t0;
    mon_start(&mon, "cycles", t0, dur, check_rss);
    uint64_t cycles = 0, ticks = 0, checks0 = checks, ties0 = tie_checks, tout0 = tie_outputs;
    float *y1 = NULL, *y2 = NULL;
    int maxN = 2 * (a->N > b->N ? a->N : b->N);
    y1 = kiln_malloc((size_t)maxN * 64 * sizeof *y1);
    y2 = kiln_malloc((size_t)maxN * 64 * sizeof *y2);
    if (!y1 || !y2) die("allocating");
    while (now < end && !failures) {
        model_ctx *c = cycles & 1 ? b : a;
        int n = 1 + (int)(rng() % (uint64_t)(2 * c->N));
        uint64_t row = rng() % (TABLE_ROWS - (uint64_t)n);
        const float *x = table + row * c->F;
        kiln_stream *s = NULL;
        if (kiln_stream_open(c->m, &s)) {
            FAIL("%s: stream open: %s", c->name, kiln_errmsg());
            break;
        }
        bool ok = true;
        for (int pass = 0; pass < 2 && ok; pass++) {
            float *y = pass ? y2 : y1;
            for (int t = 0; t < n && ok; t++)
                if (kiln_stream_push(s, x + (size_t)t * c->F, y + (size_t)t * c->O)) {
                    FAIL("%s: push: %s", c->name, kiln_errmsg());
                    ok = false;
                }
            if (ok && kiln_stream_ticks(s) != (uint64_t)n) {
                FAIL("%s: %llu ticks after %d pushes", c->name,
                     (unsigned long long)kiln_stream_ticks(s), n);
                ok = false;
            }
            ticks += (uint64_t)n;
            if (!pass) kiln_stream_reset(s);
        }
        if (ok) check_rows(c, "open/reset cycle", x, y1, n, 0);
        if (ok && memcmp(y1, y2, (size_t)n * c->O * sizeof *y1))
            FAIL("%s: after reset, %d ticks give other outputs than a fresh stream", c->name, n);
        kiln_stream_free(s);
        cycles++;
        now = kiln_now_ns();
        if (now >= mon.next) {
            char extra[128];
            snprintf(extra, sizeof extra, "cycles=%llu ticks=%llu max_rel=%.2g",
                     (unsigned long long)cycles, (unsigned long long)ticks, worst_rel);
            mon_sample(&mon, now, extra);
        }
    }
    mon_sample(&mon, now, "end");
    free(y1);
    free(y2);
    printf("  cycles                  %llu stream open/push/reset/push/free (%llu ticks, %llu "
           "batch checks) in %.1f s\n",
           (unsigned long long)cycles, (unsigned long long)ticks,
           (unsigned long long)(checks - checks0), secs(now - t0));
    print_ties(ties0, tout0);
    mon_summary(&mon);
}

/* ---- phase 3: model open / free cycles ---- */

typedef struct {
    const char *path;
    float *ref; /* the first open's outputs: stream [2W,O] then batch [2,W,O] */
    size_t n;
} reopen_case;

static void phase_reopen(const char *dir, double dur, bool check_rss, const char *bad_path) {
    char p0[1024], p1[1024];
    snprintf(p0, sizeof p0, "%s/tiny.safetensors", dir);
    snprintf(p1, sizeof p1, "%s/tiny-bf16", dir); /* a model directory */
    reopen_case cases[2] = {{p0, NULL, 0}, {p1, NULL, 0}};
    monitor mon;
    uint64_t t0 = kiln_now_ns(), end = t0 + (uint64_t)(dur * 1e9), now = t0;
    mon_start(&mon, "reopen", t0, dur, check_rss);
    uint64_t cycles = 0, refused = 0;
    float *out = NULL;
    while (now < end && !failures) {
        if (cycles % 10 == 9) {
            kiln_model *m = NULL;
            kiln_err rc = kiln_model_open(bad_path, &m);
            if (rc == KILN_OK || m) {
                FAIL("a truncated model file opened");
                kiln_model_free(m);
            } else if (!strstr(kiln_errmsg(), "truncated.safetensors")) {
                FAIL("refusing a truncated model: message does not name the file: %s",
                     kiln_errmsg());
            }
            refused++;
        }
        reopen_case *rc_ = &cases[cycles & 1];
        kiln_model *m = NULL;
        kiln_stream *s = NULL;
        if (kiln_model_open(rc_->path, &m) || kiln_stream_open(m, &s)) {
            FAIL("'%s': open: %s", rc_->path, kiln_errmsg());
            kiln_model_free(m);
            break;
        }
        const kiln_model_config *k = kiln_model_config_get(m);
        int W = k->attn_window, F = k->n_features, O = k->n_outputs;
        size_t n = (size_t)2 * W * O + (size_t)2 * W * O;
        if (!out) out = kiln_malloc(n * sizeof *out);
        if (!out) die("allocating");
        bool ok = true;
        for (int t = 0; t < 2 * W && ok; t++)
            ok = kiln_stream_push(s, table + (size_t)t * F, out + (size_t)t * O) == KILN_OK;
        ok = ok && kiln_model_forward(m, table, 2, W, out + (size_t)2 * W * O) == KILN_OK;
        if (!ok) FAIL("'%s': %s", rc_->path, kiln_errmsg());
        kiln_stream_free(s);
        kiln_model_free(m);
        if (ok && !rc_->ref) {
            rc_->ref = kiln_malloc(n * sizeof *out);
            if (!rc_->ref) die("allocating");
            memcpy(rc_->ref, out, n * sizeof *out);
            rc_->n = n;
        } else if (ok && (n != rc_->n || memcmp(out, rc_->ref, n * sizeof *out)))
            FAIL("'%s': open number %llu gives other outputs than the first", rc_->path,
                 (unsigned long long)cycles);
        cycles++;
        now = kiln_now_ns();
        if (now >= mon.next) {
            char extra[96];
            snprintf(extra, sizeof extra, "opens=%llu refused=%llu", (unsigned long long)cycles,
                     (unsigned long long)refused);
            mon_sample(&mon, now, extra);
        }
    }
    mon_sample(&mon, now, "end");
    free(out);
    free(cases[0].ref);
    free(cases[1].ref);
    printf("  reopen                  %llu model open/stream/batch/free (f32 file, bf16 "
           "directory; bitwise equal to the first open), %llu truncated files refused, in %.1f s\n",
           (unsigned long long)cycles, (unsigned long long)refused, secs(now - t0));
    mon_summary(&mon);
}

/* A copy of the first half of src at dst. */
static void write_truncated(const char *src, const char *dst) {
    FILE *f = fopen(src, "rb"), *g = fopen(dst, "wb");
    if (!f || !g) {
        fprintf(stderr, "soak_runtime: cannot copy '%s' to '%s'\n", src, dst);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f) / 2;
    fseek(f, 0, SEEK_SET);
    char buf[4096];
    while (n > 0) {
        size_t k = fread(buf, 1, (size_t)(n < 4096 ? n : 4096), f);
        if (!k) break;
        fwrite(buf, 1, k, g);
        n -= (long)k;
    }
    fclose(f);
    if (fclose(g)) exit(2);
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4 || (argc == 4 && strcmp(argv[3], "--no-rss"))) {
        fprintf(stderr, "usage: soak_runtime DIR SECONDS [--no-rss]\n");
        return 2;
    }
    const char *dir = argv[1];
    double seconds = atof(argv[2]);
    bool check_rss = argc == 3;
    if (!(seconds >= 3)) {
        fprintf(stderr, "soak_runtime: SECONDS must be at least 3\n");
        return 2;
    }
    const char *seed_s = getenv("SOAK_SEED");
    uint64_t seed = seed_s && *seed_s ? strtoull(seed_s, NULL, 10) : 1;
    rng_state = seed;
    kiln_thresholds_default(&thr);

    /* The trainer's default (tiny) config with the demo's 8 features and 2 outputs, as in
     * bench_stream: random weights, f32 in a file and bf16 in a model directory. */
    kiln_train_config defaults;
    kiln_train_config_default(&defaults);
    kiln_model_config cfg = defaults.model;
    cfg.n_features = 8;
    cfg.n_outputs = 2;
    char p0[1024], pdir[1024], p1[1024], bad[1024];
    snprintf(p0, sizeof p0, "%s/tiny.safetensors", dir);
    snprintf(pdir, sizeof pdir, "%s/tiny-bf16", dir);
    snprintf(p1, sizeof p1, "%s/tiny-bf16/model.safetensors", dir);
    snprintf(bad, sizeof bad, "%s/truncated.safetensors", dir);
    if (kiln_mkdir_p(pdir) || kiln_rt_random_model(p0, &cfg, seed, false) ||
        kiln_rt_random_model(p1, &cfg, seed, true))
        die("writing the models");
    write_truncated(p0, bad);
    table = kiln_malloc((size_t)TABLE_ROWS * cfg.n_features * sizeof *table);
    if (!table) die("allocating");
    for (size_t i = 0; i < (size_t)TABLE_ROWS * cfg.n_features; i++)
        table[i] = (float)kiln_rt_normal(seed + 1000, i);

    model_ctx a, b;
    model_ctx_init(&a, "f32", p0);
    model_ctx_init(&b, "bf16", pdir);
    printf("runtime soak: %.0f s, seed %llu, model d_model=%d n_layers=%d n_heads=%d d_ff=%d "
           "n_experts=%d top_k=%d attn_window=%d F=%d O=%d; checks compare the last %d rows of "
           "a %d-row window\n",
           seconds, (unsigned long long)seed, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_ff,
           cfg.n_experts, cfg.top_k, cfg.attn_window, cfg.n_features, cfg.n_outputs, a.warm + 1,
           a.N);
    fflush(stdout);
    uint64_t ticks = 0;
    phase_streams(&a, &b, seconds * 0.70, check_rss, &ticks);
    phase_cycles(&a, &b, seconds * 0.15, check_rss);
    model_ctx_release(&b);
    phase_reopen(dir, seconds * 0.15, check_rss, bad);
    model_ctx_release(&a);
    free(table);
    printf("  result                  %s (%d failures)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}

/*
 * pull.c - the registry soak's client (tests/soak/registry.sh drives it; docs/soak.md).
 *
 *   soak_pull URL MIRROR TRUST WORKDIR THREADS     (MIRROR: a second registry, or "-")
 *
 * What a long-lived service does with a registry and its mirror, in one process the script
 * samples (resident memory, fds): THREADS threads pulling with kiln_pull, and a kiln_watch
 * following soak@staging whose every swap is checked, while the main thread acquires the model
 * in service each round, streams on it, and holds it until the next round ends (so swaps
 * retire models that are still held). Every pull and the watch ask URL first, MIRROR second:
 * the script stops URL now and then, and the pulls must keep working through MIRROR.
 * WORKDIR/pub/VERSION is the model directory published as soak@VERSION (the script links it
 * once the publish succeeded); WORKDIR/seqs/SEQ holds the version the channel record of that
 * seq points at (the script writes it once the record was put). Commands on stdin, one per
 * line, each answered by one line on stdout:
 *
 *   round N SEQ   each thread pulls N times (one in four a version picked at random from
 *                 WORKDIR/pub, the rest soak@staging), opens the pulled model and requires
 *                 its predictions on a fixed input to be bitwise those of WORKDIR/pub/VERSION;
 *                 a channel pull must give the record of seq SEQ (the channel's current one:
 *                 nothing is promoted during a round) and the version WORKDIR/seqs/SEQ names,
 *                 and never a seq below one that thread saw before. Answers
 *                 "ok PULLS FAILURES RSS_KB FDS SWAPS DOWN WDOWN TRUST WSEQ" once every thread
 *                 is idle (FDS: the fewest of ten readings 5 ms apart, so a watcher poll in
 *                 flight is not counted; DOWN, WDOWN: the pulls' and the watch's notes of a
 *                 registry passed over because it did not answer, so far; TRUST: the lowest
 *                 trust version any thread's or the watch's state holds; WSEQ: the seq of the
 *                 watch's model in service)
 *   window T SEQ  the script is about to put trust version T, which removes the key that
 *                 signed record SEQ, the channel's current one: from now until the watch swaps
 *                 to a record above SEQ, its refusals of that record are expected, not
 *                 failures. Answers "ok".
 *   refused T SEQ version T is in force: the watch must hear it and that the record in service
 *                 no longer verifies (within 30 s), then each thread pulls soak@staging once
 *                 and must be refused (KILN_ERR_VERIFY, "not in the trust policy") with its
 *                 state at version T. Answers as round.
 *   restart SEQ   the service restarts: it releases its model, stops the watch and starts a
 *                 new one on the same directory and state (kiln_watch keeps the model in
 *                 service on disk). The new watch must serve the record its state accepted
 *                 last, whose seq is not below the one served before (SEQ or, while the
 *                 primary is down and the mirror behind, an older one; with no registry up,
 *                 the kept model, said to on_update), its predictions the published
 *                 version's, and leave one model directory and `current` in its directory.
 *                 Answers as round.
 *   quit SEQ      waits (30 s at most) for the watch to serve the record of seq SEQ, prints the
 *                 summary ("== summary", pull latency percentiles, swaps, failovers, trust
 *                 versions) and exits 0, or 1 if anything failed
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
#define WAIT_MS 30000      /* how long the watch may take to hear a change */

enum { K_PULL, K_WATCH }; /* who heard a registry passed over */

static const char *url, *trust, *work;
static const char *mirrors[1];
static size_t n_mirrors;
static int n_threads, per_round;
static atomic_int stop, refusing; /* refusing: the threads' pulls must be refused */
static atomic_long pulls, version_pulls, failures, swaps;
static atomic_long expect_seq;                        /* the round's channel seq */
static atomic_long down[2], stale[2], unverified[2];  /* notes of a registry passed over */
static atomic_long window_trust, window_seq;          /* a refusal the watch may report */
static atomic_long watch_trust = 1, watch_refused_under, watch_seq, watch_refusals;
static atomic_long trust_heard, pull_refusals, offline_starts;
static pthread_barrier_t go, done;
static pthread_mutex_t err_mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t *lat; /* [LAT_MAX] */
static atomic_uint n_lat;
static int kind_pull = K_PULL, kind_watch = K_WATCH; /* on_registry's ctx */

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

/* kiln_pull_opts.on_registry: a registry passed over, counted by why. The first line of each
 * kind goes to stderr, as an example for the log. */
static void on_registry(void *ctx, const char *line) {
    int k = *(const int *)ctx;
    atomic_long *c = strstr(line, "does not verify")                                ? unverified
                     : strstr(line, "using the newer") || strstr(line, "stale mirror") ? stale
                                                                                     : down;
    if (atomic_fetch_add(&c[k], 1) == 0) {
        pthread_mutex_lock(&err_mu);
        fprintf(stderr, "note (%s, first of its kind): %s\n", k == K_PULL ? "pull" : "watch", line);
        pthread_mutex_unlock(&err_mu);
    }
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

/* A channel record of seq `seq` giving `version`: the script wrote WORKDIR/seqs/SEQ with that
 * version once kiln promote or rollback had put the record and said so. The watch may see the
 * record first: the file is waited for (WAIT_MS at most). */
static void check_seq(long long seq, const char *version, const char *what) {
    char p[1024], v[128] = "";
    snprintf(p, sizeof p, "%s/seqs/%lld", work, seq);
    FILE *f = NULL;
    for (int ms = 0; !f && ms < WAIT_MS; ms += 10)
        if (!(f = fopen(p, "r"))) usleep(10000);
    if (!f || !fgets(v, sizeof v, f)) {
        fail("%s: seq %lld is no record the script put ('%s' unreadable)", what, seq, p);
    } else {
        v[strcspn(v, "\n")] = 0;
        if (strcmp(v, version))
            fail("%s: seq %lld gave version %s, the record put points at %s", what, seq, version,
                 v);
    }
    if (f) fclose(f);
}

/* The newest trust version a state directory holds (STATE/trust/N.json), 1 if none. */
static long state_trust(const char *state) {
    char p[1100];
    snprintf(p, sizeof p, "%s/trust", state);
    DIR *d = opendir(p);
    long best = 1;
    if (!d) return best;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long v = strtol(e->d_name, &end, 10);
        if (end != e->d_name && !strcmp(end, ".json") && v > best) best = v;
    }
    closedir(d);
    return best;
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
    long long last_seq; /* the highest channel seq this thread was given */
} puller;

static kiln_pull_opts pull_opts(const char *ref, const char *out, const char *state,
                                int *kind) {
    return (kiln_pull_opts){.registry = url,
                            .registries = mirrors,
                            .nregistries = n_mirrors,
                            .ref = ref,
                            .trust = trust,
                            .out = out,
                            .state = state,
                            .on_registry = on_registry,
                            .registry_ctx = kind};
}

/* One pull of soak@staging that must be refused: the record is signed by a removed key. */
static void refused_pull(puller *p) {
    kiln_pull_opts o = pull_opts("soak@staging", p->out, p->state, &kind_pull);
    kiln_pull_result r;
    kiln_err rc = kiln_pull(&o, &r);
    atomic_fetch_add(&pulls, 1);
    if (!rc)
        fail("thread %d: pull soak@staging: seq %lld (%s) accepted, signed by a key the trust "
             "policy removed",
             p->id, (long long)r.seq, r.version);
    else if (rc != KILN_ERR_VERIFY || !strstr(kiln_errmsg(), "not in the trust policy"))
        fail("thread %d: pull soak@staging refused for another reason than the removed key: "
             "%s",
             p->id, kiln_errmsg());
    else
        atomic_fetch_add(&pull_refusals, 1);
}

static void one_pull(puller *p) {
    char ref[160], version[128] = "";
    if (soak_rng(&p->rng) % 4 == 0) pick_version(&p->rng, version);
    snprintf(ref, sizeof ref, "soak@%s", version[0] ? version : "staging");
    kiln_pull_opts o = pull_opts(ref, p->out, p->state, &kind_pull);
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
    if (!version[0]) {
        long long want = atomic_load(&expect_seq);
        if (r.seq < p->last_seq)
            fail("%s: seq %lld, below seq %lld this thread was given before", what,
                 (long long)r.seq, p->last_seq);
        else if (r.seq != want)
            fail("%s: seq %lld, the channel's current record is seq %lld", what, (long long)r.seq,
                 want);
        if (r.seq > p->last_seq) p->last_seq = r.seq;
        check_seq(r.seq, r.version, what);
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
            atomic_load(&refusing) ? refused_pull(p) : one_pull(p);
        pthread_barrier_wait(&done);
    }
    return NULL;
}

/* Called by the watcher's thread after each update: a swap is checked against what was
 * published under its version and the record put under its seq; a new trust version is
 * noted; a failure fails the soak, except the refusal of a record signed by a key the policy
 * just removed (between `refused` and the swap to a record above it). */
static void on_update(void *ctx, kiln_err rc, const char *message, const kiln_pull_result *r) {
    kiln_watch **w = ctx;
    unsigned long long v;
    if (rc) {
        if (atomic_load(&window_trust) && strstr(message, "not in the trust policy")) {
            atomic_fetch_add(&watch_refusals, 1);
            if (sscanf(message, "under trust policy version %llu:", &v) == 1)
                atomic_store(&watch_refused_under, (long)v);
            return;
        }
        if (strstr(message, "' was not used: ")) {
            fail("watch: the kept model was refused at a restart: %s", message);
            return;
        }
        if (strstr(message, "; serving soak@") && strstr(message, "as kept in '")) {
            atomic_fetch_add(&offline_starts, 1); /* a restart while no registry served */
            return;
        }
        fail("watch: update failed: %s", message);
        return;
    }
    if (!r) { /* a new version of the trust policy: not a swap */
        if (sscanf(message, "trust policy version %llu accepted", &v) != 1)
            fail("watch: unexpected trust event: %s", message);
        else if ((long)v <= atomic_load(&watch_trust))
            fail("watch: trust version %llu heard after %ld", v, atomic_load(&watch_trust));
        else {
            atomic_store(&watch_trust, (long)v);
            atomic_fetch_add(&trust_heard, 1);
        }
        return;
    }
    atomic_fetch_add(&swaps, 1);
    char what[160];
    snprintf(what, sizeof what, "watch: swap to %s (seq %lld)", r->version, (long long)r->seq);
    if (r->seq < atomic_load(&watch_seq))
        fail("%s: below seq %ld it served before", what, atomic_load(&watch_seq));
    atomic_store(&watch_seq, (long)r->seq);
    check_seq(r->seq, r->version, what);
    if (atomic_load(&window_trust) && r->seq > atomic_load(&window_seq))
        atomic_store(&window_trust, 0);
    if (!*w) return; /* the first load, inside kiln_watch_start */
    const kiln_model *m = kiln_watch_acquire(*w, NULL);
    check_model(m, r->version, what);
    kiln_watch_release(*w, m);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Wait (WAIT_MS at most) until cond(arg) holds; false if it never did. */
static bool wait_for(bool (*cond)(long), long arg) {
    for (int ms = 0; ms < WAIT_MS; ms += 10) {
        if (cond(arg)) return true;
        usleep(10000);
    }
    return cond(arg);
}
static bool heard_refusal(long t) {
    return atomic_load(&watch_trust) >= t && atomic_load(&watch_refused_under) >= t;
}
static bool serves_seq(long seq) {
    return atomic_load(&watch_seq) == seq;
}

/* The record the watch's state accepted last: its seq (-1 when unreadable) and version. */
static long long state_record(const char *state, char version[64]) {
    char p[1100];
    snprintf(p, sizeof p, "%s/channels/soak/staging.json", state);
    json_t *j = NULL;
    long long seq = -1;
    version[0] = 0;
    if (kiln_json_load_file(p, &j) == KILN_OK) {
        const char *v = json_string_value(json_object_get(j, "version"));
        if (v && json_is_integer(json_object_get(j, "seq"))) {
            seq = json_integer_value(json_object_get(j, "seq"));
            snprintf(version, 64, "%s", v);
        }
    }
    json_decref(j);
    return seq;
}

/* The entries of the watch's directory besides "current": exactly one gen-N is right. */
static int model_dirs(const char *out) {
    DIR *d = opendir(out);
    int n = 0, other = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, "current"))
            continue;
        if (!strncmp(e->d_name, "gen-", 4))
            n++;
        else
            other++;
    }
    if (d) closedir(d);
    return other ? -1 : n;
}

/* A command's answer: "ok PULLS FAILURES RSS_KB FDS SWAPS DOWN WDOWN TRUST WSEQ". Every
 * client's state has walked to the same trust version (the lowest is TRUST; refused_t > 0:
 * it must be that one). */
static void report(const char *wstate, const puller *ps, int n, long refused_t, long *trust_min) {
    long tmin = state_trust(wstate);
    for (int i = 0; i < n; i++) {
        long v = state_trust(ps[i].state);
        if (v < tmin) tmin = v;
    }
    if (refused_t > 0 && tmin != refused_t)
        fail("after trust version %ld was put, a client's state holds version %ld", refused_t,
             tmin);
    if (tmin > *trust_min) *trust_min = tmin;
    int fds = 1 << 30;
    for (int i = 0; i < 10; i++) {
        int f = soak_fd_count();
        if (f < fds) fds = f;
        usleep(5000);
    }
    printf("ok %ld %ld %ld %d %ld %ld %ld %ld %ld\n", atomic_load(&pulls), atomic_load(&failures),
           soak_rss_kb(), fds, atomic_load(&swaps), atomic_load(&down[K_PULL]),
           atomic_load(&down[K_WATCH]), tmin, atomic_load(&watch_seq));
}

int main(int argc, char **argv) {
    if (argc != 6 || atoi(argv[5]) < 1 || atoi(argv[5]) > MAX_THREADS) {
        fprintf(stderr, "usage: soak_pull URL MIRROR|- TRUST WORKDIR THREADS (1-%d)\n",
                MAX_THREADS);
        return 2;
    }
    url = argv[1], trust = argv[3], work = argv[4], n_threads = atoi(argv[5]);
    if (strcmp(argv[2], "-")) mirrors[n_mirrors++] = argv[2];
    lat = kiln_malloc(LAT_MAX * sizeof *lat);
    if (!lat) return 2;
    memset(lat, 0, LAT_MAX * sizeof *lat); /* resident now, not as pulls accumulate */
    setvbuf(stdout, NULL, _IOLBF, 0);

    char wout[1024], wstate[1024];
    snprintf(wout, sizeof wout, "%s/watch", work);
    snprintf(wstate, sizeof wstate, "%s/state/watch", work);
    kiln_watch *w = NULL;
    kiln_watch_opts wo = {.pull = pull_opts("soak@staging", wout, wstate, &kind_watch),
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
        ps[i].last_seq = 0;
        snprintf(ps[i].out, sizeof ps[i].out, "%s/pull/t%d", work, i);
        snprintf(ps[i].state, sizeof ps[i].state, "%s/state/t%d", work, i);
        if (pthread_create(&th[i], NULL, pull_main, &ps[i])) {
            fprintf(stderr, "soak_pull: cannot start a thread\n");
            return 2;
        }
    }

    char line[128];
    long rounds = 0, held_swaps = 0, refusal_rounds = 0, trust_min = 1, restarts = 0;
    uint64_t ticks = 0, held_gen = 0;
    const kiln_model *held = NULL; /* the previous round's model, still in service */
    long long seq = 0;
    while (fgets(line, sizeof line, stdin)) {
        int n;
        long t = 0;
        bool refuse = false;
        if (sscanf(line, "round %d %lld", &n, &seq) == 2 && n > 0) {
            per_round = n;
            atomic_store(&expect_seq, seq);
        } else if (sscanf(line, "window %ld %lld", &t, &seq) == 2 && t > 1) {
            atomic_store(&window_seq, seq);
            atomic_store(&window_trust, t);
            printf("ok\n");
            continue;
        } else if (sscanf(line, "refused %ld %lld", &t, &seq) == 2 && t > 1) {
            /* The watch first: it must have walked to version t and refused its record. */
            if (atomic_load(&window_trust) != t || atomic_load(&window_seq) != seq)
                fail("refused %ld %lld: no window opened for it", t, seq);
            if (!wait_for(heard_refusal, t))
                fail("watch: %d s after trust version %ld was put, it heard version %ld and "
                     "refused its record under version %ld",
                     WAIT_MS / 1000, t, atomic_load(&watch_trust),
                     atomic_load(&watch_refused_under));
            per_round = 1;
            refuse = true;
            refusal_rounds++;
        } else if (sscanf(line, "restart %lld", &seq) == 1) {
            /* The service restarts on its directory and state. */
            kiln_watch_release(w, held);
            held = NULL;
            held_gen = 0;
            kiln_watch_stop(w);
            w = NULL;
            long long before = atomic_load(&watch_seq);
            char version[64], what[128];
            if (kiln_watch_start(&wo, &w)) {
                fail("restart: kiln_watch_start: %s", kiln_errmsg());
                printf("error\n");
                break;
            }
            restarts++;
            long long now = state_record(wstate, version);
            kiln_pull_result sv;
            snprintf(what, sizeof what, "restart %ld: seq %lld (%s)", restarts, now, version);
            if (kiln_watch_serving(w, 0, &sv) || sv.seq != now || strcmp(sv.version, version))
                fail("%s: kiln_watch_serving says seq %lld (%s)", what, (long long)sv.seq,
                     sv.version);
            if (now < before || now > seq)
                fail("%s: served seq %lld before, the newest put is %lld", what, before, seq);
            else
                check_seq(now, version, what);
            atomic_store(&watch_seq, now);
            const kiln_model *m = kiln_watch_acquire(w, NULL);
            check_model(m, version, what);
            kiln_watch_release(w, m);
            if (model_dirs(wout) != 1)
                fail("%s: '%s' holds %d model directories (or something else), not 1", what, wout,
                     model_dirs(wout));
            report(wstate, ps, n_threads, -1, &trust_min);
            continue;
        } else if (sscanf(line, "quit %lld", &seq) == 1) {
            if (!wait_for(serves_seq, (long)seq))
                fail("watch: %d s after the last record (seq %lld) it serves seq %ld",
                     WAIT_MS / 1000, seq, atomic_load(&watch_seq));
            break;
        } else {
            fprintf(stderr, "soak_pull: unknown command '%s'\n", line);
            printf("error\n");
            continue;
        }
        atomic_store(&refusing, refuse);
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
        for (int k = 0; s && k < 200 && c->n_features <= 256 && c->n_outputs <= 256; k++) {
            x[k % c->n_features] = (float)(k % 7) / 7.0f;
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
        report(wstate, ps, n_threads, refuse ? t : -1, &trust_min);
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
           "soak@staging; %ld refused as they must be), each model's predictions bitwise the "
           "published one's, each channel pull the current seq\n",
           atomic_load(&pulls), n_threads, rounds, atomic_load(&version_pulls),
           atomic_load(&pull_refusals));
    if (n)
        printf("  pull_latency            p50 %.1f ms  p90 %.1f ms  p99 %.1f ms  max %.1f ms "
               "(kiln_pull, download and every check, %d at a time)\n",
               lat[n / 2] / 1e3, lat[(size_t)(0.9 * (n - 1))] / 1e3,
               lat[(size_t)(0.99 * (n - 1))] / 1e3, lat[n - 1] / 1e3, n_threads);
    printf("  watch                   %ld swaps checked (%ld while the service held the model "
           "swapped out), %llu service ticks, serving seq %ld at the end\n",
           atomic_load(&swaps), held_swaps, (unsigned long long)ticks, atomic_load(&watch_seq));
    printf("  failovers               pulls %ld, watch polls %ld passed over a registry that did "
           "not answer; a registry behind another: %ld, %ld; served what does not verify: %ld, "
           "%ld\n",
           atomic_load(&down[K_PULL]), atomic_load(&down[K_WATCH]), atomic_load(&stale[K_PULL]),
           atomic_load(&stale[K_WATCH]), atomic_load(&unverified[K_PULL]),
           atomic_load(&unverified[K_WATCH]));
    printf("  trust_clients           every state at version %ld; the watch heard %ld new "
           "versions; a record signed by a removed key refused %ld times (%ld pulls in %ld "
           "rounds, %ld watch polls)\n",
           trust_min, atomic_load(&trust_heard),
           atomic_load(&pull_refusals) + atomic_load(&watch_refusals),
           atomic_load(&pull_refusals), refusal_rounds, atomic_load(&watch_refusals));
    printf("  restarts                %ld of the service (a new kiln_watch on its directory "
           "and state), %ld of them with no registry up, from the model it kept\n",
           restarts, atomic_load(&offline_starts));
    printf("  client_failures         %ld\n", atomic_load(&failures));
    free(lat);
    return atomic_load(&failures) ? 1 : 0;
}

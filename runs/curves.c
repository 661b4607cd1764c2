/* curves.c - every curve of a run's page in one read of metrics.db (runs.h, "a run's curves
 * for a picture"): the steps table streamed through kiln_downsample, the layers and tensors
 * tables read whole for a short run and at sampled steps (by their keys) for a long one, or
 * for a long one that has them, out of layer_sums and tensor_sums (only expert_load sampled). */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <sqlite3.h>

#include "runs_int.h"

/* The steps table's columns as step_sums numbers them (metrics.c). */
#define step_cols kiln_run_metrics_sum_cols
#define N_STEP_COLS KILN_RUN_METRICS_SUM_COLS
static const char *const layer_cols[] = {"attn_entropy", "router_entropy", "load_imbalance",
                                         "dead_experts", "overflow",       "act_rms"};
#define N_LAYER_COLS (sizeof layer_cols / sizeof *layer_cols)
_Static_assert(N_LAYER_COLS == KILN_RUN_METRICS_LAYER_COLS, "layer_sums sums the layer columns up");
#define MAX_TENSORS 4096

typedef struct grow {
    kiln_run_curve *c;
    size_t cap;
} grow;

static kiln_err push(grow *g, double x, double y) {
    kiln_run_curve *c = g->c;
    if (c->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 64;
        double *a = realloc(c->x, cap * sizeof *a);
        if (a) c->x = a;
        double *b = a ? realloc(c->y, cap * sizeof *b) : NULL;
        if (b) c->y = b;
        if (!a || !b) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        g->cap = cap;
    }
    c->x[c->n] = x;
    c->y[c->n] = y;
    c->n++;
    return KILN_OK;
}

static void curve_free(kiln_run_curve *c) {
    free(c->name);
    free(c->x);
    free(c->y);
    memset(c, 0, sizeof *c);
}

void kiln_run_curves_release(kiln_run_curves *cs) {
    for (size_t i = 0; i < cs->n; i++)
        curve_free(&cs->c[i]);
    free(cs->c);
    for (size_t i = 0; i < cs->n_movers; i++)
        free(cs->movers[i]);
    free(cs->movers);
    memset(cs, 0, sizeof *cs);
}

const kiln_run_curve *kiln_run_curve_find(const kiln_run_curves *cs, const char *name) {
    for (size_t i = 0; i < cs->n; i++)
        if (!strcmp(cs->c[i].name, name)) return &cs->c[i];
    return NULL;
}

/* A new curve at the end of cs named name (taken: freed on failure), or NULL (out of
 * memory, or name NULL). */
static kiln_run_curve *add(kiln_run_curves *cs, size_t *cap, char *name) {
    if (!name) return NULL;
    if (cs->n == *cap) {
        size_t nc = *cap ? 2 * *cap : 32;
        kiln_run_curve *p = realloc(cs->c, nc * sizeof *p);
        if (!p) {
            free(name);
            return NULL;
        }
        cs->c = p;
        *cap = nc;
    }
    kiln_run_curve *cv = &cs->c[cs->n++];
    memset(cv, 0, sizeof *cv);
    cv->name = name;
    return cv;
}

#define DB_FAIL(rc, label)                                                                         \
    do {                                                                                           \
        rc = kiln_fail(KILN_ERR_IO, "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));           \
        goto label;                                                                                \
    } while (0)

/* What has been read of a summed-up table (the steps table; the layers table's scalar
 * columns): a rollup per series (core.h; kiln_run_metrics_sums: layer * per + col), the newest
 * step read, and what would make it stale (another metrics.db, a resume: the trainer
 * truncates the steps after its checkpoint and logs them again). */
typedef struct series_state {
    const kiln_run_metrics_sums *kind;
    kiln_rollup *r; /* [n] */
    size_t n;
    long last;
    long long resume_id;
    dev_t dev;
    ino_t ino;
} series_state;

static void series_reset(series_state *s) {
    for (size_t k = 0; k < s->n; k++)
        kiln_rollup_init(&s->r[k]);
    s->last = 0;
    s->resume_id = 0;
    s->dev = 0;
    s->ino = 0;
}

/* s empty, for n series of the summary `which` (series_free). */
static kiln_err series_init(series_state *s, int which, size_t n) {
    memset(s, 0, sizeof *s);
    s->kind = kiln_run_metrics_sums_of(which);
    s->r = kiln_malloc((n ? n : 1) * sizeof *s->r);
    if (!s->r) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    s->n = n;
    series_reset(s);
    return KILN_OK;
}

static void series_free(series_state *s) {
    if (s) free(s->r);
}

/* The table's rows after s->last up to step `to` into s. */
static kiln_err series_rows(sqlite3 *db, const char *run_dir, long to, series_state *s) {
    kiln_err rc = KILN_OK;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, s->kind->rows, -1, &st, NULL) != SQLITE_OK) DB_FAIL(rc, out);
    sqlite3_bind_int64(st, 1, s->last + 1);
    sqlite3_bind_int64(st, 2, to < LONG_MAX ? to + 1 : LONG_MAX);
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        long step = (long)sqlite3_column_int64(st, 0);
        for (int k = 0; k < s->kind->per; k++) {
            double y;
            long c = kiln_run_metrics_sum_value(s->kind, st, k, &y);
            if (c >= 0 && c < (long)s->n) kiln_rollup_push(&s->r[c], (double)step, y);
        }
        s->last = step;
    }
    if (r != SQLITE_DONE) DB_FAIL(rc, out);
out:
    sqlite3_finalize(st);
    return rc;
}

/* The level of the summary to read for a run whose last step is `last` (upto: each level's
 * _done): the widest whose buckets are no wider than the rollup's will be (so that adding
 * them equals pushing their rows, core.h), or -1 (a short run; or a metrics.db logged
 * before the summary, which is then read row by row). *any: whether its _done has a row. */
static int sums_level(sqlite3 *db, const kiln_run_metrics_sums *kind, long last, long *upto,
                      bool *any) {
    memset(upto, 0, KILN_RUN_METRICS_SUM_LEVELS * sizeof *upto);
    *any = false;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, kind->done, -1, &st, NULL) != SQLITE_OK) return -1;
    while (sqlite3_step(st) == SQLITE_ROW) {
        long k = (long)sqlite3_column_int64(st, 0);
        if (k >= 0 && k < KILN_RUN_METRICS_SUM_LEVELS) upto[k] = (long)sqlite3_column_int64(st, 1);
        *any = true;
    }
    sqlite3_finalize(st);
    double width = 1;
    while (floor((double)last / width) >= KILN_ROLLUP_BUCKETS)
        width *= 2;
    int lv = -1;
    for (int k = 0; k < KILN_RUN_METRICS_SUM_LEVELS && KILN_RUN_METRICS_SUM_WIDTH(k) <= width; k++)
        if (upto[k] > 0) lv = k;
    return lv;
}

/* Level lv's buckets [b0, b1) of the summary into s, in order. */
static kiln_err series_sums(sqlite3 *db, const char *run_dir, int lv, long b0, long b1,
                            series_state *s) {
    kiln_err rc = KILN_OK;
    sqlite3_stmt *st = NULL;
    double w = (double)KILN_RUN_METRICS_SUM_WIDTH(lv);
    if (sqlite3_prepare_v2(db, s->kind->sums, -1, &st, NULL) != SQLITE_OK) DB_FAIL(rc, out);
    sqlite3_bind_int(st, 1, lv);
    sqlite3_bind_int64(st, 2, b0);
    sqlite3_bind_int64(st, 3, b1);
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        long c = (long)sqlite3_column_int64(st, 1);
        if (c < 0 || c >= (long)s->n) continue;
        kiln_rollup_span sp;
        kiln_run_metrics_sum_span(st, 2, (double)sqlite3_column_int64(st, 0) * w, w, &sp);
        kiln_rollup_add(&s->r[c], &sp);
    }
    if (r != SQLITE_DONE) DB_FAIL(rc, out);
out:
    sqlite3_finalize(st);
    return rc;
}

/* Bring s up to the rows logged now (up to step to): only the rows after s->last are read,
 * unless s is stale, when it starts over. */
static kiln_err series_update(sqlite3 *db, const char *run_dir, long to, series_state *s) {
    kiln_err rc = KILN_OK;
    sqlite3_stmt *st = NULL;
    char *path = kiln_path_join(run_dir, "metrics.db");
    struct stat sb;
    if (!path) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    bool same = !stat(path, &sb) && sb.st_dev == s->dev && sb.st_ino == s->ino;
    free(path);
    long long resume = 0;
    long newest = 0;
    if (sqlite3_prepare_v2(db,
                           "SELECT (SELECT coalesce(max(id), 0) FROM events WHERE kind = 'resume'),"
                           " (SELECT coalesce(max(step), 0) FROM steps)",
                           -1, &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW)
        DB_FAIL(rc, out);
    resume = sqlite3_column_int64(st, 0);
    newest = (long)sqlite3_column_int64(st, 1);
    sqlite3_finalize(st);
    st = NULL;
    if (!same || resume != s->resume_id || newest < s->last) {
        series_reset(s);
        s->dev = sb.st_dev;
        s->ino = sb.st_ino;
        s->resume_id = resume;
    }
    /* The table's own last step (the layers table may end before the steps table), so
     * that the level read fits the rollup's width at the end. */
    if (sqlite3_prepare_v2(db, s->kind->last, -1, &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW)
        DB_FAIL(rc, out);
    newest = (long)sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    st = NULL;
    /* A long stretch not read yet comes out of the summary, where the run has it. */
    long upto[KILN_RUN_METRICS_SUM_LEVELS], last = newest < to ? newest : to;
    bool any;
    int lv = sums_level(db, s->kind, last, upto, &any);
    if (lv >= 0) {
        long w = KILN_RUN_METRICS_SUM_WIDTH(lv), a = (s->last + w) / w * w;
        long b = to < upto[lv] ? (to + 1) / w * w : upto[lv];
        if (b > a) {
            KILN_CHECK(rc, out, series_rows(db, run_dir, a - 1, s));
            KILN_CHECK(rc, out, series_sums(db, run_dir, lv, a / w, b / w, s));
            s->last = b - 1;
        }
    }
    rc = series_rows(db, run_dir, to, s);
out:
    sqlite3_finalize(st);
    return rc;
}

/* c: r's points cut to `buckets` buckets of the steps logged (x, y: KILN_ROLLUP_MAX each,
 * scratch). */
static kiln_err curve_fill(const kiln_rollup *r, size_t buckets, kiln_run_curve *c, double *x,
                           double *y) {
    size_t n = kiln_rollup_points(r, x, y);
    size_t m = n > KILN_DOWNSAMPLE_MAX(buckets) ? KILN_DOWNSAMPLE_MAX(buckets) : n;
    c->x = kiln_malloc((m ? m : 1) * sizeof(double));
    c->y = kiln_malloc((m ? m : 1) * sizeof(double));
    if (!c->x || !c->y) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (n > m) {
        c->n = kiln_downsample_array(x, y, n, buckets, c->x, c->y);
    } else {
        memcpy(c->x, x, n * sizeof *x);
        memcpy(c->y, y, n * sizeof *y);
        c->n = n;
    }
    return KILN_OK;
}

/* Curves cs->c[at + i * stride + k] (k < per, i * per + k < s->n) out of s's rollups. */
static kiln_err series_curves(const series_state *s, size_t buckets, kiln_run_curves *cs,
                              size_t at, size_t stride) {
    double *x = kiln_malloc(KILN_ROLLUP_MAX * sizeof *x), *y = kiln_malloc(KILN_ROLLUP_MAX * sizeof *y);
    kiln_err rc = KILN_OK;
    size_t per = (size_t)s->kind->per;
    KILN_CHECK_IF(rc, out, !x || !y, KILN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < s->n; i++)
        KILN_CHECK(rc, out, curve_fill(&s->r[i], buckets, &cs->c[at + i / per * stride + i % per], x, y));
out:
    free(x);
    free(y);
    return rc;
}

/* The steps table's curves out of s, each cut to `buckets` buckets of the steps logged. */
static kiln_err steps_curves(const series_state *s, size_t buckets, kiln_run_curves *cs,
                             size_t *cap) {
    size_t at = cs->n;
    for (size_t k = 0; k < N_STEP_COLS; k++)
        if (!add(cs, cap, kiln_strdup(step_cols[k]))) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    return series_curves(s, buckets, cs, at, N_STEP_COLS);
}

/* ---- the cache kiln runs serve keeps ---- */

#define CACHE_RUNS 16

struct kiln_run_cache {
    pthread_mutex_t mu;
    struct {
        char *dir;
        series_state *st; /* the steps table's */
        unsigned long long used;
    } e[CACHE_RUNS];
    unsigned long long tick;
};

kiln_err kiln_run_cache_create(kiln_run_cache **out) {
    *out = kiln_calloc(1, sizeof **out);
    if (!*out) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&(*out)->mu, NULL);
    return KILN_OK;
}

void kiln_run_cache_free(kiln_run_cache *c) {
    if (!c) return;
    for (size_t i = 0; i < CACHE_RUNS; i++) {
        free(c->e[i].dir);
        series_free(c->e[i].st);
        free(c->e[i].st);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* The cache's state for run_dir (the least recently used one given over when full), or NULL
 * when out of memory. Called with the lock held. */
static series_state *cache_entry(kiln_run_cache *c, const char *run_dir) {
    size_t lru = 0;
    for (size_t i = 0; i < CACHE_RUNS; i++) {
        if (c->e[i].dir && !strcmp(c->e[i].dir, run_dir)) {
            c->e[i].used = ++c->tick;
            return c->e[i].st;
        }
        if (c->e[i].used < c->e[lru].used) lru = i;
    }
    char *dir = kiln_strdup(run_dir);
    series_state *st = c->e[lru].st;
    if (!st && (st = kiln_malloc(sizeof *st)) &&
        series_init(st, KILN_RUN_METRICS_STEP_SUMS, N_STEP_COLS) != KILN_OK) {
        free(st);
        st = NULL;
    }
    if (!dir || !st) {
        free(dir);
        if (st != c->e[lru].st) {
            series_free(st);
            free(st);
        }
        return NULL;
    }
    series_reset(st);
    free(c->e[lru].dir);
    c->e[lru].dir = dir;
    c->e[lru].st = st;
    c->e[lru].used = ++c->tick;
    return st;
}

static int cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* The steps the layers and tensors tables are read at: every one (NULL, a whole read) for a
 * short run; else evenly spaced ones and every spike and non-finite step, ascending. */
static kiln_err sample_steps(sqlite3 *db, const char *run_dir, const kiln_run_curves *cs,
                             long **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    long span = cs->last - cs->first + 1;
    if (span <= KILN_RUN_CURVE_SAMPLES) return KILN_OK;
    kiln_err rc = KILN_OK;
    sqlite3_stmt *st = NULL;
    size_t cap = KILN_RUN_CURVE_SAMPLES + 64, n = 0;
    long *s = kiln_malloc(cap * sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    for (long k = 0; k < KILN_RUN_CURVE_SAMPLES; k++)
        s[n++] = cs->first + (long)((double)(span - 1) * (double)k / (KILN_RUN_CURVE_SAMPLES - 1));
    if (sqlite3_prepare_v2(db,
                           "SELECT DISTINCT step FROM events WHERE kind IN ('spike', 'nonfinite') "
                           "AND step BETWEEN ?1 AND ?2 ORDER BY step LIMIT 10000",
                           -1, &st, NULL) != SQLITE_OK)
        DB_FAIL(rc, out);
    sqlite3_bind_int64(st, 1, cs->first);
    sqlite3_bind_int64(st, 2, cs->last);
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        if (n == cap) {
            long *p = realloc(s, 2 * cap * sizeof *p);
            if (!p) {
                rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
                goto out;
            }
            s = p;
            cap *= 2;
        }
        s[n++] = (long)sqlite3_column_int64(st, 0);
    }
    if (r != SQLITE_DONE) DB_FAIL(rc, out);
    qsort(s, n, sizeof *s, cmp_long);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (!u || s[i] != s[u - 1]) s[u++] = s[i];
    *out = s;
    *n_out = u;
    s = NULL;
out:
    free(s);
    sqlite3_finalize(st);
    return rc;
}

/* Run a query (whole, with ?1 the last step read; or once per sampled step bound to ?1) and
 * hand each row to fn. */
typedef kiln_err (*row_fn)(sqlite3_stmt *st, void *ctx);
static kiln_err each_row(sqlite3 *db, const char *run_dir, const char *whole, const char *at_step,
                         const long *steps, size_t n_steps, long to, row_fn fn, void *ctx) {
    kiln_err rc = KILN_OK;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, steps ? at_step : whole, -1, &st, NULL) != SQLITE_OK)
        DB_FAIL(rc, out);
    for (size_t i = 0; i < (steps ? n_steps : 1) && !rc; i++) {
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, steps ? steps[i] : to);
        int r;
        while (!rc && (r = sqlite3_step(st)) == SQLITE_ROW)
            rc = fn(st, ctx);
        if (!rc && r != SQLITE_DONE) DB_FAIL(rc, out);
    }
out:
    sqlite3_finalize(st);
    return rc;
}

/* ---- layers ---- */

typedef struct layer_ctx {
    int L, E;
    bool scalars; /* push the scalar columns too (else they come from layer_sums) */
    grow *g;      /* [L * (N_LAYER_COLS + E)] */
} layer_ctx;

static kiln_err layer_row(sqlite3_stmt *st, void *p) {
    layer_ctx *c = p;
    long layer = (long)sqlite3_column_int64(st, 1);
    if (layer < 0 || layer >= c->L) return KILN_OK;
    double x = (double)sqlite3_column_int64(st, 0);
    grow *g = &c->g[(size_t)layer * (N_LAYER_COLS + (size_t)c->E)];
    for (size_t k = 0; c->scalars && k < N_LAYER_COLS; k++)
        KILN_TRY(push(&g[k], x, kiln_run_col_num(st, (int)k + 2)));
    /* expert_load: "[0.25,0.125,...]" as the trainer writes it. */
    const char *t = (const char *)sqlite3_column_text(st, 8);
    for (int e = 0; e < c->E; e++) {
        double v = NAN;
        if (t) {
            while (*t == '[' || *t == ',' || *t == ' ')
                t++;
            char *end;
            v = strtod(t, &end);
            if (end == t) {
                v = NAN;
                t = NULL;
            } else {
                t = end;
            }
        }
        KILN_TRY(push(&g[N_LAYER_COLS + (size_t)e], x, v));
    }
    return KILN_OK;
}

/* The layers table's curves: read whole (steps NULL) or at the sampled steps; but for a
 * sampled run with layer_sums, the scalar columns exact out of the summary as the steps
 * table's, cut to `buckets` (only expert_load sampled). */
static kiln_err read_layers(sqlite3 *db, const char *run_dir, const long *steps, size_t n_steps,
                            long to, size_t buckets, kiln_run_curves *cs, size_t *cap) {
    kiln_err rc = KILN_OK;
    sqlite3_stmt *st = NULL;
    layer_ctx c = {0};
    if (sqlite3_prepare_v2(db,
                           "SELECT count(*), max(expert_load) FROM layers WHERE step = "
                           "(SELECT step FROM layers ORDER BY step LIMIT 1)",
                           -1, &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW)
        DB_FAIL(rc, out);
    c.L = (int)sqlite3_column_int64(st, 0);
    const char *load = (const char *)sqlite3_column_text(st, 1);
    if (load && strcmp(load, "[]"))
        for (c.E = 1; *load; load++)
            c.E += *load == ',';
    sqlite3_finalize(st);
    st = NULL;
    if (!c.L) goto out;
    cs->n_layers = c.L;
    cs->n_experts = c.E;
    size_t per = N_LAYER_COLS + (size_t)c.E, base = cs->n;
    for (int l = 0; l < c.L; l++) {
        for (size_t k = 0; k < N_LAYER_COLS; k++)
            if (!add(cs, cap, kiln_asprintf("%s@%d", layer_cols[k], l)))
                return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        for (int e = 0; e < c.E; e++)
            if (!add(cs, cap, kiln_asprintf("expert_load@%d/%d", l, e)))
                return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    c.g = kiln_calloc((size_t)c.L * per, sizeof *c.g);
    if (!c.g) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < (size_t)c.L * per; i++)
        c.g[i].c = &cs->c[base + i];
    long upto[KILN_RUN_METRICS_SUM_LEVELS];
    bool summed = false;
    if (steps)
        sums_level(db, kiln_run_metrics_sums_of(KILN_RUN_METRICS_LAYER_SUMS), 0, upto, &summed);
    c.scalars = !summed;
    if (summed) {
        series_state ls;
        size_t n = (size_t)(c.L < KILN_RUN_METRICS_SUM_LAYERS ? c.L : KILN_RUN_METRICS_SUM_LAYERS);
        KILN_CHECK(rc, out, series_init(&ls, KILN_RUN_METRICS_LAYER_SUMS, n * N_LAYER_COLS));
        rc = series_update(db, run_dir, to, &ls);
        if (!rc) rc = series_curves(&ls, buckets, cs, base, per);
        series_free(&ls);
        if (rc) goto out;
        cs->layers_summed = true;
    }
    rc = each_row(db, run_dir,
                  "SELECT step, layer, attn_entropy, router_entropy, load_imbalance, "
                  "dead_experts, overflow, act_rms, expert_load FROM layers WHERE step <= ?1 "
                  "ORDER BY step, layer",
                  "SELECT step, layer, attn_entropy, router_entropy, load_imbalance, "
                  "dead_experts, overflow, act_rms, expert_load FROM layers WHERE step = ?1 "
                  "ORDER BY layer",
                  steps, n_steps, to, layer_row, &c);
out:
    free(c.g);
    sqlite3_finalize(st);
    return rc;
}

/* ---- tensors ---- */

typedef struct tensor_ctx {
    char *names[MAX_TENSORS];
    kiln_run_curve gn[MAX_TENSORS], ur[MAX_TENSORS];
    grow ggn[MAX_TENSORS], gur[MAX_TENSORS];
    double top[MAX_TENSORS];
    size_t n;
    size_t last; /* the index found last: rows come in the same order each step */
} tensor_ctx;

static kiln_err tensor_row(sqlite3_stmt *st, void *p) {
    tensor_ctx *c = p;
    const char *name = (const char *)sqlite3_column_text(st, 1);
    if (!name) return KILN_OK;
    size_t i = c->last + 1 < c->n ? c->last + 1 : 0;
    if (i >= c->n || strcmp(c->names[i], name)) {
        for (i = 0; i < c->n && strcmp(c->names[i], name); i++)
            ;
        if (i == c->n) {
            if (c->n == MAX_TENSORS) return KILN_OK;
            if (!(c->names[i] = kiln_strdup(name)))
                return kiln_fail(KILN_ERR_NOMEM, "out of memory");
            c->ggn[i].c = &c->gn[i];
            c->gur[i].c = &c->ur[i];
            c->top[i] = -INFINITY;
            c->n++;
        }
    }
    c->last = i;
    double x = (double)sqlite3_column_int64(st, 0), u = kiln_run_col_num(st, 3);
    if (isfinite(u) && u > c->top[i]) c->top[i] = u;
    KILN_TRY(push(&c->ggn[i], x, kiln_run_col_num(st, 2)));
    return push(&c->gur[i], x, u);
}

/* Every named tensor's curves into c exact out of tensor_sums (as the steps table's out of
 * step_sums), cut to `buckets`; its top the true highest update ratio. */
static kiln_err tensor_sums(sqlite3 *db, const char *run_dir, long to, size_t buckets,
                            tensor_ctx *c) {
    kiln_err rc = KILN_OK;
    sqlite3_stmt *st = NULL;
    series_state ts = {0};
    double *x = NULL, *y = NULL;
    long id[MAX_TENSORS], top = -1;
    if (sqlite3_prepare_v2(db, "SELECT id, name FROM tensor_names WHERE id >= 0 AND id < ?1 "
                               "AND name IS NOT NULL ORDER BY id", -1, &st, NULL) != SQLITE_OK)
        DB_FAIL(rc, out);
    sqlite3_bind_int64(st, 1, KILN_RUN_METRICS_SUM_LAYERS);
    int r = SQLITE_DONE;
    while (c->n < MAX_TENSORS && (r = sqlite3_step(st)) == SQLITE_ROW) {
        id[c->n] = top = (long)sqlite3_column_int64(st, 0);
        KILN_CHECK_IF(rc, out,
                      !(c->names[c->n] = kiln_strdup((const char *)sqlite3_column_text(st, 1))),
                      KILN_ERR_NOMEM, "out of memory");
        c->n++;
    }
    if (c->n < MAX_TENSORS && r != SQLITE_DONE) DB_FAIL(rc, out);
    KILN_CHECK(rc, out,
               series_init(&ts, KILN_RUN_METRICS_TENSOR_SUMS,
                           (size_t)(top + 1) * KILN_RUN_METRICS_TENSOR_COLS));
    KILN_CHECK(rc, out, series_update(db, run_dir, to, &ts));
    x = kiln_malloc(KILN_ROLLUP_MAX * sizeof *x);
    y = kiln_malloc(KILN_ROLLUP_MAX * sizeof *y);
    KILN_CHECK_IF(rc, out, !x || !y, KILN_ERR_NOMEM, "out of memory");
    size_t n = 0; /* (a tensor without rows up to `to` is left out, as a sampled read has it) */
    for (size_t i = 0; i < c->n; i++) {
        const kiln_rollup *rr = &ts.r[(size_t)id[i] * KILN_RUN_METRICS_TENSOR_COLS];
        KILN_CHECK(rc, out, curve_fill(&rr[0], buckets, &c->gn[n], x, y));
        KILN_CHECK(rc, out, curve_fill(&rr[1], buckets, &c->ur[n], x, y));
        char *name = c->names[i];
        c->names[i] = NULL;
        c->names[n] = name;
        if (!c->gn[n].n && !c->ur[n].n) {
            free(name);
            c->names[n] = NULL;
            curve_free(&c->gn[n]);
            curve_free(&c->ur[n]);
            continue;
        }
        c->top[n] = -INFINITY;
        for (size_t k = 0; k < c->ur[n].n; k++) /* the bucket maxima are kept */
            if (isfinite(c->ur[n].y[k]) && c->ur[n].y[k] > c->top[n]) c->top[n] = c->ur[n].y[k];
        n++;
    }
    c->n = n;
out:
    free(x);
    free(y);
    series_free(&ts);
    sqlite3_finalize(st);
    return rc;
}

/* The tensors table's curves: read whole (steps NULL) or at the sampled steps; but for a
 * sampled run with tensor_sums, exact out of the summary, the movers by their true maxima. */
static kiln_err read_tensors(sqlite3 *db, const char *run_dir, const long *steps, size_t n_steps,
                             long to, size_t buckets, size_t max_movers, kiln_run_curves *cs,
                             size_t *cap) {
    tensor_ctx *c = kiln_calloc(1, sizeof *c);
    if (!c) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    long upto[KILN_RUN_METRICS_SUM_LEVELS];
    bool summed = false;
    if (steps)
        sums_level(db, kiln_run_metrics_sums_of(KILN_RUN_METRICS_TENSOR_SUMS), 0, upto, &summed);
    kiln_err rc;
    if (summed) {
        rc = tensor_sums(db, run_dir, to, buckets, c);
        cs->tensors_summed = !rc;
    } else {
        rc = each_row(
            db, run_dir,
            "SELECT step, name, grad_norm, update_ratio FROM tensors WHERE step <= ?1 ORDER BY step",
            "SELECT step, name, grad_norm, update_ratio FROM tensors WHERE step = ?1", steps,
            n_steps, to, tensor_row, c);
    }
    /* The movers: the highest update ratios, ties by name. */
    size_t want = max_movers < c->n ? max_movers : c->n;
    if (!rc && want) {
        cs->movers = kiln_calloc(want, sizeof *cs->movers);
        if (!cs->movers) rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    bool *taken = rc ? NULL : kiln_calloc(c->n + 1, sizeof *taken);
    if (!rc && !taken) rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    for (size_t m = 0; !rc && m < want; m++) {
        size_t best = c->n;
        for (size_t i = 0; i < c->n; i++)
            if (!taken[i] && (best == c->n || c->top[i] > c->top[best] ||
                              (c->top[i] == c->top[best] && strcmp(c->names[i], c->names[best]) < 0)))
                best = i;
        taken[best] = true;
        cs->movers[cs->n_movers++] = c->names[best];
        c->names[best] = NULL;
        for (int k = 0; k < 2 && !rc; k++) {
            kiln_run_curve *src = k ? &c->ur[best] : &c->gn[best];
            kiln_run_curve *dst =
                add(cs, cap,
                    kiln_asprintf("%s@%s", k ? "update_ratio" : "grad_norm",
                                  cs->movers[cs->n_movers - 1]));
            if (!dst) {
                rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
                break;
            }
            dst->n = src->n;
            dst->x = src->x;
            dst->y = src->y;
            src->x = src->y = NULL;
        }
    }
    free(taken);
    for (size_t i = 0; i < c->n; i++) {
        free(c->names[i]);
        curve_free(&c->gn[i]);
        curve_free(&c->ur[i]);
    }
    free(c);
    return rc;
}

static kiln_err curves_load(kiln_run_cache *cache, const char *run_dir, size_t buckets,
                            size_t max_movers, long to, kiln_run_curves *out) {
    memset(out, 0, sizeof *out);
    if (!buckets) buckets = 1;
    if (!max_movers) max_movers = 8;
    if (to <= 0) to = LONG_MAX;
    kiln_run_metrics *mx = NULL;
    KILN_TRY(kiln_run_open_metrics(run_dir, NULL, &mx));
    sqlite3 *db = kiln_run_metrics_db(mx);
    sqlite3_stmt *st = NULL;
    long *steps = NULL;
    size_t n_steps = 0, cap = 0;
    series_state *own = NULL;
    bool locked = false;
    kiln_err rc = KILN_OK;
    /* One read transaction: the curves are of one moment of a run that trains meanwhile. */
    if (sqlite3_exec(db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK) DB_FAIL(rc, out);
    /* (min() and max() under a WHERE would read every row; these seek by the key.) */
    if (sqlite3_prepare_v2(db,
                           "SELECT (SELECT step FROM steps ORDER BY step LIMIT 1), (SELECT step "
                           "FROM steps WHERE step <= ?1 ORDER BY step DESC LIMIT 1)",
                           -1, &st, NULL) != SQLITE_OK)
        DB_FAIL(rc, out);
    sqlite3_bind_int64(st, 1, to);
    if (sqlite3_step(st) != SQLITE_ROW) DB_FAIL(rc, out);
    out->first = (long)sqlite3_column_int64(st, 0);
    out->last = (long)sqlite3_column_int64(st, 1);
    sqlite3_finalize(st);
    st = NULL;
    series_state *ss;
    if (cache) {
        pthread_mutex_lock(&cache->mu);
        locked = true;
        ss = cache_entry(cache, run_dir);
    } else {
        ss = own = kiln_malloc(sizeof *own);
        if (own && series_init(own, KILN_RUN_METRICS_STEP_SUMS, N_STEP_COLS) != KILN_OK) {
            free(own);
            ss = own = NULL;
        }
    }
    KILN_CHECK_IF(rc, out, !ss, KILN_ERR_NOMEM, "out of memory");
    rc = series_update(db, run_dir, to, ss);
    if (!rc) rc = steps_curves(ss, buckets, out, &cap);
    if (rc && cache) series_reset(ss); /* half read: start over next time */
    if (locked) pthread_mutex_unlock(&cache->mu);
    locked = false;
    if (rc) goto out;
    KILN_CHECK(rc, out, sample_steps(db, run_dir, out, &steps, &n_steps));
    out->sampled = steps != NULL;
    KILN_CHECK(rc, out, read_layers(db, run_dir, steps, n_steps, to, buckets, out, &cap));
    KILN_CHECK(rc, out,
               read_tensors(db, run_dir, steps, n_steps, to, buckets, max_movers, out, &cap));
out:
    if (locked) pthread_mutex_unlock(&cache->mu);
    series_free(own);
    free(own);
    sqlite3_finalize(st);
    free(steps);
    if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    kiln_run_metrics_close(mx);
    if (rc) kiln_run_curves_release(out);
    return rc;
}

kiln_err kiln_run_curves_load(const char *run_dir, size_t buckets, size_t max_movers, long to,
                              kiln_run_curves *out) {
    return curves_load(NULL, run_dir, buckets, max_movers, to, out);
}

kiln_err kiln_run_curves_load_cached(kiln_run_cache *cache, const char *run_dir, size_t buckets,
                                     size_t max_movers, kiln_run_curves *out) {
    return curves_load(cache, run_dir, buckets, max_movers, 0, out);
}

/* ---- the run summary a release carries ---- */

/* A curve as {"step": [...], "value": [...]}, cut to at most KILN_RUN_SUMMARY_POINTS points
 * (non-finite values are null). NULL when out of memory. */
static json_t *summary_curve(const kiln_run_curve *c) {
    enum { B = (KILN_RUN_SUMMARY_POINTS - 2) / 3 };
    double x[KILN_DOWNSAMPLE_MAX(B)], y[KILN_DOWNSAMPLE_MAX(B)];
    size_t n = kiln_downsample_array(c->x, c->y, c->n, B, x, y);
    json_t *o = json_object(), *xs = json_array(), *ys = json_array();
    if (!o || !xs || !ys || json_object_set_new(o, "step", xs) || json_object_set_new(o, "value", ys)) {
        json_decref(o);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        if (json_array_append_new(xs, json_integer((json_int_t)x[i])) ||
            json_array_append_new(ys, isfinite(y[i]) ? json_real(y[i]) : json_null())) {
            json_decref(o);
            return NULL;
        }
    return o;
}

kiln_err kiln_run_summary_write(const char *run_dir, long step, const char *path) {
    json_t *run = NULL;
    kiln_run_metrics *mx = NULL;
    KILN_TRY(kiln_run_open_metrics(run_dir, &run, &mx));
    kiln_run_curves cv;
    kiln_err rc = kiln_run_curves_load(run_dir, KILN_RUN_SUMMARY_POINTS, 8, step, &cv);
    json_t *doc = NULL, *series = NULL, *events = NULL, *movers = NULL;
    sqlite3_stmt *st = NULL;
    char *text = NULL;
    if (rc) goto out;
    doc = json_object();
    series = json_object();
    events = json_array();
    movers = json_array();
    const char *rid = json_string_value(json_object_get(run, "run_id"));
    KILN_CHECK_IF(
        rc, out,
        !doc || !series || !events || !movers ||
            json_object_set_new(doc, "format", json_string("kiln-run-summary/1")) ||
            json_object_set_new(doc, "run_id", rid ? json_string(rid) : json_null()) ||
            json_object_set_new(doc, "step", json_integer(step)) ||
            json_object_set_new(doc, "first", json_integer(cv.first)) ||
            json_object_set_new(doc, "last", json_integer(cv.last)) ||
            json_object_set_new(doc, "sampled", json_boolean(cv.sampled)) ||
            json_object_set_new(doc, "n_layers", json_integer(cv.n_layers)) ||
            json_object_set_new(doc, "n_experts", json_integer(cv.n_experts)) ||
            json_object_set(doc, "series", series) || json_object_set(doc, "events", events) ||
            json_object_set(doc, "movers", movers),
        KILN_ERR_NOMEM, "out of memory");
    /* The config the run trained with, as run.json holds it: signed with the archive beside
     * the card's, so that kiln reproduce can name the key where a card's config was altered
     * (the run id, a digest, can only say that it was). */
    const json_t *cfg = json_object_get(run, "config");
    if (json_is_object(cfg))
        KILN_CHECK_IF(rc, out, json_object_set_new(doc, "config", json_deep_copy(cfg)),
                      KILN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < cv.n; i++) {
        json_t *c = cv.c[i].n ? summary_curve(&cv.c[i]) : NULL;
        KILN_CHECK_IF(rc, out, cv.c[i].n && (!c || json_object_set_new(series, cv.c[i].name, c)),
                      KILN_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < cv.n_movers; i++)
        KILN_CHECK_IF(rc, out, json_array_append_new(movers, json_string(cv.movers[i])),
                      KILN_ERR_NOMEM, "out of memory");
    /* The events a chart marks, in the order logged; never their times. */
    sqlite3 *db = kiln_run_metrics_db(mx);
    KILN_CHECK_IF(rc, out,
                  sqlite3_prepare_v2(db,
                                     "SELECT step, kind, message FROM events WHERE step <= ?1 AND "
                                     "kind IN ('spike', 'nonfinite', 'resume', 'device_change', "
                                     "'ckpt_skipped') ORDER BY id LIMIT 1000",
                                     -1, &st, NULL) != SQLITE_OK,
                  KILN_ERR_IO, "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
    sqlite3_bind_int64(st, 1, step > 0 ? step : LONG_MAX);
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *k = (const char *)sqlite3_column_text(st, 1),
                   *m = (const char *)sqlite3_column_text(st, 2);
        json_t *e = json_pack("{s:I,s:s,s:s}", "step", (json_int_t)sqlite3_column_int64(st, 0),
                              "kind", k ? k : "", "message", m ? m : "");
        KILN_CHECK_IF(rc, out, !e || json_array_append_new(events, e), KILN_ERR_NOMEM,
                      "out of memory");
    }
    text = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    KILN_CHECK_IF(rc, out, !text, KILN_ERR_NOMEM, "out of memory");
    rc = kiln_write_file_atomic(path, text, strlen(text));
out:
    free(text);
    sqlite3_finalize(st);
    json_decref(series);
    json_decref(events);
    json_decref(movers);
    json_decref(doc);
    kiln_run_curves_release(&cv);
    kiln_run_metrics_close(mx);
    json_decref(run);
    return rc;
}

kiln_err kiln_run_summary_add(void *ctx, long step, const char *dir) {
    const char *run_dir = ctx;
    char *db = kiln_path_join(run_dir, "metrics.db");
    char *path = kiln_path_join(dir, KILN_RUN_SUMMARY_NAME);
    kiln_err rc = !db || !path ? kiln_fail(KILN_ERR_NOMEM, "out of memory")
                  : kiln_path_exists(db) ? kiln_run_summary_write(run_dir, step, path)
                                         : KILN_OK;
    free(db);
    free(path);
    return rc;
}

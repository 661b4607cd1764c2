/* explain.c - why a step went wrong (kiln runs explain): a spike or a non-finite step set
 * against the steps before it, tensor by tensor and layer by layer, from what metrics.db
 * holds for every step (the steps, layers and tensors tables). Read-only. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "runs_int.h"

#define ELEVATED 3.0     /* a gradient norm over this many times its median has risen */
#define UPDATE_LOOK 8    /* the steps before the one explained whose updates are looked at */
#define UPDATE_JUMP 10.0 /* an update this many times its tensor's median stands out */
#define FELL 0.5         /* an entropy below this share of its median has collapsed */
#define ACT_GROWN 4.0    /* a block's output RMS this many times its median has grown */
#define IMBALANCED 2.0   /* a load imbalance this many times its median */
#define EARLY 16         /* the run's first steps, against which drift over the run is seen */
#define DRIFT 0.1        /* an entropy below this share of where it began has collapsed */

/* The rows of one key (a tensor, a layer, or the steps table) over the steps looked at,
 * ascending, each with ncol values. */
typedef struct track {
    char *name; /* tensor name; NULL for layers and steps */
    long layer;
    size_t n, cap;
    long *step;
    double *v; /* [n * ncol] */
} track;

static void tracks_free(track *t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(t[i].name);
        free(t[i].step);
        free(t[i].v);
    }
    free(t);
}

/* The rows of sql (key, step, ncol values; ordered by key, then step; ?1 and ?2 the first and
 * last step) into one track per key. text_key: the key is a tensor name, else a number. */
static kiln_err read_tracks(sqlite3 *db, const char *run_dir, const char *sql, long from, long to,
                            int ncol, bool text_key, track **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    sqlite3_stmt *s = NULL;
    track *t = NULL;
    size_t n = 0, cap = 0;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK, KILN_ERR_IO,
                  "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
    sqlite3_bind_int64(s, 1, from);
    sqlite3_bind_int64(s, 2, to);
    int r;
    while ((r = sqlite3_step(s)) == SQLITE_ROW) {
        const char *name = text_key ? (const char *)sqlite3_column_text(s, 0) : NULL;
        long layer = text_key ? 0 : (long)sqlite3_column_int64(s, 0);
        bool same =
            n && (text_key ? !strcmp(t[n - 1].name, name ? name : "") : t[n - 1].layer == layer);
        if (!same) {
            if (n == cap) {
                size_t c = cap ? 2 * cap : 16;
                track *g = realloc(t, c * sizeof *g);
                KILN_CHECK_IF(rc, out, !g, KILN_ERR_NOMEM, "out of memory");
                t = g;
                cap = c;
            }
            memset(&t[n], 0, sizeof t[n]);
            t[n].layer = layer;
            n++;
            if (text_key)
                KILN_CHECK_IF(rc, out, !(t[n - 1].name = kiln_strdup(name ? name : "")),
                              KILN_ERR_NOMEM, "out of memory");
        }
        track *k = &t[n - 1];
        if (k->n == k->cap) {
            size_t c = k->cap ? 2 * k->cap : 64;
            long *st = realloc(k->step, c * sizeof *st);
            if (st) k->step = st;
            double *v = st ? realloc(k->v, c * (size_t)ncol * sizeof *v) : NULL;
            if (v) k->v = v;
            KILN_CHECK_IF(rc, out, !st || !v, KILN_ERR_NOMEM, "out of memory");
            k->cap = c;
        }
        k->step[k->n] = (long)sqlite3_column_int64(s, 1);
        for (int c = 0; c < ncol; c++)
            k->v[k->n * (size_t)ncol + (size_t)c] = kiln_run_col_num(s, 2 + c);
        k->n++;
    }
    KILN_CHECK_IF(rc, out, r != SQLITE_DONE, KILN_ERR_IO, "'%s/metrics.db': %s", run_dir,
                  sqlite3_errmsg(db));
    *out = t;
    *n_out = n;
    t = NULL;
    n = 0;
out:
    tracks_free(t, n);
    sqlite3_finalize(s);
    return rc;
}

/* One column of a track at step `at` set against the rows before it. */
typedef struct col_stat {
    double value;  /* at `at`; NAN when not finite or not logged */
    double median; /* of the finite values before `at`; NAN: none */
    double max;    /* of the finite values before `at`; NAN: none */
    long since;    /* the first step of the unbroken run of rows up to `at` above
                      ELEVATED times the median; 0 when `at` is not above it */
    bool logged;   /* the track has a row at `at` */
    size_t n_before;
} col_stat;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..m) (sorted in place); NAN when m is 0. */
static double median(double *v, size_t m) {
    if (!m) return NAN;
    qsort(v, m, sizeof *v, cmp_double);
    return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

static col_stat stat_of(const track *t, int ncol, int c, long at, double *scratch) {
    col_stat st = {.value = NAN, .median = NAN, .max = NAN};
    size_t m = 0;
    for (size_t i = 0; i < t->n; i++) {
        double x = t->v[i * (size_t)ncol + (size_t)c];
        if (t->step[i] == at) {
            st.logged = true;
            st.value = x;
        } else if (t->step[i] < at && isfinite(x)) {
            scratch[m++] = x;
            if (!(x <= st.max)) st.max = x;
        }
    }
    st.n_before = m;
    st.median = median(scratch, m);
    if (!isfinite(st.value)) st.value = NAN;
    if (isfinite(st.value) && st.median > 0 && st.value > ELEVATED * st.median) {
        for (size_t i = t->n; i-- > 0;) {
            if (t->step[i] > at) continue;
            double x = t->v[i * (size_t)ncol + (size_t)c];
            if (!(isfinite(x) && x > ELEVATED * st.median)) break;
            st.since = t->step[i];
        }
    }
    return st;
}

static double ratio(col_stat s) {
    return s.median > 0 ? s.value / s.median : NAN;
}

static json_t *num(double x) {
    return isfinite(x) ? json_real(x) : json_null();
}

/* {"value", "median", "ratio"} (null where not finite), with "since" when asked. */
static json_t *stat_json(col_stat s, bool since) {
    json_t *o = json_pack("{s:o,s:o,s:o}", "value", num(s.value), "median", num(s.median), "ratio",
                          num(ratio(s)));
    if (o && since &&
        json_object_set_new(o, "since", s.since ? json_integer(s.since) : json_null())) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Where a tensor sits in the network, bottom (the embedding, -1) to top (the head): blocks
 * by number, the final norm and head above them. The backward pass walks it downwards. */
static double depth_of(const char *name, long n_layers) {
    if (!strncmp(name, "blocks.", 7)) return strtod(name + 7, NULL);
    if (!strncmp(name, "head.", 5)) return (double)n_layers + 1;
    if (!strncmp(name, "final_norm.", 11)) return (double)n_layers;
    return -1;
}

static char *depth_name(double d, long n_layers) {
    if (d < 0) return kiln_strdup("the embedding");
    if (d >= (double)n_layers + 1) return kiln_strdup("the head");
    if (d >= (double)n_layers) return kiln_strdup("the final norm");
    return kiln_asprintf("block %ld", (long)d);
}

/* A finding: {"kind", "text"}, the text a sentence (docs/train.md lists the kinds); out of
 * memory leaves the list short and sets *oom. */
static void say(json_t *findings, bool *oom, const char *kind, const char *fmt, ...)
    KILN_PRINTF(4, 5);
static void say(json_t *findings, bool *oom, const char *kind, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (json_array_append_new(findings, json_pack("{s:s,s:s}", "kind", kind, "text", buf)))
        *oom = true;
}

enum { S_LOSS, S_GNORM, S_LR, S_MAXOUT, S_MSE, S_APPLIED, S_NCOL };
enum { T_GNORM, T_UPDATE, T_NCOL };
enum { L_ATTN, L_ROUTER, L_IMBAL, L_DEAD, L_OVERFLOW, L_ACT, L_NCOL };

typedef struct tensor_row {
    const track *t;
    col_stat g;
    double depth;
    double upd_max, upd_median; /* the largest update ratio in the UPDATE_LOOK steps before */
    long upd_step;
} tensor_row;

static int cmp_tensor_row(const void *a, const void *b) {
    const tensor_row *x = a, *y = b;
    /* Not finite first (the step's trouble), then by how far each rose, then by name. */
    bool nx = x->g.logged && !isfinite(x->g.value), ny = y->g.logged && !isfinite(y->g.value);
    if (nx != ny) return nx ? -1 : 1;
    double rx = ratio(x->g), ry = ratio(y->g);
    if (isnan(rx) != isnan(ry)) return isnan(rx) ? 1 : -1;
    if (rx != ry && !isnan(rx)) return rx > ry ? -1 : 1;
    return strcmp(x->t->name, y->t->name);
}

/* A statement of the run's metrics.db, or an error naming it. */
static kiln_err prep(sqlite3 *db, const char *run_dir, const char *sql, sqlite3_stmt **s) {
    if (sqlite3_prepare_v2(db, sql, -1, s, NULL) == SQLITE_OK) return KILN_OK;
    return kiln_fail(KILN_ERR_IO, "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
}

/* The steps of every spike and non-finite event, ascending, into out (the first
 * KILN_EXPLAIN_MAX_TROUBLE) and how many in all into *n. */
static kiln_err trouble_steps(sqlite3 *db, const char *run_dir, json_t *out, long *n) {
    sqlite3_stmt *s = NULL;
    kiln_err rc = prep(db, run_dir,
                       "SELECT step FROM events WHERE kind IN ('spike', 'nonfinite') GROUP BY "
                       "step ORDER BY step",
                       &s);
    int r = SQLITE_DONE;
    for (*n = 0; !rc && (r = sqlite3_step(s)) == SQLITE_ROW; ++*n)
        if (*n < KILN_EXPLAIN_MAX_TROUBLE &&
            json_array_append_new(out, json_integer(sqlite3_column_int64(s, 0))))
            rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!rc && r != SQLITE_DONE)
        rc = kiln_fail(KILN_ERR_IO, "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
    sqlite3_finalize(s);
    return rc;
}

/* The step to explain must have been logged; the run's first and last logged steps. */
static kiln_err check_step(sqlite3 *db, const char *run_dir, long step, long *first_logged,
                           long *last_logged) {
    sqlite3_stmt *s = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK(rc, out,
               prep(db, run_dir,
                    "SELECT (SELECT min(step) FROM steps), (SELECT max(step) FROM steps), "
                    "EXISTS (SELECT 1 FROM steps WHERE step = ?1)",
                    &s));
    sqlite3_bind_int64(s, 1, step);
    KILN_CHECK_IF(rc, out, sqlite3_step(s) != SQLITE_ROW, KILN_ERR_IO, "'%s/metrics.db': %s",
                  run_dir, sqlite3_errmsg(db));
    *first_logged = (long)sqlite3_column_int64(s, 0);
    *last_logged = (long)sqlite3_column_int64(s, 1);
    if (step && !sqlite3_column_int64(s, 2)) {
        if (*last_logged)
            rc = kiln_fail(KILN_ERR_NOTFOUND,
                           "'%s': step %ld was not logged (the run logged steps %ld to %ld)",
                           run_dir, step, *first_logged, *last_logged);
        else
            rc = kiln_fail(KILN_ERR_NOTFOUND, "'%s': step %ld was not logged (no step yet)",
                           run_dir, step);
    }
out:
    sqlite3_finalize(s);
    return rc;
}

static kiln_err step_events(sqlite3 *db, const char *run_dir, long step, json_t *events) {
    sqlite3_stmt *s = NULL;
    kiln_err rc = prep(db, run_dir,
                       "SELECT kind, message FROM events WHERE step = ?1 AND kind NOT IN "
                       "('start', 'resume', 'buckets', 'devices') ORDER BY id",
                       &s);
    if (!rc) sqlite3_bind_int64(s, 1, step);
    int r = SQLITE_DONE;
    while (!rc && (r = sqlite3_step(s)) == SQLITE_ROW) {
        const char *k = (const char *)sqlite3_column_text(s, 0),
                   *m = (const char *)sqlite3_column_text(s, 1);
        if (json_array_append_new(
                events, json_pack("{s:s,s:s}", "kind", k ? k : "", "message", m ? m : "")))
            rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    if (!rc && r != SQLITE_DONE)
        rc = kiln_fail(KILN_ERR_IO, "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
    sqlite3_finalize(s);
    return rc;
}

/* Where the non-finite value came from, said in findings: the forward pass when the loss
 * was not finite (the first block whose output is not), else the backward pass (the top of
 * the tensors whose gradients are not finite, everything above them being finite). */
static void explain_nonfinite(json_t *f, bool *oom, col_stat loss, const track *layers,
                              size_t n_layers, long at, const tensor_row *rows, size_t n_rows,
                              long L, double *scratch) {
    if (!loss.logged) return;
    if (!isfinite(loss.value)) {
        for (size_t i = 0; i < n_layers; i++) {
            col_stat a = stat_of(&layers[i], L_NCOL, L_ACT, at, scratch);
            if (a.logged && !isfinite(a.value)) {
                if (i == 0)
                    say(f, oom, "forward",
                        "the loss was not finite: the forward pass broke in block %ld, the "
                        "first (its output is not finite)",
                        layers[i].layer);
                else {
                    col_stat b = stat_of(&layers[i - 1], L_NCOL, L_ACT, at, scratch);
                    say(f, oom, "forward",
                        "the loss was not finite: the forward pass broke in block %ld (its "
                        "output is not finite; block %ld's RMS was %.4g)",
                        layers[i].layer, layers[i - 1].layer, b.value);
                }
                return;
            }
        }
        say(f, oom, "forward",
            "the loss was not finite though every block's output was: the head or the loss "
            "broke");
        return;
    }
    size_t bad = 0, logged = 0;
    double top = -2;
    for (size_t i = 0; i < n_rows; i++) {
        if (!rows[i].g.logged) continue;
        logged++;
        if (!isfinite(rows[i].g.value)) {
            bad++;
            if (rows[i].depth > top) top = rows[i].depth;
        }
    }
    if (!bad) return;
    char *where = depth_name(top, L);
    if (!where) {
        *oom = true;
        return;
    }
    if (bad == logged)
        say(f, oom, "backward",
            "the loss was finite (%.6g) but every tensor's gradient was not: the backward pass "
            "broke at its start (the head), or the gradients were made non-finite",
            loss.value);
    else
        say(f, oom, "backward",
            "the loss was finite (%.6g) but %zu of %zu tensors' gradients were not: the "
            "backward pass broke in %s (every tensor above it has a finite gradient)",
            loss.value, bad, logged, where);
    free(where);
}

/* A layer's entropy over the run: its median over the run's first EARLY steps (attention
 * and routing start near uniform) against its median over the baseline, recorded in row's
 * figure as "first_steps", and said when it fell below DRIFT of where it began. A run that
 * learns lowers both; one whose attention collapses takes them near 0. Other figures (the
 * output RMS grows as a run learns, by how much depends on its init) are recorded only. */
static void drift(json_t *f, bool *oom, json_t *row, const char *key, const char *what, long L,
                  double early, col_stat base, long at) {
    if (!isfinite(early) || !isfinite(base.median) || early <= 0 || base.median < 0) return;
    json_t *o = json_object_get(row, key);
    if (json_is_object(o) && json_object_set_new(o, "first_steps", json_real(early))) *oom = true;
    if (what && base.median < DRIFT * early)
        say(f, oom, "drift",
            "layer %ld's %s has fallen below a tenth of where it began: %.4g over the run's "
            "first %d steps, %.4g over the %zu before step %ld",
            L, what, early, EARLY, base.median, base.n_before, at);
}

static void explain_layers(json_t *f, bool *oom, const track *layers, size_t n_layers,
                           const track *early, size_t n_early, long at, long n_experts,
                           double *scratch, json_t *out) {
    for (size_t i = 0; i < n_layers; i++) {
        const track *t = &layers[i];
        const track *e0 = NULL;
        for (size_t k = 0; k < n_early && !e0; k++)
            if (early[k].layer == t->layer) e0 = &early[k];
        col_stat a = stat_of(t, L_NCOL, L_ATTN, at, scratch),
                 r = stat_of(t, L_NCOL, L_ROUTER, at, scratch),
                 im = stat_of(t, L_NCOL, L_IMBAL, at, scratch),
                 d = stat_of(t, L_NCOL, L_DEAD, at, scratch),
                 o = stat_of(t, L_NCOL, L_OVERFLOW, at, scratch),
                 act = stat_of(t, L_NCOL, L_ACT, at, scratch);
        json_t *row = json_pack(
            "{s:I,s:o,s:o,s:o,s:{s:o,s:o},s:o,s:o}", "layer", (json_int_t)t->layer, "attn_entropy",
            stat_json(a, false), "router_entropy", n_experts ? stat_json(r, false) : json_null(),
            "load_imbalance", n_experts ? stat_json(im, false) : json_null(), "dead_experts",
            "value", num(d.value), "max_before", num(d.max), "overflow",
            n_experts ? stat_json(o, false) : json_null(), "act_rms", stat_json(act, false));
        if (!row || json_array_append_new(out, row)) {
            *oom = true;
            row = NULL;
        }
        const long L = t->layer;
        if (n_experts && isfinite(r.value) && r.median > 0 && r.value < FELL * r.median)
            say(f, oom, "router",
                "layer %ld's router entropy fell to %.4g from its median %.4g (its router "
                "collapsed onto fewer experts)",
                L, r.value, r.median);
        if (n_experts && isfinite(d.value) && d.value > (isfinite(d.max) ? d.max : 0))
            say(f, oom, "dead_experts",
                "layer %ld: %.0f of %ld experts got no tokens (at most %.0f in the steps before)",
                L, d.value, n_experts, isfinite(d.max) ? d.max : 0);
        if (n_experts && isfinite(im.value) && im.median > 0 && im.value > IMBALANCED * im.median)
            say(f, oom, "load_imbalance",
                "layer %ld's load imbalance (max over mean load) was %.4g against its median %.4g",
                L, im.value, im.median);
        if (isfinite(a.value) && a.median > 0 && a.value < FELL * a.median)
            say(f, oom, "attention",
                "layer %ld's attention entropy fell to %.4g from its median %.4g (attention "
                "collapsed onto few positions)",
                L, a.value, a.median);
        if (isfinite(act.value) && act.median > 0 && act.value > ACT_GROWN * act.median)
            say(f, oom, "act_rms", "layer %ld's output RMS was %.4g, %.1fx its median %.4g", L,
                act.value, act.value / act.median, act.median);
        if (!e0 || !row) continue;
        drift(f, oom, row, "attn_entropy", "attention entropy", L,
              stat_of(e0, L_NCOL, L_ATTN, LONG_MAX, scratch).median, a, at);
        if (n_experts)
            drift(f, oom, row, "router_entropy", "router entropy", L,
                  stat_of(e0, L_NCOL, L_ROUTER, LONG_MAX, scratch).median, r, at);
        drift(f, oom, row, "act_rms", NULL, L, stat_of(e0, L_NCOL, L_ACT, LONG_MAX, scratch).median,
              act, at);
    }
}

/* What kiln_run_explain reads and builds, handed from each of its steps to the next. */
typedef struct explain {
    sqlite3 *db;
    const char *run_dir;
    long step, window; /* the step explained (0: none) and how many steps before it */
    long L, E;         /* the run's n_layers and n_experts */
    track *steps, *tens, *lays, *early;
    size_t n_steps, n_tens, n_lays, n_early;
    tensor_row *rows; /* [n_tens], the trained tensors' first n_rows, sorted */
    size_t n_rows;
    double *scratch;
    json_t *doc;                     /* the answer */
    json_t *findings, *layers, *tjs; /* arrays of doc */
    bool oom;                        /* a finding or a figure was left out for want of memory */
} explain;

/* The step to explain (the one asked, else the run's first spike or non-finite step, else
 * none: x->step 0), checked to have been logged; x->doc begun with the run's figures. */
static kiln_err choose_step(explain *x, bool asked, long total, long *first_logged) {
    long n_trouble = 0, last_logged = 0;
    json_t *trouble = json_array();
    KILN_FAIL_IF(!trouble, KILN_ERR_NOMEM, "out of memory");
    kiln_err rc = trouble_steps(x->db, x->run_dir, trouble, &n_trouble);
    if (!rc && !asked) x->step = (long)json_integer_value(json_array_get(trouble, 0));
    if (!rc) rc = check_step(x->db, x->run_dir, x->step, first_logged, &last_logged);
    if (rc) {
        json_decref(trouble);
        return rc;
    }
    x->doc = json_pack("{s:s,s:s,s:I,s:I,s:I,s:I,s:o}", "format", "kiln-runs-explain/1", "run",
                       x->run_dir, "steps", (json_int_t)total, "last_logged",
                       (json_int_t)last_logged, "trouble_steps", (json_int_t)n_trouble, "window",
                       (json_int_t)x->window, "trouble", trouble);
    KILN_FAIL_IF(!x->doc, KILN_ERR_NOMEM, "out of memory");
    return KILN_OK;
}

/* The step's events and the tracks of the window before it (and of the run's first steps,
 * when the window starts after them), in the caller's read transaction, which ends here. */
static kiln_err read_step(explain *x, bool asked, long first_logged) {
    const long step = x->step, from = step > x->window ? step - x->window : 0;
    json_t *events = json_array();
    KILN_FAIL_IF(!events || json_object_set_new(x->doc, "events", events) ||
                     json_object_set_new(x->doc, "step", json_integer(step)) ||
                     json_object_set_new(x->doc, "chosen",
                                         json_string(asked ? "asked"
                                                           : "the run's first spike or "
                                                             "non-finite step")),
                 KILN_ERR_NOMEM, "out of memory");
    KILN_TRY(step_events(x->db, x->run_dir, step, events));
    KILN_TRY(read_tracks(x->db, x->run_dir,
                         "SELECT 0, step, loss, grad_norm, lr, max_abs_output, mse, applied "
                         "FROM steps WHERE step BETWEEN ?1 AND ?2 ORDER BY step",
                         from, step, S_NCOL, false, &x->steps, &x->n_steps));
    KILN_TRY(read_tracks(x->db, x->run_dir,
                         "SELECT name, step, grad_norm, update_ratio FROM tensors WHERE step "
                         "BETWEEN ?1 AND ?2 ORDER BY name, step",
                         from, step, T_NCOL, true, &x->tens, &x->n_tens));
    static const char layers_sql[] =
        "SELECT layer, step, attn_entropy, router_entropy, load_imbalance, dead_experts, "
        "overflow, act_rms FROM layers WHERE step BETWEEN ?1 AND ?2 ORDER BY layer, step";
    KILN_TRY(read_tracks(x->db, x->run_dir, layers_sql, from, step, L_NCOL, false, &x->lays,
                         &x->n_lays));
    /* The run's first steps, when the baseline starts after them. */
    if (first_logged + EARLY <= from)
        KILN_TRY(read_tracks(x->db, x->run_dir, layers_sql, first_logged, first_logged + EARLY - 1,
                             L_NCOL, false, &x->early, &x->n_early));
    sqlite3_exec(x->db, "COMMIT", NULL, NULL, NULL);
    return KILN_OK;
}

/* The step's own figures against the steps before it, into the doc (with its empty arrays of
 * findings, layers and tensors); the loss and the gradient norm's into *loss and *gn. */
static kiln_err step_figures(explain *x, col_stat *loss, col_stat *gn) {
    const track *st = &x->steps[0];
    const long step = x->step;
    double *scratch = x->scratch;
    *loss = stat_of(st, S_NCOL, S_LOSS, step, scratch);
    *gn = stat_of(st, S_NCOL, S_GNORM, step, scratch);
    col_stat lr = stat_of(st, S_NCOL, S_LR, step, scratch),
             mo = stat_of(st, S_NCOL, S_MAXOUT, step, scratch),
             mse = stat_of(st, S_NCOL, S_MSE, step, scratch),
             ap = stat_of(st, S_NCOL, S_APPLIED, step, scratch);
    json_t *f = json_array(), *layers = json_array(), *tj = json_array();
    json_t *sm = json_pack("{s:o,s:o,s:o,s:o,s:o}", "loss", stat_json(*loss, true), "grad_norm",
                           stat_json(*gn, true), "lr", stat_json(lr, false), "max_abs_output",
                           stat_json(mo, false), "mse", stat_json(mse, false));
    json_t *doc = x->doc;
    KILN_FAIL_IF(
        !f || !layers || !tj || !sm || json_object_set_new(doc, "findings", f) ||
            json_object_set_new(doc, "layers", layers) || json_object_set_new(doc, "tensors", tj) ||
            json_object_set_new(doc, "step_metrics", sm) ||
            json_object_set_new(doc, "applied", json_boolean(ap.value != 0)) ||
            json_object_set_new(doc, "baseline_steps", json_integer((json_int_t)loss->n_before)) ||
            json_object_set_new(doc, "n_experts", json_integer(x->E)),
        KILN_ERR_NOMEM, "out of memory");
    x->findings = f, x->layers = layers, x->tjs = tj;
    return KILN_OK;
}

/* A trained tensor's row: how far its gradient rose, since when, and its largest update in
 * the UPDATE_LOOK steps before the one explained against the median of the updates applied
 * before those (0: skipped). */
static void tensor_row_of(tensor_row *r, const track *t, long step, long L, double *scratch) {
    r->t = t;
    r->g = stat_of(t, T_NCOL, T_GNORM, step, scratch);
    r->depth = depth_of(t->name, L);
    r->upd_max = NAN;
    for (size_t k = 0; k < t->n; k++) {
        double u = t->v[k * T_NCOL + T_UPDATE];
        if (t->step[k] >= step - UPDATE_LOOK && t->step[k] < step && isfinite(u) &&
            !(u <= r->upd_max)) {
            r->upd_max = u;
            r->upd_step = t->step[k];
        }
    }
    size_t m = 0;
    for (size_t k = 0; k < t->n; k++) {
        double u = t->v[k * T_NCOL + T_UPDATE];
        if (t->step[k] < step - UPDATE_LOOK && isfinite(u) && u > 0) scratch[m++] = u;
    }
    r->upd_median = median(scratch, m);
}

/* Every trained tensor's row, not finite first, then by how far each rose. */
static void tensor_rows(explain *x) {
    for (size_t i = 0; i < x->n_tens; i++) {
        /* A tensor the optimizer does not train (norm.in_*) has a gradient norm of 0 always. */
        bool trained = false;
        for (size_t k = 0; k < x->tens[i].n && !trained; k++)
            trained = x->tens[i].v[k * T_NCOL + T_GNORM] != 0;
        if (trained) tensor_row_of(&x->rows[x->n_rows++], &x->tens[i], x->step, x->L, x->scratch);
    }
    if (x->n_rows) qsort(x->rows, x->n_rows, sizeof *x->rows, cmp_tensor_row);
}

/* What the tensor rows say together: how many gradients were not finite, how many had risen
 * (and the one that rose first), and the weight whose update jumped most. */
typedef struct tally {
    size_t nonfinite, risen;
    const tensor_row *lead, *upd;
} tally;

/* The rows into the doc's "tensors" (and "nonfinite_tensors"), tallied. */
static tally tensors_json(explain *x) {
    tally tt = {0};
    for (size_t i = 0; i < x->n_rows; i++) {
        const tensor_row *r = &x->rows[i];
        if (r->g.logged && !isfinite(r->g.value)) tt.nonfinite++;
        if (r->g.since) {
            tt.risen++;
            if (!tt.lead || r->g.since < tt.lead->g.since) tt.lead = r;
        }
        /* A bias's norm can pass near 0, and its update ratio with it: weights only. */
        const size_t nl = strlen(r->t->name);
        const bool bias = nl >= 5 && !strcmp(r->t->name + nl - 5, ".bias");
        double jump = r->upd_max / r->upd_median;
        if (!bias && isfinite(jump) && jump > UPDATE_JUMP &&
            (!tt.upd || jump > tt.upd->upd_max / tt.upd->upd_median))
            tt.upd = r;
        json_t *o = stat_json(r->g, true);
        if (!o || json_object_set_new(o, "name", json_string(r->t->name)) ||
            json_object_set_new(o, "update_max", num(r->upd_max)) ||
            json_object_set_new(o, "update_step",
                                isfinite(r->upd_max) ? json_integer(r->upd_step) : json_null()) ||
            json_object_set_new(o, "update_median", num(r->upd_median))) {
            json_decref(o);
            x->oom = true;
        } else if (json_array_append_new(x->tjs, o)) { /* o is the array's, freed with it */
            x->oom = true;
        }
    }
    if (json_object_set_new(x->doc, "nonfinite_tensors", json_integer((json_int_t)tt.nonfinite)))
        x->oom = true;
    return tt;
}

/* The tensor that rose first, or how many rose at the step itself. */
static void say_rose_first(explain *x, const tally *tt) {
    const tensor_row *lead = tt->lead;
    const long step = x->step;
    if (lead->g.since < step)
        say(x->findings, &x->oom, "rose_first",
            "%s rose first: its gradient norm over %gx its median since step %ld (%ld step%s "
            "before), %.1fx at step %ld; %zu of %zu tensors over %gx at step %ld",
            lead->t->name, ELEVATED, lead->g.since, step - lead->g.since,
            step - lead->g.since == 1 ? "" : "s", ratio(lead->g), step, tt->risen, x->n_rows,
            ELEVATED, step);
    else
        say(x->findings, &x->oom, "rose_first",
            "%zu of %zu tensors' gradient norms over %gx their median at step %ld, none "
            "before it; the most: %s, %.1fx",
            tt->risen, x->n_rows, ELEVATED, step, x->rows[tt->nonfinite].t->name,
            ratio(x->rows[tt->nonfinite].g));
}

/* Findings, most telling first. */
static void findings(explain *x, col_stat loss, col_stat gn, const tally *tt) {
    json_t *f = x->findings;
    bool *oom = &x->oom;
    const long step = x->step;
    explain_nonfinite(f, oom, loss, x->lays, x->n_lays, step, x->rows, x->n_rows, x->L, x->scratch);
    if (isfinite(ratio(loss)) && ratio(loss) > 1.5)
        say(f, oom, "loss", "the loss was %.4g, %.1fx its median %.4g over the %zu steps before",
            loss.value, ratio(loss), loss.median, loss.n_before);
    if (isfinite(ratio(gn)) && ratio(gn) > 1.5) {
        if (gn.since && gn.since < step)
            say(f, oom, "grad_norm",
                "the gradient norm was %.4g, %.1fx its median %.4g, and over %gx it since "
                "step %ld (%ld step%s before)",
                gn.value, ratio(gn), gn.median, ELEVATED, gn.since, step - gn.since,
                step - gn.since == 1 ? "" : "s");
        else
            say(f, oom, "grad_norm", "the gradient norm was %.4g, %.1fx its median %.4g", gn.value,
                ratio(gn), gn.median);
    }
    if (tt->lead) say_rose_first(x, tt);
    explain_layers(f, oom, x->lays, x->n_lays, x->early, x->n_early, step, x->E, x->scratch,
                   x->layers);
    const tensor_row *upd = tt->upd;
    if (upd)
        say(f, oom, "update",
            "the largest update before it: %s moved %.3g of its norm at step %ld, %.0fx its "
            "median %.3g",
            upd->t->name, upd->upd_max, upd->upd_step, upd->upd_max / upd->upd_median,
            upd->upd_median);
    if (!json_array_size(f))
        say(f, oom, "calm",
            "nothing stands out against the %zu steps before: no gradient over %gx its median, "
            "no router, attention or activation change past the thresholds",
            loss.n_before, ELEVATED);
}

/* A step that was logged: its events and tracks read, its figures, tensors and findings into
 * the doc. */
static kiln_err explain_step(explain *x, bool asked, long first_logged) {
    KILN_TRY(read_step(x, asked, first_logged));
    x->scratch =
        kiln_calloc((size_t)(x->window > EARLY ? x->window : EARLY) + 2, sizeof *x->scratch);
    x->rows = kiln_calloc(x->n_tens ? x->n_tens : 1, sizeof *x->rows);
    KILN_FAIL_IF(!x->scratch || !x->rows, KILN_ERR_NOMEM, "out of memory");
    KILN_FAIL_IF(!x->n_steps, KILN_ERR_IO, "'%s/metrics.db': step %ld vanished while read",
                 x->run_dir, x->step);
    col_stat loss, gn;
    KILN_TRY(step_figures(x, &loss, &gn));
    tensor_rows(x);
    const tally tt = tensors_json(x);
    findings(x, loss, gn, &tt);
    return KILN_OK;
}

kiln_err kiln_run_explain(const char *run_dir, long step, long window, json_t **out) {
    *out = NULL;
    json_t *run = NULL;
    kiln_run_metrics *mx = NULL;
    kiln_err rc = kiln_run_open_metrics(run_dir, &run, &mx);
    if (rc) return rc;
    const json_t *cfg = json_object_get(run, "config");
    explain x = {.db = kiln_run_metrics_db(mx),
                 .run_dir = run_dir,
                 .step = step,
                 .window = window < 1 ? KILN_EXPLAIN_WINDOW : window,
                 .L = (long)json_integer_value(json_object_get(cfg, "n_layers")),
                 .E = (long)json_integer_value(json_object_get(cfg, "n_experts"))};
    const long total = (long)json_integer_value(json_object_get(cfg, "steps"));
    const bool asked = step > 0;
    long first_logged = 0;
    /* One read transaction: a trainer writing meanwhile cannot mix two moments. */
    KILN_CHECK_IF(rc, out, sqlite3_exec(x.db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK, KILN_ERR_IO,
                  "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(x.db));
    KILN_CHECK(rc, out, choose_step(&x, asked, total, &first_logged));
    if (x.step)
        KILN_CHECK(rc, out, explain_step(&x, asked, first_logged));
    else /* a run without a spike or a non-finite step, and none asked */
        KILN_CHECK_IF(rc, out, json_object_set_new(x.doc, "step", json_null()), KILN_ERR_NOMEM,
                      "out of memory");
    KILN_CHECK_IF(rc, out, x.oom, KILN_ERR_NOMEM, "out of memory");
    *out = x.doc;
    x.doc = NULL;
out:
    if (!sqlite3_get_autocommit(x.db)) sqlite3_exec(x.db, "COMMIT", NULL, NULL, NULL);
    free(x.rows);
    free(x.scratch);
    tracks_free(x.steps, x.n_steps);
    tracks_free(x.tens, x.n_tens);
    tracks_free(x.lays, x.n_lays);
    tracks_free(x.early, x.n_early);
    json_decref(x.doc);
    json_decref(run);
    kiln_run_metrics_close(mx);
    return rc;
}

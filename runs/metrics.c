/* metrics.c - RUN_DIR/metrics.db: a row per step, per-layer and per-tensor diagnostics,
 * and events, in SQLite (WAL, so `kiln runs show` can read while a run writes). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "runs_int.h"

struct kiln_run_metrics {
    sqlite3 *db;
    sqlite3_stmt *ins_step, *ins_layer, *ins_tensor, *ins_event;
    /* step_sums and layer_sums (kiln_run_metrics_sums_of): each one's statements (prepared on
       first use), its _done table as read and the spans of the bucket being summed up */
    struct sums {
        sqlite3_stmt *names, *rows, *sums, *ins, *done, *set;
        bool loaded;
        long upto[KILN_RUN_METRICS_SUM_LEVELS];
        kiln_rollup_span *sp;
        bool *seen;
        size_t cap;
    } sums[KILN_RUN_METRICS_SUMS];
    char *path;
};

const char *const kiln_run_metrics_sum_cols[KILN_RUN_METRICS_SUM_COLS] = {
    "loss",   "mse",          "load_balance",  "z", "lr", "grad_norm", "val_loss",
    "val_r2", "tokens_per_s", "max_abs_output"};

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS steps("
    " step INTEGER PRIMARY KEY, time REAL, loss REAL, mse REAL, load_balance REAL, z REAL,"
    " lr REAL, grad_norm REAL, applied INTEGER, tokens_per_s REAL, max_abs_output REAL,"
    " val_loss REAL, val_r2 REAL);"
    "CREATE TABLE IF NOT EXISTS layers("
    " step INTEGER, layer INTEGER, attn_entropy REAL, router_entropy REAL, load_imbalance REAL,"
    " dead_experts INTEGER, overflow REAL, act_rms REAL, expert_load TEXT, PRIMARY KEY(step, "
    "layer));"
    "CREATE TABLE IF NOT EXISTS tensors("
    " step INTEGER, name TEXT, grad_norm REAL, update_ratio REAL, PRIMARY KEY(step, name));"
    "CREATE TABLE IF NOT EXISTS events("
    " id INTEGER PRIMARY KEY, step INTEGER, time REAL, kind TEXT, message TEXT);"
    /* Validation R^2 per target (steps.val_r2 is their mean); added to older files on open. */
    "CREATE TABLE IF NOT EXISTS val_targets("
    " step INTEGER, target INTEGER, name TEXT, r2 REAL, PRIMARY KEY(step, target));"
    /* The steps table summed up per bucket (runs_int.h, kiln_run_metrics_sum_cols). */
    "CREATE TABLE IF NOT EXISTS step_sums("
    " level INTEGER, bucket INTEGER, col INTEGER, minx REAL, miny REAL, maxx REAL, maxy REAL,"
    " firstx REAL, firsty REAL, lastx REAL, lasty REAL, badx REAL, bady REAL,"
    " PRIMARY KEY(level, bucket, col)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS step_sums_done(level INTEGER PRIMARY KEY, upto INTEGER);"
    /* The layers table's scalar columns summed up the same way, per layer. */
    "CREATE TABLE IF NOT EXISTS layer_sums("
    " level INTEGER, bucket INTEGER, layer INTEGER, col INTEGER, minx REAL, miny REAL,"
    " maxx REAL, maxy REAL, firstx REAL, firsty REAL, lastx REAL, lasty REAL, badx REAL,"
    " bady REAL, PRIMARY KEY(level, bucket, layer, col)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS layer_sums_done(level INTEGER PRIMARY KEY, upto INTEGER);"
    /* The tensors table's columns summed up per tensor, by an id given to each name as it is
       first summed up (never truncated, so a resume keeps the ids). */
    "CREATE TABLE IF NOT EXISTS tensor_names(id INTEGER PRIMARY KEY, name TEXT UNIQUE);"
    "CREATE TABLE IF NOT EXISTS tensor_sums("
    " level INTEGER, bucket INTEGER, tensor INTEGER, col INTEGER, minx REAL, miny REAL,"
    " maxx REAL, maxy REAL, firstx REAL, firsty REAL, lastx REAL, lasty REAL, badx REAL,"
    " bady REAL, PRIMARY KEY(level, bucket, tensor, col)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS tensor_sums_done(level INTEGER PRIMARY KEY, upto INTEGER);"
    /* The best validation (kiln runs list, the sweep page) without reading every step. */
    "CREATE INDEX IF NOT EXISTS steps_val ON steps(val_loss) WHERE val_loss IS NOT NULL;";

static kiln_err db_fail(kiln_run_metrics *mx, const char *what) {
    return kiln_fail(KILN_ERR_IO, "'%s': %s: %s", mx->path, what, sqlite3_errmsg(mx->db));
}

static kiln_err exec(kiln_run_metrics *mx, const char *sql) {
    if (sqlite3_exec(mx->db, sql, NULL, NULL, NULL) != SQLITE_OK) return db_fail(mx, "sqlite");
    return KILN_OK;
}

void kiln_run_metrics_close(kiln_run_metrics *mx) {
    if (!mx) return;
    sqlite3_finalize(mx->ins_step);
    sqlite3_finalize(mx->ins_layer);
    sqlite3_finalize(mx->ins_tensor);
    sqlite3_finalize(mx->ins_event);
    for (int i = 0; i < KILN_RUN_METRICS_SUMS; i++) {
        struct sums *u = &mx->sums[i];
        sqlite3_finalize(u->names);
        sqlite3_finalize(u->rows);
        sqlite3_finalize(u->sums);
        sqlite3_finalize(u->ins);
        sqlite3_finalize(u->done);
        sqlite3_finalize(u->set);
        free(u->sp);
        free(u->seen);
    }
    sqlite3_close(mx->db);
    free(mx->path);
    free(mx);
}

double kiln_run_col_num(sqlite3_stmt *s, int i) {
    return sqlite3_column_type(s, i) == SQLITE_NULL ? NAN : sqlite3_column_double(s, i);
}

void *kiln_run_metrics_db(kiln_run_metrics *mx) {
    return mx->db;
}

kiln_err kiln_run_metrics_open(const char *path, bool read_only, kiln_run_metrics **out) {
    *out = NULL;
    kiln_run_metrics *mx = kiln_calloc(1, sizeof *mx);
    if (!mx) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    mx->path = kiln_strdup(path);
    KILN_CHECK_IF(rc, fail, !mx->path, KILN_ERR_NOMEM, "out of memory");
    /* A reader never follows a symlink in the path (the callers resolve the run directory they
     * were given first: runs.c open_db); the trainer writes where it is told. */
    int flags = read_only ? SQLITE_OPEN_READONLY | SQLITE_OPEN_NOFOLLOW
                          : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    /* SQLite opens without O_NONBLOCK and never asks what it opened: a FIFO in metrics.db's
     * place hung runs show, list, plot, explain, diff and export for ever. */
    if (kiln_path_exists(path)) {
        int fd;
        KILN_CHECK(rc, fail, kiln_open_input(path, &fd, NULL));
        close(fd);
    }
    if (sqlite3_open_v2(path, &mx->db, flags, NULL) != SQLITE_OK) {
        rc = mx->db ? db_fail(mx, "cannot open") : kiln_fail(KILN_ERR_NOMEM, "out of memory");
        goto fail;
    }
    sqlite3_busy_timeout(mx->db, 5000);
    if (read_only) {
        /* Is it a metrics.db at all? (One row, not a count: that would read every step.) */
        KILN_CHECK(rc, fail, exec(mx, "SELECT step FROM steps LIMIT 1"));
        *out = mx;
        return KILN_OK;
    }
    KILN_CHECK(rc, fail, exec(mx, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"));
    KILN_CHECK(rc, fail, exec(mx, schema));
    if (sqlite3_prepare_v2(
            mx->db,
            "INSERT OR REPLACE INTO steps VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)", -1,
            &mx->ins_step, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(mx->db,
                           "INSERT OR REPLACE INTO layers VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9)", -1,
                           &mx->ins_layer, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(mx->db, "INSERT OR REPLACE INTO tensors VALUES(?1,?2,?3,?4)", -1,
                           &mx->ins_tensor, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(mx->db,
                           "INSERT INTO events(step, time, kind, message) VALUES(?1,?2,?3,?4)", -1,
                           &mx->ins_event, NULL) != SQLITE_OK) {
        rc = db_fail(mx, "cannot prepare");
        goto fail;
    }
    *out = mx;
    return KILN_OK;
fail:
    kiln_run_metrics_close(mx);
    return rc;
}

/* The summaries' state to be read again (after a rollback or a truncate). */
static void sums_unload(kiln_run_metrics *mx) {
    for (int i = 0; i < KILN_RUN_METRICS_SUMS; i++)
        mx->sums[i].loaded = false;
}

kiln_err kiln_run_metrics_truncate(kiln_run_metrics *mx, long step) {
    char sql[1536];
    snprintf(
        sql, sizeof sql,
        "BEGIN; DELETE FROM steps WHERE step > %ld; DELETE FROM layers WHERE step > %ld;"
        " DELETE FROM tensors WHERE step > %ld; DELETE FROM events WHERE step > %ld;"
        " DELETE FROM val_targets WHERE step > %ld;"
        " DELETE FROM step_sums WHERE (bucket + 1) * (16 << level) > %ld + 1;"
        " UPDATE step_sums_done SET upto = min(upto, (%ld + 1) / (16 << level) * (16 << level));"
        " DELETE FROM layer_sums WHERE (bucket + 1) * (16 << level) > %ld + 1;"
        " UPDATE layer_sums_done SET upto = min(upto, (%ld + 1) / (16 << level) * (16 << level));"
        " DELETE FROM tensor_sums WHERE (bucket + 1) * (16 << level) > %ld + 1;"
        " UPDATE tensor_sums_done SET upto = min(upto, (%ld + 1) / (16 << level) * (16 << level));"
        " COMMIT;",
        step, step, step, step, step, step, step, step, step, step, step);
    sums_unload(mx);
    kiln_err rc = exec(mx, sql);
    if (rc) sqlite3_exec(mx->db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

kiln_err kiln_run_metrics_best_val_step(kiln_run_metrics *mx, const long *steps, size_t n,
                                        long *best) {
    *best = -1;
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(mx->db,
                           "SELECT val_loss FROM steps WHERE step = ?1 AND val_loss IS NOT NULL",
                           -1, &q, NULL) != SQLITE_OK)
        return kiln_fail(KILN_ERR_IO, "'%s': %s", mx->path, sqlite3_errmsg(mx->db));
    double low = 0;
    kiln_err rc = KILN_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        sqlite3_bind_int64(q, 1, steps[i]);
        int r = sqlite3_step(q);
        if (r == SQLITE_ROW) {
            double v = sqlite3_column_double(q, 0);
            if (isfinite(v) && (*best < 0 || v < low || (v == low && steps[i] > *best))) {
                low = v;
                *best = steps[i];
            }
        } else if (r != SQLITE_DONE) {
            rc = kiln_fail(KILN_ERR_IO, "'%s': %s", mx->path, sqlite3_errmsg(mx->db));
        }
        sqlite3_reset(q);
    }
    sqlite3_finalize(q);
    return rc;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

kiln_err kiln_run_metrics_event(kiln_run_metrics *mx, long step, const char *kind,
                                const char *message) {
    sqlite3_stmt *s = mx->ins_event;
    sqlite3_reset(s);
    sqlite3_bind_int64(s, 1, step);
    sqlite3_bind_double(s, 2, now_s());
    sqlite3_bind_text(s, 3, kind, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 4, message, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(s) != SQLITE_DONE) return db_fail(mx, "cannot record an event");
    return KILN_OK;
}

/* NaN and infinities are stored as NULL (a skipped step has no loss to speak of). */
static void bind_num(sqlite3_stmt *s, int i, double x) {
    if (isfinite(x))
        sqlite3_bind_double(s, i, x);
    else
        sqlite3_bind_null(s, i);
}

static kiln_err insert_layers(kiln_run_metrics *mx, long step, const kiln_tsmoe_stats *st) {
    int E = st->n_experts;
    for (int l = 0; l < st->n_layers; l++) {
        double mx_load = 0, sum = 0;
        int dead = 0;
        char loads[4096];
        size_t o = 0;
        loads[o++] = '[';
        for (int e = 0; e < E; e++) {
            double f = st->expert_load[(size_t)l * E + e];
            sum += f;
            if (f > mx_load) mx_load = f;
            if (f == 0) dead++;
            if (o < sizeof loads - 32)
                o += (size_t)snprintf(loads + o, sizeof loads - o, "%s%.6g", e ? "," : "", f);
        }
        loads[o++] = ']';
        loads[o] = 0;
        sqlite3_stmt *s = mx->ins_layer;
        sqlite3_reset(s);
        sqlite3_bind_int64(s, 1, step);
        sqlite3_bind_int(s, 2, l);
        bind_num(s, 3, st->attn_entropy[l]);
        bind_num(s, 4, st->router_entropy ? st->router_entropy[l] : 0);
        if (E > 0 && sum > 0)
            bind_num(s, 5, mx_load / (sum / E));
        else
            sqlite3_bind_null(s, 5);
        sqlite3_bind_int(s, 6, E > 0 ? dead : 0);
        bind_num(s, 7, st->overflow ? st->overflow[l] : 0);
        bind_num(s, 8, st->act_rms[l]);
        if (E > 0)
            sqlite3_bind_text(s, 9, loads, -1, SQLITE_TRANSIENT);
        else
            sqlite3_bind_null(s, 9);
        if (sqlite3_step(s) != SQLITE_DONE) return db_fail(mx, "cannot record layer diagnostics");
    }
    return KILN_OK;
}

/* ---- the summary: step_sums ---- */

static kiln_err prep(kiln_run_metrics *mx, sqlite3_stmt **st, const char *sql) {
    if (*st) {
        sqlite3_reset(*st);
        return KILN_OK;
    }
    if (sqlite3_prepare_v2(mx->db, sql, -1, st, NULL) != SQLITE_OK)
        return db_fail(mx, "cannot prepare");
    return KILN_OK;
}

/* The summaries: what each sums up and the SQL that reads and writes it. A series is
 * layer * per + col (a layer-less table's rows are layer 0). */
static const kiln_run_metrics_sums sums_of[KILN_RUN_METRICS_SUMS] = {
    {.rows = "SELECT step, loss, mse, load_balance, z, lr, grad_norm, val_loss, val_r2, "
             "tokens_per_s, max_abs_output FROM steps WHERE step >= ?1 AND step < ?2 ORDER BY step",
     .sums = "SELECT bucket, col, minx, miny, maxx, maxy, firstx, firsty, lastx, lasty, badx, "
             "bady FROM step_sums WHERE level = ?1 AND bucket >= ?2 AND bucket < ?3 ORDER BY "
             "bucket, col",
     .ins = "INSERT OR REPLACE INTO step_sums VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)",
     .done = "SELECT level, upto FROM step_sums_done",
     .set = "INSERT OR REPLACE INTO step_sums_done VALUES(?1, ?2)",
     .last = "SELECT coalesce(max(step), 0) FROM steps",
     .per = KILN_RUN_METRICS_SUM_COLS,
     .val = KILN_RUN_METRICS_SUM_VAL,
     .layered = false},
    {.rows = "SELECT step, layer, attn_entropy, router_entropy, load_imbalance, dead_experts, "
             "overflow, act_rms FROM layers WHERE step >= ?1 AND step < ?2 ORDER BY step, layer",
     .sums = "SELECT bucket, layer * 6 + col, minx, miny, maxx, maxy, firstx, firsty, lastx, "
             "lasty, badx, bady FROM layer_sums WHERE level = ?1 AND bucket >= ?2 AND bucket < "
             "?3 ORDER BY bucket, layer, col",
     .ins = "INSERT OR REPLACE INTO layer_sums VALUES(?1,?2,?14,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,"
            "?13)",
     .done = "SELECT level, upto FROM layer_sums_done",
     .set = "INSERT OR REPLACE INTO layer_sums_done VALUES(?1, ?2)",
     .last = "SELECT coalesce(max(step), 0) FROM layers",
     .per = KILN_RUN_METRICS_LAYER_COLS,
     .val = -1,
     .layered = true},
    {.names = "INSERT OR IGNORE INTO tensor_names(name) SELECT DISTINCT name FROM tensors WHERE "
              "step >= ?1 AND step < ?2",
     .rows = "SELECT t.step, n.id, t.grad_norm, t.update_ratio FROM tensors t JOIN tensor_names n "
             "ON n.name = t.name WHERE t.step >= ?1 AND t.step < ?2 ORDER BY t.step",
     .sums = "SELECT bucket, tensor * 2 + col, minx, miny, maxx, maxy, firstx, firsty, lastx, "
             "lasty, badx, bady FROM tensor_sums WHERE level = ?1 AND bucket >= ?2 AND bucket < "
             "?3 ORDER BY bucket, tensor, col",
     .ins = "INSERT OR REPLACE INTO tensor_sums VALUES(?1,?2,?14,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,"
            "?13)",
     .done = "SELECT level, upto FROM tensor_sums_done",
     .set = "INSERT OR REPLACE INTO tensor_sums_done VALUES(?1, ?2)",
     .last = "SELECT coalesce(max(step), 0) FROM tensors",
     .per = KILN_RUN_METRICS_TENSOR_COLS,
     .val = -1,
     .layered = true},
};

const kiln_run_metrics_sums *kiln_run_metrics_sums_of(int which) {
    return &sums_of[which];
}

long kiln_run_metrics_sum_value(const kiln_run_metrics_sums *k, sqlite3_stmt *st, int c,
                                double *y) {
    int at = k->layered ? 2 : 1;
    /* Validation only at the steps that were evaluated. */
    if (k->val >= 0 && (c == k->val || c == k->val + 1) &&
        sqlite3_column_type(st, at + k->val) == SQLITE_NULL)
        return -1;
    long layer = k->layered ? (long)sqlite3_column_int64(st, 1) : 0;
    if (layer < 0 || layer >= KILN_RUN_METRICS_SUM_LAYERS) return -1;
    *y = kiln_run_col_num(st, at + c);
    return layer * k->per + c;
}

static kiln_err sums_load(kiln_run_metrics *mx, int which) {
    struct sums *u = &mx->sums[which];
    memset(u->upto, 0, sizeof u->upto);
    KILN_TRY(prep(mx, &u->done, sums_of[which].done));
    int r;
    while ((r = sqlite3_step(u->done)) == SQLITE_ROW) {
        long k = (long)sqlite3_column_int64(u->done, 0);
        if (k >= 0 && k < KILN_RUN_METRICS_SUM_LEVELS)
            u->upto[k] = (long)sqlite3_column_int64(u->done, 1);
    }
    sqlite3_reset(u->done);
    if (r != SQLITE_DONE) return db_fail(mx, "cannot read a summary's _done table");
    u->loaded = true;
    return KILN_OK;
}

/* A step, or NULL when there is none. (REAL, as readers that go by the declared type, such
 * as the Python package, read a NULL REAL as NaN.) */
static void bind_x(sqlite3_stmt *s, int i, bool have, double x) {
    if (have)
        sqlite3_bind_double(s, i, x);
    else
        sqlite3_bind_null(s, i);
}

/* The bucket's rows: a series' only when a value of it was seen there (n: the series). */
static kiln_err sums_write(kiln_run_metrics *mx, int which, int level, long bucket, size_t n) {
    struct sums *u = &mx->sums[which];
    const kiln_run_metrics_sums *kind = &sums_of[which];
    for (size_t c = 0; c < n; c++) {
        if (!u->seen[c]) continue;
        const kiln_rollup_span *sp = &u->sp[c];
        const kiln_rollup_bucket *b = &sp->b;
        KILN_TRY(prep(mx, &u->ins, kind->ins));
        sqlite3_stmt *s = u->ins;
        sqlite3_bind_int(s, 1, level);
        sqlite3_bind_int64(s, 2, bucket);
        sqlite3_bind_int(s, 3, (int)(c % (size_t)kind->per));
        if (kind->layered) sqlite3_bind_int(s, 14, (int)(c / (size_t)kind->per));
        bind_x(s, 4, b->finite, b->minx);
        bind_num(s, 5, b->finite ? b->miny : NAN);
        bind_x(s, 6, b->finite, b->maxx);
        bind_num(s, 7, b->finite ? b->maxy : NAN);
        bind_x(s, 8, b->finite, sp->firstx);
        bind_num(s, 9, b->finite ? sp->firsty : NAN);
        bind_x(s, 10, b->finite, sp->lastx);
        bind_num(s, 11, b->finite ? sp->lasty : NAN);
        bind_x(s, 12, b->bad, b->badx);
        /* An infinity is kept as SQLite keeps it; NaN is NULL, which reads back as NaN. */
        if (b->bad && isinf(b->bady))
            sqlite3_bind_double(s, 13, b->bady);
        else
            sqlite3_bind_null(s, 13);
        if (sqlite3_step(s) != SQLITE_DONE) return db_fail(mx, "cannot write a summary");
    }
    return KILN_OK;
}

void kiln_run_metrics_sum_span(sqlite3_stmt *st, int at, double x0, double width,
                               kiln_rollup_span *sp) {
    kiln_rollup_span_init(sp, x0, width);
    kiln_rollup_bucket *b = &sp->b;
    b->finite = sqlite3_column_type(st, at) != SQLITE_NULL;
    if (b->finite) {
        b->minx = sqlite3_column_double(st, at), b->miny = kiln_run_col_num(st, at + 1);
        b->maxx = sqlite3_column_double(st, at + 2), b->maxy = kiln_run_col_num(st, at + 3);
        sp->firstx = sqlite3_column_double(st, at + 4), sp->firsty = kiln_run_col_num(st, at + 5);
        sp->lastx = sqlite3_column_double(st, at + 6), sp->lasty = kiln_run_col_num(st, at + 7);
    }
    b->bad = sqlite3_column_type(st, at + 8) != SQLITE_NULL;
    if (b->bad) b->badx = sqlite3_column_double(st, at + 8), b->bady = kiln_run_col_num(st, at + 9);
}

/* Series c's span of the bucket being summed up (fresh when first seen there), or NULL when
 * out of memory. *n: the series in use. */
static kiln_rollup_span *sums_span(struct sums *u, size_t c, size_t *n, double x0, double w) {
    if (c >= u->cap) {
        size_t cap = u->cap ? u->cap : 16;
        while (cap <= c)
            cap *= 2;
        kiln_rollup_span *sp = realloc(u->sp, cap * sizeof *sp);
        if (sp) u->sp = sp;
        bool *seen = sp ? realloc(u->seen, cap * sizeof *seen) : NULL;
        if (!seen) return NULL;
        u->seen = seen;
        memset(seen + u->cap, 0, (cap - u->cap) * sizeof *seen);
        u->cap = cap;
    }
    while (*n <= c)
        u->seen[(*n)++] = false;
    if (!u->seen[c]) kiln_rollup_span_init(&u->sp[c], x0, w);
    u->seen[c] = true;
    return &u->sp[c];
}

/* Level k's buckets from upto[k] up to `end` (a multiple of its width), out of the table it
 * sums up (k 0) or level k - 1. */
static kiln_err sums_level(kiln_run_metrics *mx, int which, int k, long end) {
    struct sums *u = &mx->sums[which];
    const kiln_run_metrics_sums *kind = &sums_of[which];
    long w = KILN_RUN_METRICS_SUM_WIDTH(k), from = u->upto[k];
    sqlite3_stmt *st;
    if (k == 0 && kind->names) { /* the names first seen here get their ids */
        KILN_TRY(prep(mx, &u->names, kind->names));
        sqlite3_bind_int64(u->names, 1, from);
        sqlite3_bind_int64(u->names, 2, end);
        int r = sqlite3_step(u->names);
        sqlite3_reset(u->names);
        if (r != SQLITE_DONE) return db_fail(mx, "cannot name a summary's series");
    }
    if (k == 0) {
        KILN_TRY(prep(mx, &u->rows, kind->rows));
        st = u->rows;
        sqlite3_bind_int64(st, 1, from);
        sqlite3_bind_int64(st, 2, end);
    } else {
        KILN_TRY(prep(mx, &u->sums, kind->sums));
        st = u->sums;
        sqlite3_bind_int(st, 1, k - 1);
        sqlite3_bind_int64(st, 2, from / (w / 2));
        sqlite3_bind_int64(st, 3, end / (w / 2));
    }
    kiln_err rc = KILN_OK;
    long cur = -1;
    size_t n = 0;
    int r;
    while (!rc && (r = sqlite3_step(st)) == SQLITE_ROW) {
        long v = (long)sqlite3_column_int64(st, 0);
        long b = k == 0 ? v / w : v / 2;
        if (b != cur) {
            if (cur >= 0) rc = sums_write(mx, which, k, cur, n);
            n = 0;
            cur = b;
        }
        if (k == 0) {
            for (int c = 0; !rc && c < kind->per; c++) {
                double y;
                long s = kiln_run_metrics_sum_value(kind, st, c, &y);
                kiln_rollup_span *sp = s < 0 ? NULL : sums_span(u, (size_t)s, &n, (double)b * w, (double)w);
                if (s >= 0 && !sp) rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
                if (sp) kiln_rollup_span_push(sp, (double)v, y);
            }
        } else {
            long c = (long)sqlite3_column_int64(st, 1);
            if (c < 0 || c >= (long)KILN_RUN_METRICS_SUM_LAYERS * kind->per) continue;
            kiln_rollup_span child, *sp = sums_span(u, (size_t)c, &n, (double)b * w, (double)w);
            if (!sp) rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
            kiln_run_metrics_sum_span(st, 2, (double)v * (w / 2), (double)(w / 2), &child);
            if (sp) kiln_rollup_span_merge(sp, &child);
        }
    }
    if (!rc && r != SQLITE_DONE) rc = db_fail(mx, "cannot read for a summary");
    sqlite3_reset(st);
    if (!rc && cur >= 0) rc = sums_write(mx, which, k, cur, n);
    if (rc) return rc;
    KILN_TRY(prep(mx, &u->set, kind->set));
    sqlite3_bind_int(u->set, 1, k);
    sqlite3_bind_int64(u->set, 2, end);
    if (sqlite3_step(u->set) != SQLITE_DONE) return db_fail(mx, "cannot write a summary's _done");
    u->upto[k] = end;
    return KILN_OK;
}

/* Every bucket a step up to `newest` closed, at every level of every summary (in the
 * caller's transaction). */
static kiln_err sums_update(kiln_run_metrics *mx, long newest) {
    for (int i = 0; i < KILN_RUN_METRICS_SUMS; i++) {
        struct sums *u = &mx->sums[i];
        if (!u->loaded) KILN_TRY(sums_load(mx, i));
        for (int k = 0; k < KILN_RUN_METRICS_SUM_LEVELS; k++) {
            long w = KILN_RUN_METRICS_SUM_WIDTH(k);
            long end = k ? u->upto[k - 1] / w * w : (newest > 0 ? newest / w * w : 0);
            if (end <= u->upto[k]) break; /* nothing new here, so nothing above */
            KILN_TRY(sums_level(mx, i, k, end));
        }
    }
    return KILN_OK;
}

/* Whether step closes a bucket of any summary (or they are not read yet). */
static bool sums_due(const kiln_run_metrics *mx, long step) {
    for (int i = 0; i < KILN_RUN_METRICS_SUMS; i++)
        if (!mx->sums[i].loaded || step >= mx->sums[i].upto[0] + KILN_RUN_METRICS_SUM_WIDTH(0))
            return true;
    return false;
}

kiln_err kiln_run_metrics_summarize(kiln_run_metrics *mx) {
    KILN_TRY(exec(mx, "BEGIN"));
    sqlite3_stmt *st = NULL;
    kiln_err rc = KILN_OK;
    long newest = 0;
    if (sqlite3_prepare_v2(mx->db, "SELECT step FROM steps ORDER BY step DESC LIMIT 1", -1, &st,
                           NULL) != SQLITE_OK)
        rc = db_fail(mx, "cannot prepare");
    else if (sqlite3_step(st) == SQLITE_ROW)
        newest = (long)sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    if (!rc) rc = sums_update(mx, newest);
    if (!rc) return exec(mx, "COMMIT");
    sqlite3_exec(mx->db, "ROLLBACK", NULL, NULL, NULL);
    sums_unload(mx);
    return rc;
}

kiln_err kiln_run_metrics_step(kiln_run_metrics *mx, const kiln_train_progress *p,
                               const kiln_run_metrics_tensor *tensors, size_t n_tensors) {
    KILN_TRY(exec(mx, "BEGIN"));
    kiln_err rc = KILN_OK;
    sqlite3_stmt *s = mx->ins_step;
    sqlite3_reset(s);
    sqlite3_bind_int64(s, 1, p->step);
    sqlite3_bind_double(s, 2, now_s());
    bind_num(s, 3, p->loss);
    bind_num(s, 4, p->mse);
    bind_num(s, 5, p->load_balance);
    bind_num(s, 6, p->z);
    bind_num(s, 7, p->lr);
    bind_num(s, 8, p->grad_norm);
    sqlite3_bind_int(s, 9, p->applied);
    bind_num(s, 10, p->tokens_per_s);
    bind_num(s, 11, p->stats ? p->stats->max_abs_output : NAN);
    if (p->has_val) {
        bind_num(s, 12, p->val_loss);
        bind_num(s, 13, p->val_r2);
    } else {
        sqlite3_bind_null(s, 12);
        sqlite3_bind_null(s, 13);
    }
    KILN_CHECK_IF(rc, fail, sqlite3_step(s) != SQLITE_DONE, KILN_ERR_IO,
                  "'%s': cannot record step %ld: %s", mx->path, p->step, sqlite3_errmsg(mx->db));
    if (p->stats) KILN_CHECK(rc, fail, insert_layers(mx, p->step, p->stats));
    for (size_t i = 0; i < n_tensors; i++) {
        s = mx->ins_tensor;
        sqlite3_reset(s);
        sqlite3_bind_int64(s, 1, p->step);
        sqlite3_bind_text(s, 2, tensors[i].name, -1, SQLITE_STATIC);
        bind_num(s, 3, tensors[i].grad_norm);
        bind_num(s, 4, tensors[i].update_ratio);
        KILN_CHECK_IF(rc, fail, sqlite3_step(s) != SQLITE_DONE, KILN_ERR_IO,
                      "'%s': cannot record step %ld: %s", mx->path, p->step,
                      sqlite3_errmsg(mx->db));
    }
    /* Once in 16 steps at most: the buckets this step closed. */
    if (sums_due(mx, p->step))
        KILN_CHECK(rc, fail, sums_update(mx, p->step));
    return exec(mx, "COMMIT");
fail:
    sqlite3_exec(mx->db, "ROLLBACK", NULL, NULL, NULL);
    sums_unload(mx);
    return rc;
}

kiln_err kiln_run_event_add(const char *run_dir, long step, const char *kind, const char *message) {
    char *path = kiln_path_join(run_dir, "metrics.db");
    if (!path) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    /* Only an existing log: a directory that is no run yet gets no metrics.db from here. */
    kiln_err rc = kiln_path_exists(path)
                      ? KILN_OK
                      : kiln_fail(KILN_ERR_NOTFOUND, "'%s': no metrics.db to record an event in",
                                  run_dir);
    kiln_run_metrics *mx = NULL;
    if (!rc) rc = kiln_run_metrics_open(path, false, &mx);
    if (!rc) rc = kiln_run_metrics_event(mx, step, kind, message);
    kiln_run_metrics_close(mx);
    free(path);
    return rc;
}

kiln_err kiln_run_metrics_val_targets(kiln_run_metrics *mx, long step, const kiln_dataset *ds,
                                      const double *r2) {
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(mx->db, "INSERT OR REPLACE INTO val_targets VALUES(?1,?2,?3,?4)", -1, &q,
                           NULL) != SQLITE_OK)
        return db_fail(mx, "cannot prepare");
    kiln_err rc = exec(mx, "BEGIN");
    for (int o = 0; !rc && o < ds->n_outputs; o++) {
        char buf[32];
        sqlite3_reset(q);
        sqlite3_bind_int64(q, 1, step);
        sqlite3_bind_int(q, 2, o);
        sqlite3_bind_text(q, 3, kiln_dataset_column(ds, true, o, buf, sizeof buf), -1,
                          SQLITE_TRANSIENT);
        if (isfinite(r2[o]))
            sqlite3_bind_double(q, 4, r2[o]);
        else
            sqlite3_bind_null(q, 4);
        if (sqlite3_step(q) != SQLITE_DONE) rc = db_fail(mx, "cannot write");
    }
    sqlite3_finalize(q);
    if (!rc) rc = exec(mx, "COMMIT");
    if (rc) sqlite3_exec(mx->db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

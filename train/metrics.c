/* metrics.c - RUN_DIR/metrics.db: a row per step, per-layer and per-tensor diagnostics,
 * and events, in SQLite (WAL, so `kiln runs show` can read while a run writes). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

#include "train_int.h"

struct kiln_metrics {
    sqlite3 *db;
    sqlite3_stmt *ins_step, *ins_layer, *ins_tensor, *ins_event;
    char *path;
};

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
    " step INTEGER, target INTEGER, name TEXT, r2 REAL, PRIMARY KEY(step, target));";

static kiln_err db_fail(kiln_metrics *mx, const char *what) {
    return kiln_fail(KILN_ERR_IO, "'%s': %s: %s", mx->path, what, sqlite3_errmsg(mx->db));
}

static kiln_err exec(kiln_metrics *mx, const char *sql) {
    if (sqlite3_exec(mx->db, sql, NULL, NULL, NULL) != SQLITE_OK) return db_fail(mx, "sqlite");
    return KILN_OK;
}

void kiln_metrics_close(kiln_metrics *mx) {
    if (!mx) return;
    sqlite3_finalize(mx->ins_step);
    sqlite3_finalize(mx->ins_layer);
    sqlite3_finalize(mx->ins_tensor);
    sqlite3_finalize(mx->ins_event);
    sqlite3_close(mx->db);
    free(mx->path);
    free(mx);
}

void *kiln_metrics_db(kiln_metrics *mx) {
    return mx->db;
}

kiln_err kiln_metrics_open(const char *path, bool read_only, kiln_metrics **out) {
    *out = NULL;
    kiln_metrics *mx = kiln_calloc(1, sizeof *mx);
    if (!mx) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    mx->path = kiln_strdup(path);
    KILN_CHECK_IF(rc, fail, !mx->path, KILN_ERR_NOMEM, "out of memory");
    int flags = read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
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
    kiln_metrics_close(mx);
    return rc;
}

kiln_err kiln_metrics_truncate(kiln_metrics *mx, long step) {
    char sql[384];
    snprintf(sql, sizeof sql,
             "BEGIN; DELETE FROM steps WHERE step > %ld; DELETE FROM layers WHERE step > %ld;"
             " DELETE FROM tensors WHERE step > %ld; DELETE FROM events WHERE step > %ld;"
             " DELETE FROM val_targets WHERE step > %ld; COMMIT;",
             step, step, step, step, step);
    kiln_err rc = exec(mx, sql);
    if (rc) sqlite3_exec(mx->db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

kiln_err kiln_metrics_best_val_step(kiln_metrics *mx, const long *steps, size_t n, long *best) {
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

kiln_err kiln_metrics_event(kiln_metrics *mx, long step, const char *kind, const char *message) {
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

static kiln_err insert_layers(kiln_metrics *mx, long step, const kiln_tsmoe_stats *st) {
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

kiln_err kiln_metrics_step(kiln_metrics *mx, const kiln_train_progress *p,
                           const kiln_metrics_tensor *tensors, size_t n_tensors) {
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
    return exec(mx, "COMMIT");
fail:
    sqlite3_exec(mx->db, "ROLLBACK", NULL, NULL, NULL);
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
    kiln_metrics *mx = NULL;
    if (!rc) rc = kiln_metrics_open(path, false, &mx);
    if (!rc) rc = kiln_metrics_event(mx, step, kind, message);
    kiln_metrics_close(mx);
    free(path);
    return rc;
}

kiln_err kiln_metrics_val_targets(kiln_metrics *mx, long step, const kiln_dataset *ds,
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

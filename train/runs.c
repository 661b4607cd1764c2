/* runs.c - reading run directories back: what `kiln runs show` and `kiln runs diff`
 * print. Read-only: a run may be training while it is read. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "train_int.h"

static kiln_err load_run_json(const char *run_dir, json_t **out) {
    char *p = kiln_path_join(run_dir, "run.json");
    if (!p) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    if (!kiln_path_exists(p))
        rc = kiln_fail(KILN_ERR_NOTFOUND, "'%s': not a run directory (no run.json)", run_dir);
    else
        rc = kiln_json_load_file(p, out);
    free(p);
    if (!rc && !json_is_object(json_object_get(*out, "config"))) {
        json_decref(*out);
        *out = NULL;
        rc = kiln_fail(KILN_ERR_FORMAT, "'%s/run.json': no \"config\" object", run_dir);
    }
    return rc;
}

static kiln_err open_db(const char *run_dir, kiln_metrics **mx) {
    *mx = NULL;
    char *p = kiln_path_join(run_dir, "metrics.db");
    if (!p) return KILN_ERR_NOMEM;
    kiln_err rc = kiln_path_exists(p) ? kiln_metrics_open(p, true, mx) : KILN_OK;
    free(p);
    return rc;
}

static double col_num(sqlite3_stmt *s, int i) {
    return sqlite3_column_type(s, i) == SQLITE_NULL ? NAN : sqlite3_column_double(s, i);
}

static char *col_dup(sqlite3_stmt *s, int i) {
    const char *t = (const char *)sqlite3_column_text(s, i);
    return kiln_strdup(t ? t : "");
}

void kiln_run_info_release(kiln_run_info *info) {
    json_decref(info->run);
    json_decref(info->layers);
    free(info->ckpts);
    for (size_t i = 0; i < info->n_events; i++) {
        free(info->events[i].kind);
        free(info->events[i].message);
    }
    free(info->events);
    memset(info, 0, sizeof *info);
}

static kiln_err read_metrics(sqlite3 *db, size_t max_events, kiln_run_info *o) {
    sqlite3_stmt *s = NULL;
    kiln_err rc = KILN_OK;
#define PREP(sql)                                                                                  \
    do {                                                                                           \
        sqlite3_finalize(s);                                                                       \
        s = NULL;                                                                                  \
        KILN_CHECK_IF(rc, out, sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK,             \
                      KILN_ERR_IO, "metrics.db: %s", sqlite3_errmsg(db));                          \
    } while (0)
    PREP("SELECT step, loss, lr, grad_norm FROM steps ORDER BY step DESC LIMIT 1");
    if (sqlite3_step(s) == SQLITE_ROW) {
        o->last_step = sqlite3_column_int64(s, 0);
        o->last_loss = col_num(s, 1);
        o->last_lr = col_num(s, 2);
        o->last_grad_norm = col_num(s, 3);
    }
    PREP("SELECT step, val_loss, val_r2 FROM steps WHERE val_loss IS NOT NULL ORDER BY val_loss, "
         "step LIMIT 1");
    if (sqlite3_step(s) == SQLITE_ROW) {
        o->best_val_step = sqlite3_column_int64(s, 0);
        o->best_val_loss = col_num(s, 1);
        o->best_val_r2 = col_num(s, 2);
    }
    PREP("SELECT step, val_loss, val_r2 FROM steps WHERE val_loss IS NOT NULL ORDER BY step DESC "
         "LIMIT 1");
    if (sqlite3_step(s) == SQLITE_ROW) {
        o->last_val_step = sqlite3_column_int64(s, 0);
        o->last_val_loss = col_num(s, 1);
        o->last_val_r2 = col_num(s, 2);
    }
    o->layers = json_array();
    KILN_CHECK_IF(rc, out, !o->layers, KILN_ERR_NOMEM, "out of memory");
    PREP("SELECT layer, attn_entropy, router_entropy, load_imbalance, dead_experts, overflow, "
         "act_rms, expert_load FROM layers WHERE step = ?1 ORDER BY layer");
    sqlite3_bind_int64(s, 1, (sqlite3_int64)o->last_step);
    while (sqlite3_step(s) == SQLITE_ROW) {
        const char *load = (const char *)sqlite3_column_text(s, 7);
        json_t *lj = load ? json_loads(load, JSON_REJECT_DUPLICATES, NULL) : NULL;
        json_t *row = json_pack("{s:I,s:f,s:f,s:f,s:I,s:f,s:f,s:o}", "layer",
                                (json_int_t)sqlite3_column_int64(s, 0), "attn_entropy", col_num(s, 1),
                                "router_entropy", col_num(s, 2), "load_imbalance", col_num(s, 3),
                                "dead_experts", (json_int_t)sqlite3_column_int64(s, 4), "overflow",
                                col_num(s, 5), "act_rms", col_num(s, 6), "expert_load",
                                lj ? lj : json_array());
        KILN_CHECK_IF(rc, out, !row || json_array_append_new(o->layers, row), KILN_ERR_NOMEM,
                      "out of memory");
    }
    PREP("SELECT count(*) FROM events");
    if (sqlite3_step(s) == SQLITE_ROW) o->total_events = (size_t)sqlite3_column_int64(s, 0);
    size_t n = o->total_events < max_events ? o->total_events : max_events;
    if (n) {
        o->events = kiln_calloc(n, sizeof *o->events);
        KILN_CHECK_IF(rc, out, !o->events, KILN_ERR_NOMEM, "out of memory");
        PREP("SELECT step, time, kind, message FROM events ORDER BY id DESC LIMIT ?1");
        sqlite3_bind_int64(s, 1, (sqlite3_int64)n);
        size_t k = n;
        while (k > 0 && sqlite3_step(s) == SQLITE_ROW) {
            kiln_run_event *e = &o->events[--k];
            e->step = sqlite3_column_int64(s, 0);
            e->time = sqlite3_column_double(s, 1);
            e->kind = col_dup(s, 2);
            e->message = col_dup(s, 3);
            o->n_events++;
            KILN_CHECK_IF(rc, out, !e->kind || !e->message, KILN_ERR_NOMEM, "out of memory");
        }
        if (k) { /* rows vanished between the count and the read: keep what we have */
            memmove(o->events, o->events + k, o->n_events * sizeof *o->events);
        }
    }
#undef PREP
out:
    sqlite3_finalize(s);
    return rc;
}

kiln_err kiln_run_info_load(const char *run_dir, size_t max_events, kiln_run_info *out) {
    memset(out, 0, sizeof *out);
    KILN_TRY(load_run_json(run_dir, &out->run));
    kiln_metrics *mx = NULL;
    kiln_err rc = open_db(run_dir, &mx);
    if (!rc && mx) rc = read_metrics(kiln_metrics_db(mx), max_events, out);
    kiln_metrics_close(mx);
    if (!rc) rc = kiln_ckpt_list(run_dir, &out->ckpts, &out->n_ckpts);
    if (rc) kiln_run_info_release(out);
    return rc;
}

void kiln_run_diff_release(kiln_run_diff *d) {
    json_decref(d->config);
    memset(d, 0, sizeof *d);
}

static kiln_err diff_key(json_t *diff, const char *key, json_t *a, json_t *b) {
    if (a && b && json_equal(a, b)) return KILN_OK;
    json_t *pair = json_pack("[OO]", a ? a : json_null(), b ? b : json_null());
    if (!pair || json_object_set_new(diff, key, pair))
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    return KILN_OK;
}

kiln_err kiln_run_diff_load(const char *a_dir, const char *b_dir, kiln_run_diff *out) {
    memset(out, 0, sizeof *out);
    json_t *ra = NULL, *rb = NULL;
    kiln_metrics *ma = NULL, *mb = NULL;
    sqlite3_stmt *sa = NULL, *sb = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK(rc, out, load_run_json(a_dir, &ra));
    KILN_CHECK(rc, out, load_run_json(b_dir, &rb));
    out->config = json_object();
    KILN_CHECK_IF(rc, out, !out->config, KILN_ERR_NOMEM, "out of memory");
    json_t *ca = json_object_get(ra, "config"), *cb = json_object_get(rb, "config");
    const char *k;
    json_t *v;
    json_object_foreach(ca, k, v)
        KILN_CHECK(rc, out, diff_key(out->config, k, v, json_object_get(cb, k)));
    json_object_foreach(cb, k, v) if (!json_object_get(ca, k))
        KILN_CHECK(rc, out, diff_key(out->config, k, NULL, v));
    KILN_CHECK(rc, out,
               diff_key(out->config, "dataset_sha256", json_object_get(ra, "dataset_sha256"),
                        json_object_get(rb, "dataset_sha256")));
    KILN_CHECK(rc, out, open_db(a_dir, &ma));
    KILN_CHECK(rc, out, open_db(b_dir, &mb));
    if (!ma || !mb) goto out;
    const char *sql = "SELECT step, loss FROM steps ORDER BY step";
    sqlite3 *da = kiln_metrics_db(ma), *db = kiln_metrics_db(mb);
    KILN_CHECK_IF(rc, out, sqlite3_prepare_v2(da, sql, -1, &sa, NULL) != SQLITE_OK, KILN_ERR_IO,
                  "'%s/metrics.db': %s", a_dir, sqlite3_errmsg(da));
    KILN_CHECK_IF(rc, out, sqlite3_prepare_v2(db, sql, -1, &sb, NULL) != SQLITE_OK, KILN_ERR_IO,
                  "'%s/metrics.db': %s", b_dir, sqlite3_errmsg(db));
    /* Walk both in step order; a step only one run logged is not compared. */
    int ha = sqlite3_step(sa) == SQLITE_ROW, hb = sqlite3_step(sb) == SQLITE_ROW;
    while (ha || hb) {
        long xa = ha ? (long)sqlite3_column_int64(sa, 0) : 0,
             xb = hb ? (long)sqlite3_column_int64(sb, 0) : 0;
        if (ha && hb && xa == xb) {
            out->a_steps++;
            out->b_steps++;
            out->common_steps++;
            double la = col_num(sa, 1), lb = col_num(sb, 1);
            bool same = (isnan(la) && isnan(lb)) || memcmp(&la, &lb, sizeof la) == 0;
            if (!same && !out->first_diff) {
                out->first_diff = xa;
                out->a_loss = la;
                out->b_loss = lb;
            }
            ha = sqlite3_step(sa) == SQLITE_ROW;
            hb = sqlite3_step(sb) == SQLITE_ROW;
        } else if (ha && (!hb || xa < xb)) {
            out->a_steps++;
            ha = sqlite3_step(sa) == SQLITE_ROW;
        } else {
            out->b_steps++;
            hb = sqlite3_step(sb) == SQLITE_ROW;
        }
    }
out:
    sqlite3_finalize(sa);
    sqlite3_finalize(sb);
    kiln_metrics_close(ma);
    kiln_metrics_close(mb);
    json_decref(ra);
    json_decref(rb);
    if (rc) kiln_run_diff_release(out);
    return rc;
}

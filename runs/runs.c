/* runs.c - reading run directories back: what `kiln runs show`, `kiln runs diff` and
 * `kiln runs plot` print. Read-only: a run may be training while it is read. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include <sqlite3.h>

#include "runs_int.h"

#define RUN_JSON_LIMIT (64u << 20) /* as kiln_json_load_file's */

static kiln_err load_run_json(const char *run_dir, json_t **out) {
    *out = NULL;
    char *p = kiln_path_join(run_dir, "run.json");
    if (!p) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    struct stat sb;
    /* Read as a model directory's files are (core/modeldir.c): a run.json that is a symlink
     * to a file elsewhere, a FIFO or a device is refused, never read through. */
    if (lstat(p, &sb) != 0)
        rc = kiln_fail(KILN_ERR_NOTFOUND, "'%s': not a run directory (no run.json)", run_dir);
    else
        rc = kiln_modeldir_json(run_dir, "run.json", RUN_JSON_LIMIT, out);
    free(p);
    if (!rc && !json_is_object(json_object_get(*out, "config")))
        rc = kiln_fail(KILN_ERR_FORMAT, "'%s/run.json': no \"config\" object", run_dir);
    /* The fields shown and compared are strings where present: one of another type is a
     * damaged file, not a "?" to print. */
    static const char *const strs[] = {"format",       "run_id",         "created",
                                       "kiln_version", "dataset_sha256", "dataset_path"};
    for (size_t k = 0; !rc && k < KILN_ARRAY_LEN(strs); k++) {
        const json_t *v = json_object_get(*out, strs[k]);
        if (v && !json_is_string(v))
            rc = kiln_fail(KILN_ERR_FORMAT, "'%s/run.json': \"%s\" is not a string", run_dir,
                           strs[k]);
    }
    const char *fmt = rc ? NULL : json_string_value(json_object_get(*out, "format"));
    if (fmt && strcmp(fmt, "kiln-run/1"))
        rc = kiln_fail(KILN_ERR_FORMAT, "'%s/run.json': format '%s' is not kiln-run/1", run_dir,
                       fmt);
    if (rc) {
        json_decref(*out);
        *out = NULL;
    }
    return rc;
}

/* The run's metrics.db, read-only, when it has one. The run directory is followed as the
 * caller names it (resolved here, so that SQLite's SQLITE_OPEN_NOFOLLOW, which refuses a
 * symlink anywhere in the path, refuses only one at metrics.db itself: a database linked from
 * elsewhere is never read). */
static kiln_err open_db(const char *run_dir, kiln_run_metrics **mx) {
    *mx = NULL;
    char *real = realpath(run_dir, NULL);
    if (!real) return errno == ENOMEM ? kiln_fail(KILN_ERR_NOMEM, "out of memory") : KILN_OK;
    char *p = kiln_path_join(real, "metrics.db");
    free(real);
    if (!p) return KILN_ERR_NOMEM;
    struct stat sb;
    kiln_err rc = KILN_OK;
    if (lstat(p, &sb) != 0)
        rc = KILN_OK; /* none yet */
    else if (!S_ISREG(sb.st_mode))
        rc = kiln_fail(KILN_ERR_FORMAT, "'%s/metrics.db': is %s; a run's database is a regular "
                       "file of its own", run_dir, kiln_file_kind(sb.st_mode));
    else
        rc = kiln_run_metrics_open(p, true, mx);
    free(p);
    return rc;
}

kiln_err kiln_run_open_metrics(const char *run_dir, json_t **run, kiln_run_metrics **mx) {
    *mx = NULL;
    json_t *j = NULL;
    KILN_TRY(load_run_json(run_dir, &j));
    kiln_err rc = open_db(run_dir, mx);
    if (!rc && !*mx)
        rc = kiln_fail(KILN_ERR_NOTFOUND, "'%s': no metrics.db: the run has logged no step yet",
                       run_dir);
    if (!rc && run)
        *run = j;
    else
        json_decref(j);
    return rc;
}

static char *col_dup(sqlite3_stmt *s, int i) {
    const char *t = (const char *)sqlite3_column_text(s, i);
    return kiln_strdup(t ? t : "");
}

/* An event's kind or message as read: SQL's substr(x, 1, RUN_TEXT_SQL) and cut here to
 * RUN_TEXT_MAX bytes where a character begins, "…" marking a cut. A run's metrics.db is not
 * the reader's: 2000 events of 2 MiB each would otherwise be 4 GiB held for one page. */
#define RUN_TEXT_MAX 4096
#define RUN_TEXT_SQL "4097"
static char *col_cut(sqlite3_stmt *s, int i) {
    const char *t = (const char *)sqlite3_column_text(s, i);
    size_t n = t ? strlen(t) : 0;
    if (n <= RUN_TEXT_MAX) return kiln_strdup(t ? t : "");
    n = RUN_TEXT_MAX;
    while (n && ((unsigned char)t[n] & 0xC0) == 0x80)
        n--;
    return kiln_asprintf("%.*s\xE2\x80\xA6", (int)n, t);
}

static void events_free(kiln_run_event *e, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(e[i].kind);
        free(e[i].message);
    }
    free(e);
}

void kiln_run_info_release(kiln_run_info *info) {
    free(info->stop_kind);
    free(info->stop_message);
    json_decref(info->run);
    json_decref(info->layers);
    json_decref(info->last_val_targets);
    free(info->ckpts);
    events_free(info->events, info->n_events);
    memset(info, 0, sizeof *info);
}

static kiln_err read_metrics(sqlite3 *db, const char *run_dir, size_t max_events, bool best_val,
                             kiln_run_info *o) {
    sqlite3_stmt *s = NULL;
    kiln_err rc = KILN_OK;
#define PREP(sql)                                                                                  \
    do {                                                                                           \
        sqlite3_finalize(s);                                                                       \
        s = NULL;                                                                                  \
        KILN_CHECK_IF(rc, out, sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK,             \
                      KILN_ERR_IO, "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));            \
    } while (0)
    /* One read transaction: a trainer committing steps meanwhile cannot make the last step,
     * the best validation and the events below come from two moments. */
    KILN_CHECK_IF(rc, out, sqlite3_exec(db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK, KILN_ERR_IO,
                  "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
    PREP("SELECT step, loss, lr, grad_norm, time FROM steps ORDER BY step DESC LIMIT 1");
    if (sqlite3_step(s) == SQLITE_ROW) {
        o->last_step = sqlite3_column_int64(s, 0);
        o->last_loss = kiln_run_col_num(s, 1);
        o->last_lr = kiln_run_col_num(s, 2);
        o->last_grad_norm = kiln_run_col_num(s, 3);
        o->updated = kiln_run_col_num(s, 4);
    }
    /* Tokens over time, not a mean of rates: a slow step (a checkpoint) weighs its time. */
    PREP("SELECT count(*) / sum(1.0 / tokens_per_s) FROM (SELECT tokens_per_s FROM steps "
         "WHERE tokens_per_s > 0 ORDER BY step DESC LIMIT 100)");
    if (sqlite3_step(s) == SQLITE_ROW) o->tokens_per_s = kiln_run_col_num(s, 0);
    PREP("SELECT time FROM events ORDER BY id DESC LIMIT 1");
    if (sqlite3_step(s) == SQLITE_ROW && !(kiln_run_col_num(s, 0) <= o->updated))
        o->updated = kiln_run_col_num(s, 0);
    PREP("SELECT count(*) FILTER (WHERE kind = 'nonfinite'), count(*) FILTER (WHERE kind = "
         "'spike') FROM events");
    if (sqlite3_step(s) == SQLITE_ROW) {
        o->n_nonfinite = (size_t)sqlite3_column_int64(s, 0);
        o->n_spikes = (size_t)sqlite3_column_int64(s, 1);
    }
    /* A resume truncates the events after its checkpoint, and a stop recorded at the
     * checkpoint's step itself is superseded by the resume event that follows it. */
    PREP("SELECT kind, substr(message, 1, " RUN_TEXT_SQL ") FROM events WHERE kind IN "
         "('start', 'resume', 'diverged', 'failed') ORDER BY id DESC LIMIT 1");
    if (sqlite3_step(s) == SQLITE_ROW) {
        const char *kind = (const char *)sqlite3_column_text(s, 0);
        if (kind && (!strcmp(kind, "diverged") || !strcmp(kind, "failed"))) {
            o->stop_kind = col_dup(s, 0);
            o->stop_message = col_cut(s, 1);
            KILN_CHECK_IF(rc, out, !o->stop_kind || !o->stop_message, KILN_ERR_NOMEM,
                          "out of memory");
        }
    }
    /* (A scan of every step: kiln runs serve takes the best from its curves instead.) */
    if (best_val)
        PREP("SELECT step, val_loss, val_r2 FROM steps WHERE val_loss IS NOT NULL ORDER BY "
             "val_loss, step LIMIT 1");
    if (best_val && sqlite3_step(s) == SQLITE_ROW) {
        o->best_val_step = sqlite3_column_int64(s, 0);
        o->best_val_loss = kiln_run_col_num(s, 1);
        o->best_val_r2 = kiln_run_col_num(s, 2);
    }
    PREP("SELECT step, val_loss, val_r2 FROM steps WHERE val_loss IS NOT NULL ORDER BY step DESC "
         "LIMIT 1");
    if (sqlite3_step(s) == SQLITE_ROW) {
        o->last_val_step = sqlite3_column_int64(s, 0);
        o->last_val_loss = kiln_run_col_num(s, 1);
        o->last_val_r2 = kiln_run_col_num(s, 2);
    }
    o->last_val_targets = json_array();
    KILN_CHECK_IF(rc, out, !o->last_val_targets, KILN_ERR_NOMEM, "out of memory");
    /* A metrics.db written before val_targets existed has no such table: none to show. */
    sqlite3_finalize(s);
    s = NULL;
    if (o->last_val_step &&
        sqlite3_prepare_v2(db,
                           "SELECT target, name, r2 FROM val_targets WHERE step = ?1 ORDER BY "
                           "target",
                           -1, &s, NULL) == SQLITE_OK) {
        sqlite3_bind_int64(s, 1, (sqlite3_int64)o->last_val_step);
        while (sqlite3_step(s) == SQLITE_ROW) {
            const char *name = (const char *)sqlite3_column_text(s, 1);
            json_t *row =
                json_pack("{s:I,s:s,s:f}", "target", (json_int_t)sqlite3_column_int64(s, 0), "name",
                          name ? name : "", "r2", kiln_run_col_num(s, 2));
            KILN_CHECK_IF(rc, out, !row || json_array_append_new(o->last_val_targets, row),
                          KILN_ERR_NOMEM, "out of memory");
        }
    }
    o->layers = json_array();
    KILN_CHECK_IF(rc, out, !o->layers, KILN_ERR_NOMEM, "out of memory");
    PREP("SELECT layer, attn_entropy, router_entropy, load_imbalance, dead_experts, overflow, "
         "act_rms, expert_load FROM layers WHERE step = ?1 ORDER BY layer");
    sqlite3_bind_int64(s, 1, (sqlite3_int64)o->last_step);
    while (sqlite3_step(s) == SQLITE_ROW) {
        const char *load = (const char *)sqlite3_column_text(s, 7);
        json_t *lj = load ? json_loads(load, JSON_REJECT_DUPLICATES, NULL) : NULL;
        json_t *row = json_pack(
            "{s:I,s:f,s:f,s:f,s:I,s:f,s:f,s:o}", "layer", (json_int_t)sqlite3_column_int64(s, 0),
            "attn_entropy", kiln_run_col_num(s, 1), "router_entropy", kiln_run_col_num(s, 2),
            "load_imbalance", kiln_run_col_num(s, 3), "dead_experts",
            (json_int_t)sqlite3_column_int64(s, 4), "overflow", kiln_run_col_num(s, 5), "act_rms",
            kiln_run_col_num(s, 6), "expert_load", lj ? lj : json_array());
        KILN_CHECK_IF(rc, out, !row || json_array_append_new(o->layers, row), KILN_ERR_NOMEM,
                      "out of memory");
    }
    PREP("SELECT count(*) FROM events");
    if (sqlite3_step(s) == SQLITE_ROW) o->total_events = (size_t)sqlite3_column_int64(s, 0);
    size_t n = o->total_events < max_events ? o->total_events : max_events;
    if (n) {
        o->events = kiln_calloc(n, sizeof *o->events);
        KILN_CHECK_IF(rc, out, !o->events, KILN_ERR_NOMEM, "out of memory");
        PREP("SELECT step, time, substr(kind, 1, " RUN_TEXT_SQL "), substr(message, 1, "
             RUN_TEXT_SQL ") FROM events ORDER BY id DESC LIMIT ?1");
        sqlite3_bind_int64(s, 1, (sqlite3_int64)n);
        size_t k = n;
        while (k > 0 && sqlite3_step(s) == SQLITE_ROW) {
            kiln_run_event *e = &o->events[--k];
            e->step = sqlite3_column_int64(s, 0);
            e->time = sqlite3_column_double(s, 1);
            e->kind = col_cut(s, 2);
            e->message = col_cut(s, 3);
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
    if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    return rc;
}

static kiln_err info_load(const char *run_dir, size_t max_events, bool best_val,
                          kiln_run_info *out) {
    memset(out, 0, sizeof *out);
    out->tokens_per_s = out->updated = NAN;
    KILN_TRY(load_run_json(run_dir, &out->run));
    kiln_run_metrics *mx = NULL;
    out->best_ckpt = -1;
    kiln_err rc = open_db(run_dir, &mx);
    if (!rc && mx) rc = read_metrics(kiln_run_metrics_db(mx), run_dir, max_events, best_val, out);
    if (!rc) rc = kiln_run_ckpt_list(run_dir, &out->ckpts, &out->n_ckpts);
    /* The one the trainer keeps and kiln export --best takes (the trainer's own rule). */
    if (!rc && mx)
        rc = kiln_run_metrics_best_val_step(mx, out->ckpts, out->n_ckpts, &out->best_ckpt);
    kiln_run_metrics_close(mx);
    if (rc) kiln_run_info_release(out);
    return rc;
}

kiln_err kiln_run_info_load(const char *run_dir, size_t max_events, kiln_run_info *out) {
    return info_load(run_dir, max_events, true, out);
}

kiln_err kiln_run_info_load_quick(const char *run_dir, size_t max_events, kiln_run_info *out) {
    return info_load(run_dir, max_events, false, out);
}

/* ---- following (kiln runs show --follow) ---- */

void kiln_run_news_release(kiln_run_news *n) {
    free(n->steps);
    free(n->step_times);
    events_free(n->events, n->n_events);
    memset(n, 0, sizeof *n);
}

/* Whether a row (its step or event id, and log time) is one the cursor has seen: rows are
 * logged in key order, so a seen row is at or below the newest key seen and no later than
 * the newest time seen. (A resume's rows come back below the key, but later.) */
static bool seen(long key, double time, long cur_key, double cur_time) {
    return key <= cur_key && time <= cur_time;
}

kiln_err kiln_run_cursor_end(const char *run_dir, kiln_run_cursor *cur) {
    memset(cur, 0, sizeof *cur);
    kiln_run_metrics *mx = NULL;
    KILN_TRY(open_db(run_dir, &mx));
    if (!mx) return KILN_OK;
    sqlite3 *db = kiln_run_metrics_db(mx);
    kiln_err rc = KILN_OK;
    static const char *const q[] = {"SELECT step, time FROM steps ORDER BY step DESC LIMIT 1",
                                    "SELECT id, time FROM events ORDER BY id DESC LIMIT 1"};
    KILN_CHECK_IF(rc, out, sqlite3_exec(db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK, KILN_ERR_IO,
                  "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
    for (int i = 0; i < 2 && !rc; i++) {
        sqlite3_stmt *s = NULL;
        if (sqlite3_prepare_v2(db, q[i], -1, &s, NULL) != SQLITE_OK)
            rc = kiln_fail(KILN_ERR_IO, "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
        else if (sqlite3_step(s) == SQLITE_ROW) {
            *(i ? &cur->event_id : &cur->step) = (long)sqlite3_column_int64(s, 0);
            double t = sqlite3_column_double(s, 1);
            if (t > cur->time) cur->time = t;
        }
        sqlite3_finalize(s);
    }
out:
    if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    kiln_run_metrics_close(mx);
    return rc;
}

/* The new rows of steps, newest first as read, into n (reversed by the caller). */
static kiln_err follow_steps(sqlite3 *db, const char *run_dir, const kiln_run_cursor *cur,
                             size_t max, long total, kiln_run_news *n, double *newest) {
    sqlite3_stmt *s = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out,
                  sqlite3_prepare_v2(db,
                                     "SELECT step, time, loss, mse, load_balance, z, lr, "
                                     "grad_norm, applied, tokens_per_s, val_loss, val_r2 "
                                     "FROM steps ORDER BY step DESC",
                                     -1, &s, NULL) != SQLITE_OK,
                  KILN_ERR_IO, "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
    size_t cap = 0;
    int r;
    while (n->n_steps < max && (r = sqlite3_step(s)) == SQLITE_ROW) {
        long step = (long)sqlite3_column_int64(s, 0);
        double t = sqlite3_column_double(s, 1);
        if (seen(step, t, cur->step, cur->time)) break;
        if (n->n_steps == cap) {
            size_t c = cap ? 2 * cap : 64;
            kiln_train_progress *a = realloc(n->steps, c * sizeof *a);
            if (a) n->steps = a;
            double *b = a ? realloc(n->step_times, c * sizeof *b) : NULL;
            if (b) n->step_times = b;
            KILN_CHECK_IF(rc, out, !a || !b, KILN_ERR_NOMEM, "out of memory");
            cap = c;
        }
        kiln_train_progress *p = &n->steps[n->n_steps];
        *p = (kiln_train_progress){.step = step,
                                   .steps = total,
                                   .loss = kiln_run_col_num(s, 2),
                                   .mse = kiln_run_col_num(s, 3),
                                   .load_balance = kiln_run_col_num(s, 4),
                                   .z = kiln_run_col_num(s, 5),
                                   .lr = kiln_run_col_num(s, 6),
                                   .grad_norm = kiln_run_col_num(s, 7),
                                   .applied = sqlite3_column_int(s, 8) != 0,
                                   .tokens_per_s = kiln_run_col_num(s, 9),
                                   .has_val = sqlite3_column_type(s, 10) != SQLITE_NULL,
                                   .val_loss = kiln_run_col_num(s, 10),
                                   .val_r2 = kiln_run_col_num(s, 11)};
        n->step_times[n->n_steps++] = t;
        if (t > *newest) *newest = t;
    }
out:
    sqlite3_finalize(s);
    return rc;
}

static kiln_err follow_events(sqlite3 *db, const char *run_dir, const kiln_run_cursor *cur,
                              size_t max, kiln_run_news *n, long *newest_id, double *newest) {
    sqlite3_stmt *s = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out,
                  sqlite3_prepare_v2(db,
                                     "SELECT id, time, step, substr(kind, 1, " RUN_TEXT_SQL
                                     "), substr(message, 1, " RUN_TEXT_SQL
                                     ") FROM events ORDER BY id DESC",
                                     -1, &s, NULL) != SQLITE_OK,
                  KILN_ERR_IO, "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
    size_t cap = 0;
    while (n->n_events < max && sqlite3_step(s) == SQLITE_ROW) {
        long id = (long)sqlite3_column_int64(s, 0);
        double t = sqlite3_column_double(s, 1);
        if (seen(id, t, cur->event_id, cur->time)) break;
        if (n->n_events == cap) {
            size_t c = cap ? 2 * cap : 16;
            kiln_run_event *a = realloc(n->events, c * sizeof *a);
            KILN_CHECK_IF(rc, out, !a, KILN_ERR_NOMEM, "out of memory");
            n->events = a;
            cap = c;
        }
        kiln_run_event *e = &n->events[n->n_events++];
        *e = (kiln_run_event){.step = (long)sqlite3_column_int64(s, 2),
                              .time = t,
                              .kind = col_cut(s, 3),
                              .message = col_cut(s, 4)};
        KILN_CHECK_IF(rc, out, !e->kind || !e->message, KILN_ERR_NOMEM, "out of memory");
        if (n->n_events == 1) *newest_id = id;
        if (t > *newest) *newest = t;
    }
out:
    sqlite3_finalize(s);
    return rc;
}

kiln_err kiln_run_follow(const char *run_dir, kiln_run_cursor *cur, size_t max,
                         kiln_run_news *out) {
    memset(out, 0, sizeof *out);
    json_t *run = NULL;
    KILN_TRY(load_run_json(run_dir, &run));
    json_t *steps = json_object_get(json_object_get(run, "config"), "steps");
    long total = json_is_integer(steps) ? (long)json_integer_value(steps) : 0;
    json_decref(run);
    kiln_run_metrics *mx = NULL;
    KILN_TRY(open_db(run_dir, &mx));
    if (!mx) return KILN_OK;
    sqlite3 *db = kiln_run_metrics_db(mx);
    kiln_err rc = KILN_OK;
    kiln_run_cursor next = *cur;
    /* One read transaction: the steps and the events of one moment. */
    KILN_CHECK_IF(rc, done, sqlite3_exec(db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK, KILN_ERR_IO,
                  "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
    KILN_CHECK(rc, done, follow_steps(db, run_dir, cur, max, total, out, &next.time));
    KILN_CHECK(rc, done, follow_events(db, run_dir, cur, max, out, &next.event_id, &next.time));
    if (out->n_steps) next.step = out->steps[0].step;
    /* Oldest first. */
    for (size_t i = 0, j = out->n_steps; i + 1 < j; i++, j--) {
        kiln_train_progress p = out->steps[i];
        out->steps[i] = out->steps[j - 1];
        out->steps[j - 1] = p;
        double t = out->step_times[i];
        out->step_times[i] = out->step_times[j - 1];
        out->step_times[j - 1] = t;
    }
    for (size_t i = 0, j = out->n_events; i + 1 < j; i++, j--) {
        kiln_run_event e = out->events[i];
        out->events[i] = out->events[j - 1];
        out->events[j - 1] = e;
    }
    *cur = next;
done:
    if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    kiln_run_metrics_close(mx);
    if (rc) kiln_run_news_release(out);
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
    kiln_run_metrics *ma = NULL, *mb = NULL;
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
    sqlite3 *da = kiln_run_metrics_db(ma), *db = kiln_run_metrics_db(mb);
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
            double la = kiln_run_col_num(sa, 1), lb = kiln_run_col_num(sb, 1);
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
    kiln_run_metrics_close(ma);
    kiln_run_metrics_close(mb);
    json_decref(ra);
    json_decref(rb);
    if (rc) kiln_run_diff_release(out);
    return rc;
}

/* ---- series (kiln runs plot) ---- */

static const char *const step_metrics[] = {
    "loss",           "mse",      "load_balance", "z", "lr", "grad_norm", "tokens_per_s",
    "max_abs_output", "val_loss", "val_r2",       NULL};
static const char *const layer_metrics[] = {
    "attn_entropy", "router_entropy", "load_imbalance", "dead_experts",
    "overflow",     "act_rms",        "expert_load",    NULL};
static const char *const tensor_metrics[] = {"grad_norm", "update_ratio", NULL};

static bool in_list(const char *const *list, const char *name, size_t len) {
    for (; *list; list++)
        if (strlen(*list) == len && !strncmp(*list, name, len)) return true;
    return false;
}

void kiln_run_series_free(kiln_run_series *s, size_t n) {
    if (!s) return;
    for (size_t i = 0; i < n; i++) {
        free(s[i].name);
        free(s[i].step);
        free(s[i].value);
    }
    free(s);
}

static kiln_err series_push(kiln_run_series *s, size_t *cap, double step, double value) {
    if (s->n == *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        double *a = realloc(s->step, c * sizeof *a);
        if (a) s->step = a;
        double *b = a ? realloc(s->value, c * sizeof *b) : NULL;
        if (b) s->value = b;
        if (!a || !b) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        *cap = c;
    }
    s->step[s->n] = step;
    s->value[s->n] = value;
    s->n++;
    return KILN_OK;
}

/* The rows of one query (step, value) into series s. */
static kiln_err series_rows(sqlite3_stmt *st, kiln_run_series *s) {
    size_t cap = 0;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW)
        KILN_TRY(
            series_push(s, &cap, (double)sqlite3_column_int64(st, 0), kiln_run_col_num(st, 1)));
    return r == SQLITE_DONE ? KILN_OK : KILN_ERR_IO;
}

/* expert_load@LAYER: one series per expert from the JSON arrays of the layer's rows. */
static kiln_err expert_rows(sqlite3_stmt *st, const char *run_dir, const char *metric,
                            kiln_run_series **out, size_t *n_out) {
    kiln_run_series *s = NULL;
    size_t E = 0, *cap = NULL;
    kiln_err rc = KILN_OK;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        const char *t = (const char *)sqlite3_column_text(st, 1);
        json_t *a = t ? json_loads(t, JSON_REJECT_DUPLICATES, NULL) : NULL;
        size_t n = json_array_size(a);
        if (!s && n) {
            E = n;
            s = kiln_calloc(E, sizeof *s);
            cap = kiln_calloc(E, sizeof *cap);
            for (size_t e = 0; s && cap && e < E; e++)
                if (!(s[e].name = kiln_asprintf("%s/%zu", metric, e))) break;
            if (!s || !cap || !s[E - 1].name) rc = KILN_ERR_NOMEM;
        }
        for (size_t e = 0; !rc && s && e < E; e++) {
            json_t *v = json_array_get(a, e);
            rc = series_push(&s[e], &cap[e], (double)sqlite3_column_int64(st, 0),
                             n == E && json_is_number(v) ? json_number_value(v) : NAN);
        }
        json_decref(a);
        if (rc) break;
    }
    if (!rc && r != SQLITE_DONE) rc = KILN_ERR_IO;
    if (!rc && !s)
        rc = kiln_fail(KILN_ERR_NOTFOUND,
                       "'%s': metric '%s': the run logged no expert loads "
                       "(a dense model?)",
                       run_dir, metric);
    free(cap);
    if (rc) {
        kiln_run_series_free(s, s ? E : 0);
        return rc;
    }
    *out = s;
    *n_out = E;
    return KILN_OK;
}

static kiln_err unknown_metric(const char *run_dir, const char *metric) {
    return kiln_fail(KILN_ERR_USAGE,
                     "'%s': unknown metric '%s': one of loss, mse, load_balance, z, lr, "
                     "grad_norm, tokens_per_s, max_abs_output, val_loss, val_r2; "
                     "NAME@LAYER for attn_entropy, router_entropy, load_imbalance, "
                     "dead_experts, overflow, act_rms, expert_load; NAME@TENSOR for grad_norm, "
                     "update_ratio (kiln runs plot --list shows this run's)",
                     run_dir, metric);
}

kiln_err kiln_run_series_load(const char *run_dir, const char *metric, long from, long to,
                              kiln_run_series **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    const char *at = strchr(metric, '@');
    size_t nlen = at ? (size_t)(at - metric) : strlen(metric);
    bool layer = at && in_list(layer_metrics, metric, nlen);
    bool tensor = at && !layer && in_list(tensor_metrics, metric, nlen);
    if (at ? !layer && !tensor : !in_list(step_metrics, metric, nlen))
        return unknown_metric(run_dir, metric);
    long lay = 0;
    if (layer) {
        char *end;
        lay = strtol(at + 1, &end, 10);
        if (!at[1] || *end || lay < 0 || lay > 100000)
            return kiln_fail(KILN_ERR_USAGE, "'%s': metric '%s': a layer is a number from 0",
                             run_dir, metric);
    }
    if (tensor && !at[1])
        return kiln_fail(KILN_ERR_USAGE, "'%s': metric '%s': no tensor name after '@'", run_dir,
                         metric);
    kiln_run_metrics *mx = NULL;
    KILN_TRY(kiln_run_open_metrics(run_dir, NULL, &mx));
    sqlite3 *db = kiln_run_metrics_db(mx);
    sqlite3_stmt *st = NULL;
    kiln_run_series *s = NULL;
    kiln_err rc = KILN_OK;
    char sql[256];
    /* Does the layer or tensor exist at all? (Else an empty chart would look like a bug.) */
    if (layer || tensor) {
        snprintf(sql, sizeof sql, "SELECT count(*) FROM %s WHERE %s = ?1",
                 layer ? "layers" : "tensors", layer ? "layer" : "name");
        KILN_CHECK_IF(rc, out, sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK, KILN_ERR_IO,
                      "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
        if (layer)
            sqlite3_bind_int64(st, 1, lay);
        else
            sqlite3_bind_text(st, 1, at + 1, -1, SQLITE_STATIC);
        KILN_CHECK_IF(rc, out, sqlite3_step(st) != SQLITE_ROW, KILN_ERR_IO, "'%s/metrics.db': %s",
                      run_dir, sqlite3_errmsg(db));
        KILN_CHECK_IF(rc, out, !sqlite3_column_int64(st, 0), KILN_ERR_NOTFOUND,
                      "'%s': metric '%s': the run logged no %s '%s' (kiln runs plot --list "
                      "shows what it did)",
                      run_dir, metric, layer ? "layer" : "tensor", at + 1);
        sqlite3_finalize(st);
        st = NULL;
    }
    /* Column and table names come from the lists above, never from the caller. */
    if (layer)
        snprintf(sql, sizeof sql,
                 "SELECT step, %.*s FROM layers WHERE step BETWEEN ?1 AND ?2 "
                 "AND layer = ?3 ORDER BY step",
                 (int)nlen, metric);
    else if (tensor)
        snprintf(sql, sizeof sql,
                 "SELECT step, %.*s FROM tensors WHERE step BETWEEN ?1 AND ?2 "
                 "AND name = ?3 ORDER BY step",
                 (int)nlen, metric);
    else
        snprintf(sql, sizeof sql,
                 "SELECT step, %s FROM steps WHERE step BETWEEN ?1 AND ?2%s "
                 "ORDER BY step",
                 metric,
                 !strncmp(metric, "val_", 4) ? " AND val_loss IS NOT "
                                               "NULL"
                                             : "");
    KILN_CHECK_IF(rc, out, sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK, KILN_ERR_IO,
                  "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
    sqlite3_bind_int64(st, 1, from);
    sqlite3_bind_int64(st, 2, to);
    if (layer) sqlite3_bind_int64(st, 3, lay);
    if (tensor) sqlite3_bind_text(st, 3, at + 1, -1, SQLITE_STATIC);
    if (layer && !strncmp(metric, "expert_load@", 12)) {
        rc = expert_rows(st, run_dir, metric, out, n_out);
        if (rc == KILN_ERR_IO)
            rc = kiln_fail(rc, "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
        goto out;
    }
    s = kiln_calloc(1, sizeof *s);
    KILN_CHECK_IF(rc, out, !s || !(s->name = kiln_strdup(metric)), KILN_ERR_NOMEM, "out of memory");
    rc = series_rows(st, s);
    if (rc == KILN_ERR_IO) rc = kiln_fail(rc, "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
    if (!rc) {
        *out = s;
        *n_out = 1;
        s = NULL;
    }
out:
    kiln_run_series_free(s, 1);
    sqlite3_finalize(st);
    kiln_run_metrics_close(mx);
    return rc;
}

kiln_err kiln_run_metrics_list(const char *run_dir, char **out) {
    *out = NULL;
    kiln_run_metrics *mx = NULL;
    KILN_TRY(kiln_run_open_metrics(run_dir, NULL, &mx));
    sqlite3 *db = kiln_run_metrics_db(mx);
    sqlite3_stmt *st = NULL;
    char *buf = NULL;
    size_t len = 0;
    kiln_err rc = KILN_OK;
    FILE *f = open_memstream(&buf, &len);
    KILN_CHECK_IF(rc, out, !f, KILN_ERR_NOMEM, "out of memory");
    fprintf(f, "steps:");
    for (const char *const *m = step_metrics; *m; m++)
        fprintf(f, " %s", *m);
    KILN_CHECK_IF(rc, out,
                  sqlite3_prepare_v2(db, "SELECT min(layer), max(layer) FROM layers", -1, &st,
                                     NULL) != SQLITE_OK ||
                      sqlite3_step(st) != SQLITE_ROW,
                  KILN_ERR_IO, "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
    if (sqlite3_column_type(st, 0) != SQLITE_NULL) {
        fprintf(f, "\nlayers %lld to %lld: NAME@LAYER for", (long long)sqlite3_column_int64(st, 0),
                (long long)sqlite3_column_int64(st, 1));
        for (const char *const *m = layer_metrics; *m; m++)
            fprintf(f, " %s", *m);
    }
    sqlite3_finalize(st);
    st = NULL;
    KILN_CHECK_IF(rc, out,
                  sqlite3_prepare_v2(db, "SELECT DISTINCT name FROM tensors ORDER BY name", -1, &st,
                                     NULL) != SQLITE_OK,
                  KILN_ERR_IO, "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
    bool first = true;
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (first) fprintf(f, "\ntensors: NAME@TENSOR for grad_norm update_ratio; TENSOR one of");
        first = false;
        fprintf(f, "\n  %s", (const char *)sqlite3_column_text(st, 0));
    }
    fputc('\n', f);
    KILN_CHECK_IF(rc, out, ferror(f), KILN_ERR_NOMEM, "out of memory");
out:
    if (f && fclose(f) && !rc) rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!rc)
        *out = buf;
    else
        free(buf);
    sqlite3_finalize(st);
    kiln_run_metrics_close(mx);
    return rc;
}

kiln_err kiln_run_best_ckpt(const char *run_dir, const long *steps, size_t n, long *best) {
    *best = -1;
    kiln_run_metrics *mx = NULL;
    KILN_TRY(kiln_run_open_metrics(run_dir, NULL, &mx));
    kiln_err rc = kiln_run_metrics_best_val_step(mx, steps, n, best);
    kiln_run_metrics_close(mx);
    KILN_TRY(rc);
    KILN_FAIL_IF(*best < 0, KILN_ERR_NOTFOUND,
                 "'%s': none of the %zu checkpoints' steps logged a finite validation loss "
                 "(validation runs every eval_every steps; a checkpoint at such a step has one)",
                 run_dir, n);
    return KILN_OK;
}

/* A real for a card: NULL (json null) where it is not finite, as jansson holds no inf. */
static json_t *finite_real(double x) {
    return isfinite(x) ? json_real(x) : json_null();
}

kiln_err kiln_run_step_metrics(const char *run_dir, long step, json_t **metrics, double *time) {
    *metrics = NULL;
    *time = NAN;
    kiln_run_metrics *mx = NULL;
    KILN_TRY(open_db(run_dir, &mx));
    if (!mx) return KILN_OK;
    sqlite3 *db = kiln_run_metrics_db(mx);
    sqlite3_stmt *q = NULL;
    kiln_err rc = KILN_OK;
    json_t *m = json_object();
    KILN_CHECK_IF(rc, out, !m, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK_IF(rc, out,
                  sqlite3_prepare_v2(db, "SELECT time, loss FROM steps WHERE step = ?1", -1, &q,
                                     NULL) != SQLITE_OK,
                  KILN_ERR_FORMAT, "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
    sqlite3_bind_int64(q, 1, step);
    int r = sqlite3_step(q);
    if (r == SQLITE_ROW) {
        *time = kiln_run_col_num(q, 0);
        double loss = kiln_run_col_num(q, 1);
        if (isfinite(loss))
            KILN_CHECK_IF(rc, out, json_object_set_new(m, "loss", json_real(loss)), KILN_ERR_NOMEM,
                          "out of memory");
    }
    KILN_CHECK_IF(rc, out, r != SQLITE_ROW && r != SQLITE_DONE, KILN_ERR_IO, "'%s/metrics.db': %s",
                  run_dir, sqlite3_errmsg(db));
    sqlite3_finalize(q);
    q = NULL;
    /* The newest validation at or before step whose loss is finite: the rule
     * kiln_run_metrics_best_val_step ranks checkpoints by (SQLite keeps NaN as NULL; an
     * infinity is kept and skipped here). */
    KILN_CHECK_IF(rc, out,
                  sqlite3_prepare_v2(db,
                                     "SELECT step, val_loss, val_r2 FROM steps WHERE step <= ?1 "
                                     "AND val_loss IS NOT NULL ORDER BY step DESC",
                                     -1, &q, NULL) != SQLITE_OK,
                  KILN_ERR_FORMAT, "'%s/metrics.db': %s", run_dir, sqlite3_errmsg(db));
    sqlite3_bind_int64(q, 1, step);
    while ((r = sqlite3_step(q)) == SQLITE_ROW) {
        double v = kiln_run_col_num(q, 1);
        if (!isfinite(v)) continue;
        json_t *val = json_pack("{s:I,s:f,s:o}", "val_step", (json_int_t)sqlite3_column_int64(q, 0),
                                "val_loss", v, "val_r2", finite_real(kiln_run_col_num(q, 2)));
        bool bad = !val || json_object_update(m, val);
        json_decref(val);
        KILN_CHECK_IF(rc, out, bad, KILN_ERR_NOMEM, "out of memory");
        r = SQLITE_DONE;
        break;
    }
    KILN_CHECK_IF(rc, out, r != SQLITE_DONE, KILN_ERR_IO, "'%s/metrics.db': %s", run_dir,
                  sqlite3_errmsg(db));
    *metrics = m;
    m = NULL;
out:
    sqlite3_finalize(q);
    kiln_run_metrics_close(mx);
    json_decref(m);
    return rc;
}

/* runlist.c - kiln runs list: the runs under some paths side by side, with the config keys
 * a sweep varied found by comparing the runs, filtered and sorted, as a table for a
 * terminal, JSON or CSV. Each run is read with kiln_run_info_load (runs.c) and
 * kiln_run_live (run_dir.c): nothing here opens a run's files itself. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runs_int.h"

static const char *const state_names[] = {"finished", "running", "interrupted",
                                          "diverged", "failed",  "error"};

kiln_run_state kiln_run_state_of(const kiln_run_info *ri, bool live) {
    if (live) return KILN_RUN_RUNNING;
    if (ri->stop_kind)
        return !strcmp(ri->stop_kind, "diverged") ? KILN_RUN_DIVERGED : KILN_RUN_FAILED;
    json_t *steps = json_object_get(json_object_get(ri->run, "config"), "steps");
    long n = json_is_integer(steps) ? (long)json_integer_value(steps) : 0;
    return n > 0 && ri->last_step >= n ? KILN_RUN_FINISHED : KILN_RUN_INTERRUPTED;
}

const char *kiln_run_state_name(kiln_run_state s) {
    return (unsigned)s < KILN_ARRAY_LEN(state_names) ? state_names[s] : "?";
}

/* The columns every row has, in table order: the keys of --sort, --where and the JSON. */
static const char *const columns[] = {"name",         "state",    "step",      "steps",
                                      "loss",         "val_loss", "val_step",  "val_r2",
                                      "tokens_per_s", "updated",  "nonfinite", "spikes"};
#define COLUMN_LIST                                                                                \
    "name state step steps loss val_loss val_step val_r2 tokens_per_s updated nonfinite spikes"

/* The table's short headers, taken as keys too. */
static const char *column_key(const char *key) {
    if (!strcmp(key, "tok/s")) return "tokens_per_s";
    if (!strcmp(key, "nonfin")) return "nonfinite";
    for (size_t i = 0; i < KILN_ARRAY_LEN(columns); i++)
        if (!strcmp(key, columns[i])) return columns[i];
    return NULL;
}

static kiln_err nomem(void) {
    return kiln_fail(KILN_ERR_NOMEM, "out of memory");
}

/* ---- values ---- */

/* Numbers equal by value (an integer and a real, 1e-3 and 0.001), the rest as JSON. */
static bool value_eq(const json_t *a, const json_t *b) {
    if (json_is_integer(a) && json_is_integer(b))
        return json_integer_value(a) == json_integer_value(b);
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    return json_equal((json_t *)a, (json_t *)b);
}

static json_t *num_or_null(double x) {
    return isfinite(x) ? json_real(x) : json_null();
}

/* A row's value of a column or config key as a new reference; NULL when it has none. */
static json_t *row_value(const kiln_run_row *r, const char *key) {
    const char *col = column_key(key);
    if (!col) {
        json_t *v = json_object_get(r->config, key);
        return v && !json_is_null(v) ? json_incref(v) : NULL;
    }
    const bool ok = r->state != KILN_RUN_ERROR;
    if (!strcmp(col, "name")) return json_string(r->name);
    if (!strcmp(col, "state")) return json_string(kiln_run_state_name(r->state));
    if (!strcmp(col, "step")) return ok ? json_integer(r->step) : NULL;
    if (!strcmp(col, "steps")) return ok ? json_integer(r->steps) : NULL;
    if (!strcmp(col, "val_step")) return r->val_step ? json_integer(r->val_step) : NULL;
    if (!strcmp(col, "nonfinite")) return ok ? json_integer(r->nonfinite) : NULL;
    if (!strcmp(col, "spikes")) return ok ? json_integer(r->spikes) : NULL;
    double x = !strcmp(col, "loss")       ? r->loss
               : !strcmp(col, "val_loss") ? r->val_loss
               : !strcmp(col, "val_r2")   ? r->val_r2
               : !strcmp(col, "updated")  ? r->updated
                                          : r->tokens_per_s;
    return isfinite(x) ? json_real(x) : NULL;
}

/* The shortest %g text that reads back as x, with a JSON-like exponent ("1e-5"). */
static void fmt_exact(char *buf, size_t n, double x) {
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, x);
        if (strtod(buf, NULL) == x) break;
    }
    char *e = strchr(buf, 'e');
    if (!e) return;
    char *d = e + 1;
    if (*d == '+') memmove(d, d + 1, strlen(d));
    if (*d == '-') d++;
    while (d[0] == '0' && d[1])
        memmove(d, d + 1, strlen(d));
}

char *kiln_run_config_value_text(const json_t *v) {
    char buf[40];
    if (json_is_string(v)) return kiln_strdup(json_string_value(v));
    if (json_is_integer(v)) return kiln_asprintf("%lld", (long long)json_integer_value(v));
    if (json_is_real(v)) {
        fmt_exact(buf, sizeof buf, json_real_value(v));
        return kiln_strdup(buf);
    }
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_SORT_KEYS);
    if (!s) nomem();
    return s;
}

/* ---- finding and reading runs ---- */

typedef struct rows {
    kiln_run_row *v;
    size_t n, cap;
} rows;

static void row_release(kiln_run_row *r) {
    free(r->name);
    free(r->dir);
    free(r->message);
    json_decref(r->config);
    memset(r, 0, sizeof *r);
}

/* lstat: a run's member is looked at, never followed out of the run. */
static bool has_member(const char *dir, const char *name) {
    char *p = kiln_path_join(dir, name);
    struct stat sb;
    bool yes = p && lstat(p, &sb) == 0;
    free(p);
    return yes;
}

/* What the trainer leaves in a run directory from its first moments. */
static bool looks_like_run(const char *dir) {
    return has_member(dir, "run.json") || has_member(dir, "metrics.db") || has_member(dir, "ckpt");
}

/* A directory itself, not a symlink to one: a directory of runs holds its runs, and a link in
 * it to a run elsewhere (or to /) is no run of it (kiln runs serve reaches nothing outside the
 * directory it serves). The paths a user names are followed (add_path): that is their choice. */
static bool is_dir(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* config's keys into dst as "outer.inner" for nested objects. */
static kiln_err flatten(json_t *dst, const char *prefix, json_t *obj, const char *file) {
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        char *name = prefix ? kiln_asprintf("%s.%s", prefix, k) : kiln_strdup(k);
        if (!name) return nomem();
        kiln_err rc = KILN_OK;
        if (json_is_object(v) && json_object_size(v))
            rc = flatten(dst, name, v, file);
        else if (json_object_get(dst, name))
            rc = kiln_fail(KILN_ERR_FORMAT, "'%s': config key '%s' is there twice once flattened",
                           file, name);
        else if (json_object_set(dst, name, v))
            rc = nomem();
        free(name);
        if (rc) return rc;
    }
    return KILN_OK;
}

/* The compared keys of a run: its config flattened, and the dataset's digest. */
static kiln_err row_config(const kiln_run_info *ri, const char *dir, json_t **out) {
    *out = NULL;
    char *file = kiln_path_join(dir, "run.json");
    json_t *flat = json_object(), *sorted = json_object();
    const char **keys = NULL;
    size_t n = 0;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !file || !flat || !sorted, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, flatten(flat, NULL, json_object_get(ri->run, "config"), file));
    json_t *ds = json_object_get(ri->run, "dataset_sha256");
    if (ds && !json_object_get(flat, "dataset_sha256"))
        KILN_CHECK_IF(rc, out, json_object_set(flat, "dataset_sha256", ds), KILN_ERR_NOMEM,
                      "out of memory");
    keys = kiln_json_sorted_keys(flat, &n);
    KILN_CHECK_IF(rc, out, !keys, KILN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        KILN_CHECK_IF(rc, out, json_object_set(sorted, keys[i], json_object_get(flat, keys[i])),
                      KILN_ERR_NOMEM, "out of memory");
    *out = sorted;
    sorted = NULL;
out:
    free(keys);
    json_decref(flat);
    json_decref(sorted);
    free(file);
    return rc;
}

/* Fill a row from its run directory: a run that cannot be read becomes an ERROR row. Fails
 * only when out of memory. */
static kiln_err load_row(kiln_run_row *r) {
    r->loss = r->val_loss = r->val_r2 = r->tokens_per_s = r->updated = NAN;
    bool live = false;
    kiln_run_info ri;
    kiln_err rc = kiln_run_live(r->dir, &live);
    if (!rc) rc = kiln_run_info_load(r->dir, 0, &ri);
    if (!rc) {
        rc = row_config(&ri, r->dir, &r->config);
        if (rc) kiln_run_info_release(&ri);
    }
    if (rc == KILN_ERR_NOMEM) return rc;
    if (rc) {
        /* A trainer that is starting holds the lock before its run.json lands. */
        if (live && !has_member(r->dir, "run.json")) {
            r->state = KILN_RUN_RUNNING;
            return KILN_OK;
        }
        r->state = KILN_RUN_ERROR;
        r->message = kiln_strdup(kiln_errmsg());
        return r->message ? KILN_OK : KILN_ERR_NOMEM;
    }
    json_t *steps = json_object_get(json_object_get(ri.run, "config"), "steps");
    r->steps = json_is_integer(steps) ? (long)json_integer_value(steps) : 0;
    r->step = ri.last_step;
    if (ri.last_step) r->loss = ri.last_loss;
    if (ri.best_val_step) {
        r->val_step = ri.best_val_step;
        r->val_loss = ri.best_val_loss;
        r->val_r2 = ri.best_val_r2;
    }
    r->tokens_per_s = ri.tokens_per_s;
    r->updated = ri.updated;
    r->nonfinite = (long)ri.n_nonfinite;
    r->spikes = (long)ri.n_spikes;
    r->state = kiln_run_state_of(&ri, live);
    if (ri.stop_kind && !live && !(r->message = kiln_strdup(ri.stop_message))) rc = KILN_ERR_NOMEM;
    kiln_run_info_release(&ri);
    return rc;
}

static kiln_err add_row(rows *rs, char *name, char *dir) {
    if (!name || !dir) {
        free(name);
        free(dir);
        return nomem();
    }
    if (rs->n == rs->cap) {
        size_t c = rs->cap ? rs->cap * 2 : 16;
        kiln_run_row *v = realloc(rs->v, c * sizeof *v);
        if (!v) {
            free(name);
            free(dir);
            return nomem();
        }
        rs->v = v;
        rs->cap = c;
    }
    kiln_run_row *r = &rs->v[rs->n++];
    memset(r, 0, sizeof *r);
    r->name = name;
    r->dir = dir;
    return load_row(r);
}

static int cmp_ver(const void *a, const void *b) {
    return strverscmp(*(const char *const *)a, *(const char *const *)b);
}

/* A path as a name: without trailing slashes. */
static char *trimmed(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    return kiln_asprintf("%.*s", (int)n, path);
}

static kiln_err add_path(rows *rs, const char *path, bool full_names) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return errno == ENOENT ? kiln_fail(KILN_ERR_NOTFOUND, "'%s': no such directory", path)
                               : kiln_fail_errno(KILN_ERR_IO, "cannot read '%s'", path);
    KILN_FAIL_IF(!S_ISDIR(sb.st_mode), KILN_ERR_USAGE,
                 "'%s': not a directory (give a run directory, or one that holds runs)", path);
    if (looks_like_run(path)) return add_row(rs, trimmed(path), trimmed(path));
    DIR *d = opendir(path);
    if (!d) return kiln_fail_errno(KILN_ERR_IO, "cannot read '%s'", path);
    char **kids = NULL;
    size_t n = 0, cap = 0;
    kiln_err rc = KILN_OK;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char *p = kiln_path_join(path, e->d_name);
        KILN_CHECK_IF(rc, out, !p, KILN_ERR_NOMEM, "out of memory");
        bool run = is_dir(p) && looks_like_run(p);
        free(p);
        if (!run) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **k = realloc(kids, cap * sizeof *k);
            KILN_CHECK_IF(rc, out, !k, KILN_ERR_NOMEM, "out of memory");
            kids = k;
        }
        KILN_CHECK_IF(rc, out, !(kids[n] = kiln_strdup(e->d_name)), KILN_ERR_NOMEM,
                      "out of memory");
        n++;
    }
    KILN_CHECK_IF(rc, out, !n, KILN_ERR_USAGE,
                  "'%s': not a run directory and holds none (no run.json, metrics.db or ckpt/ "
                  "in it or in a directory directly under it)",
                  path);
    qsort(kids, n, sizeof *kids, cmp_ver);
    for (size_t i = 0; i < n && !rc; i++) {
        char *dir = kiln_path_join(path, kids[i]);
        rc = add_row(rs, full_names ? kiln_strdup(dir ? dir : "") : kiln_strdup(kids[i]), dir);
    }
out:
    closedir(d);
    for (size_t i = 0; i < n; i++)
        free(kids[i]);
    free(kids);
    return rc;
}

/* ---- filters, sort, comparison ---- */

typedef struct filter {
    char *key;
    json_t *value;
} filter;

static bool known_key(const rows *rs, const char *key) {
    if (column_key(key)) return true;
    for (size_t i = 0; i < rs->n; i++)
        if (json_object_get(rs->v[i].config, key)) return true;
    return false;
}

static kiln_err parse_filter(const rows *rs, const char *text, filter *f) {
    const char *eq = strchr(text, '=');
    KILN_FAIL_IF(!eq || eq == text, KILN_ERR_USAGE, "filter '%s': expected KEY=VALUE", text);
    f->key = kiln_asprintf("%.*s", (int)(eq - text), text);
    if (!f->key) return nomem();
    KILN_FAIL_IF(!known_key(rs, f->key), KILN_ERR_USAGE,
                 "filter '%s': no column or config key '%s' in these runs (columns: " COLUMN_LIST
                 ")",
                 text, f->key);
    /* As --set reads a value: JSON, or else a bare word. */
    json_t *v = json_loads(eq + 1, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
    if (!v || json_is_object(v) || json_is_array(v)) {
        json_decref(v);
        v = json_string(eq + 1);
    }
    f->value = v;
    return v ? KILN_OK : nomem();
}

static bool passes(const kiln_run_row *r, const filter *f, size_t n) {
    for (size_t i = 0; i < n; i++) {
        bool first = true;
        for (size_t j = 0; j < i && first; j++)
            first = strcmp(f[j].key, f[i].key) != 0;
        if (!first) continue; /* this key was judged with its first filter */
        const char *col = column_key(f[i].key);
        if (r->state == KILN_RUN_ERROR && !(col && (!strcmp(col, "name") || !strcmp(col, "state"))))
            continue;
        json_t *v = row_value(r, f[i].key);
        bool any = false;
        for (size_t j = i; j < n && v && !any; j++)
            any = !strcmp(f[j].key, f[i].key) && value_eq(v, f[j].value);
        json_decref(v);
        if (!any) return false;
    }
    return true;
}

typedef struct sort_item {
    int kind; /* 0 number, 1 text, 2 none */
    double num;
    char *text;
    bool desc;
    kiln_run_row row;
    size_t at;
} sort_item;

static int cmp_item(const void *pa, const void *pb) {
    const sort_item *a = pa, *b = pb;
    /* The broken runs at the bottom whatever the order, then the runs without a value. */
    bool ea = a->row.state == KILN_RUN_ERROR, eb = b->row.state == KILN_RUN_ERROR;
    int c = (ea > eb) - (ea < eb);
    if (!c) c = (a->kind > b->kind) - (a->kind < b->kind);
    if (!c && a->kind == 0) c = (a->num > b->num) - (a->num < b->num);
    if (!c && a->kind == 1) c = strverscmp(a->text, b->text);
    if (a->desc && a->kind == b->kind && a->kind != 2) c = -c;
    if (!c) c = strverscmp(a->row.name, b->row.name);
    if (!c) c = (a->at > b->at) - (a->at < b->at);
    return c;
}

static kiln_err sort_rows(rows *rs, const char *spec) {
    bool desc = spec[0] == '-';
    const char *key = spec + desc;
    KILN_FAIL_IF(!known_key(rs, key), KILN_ERR_USAGE,
                 "sort key '%s': no column or config key '%s' in these runs (columns: " COLUMN_LIST
                 ")",
                 spec, key);
    if (!rs->n) return KILN_OK;
    sort_item *it = kiln_calloc(rs->n, sizeof *it);
    if (!it) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    for (size_t i = 0; i < rs->n; i++) {
        it[i] = (sort_item){.kind = 2, .desc = desc, .row = rs->v[i], .at = i};
        json_t *v = row_value(&rs->v[i], key);
        if (json_is_number(v) || json_is_boolean(v)) {
            it[i].kind = 0;
            it[i].num = json_is_number(v) ? json_number_value(v) : json_is_true(v);
        } else if (v) {
            it[i].kind = 1;
            if (!(it[i].text = kiln_run_config_value_text(v))) rc = KILN_ERR_NOMEM;
        }
        json_decref(v);
    }
    if (!rc) {
        qsort(it, rs->n, sizeof *it, cmp_item);
        for (size_t i = 0; i < rs->n; i++)
            rs->v[i] = it[i].row;
    }
    for (size_t i = 0; i < rs->n; i++)
        free(it[i].text);
    free(it);
    return rc;
}

/* same and varied over the readable rows. */
static kiln_err compare(kiln_run_list *l) {
    l->same = json_object();
    l->varied = json_array();
    json_t *all = json_object();
    const char **keys = NULL;
    size_t nk = 0;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !l->same || !l->varied || !all, KILN_ERR_NOMEM, "out of memory");
    const kiln_run_row *first = NULL;
    for (size_t i = 0; i < l->n; i++) {
        if (l->rows[i].state == KILN_RUN_ERROR || !l->rows[i].config) continue;
        l->compared++;
        if (!first) first = &l->rows[i];
        const char *k;
        json_t *v;
        json_object_foreach(l->rows[i].config, k, v) KILN_CHECK_IF(
            rc, out, json_object_set(all, k, json_true()), KILN_ERR_NOMEM, "out of memory");
    }
    KILN_CHECK_IF(rc, out, !(keys = kiln_json_sorted_keys(all, &nk)), KILN_ERR_NOMEM, "out of memory");
    for (size_t k = 0; k < nk; k++) {
        json_t *v0 = json_object_get(first->config, keys[k]);
        bool same = v0 != NULL;
        for (size_t i = 0; i < l->n && same; i++) {
            const kiln_run_row *r = &l->rows[i];
            if (r->state == KILN_RUN_ERROR || !r->config) continue;
            json_t *v = json_object_get(r->config, keys[k]);
            same = v && value_eq(v, v0);
        }
        int bad = same ? json_object_set(l->same, keys[k], v0)
                       : json_array_append_new(l->varied, json_string(keys[k]));
        KILN_CHECK_IF(rc, out, bad, KILN_ERR_NOMEM, "out of memory");
    }
out:
    free(keys);
    json_decref(all);
    return rc;
}

void kiln_run_list_release(kiln_run_list *l) {
    for (size_t i = 0; i < l->n; i++)
        row_release(&l->rows[i]);
    free(l->rows);
    for (size_t i = 0; i < l->errors; i++)
        free(l->error_messages[i]);
    free(l->error_messages);
    json_decref(l->same);
    json_decref(l->varied);
    memset(l, 0, sizeof *l);
}

kiln_err kiln_run_list_load(const char *const *paths, size_t n_paths,
                            const kiln_run_list_opts *opts, kiln_run_list *out) {
    memset(out, 0, sizeof *out);
    const kiln_run_list_opts none = {0};
    if (!opts) opts = &none;
    rows rs = {0};
    filter *f = NULL;
    kiln_err rc = KILN_OK;
    for (size_t i = 0; i < n_paths && !rc; i++)
        rc = add_path(&rs, paths[i], n_paths > 1);
    if (rc) goto out;
    out->found = rs.n;
    for (size_t i = 0; i < rs.n; i++)
        if (rs.v[i].state == KILN_RUN_ERROR) out->errors++;
    if (out->errors) {
        out->error_messages = kiln_calloc(out->errors, sizeof *out->error_messages);
        KILN_CHECK_IF(rc, out, !out->error_messages, KILN_ERR_NOMEM, "out of memory");
        for (size_t i = 0, k = 0; i < rs.n; i++)
            if (rs.v[i].state == KILN_RUN_ERROR)
                KILN_CHECK_IF(rc, out, !(out->error_messages[k++] = kiln_strdup(rs.v[i].message)),
                              KILN_ERR_NOMEM, "out of memory");
    }
    if (opts->n_where) {
        f = kiln_calloc(opts->n_where, sizeof *f);
        KILN_CHECK_IF(rc, out, !f, KILN_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < opts->n_where; i++)
            KILN_CHECK(rc, out, parse_filter(&rs, opts->where[i], &f[i]));
        size_t kept = 0;
        for (size_t i = 0; i < rs.n; i++) {
            if (passes(&rs.v[i], f, opts->n_where))
                rs.v[kept++] = rs.v[i];
            else
                row_release(&rs.v[i]);
        }
        rs.n = kept;
    }
    out->matched = rs.n;
    KILN_CHECK(rc, out, sort_rows(&rs, opts->sort ? opts->sort : "val_loss"));
    out->rows = rs.v;
    out->n = rs.n;
    rs = (rows){0};
    KILN_CHECK(rc, out, compare(out));
    while (opts->top && out->n > opts->top)
        row_release(&out->rows[--out->n]);
out:
    for (size_t i = 0; i < rs.n; i++)
        row_release(&rs.v[i]);
    free(rs.v);
    for (size_t i = 0; f && i < opts->n_where; i++) {
        free(f[i].key);
        json_decref(f[i].value);
    }
    free(f);
    if (rc) kiln_run_list_release(out);
    return rc;
}

/* ---- output ---- */

/* Display columns of UTF-8 text (one per code point: names and values are not wide). */
static int ulen(const char *s) {
    int n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* The byte offset of code point i. */
static size_t uoff(const char *s, int i) {
    size_t b = 0;
    for (; s[b] && i > 0; i--)
        for (b++; ((unsigned char)s[b] & 0xC0) == 0x80; b++) {
        }
    return b;
}

/* s in at most w columns: its start and end around a '…'. Caller frees. */
static char *shorten(const char *s, int w) {
    int n = ulen(s);
    if (n <= w) return kiln_strdup(s);
    if (w < 2) return kiln_strdup("…");
    int head = (w - 1 + 1) / 2, tail = w - 1 - head;
    size_t hb = uoff(s, head), tb = uoff(s, n - tail);
    return kiln_asprintf("%.*s…%s", (int)hb, s, s + tb);
}

/* An ERROR row's state cell: "error: " and the message, the row's own directory left out
 * of the paths it names (the name column says which run), cut at the end to fit room
 * columns (0: no limit). Caller frees. */
static char *error_cell(const kiln_run_row *r, int room) {
    const char *m = r->message ? r->message : "?";
    size_t dl = strlen(r->dir);
    char *text = NULL;
    const char *at = strstr(m, r->dir);
    if (at && at > m && at[-1] == '\'' && at[dl] == '/')
        text = kiln_asprintf("error: %.*s%s", (int)(at - m), m, at + dl + 1);
    else
        text = kiln_asprintf("error: %s", m);
    if (!text || room <= 0 || ulen(text) <= room) return text;
    int keep = room > 1 ? room - 1 : 0;
    char *cut = kiln_asprintf("%.*s…", (int)uoff(text, keep), text);
    free(text);
    return cut;
}

/* 4 significant digits, trailing zeros kept so a column's digits line up. */
static void fmt_sig(char *buf, size_t n, double x, int digits) {
    snprintf(buf, n, "%#.*g", digits, x);
    size_t l = strlen(buf);
    if (l && buf[l - 1] == '.') buf[l - 1] = 0;
}

static void fmt_rate(char *buf, size_t n, double x) {
    static const char *const unit[] = {"", "k", "M", "G", "T"};
    size_t u = 0;
    while (fabs(x) >= 999.5 && u + 1 < KILN_ARRAY_LEN(unit)) {
        x /= 1000;
        u++;
    }
    char num[32];
    fmt_sig(num, sizeof num, x, 3);
    snprintf(buf, n, "%s%s", num, unit[u]);
}

static void fmt_age(char *buf, size_t n, double now, double t) {
    double d = now - t;
    if (!(d > 0)) d = 0;
    if (d < 60)
        snprintf(buf, n, "%.0fs ago", floor(d));
    else if (d < 3600)
        snprintf(buf, n, "%.0fm ago", floor(d / 60));
    else if (d < 48 * 3600)
        snprintf(buf, n, "%.0fh ago", floor(d / 3600));
    else
        snprintf(buf, n, "%.0fd ago", floor(d / 86400));
}

/* Keys people look at first in a sweep's shared settings; the rest follow by name. */
static const char *const first_keys[] = {
    "steps",   "d_model",       "n_layers",      "n_heads", "d_ff",   "n_experts",    "top_k",
    "seq_len", "attn_window",   "batch_size",    "lr",      "min_lr", "warmup_steps", "optimizer",
    "seed",    "aux_loss_coef", "dataset_sha256"};

static int key_rank(const char *k) {
    for (size_t i = 0; i < KILN_ARRAY_LEN(first_keys); i++)
        if (!strcmp(k, first_keys[i])) return (int)i;
    return (int)KILN_ARRAY_LEN(first_keys);
}

static int cmp_shown_key(const void *pa, const void *pb) {
    const char *a = *(const char *const *)pa, *b = *(const char *const *)pb;
    int ra = key_rank(a), rb = key_rank(b);
    return ra != rb ? (ra > rb) - (ra < rb) : strcmp(a, b);
}

/* "same in all 12 runs: d_model=32 n_layers=2 … (+20 more)" within width. */
static kiln_err same_line(FILE *f, const kiln_run_list *l, int width) {
    size_t n = 0;
    const char **keys = kiln_json_sorted_keys(l->same, &n);
    if (!keys) return nomem();
    if (!n) {
        free(keys);
        return KILN_OK;
    }
    qsort(keys, n, sizeof *keys, cmp_shown_key);
    if (width <= 0) width = 120; /* every key is in --json; a pipe gets a line, not a page */
    char lead[64];
    if (l->compared > 1)
        snprintf(lead, sizeof lead, "same in all %zu runs:", l->compared);
    else
        snprintf(lead, sizeof lead, "config:");
    fputs(lead, f);
    int at = ulen(lead);
    kiln_err rc = KILN_OK;
    for (size_t i = 0; i < n; i++) {
        char *v = kiln_run_config_value_text(json_object_get(l->same, keys[i]));
        char *sv = v ? shorten(v, 16) : NULL;
        char *item = sv ? kiln_asprintf(" %s=%s", keys[i], sv) : NULL;
        free(v);
        free(sv);
        if (!item) {
            rc = nomem();
            break;
        }
        char more[48];
        snprintf(more, sizeof more, " … (+%zu more)", n - i - 1);
        int need = ulen(item) + (i + 1 < n ? ulen(more) : 0);
        if (width > 0 && at + need > width) {
            snprintf(more, sizeof more, " … (+%zu more)", n - i);
            fputs(more, f);
            free(item);
            break;
        }
        fputs(item, f);
        at += ulen(item);
        free(item);
    }
    fputc('\n', f);
    free(keys);
    return rc;
}

typedef struct tcol {
    const char *head;
    bool right;  /* numbers */
    bool config; /* a varied key: long text values may be shortened */
    int drop;    /* 0: kept; else dropped in this order (1 first) when too wide */
    char **cell; /* [n] */
    int width;
    bool gone;
} tcol;

enum { C_NAME, C_STATE, C_STEP, C_LOSS, C_VAL, C_R2, C_RATE, C_AGE, C_NF, C_SPK, C_FIXED };

static int table_width(const tcol *c, size_t nc) {
    int w = 0, k = 0;
    for (size_t j = 0; j < nc; j++)
        if (!c[j].gone) w += c[j].width + 2 * (k++ > 0);
    return w;
}

/* The cells of a row's fixed columns (ERROR rows: the name only). */
static kiln_err fixed_cells(const kiln_run_row *r, double now, char **cell) {
    char b[C_FIXED][64];
    memset(b, 0, sizeof b);
    snprintf(b[C_STATE], 64, "%s", kiln_run_state_name(r->state));
    if (r->state != KILN_RUN_ERROR) {
        snprintf(b[C_STEP], 64, "%ld/%ld", r->step, r->steps);
        if (isfinite(r->loss)) fmt_sig(b[C_LOSS], 64, r->loss, 4);
        if (r->val_step) {
            char v[40];
            if (isfinite(r->val_loss))
                fmt_sig(v, sizeof v, r->val_loss, 4);
            else
                snprintf(v, sizeof v, "nan");
            snprintf(b[C_VAL], 64, "%s@%ld", v, r->val_step);
        }
        if (isfinite(r->val_r2)) snprintf(b[C_R2], 64, "%.4f", r->val_r2);
        if (isfinite(r->tokens_per_s)) fmt_rate(b[C_RATE], 64, r->tokens_per_s);
        if (isfinite(r->updated)) fmt_age(b[C_AGE], 64, now, r->updated);
        snprintf(b[C_NF], 64, "%ld", r->nonfinite);
        snprintf(b[C_SPK], 64, "%ld", r->spikes);
    }
    for (int j = 0; j < C_FIXED; j++)
        if (!(cell[j] = kiln_strdup(j == C_NAME ? r->name : b[j]))) return nomem();
    return KILN_OK;
}

static void put_cell(FILE *f, const char *s, int w, bool right, bool last) {
    int pad = w - ulen(s);
    if (right)
        fprintf(f, "%*s%s", pad > 0 ? pad : 0, "", s);
    else
        fprintf(f, "%s%*s", s, last || pad <= 0 ? 0 : pad, "");
}

/* The table's cells: c[j].cell[i] for each of the n rows (the fixed columns, then the config
 * keys that differ). */
static kiln_err table_cells(const kiln_run_list *l, double now, tcol *c, size_t nc) {
    const size_t n = l->n;
    char **fixed = kiln_calloc(C_FIXED, sizeof *fixed);
    kiln_err rc = fixed ? KILN_OK : KILN_ERR_NOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        const kiln_run_row *r = &l->rows[i];
        rc = fixed_cells(r, now, fixed);
        for (int j = 0; j < C_FIXED; j++) {
            c[j].cell[i] = fixed[j];
            fixed[j] = NULL;
        }
        for (size_t j = C_FIXED; !rc && j < nc; j++) {
            json_t *v = r->state == KILN_RUN_ERROR ? NULL : json_object_get(r->config, c[j].head);
            c[j].cell[i] = r->state == KILN_RUN_ERROR ? kiln_strdup("")
                           : v                        ? kiln_run_config_value_text(v)
                                                      : kiln_strdup("-");
            if (!c[j].cell[i]) rc = KILN_ERR_NOMEM;
            if (!rc && json_is_number(v)) c[j].right = true;
        }
    }
    free(fixed);
    return rc;
}

/* Widths from content; the metrics no row has are left out. */
static void table_widths(const kiln_run_list *l, tcol *c, size_t nc) {
    for (size_t j = 0; j < nc; j++) {
        bool any = j < C_LOSS || j >= C_NF;
        for (size_t i = 0; i < l->n; i++) {
            if (l->rows[i].state == KILN_RUN_ERROR && j != C_NAME) continue;
            int w = ulen(c[j].cell[i]);
            if (w > c[j].width) c[j].width = w;
            any |= w > 0;
        }
        c[j].gone = !any;
    }
}

/* Too wide for width: the names, then long config values, shortened in the middle; then the
 * columns least needed to compare runs dropped; then the names shortened further. */
static void table_fit(const kiln_run_list *l, tcol *c, size_t nc, int width) {
    const size_t n = l->n;
    int over = table_width(c, nc) - width;
    int name_min = c[C_NAME].width < 16 ? c[C_NAME].width : 16;
    if (over > 0) {
        int cut = c[C_NAME].width - name_min < over ? c[C_NAME].width - name_min : over;
        c[C_NAME].width -= cut;
        over -= cut;
    }
    for (size_t j = C_FIXED; j < nc && over > 0; j++) {
        int w = ulen(c[j].head);
        for (size_t i = 0; i < n; i++)
            if (json_is_number(json_object_get(l->rows[i].config, c[j].head)) ||
                ulen(c[j].cell[i]) <= 10)
                w = ulen(c[j].cell[i]) > w ? ulen(c[j].cell[i]) : w;
        if (w < 10 && c[j].width > 10) w = 10;
        int cut = c[j].width - w < over ? c[j].width - w : over;
        if (cut > 0) {
            c[j].width -= cut;
            over -= cut;
        }
    }
    for (int d = 1; d <= 6 && over > 0; d++)
        for (size_t j = 0; j < C_FIXED; j++) {
            if (c[j].drop != d || c[j].gone) continue;
            if (j == C_NF || j == C_SPK) {
                bool zero = true;
                for (size_t i = 0; i < n; i++)
                    zero &= !strcmp(c[j].cell[i], "0") || !*c[j].cell[i];
                if (!zero && d < 6) continue;
            }
            c[j].gone = true;
            over = table_width(c, nc) - width;
        }
    if (over > 0) c[C_NAME].width -= over < c[C_NAME].width - 8 ? over : c[C_NAME].width - 8;
    if (c[C_NAME].width < ulen(c[C_NAME].head)) c[C_NAME].width = ulen(c[C_NAME].head);
}

/* The header, then the rows; an ERROR row's message runs on from its state column. */
static kiln_err table_print(FILE *f, const kiln_run_list *l, const tcol *c, size_t nc,
                            int width) {
    size_t last = 0;
    for (size_t j = 0; j < nc; j++)
        if (!c[j].gone) last = j;
    for (size_t j = 0, k = 0; j < nc; j++) {
        if (c[j].gone) continue;
        char *h = shorten(c[j].head, c[j].width);
        if (!h) return nomem();
        if (k++) fputs("  ", f);
        put_cell(f, h, c[j].width, c[j].right, j == last);
        free(h);
    }
    fputc('\n', f);
    for (size_t i = 0; i < l->n; i++) {
        const kiln_run_row *r = &l->rows[i];
        for (size_t j = 0, k = 0; j < nc; j++) {
            if (c[j].gone) continue;
            if (k++) fputs("  ", f);
            if (r->state == KILN_RUN_ERROR && j == C_STATE) {
                char *m = error_cell(r, width > 0 ? width - table_width(c, C_NAME + 1) - 2 : 0);
                if (!m) return nomem();
                fputs(m, f);
                free(m);
                break;
            }
            char *s = shorten(c[j].cell[i], c[j].width);
            if (!s) return nomem();
            put_cell(f, s, c[j].width, c[j].right, j == last);
            free(s);
        }
        fputc('\n', f);
    }
    if (l->n < l->found) fprintf(f, "%zu of %zu runs shown\n", l->n, l->found);
    return KILN_OK;
}

kiln_err kiln_run_list_table(const kiln_run_list *l, int width, double now, char **out) {
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return nomem();
    const size_t nv = json_array_size(l->varied), nc = C_FIXED + nv, n = l->n;
    tcol *c = kiln_calloc(nc, sizeof *c);
    kiln_err rc = c ? KILN_OK : KILN_ERR_NOMEM;
    static const char *const heads[C_FIXED] = {"name",   "state", "step",    "loss",   "val_loss",
                                               "val_r2", "tok/s", "updated", "nonfin", "spikes"};
    static const int drops[C_FIXED] = {0, 0, 0, 6, 0, 5, 2, 1, 4, 3};
    for (size_t j = 0; !rc && j < nc; j++) {
        c[j].head =
            j < C_FIXED ? heads[j] : json_string_value(json_array_get(l->varied, j - C_FIXED));
        c[j].right = j >= C_STEP && j < C_FIXED;
        c[j].config = j >= C_FIXED;
        c[j].drop = j < C_FIXED ? drops[j] : 0;
        c[j].width = ulen(c[j].head);
        if (!(c[j].cell = kiln_calloc(n ? n : 1, sizeof *c[j].cell))) rc = KILN_ERR_NOMEM;
    }
    if (!rc && l->compared) rc = same_line(f, l, width);
    if (!rc && !n) fprintf(f, "no run matches (%zu found)\n", l->found);
    if (!rc && n) rc = table_cells(l, now, c, nc);
    if (!rc && n) {
        table_widths(l, c, nc);
        if (width > 0) table_fit(l, c, nc, width);
        rc = table_print(f, l, c, nc, width);
    }
    for (size_t j = 0; c && j < nc; j++) {
        for (size_t i = 0; c[j].cell && i < n; i++)
            free(c[j].cell[i]);
        free(c[j].cell);
    }
    free(c);
    if (fclose(f) && !rc) rc = nomem();
    if (rc) {
        free(buf);
        return rc == KILN_ERR_NOMEM ? nomem() : rc;
    }
    *out = buf;
    return KILN_OK;
}

json_t *kiln_run_list_json(const kiln_run_list *l) {
    json_t *doc = json_pack("{s:s,s:I,s:I,s:I,s:I,s:O,s:O,s:o}", "format", "kiln-runs-list/1",
                            "found", (json_int_t)l->found, "matched", (json_int_t)l->matched,
                            "errors", (json_int_t)l->errors, "compared", (json_int_t)l->compared,
                            "same", l->same ? l->same : json_null(), "varied",
                            l->varied ? l->varied : json_null(), "runs", json_array());
    json_t *runs = json_object_get(doc, "runs");
    bool bad = !doc;
    for (size_t i = 0; i < l->n && !bad; i++) {
        const kiln_run_row *r = &l->rows[i];
        const bool ok = r->state != KILN_RUN_ERROR;
        char when[21] = "";
        if (isfinite(r->updated)) kiln_format_time((int64_t)r->updated, when);
        json_t *o = json_object();
        bad = !o || json_array_append_new(runs, o);
        if (bad) break;
        struct {
            const char *k;
            json_t *v;
        } f[] = {
            {"name", json_string(r->name)},
            {"dir", json_string(r->dir)},
            {"state", json_string(kiln_run_state_name(r->state))},
            {"message", r->message ? json_string(r->message) : json_null()},
            {"step", ok ? json_integer(r->step) : json_null()},
            {"steps", ok ? json_integer(r->steps) : json_null()},
            {"loss", num_or_null(r->loss)},
            {"val_loss", r->val_step ? num_or_null(r->val_loss) : json_null()},
            {"val_step", r->val_step ? json_integer(r->val_step) : json_null()},
            {"val_r2", r->val_step ? num_or_null(r->val_r2) : json_null()},
            {"tokens_per_s", num_or_null(r->tokens_per_s)},
            {"updated", *when ? json_string(when) : json_null()},
            {"nonfinite", ok ? json_integer(r->nonfinite) : json_null()},
            {"spikes", ok ? json_integer(r->spikes) : json_null()},
            {"config", r->config ? json_incref(r->config) : json_null()},
        };
        /* json_object_set_new takes each value, set or not. */
        for (size_t k = 0; k < KILN_ARRAY_LEN(f); k++)
            bad |= !f[k].v || json_object_set_new(o, f[k].k, f[k].v);
    }
    if (!bad) return doc;
    json_decref(doc);
    return NULL;
}

/* A CSV field: quoted when it holds a comma, a quote or a line break. */
static void csv_field(FILE *f, const char *s, bool first) {
    if (!first) fputc(',', f);
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

kiln_err kiln_run_list_csv(const kiln_run_list *l, char **out) {
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return nomem();
    kiln_err rc = KILN_OK;
    for (size_t k = 0; k < KILN_ARRAY_LEN(columns); k++)
        csv_field(f, columns[k], k == 0);
    csv_field(f, "message", false);
    for (size_t j = 0; j < json_array_size(l->varied); j++)
        csv_field(f, json_string_value(json_array_get(l->varied, j)), false);
    fputc('\n', f);
    for (size_t i = 0; i < l->n && !rc; i++) {
        const kiln_run_row *r = &l->rows[i];
        for (size_t k = 0; k < KILN_ARRAY_LEN(columns); k++) {
            char cell[64] = "";
            json_t *v = row_value(r, columns[k]);
            if (!strcmp(columns[k], "updated") && v)
                kiln_format_time((int64_t)json_number_value(v), cell);
            else if (json_is_string(v))
                snprintf(cell, sizeof cell, "%s", ""); /* written below, unshortened */
            else if (json_is_integer(v))
                snprintf(cell, sizeof cell, "%lld", (long long)json_integer_value(v));
            else if (json_is_real(v))
                fmt_exact(cell, sizeof cell, json_real_value(v));
            csv_field(f, json_is_string(v) ? json_string_value(v) : cell, k == 0);
            json_decref(v);
        }
        csv_field(f, r->message ? r->message : "", false);
        for (size_t j = 0; j < json_array_size(l->varied); j++) {
            json_t *v = json_object_get(r->config, json_string_value(json_array_get(l->varied, j)));
            char *s = v ? kiln_run_config_value_text(v) : kiln_strdup("");
            if (!s) {
                rc = nomem();
                break;
            }
            csv_field(f, s, false);
            free(s);
        }
        fputc('\n', f);
    }
    if (fclose(f) && !rc) rc = nomem();
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    return KILN_OK;
}

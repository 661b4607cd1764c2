/* cmd_runs_serve.c - kiln runs serve: a read-only web page over a directory of runs (a sweep,
 * or one run). Each request reads the runs afresh (train/'s readers: run.json, metrics.db in
 * one read transaction, the checkpoints on disk), so a run in training shows its new steps on
 * reload, and a reader never holds a lock the trainer would wait on (SQLite WAL). web/ draws
 * the pages from the plain values handed to it; no JavaScript, the registry page's content
 * security policy (with the overlay form allowed to this server). */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <microhttpd.h>

#include "cli.h"
#include "kiln.h"
#include "train.h"
#include "web.h"

#define MAX_EVENTS 2000  /* the newest events read for the marks */
#define EVENT_ROWS 200   /* the newest shown in the table */
#define MAX_OVERLAY 10   /* runs on one overlay */
#define CURVE_BUCKETS 500
#define MAX_VARIED 64    /* config keys the sweep's table has a column for */

typedef struct server {
    const char *root;
    kiln_run_cache *cache; /* the steps read so far of each run: a reload reads what is new */
    bool single;           /* root is itself a run: / is its page (issue 30), not a list of one */
} server;

static double now_s(void) {
    return (double)kiln_unix_time();
}

/* ---- answering ---- */

static enum MHD_Result send_error(struct MHD_Connection *c, const server *s, unsigned status,
                                  const char *msg);

static enum MHD_Result send_page(struct MHD_Connection *c, const server *s, unsigned status,
                                 kiln_web_buf *b) {
    size_t len;
    bool over = b->over;
    char *html = kiln_web_buf_take(b, &len);
    /* A page past KILN_WEB_PAGE_MAX: a 500 that says so (the error page itself is small). */
    if (!html && over && status != 500) return send_error(c, s, 500, kiln_errmsg());
    if (!html) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(len, html, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(html);
        return MHD_NO;
    }
    size_t n;
    const kiln_web_header *h = kiln_web_headers_form(&n);
    for (size_t i = 0; i < n; i++)
        MHD_add_response_header(r, h[i].name, h[i].value);
    if (status == 405) MHD_add_response_header(r, "Allow", "GET, HEAD");
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_error(struct MHD_Connection *c, const server *s, unsigned status,
                                  const char *msg) {
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX};
    char title[32];
    snprintf(title, sizeof title, "%u", status);
    kiln_web_runs_begin(&b, title);
    kiln_web_para(&b, msg);
    kiln_web_runs_end(&b, s->root, now_s());
    return send_page(c, s, status, &b);
}

/* ---- finding a run by the name its link carries ---- */

/* "." is the directory served; a name is one of its direct children, no path in it, and a
 * directory itself, not a symlink to one (kiln runs list does not list such a link either).
 * The caller frees the path. NULL: no such name (nothing outside the directory is reachable:
 * the readers open a run's files without following links, train/runs.c). */
static char *run_path(const server *s, const char *name) {
    if (!name || !*name) return NULL;
    if (!strcmp(name, ".")) return kiln_strdup(s->root);
    if (name[0] == '.' || strchr(name, '/') || strlen(name) > 255) return NULL;
    char *p = kiln_path_join(s->root, name);
    struct stat sb;
    if (p && (lstat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
        free(p);
        return NULL;
    }
    return p;
}

/* The name a run's links carry: "." for the directory served itself, else its child's name. */
static const char *link_name(const server *s, const kiln_run_row *r) {
    if (!strcmp(r->dir, s->root)) return ".";
    const char *slash = strrchr(r->dir, '/');
    return slash ? slash + 1 : r->dir;
}

static const char *display_name(const server *s, const char *name) {
    return strcmp(name, ".") ? name : s->root;
}

/* ---- run data as web/'s plain values ---- */

/* What every run shares as "key=value " words (kiln runs list's line); caller frees. */
static char *same_text(const json_t *same) {
    char *t = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&t, &len);
    const char *key;
    json_t *v;
    if (!f) return NULL;
    json_object_foreach((json_t *)same, key, v) {
        char *x = kiln_run_config_value_text(v);
        fprintf(f, "%s=%s ", key, x ? x : "?");
        free(x);
    }
    fclose(f);
    return t;
}

/* The value of each of the n keys in cfg as kiln runs list writes it (NULL: none); the caller
 * frees each. */
static void values_of(const json_t *cfg, const char *const *keys, size_t n, char **out) {
    for (size_t k = 0; k < n; k++) {
        const json_t *x = cfg ? json_object_get(cfg, keys[k]) : NULL;
        out[k] = x ? kiln_run_config_value_text(x) : NULL;
    }
}

static void free_all(char **v, size_t n) {
    for (size_t i = 0; v && i < n; i++)
        free(v[i]);
}

/* A run's curves as series (they point into cv); caller frees the array. */
static kiln_web_series *series_of(const kiln_run_curves *cv) {
    kiln_web_series *s = calloc(cv->n + 1, sizeof *s);
    for (size_t i = 0; s && i < cv->n; i++)
        s[i] = (kiln_web_series){cv->c[i].name, cv->c[i].x, cv->c[i].y, cv->c[i].n};
    return s;
}

/* ---- / ---- */

static enum MHD_Result page_sweep(struct MHD_Connection *c, const server *s) {
    kiln_run_list l;
    const char *paths[1] = {s->root};
    if (kiln_run_list_load(paths, 1, NULL, &l)) return send_error(c, s, 500, kiln_errmsg());
    /* At most MAX_VARIED columns: a run with thousands of config keys of its own must not
     * make the sweep's page too large to show (KILN_WEB_PAGE_MAX). */
    size_t nv_all = json_array_size(l.varied), nv = nv_all < MAX_VARIED ? nv_all : MAX_VARIED;
    const char *varied[MAX_VARIED];
    for (size_t k = 0; k < nv; k++)
        varied[k] = json_string_value(json_array_get(l.varied, k));
    char **vals = calloc(l.n * nv + 1, sizeof *vals);
    kiln_web_run_row *rows = calloc(l.n + 1, sizeof *rows);
    for (size_t i = 0; vals && rows && i < l.n; i++) {
        const kiln_run_row *r = &l.rows[i];
        values_of(r->config, varied, nv, vals + i * nv);
        rows[i] = (kiln_web_run_row){link_name(s, r), kiln_run_state_name(r->state), r->message,
                                     r->step, r->steps, r->loss, r->val_loss, r->val_r2,
                                     r->val_step, r->spikes, r->nonfinite,
                                     (const char *const *)vals + i * nv};
    }
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX, .nomem = !vals || !rows};
    char *same = same_text(l.same);
    kiln_web_sweep sw = {same, varied, nv, nv_all, rows, l.n};
    if (!b.nomem) kiln_web_sweep_page(&b, &sw, s->root, now_s());
    free(same);
    free_all(vals, l.n * nv);
    free(vals);
    free(rows);
    kiln_run_list_release(&l);
    return send_page(c, s, 200, &b);
}

/* ---- /run?r=NAME ---- */

/* A run's config flattened ("opt.beta1"), its values as kiln runs show writes them. */
typedef struct flat {
    kiln_web_kv *v;
    size_t n, cap;
    bool nomem;
} flat;

static void flatten(flat *o, const char *prefix, const json_t *obj) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        char *k = prefix ? kiln_asprintf("%s.%s", prefix, key) : kiln_strdup(key);
        kiln_web_kv *grown = o->n < o->cap ? o->v : realloc(o->v, (2 * o->cap + 8) * sizeof *grown);
        if (grown != o->v) o->v = grown, o->cap = 2 * o->cap + 8;
        if (!k || !grown) {
            free(k);
            o->nomem = true;
            return;
        }
        if (json_is_object(v)) {
            flatten(o, k, v);
            free(k);
            continue;
        }
        o->v[o->n] = (kiln_web_kv){k, kiln_run_config_value_text(v)};
        if (!o->v[o->n++].value) o->nomem = true;
    }
}

static void flat_release(flat *o) {
    for (size_t i = 0; i < o->n; i++) {
        free((char *)o->v[i].key);
        free((char *)o->v[i].value);
    }
    free(o->v);
}

static const char *run_str(const kiln_run_info *ri, const char *key) {
    return json_string_value(json_object_get(ri->run, key));
}

static enum MHD_Result page_run(struct MHD_Connection *c, const server *s, const char *name) {
    char *dir = run_path(s, name);
    if (!dir) return send_error(c, s, 404, "no such run here");
    kiln_run_info ri;
    kiln_err e = kiln_run_info_load_quick(dir, MAX_EVENTS, &ri);
    if (e) {
        free(dir);
        return send_error(c, s, e == KILN_ERR_NOTFOUND ? 404 : 500, kiln_errmsg());
    }
    bool live = false;
    if (kiln_run_live(dir, &live)) live = false;
    kiln_run_curves cv = {0};
    char curves_err[512] = "";
    bool have = !kiln_run_curves_load_cached(s->cache, dir, CURVE_BUCKETS, 8, &cv);
    if (!have) snprintf(curves_err, sizeof curves_err, "%s", kiln_errmsg());
    const json_t *cfg = json_object_get(ri.run, "config");
    kiln_web_event *ev = calloc(ri.n_events + 1, sizeof *ev);
    for (size_t i = 0; ev && i < ri.n_events; i++)
        ev[i] = (kiln_web_event){ri.events[i].step, ri.events[i].kind, ri.events[i].message};
    kiln_web_series *ser = have ? series_of(&cv) : NULL;
    flat conf = {0};
    if (cfg) flatten(&conf, NULL, cfg);
    kiln_web_run_view v = {
        name, display_name(s, name), run_str(&ri, "run_id"), run_str(&ri, "created"),
        run_str(&ri, "dataset_path"), run_str(&ri, "dataset_sha256"), ri.last_step,
        (long)json_integer_value(json_object_get(cfg, "steps")),
        kiln_run_state_name(kiln_run_state_of(&ri, live)), ri.stop_message, ri.ckpts,
        ri.n_ckpts, ri.best_ckpt, ri.n_spikes, ri.n_nonfinite, ri.total_events, ev,
        ri.n_events, conf.v, conf.n, have ? NULL : curves_err, ser, have ? cv.n : 0, cv.first,
        cv.last, cv.n_layers, cv.n_experts, (const char *const *)cv.movers, cv.n_movers,
        cv.sampled, cv.layers_summed, cv.tensors_summed};
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX, .nomem = !ev || (have && !ser) || conf.nomem};
    if (!b.nomem) kiln_web_run_page(&b, &v, s->root, now_s());
    flat_release(&conf);
    free(ser);
    free(ev);
    if (have) kiln_run_curves_release(&cv);
    kiln_run_info_release(&ri);
    free(dir);
    return send_page(c, s, 200, &b);
}

/* ---- /overlay?run=A&run=B ---- */

typedef struct overlay_args {
    const char *names[MAX_OVERLAY];
    size_t n;
    bool too_many;
} overlay_args;

static enum MHD_Result collect_runs(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value) {
    overlay_args *a = cls;
    if (!strcmp(key, "run") && value) {
        if (a->n == MAX_OVERLAY)
            a->too_many = true;
        else
            a->names[a->n++] = value;
    }
    return MHD_YES;
}

/* What differs between the n runs: the config keys they do not share (kiln runs list's
 * "varied", over those runs alone) and each run's value of them; nothing when one cannot
 * be read. The caller frees *same and vals' strings. */
typedef struct differ {
    char *same;
    const char *keys[64];
    size_t nv;
    char *vals[MAX_OVERLAY][64];
    bool have; /* the list is loaded: keys point into it (kiln_run_list_release after) */
} differ;

static void differs_of(const server *s, const overlay_args *a, kiln_run_list *l, differ *d) {
    char *dirs[MAX_OVERLAY];
    const char *paths[MAX_OVERLAY];
    size_t nd = 0;
    for (size_t i = 0; i < a->n; i++)
        if ((dirs[nd] = run_path(s, a->names[i]))) paths[nd] = dirs[nd], nd++;
    bool have = d->have = nd == a->n && kiln_run_list_load(paths, nd, NULL, l) == KILN_OK;
    if (!have) kiln_errclear();
    d->nv = have ? json_array_size(l->varied) : 0;
    if (d->nv > 64) d->nv = 64;
    for (size_t k = 0; k < d->nv; k++)
        d->keys[k] = json_string_value(json_array_get(l->varied, k));
    d->same = have ? same_text(l->same) : NULL;
    for (size_t i = 0; i < a->n; i++) {
        /* the row of run i (the list is sorted by its own key): the one of its directory */
        const json_t *cfg = NULL;
        for (size_t j = 0; have && j < l->n && !cfg; j++)
            if (l->rows[j].dir && !strcmp(l->rows[j].dir, dirs[i])) cfg = l->rows[j].config;
        values_of(cfg, d->keys, d->nv, d->vals[i]);
    }
    for (size_t i = 0; i < nd; i++)
        free(dirs[i]);
}

/* The overlay's query: smooth=W, the moving average's weight (0 draws the curves as they
 * are); 0.9 by default, each curve then drawn faint beneath its average (issue 30: four
 * noisy curves on each other were unreadable). log=1: the loss, validation loss and
 * gradient norm on log axes; log=0: linear; absent: log where the values span two decades
 * (issue 30 asked for a log scale to choose). NULL, or what is wrong. */
static const char *overlay_query(struct MHD_Connection *c, kiln_web_overlay *o) {
    o->smooth = 0.9;
    const char *sa = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "smooth");
    if (sa) {
        char *end = NULL;
        o->smooth = strtod(sa, &end);
        if (!*sa || *end || !(o->smooth >= 0 && o->smooth < 1))
            return "smooth: a weight in [0, 1) (0: no smoothing)";
    }
    const char *la = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "log");
    if (la && strcmp(la, "0") && strcmp(la, "1")) return "log: 1 (log axes) or 0 (linear ones)";
    o->loss_scale = !la                ? KILN_WEB_SCALE_AUTO
                    : !strcmp(la, "1") ? KILN_WEB_SCALE_LOG
                                       : KILN_WEB_SCALE_LINEAR;
    return NULL;
}

static enum MHD_Result page_overlay(struct MHD_Connection *c, const server *s) {
    overlay_args a = {0};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect_runs, &a);
    if (!a.n) return send_error(c, s, 400, "tick one run or more to overlay them");
    if (a.too_many) return send_error(c, s, 400, "at most 10 runs overlaid at once");
    kiln_run_curves cv[MAX_OVERLAY];
    kiln_web_overlay_run runs[MAX_OVERLAY] = {0};
    kiln_web_overlay o = {.runs = runs};
    unsigned status = 0;
    char msg[600];
    for (; o.n_runs < a.n && !status; o.n_runs++) {
        size_t i = o.n_runs;
        char *dir = run_path(s, a.names[i]);
        kiln_err e = dir ? kiln_run_curves_load(dir, CURVE_BUCKETS, 1, 0, &cv[i]) : KILN_ERR_NOTFOUND;
        free(dir);
        if (!e) {
            runs[i] = (kiln_web_overlay_run){a.names[i], display_name(s, a.names[i]),
                                             series_of(&cv[i]), cv[i].n, cv[i].first, cv[i].last, NULL};
            continue;
        }
        snprintf(msg, sizeof msg, "run '%s': %s", a.names[i],
                 e == KILN_ERR_NOTFOUND && !dir ? "no such run here" : kiln_errmsg());
        status = 404;
        o.n_runs--; /* the one that failed holds nothing */
    }
    const char *bad = status ? NULL : overlay_query(c, &o);
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX};
    differ d = {0};
    kiln_run_list l;
    if (!status && !bad) {
        differs_of(s, &a, &l, &d);
        o.same = d.same, o.keys = d.keys, o.n_keys = d.nv;
        for (size_t i = 0; i < o.n_runs; i++) {
            runs[i].values = (const char *const *)d.vals[i];
            b.nomem |= !runs[i].curves;
        }
        if (!b.nomem) kiln_web_overlay_page(&b, &o, s->root, now_s());
    }
    for (size_t i = 0; i < o.n_runs; i++) {
        free((kiln_web_series *)runs[i].curves);
        free_all(d.vals[i], d.nv);
        kiln_run_curves_release(&cv[i]);
    }
    free(d.same);
    if (d.have) kiln_run_list_release(&l);
    if (status) return send_error(c, s, status, msg);
    if (bad) return send_error(c, s, 400, bad);
    return send_page(c, s, 200, &b);
}

/* ---- /explain?r=NAME&step=N ---- */

static double num(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* kiln runs explain's answer as plain values (pointing into d); false: out of memory. */
static bool explain_of(const json_t *d, kiln_web_explain *x) {
    const json_t *fi = json_object_get(d, "findings"), *sm = json_object_get(d, "step_metrics");
    const json_t *te = json_object_get(d, "tensors"), *ev = json_object_get(d, "events");
    kiln_web_kv *f = calloc(json_array_size(fi) + json_array_size(ev) + 1, sizeof *f);
    kiln_web_explain_figure *g =
        calloc(json_object_size(sm) + json_array_size(te) + 1, sizeof *g);
    *x = (kiln_web_explain){.findings = f, .metrics = g};
    if (!f || !g) return false;
    x->events = f + json_array_size(fi), x->tensors = g + json_object_size(sm);
    size_t i;
    const char *key;
    json_t *v;
    json_array_foreach(fi, i, v) f[x->n_findings++] = (kiln_web_kv){
        json_string_value(json_object_get(v, "kind")), json_string_value(json_object_get(v, "text"))};
    json_array_foreach(ev, i, v) f[x->n_findings + x->n_events++] = (kiln_web_kv){
        json_string_value(json_object_get(v, "kind")), json_string_value(json_object_get(v, "message"))};
    json_object_foreach((json_t *)sm, key, v) g[x->n_metrics++] =
        (kiln_web_explain_figure){key, num(v, "value"), num(v, "median"), num(v, "ratio")};
    json_array_foreach(te, i, v) g[x->n_metrics + x->n_tensors++] = (kiln_web_explain_figure){
        json_string_value(json_object_get(v, "name")), num(v, "value"), num(v, "median"), num(v, "ratio")};
    return true;
}

static enum MHD_Result page_explain(struct MHD_Connection *c, const server *s, const char *name,
                                    const char *step_arg) {
    char *end = NULL;
    long step = step_arg ? strtol(step_arg, &end, 10) : 0;
    if (!step_arg || !*step_arg || *end || step < 1)
        return send_error(c, s, 400, "step: a step number from 1");
    char *dir = run_path(s, name);
    if (!dir) return send_error(c, s, 404, "no such run here");
    json_t *d = NULL;
    kiln_err e = kiln_run_explain(dir, step, 0, &d);
    free(dir);
    if (e) return send_error(c, s, e == KILN_ERR_USAGE || e == KILN_ERR_NOTFOUND ? 404 : 500,
                             kiln_errmsg());
    kiln_web_explain x;
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX, .nomem = !explain_of(d, &x)};
    x.name = name, x.title = display_name(s, name), x.step = step;
    if (!b.nomem) kiln_web_explain_page(&b, &x, s->root, now_s());
    free((kiln_web_kv *)x.findings);
    free((kiln_web_explain_figure *)x.metrics);
    json_decref(d);
    return send_page(c, s, 200, &b);
}

/* ---- the server ---- */

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **state) {
    const server *s = cls;
    if (!*state) { /* the first call: headers only */
        *state = (void *)1;
        return MHD_YES;
    }
    if (strcmp(method, "GET") && strcmp(method, "HEAD"))
        return send_error(c, s, 405, "kiln runs serve reads only: GET or HEAD");
    if (*upload_size) return send_error(c, s, 400, "no request body expected");
    const char *r = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "r");
    if (!strcmp(url, "/")) return s->single ? page_run(c, s, ".") : page_sweep(c, s);
    if (!strcmp(url, "/run")) return page_run(c, s, r);
    if (!strcmp(url, "/overlay")) return page_overlay(c, s);
    if (!strcmp(url, "/explain"))
        return page_explain(c, s, r, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "step"));
    return send_error(c, s, 404, "no such page");
}

int cmd_runs_serve(int argc, char **argv) {
    const char *listen = NULL;
    const cli_opt opts[] = {
        {"listen", CLI_STR, &listen, "HOST:PORT",
         "address to listen on (default 127.0.0.1:0: a free port, printed)", false},
        {0},
    };
    const cli_spec spec = {
        "kiln runs serve [--listen HOST:PORT] DIR",
        "Serve a read-only web page of a sweep of runs or one run: the runs as kiln runs list "
        "has them, each run's curves, events and checkpoints, runs overlaid; reload for new "
        "steps.",
        opts, 1, 1};
    const char *dir;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &dir, &rc)) return rc;
    if (!listen) listen = "127.0.0.1:0";
    /* The registry's rule (web/httpd.c), checked before the directory is read. */
    struct sockaddr_storage ss;
    bool v6 = false;
    kiln_err e = kiln_web_listen_parse(listen, &ss, &v6);
    if (e) return cli_usage_error("--listen: %s", kiln_errmsg());
    /* The directory must hold runs now: a typo is said at once, not as an empty page. */
    kiln_run_list l;
    const char *paths[1] = {dir};
    e = kiln_run_list_load(paths, 1, NULL, &l);
    if (e) return cli_fail(e);
    char *root = kiln_strdup(dir);
    if (!root) {
        kiln_run_list_release(&l);
        return cli_fail(kiln_fail(KILN_ERR_NOMEM, "out of memory"));
    }
    size_t rl = strlen(root);
    while (rl > 1 && root[rl - 1] == '/')
        root[--rl] = 0;
    server s = {root, NULL, false};
    s.single = l.n == 1 && !strcmp(link_name(&s, &l.rows[0]), ".");
    kiln_run_list_release(&l);
    e = kiln_run_cache_create(&s.cache);
    if (e) {
        free(root);
        return cli_fail(e);
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    /* The registry's daemon (web/httpd.c): the same threads, per-address connection limit and
     * header and idle timeouts, so that one address holding connections half-open cannot
     * lock every other client out. */
    kiln_web_http_opts ho = {.listen = listen, .handler = handler, .handler_cls = &s,
                             .what = "kiln runs serve"};
    kiln_web_http *http = NULL;
    e = kiln_web_http_start(&ho, &http);
    if (e) {
        free(root);
        kiln_run_cache_free(s.cache);
        return cli_fail(e);
    }
    unsigned port = kiln_web_http_port(http);
    const char *colon = strrchr(listen, ':');
    printf("kiln runs: serving '%s' on http://%.*s:%u/\n", root, (int)(colon - listen), listen,
           port);
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    kiln_web_http_stop(http);
    kiln_run_cache_free(s.cache);
    free(root);
    return 0;
}

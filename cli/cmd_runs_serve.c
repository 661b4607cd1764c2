/* cmd_runs_serve.c - kiln runs serve: a read-only web page over a directory of runs (a sweep,
 * or one run). Each request reads the runs afresh (train/'s readers: run.json, metrics.db in
 * one read transaction, the checkpoints on disk), so a run in training shows its new steps on
 * reload, and a reader never holds a lock the trainer would wait on (SQLite WAL). web/ draws
 * the pages from the plain values handed to it; no JavaScript, the registry page's content
 * security policy (with the overlay form allowed to this server). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <microhttpd.h>

#include "cli.h"
#include "kiln.h"
#include "runs.h"
#include "runs_views.h"
#include "web.h"

typedef struct server {
    char *root;
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
    kiln_web_runs_error(&b, status, msg, s->root, now_s());
    return send_page(c, s, status, &b);
}

/* ---- finding a run by the name its link carries ---- */

/* "." is the directory served; a name is one of its direct children, no path in it, and a
 * directory itself, not a symlink to one (kiln runs list does not list such a link either).
 * The caller frees the path. NULL: no such name (nothing outside the directory is reachable:
 * the readers open a run's files without following links, runs/runs.c). */
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

static const char *display_name(const server *s, const char *name) {
    return strcmp(name, ".") ? name : s->root;
}

/* ---- / ---- */

static enum MHD_Result page_sweep(struct MHD_Connection *c, const server *s) {
    runs_sweep_view v;
    kiln_err e = runs_sweep_view_load(s->root, &v);
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX, .nomem = v.nomem};
    if (!e && !b.nomem) kiln_web_sweep_page(&b, &v.sw, s->root, now_s());
    runs_sweep_view_release(&v);
    return e ? send_error(c, s, 500, kiln_errmsg()) : send_page(c, s, 200, &b);
}

/* ---- /run?r=NAME ---- */

static enum MHD_Result page_run(struct MHD_Connection *c, const server *s, const char *name) {
    char *dir = run_path(s, name);
    if (!dir) return send_error(c, s, 404, "no such run here");
    runs_run_view v;
    kiln_err e = runs_run_view_load(s->cache, dir, name, display_name(s, name), &v);
    free(dir);
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX, .nomem = v.nomem};
    if (!e && !b.nomem) kiln_web_run_page(&b, &v.v, s->root, now_s());
    runs_run_view_release(&v);
    if (e) return send_error(c, s, e == KILN_ERR_NOTFOUND ? 404 : 500, kiln_errmsg());
    return send_page(c, s, 200, &b);
}

/* ---- /overlay?run=A&run=B ---- */

typedef struct overlay_args {
    const char *names[RUNS_MAX_OVERLAY];
    size_t n;
    bool too_many;
} overlay_args;

static enum MHD_Result collect_runs(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value) {
    overlay_args *a = cls;
    if (!strcmp(key, "run") && value) {
        if (a->n == RUNS_MAX_OVERLAY)
            a->too_many = true;
        else
            a->names[a->n++] = value;
    }
    return MHD_YES;
}

/* The overlay's query: smooth=W, the moving average's weight (0 draws the curves as they
 * are); 0.9 by default, each curve then drawn faint beneath its average (issue 30: four
 * noisy curves on each other were unreadable). log=1: the loss, validation loss and
 * gradient norm on log axes; log=0: linear; absent: log where the values span two decades
 * (issue 30 asked for a log scale to choose). NULL, or what is wrong. */
static const char *overlay_query(struct MHD_Connection *c, double *smooth, kiln_web_scale *sc) {
    *smooth = 0.9;
    const char *sa = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "smooth");
    if (sa) {
        char *end = NULL;
        *smooth = strtod(sa, &end);
        if (!*sa || *end || !(*smooth >= 0 && *smooth < 1))
            return "smooth: a weight in [0, 1) (0: no smoothing)";
    }
    const char *la = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "log");
    if (la && strcmp(la, "0") && strcmp(la, "1")) return "log: 1 (log axes) or 0 (linear ones)";
    *sc = !la ? KILN_WEB_SCALE_AUTO : !strcmp(la, "1") ? KILN_WEB_SCALE_LOG : KILN_WEB_SCALE_LINEAR;
    return NULL;
}

static enum MHD_Result page_overlay(struct MHD_Connection *c, const server *s) {
    overlay_args a = {0};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect_runs, &a);
    if (!a.n) return send_error(c, s, 400, "tick one run or more to overlay them");
    if (a.too_many) return send_error(c, s, 400, "at most 10 runs overlaid at once");
    const char *titles[RUNS_MAX_OVERLAY];
    char *dirs[RUNS_MAX_OVERLAY], msg[600];
    for (size_t i = 0; i < a.n; i++) {
        titles[i] = display_name(s, a.names[i]);
        dirs[i] = run_path(s, a.names[i]);
    }
    runs_overlay_view v;
    kiln_err e = runs_overlay_view_load(a.names, titles, (const char *const *)dirs, a.n, &v);
    if (e) snprintf(msg, sizeof msg, "%s", kiln_errmsg());
    const char *bad = e ? NULL : overlay_query(c, &v.o.smooth, &v.o.loss_scale);
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX, .nomem = v.nomem};
    if (!e && !bad && !b.nomem) kiln_web_overlay_page(&b, &v.o, s->root, now_s());
    runs_overlay_view_release(&v);
    for (size_t i = 0; i < a.n; i++)
        free(dirs[i]);
    if (e || bad) return send_error(c, s, e ? 404 : 400, e ? msg : bad);
    return send_page(c, s, 200, &b);
}

/* ---- /explain?r=NAME&step=N ---- */

static enum MHD_Result page_explain(struct MHD_Connection *c, const server *s, const char *name,
                                    const char *step_arg) {
    char *end = NULL;
    long step = step_arg ? strtol(step_arg, &end, 10) : 0;
    if (!step_arg || !*step_arg || *end || step < 1)
        return send_error(c, s, 400, "step: a step number from 1");
    char *dir = run_path(s, name);
    if (!dir) return send_error(c, s, 404, "no such run here");
    runs_explain_view v;
    kiln_err e = runs_explain_view_load(dir, step, name, display_name(s, name), &v);
    free(dir);
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX, .nomem = v.nomem};
    if (!e && !b.nomem) kiln_web_explain_page(&b, &v.x, s->root, now_s());
    runs_explain_view_release(&v);
    if (e)
        return send_error(c, s, e == KILN_ERR_USAGE || e == KILN_ERR_NOTFOUND ? 404 : 500,
                          kiln_errmsg());
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

/* The directory served, without trailing slashes, whether it is itself a run, and the cache;
 * it must hold runs now: a typo is said at once, not as an empty page. */
static kiln_err server_open(const char *dir, server *s) {
    kiln_run_list l;
    const char *paths[1] = {dir};
    KILN_TRY(kiln_run_list_load(paths, 1, NULL, &l));
    char *root = kiln_strdup(dir);
    kiln_err e = root ? kiln_run_cache_create(&s->cache) : KILN_ERR_NOMEM;
    if (!root) kiln_fail(e, "out of memory");
    if (e) {
        free(root);
        kiln_run_list_release(&l);
        return e;
    }
    size_t rl = strlen(root);
    while (rl > 1 && root[rl - 1] == '/')
        root[--rl] = 0;
    s->root = root;
    s->single = l.n == 1 && !strcmp(runs_link_name(root, &l.rows[0]), ".");
    kiln_run_list_release(&l);
    return KILN_OK;
}

/* Serve until SIGINT or SIGTERM on the registry's daemon (web/httpd.c): the same threads,
 * per-address connection limit and header and idle timeouts, so that one address holding
 * connections half-open cannot lock every other client out. */
static kiln_err serve(server *s, const char *listen) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    kiln_web_http_opts ho = {
        .listen = listen, .handler = handler, .handler_cls = s, .what = "kiln runs serve"};
    kiln_web_http *http = NULL;
    KILN_TRY(kiln_web_http_start(&ho, &http));
    unsigned port = kiln_web_http_port(http);
    const char *colon = strrchr(listen, ':');
    printf("kiln runs: serving '%s' on http://%.*s:%u/\n", s->root, (int)(colon - listen), listen,
           port);
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    kiln_web_http_stop(http);
    return KILN_OK;
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
    if (kiln_web_listen_parse(listen, &ss, &v6))
        return cli_usage_error("--listen: %s", kiln_errmsg());
    server s = {0};
    kiln_err e = server_open(dir, &s);
    if (e) return cli_fail(e);
    e = serve(&s, listen);
    kiln_run_cache_free(s.cache);
    free(s.root);
    return e ? cli_fail(e) : 0;
}

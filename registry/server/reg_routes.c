/* reg_routes.c - the registry server's route table under /v1/ and its pages, the router
 * (percent-decoded segments against each row's pattern), the checks of a row (its method, the
 * names it captured, the token's scope), and libmicrohttpd's handler, which routes a request,
 * takes its body and answers once it is all in. */
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "server_int.h"

/* ---- routing ---- */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Percent-decode one path segment into out; false on a bad escape, a NUL, or overflow. */
static bool decode_seg(const char *s, size_t n, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int ch = (unsigned char)s[i];
        if (ch == '%') {
            if (i + 2 >= n) return false;
            int hi = hexval(s[i + 1]), lo = hexval(s[i + 2]);
            if (hi < 0 || lo < 0) return false;
            ch = hi * 16 + lo;
            i += 2;
        }
        if (ch == 0 || k + 1 >= cap) return false;
        out[k++] = (char)ch;
    }
    out[k] = 0;
    return true;
}

#define MAX_SEGS 8
/* Splits the raw (undecoded) path into decoded segments; -1 on a malformed one. */
static int split_path(const char *url, char segs[MAX_SEGS][KILN_REGISTRY_NAME_MAX * 3 + 1]) {
    const char *q = strchr(url, '?');
    size_t len = q ? (size_t)(q - url) : strlen(url);
    if (!len || url[0] != '/') return -1;
    int n = 0;
    size_t i = 1;
    while (i <= len) {
        size_t j = i;
        while (j < len && url[j] != '/')
            j++;
        if (n == MAX_SEGS) return -1;
        if (!decode_seg(url + i, j - i, segs[n], sizeof segs[n])) return -1;
        n++;
        i = j + 1;
    }
    return n;
}

/* ---- the routes ---- */

/* What a row asks of its request beyond its method and pattern. */
enum {
    R_OPEN = 1 << 0,    /* no token and no store (its handler gets db NULL): /healthz */
    R_WRITE = 1 << 1,   /* refused on a mirror; a new version or channel follows the naming rule */
    R_PAGE = 1 << 2,    /* a page: refusals are pages too, and an empty {model} is a bad name */
    R_TRUST_N = 1 << 3, /* {version} is a trust version (1 to 2^53-1), in reg_req.trust_v */
};

typedef enum MHD_Result (*route_fn)(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                                    sqlite3 *db);

/* One row per method and route: a new route is one row and one handler. A pattern is
 * literal segments and captures, {model} (into seg[0]), {version} or {channel} (seg[1]) and
 * {digest} (seg[2]), each one percent-decoded segment of the path (so an encoded '/' stays
 * inside a name). The rows of one route share its pattern, which is also the route's label in
 * /metrics; no two patterns match one path. */
typedef struct route_row {
    const char *method; /* "GET" answers HEAD too */
    const char *pattern;
    int route;         /* REG_R_*: how /metrics and the fuzz target name it */
    unsigned scope;    /* what the token needs (KILN_SCOPE_READ: none, unless reads are closed) */
    route_fn fn;       /* the answer, or */
    reg_page_fn page;  /* a page's, rendered by reg_do_page */
    const char *audit; /* the action the handler writes to the audit log; NULL: none */
    unsigned flags;    /* R_* */
} route_row;

static const route_row routes[] = {
    {"GET", "/healthz", REG_R_HEALTH, 0, reg_do_health, NULL, NULL, R_OPEN},
    {"GET", "/metrics", REG_R_METRICS, KILN_SCOPE_READ, reg_do_metrics, NULL, NULL, 0},
    {"GET", "/v1/models", REG_R_MODELS, KILN_SCOPE_READ, reg_do_models, NULL, NULL, 0},
    {"GET", "/v1/models/{model}", REG_R_MODEL, KILN_SCOPE_READ, reg_do_model, NULL, NULL, 0},
    {"GET", "/v1/models/{model}/versions/{version}", REG_R_VERSION, KILN_SCOPE_READ, reg_do_version,
     NULL, NULL, 0},
    {"PUT", "/v1/models/{model}/versions/{version}", REG_R_VERSION, KILN_SCOPE_PUBLISH,
     reg_put_version_start, NULL, "publish", R_WRITE},
    {"GET", "/v1/models/{model}/channels/{channel}", REG_R_CHANNEL, KILN_SCOPE_READ, reg_do_channel,
     NULL, NULL, 0},
    /* The audit action is the record's own: "promote", or "rollback" for a record whose reason
     * says so (reg_record_insert). */
    {"PUT", "/v1/models/{model}/channels/{channel}", REG_R_CHANNEL, KILN_SCOPE_PROMOTE,
     reg_put_record_start, NULL, NULL, R_WRITE},
    {"GET", "/v1/models/{model}/channels/{channel}/history", REG_R_HISTORY, KILN_SCOPE_READ,
     reg_do_history, NULL, NULL, 0},
    {"GET", "/v1/blobs/sha256/{digest}", REG_R_BLOB, KILN_SCOPE_READ, reg_do_blob, NULL, NULL, 0},
    {"GET", "/v1/audit", REG_R_AUDIT, KILN_SCOPE_ADMIN, reg_do_audit, NULL, NULL, 0},
    {"GET", "/v1/tokens", REG_R_TOKENS, KILN_SCOPE_ADMIN, reg_do_tokens, NULL, NULL, 0},
    {"GET", "/v1/trust", REG_R_TRUST, KILN_SCOPE_READ, reg_do_trust, NULL, NULL, 0},
    {"GET", "/v1/trust/{version}", REG_R_TRUST_VERSION, KILN_SCOPE_READ, reg_do_trust, NULL, NULL,
     R_TRUST_N},
    {"PUT", "/v1/trust/{version}", REG_R_TRUST_VERSION, KILN_SCOPE_ADMIN, reg_put_trust_start, NULL,
     "trust.put", R_WRITE | R_TRUST_N},
    {"GET", "/v1/models/{model}/versions/{version}/reproductions", REG_R_REPRODUCTIONS,
     KILN_SCOPE_READ, reg_do_repros, NULL, NULL, 0},
    /* The audit row ("reproduce") is written with the record's insert. */
    {"PUT", "/v1/models/{model}/versions/{version}/reproductions", REG_R_REPRODUCTIONS,
     KILN_SCOPE_PUBLISH, reg_put_repro_start, NULL, "reproduce", R_WRITE},
    {"GET", "/v1/datasets", REG_R_DATASETS, KILN_SCOPE_READ, reg_do_datasets, NULL, NULL, 0},
    {"GET", "/v1/datasets/{model}/sha256/{digest}", REG_R_DATASET, KILN_SCOPE_READ, reg_do_dataset,
     NULL, NULL, 0},
    /* The audit row ("data.publish") is written with the dataset's insert. */
    {"PUT", "/v1/datasets/{model}/sha256/{digest}", REG_R_DATASET, KILN_SCOPE_PUBLISH,
     reg_put_dataset_start, NULL, "data.publish", R_WRITE},
    {"GET", "/", REG_R_UI_HOME, KILN_SCOPE_READ, NULL, reg_page_home, NULL, R_PAGE},
    {"GET", "/ui/models/{model}", REG_R_UI_MODEL, KILN_SCOPE_READ, NULL, reg_page_model, NULL,
     R_PAGE},
    {"GET", "/ui/models/{model}/versions/{version}", REG_R_UI_VERSION, KILN_SCOPE_READ, NULL,
     reg_page_version, NULL, R_PAGE},
    {"GET", "/ui/models/{model}/channels/{channel}", REG_R_UI_CHANNEL, KILN_SCOPE_READ, NULL,
     reg_page_channel, NULL, R_PAGE},
    {"GET", "/ui/audit", REG_R_UI_AUDIT, KILN_SCOPE_ADMIN, NULL, reg_page_audit, NULL, R_PAGE},
    {"GET", "/ui/trust", REG_R_UI_TRUST, KILN_SCOPE_READ, NULL, reg_page_trust, NULL, R_PAGE},
};

/* The route's pattern, the label /metrics counts requests under ("other" for none). */
static const char *route_label(int route) {
    for (size_t i = 0; i < KILN_ARRAY_LEN(routes); i++)
        if (routes[i].route == route) return routes[i].pattern;
    return "other";
}

bool reg_route_row(size_t i, reg_route_info *out) {
    if (i >= KILN_ARRAY_LEN(routes)) return false;
    const route_row *w = &routes[i];
    *out = (reg_route_info){.method = w->method,
                            .pattern = w->pattern,
                            .audit = w->audit,
                            .route = w->route,
                            .scope = w->scope,
                            .handlers = (w->fn != NULL) + (w->page != NULL),
                            .open = w->flags & R_OPEN,
                            .write = w->flags & R_WRITE,
                            .page = w->flags & R_PAGE};
    return true;
}

/* The seg index a pattern's segment p (n bytes) captures into: -1 for a literal, -2 for a
 * capture of no known name (it matches nothing). */
static int capture_of(const char *p, size_t n) {
    static const struct {
        const char *name;
        int seg;
    } caps[] = {{"{model}", 0}, {"{version}", 1}, {"{channel}", 1}, {"{digest}", 2}};
    if (!n || p[0] != '{') return -1;
    for (size_t i = 0; i < KILN_ARRAY_LEN(caps); i++)
        if (strlen(caps[i].name) == n && !strncmp(p, caps[i].name, n)) return caps[i].seg;
    return -2;
}

/* Whether the path's decoded segments s[0..n) match pattern; cap[k] then points at what it
 * captured into seg[k]. */
static bool pattern_match(const char *pattern, char s[][KILN_REGISTRY_NAME_MAX * 3 + 1], int n,
                          const char *cap[3]) {
    const char *p = pattern + 1; /* past the leading '/' */
    for (int i = 0; i < n; i++) {
        if (!p) return false; /* the path is longer */
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int k = capture_of(p, len);
        if (k == -2 || (k == -1 && (strlen(s[i]) != len || strncmp(s[i], p, len)))) return false;
        if (k >= 0) cap[k] = s[i];
        p = e ? e + 1 : NULL;
    }
    return !p;
}

int reg_route_match(const char *url, char seg[3][KILN_REGISTRY_NAME_MAX + 1], bool *bad) {
    char s[MAX_SEGS][KILN_REGISTRY_NAME_MAX * 3 + 1];
    *bad = false;
    int n = split_path(url, s);
    if (n < 0) {
        *bad = true;
        return REG_R_NONE;
    }
    for (size_t i = 0; i < KILN_ARRAY_LEN(routes); i++) {
        const char *cap[3] = {"", "", ""};
        if (!pattern_match(routes[i].pattern, s, n, cap)) continue;
        /* Names are checked where they are used; longer ones are malformed here. */
        for (int k = 0; k < 3; k++)
            if (strlen(cap[k]) > KILN_REGISTRY_NAME_MAX) {
                *bad = true;
                return REG_R_NONE;
            }
        for (int k = 0; k < 3; k++)
            memcpy(seg[k], cap[k], strlen(cap[k]) + 1);
        return routes[i].route;
    }
    return REG_R_NONE;
}

/* ---- the handler ---- */

static enum MHD_Result authorize(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                                 sqlite3 *db, unsigned need, bool *ok) {
    *ok = false;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h) {
        if (need == KILN_SCOPE_READ && !s->read_required) {
            *ok = true;
            return MHD_YES;
        }
        reg_count_refusal(s, REG_AUTH_MISSING);
        return reg_send_error(c, r, 401, "this request needs a token (Authorization: Bearer)");
    }
    const char *token = reg_bearer_token(h);
    if (!token) {
        reg_count_refusal(s, REG_AUTH_MALFORMED);
        return reg_send_error(c, r, 401, "Authorization must be 'Bearer <token>'");
    }
    /* No cache: the token's row is read on every request, so a revocation or an expiry
     * holds from the next request on. */
    reg_auth_refusal why;
    kiln_err rc = reg_token_lookup(db, token, kiln_unix_time(), &r->token_name, &r->scopes, &why);
    if (rc == KILN_ERR_AUTH) {
        reg_count_refusal(s, why);
        return reg_send_error(c, r, 401, "%s", kiln_errmsg());
    }
    if (rc) return reg_send_kiln_error(c, r, rc);
    if (!(r->scopes & need)) {
        static const char *const names[] = {"", "read", "publish", "",     "promote",
                                            "", "",     "",        "admin"};
        reg_count_refusal(s, REG_AUTH_SCOPE);
        return reg_send_error(c, r, 403, "token '%s' lacks the '%s' scope", r->token_name,
                              names[need]);
    }
    *ok = true;
    return MHD_YES;
}

/* Whether row w answers method: "GET" answers HEAD too. */
static bool method_is(const route_row *w, const char *method) {
    return !strcmp(w->method, method) || (!strcmp(w->method, "GET") && !strcmp(method, "HEAD"));
}

/* A 405's Allow header: the methods of route's rows that s answers (a mirror: no writes). */
static void allow_of(const kiln_registry_server *s, int route, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (size_t i = 0; i < KILN_ARRAY_LEN(routes) && n < cap; i++)
        if (routes[i].route == route && !(s->mirror_of && routes[i].flags & R_WRITE))
            n += (size_t)snprintf(out + n, cap - n, "%s%s%s", n ? ", " : "", routes[i].method,
                                  strcmp(routes[i].method, "GET") ? "" : ", HEAD");
}

/* The names the path captured, as w uses them; an answer (400) when one is bad, MHD_YES
 * when all are good. A new version or channel follows the naming rule, so that NAME@REF can
 * only mean one thing (kiln_registry_looks_like_version); what a store holds from before it
 * is still read by its characters. */
static enum MHD_Result check_names(struct MHD_Connection *c, reg_req *r, const route_row *w,
                                   bool *ok) {
    *ok = false;
    bool write = w->flags & R_WRITE;
    kiln_err rc = KILN_OK;
    /* A page's names are checked as the API's are; an empty one is a bad name there too. */
    if (strstr(w->pattern, "{model}") && (r->seg[0][0] || w->flags & R_PAGE))
        rc = kiln_registry_check_name("model", r->seg[0]);
    if (!rc && strstr(w->pattern, "{version}") && !(w->flags & R_TRUST_N))
        rc = write ? kiln_registry_check_version(r->seg[1]) : reg_check_version_chars(r->seg[1]);
    if (!rc && strstr(w->pattern, "{channel}"))
        rc = write ? kiln_registry_check_channel(r->seg[1])
                   : kiln_registry_check_name("channel", r->seg[1]);
    if (rc) return reg_send_kiln_error(c, r, rc);
    if (w->flags & R_TRUST_N && !reg_trust_version_parse(r->seg[1], &r->trust_v))
        return reg_send_error(
            c, r, 400, "'%s' is not a trust version (an integer from 1 to 2^53-1)", r->seg[1]);
    *ok = true;
    return MHD_YES;
}

/* The table's answer: the row of the path's route and the method (400 for a malformed path,
 * 404 when no route's pattern matches, 405 naming the methods that would), the names it
 * captured checked, the token checked against the row's scope (401, 403), then its handler. */
static enum MHD_Result first_call(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                                  const char *url, const char *method) {
    bool bad;
    r->route = reg_route_match(url, r->seg, &bad);
    const route_row *w = NULL, *any = NULL;
    for (size_t i = 0; i < KILN_ARRAY_LEN(routes) && r->route != REG_R_NONE; i++)
        if (routes[i].route == r->route) {
            if (!any) any = &routes[i];
            if (!w && method_is(&routes[i], method)) w = &routes[i];
        }
    r->html = (any && any->flags & R_PAGE) || !strncmp(url, "/ui/", 4);
    if (bad) return reg_send_error(c, r, 400, "malformed path");
    if (!any) return reg_send_error(c, r, 404, "no such route");
    if (!w || (w->flags & R_WRITE && s->mirror_of)) {
        allow_of(s, r->route, r->allow, sizeof r->allow);
        if (!w) return reg_send_error(c, r, 405, "%s is not allowed on %s", method, any->pattern);
        /* a mirror is read-only: it copies its primary */
        return reg_send_error(c, r, 405, "this registry is a mirror of %s: publish there",
                              s->mirror_of);
    }
    r->audit = w->audit;
    if (w->flags & R_OPEN) return w->fn(s, c, r, NULL);
    bool ok;
    enum MHD_Result res = check_names(c, r, w, &ok);
    if (!ok) return res;
    sqlite3 *db = NULL;
    kiln_err rc = reg_db_connect(s->root, &db);
    if (rc) return reg_send_kiln_error(c, r, rc);
    res = authorize(s, c, r, db, w->scope, &ok);
    if (ok) res = w->page ? reg_do_page(s, c, r, db, w->page) : w->fn(s, c, r, db);
    reg_db_close(db);
    return res;
}

static void body_fail(reg_req *r, kiln_err rc) {
    if (r->body_failed) return;
    r->body_failed = true;
    r->body_rc = rc;
    r->body_msg = kiln_strdup(*kiln_errmsg() ? kiln_errmsg() : kiln_strerror(rc));
}

enum MHD_Result reg_http_handler(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls) {
    kiln_registry_server *s = cls;
    (void)version;
    reg_req *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->up.fd = -1;
        r->t0 = kiln_now_ns();
        snprintf(r->method, sizeof r->method, "%s",
                 strlen(method) < sizeof r->method ? method : "OTHER");
        *con_cls = r;
        atomic_fetch_add(&s->in_flight, 1);
        /* (From here the connection has the idle timeout, no longer the header one: web/httpd.c
         * switches it on every handler call.) */
        /* A response queued on this first call is an "early" one to libmicrohttpd 0.9.75,
         * which then closes the connection after it (it cannot know the body was read): a
         * GET or HEAD without a body is answered on the next call, once the request is
         * complete, so that the connection is kept alive. A request with a body is routed
         * now, so that a refusal comes before the body is read (and closes). */
        if ((!strcmp(method, "GET") || !strcmp(method, "HEAD")) &&
            !MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length") &&
            !MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding")) {
            r->deferred = true;
            return MHD_YES;
        }
        kiln_errclear();
        return first_call(s, c, r, url, method);
    }
    if (r->deferred && !*upload_data_size) {
        r->deferred = false;
        kiln_errclear();
        return first_call(s, c, r, url, method);
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (r->body_failed) return MHD_YES; /* drain: answered once the body is in */
        if (r->body == REG_BODY_ARCHIVE || r->body == REG_BODY_DATASET) {
            kiln_err rc =
                r->up.size + n > r->declared
                    ? kiln_fail(KILN_ERR_VERIFY, "upload is longer than its Content-Length")
                    : reg_upload_write(&r->up, upload_data, n);
            if (rc) body_fail(r, rc);
        } else if (r->body == REG_BODY_RECORD || r->body == REG_BODY_TRUST ||
                   r->body == REG_BODY_REPRO) {
            if (r->rec_len + n > r->rec_cap)
                body_fail(r, kiln_fail(KILN_ERR_LIMIT, "%s is longer than its Content-Length",
                                       r->body == REG_BODY_RECORD  ? "channel record"
                                       : r->body == REG_BODY_TRUST ? "trust version"
                                                                   : "reproduction record"));
            else {
                memcpy(r->rec + r->rec_len, upload_data, n);
                r->rec_len += n;
            }
        }
        return MHD_YES;
    }
    sqlite3 *db = NULL;
    kiln_err rc = reg_db_connect(s->root, &db);
    if (rc) return reg_send_kiln_error(c, r, rc);
    enum MHD_Result res = r->body == REG_BODY_ARCHIVE   ? reg_put_version_finish(s, c, r, db)
                          : r->body == REG_BODY_RECORD  ? reg_put_record_finish(s, c, r, db)
                          : r->body == REG_BODY_TRUST   ? reg_put_trust_finish(s, c, r, db)
                          : r->body == REG_BODY_DATASET ? reg_put_dataset_finish(s, c, r, db)
                          : r->body == REG_BODY_REPRO   ? reg_put_repro_finish(s, c, r, db)
                                                        : reg_send_error(c, r, 500, "no response");
    reg_db_close(db);
    return res;
}

void reg_http_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                        enum MHD_RequestTerminationCode toe) {
    kiln_registry_server *s = cls;
    (void)c;
    reg_req *r = *con_cls;
    if (!r) return;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !r->status)
        r->status = 499; /* client went away */
    reg_count_request(s, r, route_label(r->route));
    reg_upload_abort(&r->up);
    free(r->token_name);
    free(r->body_msg);
    free(r->sig);
    free(r->rec);
    free(r);
    *con_cls = NULL;
    atomic_fetch_sub(&s->in_flight, 1);
}

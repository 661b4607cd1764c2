/* server.c - the core of the registry's HTTP server: the trust policy in force, shared by the
 * requests that use it, the answers every route sends (JSON, pages, errors), and the pieces
 * that parse request bytes. The route table and the handler are reg_routes.c's, the routes'
 * answers reg_reads.c's and reg_writes.c's, /metrics reg_metrics.c's, and starting, TLS and
 * stopping reg_listen.c's. */
#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "server_int.h"

/* ---- the policy in force ---- */

reg_trust_ref *reg_trust_acquire(kiln_registry_server *s) {
    pthread_mutex_lock(&s->trust_mu);
    reg_trust_ref *t = s->trust;
    if (t) t->refs++;
    pthread_mutex_unlock(&s->trust_mu);
    return t;
}

void reg_trust_release(kiln_registry_server *s, reg_trust_ref *t) {
    if (!t) return;
    pthread_mutex_lock(&s->trust_mu);
    bool last = --t->refs == 0;
    pthread_mutex_unlock(&s->trust_mu);
    if (last) {
        kiln_sign_trust_free(t->t);
        free(t);
    }
}

/* Make t (owned from here on) the policy in force. */
kiln_err reg_trust_swap(kiln_registry_server *s, kiln_sign_trust *t) {
    reg_trust_ref *n = kiln_calloc(1, sizeof *n);
    if (!n) {
        kiln_sign_trust_free(t);
        return KILN_ERR_NOMEM;
    }
    n->t = t;
    n->refs = 1; /* the server's own */
    pthread_mutex_lock(&s->trust_mu);
    reg_trust_ref *old = s->trust;
    s->trust = n;
    pthread_mutex_unlock(&s->trust_mu);
    reg_trust_release(s, old);
    return KILN_OK;
}

bool reg_has_trust(kiln_registry_server *s) {
    reg_trust_ref *t = reg_trust_acquire(s);
    reg_trust_release(s, t);
    return t != NULL;
}

/* ---- responses ---- */

enum MHD_Result reg_send_buf(struct MHD_Connection *c, reg_req *r, unsigned status, char *buf,
                             size_t len, const char *type) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(buf);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", type);
    if (status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer realm=\"kiln\"");
    if (status == 405 && r->allow[0]) MHD_add_response_header(resp, "Allow", r->allow);
    r->status = status;
    enum MHD_Result ok = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ok;
}

/* Sends j (stolen) as the body. */
enum MHD_Result reg_send_json(struct MHD_Connection *c, reg_req *r, unsigned status, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    if (!s) return MHD_NO;
    return reg_send_buf(c, r, status, s, strlen(s), "application/json");
}

char *reg_error_body(const char *msg) {
    json_t *j = json_pack("{s:s}", "error", msg);
    if (!j) {
        /* Request bytes quoted in the message that are not UTF-8 (a name, a header): JSON
         * cannot carry them, so they go out as '?' rather than the answer being dropped. */
        char *clean = kiln_strdup(msg);
        if (!clean) return NULL;
        for (char *p = clean; *p; p++)
            if ((unsigned char)*p >= 0x80) *p = '?';
        j = json_pack("{s:s}", "error", clean);
        free(clean);
    }
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    return s;
}

static enum MHD_Result send_page_error(struct MHD_Connection *c, reg_req *r, unsigned status,
                                       const char *msg);

/* A page (taken from b) with the headers web/ asks for. */
enum MHD_Result reg_send_page(struct MHD_Connection *c, reg_req *r, unsigned status,
                              kiln_web_buf *b) {
    size_t len, n;
    bool over = b->over;
    char *html = kiln_web_buf_take(b, &len);
    /* A page past KILN_WEB_PAGE_MAX is refused, as kiln runs serve refuses one (issue 29,
     * item 3: a bound on what a page renders): an error page in its place. */
    if (!html && over && status != 500) return send_page_error(c, r, 500, kiln_errmsg());
    if (!html) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, html, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(html);
        return MHD_NO;
    }
    const kiln_web_header *h = kiln_web_headers(&n);
    for (size_t i = 0; i < n; i++)
        MHD_add_response_header(resp, h[i].name, h[i].value);
    /* Over HTTPS a browser that saw the page once keeps to HTTPS for the host (a year). */
    const union MHD_ConnectionInfo *tls =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (tls && tls->tls_session)
        MHD_add_response_header(resp, "Strict-Transport-Security", "max-age=31536000");
    if (status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer realm=\"kiln\"");
    if (status == 405 && r->allow[0]) MHD_add_response_header(resp, "Allow", r->allow);
    r->status = status;
    enum MHD_Result ok = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static enum MHD_Result send_page_error(struct MHD_Connection *c, reg_req *r, unsigned status,
                                       const char *msg) {
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX};
    kiln_web_error(&b, status, msg, kiln_unix_time());
    return reg_send_page(c, r, status, &b);
}

enum MHD_Result reg_send_error(struct MHD_Connection *c, reg_req *r, unsigned status,
                               const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->html) return send_page_error(c, r, status, msg);
    char *body = reg_error_body(msg);
    if (!body) return MHD_NO;
    return reg_send_buf(c, r, status, body, strlen(body), "application/json");
}

unsigned reg_status_of(kiln_err e) {
    switch (e) {
    case KILN_ERR_USAGE:
        return 400;
    case KILN_ERR_AUTH:
        return 403;
    case KILN_ERR_NOTFOUND:
        return 404;
    case KILN_ERR_CONFLICT:
        return 409;
    case KILN_ERR_LIMIT:
        return 413;
    case KILN_ERR_VERIFY:
    case KILN_ERR_FORMAT:
        return 422;
    case KILN_ERR_UNSUPPORTED:
        return 501;
    case KILN_ERR_IO:
        /* A full disk is not a fault a retry a second later mends: 507, which clients do
         * not retry. */
        return kiln_err_errno() == ENOSPC || kiln_err_errno() == EDQUOT ? 507 : 500;
    default:
        return 500;
    }
}

enum MHD_Result reg_send_kiln_error(struct MHD_Connection *c, reg_req *r, kiln_err e) {
    return reg_send_error(c, r, reg_status_of(e), "%s",
                          *kiln_errmsg() ? kiln_errmsg() : kiln_strerror(e));
}

/* ---- request parsing ---- */

/* 1*DIGIT at s; *v saturates at UINT64_MAX, which lies past the end of any blob. */
static bool digits_u64(const char *s, const char **after, uint64_t *v) {
    const char *p = s;
    uint64_t x = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');
        x = x > (UINT64_MAX - d) / 10 ? UINT64_MAX : x * 10 + d;
    }
    *after = p;
    *v = x;
    return p != s;
}

/* RFC 9110 14.1.2, one range of digits only: a first position past the end is
 * unsatisfiable; a last position or a suffix past the end (of any length) means "to the end". */
bool reg_range_parse(const char *h, uint64_t size, uint64_t *start, uint64_t *end) {
    if (strncmp(h, "bytes=", 6) != 0 || size == 0) return false;
    const char *p = h + 6;
    uint64_t a, b;
    if (*p == '-') { /* the last N bytes */
        if (!digits_u64(p + 1, &p, &b) || *p || b == 0) return false;
        *start = b >= size ? 0 : size - b;
        *end = size - 1;
        return true;
    }
    if (!digits_u64(p, &p, &a) || *p != '-' || a >= size) return false;
    p++;
    b = size - 1;
    if (*p) {
        uint64_t last;
        if (!digits_u64(p, &p, &last) || *p) return false;
        if (last < b) b = last;
    }
    if (a > b) return false;
    *start = a;
    *end = b;
    return true;
}

bool reg_length_parse(const char *s, uint64_t *out) {
    const char *e;
    uint64_t n;
    /* 1*DIGIT (RFC 9110 8.6): strtoull would take a sign or leading space; a saturated
     * value did not fit. */
    if (!digits_u64(s, &e, &n) || *e || n == UINT64_MAX) return false;
    *out = n;
    return true;
}

const char *reg_bearer_token(const char *h) {
    return strncmp(h, "Bearer ", 7) == 0 ? h + 7 : NULL;
}

kiln_err reg_sig_decode(const char *b64, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    size_t slen = strlen(b64);
    char *buf = kiln_malloc(slen + 1);
    if (!buf) return KILN_ERR_NOMEM;
    size_t n = 0;
    if (sodium_base642bin((unsigned char *)buf, slen, b64, slen, NULL, &n, NULL,
                          sodium_base64_VARIANT_ORIGINAL) != 0 ||
        memchr(buf, 0, n)) {
        free(buf);
        return kiln_fail(KILN_ERR_FORMAT, "X-Kiln-Signature is not base64 of a .minisig text");
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return KILN_OK;
}

/* Digits only, at most max. */
bool reg_audit_number(const char *s, int64_t max, int64_t *out) {
    uint64_t n;
    if (!reg_length_parse(s, &n) || n > (uint64_t)max) return false;
    *out = (int64_t)n;
    return true;
}

bool reg_audit_parse(const char *after, const char *limit, const char *since, const char *model,
                     const char *action, reg_audit_query *q, char why[200]) {
    memset(q, 0, sizeof *q);
    q->limit = 1000;
    if (after && !reg_audit_number(after, INT64_MAX, &q->after)) {
        snprintf(why, 200, "after must be an entry id (digits)");
        return false;
    }
    if (limit && (!reg_audit_number(limit, 10000, &q->limit) || q->limit < 1)) {
        snprintf(why, 200, "limit must be a whole number from 1 to 10000");
        return false;
    }
    if (since && !reg_audit_number(since, INT64_MAX, &q->since)) {
        snprintf(why, 200, "since must be a time in unix seconds (digits)");
        return false;
    }
    if (model) {
        if (kiln_registry_check_name("model", model)) {
            snprintf(why, 200, "%s", kiln_errmsg());
            kiln_errclear();
            return false;
        }
        snprintf(q->model, sizeof q->model, "%s", model);
    }
    if (action) {
        /* ["a","b"]: each name 1 to 32 of [a-z.], at most 16 */
        size_t n = 0, names = 0, len = 0;
        q->actions[n++] = '[';
        for (const char *p = action;; p++) {
            if (*p == ',' || !*p) {
                if (!len) break;
                q->actions[n++] = '"';
                q->actions[n++] = ',';
                len = 0;
                if (!*p) {
                    q->actions[n - 1] = ']';
                    q->actions[n] = 0;
                    return true;
                }
                continue;
            }
            if (!((*p >= 'a' && *p <= 'z') || *p == '.') || ++len > 32) break;
            if (len == 1 && ++names > 16) break; /* counted as it begins: the buffer holds 16 */
            if (len == 1) q->actions[n++] = '"';
            q->actions[n++] = *p;
        }
        q->actions[0] = 0;
        snprintf(why, 200, "action must be up to 16 comma-separated names of a-z and '.'");
        return false;
    }
    return true;
}

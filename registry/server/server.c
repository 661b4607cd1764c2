/* server.c - the registry's HTTP server: libmicrohttpd with its own thread pool on epoll,
 * a route table under /v1/, bearer tokens, streamed uploads into the blob store, file-backed
 * downloads with Range, Prometheus metrics, and a graceful stop. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <fcntl.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "server_int.h"

/* The route's pattern, the label /metrics counts requests under ("other" for none). */
static const char *route_label(int route);

#define N_BUCKETS 8
static const double bucket_le[N_BUCKETS] = {0.01, 0.05, 0.25, 1, 5, 30, 120, 600};

typedef struct histogram {
    uint64_t count, bucket[N_BUCKETS];
    double sum;
} histogram;

typedef struct counter_row {
    int route;
    char method[8];
    unsigned status;
    uint64_t n;
} counter_row;

/* The policy in force, shared by the requests that use it: a PUT of the next trust version
 * swaps in a new one while others still verify under the old, which goes when the last of
 * them lets go. */
typedef struct trust_ref {
    kiln_sign_trust *t;
    int refs; /* under the server's trust_mu */
} trust_ref;

/* The registry's defaults are the ones both servers have (web/httpd.c). */
_Static_assert(KILN_REGISTRY_HEADER_TIMEOUT_S == KILN_WEB_HTTP_HEADER_TIMEOUT_S &&
                   KILN_REGISTRY_IDLE_TIMEOUT_S == KILN_WEB_HTTP_IDLE_TIMEOUT_S &&
                   KILN_REGISTRY_MAX_CONNECTIONS == KILN_WEB_HTTP_MAX_CONNECTIONS &&
                   KILN_REGISTRY_SPARE_FDS == KILN_WEB_HTTP_SPARE_FDS,
               "registry.h's server defaults differ from web.h's");

struct kiln_registry_server {
    kiln_web_http *http; /* web/httpd.c: the daemon, as kiln runs serve has it */
    char *root;
    pthread_mutex_t trust_mu;     /* guards trust and each trust_ref's refs */
    pthread_mutex_t trust_put_mu; /* one trust PUT at a time: verify, store, swap */
    trust_ref *trust;             /* NULL: no policy (serve without --trust) */
    kiln_sign_trust *trust_start; /* --trust as read at start (the web page walks from it) */
    bool read_required;
    char *mirror_of; /* a mirror store's primary (mirror.c): every write is refused */
    uint64_t max_upload;
    int lock_fd;
    uint16_t port;
    char *tls_cert, *tls_key; /* PEM text, held while the daemon runs (the key wiped after) */
    atomic_int in_flight, connections;
    atomic_int stopping; /* kiln_registry_server_stop began: new connections are refused */
    pthread_mutex_t mu;  /* guards the metrics below */
    counter_row *rows;
    size_t nrows, caprows;
    uint64_t bytes_served;
    histogram upload, download;
    uint64_t auth_refused[REG_AUTH_NREASONS];
};

typedef enum {
    BODY_NONE,
    BODY_ARCHIVE,
    BODY_RECORD,
    BODY_TRUST,
    BODY_DATASET,
    BODY_REPRO
} body_kind;

/* One request, from its headers to its completion. */
typedef struct req {
    int route;
    const char *audit; /* the audit action of the route table's row answering it */
    char allow[32];    /* a 405's Allow header: the methods the route takes here */
    uint64_t trust_v;  /* /v1/trust/{version}: the version */
    bool deferred; /* a request without a body: routed once its head is all in */
    bool html; /* a page: errors are answered as pages too */
    char method[8];
    unsigned status;
    uint64_t t0, body_bytes;
    char *token_name;
    unsigned scopes;
    char seg[3][KILN_REGISTRY_NAME_MAX + 1]; /* model, version or channel, digest */
    /* a body being received */
    body_kind body;
    bool body_failed;
    kiln_err body_rc;
    char *body_msg;
    reg_upload up;
    char hex[KILN_SHA256_HEX];
    uint64_t declared;
    char *sig;
    size_t sig_len;
    char *rec; /* a channel record's or a trust version's text */
    size_t rec_len, rec_cap;
} req;

/* ---- the policy in force ---- */

static trust_ref *trust_acquire(kiln_registry_server *s) {
    pthread_mutex_lock(&s->trust_mu);
    trust_ref *t = s->trust;
    if (t) t->refs++;
    pthread_mutex_unlock(&s->trust_mu);
    return t;
}

static void trust_release(kiln_registry_server *s, trust_ref *t) {
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
static kiln_err trust_swap(kiln_registry_server *s, kiln_sign_trust *t) {
    trust_ref *n = kiln_calloc(1, sizeof *n);
    if (!n) {
        kiln_sign_trust_free(t);
        return KILN_ERR_NOMEM;
    }
    n->t = t;
    n->refs = 1; /* the server's own */
    pthread_mutex_lock(&s->trust_mu);
    trust_ref *old = s->trust;
    s->trust = n;
    pthread_mutex_unlock(&s->trust_mu);
    trust_release(s, old);
    return KILN_OK;
}

static bool has_trust(kiln_registry_server *s) {
    trust_ref *t = trust_acquire(s);
    trust_release(s, t);
    return t != NULL;
}

/* ---- responses ---- */

static enum MHD_Result send_buf(struct MHD_Connection *c, req *r, unsigned status, char *buf,
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
static enum MHD_Result send_json(struct MHD_Connection *c, req *r, unsigned status, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    if (!s) return MHD_NO;
    return send_buf(c, r, status, s, strlen(s), "application/json");
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

static enum MHD_Result send_page_error(struct MHD_Connection *c, req *r, unsigned status,
                                       const char *msg);

/* A page (taken from b) with the headers web/ asks for. */
static enum MHD_Result send_page(struct MHD_Connection *c, req *r, unsigned status,
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

static enum MHD_Result send_page_error(struct MHD_Connection *c, req *r, unsigned status,
                                       const char *msg) {
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX};
    kiln_web_error(&b, status, msg, kiln_unix_time());
    return send_page(c, r, status, &b);
}

static enum MHD_Result send_error(struct MHD_Connection *c, req *r, unsigned status,
                                  const char *fmt, ...) KILN_PRINTF(4, 5);
static enum MHD_Result send_error(struct MHD_Connection *c, req *r, unsigned status,
                                  const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->html) return send_page_error(c, r, status, msg);
    char *body = reg_error_body(msg);
    if (!body) return MHD_NO;
    return send_buf(c, r, status, body, strlen(body), "application/json");
}

static unsigned status_of(kiln_err e) {
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

static enum MHD_Result send_kiln_error(struct MHD_Connection *c, req *r, kiln_err e) {
    return send_error(c, r, status_of(e), "%s", *kiln_errmsg() ? kiln_errmsg() : kiln_strerror(e));
}

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

/* ---- metrics ---- */

static void hist_add(histogram *h, double secs) {
    h->count++;
    h->sum += secs;
    for (int i = 0; i < N_BUCKETS; i++)
        if (secs <= bucket_le[i]) h->bucket[i]++;
}

static void count_request(kiln_registry_server *s, req *r) {
    pthread_mutex_lock(&s->mu);
    counter_row *row = NULL;
    for (size_t i = 0; i < s->nrows; i++)
        if (s->rows[i].route == r->route && s->rows[i].status == r->status &&
            !strcmp(s->rows[i].method, r->method))
            row = &s->rows[i];
    if (!row && s->nrows == s->caprows) {
        size_t cap = s->caprows ? 2 * s->caprows : 32;
        counter_row *nr = realloc(s->rows, cap * sizeof *nr);
        if (nr) {
            s->rows = nr;
            s->caprows = cap;
        }
    }
    if (!row && s->nrows < s->caprows) {
        row = &s->rows[s->nrows++];
        memset(row, 0, sizeof *row);
        row->route = r->route;
        row->status = r->status;
        snprintf(row->method, sizeof row->method, "%s", r->method);
    }
    if (row) row->n++;
    double secs = (double)(kiln_now_ns() - r->t0) / 1e9;
    if (r->route == REG_R_BLOB && r->status / 100 == 2) {
        s->bytes_served += r->body_bytes;
        hist_add(&s->download, secs);
    }
    if (r->route == REG_R_VERSION && !strcmp(r->method, "PUT") && r->status / 100 == 2)
        hist_add(&s->upload, secs);
    pthread_mutex_unlock(&s->mu);
}

static void put_hist(FILE *f, const char *name, const histogram *h) {
    fprintf(f, "# TYPE %s histogram\n", name);
    for (int i = 0; i < N_BUCKETS; i++)
        fprintf(f, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, bucket_le[i], h->bucket[i]);
    fprintf(f, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n%s_sum %.6f\n%s_count %" PRIu64 "\n", name,
            h->count, name, h->sum, name, h->count);
}

/* A label value in the Prometheus text format: backslash, double quote and newline escaped
 * (\\, \", \n), everything else as it is. */
static void put_label(FILE *f, const char *v) {
    for (const char *p = v; *p; p++) {
        if (*p == '\\' || *p == '"' || *p == '\n') fputc('\\', f);
        fputc(*p == '\n' ? 'n' : *p, f);
    }
}

/* Each channel's current record's expiry (unix time), so that an alert is
 * `kiln_registry_channel_expiry_timestamp_seconds - time() < 7 * 86400`. One query over the
 * primary key (model, channel, seq): SQLite takes a bare column of a max() aggregate from the
 * row that holds the max, so expires is the current record's. A store the query fails on
 * writes no gauge (the rest of /metrics still answers). */
static void put_expiry_metrics(FILE *f, sqlite3 *db) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT model, channel, expires, max(seq) FROM channel_records"
                           " GROUP BY model, channel ORDER BY model, channel",
                           -1, &st, NULL) != SQLITE_OK)
        return;
    fprintf(f, "# HELP kiln_registry_channel_expiry_timestamp_seconds When each channel's current "
               "record expires (unix time): kiln pull refuses it from then on.\n"
               "# TYPE kiln_registry_channel_expiry_timestamp_seconds gauge\n");
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *m = (const char *)sqlite3_column_text(st, 0),
                   *c = (const char *)sqlite3_column_text(st, 1);
        if (!m || !c) continue;
        fputs("kiln_registry_channel_expiry_timestamp_seconds{model=\"", f);
        put_label(f, m);
        fputs("\",channel=\"", f);
        put_label(f, c);
        fprintf(f, "\"} %" PRId64 "\n", (int64_t)sqlite3_column_int64(st, 2));
    }
    sqlite3_finalize(st);
}

/* A mirror's sync state (mirror.c keeps it in the store's meta table). */
static void put_mirror_metrics(FILE *f, const char *of, sqlite3 *db) {
    reg_mirror_status ms;
    if (reg_mirror_status_read(db, &ms) != KILN_OK) return;
    int64_t now = kiln_unix_time();
    fprintf(f, "# HELP kiln_registry_mirror_info This registry is a read-only mirror of 'of'.\n"
               "# TYPE kiln_registry_mirror_info gauge\nkiln_registry_mirror_info{of=\"");
    put_label(f, of);
    fprintf(f,
            "\"} 1\n"
            "# HELP kiln_registry_mirror_last_sync_seconds When the last sync completed (unix "
            "time; 0: never).\n# TYPE kiln_registry_mirror_last_sync_seconds gauge\n"
            "kiln_registry_mirror_last_sync_seconds %" PRId64 "\n"
            "# HELP kiln_registry_mirror_lag_seconds Seconds since the last sync completed (-1: "
            "never synced).\n# TYPE kiln_registry_mirror_lag_seconds gauge\n"
            "kiln_registry_mirror_lag_seconds %" PRId64 "\n"
            "# HELP kiln_registry_mirror_sync_problems Items the last sync did not copy (they did "
            "not verify).\n# TYPE kiln_registry_mirror_sync_problems gauge\n"
            "kiln_registry_mirror_sync_problems %" PRId64 "\n",
            ms.last_sync, ms.last_sync ? now - ms.last_sync : -1, ms.problems);
    reg_mirror_status_release(&ms);
}

/* GET /healthz: "ok"; on a mirror, then what it mirrors and how fresh it is. Without a token
 * or the store's connection (db is NULL): a primary's answer touches nothing. */
static enum MHD_Result do_health(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                 sqlite3 *db) {
    if (!s->mirror_of) return send_buf(c, r, 200, kiln_strdup("ok\n"), 3, "text/plain");
    sqlite3 *mdb = NULL;
    reg_mirror_status ms = {0};
    kiln_err rc = reg_db_connect(s->root, &mdb);
    if (!rc) rc = reg_mirror_status_read(mdb, &ms);
    reg_db_close(mdb);
    if (rc) return send_kiln_error(c, r, rc);
    char when[21];
    kiln_format_time(ms.last_sync, when);
    char *text = ms.last_sync ? kiln_asprintf("ok\nmirror of %s, last synced %s (%lld s ago)\n",
                                              s->mirror_of, when,
                                              (long long)(kiln_unix_time() - ms.last_sync))
                              : kiln_asprintf("ok\nmirror of %s, never synced\n", s->mirror_of);
    reg_mirror_status_release(&ms);
    if (!text) return MHD_NO;
    return send_buf(c, r, 200, text, strlen(text), "text/plain");
}

static enum MHD_Result do_metrics(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                  sqlite3 *db) {
    int64_t versions = -1;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM versions", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        versions = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return MHD_NO;
    pthread_mutex_lock(&s->mu);
    fprintf(f,
            "# HELP kiln_registry_requests_total Requests answered, by route, method and status.\n"
            "# TYPE kiln_registry_requests_total counter\n");
    for (size_t i = 0; i < s->nrows; i++)
        fprintf(f,
                "kiln_registry_requests_total{route=\"%s\",method=\"%s\",status=\"%u\"} %" PRIu64
                "\n",
                route_label(s->rows[i].route), s->rows[i].method, s->rows[i].status, s->rows[i].n);
    fprintf(
        f,
        "# HELP kiln_registry_bytes_served_total Archive bytes sent by blob downloads.\n"
        "# TYPE kiln_registry_bytes_served_total counter\nkiln_registry_bytes_served_total %" PRIu64
        "\n",
        s->bytes_served);
    put_hist(f, "kiln_registry_upload_duration_seconds", &s->upload);
    put_hist(f, "kiln_registry_download_duration_seconds", &s->download);
    static const char *const why[REG_AUTH_NREASONS] = {
        [REG_AUTH_MISSING] = "missing", [REG_AUTH_MALFORMED] = "malformed",
        [REG_AUTH_UNKNOWN] = "unknown", [REG_AUTH_EXPIRED] = "expired",
        [REG_AUTH_REVOKED] = "revoked", [REG_AUTH_SCOPE] = "scope"};
    fprintf(f, "# HELP kiln_registry_auth_refused_total Requests refused for their token, by "
               "reason.\n# TYPE kiln_registry_auth_refused_total counter\n");
    for (int i = 0; i < REG_AUTH_NREASONS; i++)
        fprintf(f, "kiln_registry_auth_refused_total{reason=\"%s\"} %" PRIu64 "\n", why[i],
                s->auth_refused[i]);
    pthread_mutex_unlock(&s->mu);
    fprintf(f,
            "# HELP kiln_registry_versions Versions stored.\n# TYPE kiln_registry_versions gauge\n"
            "kiln_registry_versions %" PRId64 "\n",
            versions);
    fprintf(f,
            "# HELP kiln_registry_active_connections Open HTTP connections.\n"
            "# TYPE kiln_registry_active_connections gauge\nkiln_registry_active_connections %d\n",
            atomic_load(&s->connections));
    put_expiry_metrics(f, db);
    if (s->mirror_of) put_mirror_metrics(f, s->mirror_of, db);
    if (fclose(f) != 0) {
        free(buf);
        return MHD_NO;
    }
    return send_buf(c, r, 200, buf, len, "text/plain; version=0.0.4");
}

/* ---- reads ---- */

static json_t *col_json(sqlite3_stmt *st, int i) {
    const char *t = reg_col(st, i);
    if (!t) return json_null();
    json_t *j = json_loads(t, JSON_REJECT_DUPLICATES, NULL);
    return j ? j : json_null();
}

/* A column's exact bytes as a JSON string; null when NULL or not UTF-8 text. */
static json_t *col_string(sqlite3_stmt *st, int i) {
    const char *t = reg_col(st, i);
    json_t *j = t ? json_stringn(t, (size_t)sqlite3_column_bytes(st, i)) : NULL;
    return j ? j : json_null();
}

/* The verdict of a version's validation summary column ({"passed": bool, "sha256"}):
 * "passed", "failed", or "none" when the archive has no report. */
static const char *validation_verdict(sqlite3_stmt *st, int i) {
    const char *t = reg_col(st, i);
    json_t *v = t ? json_loads(t, JSON_REJECT_DUPLICATES, NULL) : NULL;
    json_t *p = json_object_get(v, "passed");
    const char *verdict = json_is_boolean(p) ? (json_is_true(p) ? "passed" : "failed") : "none";
    json_decref(v);
    return verdict;
}

static enum MHD_Result do_models(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                 sqlite3 *db) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(
            db, "SELECT model, count(*), max(created) FROM versions GROUP BY model ORDER BY model",
            -1, &st, NULL) != SQLITE_OK)
        return send_kiln_error(c, r, reg_db_fail(db, "listing models"));
    json_t *arr = json_array();
    while (sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(arr, json_pack("{s:s, s:I, s:o}", "name", reg_col(st, 0), "versions",
                                             (json_int_t)sqlite3_column_int64(st, 1), "updated",
                                             kiln_time_json(sqlite3_column_int64(st, 2))));
    sqlite3_finalize(st);
    return send_json(c, r, 200, json_pack("{s:o}", "models", arr));
}

static enum MHD_Result do_model(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                sqlite3 *db) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(
            db,
            "SELECT version, digest, size, publisher, created, validation, (SELECT count(*) FROM"
            " reproductions p WHERE p.model = v.model AND p.version = v.version) FROM versions v"
            " WHERE model = ?1 ORDER BY created, version",
            -1, &st, NULL) != SQLITE_OK)
        return send_kiln_error(c, r, reg_db_fail(db, "reading a model"));
    sqlite3_bind_text(st, 1, r->seg[0], -1, SQLITE_TRANSIENT);
    json_t *versions = json_array(), *channels = json_object();
    while (sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(versions, json_pack("{s:s, s:s, s:I, s:s, s:o, s:s, s:I}",
                                                  "version", reg_col(st, 0), "digest", reg_col(st, 1),
                                                  "size", (json_int_t)sqlite3_column_int64(st, 2),
                                                  "publisher", reg_col(st, 3), "created",
                                                  kiln_time_json(sqlite3_column_int64(st, 4)),
                                                  "validation", validation_verdict(st, 5),
                                                  "reproductions",
                                                  (json_int_t)sqlite3_column_int64(st, 6)));
    sqlite3_finalize(st);
    st = NULL;
    if (sqlite3_prepare_v2(
            db,
            "SELECT channel, seq, version, digest, expires, reason, publisher, created"
            " FROM channel_records c WHERE model = ?1"
            " AND seq = (SELECT max(seq) FROM channel_records d"
            "            WHERE d.model = c.model AND d.channel = c.channel) ORDER BY channel",
            -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, r->seg[0], -1, SQLITE_TRANSIENT);
        while (sqlite3_step(st) == SQLITE_ROW)
            json_object_set_new(channels, reg_col(st, 0),
                                json_pack("{s:I, s:s, s:s, s:o, s:o, s:s, s:o}", "seq",
                                          (json_int_t)sqlite3_column_int64(st, 1), "version",
                                          reg_col(st, 2), "digest", reg_col(st, 3), "expires",
                                          kiln_time_json(sqlite3_column_int64(st, 4)), "reason",
                                          col_string(st, 5), "put_by", reg_col(st, 6), "put_at",
                                          kiln_time_json(sqlite3_column_int64(st, 7))));
    }
    sqlite3_finalize(st);
    if (!json_array_size(versions) && !json_object_size(channels)) {
        json_decref(versions);
        json_decref(channels);
        return send_error(c, r, 404, "model '%s' not found", r->seg[0]);
    }
    return send_json(c, r, 200,
                     json_pack("{s:s, s:o, s:o}", "name", r->seg[0], "versions", versions,
                               "channels", channels));
}

static enum MHD_Result do_version(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                  sqlite3 *db) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(
            db,
            "SELECT digest, size, manifest, signature, card, validation, publisher, created,"
            " validation_text FROM versions WHERE model = ?1 AND version = ?2",
            -1, &st, NULL) != SQLITE_OK)
        return send_kiln_error(c, r, reg_db_fail(db, "reading a version"));
    sqlite3_bind_text(st, 1, r->seg[0], -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, r->seg[1], -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) != SQLITE_ROW) {
        sqlite3_finalize(st);
        return send_error(c, r, 404, "version '%s@%s' not found", r->seg[0], r->seg[1]);
    }
    json_t *j = json_pack("{s:s, s:s, s:s, s:I, s:o, s:s, s:o, s:o, s:o, s:s, s:o}", "name",
                          r->seg[0], "version", r->seg[1], "digest", reg_col(st, 0), "size",
                          (json_int_t)sqlite3_column_int64(st, 1), "manifest", col_json(st, 2),
                          "signature", reg_col(st, 3), "card", col_json(st, 4), "validation",
                          col_json(st, 5), "validation_text", col_string(st, 8), "publisher",
                          reg_col(st, 6), "created", kiln_time_json(sqlite3_column_int64(st, 7)));
    sqlite3_finalize(st);
    return send_json(c, r, 200, j);
}

static enum MHD_Result do_channel(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                  sqlite3 *db) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT record FROM channel_records WHERE model = ?1 AND channel = ?2 "
                           "ORDER BY seq DESC LIMIT 1",
                           -1, &st, NULL) != SQLITE_OK)
        return send_kiln_error(c, r, reg_db_fail(db, "reading a channel"));
    sqlite3_bind_text(st, 1, r->seg[0], -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, r->seg[1], -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) != SQLITE_ROW) {
        sqlite3_finalize(st);
        return send_error(c, r, 404, "channel '%s' of model '%s' not found", r->seg[1], r->seg[0]);
    }
    /* The record goes out byte for byte as it was signed and stored. */
    char *text = kiln_strdup(reg_col(st, 0));
    sqlite3_finalize(st);
    if (!text) return MHD_NO;
    return send_buf(c, r, 200, text, strlen(text), "application/json");
}

static bool audit_number(const char *s, int64_t max, int64_t *out);

/* ?after=SEQ: only the records after it (a mirror's sync asks for what it lacks). Each
 * record's stored bytes go out as "text" beside the parsed "record", so that a copy of them
 * is byte for byte what was signed and stored. */
static enum MHD_Result do_history(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                  sqlite3 *db) {
    const char *after_arg = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after");
    int64_t after = 0;
    /* Digits that fit, as /v1/audit's numbers (no sign, space or exponent): 400 otherwise. */
    if (after_arg && !audit_number(after_arg, INT64_MAX, &after))
        return send_error(c, r, 400, "after must be a record's seq (digits)");
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT record, publisher, created FROM channel_records WHERE model = "
                           "?1 AND channel = ?2 AND seq > ?3"
                           " ORDER BY seq",
                           -1, &st, NULL) != SQLITE_OK)
        return send_kiln_error(c, r, reg_db_fail(db, "reading a channel"));
    sqlite3_bind_text(st, 1, r->seg[0], -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, r->seg[1], -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 3, after);
    json_t *arr = json_array();
    while (sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(arr, json_pack("{s:o, s:s, s:s, s:o}", "record", col_json(st, 0),
                                             "text", reg_col(st, 0), "publisher", reg_col(st, 1), "created",
                                             kiln_time_json(sqlite3_column_int64(st, 2))));
    sqlite3_finalize(st);
    if (!json_array_size(arr) && after == 0) {
        json_decref(arr);
        return send_error(c, r, 404, "channel '%s' of model '%s' not found", r->seg[1], r->seg[0]);
    }
    return send_json(
        c, r, 200,
        json_pack("{s:s, s:s, s:o}", "model", r->seg[0], "channel", r->seg[1], "records", arr));
}

static const char *query_arg(struct MHD_Connection *c, const char *name) {
    return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
}

static enum MHD_Result do_audit(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                sqlite3 *db) {
    reg_audit_query q;
    char why[200];
    if (!reg_audit_parse(query_arg(c, "after"), query_arg(c, "limit"), query_arg(c, "since"),
                         query_arg(c, "model"), query_arg(c, "action"), &q, why))
        return send_error(c, r, 400, "%s", why);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT id, time, token, action, model, version, channel, digest, "
                           "reason FROM audit WHERE id > ?1 AND time >= ?3"
                           " AND (?4 IS NULL OR model = ?4)"
                           " AND (?5 IS NULL OR action IN (SELECT value FROM json_each(?5)))"
                           " ORDER BY id LIMIT ?2",
                           -1, &st, NULL) != SQLITE_OK)
        return send_kiln_error(c, r, reg_db_fail(db, "reading the audit log"));
    sqlite3_bind_int64(st, 1, q.after);
    sqlite3_bind_int64(st, 2, q.limit);
    sqlite3_bind_int64(st, 3, q.since);
    if (q.model[0]) sqlite3_bind_text(st, 4, q.model, -1, SQLITE_TRANSIENT);
    if (q.actions[0]) sqlite3_bind_text(st, 5, q.actions, -1, SQLITE_TRANSIENT);
    json_t *arr = json_array();
    while (sqlite3_step(st) == SQLITE_ROW) {
        json_t *e = json_pack("{s:I, s:o, s:s}", "id", (json_int_t)sqlite3_column_int64(st, 0),
                              "time", kiln_time_json(sqlite3_column_int64(st, 1)), "action", reg_col(st, 3));
        /* By column: id, time and action are set above. */
        static const char *const keys[] = {NULL,      NULL,      "token",  NULL,    "model",
                                           "version", "channel", "digest", "reason"};
        for (int k = 0; k < (int)KILN_ARRAY_LEN(keys); k++)
            if (keys[k])
                json_object_set_new(e, keys[k], reg_col(st, k) ? json_string(reg_col(st, k)) : json_null());
        json_array_append_new(arr, e);
    }
    sqlite3_finalize(st);
    return send_json(c, r, 200, json_pack("{s:o}", "entries", arr));
}

/* The tokens as `kiln registry token list --json` shows them: never a secret or a hash. */
static enum MHD_Result do_tokens(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                 sqlite3 *db) {
    kiln_registry_token_info *t;
    size_t n;
    kiln_err rc = reg_token_list_db(db, &t, &n);
    if (rc) return send_kiln_error(c, r, rc);
    json_t *j = kiln_registry_token_json(t, n, kiln_unix_time());
    free(t);
    return j ? send_json(c, r, 200, j) : MHD_NO;
}

/* ---- the pages of the web UI (ui.c reads the store, web/ writes the HTML): each renders
 * into b under t, the policy in force (NULL: none) ---- */

#define PAGE_ARGS                                                                                  \
    kiln_registry_server *s, struct MHD_Connection *c, const req *r, sqlite3 *db,                  \
        const kiln_sign_trust *t, int64_t now, kiln_web_buf *b

static kiln_err page_home(PAGE_ARGS) {
    return reg_ui_home(db, t, now, b);
}

static kiln_err page_model(PAGE_ARGS) {
    return reg_ui_model(db, t, r->seg[0], now, b);
}

static kiln_err page_version(PAGE_ARGS) {
    return reg_ui_version(db, t, s->root, r->seg[0], r->seg[1], now, b);
}

/* ?before=SEQ: the records before it (a bad one shows the newest, as a link would). */
static kiln_err page_channel(PAGE_ARGS) {
    const char *before = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "before");
    return reg_ui_channel(db, t, r->seg[0], r->seg[1], before ? strtoll(before, NULL, 10) : 0, now,
                          b);
}

static kiln_err page_trust(PAGE_ARGS) {
    const char *before = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "before");
    return reg_ui_trust(db, t, s->trust_start, before ? strtoull(before, NULL, 10) : 0, now, b);
}

static kiln_err page_audit(PAGE_ARGS) {
    reg_audit_query q;
    char why[200];
    if (!reg_audit_parse(query_arg(c, "after"), NULL, NULL, NULL, NULL, &q, why))
        q.after = 0; /* a page (as before= of the others): a bad link shows the start */
    return reg_ui_audit(db, q.after, now, b);
}

typedef kiln_err (*page_fn)(PAGE_ARGS);

/* A page row's answer: its page under the policy in force. */
static enum MHD_Result do_page(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                               sqlite3 *db, page_fn page) {
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX};
    trust_ref *tr = trust_acquire(s);
    kiln_err rc = page(s, c, r, db, tr ? tr->t : NULL, kiln_unix_time(), &b);
    trust_release(s, tr);
    if (rc) {
        kiln_web_buf_release(&b);
        return send_kiln_error(c, r, rc);
    }
    return send_page(c, r, 200, &b);
}

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
static bool audit_number(const char *s, int64_t max, int64_t *out) {
    uint64_t n;
    if (!reg_length_parse(s, &n) || n > (uint64_t)max) return false;
    *out = (int64_t)n;
    return true;
}

bool reg_audit_parse(const char *after, const char *limit, const char *since, const char *model,
                     const char *action, reg_audit_query *q, char why[200]) {
    memset(q, 0, sizeof *q);
    q->limit = 1000;
    if (after && !audit_number(after, INT64_MAX, &q->after)) {
        snprintf(why, 200, "after must be an entry id (digits)");
        return false;
    }
    if (limit && (!audit_number(limit, 10000, &q->limit) || q->limit < 1)) {
        snprintf(why, 200, "limit must be a whole number from 1 to 10000");
        return false;
    }
    if (since && !audit_number(since, INT64_MAX, &q->since)) {
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

/* A blob served over TLS: read from its file in blocks of REG_TLS_BLOCK. */
#define REG_TLS_BLOCK (256 * 1024)
typedef struct blob_reader {
    int fd;
    uint64_t start;
} blob_reader;

static ssize_t blob_read(void *cls, uint64_t pos, char *buf, size_t max) {
    blob_reader *br = cls;
    ssize_t n;
    do
        n = pread(br->fd, buf, max, (off_t)(br->start + pos));
    while (n < 0 && errno == EINTR);
    if (n <= 0)
        return MHD_CONTENT_READER_END_WITH_ERROR; /* the size was declared: short is an error */
    return n;
}

static void blob_done(void *cls) {
    blob_reader *br = cls;
    close(br->fd);
    free(br);
}

static enum MHD_Result do_blob(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                               sqlite3 *db) {
    char digest[80], hex[KILN_SHA256_HEX];
    snprintf(digest, sizeof digest, "sha256:%s", r->seg[2]);
    if (!reg_digest_hex(digest, hex))
        return send_error(c, r, 400, "'%s' is not a sha256 digest", r->seg[2]);
    char *path = reg_blob_path(s->root, hex);
    if (!path) return MHD_NO;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    free(path);
    if (fd < 0) return send_error(c, r, 404, "blob sha256:%s not found", hex);
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return send_error(c, r, 500, "cannot stat blob sha256:%s", hex);
    }
    uint64_t size = (uint64_t)sb.st_size, start = 0, end = size ? size - 1 : 0;
    unsigned status = 200;
    const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range");
    if (range) {
        if (!reg_range_parse(range, size, &start, &end)) {
            close(fd);
            char *b =
                kiln_asprintf("{\"error\":\"range not satisfiable for %" PRIu64 " bytes\"}", size);
            if (!b) return MHD_NO;
            struct MHD_Response *resp =
                MHD_create_response_from_buffer(strlen(b), b, MHD_RESPMEM_MUST_FREE);
            if (!resp) {
                free(b);
                return MHD_NO;
            }
            char cr[64];
            snprintf(cr, sizeof cr, "bytes */%" PRIu64, size);
            MHD_add_response_header(resp, "Content-Range", cr);
            MHD_add_response_header(resp, "Content-Type", "application/json");
            r->status = 416;
            enum MHD_Result ok = MHD_queue_response(c, 416, resp);
            MHD_destroy_response(resp);
            return ok;
        }
        status = 206;
    }
    uint64_t len = size ? end - start + 1 : 0;
    struct MHD_Response *resp = NULL;
    blob_reader *br = NULL;
    if (s->tls_cert && (br = kiln_malloc(sizeof *br))) {
        /* Over TLS there is no sendfile; libmicrohttpd's file response then reads 4 KiB at a
         * time and sends each as its own TLS record. 256 KiB blocks, sent as full records. */
        br->fd = fd;
        br->start = start;
        resp = MHD_create_response_from_callback(len, REG_TLS_BLOCK, blob_read, br, blob_done);
        if (!resp) free(br);
    } else {
        resp = MHD_create_response_from_fd_at_offset64(len, fd, start);
    }
    if (!resp) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "application/octet-stream");
    MHD_add_response_header(resp, "Accept-Ranges", "bytes");
    char etag[80];
    snprintf(etag, sizeof etag, "\"sha256:%s\"", hex);
    MHD_add_response_header(resp, "ETag", etag);
    if (status == 206) {
        char cr[96];
        snprintf(cr, sizeof cr, "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, start, end, size);
        MHD_add_response_header(resp, "Content-Range", cr);
    }
    r->status = status;
    r->body_bytes = len;
    enum MHD_Result ok = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ok;
}

/* ---- writes ---- */

static enum MHD_Result send_published(struct MHD_Connection *c, req *r, unsigned status,
                                      const char *digest, uint64_t size) {
    return send_json(c, r, status,
                     json_pack("{s:s, s:s, s:s, s:I}", "name", r->seg[0], "version", r->seg[1],
                               "digest", digest, "size", (json_int_t)size));
}

/* What an upload of what ("archive", "dataset") must have before its body: a trust policy to
 * check it under, a Content-Length within the registry's limit (into *n). false with the
 * answer queued in *res when it has not. */
static bool upload_length(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                          const char *what, uint64_t *n, enum MHD_Result *res) {
    if (!has_trust(s)) {
        *res = send_error(
            c, r, 422, "this registry has no trust policy (serve --trust); it accepts no uploads");
        return false;
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (!cl) {
        *res = send_error(c, r, 411, "an upload needs a Content-Length");
        return false;
    }
    if (!reg_length_parse(cl, n)) {
        *res = send_error(c, r, 400, "bad Content-Length '%s'", cl);
        return false;
    }
    if (*n > s->max_upload) {
        *res = send_error(c, r, 413,
                          "%s of %" PRIu64 " bytes is larger than this registry's limit of %" PRIu64,
                          what, *n, s->max_upload);
        return false;
    }
    return true;
}

/* The upload's X-Kiln-Signature, decoded into r->sig; missing names what the header must
 * hold. false with the answer queued in *res (MHD_NO when out of memory). */
static bool upload_signature(struct MHD_Connection *c, req *r, const char *missing,
                             enum MHD_Result *res) {
    const char *sig = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Kiln-Signature");
    size_t slen = sig ? strlen(sig) : 0;
    if (!slen || slen > REG_SIG_MAX * 2) {
        *res = send_error(c, r, 400, "%s", missing);
        return false;
    }
    kiln_err drc = reg_sig_decode(sig, &r->sig, &r->sig_len);
    if (drc == KILN_ERR_NOMEM) {
        *res = MHD_NO;
        return false;
    }
    if (drc) {
        *res = send_error(c, r, 400, "X-Kiln-Signature is not base64 of a .minisig text");
        return false;
    }
    return true;
}

/* The first call of a PUT of an archive: everything that can be refused before the body. */
static enum MHD_Result upload_start(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                    sqlite3 *db) {
    enum MHD_Result res;
    uint64_t n;
    if (!upload_length(s, c, r, "archive", &n, &res)) return res;
    const char *digest = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Kiln-Digest");
    if (!digest || !reg_digest_hex(digest, r->hex))
        return send_error(c, r, 400,
                          "an upload needs X-Kiln-Digest: sha256:<64 lowercase hex digits>");
    /* A withdrawn archive is refused before its bytes are read (the body must then hash to
     * this digest), also when it is stored already. */
    trust_ref *tr = trust_acquire(s);
    kiln_err wrc = tr ? reg_withdrawn(tr->t, digest, "the archive") : KILN_OK;
    trust_release(s, tr);
    if (wrc) return send_kiln_error(c, r, wrc);
    if (!upload_signature(c, r, "an upload needs X-Kiln-Signature: the archive's .minisig, base64",
                          &res))
        return res;
    r->declared = n;
    kiln_err rc;
    uint64_t stored = 0;
    char *have = reg_version_digest_size(db, r->seg[0], r->seg[1], &stored, &rc);
    if (rc) return send_kiln_error(c, r, rc);
    if (have) {
        /* The stored archive's size, not the one this request declares: nothing was read, and
         * the answer says what the registry holds. */
        bool same = strcmp(have + 7, r->hex) == 0;
        enum MHD_Result ok =
            same ? send_published(c, r, 200, have, stored)
                 : send_error(c, r, 409, "'%s@%s' exists already with other bytes (%s)", r->seg[0],
                              r->seg[1], have);
        free(have);
        return ok;
    }
    if ((rc = reg_upload_begin(&r->up, s->root)) != KILN_OK) return send_kiln_error(c, r, rc);
    r->body = BODY_ARCHIVE;
    return MHD_YES;
}

static void body_fail(req *r, kiln_err rc) {
    if (r->body_failed) return;
    r->body_failed = true;
    r->body_rc = rc;
    r->body_msg = kiln_strdup(*kiln_errmsg() ? kiln_errmsg() : kiln_strerror(rc));
}

static enum MHD_Result upload_finish(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                     sqlite3 *db) {
    if (r->body_failed)
        return send_error(c, r, status_of(r->body_rc), "%s",
                          r->body_msg ? r->body_msg : "upload failed");
    kiln_err rc;
    char digest[80];
    snprintf(digest, sizeof digest, "sha256:%s", r->hex);
    if ((rc = reg_upload_check(&r->up, r->hex, r->declared)) != KILN_OK)
        return send_kiln_error(c, r, rc);
    char *path = reg_upload_path(&r->up);
    if (!path) return MHD_NO;
    char label[200];
    snprintf(label, sizeof label, "upload of %s@%s", r->seg[0], r->seg[1]);
    /* sign/ checks every signature block against this server's policy (release keys, the
     * release threshold, the unvalidated rule, comments naming the manifest); the files are
     * the client's to check on pull (this server never unpacks). */
    kiln_sign_archive_report rep;
    memset(&rep, 0, sizeof rep);
    reg_archive_meta m;
    memset(&m, 0, sizeof m);
    trust_ref *tr = trust_acquire(s);
    rc = tr ? kiln_sign_verify_archive_sigs(path, r->sig, r->sig_len, "X-Kiln-Signature", tr->t,
                                            &rep)
            : kiln_fail(KILN_ERR_VERIFY, "this registry has no trust policy");
    /* A malformed signature or comment is the signature's fault; bytes whose signatures
     * verify but that are no kiln archive are the upload's, and said so. */
    if (rc == KILN_ERR_FORMAT && rep.sigs_verified && !rep.info.model[0])
        rc = kiln_errprefix(KILN_ERR_VERIFY,
                            "not a kiln archive (its signatures verify, but it has no readable "
                            "manifest; kiln pack makes one): ");
    else if (rc == KILN_ERR_FORMAT)
        rc = kiln_errprefix(KILN_ERR_VERIFY, "archive signature: ");
    trust_release(s, tr);
    if (!rc) rc = reg_archive_meta_read(path, &m);
    if (rc) rc = kiln_errprefix(rc, "%s: ", label);
    rc = reg_relabel(rc, path, "the uploaded archive");
    free(path);
    if (!rc && memcmp(m.manifest_sha256, rep.info.manifest_sha256, KILN_SHA256_BYTES) != 0)
        rc = kiln_fail(KILN_ERR_VERIFY, "%s: the manifest read is not the one the signatures name",
                       label);
    if (!rc && (strcmp(m.name, r->seg[0]) || strcmp(m.version, r->seg[1])))
        rc = kiln_fail(KILN_ERR_VERIFY,
                       "the archive's manifest names '%s@%s', but it was uploaded as '%s@%s'",
                       m.name, m.version, r->seg[0], r->seg[1]);
    if (!rc) rc = reg_upload_commit(&r->up, r->hex);
    bool existed = false;
    if (!rc) {
        reg_version_row row = {.model = r->seg[0],
                               .version = r->seg[1],
                               .digest = digest,
                               .size = r->declared,
                               .meta = &m,
                               .sig = r->sig,
                               .sig_len = r->sig_len,
                               .publisher = r->token_name,
                               .created = kiln_unix_time()};
        rc = reg_version_insert(db, &row, r->token_name, r->audit, NULL, &existed);
    }
    reg_archive_meta_release(&m);
    if (rc) return send_kiln_error(c, r, rc);
    return send_published(c, r, existed ? 200 : 201, digest, r->declared);
}

/* ---- datasets (docs/registry.md, "Datasets") ---- */

static enum MHD_Result do_datasets(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                   sqlite3 *db) {
    (void)s;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT name, digest, size, publisher, created FROM datasets ORDER BY "
                           "name, created, digest",
                           -1, &st, NULL) != SQLITE_OK)
        return send_kiln_error(c, r, reg_db_fail(db, "listing datasets"));
    /* The versions trained on each: their cards' lineage.dataset_sha256 (the stored card is the
     * archive's, whose digest the release keys signed through the manifest). */
    sqlite3_stmt *tr = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT model || '@' || version FROM versions WHERE "
                           "json_valid(card) AND 'sha256:' || json_extract(card, "
                           "'$.lineage.dataset_sha256') = ?1 ORDER BY model, created, version",
                           -1, &tr, NULL) != SQLITE_OK) {
        sqlite3_finalize(st);
        return send_kiln_error(c, r, reg_db_fail(db, "listing datasets"));
    }
    json_t *arr = json_array();
    while (sqlite3_step(st) == SQLITE_ROW) {
        json_t *trained = json_array();
        sqlite3_reset(tr);
        sqlite3_bind_text(tr, 1, reg_col(st, 1), -1, SQLITE_TRANSIENT);
        while (sqlite3_step(tr) == SQLITE_ROW)
            json_array_append_new(trained, json_string(reg_col(tr, 0)));
        json_array_append_new(arr, json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "name", reg_col(st, 0),
                                             "digest", reg_col(st, 1), "size",
                                             (json_int_t)sqlite3_column_int64(st, 2), "publisher",
                                             reg_col(st, 3), "created",
                                             kiln_time_json(sqlite3_column_int64(st, 4)),
                                             "trained", trained));
    }
    sqlite3_finalize(tr);
    sqlite3_finalize(st);
    return send_json(c, r, 200, json_pack("{s:o}", "datasets", arr));
}

/* {digest} of a dataset's route: 64 lowercase hex digits. */
static bool dataset_hex(struct MHD_Connection *c, req *r, enum MHD_Result *res) {
    size_t n = strlen(r->seg[2]);
    bool ok = n == 64;
    for (size_t i = 0; ok && i < n; i++)
        ok = (r->seg[2][i] >= '0' && r->seg[2][i] <= '9') ||
             (r->seg[2][i] >= 'a' && r->seg[2][i] <= 'f');
    if (!ok)
        *res = send_error(c, r, 400, "a dataset's digest is 64 lowercase hex digits, not '%s'",
                          r->seg[2]);
    else
        memcpy(r->hex, r->seg[2], 65);
    return ok;
}

static enum MHD_Result do_dataset(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                  sqlite3 *db) {
    (void)s;
    enum MHD_Result res;
    if (!dataset_hex(c, r, &res)) return res;
    char digest[80];
    snprintf(digest, sizeof digest, "sha256:%s", r->hex);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT size, signature, publisher, created FROM datasets WHERE name = "
                           "?1 AND digest = ?2",
                           -1, &st, NULL) != SQLITE_OK)
        return send_kiln_error(c, r, reg_db_fail(db, "reading a dataset"));
    sqlite3_bind_text(st, 1, r->seg[0], -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, digest, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) != SQLITE_ROW) {
        sqlite3_finalize(st);
        return send_error(c, r, 404, "dataset '%s@%s' not found", r->seg[0], digest);
    }
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:s, s:o}", "name", r->seg[0], "digest", digest,
                          "size", (json_int_t)sqlite3_column_int64(st, 0), "signature",
                          reg_col(st, 1), "publisher", reg_col(st, 2), "created",
                          kiln_time_json(sqlite3_column_int64(st, 3)));
    sqlite3_finalize(st);
    return send_json(c, r, 200, j);
}

/* The first call of a PUT of a dataset: refused before the body as an archive's upload is
 * (no policy, no or a bad length, over the limit, no signature); the same name and digest
 * held already is 200 with nothing read. */
static enum MHD_Result dataset_start(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                     sqlite3 *db) {
    enum MHD_Result res;
    if (!dataset_hex(c, r, &res)) return res;
    uint64_t n;
    if (!upload_length(s, c, r, "dataset", &n, &res)) return res;
    if (!upload_signature(c, r, "a dataset upload needs X-Kiln-Signature: its .minisig, base64",
                          &res))
        return res;
    r->declared = n;
    char digest[80];
    snprintf(digest, sizeof digest, "sha256:%s", r->hex);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT size FROM datasets WHERE name = ?1 AND digest = ?2", -1,
                           &st, NULL) != SQLITE_OK)
        return send_kiln_error(c, r, reg_db_fail(db, "reading a dataset"));
    sqlite3_bind_text(st, 1, r->seg[0], -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, digest, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) == SQLITE_ROW) {
        json_int_t size = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        return send_json(c, r, 200,
                         json_pack("{s:s, s:s, s:I}", "name", r->seg[0], "digest", digest, "size",
                                   size));
    }
    sqlite3_finalize(st);
    kiln_err rc;
    if ((rc = reg_upload_begin(&r->up, s->root)) != KILN_OK) return send_kiln_error(c, r, rc);
    r->body = BODY_DATASET;
    return MHD_YES;
}

static enum MHD_Result dataset_finish(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                      sqlite3 *db) {
    if (r->body_failed)
        return send_error(c, r, status_of(r->body_rc), "%s",
                          r->body_msg ? r->body_msg : "upload failed");
    kiln_err rc;
    char digest[80];
    snprintf(digest, sizeof digest, "sha256:%s", r->hex);
    if ((rc = reg_upload_check(&r->up, r->hex, r->declared)) != KILN_OK)
        return send_kiln_error(c, r, rc);
    char *path = reg_upload_path(&r->up);
    if (!path) return MHD_NO;
    char who[KILN_SIGN_NAME_MAX + 1];
    trust_ref *tr = trust_acquire(s);
    rc = tr ? reg_dataset_verify(tr->t, r->sig, r->sig_len, "X-Kiln-Signature", path, r->seg[0],
                                 r->hex, who, sizeof who)
            : kiln_fail(KILN_ERR_VERIFY, "this registry has no trust policy");
    trust_release(s, tr);
    if (rc) rc = kiln_errprefix(rc, "upload of dataset '%s': ", r->seg[0]);
    rc = reg_relabel(rc, path, "the uploaded dataset");
    free(path);
    if (!rc) rc = reg_upload_commit(&r->up, r->hex);
    bool existed = false;
    if (!rc) {
        reg_dataset_row row = {.name = r->seg[0],
                               .digest = digest,
                               .size = r->declared,
                               .sig = r->sig,
                               .sig_len = r->sig_len,
                               .publisher = r->token_name ? r->token_name : "?",
                               .created = kiln_unix_time()};
        rc = reg_dataset_insert(db, &row, &existed);
    }
    if (rc) return send_kiln_error(c, r, rc);
    return send_json(c, r, existed ? 200 : 201,
                     json_pack("{s:s, s:s, s:I, s:s}", "name", r->seg[0], "digest", digest, "size",
                               (json_int_t)r->declared, "signed_by", who));
}

/* The start of an upload of a small signed document (body: a channel record or a trust
 * version, one the registry checks against its trust policy): the registry has a policy, the
 * Content-Length is at most max, and a buffer holds the whole body. what names one in
 * answers ("a channel record"), them several ("channel records"). */
static enum MHD_Result signed_doc_start(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                        body_kind body, const char *what, const char *them,
                                        unsigned max) {
    if (!has_trust(s))
        return send_error(c, r, 422,
                          "this registry has no trust policy (serve --trust); it accepts no %s",
                          them);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    uint64_t n;
    if (!cl) return send_error(c, r, 411, "%s needs a Content-Length", what);
    if (!reg_length_parse(cl, &n)) return send_error(c, r, 400, "bad Content-Length '%s'", cl);
    if (n > max) return send_error(c, r, 413, "%s is at most %u bytes", what, max);
    r->rec = kiln_malloc((size_t)n + 1);
    if (!r->rec) return MHD_NO;
    r->rec_cap = (size_t)n;
    r->body = body;
    return MHD_YES;
}

/* The body signed_doc_start took, NUL-terminated: false once an answer is queued into *ret (a
 * body that failed, bad its fallback message; or a NUL byte in it, named by what). */
static bool signed_doc_text(struct MHD_Connection *c, req *r, const char *bad, const char *what,
                            enum MHD_Result *ret) {
    if (r->body_failed) {
        *ret = send_error(c, r, status_of(r->body_rc), "%s", r->body_msg ? r->body_msg : bad);
        return false;
    }
    r->rec[r->rec_len] = 0;
    if (memchr(r->rec, 0, r->rec_len)) {
        *ret = send_error(c, r, 400, "%s holds a NUL byte", what);
        return false;
    }
    return true;
}

/* ---- reproduction records (docs/reproduce.md) ---- */

/* model@version's records as [{"record", "signature", "signer", "verdict", "publisher",
 * "created"}], oldest first, into *out (new). */
static kiln_err load_repros(sqlite3 *db, const char *model, const char *version, json_t **out) {
    sqlite3_stmt *st = NULL;
    *out = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT record, signature, signer, verdict, publisher, created FROM "
                           "reproductions WHERE model = ?1 AND version = ?2 ORDER BY created, "
                           "rowid",
                           -1, &st, NULL) != SQLITE_OK)
        return reg_db_fail(db, "reading reproduction records");
    sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, version, -1, SQLITE_TRANSIENT);
    json_t *arr = json_array();
    while (arr && sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:s, s:s, s:o}", "record",
                                             reg_col(st, 0), "signature", reg_col(st, 1), "signer",
                                             reg_col(st, 2), "verdict", reg_col(st, 3), "publisher",
                                             reg_col(st, 4), "created",
                                             kiln_time_json(sqlite3_column_int64(st, 5))));
    sqlite3_finalize(st);
    if (!arr) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    *out = arr;
    return KILN_OK;
}

static enum MHD_Result do_repros(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                 sqlite3 *db) {
    (void)s;
    json_t *arr;
    kiln_err rc = load_repros(db, r->seg[0], r->seg[1], &arr);
    if (rc) return send_kiln_error(c, r, rc);
    return send_json(c, r, 200,
                     json_pack("{s:s, s:s, s:o}", "name", r->seg[0], "version", r->seg[1],
                               "reproductions", arr));
}

static enum MHD_Result repro_start(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                   sqlite3 *db) {
    (void)db;
    return signed_doc_start(s, c, r, BODY_REPRO, "a reproduction record",
                            "reproduction records", REG_REPRO_MAX);
}

/* The body {"record": text, "signature": text}: the record verified under the server's policy
 * (a key with the reproduce role, naming this version's stored digest), then stored. */
static enum MHD_Result repro_finish(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                    sqlite3 *db) {
    enum MHD_Result ret;
    if (!signed_doc_text(c, r, "bad reproduction record", "reproduction record", &ret))
        return ret;
    char label[200];
    snprintf(label, sizeof label, "reproduction record for %s@%s", r->seg[0], r->seg[1]);
    json_t *doc = NULL;
    kiln_err rc = kiln_json_parse(r->rec, r->rec_len, label, &doc);
    const char *text = json_string_value(json_object_get(doc, "record")),
               *sig = json_string_value(json_object_get(doc, "signature"));
    if (!rc && (!text || !sig))
        rc = kiln_fail(KILN_ERR_FORMAT, "%s: the body must be {\"record\": TEXT, \"signature\": "
                       "TEXT}", label);
    uint64_t size = 0;
    char *digest = NULL;
    if (!rc) digest = reg_version_digest_size(db, r->seg[0], r->seg[1], &size, &rc);
    if (!rc && !digest)
        rc = kiln_fail(KILN_ERR_NOTFOUND, "version '%s@%s' not found", r->seg[0], r->seg[1]);
    const kiln_sign_trust_key *k = NULL;
    bool identical = false;
    char signer[KILN_SIGN_NAME_MAX + 1] = "";
    if (!rc) {
        trust_ref *tr = trust_acquire(s);
        rc = tr ? reg_repro_verify(tr->t, text, sig, label, r->seg[0], r->seg[1], digest, &k,
                                   &identical)
                : kiln_fail(KILN_ERR_VERIFY, "this registry has no trust policy");
        if (!rc) snprintf(signer, sizeof signer, "%s", k->name);
        trust_release(s, tr);
    }
    sqlite3_stmt *st = NULL;
    if (!rc && (rc = reg_db_exec(db, "BEGIN IMMEDIATE")) == KILN_OK) {
        if (sqlite3_prepare_v2(db,
                               "INSERT OR IGNORE INTO reproductions(model, version, digest, signer,"
                               " verdict, record, signature, publisher, created) VALUES(?1, ?2, "
                               "?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                               -1, &st, NULL) != SQLITE_OK)
            rc = reg_db_fail(db, "storing a reproduction record");
        if (!rc) {
            sqlite3_bind_text(st, 1, r->seg[0], -1, SQLITE_TRANSIENT);
            sqlite3_bind_text(st, 2, r->seg[1], -1, SQLITE_TRANSIENT);
            sqlite3_bind_text(st, 3, digest, -1, SQLITE_TRANSIENT);
            sqlite3_bind_text(st, 4, signer, -1, SQLITE_TRANSIENT);
            sqlite3_bind_text(st, 5, identical ? "identical" : "different", -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 6, text, -1, SQLITE_TRANSIENT);
            sqlite3_bind_text(st, 7, sig, -1, SQLITE_TRANSIENT);
            sqlite3_bind_text(st, 8, r->token_name ? r->token_name : "?", -1, SQLITE_TRANSIENT);
            sqlite3_bind_int64(st, 9, kiln_unix_time());
            if (sqlite3_step(st) != SQLITE_DONE) rc = reg_db_fail(db, "storing a reproduction record");
        }
        if (st) sqlite3_finalize(st);
        if (!rc) rc = reg_audit(db, r->token_name, "reproduce", r->seg[0], r->seg[1], NULL, digest);
        if (!rc) rc = reg_db_exec(db, "COMMIT");
        if (rc) (void)reg_db_exec(db, "ROLLBACK");
    }
    json_decref(doc);
    if (rc) {
        free(digest);
        return send_kiln_error(c, r, rc);
    }
    ret = send_json(c, r, 201,
                    json_pack("{s:s, s:s, s:s, s:s, s:s}", "name", r->seg[0], "version", r->seg[1],
                              "digest", digest, "signer", signer, "verdict",
                              identical ? "identical" : "different"));
    free(digest);
    return ret;
}

/* A channel whose policy asks for reproduction records (reproduced_by) takes a record only for
 * a version that has them, verified here under the server's policy. */
static kiln_err repro_gate(kiln_registry_server *s, sqlite3 *db, const reg_record *rec) {
    trust_ref *tr = trust_acquire(s);
    const char *const *keys;
    size_t nkeys;
    kiln_err rc = KILN_OK;
    if (tr && kiln_sign_trust_reproduced_by(tr->t, rec->channel, &keys, &nkeys)) {
        json_t *docs = NULL;
        rc = load_repros(db, rec->model, rec->version, &docs);
        if (!rc)
            rc = reg_repro_required(tr->t, rec->channel, docs, rec->model, rec->version,
                                    rec->digest, "the channel record");
        json_decref(docs);
    }
    trust_release(s, tr);
    return rc;
}

static enum MHD_Result record_start(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                    sqlite3 *db) {
    return signed_doc_start(s, c, r, BODY_RECORD, "a channel record", "channel records",
                            REG_RECORD_MAX);
}

static enum MHD_Result record_finish(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                     sqlite3 *db) {
    enum MHD_Result ret;
    if (!signed_doc_text(c, r, "bad record", "channel record", &ret)) return ret;
    reg_record rec;
    char label[200];
    snprintf(label, sizeof label, "channel record for %s/%s", r->seg[0], r->seg[1]);
    trust_ref *tr = trust_acquire(s);
    kiln_err rc = reg_record_verify(tr ? tr->t : NULL, r->rec, r->rec_len, label, &rec);
    if (!rc) {
        char what[400];
        snprintf(what, sizeof what, "%s@%s, which the %s names,", rec.model, rec.version, label);
        rc = reg_withdrawn(tr->t, rec.digest, what);
    }
    trust_release(s, tr);
    if (!rc && (strcmp(rec.model, r->seg[0]) || strcmp(rec.channel, r->seg[1])))
        rc = kiln_fail(KILN_ERR_VERIFY, "%s names %s/%s instead", label, rec.model, rec.channel);
    if (!rc && rec.expires <= kiln_unix_time())
        rc = kiln_fail(KILN_ERR_VERIFY, "%s has expired", label);
    if (!rc) rc = repro_gate(s, db, &rec);
    if (!rc)
        rc = reg_record_insert(db, &rec, r->rec, r->token_name, kiln_unix_time(), r->token_name,
                               r->audit, NULL);
    if (rc) return send_kiln_error(c, r, rc);
    return send_json(c, r, 201,
                     json_pack("{s:s, s:s, s:I, s:s, s:s}", "model", rec.model, "channel",
                               rec.channel, "seq", (json_int_t)rec.seq, "version", rec.version,
                               "digest", rec.digest));
}

/* ---- trust versions ---- */

/* GET /v1/trust (trust_v 0: the newest) and /v1/trust/{version}: the signed document as
 * stored. */
static enum MHD_Result do_trust(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                sqlite3 *db) {
    char *doc;
    size_t len;
    kiln_err rc = reg_trust_get(db, r->trust_v, &doc, &len);
    if (rc) return send_kiln_error(c, r, rc);
    return send_buf(c, r, 200, doc, len, "application/json");
}

static enum MHD_Result trust_start(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                   sqlite3 *db) {
    return signed_doc_start(s, c, r, BODY_TRUST, "a trust version", "trust versions",
                            REG_TRUST_MAX);
}

/* PUT /v1/trust/{v}: the body must be the signed policy of version v, the successor of the
 * policy in force; it is stored (one transaction, one audit row) and then used for every
 * check. One at a time, so that two PUTs of the same version cannot both pass. */
static enum MHD_Result trust_finish(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                    sqlite3 *db) {
    enum MHD_Result ret;
    if (!signed_doc_text(c, r, "bad trust version", "the trust version", &ret)) return ret;
    uint64_t v = r->trust_v; /* checked in first_call */
    char label[96];
    snprintf(label, sizeof label, "trust version %llu", (unsigned long long)v);
    kiln_sign_trust *t = NULL, *next = NULL;
    kiln_err rc = kiln_sign_trust_parse(r->rec, r->rec_len, label, &t);
    if (rc) return send_error(c, r, rc == KILN_ERR_NOMEM ? 500 : 400, "%s", kiln_errmsg());
    uint64_t doc_v = kiln_sign_trust_version(t);
    bool is_signed = kiln_sign_trust_signatures(t) > 0;
    kiln_sign_trust_free(t);
    if (!is_signed)
        return send_error(c, r, 400, "'%s' is a plain policy: a trust version must be signed",
                          label);
    if (doc_v != v)
        return send_error(c, r, 400, "'%s' holds version %llu, not the version of its URL", label,
                          (unsigned long long)doc_v);
    unsigned status = 201;
    pthread_mutex_lock(&s->trust_put_mu);
    trust_ref *cur = trust_acquire(s);
    uint64_t cv = cur ? kiln_sign_trust_version(cur->t) : 0;
    if (!cur)
        rc = kiln_fail(KILN_ERR_VERIFY, "this registry has no trust policy");
    else if (v != cv + 1)
        rc = kiln_fail(KILN_ERR_CONFLICT,
                       "'%s': the registry's trust policy is at version %llu, so the next is %llu",
                       label, (unsigned long long)cv, (unsigned long long)cv + 1);
    else
        rc = kiln_sign_trust_update(cur->t, r->rec, r->rec_len, label, &next, NULL);
    trust_release(s, cur);
    if (rc == KILN_ERR_FORMAT) status = 400;
    if (!rc) rc = reg_trust_store(db, v, r->rec, r->rec_len, r->token_name, r->audit, NULL);
    if (!rc) {
        rc = trust_swap(s, next);
        next = NULL;
        if (!rc) kiln_info("registry: trust policy version %llu in force", (unsigned long long)v);
    }
    pthread_mutex_unlock(&s->trust_put_mu);
    kiln_sign_trust_free(next);
    if (rc) {
        if (status == 400) return send_error(c, r, 400, "%s", kiln_errmsg());
        return send_kiln_error(c, r, rc);
    }
    return send_json(c, r, status, json_pack("{s:I}", "version", (json_int_t)v));
}

/* ---- the routes ---- */

/* What a row asks of its request beyond its method and pattern. */
enum {
    R_OPEN = 1 << 0,    /* no token and no store (its handler gets db NULL): /healthz */
    R_WRITE = 1 << 1,   /* refused on a mirror; a new version or channel follows the naming rule */
    R_PAGE = 1 << 2,    /* a page: refusals are pages too, and an empty {model} is a bad name */
    R_TRUST_N = 1 << 3, /* {version} is a trust version (1 to 2^53-1), in req.trust_v */
};

typedef enum MHD_Result (*route_fn)(kiln_registry_server *s, struct MHD_Connection *c, req *r,
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
    page_fn page;      /* a page's, rendered by do_page */
    const char *audit; /* the action the handler writes to the audit log; NULL: none */
    unsigned flags;    /* R_* */
} route_row;

static const route_row routes[] = {
    {"GET", "/healthz", REG_R_HEALTH, 0, do_health, NULL, NULL, R_OPEN},
    {"GET", "/metrics", REG_R_METRICS, KILN_SCOPE_READ, do_metrics, NULL, NULL, 0},
    {"GET", "/v1/models", REG_R_MODELS, KILN_SCOPE_READ, do_models, NULL, NULL, 0},
    {"GET", "/v1/models/{model}", REG_R_MODEL, KILN_SCOPE_READ, do_model, NULL, NULL, 0},
    {"GET", "/v1/models/{model}/versions/{version}", REG_R_VERSION, KILN_SCOPE_READ, do_version,
     NULL, NULL, 0},
    {"PUT", "/v1/models/{model}/versions/{version}", REG_R_VERSION, KILN_SCOPE_PUBLISH,
     upload_start, NULL, "publish", R_WRITE},
    {"GET", "/v1/models/{model}/channels/{channel}", REG_R_CHANNEL, KILN_SCOPE_READ, do_channel,
     NULL, NULL, 0},
    /* The audit action is the record's own: "promote", or "rollback" for a record whose reason
     * says so (reg_record_insert). */
    {"PUT", "/v1/models/{model}/channels/{channel}", REG_R_CHANNEL, KILN_SCOPE_PROMOTE,
     record_start, NULL, NULL, R_WRITE},
    {"GET", "/v1/models/{model}/channels/{channel}/history", REG_R_HISTORY, KILN_SCOPE_READ,
     do_history, NULL, NULL, 0},
    {"GET", "/v1/blobs/sha256/{digest}", REG_R_BLOB, KILN_SCOPE_READ, do_blob, NULL, NULL, 0},
    {"GET", "/v1/audit", REG_R_AUDIT, KILN_SCOPE_ADMIN, do_audit, NULL, NULL, 0},
    {"GET", "/v1/tokens", REG_R_TOKENS, KILN_SCOPE_ADMIN, do_tokens, NULL, NULL, 0},
    {"GET", "/v1/trust", REG_R_TRUST, KILN_SCOPE_READ, do_trust, NULL, NULL, 0},
    {"GET", "/v1/trust/{version}", REG_R_TRUST_VERSION, KILN_SCOPE_READ, do_trust, NULL, NULL,
     R_TRUST_N},
    {"PUT", "/v1/trust/{version}", REG_R_TRUST_VERSION, KILN_SCOPE_ADMIN, trust_start, NULL,
     "trust.put", R_WRITE | R_TRUST_N},
    {"GET", "/v1/models/{model}/versions/{version}/reproductions", REG_R_REPRODUCTIONS,
     KILN_SCOPE_READ, do_repros, NULL, NULL, 0},
    /* The audit row ("reproduce") is written with the record's insert. */
    {"PUT", "/v1/models/{model}/versions/{version}/reproductions", REG_R_REPRODUCTIONS,
     KILN_SCOPE_PUBLISH, repro_start, NULL, "reproduce", R_WRITE},
    {"GET", "/v1/datasets", REG_R_DATASETS, KILN_SCOPE_READ, do_datasets, NULL, NULL, 0},
    {"GET", "/v1/datasets/{model}/sha256/{digest}", REG_R_DATASET, KILN_SCOPE_READ, do_dataset,
     NULL, NULL, 0},
    /* The audit row ("data.publish") is written with the dataset's insert. */
    {"PUT", "/v1/datasets/{model}/sha256/{digest}", REG_R_DATASET, KILN_SCOPE_PUBLISH,
     dataset_start, NULL, "data.publish", R_WRITE},
    {"GET", "/", REG_R_UI_HOME, KILN_SCOPE_READ, NULL, page_home, NULL, R_PAGE},
    {"GET", "/ui/models/{model}", REG_R_UI_MODEL, KILN_SCOPE_READ, NULL, page_model, NULL, R_PAGE},
    {"GET", "/ui/models/{model}/versions/{version}", REG_R_UI_VERSION, KILN_SCOPE_READ, NULL,
     page_version, NULL, R_PAGE},
    {"GET", "/ui/models/{model}/channels/{channel}", REG_R_UI_CHANNEL, KILN_SCOPE_READ, NULL,
     page_channel, NULL, R_PAGE},
    {"GET", "/ui/audit", REG_R_UI_AUDIT, KILN_SCOPE_ADMIN, NULL, page_audit, NULL, R_PAGE},
    {"GET", "/ui/trust", REG_R_UI_TRUST, KILN_SCOPE_READ, NULL, page_trust, NULL, R_PAGE},
};

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

/* A refused token counts in /metrics by why; nothing is written to the store for it. */
static void count_refusal(kiln_registry_server *s, reg_auth_refusal why) {
    pthread_mutex_lock(&s->mu);
    s->auth_refused[why]++;
    pthread_mutex_unlock(&s->mu);
}

static enum MHD_Result authorize(kiln_registry_server *s, struct MHD_Connection *c, req *r,
                                 sqlite3 *db, unsigned need, bool *ok) {
    *ok = false;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h) {
        if (need == KILN_SCOPE_READ && !s->read_required) {
            *ok = true;
            return MHD_YES;
        }
        count_refusal(s, REG_AUTH_MISSING);
        return send_error(c, r, 401, "this request needs a token (Authorization: Bearer)");
    }
    const char *token = reg_bearer_token(h);
    if (!token) {
        count_refusal(s, REG_AUTH_MALFORMED);
        return send_error(c, r, 401, "Authorization must be 'Bearer <token>'");
    }
    /* No cache: the token's row is read on every request, so a revocation or an expiry
     * holds from the next request on. */
    reg_auth_refusal why;
    kiln_err rc = reg_token_lookup(db, token, kiln_unix_time(), &r->token_name, &r->scopes, &why);
    if (rc == KILN_ERR_AUTH) {
        count_refusal(s, why);
        return send_error(c, r, 401, "%s", kiln_errmsg());
    }
    if (rc) return send_kiln_error(c, r, rc);
    if (!(r->scopes & need)) {
        static const char *const names[] = {"", "read", "publish", "",     "promote",
                                            "", "",     "",        "admin"};
        count_refusal(s, REG_AUTH_SCOPE);
        return send_error(c, r, 403, "token '%s' lacks the '%s' scope", r->token_name, names[need]);
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
static enum MHD_Result check_names(struct MHD_Connection *c, req *r, const route_row *w, bool *ok) {
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
    if (rc) return send_kiln_error(c, r, rc);
    if (w->flags & R_TRUST_N && !reg_trust_version_parse(r->seg[1], &r->trust_v))
        return send_error(c, r, 400, "'%s' is not a trust version (an integer from 1 to 2^53-1)",
                          r->seg[1]);
    *ok = true;
    return MHD_YES;
}

/* The table's answer: the row of the path's route and the method (400 for a malformed path,
 * 404 when no route's pattern matches, 405 naming the methods that would), the names it
 * captured checked, the token checked against the row's scope (401, 403), then its handler. */
static enum MHD_Result first_call(kiln_registry_server *s, struct MHD_Connection *c, req *r,
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
    if (bad) return send_error(c, r, 400, "malformed path");
    if (!any) return send_error(c, r, 404, "no such route");
    if (!w || (w->flags & R_WRITE && s->mirror_of)) {
        allow_of(s, r->route, r->allow, sizeof r->allow);
        if (!w) return send_error(c, r, 405, "%s is not allowed on %s", method, any->pattern);
        /* a mirror is read-only: it copies its primary */
        return send_error(c, r, 405, "this registry is a mirror of %s: publish there",
                          s->mirror_of);
    }
    r->audit = w->audit;
    if (w->flags & R_OPEN) return w->fn(s, c, r, NULL);
    bool ok;
    enum MHD_Result res = check_names(c, r, w, &ok);
    if (!ok) return res;
    sqlite3 *db = NULL;
    kiln_err rc = reg_db_connect(s->root, &db);
    if (rc) return send_kiln_error(c, r, rc);
    res = authorize(s, c, r, db, w->scope, &ok);
    if (ok) res = w->page ? do_page(s, c, r, db, w->page) : w->fn(s, c, r, db);
    reg_db_close(db);
    return res;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload_data,
                               size_t *upload_data_size, void **con_cls) {
    kiln_registry_server *s = cls;
    (void)version;
    req *r = *con_cls;
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
        if (r->body == BODY_ARCHIVE || r->body == BODY_DATASET) {
            kiln_err rc =
                r->up.size + n > r->declared
                    ? kiln_fail(KILN_ERR_VERIFY, "upload is longer than its Content-Length")
                    : reg_upload_write(&r->up, upload_data, n);
            if (rc) body_fail(r, rc);
        } else if (r->body == BODY_RECORD || r->body == BODY_TRUST || r->body == BODY_REPRO) {
            if (r->rec_len + n > r->rec_cap)
                body_fail(r, kiln_fail(KILN_ERR_LIMIT, "%s is longer than its Content-Length",
                                       r->body == BODY_RECORD  ? "channel record"
                                       : r->body == BODY_TRUST ? "trust version"
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
    if (rc) return send_kiln_error(c, r, rc);
    enum MHD_Result res = r->body == BODY_ARCHIVE  ? upload_finish(s, c, r, db)
                          : r->body == BODY_RECORD ? record_finish(s, c, r, db)
                          : r->body == BODY_TRUST  ? trust_finish(s, c, r, db)
                          : r->body == BODY_DATASET ? dataset_finish(s, c, r, db)
                          : r->body == BODY_REPRO   ? repro_finish(s, c, r, db)
                                                   : send_error(c, r, 500, "no response");
    reg_db_close(db);
    return res;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
    kiln_registry_server *s = cls;
    (void)c;
    req *r = *con_cls;
    if (!r) return;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !r->status)
        r->status = 499; /* client went away */
    count_request(s, r);
    reg_upload_abort(&r->up);
    free(r->token_name);
    free(r->body_msg);
    free(r->sig);
    free(r->rec);
    free(r);
    *con_cls = NULL;
    atomic_fetch_sub(&s->in_flight, 1);
}

/* A connection opened or closed (the timeouts of a connection are web/httpd.c's). */
static void conn_notify(void *cls, bool opened) {
    kiln_registry_server *s = cls;
    atomic_fetch_add(&s->connections, opened ? 1 : -1);
}

/* Paths stay as sent: the router decodes each segment itself, so an encoded '/' or ".."
 * lands inside a name, where validation refuses it, and never changes the route. */
static size_t no_unescape(void *cls, struct MHD_Connection *c, char *s) {
    (void)cls, (void)c;
    return strlen(s);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n')
        line[--n] = 0;
    kiln_debug("registry: microhttpd: %s", line);
}

/* Bind the listen address once and let it go, before the store is touched: an address in
 * use or not local is refused with nothing made on disk. (The daemon binds it again a moment
 * later, with SO_REUSEADDR as here; losing that race is still reported, only later.) */
static kiln_err probe_listen(const struct sockaddr_storage *ss, bool v6, const char *listen) {
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return kiln_fail_errno(KILN_ERR_NETWORK, "cannot listen on '%s'", listen);
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t len = v6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    kiln_err rc = KILN_OK;
    if (bind(fd, (const struct sockaddr *)ss, len) != 0)
        rc = kiln_fail_errno(KILN_ERR_NETWORK, "cannot listen on '%s'", listen);
    close(fd);
    return rc;
}

/* Named temporaries left by a server that crashed (where O_TMPFILE is missing). */
static void clear_tmp(const char *root) {
    char *cmd_dir = kiln_path_join(root, "tmp");
    DIR *d = cmd_dir ? opendir(cmd_dir) : NULL;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (!strncmp(e->d_name, "upload-", 7)) {
                char *p = kiln_path_join(cmd_dir, e->d_name);
                if (p) unlink(p);
                free(p);
            }
        closedir(d);
    }
    free(cmd_dir);
}

/* The PEM certificate and key of o (both or neither) into *cert and *key, checked: each
 * parses, and the key is the certificate's. */
static kiln_err tls_load(const kiln_registry_server_opts *o, char **cert, char **key) {
    *cert = *key = NULL;
    if (!o->tls_cert && !o->tls_key) return KILN_OK;
    KILN_FAIL_IF(!o->tls_cert || !o->tls_key, KILN_ERR_USAGE,
                 "HTTPS needs both a certificate and its private key (--tls-cert and --tls-key)");
    KILN_FAIL_IF(MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES, KILN_ERR_UNSUPPORTED,
                 "this libmicrohttpd was built without TLS: serve plain HTTP behind a TLS proxy");
    size_t cl = 0, kl = 0;
    kiln_err rc = kiln_read_file(o->tls_cert, 1 << 20, cert, &cl);
    if (!rc) rc = kiln_read_file(o->tls_key, 1 << 20, key, &kl);
    BIO *cb = NULL, *kb = NULL;
    X509 *x = NULL;
    EVP_PKEY *k = NULL;
    if (!rc) {
        cb = BIO_new_mem_buf(*cert, (int)cl);
        kb = BIO_new_mem_buf(*key, (int)kl);
        if (!cb || !kb) rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    if (!rc && !(x = PEM_read_bio_X509(cb, NULL, NULL, NULL)))
        rc = kiln_fail(KILN_ERR_FORMAT, "'%s': not a PEM certificate", o->tls_cert);
    if (!rc && !(k = PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL)))
        rc = kiln_fail(KILN_ERR_FORMAT, "'%s': not a PEM private key (an unencrypted one)",
                       o->tls_key);
    if (!rc && X509_check_private_key(x, k) != 1)
        rc = kiln_fail(KILN_ERR_VERIFY, "'%s' is not the private key of the certificate '%s'",
                       o->tls_key, o->tls_cert);
    ERR_clear_error();
    X509_free(x);
    EVP_PKEY_free(k);
    BIO_free(cb);
    BIO_free(kb);
    if (rc) {
        free(*cert);
        if (*key) sodium_memzero(*key, kl);
        free(*key);
        *cert = *key = NULL;
    }
    return rc;
}

/* New connections while the server stops are closed at once. (Not MHD_quiesce_daemon: on an
 * epoll daemon with worker threads it races the workers' own removal of the listen socket from
 * their epoll sets, and libmicrohttpd 0.9.75 aborts the process when it loses: "Failed to
 * remove listen FD from epoll set"; registry_server_stops_cleanly_under_load.) */
static enum MHD_Result accept_policy(void *cls, const struct sockaddr *addr, socklen_t len) {
    (void)addr, (void)len;
    kiln_registry_server *s = cls;
    return atomic_load(&s->stopping) ? MHD_NO : MHD_YES;
}

kiln_err kiln_registry_server_start(const kiln_registry_server_opts *o,
                                    kiln_registry_server **out) {
    *out = NULL;
    KILN_FAIL_IF(!o->root || !o->listen, KILN_ERR_USAGE,
                 "the registry needs a root and a listen address");
    KILN_FAIL_IF(sodium_init() < 0, KILN_ERR_INTERNAL, "libsodium failed to initialise");
    struct sockaddr_storage ss;
    bool v6;
    KILN_TRY(kiln_web_listen_parse(o->listen, &ss, &v6));
    kiln_registry_server *s = kiln_calloc(1, sizeof *s);
    if (!s) return KILN_ERR_NOMEM;
    s->lock_fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->trust_mu, NULL);
    pthread_mutex_init(&s->trust_put_mu, NULL);
    kiln_sign_trust *trust = NULL;
    kiln_err rc = KILN_OK;
    sqlite3 *db = NULL;
    char *lock_path = NULL;
    bool made_lock = false;
    s->root = kiln_strdup(o->root);
    KILN_CHECK_IF(rc, fail, !s->root, KILN_ERR_NOMEM, "out of memory");
    s->read_required = o->read_token_required;
    s->max_upload = o->max_upload ? o->max_upload : 16ull << 30;
    /* The policy before the store: a bad --trust must not leave a new store behind. */
    if (o->trust) {
        /* Read once, parsed twice: the policy walked to the one in force, and the one the
         * web page walks the stored versions from, the same bytes. */
        char *text = NULL;
        size_t len = 0;
        KILN_CHECK(rc, fail, kiln_read_file(o->trust, KILN_SIGN_TRUST_FILE_LIMIT, &text, &len));
        rc = kiln_sign_trust_parse(text, len, o->trust, &trust);
        if (!rc) rc = kiln_sign_trust_parse(text, len, o->trust, &s->trust_start);
        free(text);
        if (rc) goto fail;
    }
    /* The certificate and key too (and whether this libmicrohttpd speaks TLS at all). */
    KILN_CHECK(rc, fail, tls_load(o, &s->tls_cert, &s->tls_key));
    /* Likewise the root and the address: a refusal leaves nothing behind. */
    KILN_CHECK(rc, fail, reg_root_check(o->root));
    KILN_CHECK(rc, fail, probe_listen(&ss, v6, o->listen));
    /* A lock file this start makes goes again if the start fails (a corrupt registry.db):
     * a refusal leaves the directory as it found it. */
    lock_path = kiln_path_join(o->root, "lock");
    KILN_CHECK_IF(rc, fail, !lock_path, KILN_ERR_NOMEM, "out of memory");
    bool had_lock = kiln_path_exists(lock_path);
    KILN_CHECK(rc, fail, reg_lock(o->root, &s->lock_fd));
    made_lock = !had_lock && s->lock_fd >= 0;
    KILN_CHECK_IF(rc, fail, s->lock_fd < 0, KILN_ERR_CONFLICT,
                  "'%s' is held by another running server", o->root);
    KILN_CHECK(rc, fail, reg_db_open(o->root, &db));
    {
        reg_mirror_status ms;
        rc = reg_mirror_status_read(db, &ms);
        s->mirror_of = ms.of; /* NULL: a primary */
        ms.of = NULL;
        reg_mirror_status_release(&ms);
        if (rc) {
            reg_db_close(db);
            goto fail;
        }
    }
    if (trust) {
        /* The policy in force: --trust's, walked forward through the stored versions above
         * it, each verified as the successor of the one before. */
        reg_trust_chain chain;
        uint64_t from = kiln_sign_trust_version(trust);
        rc = reg_trust_chain_load(db, o->root, trust, o->trust, NULL, NULL, &chain);
        trust = NULL; /* the chain's now */
        if (!rc) {
            kiln_sign_trust *newest = reg_trust_chain_take_newest(&chain);
            uint64_t to = kiln_sign_trust_version(newest);
            reg_trust_chain_release(&chain);
            rc = trust_swap(s, newest);
            if (!rc && to != from)
                kiln_info("registry: trust policy version %llu in force ('%s' is version %llu; "
                          "the store holds the versions after it)",
                          (unsigned long long)to, o->trust, (unsigned long long)from);
            /* A --trust of a version the store lacks is enforced here but reaches no client
             * that starts below it: clients walk stored versions only. */
            char *doc = NULL;
            size_t dlen;
            if (!rc && to == from && from > 1) {
                if (reg_trust_get(db, from, &doc, &dlen) == KILN_ERR_NOTFOUND)
                    kiln_warn("registry: '%s' is trust version %llu, which the store does not "
                              "hold: clients that trust an older version cannot walk to it "
                              "(serve from the version before it, then kiln trust put this one)",
                              o->trust, (unsigned long long)from);
                free(doc);
                kiln_errclear();
            }
        }
        if (rc) {
            reg_db_close(db);
            db = NULL;
            kiln_errprefix(rc, "cannot serve: ");
            goto fail;
        }
    }
    reg_db_close(db);
    clear_tmp(o->root);
    /* The daemon as kiln runs serve has it (web/httpd.c): the listen rule, the connection
     * limits and the header and idle timeouts are the same for both servers. */
    kiln_web_http_opts ho = {
        .listen = o->listen,
        .threads = o->threads,
        .max_connections = o->max_connections,
        .per_ip_connections = o->per_ip_connections == KILN_REGISTRY_NO_LIMIT
                                  ? KILN_WEB_HTTP_NO_LIMIT
                                  : o->per_ip_connections,
        .header_timeout_s = o->header_timeout_s,
        .idle_timeout_s = o->idle_timeout_s,
        /* room for X-Kiln-Signature: several signers' blocks, base64 */
        .memory_limit = (size_t)(4 * REG_SIG_MAX),
        .tls_cert = s->tls_cert,
        .tls_key = s->tls_key,
        .handler = handler,
        .handler_cls = s,
        .accept = accept_policy,
        .accept_cls = s,
        .completed = completed,
        .completed_cls = s,
        .on_connection = conn_notify,
        .connection_cls = s,
        .unescape = no_unescape,
        .log = mhd_log,
        .what = "registry"};
    KILN_CHECK(rc, fail, kiln_web_http_start(&ho, &s->http));
    s->port = kiln_web_http_port(s->http);
    free(lock_path);
    *out = s;
    return KILN_OK;
fail:
    if (made_lock) unlink(lock_path);
    free(lock_path);
    kiln_sign_trust_free(trust);
    kiln_registry_server_stop(s, 0);
    return rc;
}

uint16_t kiln_registry_server_port(const kiln_registry_server *s) {
    return s->port;
}

void kiln_registry_server_stop(kiln_registry_server *s, unsigned grace_ms) {
    if (!s) return;
    if (s->http) {
        atomic_store(&s->stopping, 1);
        uint64_t deadline = kiln_now_ns() + (uint64_t)grace_ms * 1000000ull;
        while (atomic_load(&s->in_flight) > 0 && kiln_now_ns() < deadline) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        kiln_web_http_stop(s->http); /* closes the listen socket */
    }
    trust_release(s, s->trust);
    kiln_sign_trust_free(s->trust_start);
    free(s->tls_cert);
    if (s->tls_key) sodium_memzero(s->tls_key, strlen(s->tls_key));
    free(s->tls_key);
    reg_unlock(s->lock_fd);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->trust_mu);
    pthread_mutex_destroy(&s->trust_put_mu);
    free(s->rows);
    free(s->root);
    free(s->mirror_of);
    free(s);
}

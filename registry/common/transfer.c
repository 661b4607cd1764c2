/* transfer.c - the registry's transfers from the calling side (libcurl): one transfer with its
 * stall and rate watches, the retry loop every request runs, the deadlines and size limits
 * every operation runs under, a download that resumes with Range, stops at the declared size
 * and follows a redirect without credentials, and a request of any method for the OCI client
 * (oci.c). What is sent where is http.c's (kiln's routes) and oci.c's (the OCI protocol). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "export.h"
#include "http_int.h"

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void) {
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

kiln_err reg_client_init(const kiln_registry_client_opts *c) {
    pthread_once(&curl_once, curl_init);
    KILN_FAIL_IF(curl_init_rc != CURLE_OK, KILN_ERR_NETWORK, "libcurl failed to initialise");
    KILN_FAIL_IF(!c || !c->url || (strncmp(c->url, "http", 4) != 0 && !reg_oci_url(c->url)),
                 KILN_ERR_USAGE,
                 "registry URL '%s' is not http://, https://, oci:// or oci+http://",
                 c && c->url ? c->url : "");
    return KILN_OK;
}

size_t reg_buf_write(char *data, size_t size, size_t n, void *ctx) {
    reg_buf *b = ctx;
    size_t add = size * n;
    if (b->len + add > b->limit) {
        b->over = true;
        return 0;
    }
    char *np = realloc(b->p, b->len + add + 1);
    if (!np) return 0;
    b->p = np;
    memcpy(b->p + b->len, data, add);
    b->len += add;
    b->p[b->len] = 0;
    return add;
}

/* The Location of an answer, for a redirect (never followed by libcurl: a redirect to
 * another host must not carry the registry's credentials). */
static void header_value(const char *line, size_t n, const char *name, char *out, size_t cap) {
    size_t k = strlen(name);
    if (n <= k || strncasecmp(line, name, k) != 0 || line[k] != ':') return;
    const char *v = line + k + 1;
    size_t m = n - k - 1;
    while (m && (*v == ' ' || *v == '\t')) {
        v++;
        m--;
    }
    while (m && (v[m - 1] == '\r' || v[m - 1] == '\n' || v[m - 1] == ' '))
        m--;
    if (m >= cap) m = cap - 1;
    memcpy(out, v, m);
    out[m] = 0;
}

static unsigned stall_ms(const kiln_registry_client_opts *c) {
    return c->stall_ms ? c->stall_ms : 60000;
}

static int xfer_progress(void *ctx, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                         curl_off_t ulnow) {
    reg_xfer *x = ctx;
    const kiln_registry_client_opts *c = x->c;
    uint64_t now = kiln_now_ns();
    if (!x->since || dlnow + ulnow != x->bytes) {
        x->bytes = dlnow + ulnow;
        x->since = now;
    } else if (x->stall && now - x->since > (uint64_t)x->stall * 1000000) {
        x->stalled = true;
        return 1; /* CURLE_ABORTED_BY_CALLBACK */
    }
    if (x->rate && x->stall) {
        if (!x->window) {
            x->window = now;
            x->window_bytes = x->bytes;
        } else if (now - x->window >= (uint64_t)x->stall * 1000000) {
            curl_off_t moved = x->bytes - x->window_bytes;
            if ((uint64_t)moved < (uint64_t)x->rate * x->stall / 1000) {
                x->slow = true;
                x->slow_bytes = moved;
                return 1;
            }
            x->window = now;
            x->window_bytes = x->bytes;
        }
    }
    if (!c->progress) return 0;
    if (ultotal > 0) return c->progress(c->progress_ctx, (uint64_t)ulnow, (uint64_t)ultotal);
    return c->progress(c->progress_ctx, (uint64_t)dlnow, (uint64_t)(dltotal > 0 ? dltotal : 0));
}

static void common_opts(CURL *h, const kiln_registry_client_opts *c, reg_xfer *x) {
    x->c = c;
    x->stall = stall_ms(c);
    x->rate = 0; /* downloads and answers watch it; an upload's answer waits on the server */
    x->bytes = 0;
    x->since = 0;
    x->window = 0;
    x->window_bytes = x->slow_bytes = 0;
    x->stalled = x->slow = false;
    x->ebuf[0] = 0;
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, x->ebuf);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "kiln/" KILN_VERSION);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    const char *ca = c->ca_file ? c->ca_file : getenv("KILN_REGISTRY_CA");
    if (ca && *ca) curl_easy_setopt(h, CURLOPT_CAINFO, ca);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, xfer_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, x);
}

/* A failed transfer's words: the stall watch's, else libcurl's own (its error buffer says
 * more than curl_easy_strerror: "Operation timed out after 5001 milliseconds ..."). */
static const char *xfer_error(const reg_xfer *x, CURLcode e, char *out, size_t cap) {
    if (x->stalled)
        snprintf(out, cap, "stalled: not a byte moved in %u ms (%lld bytes moved before)", x->stall,
                 (long long)x->bytes);
    else if (x->slow)
        snprintf(out, cap,
                 "too slow: %lld bytes in %u ms, under the minimum of %u bytes a second "
                 "(min_rate, --min-rate; %lld bytes moved in all)",
                 (long long)x->slow_bytes, x->stall, x->rate, (long long)x->bytes);
    else
        snprintf(out, cap, "%s", x->ebuf[0] ? x->ebuf : curl_easy_strerror(e));
    return out;
}

/* The server's {"error": "..."} or the body's first line. */
static void server_message(const reg_buf *b, char *out, size_t cap) {
    out[0] = 0;
    if (!b->p || !b->len) return;
    json_t *j = json_loadb(b->p, b->len, 0, NULL);
    const char *e = j ? json_string_value(json_object_get(j, "error")) : NULL;
    if (e)
        snprintf(out, cap, "%s", e);
    else
        snprintf(out, cap, "%.*s", (int)strcspn(b->p, "\r\n"), b->p);
    json_decref(j);
}

kiln_err reg_http_error(const kiln_registry_client_opts *c, const char *url, long status,
                        const reg_buf *body) {
    char msg[512];
    server_message(body, msg, sizeof msg);
    /* What to do about a 401 from kiln's registry (issue 30: it said only "HTTP 401: ..."):
     * without a token, where one goes; with one, that it was the one refused. (An OCI
     * registry's credentials come from the login files: oci.c says so itself.) */
    if (status == 401 && c && !reg_oci_url(c->url))
        return kiln_fail(KILN_ERR_AUTH, "registry '%s': HTTP 401%s%s\n%s", url, *msg ? ": " : "",
                         msg,
                         c->token && *c->token
                             ? "the token given (--token, or $KILN_REGISTRY_TOKEN) was refused: "
                               "it may be unknown, revoked or expired (kiln registry token list)"
                             : "no token was sent: give one with --token T or "
                               "$KILN_REGISTRY_TOKEN (kiln registry token create makes one)");
    kiln_err code = status == 401 || status == 403 ? KILN_ERR_AUTH
                    : status == 404                ? KILN_ERR_NOTFOUND
                    : status == 409                ? KILN_ERR_CONFLICT
                    : status == 422                ? KILN_ERR_VERIFY
                    : status == 413                ? KILN_ERR_LIMIT
                    : status == 400                ? KILN_ERR_USAGE
                    : status == 501                ? KILN_ERR_UNSUPPORTED
                                                   : KILN_ERR_NETWORK;
    return kiln_fail(code, "registry '%s': HTTP %ld%s%s", url, status, *msg ? ": " : "", msg);
}

static bool transient_curl(CURLcode e) {
    return e == CURLE_COULDNT_CONNECT || e == CURLE_RECV_ERROR || e == CURLE_SEND_ERROR ||
           e == CURLE_GOT_NOTHING || e == CURLE_PARTIAL_FILE || e == CURLE_OPERATION_TIMEDOUT ||
           e == CURLE_COULDNT_RESOLVE_HOST;
}

/* 5xx but 501 (not implemented) and 507 (the registry's disk is full). */
static bool transient_status(long status) {
    return status >= 500 && status != 501 && status != 507;
}

static void backoff(const kiln_registry_client_opts *c, int attempt) {
    unsigned ms = (c->backoff_ms ? c->backoff_ms : 250) << (attempt < 6 ? attempt : 6);
    if (c->until_ns) { /* not past the deadline: the next attempt then says it passed */
        uint64_t now = kiln_now_ns(), left = now < c->until_ns ? (c->until_ns - now) / 1000000 : 0;
        if (ms > left) ms = (unsigned)left;
    }
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int max_retries(const kiln_registry_client_opts *c) {
    return c->retries < 0 ? 4 : c->retries;
}

/* ---- limits ---- */

void reg_deadline_start(kiln_registry_client_opts *c, size_t n) {
    uint64_t now = kiln_now_ns();
    for (size_t i = 0; i < n; i++) {
        unsigned ms = c[i].deadline_ms ? c[i].deadline_ms : KILN_REGISTRY_DEADLINE_DEFAULT_MS;
        c[i].until_ns = now + (uint64_t)ms * 1000000;
    }
}

uint64_t reg_max_size(const kiln_registry_client_opts *c) {
    return c->max_size ? c->max_size : KILN_REGISTRY_MAX_SIZE_DEFAULT;
}

unsigned reg_min_rate(const kiln_registry_client_opts *c) {
    return c->min_rate ? c->min_rate : KILN_REGISTRY_MIN_RATE_DEFAULT;
}

static bool past_deadline(const kiln_registry_client_opts *c) {
    return c->until_ns && kiln_now_ns() >= c->until_ns;
}

static kiln_err deadline_fail(const kiln_registry_client_opts *c, const char *url) {
    return kiln_fail(KILN_ERR_NETWORK,
                     "registry '%s': the deadline of %u ms for the whole operation passed "
                     "(deadline_ms, --deadline)",
                     url, c->deadline_ms ? c->deadline_ms : KILN_REGISTRY_DEADLINE_DEFAULT_MS);
}

/* The milliseconds left before the operation's deadline (LONG_MAX without one); a deadline
 * passed already is the failure. */
static kiln_err time_left(const kiln_registry_client_opts *c, const char *url, long *ms) {
    *ms = LONG_MAX;
    if (!c->until_ns) return KILN_OK;
    uint64_t now = kiln_now_ns();
    if (now >= c->until_ns) return deadline_fail(c, url);
    uint64_t left = (c->until_ns - now + 999999) / 1000000;
    *ms = left < (uint64_t)LONG_MAX ? (long)left : LONG_MAX;
    return KILN_OK;
}

/* A ceiling on an archive kiln pack made from m's files: each entry (manifest.json first, then
 * every file) is a ustar header, at most a pax record with its own header (a path ustar cannot
 * split, a size of 8 GiB or more: each under 512 bytes of text) and its data padded to 512
 * bytes; then the two end blocks; zstd adds at most 3 bytes a 128 KiB block and its frame
 * (ZSTD_compressBound: n + n/256 + 128 KiB/2048 for small inputs). Taken with room to spare
 * (4 KiB an entry, n/128 + 64 KiB) so that another libarchive or libzstd stays under it too. */
static uint64_t sat_add(uint64_t a, uint64_t b) {
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t entry_bound(uint64_t size) {
    uint64_t padded = sat_add(size, 511) & ~(uint64_t)511;
    return sat_add(padded, 4096);
}

uint64_t reg_archive_bound(const kiln_manifest *m) {
    uint64_t t = sat_add(entry_bound(m->text_len), 1024);
    for (size_t i = 0; i < m->nfiles; i++)
        t = sat_add(t, entry_bound(m->files[i].size));
    return sat_add(sat_add(t, t / 128), 64 * 1024);
}

kiln_manifest *reg_signed_manifest(const json_t *ver, const char *sig, const kiln_sign_trust *t,
                                   const char *model, const char *version) {
    const json_t *man = json_object_get(ver, "manifest");
    if (!json_is_object(man) || !sig || !t) return NULL;
    char *text = kiln_json_canonical(man);
    kiln_manifest *m = NULL;
    kiln_sign_archive_report rep;
    memset(&rep, 0, sizeof rep);
    kiln_err rc =
        text ? kiln_sign_verify_manifest_sigs(text, strlen(text), "the registry's manifest", sig,
                                              strlen(sig), "signature", t, &rep)
             : KILN_ERR_NOMEM;
    if (!rc && (strcmp(rep.info.model, model) || strcmp(rep.info.version, version)))
        rc = KILN_ERR_VERIFY;
    if (!rc) rc = kiln_manifest_parse(text, strlen(text), "the registry's manifest", &m);
    /* Not established: the full check after the download says why, in its own words. */
    if (rc) {
        kiln_errclear();
        kiln_manifest_free(m);
        m = NULL;
    }
    free(text);
    return m;
}

kiln_err reg_size_accept(const kiln_registry_client_opts *c, uint64_t size, uint64_t signed_bound,
                         const char *label) {
    KILN_FAIL_IF(size > reg_max_size(c), KILN_ERR_LIMIT,
                 "registry '%s' declares %s at %" PRIu64
                 " bytes, more than this client accepts (%" PRIu64
                 " bytes: max_size, --max-size); not downloaded",
                 c->url, label, size, reg_max_size(c));
    KILN_FAIL_IF(size > signed_bound, KILN_ERR_VERIFY,
                 "registry '%s' declares %s at %" PRIu64
                 " bytes, more than an archive of its signed manifest can be (%" PRIu64
                 " bytes); refusing, not downloaded",
                 c->url, label, size, signed_bound);
    return KILN_OK;
}

/* ---- one request, with its retries: the loop every transfer runs ---- */

/* Run rq's transfers until one gets an answer that is not a transient failure (*status its
 * HTTP status, for the caller to judge), retrying connection errors, stalls, transfers too
 * slow and 5xx (but 501 and 507) with backoff, max_retries times, within the operation's
 * deadline. */
kiln_err reg_request_run(const reg_request *rq, long *status) {
    const kiln_registry_client_opts *c = rq->c;
    char why[CURL_ERROR_SIZE + 64];
    reg_xfer x;
    for (int attempt = 0;; attempt++) {
        long left;
        KILN_TRY(time_left(c, rq->url, &left));
        CURL *h = curl_easy_init();
        KILN_FAIL_IF(!h, KILN_ERR_NOMEM, "cannot create a libcurl handle");
        common_opts(h, c, &x);
        kiln_err rc = rq->setup(rq->ctx, h, &x, left);
        if (rc) {
            curl_easy_cleanup(h);
            return rc;
        }
        CURLcode e = curl_easy_perform(h);
        *status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
        curl_easy_cleanup(h);
        if (rq->check) KILN_TRY(rq->check(rq->ctx));
        if (e == CURLE_OK && !transient_status(*status)) return KILN_OK;
        if (e != CURLE_OK && past_deadline(c)) return deadline_fail(c, rq->url);
        if (attempt >= max_retries(c) ||
            (e != CURLE_OK && !transient_curl(e) && !x.stalled && !x.slow))
            return e != CURLE_OK ? kiln_fail(KILN_ERR_NETWORK, "%s: %s", rq->what,
                                             xfer_error(&x, e, why, sizeof why))
                                 : reg_http_error(c, rq->url, *status, rq->body);
        kiln_debug("%s: %s, retrying", rq->what,
                   e != CURLE_OK ? curl_easy_strerror(e) : "server error");
        backoff(c, attempt);
    }
}

/* ---- one request of any kind: the OCI client's (oci.c) ---- */

typedef struct anyreq {
    const reg_http_req *q;
    reg_http_ans *a;
    reg_buf body;
    struct curl_slist *hdr;
    FILE *f;
} anyreq;

static size_t any_header(char *line, size_t size, size_t n, void *ctx) {
    reg_http_ans *a = ctx;
    size_t len = size * n;
    if (len >= 5 && !strncmp(line, "HTTP/", 5)) { /* a new answer (after 100 Continue) */
        a->location[0] = a->www_auth[0] = a->digest[0] = a->content_type[0] = a->link[0] = 0;
        a->range[0] = 0;
        a->content_length = -1;
    }
    header_value(line, len, "Location", a->location, sizeof a->location);
    header_value(line, len, "WWW-Authenticate", a->www_auth, sizeof a->www_auth);
    header_value(line, len, "Docker-Content-Digest", a->digest, sizeof a->digest);
    header_value(line, len, "Content-Type", a->content_type, sizeof a->content_type);
    header_value(line, len, "Range", a->range, sizeof a->range);
    header_value(line, len, "Link", a->link, sizeof a->link);
    char cl[32] = "";
    header_value(line, len, "Content-Length", cl, sizeof cl);
    if (cl[0]) a->content_length = strtoll(cl, NULL, 10);
    return len;
}

typedef struct file_part {
    FILE *f;
    uint64_t left;
} file_part;

static size_t part_read(char *dst, size_t size, size_t n, void *ctx) {
    file_part *p = ctx;
    size_t want = size * n;
    if (want > p->left) want = (size_t)p->left;
    if (!want) return 0;
    size_t r = fread(dst, 1, want, p->f);
    if (r == 0 && ferror(p->f)) return CURL_READFUNC_ABORT;
    p->left -= r;
    return r;
}

typedef struct anyctx {
    anyreq *r;
    file_part part;
} anyctx;

static kiln_err any_setup(void *ctx, CURL *h, reg_xfer *x, long left) {
    anyctx *k = ctx;
    anyreq *r = k->r;
    const reg_http_req *q = r->q;
    free(r->body.p);
    memset(&r->body, 0, sizeof r->body);
    r->body.limit = q->limit ? q->limit : REG_JSON_MAX;
    memset(r->a, 0, sizeof *r->a);
    r->a->content_length = -1;
    long limit = q->timeout_ms ? q->timeout_ms : 0;
    if (!q->file) {
        x->rate = reg_min_rate(x->c);
        if (!limit) limit = x->c->timeout_ms ? (long)x->c->timeout_ms : 60000;
        if (x->stall >= (unsigned long)limit) x->stall = 0;
    }
    if (limit && limit < left) left = limit;
    if (left != LONG_MAX) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, left);
    curl_easy_setopt(h, CURLOPT_URL, q->url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, r->hdr);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, reg_buf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r->body);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, any_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r->a);
    if (!strcmp(q->method, "HEAD")) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (q->file) {
        KILN_FAIL_IF(fseeko(r->f, (off_t)q->file_off, SEEK_SET) != 0, KILN_ERR_IO,
                     "cannot seek '%s'", q->file);
        k->part.f = r->f;
        k->part.left = q->file_len;
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, q->method);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, part_read);
        curl_easy_setopt(h, CURLOPT_READDATA, &k->part);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)q->file_len);
    } else if (strcmp(q->method, "GET")) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, q->method);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, q->body ? q->body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(q->body ? q->body_len : 0));
    }
    return KILN_OK;
}

static kiln_err any_check(void *ctx) {
    anyctx *k = ctx;
    KILN_FAIL_IF(k->r->body.over, KILN_ERR_LIMIT, "registry '%s': answer larger than %zu bytes",
                 k->r->q->url, k->r->body.limit);
    return KILN_OK;
}

kiln_err reg_http_do(const kiln_registry_client_opts *c, const reg_http_req *q, reg_http_ans *a) {
    memset(a, 0, sizeof *a);
    KILN_TRY(reg_client_init(c));
    anyreq r = {.q = q, .a = a};
    anyctx k = {.r = &r};
    kiln_err rc = KILN_OK;
    char *what = kiln_asprintf("registry '%s'", q->url);
    KILN_CHECK_IF(rc, out, !what, KILN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < q->nheaders; i++) {
        struct curl_slist *n = curl_slist_append(r.hdr, q->headers[i]);
        KILN_CHECK_IF(rc, out, !n, KILN_ERR_NOMEM, "out of memory");
        r.hdr = n;
    }
    /* No "Expect: 100-continue": some registries never answer it and a PUT waits a second. */
    struct curl_slist *n = curl_slist_append(r.hdr, "Expect:");
    KILN_CHECK_IF(rc, out, !n, KILN_ERR_NOMEM, "out of memory");
    r.hdr = n;
    if (q->file) {
        r.f = fopen(q->file, "rb");
        KILN_CHECK_IF(rc, out, !r.f, KILN_ERR_IO, "cannot open '%s'", q->file);
    }
    kiln_registry_client_opts once = *c;
    if (q->once) once.retries = 0;
    reg_request rq = {.c = &once,
                      .url = q->url,
                      .what = what,
                      .setup = any_setup,
                      .check = any_check,
                      .body = &r.body,
                      .ctx = &k};
    long status = 0;
    KILN_CHECK(rc, out, reg_request_run(&rq, &status));
    a->status = status;
    a->body = r.body.p;
    a->len = r.body.len;
    r.body.p = NULL;
out:
    if (r.f) fclose(r.f);
    curl_slist_free_all(r.hdr);
    free(r.body.p);
    free(what);
    if (rc) reg_http_ans_release(a);
    return rc;
}

void reg_http_ans_release(reg_http_ans *a) {
    if (!a) return;
    free(a->body);
    a->body = NULL;
    a->len = 0;
}

kiln_err reg_http_fail(const char *url, long status, const char *body, size_t len) {
    reg_buf b = {.p = (char *)body, .len = len};
    return reg_http_error(NULL, url, status, &b);
}

/* ---- download ---- */

typedef struct dl {
    int fd;
    uint64_t have, size;
    long status;
    bool checked, too_much, restarted;
    bool complete; /* the partial held it all before a transfer */
    bool bad;      /* what the partial holds is not to be resumed: removed */
    CURL *h;
    reg_buf err;
    kiln_err werr;
    const char *url, *partial;
    struct curl_slist *hdr;
    reg_follow *follow;  /* a reader of the partial as it grows (pullstream.c), or NULL */
    char location[4096]; /* a redirect's target (an OCI registry's object storage) */
} dl;

static size_t dl_header(char *line, size_t size, size_t n, void *ctx) {
    dl *d = ctx;
    header_value(line, size * n, "Location", d->location, sizeof d->location);
    return size * n;
}

static size_t dl_write(char *data, size_t size, size_t n, void *ctx) {
    dl *d = ctx;
    size_t len = size * n;
    if (!d->checked) {
        d->checked = true;
        curl_easy_getinfo(d->h, CURLINFO_RESPONSE_CODE, &d->status);
        if (d->status == 200 && d->have) { /* the server ignored the range: start over */
            reg_follow_reset(d->follow);
            if (ftruncate(d->fd, 0) != 0 || lseek(d->fd, 0, SEEK_SET) != 0) return 0;
            d->have = 0;
            d->restarted = true;
        }
    }
    if (d->status != 200 && d->status != 206) return reg_buf_write(data, size, n, &d->err);
    /* Never more than declared: a server that sends more is cut off here. */
    if (d->have + len > d->size) {
        d->too_much = true;
        return 0;
    }
    const char *p = data;
    size_t left = len;
    while (left) {
        ssize_t w = write(d->fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            d->werr = KILN_ERR_IO;
            return 0;
        }
        p += w;
        left -= (size_t)w;
    }
    d->have += len;
    reg_follow_grow(d->follow, d->have);
    return len;
}

/* Each attempt resumes from what the partial file holds (Range), or, complete, ends the
 * request with d->complete set. */
static kiln_err dl_setup(void *ctx, CURL *h, reg_xfer *x, long left) {
    dl *d = ctx;
    struct stat sb;
    KILN_FAIL_IF(fstat(d->fd, &sb) != 0, KILN_ERR_IO, "cannot stat '%s'", d->partial);
    d->have = (uint64_t)sb.st_size;
    if (d->have > d->size) {
        reg_follow_reset(d->follow);
        KILN_FAIL_IF(ftruncate(d->fd, 0) != 0, KILN_ERR_IO, "cannot truncate '%s'", d->partial);
        d->have = 0;
    }
    reg_follow_grow(d->follow, d->have); /* what a killed pull left is read first */
    d->complete = d->have == d->size;
    if (d->complete) return KILN_ERR_INTERRUPTED; /* no transfer: done (reg_download) */
    KILN_FAIL_IF(lseek(d->fd, (off_t)d->have, SEEK_SET) < 0, KILN_ERR_IO, "cannot seek '%s'",
                 d->partial);
    d->h = h;
    d->checked = false;
    d->status = 0;
    d->location[0] = 0;
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, dl_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, d);
    free(d->err.p);
    d->err.p = NULL;
    d->err.len = 0;
    x->rate = reg_min_rate(x->c);
    /* No deadline of its own (an archive may be large), but the operation's. */
    if (left != LONG_MAX) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, left);
    curl_easy_setopt(h, CURLOPT_URL, d->url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, d->hdr);
    char range[64];
    snprintf(range, sizeof range, "%" PRIu64 "-", d->have);
    if (d->have) curl_easy_setopt(h, CURLOPT_RANGE, range); /* copied by libcurl */
    /* 512 KiB a callback (libcurl's default is 16 KiB): fewer write() calls. */
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L * 1024);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, dl_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, d);
    return KILN_OK;
}

static kiln_err dl_check(void *ctx) {
    dl *d = ctx;
    d->h = NULL;
    if (d->too_much) { /* a registry that lies about the size: nothing it sent is kept */
        d->bad = true;
        return kiln_fail(KILN_ERR_VERIFY,
                         "registry '%s' sent more than the declared %" PRIu64 " bytes; cut off",
                         d->url, d->size);
    }
    KILN_FAIL_IF(d->werr, KILN_ERR_IO, "cannot write '%s'", d->partial);
    return KILN_OK;
}

/* A redirect's target made absolute against the URL that answered it (a registry may answer
 * a path); caller frees. */
static char *resolve_location(const char *base, const char *loc) {
    if (strstr(loc, "://")) return kiln_strdup(loc);
    const char *host = strstr(base, "://");
    const char *end = host ? strchr(host + 3, '/') : NULL;
    size_t n = end ? (size_t)(end - base) : strlen(base);
    return loc[0] == '/' ? kiln_asprintf("%.*s%s", (int)n, base, loc) : NULL;
}

static bool redirect_status(long s) {
    return s == 301 || s == 302 || s == 303 || s == 307 || s == 308;
}

kiln_err reg_download_url(const kiln_registry_client_opts *c, const char *reg_url, const char *auth,
                          const char *hex, uint64_t size, const char *partial, reg_follow *follow) {
    char *url = kiln_strdup(reg_url), *what = url ? kiln_asprintf("downloading '%s'", url) : NULL;
    if (!what) {
        free(url);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    char label[100];
    snprintf(label, sizeof label, "blob sha256:%.12s...", hex);
    dl d = {.fd = -1, .size = size, .url = url, .partial = partial, .follow = follow};
    d.err.limit = 64 * 1024;
    kiln_err rc = reg_size_accept(c, size, UINT64_MAX, label);
    if (!rc) {
        d.fd = open(partial, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (d.fd < 0) rc = kiln_fail_errno(KILN_ERR_IO, "cannot open '%s'", partial);
    }
    struct curl_slist *reg_hdr = NULL;
    if (!rc && auth) {
        reg_hdr = curl_slist_append(NULL, auth);
        if (!reg_hdr) rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    d.hdr = reg_hdr;
    long status = 0;
    /* A registry may send the download elsewhere (object storage, with a signed URL that
     * expires): followed here, without the registry's credentials, and resumed there with
     * Range; a target that stops answering (expired) is asked of the registry again. */
    int redirects = 0, expiries = 0;
    while (!rc) {
        reg_request rq = {.c = c,
                          .url = d.url,
                          .what = what,
                          .setup = dl_setup,
                          .check = dl_check,
                          .body = &d.err,
                          .ctx = &d};
        rc = reg_request_run(&rq, &status);
        if (rc == KILN_ERR_INTERRUPTED && d.complete) { /* the partial holds it all */
            kiln_errclear();
            rc = KILN_OK;
            status = 206;
            d.have = size;
        }
        if (rc) break;
        if (redirect_status(status) && d.location[0]) {
            char *to = resolve_location(d.url, d.location);
            KILN_CHECK_IF(rc, out, !to, KILN_ERR_NETWORK,
                          "registry '%s' redirected the download to '%s', not a URL", reg_url,
                          d.location);
            KILN_CHECK_IF(rc, out, ++redirects > 5, KILN_ERR_NETWORK,
                          "downloading '%s': more than 5 redirects", reg_url);
            if (strncmp(to, "http://", 7) && strncmp(to, "https://", 8)) {
                rc = kiln_fail(KILN_ERR_NETWORK,
                               "registry '%s' redirected the download to '%s', not http(s)",
                               reg_url, to);
                free(to);
                break;
            }
            if (d.url != url) free((char *)d.url);
            d.url = to;
            d.hdr = NULL; /* never the registry's credentials to another host */
            continue;
        }
        if (d.url != url && status >= 400 && status < 500 && expiries++ < 3) {
            free((char *)d.url); /* an expired signed URL: the registry resolves it again */
            d.url = url;
            d.hdr = reg_hdr;
            redirects = 0;
            continue;
        }
        break;
    }
    if (!rc && status != 200 && status != 206) rc = reg_http_error(c, d.url, status, &d.err);
    if (!rc && d.have != size) {
        d.bad = true;
        rc = kiln_fail(KILN_ERR_VERIFY,
                       "registry '%s' sent %" PRIu64 " bytes, %" PRIu64 " were declared", url,
                       d.have, size);
    }
    /* No fsync: the partial file is hashed in full before anything uses it, and a prefix torn
     * by a crash fails that check and is fetched again from the start; the unpacked files
     * are what pull makes durable. (Its fsync was 0.45 s of a 1 GiB pull.) */
out:
    if (d.fd >= 0) close(d.fd);
    reg_follow_end(follow, !rc && d.have == size);
    if (d.bad) unlink(partial);
    curl_slist_free_all(reg_hdr);
    if (d.url != url) free((char *)d.url);
    free(d.err.p);
    free(what);
    free(url);
    return rc;
}

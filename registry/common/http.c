/* http.c - the registry's HTTP API from the calling side (libcurl), for a client and for a
 * mirror syncing from its primary: JSON reads, channel records, publish with
 * retries, downloads that resume with Range and stop at the declared size; the deadlines and
 * size limits every operation runs under. The pull that uses them is the client's
 * (client/client.c). */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "export.h"
#include "registry_common.h"

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void) {
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

kiln_err reg_client_init(const kiln_registry_client_opts *c) {
    pthread_once(&curl_once, curl_init);
    KILN_FAIL_IF(curl_init_rc != CURLE_OK, KILN_ERR_NETWORK, "libcurl failed to initialise");
    KILN_FAIL_IF(!c || !c->url || strncmp(c->url, "http", 4) != 0, KILN_ERR_USAGE,
                 "registry URL '%s' is not http:// or https://", c && c->url ? c->url : "");
    return KILN_OK;
}

/* A growing buffer that refuses to grow past its limit. */
typedef struct buf {
    char *p;
    size_t len, limit;
    bool over;
} buf;

static size_t buf_write(char *data, size_t size, size_t n, void *ctx) {
    buf *b = ctx;
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

static char *url_for(const kiln_registry_client_opts *c, const char *path) {
    size_t n = strlen(c->url);
    while (n && c->url[n - 1] == '/')
        n--;
    return kiln_asprintf("%.*s%s", (int)n, c->url, path);
}

static kiln_err auth_header(const kiln_registry_client_opts *c, struct curl_slist **h) {
    if (!c->token) return KILN_OK;
    char *a = kiln_asprintf("Authorization: Bearer %s", c->token);
    if (!a) return KILN_ERR_NOMEM;
    struct curl_slist *n = curl_slist_append(*h, a);
    sodium_memzero(a, strlen(a));
    free(a);
    KILN_FAIL_IF(!n, KILN_ERR_NOMEM, "out of memory");
    *h = n;
    return KILN_OK;
}

/* One transfer: the caller's progress bar, the stall watch and the rate watch. A transfer
 * that moves no byte either way for stall_ms (0: 60 s), counted from the last byte, is a dead
 * connection; one that moves fewer than min_rate bytes a second over a window of stall_ms
 * is a registry trickling (a byte a second never stalls). (libcurl's own low-speed check
 * averages the speed over its last five seconds, so a burst then silence was cut off 5-6 s
 * after the limit: measured 7.2 s for a 1 s limit.) */
typedef struct xfer {
    const kiln_registry_client_opts *c;
    unsigned stall;   /* ms; 0: not watched (a deadline that comes first governs) */
    unsigned rate;    /* bytes a second over each window of stall ms; 0: not watched */
    curl_off_t bytes; /* up and down so far */
    uint64_t since;   /* when bytes last changed (ns); 0 before the first call */
    uint64_t window;  /* when the rate window began (ns) */
    curl_off_t window_bytes, slow_bytes; /* bytes at its start; moved in the window cut off */
    bool stalled, slow;
    char ebuf[CURL_ERROR_SIZE]; /* libcurl's own words for a failure */
} xfer;

static unsigned stall_ms(const kiln_registry_client_opts *c) {
    return c->stall_ms ? c->stall_ms : 60000;
}

static int xfer_progress(void *ctx, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                         curl_off_t ulnow) {
    xfer *x = ctx;
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

static void common_opts(CURL *h, const kiln_registry_client_opts *c, xfer *x) {
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
static const char *xfer_error(const xfer *x, CURLcode e, char *out, size_t cap) {
    if (x->stalled)
        snprintf(out, cap, "stalled: not a byte moved in %u ms (%lld bytes moved before)",
                 x->stall, (long long)x->bytes);
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
static void server_message(const buf *b, char *out, size_t cap) {
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

static kiln_err http_error(const char *url, long status, const buf *body) {
    char msg[512];
    server_message(body, msg, sizeof msg);
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

static unsigned min_rate(const kiln_registry_client_opts *c) {
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

/* What a request does beyond the loop's own: its transfer's options and what to make of it. */
typedef struct request {
    const kiln_registry_client_opts *c;
    const char *url;  /* named by http_error */
    const char *what; /* how a transfer failure begins: "registry 'URL'", "downloading 'URL'" */
    /* Set up handle h for one attempt, after common_opts (URL, headers, callbacks, x->rate,
     * timeouts; left_ms: what the operation has left, LONG_MAX without a deadline). A failure
     * ends the request. */
    kiln_err (*setup)(void *ctx, CURL *h, xfer *x, long left_ms);
    /* After each transfer (NULL: nothing): what its callbacks found that ends the request
     * whatever libcurl says (an answer over its limit, a registry sending more than
     * declared, a write error). */
    kiln_err (*check)(void *ctx);
    const buf *body; /* the answer's body, as the last transfer left it (http_error's words) */
    void *ctx;
} request;

/* Run rq's transfers until one gets an answer that is not a transient failure (*status its
 * HTTP status, for the caller to judge), retrying connection errors, stalls, transfers too
 * slow and 5xx (but 501 and 507) with backoff, max_retries times, within the operation's
 * deadline. */
static kiln_err request_run(const request *rq, long *status) {
    const kiln_registry_client_opts *c = rq->c;
    char why[CURL_ERROR_SIZE + 64];
    xfer x;
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
                                 : http_error(rq->url, *status, rq->body);
        kiln_debug("%s: %s, retrying", rq->what,
                   e != CURLE_OK ? curl_easy_strerror(e) : "server error");
        backoff(c, attempt);
    }
}

/* ---- small requests ---- */

typedef struct small {
    const char *url, *method, *body;
    size_t body_len, limit;
    long timeout_ms;
    struct curl_slist *hdr;
    buf *out;
} small;

static kiln_err small_setup(void *ctx, CURL *h, xfer *x, long left) {
    small *q = ctx;
    free(q->out->p);
    memset(q->out, 0, sizeof *q->out);
    q->out->limit = q->limit;
    x->rate = min_rate(x->c);
    if (x->stall >= (unsigned long)q->timeout_ms) x->stall = 0;
    /* The stall detection alone lets a registry that sends a byte a second hold a pull (or a
     * kiln_watch poll) for days: a small answer has a deadline, and so has the operation it
     * is part of. */
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, q->timeout_ms < left ? q->timeout_ms : left);
    curl_easy_setopt(h, CURLOPT_URL, q->url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, q->hdr);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, buf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, q->out);
    if (q->body) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, q->method);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, q->body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
    }
    return KILN_OK;
}

static kiln_err small_check(void *ctx) {
    small *q = ctx;
    KILN_FAIL_IF(q->out->over, KILN_ERR_LIMIT, "registry '%s': answer larger than %zu bytes",
                 q->url, q->limit);
    return KILN_OK;
}

/* GET or PUT (small body) path, body into *out (limit bytes), with retries. *status set. */
static kiln_err simple_request(const kiln_registry_client_opts *c, const char *method,
                               const char *path, const char *body, size_t body_len, size_t limit,
                               buf *out, long *status) {
    memset(out, 0, sizeof *out);
    *status = 0;
    KILN_TRY(reg_client_init(c));
    char *url = url_for(c, path), *what = url ? kiln_asprintf("registry '%s'", url) : NULL;
    small q = {.url = url,
               .method = method,
               .body = body,
               .body_len = body_len,
               .limit = limit,
               .timeout_ms =
                   c->timeout_ms ? (long)c->timeout_ms : (long)(60000 + (limit / 16384) * 1000),
               .out = out};
    kiln_err rc = what ? auth_header(c, &q.hdr) : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!rc && body) {
        struct curl_slist *n = curl_slist_append(q.hdr, "Content-Type: application/json");
        if (n)
            q.hdr = n;
        else
            rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    if (!rc) {
        request rq = {.c = c,
                      .url = url,
                      .what = what,
                      .setup = small_setup,
                      .check = small_check,
                      .body = out,
                      .ctx = &q};
        rc = request_run(&rq, status);
    }
    if (!rc && (*status < 200 || *status >= 300)) rc = http_error(url, *status, out);
    curl_slist_free_all(q.hdr);
    if (rc) {
        free(out->p);
        memset(out, 0, sizeof *out);
    }
    free(what);
    free(url);
    return rc;
}

kiln_err kiln_registry_get_json(const kiln_registry_client_opts *c, const char *path, json_t **j) {
    *j = NULL;
    buf b;
    long status;
    KILN_TRY(simple_request(c, "GET", path, NULL, 0, REG_JSON_MAX, &b, &status));
    kiln_err rc = kiln_json_parse(b.p ? b.p : "", b.len, path, j);
    free(b.p);
    return rc;
}

kiln_err kiln_registry_get_channel(const kiln_registry_client_opts *c, const char *model,
                                   const char *channel, char **record, size_t *len) {
    *record = NULL;
    *len = 0;
    KILN_TRY(kiln_registry_check_name("model", model));
    KILN_TRY(kiln_registry_check_name("channel", channel));
    char *path = kiln_asprintf("/v1/models/%s/channels/%s", model, channel);
    if (!path) return KILN_ERR_NOMEM;
    buf b;
    long status;
    kiln_err rc = simple_request(c, "GET", path, NULL, 0, REG_RECORD_MAX, &b, &status);
    free(path);
    if (rc) return rc;
    *record = b.p ? b.p : kiln_strdup("");
    *len = b.len;
    return *record ? KILN_OK : KILN_ERR_NOMEM;
}

kiln_err kiln_registry_put_channel(const kiln_registry_client_opts *c, const char *model,
                                   const char *channel, const char *record, size_t len) {
    KILN_TRY(kiln_registry_check_name("model", model));
    KILN_TRY(kiln_registry_check_name("channel", channel));
    char *path = kiln_asprintf("/v1/models/%s/channels/%s", model, channel);
    if (!path) return KILN_ERR_NOMEM;
    buf b;
    long status;
    /* No retries: a record that landed before a lost answer would be refused as a replay. */
    kiln_registry_client_opts once = *c;
    once.retries = 0;
    kiln_err rc = simple_request(&once, "PUT", path, record, len, REG_JSON_MAX, &b, &status);
    free(path);
    free(b.p);
    return rc;
}

kiln_err reg_get_text(const kiln_registry_client_opts *c, const char *path, size_t limit,
                      char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    buf b;
    long status;
    KILN_TRY(simple_request(c, "GET", path, NULL, 0, limit, &b, &status));
    *text = b.p ? b.p : kiln_strdup("");
    *len = b.len;
    return *text ? KILN_OK : KILN_ERR_NOMEM;
}

kiln_err reg_put_text(const kiln_registry_client_opts *c, const char *path, const char *body,
                      size_t len, json_t **answer) {
    if (answer) *answer = NULL;
    buf b;
    long status;
    /* No retries: a document that landed before a lost answer would be refused as a replay. */
    kiln_registry_client_opts once = *c;
    once.retries = 0;
    KILN_TRY(simple_request(&once, "PUT", path, body, len, REG_JSON_MAX, &b, &status));
    kiln_err rc = KILN_OK;
    if (answer) rc = kiln_json_parse(b.p ? b.p : "", b.len, path, answer);
    free(b.p);
    return rc;
}

/* ---- publish ---- */

static size_t file_read(char *dst, size_t size, size_t n, void *ctx) {
    size_t r = fread(dst, 1, size * n, (FILE *)ctx);
    return r == 0 && ferror((FILE *)ctx) ? CURL_READFUNC_ABORT : r;
}

typedef struct upload {
    FILE *f;
    const char *archive, *url;
    struct curl_slist *hdr;
    curl_off_t size;
    buf *body;
} upload;

/* Each attempt sends the archive from its start. */
static kiln_err upload_setup(void *ctx, CURL *h, xfer *x, long left) {
    upload *u = ctx;
    (void)x;
    KILN_FAIL_IF(fseeko(u->f, 0, SEEK_SET) != 0, KILN_ERR_IO, "cannot rewind '%s'", u->archive);
    free(u->body->p);
    memset(u->body, 0, sizeof *u->body);
    u->body->limit = REG_JSON_MAX;
    curl_easy_setopt(h, CURLOPT_URL, u->url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, u->hdr);
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, file_read);
    curl_easy_setopt(h, CURLOPT_READDATA, u->f);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, u->size);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, buf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, u->body);
    if (left != LONG_MAX) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, left);
    return KILN_OK;
}

kiln_err kiln_registry_publish(const kiln_registry_client_opts *c_in, const char *archive,
                               const char *sig_path, kiln_registry_published *out) {
    memset(out, 0, sizeof *out);
    KILN_TRY(reg_client_init(c_in));
    /* A publish is an operation of its own: every attempt within its deadline. (No minimum
     * rate: after the last byte the answer waits on the server's checks; the stall watch
     * bounds that.) */
    kiln_registry_client_opts one = *c_in;
    if (!one.until_ns) reg_deadline_start(&one, 1);
    const kiln_registry_client_opts *c = &one;
    kiln_err rc = KILN_OK;
    char *sigp = NULL, *sig = NULL, *b64 = NULL, *path = NULL, *url = NULL, *hd = NULL, *hs = NULL,
         *what = NULL;
    size_t sig_len = 0;
    FILE *f = NULL;
    struct curl_slist *hdr = NULL;
    buf body = {0};
    reg_archive_meta m;
    memset(&m, 0, sizeof m);
    uint8_t digest[KILN_SHA256_BYTES];
    char hex[KILN_SHA256_HEX];

    sigp = sig_path ? kiln_strdup(sig_path) : kiln_asprintf("%s.minisig", archive);
    KILN_CHECK_IF(rc, out, !sigp, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_read_file(sigp, REG_SIG_MAX, &sig, &sig_len));
    /* The server would refuse a malformed signature file too, but only naming its header:
     * parse it here first, so that the message names the file and nothing is uploaded. */
    {
        kiln_sign_sig *sigs = NULL;
        size_t nsigs = 0;
        KILN_CHECK(rc, out, kiln_sign_archive_sigs_parse(sig, sig_len, sigp, &sigs, &nsigs));
        kiln_sign_archive_sigs_free(sigs, nsigs);
    }
    KILN_CHECK(rc, out, reg_archive_meta_read(archive, &m));
    KILN_CHECK(rc, out, kiln_sha256_file(archive, digest));
    kiln_hex(digest, sizeof digest, hex);
    f = fopen(archive, "rb");
    KILN_CHECK_IF(rc, out, !f, KILN_ERR_IO, "cannot open '%s'", archive);
    struct stat sb;
    KILN_CHECK_IF(rc, out, fstat(fileno(f), &sb) != 0, KILN_ERR_IO, "cannot stat '%s'", archive);
    size_t b64_len = sodium_base64_ENCODED_LEN(sig_len, sodium_base64_VARIANT_ORIGINAL);
    b64 = kiln_malloc(b64_len);
    KILN_CHECK_IF(rc, out, !b64, KILN_ERR_NOMEM, "out of memory");
    sodium_bin2base64(b64, b64_len, (const unsigned char *)sig, sig_len,
                      sodium_base64_VARIANT_ORIGINAL);
    path = kiln_asprintf("/v1/models/%s/versions/%s", m.name, m.version);
    url = path ? url_for(c, path) : NULL;
    hd = kiln_asprintf("X-Kiln-Digest: sha256:%s", hex);
    hs = kiln_asprintf("X-Kiln-Signature: %s", b64);
    KILN_CHECK_IF(rc, out, !url || !hd || !hs, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, auth_header(c, &hdr));
    const char *extra[] = {hd, hs, "Content-Type: application/octet-stream"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(extra); i++) {
        struct curl_slist *n = curl_slist_append(hdr, extra[i]);
        KILN_CHECK_IF(rc, out, !n, KILN_ERR_NOMEM, "out of memory");
        hdr = n;
    }
    long status = 0;
    upload up = {.f = f,
                 .archive = archive,
                 .url = url,
                 .hdr = hdr,
                 .size = (curl_off_t)sb.st_size,
                 .body = &body};
    what = kiln_asprintf("publishing '%s' to '%s'", archive, url);
    KILN_CHECK_IF(rc, out, !what, KILN_ERR_NOMEM, "out of memory");
    request rq = {
        .c = c, .url = url, .what = what, .setup = upload_setup, .body = &body, .ctx = &up};
    KILN_CHECK(rc, out, request_run(&rq, &status));
    if (status != 200 && status != 201) {
        rc = http_error(url, status, &body);
        goto out;
    }
    json_t *j = json_loadb(body.p ? body.p : "", body.len, 0, NULL);
    const char *d = json_string_value(json_object_get(j, "digest"));
    char want[80];
    snprintf(want, sizeof want, "sha256:%s", hex);
    if (!d || strcmp(d, want) != 0) {
        rc = kiln_fail(KILN_ERR_VERIFY, "registry '%s' stored '%s' as %s, not %s", url, archive,
                       d ? d : "(none)", want);
        json_decref(j);
        goto out;
    }
    json_decref(j);
    snprintf(out->digest, sizeof out->digest, "sha256:%s", hex);
    out->size = (uint64_t)sb.st_size;
    out->existed = status == 200;
out:
    curl_slist_free_all(hdr);
    if (f) fclose(f);
    reg_archive_meta_release(&m);
    free(body.p);
    free(sigp);
    free(sig);
    free(b64);
    free(path);
    free(url);
    free(hd);
    free(hs);
    free(what);
    return rc;
}

char *kiln_registry_data_comment(const char *name, const char *hex) {
    return reg_dataset_comment(name, hex);
}

kiln_err kiln_registry_data_publish(const kiln_registry_client_opts *c_in, const char *path,
                                    const char *name, const char *sig, size_t sig_len,
                                    kiln_registry_published *out) {
    memset(out, 0, sizeof *out);
    KILN_TRY(kiln_registry_check_name("dataset", name));
    KILN_TRY(reg_client_init(c_in));
    kiln_registry_client_opts one = *c_in;
    if (!one.until_ns) reg_deadline_start(&one, 1);
    const kiln_registry_client_opts *c = &one;
    kiln_err rc = KILN_OK;
    char *b64 = NULL, *upath = NULL, *url = NULL, *hs = NULL, *what = NULL;
    FILE *f = NULL;
    struct curl_slist *hdr = NULL;
    buf body = {0};
    uint8_t digest[KILN_SHA256_BYTES];
    char hex[KILN_SHA256_HEX];
    KILN_CHECK(rc, out, kiln_sha256_file(path, digest));
    kiln_hex(digest, sizeof digest, hex);
    f = fopen(path, "rb");
    KILN_CHECK_IF(rc, out, !f, KILN_ERR_IO, "cannot open '%s'", path);
    struct stat sb;
    KILN_CHECK_IF(rc, out, fstat(fileno(f), &sb) != 0, KILN_ERR_IO, "cannot stat '%s'", path);
    size_t b64_len = sodium_base64_ENCODED_LEN(sig_len, sodium_base64_VARIANT_ORIGINAL);
    b64 = kiln_malloc(b64_len);
    KILN_CHECK_IF(rc, out, !b64, KILN_ERR_NOMEM, "out of memory");
    sodium_bin2base64(b64, b64_len, (const unsigned char *)sig, sig_len,
                      sodium_base64_VARIANT_ORIGINAL);
    upath = kiln_asprintf("/v1/datasets/%s/sha256/%s", name, hex);
    url = upath ? url_for(c, upath) : NULL;
    hs = kiln_asprintf("X-Kiln-Signature: %s", b64);
    KILN_CHECK_IF(rc, out, !url || !hs, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, auth_header(c, &hdr));
    const char *extra[] = {hs, "Content-Type: application/octet-stream"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(extra); i++) {
        struct curl_slist *n = curl_slist_append(hdr, extra[i]);
        KILN_CHECK_IF(rc, out, !n, KILN_ERR_NOMEM, "out of memory");
        hdr = n;
    }
    long status = 0;
    upload up = {.f = f,
                 .archive = path,
                 .url = url,
                 .hdr = hdr,
                 .size = (curl_off_t)sb.st_size,
                 .body = &body};
    what = kiln_asprintf("publishing dataset '%s' to '%s'", path, url);
    KILN_CHECK_IF(rc, out, !what, KILN_ERR_NOMEM, "out of memory");
    request rq = {
        .c = c, .url = url, .what = what, .setup = upload_setup, .body = &body, .ctx = &up};
    KILN_CHECK(rc, out, request_run(&rq, &status));
    if (status != 200 && status != 201) {
        rc = http_error(url, status, &body);
        goto out;
    }
    snprintf(out->digest, sizeof out->digest, "sha256:%s", hex);
    out->size = (uint64_t)sb.st_size;
    out->existed = status == 200;
out:
    curl_slist_free_all(hdr);
    if (f) fclose(f);
    free(body.p);
    free(b64);
    free(upath);
    free(url);
    free(hs);
    free(what);
    return rc;
}

kiln_err kiln_registry_repro_sign(const kiln_sign_seckey *sk, const char *model,
                                  const char *version, const char *digest,
                                  const char *dataset_sha256, const char *host, int64_t when,
                                  bool identical, char **text, char **sig) {
    *text = *sig = NULL;
    char t[21];
    kiln_format_time(when, t);
    const char *verdict = identical ? "identical" : "different";
    json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s}", "format", REG_REPRO_FORMAT,
                          "model", model, "version", version, "digest", digest, "dataset_sha256",
                          dataset_sha256, "code_version", kiln_version(), "host", host, "time", t,
                          "verdict", verdict);
    char *canon = j ? kiln_json_canonical(j) : NULL;
    json_decref(j);
    char *tc = kiln_asprintf("%s\tdigest:%s\tverdict:%s", REG_REPRO_FORMAT, digest, verdict);
    kiln_err rc = canon && tc ? kiln_sign_buffer(sk, canon, strlen(canon), tc, KILN_SIGN_PREHASHED,
                                                 sig)
                              : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    free(tc);
    if (rc) {
        free(canon);
        return rc;
    }
    *text = canon;
    return KILN_OK;
}

char *kiln_registry_repro_doc(const char *text, const char *sig) {
    json_t *j = json_pack("{s:s,s:s}", "record", text, "signature", sig);
    char *s = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    return s;
}

kiln_err kiln_registry_repro_put(const kiln_registry_client_opts *c, const char *model,
                                 const char *version, const char *doc) {
    KILN_TRY(reg_client_init(c));
    char *path = kiln_asprintf("/v1/models/%s/versions/%s/reproductions", model, version);
    KILN_FAIL_IF(!path, KILN_ERR_NOMEM, "out of memory");
    kiln_err rc = reg_put_text(c, path, doc, strlen(doc), NULL);
    free(path);
    return rc;
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
    buf err;
    kiln_err werr;
    const char *url, *partial;
    struct curl_slist *hdr;
    reg_follow *follow; /* a reader of the partial as it grows (stream.c), or NULL */
} dl;

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
    if (d->status != 200 && d->status != 206) return buf_write(data, size, n, &d->err);
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
static kiln_err dl_setup(void *ctx, CURL *h, xfer *x, long left) {
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
    free(d->err.p);
    d->err.p = NULL;
    d->err.len = 0;
    x->rate = min_rate(x->c);
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

kiln_err reg_download(const kiln_registry_client_opts *c, const char *hex, uint64_t size,
                      const char *partial) {
    return reg_download_follow(c, hex, size, partial, NULL);
}

kiln_err reg_download_follow(const kiln_registry_client_opts *c, const char *hex, uint64_t size,
                             const char *partial, reg_follow *follow) {
    char *path = kiln_asprintf("/v1/blobs/sha256/%s", hex), *url = path ? url_for(c, path) : NULL,
         *what = url ? kiln_asprintf("downloading '%s'", url) : NULL;
    free(path);
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
    if (!rc) rc = auth_header(c, &d.hdr);
    long status = 0;
    if (!rc) {
        request rq = {.c = c,
                      .url = url,
                      .what = what,
                      .setup = dl_setup,
                      .check = dl_check,
                      .body = &d.err,
                      .ctx = &d};
        rc = request_run(&rq, &status);
        if (rc == KILN_ERR_INTERRUPTED && d.complete) { /* the partial holds it all */
            kiln_errclear();
            rc = KILN_OK;
            status = 206;
            d.have = size;
        }
    }
    if (!rc && status != 200 && status != 206) rc = http_error(url, status, &d.err);
    if (!rc && d.have != size) {
        d.bad = true;
        rc = kiln_fail(KILN_ERR_VERIFY,
                       "registry '%s' sent %" PRIu64 " bytes, %" PRIu64 " were declared", url,
                       d.have, size);
    }
    /* No fsync: the partial file is hashed in full before anything uses it, and a prefix torn
     * by a crash fails that check and is fetched again from the start; the unpacked files
     * are what pull makes durable. (Its fsync was 0.45 s of a 1 GiB pull.) */
    if (d.fd >= 0) close(d.fd);
    reg_follow_end(follow, !rc && d.have == size);
    if (d.bad) unlink(partial);
    curl_slist_free_all(d.hdr);
    free(d.err.p);
    free(what);
    free(url);
    return rc;
}

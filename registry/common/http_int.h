/* http_int.h - the transfer machinery of registry/common (transfer.c) shared by the HTTP API's
 * calls (http.c) and the OCI client (oci.c): one libcurl transfer with the stall and rate
 * watches, the retry loop every request runs, and answer bodies that refuse to grow past a
 * limit. Private to registry/common: libcurl's types stay out of registry_common.h. */
#ifndef KILN_REGISTRY_HTTP_INT_H
#define KILN_REGISTRY_HTTP_INT_H

#include <curl/curl.h>

#include "registry_common.h"

/* A growing buffer that refuses to grow past its limit. */
typedef struct reg_buf {
    char *p;
    size_t len, limit;
    bool over;
} reg_buf;
size_t reg_buf_write(char *data, size_t size, size_t n, void *ctx); /* a libcurl write callback */

/* One transfer: the caller's progress bar, the stall watch and the rate watch. A transfer
 * that moves no byte either way for stall_ms (0: 60 s), counted from the last byte, is a dead
 * connection; one that moves fewer than min_rate bytes a second over a window of stall_ms
 * is a registry trickling (a byte a second never stalls). (libcurl's own low-speed check
 * averages the speed over its last five seconds, so a burst then silence was cut off 5-6 s
 * after the limit: measured 7.2 s for a 1 s limit.) */
typedef struct reg_xfer {
    const kiln_registry_client_opts *c;
    unsigned stall;   /* ms; 0: not watched (a deadline that comes first governs) */
    unsigned rate;    /* bytes a second over each window of stall ms; 0: not watched */
    curl_off_t bytes; /* up and down so far */
    uint64_t since;   /* when bytes last changed (ns); 0 before the first call */
    uint64_t window;  /* when the rate window began (ns) */
    curl_off_t window_bytes, slow_bytes; /* bytes at its start; moved in the window cut off */
    bool stalled, slow;
    char ebuf[CURL_ERROR_SIZE]; /* libcurl's own words for a failure */
} reg_xfer;

/* The slowest a transfer may be (min_rate, or the default). */
unsigned reg_min_rate(const kiln_registry_client_opts *c);
/* The kiln_err and message of an HTTP failure status: the server's {"error"} or the body's
 * first line. */
kiln_err reg_http_error(const kiln_registry_client_opts *c, const char *url, long status,
                        const reg_buf *body);

/* What a request does beyond the loop's own: its transfer's options and what to make of it. */
typedef struct reg_request {
    const kiln_registry_client_opts *c;
    const char *url;  /* named by http_error */
    const char *what; /* how a transfer failure begins: "registry 'URL'", "downloading 'URL'" */
    /* Set up handle h for one attempt, after common_opts (URL, headers, callbacks, x->rate,
     * timeouts; left_ms: what the operation has left, LONG_MAX without a deadline). A failure
     * ends the request. */
    kiln_err (*setup)(void *ctx, CURL *h, reg_xfer *x, long left_ms);
    /* After each transfer (NULL: nothing): what its callbacks found that ends the request
     * whatever libcurl says (an answer over its limit, a registry sending more than
     * declared, a write error). */
    kiln_err (*check)(void *ctx);
    const reg_buf *body; /* the answer's body, as the last transfer left it (http_error's words) */
    void *ctx;
} reg_request;
/* Run rq's transfers until one gets an answer that is not a transient failure (*status its
 * HTTP status, for the caller to judge), retrying connection errors, stalls, transfers too
 * slow and 5xx (but 501 and 507) with backoff, max_retries times, within the operation's
 * deadline. */
kiln_err reg_request_run(const reg_request *rq, long *status);

#endif

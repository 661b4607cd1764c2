/*
 * web.h - the registry's web page: server-side rendered HTML5 for people with a browser
 * (every model, its versions and channels, a channel's history, the audit log). One
 * embedded stylesheet, no JavaScript, nothing fetched from anywhere.
 *
 * web/ never touches the store: registry/ reads its database and hands the rows here one
 * at a time (each table is _begin, _row per row, kiln_web_table_end), so a page of
 * thousands of rows is rendered without collecting them first. Every string in a row is
 * data that came from a client or from the store (names, reasons, token names, card
 * fields) and goes out through kiln_web_text, the one escaping function. Uses core only.
 *
 * Appends never fail visibly: an allocation failure marks the buffer, later appends do
 * nothing, and kiln_web_buf_take reports it. Nothing here prints or exits.
 */
#ifndef KILN_WEB_H
#define KILN_WEB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a channel record's expiry is flagged on a page. The rule that decides it is sign/'s
 * (kiln_record_expiry_at, which `kiln models` prints by too); the caller fills it in. */
typedef enum kiln_web_expiry {
    KILN_WEB_EXPIRY_OK,
    KILN_WEB_EXPIRY_SOON,
    KILN_WEB_EXPIRY_EXPIRED
} kiln_web_expiry;

/* A page being written. Zero it (or = {0}) before use; kiln_web_buf_release after. */
typedef struct kiln_web_buf {
    char *data;
    size_t len, cap;
    size_t rows; /* rows of the table being written */
    bool nomem;  /* an append failed: the page is incomplete */
    size_t limit; /* 0: none; else the most bytes the page may hold */
    bool over;    /* an append would have passed limit: kiln_web_buf_take refuses the page */
} kiln_web_buf;

/* The bound kiln runs serve puts on a page (limit): beyond it the request is answered 500
 * with a message saying so, not hundreds of MiB of HTML. */
#define KILN_WEB_PAGE_MAX (8u << 20)
/* The most bytes of one string from a run (an event's message, a config value, a run id) a
 * runs page shows; longer ones are cut where a character begins, with a marker
 * (kiln_web_text_cut), as the registry's pages cut theirs. */
#define KILN_WEB_TEXT_MAX 1024u

void kiln_web_buf_release(kiln_web_buf *b);
/* The page's bytes, NUL-terminated (caller frees), *len their length; the buffer is left
 * empty. NULL when an append failed (KILN_ERR_NOMEM set) or the page passed its limit
 * (KILN_ERR_LIMIT, the message saying so), the buffer released. */
char *kiln_web_buf_take(kiln_web_buf *b, size_t *len);

/* Append s as HTML text, safe inside elements and quoted attribute values alike: & < > " '
 * become character references, and bytes that are not well-formed UTF-8 (overlong forms,
 * surrogates, past U+10FFFF, cut short) as well as control characters other than tab and
 * newline become U+FFFD. NULL appends nothing. */
void kiln_web_text(kiln_web_buf *b, const char *s);
/* kiln_web_text of at most max bytes of s (cut where a character begins), then "…" when
 * anything was cut. */
void kiln_web_text_cut(kiln_web_buf *b, const char *s, size_t max);
/* Append printf's text (numbers, and other text made here from numbers; at most 511 bytes). */
void kiln_web_printf(kiln_web_buf *b, const char *fmt, ...) KILN_PRINTF(2, 3);
/* Append s percent-encoded for a URL's query value or path segment: the unreserved bytes
 * (RFC 3986) and those of `also` (may be NULL) as they are, the rest %XX. */
void kiln_web_pct(kiln_web_buf *b, const char *s, const char *also);

/* The headers every page goes out with (error pages too), *n of them: Content-Type
 * text/html; charset=utf-8, a Content-Security-Policy that allows nothing but the page's
 * own stylesheet (by its sha256), X-Content-Type-Options nosniff, Referrer-Policy
 * no-referrer, Cache-Control no-store. Static; safe from any thread. */
typedef struct kiln_web_header {
    const char *name, *value;
} kiln_web_header;
const kiln_web_header *kiln_web_headers(size_t *n);

/* The embedded stylesheet (what the policy's hash is of). */
const char *kiln_web_stylesheet(void);

/* ---- the page around the tables ---- */

typedef enum kiln_web_kind {
    KILN_WEB_HOME,    /* "/": every model */
    KILN_WEB_MODEL,   /* a model's channels and versions */
    KILN_WEB_CHANNEL, /* a channel's history */
    KILN_WEB_AUDIT,   /* the audit log */
    KILN_WEB_ERROR,
    KILN_WEB_TRUST, /* the trust policy in force and its stored versions */
    KILN_WEB_VERSION /* a version: its validation report and run summary (channel: the version) */
} kiln_web_kind;

/* The document's head, the navigation (registry / model / channel) and the heading. model
 * and channel name the page (NULL where the kind has none); title is the error page's. */
void kiln_web_begin(kiln_web_buf *b, kiln_web_kind kind, const char *model, const char *channel,
                    const char *title);
/* The footer (when the page was rendered, by which kiln, the JSON route with the same data)
 * and the end of the document. */
void kiln_web_end(kiln_web_buf *b, kiln_web_kind kind, const char *model, const char *channel,
                  int64_t now);
/* A whole error page: the status and the message (escaped). */
void kiln_web_error(kiln_web_buf *b, unsigned status, const char *msg, int64_t now);

/* Close the table opened by a _begin; a table without rows becomes the sentence empty. */
void kiln_web_table_end(kiln_web_buf *b, const char *empty);

/* ---- rows ---- */

/* Who signed an archive or a channel record: a key id and, when the server's trust policy
 * holds that key, its name there. note (may be NULL) qualifies the signature
 * ("allow-unvalidated"). */
typedef struct kiln_web_signer {
    const char *name; /* NULL: the key is not in the server's policy */
    char keyid[17];   /* 16 hex digits, as minisign shows it */
    const char *note;
} kiln_web_signer;

/* A channel record as stored. */
typedef struct kiln_web_record {
    const char *channel, *version, *digest, *reason;
    const char *publisher; /* the token that put it */
    int64_t seq, expires, created;
    kiln_web_expiry expiry; /* at the page's now */
    const kiln_web_signer *signers;
    size_t nsigners;
    size_t records; /* the channel's records in all (the model page) */
    /* The history: the version the record before pointed at (NULL for the first), whether
     * this record's version was published before that one (a rollback), and whether it is
     * the channel's current record. */
    const char *previous;
    bool older, current;
} kiln_web_record;

/* A model on the front page. */
typedef struct kiln_web_model {
    const char *name;
    int64_t versions;
    const char *latest; /* the version published last */
    int64_t updated;    /* the last publish or channel record */
} kiln_web_model;

/* A version on its model's page. */
typedef struct kiln_web_version {
    const char *version, *digest, *publisher;
    uint64_t size;
    int64_t created;
    const char *validation; /* "passed", "failed" or "absent" */
    const kiln_web_signer *signers;
    size_t nsigners;
    const json_t *card;          /* card.json (NULL if absent): its lineage is shown */
    const char *const *channels; /* the channels whose current record points here */
    size_t nchannels;
} kiln_web_version;

/* An audit row; NULL fields are shown empty. */
typedef struct kiln_web_audit {
    int64_t id, time;
    const char *token, *action, *model, *version, *channel, *digest;
    const char *reason; /* why (a token revocation's reason) */
} kiln_web_audit;

/* The front page: a row per model, each followed by its channels' current records (the
 * records' channel, version, seq and expiry are shown; now flags expiry). */
void kiln_web_models_begin(kiln_web_buf *b);
void kiln_web_models_row(kiln_web_buf *b, const kiln_web_model *m);
void kiln_web_models_channel(kiln_web_buf *b, const char *model, const kiln_web_record *r,
                             int64_t now);
void kiln_web_models_row_end(kiln_web_buf *b);

/* A model's page: its channels (the current record of each), then its versions. */
void kiln_web_channels_begin(kiln_web_buf *b);
void kiln_web_channels_row(kiln_web_buf *b, const char *model, const kiln_web_record *r,
                           int64_t now);
void kiln_web_versions_begin(kiln_web_buf *b);
void kiln_web_versions_row(kiln_web_buf *b, const char *model, const kiln_web_version *v);

/* A channel's page: a page of its records, newest first (those before seq before, 0 for the
 * newest); total counts them all. End with kiln_web_history_end: links to the newest page
 * and, when more is true, to the records before last, the oldest seq shown. */
void kiln_web_history_begin(kiln_web_buf *b, int64_t total, int64_t before);
void kiln_web_history_row(kiln_web_buf *b, const char *model, const kiln_web_record *r,
                          int64_t now);
void kiln_web_history_end(kiln_web_buf *b, const char *model, const char *channel, int64_t last,
                          bool more);

/* The audit log, a page of rows after an id; end with kiln_web_audit_end instead of
 * kiln_web_table_end: links to the first page, the next (when more is true, after the last
 * id shown) and the newest (after newest_after). */
void kiln_web_audit_begin(kiln_web_buf *b, int64_t after, int64_t total);
void kiln_web_audit_row(kiln_web_buf *b, const kiln_web_audit *e);
void kiln_web_audit_end(kiln_web_buf *b, int64_t last, bool more, int64_t newest_after);

/* ---- the trust policy ---- */

/* A key of a trust policy: its name, its key id and the roles it holds. */
typedef struct kiln_web_trust_key {
    const char *name;
    char keyid[17]; /* 16 hex digits, as minisign shows it */
    bool root, release, promote;
} kiln_web_trust_key;

typedef struct kiln_web_trust_channel {
    const char *name;
    int threshold; /* distinct promote keys a record needs */
} kiln_web_trust_channel;

/* A trust policy as the page shows it. */
typedef struct kiln_web_trust_policy {
    uint64_t version;
    const kiln_web_trust_key *keys;
    size_t nkeys;
    int root_threshold, release_threshold;
    bool accept_unvalidated;
    const kiln_web_trust_channel *channels;
    size_t nchannels;
} kiln_web_trust_policy;

/* The front page's line: the version in force and its keys by role, linked to /ui/trust;
 * p NULL: the registry has no policy. */
void kiln_web_trust_summary(kiln_web_buf *b, const kiln_web_trust_policy *p);
/* The policy in force: the thresholds, then a table of its keys and one of its channels; p
 * NULL says there is none. start_version is the version of the server's --trust file. */
void kiln_web_trust_policy_show(kiln_web_buf *b, const kiln_web_trust_policy *p,
                                uint64_t start_version);

/* A signature of a stored version as kiln_sign_trust_update counted it. */
typedef struct kiln_web_trust_signer {
    const char *name; /* NULL or "": not known (the check stopped before naming the key) */
    char keyid[17];
    bool old_root, new_root; /* counted toward version N-1's quorum, toward N's */
} kiln_web_trust_signer;

/* A stored version of the policy. */
typedef struct kiln_web_trust_version {
    uint64_t version;
    int64_t created;
    const char *publisher; /* the token that stored it */
    /* Its signatures, and the quorums (checked is false when there was no version N-1 to
     * check it against, and nothing below is known but problem or note). */
    bool checked;
    const kiln_web_trust_signer *signers;
    size_t nsigners;
    size_t nold, nnew;
    int old_threshold, new_threshold;
    const char *changes; /* kiln_sign_trust_diff's lines from N-1 (NULL: unknown) */
    const char *problem; /* NULL: it verifies as the successor of a verified N-1 */
    const char *note;    /* shown without alarm (a version below the server's --trust) */
    bool in_force;
} kiln_web_trust_version;

/* The history: a page of the stored versions, newest first (those below version before, 0
 * for the newest); total counts them all. End with kiln_web_trust_history_end: links to the
 * newest versions and, when more is true, to those below last, the oldest shown. */
void kiln_web_trust_history_begin(kiln_web_buf *b, int64_t total, uint64_t before);
void kiln_web_trust_history_row(kiln_web_buf *b, const kiln_web_trust_version *v);
void kiln_web_trust_history_end(kiln_web_buf *b, uint64_t last, bool more);

/* ---- HTTP plumbing (web/httpd.c): one for kiln registry serve and kiln runs serve ---- */

struct sockaddr_storage;

/* The listen address, one rule for both servers: HOST:PORT with HOST an IPv4 address or
 * "localhost" (127.0.0.1: loopback, never a name looked up), or [IPv6]:PORT; PORT decimal,
 * 0..65535 (0: a free one). *ss is filled for bind(); *v6 says which family. Anything else
 * is KILN_ERR_USAGE naming the address and what is wrong with it. */
kiln_err kiln_web_listen_parse(const char *listen, struct sockaddr_storage *ss, bool *v6);

/* What both servers give every client. A connection that has not finished a request head
 * in KILN_WEB_HTTP_HEADER_TIMEOUT_S is closed (a slow-loris or a vanished client holds its
 * slot no longer); once it has sent one it may stay silent KILN_WEB_HTTP_IDLE_TIMEOUT_S
 * (during a request and kept alive between requests). One client address holds at most
 * KILN_WEB_HTTP_PER_IP connections, so that one address cannot take every slot. */
#define KILN_WEB_HTTP_HEADER_TIMEOUT_S 10u
#define KILN_WEB_HTTP_IDLE_TIMEOUT_S 120u
#define KILN_WEB_HTTP_PER_IP 64u
#define KILN_WEB_HTTP_NO_LIMIT 0xffffffffu
/* Connections at most, and the file descriptors a server wants besides them: fewer where
 * RLIMIT_NOFILE leaves no room (a warning says so when the caller asked for more). */
#define KILN_WEB_HTTP_MAX_CONNECTIONS 4096u
#define KILN_WEB_HTTP_SPARE_FDS 64u

/* The server itself is for the two that include <microhttpd.h> before this header (the rest
 * of the project sees none of libmicrohttpd's names). */
#ifdef MHD_VERSION
typedef struct kiln_web_http_opts {
    const char *listen;           /* kiln_web_listen_parse's rule */
    unsigned threads;             /* 0: 4 */
    unsigned max_connections;     /* 0: KILN_WEB_HTTP_MAX_CONNECTIONS */
    unsigned per_ip_connections;  /* 0: KILN_WEB_HTTP_PER_IP; KILN_WEB_HTTP_NO_LIMIT: none */
    unsigned header_timeout_s;    /* 0: KILN_WEB_HTTP_HEADER_TIMEOUT_S */
    unsigned idle_timeout_s;      /* 0: KILN_WEB_HTTP_IDLE_TIMEOUT_S */
    size_t memory_limit;          /* per connection; 0: libmicrohttpd's */
    const char *tls_cert, *tls_key; /* PEM text (not paths), both or neither: HTTPS */
    /* The request handler, as libmicrohttpd calls it, and its closure. */
    MHD_AccessHandlerCallback handler;
    void *handler_cls;
    /* Optional: the accept policy, the end of each request, a connection opened (true) or
     * closed (false), paths left as sent, libmicrohttpd's complaints. */
    MHD_AcceptPolicyCallback accept;
    void *accept_cls;
    MHD_RequestCompletedCallback completed;
    void *completed_cls;
    void (*on_connection)(void *cls, bool opened);
    void *connection_cls;
    size_t (*unescape)(void *cls, struct MHD_Connection *c, char *s);
    MHD_LogCallback log;
    const char *what; /* names the server in messages ("cannot listen on ..."): "registry" */
} kiln_web_http_opts;

typedef struct kiln_web_http kiln_web_http;
/* Bind and serve on threads of libmicrohttpd's own; *out freed with kiln_web_http_stop.
 * KILN_ERR_USAGE for a bad address, KILN_ERR_NETWORK when it cannot listen. */
kiln_err kiln_web_http_start(const kiln_web_http_opts *o, kiln_web_http **out);
/* The port it listens on (the chosen one when asked for 0). */
uint16_t kiln_web_http_port(const kiln_web_http *h);
/* Stop: close the listening socket and every connection, join the threads, free. NULL ok. */
void kiln_web_http_stop(kiln_web_http *h);
#endif /* MHD_VERSION */

#ifdef __cplusplus
}
#endif

/* Charts and the pages of kiln runs serve. */
#include "chart.h"

#endif /* KILN_WEB_H */

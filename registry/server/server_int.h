/* server_int.h - helpers shared inside the registry's server (registry/server/): the SQLite
 * store, the blob store and its lock, tokens, the trust table, mirrors, request parsing and the
 * web page's queries. Client files never include it. */
#ifndef KILN_REGISTRY_SERVER_INT_H
#define KILN_REGISTRY_SERVER_INT_H

#include <microhttpd.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>

#include "registry_common.h"
#include "web.h"

/* ---- SQLite (store.c) ---- */

/* Refuse a root that is neither a store (it holds registry.db) nor a new or empty directory,
 * so that a mistyped --root never scatters a store into an unrelated directory. */
kiln_err reg_root_check(const char *root);
/* Open DIR/registry.db (creating DIR, blobs/, tmp/ and the schema), WAL, busy timeout. */
kiln_err reg_db_open(const char *root, sqlite3 **db);
/* Open an existing store's database (the server, per request): busy timeout only. */
kiln_err reg_db_connect(const char *root, sqlite3 **db);
/* That root is an existing store (a directory whose registry.db holds the registry's tables),
 * checked without creating or changing anything: what fsck and gc ask before they touch it. */
kiln_err reg_store_check(const char *root);
void reg_db_close(sqlite3 *db);
/* Run a statement without results (BEGIN IMMEDIATE, COMMIT, ROLLBACK). */
kiln_err reg_db_exec(sqlite3 *db, const char *sql);
/* sqlite failure as a kiln_err naming what was being done. */
kiln_err reg_db_fail(sqlite3 *db, const char *what);
/* Column i of a row as text (NULL for SQL NULL): sqlite3_column_text without the cast. */
static inline const char *reg_col(sqlite3_stmt *st, int i) {
    return (const char *)sqlite3_column_text(st, i);
}
/* One audit row, inside the caller's transaction. NULL fields are stored as NULL. */
kiln_err reg_audit(sqlite3 *db, const char *token, const char *action, const char *model,
                   const char *version, const char *channel, const char *digest);
/* An audit row about a token (token.revoke) with its reason (may be NULL). */
kiln_err reg_audit_reason(sqlite3 *db, const char *token, const char *action, const char *reason);
/* The schema version this kiln makes and migrates stores to (PRAGMA user_version). */
int reg_schema_version(void);
/* An audit row with every column (mirror.sync: what was copied, and from where). */
kiln_err reg_audit_full(sqlite3 *db, const char *token, const char *action, const char *model,
                        const char *version, const char *channel, const char *digest,
                        const char *reason);

/* ---- versions and channel records (store.c): the server's writes and a mirror's ---- */

struct reg_archive_meta;
struct reg_record;

/* The stored digest of model@version, or NULL when absent (caller frees); *rc is set on a
 * database failure. */
char *reg_version_digest(sqlite3 *db, const char *model, const char *version, kiln_err *rc);
/* The same, and *size the stored archive's size in bytes (0 when absent). */
char *reg_version_digest_size(sqlite3 *db, const char *model, const char *version, uint64_t *size,
                              kiln_err *rc);

/* A version as it is stored: what the archive says (meta: manifest, card, validation, read
 * with reg_archive_meta_read) and who published it when. */
typedef struct reg_version_row {
    const char *model, *version, *digest; /* "sha256:<hex>" */
    uint64_t size;
    const struct reg_archive_meta *meta;
    const char *sig; /* the archive's signature file */
    size_t sig_len;
    const char *publisher; /* the token that published it (a mirror: the primary's) */
    int64_t created;
} reg_version_row;

/* Insert a version and one audit row (action, audit_token and reason; NULLs stored as NULL)
 * in one BEGIN IMMEDIATE transaction. The version held already with the same digest sets
 * *existed and writes nothing; with another digest it is KILN_ERR_CONFLICT. The blob must be
 * in place (reg_upload_commit) before. */
kiln_err reg_version_insert(sqlite3 *db, const reg_version_row *v, const char *audit_token,
                            const char *action, const char *reason, bool *existed);

/* A dataset (kiln data publish): its name, "sha256:<hex>" of its bytes, size, the .minisig
 * text whose trusted comment names both (verified before), the token that published it. */
typedef struct reg_dataset_row {
    const char *name, *digest;
    uint64_t size;
    const char *sig;
    size_t sig_len;
    const char *publisher;
    int64_t created;
} reg_dataset_row;
/* Insert it with one audit row ("data.publish") in one BEGIN IMMEDIATE transaction; held
 * already (the same name and digest): *existed, nothing written. The blob must be in place. */
kiln_err reg_dataset_insert(sqlite3 *db, const reg_dataset_row *d, bool *existed);

/* Insert a channel record whose signatures were verified (text: its bytes, stored and served
 * unchanged) and one audit row, in one BEGIN IMMEDIATE transaction: its seq must be the
 * channel's next (KILN_ERR_CONFLICT), its version held with its digest (KILN_ERR_NOTFOUND,
 * KILN_ERR_VERIFY). action NULL: "promote", or "rollback" for a record whose reason is
 * rollback. */
kiln_err reg_record_insert(sqlite3 *db, const struct reg_record *rec, const char *text,
                           const char *publisher, int64_t created, const char *audit_token,
                           const char *action, const char *reason);

/* ---- tokens (token.c) ---- */

/* Why a request's token was refused: /metrics counts each. */
typedef enum {
    REG_AUTH_MISSING,   /* no Authorization header where one is needed */
    REG_AUTH_MALFORMED, /* not "Bearer <token>" */
    REG_AUTH_UNKNOWN,
    REG_AUTH_EXPIRED,
    REG_AUTH_REVOKED,
    REG_AUTH_SCOPE, /* a valid token without the scope (403) */
    REG_AUTH_NREASONS
} reg_auth_refusal;

/* A token's last use is written when the stored time is at least this old (seconds). */
#define REG_LAST_USED_EVERY 60

/* Look a bearer token up by its hash, as of now (the server's clock); *name (caller frees)
 * and *scopes. Read from the database on every call, so a revocation or expiry holds from
 * the next request on. Unknown, revoked and expired tokens are KILN_ERR_AUTH with the
 * message the client gets ("token 'ci' was revoked at ...") and *why (may be NULL) saying
 * which; they write nothing. An accepted token's last_used is updated when it is
 * REG_LAST_USED_EVERY old or more (never waiting for a busy database). */
kiln_err reg_token_lookup(sqlite3 *db, const char *token, int64_t now, char **name,
                          unsigned *scopes, reg_auth_refusal *why);
/* Every token in db, by name (*out: caller frees). */
kiln_err reg_token_list_db(sqlite3 *db, kiln_registry_token_info **out, size_t *n);
/* The scopes a token of scope s holds: admin holds all, the others also hold read. */
unsigned reg_scope_bits(kiln_registry_scope s);

/* ---- the blob store (store.c) ---- */

/* DIR/blobs/sha256/<hex[0:2]>/<hex>; caller frees. */
char *reg_blob_path(const char *root, const char *hex);

/* An upload in progress: an unnamed file (O_TMPFILE) in DIR/tmp where the file system has
 * them, so that a crash leaves nothing behind; a named one there otherwise. */
typedef struct reg_upload {
    int fd;
    char *tmp; /* the named temporary, or NULL */
    char *root;
    kiln_sha256_state sha;
    uint64_t size;
} reg_upload;

kiln_err reg_upload_begin(reg_upload *u, const char *root);
kiln_err reg_upload_write(reg_upload *u, const void *data, size_t len);
/* Finish hashing and compare with the declared hex digest and size (KILN_ERR_VERIFY). */
kiln_err reg_upload_check(reg_upload *u, const char *hex, uint64_t size) KILN_MUST_CHECK;
/* A path by which the bytes written can be read before commit; caller frees. */
char *reg_upload_path(const reg_upload *u);
/* fsync, give the file its blob name (an existing blob of that digest is kept), fsync the
 * directory. */
kiln_err reg_upload_commit(reg_upload *u, const char *hex);
/* Take the named file at path (in DIR/tmp: a mirror's finished download) as an upload to
 * commit: reg_upload_commit then fsyncs it, links it to its blob name, fsyncs the directory
 * and removes path. */
kiln_err reg_upload_adopt(reg_upload *u, const char *root, const char *path);
void reg_upload_abort(reg_upload *u); /* safe on a zeroed struct, and after commit */

/* The store lock (DIR/lock, flock): a server holds it exclusively; gc needs it; fsck
 * checks it to know whether temporaries can be in use. *fd is -1 when busy. */
kiln_err reg_lock(const char *root, int *fd);
/* The same on DIR/name. */
kiln_err reg_lock_named(const char *root, const char *name, int *fd);
void reg_unlock(int fd);
/* Held by kiln registry mirror while it syncs (gc needs it free too; the server never
 * takes it). */
#define REG_MIRROR_LOCK "mirror.lock"

/* ---- trust versions in the store (trustchain.c) ---- */

/* A version in a URL or a file name: 1 to 16 decimal digits without a leading zero, 1 to
 * 2^53-1. */
bool reg_trust_version_parse(const char *s, uint64_t *v);
/* The stored document of version v (0: the newest), byte for byte; caller frees.
 * KILN_ERR_NOTFOUND when there is none. */
kiln_err reg_trust_get(sqlite3 *db, uint64_t v, char **doc, size_t *len);
/* Store version v's document with one audit row of action ("trust.put"; a mirror's sync:
 * "mirror.sync") and reason, in one BEGIN IMMEDIATE transaction; a version stored already is
 * KILN_ERR_CONFLICT. */
kiln_err reg_trust_store(sqlite3 *db, uint64_t v, const char *doc, size_t len, const char *token,
                         const char *action, const char *reason);

/* The policies from a start policy through the stored versions above it, oldest first. */
typedef struct reg_trust_chain {
    kiln_sign_trust **v;
    size_t n;
} reg_trust_chain;
/* Take start (owned by the chain from here on, also on failure) and walk the stored versions
 * above its version, each verified as the successor of the one before. A stored version
 * that is missing below a higher one, or that does not verify, is an error naming it
 * (KILN_ERR_VERIFY) or, with report, a problem reported that ends the chain there
 * (fsck: the rest of the store is still checked). Stored versions at or below start's are
 * not walked; with report, every stored row is also checked to parse as the version its row
 * says. A stored copy of start's own version must be the same policy (start_label, the file
 * it came from, names it otherwise): two versions of one number are a fork. */
kiln_err reg_trust_chain_load(sqlite3 *db, const char *root, kiln_sign_trust *start,
                              const char *start_label,
                              void (*report)(void *ctx, const char *problem), void *ctx,
                              reg_trust_chain *out);
void reg_trust_chain_release(reg_trust_chain *c);
/* The newest policy of the chain, taken out of it (the chain keeps the rest). */
kiln_sign_trust *reg_trust_chain_take_newest(reg_trust_chain *c);

/* ---- mirrors (mirror.c) ---- */

/* A store's mirror marks (the meta table); of is NULL for a primary. */
typedef struct reg_mirror_status {
    char *of;             /* the primary's URL (caller frees: reg_mirror_status_release) */
    int64_t last_sync;    /* unix time the last sync completed; 0: never */
    int64_t last_attempt; /* unix time the last sync began */
    int64_t problems;     /* items the last completed sync did not copy */
} reg_mirror_status;
kiln_err reg_mirror_status_read(sqlite3 *db, reg_mirror_status *out);
void reg_mirror_status_release(reg_mirror_status *s);
/* On a mirror's home page, one line of text: "mirror of URL, synced N s ago"; nothing on a
 * primary's. */
void reg_ui_mirror_line(sqlite3 *db, int64_t now, kiln_web_buf *b);

/* ---- request parsing (server.c; the router and its table: reg_routes.c): every piece that
 * reads request bytes, exposed for tests/fuzz/http.c ---- */

enum reg_route {
    REG_R_NONE,
    REG_R_HEALTH,
    REG_R_METRICS,
    REG_R_MODELS,
    REG_R_MODEL,
    REG_R_VERSION,
    REG_R_CHANNEL,
    REG_R_HISTORY,
    REG_R_BLOB,
    REG_R_AUDIT,
    REG_R_TOKENS,        /* "/v1/tokens" */
    REG_R_UI_HOME,       /* "/" */
    REG_R_UI_MODEL,      /* "/ui/models/{model}" */
    REG_R_UI_CHANNEL,    /* "/ui/models/{model}/channels/{channel}" */
    REG_R_UI_AUDIT,      /* "/ui/audit" */
    REG_R_TRUST,         /* "/v1/trust": the newest stored trust version */
    REG_R_TRUST_VERSION, /* "/v1/trust/{N}": N in seg[1] */
    REG_R_UI_TRUST,      /* "/ui/trust" */
    REG_R_UI_VERSION,    /* "/ui/models/{model}/versions/{version}" */
    REG_R_DATASETS,      /* "/v1/datasets" */
    REG_R_DATASET,       /* "/v1/datasets/{model}/sha256/{digest}": name in seg[0] */
    REG_R_REPRODUCTIONS, /* "/v1/models/{model}/versions/{version}/reproductions" */
    REG_R_COUNT
};

/* Route a raw (still percent-encoded) request path; the query is ignored. Each segment is
 * decoded on its own, so an encoded '/' stays inside a name. seg receives the model (seg[0]),
 * the version or channel (seg[1]) and a blob's digest (seg[2]). REG_R_NONE with *bad set
 * when the path is malformed (bad escape, NUL, too many segments, a name over
 * KILN_REGISTRY_NAME_MAX). Names are not validated here. */
int reg_route_match(const char *url, char seg[3][KILN_REGISTRY_NAME_MAX + 1], bool *bad);
/* Row i of the server's route table (one per method and route), for its test; false past
 * the last. handlers: how many of its two (an answer, a page) are set; one is right. */
typedef struct reg_route_info {
    const char *method, *pattern, *audit;
    int route;
    unsigned scope, handlers;
    bool open, write, page;
} reg_route_info;
bool reg_route_row(size_t i, reg_route_info *out);
/* A Range header against a blob of size bytes: "bytes=START-", "bytes=START-END" or
 * "bytes=-SUFFIX", one range of decimal digits (RFC 9110; no sign, space or list); an END
 * or SUFFIX past the end means "to the end". False when unsatisfiable or malformed. On
 * success start <= end < size. */
bool reg_range_parse(const char *h, uint64_t size, uint64_t *start, uint64_t *end);
/* A Content-Length value: decimal digits only, below 2^64 - 1; false otherwise. */
bool reg_length_parse(const char *s, uint64_t *out);
/* The token of an Authorization header "Bearer <token>", or NULL. */
const char *reg_bearer_token(const char *h);
/* X-Kiln-Signature: base64 (original alphabet) of a .minisig text with no NUL byte. *out
 * is the decoded text, NUL-terminated, *len its length (caller frees *out). */
kiln_err reg_sig_decode(const char *b64, char **out, size_t *len);
/* The body of an error answer, {"error":"msg"} (caller frees), bytes of msg that are not
 * UTF-8 shown as '?'; NULL only when out of memory. */
char *reg_error_body(const char *msg);
/* GET /v1/audit's query, each argument NULL when absent: after (an id, default 0), limit (1 to
 * 10000, default 1000), since (unix seconds: entries at or after it), model (one model's
 * entries) and action (a comma-separated list of up to 16 action names, [a-z.]). */
typedef struct reg_audit_query {
    int64_t after, limit, since;
    char model[KILN_REGISTRY_NAME_MAX + 1]; /* "" for all */
    char actions[2 + 16 * 35];              /* a JSON array of the names for json_each; "" */
} reg_audit_query;
/* False, with why (for a 400), when an argument is not what the API takes: numbers are
 * digits only and must fit (no sign, space or hex, as strtoll would take). */
bool reg_audit_parse(const char *after, const char *limit, const char *since, const char *model,
                     const char *action, reg_audit_query *q, char why[200]);

/* ---- the web page (ui.c): each renders a whole page into b from db (web/ writes the
 * HTML); a failure leaves b to be released and sets the message. The model and channel
 * names were checked by the caller; an unknown one is KILN_ERR_NOTFOUND. t (may be NULL)
 * names the keys that signed. ---- */

/* "/": the models, and a line on the trust policy in force (t, NULL: none). */
kiln_err reg_ui_home(sqlite3 *db, const kiln_sign_trust *t, int64_t now, kiln_web_buf *b);
kiln_err reg_ui_model(sqlite3 *db, const kiln_sign_trust *t, const char *model, int64_t now,
                      kiln_web_buf *b);
/* A page of a channel's history: the records before seq before (0: the newest), newest
 * first. */
kiln_err reg_ui_channel(sqlite3 *db, const kiln_sign_trust *t, const char *model,
                        const char *channel, int64_t before, int64_t now, kiln_web_buf *b);
/* A page of the audit log: the entries after the id after, oldest first. */
kiln_err reg_ui_audit(sqlite3 *db, int64_t after, int64_t now, kiln_web_buf *b);
/* The trust policy: in_force (NULL: the server has none), then a page of the stored versions
 * below version before (0: the newest), newest first, each checked as a client walks them
 * from start (the server's --trust policy; NULL: none), with who signed it toward which root
 * quorum and what it changed. A stored version that does not verify is shown as such. */
kiln_err reg_ui_trust(sqlite3 *db, const kiln_sign_trust *in_force, const kiln_sign_trust *start,
                      uint64_t before, int64_t now, kiln_web_buf *b);
/* "/ui/models/{model}/versions/{version}": the version's row, its validation report check by
 * check, and the run summary its archive carries (run_summary.json, read from the stored blob
 * in root and checked against the archive's manifest). */
kiln_err reg_ui_version(sqlite3 *db, const kiln_sign_trust *t, const char *root, const char *model,
                        const char *version, int64_t now, kiln_web_buf *b);

/* ---- the HTTP server: server.c (the policy in force, answers, request parsing),
 * reg_routes.c (the route table, the handler), reg_reads.c and reg_writes.c (the routes'
 * answers), reg_metrics.c (/metrics), reg_listen.c (start, TLS, stop) ---- */

#define REG_HIST_BUCKETS 8
typedef struct reg_histogram {
    uint64_t count, bucket[REG_HIST_BUCKETS];
    double sum;
} reg_histogram;

/* Requests answered of one route, method and status. */
typedef struct reg_counter_row {
    int route;
    const char *label; /* the route's pattern, or "other" (static) */
    char method[8];
    unsigned status;
    uint64_t n;
} reg_counter_row;

/* The policy in force, shared by the requests that use it: a PUT of the next trust version
 * swaps in a new one while others still verify under the old, which goes when the last of
 * them lets go. */
typedef struct reg_trust_ref {
    kiln_sign_trust *t;
    int refs; /* under the server's trust_mu */
} reg_trust_ref;

struct kiln_registry_server {
    kiln_web_http *http; /* web/httpd.c: the daemon, as kiln runs serve has it */
    char *root;
    pthread_mutex_t trust_mu;     /* guards trust and each reg_trust_ref's refs */
    pthread_mutex_t trust_put_mu; /* one trust PUT at a time: verify, store, swap */
    reg_trust_ref *trust;         /* NULL: no policy (serve without --trust) */
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
    reg_counter_row *rows;
    size_t nrows, caprows;
    uint64_t bytes_served;
    reg_histogram upload, download;
    uint64_t auth_refused[REG_AUTH_NREASONS];
};

typedef enum {
    REG_BODY_NONE,
    REG_BODY_ARCHIVE,
    REG_BODY_RECORD,
    REG_BODY_TRUST,
    REG_BODY_DATASET,
    REG_BODY_REPRO
} reg_body_kind;

/* One request, from its headers to its completion. */
typedef struct reg_req {
    int route;
    const char *audit; /* the audit action of the route table's row answering it */
    char allow[32];    /* a 405's Allow header: the methods the route takes here */
    uint64_t trust_v;  /* /v1/trust/{version}: the version */
    bool deferred;     /* a request without a body: routed once its head is all in */
    bool html;         /* a page: errors are answered as pages too */
    char method[8];
    unsigned status;
    uint64_t t0, body_bytes;
    char *token_name;
    unsigned scopes;
    char seg[3][KILN_REGISTRY_NAME_MAX + 1]; /* model, version or channel, digest */
    /* a body being received */
    reg_body_kind body;
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
} reg_req;

/* The policy in force (NULL: none), held until reg_trust_release (NULL: nothing); a trust PUT
 * may swap in a newer one meanwhile. */
reg_trust_ref *reg_trust_acquire(kiln_registry_server *s);
void reg_trust_release(kiln_registry_server *s, reg_trust_ref *t);
/* Make t (owned from here on, also on failure) the policy in force. */
kiln_err reg_trust_swap(kiln_registry_server *s, kiln_sign_trust *t);
bool reg_has_trust(kiln_registry_server *s);

/* The answers: each queues one on c and sets r->status; MHD_NO when it cannot. A request for
 * a page (r->html) is answered with error pages in place of JSON. */
/* buf (taken, freed also on failure) as the body, of Content-Type type. */
enum MHD_Result reg_send_buf(struct MHD_Connection *c, reg_req *r, unsigned status, char *buf,
                             size_t len, const char *type);
/* j (taken) as the body. */
enum MHD_Result reg_send_json(struct MHD_Connection *c, reg_req *r, unsigned status, json_t *j);
/* A page (taken from b) with the headers web/ asks for; one past KILN_WEB_PAGE_MAX is a 500. */
enum MHD_Result reg_send_page(struct MHD_Connection *c, reg_req *r, unsigned status,
                              kiln_web_buf *b);
/* {"error": the message}, or an error page. */
enum MHD_Result reg_send_error(struct MHD_Connection *c, reg_req *r, unsigned status,
                               const char *fmt, ...) KILN_PRINTF(4, 5);
/* The HTTP status of a kiln_err (an I/O error on a full disk: 507). */
unsigned reg_status_of(kiln_err e);
/* e with the message set (kiln_errmsg), or kiln_strerror's. */
enum MHD_Result reg_send_kiln_error(struct MHD_Connection *c, reg_req *r, kiln_err e);
/* s is digits only, at most max, into *out. */
bool reg_audit_number(const char *s, int64_t max, int64_t *out);

/* The route table's answers (reg_routes.c calls them): each answers r on c with db the
 * store's connection, NULL for /healthz, which needs none. A PUT's start is called on the
 * request's head and sets r->body to take a body; its finish once the body is in. */
#define REG_ROUTE_ARGS kiln_registry_server *s, struct MHD_Connection *c, reg_req *r, sqlite3 *db
/* reg_reads.c */
enum MHD_Result reg_do_health(REG_ROUTE_ARGS);
enum MHD_Result reg_do_models(REG_ROUTE_ARGS);
enum MHD_Result reg_do_model(REG_ROUTE_ARGS);
enum MHD_Result reg_do_version(REG_ROUTE_ARGS);
enum MHD_Result reg_do_channel(REG_ROUTE_ARGS);
enum MHD_Result reg_do_history(REG_ROUTE_ARGS);
enum MHD_Result reg_do_blob(REG_ROUTE_ARGS);
enum MHD_Result reg_do_audit(REG_ROUTE_ARGS);
enum MHD_Result reg_do_tokens(REG_ROUTE_ARGS);
enum MHD_Result reg_do_trust(REG_ROUTE_ARGS);
enum MHD_Result reg_do_repros(REG_ROUTE_ARGS);
enum MHD_Result reg_do_datasets(REG_ROUTE_ARGS);
enum MHD_Result reg_do_dataset(REG_ROUTE_ARGS);
/* reg_writes.c */
enum MHD_Result reg_put_version_start(REG_ROUTE_ARGS);
enum MHD_Result reg_put_version_finish(REG_ROUTE_ARGS);
enum MHD_Result reg_put_record_start(REG_ROUTE_ARGS);
enum MHD_Result reg_put_record_finish(REG_ROUTE_ARGS);
enum MHD_Result reg_put_trust_start(REG_ROUTE_ARGS);
enum MHD_Result reg_put_trust_finish(REG_ROUTE_ARGS);
enum MHD_Result reg_put_repro_start(REG_ROUTE_ARGS);
enum MHD_Result reg_put_repro_finish(REG_ROUTE_ARGS);
enum MHD_Result reg_put_dataset_start(REG_ROUTE_ARGS);
enum MHD_Result reg_put_dataset_finish(REG_ROUTE_ARGS);
/* reg_metrics.c: GET /metrics */
enum MHD_Result reg_do_metrics(REG_ROUTE_ARGS);

/* The pages of the web UI (reg_reads.c; ui.c reads the store, web/ writes the HTML): each
 * renders into b under t, the policy in force (NULL: none). */
#define REG_PAGE_ARGS                                                                              \
    kiln_registry_server *s, struct MHD_Connection *c, const reg_req *r, sqlite3 *db,              \
        const kiln_sign_trust *t, int64_t now, kiln_web_buf *b
typedef kiln_err (*reg_page_fn)(REG_PAGE_ARGS);
kiln_err reg_page_home(REG_PAGE_ARGS);
kiln_err reg_page_model(REG_PAGE_ARGS);
kiln_err reg_page_version(REG_PAGE_ARGS);
kiln_err reg_page_channel(REG_PAGE_ARGS);
kiln_err reg_page_trust(REG_PAGE_ARGS);
kiln_err reg_page_audit(REG_PAGE_ARGS);
/* A page row's answer: its page under the policy in force. */
enum MHD_Result reg_do_page(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                            sqlite3 *db, reg_page_fn page);

/* Shared by a dataset's read and its PUT (reg_reads.c): {digest} of the route is 64 lowercase
 * hex digits, copied into r->hex; false with a 400 queued in *res otherwise. */
bool reg_dataset_hex(struct MHD_Connection *c, reg_req *r, enum MHD_Result *res);
/* model@version's reproduction records as [{"record", "signature", "signer", "verdict",
 * "publisher", "created"}], oldest first, into *out (new; the caller frees). */
kiln_err reg_load_repros(sqlite3 *db, const char *model, const char *version, json_t **out);

/* reg_metrics.c: a request counted once it completes, under label (its route's pattern,
 * static); a token refused, by why. */
void reg_count_request(kiln_registry_server *s, reg_req *r, const char *label);
void reg_count_refusal(kiln_registry_server *s, reg_auth_refusal why);

/* reg_routes.c: libmicrohttpd's callbacks (cls: the server), for reg_listen.c to start the
 * daemon with. */
enum MHD_Result reg_http_handler(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls);
void reg_http_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                        enum MHD_RequestTerminationCode toe);

#endif

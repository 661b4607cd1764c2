/*
 * registry.h - kiln's model registry: the HTTP server (libmicrohttpd, SQLite metadata,
 * a content-addressed blob store), its maintenance (tokens, fsck, gc) and the client
 * (libcurl: publish, pull-and-verify, channel records). docs/registry.md documents the
 * routes, the store's layout and the order of the checks.
 *
 * Nothing here prints or exits; every function returns a kiln_err with the detail in
 * kiln_errmsg().
 */
#ifndef KILN_REGISTRY_H
#define KILN_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "kiln.h"
#include "sign.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- names ---- */

#define KILN_REGISTRY_NAME_MAX 64

/* Model, channel and token names: 1..64 of [a-z0-9._-], beginning with [a-z0-9], no "..".
 * what ("model", "channel", "token") names the value in the message. For a channel this is
 * the character set only, what a store may hold (a channel made before the naming rule below
 * is still read as stored); a new channel, and a channel in NAME@REF, is
 * kiln_registry_check_channel's. */
kiln_err kiln_registry_check_name(const char *what, const char *s) KILN_MUST_CHECK;
/* Whether url names an OCI registry (oci://, oci+http://) rather than kiln's own server:
 * what only kiln's server holds (datasets, reproduction records, the audit log) is not there. */
bool kiln_registry_is_oci(const char *url);

/* The naming rule that keeps NAME@REF unambiguous (docs/registry.md, "Names"): a version
 * begins with a digit, or with 'v' or 'V' followed by a digit (1.2.0, v2, 2026-01-05); a
 * channel name never does (production, staging, canary-eu). A client reads REF by this rule
 * alone, never by what a registry holds or answers: NAME@production is a channel, and a
 * registry without that channel is an error, never the version 'production'. */
bool kiln_registry_looks_like_version(const char *s);
/* Versions: 1..64 of [A-Za-z0-9._+-], no "..", beginning as the rule above says. */
kiln_err kiln_registry_check_version(const char *s) KILN_MUST_CHECK;
/* Channels: a name (kiln_registry_check_name) that does not look like a version. */
kiln_err kiln_registry_check_channel(const char *s) KILN_MUST_CHECK;
/* NAME@REF split into model and what, *is_version saying which REF is by the rule (each
 * checked: the model's name, and REF as a version or as a channel). KILN_ERR_USAGE when ref
 * is not one. */
kiln_err kiln_registry_ref_parse(const char *ref, char model[KILN_REGISTRY_NAME_MAX + 1],
                                 char what[KILN_REGISTRY_NAME_MAX + 1],
                                 bool *is_version) KILN_MUST_CHECK;

/* ---- the store (DIR: registry.db, blobs/sha256/ab/<hex>, tmp/) ---- */

typedef enum {
    KILN_SCOPE_READ = 1,
    KILN_SCOPE_PUBLISH = 2,
    KILN_SCOPE_PROMOTE = 4,
    KILN_SCOPE_ADMIN = 8
} kiln_registry_scope;

/* "read" | "publish" | "promote" | "admin"; false for anything else. */
bool kiln_registry_scope_parse(const char *s, kiln_registry_scope *out);

/* The scope's name ("read", ...); NULL for a value that is not one scope. */
const char *kiln_registry_scope_name(kiln_registry_scope s);

/* Create (or open) the store at root and add a token named name with one scope. *token is
 * the new secret (caller frees), shown once: only its sha256 is stored. A name in use, also
 * a revoked token's (names are never reused), is KILN_ERR_CONFLICT. Writes one audit row.
 * The token never expires. */
kiln_err kiln_registry_token_create(const char *root, const char *name, kiln_registry_scope scope,
                                    char **token);
/* The same, with an expiry: from expires (unix seconds) on, the server refuses the token
 * with 401 "token 'NAME' expired at TIME". 0: never. A time already past is accepted (the
 * CLI refuses one). */
kiln_err kiln_registry_token_create_until(const char *root, const char *name,
                                          kiln_registry_scope scope, int64_t expires, char **token);

#define KILN_REGISTRY_REASON_MAX 200

/* A token as `kiln registry token list` shows it: never the secret or its hash. Times are
 * unix seconds; 0 means never (expires), not revoked (revoked), not used since the store
 * began recording it (last_used). */
typedef struct kiln_registry_token_info {
    char name[KILN_REGISTRY_NAME_MAX + 1];
    char scope[16];
    int64_t created, expires, revoked, last_used;
    char reason[KILN_REGISTRY_REASON_MAX + 1]; /* the revocation's reason, "" if none */
} kiln_registry_token_info;

typedef enum {
    KILN_TOKEN_ACTIVE,
    KILN_TOKEN_EXPIRED,
    KILN_TOKEN_REVOKED
} kiln_registry_token_state;

/* Every token of the store at root, by name (*out: caller frees). root must be a store
 * already: nothing is created (an old store is migrated, as every open does). */
kiln_err kiln_registry_token_list(const char *root, kiln_registry_token_info **out, size_t *n);
/* A token's state at now: revoked, else expired (now at or past expires), else active. */
kiln_registry_token_state kiln_registry_token_state_at(const kiln_registry_token_info *t,
                                                       int64_t now);
/* "active", "expired", "revoked". */
const char *kiln_registry_token_state_name(kiln_registry_token_state s);
/* {"tokens": [{"name", "scope", "created", "expires", "state", "revoked", "reason",
 * "last_used"}]}: times RFC 3339 UTC, null where absent; the states at now. New reference,
 * NULL when out of memory. */
json_t *kiln_registry_token_json(const kiln_registry_token_info *t, size_t n, int64_t now);

/* Revoke the token named name: from the next request on, a running server answers it with
 * 401 "token 'NAME' was revoked at TIME". The row stays (revoked), so the audit log's names
 * keep their meaning and the name cannot be reused. reason (NULL: none; else 1 to
 * KILN_REGISTRY_REASON_MAX bytes of UTF-8 without control characters) is kept with it and
 * in the one audit row (token.revoke). An unknown name is KILN_ERR_NOTFOUND, a revoked one
 * KILN_ERR_CONFLICT; both change nothing. root must be a store already. *at (may be NULL):
 * the revocation's time. */
kiln_err kiln_registry_token_revoke(const char *root, const char *name, const char *reason,
                                    int64_t *at);

/* fsck: every version's blob exists and hashes to its digest, every token has a known scope
 * and a well-formed hash, no orphaned temporaries
 * (when no server holds the store), every channel record verifies against trust (a trust
 * policy path, NULL: the one the store was served with, DIR/trust.json, if any) and points
 * at a version the store holds. Each problem is passed to report (may be NULL); *problems
 * counts them. Returns KILN_ERR_VERIFY when there are problems. */
kiln_err kiln_registry_fsck(const char *root, const char *trust,
                            void (*report)(void *ctx, const char *problem), void *ctx,
                            size_t *problems) KILN_MUST_CHECK;

/* gc: remove blobs that no version references. Refused while a server holds the store. */
kiln_err kiln_registry_gc(const char *root, size_t *removed, uint64_t *bytes);

/* ---- the server ---- */

typedef struct kiln_registry_server_opts {
    const char *root;         /* store directory, created if missing */
    const char *listen;       /* "127.0.0.1:PORT" or "[::1]:PORT"; PORT 0 picks a free one */
    const char *trust;        /* trust policy (trust.json); NULL refuses every upload and record */
    bool read_token_required; /* reads need a token with any scope */
    unsigned threads;         /* worker threads; 0 = 4 */
    uint64_t max_upload;      /* largest archive accepted in bytes; 0 = 16 GiB */
    /* Open connections at most (0: 4096), fewer where the process's file descriptor limit
     * (RLIMIT_NOFILE, soft) leaves no room for them: then a warning says so. */
    unsigned max_connections;
    /* Open connections from one client address at most, so that one client holding many
     * idle ones (a slow-loris) cannot use them all; 0: 64; KILN_REGISTRY_NO_LIMIT: none
     * (behind a proxy, where every client has the proxy's address). */
    unsigned per_ip_connections;
    /* HTTPS: a PEM certificate (chain) and its PEM private key, both or neither. Read and
     * checked against each other at start (an error names the file); NULL: plain HTTP. */
    const char *tls_cert, *tls_key;
    /* Seconds a connection may stay silent before its first request head is complete
     * (0: KILN_REGISTRY_HEADER_TIMEOUT_S), and once it has sent one: during a request and
     * while kept alive between requests (0: KILN_REGISTRY_IDLE_TIMEOUT_S). */
    unsigned header_timeout_s, idle_timeout_s;
} kiln_registry_server_opts;

/* A connection that has not finished a request head in this long is closed: a client that
 * vanished without a close, or a slow-loris, holds its slot no longer. */
#define KILN_REGISTRY_HEADER_TIMEOUT_S 10u
/* A connection silent this long during a request, or kept alive idle between requests. */
#define KILN_REGISTRY_IDLE_TIMEOUT_S 120u

#define KILN_REGISTRY_NO_LIMIT 0xffffffffu
/* The connections a server holds by default, and the file descriptors it wants besides them
 * (the store, the log, its threads): its RLIMIT_NOFILE should be at least the sum. */
#define KILN_REGISTRY_MAX_CONNECTIONS 4096u
#define KILN_REGISTRY_SPARE_FDS 64u

typedef struct kiln_registry_server kiln_registry_server;

/* Open the store, take its lock (one server per store) and start serving. */
kiln_err kiln_registry_server_start(const kiln_registry_server_opts *opts,
                                    kiln_registry_server **out);
/* The port it listens on (the chosen one when asked for 0). */
uint16_t kiln_registry_server_port(const kiln_registry_server *s);
/* Stop accepting, let requests in flight finish (at most grace_ms), close, free. NULL ok. */
void kiln_registry_server_stop(kiln_registry_server *s, unsigned grace_ms);

/* ---- the client ---- */

/* Called with bytes done and the total (0 when unknown); return nonzero to cancel. */
typedef int (*kiln_registry_progress)(void *ctx, uint64_t done, uint64_t total);

typedef struct kiln_registry_client_opts {
    const char *url;   /* "http://127.0.0.1:8080" */
    const char *token; /* bearer token or NULL */
    kiln_registry_progress progress;
    void *progress_ctx;
    int retries;         /* attempts after the first on connection errors and 5xx; <0: 4 */
    unsigned backoff_ms; /* first delay, doubled each time; 0: 250 */
    /* The most one small request (a trust version, a channel record, a JSON answer; not an
     * archive's transfer) may take in all, in milliseconds; 0: 60 s plus 1 s per 16 KiB the
     * answer may hold. A registry that trickles an answer is cut off there. */
    unsigned timeout_ms;
    /* A transfer (an archive's too) that moves no byte for this long, in milliseconds, is
     * cut off; 0: 60 s. */
    unsigned stall_ms;
    /* For https:// registries: a PEM file of the certificate authorities to trust (a private
     * CA); NULL: $KILN_REGISTRY_CA when set, else the system's. */
    const char *ca_file;
    /* The largest archive a pull or a mirror's sync accepts, in bytes: a version whose
     * declared size is larger is refused before its download starts, and no more than the
     * size accepted is ever read; 0: KILN_REGISTRY_MAX_SIZE_DEFAULT (16 GiB). */
    uint64_t max_size;
    /* The slowest a transfer may be, in bytes a second, averaged over each stall_ms window: a
     * registry that trickles (a byte a second never stalls) is cut off, and with several
     * registries passed over for the next; 0: KILN_REGISTRY_MIN_RATE_DEFAULT (16 KiB/s). */
    unsigned min_rate;
    /* The most a whole operation may take, in milliseconds: a pull (every registry, every
     * retry and backoff), a kiln_watch poll, a mirror's sync; a transfer still running then
     * is cut off; 0: KILN_REGISTRY_DEADLINE_DEFAULT_MS (1 h). */
    unsigned deadline_ms;
    /* kiln's own: when the operation in progress must end (kiln_now_ns), set from deadline_ms
     * when it starts. Leave it 0. */
    uint64_t until_ns;
} kiln_registry_client_opts;

/* The defaults of max_size, min_rate and deadline_ms (docs/registry.md, "Limits"). */
#define KILN_REGISTRY_MAX_SIZE_DEFAULT (16ull << 30)
#define KILN_REGISTRY_MIN_RATE_DEFAULT (16u * 1024u)
#define KILN_REGISTRY_DEADLINE_DEFAULT_MS (3600u * 1000u)

/* With several registries (a primary and its mirrors) the next one is the retry, so one that
 * does not answer is passed over sooner: these replace a client's timeout_ms and stall_ms
 * where they are 0 (docs/registry.md, "A registry that hangs"). */
#define KILN_REGISTRY_FAILOVER_TIMEOUT_MS 5000u
#define KILN_REGISTRY_FAILOVER_STALL_MS 10000u

typedef struct kiln_registry_published {
    kiln_digest digest; /* "sha256:<hex>" */
    uint64_t size;
    bool existed; /* the same bytes were there already (200, not 201) */
} kiln_registry_published;

/* Upload archive with its signature (archive + ".minisig" when sig_path is NULL) as
 * name@version, read from the archive's manifest. Streams from the file. */
kiln_err kiln_registry_publish(const kiln_registry_client_opts *c, const char *archive,
                               const char *sig_path, kiln_registry_published *out);

/* ---- datasets (docs/registry.md, "Datasets") ---- */

/* Upload the dataset file at path as name, content-addressed by the sha256 of its bytes (what
 * kiln data inspect prints and cards record), with sig (a .minisig text of sig_len bytes whose
 * trusted comment is the dataset's: kiln_registry_data_comment). The server verifies the
 * signature under its policy (a release key) and the digest. Streams from the file. */
kiln_err kiln_registry_data_publish(const kiln_registry_client_opts *c, const char *path,
                                    const char *name, const char *sig, size_t sig_len,
                                    kiln_registry_published *out);
/* The trusted comment a dataset's signature must carry: "kiln-dataset/1\tname:NAME\tsha256:HEX"
 * (caller frees; NULL when out of memory). */
char *kiln_registry_data_comment(const char *name, const char *hex);

typedef struct kiln_registry_data_pulled {
    char name[KILN_REGISTRY_NAME_MAX + 1];
    kiln_digest digest;
    uint64_t size;
    char signed_by[KILN_SIGN_NAME_MAX + 1];
} kiln_registry_data_pulled;
/* Download dataset name (NULL: any dataset the registry holds with this digest) of digest hex
 * (64 hex digits), verify it (its sha256 is hex, its signature is a release key's of the
 * trust policy at trust, the comment names name and hex) and only then rename it to out (a
 * new file, or one kiln can replace: an existing file is left as it was on any failure).
 * KILN_ERR_VERIFY when a check fails, KILN_ERR_NOTFOUND when the registry holds no such
 * dataset. */
kiln_err kiln_registry_data_pull(const kiln_registry_client_opts *c, const char *name,
                                 const char *hex, const char *trust, const char *out,
                                 kiln_registry_data_pulled *res) KILN_MUST_CHECK;

/* ---- reproduction records (kiln reproduce --sign; docs/reproduce.md) ---- */

/* The record of a reproduction of model@version (digest the archive's "sha256:<hex>"): the
 * canonical JSON text {"format": "kiln-reproduction/1", "model", "version", "digest",
 * "dataset_sha256", "code_version", "host", "time", "verdict": "identical" | "different"}
 * (*text, caller frees) and its signature by sk (*sig, a .minisig text, caller frees) with the
 * trusted comment "kiln-reproduction/1\tdigest:DIGEST\tverdict:V". */
kiln_err kiln_registry_repro_sign(const kiln_sign_seckey *sk, const char *model,
                                  const char *version, const char *digest,
                                  const char *dataset_sha256, const char *host, int64_t when,
                                  bool identical, char **text, char **sig);
/* The document {"record": text, "signature": sig} as the registry stores and serves it
 * (caller frees; NULL when out of memory). */
char *kiln_registry_repro_doc(const char *text, const char *sig);
/* PUT it to model@version's reproduction records (a publish token); the registry verifies it
 * under its policy (a key with the reproduce role, this version's digest). */
kiln_err kiln_registry_repro_put(const kiln_registry_client_opts *c, const char *model,
                                 const char *version, const char *doc);

/* GET a path under the registry ("/v1/models") and parse the JSON body (new reference).
 * HTTP errors map to kiln_errs (404 NOTFOUND, 401/403 AUTH, 409 CONFLICT) with the
 * server's message. */
kiln_err kiln_registry_get_json(const kiln_registry_client_opts *c, const char *path, json_t **out);

/* PUT a channel record (the signed JSON text) for model/channel. */
kiln_err kiln_registry_put_channel(const kiln_registry_client_opts *c, const char *model,
                                   const char *channel, const char *record, size_t len);

/* Fetch the current channel record's text (caller frees); KILN_ERR_NOTFOUND if none. */
kiln_err kiln_registry_get_channel(const kiln_registry_client_opts *c, const char *model,
                                   const char *channel, char **record, size_t *len);

typedef struct kiln_registry_pull_opts {
    const char *ref;   /* "NAME@CHANNEL" or "NAME@VERSION" */
    const char *trust; /* trust policy path (required) */
    const char *out;   /* destination directory */
    const char *state; /* anti-rollback state directory; NULL: $HOME/.local/state/kiln */
    /* The part after '@' is a channel only: a registry without it is KILN_ERR_NOTFOUND (after
     * the anti-rollback check: a channel accepted before and now missing is refused). */
    bool channel_only;
    /* The part after '@' is a version as a signed channel record names it, read as stored
     * (its characters only: a version stored before the naming rule may look like a
     * channel's name), never a channel: kiln provenance --download of a record's version. */
    bool exact_version;
    /* The channel record to pull (its text as a registry served it), checked as one fetched
     * is, instead of asking this registry for the channel's: a pull over several registries
     * takes the newest record any of them has, then the archive from one that holds it.
     * NULL: ask. */
    const char *record;
    size_t record_len;
    /* A channel pull's state (the accepted seq and the evidence reg_installed_verify checks)
     * goes to STATE/channels/MODEL/CHANNEL.json.pending instead, for the caller to settle
     * with reg_state_settle once it knows whether the model goes into service (kiln_watch:
     * after it loads). */
    bool defer_state;
} kiln_registry_pull_opts;

typedef struct kiln_registry_pulled {
    char model[KILN_REGISTRY_NAME_MAX + 1];
    char version[KILN_REGISTRY_NAME_MAX + 1];
    char channel[KILN_REGISTRY_NAME_MAX + 1]; /* "" when pulled by version */
    kiln_digest digest;
    uint64_t size;
    int64_t seq; /* the channel record's, 0 when pulled by version */
    /* The release keys whose signatures verified, the threshold and the validation verdict:
     * "rel (1 of 1 release key; validation passed)". */
    char signed_by[256];
    /* Which registry served the archive, and the channel record when that was another
     * (kiln_registry_pull_any); record_from is "" when it is the same. */
    char registry[512], record_from[512];
} kiln_registry_pulled;

/* Download, verify in the documented order (docs/registry.md: the channel record's
 * signatures, seq, expiry, the archive's size and digest, then sign/'s
 * kiln_sign_verify_archive with the policy at p->trust: every archive signature, the
 * manifest they name, the release threshold and the unvalidated rule, every file while
 * unpacking securely), and rename the verified directory to opts->out. A failed check is
 * KILN_ERR_VERIFY and leaves nothing at out. */
kiln_err kiln_registry_pull(const kiln_registry_client_opts *c, const kiln_registry_pull_opts *p,
                            kiln_registry_pulled *out) KILN_MUST_CHECK;

/* ---- an installed model, checked on its host (client/installed.c, docs/registry.md
 * "Checking an installed model") ---- */

typedef struct kiln_registry_installed {
    char model[KILN_REGISTRY_NAME_MAX + 1], channel[KILN_REGISTRY_NAME_MAX + 1];
    char version[KILN_REGISTRY_NAME_MAX + 1];
    kiln_digest digest; /* the archive's, as the record names it */
    int64_t seq, expires;        /* the record's */
    uint64_t trust_version;      /* of the policy it was checked under */
    char signed_by[256];         /* the release signers, as a pull says them */
    char manifest_sha256[KILN_SHA256_HEX];
    size_t files;   /* in the manifest, each checked */
    uint64_t bytes; /* their sizes summed */
} kiln_registry_installed;

/* Check, without a registry, that dir holds what a pull of ref ("NAME@CHANNEL") installed and
 * that it still verifies: the trust policy walked from the file trust through the versions in
 * state (nothing fetched), the channel record and archive signatures that pull kept in state,
 * the manifest they sign, every file (docs/registry.md). KILN_ERR_VERIFY naming the failed
 * check; KILN_ERR_NOTFOUND when state keeps no such pull. out (may be NULL) says what was
 * checked. What kiln_watch_start does before it serves a kept model offline. */
kiln_err kiln_registry_installed_verify(const char *trust, const char *state, const char *ref,
                                        const char *dir,
                                        kiln_registry_installed *out) KILN_MUST_CHECK;

/* ---- provenance (provenance.c, docs/registry.md "Provenance") ---- */

typedef struct kiln_registry_provenance_opts {
    const char *ref;   /* "NAME@CHANNEL" or "NAME@VERSION" */
    const char *trust; /* the client's trust policy, walked forward as kiln pull walks it */
    const char *state; /* pull state: trust versions, accepted seqs; NULL: the default */
    bool download;     /* also download the archive and verify it in full, as kiln pull does */
} kiln_registry_provenance_opts;

/* What ref resolves to and where it came from, each fact checked under the client's own
 * policy: the channel's current record (signatures and threshold, seq against the state's,
 * expiry) and the records before it, the trust policy walked, the archive (the signature
 * file's trusted comments against the registry's manifest; with download, the archive's bytes
 * and every file, by the pull's own code, in a temporary directory under STATE/downloads that
 * is removed after), the lineage (the signed manifest), the model config (card.json, when the
 * registry's copy reproduces the signed bytes), the validation verdict and the report's checks
 * and baseline (the registry's copy of validation.json when its sha256 is the signed
 * manifest's; with download, the archive's). *out is a new JSON object (format kiln-provenance/1,
 * docs/registry.md), each fact with a check {"status": "verified" | "failed" | "registry" |
 * "not checked", "how"}; "problems" names every failed one. KILN_OK when none failed;
 * KILN_ERR_VERIFY when one did (*out holds everything, also what failed); another code (bad
 * arguments, an unreadable --trust, a state path that is not a directory, a registry that does
 * not answer or holds no such channel or version) with *out NULL. Writes nothing but what the
 * trust walk accepts (STATE/trust/N.json) and the download's temporary files. */
kiln_err kiln_registry_provenance(const kiln_registry_client_opts *c,
                                  const kiln_registry_provenance_opts *o,
                                  json_t **out) KILN_MUST_CHECK;
/* The same over several registries cs[0..n), a primary and its mirrors, as kiln pull fails
 * over (kiln_registry_pull_any): the trust policy walked through each that answers, the
 * channel's current record the one with the highest seq that verifies under it (when none
 * does, the first one served, shown and flagged), and everything after it read from the
 * registry that served it (by version: the first that holds it). "registry" names that one,
 * "registries" those given, "failover" what passing one over said. n 1: the same as
 * kiln_registry_provenance. */
kiln_err kiln_registry_provenance_any(const kiln_registry_client_opts *cs, size_t n,
                                      const kiln_registry_provenance_opts *o,
                                      json_t **out) KILN_MUST_CHECK;

/* ---- listing a registry (models.c, docs/registry.md "Listing a registry: kiln models") ---- */

typedef struct kiln_registry_models_opts {
    const char *model; /* NULL: every model the registry lists; else this one only */
    /* The client's trust policy, walked as kiln pull walks it: each channel's current record
     * is fetched and verified under it. NULL: records as the registry states them. */
    const char *trust;
    const char *state; /* with trust: trust versions and seqs accepted; NULL: the default */
    int64_t expiring;  /* > 0: flag each channel whose record expires within this many seconds
                          (or has expired); 0: none */
} kiln_registry_models_opts;

/* What the registries cs[0..n) hold, as one new JSON object in *out (the caller
 * json_decrefs it; format kiln-models/1, docs/registry.md): every model (or o->model) with
 * its versions as listed (version, digest, size, publisher, created, validation) and each
 * channel's current record (version, digest, seq, expiry by web/'s rule, reason, who put it
 * when). With o->trust each record is the bytes
 * as signed, verified here by kiln_sign_record_verify under the walked policy (signatures and
 * the channel's threshold), then against the registry's listing (model, channel, seq, version,
 * digest, expiry, the version's digest) and the seq this client accepted last; the fields
 * shown are the signed record's once its signatures verify, the registry's otherwise, and each
 * channel's "check" says which ({"status": "verified" | "failed" | "not checked", "how"}).
 * Over several registries, failover.c's rules (kiln pull's): the trust walk through each that
 * answers, the list and each model from the first that holds it, each record the highest seq
 * that verifies ("failover" says what passing one over said). KILN_OK when nothing failed,
 * KILN_ERR_VERIFY when a record did not verify (*out holds everything, "problems" each
 * failure); o->expiring flags channels in "expiring" and is no failure. *out is NULL when the
 * listing could not be made, and the code says why: bad arguments, an unreadable policy or
 * state, a trust walk refused (KILN_ERR_VERIFY, as for a pull), a registry that does not answer
 * or answers what no registry sends, KILN_ERR_NOTFOUND for an o->model no registry has.
 * Writes nothing but what the trust walk accepts (STATE/trust/N.json). */
kiln_err kiln_registry_models(const kiln_registry_client_opts *cs, size_t n,
                              const kiln_registry_models_opts *o, json_t **out) KILN_MUST_CHECK;

/* ---- versions of the trust policy (client/trustwalk.c; the store's: server/trustchain.c;
 * docs/registry.md "Trust policy versions") ---- */

/* One version a walk accepted. */
typedef struct kiln_registry_trust_step {
    uint64_t version;
    bool from_state;     /* accepted before: read back from STATE/trust/N.json and verified again */
    const char *source;  /* that file, or the registry's URL for the version */
    const char *changes; /* kiln_sign_trust_diff from the version before ("" for none) */
    const kiln_sign_trust_update_result *res; /* who signed, toward which quorum */
} kiln_registry_trust_step;

/* The trust policy a client works under: the policy at trust (plain or signed: the client's
 * root of trust), then the versions it accepted before (STATE/trust/N.json for N = its
 * version + 1, + 2, ... while they exist), then those the registry has (GET /v1/trust/N until
 * 404), each accepted only as the successor of the one before (kiln_sign_trust_update) and
 * saved atomically to STATE/trust/N.json before it is used. State can never replace the
 * configured root: every file there is verified again on each walk. A version that does not
 * verify (in state or from the registry) is KILN_ERR_VERIFY naming it, and saves nothing
 * more; a registry that lacks version N while serving a higher one (GET /v1/trust) is
 * KILN_ERR_VERIFY too; one that serves only older versions changes nothing. c NULL: state
 * only. state NULL: $HOME/.local/state/kiln. on_step (may be NULL) hears each version
 * accepted. *out is the newest policy (caller frees). */
kiln_err kiln_registry_trust_walk(const kiln_registry_client_opts *c, const char *trust,
                                  const char *state,
                                  void (*on_step)(void *ctx, const kiln_registry_trust_step *s),
                                  void *ctx, kiln_sign_trust **out) KILN_MUST_CHECK;

/* PUT a signed policy (doc, len; label names it) as the registry's next trust version (an
 * admin token). *version (may be NULL) gets the version the registry stored. */
kiln_err kiln_registry_trust_put(const kiln_registry_client_opts *c, const char *doc, size_t len,
                                 const char *label, uint64_t *version);

/* ---- several registries: a primary and its mirrors (failover.c, docs/registry.md
 * "Mirrors") ---- */

/* What a pull over several registries says as it moves from one to the next, one line
 * without "kiln: " ("registry URL1: connection refused; trying URL2"). NULL: each is logged as
 * a warning. */
typedef void (*kiln_registry_note)(void *ctx, const char *line);

/* kiln_registry_pull over the registries cs[0..n), in that order. The trust policy is walked
 * through each that answers. A channel's current record is asked of every registry that
 * answers and the one with the highest seq that verifies is taken (a stale mirror never
 * makes a service run an older model: a rollback is a higher seq too); then the archive is
 * pulled from the first registry that holds it and verifies. A registry that cannot be
 * reached, answers 5xx, serves a record older than this client accepted, or serves something
 * that does not verify is passed over, and note hears why; when none gives a model that
 * verifies, the error names each registry's reason (KILN_ERR_VERIFY when any served
 * something that did not verify). With more than one registry each request is tried once
 * per registry (the next registry is the retry); with one, this is kiln_registry_pull. */
kiln_err kiln_registry_pull_any(const kiln_registry_client_opts *cs, size_t n,
                                const kiln_registry_pull_opts *p, kiln_registry_note note,
                                void *note_ctx, kiln_registry_pulled *out) KILN_MUST_CHECK;

/* kiln_registry_trust_walk through each of cs[0..n) that answers, in order: *out is the newest
 * policy any of them leads to (a registry that serves fewer versions changes nothing). A
 * registry that cannot be reached or serves a version that does not verify is passed over
 * (note hears why); when none can be walked, the error names each one's reason. on_step hears
 * each version once. */
kiln_err kiln_registry_trust_walk_any(const kiln_registry_client_opts *cs, size_t n,
                                      const char *trust, const char *state,
                                      void (*on_step)(void *ctx, const kiln_registry_trust_step *s),
                                      void *ctx, kiln_registry_note note, void *note_ctx,
                                      kiln_sign_trust **out) KILN_MUST_CHECK;

/* ---- mirrors (mirror.c, docs/registry.md "Mirrors") ---- */

typedef struct kiln_registry_mirror_opts {
    /* The mirror's store: a new or empty directory (it becomes one), a store with nothing
     * published in it that no server runs on, or a mirror of from->url. Anything else (a
     * primary's store, a mirror of another URL, a file, another directory) is refused before
     * anything is written. */
    const char *root;
    const kiln_registry_client_opts *from; /* the primary (url, a read token, progress) */
    const char *trust; /* the policy the copy is verified under, walked through the primary's
                          trust versions: the oldest policy the services use */
    void (*on_copied)(void *ctx, const char *line);  /* each item copied (may be NULL) */
    void (*on_problem)(void *ctx, const char *line); /* each item not copied, and why */
    void *ctx;
} kiln_registry_mirror_opts;

typedef struct kiln_registry_mirror_result {
    size_t trust_versions, versions, records; /* copied by this sync */
    size_t datasets;                          /* copied by this sync */
    size_t problems;                          /* items not copied: they did not verify */
    uint64_t bytes;                           /* archive bytes downloaded */
    size_t requests;                          /* HTTP requests made to the primary */
} kiln_registry_mirror_result;

/* Copy what the primary has and the mirror lacks: trust versions (each verified as the
 * successor of the one before, from o->trust), every model's versions (the archive downloaded,
 * resuming with Range, its size and sha256 checked, its signatures verified under the walked
 * policy as the server does on upload, then written as an upload is: temporary file, fsync,
 * link, fsync of the directory, then the row) and every channel's records in seq order (the
 * bytes the primary stored, each verified as the server verifies a record put to it; an old
 * one may have expired), and every dataset (its bytes' sha256 and a release key's signature
 * naming it, checked as kiln data pull checks them, then stored as an upload is). Each item copied writes one audit row, action "mirror.sync". An
 * item that does not verify is passed to on_problem, not copied, and the rest is copied:
 * the result is then KILN_ERR_VERIFY. A version the mirror holds with another digest than
 * the primary now lists is such a problem, never overwritten. Safe beside a running
 * `kiln registry serve` of the same store (it needs no server lock: SQLite transactions);
 * one sync per store at a time (DIR/mirror.lock, which gc waits for). Interrupted at any
 * point, the next sync resumes: a partial download from where it stopped. */
kiln_err kiln_registry_mirror_sync(const kiln_registry_mirror_opts *o,
                                   kiln_registry_mirror_result *res) KILN_MUST_CHECK;

/* ---- channels (channel.c) ---- */

typedef struct kiln_registry_promote_opts {
    const char *model, *channel, *version;
    const kiln_sign_seckey *const *keys; /* promote keys: each signs the record */
    size_t nkeys;
    int64_t expires_in;  /* seconds the record holds; 0: 30 days */
    const char *reason;  /* NULL: "promote" ("rollback" for a rollback) */
    const char *digest;  /* NULL, or "[sha256:]<hex>": refuse unless the registry holds it */
    const char *save_to; /* NULL: put the record; else write it there (to co-sign), put nothing */
    uint64_t expect_seq; /* 0, or refuse unless the channel's current record has this seq */
} kiln_registry_promote_opts;

typedef struct kiln_registry_promoted {
    kiln_digest digest; /* the version's, as the registry holds it */
    uint64_t seq;                /* the new record's */
    size_t nsigs;
    bool put; /* the registry accepted it (false with save_to) */
} kiln_registry_promoted;

/* Point a channel at a version: fetch the channel's current record (none: seq 0) and the
 * version's digest, sign the record with seq+1 by every key, and put it (the server checks
 * the channel's threshold) or save it. */
kiln_err kiln_registry_promote(const kiln_registry_client_opts *c,
                               const kiln_registry_promote_opts *o, kiln_registry_promoted *out);

typedef struct kiln_registry_renew_opts {
    const char *model, *channel;
    const char *trust; /* the trust policy the current record must verify under (walked) */
    const char *state; /* NULL: the default; its accepted seq bounds the current record's */
    const kiln_sign_seckey *const *keys;
    size_t nkeys;
    int64_t expires_in;  /* 0: 30 days */
    const char *save_to; /* as for promote */
} kiln_registry_renew_opts;

/* Re-sign the channel's current version with a new expiry (reason "renew"): the current
 * record is fetched and verified first (its signatures reach the channel's threshold under
 * the trust policy walked from o->trust, it names this model and channel, its seq is not
 * below the one the state accepted: a registry cannot get an older version renewed), and
 * the new record names its version and digest at its seq + 1 (refused if the channel moved
 * meanwhile). An expired current record may be renewed: that is what it is for. version
 * gets the version renewed and *was_expires the old record's expiry. */
kiln_err kiln_registry_renew(const kiln_registry_client_opts *c, const kiln_registry_renew_opts *o,
                             kiln_registry_promoted *out, char version[KILN_REGISTRY_NAME_MAX + 1],
                             int64_t *was_expires);

/* The version the channel pointed at before its current one, from its history (what
 * kiln rollback goes back to); KILN_ERR_NOTFOUND if it never pointed at another. */
kiln_err kiln_registry_previous_version(const kiln_registry_client_opts *c, const char *model,
                                        const char *channel, char out[KILN_REGISTRY_NAME_MAX + 1]);
/* The same from the history's records verified on the client: each record's signatures must
 * reach the channel's threshold under the policy walked from trust (state: as for a pull),
 * the newest must be a record of this model and channel with a seq not below the one the
 * state accepted, and the version found is the newest verified record's before it that names
 * another (want NULL) or names want; digest gets that record's digest ("sha256:<hex>") to pin
 * the rollback to. A history whose newest record does not verify is KILN_ERR_VERIFY: nothing
 * to roll back from that a client would trust; want as the current version is KILN_ERR_USAGE,
 * and want in no verified record before it KILN_ERR_NOTFOUND (no signed digest for it). */
kiln_err kiln_registry_previous_version_verified(const kiln_registry_client_opts *c,
                                                 const char *model, const char *channel,
                                                 const char *want, const char *trust,
                                                 const char *state,
                                                 char out[KILN_REGISTRY_NAME_MAX + 1],
                                                 kiln_digest digest);

#ifdef __cplusplus
}
#endif
#endif /* KILN_REGISTRY_H */

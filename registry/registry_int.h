/* registry_int.h - helpers shared inside registry/: the SQLite store, the blob store,
 * the store lock, and the verification steps that sign/ and export/ carry out. */
#ifndef KILN_REGISTRY_INT_H
#define KILN_REGISTRY_INT_H

#include <sodium.h>
#include <sqlite3.h>

#include "core.h"
#include "registry.h"
#include "sign.h"
#include "web.h"

#define REG_RECORD_MAX (64u * 1024u) /* a channel record's text */
#define REG_SIG_MAX (32u * 1024u)    /* an archive's signature file (several signers' blocks) */
#define REG_JSON_MAX (16u * 1024u * 1024u) /* a JSON answer the client accepts */
#define REG_TRUST_MAX (1u << 20)           /* a signed trust policy's text */
/* The most of an archive's validation.json the registry keeps byte for byte (a report is a
 * few KiB); a larger one is kept as its summary only. */
#define REG_VALIDATION_MAX (1u << 20)

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

/* ---- verification (verify.c) ----
 *
 * Archives are verified by sign/ (kiln_sign_verify_archive_sigs on upload,
 * kiln_sign_verify_archive on pull: signatures, comments naming the manifest, the policy's
 * release threshold and unvalidated rule, then a secure unpack checking every file) and
 * channel records by sign/ too; what is here is only what the registry adds around them. */

/* What the registry stores about an archive: its manifest (name, version, files),
 * card.json, a summary of the validation report the manifest names and the report's bytes.
 * New references (NULL if absent). */
typedef struct reg_archive_meta {
    json_t *manifest, *card, *validation;
    /* validation.json's exact bytes (checked against the manifest), NULL when the archive has
     * none, or one over REG_VALIDATION_MAX, or one that is not UTF-8 text without NUL bytes
     * (the version's JSON serves it as a string). */
    char *validation_text;
    size_t validation_len;
    char name[KILN_REGISTRY_NAME_MAX + 1];
    char version[KILN_REGISTRY_NAME_MAX + 1];
    uint8_t manifest_sha256[KILN_SHA256_BYTES];
} reg_archive_meta;
kiln_err reg_archive_meta_read(const char *archive, reg_archive_meta *m);
/* The same from what kiln_archive_inspect_with read: man (borrowed), card and the
 * validation.json bytes vtext (vlen; NULL: none) taken, freed on failure too. archive names
 * it in messages. */
kiln_err reg_archive_meta_take(const char *archive, const struct kiln_manifest *man, json_t *card,
                               char *vtext, size_t vlen, reg_archive_meta *m);
void reg_archive_meta_release(reg_archive_meta *m);

/* Who signed an archive, as "name, name (validation passed)" for messages and answers. */
void reg_signers_text(const kiln_sign_archive_report *rep, char *out, size_t len);

/* Rewrite the current error message with every occurrence of path replaced by label (the
 * server verifies an unnamed upload through /proc/self/fd/N, which means nothing to the
 * client reading the message). Returns rc. */
kiln_err reg_relabel(kiln_err rc, const char *path, const char *label);

/* A channel record's fields, once its signatures met the policy's threshold for it. */
typedef struct reg_record {
    char model[KILN_REGISTRY_NAME_MAX + 1];
    char channel[KILN_REGISTRY_NAME_MAX + 1];
    char version[KILN_REGISTRY_NAME_MAX + 1];
    char digest[72]; /* "sha256:<hex>" */
    int64_t seq;
    int64_t expires; /* unix seconds */
    char reason[256];
} reg_record;
/* The record's signatures reach t's threshold for its channel (sign/); seq and expiry are
 * the caller's to check, in its own order. */
/* KILN_ERR_VERIFY, naming what ("the version channel record demo@production names") and the
 * reason, when the policy withdrew the archive digest ("sha256:<hex>"); KILN_OK otherwise
 * (t NULL too). A record naming a withdrawn archive still verifies (reg_record_verify): it
 * may be rolled back from; what may not happen is installing it or a channel moving to it. */
kiln_err reg_withdrawn(const kiln_sign_trust *t, const char *digest, const char *what);
kiln_err reg_record_verify(const kiln_sign_trust *t, const char *text, size_t len,
                           const char *label, reg_record *out) KILN_MUST_CHECK;

/* ---- the client (client.c) ---- */

/* Fetch blob hex, size bytes declared, into partial, resuming what is there with Range;
 * a server that sends more than size is cut off (KILN_ERR_VERIFY). The digest is the
 * caller's to check. */
kiln_err reg_download(const kiln_registry_client_opts *c, const char *hex, uint64_t size,
                      const char *partial);

/* ---- a download read as it lands (stream.c) ---- */

/* How far a partial download is written, for a thread that reads it meanwhile. */
typedef struct reg_follow reg_follow;
kiln_err reg_follow_new(reg_follow **out); /* reg_follow_free */
void reg_follow_free(reg_follow *f);
void reg_follow_grow(reg_follow *f, uint64_t have); /* the first have bytes are written */
void reg_follow_reset(reg_follow *f);               /* called before the file is truncated */
void reg_follow_end(reg_follow *f, bool complete);  /* complete: all declared bytes written */
/* reg_download, telling f (may be NULL) how far it wrote, and ending it. */
kiln_err reg_download_follow(const kiln_registry_client_opts *c, const char *hex, uint64_t size,
                             const char *partial, reg_follow *f);

/* What the follower found. */
typedef struct reg_stream_result {
    bool hashed; /* the digests are of the whole declared size, read once after the last reset */
    uint8_t sha256[KILN_SHA256_BYTES];
    uint8_t blake2b[64];
    uint64_t bytes;
    /* With a staged directory: the unpack's outcome. unpacked: staged holds every file of
     * the manifest (expect's text, byte for byte) checked, from the bytes hashed; the
     * manifest (the caller frees) then set. Otherwise staged does not exist. */
    bool unpacked;
    kiln_err unpack_rc;
    char unpack_msg[1024];
    struct kiln_manifest *manifest;
    /* reg_stream_start_meta's: inspected, meta holds the archive's metadata (its manifest
     * expect's text, byte for byte; the caller releases it) and manifest is set, both read
     * from the bytes hashed. Otherwise meta is empty (unpack_rc and unpack_msg say why when
     * the reading failed). */
    bool inspected;
    reg_archive_meta meta;
} reg_stream_result;
typedef struct reg_stream reg_stream;
/* A thread that follows partial (size bytes declared) through f, hashing every byte (SHA-256,
 * BLAKE2b-512) and, with expect, unpacking it as it lands into staged (which must not exist;
 * kiln_archive_unpack_source, every limit, the manifest entry byte for byte expect's text).
 * label names the archive in messages. partial, label, staged and expect must outlive it. */
kiln_err reg_stream_start(reg_follow *f, const char *partial, uint64_t size, const char *label,
                          const char *staged, const struct kiln_manifest *expect, reg_stream **out);
/* The same for a mirror's sync, which stores an archive without unpacking it: with expect,
 * the archive's manifest (held to expect), card and, with report, validation.json read as it
 * lands (kiln_archive_inspect_source, reg_archive_meta_take), the rest hashed, so that each
 * byte is read once and decompressed at most once. */
kiln_err reg_stream_start_meta(reg_follow *f, const char *partial, uint64_t size, const char *label,
                               const struct kiln_manifest *expect, bool report, reg_stream **out);
/* Wait for it (ending f if the download did not) and free it; *res its findings. */
void reg_stream_join(reg_stream *s, reg_stream_result *res);

/* Remove a tree without following symlinks (best effort: cleanup paths). NULL is fine. */
void reg_rmtree(const char *path);

/* The public kiln_pull_result (include/kiln.h) of a pull: kiln_pull's and kiln_watch's. */
void reg_pull_result(const kiln_registry_pulled *r, kiln_pull_result *out);

/* The state directory when none is given: $HOME/.local/state/kiln; caller frees. */
char *reg_default_state(void);
/* A deferred pull's state (kiln_registry_pull_opts.defer_state) made the state of
 * model/channel (commit: renamed over CHANNEL.json, the directory synced) or dropped. */
kiln_err reg_state_settle(const char *state, const char *model, const char *channel, bool commit);
/* GET path's body as text (at most limit bytes; caller frees *text), with retries; HTTP
 * errors as kiln_registry_get_json maps them. */
kiln_err reg_get_text(const kiln_registry_client_opts *c, const char *path, size_t limit,
                      char **text, size_t *len);
/* PUT body (JSON) at path, once; *answer (may be NULL) is the parsed answer. */
kiln_err reg_put_text(const kiln_registry_client_opts *c, const char *path, const char *body,
                      size_t len, json_t **answer);
/* The last seq this client accepted for model/channel (STATE/channels/MODEL/CHANNEL.json;
 * state NULL: the default); 0 and *known false when none. */
kiln_err reg_channel_state(const char *state, const char *model, const char *channel, int64_t *seq,
                           bool *known);
/* A channel that no registry has (several: more than one was asked): KILN_ERR_VERIFY when
 * this client accepted a record of it before (a registry that no longer has it is refused as
 * a rollback would be), else KILN_ERR_NOTFOUND saying so. Never a reason to read the name as
 * a version (kiln_registry_looks_like_version). Always a failure. */
kiln_err reg_channel_missing(const char *state, const char *model, const char *channel,
                             bool several);
/* A model directory a pull of model@channel installed (dir), checked without a registry
 * against what that pull kept in state (STATE/channels/MODEL/CHANNEL.json; state NULL: the
 * default): the kept record's signatures reach trust's threshold, it names model@channel, it
 * is the one this client accepted last (the state's seq) and has not expired; the kept
 * archive signatures verify under trust with comments naming the directory's manifest
 * (kiln_sign_verify_manifest_sigs: release keys, threshold, unvalidated rule); that manifest
 * is model@ the record's version; every file matches it and there is no other
 * (kiln_manifest_verify_dir). *record (caller frees) is the record's text and *rec it parsed;
 * info (may be NULL) gets the rest of what was checked (its trust_version is the caller's).
 * want (may be NULL): the record text the channel has now; a kept record that is another is
 * KILN_ERR_NOTFOUND before any file is hashed.
 * Not checked, for want of the archive: that its bytes are those the record's digest names
 * (the record binds the archive, the release keys' signed comments bind the manifest).
 * KILN_ERR_NOTFOUND when state keeps no such pull, KILN_ERR_VERIFY naming a failed check. */
kiln_err reg_installed_verify(const kiln_sign_trust *trust, const char *state, const char *model,
                              const char *channel, const char *dir, const char *want,
                              char **record, reg_record *rec,
                              kiln_registry_installed *info) KILN_MUST_CHECK;
/* A pull's checks 1-3 of a channel record: its signatures reach trust's threshold for the
 * channel, it names model and channel, its seq is not below last (when known; *stale, may be
 * NULL, says that was the failure), it has not expired. KILN_ERR_VERIFY naming the failure. */
kiln_err reg_record_accept(const kiln_sign_trust *trust, const char *record, size_t len,
                           const char *model, const char *channel, int64_t last, bool known,
                           reg_record *rec, bool *stale) KILN_MUST_CHECK;
/* kiln_registry_pull under a policy the caller walked already (kiln_watch walks it once per
 * poll). */
kiln_err reg_pull_with_trust(const kiln_registry_client_opts *c, const kiln_registry_pull_opts *p,
                             const kiln_sign_trust *trust, kiln_registry_pulled *res)
    KILN_MUST_CHECK;

/* ---- limits (client.c) ---- */

/* An operation starts (a pull, a watch's poll, a mirror's sync): each of c[0..n) gets until_ns
 * from its deadline_ms (0: the default), now. */
void reg_deadline_start(kiln_registry_client_opts *c, size_t n);
/* The largest archive c accepts (max_size, or the default). */
uint64_t reg_max_size(const kiln_registry_client_opts *c);
/* The most an archive of manifest m can be, packed as kiln pack packs it (a ustar header, a
 * pax record and padding per entry, manifest.json first, the end blocks, zstd's worst case):
 * with the manifest's sizes signed, a bound on the archive that is signed too. UINT64_MAX
 * when the sum overflows. */
struct kiln_manifest;
uint64_t reg_archive_bound(const struct kiln_manifest *m);
/* The size a registry declares for an archive, checked before its download starts: at most
 * c's max_size (KILN_ERR_LIMIT) and, when signed is not UINT64_MAX, at most the bound the
 * signed manifest allows (KILN_ERR_VERIFY). label names the archive. */
kiln_err reg_size_accept(const kiln_registry_client_opts *c, uint64_t size, uint64_t signed_bound,
                         const char *label) KILN_MUST_CHECK;
/* The manifest the release keys signed for model@version, parsed (the caller frees): the
 * registry's copy (ver's "manifest", canonical) verified against the archive's signatures sig
 * under t (kiln_sign_verify_manifest_sigs: release keys, threshold, comments naming it and
 * model@version); NULL when that cannot be established (no manifest, signatures that do not
 * verify: the full check after the download refuses those in its own words). Its
 * reg_archive_bound bounds the archive's size before a byte is downloaded. */
struct kiln_manifest *reg_signed_manifest(const json_t *ver, const char *sig,
                                          const kiln_sign_trust *t, const char *model,
                                          const char *version);

/* ---- several registries (failover.c) ---- */

/* The registries of one pull or watch poll, in order. */
typedef struct reg_registries {
    kiln_registry_client_opts *c; /* each with retries 0 when there are several */
    size_t n;
    bool *down; /* did not answer during this pull: not asked again by it */
    kiln_registry_note note;
    void *ctx;
    /* Why each registry was passed over during this pull ("URL1: why; URL2: why"), for the
     * error when none served. */
    char why[4096];
    size_t why_len;
    bool why_verify; /* one served something that did not verify */
    kiln_err why_last;
    /* Set by reg_newest_record when it found no record because every registry that served
     * one served a record older than this client accepted (stale mirrors; the others did not
     * answer): nothing wrong was served, the newest is just out of reach. */
    bool only_stale;
} reg_registries;
/* Copy cs[0..n) (the URLs and tokens stay the caller's); release with reg_registries_release. */
kiln_err reg_registries_init(reg_registries *r, const kiln_registry_client_opts *cs, size_t n,
                             kiln_registry_note note, void *ctx);
void reg_registries_release(reg_registries *r);
/* The registries of kiln_pull_opts (registry, then registries[]) as client options with
 * token; *cs: caller frees (the strings stay o's). */
kiln_err reg_pull_opts_clients(const kiln_pull_opts *o, kiln_registry_client_opts **cs, size_t *n);
/* Forget which registries did not answer and why (each watch poll starts afresh). */
void reg_registries_reset(reg_registries *r);
kiln_err reg_trust_walk_regs(reg_registries *r, const char *trust, const char *state,
                             void (*on_step)(void *ctx, const kiln_registry_trust_step *s),
                             void *ctx, kiln_sign_trust **out) KILN_MUST_CHECK;
/* The current record of model/channel with the highest seq that passes reg_record_accept,
 * among the registries that have it: *text (caller frees), *len and *from (its registry's
 * index). KILN_ERR_NOTFOUND when every registry that answered has no such channel (and
 * none failed otherwise); another failure names each registry's reason. */
kiln_err reg_newest_record(reg_registries *r, const kiln_sign_trust *trust, const char *state,
                           const char *model, const char *channel, char **text, size_t *len,
                           size_t *from) KILN_MUST_CHECK;
/* The current record of model/channel as the first registry that has one serves it, unchecked
 * (*text: caller frees; *from its index): what is shown, and flagged, when reg_newest_record
 * finds none that verifies. KILN_ERR_NOTFOUND when none has it, or the last failure. */
kiln_err reg_first_record(reg_registries *r, const char *model, const char *channel, char **text,
                          size_t *len, size_t *from);
/* GET path's JSON (*out: caller json_decrefs) from the first registry that holds it, in order
 * (a version, a model): one
 * that answers 404 does not hold it and the next is asked; one that fails otherwise is passed
 * over (the note says why; one that does not answer is not asked again). *from: the index of
 * the one that answered. KILN_ERR_NOTFOUND ("no registry holds WHAT") when each that answered
 * lacks it; another failure names each registry's reason. With one registry,
 * kiln_registry_get_json and its message, without notes. */
kiln_err reg_get_json_first(reg_registries *r, const char *path, const char *what, json_t **out,
                            size_t *from);
/* reg_pull_with_trust over the registries: the newest record (reg_newest_record), then the
 * archive from the first registry that holds it and verifies (p->record, when given, is used
 * as the record). */
kiln_err reg_pull_regs(reg_registries *r, const kiln_registry_pull_opts *p,
                       const kiln_sign_trust *trust, kiln_registry_pulled *res) KILN_MUST_CHECK;

/* ---- trust versions in the store (trustchain.c) ---- */

/* A version in a URL or a file name: 1 to 16 decimal digits without a leading zero, 1 to
 * 2^53-1. */
bool reg_trust_version_parse(const char *s, uint64_t *v);
/* The stored document of version v (0: the newest), byte for byte; caller frees.
 * KILN_ERR_NOTFOUND when there is none. */
kiln_err reg_trust_get(sqlite3 *db, uint64_t v, char **doc, size_t *len);
/* Store version v's document with one audit row ("trust.put"), in one BEGIN IMMEDIATE
 * transaction; a version stored already is KILN_ERR_CONFLICT. */
kiln_err reg_trust_insert(sqlite3 *db, uint64_t v, const char *doc, size_t len,
                          const char *token);
/* The same with the audit row's action and reason (a mirror's sync: "mirror.sync"). */
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

/* ---- small shared pieces (store.c) ---- */

/* "sha256:<64 hex>" -> hex (65 bytes); false if not of that form. */
bool reg_digest_hex(const char *digest, char hex[KILN_SHA256_HEX]);
/* A version's character set only ([A-Za-z0-9._+-], no ".."), without the naming rule of
 * kiln_registry_check_version: for a version read as a store or a signed record holds it (one
 * stored before the rule), never for one a client reads out of NAME@REF. */
kiln_err reg_check_version_chars(const char *s) KILN_MUST_CHECK;

/* ---- request parsing (server.c): every piece that reads request bytes, exposed for
 * tests/fuzz/http.c ---- */

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
    REG_R_TOKENS,     /* "/v1/tokens" */
    REG_R_UI_HOME,    /* "/" */
    REG_R_UI_MODEL,   /* "/ui/models/{model}" */
    REG_R_UI_CHANNEL, /* "/ui/models/{model}/channels/{channel}" */
    REG_R_UI_AUDIT,   /* "/ui/audit" */
    REG_R_TRUST,         /* "/v1/trust": the newest stored trust version */
    REG_R_TRUST_VERSION, /* "/v1/trust/{N}": N in seg[1] */
    REG_R_UI_TRUST,      /* "/ui/trust" */
    REG_R_UI_VERSION,    /* "/ui/models/{model}/versions/{version}" */
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

#endif

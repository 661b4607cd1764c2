/* registry_common.h - what both sides of the registry share (registry/common/): the naming
 * rule and digests (names.c), the archive metadata and channel record checks around sign/'s
 * verification (verify.c), the HTTP API as its callers use it, a client pulling and a mirror
 * syncing from its primary (http.c, its transfers transfer.c), OCI registries (oci.c, oci_kiln.c,
 * oci_mirror.c), and a download read as it lands (pullstream.c). The server
 * (server_int.h) and the client (client_int.h) each include this and never each other. */
#ifndef KILN_REGISTRY_COMMON_H
#define KILN_REGISTRY_COMMON_H

#include <sodium.h>

#include "core.h"
#include "registry.h"
#include "sign.h"

#define REG_RECORD_MAX (64u * 1024u) /* a channel record's text */
#define REG_SIG_MAX (32u * 1024u)    /* an archive's signature file (several signers' blocks) */
#define REG_JSON_MAX (16u * 1024u * 1024u) /* a JSON answer the client accepts */
#define REG_TRUST_MAX (1u << 20)           /* a signed trust policy's text */
/* The most of an archive's validation.json the registry keeps byte for byte (a report is a
 * few KiB); a larger one is kept as its summary only. */
#define REG_VALIDATION_MAX (1u << 20)

/* ---- names and digests (names.c) ---- */

/* "sha256:<64 hex>" -> hex (65 bytes); false if not of that form. */
/* NAME@X split at its first '@' into model and what, both non-empty and at most
 * KILN_REGISTRY_NAME_MAX bytes; false when REF is not of that shape. Checks no naming rule:
 * the caller says which rules X must follow (kiln_registry_ref_parse for either kind). */
bool reg_ref_split(const char *ref, char model[KILN_REGISTRY_NAME_MAX + 1],
                   char what[KILN_REGISTRY_NAME_MAX + 1]);
bool reg_digest_hex(const char *digest, char hex[KILN_SHA256_HEX]);
/* A version's character set only ([A-Za-z0-9._+-], no ".."), without the naming rule of
 * kiln_registry_check_version: for a version read as a store or a signed record holds it (one
 * stored before the rule), never for one a client reads out of NAME@REF. */
kiln_err reg_check_version_chars(const char *s) KILN_MUST_CHECK;

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
    kiln_digest digest;
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

/* Datasets (kiln data publish, docs/registry.md "Datasets"): signed like a file with kiln sign,
 * by a release key, the trusted comment binding the name and the digest of the bytes:
 * "kiln-dataset/1\tname:NAME\tsha256:HEX" (caller frees; NULL when out of memory). */
char *reg_dataset_comment(const char *name, const char *hex);
/* The dataset at path against its signature file (sig, sig_len; sig_label names it): one
 * signature by a key of t with the release role over the file's bytes, its trusted comment
 * reg_dataset_comment(name, hex), and the file's sha256 hex. KILN_ERR_VERIFY naming what
 * failed; the signer's name into who (who_len bytes). */
kiln_err reg_dataset_verify(const kiln_sign_trust *t, const char *sig, size_t sig_len,
                            const char *sig_label, const char *path, const char *name,
                            const char *hex, char *who, size_t who_len) KILN_MUST_CHECK;

/* Reproduction records (kiln reproduce --sign; docs/formats.md "reproduction record"): the
 * record's canonical JSON text, signed (minisign, ED) by a key with the reproduce role, the
 * trusted comment "kiln-reproduction/1\tdigest:sha256:HEX\tverdict:V". */
#define REG_REPRO_FORMAT "kiln-reproduction/1"
#define REG_REPRO_MAX (16u * 1024u) /* a record document's bytes ({"record", "signature"}) */
/* One record against t: the signature by a key of t holding the reproduce role, over text;
 * text canonical JSON of the format, naming model, version and digest; the comment naming
 * the digest and the record's verdict. *signer the key, *identical the verdict. */
kiln_err reg_repro_verify(const kiln_sign_trust *t, const char *text, const char *sig,
                          const char *label, const char *model, const char *version,
                          const char *digest, const kiln_sign_trust_key **signer,
                          bool *identical) KILN_MUST_CHECK;
/* Of docs (a JSON array of {"record": text, "signature": text}), how many distinct keys among
 * keys[0..nkeys) signed a record that verifies (reg_repro_verify) with the verdict
 * identical. */
int reg_repro_count(const kiln_sign_trust *t, const char *const *keys, size_t nkeys,
                    const json_t *docs, const char *model, const char *version,
                    const char *digest);
/* KILN_ERR_VERIFY when channel of t requires reproduction records (reproduced_by) and docs
 * hold fewer than its threshold for model@version (digest); what names who asks ("a promote",
 * "the pull"). */
kiln_err reg_repro_required(const kiln_sign_trust *t, const char *channel, const json_t *docs,
                            const char *model, const char *version, const char *digest,
                            const char *what);

/* A policy that claims the version of one this side trusts: the same policy (its meaning:
 * layout and signatures may differ), or two versions of one number exist, a fork. Returns
 * KILN_ERR_VERIFY with the message naming both labels and the first difference. */
kiln_err reg_trust_same_version(const kiln_sign_trust *have, const char *have_label,
                                const kiln_sign_trust *other, const char *other_label);

/* ---- the HTTP API from the calling side (http.c): a client's and a mirror's ---- */

/* libcurl initialised (once per process) and c's URL http://, https://, oci:// or oci+http://
 * (KILN_ERR_USAGE). */
kiln_err reg_client_init(const kiln_registry_client_opts *c);

/* Fetch blob hex, size bytes declared, into partial, resuming what is there with Range;
 * a server that sends more than size is cut off (KILN_ERR_VERIFY). The digest is the
 * caller's to check. */
kiln_err reg_download(const kiln_registry_client_opts *c, const char *hex, uint64_t size,
                      const char *partial);
/* GET path's body as text (at most limit bytes; caller frees *text), with retries; HTTP
 * errors as kiln_registry_get_json maps them. */
kiln_err reg_get_text(const kiln_registry_client_opts *c, const char *path, size_t limit,
                      char **text, size_t *len);
/* PUT body (JSON) at path, once; *answer (may be NULL) is the parsed answer. */
kiln_err reg_put_text(const kiln_registry_client_opts *c, const char *path, const char *body,
                      size_t len, json_t **answer);

struct reg_follow;
/* A download from an absolute URL (reg_url, with the header line auth, may be NULL), as
 * reg_download_follow does it; a redirect is followed without auth (another host never gets
 * the registry's credentials) and resumed there with Range; a redirected URL that answers 4xx
 * (expired) is resolved again through reg_url. hex names the blob in messages. */
kiln_err reg_download_url(const kiln_registry_client_opts *c, const char *reg_url,
                          const char *auth, const char *hex, uint64_t size, const char *partial,
                          struct reg_follow *follow);

/* One request of any method (the OCI client's, oci.c), with the retries, deadline and stall
 * and rate watches of every other: a small body (body, body_len) or a part of a file (file,
 * from file_off, file_len bytes), the answer's body at most limit bytes (0: REG_JSON_MAX).
 * KILN_OK with any HTTP status once one came (the caller judges it; 5xx but 501 and 507
 * retried); a transfer failure otherwise. */
typedef struct reg_http_req {
    const char *method, *url;
    const char *const *headers; /* full header lines */
    size_t nheaders;
    const char *body;
    size_t body_len;
    const char *file;
    uint64_t file_off, file_len;
    size_t limit;
    long timeout_ms; /* 0: the client's timeout_ms (small) or none (a file's) */
    bool once;       /* no retries */
} reg_http_req;
typedef struct reg_http_ans {
    long status;
    char *body; /* NUL-terminated; reg_http_ans_release */
    size_t len;
    long long content_length; /* -1 when not sent */
    char location[4096], www_auth[1024], digest[96], content_type[128], range[64], link[1024];
} reg_http_ans;
kiln_err reg_http_do(const kiln_registry_client_opts *c, const reg_http_req *q, reg_http_ans *a);
void reg_http_ans_release(reg_http_ans *a);
/* The kiln_err and message of an HTTP failure status, as every other request maps it. */
kiln_err reg_http_fail(const char *url, long status, const char *body, size_t len);

/* ---- OCI registries (oci.c: the distribution protocol and its authentication; oci_kiln.c:
 * kiln's objects mapped onto it, docs/registry.md "On an OCI registry") ---- */

/* url is oci://HOST[:PORT]/PREFIX or oci+http://HOST[:PORT]/PREFIX. */
bool reg_oci_url(const char *url);
/* kiln's HTTP routes (GET and PUT of the paths http.c's callers use) answered from an OCI
 * registry: the same bodies the kiln server sends, so every check above stays the caller's.
 * *text: caller frees. */
kiln_err reg_oci_route(const kiln_registry_client_opts *c, const char *method, const char *path,
                       const char *body, size_t body_len, size_t limit, char **text, size_t *len);
kiln_err reg_oci_publish(const kiln_registry_client_opts *c, const char *archive,
                         const char *sig_path, kiln_registry_published *out);
/* kiln_registry_mirror_sync into an OCI registry (o->root an oci:// URL; oci_mirror.c). */
kiln_err reg_oci_mirror_push(const kiln_registry_mirror_opts *o, kiln_registry_mirror_result *res);
kiln_err reg_oci_download(const kiln_registry_client_opts *c, const char *hex, uint64_t size,
                          const char *partial, struct reg_follow *follow);

/* ---- limits (transfer.c) ---- */

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

/* ---- a download read as it lands (pullstream.c) ---- */

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

#endif

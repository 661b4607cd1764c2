/*
 * sign.h - minisign-compatible keys and signatures, the trust policy, signed channel
 * records (docs/formats.md). What the CLI, export/ and registry/ call.
 *
 * Keys and signature files are byte-compatible with minisign: `minisign -V` accepts
 * what kiln_sign_* writes and kiln_sign_verify_* accepts what minisign writes. Secret
 * keys live in sodium_malloc memory (guard pages, mlock'd, wiped on free).
 *
 * Every parser here takes untrusted bytes and has a fuzz entry point (tests/fuzz/).
 * Nothing here prints or exits; failures fill kiln_errmsg().
 */
#ifndef KILN_SIGN_H
#define KILN_SIGN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_SIGN_KEYID_BYTES 8
#define KILN_SIGN_PK_BYTES 32
#define KILN_SIGN_SIG_BYTES 64
#define KILN_SIGN_KEYID_HEX 17  /* 16 uppercase hex digits (as minisign prints) and NUL */
#define KILN_SIGN_PUBKEY_B64 57 /* "RW..." base64 of the 42-byte key, and NUL */
/* Longest trusted comment minisign reads back (its 8192-byte line buffer, less the
 * "trusted comment: " prefix, the newline and the NUL). */
#define KILN_SIGN_TRUSTED_MAX 8173
/* Longest untrusted comment line minisign reads (a 1024-byte buffer). */
#define KILN_SIGN_UNTRUSTED_MAX 1003
/* Key and signature files are small; anything bigger is refused unread. */
#define KILN_SIGN_FILE_LIMIT (64u << 10)
/* A password, as minisign bounds it (bytes, without the terminating NUL). */
#define KILN_SIGN_PASSWORD_MAX 1023
/* minisign's scrypt parameters (crypto_pwhash_scryptsalsa208sha256 *_SENSITIVE). */
#define KILN_SIGN_SCRYPT_OPSLIMIT 33554432ull
#define KILN_SIGN_SCRYPT_MEMLIMIT 1073741824ull

/* 16 uppercase hex digits of the key id read as a little-endian integer, as minisign
 * shows it ("EFAA2D6347AA3999"). */
KILN_API void kiln_sign_keyid_hex(const uint8_t keyid[KILN_SIGN_KEYID_BYTES],
                                  char out[KILN_SIGN_KEYID_HEX]);

/* ---- public keys ---------------------------------------------------------------- */

typedef struct kiln_sign_pubkey {
    uint8_t keyid[KILN_SIGN_KEYID_BYTES];
    uint8_t pk[KILN_SIGN_PK_BYTES]; /* Ed25519 */
} kiln_sign_pubkey;

/* A public key file: "untrusted comment: ..." then the base64 of "Ed" + key id + key.
 * label names the source in messages. */
KILN_API kiln_err kiln_sign_pubkey_parse(const char *buf, size_t len, const char *label,
                                         kiln_sign_pubkey *out);
KILN_API kiln_err kiln_sign_pubkey_load(const char *path, kiln_sign_pubkey *out);
/* The base64 line alone ("RWSZOapHYy2q7zXT..."), as minisign -P takes it. */
KILN_API kiln_err kiln_sign_pubkey_from_base64(const char *b64, const char *label,
                                               kiln_sign_pubkey *out);
KILN_API void kiln_sign_pubkey_base64(const kiln_sign_pubkey *pk, char out[KILN_SIGN_PUBKEY_B64]);
/* The file text minisign writes; caller frees. NULL (NOMEM set) on failure. */
KILN_API char *kiln_sign_pubkey_format(const kiln_sign_pubkey *pk);
/* Write the file (mode 0644); an existing file is refused (KILN_ERR_CONFLICT). */
KILN_API kiln_err kiln_sign_pubkey_save(const kiln_sign_pubkey *pk, const char *path);

/* ---- secret keys ---------------------------------------------------------------- */

/* Opaque; lives in sodium_malloc memory. Free with kiln_sign_seckey_free. */
typedef struct kiln_sign_seckey kiln_sign_seckey;

/* A new random key pair (minisign -G): a random key id, an Ed25519 key. */
KILN_API kiln_err kiln_sign_seckey_generate(kiln_sign_seckey **out);
/* A secret key file, encrypted ("Sc": scrypt, then XOR) or not (KDF bytes zero). An
 * encrypted key stays encrypted until kiln_sign_seckey_decrypt; an unencrypted one is
 * checked (its Ed25519 seed must give its public half; a non-zero checksum must match).
 * The scrypt parameters are bounded so that a hostile file cannot ask for more than
 * 4 GiB. */
KILN_API kiln_err kiln_sign_seckey_parse(const char *buf, size_t len, const char *label,
                                         kiln_sign_seckey **out);
KILN_API kiln_err kiln_sign_seckey_load(const char *path, kiln_sign_seckey **out);
KILN_API bool kiln_sign_seckey_encrypted(const kiln_sign_seckey *sk);
/* Derive the stream with scrypt (slow: about 1 GiB and seconds) and decrypt; a wrong
 * password is KILN_ERR_AUTH and leaves the key encrypted. */
KILN_API KILN_MUST_CHECK kiln_err kiln_sign_seckey_decrypt(kiln_sign_seckey *sk,
                                                           const char *password, size_t pwlen);
/* The public half (fails while the key is encrypted). */
KILN_API kiln_err kiln_sign_seckey_pubkey(const kiln_sign_seckey *sk, kiln_sign_pubkey *out);
/* Write the key file (mode 0600), encrypted with minisign's scrypt parameters when
 * password is not NULL, else unencrypted as minisign -W writes it (KDF bytes and
 * checksum zero). An existing file is refused (KILN_ERR_CONFLICT). The encoded key
 * never leaves guarded memory and is wiped. */
KILN_API kiln_err kiln_sign_seckey_save(const kiln_sign_seckey *sk, const char *path,
                                        const char *password, size_t pwlen);
KILN_API void kiln_sign_seckey_free(kiln_sign_seckey *sk);

/* ---- signatures ----------------------------------------------------------------- */

typedef enum kiln_sign_alg {
    KILN_SIGN_PREHASHED = 0, /* "ED": Ed25519 over BLAKE2b-512 of the message */
    KILN_SIGN_LEGACY = 1     /* "Ed": Ed25519 over the message itself */
} kiln_sign_alg;

/* A parsed signature file. _init before use, _release after. */
typedef struct kiln_sign_sig {
    kiln_sign_alg alg;
    uint8_t keyid[KILN_SIGN_KEYID_BYTES];
    uint8_t sig[KILN_SIGN_SIG_BYTES];
    uint8_t global_sig[KILN_SIGN_SIG_BYTES]; /* over sig || trusted comment */
    char *untrusted_comment;                 /* text after "untrusted comment: " */
    char *trusted_comment;                   /* text after "trusted comment: " */
    char *label;                             /* where it came from, for messages */
} kiln_sign_sig;

KILN_API void kiln_sign_sig_init(kiln_sign_sig *s);
KILN_API void kiln_sign_sig_release(kiln_sign_sig *s);
/* The four lines of a .minisig file; a malformed file's message names the line. */
KILN_API kiln_err kiln_sign_sig_parse(const char *buf, size_t len, const char *label,
                                      kiln_sign_sig *out);
KILN_API kiln_err kiln_sign_sig_load(const char *path, kiln_sign_sig *out);

/* minisign's default trusted comment: "timestamp:<now>\tfile:<basename>\thashed";
 * caller frees. */
KILN_API char *kiln_sign_default_comment(const char *path, int64_t now);
/* Sign bytes; *text is the whole .minisig file (caller frees). The trusted comment is
 * one line of valid text (no CR or LF, at most KILN_SIGN_TRUSTED_MAX bytes). */
KILN_API kiln_err kiln_sign_buffer(const kiln_sign_seckey *sk, const void *msg, size_t len,
                                   const char *trusted_comment, kiln_sign_alg alg, char **text);
/* Sign a file, prehashed and streamed (any size); *text as above. */
KILN_API kiln_err kiln_sign_file(const kiln_sign_seckey *sk, const char *path,
                                 const char *trusted_comment, char **text);

/* Check, in minisign's order, the key id, the signature over the message and the global
 * signature over the trusted comment; KILN_ERR_VERIFY with a message that says which
 * failed. msg_label names the signed bytes in messages. */
KILN_API KILN_MUST_CHECK kiln_err kiln_sign_verify_buffer(const kiln_sign_pubkey *pk,
                                                          const kiln_sign_sig *sig, const void *msg,
                                                          size_t len, const char *msg_label);
/* The same for a file (streamed when prehashed; legacy reads at most 1 GiB as minisign). */
KILN_API KILN_MUST_CHECK kiln_err kiln_sign_verify_file(const kiln_sign_pubkey *pk,
                                                        const kiln_sign_sig *sig, const char *path);

/* ---- the trust policy (trust.json, docs/formats.md) ----------------------------- */

enum {
    KILN_SIGN_ROLE_RELEASE = 1,
    KILN_SIGN_ROLE_PROMOTE = 2,
    KILN_SIGN_ROLE_ROOT = 4,
    KILN_SIGN_ROLE_REPRODUCE = 8 /* signs reproduction records (kiln reproduce --sign) */
};

/* The longest name (keys, models, versions, channels): kiln_sign_name_ok. */
#define KILN_SIGN_NAME_MAX 128
/* A policy file is refused unread beyond this size. */
#define KILN_SIGN_TRUST_FILE_LIMIT (4u << 20)
/* A signed policy holds 1 to this many signatures. */
#define KILN_SIGN_TRUST_MAX_SIGS 32
/* The highest version a policy may have (exact in every JSON reader). */
#define KILN_SIGN_TRUST_VERSION_MAX ((1ull << 53) - 1)

typedef struct kiln_sign_trust_key {
    const char *name;
    kiln_sign_pubkey pub;
    int roles; /* KILN_SIGN_ROLE_* */
} kiln_sign_trust_key;

typedef struct kiln_sign_trust kiln_sign_trust;

/* Strict: unknown keys refused, key names, key ids and public keys unique, every
 * threshold between 1 and the number of promote keys (release_threshold: release keys;
 * root_threshold: root keys, and only with root keys), version 1 to 2^53-1 (default 1).
 * The bytes may also be a signed policy ({"policy": <policy>, "signatures": [...]}): the
 * policy inside is read, and the signatures' syntax checked but not their validity (the file
 * a client is configured with is its root of trust; kiln_sign_trust_update checks a signed
 * version against the version before it). Free with kiln_sign_trust_free. */
KILN_API kiln_err kiln_sign_trust_parse(const char *buf, size_t len, const char *label,
                                        kiln_sign_trust **out);
KILN_API kiln_err kiln_sign_trust_load(const char *path, kiln_sign_trust **out);
KILN_API void kiln_sign_trust_free(kiln_sign_trust *t);
KILN_API size_t kiln_sign_trust_key_count(const kiln_sign_trust *t);
KILN_API const kiln_sign_trust_key *kiln_sign_trust_key_at(const kiln_sign_trust *t, size_t i);
/* The key with this id, or NULL. */
KILN_API const kiln_sign_trust_key *
kiln_sign_trust_find(const kiln_sign_trust *t, const uint8_t keyid[KILN_SIGN_KEYID_BYTES]);
/* How many distinct promote keys must sign a record for the channel; KILN_ERR_NOTFOUND
 * when the policy does not name the channel. */
/* A channel's "reproduced_by" (docs/formats.md): the reproduction records a version needs
 * before a record may point the channel at it, from distinct keys of *keys[0..*nkeys) (names
 * of keys holding the reproduce role). Returns the threshold; 0 (and *nkeys 0) when the channel
 * asks for none or is not in the policy. */
KILN_API int kiln_sign_trust_reproduced_by(const kiln_sign_trust *t, const char *channel,
                                           const char *const **keys, size_t *nkeys);
KILN_API kiln_err kiln_sign_trust_threshold(const kiln_sign_trust *t, const char *channel,
                                            int *out);
/* Archives: how many distinct release keys must sign one ("release_threshold", default 1),
 * and whether one signed with allow-unvalidated may verify ("accept_unvalidated", default
 * false). */
KILN_API int kiln_sign_trust_release_threshold(const kiln_sign_trust *t);
KILN_API bool kiln_sign_trust_accepts_unvalidated(const kiln_sign_trust *t);
/* Archives withdrawn by the policy ("withdrawn": [{"digest", "reason"}]): no client installs
 * one and no registry lets a channel name one, whatever signed it. The reason when digest
 * ("sha256:<hex>") is withdrawn, else NULL. */
KILN_API const char *kiln_sign_trust_withdrawn(const kiln_sign_trust *t, const char *digest);
KILN_API size_t kiln_sign_trust_withdrawn_count(const kiln_sign_trust *t);
/* The i-th withdrawn digest, and its reason into *reason (may be NULL). */
KILN_API const char *kiln_sign_trust_withdrawn_at(const kiln_sign_trust *t, size_t i,
                                                  const char **reason);
/* The policy's version ("version", default 1). */
KILN_API uint64_t kiln_sign_trust_version(const kiln_sign_trust *t);
/* How many distinct root keys must sign the next version ("root_threshold", default 1). */
KILN_API int kiln_sign_trust_root_threshold(const kiln_sign_trust *t);
/* How many keys hold role (one KILN_SIGN_ROLE_* bit). */
KILN_API int kiln_sign_trust_role_count(const kiln_sign_trust *t, int role);
/* The signatures of the signed policy it was read from; 0 for a plain policy. */
KILN_API size_t kiln_sign_trust_signatures(const kiln_sign_trust *t);
/* The policy's channels in the order the file lists them: how many, and the name of the i-th
 * (NULL past the end) with its promote threshold in *threshold. */
KILN_API size_t kiln_sign_trust_channel_count(const kiln_sign_trust *t);
KILN_API const char *kiln_sign_trust_channel_at(const kiln_sign_trust *t, size_t i, int *threshold);
/* Verify a file's signature by a key of the policy that holds role (a release key for
 * archives); *signer (may be NULL) gets the key. */
KILN_API KILN_MUST_CHECK kiln_err kiln_sign_trust_verify_file(const kiln_sign_trust *t,
                                                              const kiln_sign_sig *sig,
                                                              const char *path, int role,
                                                              const kiln_sign_trust_key **signer);

/* ---- signed policies: versions of the trust policy (sign/rotate.c, docs/formats.md) ----
 *
 * A signed policy is {"policy": <a kiln-trust/1 policy>, "signatures": [...]}: 1 to 32
 * minisign signatures (algorithm ED) over the canonical JSON of "policy", each with the
 * trusted comment "kiln-trust/1\tversion:N". A client walks versions forward, accepting each
 * only as the successor of the version it already trusts (kiln_sign_trust_update). */

/* Sign a plain policy (policy, len: the file's bytes) with one key: *text is the signed
 * document (caller frees), *text_len its length. A file that is signed already, or a policy
 * with no root keys (no version could follow it), is refused. */
KILN_API kiln_err kiln_sign_trust_sign(const char *policy, size_t len, const char *label,
                                       const kiln_sign_seckey *sk, char **text, size_t *text_len);
/* Add one key's signature to a signed policy (doc, len); a plain policy is refused, and a
 * second signature by the same key id (KILN_ERR_CONFLICT). *text as above. */
KILN_API kiln_err kiln_sign_trust_add_signature(const char *doc, size_t len, const char *label,
                                                const kiln_sign_seckey *sk, char **text,
                                                size_t *text_len);

/* What kiln_sign_trust_update found, filled as far as it got (also on failure). */
typedef struct kiln_sign_trust_update_result {
    uint64_t from, to;                 /* the versions */
    int old_threshold, new_threshold;  /* root_threshold of each */
    size_t nold, nnew;                 /* distinct root keys of each whose signatures verified */
    size_t nsigs;                      /* signatures read */
    struct {
        char name[KILN_SIGN_NAME_MAX + 1];  /* the key's name (the old version's if in both) */
        char keyid[KILN_SIGN_KEYID_HEX];
        bool old_root, new_root;            /* counted toward the old / the new quorum */
    } sigs[KILN_SIGN_TRUST_MAX_SIGS];
} kiln_sign_trust_update_result;

/* Accept the signed policy in buf as the version after cur. *next (caller frees; NULL on
 * failure) is its policy when: cur has root keys; its version is cur's + 1; every signature
 * parses, is ED, is by a root key of cur or of the new policy, and verifies with that
 * policy's public key for its key id (counting toward that policy's quorum only); each
 * trusted comment is "kiln-trust/1\tversion:N" with N the new version; the new policy has
 * root keys; and the distinct root keys of cur that signed reach cur's root_threshold AND
 * the distinct root keys of the new policy reach its own. Anything else is KILN_ERR_VERIFY
 * (KILN_ERR_FORMAT for bytes that are not a signed policy) with a message that names label
 * and what failed. res may be NULL. */
KILN_API KILN_MUST_CHECK kiln_err kiln_sign_trust_update(const kiln_sign_trust *cur,
                                                         const char *buf, size_t len,
                                                         const char *label, kiln_sign_trust **next,
                                                         kiln_sign_trust_update_result *res);

/* What changed from one policy to another, for reviewers: one line per change ("key 'alice'
 * (ID) removed (promote)", "channel 'production': threshold 2 -> 3", ...), each ending in a
 * newline; "" when nothing but the version changed. Caller frees; NULL when out of memory. */
KILN_API char *kiln_sign_trust_diff(const kiln_sign_trust *from, const kiln_sign_trust *to);

/* ---- the archive's trusted comment (the hook for export/'s .kiln archives) ------- */

/* The verdict of the validation report an archive's manifest names. */
typedef enum kiln_sign_validation {
    KILN_SIGN_VALIDATION_UNSET = 0, /* refused by kiln_sign_archive_comment */
    KILN_SIGN_VALIDATION_PASSED = 1,
    KILN_SIGN_VALIDATION_FAILED = 2,
    KILN_SIGN_VALIDATION_ABSENT = 3 /* no validation.json in the model directory */
} kiln_sign_validation;

/* "passed", "failed", "absent" ("unset" for anything else). */
KILN_API const char *kiln_sign_validation_name(kiln_sign_validation v);

typedef struct kiln_sign_archive_info {
    char model[KILN_SIGN_NAME_MAX + 1];
    char version[KILN_SIGN_NAME_MAX + 1];
    uint8_t manifest_sha256[32];
    kiln_sign_validation validation;
    /* The signer signed although validation is not PASSED; true exactly when it is not. */
    bool allow_unvalidated;
} kiln_sign_archive_info;

/* "kiln-archive/1\tmodel:M\tversion:V\tmanifest:sha256:<hex>\tvalidation:passed", or with
 * "validation:failed" / "validation:absent" followed by "\tallow-unvalidated"; model and
 * version must be names (docs/formats.md). Caller frees; NULL with the message set on failure
 * (an unset verdict, or allow_unvalidated that does not match the verdict). */
KILN_API char *kiln_sign_archive_comment(const kiln_sign_archive_info *info);
/* Parse such a comment strictly (every field, in order, nothing else; allow-unvalidated
 * present exactly when the verdict is not passed); label names its source. */
KILN_API kiln_err kiln_sign_archive_comment_parse(const char *tc, const char *label,
                                                  kiln_sign_archive_info *out);

/* ---- signed archives (sign/archive.c: joins sign/ and export/) -------------------- */

/* An archive's signature file (FILE.kiln.minisig) holds 1 to this many minisign signature
 * blocks, one per release signer, concatenated (docs/formats.md, "signed archive"). */
#define KILN_SIGN_ARCHIVE_MAX_SIGS 32
/* The signature file is refused unread beyond this size. */
#define KILN_SIGN_ARCHIVE_SIGS_LIMIT (1u << 20)

/* Sign a .kiln archive with one key: reads its manifest (export/), refuses (KILN_ERR_VERIFY)
 * an archive whose manifest carries no passing validation report unless allow_unvalidated,
 * and signs the archive's bytes (algorithm ED) with the comment of kiln_sign_archive_comment.
 * *text is one signature block (caller frees); info (may be NULL) gets the comment's fields. */
KILN_API kiln_err kiln_sign_archive(const kiln_sign_seckey *sk, const char *archive_path,
                                    bool allow_unvalidated, char **text,
                                    kiln_sign_archive_info *info);

/* Split a signature file into its blocks and parse each (syntax only). *sigs is new:
 * kiln_sign_archive_sigs_free(*sigs, *n). Messages name label and the block ("signature 2,
 * line 3") when there are several. */
KILN_API kiln_err kiln_sign_archive_sigs_parse(const char *buf, size_t len, const char *label,
                                               kiln_sign_sig **sigs, size_t *n);
KILN_API void kiln_sign_archive_sigs_free(kiln_sign_sig *sigs, size_t n);

/* Append one signature block (sig) to an archive's signature file text (file, len: may be
 * empty). The file must parse, each of its comments must name the same manifest as sig's,
 * and no block may be by sig's key id (KILN_ERR_CONFLICT). *out is new (caller frees). */
KILN_API kiln_err kiln_sign_archive_sigs_add(const char *file, size_t len, const char *label,
                                             const char *sig, char **out);

/* What kiln_sign_verify_archive found; filled as far as it got, also on failure. */
typedef struct kiln_sign_archive_report {
    /* The archive's manifest: name, version, sha256, verdict (allow_unvalidated: the verdict
     * is not passed and the signatures carry the flag). */
    kiln_sign_archive_info info;
    int threshold;   /* distinct release keys the policy asks for */
    size_t nsigs;    /* signature blocks read */
    size_t nsigners; /* distinct release keys whose signatures verified */
    const kiln_sign_trust_key *signers[KILN_SIGN_ARCHIVE_MAX_SIGS]; /* into the policy */
    bool threshold_met;
    bool files_checked; /* the archive was unpacked and every file matched its manifest */
    /* Every block verified over the archive's bytes (step 1): a failure after it is the
     * archive's or a comment's (info.model is "" until the archive's manifest was read). */
    bool sigs_verified;
} kiln_sign_archive_report;

/* Verify a signed archive against a trust policy. sigs/sigs_len is the signature file's text
 * (one or more blocks), sigs_label names it in messages. Checks, failing on the first
 * problem (KILN_ERR_VERIFY, or KILN_ERR_FORMAT for malformed input, with a message naming
 * the signature, key or file):
 *   1. every block is by a key of t holding the release role, is algorithm ED, and verifies
 *      over the archive's bytes (key id, signature, global signature over the comment);
 *   2. every comment parses and names the archive's own manifest: model, version, manifest
 *      sha256 and validation verdict; one made with allow-unvalidated is refused unless the
 *      policy has accept_unvalidated;
 *   3. the distinct key ids that signed reach the policy's release_threshold (a key that
 *      signs twice counts once);
 *   4. the archive unpacks (kiln_archive_unpack: secure, every file's size and sha256) into a
 *      temporary directory beside out_dir (or beside the archive when out_dir is NULL), and
 *      the unpacked manifest is the signed one.
 * With out_dir (which must not exist) the verified directory is renamed there; otherwise it
 * is removed. Nothing is left behind on failure. report may be NULL. */
KILN_API KILN_MUST_CHECK kiln_err kiln_sign_verify_archive(
    const char *archive_path, const char *sigs, size_t sigs_len, const char *sigs_label,
    const kiln_sign_trust *t, const char *out_dir, kiln_sign_archive_report *report);
/* Steps 1 to 3 only (signatures, comments, threshold), without unpacking: for a caller that
 * unpacks later itself and then compares the manifest's sha256 with report->info. */
KILN_API KILN_MUST_CHECK kiln_err kiln_sign_verify_archive_sigs(const char *archive_path,
                                                                const char *sigs, size_t sigs_len,
                                                                const char *sigs_label,
                                                                const kiln_sign_trust *t,
                                                                kiln_sign_archive_report *report);

/* kiln_sign_verify_archive for a caller that computed the archive's BLAKE2b-512 itself, from
 * the bytes as they arrived (a pull hashes while downloading): the signatures are checked
 * against blake2b first, then the archive is unpacked (out_dir) or checked, as above. */
KILN_API KILN_MUST_CHECK kiln_err kiln_sign_verify_archive_prehashed(
    const char *archive_path, const uint8_t blake2b[64], const char *sigs, size_t sigs_len,
    const char *sigs_label, const kiln_sign_trust *t, const char *out_dir,
    kiln_sign_archive_report *report);
/* kiln_sign_verify_archive_sigs with the archive's BLAKE2b-512 computed by the caller (a
 * mirror's download hashes as it lands): the archive's manifest is read only after the
 * signatures verified over blake2b. */
KILN_API KILN_MUST_CHECK kiln_err kiln_sign_verify_archive_sigs_prehashed(
    const char *archive_path, const uint8_t blake2b[64], const char *sigs, size_t sigs_len,
    const char *sigs_label, const kiln_sign_trust *t, kiln_sign_archive_report *report);
/* Steps 1 to 3 over an archive's BLAKE2b-512 computed by the caller (the streaming verify):
 * every block by a release key of t, algorithm ED, verifying over blake2b (key id, signature,
 * global signature), each comment naming m (the manifest the archive's bytes hold: its sha256,
 * model, version, verdict) within the unvalidated rule, the release threshold. where names
 * the archive in messages. A caller that unpacked the archive as it hashed it keeps the
 * result private until this passed. */
struct kiln_manifest;
KILN_API KILN_MUST_CHECK kiln_err kiln_sign_verify_prehashed_sigs(
    const uint8_t blake2b[64], const struct kiln_manifest *m, const char *where, const char *sigs,
    size_t sigs_len, const char *sigs_label, const kiln_sign_trust *t,
    kiln_sign_archive_report *report);

/* Steps 1 to 3 without the archive, for a caller that holds a manifest's text but not the
 * archive's bytes (kiln provenance without --download): the manifest must parse (export/'s
 * strict parser: canonical form only), then every block is by a key of t holding the release
 * role and is algorithm ED, its key id and global signature (over the signature and the
 * trusted comment) verify, each comment names this manifest (its sha256, model, version and
 * verdict) within the unvalidated rule, and the distinct signers reach the release threshold.
 * The signature over the archive's BLAKE2b-512 is NOT checked: there is no archive. What it
 * proves is that the release keys signed comments naming this manifest, not that any archive's
 * bytes are the ones they signed (kiln_sign_verify_archive proves that).
 * report->files_checked stays false. Messages name manifest_label where the others name the
 * archive. */
KILN_API KILN_MUST_CHECK kiln_err kiln_sign_verify_manifest_sigs(
    const char *manifest, size_t manifest_len, const char *manifest_label, const char *sigs,
    size_t sigs_len, const char *sigs_label, const kiln_sign_trust *t,
    kiln_sign_archive_report *report);

/* Who signed, from a report the checks above filled: "name, name (2 of 2 release keys;
 * validation passed)", with ", signed with allow-unvalidated" inside the brackets when the
 * signatures carry that flag; for messages and answers (a pull, kiln release). Cut to len. */
void kiln_sign_signers_text(const kiln_sign_archive_report *rep, char *out, size_t len);

/* ---- channel records (docs/formats.md) ------------------------------------------ */

#define KILN_SIGN_RECORD_MAX_SIGS 32
#define KILN_SIGN_REASON_MAX 1024

/* A record: the body's fields and the signatures (minisig texts over the canonical
 * body). _init before use, _release after. */
typedef struct kiln_sign_record {
    char model[KILN_SIGN_NAME_MAX + 1];
    char channel[KILN_SIGN_NAME_MAX + 1];
    char version[KILN_SIGN_NAME_MAX + 1];
    uint8_t digest[32]; /* sha256 of the .kiln archive */
    uint64_t seq;       /* >= 1, strictly increasing per channel */
    int64_t expires;    /* unix seconds, UTC */
    char *reason;       /* owned, non-empty */
    size_t nsigs;
    char **sigs; /* owned minisig texts */
} kiln_sign_record;

KILN_API void kiln_sign_record_init(kiln_sign_record *r);
KILN_API void kiln_sign_record_release(kiln_sign_record *r);
/* Set the body (copies reason; checks every field); clears any signatures. */
KILN_API kiln_err kiln_sign_record_set(kiln_sign_record *r, const char *model, const char *channel,
                                       const char *version, const uint8_t digest[32], uint64_t seq,
                                       int64_t expires, const char *reason);
/* The canonical body (sorted keys, no white space) that every signature signs; caller
 * frees. */
KILN_API kiln_err kiln_sign_record_body(const kiln_sign_record *r, char **out, size_t *len);
/* Sign the body and append the signature; a second signature by the same key id is
 * refused (KILN_ERR_CONFLICT). */
KILN_API kiln_err kiln_sign_record_add_signature(kiln_sign_record *r, const kiln_sign_seckey *sk);
/* Strict parse of the file: every field and every signature's syntax (not their validity:
 * that needs a trust policy). */
KILN_API kiln_err kiln_sign_record_parse(const char *buf, size_t len, const char *label,
                                         kiln_sign_record *r);
KILN_API kiln_err kiln_sign_record_load(const char *path, kiln_sign_record *r);
/* The file (pretty, sorted keys), written atomically. */
KILN_API kiln_err kiln_sign_record_save(const kiln_sign_record *r, const char *path);
/* The same bytes in memory (what a registry stores and serves); *text is new (caller
 * frees), *len its length. */
KILN_API kiln_err kiln_sign_record_text(const kiln_sign_record *r, char **text, size_t *len);

typedef struct kiln_sign_record_result {
    int threshold;   /* distinct promote keys the channel needs */
    size_t nsigners; /* distinct keys whose signatures verified */
    const kiln_sign_trust_key *signers[KILN_SIGN_RECORD_MAX_SIGS]; /* into the policy */
} kiln_sign_record_result;

/* How a channel record's expiry reads at now, the one rule `kiln models` prints it by and the
 * registry's pages flag it by: EXPIRED when expires <= now, SOON when less than
 * KILN_RECORD_SOON_SECS is left (time to renew), OK otherwise. */
#define KILN_RECORD_SOON_SECS (7 * 86400)
typedef enum kiln_record_expiry {
    KILN_RECORD_EXPIRY_OK,
    KILN_RECORD_EXPIRY_SOON,
    KILN_RECORD_EXPIRY_EXPIRED
} kiln_record_expiry;
kiln_record_expiry kiln_record_expiry_at(int64_t expires, int64_t now);
/* "ok", "expires soon", "expired". */
const char *kiln_record_expiry_name(kiln_record_expiry e);

/* Verify a record against a policy at time now (unix seconds): the channel is in the
 * policy, every signature verifies over the canonical body and is by a promote key of
 * the policy (a key id counts once however often it signs), the distinct signers reach
 * the channel's threshold, now is before expires, and seq >= min_seq (the last seq this
 * client accepted for the channel; 0 for none). res may be NULL. */
KILN_API KILN_MUST_CHECK kiln_err kiln_sign_record_verify(const kiln_sign_record *r,
                                                          const kiln_sign_trust *t, int64_t now,
                                                          uint64_t min_seq, const char *label,
                                                          kiln_sign_record_result *res);

/* ---- helpers the CLI shares -------------------------------------------------------- */

/* Guarded memory for secrets such as passwords (sodium_malloc: guard pages, mlock'd);
 * NULL with KILN_ERR_NOMEM set on failure. kiln_sign_secret_free wipes and frees (NULL
 * is fine). */
KILN_API void *kiln_sign_secret_alloc(size_t n);
KILN_API void kiln_sign_secret_free(void *p);
/* Wipe memory the compiler may not optimise away. */
KILN_API void kiln_sign_wipe(void *p, size_t n);
/* Constant-time equality of two n-byte buffers. */
KILN_API bool kiln_sign_secret_equal(const void *a, const void *b, size_t n);

/* RFC 3339 UTC, exactly "YYYY-MM-DDTHH:MM:SSZ" (what kiln_format_time writes). */
KILN_API kiln_err kiln_sign_parse_time(const char *s, const char *what, int64_t *out);
/* A name: 1..128 of [A-Za-z0-9._+-], starting with a letter or digit. */
KILN_API bool kiln_sign_name_ok(const char *s);

#ifdef __cplusplus
}
#endif
#endif /* KILN_SIGN_H */

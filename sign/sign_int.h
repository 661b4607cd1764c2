/* sign_int.h - helpers shared inside sign/: libsodium start-up, line splitting for the
 * minisign text formats, and the layout of minisign's binary structures. */
#ifndef KILN_SIGN_INT_H
#define KILN_SIGN_INT_H

#include "core.h"
#include "sign.h"

/* minisign's structures, byte for byte (no padding: every member is bytes). */
#define SIGN_ALG_BYTES 2
#define SIGN_PUBKEY_BYTES (SIGN_ALG_BYTES + KILN_SIGN_KEYID_BYTES + KILN_SIGN_PK_BYTES)     /* 42 */
#define SIGN_SIGSTRUCT_BYTES (SIGN_ALG_BYTES + KILN_SIGN_KEYID_BYTES + KILN_SIGN_SIG_BYTES) /* 74  \
                                                                                             */
#define SIGN_SALT_BYTES 32
#define SIGN_SK_BYTES 64
#define SIGN_CHK_BYTES 32
#define SIGN_KEYNUM_SK_BYTES (KILN_SIGN_KEYID_BYTES + SIGN_SK_BYTES + SIGN_CHK_BYTES) /* 104 */
/* sig_alg, kdf_alg, chk_alg, salt, opslimit, memlimit, then keynum_sk */
#define SIGN_SECKEY_BYTES                                                                          \
    (3 * SIGN_ALG_BYTES + SIGN_SALT_BYTES + 16 + SIGN_KEYNUM_SK_BYTES) /* 158 */
#define SIGN_OFF_KDF 2
#define SIGN_OFF_CHKALG 4
#define SIGN_OFF_SALT 6
#define SIGN_OFF_OPS 38
#define SIGN_OFF_MEM 46
#define SIGN_OFF_KEYNUM 54
#define SIGN_OFF_SK (SIGN_OFF_KEYNUM + KILN_SIGN_KEYID_BYTES)
#define SIGN_OFF_CHK (SIGN_OFF_SK + SIGN_SK_BYTES)

#define SIGN_UNTRUSTED_PREFIX "untrusted comment: "
#define SIGN_TRUSTED_PREFIX "trusted comment: "

/* sodium_init once; KILN_ERR_INTERNAL if libsodium cannot start. */
kiln_err sign_init(void);

/* One line of a text file: its bytes without "\n" and without one trailing "\r". */
typedef struct sign_line {
    const char *p;
    size_t len;
} sign_line;

/* Split buf into exactly n lines (the last may lack its "\n"); a NUL byte, a stray CR,
 * too few lines or anything after line n is refused. The message names the line:
 * "'<label>' line N: ..." (or "'<label>': <what>, line N: ..." when what is set). */
kiln_err sign_split_lines(const char *buf, size_t len, const char *label, const char *what,
                          sign_line *lines, int n);
/* A failure naming a line, in the shape above. */
kiln_err sign_line_fail(kiln_err code, const char *label, const char *what, int line,
                        const char *fmt, ...) KILN_PRINTF(5, 6);

/* Decode standard padded base64 of exactly want bytes; false on anything else. */
bool sign_unbase64(const char *b64, size_t b64len, uint8_t *out, size_t want);
/* Encode into a new buffer (malloc, or sodium_malloc when secret); NULL on failure. */
char *sign_base64(const uint8_t *bin, size_t len, bool secret);

/* Write a new file with O_EXCL (refusing an existing one), fsync it and its directory;
 * on failure the partial file is removed. */
kiln_err sign_write_new(const char *path, const void *data, size_t len, int mode);

/* Parse a signature; what != NULL when it is embedded (a record's), naming it in
 * messages ("'rec.json': signature 2, line 3: ..."). */
kiln_err sign_sig_parse_in(const char *buf, size_t len, const char *label, const char *what,
                           kiln_sign_sig *out);

/* Verify a signature over bytes already prehashed or not, given the pubkey. */
kiln_err sign_verify_digest(const kiln_sign_pubkey *pk, const kiln_sign_sig *sig,
                            const uint8_t *msg, size_t len, const char *msg_label);
/* The key id and the global signature (over the signature and the trusted comment) only,
 * not the signature over the message: what can be checked of a signature without the bytes
 * it signed. It proves the key's holder signed that comment (with that signature value),
 * nothing about any message. */
kiln_err sign_verify_comment(const kiln_sign_pubkey *pk, const kiln_sign_sig *sig);

/* The C string of a JSON string without NUL characters, or NULL. kiln_json_parse already
 * refuses "\u0000"; this keeps a string C would cut short from being read shortened
 * should a caller hand in JSON built otherwise. */
const char *sign_json_str(const json_t *j);

/* Every member of obj must be one of allowed (NULL-terminated): KILN_ERR_FORMAT
 * "'label': where: unknown field 'k'" otherwise, or "'label': unknown field 'k'" when
 * where is NULL. */
kiln_err sign_only_fields(const json_t *obj, const char *const *allowed, const char *label,
                          const char *where);

/* The key of the policy that made sig and holds role; KILN_ERR_VERIFY (naming the
 * signature and the key id) when the policy does not know it or it lacks the role. */
kiln_err sign_trust_signer(const kiln_sign_trust *t, const kiln_sign_sig *sig, int role,
                           const kiln_sign_trust_key **out);
/* The label the policy was parsed under. */
const char *sign_trust_label(const kiln_sign_trust *t);

/* A signed document's "signatures" (a channel record's, a signed policy's): a non-empty array
 * of at most max strings, each a minisign signature (syntax only; messages name
 * "signature N"). holder says what holds them in the message ("a record"). */
kiln_err sign_sigs_check(const json_t *sigs, size_t max, const char *label, const char *holder);
/* Sign the canonical text of body (core's kiln_json_canonical), algorithm ED, with the
 * trusted comment tc: what every signature of a signed JSON document is. *sig is the
 * .minisig text (caller frees). */
kiln_err sign_canonical_sign(const json_t *body, const kiln_sign_seckey *sk, const char *tc,
                             char **sig);

/* A trust policy file, plain or signed ({"policy": ..., "signatures": [...]}, the signatures'
 * syntax checked, not their validity). *doc (new reference; NULL: not wanted) is the whole
 * document, *policy (may be NULL) the policy object inside it (the document itself when
 * plain), *sigs (may be NULL) the signatures array (NULL when plain). */
kiln_err sign_trust_read(const char *buf, size_t len, const char *label, json_t **doc,
                         const json_t **policy, const json_t **sigs, kiln_sign_trust **out);
/* "release, promote, root": the names of the role bits in roles, into buf. */
const char *sign_trust_role_names(int roles, char *buf, size_t cap);
/* The policy's channels by index (NULL past the end), with their thresholds. */
size_t sign_trust_channel_count(const kiln_sign_trust *t);
const char *sign_trust_channel_at(const kiln_sign_trust *t, size_t i, int *threshold);

#endif

/* minisign.c - minisign's key and signature formats: parse, write, sign, verify.
 *
 * Public key: "Ed" + key id + Ed25519 key, base64 under an untrusted comment line.
 * Secret key: "Ed" + KDF ("Sc" or zero) + "B2" + salt + opslimit + memlimit (LE64) + the
 * 104 bytes (key id, Ed25519 secret key, BLAKE2b-256 checksum) XORed with an scrypt
 * stream when encrypted. Signature: an untrusted comment, base64 of "ED"/"Ed" + key id
 * + signature, the trusted comment, base64 of the global signature over signature and
 * trusted comment. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "sign_int.h"

struct kiln_sign_seckey {
    uint8_t raw[SIGN_SECKEY_BYTES]; /* the file's structure; keynum_sk decrypted or not */
    bool encrypted;
    char label[256];
};

/* ---- shared helpers -------------------------------------------------------------- */

kiln_err sign_init(void) {
    KILN_FAIL_IF(sodium_init() < 0, KILN_ERR_INTERNAL, "libsodium failed to initialise");
    return KILN_OK;
}

void *kiln_sign_secret_alloc(size_t n) {
    if (sign_init() != KILN_OK) return NULL;
    void *p = sodium_malloc(n);
    if (!p) kiln_fail(KILN_ERR_NOMEM, "out of guarded memory (%zu bytes)", n);
    return p;
}

void kiln_sign_secret_free(void *p) {
    if (p) sodium_free(p);
}

void kiln_sign_wipe(void *p, size_t n) {
    sodium_memzero(p, n);
}

bool kiln_sign_secret_equal(const void *a, const void *b, size_t n) {
    return sodium_memcmp(a, b, n) == 0;
}

static uint64_t le64_load(const uint8_t *p) {
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}

static void le64_store(uint8_t *p, uint64_t x) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(x >> (8 * i));
}

void kiln_sign_keyid_hex(const uint8_t keyid[KILN_SIGN_KEYID_BYTES],
                         char out[KILN_SIGN_KEYID_HEX]) {
    static const char digits[] = "0123456789ABCDEF";
    uint64_t v = le64_load(keyid);
    for (int i = 15; i >= 0; i--, v >>= 4)
        out[i] = digits[v & 15];
    out[16] = 0;
}

kiln_err sign_line_fail(kiln_err code, const char *label, const char *what, int line,
                        const char *fmt, ...) {
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    if (what) return kiln_fail(code, "'%s': %s, line %d: %s", label, what, line, detail);
    return kiln_fail(code, "'%s' line %d: %s", label, line, detail);
}

kiln_err sign_split_lines(const char *buf, size_t len, const char *label, const char *what,
                          sign_line *lines, int n) {
    size_t pos = 0;
    for (int i = 0; i < n; i++) {
        if (pos >= len)
            return sign_line_fail(KILN_ERR_FORMAT, label, what, i + 1,
                                  "missing (the file has only %d line%s)", i, i == 1 ? "" : "s");
        const char *start = buf + pos;
        const char *nl = memchr(start, '\n', len - pos);
        size_t l = nl ? (size_t)(nl - start) : len - pos;
        pos += l + (nl ? 1 : 0);
        if (l > 0 && start[l - 1] == '\r') l--;
        if (memchr(start, 0, l))
            return sign_line_fail(KILN_ERR_FORMAT, label, what, i + 1, "contains a NUL byte");
        if (memchr(start, '\r', l))
            return sign_line_fail(KILN_ERR_FORMAT, label, what, i + 1,
                                  "contains a carriage return");
        lines[i].p = start;
        lines[i].len = l;
    }
    if (pos < len)
        return sign_line_fail(KILN_ERR_FORMAT, label, what, n + 1,
                              "unexpected content after the last line");
    return KILN_OK;
}

bool sign_unbase64(const char *b64, size_t b64len, uint8_t *out, size_t want) {
    size_t got = 0;
    const char *end = NULL;
    /* The exact length first: sodium would stop at out's size and leave the rest. */
    if (b64len != sodium_base64_encoded_len(want, sodium_base64_VARIANT_ORIGINAL) - 1) return false;
    if (sodium_base642bin(out, want, b64, b64len, NULL, &got, &end,
                          sodium_base64_VARIANT_ORIGINAL) != 0)
        return false;
    return got == want && end == b64 + b64len;
}

char *sign_base64(const uint8_t *bin, size_t len, bool secret) {
    size_t n = sodium_base64_encoded_len(len, sodium_base64_VARIANT_ORIGINAL);
    char *s = secret ? sodium_malloc(n) : kiln_malloc(n);
    if (!s) {
        kiln_fail(KILN_ERR_NOMEM, "out of memory encoding base64");
        return NULL;
    }
    sodium_bin2base64(s, n, bin, len, sodium_base64_VARIANT_ORIGINAL);
    return s;
}

kiln_err sign_write_new(const char *path, const void *data, size_t len, int mode) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0 && errno == EEXIST)
        return kiln_fail(KILN_ERR_CONFLICT, "'%s' exists already; refusing to overwrite it", path);
    if (fd < 0) return kiln_fail_errno(KILN_ERR_IO, "cannot create '%s'", path);
    kiln_err rc = KILN_OK;
    const char *p = data;
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, p + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        KILN_CHECK_IF(rc, fail, w < 0, KILN_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
        done += (size_t)w;
    }
    KILN_CHECK_IF(rc, fail, fsync(fd) != 0, KILN_ERR_IO, "cannot sync '%s': %s", path,
                  strerror(errno));
    KILN_CHECK_IF(rc, fail, close(fd) != 0, KILN_ERR_IO, "cannot close '%s': %s", path,
                  strerror(errno));
    fd = -1;
    char *dir = kiln_dirname(path);
    KILN_CHECK_IF(rc, fail, !dir, KILN_ERR_NOMEM, "out of memory");
    rc = kiln_fsync_dir(dir);
    free(dir);
    if (rc == KILN_OK) return KILN_OK;
fail:
    if (fd >= 0) close(fd);
    unlink(path);
    return rc;
}

/* One line that must start with prefix; the rest into a new string. */
static kiln_err comment_line(const sign_line *l, const char *prefix, size_t max, const char *label,
                             const char *what, int line, char **out) {
    size_t pl = strlen(prefix);
    if (l->len < pl || memcmp(l->p, prefix, pl) != 0)
        return sign_line_fail(KILN_ERR_FORMAT, label, what, line, "should start with '%s'", prefix);
    size_t n = l->len - pl;
    if (n > max)
        return sign_line_fail(KILN_ERR_FORMAT, label, what, line,
                              "comment is %zu bytes, more than the %zu minisign reads", n, max);
    if (out) {
        *out = kiln_malloc(n + 1);
        if (!*out) return KILN_ERR_NOMEM;
        memcpy(*out, l->p + pl, n);
        (*out)[n] = 0;
    }
    return KILN_OK;
}

/* ---- public keys ----------------------------------------------------------------- */

static kiln_err pubkey_decode(const char *b64, size_t n, const char *label, const char *what,
                              int line, kiln_sign_pubkey *out) {
    uint8_t raw[SIGN_PUBKEY_BYTES];
    if (!sign_unbase64(b64, n, raw, sizeof raw))
        return sign_line_fail(KILN_ERR_FORMAT, label, what, line,
                              "not the base64 of a %d-byte minisign public key", SIGN_PUBKEY_BYTES);
    if (memcmp(raw, "Ed", 2) != 0)
        return sign_line_fail(KILN_ERR_FORMAT, label, what, line,
                              "unsupported signature algorithm (want 'Ed')");
    memcpy(out->keyid, raw + 2, KILN_SIGN_KEYID_BYTES);
    memcpy(out->pk, raw + 2 + KILN_SIGN_KEYID_BYTES, KILN_SIGN_PK_BYTES);
    return KILN_OK;
}

kiln_err kiln_sign_pubkey_parse(const char *buf, size_t len, const char *label,
                                kiln_sign_pubkey *out) {
    sign_line l[2];
    KILN_TRY(sign_init());
    KILN_TRY(sign_split_lines(buf, len, label, NULL, l, 2));
    KILN_TRY(
        comment_line(&l[0], SIGN_UNTRUSTED_PREFIX, KILN_SIGN_UNTRUSTED_MAX, label, NULL, 1, NULL));
    return pubkey_decode(l[1].p, l[1].len, label, NULL, 2, out);
}

kiln_err kiln_sign_pubkey_load(const char *path, kiln_sign_pubkey *out) {
    char *buf;
    size_t len;
    KILN_TRY(kiln_read_file(path, KILN_SIGN_FILE_LIMIT, &buf, &len));
    kiln_err rc = kiln_sign_pubkey_parse(buf, len, path, out);
    free(buf);
    return rc;
}

kiln_err kiln_sign_pubkey_from_base64(const char *b64, const char *label, kiln_sign_pubkey *out) {
    KILN_TRY(sign_init());
    uint8_t raw[SIGN_PUBKEY_BYTES];
    KILN_FAIL_IF(!sign_unbase64(b64, strlen(b64), raw, sizeof raw), KILN_ERR_FORMAT,
                 "'%s': not the base64 of a %d-byte minisign public key", label, SIGN_PUBKEY_BYTES);
    KILN_FAIL_IF(memcmp(raw, "Ed", 2) != 0, KILN_ERR_FORMAT,
                 "'%s': unsupported signature algorithm (want 'Ed')", label);
    memcpy(out->keyid, raw + 2, KILN_SIGN_KEYID_BYTES);
    memcpy(out->pk, raw + 2 + KILN_SIGN_KEYID_BYTES, KILN_SIGN_PK_BYTES);
    return KILN_OK;
}

void kiln_sign_pubkey_base64(const kiln_sign_pubkey *pk, char out[KILN_SIGN_PUBKEY_B64]) {
    uint8_t raw[SIGN_PUBKEY_BYTES];
    memcpy(raw, "Ed", 2);
    memcpy(raw + 2, pk->keyid, KILN_SIGN_KEYID_BYTES);
    memcpy(raw + 2 + KILN_SIGN_KEYID_BYTES, pk->pk, KILN_SIGN_PK_BYTES);
    sodium_bin2base64(out, KILN_SIGN_PUBKEY_B64, raw, sizeof raw, sodium_base64_VARIANT_ORIGINAL);
}

char *kiln_sign_pubkey_format(const kiln_sign_pubkey *pk) {
    char id[KILN_SIGN_KEYID_HEX], b64[KILN_SIGN_PUBKEY_B64];
    kiln_sign_keyid_hex(pk->keyid, id);
    kiln_sign_pubkey_base64(pk, b64);
    return kiln_asprintf(SIGN_UNTRUSTED_PREFIX "minisign public key %s\n%s\n", id, b64);
}

kiln_err kiln_sign_pubkey_save(const kiln_sign_pubkey *pk, const char *path) {
    char *text = kiln_sign_pubkey_format(pk);
    if (!text) return KILN_ERR_NOMEM;
    kiln_err rc = sign_write_new(path, text, strlen(text), 0644);
    free(text);
    return rc;
}

/* ---- secret keys ----------------------------------------------------------------- */

static kiln_sign_seckey *seckey_alloc(const char *label) {
    kiln_sign_seckey *sk = sodium_malloc(sizeof *sk);
    if (!sk) {
        kiln_fail(KILN_ERR_NOMEM, "out of guarded memory for a secret key");
        return NULL;
    }
    sodium_memzero(sk, sizeof *sk);
    snprintf(sk->label, sizeof sk->label, "%s", label);
    return sk;
}

void kiln_sign_seckey_free(kiln_sign_seckey *sk) {
    if (sk) sodium_free(sk); /* sodium_free wipes */
}

static void seckey_checksum(const kiln_sign_seckey *sk, uint8_t chk[SIGN_CHK_BYTES]) {
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, SIGN_CHK_BYTES);
    crypto_generichash_update(&st, sk->raw, SIGN_ALG_BYTES);
    crypto_generichash_update(&st, sk->raw + SIGN_OFF_KEYNUM, KILN_SIGN_KEYID_BYTES);
    crypto_generichash_update(&st, sk->raw + SIGN_OFF_SK, SIGN_SK_BYTES);
    crypto_generichash_final(&st, chk, SIGN_CHK_BYTES);
    sodium_memzero(&st, sizeof st);
}

/* The plaintext key must be whole: the seed gives the public half stored beside it. */
static kiln_err seckey_check_pair(const kiln_sign_seckey *sk) {
    uint8_t pk[crypto_sign_PUBLICKEYBYTES];
    uint8_t *full = sodium_malloc(crypto_sign_SECRETKEYBYTES);
    if (!full) return kiln_fail(KILN_ERR_NOMEM, "out of guarded memory");
    crypto_sign_seed_keypair(pk, full, sk->raw + SIGN_OFF_SK);
    int same = sodium_memcmp(full, sk->raw + SIGN_OFF_SK, SIGN_SK_BYTES);
    sodium_free(full);
    KILN_FAIL_IF(same != 0, KILN_ERR_FORMAT,
                 "'%s': the secret key is damaged (its seed does not give its public key)",
                 sk->label);
    return KILN_OK;
}

kiln_err kiln_sign_seckey_generate(kiln_sign_seckey **out) {
    *out = NULL;
    KILN_TRY(sign_init());
    kiln_sign_seckey *sk = seckey_alloc("new key");
    if (!sk) return KILN_ERR_NOMEM;
    uint8_t pk[crypto_sign_PUBLICKEYBYTES];
    memcpy(sk->raw, "Ed", 2);
    memcpy(sk->raw + SIGN_OFF_CHKALG, "B2", 2);
    randombytes_buf(sk->raw + SIGN_OFF_KEYNUM, KILN_SIGN_KEYID_BYTES);
    crypto_sign_keypair(pk, sk->raw + SIGN_OFF_SK);
    *out = sk;
    return KILN_OK;
}

kiln_err kiln_sign_seckey_parse(const char *buf, size_t len, const char *label,
                                kiln_sign_seckey **out) {
    *out = NULL;
    sign_line l[2];
    KILN_TRY(sign_init());
    KILN_TRY(sign_split_lines(buf, len, label, NULL, l, 2));
    KILN_TRY(
        comment_line(&l[0], SIGN_UNTRUSTED_PREFIX, KILN_SIGN_UNTRUSTED_MAX, label, NULL, 1, NULL));
    kiln_sign_seckey *sk = seckey_alloc(label);
    if (!sk) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, fail, !sign_unbase64(l[1].p, l[1].len, sk->raw, SIGN_SECKEY_BYTES),
                  KILN_ERR_FORMAT, "'%s' line 2: not the base64 of a %d-byte minisign secret key",
                  label, SIGN_SECKEY_BYTES);
    KILN_CHECK_IF(rc, fail, memcmp(sk->raw, "Ed", 2) != 0, KILN_ERR_FORMAT,
                  "'%s': unsupported signature algorithm (want 'Ed')", label);
    KILN_CHECK_IF(rc, fail, memcmp(sk->raw + SIGN_OFF_CHKALG, "B2", 2) != 0, KILN_ERR_FORMAT,
                  "'%s': unsupported checksum algorithm (want 'B2')", label);
    if (memcmp(sk->raw + SIGN_OFF_KDF, "Sc", 2) == 0) {
        uint64_t ops = le64_load(sk->raw + SIGN_OFF_OPS), mem = le64_load(sk->raw + SIGN_OFF_MEM);
        /* Bounded so that a hostile file cannot make decryption take the machine. */
        KILN_CHECK_IF(
            rc, fail,
            ops < crypto_pwhash_scryptsalsa208sha256_OPSLIMIT_MIN || ops > (1ull << 34) ||
                mem < crypto_pwhash_scryptsalsa208sha256_MEMLIMIT_MIN || mem > (4ull << 30),
            KILN_ERR_FORMAT, "'%s': scrypt parameters out of range (opslimit %llu, memlimit %llu)",
            label, (unsigned long long)ops, (unsigned long long)mem);
        sk->encrypted = true;
    } else {
        static const uint8_t zero[SIGN_CHK_BYTES];
        KILN_CHECK_IF(rc, fail, memcmp(sk->raw + SIGN_OFF_KDF, "\0\0", 2) != 0, KILN_ERR_FORMAT,
                      "'%s': unsupported key derivation function (want 'Sc' or none)", label);
        /* minisign -W leaves the checksum zero; one that is set must match. */
        if (sodium_memcmp(sk->raw + SIGN_OFF_CHK, zero, SIGN_CHK_BYTES) != 0) {
            uint8_t chk[SIGN_CHK_BYTES];
            seckey_checksum(sk, chk);
            int bad = sodium_memcmp(chk, sk->raw + SIGN_OFF_CHK, SIGN_CHK_BYTES);
            sodium_memzero(chk, sizeof chk);
            KILN_CHECK_IF(rc, fail, bad, KILN_ERR_FORMAT,
                          "'%s': the secret key checksum does not match", label);
        }
        KILN_CHECK(rc, fail, seckey_check_pair(sk));
    }
    *out = sk;
    return KILN_OK;
fail:
    kiln_sign_seckey_free(sk);
    return rc;
}

kiln_err kiln_sign_seckey_load(const char *path, kiln_sign_seckey **out) {
    char *buf;
    size_t len;
    *out = NULL;
    KILN_TRY(kiln_read_file(path, KILN_SIGN_FILE_LIMIT, &buf, &len));
    kiln_err rc = kiln_sign_seckey_parse(buf, len, path, out);
    sodium_memzero(buf, len);
    free(buf);
    return rc;
}

bool kiln_sign_seckey_encrypted(const kiln_sign_seckey *sk) {
    return sk->encrypted;
}

/* XOR keynum_sk with the scrypt stream for this salt and these limits. */
static kiln_err seckey_xor_stream(kiln_sign_seckey *sk, const char *pw, size_t pwlen) {
    uint8_t *stream = sodium_malloc(SIGN_KEYNUM_SK_BYTES);
    if (!stream) return kiln_fail(KILN_ERR_NOMEM, "out of guarded memory");
    if (crypto_pwhash_scryptsalsa208sha256(
            stream, SIGN_KEYNUM_SK_BYTES, pw, pwlen, sk->raw + SIGN_OFF_SALT,
            le64_load(sk->raw + SIGN_OFF_OPS), (size_t)le64_load(sk->raw + SIGN_OFF_MEM)) != 0) {
        sodium_free(stream);
        return kiln_fail(KILN_ERR_NOMEM, "'%s': scrypt could not run (out of memory?)", sk->label);
    }
    for (size_t i = 0; i < SIGN_KEYNUM_SK_BYTES; i++)
        sk->raw[SIGN_OFF_KEYNUM + i] ^= stream[i];
    sodium_free(stream);
    return KILN_OK;
}

kiln_err kiln_sign_seckey_decrypt(kiln_sign_seckey *sk, const char *password, size_t pwlen) {
    KILN_FAIL_IF(!sk->encrypted, KILN_ERR_USAGE, "'%s': the secret key is not encrypted",
                 sk->label);
    /* Decrypt a copy, so that a wrong password leaves the key as it was. */
    kiln_sign_seckey *tmp = seckey_alloc(sk->label);
    if (!tmp) return KILN_ERR_NOMEM;
    memcpy(tmp->raw, sk->raw, SIGN_SECKEY_BYTES);
    kiln_err rc = seckey_xor_stream(tmp, password, pwlen);
    if (rc == KILN_OK) {
        uint8_t chk[SIGN_CHK_BYTES];
        seckey_checksum(tmp, chk);
        int bad = sodium_memcmp(chk, tmp->raw + SIGN_OFF_CHK, SIGN_CHK_BYTES);
        sodium_memzero(chk, sizeof chk);
        if (bad)
            rc = kiln_fail(KILN_ERR_AUTH, "'%s': wrong password for the secret key", sk->label);
    }
    if (rc == KILN_OK) rc = seckey_check_pair(tmp);
    if (rc == KILN_OK) {
        memcpy(sk->raw, tmp->raw, SIGN_SECKEY_BYTES);
        sk->encrypted = false;
    }
    kiln_sign_seckey_free(tmp);
    return rc;
}

kiln_err kiln_sign_seckey_pubkey(const kiln_sign_seckey *sk, kiln_sign_pubkey *out) {
    KILN_FAIL_IF(sk->encrypted, KILN_ERR_USAGE, "'%s': the secret key is still encrypted",
                 sk->label);
    memcpy(out->keyid, sk->raw + SIGN_OFF_KEYNUM, KILN_SIGN_KEYID_BYTES);
    memcpy(out->pk, sk->raw + SIGN_OFF_SK + 32, KILN_SIGN_PK_BYTES);
    return KILN_OK;
}

kiln_err kiln_sign_seckey_save(const kiln_sign_seckey *sk, const char *path, const char *password,
                               size_t pwlen) {
    KILN_TRY(sign_init());
    KILN_FAIL_IF(sk->encrypted, KILN_ERR_USAGE, "'%s': the secret key is still encrypted",
                 sk->label);
    kiln_sign_seckey *out = seckey_alloc(sk->label);
    if (!out) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    char *b64 = NULL, *text = NULL;
    memcpy(out->raw, sk->raw, SIGN_SECKEY_BYTES);
    /* Start from the plaintext layout: algorithms, key id and key; KDF fields zero. */
    memcpy(out->raw + SIGN_OFF_KDF, "\0\0", 2);
    sodium_memzero(out->raw + SIGN_OFF_SALT, SIGN_OFF_KEYNUM - SIGN_OFF_SALT);
    sodium_memzero(out->raw + SIGN_OFF_CHK, SIGN_CHK_BYTES);
    if (password) {
        memcpy(out->raw + SIGN_OFF_KDF, "Sc", 2);
        randombytes_buf(out->raw + SIGN_OFF_SALT, SIGN_SALT_BYTES);
        le64_store(out->raw + SIGN_OFF_OPS, KILN_SIGN_SCRYPT_OPSLIMIT);
        le64_store(out->raw + SIGN_OFF_MEM, KILN_SIGN_SCRYPT_MEMLIMIT);
        seckey_checksum(out, out->raw + SIGN_OFF_CHK);
        KILN_CHECK(rc, out, seckey_xor_stream(out, password, pwlen));
    }
    b64 = sign_base64(out->raw, SIGN_SECKEY_BYTES, true);
    KILN_CHECK_IF(rc, out, !b64, KILN_ERR_NOMEM, "out of memory");
    static const char head[] = SIGN_UNTRUSTED_PREFIX "minisign encrypted secret key\n";
    size_t hl = sizeof head - 1, bl = strlen(b64);
    text = sodium_malloc(hl + bl + 1);
    KILN_CHECK_IF(rc, out, !text, KILN_ERR_NOMEM, "out of guarded memory");
    memcpy(text, head, hl);
    memcpy(text + hl, b64, bl);
    text[hl + bl] = '\n';
    rc = sign_write_new(path, text, hl + bl + 1, 0600);
out:
    if (text) sodium_free(text);
    if (b64) sodium_free(b64);
    kiln_sign_seckey_free(out);
    return rc;
}

/* ---- signatures ------------------------------------------------------------------ */

void kiln_sign_sig_init(kiln_sign_sig *s) {
    memset(s, 0, sizeof *s);
}

void kiln_sign_sig_release(kiln_sign_sig *s) {
    free(s->untrusted_comment);
    free(s->trusted_comment);
    free(s->label);
    kiln_sign_sig_init(s);
}

kiln_err sign_sig_parse_in(const char *buf, size_t len, const char *label, const char *what,
                           kiln_sign_sig *out) {
    sign_line l[4];
    uint8_t raw[SIGN_SIGSTRUCT_BYTES];
    kiln_sign_sig_release(out);
    KILN_TRY(sign_init());
    KILN_TRY(sign_split_lines(buf, len, label, what, l, 4));
    kiln_err rc = KILN_OK;
    KILN_CHECK(rc, fail,
               comment_line(&l[0], SIGN_UNTRUSTED_PREFIX, KILN_SIGN_UNTRUSTED_MAX, label, what, 1,
                            &out->untrusted_comment));
    if (!sign_unbase64(l[1].p, l[1].len, raw, sizeof raw)) {
        rc = sign_line_fail(KILN_ERR_FORMAT, label, what, 2,
                            "not the base64 of a %d-byte minisign signature", SIGN_SIGSTRUCT_BYTES);
        goto fail;
    }
    if (memcmp(raw, "ED", 2) == 0) {
        out->alg = KILN_SIGN_PREHASHED;
    } else if (memcmp(raw, "Ed", 2) == 0) {
        out->alg = KILN_SIGN_LEGACY;
    } else {
        rc = sign_line_fail(KILN_ERR_FORMAT, label, what, 2,
                            "unsupported signature algorithm (want 'ED' or 'Ed')");
        goto fail;
    }
    memcpy(out->keyid, raw + 2, KILN_SIGN_KEYID_BYTES);
    memcpy(out->sig, raw + 2 + KILN_SIGN_KEYID_BYTES, KILN_SIGN_SIG_BYTES);
    KILN_CHECK(rc, fail,
               comment_line(&l[2], SIGN_TRUSTED_PREFIX, KILN_SIGN_TRUSTED_MAX, label, what, 3,
                            &out->trusted_comment));
    if (!sign_unbase64(l[3].p, l[3].len, out->global_sig, KILN_SIGN_SIG_BYTES)) {
        rc = sign_line_fail(KILN_ERR_FORMAT, label, what, 4,
                            "not the base64 of a %d-byte global signature", KILN_SIGN_SIG_BYTES);
        goto fail;
    }
    out->label = what ? kiln_asprintf("%s: %s", label, what) : kiln_strdup(label);
    KILN_CHECK_IF(rc, fail, !out->label, KILN_ERR_NOMEM, "out of memory");
    return KILN_OK;
fail:
    kiln_sign_sig_release(out);
    return rc;
}

kiln_err kiln_sign_sig_parse(const char *buf, size_t len, const char *label, kiln_sign_sig *out) {
    return sign_sig_parse_in(buf, len, label, NULL, out);
}

kiln_err kiln_sign_sig_load(const char *path, kiln_sign_sig *out) {
    char *buf;
    size_t len;
    KILN_TRY(kiln_read_file(path, KILN_SIGN_FILE_LIMIT, &buf, &len));
    kiln_err rc = kiln_sign_sig_parse(buf, len, path, out);
    free(buf);
    return rc;
}

char *kiln_sign_default_comment(const char *path, int64_t now) {
    const char *base = strrchr(path, '/');
    return kiln_asprintf("timestamp:%lld\tfile:%s\thashed", (long long)now, base ? base + 1 : path);
}

static kiln_err check_trusted_comment(const char *tc) {
    size_t n = strlen(tc);
    KILN_FAIL_IF(n > KILN_SIGN_TRUSTED_MAX, KILN_ERR_USAGE,
                 "trusted comment is %zu bytes, more than the %d minisign reads", n,
                 KILN_SIGN_TRUSTED_MAX);
    KILN_FAIL_IF(strpbrk(tc, "\r\n") != NULL, KILN_ERR_USAGE,
                 "trusted comment must be one line (no CR or LF)");
    return KILN_OK;
}

/* Sign what minisign signs (the message, or its BLAKE2b-512) and format the file. */
static kiln_err sign_digest(const kiln_sign_seckey *sk, const uint8_t *msg, size_t len,
                            kiln_sign_alg alg, const char *tc, char **text) {
    *text = NULL;
    KILN_FAIL_IF(sk->encrypted, KILN_ERR_USAGE, "'%s': the secret key is still encrypted",
                 sk->label);
    KILN_TRY(check_trusted_comment(tc));
    uint8_t raw[SIGN_SIGSTRUCT_BYTES], global[KILN_SIGN_SIG_BYTES];
    memcpy(raw, alg == KILN_SIGN_LEGACY ? "Ed" : "ED", 2);
    memcpy(raw + 2, sk->raw + SIGN_OFF_KEYNUM, KILN_SIGN_KEYID_BYTES);
    uint8_t *sig = raw + 2 + KILN_SIGN_KEYID_BYTES;
    crypto_sign_detached(sig, NULL, msg, len, sk->raw + SIGN_OFF_SK);
    size_t tcl = strlen(tc);
    uint8_t *both = kiln_malloc(KILN_SIGN_SIG_BYTES + tcl);
    if (!both) return KILN_ERR_NOMEM;
    memcpy(both, sig, KILN_SIGN_SIG_BYTES);
    memcpy(both + KILN_SIGN_SIG_BYTES, tc, tcl);
    crypto_sign_detached(global, NULL, both, KILN_SIGN_SIG_BYTES + tcl, sk->raw + SIGN_OFF_SK);
    free(both);
    char *b1 = sign_base64(raw, sizeof raw, false), *b2 = sign_base64(global, sizeof global, false);
    if (b1 && b2)
        *text =
            kiln_asprintf(SIGN_UNTRUSTED_PREFIX
                          "signature from minisign secret key\n%s\n" SIGN_TRUSTED_PREFIX "%s\n%s\n",
                          b1, tc, b2);
    free(b1);
    free(b2);
    return *text ? KILN_OK : KILN_ERR_NOMEM;
}

kiln_err kiln_sign_buffer(const kiln_sign_seckey *sk, const void *msg, size_t len,
                          const char *trusted_comment, kiln_sign_alg alg, char **text) {
    KILN_TRY(sign_init());
    if (alg == KILN_SIGN_LEGACY) return sign_digest(sk, msg, len, alg, trusted_comment, text);
    uint8_t h[crypto_generichash_BYTES_MAX];
    crypto_generichash(h, sizeof h, msg, len, NULL, 0);
    return sign_digest(sk, h, sizeof h, alg, trusted_comment, text);
}


kiln_err kiln_sign_file(const kiln_sign_seckey *sk, const char *path, const char *trusted_comment,
                        char **text) {
    *text = NULL;
    KILN_TRY(sign_init());
    uint8_t h[crypto_generichash_BYTES_MAX];
    KILN_TRY(kiln_blake2b_file(path, h, sizeof h));
    return sign_digest(sk, h, sizeof h, KILN_SIGN_PREHASHED, trusted_comment, text);
}

static kiln_err verify_keyid(const kiln_sign_pubkey *pk, const kiln_sign_sig *sig, const char *sl) {
    char want[KILN_SIGN_KEYID_HEX], have[KILN_SIGN_KEYID_HEX];
    if (sodium_memcmp(sig->keyid, pk->keyid, KILN_SIGN_KEYID_BYTES) == 0) return KILN_OK;
    kiln_sign_keyid_hex(sig->keyid, have);
    kiln_sign_keyid_hex(pk->keyid, want);
    return kiln_fail(KILN_ERR_VERIFY,
                     "'%s': key id mismatch: signed by key id %s, the public key has key id %s", sl,
                     have, want);
}

/* The global signature: over the signature and the trusted comment. */
static kiln_err verify_global(const kiln_sign_pubkey *pk, const kiln_sign_sig *sig,
                              const char *sl) {
    size_t tcl = strlen(sig->trusted_comment ? sig->trusted_comment : "");
    uint8_t *both = kiln_malloc(KILN_SIGN_SIG_BYTES + tcl);
    if (!both) return KILN_ERR_NOMEM;
    memcpy(both, sig->sig, KILN_SIGN_SIG_BYTES);
    if (tcl) memcpy(both + KILN_SIGN_SIG_BYTES, sig->trusted_comment, tcl);
    int bad = crypto_sign_verify_detached(sig->global_sig, both, KILN_SIGN_SIG_BYTES + tcl, pk->pk);
    free(both);
    KILN_FAIL_IF(bad, KILN_ERR_VERIFY,
                 "'%s': global signature verification failed: the trusted comment or the global "
                 "signature was altered",
                 sl);
    return KILN_OK;
}

kiln_err sign_verify_digest(const kiln_sign_pubkey *pk, const kiln_sign_sig *sig,
                            const uint8_t *msg, size_t len, const char *msg_label) {
    const char *sl = sig->label ? sig->label : "signature";
    KILN_TRY(verify_keyid(pk, sig, sl));
    char want[KILN_SIGN_KEYID_HEX];
    kiln_sign_keyid_hex(pk->keyid, want);
    KILN_FAIL_IF(crypto_sign_verify_detached(sig->sig, msg, len, pk->pk) != 0, KILN_ERR_VERIFY,
                 "'%s': signature verification failed: '%s' is not what key id %s signed "
                 "(the file, the signature or the key was altered)",
                 sl, msg_label, want);
    return verify_global(pk, sig, sl);
}

kiln_err sign_verify_comment(const kiln_sign_pubkey *pk, const kiln_sign_sig *sig) {
    const char *sl = sig->label ? sig->label : "signature";
    KILN_TRY(sign_init());
    KILN_TRY(verify_keyid(pk, sig, sl));
    return verify_global(pk, sig, sl);
}

kiln_err kiln_sign_verify_buffer(const kiln_sign_pubkey *pk, const kiln_sign_sig *sig,
                                 const void *msg, size_t len, const char *msg_label) {
    KILN_TRY(sign_init());
    if (sig->alg == KILN_SIGN_LEGACY) return sign_verify_digest(pk, sig, msg, len, msg_label);
    uint8_t h[crypto_generichash_BYTES_MAX];
    crypto_generichash(h, sizeof h, msg, len, NULL, 0);
    return sign_verify_digest(pk, sig, h, sizeof h, msg_label);
}

kiln_err kiln_sign_verify_file(const kiln_sign_pubkey *pk, const kiln_sign_sig *sig,
                               const char *path) {
    KILN_TRY(sign_init());
    if (sig->alg == KILN_SIGN_PREHASHED) {
        uint8_t h[crypto_generichash_BYTES_MAX];
        KILN_TRY(kiln_blake2b_file(path, h, sizeof h));
        return sign_verify_digest(pk, sig, h, sizeof h, path);
    }
    char *buf;
    size_t len;
    KILN_TRY(kiln_read_file(path, (size_t)1 << 30, &buf, &len));
    kiln_err rc = sign_verify_digest(pk, sig, (const uint8_t *)buf, len, path);
    free(buf);
    return rc;
}

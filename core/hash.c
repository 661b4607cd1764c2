/* hash.c - SHA-256 through OpenSSL's libcrypto, BLAKE2b through libsodium, hex helpers.
 *
 * libsodium's SHA-256 is portable C (0.33 GB/s on the bench machine); libcrypto's uses the
 * CPU's SHA extensions (1.8 GB/s). Every archive byte a pull verifies goes through SHA-256
 * twice (the archive's digest, then each file's), so this is most of a pull's CPU time.
 * The streaming calls are OpenSSL's SHA256_Init/Update/Final: deprecated in 3.0 in favour
 * of EVP, whose context is allocated and whose calls can fail, but the same code underneath;
 * a plain state struct keeps every caller free of error paths. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <sodium.h>
#include <unistd.h>

#include "core.h"

_Static_assert(sizeof(SHA256_CTX) <= sizeof(((kiln_sha256_state *)0)->opaque),
               "kiln_sha256_state is too small for SHA256_CTX");
_Static_assert(_Alignof(SHA256_CTX) <= _Alignof(kiln_sha256_state), "kiln_sha256_state is not aligned for SHA256_CTX");

void kiln_sha256_init(kiln_sha256_state *s) {
    SHA256_Init((SHA256_CTX *)s->opaque);
}

void kiln_sha256_update(kiln_sha256_state *s, const void *data, size_t len) {
    SHA256_Update((SHA256_CTX *)s->opaque, data, len);
}

void kiln_sha256_final(kiln_sha256_state *s, uint8_t out[KILN_SHA256_BYTES]) {
    SHA256_Final(out, (SHA256_CTX *)s->opaque);
    OPENSSL_cleanse(s->opaque, sizeof s->opaque);
}

void kiln_sha256(const void *data, size_t len, uint8_t out[KILN_SHA256_BYTES]) {
    SHA256(data, len, out);
}

/* Feed a file through update() in 64 KiB reads. */
static kiln_err hash_file(const char *path, void (*update)(void *st, const uint8_t *p, size_t n), void *st) {
    int fd;
    KILN_TRY(kiln_open_input(path, &fd, NULL)); /* a FIFO or /dev/zero never ends */
    static _Thread_local uint8_t buf[1 << 16];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR) continue;
            kiln_err rc = kiln_fail_errno(KILN_ERR_IO, "cannot read '%s'", path);
            close(fd);
            return rc;
        }
        if (n == 0) break;
        update(st, buf, (size_t)n);
    }
    close(fd);
    return KILN_OK;
}

static void sha256_update(void *st, const uint8_t *p, size_t n) {
    kiln_sha256_update(st, p, n);
}

static void blake2b_update(void *st, const uint8_t *p, size_t n) {
    crypto_generichash_update(st, p, (unsigned long long)n);
}

kiln_err kiln_sha256_file(const char *path, uint8_t out[KILN_SHA256_BYTES]) {
    kiln_sha256_state st;
    kiln_sha256_init(&st);
    KILN_TRY(hash_file(path, sha256_update, &st));
    kiln_sha256_final(&st, out);
    return KILN_OK;
}

kiln_err kiln_blake2b_file(const char *path, uint8_t *out, size_t outlen) {
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, outlen);
    KILN_TRY(hash_file(path, blake2b_update, &st));
    crypto_generichash_final(&st, out, outlen);
    return KILN_OK;
}

void kiln_blake2b(const void *data, size_t len, uint8_t *out, size_t outlen) {
    crypto_generichash(out, outlen, data, len, NULL, 0);
}

void kiln_hex(const uint8_t *bytes, size_t len, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * len] = 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

bool kiln_unhex(const char *hex, uint8_t *bytes, size_t len) {
    for (size_t i = 0; i < len; i++) {
        int hi = hexval(hex[2 * i]);
        if (hi < 0) return false;
        int lo = hexval(hex[2 * i + 1]);
        if (lo < 0) return false;
        bytes[i] = (uint8_t)(hi << 4 | lo);
    }
    return hex[2 * len] == 0;
}

/* test_sign.c - minisign keys and signatures: known answers from minisign's own files,
 * tampering, key files, guarded secrets. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <sodium.h>

#include "sign.h"
#include "test.h"

static char *slurp(const char *path, size_t *len) {
    char *buf = NULL;
    size_t n = 0;
    if (kiln_read_file(path, 1u << 20, &buf, &n) != KILN_OK) return NULL;
    if (len) *len = n;
    return buf;
}

/* Verify sig text over msg with pk; the error message (or "" when it verified). */
static kiln_err verify_text(const kiln_sign_pubkey *pk, const char *sigtext, size_t siglen,
                            const void *msg, size_t len) {
    kiln_sign_sig s;
    kiln_sign_sig_init(&s);
    kiln_err rc = kiln_sign_sig_parse(sigtext, siglen, "t.minisig", &s);
    if (rc == KILN_OK) rc = kiln_sign_verify_buffer(pk, &s, msg, len, "t.txt");
    kiln_sign_sig_release(&s);
    return rc;
}

KILN_TEST(sign_minisign_vectors_verify) {
    static const struct {
        const char *sig, *tc;
        kiln_sign_alg alg;
    } v[] = {
        {"minisign/msg.txt.minisig", "tc-prehashed", KILN_SIGN_PREHASHED},
        {"minisign/msg.txt.legacy.minisig", "tc-legacy", KILN_SIGN_LEGACY},
        {"minisign/msg.txt.default.minisig", "timestamp:1795982389\tfile:msg.txt\thashed",
         KILN_SIGN_PREHASHED},
    };
    char *pubp = kiln_test_vector("minisign/test.pub"),
         *msgp = kiln_test_vector("minisign/msg.txt");
    kiln_sign_pubkey pk;
    if (!CHECK("test.pub loads", kiln_sign_pubkey_load(pubp, &pk) == KILN_OK)) goto out;
    char id[KILN_SIGN_KEYID_HEX];
    kiln_sign_keyid_hex(pk.keyid, id);
    CHECK("key id as minisign prints it", strcmp(id, "EFAA2D6347AA3999") == 0);
    for (size_t i = 0; i < KILN_ARRAY_LEN(v); i++) {
        char *sp = kiln_test_vector(v[i].sig);
        kiln_sign_sig s;
        kiln_sign_sig_init(&s);
        CHECK("minisign's signature parses", kiln_sign_sig_load(sp, &s) == KILN_OK);
        CHECK("algorithm read", s.alg == v[i].alg);
        CHECK("trusted comment read", s.trusted_comment && strcmp(s.trusted_comment, v[i].tc) == 0);
        CHECK("minisign's signature verifies", kiln_sign_verify_file(&pk, &s, msgp) == KILN_OK);
        kiln_sign_sig_release(&s);
        free(sp);
    }
out:
    free(pubp);
    free(msgp);
}

/* Ed25519 is deterministic: the same key, message and comment give minisign's bytes. */
KILN_TEST(sign_minisign_vectors_reproduce) {
    static const struct {
        const char *sig;
        kiln_sign_alg alg;
    } v[] = {
        {"minisign/msg.txt.minisig", KILN_SIGN_PREHASHED},
        {"minisign/msg.txt.legacy.minisig", KILN_SIGN_LEGACY},
        {"minisign/msg.txt.default.minisig", KILN_SIGN_PREHASHED},
    };
    char *keyp = kiln_test_vector("minisign/test.key"),
         *msgp = kiln_test_vector("minisign/msg.txt");
    char *msg = slurp(msgp, NULL);
    size_t msglen = msg ? strlen(msg) : 0;
    kiln_sign_seckey *sk = NULL;
    if (!CHECK("minisign's unencrypted key loads", kiln_sign_seckey_load(keyp, &sk) == KILN_OK))
        goto out;
    CHECK("not encrypted", !kiln_sign_seckey_encrypted(sk));
    for (size_t i = 0; i < KILN_ARRAY_LEN(v); i++) {
        char *sp = kiln_test_vector(v[i].sig);
        size_t want_len;
        char *want = slurp(sp, &want_len), *got = NULL;
        kiln_sign_sig s;
        kiln_sign_sig_init(&s);
        if (CHECK("vector parses",
                  want && kiln_sign_sig_parse(want, want_len, sp, &s) == KILN_OK)) {
            CHECK("signing bytes works",
                  kiln_sign_buffer(sk, msg, msglen, s.trusted_comment, v[i].alg, &got) == KILN_OK);
            CHECK("same bytes as minisign", got && strcmp(got, want) == 0);
            free(got);
            got = NULL;
            if (v[i].alg == KILN_SIGN_PREHASHED) {
                CHECK("signing the file works",
                      kiln_sign_file(sk, msgp, s.trusted_comment, &got) == KILN_OK);
                CHECK("streamed file signature is minisign's too", got && strcmp(got, want) == 0);
                free(got);
            }
        }
        kiln_sign_sig_release(&s);
        free(want);
        free(sp);
    }
out:
    kiln_sign_seckey_free(sk);
    free(keyp);
    free(msgp);
    free(msg);
}

/* Key files written by kiln are minisign's bytes: the vector's key pair round-trips. */
KILN_TEST(sign_key_files_round_trip) {
    char *keyp = kiln_test_vector("minisign/test.key"),
         *pubp = kiln_test_vector("minisign/test.pub");
    char *kout = kiln_test_path("copy.key"), *pout = kiln_test_path("copy.pub");
    kiln_sign_seckey *sk = NULL;
    kiln_sign_pubkey pk, pk2;
    if (!CHECK("key loads", kiln_sign_seckey_load(keyp, &sk) == KILN_OK)) goto out;
    CHECK("public half", kiln_sign_seckey_pubkey(sk, &pk) == KILN_OK);
    CHECK("public file loads", kiln_sign_pubkey_load(pubp, &pk2) == KILN_OK);
    CHECK("secret key's public half is test.pub", memcmp(&pk, &pk2, sizeof pk) == 0);
    CHECK("unencrypted save", kiln_sign_seckey_save(sk, kout, NULL, 0) == KILN_OK);
    CHECK("pub save", kiln_sign_pubkey_save(&pk, pout) == KILN_OK);
    char *a = slurp(keyp, NULL), *b = slurp(kout, NULL), *c = slurp(pubp, NULL),
         *d = slurp(pout, NULL);
    CHECK("secret key file byte for byte as minisign -W", a && b && strcmp(a, b) == 0);
    CHECK("public key file byte for byte", c && d && strcmp(c, d) == 0);
    struct stat st;
    CHECK("secret key is 0600", stat(kout, &st) == 0 && (st.st_mode & 0777) == 0600);
    CHECK("refuses to overwrite a secret key",
          kiln_sign_seckey_save(sk, kout, NULL, 0) == KILN_ERR_CONFLICT &&
              strstr(kiln_errmsg(), "copy.key") && strstr(kiln_errmsg(), "exists"));
    CHECK("refuses to overwrite a public key",
          kiln_sign_pubkey_save(&pk, pout) == KILN_ERR_CONFLICT);
    char *b2 = slurp(kout, NULL);
    CHECK("existing key left intact", b && b2 && strcmp(b, b2) == 0);
    char b64[KILN_SIGN_PUBKEY_B64];
    kiln_sign_pubkey_base64(&pk, b64);
    CHECK("inline base64 form",
          strcmp(b64, "RWSZOapHYy2q7zXTxbL987oMDpT8r5AkK2m4nBviI9hT6h4CWkywdCKn") == 0);
    CHECK("inline base64 parses back",
          kiln_sign_pubkey_from_base64(b64, "inline", &pk2) == KILN_OK &&
              memcmp(&pk, &pk2, sizeof pk) == 0);
    free(a), free(b), free(b2), free(c), free(d);
out:
    kiln_sign_seckey_free(sk);
    free(keyp), free(pubp), free(kout), free(pout);
}

/* The one real scrypt of the suite (about 1 GiB, seconds): minisign's encrypted key. */
KILN_TEST(sign_minisign_encrypted_key) {
    char *keyp = kiln_test_vector("minisign/encrypted/enc.key");
    char *pubp = kiln_test_vector("minisign/encrypted/enc.pub");
    kiln_sign_seckey *sk = NULL;
    kiln_sign_pubkey pk, want;
    char *sig = NULL;
    if (!CHECK("encrypted key parses", kiln_sign_seckey_load(keyp, &sk) == KILN_OK)) goto out;
    CHECK("reported encrypted", kiln_sign_seckey_encrypted(sk));
    CHECK("no public half while encrypted", kiln_sign_seckey_pubkey(sk, &pk) == KILN_ERR_USAGE);
    CHECK("signing refused while encrypted",
          kiln_sign_buffer(sk, "x", 1, "t", KILN_SIGN_PREHASHED, &sig) == KILN_ERR_USAGE);
    if (!CHECK("decrypts with 'pw'", kiln_sign_seckey_decrypt(sk, "pw", 2) == KILN_OK)) goto out;
    CHECK("pub loads", kiln_sign_pubkey_load(pubp, &want) == KILN_OK);
    CHECK("decrypted key matches enc.pub",
          kiln_sign_seckey_pubkey(sk, &pk) == KILN_OK && memcmp(&pk, &want, sizeof pk) == 0);
    CHECK("signs", kiln_sign_buffer(sk, "hello", 5, "t", KILN_SIGN_PREHASHED, &sig) == KILN_OK);
    CHECK("enc.pub verifies it",
          sig && verify_text(&want, sig, strlen(sig), "hello", 5) == KILN_OK);
out:
    free(sig);
    kiln_sign_seckey_free(sk);
    free(keyp), free(pubp);
}

/* An encrypted key made here with scrypt's smallest parameters: the decrypt path, wrong
 * passwords, without a gigabyte each time. */
KILN_TEST(sign_encrypted_key_wrong_password) {
    kiln_sign_seckey *gen = NULL, *sk = NULL;
    kiln_sign_pubkey pk, pk2;
    char *path = NULL;
    if (!CHECK("generate", kiln_sign_seckey_generate(&gen) == KILN_OK)) return;
    CHECK("public half", kiln_sign_seckey_pubkey(gen, &pk) == KILN_OK);
    char *plain = kiln_test_path("plain.key");
    CHECK("save plain", kiln_sign_seckey_save(gen, plain, NULL, 0) == KILN_OK);
    char *text = slurp(plain, NULL);
    uint8_t raw[158];
    const char *nl = text ? strchr(text, '\n') : NULL;
    size_t got = 0;
    if (!CHECK("decode", nl &&
                             sodium_base642bin(raw, sizeof raw, nl + 1, strcspn(nl + 1, "\n"), NULL,
                                               &got, NULL, sodium_base64_VARIANT_ORIGINAL) == 0 &&
                             got == sizeof raw))
        goto out;
    /* Encrypt by minisign's recipe: checksum, then XOR keynum_sk with scrypt's stream. */
    memcpy(raw + 2, "Sc", 2);
    randombytes_buf(raw + 6, 32);
    uint64_t ops = crypto_pwhash_scryptsalsa208sha256_OPSLIMIT_MIN;
    uint64_t mem = crypto_pwhash_scryptsalsa208sha256_MEMLIMIT_MIN;
    for (int i = 0; i < 8; i++)
        raw[38 + i] = (uint8_t)(ops >> (8 * i)), raw[46 + i] = (uint8_t)(mem >> (8 * i));
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    crypto_generichash_update(&st, raw, 2);
    crypto_generichash_update(&st, raw + 54, 8 + 64);
    crypto_generichash_final(&st, raw + 54 + 72, 32);
    uint8_t stream[104];
    CHECK("scrypt", crypto_pwhash_scryptsalsa208sha256(stream, sizeof stream, "secret", 6, raw + 6,
                                                       ops, mem) == 0);
    for (int i = 0; i < 104; i++)
        raw[54 + i] ^= stream[i];
    char b64[sizeof raw * 2];
    sodium_bin2base64(b64, sizeof b64, raw, sizeof raw, sodium_base64_VARIANT_ORIGINAL);
    char *file = kiln_asprintf("untrusted comment: minisign encrypted secret key\n%s\n", b64);
    path = kiln_test_write("enc.key", file, strlen(file));
    free(file);
    if (!CHECK("loads", kiln_sign_seckey_load(path, &sk) == KILN_OK)) goto out;
    CHECK("encrypted", kiln_sign_seckey_encrypted(sk));
    CHECK("wrong password refused", kiln_sign_seckey_decrypt(sk, "wrong", 5) == KILN_ERR_AUTH);
    CHECK("message names the file and the problem",
          strstr(kiln_errmsg(), "enc.key") && strstr(kiln_errmsg(), "wrong password"));
    CHECK("still encrypted after a wrong password", kiln_sign_seckey_encrypted(sk));
    CHECK("right password works after a wrong one",
          kiln_sign_seckey_decrypt(sk, "secret", 6) == KILN_OK);
    CHECK("same key",
          kiln_sign_seckey_pubkey(sk, &pk2) == KILN_OK && memcmp(&pk, &pk2, sizeof pk) == 0);
out:
    kiln_sign_seckey_free(gen);
    kiln_sign_seckey_free(sk);
    free(plain), free(text), free(path);
}

static void flip(char *s, size_t i) {
    s[i] = s[i] == 'A' ? 'B' : 'A';
}

/* One byte changed in the file, the signature, the trusted comment or the public key:
 * verification fails and the message says which part failed. */
KILN_TEST(sign_tamper_each_part) {
    kiln_sign_seckey *sk = NULL;
    kiln_sign_pubkey pk;
    char *sig = NULL;
    const char msg[] = "model weights, or anything else";
    if (!CHECK("generate", kiln_sign_seckey_generate(&sk) == KILN_OK)) return;
    CHECK("pub", kiln_sign_seckey_pubkey(sk, &pk) == KILN_OK);
    if (!CHECK("sign", kiln_sign_buffer(sk, msg, sizeof msg - 1, "version 7", KILN_SIGN_PREHASHED,
                                        &sig) == KILN_OK))
        goto out;
    size_t n = strlen(sig);
    CHECK("untampered verifies", verify_text(&pk, sig, n, msg, sizeof msg - 1) == KILN_OK);

    char m2[sizeof msg];
    memcpy(m2, msg, sizeof msg);
    m2[3] ^= 1;
    CHECK("changed file fails", verify_text(&pk, sig, n, m2, sizeof msg - 1) == KILN_ERR_VERIFY);
    CHECK("... naming the signature and the file",
          strstr(kiln_errmsg(), "signature verification failed") &&
              strstr(kiln_errmsg(), "t.txt") && strstr(kiln_errmsg(), "t.minisig"));

    const char *l2 = strchr(sig, '\n') + 1, *l3 = strchr(l2, '\n') + 1, *l4 = strchr(l3, '\n') + 1;
    char *t = kiln_strdup(sig);
    flip(t, (size_t)(l2 - sig) + 40); /* inside the Ed25519 signature */
    CHECK("changed signature fails",
          verify_text(&pk, t, n, msg, sizeof msg - 1) == KILN_ERR_VERIFY);
    CHECK("... as a signature failure", strstr(kiln_errmsg(), "signature verification failed") &&
                                            !strstr(kiln_errmsg(), "global"));
    strcpy(t, sig);
    flip(t, (size_t)(l2 - sig) + 6); /* inside the key id */
    CHECK("changed key id fails", verify_text(&pk, t, n, msg, sizeof msg - 1) == KILN_ERR_VERIFY);
    CHECK("... as a key id mismatch", strstr(kiln_errmsg(), "key id mismatch"));
    strcpy(t, sig);
    t[(size_t)(l3 - sig) + strlen("trusted comment: ") + 3] ^= 1;
    CHECK("changed trusted comment fails",
          verify_text(&pk, t, n, msg, sizeof msg - 1) == KILN_ERR_VERIFY);
    CHECK("... as the global signature / trusted comment",
          strstr(kiln_errmsg(), "global signature") && strstr(kiln_errmsg(), "trusted comment"));
    strcpy(t, sig);
    flip(t, (size_t)(l4 - sig) + 20);
    CHECK("changed global signature fails",
          verify_text(&pk, t, n, msg, sizeof msg - 1) == KILN_ERR_VERIFY);
    CHECK("... as the global signature", strstr(kiln_errmsg(), "global signature"));
    strcpy(t, sig);
    t[22] = 'X'; /* the untrusted comment is not signed: minisign ignores it, so do we */
    CHECK("untrusted comment may change", verify_text(&pk, t, n, msg, sizeof msg - 1) == KILN_OK);
    strcpy(t, sig);
    t[(size_t)(l2 - sig) + 1] = 'V'; /* "RU" -> "RV": not an algorithm */
    CHECK("changed algorithm is malformed",
          verify_text(&pk, t, n, msg, sizeof msg - 1) == KILN_ERR_FORMAT);
    CHECK("... naming line 2",
          strstr(kiln_errmsg(), "line 2") && strstr(kiln_errmsg(), "algorithm"));

    /* The public key: its key id, then its Ed25519 key. */
    char *pt = kiln_sign_pubkey_format(&pk);
    kiln_sign_pubkey bad;
    char *pl2 = strchr(pt, '\n') + 1;
    char orig = pl2[6];
    flip(pl2, 6);
    CHECK("tampered key id parses",
          kiln_sign_pubkey_parse(pt, strlen(pt), "k.pub", &bad) == KILN_OK);
    kiln_sign_sig s;
    kiln_sign_sig_init(&s);
    CHECK("sig parses", kiln_sign_sig_parse(sig, n, "t.minisig", &s) == KILN_OK);
    CHECK("public key with another key id fails",
          kiln_sign_verify_buffer(&bad, &s, msg, sizeof msg - 1, "t.txt") == KILN_ERR_VERIFY &&
              strstr(kiln_errmsg(), "key id mismatch"));
    pl2[6] = orig;
    flip(pl2, 30);
    CHECK("tampered key parses", kiln_sign_pubkey_parse(pt, strlen(pt), "k.pub", &bad) == KILN_OK);
    CHECK("public key with another Ed25519 key fails",
          kiln_sign_verify_buffer(&bad, &s, msg, sizeof msg - 1, "t.txt") == KILN_ERR_VERIFY &&
              strstr(kiln_errmsg(), "signature verification failed"));
    kiln_sign_sig_release(&s);
    free(pt);

    /* Every single-byte change after the untrusted comment fails, one way or another. */
    size_t from = (size_t)(l2 - sig), passed = 0;
    for (size_t i = from; i < n; i++) {
        strcpy(t, sig);
        t[i] ^= 0x01;
        if (verify_text(&pk, t, n, msg, sizeof msg - 1) == KILN_OK) passed++;
    }
    CHECK("no single-bit change of the signature lines verifies", passed == 0);
    free(t);
out:
    free(sig);
    kiln_sign_seckey_free(sk);
}

KILN_TEST(sign_malformed_files_name_the_line) {
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"", "line 1: missing"},
        {"untrusted comment: x\n", "line 2: missing"},
        {"comment: x\nRWQ=\nx\nx\n", "line 1: should start with 'untrusted comment: '"},
        {"untrusted comment: x\nRUQAAA==\ntrusted comment: t\nAAAA\n", "line 2: not the base64"},
        {"untrusted comment: x\n"
         "RUSZOapHYy2q7xVFyDrXqlTl7uuhrVxMGytUoP3Ykx7nGqEN7S9gulWAk5pNPYo2nexufxE6TGXGhAwDN13sjH/"
         "7JRIlBKgwLQU=\n"
         "trusted: t\nAAAA\n",
         "line 3: should start with 'trusted comment: '"},
        {"untrusted comment: x\n"
         "RUSZOapHYy2q7xVFyDrXqlTl7uuhrVxMGytUoP3Ykx7nGqEN7S9gulWAk5pNPYo2nexufxE6TGXGhAwDN13sjH/"
         "7JRIlBKgwLQU=\n"
         "trusted comment: t\nAAAA\n",
         "line 4: not the base64"},
        {"untrusted comment: x\n"
         "RUSZOapHYy2q7xVFyDrXqlTl7uuhrVxMGytUoP3Ykx7nGqEN7S9gulWAk5pNPYo2nexufxE6TGXGhAwDN13sjH/"
         "7JRIlBKgwLQU=\n"
         "trusted comment: t\n"
         "laOcwGg/"
         "9sL1EwzFVk19a2G7a1gIpTqQ10NfqNnunsvhXvh9SHdEynaDmPe9UhZuZ9ruTBs9lWQjji7E6BfJBg==\nmore\n",
         "line 5: unexpected content"},
        {"untrusted comment: x\rx\nAAAA\n", "line 1: contains a carriage return"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        kiln_sign_sig s;
        kiln_sign_sig_init(&s);
        kiln_err rc = kiln_sign_sig_parse(bad[i].text, strlen(bad[i].text), "bad.minisig", &s);
        CHECK("malformed signature refused", rc == KILN_ERR_FORMAT);
        CHECK("message names the file", strstr(kiln_errmsg(), "'bad.minisig'") != NULL);
        if (!CHECK("message names the line and problem",
                   strstr(kiln_errmsg(), bad[i].want) != NULL))
            fprintf(stderr, "    case %zu: %s\n", i, kiln_errmsg());
        kiln_sign_sig_release(&s);
    }
    /* CRLF files are read as minisign reads them. */
    char *p = kiln_test_vector("minisign/msg.txt.minisig"), *t = slurp(p, NULL), crlf[1024];
    size_t o = 0;
    for (size_t i = 0; t && t[i] && o + 2 < sizeof crlf; i++) {
        if (t[i] == '\n') crlf[o++] = '\r';
        crlf[o++] = t[i];
    }
    kiln_sign_sig s;
    kiln_sign_sig_init(&s);
    CHECK("CRLF signature parses", kiln_sign_sig_parse(crlf, o, "crlf", &s) == KILN_OK &&
                                       strcmp(s.trusted_comment, "tc-prehashed") == 0);
    kiln_sign_sig_release(&s);
    free(p), free(t);

    kiln_sign_pubkey pk;
    const char *pub =
        "untrusted comment: k\nRWSZOapHYy2q7zXTxbL987oMDpT8r5AkK2m4nBviI9hT6h4CWkywdCK=\n";
    CHECK("bad public key base64 refused",
          kiln_sign_pubkey_parse(pub, strlen(pub), "k.pub", &pk) == KILN_ERR_FORMAT &&
              strstr(kiln_errmsg(), "'k.pub' line 2"));
    kiln_sign_seckey *sk = NULL;
    const char *sec = "untrusted comment: k\nRWQAAEIy\n";
    CHECK("short secret key refused",
          kiln_sign_seckey_parse(sec, strlen(sec), "k.key", &sk) == KILN_ERR_FORMAT && !sk &&
              strstr(kiln_errmsg(), "'k.key' line 2"));
}

KILN_TEST(sign_damaged_unencrypted_key_refused) {
    char *keyp = kiln_test_vector("minisign/test.key");
    size_t n = 0;
    char *t = slurp(keyp, &n);
    if (!CHECK("read", t)) goto out;
    /* A changed seed no longer gives the public half stored with it. */
    char *l2 = strchr(t, '\n') + 1;
    flip(l2, 90);
    kiln_sign_seckey *sk = NULL;
    CHECK("damaged key refused",
          kiln_sign_seckey_parse(t, n, "test.key", &sk) == KILN_ERR_FORMAT && !sk);
    CHECK("... saying so", strstr(kiln_errmsg(), "'test.key'") && strstr(kiln_errmsg(), "damaged"));
out:
    free(t);
    free(keyp);
}

KILN_TEST(sign_refuses_bad_trusted_comment) {
    kiln_sign_seckey *sk = NULL;
    char *sig = NULL;
    if (!CHECK("generate", kiln_sign_seckey_generate(&sk) == KILN_OK)) return;
    CHECK("newline refused",
          kiln_sign_buffer(sk, "x", 1, "a\nb", KILN_SIGN_PREHASHED, &sig) == KILN_ERR_USAGE);
    char *big = kiln_malloc(KILN_SIGN_TRUSTED_MAX + 2);
    memset(big, 'a', KILN_SIGN_TRUSTED_MAX + 1);
    big[KILN_SIGN_TRUSTED_MAX + 1] = 0;
    CHECK("over-long refused",
          kiln_sign_buffer(sk, "x", 1, big, KILN_SIGN_PREHASHED, &sig) == KILN_ERR_USAGE);
    big[KILN_SIGN_TRUSTED_MAX] = 0;
    CHECK("longest accepted",
          kiln_sign_buffer(sk, "x", 1, big, KILN_SIGN_PREHASHED, &sig) == KILN_OK);
    kiln_sign_sig s;
    kiln_sign_sig_init(&s);
    CHECK("and parsed back", sig && kiln_sign_sig_parse(sig, strlen(sig), "s", &s) == KILN_OK &&
                                 strlen(s.trusted_comment) == KILN_SIGN_TRUSTED_MAX);
    kiln_sign_sig_release(&s);
    free(big);
    free(sig);
    kiln_sign_seckey_free(sk);
}

KILN_TEST(sign_secret_memory) {
    char *p = kiln_sign_secret_alloc(32);
    if (!CHECK("guarded allocation", p)) return;
    memcpy(p, "0123456789abcdef0123456789abcdef", 32);
    CHECK("constant-time equal", kiln_sign_secret_equal(p, "0123456789abcdef0123456789abcdef", 32));
    CHECK("constant-time differs",
          !kiln_sign_secret_equal(p, "0123456789abcdef0123456789abcdeF", 32));
    kiln_sign_wipe(p, 32);
    static const char zero[32];
    CHECK("wiped", memcmp(p, zero, 32) == 0);
    kiln_sign_secret_free(p);
    kiln_sign_secret_free(NULL);
}

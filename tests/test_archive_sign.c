/* test_archive_sign.c - signed .kiln archives (sign/archive.c): archives packed here from a
 * small model directory, signed by one or more release keys, verified against a trust
 * policy; the unvalidated-archive rule; and tampering with a file, the manifest, a
 * signature, a trusted comment or a public key, each named in the message. */
#include <archive.h>
#include <archive_entry.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "export.h"
#include "sign.h"
#include "test.h"
#include "testutil.h"

/* ---- fixture: keys, a policy, model directories, archives --------------------------- */

enum { ALICE, BOB, CAROL, EVE, NKEYS }; /* alice, bob: release; carol: promote; eve: unknown */

typedef struct fx {
    kiln_sign_seckey *sk[NKEYS];
    char b64[NKEYS][KILN_SIGN_PUBKEY_B64];
} fx;

static bool fx_init(fx *f) {
    memset(f, 0, sizeof *f);
    for (int i = 0; i < NKEYS; i++)
        if (!kiln_test_keypair(&f->sk[i], f->b64[i])) return false;
    return true;
}

static void fx_release(fx *f) {
    for (int i = 0; i < NKEYS; i++)
        kiln_sign_seckey_free(f->sk[i]);
}

/* A policy: alice and bob release, carol promote; extra is spliced in at the top level
 * (", \"release_threshold\": 2", say). alice_b64 replaces alice's key when not NULL. */
static kiln_sign_trust *policy(const fx *f, const char *extra, const char *alice_b64) {
    char *json = kiln_asprintf(
        "{\"format\": \"kiln-trust/1\", \"keys\": ["
        "{\"name\": \"alice\", \"pubkey\": \"%s\", \"roles\": [\"release\"]},"
        "{\"name\": \"bob\", \"pubkey\": \"%s\", \"roles\": [\"release\", \"promote\"]},"
        "{\"name\": \"carol\", \"pubkey\": \"%s\", \"roles\": [\"promote\"]}],"
        "\"channels\": {}%s}",
        alice_b64 ? alice_b64 : f->b64[ALICE], f->b64[BOB], f->b64[CAROL], extra ? extra : "");
    kiln_sign_trust *t = NULL;
    if (json && kiln_sign_trust_parse(json, strlen(json), "trust.json", &t) != KILN_OK) t = NULL;
    free(json);
    return t;
}

enum { VAL_NONE, VAL_PASSED, VAL_FAILED };

/* A small model directory; caller frees the path. */
static char *model_dir(const char *name, int validation) {
    char *dir = kiln_test_path(name);
    kiln_mkdir_p(dir);
    kiln_test_put(dir, "model.safetensors", "weights, any bytes will do");
    kiln_test_put(
        dir, "card.json",
        "{\"name\":\"demo\",\"created\":\"2026-03-04T05:06:07Z\",\"lineage\":{\"run_id\":\"r-1\","
        "\"step\":40}}");
    kiln_test_put(dir, "golden/set-0.bin", "golden rows\n");
    if (validation == VAL_PASSED)
        kiln_test_put(dir, "validation.json", "{\"passed\":true,\"cases\":3}");
    if (validation == VAL_FAILED)
        kiln_test_put(dir, "validation.json", "{\"passed\":false,\"cases\":3}");
    return dir;
}

/* Pack a model directory (what `kiln pack` does) into the test directory; caller frees. */
static char *pack(const char *dir, const char *archive, kiln_manifest **m) {
    char *p = kiln_test_path(archive);
    if (kiln_archive_pack(dir, "demo", "1.0.0", p, NULL, m) != KILN_OK) {
        free(p);
        return NULL;
    }
    return p;
}

/* Sign an archive with each key in keys (-1 ends), appending; caller frees. */
static char *sign_by(const fx *f, const char *archive, const int *keys, bool allow) {
    char *all = NULL;
    for (; *keys >= 0; keys++) {
        char *one = NULL, *next = NULL;
        if (kiln_sign_archive(f->sk[*keys], archive, allow, &one, NULL) != KILN_OK ||
            kiln_sign_archive_sigs_add(all, all ? strlen(all) : 0, "a.kiln.minisig", one, &next) !=
                KILN_OK) {
            free(one);
            free(all);
            return NULL;
        }
        free(one);
        free(all);
        all = next;
    }
    return all;
}

/* Verification must fail with want, the message holding what (and the subject, if any),
 * and leave nothing behind: no output directory, no temporary directory. */
static void refused(const char *archive, const char *sigs, const kiln_sign_trust *t, kiln_err want,
                    const char *what, const char *subject, const char *descr) {
    char *out = kiln_test_path("verified"), *before = kiln_test_listing(kiln_test_dir());
    kiln_sign_archive_report rep;
    kiln_err rc = kiln_sign_verify_archive(archive, sigs, sigs ? strlen(sigs) : 0, "a.kiln.minisig",
                                           t, out, &rep);
    char *after = kiln_test_listing(kiln_test_dir());
    char buf[256];
    snprintf(buf, sizeof buf, "%s: refused", descr);
    if (!CHECK(buf, rc == want)) fprintf(stderr, "    rc %d: %s\n", rc, kiln_errmsg());
    snprintf(buf, sizeof buf, "%s: message names '%s'", descr, what);
    if (!CHECK(buf, kiln_test_msg_has(what, subject)))
        fprintf(stderr, "    message: %s\n", kiln_errmsg());
    snprintf(buf, sizeof buf, "%s: nothing left behind", descr);
    CHECK(buf, before && after && !strcmp(before, after) && !kiln_path_exists(out));
    CHECK("no files claimed checked", !rep.files_checked);
    free(before);
    free(after);
    free(out);
}

/* ---- an archive written here: a given manifest text, then a model directory's files --- */

static void tar_file(struct archive *a, const char *path, const void *data, size_t len) {
    struct archive_entry *e = archive_entry_new();
    archive_entry_set_pathname(e, path);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, (la_int64_t)len);
    archive_write_header(a, e);
    archive_entry_free(e);
    archive_write_data(a, data, len);
}

/* Write an archive whose first entry is manifest (text) and then dir's files as listed in
 * m (read from dir, which may differ from what m says). */
static bool write_archive(const char *path, const char *manifest, size_t mlen,
                          const kiln_manifest *m, const char *dir) {
    struct archive *a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    archive_write_add_filter_zstd(a);
    bool ok = archive_write_open_filename(a, path) == ARCHIVE_OK;
    if (ok) tar_file(a, "manifest.json", manifest, mlen);
    for (size_t i = 0; ok && i < m->nfiles; i++) {
        char *p = kiln_path_join(dir, m->files[i].path), *buf = NULL;
        size_t n = 0;
        ok = kiln_read_file(p, 1u << 20, &buf, &n) == KILN_OK;
        if (ok) tar_file(a, m->files[i].path, buf, n);
        free(buf);
        free(p);
    }
    ok = archive_write_close(a) == ARCHIVE_OK && ok;
    archive_write_free(a);
    return ok;
}

/* Replace the first occurrence of from with to (same length) in a copy of s. */
static char *edit(const char *s, const char *from, const char *to) {
    char *c = kiln_strdup(s), *p = c ? strstr(c, from) : NULL;
    if (!p || strlen(from) != strlen(to)) {
        free(c);
        return NULL;
    }
    memcpy(p, to, strlen(to));
    return c;
}

/* A base64 character swapped for another (so the text still decodes). */
static void swap_b64(char *p) {
    *p = *p == 'A' ? 'B' : 'A';
}

/* ---- tests -------------------------------------------------------------------------- */

KILN_TEST(archive_sign_trust_release_threshold) {
    fx f;
    if (!CHECK("keys", fx_init(&f))) goto out;
    kiln_sign_trust *t = policy(&f, NULL, NULL);
    CHECK("default: one release key, unvalidated refused",
          t && kiln_sign_trust_release_threshold(t) == 1 &&
              !kiln_sign_trust_accepts_unvalidated(t));
    kiln_sign_trust_free(t);
    t = policy(&f, ", \"release_threshold\": 2, \"accept_unvalidated\": true", NULL);
    CHECK("given",
          t && kiln_sign_trust_release_threshold(t) == 2 && kiln_sign_trust_accepts_unvalidated(t));
    kiln_sign_trust_free(t);
    static const struct {
        const char *extra, *want;
    } bad[] = {
        {", \"release_threshold\": 0", "release_threshold 0 must be at least 1"},
        {", \"release_threshold\": 3", "can never be met: the policy has 2 release keys"},
        {", \"release_threshold\": \"2\"", "'release_threshold' must be an integer"},
        {", \"release_threshold\": 1.5", "'release_threshold' must be an integer"},
        {", \"accept_unvalidated\": 1", "'accept_unvalidated' must be true or false"},
        {", \"release_threshold\": 1, \"release_threshold\": 1", "duplicate"},
        {", \"release_thresold\": 1", "unknown field 'release_thresold'"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        kiln_errclear();
        t = policy(&f, bad[i].extra, NULL);
        CHECK("refused", t == NULL);
        if (!CHECK("message names the file and the problem",
                   kiln_test_msg_has("trust.json", bad[i].want)))
            fprintf(stderr, "    case %zu: %s\n", i, kiln_errmsg());
        kiln_sign_trust_free(t);
    }
out:
    fx_release(&f);
}

KILN_TEST(archive_sign_comment_strict) {
    static const char *const H = "0011223344556677889900112233445566778899001122334455667788990011";
    static const struct {
        const char *tail, *want;
    } bad[] = {
        {"", "'validation:' field is missing"},
        {"\t", "expected 'validation:'"},
        {"\tvalidation:maybe", "passed, failed or absent"},
        {"\tvalidation:passed\tallow-unvalidated", "unexpected field after"},
        {"\tvalidation:passed\t", "unexpected field after"},
        {"\tvalidation:failed", "followed by exactly"},
        {"\tvalidation:absent", "followed by exactly"},
        {"\tvalidation:absent\tallow-unvalidated\tx", "followed by exactly"},
        {"\tvalidation:absent\tallow-unvalidatedX", "followed by exactly"},
        {"\tvalidation:absent allow-unvalidated", "passed, failed or absent"},
        {"\tvalid:passed", "expected 'validation:'"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        char *tc = kiln_asprintf("kiln-archive/1\tmodel:demo\tversion:1.0.0\tmanifest:sha256:%s%s",
                                 H, bad[i].tail);
        kiln_sign_archive_info info;
        kiln_err rc = tc ? kiln_sign_archive_comment_parse(tc, "x.minisig", &info) : KILN_ERR_NOMEM;
        CHECK("refused", rc == KILN_ERR_FORMAT);
        if (!CHECK("message names the source and the problem",
                   kiln_test_msg_has("x.minisig", bad[i].want)))
            fprintf(stderr, "    case %zu: %s\n", i, kiln_errmsg());
        free(tc);
    }
    kiln_sign_archive_info info;
    char *ok = kiln_asprintf(
        "kiln-archive/1\tmodel:demo\tversion:1.0.0\tmanifest:sha256:%s\tvalidation:failed\t"
        "allow-unvalidated",
        H);
    CHECK("failed with the flag parses",
          ok && kiln_sign_archive_comment_parse(ok, "x", &info) == KILN_OK &&
              info.validation == KILN_SIGN_VALIDATION_FAILED && info.allow_unvalidated);
    free(ok);
}

KILN_TEST(archive_sign_unvalidated) {
    fx f;
    kiln_sign_trust *t = NULL, *lenient = NULL;
    char *dirs[2] = {model_dir("none", VAL_NONE), model_dir("failed", VAL_FAILED)};
    const char *names[2] = {"none.kiln", "failed.kiln"}, *verdict[2] = {"absent", "failed"};
    const char *why[2] = {"names no validation report", "\"passed\": false"};
    if (!CHECK("keys", fx_init(&f))) goto out;
    t = policy(&f, NULL, NULL);
    lenient = policy(&f, ", \"accept_unvalidated\": true", NULL);
    if (!CHECK("policies", t && lenient)) goto out;
    for (int i = 0; i < 2; i++) {
        char *ar = pack(dirs[i], names[i], NULL), *text = NULL, *sigpath = NULL;
        if (!CHECK("packs", ar)) continue;
        sigpath = kiln_asprintf("%s.minisig", ar);
        kiln_err rc = kiln_sign_archive(f.sk[ALICE], ar, false, &text, NULL);
        CHECK("refused without allow-unvalidated", rc == KILN_ERR_VERIFY && text == NULL);
        CHECK("message names the archive and why",
              kiln_test_msg_has(ar, why[i]) && kiln_test_msg_has("--allow-unvalidated", NULL));
        CHECK("no signature file written", !kiln_path_exists(sigpath));
        kiln_sign_archive_info info;
        rc = kiln_sign_archive(f.sk[ALICE], ar, true, &text, &info);
        if (!CHECK("signed with allow-unvalidated", rc == KILN_OK && text)) goto next;
        char want[64];
        snprintf(want, sizeof want, "\tvalidation:%s\tallow-unvalidated\n", verdict[i]);
        CHECK("the comment says so", strstr(text, want) != NULL && info.allow_unvalidated);
        refused(ar, text, t, KILN_ERR_VERIFY, "does not accept unvalidated archives",
                "accept_unvalidated", "unvalidated archive under the default policy");
        kiln_sign_archive_report rep;
        rc = kiln_sign_verify_archive(ar, text, strlen(text), "sig", lenient, NULL, &rep);
        CHECK("accepted by a policy with accept_unvalidated",
              rc == KILN_OK && rep.info.allow_unvalidated && rep.files_checked &&
                  !strcmp(kiln_sign_validation_name(rep.info.validation), verdict[i]));
    next:
        free(text);
        free(sigpath);
        free(ar);
    }
out:
    kiln_sign_trust_free(t);
    kiln_sign_trust_free(lenient);
    free(dirs[0]);
    free(dirs[1]);
    fx_release(&f);
}

KILN_TEST(archive_sign_signers_and_threshold) {
    fx f;
    kiln_sign_trust *t1 = NULL, *t2 = NULL;
    char *dir = model_dir("m", VAL_PASSED), *ar = NULL, *one = NULL, *both = NULL, *twice = NULL;
    char *out = kiln_test_path("unpacked");
    kiln_manifest *m = NULL;
    if (!CHECK("keys", fx_init(&f))) goto out;
    t1 = policy(&f, NULL, NULL);
    t2 = policy(&f, ", \"release_threshold\": 2", NULL);
    ar = pack(dir, "m.kiln", &m);
    if (!CHECK("fixture", t1 && t2 && ar)) goto out;
    one = sign_by(&f, ar, (const int[]){ALICE, -1}, false);
    both = sign_by(&f, ar, (const int[]){ALICE, BOB, -1}, false);
    if (!CHECK("signed", one && both)) goto out;
    char hex[KILN_SHA256_HEX];
    kiln_hex(m->sha256, 32, hex);
    char *want = kiln_asprintf("trusted comment: kiln-archive/1\tmodel:demo\tversion:1.0.0\t"
                               "manifest:sha256:%s\tvalidation:passed\n",
                               hex);
    CHECK("comment names model, version, manifest and verdict", want && strstr(one, want));
    free(want);

    kiln_sign_archive_report rep;
    kiln_err rc = kiln_sign_verify_archive(ar, one, strlen(one), "sig", t1, out, &rep);
    CHECK("one release key meets threshold 1",
          rc == KILN_OK && rep.nsigners == 1 && rep.threshold == 1 && rep.threshold_met &&
              rep.files_checked && !strcmp(rep.signers[0]->name, "alice"));
    CHECK("verified directory in place",
          rc == KILN_OK && kiln_manifest_verify_dir(m, out) == KILN_OK);
    refused(ar, one, t2, KILN_ERR_VERIFY, "needs 2 distinct release keys", "signed by 1 ('alice')",
            "one signer, threshold 2");
    rc = kiln_sign_verify_archive_sigs(ar, one, strlen(one), "sig", t2, &rep);
    CHECK("the report says who signed and that the threshold is not met",
          rc == KILN_ERR_VERIFY && rep.nsigners == 1 && rep.threshold == 2 && !rep.threshold_met);

    rc = kiln_sign_verify_archive(ar, both, strlen(both), "sig", t2, NULL, &rep);
    CHECK("two distinct release keys meet threshold 2",
          rc == KILN_OK && rep.nsigs == 2 && rep.nsigners == 2 && rep.threshold_met &&
              rep.files_checked && !strcmp(rep.signers[1]->name, "bob"));

    /* The same key twice counts once (kiln refuses to append it; a file made by hand). */
    twice = kiln_asprintf("%s%s", one, one);
    refused(ar, twice, t2, KILN_ERR_VERIFY, "needs 2 distinct release keys",
            "a key that signs twice counts once", "one key signing twice");
    char *again = NULL;
    CHECK("appending a second signature by the same key is refused",
          kiln_sign_archive_sigs_add(one, strlen(one), "m.kiln.minisig", one, &again) ==
                  KILN_ERR_CONFLICT &&
              again == NULL &&
              kiln_test_msg_has("m.kiln.minisig", "has signed this archive already"));

    /* Keys outside the release role or the policy. */
    char *eve = sign_by(&f, ar, (const int[]){EVE, -1}, false);
    char *carol = sign_by(&f, ar, (const int[]){CAROL, -1}, false);
    char *mixed = eve ? kiln_asprintf("%s%s", one, eve) : NULL;
    refused(ar, eve, t1, KILN_ERR_VERIFY, "which is not in the trust policy", "trust.json",
            "a key not in the policy");
    refused(ar, mixed, t1, KILN_ERR_VERIFY, "signature 2", "not in the trust policy",
            "a good signature and a foreign one");
    refused(ar, carol, t1, KILN_ERR_VERIFY, "key 'carol'", "does not hold the 'release' role",
            "a promote key");
    free(eve);
    free(carol);
    free(mixed);

    /* A legacy (Ed) signature with a correct comment is not accepted for an archive. */
    char *tc = NULL, *legacy = NULL, *buf = NULL;
    size_t n = 0;
    const char *start = strstr(one, "kiln-archive/1");
    const char *end = start ? strchr(start, '\n') : NULL;
    if (end) tc = kiln_asprintf("%.*s", (int)(end - start), start);
    if (tc && kiln_read_file(ar, 1u << 20, &buf, &n) == KILN_OK &&
        kiln_sign_buffer(f.sk[ALICE], buf, n, tc, KILN_SIGN_LEGACY, &legacy) == KILN_OK)
        refused(ar, legacy, t1, KILN_ERR_VERIFY, "legacy ('Ed') signature", NULL,
                "a legacy signature");
    else
        CHECK("legacy signature made", false);
    free(tc);
    free(legacy);
    free(buf);

    /* An existing output directory is refused and left alone. */
    rc = kiln_sign_verify_archive(ar, one, strlen(one), "sig", t1, out, &rep);
    CHECK("existing --out refused", rc == KILN_ERR_CONFLICT &&
                                        kiln_test_msg_has(out, "exists already") &&
                                        kiln_manifest_verify_dir(m, out) == KILN_OK);
out:
    kiln_manifest_free(m);
    kiln_sign_trust_free(t1);
    kiln_sign_trust_free(t2);
    free(dir);
    free(ar);
    free(one);
    free(both);
    free(twice);
    free(out);
    fx_release(&f);
}

KILN_TEST(archive_sign_sigs_file_strict) {
    fx f;
    char *dir = model_dir("m", VAL_PASSED), *ar = NULL, *one = NULL;
    if (!CHECK("keys", fx_init(&f))) goto out;
    ar = pack(dir, "m.kiln", NULL);
    one = ar ? sign_by(&f, ar, (const int[]){ALICE, -1}, false) : NULL;
    if (!CHECK("signed", one)) goto out;
    kiln_sign_sig *s = NULL;
    size_t n = 9;
    CHECK("empty file refused",
          kiln_sign_archive_sigs_parse("", 0, "s.minisig", &s, &n) == KILN_ERR_FORMAT &&
              kiln_test_msg_has("s.minisig", "empty") && s == NULL && n == 0);
    char *five = kiln_asprintf("%suntrusted comment: x\n", one);
    CHECK("a truncated second block names it",
          kiln_sign_archive_sigs_parse(five, strlen(five), "s.minisig", &s, &n) ==
                  KILN_ERR_FORMAT &&
              kiln_test_msg_has("'s.minisig': signature 2, line 2", "missing"));
    char *blank = kiln_asprintf("%s\n%s", one, one);
    CHECK("a blank line between blocks is refused",
          kiln_sign_archive_sigs_parse(blank, strlen(blank), "s.minisig", &s, &n) ==
                  KILN_ERR_FORMAT &&
              kiln_test_msg_has("signature 2, line 1", NULL));
    size_t len = strlen(one), many = KILN_SIGN_ARCHIVE_MAX_SIGS + 1;
    char *big = malloc(len * many + 1);
    for (size_t i = 0; big && i < many; i++)
        memcpy(big + i * len, one, len + 1);
    CHECK("more than the limit refused",
          big &&
              kiln_sign_archive_sigs_parse(big, len * many, "s.minisig", &s, &n) ==
                  KILN_ERR_LIMIT &&
              kiln_test_msg_has("s.minisig", "more than 32 signatures"));
    CHECK("the limit itself parses",
          big &&
              kiln_sign_archive_sigs_parse(big, len * (many - 1), "s.minisig", &s, &n) == KILN_OK &&
              n == many - 1);
    kiln_sign_archive_sigs_free(s, n);
    /* A signature of another archive cannot be appended to this one's file. */
    char *dir2 = model_dir("m2", VAL_PASSED);
    kiln_test_put(dir2, "golden/set-0.bin", "other rows\n");
    char *ar2 = pack(dir2, "m2.kiln", NULL);
    char *other = ar2 ? sign_by(&f, ar2, (const int[]){BOB, -1}, false) : NULL, *joined = NULL;
    CHECK("another archive's signature refused",
          other &&
              kiln_sign_archive_sigs_add(one, strlen(one), "m.kiln.minisig", other, &joined) ==
                  KILN_ERR_CONFLICT &&
              joined == NULL && kiln_test_msg_has("m.kiln.minisig", "signs another archive"));
    free(five);
    free(blank);
    free(big);
    free(dir2);
    free(ar2);
    free(other);
out:
    free(dir);
    free(ar);
    free(one);
    fx_release(&f);
}

KILN_TEST(archive_sign_tamper) {
    fx f;
    kiln_sign_trust *t = NULL;
    kiln_manifest *m = NULL;
    char *dir = model_dir("m", VAL_PASSED), *ar = NULL, *sig = NULL, *orig = NULL;
    char *copy = kiln_test_path("copy.kiln");
    size_t alen = 0;
    if (!CHECK("keys", fx_init(&f))) goto out;
    t = policy(&f, ", \"release_threshold\": 2", NULL);
    ar = pack(dir, "m.kiln", &m);
    sig = ar ? sign_by(&f, ar, (const int[]){ALICE, BOB, -1}, false) : NULL;
    if (!CHECK("fixture", t && sig && kiln_read_file(ar, 1u << 20, &orig, &alen) == KILN_OK))
        goto out;
    kiln_sign_archive_report rep;
    CHECK("the untouched archive verifies",
          kiln_sign_verify_archive(ar, sig, strlen(sig), "sig", t, NULL, &rep) == KILN_OK &&
              rep.files_checked);

    /* 1. Any byte of the archive, not re-signed: the signature fails. */
    for (long off = 0; off < (long)alen; off += (long)alen / 7) {
        if (!CHECK("copy", kiln_write_file_atomic(copy, orig, alen) == KILN_OK &&
                                   kiln_test_flip(copy, off)))
            break;
        refused(copy, sig, t, KILN_ERR_VERIFY, "signature verification failed", "copy.kiln",
                "a byte of the archive changed");
    }

    /* 2. One byte of a file changed, repacked under the same manifest and signed by both
     *    release keys: the signatures and comments pass; unpacking names the file. */
    char *dir2 = kiln_test_path("m-tampered");
    kiln_mkdir_p(dir2);
    kiln_test_put(dir2, "model.safetensors", "weights, any bytes will do");
    kiln_test_put(
        dir2, "card.json",
        "{\"name\":\"demo\",\"created\":\"2026-03-04T05:06:07Z\",\"lineage\":{\"run_id\":\"r-1\","
        "\"step\":40}}");
    kiln_test_put(dir2, "golden/set-0.bin", "golden rowz\n"); /* one byte */
    kiln_test_put(dir2, "validation.json", "{\"passed\":true,\"cases\":3}");
    char *bad = kiln_test_path("bad.kiln"), *bad_sig = NULL;
    if (CHECK("repacked with the original manifest",
              write_archive(bad, m->text, m->text_len, m, dir2))) {
        bad_sig = sign_by(&f, bad, (const int[]){ALICE, BOB, -1}, false);
        CHECK("the repacked archive's signatures pass",
              bad_sig && kiln_sign_verify_archive_sigs(bad, bad_sig, strlen(bad_sig), "sig", t,
                                                       &rep) == KILN_OK);
        refused(bad, bad_sig, t, KILN_ERR_VERIFY, "golden/set-0.bin", "differs from the manifest",
                "one byte of a file, same manifest, signed again");
    }
    free(bad_sig);
    bad_sig = NULL;

    /* 3. One byte of the manifest (a metric in the lineage), signed again over the new bytes
     *    but with the comment that named the original manifest: the comment no longer names
     *    the archive's manifest. */
    char *mtext = kiln_strdup(m->text);
    char *step = mtext ? strstr(mtext, "\"step\":40") : NULL;
    if (CHECK("manifest edited", step)) {
        step[8] = '1'; /* 40 -> 41: still canonical */
        if (CHECK("repacked", write_archive(bad, mtext, m->text_len, m, dir))) {
            char *tc = NULL, *a = NULL, *b = NULL;
            const char *s = strstr(sig, "kiln-archive/1"), *e = s ? strchr(s, '\n') : NULL;
            if (e) tc = kiln_asprintf("%.*s", (int)(e - s), s);
            if (tc && kiln_sign_file(f.sk[ALICE], bad, tc, &a) == KILN_OK &&
                kiln_sign_file(f.sk[BOB], bad, tc, &b) == KILN_OK)
                bad_sig = kiln_asprintf("%s%s", a, b);
            char hex[KILN_SHA256_HEX];
            kiln_hex(m->sha256, 32, hex);
            refused(bad, bad_sig, t, KILN_ERR_VERIFY,
                    "the trusted comment names manifest sha256:", hex,
                    "one byte of the manifest, signed again with the old comment");
            refused(bad, sig, t, KILN_ERR_VERIFY, "signature verification failed", "bad.kiln",
                    "one byte of the manifest, old signatures");
            free(tc);
            free(a);
            free(b);
        }
    }
    free(mtext);
    free(bad_sig);

    /* 4. The signature file: the signature, the trusted comment, the global signature. */
    char *second = strstr(sig + 1, "untrusted comment:"); /* bob's block */
    char *line2 = second ? strchr(second, '\n') + 1 : NULL;
    char *ed = kiln_strdup(sig);
    if (CHECK("bob's block", line2 && ed)) {
        swap_b64(ed + (line2 - sig) + 40);
        refused(ar, ed, t, KILN_ERR_VERIFY, "signature 2': signature verification failed", NULL,
                "a byte of a signature");
    }
    free(ed);
    ed = edit(sig, "version:1.0.0", "version:1.0.1");
    refused(ar, ed, t, KILN_ERR_VERIFY, "signature 1': global signature verification failed",
            "trusted comment", "a byte of a trusted comment");
    free(ed);
    ed = edit(sig, "validation:passed", "validation:failed");
    refused(ar, ed, t, KILN_ERR_VERIFY, "global signature verification failed", NULL,
            "the verdict in a trusted comment");
    free(ed);
    ed = kiln_strdup(sig);
    char *gl = ed ? strstr(ed, "validation:passed\n") : NULL;
    if (CHECK("global line", gl)) {
        swap_b64(gl + strlen("validation:passed\n") + 10);
        refused(ar, ed, t, KILN_ERR_VERIFY, "global signature verification failed", NULL,
                "a byte of a global signature");
    }
    free(ed);

    /* 5. A public key in the policy: one byte of alice's Ed25519 key, or of her key id. */
    char pk[KILN_SIGN_PUBKEY_B64];
    memcpy(pk, f.b64[ALICE], sizeof pk);
    swap_b64(pk + 30);
    kiln_sign_trust *tk = policy(&f, ", \"release_threshold\": 2", pk);
    if (CHECK("policy with a changed key", tk))
        refused(ar, sig, tk, KILN_ERR_VERIFY, "signature 1': signature verification failed",
                "key id", "a byte of a public key");
    kiln_sign_trust_free(tk);
    memcpy(pk, f.b64[ALICE], sizeof pk);
    swap_b64(pk + 5);
    tk = policy(&f, ", \"release_threshold\": 2", pk);
    if (CHECK("policy with a changed key id", tk))
        refused(ar, sig, tk, KILN_ERR_VERIFY, "signature 1': signed by key id",
                "not in the trust policy", "a byte of a key id");
    kiln_sign_trust_free(tk);

    /* 6. A comment that names another model or another verdict, signed by trusted keys. */
    static const struct {
        const char *from, *to, *want;
    } lies[] = {
        {"model:demo", "model:dem0", "names model 'dem0'"},
        {"version:1.0.0", "version:1.0.9", "names version '1.0.9'"},
        {"validation:passed", "validation:absent\tallow-unvalidated", "says validation:absent"}};
    for (size_t i = 0; i < KILN_ARRAY_LEN(lies); i++) {
        const char *s = strstr(sig, "kiln-archive/1"), *e = s ? strchr(s, '\n') : NULL;
        char *tc = e ? kiln_asprintf("%.*s", (int)(e - s), s) : NULL, *tc2 = NULL, *a = NULL;
        if (tc) {
            char *p = strstr(tc, lies[i].from);
            tc2 = p ? kiln_asprintf("%.*s%s%s", (int)(p - tc), tc, lies[i].to,
                                    p + strlen(lies[i].from))
                    : NULL;
        }
        if (CHECK("signed a lie", tc2 && kiln_sign_file(f.sk[ALICE], ar, tc2, &a) == KILN_OK))
            refused(ar, a, t, KILN_ERR_VERIFY, lies[i].want, "m.kiln", "a comment that lies");
        free(tc);
        free(tc2);
        free(a);
    }
    free(dir2);
    free(bad);
out:
    kiln_manifest_free(m);
    kiln_sign_trust_free(t);
    free(dir);
    free(ar);
    free(sig);
    free(orig);
    free(copy);
    fx_release(&f);
}

/* Without the archive: the comments checked against a manifest's text (kiln provenance). What
 * the signers named is proved; the archive's bytes are not, so a signature over other bytes
 * still passes here (and only here) while a changed comment, manifest or key does not. */
KILN_TEST(archive_sign_manifest_only) {
    fx f;
    kiln_sign_trust *t1 = NULL, *t2 = NULL;
    char *dir = model_dir("m", VAL_PASSED), *dir2 = NULL, *ar = NULL, *ar2 = NULL, *one = NULL,
         *both = NULL, *other = NULL, *bad = NULL;
    kiln_manifest *m = NULL, *m2 = NULL;
    if (!CHECK("keys", fx_init(&f))) goto out;
    t1 = policy(&f, NULL, NULL);
    t2 = policy(&f, ", \"release_threshold\": 2", NULL);
    ar = pack(dir, "m.kiln", &m);
    if (!CHECK("fixture", t1 && t2 && ar)) goto out;
    one = sign_by(&f, ar, (const int[]){ALICE, -1}, false);
    both = sign_by(&f, ar, (const int[]){ALICE, BOB, -1}, false);
    if (!CHECK("signed", one && both)) goto out;
    kiln_sign_archive_report rep;
    kiln_err rc = kiln_sign_verify_manifest_sigs(m->text, m->text_len, "manifest", one, strlen(one),
                                                 "sig", t1, &rep);
    CHECK("the comment names this manifest: verified without the archive",
          rc == KILN_OK && rep.nsigners == 1 && rep.threshold_met && !rep.files_checked &&
              !strcmp(rep.signers[0]->name, "alice") &&
              rep.info.validation == KILN_SIGN_VALIDATION_PASSED &&
              !memcmp(rep.info.manifest_sha256, m->sha256, 32));
    rc = kiln_sign_verify_manifest_sigs(m->text, m->text_len, "manifest", one, strlen(one), "sig",
                                        t2, &rep);
    CHECK("the release threshold holds",
          rc == KILN_ERR_VERIFY && kiln_test_msg_has("needs 2 distinct release keys", "manifest") &&
              !rep.threshold_met);
    rc = kiln_sign_verify_manifest_sigs(m->text, m->text_len, "manifest", both, strlen(both), "sig",
                                        t2, &rep);
    CHECK("two signers meet 2", rc == KILN_OK && rep.nsigners == 2);

    /* Another manifest (another model directory's): the comment does not name it. */
    dir2 = model_dir("m2", VAL_NONE);
    ar2 = pack(dir2, "m2.kiln", &m2);
    rc = ar2 ? kiln_sign_verify_manifest_sigs(m2->text, m2->text_len, "the registry's manifest",
                                              one, strlen(one), "sig", t1, &rep)
             : KILN_ERR_IO;
    CHECK("another manifest is refused, named",
          rc == KILN_ERR_VERIFY && kiln_test_msg_has("names manifest sha256:",
                                                     "the manifest in 'the registry's manifest'"));
    /* A manifest that is not canonical (re-serialised with spaces) does not parse. */
    char *spaced = kiln_asprintf(" %s", m->text);
    rc = spaced ? kiln_sign_verify_manifest_sigs(spaced, strlen(spaced), "manifest", one,
                                                 strlen(one), "sig", t1, &rep)
                : KILN_ERR_NOMEM;
    CHECK("a manifest not in canonical form is refused", rc == KILN_ERR_FORMAT);
    free(spaced);

    /* The signature over the archive is not checked: a block alice made over other bytes with
     * this manifest's comment passes here, and fails the full check over the archive. */
    const char *start = strstr(one, "kiln-archive/1");
    const char *end = start ? strchr(start, '\n') : NULL;
    char *tc = end ? kiln_asprintf("%.*s", (int)(end - start), start) : NULL;
    if (tc && kiln_sign_buffer(f.sk[ALICE], "other bytes", 11, tc, KILN_SIGN_PREHASHED, &other) ==
                  KILN_OK) {
        rc = kiln_sign_verify_manifest_sigs(m->text, m->text_len, "manifest", other, strlen(other),
                                            "sig", t1, &rep);
        CHECK("a signature over other bytes naming this manifest passes without the archive",
              rc == KILN_OK);
        rc = kiln_sign_verify_archive_sigs(ar, other, strlen(other), "sig", t1, &rep);
        CHECK("and fails over the archive",
              rc == KILN_ERR_VERIFY && kiln_test_msg_has("signature verification failed", NULL));
        /* Its signature line under alice's real comment and global signature: refused. */
        char *tc_one = strstr(one, "\ntrusted comment: "),
             *tc_other = strstr(other, "\ntrusted comment: ");
        bad = tc_one && tc_other ? kiln_asprintf("%.*s%s", (int)(tc_other - other), other, tc_one)
                                 : NULL;
        rc = bad ? kiln_sign_verify_manifest_sigs(m->text, m->text_len, "manifest", bad,
                                                  strlen(bad), "sig", t1, &rep)
                 : KILN_ERR_NOMEM;
        CHECK("a comment moved onto another signature: the global signature fails",
              rc == KILN_ERR_VERIFY && kiln_test_msg_has("global signature", NULL));
    } else {
        CHECK("signed other bytes", false);
    }
    free(tc);
    /* A changed comment (validation verdict) fails the global signature. */
    char *flip = one ? kiln_asprintf("%s", one) : NULL;
    char *v = flip ? strstr(flip, "validation:passed") : NULL;
    if (v) memcpy(v + strlen("validation:"), "failed", 6);
    rc = v ? kiln_sign_verify_manifest_sigs(m->text, m->text_len, "manifest", flip, strlen(flip),
                                            "sig", t1, &rep)
           : KILN_ERR_NOMEM;
    CHECK("an edited comment is refused", rc == KILN_ERR_VERIFY);
    free(flip);
    /* A key not in the policy. */
    char *eve = sign_by(&f, ar, (const int[]){EVE, -1}, false);
    rc = eve ? kiln_sign_verify_manifest_sigs(m->text, m->text_len, "manifest", eve, strlen(eve),
                                              "sig", t1, &rep)
             : KILN_ERR_NOMEM;
    CHECK("an unknown key is refused",
          rc == KILN_ERR_VERIFY && kiln_test_msg_has("not in the trust policy", NULL));
    free(eve);
out:
    kiln_manifest_free(m);
    kiln_manifest_free(m2);
    kiln_sign_trust_free(t1);
    kiln_sign_trust_free(t2);
    free(dir), free(dir2), free(ar), free(ar2), free(one), free(both), free(other), free(bad);
    fx_release(&f);
}

/* ---- the one-pass paths: a hash pipe, a prehash, an unpack from a source --------------- */

/* An archive file as a source, read in chunks of an odd size, each also posted to a pipe. */
typedef struct chunked {
    FILE *f;
    kiln_hashpipe *pipe;
    size_t chunk;
} chunked;

static kiln_err chunked_read(void *ctx, const void **buf, size_t *n) {
    chunked *c = ctx;
    uint8_t *slot = kiln_hashpipe_slot(c->pipe);
    *n = fread(slot, 1, c->chunk, c->f);
    kiln_hashpipe_post(c->pipe, *n);
    *buf = slot;
    return KILN_OK;
}

KILN_TEST(archive_sign_prehashed_and_streamed) {
    fx f;
    memset(&f, 0, sizeof f);
    kiln_manifest *m1 = NULL, *m2 = NULL, *got = NULL;
    kiln_sign_trust *t = NULL;
    kiln_hashpipe *pipe = NULL;
    char *d1 = model_dir("stream-a", VAL_PASSED), *d2 = model_dir("stream-b", VAL_PASSED);
    kiln_test_put(d2, "model.safetensors", "other weights");
    char *a1 = pack(d1, "stream-a.kiln", &m1), *a2 = pack(d2, "stream-b.kiln", &m2);
    char *sig = NULL, *out = kiln_test_path("streamed"), *out2 = kiln_test_path("streamed-2");
    FILE *fp = NULL;
    if (!CHECK("keys", fx_init(&f))) goto done;
    t = policy(&f, NULL, NULL);
    sig = a1 ? sign_by(&f, a1, (const int[]){ALICE, -1}, false) : NULL;
    if (!CHECK("packed and signed", a1 && a2 && m1 && m2 && t && sig)) goto done;

    /* The pipe's digests are the files' whatever the chunks, threaded or not, after a reset. */
    uint8_t want_b2[64], want_sha[32], b2[64], sha[32], b2_other[64];
    uint64_t bytes = 0;
    kiln_blake2b_file(a1, want_b2, 64);
    kiln_sha256_file(a1, want_sha);
    for (int threaded = 0; threaded < 2; threaded++) {
        if (!CHECK("a pipe", kiln_hashpipe_new(KILN_HASH_SHA256 | KILN_HASH_BLAKE2B, threaded,
                                               &pipe) == KILN_OK))
            goto done;
        memcpy(kiln_hashpipe_slot(pipe), "junk before the reset", 21);
        kiln_hashpipe_post(pipe, 21);
        kiln_hashpipe_reset(pipe);
        fp = fopen(a1, "rb");
        chunked c = {fp, pipe, 1000 + 37 * (size_t)threaded};
        const void *b;
        size_t n;
        do
            chunked_read(&c, &b, &n);
        while (n);
        fclose(fp);
        fp = NULL;
        kiln_hashpipe_finish(pipe, sha, b2, &bytes);
        kiln_hashpipe_free(pipe);
        pipe = NULL;
        CHECK("the pipe's BLAKE2b-512 is the file's", !memcmp(b2, want_b2, 64));
        CHECK("the pipe's SHA-256 is the file's", !memcmp(sha, want_sha, 32));
        struct stat sb;
        CHECK("every byte counted", stat(a1, &sb) == 0 && bytes == (uint64_t)sb.st_size);
    }

    /* The signatures over a prehash: the right one with the archive's manifest verifies;
     * another archive's prehash, or another manifest, does not. */
    kiln_sign_archive_report rep;
    CHECK("verifies over the prehash",
          kiln_sign_verify_prehashed_sigs(b2, m1, "a1", sig, strlen(sig), "sig", t, &rep) ==
                  KILN_OK &&
              rep.nsigners == 1);
    kiln_blake2b_file(a2, b2_other, 64);
    CHECK("another archive's prehash is refused",
          kiln_sign_verify_prehashed_sigs(b2_other, m1, "a1", sig, strlen(sig), "sig", t, &rep) ==
                  KILN_ERR_VERIFY &&
              kiln_test_msg_has("is not what key id", NULL));
    CHECK("another manifest is refused",
          kiln_sign_verify_prehashed_sigs(b2, m2, "a1", sig, strlen(sig), "sig", t, &rep) ==
                  KILN_ERR_VERIFY &&
              kiln_test_msg_has("the trusted comment names manifest", NULL));
    CHECK("the file path with the prehash verifies",
          kiln_sign_verify_archive_prehashed(a1, b2, sig, strlen(sig), "sig", t, NULL, &rep) ==
                  KILN_OK &&
              rep.files_checked);

    /* An unpack from a source, held to a manifest verified beforehand. */
    if (!CHECK("a pipe", kiln_hashpipe_new(KILN_HASH_BLAKE2B, true, &pipe) == KILN_OK)) goto done;
    fp = fopen(a1, "rb");
    chunked c = {fp, pipe, 4096};
    kiln_archive_source src = {chunked_read, &c};
    kiln_err rc = kiln_archive_unpack_source(&src, "a1", out, NULL, m1, &got);
    CHECK("unpacks from a source against the signed manifest", rc == KILN_OK && got);
    CHECK("every file as the manifest says",
          rc == KILN_OK && kiln_manifest_verify_dir(m1, out) == KILN_OK);
    fclose(fp);
    fp = fopen(a1, "rb");
    c.f = fp;
    rc = kiln_archive_unpack_source(&src, "a1", out2, NULL, m2, NULL);
    CHECK("refused when the archive's manifest is not the signed one",
          rc == KILN_ERR_VERIFY && kiln_test_msg_has("not the signed manifest", NULL));
    CHECK("nothing left at the output", !kiln_path_exists(out2));
done:
    if (fp) fclose(fp);
    kiln_hashpipe_free(pipe);
    kiln_manifest_free(m1), kiln_manifest_free(m2), kiln_manifest_free(got);
    kiln_sign_trust_free(t);
    free(d1), free(d2), free(a1), free(a2), free(sig), free(out), free(out2);
    fx_release(&f);
}

/* archive.c - signed .kiln archives: sign an archive with the trusted comment naming its
 * manifest and validation verdict, keep several release signers' signatures in one file,
 * and verify an archive against a trust policy (signatures, threshold, comment against the
 * archive's own manifest, then a secure unpack that checks every file).
 *
 * This file is where sign/ meets export/: it is the only file of sign/ that calls export/
 * (docs/architecture.md). export/ knows nothing of signatures. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "export.h"
#include "sign_int.h"

/* ---- signing ------------------------------------------------------------------------ */

static void info_from_manifest(const kiln_manifest *m, kiln_sign_archive_info *info) {
    memset(info, 0, sizeof *info);
    snprintf(info->model, sizeof info->model, "%s", m->name);
    snprintf(info->version, sizeof info->version, "%s", m->version);
    memcpy(info->manifest_sha256, m->sha256, sizeof info->manifest_sha256);
    info->validation = !m->validation_present ? KILN_SIGN_VALIDATION_ABSENT
                       : m->validation_passed ? KILN_SIGN_VALIDATION_PASSED
                                              : KILN_SIGN_VALIDATION_FAILED;
}

/* The archive's manifest, summed up as a comment would name it. */
static kiln_err archive_info(const char *archive_path, kiln_sign_archive_info *info) {
    kiln_manifest *m = NULL;
    KILN_TRY(kiln_archive_read_manifest(archive_path, &m));
    info_from_manifest(m, info);
    kiln_manifest_free(m);
    return KILN_OK;
}

kiln_err kiln_sign_archive(const kiln_sign_seckey *sk, const char *archive_path,
                           bool allow_unvalidated, char **text, kiln_sign_archive_info *info) {
    *text = NULL;
    kiln_sign_archive_info in;
    KILN_TRY(archive_info(archive_path, &in));
    if (in.validation != KILN_SIGN_VALIDATION_PASSED) {
        KILN_FAIL_IF(!allow_unvalidated, KILN_ERR_VERIFY,
                     "'%s': refusing to sign an unvalidated archive: %s (--allow-unvalidated "
                     "signs it and says so in the trusted comment)",
                     archive_path,
                     in.validation == KILN_SIGN_VALIDATION_FAILED
                         ? "its validation report says \"passed\": false"
                         : "its manifest names no validation report");
        in.allow_unvalidated = true;
    }
    char *tc = kiln_sign_archive_comment(&in);
    if (!tc) return kiln_errprefix(KILN_ERR_USAGE, "'%s': ", archive_path);
    kiln_err rc = kiln_sign_file(sk, archive_path, tc, text);
    free(tc);
    if (rc == KILN_OK && info) *info = in;
    return rc;
}

/* ---- the signature file: one or more blocks ----------------------------------------- */

void kiln_sign_archive_sigs_free(kiln_sign_sig *sigs, size_t n) {
    for (size_t i = 0; sigs && i < n; i++)
        kiln_sign_sig_release(&sigs[i]);
    free(sigs);
}

/* Where each 4-line block starts and ends; KILN_ERR_FORMAT/LIMIT for a count out of range. */
static kiln_err split_blocks(const char *buf, size_t len, const char *label, size_t start[],
                             size_t end[], size_t *n) {
    size_t pos = 0, count = 0;
    *n = 0;
    while (pos < len) {
        KILN_FAIL_IF(count == KILN_SIGN_ARCHIVE_MAX_SIGS, KILN_ERR_LIMIT,
                     "'%s': more than %d signatures", label, KILN_SIGN_ARCHIVE_MAX_SIGS);
        size_t p = pos;
        for (int line = 0; line < 4 && p < len; line++) {
            const char *nl = memchr(buf + p, '\n', len - p);
            p = nl ? (size_t)(nl - buf) + 1 : len;
        }
        start[count] = pos;
        end[count++] = p;
        pos = p;
    }
    KILN_FAIL_IF(count == 0, KILN_ERR_FORMAT, "'%s': empty signature file", label);
    *n = count;
    return KILN_OK;
}

kiln_err kiln_sign_archive_sigs_parse(const char *buf, size_t len, const char *label,
                                      kiln_sign_sig **sigs, size_t *n) {
    size_t start[KILN_SIGN_ARCHIVE_MAX_SIGS], end[KILN_SIGN_ARCHIVE_MAX_SIGS], count;
    *sigs = NULL;
    *n = 0;
    KILN_TRY(split_blocks(buf, len, label, start, end, &count));
    kiln_sign_sig *s = kiln_calloc(count, sizeof *s);
    if (!s) return KILN_ERR_NOMEM;
    for (size_t i = 0; i < count; i++) {
        char what[32];
        snprintf(what, sizeof what, "signature %zu", i + 1);
        kiln_err rc = sign_sig_parse_in(buf + start[i], end[i] - start[i], label,
                                        count > 1 ? what : NULL, &s[i]);
        if (rc != KILN_OK) {
            kiln_sign_archive_sigs_free(s, count);
            return rc;
        }
    }
    *sigs = s;
    *n = count;
    return KILN_OK;
}

kiln_err kiln_sign_archive_sigs_add(const char *file, size_t len, const char *label,
                                    const char *sig, char **out) {
    *out = NULL;
    kiln_sign_sig add, *have = NULL;
    kiln_sign_sig_init(&add);
    size_t n = 0;
    kiln_sign_archive_info ai, hi;
    kiln_err rc = KILN_OK;
    KILN_CHECK(rc, done, kiln_sign_sig_parse(sig, strlen(sig), "new signature", &add));
    KILN_CHECK(rc, done,
               kiln_sign_archive_comment_parse(add.trusted_comment, "new signature", &ai));
    if (len > 0) {
        KILN_CHECK(rc, done, kiln_sign_archive_sigs_parse(file, len, label, &have, &n));
        KILN_CHECK_IF(rc, done, n >= KILN_SIGN_ARCHIVE_MAX_SIGS, KILN_ERR_LIMIT,
                      "'%s': holds %d signatures already, the most an archive takes", label,
                      KILN_SIGN_ARCHIVE_MAX_SIGS);
        for (size_t i = 0; i < n; i++) {
            char id[KILN_SIGN_KEYID_HEX];
            kiln_sign_keyid_hex(have[i].keyid, id);
            KILN_CHECK_IF(rc, done, !memcmp(have[i].keyid, add.keyid, KILN_SIGN_KEYID_BYTES),
                          KILN_ERR_CONFLICT, "'%s': key id %s has signed this archive already",
                          have[i].label, id);
            KILN_CHECK(
                rc, done,
                kiln_sign_archive_comment_parse(have[i].trusted_comment, have[i].label, &hi));
            KILN_CHECK_IF(rc, done,
                          memcmp(hi.manifest_sha256, ai.manifest_sha256, 32) != 0 ||
                              strcmp(hi.model, ai.model) || strcmp(hi.version, ai.version),
                          KILN_ERR_CONFLICT,
                          "'%s': signs another archive (%s %s, another manifest); remove the "
                          "stale signature file or write elsewhere",
                          have[i].label, hi.model, hi.version);
        }
    }
    size_t sl = strlen(sig);
    bool nl = len > 0 && file[len - 1] != '\n';
    *out = kiln_malloc(len + nl + sl + 1);
    KILN_CHECK_IF(rc, done, !*out, KILN_ERR_NOMEM, "out of memory");
    if (len) memcpy(*out, file, len);
    if (nl) (*out)[len] = '\n';
    memcpy(*out + len + nl, sig, sl + 1);
done:
    kiln_sign_sig_release(&add);
    kiln_sign_archive_sigs_free(have, n);
    return rc;
}

/* ---- verification ------------------------------------------------------------------- */

static void report_init(kiln_sign_archive_report *r, const kiln_sign_trust *t) {
    memset(r, 0, sizeof *r);
    r->threshold = kiln_sign_trust_release_threshold(t);
}

/* One signature block: by a key of the policy with the release role, algorithm ED, and it
 * verifies: over the archive's BLAKE2b-512 h (key id, signature, global signature over the
 * comment), or, with h NULL (no archive), the key id and the global signature only. */
static kiln_err check_signature(const kiln_sign_trust *t, const kiln_sign_sig *sig,
                                const uint8_t *h, const char *archive,
                                const kiln_sign_trust_key **signer) {
    const kiln_sign_trust_key *k;
    KILN_TRY(sign_trust_signer(t, sig, KILN_SIGN_ROLE_RELEASE, &k));
    KILN_FAIL_IF(sig->alg != KILN_SIGN_PREHASHED, KILN_ERR_VERIFY,
                 "'%s': a legacy ('Ed') signature; archives are signed with algorithm 'ED' "
                 "(prehashed)",
                 sig->label);
    KILN_TRY(h ? sign_verify_digest(&k->pub, sig, h, 64, archive)
               : sign_verify_comment(&k->pub, sig));
    *signer = k;
    return KILN_OK;
}

/* A verified signature's comment names the manifest (of the archive, or the one given: where
 * names it), and the policy allows what it says about validation. */
static kiln_err check_comment(const kiln_sign_trust *t, const kiln_sign_sig *sig,
                              const kiln_sign_trust_key *k, const char *where,
                              const kiln_sign_archive_info *want) {
    kiln_sign_archive_info got;
    KILN_TRY(kiln_sign_archive_comment_parse(sig->trusted_comment, sig->label, &got));
    char gh[KILN_SHA256_HEX], wh[KILN_SHA256_HEX];
    kiln_hex(got.manifest_sha256, 32, gh);
    kiln_hex(want->manifest_sha256, 32, wh);
    KILN_FAIL_IF(strcmp(gh, wh) != 0, KILN_ERR_VERIFY,
                 "'%s': the trusted comment names manifest sha256:%s, the manifest in '%s' is "
                 "sha256:%s",
                 sig->label, gh, where, wh);
    KILN_FAIL_IF(strcmp(got.model, want->model) != 0, KILN_ERR_VERIFY,
                 "'%s': the trusted comment names model '%s', the manifest in '%s' names '%s'",
                 sig->label, got.model, where, want->model);
    KILN_FAIL_IF(strcmp(got.version, want->version) != 0, KILN_ERR_VERIFY,
                 "'%s': the trusted comment names version '%s', the manifest in '%s' names '%s'",
                 sig->label, got.version, where, want->version);
    KILN_FAIL_IF(got.validation != want->validation, KILN_ERR_VERIFY,
                 "'%s': the trusted comment says validation:%s, the manifest in '%s' says %s",
                 sig->label, kiln_sign_validation_name(got.validation), where,
                 kiln_sign_validation_name(want->validation));
    KILN_FAIL_IF(got.allow_unvalidated && !kiln_sign_trust_accepts_unvalidated(t), KILN_ERR_VERIFY,
                 "'%s': key '%s' signed an unvalidated archive (validation:%s, "
                 "allow-unvalidated) and the trust policy '%s' does not accept unvalidated "
                 "archives (accept_unvalidated)",
                 sig->label, k->name, kiln_sign_validation_name(got.validation),
                 sign_trust_label(t));
    return KILN_OK;
}

/* Steps 1 to 3 of kiln_sign_verify_archive: over the archive at archive_path, or, with
 * archive_path NULL, over the comments only against the manifest man (where names it). */
static kiln_err verify_sigs(const char *archive_path, const uint8_t *prehash,
                            const kiln_manifest *man, const char *where, const char *sigs,
                            size_t sigs_len, const char *sigs_label, const kiln_sign_trust *t,
                            kiln_sign_archive_report *report) {
    kiln_sign_archive_report local;
    kiln_sign_archive_report *r = report ? report : &local;
    report_init(r, t);
    KILN_TRY(sign_init());
    kiln_sign_sig *s = NULL;
    size_t n = 0;
    uint8_t h[crypto_generichash_BYTES_MAX];
    const kiln_sign_trust_key *by[KILN_SIGN_ARCHIVE_MAX_SIGS];
    kiln_err rc = KILN_OK;
    KILN_CHECK(rc, out, kiln_sign_archive_sigs_parse(sigs, sigs_len, sigs_label, &s, &n));
    r->nsigs = n;
    /* The bytes are authenticated before anything inside the archive is parsed (here; a
     * caller that unpacked while hashing gives the prehash and the manifest it found). */
    if (prehash)
        memcpy(h, prehash, sizeof h);
    else if (archive_path)
        KILN_CHECK(rc, out, kiln_blake2b_file(archive_path, h, sizeof h));
    bool have_h = prehash || archive_path;
    for (size_t i = 0; i < n; i++)
        KILN_CHECK(rc, out, check_signature(t, &s[i], have_h ? h : NULL, where, &by[i]));
    r->sigs_verified = have_h;
    if (man)
        info_from_manifest(man, &r->info);
    else
        KILN_CHECK(rc, out, archive_info(archive_path, &r->info));
    for (size_t i = 0; i < n; i++) {
        KILN_CHECK(rc, out, check_comment(t, &s[i], by[i], where, &r->info));
        bool seen = false;
        for (size_t j = 0; j < r->nsigners; j++)
            seen = seen || r->signers[j] == by[i];
        if (!seen) r->signers[r->nsigners++] = by[i];
    }
    /* Every comment matched the verdict, and one other than passed carries the flag. */
    r->info.allow_unvalidated = r->info.validation != KILN_SIGN_VALIDATION_PASSED;
    r->threshold_met = (int)r->nsigners >= r->threshold;
    if (!r->threshold_met) {
        char names[512] = "";
        for (size_t j = 0; j < r->nsigners; j++) {
            size_t l = strlen(names);
            snprintf(names + l, sizeof names - l, "%s'%s'", j ? ", " : "", r->signers[j]->name);
        }
        rc = kiln_fail(KILN_ERR_VERIFY,
                       "'%s': the trust policy '%s' needs %d distinct release keys, the archive "
                       "is signed by %zu (%s%s)",
                       where, sign_trust_label(t), r->threshold, r->nsigners, names,
                       n > r->nsigners ? "; a key that signs twice counts once" : "");
    }
out:
    kiln_sign_archive_sigs_free(s, n);
    return rc;
}

kiln_err kiln_sign_verify_archive_sigs(const char *archive_path, const char *sigs, size_t sigs_len,
                                       const char *sigs_label, const kiln_sign_trust *t,
                                       kiln_sign_archive_report *report) {
    return verify_sigs(archive_path, NULL, NULL, archive_path, sigs, sigs_len, sigs_label, t,
                       report);
}

kiln_err kiln_sign_verify_manifest_sigs(const char *manifest, size_t manifest_len,
                                        const char *manifest_label, const char *sigs,
                                        size_t sigs_len, const char *sigs_label,
                                        const kiln_sign_trust *t,
                                        kiln_sign_archive_report *report) {
    kiln_sign_archive_report local;
    kiln_sign_archive_report *r = report ? report : &local;
    report_init(r, t);
    kiln_manifest *m = NULL;
    KILN_TRY(kiln_manifest_parse(manifest, manifest_len, manifest_label, &m));
    kiln_err rc = verify_sigs(NULL, NULL, m, manifest_label, sigs, sigs_len, sigs_label, t, r);
    kiln_manifest_free(m);
    return rc;
}

/* A fresh private directory ".BASE.verify-XXXXXX" beside path; caller frees. */
static kiln_err temp_beside(const char *path, char **out) {
    *out = NULL;
    char *dir = kiln_dirname(path);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char *tmp = dir ? kiln_asprintf("%s/.%s.verify-XXXXXX", dir, base) : NULL;
    free(dir);
    if (!tmp) return KILN_ERR_NOMEM;
    if (!mkdtemp(tmp)) {
        kiln_err rc =
            kiln_fail_errno(KILN_ERR_IO, "cannot create a temporary directory for '%s'", path);
        free(tmp);
        return rc;
    }
    *out = tmp;
    return KILN_OK;
}

kiln_err kiln_sign_verify_archive_sigs_prehashed(const char *archive_path,
                                                 const uint8_t blake2b[64], const char *sigs,
                                                 size_t sigs_len, const char *sigs_label,
                                                 const kiln_sign_trust *t,
                                                 kiln_sign_archive_report *report) {
    return verify_sigs(archive_path, blake2b, NULL, archive_path, sigs, sigs_len, sigs_label, t,
                       report);
}

kiln_err kiln_sign_verify_prehashed_sigs(const uint8_t blake2b[64], const kiln_manifest *m,
                                         const char *where, const char *sigs, size_t sigs_len,
                                         const char *sigs_label, const kiln_sign_trust *t,
                                         kiln_sign_archive_report *report) {
    return verify_sigs(NULL, blake2b, m, where, sigs, sigs_len, sigs_label, t, report);
}

/* The archive read once: each chunk into the hash pipe (BLAKE2b on its own thread) and to
 * libarchive, which decompresses and hashes every file on this one. */
typedef struct file_source {
    int fd;
    const char *path;
    kiln_hashpipe *pipe;
} file_source;

static kiln_err file_read(void *ctx, const void **buf, size_t *n) {
    file_source *f = ctx;
    uint8_t *slot = kiln_hashpipe_slot(f->pipe);
    ssize_t got;
    do
        got = read(f->fd, slot, KILN_HASHPIPE_CHUNK);
    while (got < 0 && errno == EINTR);
    if (got < 0) return kiln_fail_errno(KILN_ERR_IO, "cannot read '%s'", f->path);
    kiln_hashpipe_post(f->pipe, (size_t)got);
    *buf = slot;
    *n = (size_t)got;
    return KILN_OK;
}

/* What libarchive did not read (the end of a stream it stopped early, or the rest after a
 * failure), through the pipe, so that the digest is the whole file's. */
static kiln_err file_drain(file_source *f) {
    for (;;) {
        const void *b;
        size_t n;
        KILN_TRY(file_read(f, &b, &n));
        if (!n) return KILN_OK;
    }
}

static kiln_err verify_archive(const char *archive_path, const uint8_t *prehash, const char *sigs,
                               size_t sigs_len, const char *sigs_label, const kiln_sign_trust *t,
                               const char *out_dir, kiln_sign_archive_report *report) {
    kiln_sign_archive_report local;
    kiln_sign_archive_report *r = report ? report : &local;
    report_init(r, t);
    if (out_dir) {
        size_t ol = strlen(out_dir);
        KILN_FAIL_IF(ol == 0 || out_dir[ol - 1] == '/', KILN_ERR_USAGE,
                     "'%s': the output directory must be a path without a trailing '/'", out_dir);
        KILN_FAIL_IF(kiln_path_exists(out_dir), KILN_ERR_CONFLICT,
                     "'%s' exists already; refusing to unpack over it", out_dir);
    }
    char *tmp = NULL, *inner = NULL;
    kiln_manifest *m = NULL;
    kiln_hashpipe *pipe = NULL;
    file_source fs = {.fd = -1, .path = archive_path};
    kiln_err rc = KILN_OK, urc = KILN_OK;
    char umsg[1024] = "";
    if (out_dir) {
        KILN_CHECK(rc, out, temp_beside(out_dir, &tmp));
        inner = kiln_path_join(tmp, "model");
        KILN_CHECK_IF(rc, out, !inner, KILN_ERR_NOMEM, "out of memory");
    }
    if (prehash) {
        /* Hashed already (a pull, while downloading): signatures first, then the unpack. */
        KILN_CHECK(rc, out,
                   verify_sigs(archive_path, prehash, NULL, archive_path, sigs, sigs_len,
                               sigs_label, t, r));
        if (out_dir)
            KILN_CHECK(rc, out, kiln_archive_unpack(archive_path, inner, NULL, &m));
        else
            KILN_CHECK(rc, out, kiln_archive_check(archive_path, NULL, &m));
    } else {
        /* One read: BLAKE2b on the pipe's thread, the unpack (or the check, every file
         * hashed, nothing written) on this one, into a private directory that is renamed
         * only once the signatures below verified. */
        uint8_t h[crypto_generichash_BYTES_MAX];
        KILN_CHECK(rc, out, kiln_hashpipe_new(KILN_HASH_BLAKE2B, true, &pipe));
        fs.pipe = pipe;
        KILN_CHECK(rc, out, kiln_open_input(archive_path, &fs.fd, NULL));
        kiln_archive_source src = {file_read, &fs};
        urc = kiln_archive_unpack_source(&src, archive_path, inner, NULL, NULL, &m);
        if (urc) snprintf(umsg, sizeof umsg, "%s", kiln_errmsg());
        KILN_CHECK(rc, out, file_drain(&fs));
        kiln_hashpipe_finish(pipe, NULL, h, NULL);
        kiln_debug("verify: this thread (reading, decompressing, file digests): %.3f s CPU",
                   kiln_thread_cpu_s());
        /* The signatures' verdict comes first, as if nothing had been unpacked: over the
         * whole file's BLAKE2b, the comments against the manifest the unpack read (or, when
         * it failed, the archive's first entry). */
        KILN_CHECK(rc, out,
                   verify_sigs(archive_path, h, m, archive_path, sigs, sigs_len, sigs_label, t, r));
        if (urc) {
            rc = kiln_fail(urc, "%s", umsg);
            goto out;
        }
    }
    /* The archive may have changed since its signatures were checked: what was unpacked
     * must be the manifest the signers named, and every file was checked against it. */
    KILN_CHECK_IF(rc, out, memcmp(m->sha256, r->info.manifest_sha256, 32) != 0, KILN_ERR_VERIFY,
                  "'%s': the manifest unpacked is not the one the signatures name (the archive "
                  "changed during verification)",
                  archive_path);
    if (out_dir) {
        KILN_CHECK_IF(rc, out, renameat2(AT_FDCWD, inner, AT_FDCWD, out_dir, RENAME_NOREPLACE) != 0,
                      KILN_ERR_IO, "cannot move the verified directory to '%s': %s", out_dir,
                      strerror(errno));
        char *parent = kiln_dirname(out_dir);
        if (parent) (void)kiln_fsync_dir(parent);
        free(parent);
    }
    r->files_checked = true;
out:
    if (fs.fd >= 0) close(fs.fd);
    kiln_hashpipe_free(pipe);
    kiln_rmtree(tmp);
    kiln_manifest_free(m);
    free(inner);
    free(tmp);
    return rc;
}

kiln_err kiln_sign_verify_archive(const char *archive_path, const char *sigs, size_t sigs_len,
                                  const char *sigs_label, const kiln_sign_trust *t,
                                  const char *out_dir, kiln_sign_archive_report *report) {
    return verify_archive(archive_path, NULL, sigs, sigs_len, sigs_label, t, out_dir, report);
}

kiln_err kiln_sign_verify_archive_prehashed(const char *archive_path, const uint8_t blake2b[64],
                                            const char *sigs, size_t sigs_len,
                                            const char *sigs_label, const kiln_sign_trust *t,
                                            const char *out_dir, kiln_sign_archive_report *report) {
    return verify_archive(archive_path, blake2b, sigs, sigs_len, sigs_label, t, out_dir, report);
}

void kiln_sign_signers_text(const kiln_sign_archive_report *rep, char *out, size_t len) {
    size_t n = 0;
    out[0] = 0;
    for (size_t i = 0; i < rep->nsigners && n < len; i++)
        n += (size_t)snprintf(out + n, len - n, "%s%s", i ? ", " : "", rep->signers[i]->name);
    if (n < len)
        snprintf(out + n, len - n, " (%d of %d release key%s; validation %s%s)", (int)rep->nsigners,
                 rep->threshold, rep->threshold == 1 ? "" : "s",
                 kiln_sign_validation_name(rep->info.validation),
                 rep->info.allow_unvalidated ? ", signed with allow-unvalidated" : "");
}

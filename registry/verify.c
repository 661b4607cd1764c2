/* verify.c - the registry's verification steps, done by sign/ (signatures, the trust
 * policy, channel records) and export/ (the manifest, every file's digest, secure unpack).
 *
 * An archive is bound to its manifest by its signature: the trusted comment, which the
 * signature's global part covers, is "kiln-archive/1\tmodel:M\tversion:V\tmanifest:sha256:H"
 * (sign.h), so checking H against the archive's manifest is checking the manifest's
 * signature. */
#include <stdlib.h>
#include <string.h>

#include "export.h"
#include "registry_int.h"
#include "sign.h"

struct reg_trust {
    kiln_sign_trust *t;
};

kiln_err reg_trust_load(const char *path, reg_trust **out) {
    *out = NULL;
    reg_trust *t = kiln_calloc(1, sizeof *t);
    if (!t) return KILN_ERR_NOMEM;
    kiln_err rc = kiln_sign_trust_load(path, &t->t);
    if (rc) {
        free(t);
        return rc;
    }
    *out = t;
    return KILN_OK;
}

void reg_trust_free(reg_trust *t) {
    if (!t) return;
    kiln_sign_trust_free(t->t);
    free(t);
}

kiln_err reg_archive_meta_read(const char *archive, reg_archive_meta *m) {
    memset(m, 0, sizeof *m);
    kiln_manifest *man = NULL;
    json_t *card = NULL;
    KILN_TRY(kiln_archive_inspect(archive, &man, &card));
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out,
                  strlen(man->name) > KILN_REGISTRY_NAME_MAX ||
                      strlen(man->version) > KILN_REGISTRY_NAME_MAX,
                  KILN_ERR_FORMAT, "'%s': manifest name or version is too long", archive);
    snprintf(m->name, sizeof m->name, "%s", man->name);
    snprintf(m->version, sizeof m->version, "%s", man->version);
    KILN_CHECK(rc, out, kiln_json_parse(man->text, man->text_len, archive, &m->manifest));
    memcpy(m->manifest_sha256, man->sha256, sizeof m->manifest_sha256);
    m->card = card;
    card = NULL;
    if (man->validation_present) {
        char hex[KILN_SHA256_HEX];
        kiln_hex(man->validation_sha256, KILN_SHA256_BYTES, hex);
        m->validation = json_pack("{s:b, s:s}", "passed", man->validation_passed, "sha256", hex);
        KILN_CHECK_IF(rc, out, !m->validation, KILN_ERR_NOMEM, "out of memory");
    }
out:
    json_decref(card);
    kiln_manifest_free(man);
    if (rc) reg_archive_meta_release(m);
    return rc;
}

void reg_archive_meta_release(reg_archive_meta *m) {
    json_decref(m->manifest);
    json_decref(m->card);
    json_decref(m->validation);
    m->manifest = m->card = m->validation = NULL;
}

kiln_err reg_verify_archive(const reg_trust *t, const char *archive, const char *label,
                            const char *sig_text, size_t sig_len, reg_archive_meta *m) {
    memset(m, 0, sizeof *m);
    KILN_FAIL_IF(!t, KILN_ERR_VERIFY, "'%s': no trust policy to verify the archive with", label);
    kiln_sign_sig sig;
    kiln_sign_sig_init(&sig);
    kiln_err rc = kiln_sign_sig_parse(sig_text, sig_len, label, &sig);
    if (rc) {
        kiln_sign_sig_release(&sig);
        return rc == KILN_ERR_FORMAT ? kiln_errprefix(KILN_ERR_VERIFY, "archive signature: ") : rc;
    }
    /* The archive's signature, by a release key of the policy. */
    const kiln_sign_trust_key *signer = NULL;
    rc = kiln_sign_trust_verify_file(t->t, &sig, archive, KILN_SIGN_ROLE_RELEASE, &signer);
    if (rc) {
        kiln_errprefix(rc, "archive signature: ");
        goto out;
    }
    /* The manifest's: the signed comment names it. */
    kiln_sign_archive_info info;
    rc = kiln_sign_archive_comment_parse(sig.trusted_comment, label, &info);
    if (rc) {
        rc = kiln_errprefix(KILN_ERR_VERIFY,
                            "'%s': the archive's signature does not sign a manifest: ", label);
        goto out;
    }
    KILN_CHECK(rc, out, reg_archive_meta_read(archive, m));
    char want[KILN_SHA256_HEX], got[KILN_SHA256_HEX];
    kiln_hex(info.manifest_sha256, KILN_SHA256_BYTES, want);
    kiln_hex(m->manifest_sha256, KILN_SHA256_BYTES, got);
    KILN_CHECK_IF(rc, out, strcmp(want, got) != 0, KILN_ERR_VERIFY,
                  "'%s': manifest hashes to sha256:%s, but the signature names sha256:%s", label,
                  got, want);
    KILN_CHECK_IF(rc, out, strcmp(info.model, m->name) || strcmp(info.version, m->version),
                  KILN_ERR_VERIFY, "'%s': the signature names %s@%s, the manifest %s@%s", label,
                  info.model, info.version, m->name, m->version);
    snprintf(m->signer, sizeof m->signer, "%s", signer->name);
out:
    if (rc) reg_archive_meta_release(m);
    kiln_sign_sig_release(&sig);
    return rc;
}

kiln_err reg_record_verify(const reg_trust *t, const char *text, size_t len, const char *label,
                           reg_record *out) {
    memset(out, 0, sizeof *out);
    KILN_FAIL_IF(!t, KILN_ERR_VERIFY, "%s: no trust policy to verify the record with", label);
    kiln_sign_record r;
    kiln_sign_record_init(&r);
    kiln_err rc = kiln_sign_record_parse(text, len, label, &r);
    if (rc) {
        kiln_sign_record_release(&r);
        return rc == KILN_ERR_FORMAT ? kiln_errprefix(KILN_ERR_VERIFY, "channel record: ") : rc;
    }
    /* Signatures and the channel's threshold only: the caller checks seq and expiry in its
     * own order (now 0 and min_seq 0 pass both here). */
    rc = kiln_sign_record_verify(&r, t->t, 0, 0, label, NULL);
    KILN_CHECK_IF(rc, done,
                  strlen(r.model) > KILN_REGISTRY_NAME_MAX ||
                      strlen(r.channel) > KILN_REGISTRY_NAME_MAX ||
                      strlen(r.version) > KILN_REGISTRY_NAME_MAX || r.seq > INT64_MAX,
                  KILN_ERR_VERIFY, "%s: a name or seq is out of the registry's range", label);
    if (rc) goto done;
    snprintf(out->model, sizeof out->model, "%s", r.model);
    snprintf(out->channel, sizeof out->channel, "%s", r.channel);
    snprintf(out->version, sizeof out->version, "%s", r.version);
    char hex[KILN_SHA256_HEX];
    kiln_hex(r.digest, 32, hex);
    snprintf(out->digest, sizeof out->digest, "sha256:%s", hex);
    out->seq = (int64_t)r.seq;
    out->expires = r.expires;
    snprintf(out->reason, sizeof out->reason, "%s", r.reason ? r.reason : "");
done:
    kiln_sign_record_release(&r);
    return rc;
}

kiln_err reg_archive_unpack_verified(const char *archive,
                                     const uint8_t manifest_sha256[KILN_SHA256_BYTES],
                                     const char *dir) {
    kiln_manifest *m = NULL;
    KILN_TRY(kiln_archive_unpack(archive, dir, NULL, &m));
    kiln_err rc = KILN_OK;
    if (memcmp(m->sha256, manifest_sha256, KILN_SHA256_BYTES) != 0)
        rc = kiln_fail(KILN_ERR_VERIFY, "'%s': the unpacked manifest is not the one verified",
                       archive);
    kiln_manifest_free(m);
    return rc;
}

/* verify.c - the registry's verification steps, carried out by sign/ (signatures, trust
 * policy, channel records) and export/ (manifests, secure unpack).
 *
 * export/ is wired (manifest, card, unpack with every file's digest). NOT YET WIRED: sign/
 * has not landed in main; until it does, the trust policy is only parsed as JSON and every
 * signature step refuses (KILN_ERR_UNSUPPORTED): the registry never accepts what it cannot
 * verify. The wiring, its tests and promote/rollback/channel put wait on the branch
 * registry-sign (this branch with the sign branch merged). */
#include <stdlib.h>
#include <string.h>

#include "export.h"
#include "registry_int.h"

struct reg_trust {
    char *path;
    json_t *doc;
};

kiln_err reg_trust_load(const char *path, reg_trust **out) {
    *out = NULL;
    reg_trust *t = kiln_calloc(1, sizeof *t);
    if (!t) return KILN_ERR_NOMEM;
    t->path = kiln_strdup(path);
    kiln_err rc = t->path ? kiln_json_load_file(path, &t->doc) : KILN_ERR_NOMEM;
    if (rc) {
        reg_trust_free(t);
        return rc;
    }
    *out = t;
    return KILN_OK;
}

void reg_trust_free(reg_trust *t) {
    if (!t) return;
    json_decref(t->doc);
    free(t->path);
    free(t);
}

#define NOT_WIRED(what, subject)                                                                   \
    kiln_fail(KILN_ERR_UNSUPPORTED, "'%s': %s is not wired yet (needs sign/); refusing", \
              subject, what)

kiln_err reg_verify_archive(const reg_trust *t, const char *archive, const char *label, const char *sig_text,
                            size_t sig_len, reg_archive_meta *m) {
    (void)t, (void)archive, (void)sig_text, (void)sig_len;
    memset(m, 0, sizeof *m);
    return NOT_WIRED("archive signature verification", label);
}

kiln_err reg_archive_meta_read(const char *archive, reg_archive_meta *m) {
    memset(m, 0, sizeof *m);
    kiln_manifest *man = NULL;
    json_t *card = NULL;
    KILN_TRY(kiln_archive_inspect(archive, &man, &card));
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, strlen(man->name) > KILN_REGISTRY_NAME_MAX || strlen(man->version) > KILN_REGISTRY_NAME_MAX,
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

kiln_err reg_record_verify(const reg_trust *t, const char *text, size_t len, const char *label, reg_record *out) {
    (void)t, (void)text, (void)len;
    memset(out, 0, sizeof *out);
    return NOT_WIRED("channel record verification", label);
}

kiln_err reg_archive_unpack_verified(const char *archive, const uint8_t manifest_sha256[KILN_SHA256_BYTES],
                                     const char *dir) {
    kiln_manifest *m = NULL;
    KILN_TRY(kiln_archive_unpack(archive, dir, NULL, &m));
    kiln_err rc = KILN_OK;
    if (memcmp(m->sha256, manifest_sha256, KILN_SHA256_BYTES) != 0)
        rc = kiln_fail(KILN_ERR_VERIFY, "'%s': the unpacked manifest is not the one verified", archive);
    kiln_manifest_free(m);
    return rc;
}

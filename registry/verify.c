/* verify.c - the registry's verification steps, carried out by sign/ (signatures, trust
 * policy, channel records) and export/ (manifests, secure unpack).
 *
 * NOT YET WIRED: sign/ and export/ have not landed in main. Until they do, every step
 * below refuses (KILN_ERR_UNSUPPORTED): the registry never accepts what it cannot verify. */
#include <stdlib.h>
#include <string.h>

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
    kiln_fail(KILN_ERR_UNSUPPORTED, "'%s': %s is not wired yet (needs sign/ and export/); refusing", \
              subject, what)

kiln_err reg_verify_archive(const reg_trust *t, const char *archive, const char *label, const char *sig_text,
                            size_t sig_len, reg_archive_meta *m) {
    (void)t, (void)archive, (void)sig_text, (void)sig_len;
    memset(m, 0, sizeof *m);
    return NOT_WIRED("archive signature verification", label);
}

kiln_err reg_archive_meta_read(const char *archive, reg_archive_meta *m) {
    memset(m, 0, sizeof *m);
    return NOT_WIRED("reading the manifest", archive);
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
    (void)manifest_sha256, (void)dir;
    return NOT_WIRED("manifest verification and unpacking", archive);
}

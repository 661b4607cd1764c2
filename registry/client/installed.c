/* installed.c - a pulled directory checked again without a registry (kiln installed, and a
 * kiln_watch start while none answers): the record and archive signatures its pull kept in
 * the state directory, with sign/'s kiln_sign_verify_manifest_sigs, and every file with
 * export/'s kiln_manifest_verify_dir. */
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "export.h"
#include "sign.h"

kiln_err reg_installed_verify(const kiln_sign_trust *trust, const char *state, const char *model,
                              const char *channel, const char *dir, const char *want,
                              char **record, reg_record *rec, kiln_registry_installed *info) {
    *record = NULL;
    char *st = state ? kiln_strdup(state) : reg_default_state(),
         *file = st ? kiln_asprintf("%s/channels/%s/%s.json", st, model, channel) : NULL,
         *mpath = kiln_path_join(dir, KILN_MANIFEST_NAME), *mtext = NULL;
    size_t mlen = 0;
    json_t *j = NULL;
    kiln_manifest *m = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !file || !mpath, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK_IF(rc, out, !kiln_path_exists(file), KILN_ERR_NOTFOUND,
                  "no pull of %s@%s recorded in '%s'", model, channel, st);
    KILN_CHECK(rc, out, kiln_json_load_file(file, &j));
    json_t *seq = json_object_get(j, "seq"), *rj = json_object_get(j, "record"),
           *sj = json_object_get(j, "signature");
    KILN_CHECK_IF(rc, out, !json_is_integer(seq), KILN_ERR_FORMAT, "'%s': 'seq' is not an integer",
                  file);
    KILN_CHECK_IF(rc, out, !json_is_string(rj) || !json_is_string(sj), KILN_ERR_NOTFOUND,
                  "'%s' keeps no record and signatures for an installed model (a pull by a kiln "
                  "before 0.1.0-2026-11-30 wrote it; the next pull does)",
                  file);
    /* Before anything is hashed: a kept model the channel has moved on from is not wanted. */
    KILN_CHECK_IF(rc, out, want && strcmp(json_string_value(rj), want), KILN_ERR_NOTFOUND,
                  "'%s': its record is not the channel's current one", dir);
    /* 1-3 of a pull, the seq being the one accepted. */
    KILN_CHECK(rc, out,
               reg_record_accept(trust, json_string_value(rj), json_string_length(rj), model,
                                 channel, json_integer_value(seq), true, rec, NULL));
    KILN_CHECK_IF(rc, out, rec->seq != json_integer_value(seq), KILN_ERR_VERIFY,
                  "'%s': the kept record has seq %lld, but seq %lld was accepted", file,
                  (long long)rec->seq, (long long)json_integer_value(seq));
    /* The directory is one kiln installed (a manifest and the files it lists, nothing
     * else), said as such before anything in it is read. */
    rc = kiln_archive_dir_installed(dir);
    if (rc == KILN_ERR_CONFLICT) rc = KILN_ERR_VERIFY;
    if (rc) goto out;
    /* The release keys' signatures name this directory's manifest. */
    KILN_CHECK(rc, out, kiln_read_file(mpath, KILN_MANIFEST_MAX_BYTES, &mtext, &mlen));
    kiln_sign_archive_report rep;
    char slabel[200];
    snprintf(slabel, sizeof slabel, "the kept signature of %s@%s", model, rec->version);
    rc = kiln_sign_verify_manifest_sigs(mtext, mlen, mpath, json_string_value(sj),
                                        json_string_length(sj), slabel, trust, &rep);
    if (rc == KILN_ERR_FORMAT) rc = KILN_ERR_VERIFY;
    if (rc) goto out;
    KILN_CHECK_IF(rc, out, strcmp(rep.info.model, model) || strcmp(rep.info.version, rec->version),
                  KILN_ERR_VERIFY, "'%s' is %s@%s, but the channel record names %s@%s", dir,
                  rep.info.model, rep.info.version, model, rec->version);
    /* Every file. */
    KILN_CHECK(rc, out, kiln_manifest_parse(mtext, mlen, mpath, &m));
    KILN_CHECK(rc, out, kiln_manifest_verify_dir(m, dir));
    *record = kiln_strdup(json_string_value(rj));
    KILN_CHECK_IF(rc, out, !*record, KILN_ERR_NOMEM, "out of memory");
    if (info) {
        memset(info, 0, sizeof *info);
        snprintf(info->model, sizeof info->model, "%s", model);
        snprintf(info->channel, sizeof info->channel, "%s", channel);
        snprintf(info->version, sizeof info->version, "%s", rec->version);
        snprintf(info->digest, sizeof info->digest, "%s", rec->digest);
        info->seq = rec->seq;
        info->expires = rec->expires;
        reg_signers_text(&rep, info->signed_by, sizeof info->signed_by);
        kiln_hex(m->sha256, sizeof m->sha256, info->manifest_sha256);
        info->files = m->nfiles;
        for (size_t i = 0; i < m->nfiles; i++)
            info->bytes += m->files[i].size;
    }
out:
    kiln_manifest_free(m);
    json_decref(j);
    free(mtext);
    free(mpath);
    free(file);
    free(st);
    return rc;
}

kiln_err kiln_registry_installed_verify(const char *trust, const char *state, const char *ref,
                                        const char *dir, kiln_registry_installed *out) {
    char model[KILN_REGISTRY_NAME_MAX + 1], channel[KILN_REGISTRY_NAME_MAX + 1];
    KILN_FAIL_IF(!trust || !dir || !reg_ref_split(ref, model, channel), KILN_ERR_USAGE,
                 "checking an installed model needs NAME@CHANNEL, a trust policy "
                 "and the model directory");
    KILN_TRY(kiln_registry_check_name("model", model));
    /* A pull of a channel keeps what this checks; NAME@VERSION names none. */
    KILN_FAIL_IF(kiln_registry_looks_like_version(channel), KILN_ERR_USAGE,
                 "'%s' names a version ('%s' begins with a digit or with 'v' and a digit): "
                 "kiln installed checks what a pull of a channel installed, NAME@CHANNEL",
                 ref, channel);
    KILN_TRY(kiln_registry_check_channel(channel));
    KILN_FAIL_IF(!kiln_path_exists(dir), KILN_ERR_NOTFOUND, "'%s': no such directory", dir);
    kiln_sign_trust *t = NULL;
    KILN_TRY(kiln_registry_trust_walk(NULL, trust, state, NULL, NULL, &t));
    char *record = NULL;
    reg_record rec;
    kiln_err rc = reg_installed_verify(t, state, model, channel, dir, NULL, &record, &rec, out);
    if (!rc && out) out->trust_version = kiln_sign_trust_version(t);
    free(record);
    kiln_sign_trust_free(t);
    return rc;
}

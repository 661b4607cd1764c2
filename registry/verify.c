/* verify.c - what the registry adds around sign/'s verification: the archive's metadata
 * it stores (manifest, card, validation summary and bytes), the signers named for messages,
 * messages relabelled for the client, and a channel record's fields in the registry's ranges.
 *
 * The checks themselves are sign/'s: kiln_sign_verify_archive_sigs (server, on upload) and
 * kiln_sign_verify_archive (client, on pull) verify every signature block over the archive's
 * bytes by a release key of the policy, that each trusted comment names the archive's own
 * manifest and validation verdict, the policy's release_threshold and accept_unvalidated,
 * and (pull) every file while unpacking securely; kiln_sign_record_verify the records.
 * reg_installed_verify checks a pulled directory again without a registry (a service's
 * start while none answers), with sign/'s kiln_sign_verify_manifest_sigs and export/'s
 * kiln_manifest_verify_dir. */
#include <stdlib.h>
#include <string.h>

#include "export.h"
#include "registry_int.h"
#include "sign.h"

kiln_err reg_archive_meta_read(const char *archive, reg_archive_meta *m) {
    memset(m, 0, sizeof *m);
    kiln_manifest *man = NULL;
    json_t *card = NULL;
    char *vtext = NULL;
    size_t vlen = 0;
    KILN_TRY(kiln_archive_inspect_with(archive, "validation.json", REG_VALIDATION_MAX, &man, &card,
                                       &vtext, &vlen));
    kiln_err rc = reg_archive_meta_take(archive, man, card, vtext, vlen, m);
    kiln_manifest_free(man);
    return rc;
}

kiln_err reg_archive_meta_take(const char *archive, const kiln_manifest *man, json_t *card,
                               char *vtext, size_t vlen, reg_archive_meta *m) {
    memset(m, 0, sizeof *m);
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
    /* Kept only as text a JSON string can carry: UTF-8 (jansson checks it) without NUL. */
    json_t *probe = vtext && !memchr(vtext, 0, vlen) ? json_stringn(vtext, vlen) : NULL;
    if (probe) {
        m->validation_text = vtext;
        m->validation_len = vlen;
        vtext = NULL;
    }
    json_decref(probe);
out:
    free(vtext);
    json_decref(card);
    if (rc) reg_archive_meta_release(m);
    return rc;
}

void reg_archive_meta_release(reg_archive_meta *m) {
    json_decref(m->manifest);
    json_decref(m->card);
    json_decref(m->validation);
    m->manifest = m->card = m->validation = NULL;
    free(m->validation_text);
    m->validation_text = NULL;
    m->validation_len = 0;
}

void reg_signers_text(const kiln_sign_archive_report *rep, char *out, size_t len) {
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

kiln_err reg_relabel(kiln_err rc, const char *path, const char *label) {
    const char *msg = kiln_errmsg();
    size_t pl = strlen(path), ll = strlen(label), n = 0;
    if (!pl || !strstr(msg, path)) return rc;
    char buf[2048];
    for (const char *p = msg; *p && n + 1 < sizeof buf;) {
        if (!strncmp(p, path, pl) && n + ll + 1 < sizeof buf) {
            memcpy(buf + n, label, ll);
            n += ll;
            p += pl;
        } else {
            buf[n++] = *p++;
        }
    }
    buf[n] = 0;
    return kiln_fail(rc, "%s", buf);
}

kiln_err reg_withdrawn(const kiln_sign_trust *t, const char *digest, const char *what) {
    const char *why = t ? kiln_sign_trust_withdrawn(t, digest) : NULL;
    KILN_FAIL_IF(why, KILN_ERR_VERIFY,
                 "%s is %s, which trust policy version %llu withdrew: %s; refusing", what, digest,
                 (unsigned long long)kiln_sign_trust_version(t), why);
    return KILN_OK;
}

kiln_err reg_record_verify(const kiln_sign_trust *t, const char *text, size_t len,
                           const char *label, reg_record *out) {
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
    rc = kiln_sign_record_verify(&r, t, 0, 0, label, NULL);
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
    const char *at = ref ? strchr(ref, '@') : NULL;
    KILN_FAIL_IF(!trust || !dir || !at || at == ref || (size_t)(at - ref) > KILN_REGISTRY_NAME_MAX,
                 KILN_ERR_USAGE,
                 "checking an installed model needs NAME@CHANNEL, a trust policy "
                 "and the model directory");
    char model[KILN_REGISTRY_NAME_MAX + 1];
    snprintf(model, sizeof model, "%.*s", (int)(at - ref), ref);
    KILN_TRY(kiln_registry_check_name("model", model));
    /* A pull of a channel keeps what this checks; NAME@VERSION names none. */
    KILN_FAIL_IF(kiln_registry_looks_like_version(at + 1), KILN_ERR_USAGE,
                 "'%s' names a version ('%s' begins with a digit or with 'v' and a digit): "
                 "kiln installed checks what a pull of a channel installed, NAME@CHANNEL",
                 ref, at + 1);
    KILN_TRY(kiln_registry_check_channel(at + 1));
    KILN_FAIL_IF(!kiln_path_exists(dir), KILN_ERR_NOTFOUND, "'%s': no such directory", dir);
    kiln_sign_trust *t = NULL;
    KILN_TRY(kiln_registry_trust_walk(NULL, trust, state, NULL, NULL, &t));
    char *record = NULL;
    reg_record rec;
    kiln_err rc = reg_installed_verify(t, state, model, at + 1, dir, NULL, &record, &rec, out);
    if (!rc && out) out->trust_version = kiln_sign_trust_version(t);
    free(record);
    kiln_sign_trust_free(t);
    return rc;
}

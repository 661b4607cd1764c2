/* verify.c - what the registry adds around sign/'s verification: the archive's metadata
 * it stores (manifest, card, validation summary and bytes), the signers named for messages,
 * messages relabelled for the client, and a channel record's fields in the registry's ranges.
 *
 * The checks themselves are sign/'s: kiln_sign_verify_archive_sigs (server, on upload) and
 * kiln_sign_verify_archive (client, on pull) verify every signature block over the archive's
 * bytes by a release key of the policy, that each trusted comment names the archive's own
 * manifest and validation verdict, the policy's release_threshold and accept_unvalidated,
 * and (pull) every file while unpacking securely; kiln_sign_record_verify the records.
 * A pulled directory checked again without a registry is the client's (client/installed.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export.h"
#include "registry_common.h"
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
    kiln_sign_signers_text(rep, out, len); /* sign/'s, which kiln release uses too */
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

kiln_err reg_trust_same_version(const kiln_sign_trust *have, const char *have_label,
                                const kiln_sign_trust *other, const char *other_label) {
    char *diff = kiln_sign_trust_diff(have, other);
    if (!diff) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    if (*diff)
        rc = kiln_fail(KILN_ERR_VERIFY,
                       "%s is trust version %llu, and so is %s, but they are different policies "
                       "(%.*s): two versions %llu were signed (or one was altered), a fork that "
                       "the root key holders must resolve",
                       other_label, (unsigned long long)kiln_sign_trust_version(other), have_label,
                       (int)strcspn(diff, "\n"), diff,
                       (unsigned long long)kiln_sign_trust_version(other));
    free(diff);
    return rc;
}

char *reg_dataset_comment(const char *name, const char *hex) {
    return kiln_asprintf("kiln-dataset/1\tname:%s\tsha256:%s", name, hex);
}

kiln_err reg_dataset_verify(const kiln_sign_trust *t, const char *sig, size_t sig_len,
                            const char *sig_label, const char *path, const char *name,
                            const char *hex, char *who, size_t who_len) {
    kiln_sign_sig s;
    kiln_sign_sig_init(&s);
    char *want = reg_dataset_comment(name, hex);
    const kiln_sign_trust_key *signer = NULL;
    uint8_t d[KILN_SHA256_BYTES];
    char got[KILN_SHA256_HEX];
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !want, KILN_ERR_NOMEM, "out of memory");
    rc = kiln_sign_sig_parse(sig, sig_len, sig_label, &s);
    if (rc) {
        rc = kiln_errprefix(KILN_ERR_VERIFY, "dataset signature: ");
        goto out;
    }
    KILN_CHECK_IF(rc, out, strcmp(s.trusted_comment, want), KILN_ERR_VERIFY,
                  "%s: its trusted comment does not name dataset '%s' sha256:%s (a dataset's "
                  "signature says \"kiln-dataset/1\", its name and its digest)",
                  sig_label, name, hex);
    KILN_CHECK(rc, out, kiln_sha256_file(path, d));
    kiln_hex(d, sizeof d, got);
    KILN_CHECK_IF(rc, out, strcmp(got, hex), KILN_ERR_VERIFY,
                  "dataset '%s': its bytes are sha256:%s, not sha256:%s", name, got, hex);
    KILN_CHECK(rc, out, kiln_sign_trust_verify_file(t, &s, path, KILN_SIGN_ROLE_RELEASE, &signer));
    if (who) snprintf(who, who_len, "%s", signer && signer->name ? signer->name : "?");
out:
    kiln_sign_sig_release(&s);
    free(want);
    return rc;
}

kiln_err reg_repro_verify(const kiln_sign_trust *t, const char *text, const char *sig,
                          const char *label, const char *model, const char *version,
                          const char *digest, const kiln_sign_trust_key **signer,
                          bool *identical) {
    *signer = NULL;
    *identical = false;
    kiln_sign_sig s;
    kiln_sign_sig_init(&s);
    json_t *j = NULL;
    char *canon = NULL, *want = NULL;
    kiln_err rc = kiln_sign_sig_parse(sig, strlen(sig), label, &s);
    if (rc) {
        rc = kiln_errprefix(KILN_ERR_VERIFY, "reproduction record: ");
        goto out;
    }
    const kiln_sign_trust_key *k = kiln_sign_trust_find(t, s.keyid);
    char id[KILN_SIGN_KEYID_HEX];
    kiln_sign_keyid_hex(s.keyid, id);
    KILN_CHECK_IF(rc, out, !k || !(k->roles & KILN_SIGN_ROLE_REPRODUCE), KILN_ERR_VERIFY,
                  "%s: signed by key %s, which the trust policy does not hold with the reproduce "
                  "role",
                  label, id);
    KILN_CHECK(rc, out, kiln_sign_verify_buffer(&k->pub, &s, text, strlen(text), label));
    KILN_CHECK(rc, out, kiln_json_parse(text, strlen(text), label, &j));
    canon = kiln_json_canonical(j);
    KILN_CHECK_IF(rc, out, !canon, KILN_ERR_NOMEM, "out of memory");
    const char *f = json_string_value(json_object_get(j, "format")),
               *m = json_string_value(json_object_get(j, "model")),
               *v = json_string_value(json_object_get(j, "version")),
               *d = json_string_value(json_object_get(j, "digest")),
               *verdict = json_string_value(json_object_get(j, "verdict"));
    KILN_CHECK_IF(rc, out,
                  strcmp(canon, text) || !f || strcmp(f, REG_REPRO_FORMAT) || !m || !v || !d ||
                      !verdict || (strcmp(verdict, "identical") && strcmp(verdict, "different")),
                  KILN_ERR_VERIFY,
                  "%s: not a %s record (canonical JSON with format, model, version, digest and "
                  "verdict)",
                  label, REG_REPRO_FORMAT);
    KILN_CHECK_IF(rc, out, strcmp(m, model) || strcmp(v, version) || strcmp(d, digest),
                  KILN_ERR_VERIFY, "%s names %s@%s %s, not %s@%s %s", label, m, v, d, model,
                  version, digest);
    want = kiln_asprintf("%s\tdigest:%s\tverdict:%s", REG_REPRO_FORMAT, d, verdict);
    KILN_CHECK_IF(rc, out, !want, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK_IF(rc, out, strcmp(s.trusted_comment, want), KILN_ERR_VERIFY,
                  "%s: its trusted comment is not '%s'", label, want);
    *signer = k;
    *identical = !strcmp(verdict, "identical");
out:
    kiln_sign_sig_release(&s);
    json_decref(j);
    free(canon);
    free(want);
    return rc;
}

int reg_repro_count(const kiln_sign_trust *t, const char *const *keys, size_t nkeys,
                    const json_t *docs, const char *model, const char *version,
                    const char *digest) {
    bool seen[256] = {false};
    int n = 0;
    size_t i;
    json_t *doc;
    json_array_foreach((json_t *)docs, i, doc) {
        const char *text = json_string_value(json_object_get(doc, "record")),
                   *sig = json_string_value(json_object_get(doc, "signature"));
        const kiln_sign_trust_key *k = NULL;
        bool same = false;
        if (!text || !sig ||
            reg_repro_verify(t, text, sig, "reproduction record", model, version, digest, &k,
                             &same) != KILN_OK) {
            kiln_errclear();
            continue;
        }
        for (size_t j = 0; same && j < nkeys && j < 256; j++)
            if (!strcmp(keys[j], k->name) && !seen[j]) {
                seen[j] = true;
                n++;
            }
    }
    return n;
}

kiln_err reg_repro_required(const kiln_sign_trust *t, const char *channel, const json_t *docs,
                            const char *model, const char *version, const char *digest,
                            const char *what) {
    const char *const *keys;
    size_t nkeys;
    int need = t ? kiln_sign_trust_reproduced_by(t, channel, &keys, &nkeys) : 0;
    if (!need) return KILN_OK;
    int have = reg_repro_count(t, keys, nkeys, docs, model, version, digest);
    if (have >= need) return KILN_OK;
    char names[512];
    size_t len = 0;
    names[0] = 0;
    for (size_t i = 0; i < nkeys && len < sizeof names; i++)
        len += (size_t)snprintf(names + len, sizeof names - len, "%s'%s'", i ? ", " : "", keys[i]);
    return kiln_fail(KILN_ERR_VERIFY,
                     "%s: channel '%s' requires %d reproduction record%s of %s@%s (%s) with the "
                     "verdict identical, signed by %s; %d valid",
                     what, channel, need, need == 1 ? "" : "s", model, version, digest, names,
                     have);
}

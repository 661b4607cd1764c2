/* channel.c - the client's side of channels: sign the next record for a version and put it
 * (promote, rollback, renew: the current version again, its record verified first), and find
 * the version a channel pointed at before. kiln promote, kiln rollback, kiln renew and
 * kiln_release_run (release/) share it. */
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "sign.h"

/* --out of promote, rollback and renew is a new file, as kiln channel sign's and kiln trust
 * sign's are: a record never replaces what is there (a trust policy, a record being
 * co-signed). */
static kiln_err record_out_new(const char *save_to) {
    KILN_FAIL_IF(save_to && kiln_path_exists(save_to), KILN_ERR_CONFLICT,
                 "'%s' exists already; a record is written to a new file (give another --out; "
                 "add signatures to a record with kiln channel sign --add)",
                 save_to);
    return KILN_OK;
}

kiln_err kiln_registry_promote(const kiln_registry_client_opts *c,
                               const kiln_registry_promote_opts *o, kiln_registry_promoted *out) {
    memset(out, 0, sizeof *out);
    KILN_FAIL_IF(!o->nkeys, KILN_ERR_USAGE, "promoting %s to '%s' needs a promote key",
                 o->version ? o->version : "?", o->channel ? o->channel : "?");
    KILN_TRY(kiln_registry_check_name("model", o->model));
    KILN_TRY(kiln_registry_check_channel(o->channel));
    /* A version stored before the naming rule can still be promoted (renewed, rolled back
     * to): the channel's name, not the version's, is what a client reads NAME@REF by. */
    KILN_TRY(reg_check_version_chars(o->version));
    KILN_FAIL_IF(o->expires_in < 0, KILN_ERR_USAGE, "a record's lifetime must be positive");
    KILN_TRY(record_out_new(o->save_to));
    char *cur = NULL, *text = NULL, *vpath = NULL;
    size_t cur_len = 0, text_len = 0;
    json_t *ver = NULL;
    kiln_sign_record r, old;
    kiln_sign_record_init(&r);
    kiln_sign_record_init(&old);
    uint64_t seq = 0;
    kiln_err rc = kiln_registry_get_channel(c, o->model, o->channel, &cur, &cur_len);
    if (rc == KILN_OK) {
        rc = kiln_sign_record_parse(cur, cur_len, "the channel's current record", &old);
        seq = old.seq;
    } else if (rc == KILN_ERR_NOTFOUND) {
        rc = KILN_OK;
    }
    if (rc) goto out;
    KILN_CHECK_IF(rc, out, o->expect_seq && seq != o->expect_seq, KILN_ERR_CONFLICT,
                  "%s/%s is at seq %llu now, not %llu: the channel moved meanwhile; nothing signed",
                  o->model, o->channel, (unsigned long long)seq, (unsigned long long)o->expect_seq);
    vpath = kiln_asprintf("/v1/models/%s/versions/%s", o->model, o->version);
    KILN_CHECK_IF(rc, out, !vpath, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_registry_get_json(c, vpath, &ver));
    const char *d = json_string_value(json_object_get(ver, "digest"));
    char hex[KILN_SHA256_HEX];
    uint8_t digest[32];
    KILN_CHECK_IF(rc, out, !reg_digest_hex(d, hex) || !kiln_unhex(hex, digest, 32), KILN_ERR_FORMAT,
                  "the registry's record of %s@%s has no sha256 digest", o->model, o->version);
    if (o->digest) {
        const char *want = strncmp(o->digest, "sha256:", 7) ? o->digest : o->digest + 7;
        KILN_CHECK_IF(rc, out, strcmp(want, hex) != 0, KILN_ERR_VERIFY,
                      "the registry holds %s@%s as %s, not %s%s; refusing", o->model, o->version, d,
                      strncmp(o->digest, "sha256:", 7) ? "sha256:" : "", o->digest);
    }
    int64_t life = o->expires_in ? o->expires_in : 30 * 86400;
    KILN_CHECK(rc, out,
               kiln_sign_record_set(&r, o->model, o->channel, o->version, digest, seq + 1,
                                    kiln_unix_time() + life, o->reason ? o->reason : "promote"));
    for (size_t i = 0; i < o->nkeys; i++)
        KILN_CHECK(rc, out, kiln_sign_record_add_signature(&r, o->keys[i]));
    snprintf(out->digest, sizeof out->digest, "%s", d);
    out->seq = seq + 1;
    out->nsigs = r.nsigs;
    if (o->save_to) {
        rc = kiln_sign_record_save(&r, o->save_to);
        goto out;
    }
    KILN_CHECK(rc, out, kiln_sign_record_text(&r, &text, &text_len));
    KILN_CHECK(rc, out, kiln_registry_put_channel(c, o->model, o->channel, text, text_len));
    out->put = true;
out:
    kiln_sign_record_release(&r);
    kiln_sign_record_release(&old);
    json_decref(ver);
    free(cur);
    free(text);
    free(vpath);
    return rc;
}

kiln_err kiln_registry_previous_version(const kiln_registry_client_opts *c, const char *model,
                                        const char *channel, char out[KILN_REGISTRY_NAME_MAX + 1]) {
    out[0] = 0;
    KILN_TRY(kiln_registry_check_name("model", model));
    KILN_TRY(kiln_registry_check_name("channel", channel));
    char *path = kiln_asprintf("/v1/models/%s/channels/%s/history", model, channel);
    if (!path) return KILN_ERR_NOMEM;
    json_t *h = NULL;
    kiln_err rc = kiln_registry_get_json(c, path, &h);
    free(path);
    if (rc) return rc;
    json_t *recs = json_object_get(h, "records");
    size_t n = json_array_size(recs);
#define VERSION_AT(i)                                                                              \
    json_string_value(json_object_get(                                                             \
        json_object_get(json_object_get(json_array_get(recs, (i)), "record"), "record"),           \
        "version"))
    const char *cur = n ? VERSION_AT(n - 1) : NULL;
    for (size_t i = n; cur && i-- > 0;) {
        const char *v = VERSION_AT(i);
        if (v && strcmp(v, cur) != 0 && strlen(v) <= KILN_REGISTRY_NAME_MAX) {
            snprintf(out, KILN_REGISTRY_NAME_MAX + 1, "%s", v);
            break;
        }
    }
#undef VERSION_AT
    json_decref(h);
    KILN_FAIL_IF(!out[0], KILN_ERR_NOTFOUND,
                 "channel '%s' of '%s' never pointed at another version; give --to", channel,
                 model);
    return KILN_OK;
}

/* text, a record of model/channel, verified under t: its signatures reach the channel's
 * threshold and it names this model and channel. */
static kiln_err record_of(const kiln_sign_trust *t, const char *text, size_t len,
                          const char *model, const char *channel, const char *label,
                          reg_record *rec) {
    KILN_TRY(reg_record_verify(t, text, len, label, rec));
    KILN_FAIL_IF(strcmp(rec->model, model) || strcmp(rec->channel, channel), KILN_ERR_VERIFY,
                 "%s names %s/%s; refusing", label, rec->model, rec->channel);
    return KILN_OK;
}

/* The channel's current record (seq) is not older than the one the state accepted: else a
 * registry serves an older, validly signed record to have key holders sign from it. doing:
 * what is refused ("renew it"). */
static kiln_err not_older(const char *state, const char *model, const char *channel, int64_t seq,
                          const char *doing) {
    int64_t accepted = 0;
    bool known = false;
    KILN_TRY(reg_channel_state(state, model, channel, &accepted, &known));
    KILN_FAIL_IF(known && seq < accepted, KILN_ERR_VERIFY,
                 "the current record of %s/%s is seq %lld, lower than %lld this client accepted: "
                 "the registry serves an older record; refusing to %s",
                 model, channel, (long long)seq, (long long)accepted, doing);
    return KILN_OK;
}

kiln_err kiln_registry_renew(const kiln_registry_client_opts *c, const kiln_registry_renew_opts *o,
                             kiln_registry_promoted *out, char version[KILN_REGISTRY_NAME_MAX + 1],
                             int64_t *was_expires) {
    memset(out, 0, sizeof *out);
    version[0] = 0;
    *was_expires = 0;
    KILN_TRY(kiln_registry_check_name("model", o->model));
    KILN_TRY(kiln_registry_check_channel(o->channel));
    KILN_TRY(record_out_new(o->save_to));
    KILN_FAIL_IF(!o->trust, KILN_ERR_USAGE,
                 "renewing %s/%s needs the trust policy its current record must verify under",
                 o->model, o->channel);
    kiln_sign_trust *t = NULL;
    char *cur = NULL;
    size_t len = 0;
    KILN_TRY(kiln_registry_trust_walk(c, o->trust, o->state, NULL, NULL, &t));
    kiln_err rc = kiln_registry_get_channel(c, o->model, o->channel, &cur, &len);
    if (rc == KILN_ERR_NOTFOUND)
        rc = kiln_fail(rc, "%s/%s has no record to renew: promote a version", o->model, o->channel);
    char label[160];
    snprintf(label, sizeof label, "the current record of %s/%s", o->model, o->channel);
    reg_record rec;
    if (!rc) rc = record_of(t, cur, len, o->model, o->channel, label, &rec);
    if (!rc) rc = not_older(o->state, o->model, o->channel, rec.seq, "renew it");
    if (!rc) {
        kiln_registry_promote_opts p = {.model = o->model,
                                        .channel = o->channel,
                                        .version = rec.version,
                                        .keys = o->keys,
                                        .nkeys = o->nkeys,
                                        .expires_in = o->expires_in,
                                        .reason = "renew",
                                        .digest = rec.digest,
                                        .save_to = o->save_to,
                                        .expect_seq = (uint64_t)rec.seq};
        rc = kiln_registry_promote(c, &p, out);
    }
    if (!rc) {
        snprintf(version, KILN_REGISTRY_NAME_MAX + 1, "%s", rec.version);
        *was_expires = rec.expires;
    }
    free(cur);
    kiln_sign_trust_free(t);
    return rc;
}

kiln_err kiln_registry_previous_version_verified(const kiln_registry_client_opts *c,
                                                 const char *model, const char *channel,
                                                 const char *want, const char *trust,
                                                 const char *state,
                                                 char out[KILN_REGISTRY_NAME_MAX + 1],
                                                 kiln_digest digest) {
    out[0] = 0;
    digest[0] = 0;
    KILN_TRY(kiln_registry_check_name("model", model));
    KILN_TRY(kiln_registry_check_name("channel", channel));
    if (want) KILN_TRY(reg_check_version_chars(want));
    kiln_sign_trust *t = NULL;
    KILN_TRY(kiln_registry_trust_walk(c, trust, state, NULL, NULL, &t));
    char *path = kiln_asprintf("/v1/models/%s/channels/%s/history", model, channel);
    json_t *h = NULL;
    kiln_err rc = path ? kiln_registry_get_json(c, path, &h) : KILN_ERR_NOMEM;
    free(path);
    const json_t *recs = json_object_get(h, "records");
    const size_t n = json_array_size(recs);
    if (!rc && !n)
        rc = kiln_fail(KILN_ERR_NOTFOUND, "channel '%s' of '%s' has no records", channel, model);
    /* Newest first: the current record, then the first before it that names another. */
    reg_record cur, rec;
    for (size_t i = n; !rc && i-- > 0;) {
        const char *text = json_string_value(json_object_get(json_array_get(recs, i), "text"));
        char label[160];
        snprintf(label, sizeof label, "record %zu of the history of %s/%s", i + 1, model, channel);
        const bool newest = i == n - 1;
        kiln_err v = text ? record_of(t, text, strlen(text), model, channel, label, &rec)
                          : kiln_fail(KILN_ERR_FORMAT, "%s: no text", label);
        if (v && newest) {
            rc = kiln_errprefix(v == KILN_ERR_FORMAT ? KILN_ERR_VERIFY : v,
                                "the channel's current record does not verify: ");
            break;
        }
        if (v) {
            kiln_errclear(); /* an older record the policy no longer backs: passed over */
            continue;
        }
        if (newest) {
            cur = rec;
            rc = not_older(state, model, channel, cur.seq, "roll back from it");
            if (!rc && want && !strcmp(want, cur.version))
                rc = kiln_fail(KILN_ERR_USAGE,
                               "%s is the current version of %s/%s (seq %lld): nothing to roll "
                               "back to",
                               want, model, channel, (long long)cur.seq);
            continue;
        }
        if (want ? !strcmp(rec.version, want) : strcmp(rec.version, cur.version) != 0) {
            /* A withdrawn archive is no place to go back to: passed over, or, asked for by
             * name, refused. */
            if (kiln_sign_trust_withdrawn(t, rec.digest)) {
                if (!want) continue;
                char what[160];
                snprintf(what, sizeof what, "%s@%s", model, want);
                rc = reg_withdrawn(t, rec.digest, what);
                break;
            }
            snprintf(out, KILN_REGISTRY_NAME_MAX + 1, "%s", rec.version);
            snprintf(digest, sizeof(kiln_digest), "%s", rec.digest);
            break;
        }
    }
    if (!rc && !out[0] && want)
        rc = kiln_fail(KILN_ERR_NOTFOUND,
                       "channel '%s' of '%s' never pointed at %s in a record that verifies: "
                       "nothing signed vouches for its digest (kiln promote it, pinned with "
                       "--digest)",
                       channel, model, want);
    else if (!rc && !out[0])
        rc = kiln_fail(KILN_ERR_NOTFOUND,
                       "channel '%s' of '%s' never pointed at another version in a record that "
                       "verifies; give --to",
                       channel, model);
    json_decref(h);
    kiln_sign_trust_free(t);
    return rc;
}

/* oci_kiln.c - kiln's objects on an OCI registry (docs/registry.md, "On an OCI registry"):
 * the routes of kiln's own HTTP API answered from the registry, byte for byte the bodies the
 * kiln server sends, so that a pull, a watch, promote, rollback, the trust walk, kiln models,
 * provenance, release and a mirror's sync run their own checks unchanged; and the checks the
 * kiln server makes at upload made here before anything is written (the registry is untrusted
 * storage: it has no gate of its own).
 *
 * The mapping: model NAME is repository PREFIX/NAME; a version an OCI image manifest tagged
 * VERSION (artifactType application/vnd.kiln.model.v1; config the archive's manifest.json;
 * layers: the archive, its signature file, card.json, validation.json when there is one); a
 * channel record an artifact tagged _ch.CHANNEL.SEQ (written once) and CHANNEL (a hint); the
 * trust versions artifacts in PREFIX/kiln.trust tagged 1, 2, ... (distribution refuses a
 * repository component that begins with '_'). */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "export.h"
#include "oci_int.h"

#define MT_IMAGE "application/vnd.oci.image.manifest.v1+json"
#define MT_EMPTY "application/vnd.oci.empty.v1+json"
#define AT_MODEL "application/vnd.kiln.model.v1"
#define MT_KMANIFEST "application/vnd.kiln.manifest.v1+json"
#define MT_ARCHIVE "application/vnd.kiln.archive.v1.tar+zstd"
#define MT_SIG "application/vnd.kiln.signature.v1.minisig"
#define MT_CARD "application/vnd.kiln.card.v1+json"
#define MT_VALIDATION "application/vnd.kiln.validation.v1+json"
#define AT_RECORD "application/vnd.kiln.channel-record.v1+json"
#define AT_TRUST "application/vnd.kiln.trust.v1+json"
#define TRUST_REPO "kiln.trust"
#define EMPTY_DIGEST "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
#define MANIFEST_MAX (4u << 20)

/* ---- which repository holds a blob (a download names only its digest) ---- */

#define BLOB_HOMES 256
static struct {
    char hex[KILN_SHA256_HEX];
    char url[512];
    char repo[300];
} homes[BLOB_HOMES];
static size_t nhomes;
static pthread_mutex_t homes_mu = PTHREAD_MUTEX_INITIALIZER;

static void home_note(const reg_oci *o, const char *hex, const char *repo) {
    pthread_mutex_lock(&homes_mu);
    size_t i;
    for (i = 0; i < BLOB_HOMES && i < nhomes; i++)
        if (!strcmp(homes[i].hex, hex) && !strcmp(homes[i].url, o->c->url)) break;
    if (i == nhomes || i == BLOB_HOMES) i = nhomes++ % BLOB_HOMES;
    snprintf(homes[i].hex, sizeof homes[i].hex, "%s", hex);
    snprintf(homes[i].url, sizeof homes[i].url, "%s", o->c->url);
    snprintf(homes[i].repo, sizeof homes[i].repo, "%s", repo);
    pthread_mutex_unlock(&homes_mu);
}

static bool home_find(const reg_oci *o, const char *hex, char repo[300]) {
    bool found = false;
    pthread_mutex_lock(&homes_mu);
    for (size_t i = 0; i < BLOB_HOMES && i < nhomes && !found; i++)
        if (!strcmp(homes[i].hex, hex) && !strcmp(homes[i].url, o->c->url)) {
            snprintf(repo, 300, "%s", homes[i].repo);
            found = true;
        }
    pthread_mutex_unlock(&homes_mu);
    return found;
}

/* ---- reading what kiln keeps there ---- */

static const char *str(const json_t *o, const char *k) {
    return json_string_value(json_object_get(o, k));
}

/* A descriptor's digest and size, checked for shape. */
static bool desc(const json_t *d, const char **digest, uint64_t *size) {
    const char *dg = str(d, "digest");
    json_t *sz = json_object_get(d, "size");
    char hex[KILN_SHA256_HEX];
    if (!dg || !reg_digest_hex(dg, hex) || !json_is_integer(sz) || json_integer_value(sz) < 0)
        return false;
    *digest = dg;
    *size = (uint64_t)json_integer_value(sz);
    return true;
}

/* The layer of media type mt in manifest m, or NULL. */
static const json_t *layer_of(const json_t *m, const char *mt) {
    size_t i;
    json_t *l;
    json_array_foreach(json_object_get(m, "layers"), i, l) {
        const char *t = str(l, "mediaType");
        if (t && !strcmp(t, mt)) return l;
    }
    return NULL;
}

/* A manifest (by tag or digest) parsed; *digest its bytes'. */
static kiln_err manifest_json(reg_oci *o, const char *repo, const char *ref, json_t **out,
                              char digest[REG_OCI_DIGEST]) {
    *out = NULL;
    char *body = NULL;
    size_t len = 0;
    KILN_TRY(reg_oci_manifest_get(o, repo, ref, MANIFEST_MAX, &body, &len, digest));
    char label[400];
    snprintf(label, sizeof label, "manifest %s:%s from '%s'", repo, ref, o->c->url);
    kiln_err rc = kiln_json_parse(body, len, label, out);
    free(body);
    return rc;
}

/* The one-layer artifact at repo:tag (a channel record, a trust version): its layer's bytes,
 * at most limit. */
static kiln_err artifact_read(reg_oci *o, const char *repo, const char *tag, const char *mt,
                              size_t limit, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    json_t *m = NULL;
    char md[REG_OCI_DIGEST];
    KILN_TRY(manifest_json(o, repo, tag, &m, md));
    const json_t *l = layer_of(m, mt);
    const char *dg;
    uint64_t size;
    kiln_err rc = KILN_OK;
    if (!l || !desc(l, &dg, &size))
        rc = kiln_fail(KILN_ERR_FORMAT, "registry '%s': %s:%s has no %s layer", o->c->url, repo,
                       tag, mt);
    else if (size > limit)
        rc = kiln_fail(KILN_ERR_LIMIT,
                       "registry '%s': %s:%s declares %" PRIu64 " bytes, more than %zu", o->c->url,
                       repo, tag, size, limit);
    else
        rc = reg_oci_blob_get(o, repo, dg, limit, text, len);
    json_decref(m);
    return rc;
}

/* The tags of repo; a repository the registry does not know is KILN_ERR_NOTFOUND. */
static kiln_err tags_of(reg_oci *o, const char *repo, json_t **out) {
    return reg_oci_tags(o, repo, out);
}

bool reg_oci_record_tag(const char *tag, char ch[KILN_REGISTRY_NAME_MAX + 1], int64_t *seq) {
    if (!tag || strncmp(tag, "_ch.", 4)) return false;
    const char *c = tag + 4, *dot = strrchr(c, '.');
    if (!dot || dot == c || (size_t)(dot - c) > KILN_REGISTRY_NAME_MAX || !dot[1]) return false;
    int64_t v = 0;
    for (const char *p = dot + 1; *p; p++) {
        if (*p < '0' || *p > '9' || v > INT64_MAX / 10 - 1) return false;
        v = v * 10 + (*p - '0');
    }
    if (dot[1] == '0' || v < 1) return false;
    memcpy(ch, c, (size_t)(dot - c));
    ch[dot - c] = 0;
    *seq = v;
    return true;
}

/* The seqs of channel's records in tags, ascending (*seqs: caller frees). */
static kiln_err channel_seqs(const json_t *tags, const char *channel, int64_t **seqs, size_t *n) {
    *n = 0;
    *seqs = kiln_malloc((json_array_size(tags) + 1) * sizeof **seqs);
    KILN_FAIL_IF(!*seqs, KILN_ERR_NOMEM, "out of memory");
    size_t i;
    json_t *t;
    json_array_foreach(tags, i, t) {
        char ch[KILN_REGISTRY_NAME_MAX + 1];
        int64_t s;
        if (reg_oci_record_tag(json_string_value(t), ch, &s) && !strcmp(ch, channel))
            (*seqs)[(*n)++] = s;
    }
    for (size_t a = 1; a < *n; a++) /* a few dozen: insertion sort */
        for (size_t b = a; b > 0 && (*seqs)[b - 1] > (*seqs)[b]; b--) {
            int64_t x = (*seqs)[b];
            (*seqs)[b] = (*seqs)[b - 1];
            (*seqs)[b - 1] = x;
        }
    return KILN_OK;
}

static kiln_err record_at(reg_oci *o, const char *repo, const char *channel, int64_t seq,
                          char **text, size_t *len) {
    char tag[160];
    snprintf(tag, sizeof tag, "_ch.%s.%lld", channel, (long long)seq);
    return artifact_read(o, repo, tag, AT_RECORD, REG_RECORD_MAX, text, len);
}

/* ---- the routes ---- */

typedef struct version_info {
    json_t *m; /* the OCI manifest */
    char mdigest[REG_OCI_DIGEST];
    const char *archive_digest, *sig_digest;
    uint64_t archive_size, sig_size;
} version_info;

static kiln_err version_read(reg_oci *o, const char *repo, const char *version, version_info *v) {
    memset(v, 0, sizeof *v);
    kiln_err rc = manifest_json(o, repo, version, &v->m, v->mdigest);
    if (rc == KILN_ERR_NOTFOUND) {
        kiln_errclear();
        return kiln_fail(KILN_ERR_NOTFOUND, "version '%s@%s' not found", repo, version);
    }
    KILN_TRY(rc);
    const char *at = str(v->m, "artifactType");
    const json_t *a = layer_of(v->m, MT_ARCHIVE), *s = layer_of(v->m, MT_SIG);
    if (!at || strcmp(at, AT_MODEL) || !a || !s || !desc(a, &v->archive_digest, &v->archive_size) ||
        !desc(s, &v->sig_digest, &v->sig_size)) {
        json_decref(v->m);
        v->m = NULL;
        return kiln_fail(KILN_ERR_FORMAT,
                         "registry '%s': %s:%s is not a kiln model version (artifactType %s with "
                         "an archive and a signature layer)",
                         o->c->url, repo, version, AT_MODEL);
    }
    char hex[KILN_SHA256_HEX];
    if (reg_digest_hex(v->archive_digest, hex)) home_note(o, hex, repo);
    return KILN_OK;
}

/* The version's JSON as the kiln server answers GET /v1/models/M/versions/V. */
static kiln_err route_version(reg_oci *o, const char *model, const char *version, json_t **out) {
    *out = NULL;
    char *repo = reg_oci_repo(o, model);
    KILN_FAIL_IF(!repo, KILN_ERR_NOMEM, "out of memory");
    version_info v;
    kiln_err rc = version_read(o, repo, version, &v);
    if (rc == KILN_ERR_NOTFOUND) {
        kiln_errclear();
        rc = kiln_fail(KILN_ERR_NOTFOUND, "registry '%s': version '%s@%s' not found", o->c->url,
                       model, version);
    }
    char *cfg = NULL, *sig = NULL, *card = NULL, *vtext = NULL;
    size_t cfg_len = 0, sig_len = 0, card_len = 0, vlen = 0;
    json_t *manifest = NULL, *cardj = NULL, *summary = NULL;
    kiln_manifest *man = NULL;
    const char *dg;
    uint64_t size;
    if (rc) goto out;
    const json_t *config = json_object_get(v.m, "config");
    KILN_CHECK_IF(rc, out, !desc(config, &dg, &size) || size > MANIFEST_MAX, KILN_ERR_FORMAT,
                  "registry '%s': %s:%s has no manifest config", o->c->url, repo, version);
    KILN_CHECK(rc, out, reg_oci_blob_get(o, repo, dg, MANIFEST_MAX, &cfg, &cfg_len));
    KILN_CHECK(rc, out, kiln_json_parse(cfg, cfg_len, "the registry's manifest", &manifest));
    /* The validation summary the signed manifest states, as the kiln server keeps it. */
    if (kiln_manifest_parse(cfg, cfg_len, "the registry's manifest", &man) == KILN_OK &&
        man->validation_present) {
        char hex[KILN_SHA256_HEX];
        kiln_hex(man->validation_sha256, KILN_SHA256_BYTES, hex);
        summary = json_pack("{s:b, s:s}", "passed", man->validation_passed, "sha256", hex);
    }
    kiln_errclear();
    KILN_CHECK(rc, out, reg_oci_blob_get(o, repo, v.sig_digest, REG_SIG_MAX, &sig, &sig_len));
    const json_t *l = layer_of(v.m, MT_CARD);
    if (l && desc(l, &dg, &size) && size <= MANIFEST_MAX) {
        KILN_CHECK(rc, out, reg_oci_blob_get(o, repo, dg, MANIFEST_MAX, &card, &card_len));
        cardj = json_loadb(card, card_len, JSON_REJECT_DUPLICATES, NULL);
    }
    l = layer_of(v.m, MT_VALIDATION);
    if (l && desc(l, &dg, &size) && size <= REG_VALIDATION_MAX) {
        KILN_CHECK(rc, out, reg_oci_blob_get(o, repo, dg, REG_VALIDATION_MAX, &vtext, &vlen));
        uint8_t d[KILN_SHA256_BYTES];
        kiln_sha256(vtext, vlen, d);
        /* Kept only when it is the report the signed manifest names, and text. */
        json_t *probe = man && man->validation_present &&
                                !memcmp(d, man->validation_sha256, sizeof d) &&
                                !memchr(vtext, 0, vlen)
                            ? json_stringn(vtext, vlen)
                            : NULL;
        if (!probe) {
            free(vtext);
            vtext = NULL;
        }
        json_decref(probe);
    }
    json_t *sig_j = json_stringn(sig, sig_len);
    KILN_CHECK_IF(rc, out, !sig_j, KILN_ERR_FORMAT,
                  "registry '%s': the signature of %s:%s is not text", o->c->url, repo, version);
    json_t *vtext_j = vtext ? json_stringn(vtext, vlen) : json_null();
    json_t *created = man && man->created ? json_string(man->created) : json_null();
    *out = json_pack("{s:s, s:s, s:s, s:I, s:O, s:o, s:O, s:O, s:o, s:n, s:o, s:s}", "name", model,
                     "version", version, "digest", v.archive_digest, "size",
                     (json_int_t)v.archive_size, "manifest", manifest, "signature", sig_j, "card",
                     cardj ? cardj : json_null(), "validation", summary ? summary : json_null(),
                     "validation_text", vtext_j, "publisher", "created", created, "oci_digest",
                     v.mdigest);
    KILN_CHECK_IF(rc, out, !*out, KILN_ERR_NOMEM, "out of memory");
out:
    json_decref(v.m);
    json_decref(manifest);
    json_decref(cardj);
    json_decref(summary);
    kiln_manifest_free(man);
    free(cfg);
    free(sig);
    free(card);
    free(vtext);
    free(repo);
    return rc;
}

/* A record's fields as the kiln server lists them (unverified: the caller verifies). */
static json_t *record_entry(const char *text, size_t len, int64_t seq) {
    kiln_sign_record r;
    kiln_sign_record_init(&r);
    json_t *e = NULL;
    if (kiln_sign_record_parse(text, len, "record", &r) == KILN_OK) {
        char hex[KILN_SHA256_HEX], dg[80];
        kiln_hex(r.digest, 32, hex);
        snprintf(dg, sizeof dg, "sha256:%s", hex);
        e = json_pack("{s:I, s:s, s:s, s:o, s:s, s:n, s:n}", "seq", (json_int_t)r.seq, "version",
                      r.version, "digest", dg, "expires", kiln_time_json(r.expires), "reason",
                      r.reason ? r.reason : "", "put_by", "put_at");
    } else {
        e = json_pack("{s:I, s:s, s:s, s:n, s:s, s:n, s:n}", "seq", (json_int_t)seq, "version", "",
                      "digest", "", "expires", "reason", "", "put_by", "put_at");
    }
    kiln_errclear();
    kiln_sign_record_release(&r);
    return e;
}

static kiln_err route_model(reg_oci *o, const char *model, json_t **out) {
    *out = NULL;
    char *repo = reg_oci_repo(o, model);
    KILN_FAIL_IF(!repo, KILN_ERR_NOMEM, "out of memory");
    json_t *tags = NULL, *versions = json_array(), *channels = json_object();
    kiln_err rc = tags_of(o, repo, &tags);
    if (rc == KILN_ERR_NOTFOUND) {
        kiln_errclear();
        rc = kiln_fail(KILN_ERR_NOTFOUND, "model '%s' not found", model);
    }
    KILN_CHECK(rc, out, rc);
    KILN_CHECK_IF(rc, out, !versions || !channels, KILN_ERR_NOMEM, "out of memory");
    size_t i;
    json_t *t;
    json_array_foreach(tags, i, t) {
        const char *tag = json_string_value(t);
        char ch[KILN_REGISTRY_NAME_MAX + 1];
        int64_t seq;
        if (reg_oci_record_tag(tag, ch, &seq)) {
            json_t *have = json_object_get(channels, ch);
            if (have && json_integer_value(json_object_get(have, "seq")) >= seq) continue;
            json_object_set_new(channels, ch, json_pack("{s:I}", "seq", (json_int_t)seq));
            continue;
        }
        if (!kiln_registry_looks_like_version(tag)) continue; /* a channel's moving tag */
        json_t *vj = NULL;
        rc = route_version(o, model, tag, &vj);
        if (rc == KILN_ERR_FORMAT) { /* not kiln's: listed by no one */
            kiln_errclear();
            rc = KILN_OK;
            continue;
        }
        KILN_CHECK(rc, out, rc);
        json_t *summary = json_object_get(vj, "validation");
        json_t *p = json_object_get(summary, "passed");
        const char *verdict = json_is_boolean(p) ? (json_is_true(p) ? "passed" : "failed") : "none";
        json_array_append_new(versions,
                              json_pack("{s:s, s:O, s:O, s:n, s:O, s:s}", "version", tag, "digest",
                                        json_object_get(vj, "digest"), "size",
                                        json_object_get(vj, "size"), "publisher", "created",
                                        json_object_get(vj, "created"), "validation", verdict));
        json_decref(vj);
    }
    const char *ch;
    json_t *cv;
    json_object_foreach(channels, ch, cv) {
        int64_t seq = json_integer_value(json_object_get(cv, "seq"));
        char *text = NULL;
        size_t len = 0;
        KILN_CHECK(rc, out, record_at(o, repo, ch, seq, &text, &len));
        json_object_set_new(channels, ch, record_entry(text, len, seq));
        free(text);
    }
    if (!json_array_size(versions) && !json_object_size(channels)) {
        rc = kiln_fail(KILN_ERR_NOTFOUND, "model '%s' not found", model);
        goto out;
    }
    *out = json_pack("{s:s, s:O, s:O}", "name", model, "versions", versions, "channels", channels);
    KILN_CHECK_IF(rc, out, !*out, KILN_ERR_NOMEM, "out of memory");
out:
    json_decref(tags);
    json_decref(versions);
    json_decref(channels);
    free(repo);
    return rc;
}

static kiln_err route_models(reg_oci *o, json_t **out) {
    *out = NULL;
    json_t *repos = NULL, *arr = json_array();
    KILN_FAIL_IF(!arr, KILN_ERR_NOMEM, "out of memory");
    kiln_err rc = reg_oci_catalog(o, &repos);
    size_t pl = strlen(o->prefix), i;
    json_t *r;
    json_array_foreach(repos, i, r) {
        if (rc) break;
        const char *name = json_string_value(r);
        if (pl && (strncmp(name, o->prefix, pl) || name[pl] != '/')) continue;
        const char *model = name + (pl ? pl + 1 : 0);
        if (strchr(model, '/') || !strcmp(model, TRUST_REPO) ||
            kiln_registry_check_name("model", model) != KILN_OK) {
            kiln_errclear();
            continue;
        }
        json_t *tags = NULL;
        rc = tags_of(o, name, &tags);
        if (rc == KILN_ERR_NOTFOUND) { /* deleted meanwhile */
            kiln_errclear();
            rc = KILN_OK;
            continue;
        }
        size_t k, nv = 0;
        json_t *t;
        json_array_foreach(tags, k, t) {
            if (kiln_registry_looks_like_version(json_string_value(t))) nv++;
        }
        json_decref(tags);
        if (!rc && nv)
            json_array_append_new(arr, json_pack("{s:s, s:I, s:n}", "name", model, "versions",
                                                 (json_int_t)nv, "updated"));
    }
    json_decref(repos);
    if (!rc)
        *out = json_pack("{s:o}", "models", arr);
    else
        json_decref(arr);
    if (!rc && !*out) rc = KILN_ERR_NOMEM;
    return rc;
}

static kiln_err route_channel(reg_oci *o, const char *model, const char *channel, char **text,
                              size_t *len) {
    char *repo = reg_oci_repo(o, model);
    KILN_FAIL_IF(!repo, KILN_ERR_NOMEM, "out of memory");
    json_t *tags = NULL;
    int64_t *seqs = NULL;
    size_t n = 0;
    kiln_err rc = tags_of(o, repo, &tags);
    if (!rc) rc = channel_seqs(tags, channel, &seqs, &n);
    if (rc == KILN_ERR_NOTFOUND || (!rc && !n)) {
        kiln_errclear();
        rc = kiln_fail(KILN_ERR_NOTFOUND, "channel '%s' of model '%s' not found", channel, model);
    }
    /* The highest seq: the moving CHANNEL tag is a hint only, never read. */
    if (!rc) rc = record_at(o, repo, channel, seqs[n - 1], text, len);
    json_decref(tags);
    free(seqs);
    free(repo);
    return rc;
}

static kiln_err route_history(reg_oci *o, const char *model, const char *channel, int64_t after,
                              json_t **out) {
    *out = NULL;
    char *repo = reg_oci_repo(o, model);
    KILN_FAIL_IF(!repo, KILN_ERR_NOMEM, "out of memory");
    json_t *tags = NULL, *arr = json_array();
    int64_t *seqs = NULL;
    size_t n = 0;
    kiln_err rc = arr ? tags_of(o, repo, &tags) : KILN_ERR_NOMEM;
    if (!rc) rc = channel_seqs(tags, channel, &seqs, &n);
    if (rc == KILN_ERR_NOTFOUND || (!rc && !n && after == 0)) {
        kiln_errclear();
        rc = kiln_fail(KILN_ERR_NOTFOUND, "channel '%s' of model '%s' not found", channel, model);
    }
    for (size_t i = 0; !rc && i < n; i++) {
        if (seqs[i] <= after) continue;
        char *text = NULL;
        size_t len = 0;
        rc = record_at(o, repo, channel, seqs[i], &text, &len);
        if (rc) break;
        json_t *rec = json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL);
        json_t *tj = json_stringn(text, len);
        free(text);
        if (!rec || !tj) {
            json_decref(rec);
            json_decref(tj);
            rc = kiln_fail(KILN_ERR_FORMAT, "registry '%s': record %s/%s seq %lld is not JSON",
                           o->c->url, model, channel, (long long)seqs[i]);
            break;
        }
        json_array_append_new(arr, json_pack("{s:o, s:o, s:n, s:n}", "record", rec, "text", tj,
                                             "publisher", "created"));
    }
    if (!rc)
        *out = json_pack("{s:s, s:s, s:O}", "model", model, "channel", channel, "records", arr);
    if (!rc && !*out) rc = KILN_ERR_NOMEM;
    json_decref(arr);
    json_decref(tags);
    free(seqs);
    free(repo);
    return rc;
}

/* The numbered tags of the trust repository, ascending (*vs: caller frees). */
static kiln_err trust_versions(reg_oci *o, uint64_t **vs, size_t *n) {
    *vs = NULL;
    *n = 0;
    char *repo = reg_oci_repo(o, TRUST_REPO);
    KILN_FAIL_IF(!repo, KILN_ERR_NOMEM, "out of memory");
    json_t *tags = NULL;
    kiln_err rc = tags_of(o, repo, &tags);
    free(repo);
    if (rc == KILN_ERR_NOTFOUND) {
        kiln_errclear();
        return KILN_OK;
    }
    KILN_TRY(rc);
    *vs = kiln_malloc((json_array_size(tags) + 1) * sizeof **vs);
    if (!*vs) {
        json_decref(tags);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    size_t i;
    json_t *t;
    json_array_foreach(tags, i, t) {
        const char *s = json_string_value(t);
        char *end;
        if (!s || s[0] < '1' || s[0] > '9' || strlen(s) > 18) continue;
        uint64_t v = strtoull(s, &end, 10);
        if (*end) continue;
        (*vs)[(*n)++] = v;
    }
    json_decref(tags);
    for (size_t a = 1; a < *n; a++)
        for (size_t b = a; b > 0 && (*vs)[b - 1] > (*vs)[b]; b--) {
            uint64_t x = (*vs)[b];
            (*vs)[b] = (*vs)[b - 1];
            (*vs)[b - 1] = x;
        }
    return KILN_OK;
}

static kiln_err trust_doc(reg_oci *o, uint64_t v, char **text, size_t *len) {
    char *repo = reg_oci_repo(o, TRUST_REPO), tag[32];
    KILN_FAIL_IF(!repo, KILN_ERR_NOMEM, "out of memory");
    snprintf(tag, sizeof tag, "%llu", (unsigned long long)v);
    kiln_err rc = artifact_read(o, repo, tag, AT_TRUST, REG_TRUST_MAX, text, len);
    free(repo);
    if (rc == KILN_ERR_NOTFOUND) {
        kiln_errclear();
        rc = kiln_fail(KILN_ERR_NOTFOUND, "trust version %llu not found", (unsigned long long)v);
    }
    return rc;
}

static kiln_err route_trust(reg_oci *o, uint64_t v, char **text, size_t *len) {
    if (v) return trust_doc(o, v, text, len);
    uint64_t *vs = NULL;
    size_t n = 0;
    KILN_TRY(trust_versions(o, &vs, &n));
    kiln_err rc = n ? trust_doc(o, vs[n - 1], text, len)
                    : kiln_fail(KILN_ERR_NOTFOUND, "this registry holds no trust versions");
    free(vs);
    return rc;
}

/* ---- the gate: what the kiln server checks at upload, checked before writing ---- */

/* The registry's trust policy as the kiln server holds one: its lowest version (what
 * `kiln registry serve --trust` is given), then each version after it accepted as the
 * successor of the one before. A gate only, for writers: every reader walks from its own
 * root. KILN_ERR_VERIFY when the registry holds none. */
static kiln_err registry_policy(reg_oci *o, kiln_sign_trust **out) {
    *out = NULL;
    uint64_t *vs = NULL;
    size_t n = 0;
    KILN_TRY(trust_versions(o, &vs, &n));
    kiln_err rc = KILN_OK;
    kiln_sign_trust *cur = NULL;
    KILN_CHECK_IF(rc, out, !n, KILN_ERR_VERIFY,
                  "registry '%s' holds no trust policy, so nothing can be checked before it is "
                  "written: put one first (kiln trust put trust.json --registry %s)",
                  o->c->url, o->c->url);
    for (size_t i = 0; i < n; i++) {
        char *doc = NULL, label[600];
        size_t len = 0;
        snprintf(label, sizeof label, "trust version %llu of registry '%s'",
                 (unsigned long long)vs[i], o->c->url);
        KILN_CHECK(rc, out, trust_doc(o, vs[i], &doc, &len));
        if (!cur) {
            rc = kiln_sign_trust_parse(doc, len, label, &cur);
        } else {
            kiln_sign_trust *next = NULL;
            if (vs[i] != kiln_sign_trust_version(cur) + 1)
                rc = kiln_fail(KILN_ERR_VERIFY,
                               "registry '%s' holds trust version %llu after %llu: a gap",
                               o->c->url, (unsigned long long)vs[i],
                               (unsigned long long)kiln_sign_trust_version(cur));
            else
                rc = kiln_sign_trust_update(cur, doc, len, label, &next, NULL);
            if (!rc) {
                kiln_sign_trust_free(cur);
                cur = next;
            }
        }
        free(doc);
        KILN_CHECK(rc, out, rc);
    }
    *out = cur;
    cur = NULL;
out:
    kiln_sign_trust_free(cur);
    free(vs);
    return rc;
}

/* The canonical bytes of an OCI image manifest with config cfg and layers (each
 * {mediaType, digest, size}); sorted keys, no white space: the same release gives the same
 * manifest digest on every registry. Caller frees. */
static char *image_manifest(const char *artifact_type, json_t *cfg, json_t *layers) {
    json_t *m = json_pack("{s:i, s:s, s:s, s:o, s:o}", "schemaVersion", 2, "mediaType", MT_IMAGE,
                          "artifactType", artifact_type, "config", cfg, "layers", layers);
    char *s = m ? kiln_json_canonical(m) : NULL;
    json_decref(m);
    return s;
}

static json_t *descriptor(const char *mt, const char *digest, uint64_t size) {
    return json_pack("{s:s, s:s, s:I}", "mediaType", mt, "digest", digest, "size",
                     (json_int_t)size);
}

/* Put the manifest at repo:tag and read it back: another writer's bytes there (two promoters
 * racing: an OCI registry has no compare-and-swap on tags) is KILN_ERR_CONFLICT. */
static kiln_err put_and_confirm(reg_oci *o, const char *repo, const char *tag, const char *body,
                                bool settle, const char *what) {
    char want[REG_OCI_DIGEST], got[REG_OCI_DIGEST];
    bool exists;
    reg_oci_sha256(body, strlen(body), want);
    kiln_err rc = reg_oci_manifest_put(o, repo, tag, body, strlen(body), MT_IMAGE);
    if (rc && settle && rc != KILN_ERR_NOMEM) {
        /* A registry may fail a write that raced another to the same tag (docker-registry
         * answers 500 when two writers link one tag at once): what the tag holds decides. This
         * manifest there: it landed. Another: a lost race, said as one. None: the error. */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", kiln_errmsg());
        if (reg_oci_manifest_head(o, repo, tag, &exists, got) == KILN_OK && exists) {
            KILN_FAIL_IF(strcmp(got, want), KILN_ERR_CONFLICT,
                         "%s: another writer's manifest %s is at %s:%s on registry '%s', where "
                         "writing this one failed (%s): a lost race, nothing of this one is in "
                         "force",
                         what, got, repo, tag, o->c->url, msg);
            kiln_errclear();
            rc = KILN_OK;
        } else {
            return kiln_fail(rc, "%s", msg);
        }
    }
    KILN_TRY(rc);
    /* Read back now and (settle: a channel record, where promoters race) once more a moment
     * later, so that a writer just behind this one is seen by one of the two. */
    for (int i = 0; i < (settle ? 2 : 1); i++) {
        if (i) {
            struct timespec ts = {0, 300 * 1000000L};
            nanosleep(&ts, NULL);
        }
        KILN_TRY(reg_oci_manifest_head(o, repo, tag, &exists, got));
        KILN_FAIL_IF(!exists || strcmp(got, want), KILN_ERR_CONFLICT,
                     "%s: another writer's manifest %s replaced this one at %s:%s on registry "
                     "'%s' (a lost race: nothing of this one is in force)",
                     what, exists ? got : "(none)", repo, tag, o->c->url);
    }
    return KILN_OK;
}

static kiln_err put_empty_config(reg_oci *o, const char *repo) {
    return reg_oci_blob_push(o, repo, "{}", NULL, 2, EMPTY_DIGEST, NULL);
}

/* PUT /v1/models/M/channels/C: the record checked as the kiln server checks it (its
 * signatures under the registry's policy, reaching the channel's threshold; this model and
 * channel; not expired; its archive not withdrawn; seq the next; the version held with the
 * record's digest), then _ch.C.SEQ written once (absent before, the same bytes after) and the
 * moving tag C. */
static kiln_err put_channel(reg_oci *o, const char *model, const char *channel, const char *text,
                            size_t len, bool mirror, char **answer, size_t *alen) {
    kiln_sign_trust *t = NULL;
    char *repo = reg_oci_repo(o, model), *body = NULL, label[300], rdigest[REG_OCI_DIGEST];
    KILN_FAIL_IF(!repo, KILN_ERR_NOMEM, "out of memory");
    json_t *tags = NULL;
    int64_t *seqs = NULL;
    size_t n = 0;
    version_info v = {0};
    reg_record rec;
    snprintf(label, sizeof label, "channel record for %s/%s", model, channel);
    kiln_err rc = registry_policy(o, &t);
    if (!rc) rc = reg_record_verify(t, text, len, label, &rec);
    if (!rc) {
        char what[700];
        snprintf(what, sizeof what, "%s@%s, which the %s names,", rec.model, rec.version, label);
        rc = reg_withdrawn(t, rec.digest, what);
    }
    KILN_CHECK(rc, out, rc);
    KILN_CHECK_IF(rc, out, strcmp(rec.model, model) || strcmp(rec.channel, channel),
                  KILN_ERR_VERIFY, "%s names %s/%s instead", label, rec.model, rec.channel);
    /* A mirror copies a channel's history, whose old records may have expired. */
    KILN_CHECK_IF(rc, out, !mirror && rec.expires <= kiln_unix_time(), KILN_ERR_VERIFY,
                  "%s has expired", label);
    rc = tags_of(o, repo, &tags);
    if (rc == KILN_ERR_NOTFOUND) kiln_errclear();
    KILN_CHECK(rc, out, rc == KILN_ERR_NOTFOUND ? KILN_OK : rc);
    rc = KILN_OK;
    if (tags) KILN_CHECK(rc, out, channel_seqs(tags, channel, &seqs, &n));
    int64_t cur = n ? seqs[n - 1] : 0;
    KILN_CHECK_IF(rc, out, rec.seq != cur + 1, KILN_ERR_CONFLICT,
                  "channel record for %s/%s has seq %lld, but the next must be %lld", model,
                  channel, (long long)rec.seq, (long long)cur + 1);
    rc = version_read(o, repo, rec.version, &v);
    if (rc == KILN_ERR_NOTFOUND)
        rc = kiln_errprefix(KILN_ERR_NOTFOUND, "%s names a version the registry lacks: ", label);
    KILN_CHECK(rc, out, rc);
    KILN_CHECK_IF(rc, out, strcmp(v.archive_digest, rec.digest), KILN_ERR_VERIFY,
                  "%s names %s@%s as %s, but the registry holds %s", label, model, rec.version,
                  rec.digest, v.archive_digest);
    char tag[160];
    snprintf(tag, sizeof tag, "_ch.%s.%lld", channel, (long long)rec.seq);
    bool exists;
    char have[REG_OCI_DIGEST];
    KILN_CHECK(rc, out, reg_oci_manifest_head(o, repo, tag, &exists, have));
    KILN_CHECK_IF(rc, out, exists, KILN_ERR_CONFLICT,
                  "%s: seq %lld was written meanwhile by another promoter (%s:%s); nothing "
                  "written",
                  label, (long long)rec.seq, repo, tag);
    reg_oci_sha256(text, len, rdigest);
    KILN_CHECK(rc, out, put_empty_config(o, repo));
    KILN_CHECK(rc, out, reg_oci_blob_push(o, repo, text, NULL, len, rdigest, NULL));
    body = image_manifest(AT_RECORD, descriptor(MT_EMPTY, EMPTY_DIGEST, 2),
                          json_pack("[o]", descriptor(AT_RECORD, rdigest, len)));
    KILN_CHECK_IF(rc, out, !body, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, put_and_confirm(o, repo, tag, body, true, label));
    /* The moving tag: a hint for people and tools, never what a client reads; a registry
     * whose tags are all immutable refuses it, and the record is in force all the same. */
    if (reg_oci_manifest_put(o, repo, channel, body, strlen(body), MT_IMAGE) != KILN_OK) {
        kiln_warn("%s is in force, but the moving tag %s:%s was not updated: %s", label, repo,
                  channel, kiln_errmsg());
        kiln_errclear();
    }
    json_t *a = json_pack("{s:s, s:s, s:I, s:s, s:s}", "model", rec.model, "channel", rec.channel,
                          "seq", (json_int_t)rec.seq, "version", rec.version, "digest", rec.digest);
    *answer = a ? json_dumps(a, JSON_COMPACT) : NULL;
    json_decref(a);
    KILN_CHECK_IF(rc, out, !*answer, KILN_ERR_NOMEM, "out of memory");
    *alen = strlen(*answer);
out:
    kiln_sign_trust_free(t);
    json_decref(v.m);
    json_decref(tags);
    free(seqs);
    free(body);
    free(repo);
    return rc;
}

/* PUT /v1/trust/N: the first version a registry holds is its policy as given (what serve
 * --trust is); each after it must be signed, number N = the newest + 1, and be accepted as
 * its successor. */
static kiln_err put_trust(reg_oci *o, uint64_t v, const char *doc, size_t len, char **answer,
                          size_t *alen) {
    char label[96], *repo = reg_oci_repo(o, TRUST_REPO), *body = NULL, tag[32],
                    digest[REG_OCI_DIGEST];
    KILN_FAIL_IF(!repo, KILN_ERR_NOMEM, "out of memory");
    snprintf(label, sizeof label, "trust version %llu", (unsigned long long)v);
    uint64_t *vs = NULL;
    size_t n = 0;
    kiln_sign_trust *t = NULL, *cur = NULL, *next = NULL;
    kiln_err rc = kiln_sign_trust_parse(doc, len, label, &t);
    KILN_CHECK(rc, out, rc);
    KILN_CHECK_IF(rc, out, kiln_sign_trust_version(t) != v, KILN_ERR_USAGE,
                  "'%s' holds version %llu, not %llu", label,
                  (unsigned long long)kiln_sign_trust_version(t), (unsigned long long)v);
    KILN_CHECK(rc, out, trust_versions(o, &vs, &n));
    if (n) {
        KILN_CHECK_IF(rc, out, !kiln_sign_trust_signatures(t), KILN_ERR_USAGE,
                      "'%s' is a plain policy: a trust version after the first must be signed",
                      label);
        KILN_CHECK(rc, out, registry_policy(o, &cur));
        uint64_t cv = kiln_sign_trust_version(cur);
        KILN_CHECK_IF(rc, out, v != cv + 1, KILN_ERR_CONFLICT,
                      "'%s': the registry's trust policy is at version %llu, so the next is %llu",
                      label, (unsigned long long)cv, (unsigned long long)cv + 1);
        KILN_CHECK(rc, out, kiln_sign_trust_update(cur, doc, len, label, &next, NULL));
    }
    snprintf(tag, sizeof tag, "%llu", (unsigned long long)v);
    bool exists;
    char have[REG_OCI_DIGEST];
    KILN_CHECK(rc, out, reg_oci_manifest_head(o, repo, tag, &exists, have));
    KILN_CHECK_IF(rc, out, exists, KILN_ERR_CONFLICT,
                  "registry '%s' holds %s already (written meanwhile by someone else)", o->c->url,
                  label);
    reg_oci_sha256(doc, len, digest);
    KILN_CHECK(rc, out, put_empty_config(o, repo));
    KILN_CHECK(rc, out, reg_oci_blob_push(o, repo, doc, NULL, len, digest, NULL));
    body = image_manifest(AT_TRUST, descriptor(MT_EMPTY, EMPTY_DIGEST, 2),
                          json_pack("[o]", descriptor(AT_TRUST, digest, len)));
    KILN_CHECK_IF(rc, out, !body, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, put_and_confirm(o, repo, tag, body, false, label));
    *answer = kiln_asprintf("{\"version\":%llu}", (unsigned long long)v);
    KILN_CHECK_IF(rc, out, !*answer, KILN_ERR_NOMEM, "out of memory");
    *alen = strlen(*answer);
out:
    kiln_sign_trust_free(t);
    kiln_sign_trust_free(cur);
    kiln_sign_trust_free(next);
    free(vs);
    free(body);
    free(repo);
    return rc;
}

/* ---- dispatch ---- */

static kiln_err json_text(json_t *j, char **text, size_t *len) {
    *text = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    KILN_FAIL_IF(!*text, KILN_ERR_NOMEM, "out of memory");
    *len = strlen(*text);
    return KILN_OK;
}

kiln_err reg_oci_route(const kiln_registry_client_opts *c, const char *method, const char *path,
                       const char *body, size_t body_len, size_t limit, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    reg_oci o;
    KILN_TRY(reg_oci_open(c, &o));
    char seg[6][KILN_REGISTRY_NAME_MAX + 1], query[80] = "";
    size_t n = 0;
    const char *p = path;
    const char *q = strchr(path, '?');
    if (q) snprintf(query, sizeof query, "%s", q + 1);
    size_t plen = q ? (size_t)(q - path) : strlen(path);
    while (p < path + plen && n < 6) {
        while (*p == '/')
            p++;
        size_t k = strcspn(p, "/?");
        if (!k) break;
        KILN_FAIL_IF(k > KILN_REGISTRY_NAME_MAX, KILN_ERR_USAGE, "path '%s' too long", path);
        memcpy(seg[n], p, k);
        seg[n][k] = 0;
        n++;
        p += k;
    }
    bool get = !strcmp(method, "GET"), put = !strcmp(method, "PUT");
    kiln_err rc = KILN_ERR_UNSUPPORTED;
    json_t *j = NULL;
    if (n >= 1 && strcmp(seg[0], "v1")) n = 0;
    if (get && n == 2 && !strcmp(seg[1], "models")) {
        rc = route_models(&o, &j);
        if (!rc) rc = json_text(j, text, len);
    } else if (get && n == 3 && !strcmp(seg[1], "models")) {
        rc = route_model(&o, seg[2], &j);
        if (!rc) rc = json_text(j, text, len);
    } else if (get && n == 5 && !strcmp(seg[1], "models") && !strcmp(seg[3], "versions")) {
        rc = route_version(&o, seg[2], seg[4], &j);
        if (!rc) rc = json_text(j, text, len);
    } else if (n == 5 && !strcmp(seg[1], "models") && !strcmp(seg[3], "channels")) {
        if (get)
            rc = route_channel(&o, seg[2], seg[4], text, len);
        else if (put)
            rc = put_channel(&o, seg[2], seg[4], body, body_len, !strcmp(query, "mirror=1"), text,
                             len);
    } else if (get && n == 6 && !strcmp(seg[1], "models") && !strcmp(seg[3], "channels") &&
               !strcmp(seg[5], "history")) {
        int64_t after = 0;
        if (!strncmp(query, "after=", 6)) after = strtoll(query + 6, NULL, 10);
        rc = route_history(&o, seg[2], seg[4], after, &j);
        if (!rc) rc = json_text(j, text, len);
    } else if (n == 2 && !strcmp(seg[1], "trust") && get) {
        rc = route_trust(&o, 0, text, len);
    } else if (n == 3 && !strcmp(seg[1], "trust")) {
        char *end;
        uint64_t v = strtoull(seg[2], &end, 10);
        if (*end || !v) return kiln_fail(KILN_ERR_USAGE, "'%s' is not a trust version", seg[2]);
        if (get)
            rc = route_trust(&o, v, text, len);
        else if (put)
            rc = put_trust(&o, v, body, body_len, text, len);
    } else {
        return kiln_fail(KILN_ERR_UNSUPPORTED,
                         "registry '%s' is an OCI registry: it has no %s %s (kiln's own server "
                         "has; an OCI registry keeps no audit log or tokens of kiln's)",
                         c->url, method, path);
    }
    if (!rc && *len > limit) {
        free(*text);
        *text = NULL;
        *len = 0;
        rc =
            kiln_fail(KILN_ERR_LIMIT, "registry '%s': answer larger than %zu bytes", c->url, limit);
    }
    return rc;
}

/* ---- publish ---- */

kiln_err reg_oci_publish(const kiln_registry_client_opts *c_in, const char *archive,
                         const char *sig_path, kiln_registry_published *out) {
    memset(out, 0, sizeof *out);
    kiln_registry_client_opts one = *c_in;
    if (!one.until_ns) reg_deadline_start(&one, 1);
    reg_oci o;
    KILN_TRY(reg_oci_open(&one, &o));
    kiln_err rc = KILN_OK;
    char *sigp = NULL, *sig = NULL, *mtext = NULL, *card = NULL, *body = NULL, *repo = NULL;
    size_t sig_len = 0;
    reg_archive_meta m;
    memset(&m, 0, sizeof m);
    kiln_sign_trust *t = NULL;
    version_info have = {0};
    uint8_t d[KILN_SHA256_BYTES];
    char hex[KILN_SHA256_HEX], adigest[REG_OCI_DIGEST], sdigest[REG_OCI_DIGEST],
        mdigest[REG_OCI_DIGEST], cdigest[REG_OCI_DIGEST], vdigest[REG_OCI_DIGEST];
    json_t *layers = NULL;

    sigp = sig_path ? kiln_strdup(sig_path) : kiln_asprintf("%s.minisig", archive);
    KILN_CHECK_IF(rc, out, !sigp, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_read_file(sigp, REG_SIG_MAX, &sig, &sig_len));
    {
        kiln_sign_sig *sigs = NULL;
        size_t nsigs = 0;
        KILN_CHECK(rc, out, kiln_sign_archive_sigs_parse(sig, sig_len, sigp, &sigs, &nsigs));
        kiln_sign_archive_sigs_free(sigs, nsigs);
    }
    KILN_CHECK(rc, out, reg_archive_meta_read(archive, &m));
    KILN_CHECK_IF(rc, out, !strcmp(m.name, TRUST_REPO), KILN_ERR_USAGE,
                  "'%s': a model named '%s' cannot go to an OCI registry (the trust versions' "
                  "repository has that name)",
                  archive, TRUST_REPO);
    /* The manifest.json the signatures sign, byte for byte (kiln pack writes it canonical). */
    mtext = kiln_json_canonical(m.manifest);
    KILN_CHECK_IF(rc, out, !mtext, KILN_ERR_NOMEM, "out of memory");
    kiln_sha256(mtext, strlen(mtext), d);
    KILN_CHECK_IF(rc, out, memcmp(d, m.manifest_sha256, sizeof d), KILN_ERR_FORMAT,
                  "'%s': its manifest.json is not in canonical form", archive);
    /* The gate the kiln server keeps at upload: the release keys' signatures over the
     * manifest, under the registry's policy. */
    KILN_CHECK(rc, out, registry_policy(&o, &t));
    {
        kiln_sign_archive_report rep;
        memset(&rep, 0, sizeof rep);
        KILN_CHECK(rc, out,
                   kiln_sign_verify_manifest_sigs(mtext, strlen(mtext), archive, sig, sig_len, sigp,
                                                  t, &rep));
    }
    KILN_CHECK(rc, out, kiln_sha256_file(archive, d));
    kiln_hex(d, sizeof d, hex);
    snprintf(adigest, sizeof adigest, "sha256:%s", hex);
    struct stat sb;
    KILN_CHECK_IF(rc, out, stat(archive, &sb) != 0, KILN_ERR_IO, "cannot stat '%s'", archive);
    repo = reg_oci_repo(&o, m.name);
    KILN_CHECK_IF(rc, out, !repo, KILN_ERR_NOMEM, "out of memory");
    /* Versions are immutable: absent, or holding these bytes. */
    rc = version_read(&o, repo, m.version, &have);
    if (rc == KILN_ERR_NOTFOUND) {
        kiln_errclear();
        rc = KILN_OK;
    } else if (!rc) {
        KILN_CHECK_IF(rc, out, strcmp(have.archive_digest, adigest), KILN_ERR_CONFLICT,
                      "version '%s@%s' exists on registry '%s' with other bytes (%s); versions "
                      "are immutable",
                      m.name, m.version, o.c->url, have.archive_digest);
        snprintf(out->digest, sizeof out->digest, "%s", adigest);
        out->size = (uint64_t)sb.st_size;
        out->existed = true;
        goto out;
    }
    KILN_CHECK(rc, out, rc);
    reg_oci_sha256(mtext, strlen(mtext), mdigest);
    reg_oci_sha256(sig, sig_len, sdigest);
    KILN_CHECK(rc, out, reg_oci_blob_push(&o, repo, mtext, NULL, strlen(mtext), mdigest, NULL));
    KILN_CHECK(rc, out,
               reg_oci_blob_push(&o, repo, NULL, archive, (uint64_t)sb.st_size, adigest, NULL));
    KILN_CHECK(rc, out, reg_oci_blob_push(&o, repo, sig, NULL, sig_len, sdigest, NULL));
    layers = json_pack("[o, o]", descriptor(MT_ARCHIVE, adigest, (uint64_t)sb.st_size),
                       descriptor(MT_SIG, sdigest, sig_len));
    KILN_CHECK_IF(rc, out, !layers, KILN_ERR_NOMEM, "out of memory");
    if (m.card) {
        card = kiln_json_canonical(m.card);
        KILN_CHECK_IF(rc, out, !card, KILN_ERR_NOMEM, "out of memory");
        reg_oci_sha256(card, strlen(card), cdigest);
        KILN_CHECK(rc, out, reg_oci_blob_push(&o, repo, card, NULL, strlen(card), cdigest, NULL));
        json_array_append_new(layers, descriptor(MT_CARD, cdigest, strlen(card)));
    }
    if (m.validation_text) {
        reg_oci_sha256(m.validation_text, m.validation_len, vdigest);
        KILN_CHECK(
            rc, out,
            reg_oci_blob_push(&o, repo, m.validation_text, NULL, m.validation_len, vdigest, NULL));
        json_array_append_new(layers, descriptor(MT_VALIDATION, vdigest, m.validation_len));
    }
    body = image_manifest(AT_MODEL, descriptor(MT_KMANIFEST, mdigest, strlen(mtext)), layers);
    layers = NULL; /* image_manifest took it */
    KILN_CHECK_IF(rc, out, !body, KILN_ERR_NOMEM, "out of memory");
    char what[200];
    snprintf(what, sizeof what, "publishing %s@%s", m.name, m.version);
    KILN_CHECK(rc, out, put_and_confirm(&o, repo, m.version, body, false, what));
    snprintf(out->digest, sizeof out->digest, "%s", adigest);
    out->size = (uint64_t)sb.st_size;
    out->existed = false;
out:
    json_decref(layers);
    json_decref(have.m);
    kiln_sign_trust_free(t);
    reg_archive_meta_release(&m);
    free(sigp);
    free(sig);
    free(mtext);
    free(card);
    free(body);
    free(repo);
    return rc;
}

/* ---- download ---- */

kiln_err reg_oci_download(const kiln_registry_client_opts *c, const char *hex, uint64_t size,
                          const char *partial, struct reg_follow *follow) {
    reg_oci o;
    KILN_TRY(reg_oci_open(c, &o));
    char repo[300];
    KILN_FAIL_IF(!home_find(&o, hex, repo), KILN_ERR_NOTFOUND,
                 "registry '%s': no version read here holds blob sha256:%s", c->url, hex);
    /* A HEAD first, through the authentication flow, so that the download carries the
     * credentials the registry asked for. */
    bool exists;
    char digest[REG_OCI_DIGEST];
    snprintf(digest, sizeof digest, "sha256:%s", hex);
    KILN_TRY(reg_oci_blob_exists(&o, repo, digest, &exists));
    KILN_FAIL_IF(!exists, KILN_ERR_NOTFOUND, "registry '%s' has no blob %s in %s", c->url, digest,
                 repo);
    char *scope = kiln_asprintf("repository:%s:pull", repo),
         *url = kiln_asprintf("%s/v2/%s/blobs/%s", o.base, repo, digest);
    char *auth = scope ? reg_oci_auth_line(&o, scope) : NULL;
    kiln_err rc = scope && url ? reg_download_url(c, url, auth, hex, size, partial, follow)
                               : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (auth) {
        sodium_memzero(auth, strlen(auth));
        free(auth);
    }
    free(scope);
    free(url);
    return rc;
}

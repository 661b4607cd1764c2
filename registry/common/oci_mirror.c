/* oci_mirror.c - kiln registry mirror into an OCI registry (--root oci://HOST/PREFIX): what a
 * primary (kiln's server, or another OCI registry) holds and the OCI registry lacks, copied
 * through the same gate a publish and a promote pass there (oci_kiln.c): trust versions, each
 * the successor of the one before (the first, when the OCI registry has none, is the mirror's
 * --trust policy); every version, its archive downloaded and its sha256 checked, then
 * published (its signatures verified under the OCI registry's policy); each channel's records
 * in seq order, each verified as a promote's is, except that an old record may have expired.
 * The reverse direction (an OCI registry as the primary of a kiln store) is mirror.c's own
 * sync reading through oci_kiln.c's routes. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "oci_int.h"

typedef struct push {
    const kiln_registry_mirror_opts *o;
    kiln_registry_client_opts to;
    kiln_registry_mirror_result *res;
    char *tmp;
} push;

static void said(push *p, bool problem, const char *fmt, ...) KILN_PRINTF(3, 4);
static void said(push *p, bool problem, const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    void (*f)(void *, const char *) = problem ? p->o->on_problem : p->o->on_copied;
    if (f) f(p->o->ctx, line);
    if (problem) p->res->problems++;
}

/* PUT /v1/trust/V into the OCI registry (its gate checks the succession). */
static kiln_err put_trust(push *p, uint64_t v, const char *doc, size_t len) {
    char path[64], *ans = NULL;
    size_t alen = 0;
    snprintf(path, sizeof path, "/v1/trust/%llu", (unsigned long long)v);
    kiln_err rc = reg_oci_route(&p->to, "PUT", path, doc, len, REG_JSON_MAX, &ans, &alen);
    free(ans);
    return rc;
}

static kiln_err trust_versions(push *p) {
    const kiln_registry_client_opts *from = p->o->from;
    char *doc = NULL;
    size_t len = 0;
    uint64_t have = 0;
    kiln_sign_trust *t = NULL;
    kiln_err rc = reg_get_text(&p->to, "/v1/trust", REG_TRUST_MAX, &doc, &len);
    if (rc == KILN_ERR_NOTFOUND) {
        /* The OCI registry's first version: the policy the copy is verified under. */
        kiln_errclear();
        KILN_TRY(kiln_read_file(p->o->trust, REG_TRUST_MAX, &doc, &len));
        kiln_sign_trust *first = NULL;
        rc = kiln_sign_trust_parse(doc, len, p->o->trust, &first);
        if (!rc) have = kiln_sign_trust_version(first);
        kiln_sign_trust_free(first);
        if (!rc) rc = put_trust(p, have, doc, len);
        if (!rc) {
            p->res->trust_versions++;
            said(p, false, "copied trust version %llu ('%s', the mirror's policy)",
                 (unsigned long long)have, p->o->trust);
        }
    } else if (!rc) {
        rc = kiln_sign_trust_parse(doc, len, "the mirror's newest trust version", &t);
        if (!rc) have = kiln_sign_trust_version(t);
        kiln_sign_trust_free(t);
    }
    free(doc);
    KILN_TRY(rc);
    for (uint64_t v = have + 1;; v++) {
        char path[64];
        snprintf(path, sizeof path, "/v1/trust/%llu", (unsigned long long)v);
        rc = reg_get_text(from, path, REG_TRUST_MAX, &doc, &len);
        if (rc == KILN_ERR_NOTFOUND) {
            kiln_errclear();
            return KILN_OK;
        }
        KILN_TRY(rc);
        rc = put_trust(p, v, doc, len);
        free(doc);
        if (rc == KILN_ERR_VERIFY || rc == KILN_ERR_CONFLICT || rc == KILN_ERR_USAGE) {
            said(p, true, "trust version %llu: %s", (unsigned long long)v, kiln_errmsg());
            kiln_errclear();
            return KILN_OK; /* nothing after it can follow */
        }
        KILN_TRY(rc);
        p->res->trust_versions++;
        said(p, false, "copied trust version %llu", (unsigned long long)v);
    }
}

static kiln_err one_version(push *p, const char *model, const char *version) {
    char path[256];
    snprintf(path, sizeof path, "/v1/models/%s/versions/%s", model, version);
    json_t *theirs = NULL, *ours = NULL;
    kiln_err rc = kiln_registry_get_json(p->o->from, path, &theirs);
    KILN_TRY(rc);
    const char *digest = json_string_value(json_object_get(theirs, "digest")),
               *sig = json_string_value(json_object_get(theirs, "signature"));
    json_t *jsize = json_object_get(theirs, "size");
    char hex[KILN_SHA256_HEX];
    char *archive = NULL, *sigp = NULL;
    if (!digest || !reg_digest_hex(digest, hex) || !sig || !json_is_integer(jsize) ||
        json_integer_value(jsize) < 0) {
        said(p, true, "%s@%s: the primary's record lacks a digest, size or signature", model,
             version);
        goto out;
    }
    rc = kiln_registry_get_json(&p->to, path, &ours);
    if (!rc) {
        const char *d = json_string_value(json_object_get(ours, "digest"));
        if (!d || strcmp(d, digest))
            said(p, true, "%s@%s: the mirror holds %s, the primary %s; not overwritten", model,
                 version, d ? d : "(none)", digest);
        goto out;
    }
    if (rc != KILN_ERR_NOTFOUND) goto out;
    kiln_errclear();
    rc = KILN_OK;
    archive = kiln_asprintf("%s/%s", p->tmp, hex);
    sigp = kiln_asprintf("%s/%s.minisig", p->tmp, hex);
    KILN_CHECK_IF(rc, out, !archive || !sigp, KILN_ERR_NOMEM, "out of memory");
    uint64_t size = (uint64_t)json_integer_value(jsize);
    KILN_CHECK(rc, out, reg_download(p->o->from, hex, size, archive));
    p->res->bytes += size;
    uint8_t d[KILN_SHA256_BYTES];
    char got[KILN_SHA256_HEX];
    KILN_CHECK(rc, out, kiln_sha256_file(archive, d));
    kiln_hex(d, sizeof d, got);
    if (strcmp(got, hex)) {
        said(p, true, "%s@%s: the primary sent bytes of sha256:%s for %s; not copied", model,
             version, got, digest);
        goto out;
    }
    KILN_CHECK(rc, out, kiln_write_file_atomic(sigp, sig, strlen(sig)));
    kiln_registry_published pub;
    rc = kiln_registry_publish(&p->to, archive, sigp, &pub);
    if (rc == KILN_ERR_VERIFY || rc == KILN_ERR_CONFLICT || rc == KILN_ERR_FORMAT) {
        said(p, true, "%s@%s: %s", model, version, kiln_errmsg());
        kiln_errclear();
        rc = KILN_OK;
        goto out;
    }
    KILN_CHECK(rc, out, rc);
    p->res->versions++;
    said(p, false, "copied %s@%s %s (%" PRIu64 " bytes)", model, version, digest, size);
out:
    if (archive) unlink(archive);
    if (sigp) unlink(sigp);
    free(archive);
    free(sigp);
    json_decref(theirs);
    json_decref(ours);
    return rc;
}

/* A record's seq, from its text (0 when it does not parse: the gate refuses it then). */
static int64_t text_seq(const json_t *r) {
    const char *text = json_string_value(json_object_get(r, "text"));
    kiln_sign_record rec;
    kiln_sign_record_init(&rec);
    int64_t seq = 0;
    if (text && kiln_sign_record_parse(text, strlen(text), "record", &rec) == KILN_OK)
        seq = (int64_t)rec.seq;
    kiln_errclear();
    kiln_sign_record_release(&rec);
    return seq;
}

static kiln_err one_channel(push *p, const char *model, const char *channel) {
    char path[300];
    snprintf(path, sizeof path, "/v1/models/%s/channels/%s/history", model, channel);
    json_t *ours = NULL, *theirs = NULL;
    int64_t have = 0;
    kiln_err rc = kiln_registry_get_json(&p->to, path, &ours);
    if (rc == KILN_ERR_NOTFOUND) {
        kiln_errclear();
        rc = KILN_OK;
    }
    KILN_TRY(rc);
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(ours, "records"), i, r) {
        if (text_seq(r) > have) have = text_seq(r);
    }
    json_decref(ours);
    snprintf(path, sizeof path, "/v1/models/%s/channels/%s/history?after=%lld", model, channel,
             (long long)have);
    KILN_TRY(kiln_registry_get_json(p->o->from, path, &theirs));
    json_array_foreach(json_object_get(theirs, "records"), i, r) {
        const char *text = json_string_value(json_object_get(r, "text"));
        if (!text) continue;
        /* The mirror's PUT: an old record may have expired (oci_kiln.c, put_channel). */
        char put[300];
        snprintf(put, sizeof put, "/v1/models/%s/channels/%s?mirror=1", model, channel);
        char *ans = NULL;
        size_t alen = 0;
        rc = reg_oci_route(&p->to, "PUT", put, text, strlen(text), REG_JSON_MAX, &ans, &alen);
        free(ans);
        if (rc == KILN_ERR_VERIFY || rc == KILN_ERR_CONFLICT || rc == KILN_ERR_NOTFOUND) {
            said(p, true, "%s/%s: %s", model, channel, kiln_errmsg());
            kiln_errclear();
            rc = KILN_OK;
            break; /* the records after it cannot follow */
        }
        if (rc) break;
        p->res->records++;
        said(p, false, "copied %s/%s seq %lld", model, channel, (long long)text_seq(r));
    }
    json_decref(theirs);
    return rc;
}

kiln_err reg_oci_mirror_push(const kiln_registry_mirror_opts *o, kiln_registry_mirror_result *res) {
    push p = {.o = o, .res = res};
    memset(res, 0, sizeof *res);
    p.to = *o->from;
    p.to.url = o->root;
    p.to.token = NULL; /* the OCI registry's credentials come from the auth file */
    p.to.progress = NULL;
    reg_deadline_start(&p.to, 1);
    kiln_registry_client_opts from = *o->from;
    reg_deadline_start(&from, 1);
    kiln_registry_mirror_opts oo = *o;
    oo.from = &from;
    p.o = &oo;
    const char *tmpdir = getenv("TMPDIR");
    p.tmp = kiln_asprintf("%s/kiln-mirror-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    KILN_FAIL_IF(!p.tmp, KILN_ERR_NOMEM, "out of memory");
    if (!mkdtemp(p.tmp)) {
        kiln_err rc = kiln_fail_errno(KILN_ERR_IO, "cannot create '%s'", p.tmp);
        free(p.tmp);
        return rc;
    }
    json_t *models = NULL;
    kiln_err rc = trust_versions(&p);
    if (!rc) rc = kiln_registry_get_json(&from, "/v1/models", &models);
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(models, "models"), i, m) {
        if (rc) break;
        const char *name = json_string_value(json_object_get(m, "name"));
        if (!name || kiln_registry_check_name("model", name)) {
            kiln_errclear();
            continue;
        }
        char path[128];
        snprintf(path, sizeof path, "/v1/models/%s", name);
        json_t *mj = NULL;
        rc = kiln_registry_get_json(&from, path, &mj);
        size_t k;
        json_t *v;
        json_array_foreach(json_object_get(mj, "versions"), k, v) {
            if (rc) break;
            const char *ver = json_string_value(json_object_get(v, "version"));
            if (ver) rc = one_version(&p, name, ver);
        }
        const char *ch;
        json_t *cv;
        json_object_foreach(json_object_get(mj, "channels"), ch, cv) {
            if (rc) break;
            rc = one_channel(&p, name, ch);
        }
        json_decref(mj);
    }
    json_decref(models);
    reg_rmtree(p.tmp);
    free(p.tmp);
    if (!rc && res->problems)
        rc = kiln_fail(KILN_ERR_VERIFY, "%zu item%s did not verify", res->problems,
                       res->problems == 1 ? "" : "s");
    return rc;
}

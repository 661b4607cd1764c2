/* models.c - kiln models: what a registry holds (every model, or one model's versions) and
 * each channel's current record, as one JSON document (kiln-models/1, docs/registry.md
 * "Listing a registry"); the CLI prints it as text or as it is.
 *
 * The registry's JSON summary (GET /v1/models/{model}) is its word. With a trust policy each
 * channel's current record is fetched (the bytes as signed) and checked on this side with
 * sign/'s kiln_sign_record_verify (signatures by promote keys, the channel's threshold) under
 * the policy walked as kiln pull walks it, then against what the summary claims (model,
 * channel, seq, version, digest, expiry, the version's digest in the model's list) and the
 * seq this client accepted last: what is shown is the signed record's, never the summary's,
 * once its signatures verify. Expiry reads by sign/'s rule (kiln_record_expiry_at), the web
 * page's. Over several registries everything goes through failover.c, as kiln pull and kiln
 * provenance do: the trust walk through each that answers, the list and each model from the
 * first that holds it, each channel's record the highest seq that verifies. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "sign.h"

#define MODELS_FORMAT "kiln-models/1"

typedef struct lister {
    reg_registries regs;
    const kiln_registry_models_opts *o;
    kiln_sign_trust *t; /* NULL without o->trust */
    char *state;        /* with o->trust: the state directory walked and checked against */
    int64_t now;
    json_t *problems, *expiring, *notes;
    bool oom;
} lister;

/* ---- building the answer ---- */

/* Add v (stolen, also on failure) to obj or arr; a failure is remembered as out of memory. */
static void set(lister *l, json_t *obj, const char *key, json_t *v) {
    if (!obj) json_decref(v);
    if (!v || !obj || json_object_set_new(obj, key, v)) l->oom = true;
}

static void push(lister *l, json_t *arr, json_t *v) {
    if (!arr) json_decref(v);
    if (!v || !arr || json_array_append_new(arr, v)) l->oom = true;
}

static json_t *str_or_null(const char *s) {
    return s ? json_string(s) : json_null();
}

static void on_note(void *ctx, const char *line) {
    lister *l = ctx;
    push(l, l->notes, json_string(line));
}

/* The registry's answer for model is not what a kiln registry sends. */
static kiln_err bad_answer(const char *url, const char *model, const char *what) {
    return kiln_fail(KILN_ERR_FORMAT, "registry '%s': the answer for model '%s' %s", url, model,
                     what);
}

/* ---- a channel ---- */

/* What the summary claims of a channel's current record. */
typedef struct claim {
    int64_t seq, expires, put_at;
    const char *version, *digest, *reason, *put_by;
} claim;

static kiln_err read_claim(const char *url, const char *model, const char *name, const json_t *c,
                           claim *out) {
    memset(out, 0, sizeof *out);
    char what[200];
    snprintf(what, sizeof what, "lists channel '%s' without a valid name", name);
    if (kiln_registry_check_name("channel", name)) return bad_answer(url, model, what);
    const json_t *seq = json_object_get(c, "seq"), *reason = json_object_get(c, "reason");
    out->version = json_string_value(json_object_get(c, "version"));
    out->digest = json_string_value(json_object_get(c, "digest"));
    out->put_by = json_string_value(json_object_get(c, "put_by"));
    out->reason = json_string_value(reason);
    const char *exp = json_string_value(json_object_get(c, "expires")),
               *put_at = json_string_value(json_object_get(c, "put_at"));
    snprintf(what, sizeof what, "lists channel '%s' without a seq, version, digest and expiry",
             name);
    if (!json_is_integer(seq) || json_integer_value(seq) < 1 || !out->version || !out->digest ||
        !exp || kiln_sign_parse_time(exp, "expires", &out->expires) ||
        (reason && !json_is_null(reason) && !out->reason))
        return bad_answer(url, model, what);
    out->seq = json_integer_value(seq);
    /* Older registries send neither who put the record nor when: shown as unknown. */
    if (!put_at || kiln_sign_parse_time(put_at, "put_at", &out->put_at)) out->put_at = 0;
    kiln_errclear();
    return KILN_OK;
}

/* The channel's row: the verification's verdict, where the fields came from, the fields. */
typedef struct row {
    const char *status; /* "verified" | "failed" | "not checked" */
    char how[1536];
    bool from_record; /* the fields are the signed record's (its signatures verified) */
    char version[KILN_SIGN_NAME_MAX + 1], reason[KILN_SIGN_REASON_MAX + 1];
    kiln_digest digest;
    int64_t seq, expires;
    json_t *signed_by; /* the promote keys whose signatures verified, by name */
    int threshold;
    bool fetched;       /* a record was served */
    size_t record_from; /* the registry that served it */
} row;

static void failed(row *r, const char *fmt, ...) KILN_PRINTF(2, 3);
static void failed(row *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->how, sizeof r->how, fmt, ap);
    va_end(ap);
    r->status = "failed";
}

/* The digest a model's version list gives version, or NULL when it lists no such version. */
static const char *listed_digest(const json_t *versions, const char *version) {
    size_t i;
    json_t *v;
    json_array_foreach(versions, i, v) {
        const char *s = json_string_value(json_object_get(v, "version"));
        if (s && !strcmp(s, version)) return json_string_value(json_object_get(v, "digest"));
    }
    return NULL;
}

/* Fetch the channel's current record (the highest seq that verifies, over several
 * registries) and check it: its signatures under the policy, then against the claim. A
 * failure to fetch that is no verdict on the record (a registry down, a token refused) is
 * returned; a record that does not verify, or none served for a listed channel, is a
 * verdict in r. */
static kiln_err check_record(lister *l, const char *model, const char *name, const claim *cl,
                             const json_t *versions, size_t model_from, row *r) {
    char *text = NULL;
    size_t len = 0, from = 0;
    kiln_err rc;
    if (l->regs.n == 1) {
        rc = kiln_registry_get_channel(&l->regs.c[0], model, name, &text, &len);
    } else {
        rc = reg_newest_record(&l->regs, l->t, l->state, model, name, &text, &len, &from);
        if (rc != KILN_OK && rc != KILN_ERR_NOTFOUND && rc != KILN_ERR_NOMEM) {
            /* None verifies: the first served is checked below and flagged (kiln provenance's
             * rule); none served at all is the failure it was. */
            char why[1536];
            snprintf(why, sizeof why, "%s", kiln_errmsg());
            kiln_err frc = reg_first_record(&l->regs, model, name, &text, &len, &from);
            if (frc == KILN_OK) {
                on_note(l, why);
                rc = KILN_OK;
            } else if (frc == KILN_ERR_NOMEM) {
                rc = frc;
            } else {
                rc = kiln_fail(rc, "%s", why);
            }
        }
    }
    if (rc == KILN_ERR_NOTFOUND) {
        kiln_errclear();
        failed(r, "the registry lists channel '%s' at seq %lld, but %s serves no record of it",
               name, (long long)cl->seq, l->regs.n == 1 ? "it" : "no registry");
        return KILN_OK;
    }
    if (rc) return rc;
    r->fetched = true;
    r->record_from = from;
    char label[200];
    snprintf(label, sizeof label, "channel record %s@%s", model, name);
    kiln_sign_record rec;
    kiln_sign_record_init(&rec);
    kiln_sign_record_result res;
    rc = kiln_sign_record_parse(text, len, label, &rec);
    if (!rc) rc = kiln_sign_record_verify(&rec, l->t, 0, 0, label, &res);
    if (rc == KILN_ERR_NOMEM) goto out;
    if (rc) {
        /* Nothing in it can be believed: the row keeps the registry's word, flagged. */
        failed(r, "%s (under trust policy v%llu)", kiln_errmsg(),
               (unsigned long long)kiln_sign_trust_version(l->t));
        kiln_errclear();
        rc = KILN_OK;
        goto out;
    }
    /* Its signatures verified: from here on the row is the record's. */
    r->from_record = true;
    char hex[KILN_SHA256_HEX];
    kiln_hex(rec.digest, sizeof rec.digest, hex);
    snprintf(r->version, sizeof r->version, "%s", rec.version);
    snprintf(r->digest, sizeof r->digest, "sha256:%s", hex);
    snprintf(r->reason, sizeof r->reason, "%s", rec.reason ? rec.reason : "");
    r->seq = rec.seq > INT64_MAX ? INT64_MAX : (int64_t)rec.seq;
    r->expires = rec.expires;
    r->threshold = res.threshold;
    r->signed_by = json_array();
    for (size_t i = 0; i < res.nsigners; i++)
        push(l, r->signed_by, json_string(res.signers[i]->name));
    int64_t last = 0;
    bool known = false;
    rc = reg_channel_state(l->state, model, name, &last, &known);
    if (rc) goto out;
    const char *ld = listed_digest(versions, r->version);
    if (strcmp(rec.model, model) || strcmp(rec.channel, name)) {
        failed(r, "the registry serves it as %s/%s, but the signed record names %s/%s", model, name,
               rec.model, rec.channel);
    } else if (r->seq < cl->seq) {
        failed(r, "the registry lists seq %lld, but serves a signed record of seq %lld",
               (long long)cl->seq, (long long)r->seq);
    } else if (r->seq == cl->seq &&
               (strcmp(cl->version, r->version) || strcmp(cl->digest, r->digest))) {
        failed(r, "the registry lists %s (%s) at seq %lld, but the signed record says %s (%s)",
               cl->version, cl->digest, (long long)r->seq, r->version, r->digest);
    } else if (r->seq == cl->seq && cl->expires != r->expires) {
        char a[21], b[21];
        kiln_format_time(cl->expires, a);
        kiln_format_time(r->expires, b);
        failed(r, "the registry lists seq %lld as expiring %s, but the signed record says %s",
               (long long)r->seq, a, b);
    } else if (ld && strcmp(ld, r->digest)) {
        failed(r, "the registry lists %s@%s as %s, but the signed record names %s", model,
               r->version, ld, r->digest);
    } else if (!ld && (from == model_from || r->seq == cl->seq)) {
        failed(r, "the signed record points at %s@%s, which the registry does not list", model,
               r->version);
    } else if (known && r->seq < last) {
        failed(r,
               "seq %lld is below seq %lld, the last this client accepted ('%s'): a replayed "
               "or rolled-back record",
               (long long)r->seq, (long long)last, l->state);
    } else if (kiln_sign_trust_withdrawn(l->t, r->digest)) {
        failed(r, "it names %s@%s (%s), which trust policy v%llu withdrew: %s", model, r->version,
               r->digest, (unsigned long long)kiln_sign_trust_version(l->t),
               kiln_sign_trust_withdrawn(l->t, r->digest));
    } else {
        r->status = "verified";
        int n = snprintf(r->how, sizeof r->how, "%zu of %d promote key%s of trust policy v%llu",
                         res.nsigners, res.threshold, res.threshold == 1 ? "" : "s",
                         (unsigned long long)kiln_sign_trust_version(l->t));
        if (n > 0 && (size_t)n < sizeof r->how && r->seq > cl->seq)
            n += snprintf(r->how + n, sizeof r->how - (size_t)n,
                          "; newer than the seq %lld the listing names", (long long)cl->seq);
        if (n > 0 && (size_t)n < sizeof r->how && known)
            snprintf(r->how + n, sizeof r->how - (size_t)n,
                     "; not below seq %lld, the last this client accepted", (long long)last);
    }
out:
    kiln_sign_record_release(&rec);
    free(text);
    return rc;
}

static kiln_err channel_json(lister *l, const char *url, const char *model, const char *name,
                             const json_t *c, const json_t *versions, size_t model_from,
                             json_t *arr, int64_t *changed) {
    claim cl;
    KILN_TRY(read_claim(url, model, name, c, &cl));
    row r;
    memset(&r, 0, sizeof r);
    r.status = "not checked";
    r.record_from = model_from;
    snprintf(r.how, sizeof r.how, "no trust policy given: as the registry states it");
    if (l->t) {
        kiln_err rc = check_record(l, model, name, &cl, versions, model_from, &r);
        if (rc) {
            json_decref(r.signed_by);
            return rc;
        }
    }
    if (!r.from_record) {
        snprintf(r.version, sizeof r.version, "%s", cl.version);
        snprintf(r.digest, sizeof r.digest, "%s", cl.digest);
        snprintf(r.reason, sizeof r.reason, "%s", cl.reason ? cl.reason : "");
        r.seq = cl.seq;
        r.expires = cl.expires;
    }
    if (cl.put_at > *changed) *changed = cl.put_at;
    kiln_record_expiry e = kiln_record_expiry_at(r.expires, l->now);
    bool expiring = l->o->expiring > 0 && r.expires - l->now < l->o->expiring;
    json_t *j = json_object();
    push(l, arr, j);
    set(l, j, "name", json_string(name));
    set(l, j, "version", json_string(r.version));
    set(l, j, "digest", json_string(r.digest));
    set(l, j, "seq", json_integer(r.seq));
    set(l, j, "expires", kiln_time_json(r.expires));
    set(l, j, "expires_in", json_integer(r.expires - l->now));
    set(l, j, "expiry", json_string(kiln_record_expiry_name(e)));
    set(l, j, "expiring", json_boolean(expiring));
    set(l, j, "reason", r.from_record || cl.reason ? json_string(r.reason) : json_null());
    set(l, j, "source", json_string(r.from_record ? "record" : "registry"));
    set(l, j, "record_from", r.fetched ? json_string(l->regs.c[r.record_from].url) : json_null());
    set(l, j, "signed_by", r.signed_by ? r.signed_by : json_null());
    set(l, j, "threshold", r.from_record ? json_integer(r.threshold) : json_null());
    set(l, j, "put_by", str_or_null(cl.put_by));
    set(l, j, "put_at", cl.put_at ? kiln_time_json(cl.put_at) : json_null());
    set(l, j, "check", json_pack("{s:s,s:s}", "status", r.status, "how", r.how));
    if (!strcmp(r.status, "failed")) {
        char *p = kiln_asprintf("%s/%s: %s", model, name, r.how);
        push(l, l->problems, p ? json_string(p) : NULL);
        free(p);
    }
    if (expiring) {
        char *p = kiln_asprintf("%s/%s", model, name);
        push(l, l->expiring, p ? json_string(p) : NULL);
        free(p);
    }
    return KILN_OK;
}

/* ---- a model ---- */

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* One model's entry: its versions as listed, then its channels (sorted by name), each checked
 * when there is a policy. KILN_ERR_NOTFOUND when no registry holds it. */
static kiln_err model_json(lister *l, const char *model, json_t *models) {
    char path[128], what[128];
    snprintf(path, sizeof path, "/v1/models/%s", model);
    snprintf(what, sizeof what, "model '%s'", model);
    json_t *mj = NULL;
    size_t from = 0;
    KILN_TRY(reg_get_json_first(&l->regs, path, what, &mj, &from));
    const char *url = l->regs.c[from].url;
    kiln_err rc = KILN_OK;
    const json_t *versions = json_object_get(mj, "versions"),
                 *chans = json_object_get(mj, "channels");
    const char **names = NULL;
    KILN_CHECK_IF(rc, out, !json_is_array(versions) || !json_is_object(chans), KILN_ERR_FORMAT,
                  "registry '%s': the answer for model '%s' has no versions and channels", url,
                  model);
    /* Every key in its place first (the document's order), filled in below. */
    json_t *j = json_object(), *vs = json_array(), *cs = json_array();
    push(l, models, j);
    set(l, j, "name", json_string(model));
    set(l, j, "registry", json_string(url));
    set(l, j, "version_count", json_integer((json_int_t)json_array_size(versions)));
    set(l, j, "latest", json_null());
    set(l, j, "updated", json_null());
    set(l, j, "versions", vs);
    set(l, j, "channels", cs);
    KILN_CHECK_IF(rc, out, l->oom, KILN_ERR_NOMEM, "out of memory");
    int64_t changed = 0;
    const char *latest = NULL;
    size_t i;
    json_t *v;
    json_array_foreach(versions, i, v) {
        const char *ver = json_string_value(json_object_get(v, "version")),
                   *dg = json_string_value(json_object_get(v, "digest")),
                   *created = json_string_value(json_object_get(v, "created"));
        const json_t *size = json_object_get(v, "size"), *val = json_object_get(v, "validation");
        int64_t t = 0;
        KILN_CHECK_IF(rc, out,
                      !ver || !dg || !json_is_integer(size) || !created ||
                          kiln_sign_parse_time(created, "created", &t),
                      KILN_ERR_FORMAT,
                      "registry '%s': the answer for model '%s' lists a version without a name, "
                      "digest, size and time",
                      url, model);
        /* The registry lists them in publication order: the last is the newest. */
        latest = ver;
        if (t > changed) changed = t;
        push(l, vs,
             json_pack("{s:s,s:s,s:O,s:o,s:s,s:o}", "version", ver, "digest", dg, "size", size,
                       "publisher", str_or_null(json_string_value(json_object_get(v, "publisher"))),
                       "created", created, "validation",
                       str_or_null(json_is_string(val) ? json_string_value(val) : NULL)));
    }
    set(l, j, "latest", str_or_null(latest));
    size_t nc = json_object_size(chans), k = 0;
    names = nc ? kiln_calloc(nc, sizeof *names) : NULL;
    KILN_CHECK_IF(rc, out, nc && !names, KILN_ERR_NOMEM, "out of memory");
    const char *key;
    json_object_foreach((json_t *)chans, key, v) names[k++] = key;
    qsort(names, nc, sizeof *names, cmp_str);
    for (k = 0; k < nc; k++)
        KILN_CHECK(rc, out,
                   channel_json(l, url, model, names[k], json_object_get(chans, names[k]), versions,
                                from, cs, &changed));
    set(l, j, "updated", changed ? kiln_time_json(changed) : json_null());
out:
    free(names);
    json_decref(mj);
    return rc;
}

/* ---- the listing ---- */

static kiln_err list_models(lister *l, json_t *models) {
    const char *only = l->o->model;
    if (only) {
        kiln_err rc = model_json(l, only, models);
        if (rc != KILN_ERR_NOTFOUND) return rc;
        if (l->regs.n == 1)
            return kiln_fail(KILN_ERR_NOTFOUND,
                             "registry '%s' has no model '%s' (kiln models without a name lists "
                             "the models it has)",
                             l->regs.c[0].url, only);
        return kiln_fail(KILN_ERR_NOTFOUND,
                         "no registry has a model '%s' (kiln models without a name lists the "
                         "models they have)",
                         only);
    }
    json_t *list = NULL;
    size_t from = 0;
    KILN_TRY(reg_get_json_first(&l->regs, "/v1/models", "the list of models", &list, &from));
    const json_t *arr = json_object_get(list, "models");
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !json_is_array(arr), KILN_ERR_FORMAT,
                  "registry '%s': its list of models is not {\"models\": [...]}",
                  l->regs.c[from].url);
    size_t i;
    json_t *m;
    json_array_foreach(arr, i, m) {
        const char *name = json_string_value(json_object_get(m, "name"));
        KILN_CHECK_IF(rc, out, !name || kiln_registry_check_name("model", name), KILN_ERR_FORMAT,
                      "registry '%s': its list of models holds one without a valid name",
                      l->regs.c[from].url);
        rc = model_json(l, name, models);
        /* Listed, then gone from every registry (a store being replaced): said, not fatal. */
        if (rc == KILN_ERR_NOTFOUND) {
            on_note(l, kiln_errmsg());
            kiln_errclear();
            rc = KILN_OK;
        }
        if (rc) goto out;
    }
out:
    json_decref(list);
    return rc;
}

kiln_err kiln_registry_models(const kiln_registry_client_opts *cs, size_t n,
                              const kiln_registry_models_opts *o, json_t **out) {
    *out = NULL;
    KILN_FAIL_IF(!o, KILN_ERR_USAGE, "listing a registry needs options");
    KILN_FAIL_IF(!cs || !n, KILN_ERR_USAGE, "listing a registry needs a registry URL");
    for (size_t i = 0; i < n; i++)
        KILN_FAIL_IF(!cs[i].url, KILN_ERR_USAGE, "registry %zu of the list is NULL", i + 1);
    if (o->model) KILN_TRY(kiln_registry_check_name("model", o->model));
    KILN_FAIL_IF(o->state && !o->trust, KILN_ERR_USAGE,
                 "a state directory is checked against only with a trust policy");
    KILN_FAIL_IF(o->expiring < 0, KILN_ERR_USAGE, "the expiry window must not be negative");
    lister l;
    memset(&l, 0, sizeof l);
    l.o = o;
    l.now = kiln_unix_time();
    l.notes = json_array();
    l.problems = json_array();
    l.expiring = json_array();
    json_t *root = NULL, *models = json_array(), *urls = json_array();
    kiln_err rc = reg_registries_init(&l.regs, cs, n, on_note, &l);
    if (rc) goto done;
    KILN_CHECK_IF(rc, done, !l.notes || !l.problems || !l.expiring || !models || !urls,
                  KILN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        push(&l, urls, json_string(cs[i].url));
    json_t *tj = json_null();
    if (o->trust) {
        l.state = o->state ? kiln_strdup(o->state) : reg_default_state();
        KILN_CHECK_IF(rc, done, !l.state, KILN_ERR_NOMEM, "out of memory");
        KILN_CHECK_IF(rc, done, kiln_path_dir_state(l.state) == KILN_DIR_OTHER, KILN_ERR_USAGE,
                      "state directory '%s' is not a directory", l.state);
        KILN_CHECK(rc, done, reg_trust_walk_regs(&l.regs, o->trust, l.state, NULL, NULL, &l.t));
        tj = json_pack("{s:s,s:I,s:s}", "file", o->trust, "version",
                       (json_int_t)kiln_sign_trust_version(l.t), "state", l.state);
    }
    root = json_pack("{s:s,s:o,s:s,s:O,s:O,s:o,s:o,s:n,s:O,s:o,s:O,s:O}", "format", MODELS_FORMAT,
                     "checked_at", kiln_time_json(l.now), "registry", cs[0].url, "registries", urls,
                     "failover", l.notes, "model", str_or_null(o->model), "trust", tj, "verified",
                     "problems", l.problems, "expiring_within",
                     o->expiring ? json_integer(o->expiring) : json_null(), "expiring", l.expiring,
                     "models", models);
    KILN_CHECK_IF(rc, done, !root, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, done, list_models(&l, models));
    if (!o->model) {
        /* The datasets (kiln data publish), from the first registry that lists them; a registry
         * from before datasets answers 404: none. */
        json_t *dl = NULL, *ds = NULL;
        for (size_t i = 0; i < n && !ds; i++) {
            if (kiln_registry_get_json(&cs[i], "/v1/datasets", &dl) == KILN_OK)
                ds = json_incref(json_object_get(dl, "datasets"));
            else
                kiln_errclear();
            json_decref(dl);
            dl = NULL;
        }
        set(&l, root, "datasets", json_is_array(ds) ? json_incref(ds) : json_array());
        json_decref(ds);
    }
    /* The registry that answered the listing: the first model's (or the first asked). */
    const json_t *first = json_array_get(models, 0);
    if (first) set(&l, root, "registry", json_incref(json_object_get(first, "registry")));
    size_t nprob = json_array_size(l.problems);
    set(&l, root, "verified", o->trust ? json_boolean(nprob == 0) : json_null());
    KILN_CHECK_IF(rc, done, l.oom, KILN_ERR_NOMEM, "out of memory");
    *out = root;
    root = NULL;
    if (nprob)
        rc = kiln_fail(KILN_ERR_VERIFY, "%zu channel record%s did not verify: %s%s", nprob,
                       nprob == 1 ? "" : "s", json_string_value(json_array_get(l.problems, 0)),
                       nprob > 1 ? "; ..." : "");
done:
    json_decref(root);
    json_decref(models);
    json_decref(urls);
    json_decref(l.notes);
    json_decref(l.problems);
    json_decref(l.expiring);
    kiln_sign_trust_free(l.t);
    reg_registries_release(&l.regs);
    free(l.state);
    return rc;
}

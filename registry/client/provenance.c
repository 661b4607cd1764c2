/* provenance.c - kiln provenance: what a ref resolves to, who put it there, from what and
 * checked how, each fact authenticated under the client's own trust policy (walked as kiln
 * pull walks it) or said to be the registry's word. The answer is one JSON object
 * (kiln-provenance/1, docs/registry.md "Provenance"); the CLI prints it as text or as it is.
 *
 * Nothing is verified a second way here: the channel record goes through sign/'s
 * kiln_sign_record_verify, the archive's signature file through
 * kiln_sign_verify_manifest_sigs (without the archive) and, with download, the archive
 * through the pull itself (reg_pull_with_trust: size, digest, kiln_sign_verify_archive,
 * every file), into a temporary directory that is removed after. The validation report is the
 * registry's copy of validation.json (the version's validation_text), hashed against the
 * signed manifest, or with download the archive's.
 *
 * Over several registries (a primary and its mirrors) the trust walk and the channel's newest
 * record are failover.c's (reg_trust_walk_regs, reg_newest_record: the highest seq that
 * verifies wins), and everything after the record is read from the registry that served it. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "export.h"
#include "sign.h"

#define PROV_FORMAT "kiln-provenance/1"

typedef struct prov {
    reg_registries regs;
    const kiln_registry_client_opts *c; /* the registry that answered: everything is read there */
    const kiln_registry_provenance_opts *o;
    char model[KILN_REGISTRY_NAME_MAX + 1], what[KILN_REGISTRY_NAME_MAX + 1];
    char version[KILN_REGISTRY_NAME_MAX + 1]; /* what the ref resolved to ("": nothing) */
    char *state;
    kiln_sign_trust *t;
    json_t *root, *problems, *walk;
    bool oom;
    int64_t now;
    bool is_version; /* the ref names a version (by the naming rule), not a channel */
    /* The channel record, when the ref is a channel. */
    bool by_channel, rec_ok, rec_signed; /* a record was read; its signatures verified */
    reg_record rec;
    /* The manifest the lineage is read from, and whether it is authenticated. */
    json_t *manifest;
    const char *manifest_status;
    kiln_manifest *man; /* parsed (export/), NULL when it does not parse */
    json_t *card;       /* the card the config is read from */
    const char *card_status;
    char card_how[512];
    json_t *validation;          /* the report: from the verified archive, or the registry's copy */
    const char *validation_from; /* "archive" or "registry" */
    /* The registry's copy of validation.json (the version's validation_text), NULL when it
     * holds none. */
    char *vtext;
    size_t vlen;
    json_t *notes; /* what failing over said, one line each */
} prov;

/* ---- building the answer ---- */

/* Add v (stolen, also on failure) to obj or arr; a failure is remembered as out of memory. */
static void set(prov *p, json_t *obj, const char *key, json_t *v) {
    if (!obj) json_decref(v);
    if (!v || !obj || json_object_set_new(obj, key, v)) p->oom = true;
}

static void push(prov *p, json_t *arr, json_t *v) {
    if (!arr) json_decref(v);
    if (!v || !arr || json_array_append_new(arr, v)) p->oom = true;
}

static json_t *str_or_null(const char *s) {
    return s ? json_string(s) : json_null();
}

/* A new reference to v, or null when v is NULL (a field the document lacks). */
static json_t *copy(const json_t *v) {
    return v ? json_incref((json_t *)v) : json_null();
}

/* A check: {"status", "how"}. status is "verified", "failed", "registry" (the registry's word:
 * nothing signed says it) or "not checked" (would need what is not at hand, said in how). A
 * failed one is also a problem, named by what. */
static json_t *check(prov *p, const char *status, const char *what, const char *fmt, ...)
    KILN_PRINTF(4, 5);
static json_t *check(prov *p, const char *status, const char *what, const char *fmt, ...) {
    char how[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(how, sizeof how, fmt, ap);
    va_end(ap);
    if (!strcmp(status, "failed")) {
        char *msg = kiln_asprintf("%s: %s", what, how);
        push(p, p->problems, msg ? json_string(msg) : NULL);
        free(msg);
    }
    json_t *c = json_pack("{s:s,s:s}", "status", status, "how", how);
    if (!c) p->oom = true;
    return c;
}

static void keyid_of(const uint8_t id[KILN_SIGN_KEYID_BYTES], char out[KILN_SIGN_KEYID_HEX]) {
    kiln_sign_keyid_hex(id, out);
}

static json_t *key_json(const kiln_sign_trust_key *k) {
    char id[KILN_SIGN_KEYID_HEX];
    keyid_of(k->pub.keyid, id);
    return json_pack("{s:s,s:s}", "name", k->name, "keyid", id);
}

/* The keys of t holding role, as [{"name", "keyid"}]. */
static json_t *keys_with(const kiln_sign_trust *t, int role) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < kiln_sign_trust_key_count(t); i++) {
        const kiln_sign_trust_key *k = kiln_sign_trust_key_at(t, i);
        if (k->roles & role && json_array_append_new(a, key_json(k))) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

/* ---- trust ---- */

static void on_step(void *ctx, const kiln_registry_trust_step *s) {
    prov *p = ctx;
    json_t *signers = json_array(), *changes = json_array();
    for (size_t i = 0; s->res && i < s->res->nsigs && i < KILN_SIGN_TRUST_MAX_SIGS; i++) {
        char quorum[64] = "";
        if (s->res->sigs[i].old_root)
            snprintf(quorum, sizeof quorum, "v%llu", (unsigned long long)s->res->from);
        if (s->res->sigs[i].new_root)
            snprintf(quorum + strlen(quorum), sizeof quorum - strlen(quorum), "%sv%llu",
                     *quorum ? " " : "", (unsigned long long)s->res->to);
        push(p, signers,
             json_pack("{s:s,s:s,s:s}", "name", s->res->sigs[i].name, "keyid",
                       s->res->sigs[i].keyid, "quorum", *quorum ? quorum : "not counted"));
    }
    for (const char *l = s->changes ? s->changes : ""; *l;) {
        size_t n = strcspn(l, "\n");
        push(p, changes, json_stringn(l, n));
        l += n + (l[n] == '\n');
    }
    push(p, p->walk,
         json_pack("{s:I,s:s,s:s,s:o,s:o}", "version", (json_int_t)s->version, "from",
                   s->from_state ? "state" : "registry", "source", s->source ? s->source : "",
                   "signed_by", signers ? signers : json_null(), "changes",
                   changes ? changes : json_null()));
}

/* Walk --trust forward as kiln pull does. A walk that fails to verify is a problem, and the
 * rest is checked under what this client held before (the state's versions, else --trust
 * alone); any other failure (an unreadable --trust, a registry that does not answer) ends
 * the command. */
static kiln_err trust_section(prov *p) {
    kiln_sign_trust *file = NULL;
    KILN_TRY(kiln_sign_trust_load(p->o->trust, &file));
    uint64_t file_version = kiln_sign_trust_version(file);
    json_t *tj = json_object(), *chk = NULL;
    set(p, p->root, "trust", tj);
    p->walk = json_array();
    kiln_err rc = reg_trust_walk_regs(&p->regs, p->o->trust, p->state, on_step, p, &p->t);
    if (rc == KILN_ERR_VERIFY || rc == KILN_ERR_FORMAT) {
        char why[1024];
        snprintf(why, sizeof why, "%s", kiln_errmsg());
        json_array_clear(p->walk);
        rc = kiln_registry_trust_walk(NULL, p->o->trust, p->state, on_step, p, &p->t);
        const char *under = "the versions this client accepted before";
        if (rc == KILN_ERR_VERIFY || rc == KILN_ERR_FORMAT) {
            json_array_clear(p->walk);
            p->t = file;
            file = NULL;
            under = "the --trust file alone";
            rc = KILN_OK;
        }
        chk = check(p, "failed", "trust", "%s; the rest is checked under %s", why, under);
    }
    kiln_sign_trust_free(file);
    if (rc) {
        json_decref(chk);
        return rc;
    }
    uint64_t v = kiln_sign_trust_version(p->t);
    size_t steps = json_array_size(p->walk);
    if (!chk)
        chk = steps ? check(p, "verified", "trust",
                            "%zu version%s after it, each signed by the root quorum of the one "
                            "before and its own",
                            steps, steps == 1 ? "" : "s")
                    : check(p, "verified", "trust", "the registry has no newer version");
    set(p, tj, "version", json_integer((json_int_t)v));
    set(p, tj, "file", json_string(p->o->trust));
    set(p, tj, "file_version", json_integer((json_int_t)file_version));
    set(p, tj, "walk", p->walk);
    p->walk = NULL;
    set(p, tj, "root_threshold",
        kiln_sign_trust_role_count(p->t, KILN_SIGN_ROLE_ROOT)
            ? json_integer(kiln_sign_trust_root_threshold(p->t))
            : json_null());
    set(p, tj, "root_keys", keys_with(p->t, KILN_SIGN_ROLE_ROOT));
    set(p, tj, "release_threshold", json_integer(kiln_sign_trust_release_threshold(p->t)));
    set(p, tj, "release_keys", keys_with(p->t, KILN_SIGN_ROLE_RELEASE));
    set(p, tj, "accept_unvalidated", json_boolean(kiln_sign_trust_accepts_unvalidated(p->t)));
    set(p, tj, "check", chk);
    return KILN_OK;
}

/* ---- channel records ---- */

/* Each signature of a record as this policy sees it: [{"keyid", "name" (null: not in the
 * policy), "status": "verified" | "bad" (a promote key of the policy whose signature does not
 * verify: the record was altered) | "not in policy" | "not a promote key" | "unreadable"}].
 * *good counts the distinct promote keys whose signatures verify, *bad the others that fail.
 * Display and the history's verdicts; the current record's verdict is
 * kiln_sign_record_verify's. */
static json_t *record_sigs(const kiln_sign_trust *t, const kiln_sign_record *r, size_t *good,
                           size_t *bad) {
    *good = *bad = 0;
    char *body = NULL;
    size_t blen = 0;
    json_t *a = json_array();
    if (!a || kiln_sign_record_body(r, &body, &blen)) {
        json_decref(a);
        return NULL;
    }
    const kiln_sign_trust_key *seen[KILN_SIGN_RECORD_MAX_SIGS];
    for (size_t i = 0; i < r->nsigs && i < KILN_SIGN_RECORD_MAX_SIGS; i++) {
        kiln_sign_sig s;
        kiln_sign_sig_init(&s);
        const char *status = "unreadable";
        char id[KILN_SIGN_KEYID_HEX] = "";
        const kiln_sign_trust_key *k = NULL;
        if (kiln_sign_sig_parse(r->sigs[i], strlen(r->sigs[i]), "record signature", &s) ==
            KILN_OK) {
            keyid_of(s.keyid, id);
            k = kiln_sign_trust_find(t, s.keyid);
            if (!k)
                status = "not in policy";
            else if (!(k->roles & KILN_SIGN_ROLE_PROMOTE))
                status = "not a promote key";
            else if (kiln_sign_verify_buffer(&k->pub, &s, body, blen, "the record body") == KILN_OK)
                status = "verified";
            else
                status = "bad";
        }
        kiln_sign_sig_release(&s);
        if (!strcmp(status, "verified")) {
            bool dup = false;
            for (size_t j = 0; j < *good; j++)
                dup = dup || seen[j] == k;
            if (!dup) seen[(*good)++] = k;
        } else if (!strcmp(status, "bad") || !strcmp(status, "unreadable")) {
            (*bad)++;
        }
        json_t *e = json_pack("{s:s,s:o,s:s}", "keyid", id, "name", str_or_null(k ? k->name : NULL),
                              "status", status);
        if (!e || json_array_append_new(a, e)) {
            json_decref(a);
            a = NULL;
            break;
        }
    }
    kiln_errclear();
    free(body);
    return a;
}

static void ago(int64_t secs, char *out, size_t n) {
    int64_t a = secs < 0 ? -secs : secs;
    if (a >= 2 * 86400)
        snprintf(out, n, "%lld d", (long long)(a / 86400));
    else if (a >= 2 * 3600)
        snprintf(out, n, "%lld h", (long long)(a / 3600));
    else
        snprintf(out, n, "%lld min", (long long)(a / 60));
}

/* The order the registry's versions were published in (GET /v1/models/MODEL), for telling a
 * rollback (a record whose version was published before the one it replaces) from a
 * promotion. The registry's word, used for the label only. */
static long published_index(const json_t *model, const char *version) {
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(model, "versions"), i, v) {
        const char *s = json_string_value(json_object_get(v, "version"));
        if (s && version && !strcmp(s, version)) return (long)i;
    }
    return -1;
}

/* The channel's records before the current one, oldest first, each verified under the policy
 * as far as it can be: signed by keys the policy has since dropped is "not checked", a
 * signature that fails by a key it has is "failed" (the record was altered). */
static kiln_err history(prov *p, json_t *cj) {
    char *path = kiln_asprintf("/v1/models/%s/channels/%s/history", p->model, p->what),
         *mpath = kiln_asprintf("/v1/models/%s", p->model);
    if (!path || !mpath) {
        free(path), free(mpath);
        return KILN_ERR_NOMEM;
    }
    json_t *h = NULL, *m = NULL;
    kiln_err rc = kiln_registry_get_json(p->c, path, &h);
    if (!rc) rc = kiln_registry_get_json(p->c, mpath, &m);
    free(path), free(mpath);
    if (rc) {
        json_decref(h);
        return rc;
    }
    json_t *arr = json_array(), *x;
    size_t i;
    const char *prev = NULL;
    json_array_foreach(json_object_get(h, "records"), i, x) {
        /* The stored bytes when the registry sends them ("text"), else the record it parsed:
         * signatures are over the canonical body either way. */
        const char *text = json_string_value(json_object_get(x, "text"));
        char *canon = text ? NULL : kiln_json_canonical(json_object_get(x, "record"));
        kiln_errclear();
        kiln_sign_record r;
        kiln_sign_record_init(&r);
        char label[200];
        snprintf(label, sizeof label, "record %zu of %s@%s's history", i + 1, p->model, p->what);
        kiln_err prc = text || canon
                           ? kiln_sign_record_parse(text ? text : canon,
                                                    strlen(text ? text : canon), label, &r)
                           : KILN_ERR_FORMAT;
        const char *put_by = json_string_value(json_object_get(x, "publisher")),
                   *put_at = json_string_value(json_object_get(x, "created"));
        long pi = prc ? -1 : published_index(m, r.version), pp = published_index(m, prev);
        const char *change = prc                        ? NULL
                             : !prev                    ? "first"
                             : !strcmp(prev, r.version) ? "renew"
                             : pi >= 0 && pi < pp       ? "rollback"
                                                        : "promote";
        if (!prc && p->rec_ok && r.seq == (uint64_t)p->rec.seq) {
            /* The current record: what it changed, who put it and when (the registry's
             * word). */
            set(p, cj, "change", json_string(change));
            set(p, cj, "from", str_or_null(!strcmp(change, "first") ? NULL : prev));
            set(p, cj, "put_by", str_or_null(put_by));
            set(p, cj, "put_at", str_or_null(put_at));
            set(p, cj, "put_check",
                check(p, "registry", "channel",
                      "the registry's record of the token that put it (not signed)"));
        }
        if (!prc && p->rec_ok && r.seq >= (uint64_t)p->rec.seq) {
            kiln_sign_record_release(&r);
            free(canon);
            continue;
        }
        json_t *e = json_object();
        push(p, arr, e);
        if (prc) {
            set(p, e, "seq", json_null());
            set(p, e, "check", check(p, "failed", "channel history", "%s", kiln_errmsg()));
            free(canon);
            continue;
        }
        size_t good = 0, bad = 0;
        json_t *sigs = record_sigs(p->t, &r, &good, &bad);
        int threshold = 0;
        bool known = kiln_sign_trust_threshold(p->t, r.channel, &threshold) == KILN_OK;
        char hex[KILN_SHA256_HEX];
        kiln_hex(r.digest, 32, hex);
        char *digest = kiln_asprintf("sha256:%s", hex);
        set(p, e, "seq", json_integer((json_int_t)r.seq));
        set(p, e, "version", json_string(r.version));
        set(p, e, "digest", str_or_null(digest));
        set(p, e, "reason", json_string(r.reason ? r.reason : ""));
        set(p, e, "change", json_string(change));
        set(p, e, "from", str_or_null(!strcmp(change, "first") ? NULL : prev));
        set(p, e, "expires", kiln_time_json(r.expires));
        set(p, e, "signatures", sigs);
        set(p, e, "put_by", str_or_null(put_by));
        set(p, e, "put_at", str_or_null(put_at));
        char seq[32];
        snprintf(seq, sizeof seq, "channel history seq %llu", (unsigned long long)r.seq);
        if (strcmp(r.model, p->model) || strcmp(r.channel, p->what))
            set(p, e, "check",
                check(p, "failed", seq, "the record names %s@%s", r.model, r.channel));
        else if (bad)
            set(p, e, "check",
                check(p, "failed", seq,
                      "%zu signature%s by a key of trust policy v%llu do%s not verify over the "
                      "record (altered)",
                      bad, bad == 1 ? "" : "s", (unsigned long long)kiln_sign_trust_version(p->t),
                      bad == 1 ? "es" : ""));
        else if (known && good >= (size_t)threshold)
            set(p, e, "check",
                check(p, "verified", seq, "%zu of %d promote key%s of trust policy v%llu", good,
                      threshold, threshold == 1 ? "" : "s",
                      (unsigned long long)kiln_sign_trust_version(p->t)));
        else
            set(p, e, "check",
                check(p, "not checked", seq,
                      "%zu verifying signature%s by promote keys of trust policy v%llu, which "
                      "needs %d; the other signers are not in it (keys revoked or rotated since)",
                      good, good == 1 ? "" : "s", (unsigned long long)kiln_sign_trust_version(p->t),
                      threshold));
        free(digest);
        prev = json_string_value(json_object_get(e, "version"));
        kiln_sign_record_release(&r);
        free(canon);
    }
    set(p, cj, "history", arr);
    json_decref(h);
    json_decref(m);
    return KILN_OK;
}

/* The current record of the channel (text): its fields, its signatures under the policy, the
 * seq this client accepted before, its expiry; then the records before it. */
static kiln_err channel_section(prov *p, const char *text, size_t len) {
    json_t *cj = json_object();
    set(p, p->root, "channel", cj);
    set(p, cj, "name", json_string(p->what));
    char label[200];
    snprintf(label, sizeof label, "channel record %s@%s", p->model, p->what);
    kiln_sign_record r;
    kiln_sign_record_init(&r);
    kiln_err rc = kiln_sign_record_parse(text, len, label, &r);
    if (rc == KILN_ERR_NOMEM) return rc;
    if (rc) {
        set(p, cj, "check", check(p, "failed", "channel", "%s", kiln_errmsg()));
        kiln_sign_record_release(&r);
        return KILN_OK; /* nothing names a version to go on with */
    }
    if (strlen(r.model) > KILN_REGISTRY_NAME_MAX || strlen(r.channel) > KILN_REGISTRY_NAME_MAX ||
        strlen(r.version) > KILN_REGISTRY_NAME_MAX) {
        set(p, cj, "check",
            check(p, "failed", "channel", "%s: a name is out of the registry's range", label));
        kiln_sign_record_release(&r);
        return KILN_OK;
    }
    char hex[KILN_SHA256_HEX];
    kiln_hex(r.digest, 32, hex);
    snprintf(p->rec.digest, sizeof p->rec.digest, "sha256:%s", hex);
    snprintf(p->rec.version, sizeof p->rec.version, "%.*s", KILN_REGISTRY_NAME_MAX, r.version);
    snprintf(p->rec.model, sizeof p->rec.model, "%.*s", KILN_REGISTRY_NAME_MAX, r.model);
    snprintf(p->rec.channel, sizeof p->rec.channel, "%.*s", KILN_REGISTRY_NAME_MAX, r.channel);
    snprintf(p->rec.reason, sizeof p->rec.reason, "%s", r.reason ? r.reason : "");
    p->rec.seq = (int64_t)r.seq;
    p->rec.expires = r.expires;
    p->rec_ok = true; /* parsed: its fields are shown, verified or not */
    snprintf(p->version, sizeof p->version, "%s", p->rec.version);
    set(p, cj, "seq", json_integer((json_int_t)r.seq));
    set(p, cj, "version", json_string(r.version));
    set(p, cj, "digest", json_string(p->rec.digest));
    set(p, cj, "expires", kiln_time_json(r.expires));
    set(p, cj, "expired", json_boolean(r.expires <= p->now));
    set(p, cj, "reason", json_string(p->rec.reason));
    /* Filled from the history below; here so that the keys keep one order. */
    set(p, cj, "change", json_null());
    set(p, cj, "from", json_null());
    size_t good, bad;
    set(p, cj, "signatures", record_sigs(p->t, &r, &good, &bad));
    /* The verdict: sign/'s (now 0 and min_seq 0: expiry and seq are checked below, each on
     * its own, so that an expired record is shown and flagged rather than refused). */
    kiln_sign_record_result res;
    rc = kiln_sign_record_verify(&r, p->t, 0, 0, label, &res);
    if (rc == KILN_ERR_NOMEM) goto out;
    json_t *signers = json_array();
    for (size_t i = 0; !rc && i < res.nsigners; i++)
        push(p, signers, key_json(res.signers[i]));
    set(p, cj, "signers", signers);
    set(p, cj, "threshold", res.threshold ? json_integer(res.threshold) : json_null());
    if (rc)
        set(p, cj, "check",
            check(p, "failed", "channel record",
                  "%s (under trust policy v%llu; the record is shown as the registry holds it)",
                  kiln_errmsg(), (unsigned long long)kiln_sign_trust_version(p->t)));
    else if (strcmp(r.model, p->model) || strcmp(r.channel, p->what))
        set(p, cj, "check",
            check(p, "failed", "channel record", "%s names %s@%s instead", label, r.model,
                  r.channel));
    else
        set(p, cj, "check",
            check(p, "verified", "channel record", "%zu of %d promote key%s of trust policy v%llu",
                  res.nsigners, res.threshold, res.threshold == 1 ? "" : "s",
                  (unsigned long long)kiln_sign_trust_version(p->t)));
    p->rec_signed = !rc && !strcmp(r.model, p->model) && !strcmp(r.channel, p->what);
    rc = KILN_OK;
    int64_t last;
    bool known;
    char err[1024];
    kiln_err src = reg_channel_state(p->state, p->model, p->what, &last, &known);
    if (src == KILN_ERR_NOMEM) {
        rc = src;
        goto out;
    }
    snprintf(err, sizeof err, "%s", src ? kiln_errmsg() : "");
    set(p, cj, "accepted_before", known ? json_integer(last) : json_null());
    if (src)
        set(p, cj, "seq_check", check(p, "failed", "channel seq", "%s", err));
    else if (known && (int64_t)r.seq < last)
        set(p, cj, "seq_check",
            check(p, "failed", "channel seq",
                  "seq %llu is lower than %lld, the last this client accepted ('%s'): a "
                  "replayed or rolled-back record",
                  (unsigned long long)r.seq, (long long)last, p->state));
    else if (known)
        set(p, cj, "seq_check",
            check(p, "verified", "channel seq", "not below %lld, the last this client accepted",
                  (long long)last));
    else
        set(p, cj, "seq_check",
            check(p, "not checked", "channel seq",
                  "this client ('%s') accepted no record of the channel before", p->state));
    char when[21], rel[32];
    kiln_format_time(r.expires, when);
    ago(r.expires - p->now, rel, sizeof rel);
    if (r.expires <= p->now)
        set(p, cj, "expiry_check",
            check(p, "failed", "channel record", "expired at %s, %s ago: kiln pull refuses it",
                  when, rel));
    else
        set(p, cj, "expiry_check", check(p, "verified", "channel record", "in %s", rel));
    set(p, cj, "put_by", json_null());
    set(p, cj, "put_at", json_null());
    set(p, cj, "put_check", json_null());
    rc = history(p, cj);
out:
    kiln_sign_record_release(&r);
    return rc;
}

/* ---- the archive ---- */

/* The signature file's blocks as they are, for display: [{"name" (null: not in the policy),
 * "keyid", "manifest" (the sha256 its comment names), "validation"}]. *named gets the first
 * comment's manifest sha256 ("" when none parses). */
static json_t *sig_blocks(const kiln_sign_trust *t, const char *text, char named[KILN_SHA256_HEX]) {
    named[0] = 0;
    kiln_sign_sig *sigs = NULL;
    size_t n = 0;
    json_t *a = json_array();
    if (!a) return NULL;
    if (text &&
        kiln_sign_archive_sigs_parse(text, strlen(text), "signature", &sigs, &n) == KILN_OK) {
        for (size_t i = 0; i < n; i++) {
            char id[KILN_SIGN_KEYID_HEX], mh[KILN_SHA256_HEX] = "";
            keyid_of(sigs[i].keyid, id);
            const kiln_sign_trust_key *k = kiln_sign_trust_find(t, sigs[i].keyid);
            kiln_sign_archive_info info;
            bool ok = kiln_sign_archive_comment_parse(sigs[i].trusted_comment, "comment", &info) ==
                      KILN_OK;
            if (ok) kiln_hex(info.manifest_sha256, 32, mh);
            if (ok && !named[0]) snprintf(named, KILN_SHA256_HEX, "%s", mh);
            if (json_array_append_new(
                    a, json_pack(
                           "{s:o,s:s,s:o,s:o}", "name", str_or_null(k ? k->name : NULL), "keyid",
                           id, "manifest", str_or_null(ok ? mh : NULL), "validation",
                           str_or_null(ok ? kiln_sign_validation_name(info.validation) : NULL)))) {
                json_decref(a);
                a = NULL;
                break;
            }
        }
    }
    kiln_sign_archive_sigs_free(sigs, n);
    kiln_errclear();
    return a;
}

/* A small JSON file of a verified directory; NULL (no error) when it is not there. */
static kiln_err load_if(const char *dir, const char *name, json_t **out, char **text, size_t *len) {
    *out = NULL;
    char *path = kiln_path_join(dir, name);
    if (!path) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    if (kiln_path_exists(path)) {
        char *buf = NULL;
        size_t n = 0;
        rc = kiln_read_file(path, 64u << 20, &buf, &n);
        if (!rc) rc = kiln_json_parse(buf, n, path, out);
        if (!rc && text) {
            *text = buf;
            *len = n;
            buf = NULL;
        }
        free(buf);
    }
    free(path);
    return rc;
}

/* --download: the pull itself, by version, under the policy walked already, into a temporary
 * directory under STATE/downloads that is removed after; card.json, validation.json and the
 * manifest are then read from the verified files. */
static kiln_err download(prov *p, json_t *aj, const json_t *reg_card) {
    json_t *dj = json_object();
    set(p, aj, "download", dj);
    char *dl = kiln_path_join(p->state, "downloads"), *tmp = NULL, *out = NULL, *mtext = NULL,
         *vtext = NULL;
    size_t mlen = 0, vlen = 0;
    kiln_err rc = KILN_OK;
    json_t *manifest = NULL, *card = NULL, *val = NULL;
    KILN_CHECK_IF(rc, done, !dl, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, done, kiln_mkdir_p(dl));
    tmp = kiln_asprintf("%s/.provenance-XXXXXX", dl);
    KILN_CHECK_IF(rc, done, !tmp, KILN_ERR_NOMEM, "out of memory");
    if (!mkdtemp(tmp)) {
        rc = kiln_fail_errno(KILN_ERR_IO, "cannot create a temporary directory in '%s'", dl);
        free(tmp);
        tmp = NULL;
        goto done;
    }
    out = kiln_path_join(tmp, "model");
    KILN_CHECK_IF(rc, done, !out, KILN_ERR_NOMEM, "out of memory");
    char ref[2 * KILN_REGISTRY_NAME_MAX + 2];
    snprintf(ref, sizeof ref, "%s@%s", p->model, p->version);
    kiln_registry_pull_opts po = {
        .ref = ref, .trust = p->o->trust, .out = out, .state = p->state, .exact_version = true};
    kiln_registry_pulled res;
    rc = reg_pull_with_trust(p->c, &po, p->t, &res);
    if (rc == KILN_ERR_VERIFY || rc == KILN_ERR_FORMAT) {
        set(p, dj, "check", check(p, "failed", "download", "%s", kiln_errmsg()));
        rc = KILN_OK;
        goto done;
    }
    if (rc) goto done;
    KILN_CHECK(rc, done, load_if(out, "manifest.json", &manifest, &mtext, &mlen));
    KILN_CHECK(rc, done, load_if(out, "card.json", &card, NULL, NULL));
    KILN_CHECK(rc, done, load_if(out, "validation.json", &val, &vtext, &vlen));
    size_t nfiles = json_array_size(json_object_get(manifest, "files"));
    if (p->by_channel && p->rec_signed && strcmp(res.digest, p->rec.digest)) {
        set(p, dj, "check",
            check(p, "failed", "download",
                  "the archive downloaded is %s, the signed record names %s", res.digest,
                  p->rec.digest));
        goto done;
    }
    set(p, dj, "signed_by", json_string(res.signed_by));
    set(p, dj, "check",
        check(p, "verified", "download",
              "downloaded into '%s' and removed after: size and sha256 %s, every signature over "
              "the archive's bytes (%s), every file against the signed manifest (%zu files)",
              dl, res.digest, res.signed_by, nfiles));
    /* What the registry serves beside the archive must be what the archive holds. */
    if (reg_card && card && !json_equal((json_t *)reg_card, card))
        set(p, dj, "card_check",
            check(p, "failed", "card", "the registry's card.json is not the archive's"));
    if (p->vtext && (!vtext || vlen != p->vlen || memcmp(vtext, p->vtext, vlen)))
        set(p, dj, "validation_text_check",
            check(p, "failed", "validation report",
                  "the registry's copy of validation.json is not the archive's"));
    json_decref(p->manifest);
    p->manifest = manifest;
    manifest = NULL;
    p->manifest_status = "verified";
    kiln_manifest_free(p->man);
    p->man = NULL;
    if (kiln_manifest_parse(mtext, mlen, "manifest.json", &p->man)) kiln_errclear();
    json_decref(p->card);
    p->card = card;
    card = NULL;
    p->card_status = "verified";
    snprintf(p->card_how, sizeof p->card_how,
             "card.json of the downloaded archive, checked against the signed manifest");
    p->validation = val;
    p->validation_from = val ? "archive" : NULL;
    val = NULL;
done:
    if (tmp) reg_rmtree(tmp);
    json_decref(manifest);
    json_decref(card);
    json_decref(val);
    free(mtext);
    free(vtext);
    free(dl);
    free(tmp);
    free(out);
    return rc;
}

/* What failing over says (failover.c's notes, and the version's search below). */
static void on_note(void *ctx, const char *line) {
    prov *p = ctx;
    push(p, p->notes, json_string(line));
}

/* The version's JSON: from the registry that served the channel record, or (by version, over
 * several registries) from the first that holds it, which then answers for the rest. */
static kiln_err fetch_version(prov *p, json_t **ver) {
    *ver = NULL;
    char *vpath = kiln_asprintf("/v1/models/%s/versions/%s", p->model, p->version);
    if (!vpath) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    if (p->by_channel || p->regs.n == 1) {
        rc = kiln_registry_get_json(p->c, vpath, ver);
        free(vpath);
        return rc;
    }
    char what[200];
    snprintf(what, sizeof what, "%s@%s", p->model, p->version);
    size_t from = 0;
    rc = reg_get_json_first(&p->regs, vpath, what, ver, &from);
    if (!rc) p->c = &p->regs.c[from];
    free(vpath);
    return rc;
}

/* The registry's word on the archive: its digest and size, who published it and when, and its
 * copy of validation.json (the exact bytes, checked below); the digest checked against the
 * signed channel record, and against the policy's withdrawals whatever named it. */
static kiln_err archive_facts(prov *p, json_t *aj, const json_t *ver) {
    const char *digest = json_string_value(json_object_get(ver, "digest"));
    json_t *size = json_object_get(ver, "size");
    const json_t *vt = json_object_get(ver, "validation_text");
    if (json_is_string(vt)) {
        p->vlen = json_string_length(vt);
        p->vtext = kiln_malloc(p->vlen + 1);
        if (!p->vtext) return KILN_ERR_NOMEM;
        memcpy(p->vtext, json_string_value(vt), p->vlen);
        p->vtext[p->vlen] = 0;
    }
    set(p, aj, "digest", str_or_null(digest));
    set(p, aj, "size", json_is_integer(size) ? json_incref(size) : json_null());
    set(p, aj, "published_by", copy(json_object_get(ver, "publisher")));
    set(p, aj, "published_at", copy(json_object_get(ver, "created")));
    set(p, aj, "publish_check",
        check(p, "registry", "archive",
              "the registry's record of the token that published it (not signed)"));
    if (!p->by_channel)
        set(p, aj, "digest_check",
            check(p, "registry", "archive digest",
                  "no signed record names it; --download hashes the archive"));
    else if (!p->rec_signed)
        set(p, aj, "digest_check",
            check(p, "not checked", "archive digest", "the channel record did not verify"));
    else if (!digest || strcmp(digest, p->rec.digest))
        set(p, aj, "digest_check",
            check(p, "failed", "archive digest",
                  "the registry holds %s@%s as %s, the signed channel record names %s", p->model,
                  p->version, digest ? digest : "nothing", p->rec.digest));
    else
        set(p, aj, "digest_check",
            check(p, "verified", "archive digest", "the signed channel record names it"));
    /* Whatever named it: an archive the policy withdrew is a failed fact. */
    const char *why = digest && p->t ? kiln_sign_trust_withdrawn(p->t, digest) : NULL;
    if (why)
        set(p, aj, "withdrawn_check",
            check(p, "failed", "withdrawn", "trust policy version %llu withdrew %s: %s",
                  (unsigned long long)kiln_sign_trust_version(p->t), digest, why));
    return KILN_OK;
}

/* The registry's manifest (canonical, as the archive holds it) checked without the archive:
 * its sha256 against what the release signatures' trusted comments name, the signature
 * blocks, who signed, the verdict they name. Sets what the lineage and config are read from
 * (p->manifest, p->man). */
static kiln_err archive_manifest(prov *p, json_t *aj, const json_t *ver) {
    const char *sig = json_string_value(json_object_get(ver, "signature"));
    const json_t *manifest = json_object_get(ver, "manifest");
    char *mtext = manifest ? kiln_json_canonical(manifest) : NULL, label[200];
    kiln_errclear();
    char mhex[KILN_SHA256_HEX] = "", named[KILN_SHA256_HEX];
    if (mtext) {
        uint8_t h[KILN_SHA256_BYTES];
        kiln_sha256(mtext, strlen(mtext), h);
        kiln_hex(h, sizeof h, mhex);
    }
    set(p, aj, "manifest_sha256", str_or_null(mtext ? mhex : NULL));
    json_t *blocks = sig_blocks(p->t, sig, named);
    snprintf(label, sizeof label, "the registry's manifest of %s@%s", p->model, p->version);
    kiln_sign_archive_report rep;
    memset(&rep, 0, sizeof rep);
    kiln_err vrc = !sig     ? kiln_fail(KILN_ERR_VERIFY, "the registry holds no signature for it")
                   : !mtext ? kiln_fail(KILN_ERR_VERIFY, "the registry holds no manifest for it")
                            : kiln_sign_verify_manifest_sigs(mtext, strlen(mtext), label, sig,
                                                             strlen(sig), "signature", p->t, &rep);
    if (vrc == KILN_ERR_NOMEM) {
        json_decref(blocks);
        free(mtext);
        return vrc;
    }
    char vmsg[1024];
    snprintf(vmsg, sizeof vmsg, "%s", vrc ? kiln_errmsg() : "");
    if (!vrc && (strcmp(rep.info.model, p->model) || strcmp(rep.info.version, p->version)))
        vrc = KILN_ERR_VERIFY, snprintf(vmsg, sizeof vmsg, "the signed manifest is %s@%s",
                                        rep.info.model, rep.info.version);
    if (mtext && named[0] && strcmp(named, mhex))
        set(p, aj, "manifest_check",
            check(p, "failed", "manifest",
                  "the registry's manifest hashes to sha256:%s, the signed comment names "
                  "sha256:%s",
                  mhex, named));
    else if (vrc)
        set(p, aj, "manifest_check",
            check(p, "not checked", "manifest", "the signatures naming it did not verify"));
    else
        set(p, aj, "manifest_check",
            check(p, "verified", "manifest",
                  "its sha256 is what the release signatures' trusted comments name"));
    set(p, aj, "signatures", blocks);
    json_t *signers = json_array();
    for (size_t i = 0; !vrc && i < rep.nsigners; i++)
        push(p, signers, key_json(rep.signers[i]));
    set(p, aj, "signers", signers);
    set(p, aj, "release_threshold", json_integer(kiln_sign_trust_release_threshold(p->t)));
    set(p, aj, "verdict",
        vrc ? json_null() : json_string(kiln_sign_validation_name(rep.info.validation)));
    set(p, aj, "allow_unvalidated", vrc ? json_null() : json_boolean(rep.info.allow_unvalidated));
    if (vrc)
        set(p, aj, "signature_check", check(p, "failed", "archive signature", "%s", vmsg));
    else
        set(p, aj, "signature_check",
            check(p, "verified", "archive signature",
                  "%zu of %d release key%s of trust policy v%llu signed a trusted comment naming "
                  "this manifest; signature checked over the comment; archive bytes not "
                  "downloaded%s",
                  rep.nsigners, rep.threshold, rep.threshold == 1 ? "" : "s",
                  (unsigned long long)kiln_sign_trust_version(p->t),
                  p->o->download ? " for this check (the download below checks them)"
                                 : ": use --download"));
    /* What the lineage and config are read from until a download replaces them. */
    p->manifest = manifest ? json_incref((json_t *)manifest) : NULL;
    p->manifest_status = !vrc && !(named[0] && strcmp(named, mhex)) ? "verified" : "failed";
    if (mtext && kiln_manifest_parse(mtext, strlen(mtext), label, &p->man)) kiln_errclear();
    free(mtext);
    return KILN_OK;
}

/* The registry's card.json checked against the signed manifest's entry: kiln writes cards
 * one way, so the card the registry returns, written out again, reproduces the signed bytes
 * when it is the signed card. */
static kiln_err archive_card(prov *p, const json_t *ver) {
    const json_t *card = json_object_get(ver, "card");
    p->card = json_is_object(card) ? json_incref((json_t *)card) : NULL;
    const kiln_manifest_file *cf = p->man ? kiln_manifest_find(p->man, "card.json") : NULL;
    size_t dlen = 0;
    char *doc = p->card ? kiln_json_document(p->card, &dlen) : NULL;
    if (!p->card) {
        p->card_status = "failed";
        snprintf(p->card_how, sizeof p->card_how, "the registry holds no card for it");
    } else if (!doc) {
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    } else if (!cf || strcmp(p->manifest_status, "verified")) {
        p->card_status = "not checked";
        snprintf(p->card_how, sizeof p->card_how, "the manifest did not verify");
    } else {
        uint8_t h[KILN_SHA256_BYTES];
        char hex[KILN_SHA256_HEX], want[KILN_SHA256_HEX];
        kiln_sha256(doc, dlen, h);
        kiln_hex(h, sizeof h, hex);
        kiln_hex(cf->sha256, KILN_SHA256_BYTES, want);
        bool same = !strcmp(hex, want) && dlen == cf->size;
        p->card_status = same ? "verified" : "failed";
        if (same)
            snprintf(p->card_how, sizeof p->card_how,
                     "card.json as the registry returns it, written out as kiln writes cards, "
                     "hashes to the signed manifest's sha256:%.12s…",
                     want);
        else
            snprintf(p->card_how, sizeof p->card_how,
                     "the registry's card.json does not reproduce the signed manifest's "
                     "sha256:%.12s… (altered, or a card not written by kiln): --download reads "
                     "the signed bytes",
                     want);
    }
    free(doc);
    return KILN_OK;
}

/* --download: the archive's own bytes checked too; by version, that verifies its digest. */
static kiln_err archive_download(prov *p, json_t *aj) {
    KILN_TRY(download(p, aj, p->card));
    if (!p->by_channel &&
        !strcmp(json_string_value(json_object_get(
                    json_object_get(json_object_get(aj, "download"), "check"), "status")),
                "verified"))
        set(p, aj, "digest_check",
            check(p, "verified", "archive digest",
                  "the downloaded archive hashes to it and the release signatures verify over "
                  "its bytes"));
    return KILN_OK;
}

/* "archive": the version as the registry holds it, each fact with how it was checked. */
static kiln_err archive_section(prov *p) {
    json_t *aj = json_object(), *ver = NULL;
    set(p, p->root, "archive", aj);
    kiln_err rc = fetch_version(p, &ver);
    if (rc == KILN_ERR_NOTFOUND && p->by_channel) {
        set(p, aj, "check",
            check(p, "failed", "archive",
                  "the registry does not hold %s@%s, which the channel record names", p->model,
                  p->version));
        return KILN_OK;
    }
    if (rc) return rc;
    rc = archive_facts(p, aj, ver);
    if (!rc) rc = archive_manifest(p, aj, ver);
    if (!rc) rc = archive_card(p, ver);
    if (!rc && p->o->download) rc = archive_download(p, aj);
    json_decref(ver);
    return rc;
}

/* ---- lineage and validation ---- */

static void lineage_section(prov *p) {
    json_t *lj = json_object();
    set(p, p->root, "lineage", lj);
    const json_t *lin = json_object_get(p->manifest, "lineage");
    const json_t *ck = json_object_get(lin, "checkpoint");
    set(p, lj, "run_id", copy(json_object_get(lin, "run_id")));
    set(p, lj, "step", copy(json_object_get(lin, "step")));
    set(p, lj, "created", copy(json_object_get(p->manifest, "created")));
    set(p, lj, "dataset_sha256", copy(json_object_get(lin, "dataset_sha256")));
    /* A card records the dataset's digest, not its path; the validation report names the
     * file validated on. */
    set(p, lj, "dataset_path", copy(json_object_get(lin, "dataset_path")));
    set(p, lj, "code_version", copy(json_object_get(lin, "code_version")));
    set(p, lj, "checkpoint", copy(ck));
    set(p, lj, "metrics", copy(json_object_get(lin, "metrics")));
    if (!p->manifest)
        set(p, lj, "check", check(p, "failed", "lineage", "the registry holds no manifest"));
    else if (!strcmp(p->manifest_status, "verified"))
        set(p, lj, "check",
            check(p, "verified", "lineage",
                  "from the signed manifest, which holds the card's created and lineage"));
    else
        set(p, lj, "check",
            check(p, "failed", "lineage",
                  "from a manifest that did not verify: the registry's word only"));
    set(p, lj, "config", copy(json_object_get(p->card, "config")));
    set(p, lj, "dtype", copy(json_object_get(p->card, "dtype")));
    set(p, lj, "config_check",
        check(p, p->card_status ? p->card_status : "failed", "card", "%s",
              p->card_how[0] ? p->card_how : "no card"));
}

/* The version's reproduction records (kiln reproduce --sign), each verified under the policy:
 * who signed, the verdict, where and when, and with which kiln. One that does not verify is
 * shown "not verified" with why; the channel's reproduced_by, when it has one, is checked as a
 * pull checks it (a failed check). */
static kiln_err reproductions_section(prov *p) {
    const char *digest =
        json_string_value(json_object_get(json_object_get(p->root, "archive"), "digest"));
    if (!digest) return KILN_OK;
    char *path = kiln_asprintf("/v1/models/%s/versions/%s/reproductions", p->model, p->version);
    if (!path) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    json_t *j = NULL;
    kiln_err rc = kiln_registry_get_json(p->c, path, &j);
    free(path);
    /* A registry from before the records, or an OCI registry, which keeps none (a channel
     * that requires them then fails below, as a pull through it does). */
    if (rc == KILN_ERR_NOTFOUND || (rc == KILN_ERR_UNSUPPORTED && reg_oci_url(p->c->url))) {
        kiln_errclear();
        rc = KILN_OK;
    }
    if (rc) return rc;
    json_t *arr = json_array();
    set(p, p->root, "reproductions", arr);
    size_t i;
    json_t *doc;
    json_array_foreach(json_object_get(j, "reproductions"), i, doc) {
        const char *text = json_string_value(json_object_get(doc, "record")),
                   *sig = json_string_value(json_object_get(doc, "signature"));
        const kiln_sign_trust_key *k = NULL;
        bool same = false;
        json_t *e = json_object(), *rec = NULL;
        push(p, arr, e);
        if (!text || !sig ||
            reg_repro_verify(p->t, text, sig, "reproduction record", p->model, p->version,
                             digest, &k, &same) != KILN_OK) {
            set(p, e, "check",
                check(p, "not verified", "reproduction record", "%s",
                      text && sig ? kiln_errmsg() : "the registry's entry has no record"));
            kiln_errclear();
            continue;
        }
        if (kiln_json_parse(text, strlen(text), "reproduction record", &rec) != KILN_OK) {
            kiln_errclear();
            continue;
        }
        set(p, e, "signer", json_string(k->name));
        set(p, e, "verdict", copy(json_object_get(rec, "verdict")));
        set(p, e, "host", copy(json_object_get(rec, "host")));
        set(p, e, "time", copy(json_object_get(rec, "time")));
        set(p, e, "code_version", copy(json_object_get(rec, "code_version")));
        set(p, e, "check", check(p, "verified", "reproduction record", "signed by %s", k->name));
        json_decref(rec);
    }
    if (p->by_channel) {
        kiln_err need = reg_repro_required(p->t, p->what, json_object_get(j, "reproductions"),
                                           p->model, p->version, digest, "reproduced_by");
        if (need) {
            set(p, p->root, "reproduced_by",
                check(p, "failed", "reproduced_by", "%s", kiln_errmsg()));
            kiln_errclear();
        }
    }
    json_decref(j);
    return KILN_OK;
}

/* One check of a report in short, what was measured against which threshold as the report
 * has it (docs/validation.md): a comparison's share of outputs outside tolerance against
 * max_outside, with its max relative error and rtol; baseline_loss's held-out loss against
 * its limit. */
static json_t *check_row(const char *name, const json_t *c) {
    const json_t *f = json_object_get(c, "figures"), *t = json_object_get(c, "thresholds");
    const char *measure = NULL;
    const json_t *value = NULL, *thr = NULL, *rel = NULL, *rtol = NULL;
    if (json_object_get(f, "frac_outside") && json_object_get(t, "max_outside")) {
        measure = "share of outputs outside tolerance <= max_outside";
        value = json_object_get(f, "frac_outside");
        thr = json_object_get(t, "max_outside");
        rel = json_object_get(f, "max_rel_err");
        rtol = json_object_get(t, "rtol");
    } else if (json_object_get(f, "loss") && json_object_get(f, "limit")) {
        measure = "held-out loss <= baseline's x (1 + rel_margin) + abs_margin";
        value = json_object_get(f, "loss");
        thr = json_object_get(f, "limit");
    }
    return json_pack("{s:s,s:o,s:o,s:O?,s:O?,s:O?,s:O?,s:o}", "name", name, "status",
                     str_or_null(json_string_value(json_object_get(c, "status"))), "measure",
                     str_or_null(measure), "value", value, "threshold", thr, "max_rel_err", rel,
                     "rtol", rtol, "reason",
                     str_or_null(json_string_value(json_object_get(c, "reason"))));
}

/* The registry's copy of validation.json (NULL: it holds none) against the signed manifest:
 * its sha256 must be the manifest's "validation" sha256 and, where the manifest lists the
 * file, its size and sha256 there. Verified, it is parsed into p->validation. */
static json_t *registry_copy(prov *p, const json_t *mv) {
    if (!p->vtext) return NULL;
    if (strcmp(p->manifest_status, "verified"))
        return check(p, "not checked", "validation report",
                     "the registry holds a copy of validation.json, but the manifest it would be "
                     "checked against did not verify");
    const char *want = json_string_value(json_object_get(mv, "sha256"));
    if (!want)
        return check(p, "failed", "validation report",
                     "the registry serves a validation.json the signed manifest does not list");
    uint8_t h[KILN_SHA256_BYTES];
    char hex[KILN_SHA256_HEX];
    kiln_sha256(p->vtext, p->vlen, h);
    kiln_hex(h, sizeof h, hex);
    const kiln_manifest_file *vf = p->man ? kiln_manifest_find(p->man, "validation.json") : NULL;
    if (strcmp(hex, want) || (vf && (vf->size != p->vlen || memcmp(vf->sha256, h, sizeof h))))
        return check(p, "failed", "validation report",
                     "the registry's copy of validation.json (%zu bytes) hashes to "
                     "sha256:%.12s…, the signed manifest lists sha256:%.12s… (altered): "
                     "--download reads the signed bytes",
                     p->vlen, hex, want);
    json_t *rep = NULL;
    if (kiln_json_parse(p->vtext, p->vlen, "validation.json", &rep)) {
        json_t *c = check(p, "failed", "validation report",
                          "validation.json hashes to the signed manifest's sha256 but is not a "
                          "report: %s",
                          kiln_errmsg());
        kiln_errclear();
        return c;
    }
    p->validation = rep;
    p->validation_from = "registry";
    return check(p, "verified", "validation report",
                 "validation.json as the registry keeps it, byte for byte: %zu bytes hashing "
                 "to the signed manifest's sha256:%.12s… (the archive not downloaded)",
                 p->vlen, want);
}

static void validation_section(prov *p, const json_t *archive) {
    json_t *vj = json_object();
    set(p, p->root, "validation", vj);
    const json_t *mv = json_object_get(p->manifest, "validation");
    const char *verdict = json_string_value(json_object_get(archive, "verdict"));
    set(p, vj, "verdict", str_or_null(verdict));
    set(p, vj, "verdict_check",
        verdict ? check(p, "verified", "validation verdict",
                        "the release signers' trusted comments say validation:%s", verdict)
                : check(p, "not checked", "validation verdict",
                        "the archive's signatures did not verify"));
    set(p, vj, "report_sha256", copy(json_object_get(mv, "sha256")));
    set(p, vj, "report_sha256_check",
        !strcmp(p->manifest_status, "verified")
            ? check(p, "verified", "validation report", "listed in the signed manifest")
            : check(p, "not checked", "validation report", "the manifest did not verify"));
    /* The archive's report when downloaded, else the registry's copy once it verifies. */
    json_t *copy_check = p->validation ? NULL : registry_copy(p, mv);
    const json_t *rep = p->validation;
    if (!rep) {
        set(p, vj, "report", json_null());
        set(p, vj, "checks", json_null());
        set(p, vj, "baseline", json_null());
        set(p, vj, "source", json_null());
        const char *dl = json_string_value(json_object_get(
            json_object_get(json_object_get(archive, "download"), "check"), "status"));
        bool listed = json_is_string(json_object_get(mv, "sha256")),
             signed_ok = !strcmp(p->manifest_status, "verified");
        if (copy_check)
            set(p, vj, "check", copy_check);
        else if (p->o->download && (!dl || strcmp(dl, "verified")))
            set(p, vj, "check",
                check(p, "not checked", "validation report", "the download did not verify"));
        else if (p->o->download)
            set(p, vj, "check",
                listed ? check(p, "failed", "validation report", "not read from the archive")
                       : check(p, "verified", "validation report",
                               "the signed manifest names no validation.json"));
        else if (signed_ok && !listed)
            set(p, vj, "check",
                check(p, "verified", "validation report",
                      "the signed manifest names no validation.json"));
        else if (!signed_ok)
            set(p, vj, "check",
                check(p, "not checked", "validation report", "the manifest did not verify"));
        else
            set(p, vj, "check",
                check(p, "not checked", "validation report",
                      "not stored: the registry holds no copy of validation.json for %s@%s "
                      "(published before registries kept one); the checks are in the archive: "
                      "use --download",
                      p->model, p->version));
        return;
    }
    const json_t *data = json_object_get(rep, "data"), *held = json_object_get(rep, "heldout");
    /* The card records the training dataset's digest, not its path; the report names the
     * file it validated on: the same digest ties the path to the training data. */
    const char *ds = json_string_value(json_object_get(data, "sha256")),
               *ts = json_string_value(
                   json_object_get(json_object_get(p->manifest, "lineage"), "dataset_sha256"));
    set(p, vj, "report",
        json_pack("{s:O?,s:O?,s:O?,s:O?,s:b,s:O?,s:O?}", "kiln_version",
                  json_object_get(rep, "kiln_version"), "passed", json_object_get(rep, "passed"),
                  "data_path", json_object_get(data, "path"), "data_sha256",
                  json_object_get(data, "sha256"), "data_is_training_dataset",
                  ds && ts && !strcmp(ds, ts), "heldout_loss", json_object_get(held, "loss"),
                  "heldout_windows", json_object_get(held, "windows")));
    json_t *rows = json_array();
    const char *name;
    json_t *c;
    json_object_foreach(json_object_get(rep, "checks"), name, c) push(p, rows, check_row(name, c));
    set(p, vj, "checks", rows);
    /* Which baseline: recorded since kiln records it (docs/validation.md); an older report
     * gives the weights it measured only. */
    const json_t *bl = json_object_get(rep, "baseline");
    if (bl)
        set(p, vj, "baseline",
            json_is_object(bl) ? json_pack("{s:b,s:O}", "recorded", 1, "ref", bl)
                               : json_pack("{s:b,s:n}", "recorded", 1, "ref"));
    else
        set(p, vj, "baseline",
            json_pack(
                "{s:b,s:O?}", "recorded", 0, "model_sha256",
                json_object_get(json_object_get(json_object_get(json_object_get(rep, "checks"),
                                                                "baseline_loss"),
                                                "figures"),
                                "baseline_sha256")));
    set(p, vj, "source", json_string(p->validation_from));
    set(p, vj, "check",
        copy_check ? copy_check
                   : check(p, "verified", "validation report",
                           "validation.json of the downloaded archive, checked against the "
                           "signed manifest"));
}

/* ---- the command ---- */

static kiln_err args(const kiln_registry_provenance_opts *o, prov *p) {
    KILN_FAIL_IF(!o || !o->ref || !o->trust, KILN_ERR_USAGE,
                 "provenance needs a NAME@CHANNEL or NAME@VERSION and a trust policy");
    /* A channel or a version as the name reads (kiln_registry_looks_like_version), as
     * kiln pull reads it. */
    return kiln_registry_ref_parse(o->ref, p->model, p->what, &p->is_version);
}

kiln_err kiln_registry_provenance(const kiln_registry_client_opts *c,
                                  const kiln_registry_provenance_opts *o, json_t **out) {
    *out = NULL;
    KILN_FAIL_IF(!c || !c->url, KILN_ERR_USAGE, "provenance needs a registry URL");
    return kiln_registry_provenance_any(c, 1, o, out);
}

kiln_err kiln_registry_provenance_any(const kiln_registry_client_opts *cs, size_t n,
                                      const kiln_registry_provenance_opts *o, json_t **out) {
    *out = NULL;
    prov p;
    memset(&p, 0, sizeof p);
    p.o = o;
    KILN_TRY(args(o, &p));
    KILN_FAIL_IF(!cs || !n, KILN_ERR_USAGE, "provenance needs a registry URL");
    for (size_t i = 0; i < n; i++)
        KILN_FAIL_IF(!cs[i].url, KILN_ERR_USAGE, "registry %zu of provenance's list is NULL",
                     i + 1);
    p.notes = json_array();
    if (!p.notes) return KILN_ERR_NOMEM;
    kiln_err rc = reg_registries_init(&p.regs, cs, n, on_note, &p);
    if (rc) {
        json_decref(p.notes);
        return rc;
    }
    p.c = &p.regs.c[0];
    p.state = o->state ? kiln_strdup(o->state) : reg_default_state();
    char *record = NULL;
    size_t record_len = 0;
    json_t *urls = json_array();
    KILN_CHECK_IF(rc, done, !p.state || !urls, KILN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        push(&p, urls, json_string(cs[i].url));
    KILN_CHECK_IF(rc, done, kiln_path_dir_state(p.state) == KILN_DIR_OTHER, KILN_ERR_USAGE,
                  "state directory '%s' is not a directory", p.state);
    p.now = kiln_unix_time();
    p.problems = json_array();
    p.root = json_pack("{s:s,s:s,s:s,s:O,s:O,s:o,s:s,s:n,s:b,s:O}", "format", PROV_FORMAT, "ref",
                       o->ref, "registry", cs[0].url, "registries", urls, "failover", p.notes,
                       "checked_at", kiln_time_json(p.now), "model", p.model, "version", "verified", 0,
                       "problems", p.problems);
    KILN_CHECK_IF(rc, done, !p.root || !p.problems, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, done, trust_section(&p));

    /* A channel or a version as the name reads; a channel that no registry has fails (a
     * refusal when this client accepted it before), as kiln pull does: never read as a
     * version. Over several registries the record is failover.c's: the highest seq that
     * verifies. */
    if (!p.is_version) {
        size_t from = 0;
        rc = reg_newest_record(&p.regs, p.t, p.state, p.model, p.what, &record, &record_len, &from);
        if (rc != KILN_OK && rc != KILN_ERR_NOTFOUND && rc != KILN_ERR_NOMEM && n > 1) {
            /* None verifies: show the first served, flagged, as with one registry. */
            char why[2048];
            snprintf(why, sizeof why, "%s", kiln_errmsg());
            kiln_err frc = reg_first_record(&p.regs, p.model, p.what, &record, &record_len, &from);
            if (frc == KILN_OK) {
                on_note(&p, why);
                rc = KILN_OK;
            } else if (frc == KILN_ERR_NOMEM) {
                rc = frc;
            } else {
                rc = kiln_fail(rc, "%s", why);
            }
        }
        if (rc == KILN_OK) {
            p.by_channel = true;
            p.c = &p.regs.c[from];
        } else if (rc == KILN_ERR_NOTFOUND) {
            rc = reg_channel_missing(p.regs.c, p.regs.n, p.state, p.model, p.what);
            goto done;
        } else {
            goto done;
        }
    }
    kiln_errclear();
    rc = KILN_OK;
    if (p.by_channel) {
        set(&p, p.root, "channel", json_null());
        KILN_CHECK(rc, done, channel_section(&p, record, record_len));
    } else {
        snprintf(p.version, sizeof p.version, "%s", p.what);
        set(&p, p.root, "channel", json_null());
    }
    if (p.version[0]) {
        set(&p, p.root, "version", json_string(p.version));
        kiln_err arc = archive_section(&p);
        if (arc == KILN_ERR_NOTFOUND && !p.by_channel) {
            rc = kiln_fail(KILN_ERR_NOTFOUND, "%s version '%s' of '%s'",
                           n > 1 ? "no registry holds" : "the registry holds no", p.what, p.model);
            goto done;
        }
        KILN_CHECK(rc, done, arc);
        /* Nothing to read them from when the registry lacks the version the record names. */
        if (p.manifest_status) {
            lineage_section(&p);
            validation_section(&p, json_object_get(p.root, "archive"));
            KILN_CHECK(rc, done, reproductions_section(&p));
        }
    }
    /* The registry that answered: the record's, or the version's. */
    set(&p, p.root, "registry", json_string(p.c->url));
    size_t nprob = json_array_size(p.problems);
    set(&p, p.root, "verified", json_boolean(nprob == 0));
    KILN_CHECK_IF(rc, done, p.oom, KILN_ERR_NOMEM, "out of memory");
    *out = p.root;
    p.root = NULL;
    if (nprob)
        rc = kiln_fail(KILN_ERR_VERIFY, "%zu check%s of %s did not pass: %s%s", nprob,
                       nprob == 1 ? "" : "s", o->ref,
                       json_string_value(json_array_get(p.problems, 0)), nprob > 1 ? "; ..." : "");
done:
    json_decref(p.root);
    json_decref(p.problems);
    json_decref(p.walk);
    json_decref(p.manifest);
    json_decref(p.card);
    json_decref(p.validation);
    json_decref(p.notes);
    json_decref(urls);
    kiln_manifest_free(p.man);
    kiln_sign_trust_free(p.t);
    reg_registries_release(&p.regs);
    free(p.vtext);
    free(p.state);
    free(record);
    return rc;
}

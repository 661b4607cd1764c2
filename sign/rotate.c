/* rotate.c - versions of the trust policy, TUF's root rotation: a signed policy is a policy
 * and the signatures of root keys over its canonical JSON; a client accepts version N+1 only
 * when the root quorum of version N (which it trusts) AND the root quorum of N+1 signed it, so
 * a key is revoked fleet-wide by one signed document, and a stolen key alone can neither
 * rotate the roots nor be kept in. Laid out as channel records are (record.c): the document
 * carries its format inside the signed body, so its signatures cannot pass for anything else
 * kiln signs. */
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "sign_int.h"

#define TRUST_TAG "kiln-trust/1"

/* The trusted comment of version v's signatures. */
static void version_comment(uint64_t v, char *out, size_t cap) {
    snprintf(out, cap, TRUST_TAG "\tversion:%llu", (unsigned long long)v);
}

/* The signed document's file text: {"policy": policy, "signatures": sigs}, as
 * kiln_json_write_file writes documents (sorted keys, two-space indentation). */
static kiln_err document_text(const json_t *policy, const json_t *sigs, char **text,
                              size_t *len) {
    json_t *doc = json_pack("{s:O, s:O}", "policy", policy, "signatures", sigs);
    KILN_FAIL_IF(!doc, KILN_ERR_NOMEM, "out of memory");
    *text = kiln_json_document(doc, len);
    json_decref(doc);
    KILN_FAIL_IF(!*text, KILN_ERR_NOMEM, "out of memory encoding a signed policy");
    return KILN_OK;
}

/* One signature of the policy's version by sk, appended to sigs. */
static kiln_err append_signature(const kiln_sign_trust *t, const json_t *policy,
                                 const kiln_sign_seckey *sk, json_t *sigs) {
    char tc[64], *sig = NULL;
    version_comment(kiln_sign_trust_version(t), tc, sizeof tc);
    KILN_TRY(sign_canonical_sign(policy, sk, tc, &sig));
    int bad = json_array_append_new(sigs, json_string(sig));
    free(sig);
    KILN_FAIL_IF(bad, KILN_ERR_NOMEM, "out of memory");
    return KILN_OK;
}

kiln_err kiln_sign_trust_sign(const char *buf, size_t len, const char *label,
                              const kiln_sign_seckey *sk, char **text, size_t *text_len) {
    *text = NULL;
    *text_len = 0;
    json_t *doc = NULL, *sigs = NULL;
    const json_t *policy, *have;
    kiln_sign_trust *t = NULL;
    KILN_TRY(sign_trust_read(buf, len, label, &doc, &policy, &have, &t));
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, have, KILN_ERR_USAGE,
                  "'%s' is a signed policy already: add a signature to it rather than sign it "
                  "anew",
                  label);
    KILN_CHECK_IF(rc, out, kiln_sign_trust_role_count(t, KILN_SIGN_ROLE_ROOT) == 0,
                  KILN_ERR_USAGE,
                  "'%s' has no root keys: no signed version could ever follow it (give keys the "
                  "\"root\" role)",
                  label);
    sigs = json_array();
    KILN_CHECK_IF(rc, out, !sigs, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, append_signature(t, policy, sk, sigs));
    KILN_CHECK(rc, out, document_text(policy, sigs, text, text_len));
out:
    json_decref(sigs);
    json_decref(doc);
    kiln_sign_trust_free(t);
    return rc;
}

kiln_err kiln_sign_trust_add_signature(const char *buf, size_t len, const char *label,
                                       const kiln_sign_seckey *sk, char **text, size_t *text_len) {
    *text = NULL;
    *text_len = 0;
    json_t *doc = NULL, *sigs = NULL;
    const json_t *policy, *have;
    kiln_sign_trust *t = NULL;
    kiln_sign_pubkey pk;
    KILN_TRY(kiln_sign_seckey_pubkey(sk, &pk));
    KILN_TRY(sign_trust_read(buf, len, label, &doc, &policy, &have, &t));
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !have, KILN_ERR_USAGE,
                  "'%s' is not a signed policy ({\"policy\": ..., \"signatures\": [...]}): sign "
                  "the policy first",
                  label);
    KILN_CHECK_IF(rc, out, json_array_size(have) >= KILN_SIGN_TRUST_MAX_SIGS, KILN_ERR_LIMIT,
                  "'%s' holds %d signatures already, the most a signed policy may hold", label,
                  KILN_SIGN_TRUST_MAX_SIGS);
    char id[KILN_SIGN_KEYID_HEX];
    kiln_sign_keyid_hex(pk.keyid, id);
    for (size_t i = 0; i < json_array_size(have); i++) {
        const json_t *s = json_array_get(have, i);
        kiln_sign_sig parsed;
        kiln_sign_sig_init(&parsed);
        KILN_CHECK(rc, out,
                   sign_sig_parse_in(json_string_value(s), json_string_length(s), label, NULL,
                                     &parsed));
        bool same = !sodium_memcmp(parsed.keyid, pk.keyid, KILN_SIGN_KEYID_BYTES);
        kiln_sign_sig_release(&parsed);
        KILN_CHECK_IF(rc, out, same, KILN_ERR_CONFLICT,
                      "'%s' is already signed by key id %s (signature %zu)", label, id, i + 1);
    }
    sigs = json_copy((json_t *)have);
    KILN_CHECK_IF(rc, out, !sigs, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, append_signature(t, policy, sk, sigs));
    KILN_CHECK(rc, out, document_text(policy, sigs, text, text_len));
out:
    json_decref(sigs);
    json_decref(doc);
    kiln_sign_trust_free(t);
    return rc;
}

/* "'a', 'b'" (the names of the keys in keys), into buf. */
static const char *name_list(const kiln_sign_trust_key *const *keys, size_t n, char *buf,
                             size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s'%s'", i ? ", " : "", keys[i]->name);
    return buf;
}

/* The root key of t with this key id, or NULL. */
static const kiln_sign_trust_key *root_key(const kiln_sign_trust *t, const uint8_t *keyid) {
    const kiln_sign_trust_key *k = kiln_sign_trust_find(t, keyid);
    return k && (k->roles & KILN_SIGN_ROLE_ROOT) ? k : NULL;
}

static void add_distinct(const kiln_sign_trust_key **set, size_t *n,
                         const kiln_sign_trust_key *k) {
    for (size_t i = 0; i < *n; i++)
        if (set[i] == k) return;
    set[(*n)++] = k;
}

/* One signature of the new version: parsed, ED, by a root key of cur or next, verified with
 * that policy's key for the id, its comment naming the version. *in_cur / *in_next get the
 * key it counts toward in each (NULL where it does not). */
static kiln_err check_signature(const kiln_sign_trust *cur, const kiln_sign_trust *next,
                                const json_t *s, size_t i, const char *body, size_t blen,
                                const char *label, const kiln_sign_trust_key **in_cur,
                                const kiln_sign_trust_key **in_next,
                                kiln_sign_trust_update_result *res) {
    *in_cur = *in_next = NULL;
    unsigned long long vc = (unsigned long long)kiln_sign_trust_version(cur),
                       vn = (unsigned long long)kiln_sign_trust_version(next);
    char what[64], id[KILN_SIGN_KEYID_HEX], tc[64];
    snprintf(what, sizeof what, "signature %zu", i + 1);
    kiln_sign_sig sig;
    kiln_sign_sig_init(&sig);
    kiln_err rc = KILN_OK;
    KILN_CHECK(rc, out,
               sign_sig_parse_in(json_string_value(s), json_string_length(s), label, what, &sig));
    kiln_sign_keyid_hex(sig.keyid, id);
    snprintf(res->sigs[i].keyid, sizeof res->sigs[i].keyid, "%s", id);
    KILN_CHECK_IF(rc, out, sig.alg != KILN_SIGN_PREHASHED, KILN_ERR_VERIFY,
                  "'%s': %s is algorithm 'Ed' (legacy); a signed policy's are 'ED'", label, what);
    const kiln_sign_trust_key *kc = root_key(cur, sig.keyid), *kn = root_key(next, sig.keyid);
    if (!kc && !kn) {
        const kiln_sign_trust_key *known = kiln_sign_trust_find(cur, sig.keyid);
        if (!known) known = kiln_sign_trust_find(next, sig.keyid);
        if (known)
            rc = kiln_fail(KILN_ERR_VERIFY,
                           "'%s': %s is by key '%s' (%s), which is not a root key of version %llu "
                           "or of version %llu",
                           label, what, known->name, id, vc, vn);
        else
            rc = kiln_fail(KILN_ERR_VERIFY,
                           "'%s': %s is by key id %s, which is in neither version %llu nor version "
                           "%llu",
                           label, what, id, vc, vn);
        goto out;
    }
    snprintf(res->sigs[i].name, sizeof res->sigs[i].name, "%s", kc ? kc->name : kn->name);
    /* A key id in both versions with another public key in each counts only where its key
     * verifies it: the old quorum is the old keys', the new the new keys'. */
    kiln_err rcur = kc ? kiln_sign_verify_buffer(&kc->pub, &sig, body, blen, "the policy")
                       : KILN_ERR_VERIFY;
    kiln_err rnext = KILN_ERR_VERIFY;
    if (kn && rcur == KILN_OK && !sodium_memcmp(kc->pub.pk, kn->pub.pk, KILN_SIGN_PK_BYTES))
        rnext = KILN_OK;
    else if (kn)
        rnext = kiln_sign_verify_buffer(&kn->pub, &sig, body, blen, "the policy");
    if (rcur != KILN_OK && rnext != KILN_OK) {
        /* The message of the last verification tried says what failed; add whose it was. */
        char m[768];
        snprintf(m, sizeof m, "%s", kiln_errmsg());
        rc = kiln_fail(KILN_ERR_VERIFY, "%s (key '%s')", m, res->sigs[i].name);
        goto out;
    }
    version_comment(kiln_sign_trust_version(next), tc, sizeof tc);
    if (strcmp(sig.trusted_comment, tc) != 0) {
        /* Shown with its tabs as \t, as the expected comment is. */
        char shown[128];
        size_t k = 0;
        for (const char *c = sig.trusted_comment; *c && k + 3 < sizeof shown; c++) {
            if (*c == '\t') shown[k++] = '\\', shown[k++] = 't';
            else shown[k++] = *c;
        }
        shown[k] = 0;
        rc = kiln_fail(KILN_ERR_VERIFY,
                       "'%s': %s (key '%s') has the trusted comment '%s', not '" TRUST_TAG
                       "\\tversion:%llu'",
                       label, what, res->sigs[i].name, shown, vn);
        goto out;
    }
    if (rcur == KILN_OK) *in_cur = kc;
    if (rnext == KILN_OK) *in_next = kn;
    res->sigs[i].old_root = rcur == KILN_OK;
    res->sigs[i].new_root = rnext == KILN_OK;
out:
    kiln_sign_sig_release(&sig);
    return rc;
}

kiln_err kiln_sign_trust_update(const kiln_sign_trust *cur, const char *buf, size_t len,
                                const char *label, kiln_sign_trust **next_out,
                                kiln_sign_trust_update_result *res) {
    kiln_sign_trust_update_result local;
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    *next_out = NULL;
    unsigned long long vc = (unsigned long long)kiln_sign_trust_version(cur);
    res->from = kiln_sign_trust_version(cur);
    res->old_threshold = kiln_sign_trust_root_threshold(cur);
    KILN_FAIL_IF(kiln_sign_trust_role_count(cur, KILN_SIGN_ROLE_ROOT) == 0, KILN_ERR_VERIFY,
                 "'%s': the trust policy '%s' (version %llu) has no root keys, so no signed "
                 "version can follow it: replace it by hand with the new policy",
                 label, sign_trust_label(cur), vc);
    json_t *doc = NULL;
    const json_t *policy, *sigs;
    kiln_sign_trust *next = NULL;
    char *body = NULL;
    KILN_TRY(sign_trust_read(buf, len, label, &doc, &policy, &sigs, &next));
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !sigs, KILN_ERR_FORMAT,
                  "'%s' is a plain trust policy: a new version must be a signed policy "
                  "({\"policy\": ..., \"signatures\": [...]})",
                  label);
    unsigned long long vn = (unsigned long long)kiln_sign_trust_version(next);
    res->to = kiln_sign_trust_version(next);
    res->new_threshold = kiln_sign_trust_root_threshold(next);
    KILN_CHECK_IF(rc, out, vn != vc + 1, KILN_ERR_VERIFY,
                  "'%s' is version %llu, but only version %llu can follow version %llu", label, vn,
                  vc + 1, vc);
    KILN_CHECK_IF(rc, out, kiln_sign_trust_role_count(next, KILN_SIGN_ROLE_ROOT) == 0,
                  KILN_ERR_VERIFY,
                  "'%s': version %llu has no root keys, so no version could ever follow it", label,
                  vn);
    body = kiln_json_canonical(policy);
    KILN_CHECK_IF(rc, out, !body, KILN_ERR_NOMEM, "out of memory");
    size_t blen = strlen(body), n = json_array_size(sigs);
    const kiln_sign_trust_key *olds[KILN_SIGN_TRUST_MAX_SIGS], *news[KILN_SIGN_TRUST_MAX_SIGS];
    res->nsigs = n;
    for (size_t i = 0; i < n; i++) {
        const kiln_sign_trust_key *kc, *kn;
        KILN_CHECK(rc, out,
                   check_signature(cur, next, json_array_get(sigs, i), i, body, blen, label, &kc,
                                   &kn, res));
        if (kc) add_distinct(olds, &res->nold, kc);
        if (kn) add_distinct(news, &res->nnew, kn);
    }
    char names[1024];
    KILN_CHECK_IF(rc, out, res->nold < (size_t)res->old_threshold, KILN_ERR_VERIFY,
                  "'%s': needs %d distinct root key%s of version %llu, signed by %zu%s%s%s", label,
                  res->old_threshold, res->old_threshold == 1 ? "" : "s", vc, res->nold,
                  res->nold ? " (" : "", name_list(olds, res->nold, names, sizeof names),
                  res->nold ? ")" : "");
    KILN_CHECK_IF(rc, out, res->nnew < (size_t)res->new_threshold, KILN_ERR_VERIFY,
                  "'%s': needs %d distinct root key%s of version %llu, signed by %zu%s%s%s", label,
                  res->new_threshold, res->new_threshold == 1 ? "" : "s", vn, res->nnew,
                  res->nnew ? " (" : "", name_list(news, res->nnew, names, sizeof names),
                  res->nnew ? ")" : "");
    *next_out = next;
    next = NULL;
out:
    free(body);
    json_decref(doc);
    kiln_sign_trust_free(next);
    return rc;
}

/* ---- what changed ------------------------------------------------------------------- */

typedef struct lines {
    char *p;
    size_t len;
    bool oom;
} lines;

static void line(lines *l, const char *fmt, ...) KILN_PRINTF(2, 3);
static void line(lines *l, const char *fmt, ...) {
    if (l->oom) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n > sizeof buf - 2) n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    char *np = realloc(l->p, l->len + (size_t)n + 1);
    if (!np) {
        l->oom = true;
        return;
    }
    l->p = np;
    memcpy(l->p + l->len, buf, (size_t)n);
    l->len += (size_t)n;
    l->p[l->len] = 0;
}

static const kiln_sign_trust_key *by_name(const kiln_sign_trust *t, const char *name) {
    for (size_t i = 0; i < kiln_sign_trust_key_count(t); i++)
        if (!strcmp(kiln_sign_trust_key_at(t, i)->name, name)) return kiln_sign_trust_key_at(t, i);
    return NULL;
}

static int channel_threshold(const kiln_sign_trust *t, const char *name) {
    int th;
    return kiln_sign_trust_threshold(t, name, &th) == KILN_OK ? th : 0;
}

char *kiln_sign_trust_diff(const kiln_sign_trust *a, const kiln_sign_trust *b) {
    lines l = {0};
    char id[KILN_SIGN_KEYID_HEX], id2[KILN_SIGN_KEYID_HEX], r1[64], r2[64];
    for (size_t i = 0; i < kiln_sign_trust_key_count(a); i++) {
        const kiln_sign_trust_key *k = kiln_sign_trust_key_at(a, i), *o = by_name(b, k->name);
        kiln_sign_keyid_hex(k->pub.keyid, id);
        if (!o) {
            line(&l, "key '%s' (%s) removed (%s)", k->name, id,
                 sign_trust_role_names(k->roles, r1, sizeof r1));
            continue;
        }
        kiln_sign_keyid_hex(o->pub.keyid, id2);
        if (sodium_memcmp(&k->pub, &o->pub, sizeof k->pub) != 0)
            line(&l, "key '%s': public key replaced (%s -> %s)", k->name, id, id2);
        if (k->roles != o->roles)
            line(&l, "key '%s' (%s): roles %s -> %s", k->name, id2,
                 sign_trust_role_names(k->roles, r1, sizeof r1),
                 sign_trust_role_names(o->roles, r2, sizeof r2));
    }
    for (size_t i = 0; i < kiln_sign_trust_key_count(b); i++) {
        const kiln_sign_trust_key *k = kiln_sign_trust_key_at(b, i);
        kiln_sign_keyid_hex(k->pub.keyid, id);
        if (!by_name(a, k->name))
            line(&l, "key '%s' (%s) added (%s)", k->name, id,
                 sign_trust_role_names(k->roles, r1, sizeof r1));
    }
    if (kiln_sign_trust_root_threshold(a) != kiln_sign_trust_root_threshold(b))
        line(&l, "root_threshold %d -> %d", kiln_sign_trust_root_threshold(a),
             kiln_sign_trust_root_threshold(b));
    if (kiln_sign_trust_release_threshold(a) != kiln_sign_trust_release_threshold(b))
        line(&l, "release_threshold %d -> %d", kiln_sign_trust_release_threshold(a),
             kiln_sign_trust_release_threshold(b));
    if (kiln_sign_trust_accepts_unvalidated(a) != kiln_sign_trust_accepts_unvalidated(b))
        line(&l, "accept_unvalidated %s -> %s",
             kiln_sign_trust_accepts_unvalidated(a) ? "true" : "false",
             kiln_sign_trust_accepts_unvalidated(b) ? "true" : "false");
    int th;
    for (size_t i = 0; i < sign_trust_channel_count(a); i++) {
        const char *c = sign_trust_channel_at(a, i, &th);
        int nt = channel_threshold(b, c);
        if (!nt)
            line(&l, "channel '%s' removed (threshold %d)", c, th);
        else if (nt != th)
            line(&l, "channel '%s': threshold %d -> %d", c, th, nt);
    }
    for (size_t i = 0; i < sign_trust_channel_count(b); i++) {
        const char *c = sign_trust_channel_at(b, i, &th);
        if (!channel_threshold(a, c)) line(&l, "channel '%s' added (threshold %d)", c, th);
    }
    /* A channel's reproduced_by, wherever it is in both or asked by either. */
    for (int side = 0; side < 2; side++)
        for (size_t i = 0; i < sign_trust_channel_count(side ? b : a); i++) {
            const char *c = sign_trust_channel_at(side ? b : a, i, &th);
            if (side && channel_threshold(a, c)) continue; /* seen from a's side */
            const char *const *ka, *const *kb;
            size_t na, nb;
            int ta = kiln_sign_trust_reproduced_by(a, c, &ka, &na),
                tb = kiln_sign_trust_reproduced_by(b, c, &kb, &nb);
            bool same = ta == tb && na == nb;
            for (size_t k = 0; same && k < na; k++)
                same = !strcmp(ka[k], kb[k]);
            if (!same)
                line(&l, "channel '%s': reproduced_by %d of %zu key%s -> %d of %zu key%s", c, ta,
                     na, na == 1 ? "" : "s", tb, nb, nb == 1 ? "" : "s");
        }
    for (size_t i = 0; i < kiln_sign_trust_withdrawn_count(b); i++) {
        const char *why, *d = kiln_sign_trust_withdrawn_at(b, i, &why);
        if (!kiln_sign_trust_withdrawn(a, d)) line(&l, "withdraws %s: %s", d, why);
    }
    for (size_t i = 0; i < kiln_sign_trust_withdrawn_count(a); i++) {
        const char *d = kiln_sign_trust_withdrawn_at(a, i, NULL);
        if (!kiln_sign_trust_withdrawn(b, d)) line(&l, "no longer withdraws %s", d);
    }
    kiln_errclear(); /* the lookups of channels absent from one side */
    if (l.oom) {
        free(l.p);
        kiln_fail(KILN_ERR_NOMEM, "out of memory");
        return NULL;
    }
    return l.p ? l.p : kiln_strdup("");
}

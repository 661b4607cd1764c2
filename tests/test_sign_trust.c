/* test_sign_trust.c - versions of the trust policy: the version and root fields, signed
 * policies (parsing, signing, adding signatures) and kiln_sign_trust_update's rules one by
 * one, each shown to refuse what it must and to accept the same document once the rule is
 * met; and the description of what changed. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <sodium.h>

#include "sign.h"
#include "test.h"
#include "testutil.h"

/* Keys by letter: r1 r2 r3 root candidates, a b promote, x a stranger. */
enum { R1, R2, R3, PA, PB, X, NK };
static const char *const key_names[NK] = {"r1", "r2", "r3", "a", "b", "x"};

typedef struct fx {
    kiln_sign_seckey *sk[NK];
    char b64[NK][KILN_SIGN_PUBKEY_B64];
} fx;

static bool fx_init(fx *f) {
    memset(f, 0, sizeof *f);
    for (int i = 0; i < NK; i++)
        if (!kiln_test_keypair(&f->sk[i], f->b64[i])) return false;
    return true;
}

static void fx_free(fx *f) {
    for (int i = 0; i < NK; i++)
        kiln_sign_seckey_free(f->sk[i]);
}

/* A policy: keys given as "name:role,role name:role", version and root_threshold (0: the
 * field left out), a production channel of threshold 1. Caller frees. */
static char *policy(const fx *f, int version, int root_threshold, const char *keys) {
    char body[4096] = "", *p = body;
    char spec[512];
    snprintf(spec, sizeof spec, "%s", keys);
    for (char *tok = strtok(spec, " "); tok; tok = strtok(NULL, " ")) {
        char *colon = strchr(tok, ':');
        *colon = 0;
        int k = 0;
        while (k < NK && strcmp(key_names[k], tok))
            k++;
        char roles[128] = "", *r = roles;
        char rs[128];
        snprintf(rs, sizeof rs, "%s", colon + 1);
        for (char *x = strtok_r(rs, ",", &r); x; x = strtok_r(NULL, ",", &r))
            snprintf(roles + strlen(roles), sizeof roles - strlen(roles), "%s\"%s\"",
                     roles[0] ? "," : "", x);
        p += snprintf(p, sizeof body - (size_t)(p - body),
                      "%s{\"name\":\"%s\",\"pubkey\":\"%s\",\"roles\":[%s]}", p == body ? "" : ",",
                      tok, f->b64[k], roles);
    }
    char extra[128] = "";
    if (version)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ",\"version\":%d", version);
    if (root_threshold)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ",\"root_threshold\":%d",
                 root_threshold);
    return kiln_asprintf("{\"format\":\"kiln-trust/1\",\"keys\":[%s],\"channels\":{\"production\":"
                         "{\"threshold\":1}}%s}",
                         body, extra);
}

static kiln_sign_trust *parse(const char *text, const char *label) {
    kiln_sign_trust *t = NULL;
    if (!text || kiln_sign_trust_parse(text, strlen(text), label, &t) != KILN_OK) return NULL;
    return t;
}

/* The policy text signed by each key in signers (-1 ends the list). Caller frees. */
static char *sign_by(const fx *f, const char *text, const int *signers) {
    char *doc = NULL;
    size_t len = 0;
    for (int i = 0; text && signers[i] >= 0; i++) {
        char *next = NULL;
        kiln_err rc = i == 0 ? kiln_sign_trust_sign(text, strlen(text), "p", f->sk[signers[i]],
                                                    &next, &len)
                             : kiln_sign_trust_add_signature(doc, len, "p", f->sk[signers[i]],
                                                             &next, &len);
        free(doc);
        doc = rc == KILN_OK ? next : NULL;
        if (!doc) return NULL;
    }
    return doc;
}

/* A signed document made by hand (no checks of the policy): each signer signs the canonical
 * policy with the trusted comment tc. Caller frees. */
static char *sign_raw(const fx *f, const char *text, const int *signers, const char *tc) {
    json_t *pol = json_loads(text, 0, NULL), *sigs = json_array();
    char *body = pol ? kiln_json_canonical(pol) : NULL, *out = NULL;
    bool ok = body != NULL;
    for (int i = 0; ok && signers[i] >= 0; i++) {
        char *sig = NULL;
        ok = kiln_sign_buffer(f->sk[signers[i]], body, strlen(body), tc, KILN_SIGN_PREHASHED,
                              &sig) == KILN_OK;
        if (ok) json_array_append_new(sigs, json_string(sig));
        free(sig);
    }
    if (ok) {
        json_t *doc = json_pack("{s:O, s:O}", "policy", pol, "signatures", sigs);
        out = json_dumps(doc, JSON_SORT_KEYS | JSON_INDENT(2));
        json_decref(doc);
    }
    free(body);
    json_decref(pol);
    json_decref(sigs);
    return out;
}

/* Update cur with doc; the result code, *next freed. */
static kiln_err update(const kiln_sign_trust *cur, const char *doc,
                       kiln_sign_trust_update_result *res) {
    kiln_sign_trust *next = NULL;
    if (!doc) return KILN_ERR_INTERNAL;
    kiln_err rc = kiln_sign_trust_update(cur, doc, strlen(doc), "v2.json", &next, res);
    if (rc == KILN_OK && !next) rc = KILN_ERR_INTERNAL;
    if (rc != KILN_OK && next) rc = KILN_ERR_INTERNAL; /* nothing on failure */
    kiln_sign_trust_free(next);
    return rc;
}

/* doc with one JSON edit: the signatures array's signature i replaced by text (NULL: a copy
 * of signature j appended), or the policy's "version" set. Caller frees. */
static char *doc_edit(const char *doc, int sig_i, const char *text, int dup_j) {
    json_t *j = json_loads(doc, 0, NULL);
    json_t *sigs = json_object_get(j, "signatures");
    if (text)
        json_array_set_new(sigs, (size_t)sig_i, json_string(text));
    else
        json_array_append(sigs, json_array_get(sigs, (size_t)dup_j));
    char *out = json_dumps(j, JSON_SORT_KEYS | JSON_INDENT(2));
    json_decref(j);
    return out;
}

KILN_TEST(sign_trust_version_and_root_fields) {
    fx f;
    if (!CHECK("keys", fx_init(&f))) goto out;
    char *p = policy(&f, 7, 2, "r1:root r2:root,promote a:promote");
    kiln_sign_trust *t = parse(p, "p.json");
    CHECK("a policy with root keys parses", t);
    CHECK("version, root_threshold, role counts",
          t && kiln_sign_trust_version(t) == 7 && kiln_sign_trust_root_threshold(t) == 2 &&
              kiln_sign_trust_role_count(t, KILN_SIGN_ROLE_ROOT) == 2 &&
              kiln_sign_trust_role_count(t, KILN_SIGN_ROLE_PROMOTE) == 2 &&
              kiln_sign_trust_signatures(t) == 0);
    CHECK("roles combine",
          t && kiln_sign_trust_key_at(t, 1)->roles == (KILN_SIGN_ROLE_ROOT | KILN_SIGN_ROLE_PROMOTE));
    kiln_sign_trust_free(t);
    free(p);
    p = policy(&f, 0, 0, "r1:root a:promote");
    t = parse(p, "p.json");
    CHECK("defaults: version 1, root_threshold 1",
          t && kiln_sign_trust_version(t) == 1 && kiln_sign_trust_root_threshold(t) == 1);
    kiln_sign_trust_free(t);
    free(p);
    struct {
        char *text;
        const char *want;
    } bad[] = {
        {policy(&f, 0, 1, "a:promote"), "root_threshold is given, but no key holds the \"root\" role"},
        {policy(&f, 0, 3, "r1:root r2:root a:promote"), "root_threshold 3 can never be met: the policy has 2 root keys"},
        {policy(&f, 0, -1, "r1:root a:promote"), "root_threshold -1 must be at least 1"},
        {policy(&f, -2, 0, "r1:root a:promote"), "version -2 must be between 1 and 2^53-1"},
        {kiln_asprintf("{\"format\":\"kiln-trust/1\",\"version\":9007199254740992,\"keys\":[{"
                       "\"name\":\"a\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]}],\"channels\":{}}",
                       f.b64[PA]),
         "version 9007199254740992 must be between 1 and 2^53-1"},
        {kiln_asprintf("{\"format\":\"kiln-trust/1\",\"version\":\"2\",\"keys\":[{\"name\":\"a\","
                       "\"pubkey\":\"%s\",\"roles\":[\"promote\"]}],\"channels\":{}}",
                       f.b64[PA]),
         "'version' must be an integer"},
        {kiln_asprintf("{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"a\",\"pubkey\":\"%s\","
                       "\"roles\":[\"root\",\"admin\"]}],\"channels\":{}}",
                       f.b64[PA]),
         "unknown role 'admin'"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        kiln_sign_trust *b = NULL;
        kiln_err rc = bad[i].text ? kiln_sign_trust_parse(bad[i].text, strlen(bad[i].text),
                                                          "pol.json", &b)
                                  : KILN_OK;
        CHECK("refused", rc == KILN_ERR_FORMAT && !b);
        if (!CHECK("the message names the file and the problem",
                   kiln_test_msg_has("'pol.json'", bad[i].want)))
            fprintf(stderr, "    case %zu: %s\n", i, kiln_errmsg());
        kiln_sign_trust_free(b);
        free(bad[i].text);
    }
out:
    fx_free(&f);
}

/* A channel's reproduced_by: keys holding the reproduce role, each once, and a threshold they
 * can meet; the accessor gives them back, and the diff names a change. */
KILN_TEST(sign_trust_reproduced_by) {
    fx f;
    if (!CHECK("keys", fx_init(&f))) goto out;
    /* a: promote; x: reproduce; b: promote only */
#define POL(rb)                                                                                    \
    kiln_asprintf("{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"a\",\"pubkey\":\"%s\","          \
                  "\"roles\":[\"promote\"]},{\"name\":\"x\",\"pubkey\":\"%s\",\"roles\":["            \
                  "\"reproduce\"]},{\"name\":\"b\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]}],"       \
                  "\"channels\":{\"production\":{\"threshold\":1%s},\"staging\":{\"threshold\":1}}}", \
                  f.b64[PA], f.b64[X], f.b64[PB], rb)
    char *p = POL(",\"reproduced_by\":{\"keys\":[\"x\"],\"threshold\":1}");
    kiln_sign_trust *t = parse(p, "p.json");
    const char *const *keys = NULL;
    size_t n = 9;
    CHECK("a policy with reproduced_by parses", t);
    CHECK("production asks for 1 of [x]", t && kiln_sign_trust_reproduced_by(t, "production", &keys, &n) == 1 &&
                                              n == 1 && !strcmp(keys[0], "x"));
    CHECK("staging asks for none", t && kiln_sign_trust_reproduced_by(t, "staging", &keys, &n) == 0 && n == 0);
    char *p0 = POL("");
    kiln_sign_trust *t0 = parse(p0, "p0.json");
    char *d = t && t0 ? kiln_sign_trust_diff(t0, t) : NULL;
    CHECK("the diff names the change", d && strstr(d, "channel 'production': reproduced_by 0 of 0 keys -> 1 of 1 key"));
    free(d);
    kiln_sign_trust_free(t);
    kiln_sign_trust_free(t0);
    free(p);
    free(p0);
    struct {
        char *text;
        const char *want;
    } bad[] = {
        {POL(",\"reproduced_by\":{\"keys\":[\"b\"],\"threshold\":1}"), "'b' is not a key of the policy with the reproduce role"},
        {POL(",\"reproduced_by\":{\"keys\":[\"nobody\"],\"threshold\":1}"), "'nobody' is not a key of the policy"},
        {POL(",\"reproduced_by\":{\"keys\":[\"x\",\"x\"],\"threshold\":1}"), "key 'x' listed twice"},
        {POL(",\"reproduced_by\":{\"keys\":[\"x\"],\"threshold\":2}"), "threshold 2 must be 1 to the 1 keys listed"},
        {POL(",\"reproduced_by\":{\"keys\":[],\"threshold\":1}"), "'keys' must be a non-empty array"},
        {POL(",\"reproduced_by\":{\"keys\":[\"x\"],\"threshold\":1,\"by\":2}"), "by"},
    };
#undef POL
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        kiln_sign_trust *b = NULL;
        kiln_err rc = bad[i].text ? kiln_sign_trust_parse(bad[i].text, strlen(bad[i].text),
                                                          "pol.json", &b)
                                  : KILN_OK;
        CHECK("refused", rc == KILN_ERR_FORMAT && !b);
        if (!CHECK("the message names the file and the problem",
                   kiln_test_msg_has("'pol.json'", bad[i].want)))
            fprintf(stderr, "    case %zu: %s\n", i, kiln_errmsg());
        kiln_sign_trust_free(b);
        free(bad[i].text);
    }
out:
    fx_free(&f);
}

/* A policy from before versions (no version, no root keys) reads as it always did, and its
 * signed form reads as the same policy. */
KILN_TEST(sign_trust_plain_policy_unchanged) {
    fx f;
    if (!CHECK("keys", fx_init(&f))) goto out;
    char *plain = kiln_asprintf(
        "{\"format\": \"kiln-trust/1\", \"keys\": ["
        "{\"name\": \"a\", \"pubkey\": \"%s\", \"roles\": [\"release\", \"promote\"]},"
        "{\"name\": \"b\", \"pubkey\": \"%s\", \"roles\": [\"promote\"]}],"
        "\"channels\": {\"production\": {\"threshold\": 2}}, \"release_threshold\": 1}",
        f.b64[PA], f.b64[PB]);
    kiln_sign_trust *t = parse(plain, "trust.json");
    int th = 0;
    CHECK("it parses as before: version 1, no root keys, not signed",
          t && kiln_sign_trust_version(t) == 1 &&
              kiln_sign_trust_role_count(t, KILN_SIGN_ROLE_ROOT) == 0 &&
              kiln_sign_trust_root_threshold(t) == 1 && kiln_sign_trust_signatures(t) == 0 &&
              kiln_sign_trust_key_count(t) == 2 &&
              kiln_sign_trust_threshold(t, "production", &th) == KILN_OK && th == 2 &&
              kiln_sign_trust_key_at(t, 0)->roles ==
                  (KILN_SIGN_ROLE_RELEASE | KILN_SIGN_ROLE_PROMOTE));
    /* It cannot be signed (no version could follow it) nor updated. */
    char *doc = NULL;
    size_t len;
    CHECK("a policy without root keys is not signed",
          kiln_sign_trust_sign(plain, strlen(plain), "trust.json", f.sk[PA], &doc, &len) ==
                  KILN_ERR_USAGE &&
              !doc && kiln_test_msg_has("'trust.json' has no root keys", NULL));
    char *p2 = policy(&f, 2, 0, "r1:root a:promote"), *d2 = sign_by(&f, p2, (int[]){R1, -1});
    CHECK("a policy without root keys is not updated: replaced by hand",
          t && update(t, d2, NULL) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("'trust.json' (version 1) has no root keys",
                                "replace it by hand"));
    /* The signed form of a policy reads as the same policy, its signatures unchecked (the
     * configured file is the client's root of trust). */
    kiln_sign_trust *s = parse(d2, "signed.json"), *u = parse(p2, "plain.json");
    char *diff = s && u ? kiln_sign_trust_diff(u, s) : NULL;
    CHECK("signed and plain read alike", s && u && diff && !strcmp(diff, "") &&
                                             kiln_sign_trust_signatures(s) == 1 &&
                                             kiln_sign_trust_version(s) == 2);
    kiln_sign_trust_free(s), kiln_sign_trust_free(u), free(diff);
    char *forged = d2 ? doc_edit(d2, 0, "untrusted comment: x\nRUQ=\ntrusted comment: y\nZZ==\n",
                                 0)
                      : NULL;
    s = forged ? parse(forged, "f.json") : NULL;
    CHECK("a signed file's signatures must at least parse",
          forged && !s && kiln_test_msg_has("'f.json': signature 1, line 2", NULL));
    kiln_sign_trust_free(s);
    free(forged), free(p2), free(d2), free(plain);
    kiln_sign_trust_free(t);
out:
    fx_free(&f);
}

KILN_TEST(sign_trust_signed_policy_strict) {
    fx f;
    if (!CHECK("keys", fx_init(&f))) goto out;
    char *p = policy(&f, 2, 0, "r1:root a:promote"), *doc = sign_by(&f, p, (int[]){R1, -1});
    if (!CHECK("signed", doc)) goto free;
    json_t *j = json_loads(doc, 0, NULL);
    char *pol = json_dumps(json_object_get(j, "policy"), JSON_COMPACT | JSON_SORT_KEYS),
         *sig = json_dumps(json_object_get(j, "signatures"), JSON_COMPACT);
    json_decref(j);
    char many[40000] = "[";
    for (int i = 0; i < 33; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%s%.*s", i ? "," : "",
                 (int)strlen(sig) - 2, sig + 1);
    strcat(many, "]");
    struct {
        char *text;
        kiln_err code;
        const char *want;
    } bad[] = {
        {kiln_asprintf("{\"policy\":%s,\"signatures\":%s,\"note\":1}", pol, sig), KILN_ERR_FORMAT,
         "unknown field 'note'"},
        {kiln_asprintf("{\"policy\":[],\"signatures\":%s}", sig), KILN_ERR_FORMAT,
         "'policy' must be a kiln-trust/1 policy"},
        {kiln_asprintf("{\"signatures\":%s}", sig), KILN_ERR_FORMAT, "'policy' must be"},
        {kiln_asprintf("{\"policy\":%s}", pol), KILN_ERR_FORMAT, "'signatures' must be a non-empty"},
        {kiln_asprintf("{\"policy\":%s,\"signatures\":[]}", pol), KILN_ERR_FORMAT,
         "'signatures' must be a non-empty"},
        {kiln_asprintf("{\"policy\":%s,\"signatures\":[7]}", pol), KILN_ERR_FORMAT,
         "signature 1 is not a string"},
        {kiln_asprintf("{\"policy\":%s,\"signatures\":%s}", pol, many), KILN_ERR_LIMIT,
         "33 signatures, more than the 32 a signed policy may hold"},
        {kiln_asprintf("{\"policy\":%s,\"policy\":%s,\"signatures\":%s}", pol, pol, sig),
         KILN_ERR_FORMAT, "duplicate"},
        {kiln_asprintf("{\"policy\":{\"format\":\"kiln-trust/1\",\"colour\":1},\"signatures\":%s}",
                       sig),
         KILN_ERR_FORMAT, "policy: unknown field 'colour'"},
        /* With a "format" it is a plain policy, refused as one always was. */
        {kiln_asprintf("{\"format\":\"kiln-trust/1\",\"policy\":%s,\"signatures\":%s}", pol, sig),
         KILN_ERR_FORMAT, "top level: unknown field"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        kiln_sign_trust *t = NULL;
        kiln_err rc = bad[i].text ? kiln_sign_trust_parse(bad[i].text, strlen(bad[i].text),
                                                          "s.json", &t)
                                  : KILN_OK;
        CHECK("refused", rc == bad[i].code && !t);
        if (!CHECK("the message names the file and the problem",
                   kiln_test_msg_has("'s.json'", bad[i].want)))
            fprintf(stderr, "    case %zu: %s\n", i, kiln_errmsg());
        kiln_sign_trust_free(t);
        free(bad[i].text);
    }
    free(pol), free(sig);
free:
    free(p), free(doc);
out:
    fx_free(&f);
}

KILN_TEST(sign_trust_sign_and_add) {
    fx f;
    if (!CHECK("keys", fx_init(&f))) goto out;
    char *p = policy(&f, 2, 2, "r1:root r2:root a:promote");
    char *doc = NULL, *again = NULL;
    size_t len = 0, len2 = 0;
    CHECK("sign", kiln_sign_trust_sign(p, strlen(p), "p.json", f.sk[R1], &doc, &len) == KILN_OK &&
                      doc && len == strlen(doc));
    CHECK("a signed policy is not signed anew",
          doc && kiln_sign_trust_sign(doc, len, "s.json", f.sk[R2], &again, &len2) ==
                     KILN_ERR_USAGE &&
              !again && kiln_test_msg_has("'s.json' is a signed policy already", NULL));
    CHECK("a signature is not added to a plain policy",
          kiln_sign_trust_add_signature(p, strlen(p), "p.json", f.sk[R2], &again, &len2) ==
                  KILN_ERR_USAGE &&
              !again && kiln_test_msg_has("'p.json' is not a signed policy", NULL));
    CHECK("a second signature by the same key is refused",
          doc && kiln_sign_trust_add_signature(doc, len, "s.json", f.sk[R1], &again, &len2) ==
                     KILN_ERR_CONFLICT &&
              !again && kiln_test_msg_has("'s.json' is already signed by key id", NULL));
    CHECK("another key adds one",
          doc && kiln_sign_trust_add_signature(doc, len, "s.json", f.sk[R2], &again, &len2) ==
                     KILN_OK);
    kiln_sign_trust *t = again ? parse(again, "s.json") : NULL;
    CHECK("two signatures", t && kiln_sign_trust_signatures(t) == 2);
    /* The comment names the version; the document's policy is the same. */
    CHECK("the trusted comment names the version",
          again && strstr(again, "trusted comment: kiln-trust/1\\tversion:2\\n"));
    kiln_sign_trust_free(t);
    free(p), free(doc), free(again);
out:
    fx_free(&f);
}

/* Version 1: roots r1 r2 (root_threshold 2), promote a and b. */
static kiln_sign_trust *v1_policy(const fx *f) {
    char *p = policy(f, 0, 2, "r1:root r2:root a:promote b:promote");
    kiln_sign_trust *t = parse(p, "trust.json");
    free(p);
    return t;
}

KILN_TEST(sign_trust_update_accepts_the_next_version) {
    fx f;
    kiln_sign_trust *v1 = NULL, *v2 = NULL;
    if (!CHECK("keys", fx_init(&f)) || !CHECK("v1", (v1 = v1_policy(&f)))) goto out;
    char *p = policy(&f, 2, 2, "r1:root r2:root b:promote"),
         *doc = sign_by(&f, p, (int[]){R1, R2, -1});
    kiln_sign_trust_update_result res;
    CHECK("signed by both roots: accepted",
          doc && kiln_sign_trust_update(v1, doc, strlen(doc), "v2.json", &v2, &res) == KILN_OK &&
              v2 && kiln_sign_trust_version(v2) == 2);
    CHECK("who signed, toward which quorum",
          res.from == 1 && res.to == 2 && res.nsigs == 2 && res.nold == 2 && res.nnew == 2 &&
              res.old_threshold == 2 && res.new_threshold == 2 &&
              !strcmp(res.sigs[0].name, "r1") && res.sigs[0].old_root && res.sigs[0].new_root);
    char *d = v2 ? kiln_sign_trust_diff(v1, v2) : NULL;
    CHECK("what changed: a removed", d && strstr(d, "key 'a' (") && strstr(d, ") removed (promote)\n") &&
                                        !strstr(d, "'b'"));
    free(d);
    /* And the version after it, from v2. */
    char *p3 = policy(&f, 3, 1, "r1:root r2:root b:promote"),
         *d3 = sign_by(&f, p3, (int[]){R2, R1, -1});
    CHECK("v3 follows v2", v2 && update(v2, d3, NULL) == KILN_OK);
    CHECK("v3 does not follow v1", update(v1, d3, NULL) == KILN_ERR_VERIFY &&
                                       kiln_test_msg_has("'v2.json' is version 3",
                                                         "only version 2 can follow version 1"));
    CHECK("v2 does not follow v2 (a replay)",
          v2 && update(v2, doc, NULL) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("is version 2, but only version 3", NULL));
    free(p), free(doc), free(p3), free(d3);
out:
    kiln_sign_trust_free(v1);
    kiln_sign_trust_free(v2);
    fx_free(&f);
}

/* Each rule refuses on its own: the same document is accepted once the rule is met. */
KILN_TEST(sign_trust_update_rules) {
    fx f;
    kiln_sign_trust *v1 = NULL;
    if (!CHECK("keys", fx_init(&f)) || !CHECK("v1", (v1 = v1_policy(&f)))) goto out;
    char *p = policy(&f, 2, 2, "r1:root r2:root b:promote");
    kiln_sign_trust_update_result res;

    /* the old quorum: 2 distinct roots of version 1 */
    char *one = sign_by(&f, p, (int[]){R1, -1});
    CHECK("one root of two: refused, naming who signed",
          update(v1, one, &res) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("'v2.json': needs 2 distinct root keys of version 1, signed by 1 "
                                "('r1')",
                                NULL));
    char *twice = one ? doc_edit(one, 0, NULL, 0) : NULL;
    CHECK("the same root twice counts once",
          update(v1, twice, &res) == KILN_ERR_VERIFY && res.nsigs == 2 && res.nold == 1 &&
              kiln_test_msg_has("signed by 1 ('r1')", NULL));

    /* a foreign signature, a non-root signature: refused even beside a full quorum */
    char *foreign = sign_by(&f, p, (int[]){R1, R2, X, -1});
    CHECK("a stranger's signature refuses the document",
          update(v1, foreign, NULL) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("signature 3 is by key id", "in neither version 1 nor version 2"));
    char *nonroot = sign_by(&f, p, (int[]){R1, R2, PB, -1});
    CHECK("a promote key's signature refuses the document",
          update(v1, nonroot, NULL) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("signature 3 is by key 'b'", "not a root key of version 1 or of "
                                                             "version 2"));

    /* tampered after signing */
    char *good = sign_by(&f, p, (int[]){R1, R2, -1});
    CHECK("the untampered document is accepted", update(v1, good, NULL) == KILN_OK);
    char *tampered = NULL;
    if (good) {
        json_t *j = json_loads(good, 0, NULL);
        json_object_set_new(json_object_get(json_object_get(json_object_get(j, "policy"),
                                                            "channels"),
                                            "production"),
                            "threshold", json_integer(2));
        json_array_append_new(json_object_get(json_object_get(j, "policy"), "keys"),
                              json_pack("{s:s, s:s, s:[s]}", "name", "b2", "pubkey", f.b64[PA],
                                        "roles", "promote"));
        tampered = json_dumps(j, JSON_SORT_KEYS);
        json_decref(j);
    }
    CHECK("a policy changed after signing: refused",
          update(v1, tampered, NULL) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("signature 1': signature verification failed", "(key 'r1')"));

    /* the trusted comment must name the version */
    char *wrongtc = NULL;
    if (good) {
        json_t *j = json_loads(good, 0, NULL);
        char *body = kiln_json_canonical(json_object_get(j, "policy")), *sig = NULL;
        if (body &&
            kiln_sign_buffer(f.sk[R2], body, strlen(body), "kiln-trust/1\tversion:3",
                             KILN_SIGN_PREHASHED, &sig) == KILN_OK)
            wrongtc = doc_edit(good, 1, sig, 0);
        free(body), free(sig);
        json_decref(j);
    }
    CHECK("a signature whose comment names another version: refused",
          update(v1, wrongtc, NULL) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("signature 2 (key 'r2') has the trusted comment "
                                "'kiln-trust/1\\tversion:3', not 'kiln-trust/1\\tversion:2'",
                                NULL));
    char *legacy = NULL;
    if (good) {
        json_t *j = json_loads(good, 0, NULL);
        char *body = kiln_json_canonical(json_object_get(j, "policy")), *sig = NULL;
        if (body && kiln_sign_buffer(f.sk[R2], body, strlen(body), "kiln-trust/1\tversion:2",
                                     KILN_SIGN_LEGACY, &sig) == KILN_OK)
            legacy = doc_edit(good, 1, sig, 0);
        free(body), free(sig);
        json_decref(j);
    }
    CHECK("a legacy (Ed) signature: refused",
          update(v1, legacy, NULL) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("signature 2 is algorithm 'Ed'", NULL));

    /* a new version with no root keys could never be followed */
    char *noroot = policy(&f, 2, 0, "b:promote"),
         *nr = sign_raw(&f, noroot, (int[]){R1, R2, -1}, "kiln-trust/1\tversion:2");
    CHECK("a version without root keys: refused",
          update(v1, nr, NULL) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("version 2 has no root keys", NULL));
    /* a plain policy is not a version */
    CHECK("a plain policy as the next version: refused as not signed",
          update(v1, p, NULL) == KILN_ERR_FORMAT && kiln_test_msg_has("is a plain trust policy",
                                                                      NULL));
    free(one), free(twice), free(foreign), free(nonroot), free(good), free(tampered);
    free(wrongtc), free(legacy), free(noroot), free(nr), free(p);
out:
    kiln_sign_trust_free(v1);
    fx_free(&f);
}

/* A rotation: r2 out, r3 in. Both quorums must be met: the old by the old keys (r2 counts
 * there only), the new by the new keys (r3 counts there only). */
KILN_TEST(sign_trust_update_rotation_needs_both_quorums) {
    fx f;
    kiln_sign_trust *v1 = NULL;
    if (!CHECK("keys", fx_init(&f)) || !CHECK("v1", (v1 = v1_policy(&f)))) goto out;
    char *p = policy(&f, 2, 2, "r1:root r3:root a:promote b:promote");
    kiln_sign_trust_update_result res;
    char *old_only = sign_by(&f, p, (int[]){R1, R2, -1});
    CHECK("the old quorum alone: refused (r2 counts for version 1 only)",
          update(v1, old_only, &res) == KILN_ERR_VERIFY && res.nold == 2 && res.nnew == 1 &&
              kiln_test_msg_has("needs 2 distinct root keys of version 2, signed by 1 ('r1')",
                                NULL));
    char *new_only = sign_by(&f, p, (int[]){R1, R3, -1});
    CHECK("the new quorum alone: refused (r3 counts for version 2 only)",
          update(v1, new_only, &res) == KILN_ERR_VERIFY && res.nold == 1 &&
              kiln_test_msg_has("needs 2 distinct root keys of version 1, signed by 1 ('r1')",
                                NULL));
    char *both = sign_by(&f, p, (int[]){R1, R2, R3, -1});
    CHECK("both quorums: accepted", update(v1, both, &res) == KILN_OK && res.nold == 2 &&
                                        res.nnew == 2);
    CHECK("r2 toward the old quorum only, r3 toward the new only",
          res.sigs[1].old_root && !res.sigs[1].new_root && !res.sigs[2].old_root &&
              res.sigs[2].new_root && !strcmp(res.sigs[2].name, "r3"));
    /* A key id kept with another public key counts only where its key verifies it. */
    kiln_sign_pubkey fake;
    char fake_b64[KILN_SIGN_PUBKEY_B64];
    CHECK("decode", kiln_sign_pubkey_from_base64(f.b64[R3], "r3", &fake) == KILN_OK);
    kiln_sign_pubkey r2;
    CHECK("decode", kiln_sign_pubkey_from_base64(f.b64[R2], "r2", &r2) == KILN_OK);
    memcpy(fake.keyid, r2.keyid, sizeof fake.keyid); /* r2's id, r3's key */
    kiln_sign_pubkey_base64(&fake, fake_b64);
    char *swapped = kiln_asprintf(
        "{\"format\":\"kiln-trust/1\",\"version\":2,\"root_threshold\":2,\"keys\":["
        "{\"name\":\"r1\",\"pubkey\":\"%s\",\"roles\":[\"root\"]},"
        "{\"name\":\"r2\",\"pubkey\":\"%s\",\"roles\":[\"root\"]}],\"channels\":{}}",
        f.b64[R1], fake_b64);
    char *sw = sign_by(&f, swapped, (int[]){R1, R2, -1});
    CHECK("r2's signature does not count for a version that gives its id another key",
          update(v1, sw, &res) == KILN_ERR_VERIFY && res.nold == 2 && res.nnew == 1 &&
              res.sigs[1].old_root && !res.sigs[1].new_root &&
              kiln_test_msg_has("needs 2 distinct root keys of version 2", NULL));
    free(p), free(old_only), free(new_only), free(both), free(swapped), free(sw);
out:
    kiln_sign_trust_free(v1);
    fx_free(&f);
}

KILN_TEST(sign_trust_diff_names_each_change) {
    fx f;
    if (!CHECK("keys", fx_init(&f))) goto out;
    char *pa = kiln_asprintf(
        "{\"format\":\"kiln-trust/1\",\"root_threshold\":1,\"keys\":["
        "{\"name\":\"r1\",\"pubkey\":\"%s\",\"roles\":[\"root\"]},"
        "{\"name\":\"a\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]},"
        "{\"name\":\"b\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]}],"
        "\"channels\":{\"production\":{\"threshold\":2},\"staging\":{\"threshold\":1}}}",
        f.b64[R1], f.b64[PA], f.b64[PB]);
    char *pb = kiln_asprintf(
        "{\"format\":\"kiln-trust/1\",\"version\":2,\"root_threshold\":2,\"keys\":["
        "{\"name\":\"r1\",\"pubkey\":\"%s\",\"roles\":[\"root\"]},"
        "{\"name\":\"r2\",\"pubkey\":\"%s\",\"roles\":[\"root\"]},"
        "{\"name\":\"b\",\"pubkey\":\"%s\",\"roles\":[\"promote\",\"release\"]},"
        "{\"name\":\"x\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]}],"
        "\"channels\":{\"production\":{\"threshold\":1},\"canary\":{\"threshold\":1}},"
        "\"accept_unvalidated\":true}",
        f.b64[R1], f.b64[R2], f.b64[R3], f.b64[X]);
    kiln_sign_trust *a = parse(pa, "a"), *b = parse(pb, "b");
    char *d = a && b ? kiln_sign_trust_diff(a, b) : NULL;
    const char *want[] = {"key 'a' (",
                          ") removed (promote)\n",
                          "key 'b': public key replaced (",
                          "roles promote -> release, promote\n",
                          "key 'r2' (",
                          ") added (root)\n",
                          "key 'x' (",
                          "root_threshold 1 -> 2\n",
                          "accept_unvalidated false -> true\n",
                          "channel 'production': threshold 2 -> 1\n",
                          "channel 'staging' removed (threshold 1)\n",
                          "channel 'canary' added (threshold 1)\n"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(want); i++)
        if (!CHECK("the change is described", d && strstr(d, want[i])))
            fprintf(stderr, "    missing '%s' in:\n%s", want[i], d ? d : "(null)");
    char *same = a ? kiln_sign_trust_diff(a, a) : NULL;
    CHECK("no change: empty", same && !strcmp(same, ""));
    free(d), free(same), free(pa), free(pb);
    kiln_sign_trust_free(a), kiln_sign_trust_free(b);
out:
    fx_free(&f);
}

/* ---- an attacker's signatures ---- */

/* sig with the key id of pk in its signature line. Caller frees. */
static char *relabel_id(const char *sig, const kiln_sign_pubkey *pk) {
    const char *l2 = strchr(sig, '\n'), *e2 = l2 ? strchr(l2 + 1, '\n') : NULL;
    uint8_t bin[2 + KILN_SIGN_KEYID_BYTES + 64];
    size_t n = 0;
    if (!e2 || sodium_base642bin(bin, sizeof bin, l2 + 1, (size_t)(e2 - l2 - 1), NULL, &n, NULL,
                                 sodium_base64_VARIANT_ORIGINAL) != 0 ||
        n != sizeof bin)
        return NULL;
    memcpy(bin + 2, pk->keyid, KILN_SIGN_KEYID_BYTES);
    char b[sodium_base64_ENCODED_LEN(sizeof bin, sodium_base64_VARIANT_ORIGINAL)];
    sodium_bin2base64(b, sizeof b, bin, sizeof bin, sodium_base64_VARIANT_ORIGINAL);
    return kiln_asprintf("%.*s%s%s", (int)(l2 - sig + 1), sig, b, e2);
}

/* sig (a minisign signature's text, freed here) with its key id replaced by that of the
 * public key b64: the key id is not covered by the signature, so anyone can relabel one.
 * Caller frees. */
static char *relabel(char *sig, const char *b64) {
    char *out = NULL;
    kiln_sign_pubkey pk;
    if (sig && kiln_sign_pubkey_from_base64(b64, "k", &pk) == KILN_OK) out = relabel_id(sig, &pk);
    free(sig);
    return out;
}

/* Signature i of a signed document. Caller frees. */
static char *sig_at(const char *doc, size_t i) {
    json_t *j = doc ? json_loads(doc, 0, NULL) : NULL;
    const char *s = json_string_value(json_array_get(json_object_get(j, "signatures"), i));
    char *out = s ? kiln_strdup(s) : NULL;
    json_decref(j);
    return out;
}

/* doc with sig appended to its signatures (n times). Caller frees. */
static char *with_sig(const char *doc, const char *sig, int n) {
    json_t *j = doc && sig ? json_loads(doc, 0, NULL) : NULL;
    for (int i = 0; j && i < n; i++)
        json_array_append_new(json_object_get(j, "signatures"), json_string(sig));
    char *out = j ? json_dumps(j, JSON_SORT_KEYS) : NULL;
    json_decref(j);
    return out;
}

/* b64 with the key id of other: the same Ed25519 key under another id. */
static void with_id(const char *b64, const char *other, char out[KILN_SIGN_PUBKEY_B64]) {
    kiln_sign_pubkey pk, o;
    out[0] = 0;
    if (kiln_sign_pubkey_from_base64(b64, "k", &pk) != KILN_OK ||
        kiln_sign_pubkey_from_base64(other, "o", &o) != KILN_OK)
        return;
    memcpy(pk.keyid, o.keyid, KILN_SIGN_KEYID_BYTES);
    kiln_sign_pubkey_base64(&pk, out);
}

/* A signature counts toward a quorum only by a key that holds the root role in that version
 * and whose own public key verifies it; a key counts once per quorum, whatever ids its
 * signatures carry. */
KILN_TEST(sign_trust_update_counts_each_key_once_per_quorum) {
    fx f;
    kiln_sign_trust *v1 = NULL;
    kiln_sign_trust_update_result res;
    if (!CHECK("keys", fx_init(&f)) || !CHECK("v1", (v1 = v1_policy(&f)))) goto out;
    const char *tc = "kiln-trust/1\tversion:2";

    /* r2 root in version 1, only promote in version 2 */
    char *p = policy(&f, 2, 2, "r1:root r3:root r2:promote b:promote");
    char *d = sign_raw(&f, p, (int[]){R1, R2, -1}, tc), *d3 = sign_raw(&f, p, (int[]){R1, R2, R3, -1}, tc);
    CHECK("r2 demoted to promote counts for the old quorum, not the new",
          update(v1, d, &res) == KILN_ERR_VERIFY && res.nold == 2 && res.nnew == 1 &&
              kiln_test_msg_has("needs 2 distinct root keys of version 2, signed by 1 ('r1')",
                                NULL));
    CHECK("with r3: both quorums", update(v1, d3, &res) == KILN_OK && res.sigs[1].old_root &&
                                       !res.sigs[1].new_root);
    free(p), free(d), free(d3);

    /* a promote in version 1, root in version 2: it counts for the new quorum only */
    p = policy(&f, 2, 2, "r1:root a:root,promote b:promote");
    d = sign_raw(&f, p, (int[]){R1, PA, -1}, tc);
    CHECK("a promoted to root does not count for version 1's quorum",
          update(v1, d, &res) == KILN_ERR_VERIFY && res.nold == 1 && res.nnew == 2 &&
              kiln_test_msg_has("needs 2 distinct root keys of version 1, signed by 1 ('r1')",
                                NULL));
    free(p), free(d);

    /* version 2 binds r1's key id to r3's public key: r3's signature relabelled with r1's id
     * verifies under version 2's key only */
    char r3_as_r1[KILN_SIGN_PUBKEY_B64];
    with_id(f.b64[R3], f.b64[R1], r3_as_r1);
    p = kiln_asprintf("{\"format\":\"kiln-trust/1\",\"version\":2,\"root_threshold\":2,\"keys\":["
                      "{\"name\":\"r1\",\"pubkey\":\"%s\",\"roles\":[\"root\"]},"
                      "{\"name\":\"r2\",\"pubkey\":\"%s\",\"roles\":[\"root\"]}],\"channels\":{}}",
                      r3_as_r1, f.b64[R2]);
    char *by3 = sign_raw(&f, p, (int[]){R3, -1}, tc), *s3 = relabel(sig_at(by3, 0), f.b64[R1]);
    char *only = sign_raw(&f, p, (int[]){R2, -1}, tc), *all = sign_raw(&f, p, (int[]){R1, R2, -1}, tc);
    char *d2 = with_sig(only, s3, 1), *d4 = with_sig(all, s3, 1);
    CHECK("r3's key under r1's id: counts for version 2 only (r2 + it: version 1 short)",
          update(v1, d2, &res) == KILN_ERR_VERIFY && res.nold == 1 && res.nnew == 2 &&
              !res.sigs[1].old_root && res.sigs[1].new_root &&
              kiln_test_msg_has("needs 2 distinct root keys of version 1, signed by 1 ('r2')",
                                NULL));
    CHECK("r1's own signature beside it does not count for version 2 (another key there)",
          update(v1, all, &res) == KILN_ERR_VERIFY && res.nold == 2 && res.nnew == 1 &&
              res.sigs[0].old_root && !res.sigs[0].new_root);
    CHECK("r1, r2 and r3-as-r1: both quorums, each holder once per quorum",
          update(v1, d4, &res) == KILN_OK && res.nsigs == 3 && res.nold == 2 && res.nnew == 2);
    free(p), free(by3), free(s3), free(only), free(d2), free(d4), free(all);

    /* version 2 gives r2's public key a new id: r2's signature under its old id counts for
     * version 1, relabelled with the new id for version 2; one holder, once in each */
    char r2_new[KILN_SIGN_PUBKEY_B64];
    with_id(f.b64[R2], f.b64[X], r2_new);
    p = kiln_asprintf("{\"format\":\"kiln-trust/1\",\"version\":2,\"root_threshold\":2,\"keys\":["
                      "{\"name\":\"r1\",\"pubkey\":\"%s\",\"roles\":[\"root\"]},"
                      "{\"name\":\"r2b\",\"pubkey\":\"%s\",\"roles\":[\"root\"]}],\"channels\":{}}",
                      f.b64[R1], r2_new);
    d = sign_raw(&f, p, (int[]){R1, R2, -1}, tc);
    char *s2 = relabel(sig_at(d, 1), f.b64[X]), *d5 = with_sig(d, s2, 1), *d6 = with_sig(d, s2, 2);
    CHECK("r2 under its old id: version 2's quorum short",
          update(v1, d, &res) == KILN_ERR_VERIFY && res.nold == 2 && res.nnew == 1);
    CHECK("with the copy under the new id: accepted, r2 once in each quorum",
          update(v1, d5, &res) == KILN_OK && res.nold == 2 && res.nnew == 2);
    CHECK("the copy twice still counts once",
          update(v1, d6, &res) == KILN_OK && res.nsigs == 4 && res.nnew == 2);
    free(p), free(d), free(s2), free(d5), free(d6);

    /* one key under two names and ids in one version: refused as it is read */
    char r1_x[KILN_SIGN_PUBKEY_B64];
    with_id(f.b64[R1], f.b64[X], r1_x);
    p = kiln_asprintf("{\"format\":\"kiln-trust/1\",\"version\":2,\"root_threshold\":2,\"keys\":["
                      "{\"name\":\"r1\",\"pubkey\":\"%s\",\"roles\":[\"root\"]},"
                      "{\"name\":\"r1b\",\"pubkey\":\"%s\",\"roles\":[\"root\"]}],\"channels\":{}}",
                      f.b64[R1], r1_x);
    d = sign_raw(&f, p, (int[]){R1, -1}, tc);
    char *s1 = relabel(sig_at(d, 0), f.b64[X]), *d7 = with_sig(d, s1, 1);
    CHECK("one public key as two root keys of version 2: refused",
          update(v1, d7, &res) == KILN_ERR_FORMAT &&
              kiln_test_msg_has("keys 'r1' and 'r1b' are the same public key", NULL));
    free(p), free(d), free(s1), free(d7);
out:
    kiln_sign_trust_free(v1);
    fx_free(&f);
}

/* Numbers read strictly (integers only, in range) and the signature covering the policy's
 * meaning: its canonical form is made from what was parsed, so the same policy written with
 * escapes, in another key order or layout verifies, a key written twice (even once escaped)
 * is refused, and the canonical text reads back as the same policy. */
KILN_TEST(sign_trust_numbers_and_canonical_form) {
    fx f;
    kiln_sign_trust *v1 = NULL;
    if (!CHECK("keys", fx_init(&f)) || !CHECK("v1", (v1 = v1_policy(&f)))) goto out;
    struct {
        const char *version, *root_threshold, *want;
    } bad[] = {
        {"0", "2", "version 0 must be between 1 and 2^53-1"},
        {"-0", "2", "version 0 must be between 1 and 2^53-1"},
        {"2.0", "2", "'version' must be an integer"},
        {"2e0", "2", "'version' must be an integer"},
        {"9007199254740992", "2", "must be between 1 and 2^53-1"},
        {"18446744073709551617", "2", "too big"},
        {"2", "0", "root_threshold 0 must be at least 1"},
        {"2", "2.0", "'root_threshold' must be an integer"},
        {"2", "3", "root_threshold 3 can never be met: the policy has 2 root keys"},
        {"2", NULL, "2 keys hold the \"root\" role but 'root_threshold' is missing"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        char th[64] = "";
        if (bad[i].root_threshold)
            snprintf(th, sizeof th, ",\"root_threshold\":%s", bad[i].root_threshold);
        char *p = kiln_asprintf(
            "{\"format\":\"kiln-trust/1\",\"version\":%s%s,\"keys\":["
            "{\"name\":\"r1\",\"pubkey\":\"%s\",\"roles\":[\"root\"]},"
            "{\"name\":\"r2\",\"pubkey\":\"%s\",\"roles\":[\"root\"]}],\"channels\":{}}",
            bad[i].version, th, f.b64[R1], f.b64[R2]);
        kiln_sign_trust *t = NULL;
        kiln_err rc = p ? kiln_sign_trust_parse(p, strlen(p), "n.json", &t) : KILN_OK;
        CHECK("refused", rc == KILN_ERR_FORMAT && !t);
        if (!CHECK("the message names the file and the problem",
                   kiln_test_msg_has("n.json", bad[i].want)))
            fprintf(stderr, "    case %zu: %s\n", i, kiln_errmsg());
        kiln_sign_trust_free(t);
        free(p);
    }
    char *p = policy(&f, 2, 2, "r1:root r2:root b:promote"),
         *doc = sign_by(&f, p, (int[]){R1, R2, -1});
    json_t *j = doc ? json_loads(doc, 0, NULL) : NULL;
    const char *s1 = json_string_value(json_array_get(json_object_get(j, "signatures"), 0)),
               *s2 = json_string_value(json_array_get(json_object_get(j, "signatures"), 1));
    /* The same policy, by hand: other key order, layout, every name and pubkey character
     * escaped where JSON allows it. */
    char esc[3][KILN_SIGN_PUBKEY_B64 * 6];
    const int which[3] = {R1, R2, PB};
    for (int k = 0; k < 3; k++) {
        size_t n = 0;
        for (const char *c = f.b64[which[k]]; *c; c++)
            n += (size_t)snprintf(esc[k] + n, sizeof esc[k] - n, "\\u%04x", (unsigned)*c);
    }
    char *sigs = s1 && s2 ? json_dumps(json_object_get(j, "signatures"), 0) : NULL;
    char *same = sigs ? kiln_asprintf(
                            "{ \"signatures\" : %s ,\n \"policy\" : {\n"
                            "  \"channels\": {\"\\u0070roduction\": {\"threshold\": 1}},\n"
                            "  \"keys\": [{\"roles\": [\"root\"], \"pubkey\": \"%s\", \"name\": "
                            "\"\\u0072\\u0031\"},\n"
                            "   {\"pubkey\": \"%s\", \"name\": \"r2\", \"roles\": [\"r\\u006fot\"]},\n"
                            "   {\"name\": \"b\", \"roles\": [\"promote\"], \"pubkey\": \"%s\"}],\n"
                            "  \"root_threshold\": 2, \"version\": 2, \"format\": "
                            "\"kiln-trust\\/1\"}}",
                            sigs, esc[0], esc[1], esc[2])
                      : NULL;
    kiln_sign_trust *next = NULL;
    CHECK("the same policy written otherwise verifies (its meaning is what is signed)",
          same && kiln_sign_trust_update(v1, same, strlen(same), "same.json", &next, NULL) ==
                      KILN_OK);
    /* Its canonical text reads back as the same policy. */
    json_t *sj = same ? json_loads(same, 0, NULL) : NULL;
    char *canon = sj ? kiln_json_canonical(json_object_get(sj, "policy")) : NULL;
    kiln_sign_trust *back = canon ? parse(canon, "canonical") : NULL;
    char *diff = back && next ? kiln_sign_trust_diff(next, back) : NULL;
    CHECK("the canonical text is the same policy",
          diff && !strcmp(diff, "") && kiln_sign_trust_version(back) == 2);
    /* A channel given twice, once escaped: refused before any signature is looked at. */
    char *twice = sigs ? kiln_asprintf("{\"signatures\":%s,\"policy\":{\"format\":\"kiln-trust/1\","
                                       "\"version\":2,\"root_threshold\":2,\"keys\":["
                                       "{\"name\":\"r1\",\"pubkey\":\"%s\",\"roles\":[\"root\"]},"
                                       "{\"name\":\"r2\",\"pubkey\":\"%s\",\"roles\":[\"root\"]},"
                                       "{\"name\":\"b\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]}"
                                       "],\"channels\":{\"production\":{\"threshold\":1},"
                                       "\"\\u0070roduction\":{\"threshold\":2}}}}",
                                       sigs, f.b64[R1], f.b64[R2], f.b64[PB])
                       : NULL;
    kiln_sign_trust *t2 = NULL;
    CHECK("a key given twice, once escaped: refused",
          twice && kiln_sign_trust_update(v1, twice, strlen(twice), "twice.json", &t2, NULL) ==
                       KILN_ERR_FORMAT &&
              !t2 && kiln_test_msg_has("twice.json", "duplicate"));
    kiln_sign_trust_free(next), kiln_sign_trust_free(back), kiln_sign_trust_free(t2);
    json_decref(j), json_decref(sj);
    free(p), free(doc), free(sigs), free(same), free(canon), free(diff), free(twice);
out:
    kiln_sign_trust_free(v1);
    fx_free(&f);
}

/* "withdrawn": archives no client installs, whatever signed them. Each entry a digest and a
 * reason; refused when malformed; looked up by digest; described by the diff. */
KILN_TEST(sign_trust_withdrawn) {
    fx f;
    if (!CHECK("keys", fx_init(&f))) goto out;
    const char *d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111",
               *d2 = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
    char *plain = kiln_asprintf("{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"a\",\"pubkey\":"
                                "\"%s\",\"roles\":[\"promote\"]}],\"channels\":{}}",
                                f.b64[PA]);
    char *with = kiln_asprintf(
        "{\"format\":\"kiln-trust/1\",\"version\":2,\"keys\":[{\"name\":\"a\",\"pubkey\":\"%s\","
        "\"roles\":[\"promote\"]}],\"channels\":{},\"withdrawn\":[{\"digest\":\"%s\",\"reason\":"
        "\"leaks the label\"},{\"digest\":\"%s\",\"reason\":\"trained on the wrong feed\"}]}",
        f.b64[PA], d1, d2);
    kiln_sign_trust *a = parse(plain, "a"), *b = parse(with, "b");
    const char *why = NULL;
    CHECK("parsed", a && b);
    CHECK("none withdrawn by default",
          a && kiln_sign_trust_withdrawn_count(a) == 0 && !kiln_sign_trust_withdrawn(a, d1));
    CHECK("looked up by digest", b && kiln_sign_trust_withdrawn_count(b) == 2 &&
                                     !strcmp(kiln_sign_trust_withdrawn(b, d1), "leaks the label") &&
                                     !kiln_sign_trust_withdrawn(b, "sha256:33") &&
                                     !strcmp(kiln_sign_trust_withdrawn_at(b, 1, &why), d2) &&
                                     !strcmp(why, "trained on the wrong feed"));
    char *d = a && b ? kiln_sign_trust_diff(a, b) : NULL,
         *back = a && b ? kiln_sign_trust_diff(b, a) : NULL;
    CHECK("the diff names each", d && strstr(d, "withdraws sha256:1111") &&
                                     strstr(d, ": leaks the label\n") &&
                                     strstr(d, "withdraws sha256:2222"));
    CHECK("and the way back", back && strstr(back, "no longer withdraws sha256:1111"));
    struct {
        const char *entries, *msg;
    } bad[] = {
        {"{}", "withdrawn' must be an array"},
        {"[1]", "withdrawn[0] is not an object"},
        {"[{\"digest\":\"sha256:11\",\"reason\":\"r\"}]", "'digest' must be an archive's"},
        {"[{\"digest\":\"SHA256:1111111111111111111111111111111111111111111111111111111111111111\","
         "\"reason\":\"r\"}]",
         "'digest' must be an archive's"},
        {"[{\"digest\":\"sha256:111111111111111111111111111111111111111111111111111111111111111F\","
         "\"reason\":\"r\"}]",
         "'digest' must be an archive's"},
        {"[{\"digest\":\"sha256:1111111111111111111111111111111111111111111111111111111111111111\"}"
         "]",
         "'reason' must be 1 to"},
        {"[{\"digest\":\"sha256:1111111111111111111111111111111111111111111111111111111111111111\","
         "\"reason\":\"\"}]",
         "'reason' must be 1 to"},
        {"[{\"digest\":\"sha256:1111111111111111111111111111111111111111111111111111111111111111\","
         "\"reason\":\"a\\u001bb\"}]",
         "'reason' must be 1 to"},
        {"[{\"digest\":\"sha256:1111111111111111111111111111111111111111111111111111111111111111\","
         "\"reason\":\"r\",\"by\":\"me\"}]",
         "by"},
        {"[{\"digest\":\"sha256:1111111111111111111111111111111111111111111111111111111111111111\","
         "\"reason\":\"r\"},{\"digest\":\"sha256:1111111111111111111111111111111111111111111111111"
         "111111111111111\",\"reason\":\"again\"}]",
         "is withdrawn twice"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        char *doc =
            kiln_asprintf("{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"a\",\"pubkey\":"
                          "\"%s\",\"roles\":[\"promote\"]}],\"channels\":{},\"withdrawn\":%s}",
                          f.b64[PA], bad[i].entries);
        kiln_sign_trust *t = NULL;
        kiln_err rc = doc ? kiln_sign_trust_parse(doc, strlen(doc), "w.json", &t) : KILN_ERR_NOMEM;
        if (!CHECK("a malformed entry is refused, naming the file and the problem",
                   rc == KILN_ERR_FORMAT && !t && kiln_test_msg_has("w.json", bad[i].msg)))
            fprintf(stderr, "    %s: %s\n", bad[i].entries, kiln_errmsg());
        kiln_sign_trust_free(t);
        free(doc);
    }
    free(d), free(back), free(plain), free(with);
    kiln_sign_trust_free(a), kiln_sign_trust_free(b);
out:
    fx_free(&f);
}

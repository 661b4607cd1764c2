/* test_sign_record.c - the trust policy and signed channel records: thresholds with
 * distinct keys, roles, expiry, rollback, strict parsing; the archive's trusted comment. */
#include <stdlib.h>
#include <string.h>

#include "sign.h"
#include "test.h"
#include "testutil.h"

#define NKEYS 4 /* 0: release+promote, 1 and 2: promote, 3: release only */

typedef struct fixture {
    kiln_sign_seckey *sk[NKEYS];
    char b64[NKEYS][KILN_SIGN_PUBKEY_B64];
    kiln_sign_trust *trust;
} fixture;

static bool fixture_init(fixture *f) {
    memset(f, 0, sizeof *f);
    for (int i = 0; i < NKEYS; i++)
        if (!kiln_test_keypair(&f->sk[i], f->b64[i])) return false;
    char *json = kiln_asprintf(
        "{\"format\": \"kiln-trust/1\", \"keys\": ["
        "{\"name\": \"alice\", \"pubkey\": \"%s\", \"roles\": [\"release\", \"promote\"]},"
        "{\"name\": \"bob\", \"pubkey\": \"%s\", \"roles\": [\"promote\"]},"
        "{\"name\": \"carol\", \"pubkey\": \"%s\", \"roles\": [\"promote\"]},"
        "{\"name\": \"ci\", \"pubkey\": \"%s\", \"roles\": [\"release\"]}],"
        "\"channels\": {\"production\": {\"threshold\": 2}, \"staging\": {\"threshold\": 1}}}",
        f->b64[0], f->b64[1], f->b64[2], f->b64[3]);
    kiln_err rc =
        json ? kiln_sign_trust_parse(json, strlen(json), "trust.json", &f->trust) : KILN_ERR_NOMEM;
    free(json);
    return rc == KILN_OK;
}

static void fixture_release(fixture *f) {
    for (int i = 0; i < NKEYS; i++)
        kiln_sign_seckey_free(f->sk[i]);
    kiln_sign_trust_free(f->trust);
}

static const uint8_t digest[32] = {0xab, 0xcd, 1, 2, 3};
#define T0 1800000000 /* 2027-01-15T08:00:00Z */

/* r must be initialised; any previous content is released. */
static bool make_record(kiln_sign_record *r, const char *channel, uint64_t seq) {
    return kiln_sign_record_set(r, "alpha-moe", channel, "1.4.0", digest, seq, T0 + 86400,
                                "weekly retrain") == KILN_OK;
}

KILN_TEST(sign_trust_policy_parses) {
    fixture f;
    if (!CHECK("fixture", fixture_init(&f))) goto out;
    CHECK("four keys", kiln_sign_trust_key_count(f.trust) == 4);
    const kiln_sign_trust_key *k = kiln_sign_trust_key_at(f.trust, 1);
    CHECK("names and roles kept",
          k && !strcmp(k->name, "bob") && k->roles == KILN_SIGN_ROLE_PROMOTE);
    CHECK("found by key id", k && kiln_sign_trust_find(f.trust, k->pub.keyid) == k);
    int th = 0;
    CHECK("production needs 2",
          kiln_sign_trust_threshold(f.trust, "production", &th) == KILN_OK && th == 2);
    CHECK("staging needs 1",
          kiln_sign_trust_threshold(f.trust, "staging", &th) == KILN_OK && th == 1);
    CHECK("unknown channel",
          kiln_sign_trust_threshold(f.trust, "canary", &th) == KILN_ERR_NOTFOUND &&
              strstr(kiln_errmsg(), "'canary'") && strstr(kiln_errmsg(), "trust.json"));
out:
    fixture_release(&f);
}

KILN_TEST(sign_trust_policy_strict) {
    fixture f;
    if (!CHECK("fixture", fixture_init(&f))) goto out;
    const char *a = f.b64[0], *b = f.b64[1];
    /* The same Ed25519 key under another key id: decode, change the id, encode. */
    kiln_sign_pubkey pk;
    char other_id[KILN_SIGN_PUBKEY_B64];
    CHECK("decode", kiln_sign_pubkey_from_base64(b, "b", &pk) == KILN_OK);
    pk.keyid[0] ^= 1;
    kiln_sign_pubkey_base64(&pk, other_id);
    struct {
        char *json;
        const char *want;
    } bad[] = {
        {kiln_asprintf("{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"a\",\"pubkey\":\"%s\","
                       "\"roles\":[\"promote\"],\"colour\":1}],\"channels\":{}}",
                       a),
         "unknown field 'colour'"},
        {kiln_asprintf("{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"a\",\"pubkey\":\"%s\","
                       "\"roles\":[\"promote\"]}],\"channels\":{},\"extra\":true}",
                       a),
         "unknown field 'extra'"},
        {kiln_asprintf("{\"format\":\"kiln-trust/2\",\"keys\":[],\"channels\":{}}"), "'format'"},
        {kiln_asprintf(
             "{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"a\",\"pubkey\":\"%s\","
             "\"roles\":[\"promote\"]},{\"name\":\"a\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]}],"
             "\"channels\":{}}",
             a, b),
         "key name 'a' appears twice"},
        {kiln_asprintf(
             "{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"a\",\"pubkey\":\"%s\","
             "\"roles\":[\"promote\"]},{\"name\":\"b\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]}],"
             "\"channels\":{}}",
             a, a),
         "same key id"},
        {kiln_asprintf("{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"b\",\"pubkey\":\"%s\","
                       "\"roles\":[\"promote\"]},{\"name\":\"b2\",\"pubkey\":\"%s\",\"roles\":["
                       "\"promote\"]}],"
                       "\"channels\":{\"p\":{\"threshold\":2}}}",
                       b, other_id),
         "same public key"},
        {kiln_asprintf("{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"a\",\"pubkey\":\"%s\","
                       "\"roles\":[\"promote\"]}],\"channels\":{\"p\":{\"threshold\":0}}}",
                       a),
         "threshold 0 must be at least 1"},
        {kiln_asprintf(
             "{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"a\",\"pubkey\":\"%s\","
             "\"roles\":[\"promote\"]},{\"name\":\"b\",\"pubkey\":\"%s\",\"roles\":[\"release\"]}],"
             "\"channels\":{\"p\":{\"threshold\":2}}}",
             a, b),
         "can never be met: the policy has 1 promote key"},
        {kiln_asprintf("{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"a\",\"pubkey\":\"%s\","
                       "\"roles\":[\"admin\"]}],\"channels\":{}}",
                       a),
         "unknown role 'admin'"},
        {kiln_asprintf("{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"a\",\"pubkey\":\"%s\","
                       "\"roles\":[\"promote\",\"promote\"]}],\"channels\":{}}",
                       a),
         "listed twice"},
        {kiln_asprintf("{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"a\",\"pubkey\":\"RWQ\","
                       "\"roles\":[\"promote\"]}],\"channels\":{}}"),
         "not the base64"},
        {kiln_asprintf("{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"a b\",\"pubkey\":\"%s\","
                       "\"roles\":[\"promote\"]}],\"channels\":{}}",
                       a),
         "'name' must be a name"},
        {kiln_asprintf("{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"a\",\"pubkey\":\"%s\","
                       "\"roles\":[\"promote\"]}],\"channels\":{\"p\":{\"threshold\":1},\"p\":{"
                       "\"threshold\":1}}}",
                       a),
         "duplicate"},
        {kiln_asprintf("{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"a\",\"pubkey\":\"%s\","
                       "\"roles\":[\"promote\"]}],\"channels\":{\"p\":{\"threshold\":1.5}}}",
                       a),
         "must be an integer"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        kiln_sign_trust *t = NULL;
        kiln_err rc = bad[i].json
                          ? kiln_sign_trust_parse(bad[i].json, strlen(bad[i].json), "pol.json", &t)
                          : KILN_OK;
        CHECK("refused", rc == KILN_ERR_FORMAT && !t);
        CHECK("message names the file", strstr(kiln_errmsg(), "pol.json") != NULL);
        if (!CHECK("message names the problem", strstr(kiln_errmsg(), bad[i].want) != NULL))
            fprintf(stderr, "    case %zu: %s\n", i, kiln_errmsg());
        kiln_sign_trust_free(t);
        free(bad[i].json);
    }
out:
    fixture_release(&f);
}

/* The canonical body, byte for byte: sorted keys, no white space, the format inside. */
KILN_TEST(sign_record_canonical_body) {
    kiln_sign_record r;
    kiln_sign_record_init(&r);
    if (!CHECK("record", make_record(&r, "production", 7))) return;
    char *body = NULL;
    size_t len = 0;
    CHECK("body", kiln_sign_record_body(&r, &body, &len) == KILN_OK);
    const char *want =
        "{\"channel\":\"production\",\"digest\":\"sha256:abcd010203000000000000000000000000000000"
        "000000000000000000000000\",\"expires\":\"2027-01-16T08:00:00Z\",\"format\":\"kiln-channel/"
        "1\","
        "\"model\":\"alpha-moe\",\"reason\":\"weekly retrain\",\"seq\":7,\"version\":\"1.4.0\"}";
    CHECK("canonical bytes", body && strcmp(body, want) == 0 && len == strlen(want));
    free(body);
    kiln_sign_record_release(&r);
}

static kiln_err verify_at(const kiln_sign_record *r, const fixture *f, int64_t now,
                          uint64_t min_seq, kiln_sign_record_result *res) {
    return kiln_sign_record_verify(r, f->trust, now, min_seq, "rec.json", res);
}

KILN_TEST(sign_record_threshold_distinct_keys) {
    fixture f;
    kiln_sign_record r;
    kiln_sign_record_result res;
    kiln_sign_record_init(&r);
    if (!CHECK("fixture", fixture_init(&f)) || !CHECK("record", make_record(&r, "production", 3)))
        goto out;
    CHECK("alice signs", kiln_sign_record_add_signature(&r, f.sk[0]) == KILN_OK);
    CHECK("one of two refused", verify_at(&r, &f, T0, 0, &res) == KILN_ERR_VERIFY);
    CHECK("... saying how many", strstr(kiln_errmsg(), "needs 2 distinct promote keys") &&
                                     strstr(kiln_errmsg(), "signed by 1") &&
                                     strstr(kiln_errmsg(), "rec.json"));
    CHECK("a second signature by alice refused when adding",
          kiln_sign_record_add_signature(&r, f.sk[0]) == KILN_ERR_CONFLICT);
    /* Smuggle in alice's signature twice: it still counts once. */
    char **nv = realloc(r.sigs, 2 * sizeof *nv);
    if (!CHECK("grow", nv)) goto out;
    r.sigs = nv;
    r.sigs[1] = kiln_strdup(r.sigs[0]);
    r.nsigs = 2;
    CHECK("one key twice refused", verify_at(&r, &f, T0, 0, &res) == KILN_ERR_VERIFY);
    CHECK("... counted once", strstr(kiln_errmsg(), "counts once") && res.nsigners == 1);
    free(r.sigs[1]);
    r.nsigs = 1;
    CHECK("bob signs", kiln_sign_record_add_signature(&r, f.sk[1]) == KILN_OK);
    CHECK("two distinct promote keys pass", verify_at(&r, &f, T0, 0, &res) == KILN_OK);
    CHECK("signers reported", res.nsigners == 2 && res.threshold == 2 &&
                                  !strcmp(res.signers[0]->name, "alice") &&
                                  !strcmp(res.signers[1]->name, "bob"));
    CHECK("carol signs too", kiln_sign_record_add_signature(&r, f.sk[2]) == KILN_OK);
    CHECK("three of two pass", verify_at(&r, &f, T0, 0, &res) == KILN_OK && res.nsigners == 3);

    /* Save, load: the same record verifies. */
    char *path = kiln_test_path("rec.json");
    kiln_sign_record r2;
    kiln_sign_record_init(&r2);
    CHECK("save", kiln_sign_record_save(&r, path) == KILN_OK);
    CHECK("load", kiln_sign_record_load(path, &r2) == KILN_OK);
    CHECK("fields back", !strcmp(r2.model, "alpha-moe") && r2.seq == 3 &&
                             r2.expires == T0 + 86400 && !memcmp(r2.digest, digest, 32) &&
                             !strcmp(r2.reason, "weekly retrain") && r2.nsigs == 3);
    CHECK("loaded record verifies", verify_at(&r2, &f, T0, 0, NULL) == KILN_OK);

    /* Any change to the body breaks every signature. */
    r2.version[0] = '2';
    CHECK("changed version refused", verify_at(&r2, &f, T0, 0, NULL) == KILN_ERR_VERIFY &&
                                         strstr(kiln_errmsg(), "signature 1") &&
                                         strstr(kiln_errmsg(), "signature verification failed"));
    r2.version[0] = '1';
    r2.seq = 4;
    CHECK("changed seq refused", verify_at(&r2, &f, T0, 0, NULL) == KILN_ERR_VERIFY);
    kiln_sign_record_release(&r2);
    free(path);
out:
    kiln_sign_record_release(&r);
    fixture_release(&f);
}

KILN_TEST(sign_record_refuses_foreign_and_release_keys) {
    fixture f;
    kiln_sign_record r;
    kiln_sign_record_init(&r);
    kiln_sign_seckey *stranger = NULL;
    if (!CHECK("fixture", fixture_init(&f)) || !CHECK("record", make_record(&r, "staging", 1)))
        goto out;
    CHECK("stranger key", kiln_sign_seckey_generate(&stranger) == KILN_OK);
    CHECK("stranger signs", kiln_sign_record_add_signature(&r, stranger) == KILN_OK);
    CHECK("bob signs", kiln_sign_record_add_signature(&r, f.sk[1]) == KILN_OK);
    CHECK("a key not in the policy is refused", verify_at(&r, &f, T0, 0, NULL) == KILN_ERR_VERIFY);
    CHECK("... naming it",
          strstr(kiln_errmsg(), "signature 1") && strstr(kiln_errmsg(), "not in the trust policy"));
    CHECK("record", make_record(&r, "staging", 1));
    CHECK("ci signs", kiln_sign_record_add_signature(&r, f.sk[3]) == KILN_OK);
    CHECK("a release-only key is refused", verify_at(&r, &f, T0, 0, NULL) == KILN_ERR_VERIFY);
    CHECK("... naming the role",
          strstr(kiln_errmsg(), "'ci'") && strstr(kiln_errmsg(), "'promote' role"));
    CHECK("record", make_record(&r, "canary", 1));
    CHECK("bob signs", kiln_sign_record_add_signature(&r, f.sk[1]) == KILN_OK);
    CHECK("a channel not in the policy is refused",
          verify_at(&r, &f, T0, 0, NULL) == KILN_ERR_VERIFY && strstr(kiln_errmsg(), "'canary'"));
out:
    kiln_sign_seckey_free(stranger);
    kiln_sign_record_release(&r);
    fixture_release(&f);
}

KILN_TEST(sign_record_expiry_and_rollback) {
    fixture f;
    kiln_sign_record r;
    kiln_sign_record_init(&r);
    if (!CHECK("fixture", fixture_init(&f)) || !CHECK("record", make_record(&r, "staging", 5)))
        goto out;
    CHECK("bob signs", kiln_sign_record_add_signature(&r, f.sk[1]) == KILN_OK);
    CHECK("valid before expiry", verify_at(&r, &f, T0 + 86399, 0, NULL) == KILN_OK);
    CHECK("expired at the second", verify_at(&r, &f, T0 + 86400, 0, NULL) == KILN_ERR_VERIFY);
    CHECK("... saying when", strstr(kiln_errmsg(), "expired at 2027-01-16T08:00:00Z"));
    CHECK("same seq again is fine", verify_at(&r, &f, T0, 5, NULL) == KILN_OK);
    CHECK("lower seq than accepted refused",
          verify_at(&r, &f, T0, 6, NULL) == KILN_ERR_VERIFY && strstr(kiln_errmsg(), "rollback"));
out:
    kiln_sign_record_release(&r);
    fixture_release(&f);
}

KILN_TEST(sign_record_parse_strict) {
    fixture f;
    kiln_sign_record r;
    kiln_sign_record_init(&r);
    char *text = NULL;
    if (!CHECK("fixture", fixture_init(&f)) || !CHECK("record", make_record(&r, "staging", 5)))
        goto out;
    CHECK("bob signs", kiln_sign_record_add_signature(&r, f.sk[1]) == KILN_OK);
    char *path = kiln_test_path("r.json");
    CHECK("save", kiln_sign_record_save(&r, path) == KILN_OK);
    text = kiln_read_file(path, 1 << 20, &text, &(size_t){0}) == KILN_OK ? text : NULL;
    free(path);
    if (!CHECK("read back", text)) goto out;
    static const struct {
        const char *from, *to, *want;
    } edits[] = {
        {"\"seq\": 5", "\"seq\": 0", "seq 0 must be at least 1"},
        {"\"seq\": 5", "\"seq\": \"5\"", "'seq' must be an integer"},
        {"\"reason\"", "\"why\"", "unknown field 'why'"},
        {"\"format\": \"kiln-channel/1\"", "\"format\": \"kiln-channel/9\"", "'format'"},
        {"2027-01-16T08:00:00Z", "2027-02-30T08:00:00Z", "not an RFC 3339 UTC time"},
        {"2027-01-16T08:00:00Z", "2027-01-16T08:00:00+01:00", "not an RFC 3339 UTC time"},
        {"sha256:abcd", "sha256:ABCD", "lowercase hex"},
        {"\"alpha-moe\"", "\"alpha moe\"", "model 'alpha moe'"},
        {"untrusted comment:", "untrusted remark:", "signature 1, line 1"},
        {"\"signatures\": [", "\"signatures\": [1, ", "signature 1 is not a string"},
        {"\"record\"", "\"body\"", "unknown field 'body'"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(edits); i++) {
        const char *at = strstr(text, edits[i].from);
        if (!CHECK("edit applies", at)) continue;
        char *t = kiln_asprintf("%.*s%s%s", (int)(at - text), text, edits[i].to,
                                at + strlen(edits[i].from));
        kiln_sign_record x;
        kiln_sign_record_init(&x);
        CHECK("refused", kiln_sign_record_parse(t, strlen(t), "r.json", &x) == KILN_ERR_FORMAT);
        CHECK("message names the file", strstr(kiln_errmsg(), "r.json") != NULL);
        if (!CHECK("message names the problem", strstr(kiln_errmsg(), edits[i].want) != NULL))
            fprintf(stderr, "    case %zu: %s\n", i, kiln_errmsg());
        CHECK("nothing left behind", x.nsigs == 0 && x.reason == NULL);
        kiln_sign_record_release(&x);
        free(t);
    }
out:
    free(text);
    kiln_sign_record_release(&r);
    fixture_release(&f);
}

KILN_TEST(sign_archive_comment) {
    kiln_sign_archive_info in = {.model = "alpha-moe",
                                 .version = "1.4.0",
                                 .validation = KILN_SIGN_VALIDATION_PASSED},
                           out;
    for (int i = 0; i < 32; i++)
        in.manifest_sha256[i] = (uint8_t)(i * 7);
    char *tc = kiln_sign_archive_comment(&in);
    if (!CHECK("made", tc)) return;
    CHECK("shape",
          !strncmp(tc, "kiln-archive/1\tmodel:alpha-moe\tversion:1.4.0\tmanifest:sha256:00070e15",
                   68) &&
              strlen(tc) > 18 && !strcmp(tc + strlen(tc) - 18, "\tvalidation:passed"));
    CHECK("parses back", kiln_sign_archive_comment_parse(tc, "a.kiln", &out) == KILN_OK &&
                             !strcmp(out.model, in.model) && !strcmp(out.version, in.version) &&
                             !memcmp(out.manifest_sha256, in.manifest_sha256, 32) &&
                             out.validation == KILN_SIGN_VALIDATION_PASSED &&
                             !out.allow_unvalidated);
    CHECK("other comments refused", kiln_sign_archive_comment_parse("timestamp:1\tfile:x", "a.kiln",
                                                                    &out) == KILN_ERR_FORMAT &&
                                        strstr(kiln_errmsg(), "a.kiln"));
    free(tc);
    kiln_sign_archive_info bad = {.model = "a b", .version = "1"};
    CHECK("bad names refused", kiln_sign_archive_comment(&bad) == NULL);
    in.validation = KILN_SIGN_VALIDATION_UNSET;
    CHECK("an unset verdict refused",
          kiln_sign_archive_comment(&in) == NULL && strstr(kiln_errmsg(), "verdict"));
    in.validation = KILN_SIGN_VALIDATION_ABSENT;
    CHECK("absent without allow-unvalidated refused", kiln_sign_archive_comment(&in) == NULL);
    in.allow_unvalidated = true;
    tc = kiln_sign_archive_comment(&in);
    CHECK("absent with allow-unvalidated says so",
          tc && strstr(tc, "\tvalidation:absent\tallow-unvalidated") &&
              kiln_sign_archive_comment_parse(tc, "a.kiln", &out) == KILN_OK &&
              out.validation == KILN_SIGN_VALIDATION_ABSENT && out.allow_unvalidated);
    free(tc);
    in.validation = KILN_SIGN_VALIDATION_PASSED;
    CHECK("passed with allow-unvalidated refused", kiln_sign_archive_comment(&in) == NULL);
}

KILN_TEST(sign_time_parse) {
    int64_t t = 0;
    CHECK("epoch", kiln_sign_parse_time("1970-01-01T00:00:00Z", "t", &t) == KILN_OK && t == 0);
    CHECK("leap day",
          kiln_sign_parse_time("2028-02-29T12:00:00Z", "t", &t) == KILN_OK && t == 1835438400);
    CHECK("no Feb 29 in 2027",
          kiln_sign_parse_time("2027-02-29T12:00:00Z", "t", &t) == KILN_ERR_FORMAT);
    CHECK("Z required", kiln_sign_parse_time("2027-01-01T00:00:00", "t", &t) == KILN_ERR_FORMAT);
    CHECK("hour 24 refused",
          kiln_sign_parse_time("2027-01-01T24:00:00Z", "t", &t) == KILN_ERR_FORMAT);
    CHECK("names what", kiln_sign_parse_time("soon", "--now", &t) == KILN_ERR_FORMAT &&
                            strstr(kiln_errmsg(), "--now") && strstr(kiln_errmsg(), "'soon'"));
}

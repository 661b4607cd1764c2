/* test_registry_models.c - kiln models against a real registry on loopback: the listing as the
 * registry states it, each channel's record verified on the client (and refused when its
 * signature is by a key the policy lacks, when the registry's summary lies about it, or when
 * its seq is below the client's state), --expiring, an unknown model and bad arguments, a
 * registry down before a good one; and /metrics's expiry gauge per channel, label values
 * escaped. */
#include <stdlib.h>
#include <string.h>

#include "registry_fx.h"
#include "test.h"
#include "testutil.h"

/* The registry (staging needs one promote key, production two), the keys (rel, p1, p2, a
 * stranger) and demo 1.0.0 and 1.1.0 published; staging -> 1.0.0 then 1.1.0 (expiring in
 * 2 h), production -> 1.0.0 by p1 and p2 (expiring in 30 d). */
typedef struct mfx {
    rfx reg;
    kiln_sign_seckey *k[4];
    char h1[KILN_SHA256_HEX], h2[KILN_SHA256_HEX];
    int64_t staging_expires, production_expires;
} mfx;

static bool put(mfx *f, const char *channel, const char *version, const char *hex, uint64_t seq,
                int64_t expires, kiln_sign_seckey *const *keys) {
    char *rec = rfx_record(channel, version, hex, seq, expires, "promote", keys);
    kiln_registry_client_opts c = {.url = f->reg.url, .token = f->reg.prom, .retries = 2};
    bool ok = rec && kiln_registry_put_channel(&c, "demo", channel, rec, strlen(rec)) == KILN_OK;
    free(rec);
    return ok;
}

static bool mfx_init(mfx *f) {
    memset(f, 0, sizeof *f);
    char pk[4][KILN_SIGN_PUBKEY_B64];
    if (!rfx_keys(f->k, pk, 4)) return false;
    char *t = rfx_policy(pk[0], pk[1], pk[2]);
    bool ok = t && rfx_init(&f->reg, "reg", t, KILN_SCOPE_PUBLISH | KILN_SCOPE_PROMOTE, 2, false);
    free(t);
    if (!ok) return false;
    char *a1 = rfx_archive("m1", "one", 3, RFX_CARD, "1.0.0", f->k[0], f->h1),
         *a2 = rfx_archive("m2", "two", 3, RFX_CARD, "1.1.0", f->k[0], f->h2);
    kiln_registry_client_opts c = {.url = f->reg.url, .token = f->reg.pub, .retries = 2};
    kiln_registry_published pub;
    ok = a1 && a2 && kiln_registry_publish(&c, a1, NULL, &pub) == KILN_OK &&
         kiln_registry_publish(&c, a2, NULL, &pub) == KILN_OK;
    free(a1), free(a2);
    int64_t now = kiln_unix_time();
    f->staging_expires = now + 2 * 3600;
    f->production_expires = now + 30 * 86400;
    kiln_sign_seckey *p1[] = {f->k[1], NULL}, *p12[] = {f->k[1], f->k[2], NULL};
    return ok && put(f, "staging", "1.0.0", f->h1, 1, now + 86400, p1) &&
           put(f, "staging", "1.1.0", f->h2, 2, f->staging_expires, p1) &&
           put(f, "production", "1.0.0", f->h1, 1, f->production_expires, p12);
}

static void mfx_free(mfx *f) {
    rfx_free(&f->reg);
    rfx_keys_free(f->k, 4);
}

static kiln_err list(const mfx *f, const char *model, bool trust, int64_t expiring, json_t **out) {
    kiln_registry_client_opts c = {.url = f->reg.url, .retries = 1, .backoff_ms = 20};
    kiln_registry_models_opts o = {.model = model,
                                   .trust = trust ? f->reg.trust : NULL,
                                   .state = trust ? f->reg.state : NULL,
                                   .expiring = expiring};
    return kiln_registry_models(&c, 1, &o, out);
}

static const char *s_of(const json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

static const json_t *model0(const json_t *j) {
    return json_array_get(json_object_get(j, "models"), 0);
}

/* A channel of the first model, by name. */
static const json_t *chan(const json_t *j, const char *name) {
    const json_t *cs = json_object_get(model0(j), "channels");
    for (size_t i = 0; i < json_array_size(cs); i++)
        if (!strcmp(s_of(json_array_get(cs, i), "name"), name)) return json_array_get(cs, i);
    return NULL;
}

static const char *check_of(const json_t *c, const char *key) {
    return s_of(json_object_get(c, "check"), key);
}

KILN_TEST(registry_models_lists_and_verifies) {
    mfx f;
    json_t *j = NULL;
    if (!CHECK("fixture", mfx_init(&f))) goto out;
    kiln_err rc = list(&f, NULL, false, 0, &j);
    const json_t *m = model0(j);
    CHECK("without a policy: the registry's word, said to be unchecked",
          rc == KILN_OK && j && !strcmp(s_of(j, "format"), "kiln-models/1") &&
              json_array_size(json_object_get(j, "models")) == 1 &&
              !strcmp(s_of(m, "name"), "demo") &&
              json_integer_value(json_object_get(m, "version_count")) == 2 &&
              !strcmp(s_of(m, "latest"), "1.1.0") && json_is_null(json_object_get(j, "verified")) &&
              !strcmp(check_of(chan(j, "staging"), "status"), "not checked") &&
              !strcmp(s_of(chan(j, "staging"), "source"), "registry"));
    json_decref(j);
    j = NULL;

    rc = list(&f, "demo", true, 0, &j);
    const json_t *st = chan(j, "staging"), *pr = chan(j, "production");
    char exp[21];
    kiln_format_time(f.staging_expires, exp);
    CHECK("with the policy: each record verified, its own fields shown",
          rc == KILN_OK && json_is_true(json_object_get(j, "verified")) &&
              !strcmp(check_of(st, "status"), "verified") &&
              !strcmp(check_of(pr, "status"), "verified") &&
              !strcmp(s_of(st, "source"), "record") && !strcmp(s_of(st, "version"), "1.1.0") &&
              json_integer_value(json_object_get(st, "seq")) == 2 &&
              !strcmp(s_of(st, "expires"), exp) && !strcmp(s_of(st, "expiry"), "expires soon") &&
              !strcmp(s_of(pr, "expiry"), "ok") &&
              json_array_size(json_object_get(pr, "signed_by")) == 2 &&
              json_integer_value(json_object_get(pr, "threshold")) == 2);
    const json_t *vs = json_object_get(model0(j), "versions");
    CHECK("with NAME: the versions with their validation verdict",
          json_array_size(vs) == 2 && !strcmp(s_of(json_array_get(vs, 0), "validation"), "none"));
    json_decref(j);
    j = NULL;

    rc = list(&f, NULL, true, 3 * 3600, &j);
    CHECK("--expiring 3h: staging (2 h left) is named, production is not",
          rc == KILN_OK && json_array_size(json_object_get(j, "expiring")) == 1 &&
              !strcmp(json_string_value(json_array_get(json_object_get(j, "expiring"), 0)),
                      "demo/staging") &&
              json_is_true(json_object_get(chan(j, "staging"), "expiring")) &&
              json_is_false(json_object_get(chan(j, "production"), "expiring")));
    json_decref(j);
    j = NULL;
    rc = list(&f, NULL, true, 3600, &j);
    CHECK("--expiring 1h: none",
          rc == KILN_OK && json_array_size(json_object_get(j, "expiring")) == 0);
    json_decref(j);
    j = NULL;

    /* The summary lies about production's version; the signed record is what is shown. */
    char *sql = kiln_asprintf("UPDATE channel_records SET version = '1.1.0', digest = 'sha256:%s'"
                              " WHERE channel = 'production'",
                              f.h2);
    CHECK("the store's summary column edited", sql && rfx_sql(f.reg.root, RFX_CONNECT, sql, NULL));
    free(sql);
    rc = list(&f, NULL, true, 0, &j);
    pr = chan(j, "production");
    CHECK("a registry that lies about a channel's version: NOT VERIFIED, the record's shown",
          rc == KILN_ERR_VERIFY && j && json_is_false(json_object_get(j, "verified")) &&
              !strcmp(check_of(pr, "status"), "failed") &&
              strstr(check_of(pr, "how"), "the registry lists 1.1.0") &&
              !strcmp(s_of(pr, "version"), "1.0.0") &&
              !strcmp(check_of(chan(j, "staging"), "status"), "verified") &&
              kiln_test_msg_has("1 channel record did not verify", "demo/production"));
    json_decref(j);
    j = NULL;
    rc = list(&f, NULL, false, 0, &j);
    CHECK("... which without a policy is shown as the registry states it",
          rc == KILN_OK && !strcmp(s_of(chan(j, "production"), "version"), "1.1.0"));
    json_decref(j);
    j = NULL;
    sql = kiln_asprintf("UPDATE channel_records SET version = '1.0.0', digest = 'sha256:%s'"
                        " WHERE channel = 'production'",
                        f.h1);
    CHECK("restored", sql && rfx_sql(f.reg.root, RFX_CONNECT, sql, NULL));
    free(sql);

    /* A current record signed by a key the policy lacks, put behind the server's back. */
    kiln_sign_seckey *ks[] = {f.k[3], NULL};
    char *rec = rfx_record("staging", "1.0.0", f.h1, 3, f.staging_expires, "promote", ks);
    sql = kiln_asprintf("INSERT INTO channel_records VALUES('demo', 'staging', 3, '1.0.0',"
                        " 'sha256:%s', %lld, 'promote', ?1, 'rm', ?2)",
                        f.h1, (long long)f.staging_expires);
    CHECK("a stranger's record stored", rec && sql && rfx_sql(f.reg.root, RFX_CONNECT, sql, rec));
    rc = list(&f, NULL, true, 0, &j);
    st = chan(j, "staging");
    CHECK("signed by an untrusted key: NOT VERIFIED, naming the key",
          rc == KILN_ERR_VERIFY && !strcmp(check_of(st, "status"), "failed") &&
              strstr(check_of(st, "how"), "not in the trust policy") &&
              !strcmp(s_of(st, "source"), "registry") &&
              !strcmp(check_of(chan(j, "production"), "status"), "verified"));
    json_decref(j);
    j = NULL;
    free(sql);
    free(rec);
    CHECK("removed",
          rfx_sql(f.reg.root, RFX_CONNECT,
                  "DELETE FROM channel_records WHERE channel = 'staging' AND seq = 3", NULL));

    /* A record older than this client accepted. */
    char *dir = kiln_asprintf("%s/channels/demo", f.reg.state);
    if (dir) kiln_test_put(dir, "production.json", "{\"seq\": 4}");
    rc = list(&f, NULL, true, 0, &j);
    CHECK("a seq below the state's: NOT VERIFIED",
          rc == KILN_ERR_VERIFY &&
              strstr(check_of(chan(j, "production"), "how"), "below seq 4, the last this client"));
    json_decref(j);
    j = NULL;
    free(dir);
out:
    json_decref(j);
    mfx_free(&f);
}

KILN_TEST(registry_models_refusals_and_failover) {
    mfx f;
    json_t *j = NULL;
    if (!CHECK("fixture", mfx_init(&f))) goto out;
    kiln_err rc = list(&f, "nosuch", false, 0, &j);
    CHECK("an unknown model: not found, said so, nothing out",
          rc == KILN_ERR_NOTFOUND && !j && kiln_test_msg_has("has no model 'nosuch'", f.reg.url));
    rc = list(&f, "../x", false, 0, &j);
    CHECK("a bad name: refused before any request",
          rc == KILN_ERR_USAGE && !j && kiln_test_msg_has("../x", NULL));
    kiln_registry_client_opts c = {.url = f.reg.url, .retries = 0};
    kiln_registry_models_opts o = {.state = f.reg.state};
    rc = kiln_registry_models(&c, 1, &o, &j);
    CHECK("a state without a policy: refused", rc == KILN_ERR_USAGE && !j);
    char *missing = kiln_test_path("nope.json"), *file = kiln_test_write("state-file", "x", 1);
    o = (kiln_registry_models_opts){.trust = missing};
    rc = kiln_registry_models(&c, 1, &o, &j);
    CHECK("a missing policy: the file named",
          rc != KILN_OK && rc != KILN_ERR_VERIFY && !j && kiln_test_msg_has("nope.json", NULL));
    o = (kiln_registry_models_opts){.trust = f.reg.trust, .state = file};
    rc = kiln_registry_models(&c, 1, &o, &j);
    CHECK("a state that is a file: refused, left as it was",
          rc == KILN_ERR_USAGE && !j && kiln_test_msg_has("state-file", "is not a directory"));
    free(missing), free(file);

    /* A registry down first: passed over, said so, the next one answers everything. */
    kiln_registry_client_opts cs[2] = {{.url = "http://127.0.0.1:1", .retries = 0},
                                       {.url = f.reg.url, .retries = 0}};
    o = (kiln_registry_models_opts){.trust = f.reg.trust, .state = f.reg.state};
    rc = kiln_registry_models(cs, 2, &o, &j);
    CHECK("the first registry down: the second answers, verified",
          rc == KILN_OK && j && !strcmp(s_of(j, "registry"), f.reg.url) &&
              json_array_size(json_object_get(j, "failover")) >= 1 &&
              strstr(json_string_value(json_array_get(json_object_get(j, "failover"), 0)),
                     "127.0.0.1:1") &&
              !strcmp(check_of(chan(j, "staging"), "status"), "verified") &&
              !strcmp(s_of(chan(j, "staging"), "record_from"), f.reg.url));
    json_decref(j);
    j = NULL;
    kiln_registry_server_stop(f.reg.srv, 1000);
    f.reg.srv = NULL;
    rc = kiln_registry_models(cs, 2, &o, &j);
    CHECK("none answers: a network failure naming each, nothing out",
          rc != KILN_OK && rc != KILN_ERR_VERIFY && !j && kiln_test_msg_has(f.reg.url, NULL));
out:
    json_decref(j);
    mfx_free(&f);
}

/* /metrics: a gauge per channel with its current record's expiry; label values escaped as the
 * Prometheus text format wants (a name no registry accepts, put in behind its back). */
KILN_TEST(registry_models_metrics_expiry_gauge) {
    mfx f;
    rfx_resp r = {0};
    if (!CHECK("fixture", mfx_init(&f))) goto out;
    char want1[200], want2[200];
    snprintf(want1, sizeof want1,
             "kiln_registry_channel_expiry_timestamp_seconds{model=\"demo\",channel=\"staging\"} "
             "%lld\n",
             (long long)f.staging_expires);
    snprintf(want2, sizeof want2,
             "kiln_registry_channel_expiry_timestamp_seconds{model=\"demo\",channel=\"production\"}"
             " %lld\n",
             (long long)f.production_expires);
    CHECK("odd names stored",
          rfx_sql(f.reg.root, RFX_CONNECT,
                  "INSERT INTO channel_records VALUES(?1, 'c', 1, '1', 'sha256:00', 1234567890,"
                  " 'r', '{}', 'rm', ?2)",
                  "we\"ird\\na\nme"));
    const char *want[] = {
        want1, want2, "# TYPE kiln_registry_channel_expiry_timestamp_seconds gauge\n",
        "kiln_registry_channel_expiry_timestamp_seconds{model=\"we\\\"ird\\\\na\\nme\","
        "channel=\"c\"} 1234567890\n",
        NULL};
    CHECK("a gauge per channel: the current record's expiry (seq 2's, not seq 1's), escaped",
          rfx_metrics_have(f.reg.url, NULL, want, &r));
    CHECK("one line per channel",
          r.body && strstr(r.body, "channel=\"staging\"") &&
              !strstr(strstr(r.body, "channel=\"staging\"") + 1, "channel=\"staging\""));
out:
    rfx_resp_free(&r);
    mfx_free(&f);
}

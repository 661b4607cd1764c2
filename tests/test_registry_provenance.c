/* test_registry_provenance.c - kiln provenance against a real registry on loopback: a channel
 * after promote and rollback, a version, the download, and a store altered behind the
 * server's back (a signature, a record, a manifest, a card, an old record, the blob), an
 * expired record and a replayed one: each flagged with KILN_ERR_VERIFY while the rest is
 * still shown. */
#include <stdlib.h>
#include <string.h>

#include "export.h"
#include "registry_fx.h"
#include "registry_int.h"
#include "test.h"
#include "testutil.h"

/* The registry (registry_fx: its root, trust, state, url, and the tokens 'ci' and 'rm'), the
 * keys (k[0] root, k[1] release, k[2] and k[3] promote) and the archives' digests. */
typedef struct pfx {
    rfx reg;
    kiln_sign_seckey *k[4];
    char d1[KILN_SHA256_HEX], d2[KILN_SHA256_HEX];
} pfx;

/* A card as kiln export writes it (kiln_json_write_file: pretty, 15 digits), with reals
 * that are not short in binary. */
static bool write_card(const char *dir, long step) {
    json_t *card = json_pack(
        "{s:{s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f},s:s,s:s,s:s,s:{s:s,s:i,s:{s:s,s:s},"
        "s:{s:i,s:f},s:s,s:s,s:{s:f,s:i,s:f,s:f}},s:s}",
        "config", "format", "kiln-model/1", "n_features", 6, "n_outputs", 2, "d_model", 16,
        "n_layers", 2, "n_heads", 4, "d_ff", 32, "n_experts", 4, "top_k", 2, "seq_len", 16,
        "attn_window", 8, "norm_eps", 1e-5, "created", "2026-03-04T05:06:07Z", "dtype", "f32",
        "format", "kiln-card/1", "lineage", "run_id", "0123456789abcdef0123456789abcdef", "step",
        (int)step, "checkpoint", "file", "ckpt/step-00000040.safetensors", "sha256", "ab12",
        "config", "steps", (int)step, "lr", 0.003, "dataset_sha256",
        "c62b240bb276543e289e94dcf93ee9837093962cd78d7a58cbe94c5f4c9c5b3b", "code_version",
        "0.1.0 (test)", "metrics", "loss", 0.8441170000000001, "val_step", (int)step, "val_loss",
        0.859739, "val_r2", 0.155822, "name", "demo");
    char *p = kiln_path_join(dir, "card.json");
    bool ok = card && p && kiln_json_write_file(p, card) == KILN_OK;
    json_decref(card);
    free(p);
    return ok;
}

/* A validation report; baseline_digest NULL writes one from before reports named their
 * baseline (no "baseline" key). */
static bool write_report(const char *dir, const char *baseline_digest) {
    json_t *rep = json_pack(
        "{s:s,s:s,s:b,s:{s:s,s:s,s:i},s:{s:f,s:i},s:{s:{s:s,s:{s:f,s:f},s:{s:f,s:f,s:f}},"
        "s:{s:s,s:{s:f,s:f,s:f,s:s},s:{s:f,s:f}}}}",
        "format", "kiln-validation/1", "kiln_version", "0.1.0 (test)", "passed", 1, "data", "path",
        "/data/market.safetensors", "sha256", "c62b24", "rows", 3000, "heldout", "loss", 0.917025,
        "windows", 37, "checks", "golden", "status", "passed", "figures", "frac_outside", 0.0,
        "max_rel_err", 0.0, "thresholds", "rtol", 1e-5, "atol", 1e-6, "max_outside", 0.0,
        "baseline_loss", "status", "passed", "figures", "loss", 0.917025, "baseline_loss", 0.93,
        "limit", 0.9393, "baseline_sha256", "adc0404d", "thresholds", "rel_margin", 0.01,
        "abs_margin", 0.0);
    if (rep && baseline_digest)
        json_object_set_new(rep, "baseline",
                            json_pack("{s:s,s:s,s:s,s:s,s:i,s:n,s:s}", "name", "demo", "version",
                                      "1.0.0", "digest", baseline_digest, "channel", "production",
                                      "seq", 1, "manifest_sha256", "model_sha256", "adc0404d"));
    char *p = kiln_path_join(dir, "validation.json");
    bool ok = rep && p && kiln_json_write_file(p, rep) == KILN_OK;
    json_decref(rep);
    free(p);
    return ok;
}

/* Pack demo@version from a model directory written here, sign it with rel and publish it;
 * hex gets its digest. */
static bool publish(pfx *f, const char *version, long step, const char *baseline_digest,
                    char hex[KILN_SHA256_HEX]) {
    char name[64];
    snprintf(name, sizeof name, "m-%s", version);
    char *dir = kiln_test_path(name), *ar = kiln_asprintf("%s.kiln", dir ? dir : ""),
         *sigp = kiln_asprintf("%s.kiln.minisig", dir ? dir : ""), *sig = NULL;
    uint8_t d[KILN_SHA256_BYTES];
    kiln_manifest *m = NULL;
    bool ok = dir && ar && sigp && kiln_mkdir_p(dir) == KILN_OK;
    if (ok) kiln_test_put(dir, "model.safetensors", version);
    ok = ok && write_card(dir, step) && write_report(dir, baseline_digest) &&
         kiln_archive_pack(dir, "demo", version, ar, d, &m) == KILN_OK &&
         kiln_sign_archive(f->k[1], ar, false, &sig, NULL) == KILN_OK &&
         kiln_write_file_atomic(sigp, sig, strlen(sig)) == KILN_OK;
    kiln_hex(d, sizeof d, hex);
    kiln_registry_client_opts c = {.url = f->reg.url, .token = f->reg.pub, .retries = 2};
    kiln_registry_published pub;
    ok = ok && kiln_registry_publish(&c, ar, NULL, &pub) == KILN_OK;
    kiln_manifest_free(m);
    free(dir), free(ar), free(sigp), free(sig);
    return ok;
}

static bool promote(pfx *f, const char *channel, const char *version, const char *reason) {
    kiln_registry_client_opts c = {.url = f->reg.url, .token = f->reg.prom, .retries = 2};
    const kiln_sign_seckey *keys[] = {f->k[2], f->k[3]};
    kiln_registry_promote_opts o = {.model = "demo",
                                    .channel = channel,
                                    .version = version,
                                    .keys = keys,
                                    .nkeys = 2,
                                    .reason = reason};
    kiln_registry_promoted res;
    return kiln_registry_promote(&c, &o, &res) == KILN_OK;
}

/* Keys, a policy (production needs p1 and p2), a registry holding demo 1.0.0 and 2.0.0 (2.0.0
 * validated against 1.0.0, 1.0.0's report from before reports named their baseline), and
 * production promoted to 1.0.0, then 2.0.0, then rolled back to 1.0.0. */
static bool pfx_init(pfx *f) {
    memset(f, 0, sizeof *f);
    char pk[4][KILN_SIGN_PUBKEY_B64];
    if (!rfx_keys(f->k, pk, 4)) return false;
    char *t = kiln_asprintf(
        "{\"format\":\"kiln-trust/1\",\"keys\":["
        "{\"name\":\"root\",\"pubkey\":\"%s\",\"roles\":[\"root\"]},"
        "{\"name\":\"rel\",\"pubkey\":\"%s\",\"roles\":[\"release\"]},"
        "{\"name\":\"p1\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]},"
        "{\"name\":\"p2\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]}],"
        "\"channels\":{\"staging\":{\"threshold\":1},\"production\":{\"threshold\":2}}}",
        pk[0], pk[1], pk[2], pk[3]);
    bool ok = t && rfx_init(&f->reg, "reg", t, KILN_SCOPE_PUBLISH | KILN_SCOPE_PROMOTE, 4, false);
    free(t);
    if (!ok) return false;
    char want[80];
    if (!publish(f, "1.0.0", 20, NULL, f->d1)) return false;
    snprintf(want, sizeof want, "sha256:%s", f->d1);
    return publish(f, "2.0.0", 40, want, f->d2) && promote(f, "production", "1.0.0", NULL) &&
           promote(f, "production", "2.0.0", NULL) && promote(f, "production", "1.0.0", "rollback");
}

static void pfx_free(pfx *f) {
    rfx_free(&f->reg);
    rfx_keys_free(f->k, 4);
}

static kiln_err prov(const pfx *f, const char *ref, bool download, json_t **out) {
    kiln_registry_client_opts c = {.url = f->reg.url, .retries = 2, .backoff_ms = 20};
    kiln_registry_provenance_opts o = {
        .ref = ref, .trust = f->reg.trust, .state = f->reg.state, .download = download};
    return kiln_registry_provenance(&c, &o, out);
}

/* The value at a path of keys and array indexes ("channel.history.0.check.status"). */
static const json_t *at(const json_t *j, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *save = NULL, *k = strtok_r(buf, ".", &save); j && k; k = strtok_r(NULL, ".", &save))
        j = json_is_array(j) ? json_array_get(j, strtoul(k, NULL, 10)) : json_object_get(j, k);
    return j;
}

static const char *s_at(const json_t *j, const char *path) {
    const char *s = json_string_value(at(j, path));
    return s ? s : "";
}

static bool is(const json_t *j, const char *path, const char *want) {
    return !strcmp(s_at(j, path), want);
}

/* Some problem names what and holds also (may be NULL). */
static bool problem_has(const json_t *j, const char *what, const char *also) {
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(j, "problems"), i, p) {
        const char *s = json_string_value(p);
        if (s && strstr(s, what) && (!also || strstr(s, also))) return true;
    }
    return false;
}

/* 1.0.0's row, for edit(). */
#define V1 " FROM versions WHERE version = '1.0.0'"
#define V1SET " WHERE version = '1.0.0'"

/* Replace the first `from` in one stored column with `to` (what an attacker with the
 * database does). */
static bool edit(const pfx *f, const char *sql_select, const char *sql_update, const char *from,
                 const char *to) {
    char *text = rfx_text(f->reg.root, RFX_CONNECT, sql_select);
    char *hit = text ? strstr(text, from) : NULL, *next = NULL;
    if (hit) next = kiln_asprintf("%.*s%s%s", (int)(hit - text), text, to, hit + strlen(from));
    bool ok = next && rfx_sql(f->reg.root, RFX_CONNECT, sql_update, next);
    free(text);
    free(next);
    return ok;
}

KILN_TEST(registry_provenance_channel_and_version) {
    pfx f;
    json_t *j = NULL;
    if (!CHECK("fixture: two versions, promote, promote, rollback", pfx_init(&f))) goto out;
    kiln_err rc = prov(&f, "demo@production", false, &j);
    if (!CHECK("verified", rc == KILN_OK && j)) goto out;
    static const char *const order[] = {"format",   "ref",        "registry",  "registries",
                                        "failover", "checked_at", "model",     "version",
                                        "verified", "problems",   "trust",     "channel",
                                        "archive",  "lineage",    "validation", "reproductions"};
    const char *k;
    json_t *v;
    size_t n = 0;
    bool ordered = true;
    json_object_foreach(j, k, v) ordered = ordered && n < 16 && !strcmp(k, order[n++]);
    CHECK("the JSON's keys in their documented order", ordered && n == 16);
    CHECK("one registry, which answered, nothing to fail over",
          is(j, "registry", f.reg.url) && json_array_size(at(j, "registries")) == 1 &&
              is(j, "registries.0", f.reg.url) && json_array_size(at(j, "failover")) == 0);
    CHECK("format and resolution",
          is(j, "format", "kiln-provenance/1") && is(j, "version", "1.0.0") &&
              json_is_true(at(j, "verified")) && json_array_size(at(j, "problems")) == 0);
    CHECK("trust: version 1 from the file", json_integer_value(at(j, "trust.version")) == 1 &&
                                                is(j, "trust.check.status", "verified"));
    CHECK("the current record is seq 3, a rollback from 2.0.0",
          json_integer_value(at(j, "channel.seq")) == 3 && is(j, "channel.change", "rollback") &&
              is(j, "channel.from", "2.0.0") && is(j, "channel.reason", "rollback") &&
              is(j, "channel.version", "1.0.0"));
    char want[80];
    snprintf(want, sizeof want, "sha256:%s", f.d1);
    CHECK("signed by p1 and p2 (2 of 2), verified",
          is(j, "channel.check.status", "verified") && is(j, "channel.signers.0.name", "p1") &&
              is(j, "channel.signers.1.name", "p2") &&
              json_integer_value(at(j, "channel.threshold")) == 2 &&
              is(j, "channel.signatures.1.status", "verified") && is(j, "channel.digest", want));
    CHECK("put by the promote token (the registry's word), not expired",
          is(j, "channel.put_by", "rm") && is(j, "channel.put_check.status", "registry") &&
              is(j, "channel.expiry_check.status", "verified") &&
              json_is_false(at(j, "channel.expired")));
    CHECK("no state yet: seq not checked", is(j, "channel.seq_check.status", "not checked"));
    CHECK("history: seq 1 first, seq 2 a promotion to 2.0.0, both verified",
          json_array_size(at(j, "channel.history")) == 2 &&
              json_integer_value(at(j, "channel.history.0.seq")) == 1 &&
              is(j, "channel.history.0.change", "first") &&
              is(j, "channel.history.1.version", "2.0.0") &&
              is(j, "channel.history.1.change", "promote") &&
              is(j, "channel.history.1.check.status", "verified") &&
              is(j, "channel.history.1.signatures.0.name", "p1"));
    CHECK("archive: the record's digest, published by ci, signed by rel over the comment",
          is(j, "archive.digest", want) && is(j, "archive.digest_check.status", "verified") &&
              is(j, "archive.published_by", "ci") && is(j, "archive.signers.0.name", "rel") &&
              is(j, "archive.verdict", "passed") &&
              is(j, "archive.manifest_check.status", "verified") &&
              strstr(s_at(j, "archive.signature_check.how"),
                     "signature checked over the comment; archive bytes not downloaded: use "
                     "--download"));
    CHECK("lineage from the signed manifest",
          is(j, "lineage.run_id", "0123456789abcdef0123456789abcdef") &&
              json_integer_value(at(j, "lineage.step")) == 20 &&
              is(j, "lineage.code_version", "0.1.0 (test)") &&
              is(j, "lineage.check.status", "verified") &&
              fabs(json_real_value(at(j, "lineage.metrics.loss")) - 0.844117) < 1e-9);
    CHECK("the card reproduces the signed bytes: config verified",
          json_integer_value(at(j, "lineage.config.d_model")) == 16 &&
              is(j, "lineage.config_check.status", "verified"));
    CHECK("validation: the signed verdict, and the checks from the registry's copy of "
          "validation.json, verified against the signed manifest without the archive",
          is(j, "validation.verdict", "passed") &&
              is(j, "validation.verdict_check.status", "verified") &&
              is(j, "validation.check.status", "verified") &&
              is(j, "validation.source", "registry") &&
              strstr(s_at(j, "validation.check.how"), "as the registry keeps it, byte for byte") &&
              strstr(s_at(j, "validation.check.how"), "the archive not downloaded") &&
              !at(j, "archive.download") && json_array_size(at(j, "validation.checks")) == 2 &&
              is(j, "validation.checks.1.name", "golden") &&
              is(j, "validation.checks.1.status", "passed") &&
              fabs(json_real_value(at(j, "validation.checks.0.threshold")) - 0.9393) < 1e-12 &&
              is(j, "validation.report.data_path", "/data/market.safetensors") &&
              json_is_false(at(j, "validation.baseline.recorded")) &&
              is(j, "validation.baseline.model_sha256", "adc0404d"));
    json_decref(j);
    j = NULL;

    /* A version: no channel; its digest is the registry's word until downloaded. */
    rc = prov(&f, "demo@2.0.0", false, &j);
    snprintf(want, sizeof want, "sha256:%s", f.d1);
    CHECK("a version ref", rc == KILN_OK && json_is_null(at(j, "channel")) &&
                               is(j, "version", "2.0.0") &&
                               is(j, "archive.digest_check.status", "registry"));
    CHECK("its baseline without the archive: 1.0.0 with its digest",
          is(j, "validation.check.status", "verified") && is(j, "validation.source", "registry") &&
              json_is_true(at(j, "validation.baseline.recorded")) &&
              is(j, "validation.baseline.ref.version", "1.0.0") &&
              is(j, "validation.baseline.ref.digest", want));
    json_decref(j);
    j = NULL;
    rc = prov(&f, "demo@2.0.0", true, &j);
    snprintf(want, sizeof want, "sha256:%s", f.d1);
    CHECK("downloaded: verified in full, the digest too",
          rc == KILN_OK && is(j, "archive.download.check.status", "verified") &&
              is(j, "archive.digest_check.status", "verified"));
    CHECK("the report's checks and its baseline: 1.0.0 with its digest",
          is(j, "validation.check.status", "verified") && is(j, "validation.source", "archive") &&
              !at(j, "archive.download.validation_text_check") &&
              is(j, "validation.checks.1.name", "golden") &&
              is(j, "validation.checks.0.name", "baseline_loss") &&
              fabs(json_real_value(at(j, "validation.checks.0.threshold")) - 0.9393) < 1e-12 &&
              json_is_true(at(j, "validation.baseline.recorded")) &&
              is(j, "validation.baseline.ref.version", "1.0.0") &&
              is(j, "validation.baseline.ref.digest", want));
    char *dl = kiln_path_join(f.reg.state, "downloads"), *listing = dl ? kiln_test_listing(dl) : NULL;
    CHECK("nothing left in downloads but the pull's lock",
          listing && !strstr(listing, "provenance") && !strstr(listing, ".partial"));
    free(dl), free(listing);
    json_decref(j);
    j = NULL;
    rc = prov(&f, "demo@1.0.0", true, &j);
    CHECK("a report from before reports named their baseline: said so",
          rc == KILN_OK && json_is_false(at(j, "validation.baseline.recorded")) &&
              is(j, "validation.baseline.model_sha256", "adc0404d"));
    json_decref(j);
    j = NULL;

    /* A state that accepted seq 3: verified against it. */
    char *sf = kiln_asprintf("%s/channels/demo", f.reg.state);
    if (sf) kiln_test_put(sf, "production.json", "{\"seq\":3}");
    rc = prov(&f, "demo@production", false, &j);
    CHECK("seq checked against the state",
          rc == KILN_OK && is(j, "channel.seq_check.status", "verified"));
    free(sf);
out:
    json_decref(j);
    pfx_free(&f);
}

/* One alteration of the store at a time: each is flagged, exit 1 (KILN_ERR_VERIFY), and
 * everything else is still there. */
KILN_TEST(registry_provenance_tampered_store) {
    pfx f;
    json_t *j = NULL;
    if (!CHECK("fixture", pfx_init(&f))) goto out;
    /* The signature: its trusted comment says validation:failed now. */
    CHECK("alter the signature",
          edit(&f, "SELECT signature" V1, "UPDATE versions SET signature = ?1" V1SET,
               "validation:passed", "validation:failed"));
    kiln_err rc = prov(&f, "demo@production", false, &j);
    CHECK("signature: flagged, exit 1",
          rc == KILN_ERR_VERIFY && j && is(j, "archive.signature_check.status", "failed") &&
              problem_has(j, "archive signature", "global signature"));
    CHECK("the rest is shown: channel verified, lineage there",
          is(j, "channel.check.status", "verified") &&
              is(j, "lineage.run_id", "0123456789abcdef0123456789abcdef") &&
              json_is_false(at(j, "verified")));
    json_decref(j);
    j = NULL;
    CHECK("restore", edit(&f, "SELECT signature" V1, "UPDATE versions SET signature = ?1" V1SET,
                          "validation:failed", "validation:passed"));

    /* The manifest: another step in its lineage. */
    CHECK("alter the manifest",
          edit(&f, "SELECT manifest" V1, "UPDATE versions SET manifest = ?1" V1SET, "\"step\":20",
               "\"step\":21"));
    rc = prov(&f, "demo@production", false, &j);
    CHECK("manifest: flagged, and the lineage read from it too",
          rc == KILN_ERR_VERIFY && is(j, "archive.manifest_check.status", "failed") &&
              is(j, "lineage.check.status", "failed") &&
              json_integer_value(at(j, "lineage.step")) == 21 &&
              problem_has(j, "manifest", "the signed comment names"));
    json_decref(j);
    j = NULL;
    CHECK("restore", edit(&f, "SELECT manifest" V1, "UPDATE versions SET manifest = ?1" V1SET,
                          "\"step\":21", "\"step\":20"));

    /* The card: another model width. */
    CHECK("alter the card", edit(&f, "SELECT card" V1, "UPDATE versions SET card = ?1" V1SET,
                                 "\"d_model\":16", "\"d_model\":64"));
    rc = prov(&f, "demo@production", false, &j);
    CHECK("card: flagged, the lineage still verified",
          rc == KILN_ERR_VERIFY && is(j, "lineage.config_check.status", "failed") &&
              is(j, "lineage.check.status", "verified") && problem_has(j, "card", "reproduce"));
    json_decref(j);
    j = NULL;
    /* Downloaded, the card comes from the archive, and the registry's copy is named. */
    rc = prov(&f, "demo@production", true, &j);
    CHECK("card with --download: the archive's is verified, the registry's flagged",
          rc == KILN_ERR_VERIFY && is(j, "lineage.config_check.status", "verified") &&
              json_integer_value(at(j, "lineage.config.d_model")) == 16 &&
              is(j, "archive.download.card_check.status", "failed"));
    json_decref(j);
    j = NULL;
    CHECK("restore", edit(&f, "SELECT card" V1, "UPDATE versions SET card = ?1" V1SET,
                          "\"d_model\":64", "\"d_model\":16"));

    /* The current record: its reason rewritten. */
    CHECK("alter the current record", edit(&f, "SELECT record FROM channel_records WHERE seq = 3",
                                           "UPDATE channel_records SET record = ?1 WHERE seq = 3",
                                           "\"rollback\"", "\"hotfix\""));
    rc = prov(&f, "demo@production", false, &j);
    CHECK("record: flagged, shown as held, the archive still checked",
          rc == KILN_ERR_VERIFY && is(j, "channel.check.status", "failed") &&
              is(j, "channel.reason", "hotfix") &&
              is(j, "archive.digest_check.status", "not checked") &&
              is(j, "archive.signature_check.status", "verified") &&
              problem_has(j, "channel record", "signature"));
    json_decref(j);
    j = NULL;
    CHECK("restore", edit(&f, "SELECT record FROM channel_records WHERE seq = 3",
                          "UPDATE channel_records SET record = ?1 WHERE seq = 3", "\"hotfix\"",
                          "\"rollback\""));

    /* An old record: seq 1 now points elsewhere. */
    CHECK("alter an old record", edit(&f, "SELECT record FROM channel_records WHERE seq = 1",
                                      "UPDATE channel_records SET record = ?1 WHERE seq = 1",
                                      "\"promote\"", "\"promoted\""));
    rc = prov(&f, "demo@production", false, &j);
    CHECK("history: the altered record flagged, the current one verified",
          rc == KILN_ERR_VERIFY && is(j, "channel.history.0.check.status", "failed") &&
              is(j, "channel.history.1.check.status", "verified") &&
              is(j, "channel.check.status", "verified") &&
              problem_has(j, "channel history seq 1", "altered"));
    json_decref(j);
    j = NULL;

    /* A trust version 2 that no root key signed, served by the registry: the walk stops,
     * and the rest is checked under what this client held. */
    sqlite3 *db = NULL;
    bool put = reg_db_open(f.reg.root, &db) == KILN_OK &&
               reg_db_exec(db, "INSERT INTO trust_versions VALUES(2, '{\"policy\":{},"
                               "\"signatures\":[]}', 'evil', 0)") == KILN_OK;
    reg_db_close(db);
    CHECK("a forged trust version in the store", put);
    rc = prov(&f, "demo@production", false, &j);
    CHECK("trust: flagged, the rest checked under version 1",
          rc == KILN_ERR_VERIFY && is(j, "trust.check.status", "failed") &&
              json_integer_value(at(j, "trust.version")) == 1 &&
              strstr(s_at(j, "trust.check.how"), "trust v2") &&
              is(j, "channel.check.status", "verified") &&
              is(j, "archive.signature_check.status", "verified") && problem_has(j, "trust", NULL));
    json_decref(j);
    j = NULL;
    put = reg_db_open(f.reg.root, &db) == KILN_OK &&
          reg_db_exec(db, "DELETE FROM trust_versions") == KILN_OK;
    reg_db_close(db);
    CHECK("forget it", put);

    /* The blob: one byte flipped on disk. Only the download sees it. */
    char *blob = reg_blob_path(f.reg.root, f.d2);
    CHECK("flip a byte of the blob", blob && kiln_test_flip(blob, 100));
    rc = prov(&f, "demo@2.0.0", false, &j);
    CHECK("a flipped blob byte: invisible without the archive", rc == KILN_OK);
    json_decref(j);
    j = NULL;
    rc = prov(&f, "demo@2.0.0", true, &j);
    CHECK("with --download: flagged, the rest shown (the report from the registry's copy, "
          "which the signed manifest authenticates on its own)",
          rc == KILN_ERR_VERIFY && is(j, "archive.download.check.status", "failed") &&
              strstr(s_at(j, "archive.download.check.how"), "hashes to") &&
              is(j, "lineage.check.status", "verified") &&
              is(j, "validation.check.status", "verified") &&
              is(j, "validation.source", "registry") && json_array_size(at(j, "problems")) == 1);
    char *dl = kiln_path_join(f.reg.state, "downloads"), *listing = dl ? kiln_test_listing(dl) : NULL;
    CHECK("the failed download is removed",
          listing && !strstr(listing, "provenance") && !strstr(listing, ".partial"));
    free(dl), free(listing), free(blob);
    json_decref(j);
    j = NULL;

    /* The version the record names, gone from the registry: said, nothing read from it. */
    put = reg_db_open(f.reg.root, &db) == KILN_OK &&
          reg_db_exec(db, "DELETE FROM versions" V1SET) == KILN_OK;
    reg_db_close(db);
    rc = put ? prov(&f, "demo@production", false, &j) : KILN_ERR_IO;
    CHECK("a version the record names is gone: flagged, no lineage",
          rc == KILN_ERR_VERIFY && is(j, "archive.check.status", "failed") && !at(j, "lineage") &&
              is(j, "channel.check.status", "verified") &&
              problem_has(j, "archive", "does not hold demo@1.0.0"));
out:
    json_decref(j);
    pfx_free(&f);
}

/* An expired record (signed properly: an auditor still sees it) and one older than the state
 * accepted; then arguments that stop the command before anything is fetched. */
KILN_TEST(registry_provenance_expired_and_bad_input) {
    pfx f;
    json_t *j = NULL;
    if (!CHECK("fixture", pfx_init(&f))) goto out;
    /* The server refuses expired records: this one goes straight into its database, as if
     * it had been put a month ago. */
    kiln_sign_record r;
    kiln_sign_record_init(&r);
    uint8_t d[32];
    char *text = NULL;
    size_t len = 0;
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    char digest[80];
    snprintf(digest, sizeof digest, "sha256:%s", f.d2);
    int64_t gone = kiln_unix_time() - 3600;
    bool ok =
        kiln_unhex(f.d2, d, 32) &&
        kiln_sign_record_set(&r, "demo", "staging", "2.0.0", d, 1, gone, "promote") == KILN_OK &&
        kiln_sign_record_add_signature(&r, f.k[2]) == KILN_OK &&
        kiln_sign_record_text(&r, &text, &len) == KILN_OK && reg_db_open(f.reg.root, &db) == KILN_OK &&
        sqlite3_prepare_v2(db,
                           "INSERT INTO channel_records VALUES('demo', 'staging', 1, '2.0.0',"
                           " ?1, ?2, 'promote', ?3, 'rm', ?2)",
                           -1, &st, NULL) == SQLITE_OK;
    if (ok) {
        sqlite3_bind_text(st, 1, digest, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 2, gone);
        sqlite3_bind_text(st, 3, text, (int)len, SQLITE_TRANSIENT);
        ok = sqlite3_step(st) == SQLITE_DONE;
    }
    sqlite3_finalize(st);
    reg_db_close(db);
    kiln_sign_record_release(&r);
    free(text);
    CHECK("a staging record that expired an hour ago", ok);
    kiln_err rc = prov(&f, "demo@staging", false, &j);
    CHECK("expired: shown, flagged, exit 1",
          rc == KILN_ERR_VERIFY && j && json_is_true(at(j, "channel.expired")) &&
              is(j, "channel.expiry_check.status", "failed") &&
              is(j, "channel.check.status", "verified") && is(j, "version", "2.0.0") &&
              is(j, "lineage.check.status", "verified") &&
              problem_has(j, "channel record", "expired at"));
    json_decref(j);
    j = NULL;

    char *sf = kiln_asprintf("%s/channels/demo", f.reg.state);
    if (sf) kiln_test_put(sf, "production.json", "{\"seq\":7}");
    rc = prov(&f, "demo@production", false, &j);
    CHECK("a seq below the state's: flagged", rc == KILN_ERR_VERIFY &&
                                                  is(j, "channel.seq_check.status", "failed") &&
                                                  problem_has(j, "channel seq", "lower than 7"));
    json_decref(j);
    j = NULL;
    free(sf);

    /* Bad input: nothing out, the message names the file and the problem. */
    kiln_registry_client_opts rd = {.url = f.reg.url, .retries = 0};
    char *missing = kiln_test_path("nope.json"), *file = kiln_test_write("state-file", "x", 1);
    kiln_registry_provenance_opts o = {.ref = "demo@production", .trust = missing};
    rc = kiln_registry_provenance(&rd, &o, &j);
    CHECK("a missing --trust",
          rc != KILN_OK && rc != KILN_ERR_VERIFY && !j && kiln_test_msg_has("nope.json", NULL));
    char *bad = kiln_test_write("bad-trust.json", "{\"format\":", 10);
    o.trust = bad;
    rc = kiln_registry_provenance(&rd, &o, &j);
    CHECK("a --trust that is not a policy",
          rc == KILN_ERR_FORMAT && !j && kiln_test_msg_has("bad-trust.json", "invalid JSON"));
    o.trust = f.reg.trust;
    o.state = file;
    rc = kiln_registry_provenance(&rd, &o, &j);
    CHECK("a --state that is a file",
          rc == KILN_ERR_USAGE && !j && kiln_test_msg_has("state-file", "is not a directory"));
    o.state = f.reg.state;
    o.ref = "demo";
    rc = kiln_registry_provenance(&rd, &o, &j);
    CHECK("a ref without @", rc == KILN_ERR_USAGE && !j && kiln_test_msg_has("'demo'", "NAME@"));
    o.ref = "demo@9.9.9";
    rc = kiln_registry_provenance(&rd, &o, &j);
    CHECK("a version the registry lacks",
          rc == KILN_ERR_NOTFOUND && !j &&
              kiln_test_msg_has("the registry holds no version '9.9.9'", "'demo'"));
    text = NULL;
    CHECK("the state file is left as it was",
          kiln_read_file(file, 16, &text, &len) == KILN_OK && len == 1 && text[0] == 'x');
    free(text), free(missing), free(file), free(bad);
out:
    json_decref(j);
    pfx_free(&f);
}

/* The registry's copy of validation.json: altered in the store it is a failure (exit 1), and
 * with --download the archive's report is shown and the copy named; absent (a version from
 * before registries kept it) the checks are said to be not stored and --download reads them. */
KILN_TEST(registry_provenance_validation_text) {
    pfx f;
    json_t *j = NULL;
    if (!CHECK("fixture", pfx_init(&f))) goto out;
    CHECK("both versions hold their report's bytes, the same as the archive's",
          rfx_int(f.reg.root, RFX_CONNECT, "SELECT count(*) FROM versions WHERE validation_text LIKE "
                            "'{%\"baseline_loss\"%'") == 2);
    CHECK("alter the registry's copy of 1.0.0's report (a looser threshold)",
          edit(&f, "SELECT validation_text" V1, "UPDATE versions SET validation_text = ?1" V1SET,
               "0.9393", "0.9999"));
    kiln_err rc = prov(&f, "demo@production", false, &j);
    CHECK("altered: FAILED, exit 1, no checks shown from it",
          rc == KILN_ERR_VERIFY && j && is(j, "validation.check.status", "failed") &&
              strstr(s_at(j, "validation.check.how"), "hashes to sha256:") &&
              json_is_null(at(j, "validation.checks")) && json_array_size(at(j, "problems")) == 1 &&
              problem_has(j, "validation report", "(altered)") &&
              kiln_test_msg_has("did not pass", "validation report"));
    CHECK("the rest still verified", is(j, "channel.check.status", "verified") &&
                                         is(j, "lineage.check.status", "verified") &&
                                         is(j, "validation.verdict_check.status", "verified"));
    json_decref(j);
    j = NULL;
    rc = prov(&f, "demo@production", true, &j);
    CHECK("altered, with --download: the archive's report, the registry's copy flagged",
          rc == KILN_ERR_VERIFY && is(j, "validation.check.status", "verified") &&
              is(j, "validation.source", "archive") &&
              fabs(json_real_value(at(j, "validation.checks.0.threshold")) - 0.9393) < 1e-12 &&
              is(j, "archive.download.validation_text_check.status", "failed") &&
              problem_has(j, "validation report", "not the archive's"));
    json_decref(j);
    j = NULL;

    /* A version stored before the migration: the column is NULL. */
    sqlite3 *db = NULL;
    bool put = reg_db_open(f.reg.root, &db) == KILN_OK &&
               reg_db_exec(db, "UPDATE versions SET validation_text = NULL" V1SET) == KILN_OK;
    reg_db_close(db);
    CHECK("forget 1.0.0's copy", put);
    rc = prov(&f, "demo@production", false, &j);
    CHECK("none stored: not checked, said so, pointing at --download; no failure",
          rc == KILN_OK && is(j, "validation.check.status", "not checked") &&
              strstr(s_at(j, "validation.check.how"), "not stored") &&
              strstr(s_at(j, "validation.check.how"), "use --download") &&
              json_is_null(at(j, "validation.checks")) &&
              json_is_null(at(j, "validation.source")) && json_is_true(at(j, "verified")));
    json_decref(j);
    j = NULL;
    rc = prov(&f, "demo@production", true, &j);
    CHECK("none stored, with --download: the checks from the archive",
          rc == KILN_OK && is(j, "validation.check.status", "verified") &&
              is(j, "validation.source", "archive") &&
              json_array_size(at(j, "validation.checks")) == 2);
out:
    json_decref(j);
    pfx_free(&f);
}

/* The tables as schema version 1 made them (before versions.validation_text). */
static const char *const schema_v1 =
    "PRAGMA journal_mode=WAL;"
    "CREATE TABLE versions("
    " model TEXT NOT NULL, version TEXT NOT NULL, digest TEXT NOT NULL, size INTEGER NOT NULL,"
    " manifest TEXT NOT NULL, signature TEXT NOT NULL, card TEXT, validation TEXT,"
    " publisher TEXT NOT NULL, created INTEGER NOT NULL, PRIMARY KEY(model, version));"
    "CREATE TABLE channel_records("
    " model TEXT NOT NULL, channel TEXT NOT NULL, seq INTEGER NOT NULL, version TEXT NOT NULL,"
    " digest TEXT NOT NULL, expires INTEGER NOT NULL, reason TEXT, record TEXT NOT NULL,"
    " publisher TEXT NOT NULL, created INTEGER NOT NULL, PRIMARY KEY(model, channel, seq));"
    "CREATE TABLE tokens(name TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, scope TEXT NOT NULL,"
    " created INTEGER NOT NULL, expires INTEGER, revoked INTEGER, revoke_reason TEXT,"
    " last_used INTEGER);"
    "CREATE TABLE audit(id INTEGER PRIMARY KEY AUTOINCREMENT, time INTEGER NOT NULL, token TEXT,"
    " action TEXT NOT NULL, model TEXT, version TEXT, channel TEXT, digest TEXT, reason TEXT);"
    "CREATE TABLE trust_versions(version INTEGER PRIMARY KEY, document TEXT NOT NULL,"
    " publisher TEXT NOT NULL, created INTEGER NOT NULL);"
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "PRAGMA user_version = 1;";

/* Copy blob hex from one store to another. */
static bool copy_blob(const char *from, const char *to, const char *hex) {
    char *a = reg_blob_path(from, hex), *b = reg_blob_path(to, hex),
         *dir = b ? kiln_dirname(b) : NULL, *data = NULL;
    size_t len = 0;
    bool ok = a && b && dir && kiln_read_file(a, 1u << 26, &data, &len) == KILN_OK &&
              kiln_mkdir_p(dir) == KILN_OK && kiln_write_file_atomic(b, data, len) == KILN_OK;
    free(a), free(b), free(dir), free(data);
    return ok;
}

/* A store of schema version 1 holding the fixture's versions, records and tokens (made with
 * the sqlite3 API, as that kiln left it): a server opens and migrates it; its versions have
 * no copy of the report (provenance says so, --download reads it) and one published after
 * the migration has. */
KILN_TEST(registry_provenance_old_store_migrates) {
    pfx f;
    json_t *j = NULL;
    kiln_registry_server *old = NULL;
    char oroot[1100];
    if (!CHECK("fixture", pfx_init(&f))) goto out;
    snprintf(oroot, sizeof oroot, "%s/old", kiln_test_dir());
    char *path = kiln_path_join(oroot, "registry.db"),
         *copy = kiln_asprintf("ATTACH '%s/registry.db' AS cur;"
                               "INSERT INTO versions SELECT model, version, digest, size, manifest,"
                               " signature, card, validation, publisher, created FROM cur.versions;"
                               "INSERT INTO channel_records SELECT * FROM cur.channel_records;"
                               "INSERT INTO tokens SELECT * FROM cur.tokens;"
                               "DETACH cur;",
                               f.reg.root);
    sqlite3 *db = NULL;
    bool made = path && copy && kiln_mkdir_p(oroot) == KILN_OK &&
                sqlite3_open(path, &db) == SQLITE_OK &&
                sqlite3_exec(db, schema_v1, NULL, NULL, NULL) == SQLITE_OK &&
                sqlite3_exec(db, copy, NULL, NULL, NULL) == SQLITE_OK;
    if (db) sqlite3_close(db);
    free(path), free(copy);
    made = made && copy_blob(f.reg.root, oroot, f.d1) && copy_blob(f.reg.root, oroot, f.d2);
    if (!CHECK("a store of schema version 1 with two versions", made)) goto out;
    CHECK("it lacks the column",
          rfx_int(oroot, RFX_CONNECT, "PRAGMA user_version") == 1 &&
              rfx_int(oroot, RFX_CONNECT, "SELECT count(*) FROM pragma_table_info('versions') WHERE name = "
                               "'validation_text'") == 0);
    kiln_registry_server_opts o = {
        .root = oroot, .listen = "127.0.0.1:0", .trust = f.reg.trust, .threads = 2};
    if (!CHECK("a server opens it", kiln_registry_server_start(&o, &old) == KILN_OK)) goto out;
    CHECK("migrated: the version and the column, every old row NULL, nothing lost",
          rfx_int(oroot, RFX_CONNECT, "PRAGMA user_version") == reg_schema_version() &&
              reg_schema_version() == 2 &&
              rfx_int(oroot, RFX_CONNECT, "SELECT count(*) FROM versions WHERE validation_text IS NULL") ==
                  2 &&
              rfx_int(oroot, RFX_CONNECT, "SELECT count(*) FROM channel_records") == 3);
    pfx g = f; /* the same keys and tokens, the old store's server */
    snprintf(g.reg.url, sizeof g.reg.url, "http://127.0.0.1:%u", (unsigned)kiln_registry_server_port(old));
    kiln_err rc = prov(&g, "demo@production", false, &j);
    CHECK("provenance of the migrated store: the report not stored, said so",
          rc == KILN_OK && is(j, "channel.check.status", "verified") &&
              is(j, "validation.check.status", "not checked") &&
              strstr(s_at(j, "validation.check.how"), "not stored"));
    json_decref(j);
    j = NULL;
    rc = prov(&g, "demo@production", true, &j);
    CHECK("--download reads it from the archive", rc == KILN_OK &&
                                                      is(j, "validation.source", "archive") &&
                                                      is(j, "validation.check.status", "verified"));
    json_decref(j);
    j = NULL;
    char d3[KILN_SHA256_HEX];
    CHECK("a version published after the migration keeps its report's bytes",
          publish(&g, "3.0.0", 60, NULL, d3) &&
              rfx_int(oroot, RFX_CONNECT, "SELECT count(*) FROM versions WHERE version = '3.0.0' AND "
                               "validation_text IS NOT NULL") == 1);
    rc = prov(&g, "demo@3.0.0", false, &j);
    CHECK("and provenance shows its checks verified without the archive",
          rc == KILN_OK && is(j, "validation.source", "registry") &&
              is(j, "validation.check.status", "verified"));
out:
    kiln_registry_server_stop(old, 1000);
    json_decref(j);
    pfx_free(&f);
}

/* Over a primary and its mirror: the newest record wins (the primary's, while the mirror lags),
 * and with the primary down the mirror answers, the checks verified from its copy of the
 * report (a mirror reads it from the archive it verified). */
KILN_TEST(registry_provenance_over_mirror) {
    pfx f;
    json_t *j = NULL;
    kiln_registry_server *ms = NULL;
    char mroot[1100], murl[64];
    if (!CHECK("fixture", pfx_init(&f))) goto out;
    snprintf(mroot, sizeof mroot, "%s/mirror", kiln_test_dir());
    kiln_registry_client_opts from = {.url = f.reg.url, .retries = 2, .backoff_ms = 20};
    kiln_registry_mirror_opts mo = {.root = mroot, .from = &from, .trust = f.reg.trust};
    kiln_registry_mirror_result mr;
    CHECK("mirrored: two versions, three records",
          kiln_registry_mirror_sync(&mo, &mr) == KILN_OK && mr.versions == 2 && mr.records == 3);
    CHECK("the mirror holds both reports' bytes",
          rfx_int(mroot, RFX_CONNECT, "SELECT count(*) FROM versions WHERE validation_text IS NOT NULL") == 2);
    kiln_registry_server_opts so = {
        .root = mroot, .listen = "127.0.0.1:0", .trust = f.reg.trust, .threads = 2};
    if (!CHECK("the mirror serves", kiln_registry_server_start(&so, &ms) == KILN_OK)) goto out;
    snprintf(murl, sizeof murl, "http://127.0.0.1:%u", (unsigned)kiln_registry_server_port(ms));
    CHECK("the primary moves on: production seq 4", promote(&f, "production", "2.0.0", NULL));

    kiln_registry_client_opts cs[2] = {{.url = murl, .retries = 2, .backoff_ms = 20},
                                       {.url = f.reg.url, .retries = 2, .backoff_ms = 20}};
    kiln_registry_provenance_opts o = {
        .ref = "demo@production", .trust = f.reg.trust, .state = f.reg.state};
    kiln_err rc = kiln_registry_provenance_any(cs, 2, &o, &j);
    CHECK("mirror first, primary newer: the primary's seq 4 answers",
          rc == KILN_OK && is(j, "registry", f.reg.url) &&
              json_integer_value(at(j, "channel.seq")) == 4 && is(j, "version", "2.0.0") &&
              is(j, "registries.0", murl) && is(j, "registries.1", f.reg.url) &&
              strstr(s_at(j, "failover.0"), "using the newer"));
    json_decref(j);
    j = NULL;

    kiln_registry_server_stop(f.reg.srv, 1000);
    f.reg.srv = NULL;
    cs[0].url = f.reg.url;
    cs[1].url = murl;
    rc = kiln_registry_provenance_any(cs, 2, &o, &j);
    CHECK("primary down: the mirror answers, the failover said",
          rc == KILN_OK && j && is(j, "registry", murl) &&
              json_integer_value(at(j, "channel.seq")) == 3 && is(j, "version", "1.0.0") &&
              strstr(s_at(j, "failover.0"), f.reg.url) && strstr(s_at(j, "failover.0"), murl));
    CHECK("everything verified from the mirror, the checks without the archive",
          is(j, "channel.check.status", "verified") &&
              is(j, "archive.digest_check.status", "verified") &&
              is(j, "archive.signature_check.status", "verified") &&
              is(j, "lineage.config_check.status", "verified") &&
              is(j, "validation.check.status", "verified") &&
              is(j, "validation.source", "registry") &&
              json_array_size(at(j, "validation.checks")) == 2 && json_is_true(at(j, "verified")));
    json_decref(j);
    j = NULL;
    o.ref = "demo@2.0.0";
    o.download = true;
    rc = kiln_registry_provenance_any(cs, 2, &o, &j);
    CHECK("a version, downloaded from the mirror",
          rc == KILN_OK && is(j, "registry", murl) &&
              is(j, "archive.download.check.status", "verified") &&
              is(j, "validation.source", "archive"));
    json_decref(j);
    j = NULL;
    o.ref = "demo@9.9.9";
    o.download = false;
    rc = kiln_registry_provenance_any(cs, 2, &o, &j);
    CHECK("a version no registry holds",
          rc == KILN_ERR_NOTFOUND && !j &&
              kiln_test_msg_has("no registry holds version '9.9.9'", "'demo'"));
out:
    kiln_registry_server_stop(ms, 1000);
    json_decref(j);
    pfx_free(&f);
}

/* A mirror reads no further into an archive than its card when the primary's copy of the
 * validation report is the one the signed manifest lists; a copy that is not (a primary that
 * lies, or lost it) is not taken: the report is read from the archive, and the mirror holds
 * the archive's bytes either way. */
KILN_TEST(registry_mirror_report_bytes_are_the_archives) {
    pfx f;
    char mroot[1100];
    char *want1 = NULL, *want2 = NULL, *got1 = NULL, *got2 = NULL;
    if (!CHECK("fixture", pfx_init(&f))) goto out;
    want1 = rfx_text(f.reg.root, RFX_CONNECT,
                     "SELECT hex(validation_text) FROM versions WHERE version = '1.0.0'");
    want2 = rfx_text(f.reg.root, RFX_CONNECT,
                     "SELECT hex(validation_text) FROM versions WHERE version = '2.0.0'");
    CHECK("the primary holds both reports' bytes", want1 && want2);
    CHECK("the primary's copy of 1.0.0's report is changed (the same length), 2.0.0's dropped",
          rfx_sql(f.reg.root, RFX_CONNECT,
                  "UPDATE versions SET validation_text = replace(validation_text, 'true', "
                  "'fals') WHERE version = '1.0.0'",
                  NULL) &&
              rfx_sql(f.reg.root, RFX_CONNECT,
                      "UPDATE versions SET validation_text = NULL WHERE version = '2.0.0'", NULL));
    char *changed = rfx_text(f.reg.root, RFX_CONNECT,
                             "SELECT hex(validation_text) FROM versions WHERE version = '1.0.0'");
    CHECK("... really changed", changed && want1 && strcmp(changed, want1));
    free(changed);
    snprintf(mroot, sizeof mroot, "%s/mirror", kiln_test_dir());
    kiln_registry_client_opts from = {.url = f.reg.url, .retries = 2, .backoff_ms = 20};
    kiln_registry_mirror_opts mo = {.root = mroot, .from = &from, .trust = f.reg.trust};
    kiln_registry_mirror_result mr;
    CHECK("mirrored: both versions",
          kiln_registry_mirror_sync(&mo, &mr) == KILN_OK && mr.versions == 2);
    got1 = rfx_text(mroot, RFX_CONNECT,
                    "SELECT hex(validation_text) FROM versions WHERE version = '1.0.0'");
    got2 = rfx_text(mroot, RFX_CONNECT,
                    "SELECT hex(validation_text) FROM versions WHERE version = '2.0.0'");
    CHECK("the mirror holds the archives' reports, not the primary's word",
          got1 && got2 && want1 && want2 && !strcmp(got1, want1) && !strcmp(got2, want2));
out:
    free(want1);
    free(want2);
    free(got1);
    free(got2);
    pfx_free(&f);
}

/* test_registry_mirror.c - mirrors through real registries on loopback: a sync of trust
 * versions, versions and channel records from a primary into a mirror's store (byte for byte,
 * incremental, resumed after a cut download), what does not verify is reported and not
 * copied, the directories a mirror refuses, a mirror served read-only, and pulls that fail
 * over between a primary and its mirrors (docs/registry.md, "Mirrors"). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "registry_fx.h"
#include "registry_int.h"
#include "test.h"
#include "testutil.h"

enum { ROOT, REL, PROM, NK };

typedef struct mfx {
    rfx primary; /* tokens: admin, pub, prom */
    char mirror[1024], murl[64];
    kiln_registry_server *msrv;
    kiln_sign_seckey *sk[NK];
    char b64[NK][KILN_SIGN_PUBKEY_B64];
    char problems[8][512]; /* the last sync's problem lines */
    size_t nproblems;
} mfx;

/* Version v of the policy: root (threshold 1), rel (release), prom (promote). */
static char *mpolicy(const mfx *f, int v) {
    return kiln_asprintf(
        "{\"format\":\"kiln-trust/1\",\"version\":%d,\"root_threshold\":1,\"keys\":["
        "{\"name\":\"root\",\"pubkey\":\"%s\",\"roles\":[\"root\"]},"
        "{\"name\":\"rel\",\"pubkey\":\"%s\",\"roles\":[\"release\"]},"
        "{\"name\":\"prom\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]}],"
        "\"channels\":{\"production\":{\"threshold\":1},\"staging\":{\"threshold\":1}},"
        "\"accept_unvalidated\":true}",
        v, f->b64[ROOT], f->b64[REL], f->b64[PROM]);
}

/* A server (2 workers, reads open) on root; url gets its address. */
static bool mserve(const char *root, const char *trust, kiln_registry_server **srv, char url[64]) {
    return rfx_serve(root, trust, false, 2, srv, url) != 0;
}

static bool minit(mfx *f) {
    memset(f, 0, sizeof *f);
    snprintf(f->mirror, sizeof f->mirror, "%s/mirror", kiln_test_dir());
    if (!rfx_keys(f->sk, f->b64, NK)) return false;
    char *v1 = mpolicy(f, 1);
    bool ok = v1 && rfx_init(&f->primary, "primary", v1,
                             KILN_SCOPE_ADMIN | KILN_SCOPE_PUBLISH | KILN_SCOPE_PROMOTE, 2, false);
    free(v1);
    return ok;
}

static void mfree(mfx *f) {
    rfx_free(&f->primary);
    kiln_registry_server_stop(f->msrv, 1000);
    rfx_keys_free(f->sk, NK);
}

static kiln_registry_client_opts mclient(const char *url, const char *token) {
    kiln_registry_client_opts c = {.url = url, .token = token, .retries = 0, .backoff_ms = 10};
    return c;
}

/* Publish the archive at path (NULL: none was made) to the primary; frees path. */
static bool mpublish_archive(mfx *f, char *path) {
    kiln_registry_client_opts c = mclient(f->primary.url, f->primary.pub);
    kiln_registry_published pub;
    bool ok = path && kiln_registry_publish(&c, path, NULL, &pub) == KILN_OK;
    free(path);
    return ok;
}

/* demo@version packed from wlen bytes of weights, signed by rel, published to the primary. */
static bool mpublish(mfx *f, const char *version, const void *weights, size_t wlen) {
    char name[64], hex[KILN_SHA256_HEX];
    snprintf(name, sizeof name, "m-%s", version);
    return mpublish_archive(f,
                            rfx_archive(name, weights, wlen, RFX_CARD, version, f->sk[REL], hex));
}

static bool mpromote(mfx *f, const char *channel, const char *version) {
    kiln_registry_client_opts c = mclient(f->primary.url, f->primary.prom);
    const kiln_sign_seckey *keys[] = {f->sk[PROM]};
    kiln_registry_promote_opts o = {
        .model = "demo", .channel = channel, .version = version, .keys = keys, .nkeys = 1};
    kiln_registry_promoted out;
    return kiln_registry_promote(&c, &o, &out) == KILN_OK;
}

/* Trust version 2, signed by the root key, put to the primary. */
static bool mtrust2(mfx *f) {
    char *p2 = mpolicy(f, 2), *doc = NULL;
    size_t len = 0;
    kiln_registry_client_opts c = mclient(f->primary.url, f->primary.admin);
    uint64_t v = 0;
    bool ok = p2 &&
              kiln_sign_trust_sign(p2, strlen(p2), "v2", f->sk[ROOT], &doc, &len) == KILN_OK &&
              kiln_registry_trust_put(&c, doc, len, "v2", &v) == KILN_OK && v == 2;
    free(p2);
    free(doc);
    return ok;
}

static void mproblem(void *ctx, const char *line) {
    mfx *f = ctx;
    if (f->nproblems < 8) snprintf(f->problems[f->nproblems], sizeof f->problems[0], "%s", line);
    f->nproblems++;
}

static bool mproblem_has(const mfx *f, const char *a, const char *b) {
    for (size_t i = 0; i < f->nproblems && i < 8; i++)
        if (strstr(f->problems[i], a) && (!b || strstr(f->problems[i], b))) return true;
    return false;
}

static kiln_err msync_with(mfx *f, const char *root, kiln_registry_client_opts *c,
                           kiln_registry_mirror_result *res) {
    f->nproblems = 0;
    kiln_registry_mirror_opts o = {
        .root = root, .from = c, .trust = f->primary.trust, .on_problem = mproblem, .ctx = f};
    return kiln_registry_mirror_sync(&o, res);
}

static kiln_err msync(mfx *f, kiln_registry_mirror_result *res) {
    kiln_registry_client_opts c = mclient(f->primary.url, f->primary.admin);
    return msync_with(f, f->mirror, &c, res);
}

/* One value from a store (the first column of the first row) as text; caller frees. The
 * store is only connected to: a query never makes a table (the primary has no meta). */
static char *mquery(const char *root, const char *sql) {
    return rfx_text(root, RFX_CONNECT, sql);
}

/* The same query answers the same in both stores (and answers at all). */
static bool mboth(const mfx *f, const char *sql) {
    char *a = mquery(f->primary.root, sql), *b = mquery(f->mirror, sql);
    bool ok = a && b && !strcmp(a, b);
    free(a);
    free(b);
    return ok;
}

KILN_TEST(registry_mirror_sync_copies_everything_once) {
    mfx f;
    if (!CHECK("fixture", minit(&f))) goto out;
    if (!CHECK("a primary: trust v2, two versions, three records",
               mtrust2(&f) && mpublish(&f, "1.0.0", "one", 3) && mpublish(&f, "2.0.0", "two", 3) &&
                   mpromote(&f, "production", "1.0.0") && mpromote(&f, "staging", "2.0.0") &&
                   mpromote(&f, "production", "2.0.0")))
        goto out;
    kiln_registry_mirror_result res;
    CHECK("the first sync copies everything",
          msync(&f, &res) == KILN_OK && res.trust_versions == 1 && res.versions == 2 &&
              res.records == 3 && res.problems == 0 && res.bytes > 0);
    uint64_t first_bytes = res.bytes;
    size_t first_requests = res.requests;
    char *of = mquery(f.mirror, "SELECT value FROM meta WHERE key = 'mirror_of'");
    CHECK("mirror_of is the primary's URL", of && !strcmp(of, f.primary.url));
    free(of);
    CHECK("trust version 2: the primary's bytes",
          mboth(&f, "SELECT hex(document) FROM trust_versions WHERE version = 2"));
    CHECK("versions: digests, sizes, signatures, manifests, publishers and times as the primary's",
          mboth(&f, "SELECT group_concat(model || version || digest || size || signature || "
                    "manifest || coalesce(card, '') || publisher || created, '|') FROM "
                    "(SELECT * FROM versions ORDER BY model, version)"));
    CHECK("channel records: the primary's bytes, in seq order, with who put them and when",
          mboth(&f, "SELECT group_concat(hex(record) || publisher || created || seq, '|') FROM "
                    "(SELECT * FROM channel_records ORDER BY model, channel, seq)"));
    char *audit =
        mquery(f.mirror, "SELECT count(*) || ':' || min(reason) FROM audit WHERE action = "
                         "'mirror.sync'");
    char want[128];
    snprintf(want, sizeof want, "6:from %s", f.primary.url);
    CHECK("one mirror.sync audit row per item copied, saying from where",
          audit && !strcmp(audit, want));
    free(audit);
    size_t problems = 9;
    CHECK("fsck of the mirror under the v1 policy: consistent",
          kiln_registry_fsck(f.mirror, f.primary.trust, NULL, NULL, &problems) == KILN_OK &&
              problems == 0);

    CHECK("a second sync copies nothing and downloads nothing",
          msync(&f, &res) == KILN_OK && res.trust_versions == 0 && res.versions == 0 &&
              res.records == 0 && res.bytes == 0);
    CHECK("... in fewer requests (the listings and the trust probe only)",
          res.requests < first_requests && res.requests <= 4);
    CHECK("a new version and record on the primary",
          mpublish(&f, "3.0.0", "three", 5) && mpromote(&f, "production", "3.0.0"));
    CHECK("the third sync copies just those", msync(&f, &res) == KILN_OK && res.versions == 1 &&
                                                  res.records == 1 && res.trust_versions == 0 &&
                                                  res.bytes > 0 && res.bytes < first_bytes);
    char *seq =
        mquery(f.mirror, "SELECT max(seq) FROM channel_records WHERE channel = 'production'");
    CHECK("production is at seq 3 in the mirror", seq && !strcmp(seq, "3"));
    free(seq);
out:
    mfree(&f);
}

KILN_TEST(registry_mirror_reports_what_does_not_verify) {
    mfx f;
    if (!CHECK("fixture", minit(&f))) goto out;
    if (!CHECK("a primary with three versions and two channels",
               mpublish(&f, "1.0.0", "one", 3) && mpublish(&f, "2.0.0", "two", 3) &&
                   mpublish(&f, "3.0.0", "three", 5) && mpromote(&f, "production", "1.0.0") &&
                   mpromote(&f, "staging", "1.0.0")))
        goto out;
    /* A compromised or broken primary: 2.0.0's signature file is another version's, 3.0.0's
     * blob has other bytes of the same size, staging's record was edited after signing. */
    char *digest3 =
        mquery(f.primary.root, "SELECT substr(digest, 8) FROM versions WHERE version = '3.0.0'");
    char *blob3 = digest3 ? reg_blob_path(f.primary.root, digest3) : NULL;
    struct stat sb;
    bool tampered = blob3 && stat(blob3, &sb) == 0 &&
                    rfx_sql(f.primary.root, RFX_CONNECT,
                            "UPDATE versions SET signature = (SELECT signature FROM versions WHERE "
                            "version = '1.0.0') WHERE version = '2.0.0'",
                            NULL) &&
                    rfx_sql(f.primary.root, RFX_CONNECT,
                            "UPDATE channel_records SET record = replace(record, 'promote', "
                            "'promoted') WHERE channel = 'staging'",
                            NULL);
    if (tampered) {
        char *junk = kiln_calloc(1, (size_t)sb.st_size);
        tampered = junk && kiln_write_file_atomic(blob3, junk, (size_t)sb.st_size) == KILN_OK;
        free(junk);
    }
    if (!CHECK("tampered", tampered)) goto done;
    kiln_registry_mirror_result res;
    kiln_err rc = msync(&f, &res);
    CHECK("the sync says it: KILN_ERR_VERIFY, three problems",
          rc == KILN_ERR_VERIFY && res.problems == 3 && f.nproblems == 3 &&
              kiln_test_msg_has("3 items did not verify", NULL));
    CHECK("2.0.0's signature: named, not copied",
          mproblem_has(&f, "demo@2.0.0", "signature") &&
              !mquery(f.mirror, "SELECT 1 FROM versions WHERE version = '2.0.0'"));
    CHECK("3.0.0's bytes: named with the digest they hash to, not copied",
          mproblem_has(&f, "demo@3.0.0", "hashes to sha256:") &&
              !mquery(f.mirror, "SELECT 1 FROM versions WHERE version = '3.0.0'"));
    CHECK("staging's edited record: named, not copied",
          mproblem_has(&f, "demo/staging seq 1", NULL) &&
              !mquery(f.mirror, "SELECT 1 FROM channel_records WHERE channel = 'staging'"));
    CHECK("the rest is copied: 1.0.0 and production",
          res.versions == 1 && res.records == 1 &&
              mboth(&f, "SELECT hex(record) FROM channel_records WHERE channel = 'production'"));
    char *p3 = kiln_asprintf("%s/tmp/mirror-%s.partial", f.mirror, digest3);
    CHECK("bytes that hash wrong are not kept", p3 && !kiln_path_exists(p3));
    free(p3);
    /* 2.0.0's bytes hashed right: kept, and only checked again. 3.0.0's are fetched again,
     * twice (once more from the start, as after a resumed download). */
    CHECK("the next sync fetches only the bytes that hashed wrong",
          msync(&f, &res) == KILN_ERR_VERIFY && res.problems == 3 &&
              res.bytes == 2 * (uint64_t)sb.st_size);
    char *problems = mquery(f.mirror, "SELECT value FROM meta WHERE key = 'mirror_last_problems'");
    CHECK("the store remembers how many (for /metrics)", problems && !strcmp(problems, "3"));
    free(problems);

    /* The primary rewrites history: 1.0.0 now has another digest. The mirror keeps its own. */
    CHECK("history rewritten",
          rfx_sql(f.primary.root, RFX_CONNECT,
                  "UPDATE versions SET digest = (SELECT digest FROM versions WHERE "
                  "version = '3.0.0') WHERE version = '1.0.0'",
                  NULL));
    char *before = mquery(f.mirror, "SELECT digest FROM versions WHERE version = '1.0.0'");
    rc = msync(&f, &res);
    char *after = mquery(f.mirror, "SELECT digest FROM versions WHERE version = '1.0.0'");
    CHECK("a loud problem, never an overwrite",
          rc == KILN_ERR_VERIFY && mproblem_has(&f, "demo@1.0.0", "changed on the primary") &&
              before && after && !strcmp(before, after));
    free(before);
    free(after);
done:
    free(digest3);
    free(blob3);
out:
    mfree(&f);
}

/* Every line a sync says, copied or problem, in the order it said them. */
typedef struct said {
    char text[4096];
} said;

static void said_line(said *s, const char *kind, const char *line) {
    const char *at = strchr(line, '@'); /* "demo@2.0.0 ..." -> "kind 2.0.0" */
    size_t n = strlen(s->text), v = at ? strcspn(at + 1, " :") : 0;
    snprintf(s->text + n, sizeof s->text - n, "%s%s %.*s", n ? "," : "", kind, (int)v,
             at ? at + 1 : "");
}

static void said_copied(void *ctx, const char *line) {
    if (strstr(line, "@")) said_line(ctx, "copied", line);
}

static void said_problem(void *ctx, const char *line) {
    said_line(ctx, "problem", line);
}

/* Versions are fetched two at a time (mirror.c, "versions, two in flight"): what the sync
 * says still comes in the primary's order, each version's verdict its own. */
KILN_TEST(registry_mirror_says_it_in_the_listings_order) {
    mfx f;
    if (!CHECK("fixture", minit(&f))) goto out;
    static const char *v[] = {"1.0.0", "2.0.0", "3.0.0", "4.0.0", "5.0.0", "6.0.0", "7.0.0"};
    bool ok = true;
    for (int i = 0; i < 7 && ok; i++) {
        char w[8];
        snprintf(w, sizeof w, "w%d", i);
        ok = mpublish(&f, v[i], w, strlen(w));
    }
    if (!CHECK("a primary with seven versions", ok)) goto out;
    /* 3.0.0 carries 1.0.0's signature; 5.0.0's blob is other bytes of its size; 6.0.0 is
     * listed without a size. */
    char *d5 = mquery(f.primary.root, "SELECT substr(digest, 8) FROM versions WHERE "
                                      "version = '5.0.0'"),
         *b5 = d5 ? reg_blob_path(f.primary.root, d5) : NULL;
    struct stat sb;
    bool tampered =
        b5 && stat(b5, &sb) == 0 &&
        rfx_sql(f.primary.root, RFX_CONNECT,
                "UPDATE versions SET signature = (SELECT signature FROM versions WHERE "
                "version = '1.0.0') WHERE version = '3.0.0'",
                NULL) &&
        rfx_sql(f.primary.root, RFX_CONNECT,
                "UPDATE versions SET size = -1 WHERE version = '6.0.0'", NULL);
    if (tampered) {
        char *junk = kiln_calloc(1, (size_t)sb.st_size);
        tampered = junk && kiln_write_file_atomic(b5, junk, (size_t)sb.st_size) == KILN_OK;
        free(junk);
    }
    free(d5);
    free(b5);
    if (!CHECK("tampered", tampered)) goto out;
    said s = {.text = ""};
    kiln_registry_client_opts c = mclient(f.primary.url, f.primary.admin);
    kiln_registry_mirror_opts o = {.root = f.mirror,
                                   .from = &c,
                                   .trust = f.primary.trust,
                                   .on_copied = said_copied,
                                   .on_problem = said_problem,
                                   .ctx = &s};
    kiln_registry_mirror_result res;
    kiln_err rc = kiln_registry_mirror_sync(&o, &res);
    CHECK("three problems, four copied",
          rc == KILN_ERR_VERIFY && res.problems == 3 && res.versions == 4);
    CHECK("said in the listing's order",
          !strcmp(s.text, "copied 1.0.0,copied 2.0.0,problem 3.0.0,copied 4.0.0,problem 5.0.0,"
                          "problem 6.0.0,copied 7.0.0"));
    if (strcmp(s.text, "copied 1.0.0,copied 2.0.0,problem 3.0.0,copied 4.0.0,problem 5.0.0,"
                       "problem 6.0.0,copied 7.0.0"))
        fprintf(stderr, "    said: %s\n", s.text);
    char *order = mquery(f.mirror, "SELECT group_concat(version, ',') FROM (SELECT version FROM "
                                   "versions ORDER BY rowid)");
    CHECK("the rows went in in that order", order && !strcmp(order, "1.0.0,2.0.0,4.0.0,7.0.0"));
    free(order);
out:
    mfree(&f);
}

/* A primary that lists one archive's digest for two versions: the second is checked against
 * the blob the first committed, not downloaded again (nor into the same file at the same time,
 * where a registry that ignored Range would truncate it under the first), and refused (its
 * signature is of other bytes); the blob is the archive's, byte for byte. */
KILN_TEST(registry_mirror_one_digest_listed_twice) {
    mfx f;
    if (!CHECK("fixture", minit(&f))) goto out;
    /* Archives of some size, so that two downloads of one would overlap. */
    size_t wlen = 8u << 20;
    uint8_t *w = kiln_malloc(wlen);
    for (size_t i = 0; w && i < wlen; i++)
        w[i] = (uint8_t)((i * 2654435761u) >> 13);
    bool published = w && mpublish(&f, "1.0.0", w, wlen) && (w[0] ^= 1, true) &&
                     mpublish(&f, "2.0.0", w, wlen);
    free(w);
    if (!CHECK("a primary with two versions, the second listed with the first's digest",
               published &&
                   rfx_sql(f.primary.root, RFX_CONNECT,
                           "UPDATE versions SET (digest, size) = (SELECT digest, size FROM "
                           "versions WHERE version = '1.0.0') WHERE version = '2.0.0'",
                           NULL)))
        goto out;
    kiln_registry_mirror_result res;
    CHECK("1.0.0 copied, 2.0.0 refused for its signature",
          msync(&f, &res) == KILN_ERR_VERIFY && res.versions == 1 && res.problems == 1 &&
              mproblem_has(&f, "demo@2.0.0", "signature"));
    char *hex = mquery(f.mirror, "SELECT substr(digest, 8) FROM versions"),
         *blob = hex ? reg_blob_path(f.mirror, hex) : NULL;
    uint8_t h[KILN_SHA256_BYTES];
    char got[KILN_SHA256_HEX] = "";
    if (blob && kiln_sha256_file(blob, h) == KILN_OK) kiln_hex(h, sizeof h, got);
    CHECK("the blob held is the archive", hex && !strcmp(got, hex));
    char *size = mquery(f.mirror, "SELECT size FROM versions");
    CHECK("downloaded once", size && res.bytes == strtoull(size, NULL, 10));
    free(size);
    char *p = hex ? kiln_asprintf("%s/tmp/mirror-%s.partial", f.mirror, hex) : NULL;
    CHECK("no partial left", p && !kiln_path_exists(p));
    free(p);
    free(hex);
    free(blob);
out:
    mfree(&f);
}

KILN_TEST(registry_mirror_refuses_what_is_not_a_mirror) {
    mfx f;
    if (!CHECK("fixture", minit(&f))) goto out;
    if (!CHECK("a primary with a version", mpublish(&f, "1.0.0", "one", 3))) goto out;
    kiln_registry_mirror_result res;
    kiln_registry_client_opts c = mclient(f.primary.url, NULL);
    char *file = kiln_test_write("a-file", "x", 1), *other = kiln_test_path("notes"),
         *note = other ? kiln_path_join(other, "todo.txt") : NULL;
    CHECK("fixtures", file && note && kiln_mkdir_p(other) == KILN_OK &&
                          kiln_write_file_atomic(note, "y", 1) == KILN_OK);
    CHECK("a file: refused by name", msync_with(&f, file, &c, &res) == KILN_ERR_USAGE &&
                                         kiln_test_msg_has(file, "is not a directory"));
    char *listing = NULL;
    CHECK("another directory: refused, untouched",
          msync_with(&f, other, &c, &res) == KILN_ERR_USAGE &&
              kiln_test_msg_has(other, "is not a registry store") &&
              (listing = kiln_test_listing(other)) && !strcmp(listing, ".\n..\ntodo.txt\n"));
    free(listing);
    char *before = kiln_test_listing(f.primary.root);
    CHECK("the primary's own store: refused as a primary, untouched",
          msync_with(&f, f.primary.root, &c, &res) == KILN_ERR_USAGE &&
              kiln_test_msg_has("is a registry store that is not a mirror", "1 version") &&
              !mquery(f.primary.root, "SELECT 1 FROM meta"));
    char *after = kiln_test_listing(f.primary.root);
    CHECK("... nothing written there", before && after && !strcmp(before, after));
    free(before), free(after);
    /* A store with nothing published, served as a primary by a running server. */
    char *empty = kiln_test_path("empty"), url[64];
    kiln_registry_server *esrv = NULL;
    CHECK("an empty store served as a primary: refused",
          empty && mserve(empty, f.primary.trust, &esrv, url) &&
              msync_with(&f, empty, &c, &res) == KILN_ERR_USAGE &&
              kiln_test_msg_has("served by a running kiln registry serve", NULL));
    kiln_registry_server_stop(esrv, 1000);
    CHECK("the same store once no server runs on it (nothing published): it becomes the mirror",
          msync_with(&f, empty, &c, &res) == KILN_OK && res.versions == 1);
    /* A mirror of one URL is not a mirror of another. */
    kiln_registry_client_opts c2 = mclient("http://127.0.0.1:9", NULL);
    CHECK("a mirror of another URL: refused, naming both",
          msync_with(&f, empty, &c2, &res) == KILN_ERR_USAGE &&
              kiln_test_msg_has("is a mirror of", "not of http://127.0.0.1:9"));
    /* A bad policy or a primary that does not answer: no store is made. */
    char *fresh = kiln_test_path("fresh");
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", f.primary.trust);
    snprintf(f.primary.trust, sizeof f.primary.trust, "%s", file);
    CHECK("a bad --trust: refused naming it, nothing made",
          msync_with(&f, fresh, &c, &res) != KILN_OK && kiln_test_msg_has(file, NULL) &&
              !kiln_path_exists(fresh));
    snprintf(f.primary.trust, sizeof f.primary.trust, "%s", saved);
    CHECK("a primary that does not answer: nothing made",
          msync_with(&f, fresh, &c2, &res) == KILN_ERR_NETWORK && !kiln_path_exists(fresh));
    free(file), free(other), free(note), free(empty), free(fresh);
out:
    mfree(&f);
}

KILN_TEST(registry_mirror_serves_read_only) {
    mfx f;
    rfx_resp a = {0}, b = {0};
    if (!CHECK("fixture", minit(&f))) goto out;
    kiln_registry_mirror_result res;
    if (!CHECK("a primary and its mirror", mtrust2(&f) && mpublish(&f, "1.0.0", "one", 3) &&
                                               mpromote(&f, "production", "1.0.0") &&
                                               msync(&f, &res) == KILN_OK &&
                                               mserve(f.mirror, f.primary.trust, &f.msrv, f.murl)))
        goto out;
    CHECK("the current record, byte for byte as the primary serves it",
          rfx_http(f.primary.url, "GET", "/v1/models/demo/channels/production", NULL, NULL, NULL,
                   &a) == 200 &&
              rfx_http(f.murl, "GET", "/v1/models/demo/channels/production", NULL, NULL, NULL,
                       &b) == 200 &&
              a.len == b.len && !memcmp(a.body, b.body, a.len));
    CHECK("trust version 2 likewise",
          rfx_http(f.primary.url, "GET", "/v1/trust/2", NULL, NULL, NULL, &a) == 200 &&
              rfx_http(f.murl, "GET", "/v1/trust/2", NULL, NULL, NULL, &b) == 200 &&
              a.len == b.len && !memcmp(a.body, b.body, a.len));
    char msg[256];
    snprintf(msg, sizeof msg, "this registry is a mirror of %s: publish there", f.primary.url);
    char *tok = NULL;
    CHECK("a token on the mirror (its own)",
          kiln_registry_token_create(f.mirror, "ops", KILN_SCOPE_ADMIN, &tok) == KILN_OK);
    CHECK("PUT of a version: 405 with the message",
          rfx_http(f.murl, "PUT", "/v1/models/demo/versions/9.0.0", tok, "x", NULL, &a) == 405 &&
              strstr(a.body, msg));
    CHECK("PUT of a channel record: 405",
          rfx_http(f.murl, "PUT", "/v1/models/demo/channels/production", tok, "{}", NULL, &a) ==
                  405 &&
              strstr(a.body, msg));
    CHECK("PUT of a trust version: 405, even without a token",
          rfx_http(f.murl, "PUT", "/v1/trust/3", NULL, "{}", NULL, &a) == 405 &&
              strstr(a.body, msg));
    CHECK("nothing was written by them",
          !mquery(f.mirror, "SELECT 1 FROM versions WHERE version = '9.0.0'"));
    CHECK("/healthz: ok, of what, when",
          rfx_http(f.murl, "GET", "/healthz", NULL, NULL, NULL, &a) == 200 &&
              !strncmp(a.body, "ok\n", 3) && strstr(a.body, f.primary.url) &&
              strstr(a.body, "last synced"));
    char synced[128];
    snprintf(synced, sizeof synced, "mirror of %s, synced ", f.primary.url);
    CHECK("the web page says so",
          rfx_http(f.murl, "GET", "/", NULL, NULL, NULL, &a) == 200 && strstr(a.body, synced));
    CHECK("/healthz of the primary: ok, nothing more",
          rfx_http(f.primary.url, "GET", "/healthz", NULL, NULL, NULL, &a) == 200 &&
              !strcmp(a.body, "ok\n"));
    CHECK("/metrics: the last sync, the lag and the problems",
          rfx_http(f.murl, "GET", "/metrics", NULL, NULL, NULL, &a) == 200 &&
              strstr(a.body, "kiln_registry_mirror_last_sync_seconds 1") &&
              strstr(a.body, "kiln_registry_mirror_lag_seconds ") &&
              strstr(a.body, "kiln_registry_mirror_sync_problems 0"));
    CHECK("a sync beside the running server (no server lock needed)",
          mpublish(&f, "2.0.0", "two", 3) && msync(&f, &res) == KILN_OK && res.versions == 1 &&
              rfx_http(f.murl, "GET", "/v1/models/demo/versions/2.0.0", NULL, NULL, NULL, &a) ==
                  200);
    size_t removed;
    uint64_t bytes;
    CHECK("gc refused while the mirror is served",
          kiln_registry_gc(f.mirror, &removed, &bytes) == KILN_ERR_CONFLICT);
    free(tok);
out:
    rfx_resp_free(&a), rfx_resp_free(&b);
    mfree(&f);
}

/* A sync stopped in the middle of a download (by its progress hook, as SIGINT stops the CLI)
 * stores nothing; the next resumes the download from where it stopped. */
typedef struct cut {
    uint64_t at;
    bool fired;
} cut;

static int cut_progress(void *ctx, uint64_t done, uint64_t total) {
    cut *c = ctx;
    (void)total;
    if (c->at && done >= c->at) {
        c->fired = true;
        return 1;
    }
    return 0;
}

KILN_TEST(registry_mirror_resumes_a_cut_download) {
    mfx f;
    if (!CHECK("fixture", minit(&f))) goto out;
    size_t n = kiln_test_sanitized() ? (1u << 20) : (4u << 20);
    unsigned char *w = kiln_calloc(1, n);
    if (!CHECK("weights", w)) goto out;
    randombytes_buf(w, n); /* incompressible: the archive is as big */
    bool ok = mpublish(&f, "1.0.0", w, n) && mpromote(&f, "production", "1.0.0");
    free(w);
    if (!CHECK("a big version on the primary", ok)) goto out;
    char *size = mquery(f.primary.root, "SELECT size FROM versions");
    uint64_t total = size ? strtoull(size, NULL, 10) : 0;
    free(size);
    cut k = {.at = 64 * 1024}; /* past any JSON answer: the blob */
    kiln_registry_client_opts c = mclient(f.primary.url, NULL);
    c.progress = cut_progress;
    c.progress_ctx = &k;
    kiln_registry_mirror_result res;
    kiln_err rc = msync_with(&f, f.mirror, &c, &res);
    char *hex = mquery(f.primary.root, "SELECT substr(digest, 8) FROM versions");
    char *partial = hex ? kiln_asprintf("%s/tmp/mirror-%s.partial", f.mirror, hex) : NULL;
    struct stat sb;
    CHECK("cut mid-blob: the sync stops with the error, nothing stored",
          k.fired && rc == KILN_ERR_NETWORK && !mquery(f.mirror, "SELECT 1 FROM versions") &&
              !mquery(f.mirror, "SELECT 1 FROM channel_records"));
    CHECK("the partial download is kept",
          partial && stat(partial, &sb) == 0 && sb.st_size > 0 && (uint64_t)sb.st_size <= total);
    /* Loopback is fast: the cut may come after the last byte. Cut the file to a third, as a
     * kill in the middle of the blob leaves it. */
    uint64_t had = total / 3;
    if (partial && stat(partial, &sb) == 0 && (uint64_t)sb.st_size < had)
        had = (uint64_t)sb.st_size; /* cut earlier: truncate would pad it with zeros */
    CHECK("a third of the blob left", partial && truncate(partial, (off_t)had) == 0);
    k.at = 0;
    CHECK("the next sync resumes it: only the rest is downloaded",
          msync_with(&f, f.mirror, &c, &res) == KILN_OK && res.versions == 1 && res.records == 1 &&
              res.bytes == total - had);
    CHECK("the partial is gone, the blob in place",
          partial && !kiln_path_exists(partial) &&
              mboth(&f, "SELECT digest || size FROM versions"));
    size_t problems = 9;
    CHECK("fsck: consistent",
          kiln_registry_fsck(f.mirror, f.primary.trust, NULL, NULL, &problems) == KILN_OK &&
              !problems);
    free(hex);
    free(partial);
out:
    mfree(&f);
}

/* ---- pulls over several registries ---- */

typedef struct notes {
    char text[4096];
    size_t len;
} notes;

static void mnote(void *ctx, const char *line) {
    notes *n = ctx;
    if (n->len < sizeof n->text)
        n->len += (size_t)snprintf(n->text + n->len, sizeof n->text - n->len, "%s\n", line);
}

/* A pull's options: urls in order, into out, under the primary's policy and state; each
 * registry passed over noted in heard (emptied first). */
static kiln_pull_opts mopts(const mfx *f, const char *const *urls, size_t n, const char *ref,
                            const char *out, notes *heard) {
    if (heard) memset(heard, 0, sizeof *heard);
    kiln_pull_opts o = {.registries = urls,
                        .nregistries = n,
                        .ref = ref,
                        .trust = f->primary.trust,
                        .out = out,
                        .state = f->primary.state,
                        .on_registry = mnote,
                        .registry_ctx = heard};
    return o;
}

/* kiln_pull (the public API) over urls, in order; res may be NULL. */
static kiln_err mpull(const mfx *f, const char *const *urls, size_t n, const char *ref,
                      notes *heard, kiln_pull_result *res) {
    char out[1100];
    snprintf(out, sizeof out, "%s/svc", kiln_test_dir());
    kiln_pull_opts o = mopts(f, urls, n, ref, out, heard);
    return kiln_pull(&o, res);
}

KILN_TEST(registry_mirror_pull_fails_over) {
    mfx f;
    if (!CHECK("fixture", minit(&f))) goto out;
    kiln_registry_mirror_result res;
    if (!CHECK("a primary and a synced mirror, both served",
               mpublish(&f, "1.0.0", "one", 3) && mpromote(&f, "production", "1.0.0") &&
                   msync(&f, &res) == KILN_OK &&
                   mserve(f.mirror, f.primary.trust, &f.msrv, f.murl)))
        goto out;
    const char *pm[] = {f.primary.url, f.murl};
    kiln_pull_result r;
    notes heard;
    CHECK("both up: pulled, nothing passed over",
          mpull(&f, pm, 2, "demo@production", &heard, &r) == KILN_OK && r.seq == 1 &&
              !strcmp(r.version, "1.0.0") && heard.len == 0);
    kiln_registry_server_stop(f.primary.srv, 1000);
    f.primary.srv = NULL;
    CHECK("the primary down: pulled from the mirror, and said so",
          mpull(&f, pm, 2, "demo@production", &heard, &r) == KILN_OK && r.seq == 1 &&
              strstr(heard.text, f.primary.url) && strstr(heard.text, "trying"));
    CHECK("by version too",
          mpull(&f, pm, 2, "demo@1.0.0", &heard, &r) == KILN_OK && !strcmp(r.version, "1.0.0"));
    const char *dead[] = {f.primary.url, "http://127.0.0.1:9"};
    CHECK("no registry answers: the error names each",
          mpull(&f, dead, 2, "demo@production", &heard, &r) == KILN_ERR_NETWORK &&
              kiln_test_msg_has(f.primary.url, "127.0.0.1:9"));
out:
    mfree(&f);
}

/* ---- a registry that hangs ---- */

static double mnow(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A proxy of the registry at `to` that answers every request as it does, except that a
 * blob's download stops halfway, the connection left open until the client gives up. */
typedef struct stall {
    const char *to;
    atomic_int stalled;
} stall;

static bool stall_answer(void *ctx, int c, const char *req) {
    stall *s = ctx;
    char path[1024];
    if (sscanf(req, "GET %1023s ", path) != 1) return true;
    rfx_resp r = {0};
    rfx_http(s->to, "GET", path, NULL, NULL, NULL, &r);
    char head[256];
    bool blob = !strncmp(path, "/v1/blobs/", 10) && r.status == 200;
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.1 %ld X\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                      r.status, r.len);
    bool ok = send(c, head, (size_t)hl, MSG_NOSIGNAL) == hl &&
              send(c, r.body, blob ? r.len / 2 : r.len, MSG_NOSIGNAL) >= 0;
    if (blob && ok) {
        atomic_fetch_add(&s->stalled, 1);
        /* Until the client gives up; 20 s at most, so that a client that never does fails
         * the test's timing instead of hanging it. */
        struct timeval tv = {20, 0};
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char b;
        (void)!recv(c, &b, 1, 0);
    }
    rfx_resp_free(&r);
    return true;
}

/* A registry that takes connections and never answers (a stopped process, a disk stall) is
 * passed over within the pull's timeout, not the minute a lone registry gets; so is one whose
 * download stops halfway, and one behind a partition (its connects hang). With several registries
 * the defaults are 5 s and 10 s. */
KILN_TEST(registry_mirror_hung_registry_passed_over) {
    mfx f;
    int hung = -1, bh[3] = {-1, -1, -1};
    char burl[64];
    stall st = {0};
    rfx_stub stub = {.started = false};
    char hurl[64];
    if (!CHECK("fixture", minit(&f))) goto out;
    if (!CHECK("a primary with demo@production",
               mpublish(&f, "1.0.0", "one", 3) && mpromote(&f, "production", "1.0.0")))
        goto out;
    /* Listening, never accepting: the kernel completes each connect, no answer comes. */
    if (!CHECK("a hung registry", rfx_listen(&hung, hurl))) goto out;
    const char *hp[] = {hurl, f.primary.url};
    char out[1100];
    snprintf(out, sizeof out, "%s/svc", kiln_test_dir());
    notes heard;
    kiln_pull_opts o = mopts(&f, hp, 2, "demo@production", out, &heard);
    o.timeout_ms = 300;
    kiln_pull_result r;
    double t0 = mnow();
    kiln_err rc = kiln_pull(&o, &r);
    double dt = mnow() - t0;
    CHECK("pulled from the next registry", rc == KILN_OK && !strcmp(r.version, "1.0.0"));
    if (!CHECK("the hung one passed over for its timeout, once",
               strstr(heard.text, hurl) &&
                   (strstr(heard.text, "timed out after") || strstr(heard.text, "stalled")) &&
                   !strstr(strstr(heard.text, hurl) + 1, hurl)))
        fprintf(stderr, "    heard: %s", heard.text);
    CHECK("within its timeout of 300 ms (under 3 s; not the 5 s default, nor 60 s)", dt < 3.0);

    /* A download that stops halfway: passed over after timeout_ms without a byte. */
    st.to = f.primary.url;
    if (!CHECK("a stalling proxy", rfx_stub_start(&stub, stall_answer, &st))) goto out;
    const char *sp[] = {stub.url, f.primary.url};
    o.registries = sp;
    o.timeout_ms = 1000;
    memset(&heard, 0, sizeof heard);
    t0 = mnow();
    rc = kiln_pull(&o, &r);
    dt = mnow() - t0;
    CHECK("pulled from the next registry", rc == KILN_OK && !strcmp(r.version, "1.0.0"));
    if (!CHECK("the stalled download passed over",
               atomic_load(&st.stalled) == 1 && strstr(heard.text, stub.url) &&
                   strstr(heard.text, "downloading") &&
                   strstr(heard.text, "stalled: not a byte moved in 1000 ms")))
        fprintf(stderr, "    heard: %s", heard.text);
    CHECK("within its 1 s (under 5 s; not the 10 s default, nor 60 s)", dt < 5.0);

    /* A partition: the host drops every packet, so the connect itself hangs (libcurl's own
     * connect timeout is 10 s; the request's deadline covers the connect too). */
    if (!CHECK("a port that drops connects", rfx_blackhole(bh, burl))) goto out;
    const char *bp[] = {burl, f.primary.url};
    o.registries = bp;
    o.timeout_ms = 300;
    memset(&heard, 0, sizeof heard);
    t0 = mnow();
    rc = kiln_pull(&o, &r);
    dt = mnow() - t0;
    CHECK("pulled from the next registry", rc == KILN_OK && !strcmp(r.version, "1.0.0"));
    if (!CHECK("the unreachable one passed over for its connect timeout, once",
               strstr(heard.text, burl) && strstr(heard.text, "timed out after") &&
                   !strstr(strstr(heard.text, burl) + 1, burl)))
        fprintf(stderr, "    heard: %s", heard.text);
    CHECK("within its timeout of 300 ms (under 3 s)", dt < 3.0);

    /* The defaults, with several registries and with one. */
    kiln_registry_client_opts cs[2] = {{.url = hurl}, {.url = f.primary.url, .timeout_ms = 7}};
    reg_registries regs;
    if (CHECK("registries", reg_registries_init(&regs, cs, 2, NULL, NULL) == KILN_OK)) {
        CHECK("several: 5 s a request, 10 s a stall, a given one kept",
              regs.c[0].timeout_ms == KILN_REGISTRY_FAILOVER_TIMEOUT_MS &&
                  regs.c[0].stall_ms == KILN_REGISTRY_FAILOVER_STALL_MS &&
                  KILN_REGISTRY_FAILOVER_TIMEOUT_MS == 5000 && regs.c[1].timeout_ms == 7);
        reg_registries_release(&regs);
    }
    if (CHECK("one registry", reg_registries_init(&regs, cs, 1, NULL, NULL) == KILN_OK)) {
        CHECK("alone: the lone registry's defaults (0)",
              regs.c[0].timeout_ms == 0 && regs.c[0].stall_ms == 0);
        reg_registries_release(&regs);
    }
out:
    if (hung >= 0) close(hung);
    rfx_blackhole_close(bh);
    rfx_stub_stop(&stub);
    mfree(&f);
}

KILN_TEST(registry_mirror_newest_record_wins) {
    mfx f;
    if (!CHECK("fixture", minit(&f))) goto out;
    kiln_registry_mirror_result res;
    if (!CHECK("a mirror synced at seq 1, then seq 2 promoted on the primary only",
               mpublish(&f, "1.0.0", "one", 3) && mpublish(&f, "2.0.0", "two", 3) &&
                   mpromote(&f, "production", "1.0.0") && msync(&f, &res) == KILN_OK &&
                   mpromote(&f, "production", "2.0.0") &&
                   mserve(f.mirror, f.primary.trust, &f.msrv, f.murl)))
        goto out;
    const char *mp[] = {f.murl, f.primary.url}, *pm[] = {f.primary.url, f.murl}, *m[] = {f.murl};
    kiln_pull_result r;
    notes heard;
    CHECK("stale mirror first: the primary's newer record wins",
          mpull(&f, mp, 2, "demo@production", &heard, &r) == KILN_OK && r.seq == 2 &&
              !strcmp(r.version, "2.0.0") && strstr(heard.text, "using the newer"));
    CHECK("primary first: the same", mpull(&f, pm, 2, "demo@production", &heard, &r) == KILN_OK &&
                                         r.seq == 2 && !strcmp(r.version, "2.0.0"));
    kiln_registry_server_stop(f.primary.srv, 1000);
    f.primary.srv = NULL;
    CHECK("only the stale mirror left: refused (seq 1 is below the 2 accepted), naming it",
          mpull(&f, pm, 2, "demo@production", &heard, &r) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("lower than 2 accepted before", NULL) &&
              strstr(heard.text, "a stale mirror"));
    CHECK("the mirror alone (one registry): the single-registry refusal",
          mpull(&f, m, 1, "demo@production", &heard, &r) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("has seq 1, lower than 2 accepted before", NULL));
out:
    mfree(&f);
}

KILN_TEST(registry_mirror_bad_blob_moves_on) {
    mfx f;
    if (!CHECK("fixture", minit(&f))) goto out;
    kiln_registry_mirror_result res;
    if (!CHECK("a primary and a synced mirror",
               mpublish(&f, "1.0.0", "one", 3) && mpromote(&f, "production", "1.0.0") &&
                   msync(&f, &res) == KILN_OK &&
                   mserve(f.mirror, f.primary.trust, &f.msrv, f.murl)))
        goto out;
    /* The mirror's disk now serves other bytes for the blob (same size). */
    char *hex = mquery(f.mirror, "SELECT substr(digest, 8) FROM versions"),
         *blob = hex ? reg_blob_path(f.mirror, hex) : NULL;
    struct stat sb;
    bool bad = blob && stat(blob, &sb) == 0;
    if (bad) {
        char *junk = kiln_calloc(1, (size_t)sb.st_size);
        bad = junk && kiln_write_file_atomic(blob, junk, (size_t)sb.st_size) == KILN_OK;
        free(junk);
    }
    if (!CHECK("the mirror's blob replaced", bad)) goto done;
    const char *mp[] = {f.murl, f.primary.url};
    kiln_pull_result r;
    notes heard;
    CHECK("mirror first: its bad archive is passed over loudly, the primary's pulled",
          mpull(&f, mp, 2, "demo@production", &heard, &r) == KILN_OK &&
              !strcmp(r.version, "1.0.0") && strstr(heard.text, f.murl) &&
              strstr(heard.text, "does not verify") && strstr(heard.text, "hashes to"));
    kiln_registry_server_stop(f.primary.srv, 1000);
    f.primary.srv = NULL;
    CHECK("primary down too: no model, the reason of each named",
          mpull(&f, mp, 2, "demo@production", &heard, &r) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("no registry gave demo@production that verifies", "hashes to") &&
              kiln_test_msg_has(f.primary.url, NULL));
done:
    free(hex);
    free(blob);
out:
    mfree(&f);
}

typedef struct heard_updates {
    pthread_mutex_t mu;
    int ok, failed;
    notes passed; /* what on_registry heard */
} heard_updates;

static void watch_note(void *ctx, const char *line) {
    heard_updates *u = ctx;
    pthread_mutex_lock(&u->mu);
    mnote(&u->passed, line);
    pthread_mutex_unlock(&u->mu);
}

static void watch_update(void *ctx, kiln_err rc, const char *msg, const kiln_pull_result *r) {
    heard_updates *u = ctx;
    (void)msg, (void)r;
    pthread_mutex_lock(&u->mu);
    if (rc)
        u->failed++;
    else
        u->ok++;
    pthread_mutex_unlock(&u->mu);
}

/* demo@version whose weights are a real model from the shared vectors (kiln_watch loads it). */
static bool mpublish_model(mfx *f, const char *version, const char *vector) {
    char name[64], hex[KILN_SHA256_HEX];
    snprintf(name, sizeof name, "m-%s", version);
    return mpublish_archive(f, rfx_vector_archive(name, vector, version, f->sk[REL], hex));
}

KILN_TEST(registry_mirror_watch_follows_through_the_mirror) {
    mfx f;
    heard_updates u = {.mu = PTHREAD_MUTEX_INITIALIZER};
    kiln_watch *w = NULL;
    if (!CHECK("fixture", minit(&f))) goto out;
    kiln_registry_mirror_result res;
    if (!CHECK("a primary with two models, production at the first, and its mirror",
               mpublish_model(&f, "1.0.0", "tsmoe-dense.model.safetensors") &&
                   mpublish_model(&f, "2.0.0", "tsmoe-moe.model.safetensors") &&
                   mpromote(&f, "production", "1.0.0") && msync(&f, &res) == KILN_OK &&
                   mserve(f.mirror, f.primary.trust, &f.msrv, f.murl)))
        goto out;
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/watch", kiln_test_dir());
    const char *mirrors[] = {f.murl};
    /* The service's primary is down (a dead address: the test still promotes on the real
     * one, which the watch never reaches); the list's mirror serves it. */
    kiln_watch_opts o = {
        .pull = {.registry = "http://127.0.0.1:9", /* the single URL, then the list */
                 .registries = mirrors,
                 .nregistries = 1,
                 .ref = "demo@production",
                 .trust = f.primary.trust,
                 .out = dir,
                 .state = f.primary.state,
                 .on_registry = watch_note,
                 .registry_ctx = &u},
        .interval_ms = 20,
        .on_update = watch_update,
        .ctx = &u};
    if (!CHECK("the watch starts on the dense model, through the mirror",
               kiln_watch_start(&o, &w) == KILN_OK))
        goto out;
    uint64_t g = 0;
    const kiln_model *m = kiln_watch_acquire(w, &g);
    CHECK("generation 1: dense", g == 1 && kiln_model_config_get(m)->n_experts == 0);
    kiln_watch_release(w, m);
    CHECK("promoted on the primary, synced to the mirror",
          mpromote(&f, "production", "2.0.0") && msync(&f, &res) == KILN_OK && res.records == 1);
    for (int i = 0; i < 500 && g < 2; i++) {
        m = kiln_watch_acquire(w, &g);
        kiln_watch_release(w, m);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    m = kiln_watch_acquire(w, &g);
    CHECK("generation 2 through the mirror: the MoE model",
          g == 2 && kiln_model_config_get(m)->n_experts > 0);
    kiln_watch_release(w, m);
    pthread_mutex_lock(&u.mu);
    CHECK("the watch said it passed the primary over",
          strstr(u.passed.text, "127.0.0.1:9") && strstr(u.passed.text, "trying"));
    pthread_mutex_unlock(&u.mu);
    kiln_watch_stop(w);
out:
    mfree(&f);
}

/* A registry that answers 404 to everything until `hang` is set, then takes each connection
 * and answers nothing (held open until the test closes them). */
typedef struct hang_stub {
    atomic_int hang, hung;
    int held[64], nheld;
} hang_stub;

static bool hang_answer(void *ctx, int c, const char *req) {
    hang_stub *s = ctx;
    (void)req;
    if (!atomic_load(&s->hang)) {
        rfx_stub_answer(c, 404, "{\"error\":\"no\"}");
        return true;
    }
    atomic_fetch_add(&s->hung, 1);
    if (s->nheld == 64) return true;
    s->held[s->nheld++] = c;
    return false;
}

static void count_failures(void *ctx, kiln_err rc, const char *message,
                           const kiln_pull_result *r) {
    (void)message, (void)r;
    if (rc) atomic_fetch_add((atomic_int *)ctx, 1);
}

/* kiln_watch_stop while a poll waits on a registry that hangs returns at once (its transfers
 * are cancelled), not after the request's deadline, and reports no failure for it. */
KILN_TEST(registry_mirror_watch_stops_while_a_registry_hangs) {
    mfx f;
    hang_stub h = {.nheld = 0};
    rfx_stub stub = {.started = false};
    char dir[1100];
    if (!CHECK("fixture", minit(&f))) goto out;
    if (!CHECK("a primary with demo@production",
               mpublish_model(&f, "1.0.0", "tsmoe-dense.model.safetensors") &&
                   mpromote(&f, "production", "1.0.0")))
        goto out;
    if (!CHECK("a registry that will hang", rfx_stub_start(&stub, hang_answer, &h))) goto out;
    snprintf(dir, sizeof dir, "%s/svc", kiln_test_dir());
    const char *regs[] = {f.primary.url, stub.url};
    atomic_int failures = 0;
    notes heard;
    kiln_watch_opts wo = {.pull = mopts(&f, regs, 2, "demo@production", dir, &heard),
                          .interval_ms = 20,
                          .on_update = count_failures,
                          .ctx = &failures};
    wo.pull.timeout_ms = 20000;
    kiln_watch *w = NULL;
    if (!CHECK("the watch starts", kiln_watch_start(&wo, &w) == KILN_OK)) goto out;
    atomic_store(&h.hang, 1);
    for (int i = 0; i < 500 && atomic_load(&h.hung) == 0; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK("a poll waits on the hung registry", atomic_load(&h.hung) > 0);
    double t0 = mnow();
    kiln_watch_stop(w);
    double dt = mnow() - t0;
    CHECK("stopped within 3 s, not the request's 20 s", dt < 3.0);
    CHECK("no failure reported for the cancelled poll", atomic_load(&failures) == 0);
out:
    rfx_stub_stop(&stub);
    for (int i = 0; i < h.nheld; i++)
        close(h.held[i]);
    mfree(&f);
}

/* A registry over HTTPS (a certificate from a private CA): kiln_pull without that CA is refused
 * at the handshake, with kiln_pull_opts.ca_file it pulls, and a kiln_watch keeps its own copy
 * of the path (the caller's string freed after the start). docs/registry.md, "HTTPS". */
KILN_TEST(registry_tls_pull_and_watch) {
    mfx f;
    kiln_registry_server *srv = NULL;
    kiln_watch *w = NULL;
    char *cap = NULL;
    if (!CHECK("fixture", minit(&f))) goto out;
    if (!CHECK("a primary with demo@production",
               mpublish_model(&f, "1.0.0", "tsmoe-dense.model.safetensors") &&
                   mpromote(&f, "production", "1.0.0")))
        goto out;
    char ca[1024], cert[1024], key[1024];
    if (!CHECK("a CA and a certificate for 127.0.0.1 (openssl)", rfx_tls_files(ca, cert, key)))
        goto out;
    kiln_registry_server_stop(f.primary.srv, 1000);
    f.primary.srv = NULL;
    kiln_registry_server_opts so = {.root = f.primary.root,
                                    .listen = "127.0.0.1:0",
                                    .trust = f.primary.trust,
                                    .threads = 2,
                                    .tls_cert = cert,
                                    .tls_key = key};
    if (!CHECK("served over HTTPS", kiln_registry_server_start(&so, &srv) == KILN_OK)) goto out;
    char url[64], out[1100], dir[1100];
    snprintf(url, sizeof url, "https://127.0.0.1:%u", (unsigned)kiln_registry_server_port(srv));
    snprintf(out, sizeof out, "%s/svc", kiln_test_dir());
    snprintf(dir, sizeof dir, "%s/watch", kiln_test_dir());
    const char *u[] = {url};
    notes heard;
    kiln_pull_opts po = mopts(&f, u, 1, "demo@production", out, &heard);
    kiln_pull_result r;
    unsetenv("KILN_REGISTRY_CA");
    CHECK("without the CA: refused at the handshake",
          kiln_pull(&po, &r) == KILN_ERR_NETWORK &&
              kiln_test_msg_has("SSL certificate problem", NULL));
    po.ca_file = cap = kiln_strdup(ca);
    CHECK("with it: pulled", kiln_pull(&po, &r) == KILN_OK && !strcmp(r.version, "1.0.0"));
    atomic_int failures = 0;
    kiln_watch_opts wo = {
        .pull = po, .interval_ms = 20, .on_update = count_failures, .ctx = &failures};
    wo.pull.out = dir;
    if (!CHECK("a watch over HTTPS starts", kiln_watch_start(&wo, &w) == KILN_OK)) goto out;
    free(cap); /* the watch holds its own copy */
    cap = NULL;
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    CHECK("and polls without a failure", atomic_load(&failures) == 0);
out:
    kiln_watch_stop(w);
    free(cap);
    kiln_registry_server_stop(srv, 1000);
    mfree(&f);
}

/* What a start's on_update heard: the last failure's message, and how many. */
typedef struct heard_start {
    int failures;
    char last[2048];
} heard_start;

static void on_start_note(void *ctx, kiln_err rc, const char *message, const kiln_pull_result *r) {
    heard_start *h = ctx;
    (void)r;
    if (!rc) return;
    h->failures++;
    snprintf(h->last, sizeof h->last, "%s", message);
}

/* Start a watch over urls into dir; the model's expert count, -1 when the start failed. */
static int mwatch_once(mfx *f, const char *const *urls, size_t n, const char *dir, heard_start *h) {
    notes heard;
    memset(h, 0, sizeof *h);
    kiln_watch_opts wo = {.pull = mopts(f, urls, n, "demo@production", dir, &heard),
                          .interval_ms = 60000,
                          .on_update = on_start_note,
                          .ctx = h};
    kiln_watch *w = NULL;
    if (kiln_watch_start(&wo, &w)) return -1;
    uint64_t g;
    const kiln_model *m = kiln_watch_acquire(w, &g);
    int e = kiln_model_config_get(m)->n_experts;
    kiln_watch_release(w, m);
    kiln_watch_stop(w);
    return e;
}

/* The primary is down and the mirror is behind (a promotion it has not synced yet): a
 * restarted service serves the newer model it kept, rather than failing (the mirror's record
 * is older than this client accepted) or running the older one; through a lone stale mirror
 * too. With nothing kept, the start fails as a pull does. */
KILN_TEST(registry_mirror_watch_starts_past_a_stale_mirror) {
    mfx f;
    kiln_registry_mirror_result res;
    char dir[1100], fresh[1100];
    heard_start h;
    if (!CHECK("fixture", minit(&f))) goto out;
    if (!CHECK("production seq 1 synced to the mirror, then seq 2 on the primary only",
               mpublish_model(&f, "1.0.0", "tsmoe-dense.model.safetensors") &&
                   mpublish_model(&f, "2.0.0", "tsmoe-moe.model.safetensors") &&
                   mpromote(&f, "production", "1.0.0") && msync(&f, &res) == KILN_OK &&
                   mpromote(&f, "production", "2.0.0") &&
                   mserve(f.mirror, f.primary.trust, &f.msrv, f.murl)))
        goto out;
    snprintf(dir, sizeof dir, "%s/svc", kiln_test_dir());
    snprintf(fresh, sizeof fresh, "%s/fresh", kiln_test_dir());
    const char *both[] = {f.primary.url, f.murl}, *mirror[] = {f.murl};
    CHECK("both up: 2.0.0 (the MoE model), kept", mwatch_once(&f, both, 2, dir, &h) > 0);
    kiln_registry_server_stop(f.primary.srv, 1000);
    f.primary.srv = NULL;
    bool ok = mwatch_once(&f, both, 2, dir, &h) > 0;
    if (!CHECK("primary down, mirror stale: the kept 2.0.0 served, and said so",
               ok && h.failures == 1 && strstr(h.last, "lower than 2 accepted before") &&
                   strstr(h.last, "serving demo@2.0.0 (production seq 2")))
        fprintf(stderr, "    heard: %s\n", h.last);
    ok = mwatch_once(&f, mirror, 1, dir, &h) > 0;
    if (!CHECK("the stale mirror alone: the same",
               ok && h.failures == 1 && strstr(h.last, "lower than 2 accepted before") &&
                   strstr(h.last, "serving demo@2.0.0")))
        fprintf(stderr, "    heard: %s\n", h.last);
    CHECK("nothing kept: refused as a pull refuses a stale record",
          mwatch_once(&f, mirror, 1, fresh, &h) == -1 &&
              kiln_test_msg_has("lower than 2 accepted before", NULL));
out:
    mfree(&f);
}

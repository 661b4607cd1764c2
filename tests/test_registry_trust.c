/* test_registry_trust.c - versions of the trust policy through a real registry on loopback:
 * the routes and their refusals, the store (old stores without the table, the chain a server
 * walks at start and fsck checks), the swap of the policy under concurrent requests, and the
 * client's walk (pull, state, a compromised registry, a gap, kiln_watch). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "registry_fx.h"
#include "registry_int.h"
#include "test.h"
#include "testutil.h"

/* r1 r2 r3: root keys; rel: release; p1 p2 p3 (alice, bob, carol): promote. */
enum { R1, R2, R3, REL, P1, P2, P3, NK };
static const char *const kname[NK] = {"r1", "r2", "r3", "rel", "alice", "bob", "carol"};

typedef struct tfx {
    rfx reg; /* tokens: admin, pub, prom */
    kiln_sign_seckey *sk[NK];
    char b64[NK][KILN_SIGN_PUBKEY_B64];
} tfx;

/* The policy of version v: roots r1 r2 (threshold 2) and the promote keys in mask (bit per
 * key), staging threshold 1, production 2. Caller frees. */
static char *tpolicy(const tfx *f, int v, unsigned promote, int root3) {
    char keys[4096];
    int n = snprintf(keys, sizeof keys,
                     "{\"name\":\"r1\",\"pubkey\":\"%s\",\"roles\":[\"root\"]},"
                     "{\"name\":\"r2\",\"pubkey\":\"%s\",\"roles\":[\"root\"]},"
                     "{\"name\":\"rel\",\"pubkey\":\"%s\",\"roles\":[\"release\"]}",
                     f->b64[R1], f->b64[R2], f->b64[REL]);
    if (root3)
        n += snprintf(keys + n, sizeof keys - (size_t)n,
                      ",{\"name\":\"r3\",\"pubkey\":\"%s\",\"roles\":[\"root\"]}", f->b64[R3]);
    for (int k = P1; k <= P3; k++)
        if (promote & (1u << k))
            n += snprintf(keys + n, sizeof keys - (size_t)n,
                          ",{\"name\":\"%s\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]}", kname[k],
                          f->b64[k]);
    return kiln_asprintf("{\"format\":\"kiln-trust/1\",\"version\":%d,\"root_threshold\":2,"
                         "\"keys\":[%s],\"channels\":{\"staging\":{\"threshold\":1},"
                         "\"production\":{\"threshold\":2}},\"accept_unvalidated\":true}",
                         v, keys);
}
#define ALL_PROMOTE ((1u << P1) | (1u << P2) | (1u << P3))
#define NO_ALICE ((1u << P2) | (1u << P3))

/* Signed by each key in signers (-1 ends). Caller frees. */
static char *tsign(const tfx *f, const char *text, const int *signers) {
    return rfx_trust_sign(text, "p", f->sk, signers);
}

static bool tinit(tfx *f) {
    memset(f, 0, sizeof *f);
    if (!rfx_keys(f->sk, f->b64, NK)) return false;
    char *v1 = tpolicy(f, 1, ALL_PROMOTE, 0);
    bool ok = v1 && rfx_init(&f->reg, "reg", v1,
                             KILN_SCOPE_ADMIN | KILN_SCOPE_PUBLISH | KILN_SCOPE_PROMOTE, 4, false);
    free(v1);
    return ok;
}

static void tfree(tfx *f) {
    rfx_free(&f->reg);
    rfx_keys_free(f->sk, NK);
}

static kiln_registry_client_opts tclient(const tfx *f, const char *token) {
    kiln_registry_client_opts c = {
        .url = f->reg.url, .token = token, .retries = 1, .backoff_ms = 10};
    return c;
}

/* One request to the fixture's server; the status (0: no answer), the answer in out. */
static long thttp(const tfx *f, const char *method, const char *path, const char *token,
                  const char *body, rfx_resp *out) {
    return rfx_http(f->reg.url, method, path, token, body, NULL, out);
}

/* A tiny model packed as demo@version and signed by rel; the archive's path (caller frees)
 * and its digest's hex. */
static char *tarchive(const tfx *f, const char *version, const void *weights, size_t wlen,
                      char hex[KILN_SHA256_HEX]) {
    char name[64];
    snprintf(name, sizeof name, "m-%s", version);
    return rfx_archive(name, weights, wlen, RFX_CARD, version, f->sk[REL], hex);
}

/* A channel record's text for demo signed by the keys (-1 ends). Caller frees. */
static char *trecord(const tfx *f, const char *channel, const char *version, const char *hex,
                     uint64_t seq, const int *keys) {
    kiln_sign_seckey *sk[NK + 1] = {0};
    for (int i = 0; i < NK && keys[i] >= 0; i++)
        sk[i] = f->sk[keys[i]];
    return rfx_record(channel, version, hex, seq, kiln_unix_time() + 3600, "promote", sk);
}

static kiln_err tput_record(const tfx *f, const char *channel, const char *text) {
    kiln_registry_client_opts c = tclient(f, f->reg.prom);
    return text ? kiln_registry_put_channel(&c, "demo", channel, text, strlen(text))
                : KILN_ERR_INTERNAL;
}

static kiln_err tput_trust(const tfx *f, const char *doc) {
    kiln_registry_client_opts c = tclient(f, f->reg.admin);
    uint64_t v;
    return doc ? kiln_registry_trust_put(&c, doc, strlen(doc), "v.json", &v) : KILN_ERR_INTERNAL;
}

static kiln_err tpull(const tfx *f, const char *trust, const char *state, const char *ref,
                      const char *out) {
    kiln_registry_client_opts c = tclient(f, NULL);
    kiln_registry_pull_opts p = {.ref = ref, .trust = trust, .out = out, .state = state};
    kiln_registry_pulled res;
    return kiln_registry_pull(&c, &p, &res);
}

/* Run SQL on the store (a compromised server, or an operator by hand); false on failure.
 * Opened as the registry opens it: a table dropped before comes back first. */
static bool tsql(const tfx *f, const char *sql, const char *text) {
    return rfx_sql(f->reg.root, RFX_OPEN, sql, text);
}

static int64_t tcount(const tfx *f, const char *sql) {
    return rfx_int(f->reg.root, RFX_OPEN, sql);
}

static void count_problem(void *ctx, const char *line) {
    char *last = ctx;
    snprintf(last, 1024, "%s", line);
}

KILN_TEST(registry_trust_put_get_and_serve) {
    tfx f;
    rfx_resp r = {0};
    if (!CHECK("fixture", tinit(&f))) goto out;
    char *p2 = tpolicy(&f, 2, NO_ALICE, 0), *v2 = tsign(&f, p2, (int[]){R1, R2, -1}),
         *v2one = tsign(&f, p2, (int[]){R1, -1}), *p3 = tpolicy(&f, 3, NO_ALICE, 0),
         *v3 = tsign(&f, p3, (int[]){R1, R2, -1});
    char hex[KILN_SHA256_HEX];
    char *a1 = tarchive(&f, "1.0.0", "one", 3, hex);
    kiln_registry_client_opts pubc = tclient(&f, f.reg.pub);
    kiln_registry_published pub;
    if (!CHECK("documents and an archive", v2 && v2one && v3 && a1 &&
                                               kiln_registry_publish(&pubc, a1, NULL, &pub) ==
                                                   KILN_OK))
        goto done;
    CHECK("no versions yet: GET /v1/trust is 404", thttp(&f, "GET", "/v1/trust", NULL, NULL, &r) ==
                                                       404);
    CHECK("PUT without a token: 401", thttp(&f, "PUT", "/v1/trust/2", NULL, v2, &r) == 401);
    CHECK("PUT with a promote token: 403 (admin only)",
          thttp(&f, "PUT", "/v1/trust/2", f.reg.prom, v2, &r) == 403 && strstr(r.body, "'admin'"));
    CHECK("a version that is not a number: 400",
          thttp(&f, "PUT", "/v1/trust/two", f.reg.admin, v2, &r) == 400);
    CHECK("a body that is not JSON: 400",
          thttp(&f, "PUT", "/v1/trust/2", f.reg.admin, "{", &r) == 400);
    CHECK("a plain policy: 400", thttp(&f, "PUT", "/v1/trust/2", f.reg.admin, p2, &r) == 400 &&
                                     strstr(r.body, "plain policy"));
    CHECK("the body's version is not the URL's: 400",
          thttp(&f, "PUT", "/v1/trust/3", f.reg.admin, v2, &r) == 400 &&
              strstr(r.body, "holds version 2"));
    CHECK("version 3 before version 2: 409",
          thttp(&f, "PUT", "/v1/trust/3", f.reg.admin, v3, &r) == 409 &&
              strstr(r.body, "at version 1, so the next is 2"));
    CHECK("one root of two: 422, naming who signed",
          thttp(&f, "PUT", "/v1/trust/2", f.reg.admin, v2one, &r) == 422 &&
              strstr(r.body, "needs 2 distinct root keys of version 1, signed by 1 ('r1')"));
    CHECK("nothing refused was stored or audited",
          tcount(&f, "SELECT count(*) FROM trust_versions") == 0 &&
              tcount(&f, "SELECT count(*) FROM audit WHERE action = 'trust.put'") == 0);

    /* Under version 1 alice and bob promote production. */
    int ab[] = {P1, P2, -1}, bc[] = {P2, P3, -1};
    char *rec1 = trecord(&f, "production", "1.0.0", hex, 1, ab);
    CHECK("alice+bob under version 1: accepted", tput_record(&f, "production", rec1) == KILN_OK);
    CHECK("version 2 (alice removed): accepted", tput_trust(&f, v2) == KILN_OK);
    CHECK("GET /v1/trust: the document byte for byte",
          thttp(&f, "GET", "/v1/trust", NULL, NULL, &r) == 200 && r.len == strlen(v2) &&
              !memcmp(r.body, v2, r.len));
    CHECK("GET /v1/trust/2 likewise", thttp(&f, "GET", "/v1/trust/2", NULL, NULL, &r) == 200 &&
                                          r.len == strlen(v2) && !memcmp(r.body, v2, r.len));
    CHECK("GET /v1/trust/1: 404 (version 1 is the operator's file, not stored)",
          thttp(&f, "GET", "/v1/trust/1", NULL, NULL, &r) == 404);
    CHECK("the same version again: 409", tput_trust(&f, v2) == KILN_ERR_CONFLICT);
    CHECK("one audit row, by the admin token",
          tcount(&f, "SELECT count(*) FROM audit WHERE action = 'trust.put' AND token = 'ops' AND "
                     "version = '2' AND digest LIKE 'sha256:%'") == 1);
    /* From now on the server checks under version 2. */
    char *rec2 = trecord(&f, "production", "1.0.0", hex, 2, ab),
         *rec2b = trecord(&f, "production", "1.0.0", hex, 2, bc);
    CHECK("alice+bob under version 2: refused",
          tput_record(&f, "production", rec2) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("HTTP 422", "not in the trust policy"));
    CHECK("bob+carol: accepted", tput_record(&f, "production", rec2b) == KILN_OK);

    /* A restart from the same --trust (version 1) walks to version 2. */
    char *rec3 = trecord(&f, "production", "1.0.0", hex, 3, ab);
    CHECK("restart", rfx_start(&f.reg, f.reg.trust));
    CHECK("after a restart alice is still out",
          tput_record(&f, "production", rec3) == KILN_ERR_VERIFY);
    kiln_registry_server_stop(f.reg.srv, 1000);
    f.reg.srv = NULL;
    size_t problems = 9;
    char last[1024] = "";
    CHECK("fsck: the chain and the records (seq 1 under version 1) are consistent",
          kiln_registry_fsck(f.reg.root, f.reg.trust, count_problem, last, &problems) == KILN_OK &&
              problems == 0);
    /* Tampered in the store: the start and fsck name the version. */
    CHECK("tamper", tsql(&f, "UPDATE trust_versions SET document = replace(document, "
                             "'\"threshold\": 2', '\"threshold\": 1')",
                         NULL));
    CHECK("a stored version that does not verify stops the start",
          !rfx_start(&f.reg, f.reg.trust) &&
              kiln_test_msg_has("cannot serve: ", "registry.db: trust version 2: signature 1'") &&
              kiln_test_msg_has("as the successor of version 1", NULL));
    CHECK("fsck reports it", kiln_registry_fsck(f.reg.root, f.reg.trust, count_problem, last,
                                                &problems) == KILN_ERR_VERIFY &&
                                 problems >= 1);
    CHECK("restore", tsql(&f, "UPDATE trust_versions SET document = ?1", v2));
    /* A --trust newer than every stored version is used as it is. */
    char *p4 = tpolicy(&f, 4, NO_ALICE, 0), *v4 = tsign(&f, p4, (int[]){R1, -1});
    char *v4path = kiln_test_write("v4.json", v4 ? v4 : "", v4 ? strlen(v4) : 0);
    CHECK("a --trust above the store: served as it is", rfx_start(&f.reg, v4path));
    CHECK("whose next is 5", thttp(&f, "PUT", "/v1/trust/3", f.reg.admin, v3, &r) == 409 &&
                                 strstr(r.body, "at version 4, so the next is 5"));
    kiln_registry_server_stop(f.reg.srv, 1000);
    f.reg.srv = NULL;
    /* A gap in the store: version 4 without version 3. */
    CHECK("gap", tsql(&f, "INSERT INTO trust_versions VALUES(4, ?1, 'x', 0)", v4));
    CHECK("a gap in the stored chain stops the start",
          !rfx_start(&f.reg, f.reg.trust) &&
              kiln_test_msg_has("holds trust version 4 but not version 3", "gap"));
    free(rec1), free(rec2), free(rec2b), free(rec3), free(p4), free(v4), free(v4path);
done:
    free(p2), free(v2), free(v2one), free(p3), free(v3), free(a1);
out:
    rfx_resp_free(&r);
    tfree(&f);
}

/* A store made before trust versions existed (no trust_versions table) is still a store. */
KILN_TEST(registry_trust_old_store_keeps_working) {
    tfx f;
    rfx_resp r = {0};
    if (!CHECK("fixture", tinit(&f))) goto out;
    kiln_registry_server_stop(f.reg.srv, 1000);
    f.reg.srv = NULL;
    CHECK("drop the table as an old store lacks it", tsql(&f, "DROP TABLE trust_versions", NULL));
    CHECK("it is a store", reg_store_check(f.reg.root) == KILN_OK);
    size_t problems = 9;
    CHECK("fsck passes",
          kiln_registry_fsck(f.reg.root, f.reg.trust, NULL, NULL, &problems) == KILN_OK &&
              problems == 0);
    CHECK("drop again", tsql(&f, "DROP TABLE trust_versions", NULL));
    CHECK("the server starts on it", rfx_start(&f.reg, f.reg.trust));
    CHECK("and answers GET /v1/trust (none yet)",
          thttp(&f, "GET", "/v1/trust", NULL, NULL, &r) == 404);
    char *p2 = tpolicy(&f, 2, NO_ALICE, 0), *v2 = tsign(&f, p2, (int[]){R1, R2, -1});
    CHECK("and takes a version", tput_trust(&f, v2) == KILN_OK);
    free(p2), free(v2);
out:
    rfx_resp_free(&r);
    tfree(&f);
}

/* ---- the swap under load ---- */

typedef struct load {
    tfx *f;
    char **archives; /* publish these, then read pages until stop */
    size_t n;
    char **records; /* staging records seq 1.. signed by bob, in order */
    size_t nrec;
    atomic_int *stop, *done; /* done: requests answered so far */
    int failures;
    char msg[512];
} load;

static void *publisher(void *arg) {
    load *l = arg;
    kiln_registry_client_opts c = tclient(l->f, l->f->reg.pub);
    for (size_t i = 0; !atomic_load(l->stop); i++) {
        kiln_registry_published pub;
        if (i < l->n) {
            if (kiln_registry_publish(&c, l->archives[i], NULL, &pub) != KILN_OK) {
                l->failures++;
                snprintf(l->msg, sizeof l->msg, "%s", kiln_errmsg());
            }
        } else if (thttp(l->f, "GET", "/ui/models/demo/channels/staging", NULL, NULL, NULL) !=
                   200) {
            l->failures++; /* the page names signers from the policy in force */
        }
        atomic_fetch_add(l->done, 1);
    }
    return NULL;
}

static void *recorder(void *arg) {
    load *l = arg;
    for (size_t i = 0; i < l->nrec && !atomic_load(l->stop); i++) {
        if (tput_record(l->f, "staging", l->records[i]) != KILN_OK) {
            l->failures++;
            snprintf(l->msg, sizeof l->msg, "%s", kiln_errmsg());
        }
        if (thttp(l->f, "GET", "/ui/models/demo", NULL, NULL, NULL) != 200) l->failures++;
        atomic_fetch_add(l->done, 1);
    }
    return NULL;
}

/* Wait until the workers answered at least n requests (5 s at most). */
static void wait_done(atomic_int *done, int n) {
    for (int i = 0; i < 500 && atomic_load(done) < n; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* PUTs of new versions while other threads upload, put records and read pages that verify
 * under the policy in force (make test runs this under ASan: an old policy freed while a
 * request still used it would be a use after free). Each PUT waits for the workers to make
 * progress, so that the swaps fall between their requests. */
KILN_TEST(registry_trust_swap_under_load) {
    tfx f;
    rfx_resp r = {0};
    if (!CHECK("fixture", tinit(&f))) goto out;
    enum { NA = 6, NV = 12, NREC = 64 };
    char *archives[NA] = {0}, *records[NREC] = {0}, *docs[NV + 2] = {0}, hex[NA][KILN_SHA256_HEX];
    bool ok = true;
    for (int i = 0; i < NA; i++) {
        char v[16], w[16];
        snprintf(v, sizeof v, "2.%d.0", i);
        snprintf(w, sizeof w, "w%d", i);
        ok = ok && (archives[i] = tarchive(&f, v, w, strlen(w), hex[i]));
    }
    kiln_registry_client_opts pubc = tclient(&f, f.reg.pub);
    kiln_registry_published pub;
    ok = ok && kiln_registry_publish(&pubc, archives[0], NULL, &pub) == KILN_OK;
    for (size_t i = 0; ok && i < NREC; i++)
        ok = (records[i] = trecord(&f, "staging", "2.0.0", hex[0], i + 1, (int[]){P2, -1}));
    /* Versions 2..NV+1, alternately with and without alice; bob and rel stay throughout. */
    for (int v = 2; ok && v <= NV + 1; v++) {
        char *p = tpolicy(&f, v, v % 2 ? ALL_PROMOTE : NO_ALICE, 0);
        ok = (docs[v] = tsign(&f, p, (int[]){R1, R2, -1}));
        free(p);
    }
    if (!CHECK("archives, records, versions", ok)) goto done;
    atomic_int stop = 0, done = 0;
    load l = {.f = &f,
              .archives = archives + 1,
              .n = NA - 1,
              .records = records,
              .nrec = NREC,
              .stop = &stop,
              .done = &done};
    load l2 = l;
    pthread_t t1, t2;
    bool started = pthread_create(&t1, NULL, publisher, &l) == 0;
    bool started2 = pthread_create(&t2, NULL, recorder, &l2) == 0;
    int put_failures = 0;
    for (int v = 2; v <= NV + 1; v++) {
        wait_done(&done, 2 * (v - 1));
        if (tput_trust(&f, docs[v]) != KILN_OK) put_failures++;
    }
    wait_done(&done, 2 * (NV + 1));
    atomic_store(&stop, 1);
    if (started) pthread_join(t1, NULL);
    if (started2) pthread_join(t2, NULL);
    CHECK("threads ran", started && started2 && atomic_load(&done) >= 2 * (NV + 1));
    CHECK("every version went in while requests were served", put_failures == 0);
    if (!CHECK("every upload, record and page passed under whichever version was in force",
               l.failures == 0 && l2.failures == 0))
        fprintf(stderr, "    %s %s\n", l.msg, l2.msg);
    char want[32];
    snprintf(want, sizeof want, "\"version\": %d", NV + 1);
    CHECK("the newest is in force",
          thttp(&f, "GET", "/v1/trust", NULL, NULL, &r) == 200 && strstr(r.body, want));
    CHECK("the stored chain", tcount(&f, "SELECT count(*) FROM trust_versions") == NV);
done:
    for (int i = 0; i < NA; i++)
        free(archives[i]);
    for (size_t i = 0; i < NREC; i++)
        free(records[i]);
    for (int i = 0; i < NV + 2; i++)
        free(docs[i]);
out:
    rfx_resp_free(&r);
    tfree(&f);
}

/* ---- the client's walk ---- */

static bool state_has(const tfx *f, const char *state, int v) {
    char *p = kiln_asprintf("%s/trust/%d.json", state, v);
    bool ok = p && kiln_path_exists(p);
    free(p);
    (void)f;
    return ok;
}

KILN_TEST(registry_trust_pull_walks_the_chain) {
    tfx f;
    if (!CHECK("fixture", tinit(&f))) goto out;
    char hex[KILN_SHA256_HEX];
    char *a1 = tarchive(&f, "1.0.0", "one", 3, hex);
    char *p2 = tpolicy(&f, 2, NO_ALICE, 0), *v2 = tsign(&f, p2, (int[]){R1, R2, -1}),
         *p3 = tpolicy(&f, 3, NO_ALICE, 0), *v3one = tsign(&f, p3, (int[]){R1, -1}),
         *v3 = tsign(&f, p3, (int[]){R1, R2, -1}), *p4 = tpolicy(&f, 4, NO_ALICE, 0),
         *v4 = tsign(&f, p4, (int[]){R1, R2, -1});
    kiln_registry_client_opts pubc = tclient(&f, f.reg.pub);
    kiln_registry_published pub;
    int ab[] = {P1, P2, -1}, bc[] = {P2, P3, -1};
    char *rec1 = trecord(&f, "production", "1.0.0", hex, 1, ab);
    char *out = kiln_test_path("svc"), *out2 = kiln_test_path("svc2");
    if (!CHECK("setup", a1 && v2 && v3one && v3 && v4 && rec1 && out && out2 &&
                            kiln_registry_publish(&pubc, a1, NULL, &pub) == KILN_OK &&
                            tput_record(&f, "production", rec1) == KILN_OK))
        goto done;
    CHECK("a service pulls under version 1",
          tpull(&f, f.reg.trust, f.reg.state, "demo@production", out) == KILN_OK);
    CHECK("alice's key is stolen: version 2 without her", tput_trust(&f, v2) == KILN_OK);
    CHECK("the next pull walks to version 2 and refuses the record alice co-signed",
          tpull(&f, f.reg.trust, f.reg.state, "demo@production", out) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("not in the trust policy", NULL) && state_has(&f, f.reg.state, 2));
    char *rec2 = trecord(&f, "production", "1.0.0", hex, 2, bc);
    CHECK("bob+carol promote again", tput_record(&f, "production", rec2) == KILN_OK);
    CHECK("and the service pulls it",
          tpull(&f, f.reg.trust, f.reg.state, "demo@production", out) == KILN_OK);
    /* State is checked again on every walk: a hand-made version 3 refuses the pull. */
    char *bad = kiln_asprintf("%s/trust/3.json", f.reg.state);
    char *before = kiln_test_listing(f.reg.state);
    CHECK("write a version 3 signed by one root into state",
          bad && kiln_write_file_atomic(bad, v3one, strlen(v3one)) == KILN_OK);
    CHECK("the pull is refused, naming the file",
          tpull(&f, f.reg.trust, f.reg.state, "demo@production", out) == KILN_ERR_VERIFY &&
              kiln_test_msg_has(bad, "needs 2 distinct root keys of version 2, signed by 1"));
    char *after = kiln_test_listing(f.reg.state);
    CHECK("and the state is as it was", before && after && !strcmp(before, after));
    if (bad) unlink(bad);
    /* A compromised registry serves a version 3 that one root key signed. */
    CHECK("inject", tsql(&f, "INSERT INTO trust_versions VALUES(3, ?1, 'evil', 0)", v3one));
    CHECK("the client refuses it (fail closed)",
          tpull(&f, f.reg.trust, f.reg.state, "demo@production", out) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("'trust v3 from http://127.0.0.1:",
                                "needs 2 distinct root keys of version 2, signed by 1 ('r1')") &&
              !state_has(&f, f.reg.state, 3));
    /* A gap: version 4 without version 3. */
    CHECK("gap", tsql(&f, "DELETE FROM trust_versions WHERE version = 3", NULL) &&
                     tsql(&f, "INSERT INTO trust_versions VALUES(4, ?1, 'evil', 0)", v4));
    CHECK("a registry with a gap is refused",
          tpull(&f, f.reg.trust, f.reg.state, "demo@production", out) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("serves trust version 4 but not version 3", "gap"));
    CHECK("fill the gap", tsql(&f, "INSERT INTO trust_versions VALUES(3, ?1, 'ops', 0)", v3));
    kiln_registry_client_opts rc = tclient(&f, NULL);
    kiln_sign_trust *t = NULL;
    CHECK("kiln_registry_trust_walk reaches version 4",
          kiln_registry_trust_walk(&rc, f.reg.trust, f.reg.state, NULL, NULL, &t) == KILN_OK && t &&
              kiln_sign_trust_version(t) == 4 && state_has(&f, f.reg.state, 4));
    kiln_sign_trust_free(t);
    /* A new service configured with the signed version 2 walks from there. */
    char *v2path = kiln_test_write("v2.json", v2, strlen(v2)), *st2 = kiln_test_path("state2");
    CHECK("a new service with --trust the signed version 2",
          tpull(&f, v2path, st2, "demo@production", out2) == KILN_OK && !state_has(&f, st2, 2) &&
              state_has(&f, st2, 3) && state_has(&f, st2, 4));
    /* A registry that serves only older versions changes nothing. */
    char *v4path = kiln_test_write("v4.json", v4, strlen(v4)), *st3 = kiln_test_path("state3");
    CHECK("a client ahead of the registry",
          tsql(&f, "DELETE FROM trust_versions WHERE version = 4", NULL) &&
              tpull(&f, v4path, st3, "demo@production", out2) == KILN_OK);
    free(rec2), free(bad), free(before), free(after), free(v2path), free(st2), free(v4path),
        free(st3);
done:
    free(a1), free(p2), free(v2), free(p3), free(v3one), free(v3), free(p4), free(v4), free(rec1);
    free(out), free(out2);
out:
    tfree(&f);
}

/* ---- kiln_watch hears a new version ---- */

typedef struct heard {
    pthread_mutex_t mu;
    int trust_events, failures, swaps;
    char last_trust[1024], last_failure[1024];
} heard;

static void on_update(void *ctx, kiln_err rc, const char *msg, const kiln_pull_result *r) {
    heard *h = ctx;
    pthread_mutex_lock(&h->mu);
    if (rc) {
        h->failures++;
        snprintf(h->last_failure, sizeof h->last_failure, "%s", msg);
    } else if (!r) {
        h->trust_events++;
        snprintf(h->last_trust, sizeof h->last_trust, "%s", msg);
    } else {
        h->swaps++;
    }
    pthread_mutex_unlock(&h->mu);
}

/* Wait (5 s at most) until the watch has heard n swaps and f failures. */
static void heard_wait(heard *h, int swaps, int failures) {
    for (int i = 0; i < 500; i++) {
        pthread_mutex_lock(&h->mu);
        bool done = h->swaps >= swaps && h->failures >= failures;
        pthread_mutex_unlock(&h->mu);
        if (done) return;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* What the watch tests start from: 1.0.0 (the dense vector model, signed by rel) published
 * and staging's record of it (seq 1, alice) put; *hex gets its digest. The caller frees *a1
 * and *rec, made even when a step fails. */
static bool staging_at_v1(tfx *f, char hex[KILN_SHA256_HEX], char **a1, char **rec) {
    *a1 = rfx_vector_archive("m-1.0.0", "tsmoe-dense.model.safetensors", "1.0.0", f->sk[REL], hex);
    *rec = *a1 ? trecord(f, "staging", "1.0.0", hex, 1, (int[]){P1, -1}) : NULL;
    kiln_registry_client_opts pubc = tclient(f, f->reg.pub);
    kiln_registry_published pub;
    return *rec && kiln_registry_publish(&pubc, *a1, NULL, &pub) == KILN_OK &&
           tput_record(f, "staging", *rec) == KILN_OK;
}

KILN_TEST(registry_trust_watch_hears_a_new_version) {
    tfx f;
    heard h = {.mu = PTHREAD_MUTEX_INITIALIZER};
    kiln_watch *w = NULL;
    if (!CHECK("fixture", tinit(&f))) goto out;
    char hex[KILN_SHA256_HEX], *a1 = NULL, *rec = NULL;
    bool ready = staging_at_v1(&f, hex, &a1, &rec);
    char *p2 = tpolicy(&f, 2, NO_ALICE, 0), *v2 = tsign(&f, p2, (int[]){R1, R2, -1});
    char *dir = kiln_test_path("watch");
    if (!CHECK("setup", ready && v2)) goto done;
    kiln_watch_opts o = rfx_watch_opts(&f.reg, f.reg.trust, dir, on_update, &h);
    if (!CHECK("watch starts", kiln_watch_start(&o, &w) == KILN_OK)) goto done;
    CHECK("version 2 goes in", tput_trust(&f, v2) == KILN_OK);
    for (int i = 0; i < 500; i++) {
        pthread_mutex_lock(&h.mu);
        bool both = h.trust_events && h.failures;
        pthread_mutex_unlock(&h.mu);
        if (both) break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&h.mu);
    CHECK("the watch heard version 2 and what changed",
          h.trust_events == 1 && strstr(h.last_trust, "trust policy version 2 accepted from") &&
              strstr(h.last_trust, "key 'alice' ("));
    if (!CHECK("and that the record in service no longer verifies under it",
               h.failures >= 1 && strstr(h.last_failure, "under trust policy version 2") &&
                   strstr(h.last_failure, "not in the trust policy")))
        fprintf(stderr, "    heard %d failures, the last: %s\n", h.failures, h.last_failure);
    CHECK("nothing was swapped", h.swaps == 0);
    pthread_mutex_unlock(&h.mu);
    uint64_t g = 0;
    const kiln_model *m = kiln_watch_acquire(w, &g);
    CHECK("the model stays in service", m && g == 1);
    kiln_watch_release(w, m);
    CHECK("the watch saved version 2 to state", state_has(&f, f.reg.state, 2));
    /* bob re-promotes: the record the new policy accepts is picked up. */
    char *again = trecord(&f, "staging", "1.0.0", hex, 2, (int[]){P2, -1});
    CHECK("bob's record goes in", tput_record(&f, "staging", again) == KILN_OK);
    heard_wait(&h, 1, 0);
    m = kiln_watch_acquire(w, &g);
    pthread_mutex_lock(&h.mu);
    CHECK("and is swapped in", h.swaps == 1 && g == 2);
    pthread_mutex_unlock(&h.mu);
    kiln_watch_release(w, m);
    free(again);
    kiln_watch_stop(w);
done:
    free(a1), free(rec), free(p2), free(v2), free(dir);
out:
    tfree(&f);
}

/* A version that withdraws the archive in service: the watch hears it (the model stays until
 * the channel names another), and the same policy refuses the withdrawn archive to a new pull
 * and to the channel (a record naming it). */
KILN_TEST(registry_trust_watch_hears_a_withdrawal) {
    tfx f;
    heard h = {.mu = PTHREAD_MUTEX_INITIALIZER};
    kiln_watch *w = NULL;
    if (!CHECK("fixture", tinit(&f))) goto out;
    char hex[KILN_SHA256_HEX], *a1 = NULL, *rec = NULL;
    bool ready = staging_at_v1(&f, hex, &a1, &rec);
    char *p2 = tpolicy(&f, 2, ALL_PROMOTE, 0), *p2w = NULL, *v2 = NULL, *rec2 = NULL;
    /* version 2: the same keys, and 1.0.0's archive withdrawn */
    if (p2) {
        p2[strlen(p2) - 1] = 0;
        p2w = kiln_asprintf("%s,\"withdrawn\":[{\"digest\":\"sha256:%s\",\"reason\":\"leaks the "
                            "label\"}]}",
                            p2, hex);
    }
    v2 = p2w ? tsign(&f, p2w, (int[]){R1, R2, -1}) : NULL;
    char *dir = kiln_test_path("watch"), *out2 = kiln_test_path("pulled");
    if (!CHECK("setup", ready && v2)) goto done;
    kiln_watch_opts o = rfx_watch_opts(&f.reg, f.reg.trust, dir, on_update, &h);
    if (!CHECK("watch starts", kiln_watch_start(&o, &w) == KILN_OK)) goto done;
    CHECK("the withdrawal goes in", tput_trust(&f, v2) == KILN_OK);
    heard_wait(&h, 0, 1);
    pthread_mutex_lock(&h.mu);
    CHECK("the watch heard version 2 withdraw it", h.trust_events == 1 &&
                                                       strstr(h.last_trust, "withdraws sha256:") &&
                                                       strstr(h.last_trust, ": leaks the label"));
    if (!CHECK(
            "and that the model in service is withdrawn",
            h.failures >= 1 && strstr(h.last_failure, "the model in service is sha256:") &&
                strstr(h.last_failure, "which trust policy version 2 withdrew: leaks the label")))
        fprintf(stderr, "    heard %d failures, the last: %s\n", h.failures, h.last_failure);
    pthread_mutex_unlock(&h.mu);
    uint64_t g = 0;
    const kiln_model *m = kiln_watch_acquire(w, &g);
    CHECK("the model stays in service", m && g == 1);
    kiln_watch_release(w, m);
    char *mx = kiln_watch_metrics(w);
    CHECK("its metrics say it serves a withdrawn model",
          mx && strstr(mx, "\nkiln_watch_serving_withdrawn 1\n"));
    free(mx);
    kiln_watch_stop(w);
    w = NULL;
    CHECK("a new pull refuses it",
          tpull(&f, f.reg.trust, f.reg.state, "demo@staging", out2) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("which trust policy version 2 withdrew: leaks the label", NULL) &&
              !kiln_path_exists(out2));
    rec2 = trecord(&f, "staging", "1.0.0", hex, 2, (int[]){P2, -1});
    CHECK("the registry refuses a record naming it",
          rec2 && tput_record(&f, "staging", rec2) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("withdrew", NULL));
done:
    kiln_watch_stop(w);
    free(a1), free(rec), free(rec2), free(p2), free(p2w), free(v2), free(dir), free(out2);
out:
    tfree(&f);
}

/* ---- a registry that stores a version between two requests ---- */

#include <sys/socket.h>

typedef struct stub {
    const char *newest; /* GET /v1/trust */
    const char *v2;     /* GET /v1/trust/2 from the second time on (NULL: never) */
    int asked_v2, served;
} stub;

static bool stub_trust_answer(void *ctx, int c, const char *req) {
    stub *s = ctx;
    s->served++;
    if (!strncmp(req, "GET /v1/trust/2 ", 16)) {
        /* 404 the first time; stored by the time it is asked again. */
        if (s->asked_v2++ && s->v2)
            rfx_stub_answer(c, 200, s->v2);
        else
            rfx_stub_answer(c, 404, "{\"error\":\"trust version 2 not found\"}");
    } else if (!strncmp(req, "GET /v1/trust ", 14)) {
        rfx_stub_answer(c, 200, s->newest);
    } else {
        rfx_stub_answer(c, 404, "{\"error\":\"no\"}");
    }
    return true;
}

/* A 404 for version N and then a newest version >= N is either a version stored in between
 * (asked again: walked) or a gap (refused). */
KILN_TEST(registry_trust_walk_a_version_stored_meanwhile_is_no_gap) {
    tfx f;
    memset(&f, 0, sizeof f);
    if (!CHECK("keys", rfx_keys(f.sk, f.b64, NK))) goto out;
    char *v1 = tpolicy(&f, 1, ALL_PROMOTE, 0), *p2 = tpolicy(&f, 2, NO_ALICE, 0),
         *v2 = tsign(&f, p2, (int[]){R1, R2, -1}), *p3 = tpolicy(&f, 3, NO_ALICE, 0),
         *v3 = tsign(&f, p3, (int[]){R1, R2, -1});
    char *trust = v1 ? kiln_test_write("trust.json", v1, strlen(v1)) : NULL,
         *state = kiln_test_path("state");
    stub s = {.newest = v2, .v2 = v2};
    rfx_stub st;
    if (!CHECK("stub registry", trust && v2 && v3 && state &&
                                    rfx_stub_start(&st, stub_trust_answer, &s)))
        goto done;
    kiln_registry_client_opts c = {.url = st.url, .retries = 0};
    kiln_sign_trust *got = NULL;
    CHECK("version 2 stored between the 404 and GET /v1/trust: walked, not a gap",
          kiln_registry_trust_walk(&c, trust, state, NULL, NULL, &got) == KILN_OK && got &&
              kiln_sign_trust_version(got) == 2 && s.asked_v2 == 2);
    kiln_sign_trust_free(got);
    got = NULL;
    rfx_stub_stop(&st);
    char *state2 = kiln_test_path("state2");
    stub g = {.newest = v3, .v2 = NULL};
    if (CHECK("stub registry with a gap", state2 && rfx_stub_start(&st, stub_trust_answer, &g))) {
        c.url = st.url;
        CHECK("version 3 served, version 2 never: a gap",
              kiln_registry_trust_walk(&c, trust, state2, NULL, NULL, &got) == KILN_ERR_VERIFY &&
                  !got && g.asked_v2 == 2 &&
                  kiln_test_msg_has("serves trust version 3 but not version 2", "gap"));
        rfx_stub_stop(&st);
    }
    free(state2);
done:
    free(v1), free(p2), free(v2), free(p3), free(v3), free(trust), free(state);
out:
    for (int i = 0; i < NK; i++)
        kiln_sign_seckey_free(f.sk[i]);
}


/* A record the watch refused under its policy is tried again once the policy moves: here
 * the server (started from the signed version 2 before the store held it) took a record by
 * alice, whom the service's version 1 does not trust; once version 2 is stored, the service
 * walks to it and must pull that record, not keep treating it as refused. */
KILN_TEST(registry_trust_watch_retries_a_refused_record_after_a_new_version) {
    tfx f;
    heard h = {.mu = PTHREAD_MUTEX_INITIALIZER};
    kiln_watch *w = NULL;
    if (!CHECK("fixture", tinit(&f))) goto out;
    char hex[KILN_SHA256_HEX];
    char *a1 =
        rfx_vector_archive("m-1.0.0", "tsmoe-dense.model.safetensors", "1.0.0", f.sk[REL], hex);
    char *p1 = tpolicy(&f, 1, NO_ALICE, 0), *p2 = tpolicy(&f, 2, ALL_PROMOTE, 0),
         *v2 = tsign(&f, p2, (int[]){R1, R2, -1});
    char *wtrust = p1 ? kiln_test_write("watch-trust.json", p1, strlen(p1)) : NULL,
         *v2path = v2 ? kiln_test_write("v2.json", v2, strlen(v2)) : NULL;
    char *bob = a1 ? trecord(&f, "staging", "1.0.0", hex, 1, (int[]){P2, -1}) : NULL,
         *alice = a1 ? trecord(&f, "staging", "1.0.0", hex, 2, (int[]){P1, -1}) : NULL;
    char *dir = kiln_test_path("watch");
    kiln_registry_client_opts pubc = tclient(&f, f.reg.pub);
    kiln_registry_published pub;
    if (!CHECK("setup", a1 && wtrust && v2path && bob && alice && rfx_start(&f.reg, v2path) &&
                            kiln_registry_publish(&pubc, a1, NULL, &pub) == KILN_OK &&
                            tput_record(&f, "staging", bob) == KILN_OK))
        goto done;
    kiln_watch_opts o = rfx_watch_opts(&f.reg, wtrust, dir, on_update, &h);
    if (!CHECK("watch starts under version 1", kiln_watch_start(&o, &w) == KILN_OK)) goto done;
    CHECK("the server (version 2) takes alice's record", tput_record(&f, "staging", alice) ==
                                                             KILN_OK);
    heard_wait(&h, 0, 1);
    pthread_mutex_lock(&h.mu);
    CHECK("the service refuses it under version 1",
          h.failures >= 1 && h.swaps == 0 && strstr(h.last_failure, "not in the trust policy"));
    pthread_mutex_unlock(&h.mu);
    CHECK("version 2 is stored", tsql(&f, "INSERT INTO trust_versions VALUES(2, ?1, 'ops', 0)", v2));
    heard_wait(&h, 1, 0);
    uint64_t g = 0;
    const kiln_model *m = kiln_watch_acquire(w, &g);
    pthread_mutex_lock(&h.mu);
    if (!CHECK("under version 2 the same record is pulled and swapped in",
               h.trust_events == 1 && h.swaps == 1 && g == 2))
        fprintf(stderr, "    trust events %d, swaps %d, generation %llu, last failure: %s\n",
                h.trust_events, h.swaps, (unsigned long long)g, h.last_failure);
    pthread_mutex_unlock(&h.mu);
    kiln_watch_release(w, m);
    kiln_watch_stop(w);
done:
    free(a1), free(p1), free(p2), free(v2), free(wtrust), free(v2path);
    free(bob), free(alice), free(dir);
out:
    tfree(&f);
}

/* ---- what a state directory can hold ---- */

typedef struct walker {
    const char *trust, *state;
    kiln_err rc;
    uint64_t version;
    char msg[1024];
    atomic_int done;
} walker;

static void *walker_main(void *arg) {
    walker *k = arg;
    kiln_sign_trust *t = NULL;
    k->rc = kiln_registry_trust_walk(NULL, k->trust, k->state, NULL, NULL, &t);
    k->version = t ? kiln_sign_trust_version(t) : 0;
    snprintf(k->msg, sizeof k->msg, "%s", k->rc ? kiln_errmsg() : "");
    kiln_sign_trust_free(t);
    atomic_store(&k->done, 1);
    return NULL;
}

/* The walk through STATE/trust without a registry, in a thread: a walk that blocks (a FIFO
 * opened for reading waits for a writer) is reported and then unblocked. */
static kiln_err twalk_state(const char *trust, const char *state, const char *fifo,
                            uint64_t *version, char msg[1024]) {
    walker k = {.trust = trust, .state = state};
    pthread_t t;
    if (pthread_create(&t, NULL, walker_main, &k) != 0) return KILN_ERR_INTERNAL;
    for (int i = 0; i < 200 && !atomic_load(&k.done); i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    bool blocked = !atomic_load(&k.done);
    if (blocked && fifo) {
        int fd = open(fifo, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0) close(fd);
    }
    pthread_join(t, NULL);
    *version = k.version;
    snprintf(msg, 1024, "%s", k.msg);
    return blocked ? KILN_ERR_INTERNAL : k.rc;
}

/* Whatever sits in STATE/trust/N.json is read as a file of a bounded size or refused,
 * naming it: a symlink is followed (what counts is that its content verifies), a directory,
 * a FIFO (which must not hang the pull) or a huge file are refused, a version other than its
 * name is refused, a gap ends the walk, and a temporary left by a write that was killed is
 * ignored. */
KILN_TEST(registry_trust_state_hostile_entries) {
    tfx f;
    memset(&f, 0, sizeof f);
    if (!CHECK("keys", rfx_keys(f.sk, f.b64, NK))) goto out;
    char *v1 = tpolicy(&f, 1, ALL_PROMOTE, 0), *p2 = tpolicy(&f, 2, NO_ALICE, 0),
         *v2 = tsign(&f, p2, (int[]){R1, R2, -1}), *p3 = tpolicy(&f, 3, NO_ALICE, 0),
         *v3 = tsign(&f, p3, (int[]){R1, R2, -1});
    char *trust = v1 ? kiln_test_write("trust.json", v1, strlen(v1)) : NULL,
         *elsewhere = v2 ? kiln_test_write("elsewhere.json", v2, strlen(v2)) : NULL,
         *state = kiln_test_path("state"), *dir = state ? kiln_path_join(state, "trust") : NULL,
         *n2 = dir ? kiln_path_join(dir, "2.json") : NULL,
         *n3 = dir ? kiln_path_join(dir, "3.json") : NULL, msg[1024];
    uint64_t v = 0;
    if (!CHECK("setup", trust && elsewhere && v3 && n2 && n3 && kiln_mkdir_p(dir) == KILN_OK))
        goto done;
    CHECK("a symlink to a version that verifies: followed",
          symlink(elsewhere, n2) == 0 && twalk_state(trust, state, NULL, &v, msg) == KILN_OK &&
              v == 2);
    unlink(n2);
    CHECK("a directory: refused, naming it",
          mkdir(n2, 0755) == 0 && twalk_state(trust, state, NULL, &v, msg) == KILN_ERR_IO &&
              strstr(msg, n2) && strstr(msg, "not a regular file"));
    rmdir(n2);
    kiln_err rc = mkfifo(n2, 0644) == 0 ? twalk_state(trust, state, n2, &v, msg)
                                        : KILN_ERR_INTERNAL;
    if (!CHECK("a FIFO: refused at once, naming it (not waited on)",
               rc == KILN_ERR_IO && strstr(msg, n2) && strstr(msg, "not a regular file")))
        fprintf(stderr, "    rc %d: %s\n", (int)rc, msg);
    unlink(n2);
    int fd = open(n2, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    bool big = fd >= 0 && ftruncate(fd, (off_t)KILN_SIGN_TRUST_FILE_LIMIT + 1) == 0;
    if (fd >= 0) close(fd);
    CHECK("a huge file: refused by its size, naming it",
          big && twalk_state(trust, state, NULL, &v, msg) == KILN_ERR_LIMIT && strstr(msg, n2) &&
              strstr(msg, "more than the limit"));
    CHECK("version 3 in 2.json: refused, naming it",
          kiln_write_file_atomic(n2, v3, strlen(v3)) == KILN_OK &&
              twalk_state(trust, state, NULL, &v, msg) == KILN_ERR_VERIFY && strstr(msg, n2) &&
              strstr(msg, "is version 3, but only version 2 can follow version 1"));
    unlink(n2);
    CHECK("3.json without 2.json: the walk ends at the gap",
          kiln_write_file_atomic(n3, v3, strlen(v3)) == KILN_OK &&
              twalk_state(trust, state, NULL, &v, msg) == KILN_OK && v == 1);
    char *tmp = kiln_asprintf("%s/.2.json.tmp-AbC123", dir);
    CHECK("a temporary cut short by a kill: ignored",
          tmp && kiln_write_file_atomic(tmp, v2, strlen(v2) / 2) == KILN_OK &&
              twalk_state(trust, state, NULL, &v, msg) == KILN_OK && v == 1);
    CHECK("and once 2.json is there the walk goes on to 3",
          kiln_write_file_atomic(n2, v2, strlen(v2)) == KILN_OK &&
              twalk_state(trust, state, NULL, &v, msg) == KILN_OK && v == 3);
    free(tmp);
done:
    free(v1), free(p2), free(v2), free(p3), free(v3), free(trust), free(elsewhere), free(state);
    free(dir), free(n2), free(n3);
out:
    for (int i = 0; i < NK; i++)
        kiln_sign_seckey_free(f.sk[i]);
}

/* ---- the server's PUT: races, a store that fails, route numbers ---- */

typedef struct racer {
    tfx *f;
    const char *path, *doc;
    pthread_barrier_t *go;
    rfx_resp r;
} racer;

static void *racer_main(void *arg) {
    racer *k = arg;
    pthread_barrier_wait(k->go);
    thttp(k->f, "PUT", k->path, k->f->reg.admin, k->doc, &k->r);
    return NULL;
}

/* Is alice trusted by the policy in force? A staging record by her alone, seq n, goes in. */
static bool alice_in_force(const tfx *f, const char *hex, uint64_t n) {
    char *rec = trecord(f, "staging", "1.0.0", hex, n, (int[]){P1, -1});
    bool in = tput_record(f, "staging", rec) == KILN_OK;
    free(rec);
    return in;
}

/* Two admins PUT different signed documents of the same version at once (a fork: the root
 * quorum signed both): one is stored and in force, the other gets 409, never both. A PUT that
 * verifies but cannot be stored changes nothing in force. Version numbers in the URL are
 * digits without leading zeros, 1 to 2^53-1. */
KILN_TEST(registry_trust_put_races_and_failures) {
    tfx f;
    rfx_resp r = {0};
    if (!CHECK("fixture", tinit(&f))) goto out;
    char hex[KILN_SHA256_HEX];
    char *a1 = tarchive(&f, "1.0.0", "one", 3, hex);
    kiln_registry_client_opts pubc = tclient(&f, f.reg.pub);
    kiln_registry_published pub;
    enum { ROUNDS = 4 };
    char *docs[ROUNDS + 3][2] = {{0}};
    bool ok = a1 && kiln_registry_publish(&pubc, a1, NULL, &pub) == KILN_OK;
    for (int v = 2; ok && v < ROUNDS + 3; v++)
        for (int b = 0; ok && b < 2; b++) {
            char *p = tpolicy(&f, v, b ? ALL_PROMOTE : NO_ALICE, 0);
            ok = (docs[v][b] = tsign(&f, p, (int[]){R1, R2, -1}));
            free(p);
        }
    if (!CHECK("setup", ok)) goto done;
    uint64_t seq = 1;
    int v = 2;
    for (; v < ROUNDS + 2; v++) {
        char path[32];
        snprintf(path, sizeof path, "/v1/trust/%d", v);
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, 2);
        racer k[2] = {{&f, path, docs[v][0], &go, {0}}, {&f, path, docs[v][1], &go, {0}}};
        pthread_t t[2];
        bool started = pthread_create(&t[0], NULL, racer_main, &k[0]) == 0 &&
                       pthread_create(&t[1], NULL, racer_main, &k[1]) == 0;
        if (started) pthread_join(t[0], NULL), pthread_join(t[1], NULL);
        pthread_barrier_destroy(&go);
        int won = k[0].r.status == 201 ? 0 : 1;
        if (!CHECK("one 201 and one 409",
                   started && k[won].r.status == 201 && k[!won].r.status == 409 &&
                       strstr(k[!won].r.body, "so the next is")))
            fprintf(stderr, "    version %d: %ld %s / %ld %s\n", v, k[0].r.status, k[0].r.body,
                    k[1].r.status, k[1].r.body);
        rfx_resp_free(&k[0].r), rfx_resp_free(&k[1].r);
        CHECK("the winner's bytes are stored",
              thttp(&f, "GET", path, NULL, NULL, &r) == 200 && r.len == strlen(docs[v][won]) &&
                  !memcmp(r.body, docs[v][won], r.len));
        char q[96];
        snprintf(q, sizeof q, "SELECT count(*) FROM trust_versions WHERE version = %d", v);
        CHECK("one row", tcount(&f, q) == 1);
        bool in = alice_in_force(&f, hex, seq);
        seq += in;
        CHECK("and the winner's policy is in force", in == (won == 1));
    }
    CHECK("one audit row per version",
          tcount(&f, "SELECT count(*) FROM audit WHERE action = 'trust.put'") == ROUNDS);

    /* The store refuses the insert: nothing changes. */
    bool alice_before = alice_in_force(&f, hex, seq);
    seq += alice_before;
    const char *next = docs[v][alice_before ? 0 : 1]; /* the policy that flips alice */
    char path[32];
    snprintf(path, sizeof path, "/v1/trust/%d", v);
    CHECK("a store that fails the insert",
          tsql(&f, "CREATE TRIGGER nospace BEFORE INSERT ON trust_versions BEGIN SELECT "
                   "RAISE(ABORT, 'database or disk is full'); END",
                   NULL));
    long st = thttp(&f, "PUT", path, f.reg.admin, next, &r);
    if (!CHECK("PUT: 500, saying so (not 'stored already')",
               st == 500 && strstr(r.body, "disk is full") && !strstr(r.body, "stored already")))
        fprintf(stderr, "    %ld %s\n", st, r.body);
    CHECK("the policy in force is unchanged", alice_in_force(&f, hex, seq) == alice_before);
    seq += alice_before;
    CHECK("nothing stored or audited",
          thttp(&f, "GET", path, NULL, NULL, &r) == 404 &&
              tcount(&f, "SELECT count(*) FROM audit WHERE action = 'trust.put'") == ROUNDS);
    CHECK("a restart too",
          rfx_start(&f.reg, f.reg.trust) && alice_in_force(&f, hex, seq) == alice_before);
    seq += alice_before;
    char *row = kiln_asprintf("INSERT INTO trust_versions VALUES(%d, 'x', 'x', 0)", v);
    CHECK("a row put in the store by hand: the PUT is 409, stored already",
          row && tsql(&f, "DROP TRIGGER nospace", NULL) && tsql(&f, row, NULL) &&
              thttp(&f, "PUT", path, f.reg.admin, next, &r) == 409 &&
              strstr(r.body, "is stored already"));
    free(row);
    CHECK("the store mended, the same PUT goes in",
          tsql(&f, "DELETE FROM trust_versions WHERE document = 'x'", NULL) &&
              tput_trust(&f, next) == KILN_OK && alice_in_force(&f, hex, seq) == !alice_before);

    /* Version numbers in the URL. */
    static const struct {
        const char *path;
        long status;
    } routes[] = {
        {"/v1/trust/0", 400},
        {"/v1/trust/02", 400},
        {"/v1/trust/-1", 400},
        {"/v1/trust/+2", 400},
        {"/v1/trust/2.0", 400},
        {"/v1/trust/1e3", 400},
        {"/v1/trust/%32", 200}, /* percent-decoded first: version 2 */
        {"/v1/trust/9007199254740991", 404},
        {"/v1/trust/9007199254740992", 400},
        {"/v1/trust/99999999999999999999", 400},
        {"/v1/trust/184467440737095516170", 400},
        {"/v1/trust/00000000000000000000000000000002", 400},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(routes); i++) {
        long got = thttp(&f, "GET", routes[i].path, NULL, NULL, &r);
        if (!CHECK("route status", got == routes[i].status))
            fprintf(stderr, "    %s: %ld %s\n", routes[i].path, got, r.body);
    }
    CHECK("a PUT to a number out of range: 400 before the body is read",
          thttp(&f, "PUT", "/v1/trust/99999999999999999999", f.reg.admin, docs[2][0], &r) == 400 &&
              strstr(r.body, "is not a trust version"));
done:
    for (int i = 0; i < ROUNDS + 3; i++)
        free(docs[i][0]), free(docs[i][1]);
    free(a1);
out:
    rfx_resp_free(&r);
    tfree(&f);
}

/* ---- a fork: two different signed documents of one version ---- */

/* The root quorum signed two versions 2 (or the registry's copy was swapped): a client that
 * holds one and sees the registry serve the other as its newest refuses; a server started
 * from one over a store holding the other refuses to start, and fsck says so. A version 3
 * that the client's own version 2's root quorum signed moves the client on. */
KILN_TEST(registry_trust_fork_is_refused) {
    tfx f;
    if (!CHECK("fixture", tinit(&f))) goto out;
    char hex[KILN_SHA256_HEX];
    char *a1 = tarchive(&f, "1.0.0", "one", 3, hex);
    char *p2a = tpolicy(&f, 2, NO_ALICE, 0), *v2a = tsign(&f, p2a, (int[]){R1, R2, -1}),
         *p2b = tpolicy(&f, 2, (1u << P1) | (1u << P2), 0),
         *v2b = tsign(&f, p2b, (int[]){R1, R2, -1}), *p3 = tpolicy(&f, 3, NO_ALICE, 0),
         *v3 = tsign(&f, p3, (int[]){R1, R2, -1});
    char *rec = a1 ? trecord(&f, "staging", "1.0.0", hex, 1, (int[]){P2, -1}) : NULL;
    char *out = kiln_test_path("svc"), *out2 = kiln_test_path("svc2"),
         *st2 = kiln_test_path("st2"), *st3 = kiln_test_path("st3");
    char *v2a_path = v2a ? kiln_test_write("v2a.json", v2a, strlen(v2a)) : NULL;
    char *s2 = kiln_asprintf("%s/trust/2.json", f.reg.state);
    kiln_registry_client_opts pubc = tclient(&f, f.reg.pub);
    kiln_registry_published pub;
    if (!CHECK("setup", v2a && v2b && v3 && rec && out && out2 && st2 && st3 && v2a_path && s2 &&
                            kiln_registry_publish(&pubc, a1, NULL, &pub) == KILN_OK &&
                            tput_record(&f, "staging", rec) == KILN_OK &&
                            tput_trust(&f, v2a) == KILN_OK))
        goto done;
    CHECK("a service walks to version 2 (a)",
          tpull(&f, f.reg.trust, f.reg.state, "demo@staging", out) == KILN_OK &&
              state_has(&f, f.reg.state, 2));
    CHECK("the store's version 2 becomes b", tsql(&f, "UPDATE trust_versions SET document = ?1 "
                                                   "WHERE version = 2",
                                               v2b));
    char *before = kiln_test_listing(f.reg.state);
    CHECK("the service refuses: the registry's newest is another version 2",
          tpull(&f, f.reg.trust, f.reg.state, "demo@staging", out) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("refusing: the newest trust version of registry 'http://",
                                "is trust version 2, and so is") &&
              kiln_test_msg_has(s2, "a fork") && kiln_test_msg_has("key 'carol' (", NULL));
    char *after = kiln_test_listing(f.reg.state);
    CHECK("and its state is as it was", before && after && !strcmp(before, after));
    CHECK("so does a new service configured with version 2 (a)",
          tpull(&f, v2a_path, st2, "demo@staging", out2) == KILN_ERR_VERIFY &&
              kiln_test_msg_has(v2a_path, "a fork"));
    CHECK("one configured with version 1 walks to b",
          tpull(&f, f.reg.trust, st3, "demo@staging", out2) == KILN_OK);
    CHECK("a server started from version 2 (a) over the store's b refuses",
          !rfx_start(&f.reg, v2a_path) && kiln_test_msg_has("cannot serve: ", "a fork") &&
              kiln_test_msg_has(v2a_path, "registry.db: trust version 2'"));
    size_t problems = 0;
    char last[1024] = "";
    CHECK("fsck from it reports the fork", kiln_registry_fsck(f.reg.root, v2a_path, count_problem,
                                                              last, &problems) == KILN_ERR_VERIFY &&
                                               problems >= 1 && strstr(last, "a fork"));
    CHECK("the same file as the store's copy starts",
          tsql(&f, "UPDATE trust_versions SET document = ?1 WHERE version = 2", v2a) &&
              rfx_start(&f.reg, v2a_path));
    /* The store goes back to b and then holds a version 3, signed by r1 and r2: the root
     * quorum of the service's version 2 (a), so the service moves on to it. */
    CHECK("store b and a version 3",
          tsql(&f, "UPDATE trust_versions SET document = ?1 WHERE version = 2", v2b) &&
              tsql(&f, "INSERT INTO trust_versions VALUES(3, ?1, 'ops', 0)", v3));
    CHECK("the service walks on from a to 3",
          tpull(&f, f.reg.trust, f.reg.state, "demo@staging", out) == KILN_OK &&
              state_has(&f, f.reg.state, 3));
    free(before), free(after);
done:
    free(a1), free(p2a), free(v2a), free(p2b), free(v2b), free(p3), free(v3), free(rec);
    free(out), free(out2), free(st2), free(st3), free(v2a_path), free(s2);
out:
    tfree(&f);
}

/* ---- a hostile registry ---- */

enum { HOSTILE_HUGE, HOSTILE_TRICKLE, HOSTILE_FAKE };

typedef struct hostile {
    int mode;
    const char *fake; /* HOSTILE_FAKE: served for every version */
    atomic_int asked;
} hostile;

static bool hostile_answer(void *ctx, int c, const char *req) {
    hostile *s = ctx;
    if (strncmp(req, "GET /v1/trust/", 14) != 0) {
        rfx_stub_answer(c, 404, "{\"error\":\"no\"}");
        return true;
    }
    atomic_fetch_add(&s->asked, 1);
    if (s->mode == HOSTILE_FAKE) {
        rfx_stub_answer(c, 200, s->fake);
        return true;
    }
    /* 100 MB announced; sent until the client hangs up (a byte each 50 ms when trickling,
     * for 4 s at most: a client without a deadline fails the test's timing instead of
     * hanging it). */
    const char *head = "HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n";
    static char chunk[65536];
    memset(chunk, ' ', sizeof chunk);
    bool ok = send(c, head, strlen(head), MSG_NOSIGNAL) > 0;
    size_t most = s->mode == HOSTILE_TRICKLE ? 80 : 100000000u;
    for (size_t sent = 0; ok && sent < most;) {
        size_t k = s->mode == HOSTILE_TRICKLE ? 1 : sizeof chunk;
        ok = send(c, chunk, k, MSG_NOSIGNAL) > 0;
        sent += k;
        if (s->mode == HOSTILE_TRICKLE) {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    return true;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A registry that answers 100 MB, trickles a byte at a time, or serves a made-up version for
 * every number: each walk fails closed, quickly, and saves nothing. */
KILN_TEST(registry_trust_walk_hostile_registry) {
    tfx f;
    memset(&f, 0, sizeof f);
    if (!CHECK("keys", rfx_keys(f.sk, f.b64, NK))) goto out;
    char *v1 = tpolicy(&f, 1, ALL_PROMOTE, 0), *p2 = tpolicy(&f, 2, NO_ALICE, 0),
         *fake = tsign(&f, p2, (int[]){R1, -1});
    char *trust = v1 ? kiln_test_write("trust.json", v1, strlen(v1)) : NULL,
         *state = kiln_test_path("state");
    if (!CHECK("setup", trust && fake && state)) goto done;
    /* The deadline is short only where it is what is tested: under ASan on a loaded machine
     * the first megabyte of the huge answer once took longer than 500 ms to arrive. */
    const struct {
        int mode;
        unsigned timeout_ms;
        kiln_err want;
        const char *msg;
    } cases[] = {
        {HOSTILE_HUGE, 10000, KILN_ERR_LIMIT, "answer larger than 1048576 bytes"},
        {HOSTILE_TRICKLE, 500, KILN_ERR_NETWORK, "Operation timed out after 5"},
        {HOSTILE_FAKE, 10000, KILN_ERR_VERIFY,
         "needs 2 distinct root keys of version 1, signed by 1"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        hostile h = {.mode = cases[i].mode, .fake = fake};
        rfx_stub st;
        if (!CHECK("hostile registry", rfx_stub_start(&st, hostile_answer, &h))) break;
        kiln_registry_client_opts c = {
            .url = st.url, .retries = 0, .timeout_ms = cases[i].timeout_ms};
        kiln_sign_trust *got = NULL;
        double t0 = now_s();
        kiln_err rc = kiln_registry_trust_walk(&c, trust, state, NULL, NULL, &got);
        double dt = now_s() - t0;
        if (!CHECK("refused, saying why", rc == cases[i].want && !got &&
                                               kiln_test_msg_has(cases[i].msg, NULL)))
            fprintf(stderr, "    case %zu: rc %d: %s\n", i, (int)rc, kiln_errmsg());
        CHECK("at once (one request, under 3 s)", atomic_load(&h.asked) == 1 && dt < 3.0);
        CHECK("nothing saved", !state_has(&f, state, 2));
        kiln_sign_trust_free(got);
        rfx_stub_stop(&st);
    }
done:
    free(v1), free(p2), free(fake), free(trust), free(state);
out:
    for (int i = 0; i < NK; i++)
        kiln_sign_seckey_free(f.sk[i]);
}

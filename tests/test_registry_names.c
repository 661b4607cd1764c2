/* test_registry_names.c - NAME@REF means one thing (docs/registry.md, "Names"): a version
 * looks like a version and a channel does not, the server refuses names that cross, and no
 * client reads a channel a registry withholds as a version of that name; an output
 * directory is replaced only when it is a model directory kiln installed; and the server's
 * smaller answers (a signed non-archive, history's after=, a re-publish's size). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "export.h"
#include "registry_fx.h"
#include "registry_int.h"
#include "release.h"
#include "test.h"
#include "testutil.h"

/* ---- the rule ---- */

KILN_TEST(registry_naming_rule) {
    const char *versions[] = {"1.0.0", "0", "2.0.0-rc.1+b7", "v2", "V10.1", "2026-01-05", "9abc"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(versions); i++) {
        CHECK("a version looks like one", kiln_registry_looks_like_version(versions[i]));
        CHECK("a version is accepted", kiln_registry_check_version(versions[i]) == KILN_OK);
        CHECK("and is no channel name", kiln_registry_check_channel(versions[i]) == KILN_ERR_USAGE);
    }
    const char *channels[] = {"production", "staging", "canary-eu", "v",
                              "vnext",      "v-next",  "latest"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(channels); i++) {
        CHECK("a channel does not look like a version",
              !kiln_registry_looks_like_version(channels[i]));
        CHECK("a channel is accepted", kiln_registry_check_channel(channels[i]) == KILN_OK);
        CHECK("and is no version", kiln_registry_check_version(channels[i]) == KILN_ERR_USAGE &&
                                       kiln_test_msg_has("does not look like a version", NULL));
    }
    CHECK("a channel named like a version: the message says why",
          kiln_registry_check_channel("1.0.0") == KILN_ERR_USAGE &&
              kiln_test_msg_has("channel name '1.0.0' looks like a version", NULL));
    CHECK("a version named like a channel: the message says why",
          kiln_registry_check_version("production") == KILN_ERR_USAGE &&
              kiln_test_msg_has("version name 'production' does not look like a version", NULL));
    CHECK("a version's characters still count",
          kiln_registry_check_version("1..0") == KILN_ERR_USAGE);
    CHECK("a channel's too", kiln_registry_check_channel("Prod") == KILN_ERR_USAGE);
    CHECK("a stored version is read by its characters", reg_check_version_chars("a1") == KILN_OK);

    char model[KILN_REGISTRY_NAME_MAX + 1], what[KILN_REGISTRY_NAME_MAX + 1];
    bool is_version = true;
    CHECK("demo@production is a channel",
          kiln_registry_ref_parse("demo@production", model, what, &is_version) == KILN_OK &&
              !is_version && !strcmp(model, "demo") && !strcmp(what, "production"));
    CHECK("demo@1.2.0 is a version",
          kiln_registry_ref_parse("demo@1.2.0", model, what, &is_version) == KILN_OK &&
              is_version && !strcmp(what, "1.2.0"));
    CHECK("demo@v3 is a version",
          kiln_registry_ref_parse("demo@v3", model, what, &is_version) == KILN_OK && is_version);
    CHECK("demo@ is neither",
          kiln_registry_ref_parse("demo@", model, what, &is_version) == KILN_ERR_USAGE);
    CHECK("demo is neither",
          kiln_registry_ref_parse("demo", model, what, &is_version) == KILN_ERR_USAGE);
    CHECK("demo@Prod is neither",
          kiln_registry_ref_parse("demo@Prod", model, what, &is_version) == KILN_ERR_USAGE &&
              kiln_test_msg_has("'demo@Prod'", NULL));
}

/* ---- a registry with a policy (test_registry.c's fixture, in small) ---- */

typedef struct nfx {
    rfx reg; /* tokens: pub, prom */
    kiln_sign_seckey *rel, *p1, *p2;
} nfx;

static bool nfx_init(nfx *f) {
    memset(f, 0, sizeof *f);
    char r[KILN_SIGN_PUBKEY_B64], a[KILN_SIGN_PUBKEY_B64], b[KILN_SIGN_PUBKEY_B64];
    if (!kiln_test_keypair(&f->rel, r) || !kiln_test_keypair(&f->p1, a) ||
        !kiln_test_keypair(&f->p2, b))
        return false;
    char *t = rfx_policy(r, a, b);
    bool ok = t && rfx_init(&f->reg, "reg", t, KILN_SCOPE_PUBLISH | KILN_SCOPE_PROMOTE, 4, false);
    free(t);
    return ok;
}

static void nfx_free(nfx *f) {
    rfx_free(&f->reg);
    kiln_sign_seckey_free(f->rel);
    kiln_sign_seckey_free(f->p1);
    kiln_sign_seckey_free(f->p2);
}

static kiln_registry_client_opts nfx_client(const char *url, const char *token) {
    kiln_registry_client_opts c = {.url = url, .token = token, .retries = 1, .backoff_ms = 10};
    return c;
}

static char *nfx_archive(const char *content, const char *version, kiln_sign_seckey *sk,
                         char hex[KILN_SHA256_HEX]) {
    char name[80];
    snprintf(name, sizeof name, "model-%s-%s", version, content);
    return rfx_archive(name, content, strlen(content), RFX_CARD, version, sk, hex);
}

static kiln_err nfx_pull(const char *url, const char *trust, const char *state, const char *ref,
                         const char *out) {
    kiln_registry_client_opts c = nfx_client(url, NULL);
    kiln_registry_pull_opts p = {.ref = ref, .trust = trust, .out = out, .state = state};
    kiln_registry_pulled res;
    return kiln_registry_pull(&c, &p, &res);
}

/* The server takes no version that reads as a channel's name and no channel that reads as a
 * version, and says why, storing nothing. */
KILN_TEST(registry_server_refuses_names_that_cross) {
    nfx f;
    char hp[KILN_SHA256_HEX], h1[KILN_SHA256_HEX];
    char *ap = NULL, *a1 = NULL, *rec = NULL;
    if (!CHECK("fixture", nfx_init(&f))) goto out;
    ap = nfx_archive("evil", "production", f.rel, hp);
    a1 = nfx_archive("one", "1.0.0", f.rel, h1);
    if (!CHECK("archives (kiln_archive_pack takes any version's characters)", ap && a1)) goto out;
    kiln_registry_client_opts c = nfx_client(f.reg.url, f.reg.pub);
    kiln_registry_published pub;
    kiln_err rc = kiln_registry_publish(&c, ap, NULL, &pub);
    CHECK("publishing version 'production' is refused (400)",
          rc == KILN_ERR_USAGE && kiln_test_msg_has("HTTP 400", "does not look like a version"));
    CHECK("nothing stored: no version, no audit row",
          rfx_int(f.reg.root, RFX_OPEN, "SELECT count(*) FROM versions") == 0 &&
              rfx_int(f.reg.root, RFX_OPEN,
                      "SELECT count(*) FROM audit WHERE action = 'publish'") == 0);
    CHECK("1.0.0 is published", kiln_registry_publish(&c, a1, NULL, &pub) == KILN_OK);
    kiln_sign_seckey *k1[] = {f.p1, NULL};
    rec = rfx_record("2.0", "1.0.0", h1, 1, kiln_unix_time() + 3600, "promote", k1);
    kiln_registry_client_opts pc = nfx_client(f.reg.url, f.reg.prom);
    rc = rec ? kiln_registry_put_channel(&pc, "demo", "2.0", rec, strlen(rec)) : KILN_ERR_NOMEM;
    CHECK("a record for channel '2.0' is refused (400)",
          rc == KILN_ERR_USAGE && kiln_test_msg_has("HTTP 400", "looks like a version"));
    CHECK("no record stored",
          rfx_int(f.reg.root, RFX_OPEN, "SELECT count(*) FROM channel_records") == 0);
    /* The client's own promote says it before signing anything. */
    kiln_registry_promote_opts po = {.model = "demo",
                                     .channel = "v2",
                                     .version = "1.0.0",
                                     .keys = (const kiln_sign_seckey *const[]){f.p1},
                                     .nkeys = 1};
    kiln_registry_promoted pr;
    CHECK("kiln promote to channel 'v2' is refused by the client",
          kiln_registry_promote(&pc, &po, &pr) == KILN_ERR_USAGE &&
              kiln_test_msg_has("channel name 'v2' looks like a version", NULL));
out:
    free(ap), free(a1), free(rec);
    nfx_free(&f);
}

/* ---- a registry that withholds a channel ---- */

/* It has no record of any channel (404, as a malicious registry or a channel not created yet
 * answers) and serves version 'production' of demo: an archive packed and release-signed as
 * demo@production, which a registry from before the naming rule would have taken. */
typedef struct evil {
    char hex[KILN_SHA256_HEX];
    char *archive;
    size_t alen;
    char *vjson;
    atomic_int version_asks, channel_asks;
} evil;

static bool evil_answer(void *ctx, int c, const char *req) {
    evil *e = ctx;
    char path[512] = "";
    if (sscanf(req, "%*s %511s", path) != 1) path[0] = 0;
    char blob[128];
    snprintf(blob, sizeof blob, "/v1/blobs/sha256/%s", e->hex);
    if (!strcmp(path, "/v1/models/demo/versions/production")) {
        atomic_fetch_add(&e->version_asks, 1);
        rfx_stub_answer(c, 200, e->vjson);
    } else if (!strcmp(path, blob)) {
        char head[256];
        snprintf(head, sizeof head,
                 "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                 "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                 e->alen);
        if (send(c, head, strlen(head), MSG_NOSIGNAL) < 0 ||
            send(c, e->archive, e->alen, MSG_NOSIGNAL) < 0) {
        }
    } else {
        if (strstr(path, "/channels/")) atomic_fetch_add(&e->channel_asks, 1);
        rfx_stub_answer(c, 404, "{\"error\":\"not found\"}");
    }
    return true;
}

static void on_update_none(void *ctx, kiln_err rc, const char *msg, const kiln_pull_result *r) {
    (void)ctx, (void)rc, (void)msg, (void)r;
}

KILN_TEST(registry_withheld_channel_is_never_a_version) {
    nfx f;
    evil e;
    memset(&e, 0, sizeof e);
    rfx_stub s1 = {.started = false}, s2 = {.started = false};
    char *ap = NULL, *sig = NULL, *sigpath = NULL;
    char *state = kiln_test_path("fresh-state"), *out = kiln_test_path("svc"),
         *out2 = kiln_test_path("svc-by-version");
    size_t slen = 0;
    json_t *j = NULL;
    if (!CHECK("fixture", nfx_init(&f))) goto out;
    ap = nfx_archive("evil", "production", f.rel, e.hex);
    sigpath = ap ? kiln_asprintf("%s.minisig", ap) : NULL;
    if (!CHECK("an archive signed as demo@production",
               sigpath && kiln_read_file(ap, 1 << 20, &e.archive, &e.alen) == KILN_OK &&
                   kiln_read_file(sigpath, 1 << 16, &sig, &slen) == KILN_OK))
        goto out;
    char digest[80];
    snprintf(digest, sizeof digest, "sha256:%s", e.hex);
    j = json_pack("{s:s, s:s, s:s, s:I, s:s}", "name", "demo", "version", "production", "digest",
                  digest, "size", (json_int_t)e.alen, "signature", sig);
    e.vjson = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (!CHECK("two such registries", e.vjson && rfx_stub_start(&s1, evil_answer, &e) &&
                                          rfx_stub_start(&s2, evil_answer, &e)))
        goto out;

    /* A fresh client: no state at all (a new host, a container). */
    kiln_err rc = nfx_pull(s1.url, f.reg.trust, state, "demo@production", out);
    CHECK("kiln pull demo@production: refused, the channel is missing",
          rc == KILN_ERR_NOTFOUND &&
              kiln_test_msg_has("no channel 'production' of 'demo'", "never read as a version"));
    CHECK("the channel was asked for, the version never",
          atomic_load(&e.channel_asks) > 0 && atomic_load(&e.version_asks) == 0);
    CHECK("nothing installed", !kiln_path_exists(out));

    kiln_pull_opts po = {.registry = s1.url,
                         .ref = "demo@production",
                         .trust = f.reg.trust,
                         .out = out,
                         .state = state};
    kiln_pull_result pres;
    CHECK("kiln_pull: the same", kiln_pull(&po, &pres) == KILN_ERR_NOTFOUND &&
                                     kiln_test_msg_has("no channel 'production'", NULL) &&
                                     !kiln_path_exists(out));

    const char *two[] = {s2.url};
    po.registries = two;
    po.nregistries = 1;
    CHECK("over two registries: the same",
          kiln_pull(&po, &pres) == KILN_ERR_NOTFOUND &&
              kiln_test_msg_has("no registry has channel 'production' of 'demo'", NULL) &&
              !kiln_path_exists(out));

    kiln_registry_client_opts c = nfx_client(s1.url, NULL);
    kiln_registry_provenance_opts pvo = {
        .ref = "demo@production", .trust = f.reg.trust, .state = state};
    json_t *pj = NULL;
    rc = kiln_registry_provenance(&c, &pvo, &pj);
    CHECK("kiln provenance demo@production: refused as well",
          rc == KILN_ERR_NOTFOUND && !pj && kiln_test_msg_has("no channel 'production'", NULL));
    json_decref(pj);

    kiln_watch *w = NULL;
    char *wdir = kiln_test_path("watch");
    kiln_watch_opts wo = {.pull = {.registry = s1.url,
                                   .ref = "demo@production",
                                   .trust = f.reg.trust,
                                   .out = wdir,
                                   .state = state},
                          .interval_ms = 20,
                          .on_update = on_update_none};
    CHECK("kiln_watch demo@production: does not start", kiln_watch_start(&wo, &w) != KILN_OK && !w);
    wo.pull.ref = "demo@1.0.0";
    CHECK("kiln_watch of a version: refused by name",
          kiln_watch_start(&wo, &w) == KILN_ERR_USAGE && !w &&
              kiln_test_msg_has("names a version", "follows a channel"));
    free(wdir);
    CHECK("still never asked for the version", atomic_load(&e.version_asks) == 0);

    kiln_registry_installed in;
    CHECK("kiln installed demo@1.0.0: a version names no pull of a channel",
          kiln_registry_installed_verify(f.reg.trust, state, "demo@1.0.0", out, &in) ==
                  KILN_ERR_USAGE &&
              kiln_test_msg_has("names a version", NULL));

    /* The bytes themselves verify: the refusals above are the naming rule's. A signed
     * record naming that version (as stored before the rule) reaches it. */
    kiln_registry_pull_opts exact = {.ref = "demo@production",
                                     .trust = f.reg.trust,
                                     .out = out2,
                                     .state = state,
                                     .exact_version = true};
    kiln_registry_pulled got;
    CHECK("read as a version on purpose, the archive verifies",
          kiln_registry_pull(&c, &exact, &got) == KILN_OK && atomic_load(&e.version_asks) == 1 &&
              !strcmp(got.version, "production") && !got.channel[0]);
out:
    rfx_stub_stop(&s1);
    rfx_stub_stop(&s2);
    json_decref(j);
    free(e.vjson), free(e.archive), free(ap), free(sig), free(sigpath);
    free(state), free(out), free(out2);
    nfx_free(&f);
}

/* ---- what an output directory may be ---- */

/* A directory of someone's files: positions.csv and sub/config.ini. */
static char *users_dir(const char *name) {
    char *d = kiln_test_path(name);
    if (!d) return NULL;
    kiln_test_put(d, "positions.csv", "sym,qty\nES,3\n");
    kiln_test_put(d, "sub/config.ini", "[risk]\nlimit=5\n");
    return d;
}

static bool users_dir_intact(const char *d) {
    char *a = kiln_path_join(d, "positions.csv"), *b = kiln_path_join(d, "sub/config.ini");
    char *ta = NULL, *tb = NULL, *list = kiln_test_listing(d);
    size_t la = 0, lb = 0;
    bool ok = a && b && kiln_read_file(a, 1024, &ta, &la) == KILN_OK &&
              kiln_read_file(b, 1024, &tb, &lb) == KILN_OK && !strcmp(ta, "sym,qty\nES,3\n") &&
              !strcmp(tb, "[risk]\nlimit=5\n") && list &&
              !strcmp(list, ".\n..\npositions.csv\nsub\n");
    free(a), free(b), free(ta), free(tb), free(list);
    return ok;
}

/* No temporary directory of a pull is left beside dir. */
static bool no_leftovers(void) {
    char *list = kiln_test_listing(kiln_test_dir());
    bool ok = list && !strstr(list, ".pull-");
    free(list);
    return ok;
}

KILN_TEST(registry_pull_out_replaces_only_what_kiln_installed) {
    nfx f;
    char h1[KILN_SHA256_HEX], h2[KILN_SHA256_HEX];
    char *a1 = NULL, *a2 = NULL, *r1 = NULL, *r2 = NULL, *users = NULL, *model = NULL, *file = NULL,
         *empty = NULL, *extra = NULL;
    if (!CHECK("fixture", nfx_init(&f))) goto out;
    a1 = nfx_archive("one", "1.0.0", f.rel, h1);
    a2 = nfx_archive("two", "2.0.0", f.rel, h2);
    kiln_registry_client_opts c = nfx_client(f.reg.url, f.reg.pub),
                              pc = nfx_client(f.reg.url, f.reg.prom);
    kiln_registry_published pub;
    kiln_sign_seckey *k1[] = {f.p1, NULL};
    r1 = rfx_record("staging", "1.0.0", h1, 1, kiln_unix_time() + 3600, "promote", k1);
    r2 = rfx_record("staging", "2.0.0", h2, 2, kiln_unix_time() + 3600, "promote", k1);
    if (!CHECK("published and promoted",
               a1 && a2 && r1 && r2 && kiln_registry_publish(&c, a1, NULL, &pub) == KILN_OK &&
                   kiln_registry_publish(&c, a2, NULL, &pub) == KILN_OK &&
                   kiln_registry_put_channel(&pc, "demo", "staging", r1, strlen(r1)) == KILN_OK))
        goto out;

    users = users_dir("positions");
    kiln_err rc = nfx_pull(f.reg.url, f.reg.trust, f.reg.state, "demo@staging", users);
    CHECK("a directory of other files is refused",
          rc == KILN_ERR_CONFLICT && kiln_test_msg_has("no manifest.json", "a pull replaces only"));
    CHECK("and left as it was", users_dir_intact(users) && no_leftovers());
    CHECK("refused before anything was fetched: no state, no download",
          !kiln_path_exists(f.reg.state));
    rc = nfx_pull(f.reg.url, f.reg.trust, f.reg.state, "demo@1.0.0", users);
    CHECK("by version too", rc == KILN_ERR_CONFLICT && users_dir_intact(users));

    model = kiln_test_path("model");
    CHECK("a new directory: installed",
          nfx_pull(f.reg.url, f.reg.trust, f.reg.state, "demo@staging", model) == KILN_OK);
    CHECK("it is a model directory kiln installed", kiln_archive_dir_installed(model) == KILN_OK);
    CHECK("promote 2.0.0",
          kiln_registry_put_channel(&pc, "demo", "staging", r2, strlen(r2)) == KILN_OK);
    CHECK("a model directory kiln installed: replaced",
          nfx_pull(f.reg.url, f.reg.trust, f.reg.state, "demo@staging", model) == KILN_OK);
    char *w = kiln_path_join(model, "model.safetensors"), *wt = NULL;
    size_t wl = 0;
    CHECK("by the new version",
          w && kiln_read_file(w, 64, &wt, &wl) == KILN_OK && wl == 3 && !memcmp(wt, "two", 3));
    free(w), free(wt);

    /* Someone's file put into the installed model: the directory is no longer only kiln's. */
    kiln_test_put(model, "notes.txt", "keep me\n");
    rc = nfx_pull(f.reg.url, f.reg.trust, f.reg.state, "demo@1.0.0", model);
    CHECK("a model directory holding another file is refused",
          rc == KILN_ERR_CONFLICT && kiln_test_msg_has("'notes.txt'", "does not list"));
    char *notes = kiln_path_join(model, "notes.txt"), *nt = NULL;
    size_t nl = 0;
    CHECK("the file is still there",
          notes && kiln_read_file(notes, 64, &nt, &nl) == KILN_OK && !strcmp(nt, "keep me\n"));
    free(notes), free(nt);

    file = kiln_test_write("a-file", "data", 4);
    CHECK("a file is refused",
          nfx_pull(f.reg.url, f.reg.trust, f.reg.state, "demo@1.0.0", file) == KILN_ERR_CONFLICT);
    char *ft = NULL;
    size_t fl = 0;
    CHECK("and kept", kiln_read_file(file, 64, &ft, &fl) == KILN_OK && fl == 4);
    free(ft);
    empty = kiln_test_path("empty");
    CHECK("an empty directory is filled",
          kiln_mkdir_p(empty) == KILN_OK &&
              nfx_pull(f.reg.url, f.reg.trust, f.reg.state, "demo@1.0.0", empty) == KILN_OK);
    CHECK("no temporary directory left", no_leftovers());

    /* kiln installed names a directory that is not one kiln installed as such. */
    kiln_registry_installed in;
    rc = kiln_registry_installed_verify(f.reg.trust, f.reg.state, "demo@staging", users, &in);
    CHECK("kiln installed on the directory of other files: not a model directory",
          rc == KILN_ERR_VERIFY && kiln_test_msg_has("not a model directory", "manifest.json"));
    CHECK("untouched", users_dir_intact(users));

    /* kiln_watch: its directory holds its own entries only. */
    kiln_watch *wt2 = NULL;
    kiln_watch_opts wo = rfx_watch_opts(&f.reg, f.reg.trust, users, on_update_none, NULL);
    rc = kiln_watch_start(&wo, &wt2);
    CHECK("kiln_watch into the directory of other files: refused",
          rc == KILN_ERR_CONFLICT && !wt2 &&
              kiln_test_msg_has("which kiln_watch does not make", NULL));
    CHECK("untouched by the watch", users_dir_intact(users));
    extra = kiln_test_path("gen-like");
    kiln_test_put(extra, "gen-notes/plan.txt", "mine\n");
    wo.pull.out = extra;
    rc = kiln_watch_start(&wo, &wt2);
    CHECK("a directory holding gen-notes/ (a gen- prefix, not a watch's gen-N): refused",
          rc == KILN_ERR_CONFLICT && !wt2 && kiln_test_msg_has("'gen-notes'", NULL));
    char *plan = kiln_path_join(extra, "gen-notes/plan.txt");
    CHECK("and gen-notes/ kept", plan && kiln_path_exists(plan));
    free(plan);
out:
    free(a1), free(a2), free(r1), free(r2), free(users), free(model), free(file), free(empty);
    free(extra);
    nfx_free(&f);
}

/* ---- the server's smaller answers ---- */

KILN_TEST(registry_server_small_answers) {
    nfx f;
    char h1[KILN_SHA256_HEX];
    char *a1 = NULL, *r1 = NULL, *junk = NULL, *jsig = NULL, *b64 = NULL, *sig = NULL;
    rfx_resp resp = {0};
    if (!CHECK("fixture", nfx_init(&f))) goto out;
    a1 = nfx_archive("one", "1.0.0", f.rel, h1);
    kiln_registry_client_opts c = nfx_client(f.reg.url, f.reg.pub),
                              pc = nfx_client(f.reg.url, f.reg.prom);
    kiln_registry_published pub;
    kiln_sign_seckey *k1[] = {f.p1, NULL};
    r1 = rfx_record("staging", "1.0.0", h1, 1, kiln_unix_time() + 3600, "promote", k1);
    if (!CHECK("published and promoted",
               a1 && r1 && kiln_registry_publish(&c, a1, NULL, &pub) == KILN_OK &&
                   kiln_registry_put_channel(&pc, "demo", "staging", r1, strlen(r1)) == KILN_OK))
        goto out;
    const uint64_t stored = pub.size;

    /* (a) Bytes that are no kiln archive, validly signed by the release key. */
    junk = kiln_test_write("not-an-archive.bin", "just some bytes, no tar\n", 24);
    if (!CHECK("signed as a file", junk && kiln_sign_file(f.rel, junk, "a file", &sig) == KILN_OK))
        goto out;
    jsig = kiln_asprintf("%s.minisig", junk);
    CHECK("signature written", jsig && kiln_write_file_atomic(jsig, sig, strlen(sig)) == KILN_OK);
    size_t cap = sodium_base64_ENCODED_LEN(strlen(sig), sodium_base64_VARIANT_ORIGINAL);
    b64 = malloc(cap);
    if (!CHECK("base64", b64)) goto out;
    sodium_bin2base64(b64, cap, (const unsigned char *)sig, strlen(sig),
                      sodium_base64_VARIANT_ORIGINAL);
    uint8_t d[KILN_SHA256_BYTES];
    char jhex[KILN_SHA256_HEX], hdig[128], hsig[8192];
    CHECK("hash", kiln_sha256_file(junk, d) == KILN_OK);
    kiln_hex(d, sizeof d, jhex);
    snprintf(hdig, sizeof hdig, "X-Kiln-Digest: sha256:%s", jhex);
    snprintf(hsig, sizeof hsig, "X-Kiln-Signature: %s", b64);
    const char *hdrs[] = {hdig, hsig, NULL};
    long st = rfx_http(f.reg.url, "PUT", "/v1/models/demo/versions/1.0.1", f.reg.pub,
                       "just some bytes, no tar\n", hdrs, &resp);
    CHECK("a validly signed upload that is no archive: 422, said as such",
          st == 422 && strstr(resp.body, "not a kiln archive") &&
              strstr(resp.body, "its signatures verify") &&
              !strstr(resp.body, "archive signature"));

    /* (b) history's after= is digits, as /v1/audit's numbers. */
    const char *bad[] = {"abc", "-1", "1e3", "%201", "1.5", "99999999999999999999", ""};
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        char path[200];
        snprintf(path, sizeof path, "/v1/models/demo/channels/staging/history?after=%s", bad[i]);
        st = rfx_http(f.reg.url, "GET", path, NULL, NULL, NULL, &resp);
        CHECK("a bad after= is 400", st == 400 && strstr(resp.body, "after must be"));
    }
    st = rfx_http(f.reg.url, "GET", "/v1/models/demo/channels/staging/history?after=0", NULL, NULL,
                  NULL, &resp);
    CHECK("after=0: every record", st == 200 && strstr(resp.body, "\"seq\":1") != NULL);
    st = rfx_http(f.reg.url, "GET", "/v1/models/demo/channels/staging/history?after=1", NULL, NULL,
                  NULL, &resp);
    CHECK("after=1: none after it", st == 200 && strstr(resp.body, "\"records\":[]") != NULL);

    /* (c) Re-publishing: the stored size, not the declared one. */
    char adig[128], asig[16384], *atext = NULL, *ab64 = NULL,
                                 *apath = kiln_asprintf("%s.minisig", a1);
    size_t alen = 0;
    if (apath && kiln_read_file(apath, 1 << 15, &atext, &alen) == KILN_OK) {
        size_t acap = sodium_base64_ENCODED_LEN(alen, sodium_base64_VARIANT_ORIGINAL);
        ab64 = malloc(acap);
        if (ab64)
            sodium_bin2base64(ab64, acap, (const unsigned char *)atext, alen,
                              sodium_base64_VARIANT_ORIGINAL);
    }
    snprintf(adig, sizeof adig, "X-Kiln-Digest: sha256:%s", h1);
    snprintf(asig, sizeof asig, "X-Kiln-Signature: %s", ab64 ? ab64 : "");
    const char *ahdrs[] = {adig, asig, NULL};
    st = rfx_http(f.reg.url, "PUT", "/v1/models/demo/versions/1.0.0", f.reg.pub, "12345", ahdrs,
                  &resp);
    char want[64];
    snprintf(want, sizeof want, "\"size\":%llu", (unsigned long long)stored);
    CHECK("the same digest again, 5 bytes declared: 200 with the stored size",
          ab64 && st == 200 && strstr(resp.body, want) && !strstr(resp.body, "\"size\":5,") &&
              !strstr(resp.body, "\"size\":5}"));
    free(atext), free(ab64), free(apath);
out:
    rfx_resp_free(&resp);
    free(a1), free(r1), free(junk), free(jsig), free(b64), free(sig);
    nfx_free(&f);
}

/* A release's baseline is a channel, only a channel: refused by name otherwise; and a channel
 * whose signed record names a version the registry lacks is a refusal, not "no baseline" (which
 * a release would have taken as a first release, comparing against nothing). */
KILN_TEST(registry_release_names_and_baseline) {
    nfx f;
    char h1[KILN_SHA256_HEX];
    char *a1 = NULL, *r1 = NULL, *data = kiln_test_synth("d.st", 3, 200),
         *outd = kiln_test_path("rel-out"), *base = kiln_test_path("baseline");
    if (!CHECK("fixture", nfx_init(&f))) goto out;
    kiln_registry_client_opts c = nfx_client(f.reg.url, f.reg.pub),
                              pc = nfx_client(f.reg.url, f.reg.prom);
    const kiln_sign_seckey *keys[] = {f.rel};
    kiln_release_opts o = {.run_dir = "no-such-run",
                           .name = "demo",
                           .version = "production",
                           .data = data,
                           .out_dir = outd,
                           .trust = f.reg.trust,
                           .state = f.reg.state,
                           .release_keys = keys,
                           .n_release_keys = 1,
                           .client = &c};
    kiln_release_result res;
    CHECK("release --version production: refused at check",
          kiln_release_run(&o, &res) == KILN_ERR_USAGE && res.stage == KILN_RELEASE_CHECK &&
              kiln_test_msg_has("does not look like a version", NULL));
    o.version = "1.0.0";
    o.baseline_channel = "1.0.0";
    CHECK("--baseline-channel 1.0.0: refused at check",
          kiln_release_run(&o, &res) == KILN_ERR_USAGE &&
              kiln_test_msg_has("channel name '1.0.0' looks like a version", NULL));
    o.baseline_channel = NULL;
    o.promote = "v2";
    o.promote_keys = (const kiln_sign_seckey *const[]){f.p1};
    o.n_promote_keys = 1;
    CHECK("--promote v2: refused at check",
          kiln_release_run(&o, &res) == KILN_ERR_USAGE &&
              kiln_test_msg_has("channel name 'v2' looks like a version", NULL));
    CHECK("nothing made", !kiln_path_exists(outd));

    /* The baseline pull (channel_only) against a channel naming a version that is gone. */
    a1 = nfx_archive("one", "1.0.0", f.rel, h1);
    kiln_registry_published pub;
    kiln_sign_seckey *k1[] = {f.p1, NULL};
    r1 = rfx_record("staging", "1.0.0", h1, 1, kiln_unix_time() + 3600, "promote", k1);
    if (!CHECK("published and promoted",
               a1 && r1 && kiln_registry_publish(&c, a1, NULL, &pub) == KILN_OK &&
                   kiln_registry_put_channel(&pc, "demo", "staging", r1, strlen(r1)) == KILN_OK &&
                   rfx_sql(f.reg.root, RFX_OPEN, "DELETE FROM versions WHERE version = '1.0.0'",
                           NULL)))
        goto out;
    kiln_registry_client_opts rd = nfx_client(f.reg.url, NULL);
    kiln_registry_pull_opts p = {.ref = "demo@staging",
                                 .trust = f.reg.trust,
                                 .out = base,
                                 .state = f.reg.state,
                                 .channel_only = true};
    kiln_registry_pulled got;
    CHECK("a record naming a version the registry lacks: refused, not 'no such channel'",
          kiln_registry_pull(&rd, &p, &got) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("names demo@1.0.0, which the registry does not hold", NULL));
    p.ref = "demo@1.0.0";
    CHECK("channel_only takes no version",
          kiln_registry_pull(&rd, &p, &got) == KILN_ERR_USAGE &&
              kiln_test_msg_has("names a version", "takes a channel only"));
out:
    free(a1), free(r1), free(data), free(outd), free(base);
    nfx_free(&f);
}

/* kiln promote / rollback / renew --out write a new file, as kiln channel sign --out does:
 * never over the trust policy, or a record someone is co-signing. */
KILN_TEST(registry_record_out_is_a_new_file) {
    nfx f;
    char h1[KILN_SHA256_HEX];
    char *a1 = NULL, *before = NULL, *after = NULL, *rec = kiln_test_path("rec.json");
    size_t lb = 0, la = 0;
    if (!CHECK("fixture", nfx_init(&f))) goto out;
    a1 = nfx_archive("one", "1.0.0", f.rel, h1);
    kiln_registry_client_opts c = nfx_client(f.reg.url, f.reg.pub);
    kiln_registry_published pub;
    if (!CHECK("published", a1 && kiln_registry_publish(&c, a1, NULL, &pub) == KILN_OK)) goto out;
    kiln_registry_promote_opts po = {.model = "demo",
                                     .channel = "staging",
                                     .version = "1.0.0",
                                     .keys = (const kiln_sign_seckey *const[]){f.p1},
                                     .nkeys = 1,
                                     .save_to = f.reg.trust};
    kiln_registry_promoted pr;
    CHECK("read the policy", kiln_read_file(f.reg.trust, 1 << 20, &before, &lb) == KILN_OK);
    CHECK("promote --out naming the trust policy: refused",
          kiln_registry_promote(&c, &po, &pr) == KILN_ERR_CONFLICT &&
              kiln_test_msg_has("exists already", "give another --out"));
    CHECK("the policy is as it was", kiln_read_file(f.reg.trust, 1 << 20, &after, &la) == KILN_OK &&
                                         la == lb && !memcmp(before, after, la));
    po.save_to = rec;
    CHECK("a new file: written",
          kiln_registry_promote(&c, &po, &pr) == KILN_OK && kiln_path_exists(rec));
    CHECK("and not again over it", kiln_registry_promote(&c, &po, &pr) == KILN_ERR_CONFLICT);
    kiln_registry_renew_opts ro = {.model = "demo",
                                   .channel = "staging",
                                   .trust = f.reg.trust,
                                   .state = f.reg.state,
                                   .keys = (const kiln_sign_seckey *const[]){f.p1},
                                   .nkeys = 1,
                                   .save_to = f.reg.trust};
    char version[KILN_REGISTRY_NAME_MAX + 1];
    int64_t was;
    CHECK("renew --out naming the trust policy: refused before anything is asked",
          kiln_registry_renew(&c, &ro, &pr, version, &was) == KILN_ERR_CONFLICT);
out:
    free(a1), free(before), free(after), free(rec);
    nfx_free(&f);
}

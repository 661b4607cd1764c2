/*
 * bench_web.c - the registry's web page on a store of 200 versions and 1000 channel records
 * (production 600, staging 300, canary 100; 1200 audit rows), against a baseline measured in
 * the same run: the JSON API's answer with the same rows, over the same HTTP. For each page:
 * the render alone (registry/server/ui.c reading SQLite and web/ writing HTML, in this process) and
 * the page served by `kiln registry serve`'s code over loopback (libcurl, a new connection
 * per request), then the JSON route's time and size (the history's JSON holds all 600
 * records, the page the newest 200). The trust page walks 50 stored versions of the policy
 * (each signed by two root keys, each rotating one promote key) against GET /v1/trust, the
 * newest version's document. Every signature, card, record and trust version in the store is
 * real (signed here with fresh keys). Medians of REPS runs.
 * Usage: bench_web DIR (the store is made there); results on stdout.
 */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry_int.h"
#include "web.h"

#define VERSIONS 200
#define TRUST_VERSIONS 50 /* stored, above the --trust file's version 1 */
#define REPS 30

static const struct {
    const char *name;
    int records;
} channels[] = {{"production", 600}, {"staging", 300}, {"canary", 100}};

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static double median_ms(uint64_t *ns, int n) {
    qsort(ns, (size_t)n, sizeof *ns, cmp_u64);
    return ns[n / 2] / 1e6;
}

static void die(const char *what) {
    fprintf(stderr, "bench_web: %s: %s\n", what, kiln_errmsg());
    exit(2);
}

static void sql(sqlite3 *db, sqlite3_stmt **st, const char *text) {
    if (sqlite3_prepare_v2(db, text, -1, st, NULL) != SQLITE_OK) die(sqlite3_errmsg(db));
}

static void step(sqlite3 *db, sqlite3_stmt *st) {
    if (sqlite3_step(st) != SQLITE_DONE) die(sqlite3_errmsg(db));
    sqlite3_reset(st);
}

/* A card as kiln export writes one: the model's config, the run's lineage and metrics. */
static char *card(int i) {
    return kiln_asprintf(
        "{\"config\":{\"attn_window\":64,\"d_ff\":256,\"d_model\":128,\"dropout\":0,"
        "\"experts\":8,\"features\":8,\"format\":\"kiln-tsmoe/1\",\"heads\":4,\"layers\":4,"
        "\"outputs\":2,\"seq_len\":128,\"top_k\":2},\"created\":\"2026-11-29T21:57:%02dZ\","
        "\"dtype\":\"f32\",\"format\":\"kiln-card/1\",\"lineage\":{\"checkpoint\":{\"data_sha256\":"
        "\"3f0c9a1b2c3d4e5f3f0c9a1b2c3d4e5f3f0c9a1b2c3d4e5f3f0c9a1b2c3d4e5f\",\"file\":\"ckpt/"
        "step-00000600.safetensors\",\"sha256\":"
        "\"9b1d2e3f4a5b6c7d9b1d2e3f4a5b6c7d9b1d2e3f4a5b6c7d9b"
        "1d2e3f4a5b6c7d\"},\"code_version\":\"0.1.0 (00d23911d6f8)\",\"config\":{\"batch\":32,"
        "\"lr\":0.003,\"seed\":%d,\"steps\":600,\"warmup\":50,\"weight_decay\":0.1},"
        "\"dataset_sha256\":\"a1b2c3d4e5f60718a1b2c3d4e5f60718a1b2c3d4e5f60718a1b2c3d4e5f60718\","
        "\"metrics\":{\"loss\":0.%06d,\"val_loss\":0.%06d,\"val_r2\":0.0%05d,\"val_step\":600},"
        "\"run_id\":\"run-%04d\",\"step\":600},\"name\":\"bench\"}",
        i % 60, i, 900000 + i, 910000 + i, 1000 + i, i);
}

typedef struct body {
    size_t len;
} body;

static size_t sink(char *d, size_t s, size_t n, void *ctx) {
    (void)d;
    ((body *)ctx)->len += s * n;
    return s * n;
}

/* Median milliseconds of a GET, and the body's size. */
static double fetch_ms(uint16_t port, const char *path, const char *token, size_t *bytes) {
    uint64_t ns[REPS];
    char url[256], auth[160];
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", (unsigned)port, path);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    for (int r = 0; r < REPS; r++) {
        CURL *h = curl_easy_init();
        struct curl_slist *hdr = curl_slist_append(NULL, auth);
        body b = {0};
        long status = 0;
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        uint64_t t0 = kiln_now_ns();
        CURLcode rc = curl_easy_perform(h);
        ns[r] = kiln_now_ns() - t0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(h);
        curl_slist_free_all(hdr);
        if (rc != CURLE_OK || status != 200) {
            fprintf(stderr, "bench_web: GET %s: %s, HTTP %ld\n", path, curl_easy_strerror(rc),
                    status);
            exit(2);
        }
        *bytes = b.len;
    }
    return median_ms(ns, REPS);
}

typedef kiln_err (*render_fn)(sqlite3 *db, const kiln_sign_trust *t, int64_t now, kiln_web_buf *b);
static kiln_err r_home(sqlite3 *db, const kiln_sign_trust *t, int64_t now, kiln_web_buf *b) {
    return reg_ui_home(db, t, now, b);
}
static kiln_err r_model(sqlite3 *db, const kiln_sign_trust *t, int64_t now, kiln_web_buf *b) {
    return reg_ui_model(db, t, "bench", now, b);
}
static kiln_err r_channel(sqlite3 *db, const kiln_sign_trust *t, int64_t now, kiln_web_buf *b) {
    return reg_ui_channel(db, t, "bench", "production", 0, now, b);
}
static kiln_err r_audit(sqlite3 *db, const kiln_sign_trust *t, int64_t now, kiln_web_buf *b) {
    (void)t;
    return reg_ui_audit(db, 0, now, b);
}
/* The trust page walks from the --trust policy to the one in force, as the server does. */
static const kiln_sign_trust *trust_in_force;
static kiln_err r_trust(sqlite3 *db, const kiln_sign_trust *t, int64_t now, kiln_web_buf *b) {
    return reg_ui_trust(db, trust_in_force, t, 0, now, b);
}

/* The policy of version v: root keys r1 r2 (both must sign the next version), the release
 * key, alice and bob, and from version 2 on a promote key kN that the next version replaces
 * (a key rotated each time). Caller frees. */
static char *policy_v(int v, const char *const b64[], int nrot) {
    char extra[256] = "";
    if (v >= 2)
        snprintf(extra, sizeof extra,
                 ",{\"name\":\"k%d\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]}", v,
                 b64[5 + (v - 2) % nrot]);
    return kiln_asprintf(
        "{\"format\":\"kiln-trust/1\",\"version\":%d,\"root_threshold\":2,\"keys\":["
        "{\"name\":\"r1\",\"pubkey\":\"%s\",\"roles\":[\"root\"]},"
        "{\"name\":\"r2\",\"pubkey\":\"%s\",\"roles\":[\"root\"]},"
        "{\"name\":\"release\",\"pubkey\":\"%s\",\"roles\":[\"release\"]},"
        "{\"name\":\"alice\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]},"
        "{\"name\":\"bob\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]}%s],"
        "\"channels\":{\"production\":{\"threshold\":2},\"staging\":{\"threshold\":1},"
        "\"canary\":{\"threshold\":1}}}",
        v, b64[3], b64[4], b64[0], b64[1], b64[2], extra);
}

/* Median milliseconds of a render into memory. */
static double render_ms(sqlite3 *db, const kiln_sign_trust *t, render_fn f) {
    uint64_t ns[REPS];
    for (int r = 0; r < REPS; r++) {
        kiln_web_buf b = {0};
        uint64_t t0 = kiln_now_ns();
        if (f(db, t, kiln_unix_time(), &b) != KILN_OK) die("render");
        ns[r] = kiln_now_ns() - t0;
        kiln_web_buf_release(&b);
    }
    return median_ms(ns, REPS);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: bench_web DIR\n");
        return 2;
    }
    char *root = kiln_path_join(argv[1], "web-store"), *trust_path = NULL, *token = NULL;
    if (!root || kiln_mkdir_p(argv[1]) != KILN_OK) die(argv[1]);
    if (kiln_path_exists(root)) {
        reg_rmtree(root);
    }
    /* rel, alice, bob, r1, r2, then the promote keys the trust versions rotate through. */
    enum { NROT = 8, NKEYS = 5 + NROT };
    kiln_sign_seckey *sk[NKEYS];
    static char b64[NKEYS][KILN_SIGN_PUBKEY_B64];
    const char *b64p[NKEYS];
    for (int i = 0; i < NKEYS; i++) {
        kiln_sign_pubkey pk;
        if (kiln_sign_seckey_generate(&sk[i]) || kiln_sign_seckey_pubkey(sk[i], &pk)) die("keys");
        kiln_sign_pubkey_base64(&pk, b64[i]);
        b64p[i] = b64[i];
    }
    kiln_sign_seckey *rel = sk[0], *p1 = sk[1], *p2 = sk[2];
    char *policy = policy_v(1, b64p, NROT);
    trust_path = kiln_path_join(argv[1], "web-trust.json");
    kiln_sign_trust *trust = NULL;
    if (!policy || !trust_path ||
        kiln_write_file_atomic(trust_path, policy, strlen(policy)) != KILN_OK ||
        kiln_sign_trust_load(trust_path, &trust) != KILN_OK)
        die("trust policy");
    if (kiln_registry_token_create(root, "ops", KILN_SCOPE_ADMIN, &token) != KILN_OK) die("token");

    /* The store, as a year of releases would leave it: one transaction. */
    sqlite3 *db;
    if (reg_db_open(root, &db) != KILN_OK || reg_db_exec(db, "BEGIN") != KILN_OK) die("store");
    sqlite3_stmt *iv, *ir;
    sql(db, &iv,
        "INSERT INTO versions VALUES('bench', ?1, ?2, ?3, '{}', ?4, ?5, ?6, 'ci', ?7, NULL)");
    sql(db, &ir,
        "INSERT INTO channel_records VALUES('bench', ?1, ?2, ?3, ?4, ?5, ?6, ?7, "
        "'release-manager', ?8)");
    int64_t t0 = kiln_unix_time() - 365 * 86400;
    static kiln_digest digests[VERSIONS];
    static char versions[VERSIONS][16];
    uint8_t raw[VERSIONS][32];
    for (int i = 0; i < VERSIONS; i++) {
        snprintf(versions[i], sizeof versions[i], "1.%d.0", i);
        char msg[32], hex[KILN_SHA256_HEX];
        snprintf(msg, sizeof msg, "archive %d", i);
        kiln_sha256(msg, strlen(msg), raw[i]);
        kiln_hex(raw[i], 32, hex);
        snprintf(digests[i], sizeof digests[i], "sha256:%s", hex);
        kiln_sign_archive_info info = {.validation = KILN_SIGN_VALIDATION_PASSED};
        snprintf(info.model, sizeof info.model, "bench");
        snprintf(info.version, sizeof info.version, "%s", versions[i]);
        memcpy(info.manifest_sha256, raw[i], 32);
        char *comment = kiln_sign_archive_comment(&info), *sig = NULL, *c = card(i);
        if (!comment || !c ||
            kiln_sign_buffer(rel, msg, strlen(msg), comment, KILN_SIGN_PREHASHED, &sig))
            die("signature");
        sqlite3_bind_text(iv, 1, versions[i], -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(iv, 2, digests[i], -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(iv, 3, 50000 + i);
        sqlite3_bind_text(iv, 4, sig, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(iv, 5, c, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(iv, 6, "{\"passed\":true,\"sha256\":\"00\"}", -1, SQLITE_STATIC);
        sqlite3_bind_int64(iv, 7, t0 + i * 3600);
        step(db, iv);
        if (reg_audit(db, "ci", "publish", "bench", versions[i], NULL, digests[i])) die("audit");
        free(comment), free(sig), free(c);
    }
    size_t total = 0;
    for (size_t ch = 0; ch < KILN_ARRAY_LEN(channels); ch++) {
        for (int s = 1; s <= channels[ch].records; s++) {
            /* Mostly forward, every tenth a rollback to the version before. */
            int v = (s * VERSIONS / channels[ch].records) - (s % 10 == 0 ? 2 : 0);
            v = v < 0 ? 0 : v >= VERSIONS ? VERSIONS - 1 : v;
            const char *reason = s % 10 == 0 ? "rollback" : "promote after the nightly validation";
            kiln_sign_record r;
            kiln_sign_record_init(&r);
            char *text = NULL;
            size_t len;
            int64_t created = t0 + s * 1800, expires = created + 30 * 86400;
            if (s == channels[ch].records) expires = kiln_unix_time() + (int64_t)ch * 5 * 86400;
            if (kiln_sign_record_set(&r, "bench", channels[ch].name, versions[v], raw[v],
                                     (uint64_t)s, expires, reason) ||
                kiln_sign_record_add_signature(&r, p1) ||
                (ch == 0 && kiln_sign_record_add_signature(&r, p2)) ||
                kiln_sign_record_text(&r, &text, &len))
                die("record");
            sqlite3_bind_text(ir, 1, channels[ch].name, -1, SQLITE_STATIC);
            sqlite3_bind_int64(ir, 2, s);
            sqlite3_bind_text(ir, 3, versions[v], -1, SQLITE_TRANSIENT);
            sqlite3_bind_text(ir, 4, digests[v], -1, SQLITE_TRANSIENT);
            sqlite3_bind_int64(ir, 5, expires);
            sqlite3_bind_text(ir, 6, reason, -1, SQLITE_STATIC);
            sqlite3_bind_text(ir, 7, text, (int)len, SQLITE_TRANSIENT);
            sqlite3_bind_int64(ir, 8, created);
            step(db, ir);
            if (reg_audit(db, "release-manager", s % 10 ? "promote" : "rollback", "bench",
                          versions[v], channels[ch].name, digests[v]))
                die("audit");
            free(text);
            kiln_sign_record_release(&r);
            total++;
        }
    }
    /* The trust versions 2..51, each signed by r1 and r2 as kiln trust sign does. */
    sqlite3_stmt *it;
    sql(db, &it,
        "INSERT INTO trust_versions(version, document, publisher, created) "
        "VALUES(?1, ?2, 'ops', ?3)");
    for (int v = 2; v <= TRUST_VERSIONS + 1; v++) {
        char *text = policy_v(v, b64p, NROT), *one = NULL, *two = NULL;
        size_t len = 0;
        if (!text || kiln_sign_trust_sign(text, strlen(text), "bench trust", sk[3], &one, &len) ||
            kiln_sign_trust_add_signature(one, len, "bench trust", sk[4], &two, &len))
            die("trust version");
        sqlite3_bind_int(it, 1, v);
        sqlite3_bind_text(it, 2, two, (int)len, SQLITE_TRANSIENT);
        sqlite3_bind_int64(it, 3, t0 + v * 7 * 86400);
        step(db, it);
        free(text), free(one), free(two);
    }
    sqlite3_finalize(it);
    sqlite3_finalize(iv);
    sqlite3_finalize(ir);
    if (reg_db_exec(db, "COMMIT") != KILN_OK) die("commit");
    reg_db_close(db);

    kiln_registry_server_opts o = {
        .root = root, .listen = "127.0.0.1:0", .trust = trust_path, .threads = 2};
    kiln_registry_server *srv = NULL;
    if (kiln_registry_server_start(&o, &srv) != KILN_OK) die("server");
    uint16_t port = kiln_registry_server_port(srv);
    if (reg_db_connect(root, &db) != KILN_OK) die("store");
    /* The policy in force, walked from the --trust file as the server walked it. */
    kiln_sign_trust *start = NULL, *newest = NULL;
    reg_trust_chain chain;
    if (kiln_sign_trust_load(trust_path, &start) ||
        reg_trust_chain_load(db, root, start, "bench", NULL, NULL, &chain))
        die("trust chain");
    newest = reg_trust_chain_take_newest(&chain);
    reg_trust_chain_release(&chain);
    if (kiln_sign_trust_version(newest) != TRUST_VERSIONS + 1) die("trust chain");
    trust_in_force = newest;

    static const struct {
        const char *page, *rows, *json;
        render_fn render;
    } pages[] = {
        {"/", "1 model, 3 channels", "/v1/models", r_home},
        {"/ui/models/bench", "200 versions, 3 channels", "/v1/models/bench", r_model},
        {"/ui/models/bench/channels/production", "200 newest of 600 records",
         "/v1/models/bench/channels/production/history", r_channel},
        {"/ui/audit", "100 of 1201 rows", "/v1/audit?limit=100", r_audit},
        {"/ui/trust", "50 versions, 6 keys", "/v1/trust", r_trust},
    };
    printf("store: %d versions, %zu channel records (production 600 with 2 signatures each,"
           " staging 300, canary 100), 1201 audit rows, %d trust versions (2 root signatures"
           " each); medians of %d\n\n",
           VERSIONS, total, TRUST_VERSIONS, REPS);
    printf("%-38s %-26s %9s %9s %9s | %-45s %9s %9s %6s\n", "page", "rows", "bytes", "render",
           "served", "JSON route (baseline)", "bytes", "served", "ratio");
    for (size_t i = 0; i < KILN_ARRAY_LEN(pages); i++) {
        size_t pb = 0, jb = 0;
        double render = render_ms(db, trust, pages[i].render),
               served = fetch_ms(port, pages[i].page, token, &pb),
               json = fetch_ms(port, pages[i].json, token, &jb);
        printf("%-38s %-26s %9zu %7.2fms %7.2fms | %-45s %9zu %7.2fms %6.2f\n", pages[i].page,
               pages[i].rows, pb, render, served, pages[i].json, jb, json, served / json);
    }
    /* Where the trust page's time goes: the same walk without the page (every version's
     * signatures verified as the successor of the one before, as the server's start does). */
    uint64_t wns[REPS];
    for (int r = 0; r < REPS; r++) {
        kiln_sign_trust *t1 = NULL;
        reg_trust_chain c;
        uint64_t w0 = kiln_now_ns();
        if (kiln_sign_trust_load(trust_path, &t1) ||
            reg_trust_chain_load(db, root, t1, "bench", NULL, NULL, &c))
            die("trust chain");
        wns[r] = kiln_now_ns() - w0;
        reg_trust_chain_release(&c);
    }
    printf("\nthe walk alone (reg_trust_chain_load from --trust through the %d stored versions, as "
           "the server's start): %.2fms\n",
           TRUST_VERSIONS, median_ms(wns, REPS));
    printf("render: registry/server/ui.c + web/ into memory, in process; served: GET over loopback "
           "(libcurl, new connection each), the server's 2 threads; ratio: page / JSON served\n");
    reg_db_close(db);
    kiln_registry_server_stop(srv, 1000);
    kiln_sign_trust_free(trust);
    kiln_sign_trust_free(newest);
    for (int i = 0; i < NKEYS; i++)
        kiln_sign_seckey_free(sk[i]);
    reg_rmtree(root);
    free(root), free(trust_path), free(policy), free(token);
    return 0;
}

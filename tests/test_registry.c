/* test_registry.c - the registry: names, tokens, the blob store, fsck and gc, and a real
 * server on loopback (ports chosen at runtime) driven over real HTTP. */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "registry_int.h"
#include "test.h"

/* ---- helpers ---- */

typedef struct resp {
    long status;
    char body[8192];
    size_t len;
} resp;

static size_t resp_write(char *d, size_t s, size_t n, void *ctx) {
    resp *r = ctx;
    size_t k = s * n, room = sizeof r->body - 1 - r->len;
    memcpy(r->body + r->len, d, k < room ? k : room);
    r->len += k < room ? k : room;
    r->body[r->len] = 0;
    return k;
}

/* One request to the test server; returns the status (0 on a connection failure). */
static long http(uint16_t port, const char *method, const char *path, const char *token, const char *body,
                 const char *const *headers, resp *out) {
    resp local;
    if (!out) out = &local;
    memset(out, 0, sizeof *out);
    CURL *h = curl_easy_init();
    if (!h) return 0;
    char url[1024], auth[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", (unsigned)port, path);
    struct curl_slist *hdr = NULL;
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        hdr = curl_slist_append(hdr, auth);
    }
    for (int i = 0; headers && headers[i]; i++) hdr = curl_slist_append(hdr, headers[i]);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, resp_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (curl_easy_perform(h) == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &out->status);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdr);
    return out->status;
}

static kiln_registry_server *start(const char *root, const char *trust, bool read_required) {
    kiln_registry_server_opts o = {.root = root, .listen = "127.0.0.1:0", .trust = trust,
                                   .read_token_required = read_required, .threads = 4};
    kiln_registry_server *s = NULL;
    if (kiln_registry_server_start(&o, &s) != KILN_OK) return NULL;
    return s;
}

/* Put bytes into the store as a blob (no version); hex receives the digest. */
static bool put_blob(const char *root, const void *data, size_t len, char hex[KILN_SHA256_HEX]) {
    uint8_t h[KILN_SHA256_BYTES];
    kiln_sha256(data, len, h);
    kiln_hex(h, sizeof h, hex);
    sqlite3 *db;
    if (reg_db_open(root, &db) != KILN_OK) return false;
    reg_db_close(db);
    reg_upload u;
    if (reg_upload_begin(&u, root) != KILN_OK) return false;
    bool ok = reg_upload_write(&u, data, len) == KILN_OK && reg_upload_check(&u, hex, len) == KILN_OK &&
              reg_upload_commit(&u, hex) == KILN_OK;
    reg_upload_abort(&u);
    return ok;
}

static size_t count_entries(const char *dir) {
    size_t n = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* ---- names ---- */

KILN_TEST(registry_names) {
    const char *good[] = {"m", "tsmoe-dense", "a.b_c-d", "0abc"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(good); i++)
        CHECK("a plain name is accepted", kiln_registry_check_name("model", good[i]) == KILN_OK);
    const char *bad[] = {"", "../x", "a/b", "a..b", ".hidden", "-x", "Upper", "a'b", "a\"b", "x;DROP TABLE versions",
                         "a b", "a%2fb", "a\\b",
                         "a123456789012345678901234567890123456789012345678901234567890123456789"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        kiln_err rc = kiln_registry_check_name("model", bad[i]);
        CHECK("a bad name is refused", rc == KILN_ERR_USAGE);
        CHECK("the message names the kind", strstr(kiln_errmsg(), "model name") != NULL);
    }
    CHECK("versions allow upper case and +", kiln_registry_check_version("1.0.0+Build-7") == KILN_OK);
    CHECK("versions refuse ..", kiln_registry_check_version("1..0") == KILN_ERR_USAGE);
    CHECK("versions refuse /", kiln_registry_check_version("1/0") == KILN_ERR_USAGE);
    CHECK("versions refuse a leading dot", kiln_registry_check_version(".1") == KILN_ERR_USAGE);
    char hex[KILN_SHA256_HEX];
    CHECK("digest form", reg_digest_hex("sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", hex));
    CHECK("digest upper case refused",
          !reg_digest_hex("sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef", hex));
    CHECK("digest short refused", !reg_digest_hex("sha256:0123", hex));
}

/* ---- tokens ---- */

KILN_TEST(registry_tokens) {
    const char *root = kiln_test_dir();
    char *t1 = NULL, *t2 = NULL, *t3 = NULL;
    CHECK("create publish token", kiln_registry_token_create(root, "ci", KILN_SCOPE_PUBLISH, &t1) == KILN_OK);
    CHECK("create admin token", kiln_registry_token_create(root, "ops", KILN_SCOPE_ADMIN, &t2) == KILN_OK);
    if (!t1 || !t2) return;
    CHECK("tokens differ", strcmp(t1, t2) != 0);
    CHECK("token has 32 random bytes", strlen(t1) == 5 + 64);
    kiln_err rc = kiln_registry_token_create(root, "ci", KILN_SCOPE_READ, &t3);
    CHECK("a name in use is a conflict", rc == KILN_ERR_CONFLICT && !t3);
    CHECK("the message names the token", strstr(kiln_errmsg(), "'ci'") != NULL);
    CHECK("a bad token name is refused", kiln_registry_token_create(root, "../x", KILN_SCOPE_READ, &t3) == KILN_ERR_USAGE);

    sqlite3 *db;
    if (!CHECK("db opens", reg_db_open(root, &db) == KILN_OK)) return;
    char *name = NULL;
    unsigned scopes = 0;
    CHECK("lookup finds the token", reg_token_lookup(db, t1, &name, &scopes) == KILN_OK && name && !strcmp(name, "ci"));
    CHECK("publish holds read and publish", scopes == (KILN_SCOPE_READ | KILN_SCOPE_PUBLISH));
    free(name);
    name = NULL;
    CHECK("admin holds every scope", reg_token_lookup(db, t2, &name, &scopes) == KILN_OK &&
                                         scopes == (KILN_SCOPE_READ | KILN_SCOPE_PUBLISH | KILN_SCOPE_PROMOTE |
                                                    KILN_SCOPE_ADMIN));
    free(name);
    name = NULL;
    CHECK("an unknown token is refused", reg_token_lookup(db, "kiln_nope", &name, &scopes) == KILN_ERR_AUTH && !name);
    /* Only the hash is stored: the secret appears nowhere in the database. */
    sqlite3_stmt *st;
    int plain = -1, rows = -1;
    if (sqlite3_prepare_v2(db, "SELECT count(*), sum(hash = ?1) FROM tokens", -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, t1, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW) {
            rows = sqlite3_column_int(st, 0);
            plain = sqlite3_column_int(st, 1);
        }
        sqlite3_finalize(st);
    }
    CHECK("two tokens stored, neither in the clear", rows == 2 && plain == 0);
    int audits = -1;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM audit WHERE action = 'token.create'", -1, &st, NULL) == SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW) audits = sqlite3_column_int(st, 0);
        sqlite3_finalize(st);
    }
    CHECK("each creation wrote one audit row", audits == 2);
    reg_db_close(db);
    free(t1);
    free(t2);
}

/* ---- blobs, fsck, gc ---- */

KILN_TEST(registry_blob_store) {
    const char *root = kiln_test_dir();
    const char data[] = "the archive's bytes";
    char hex[KILN_SHA256_HEX];
    CHECK("blob stored", put_blob(root, data, sizeof data - 1, hex));
    char *path = reg_blob_path(root, hex);
    char *got = NULL;
    size_t len = 0;
    CHECK("blob at blobs/sha256/ab/<hex>", path && strstr(path, "/blobs/sha256/") &&
                                               kiln_read_file(path, 1024, &got, &len) == KILN_OK &&
                                               len == sizeof data - 1 && !memcmp(got, data, len));
    free(got);
    CHECK("storing the same bytes again is fine", put_blob(root, data, sizeof data - 1, hex));

    /* A declared digest or size that differs is refused, and nothing lands. */
    reg_upload u;
    char wrong[KILN_SHA256_HEX];
    memset(wrong, 'a', 64);
    wrong[64] = 0;
    CHECK("upload begins", reg_upload_begin(&u, root) == KILN_OK);
    CHECK("upload writes", reg_upload_write(&u, "xyz", 3) == KILN_OK);
    CHECK("wrong digest refused", reg_upload_check(&u, wrong, 3) == KILN_ERR_VERIFY);
    CHECK("message names both digests", strstr(kiln_errmsg(), "declared") != NULL);
    reg_upload_abort(&u);
    CHECK("upload begins", reg_upload_begin(&u, root) == KILN_OK);
    CHECK("upload writes", reg_upload_write(&u, "xyz", 3) == KILN_OK);
    CHECK("wrong size refused", reg_upload_check(&u, hex, 4) == KILN_ERR_VERIFY);
    reg_upload_abort(&u);
    char *tmp = kiln_path_join(root, "tmp");
    CHECK("no temporaries left", tmp && count_entries(tmp) == 0);
    free(tmp);

    /* fsck: clean with an unreferenced blob; a version whose blob changed is a problem. */
    size_t problems = 99;
    CHECK("fsck clean", kiln_registry_fsck(root, NULL, NULL, NULL, &problems) == KILN_OK && problems == 0);
    sqlite3 *db;
    if (!CHECK("db", reg_db_open(root, &db) == KILN_OK)) return;
    char sql[512];
    snprintf(sql, sizeof sql,
             "INSERT INTO versions VALUES('m', '1', 'sha256:%s', %zu, '{}', 'sig', NULL, NULL, 't', 0)", hex,
             sizeof data - 1);
    CHECK("version row", reg_db_exec(db, sql) == KILN_OK);
    reg_db_close(db);
    CHECK("fsck clean with the version", kiln_registry_fsck(root, NULL, NULL, NULL, &problems) == KILN_OK);
    FILE *f = fopen(path, "r+b");
    if (f) {
        fputc('T', f); /* one byte changed on disk */
        fclose(f);
    }
    CHECK("fsck finds the changed blob",
          kiln_registry_fsck(root, NULL, NULL, NULL, &problems) == KILN_ERR_VERIFY && problems == 1);

    /* gc keeps referenced blobs and removes the rest. */
    char hex2[KILN_SHA256_HEX];
    CHECK("second blob", put_blob(root, "orphan", 6, hex2));
    size_t removed = 0;
    uint64_t bytes = 0;
    CHECK("gc runs", kiln_registry_gc(root, &removed, &bytes) == KILN_OK);
    CHECK("gc removed only the orphan", removed == 1 && bytes == 6 && kiln_path_exists(path));
    char *p2 = reg_blob_path(root, hex2);
    CHECK("the orphan is gone", p2 && !kiln_path_exists(p2));
    free(p2);
    free(path);
}

/* ---- the server ---- */

KILN_TEST(registry_server_auth) {
    const char *root = kiln_test_dir();
    char *pub = NULL, *rd = NULL, *adm = NULL;
    CHECK("tokens", kiln_registry_token_create(root, "pub", KILN_SCOPE_PUBLISH, &pub) == KILN_OK &&
                        kiln_registry_token_create(root, "rd", KILN_SCOPE_READ, &rd) == KILN_OK &&
                        kiln_registry_token_create(root, "adm", KILN_SCOPE_ADMIN, &adm) == KILN_OK);
    kiln_registry_server *s = start(root, NULL, false);
    if (!CHECK("server starts", s) || !pub || !rd || !adm) goto out;
    uint16_t port = kiln_registry_server_port(s);
    CHECK("a port was chosen", port != 0);
    kiln_registry_server *s2 = start(root, NULL, false);
    CHECK("a second server on the same store is refused", !s2 && strstr(kiln_errmsg(), "held by another"));
    kiln_registry_server_stop(s2, 0);
    resp r;
    CHECK("healthz", http(port, "GET", "/healthz", NULL, NULL, NULL, &r) == 200);
    CHECK("open reads", http(port, "GET", "/v1/models", NULL, NULL, NULL, &r) == 200 && strstr(r.body, "\"models\""));
    const char *hdrs[] = {"X-Kiln-Digest: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                          "X-Kiln-Signature: eA==", NULL};
    CHECK("upload without a token: 401", http(port, "PUT", "/v1/models/m/versions/1", NULL, "x", hdrs, &r) == 401);
    CHECK("upload with a bad token: 401", http(port, "PUT", "/v1/models/m/versions/1", "kiln_bad", "x", hdrs, &r) == 401);
    CHECK("upload with a read token: 403", http(port, "PUT", "/v1/models/m/versions/1", rd, "x", hdrs, &r) == 403);
    CHECK("403 names the scope", strstr(r.body, "publish") != NULL);
    CHECK("channel put with a publish token: 403",
          http(port, "PUT", "/v1/models/m/channels/prod", pub, "{}", NULL, &r) == 403);
    CHECK("audit needs admin: 403", http(port, "GET", "/v1/audit", pub, NULL, NULL, &r) == 403);
    CHECK("audit with admin", http(port, "GET", "/v1/audit", adm, NULL, NULL, &r) == 200 && strstr(r.body, "token.create"));
    CHECK("no trust policy refuses uploads", http(port, "PUT", "/v1/models/m/versions/1", pub, "x", hdrs, &r) == 422);
    const char *bad[] = {"/v1/models/..%2Fetc/versions/1", "/v1/models/a%2Fb/versions/1",
                         "/v1/models/m/versions/..%2F..%2Fx", "/v1/models/m'%3B%20DROP%20TABLE%20versions%3B--/versions/1",
                         "/v1/models/m%22x/versions/1", "/v1/models/m/versions/1%20OR%201%3D1", "/v1/models/%2e%2e/versions/1"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++)
        CHECK("a bad name in the path: 400", http(port, "PUT", bad[i], pub, "x", hdrs, &r) == 400 &&
                                                 strstr(r.body, "name"));
    const char *malformed[] = {"/v1/models/a%00b", "/v1/models/a%zz", "/v1/models/a%4", "/v1/a/b/c/d/e/f/g/h/i/j",
                               "/v1/models/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(malformed); i++)
        CHECK("a malformed path: 400", http(port, "GET", malformed[i], NULL, NULL, NULL, &r) == 400);
    CHECK("an encoded slash never changes the route",
          http(port, "GET", "/v1/models/m%2Fversions%2F1", NULL, NULL, NULL, &r) == 400);
    CHECK("versions table survives", http(port, "GET", "/v1/models", NULL, NULL, NULL, &r) == 200);
    CHECK("unknown model: 404", http(port, "GET", "/v1/models/nope", NULL, NULL, NULL, &r) == 404);
    CHECK("unknown route: 404", http(port, "GET", "/v2/x", NULL, NULL, NULL, &r) == 404);
    CHECK("DELETE: 405", http(port, "DELETE", "/v1/models/m/versions/1", adm, NULL, NULL, &r) == 405);
    CHECK("metrics", http(port, "GET", "/metrics", NULL, NULL, NULL, &r) == 200 &&
                         strstr(r.body, "kiln_registry_requests_total{route=\"/v1/models/{model}/versions/{version}\","
                                        "method=\"PUT\",status=\"401\"} 2"));
    kiln_registry_server_stop(s, 1000);
    s = start(root, NULL, true);
    if (!CHECK("server restarts with reads closed", s)) goto out;
    port = kiln_registry_server_port(s);
    CHECK("closed reads: 401 without a token", http(port, "GET", "/v1/models", NULL, NULL, NULL, &r) == 401);
    CHECK("closed reads: a read token", http(port, "GET", "/v1/models", rd, NULL, NULL, &r) == 200);
    CHECK("closed reads: any scope reads", http(port, "GET", "/v1/models", pub, NULL, NULL, &r) == 200);
out:
    kiln_registry_server_stop(s, 1000);
    free(pub);
    free(rd);
    free(adm);
}

KILN_TEST(registry_download_range) {
    const char *root = kiln_test_dir();
    size_t n = 300000;
    unsigned char *data = malloc(n);
    if (!data) return;
    for (size_t i = 0; i < n; i++) data[i] = (unsigned char)(i * 131 + 7);
    char hex[KILN_SHA256_HEX];
    CHECK("blob", put_blob(root, data, n, hex));
    kiln_registry_server *s = start(root, NULL, false);
    if (!CHECK("server", s)) {
        free(data);
        return;
    }
    uint16_t port = kiln_registry_server_port(s);
    char path[128], hdr[64];
    snprintf(path, sizeof path, "/v1/blobs/sha256/%s", hex);
    resp r;
    const char *range[] = {hdr, NULL};
    snprintf(hdr, sizeof hdr, "Range: bytes=10-19");
    CHECK("range: 206", http(port, "GET", path, NULL, NULL, range, &r) == 206 && r.len == 10 && !memcmp(r.body, data + 10, 10));
    snprintf(hdr, sizeof hdr, "Range: bytes=%zu-", n);
    CHECK("range past the end: 416", http(port, "GET", path, NULL, NULL, range, &r) == 416);
    const char *garbage[] = {"Range: bytes=", "Range: bytes=5-2", "Range: bytes=-0", "Range: items=1-2",
                             "Range: bytes=1-2,4-5", "Range: bytes=99999999999999999999999-"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(garbage); i++) {
        const char *g[] = {garbage[i], NULL};
        CHECK("a malformed range: 416", http(port, "GET", path, NULL, NULL, g, &r) == 416);
    }
    snprintf(hdr, sizeof hdr, "Range: bytes=-5");
    CHECK("the last 5 bytes", http(port, "GET", path, NULL, NULL, range, &r) == 206 && r.len == 5 &&
                                  !memcmp(r.body, data + n - 5, 5));
    snprintf(path, sizeof path, "/v1/blobs/sha256/%.60s", hex);
    CHECK("short digest: 400", http(port, "GET", path, NULL, NULL, NULL, &r) == 400);

    /* A partial download resumes from where it stopped. */
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", (unsigned)port);
    kiln_registry_client_opts c = {.url = url, .retries = 0};
    char *partial = kiln_test_write("blob.partial", data, 1000);
    CHECK("resumed download", reg_download(&c, hex, n, partial) == KILN_OK);
    uint8_t h[KILN_SHA256_BYTES];
    char got[KILN_SHA256_HEX];
    CHECK("hash", kiln_sha256_file(partial, h) == KILN_OK);
    kiln_hex(h, sizeof h, got);
    CHECK("resumed bytes are right", !strcmp(got, hex));
    resp m;
    char want[96];
    snprintf(want, sizeof want, "kiln_registry_bytes_served_total %zu", 10 + 5 + (n - 1000));
    /* The server counts a response when it completes, which may trail the client a little. */
    for (int i = 0; i < 100; i++) {
        http(port, "GET", "/metrics", NULL, NULL, NULL, &m);
        if (strstr(m.body, want)) break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK("bytes served counted", strstr(m.body, want) != NULL);
    /* Declared smaller than the blob: the client stops reading there. */
    unlink(partial);
    kiln_err rc = reg_download(&c, hex, n / 2, partial);
    CHECK("more than declared is cut off", rc == KILN_ERR_VERIFY && strstr(kiln_errmsg(), "more than the declared"));
    struct stat sb;
    CHECK("no more than declared was written", stat(partial, &sb) == 0 && (size_t)sb.st_size <= n / 2);
    free(partial);
    kiln_registry_server_stop(s, 1000);
    free(data);
}

/* A tiny fake server: answers one request with a Content-Length it then exceeds. */
typedef struct fake {
    int fd;
    size_t send;
} fake;

static void *fake_serve(void *arg) {
    fake *f = arg;
    int c = accept(f->fd, NULL, NULL);
    if (c < 0) return NULL;
    char buf[4096];
    (void)!read(c, buf, sizeof buf);
    char head[128];
    int hl = snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", f->send);
    (void)!write(c, head, (size_t)hl);
    memset(buf, 'z', sizeof buf);
    for (size_t sent = 0; sent < f->send;) {
        size_t k = f->send - sent < sizeof buf ? f->send - sent : sizeof buf;
        ssize_t w = write(c, buf, k);
        if (w <= 0) break;
        sent += (size_t)w;
    }
    close(c);
    return NULL;
}

KILN_TEST(registry_fake_server_cut_off) {
    signal(SIGPIPE, SIG_IGN);
    fake f = {.fd = socket(AF_INET, SOCK_STREAM, 0), .send = 1 << 20};
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (!CHECK("fake server listens", f.fd >= 0 && bind(f.fd, (struct sockaddr *)&a, sizeof a) == 0 &&
                                          listen(f.fd, 4) == 0 && getsockname(f.fd, (struct sockaddr *)&a, &al) == 0))
        return;
    pthread_t t;
    pthread_create(&t, NULL, fake_serve, &f);
    char url[64], hex[KILN_SHA256_HEX];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    memset(hex, 'a', 64);
    hex[64] = 0;
    kiln_registry_client_opts c = {.url = url, .retries = 0};
    char *partial = kiln_test_path("x.partial");
    kiln_err rc = reg_download(&c, hex, 1000, partial);
    CHECK("a server that sends more than declared is cut off", rc == KILN_ERR_VERIFY);
    CHECK("the message says so", strstr(kiln_errmsg(), "sent more than the declared 1000 bytes") != NULL);
    struct stat sb;
    CHECK("at most the declared size was kept", stat(partial, &sb) == 0 && sb.st_size <= 1000);
    pthread_join(t, NULL);
    close(f.fd);
    free(partial);
}

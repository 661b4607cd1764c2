/* test_registry.c - the registry: names, tokens, the blob store, fsck and gc, and a real
 * server on loopback (ports chosen at runtime) driven over real HTTP. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
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

/* ---- helpers ---- */

/* A server on root (4 workers), or NULL; url gets its address. */
static kiln_registry_server *start(const char *root, const char *trust, bool read_required,
                                   char url[64]) {
    kiln_registry_server *s = NULL;
    rfx_serve(root, trust, read_required, 4, &s, url);
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
    bool ok = reg_upload_write(&u, data, len) == KILN_OK &&
              reg_upload_check(&u, hex, len) == KILN_OK && reg_upload_commit(&u, hex) == KILN_OK;
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
    const char *bad[] = {
        "",        "../x",
        "a/b",     "a..b",
        ".hidden", "-x",
        "Upper",   "a'b",
        "a\"b",    "x;DROP TABLE versions",
        "a b",     "a%2fb",
        "a\\b",    "a123456789012345678901234567890123456789012345678901234567890123456789"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        kiln_err rc = kiln_registry_check_name("model", bad[i]);
        CHECK("a bad name is refused", rc == KILN_ERR_USAGE);
        CHECK("the message names the kind", strstr(kiln_errmsg(), "model name") != NULL);
    }
    CHECK("versions allow upper case and +",
          kiln_registry_check_version("1.0.0+Build-7") == KILN_OK);
    CHECK("versions refuse ..", kiln_registry_check_version("1..0") == KILN_ERR_USAGE);
    CHECK("versions refuse /", kiln_registry_check_version("1/0") == KILN_ERR_USAGE);
    CHECK("versions refuse a leading dot", kiln_registry_check_version(".1") == KILN_ERR_USAGE);
    char hex[KILN_SHA256_HEX];
    CHECK("digest form",
          reg_digest_hex("sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                         hex));
    CHECK("digest upper case refused",
          !reg_digest_hex("sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
                          hex));
    CHECK("digest short refused", !reg_digest_hex("sha256:0123", hex));
}

/* ---- tokens ---- */

KILN_TEST(registry_tokens) {
    const char *root = kiln_test_dir();
    char *t1 = NULL, *t2 = NULL, *t3 = NULL;
    CHECK("create publish token",
          kiln_registry_token_create(root, "ci", KILN_SCOPE_PUBLISH, &t1) == KILN_OK);
    CHECK("create admin token",
          kiln_registry_token_create(root, "ops", KILN_SCOPE_ADMIN, &t2) == KILN_OK);
    if (!t1 || !t2) return;
    CHECK("tokens differ", strcmp(t1, t2) != 0);
    CHECK("token has 32 random bytes", strlen(t1) == 5 + 64);
    kiln_err rc = kiln_registry_token_create(root, "ci", KILN_SCOPE_READ, &t3);
    CHECK("a name in use is a conflict", rc == KILN_ERR_CONFLICT && !t3);
    CHECK("the message names the token", strstr(kiln_errmsg(), "'ci'") != NULL);
    CHECK("a bad token name is refused",
          kiln_registry_token_create(root, "../x", KILN_SCOPE_READ, &t3) == KILN_ERR_USAGE);

    sqlite3 *db;
    if (!CHECK("db opens", reg_db_open(root, &db) == KILN_OK)) return;
    char *name = NULL;
    unsigned scopes = 0;
    CHECK("lookup finds the token",
          reg_token_lookup(db, t1, kiln_unix_time(), &name, &scopes, NULL) == KILN_OK && name && !strcmp(name, "ci"));
    CHECK("publish holds read and publish", scopes == (KILN_SCOPE_READ | KILN_SCOPE_PUBLISH));
    free(name);
    name = NULL;
    CHECK("admin holds every scope", reg_token_lookup(db, t2, kiln_unix_time(), &name, &scopes, NULL) == KILN_OK &&
                                         scopes == (KILN_SCOPE_READ | KILN_SCOPE_PUBLISH |
                                                    KILN_SCOPE_PROMOTE | KILN_SCOPE_ADMIN));
    free(name);
    name = NULL;
    CHECK("an unknown token is refused",
          reg_token_lookup(db, "kiln_nope", kiln_unix_time(), &name, &scopes, NULL) == KILN_ERR_AUTH && !name);
    /* Only the hash is stored: the secret appears nowhere in the database. */
    sqlite3_stmt *st;
    int plain = -1, rows = -1;
    if (sqlite3_prepare_v2(db, "SELECT count(*), sum(hash = ?1) FROM tokens", -1, &st, NULL) ==
        SQLITE_OK) {
        sqlite3_bind_text(st, 1, t1, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW) {
            rows = sqlite3_column_int(st, 0);
            plain = sqlite3_column_int(st, 1);
        }
        sqlite3_finalize(st);
    }
    CHECK("two tokens stored, neither in the clear", rows == 2 && plain == 0);
    int audits = -1;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM audit WHERE action = 'token.create'", -1, &st,
                           NULL) == SQLITE_OK) {
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
    CHECK("fsck clean",
          kiln_registry_fsck(root, NULL, NULL, NULL, &problems) == KILN_OK && problems == 0);
    sqlite3 *db;
    if (!CHECK("db", reg_db_open(root, &db) == KILN_OK)) return;
    char sql[512];
    snprintf(
        sql, sizeof sql,
        "INSERT INTO versions VALUES('m', '1', 'sha256:%s', %zu, '{}', 'sig', NULL, NULL, 't', 0, NULL)",
        hex, sizeof data - 1);
    CHECK("version row", reg_db_exec(db, sql) == KILN_OK);
    reg_db_close(db);
    CHECK("fsck clean with the version",
          kiln_registry_fsck(root, NULL, NULL, NULL, &problems) == KILN_OK);
    FILE *f = fopen(path, "r+b");
    if (f) {
        fputc('T', f); /* one byte changed on disk */
        fclose(f);
    }
    CHECK("fsck finds the changed blob",
          kiln_registry_fsck(root, NULL, NULL, NULL, &problems) == KILN_ERR_VERIFY &&
              problems == 1);

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

/* A dataset's blob (kiln data publish) is referenced by its row in datasets, not by any
 * version: gc keeps it, and removes an orphan beside it. */
KILN_TEST(registry_gc_keeps_datasets) {
    const char *root = kiln_test_dir();
    char hex[KILN_SHA256_HEX], orphan[KILN_SHA256_HEX];
    if (!CHECK("blobs", put_blob(root, "dataset bytes", 13, hex) &&
                            put_blob(root, "orphan", 6, orphan)))
        return;
    sqlite3 *db;
    if (!CHECK("db", reg_db_open(root, &db) == KILN_OK)) return;
    char digest[80];
    snprintf(digest, sizeof digest, "sha256:%s", hex);
    reg_dataset_row row = {.name = "market", .digest = digest, .size = 13, .sig = "sig",
                           .sig_len = 3, .publisher = "ci", .created = 1};
    bool existed = true;
    CHECK("dataset row", reg_dataset_insert(db, &row, &existed) == KILN_OK && !existed);
    CHECK("the same row again is held", reg_dataset_insert(db, &row, &existed) == KILN_OK && existed);
    reg_db_close(db);
    size_t removed = 0;
    uint64_t bytes = 0;
    CHECK("gc runs", kiln_registry_gc(root, &removed, &bytes) == KILN_OK);
    char *p = reg_blob_path(root, hex), *q = reg_blob_path(root, orphan);
    CHECK("gc kept the dataset's blob", p && kiln_path_exists(p));
    CHECK("gc removed the orphan", removed == 1 && q && !kiln_path_exists(q));
    free(p);
    free(q);
}

/* fsck and gc only look at a store: a path that is not one (a typo, an empty directory, a
 * database that is not the registry's) is refused by name and left exactly as it was. */
KILN_TEST(registry_fsck_gc_refuse_what_is_not_a_store) {
    char *none = kiln_test_path("no-store"), *empty = kiln_test_path("empty-store"),
         *file = kiln_test_write("a-file", "x", 1), *junk = kiln_test_path("junk-store"),
         *junk_db = kiln_path_join(junk, "registry.db"), *blank = kiln_test_path("blank-store"),
         *blank_db = kiln_path_join(blank, "registry.db");
    if (!CHECK("setup", none && empty && file && junk_db && blank_db &&
                            kiln_mkdir_p(empty) == KILN_OK && kiln_mkdir_p(junk) == KILN_OK &&
                            kiln_write_file_atomic(junk_db, "not sqlite at all, not at all", 29) ==
                                KILN_OK &&
                            kiln_mkdir_p(blank) == KILN_OK &&
                            kiln_write_file_atomic(blank_db, "", 0) == KILN_OK))
        goto out;
    struct {
        const char *root, *what, *says;
        int entries; /* what the directory holds, before and after; -1 none, -2 a file */
    } cases[] = {
        {none, "a missing directory", "no registry store there", -1},
        {file, "a file", "is not a directory", -2},
        {empty, "an empty directory", "holds no registry (no registry.db)", 0},
        {junk, "a registry.db that is not SQLite", "not a registry database", 1},
        {blank, "an empty registry.db", "lacks the registry's tables", 1},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        size_t problems = 0, removed = 0;
        uint64_t bytes = 0;
        char label[128];
        kiln_err rc = kiln_registry_fsck(cases[i].root, NULL, NULL, NULL, &problems);
        snprintf(label, sizeof label, "fsck refuses %s, naming it", cases[i].what);
        CHECK(label, rc != KILN_OK && rc != KILN_ERR_VERIFY &&
                         strstr(kiln_errmsg(), cases[i].root) &&
                         strstr(kiln_errmsg(), cases[i].says));
        rc = kiln_registry_gc(cases[i].root, &removed, &bytes);
        snprintf(label, sizeof label, "gc refuses %s, naming it", cases[i].what);
        CHECK(label, rc != KILN_OK && strstr(kiln_errmsg(), cases[i].root) &&
                         strstr(kiln_errmsg(), cases[i].says) && removed == 0);
        snprintf(label, sizeof label, "%s is left as it was", cases[i].what);
        struct stat sb;
        bool there = stat(cases[i].root, &sb) == 0;
        CHECK(label, cases[i].entries == -1   ? !there
                     : cases[i].entries == -2 ? there && S_ISREG(sb.st_mode) && sb.st_size == 1
                                              : there && count_entries(cases[i].root) ==
                                                             (size_t)cases[i].entries);
    }
    char *blob = NULL;
    size_t len = 0;
    CHECK("the empty registry.db is still empty",
          kiln_read_file(blank_db, 1 << 10, &blob, &len) == KILN_OK && len == 0);
    free(blob);
out:
    free(none), free(empty), free(file), free(junk), free(junk_db), free(blank), free(blank_db);
}

/* ---- the server ---- */

KILN_TEST(registry_server_auth) {
    const char *root = kiln_test_dir();
    char *pub = NULL, *rd = NULL, *adm = NULL, url[64], url2[64];
    rfx_resp r = {0};
    CHECK("tokens", kiln_registry_token_create(root, "pub", KILN_SCOPE_PUBLISH, &pub) == KILN_OK &&
                        kiln_registry_token_create(root, "rd", KILN_SCOPE_READ, &rd) == KILN_OK &&
                        kiln_registry_token_create(root, "adm", KILN_SCOPE_ADMIN, &adm) == KILN_OK);
    kiln_registry_server *s = start(root, NULL, false, url);
    if (!CHECK("server starts", s) || !pub || !rd || !adm) goto out;
    uint16_t port = kiln_registry_server_port(s);
    CHECK("a port was chosen", port != 0);
    kiln_registry_server *s2 = start(root, NULL, false, url2);
    CHECK("a second server on the same store is refused",
          !s2 && strstr(kiln_errmsg(), "held by another"));
    kiln_registry_server_stop(s2, 0);
    CHECK("healthz", rfx_http(url, "GET", "/healthz", NULL, NULL, NULL, &r) == 200);
    CHECK("open reads", rfx_http(url, "GET", "/v1/models", NULL, NULL, NULL, &r) == 200 &&
                            strstr(r.body, "\"models\""));
    const char *hdrs[] = {
        "X-Kiln-Digest: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "X-Kiln-Signature: eA==", NULL};
    CHECK("upload without a token: 401",
          rfx_http(url, "PUT", "/v1/models/m/versions/1", NULL, "x", hdrs, &r) == 401);
    CHECK("upload with a bad token: 401",
          rfx_http(url, "PUT", "/v1/models/m/versions/1", "kiln_bad", "x", hdrs, &r) == 401);
    CHECK("upload with a read token: 403",
          rfx_http(url, "PUT", "/v1/models/m/versions/1", rd, "x", hdrs, &r) == 403);
    CHECK("403 names the scope", strstr(r.body, "publish") != NULL);
    CHECK("channel put with a publish token: 403",
          rfx_http(url, "PUT", "/v1/models/m/channels/prod", pub, "{}", NULL, &r) == 403);
    CHECK("audit needs admin: 403", rfx_http(url, "GET", "/v1/audit", pub, NULL, NULL, &r) == 403);
    CHECK("audit with admin", rfx_http(url, "GET", "/v1/audit", adm, NULL, NULL, &r) == 200 &&
                                  strstr(r.body, "token.create"));
    /* The audit query: filters on the registry's side; numbers are digits that fit. */
    CHECK("audit by action",
          rfx_http(url, "GET", "/v1/audit?action=gc,token.create", adm, NULL, NULL, &r) == 200 &&
              strstr(r.body, "token.create"));
    CHECK("audit by action and a model that has none: no entries",
          rfx_http(url, "GET", "/v1/audit?action=token.create&model=m", adm, NULL, NULL, &r) ==
                  200 &&
              strstr(r.body, "\"entries\":[]"));
    CHECK("audit since a time to come: no entries",
          rfx_http(url, "GET", "/v1/audit?since=99999999999", adm, NULL, NULL, &r) == 200 &&
              strstr(r.body, "\"entries\":[]"));
    const char *bad_audit[] = {"/v1/audit?after=abc",       "/v1/audit?after=-1",
                               "/v1/audit?after=%2B5",      "/v1/audit?limit=0",
                               "/v1/audit?limit=10001",     "/v1/audit?since=1e9",
                               "/v1/audit?model=a%2Fb",     "/v1/audit?action=a%26b",
                               "/v1/audit?action=promote,", "/v1/audit?after=9223372036854775808"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad_audit); i++)
        if (!CHECK("a bad audit query: 400 saying which argument",
                   rfx_http(url, "GET", bad_audit[i], adm, NULL, NULL, &r) == 400 &&
                       (strstr(r.body, "after must") || strstr(r.body, "limit must") ||
                        strstr(r.body, "since must") || strstr(r.body, "model") ||
                        strstr(r.body, "action must"))))
            fprintf(stderr, "    %s: %s\n", bad_audit[i], r.body ? r.body : "");
    CHECK("no trust policy refuses uploads",
          rfx_http(url, "PUT", "/v1/models/m/versions/1", pub, "x", hdrs, &r) == 422);
    const char *bad[] = {"/v1/models/..%2Fetc/versions/1",
                         "/v1/models/a%2Fb/versions/1",
                         "/v1/models/m/versions/..%2F..%2Fx",
                         "/v1/models/m'%3B%20DROP%20TABLE%20versions%3B--/versions/1",
                         "/v1/models/m%22x/versions/1",
                         "/v1/models/m/versions/1%20OR%201%3D1",
                         "/v1/models/%2e%2e/versions/1"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++)
        CHECK("a bad name in the path: 400",
              rfx_http(url, "PUT", bad[i], pub, "x", hdrs, &r) == 400 && strstr(r.body, "name"));
    const char *malformed[] = {
        "/v1/models/a%00b", "/v1/models/a%zz", "/v1/models/a%4", "/v1/a/b/c/d/e/f/g/h/i/j",
        "/v1/models/"
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(malformed); i++)
        CHECK("a malformed path: 400",
              rfx_http(url, "GET", malformed[i], NULL, NULL, NULL, &r) == 400);
    CHECK("an encoded slash never changes the route",
          rfx_http(url, "GET", "/v1/models/m%2Fversions%2F1", NULL, NULL, NULL, &r) == 400);
    CHECK("a name that is not UTF-8: 400 with a JSON message",
          rfx_http(url, "GET", "/v1/models/a%FFb", NULL, NULL, NULL, &r) == 400 &&
              strstr(r.body, "{\"error\":\"model name 'a?b'"));
    CHECK("versions table survives",
          rfx_http(url, "GET", "/v1/models", NULL, NULL, NULL, &r) == 200);
    CHECK("unknown model: 404",
          rfx_http(url, "GET", "/v1/models/nope", NULL, NULL, NULL, &r) == 404);
    CHECK("unknown route: 404", rfx_http(url, "GET", "/v2/x", NULL, NULL, NULL, &r) == 404);
    CHECK("DELETE: 405",
          rfx_http(url, "DELETE", "/v1/models/m/versions/1", adm, NULL, NULL, &r) == 405);
    CHECK("metrics",
          rfx_metrics_have(
              url, NULL,
              (const char *[]){
                  "kiln_registry_requests_total{route=\"/v1/models/{model}/versions/{version}\","
                  "method=\"PUT\",status=\"401\"} 2",
                  NULL},
              &r));
    kiln_registry_server_stop(s, 1000);
    s = start(root, NULL, true, url);
    if (!CHECK("server restarts with reads closed", s)) goto out;
    CHECK("closed reads: 401 without a token",
          rfx_http(url, "GET", "/v1/models", NULL, NULL, NULL, &r) == 401);
    CHECK("closed reads: a read token",
          rfx_http(url, "GET", "/v1/models", rd, NULL, NULL, &r) == 200);
    CHECK("closed reads: any scope reads",
          rfx_http(url, "GET", "/v1/models", pub, NULL, NULL, &r) == 200);
out:
    kiln_registry_server_stop(s, 1000);
    rfx_resp_free(&r);
    free(pub);
    free(rd);
    free(adm);
}

KILN_TEST(registry_download_range) {
    const char *root = kiln_test_dir();
    size_t n = 300000;
    unsigned char *data = malloc(n);
    if (!data) return;
    for (size_t i = 0; i < n; i++)
        data[i] = (unsigned char)(i * 131 + 7);
    char hex[KILN_SHA256_HEX];
    CHECK("blob", put_blob(root, data, n, hex));
    char url[64];
    kiln_registry_server *s = start(root, NULL, false, url);
    if (!CHECK("server", s)) {
        free(data);
        return;
    }
    char path[128], hdr[64];
    snprintf(path, sizeof path, "/v1/blobs/sha256/%s", hex);
    rfx_resp r = {0}, m = {0};
    const char *range[] = {hdr, NULL};
    snprintf(hdr, sizeof hdr, "Range: bytes=10-19");
    CHECK("range: 206", rfx_http(url, "GET", path, NULL, NULL, range, &r) == 206 && r.len == 10 &&
                            !memcmp(r.body, data + 10, 10));
    snprintf(hdr, sizeof hdr, "Range: bytes=%zu-", n);
    CHECK("range past the end: 416", rfx_http(url, "GET", path, NULL, NULL, range, &r) == 416);
    const char *garbage[] = {"Range: bytes=",        "Range: bytes=5-2",
                             "Range: bytes=-0",      "Range: items=1-2",
                             "Range: bytes=1-2,4-5", "Range: bytes=99999999999999999999999-",
                             "Range: bytes=+1-2",    "Range: bytes=1--2",
                             "Range: bytes=- 5"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(garbage); i++) {
        const char *g[] = {garbage[i], NULL};
        CHECK("a malformed range: 416", rfx_http(url, "GET", path, NULL, NULL, g, &r) == 416);
    }
    snprintf(hdr, sizeof hdr, "Range: bytes=10-99999999999999999999999");
    CHECK("an end past any size: to the end",
          rfx_http(url, "GET", path, NULL, NULL, range, &r) == 206 && r.len > 100 &&
              !memcmp(r.body, data + 10, 100));
    snprintf(hdr, sizeof hdr, "Range: bytes=-99999999999999999999999");
    CHECK("a suffix past any size: the whole blob",
          rfx_http(url, "GET", path, NULL, NULL, range, &r) == 206 && r.len > 100 &&
              !memcmp(r.body, data, 100));
    snprintf(hdr, sizeof hdr, "Range: bytes=-5");
    CHECK("the last 5 bytes", rfx_http(url, "GET", path, NULL, NULL, range, &r) == 206 &&
                                  r.len == 5 && !memcmp(r.body, data + n - 5, 5));
    snprintf(path, sizeof path, "/v1/blobs/sha256/%.60s", hex);
    CHECK("short digest: 400", rfx_http(url, "GET", path, NULL, NULL, NULL, &r) == 400);

    /* A partial download resumes from where it stopped. */
    kiln_registry_client_opts c = {.url = url, .retries = 0};
    char *partial = kiln_test_write("blob.partial", data, 1000);
    CHECK("resumed download", reg_download(&c, hex, n, partial) == KILN_OK);
    uint8_t h[KILN_SHA256_BYTES];
    char got[KILN_SHA256_HEX];
    CHECK("hash", kiln_sha256_file(partial, h) == KILN_OK);
    kiln_hex(h, sizeof h, got);
    CHECK("resumed bytes are right", !strcmp(got, hex));
    char want[96];
    snprintf(want, sizeof want, "kiln_registry_bytes_served_total %zu",
             10 + (n - 10) + n + 5 + (n - 1000));
    CHECK("bytes served counted", rfx_metrics_have(url, NULL, (const char *[]){want, NULL}, &m));
    /* Declared smaller than the blob: the client stops reading there. */
    unlink(partial);
    kiln_err rc = reg_download(&c, hex, n / 2, partial);
    CHECK("more than declared is cut off",
          rc == KILN_ERR_VERIFY && strstr(kiln_errmsg(), "more than the declared"));
    CHECK("and what it sent is not kept", !kiln_path_exists(partial));
    free(partial);
    kiln_registry_server_stop(s, 1000);
    rfx_resp_free(&r), rfx_resp_free(&m);
    free(data);
}

/* A tiny fake server: answers one request with a Content-Length it then exceeds. */
typedef struct fake {
    int fd;
    size_t send;
} fake;

static void *fake_serve(void *arg) {
    fake *f = arg;
    char buf[4096];
    int c = rfx_accept(f->fd, buf, sizeof buf);
    if (c < 0) return NULL;
    char head[128];
    int hl =
        snprintf(head, sizeof head,
                 "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", f->send);
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
    fake f = {.send = 1 << 20};
    char url[64], hex[KILN_SHA256_HEX];
    if (!CHECK("fake server listens", rfx_listen(&f.fd, url))) return;
    pthread_t t;
    pthread_create(&t, NULL, fake_serve, &f);
    memset(hex, 'a', 64);
    hex[64] = 0;
    kiln_registry_client_opts c = {.url = url, .retries = 0};
    char *partial = kiln_test_path("x.partial");
    kiln_err rc = reg_download(&c, hex, 1000, partial);
    CHECK("a server that sends more than declared is cut off", rc == KILN_ERR_VERIFY);
    CHECK("the message says so",
          strstr(kiln_errmsg(), "sent more than the declared 1000 bytes") != NULL);
    CHECK("nothing it sent is kept (the bytes of a registry that lies)",
          !kiln_path_exists(partial));
    pthread_join(t, NULL);
    close(f.fd);
    free(partial);
}

/* A stub that answers every request with one status, counting them. */
typedef struct status_stub {
    int status;
    atomic_int asked;
} status_stub;

static bool status_answer(void *ctx, int c, const char *req) {
    status_stub *s = ctx;
    (void)req;
    atomic_fetch_add(&s->asked, 1);
    rfx_stub_answer(c, s->status, "{\"error\":\"x\"}");
    return true;
}

/* A 5xx is retried (the server may be restarting), but not 501 nor 507: a registry whose
 * disk is full will not have room a second later. */
KILN_TEST(registry_client_retries_5xx_but_507) {
    const int statuses[] = {503, 507, 501};
    const int want[] = {4, 1, 1};
    for (size_t i = 0; i < KILN_ARRAY_LEN(statuses); i++) {
        status_stub st = {.status = statuses[i]};
        rfx_stub stub;
        if (!CHECK("stub", rfx_stub_start(&stub, status_answer, &st))) return;
        kiln_registry_client_opts c = {.url = stub.url, .retries = 3, .backoff_ms = 1};
        json_t *j = NULL;
        kiln_err rc = kiln_registry_get_json(&c, "/v1/models", &j);
        char what[64];
        snprintf(what, sizeof what, "HTTP %d: asked %d time(s)", statuses[i], want[i]);
        if (!CHECK(what, rc != KILN_OK && atomic_load(&st.asked) == want[i]))
            fprintf(stderr, "    asked %d times\n", atomic_load(&st.asked));
        json_decref(j);
        rfx_stub_stop(&stub);
    }
}

/* ---- signed archives and channel records (sign/, export/) ---- */

#include <sys/wait.h>

#include "export.h"
#include "sign.h"

/* A registry with a trust policy: a release key, two promote keys, staging (threshold 1)
 * and production (threshold 2); a stranger's key that the policy does not know. The tests
 * on it are about the registry's mechanics, not validation, so their archives are signed
 * as `kiln sign --allow-unvalidated` signs them and the policy accepts that
 * (accept_unvalidated); registry_archive_policy holds validated archives to a strict one. */
typedef struct fixture {
    rfx reg; /* tokens: pub, prom */
    kiln_sign_seckey *rel, *p1, *p2, *stranger;
} fixture;

static bool fx_start(fixture *f) {
    return rfx_start(&f->reg, f->reg.trust);
}

static bool fx_init(fixture *f) {
    memset(f, 0, sizeof *f);
    char r[KILN_SIGN_PUBKEY_B64], a[KILN_SIGN_PUBKEY_B64], b[KILN_SIGN_PUBKEY_B64],
        s[KILN_SIGN_PUBKEY_B64];
    if (!kiln_test_keypair(&f->rel, r) || !kiln_test_keypair(&f->p1, a) ||
        !kiln_test_keypair(&f->p2, b) || !kiln_test_keypair(&f->stranger, s))
        return false;
    char *t = rfx_policy(r, a, b);
    bool ok = t && rfx_init(&f->reg, "reg", t, KILN_SCOPE_PUBLISH | KILN_SCOPE_PROMOTE, 4, false);
    free(t);
    return ok;
}

static void fx_free(fixture *f) {
    rfx_free(&f->reg);
    kiln_sign_seckey_free(f->rel);
    kiln_sign_seckey_free(f->p1);
    kiln_sign_seckey_free(f->p2);
    kiln_sign_seckey_free(f->stranger);
}

static kiln_registry_client_opts fx_client(const fixture *f, const char *token) {
    kiln_registry_client_opts c = {
        .url = f->reg.url, .token = token, .retries = 2, .backoff_ms = 20};
    return c;
}

/* An archive whose weights are the text `content` (a model directory named after it). */
static char *fx_archive(const char *content, const char *version, kiln_sign_seckey *sk,
                        char hex[KILN_SHA256_HEX]) {
    char name[64];
    snprintf(name, sizeof name, "model-%s-%s", version, content);
    return rfx_archive(
        name, content, strlen(content),
        "{\"name\":\"demo\",\"created\":\"2026-03-04T05:06:07Z\",\"lineage\":{\"run_id\":\"r-1\","
        "\"step\":40,\"dataset_sha256\":\"abcd\",\"code_version\":\"0.1.0\",\"metrics\":{}}}",
        version, sk, hex);
}

static kiln_err fx_put(const fixture *f, const char *channel, const char *text) {
    kiln_registry_client_opts c = fx_client(f, f->reg.prom);
    return kiln_registry_put_channel(&c, "demo", channel, text, strlen(text));
}

/* Store a record the way a compromised server would: straight into its database. */
static bool fx_inject(const fixture *f, const char *channel, const char *version, const char *hex,
                      int64_t seq, const char *text) {
    char *sql = kiln_asprintf("INSERT INTO channel_records VALUES('demo', '%s', %lld, '%s', "
                              "'sha256:%s', 0, 'x', ?1, 'evil', 0)",
                              channel, (long long)seq, version, hex);
    bool ok = sql && rfx_sql(f->reg.root, RFX_OPEN, sql, text);
    free(sql);
    return ok;
}

static kiln_err fx_pull(const fixture *f, const char *ref, const char *out) {
    kiln_registry_client_opts c = fx_client(f, NULL);
    kiln_registry_pull_opts p = {
        .ref = ref, .trust = f->reg.trust, .out = out, .state = f->reg.state};
    kiln_registry_pulled res;
    return kiln_registry_pull(&c, &p, &res);
}

static bool file_is(const char *dir, const char *name, const char *want) {
    char *p = kiln_path_join(dir, name), *got = NULL;
    size_t len = 0;
    bool ok = p && kiln_read_file(p, 1 << 20, &got, &len) == KILN_OK && len == strlen(want) &&
              !memcmp(got, want, len);
    free(p);
    free(got);
    return ok;
}

KILN_TEST(registry_publish_promote_pull) {
    fixture f;
    if (!CHECK("fixture", fx_init(&f))) goto out;
    char h1[KILN_SHA256_HEX], h2[KILN_SHA256_HEX], h3[KILN_SHA256_HEX], hs[KILN_SHA256_HEX];
    char *a1 = fx_archive("one", "1.0.0", f.rel, h1), *a2 = fx_archive("two", "1.1.0", f.rel, h2),
         *a3 = fx_archive("other", "1.0.0", f.rel, h3),
         *as = fx_archive("evil", "6.6.6", f.stranger, hs);
    if (!CHECK("archives", a1 && a2 && a3 && as)) goto free_archives;
    kiln_registry_client_opts c = fx_client(&f, f.reg.pub), none = fx_client(&f, NULL),
                              rd = fx_client(&f, f.reg.prom);
    kiln_registry_published pub;
    CHECK("publish without a token: refused",
          kiln_registry_publish(&none, a1, NULL, &pub) == KILN_ERR_AUTH &&
              strstr(kiln_errmsg(), "HTTP 401"));
    CHECK("publish with a promote token: refused",
          kiln_registry_publish(&rd, a1, NULL, &pub) == KILN_ERR_AUTH &&
              strstr(kiln_errmsg(), "HTTP 403"));
    CHECK("publish", kiln_registry_publish(&c, a1, NULL, &pub) == KILN_OK && !pub.existed);
    char want[80];
    snprintf(want, sizeof want, "sha256:%s", h1);
    CHECK("the stored digest is the archive's", !strcmp(pub.digest, want));
    CHECK("the same bytes again: 200",
          kiln_registry_publish(&c, a1, NULL, &pub) == KILN_OK && pub.existed);
    CHECK("other bytes under the same version: 409",
          kiln_registry_publish(&c, a3, NULL, &pub) == KILN_ERR_CONFLICT &&
              strstr(kiln_errmsg(), "HTTP 409"));
    CHECK("signed by a key the policy lacks: refused",
          kiln_registry_publish(&c, as, NULL, &pub) == KILN_ERR_VERIFY &&
              strstr(kiln_errmsg(), "not in the trust policy"));
    CHECK("publish 1.1.0", kiln_registry_publish(&c, a2, NULL, &pub) == KILN_OK);

    kiln_sign_seckey *k1[] = {f.p1, NULL}, *k12[] = {f.p1, f.p2, NULL}, *ks[] = {f.stranger, NULL};
    int64_t later = kiln_unix_time() + 3600;
    char *r1 = rfx_record("staging", "1.0.0", h1, 1, later, "promote", k1);
    CHECK("promote staging seq 1", r1 && fx_put(&f, "staging", r1) == KILN_OK);
    CHECK("the same record again: 409 (seq)", r1 && fx_put(&f, "staging", r1) == KILN_ERR_CONFLICT);
    char *out = kiln_test_path("model");
    CHECK("pull staging",
          fx_pull(&f, "demo@staging", out) == KILN_OK && file_is(out, "model.safetensors", "one"));
    char *r2 = rfx_record("staging", "1.1.0", h2, 2, later, "promote", k1);
    CHECK("promote staging seq 2", r2 && fx_put(&f, "staging", r2) == KILN_OK);
    CHECK("pull replaces the model",
          fx_pull(&f, "demo@staging", out) == KILN_OK && file_is(out, "model.safetensors", "two"));
    char *r3 = rfx_record("staging", "1.0.0", h1, 3, later, "rollback", k1);
    CHECK("rollback seq 3", r3 && fx_put(&f, "staging", r3) == KILN_OK);
    CHECK("pull after rollback",
          fx_pull(&f, "demo@staging", out) == KILN_OK && file_is(out, "model.safetensors", "one"));
    char *skip = rfx_record("staging", "1.1.0", h2, 5, later, "promote", k1);
    CHECK("a seq that skips: refused", skip && fx_put(&f, "staging", skip) == KILN_ERR_CONFLICT);
    char *wrongd = rfx_record("staging", "1.1.0", h1, 4, later, "promote", k1);
    CHECK("a digest the version lacks: refused",
          wrongd && fx_put(&f, "staging", wrongd) == KILN_ERR_VERIFY);
    char *absent = rfx_record("staging", "9.9.9", h1, 4, later, "promote", k1);
    CHECK("a version the registry lacks: refused",
          absent && fx_put(&f, "staging", absent) == KILN_ERR_NOTFOUND);
    char *expired = rfx_record("staging", "1.1.0", h2, 4, kiln_unix_time() - 10, "promote", k1);
    CHECK("an expired record: refused by the server",
          expired && fx_put(&f, "staging", expired) == KILN_ERR_VERIFY);

    /* Threshold 2: one signature, or one by a stranger, is refused by the server. */
    char *p_one = rfx_record("production", "1.1.0", h2, 1, later, "promote", k1),
         *p_str = rfx_record("production", "1.1.0", h2, 1, later, "promote", ks),
         *p_two = rfx_record("production", "1.1.0", h2, 1, later, "promote", k12);
    CHECK("fewer keys than the threshold: server refuses",
          p_one && fx_put(&f, "production", p_one) == KILN_ERR_VERIFY &&
              strstr(kiln_errmsg(), "needs 2"));
    CHECK("an unknown key: server refuses",
          p_str && fx_put(&f, "production", p_str) == KILN_ERR_VERIFY);
    CHECK("two promote keys: accepted", p_two && fx_put(&f, "production", p_two) == KILN_OK);
    char *out2 = kiln_test_path("prod");
    CHECK("pull production", fx_pull(&f, "demo@production", out2) == KILN_OK &&
                                 file_is(out2, "model.safetensors", "two"));
    char *out3 = kiln_test_path("byversion");
    CHECK("pull by version",
          fx_pull(&f, "demo@1.1.0", out3) == KILN_OK && file_is(out3, "model.safetensors", "two"));

    /* The audit log has one row per change. */
    CHECK("audit: 2 publishes, 3 staging records, 1 production",
          rfx_int(f.reg.root, RFX_OPEN,
                  "SELECT count(*) FROM audit WHERE action IN "
                  "('publish','promote','rollback')") == 6);
    size_t problems = 9;
    kiln_registry_server_stop(f.reg.srv, 1000);
    f.reg.srv = NULL;
    CHECK("fsck clean",
          kiln_registry_fsck(f.reg.root, f.reg.trust, NULL, NULL, &problems) == KILN_OK &&
              problems == 0);
    free(r1), free(r2), free(r3), free(skip), free(wrongd), free(absent), free(expired);
    free(p_one), free(p_str), free(p_two);
    free(out), free(out2), free(out3);
free_archives:
    free(a1), free(a2), free(a3), free(as);
out:
    fx_free(&f);
}

/* A server that lies: it serves records and bytes it should not. Pull refuses each, and
 * leaves the model directory as it was. */
KILN_TEST(registry_pull_refuses_lies) {
    fixture f;
    if (!CHECK("fixture", fx_init(&f))) goto out;
    char h1[KILN_SHA256_HEX], h2[KILN_SHA256_HEX];
    char *a1 = fx_archive("one", "1.0.0", f.rel, h1), *a2 = fx_archive("two", "2.0.0", f.rel, h2);
    kiln_registry_client_opts c = fx_client(&f, f.reg.pub);
    kiln_registry_published pub;
    if (!CHECK("publish", a1 && a2 && kiln_registry_publish(&c, a1, NULL, &pub) == KILN_OK &&
                              kiln_registry_publish(&c, a2, NULL, &pub) == KILN_OK))
        goto free_archives;
    kiln_sign_seckey *k1[] = {f.p1, NULL}, *ks[] = {f.stranger, NULL};
    int64_t later = kiln_unix_time() + 3600;
    char *r1 = rfx_record("staging", "1.0.0", h1, 1, later, "promote", k1),
         *r2 = rfx_record("staging", "2.0.0", h2, 2, later, "promote", k1);
    char *out = kiln_test_path("model");
    CHECK("seq 1 and 2",
          r1 && r2 && fx_put(&f, "staging", r1) == KILN_OK && fx_put(&f, "staging", r2) == KILN_OK);
    CHECK("pull at seq 2",
          fx_pull(&f, "demo@staging", out) == KILN_OK && file_is(out, "model.safetensors", "two"));

    /* Replay: the server drops seq 2 and serves seq 1 again. */
    sqlite3 *db;
    if (reg_db_open(f.reg.root, &db) == KILN_OK) {
        (void)reg_db_exec(db, "DELETE FROM channel_records WHERE seq = 2");
        reg_db_close(db);
    }
    kiln_err rc = fx_pull(&f, "demo@staging", out);
    CHECK("a replayed older record is refused",
          rc == KILN_ERR_VERIFY && strstr(kiln_errmsg(), "lower than 2"));
    CHECK("the model stays as it was", file_is(out, "model.safetensors", "two"));

    /* Expired: signed properly, but out of date. */
    char *ex = rfx_record("staging", "2.0.0", h2, 3, kiln_unix_time() - 5, "promote", k1);
    CHECK("inject expired", ex && fx_inject(&f, "staging", "2.0.0", h2, 3, ex));
    rc = fx_pull(&f, "demo@staging", out);
    CHECK("an expired record is refused",
          rc == KILN_ERR_VERIFY && strstr(kiln_errmsg(), "expired"));

    /* Signed by a stranger; and fewer keys than the threshold. */
    char *st = rfx_record("staging", "2.0.0", h2, 4, later, "promote", ks);
    CHECK("inject stranger's", st && fx_inject(&f, "staging", "2.0.0", h2, 4, st));
    rc = fx_pull(&f, "demo@staging", out);
    CHECK("a record by an unknown key is refused",
          rc == KILN_ERR_VERIFY && strstr(kiln_errmsg(), "channel record"));
    char *one = rfx_record("production", "2.0.0", h2, 1, later, "promote", k1);
    CHECK("inject under-signed", one && fx_inject(&f, "production", "2.0.0", h2, 1, one));
    char *out2 = kiln_test_path("prod");
    rc = fx_pull(&f, "demo@production", out2);
    CHECK("fewer keys than the threshold is refused",
          rc == KILN_ERR_VERIFY && strstr(kiln_errmsg(), "needs 2"));
    CHECK("nothing at the refused pull's directory", !kiln_path_exists(out2));

    /* Tampered: one byte of the blob changed on the server's disk. */
    char *blob = reg_blob_path(f.reg.root, h1);
    CHECK("flip a byte of the blob", blob && kiln_test_flip(blob, 100));
    char *out3 = kiln_test_path("v1");
    rc = fx_pull(&f, "demo@1.0.0", out3);
    CHECK("a tampered blob is refused",
          rc == KILN_ERR_VERIFY && strstr(kiln_errmsg(), "hashes to"));
    CHECK("nothing at its directory", !kiln_path_exists(out3));
    size_t problems = 0;
    kiln_registry_server_stop(f.reg.srv, 1000);
    f.reg.srv = NULL;
    CHECK("fsck sees the tampered blob and the bad records",
          kiln_registry_fsck(f.reg.root, f.reg.trust, NULL, NULL, &problems) == KILN_ERR_VERIFY &&
              problems == 4);
    free(blob), free(r1), free(r2), free(ex), free(st), free(one), free(out), free(out2),
        free(out3);
free_archives:
    free(a1), free(a2);
out:
    fx_free(&f);
}

KILN_TEST(registry_sigkill_mid_upload) {
    fixture f;
    if (!CHECK("fixture", fx_init(&f))) goto out;
    char hex[KILN_SHA256_HEX];
    char *a = fx_archive("killed", "1.0.0", f.rel, hex);
    kiln_registry_server_stop(f.reg.srv, 1000);
    f.reg.srv = NULL;
    if (!CHECK("archive", a)) goto out;
    int ready[2];
    if (!CHECK("pipe", pipe(ready) == 0)) goto free_a;
    pid_t pid = fork();
    if (pid == 0) { /* the server, in a process of its own */
        close(ready[0]);
        kiln_registry_server_opts o = {
            .root = f.reg.root, .listen = "127.0.0.1:0", .trust = f.reg.trust, .threads = 2};
        kiln_registry_server *s;
        uint16_t port = 0;
        if (kiln_registry_server_start(&o, &s) == KILN_OK) port = kiln_registry_server_port(s);
        (void)!write(ready[1], &port, sizeof port);
        for (;;)
            pause();
    }
    close(ready[1]);
    uint16_t port = 0;
    (void)!read(ready[0], &port, sizeof port);
    close(ready[0]);
    CHECK("the child serves", port != 0);
    /* Half an upload, by hand: headers, then half the body, then the server dies. */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char *sig = NULL, *sigp = kiln_asprintf("%s.minisig", a), *body = NULL;
    size_t sig_len = 0, body_len = 0;
    if (sigp && kiln_read_file(sigp, 1 << 16, &sig, &sig_len) == KILN_OK &&
        kiln_read_file(a, 1 << 24, &body, &body_len) == KILN_OK &&
        connect(s, (struct sockaddr *)&sa, sizeof sa) == 0) {
        char b64[8192], head[10000];
        sodium_bin2base64(b64, sizeof b64, (unsigned char *)sig, sig_len,
                          sodium_base64_VARIANT_ORIGINAL);
        int hl = snprintf(
            head, sizeof head,
            "PUT /v1/models/demo/versions/1.0.0 HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: "
            "Bearer %s\r\n"
            "Content-Length: %zu\r\nX-Kiln-Digest: sha256:%s\r\nX-Kiln-Signature: %s\r\n\r\n",
            f.reg.pub, body_len, hex, b64);
        (void)!write(s, head, (size_t)hl);
        (void)!write(s, body, body_len / 2);
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(s);
    /* Nothing visible, nothing left over. */
    CHECK("no version is visible",
          rfx_int(f.reg.root, RFX_OPEN, "SELECT count(*) FROM versions") == 0);
    size_t problems = 9;
    CHECK("fsck is clean",
          kiln_registry_fsck(f.reg.root, f.reg.trust, NULL, NULL, &problems) == KILN_OK &&
              problems == 0);
    char *tmp = kiln_path_join(f.reg.root, "tmp");
    CHECK("no temporaries", tmp && count_entries(tmp) == 0);
    free(tmp);
    /* And the upload then succeeds. */
    CHECK("restart", fx_start(&f));
    kiln_registry_client_opts c = fx_client(&f, f.reg.pub);
    kiln_registry_published pub;
    CHECK("the upload succeeds",
          kiln_registry_publish(&c, a, NULL, &pub) == KILN_OK && !pub.existed);
    free(sig), free(sigp), free(body);
free_a:
    free(a);
out:
    fx_free(&f);
}

/* One client address holding many idle connections (a slow-loris: request heads never
 * finished) gets per_ip_connections of them, the rest closed at once, and a client from
 * another address is still answered. The 127.0.0.0/8 block is all loopback on Linux, so
 * 127.0.0.2 is another client address here. */
/* A server stopped while its workers run their event loops, over and over: libmicrohttpd's
 * MHD_quiesce_daemon on an epoll daemon with worker threads races the workers' own removal of
 * the listen socket from their epoll sets and aborts the process ("Failed to remove listen FD
 * from epoll set", an open libmicrohttpd defect; seen once in the ASan suite). The server no
 * longer quiesces: a stop refuses new connections in its accept policy instead. */
typedef struct hammer {
    char url[64];
    atomic_int stop;
    int answered;
} hammer;

static void *hammer_main(void *arg) {
    hammer *h = arg;
    while (!atomic_load(&h->stop)) {
        rfx_resp r = {0};
        if (rfx_http(h->url, "GET", "/healthz", NULL, NULL, NULL, &r) == 200) h->answered++;
        rfx_resp_free(&r);
    }
    return NULL;
}

KILN_TEST(registry_server_stops_cleanly_under_load) {
    char root[1024];
    snprintf(root, sizeof root, "%s/reg", kiln_test_dir());
    int stops = 0, answered = 0;
    for (int i = 0; i < 60; i++) {
        kiln_registry_server_opts o = {.root = root, .listen = "127.0.0.1:0", .threads = 4};
        kiln_registry_server *srv = NULL;
        if (kiln_registry_server_start(&o, &srv) != KILN_OK) break;
        hammer h[3];
        pthread_t t[3];
        for (int k = 0; k < 3; k++) {
            memset(&h[k], 0, sizeof h[k]);
            snprintf(h[k].url, sizeof h[k].url, "http://127.0.0.1:%u",
                     (unsigned)kiln_registry_server_port(srv));
            pthread_create(&t[k], NULL, hammer_main, &h[k]);
        }
        struct timespec ts = {0, (long)(1 + i % 5) * 1000 * 1000};
        nanosleep(&ts, NULL);
        kiln_registry_server_stop(srv, i % 2 ? 0 : 5); /* requests in flight */
        for (int k = 0; k < 3; k++) {
            atomic_store(&h[k].stop, 1);
            pthread_join(t[k], NULL);
            answered += h[k].answered;
        }
        stops++;
    }
    CHECK("60 servers stopped while answering", stops == 60 && answered > 0);
}

KILN_TEST(registry_per_ip_connection_limit) {
    char root[1024];
    snprintf(root, sizeof root, "%s/reg", kiln_test_dir());
    kiln_registry_server_opts o = {.root = root,
                                   .listen = "127.0.0.1:0",
                                   .threads = 2,
                                   .max_connections = 64,
                                   .per_ip_connections = 4};
    kiln_registry_server *srv = NULL;
    if (!CHECK("serves", kiln_registry_server_start(&o, &srv) == KILN_OK)) return;
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", (unsigned)kiln_registry_server_port(srv));
    enum { N = 20 };
    int fds[N];
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(kiln_registry_server_port(srv))},
                       from = {.sin_family = AF_INET};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    inet_pton(AF_INET, "127.0.0.2", &from.sin_addr);
    int made = 0;
    const char *head = "GET /v1/models HTTP/1.1\r\nHost: x\r\n"; /* never finished */
    for (int i = 0; i < N; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fds[i] >= 0 && bind(fds[i], (struct sockaddr *)&from, sizeof from) == 0 &&
            connect(fds[i], (struct sockaddr *)&to, sizeof to) == 0 &&
            send(fds[i], head, strlen(head), MSG_NOSIGNAL) == (ssize_t)strlen(head))
            made++;
    }
    CHECK("20 connections from 127.0.0.2, each a request head begun", made == N);
    /* Those past the limit are closed by the server: a read sees the end. */
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
    int open = 0;
    for (int i = 0; i < N; i++) {
        char b;
        ssize_t r = recv(fds[i], &b, 1, MSG_DONTWAIT);
        open += r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
    if (!CHECK("4 kept open, 16 closed", open == 4)) fprintf(stderr, "    open: %d\n", open);
    rfx_resp r = {0};
    CHECK("another address is answered", rfx_http(url, "GET", "/healthz", NULL, NULL, NULL, &r) == 200);
    rfx_resp_free(&r);
    for (int i = 0; i < N; i++)
        if (fds[i] >= 0) close(fds[i]);
    kiln_registry_server_stop(srv, 1000);
}

typedef struct worker {
    const fixture *f;
    const char *archive;
    char ref[32];
    char out[1024], state[1024];
    kiln_err rc;
} worker;

static void *do_publish(void *arg) {
    worker *w = arg;
    kiln_registry_client_opts c = fx_client(w->f, w->f->reg.pub);
    kiln_registry_published pub;
    w->rc = kiln_registry_publish(&c, w->archive, NULL, &pub);
    return NULL;
}

static void *do_pull(void *arg) {
    worker *w = arg;
    kiln_registry_client_opts c = fx_client(w->f, NULL);
    kiln_registry_pull_opts p = {
        .ref = w->ref, .trust = w->f->reg.trust, .out = w->out, .state = w->state};
    kiln_registry_pulled res;
    w->rc = kiln_registry_pull(&c, &p, &res);
    return NULL;
}

KILN_TEST(registry_concurrent_pulls_and_publishes) {
    enum { PULLS = 32, PUBS = 4 };
    fixture f;
    if (!CHECK("fixture", fx_init(&f))) goto out;
    /* Weights of about 1 MiB so that transfers overlap. */
    size_t n = kiln_test_sanitized() ? 256 * 1024 : 1024 * 1024;
    char *big = malloc(n + 1);
    if (!big) goto out;
    for (size_t i = 0; i < n; i++)
        big[i] = (char)('a' + (i * 7919) % 26);
    big[n] = 0;
    char h[KILN_SHA256_HEX], hv[PUBS][KILN_SHA256_HEX];
    char *base = fx_archive(big, "1.0.0", f.rel, h), *pubs[PUBS] = {0};
    kiln_registry_client_opts c = fx_client(&f, f.reg.pub);
    kiln_registry_published pub;
    kiln_sign_seckey *k1[] = {f.p1, NULL};
    char *rec = rfx_record("staging", "1.0.0", h, 1, kiln_unix_time() + 3600, "promote", k1);
    if (!CHECK("base published and promoted",
               base && rec && kiln_registry_publish(&c, base, NULL, &pub) == KILN_OK &&
                   fx_put(&f, "staging", rec) == KILN_OK))
        goto done;
    for (int i = 0; i < PUBS; i++) {
        char v[16], content[32];
        snprintf(v, sizeof v, "2.0.%d", i);
        snprintf(content, sizeof content, "publish-%d", i);
        pubs[i] = fx_archive(content, v, f.rel, hv[i]);
    }
    static worker w[PULLS + PUBS];
    pthread_t t[PULLS + PUBS];
    for (int i = 0; i < PULLS + PUBS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].f = &f;
        w[i].rc = KILN_ERR_INTERNAL;
        if (i < PULLS) {
            snprintf(w[i].ref, sizeof w[i].ref, "%s", i % 2 ? "demo@staging" : "demo@1.0.0");
            snprintf(w[i].out, sizeof w[i].out, "%s/pull-%d", kiln_test_dir(), i);
            snprintf(w[i].state, sizeof w[i].state, "%s/state-%d", kiln_test_dir(), i % 8);
            pthread_create(&t[i], NULL, do_pull, &w[i]);
        } else {
            w[i].archive = pubs[i - PULLS];
            pthread_create(&t[i], NULL, do_publish, &w[i]);
        }
    }
    int ok_pulls = 0, ok_pubs = 0, right = 0;
    for (int i = 0; i < PULLS + PUBS; i++) {
        pthread_join(t[i], NULL);
        if (w[i].rc != KILN_OK) continue;
        if (i < PULLS) {
            ok_pulls++;
            right += file_is(w[i].out, "model.safetensors", big);
        } else {
            ok_pubs++;
        }
    }
    CHECK("32 concurrent pulls succeed", ok_pulls == PULLS);
    CHECK("with the right bytes", right == PULLS);
    CHECK("4 concurrent publishes succeed", ok_pubs == PUBS);
    json_t *m = NULL;
    kiln_registry_client_opts rc = fx_client(&f, NULL);
    CHECK("5 versions listed", kiln_registry_get_json(&rc, "/v1/models/demo", &m) == KILN_OK &&
                                   json_array_size(json_object_get(m, "versions")) == 5);
    json_decref(m);
done:
    for (int i = 0; i < PUBS; i++)
        free(pubs[i]);
    free(base);
    free(rec);
    free(big);
out:
    fx_free(&f);
}

/* ---- kiln_watch ---- */

typedef struct updates {
    pthread_mutex_t mu;
    int ok, failed;
    char last_error[512], last_ok[512];
} updates;

static void on_update(void *ctx, kiln_err rc, const char *msg, const kiln_pull_result *r) {
    updates *u = ctx;
    (void)r;
    pthread_mutex_lock(&u->mu);
    if (rc) {
        u->failed++;
        snprintf(u->last_error, sizeof u->last_error, "%s", msg);
    } else {
        u->ok++;
        snprintf(u->last_ok, sizeof u->last_ok, "%s", msg);
    }
    pthread_mutex_unlock(&u->mu);
}

/* An archive of a real model (a vector file) as demo@version. */
static char *fx_model_archive(const char *vector, const char *version, kiln_sign_seckey *sk,
                              char hex[KILN_SHA256_HEX]) {
    char name[64];
    snprintf(name, sizeof name, "vec-%s", version);
    return rfx_vector_archive(name, vector, version, sk, hex);
}

static uint64_t wait_gen(kiln_watch *w, uint64_t want) {
    uint64_t g = 0;
    for (int i = 0; i < 500; i++) {
        const kiln_model *m = kiln_watch_acquire(w, &g);
        kiln_watch_release(w, m);
        if (g >= want) break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return g;
}

/* kiln rollback --trust: the version before comes from the history's records verified on
 * the client; a record the policy does not back is passed over when older and refuses the
 * rollback when it is the newest, where the registry's word would have named its version. */
KILN_TEST(registry_previous_version_verified) {
    fixture f;
    if (!CHECK("fixture", fx_init(&f))) goto out;
    char h1[KILN_SHA256_HEX], h2[KILN_SHA256_HEX], h3[KILN_SHA256_HEX];
    char *a1 = fx_archive("one", "1.0.0", f.rel, h1), *a2 = fx_archive("two", "2.0.0", f.rel, h2),
         *a3 = fx_archive("three", "3.0.0", f.rel, h3);
    kiln_registry_client_opts c = fx_client(&f, f.reg.pub);
    kiln_registry_published pub;
    kiln_sign_seckey *k1[] = {f.p1, NULL}, *ks[] = {f.stranger, NULL};
    int64_t later = kiln_unix_time() + 3600;
    char *r1 = rfx_record("staging", "1.0.0", h1, 1, later, "promote", k1),
         *r2 = rfx_record("staging", "3.0.0", h3, 2, later, "promote", ks),
         *r3 = rfx_record("staging", "2.0.0", h2, 3, later, "promote", k1),
         *r4 = rfx_record("staging", "3.0.0", h3, 4, later, "promote", ks);
    char v[KILN_REGISTRY_NAME_MAX + 1], want[80];
    kiln_digest d;
    if (!CHECK("published; 1.0.0 promoted, then a stranger's record of 3.0.0 stored as a "
               "compromised server would, then 2.0.0 promoted",
               a1 && a2 && a3 && r1 && r2 && r3 && r4 &&
                   kiln_registry_publish(&c, a1, NULL, &pub) == KILN_OK &&
                   kiln_registry_publish(&c, a2, NULL, &pub) == KILN_OK &&
                   kiln_registry_publish(&c, a3, NULL, &pub) == KILN_OK &&
                   fx_put(&f, "staging", r1) == KILN_OK &&
                   fx_inject(&f, "staging", "3.0.0", h3, 2, r2) &&
                   fx_put(&f, "staging", r3) == KILN_OK))
        goto done;
    CHECK("the registry's word: 3.0.0, the stranger's",
          kiln_registry_previous_version(&c, "demo", "staging", v) == KILN_OK &&
              !strcmp(v, "3.0.0"));
    snprintf(want, sizeof want, "sha256:%s", h1);
    CHECK("verified: 1.0.0, its digest pinned",
          kiln_registry_previous_version_verified(&c, "demo", "staging", NULL, f.reg.trust, f.reg.state,
                                                  v, d) == KILN_OK &&
              !strcmp(v, "1.0.0") && !strcmp(d, want));
    CHECK("--to 1.0.0: its verified record's digest",
          kiln_registry_previous_version_verified(&c, "demo", "staging", "1.0.0", f.reg.trust,
                                                  f.reg.state, v, d) == KILN_OK &&
              !strcmp(v, "1.0.0") && !strcmp(d, want));
    CHECK("--to 3.0.0, named only by the stranger's record: refused, no digest vouched for",
          kiln_registry_previous_version_verified(&c, "demo", "staging", "3.0.0", f.reg.trust,
                                                  f.reg.state, v, d) == KILN_ERR_NOTFOUND &&
              kiln_test_msg_has("never pointed at 3.0.0 in a record that verifies", NULL) &&
              !v[0] && !d[0]);
    CHECK("--to the current version: refused",
          kiln_registry_previous_version_verified(&c, "demo", "staging", "2.0.0", f.reg.trust,
                                                  f.reg.state, v, d) == KILN_ERR_USAGE &&
              kiln_test_msg_has("2.0.0 is the current version of demo/staging", NULL) && !v[0]);
    /* Under a policy that withdraws 1.0.0's archive: no place to go back to. */
    char *pol = NULL, *wpol = NULL, *wpath = NULL, *wstate = kiln_test_path("wstate");
    size_t pl = 0;
    if (kiln_read_file(f.reg.trust, 1 << 20, &pol, &pl) == KILN_OK) {
        while (pl && pol[pl - 1] != '}')
            pl--;
        if (pl) pol[pl - 1] = 0;
        wpol = kiln_asprintf("%s,\"withdrawn\":[{\"digest\":\"sha256:%s\",\"reason\":\"leaks\"}]}",
                             pol, h1);
        wpath = wpol ? kiln_test_write("withdrawing.json", wpol, strlen(wpol)) : NULL;
    }
    CHECK("a withdrawn version is passed over (none left to go back to)",
          wpath &&
              kiln_registry_previous_version_verified(&c, "demo", "staging", NULL, wpath, wstate, v,
                                                      d) == KILN_ERR_NOTFOUND &&
              !v[0]);
    CHECK("and --to it is refused, saying why",
          wpath &&
              kiln_registry_previous_version_verified(&c, "demo", "staging", "1.0.0", wpath, wstate,
                                                      v, d) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("demo@1.0.0 is sha256:", "withdrew: leaks") && !v[0]);
    free(pol), free(wpol), free(wpath), free(wstate);
    CHECK("a stranger's record as the newest", fx_inject(&f, "staging", "3.0.0", h3, 4, r4));
    CHECK("refuses: the current record does not verify",
          kiln_registry_previous_version_verified(&c, "demo", "staging", NULL, f.reg.trust, f.reg.state,
                                                  v, d) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("the channel's current record does not verify", NULL) && !v[0]);
done:
    free(a1), free(a2), free(a3), free(r1), free(r2), free(r3), free(r4);
out:
    fx_free(&f);
}

/* A promotion that expects the channel at a seq it has moved past signs and puts nothing
 * (kiln renew's guard against a channel moving between its check and its signature). */
KILN_TEST(registry_promote_expect_seq) {
    fixture f;
    if (!CHECK("fixture", fx_init(&f))) goto out;
    char h[KILN_SHA256_HEX];
    char *a = fx_archive("one", "1.0.0", f.rel, h);
    kiln_registry_client_opts c = fx_client(&f, f.reg.pub), pc = fx_client(&f, f.reg.prom);
    kiln_registry_published pub;
    const kiln_sign_seckey *k1[] = {f.p1};
    kiln_registry_promote_opts o = {
        .model = "demo", .channel = "staging", .version = "1.0.0", .keys = k1, .nkeys = 1};
    kiln_registry_promoted res;
    if (!CHECK("published and promoted twice",
               a && kiln_registry_publish(&c, a, NULL, &pub) == KILN_OK &&
                   kiln_registry_promote(&pc, &o, &res) == KILN_OK &&
                   kiln_registry_promote(&pc, &o, &res) == KILN_OK && res.seq == 2))
        goto done;
    o.expect_seq = 1;
    CHECK("expecting seq 1 at seq 2: refused, naming both",
          kiln_registry_promote(&pc, &o, &res) == KILN_ERR_CONFLICT &&
              kiln_test_msg_has("demo/staging is at seq 2 now, not 1", NULL));
    CHECK("nothing put",
          rfx_int(f.reg.root, RFX_OPEN, "SELECT max(seq) FROM channel_records") == 2);
    o.expect_seq = 2;
    CHECK("expecting seq 2: seq 3",
          kiln_registry_promote(&pc, &o, &res) == KILN_OK && res.seq == 3);
done:
    free(a);
out:
    fx_free(&f);
}

/* What the watch tests follow: 1.0.0 the dense model, 2.0.0 the MoE one and 3.0.0 an archive
 * whose model cannot load, published to f; h their archives' digests (hex). */
static bool fx_publish_three(const fixture *f, char h[3][KILN_SHA256_HEX]) {
    char *a[3] = {fx_model_archive("tsmoe-dense.model.safetensors", "1.0.0", f->rel, h[0]),
                  fx_model_archive("tsmoe-moe.model.safetensors", "2.0.0", f->rel, h[1]),
                  fx_archive("broken", "3.0.0", f->rel, h[2])};
    kiln_registry_client_opts c = fx_client(f, f->reg.pub);
    kiln_registry_published pub;
    bool ok = true;
    for (int i = 0; i < 3; i++) {
        ok = ok && a[i] && kiln_registry_publish(&c, a[i], NULL, &pub) == KILN_OK;
        free(a[i]);
    }
    return ok;
}

KILN_TEST(registry_watch_swaps_verified_models) {
    fixture f;
    updates u = {.mu = PTHREAD_MUTEX_INITIALIZER};
    kiln_watch *w = NULL;
    if (!CHECK("fixture", fx_init(&f))) goto out;
    char h[3][KILN_SHA256_HEX], *h2 = h[1], *h3 = h[2];
    kiln_sign_seckey *k1[] = {f.p1, NULL};
    int64_t later = kiln_unix_time() + 3600;
    const bool published = fx_publish_three(&f, h); /* before the records: their digests */
    char *r1 = rfx_record("staging", "1.0.0", h[0], 1, later, "promote", k1);
    if (!CHECK("published and promoted", published && r1 && fx_put(&f, "staging", r1) == KILN_OK))
        goto done;
    char *dir = kiln_test_path("watch");
    kiln_watch_opts o = rfx_watch_opts(&f.reg, f.reg.trust, dir, on_update, &u);
    if (!CHECK("watch starts with the current version", kiln_watch_start(&o, &w) == KILN_OK)) {
        free(dir);
        goto done;
    }
    uint64_t g = 0;
    const kiln_model *m1 = kiln_watch_acquire(w, &g);
    CHECK("generation 1 is the dense model", g == 1 && kiln_model_config_get(m1)->n_experts == 0);
    char *r2 = rfx_record("staging", "2.0.0", h2, 2, later, "promote", k1);
    CHECK("promote 2.0.0", r2 && fx_put(&f, "staging", r2) == KILN_OK);
    CHECK("the new version is swapped in", wait_gen(w, 2) == 2);
    const kiln_model *m2 = kiln_watch_acquire(w, &g);
    CHECK("generation 2 is the MoE model", g == 2 && kiln_model_config_get(m2)->n_experts > 0);
    CHECK("the old model stays usable while held", kiln_model_config_get(m1)->n_experts == 0);
    kiln_pull_result now, then;
    CHECK("kiln_watch_serving: 2.0.0 now (seq 2), 1.0.0 as generation 1 while it is held",
          kiln_watch_serving(w, 0, &now) == KILN_OK && !strcmp(now.version, "2.0.0") &&
              now.seq == 2 && kiln_watch_serving(w, 1, &then) == KILN_OK &&
              !strcmp(then.version, "1.0.0") && then.seq == 1);
    kiln_watch_release(w, m1);
    CHECK("generation 1 released: no longer known",
          kiln_watch_serving(w, 1, &then) == KILN_ERR_NOTFOUND &&
              kiln_test_msg_has("generation 1 is no longer held", NULL));
    /* Its directory is removed by the watcher's thread, not by the release. */
    char *g1 = kiln_path_join(dir, "gen-1");
    for (int i = 0; i < 200 && g1 && kiln_path_exists(g1); i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK("and its directory removed soon after (by the watcher)", g1 && !kiln_path_exists(g1));
    free(g1);
    char *r3 = rfx_record("staging", "3.0.0", h3, 3, later, "promote", k1);
    CHECK("promote a model that cannot load", r3 && fx_put(&f, "staging", r3) == KILN_OK);
    for (int i = 0; i < 500; i++) {
        pthread_mutex_lock(&u.mu);
        int failed = u.failed;
        pthread_mutex_unlock(&u.mu);
        if (failed) break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&u.mu);
    CHECK("the failed load is reported",
          u.failed >= 1 && u.ok == 1 && strstr(u.last_error, "model.safetensors"));
    CHECK("the swap was said in words (issue 30: an empty message)",
          !strncmp(u.last_ok, "serving demo@2.0.0 (channel staging, seq 2) sha256:", 51));
    pthread_mutex_unlock(&u.mu);
    const kiln_model *m3 = kiln_watch_acquire(w, &g);
    CHECK("the old model stays in service", g == 2 && m3 == m2);
    kiln_watch_release(w, m3);
    kiln_watch_release(w, m2);
    kiln_watch_stop(w);
    free(r2), free(r3), free(dir);
done:
    free(r1);
out:
    fx_free(&f);
}

/* A sample's value in Prometheus text (the line that starts with name and a space or a
 * '{'); NAN when absent. */
static double sample(const char *text, const char *name) {
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, name, n) && (p[n] == ' ' || p[n] == '{')) {
            const char *v = strchr(p + n, ' ');
            return v ? strtod(v + 1, NULL) : NAN;
        }
    return NAN;
}

/* kiln_watch_metrics of w once cond holds of it (10 s at most: a lone registry that does not
 * answer is retried for about 4 s before a poll fails); caller frees. */
static char *metrics_when(kiln_watch *w, bool (*cond)(const char *text)) {
    char *t = NULL;
    for (int i = 0; i < 1000; i++) {
        free(t);
        t = kiln_watch_metrics(w);
        if (t && cond(t)) break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return t;
}

static bool polled(const char *t) {
    return sample(t, "kiln_watch_polls_total") >= 2;
}
static bool swapped(const char *t) {
    return sample(t, "kiln_watch_swaps_total") >= 1;
}
static bool refused(const char *t) {
    return sample(t, "kiln_watch_refused_total") >= 1;
}
static bool unreachable(const char *t) {
    return sample(t, "kiln_watch_poll_failures_in_row") >= 1;
}

/* What a service's watch exports (kiln_watch_metrics, and its metrics_file): the version in
 * service and its record, swaps, refusals and polls that found no registry; a metrics file
 * that cannot be written fails the start, naming it. */
KILN_TEST(registry_watch_metrics) {
    fixture f;
    kiln_watch *w = NULL;
    if (!CHECK("fixture", fx_init(&f))) goto out;
    char h[3][KILN_SHA256_HEX], *h1 = h[0], *h2 = h[1], *h3 = h[2];
    kiln_sign_seckey *k1[] = {f.p1, NULL};
    const int64_t later = kiln_unix_time() + 3600, later2 = later + 60;
    const bool published = fx_publish_three(&f, h); /* before the records: their digests */
    char *r1 = rfx_record("staging", "1.0.0", h1, 1, later, "promote", k1),
         *r2 = rfx_record("staging", "2.0.0", h2, 2, later2, "promote", k1),
         *r3 = rfx_record("staging", "3.0.0", h3, 3, later2, "promote", k1);
    char *dir = kiln_test_path("watch-metrics"), *file = kiln_test_path("svc.prom"), *t = NULL,
         *text = NULL, want[256];
    if (!CHECK("published and promoted",
               published && r1 && r2 && r3 && dir && file && fx_put(&f, "staging", r1) == KILN_OK))
        goto done;
    kiln_watch_opts o = rfx_watch_opts(&f.reg, f.reg.trust, dir, NULL, NULL);
    o.metrics_file = "/nonexistent-kiln-dir/svc.prom";
    CHECK("a metrics file that cannot be written fails the start, naming it",
          kiln_watch_start(&o, &w) != KILN_OK && !w &&
              kiln_test_msg_has("/nonexistent-kiln-dir/svc.prom", NULL));
    o.metrics_file = file;
    if (!CHECK("watch starts", kiln_watch_start(&o, &w) == KILN_OK)) goto done;
    size_t len;
    CHECK("the file is written at the start",
          kiln_read_file(file, 1 << 20, &text, &len) == KILN_OK);
    snprintf(want, sizeof want,
             "kiln_watch_info{model=\"demo\",channel=\"staging\",version=\"1.0.0\",digest=\"sha256:"
             "%s\"} 1\n",
             h1);
    CHECK("it names the version in service", text && strstr(text, want));
    CHECK("generation 1, record seq 1 and its expiry, no swap, served online",
          text && sample(text, "kiln_watch_generation") == 1 &&
              sample(text, "kiln_watch_record_seq") == 1 &&
              sample(text, "kiln_watch_record_expiry_timestamp_seconds") == (double)later &&
              sample(text, "kiln_watch_swaps_total") == 0 &&
              sample(text, "kiln_watch_serving_offline") == 0);
    t = metrics_when(w, polled);
    CHECK("polls go through", t && sample(t, "kiln_watch_poll_failures_total") == 0 &&
                                  sample(t, "kiln_watch_last_poll_success_timestamp_seconds") > 0 &&
                                  sample(t, "kiln_watch_trust_policy_version") >= 1);
    free(t);
    CHECK("promote 2.0.0", fx_put(&f, "staging", r2) == KILN_OK);
    t = metrics_when(w, swapped);
    snprintf(want, sizeof want, "version=\"2.0.0\",digest=\"sha256:%s\"} 1\n", h2);
    CHECK("the swap: 2.0.0, generation 2, seq 2 and its expiry",
          t && strstr(t, want) && sample(t, "kiln_watch_generation") == 2 &&
              sample(t, "kiln_watch_record_seq") == 2 &&
              sample(t, "kiln_watch_record_expiry_timestamp_seconds") == (double)later2);
    free(t);
    CHECK("promote a model that cannot load", fx_put(&f, "staging", r3) == KILN_OK);
    t = metrics_when(w, refused);
    CHECK("refused, and 2.0.0 still in service", t && sample(t, "kiln_watch_refused_total") == 1 &&
                                                     strstr(t, want) &&
                                                     sample(t, "kiln_watch_generation") == 2);
    free(t);
    /* A restart while the channel names the version it refused keeps the model it kept, as a
     * running watch does, and says why. */
    kiln_watch_stop(w);
    w = NULL;
    updates u = {.mu = PTHREAD_MUTEX_INITIALIZER};
    o.on_update = on_update;
    o.ctx = &u;
    if (!CHECK("restarted with the channel on a model that cannot load",
               kiln_watch_start(&o, &w) == KILN_OK))
        goto done;
    t = kiln_watch_metrics(w);
    CHECK("2.0.0 kept in service, the refusal said and counted",
          t && strstr(t, want) && sample(t, "kiln_watch_refused_total") == 1 &&
              sample(t, "kiln_watch_serving_offline") == 0 && u.failed == 1 &&
              strstr(u.last_error, "the channel's current version was refused") &&
              strstr(u.last_error, "serving demo@2.0.0 (staging seq 2"));
    free(t);
    double last_ok = 0;
    t = kiln_watch_metrics(w);
    if (t) last_ok = sample(t, "kiln_watch_last_poll_success_timestamp_seconds");
    free(t);
    kiln_registry_server_stop(f.reg.srv, 0);
    f.reg.srv = NULL;
    t = metrics_when(w, unreachable);
    CHECK("no registry: a poll fails, nothing refused, the last success stays",
          t && sample(t, "kiln_watch_poll_failures_in_row") >= 1 &&
              sample(t, "kiln_watch_refused_total") == 1 &&
              sample(t, "kiln_watch_last_poll_success_timestamp_seconds") <= last_ok + 1);
    free(t);
    free(text);
    text = NULL;
    /* The file follows: it is rewritten after each poll. */
    for (int i = 0; i < 1000; i++) {
        free(text);
        text = NULL;
        if (kiln_read_file(file, 1 << 20, &text, &len) == KILN_OK &&
            sample(text, "kiln_watch_poll_failures_in_row") >= 1)
            break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK("the file too",
          text && strstr(text, want) && sample(text, "kiln_watch_poll_failures_in_row") >= 1);
    kiln_watch_stop(w);
    w = NULL;
    /* Restarted with no registry up: the kept model, said to be served offline. */
    o.metrics_file = NULL;
    if (CHECK("restarted offline", kiln_watch_start(&o, &w) == KILN_OK)) {
        t = kiln_watch_metrics(w);
        CHECK("serving offline, 2.0.0 as kept", t && strstr(t, want) &&
                                                    sample(t, "kiln_watch_serving_offline") == 1 &&
                                                    sample(t, "kiln_watch_polls_total") == 0);
        free(t);
        kiln_watch_stop(w);
    }
done:
    free(text);
    free(dir), free(file);
    free(r1), free(r2), free(r3);
out:
    fx_free(&f);
}

/* Which OUT/gen-N a watch left, as "gen-1 gen-3" (sorted). */
static const char *gens(const char *out, char *buf, size_t cap) {
    buf[0] = 0;
    for (int n = 1; n <= 9; n++) {
        char name[16];
        snprintf(name, sizeof name, "gen-%d", n);
        char *p = kiln_path_join(out, name);
        if (p && kiln_path_exists(p))
            snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s", buf[0] ? " " : "", name);
        free(p);
    }
    return buf;
}

static void quiet(void *ctx, const char *line) {
    (void)ctx, (void)line;
}

/* What the last watch_once served (kiln_watch_serving). */
static kiln_pull_result served;

/* Start a watch; its model's expert count (-1: the start failed) and what on_update heard. */
static int watch_once(const kiln_watch_opts *o, updates *u) {
    kiln_watch *w = NULL;
    memset(u->last_error, 0, sizeof u->last_error);
    memset(&served, 0, sizeof served);
    u->ok = u->failed = 0;
    if (kiln_watch_start(o, &w)) return -1;
    uint64_t g = 0;
    const kiln_model *m = kiln_watch_acquire(w, &g);
    int e = g == 1 && kiln_watch_serving(w, 0, &served) == KILN_OK
                ? kiln_model_config_get(m)->n_experts
                : -2;
    kiln_watch_release(w, m);
    kiln_watch_stop(w);
    return e;
}

/* A service restarted: the model in service at the stop is used again without a download
 * while the channel names it; with no registry answering it is served after being checked
 * again offline, but not once a file changed, the state accepted a newer record since, or the
 * state keeps no evidence; a new record is pulled and the kept directory goes. */
KILN_TEST(registry_watch_starts_from_the_kept_model) {
    fixture f;
    updates u = {.mu = PTHREAD_MUTEX_INITIALIZER};
    char *dir = kiln_test_path("svc"), *a1 = NULL, *a2 = NULL, *r1 = NULL, *r2 = NULL,
         *model = NULL, *state = NULL, *saved = NULL, *cur = NULL, got[128];
    size_t saved_len = 0;
    if (!CHECK("fixture", dir && fx_init(&f))) goto out;
    char h1[KILN_SHA256_HEX], h2[KILN_SHA256_HEX];
    a1 = fx_model_archive("tsmoe-dense.model.safetensors", "1.0.0", f.rel, h1);
    a2 = fx_model_archive("tsmoe-moe.model.safetensors", "2.0.0", f.rel, h2);
    kiln_registry_client_opts c = fx_client(&f, f.reg.pub);
    kiln_registry_published pub;
    kiln_sign_seckey *k1[] = {f.p1, NULL};
    int64_t later = kiln_unix_time() + 3600;
    r1 = rfx_record("staging", "1.0.0", h1, 1, later, "promote", k1);
    r2 = rfx_record("staging", "2.0.0", h2, 2, later, "promote", k1);
    if (!CHECK("published and promoted", a1 && a2 && r1 && r2 &&
                                             kiln_registry_publish(&c, a1, NULL, &pub) == KILN_OK &&
                                             kiln_registry_publish(&c, a2, NULL, &pub) == KILN_OK &&
                                             fx_put(&f, "staging", r1) == KILN_OK))
        goto out;
    /* Two registries, the second never up: each is asked once (a lone registry would be
     * retried for seconds before the start goes offline). */
    const char *dead[] = {"http://127.0.0.1:9"};
    kiln_watch_opts o = rfx_watch_opts(&f.reg, f.reg.trust, dir, on_update, &u);
    o.pull.registries = dead;
    o.pull.nregistries = 1;
    o.pull.on_registry = quiet;
    CHECK("first start: pulled into gen-1, kept after the stop",
          watch_once(&o, &u) == 0 && !strcmp(gens(dir, got, sizeof got), "gen-1") && !u.failed);
    CHECK("serving demo@1.0.0, staging seq 1, the archive pulled",
          !strcmp(served.version, "1.0.0") && !strcmp(served.channel, "staging") &&
              served.seq == 1 && served.size > 0 && !strncmp(served.digest, "sha256:", 7) &&
              !strcmp(served.digest + 7, h1));
    /* A crash's leftovers, which the next start removes: a directory and a pull's temporary. */
    char *junk = kiln_path_join(dir, "gen-7"), *tmp = kiln_path_join(dir, ".gen-7.pull-AbC123");
    if (junk) kiln_mkdir_p(junk);
    if (tmp) kiln_mkdir_p(tmp);
    CHECK("restart, the channel unchanged: the kept model, no download (no gen-8)",
          watch_once(&o, &u) == 0 && !strcmp(gens(dir, got, sizeof got), "gen-1") && !u.failed);
    CHECK("serving the kept demo@1.0.0 (seq 1; no archive at hand: size 0)",
          !strcmp(served.version, "1.0.0") && served.seq == 1 && served.size == 0 &&
              !strcmp(served.digest + 7, h1));
    CHECK("the leftovers removed", tmp && !kiln_path_exists(tmp) && !kiln_path_exists(junk));
    free(junk);
    free(tmp);

    /* No registry answers. */
    kiln_registry_server_stop(f.reg.srv, 1000);
    f.reg.srv = NULL;
    bool served = watch_once(&o, &u) == 0;
    if (!CHECK("registry down: the kept model is served, and said so",
               served && u.failed == 1 &&
                   strstr(u.last_error, "serving demo@1.0.0 (staging seq 1") &&
                   strstr(u.last_error, "/gen-1'")))
        fprintf(stderr, "    heard: %s\n", u.last_error);
    model = kiln_path_join(dir, "gen-1/model.safetensors");
    state = kiln_path_join(f.reg.state, "channels/demo/staging.json");
    if (!CHECK("paths", model && state)) goto out;
    CHECK("a byte of the kept model changed: the start fails, naming the file and the outage",
          kiln_test_flip(model, 200) && watch_once(&o, &u) == -1 &&
              kiln_test_msg_has("cannot serve", "model.safetensors") &&
              kiln_test_msg_has(f.reg.url, NULL) && kiln_test_flip(model, 200));
    CHECK("restored: served again", watch_once(&o, &u) == 0);
    if (!CHECK("state", kiln_read_file(state, 1 << 20, &saved, &saved_len) == KILN_OK)) goto out;
    json_t *j = json_loads(saved, 0, NULL);
    json_object_set_new(j, "seq", json_integer(2));
    CHECK("the state accepted seq 2 since: the kept seq 1 is refused",
          kiln_json_write_file(state, j) == KILN_OK && watch_once(&o, &u) == -1 &&
              kiln_test_msg_has("seq 1, lower than 2 accepted before", NULL));
    json_object_set_new(j, "seq", json_integer(1));
    json_object_del(j, "record");
    CHECK("a state without the record (an older kiln's): refused, saying so",
          kiln_json_write_file(state, j) == KILN_OK && watch_once(&o, &u) == -1 &&
              kiln_test_msg_has("keeps no record and signatures", NULL));
    json_decref(j);
    CHECK("state restored",
          kiln_write_file_atomic(state, saved, saved_len) == KILN_OK && watch_once(&o, &u) == 0);

    /* Back, with a new record: pulled, and the kept directory goes. */
    if (!CHECK("registry back", fx_start(&f))) goto out;
    o.pull.registry = f.reg.url;
    /* The kept model is damaged now, but the channel has moved on: it is passed over before
     * a file of it is hashed (no note about it), and replaced. */
    CHECK("a new record: pulled into gen-2, gen-1 removed",
          kiln_test_flip(model, 200) && fx_put(&f, "staging", r2) == KILN_OK &&
              watch_once(&o, &u) > 0 &&
              !strcmp(gens(dir, got, sizeof got), "gen-2") && !u.failed);
    /* A crash between a pull's install and its OUT/current leaves current naming another
     * directory (here one that is gone): offline, the others are tried, newest first, and
     * current names the one served. */
    kiln_registry_server_stop(f.reg.srv, 1000);
    f.reg.srv = NULL;
    cur = kiln_path_join(dir, "current");
    char *named = NULL;
    size_t named_len = 0;
    CHECK("current names a directory that is gone: gen-2 served offline",
          cur && kiln_write_file_atomic(cur, "gen-9\n", 6) == KILN_OK && watch_once(&o, &u) > 0 &&
              strstr(u.last_error, "as kept in '") && strstr(u.last_error, "/gen-2'") &&
              kiln_read_file(cur, 64, &named, &named_len) == KILN_OK && !strcmp(named, "gen-2\n"));
    free(named);
out:
    free(dir), free(a1), free(a2), free(r1), free(r2), free(model), free(state), free(saved);
    free(cur);
    fx_free(&f);
}

/* ---- signed archives under the policy: validated models, thresholds, unvalidated ---- */

#include "release.h"
#include "train.h"
#include "validate.h"

/* A model as users make one: a tiny run trained, exported, its golden set made and (when
 * validated) `kiln validate` run on it, which writes validation.json; then packed as
 * demo@version. Returns the archive's path (caller frees). */
static char *fx_real_archive(const char *version, bool validated) {
    char *data = kiln_test_path("data.safetensors"), *run = kiln_test_path("run"), name[64];
    snprintf(name, sizeof name, "real-%s", version);
    char *model = kiln_test_path(name), *path = model ? kiln_asprintf("%s.kiln", model) : NULL;
    bool ok = data && run && path;
    kiln_synth_opts so = {.seed = 7, .rows = 2400, .n_features = 5, .n_outputs = 2};
    if (ok && !kiln_path_exists(data)) ok = kiln_synth_write(&so, data, NULL) == KILN_OK;
    if (ok && !kiln_path_exists(run)) {
        kiln_train_config c;
        kiln_train_config_default(&c);
        c.model.d_model = 16;
        c.model.d_ff = 24;
        c.model.seq_len = 16;
        c.model.attn_window = 8;
        c.batch_size = 8;
        c.steps = 20;
        c.warmup_steps = 5;
        c.eval_every = c.ckpt_every = 10;
        kiln_train_opts o = {.run_dir = run, .data_path = data};
        ok = kiln_train_start(&c, &o) == KILN_OK;
    }
    kiln_export_opts eo = {
        .run_dir = run, .step_metrics = kiln_run_step_metrics, .out_dir = model, .name = "demo"};
    kiln_golden_opts go = {
        .model = model, .data = data, .windows = 4, .seed = 3, .val_fraction = -1};
    kiln_validate_opts vo = {.model = model, .data = data, .val_fraction = -1};
    ok = ok && kiln_export_model(&eo, NULL) == KILN_OK && kiln_golden_make(&go) == KILN_OK;
    if (ok && validated) ok = kiln_validate_run(&vo, NULL) == KILN_OK;
    ok = ok && kiln_archive_pack(model, "demo", version, path, NULL, NULL) == KILN_OK;
    free(data), free(run), free(model);
    if (!ok) {
        free(path);
        return NULL;
    }
    return path;
}

static bool fx_policy(const char *path, const char *rel, const char *rel2, const char *rel3,
                      const char *p1, const char *extra) {
    char *t = kiln_asprintf("{\"format\":\"kiln-trust/1\",\"keys\":["
                            "{\"name\":\"rel\",\"pubkey\":\"%s\",\"roles\":[\"release\"]},"
                            "{\"name\":\"rel2\",\"pubkey\":\"%s\",\"roles\":[\"release\"]},"
                            "{\"name\":\"rel3\",\"pubkey\":\"%s\",\"roles\":[\"release\"]},"
                            "{\"name\":\"p1\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]}],"
                            "\"channels\":{\"staging\":{\"threshold\":1}}%s}",
                            rel, rel2, rel3, p1, extra);
    bool ok = t && kiln_write_file_atomic(path, t, strlen(t)) == KILN_OK;
    free(t);
    return ok;
}

static kiln_err fx_pull_with(const fixture *f, const char *trust, const char *ref, const char *out,
                             kiln_registry_pulled *res) {
    kiln_registry_client_opts c = fx_client(f, NULL);
    kiln_registry_pull_opts p = {.ref = ref, .trust = trust, .out = out, .state = f->reg.state};
    return kiln_registry_pull(&c, &p, res);
}

/* The server and the client each hold archives to their own policy through sign/: the
 * release threshold (distinct release keys), the unvalidated rule, and a client stricter
 * than its server refuses what the server took. */
KILN_TEST(registry_archive_policy) {
    fixture f;
    kiln_sign_seckey *rel2 = NULL, *rel3 = NULL;
    char *a = NULL, *u = NULL, *client3 = kiln_test_path("client3.json"),
         *strict = kiln_test_path("strict.json"), *out = kiln_test_path("pulled");
    if (!CHECK("fixture", fx_init(&f))) goto out;
    char k_rel[KILN_SIGN_PUBKEY_B64], k_rel2[KILN_SIGN_PUBKEY_B64], k_rel3[KILN_SIGN_PUBKEY_B64],
        k_p1[KILN_SIGN_PUBKEY_B64];
    kiln_sign_pubkey pk;
    bool keys = kiln_sign_seckey_pubkey(f.rel, &pk) == KILN_OK;
    kiln_sign_pubkey_base64(&pk, k_rel);
    keys = keys && kiln_sign_seckey_pubkey(f.p1, &pk) == KILN_OK;
    kiln_sign_pubkey_base64(&pk, k_p1);
    keys = keys && kiln_test_keypair(&rel2, k_rel2) && kiln_test_keypair(&rel3, k_rel3);
    /* The server: two distinct release keys, no unvalidated archives. */
    if (!CHECK(
            "policies",
            keys &&
                fx_policy(f.reg.trust, k_rel, k_rel2, k_rel3, k_p1, ",\"release_threshold\":2") &&
                fx_policy(strict, k_rel, k_rel2, k_rel3, k_p1, ",\"release_threshold\":2") &&
                fx_policy(client3, k_rel, k_rel2, k_rel3, k_p1, ",\"release_threshold\":3") &&
                fx_start(&f)))
        goto out;
    a = fx_real_archive("1.0.0", true);
    u = fx_real_archive("1.1.0", false);
    if (!CHECK("a validated and an unvalidated model packed", a && u)) goto out;
    kiln_registry_client_opts c = fx_client(&f, f.reg.pub);
    kiln_registry_published pub;

    CHECK("signed by one release key", rfx_sign(f.rel, a, false));
    kiln_err rc = kiln_registry_publish(&c, a, NULL, &pub);
    CHECK("one of two release keys: the server refuses",
          rc == KILN_ERR_VERIFY && strstr(kiln_errmsg(), "HTTP 422") &&
              strstr(kiln_errmsg(), "needs 2 distinct release keys, the archive is signed by 1"));
    CHECK("the message names the upload, not the server's file descriptor",
          strstr(kiln_errmsg(), "upload of demo@1.0.0") && !strstr(kiln_errmsg(), "/proc/"));
    CHECK("co-signed by a second release key", rfx_sign(rel2, a, false));
    CHECK("two of two: stored", kiln_registry_publish(&c, a, NULL, &pub) == KILN_OK);

    CHECK("the unvalidated model signed with allow-unvalidated by both",
          rfx_sign(f.rel, u, true) && rfx_sign(rel2, u, true));
    rc = kiln_registry_publish(&c, u, NULL, &pub);
    CHECK("unvalidated: the server refuses, naming the policy's rule",
          rc == KILN_ERR_VERIFY && strstr(kiln_errmsg(), "accept_unvalidated"));

    kiln_sign_seckey *k1[] = {f.p1, NULL};
    char hex[KILN_SHA256_HEX];
    uint8_t d[KILN_SHA256_BYTES];
    CHECK("digest", kiln_sha256_file(a, d) == KILN_OK);
    kiln_hex(d, sizeof d, hex);
    char *rec = rfx_record("staging", "1.0.0", hex, 1, kiln_unix_time() + 3600, "promote", k1);
    CHECK("promoted", rec && fx_put(&f, "staging", rec) == KILN_OK);
    free(rec);
    kiln_registry_pulled res;
    rc = fx_pull_with(&f, client3, "demo@staging", out, &res);
    CHECK("a client that needs 3 release keys refuses what the server took",
          rc == KILN_ERR_VERIFY && strstr(kiln_errmsg(), "needs 3 distinct release keys") &&
              strstr(kiln_errmsg(), "demo@1.0.0"));
    CHECK("nothing at the refused pull's directory", !kiln_path_exists(out));
    rc = fx_pull_with(&f, strict, "demo@staging", out, &res);
    CHECK("the strict client pulls the validated model", rc == KILN_OK);
    CHECK("and says who signed it",
          strstr(res.signed_by, "rel, rel2 (2 of 2 release keys; validation passed)") != NULL);
    char *vj = kiln_path_join(out, "validation.json"),
         *ws = kiln_path_join(out, "model.safetensors");
    json_t *rep = NULL;
    CHECK("the pulled model carries its passing validation report",
          vj && kiln_json_load_file(vj, &rep) == KILN_OK &&
              json_is_true(json_object_get(rep, "passed")));
    json_decref(rep);
    kiln_model *m = NULL;
    CHECK("and loads in the runtime", ws && kiln_model_open(ws, &m) == KILN_OK);
    kiln_model_free(m);
    free(vj), free(ws);

    /* A server that accepts unvalidated archives; a client that does not still refuses. */
    CHECK("lax server",
          fx_policy(f.reg.trust, k_rel, k_rel2, k_rel3, k_p1, ",\"accept_unvalidated\":true") &&
              fx_start(&f));
    c = fx_client(&f, f.reg.pub);
    CHECK("the lax server stores the unvalidated model",
          kiln_registry_publish(&c, u, NULL, &pub) == KILN_OK);
    char *out2 = kiln_test_path("unvalidated");
    rc = fx_pull_with(&f, strict, "demo@1.1.0", out2, &res);
    CHECK("the strict client refuses it", rc == KILN_ERR_VERIFY &&
                                              strstr(kiln_errmsg(), "allow-unvalidated") &&
                                              strstr(kiln_errmsg(), "accept_unvalidated"));
    CHECK("nothing there", !kiln_path_exists(out2));
    rc = fx_pull_with(&f, f.reg.trust, "demo@1.1.0", out2, &res);
    CHECK("a client whose policy accepts it pulls it, and is told",
          rc == KILN_OK &&
              strstr(res.signed_by, "validation absent, signed with allow-unvalidated"));
    size_t problems = 0;
    kiln_registry_server_stop(f.reg.srv, 1000);
    f.reg.srv = NULL;
    CHECK("fsck with the strict policy finds the unvalidated version's signatures",
          kiln_registry_fsck(f.reg.root, strict, NULL, NULL, &problems) == KILN_ERR_VERIFY &&
              problems == 1);
    free(out2);
out:
    kiln_sign_seckey_free(rel2);
    kiln_sign_seckey_free(rel3);
    free(a), free(u), free(client3), free(strict), free(out);
    fx_free(&f);
}

/* kiln_release_run stops at the first failing stage, says which, and leaves what was
 * there before as it was (the full pipeline runs in tests/e2e/65-release.sh). */
KILN_TEST(registry_release_refusals) {
    fixture f;
    if (!CHECK("fixture", fx_init(&f))) goto out;
    char *outd = kiln_test_path("rel-out"), *keep = kiln_path_join(outd, "keep"),
         *data = kiln_test_synth("d.st", 3, 200), *bad = kiln_test_write("bad.st", "x", 1),
         *run = kiln_test_path("no-such-run"), *fresh = kiln_test_path("rel-fresh");
    kiln_registry_client_opts c = fx_client(&f, f.reg.pub);
    const kiln_sign_seckey *keys[] = {f.rel};
    kiln_release_opts o = {.run_dir = run,
                           .name = "demo",
                           .version = "1.0.0",
                           .data = data,
                           .out_dir = outd,
                           .trust = f.reg.trust,
                           .state = f.reg.state,
                           .release_keys = keys,
                           .n_release_keys = 1,
                           .client = &c};
    kiln_release_result res;
    CHECK("setup", keep && data && bad && kiln_mkdir_p(outd) == KILN_OK &&
                       kiln_write_file_atomic(keep, "mine", 4) == KILN_OK);
    kiln_err rc = kiln_release_run(&o, &res);
    CHECK("a used output directory: refused at check",
          rc == KILN_ERR_CONFLICT && res.stage == KILN_RELEASE_CHECK &&
              strstr(kiln_errmsg(), "release stopped at stage 'check'") &&
              strstr(kiln_errmsg(), outd) && strstr(kiln_errmsg(), "not empty"));
    CHECK("its file is left as it was", file_is(outd, "keep", "mine"));
    o.out_dir = fresh;
    o.promote = "staging";
    o.n_promote_keys = 0;
    rc = kiln_release_run(&o, &res);
    CHECK("promote without a promote key: usage, at check",
          rc == KILN_ERR_USAGE && res.stage == KILN_RELEASE_CHECK &&
              strstr(kiln_errmsg(), "needs a promote key"));
    o.promote = NULL;
    o.data = bad;
    rc = kiln_release_run(&o, &res);
    CHECK("a dataset that is not one: refused at check, naming it, before any work",
          rc != KILN_OK && res.stage == KILN_RELEASE_CHECK &&
              strstr(kiln_errmsg(), "release stopped at stage 'check'") &&
              strstr(kiln_errmsg(), "bad.st") && strstr(kiln_errmsg(), "too short"));
    CHECK("no output directory made", !kiln_path_exists(fresh));
    o.data = data;
    rc = kiln_release_run(&o, &res);
    CHECK("a run that does not exist: stopped at export, naming it",
          rc != KILN_OK && res.stage == KILN_RELEASE_EXPORT &&
              strstr(kiln_errmsg(), "release stopped at stage 'export'") &&
              strstr(kiln_errmsg(), "no-such-run"));
    CHECK("the empty output directory it made is gone again", !kiln_path_exists(fresh));
    json_t *m = NULL;
    kiln_registry_client_opts rd = fx_client(&f, NULL);
    CHECK("nothing reached the registry",
          kiln_registry_get_json(&rd, "/v1/models/demo/versions/1.0.0", &m) == KILN_ERR_NOTFOUND);
    json_decref(m);
    CHECK("stage names", !strcmp(kiln_release_stage_name(KILN_RELEASE_VALIDATE), "validate") &&
                             !strcmp(kiln_release_stage_name(KILN_RELEASE_DONE), "done"));
    free(outd), free(keep), free(data), free(bad), free(run), free(fresh);
out:
    fx_free(&f);
}

/* test_registry_tokens.c - the registry's tokens: revocation on a running server, expiry,
 * last use without a write per request, list, bad names and roots, and the migration of a
 * store made before tokens could expire or be revoked. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "registry_fx.h"
#include "registry_int.h"
#include "test.h"
#include "testutil.h"

/* ---- helpers ---- */

/* GET path from the server at url, with token (NULL: none); the status, 0 if unreachable. */
static long get(const char *url, const char *path, const char *token, rfx_resp *out) {
    return rfx_http(url, "GET", path, token, NULL, NULL, out);
}

/* One integer from a query on the store (its own connection, as another process would);
 * -1 when it fails. */
static int64_t query(const char *root, const char *sql) {
    return rfx_int(root, RFX_CONNECT, sql);
}

/* Run SQL (several statements) on DIR/registry.db, made if missing, as plain SQLite: what
 * makes an old store from nothing. (rfx_sql reaches stores only, through the registry's
 * open, which would lay down today's schema first.) */
static bool exec_sql(const char *root, const char *sql) {
    char *path = kiln_path_join(root, "registry.db");
    sqlite3 *db = NULL;
    bool ok =
        path &&
        sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) == SQLITE_OK &&
        sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK;
    sqlite3_close(db);
    free(path);
    return ok;
}

static const kiln_registry_token_info *find(const kiln_registry_token_info *t, size_t n,
                                            const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return &t[i];
    return NULL;
}

/* ---- revocation ---- */

KILN_TEST(registry_tokens_revoke_on_a_running_server) {
    rfx_resp b = {0};
    char url[64];
    char *root = kiln_test_path("reg");
    char *ci = NULL, *ops = NULL, *again = NULL;
    kiln_registry_server *s = NULL;
    if (!CHECK("tokens",
               root && kiln_registry_token_create(root, "ci", KILN_SCOPE_PUBLISH, &ci) == KILN_OK &&
                   kiln_registry_token_create(root, "ops", KILN_SCOPE_ADMIN, &ops) == KILN_OK))
        goto out;
    sqlite3 *db = NULL;
    CHECK("an audit row with every field",
          reg_db_open(root, &db) == KILN_OK &&
              reg_audit(db, "ci", "promote", "m", "1.0.0", "prod", "sha256:ab") == KILN_OK);
    reg_db_close(db);
    if (!CHECK("server starts", rfx_serve(root, NULL, true, 2, &s, url))) goto out;
    CHECK("the token works", get(url, "/v1/models", ci, &b) == 200);
    CHECK("its use is recorded",
          query(root, "SELECT last_used FROM tokens WHERE name = 'ci'") >= kiln_unix_time() - 5);
    CHECK("the audit API names each field as its column",
          get(url, "/v1/audit", ops, &b) == 200 &&
              strstr(b.body, "{\"action\":\"promote\",\"channel\":\"prod\",\"digest\":"
                             "\"sha256:ab\",\"id\":3,\"model\":\"m\",\"reason\":null,") &&
              strstr(b.body, "\"token\":\"ci\",\"version\":\"1.0.0\"}"));

    int64_t at = 0;
    CHECK("revoke",
          kiln_registry_token_revoke(root, "ci", "leaked in a CI log", &at) == KILN_OK && at > 0);
    int64_t audit_rows = query(root, "SELECT count(*) FROM audit");
    char when[21], want[128];
    kiln_format_time(at, when);
    snprintf(want, sizeof want, "{\"error\":\"token 'ci' was revoked at %s\"}", when);
    CHECK("the next request is refused: 401",
          get(url, "/v1/models", ci, &b) == 401 && !strcmp(b.body, want));
    CHECK("the refusal wrote nothing", query(root, "SELECT count(*) FROM audit") == audit_rows);
    CHECK("one audit row with the reason",
          query(root, "SELECT count(*) FROM audit WHERE action = 'token.revoke' AND token = 'ci'"
                      " AND reason = 'leaked in a CI log'") == 1);
    CHECK("the row is kept, revoked",
          query(root, "SELECT count(*) FROM tokens WHERE name = 'ci' AND revoked = "
                      "(SELECT "
                      "time FROM audit WHERE action = 'token.revoke')") == 1);
    CHECK("the audit API shows the reason",
          get(url, "/v1/audit", ops, &b) == 200 && strstr(b.body, "\"action\":\"token.revoke\"") &&
              strstr(b.body, "\"reason\":\"leaked in a CI log\""));
    CHECK("another token still works", get(url, "/v1/models", ops, &b) == 200);
    CHECK("GET /v1/tokens lists them for admin",
          get(url, "/v1/tokens", ops, &b) == 200 &&
              strstr(b.body, "\"name\":\"ci\",\"reason\":\"leaked in a CI log\",") &&
              strstr(b.body, "\"scope\":\"publish\",\"state\":\"revoked\"") &&
              strstr(b.body, "\"name\":\"ops\"") && !strstr(b.body, ci + 5) &&
              !strstr(b.body, "hash"));

    /* Twice, unknown, bad names and reasons: clear errors that change nothing. */
    int64_t audit_after = query(root, "SELECT count(*) FROM audit");
    CHECK("revoking twice is a conflict",
          kiln_registry_token_revoke(root, "ci", "again", NULL) == KILN_ERR_CONFLICT &&
              kiln_test_msg_has("token 'ci'", "revoked already, at"));
    CHECK("the first reason stays",
          query(root, "SELECT count(*) FROM tokens WHERE revoke_reason = 'leaked in a CI log'") ==
              1);
    CHECK("an unknown name is not found",
          kiln_registry_token_revoke(root, "nope", NULL, NULL) == KILN_ERR_NOTFOUND &&
              kiln_test_msg_has("no token named 'nope'", root));
    const char *bad[] = {"", "../ci", "CI", "a b", "ci;--"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++)
        CHECK("a bad name is a usage error",
              kiln_registry_token_revoke(root, bad[i], NULL, NULL) == KILN_ERR_USAGE &&
                  kiln_test_msg_has("token name", NULL));
    char long_reason[KILN_REGISTRY_REASON_MAX + 2];
    memset(long_reason, 'x', sizeof long_reason - 1);
    long_reason[sizeof long_reason - 1] = 0;
    const char *bad_reason[] = {"", "two\nlines", "\x1b[31mred", long_reason, "\xff\xfe"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad_reason); i++)
        CHECK("a bad reason is a usage error",
              kiln_registry_token_revoke(root, "ops", bad_reason[i], NULL) == KILN_ERR_USAGE &&
                  kiln_test_msg_has("reason", NULL));
    CHECK("nothing changed", query(root, "SELECT count(*) FROM audit") == audit_after &&
                                 query(root, "SELECT count(*) FROM tokens WHERE revoked IS NOT "
                                             "NULL") == 1);
    CHECK("a revoked name is not reused",
          kiln_registry_token_create(root, "ci", KILN_SCOPE_READ, &again) == KILN_ERR_CONFLICT &&
              !again && kiln_test_msg_has("revoked at", "choose another name"));
    char *tag = NULL;
    CHECK("a reason with markup",
          kiln_registry_token_create(root, "tag", KILN_SCOPE_READ, &tag) == KILN_OK &&
              kiln_registry_token_revoke(root, "tag", "<script>x</script>", NULL) == KILN_OK);
    free(tag);
    CHECK("the web page's audit view shows revocations and their reasons, as text",
          get(url, "/ui/audit", ops, &b) == 200 && strstr(b.body, "<td>token.revoke</td>") &&
              strstr(b.body, "<td>leaked in a CI log</td>") &&
              strstr(b.body, "&lt;script&gt;x&lt;/script&gt;") && !strstr(b.body, "<script>x"));
    CHECK("metrics count the refusal by reason",
          get(url, "/metrics", ops, &b) == 200 &&
              strstr(b.body, "kiln_registry_auth_refused_total{reason=\"revoked\"} 1\n") &&
              strstr(b.body, "kiln_registry_auth_refused_total{reason=\"expired\"} 0\n"));
out:
    rfx_resp_free(&b);
    kiln_registry_server_stop(s, 1000);
    free(root), free(ci), free(ops), free(again);
}

/* ---- expiry ---- */

KILN_TEST(registry_tokens_expiry) {
    rfx_resp b = {0};
    char url[64];
    char *root = kiln_test_path("reg");
    char *old = NULL, *later = NULL, *neg = NULL;
    kiln_registry_server *s = NULL;
    int64_t now = kiln_unix_time();
    /* An expiry in the past is written through the API: the clock is not moved. */
    if (!CHECK("tokens", root &&
                             kiln_registry_token_create_until(root, "old", KILN_SCOPE_READ,
                                                              now - 10, &old) == KILN_OK &&
                             kiln_registry_token_create_until(root, "later", KILN_SCOPE_READ,
                                                              now + 3600, &later) == KILN_OK))
        goto out;
    CHECK("an expiry before 1970 is refused",
          kiln_registry_token_create_until(root, "neg", KILN_SCOPE_READ, -1, &neg) ==
                  KILN_ERR_USAGE &&
              !neg);
    if (!CHECK("server starts", rfx_serve(root, NULL, true, 2, &s, url))) goto out;
    int64_t audit_rows = query(root, "SELECT count(*) FROM audit");
    char when[21], want[128];
    kiln_format_time(now - 10, when);
    snprintf(want, sizeof want, "{\"error\":\"token 'old' expired at %s\"}", when);
    CHECK("an expired token: 401 saying when",
          get(url, "/v1/models", old, &b) == 401 && !strcmp(b.body, want));
    CHECK("a token before its expiry works", get(url, "/v1/models", later, &b) == 200);
    CHECK("GET /v1/tokens needs admin: 403", get(url, "/v1/tokens", later, &b) == 403);
    CHECK("the refusal wrote nothing",
          query(root, "SELECT count(*) FROM audit") == audit_rows &&
              query(root, "SELECT count(*) FROM tokens WHERE name = 'old' AND last_used IS NULL") ==
                  1);
    CHECK("metrics count it", get(url, "/metrics", later, &b) == 200 &&
                                  strstr(b.body, "kiln_registry_auth_refused_total{reason="
                                                 "\"expired\"} 1\n"));

    /* The boundary, with the clock in the caller's hands: valid before, refused at. */
    sqlite3 *db = NULL;
    if (!CHECK("db", reg_db_connect(root, &db) == KILN_OK)) goto out;
    char *name = NULL;
    unsigned scopes = 0;
    reg_auth_refusal why = REG_AUTH_SCOPE;
    CHECK("a second before: accepted",
          reg_token_lookup(db, later, now + 3599, &name, &scopes, &why) == KILN_OK && name &&
              scopes == KILN_SCOPE_READ);
    free(name);
    name = NULL;
    CHECK("at the expiry: refused as expired",
          reg_token_lookup(db, later, now + 3600, &name, &scopes, &why) == KILN_ERR_AUTH && !name &&
              why == REG_AUTH_EXPIRED && kiln_test_msg_has("token 'later' expired at", NULL));
    CHECK("an unknown token says so",
          reg_token_lookup(db, "kiln_nope", now, &name, &scopes, &why) == KILN_ERR_AUTH &&
              why == REG_AUTH_UNKNOWN);
    reg_db_close(db);

    kiln_registry_token_info *t = NULL;
    size_t n = 0;
    CHECK("list", kiln_registry_token_list(root, &t, &n) == KILN_OK && n == 2);
    const kiln_registry_token_info *o = find(t, n, "old"), *l = find(t, n, "later");
    CHECK("states", o && l && kiln_registry_token_state_at(o, now) == KILN_TOKEN_EXPIRED &&
                        kiln_registry_token_state_at(l, now) == KILN_TOKEN_ACTIVE &&
                        kiln_registry_token_state_at(l, now + 3600) == KILN_TOKEN_EXPIRED &&
                        o->expires == now - 10 && l->expires == now + 3600);
    free(t);
out:
    rfx_resp_free(&b);
    kiln_registry_server_stop(s, 1000);
    free(root), free(old), free(later), free(neg);
}

/* ---- last use ---- */

KILN_TEST(registry_tokens_last_used_at_most_once_a_minute) {
    char *root = kiln_test_path("reg");
    char *tok = NULL;
    sqlite3 *db = NULL, *other = NULL;
    if (!CHECK("token",
               root && kiln_registry_token_create(root, "ci", KILN_SCOPE_PUBLISH, &tok) == KILN_OK))
        goto out;
    if (!CHECK("db", reg_db_connect(root, &db) == KILN_OK)) goto out;
    const int64_t t0 = 2000000000;
    const char *const used = "SELECT coalesce(last_used, 0) FROM tokens WHERE name = 'ci'";
    char *name = NULL;
    unsigned scopes;
    int64_t steps[][2] = {/* now, last_used after */ {t0, t0},
                          {t0 + 30, t0},
                          {t0 + 59, t0},
                          {t0 + 60, t0 + 60},
                          {t0 + 61, t0 + 60}};
    for (size_t i = 0; i < KILN_ARRAY_LEN(steps); i++) {
        CHECK("accepted", reg_token_lookup(db, tok, steps[i][0], &name, &scopes, NULL) == KILN_OK);
        free(name);
        name = NULL;
        char label[96];
        snprintf(label, sizeof label, "at +%lld last_used is +%lld", (long long)(steps[i][0] - t0),
                 (long long)(steps[i][1] - t0));
        CHECK(label, query(root, used) == steps[i][1]);
    }
    /* A busy database is not waited for: the update is skipped, the request goes on. */
    if (!CHECK("second connection", reg_db_connect(root, &other) == KILN_OK &&
                                        reg_db_exec(other, "BEGIN IMMEDIATE") == KILN_OK))
        goto out;
    uint64_t a = kiln_now_ns();
    CHECK("accepted while another writer holds the database",
          reg_token_lookup(db, tok, t0 + 500, &name, &scopes, NULL) == KILN_OK);
    CHECK("without waiting", kiln_now_ns() - a < 2000000000ull);
    free(name);
    name = NULL;
    (void)reg_db_exec(other, "ROLLBACK");
    CHECK("and without writing", query(root, used) == t0 + 60);
    CHECK("the next request writes it",
          reg_token_lookup(db, tok, t0 + 501, &name, &scopes, NULL) == KILN_OK &&
              query(root, used) == t0 + 501);
    free(name);
out:
    reg_db_close(db);
    reg_db_close(other);
    free(root), free(tok);
}

/* ---- list ---- */

KILN_TEST(registry_tokens_list_fields) {
    char *root = kiln_test_path("reg");
    char *tk[3] = {NULL, NULL, NULL};
    int64_t now = kiln_unix_time();
    if (!CHECK("tokens",
               root &&
                   kiln_registry_token_create(root, "zeta", KILN_SCOPE_READ, &tk[0]) == KILN_OK &&
                   kiln_registry_token_create_until(root, "alpha", KILN_SCOPE_PROMOTE, now + 86400,
                                                    &tk[1]) == KILN_OK &&
                   kiln_registry_token_create(root, "mid", KILN_SCOPE_ADMIN, &tk[2]) == KILN_OK &&
                   kiln_registry_token_revoke(root, "mid", "rotated", NULL) == KILN_OK))
        goto out;
    kiln_registry_token_info *t = NULL;
    size_t n = 0;
    if (!CHECK("list", kiln_registry_token_list(root, &t, &n) == KILN_OK && n == 3)) goto out;
    CHECK("by name",
          !strcmp(t[0].name, "alpha") && !strcmp(t[1].name, "mid") && !strcmp(t[2].name, "zeta"));
    CHECK("scopes", !strcmp(t[0].scope, "promote") && !strcmp(t[1].scope, "admin") &&
                        !strcmp(t[2].scope, "read"));
    CHECK("created", t[0].created >= now && t[2].created <= kiln_unix_time());
    CHECK("expires", t[0].expires == now + 86400 && t[1].expires == 0 && t[2].expires == 0);
    CHECK("revoked with its reason", t[1].revoked >= now && !strcmp(t[1].reason, "rotated") &&
                                         !t[0].revoked && !t[0].reason[0]);
    CHECK("never used", !t[0].last_used && !t[1].last_used && !t[2].last_used);
    json_t *j = kiln_registry_token_json(t, n, now);
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_t *row = j ? json_array_get(json_object_get(j, "tokens"), 1) : NULL;
    CHECK("JSON fields",
          row && json_object_size(row) == 8 &&
              !strcmp(json_string_value(json_object_get(row, "state")), "revoked") &&
              !strcmp(json_string_value(json_object_get(row, "reason")), "rotated") &&
              json_is_null(json_object_get(row, "expires")) &&
              json_is_null(json_object_get(row, "last_used")) &&
              json_is_string(json_object_get(row, "revoked")));
    CHECK("JSON states", text && strstr(text, "\"name\":\"alpha\"") &&
                             strstr(text, "\"state\":\"active\"") &&
                             strstr(text, "\"scope\":\"promote\",\"state\":\"active\""));
    /* Never a secret or its hash. */
    for (int i = 0; i < 3; i++) {
        uint8_t h[KILN_SHA256_BYTES];
        char hex[KILN_SHA256_HEX];
        kiln_sha256(tk[i], strlen(tk[i]), h);
        kiln_hex(h, sizeof h, hex);
        CHECK("neither the token nor its hash is listed",
              text && !strstr(text, tk[i]) && !strstr(text, hex) && !strstr(text, tk[i] + 5));
    }
    free(text);
    json_decref(j);
    free(t);
out:
    for (int i = 0; i < 3; i++)
        free(tk[i]);
    free(root);
}

/* list and revoke read a store: a root that is not one is refused by name, and nothing is
 * made there. */
KILN_TEST(registry_tokens_refuse_what_is_not_a_store) {
    char *none = kiln_test_path("no-store"), *file = kiln_test_write("a-file", "x", 1),
         *empty = kiln_test_path("empty");
    if (!CHECK("setup", none && file && empty && kiln_mkdir_p(empty) == KILN_OK)) goto out;
    const char *roots[] = {none, file, empty};
    const char *says[] = {"no registry store there", "is not a directory", "no registry.db"};
    for (int i = 0; i < 3; i++) {
        kiln_registry_token_info *t = (void *)1;
        size_t n = 7;
        CHECK("list refuses it, naming it", kiln_registry_token_list(roots[i], &t, &n) != KILN_OK &&
                                                !t && !n && kiln_test_msg_has(roots[i], says[i]));
        CHECK("revoke refuses it, naming it",
              kiln_registry_token_revoke(roots[i], "ci", NULL, NULL) != KILN_OK &&
                  kiln_test_msg_has(roots[i], says[i]));
    }
    struct stat sb;
    char *listing = kiln_test_listing(empty);
    CHECK("nothing was made", stat(none, &sb) != 0 && stat(file, &sb) == 0 && sb.st_size == 1 &&
                                  listing && !strcmp(listing, ".\n..\n"));
    free(listing);
out:
    free(none), free(file), free(empty);
}

/* ---- migration ---- */

/* The tables exactly as the kiln before schema versions made them. */
static const char *const old_schema =
    "PRAGMA journal_mode=WAL;"
    "CREATE TABLE versions("
    " model TEXT NOT NULL, version TEXT NOT NULL, digest TEXT NOT NULL, size INTEGER NOT NULL,"
    " manifest TEXT NOT NULL, signature TEXT NOT NULL, card TEXT, validation TEXT,"
    " publisher TEXT NOT NULL, created INTEGER NOT NULL, PRIMARY KEY(model, version));"
    "CREATE TABLE channel_records("
    " model TEXT NOT NULL, channel TEXT NOT NULL, seq INTEGER NOT NULL, version TEXT NOT NULL,"
    " digest TEXT NOT NULL, expires INTEGER NOT NULL, reason TEXT, record TEXT NOT NULL,"
    " publisher TEXT NOT NULL, created INTEGER NOT NULL, PRIMARY KEY(model, channel, seq));"
    "CREATE TABLE tokens("
    " name TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, scope TEXT NOT NULL, created INTEGER NOT "
    "NULL);"
    "CREATE TABLE audit("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, time INTEGER NOT NULL, token TEXT, action TEXT NOT "
    "NULL, model TEXT, version TEXT, channel TEXT, digest TEXT);";

/* An old store at dir with one token, 'legacy', whose secret is "kiln_legacy"; extra SQL
 * after. */
static bool old_store(const char *dir, const char *extra) {
    uint8_t h[KILN_SHA256_BYTES];
    char hex[KILN_SHA256_HEX], sql[512];
    kiln_sha256("kiln_legacy", 11, h);
    kiln_hex(h, sizeof h, hex);
    snprintf(sql, sizeof sql,
             "INSERT INTO tokens VALUES('legacy', '%s', 'publish', 1700000000);"
             "INSERT INTO audit(time, token, action) VALUES(1700000000, 'legacy', 'token.create');"
             "%s",
             hex, extra ? extra : "");
    return kiln_mkdir_p(dir) == KILN_OK && exec_sql(dir, old_schema) && exec_sql(dir, sql);
}

static bool has_column(const char *root, const char *table, const char *column) {
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM pragma_table_info('%s') WHERE name = '%s'",
             table, column);
    return query(root, sql) == 1;
}

KILN_TEST(registry_tokens_migrate_an_old_store) {
    rfx_resp b = {0};
    char url[64];
    char *root = kiln_test_path("old"), *newer = kiln_test_path("newer"),
         *broken = kiln_test_path("broken");
    kiln_registry_server *s = NULL;
    kiln_registry_token_info *t = NULL;
    size_t n = 0;
    if (!CHECK("an old store", root && newer && broken && old_store(root, NULL))) goto out;
    CHECK("it is at version 0, without the new columns",
          query(root, "PRAGMA user_version") == 0 && !has_column(root, "tokens", "revoked"));
    CHECK("it opens (list)", kiln_registry_token_list(root, &t, &n) == KILN_OK && n == 1);
    CHECK("its token, as it was",
          n == 1 && !strcmp(t[0].name, "legacy") && !strcmp(t[0].scope, "publish") &&
              t[0].created == 1700000000 && !t[0].expires && !t[0].revoked && !t[0].last_used &&
              kiln_registry_token_state_at(&t[0], kiln_unix_time()) == KILN_TOKEN_ACTIVE);
    free(t);
    t = NULL;
    CHECK("migrated: the version",
          query(root, "PRAGMA user_version") == reg_schema_version() && reg_schema_version() >= 1);
    CHECK("migrated: the columns",
          has_column(root, "tokens", "expires") && has_column(root, "tokens", "revoked") &&
              has_column(root, "tokens", "revoke_reason") &&
              has_column(root, "tokens", "last_used") && has_column(root, "audit", "reason"));
    CHECK("the old rows are kept", query(root, "SELECT count(*) FROM audit") == 1);
    size_t problems = 9;
    CHECK("fsck accepts the migrated store",
          kiln_registry_fsck(root, NULL, NULL, NULL, &problems) == KILN_OK && problems == 0);
    CHECK("opening again migrates nothing (an ALTER would fail)",
          kiln_registry_token_list(root, &t, &n) == KILN_OK && n == 1);
    free(t);
    t = NULL;
    if (!CHECK("a server starts on it", rfx_serve(root, NULL, true, 2, &s, url))) goto out;
    CHECK("the old token works", get(url, "/v1/models", "kiln_legacy", &b) == 200);
    CHECK("and is revoked like any other",
          kiln_registry_token_revoke(root, "legacy", NULL, NULL) == KILN_OK &&
              get(url, "/v1/models", "kiln_legacy", &b) == 401 &&
              strstr(b.body, "token 'legacy' was revoked at"));
    CHECK("a revocation without a reason audits none",
          query(root, "SELECT count(*) FROM audit WHERE action = 'token.revoke' AND reason IS "
                      "NULL") == 1);
    kiln_registry_server_stop(s, 1000);
    s = NULL;

    /* A store from a newer kiln is refused and left alone. */
    if (!CHECK("a newer store", old_store(newer, "PRAGMA user_version = 7;"))) goto out;
    CHECK("is refused, saying why",
          kiln_registry_token_list(newer, &t, &n) == KILN_ERR_UNSUPPORTED && !t &&
              kiln_test_msg_has("schema version 7", "newer than this kiln's"));
    CHECK("and left as it was",
          query(newer, "PRAGMA user_version") == 7 && !has_column(newer, "tokens", "revoked"));

    /* A migration that fails part way changes nothing: one transaction. (The audit table
     * already has a 'reason' column, so the last ALTER fails after the tokens ones ran.) */
    if (!CHECK("a store the migration cannot finish",
               old_store(broken, "ALTER TABLE audit ADD COLUMN reason TEXT;")))
        goto out;
    CHECK("is refused", kiln_registry_token_list(broken, &t, &n) != KILN_OK && !t &&
                            kiln_test_msg_has("migrating registry.db to schema version", NULL));
    CHECK("with nothing half done", query(broken, "PRAGMA user_version") == 0 &&
                                        !has_column(broken, "tokens", "expires") &&
                                        !has_column(broken, "tokens", "last_used"));
out:
    rfx_resp_free(&b);
    kiln_registry_server_stop(s, 1000);
    free(root), free(newer), free(broken);
}

/* fsck looks at tokens too: a scope the server does not know, a hash create never writes. */
KILN_TEST(registry_tokens_fsck) {
    char *root = kiln_test_path("reg"), *tok = NULL;
    if (!CHECK("token",
               root && kiln_registry_token_create(root, "ci", KILN_SCOPE_READ, &tok) == KILN_OK))
        goto out;
    size_t problems = 9;
    CHECK("fsck clean",
          kiln_registry_fsck(root, NULL, NULL, NULL, &problems) == KILN_OK && problems == 0);
    CHECK("damage", exec_sql(root, "INSERT INTO tokens(name, hash, scope, created)"
                                   " VALUES('bad', 'XYZ', 'root', 1)"));
    CHECK("fsck finds both problems",
          kiln_registry_fsck(root, NULL, NULL, NULL, &problems) == KILN_ERR_VERIFY &&
              problems == 2);
out:
    free(root), free(tok);
}

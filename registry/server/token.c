/* token.c - the registry's bearer tokens: create (with an optional expiry), list, revoke,
 * and the per-request lookup that refuses unknown, expired and revoked tokens and records
 * when each was last used (at most one write per token per minute). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_int.h"

bool kiln_registry_scope_parse(const char *s, kiln_registry_scope *out) {
    static const struct {
        const char *name;
        kiln_registry_scope scope;
    } t[] = {{"read", KILN_SCOPE_READ},
             {"publish", KILN_SCOPE_PUBLISH},
             {"promote", KILN_SCOPE_PROMOTE},
             {"admin", KILN_SCOPE_ADMIN}};
    for (size_t i = 0; i < KILN_ARRAY_LEN(t); i++)
        if (s && !strcmp(s, t[i].name)) {
            *out = t[i].scope;
            return true;
        }
    return false;
}

unsigned reg_scope_bits(kiln_registry_scope s) {
    if (s == KILN_SCOPE_ADMIN)
        return KILN_SCOPE_READ | KILN_SCOPE_PUBLISH | KILN_SCOPE_PROMOTE | KILN_SCOPE_ADMIN;
    return KILN_SCOPE_READ | (unsigned)s;
}

/* The busy timeout every connection to the store has (store.c), restored after the
 * last-used update, which waits for no one. */
#define BUSY_MS 10000

static const char *const scope_names[] = {[KILN_SCOPE_READ] = "read",
                                          [KILN_SCOPE_PUBLISH] = "publish",
                                          [KILN_SCOPE_PROMOTE] = "promote",
                                          [KILN_SCOPE_ADMIN] = "admin"};

const char *kiln_registry_scope_name(kiln_registry_scope s) {
    return (s == KILN_SCOPE_READ || s == KILN_SCOPE_PUBLISH || s == KILN_SCOPE_PROMOTE ||
            s == KILN_SCOPE_ADMIN)
               ? scope_names[s]
               : NULL;
}

static void token_hash(const char *token, char hex[KILN_SHA256_HEX]) {
    uint8_t h[KILN_SHA256_BYTES];
    kiln_sha256(token, strlen(token), h);
    kiln_hex(h, sizeof h, hex);
}

static void fmt_time(int64_t t, char out[21]) {
    kiln_format_time(t, out);
}

/* The name's row: *found, and its revocation time (0: not revoked). */
static kiln_err find_name(sqlite3 *db, const char *name, bool *found, int64_t *revoked) {
    sqlite3_stmt *st = NULL;
    *found = false;
    *revoked = 0;
    if (sqlite3_prepare_v2(db, "SELECT revoked FROM tokens WHERE name = ?1", -1, &st, NULL) !=
        SQLITE_OK)
        return reg_db_fail(db, "looking up a token name");
    sqlite3_bind_text(st, 1, name, -1, SQLITE_TRANSIENT);
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) {
        *found = true;
        *revoked = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    return r == SQLITE_ROW || r == SQLITE_DONE ? KILN_OK
                                               : reg_db_fail(db, "looking up a token name");
}

kiln_err kiln_registry_token_create(const char *root, const char *name, kiln_registry_scope scope,
                                    char **token) {
    return kiln_registry_token_create_until(root, name, scope, 0, token);
}

kiln_err kiln_registry_token_create_until(const char *root, const char *name,
                                          kiln_registry_scope scope, int64_t expires,
                                          char **token) {
    *token = NULL;
    KILN_TRY(kiln_registry_check_name("token", name));
    KILN_FAIL_IF(!kiln_registry_scope_name(scope), KILN_ERR_USAGE,
                 "token scope %d is not one of read, publish, promote, admin", (int)scope);
    KILN_FAIL_IF(expires < 0, KILN_ERR_USAGE, "token expiry %lld is before 1970",
                 (long long)expires);
    KILN_TRY(reg_root_check(root));
    KILN_FAIL_IF(sodium_init() < 0, KILN_ERR_INTERNAL, "libsodium failed to initialise");
    uint8_t raw[32];
    randombytes_buf(raw, sizeof raw);
    char *t = kiln_malloc(6 + 64 + 1);
    if (!t) return KILN_ERR_NOMEM;
    memcpy(t, "kiln_", 5);
    kiln_hex(raw, sizeof raw, t + 5);
    sodium_memzero(raw, sizeof raw);
    char hex[KILN_SHA256_HEX];
    token_hash(t, hex);

    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    kiln_err rc = KILN_OK;
    bool in_tx = false;
    KILN_CHECK(rc, out, reg_db_open(root, &db));
    KILN_CHECK(rc, out, reg_db_exec(db, "BEGIN IMMEDIATE"));
    in_tx = true;
    /* A name is never reused, not even a revoked token's: the audit log's names must keep
     * meaning the token they meant. */
    bool found;
    int64_t revoked;
    KILN_CHECK(rc, out, find_name(db, name, &found, &revoked));
    if (found && revoked) {
        char at[21];
        fmt_time(revoked, at);
        rc = kiln_fail(KILN_ERR_CONFLICT,
                       "token name '%s' in '%s' belongs to a token revoked at %s; names are not "
                       "reused (the audit log keeps meaning the old token): choose another name",
                       name, root, at);
        goto out;
    }
    KILN_CHECK_IF(rc, out, found, KILN_ERR_CONFLICT, "a token named '%s' exists already in '%s'",
                  name, root);
    KILN_CHECK_IF(rc, out,
                  sqlite3_prepare_v2(db,
                                     "INSERT INTO tokens(name, hash, scope, created, expires)"
                                     " VALUES(?1, ?2, ?3, ?4, ?5)",
                                     -1, &st, NULL) != SQLITE_OK,
                  KILN_ERR_IO, "registry database: %s", sqlite3_errmsg(db));
    sqlite3_bind_text(st, 1, name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, hex, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, scope_names[scope], -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, kiln_unix_time());
    if (expires)
        sqlite3_bind_int64(st, 5, expires);
    else
        sqlite3_bind_null(st, 5);
    KILN_CHECK_IF(rc, out, sqlite3_step(st) != SQLITE_DONE, KILN_ERR_IO, "registry database: %s",
                  sqlite3_errmsg(db));
    KILN_CHECK(rc, out, reg_audit(db, name, "token.create", NULL, NULL, NULL, NULL));
    KILN_CHECK(rc, out, reg_db_exec(db, "COMMIT"));
    in_tx = false;
    *token = t;
    t = NULL;
out:
    if (st) sqlite3_finalize(st);
    if (in_tx) (void)reg_db_exec(db, "ROLLBACK");
    reg_db_close(db);
    if (t) {
        sodium_memzero(t, strlen(t));
        free(t);
    }
    return rc;
}

/* Last used, without a write per request: the caller updates the row only when the time
 * stored is a minute old or more (REG_LAST_USED_EVERY), and the update never waits for a
 * busy database (the next request tries again). Failures are ignored: the time is advice,
 * never a reason to refuse. */
static void touch(sqlite3 *db, const char *name, int64_t now) {
    sqlite3_stmt *st = NULL;
    sqlite3_busy_timeout(db, 0);
    /* Never backwards: a request that raced a later one leaves the later time. */
    if (sqlite3_prepare_v2(db,
                           "UPDATE tokens SET last_used = ?1 WHERE name = ?2"
                           " AND (last_used IS NULL OR last_used < ?1)",
                           -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, now);
        sqlite3_bind_text(st, 2, name, -1, SQLITE_TRANSIENT);
        (void)sqlite3_step(st);
    }
    sqlite3_finalize(st);
    sqlite3_busy_timeout(db, BUSY_MS);
}

kiln_err reg_token_lookup(sqlite3 *db, const char *token, int64_t now, char **name,
                          unsigned *scopes, reg_auth_refusal *why) {
    *name = NULL;
    *scopes = 0;
    if (why) *why = REG_AUTH_UNKNOWN;
    char hex[KILN_SHA256_HEX];
    token_hash(token, hex);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT name, scope, expires, revoked, last_used FROM tokens"
                           " WHERE hash = ?1",
                           -1, &st, NULL) != SQLITE_OK)
        return reg_db_fail(db, "looking up a token");
    sqlite3_bind_text(st, 1, hex, -1, SQLITE_TRANSIENT);
    kiln_err rc = KILN_OK;
    int r = sqlite3_step(st);
    bool stale = false;
    if (r == SQLITE_ROW) {
        const char *n = (const char *)sqlite3_column_text(st, 0);
        int64_t expires = sqlite3_column_int64(st, 2), revoked = sqlite3_column_int64(st, 3);
        int64_t used = sqlite3_column_int64(st, 4);
        char at[21];
        kiln_registry_scope s;
        if (revoked) {
            fmt_time(revoked, at);
            rc = kiln_fail(KILN_ERR_AUTH, "token '%s' was revoked at %s", n, at);
            if (why) *why = REG_AUTH_REVOKED;
        } else if (expires && now >= expires) {
            fmt_time(expires, at);
            rc = kiln_fail(KILN_ERR_AUTH, "token '%s' expired at %s", n, at);
            if (why) *why = REG_AUTH_EXPIRED;
        } else if (!kiln_registry_scope_parse((const char *)sqlite3_column_text(st, 1), &s)) {
            rc = kiln_fail(KILN_ERR_FORMAT,
                           "token '%s' has an unknown scope in the registry database", n);
        } else {
            *scopes = reg_scope_bits(s);
            *name = kiln_strdup(n);
            if (!*name) rc = KILN_ERR_NOMEM;
            stale = sqlite3_column_type(st, 4) == SQLITE_NULL || used <= now - REG_LAST_USED_EVERY;
        }
    } else if (r == SQLITE_DONE) {
        rc = kiln_fail(KILN_ERR_AUTH, "unknown token");
    } else {
        rc = reg_db_fail(db, "looking up a token");
    }
    sqlite3_finalize(st);
    if (!rc && stale) touch(db, *name, now);
    return rc;
}

/* ---- list and revoke ---- */

kiln_err reg_token_list_db(sqlite3 *db, kiln_registry_token_info **out, size_t *n) {
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT name, scope, created, expires, revoked, revoke_reason, "
                           "last_used FROM tokens ORDER BY name",
                           -1, &st, NULL) != SQLITE_OK)
        return reg_db_fail(db, "listing tokens");
    kiln_registry_token_info *v = NULL;
    size_t len = 0, cap = 0;
    kiln_err rc = KILN_OK;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        if (len == cap) {
            size_t c = cap ? 2 * cap : 16;
            kiln_registry_token_info *nv = realloc(v, c * sizeof *nv);
            if (!nv) {
                rc = kiln_fail(KILN_ERR_NOMEM, "out of memory listing tokens");
                break;
            }
            v = nv;
            cap = c;
        }
        kiln_registry_token_info *t = &v[len++];
        memset(t, 0, sizeof *t);
        const char *name = (const char *)sqlite3_column_text(st, 0),
                   *scope = (const char *)sqlite3_column_text(st, 1),
                   *reason = (const char *)sqlite3_column_text(st, 5);
        snprintf(t->name, sizeof t->name, "%s", name ? name : "");
        snprintf(t->scope, sizeof t->scope, "%s", scope ? scope : "");
        t->created = sqlite3_column_int64(st, 2);
        t->expires = sqlite3_column_int64(st, 3);
        t->revoked = sqlite3_column_int64(st, 4);
        snprintf(t->reason, sizeof t->reason, "%s", reason ? reason : "");
        t->last_used = sqlite3_column_int64(st, 6);
    }
    if (!rc && r != SQLITE_DONE) rc = reg_db_fail(db, "listing tokens");
    sqlite3_finalize(st);
    if (rc) {
        free(v);
        return rc;
    }
    *out = v;
    *n = len;
    return KILN_OK;
}

kiln_err kiln_registry_token_list(const char *root, kiln_registry_token_info **out, size_t *n) {
    *out = NULL;
    *n = 0;
    KILN_TRY(reg_store_check(root)); /* a mistyped --root is refused, never made a store */
    sqlite3 *db = NULL;
    KILN_TRY(reg_db_open(root, &db));
    kiln_err rc = reg_token_list_db(db, out, n);
    reg_db_close(db);
    return rc ? kiln_errprefix(rc, "'%s': ", root) : KILN_OK;
}

kiln_registry_token_state kiln_registry_token_state_at(const kiln_registry_token_info *t,
                                                       int64_t now) {
    if (t->revoked) return KILN_TOKEN_REVOKED;
    if (t->expires && now >= t->expires) return KILN_TOKEN_EXPIRED;
    return KILN_TOKEN_ACTIVE;
}

const char *kiln_registry_token_state_name(kiln_registry_token_state s) {
    return s == KILN_TOKEN_REVOKED ? "revoked" : s == KILN_TOKEN_EXPIRED ? "expired" : "active";
}

static json_t *time_or_null(int64_t t) {
    if (!t) return json_null();
    char s[21];
    fmt_time(t, s);
    return json_string(s);
}

json_t *kiln_registry_token_json(const kiln_registry_token_info *t, size_t n, int64_t now) {
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        /* A reason that is not UTF-8 (written by something other than kiln) goes out as
         * null rather than dropping the row. */
        json_t *reason = t[i].reason[0] ? json_string(t[i].reason) : NULL;
        json_t *row = json_pack(
            "{s:s, s:s, s:o, s:o, s:s, s:o, s:o, s:o}", "name", t[i].name, "scope", t[i].scope,
            "created", time_or_null(t[i].created), "expires", time_or_null(t[i].expires), "state",
            kiln_registry_token_state_name(kiln_registry_token_state_at(&t[i], now)), "revoked",
            time_or_null(t[i].revoked), "reason", reason ? reason : json_null(), "last_used",
            time_or_null(t[i].last_used));
        if (!row || json_array_append_new(arr, row) != 0) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr ? json_pack("{s:o}", "tokens", arr) : NULL;
}

static kiln_err check_reason(const char *reason) {
    if (!reason) return KILN_OK;
    size_t n = strlen(reason);
    KILN_FAIL_IF(!n, KILN_ERR_USAGE, "the revocation's reason is empty");
    KILN_FAIL_IF(n > KILN_REGISTRY_REASON_MAX, KILN_ERR_USAGE,
                 "the revocation's reason is %zu bytes, more than %d", n, KILN_REGISTRY_REASON_MAX);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)reason[i];
        KILN_FAIL_IF(c < 0x20 || c == 0x7f, KILN_ERR_USAGE,
                     "the revocation's reason has a control character at offset %zu", i);
    }
    json_t *probe = json_string(reason); /* jansson checks UTF-8 */
    KILN_FAIL_IF(!probe, KILN_ERR_USAGE, "the revocation's reason is not UTF-8 text");
    json_decref(probe);
    return KILN_OK;
}

kiln_err kiln_registry_token_revoke(const char *root, const char *name, const char *reason,
                                    int64_t *at) {
    if (at) *at = 0;
    KILN_TRY(kiln_registry_check_name("token", name));
    KILN_TRY(check_reason(reason));
    KILN_TRY(reg_store_check(root));
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    kiln_err rc = KILN_OK;
    bool in_tx = false, found;
    int64_t revoked, now = kiln_unix_time();
    KILN_CHECK(rc, out, reg_db_open(root, &db));
    KILN_CHECK(rc, out, reg_db_exec(db, "BEGIN IMMEDIATE"));
    in_tx = true;
    KILN_CHECK(rc, out, find_name(db, name, &found, &revoked));
    KILN_CHECK_IF(rc, out, !found, KILN_ERR_NOTFOUND, "no token named '%s' in '%s'", name, root);
    if (revoked) {
        char when[21];
        fmt_time(revoked, when);
        rc = kiln_fail(KILN_ERR_CONFLICT, "token '%s' in '%s' was revoked already, at %s", name,
                       root, when);
        goto out;
    }
    KILN_CHECK_IF(rc, out,
                  sqlite3_prepare_v2(db,
                                     "UPDATE tokens SET revoked = ?1, revoke_reason = ?2"
                                     " WHERE name = ?3 AND revoked IS NULL",
                                     -1, &st, NULL) != SQLITE_OK,
                  KILN_ERR_IO, "registry database: %s", sqlite3_errmsg(db));
    sqlite3_bind_int64(st, 1, now);
    if (reason)
        sqlite3_bind_text(st, 2, reason, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, 2);
    sqlite3_bind_text(st, 3, name, -1, SQLITE_TRANSIENT);
    KILN_CHECK_IF(rc, out, sqlite3_step(st) != SQLITE_DONE || sqlite3_changes(db) != 1, KILN_ERR_IO,
                  "registry database: %s while revoking token '%s'", sqlite3_errmsg(db), name);
    KILN_CHECK(rc, out, reg_audit_reason(db, name, "token.revoke", reason));
    KILN_CHECK(rc, out, reg_db_exec(db, "COMMIT"));
    in_tx = false;
    if (at) *at = now;
out:
    if (st) sqlite3_finalize(st);
    if (in_tx) (void)reg_db_exec(db, "ROLLBACK");
    reg_db_close(db);
    return rc;
}

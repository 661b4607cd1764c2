/* store.c - the registry's store: names, SQLite metadata (schema, tokens, audit), the
 * content-addressed blob store and its lock, fsck and gc. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "registry_int.h"

/* ---- names ---- */

static kiln_err check_chars(const char *what, const char *s, bool version) {
    const char *set = version ? "[A-Za-z0-9._+-], starting with a letter or digit"
                              : "[a-z0-9._-], starting with a letter or digit";
    KILN_FAIL_IF(!s || !*s, KILN_ERR_USAGE, "%s name is empty", what);
    size_t n = strlen(s);
    KILN_FAIL_IF(n > KILN_REGISTRY_NAME_MAX, KILN_ERR_USAGE,
                 "%s name '%.64s...' is longer than %d characters", what, s,
                 KILN_REGISTRY_NAME_MAX);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  (version && c >= 'A' && c <= 'Z') ||
                  (i > 0 && (c == '.' || c == '_' || c == '-' || (version && c == '+')));
        KILN_FAIL_IF(!ok, KILN_ERR_USAGE, "%s name '%s' has a character outside %s at offset %zu",
                     what, s, set, i);
    }
    KILN_FAIL_IF(strstr(s, ".."), KILN_ERR_USAGE, "%s name '%s' contains '..'", what, s);
    return KILN_OK;
}

kiln_err kiln_registry_check_name(const char *what, const char *s) {
    return check_chars(what, s, false);
}

kiln_err reg_check_version_chars(const char *s) {
    return check_chars("version", s, true);
}

/* The naming rule (docs/registry.md, "Names"): a version begins with a digit, or with 'v' or
 * 'V' and a digit; nothing else does. So NAME@REF reads one way only, whatever a registry
 * holds or answers. */
bool kiln_registry_looks_like_version(const char *s) {
    if (!s) return false;
    if (s[0] == 'v' || s[0] == 'V') s++;
    return s[0] >= '0' && s[0] <= '9';
}

kiln_err kiln_registry_check_version(const char *s) {
    KILN_TRY(check_chars("version", s, true));
    KILN_FAIL_IF(!kiln_registry_looks_like_version(s), KILN_ERR_USAGE,
                 "version name '%s' does not look like a version: a version begins with a digit "
                 "or with 'v' and a digit (1.2.0, v2, 2026-01-05); other names are channels'",
                 s);
    return KILN_OK;
}

kiln_err kiln_registry_check_channel(const char *s) {
    KILN_TRY(check_chars("channel", s, false));
    KILN_FAIL_IF(kiln_registry_looks_like_version(s), KILN_ERR_USAGE,
                 "channel name '%s' looks like a version (it begins with a digit or with 'v' and "
                 "a digit): a channel name begins with a letter and is not v<digit>..., so that "
                 "NAME@%s can only mean one thing",
                 s, s);
    return KILN_OK;
}

kiln_err kiln_registry_ref_parse(const char *ref, char model[KILN_REGISTRY_NAME_MAX + 1],
                                 char what[KILN_REGISTRY_NAME_MAX + 1], bool *is_version) {
    model[0] = what[0] = 0;
    *is_version = false;
    const char *at = ref ? strchr(ref, '@') : NULL;
    KILN_FAIL_IF(!at || at == ref || (size_t)(at - ref) > KILN_REGISTRY_NAME_MAX || !at[1] ||
                     strlen(at + 1) > KILN_REGISTRY_NAME_MAX,
                 KILN_ERR_USAGE, "'%s' is not NAME@CHANNEL or NAME@VERSION", ref ? ref : "");
    snprintf(model, KILN_REGISTRY_NAME_MAX + 1, "%.*s", (int)(at - ref), ref);
    snprintf(what, KILN_REGISTRY_NAME_MAX + 1, "%s", at + 1);
    KILN_TRY(kiln_registry_check_name("model", model));
    *is_version = kiln_registry_looks_like_version(what);
    kiln_err rc =
        *is_version ? kiln_registry_check_version(what) : kiln_registry_check_channel(what);
    return rc ? kiln_errprefix(rc, "'%s': ", ref) : KILN_OK;
}

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

bool reg_digest_hex(const char *digest, char hex[KILN_SHA256_HEX]) {
    if (!digest || strncmp(digest, "sha256:", 7) != 0 || strlen(digest) != 7 + 64) return false;
    for (int i = 0; i < 64; i++) {
        char c = digest[7 + i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    memcpy(hex, digest + 7, 65);
    return true;
}

/* ---- SQLite ---- */

static const char *const schema =
    "CREATE TABLE IF NOT EXISTS versions("
    " model TEXT NOT NULL, version TEXT NOT NULL, digest TEXT NOT NULL, size INTEGER NOT NULL,"
    " manifest TEXT NOT NULL, signature TEXT NOT NULL, card TEXT, validation TEXT,"
    " publisher TEXT NOT NULL, created INTEGER NOT NULL, PRIMARY KEY(model, version));"
    "CREATE TABLE IF NOT EXISTS channel_records("
    " model TEXT NOT NULL, channel TEXT NOT NULL, seq INTEGER NOT NULL, version TEXT NOT NULL,"
    " digest TEXT NOT NULL, expires INTEGER NOT NULL, reason TEXT, record TEXT NOT NULL,"
    " publisher TEXT NOT NULL, created INTEGER NOT NULL, PRIMARY KEY(model, channel, seq));"
    "CREATE TABLE IF NOT EXISTS tokens("
    " name TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, scope TEXT NOT NULL, created INTEGER NOT "
    "NULL);"
    "CREATE TABLE IF NOT EXISTS audit("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, time INTEGER NOT NULL, token TEXT, action TEXT NOT "
    "NULL,"
    " model TEXT, version TEXT, channel TEXT, digest TEXT);"
    /* Signed versions of the trust policy (trustchain.c); stores made before it get it at
     * their next open. */
    "CREATE TABLE IF NOT EXISTS trust_versions("
    " version INTEGER PRIMARY KEY, document TEXT NOT NULL, publisher TEXT NOT NULL,"
    " created INTEGER NOT NULL);"
    /* The store's own facts (mirror.c): a mirror's mirror_of (the primary's URL) and how its
     * syncs went. A primary has no rows. */
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);";

/* Schema versions, kept in PRAGMA user_version. 0 is the store as the first kiln made it
 * (the tables above, no version recorded); step N brings a store from version N-1 to N. A
 * new store is made at version 0 and runs every step, so the steps an old store takes are
 * the ones every store takes. New tables go in the schema above (CREATE IF NOT EXISTS runs
 * on every open); new columns go in a new step here. */
static const char *const migrations[] = {
    NULL,
    /* 1: tokens expire, are revoked (kept, with why) and say when they were last used; an
     * audit row can say why (a revocation's reason). */
    "ALTER TABLE tokens ADD COLUMN expires INTEGER;"
    "ALTER TABLE tokens ADD COLUMN revoked INTEGER;"
    "ALTER TABLE tokens ADD COLUMN revoke_reason TEXT;"
    "ALTER TABLE tokens ADD COLUMN last_used INTEGER;"
    "ALTER TABLE audit ADD COLUMN reason TEXT;",
    /* 2: a version keeps its archive's validation.json byte for byte (provenance verifies it
     * against the signed manifest without the archive); versions stored before have NULL. */
    "ALTER TABLE versions ADD COLUMN validation_text TEXT;",
};

int reg_schema_version(void) {
    return (int)KILN_ARRAY_LEN(migrations) - 1;
}

static kiln_err read_user_version(sqlite3 *db, int *v) {
    sqlite3_stmt *st = NULL;
    *v = -1;
    if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        *v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return *v >= 0 ? KILN_OK : reg_db_fail(db, "reading the schema version");
}

/* Bring the store up to this kiln's schema in one transaction: every step's ALTERs and the
 * new version commit together or not at all. A store from a newer kiln is refused. */
static kiln_err migrate(sqlite3 *db) {
    const int want = reg_schema_version();
    int v;
    KILN_TRY(read_user_version(db, &v));
    if (v == want) return KILN_OK; /* nothing to write: the common case takes no lock */
    KILN_FAIL_IF(v > want, KILN_ERR_UNSUPPORTED,
                 "registry.db has schema version %d, newer than this kiln's %d: use a newer kiln",
                 v, want);
    KILN_TRY(reg_db_exec(db, "BEGIN IMMEDIATE"));
    kiln_err rc = read_user_version(db, &v); /* another process may have migrated meanwhile */
    if (!rc && v > want)
        rc = kiln_fail(KILN_ERR_UNSUPPORTED,
                       "registry.db has schema version %d, newer than this kiln's %d", v, want);
    for (int step = v + 1; !rc && step <= want; step++)
        rc = reg_db_exec(db, migrations[step]);
    if (!rc && v < want) {
        char sql[64];
        snprintf(sql, sizeof sql, "PRAGMA user_version = %d", want);
        rc = reg_db_exec(db, sql);
    }
    if (!rc) rc = reg_db_exec(db, "COMMIT");
    if (rc) {
        (void)reg_db_exec(db, "ROLLBACK");
        return kiln_errprefix(rc, "migrating registry.db to schema version %d: ", want);
    }
    if (v < want)
        kiln_debug("registry: migrated registry.db from schema version %d to %d", v, want);
    return KILN_OK;
}

kiln_err reg_db_fail(sqlite3 *db, const char *what) {
    int code = db ? sqlite3_errcode(db) : SQLITE_ERROR;
    if (code == SQLITE_BUSY || code == SQLITE_LOCKED)
        return kiln_fail(KILN_ERR_IO, "registry database busy while %s", what);
    if (code == SQLITE_FULL) { /* a full disk, as an I/O error's errno says it (507) */
        errno = ENOSPC;
        return kiln_fail_errno(KILN_ERR_IO, "registry database: cannot write while %s", what);
    }
    return kiln_fail(KILN_ERR_IO, "registry database: %s while %s",
                     db ? sqlite3_errmsg(db) : "cannot open", what);
}

kiln_err reg_db_exec(sqlite3 *db, const char *sql) {
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK) {
        kiln_err rc = kiln_fail(KILN_ERR_IO, "registry database: %s (running '%.40s')",
                                err ? err : "error", sql);
        sqlite3_free(err);
        return rc;
    }
    return KILN_OK;
}

/* A root is a store once it holds registry.db; a new or empty directory becomes one. Any
 * other directory is refused, so that a mistyped --root never scatters a store into it. */
kiln_err reg_root_check(const char *root) {
    kiln_dir_state st = kiln_path_dir_state(root);
    if (st == KILN_DIR_ABSENT || st == KILN_DIR_EMPTY) return KILN_OK; /* made below */
    KILN_FAIL_IF(st == KILN_DIR_OTHER, KILN_ERR_USAGE, "'%s' is not a directory it can read", root);
    char *db = kiln_path_join(root, "registry.db");
    if (!db) return KILN_ERR_NOMEM;
    bool store = kiln_path_exists(db);
    free(db);
    KILN_FAIL_IF(!store, KILN_ERR_USAGE,
                 "'%s' is not a registry store (no registry.db) and is not empty: give the "
                 "store's directory, or a new or empty one for a new store",
                 root);
    return KILN_OK;
}

kiln_err reg_db_open(const char *root, sqlite3 **out) {
    *out = NULL;
    char *blobs = kiln_path_join(root, "blobs/sha256"), *tmp = kiln_path_join(root, "tmp"),
         *path = kiln_path_join(root, "registry.db");
    kiln_err rc = KILN_OK;
    sqlite3 *db = NULL;
    KILN_CHECK_IF(rc, out, !blobs || !tmp || !path, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_mkdir_p(blobs));
    KILN_CHECK(rc, out, kiln_mkdir_p(tmp));
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK) {
        rc = kiln_fail(KILN_ERR_IO, "cannot open '%s': %s", path,
                       db ? sqlite3_errmsg(db) : "out of memory");
        goto out;
    }
    sqlite3_busy_timeout(db, 10000);
    KILN_CHECK(rc, out, reg_db_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"));
    KILN_CHECK(rc, out, reg_db_exec(db, schema));
    KILN_CHECK(rc, out, migrate(db));
out:
    if (rc) {
        if (db) sqlite3_close(db);
        db = NULL;
        kiln_errprefix(rc, "'%s': ", root);
    }
    *out = db;
    free(blobs);
    free(tmp);
    free(path);
    return rc;
}

kiln_err reg_db_connect(const char *root, sqlite3 **out) {
    *out = NULL;
    char *path = kiln_path_join(root, "registry.db");
    if (!path) return KILN_ERR_NOMEM;
    sqlite3 *db = NULL;
    kiln_err rc = KILN_OK;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK) {
        rc = kiln_fail(KILN_ERR_IO, "cannot open '%s': %s", path,
                       db ? sqlite3_errmsg(db) : "out of memory");
        if (db) sqlite3_close(db);
        db = NULL;
    } else {
        sqlite3_busy_timeout(db, 10000);
    }
    free(path);
    *out = db;
    return rc;
}

kiln_err reg_store_check(const char *root) {
    struct stat sb;
    KILN_FAIL_IF(stat(root, &sb) != 0, errno == ENOENT ? KILN_ERR_NOTFOUND : KILN_ERR_IO,
                 "'%s': %s (no registry store there)", root, strerror(errno));
    KILN_FAIL_IF(!S_ISDIR(sb.st_mode), KILN_ERR_USAGE,
                 "'%s' is not a directory (a registry store is one)", root);
    char *path = kiln_path_join(root, "registry.db");
    if (!path) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    KILN_CHECK_IF(rc, out, !kiln_path_exists(path), KILN_ERR_NOTFOUND,
                  "'%s' holds no registry (no registry.db)", root);
    /* Read-write without create, as the server connects: a reader of a WAL database may need
     * to make its -shm file. A query on sqlite_master reads the header and writes nothing. */
    int r = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
    if (r == SQLITE_OK) {
        sqlite3_busy_timeout(db, 10000);
        /* The tables every store has; trust_versions came later and is made at open, so a
         * store without it is a store. */
        r = sqlite3_prepare_v2(db,
                               "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name "
                               "IN ('versions', 'channel_records', 'tokens', 'audit')",
                               -1, &st, NULL);
    }
    if (r == SQLITE_OK) r = sqlite3_step(st);
    KILN_CHECK_IF(rc, out, r != SQLITE_ROW, KILN_ERR_FORMAT, "'%s': not a registry database: %s",
                  path, db ? sqlite3_errmsg(db) : "out of memory");
    KILN_CHECK_IF(rc, out, sqlite3_column_int(st, 0) != 4, KILN_ERR_FORMAT,
                  "'%s': not a registry database (it lacks the registry's tables)", path);
out:
    sqlite3_finalize(st);
    if (db) sqlite3_close(db);
    free(path);
    return rc;
}

void reg_db_close(sqlite3 *db) {
    if (db) sqlite3_close(db);
}

static void bind_text(sqlite3_stmt *st, int i, const char *s) {
    if (s)
        sqlite3_bind_text(st, i, s, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, i);
}

static kiln_err audit_row(sqlite3 *db, const char *token, const char *action, const char *model,
                          const char *version, const char *channel, const char *digest,
                          const char *reason) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "INSERT INTO audit(time, token, action, model, version, channel, digest,"
                           " reason) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                           -1, &st, NULL) != SQLITE_OK)
        return reg_db_fail(db, "writing the audit log");
    sqlite3_bind_int64(st, 1, kiln_unix_time());
    bind_text(st, 2, token);
    bind_text(st, 3, action);
    bind_text(st, 4, model);
    bind_text(st, 5, version);
    bind_text(st, 6, channel);
    bind_text(st, 7, digest);
    bind_text(st, 8, reason);
    int r = sqlite3_step(st);
    sqlite3_finalize(st);
    return r == SQLITE_DONE ? KILN_OK : reg_db_fail(db, "writing the audit log");
}

kiln_err reg_audit(sqlite3 *db, const char *token, const char *action, const char *model,
                   const char *version, const char *channel, const char *digest) {
    return audit_row(db, token, action, model, version, channel, digest, NULL);
}

kiln_err reg_audit_reason(sqlite3 *db, const char *token, const char *action, const char *reason) {
    return audit_row(db, token, action, NULL, NULL, NULL, NULL, reason);
}

kiln_err reg_audit_full(sqlite3 *db, const char *token, const char *action, const char *model,
                        const char *version, const char *channel, const char *digest,
                        const char *reason) {
    return audit_row(db, token, action, model, version, channel, digest, reason);
}

/* ---- versions and channel records: the server's upload and record PUT, a mirror's sync ---- */

char *reg_version_digest(sqlite3 *db, const char *model, const char *version, kiln_err *rc) {
    uint64_t size;
    return reg_version_digest_size(db, model, version, &size, rc);
}

char *reg_version_digest_size(sqlite3 *db, const char *model, const char *version, uint64_t *size,
                              kiln_err *rc) {
    *rc = KILN_OK;
    *size = 0;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT digest, size FROM versions WHERE model = ?1 AND version = ?2",
                           -1, &st, NULL) != SQLITE_OK) {
        *rc = reg_db_fail(db, "reading a version");
        return NULL;
    }
    sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, version, -1, SQLITE_TRANSIENT);
    char *d = NULL;
    int x = sqlite3_step(st);
    if (x == SQLITE_ROW) {
        d = kiln_strdup((const char *)sqlite3_column_text(st, 0));
        const int64_t n = sqlite3_column_int64(st, 1);
        *size = n > 0 ? (uint64_t)n : 0;
        if (!d) *rc = KILN_ERR_NOMEM;
    } else if (x != SQLITE_DONE) {
        *rc = reg_db_fail(db, "reading a version");
    }
    sqlite3_finalize(st);
    return d;
}

kiln_err reg_version_insert(sqlite3 *db, const reg_version_row *v, const char *audit_token,
                            const char *action, const char *reason, bool *existed) {
    kiln_err rc = KILN_OK;
    char *manifest = NULL, *card = NULL, *validation = NULL, *have = NULL;
    sqlite3_stmt *st = NULL;
    const reg_archive_meta *m = v->meta;
    *existed = false;
    KILN_TRY(reg_db_exec(db, "BEGIN IMMEDIATE"));
    have = reg_version_digest(db, v->model, v->version, &rc);
    if (rc) goto out;
    if (have) {
        *existed = true;
        KILN_CHECK_IF(rc, out, strcmp(have, v->digest) != 0, KILN_ERR_CONFLICT,
                      "'%s@%s' exists already with other bytes (%s)", v->model, v->version, have);
        goto out;
    }
    manifest = kiln_json_canonical(m->manifest);
    card = m->card ? kiln_json_canonical(m->card) : NULL;
    validation = m->validation ? kiln_json_canonical(m->validation) : NULL;
    KILN_CHECK_IF(rc, out, !manifest || (m->card && !card) || (m->validation && !validation),
                  KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK_IF(
        rc, out,
        sqlite3_prepare_v2(
            db,
            "INSERT INTO versions(model, version, digest, size, manifest, signature, card,"
            " validation, publisher, created, validation_text)"
            " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            -1, &st, NULL) != SQLITE_OK,
        KILN_ERR_IO, "registry database: %s", sqlite3_errmsg(db));
    sqlite3_bind_text(st, 1, v->model, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, v->version, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, v->digest, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)v->size);
    sqlite3_bind_text(st, 5, manifest, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 6, v->sig, (int)v->sig_len, SQLITE_TRANSIENT);
    bind_text(st, 7, card);
    bind_text(st, 8, validation);
    bind_text(st, 9, v->publisher);
    sqlite3_bind_int64(st, 10, v->created);
    if (m->validation_text)
        sqlite3_bind_text(st, 11, m->validation_text, (int)m->validation_len, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, 11);
    KILN_CHECK_IF(rc, out, sqlite3_step(st) != SQLITE_DONE, KILN_ERR_IO, "registry database: %s",
                  sqlite3_errmsg(db));
    KILN_CHECK(rc, out,
               audit_row(db, audit_token, action, v->model, v->version, NULL, v->digest, reason));
out:
    if (st) sqlite3_finalize(st);
    if (!rc) rc = reg_db_exec(db, "COMMIT");
    if (rc) (void)reg_db_exec(db, "ROLLBACK");
    free(manifest);
    free(card);
    free(validation);
    free(have);
    return rc;
}

kiln_err reg_record_insert(sqlite3 *db, const reg_record *rec, const char *text,
                           const char *publisher, int64_t created, const char *audit_token,
                           const char *action, const char *reason) {
    kiln_err rc = KILN_OK;
    sqlite3_stmt *st = NULL;
    char *have = NULL;
    KILN_TRY(reg_db_exec(db, "BEGIN IMMEDIATE"));
    KILN_CHECK_IF(
        rc, out,
        sqlite3_prepare_v2(
            db,
            "SELECT coalesce(max(seq), 0) FROM channel_records WHERE model = ?1 AND channel = ?2",
            -1, &st, NULL) != SQLITE_OK,
        KILN_ERR_IO, "registry database: %s", sqlite3_errmsg(db));
    sqlite3_bind_text(st, 1, rec->model, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, rec->channel, -1, SQLITE_TRANSIENT);
    KILN_CHECK_IF(rc, out, sqlite3_step(st) != SQLITE_ROW, KILN_ERR_IO, "registry database: %s",
                  sqlite3_errmsg(db));
    int64_t cur = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    st = NULL;
    KILN_CHECK_IF(rc, out, rec->seq != cur + 1, KILN_ERR_CONFLICT,
                  "channel record for %s/%s has seq %lld, but the next must be %lld", rec->model,
                  rec->channel, (long long)rec->seq, (long long)cur + 1);
    have = reg_version_digest(db, rec->model, rec->version, &rc);
    if (rc) goto out;
    KILN_CHECK_IF(rc, out, !have, KILN_ERR_NOTFOUND,
                  "channel record points at '%s@%s', which this registry does not hold", rec->model,
                  rec->version);
    KILN_CHECK_IF(rc, out, strcmp(have, rec->digest) != 0, KILN_ERR_VERIFY,
                  "channel record gives '%s@%s' the digest %s, but the registry holds %s",
                  rec->model, rec->version, rec->digest, have);
    KILN_CHECK_IF(
        rc, out,
        sqlite3_prepare_v2(
            db,
            "INSERT INTO channel_records(model, channel, seq, version, digest, expires, reason,"
            " record, publisher, created) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            -1, &st, NULL) != SQLITE_OK,
        KILN_ERR_IO, "registry database: %s", sqlite3_errmsg(db));
    sqlite3_bind_text(st, 1, rec->model, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, rec->channel, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 3, rec->seq);
    sqlite3_bind_text(st, 4, rec->version, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 5, rec->digest, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 6, rec->expires);
    sqlite3_bind_text(st, 7, rec->reason, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 8, text, -1, SQLITE_TRANSIENT);
    bind_text(st, 9, publisher);
    sqlite3_bind_int64(st, 10, created);
    KILN_CHECK_IF(rc, out, sqlite3_step(st) != SQLITE_DONE, KILN_ERR_IO, "registry database: %s",
                  sqlite3_errmsg(db));
    if (!action) action = strcmp(rec->reason, "rollback") ? "promote" : "rollback";
    /* The audit's reason: the caller's (a mirror's source), else the record's own (signed). */
    KILN_CHECK(rc, out,
               audit_row(db, audit_token, action, rec->model, rec->version, rec->channel,
                         rec->digest, reason ? reason : rec->reason));
out:
    if (st) sqlite3_finalize(st);
    if (!rc) rc = reg_db_exec(db, "COMMIT");
    if (rc) (void)reg_db_exec(db, "ROLLBACK");
    free(have);
    return rc;
}

/* ---- blobs ---- */

char *reg_blob_path(const char *root, const char *hex) {
    return kiln_asprintf("%s/blobs/sha256/%.2s/%s", root, hex, hex);
}

kiln_err reg_upload_begin(reg_upload *u, const char *root) {
    memset(u, 0, sizeof *u);
    u->fd = -1;
    u->root = kiln_strdup(root);
    char *tmpdir = kiln_path_join(root, "tmp");
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !u->root || !tmpdir, KILN_ERR_NOMEM, "out of memory");
    u->fd = open(tmpdir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0644);
    if (u->fd < 0) {
        /* No unnamed files here: a named one, which fsck and the next server start clean up
         * after a crash. */
        u->tmp = kiln_asprintf("%s/upload-XXXXXX", tmpdir);
        KILN_CHECK_IF(rc, out, !u->tmp, KILN_ERR_NOMEM, "out of memory");
        u->fd = mkostemp(u->tmp, O_CLOEXEC);
        if (u->fd < 0) {
            rc = kiln_fail_errno(KILN_ERR_IO, "cannot create a temporary file in '%s'", tmpdir);
            free(u->tmp);
            u->tmp = NULL;
            goto out;
        }
    }
    kiln_sha256_init(&u->sha);
out:
    free(tmpdir);
    if (rc) reg_upload_abort(u);
    return rc;
}

kiln_err reg_upload_write(reg_upload *u, const void *data, size_t len) {
    kiln_sha256_update(&u->sha, data, len);
    u->size += len;
    const char *p = data;
    while (len) {
        ssize_t n = write(u->fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
            return kiln_fail_errno(KILN_ERR_IO,
                                   "cannot write an upload's temporary file in '%s/tmp'", u->root);
        p += n;
        len -= (size_t)n;
    }
    return KILN_OK;
}

kiln_err reg_upload_check(reg_upload *u, const char *hex, uint64_t size) {
    uint8_t h[KILN_SHA256_BYTES];
    char got[KILN_SHA256_HEX];
    kiln_sha256_final(&u->sha, h);
    kiln_hex(h, sizeof h, got);
    KILN_FAIL_IF(u->size != size, KILN_ERR_VERIFY, "upload is %llu bytes, but %llu were declared",
                 (unsigned long long)u->size, (unsigned long long)size);
    KILN_FAIL_IF(strcmp(got, hex) != 0, KILN_ERR_VERIFY,
                 "upload hashes to sha256:%s, but sha256:%s was declared", got, hex);
    return KILN_OK;
}

char *reg_upload_path(const reg_upload *u) {
    return u->tmp ? kiln_strdup(u->tmp) : kiln_asprintf("/proc/self/fd/%d", u->fd);
}

kiln_err reg_upload_commit(reg_upload *u, const char *hex) {
    char *path = reg_blob_path(u->root, hex), *dir = path ? kiln_dirname(path) : NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !path || !dir, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK_IF(rc, out, fsync(u->fd) != 0, KILN_ERR_IO, "cannot fsync an upload in '%s/tmp'",
                  u->root);
    KILN_CHECK(rc, out, kiln_mkdir_p(dir));
    int r;
    if (u->tmp) {
        r = link(u->tmp, path);
    } else {
        char proc[64];
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", u->fd);
        r = linkat(AT_FDCWD, proc, AT_FDCWD, path, AT_SYMLINK_FOLLOW);
    }
    /* The same digest stored already is the same bytes: keep the one there. */
    if (r != 0 && errno != EEXIST) {
        rc = kiln_fail_errno(KILN_ERR_IO, "cannot move an upload to '%s'", path);
        goto out;
    }
    KILN_CHECK(rc, out, kiln_fsync_dir(dir));
out:
    free(path);
    free(dir);
    if (!rc) reg_upload_abort(u);
    return rc;
}

kiln_err reg_upload_adopt(reg_upload *u, const char *root, const char *path) {
    memset(u, 0, sizeof *u);
    u->root = kiln_strdup(root);
    u->tmp = kiln_strdup(path);
    u->fd = u->root && u->tmp ? open(path, O_RDWR | O_CLOEXEC) : -1;
    if (u->fd >= 0) return KILN_OK;
    kiln_err rc = !u->root || !u->tmp ? kiln_fail(KILN_ERR_NOMEM, "out of memory")
                                      : kiln_fail_errno(KILN_ERR_IO, "cannot open '%s'", path);
    free(u->root);
    free(u->tmp);
    memset(u, 0, sizeof *u);
    u->fd = -1;
    return rc;
}

void reg_upload_abort(reg_upload *u) {
    if (u->fd >= 0) close(u->fd);
    u->fd = -1;
    if (u->tmp) unlink(u->tmp);
    free(u->tmp);
    free(u->root);
    u->tmp = NULL;
    u->root = NULL;
}

kiln_err reg_lock(const char *root, int *out) {
    return reg_lock_named(root, "lock", out);
}

kiln_err reg_lock_named(const char *root, const char *name, int *out) {
    *out = -1;
    KILN_TRY(kiln_mkdir_p(root));
    char *path = kiln_path_join(root, name);
    if (!path) return KILN_ERR_NOMEM;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        kiln_err rc = kiln_fail_errno(KILN_ERR_IO, "cannot open '%s'", path);
        free(path);
        return rc;
    }
    free(path);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        return KILN_OK; /* busy: *out stays -1 */
    }
    *out = fd;
    return KILN_OK;
}

void reg_unlock(int fd) {
    if (fd >= 0) close(fd);
}

/* ---- fsck and gc ---- */

typedef struct {
    void (*report)(void *, const char *);
    void *ctx;
    size_t n;
} problems;

static void problem(problems *p, const char *fmt, ...) KILN_PRINTF(2, 3);
static void problem(problems *p, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    p->n++;
    if (p->report) p->report(p->ctx, line);
}

/* Every version's blob: present, its size, its digest, and (with a policy) its signatures as
 * sign/ verifies them on upload, under some version of the trust chain (the one the server
 * held when it took the upload may since have been followed by another). */
static kiln_err fsck_versions(const char *root, sqlite3 *db, const reg_trust_chain *chain,
                              problems *p) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT model, version, digest, size, signature FROM versions"
                           " ORDER BY model, version",
                           -1, &st, NULL) != SQLITE_OK)
        return reg_db_fail(db, "reading versions");
    kiln_err rc = KILN_OK;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        const char *m = (const char *)sqlite3_column_text(st, 0),
                   *v = (const char *)sqlite3_column_text(st, 1),
                   *d = (const char *)sqlite3_column_text(st, 2);
        int64_t size = sqlite3_column_int64(st, 3);
        char hex[KILN_SHA256_HEX];
        if (!reg_digest_hex(d, hex)) {
            problem(p, "%s@%s: digest '%s' is not sha256:<64 hex digits>", m, v, d ? d : "");
            continue;
        }
        char *path = reg_blob_path(root, hex);
        if (!path) {
            rc = KILN_ERR_NOMEM;
            break;
        }
        struct stat sb;
        uint8_t h[KILN_SHA256_BYTES];
        char got[KILN_SHA256_HEX];
        if (stat(path, &sb) != 0) {
            problem(p, "%s@%s: blob '%s' is missing", m, v, path);
        } else if (sb.st_size != size) {
            problem(p, "%s@%s: blob '%s' is %lld bytes, the version says %lld", m, v, path,
                    (long long)sb.st_size, (long long)size);
        } else if (kiln_sha256_file(path, h) != KILN_OK) {
            problem(p, "%s@%s: %s", m, v, kiln_errmsg());
        } else {
            kiln_hex(h, sizeof h, got);
            const char *sig = (const char *)sqlite3_column_text(st, 4);
            char label[200];
            snprintf(label, sizeof label, "%s@%s's signature", m, v);
            if (strcmp(got, hex) != 0)
                problem(p, "%s@%s: blob '%s' hashes to sha256:%s", m, v, path, got);
            else if (chain->n) {
                /* Newest first: the message, when none verifies, is the newest policy's. */
                bool ok = false;
                char msg[1024] = "";
                for (size_t i = chain->n; i-- > 0 && !ok;) {
                    ok = kiln_sign_verify_archive_sigs(path, sig ? sig : "", sig ? strlen(sig) : 0,
                                                       label, chain->v[i], NULL) == KILN_OK;
                    if (!ok && !msg[0]) snprintf(msg, sizeof msg, "%s", kiln_errmsg());
                }
                if (!ok) problem(p, "%s@%s: %s", m, v, msg);
            }
        }
        free(path);
    }
    if (!rc && r != SQLITE_DONE) rc = reg_db_fail(db, "reading versions");
    sqlite3_finalize(st);
    return rc;
}

/* Every channel record: its seq follows the one before, its version is stored with its
 * digest, and it verifies: a channel's current record under the newest trust version (what
 * clients pull under), an older one under some version of the chain. */
static kiln_err fsck_channels(sqlite3 *db, const reg_trust_chain *chain, problems *p) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(
            db,
            "SELECT c.model, c.channel, c.seq, c.version, c.digest, c.record, v.digest,"
            " c.seq = (SELECT max(seq) FROM channel_records d"
            "          WHERE d.model = c.model AND d.channel = c.channel)"
            " FROM channel_records c LEFT JOIN versions v ON v.model = c.model AND v.version = "
            "c.version"
            " ORDER BY c.model, c.channel, c.seq",
            -1, &st, NULL) != SQLITE_OK)
        return reg_db_fail(db, "reading channel records");
    int r;
    char prev[2 * KILN_REGISTRY_NAME_MAX + 2] = "";
    int64_t prev_seq = 0;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        const char *m = (const char *)sqlite3_column_text(st, 0),
                   *c = (const char *)sqlite3_column_text(st, 1),
                   *v = (const char *)sqlite3_column_text(st, 3),
                   *d = (const char *)sqlite3_column_text(st, 4),
                   *text = (const char *)sqlite3_column_text(st, 5),
                   *vd = (const char *)sqlite3_column_text(st, 6);
        int64_t seq = sqlite3_column_int64(st, 2);
        /* Records of a channel run 1, 2, 3...: a gap is a record lost or removed. */
        char key[sizeof prev];
        snprintf(key, sizeof key, "%.64s/%.64s", m, c);
        if (strcmp(key, prev) != 0) prev_seq = 0;
        if (seq != prev_seq + 1)
            problem(p, "%s channel %s: seq %lld follows %lld", m, c, (long long)seq,
                    (long long)prev_seq);
        snprintf(prev, sizeof prev, "%s", key);
        prev_seq = seq;
        if (!vd)
            problem(p, "%s channel %s seq %lld: points at version '%s', which the store lacks", m,
                    c, (long long)seq, v);
        else if (strcmp(vd, d) != 0)
            problem(p, "%s channel %s seq %lld: digest %s differs from version %s's %s", m, c,
                    (long long)seq, d, v, vd);
        if (!chain->n) {
            problem(p,
                    "%s channel %s seq %lld: no trust policy to verify the record with (--trust)",
                    m, c, (long long)seq);
            continue;
        }
        reg_record rec;
        char label[200], msg[1024] = "";
        snprintf(label, sizeof label, "%s channel %s seq %lld", m, c, (long long)seq);
        bool current = sqlite3_column_int(st, 7) != 0, ok = false;
        for (size_t i = chain->n; i-- > 0 && !ok && (!current || i == chain->n - 1);) {
            ok = reg_record_verify(chain->v[i], text, strlen(text), label, &rec) == KILN_OK;
            if (!ok && !msg[0]) snprintf(msg, sizeof msg, "%s", kiln_errmsg());
        }
        if (!ok && current && chain->n > 1)
            problem(p, "%s (the channel's current record, under trust version %llu)", msg,
                    (unsigned long long)kiln_sign_trust_version(chain->v[chain->n - 1]));
        else if (!ok)
            problem(p, "%s", msg);
        else if (strcmp(rec.model, m) || strcmp(rec.channel, c) || rec.seq != seq ||
                 strcmp(rec.version, v) || strcmp(rec.digest, d))
            problem(p, "%s: the signed record's fields differ from the database's", label);
        else if (current && kiln_sign_trust_withdrawn(chain->v[chain->n - 1], d))
            problem(p,
                    "%s: the channel's current record names %s@%s (%s), which trust policy "
                    "version %llu withdrew: %s (no client installs it: move the channel)",
                    label, m, v, d,
                    (unsigned long long)kiln_sign_trust_version(chain->v[chain->n - 1]),
                    kiln_sign_trust_withdrawn(chain->v[chain->n - 1], d));
    }
    kiln_err rc = r == SQLITE_DONE ? KILN_OK : reg_db_fail(db, "reading channel records");
    sqlite3_finalize(st);
    return rc;
}

static void fsck_report(void *ctx, const char *line) {
    problem(ctx, "%s", line);
}

/* Tokens: a scope the server knows (another makes every request with the token fail) and a
 * hash of the form create writes. */
static kiln_err fsck_tokens(sqlite3 *db, problems *p) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT name, scope, hash FROM tokens ORDER BY name", -1, &st,
                           NULL) != SQLITE_OK)
        return reg_db_fail(db, "reading tokens");
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        const char *n = (const char *)sqlite3_column_text(st, 0),
                   *scope = (const char *)sqlite3_column_text(st, 1),
                   *hash = (const char *)sqlite3_column_text(st, 2);
        kiln_registry_scope s;
        char digest[80], hex[KILN_SHA256_HEX];
        snprintf(digest, sizeof digest, "sha256:%.70s", hash ? hash : "");
        if (!kiln_registry_scope_parse(scope, &s))
            problem(p, "token '%s': scope '%s' is not one of read, publish, promote, admin",
                    n ? n : "", scope ? scope : "");
        if (!reg_digest_hex(digest, hex))
            problem(p, "token '%s': its hash is not 64 lowercase hex digits", n ? n : "");
    }
    kiln_err rc = r == SQLITE_DONE ? KILN_OK : reg_db_fail(db, "reading tokens");
    sqlite3_finalize(st);
    return rc;
}

static kiln_err fsck_tmp(const char *root, problems *p) {
    int lock;
    KILN_TRY(reg_lock(root, &lock));
    if (lock < 0) return KILN_OK; /* a server runs: its temporaries are uploads in flight */
    char *dir = kiln_path_join(root, "tmp");
    DIR *d = dir ? opendir(dir) : NULL;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
                problem(p, "orphaned temporary '%s/%s' (no server holds the store)", dir,
                        e->d_name);
        closedir(d);
    }
    free(dir);
    reg_unlock(lock);
    return KILN_OK;
}

kiln_err kiln_registry_fsck(const char *root, const char *trust_path,
                            void (*report)(void *ctx, const char *problem), void *ctx,
                            size_t *count) {
    problems p = {report, ctx, 0};
    reg_trust_chain chain = {0};
    *count = 0;
    KILN_TRY(reg_store_check(root));
    sqlite3 *db = NULL;
    kiln_sign_trust *trust = NULL;
    kiln_err rc = KILN_OK;
    char *def = NULL;
    KILN_CHECK(rc, out, reg_db_open(root, &db));
    if (!trust_path) {
        def = kiln_path_join(root, "trust.json");
        if (def && kiln_path_exists(def)) trust_path = def;
    }
    if (trust_path) {
        KILN_CHECK(rc, out, kiln_sign_trust_load(trust_path, &trust));
        /* The stored versions of the policy above the given one, each verified as the
         * successor of the one before; a problem ends the chain there. */
        kiln_sign_trust *start = trust;
        trust = NULL;
        KILN_CHECK(rc, out, reg_trust_chain_load(db, root, start, trust_path, fsck_report, &p, &chain));
    }
    KILN_CHECK(rc, out, fsck_versions(root, db, &chain, &p));
    KILN_CHECK(rc, out, fsck_channels(db, &chain, &p));
    KILN_CHECK(rc, out, fsck_tokens(db, &p));
    KILN_CHECK(rc, out, fsck_tmp(root, &p));
    *count = p.n;
    if (p.n)
        rc =
            kiln_fail(KILN_ERR_VERIFY, "'%s': %zu problem%s found", root, p.n, p.n == 1 ? "" : "s");
out:
    free(def);
    kiln_sign_trust_free(trust);
    reg_trust_chain_release(&chain);
    reg_db_close(db);
    return rc;
}

static bool referenced(sqlite3_stmt *st, const char *hex) {
    char digest[72];
    snprintf(digest, sizeof digest, "sha256:%s", hex);
    sqlite3_reset(st);
    sqlite3_bind_text(st, 1, digest, -1, SQLITE_TRANSIENT);
    /* Anything but a clean "no row" keeps the blob: gc must never delete on doubt. */
    return sqlite3_step(st) != SQLITE_DONE;
}

kiln_err kiln_registry_gc(const char *root, size_t *removed, uint64_t *bytes) {
    *removed = 0;
    *bytes = 0;
    KILN_TRY(reg_store_check(root)); /* gc never makes a store: a mistyped --root is refused */
    int lock;
    KILN_TRY(reg_lock(root, &lock));
    KILN_FAIL_IF(lock < 0, KILN_ERR_CONFLICT, "'%s' is held by a running server; stop it before gc",
                 root);
    /* A mirror's sync links a blob before it inserts the version that references it. */
    int mlock;
    kiln_err mrc = reg_lock_named(root, REG_MIRROR_LOCK, &mlock);
    if (mrc || mlock < 0) {
        reg_unlock(lock);
        KILN_TRY(mrc);
        return kiln_fail(KILN_ERR_CONFLICT,
                         "'%s' is being synced by kiln registry mirror; run gc after the sync",
                         root);
    }
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    char *top = NULL;
    DIR *d1 = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK(rc, out, reg_db_open(root, &db));
    KILN_CHECK_IF(rc, out,
                  sqlite3_prepare_v2(db, "SELECT 1 FROM versions WHERE digest = ?1 LIMIT 1", -1,
                                     &st, NULL) != SQLITE_OK,
                  KILN_ERR_IO, "registry database: %s", sqlite3_errmsg(db));
    top = kiln_path_join(root, "blobs/sha256");
    KILN_CHECK_IF(rc, out, !top, KILN_ERR_NOMEM, "out of memory");
    d1 = opendir(top);
    KILN_CHECK_IF(rc, out, !d1, KILN_ERR_IO, "cannot open '%s'", top);
    struct dirent *e1;
    while ((e1 = readdir(d1))) {
        if (e1->d_name[0] == '.') continue;
        char *sub = kiln_path_join(top, e1->d_name);
        DIR *d2 = sub ? opendir(sub) : NULL;
        if (!d2) {
            free(sub);
            continue;
        }
        struct dirent *e2;
        while ((e2 = readdir(d2))) {
            if (e2->d_name[0] == '.' || strlen(e2->d_name) != 64) continue;
            char hex[KILN_SHA256_HEX], digest[80];
            snprintf(digest, sizeof digest, "sha256:%.64s", e2->d_name);
            if (!reg_digest_hex(digest, hex) || referenced(st, hex)) continue;
            char *path = kiln_path_join(sub, e2->d_name);
            struct stat sb;
            if (path && stat(path, &sb) == 0 && unlink(path) == 0) {
                (*removed)++;
                *bytes += (uint64_t)sb.st_size;
            }
            free(path);
        }
        closedir(d2);
        free(sub);
    }
    if (*removed) {
        sqlite3_finalize(st);
        st = NULL;
        KILN_CHECK(rc, out, reg_db_exec(db, "BEGIN IMMEDIATE"));
        rc = reg_audit(db, NULL, "gc", NULL, NULL, NULL, NULL);
        KILN_CHECK(rc, out, rc ? (reg_db_exec(db, "ROLLBACK"), rc) : reg_db_exec(db, "COMMIT"));
    }
out:
    if (d1) closedir(d1);
    free(top);
    if (st) sqlite3_finalize(st);
    reg_db_close(db);
    reg_unlock(mlock);
    reg_unlock(lock);
    return rc;
}

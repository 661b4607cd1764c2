/* store.c - the registry's store: SQLite metadata (schema, tokens, audit), the
 * content-addressed blob store and its lock (fsck and gc: fsck.c). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server_int.h"

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
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    /* Datasets by the sha256 of their bytes (kiln data publish), their blobs beside the
     * archives'; stores made before it get it at their next open. */
    "CREATE TABLE IF NOT EXISTS datasets("
    " name TEXT NOT NULL, digest TEXT NOT NULL, size INTEGER NOT NULL, signature TEXT NOT NULL,"
    " publisher TEXT NOT NULL, created INTEGER NOT NULL, PRIMARY KEY(name, digest));"
    /* Reproduction records (kiln reproduce --sign): the record's text and its signature as
     * verified on upload, and again by whoever reads them. */
    "CREATE TABLE IF NOT EXISTS reproductions("
    " model TEXT NOT NULL, version TEXT NOT NULL, digest TEXT NOT NULL, signer TEXT NOT NULL,"
    " verdict TEXT NOT NULL, record TEXT NOT NULL, signature TEXT NOT NULL,"
    " publisher TEXT NOT NULL, created INTEGER NOT NULL, UNIQUE(model, version, record, signature));";

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

kiln_err reg_dataset_insert(sqlite3 *db, const reg_dataset_row *d, bool *existed) {
    kiln_err rc = KILN_OK;
    sqlite3_stmt *st = NULL;
    *existed = false;
    KILN_TRY(reg_db_exec(db, "BEGIN IMMEDIATE"));
    KILN_CHECK_IF(rc, out,
                  sqlite3_prepare_v2(db,
                                     "INSERT INTO datasets(name, digest, size, signature, "
                                     "publisher, created) VALUES(?1, ?2, ?3, ?4, ?5, ?6) ON "
                                     "CONFLICT(name, digest) DO NOTHING",
                                     -1, &st, NULL) != SQLITE_OK,
                  KILN_ERR_IO, "registry database: %s", sqlite3_errmsg(db));
    sqlite3_bind_text(st, 1, d->name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, d->digest, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)d->size);
    sqlite3_bind_text(st, 4, d->sig, (int)d->sig_len, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 5, d->publisher, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 6, d->created);
    KILN_CHECK_IF(rc, out, sqlite3_step(st) != SQLITE_DONE, KILN_ERR_IO, "registry database: %s",
                  sqlite3_errmsg(db));
    *existed = sqlite3_changes(db) == 0;
    if (!*existed)
        KILN_CHECK(rc, out,
                   audit_row(db, d->publisher, "data.publish", d->name, NULL, NULL, d->digest,
                             NULL));
out:
    if (st) sqlite3_finalize(st);
    if (!rc) rc = reg_db_exec(db, "COMMIT");
    if (rc) (void)reg_db_exec(db, "ROLLBACK");
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

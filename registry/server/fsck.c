/* fsck.c - kiln registry fsck and gc: a store checked against its own records (blobs,
 * versions, channel records under the trust chain, tokens, temporaries), and the blobs no
 * version names removed under the store's locks. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server_int.h"

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
    kiln_digest digest;
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
                  sqlite3_prepare_v2(db,
                                     "SELECT 1 FROM versions WHERE digest = ?1 UNION ALL "
                                     "SELECT 1 FROM datasets WHERE digest = ?1 LIMIT 1",
                                     -1, &st, NULL) != SQLITE_OK,
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

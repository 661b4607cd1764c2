/* trustchain.c - versions of the trust policy as the registry keeps them: the store's table
 * of signed versions and the chain a server walks at start (and fsck checks). Every step is
 * sign/'s kiln_sign_trust_update: a version is accepted only as the successor of the one
 * already trusted. The client's walk is client/trustwalk.c. */
#include <stdlib.h>
#include <string.h>

#include "server_int.h"

bool reg_trust_version_parse(const char *s, uint64_t *v) {
    size_t n = strlen(s);
    if (n == 0 || n > 16 || s[0] == '0') return false;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        x = x * 10 + (uint64_t)(s[i] - '0');
    }
    if (x > KILN_SIGN_TRUST_VERSION_MAX) return false;
    *v = x;
    return true;
}

/* ---- the store ---- */

kiln_err reg_trust_get(sqlite3 *db, uint64_t v, char **doc, size_t *len) {
    *doc = NULL;
    *len = 0;
    sqlite3_stmt *st = NULL;
    const char *sql = v ? "SELECT document FROM trust_versions WHERE version = ?1"
                        : "SELECT document FROM trust_versions ORDER BY version DESC LIMIT 1";
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        return reg_db_fail(db, "reading trust versions");
    if (v) sqlite3_bind_int64(st, 1, (sqlite3_int64)v);
    kiln_err rc = KILN_OK;
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) {
        int n = sqlite3_column_bytes(st, 0);
        const void *p = sqlite3_column_blob(st, 0);
        *doc = kiln_malloc((size_t)n + 1);
        if (*doc) {
            if (n) memcpy(*doc, p, (size_t)n);
            (*doc)[n] = 0;
            *len = (size_t)n;
        } else {
            rc = KILN_ERR_NOMEM;
        }
    } else if (r == SQLITE_DONE) {
        rc = v ? kiln_fail(KILN_ERR_NOTFOUND, "trust version %llu not found", (unsigned long long)v)
               : kiln_fail(KILN_ERR_NOTFOUND, "this registry holds no trust versions");
    } else {
        rc = reg_db_fail(db, "reading trust versions");
    }
    sqlite3_finalize(st);
    return rc;
}

kiln_err reg_trust_store(sqlite3 *db, uint64_t v, const char *doc, size_t len, const char *token,
                         const char *action, const char *reason) {
    sqlite3_stmt *st = NULL;
    KILN_TRY(reg_db_exec(db, "BEGIN IMMEDIATE"));
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out,
                  sqlite3_prepare_v2(db,
                                     "INSERT INTO trust_versions(version, document, publisher, "
                                     "created) VALUES(?1, ?2, ?3, ?4)",
                                     -1, &st, NULL) != SQLITE_OK,
                  KILN_ERR_IO, "registry database: %s", sqlite3_errmsg(db));
    sqlite3_bind_int64(st, 1, (sqlite3_int64)v);
    sqlite3_bind_text(st, 2, doc, (int)len, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, token ? token : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 4, kiln_unix_time());
    int r = sqlite3_step(st);
    /* Only the key's constraint means the version is there: any other (a trigger's RAISE, a
     * CHECK) is the store refusing, said in its own words. */
    KILN_CHECK_IF(rc, out,
                  r == SQLITE_CONSTRAINT &&
                      sqlite3_extended_errcode(db) == SQLITE_CONSTRAINT_PRIMARYKEY,
                  KILN_ERR_CONFLICT, "trust version %llu is stored already", (unsigned long long)v);
    KILN_CHECK_IF(rc, out, r != SQLITE_DONE, KILN_ERR_IO, "registry database: %s",
                  sqlite3_errmsg(db));
    uint8_t h[KILN_SHA256_BYTES];
    char hex[KILN_SHA256_HEX], digest[80], ver[24];
    kiln_sha256(doc, len, h);
    kiln_hex(h, sizeof h, hex);
    snprintf(digest, sizeof digest, "sha256:%s", hex);
    snprintf(ver, sizeof ver, "%llu", (unsigned long long)v);
    KILN_CHECK(rc, out, reg_audit_full(db, token, action, NULL, ver, NULL, digest, reason));
out:
    if (st) sqlite3_finalize(st);
    if (!rc) rc = reg_db_exec(db, "COMMIT");
    if (rc) (void)reg_db_exec(db, "ROLLBACK");
    return rc;
}

/* ---- the chain a server walks and fsck checks ---- */

void reg_trust_chain_release(reg_trust_chain *c) {
    for (size_t i = 0; i < c->n; i++)
        kiln_sign_trust_free(c->v[i]);
    free(c->v);
    c->v = NULL;
    c->n = 0;
}

kiln_sign_trust *reg_trust_chain_take_newest(reg_trust_chain *c) {
    return c->n ? c->v[--c->n] : NULL;
}

static kiln_err chain_push(reg_trust_chain *c, kiln_sign_trust *t) {
    kiln_sign_trust **nv = realloc(c->v, (c->n + 1) * sizeof *nv);
    if (!nv) {
        kiln_sign_trust_free(t);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    c->v = nv;
    c->v[c->n++] = t;
    return KILN_OK;
}

/* A problem with the stored chain: reported (fsck) or the error. */
static kiln_err chain_problem(void (*report)(void *, const char *), void *ctx, kiln_err rc,
                              const char *fmt, ...) KILN_PRINTF(4, 5);
static kiln_err chain_problem(void (*report)(void *, const char *), void *ctx, kiln_err rc,
                              const char *fmt, ...) {
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (report) {
        report(ctx, msg);
        return KILN_OK;
    }
    return kiln_fail(rc, "%s", msg);
}

kiln_err reg_trust_chain_load(sqlite3 *db, const char *root, kiln_sign_trust *start,
                              const char *start_label,
                              void (*report)(void *ctx, const char *problem), void *ctx,
                              reg_trust_chain *out) {
    memset(out, 0, sizeof *out);
    uint64_t sv = kiln_sign_trust_version(start);
    KILN_TRY(chain_push(out, start));
    sqlite3_stmt *st = NULL;
    kiln_err rc = KILN_OK;
    bool walking = true;
    if (sqlite3_prepare_v2(db, "SELECT version, document FROM trust_versions ORDER BY version", -1,
                           &st, NULL) != SQLITE_OK) {
        rc = reg_db_fail(db, "reading trust versions");
        goto out;
    }
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        sqlite3_int64 v = sqlite3_column_int64(st, 0);
        const char *doc = (const char *)sqlite3_column_blob(st, 1);
        size_t len = (size_t)sqlite3_column_bytes(st, 1);
        char label[128];
        snprintf(label, sizeof label, "%s/registry.db: trust version %lld", root, (long long)v);
        const kiln_sign_trust *cur = out->v[out->n - 1];
        uint64_t cv = kiln_sign_trust_version(cur);
        if (v > 0 && (uint64_t)v == sv) {
            /* The stored copy of the start's own version is what clients below it walk to:
             * it must be the same policy. */
            kiln_sign_trust *t = NULL;
            char sl[1200];
            snprintf(sl, sizeof sl, "'%s'", start_label);
            kiln_err prc = kiln_sign_trust_parse(doc ? doc : "", len, label, &t);
            if (prc == KILN_OK && kiln_sign_trust_version(t) != sv)
                prc = kiln_fail(KILN_ERR_VERIFY, "'%s' holds version %llu", label,
                                (unsigned long long)kiln_sign_trust_version(t));
            if (prc == KILN_OK) {
                char ol[160];
                snprintf(ol, sizeof ol, "'%s'", label);
                prc = reg_trust_same_version(start, sl, t, ol);
            }
            kiln_sign_trust_free(t);
            if (prc == KILN_ERR_NOMEM) {
                rc = prc;
                goto out;
            }
            if (prc) KILN_CHECK(rc, out, chain_problem(report, ctx, prc, "%s", kiln_errmsg()));
            continue;
        }
        if (v <= 0 || (uint64_t)v <= cv || !walking) {
            if (!report) continue;
            /* fsck reads every row: it must parse as the version its row says. */
            kiln_sign_trust *t = NULL;
            if (kiln_sign_trust_parse(doc ? doc : "", len, label, &t) != KILN_OK)
                report(ctx, kiln_errmsg());
            else if (kiln_sign_trust_version(t) != (uint64_t)v)
                chain_problem(report, ctx, KILN_ERR_VERIFY, "'%s' holds version %llu", label,
                              (unsigned long long)kiln_sign_trust_version(t));
            kiln_sign_trust_free(t);
            continue;
        }
        if ((uint64_t)v != cv + 1) {
            KILN_CHECK(rc, out,
                       chain_problem(report, ctx, KILN_ERR_VERIFY,
                                     "'%s': the store holds trust version %lld but not version "
                                     "%llu: its chain of trust versions has a gap",
                                     root, (long long)v, (unsigned long long)cv + 1));
            walking = false;
            continue;
        }
        kiln_sign_trust *next = NULL;
        if (kiln_sign_trust_update(cur, doc ? doc : "", len, label, &next, NULL) != KILN_OK) {
            KILN_CHECK(rc, out,
                       chain_problem(report, ctx, KILN_ERR_VERIFY,
                                     "%s (as the successor of version %llu)", kiln_errmsg(),
                                     (unsigned long long)cv));
            walking = false;
            continue;
        }
        KILN_CHECK(rc, out, chain_push(out, next));
    }
    if (r != SQLITE_DONE) rc = reg_db_fail(db, "reading trust versions");
out:
    sqlite3_finalize(st);
    if (rc) reg_trust_chain_release(out);
    return rc;
}

/* trustchain.c - versions of the trust policy as the registry keeps them and clients follow
 * them: the store's table of signed versions, the chain a server walks at start (and fsck
 * checks), and the client's walk from its configured policy through its state directory and
 * the registry. Every step is sign/'s kiln_sign_trust_update: a version is accepted only as
 * the successor of the one already trusted, so neither the registry nor the state directory
 * can put a policy in front of a client that its root keys did not sign. */
#include <stdlib.h>
#include <string.h>

#include "registry_int.h"

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

kiln_err reg_trust_insert(sqlite3 *db, uint64_t v, const char *doc, size_t len,
                          const char *token) {
    return reg_trust_store(db, v, doc, len, token, "trust.put", NULL);
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

/* A policy that claims the version of one this side trusts: the same policy (its meaning:
 * layout and signatures may differ), or two versions of one number exist, a fork. Returns
 * VERIFY with the message naming both and the first difference. */
static kiln_err same_version(const kiln_sign_trust *have, const char *have_label,
                             const kiln_sign_trust *other, const char *other_label) {
    char *diff = kiln_sign_trust_diff(have, other);
    if (!diff) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    if (*diff)
        rc = kiln_fail(KILN_ERR_VERIFY,
                       "%s is trust version %llu, and so is %s, but they are different policies "
                       "(%.*s): two versions %llu were signed (or one was altered), a fork that "
                       "the root key holders must resolve",
                       other_label, (unsigned long long)kiln_sign_trust_version(other), have_label,
                       (int)strcspn(diff, "\n"), diff,
                       (unsigned long long)kiln_sign_trust_version(other));
    free(diff);
    return rc;
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
                prc = same_version(start, sl, t, ol);
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

/* ---- the client's walk ---- */

typedef struct walk {
    void (*on_step)(void *ctx, const kiln_registry_trust_step *s);
    void *ctx;
    char from[640]; /* where the policy walked to so far came from, quoted */
} walk;

/* Accept doc as the successor of *cur (replaced by it on success), save it to save (when not
 * NULL: verified, then saved, then used, so that state only ever holds versions that
 * verified) and tell on_step. */
static kiln_err walk_step(walk *w, kiln_sign_trust **cur, const char *doc, size_t len,
                          const char *label, const char *source, const char *save) {
    kiln_sign_trust *next = NULL;
    kiln_sign_trust_update_result res;
    kiln_err rc = kiln_sign_trust_update(*cur, doc, len, label, &next, &res);
    /* Bytes that are not a signed policy, where one must be, fail the check too. */
    KILN_TRY(rc == KILN_ERR_FORMAT ? KILN_ERR_VERIFY : rc);
    if (save) {
        char *dir = kiln_dirname(save);
        rc = dir ? kiln_mkdir_p(dir) : KILN_ERR_NOMEM;
        if (!rc) rc = kiln_write_file_atomic(save, doc, len);
        free(dir);
        if (rc) {
            kiln_sign_trust_free(next);
            return rc;
        }
    }
    if (w->on_step) {
        char *changes = kiln_sign_trust_diff(*cur, next);
        if (!changes) {
            kiln_sign_trust_free(next);
            return KILN_ERR_NOMEM;
        }
        kiln_registry_trust_step s = {.version = kiln_sign_trust_version(next),
                                      .from_state = !save,
                                      .source = source,
                                      .changes = changes,
                                      .res = &res};
        w->on_step(w->ctx, &s);
        free(changes);
    }
    kiln_sign_trust_free(*cur);
    *cur = next;
    snprintf(w->from, sizeof w->from, "'%s'", source);
    return KILN_OK;
}

/* The versions above *cur this client accepted before, from dir/N.json, each verified
 * again. */
static kiln_err walk_state(walk *w, const char *dir, kiln_sign_trust **cur) {
    for (;;) {
        uint64_t v = kiln_sign_trust_version(*cur) + 1;
        char *path = kiln_asprintf("%s/%llu.json", dir, (unsigned long long)v), *doc = NULL;
        size_t len = 0;
        if (!path) return KILN_ERR_NOMEM;
        if (!kiln_path_exists(path)) {
            free(path);
            return KILN_OK;
        }
        kiln_err rc = kiln_read_file(path, KILN_SIGN_TRUST_FILE_LIMIT, &doc, &len);
        if (!rc) {
            rc = walk_step(w, cur, doc, len, path, path, NULL);
            /* Whatever is wrong with a file in state refuses the pull: fail closed. */
            if (rc == KILN_ERR_VERIFY)
                rc = kiln_errprefix(rc, "trust state (a version this client accepted before; "
                                        "remove the file if kiln did not write it): ");
        }
        free(doc);
        free(path);
        KILN_TRY(rc);
    }
}

/* The newest version the registry serves (GET /v1/trust), 0 when it has none; *t (when not
 * NULL) its policy, as parsed (its signatures unchecked). */
static kiln_err newest_version(const kiln_registry_client_opts *c, uint64_t *v,
                               kiln_sign_trust **newest) {
    *v = 0;
    if (newest) *newest = NULL;
    char *doc = NULL;
    size_t len = 0;
    kiln_err rc = reg_get_text(c, "/v1/trust", REG_TRUST_MAX, &doc, &len);
    if (rc == KILN_ERR_NOTFOUND) {
        kiln_errclear();
        return KILN_OK; /* no versions at all (or a registry from before them) */
    }
    KILN_TRY(rc);
    char label[512];
    snprintf(label, sizeof label, "newest trust version from %s", c->url);
    kiln_sign_trust *t = NULL;
    rc = kiln_sign_trust_parse(doc, len, label, &t);
    free(doc);
    /* The message names the label, which names the registry. */
    if (rc) return rc == KILN_ERR_NOMEM ? rc : KILN_ERR_VERIFY;
    *v = kiln_sign_trust_version(t);
    if (newest)
        *newest = t;
    else
        kiln_sign_trust_free(t);
    return KILN_OK;
}

/* GET /v1/trust/{v} (v: cur's version + 1) into *doc; *doc NULL when the registry has no
 * version v and none above it. A registry that serves a higher version but not v has a gap no
 * client can walk (asked for v once more first: it may have been stored between the two
 * requests). One whose newest is cur's own version must serve the policy the client holds:
 * another policy of that number is a fork (free to see: that answer is fetched anyway). */
static kiln_err fetch_version(const walk *w, const kiln_registry_client_opts *c,
                              const kiln_sign_trust *cur, uint64_t v, char **doc, size_t *len) {
    char path[64];
    snprintf(path, sizeof path, "/v1/trust/%llu", (unsigned long long)v);
    kiln_err rc = reg_get_text(c, path, REG_TRUST_MAX, doc, len);
    if (rc != KILN_ERR_NOTFOUND) return rc;
    kiln_errclear();
    uint64_t newest;
    kiln_sign_trust *nt = NULL;
    KILN_TRY(newest_version(c, &newest, &nt));
    rc = KILN_OK;
    if (nt && newest == v - 1) {
        char label[600];
        snprintf(label, sizeof label, "the newest trust version of registry '%s'", c->url);
        rc = same_version(cur, w->from, nt, label);
        if (rc == KILN_ERR_VERIFY) rc = kiln_errprefix(rc, "refusing: ");
    }
    kiln_sign_trust_free(nt);
    KILN_TRY(rc);
    if (newest < v) return KILN_OK;
    rc = reg_get_text(c, path, REG_TRUST_MAX, doc, len);
    KILN_FAIL_IF(rc == KILN_ERR_NOTFOUND, KILN_ERR_VERIFY,
                 "registry '%s' serves trust version %llu but not version %llu: its chain of "
                 "trust versions has a gap that no client can walk; refusing",
                 c->url, (unsigned long long)newest, (unsigned long long)v);
    return rc;
}

/* The versions the registry has above *cur, each saved to dir before it is used. */
static kiln_err walk_registry(walk *w, const kiln_registry_client_opts *c, const char *dir,
                              kiln_sign_trust **cur) {
    for (;;) {
        uint64_t v = kiln_sign_trust_version(*cur) + 1;
        char label[512], *doc = NULL;
        size_t len = 0;
        KILN_TRY(fetch_version(w, c, *cur, v, &doc, &len));
        if (!doc) return KILN_OK; /* the newest the registry has */
        kiln_err rc;
        snprintf(label, sizeof label, "trust v%llu from %s", (unsigned long long)v, c->url);
        char *file = kiln_asprintf("%s/%llu.json", dir, (unsigned long long)v), src[600];
        snprintf(src, sizeof src, "%s/v1/trust/%llu", c->url, (unsigned long long)v);
        rc = file ? walk_step(w, cur, doc, len, label, src, file) : KILN_ERR_NOMEM;
        free(file);
        free(doc);
        KILN_TRY(rc);
    }
}

/* A client whose policy has no root keys cannot follow the registry's versions: warn when
 * there are some above it (its policy must be replaced by hand). Only a registry that does
 * not answer is an error (KILN_ERR_NETWORK), so that a pull over several passes it over
 * here rather than waiting for it again. */
static kiln_err warn_rootless(const kiln_registry_client_opts *c, const kiln_sign_trust *cur,
                              const char *trust) {
    char *doc = NULL;
    size_t len = 0;
    kiln_sign_trust *t = NULL;
    kiln_err rc = reg_get_text(c, "/v1/trust", REG_TRUST_MAX, &doc, &len);
    if (rc == KILN_ERR_NETWORK) return rc;
    if (!rc && kiln_sign_trust_parse(doc, len, "registry trust", &t) == KILN_OK &&
        kiln_sign_trust_version(t) > kiln_sign_trust_version(cur))
        kiln_warn("'%s' has no root keys, so the registry's trust version %llu cannot be walked "
                  "to: replace the policy by hand with that version",
                  trust, (unsigned long long)kiln_sign_trust_version(t));
    kiln_sign_trust_free(t);
    free(doc);
    kiln_errclear();
    return KILN_OK;
}

kiln_err kiln_registry_trust_walk(const kiln_registry_client_opts *c, const char *trust,
                                  const char *state,
                                  void (*on_step)(void *ctx, const kiln_registry_trust_step *s),
                                  void *ctx, kiln_sign_trust **out) {
    *out = NULL;
    KILN_FAIL_IF(!trust, KILN_ERR_USAGE, "a trust walk needs the client's trust policy");
    walk w = {on_step, ctx, ""};
    snprintf(w.from, sizeof w.from, "'%s'", trust);
    kiln_sign_trust *cur = NULL;
    char *st = state ? kiln_strdup(state) : reg_default_state(),
         *dir = st ? kiln_path_join(st, "trust") : NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !dir, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_sign_trust_load(trust, &cur));
    /* A policy without root keys has no versions after it: nothing to walk (said once, when
     * the registry has versions this client can never reach). */
    if (kiln_sign_trust_role_count(cur, KILN_SIGN_ROLE_ROOT) > 0) {
        KILN_CHECK(rc, out, walk_state(&w, dir, &cur));
        if (c) KILN_CHECK(rc, out, walk_registry(&w, c, dir, &cur));
    } else if (c) {
        KILN_CHECK(rc, out, warn_rootless(c, cur, trust));
    }
    *out = cur;
    cur = NULL;
out:
    kiln_sign_trust_free(cur);
    free(st);
    free(dir);
    return rc;
}

kiln_err kiln_registry_trust_put(const kiln_registry_client_opts *c, const char *doc, size_t len,
                                 const char *label, uint64_t *version) {
    if (version) *version = 0;
    kiln_sign_trust *t = NULL;
    /* Read here first, so that a file that is not a signed policy is named and nothing is
     * sent. */
    KILN_TRY(kiln_sign_trust_parse(doc, len, label, &t));
    uint64_t v = kiln_sign_trust_version(t);
    bool is_signed = kiln_sign_trust_signatures(t) > 0;
    kiln_sign_trust_free(t);
    KILN_FAIL_IF(!is_signed, KILN_ERR_USAGE,
                 "'%s' is a plain trust policy: a registry takes signed versions only (kiln trust "
                 "sign)",
                 label);
    char path[64];
    snprintf(path, sizeof path, "/v1/trust/%llu", (unsigned long long)v);
    json_t *ans = NULL;
    KILN_TRY(reg_put_text(c, path, doc, len, &ans));
    json_t *jv = json_object_get(ans, "version");
    kiln_err rc = KILN_OK;
    if (!json_is_integer(jv) || (uint64_t)json_integer_value(jv) != v)
        rc = kiln_fail(KILN_ERR_NETWORK, "registry '%s' answered the PUT of trust version %llu "
                                         "without naming that version",
                       c->url, (unsigned long long)v);
    else if (version)
        *version = v;
    json_decref(ans);
    return rc;
}

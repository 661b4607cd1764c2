/* trustwalk.c - the client's walk of the trust policy's versions: from its configured policy
 * through the versions its state directory kept and those a registry has since, each step
 * sign/'s kiln_sign_trust_update (a version is accepted only as the successor of the one
 * already trusted, so neither the registry nor the state directory can put a policy in front
 * of a client that its root keys did not sign); and kiln_registry_trust_put. The store's
 * table of versions is the server's (server/trustchain.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"

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
        rc = reg_trust_same_version(cur, w->from, nt, label);
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
    /* An OCI registry's first trust version is its policy as given (what `kiln registry
     * serve --trust` is to kiln's server): plain there, refused after (oci_kiln.c). */
    KILN_FAIL_IF(!is_signed && !reg_oci_url(c->url), KILN_ERR_USAGE,
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

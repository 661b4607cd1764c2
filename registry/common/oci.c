/* oci.c - the OCI distribution protocol from the calling side, as docker, podman and skopeo
 * speak it: manifests and blobs by tag or digest, blob uploads (POST, then chunked PATCH
 * with a fallback to one monolithic PUT, restarted from zero when interrupted; a HEAD first
 * so nothing is pushed twice; a cross-repository mount for a caller that names where the blob
 * is, none of kiln's today: its repositories share no blob but the 2-byte empty config), tag and
 * catalog listings with their pagination, and authentication: HTTP basic and the bearer-token
 * flow (WWW-Authenticate: Bearer realm=...,service=...,scope=...; tokens cached per scope and
 * fetched again on 401), the credentials from the file `skopeo login`, `podman login` or
 * `docker login` wrote. Credentials are never printed or logged. What kiln keeps there is
 * oci_kiln.c's; every digest this file reads is checked here, by content. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "http_int.h"
#include "oci_int.h"

/* A repository name's component as distribution accepts it: [a-z0-9]+ separated by '.', '_',
 * '__' or '-'s. */
static bool repo_component_ok(const char *s, size_t n) {
    if (!n || !isalnum((unsigned char)s[0]) || !isalnum((unsigned char)s[n - 1])) return false;
    for (size_t i = 0; i < n; i++)
        if (!(islower((unsigned char)s[i]) || isdigit((unsigned char)s[i]) || s[i] == '.' ||
              s[i] == '_' || s[i] == '-'))
            return false;
    return true;
}

kiln_err reg_oci_open(const kiln_registry_client_opts *c, reg_oci *o) {
    memset(o, 0, sizeof *o);
    o->c = c;
    const char *u = c->url;
    bool plain = !strncmp(u, "oci+http://", 11);
    const char *h = u + (plain ? 11 : 6);
    size_t hn = strcspn(h, "/");
    KILN_FAIL_IF(!hn || hn >= sizeof o->host, KILN_ERR_USAGE,
                 "registry URL '%s' names no host (oci://HOST[:PORT]/PREFIX)", u);
    memcpy(o->host, h, hn);
    o->host[hn] = 0;
    const char *p = h + hn;
    while (*p == '/')
        p++;
    size_t pn = strlen(p);
    while (pn && p[pn - 1] == '/')
        pn--;
    KILN_FAIL_IF(pn >= sizeof o->prefix, KILN_ERR_USAGE, "registry URL '%s': prefix too long", u);
    memcpy(o->prefix, p, pn);
    o->prefix[pn] = 0;
    for (const char *s = o->prefix; *s;) {
        size_t n = strcspn(s, "/");
        KILN_FAIL_IF(!repo_component_ok(s, n), KILN_ERR_USAGE,
                     "registry URL '%s': '%.*s' is not a repository name component an OCI "
                     "registry accepts ([a-z0-9] separated by '.', '_' or '-')",
                     u, (int)n, s);
        s += n;
        if (*s) s++;
    }
    snprintf(o->base, sizeof o->base, "%s://%s", plain ? "http" : "https", o->host);
    return KILN_OK;
}

char *reg_oci_repo(const reg_oci *o, const char *name) {
    return *o->prefix ? kiln_asprintf("%s/%s", o->prefix, name) : kiln_strdup(name);
}

/* ---- credentials ---- */

/* base64(user:password) for host from the first auth file that names it; NULL when none
 * (caller sodium_memzeroes and frees). */
static char *auth_file_basic(const char *host) {
    char *paths[4] = {NULL, NULL, NULL, NULL};
    const char *e;
    if ((e = getenv("REGISTRY_AUTH_FILE")) && *e) paths[0] = kiln_strdup(e);
    if ((e = getenv("XDG_RUNTIME_DIR")) && *e)
        paths[1] = kiln_asprintf("%s/containers/auth.json", e);
    if ((e = getenv("DOCKER_CONFIG")) && *e) paths[2] = kiln_asprintf("%s/config.json", e);
    if ((e = getenv("HOME")) && *e) paths[3] = kiln_asprintf("%s/.docker/config.json", e);
    char *found = NULL;
    for (size_t i = 0; i < 4 && !found; i++) {
        char *text = NULL;
        size_t len = 0;
        if (!paths[i] || kiln_read_file(paths[i], 1u << 20, &text, &len) != KILN_OK) {
            kiln_errclear();
            continue;
        }
        json_t *j = json_loadb(text, len, 0, NULL);
        sodium_memzero(text, len);
        free(text);
        json_t *auths = json_object_get(j, "auths");
        const char *key;
        json_t *v;
        json_object_foreach(auths, key, v) {
            const char *k = key;
            if (!strncmp(k, "https://", 8))
                k += 8;
            else if (!strncmp(k, "http://", 7))
                k += 7;
            size_t hl = strlen(host);
            if (strncmp(k, host, hl) || (k[hl] && k[hl] != '/')) continue;
            const char *a = json_string_value(json_object_get(v, "auth"));
            if (a && *a) {
                found = kiln_strdup(a);
                break;
            }
        }
        if (j) {
            /* the document holds secrets: wipe the strings before they are freed */
            json_object_foreach(auths, key, v) {
                json_t *a = json_object_get(v, "auth");
                if (json_is_string(a)) {
                    char *s = (char *)json_string_value(a);
                    sodium_memzero(s, strlen(s));
                }
            }
        }
        json_decref(j);
    }
    for (size_t i = 0; i < 4; i++)
        free(paths[i]);
    return found;
}

/* Authorization header lines, per host and scope, for the life of the process. */
typedef struct cred {
    char host[256], scope[300];
    char *header; /* "Authorization: ..." */
} cred;
#define CRED_MAX 64
static cred creds[CRED_MAX];
static size_t ncreds, cred_next;
static pthread_mutex_t cred_mu = PTHREAD_MUTEX_INITIALIZER;

static char *cred_get(const char *host, const char *scope) {
    char *h = NULL;
    pthread_mutex_lock(&cred_mu);
    for (size_t i = 0; i < ncreds && !h; i++)
        if (!strcmp(creds[i].host, host) &&
            (!strcmp(creds[i].scope, scope) || !strcmp(creds[i].scope, "*")))
            h = kiln_strdup(creds[i].header);
    pthread_mutex_unlock(&cred_mu);
    return h;
}

static void cred_put(const char *host, const char *scope, const char *header) {
    char *copy = kiln_strdup(header);
    if (!copy) return;
    pthread_mutex_lock(&cred_mu);
    size_t i;
    for (i = 0; i < ncreds; i++)
        if (!strcmp(creds[i].host, host) && !strcmp(creds[i].scope, scope)) break;
    if (i == ncreds) {
        if (ncreds < CRED_MAX)
            i = ncreds++;
        else
            i = cred_next++ % CRED_MAX;
    }
    if (creds[i].header) {
        sodium_memzero(creds[i].header, strlen(creds[i].header));
        free(creds[i].header);
    }
    snprintf(creds[i].host, sizeof creds[i].host, "%s", host);
    snprintf(creds[i].scope, sizeof creds[i].scope, "%s", scope);
    creds[i].header = copy;
    pthread_mutex_unlock(&cred_mu);
}

static void secret_free(char *s) {
    if (!s) return;
    sodium_memzero(s, strlen(s));
    free(s);
}

bool reg_oci_challenge_param(const char *ch, const char *name, char *out, size_t cap) {
    size_t k = strlen(name);
    for (const char *p = ch; (p = strcasestr(p, name)) != NULL; p += k) {
        if (p != ch && p[-1] != ' ' && p[-1] != ',') continue;
        if (p[k] != '=') continue;
        const char *v = p + k + 1;
        size_t n;
        if (*v == '"') {
            v++;
            n = strcspn(v, "\"");
        } else {
            n = strcspn(v, ", ");
        }
        if (n >= cap) return false;
        memcpy(out, v, n);
        out[n] = 0;
        return true;
    }
    return false;
}

static char *url_escape(const char *s) {
    size_t n = strlen(s);
    char *o = kiln_malloc(3 * n + 1), *p = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (isalnum(ch) || ch == '-' || ch == '.' || ch == '_' || ch == '~') {
            *p++ = (char)ch;
        } else {
            sprintf(p, "%%%02X", ch);
            p += 3;
        }
    }
    *p = 0;
    return o;
}

/* The bearer-token flow: GET realm?service=...&scope=... (with the basic credentials when
 * there are some), the answer's "token" (or "access_token") cached for host and scope. */
static kiln_err fetch_token(reg_oci *o, const char *challenge, const char *scope) {
    char realm[1024], service[256] = "", chscope[512] = "";
    KILN_FAIL_IF(!reg_oci_challenge_param(challenge, "realm", realm, sizeof realm), KILN_ERR_AUTH,
                 "registry '%s' asks for a bearer token without naming its realm", o->c->url);
    reg_oci_challenge_param(challenge, "service", service, sizeof service);
    reg_oci_challenge_param(challenge, "scope", chscope, sizeof chscope);
    KILN_FAIL_IF(strncmp(realm, "https://", 8) && strncmp(realm, "http://", 7), KILN_ERR_AUTH,
                 "registry '%s' names a token realm that is not http(s)", o->c->url);
    const char *sc = *chscope ? chscope : scope;
    char *es = url_escape(service), *esc = url_escape(sc);
    char *url = es && esc
                    ? kiln_asprintf("%s%s%s%s&scope=%s", realm, strchr(realm, '?') ? "&" : "?",
                                    *service ? "service=" : "", es, esc)
                    : NULL;
    free(es);
    free(esc);
    KILN_FAIL_IF(!url, KILN_ERR_NOMEM, "out of memory");
    char *basic = auth_file_basic(o->host), *line = NULL;
    if (basic) line = kiln_asprintf("Authorization: Basic %s", basic);
    secret_free(basic);
    const char *hdrs[1] = {line};
    reg_http_req q = {
        .method = "GET", .url = url, .headers = hdrs, .nheaders = line ? 1 : 0, .limit = 1u << 20};
    reg_http_ans a;
    kiln_err rc = reg_http_do(o->c, &q, &a);
    secret_free(line);
    if (!rc && a.status != 200)
        rc = kiln_fail(KILN_ERR_AUTH, "the token service of registry '%s' refused: HTTP %ld",
                       o->c->url, a.status);
    json_t *j = NULL;
    if (!rc) {
        j = json_loadb(a.body ? a.body : "", a.len, 0, NULL);
        const char *t = json_string_value(json_object_get(j, "token"));
        if (!t) t = json_string_value(json_object_get(j, "access_token"));
        if (!t || !*t) {
            rc =
                kiln_fail(KILN_ERR_AUTH,
                          "the token service of registry '%s' answered without a token", o->c->url);
        } else {
            char *h = kiln_asprintf("Authorization: Bearer %s", t);
            if (!h)
                rc = KILN_ERR_NOMEM;
            else
                cred_put(o->host, scope, h);
            secret_free(h);
        }
        if (json_is_string(json_object_get(j, "token"))) {
            char *s = (char *)json_string_value(json_object_get(j, "token"));
            sodium_memzero(s, strlen(s));
        }
        if (json_is_string(json_object_get(j, "access_token"))) {
            char *s = (char *)json_string_value(json_object_get(j, "access_token"));
            sodium_memzero(s, strlen(s));
        }
    }
    json_decref(j);
    if (a.body) sodium_memzero(a.body, a.len);
    reg_http_ans_release(&a);
    free(url);
    return rc;
}

/* One request against the registry (path under its base), authenticated for scope: the
 * header cached for it, else the client's token; on a 401 the challenge is answered once
 * (basic: the auth file's credentials; bearer: a token for the scope) and the request sent
 * again. */
kiln_err reg_oci_do(reg_oci *o, const char *scope, reg_http_req *q, const char *path,
                    reg_http_ans *a) {
    char *url = strstr(path, "://") ? kiln_strdup(path) : kiln_asprintf("%s%s", o->base, path);
    KILN_FAIL_IF(!url, KILN_ERR_NOMEM, "out of memory");
    const char *extra[8];
    size_t nextra = q->nheaders < 7 ? q->nheaders : 7;
    for (size_t i = 0; i < nextra; i++)
        extra[i] = q->headers[i];
    reg_http_req r = *q;
    r.url = url;
    r.headers = extra;
    kiln_err rc = KILN_OK;
    /* A URL the registry named (an upload's Location, a listing's next page) on another host
     * gets no credentials: they are the registry's only. */
    size_t bl = strlen(o->base);
    bool ours = strncmp(url, o->base, bl) == 0 && (url[bl] == '/' || url[bl] == 0);
    for (int attempt = 0; attempt < 2; attempt++) {
        char *auth = ours ? cred_get(o->host, scope) : NULL;
        if (ours && !auth && o->c->token)
            auth = kiln_asprintf("Authorization: Bearer %s", o->c->token);
        extra[nextra] = auth;
        r.nheaders = nextra + (auth ? 1 : 0);
        rc = reg_http_do(o->c, &r, a);
        secret_free(auth);
        if (rc || a->status != 401 || attempt || !ours) break;
        char challenge[sizeof a->www_auth];
        snprintf(challenge, sizeof challenge, "%s", a->www_auth);
        reg_http_ans_release(a);
        if (!strncasecmp(challenge, "Bearer", 6)) {
            rc = fetch_token(o, challenge, scope);
        } else if (!strncasecmp(challenge, "Basic", 5)) {
            char *basic = auth_file_basic(o->host);
            if (!basic) {
                rc = kiln_fail(KILN_ERR_AUTH,
                               "registry '%s' asks for credentials and no auth file names "
                               "'%s' (skopeo login %s; $REGISTRY_AUTH_FILE, "
                               "$XDG_RUNTIME_DIR/containers/auth.json, $DOCKER_CONFIG/config.json, "
                               "~/.docker/config.json)",
                               o->c->url, o->host, o->host);
            } else {
                char *h = kiln_asprintf("Authorization: Basic %s", basic);
                if (h)
                    cred_put(o->host, "*", h);
                else
                    rc = KILN_ERR_NOMEM;
                secret_free(h);
                secret_free(basic);
            }
        } else {
            rc =
                kiln_fail(KILN_ERR_AUTH, "registry '%s' refused the request (HTTP 401)", o->c->url);
        }
        if (rc) break;
    }
    free(url);
    return rc;
}

/* ---- manifests and blobs ---- */

void reg_oci_sha256(const void *p, size_t n, char out[REG_OCI_DIGEST]) {
    uint8_t d[KILN_SHA256_BYTES];
    char hex[KILN_SHA256_HEX];
    kiln_sha256(p, n, d);
    kiln_hex(d, sizeof d, hex);
    snprintf(out, REG_OCI_DIGEST, "sha256:%s", hex);
}

static char *scope_of(const char *repo, bool push) {
    return kiln_asprintf("repository:%s:%s", repo, push ? "pull,push" : "pull");
}

static kiln_err status_fail(const reg_oci *o, const char *what, const reg_http_ans *a) {
    if (a->status == 404)
        return kiln_fail(KILN_ERR_NOTFOUND, "registry '%s' has no %s", o->c->url, what);
    return kiln_errprefix(reg_http_fail(o->c->url, a->status, a->body, a->len), "%s: ", what);
}

/* The answer's body handed to the caller (*body, *len; an empty one as ""), a->body emptied. */
static kiln_err take_body(reg_http_ans *a, char **body, size_t *len) {
    *body = a->body ? a->body : kiln_strdup("");
    *len = a->len;
    a->body = NULL;
    return *body ? KILN_OK : KILN_ERR_NOMEM;
}

#define OCI_ACCEPT                                                                                 \
    "Accept: application/vnd.oci.image.manifest.v1+json, "                                         \
    "application/vnd.oci.image.index.v1+json, "                                                    \
    "application/vnd.docker.distribution.manifest.v2+json"

kiln_err reg_oci_manifest_get(reg_oci *o, const char *repo, const char *ref, size_t limit,
                              char **body, size_t *len, char digest[REG_OCI_DIGEST]) {
    *body = NULL;
    *len = 0;
    char *scope = scope_of(repo, false), *path = kiln_asprintf("/v2/%s/manifests/%s", repo, ref),
         *what = kiln_asprintf("manifest %s:%s", repo, ref);
    const char *h[1] = {OCI_ACCEPT};
    reg_http_req q = {.method = "GET", .headers = h, .nheaders = 1, .limit = limit};
    reg_http_ans a = {0};
    kiln_err rc = scope && path && what ? reg_oci_do(o, scope, &q, path, &a) : KILN_ERR_NOMEM;
    if (!rc && a.status != 200) rc = status_fail(o, what, &a);
    if (!rc) {
        reg_oci_sha256(a.body ? a.body : "", a.len, digest);
        /* A manifest by digest is that digest's bytes, or the registry lies. */
        if (!strncmp(ref, "sha256:", 7) && strcmp(ref, digest))
            rc = kiln_fail(KILN_ERR_VERIFY, "registry '%s' served %s with digest %s; refusing",
                           o->c->url, what, digest);
    }
    if (!rc) rc = take_body(&a, body, len);
    reg_http_ans_release(&a);
    free(scope);
    free(path);
    free(what);
    return rc;
}

kiln_err reg_oci_manifest_head(reg_oci *o, const char *repo, const char *ref, bool *exists,
                               char digest[REG_OCI_DIGEST]) {
    *exists = false;
    digest[0] = 0;
    /* The digest by GET, not the header: a registry's Docker-Content-Digest is its word only. */
    char *body = NULL;
    size_t len = 0;
    kiln_err rc = reg_oci_manifest_get(o, repo, ref, 4u << 20, &body, &len, digest);
    free(body);
    if (rc == KILN_ERR_NOTFOUND) {
        kiln_errclear();
        digest[0] = 0;
        return KILN_OK;
    }
    if (!rc) *exists = true;
    return rc;
}

kiln_err reg_oci_manifest_put(reg_oci *o, const char *repo, const char *ref, const char *body,
                              size_t len, const char *media_type) {
    char *scope = scope_of(repo, true), *path = kiln_asprintf("/v2/%s/manifests/%s", repo, ref),
         *ct = kiln_asprintf("Content-Type: %s", media_type),
         *what = kiln_asprintf("putting manifest %s:%s", repo, ref);
    const char *h[1] = {ct};
    reg_http_req q = {.method = "PUT", .headers = h, .nheaders = 1, .body = body, .body_len = len};
    reg_http_ans a = {0};
    kiln_err rc = scope && path && ct && what ? reg_oci_do(o, scope, &q, path, &a) : KILN_ERR_NOMEM;
    if (!rc && a.status != 201 && a.status != 200) rc = status_fail(o, what, &a);
    reg_http_ans_release(&a);
    free(scope);
    free(path);
    free(ct);
    free(what);
    return rc;
}

kiln_err reg_oci_blob_get(reg_oci *o, const char *repo, const char *digest, size_t limit,
                          char **body, size_t *len) {
    *body = NULL;
    *len = 0;
    char *scope = scope_of(repo, false), *path = kiln_asprintf("/v2/%s/blobs/%s", repo, digest),
         *what = kiln_asprintf("blob %s in %s", digest, repo);
    reg_http_req q = {.method = "GET", .limit = limit};
    reg_http_ans a = {0};
    kiln_err rc = scope && path && what ? reg_oci_do(o, scope, &q, path, &a) : KILN_ERR_NOMEM;
    /* Object storage behind the registry: followed without the registry's credentials. */
    for (int i = 0; !rc && i < 5 && a.status >= 301 && a.status <= 308 && a.location[0]; i++) {
        char *to = strstr(a.location, "://") ? kiln_strdup(a.location)
                                             : kiln_asprintf("%s%s", o->base, a.location);
        reg_http_ans_release(&a);
        reg_http_req r = {.method = "GET", .url = to, .limit = limit};
        rc = to ? reg_http_do(o->c, &r, &a) : KILN_ERR_NOMEM;
        free(to);
    }
    if (!rc && a.status != 200) rc = status_fail(o, what, &a);
    if (!rc) {
        char got[REG_OCI_DIGEST];
        reg_oci_sha256(a.body ? a.body : "", a.len, got);
        if (strcmp(got, digest))
            rc =
                kiln_fail(KILN_ERR_VERIFY, "registry '%s' served %s with the bytes of %s; refusing",
                          o->c->url, what, got);
    }
    if (!rc) rc = take_body(&a, body, len);
    reg_http_ans_release(&a);
    free(scope);
    free(path);
    free(what);
    return rc;
}

kiln_err reg_oci_blob_exists(reg_oci *o, const char *repo, const char *digest, bool *exists) {
    *exists = false;
    char *scope = scope_of(repo, false), *path = kiln_asprintf("/v2/%s/blobs/%s", repo, digest);
    reg_http_req q = {.method = "HEAD"};
    reg_http_ans a = {0};
    kiln_err rc = scope && path ? reg_oci_do(o, scope, &q, path, &a) : KILN_ERR_NOMEM;
    if (!rc) *exists = a.status == 200 || (a.status >= 301 && a.status <= 308);
    reg_http_ans_release(&a);
    free(scope);
    free(path);
    return rc;
}

/* The upload URL a Location names, with "digest=" appended. */
static char *upload_url(const reg_oci *o, const char *loc, const char *digest) {
    const char *sep = strchr(loc, '?') ? "&" : "?";
    if (strstr(loc, "://")) return kiln_asprintf("%s%sdigest=%s", loc, sep, digest);
    return kiln_asprintf("%s%s%sdigest=%s", o->base, loc, sep, digest);
}

static char *abs_location(const reg_oci *o, const char *loc) {
    return strstr(loc, "://") ? kiln_strdup(loc) : kiln_asprintf("%s%s", o->base, loc);
}

/* Chunks above this are PATCHed; below, one PUT. */
static uint64_t chunk_size(void) {
    const char *e = getenv("KILN_OCI_CHUNK");
    uint64_t v = e ? strtoull(e, NULL, 10) : 0;
    return v ? v : 64ull << 20;
}

/* One upload of the blob (mem, or file's size bytes) from zero: POST (a mount from
 * mount_from when given), then PATCHes of chunk bytes and a closing PUT, or (monolithic, or
 * small) one PUT. *refused: the registry mis-answered a PATCH (the caller tries monolithic). */
static kiln_err upload_once(reg_oci *o, const char *repo, const char *scope, const char *mem,
                            const char *file, uint64_t size, const char *digest,
                            const char *mount_from, bool monolithic, bool *refused, bool *mounted) {
    *refused = false;
    *mounted = false;
    char *path = mount_from ? kiln_asprintf("/v2/%s/blobs/uploads/?mount=%s&from=%s", repo, digest,
                                            mount_from)
                            : kiln_asprintf("/v2/%s/blobs/uploads/", repo);
    KILN_FAIL_IF(!path, KILN_ERR_NOMEM, "out of memory");
    reg_http_req q = {.method = "POST", .once = true};
    reg_http_ans a = {0};
    char what[300];
    snprintf(what, sizeof what, "uploading %s to %s", digest, repo);
    kiln_err rc = reg_oci_do(o, scope, &q, path, &a);
    free(path);
    if (!rc && a.status == 201 && mount_from) {
        *mounted = true;
        reg_http_ans_release(&a);
        return KILN_OK;
    }
    if (!rc && a.status != 202) rc = status_fail(o, what, &a);
    if (!rc && !a.location[0])
        rc = kiln_fail(KILN_ERR_NETWORK, "registry '%s' started an upload without a Location",
                       o->c->url);
    char *loc = rc ? NULL : abs_location(o, a.location);
    reg_http_ans_release(&a);
    if (!rc && !loc) rc = KILN_ERR_NOMEM;
    uint64_t chunk = chunk_size(), off = 0;
    if (!rc && file && !monolithic && size > chunk) {
        while (!rc && off < size) {
            uint64_t n = size - off < chunk ? size - off : chunk;
            char cr[96], cl[64];
            snprintf(cr, sizeof cr, "Content-Range: %" PRIu64 "-%" PRIu64, off, off + n - 1);
            snprintf(cl, sizeof cl, "Content-Type: application/octet-stream");
            const char *h[2] = {cr, cl};
            reg_http_req p = {.method = "PATCH",
                              .headers = h,
                              .nheaders = 2,
                              .file = file,
                              .file_off = off,
                              .file_len = n,
                              .once = true};
            rc = reg_oci_do(o, scope, &p, loc, &a);
            if (rc) break;
            /* 202 with the range it holds, or a registry that cannot take chunks. */
            char want[64];
            snprintf(want, sizeof want, "0-%" PRIu64, off + n - 1);
            if (a.status != 202 || !a.location[0] ||
                (a.range[0] && strcmp(a.range, want) &&
                 strcmp(a.range + (a.range[0] == 'b' ? 6 : 0), want))) {
                kiln_debug("registry '%s' answered a PATCH with HTTP %ld (range '%s'): "
                           "uploading in one PUT",
                           o->c->url, a.status, a.range);
                *refused = true;
                reg_http_ans_release(&a);
                break;
            }
            char *next = abs_location(o, a.location);
            reg_http_ans_release(&a);
            if (!next) {
                rc = KILN_ERR_NOMEM;
                break;
            }
            free(loc);
            loc = next;
            off += n;
        }
    }
    if (!rc && !*refused) {
        char *u = upload_url(o, loc, digest);
        const char *h[1] = {"Content-Type: application/octet-stream"};
        reg_http_req p = {.method = "PUT", .headers = h, .nheaders = 1, .once = true};
        if (off < size || !size) {
            if (mem) {
                p.body = mem;
                p.body_len = (size_t)size;
            } else {
                p.file = file;
                p.file_off = 0;
                p.file_len = size;
            }
        }
        rc = u ? reg_oci_do(o, scope, &p, u, &a) : KILN_ERR_NOMEM;
        if (!rc && a.status != 201) rc = status_fail(o, what, &a);
        reg_http_ans_release(&a);
        free(u);
    }
    free(loc);
    return rc;
}

kiln_err reg_oci_blob_push(reg_oci *o, const char *repo, const char *mem, const char *file,
                           uint64_t size, const char *digest, const char *mount_from) {
    bool exists;
    KILN_TRY(reg_oci_blob_exists(o, repo, digest, &exists));
    if (exists) return KILN_OK; /* nothing pushed twice */
    char *scope =
        mount_from ? kiln_asprintf("repository:%s:pull,push repository:%s:pull", repo, mount_from)
                   : scope_of(repo, true);
    KILN_FAIL_IF(!scope, KILN_ERR_NOMEM, "out of memory");
    kiln_err rc = KILN_OK;
    bool monolithic = false, refused, mounted;
    const char *from = mount_from;
    /* A failed attempt restarts the upload from zero: a registry's half-written upload is
     * its own to expire. */
    for (int attempt = 0;; attempt++) {
        rc = upload_once(o, repo, scope, mem, file, size, digest, from, monolithic, &refused,
                         &mounted);
        if (!rc && mounted) break;
        if (!rc && !refused) break;
        if (!rc && refused) {
            monolithic = true;
            from = NULL;
            continue;
        }
        if (attempt >= 2 || rc == KILN_ERR_NOMEM || rc == KILN_ERR_AUTH || rc == KILN_ERR_IO) break;
        kiln_debug("%s; uploading %s again from the start", kiln_errmsg(), digest);
        kiln_errclear();
        from = NULL;
    }
    free(scope);
    KILN_TRY(rc);
    /* The registry holds it now, or it said so falsely. */
    KILN_TRY(reg_oci_blob_exists(o, repo, digest, &exists));
    KILN_FAIL_IF(!exists, KILN_ERR_NETWORK,
                 "registry '%s' accepted the upload of %s to %s but does not hold it", o->c->url,
                 digest, repo);
    return KILN_OK;
}

/* ---- listings ---- */

char *reg_oci_link_next(const char *link) {
    const char *lt = strchr(link, '<'), *gt = lt ? strchr(lt, '>') : NULL;
    if (!lt || !gt || !strstr(gt, "next")) return NULL;
    return kiln_asprintf("%.*s", (int)(gt - lt - 1), lt + 1);
}

static kiln_err list_pages(reg_oci *o, const char *scope, const char *first, const char *key,
                           const char *what, json_t **out) {
    *out = json_array();
    KILN_FAIL_IF(!*out, KILN_ERR_NOMEM, "out of memory");
    char *path = kiln_strdup(first);
    kiln_err rc = path ? KILN_OK : KILN_ERR_NOMEM;
    for (int page = 0; !rc && path && page < 10000; page++) {
        reg_http_req q = {.method = "GET", .limit = REG_JSON_MAX};
        reg_http_ans a = {0};
        rc = reg_oci_do(o, scope, &q, path, &a);
        free(path);
        path = NULL;
        if (!rc && a.status != 200) rc = status_fail(o, what, &a);
        json_t *j = NULL;
        if (!rc) rc = kiln_json_parse(a.body ? a.body : "", a.len, what, &j);
        if (!rc) {
            json_t *arr = json_object_get(j, key);
            if (!json_is_array(arr) && !json_is_null(arr))
                rc = kiln_fail(KILN_ERR_FORMAT, "registry '%s': %s is not a list", o->c->url, what);
            size_t i;
            json_t *v;
            json_array_foreach(arr, i, v) {
                if (json_is_string(v)) json_array_append(*out, v);
            }
            if (a.link[0]) path = reg_oci_link_next(a.link);
        }
        json_decref(j);
        reg_http_ans_release(&a);
    }
    free(path);
    if (rc) {
        json_decref(*out);
        *out = NULL;
    }
    return rc;
}

kiln_err reg_oci_tags(reg_oci *o, const char *repo, json_t **out) {
    char *scope = scope_of(repo, false), *path = kiln_asprintf("/v2/%s/tags/list?n=1000", repo),
         *what = kiln_asprintf("the tags of %s", repo);
    kiln_err rc =
        scope && path && what ? list_pages(o, scope, path, "tags", what, out) : KILN_ERR_NOMEM;
    /* distribution answers 404 NAME_UNKNOWN for a repository nothing was pushed to */
    free(scope);
    free(path);
    free(what);
    return rc;
}

kiln_err reg_oci_catalog(reg_oci *o, json_t **out) {
    return list_pages(o, "registry:catalog:*", "/v2/_catalog?n=1000", "repositories",
                      "the catalog (_catalog)", out);
}

char *reg_oci_auth_line(reg_oci *o, const char *scope) {
    char *auth = cred_get(o->host, scope);
    if (!auth && o->c->token) auth = kiln_asprintf("Authorization: Bearer %s", o->c->token);
    return auth;
}

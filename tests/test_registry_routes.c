/* test_registry_routes.c - the registry server's route table (reg_routes.c): every row
 * is whole (one handler, a scope, a pattern whose captures are known), no two rows answer
 * the same method and pattern, no two patterns match one path, every route is reachable by
 * its pattern; and a live server answers from the table: a method no row has is 405 with
 * the methods that rows have in Allow, a token short of a row's scope 401 or 403. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "registry_fx.h"
#include "registry_int.h"
#include "test.h"
#include "testutil.h"

static size_t rows(reg_route_info *out, size_t cap) {
    size_t n = 0;
    while (n < cap && reg_route_row(n, &out[n]))
        n++;
    return n;
}

/* The value a capture of pattern stands for in a sample path, and the seg it lands in. */
static const char *sample(const char *cap, size_t len, int *seg) {
    static const struct {
        const char *name, *value;
        int seg;
    } s[] = {{"{model}", "m-1", 0},
             {"{version}", "1", 1},
             {"{channel}", "prod", 1},
             {"{digest}", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", 2}};
    for (size_t i = 0; i < KILN_ARRAY_LEN(s); i++)
        if (strlen(s[i].name) == len && !strncmp(cap, s[i].name, len)) {
            *seg = s[i].seg;
            return s[i].value;
        }
    return NULL;
}

/* A path the pattern matches, each capture a sample (want[seg] set to it); false when the
 * pattern names a capture the router does not know. */
static bool sample_path(const char *pattern, char *out, size_t cap, const char *want[3]) {
    size_t n = 0;
    want[0] = want[1] = want[2] = "";
    out[0] = 0;
    for (const char *p = pattern; *p;) {
        if (*p != '{') {
            n += (size_t)snprintf(out + n, cap - n, "%c", *p++);
            continue;
        }
        const char *e = strchr(p, '}');
        int seg;
        const char *v = e ? sample(p, (size_t)(e - p + 1), &seg) : NULL;
        if (!v) return false;
        want[seg] = v;
        n += (size_t)snprintf(out + n, cap - n, "%s", v);
        p = e + 1;
    }
    return n < cap;
}

/* Whether some path matches both patterns: as many segments, and at each either a capture
 * or the same literal. */
static bool overlap(const char *a, const char *b) {
    for (;;) {
        size_t la = strcspn(a, "/"), lb = strcspn(b, "/");
        bool lit = a[0] != '{' && b[0] != '{';
        if (lit && (la != lb || strncmp(a, b, la))) return false;
        if (!a[la] || !b[lb]) return !a[la] && !b[lb];
        a += la + 1;
        b += lb + 1;
    }
}

/* The Allow header a route's rows make: GET (and HEAD, which GET answers), then the rest, in
 * the table's order. */
static void allow_want(const reg_route_info *r, size_t n, int route, bool no_writes, char *out,
                       size_t cap) {
    size_t k = 0;
    out[0] = 0;
    for (size_t i = 0; i < n; i++)
        if (r[i].route == route && !(no_writes && r[i].write))
            k += (size_t)snprintf(out + k, cap - k, "%s%s%s", k ? ", " : "", r[i].method,
                                  strcmp(r[i].method, "GET") ? "" : ", HEAD");
}

/* The value of header name in resp, "" when absent. */
static void header_of(const rfx_resp *resp, const char *name, char *out, size_t cap) {
    size_t nl = strlen(name);
    out[0] = 0;
    for (const char *l = resp->hdr; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncasecmp(l, name, nl) || l[nl] != ':') continue;
        const char *v = l + nl + 1;
        while (*v == ' ')
            v++;
        snprintf(out, cap, "%.*s", (int)strcspn(v, "\r\n"), v);
        return;
    }
}

KILN_TEST(registry_routes_table_is_whole) {
    reg_route_info r[64];
    size_t n = rows(r, KILN_ARRAY_LEN(r));
    CHECK("the table has rows", n > 0 && n < KILN_ARRAY_LEN(r));
    bool seen[REG_R_COUNT] = {false};
    for (size_t i = 0; i < n; i++) {
        char what[160];
        snprintf(what, sizeof what, "%s %s", r[i].method, r[i].pattern ? r[i].pattern : "(null)");
        bool ok = r[i].pattern && r[i].pattern[0] == '/' && r[i].route > REG_R_NONE &&
                  r[i].route < REG_R_COUNT;
        if (!CHECK("a row has a pattern and a route", ok)) {
            fprintf(stderr, "    row %zu: %s\n", i, what);
            continue;
        }
        seen[r[i].route] = true;
        if (!CHECK("a row has one handler (an answer or a page)", r[i].handlers == 1) ||
            !CHECK("a row answers GET or PUT",
                   !strcmp(r[i].method, "GET") || !strcmp(r[i].method, "PUT")) ||
            !CHECK("a row needs a scope, unless it is open (and then none)",
                   r[i].open
                       ? r[i].scope == 0
                       : (r[i].scope == KILN_SCOPE_READ || r[i].scope == KILN_SCOPE_PUBLISH ||
                          r[i].scope == KILN_SCOPE_PROMOTE || r[i].scope == KILN_SCOPE_ADMIN)) ||
            !CHECK("a write is a PUT, a PUT a write", r[i].write == !strcmp(r[i].method, "PUT")) ||
            !CHECK("a write needs more than read", !r[i].write || r[i].scope > KILN_SCOPE_READ) ||
            !CHECK("only a write writes an audit row", r[i].write || !r[i].audit) ||
            !CHECK("a page is / or under /ui/",
                   !r[i].page || !strcmp(r[i].pattern, "/") || !strncmp(r[i].pattern, "/ui/", 4)))
            fprintf(stderr, "    row %zu: %s\n", i, what);
        for (size_t j = 0; j < i; j++) {
            bool same_pattern = !strcmp(r[i].pattern, r[j].pattern);
            if (!CHECK("no two rows with one method and pattern",
                       !same_pattern || strcmp(r[i].method, r[j].method)) ||
                !CHECK("one route, one pattern", same_pattern == (r[i].route == r[j].route)) ||
                !CHECK("no path matches two patterns",
                       same_pattern || !overlap(r[i].pattern + 1, r[j].pattern + 1)))
                fprintf(stderr, "    rows %zu and %zu: %s and %s %s\n", j, i, what, r[j].method,
                        r[j].pattern);
        }
        /* The router finds it: a path made from the pattern routes there, each capture in
         * its segment. */
        char path[256], seg[3][KILN_REGISTRY_NAME_MAX + 1];
        const char *want[3];
        bool bad = true;
        memset(seg, 'x', sizeof seg);
        bool made = sample_path(r[i].pattern, path, sizeof path, want);
        if (!CHECK("every capture is one the router knows", made) ||
            !CHECK("a path of the pattern routes to the row's route",
                   reg_route_match(path, seg, &bad) == r[i].route && !bad) ||
            !CHECK("with each capture in its segment", !strcmp(seg[0], want[0]) &&
                                                           !strcmp(seg[1], want[1]) &&
                                                           !strcmp(seg[2], want[2])))
            fprintf(stderr, "    row %zu: %s (path %s)\n", i, what, path);
    }
    for (int k = REG_R_NONE + 1; k < REG_R_COUNT; k++)
        if (!CHECK("every route has a row", seen[k])) fprintf(stderr, "    route %d\n", k);
    bool bad = false;
    char seg[3][KILN_REGISTRY_NAME_MAX + 1];
    CHECK("a path no pattern matches: no route",
          reg_route_match("/v1/models/m/builds/1", seg, &bad) == REG_R_NONE && !bad);
    CHECK("a capture over the name limit: malformed",
          reg_route_match("/v1/trust/"
                          "11111111111111111111111111111111111111111111111111111111111111111",
                          seg, &bad) == REG_R_NONE &&
              bad);
}

KILN_TEST(registry_routes_answer_from_the_table) {
    const char *root = kiln_test_dir();
    char *adm = NULL, *rd = NULL, url[64];
    kiln_registry_server *s = NULL;
    rfx_resp resp = {0};
    reg_route_info r[64];
    size_t n = rows(r, KILN_ARRAY_LEN(r));
    if (!CHECK("tokens",
               kiln_registry_token_create(root, "adm", KILN_SCOPE_ADMIN, &adm) == KILN_OK &&
                   kiln_registry_token_create(root, "rd", KILN_SCOPE_READ, &rd) == KILN_OK) ||
        !CHECK("server starts", rfx_serve(root, NULL, false, 2, &s, url) != 0))
        goto out;
    /* What the table should say, written out for the routes that take more than GET. */
    const struct {
        const char *path, *allow;
    } fixed[] = {{"/v1/models/m/versions/1", "GET, HEAD, PUT"},
                 {"/v1/models/m/channels/prod", "GET, HEAD, PUT"},
                 {"/v1/trust/2", "GET, HEAD, PUT"},
                 {"/v1/models", "GET, HEAD"},
                 {"/healthz", "GET, HEAD"},
                 {"/", "GET, HEAD"}};
    char got[64], want[64];
    for (size_t i = 0; i < KILN_ARRAY_LEN(fixed); i++) {
        long st = rfx_http(url, "DELETE", fixed[i].path, adm, NULL, NULL, &resp);
        header_of(&resp, "Allow", got, sizeof got);
        if (!CHECK("DELETE: 405 with the route's methods in Allow",
                   st == 405 && !strcmp(got, fixed[i].allow) &&
                       strstr(resp.body, "DELETE is not allowed on")))
            fprintf(stderr, "    %s: %ld, Allow '%s'\n", fixed[i].path, st, got);
    }
    for (size_t i = 0; i < n; i++) {
        char path[256];
        const char *caps[3];
        if (!sample_path(r[i].pattern, path, sizeof path, caps)) continue; /* said above */
        /* A method no row has: 405, Allow from the table. */
        allow_want(r, n, r[i].route, false, want, sizeof want);
        long st = rfx_http(url, "PATCH", path, adm, NULL, NULL, &resp);
        header_of(&resp, "Allow", got, sizeof got);
        if (!CHECK("PATCH: 405 with Allow from the route's rows", st == 405 && !strcmp(got, want)))
            fprintf(stderr, "    %s: %ld, Allow '%s', want '%s'\n", path, st, got, want);
        /* The row's method: answered by its handler, behind its scope. */
        const char *body = strcmp(r[i].method, "PUT") ? NULL : "x";
        if (r[i].scope > KILN_SCOPE_READ) {
            st = rfx_http(url, r[i].method, path, NULL, body, NULL, &resp);
            if (!CHECK("no token: 401", st == 401)) fprintf(stderr, "    %s: %ld\n", path, st);
            st = rfx_http(url, r[i].method, path, rd, body, NULL, &resp);
            if (!CHECK("a read token: 403", st == 403 && strstr(resp.body, "lacks the")))
                fprintf(stderr, "    %s: %ld\n", path, st);
        }
        st = rfx_http(url, r[i].method, path, r[i].scope > KILN_SCOPE_READ ? adm : NULL, body, NULL,
                      &resp);
        if (!CHECK("its own method reaches its handler",
                   st != 401 && st != 403 && st != 405 && !strstr(resp.body, "no such route")))
            fprintf(stderr, "    %s %s: %ld %s\n", r[i].method, path, st, resp.body);
    }
    CHECK("a path no route has: 404",
          rfx_http(url, "GET", "/v1/models/m/builds/1", NULL, NULL, NULL, &resp) == 404 &&
              strstr(resp.body, "no such route"));
out:
    kiln_registry_server_stop(s, 1000);
    rfx_resp_free(&resp);
    free(adm);
    free(rd);
}

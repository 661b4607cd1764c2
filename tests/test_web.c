/* test_web.c - the registry's web page: web/'s escaping and headers on their own, then a
 * real server on loopback whose store is filled through the API (archives packed and
 * signed, records signed and put) and, where a compromised store is the point, straight
 * into SQLite; the pages are fetched over HTTP and read as a browser would get them. */
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "registry_fx.h"
#include "registry_int.h"
#include "test.h"
#include "testutil.h"
#include "web.h"

#define HOSTILE "<script>alert(1)</script>&\"'"
#define HOSTILE_ESCAPED "&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;&#39;"

/* ---- escaping, headers, the buffer ---- */

static char *escaped(const char *s) {
    kiln_web_buf b = {0};
    kiln_web_text(&b, s);
    size_t len;
    return kiln_web_buf_take(&b, &len);
}

static bool escapes_to(const char *in, const char *want) {
    char *got = escaped(in);
    bool ok = got && !strcmp(got, want);
    if (!ok) fprintf(stderr, "    escaped '%s' as '%s', expected '%s'\n", in, got, want);
    free(got);
    return ok;
}

#define FFFD "\xEF\xBF\xBD"

KILN_TEST(web_escape) {
    CHECK("markup characters become references", escapes_to(HOSTILE, HOSTILE_ESCAPED));
    CHECK("plain text is left alone", escapes_to("market-alpha 1.0.0+b7", "market-alpha 1.0.0+b7"));
    CHECK("an attribute cannot be closed",
          escapes_to("x\" onmouseover=\"a", "x&quot; onmouseover=&quot;a"));
    CHECK("an existing reference is escaped again", escapes_to("&lt;", "&amp;lt;"));
    CHECK("UTF-8 passes", escapes_to("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80",
                                     "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));
    CHECK("tab and newline pass", escapes_to("a\tb\nc", "a\tb\nc"));
    CHECK("control characters are replaced", escapes_to("a\x01"
                                                        "b\x7f"
                                                        "c\r",
                                                        "a" FFFD "b" FFFD "c" FFFD));
    CHECK("C1 controls are replaced", escapes_to("a\xC2\x85"
                                                 "b",
                                                 "a" FFFD "b"));
    CHECK("an overlong '<' is no '<'", escapes_to("\xC0\xBC"
                                                  "b",
                                                  FFFD FFFD "b"));
    CHECK("an overlong '/' is replaced", escapes_to("a\xE0\x80\xAF", "a" FFFD FFFD FFFD));
    CHECK("surrogates are replaced", escapes_to("\xED\xA0\x80", FFFD FFFD FFFD));
    CHECK("past U+10FFFF is replaced", escapes_to("\xF4\x90\x80\x80", FFFD FFFD FFFD FFFD));
    CHECK("a sequence cut short is replaced", escapes_to("ok\xE2\x82", "ok" FFFD FFFD));
    CHECK("a stray continuation byte is replaced", escapes_to("\x80<", FFFD "&lt;"));
    CHECK("NULL appends nothing", escapes_to(NULL, ""));
}

KILN_TEST(web_buffer_out_of_memory) {
    kiln_web_buf b = {0};
    kiln_alloc_fail_after(1);
    kiln_web_text(&b, "lost");
    kiln_alloc_fail_after(0);
    kiln_web_text(&b, "after the failure");
    CHECK("the failure is remembered", b.nomem);
    size_t len = 99;
    char *p = kiln_web_buf_take(&b, &len);
    CHECK("no page comes out of it", !p && len == 0);
    CHECK("and the message says why", strstr(kiln_errmsg(), "out of memory while rendering"));
    free(p);
    kiln_web_buf_release(&b);
}

/* The CSP the page must carry: its own stylesheet's sha256, base64. */
static void expected_csp(char *out, size_t cap) {
    uint8_t h[KILN_SHA256_BYTES];
    char b64[sodium_base64_ENCODED_LEN(KILN_SHA256_BYTES, sodium_base64_VARIANT_ORIGINAL)];
    const char *css = kiln_web_stylesheet();
    kiln_sha256(css, strlen(css), h);
    sodium_bin2base64(b64, sizeof b64, h, sizeof h, sodium_base64_VARIANT_ORIGINAL);
    snprintf(out, cap,
             "default-src 'none'; style-src 'sha256-%s'; base-uri 'none'; form-action 'none'; "
             "frame-ancestors 'none'",
             b64);
}

KILN_TEST(web_headers) {
    size_t n = 0;
    const kiln_web_header *h = kiln_web_headers(&n);
    char csp[256];
    expected_csp(csp, sizeof csp);
    int found = 0;
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(h[i].name, "Content-Security-Policy"))
            found += CHECK("the CSP allows the stylesheet by its hash", !strcmp(h[i].value, csp));
        if (!strcmp(h[i].name, "Content-Type"))
            found += CHECK("html in UTF-8", !strcmp(h[i].value, "text/html; charset=utf-8"));
        if (!strcmp(h[i].name, "X-Content-Type-Options"))
            found += CHECK("nosniff", !strcmp(h[i].value, "nosniff"));
        if (!strcmp(h[i].name, "Referrer-Policy"))
            found += CHECK("no referrer", !strcmp(h[i].value, "no-referrer"));
    }
    CHECK("all four are there", found == 4);
    /* The hash is of the <style> element's text exactly as the page carries it. */
    kiln_web_buf b = {0};
    kiln_web_error(&b, 404, "x", 0);
    size_t len;
    char *page = kiln_web_buf_take(&b, &len),
         *want = kiln_asprintf("<style>%s</style>", kiln_web_stylesheet());
    CHECK("the page carries the stylesheet hashed", page && want && strstr(page, want));
    CHECK("and no other style or script", page && !strstr(page, "style=") &&
                                              !strstr(page, "<script") &&
                                              strstr(page, "<style") == strstr(page, want));
    free(page);
    free(want);
}

/* ---- a server ---- */

typedef rfx_resp page;

/* One request to the server at url; the page (body "" when there is none) and its headers in
 * *p. */
static long fetch(const char *url, const char *method, const char *path, const char *token,
                  page *p) {
    return rfx_http(url, method, path, token, NULL, NULL, p);
}

static bool has(const page *p, const char *s) {
    bool ok = p->body && strstr(p->body, s);
    if (!ok) fprintf(stderr, "    the page lacks '%s'\n", s);
    return ok;
}

/* The header's value is exactly want (the name in any case). */
static bool header(const page *p, const char *name, const char *want) {
    size_t nl = strlen(name);
    for (const char *l = p->hdr; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncasecmp(l, name, nl) || l[nl] != ':') continue;
        const char *v = l + nl + 1;
        while (*v == ' ')
            v++;
        size_t vl = strcspn(v, "\r\n");
        return vl == strlen(want) && !strncmp(v, want, vl);
    }
    return false;
}

/* needle occurs in hay from a on, before b. */
static bool between(const char *a, const char *needle, const char *b) {
    const char *x = a ? strstr(a, needle) : NULL;
    return x && b && x < b;
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay ? strstr(hay, needle) : NULL; p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* The table row (from the marker to its </tr>) that holds marker; caller frees. */
static char *row_of(const page *p, const char *marker) {
    const char *a = p->body ? strstr(p->body, marker) : NULL, *e = a ? strstr(a, "</tr>") : NULL;
    if (!e) return kiln_strdup("");
    char *r = kiln_malloc((size_t)(e - a) + 1);
    if (r) {
        memcpy(r, a, (size_t)(e - a));
        r[e - a] = 0;
    }
    return r;
}

typedef struct wfx {
    rfx reg; /* tokens: admin, pub, prom, rd */
    kiln_sign_seckey *rel, *p1;
} wfx;

static bool wfx_init(wfx *f, bool read_required) {
    memset(f, 0, sizeof *f);
    char r[KILN_SIGN_PUBKEY_B64], a[KILN_SIGN_PUBKEY_B64];
    if (!kiln_test_keypair(&f->rel, r) || !kiln_test_keypair(&f->p1, a)) return false;
    char *t = kiln_asprintf("{\"format\":\"kiln-trust/1\",\"keys\":["
                            "{\"name\":\"rel\",\"pubkey\":\"%s\",\"roles\":[\"release\"]},"
                            "{\"name\":\"p1\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]}],"
                            "\"channels\":{\"staging\":{\"threshold\":1},"
                            "\"production\":{\"threshold\":1},\"canary\":{\"threshold\":1}},"
                            "\"accept_unvalidated\":true}",
                            r, a);
    bool ok =
        t && rfx_init(&f->reg, "reg", t,
                      KILN_SCOPE_ADMIN | KILN_SCOPE_PUBLISH | KILN_SCOPE_PROMOTE | KILN_SCOPE_READ,
                      2, read_required);
    free(t);
    return ok;
}

static void wfx_free(wfx *f) {
    rfx_free(&f->reg);
    kiln_sign_seckey_free(f->rel);
    kiln_sign_seckey_free(f->p1);
}

/* Pack a model directory (weights and card) as demo@version, sign it as `kiln sign
 * --allow-unvalidated` does, publish it; hex gets its digest. */
static bool publish(const wfx *f, const char *version, const char *card,
                    char hex[KILN_SHA256_HEX]) {
    char name[80];
    snprintf(name, sizeof name, "model-%s", version);
    char *path = rfx_archive(name, version, strlen(version), card, version, f->rel, hex);
    kiln_registry_client_opts cl = {.url = f->reg.url, .token = f->reg.pub, .retries = 0};
    kiln_registry_published res;
    bool ok = path && kiln_registry_publish(&cl, path, NULL, &res) == KILN_OK;
    free(path);
    return ok;
}

/* A channel record for demo, signed by p1; its text (caller frees). */
static char *record(const wfx *f, const char *channel, const char *version, const char *hex,
                    uint64_t seq, int64_t expires, const char *reason) {
    kiln_sign_seckey *keys[] = {f->p1, NULL};
    return rfx_record(channel, version, hex, seq, expires, reason, keys);
}

static bool put_record(const wfx *f, const char *channel, const char *version, const char *hex,
                       uint64_t seq, int64_t expires, const char *reason) {
    char *text = record(f, channel, version, hex, seq, expires, reason);
    kiln_registry_client_opts cl = {.url = f->reg.url, .token = f->reg.prom, .retries = 0};
    bool ok =
        text && kiln_registry_put_channel(&cl, "demo", channel, text, strlen(text)) == KILN_OK;
    free(text);
    return ok;
}

/* SQL run on the store as it is, no server involved (what a compromised store holds): ?1
 * binds text, ?2 the time now. */
static bool store_sql(const wfx *f, const char *sql, const char *text) {
    return rfx_sql(f->reg.root, RFX_OPEN, sql, text);
}

#define CARD(run)                                                                                  \
    "{\"name\":\"demo\",\"created\":\"2026-03-04T05:06:07Z\",\"lineage\":{\"run_id\":\"" run       \
    "\",\"step\":40,\"dataset_sha256\":\"d5a7a5e7c0ffee00\",\"code_version\":\"0.1.0\","           \
    "\"metrics\":{\"loss\":0.5,\"val_loss\":0.75}}}"

KILN_TEST(web_pages_show_the_store) {
    wfx f;
    page p = {0};
    char *row = NULL;
    if (!CHECK("a registry", wfx_init(&f, false))) goto out;
    char h1[KILN_SHA256_HEX], h2[KILN_SHA256_HEX];
    int64_t now = kiln_unix_time();
    CHECK("publish 1.0.0", publish(&f, "1.0.0", CARD("r-one"), h1));
    CHECK("publish 1.1.0, its card hostile",
          publish(&f, "1.1.0", CARD("<img src=x onerror=alert(1)>"), h2));
    CHECK("production: promote, promote (hostile reason), roll back (expiring soon)",
          put_record(&f, "production", "1.0.0", h1, 1, now + 30 * 86400, "promote") &&
              put_record(&f, "production", "1.1.0", h2, 2, now + 30 * 86400, HOSTILE) &&
              put_record(&f, "production", "1.0.0", h1, 3, now + 86400, "rollback"));
    CHECK("staging", put_record(&f, "staging", "1.1.0", h2, 1, now + 30 * 86400, "promote"));
    /* The server takes no expired record; one that expired in the store since is shown so. */
    char *expired = record(&f, "canary", "1.0.0", h1, 1, now - 7200, "canary");
    char *d1 = kiln_asprintf("sha256:%s", h1);
    char *sql = kiln_asprintf("INSERT INTO channel_records VALUES('demo', 'canary', 1, '1.0.0', "
                              "'%s', %lld, 'canary', ?1, 'ci', ?2)",
                              d1, (long long)(now - 7200));
    CHECK("an expired record in the store", expired && sql && store_sql(&f, sql, expired));
    CHECK("a version a compromised store made up",
          store_sql(&f,
                    "INSERT INTO versions VALUES('demo', '0.9.0', 'sha256:00', 10, '{}', "
                    "'not a signature', '{not json', NULL, ?1, ?2, NULL)",
                    "<b>evil</b>"));
    free(expired), free(d1), free(sql);

    char csp[256];
    expected_csp(csp, sizeof csp);
    CHECK("/", fetch(f.reg.url, "GET", "/", NULL, &p) == 200);
    CHECK("html in UTF-8", header(&p, "Content-Type", "text/html; charset=utf-8"));
    CHECK("the CSP", header(&p, "Content-Security-Policy", csp));
    CHECK("nosniff", header(&p, "X-Content-Type-Options", "nosniff"));
    CHECK("no referrer", header(&p, "Referrer-Policy", "no-referrer"));
    CHECK("the model",
          has(&p, "<td><a href=\"/ui/models/demo\">demo</a></td><td class=\"n\">3</td>"));
    CHECK("the version published last",
          has(&p, "<td><a href=\"/v1/models/demo/versions/0.9.0\">0.9.0</a></td>"));
    CHECK("staging at a glance",
          has(&p, "staging</a> \xE2\x86\x92 1.1.0 <small>seq 1</small></span>"));
    CHECK("production at a glance, expiring soon",
          has(&p, "production</a> \xE2\x86\x92 1.0.0 <small>seq 3</small> <span class=\"tag "
                  "warn\">expires soon</span></span>"));
    CHECK("canary at a glance, expired",
          has(&p, "canary</a> \xE2\x86\x92 1.0.0 <small>seq 1</small> <span class=\"tag "
                  "bad\">expired</span></span>"));
    CHECK("HEAD", fetch(f.reg.url, "HEAD", "/", NULL, &p) == 200 && p.len == 0 &&
                      header(&p, "Content-Type", "text/html; charset=utf-8"));

    CHECK("the model's page", fetch(f.reg.url, "GET", "/ui/models/demo", NULL, &p) == 200);
    CHECK("its headers", header(&p, "Content-Security-Policy", csp) &&
                             header(&p, "X-Content-Type-Options", "nosniff"));
    free(row);
    row = row_of(&p, "channels/production\">production</a>");
    CHECK("production: version, seq, reason, signer, who, history",
          row && strstr(row, ">1.0.0</a>") && strstr(row, "<td class=\"n\">3</td>") &&
              strstr(row, "<td>rollback</td>") && strstr(row, "<td>p1 <small><code>") &&
              strstr(row, "<td>rm</td>") && strstr(row, ">3 records</a>"));
    CHECK("production expires soon",
          row && strstr(row, "class=\"tag warn\">expires soon<") && !strstr(row, ">expired<"));
    free(row);
    row = row_of(&p, "channels/canary\">canary</a>");
    CHECK("canary has expired", row && strstr(row, "<span class=\"tag bad\">expired</span>") &&
                                    strstr(row, " ago</small>"));
    free(row);
    row = row_of(&p, "channels/staging\">staging</a>");
    CHECK("staging is neither", row && strstr(row, "</time> <small>in ") &&
                                    !strstr(row, "expired") && !strstr(row, "expires soon"));
    kiln_sign_pubkey pk;
    char keyid[KILN_SIGN_KEYID_HEX], signer[64];
    CHECK("the release key", kiln_sign_seckey_pubkey(f.rel, &pk) == KILN_OK);
    kiln_sign_keyid_hex(pk.keyid, keyid);
    snprintf(signer, sizeof signer, "rel <small><code>%s</code></small>", keyid);
    free(row);
    row = row_of(&p, ">1.0.0</a> <span class=\"tag ok\">canary</span> <span class=\"tag "
                     "ok\">production</span></td>");
    char want[80];
    snprintf(want, sizeof want, "sha256:%.12s\xE2\x80\xA6</code>", h1);
    CHECK("1.0.0: the channels on it, digest, size, publisher, verdict, signer, lineage",
          row && strstr(row, want) && strstr(row, " bytes\">") && strstr(row, "<td>ci</td>") &&
              strstr(row, "<span class=\"tag warn\">absent</span>") && strstr(row, signer) &&
              strstr(row, "allow-unvalidated") &&
              strstr(row, "run <code>r-one</code> \xC2\xB7 step 40 \xC2\xB7 dataset") &&
              strstr(row, "<small>loss 0.5 \xC2\xB7 val_loss 0.75</small>"));
    free(row);
    row = row_of(&p, ">0.9.0</a>");
    CHECK("the made-up version: no signature, no lineage, its publisher escaped",
          row && strstr(row, "no signature read") && strstr(row, "no lineage") &&
              strstr(row, "<td>&lt;b&gt;evil&lt;/b&gt;</td>"));
    const char *v9 = p.body ? strstr(p.body, ">0.9.0</a>") : NULL;
    CHECK("versions newest first",
          between(v9, ">1.1.0</a> <span", strstr(p.body, ">1.0.0</a> <span")) &&
              between(p.body, ">0.9.0</a>", strstr(p.body, ">1.1.0</a> <span")));
    CHECK("the hostile card is text",
          has(&p, "run <code>&lt;img src=x onerror=alert(1)&gt;</code>") &&
              !strstr(p.body, "<img") && !strstr(p.body, "<b>"));

    CHECK("production's history",
          fetch(f.reg.url, "GET", "/ui/models/demo/channels/production", NULL, &p) == 200);
    CHECK("three records", count(p.body, "<tr><td class=\"n\">") == 3);
    const char *s3 = strstr(p.body, "<tr><td class=\"n\">3 <span class=\"tag ok\">current</span>"),
               *s2 = strstr(p.body, "<tr><td class=\"n\">2</td>"),
               *s1 = strstr(p.body, "<tr><td class=\"n\">1</td>");
    CHECK("newest first, the current one marked", s3 && s2 && s1 && s3 < s2 && s2 < s1);
    CHECK("the rollback", between(s3, "<span class=\"tag warn\">rollback</span> from 1.1.0", s2));
    CHECK("the promotion", between(s2, "<span class=\"tag\">promote</span> from 1.0.0", s1));
    CHECK("the first", s1 && strstr(s1, "<span class=\"tag\">first</span>"));
    CHECK("the current record expires soon",
          between(s3, "expires soon", s2) && count(p.body, "expires soon") == 1);
    CHECK("the hostile reason arrives as text", has(&p, "<td>" HOSTILE_ESCAPED "</td>"));
    CHECK("and never raw", !strstr(p.body, "<script") && !strstr(p.body, HOSTILE));
    CHECK("the API still serves it byte for byte",
          fetch(f.reg.url, "GET", "/v1/models/demo/channels/production/history", NULL, &p) == 200 &&
              header(&p, "Content-Type", "application/json"));

    CHECK("metrics count the pages",
          rfx_metrics_have(
              f.reg.url, NULL,
              (const char *[]){"route=\"/\",method=\"GET\",status=\"200\"} 1",
                               "route=\"/\",method=\"HEAD\",status=\"200\"} 1",
                               "route=\"/ui/models/{model}\",method=\"GET\",status=\"200\"} 1",
                               "route=\"/ui/models/{model}/channels/{channel}\",method=\"GET\","
                               "status=\"200\"} 1",
                               NULL},
              &p));
out:
    free(row);
    rfx_resp_free(&p);
    wfx_free(&f);
}

/* An error page: the status, HTML with the same headers, the message escaped. */
static bool error_page(const page *p, long status, const char *msg) {
    return p->status == status && header(p, "Content-Type", "text/html; charset=utf-8") &&
           header(p, "X-Content-Type-Options", "nosniff") && has(p, "<!DOCTYPE html>") &&
           has(p, msg);
}

KILN_TEST(web_pages_auth_and_refusals) {
    wfx f;
    page p = {0};
    if (!CHECK("a registry whose reads need a token", wfx_init(&f, true))) goto out;
    char h1[KILN_SHA256_HEX];
    CHECK("a version", publish(&f, "1.0.0", CARD("r"), h1));
    fetch(f.reg.url, "GET", "/", NULL, &p);
    CHECK("no token: 401 as a page", error_page(&p, 401, "this request needs a token"));
    CHECK("which says how to send one", header(&p, "WWW-Authenticate", "Bearer realm=\"kiln\"") &&
                                            has(&p, "Authorization: Bearer &lt;token&gt;"));
    fetch(f.reg.url, "GET", "/", "kiln_0000", &p);
    CHECK("an unknown token: 401", error_page(&p, 401, "unknown token"));
    CHECK("a read token",
          fetch(f.reg.url, "GET", "/", f.reg.rd, &p) == 200 && has(&p, ">demo</a>"));
    CHECK("any scope reads", fetch(f.reg.url, "GET", "/ui/models/demo", f.reg.pub, &p) == 200);
    fetch(f.reg.url, "GET", "/ui/models/nope", NULL, &p);
    CHECK("no token: 401 before anything is looked up", error_page(&p, 401, "needs a token"));
    fetch(f.reg.url, "GET", "/ui/audit", f.reg.rd, &p);
    CHECK("the audit log with a read token: 403",
          error_page(&p, 403, "token &#39;viewer&#39; lacks the &#39;admin&#39; scope"));
    CHECK("with an admin token", fetch(f.reg.url, "GET", "/ui/audit", f.reg.admin, &p) == 200 &&
                                     has(&p, "<td>publish</td>"));
    fetch(f.reg.url, "GET", "/ui/models/nope", f.reg.rd, &p);
    CHECK("an unknown model: 404", error_page(&p, 404, "model &#39;nope&#39; not found"));
    fetch(f.reg.url, "GET", "/ui/models/demo/channels/nope", f.reg.rd, &p);
    CHECK("an unknown channel: 404",
          error_page(&p, 404, "channel &#39;nope&#39; of model &#39;demo&#39; not found"));
    const char *bad[] = {"/ui/models/..%2Fetc", "/ui/models/Upper", "/ui/models/%3Cb%3E",
                         "/ui/models/demo/channels/a%2Fb", "/ui/models/"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        fetch(f.reg.url, "GET", bad[i], f.reg.rd, &p);
        CHECK("a bad name: 400", error_page(&p, 400, " name "));
    }
    CHECK("the bad name is shown as text",
          fetch(f.reg.url, "GET", "/ui/models/%3Cb%3E", f.reg.rd, &p) == 400 &&
              has(&p, "&#39;&lt;b&gt;&#39;") && !strstr(p.body, "<b>"));
    fetch(f.reg.url, "GET", "/ui/models/a%zz", f.reg.rd, &p);
    CHECK("a malformed path: 400", error_page(&p, 400, "malformed path"));
    fetch(f.reg.url, "GET", "/ui/nope", f.reg.rd, &p);
    CHECK("an unknown page: 404", error_page(&p, 404, "no such route"));
    fetch(f.reg.url, "POST", "/", f.reg.admin, &p);
    CHECK("POST: 405",
          error_page(&p, 405, "POST is not allowed on /") && header(&p, "Allow", "GET, HEAD"));
    CHECK("the API's errors stay JSON",
          fetch(f.reg.url, "GET", "/v1/models/nope", f.reg.rd, &p) == 404 &&
              header(&p, "Content-Type", "application/json"));
    CHECK(
        "refusals are counted",
        rfx_metrics_have(
            f.reg.url, f.reg.rd,
            (const char *[]){"route=\"/ui/audit\",method=\"GET\",status=\"403\"} 1",
                             "route=\"/ui/models/{model}\",method=\"GET\",status=\"400\"} 5", NULL},
            &p));
out:
    rfx_resp_free(&p);
    wfx_free(&f);
}

KILN_TEST(web_audit_pages) {
    wfx f;
    page p = {0};
    if (!CHECK("a registry", wfx_init(&f, false))) goto out;
    /* Four token rows from the fixture, then 247 more: 251 in all. */
    sqlite3 *db;
    bool ok = reg_db_open(f.reg.root, &db) == KILN_OK && reg_db_exec(db, "BEGIN") == KILN_OK;
    for (int i = 0; ok && i < 247; i++)
        ok = reg_audit(db, i == 100 ? "<i>tok</i>" : "ci", "publish", "demo", "1.0.0", NULL,
                       NULL) == KILN_OK;
    ok = ok && reg_db_exec(db, "COMMIT") == KILN_OK;
    reg_db_close(db);
    CHECK("251 audit rows", ok);
    CHECK("the first page", fetch(f.reg.url, "GET", "/ui/audit", f.reg.admin, &p) == 200);
    CHECK("says how many", has(&p, "251 entries in all, oldest first."));
    CHECK("holds 1 to 100", count(p.body, "<tr><td class=\"n\">") == 100 &&
                                has(&p, "<tr><td class=\"n\">1</td>") &&
                                has(&p, "<tr><td class=\"n\">100</td>") &&
                                !strstr(p.body, "<tr><td class=\"n\">101</td>"));
    CHECK("the token rows", has(&p, "<td>ops</td><td>token.create</td>"));
    CHECK("links on", has(&p, "<a href=\"/ui/audit?after=100\">next page</a>") &&
                          has(&p, "<a href=\"/ui/audit?after=151\">newest</a>"));
    CHECK("the second page",
          fetch(f.reg.url, "GET", "/ui/audit?after=100", f.reg.admin, &p) == 200 &&
              has(&p, "those after #100") && has(&p, "<tr><td class=\"n\">101</td>") &&
              has(&p, "<a href=\"/ui/audit?after=200\">next page</a>"));
    CHECK("a hostile token name is text",
          has(&p, "<td>&lt;i&gt;tok&lt;/i&gt;</td>") && !strstr(p.body, "<i>"));
    CHECK("the last page", fetch(f.reg.url, "GET", "/ui/audit?after=200", f.reg.admin, &p) == 200 &&
                               count(p.body, "<tr><td class=\"n\">") == 51 &&
                               !strstr(p.body, "next page"));
    CHECK("a model links to its page", has(&p, "<a href=\"/ui/models/demo\">demo</a>"));
    CHECK("past the end", fetch(f.reg.url, "GET", "/ui/audit?after=999", f.reg.admin, &p) == 200 &&
                              has(&p, "No entries here."));
    CHECK("garbage reads as the start",
          fetch(f.reg.url, "GET", "/ui/audit?after=x%3C", f.reg.admin, &p) == 200 &&
              has(&p, "<tr><td class=\"n\">1</td>"));
out:
    rfx_resp_free(&p);
    wfx_free(&f);
}

KILN_TEST(web_history_pages) {
    wfx f;
    page p = {0};
    if (!CHECK("a registry", wfx_init(&f, false))) goto out;
    char h[2][KILN_SHA256_HEX];
    CHECK("two versions",
          publish(&f, "1.0.0", CARD("a"), h[0]) && publish(&f, "1.1.0", CARD("b"), h[1]));
    /* 205 records, odd seqs on 1.0.0 and even ones on 1.1.0: every other one a rollback. */
    sqlite3 *db;
    sqlite3_stmt *st = NULL;
    bool ok = reg_db_open(f.reg.root, &db) == KILN_OK && reg_db_exec(db, "BEGIN") == KILN_OK &&
              sqlite3_prepare_v2(db,
                                 "INSERT INTO channel_records VALUES('demo', 'staging', ?1, ?2, "
                                 "?3, ?4, 'r', ?5, 'rm', ?4)",
                                 -1, &st, NULL) == SQLITE_OK;
    int64_t exp = kiln_unix_time() + 30 * 86400;
    for (int s = 1; ok && s <= 205; s++) {
        const char *v = s % 2 ? "1.0.0" : "1.1.0";
        char *text = record(&f, "staging", v, h[s % 2 ? 0 : 1], (uint64_t)s, exp, "r"),
             *d = kiln_asprintf("sha256:%s", h[s % 2 ? 0 : 1]);
        ok = text && d;
        if (ok) {
            sqlite3_bind_int(st, 1, s);
            sqlite3_bind_text(st, 2, v, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 3, d, -1, SQLITE_TRANSIENT);
            sqlite3_bind_int64(st, 4, exp);
            sqlite3_bind_text(st, 5, text, -1, SQLITE_TRANSIENT);
            ok = sqlite3_step(st) == SQLITE_DONE && sqlite3_reset(st) == SQLITE_OK;
        }
        free(text), free(d);
    }
    sqlite3_finalize(st);
    ok = ok && reg_db_exec(db, "COMMIT") == KILN_OK;
    reg_db_close(db);
    CHECK("205 records in the store", ok);
    CHECK("the newest page",
          fetch(f.reg.url, "GET", "/ui/models/demo/channels/staging", NULL, &p) == 200 &&
              has(&p, "205 records, newest first.") &&
              count(p.body, "<tr><td class=\"n\">") == 200);
    CHECK("starts at the current record",
          has(&p, "<tr><td class=\"n\">205 <span class=\"tag ok\">current</span>") &&
              count(p.body, ">current<") == 1);
    const char *s6 = strstr(p.body, "<tr><td class=\"n\">6</td>");
    CHECK("ends at seq 6, a promotion",
          between(s6, "promote</span> from 1.0.0", strstr(s6, "</tr>")) &&
              !strstr(p.body, "<tr><td class=\"n\">5</td>"));
    CHECK("links to the older records",
          has(&p, "<a href=\"/ui/models/demo/channels/staging?before=6\">older records</a>"));
    CHECK("the older page",
          fetch(f.reg.url, "GET", "/ui/models/demo/channels/staging?before=6", NULL, &p) == 200 &&
              has(&p, "205 records; those before seq 6, newest first.") &&
              count(p.body, "<tr><td class=\"n\">") == 5 && !strstr(p.body, ">current<") &&
              !strstr(p.body, "older records"));
    const char *s5 = strstr(p.body, "<tr><td class=\"n\">5</td>");
    CHECK("its first row knows the record before it",
          between(s5, "<span class=\"tag warn\">rollback</span> from 1.1.0", strstr(s5, "</tr>")));
    CHECK("and its last is the first",
          has(&p, "<tr><td class=\"n\">1</td><td><span class=\"tag\">first</span>"));
    CHECK("before the first",
          fetch(f.reg.url, "GET", "/ui/models/demo/channels/staging?before=1", NULL, &p) == 200 &&
              has(&p, "No records here."));
    CHECK("an unknown channel with a page is still unknown",
          fetch(f.reg.url, "GET", "/ui/models/demo/channels/nope?before=3", NULL, &p) == 404);
out:
    rfx_resp_free(&p);
    wfx_free(&f);
}

/* A bounded page (kiln runs serve's KILN_WEB_PAGE_MAX) stops growing at its limit and is
 * refused whole with KILN_ERR_LIMIT saying so; a long string is cut where a character
 * begins, with the marker. */
KILN_TEST(web_page_bound_and_cut) {
    kiln_web_buf b = {.limit = 4096};
    for (int i = 0; i < 100; i++)
        kiln_web_text(&b, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
    CHECK("the buffer never passed its limit", b.len <= 4096 && b.over);
    size_t len = 1;
    char *p = kiln_web_buf_take(&b, &len);
    CHECK("an over-long page is refused", !p && len == 0);
    CHECK("... saying why", kiln_test_msg_has("more than", "MiB"));
    free(p);
    kiln_web_buf c = {0};
    char s[3000];
    memset(s, 'a', sizeof s);
    memcpy(s + 1022, "\xC3\xA9", 2); /* an é across the cut */
    s[sizeof s - 1] = 0;
    kiln_web_text_cut(&c, s, 1023);
    p = kiln_web_buf_take(&c, &len);
    CHECK("cut before the character that would not fit, with the marker",
          p && len == 1022 + 3 && !memcmp(p + 1022, "\xE2\x80\xA6", 3));
    free(p);
}

/* test_web_trust.c - the registry's trust page (/ui/trust) and the front page's line on the
 * policy: a real server on loopback whose trust versions go in through the API (kiln trust
 * put's PUT /v1/trust/N) and, where a compromised store is the point, straight into SQLite;
 * the pages are fetched over HTTP as a browser gets them. web/'s trust functions alone for
 * what no policy can carry (names with markup). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "registry_fx.h"
#include "registry_int.h"
#include "test.h"
#include "testutil.h"
#include "web.h"

#define HOSTILE "<script>alert(1)</script>"
#define HOSTILE_ESCAPED "&lt;script&gt;alert(1)&lt;/script&gt;"

/* r1 r2 r3: root keys; rel: release; alice bob carol: promote. */
enum { R1, R2, R3, REL, ALICE, BOB, CAROL, NK };
static const char *const kname[NK] = {"r1", "r2", "r3", "rel", "alice", "bob", "carol"};
static const char *const krole[NK] = {"root",    "root",    "root",   "release",
                                      "promote", "promote", "promote"};

typedef struct wtfx {
    rfx reg; /* tokens: admin, rd; reads need one */
    kiln_sign_seckey *sk[NK];
    char b64[NK][KILN_SIGN_PUBKEY_B64], id[NK][KILN_SIGN_KEYID_HEX];
} wtfx;

/* A policy of version v holding the keys in mask (a bit per key), root_threshold 2,
 * staging's threshold 1 and production's prod. Caller frees. */
static char *policy(const wtfx *f, uint64_t v, unsigned mask, int prod) {
    char keys[4096] = "";
    size_t n = 0;
    for (int k = 0; k < NK; k++)
        if (mask & (1u << k))
            n += (size_t)snprintf(keys + n, sizeof keys - n,
                                  "%s{\"name\":\"%s\",\"pubkey\":\"%s\",\"roles\":[\"%s\"]}",
                                  n ? "," : "", kname[k], f->b64[k], krole[k]);
    return kiln_asprintf("{\"format\":\"kiln-trust/1\",\"version\":%llu,\"root_threshold\":2,"
                         "\"keys\":[%s],\"channels\":{\"staging\":{\"threshold\":1},"
                         "\"production\":{\"threshold\":%d}},\"accept_unvalidated\":true}",
                         (unsigned long long)v, keys, prod);
}
#define BIT(k) (1u << (k))
#define V1 (BIT(R1) | BIT(R2) | BIT(REL) | BIT(ALICE) | BIT(BOB) | BIT(CAROL))

/* text signed by each key in signers (-1 ends). Caller frees. */
static char *sign_by(const wtfx *f, const char *text, const int *signers) {
    return rfx_trust_sign(text, "v", f->sk, signers);
}

static bool init(wtfx *f) {
    memset(f, 0, sizeof *f);
    if (!rfx_keys(f->sk, f->b64, NK)) return false;
    for (int i = 0; i < NK; i++) {
        kiln_sign_pubkey pk;
        if (kiln_sign_seckey_pubkey(f->sk[i], &pk) != KILN_OK) return false;
        kiln_sign_keyid_hex(pk.keyid, f->id[i]);
    }
    char *v1 = policy(f, 1, V1, 2);
    bool ok = v1 && rfx_init(&f->reg, "reg", v1, KILN_SCOPE_ADMIN | KILN_SCOPE_READ, 2, true);
    free(v1);
    return ok;
}

static void release(wtfx *f) {
    rfx_free(&f->reg);
    rfx_keys_free(f->sk, NK);
}

/* PUT the signed version doc (kiln trust put); false if refused. */
static bool put(const wtfx *f, const char *doc) {
    kiln_registry_client_opts c = {.url = f->reg.url, .token = f->reg.admin, .retries = 0};
    uint64_t v;
    return doc && kiln_registry_trust_put(&c, doc, strlen(doc), "v.json", &v) == KILN_OK;
}

/* Version v with the keys in mask, signed by signers, put. */
static bool rotate(const wtfx *f, uint64_t v, unsigned mask, int prod, const int *signers) {
    char *p = policy(f, v, mask, prod), *doc = sign_by(f, p, signers);
    bool ok = put(f, doc);
    free(p), free(doc);
    return ok;
}

/* Run SQL on the store while the server runs (a compromised store); ?1 binds text. */
static bool store_sql(const wtfx *f, const char *sql, const char *text) {
    return rfx_sql(f->reg.root, RFX_CONNECT, sql, text);
}

/* ---- fetching ---- */

typedef rfx_resp page;

static long get(const wtfx *f, const char *path, const char *token, page *p) {
    return rfx_http(f->reg.url, "GET", path, token, NULL, NULL, p);
}

static bool has(const char *hay, const char *s) {
    bool ok = hay && strstr(hay, s);
    if (!ok) fprintf(stderr, "    '%s' is not there\n", s);
    return ok;
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay ? strstr(hay, needle) : NULL; p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* The history row of version v (from its first cell to its </tr>), "" when there is none;
 * caller frees. */
static char *row(const page *p, uint64_t v) {
    char mark[64];
    snprintf(mark, sizeof mark, "<td class=\"n\">%llu", (unsigned long long)v);
    const char *a = p->body, *e = NULL;
    /* The history's first cell is the version followed by '<' or ' ' (a tag). */
    while (a && (a = strstr(a, mark)) != NULL) {
        char c = a[strlen(mark)];
        if ((c == '<' || c == ' ') && strstr(a, "</time>") < strstr(a, "</tr>")) break;
        a += strlen(mark);
    }
    e = a ? strstr(a, "</tr>") : NULL;
    if (!e) return kiln_strdup("");
    /* Back to the row's start, for its class. */
    const char *s = a;
    while (s > p->body && strncmp(s, "<tr", 3))
        s--;
    char *r = kiln_malloc((size_t)(e - s) + 1);
    if (r) {
        memcpy(r, s, (size_t)(e - s));
        r[e - s] = 0;
    }
    return r;
}

/* "name <small><code>ID</code></small>" then the quorum tags, as a signer is shown. */
static bool signed_by(const char *r, const wtfx *f, int k, int old_v, int new_v) {
    char want[256];
    int n = snprintf(want, sizeof want, "%s <small><code>%s</code></small>", kname[k], f->id[k]);
    if (old_v)
        n += snprintf(want + n, sizeof want - (size_t)n, " <span class=\"tag\">v%d</span>", old_v);
    if (new_v)
        snprintf(want + n, sizeof want - (size_t)n, " <span class=\"tag\">v%d</span>", new_v);
    /* The tags end there: the next is a line break or the quorum line. */
    const char *at = r ? strstr(r, want) : NULL;
    bool ok = at && !strncmp(at + strlen(want), "<br>", 4);
    if (!ok) fprintf(stderr, "    signer '%s' is not in the row '%s'\n", want, r ? r : "");
    return ok;
}

/* A key's row in the policy in force. */
static bool key_row(const page *p, const wtfx *f, int k, const char *roles) {
    char want[256];
    snprintf(want, sizeof want, "<tr><td>%s</td><td><code>%s</code></td><td>%s</td></tr>", kname[k],
             f->id[k], roles);
    return has(p->body, want);
}

#define ROOT_TAG "<span class=\"tag warn\">root</span>"
#define PROMOTE_TAG "<span class=\"tag\">promote</span>"
#define RELEASE_TAG "<span class=\"tag\">release</span>"

/* ---- the tests ---- */

KILN_TEST(web_trust_page_after_rotations) {
    wtfx f;
    page p = {0};
    char *r = NULL;
    if (!CHECK("a registry at trust version 1", init(&f))) goto out;

    /* 0 rotations: the --trust file is in force, nothing stored. */
    CHECK("/", get(&f, "/", f.reg.rd, &p) == 200);
    CHECK("the front page's line",
          has(p.body, "<p>Trust policy version 1 in force: 2 root, 1 release, 3 promote keys. "
                      "<a href=\"/ui/trust\">Keys and versions</a></p>"));
    CHECK("/ui/trust", get(&f, "/ui/trust", f.reg.rd, &p) == 200);
    CHECK("version 1 in force", has(p.body, "<h2>In force: version 1</h2>"));
    CHECK("the thresholds",
          has(p.body, "Root threshold <b>2</b> of 2 root keys") &&
              has(p.body, "release threshold <b>1</b> of 1 release key (each archive)") &&
              has(p.body, "accept_unvalidated <span class=\"tag warn\">true</span>"));
    CHECK("each key: name, key id, roles",
          key_row(&p, &f, R1, ROOT_TAG) && key_row(&p, &f, R2, ROOT_TAG) &&
              key_row(&p, &f, REL, RELEASE_TAG) && key_row(&p, &f, ALICE, PROMOTE_TAG) &&
              key_row(&p, &f, BOB, PROMOTE_TAG) && key_row(&p, &f, CAROL, PROMOTE_TAG));
    CHECK("each channel's promote threshold",
          has(p.body, "<tr><td>staging</td><td class=\"n\">1</td></tr>") &&
              has(p.body, "<tr><td>production</td><td class=\"n\">2</td></tr>"));
    CHECK("no stored versions", has(p.body, "0 stored versions, newest first.") &&
                                    has(p.body, "No versions here") &&
                                    !strstr(p.body, "older versions"));
    CHECK("the JSON route", has(p.body, "<a href=\"/v1/trust\"><code>/v1/trust</code></a>"));

    /* 1 rotation: alice's key is stolen; r1 and r2 sign version 2 without her. */
    CHECK("version 2 (alice removed)", rotate(&f, 2, V1 & ~BIT(ALICE), 2, (int[]){R1, R2, -1}));
    CHECK("/ after it", get(&f, "/", f.reg.rd, &p) == 200 &&
                            has(p.body, "Trust policy version 2 in force: 2 root, 1 release, 2 "
                                        "promote keys."));
    CHECK("/ui/trust after it", get(&f, "/ui/trust", f.reg.rd, &p) == 200);
    CHECK("version 2 in force, without alice", has(p.body, "<h2>In force: version 2</h2>") &&
                                                   !strstr(p.body, "<tr><td>alice</td>") &&
                                                   key_row(&p, &f, BOB, PROMOTE_TAG));
    free(r);
    r = row(&p, 2);
    CHECK("its row: in force, stored by ops, verified",
          has(r, "<tr><td class=\"n\">2 <span class=\"tag ok\">in force</span></td><td><time>") &&
              has(r, "<td>ops</td>") && has(r, "<span class=\"tag ok\">verified</span>"));
    CHECK("signed by r1 and r2, each toward both quorums",
          signed_by(r, &f, R1, 1, 2) && signed_by(r, &f, R2, 1, 2) &&
              has(r, "root quorum of v1: 2 of 2 \xC2\xB7 of v2: 2 of 2"));
    char want[256];
    snprintf(want, sizeof want,
             "<span class=\"tag bad\">removed</span> key &#39;alice&#39; (%s) removed (promote)",
             f.id[ALICE]);
    CHECK("what changed: alice removed", has(r, want));
    CHECK("one stored version", has(p.body, "1 stored version, newest first."));

    /* 2 more: r3 joins the roots; then r1 leaves them (signed by r1 r2 r3: r1 counts toward
     * version 3's quorum only) and production needs one signature. */
    CHECK("version 3 (r3 added)",
          rotate(&f, 3, (V1 & ~BIT(ALICE)) | BIT(R3), 2, (int[]){R1, R2, -1}));
    CHECK("version 4 (r1 removed, production 1)",
          rotate(&f, 4, (V1 & ~BIT(ALICE) & ~BIT(R1)) | BIT(R3), 1, (int[]){R1, R2, R3, -1}));
    CHECK("/ after three", get(&f, "/", f.reg.rd, &p) == 200 &&
                               has(p.body, "Trust policy version 4 in force: 2 root, 1 release, "
                                           "2 promote keys."));
    CHECK("/ui/trust after three", get(&f, "/ui/trust", f.reg.rd, &p) == 200);
    CHECK("version 4 in force: r2 r3 roots, r1 gone",
          has(p.body, "<h2>In force: version 4</h2>") && key_row(&p, &f, R2, ROOT_TAG) &&
              key_row(&p, &f, R3, ROOT_TAG) && !strstr(p.body, "<tr><td>r1</td>") &&
              has(p.body, "<tr><td>production</td><td class=\"n\">1</td></tr>"));
    CHECK("three rows, newest first, one in force",
          has(p.body, "3 stored versions, newest first.") &&
              count(p.body, "<tr><td class=\"n\">") == 3 && count(p.body, ">in force<") == 1 &&
              strstr(p.body, "<td class=\"n\">4 ") < strstr(p.body, "<td class=\"n\">3<") &&
              strstr(p.body, "<td class=\"n\">3<") < strstr(p.body, "<td class=\"n\">2<"));
    free(r);
    r = row(&p, 4);
    CHECK("version 4: r1 toward version 3's quorum only, r2 and r3 toward both",
          signed_by(r, &f, R1, 3, 0) && signed_by(r, &f, R2, 3, 4) && signed_by(r, &f, R3, 3, 4) &&
              has(r, "root quorum of v3: 3 of 2 \xC2\xB7 of v4: 2 of 2"));
    snprintf(want, sizeof want, "key &#39;r1&#39; (%s) removed (root)", f.id[R1]);
    CHECK("version 4's changes",
          has(r, want) && has(r, "<span class=\"tag warn\">changed</span> channel "
                                 "&#39;production&#39;: threshold 2 -&gt; 1"));
    free(r);
    r = row(&p, 3);
    snprintf(want, sizeof want,
             "<span class=\"tag ok\">added</span> key &#39;r3&#39; (%s) added (root)", f.id[R3]);
    CHECK("version 3: r3 added, signed by r1 r2, verified, not in force",
          has(r, want) && signed_by(r, &f, R1, 2, 3) && signed_by(r, &f, R2, 2, 3) &&
              has(r, ">verified<") && !strstr(r, "in force"));
    free(r);
    r = row(&p, 2);
    CHECK("version 2 still there, verified", has(r, ">verified<") && has(r, "alice"));

    /* Served from --trust = version 3 (signed): the walk starts there. */
    char *p3 = policy(&f, 3, (V1 & ~BIT(ALICE)) | BIT(R3), 2),
         *v3 = sign_by(&f, p3, (int[]){R1, R2, -1});
    char *path = v3 ? kiln_test_write("v3.json", v3, strlen(v3)) : NULL;
    CHECK("restart from version 3", path && rfx_start(&f.reg, path));
    CHECK("/ui/trust from version 3",
          get(&f, "/ui/trust", f.reg.rd, &p) == 200 &&
              has(p.body, "<h2>In force: version 4</h2>") &&
              has(p.body, "<code>--trust</code> file is version 3; the versions after it were "
                          "walked from the store, each checked against the "
                          "one before.</small></p>"));
    free(r);
    r = row(&p, 4);
    CHECK("version 4 checked against the --trust file, in force",
          has(r, ">in force<") && has(r, ">verified<") && signed_by(r, &f, R3, 3, 4));
    free(r);
    r = row(&p, 3);
    CHECK("versions 3 and 2 are below it: shown, not walked",
          has(r, "<span class=\"tag\">not walked</span>") &&
              has(r, "at or below the server&#39;s --trust (version 3)") &&
              !strstr(r, "class=\"bad\""));
    free(p3), free(v3), free(path);
out:
    free(r);
    rfx_resp_free(&p);
    release(&f);
}

KILN_TEST(web_trust_page_needs_a_token) {
    wtfx f;
    page p = {0};
    if (!CHECK("a registry whose reads need a token", init(&f))) goto out;
    CHECK("no token: 401, as a page",
          get(&f, "/ui/trust", NULL, &p) == 401 && has(p.body, "<!DOCTYPE html>") &&
              has(p.body, "needs a token") && !strstr(p.body, "In force"));
    CHECK("an unknown token: 401", get(&f, "/ui/trust", "kiln_0000", &p) == 401);
    CHECK("a read token: 200",
          get(&f, "/ui/trust", f.reg.rd, &p) == 200 && has(p.body, "In force: version 1"));
    CHECK("any scope reads", get(&f, "/ui/trust", f.reg.admin, &p) == 200);
    CHECK("/ without one: 401", get(&f, "/", NULL, &p) == 401 && !strstr(p.body, "Trust policy"));
    CHECK("counted under its route",
          rfx_metrics_have(f.reg.url, f.reg.rd,
                           (const char *[]){"route=\"/ui/trust\",method=\"GET\",status=\"401\"} 2",
                                            "route=\"/ui/trust\",method=\"GET\",status=\"200\"} 2",
                                            NULL},
                           &p));
out:
    rfx_resp_free(&p);
    release(&f);
}

KILN_TEST(web_trust_page_flags_a_bad_store) {
    wtfx f;
    page p = {0};
    char *r = NULL;
    if (!CHECK("a registry", init(&f))) goto out;
    CHECK("versions 2 to 4",
          rotate(&f, 2, V1 & ~BIT(ALICE), 2, (int[]){R1, R2, -1}) &&
              rotate(&f, 3, (V1 & ~BIT(ALICE)) | BIT(R3), 2, (int[]){R1, R2, -1}) &&
              rotate(&f, 4, (V1 & ~BIT(ALICE)) | BIT(R3), 1, (int[]){R2, R3, -1}));
    CHECK("all verify before", get(&f, "/ui/trust", f.reg.rd, &p) == 200 &&
                                   count(p.body, ">verified<") == 3 &&
                                   !strstr(p.body, "class=\"bad\""));
    /* The store is changed under the running server: version 3 lowers a threshold its
     * signatures did not sign, version 2's token name is markup. */
    CHECK("tamper with version 3",
          store_sql(&f,
                    "UPDATE trust_versions SET document = replace(document, "
                    "'\"threshold\": 2', '\"threshold\": 1') WHERE version = 3",
                    NULL));
    CHECK("a hostile token name on version 2",
          store_sql(&f, "UPDATE trust_versions SET publisher = ?1 WHERE version = 2", HOSTILE));
    CHECK("the page still renders", get(&f, "/ui/trust", f.reg.rd, &p) == 200);
    free(r);
    r = row(&p, 3);
    CHECK("version 3 is flagged, naming why",
          has(r, "<tr class=\"bad\"><td class=\"n\">3<") &&
              has(r, "<span class=\"tag bad\">does not verify</span> &#39;trust version 3: "
                     "signature 1&#39;: signature verification failed") &&
              has(r, "<span class=\"tag bad\">not counted</span>") && !strstr(r, ">verified<"));
    CHECK("what it would change is still shown",
          has(r, "channel &#39;production&#39;: threshold 2 -&gt; 1"));
    free(r);
    r = row(&p, 4);
    CHECK("version 4 verifies against it, but no client walks past version 3",
          has(r, "<tr class=\"bad\">") && has(r, "but version 3 does not verify") &&
              signed_by(r, &f, R2, 3, 4) && !strstr(r, "in force"));
    free(r);
    r = row(&p, 2);
    CHECK("version 2 still verifies, its token name as text",
          has(r, "<tr><td class=\"n\">2</td>") && has(r, ">verified<") &&
              has(r, "<td>" HOSTILE_ESCAPED "</td>"));
    CHECK("no markup got through", !strstr(p.body, "<script"));
    CHECK("the policy in force is the server's, unchanged",
          has(p.body, "<h2>In force: version 4</h2>") &&
              has(p.body, "<tr><td>production</td><td class=\"n\">1</td></tr>"));

    /* Worse: a version that is no policy at all (a channel whose name is markup), a gap. */
    char *bad5 = kiln_asprintf("{\"format\":\"kiln-trust/1\",\"version\":5,\"keys\":[{\"name\":"
                               "\"bob\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]}],"
                               "\"channels\":{\"" HOSTILE "\":{\"threshold\":1}}}",
                               f.b64[BOB]),
         *p7 = policy(&f, 7, (V1 & ~BIT(ALICE)) | BIT(R3), 1),
         *v7 = sign_by(&f, p7, (int[]){R2, R3, -1});
    CHECK("version 5 is not a policy",
          bad5 && store_sql(&f, "INSERT INTO trust_versions VALUES(5, ?1, 'ops', 0)", bad5));
    CHECK("version 7 after a gap",
          v7 && store_sql(&f, "INSERT INTO trust_versions VALUES(7, ?1, 'ops', 0)", v7));
    free(bad5), free(p7), free(v7);
    CHECK("the page still renders", get(&f, "/ui/trust", f.reg.rd, &p) == 200);
    free(r);
    r = row(&p, 5);
    CHECK("version 5 flagged, the message's name as text",
          has(r, "<tr class=\"bad\">") && has(r, "channel name &#39;" HOSTILE_ESCAPED));
    free(r);
    r = row(&p, 7);
    CHECK("version 7 flagged: the gap",
          has(r, "<tr class=\"bad\">") &&
              has(r, "version 6 is not stored: the chain of versions has a gap") &&
              has(r, "not checked: no version 6"));
    CHECK("no markup got through", !strstr(p.body, "<script"));
    CHECK("five stored, four flagged", has(p.body, "5 stored versions") &&
                                           count(p.body, "<tr class=\"bad\">") == 4 &&
                                           count(p.body, ">verified<") == 1);
out:
    free(r);
    rfx_resp_free(&p);
    release(&f);
}

KILN_TEST(web_trust_page_pages) {
    wtfx f;
    page p = {0};
    char *r = NULL;
    if (!CHECK("a registry", init(&f))) goto out;
    /* 55 versions, 2 to 56: staging's threshold goes 1, 2, 1, ... (bob and carol may both
     * sign). */
    bool ok = true;
    kiln_log_set_level(KILN_LOG_WARN); /* not a line per version from the server */
    for (uint64_t v = 2; ok && v <= 56; v++) {
        char *text = policy(&f, v, V1, 2), *doc = NULL;
        /* staging toggles: the text is ours, its one "threshold\":1" is staging's. */
        char *at = text ? strstr(text, "\"staging\":{\"threshold\":1}") : NULL;
        if (at && v % 2 == 0) at[strlen("\"staging\":{\"threshold\":")] = '2';
        doc = sign_by(&f, text, (int[]){R1, R2, -1});
        ok = put(&f, doc);
        free(text), free(doc);
    }
    kiln_log_set_level(KILN_LOG_INFO);
    CHECK("55 versions put", ok);
    CHECK("the newest page", get(&f, "/ui/trust", f.reg.rd, &p) == 200 &&
                                 has(p.body, "55 stored versions, newest first.") &&
                                 count(p.body, "<tr><td class=\"n\">") == 50);
    CHECK("from version 56, in force, to version 7",
          has(p.body, "<tr><td class=\"n\">56 <span class=\"tag ok\">in force</span>") &&
              has(p.body, "<tr><td class=\"n\">7</td>") &&
              !strstr(p.body, "<tr><td class=\"n\">6</td>"));
    CHECK("every one verified", count(p.body, ">verified<") == 50);
    CHECK("links to the older versions",
          has(p.body, "<a href=\"/ui/trust?before=7\">older versions</a>"));
    free(r);
    r = row(&p, 7);
    CHECK("its oldest row knows the version before it",
          has(r, "channel &#39;staging&#39;: threshold 2 -&gt; 1") && signed_by(r, &f, R1, 6, 7));
    CHECK("the older page", get(&f, "/ui/trust?before=7", f.reg.rd, &p) == 200 &&
                                has(p.body, "55 stored versions; those below version 7, newest "
                                            "first.") &&
                                count(p.body, "<tr><td class=\"n\">") == 5 &&
                                count(p.body, ">verified<") == 5 && !strstr(p.body, "in force<") &&
                                !strstr(p.body, "older versions"));
    free(r);
    r = row(&p, 2);
    CHECK("down to version 2, checked against the --trust file",
          has(r, "channel &#39;staging&#39;: threshold 1 -&gt; 2") && signed_by(r, &f, R2, 1, 2));
    CHECK("below the first",
          get(&f, "/ui/trust?before=2", f.reg.rd, &p) == 200 && has(p.body, "No versions here"));
    CHECK("garbage reads as the newest", get(&f, "/ui/trust?before=x%3C", f.reg.rd, &p) == 200 &&
                                             count(p.body, "<tr><td class=\"n\">") == 50);
    CHECK("so does a number past any version",
          get(&f, "/ui/trust?before=-5", f.reg.rd, &p) == 200 &&
              count(p.body, "<tr><td class=\"n\">") == 50 && !strstr(p.body, "those below"));
out:
    free(r);
    rfx_resp_free(&p);
    release(&f);
}

/* What no policy can hold (its parser takes names of letters, digits and ._+- only) still
 * goes out as text: web/ escapes every name it is given. */
KILN_TEST(web_trust_markup_in_names_is_text) {
    kiln_web_trust_key k = {.name = HOSTILE, .keyid = "0123456789ABCDEF", .root = true};
    kiln_web_trust_channel c = {.name = HOSTILE, .threshold = 1};
    kiln_web_trust_policy pol = {.version = 2,
                                 .keys = &k,
                                 .nkeys = 1,
                                 .root_threshold = 1,
                                 .release_threshold = 1,
                                 .channels = &c,
                                 .nchannels = 1};
    kiln_web_trust_signer s = {.name = HOSTILE, .keyid = "0123456789ABCDEF", .old_root = true};
    kiln_web_trust_version v = {.version = 2,
                                .publisher = HOSTILE,
                                .checked = true,
                                .signers = &s,
                                .nsigners = 1,
                                .changes = "key '" HOSTILE "' (0123456789ABCDEF) added (root)\n",
                                .problem = HOSTILE};
    kiln_web_buf b = {0};
    kiln_web_begin(&b, KILN_WEB_TRUST, NULL, NULL, NULL);
    kiln_web_trust_summary(&b, &pol);
    kiln_web_trust_policy_show(&b, &pol, 1);
    kiln_web_trust_history_begin(&b, 1, 0);
    kiln_web_trust_history_row(&b, &v);
    kiln_web_trust_history_end(&b, 2, false);
    kiln_web_end(&b, KILN_WEB_TRUST, NULL, NULL, 0);
    size_t len;
    char *html = kiln_web_buf_take(&b, &len);
    CHECK("a page", html && len > 0);
    CHECK("the key's name as text", has(html, "<tr><td>" HOSTILE_ESCAPED "</td><td><code>"));
    CHECK("the channel's", has(html, "<tr><td>" HOSTILE_ESCAPED "</td><td class=\"n\">1<"));
    CHECK("the signer's", has(html, HOSTILE_ESCAPED " <small><code>0123456789ABCDEF"));
    CHECK("the change's", has(html, "key &#39;" HOSTILE_ESCAPED "&#39;"));
    CHECK("the token's and the problem's",
          has(html, "<td>" HOSTILE_ESCAPED "</td>") &&
              has(html, "does not verify</span> " HOSTILE_ESCAPED));
    CHECK("never raw", html && !strstr(html, "<script"));
    CHECK("the trust page's own title and route",
          has(html, "<title>Trust policy \xC2\xB7 kiln registry</title>") &&
              has(html, "<h1>Trust policy</h1>") && has(html, " / trust policy</nav>") &&
              has(html, "<a href=\"/v1/trust\"><code>/v1/trust</code></a>"));
    free(html);

    kiln_web_buf n = {0};
    kiln_web_trust_summary(&n, NULL);
    kiln_web_trust_policy_show(&n, NULL, 0);
    char *none = kiln_web_buf_take(&n, &len);
    CHECK("no policy says so",
          has(none, "started without <code>--trust</code>") && has(none, "<a href=\"/ui/trust\">"));
    free(none);
}

/* page.c - the registry's pages as HTML5: the buffer, the one escaping function, the
 * security headers, and a function per part of a page.
 *
 * Markup is appended with lit() (string literals only) and kiln_web_printf() (numbers); every other
 * string goes through kiln_web_text. Links are built from names percent-encoded first, so
 * they hold nothing that markup could read as its own. */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "web.h"
#include "web_int.h"

/* ---- the buffer ---- */

static bool reserve(kiln_web_buf *b, size_t more) {
    if (b->nomem || b->over) return false;
    /* A bounded page stops growing at its limit (kiln_web_buf_take then refuses it): a page
     * of a hostile run costs the server that much memory at most. */
    if (b->limit && b->len + more > b->limit) {
        b->over = true;
        return false;
    }
    if (b->len + more + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more + 1)
        cap *= 2;
    /* kiln_malloc, not realloc: the tests' allocation faults reach it. */
    char *p = kiln_malloc(cap);
    if (!p) {
        b->nomem = true;
        return false;
    }
    if (b->len) memcpy(p, b->data, b->len);
    p[b->len] = 0;
    free(b->data);
    b->data = p;
    b->cap = cap;
    return true;
}

static void put(kiln_web_buf *b, const char *s, size_t n) {
    if (!n || !reserve(b, n)) return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

/* Markup: only ever a string literal. */
#define lit(b, s) put((b), "" s, sizeof(s) - 1)

void kiln_web_buf_release(kiln_web_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

char *kiln_web_buf_take(kiln_web_buf *b, size_t *len) {
    *len = 0;
    if (b->over) {
        size_t limit = b->limit;
        kiln_web_buf_release(b);
        kiln_fail(KILN_ERR_LIMIT, "the page would be more than %zu MiB (its data is too large to "
                  "show); the limit keeps what one request costs the server bounded",
                  limit >> 20);
        return NULL;
    }
    if (!reserve(b, 0)) {
        kiln_web_buf_release(b);
        kiln_fail(KILN_ERR_NOMEM, "out of memory while rendering a page");
        return NULL;
    }
    char *p = b->data;
    *len = b->len;
    memset(b, 0, sizeof *b);
    return p;
}

/* ---- escaping ---- */

/* The length of the well-formed UTF-8 sequence of two or more bytes at p (RFC 3629: no
 * overlong forms, no surrogates, nothing past U+10FFFF), or 0. Stops at the NUL. */
static size_t utf8_seq(const unsigned char *p) {
#define CONT(x) ((x) >= 0x80 && (x) <= 0xBF)
    unsigned c = p[0];
    if (c >= 0xC2 && c <= 0xDF) return CONT(p[1]) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        return p[1] >= lo && p[1] <= hi && CONT(p[2]) ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        return p[1] >= lo && p[1] <= hi && CONT(p[2]) && CONT(p[3]) ? 4 : 0;
    }
    return 0;
#undef CONT
}

void kiln_web_text(kiln_web_buf *b, const char *s) {
    if (!s) return;
    static const char fffd[] = "\xEF\xBF\xBD";
    const unsigned char *p = (const unsigned char *)s, *run = p;
    while (*p) {
        const char *rep = NULL;
        size_t adv = 1;
        unsigned c = *p;
        if (c < 0x80) {
            switch (c) {
            case '&':
                rep = "&amp;";
                break;
            case '<':
                rep = "&lt;";
                break;
            case '>':
                rep = "&gt;";
                break;
            case '"':
                rep = "&quot;";
                break;
            case '\'':
                rep = "&#39;";
                break;
            case '\t':
            case '\n':
                break;
            default:
                if (c < 0x20 || c == 0x7f) rep = fffd;
            }
        } else {
            adv = utf8_seq(p);
            /* C1 controls (U+0080..U+009F) are no text either. */
            if (!adv || (c == 0xC2 && p[1] < 0xA0)) rep = fffd;
            if (!adv) adv = 1;
        }
        if (rep) {
            put(b, (const char *)run, (size_t)(p - run));
            put(b, rep, strlen(rep));
            run = p + adv;
        }
        p += adv;
    }
    put(b, (const char *)run, (size_t)(p - run));
}

void kiln_web_text_cut(kiln_web_buf *b, const char *s, size_t max) {
    if (!s) return;
    size_t n = strlen(s);
    if (n <= max) {
        kiln_web_text(b, s);
        return;
    }
    while (max && ((unsigned char)s[max] & 0xC0) == 0x80)
        max--;
    char *cut = kiln_malloc(max + 1);
    if (!cut) {
        b->nomem = true;
        return;
    }
    memcpy(cut, s, max);
    cut[max] = 0;
    kiln_web_text(b, cut);
    free(cut);
    lit(b, "\xE2\x80\xA6");
}

/* A name as one path segment: unreserved bytes as they are, the rest %XX. */
static void seg(kiln_web_buf *b, const char *s) {
    char out[3 * 256 + 1];
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p && k + 4 < sizeof out;
         p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            *p == '.' || *p == '_' || *p == '-' || *p == '~' || *p == '+')
            out[k++] = (char)*p;
        else
            k += (size_t)snprintf(out + k, sizeof out - k, "%%%02X", *p);
    }
    out[k] = 0;
    kiln_web_text(b, out);
}

/* ---- headers and the stylesheet ---- */

static const char style[] =
    "body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#fff}"
    "header{background:#1d2330;padding:.6em 1.2em}header a,header{color:#fff}"
    "main{padding:0 1.2em 1em}"
    "footer{color:#667;padding:.8em 1.2em;border-top:1px solid #dde;font-size:12px}"
    "h1{font-size:20px;margin:.8em 0 .4em}h2{font-size:16px;margin:1.4em 0 .4em}"
    "table{border-collapse:collapse;width:100%}"
    "th,td{text-align:left;vertical-align:top;padding:.3em .6em;border-bottom:1px solid #e3e6ee}"
    "th{background:#f3f5f9;font-weight:600}td.n{text-align:right}"
    "code{font:12px ui-monospace,monospace}small{color:#667}"
    ".tag{display:inline-block;padding:0 .4em;border-radius:3px;font-size:12px;"
    "background:#e8ebf2;color:#1d2330}"
    ".ok{background:#d8f0dd;color:#14532d}.warn{background:#fdf0c8;color:#6b4d00}"
    ".bad{background:#fbd9d9;color:#7f1d1d}.ch{display:inline-block;margin:0 1em .2em 0}"
    /* charts (web/chart.c): SVG drawn with presentation attributes, laid out here */
    ".charts{display:flex;flex-wrap:wrap;gap:.6em 1.2em}figure.chart{margin:.4em 0;max-width:100%}"
    "svg.chart{max-width:100%;height:auto}"
    "figcaption{font-weight:600;font-size:13px}svg.chart{display:block;background:#fff}"
    "svg.chart text{font:11px system-ui,sans-serif;fill:#445}"
    "svg.chart text.title{font-weight:600;fill:#1d2330}svg.chart a:hover{opacity:.7}";

const char *kiln_web_stylesheet(void) {
    return style;
}

static pthread_once_t headers_once = PTHREAD_ONCE_INIT;
static char csp[256], csp_form[256];
static kiln_web_header headers[5], headers_form[5];

static void base64(const uint8_t *in, size_t n, char *out) {
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t k = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) |
                     (i + 2 < n ? in[i + 2] : 0);
        out[k++] = a[v >> 18 & 63];
        out[k++] = a[v >> 12 & 63];
        out[k++] = i + 1 < n ? a[v >> 6 & 63] : '=';
        out[k++] = i + 2 < n ? a[v & 63] : '=';
    }
    out[k] = 0;
}

static void make_headers(void) {
    uint8_t h[KILN_SHA256_BYTES];
    char b64[48];
    kiln_sha256(style, sizeof style - 1, h);
    base64(h, sizeof h, b64);
    /* Nothing loads but the page's own stylesheet, named by its hash: a value that got into
     * the markup unescaped still could not run a script, load an image or post a form. */
    snprintf(csp, sizeof csp,
             "default-src 'none'; style-src 'sha256-%s'; base-uri 'none'; form-action 'none'; "
             "frame-ancestors 'none'",
             b64);
    headers[0] = (kiln_web_header){"Content-Type", "text/html; charset=utf-8"};
    headers[1] = (kiln_web_header){"Content-Security-Policy", csp};
    headers[2] = (kiln_web_header){"X-Content-Type-Options", "nosniff"};
    headers[3] = (kiln_web_header){"Referrer-Policy", "no-referrer"};
    headers[4] = (kiln_web_header){"Cache-Control", "no-store"};
    /* kiln runs serve's pages: the same, but a form may be sent to the page's own server
     * (the overlay's checkboxes, a plain GET). */
    snprintf(csp_form, sizeof csp_form,
             "default-src 'none'; style-src 'sha256-%s'; base-uri 'none'; form-action 'self'; "
             "frame-ancestors 'none'",
             b64);
    memcpy(headers_form, headers, sizeof headers);
    headers_form[1].value = csp_form;
}

const kiln_web_header *kiln_web_headers_form(size_t *n) {
    pthread_once(&headers_once, make_headers);
    *n = KILN_ARRAY_LEN(headers_form);
    return headers_form;
}

void kiln_web_raw(kiln_web_buf *b, const char *s, size_t n) {
    put(b, s, n);
}

void kiln_web_printf(kiln_web_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

void kiln_web_pct(kiln_web_buf *b, const char *s, const char *also) {
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            *p == '.' || *p == '_' || *p == '-' || *p == '~' || (also && strchr(also, *p)))
            put(b, (const char *)p, 1);
        else
            kiln_web_printf(b, "%%%02X", *p);
    }
}

const kiln_web_header *kiln_web_headers(size_t *n) {
    pthread_once(&headers_once, make_headers);
    *n = KILN_ARRAY_LEN(headers);
    return headers;
}

/* ---- small pieces ---- */

static void put_time(kiln_web_buf *b, int64_t t) {
    char s[21];
    kiln_format_time(t, s);
    lit(b, "<time>");
    kiln_web_text(b, s);
    lit(b, "</time>");
}

/* A duration as people read it: "3 d", "5 h", "12 min", "40 s". */
static void put_span(kiln_web_buf *b, int64_t secs) {
    char s[KILN_SPAN_MAX];
    kiln_format_span(secs, s);
    put(b, s, strlen(s));
}

static void put_expiry(kiln_web_buf *b, const kiln_web_record *r, int64_t now) {
    const int64_t expires = r->expires;
    put_time(b, expires);
    kiln_web_expiry e = r->expiry;
    if (e == KILN_WEB_EXPIRY_EXPIRED) {
        lit(b, " <span class=\"tag bad\">expired</span> <small>");
        put_span(b, now - expires);
        lit(b, " ago</small>");
    } else {
        if (e == KILN_WEB_EXPIRY_SOON) lit(b, " <span class=\"tag warn\">expires soon</span>");
        lit(b, " <small>in ");
        put_span(b, expires - now);
        lit(b, "</small>");
    }
}

/* "sha256:" and 12 hex digits, the whole digest in the title. */
static void put_digest(kiln_web_buf *b, const char *d) {
    lit(b, "<code title=\"");
    kiln_web_text(b, d);
    lit(b, "\">");
    kiln_web_text_cut(b, d, 19);
    lit(b, "</code>");
}

static void put_size(kiln_web_buf *b, uint64_t n) {
    lit(b, "<span title=\"");
    kiln_web_printf(b, "%" PRIu64 " bytes", n);
    lit(b, "\">");
    if (n < 1024)
        kiln_web_printf(b, "%" PRIu64 " B", n);
    else if (n < 1024 * 1024)
        kiln_web_printf(b, "%.1f KiB", (double)n / 1024);
    else if (n < 1024ull * 1024 * 1024)
        kiln_web_printf(b, "%.1f MiB", (double)n / (1024 * 1024));
    else
        kiln_web_printf(b, "%.2f GiB", (double)n / (1024.0 * 1024 * 1024));
    lit(b, "</span>");
}

static void href_model(kiln_web_buf *b, const char *model) {
    lit(b, "/ui/models/");
    seg(b, model);
}

static void href_channel(kiln_web_buf *b, const char *model, const char *channel) {
    href_model(b, model);
    lit(b, "/channels/");
    seg(b, channel);
}

static void link_model(kiln_web_buf *b, const char *model) {
    lit(b, "<a href=\"");
    href_model(b, model);
    lit(b, "\">");
    kiln_web_text(b, model);
    lit(b, "</a>");
}

static void link_channel(kiln_web_buf *b, const char *model, const char *channel) {
    lit(b, "<a href=\"");
    href_channel(b, model, channel);
    lit(b, "\">");
    kiln_web_text(b, channel);
    lit(b, "</a>");
}

/* A version links to its JSON (manifest, signature, card, validation). */
static void link_version(kiln_web_buf *b, const char *model, const char *version) {
    lit(b, "<a href=\"/v1/models/");
    seg(b, model);
    lit(b, "/versions/");
    seg(b, version);
    lit(b, "\">");
    kiln_web_text(b, version);
    lit(b, "</a>");
}

static void put_signers(kiln_web_buf *b, const kiln_web_signer *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (i) lit(b, "<br>");
        if (s[i].name)
            kiln_web_text(b, s[i].name);
        else
            lit(b, "<span class=\"tag bad\">key not in policy</span>");
        lit(b, " <small><code>");
        kiln_web_text(b, s[i].keyid);
        lit(b, "</code></small>");
        if (s[i].note) {
            lit(b, " <span class=\"tag warn\">");
            kiln_web_text(b, s[i].note);
            lit(b, "</span>");
        }
    }
    if (!n) lit(b, "<span class=\"tag bad\">no signature read</span>");
}

static void td(kiln_web_buf *b) {
    lit(b, "<td>");
}

static void td_end(kiln_web_buf *b) {
    lit(b, "</td>");
}

static void td_text(kiln_web_buf *b, const char *s) {
    td(b);
    kiln_web_text(b, s);
    td_end(b);
}

/* The table's head: th per name, from a string literal "a|b|c". */
static void thead(kiln_web_buf *b, const char *cols) {
    b->rows = 0;
    lit(b, "<table>\n<thead><tr>");
    for (const char *p = cols; *p;) {
        const char *e = strchr(p, '|');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        lit(b, "<th>");
        put(b, p, n);
        lit(b, "</th>");
        p += n + (e ? 1 : 0);
    }
    lit(b, "</tr></thead>\n<tbody>\n");
}

void kiln_web_table_end(kiln_web_buf *b, const char *empty) {
    lit(b, "</tbody>\n</table>\n");
    if (!b->rows && empty) {
        lit(b, "<p>");
        kiln_web_text(b, empty);
        lit(b, "</p>\n");
    }
}

/* ---- the page ---- */

void kiln_web_begin(kiln_web_buf *b, kiln_web_kind kind, const char *model, const char *channel,
                    const char *title) {
    lit(b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
           "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\n"
           "<meta name=\"referrer\" content=\"no-referrer\">\n<title>");
    switch (kind) {
    case KILN_WEB_HOME:
        lit(b, "Models");
        break;
    case KILN_WEB_MODEL:
        kiln_web_text(b, model);
        break;
    case KILN_WEB_CHANNEL:
        kiln_web_text(b, model);
        lit(b, " / ");
        kiln_web_text(b, channel);
        break;
    case KILN_WEB_AUDIT:
        lit(b, "Audit log");
        break;
    case KILN_WEB_TRUST:
        lit(b, "Trust policy");
        break;
    case KILN_WEB_VERSION:
        kiln_web_text(b, model);
        lit(b, " ");
        kiln_web_text(b, channel);
        break;
    case KILN_WEB_ERROR:
        kiln_web_text(b, title);
        break;
    }
    lit(b, " \xC2\xB7 kiln registry</title>\n<style>");
    put(b, style, sizeof style - 1);
    lit(b, "</style>\n</head>\n<body>\n<header><nav><a href=\"/\">kiln registry</a>");
    if (kind == KILN_WEB_MODEL || kind == KILN_WEB_CHANNEL || kind == KILN_WEB_VERSION) {
        lit(b, " / ");
        link_model(b, model);
    }
    if (kind == KILN_WEB_CHANNEL || kind == KILN_WEB_VERSION) {
        lit(b, " / ");
        kiln_web_text(b, channel);
    }
    if (kind == KILN_WEB_AUDIT) lit(b, " / audit log");
    if (kind == KILN_WEB_TRUST) lit(b, " / trust policy");
    lit(b, "</nav></header>\n<main>\n<h1>");
    switch (kind) {
    case KILN_WEB_HOME:
        lit(b, "Models");
        break;
    case KILN_WEB_MODEL:
        lit(b, "Model ");
        kiln_web_text(b, model);
        break;
    case KILN_WEB_CHANNEL:
        lit(b, "Channel ");
        kiln_web_text(b, channel);
        lit(b, " of ");
        link_model(b, model);
        break;
    case KILN_WEB_AUDIT:
        lit(b, "Audit log");
        break;
    case KILN_WEB_TRUST:
        lit(b, "Trust policy");
        break;
    case KILN_WEB_VERSION:
        lit(b, "Version ");
        kiln_web_text(b, channel);
        lit(b, " of ");
        link_model(b, model);
        break;
    case KILN_WEB_ERROR:
        kiln_web_text(b, title);
        break;
    }
    lit(b, "</h1>\n");
}

/* The JSON route that answers with the page's data. */
static void json_route(kiln_web_buf *b, kiln_web_kind kind, const char *model,
                       const char *channel) {
    switch (kind) {
    case KILN_WEB_MODEL:
        lit(b, "/v1/models/");
        seg(b, model);
        break;
    case KILN_WEB_CHANNEL:
        lit(b, "/v1/models/");
        seg(b, model);
        lit(b, "/channels/");
        seg(b, channel);
        lit(b, "/history");
        break;
    case KILN_WEB_AUDIT:
        lit(b, "/v1/audit");
        break;
    case KILN_WEB_TRUST:
        lit(b, "/v1/trust");
        break;
    case KILN_WEB_VERSION:
        lit(b, "/v1/models/");
        seg(b, model);
        lit(b, "/versions/");
        seg(b, channel);
        break;
    default:
        lit(b, "/v1/models");
        break;
    }
}

void kiln_web_end(kiln_web_buf *b, kiln_web_kind kind, const char *model, const char *channel,
                  int64_t now) {
    lit(b, "</main>\n<footer>Rendered ");
    put_time(b, now);
    lit(b, " by kiln ");
    kiln_web_text(b, kiln_version());
    if (kind != KILN_WEB_ERROR) {
        lit(b, " \xC2\xB7 the same as JSON: <a href=\"");
        json_route(b, kind, model, channel);
        lit(b, "\"><code>");
        json_route(b, kind, model, channel);
        lit(b, "</code></a>");
    }
    lit(b, " \xC2\xB7 <a href=\"/ui/audit\">audit log</a> (admin token)</footer>\n"
           "</body>\n</html>\n");
}

static const char *status_text(unsigned status) {
    switch (status) {
    case 400:
        return "Bad request";
    case 401:
        return "Token needed";
    case 403:
        return "Forbidden";
    case 404:
        return "Not found";
    case 405:
        return "Method not allowed";
    case 500:
        return "Internal error";
    default:
        return "Error";
    }
}

void kiln_web_error(kiln_web_buf *b, unsigned status, const char *msg, int64_t now) {
    char title[64];
    snprintf(title, sizeof title, "%u %s", status, status_text(status));
    kiln_web_begin(b, KILN_WEB_ERROR, NULL, NULL, title);
    lit(b, "<p>");
    kiln_web_text(b, msg);
    lit(b, "</p>\n");
    if (status == 401 || status == 403)
        lit(b, "<p>Pages take the tokens the JSON API takes, in an "
               "<code>Authorization: Bearer &lt;token&gt;</code> header.</p>\n");
    lit(b, "<p><a href=\"/\">All models</a></p>\n");
    kiln_web_end(b, KILN_WEB_ERROR, NULL, NULL, now);
}

/* ---- the front page ---- */

void kiln_web_models_begin(kiln_web_buf *b) {
    thead(b, "Model|Versions|Latest|Updated|Channels (current record)");
}

void kiln_web_models_row(kiln_web_buf *b, const kiln_web_model *m) {
    b->rows++;
    lit(b, "<tr><td>");
    link_model(b, m->name);
    lit(b, "</td><td class=\"n\">");
    kiln_web_printf(b, "%" PRId64, m->versions);
    lit(b, "</td><td>");
    if (m->latest) link_version(b, m->name, m->latest);
    lit(b, "</td><td>");
    put_time(b, m->updated);
    lit(b, "</td><td>");
}

/* A channel record's version cell's content: the version, linked, over its digest. */
static void record_version(kiln_web_buf *b, const char *model, const kiln_web_record *r) {
    link_version(b, model, r->version);
    lit(b, "<br>");
    put_digest(b, r->digest);
}

/* Closes the open cell, then a channel record's cells from its reason to its time (Reason,
 * Signed by, Put by, At), the last left open. */
static void record_cells(kiln_web_buf *b, const kiln_web_record *r) {
    td_end(b);
    td_text(b, r->reason);
    td(b);
    put_signers(b, r->signers, r->nsigners);
    td_end(b);
    td_text(b, r->publisher);
    td(b);
    put_time(b, r->created);
}

void kiln_web_models_channel(kiln_web_buf *b, const char *model, const kiln_web_record *r,
                             int64_t now) {
    lit(b, "<span class=\"ch\">");
    link_channel(b, model, r->channel);
    lit(b, " \xE2\x86\x92 ");
    kiln_web_text(b, r->version);
    kiln_web_printf(b, " <small>seq %" PRId64 "</small>", r->seq);
    kiln_web_expiry e = r->expiry;
    if (e == KILN_WEB_EXPIRY_EXPIRED)
        lit(b, " <span class=\"tag bad\">expired</span>");
    else if (e == KILN_WEB_EXPIRY_SOON)
        lit(b, " <span class=\"tag warn\">expires soon</span>");
    lit(b, "</span> "); /* apart without the stylesheet too */
}

void kiln_web_models_row_end(kiln_web_buf *b) {
    lit(b, "</td></tr>\n");
}

/* ---- a model ---- */

void kiln_web_channels_begin(kiln_web_buf *b) {
    lit(b, "<h2>Channels</h2>\n");
    thead(b, "Channel|Version|Seq|Expires|Reason|Signed by|Put by|At|History");
}

void kiln_web_channels_row(kiln_web_buf *b, const char *model, const kiln_web_record *r,
                           int64_t now) {
    b->rows++;
    lit(b, "<tr><td>");
    link_channel(b, model, r->channel);
    lit(b, "</td><td>");
    record_version(b, model, r);
    kiln_web_printf(b, "</td><td class=\"n\">%" PRId64 "</td><td>", r->seq);
    put_expiry(b, r, now);
    record_cells(b, r);
    lit(b, "</td><td><a href=\"");
    href_channel(b, model, r->channel);
    kiln_web_printf(b, "\">%zu record%s</a></td></tr>\n", r->records, r->records == 1 ? "" : "s");
}

void kiln_web_versions_begin(kiln_web_buf *b) {
    lit(b, "<h2>Versions</h2>\n");
    thead(b, "Version|Digest|Size|Published by|At|Validation|Signed by|Lineage (card.json)");
}

/* A value of the card's metrics: numbers as %g, strings cut short, anything else as JSON's
 * name for it. */
static void put_metric(kiln_web_buf *b, const json_t *v) {
    if (json_is_integer(v))
        kiln_web_printf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    else if (json_is_real(v))
        kiln_web_printf(b, "%.6g", json_real_value(v));
    else if (json_is_string(v))
        kiln_web_text_cut(b, json_string_value(v), 60);
    else if (json_is_true(v))
        lit(b, "true");
    else if (json_is_false(v))
        lit(b, "false");
    else if (json_is_null(v))
        lit(b, "\xE2\x80\x94");
    else
        lit(b, "\xE2\x80\xA6");
}

/* The card's lineage: run id, step, dataset digest, code version, then up to 16 metrics. */
static void put_lineage(kiln_web_buf *b, const json_t *card) {
    const json_t *lin = card ? json_object_get(card, "lineage") : NULL;
    if (!json_is_object(lin)) {
        lit(b, "<small>no lineage</small>");
        return;
    }
    const json_t *run = json_object_get(lin, "run_id"), *step = json_object_get(lin, "step"),
                 *ds = json_object_get(lin, "dataset_sha256"),
                 *code = json_object_get(lin, "code_version"),
                 *metrics = json_object_get(lin, "metrics");
    bool any = false;
    if (json_is_string(run)) {
        lit(b, "run <code>");
        kiln_web_text_cut(b, json_string_value(run), 80);
        lit(b, "</code>");
        any = true;
    }
    if (json_is_integer(step)) {
        if (any) lit(b, " \xC2\xB7 ");
        kiln_web_printf(b, "step %" JSON_INTEGER_FORMAT, json_integer_value(step));
        any = true;
    }
    if (json_is_string(ds)) {
        if (any) lit(b, " \xC2\xB7 ");
        lit(b, "dataset <code title=\"");
        kiln_web_text_cut(b, json_string_value(ds), 80);
        lit(b, "\">");
        kiln_web_text_cut(b, json_string_value(ds), 12);
        lit(b, "</code>");
        any = true;
    }
    if (json_is_string(code)) {
        if (any) lit(b, " \xC2\xB7 ");
        lit(b, "code ");
        kiln_web_text_cut(b, json_string_value(code), 40);
        any = true;
    }
    if (json_is_object(metrics) && json_object_size(metrics)) {
        lit(b, "<br><small>");
        const char *k;
        const json_t *v;
        size_t i = 0;
        json_object_foreach((json_t *)metrics, k, v) {
            if (i == 16) {
                kiln_web_printf(b, " (+%zu more)", json_object_size(metrics) - i);
                break;
            }
            if (i++) lit(b, " \xC2\xB7 ");
            kiln_web_text_cut(b, k, 40);
            lit(b, " ");
            put_metric(b, v);
        }
        lit(b, "</small>");
    }
    if (!any && !json_object_size(metrics)) lit(b, "<small>empty lineage</small>");
}

void kiln_web_versions_row(kiln_web_buf *b, const char *model, const kiln_web_version *v) {
    b->rows++;
    lit(b, "<tr><td>");
    link_version(b, model, v->version);
    for (size_t i = 0; i < v->nchannels; i++) {
        lit(b, " <span class=\"tag ok\">");
        kiln_web_text(b, v->channels[i]);
        lit(b, "</span>");
    }
    lit(b, "</td><td>");
    put_digest(b, v->digest);
    lit(b, "</td><td>");
    put_size(b, v->size);
    td_end(b);
    td_text(b, v->publisher);
    td(b);
    put_time(b, v->created);
    lit(b, "</td><td>");
    const char *val = v->validation ? v->validation : "absent";
    if (!strcmp(val, "passed"))
        lit(b, "<span class=\"tag ok\">");
    else if (!strcmp(val, "failed"))
        lit(b, "<span class=\"tag bad\">");
    else
        lit(b, "<span class=\"tag warn\">");
    kiln_web_text(b, val);
    lit(b, "</span></td><td>");
    put_signers(b, v->signers, v->nsigners);
    lit(b, "</td><td>");
    put_lineage(b, v->card);
    /* The version's own page: its validation check by check and its training curves. */
    lit(b, "<br><small><a class=\"version-page\" href=\"/ui/models/");
    seg(b, model);
    lit(b, "/versions/");
    seg(b, v->version);
    lit(b, "\">validation and training curves</a></small></td></tr>\n");
}

/* ---- a channel ---- */

void kiln_web_history_begin(kiln_web_buf *b, int64_t total, int64_t before) {
    kiln_web_printf(b, "<h2>History</h2>\n<p>%" PRId64 " record%s", total, total == 1 ? "" : "s");
    if (before > 0) kiln_web_printf(b, "; those before seq %" PRId64, before);
    lit(b, ", newest first. A rollback is a record that points at a version published before "
           "the one it replaces.</p>\n");
    thead(b, "Seq|Change|Version|Expires|Reason|Signed by|Put by|At");
}

void kiln_web_history_end(kiln_web_buf *b, const char *model, const char *channel, int64_t last,
                          bool more) {
    kiln_web_table_end(b, "No records here.");
    lit(b, "<p><a href=\"");
    href_channel(b, model, channel);
    lit(b, "\">newest records</a>");
    if (more) {
        lit(b, " \xC2\xB7 <a href=\"");
        href_channel(b, model, channel);
        kiln_web_printf(b, "?before=%" PRId64 "\">older records</a>", last);
    }
    lit(b, "</p>\n");
}

void kiln_web_history_row(kiln_web_buf *b, const char *model, const kiln_web_record *r,
                          int64_t now) {
    b->rows++;
    kiln_web_printf(b, "<tr><td class=\"n\">%" PRId64, r->seq);
    if (r->current) lit(b, " <span class=\"tag ok\">current</span>");
    lit(b, "</td><td>");
    if (!r->previous) {
        lit(b, "<span class=\"tag\">first</span>");
    } else if (r->version && !strcmp(r->previous, r->version)) {
        lit(b, "<span class=\"tag\">renew</span>");
    } else {
        if (r->older)
            lit(b, "<span class=\"tag warn\">rollback</span>");
        else
            lit(b, "<span class=\"tag\">promote</span>");
        lit(b, " from ");
        kiln_web_text(b, r->previous);
    }
    lit(b, "</td><td>");
    record_version(b, model, r);
    lit(b, "</td><td>");
    /* Only the current record's expiry matters to a service; older ones are history. */
    if (r->current)
        put_expiry(b, r, now);
    else
        put_time(b, r->expires);
    record_cells(b, r);
    lit(b, "</td></tr>\n");
}

/* ---- the audit log ---- */

void kiln_web_audit_begin(kiln_web_buf *b, int64_t after, int64_t total) {
    kiln_web_printf(b, "<p>%" PRId64 " entr%s in all", total, total == 1 ? "y" : "ies");
    if (after > 0) kiln_web_printf(b, "; those after #%" PRId64, after);
    lit(b, ", oldest first.</p>\n");
    thead(b, "#|Time|Token|Action|Model|Version|Channel|Digest|Reason");
}

void kiln_web_audit_row(kiln_web_buf *b, const kiln_web_audit *e) {
    b->rows++;
    kiln_web_printf(b, "<tr><td class=\"n\">%" PRId64 "</td><td>", e->id);
    put_time(b, e->time);
    td_end(b);
    td_text(b, e->token);
    td_text(b, e->action);
    td(b);
    if (e->model) link_model(b, e->model);
    td_end(b);
    td_text(b, e->version);
    td(b);
    if (e->model && e->channel)
        link_channel(b, e->model, e->channel);
    else
        kiln_web_text(b, e->channel);
    td_end(b);
    td(b);
    if (e->digest) put_digest(b, e->digest);
    td_end(b);
    td_text(b, e->reason);
    lit(b, "</tr>\n");
}

void kiln_web_audit_end(kiln_web_buf *b, int64_t last, bool more, int64_t newest_after) {
    kiln_web_table_end(b, "No entries here.");
    lit(b, "<p><a href=\"/ui/audit?after=0\">first page</a>");
    if (more) kiln_web_printf(b, " \xC2\xB7 <a href=\"/ui/audit?after=%" PRId64 "\">next page</a>", last);
    kiln_web_printf(b, " \xC2\xB7 <a href=\"/ui/audit?after=%" PRId64 "\">newest</a></p>\n", newest_after);
}

/* ---- the trust policy ---- */

static int role_count(const kiln_web_trust_policy *p, int which) {
    int n = 0;
    for (size_t i = 0; i < p->nkeys; i++)
        n += which == 0 ? p->keys[i].root : which == 1 ? p->keys[i].release : p->keys[i].promote;
    return n;
}

void kiln_web_trust_summary(kiln_web_buf *b, const kiln_web_trust_policy *p) {
    if (!p) {
        lit(b, "<p><span class=\"tag bad\">no trust policy</span> This registry was started "
               "without <code>--trust</code>: it takes no uploads, records or trust versions. "
               "<a href=\"/ui/trust\">trust policy</a></p>\n");
        return;
    }
    int root = role_count(p, 0), rel = role_count(p, 1), prom = role_count(p, 2);
    kiln_web_printf(b, "<p>Trust policy version %" PRIu64 " in force: ", p->version);
    kiln_web_printf(b, "%d root, %d release, %d promote key%s. ", root, rel, prom, prom == 1 ? "" : "s");
    lit(b, "<a href=\"/ui/trust\">Keys and versions</a></p>\n");
}

static void put_roles(kiln_web_buf *b, const kiln_web_trust_key *k) {
    bool any = false;
    if (k->root) {
        lit(b, "<span class=\"tag warn\">root</span>");
        any = true;
    }
    if (k->release) {
        if (any) lit(b, " ");
        lit(b, "<span class=\"tag\">release</span>");
        any = true;
    }
    if (k->promote) {
        if (any) lit(b, " ");
        lit(b, "<span class=\"tag\">promote</span>");
    }
}

void kiln_web_trust_policy_show(kiln_web_buf *b, const kiln_web_trust_policy *p,
                                uint64_t start_version) {
    if (!p) {
        lit(b, "<h2>In force</h2>\n<p><span class=\"tag bad\">no trust policy</span> This "
               "registry was started without <code>--trust</code>, so it checks nothing and "
               "takes no uploads, records or trust versions.</p>\n");
        return;
    }
    int root = role_count(p, 0), rel = role_count(p, 1);
    kiln_web_printf(b, "<h2>In force: version %" PRIu64 "</h2>\n<p>", p->version);
    kiln_web_printf(b,
        "Root threshold <b>%d</b> of %d root key%s (the next version needs that many of them) "
        "\xC2\xB7 ",
        p->root_threshold, root, root == 1 ? "" : "s");
    kiln_web_printf(b, "release threshold <b>%d</b> of %d release key%s (each archive) \xC2\xB7 ",
        p->release_threshold, rel, rel == 1 ? "" : "s");
    if (p->accept_unvalidated)
        lit(b, "accept_unvalidated <span class=\"tag warn\">true</span> (archives signed "
               "without a passing validation verify)");
    else
        lit(b, "accept_unvalidated <span class=\"tag ok\">false</span>");
    lit(b, "</p>\n");
    if (start_version && start_version != p->version) {
        kiln_web_printf(b, "<p><small>The server's <code>--trust</code> file is version %" PRIu64 "; ",
            start_version);
        lit(b, "the versions after it were walked from the store, each checked against the one "
               "before.</small></p>\n");
    }
    thead(b, "Key|Key id|Roles");
    for (size_t i = 0; i < p->nkeys; i++) {
        b->rows++;
        lit(b, "<tr>");
        td_text(b, p->keys[i].name);
        lit(b, "<td><code>");
        kiln_web_text(b, p->keys[i].keyid);
        lit(b, "</code></td><td>");
        put_roles(b, &p->keys[i]);
        lit(b, "</td></tr>\n");
    }
    kiln_web_table_end(b, "The policy has no keys.");
    thead(b, "Channel|Promote threshold");
    for (size_t i = 0; i < p->nchannels; i++) {
        b->rows++;
        lit(b, "<tr><td>");
        kiln_web_text(b, p->channels[i].name);
        kiln_web_printf(b, "</td><td class=\"n\">%d</td></tr>\n", p->channels[i].threshold);
    }
    kiln_web_table_end(b, "The policy names no channels, so no channel record verifies.");
}

void kiln_web_trust_history_begin(kiln_web_buf *b, int64_t total, uint64_t before) {
    kiln_web_printf(b, "<h2>History</h2>\n<p>%" PRId64 " stored version%s", total, total == 1 ? "" : "s");
    if (before > 0) kiln_web_printf(b, "; those below version %" PRIu64, before);
    lit(b, ", newest first. Each is checked as a client checks it: signed by the root quorum of "
           "the version before it and by its own, every signature verified.</p>\n");
    thead(b, "Version|Stored|By|Signed by (root quorum counted toward)|Changes from the version "
             "before|Check");
}

/* A line of kiln_sign_trust_diff, tagged with what it does (names hold no spaces, so neither
 * phrase can come from a name). */
static void put_change(kiln_web_buf *b, const char *line, size_t n) {
    char *l = kiln_malloc(n + 1);
    if (!l) {
        b->nomem = true;
        return;
    }
    memcpy(l, line, n);
    l[n] = 0;
    if (strstr(l, " removed ("))
        lit(b, "<span class=\"tag bad\">removed</span> ");
    else if (strstr(l, " added ("))
        lit(b, "<span class=\"tag ok\">added</span> ");
    else
        lit(b, "<span class=\"tag warn\">changed</span> ");
    kiln_web_text(b, l);
    free(l);
}

static void put_trust_signers(kiln_web_buf *b, const kiln_web_trust_version *v) {
    size_t shown = 0;
    for (size_t i = 0; i < v->nsigners; i++) {
        const kiln_web_trust_signer *s = &v->signers[i];
        if (shown++) lit(b, "<br>");
        if (s->name && s->name[0])
            kiln_web_text(b, s->name);
        else
            lit(b, "<span class=\"tag bad\">unknown key</span>");
        lit(b, " <small><code>");
        kiln_web_text(b, s->keyid);
        lit(b, "</code></small>");
        if (s->old_root) kiln_web_printf(b, " <span class=\"tag\">v%" PRIu64 "</span>", v->version - 1);
        if (s->new_root) kiln_web_printf(b, " <span class=\"tag\">v%" PRIu64 "</span>", v->version);
        if (!s->old_root && !s->new_root) lit(b, " <span class=\"tag bad\">not counted</span>");
    }
    if (!shown) lit(b, "<span class=\"tag bad\">no signature verified</span>");
    kiln_web_printf(b,
        "<br><small>root quorum of v%" PRIu64 ": %zu of %d \xC2\xB7 of v%" PRIu64 ": %zu of "
        "%d</small>",
        v->version - 1, v->nold, v->old_threshold, v->version, v->nnew, v->new_threshold);
}

void kiln_web_trust_history_row(kiln_web_buf *b, const kiln_web_trust_version *v) {
    b->rows++;
    if (v->problem)
        lit(b, "<tr class=\"bad\">");
    else
        lit(b, "<tr>");
    kiln_web_printf(b, "<td class=\"n\">%" PRIu64, v->version);
    if (v->in_force) lit(b, " <span class=\"tag ok\">in force</span>");
    lit(b, "</td><td>");
    put_time(b, v->created);
    td_end(b);
    td_text(b, v->publisher);
    td(b);
    if (v->checked)
        put_trust_signers(b, v);
    else
        kiln_web_printf(b, "<small>not checked: no version %" PRIu64 " to check it against</small>",
            v->version - 1);
    lit(b, "</td><td>");
    if (v->changes && v->changes[0]) {
        size_t k = 0;
        for (const char *p = v->changes; *p;) {
            const char *e = strchr(p, '\n');
            size_t n = e ? (size_t)(e - p) : strlen(p);
            if (n) {
                if (k++) lit(b, "<br>");
                put_change(b, p, n);
            }
            p += n + (e ? 1 : 0);
        }
    } else if (v->changes) {
        lit(b, "<small>nothing but the version</small>");
    } else {
        lit(b, "<small>unknown</small>");
    }
    lit(b, "</td><td>");
    if (v->problem) {
        lit(b, "<span class=\"tag bad\">does not verify</span> ");
        kiln_web_text(b, v->problem);
    } else if (v->note) {
        lit(b, "<span class=\"tag\">not walked</span> <small>");
        kiln_web_text(b, v->note);
        lit(b, "</small>");
    } else {
        lit(b, "<span class=\"tag ok\">verified</span>");
    }
    lit(b, "</td></tr>\n");
}

void kiln_web_trust_history_end(kiln_web_buf *b, uint64_t last, bool more) {
    kiln_web_table_end(b, "No versions here: the policy in force is the server's --trust file.");
    lit(b, "<p><a href=\"/ui/trust\">newest versions</a>");
    if (more) kiln_web_printf(b, " \xC2\xB7 <a href=\"/ui/trust?before=%" PRIu64 "\">older versions</a>", last);
    lit(b, "</p>\n");
}

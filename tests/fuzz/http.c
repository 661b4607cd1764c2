/* http.c - fuzz entry point for the registry server's request parsing (untrusted bytes from
 * any client): the first byte picks the parser, the rest is its input (as a C string, cut
 * at the first NUL, as microhttpd hands over paths and header values).
 *
 *   0 the path (the JSON API's and the web page's): routing and per-segment
 *     percent-decoding, then the name checks first_call makes; an accepted name holds no '/' or "..", a route survives re-encoding its
 *     segments, and every error message can be sent as a JSON answer
 *   1 Range against a blob size picked by the second byte, compared with a reference
 *     reading of RFC 9110's byte ranges (one range, digits only)
 *   2 Content-Length (digits only)
 *   3 Authorization (Bearer)
 *   4 X-Kiln-Signature (base64 of a .minisig text), then the signature file parser
 *   5 the audit query (after, newline, limit)
 *   6 X-Kiln-Digest (sha256:<64 lowercase hex>) */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "registry_int.h"

int kiln_fuzz_http(const uint8_t *data, size_t size);

/* Whatever a handler answers with must be sendable: a JSON body. */
static void answerable(void) {
    char *body = reg_error_body(kiln_errmsg());
    if (!body) abort();
    free(body);
    kiln_errclear();
}

static void encode(char *out, size_t cap, const char *s) {
    size_t k = 0;
    for (; *s && k + 3 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '.' || c == '_' || c == '-' || c == '~') {
            out[k++] = (char)c;
        } else {
            k += (size_t)snprintf(out + k, cap - k, "%%%02X", c);
        }
    }
    out[k] = 0;
}

static bool name_safe(const char *s) {
    return strlen(s) <= KILN_REGISTRY_NAME_MAX && !strchr(s, '/') && !strstr(s, "..");
}

static void fuzz_path(const char *url) {
    char seg[3][KILN_REGISTRY_NAME_MAX + 1];
    memset(seg, 0, sizeof seg);
    bool bad = false;
    int route = reg_route_match(url, seg, &bad);
    if (route < REG_R_NONE || route >= REG_R_COUNT || (bad && route != REG_R_NONE)) abort();
    for (int i = 0; i < 3; i++)
        if (strnlen(seg[i], sizeof seg[i]) > KILN_REGISTRY_NAME_MAX) abort();
    if (route == REG_R_NONE) return;
    /* The checks first_call makes before anything reads the names. */
    bool two = route == REG_R_VERSION || route == REG_R_CHANNEL || route == REG_R_HISTORY ||
               route == REG_R_UI_CHANNEL || route == REG_R_UI_VERSION ||
               route == REG_R_REPRODUCTIONS;
    bool named = route == REG_R_MODEL || route == REG_R_UI_MODEL || two;
    if (named && (seg[0][0] || route == REG_R_UI_MODEL || route == REG_R_UI_CHANNEL ||
                  route == REG_R_UI_VERSION)) {
        if (kiln_registry_check_name("model", seg[0]) == KILN_OK) {
            if (!name_safe(seg[0])) abort();
        } else {
            answerable();
        }
    }
    if (two) {
        kiln_err rc = route == REG_R_VERSION || route == REG_R_UI_VERSION ||
                              route == REG_R_REPRODUCTIONS
                          ? kiln_registry_check_version(seg[1])
                                             : kiln_registry_check_name("channel", seg[1]);
        if (rc == KILN_OK && !name_safe(seg[1])) abort();
        if (rc) answerable();
    }
    if (route == REG_R_BLOB) {
        char digest[80], hex[KILN_SHA256_HEX];
        snprintf(digest, sizeof digest, "sha256:%s", seg[2]);
        if (reg_digest_hex(digest, hex) && strcmp(hex, seg[2])) abort();
    }
    /* A trust version is digits only, in range, when the server takes it. */
    uint64_t tv;
    if (route == REG_R_TRUST_VERSION && reg_trust_version_parse(seg[1], &tv) &&
        (strspn(seg[1], "0123456789") != strlen(seg[1]) || tv < 1 ||
         tv > KILN_SIGN_TRUST_VERSION_MAX))
        abort();
    /* Re-encoding the decoded segments routes the same way to the same names. */
    char a[3 * KILN_REGISTRY_NAME_MAX + 1], b[3 * KILN_REGISTRY_NAME_MAX + 1], again[512];
    encode(a, sizeof a, route == REG_R_BLOB ? seg[2] : seg[0]);
    encode(b, sizeof b, route == REG_R_DATASET ? seg[2] : seg[1]);
    static const char *const fmt[REG_R_COUNT] = {
        [REG_R_HEALTH] = "/healthz",
        [REG_R_METRICS] = "/metrics",
        [REG_R_MODELS] = "/v1/models",
        [REG_R_AUDIT] = "/v1/audit",
        [REG_R_TOKENS] = "/v1/tokens",
        [REG_R_MODEL] = "/v1/models/%s",
        [REG_R_VERSION] = "/v1/models/%s/versions/%s",
        [REG_R_CHANNEL] = "/v1/models/%s/channels/%s",
        [REG_R_HISTORY] = "/v1/models/%s/channels/%s/history",
        [REG_R_BLOB] = "/v1/blobs/sha256/%s",
        [REG_R_UI_HOME] = "/",
        [REG_R_UI_MODEL] = "/ui/models/%s",
        [REG_R_UI_CHANNEL] = "/ui/models/%s/channels/%s",
        [REG_R_UI_AUDIT] = "/ui/audit",
        [REG_R_TRUST] = "/v1/trust",
        [REG_R_TRUST_VERSION] = "/v1/trust%.0s/%s",
        [REG_R_UI_TRUST] = "/ui/trust",
        [REG_R_UI_VERSION] = "/ui/models/%s/versions/%s",
        [REG_R_DATASETS] = "/v1/datasets",
        [REG_R_DATASET] = "/v1/datasets/%s/sha256/%s",
        [REG_R_REPRODUCTIONS] = "/v1/models/%s/versions/%s/reproductions",
    };
    if (!fmt[route]) { /* a route added to the server and not here: say so, not a NULL format */
        fprintf(stderr, "fuzz http: route %d has no path format in tests/fuzz/http.c\n", route);
        abort();
    }
    snprintf(again, sizeof again, fmt[route], a, b);
    char seg2[3][KILN_REGISTRY_NAME_MAX + 1];
    memset(seg2, 0, sizeof seg2);
    if (reg_route_match(again, seg2, &bad) != route || bad) abort();
    if (route == REG_R_DATASET ? strcmp(seg[0], seg2[0]) || strcmp(seg[2], seg2[2])
        : route == REG_R_BLOB  ? strcmp(seg[2], seg2[2])
                            : (named && (strcmp(seg[0], seg2[0]) || (two && strcmp(seg[1], seg2[1])))) ||
                                  (route == REG_R_TRUST_VERSION && strcmp(seg[1], seg2[1])))
        abort();
}

/* 1*DIGIT as a number; *over when it does not fit in 64 bits. */
static bool number(const char *s, size_t n, uint64_t *v, bool *over) {
    *v = 0;
    *over = false;
    if (!n) return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        unsigned d = (unsigned)(s[i] - '0');
        if (*v > (UINT64_MAX - d) / 10) *over = true;
        else *v = *v * 10 + d;
    }
    return true;
}

/* RFC 9110 14.1.2, one byte range: first-pos beyond the end is unsatisfiable; a last-pos
 * or a suffix past the end (however many digits) means "to the end". */
static bool ref_range(const char *h, uint64_t size, uint64_t *start, uint64_t *end) {
    if (strncmp(h, "bytes=", 6)) return false;
    const char *p = h + 6, *dash = strchr(p, '-');
    if (!dash) return false;
    uint64_t a, b;
    bool aover, bover;
    const char *last = dash + 1;
    size_t lastn = strlen(last);
    if (dash == p) {
        if (!number(last, lastn, &b, &bover) || (!bover && b == 0) || size == 0) return false;
        *start = bover || b >= size ? 0 : size - b;
        *end = size - 1;
        return true;
    }
    if (!number(p, (size_t)(dash - p), &a, &aover) || aover || a >= size) return false;
    if (lastn && !number(last, lastn, &b, &bover)) return false;
    uint64_t e = !lastn || bover || b >= size ? size - 1 : b;
    if (a > e) return false;
    *start = a;
    *end = e;
    return true;
}

static void fuzz_range(const char *h, uint8_t pick) {
    static const uint64_t sizes[] = {0, 1, 5, 1000, (uint64_t)1 << 40, INT64_MAX};
    uint64_t size = sizes[pick % (sizeof sizes / sizeof *sizes)];
    uint64_t s1 = 0, e1 = 0, s2 = 0, e2 = 0;
    bool ok = reg_range_parse(h, size, &s1, &e1);
    if (ok && !(s1 <= e1 && e1 < size)) abort();
    bool want = ref_range(h, size, &s2, &e2);
    if (ok != want || (ok && (s1 != s2 || e1 != e2))) abort();
}

static void fuzz_length(const char *s) {
    uint64_t n = 0, v;
    bool over;
    bool ok = reg_length_parse(s, &n);
    bool want = number(s, strlen(s), &v, &over) && !over && v != UINT64_MAX;
    if (ok != want || (ok && n != v)) abort();
}

static void fuzz_sig(const char *b64) {
    if (strlen(b64) > 2 * REG_SIG_MAX) return; /* refused before decoding */
    char *text = NULL;
    size_t len = 0;
    if (reg_sig_decode(b64, &text, &len) == KILN_OK) {
        if (!text || text[len] || memchr(text, 0, len) || len > strlen(b64)) abort();
        kiln_sign_sig *sigs = NULL;
        size_t n = 0;
        if (kiln_sign_archive_sigs_parse(text, len, "X-Kiln-Signature", &sigs, &n) == KILN_OK)
            kiln_sign_archive_sigs_free(sigs, n);
    } else if (text) {
        abort();
    }
    free(text);
}

int kiln_fuzz_http(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t sel = data[0], pick = size > 1 ? data[1] : 0;
    char *s = kiln_malloc(size);
    if (!s) return 0;
    memcpy(s, data + 1, size - 1);
    s[size - 1] = 0;
    switch (sel % 7) {
    case 0:
        fuzz_path(s);
        break;
    case 1:
        /* The second byte picks the size; the header starts after it. */
        fuzz_range(size > 1 ? s + 1 : s, pick);
        break;
    case 2:
        fuzz_length(s);
        break;
    case 3: {
        const char *t = reg_bearer_token(s);
        if (t ? (t != s + 7 || strncmp(s, "Bearer ", 7)) : !strncmp(s, "Bearer ", 7)) abort();
        break;
    }
    case 4:
        fuzz_sig(s);
        break;
    case 5: { /* after \n limit \n since \n model \n action, as the audit query gets them */
        const char *arg[5] = {s, NULL, NULL, NULL, NULL};
        for (int k = 1; k < 5 && arg[k - 1]; k++) {
            char *nl = strchr(arg[k - 1], '\n');
            if (nl) *nl = 0;
            arg[k] = nl ? nl + 1 : NULL;
        }
        reg_audit_query q;
        char why[200];
        if (reg_audit_parse(arg[0], arg[1], arg[2], arg[3], arg[4], &q, why)) {
            if (q.limit < 1 || q.limit > 10000 || q.after < 0 || q.since < 0) abort();
            for (int k = 0; k < 3; k++) /* numbers: digits only */
                for (const char *p = arg[k]; p && *p; p++)
                    if (*p < '0' || *p > '9') abort();
            if (arg[3] && strcmp(q.model, arg[3])) abort();
            /* the actions' JSON array parses as an array of the names given, in order */
            json_t *a = arg[4] ? json_loads(q.actions, 0, NULL) : NULL;
            if (arg[4] && !json_is_array(a)) abort();
            size_t at = 0;
            for (size_t k = 0; k < json_array_size(a); k++) {
                const char *name = json_string_value(json_array_get(a, k));
                size_t n = name ? strlen(name) : 0;
                if (!n || strncmp(arg[4] + at, name, n) ||
                    (arg[4][at + n] && arg[4][at + n] != ','))
                    abort();
                at += n + 1;
            }
            if (arg[4] && at != strlen(arg[4]) + 1) abort();
            json_decref(a);
        }
        break;
    }
    case 6: {
        char hex[KILN_SHA256_HEX];
        if (reg_digest_hex(s, hex)) {
            if (strlen(hex) != 64 || strncmp(s, "sha256:", 7) || strcmp(s + 7, hex)) abort();
            for (int i = 0; i < 64; i++)
                if (!strchr("0123456789abcdef", hex[i])) abort();
        }
        break;
    }
    }
    free(s);
    kiln_errclear();
    return 0;
}

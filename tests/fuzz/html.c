/* html.c - fuzz entry point for web/'s escaping, which every value on the registry's page
 * goes through (reasons, card fields, names and token names from the store): the bytes, cut
 * at the first NUL as a C string, are escaped on their own and as an error page's message.
 *
 * Checked: the output holds no < > " ' at all and no & that does not begin one of the five
 * references written; it is well-formed UTF-8 without control characters but tab and
 * newline (by a decoder written here from RFC 3629, not web/'s table); when the input was
 * such text already, undoing the five references gives it back byte for byte; the page
 * holds the escaped text, one <style> and no <script. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "web.h"

int kiln_fuzz_html(const uint8_t *data, size_t size);

/* The code point at s (n bytes left), its length in *len; -1 when ill-formed. */
static long decode(const unsigned char *s, size_t n, size_t *len) {
    unsigned c = s[0];
    size_t k = c < 0x80             ? 1
               : (c & 0xE0) == 0xC0 ? 2
               : (c & 0xF0) == 0xE0 ? 3
               : (c & 0xF8) == 0xF0 ? 4
                                    : 0;
    if (!k || k > n) return -1;
    long cp = k == 1 ? (long)c : (long)(c & (0x7F >> k));
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return -1;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const long min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    *len = k;
    return cp;
}

static bool control(long cp) {
    return (cp < 0x20 && cp != '\t' && cp != '\n') || (cp >= 0x7F && cp <= 0x9F);
}

/* Well-formed UTF-8 with no control characters but tab and newline. */
static bool clean_text(const unsigned char *s, size_t n) {
    for (size_t i = 0, k; i < n; i += k) {
        long cp = decode(s + i, n - i, &k);
        if (cp < 0 || control(cp)) return false;
    }
    return true;
}

int kiln_fuzz_html(const uint8_t *data, size_t size) {
    char *in = kiln_malloc(size + 1);
    if (!in) return 0;
    memcpy(in, data, size);
    in[size] = 0;
    size_t n = strlen(in), len = 0;
    kiln_web_buf b = {0};
    kiln_web_text(&b, in);
    char *out = kiln_web_buf_take(&b, &len);
    if (!out) __builtin_trap();
    static const char *const refs[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&#39;"};
    static const char plain[] = "&<>\"'";
    char *back = kiln_malloc(len + 1);
    if (!back) __builtin_trap();
    size_t k = 0;
    for (size_t i = 0; i < len;) {
        if (strchr("<>\"'", out[i])) __builtin_trap();
        if (out[i] == '&') {
            size_t r = 0;
            while (r < 5 && strncmp(out + i, refs[r], strlen(refs[r])))
                r++;
            if (r == 5) __builtin_trap();
            back[k++] = plain[r];
            i += strlen(refs[r]);
        } else {
            back[k++] = out[i++];
        }
    }
    back[k] = 0;
    if (!clean_text((const unsigned char *)out, len)) __builtin_trap();
    if (clean_text((const unsigned char *)in, n) && (k != n || memcmp(back, in, n)))
        __builtin_trap();
    kiln_web_error(&b, 400, in, 0);
    size_t plen;
    char *page = kiln_web_buf_take(&b, &plen);
    const char *style = page ? strstr(page, "<style") : NULL;
    if (!style || strstr(style + 1, "<style") || !strstr(page, out) || strstr(page, "<script"))
        __builtin_trap();
    free(page);
    free(back);
    free(out);
    free(in);
    kiln_errclear();
    return 0;
}

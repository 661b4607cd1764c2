/* json.c - strict parsing and canonical output through jansson. */
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define KILN_JSON_FILE_LIMIT (64u << 20)

kiln_err kiln_json_parse(const char *buf, size_t len, const char *label, json_t **out) {
    json_error_t je;
    *out = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    if (!*out)
        return kiln_fail(KILN_ERR_FORMAT, "'%s': invalid JSON at line %d column %d: %s", label,
                         je.line, je.column, je.text);
    return KILN_OK;
}

kiln_err kiln_json_load_file(const char *path, json_t **out) {
    char *buf;
    size_t len;
    *out = NULL;
    KILN_TRY(kiln_read_file(path, KILN_JSON_FILE_LIMIT, &buf, &len));
    kiln_err rc = kiln_json_parse(buf, len, path, out);
    free(buf);
    return rc;
}

size_t kiln_utf8_valid_prefix(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        unsigned c = u[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0)
            n = 1, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0)
            n = 2, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0)
            n = 3, cp = c & 0x07, min = 0x10000;
        else
            return i; /* a continuation byte first, or 0xF8..0xFF */
        if (len - i <= n) return i; /* cut short */
        for (size_t k = 1; k <= n; k++) {
            if ((u[i + k] & 0xC0) != 0x80) return i;
            cp = cp << 6 | (u[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += n + 1;
    }
    return len;
}

char *kiln_json_canonical(const json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    if (!s) kiln_fail(KILN_ERR_NOMEM, "out of memory encoding JSON");
    return s;
}

char *kiln_json_document(const json_t *j, size_t *len) {
    /* Documents for people: 15 significant digits print 0.003 as 0.003, not
     * 0.0030000000000000001. Values that must survive exactly live in safetensors
     * metadata or canonical JSON, which keep 17. */
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));
    if (!s) return NULL;
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) {
        free(s);
        return NULL;
    }
    t[n] = '\n';
    t[n + 1] = 0;
    *len = n + 1;
    return t;
}

kiln_err kiln_json_write_file(const char *path, const json_t *j) {
    size_t n;
    char *t = kiln_json_document(j, &n);
    if (!t) return kiln_fail(KILN_ERR_NOMEM, "out of memory encoding JSON for '%s'", path);
    kiln_err rc = kiln_write_file_atomic(path, t, n);
    free(t);
    return rc;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const char **kiln_json_sorted_keys(const json_t *o, size_t *n) {
    *n = json_object_size(o);
    const char **k = kiln_calloc(*n ? *n : 1, sizeof *k);
    if (!k) return NULL;
    size_t i = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v) k[i++] = key;
    qsort(k, *n, sizeof *k, cmp_str);
    return k;
}

json_t *kiln_time_json(int64_t unix_secs) {
    char s[21];
    kiln_format_time(unix_secs, s);
    return json_string(s);
}

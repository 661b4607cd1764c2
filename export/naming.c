/* naming.c - the export module's rules for names, versions and archive paths, and its
 * RFC 3339 time parser: what the manifest, the walk of a model directory and the unpacker
 * all check, kept apart from each of them so that none of them needs another for it. */
#include <stdlib.h>
#include <string.h>

#include "export_int.h"

static bool in_set(char c, const char *extra) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (c && strchr(extra, c));
}

bool kiln_export_name_ok(const char *name) {
    size_t n = name ? strlen(name) : 0;
    if (n < 1 || n > 64 || !in_set(name[0], "")) return false;
    for (size_t i = 1; i < n; i++)
        if (!in_set(name[i], "._-")) return false;
    return !strstr(name, "..");
}

bool kiln_export_version_ok(const char *v) {
    static const char upper[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    size_t n = v ? strlen(v) : 0;
    if (n < 1 || n > 64 || !in_set(v[0], upper)) return false;
    for (size_t i = 1; i < n; i++)
        if (!in_set(v[i], upper) && !in_set(v[i], ".+_-")) return false;
    return !strstr(v, "..");
}

bool kiln_export_path_ok(const char *path, size_t max) {
    static const char extra[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ._+-";
    size_t n = strlen(path);
    if (n == 0 || n > max) return false;
    const char *comp = path;
    for (size_t i = 0; i <= n; i++) {
        char c = path[i];
        if (c == '/' || c == 0) {
            size_t cl = (size_t)(path + i - comp);
            if (cl == 0) return false; /* leading, trailing or doubled '/' */
            if ((cl == 1 && comp[0] == '.') || (cl == 2 && comp[0] == '.' && comp[1] == '.'))
                return false;
            comp = path + i + 1;
        } else if (!in_set(c, extra)) {
            return false;
        }
    }
    return true;
}

static int digits(const char *s, int n) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm). */
static int64_t days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

kiln_err kiln_export_parse_time(const char *s, int64_t *out) {
    static const int mdays[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    size_t n = strlen(s);
#define BAD() kiln_fail(KILN_ERR_FORMAT, "'%s' is not an RFC 3339 date-time", s)
    if (n < 20 || s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != 't') || s[13] != ':' ||
        s[16] != ':')
        return BAD();
    int y = digits(s, 4), mo = digits(s + 5, 2), d = digits(s + 8, 2), h = digits(s + 11, 2),
        mi = digits(s + 14, 2), se = digits(s + 17, 2);
    if (y < 0 || mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] || h < 0 || h > 23 || mi < 0 ||
        mi > 59 || se < 0 || se > 60)
        return BAD();
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (mo == 2 && d == 29 && !leap) return BAD();
    const char *p = s + 19;
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9') return BAD();
        while (*p >= '0' && *p <= '9')
            p++;
    }
    int64_t off = 0;
    if ((*p == 'Z' || *p == 'z') && p[1] == 0) {
        off = 0;
    } else if ((*p == '+' || *p == '-') && strlen(p) == 6 && p[3] == ':') {
        int oh = digits(p + 1, 2), om = digits(p + 4, 2);
        if (oh < 0 || oh > 23 || om < 0 || om > 59) return BAD();
        off = (int64_t)(oh * 3600 + om * 60) * (*p == '-' ? -1 : 1);
    } else {
        return BAD();
    }
#undef BAD
    *out = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se - off;
    return KILN_OK;
}

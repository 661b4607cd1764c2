/* err.c - error codes and messages, logging, checked allocation. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core.h"

#ifndef KILN_GIT_REV /* the emulator build (tests/gpu/emu) passes it with -D */
#if __has_include("kiln_rev.h")
#include "kiln_rev.h" /* $(BUILD)/kiln_rev.h, remade by the Makefile when HEAD moves */
#else
#define KILN_GIT_REV "unknown"
#endif
#endif

static _Thread_local char errbuf[1024];
static _Thread_local int err_errno; /* the errno kiln_fail_errno recorded, else 0 */

static const char *const err_names[] = {
    [KILN_OK] = "ok",
    [KILN_ERR_IO] = "i/o error",
    [KILN_ERR_NOMEM] = "out of memory",
    [KILN_ERR_FORMAT] = "bad format",
    [KILN_ERR_CONFIG] = "bad config",
    [KILN_ERR_USAGE] = "bad usage",
    [KILN_ERR_VERIFY] = "verification failed",
    [KILN_ERR_NUMERIC] = "numeric failure",
    [KILN_ERR_NOTFOUND] = "not found",
    [KILN_ERR_UNSUPPORTED] = "unsupported",
    [KILN_ERR_CONFLICT] = "conflict",
    [KILN_ERR_AUTH] = "not authorised",
    [KILN_ERR_NETWORK] = "network error",
    [KILN_ERR_DEVICE] = "device error",
    [KILN_ERR_INTERNAL] = "internal error",
    [KILN_ERR_LIMIT] = "limit exceeded",
    [KILN_ERR_INTERRUPTED] = "interrupted",
};

KILN_API const char *kiln_strerror(kiln_err code) {
    if ((unsigned)code < KILN_ARRAY_LEN(err_names) && err_names[code]) return err_names[code];
    return "unknown error";
}

KILN_API const char *kiln_errmsg(void) { return errbuf; }

KILN_API const char *kiln_version(void) { return KILN_VERSION " (" KILN_GIT_REV ")"; }

void kiln_errclear(void) {
    errbuf[0] = 0;
    err_errno = 0;
}

int kiln_err_errno(void) { return err_errno; }

kiln_err kiln_fail(kiln_err code, const char *fmt, ...) {
    err_errno = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    va_end(ap);
    return code;
}

kiln_err kiln_fail_errno(kiln_err code, const char *fmt, ...) {
    int e = errno;
    err_errno = e;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof errbuf)
        snprintf(errbuf + n, sizeof errbuf - (size_t)n, ": %s", strerror(e));
    return code;
}

kiln_err kiln_errprefix(kiln_err code, const char *fmt, ...) {
    char old[sizeof errbuf];
    memcpy(old, errbuf, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof errbuf) snprintf(errbuf + n, sizeof errbuf - (size_t)n, "%s", old);
    return code;
}

/* ---- logging ---- */

static kiln_log_level log_level = KILN_LOG_INFO;

void kiln_log_set_level(kiln_log_level level) { log_level = level; }

kiln_log_level kiln_log_get_level(void) {
    return log_level;
}

void kiln_log(kiln_log_level level, const char *fmt, ...) {
    static const char *const tag[] = {"debug", "info", "warning", "error"};
    if (level < log_level) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kiln: %s: %s\n", tag[level], line);
}

/* ---- memory ---- */

static long alloc_countdown;

void kiln_alloc_fail_after(long n) { alloc_countdown = n; }

static bool alloc_should_fail(void) {
    if (alloc_countdown <= 0) return false;
    return --alloc_countdown == 0;
}

void *kiln_calloc(size_t n, size_t size) {
    void *p = alloc_should_fail() ? NULL : calloc(n ? n : 1, size ? size : 1);
    if (!p) kiln_fail(KILN_ERR_NOMEM, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *kiln_malloc(size_t size) {
    void *p = alloc_should_fail() ? NULL : malloc(size ? size : 1);
    if (!p) kiln_fail(KILN_ERR_NOMEM, "out of memory allocating %zu bytes", size);
    return p;
}

char *kiln_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = kiln_malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

char *kiln_asprintf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        kiln_fail(KILN_ERR_INTERNAL, "bad format string");
        return NULL;
    }
    char *p = kiln_malloc((size_t)n + 1);
    if (!p) return NULL;
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

/* ---- time ---- */

uint64_t kiln_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int64_t kiln_unix_time(void) { return (int64_t)time(NULL); }

void kiln_format_time(int64_t unix_secs, char out[21]) {
    time_t t = (time_t)unix_secs;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 21, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

void kiln_format_span(int64_t secs, char out[KILN_SPAN_MAX]) {
    if (secs < 0) secs = -secs;
    if (secs >= 2 * 86400)
        snprintf(out, KILN_SPAN_MAX, "%" PRId64 " d", secs / 86400);
    else if (secs >= 2 * 3600)
        snprintf(out, KILN_SPAN_MAX, "%" PRId64 " h", secs / 3600);
    else if (secs >= 120)
        snprintf(out, KILN_SPAN_MAX, "%" PRId64 " min", secs / 60);
    else
        snprintf(out, KILN_SPAN_MAX, "%" PRId64 " s", secs);
}

/* The edit distance of a and b (insertions, deletions, substitutions and transpositions of two
 * neighbours: "stpes" is one from "steps"), or limit + 1 for names too long to be keys. */
static size_t edit_distance(const char *a, const char *b, size_t limit) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return limit + 1;
    unsigned char d[64][64];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (unsigned char)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (unsigned char)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            unsigned v = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1u < v) v = d[i - 1][j] + 1u;
            if (d[i][j - 1] + 1u < v) v = d[i][j - 1] + 1u;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1u < v)
                v = d[i - 2][j - 2] + 1u;
            d[i][j] = (unsigned char)v;
        }
    return d[la][lb];
}

void kiln_name_hint(const char *word, const void *table, size_t n, size_t stride,
                    const char *what, char *buf, size_t len) {
    if (!len) return;
    buf[0] = 0;
    const size_t wl = strlen(word), limit = wl < 6 ? 1 : wl / 3;
    const char *best = NULL;
    size_t best_d = limit + 1;
    for (size_t i = 0; i < n; i++) {
        const char *name = *(const char *const *)((const char *)table + i * stride);
        size_t d = edit_distance(word, name, limit);
        if (d < best_d) {
            best_d = d;
            best = name;
        }
    }
    size_t at = 0;
    if (best) at = (size_t)snprintf(buf, len, " (did you mean '%s'?)", best);
    if (!what) return;
    if (at < len) at += (size_t)snprintf(buf + at, len - at, "\n%s: ", what);
    for (size_t i = 0; i < n && at < len; i++) {
        const char *name = *(const char *const *)((const char *)table + i * stride);
        at += (size_t)snprintf(buf + at, len - at, "%s%s", i ? ", " : "", name);
    }
}

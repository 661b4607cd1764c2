/*
 * timecol.c - the times of a dataset's rows: ISO 8601 dates and date-times, or epoch seconds,
 * as int64 seconds since 1970-01-01T00:00:00Z (negative before it: market history starts
 * long before 1970), and durations ("30d") for a purge gap given in time.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"

/* Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar (Howard Hinnant's
 * days_from_civil). */
static int64_t days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const int64_t yoe = y - era * 400;
    const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static void civil_from_days(int64_t z, int64_t *y, int *m, int *d) {
    z += 719468;
    const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    const int64_t doe = z - era * 146097;
    const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    const int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

/* n decimal digits at s as a number, or -1. */
static int digits(const char *s, int n) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i])) return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

bool kiln_time_parse(const char *s, int64_t *out) {
    size_t n = strlen(s);
    if (n && (isdigit((unsigned char)s[0]) || s[0] == '-' || s[0] == '+') &&
        strspn(s + 1, "0123456789") == n - 1 && (n < 5 || s[4] != '-')) {
        /* epoch seconds */
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (errno || *end || end == s || v < KILN_TIME_MIN || v > KILN_TIME_MAX) return false;
        *out = v;
        return true;
    }
    if (n < 10 || s[4] != '-' || s[7] != '-') return false;
    int y = digits(s, 4), mo = digits(s + 5, 2), d = digits(s + 8, 2);
    static const int mdays[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (y < 0 || mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1]) return false;
    if (mo == 2 && d == 29 && !(y % 4 == 0 && (y % 100 != 0 || y % 400 == 0))) return false;
    int64_t secs = days_from_civil(y, mo, d) * 86400;
    const char *p = s + 10;
    if (*p == 'T' || *p == 't' || *p == ' ') {
        p++;
        int h = digits(p, 2), sec = 0;
        if (h < 0 || h > 23 || p[2] != ':') return false; /* p[2] exists: p[0..1] are digits */
        int mi = digits(p + 3, 2);
        if (mi < 0 || mi > 59) return false;
        p += 5;
        if (*p == ':') {
            sec = digits(p + 1, 2);
            if (sec < 0 || sec > 60) return false;
            p += 3;
            if (*p == '.' || *p == ',') { /* a fraction: seconds are the resolution */
                p++;
                if (!isdigit((unsigned char)*p)) return false;
                while (isdigit((unsigned char)*p))
                    p++;
            }
        }
        secs += h * 3600 + mi * 60 + sec;
        if (*p == 'Z' || *p == 'z') {
            p++;
        } else if (*p == '+' || *p == '-') {
            int sign = *p == '+' ? 1 : -1, oh = digits(p + 1, 2), om;
            if (oh < 0 || oh > 23) return false;
            if (p[3] == ':')
                om = digits(p + 4, 2), p += 6;
            else
                om = digits(p + 3, 2), p += 5;
            if (om < 0 || om > 59) return false;
            secs -= sign * (oh * 3600 + om * 60); /* 10:00+02:00 is 08:00Z */
        }
    }
    /* An offset or a leap second can step past a bound: 0000-01-01T00:00+01:00 */
    if (*p || secs < KILN_TIME_MIN || secs > KILN_TIME_MAX) return false;
    *out = secs;
    return true;
}

void kiln_time_format(int64_t t, char out[32]) {
    if (t < KILN_TIME_MIN || t > KILN_TIME_MAX) { /* -t and the day count would overflow */
        snprintf(out, 32, "epoch %lld", (long long)t);
        return;
    }
    int64_t days = t >= 0 ? t / 86400 : -((-t + 86399) / 86400), rem = t - days * 86400, y;
    int m, d;
    civil_from_days(days, &y, &m, &d);
    /* Inside the bounds the longest is 20 bytes; the length is checked all the same (and
     * GCC's truncation warning, which cannot see the bounds, is answered by it). */
    int n = rem == 0 ? snprintf(out, 32, "%04lld-%02d-%02d", (long long)y, m, d)
                     : snprintf(out, 32, "%04lld-%02d-%02dT%02d:%02d:%02dZ", (long long)y, m, d,
                                (int)(rem / 3600), (int)(rem / 60 % 60), (int)(rem % 60));
    if (n < 0 || n >= 32) snprintf(out, 32, "epoch %lld", (long long)t);
}

void kiln_duration_format(int64_t secs, char out[32]) {
    if (secs % 86400 == 0)
        snprintf(out, 32, "%lldd", (long long)(secs / 86400));
    else if (secs % 3600 == 0)
        snprintf(out, 32, "%lldh", (long long)(secs / 3600));
    else if (secs % 60 == 0)
        snprintf(out, 32, "%lldm", (long long)(secs / 60));
    else
        snprintf(out, 32, "%llds", (long long)secs);
}

bool kiln_duration_parse(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0 || !isdigit((unsigned char)*s)) return false;
    int64_t unit = 1;
    if (!strcmp(end, "d"))
        unit = 86400;
    else if (!strcmp(end, "h"))
        unit = 3600;
    else if (!strcmp(end, "m"))
        unit = 60;
    else if (strcmp(end, "s") && *end)
        return false;
    if (v > (KILN_TIME_MAX - KILN_TIME_MIN) / unit) return false;
    *out = v * unit;
    return true;
}

/* The step that ends row r (r > 0, of r - 1's group): times are non-decreasing within a
 * group, so the unsigned difference is the step even across the int64 extremes. */
static uint64_t step_at(const kiln_dataset *ds, size_t r) {
    return (uint64_t)ds->time[r] - (uint64_t)ds->time[r - 1];
}

static bool same_group(const kiln_dataset *ds, size_t r) {
    return r && (!ds->group || ds->group[r] == ds->group[r - 1]);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

bool kiln_time_step_is_gap(uint64_t step, uint64_t median, uint64_t usual) {
    /* step > usual * 5/4 and step >= 2 * median, without overflow */
    return step > usual && step - usual > usual / 4 && step >= median && step - median >= median;
}

/* The day of t since 1970-01-01, floored. */
static int64_t day_of(int64_t t) {
    return t / 86400 - (t % 86400 < 0);
}
/* The weekday of day d, 0 Sunday .. 6 Saturday (day 0, 1970-01-01, was a Thursday). */
static int weekday_of_day(int64_t d) {
    return (int)(((d + 4) % 7 + 7) % 7);
}

/* Weekdays in (day of a, day of b]: a step of business-daily data that skips none is 1. */
static uint64_t weekdays_between(int64_t a, int64_t b) {
    const int64_t da = day_of(a), db = day_of(b);
    const uint64_t days = (uint64_t)db - (uint64_t)da;
    uint64_t n = days / 7 * 5;
    for (int64_t d = da + 1 + (int64_t)(days / 7 * 7); d <= db; d++) {
        const int w = weekday_of_day(d);
        n += w != 0 && w != 6;
    }
    return n;
}

/* Business-daily data: a median step of one day and not one row on a Saturday or a Sunday
 * (UTC). Its steps are then counted in weekdays. */
static bool is_business_daily(const kiln_dataset *ds, uint64_t median) {
    if (median != 86400) return false;
    for (size_t r = 0; r < ds->rows; r++) {
        const int w = weekday_of_day(day_of(ds->time[r]));
        if (w == 0 || w == 6) return false;
    }
    return true;
}

bool kiln_time_row_is_gap(const kiln_dataset *ds, const kiln_time_steps *ts, size_t r) {
    if (!same_group(ds, r)) return false;
    if (ts->business) return weekdays_between(ds->time[r - 1], ds->time[r]) >= 2;
    return kiln_time_step_is_gap(step_at(ds, r), ts->median, ts->usual);
}

kiln_err kiln_time_steps_of(const kiln_dataset *ds, kiln_time_steps *out) {
    memset(out, 0, sizeof *out);
    if (!ds->time || !ds->rows) return KILN_OK;
    uint64_t *d = malloc(ds->rows * sizeof *d);
    if (!d) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    out->first = out->last = ds->time[0];
    for (size_t r = 0; r < ds->rows; r++) {
        if (ds->time[r] < out->first) out->first = ds->time[r];
        if (ds->time[r] > out->last) out->last = ds->time[r];
        if (same_group(ds, r)) d[out->n++] = step_at(ds, r);
    }
    if (out->n) {
        qsort(d, out->n, sizeof *d, cmp_u64);
        out->median = d[(out->n - 1) / 2];
        out->usual = d[(size_t)(0.99 * (double)(out->n - 1))];
    }
    free(d);
    out->business = out->n && is_business_daily(ds, out->median);
    for (size_t r = 1; r < ds->rows; r++) {
        if (!kiln_time_row_is_gap(ds, out, r)) continue;
        const uint64_t g = step_at(ds, r);
        out->n_gaps++;
        /* keep the largest (row r ends each), largest first; ties: the earlier row */
        size_t k = out->n_top < KILN_TIME_TOP_GAPS ? out->n_top++ : KILN_TIME_TOP_GAPS;
        while (k > 0 && step_at(ds, out->top[k - 1]) < g) {
            if (k < KILN_TIME_TOP_GAPS) out->top[k] = out->top[k - 1];
            k--;
        }
        if (k < KILN_TIME_TOP_GAPS) out->top[k] = r;
    }
    return KILN_OK;
}

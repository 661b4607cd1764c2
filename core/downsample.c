/* downsample.c - cutting a series to a fixed number of points that keeps its extremes
 * (core.h, "downsampling a series"): what the web charts and a release's run summary draw. */
#include <math.h>
#include <string.h>

#include "core.h"

void kiln_downsample_init(kiln_downsample *d, double lo, double hi, size_t buckets, double *x,
                          double *y) {
    memset(d, 0, sizeof *d);
    d->lo = lo;
    d->hi = hi;
    d->buckets = buckets ? buckets : 1;
    d->x = x;
    d->y = y;
}

static void emit(kiln_downsample *d, double x, double y) {
    d->x[d->n] = x;
    d->y[d->n] = y;
    d->n++;
}

/* Write the open bucket's points in ascending x: its smallest and largest finite values, its
 * first non-finite one, and where the series starts (the first bucket) and ends (the last:
 * last is true), so that a line runs from the first step to the last. */
static void flush(kiln_downsample *d, bool last) {
    if (!d->open) return;
    double px[5], py[5];
    int k = 0;
    if (d->finite) {
        px[k] = d->minx, py[k++] = d->miny;
        px[k] = d->maxx, py[k++] = d->maxy;
        if (!d->first_out) px[k] = d->firstx, py[k++] = d->firsty, d->first_out = true;
        if (last) px[k] = d->lastx, py[k++] = d->lasty;
    }
    if (d->bad) px[k] = d->badx, py[k++] = d->bady;
    /* Insertion sort by x; one point per x. */
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && px[j] < px[j - 1]; j--) {
            double tx = px[j], ty = py[j];
            px[j] = px[j - 1], py[j] = py[j - 1], px[j - 1] = tx, py[j - 1] = ty;
        }
    for (int i = 0; i < k; i++)
        if (!i || px[i] != px[i - 1]) emit(d, px[i], py[i]);
    d->open = d->finite = d->bad = false;
}

static size_t bucket_of(const kiln_downsample *d, double x) {
    if (!(d->hi > d->lo) || !(x > d->lo)) return 0;
    double f = (x - d->lo) / (d->hi - d->lo) * (double)d->buckets;
    if (!(f < (double)d->buckets)) return d->buckets - 1;
    return (size_t)f;
}

void kiln_downsample_push(kiln_downsample *d, double x, double y) {
    d->pushed++;
    size_t b = bucket_of(d, x);
    if (d->open && b != d->cur) flush(d, false);
    d->cur = b;
    d->open = true;
    if (!isfinite(y)) {
        if (!d->bad) d->bad = true, d->badx = x, d->bady = y;
        return;
    }
    d->lastx = x, d->lasty = y;
    if (!d->finite) {
        if (!d->first_out) d->firstx = x, d->firsty = y;
        d->finite = true;
        d->minx = d->maxx = x;
        d->miny = d->maxy = y;
        return;
    }
    /* The first of equal values stays: a flat stretch keeps its start. */
    if (y < d->miny) d->minx = x, d->miny = y;
    if (y > d->maxy) d->maxx = x, d->maxy = y;
}

size_t kiln_downsample_end(kiln_downsample *d) {
    flush(d, true);
    return d->n;
}

size_t kiln_downsample_array(const double *x, const double *y, size_t n, size_t buckets,
                             double *ox, double *oy) {
    kiln_downsample d;
    kiln_downsample_init(&d, n ? x[0] : 0, n ? x[n - 1] : 0, buckets, ox, oy);
    for (size_t i = 0; i < n; i++)
        kiln_downsample_push(&d, x[i], y[i]);
    return kiln_downsample_end(&d);
}

/* ---- the rollup: the same buckets, kept as a series grows ---- */

void kiln_rollup_init(kiln_rollup *r) {
    memset(r, 0, sizeof *r);
    r->width = 1;
}

static void bucket_merge(kiln_rollup_bucket *a, const kiln_rollup_bucket *b) {
    if (b->finite) {
        if (!a->finite) {
            a->minx = b->minx, a->miny = b->miny, a->maxx = b->maxx, a->maxy = b->maxy;
            a->finite = true;
        } else {
            /* Ties keep the earlier point, as a bucket filled at once would. */
            if (b->miny < a->miny || (b->miny == a->miny && b->minx < a->minx))
                a->minx = b->minx, a->miny = b->miny;
            if (b->maxy > a->maxy || (b->maxy == a->maxy && b->maxx < a->maxx))
                a->maxx = b->maxx, a->maxy = b->maxy;
        }
    }
    if (b->bad && (!a->bad || b->badx < a->badx)) a->bad = true, a->badx = b->badx, a->bady = b->bady;
}

/* Buckets twice as wide: each pair merged into one. */
static void widen(kiln_rollup *r) {
    for (size_t i = 0; i < KILN_ROLLUP_BUCKETS / 2; i++) {
        kiln_rollup_bucket m = r->b[2 * i];
        bucket_merge(&m, &r->b[2 * i + 1]);
        r->b[i] = m;
    }
    memset(&r->b[KILN_ROLLUP_BUCKETS / 2], 0, KILN_ROLLUP_BUCKETS / 2 * sizeof r->b[0]);
    r->n = (r->n + 1) / 2;
    r->width *= 2;
}

/* The bucket x falls in, widening until there is one. */
static size_t bucket_at(kiln_rollup *r, double x) {
    while (floor(x / r->width) >= KILN_ROLLUP_BUCKETS)
        widen(r);
    size_t i = (size_t)floor(x / r->width);
    if (i + 1 > r->n) r->n = i + 1;
    return i;
}

void kiln_rollup_push(kiln_rollup *r, double x, double y) {
    if (!(x >= 0)) x = 0;
    size_t i = bucket_at(r, x);
    if (i + 1 > r->n) r->n = i + 1;
    kiln_rollup_bucket one = {x, y, x, y, x, y, isfinite(y), !isfinite(y)};
    bucket_merge(&r->b[i], &one);
    if (isfinite(y)) {
        if (!r->any) r->firstx = x, r->firsty = y;
        r->any = true;
        r->lastx = x, r->lasty = y;
    }
}

void kiln_rollup_span_init(kiln_rollup_span *s, double x0, double width) {
    memset(s, 0, sizeof *s);
    s->x0 = x0;
    s->width = width;
}

void kiln_rollup_span_merge(kiln_rollup_span *a, const kiln_rollup_span *b) {
    if (b->b.finite) {
        if (!a->b.finite) a->firstx = b->firstx, a->firsty = b->firsty;
        a->lastx = b->lastx, a->lasty = b->lasty;
    }
    bucket_merge(&a->b, &b->b);
}

void kiln_rollup_span_push(kiln_rollup_span *s, double x, double y) {
    kiln_rollup_span one = {x, 0, {x, y, x, y, x, y, isfinite(y), !isfinite(y)}, x, y, x, y};
    kiln_rollup_span_merge(s, &one);
}

void kiln_rollup_add(kiln_rollup *r, const kiln_rollup_span *s) {
    while (r->width < s->width)
        widen(r);
    size_t i = bucket_at(r, s->x0 >= 0 ? s->x0 : 0);
    bucket_merge(&r->b[i], &s->b);
    if (s->b.finite) {
        if (!r->any) r->firstx = s->firstx, r->firsty = s->firsty;
        r->any = true;
        r->lastx = s->lastx, r->lasty = s->lasty;
    }
}

size_t kiln_rollup_points(const kiln_rollup *r, double *x, double *y) {
    size_t n = 0;
    for (size_t i = 0; i < r->n; i++) {
        const kiln_rollup_bucket *b = &r->b[i];
        double px[3], py[3];
        int k = 0;
        if (b->finite) {
            px[k] = b->minx, py[k++] = b->miny;
            px[k] = b->maxx, py[k++] = b->maxy;
        }
        if (b->bad) px[k] = b->badx, py[k++] = b->bady;
        for (int a = 1; a < k; a++)
            for (int c = a; c > 0 && px[c] < px[c - 1]; c--) {
                double tx = px[c], ty = py[c];
                px[c] = px[c - 1], py[c] = py[c - 1], px[c - 1] = tx, py[c - 1] = ty;
            }
        for (int a = 0; a < k; a++)
            if (!n || px[a] > x[n - 1]) x[n] = px[a], y[n++] = py[a];
    }
    if (r->any && (!n || r->lastx > x[n - 1])) x[n] = r->lastx, y[n++] = r->lasty;
    /* The first finite point, where it falls (a non-finite step may come before it). */
    if (r->any) {
        size_t at = 0;
        while (at < n && x[at] < r->firstx)
            at++;
        if (at == n || x[at] != r->firstx) {
            memmove(x + at + 1, x + at, (n - at) * sizeof *x);
            memmove(y + at + 1, y + at, (n - at) * sizeof *y);
            x[at] = r->firstx, y[at] = r->firsty;
            n++;
        }
    }
    return n;
}

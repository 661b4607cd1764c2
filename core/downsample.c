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

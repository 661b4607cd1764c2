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

/* Write the open bucket's points in ascending x: at most three. */
static void flush(kiln_downsample *d) {
    if (!d->open) return;
    double px[3], py[3];
    int k = 0;
    if (d->finite) {
        px[k] = d->minx, py[k++] = d->miny;
        if (d->maxx != d->minx) px[k] = d->maxx, py[k++] = d->maxy;
        if (k == 2 && px[1] < px[0]) {
            double tx = px[0], ty = py[0];
            px[0] = px[1], py[0] = py[1], px[1] = tx, py[1] = ty;
        }
    }
    if (d->bad) {
        int at = k;
        while (at > 0 && px[at - 1] > d->badx) {
            px[at] = px[at - 1], py[at] = py[at - 1];
            at--;
        }
        px[at] = d->badx, py[at] = d->bady;
        k++;
    }
    for (int i = 0; i < k; i++)
        emit(d, px[i], py[i]);
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
    if (d->open && b != d->cur) flush(d);
    d->cur = b;
    d->open = true;
    if (!isfinite(y)) {
        if (!d->bad) d->bad = true, d->badx = x, d->bady = y;
        return;
    }
    if (!d->finite) {
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
    flush(d);
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

/* textchart.c - ASCII line charts of series over x (kiln runs plot). Every column of the plot
 * covers an equal range of x; a series draws its mean there with its glyph, over a band of
 * '.' from its minimum to its maximum: downsampling 100000 steps into 64 columns keeps the
 * trend readable and a single-step spike visible, which is what someone reading a loss
 * curve for instability is looking for. Where two series' means share a cell it shows '#'. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runs.h"

#define LABEL_W 11 /* "%11.5g" */

typedef struct span {
    double lo, hi, sum; /* of the usable y (log10 when log_y) in a column's range of x */
    size_t n;
} span;

static bool usable(const kiln_run_chart *c, double y) {
    return isfinite(y) && (!c->log_y || y > 0);
}

static double scale_y(const kiln_run_chart *c, double y) {
    return c->log_y ? log10(y) : y;
}

static double unscale_y(const kiln_run_chart *c, double v) {
    return c->log_y ? pow(10.0, v) : v;
}

static int column(double x, double x0, double x1, int width) {
    if (!(x1 > x0)) return 0;
    double t = (x - x0) / (x1 - x0) * (width - 1);
    int col = (int)floor(t + 0.5);
    return col < 0 ? 0 : col >= width ? width - 1 : col;
}

static int row(double v, double lo, double hi, int height) {
    double t = hi > lo ? (v - lo) / (hi - lo) : 0.5;
    int r = height - 1 - (int)floor(t * (height - 1) + 0.5);
    return r < 0 ? 0 : r >= height ? height - 1 : r;
}

static kiln_err check(const kiln_run_chart *c) {
    if (c->width < 10 || c->width > 1000)
        return kiln_fail(KILN_ERR_USAGE, "chart width %d: must be 10 to 1000 columns", c->width);
    if (c->height < 3 || c->height > 200)
        return kiln_fail(KILN_ERR_USAGE, "chart height %d: must be 3 to 200 rows", c->height);
    if (!c->n_series) return kiln_fail(KILN_ERR_USAGE, "chart: no series to draw");
    for (size_t s = 0; s < c->n_series; s++) {
        const kiln_run_chart_series *se = &c->series[s];
        if (se->glyph <= ' ' || se->glyph > '~' || se->glyph == '#' || se->glyph == '!' ||
            se->glyph == '.')
            return kiln_fail(KILN_ERR_USAGE,
                             "chart: series '%s': glyph must be a printable "
                             "character other than '#', '!' and '.'",
                             se->label);
        for (size_t i = 1; i < se->n; i++)
            if (!(se->x[i] >= se->x[i - 1]))
                return kiln_fail(KILN_ERR_USAGE,
                                 "chart: series '%s': x is not ascending at "
                                 "point %zu",
                                 se->label, i);
    }
    return KILN_OK;
}

/* The legend's line for one series: points, gaps, last, minimum and maximum with their x. */
static void legend(FILE *f, const kiln_run_chart *c, const kiln_run_chart_series *se) {
    const char *xn = c->x_name ? c->x_name : "x";
    size_t gaps = 0, last = SIZE_MAX, lo = SIZE_MAX, hi = SIZE_MAX;
    double first_gap = NAN;
    for (size_t i = 0; i < se->n; i++) {
        if (!usable(c, se->y[i])) {
            if (!gaps++) first_gap = se->x[i];
            continue;
        }
        last = i;
        if (lo == SIZE_MAX || se->y[i] < se->y[lo]) lo = i;
        if (hi == SIZE_MAX || se->y[i] > se->y[hi]) hi = i;
    }
    fprintf(f, "  %c %s: %zu points", se->glyph, se->label, se->n);
    if (last != SIZE_MAX)
        fprintf(f, ", last %.6g (%s %.10g), min %.6g (%s %.10g), max %.6g (%s %.10g)", se->y[last],
                xn, se->x[last], se->y[lo], xn, se->x[lo], se->y[hi], xn, se->x[hi]);
    if (gaps)
        fprintf(f, ", %zu %s (first at %s %.10g)", gaps,
                c->log_y ? "non-finite or not positive" : "non-finite", xn, first_gap);
    fputc('\n', f);
}

kiln_err kiln_run_chart_render(const kiln_run_chart *c, char **out) {
    *out = NULL;
    KILN_TRY(check(c));
    const int W = c->width, H = c->height;
    /* The ranges of x (every point) and of the scaled y (usable points). */
    double x0 = INFINITY, x1 = -INFINITY, lo = INFINITY, hi = -INFINITY;
    for (size_t s = 0; s < c->n_series; s++) {
        const kiln_run_chart_series *se = &c->series[s];
        for (size_t i = 0; i < se->n; i++) {
            x0 = fmin(x0, se->x[i]);
            x1 = fmax(x1, se->x[i]);
            if (!usable(c, se->y[i])) continue;
            lo = fmin(lo, scale_y(c, se->y[i]));
            hi = fmax(hi, scale_y(c, se->y[i]));
        }
    }
    bool any = lo <= hi;
    if (any && hi == lo) { /* a flat series: give it a band to sit in the middle of */
        double pad = fabs(lo) > 0 ? fabs(lo) * 0.05 : 1.0;
        lo -= pad;
        hi += pad;
    }
    char *grid = kiln_malloc((size_t)W * H), *marks = kiln_malloc((size_t)W + 1);
    span *sp = kiln_calloc((size_t)W, sizeof *sp);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !grid || !marks || !sp, KILN_ERR_NOMEM, "out of memory");
    memset(grid, ' ', (size_t)W * H);
    memset(marks, ' ', (size_t)W);
    marks[W] = '\0';
    bool any_mark = false;
    /* Two passes: every series' span as '.', then every series' column mean as its glyph on
     * top, so the curves stay readable over the noise band and a spike still shows. */
    for (int pass = 0; pass < 2; pass++)
        for (size_t s = 0; s < c->n_series; s++) {
            const kiln_run_chart_series *se = &c->series[s];
            for (int k = 0; k < W; k++)
                sp[k] = (span){INFINITY, -INFINITY, 0, 0};
            for (size_t i = 0; i < se->n; i++) {
                int k = column(se->x[i], x0, x1, W);
                if (!usable(c, se->y[i])) {
                    marks[k] = '!';
                    any_mark = true;
                    continue;
                }
                double v = scale_y(c, se->y[i]);
                sp[k].lo = fmin(sp[k].lo, v);
                sp[k].hi = fmax(sp[k].hi, v);
                sp[k].sum += v;
                sp[k].n++;
            }
            for (int k = 0; k < W; k++) {
                if (!sp[k].n) continue;
                if (pass == 0) {
                    for (int r = row(sp[k].hi, lo, hi, H); r <= row(sp[k].lo, lo, hi, H); r++)
                        if (grid[(size_t)r * W + k] == ' ') grid[(size_t)r * W + k] = '.';
                } else {
                    char *cell = &grid[(size_t)row(sp[k].sum / sp[k].n, lo, hi, H) * W + k];
                    *cell = *cell == '.' || *cell == se->glyph ? se->glyph : '#';
                }
            }
        }
    for (size_t m = 0; m < c->n_marks; m++) {
        if (!isfinite(c->marks[m].x) || c->marks[m].x < x0 || c->marks[m].x > x1) continue;
        char *cell = &marks[column(c->marks[m].x, x0, x1, W)];
        if (*cell != '!') *cell = c->marks[m].glyph; /* a gap outranks an event */
        any_mark = true;
    }
    f = open_memstream(&buf, &len);
    KILN_CHECK_IF(rc, out, !f, KILN_ERR_NOMEM, "out of memory");
    if (c->title) fprintf(f, "%s%s\n", c->title, c->log_y ? " (log scale)" : "");
    for (int r = 0; r < H; r++) {
        if (any && (r == 0 || r == H / 2 || r == H - 1))
            fprintf(f, "%*.5g |", LABEL_W, unscale_y(c, hi - (hi - lo) * r / (H - 1)));
        else
            fprintf(f, "%*s |", LABEL_W, "");
        int end = W; /* no trailing blanks */
        while (end > 0 && grid[(size_t)r * W + end - 1] == ' ')
            end--;
        fprintf(f, "%.*s\n", end, grid + (size_t)r * W);
    }
    fprintf(f, "%*s +", LABEL_W, "");
    for (int k = 0; k < W; k++)
        fputc('-', f);
    fputc('\n', f);
    if (x0 <= x1) {
        /* x at the first, middle and last columns: the first left-aligned, the middle
         * centred, the last right-aligned to the axis's end, each only where it fits. */
        char a[32], m[32], z[32], line[1001];
        int la = snprintf(a, sizeof a, "%.10g", x0);
        int lm = snprintf(m, sizeof m, "%.10g", floor(x0 + (x1 - x0) * 0.5 + 0.5));
        int lz = snprintf(z, sizeof z, "%.10g", x1);
        memset(line, ' ', (size_t)W);
        line[W] = '\0';
        memcpy(line, a, (size_t)(la < W ? la : W));
        int at = W / 2 - lm / 2;
        if (x1 > x0 && at > la + 1 && at + lm + 1 < W - lz) memcpy(line + at, m, (size_t)lm);
        if (x1 > x0 && W - lz > la + 1) memcpy(line + W - lz, z, (size_t)lz);
        int end = W;
        while (end > 0 && line[end - 1] == ' ')
            end--;
        fprintf(f, "%*s  %.*s\n", LABEL_W, "", end, line);
    }
    if (any_mark) {
        int end = W;
        while (end > 0 && marks[end - 1] == ' ')
            end--;
        fprintf(f, "%*s  %.*s\n", LABEL_W, "marks", end, marks);
    }
    for (size_t s = 0; s < c->n_series; s++)
        legend(f, c, &c->series[s]);
    if (!any) fprintf(f, "  (no finite values to draw)\n");
    KILN_CHECK_IF(rc, out, ferror(f), KILN_ERR_NOMEM, "out of memory rendering a chart");
out:
    if (f && fclose(f) && !rc) rc = kiln_fail(KILN_ERR_NOMEM, "out of memory rendering a chart");
    if (!rc)
        *out = buf;
    else
        free(buf);
    free(grid);
    free(marks);
    free(sp);
    return rc;
}

/* chart.c - SVG line charts and heat maps (chart.h): axes with nice ticks, a log scale where
 * a metric spans decades, series downsampled to a few points per pixel column with their
 * extremes kept, event and checkpoint marks with hover text, a legend.
 *
 * Markup is string literals and numbers made here; every string handed in goes through
 * kiln_web_text. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "web.h"
#include "web_int.h"

#define lit(b, s) kiln_web_raw((b), "" s, sizeof(s) - 1)

/* Ten colours that tell apart on white (Tableau 10). */
static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define N_PALETTE (sizeof palette / sizeof *palette)

/* Each kind's class, colour and, for the kinds named on the chart, the label drawn. */
static const struct {
    const char *name, *colour, *label;
} mark_kinds[] = {
    [KILN_WEB_MARK_SPIKE] = {"spike", "#d97706", NULL},
    [KILN_WEB_MARK_NONFINITE] = {"nonfinite", "#dc2626", NULL},
    [KILN_WEB_MARK_RESUME] = {"resume", "#2563eb", NULL},
    [KILN_WEB_MARK_DEVICE] = {"device", "#7c3aed", NULL},
    [KILN_WEB_MARK_EVENT] = {"event", "#6b7280", NULL},
    [KILN_WEB_MARK_CKPT] = {"ckpt", "#6b7280", NULL},
    [KILN_WEB_MARK_BEST] = {"best", "#ca8a04", "best ckpt"},
    [KILN_WEB_MARK_EXPORTED] = {"exported", "#0f766e", "exported"},
    [KILN_WEB_MARK_BEST_VAL] = {"best-val", "#15803d", "best val"},
};

/* The label a mark of kind k is named by on the chart, or NULL. */
static const char *mark_label(kiln_web_mark_kind k) {
    return (unsigned)k < KILN_ARRAY_LEN(mark_kinds) ? mark_kinds[k].label : NULL;
}

const char *kiln_web_mark_name(kiln_web_mark_kind k) {
    return (unsigned)k < KILN_ARRAY_LEN(mark_kinds) ? mark_kinds[k].name : "event";
}

static const char *mark_colour(kiln_web_mark_kind k) {
    return (unsigned)k < KILN_ARRAY_LEN(mark_kinds) ? mark_kinds[k].colour : "#6b7280";
}

/* ---- ticks ---- */

/* 1, 2, 5 or 10 times a power of ten near x (Heckbert, "Nice numbers for graph labels"). */
static double nice(double x, bool round) {
    double e = floor(log10(x)), f = x / pow(10, e), n;
    if (round)
        n = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
    else
        n = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
    return n * pow(10, e);
}

size_t kiln_web_nice_ticks(double lo, double hi, int want, double *t, size_t max, double *step) {
    if (!(hi > lo)) {
        double d = lo ? fabs(lo) * 0.1 : 1;
        lo -= d;
        hi += d;
    }
    if (want < 2) want = 2;
    double st = nice(nice(hi - lo, false) / (want - 1), true);
    double first = floor(lo / st) * st, last = ceil(hi / st) * st;
    size_t n = 0;
    /* Counted in steps, not summed, so 0.1 + 0.2 does not drift off the grid. */
    for (long k = 0; n < max; k++) {
        double v = first + (double)k * st;
        if (v > last + st * 1e-9) break;
        t[n++] = fabs(v) < st * 1e-9 ? 0 : v;
    }
    *step = st;
    return n;
}

void kiln_web_tick_label(double v, double step, char out[16]) {
    double a = fabs(v);
    if (v == 0) {
        snprintf(out, 16, "0");
    } else if (a >= 1e3 && a < 1e13 && step >= 1) {
        static const char sfx[] = "kMGT";
        int k = (int)floor(log10(a) / 3);
        if (k > 4) k = 4;
        double s = v / pow(1000, k), ss = step / pow(1000, k);
        int d = ss >= 1 ? 0 : ss >= 0.1 ? 1 : 2;
        char t[16];
        snprintf(t, sizeof t, "%.*f", d, s);
        /* 1.0M reads as 1M; 1.5M stays. */
        if (strchr(t, '.')) {
            size_t n = strlen(t);
            while (t[n - 1] == '0')
                t[--n] = 0;
            if (t[n - 1] == '.') t[--n] = 0;
        }
        snprintf(out, 16, "%s%c", t, sfx[k - 1]);
    } else if (a >= 1e-3 && a < 1e6) {
        int d = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
        if (d > 6) d = 6;
        snprintf(out, 16, "%.*f", d, v);
    } else {
        snprintf(out, 16, "%.2g", v);
    }
}

/* ---- the plot's geometry ---- */

typedef struct axis {
    double lo, hi; /* in data units (log10 of them on a log axis) */
    double p0, p1; /* the pixels they map to */
    bool log;
} axis;

static double at(const axis *a, double v) {
    if (a->log) v = log10(v);
    return a->p0 + (v - a->lo) / (a->hi - a->lo) * (a->p1 - a->p0);
}

#define ML 58 /* left margin: the y tick labels */
#define MR 14
#define MT 8
#define MB 30 /* the x tick labels */

typedef struct frame {
    int w, h;      /* the plot's svg, legend excluded */
    double l, r, t, bot;
} frame;

static frame frame_of(int w, int h) {
    frame f = {w > 120 ? w : KILN_WEB_CHART_WIDTH, h > 80 ? h : KILN_WEB_CHART_HEIGHT, 0, 0, 0, 0};
    f.l = ML;
    f.r = f.w - MR;
    f.t = MT;
    f.bot = f.h - MB;
    return f;
}

static void figure_begin(kiln_web_buf *b, const char *cls, const char *id, const char *title,
                         int w, int h) {
    lit(b, "<figure class=\"");
    kiln_web_text(b, cls);
    lit(b, "\"");
    if (id) {
        lit(b, " id=\"chart-");
        kiln_web_text(b, id);
        lit(b, "\"");
    }
    lit(b, "><figcaption>");
    kiln_web_text(b, title);
    lit(b, "</figcaption>\n<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\"");
    kiln_web_printf(b, " width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\"", w, h, w, h);
    lit(b, " role=\"img\" aria-label=\"");
    kiln_web_text(b, title);
    lit(b, "\">\n");
}

/* The x axis: the line, ticks with labels, the axis name at the right end. */
static void x_axis(kiln_web_buf *b, const frame *f, double lo, double hi, const char *label) {
    double t[16], st;
    size_t n = kiln_web_nice_ticks(lo, hi, 6, t, 16, &st);
    axis ax = {lo, hi, f->l, f->r, false};
    lit(b, "<g class=\"axis x\">");
    kiln_web_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#889\"/>", f->l, f->bot,
        f->r, f->bot);
    for (size_t i = 0; i < n; i++) {
        if (t[i] < lo - st * 1e-9 || t[i] > hi + st * 1e-9) continue;
        double x = at(&ax, t[i]);
        char s[16];
        kiln_web_tick_label(t[i], st, s);
        kiln_web_printf(b,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#889\"/>"
            "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">",
            x, f->bot, x, f->bot + 4, x, f->bot + 16);
        kiln_web_text(b, s);
        lit(b, "</text>");
    }
    kiln_web_printf(b, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", f->r,
        (double)f->h - 2);
    kiln_web_text(b, label ? label : "step");
    lit(b, "</text></g>\n");
}

/* The y axis and its grid; the axis' range is set to the ticks'. */
static void y_axis(kiln_web_buf *b, const frame *f, axis *ay) {
    double t[32], st;
    size_t n;
    lit(b, "<g class=\"axis y\">");
    if (ay->log) {
        double lo = floor(ay->lo), hi = ceil(ay->hi);
        if (hi == lo) hi = lo + 1;
        ay->lo = lo;
        ay->hi = hi;
        /* Decades; every other one when there are many. */
        int every = hi - lo > 8 ? 2 : 1;
        n = 0;
        for (double e = lo; e <= hi + 1e-9 && n < 32; e += every)
            t[n++] = e;
        st = 1;
        (void)st;
    } else {
        n = kiln_web_nice_ticks(ay->lo, ay->hi, 5, t, 32, &st);
        ay->lo = t[0];
        ay->hi = t[n - 1];
    }
    for (size_t i = 0; i < n; i++) {
        double v = ay->log ? pow(10, t[i]) : t[i];
        double y = at(ay, v);
        char s[16];
        if (ay->log)
            snprintf(s, sizeof s, "%g", v);
        else
            kiln_web_tick_label(v, st, s);
        kiln_web_printf(b,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e6e8ef\"/>"
            "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">",
            f->l, y, f->r, y, f->l - 5, y + 4);
        kiln_web_text(b, s);
        lit(b, "</text>");
    }
    kiln_web_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#889\"/>", f->l, f->t,
        f->l, f->bot);
    if (ay->log)
        kiln_web_printf(b, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\">log</text>", f->l + 4, f->t + 10);
    lit(b, "</g>\n");
}

/* The marks on the x axis: a faint line up the plot and a shape on the axis (events) or
 * on the top edge (checkpoints), the text in a <title>. Marks in one pixel column of the
 * same kind are one mark, their texts joined (a thousand checkpoints stay a readable row). */
static void marks(kiln_web_buf *b, const frame *f, double lo, double hi, const kiln_web_mark *m,
                  size_t n) {
    if (!n) return;
    axis ax = {lo, hi, f->l, f->r, false};
    lit(b, "<g class=\"marks\">\n");
    size_t i = 0;
    while (i < n) {
        if (!(m[i].x >= lo && m[i].x <= hi)) {
            i++;
            continue;
        }
        double x = at(&ax, m[i].x);
        /* The run of marks after i of its kind in the same column. */
        size_t j = i + 1, more = 0;
        while (j < n && m[j].kind == m[i].kind && fabs(at(&ax, m[j].x) - x) < 1 &&
               !m[j].href == !m[i].href && !mark_label(m[i].kind)) {
            j++;
            more++;
        }
        const char *c = mark_colour(m[i].kind);
        if (m[i].href) {
            lit(b, "<a href=\"");
            kiln_web_text(b, m[i].href);
            lit(b, "\">");
        }
        lit(b, "<g class=\"mark ");
        kiln_web_text(b, kiln_web_mark_name(m[i].kind));
        lit(b, "\"><title>");
        kiln_web_text_cut(b, m[i].text, KILN_WEB_TEXT_MAX);
        if (more) kiln_web_printf(b, " (and %zu more here)", more);
        lit(b, "</title>");
        const char *label = mark_label(m[i].kind);
        bool named = label != NULL;
        if (named || m[i].kind == KILN_WEB_MARK_CKPT) {
            /* best val a row below the others: it is often the best checkpoint's step */
            double r = named ? 5 : 3.5,
                   y = f->t + 5 + (m[i].kind == KILN_WEB_MARK_BEST_VAL ? 14 : 0);
            kiln_web_printf(b,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                "stroke-opacity=\".35\" stroke-dasharray=\"1 3\"/>"
                "<path d=\"M%.1f %.1fl%.1f %.1fl%.1f %.1fl%.1f %.1fz\" fill=\"%s\"/>",
                x, f->t, x, f->bot, c, x, y - r, r, r, -r, r, -r, -r, c);
            if (named)
                kiln_web_printf(b,
                    "<text class=\"%s\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" "
                    "fill=\"%s\">%s</text>",
                    kiln_web_mark_name(m[i].kind), x + (x > f->r - 60 ? -8 : 8), y + 4,
                    x > f->r - 60 ? "end" : "start", c, label);
        } else {
            kiln_web_printf(b,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                "stroke-opacity=\".55\" stroke-dasharray=\"3 3\"/>"
                "<path d=\"M%.1f %.1fl5 8h-10z\" fill=\"%s\"/>",
                x, f->t, x, f->bot, c, x, f->bot - 8, c);
        }
        lit(b, "</g>");
        if (m[i].href) lit(b, "</a>");
        lit(b, "\n");
        i = j;
    }
    lit(b, "</g>\n");
}

/* The x range of the series and marks. */
static bool x_range(const kiln_web_series *s, size_t ns, const kiln_web_mark *m, size_t nm,
                    double *lo, double *hi) {
    *lo = INFINITY;
    *hi = -INFINITY;
    for (size_t k = 0; k < ns; k++)
        if (s[k].n) {
            if (s[k].x[0] < *lo) *lo = s[k].x[0];
            if (s[k].x[s[k].n - 1] > *hi) *hi = s[k].x[s[k].n - 1];
        }
    for (size_t k = 0; k < nm; k++)
        if (isfinite(m[k].x)) {
            if (m[k].x < *lo) *lo = m[k].x;
            if (m[k].x > *hi) *hi = m[k].x;
        }
    if (!(*hi >= *lo)) return false;
    if (*hi == *lo) *hi = *lo + 1;
    return true;
}

/* The legend below the plot: a swatch and the name of each series, wrapped in rows. */
#define LEGEND_ROW 16
static int legend_rows(const kiln_web_series *s, size_t n, int w) {
    if (n < 2) return 0;
    int rows = 1;
    double x = ML;
    for (size_t k = 0; k < n; k++) {
        double iw = 22 + 6.2 * (double)(s[k].name ? strlen(s[k].name) : 0) + 12;
        if (x + iw > w && x > ML) rows++, x = ML;
        x += iw;
    }
    return rows;
}

static void legend(kiln_web_buf *b, const kiln_web_series *s, size_t n, int w, double y0) {
    if (n < 2) return;
    lit(b, "<g class=\"legend\">");
    double x = ML, y = y0;
    for (size_t k = 0; k < n; k++) {
        double iw = 22 + 6.2 * (double)(s[k].name ? strlen(s[k].name) : 0) + 12;
        if (x + iw > w && x > ML) y += LEGEND_ROW, x = ML;
        kiln_web_printf(b,
            "<g class=\"item\"><rect x=\"%.1f\" y=\"%.1f\" width=\"16\" height=\"4\" "
            "fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">",
            x, y - 4, palette[k % N_PALETTE], x + 20, y);
        kiln_web_text_cut(b, s[k].name, KILN_WEB_TEXT_MAX);
        lit(b, "</text></g>");
        x += iw;
    }
    lit(b, "</g>\n");
}

/* The series' exponential moving average (weight w, debiased: TensorBoard's smoothing) over
 * its finite points in [lo, hi], downsampled as the series is, as a full-strength polyline
 * ("series smoothed") whose <title> says so. */
static void smoothed(kiln_web_buf *b, const kiln_web_series *s, double w, double lo, double hi,
                     size_t buckets, const axis *ax, const axis *ay, bool log, const char *col) {
    double *dx = kiln_malloc(KILN_DOWNSAMPLE_MAX(buckets) * sizeof *dx);
    double *dy = kiln_malloc(KILN_DOWNSAMPLE_MAX(buckets) * sizeof *dy);
    if (!dx || !dy) {
        b->nomem = true;
        free(dx);
        free(dy);
        return;
    }
    kiln_downsample ds;
    kiln_downsample_init(&ds, lo, hi, buckets, dx, dy);
    double last = 0, wn = 1;
    for (size_t i = 0; i < s->n; i++) {
        if (!(s->x[i] >= lo && s->x[i] <= hi) || !isfinite(s->y[i])) continue;
        last = last * w + (1 - w) * s->y[i];
        wn *= w;
        kiln_downsample_push(&ds, s->x[i], last / (1 - wn));
    }
    size_t n = kiln_downsample_end(&ds), drawn = 0;
    kiln_web_printf(b,
                    "<polyline class=\"series smoothed\" fill=\"none\" stroke=\"%s\" "
                    "stroke-width=\"1.6\" stroke-linejoin=\"round\" points=\"",
                    col);
    for (size_t i = 0; i < n; i++)
        if (isfinite(dy[i]) && !(log && dy[i] <= 0))
            kiln_web_printf(b, "%s%.1f,%.1f", drawn++ ? " " : "", at(ax, dx[i]), at(ay, dy[i]));
    lit(b, "\"><title>");
    kiln_web_text(b, s->name);
    kiln_web_printf(b, " (smoothed: moving average, weight %g)</title></polyline>", w);
    free(dx);
    free(dy);
}

/* The last index of s with x < end (s->x ascending), or s->n when none. */
static size_t last_before(const kiln_web_series *s, double end) {
    size_t a = 0, z = s->n;
    while (a < z) {
        size_t m = a + (z - a) / 2;
        if (s->x[m] < end)
            a = m + 1;
        else
            z = m;
    }
    return a ? a - 1 : s->n;
}

/* The hover columns (kiln_web_chart.hover_cols): under the marks, over the series. */
static void hover(kiln_web_buf *b, const kiln_web_chart *c, const frame *f, double lo, double hi) {
    const int n = c->hover_cols > 200 ? 200 : c->hover_cols;
    const double w = (f->r - f->l) / n, span = (hi - lo) / n;
    lit(b, "<g class=\"hover\">");
    for (int k = 0; k < n; k++) {
        double a = lo + span * k, z = k == n - 1 ? hi + 1 : lo + span * (k + 1);
        kiln_web_printf(b,
                        "<rect class=\"hover\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                        "height=\"%.1f\" fill=\"#000\" fill-opacity=\"0\"><title>steps %.0f to "
                        "%.0f",
                        f->l + w * k, f->t, w, f->bot - f->t, ceil(a), ceil(z) - 1);
        for (size_t s = 0; s < c->n_series; s++) {
            const kiln_web_series *se = &c->series[s];
            size_t i = last_before(se, z);
            if (i == se->n || se->x[i] < a) continue;
            lit(b, "\n");
            kiln_web_text(b, se->name);
            kiln_web_printf(b, ": %.6g at step %.0f", se->y[i], se->x[i]);
        }
        lit(b, "</title></rect>");
    }
    lit(b, "</g>\n");
}

void kiln_web_chart_svg(kiln_web_buf *b, const kiln_web_chart *c) {
    frame f = frame_of(c->width, c->height);
    int lrows = legend_rows(c->series, c->n_series, f.w);
    int total_h = f.h + (lrows ? lrows * LEGEND_ROW + 4 : 0);
    figure_begin(b, "chart", c->id, c->title, f.w, total_h);

    double lo = c->x_lo, hi = c->x_hi;
    bool any_x = lo || hi ? hi > lo : x_range(c->series, c->n_series, c->marks, c->n_marks, &lo, &hi);
    /* The y range over finite points (positive ones for a log axis). */
    double ymin = INFINITY, ymax = -INFINITY, pmin = INFINITY;
    size_t finite = 0;
    for (size_t k = 0; k < c->n_series; k++)
        for (size_t i = 0; i < c->series[k].n; i++) {
            double v = c->series[k].y[i], x = c->series[k].x[i];
            if (!isfinite(v) || x < lo || x > hi) continue;
            finite++;
            if (v < ymin) ymin = v;
            if (v > ymax) ymax = v;
            if (v > 0 && v < pmin) pmin = v;
        }
    bool log = c->scale == KILN_WEB_SCALE_LOG
                   ? pmin < INFINITY
                   : c->scale == KILN_WEB_SCALE_AUTO && finite && ymin > 0 && ymax / ymin >= 100;
    if (!any_x) lo = 0, hi = 1;
    x_axis(b, &f, lo, hi, c->x_label);
    axis ay = {finite ? (log ? log10(pmin) : ymin) : 0, finite ? (log ? log10(ymax) : ymax) : 1,
               f.bot, f.t, log};
    y_axis(b, &f, &ay);
    if (!finite)
        kiln_web_printf(b,
            "<text class=\"empty\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">no finite value "
            "logged</text>\n",
            (f.l + f.r) / 2, (f.t + f.bot) / 2);

    axis ax = {lo, hi, f.l, f.r, false};
    size_t buckets = (size_t)((f.r - f.l) / 2);
    double *dx = kiln_malloc(KILN_DOWNSAMPLE_MAX(buckets) * sizeof *dx);
    double *dy = kiln_malloc(KILN_DOWNSAMPLE_MAX(buckets) * sizeof *dy);
    if (!dx || !dy) {
        b->nomem = true;
        free(dx);
        free(dy);
        return;
    }
    const bool smooth = c->smooth > 0 && c->smooth < 1;
    for (size_t k = 0; k < c->n_series && finite; k++) {
        const kiln_web_series *s = &c->series[k];
        kiln_downsample ds;
        kiln_downsample_init(&ds, lo, hi, buckets, dx, dy);
        for (size_t i = 0; i < s->n; i++)
            if (s->x[i] >= lo && s->x[i] <= hi) kiln_downsample_push(&ds, s->x[i], s->y[i]);
        size_t n = kiln_downsample_end(&ds);
        const char *col = palette[k % N_PALETTE];
        lit(b, "<g class=\"series\" data-name=\"");
        kiln_web_text_cut(b, s->name, KILN_WEB_TEXT_MAX);
        kiln_web_printf(b, "\" data-points=\"%zu\">", s->n);
        kiln_web_printf(b, "<polyline class=\"series%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.4\" "
               "stroke-linejoin=\"round\"%s points=\"", smooth ? " raw" : "", col,
               smooth ? " stroke-opacity=\".25\"" : "");
        size_t drawn = 0, bad = 0;
        for (size_t i = 0; i < n; i++) {
            if (!isfinite(dy[i])) {
                bad++;
                continue;
            }
            if (log && dy[i] <= 0) continue;
            kiln_web_printf(b, "%s%.1f,%.1f", drawn++ ? " " : "", at(&ax, dx[i]), at(&ay, dy[i]));
        }
        lit(b, "\"><title>");
        kiln_web_text_cut(b, s->name, KILN_WEB_TEXT_MAX);
        lit(b, "</title></polyline>");
        /* over the faint raw line */
        if (smooth) smoothed(b, s, c->smooth, lo, hi, buckets, &ax, &ay, log, col);
        /* A single point would draw nothing: a dot. */
        for (size_t i = 0; i < n && drawn == 1; i++)
            if (isfinite(dy[i]) && !(log && dy[i] <= 0))
                kiln_web_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2\" fill=\"%s\"/>", at(&ax, dx[i]),
                    at(&ay, dy[i]), col);
        /* Non-finite points: a cross near the top edge, never a line to nowhere. */
        for (size_t i = 0; i < n && bad; i++) {
            if (isfinite(dy[i])) continue;
            double x = at(&ax, dx[i]), y = f.t + 14;
            lit(b, "<g class=\"mark nonfinite-point\"><title>");
            kiln_web_text_cut(b, s->name, KILN_WEB_TEXT_MAX);
            kiln_web_printf(b, ": step %.0f: %s</title>", dx[i],
                isnan(dy[i]) ? "not a number" : dy[i] > 0 ? "+infinity" : "-infinity");
            kiln_web_printf(b,
                "<path d=\"M%.1f %.1fl6 6m0 -6l-6 6\" stroke=\"#dc2626\" "
                "stroke-width=\"1.6\"/></g>",
                x - 3, y - 3);
        }
        lit(b, "</g>\n");
    }
    free(dx);
    free(dy);
    if (finite && c->hover_cols > 0) hover(b, c, &f, lo, hi);
    marks(b, &f, lo, hi, c->marks, c->n_marks);
    legend(b, c->series, c->n_series, f.w, f.h + LEGEND_ROW - 4);
    lit(b, "</svg></figure>\n");
}

/* ---- heat maps ---- */

/* White to a deep blue over [0, 1]. */
static void heat_colour(double t, char out[8]) {
    if (!(t >= 0)) t = 0;
    if (t > 1) t = 1;
    int r = (int)(247 - t * (247 - 8)), g = (int)(251 - t * (251 - 48)),
        bl = (int)(255 - t * (255 - 107));
    snprintf(out, 8, "#%02x%02x%02x", r, g, bl);
}

#define HEAT_COLS 80

void kiln_web_heatmap_svg(kiln_web_buf *b, const kiln_web_heatmap *h) {
    frame f = frame_of(h->width, h->height);
    figure_begin(b, "chart heatmap", h->id, h->title, f.w, f.h + 22);
    double lo, hi;
    bool any = x_range(h->rows, h->n_rows, h->marks, h->n_marks, &lo, &hi);
    if (!any) lo = 0, hi = 1;
    x_axis(b, &f, lo, hi, NULL);
    size_t R = h->n_rows ? h->n_rows : 1;
    double *cell = kiln_calloc(R * HEAT_COLS, sizeof *cell);
    if (!cell) {
        b->nomem = true;
        return;
    }
    for (size_t i = 0; i < R * HEAT_COLS; i++)
        cell[i] = NAN;
    double vmax = 0;
    for (size_t r = 0; r < h->n_rows; r++)
        for (size_t i = 0; i < h->rows[r].n; i++) {
            double v = h->rows[r].y[i], x = h->rows[r].x[i];
            if (!isfinite(v)) continue;
            size_t col = (size_t)((x - lo) / (hi - lo) * HEAT_COLS);
            if (col >= HEAT_COLS) col = HEAT_COLS - 1;
            double *c = &cell[r * HEAT_COLS + col];
            if (isnan(*c) || v > *c) *c = v;
            if (v > vmax) vmax = v;
        }
    /* The rows, top to bottom; their names on the left. */
    double rh = (f.bot - f.t) / (double)R, cw = (f.r - f.l) / HEAT_COLS;
    lit(b, "<g class=\"cells\">");
    for (size_t r = 0; r < h->n_rows; r++) {
        double y = f.t + rh * (double)r;
        kiln_web_printf(b, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", f.l - 5,
            y + rh / 2 + 4);
        /* "expert 3" under the axis label "expert" is "3": the full name ran into the
         * label (issue 30); the cells' titles keep it whole. */
        const char *tick = h->rows[r].name;
        size_t pl = h->row_label ? strlen(h->row_label) : 0;
        if (pl && !strncmp(tick, h->row_label, pl) && tick[pl] == ' ' && tick[pl + 1])
            tick += pl + 1;
        kiln_web_text_cut(b, tick, KILN_WEB_TEXT_MAX);
        lit(b, "</text>");
        for (size_t col = 0; col < HEAT_COLS; col++) {
            double v = cell[r * HEAT_COLS + col];
            if (isnan(v)) continue;
            char fill[8];
            heat_colour(vmax > 0 ? v / vmax : 0, fill);
            double s0 = lo + (hi - lo) * (double)col / HEAT_COLS,
                   s1 = lo + (hi - lo) * (double)(col + 1) / HEAT_COLS;
            kiln_web_printf(b,
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\">"
                "<title>",
                f.l + cw * (double)col, y, cw + 0.2, rh + 0.2, fill);
            kiln_web_text_cut(b, h->rows[r].name, KILN_WEB_TEXT_MAX);
            kiln_web_printf(b, ", steps %.0f-%.0f: max %.3g</title></rect>", ceil(s0), floor(s1), v);
        }
    }
    lit(b, "</g>\n");
    if (h->row_label) {
        kiln_web_printf(b,
            "<text class=\"label\" x=\"12\" y=\"%.1f\" transform=\"rotate(-90 12 %.1f)\" "
            "text-anchor=\"middle\">",
            (f.t + f.bot) / 2, (f.t + f.bot) / 2);
        kiln_web_text(b, h->row_label);
        lit(b, "</text>\n");
    }
    free(cell);
    marks(b, &f, lo, hi, h->marks, h->n_marks);
    /* The colour scale: 0 to the largest value. */
    lit(b, "<g class=\"scale\">");
    for (int k = 0; k < 10; k++) {
        char fill[8];
        heat_colour(k / 9.0, fill);
        kiln_web_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"8\" fill=\"%s\"/>",
            f.l + 12.0 * k, (double)f.h + 8, fill);
    }
    kiln_web_printf(b, "<text x=\"%.1f\" y=\"%.1f\">0 to %.3g</text></g>\n", f.l + 126, (double)f.h + 16,
        vmax);
    lit(b, "</svg></figure>\n");
}

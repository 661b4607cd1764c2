/* test_web_chart.c - web/'s SVG charts on their own: the downsampling that keeps extremes,
 * nice ticks and their labels, and the markup of a chart (axes, ranges, series, marks,
 * non-finite points, the legend, a log axis) and of a heat map, with hostile names escaped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "test.h"
#include "testutil.h"
#include "web.h"

#define HOSTILE "<script>alert(1)</script>&\"'"
#define HOSTILE_ESCAPED "&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;&#39;"

static char *render(const kiln_web_chart *c) {
    kiln_web_buf b = {0};
    kiln_web_chart_svg(&b, c);
    size_t len;
    return kiln_web_buf_take(&b, &len);
}

KILN_TEST(web_chart_downsample) {
    enum { N = 1000000, B = 100 };
    double *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    double ox[KILN_DOWNSAMPLE_MAX(B)], oy[KILN_DOWNSAMPLE_MAX(B)];
    if (!CHECK("alloc", x && y)) return;
    for (size_t i = 0; i < N; i++) {
        x[i] = (double)(i + 1);
        y[i] = 1.0 + 0.01 * sin((double)i * 0.001);
    }
    y[123456] = 50;      /* a one-step spike */
    y[654321] = -7;      /* a one-step dip */
    y[777777] = NAN;     /* a non-finite step */
    y[888888] = INFINITY;
    size_t n = kiln_downsample_array(x, y, N, B, ox, oy);
    CHECK("at most 3 points a bucket", n <= KILN_DOWNSAMPLE_MAX(B) && n >= 2 * B - 2);
    bool spike = false, dip = false, nan = false, inf = false, ascending = true;
    for (size_t i = 0; i < n; i++) {
        if (ox[i] == 123457 && oy[i] == 50) spike = true;
        if (ox[i] == 654322 && oy[i] == -7) dip = true;
        if (ox[i] == 777778 && isnan(oy[i])) nan = true;
        if (ox[i] == 888889 && isinf(oy[i])) inf = true;
        if (i && ox[i] < ox[i - 1]) ascending = false;
    }
    CHECK("the spike is kept at its step", spike);
    CHECK("the dip is kept at its step", dip);
    CHECK("a NaN is kept as NaN", nan);
    CHECK("an infinity is kept as itself", inf);
    CHECK("points stay in x order", ascending);
    /* The rollup kiln runs serve keeps: the same extremes, at any length, read in pieces. */
    kiln_rollup *r = malloc(sizeof *r);
    double *rx = malloc(KILN_ROLLUP_MAX * sizeof *rx), *ry = malloc(KILN_ROLLUP_MAX * sizeof *ry);
    if (!CHECK("alloc", r && rx && ry)) return;
    kiln_rollup_init(r);
    for (size_t i = 0; i < N; i++)
        kiln_rollup_push(r, x[i], y[i]);
    size_t rn = kiln_rollup_points(r, rx, ry);
    bool rspike = false, rnan = false, rinc = true;
    for (size_t i = 0; i < rn; i++) {
        if (rx[i] == 123457 && ry[i] == 50) rspike = true;
        if (rx[i] == 777778 && isnan(ry[i])) rnan = true;
        if (i && rx[i] <= rx[i - 1]) rinc = false;
    }
    CHECK("rollup: buckets doubled to fit a million steps", r->width == 512 && rn <= KILN_ROLLUP_MAX);
    CHECK("rollup: the spike and the NaN kept, x increasing", rspike && rnan && rinc);
    CHECK("rollup: the first and last points kept", rx[0] == 1 && rx[rn - 1] == N);
    free(r);
    free(rx);
    free(ry);
    /* A short series passes whole. */
    double sx[3] = {1, 2, 3}, sy[3] = {5, 6, 7};
    CHECK("fewer points than buckets pass unchanged",
          kiln_downsample_array(sx, sy, 3, B, ox, oy) == 3 && ox[1] == 2 && oy[2] == 7);
    free(x);
    free(y);
}

KILN_TEST(web_chart_ticks) {
    double t[16], st;
    size_t n = kiln_web_nice_ticks(0.13, 0.97, 5, t, 16, &st);
    CHECK("ticks cover the range", n >= 2 && t[0] <= 0.13 && t[n - 1] >= 0.97);
    CHECK("steps are 1, 2 or 5 times a power of ten", fabs(st - 0.2) < 1e-12);
    CHECK("ticks land on the grid", fabs(t[1] - 0.2) < 1e-12);
    n = kiln_web_nice_ticks(1, 1000000, 6, t, 16, &st);
    CHECK("a million steps in 200k steps", st == 200000 && t[0] == 0 && t[n - 1] == 1000000);
    char s[16];
    kiln_web_tick_label(1000000, 200000, s);
    CHECK("1M", !strcmp(s, "1M"));
    kiln_web_tick_label(250000, 50000, s);
    CHECK("250k", !strcmp(s, "250k"));
    kiln_web_tick_label(1500000, 500000, s);
    CHECK("1.5M", !strcmp(s, "1.5M"));
    kiln_web_tick_label(0.4, 0.2, s);
    CHECK("0.4", !strcmp(s, "0.4"));
    kiln_web_tick_label(0.002, 0.001, s);
    CHECK("0.002", !strcmp(s, "0.002"));
    n = kiln_web_nice_ticks(5, 5, 5, t, 16, &st);
    CHECK("a flat series still has an axis", n >= 2 && t[0] < 5 && t[n - 1] > 5);
}

KILN_TEST(web_chart_svg) {
    enum { N = 5000 };
    double x[N], loss[N], other[N];
    for (int i = 0; i < N; i++) {
        x[i] = i + 1;
        loss[i] = 2.0 * exp(-(double)i / 600) + 0.001; /* spans three decades */
        other[i] = 0.5;
    }
    loss[2500] = 40;  /* a spike */
    loss[3000] = NAN; /* a non-finite step */
    kiln_web_series s[2] = {{"loss", x, loss, N}, {HOSTILE, x, other, N}};
    kiln_web_mark m[5] = {{2501, KILN_WEB_MARK_SPIKE, "step 2501: " HOSTILE, "/explain?s=2501"},
                          {3001, KILN_WEB_MARK_NONFINITE, "step 3001: nonfinite", NULL},
                          {4000, KILN_WEB_MARK_RESUME, "resumed at 4000", NULL},
                          {4500, KILN_WEB_MARK_BEST, "best checkpoint: step 4500", NULL},
                          {4500, KILN_WEB_MARK_BEST_VAL, "best validation: step 4500", NULL}};
    kiln_web_chart c = {.id = "loss", .title = "Loss " HOSTILE, .series = s, .n_series = 2,
                        .marks = m, .n_marks = 5};
    char *svg = render(&c);
    if (!CHECK("renders", svg)) return;
    CHECK("one figure and one svg",
          kiln_test_count(svg, "<figure class=\"chart\" id=\"chart-loss\">") == 1 &&
              kiln_test_count(svg, "<svg class=\"chart\"") == 1);
    CHECK("both axes", strstr(svg, "<g class=\"axis x\">") && strstr(svg, "<g class=\"axis y\">"));
    CHECK("x ticks 1k to 5k", strstr(svg, ">1k</text>") && strstr(svg, ">5k</text>"));
    CHECK("a log axis for a loss over decades", strstr(svg, ">log</text>") &&
                                                    strstr(svg, ">0.001</text>") &&
                                                    strstr(svg, ">100</text>"));
    CHECK("two series, one polyline each", kiln_test_count(svg, "<polyline class=\"series\"") == 2);
    CHECK("a colour each", strstr(svg, "stroke=\"#1f77b4\"") && strstr(svg, "stroke=\"#ff7f0e\""));
    CHECK("a legend", strstr(svg, "<g class=\"legend\">"));
    CHECK("the spike's mark links to its explanation",
          strstr(svg, "<a href=\"/explain?s=2501\"><g class=\"mark spike\"><title>step 2501: "));
    CHECK("the non-finite, resume and best marks",
          strstr(svg, "<g class=\"mark nonfinite\">") && strstr(svg, "<g class=\"mark resume\">") &&
              strstr(svg, "<g class=\"mark best\">") && strstr(svg, ">best ckpt</text>"));
    CHECK("the best validation named too, a row below the best checkpoint at the same step",
          strstr(svg, "<g class=\"mark best-val\"><title>best validation: step 4500</title>") &&
              strstr(svg, ">best val</text>"));
    CHECK("each mark whole: its line and its shape",
          strstr(svg, "l5 8h-10z\" fill=\"#dc2626\"/></g>") &&
              strstr(svg, "l5 8h-10z\" fill=\"#2563eb\"/></g>"));
    CHECK("the NaN point is a mark, not a line",
          kiln_test_count(
              svg, "<g class=\"mark nonfinite-point\"><title>loss: step 3001: not a number") == 1);
    CHECK("nothing hostile unescaped", !strstr(svg, "<script") && strstr(svg, HOSTILE_ESCAPED));
    CHECK("the spike survives downsampling: the log axis reaches 100",
          strstr(svg, "data-points=\"5000\""));
    /* The spike's point is the plot's top: its y is the smallest in the loss polyline. */
    const char *pl = strstr(svg, " points=\"");
    double top = 1e9;
    for (const char *p = pl + 9; *p && *p != '"';) {
        double px, py;
        int used;
        if (sscanf(p, "%lf,%lf%n", &px, &py, &used) != 2) break;
        if (py < top) top = py;
        p += used;
        while (*p == ' ')
            p++;
    }
    CHECK("the spike is drawn at 40 on the log axis (above 10, below 100)", top > 8 && top < 60);
    free(svg);

    /* A linear chart of values in [0.13, 0.97]: its axis spans nice ticks around them. */
    double lin[N];
    for (int i = 0; i < N; i++)
        lin[i] = 0.13 + 0.84 * i / (N - 1);
    kiln_web_series one = {"val_r2", x, lin, N};
    kiln_web_chart c2 = {.title = "R2", .series = &one, .n_series = 1};
    svg = render(&c2);
    CHECK("linear: no log, ticks 0 to 1", svg && !strstr(svg, ">log</text>") &&
                                              strstr(svg, ">0</text>") && strstr(svg, ">1.0</text>"));
    CHECK("one series: no legend", svg && !strstr(svg, "class=\"legend\""));
    free(svg);

    /* Nothing finite. */
    double nan1[1] = {NAN};
    kiln_web_series none = {"loss", x, nan1, 1};
    kiln_web_chart c3 = {.title = "empty", .series = &none, .n_series = 1};
    svg = render(&c3);
    CHECK("a chart without a finite point says so", svg && strstr(svg, "no finite value"));
    free(svg);
}

KILN_TEST(web_chart_heatmap) {
    enum { N = 1000, E = 4 };
    double x[N], y[E][N];
    for (int i = 0; i < N; i++) {
        x[i] = i + 1;
        for (int e = 0; e < E; e++)
            y[e][i] = 0.25;
    }
    y[2][500] = 0.9; /* one overloaded step */
    kiln_web_series rows[E] = {{"expert 0", x, y[0], N},
                               {"expert 1", x, y[1], N},
                               {HOSTILE, x, y[2], N},
                               {"expert 3", x, y[3], N}};
    kiln_web_heatmap h = {.id = "load-0", .title = "expert load", .row_label = "expert",
                          .rows = rows, .n_rows = E};
    kiln_web_buf b = {0};
    kiln_web_heatmap_svg(&b, &h);
    size_t len;
    char *svg = kiln_web_buf_take(&b, &len);
    if (!CHECK("renders", svg)) return;
    CHECK("a heat map figure", strstr(svg, "class=\"chart heatmap\" id=\"chart-load-0\""));
    CHECK("80 cells a row", kiln_test_count(svg, "<rect x=") == E * 80 + 10);
    CHECK("the overloaded step's cell keeps its maximum", strstr(svg, ": max 0.9</title>"));
    CHECK("the darkest cell is that one", kiln_test_count(svg, "fill=\"#08306b\"><title>") == 1);
    CHECK("names escaped", !strstr(svg, "<script") && strstr(svg, HOSTILE_ESCAPED));
    CHECK("a row's tick is its number under the axis label, its cells' titles the whole name "
          "(issue 30: 'expert 3' ran into the label)",
          strstr(svg, "text-anchor=\"end\">3</text>") && !strstr(svg, "\">expert 3</text>") &&
              strstr(svg, "<title>expert 3"));
    free(svg);
}

/* Overlays smoothed as TensorBoard smooths (issue 30): each series faint as it is and its
 * debiased moving average over it. */
KILN_TEST(web_chart_smoothed) {
    enum { N = 400 };
    double x[N], noisy[N], flat[N];
    for (int i = 0; i < N; i++) {
        x[i] = i + 1;
        noisy[i] = 1.0 + (i % 2 ? 0.5 : -0.5); /* a saw: raw spans [0.5, 1.5] */
        flat[i] = 0.25;
    }
    kiln_web_series s[2] = {{"noisy", x, noisy, N}, {"flat", x, flat, N}};
    kiln_web_chart c = {.id = "ov", .title = "overlay", .series = s, .n_series = 2,
                        .scale = KILN_WEB_SCALE_LINEAR, .smooth = 0.9};
    char *svg = render(&c);
    if (!CHECK("renders", svg)) return;
    CHECK("a faint raw line and a smoothed one per series",
          kiln_test_count(svg, "<polyline class=\"series raw\"") == 2 &&
              kiln_test_count(svg, "stroke-opacity=\".25\"") == 2 &&
              kiln_test_count(svg, "<polyline class=\"series smoothed\"") == 2);
    CHECK("the smoothed line says so",
          strstr(svg, "<title>noisy (smoothed: moving average, weight 0.9)</title>"));
    free(svg);
    c.smooth = 0;
    svg = render(&c);
    CHECK("smooth 0: as before, one line each",
          svg && kiln_test_count(svg, "<polyline class=\"series\"") == 2 &&
              !strstr(svg, "smoothed"));
    free(svg);
}

/* Values on hover without JavaScript (issue 30): columns of transparent rects, each titled with
 * its steps and every series' last value in it. */
KILN_TEST(web_chart_hover) {
    double x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, a[8] = {1, 2, 3, 4, 5, 6, 7, 8},
           c2[4] = {10, 20, 30, 40}, x2[4] = {1, 2, 3, 4};
    kiln_web_series s[2] = {{"a", x, a, 8}, {"b", x2, c2, 4}};
    kiln_web_chart c = {.id = "h", .title = "hover", .series = s, .n_series = 2,
                        .scale = KILN_WEB_SCALE_LINEAR, .x_lo = 1, .x_hi = 9, .hover_cols = 2};
    char *svg = render(&c);
    if (!CHECK("renders", svg)) return;
    CHECK("two columns", kiln_test_count(svg, "<rect class=\"hover\"") == 2);
    CHECK("the first column: steps 1 to 4, both series' last values there",
          strstr(svg, "<title>steps 1 to 4\na: 4 at step 4\nb: 40 at step 4</title>"));
    CHECK("the second: b has nothing there",
          strstr(svg, "<title>steps 5 to 9\na: 8 at step 8</title>"));
    free(svg);
}

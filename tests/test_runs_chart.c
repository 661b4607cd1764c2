/* test_runs_chart.c - the ASCII charts of kiln runs plot (runs/textchart.c): a one-step spike
 * survives any downsampling, gaps and marks are drawn, bad charts are refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runs.h"
#include "test.h"

static bool has(const char *s) {
    return strstr(kiln_errmsg(), s) != NULL;
}

/* Line i (0-based) of text into out (without its newline); false when there is none. */
static bool chart_line(const char *text, int i, char *out, size_t cap) {
    for (; i > 0 && text; i--) {
        text = strchr(text, '\n');
        if (text) text++;
    }
    if (!text || !*text) return false;
    size_t n = strcspn(text, "\n");
    if (n >= cap) n = cap - 1;
    memcpy(out, text, n);
    out[n] = '\0';
    return true;
}

/* The plot cell of row r (0 = top) and column k: titles take line 0, the label and " |" the
 * first 13 characters. */
static char chart_cell(const char *text, int r, int k) {
    char line[1200];
    if (!chart_line(text, 1 + r, line, sizeof line)) return '\0';
    return strlen(line) > (size_t)(13 + k) ? line[13 + k] : ' ';
}

KILN_TEST(runs_chart_spike_survives) {
    /* 10000 flat points and one spike, in 50 columns: the spike's band reaches the top row
     * in its column and nowhere else, and the legend says where the maximum is. */
    enum { N = 10000 };
    double *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    if (!CHECK("alloc", x && y)) goto out;
    for (int i = 0; i < N; i++)
        x[i] = i + 1, y[i] = 1.0;
    y[5000] = 100.0;
    kiln_run_chart_series s = {"loss", x, y, N, '*'};
    kiln_run_chart c = {"loss", &s, 1, NULL, 0, "step", 50, 10, false};
    char *text = NULL;
    if (!CHECK("render", kiln_run_chart_render(&c, &text) == KILN_OK)) goto out;
    int col = (int)floor((5001.0 - 1) / (N - 1) * 49 + 0.5), top = 0;
    for (int k = 0; k < 50; k++)
        top += chart_cell(text, 0, k) != ' ';
    CHECK("the spike reaches the top row, in its column only",
          top == 1 && chart_cell(text, 0, col) == '.');
    CHECK("the flat points sit on the bottom row",
          chart_cell(text, 9, 0) == '*' && chart_cell(text, 9, 49) == '*');
    CHECK("the spike's column mean is drawn below the top",
          chart_cell(text, 9, col) == '.' || chart_cell(text, 9, col) == '*');
    CHECK("legend", strstr(text, "* loss: 10000 points, last 1 (step 10000), min 1 (step 1), "
                                 "max 100 (step 5001)") != NULL);
    CHECK("y labels", strstr(text, "        100 |") && strstr(text, "          1 |"));
    free(text);
out:
    free(x), free(y);
}

KILN_TEST(runs_chart_series_gaps_marks) {
    double x[20], y[20], z[20];
    for (int i = 0; i < 20; i++)
        x[i] = i, y[i] = i, z[i] = i;
    z[10] = NAN;
    kiln_run_chart_series s[2] = {{"a", x, y, 20, '*'}, {"b", x, z, 20, 'o'}};
    kiln_run_chart_mark m[1] = {{15, 'R'}};
    kiln_run_chart c = {"two", s, 2, m, 1, "step", 20, 20, false};
    char *text = NULL, line[200];
    if (!CHECK("render", kiln_run_chart_render(&c, &text) == KILN_OK)) return;
    /* y = x on a 20 x 20 grid: one point per cell on the diagonal, both series on it. */
    int diag = 0;
    for (int k = 0; k < 20; k++)
        diag += chart_cell(text, 19 - k, k) == (k == 10 ? '*' : '#');
    CHECK("both series on the diagonal, '#' where both are, '*' where b has a gap", diag == 20);
    CHECK("x axis labels", chart_line(text, 22, line, sizeof line) && strstr(line, " 0 ") &&
                               strstr(line, "19") && strstr(line, "10"));
    CHECK("marks line: the gap and the event", chart_line(text, 23, line, sizeof line) &&
                                                   !strncmp(line, "      marks  ", 13) &&
                                                   line[13 + 10] == '!' && line[13 + 15] == 'R');
    CHECK("gap in b's legend",
          strstr(text, "o b: 20 points") && strstr(text, "1 non-finite (first at step 10)"));
    free(text);
    /* Log scale: 1 .. 10000 puts 100 on the middle row. */
    double ly[5] = {1, 10, 100, 1000, 10000}, lx[5] = {1, 2, 3, 4, 5};
    kiln_run_chart_series ls = {"g", lx, ly, 5, '+'};
    kiln_run_chart lc = {"g", &ls, 1, NULL, 0, "step", 10, 5, true};
    if (CHECK("log render", kiln_run_chart_render(&lc, &text) == KILN_OK)) {
        CHECK("decades on rows", strstr(text, "g (log scale)\n") && strstr(text, "        100 |") &&
                                     chart_cell(text, 2, 5) == '+');
        free(text);
    }
}

KILN_TEST(runs_chart_refusals) {
    double x[3] = {1, 3, 2}, y[3] = {1, 2, 3};
    kiln_run_chart_series s = {"loss", x, y, 2, '*'};
    kiln_run_chart c = {"t", &s, 1, NULL, 0, "step", 5, 10, false};
    char *text = (char *)"untouched";
    CHECK("narrow", kiln_run_chart_render(&c, &text) == KILN_ERR_USAGE && has("width 5") && !text);
    c.width = 20;
    c.height = 2;
    CHECK("short", kiln_run_chart_render(&c, &text) == KILN_ERR_USAGE && has("height 2"));
    c.height = 5;
    s.n = 3;
    CHECK("x not ascending", kiln_run_chart_render(&c, &text) == KILN_ERR_USAGE && has("'loss'") &&
                                 has("not ascending at point 2"));
    s.n = 2;
    s.glyph = '#';
    CHECK("reserved glyph", kiln_run_chart_render(&c, &text) == KILN_ERR_USAGE && has("glyph"));
    s.glyph = '*';
    for (long k = 1; k <= 4; k++) {
        kiln_alloc_fail_after(k);
        kiln_err rc = kiln_run_chart_render(&c, &text);
        kiln_alloc_fail_after(0);
        if (rc == KILN_OK) {
            free(text);
            break;
        }
        CHECK("allocation failures are reported", rc == KILN_ERR_NOMEM && !text);
    }
}

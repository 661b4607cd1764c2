/* runs_pages.c - the pages of kiln runs serve around the charts (chart.h): the sweep's table with
 * its overlay form, a run's config, its events. Data is handed in as plain values; every
 * string goes through kiln_web_text. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "web.h"
#include "web_int.h"

#define lit(b, s) kiln_web_raw((b), "" s, sizeof(s) - 1)

/* Every string from a run, cut to KILN_WEB_TEXT_MAX bytes with a marker: a run's files are
 * not the server's, and one 2 MiB event message repeated in every chart's marks made a page
 * of hundreds of MiB. */
static void txt(kiln_web_buf *b, const char *s) {
    kiln_web_text_cut(b, s, KILN_WEB_TEXT_MAX);
}

/* Here rather than in run_page.c, which uses this file's tables: the sweep, overlay and explain
 * pages need them too, and the two files must not use each other (tests/filecycles.sh). */
const kiln_web_series *kiln_web_series_find(const kiln_web_series *s, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (s[i].name && !strcmp(s[i].name, name)) return &s[i];
    return NULL;
}

char *kiln_web_run_href(const char *page, const char *name, long step) {
    kiln_web_buf b = {0};
    kiln_web_printf(&b, "/%s?r=", page);
    kiln_web_pct(&b, name, NULL);
    if (step >= 1) kiln_web_printf(&b, "&step=%ld", step);
    size_t len;
    return kiln_web_buf_take(&b, &len);
}

void kiln_web_runs_begin(kiln_web_buf *b, const char *title) {
    lit(b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
           "<meta name=\"viewport\" content=\"width=device-width\"><title>");
    txt(b, title);
    lit(b, " - kiln runs</title><style>");
    const char *css = kiln_web_stylesheet();
    kiln_web_raw(b, css, strlen(css));
    lit(b, "</style></head>\n<body><header><a href=\"/\">kiln runs</a></header>\n<main>\n<h1>");
    txt(b, title);
    lit(b, "</h1>\n");
}

void kiln_web_runs_end(kiln_web_buf *b, const char *root, double now) {
    char t[21];
    kiln_format_time((int64_t)now, t);
    lit(b, "</main>\n<footer>");
    txt(b, root);
    lit(b, " read at <time>");
    txt(b, t);
    lit(b, "</time> by kiln ");
    txt(b, kiln_version());
    lit(b, "; reload for what was logged since</footer>\n</body></html>\n");
}

static void td_num(kiln_web_buf *b, double v, const char *fmt) {
    lit(b, "<td class=\"n\">");
    if (isfinite(v)) kiln_web_printf(b, fmt, v);
    lit(b, "</td>");
}

void kiln_web_sweep_begin(kiln_web_buf *b, const char *same, const char *const *varied,
                          size_t n_varied) {
    if (same && *same) {
        lit(b, "<p><small>every run: ");
        txt(b, same);
        lit(b, "</small></p>\n");
    }
    lit(b, "<form method=\"get\" action=\"/overlay\">\n<table class=\"sweep\">\n<thead><tr>"
           "<th></th><th>run</th><th>state</th><th>step</th><th>loss</th><th>best val_loss</th>"
           "<th>val_r2</th><th>at</th><th>spikes</th><th>nonfin</th>");
    for (size_t k = 0; k < n_varied; k++) {
        lit(b, "<th>");
        txt(b, varied[k]);
        lit(b, "</th>");
    }
    lit(b, "</tr></thead>\n<tbody>\n");
    b->rows = 0;
}

void kiln_web_sweep_row(kiln_web_buf *b, const kiln_web_run_row *r, size_t n_varied) {
    b->rows++;
    lit(b, "<tr class=\"run\"><td><input type=\"checkbox\" name=\"run\" value=\"");
    txt(b, r->name);
    lit(b, "\" checked></td><td><a href=\"/run?r=");
    kiln_web_pct(b, r->name, NULL);
    lit(b, "\">");
    txt(b, r->name);
    lit(b, "</a></td><td><span class=\"tag");
    if (!strcmp(r->state, "finished")) lit(b, " ok");
    if (!strcmp(r->state, "diverged") || !strcmp(r->state, "failed") ||
        !strcmp(r->state, "error"))
        lit(b, " bad");
    if (!strcmp(r->state, "interrupted")) lit(b, " warn");
    lit(b, "\">");
    txt(b, r->state);
    lit(b, "</span>");
    if (r->message) {
        lit(b, " <small>");
        txt(b, r->message);
        lit(b, "</small>");
    }
    lit(b, "</td><td class=\"n\">");
    if (r->step) kiln_web_printf(b, "%ld", r->step);
    if (r->steps) kiln_web_printf(b, " / %ld", r->steps);
    lit(b, "</td>");
    td_num(b, r->loss, "%.4g");
    td_num(b, r->val_loss, "%.4g");
    td_num(b, r->val_r2, "%.4f");
    lit(b, "<td class=\"n\">");
    if (r->val_step) kiln_web_printf(b, "%ld", r->val_step);
    kiln_web_printf(b, "</td><td class=\"n\">%ld</td><td class=\"n\">%ld</td>", r->spikes, r->nonfinite);
    for (size_t k = 0; k < n_varied; k++) {
        lit(b, "<td>");
        if (r->varied) txt(b, r->varied[k]);
        lit(b, "</td>");
    }
    lit(b, "</tr>\n");
}

void kiln_web_sweep_end(kiln_web_buf *b) {
    lit(b, "</tbody>\n</table>\n");
    if (!b->rows)
        lit(b, "<p>no run here yet</p>\n");
    else
        lit(b, "<p><button type=\"submit\">overlay the runs ticked</button></p>\n");
    lit(b, "</form>\n");
}

void kiln_web_differs_begin(kiln_web_buf *b, const char *same, const char *const *keys,
                            size_t n_keys) {
    lit(b, "<h2>What differs</h2>\n");
    if (same && *same) {
        lit(b, "<p><small>every run: ");
        kiln_web_text(b, same);
        lit(b, "</small></p>\n");
    }
    lit(b, "<table class=\"sweep differs\">\n<thead><tr><th>run</th>");
    for (size_t k = 0; k < n_keys; k++) {
        lit(b, "<th>");
        kiln_web_text(b, keys[k]);
        lit(b, "</th>");
    }
    if (!n_keys) lit(b, "<th>config</th>");
    lit(b, "</tr></thead>\n<tbody>\n");
}

void kiln_web_differs_row(kiln_web_buf *b, const char *name, const char *href,
                          const char *const *values, size_t n_keys) {
    lit(b, "<tr class=\"run\"><td>");
    if (href) {
        lit(b, "<a href=\"");
        kiln_web_text(b, href);
        lit(b, "\">");
    }
    kiln_web_text(b, name);
    if (href) lit(b, "</a>");
    lit(b, "</td>");
    for (size_t k = 0; k < n_keys; k++) {
        lit(b, "<td><code>");
        kiln_web_text(b, values[k] ? values[k] : "-");
        lit(b, "</code></td>");
    }
    if (!n_keys) lit(b, "<td>the same as the others</td>");
    lit(b, "</tr>\n");
}

void kiln_web_differs_end(kiln_web_buf *b) {
    lit(b, "</tbody>\n</table>\n");
}

void kiln_web_kv_begin(kiln_web_buf *b, const char *heading) {
    lit(b, "<h2>");
    txt(b, heading);
    lit(b, "</h2>\n<table class=\"kv\">\n<tbody>\n");
}

void kiln_web_kv_row(kiln_web_buf *b, const char *key, const char *value) {
    lit(b, "<tr><th>");
    txt(b, key);
    lit(b, "</th><td><code>");
    txt(b, value);
    lit(b, "</code></td></tr>\n");
}

void kiln_web_kv_end(kiln_web_buf *b) {
    lit(b, "</tbody>\n</table>\n");
}

void kiln_web_section_begin(kiln_web_buf *b, const char *heading, const char *note) {
    lit(b, "<h2>");
    txt(b, heading);
    lit(b, "</h2>\n");
    if (note) {
        lit(b, "<p><small>");
        txt(b, note);
        lit(b, "</small></p>\n");
    }
    lit(b, "<div class=\"charts\">\n");
}

void kiln_web_section_end(kiln_web_buf *b) {
    lit(b, "</div>\n");
}

void kiln_web_events_begin(kiln_web_buf *b) {
    lit(b, "<h2>Events</h2>\n<table class=\"events\">\n<thead><tr><th>step</th><th>kind</th>"
           "<th>message</th></tr></thead>\n<tbody>\n");
    b->rows = 0;
}

void kiln_web_events_row(kiln_web_buf *b, long step, const char *kind, const char *message,
                         const char *href) {
    b->rows++;
    lit(b, "<tr class=\"event ");
    txt(b, kind);
    lit(b, "\"><td class=\"n\">");
    if (href) {
        lit(b, "<a href=\"");
        kiln_web_text(b, href);
        lit(b, "\">");
    }
    kiln_web_printf(b, "%ld", step);
    if (href) lit(b, "</a>");
    lit(b, "</td><td>");
    txt(b, kind);
    lit(b, "</td><td>");
    txt(b, message);
    if (href) {
        lit(b, " <a href=\"");
        kiln_web_text(b, href);
        lit(b, "\">explain</a>");
    }
    lit(b, "</td></tr>\n");
}

void kiln_web_para(kiln_web_buf *b, const char *text) {
    lit(b, "<p>");
    txt(b, text);
    lit(b, "</p>\n");
}

void kiln_web_link(kiln_web_buf *b, const char *href, const char *text) {
    lit(b, "<a href=\"");
    kiln_web_text(b, href);
    lit(b, "\">");
    txt(b, text);
    lit(b, "</a>");
}

/* ---- whole pages ---- */

void kiln_web_runs_error(kiln_web_buf *b, unsigned status, const char *msg, const char *root,
                         double now) {
    char title[32];
    snprintf(title, sizeof title, "%u", status);
    kiln_web_runs_begin(b, title);
    kiln_web_para(b, msg);
    kiln_web_runs_end(b, root, now);
}

void kiln_web_sweep_page(kiln_web_buf *b, const kiln_web_sweep *s, const char *root, double now) {
    char title[300];
    snprintf(title, sizeof title, "%zu run%s in %s", s->n_rows, s->n_rows == 1 ? "" : "s", root);
    kiln_web_runs_begin(b, title);
    kiln_web_sweep_begin(b, s->same, s->varied, s->n_varied);
    for (size_t i = 0; i < s->n_rows; i++)
        kiln_web_sweep_row(b, &s->rows[i], s->n_varied);
    kiln_web_sweep_end(b);
    if (s->n_varied < s->n_varied_all) {
        char more[128];
        snprintf(more, sizeof more,
                 "%zu more config keys differ between the runs; kiln runs "
                 "list shows them",
                 s->n_varied_all - s->n_varied);
        kiln_web_para(b, more);
    }
    kiln_web_runs_end(b, root, now);
}

/* The overlay's table of what differs: the config keys the runs do not share, a row per run
 * linked to its page. Four overlaid curves say little until one knows which lr each is
 * (issue 30). */
static void differs(kiln_web_buf *b, const kiln_web_overlay *o) {
    kiln_web_differs_begin(b, o->same, o->keys, o->n_keys);
    for (size_t i = 0; i < o->n_runs; i++) {
        const kiln_web_overlay_run *r = &o->runs[i];
        char *href = kiln_web_run_href("run", r->name, 0);
        kiln_web_differs_row(b, r->title, href, r->values, o->n_keys);
        free(href);
    }
    kiln_web_differs_end(b);
}

void kiln_web_overlay_page(kiln_web_buf *b, const kiln_web_overlay *o, const char *root,
                           double now) {
    char title[64];
    snprintf(title, sizeof title, "%zu runs overlaid", o->n_runs);
    kiln_web_runs_begin(b, title);
    /* noisy: a value every step, smoothed; the validation's few points and the schedule's
     * exact ones are drawn as they are (a moving average of 20 points only lags) */
    static const struct {
        const char *metric, *title;
        kiln_web_scale scale;
        bool noisy;
    } charts[] = {{"loss", "loss", KILN_WEB_SCALE_AUTO, true},
                  {"val_loss", "validation loss", KILN_WEB_SCALE_AUTO, false},
                  {"val_r2", "validation R\xC2\xB2", KILN_WEB_SCALE_LINEAR, false},
                  {"lr", "learning rate", KILN_WEB_SCALE_LINEAR, false},
                  {"grad_norm", "gradient norm", KILN_WEB_SCALE_AUTO, true}};
    long first = o->n_runs ? o->runs[0].first : 0, last = o->n_runs ? o->runs[0].last : 0;
    for (size_t i = 1; i < o->n_runs; i++) {
        if (o->runs[i].first < first) first = o->runs[i].first;
        if (o->runs[i].last > last) last = o->runs[i].last;
    }
    char note[256];
    if (o->smooth > 0)
        snprintf(note, sizeof note,
                 "loss and gradient norm smoothed (a moving average of weight %g, as TensorBoard "
                 "smooths), the raw curve faint beneath; smooth=0 in the address draws them raw",
                 o->smooth);
    kiln_web_section_begin(b, "Runs on the same axes", o->smooth > 0 ? note : NULL);
    kiln_web_series ser[16];
    for (size_t k = 0; k < KILN_ARRAY_LEN(charts); k++) {
        size_t ns = 0;
        for (size_t i = 0; i < o->n_runs && ns < 16; i++) {
            const kiln_web_overlay_run *r = &o->runs[i];
            const kiln_web_series *c =
                kiln_web_series_find(r->curves, r->n_curves, charts[k].metric);
            if (c) ser[ns++] = (kiln_web_series){r->title, c->x, c->y, c->n};
        }
        kiln_web_chart ch = {.id = charts[k].metric,
                             .title = charts[k].title,
                             .series = ser,
                             .n_series = ns,
                             .scale = charts[k].scale == KILN_WEB_SCALE_AUTO ? o->loss_scale
                                                                             : charts[k].scale,
                             /* full width, one a row (issue 30: four noisy runs side by
                              * side in 720 pixels were unreadable); svg.chart shrinks to a
                              * narrower window (web/page.c) */
                             .width = 1200,
                             .height = 300,
                             .x_lo = (double)first,
                             .x_hi = (double)last,
                             .smooth = charts[k].noisy ? o->smooth : 0,
                             .hover_cols = 48};
        kiln_web_chart_svg(b, &ch);
    }
    kiln_web_section_end(b);
    differs(b, o);
    kiln_web_runs_end(b, root, now);
}

/* A figure as kiln runs explain prints it: "0.0123 (median 0.0101, 1.218x)", the value and
 * the median to 6 significant digits, the ratio to 4; "-" for none. */
static void explain_figure(kiln_web_buf *b, const kiln_web_explain_figure *f, const char *what) {
    char a[32] = "-", m[32] = "-", r[32] = "-", line[128];
    if (!isnan(f->value)) snprintf(a, sizeof a, "%.6g", f->value);
    if (!isnan(f->median)) snprintf(m, sizeof m, "%.6g", f->median);
    if (!isnan(f->ratio)) snprintf(r, sizeof r, "%.4g", f->ratio);
    snprintf(line, sizeof line, "%s%s (median %s, %sx)", what, a, m, r);
    kiln_web_kv_row(b, f->name, line);
}

void kiln_web_explain_page(kiln_web_buf *b, const kiln_web_explain *e, const char *root,
                           double now) {
    char title[300];
    snprintf(title, sizeof title, "%s, step %ld: why", e->title, e->step);
    kiln_web_runs_begin(b, title);
    char *back = kiln_web_run_href("run", e->name, 0);
    if (back) kiln_web_link(b, back, "back to the run");
    free(back);
    kiln_web_kv_begin(b, "Findings");
    for (size_t i = 0; i < e->n_findings; i++)
        kiln_web_kv_row(b, e->findings[i].key, e->findings[i].value);
    if (!e->n_findings) kiln_web_kv_row(b, "-", "nothing stands out against the steps before");
    kiln_web_kv_end(b);
    kiln_web_kv_begin(b, "The step against the median of the steps before");
    for (size_t i = 0; i < e->n_metrics; i++)
        explain_figure(b, &e->metrics[i], "");
    kiln_web_kv_end(b);
    kiln_web_kv_begin(b, "Tensors, the most changed first");
    for (size_t i = 0; i < e->n_tensors && i < 12; i++)
        explain_figure(b, &e->tensors[i], "gradient norm ");
    kiln_web_kv_end(b);
    kiln_web_kv_begin(b, "Events at this step");
    for (size_t i = 0; i < e->n_events; i++)
        kiln_web_kv_row(b, e->events[i].key, e->events[i].value);
    kiln_web_kv_end(b);
    kiln_web_runs_end(b, root, now);
}

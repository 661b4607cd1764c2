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

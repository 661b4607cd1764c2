/*
 * chart.h - web/'s charts: SVG line charts and heat maps rendered by the server, and the
 * pages of `kiln runs serve` that hold them (web/chart.c, web/runs_pages.c). Part of web.h, which
 * includes it; split out so the registry's pages and the charts read apart.
 *
 * No JavaScript: hover text is SVG's <title>, links are <a>, colours are presentation
 * attributes (a style attribute would break the pages' content security policy). Every
 * string handed in (series names, event text, config values) goes out through
 * kiln_web_text. A series of any length is cut to a few points per pixel column with
 * kiln_downsample (core.h: the smallest and largest point of each bucket, never a mean), so
 * a chart of a million steps costs what one of a thousand does.
 */
#ifndef KILN_WEB_CHART_H
#define KILN_WEB_CHART_H

#include <stdbool.h>
#include <stddef.h>

#include "web.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The headers of kiln runs serve's pages: kiln_web_headers' with form-action 'self' (the
 * overlay form is a plain GET to the same server). Static; safe from any thread. */
const kiln_web_header *kiln_web_headers_form(size_t *n);

/* One line of a chart: n points, x ascending; a non-finite y is drawn as a mark on the
 * plot's top edge, not joined into the line. */
typedef struct kiln_web_series {
    const char *name;
    const double *x, *y;
    size_t n;
} kiln_web_series;

/* What a mark on the x axis stands for. */
typedef enum kiln_web_mark_kind {
    KILN_WEB_MARK_SPIKE,
    KILN_WEB_MARK_NONFINITE,
    KILN_WEB_MARK_RESUME,
    KILN_WEB_MARK_DEVICE, /* a device change */
    KILN_WEB_MARK_EVENT,  /* any other event */
    KILN_WEB_MARK_CKPT,   /* a checkpoint on disk */
    KILN_WEB_MARK_BEST,   /* the best checkpoint: named on the chart ("best ckpt") */
    KILN_WEB_MARK_EXPORTED, /* the checkpoint a registry version was exported from: named */
    KILN_WEB_MARK_BEST_VAL  /* the step of the lowest validation loss: named ("best val"), a
                               row below "best ckpt", which may be another step (issue 30) */
} kiln_web_mark_kind;
/* "spike", "nonfinite", "resume", "device", "event", "ckpt", "best", "exported", "best-val":
 * the mark's class. */
const char *kiln_web_mark_name(kiln_web_mark_kind k);

typedef struct kiln_web_mark {
    double x;
    kiln_web_mark_kind kind;
    const char *text; /* the hover text */
    const char *href; /* a link (the step explained), or NULL */
} kiln_web_mark;

typedef enum kiln_web_scale {
    KILN_WEB_SCALE_AUTO, /* log when every finite value is > 0 and they span 2 decades */
    KILN_WEB_SCALE_LINEAR,
    KILN_WEB_SCALE_LOG
} kiln_web_scale;

#define KILN_WEB_CHART_WIDTH 560
#define KILN_WEB_CHART_HEIGHT 220

typedef struct kiln_web_chart {
    const char *id;      /* the figure's id ("chart-" is put before it), or NULL */
    const char *title;   /* the caption */
    const char *x_label; /* NULL: "step" */
    const kiln_web_series *series;
    size_t n_series;
    const kiln_web_mark *marks;
    size_t n_marks;
    kiln_web_scale scale;
    int width, height; /* pixels; 0: KILN_WEB_CHART_WIDTH x KILN_WEB_CHART_HEIGHT */
    /* The x range drawn; both 0: the series' own (and the marks'). */
    double x_lo, x_hi;
    /* 0: each series as it is. In (0, 1): each series drawn faint as it is and, over it, its
     * exponential moving average with that weight, debiased as TensorBoard smooths
     * (s = w s + (1 - w) y over the finite points, divided by 1 - w^n): noisy curves laid
     * over each other stay apart (issue 30). */
    double smooth;
    /* 0: none. Else the plot cut into this many columns, each a transparent <rect
     * class="hover"> whose <title> gives its steps and each series' last value there, so
     * that hovering reads values without JavaScript (issue 30). */
    int hover_cols;
} kiln_web_chart;

/* A <figure class="chart"> holding the caption and an <svg class="chart">: the axes with
 * "nice" ticks (1, 2 or 5 times a power of ten; a log axis at powers of ten), the series
 * (a <polyline class="series"> each, a colour each, its name in a <title>), the non-finite
 * points (<g class="mark nonfinite-point">), the marks (<g class="mark KIND">, text in a
 * <title>, wrapped in an <a> when it has href) and a legend when there are two series or
 * more. A chart without a finite point says so in its plot area. */
void kiln_web_chart_svg(kiln_web_buf *b, const kiln_web_chart *c);

/* A heat map: a row per series (an expert's load), x cut into columns; each cell is
 * coloured by the largest value the row has in its column (a one-step overload shows),
 * with the row, the steps and the range in its <title>. Marks as on a chart. */
typedef struct kiln_web_heatmap {
    const char *id, *title;
    const char *row_label; /* "expert" */
    const kiln_web_series *rows;
    size_t n_rows;
    const kiln_web_mark *marks;
    size_t n_marks;
    int width, height; /* 0: as a chart */
} kiln_web_heatmap;
void kiln_web_heatmap_svg(kiln_web_buf *b, const kiln_web_heatmap *h);

/* Tick values over [lo, hi] at 1, 2 or 5 times a power of ten, about `want` of them:
 * writes at most max into t and returns how many, *step their spacing. The axis is
 * [t[0], t[n-1]], which covers [lo, hi]. */
size_t kiln_web_nice_ticks(double lo, double hi, int want, double *t, size_t max, double *step);
/* A tick's label: at most 7 characters, "1.5M", "250k", "0.002", "1e-05". */
void kiln_web_tick_label(double v, double step, char out[16]);

/* ---- the pages of kiln runs serve (web/runs_pages.c) ---- */

/* The document's head with the stylesheet, a header linking to "/" and the heading h1. */
void kiln_web_runs_begin(kiln_web_buf *b, const char *title);
/* The footer (rendered when, by which kiln, the directory served) and the end. */
void kiln_web_runs_end(kiln_web_buf *b, const char *root, double now);

/* A run of the sweep's table. */
typedef struct kiln_web_run_row {
    const char *name; /* relative to the directory served: the link is /run/NAME */
    const char *state;
    const char *message; /* why it stopped or could not be read; NULL */
    long step, steps;
    double loss, val_loss, val_r2; /* NAN: none */
    long val_step;
    long spikes, nonfinite;
    const char *const *varied; /* the value of each varied key (NULL: the run has none) */
} kiln_web_run_row;

/* The sweep: what every run shares, then a form (GET /overlay) of a row per run with a
 * checkbox named "run" valued its name, the columns and a column per varied key. */
void kiln_web_sweep_begin(kiln_web_buf *b, const char *same, const char *const *varied,
                          size_t n_varied);
void kiln_web_sweep_row(kiln_web_buf *b, const kiln_web_run_row *r, size_t n_varied);
void kiln_web_sweep_end(kiln_web_buf *b);

/* The overlay's table of what differs between the runs it draws (issue 30): what they all
 * share in a line, then a row per run (its name linked to href) with its value of each key
 * they differ in (values[k] NULL: the run has none). */
void kiln_web_differs_begin(kiln_web_buf *b, const char *same, const char *const *keys,
                            size_t n_keys);
void kiln_web_differs_row(kiln_web_buf *b, const char *name, const char *href,
                          const char *const *values, size_t n_keys);
void kiln_web_differs_end(kiln_web_buf *b);

/* A two-column table of key and value (a run's config, the explain page's figures). */
void kiln_web_kv_begin(kiln_web_buf *b, const char *heading);
void kiln_web_kv_row(kiln_web_buf *b, const char *key, const char *value);
void kiln_web_kv_end(kiln_web_buf *b);

/* A heading, then charts laid out side by side until kiln_web_section_end. */
void kiln_web_section_begin(kiln_web_buf *b, const char *heading, const char *note);
void kiln_web_section_end(kiln_web_buf *b);

/* A run's event in its table: the step links to href when it has one. */
void kiln_web_events_begin(kiln_web_buf *b);
void kiln_web_events_row(kiln_web_buf *b, long step, const char *kind, const char *message,
                         const char *href);

/* A paragraph of text; a link. */
void kiln_web_para(kiln_web_buf *b, const char *text);
void kiln_web_link(kiln_web_buf *b, const char *href, const char *text);

/* ---- whole pages of kiln runs serve, from plain values (cli/cmd_runs_serve.c hands them) ---- */

/* A key and its value: a config key flattened ("opt.beta1") and its text, a finding's kind
 * and text, an event's kind and message. */
typedef struct kiln_web_kv {
    const char *key, *value;
} kiln_web_kv;

/* An event of a run. */
typedef struct kiln_web_event {
    long step;
    const char *kind, *message;
} kiln_web_event;

/* The newest events a run's page lists in its table (all of them are marked on its charts). */
#define KILN_WEB_EVENT_ROWS 200

/* A run as its page shows it. Strings may be NULL (shown empty). */
typedef struct kiln_web_run_view {
    const char *name;  /* as its links carry it: "." (the directory served) or a child's name */
    const char *title; /* the heading: the name, or the directory served for "." */
    const char *run_id, *created, *dataset, *dataset_sha256;
    long step, steps;         /* the newest step logged, the steps configured */
    const char *state;        /* kiln_run_state_name's */
    const char *stop_message; /* why it stopped, or NULL */
    const long *ckpts;        /* the checkpoints on disk, ascending */
    size_t n_ckpts;
    long best_ckpt; /* -1: none */
    size_t n_spikes, n_nonfinite, total_events;
    const kiln_web_event *events; /* the newest events, oldest first */
    size_t n_events;
    const kiln_web_kv *config; /* flattened, in order */
    size_t n_config;
    /* The curves, each named as kiln_run_series names it ("loss", "router_entropy@1",
     * "expert_load@0/3", "update_ratio@NAME"); curves_error non-NULL: none could be read,
     * and this says why. */
    const char *curves_error;
    const kiln_web_series *curves;
    size_t n_curves;
    long first, last;          /* the steps logged */
    int n_layers, n_experts;   /* 0: no layers logged */
    const char *const *movers; /* the tensors whose update ratio rose highest, highest first */
    size_t n_movers;
    bool sampled, layers_summed, tensors_summed; /* kiln_run_curves' */
} kiln_web_run_view;

/* A run's page: what kiln runs show says first (the best validation read off the val_loss
 * curve), the charts with the events, checkpoints and best validation marked (a spike's and
 * a non-finite step's mark linked to /explain), a chart whose every value is 0 folded into a
 * line, the expert load's heat maps, the top movers, the events table, the config. root and
 * now are the footer's. */
void kiln_web_run_page(kiln_web_buf *b, const kiln_web_run_view *r, const char *root, double now);

/* A run on the overlay. */
typedef struct kiln_web_overlay_run {
    const char *name;  /* as its link carries it */
    const char *title; /* as shown */
    const kiln_web_series *curves;
    size_t n_curves;
    long first, last;
    const char *const *values; /* its value of each key the runs differ in (values[k] NULL:
                                  none) */
} kiln_web_overlay_run;

typedef struct kiln_web_overlay {
    const kiln_web_overlay_run *runs;
    size_t n_runs;
    double smooth;             /* the moving average's weight on the noisy curves; 0: raw */
    kiln_web_scale loss_scale; /* of the loss, validation loss and gradient norm */
    const char *same;          /* what every run shares, "key=value " words; may be NULL */
    const char *const *keys;   /* the config keys they differ in */
    size_t n_keys;
} kiln_web_overlay;

/* The runs on the same axes, a chart per curve, full width, then the table of what differs. */
void kiln_web_overlay_page(kiln_web_buf *b, const kiln_web_overlay *o, const char *root,
                           double now);

/* A figure of the explain page: the step's value against the median of the steps before;
 * NAN: none. */
typedef struct kiln_web_explain_figure {
    const char *name;
    double value, median, ratio;
} kiln_web_explain_figure;

/* kiln runs explain's answer for a step (the first 12 tensors shown). */
typedef struct kiln_web_explain {
    const char *name, *title; /* the run, as linked and as shown */
    long step;
    const kiln_web_kv *findings; /* kind and text */
    size_t n_findings;
    const kiln_web_explain_figure *metrics, *tensors;
    size_t n_metrics, n_tensors;
    const kiln_web_kv *events; /* kind and message */
    size_t n_events;
} kiln_web_explain;
void kiln_web_explain_page(kiln_web_buf *b, const kiln_web_explain *e, const char *root,
                           double now);

/* The sweep: n_rows runs, each row's varied holding its value of the n_varied keys shown
 * (of n_varied_all that differ); same as for the overlay. */
typedef struct kiln_web_sweep {
    const char *same;
    const char *const *varied;
    size_t n_varied, n_varied_all;
    const kiln_web_run_row *rows;
    size_t n_rows;
} kiln_web_sweep;
void kiln_web_sweep_page(kiln_web_buf *b, const kiln_web_sweep *s, const char *root, double now);

/* An error page: the status as its title, the message. */
void kiln_web_runs_error(kiln_web_buf *b, unsigned status, const char *msg, const char *root,
                         double now);

/* ---- a registry version's page (web/version.c; registry/server/ui.c hands the documents) ---- */

/* The validation report (validation.json as the registry stores it) check by check: the
 * verdict, the baseline linked to its own version page (/ui/models/NAME/versions/VERSION),
 * then a row per check with its status and reason. NULL: "no validation report". */
void kiln_web_validation_report(kiln_web_buf *b, const json_t *report);
/* The run summary (run_summary.json of the archive, train.h "kiln-run-summary/1") drawn as
 * kiln runs serve draws a run, the exported step marked; NULL or no usable series: the
 * sentence "no run summary". Values are checked for type and bounded in count. */
void kiln_web_run_summary(kiln_web_buf *b, const json_t *summary);

#ifdef __cplusplus
}
#endif
#endif /* KILN_WEB_CHART_H */

/* runs_views.h - kiln runs serve's run data as web/'s plain values (cli/runs_views.c): runs
 * read with train/'s readers (a list of runs, a run's info and curves, an explanation) and
 * turned into the structs web/ composes its pages from (web/chart.h). cmd_runs_serve.c
 * answers the requests: which run a name is, what a query asks, which status an error is. */
#ifndef KILN_CLI_RUNS_VIEWS_H
#define KILN_CLI_RUNS_VIEWS_H

#include "runs.h"
#include "web.h"

#define RUNS_MAX_OVERLAY 10 /* runs on one overlay */
#define RUNS_MAX_VARIED 64  /* config keys the sweep's table has a column for */
#define RUNS_MAX_EVENTS 2000   /* the newest events of a run read for its marks */
#define RUNS_CURVE_BUCKETS 500 /* a curve's buckets (kiln_run_curves_load) */

/* The name a run's links carry: "." for the directory served (root) itself, else its
 * child's name. */
const char *runs_link_name(const char *root, const kiln_run_row *r);

/* The sweep's page of the list l of the runs in root (which it points into). */
typedef struct runs_sweep_view {
    kiln_web_sweep sw;
    kiln_run_list l;
    bool nomem; /* out of memory: sw is incomplete */
    const char *varied[RUNS_MAX_VARIED];
    char *same, **vals;
    kiln_web_run_row *rows;
} runs_sweep_view;
/* Read the runs in root. Release v either way. */
kiln_err runs_sweep_view_load(const char *root, runs_sweep_view *v);
void runs_sweep_view_release(runs_sweep_view *v);

/* A run's page: the run in dir (its curves through cache), linked as name, shown as title. */
typedef struct runs_run_view {
    kiln_web_run_view v;
    bool nomem; /* out of memory: v is incomplete */
    kiln_run_info ri;
    kiln_run_curves cv;
    bool have_info, have_curves;
    char curves_error[512];
    kiln_web_event *events;
    kiln_web_series *curves;
    kiln_web_kv *config;
    size_t n_config, cap_config;
} runs_run_view;
/* The run's info and RUNS_MAX_EVENTS newest events must be read (KILN_ERR_NOTFOUND: it is
 * no run); its curves need not be: the page then says why not. Release v either way. */
kiln_err runs_run_view_load(kiln_run_cache *cache, const char *dir, const char *name,
                            const char *title, runs_run_view *v);
void runs_run_view_release(runs_run_view *v);

/* The overlay of n runs: their curves, and what differs between them read from their
 * directories (nothing when they cannot be read: the charts are still drawn). */
typedef struct runs_overlay_view {
    kiln_web_overlay o;
    bool nomem; /* out of memory: o is incomplete */
    kiln_run_curves cv[RUNS_MAX_OVERLAY];
    size_t loaded;
    kiln_web_overlay_run runs[RUNS_MAX_OVERLAY];
    kiln_run_list l;
    bool have_list;
    char *same;
    const char *keys[64];
    char *vals[RUNS_MAX_OVERLAY][64];
} runs_overlay_view;
/* Run i is linked as names[i], shown as titles[i], its directory dirs[i] (NULL: there is
 * no such run); an error names the run that could not be read. Release v either way. */
kiln_err runs_overlay_view_load(const char *const *names, const char *const *titles,
                                const char *const *dirs, size_t n, runs_overlay_view *v);
void runs_overlay_view_release(runs_overlay_view *v);

/* The explain page of the run in dir at step (kiln runs explain's answer), linked as name,
 * shown as title; kiln_run_explain's errors. Release v either way. */
typedef struct runs_explain_view {
    kiln_web_explain x;
    bool nomem; /* out of memory: x is incomplete */
    json_t *d;  /* the answer x points into */
} runs_explain_view;
kiln_err runs_explain_view_load(const char *dir, long step, const char *name, const char *title,
                                runs_explain_view *v);
void runs_explain_view_release(runs_explain_view *v);

#endif /* KILN_CLI_RUNS_VIEWS_H */

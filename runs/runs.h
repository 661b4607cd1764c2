/*
 * runs.h - runs/'s face: a run directory's logs and everything that reads them. The trainer
 * (train/) writes a run through it (the metrics log, the checkpoints' names, the .lock); kiln
 * runs show/diff/plot/list/explain/serve, sweep/, release/ and export's callers read runs
 * through it. runs/ uses core/ and data/ only: it knows nothing of the trainer, so a step's
 * record (kiln_train_progress) and a forward's diagnostics (kiln_tsmoe_stats), which it stores
 * and gives back, are declared here and train.h includes this header.
 * Everything returns kiln_err; nothing prints or exits.
 */
#ifndef KILN_RUNS_H
#define KILN_RUNS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "data.h"

/* ==== what a step logs ==================================================================== */

/* Diagnostics of the last forward: views into the model, valid until the next forward. */
typedef struct kiln_tsmoe_stats {
    int n_layers, n_experts;
    const float *attn_entropy;   /* [L] mean attention entropy (nats) over tokens and heads */
    const float *router_entropy; /* [L] mean entropy of p_t over tokens; 0 when dense */
    const float *expert_load;    /* [L,E] f_i: share of the N*K choices that picked expert i */
    const float *overflow;       /* [L] share of (token, slot) choices dropped by capacity */
    const float *act_rms;        /* [L] RMS of the residual stream h after each block */
    float max_abs_output;        /* max |y| */
} kiln_tsmoe_stats;

/* What the trainer reports after every step (to the progress callback). */
typedef struct kiln_train_progress {
    long step, steps; /* step is 1-based: steps done so far */
    long first_step;  /* the first step of this process (after a resume: ckpt + 1) */
    double loss, mse, load_balance, z, lr, grad_norm;
    bool applied; /* false: the update was skipped (non-finite or spike) */
    double tokens_per_s, elapsed_s, eta_s;
    bool has_val;              /* validation ran after this step */
    double val_loss, val_r2;   /* on the standardised targets (R^2 does not change with it) */
    const double *val_r2_each; /* [O] R^2 per target when has_val, else NULL */
    const kiln_tsmoe_stats *stats;
} kiln_train_progress;

/* ==== the metrics log (runs/metrics.c): what the trainer writes =====================
 * RUN_DIR/metrics.db, a SQLite database; its tables and columns are docs/formats.md's
 * "metrics.db", the contract every reader (runs/, python/kiln/_runs.py) holds to. */

typedef struct kiln_run_metrics kiln_run_metrics;

/* Open (creating the schema) RUN_DIR/metrics.db in WAL mode. read_only: no schema, no
 * writes. Free with kiln_run_metrics_close. */
kiln_err kiln_run_metrics_open(const char *path, bool read_only, kiln_run_metrics **out);
void kiln_run_metrics_close(kiln_run_metrics *mx);
/* Delete every row of a step after `step` (a resume replaces them). */
kiln_err kiln_run_metrics_truncate(kiln_run_metrics *mx, long step);
/* Of the steps[0..n), the one whose row holds the lowest validation loss (ties: the later
 * step); -1 when none holds one (no validation ran at any of them, or it was not finite). */
kiln_err kiln_run_metrics_best_val_step(kiln_run_metrics *mx, const long *steps, size_t n,
                                        long *best);
kiln_err kiln_run_metrics_event(kiln_run_metrics *mx, long step, const char *kind,
                                const char *message);

typedef struct kiln_run_metrics_tensor {
    const char *name;
    double grad_norm, update_ratio; /* update_ratio: |update| / |weight| */
} kiln_run_metrics_tensor;

/* One step's row in `steps`, plus `layers` rows from p->stats and `tensors` rows, in one
 * transaction. */
kiln_err kiln_run_metrics_step(kiln_run_metrics *mx, const kiln_train_progress *p,
                               const kiln_run_metrics_tensor *tensors, size_t n_tensors);
/* Bring step_sums up to the steps logged (kiln_run_metrics_step does it after each step; this
 * is for rows written by other means, as tests/e2e/gen-run.sh writes them). */
kiln_err kiln_run_metrics_summarize(kiln_run_metrics *mx);
/* The validation R^2 of each target at step (r2 [O]), named from ds's columns. */
kiln_err kiln_run_metrics_val_targets(kiln_run_metrics *mx, long step, const kiln_dataset *ds,
                                      const double *r2);

/* ==== the run directory (runs/run_dir.c) =============================================== */

/* RUN_DIR/ckpt/step-NNNNNNNN.safetensors; caller frees. */
char *kiln_run_ckpt_path(const char *run_dir, long step);
/* Steps of the checkpoints in RUN_DIR/ckpt, ascending (*steps NULL when none; caller
 * frees). A missing ckpt directory is no checkpoints. */
kiln_err kiln_run_ckpt_list(const char *run_dir, long **steps, size_t *n);
/* Take the run directory for this process (the trainer): an exclusive flock on RUN_DIR/.lock
 * (KILN_ERR_CONFLICT naming the run when another process holds it) and the OFD lock readers
 * test (kiln_run_live). *fd is the lock's descriptor, -1 when it could not be opened; the
 * caller closes it (which releases both) also after a failure. */
kiln_err kiln_run_lock(const char *run_dir, int *fd);

/* ==== reading runs (runs/runs.c, runlist.c, curves.c, explain.c) ========================= */

/* A config value as people type it (--set) and as every reader of runs shows it (kiln runs
 * list, show, diff and serve): 0.003, 1e-5 (the shortest text that reads back as the same
 * double), adamw, true; other JSON compact. Caller frees; NULL when out of memory. */
char *kiln_run_config_value_text(const json_t *v);

typedef struct kiln_run_event {
    long step;
    char *kind, *message;
    double time; /* unix seconds */
} kiln_run_event;

typedef struct kiln_run_info {
    json_t *run;    /* run.json */
    long last_step; /* newest metrics row; 0 = none */
    double last_loss, last_lr, last_grad_norm;
    long best_val_step; /* 0 = no validation yet */
    double best_val_loss, best_val_r2;
    long last_val_step;
    double last_val_loss, last_val_r2;
    /* R^2 per target at last_val_step: an array of {target, name, r2}; empty for a run
     * logged before they were recorded. */
    json_t *last_val_targets;
    long *ckpts; /* checkpoint steps on disk, ascending */
    size_t n_ckpts;
    long best_ckpt;         /* the one whose step logged the lowest validation loss; -1: none */
    kiln_run_event *events; /* newest max_events, oldest first */
    size_t n_events, total_events;
    /* The router and attention diagnostics of every layer at last_step: an array of rows
     * {layer, attn_entropy, router_entropy, load_imbalance, dead_experts, overflow,
     * act_rms, expert_load: [E]}; empty when none were logged. */
    json_t *layers;
    double tokens_per_s; /* over the newest 100 steps (their tokens over their time); NAN: none */
    double updated;      /* unix seconds of the newest step row or event; NAN: none */
    size_t n_nonfinite, n_spikes; /* events of those kinds */
    /* How the last start or resume ended when the trainer recorded it: "diverged"
     * (max_bad_steps non-finite steps in a row) or "failed" (any other error), with its
     * message; NULL when the newest start or resume has no such event after it. */
    char *stop_kind, *stop_message;
} kiln_run_info;

/* Read a run directory's run.json, metrics.db and checkpoint list (read-only; the metrics
 * in one read transaction, so a trainer writing meanwhile cannot mix two moments).
 * Release with kiln_run_info_release. */
kiln_err kiln_run_info_load(const char *run_dir, size_t max_events, kiln_run_info *out);
/* The same without best_val_* (0: finding them reads every step; kiln runs serve takes them
 * from its curves), so that it costs the same at any length. */
kiln_err kiln_run_info_load_quick(const char *run_dir, size_t max_events, kiln_run_info *out);
void kiln_run_info_release(kiln_run_info *info);
/* Append an event to a run's log (metrics.db's events table) from outside the trainer: a
 * launcher's record of a preemption or a requeue (kiln sweep). step: the step it belongs to;
 * a resume deletes the events after its checkpoint, so a launcher uses the newest checkpoint's
 * step. KILN_ERR_NOTFOUND when the run has no metrics.db yet. */
kiln_err kiln_run_event_add(const char *run_dir, long step, const char *kind, const char *message);
/* Whether a trainer holds the run directory now (its OFD lock on RUN_DIR/.lock, tested
 * without taking anything: a reader never makes a trainer wait or fail). No .lock: false. */
kiln_err kiln_run_live(const char *run_dir, bool *live);

/* ---- following a run as it trains (kiln runs show --follow) ---- */

/* How far a follower has read: the newest step row and event it has seen (their step or id
 * and the time they were logged), plus the newest time seen. Zero: nothing seen. */
typedef struct kiln_run_cursor {
    long step, event_id;
    double time;
} kiln_run_cursor;

/* What was logged after a cursor, oldest first. A resume goes back to a checkpoint and logs
 * the steps after it again: a follower gets them again, after the resume event. */
typedef struct kiln_run_news {
    kiln_train_progress *steps; /* .steps the run's total, .stats NULL, times unset */
    double *step_times;         /* unix seconds each step was logged */
    size_t n_steps;
    kiln_run_event *events;
    size_t n_events;
} kiln_run_news;

/* A cursor at the run's newest rows now, so that kiln_run_follow then gives only what comes
 * later (zero when the run has logged nothing). */
kiln_err kiln_run_cursor_end(const char *run_dir, kiln_run_cursor *cur);
/* The steps and events logged after *cur (the newest max of each when more came), and *cur
 * moved past them. Each read walks down from the newest row to the first one seen, so a poll
 * costs what is new, not the run's length. Rows are logged in step order, each with its
 * time: a row is new when its step is past the cursor's or it was logged after the cursor's
 * time (a resume's re-logged steps), which also holds when the clock steps back. A run with
 * no metrics.db yet has no news. Release with kiln_run_news_release. */
kiln_err kiln_run_follow(const char *run_dir, kiln_run_cursor *cur, size_t max, kiln_run_news *out);
void kiln_run_news_release(kiln_run_news *n);

typedef struct kiln_run_diff {
    json_t *config;    /* {"key": [a, b]} for every key whose values differ */
    long common_steps; /* steps both runs have logged */
    long a_steps, b_steps;
    long first_diff;       /* first step whose losses differ bit for bit; 0 = none */
    double a_loss, b_loss; /* at first_diff */
} kiln_run_diff;
kiln_err kiln_run_diff_load(const char *a_dir, const char *b_dir, kiln_run_diff *out);
void kiln_run_diff_release(kiln_run_diff *d);

/* ---- why a step went wrong (kiln runs explain) ---- */

#define KILN_EXPLAIN_WINDOW 64        /* steps before the one explained that are its baseline */
#define KILN_EXPLAIN_MAX_TROUBLE 1000 /* trouble steps listed in "trouble" */

/* Set a step of a run against the `window` steps before it (< 1: KILN_EXPLAIN_WINDOW): its
 * loss, gradient norm, learning rate and largest output against their medians; every
 * trained tensor's gradient norm against its own median, since when it has been over 3x it,
 * and the largest update ratio of the 8 steps before; every layer's router and attention
 * entropies, dead experts, load imbalance, overflow and output RMS. Findings say in words
 * what stands out: where a non-finite value arose (the first block whose output is not
 * finite, or the top of the tensors whose gradients are not), which tensor rose first,
 * a router or attention collapse, an update far past its median. step 0: the run's first
 * spike or non-finite step ("step": null when it has none); "trouble" lists the steps of
 * every spike and non-finite step (the first KILN_EXPLAIN_MAX_TROUBLE). A step the run did not log,
 * a directory that is no run, or one without metrics.db fails naming it. *out is a document of
 * format "kiln-runs-explain/1" (docs/train.md); json_decref it. */
kiln_err kiln_run_explain(const char *run_dir, long step, long window, json_t **out);

/* ---- comparing runs (kiln runs list) ---- */

typedef enum kiln_run_state {
    KILN_RUN_FINISHED = 0,    /* logged its last step */
    KILN_RUN_RUNNING = 1,     /* a trainer holds it now (kiln_run_live) */
    KILN_RUN_INTERRUPTED = 2, /* not finished, nobody training it: resume it */
    KILN_RUN_DIVERGED = 3,    /* the trainer stopped it: max_bad_steps non-finite steps */
    KILN_RUN_FAILED = 4,      /* the trainer stopped on another error it recorded */
    KILN_RUN_ERROR = 5        /* the run directory could not be read */
} kiln_run_state;
/* "finished", "running", "interrupted", "diverged", "failed", "error". */
const char *kiln_run_state_name(kiln_run_state s);
/* A readable run's state from what kiln_run_info_load read and kiln_run_live said. */
kiln_run_state kiln_run_state_of(const kiln_run_info *ri, bool live);

/* One run of a list. Numbers a run has not logged are NAN (reals) or 0 (steps). */
typedef struct kiln_run_row {
    char *name; /* relative to the PATH it was found under, or the PATH itself */
    char *dir;  /* the run directory's path */
    kiln_run_state state;
    char *message;           /* ERROR: why it could not be read; DIVERGED, FAILED: the trainer's
                                message; NULL otherwise */
    long step, steps;        /* newest logged step, the config's steps */
    double loss;             /* at step */
    long val_step;           /* the best validation's step; 0 = none */
    double val_loss, val_r2; /* at val_step */
    double tokens_per_s;     /* kiln_run_info's */
    double updated;          /* unix seconds */
    long nonfinite, spikes;  /* events */
    /* The keys compared between runs: run.json's config, nested objects flattened to
     * "outer.inner", and dataset_sha256. Sorted by key; NULL for ERROR rows. */
    json_t *config;
} kiln_run_row;

typedef struct kiln_run_list {
    kiln_run_row *rows; /* sorted, filtered, cut to top */
    size_t n;
    size_t found;          /* runs found under the paths (rows before the filters and top) */
    size_t matched;        /* rows the filters kept (before top) */
    size_t errors;         /* ERROR rows among those found */
    char **error_messages; /* [errors]: theirs, in the order found (the filters may hide
                              their rows; a caller still reports them) */
    /* Over the readable rows the filters kept: the keys every one of them has with one
     * value ({"key": value}), and the others, sorted (["key", ...]). */
    json_t *same, *varied;
    size_t compared; /* how many rows same and varied describe */
} kiln_run_list;

typedef struct kiln_run_list_opts {
    /* "KEY=VALUE" filters on a column (name state step steps loss val_loss val_step val_r2
     * tokens_per_s updated nonfinite spikes) or a config key: rows whose
     * value equals VALUE (a JSON scalar or else a bare word; numbers compare by value, so
     * lr=1e-3 finds 0.001). Different keys must all match; one key given several times
     * matches any of its values. A row that could not be read passes config filters (it
     * cannot be judged, and a list must not hide a broken run); state=... judges it. */
    const char *const *where;
    size_t n_where;
    /* A column or config key, "-KEY" for descending; NULL: val_loss. Rows without a value
     * sort last either way; ties by name (numbers in names by value: lr-2 before lr-10). */
    const char *sort;
    size_t top; /* keep the first top rows; 0 = all */
} kiln_run_list_opts;

/* Find and read the runs under paths: each a run directory (run.json, metrics.db or ckpt/
 * in it) or a directory whose direct children include run directories (other children are
 * skipped). A run that cannot be read is a row in state ERROR, not a failure. Fails with
 * KILN_ERR_USAGE for a path that is neither (naming it), a bad filter or sort key; with
 * KILN_ERR_NOMEM. opts may be NULL. Release with kiln_run_list_release. */
kiln_err kiln_run_list_load(const char *const *paths, size_t n_paths,
                            const kiln_run_list_opts *opts, kiln_run_list *out);
void kiln_run_list_release(kiln_run_list *l);

/* The list as a table for a terminal of width columns (0 = no limit), "now" the unix time
 * ages are measured from: a line of the keys every run shares (cut to width, or to 120
 * columns without a limit: --json has them all), then a row per run with the columns that
 * hold a value and a column per varied key; an ERROR row's message runs on from its state
 * column. Columns are sized to their content; when the table is wider than width, names and
 * long values are shortened in the middle with '…' and the columns least needed to compare
 * runs dropped (updated, tok/s, spikes and nonfin when all 0, val_r2, loss). Caller frees
 * *out. */
kiln_err kiln_run_list_table(const kiln_run_list *l, int width, double now, char **out);
/* Every field of every row as a new JSON document (format "kiln-runs-list/1"; keys in a
 * fixed order, docs/train.md). NULL when out of memory. */
json_t *kiln_run_list_json(const kiln_run_list *l);
/* CSV: a header, then a row per run: the columns, message, then the varied keys; numbers
 * exact. Caller frees *out. */
kiln_err kiln_run_list_csv(const kiln_run_list *l, char **out);

/* One metric of a run over its steps (kiln runs plot). A metric is a column of the steps
 * table (loss, mse, load_balance, z, lr, grad_norm, tokens_per_s, max_abs_output, val_loss,
 * val_r2), a layer's diagnostic NAME@LAYER (attn_entropy, router_entropy, load_imbalance,
 * dead_experts, overflow, act_rms; expert_load@LAYER gives one series per expert), or a
 * tensor's NAME@TENSOR (grad_norm, update_ratio). A step whose value was not finite (SQLite
 * keeps NaN as NULL) is a NAN point; val_loss and val_r2 only have the steps that were
 * evaluated. */
typedef struct kiln_run_series {
    char *name; /* "loss", "router_entropy@1", "expert_load@0/3", "grad_norm@head.w" */
    size_t n;
    double *step, *value;
} kiln_run_series;

/* The series of metric over steps from..to (inclusive) of a run directory: *n_out of them
 * (one, or one per expert), each with at least the steps the run logged there (maybe none).
 * An unknown metric, a layer or tensor the run never logged, or a run without metrics.db
 * fails naming the run directory and the metric. Free with kiln_run_series_free. */
kiln_err kiln_run_series_load(const char *run_dir, const char *metric, long from, long to,
                              kiln_run_series **out, size_t *n_out);
void kiln_run_series_free(kiln_run_series *s, size_t n);
/* What metrics a run logged, in the names kiln_run_series_load takes (the step columns, the
 * layers' diagnostics and their layers, the tensors), as text for people (caller frees). */
kiln_err kiln_run_metrics_list(const char *run_dir, char **out);

/* ---- a run's curves for a picture (kiln runs serve, a release's run summary) ---- */

/* At most this many steps of the layers and tensors tables are read (see below). */
#define KILN_RUN_CURVE_SAMPLES 1000

typedef struct kiln_run_curve {
    char *name; /* as kiln_run_series names it: "loss", "router_entropy@1",
                   "expert_load@0/3", "update_ratio@embed.weight" */
    size_t n;
    double *x, *y; /* x the steps, ascending; y NAN where the value was not finite */
} kiln_run_curve;

typedef struct kiln_run_curves {
    long first, last; /* the steps logged; 0 0: none */
    kiln_run_curve *c;
    size_t n;
    int n_layers, n_experts; /* of the layers table's first step; 0: none logged */
    /* The tensors whose update/weight ratio rose highest over the steps read, highest
     * first: their grad_norm@ and update_ratio@ curves are in c. */
    char **movers;
    size_t n_movers;
    bool sampled;        /* layers and tensors were read at sampled steps */
    bool layers_summed;  /* but the layers' scalar curves (not expert_load) came whole from
                            metrics.db's layer_sums, as the steps table's from step_sums */
    bool tensors_summed; /* and the tensors' curves (the movers by their true highest update
                            ratio) from tensor_sums */
} kiln_run_curves;

/* Every curve a run's page draws, in one read transaction (a trainer writing meanwhile is
 * not slowed: WAL readers take no lock it waits on). The steps table's columns are read
 * whole, each cut to `buckets` buckets of the step range with kiln_downsample (its smallest
 * and largest value, and its first non-finite one: never a mean), so a one-step spike in a
 * million survives. The layers and tensors tables hold a row per layer and per tensor per
 * step (27 million rows for a million steps of the default model): a run of more than
 * KILN_RUN_CURVE_SAMPLES steps has them read at that many evenly spaced steps plus every
 * spike's and non-finite step's (by their keys), so the page costs the same at any length.
 * The steps table's columns are kept in a kiln_rollup each (core.h), so the buckets are
 * powers of two steps wide and what is kept does not depend on when the rows were read.
 * max_movers (0: 8) tensors are chosen as movers. Steps after `to` are left out (0: none).
 * A run without metrics.db fails naming it. Release with kiln_run_curves_release. */
kiln_err kiln_run_curves_load(const char *run_dir, size_t buckets, size_t max_movers, long to,
                              kiln_run_curves *out);
void kiln_run_curves_release(kiln_run_curves *c);

/* What a long-lived reader (kiln runs serve) keeps between reads of the same runs: the steps
 * table's buckets of each of 16 runs (the least recently read given over), so that a reload
 * reads only the rows logged since (a million-step run's full read happens once). A new
 * metrics.db, a resume or fewer steps than before start that run over. Thread-safe. */
typedef struct kiln_run_cache kiln_run_cache;
kiln_err kiln_run_cache_create(kiln_run_cache **out);
void kiln_run_cache_free(kiln_run_cache *c); /* NULL is fine */
/* kiln_run_curves_load (every step) through the cache. */
kiln_err kiln_run_curves_load_cached(kiln_run_cache *cache, const char *run_dir, size_t buckets,
                                     size_t max_movers, kiln_run_curves *out);
/* The curve named name, or NULL. */
const kiln_run_curve *kiln_run_curve_find(const kiln_run_curves *c, const char *name);

/* A run summary (format "kiln-run-summary/1", docs/runs-web.md): the curves above up to
 * `step` (the checkpoint a model was exported from), each at most KILN_RUN_SUMMARY_POINTS
 * points (kiln_downsample), and the run's spikes, non-finite steps, resumes and device
 * changes up to it. Written to path (atomically) as compact JSON with sorted keys and reals
 * to 9 digits, with no time of writing in it: the same run and step give the same bytes.
 * kiln export and kiln release put it in the model directory as run_summary.json, where the
 * manifest lists it and the signature covers it. */
#define KILN_RUN_SUMMARY_POINTS 1000
#define KILN_RUN_SUMMARY_NAME "run_summary.json"
kiln_err kiln_run_summary_write(const char *run_dir, long step, const char *path);
/* As a kiln_export_opts.add_files callback: ctx is the run directory (const char *); writes
 * dir/run_summary.json, or nothing when the run has no metrics.db (nothing was logged). */
kiln_err kiln_run_summary_add(void *run_dir, long step, const char *dir);
/* Of the checkpoint steps[0..n) of run_dir, the one whose step logged the lowest finite
 * validation loss (ties: the later), the rule the trainer's pruning keeps and kiln runs show
 * names as the best checkpoint; KILN_ERR_NOTFOUND when none logged one. What kiln export
 * --best and kiln release --best freeze (kiln_export_opts.best_step). */
kiln_err kiln_run_best_ckpt(const char *run_dir, const long *steps, size_t n, long *best);
/* What a model's card records of the step it was frozen from (kiln_export_opts.step_metrics,
 * export having no SQL of its own): *metrics {"loss": the step's, "val_step", "val_loss",
 * "val_r2": the newest validation at or before step whose loss is finite (the rule
 * kiln_run_best_ckpt ranks by; val_r2 null where it was not)}, a key left out when there is
 * none, and *time the unix time the step was logged (NAN: none). A run without metrics.db gives
 * *metrics NULL. json_decref *metrics. */
kiln_err kiln_run_step_metrics(const char *run_dir, long step, json_t **metrics, double *time);

/* ---- text charts (runs/textchart.c) ---------------------------------------------- */

/* Line charts for a terminal or a log (`kiln runs plot`): ASCII only, so that they read the
 * same in a pager, a CI log and a commit message. Each column of the plot covers a range of
 * x; a series draws its mean there with its glyph over a band of '.' from its minimum to its
 * maximum, so the trend reads through the noise and a one-step spike survives any amount of
 * downsampling (a mean alone would hide it). Two series' means in one cell show '#'. */
typedef struct kiln_run_chart_series {
    const char *label;
    const double *x, *y; /* n points, x ascending; a non-finite y is a gap, counted */
    size_t n;
    char glyph;
} kiln_run_chart_series;

typedef struct kiln_run_chart_mark {
    double x;
    char glyph; /* drawn on the line under the x axis, at x's column */
} kiln_run_chart_mark;

typedef struct kiln_run_chart {
    const char *title;
    const kiln_run_chart_series *series;
    size_t n_series;
    const kiln_run_chart_mark *marks;
    size_t n_marks;
    const char *x_name; /* what x is, for the legend ("step") */
    int width, height;  /* of the plot area, in characters: 10..1000 and 3..200 */
    bool log_y;         /* log10 scale; values <= 0 are then gaps */
} kiln_run_chart;

/* Render into a new NUL-terminated string (caller frees): the title, the plot with the y
 * axis labelled at its top, middle and bottom rows, the x axis labelled at both ends and
 * the middle, the marks line (when there are marks or gaps: a column with a non-finite
 * value gets '!'), and a legend line per series (points, last value, minimum and where). */
kiln_err kiln_run_chart_render(const kiln_run_chart *chart, char **out);

#endif

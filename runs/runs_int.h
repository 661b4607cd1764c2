/* runs_int.h - runs/'s parts shared inside it and with its tests: metrics.db's SQLite handle,
 * the summaries' SQL that the writer (metrics.c) and the readers (curves.c) share, and the
 * readers' helpers. */
#ifndef KILN_RUNS_INT_H
#define KILN_RUNS_INT_H

#include "runs.h"

/* The underlying handle for readers in runs/ (sqlite3 *). */
void *kiln_run_metrics_db(kiln_run_metrics *mx);
/* The steps table summed up as it is logged (step_sums), so that a picture of a long run
 * reads a few thousand rows, not every step: level k holds, per bucket b of
 * KILN_RUN_METRICS_SUM_WIDTH(k) steps ([b * width, (b + 1) * width)) and per column of
 * kiln_run_metrics_sum_cols (col: its index), what kiln_rollup_span keeps (the smallest and
 * largest finite value, the first non-finite one, the first and last finite ones; never a
 * mean). A bucket is written once a later step is logged; step_sums_done(level, upto) says
 * every bucket below upto is there. val_loss and val_r2 count only at steps whose val_loss
 * is not NULL (those evaluated). A metrics.db logged before has no step_sums_done: readers
 * read its steps table. */
#define KILN_RUN_METRICS_SUM_LEVELS 14
#define KILN_RUN_METRICS_SUM_WIDTH(k) (16L << (k))
#define KILN_RUN_METRICS_SUM_COLS 10
#define KILN_RUN_METRICS_SUM_VAL 6 /* val_loss; val_r2 the next */
extern const char *const kiln_run_metrics_sum_cols[KILN_RUN_METRICS_SUM_COLS];
/* The layers table's scalar columns (attn_entropy, router_entropy, load_imbalance,
 * dead_experts, overflow, act_rms) summed up the same way per layer: layer_sums(level,
 * bucket, layer, col, minx .. bady) and layer_sums_done, written with step_sums (same levels,
 * same transaction, truncated with it). A metrics.db logged before has no layer_sums_done
 * rows: readers sample its layers table. */
#define KILN_RUN_METRICS_LAYER_COLS 6
#define KILN_RUN_METRICS_SUM_LAYERS 4096 /* layers past this are not summed up */
/* The tensors table's grad_norm and update_ratio summed up the same way per tensor:
 * tensor_sums(level, bucket, tensor, col, minx .. bady) and tensor_sums_done, a tensor being
 * tensor_names' id of its name (given when its rows are first summed up, kept on a resume).
 * A metrics.db logged before has no tensor_sums_done rows: readers sample its tensors. */
#define KILN_RUN_METRICS_TENSOR_COLS 2
enum {
    KILN_RUN_METRICS_STEP_SUMS,
    KILN_RUN_METRICS_LAYER_SUMS,
    KILN_RUN_METRICS_TENSOR_SUMS,
    KILN_RUN_METRICS_SUMS
};
/* A summary's SQL, shared by its writer (metrics.c) and its reader (curves.c). A series is
 * layer * per + col. */
typedef struct kiln_run_metrics_sums {
    const char *names; /* NULL, or run first on step in [?1, ?2) to give the rows' series ids */
    const char *rows;  /* the table's rows, step in [?1, ?2): step[, layer], the per columns */
    const char *sums;  /* level ?1's buckets in [?2, ?3): bucket, series, minx .. bady */
    const char *ins;   /* a row: ?1 level, ?2 bucket, ?3 col, ?4 .. ?13 minx .. bady, ?14 layer */
    const char *done;  /* level, upto */
    const char *set;   /* ?1 level, ?2 upto */
    const char *last;  /* the table's last step (0: none) */
    int per;           /* columns per row */
    int val;           /* the validation column (counted only where it is not NULL), or -1 */
    bool layered;      /* rows carry their layer (tensor id) after the step */
} kiln_run_metrics_sums;
const kiln_run_metrics_sums *kiln_run_metrics_sums_of(int which);
/* Column c of a row of k->rows: its series (*y its value), or -1 when it does not count. */
struct sqlite3_stmt;
long kiln_run_metrics_sum_value(const kiln_run_metrics_sums *k, struct sqlite3_stmt *st, int c,
                                double *y);
/* A run's metrics for reading (runs.c): run_dir must hold a readable run.json (so that a
 * directory that is no run says so; *run gets it when run is not NULL, json_decref) and a
 * metrics.db (kiln_run_metrics_close). */
kiln_err kiln_run_open_metrics(const char *run_dir, json_t **run, kiln_run_metrics **mx);
/* A column of a metrics.db row as a number; NAN for NULL (a value that was not finite when
 * logged). (metrics.c, which writes them so) */
struct sqlite3_stmt;
double kiln_run_col_num(struct sqlite3_stmt *s, int i);
/* A step_sums row's columns from `at` on (minx .. bady) as the span [x0, x0 + width).
 * (metrics.c) */
void kiln_run_metrics_sum_span(struct sqlite3_stmt *st, int at, double x0, double width,
                               kiln_rollup_span *sp);

#endif

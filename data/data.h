/*
 * data.h - datasets (docs/data.md): the file format and its loader (data/dataset.c), the
 * train/validation split, the CSV import (data/csv.c), the time column (data/timecol.c) and
 * the synthetic market (data/synth.c). A module of its own below train/, so that every user
 * of a dataset (train/, validate/, sweep/, release/, cli/) reaches it without the trainer.
 * Uses core only. Everything returns kiln_err; nothing prints or exits.
 */
#ifndef KILN_DATA_H
#define KILN_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

/* A dataset file (docs/data.md): safetensors with `features` [N,F] f32 and `targets` [N,O]
 * f32, rows in time order; __metadata__ may hold `kiln.columns`, a JSON object
 * {"features": [names], "targets": [names]}. */
typedef struct kiln_dataset {
    size_t rows;
    int n_features, n_outputs;
    float *features;              /* [rows, F], aligned copy */
    float *targets;               /* [rows, O], aligned copy */
    char sha256[KILN_SHA256_HEX]; /* digest of the file's bytes */
    char *path;
    json_t *columns; /* NULL or {"features": [...], "targets": [...]} */
    /* Optional (kiln data import --time / --group; docs/data.md): */
    int64_t *time;      /* [rows] seconds since 1970 (tensor `time`, I64), or NULL */
    int32_t *group;     /* [rows] group index (tensor `group`, I32), or NULL; a group's rows are
                           contiguous, groups in order of first appearance */
    int n_groups;       /* 0 without groups */
    json_t *time_meta;  /* NULL or kiln.time: {"column": name} */
    json_t *group_meta; /* NULL or kiln.groups: {"column": name, "names": [n_groups]} */
} kiln_dataset;

/* Open and validate: both tensors present, F32, 2-D, same row count, at least one row,
 * every value finite (a NaN or infinity is an error naming the tensor, row and column).
 * Free with kiln_dataset_free. */
kiln_err kiln_dataset_open(const char *path, kiln_dataset **out);
void kiln_dataset_free(kiln_dataset *ds);
/* Whether path may take a dataset: nothing is there, or a dataset (a safetensors file with
 * 'features' and 'targets') that the new one replaces. Anything else (the CSV being imported,
 * another file, a directory, a link) is KILN_ERR_CONFLICT naming it: writing a dataset never
 * replaces a file that is not one. kiln_dataset_write checks it; import and synth check it
 * first too, before any work. */
kiln_err kiln_dataset_out_ok(const char *path);
/* Write a dataset atomically; columns may be NULL. An existing path must be a dataset
 * (kiln_dataset_out_ok). */
kiln_err kiln_dataset_write(const char *path, size_t rows, int n_features, int n_outputs,
                            const float *features, const float *targets, const json_t *columns);

/* Train and validation splits, contiguous in time: training rows [0, train_end), a purge
 * gap of at least seq_len rows, then validation rows [val_begin, rows). With
 * val_fraction 0 there is no validation split (val_begin == val_end == rows). */
typedef struct kiln_split_range {
    size_t train_begin, train_end; /* training rows [train_begin, train_end) */
    size_t val_begin, val_end;     /* validation rows */
} kiln_split_range;
typedef struct kiln_split {
    size_t train_end;
    size_t val_begin, val_end;
    /* With groups (kiln data import --group): each group's rows split alike, in ranges[g]
     * (owned: kiln_split_release); train_end, val_begin and val_end are then 0. Without
     * groups: NULL, the one range above. */
    kiln_split_range *ranges;
    size_t n_ranges;
    size_t train_rows, val_rows, gap_rows; /* totals over the ranges; gap_rows per range */
    bool by_time;                          /* the validation starts at a time: val_from */
    int64_t val_from;                      /* (by_time) */
} kiln_split;
kiln_err kiln_dataset_split(const kiln_dataset *ds, double val_fraction, int seq_len,
                            kiln_split *out);
/* How a split is asked for (config keys val_fraction, val_from, purge_rows, purge_time). */
typedef struct kiln_split_opts {
    double val_fraction;
    int seq_len;
    const char *val_from; /* NULL or "": by val_fraction; else a time (kiln_time_parse): the
                             validation rows are those at or after it (needs a time column) */
    long purge_rows;      /* the gap in rows: at least seq_len (0: seq_len) */
    int64_t purge_secs;   /* and at least this long in time before val_from (needs time) */
} kiln_split_opts;
/* The split of ds as o asks; with groups every group is split at the same time (val_from,
 * or the time at which val_fraction of all rows are later), or at its own val_fraction
 * without a time column. Release with kiln_split_release. */
kiln_err kiln_dataset_split_ex(const kiln_dataset *ds, const kiln_split_opts *o, kiln_split *out);
void kiln_split_release(kiln_split *sp);
/* The split's ranges: sp->ranges, or the one range of a split without groups in *one. */
const kiln_split_range *kiln_split_ranges(const kiln_split *sp, kiln_split_range *one, size_t *n);
/* The fixed validation windows: up to cap non-overlapping windows of seq_len rows spread
 * evenly over the validation rows (over each group's, in proportion to its rows); starts
 * [cap] filled. Returns the count (0 if none fits). */
size_t kiln_split_val_windows(const kiln_split *sp, int seq_len, size_t cap, size_t *starts);

/* kiln_dataset_open with options: KILN_DATASET_ALLOW_NONFINITE keeps NaN and infinity
 * (for inspection; a trainer must use kiln_dataset_open). Free with kiln_dataset_free. */
enum { KILN_DATASET_ALLOW_NONFINITE = 1 };
kiln_err kiln_dataset_open_ex(const char *path, unsigned flags, kiln_dataset **out);
/* As kiln_dataset_write, with more __metadata__ entries: meta is NULL or a JSON object
 * whose values are stored as canonical JSON text under their keys ("kiln.synth"). Every
 * value must be finite; columns must name F features and O targets, each once. */
kiln_err kiln_dataset_write_meta(const char *path, size_t rows, int n_features, int n_outputs,
                                 const float *features, const float *targets, const json_t *columns,
                                 const json_t *meta);
/* A dataset's optional time and group columns, for kiln_dataset_write_extra. */
typedef struct kiln_dataset_extra {
    const int64_t *time;     /* [rows] or NULL; non-decreasing within each group */
    const char *time_column; /* its CSV name */
    const int32_t *group;    /* [rows] or NULL: 0, then each row the same or the next index */
    int n_groups;
    const char *const *group_names; /* [n_groups] */
    const char *group_column;
} kiln_dataset_extra;
/* kiln_dataset_write_meta with the time and group tensors of x (NULL: none, and the bytes
 * are those of kiln_dataset_write_meta). */
kiln_err kiln_dataset_write_extra(const char *path, size_t rows, int n_features, int n_outputs,
                                  const float *features, const float *targets,
                                  const json_t *columns, const json_t *meta,
                                  const kiln_dataset_extra *x);
/* The time and group tensors' rules, as kiln_dataset_open checks them and the writer before
 * it writes: group (NULL: none) 0, 1, ... in contiguous runs of rows, the last n_groups - 1;
 * time (NULL: none) in [KILN_TIME_MIN, KILN_TIME_MAX] and non-decreasing within each group.
 * The first row that breaks one is an error of code naming path and the row. */
kiln_err kiln_dataset_check_extra(const char *path, size_t rows, const int64_t *time,
                                  const int32_t *group, int n_groups, kiln_err code);
/* The times kiln takes, in epoch seconds: the years 0000 to 9999, 0000-01-01T00:00:00Z to
 * 9999-12-31T23:59:59Z. Bounded so that the difference of any two, and a purge gap taken
 * from one, stay far inside int64 (epoch seconds at int64's ends made inspect print year
 * 292277026596 and a negative step). Import and kiln_dataset_open refuse times outside. */
#define KILN_TIME_MIN (-62167219200LL)
#define KILN_TIME_MAX 253402300799LL

/* A time as kiln data import reads it: an ISO 8601 date (1985-01-02) or date-time
 * (1985-01-02T15:30:00Z, with an optional fraction, Z or offset; a space may stand for T),
 * or epoch seconds (an integer), in [KILN_TIME_MIN, KILN_TIME_MAX]. false when it is none
 * of those. */
bool kiln_time_parse(const char *s, int64_t *out);
/* "1985-01-02" at midnight UTC, else "1985-01-02T15:30:00Z"; a t outside [KILN_TIME_MIN,
 * KILN_TIME_MAX] as "epoch T" (a dataset refuses such times; the format never overflows). */
void kiln_time_format(int64_t t, char out[32]);
/* A duration: an integer and d, h, m or s (no unit: seconds), at most the span of the times
 * kiln takes (KILN_TIME_MAX - KILN_TIME_MIN). */
bool kiln_duration_parse(const char *s, int64_t *out);
/* The largest whole unit: "3d", "36h", "90s". */
void kiln_duration_format(int64_t secs, char out[32]);

/* The steps of a dataset's time column, as kiln data inspect shows them (docs/data.md): a
 * step is the time from one row to the next of the same group. A gap is a step clearly
 * longer than the usual one: longer than 5/4 of the usual step (the 99th percentile of the
 * steps, so that a pattern that recurs, a business week's weekend or a market's night, is
 * usual) and at least twice the median (room for one missing row). So a calendar-daily or
 * 24/7 hourly series has no gaps until a row is missing, business-daily data none at its
 * weekends, and an irregular series none in its spread. Business-daily data (a median step
 * of one day and no row on a Saturday or a Sunday, UTC) is measured in weekdays instead: a
 * step that skips a weekday is a gap, a midweek holiday (2d, shorter than the weekends) as
 * much as a closure beside a weekend. Steps are unsigned: the times' extremes do not
 * overflow them. */
#define KILN_TIME_TOP_GAPS 5
typedef struct kiln_time_steps {
    int64_t first, last;            /* the earliest and the latest time */
    size_t n;                       /* steps (0: no two rows of a group) */
    uint64_t median;                /* the lower median (a step that occurs) */
    uint64_t usual;                 /* the 99th percentile (a step that occurs) */
    size_t n_gaps;                  /* steps that are gaps */
    size_t top[KILN_TIME_TOP_GAPS]; /* the rows that end the largest gaps, largest first,
                                       ties the earlier row */
    size_t n_top;
    bool business; /* business-daily: a gap is a step that skips a weekday */
} kiln_time_steps;
/* Whether step is a gap among steps of that median and usual length. */
bool kiln_time_step_is_gap(uint64_t step, uint64_t median, uint64_t usual);
/* Whether the step ending row r (r > 0) of ds is a gap under ts's rule. */
bool kiln_time_row_is_gap(const kiln_dataset *ds, const kiln_time_steps *ts, size_t r);
/* The steps of ds (which must have a time column). KILN_ERR_NOMEM, else KILN_OK. */
kiln_err kiln_time_steps_of(const kiln_dataset *ds, kiln_time_steps *out);

/* The name of feature (target false) or target (target true) column i: from kiln.columns,
 * else "feature[i]" / "target[i]" formatted into buf. Returns a pointer valid while ds
 * and buf are. */
const char *kiln_dataset_column(const kiln_dataset *ds, bool target, int i, char *buf, size_t len);

/* One column's summary: moments over its finite values (population std), NaN when it
 * has none; non-finite values are counted, not summed. */
typedef struct kiln_column_stats {
    double mean, std, min, max;
    size_t n_nan, n_inf;
} kiln_column_stats;
/* stats[0..F) for the features, stats[F..F+O) for the targets. */
void kiln_dataset_stats(const kiln_dataset *ds, kiln_column_stats *stats);

/* What import does with a missing value (an empty field, NA, NaN) in a chosen column. */
typedef enum kiln_missing {
    KILN_MISSING_REFUSE = 0, /* the first one is an error naming its line and column */
    KILN_MISSING_DROP = 1,   /* the row is left out */
    KILN_MISSING_FFILL = 2,  /* the column's value in the last row kept (none: an error) */
    KILN_MISSING_ZERO = 3    /* 0 */
} kiln_missing;

typedef struct kiln_csv_import {
    const char *csv_path, *out_path;
    const char *const *features; /* [n_features] column names, in dataset order */
    int n_features;
    const char *const *targets; /* [n_outputs] */
    int n_outputs;
    kiln_missing missing;
    const char *time_column;  /* NULL, or a column of times (kiln_time_parse): tensor `time` */
    const char *group_column; /* NULL, or a column naming each row's instrument: rows are
                                 grouped (stably, in order of first appearance) */
} kiln_csv_import;

/* What an import did: data rows read, rows written, rows dropped, rows with filled values
 * and the values filled (ffill, zero). */
typedef struct kiln_csv_report {
    size_t rows_read, rows, rows_dropped, rows_filled, values_filled;
    int n_groups;
} kiln_csv_report;

/* Import a CSV file (RFC 4180 through libcsv: quoted fields, embedded commas, quotes and
 * line breaks, CRLF) with a header row: the named columns become the features and the
 * targets, in the order given, and kiln.columns records the names. Read line by line
 * (memory holds the f32 values, not the text). Every value must be a finite number or, as
 * o->missing says, a missing one; an error names the file, the line and the column. The
 * output is written atomically: on any error an existing file there is left as it was.
 * report may be NULL. */
kiln_err kiln_dataset_import_csv_ex(const kiln_csv_import *o, kiln_csv_report *report);
/* A column name as a CSV header field, for kiln data export: quoted as RFC 4180 says when
 * it holds a comma, a quote (doubled inside), CR or LF, and with a ' before a name that
 * begins with =, +, - or @, so that a spreadsheet opening the file reads a name, not a
 * formula (OWASP's advice for CSV injection). NULL: out of memory. Caller frees. */
char *kiln_csv_header_field(const char *name);
/* kiln_dataset_import_csv_ex with missing values refused. */
kiln_err kiln_dataset_import_csv(const char *csv_path, const char *const *features, int n_features,
                                 const char *const *targets, int n_outputs, const char *out_path);

/* The synthetic market (data/synth.c, where the process is documented). */
typedef struct kiln_synth_opts {
    uint64_t seed;
    size_t rows;
    int n_features; /* >= KILN_SYNTH_MIN_FEATURES; the rest are noise */
    int n_outputs;  /* target k is the forward return over 2^k steps */
    double scale;   /* the targets' standard deviation over the file; 0 = 1 */
} kiln_synth_opts;
#define KILN_SYNTH_MIN_FEATURES 4
#define KILN_SYNTH_MAX_FEATURES 1024
#define KILN_SYNTH_MAX_OUTPUTS 8
#define KILN_SYNTH_MIN_ROWS 100
/* R^2 over the validation split (the last 20% of rows), per target: */
typedef struct kiln_synth_r2 {
    double oracle[KILN_SYNTH_MAX_OUTPUTS];   /* E[target | past and present, true regime] */
    double filtered[KILN_SYNTH_MAX_OUTPUTS]; /* E[target | past and present observables] */
    double linear[KILN_SYNTH_MAX_OUTPUTS];   /* least squares on the current row, fit on the
                                                first 80% */
} kiln_synth_r2;
/* Generate and write a dataset (with kiln.columns and kiln.synth) to path atomically;
 * r2 may be NULL. The same options give the same bytes. */
kiln_err kiln_synth_write(const kiln_synth_opts *opts, const char *path, kiln_synth_r2 *r2);

/* ---- kiln.h's datasets for bindings (data/data_api.c, data/time_api.c) ---- */

/* kiln.h's kiln_data handle: one loaded dataset. */
struct kiln_data {
    kiln_dataset *ds;
};
/* {"features": [F names], "targets": [O names]} for kiln_dataset_write in *out, NULL when
 * neither fn nor tn is given; one without the other, or a name not UTF-8, is refused naming
 * path. */
kiln_err kiln_data_names_json(const char *path, int F, int O, const char *const *fn,
                              const char *const *tn, json_t **out);

#endif /* KILN_DATA_H */

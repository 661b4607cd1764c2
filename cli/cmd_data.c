/* cmd_data.c - kiln data synth | import | inspect: make, convert and look at datasets. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "data.h"

int cmd_data_synth(int argc, char **argv) {
    uint64_t seed = 0;
    long rows = 0, features = 0, outputs = 0;
    double scale = 1;
    const char *out = NULL;
    const cli_opt opts[] = {
        {"seed", CLI_U64, &seed, "S", "random seed", true},
        {"rows", CLI_INT, &rows, "N", "rows (time steps)", true},
        {"features", CLI_INT, &features, "F", "feature columns (at least 4; the rest are noise)",
         true},
        {"outputs", CLI_INT, &outputs, "O", "targets: forward returns over 1, 2, 4, ... steps",
         true},
        {"out", CLI_STR, &out, "FILE", "dataset to write (safetensors)", true},
        {"scale", CLI_DBL, &scale, "S", "the targets' standard deviation (default 1)", false},
        {0},
    };
    const cli_spec spec = {
        "kiln data synth --seed S --rows N --features F --outputs O --out FILE [--scale S]",
        "Write a deterministic synthetic market (regime-switching volatility, order flow,\n"
        "momentum, mean reversion) and print the best achievable R^2 per target.",
        opts, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) return rc;
    if (rows < 1) return cli_usage_error("--rows must be positive, not %ld", rows);
    if (features < 1 || features > KILN_SYNTH_MAX_FEATURES)
        return cli_usage_error("--features must be %d to %d, not %ld", KILN_SYNTH_MIN_FEATURES,
                               KILN_SYNTH_MAX_FEATURES, features);
    if (outputs < 1 || outputs > KILN_SYNTH_MAX_OUTPUTS)
        return cli_usage_error("--outputs must be 1 to %d, not %ld", KILN_SYNTH_MAX_OUTPUTS,
                               outputs);
    if (!(scale > 0 && scale <= 1e30))
        return cli_usage_error("--scale must be positive and at most 1e30, not %g", scale);
    kiln_synth_opts o = {.seed = seed,
                         .rows = (size_t)rows,
                         .n_features = (int)features,
                         .n_outputs = (int)outputs,
                         .scale = scale};
    kiln_synth_r2 r2;
    kiln_err err = kiln_synth_write(&o, out, &r2);
    if (err) return cli_fail(err);
    fprintf(stderr, "kiln: wrote '%s': %ld rows, %ld features, %ld targets\n", out, rows, features,
            outputs);
    fprintf(stderr, "R^2 over the validation split (last 20%% of rows):\n");
    fprintf(stderr, "  %-12s %8s %8s %8s\n", "target", "oracle", "filtered", "linear");
    for (int k = 0; k < o.n_outputs; k++) {
        char h[24];
        snprintf(h, sizeof h, "fwd_ret_%d", 1 << k);
        fprintf(stderr, "  %-12s %8.4f %8.4f %8.4f\n", h, r2.oracle[k], r2.filtered[k],
                r2.linear[k]);
    }
    fprintf(stderr,
            "  oracle: knows the hidden regime (upper bound); filtered: Bayes-optimal from the\n"
            "  observable past; linear: least squares on the current row\n");
    return 0;
}

/* Split "a,b,c" into names (pointing into a copy the caller frees with *buf). */
static int split_names(const char *opt, const char *list, const char ***names, int *n, char **buf) {
    *names = NULL;
    *n = 0;
    *buf = strdup(list);
    if (!*buf) return cli_usage_error("out of memory");
    int cap = 1;
    for (const char *p = list; *p; p++)
        cap += *p == ',';
    *names = calloc((size_t)cap, sizeof **names);
    if (!*names) return cli_usage_error("out of memory");
    for (char *s = *buf, *e;; s = e + 1) {
        e = strchr(s, ',');
        if (e) *e = 0;
        if (!*s) return cli_usage_error("--%s: empty column name in '%s'", opt, list);
        (*names)[(*n)++] = s;
        if (!e) break;
    }
    return 0;
}

int cmd_data_import(int argc, char **argv) {
    const char *csv = NULL, *feat = NULL, *targ = NULL, *out = NULL, *missing = NULL,
               *time_col = NULL, *group_col = NULL;
    const cli_opt opts[] = {
        {"csv", CLI_STR, &csv, "FILE", "CSV file with a header row (RFC 4180)", true},
        {"features", CLI_STR, &feat, "a,b,c", "columns that become the features, in this order",
         true},
        {"targets", CLI_STR, &targ, "x,y", "columns that become the targets, in this order", true},
        {"out", CLI_STR, &out, "FILE", "dataset to write (safetensors)", true},
        {"missing", CLI_STR, &missing, "HOW",
         "missing values (empty, NA, NaN): refuse (default), drop the row, ffill (the column's "
         "last value), zero",
         false},
        {"time", CLI_STR, &time_col, "COLUMN",
         "a column of times (ISO 8601 date or date-time, or epoch seconds), kept as tensor 'time'",
         false},
        {"group", CLI_STR, &group_col, "COLUMN",
         "a column naming each row's instrument: windows never cross instruments", false},
        {0},
    };
    const cli_spec spec = {"kiln data import --csv FILE --features a,b,c --targets x,y --out FILE "
                           "[--missing refuse|drop|ffill|zero] [--time COLUMN] [--group COLUMN]",
                           "Convert a CSV file (rows in time order) into a dataset.", opts, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) return rc;
    static const char *const policies[] = {"refuse", "drop", "ffill", "zero"};
    kiln_csv_import o = {.csv_path = csv,
                         .out_path = out,
                         .missing = KILN_MISSING_REFUSE,
                         .time_column = time_col,
                         .group_column = group_col};
    if (missing) {
        int k = 0;
        while (k < 4 && strcmp(missing, policies[k]))
            k++;
        if (k == 4)
            return cli_usage_error("--missing must be refuse, drop, ffill or zero, not '%s'",
                                   missing);
        o.missing = (kiln_missing)k;
    }
    const char **fn = NULL, **tn = NULL;
    char *fb = NULL, *tb = NULL;
    int nf = 0, nt = 0;
    rc = split_names("features", feat, &fn, &nf, &fb);
    if (!rc) rc = split_names("targets", targ, &tn, &nt, &tb);
    if (!rc) {
        o.features = fn, o.n_features = nf, o.targets = tn, o.n_outputs = nt;
        kiln_csv_report r;
        kiln_err err = kiln_dataset_import_csv_ex(&o, &r);
        if (err) {
            rc = cli_fail(err);
        } else {
            fprintf(stderr, "kiln: wrote '%s': %zu rows, %d features, %d targets", out, r.rows, nf,
                    nt);
            if (group_col) fprintf(stderr, ", %d groups", r.n_groups);
            fprintf(stderr, "\n");
            if (o.missing == KILN_MISSING_DROP)
                fprintf(stderr, "kiln: --missing drop: dropped %zu of %zu rows\n", r.rows_dropped,
                        r.rows_read);
            else if (o.missing != KILN_MISSING_REFUSE)
                fprintf(stderr, "kiln: --missing %s: filled %zu values in %zu of %zu rows\n",
                        policies[o.missing], r.values_filled, r.rows_filled, r.rows_read);
        }
    }
    free(fn);
    free(tn);
    free(fb);
    free(tb);
    return rc;
}

static json_t *num(double v) {
    return isfinite(v) ? json_real(v) : json_null();
}

/* Seconds as JSON: a step longer than int64 (between the times' extremes) is clamped. */
static json_t *secs_json(uint64_t s) {
    return json_integer(s > INT64_MAX ? INT64_MAX : (json_int_t)s);
}

static void dur_format(uint64_t s, char out[32]) {
    kiln_duration_format(s > INT64_MAX ? INT64_MAX : (int64_t)s, out);
}

/* The gap rule of time_json's object in words (kiln_time_steps, data.h). */
static void gap_rule(const json_t *tj, char out[160]) {
    if (!strcmp(json_string_value(json_object_get(tj, "gap_rule")), "weekdays"))
        snprintf(out, 160,
                 "business-daily, no row on a weekend: a gap is a step that skips a "
                 "weekday");
    else
        snprintf(out, 160,
                 "a gap is a step over 5/4 of the usual %s (the 99th percentile) and at least "
                 "twice the median",
                 json_string_value(json_object_get(tj, "usual_step")));
}

/* The time column: first, last, median and usual step and the largest gaps (data.h,
 * kiln_time_steps), steps taken between rows of the same group. NULL when out of memory
 * (or no time column). */
static json_t *time_json(const kiln_dataset *ds) {
    kiln_time_steps ts;
    if (!ds->time || kiln_time_steps_of(ds, &ts)) return NULL;
    char a[32], b[32], c[32], u[32];
    json_t *gaps = json_array();
    for (size_t k = 0; gaps && k < ts.n_top; k++) {
        size_t r = ts.top[k];
        kiln_time_format(ds->time[r - 1], a);
        kiln_time_format(ds->time[r], b);
        json_t *gname = ds->group ? json_array_get(json_object_get(ds->group_meta, "names"),
                                                   (size_t)ds->group[r])
                                  : NULL;
        json_array_append_new(
            gaps, json_pack("{s:s,s:s,s:o,s:I,s:O}", "from", a, "to", b, "seconds",
                            secs_json((uint64_t)ds->time[r] - (uint64_t)ds->time[r - 1]), "row",
                            (json_int_t)r, "group", gname ? gname : json_null()));
    }
    kiln_time_format(ts.first, a);
    kiln_time_format(ts.last, b);
    dur_format(ts.median, c);
    dur_format(ts.usual, u);
    return gaps ? json_pack("{s:O,s:s,s:s,s:o,s:s,s:o,s:s,s:s,s:I,s:o}", "column",
                            json_object_get(ds->time_meta, "column"), "first", a, "last", b,
                            "median_step_seconds", secs_json(ts.median), "median_step", c,
                            "usual_step_seconds", secs_json(ts.usual), "usual_step", u, "gap_rule",
                            ts.business ? "weekdays" : "steps", "gaps_total", (json_int_t)ts.n_gaps,
                            "gaps", gaps)
                : NULL;
}

/* [{name, rows}] of the groups. */
static json_t *groups_json(const kiln_dataset *ds) {
    json_t *a = json_array();
    const json_t *names = json_object_get(ds->group_meta, "names");
    size_t r = 0;
    for (int g = 0; a && g < ds->n_groups; g++) {
        size_t b = r;
        while (r < ds->rows && ds->group[r] == g)
            r++;
        json_array_append_new(a, json_pack("{s:O,s:I}", "name", json_array_get(names, (size_t)g),
                                           "rows", (json_int_t)(r - b)));
    }
    return a;
}

int cmd_data_inspect(int argc, char **argv) {
    bool as_json = false;
    const cli_opt opts[] = {
        {"json", CLI_FLAG, &as_json, NULL, "print JSON instead of a table", false},
        {0},
    };
    const cli_spec spec = {
        "kiln data inspect [--json] FILE",
        "Show a dataset's shape, column statistics and sha256. NaN and infinity are\n"
        "counted, not refused; statistics are over the finite values.",
        opts, 1, 1};
    const char *path;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &path, &rc)) return rc;
    kiln_dataset *ds;
    kiln_err err = kiln_dataset_open_ex(path, KILN_DATASET_ALLOW_NONFINITE, &ds);
    if (err) return cli_fail(err);
    int F = ds->n_features, O = ds->n_outputs;
    kiln_column_stats *st = calloc((size_t)(F + O), sizeof *st);
    if (!st) {
        kiln_dataset_free(ds);
        return cli_usage_error("out of memory");
    }
    kiln_dataset_stats(ds, st);
    size_t bad = 0;
    for (int c = 0; c < F + O; c++)
        bad += st[c].n_nan + st[c].n_inf;
    char buf[32];
    if (as_json) {
        json_t *cols = json_array();
        for (int c = 0; c < F + O; c++) {
            bool t = c >= F;
            json_array_append_new(
                cols, json_pack("{s:s,s:s,s:o,s:o,s:o,s:o,s:I,s:I}", "name",
                                kiln_dataset_column(ds, t, t ? c - F : c, buf, sizeof buf), "kind",
                                t ? "target" : "feature", "mean", num(st[c].mean), "std",
                                num(st[c].std), "min", num(st[c].min), "max", num(st[c].max), "nan",
                                (json_int_t)st[c].n_nan, "inf", (json_int_t)st[c].n_inf));
        }
        json_t *j =
            json_pack("{s:s,s:s,s:I,s:i,s:i,s:o}", "path", path, "sha256", ds->sha256, "rows",
                      (json_int_t)ds->rows, "n_features", F, "n_outputs", O, "columns", cols);
        if (j && ds->time) json_object_set_new(j, "time", time_json(ds));
        if (j && ds->group) json_object_set_new(j, "groups", groups_json(ds));
        rc = cli_print_json(j, JSON_INDENT(2) | JSON_SORT_KEYS);
        json_decref(j);
    } else {
        printf("file      %s\nsha256    %s\nrows      %zu\nfeatures  %d\ntargets   %d\n", path,
               ds->sha256, ds->rows, F, O);
        json_t *tj = time_json(ds), *gj = ds->group ? groups_json(ds) : NULL;
        if (tj) {
            printf("time      column '%s': %s to %s, median step %s\n",
                   json_string_value(json_object_get(tj, "column")),
                   json_string_value(json_object_get(tj, "first")),
                   json_string_value(json_object_get(tj, "last")),
                   json_string_value(json_object_get(tj, "median_step")));
            size_t i;
            json_t *g;
            const json_int_t ngaps = json_integer_value(json_object_get(tj, "gaps_total"));
            char rule[160];
            gap_rule(tj, rule);
            if (!ngaps) printf("gaps      none (%s)\n", rule);
            json_array_foreach(json_object_get(tj, "gaps"), i, g) {
                char dur[32];
                kiln_duration_format(json_integer_value(json_object_get(g, "seconds")), dur);
                const char *gn = json_string_value(json_object_get(g, "group"));
                printf("%s %s to %s (%s, row %lld%s%s)\n", i ? "         " : "gaps     ",
                       json_string_value(json_object_get(g, "from")),
                       json_string_value(json_object_get(g, "to")), dur,
                       (long long)json_integer_value(json_object_get(g, "row")), gn ? ", " : "",
                       gn ? gn : "");
            }
            if (ngaps) printf("          %lld in all (%s)\n", (long long)ngaps, rule);
        }
        if (gj) {
            printf("groups    %d in column '%s':", ds->n_groups,
                   json_string_value(json_object_get(ds->group_meta, "column")));
            size_t i;
            json_t *g;
            json_array_foreach(gj, i, g) {
                printf("%s %s %lld rows", i ? "," : "",
                       json_string_value(json_object_get(g, "name")),
                       (long long)json_integer_value(json_object_get(g, "rows")));
            }
            printf("\n");
        }
        json_decref(tj);
        json_decref(gj);
        printf("\n");
        printf("%-8s %-20s %12s %12s %12s %12s %8s %8s\n", "kind", "column", "mean", "std", "min",
               "max", "nan", "inf");
        for (int c = 0; c < F + O; c++) {
            bool t = c >= F;
            printf("%-8s %-20s %12.5g %12.5g %12.5g %12.5g %8zu %8zu\n", t ? "target" : "feature",
                   kiln_dataset_column(ds, t, t ? c - F : c, buf, sizeof buf), st[c].mean,
                   st[c].std, st[c].min, st[c].max, st[c].n_nan, st[c].n_inf);
        }
        if (bad) printf("\n%zu non-finite values: kiln train refuses this file\n", bad);
    }
    free(st);
    kiln_dataset_free(ds);
    return rc;
}

int cmd_data_export(int argc, char **argv) {
    long from = 0, rows = -1;
    bool features_only = false;
    const cli_opt opts[] = {
        {"from", CLI_INT, &from, "R", "first row (0-based; default 0)", false},
        {"rows", CLI_INT, &rows, "N", "rows to write (default: to the end)", false},
        {"features-only", CLI_FLAG, &features_only, NULL,
         "write only the feature columns (ticks for stream_service)", false},
        {0},
    };
    const cli_spec spec = {
        "kiln data export FILE [--from R] [--rows N] [--features-only]",
        "Write a dataset's rows as CSV on stdout, with a header row; the reverse of\n"
        "'kiln data import' (%.9g keeps every f32 exact).",
        opts, 1, 1};
    const char *path;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &path, &rc)) return rc;
    if (from < 0) return cli_usage_error("--from must not be negative");
    kiln_dataset *ds;
    kiln_err err = kiln_dataset_open(path, &ds);
    if (err) return cli_fail(err);
    size_t end = ds->rows;
    if ((size_t)from > ds->rows) {
        kiln_dataset_free(ds);
        return cli_usage_error("--from %ld is past the %zu rows of '%s'", from, ds->rows, path);
    }
    if (rows >= 0 && (size_t)from + (size_t)rows < end) end = (size_t)from + (size_t)rows;
    char name[128];
    int nt = features_only ? 0 : ds->n_outputs;
    for (int c = 0; c < ds->n_features + nt; c++) {
        bool t = c >= ds->n_features;
        /* Quoted as RFC 4180 says, and never a spreadsheet formula (kiln_csv_header_field). */
        char *field = kiln_csv_header_field(
            kiln_dataset_column(ds, t, t ? c - ds->n_features : c, name, sizeof name));
        if (!field) {
            kiln_dataset_free(ds);
            return cli_fail(kiln_fail(KILN_ERR_NOMEM, "out of memory exporting '%s'", path));
        }
        printf("%s%s", c ? "," : "", field);
        free(field);
    }
    putchar('\n');
    for (size_t r = (size_t)from; r < end; r++) {
        for (int c = 0; c < ds->n_features; c++)
            printf("%s%.9g", c ? "," : "",
                   (double)ds->features[r * (size_t)ds->n_features + (size_t)c]);
        for (int c = 0; c < nt; c++)
            printf(",%.9g", (double)ds->targets[r * (size_t)ds->n_outputs + (size_t)c]);
        putchar('\n');
    }
    kiln_dataset_free(ds);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "kiln: error: cannot write to standard output\n");
        return 2;
    }
    return 0;
}

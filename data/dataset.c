/*
 * dataset.c - dataset files (docs/data.md): safetensors with `features` [N,F] and `targets`
 * [N,O], both F32, rows in time order, and optional names in __metadata__["kiln.columns"].
 * Opening validates everything a trainer relies on before any value is handed out; the
 * split keeps a purge gap between training and validation rows so that no training window
 * overlaps a validation window.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"

#define ALIGN 64

/* Rows and columns fit in the int and size_t arithmetic used everywhere downstream. */
#define MAX_COLUMNS (1 << 20)

static float *alloc_aligned(size_t n, const char *path) {
    size_t bytes;
    if (!kiln_mul_ok(n ? n : 1, sizeof(float), &bytes) || bytes > SIZE_MAX - ALIGN) {
        kiln_fail(KILN_ERR_LIMIT, "'%s': dataset too large", path);
        return NULL;
    }
    bytes = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    float *p = aligned_alloc(ALIGN, bytes);
    if (!p) kiln_fail(KILN_ERR_NOMEM, "out of memory loading '%s' (%zu bytes)", path, bytes);
    return p;
}

void kiln_dataset_free(kiln_dataset *ds) {
    if (!ds) return;
    free(ds->features);
    free(ds->targets);
    free(ds->path);
    json_decref(ds->columns);
    free(ds->time);
    free(ds->group);
    json_decref(ds->time_meta);
    json_decref(ds->group_meta);
    free(ds);
}

/* kiln.columns: {"features": [F names], "targets": [O names]}, nothing else, every name a
 * non-empty string used once. label names the file in messages. */
static kiln_err check_columns(const json_t *c, int F, int O, const char *label) {
    KILN_FAIL_IF(!json_is_object(c), KILN_ERR_FORMAT, "'%s': kiln.columns is not a JSON object",
                 label);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)c, key, v) {
        KILN_FAIL_IF(strcmp(key, "features") && strcmp(key, "targets"), KILN_ERR_FORMAT,
                     "'%s': kiln.columns: unknown key '%s' (expected 'features' and 'targets')",
                     label, key);
    }
    static const char *const kinds[2] = {"features", "targets"};
    const int want[2] = {F, O};
    const json_t *lists[2];
    for (int k = 0; k < 2; k++) {
        const json_t *a = lists[k] = json_object_get(c, kinds[k]);
        KILN_FAIL_IF(!json_is_array(a), KILN_ERR_FORMAT,
                     "'%s': kiln.columns: '%s' is missing or not an array", label, kinds[k]);
        KILN_FAIL_IF(json_array_size(a) != (size_t)want[k], KILN_ERR_FORMAT,
                     "'%s': kiln.columns: '%s' lists %zu names but the tensor has %d columns",
                     label, kinds[k], json_array_size(a), want[k]);
        for (size_t i = 0; i < json_array_size(a); i++) {
            const json_t *n = json_array_get(a, i);
            KILN_FAIL_IF(!json_is_string(n) || !json_string_length(n), KILN_ERR_FORMAT,
                         "'%s': kiln.columns: '%s' entry %zu is not a non-empty string", label,
                         kinds[k], i);
        }
    }
    /* Names are unique across both lists: a name picks one column. Quadratic, but the
     * lists are column counts, not rows. */
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < json_array_size(lists[k]); i++) {
            const char *a = json_string_value(json_array_get(lists[k], i));
            for (int k2 = k; k2 < 2; k2++)
                for (size_t j = k2 == k ? i + 1 : 0; j < json_array_size(lists[k2]); j++)
                    KILN_FAIL_IF(!strcmp(a, json_string_value(json_array_get(lists[k2], j))),
                                 KILN_ERR_FORMAT, "'%s': kiln.columns: name '%s' is used twice",
                                 label, a);
        }
    return KILN_OK;
}

const char *kiln_dataset_column(const kiln_dataset *ds, bool target, int i, char *buf, size_t len) {
    if (ds->columns) {
        const json_t *n = json_array_get(
            json_object_get(ds->columns, target ? "targets" : "features"), (size_t)i);
        if (json_is_string(n)) return json_string_value(n);
    }
    snprintf(buf, len, "%s[%d]", target ? "target" : "feature", i);
    return buf;
}

/* The first non-finite value of a [rows, cols] block, reported with its place. */
static kiln_err check_finite(const kiln_dataset *ds, bool target) {
    const float *x = target ? ds->targets : ds->features;
    size_t cols = (size_t)(target ? ds->n_outputs : ds->n_features), n = ds->rows * cols;
    for (size_t i = 0; i < n; i++) {
        if (isfinite(x[i])) continue;
        char buf[32];
        int c = (int)(i % cols);
        return kiln_fail(KILN_ERR_NUMERIC, "'%s': tensor '%s' row %zu column %d ('%s') is %s",
                         ds->path, target ? "targets" : "features", i / cols, c,
                         kiln_dataset_column(ds, target, c, buf, sizeof buf),
                         isnan(x[i]) ? "NaN"
                         : x[i] > 0  ? "+infinity"
                                     : "-infinity");
    }
    return KILN_OK;
}

static kiln_err expect_2d(const kiln_st *st, const char *name, const kiln_tensor **out) {
    const char *p = kiln_st_path(st);
    const kiln_tensor *t = kiln_st_find(st, name);
    KILN_FAIL_IF(!t, KILN_ERR_FORMAT,
                 "'%s': tensor '%s' is missing (a dataset holds 'features' [rows, F] and 'targets' "
                 "[rows, O], F32)",
                 p, name);
    KILN_FAIL_IF(t->dtype != KILN_F32, KILN_ERR_FORMAT, "'%s': tensor '%s' is %s, expected F32", p,
                 name, kiln_dtype_name(t->dtype));
    KILN_FAIL_IF(t->ndim != 2, KILN_ERR_FORMAT,
                 "'%s': tensor '%s' has %d dimensions, expected 2 [rows, columns]", p, name,
                 t->ndim);
    KILN_FAIL_IF(t->shape[1] < 1 || t->shape[1] > MAX_COLUMNS, KILN_ERR_FORMAT,
                 "'%s': tensor '%s' has %lld columns, expected 1 to %d", p, name,
                 (long long)t->shape[1], MAX_COLUMNS);
    *out = t;
    return KILN_OK;
}

/* A 1-D tensor of rows entries of dtype dt, copied into *out (new), or none (*out NULL). */
static kiln_err optional_1d(const kiln_st *st, const char *name, kiln_dtype dt, size_t rows,
                            void **out) {
    *out = NULL;
    const char *p = kiln_st_path(st);
    const kiln_tensor *t = kiln_st_find(st, name);
    if (!t) return KILN_OK;
    KILN_FAIL_IF(t->dtype != dt, KILN_ERR_FORMAT, "'%s': tensor '%s' is %s, expected %s", p, name,
                 kiln_dtype_name(t->dtype), kiln_dtype_name(dt));
    KILN_FAIL_IF(t->ndim != 1 || (size_t)t->shape[0] != rows, KILN_ERR_FORMAT,
                 "'%s': tensor '%s' must be 1-D with one entry per row (%zu)", p, name, rows);
    if (!(*out = kiln_malloc(t->nbytes ? t->nbytes : 1))) return KILN_ERR_NOMEM;
    memcpy(*out, t->data, t->nbytes);
    return KILN_OK;
}

/* kiln.time and kiln.groups, and the tensors they describe. */
static kiln_err open_extra(const kiln_st *st, kiln_dataset *ds) {
    const char *path = ds->path, *tm = kiln_st_meta(st, "kiln.time"),
               *gm = kiln_st_meta(st, "kiln.groups");
    KILN_TRY(optional_1d(st, "time", KILN_I64, ds->rows, (void **)&ds->time));
    KILN_TRY(optional_1d(st, "group", KILN_I32, ds->rows, (void **)&ds->group));
    KILN_FAIL_IF(!ds->time != !tm, KILN_ERR_FORMAT,
                 "'%s': tensor 'time' and __metadata__ kiln.time go together", path);
    KILN_FAIL_IF(!ds->group != !gm, KILN_ERR_FORMAT,
                 "'%s': tensor 'group' and __metadata__ kiln.groups go together", path);
    if (tm) {
        KILN_TRY(kiln_json_parse(tm, strlen(tm), "kiln.time", &ds->time_meta));
        KILN_FAIL_IF(!json_is_string(json_object_get(ds->time_meta, "column")), KILN_ERR_FORMAT,
                     "'%s': kiln.time is not {\"column\": name}", path);
    }
    if (gm) {
        KILN_TRY(kiln_json_parse(gm, strlen(gm), "kiln.groups", &ds->group_meta));
        const json_t *names = json_object_get(ds->group_meta, "names");
        KILN_FAIL_IF(
            !json_is_string(json_object_get(ds->group_meta, "column")) || !json_is_array(names) ||
                json_array_size(names) < 1 || json_array_size(names) > (1u << 30),
            KILN_ERR_FORMAT, "'%s': kiln.groups is not {\"column\": name, \"names\": [...]}", path);
        ds->n_groups = (int)json_array_size(names);
    }
    return kiln_dataset_check_extra(path, ds->rows, ds->time, ds->group, ds->n_groups,
                                    KILN_ERR_FORMAT);
}

kiln_err kiln_dataset_check_extra(const char *path, size_t rows, const int64_t *time,
                                  const int32_t *group, int n_groups, kiln_err code) {
    for (size_t r = 0; group && r < rows; r++) {
        int32_t g = group[r], prev = r ? group[r - 1] : 0;
        KILN_FAIL_IF(g < 0 || g >= n_groups || g < prev || g > prev + 1 || (!r && g), code,
                     "'%s': tensor 'group' row %zu is %d: groups must be 0, 1, ... in "
                     "contiguous runs of rows, below %d",
                     path, r, (int)g, n_groups);
    }
    KILN_FAIL_IF(group && rows && group[rows - 1] != n_groups - 1, code,
                 "'%s': kiln.groups names %d groups but tensor 'group' has %d", path, n_groups,
                 (int)group[rows - 1] + 1);
    for (size_t r = 0; time && r < rows; r++)
        KILN_FAIL_IF(time[r] < KILN_TIME_MIN || time[r] > KILN_TIME_MAX, code,
                     "'%s': tensor 'time' row %zu is %lld, outside the years 0000 to 9999", path, r,
                     (long long)time[r]);
    for (size_t r = 1; time && r < rows; r++) {
        if (group && group[r] != group[r - 1]) continue;
        if (time[r] >= time[r - 1]) continue;
        char a[32], b[32];
        kiln_time_format(time[r], a);
        kiln_time_format(time[r - 1], b);
        return kiln_fail(code, "'%s': tensor 'time' goes back at row %zu (%s after %s)", path, r, a,
                         b);
    }
    return KILN_OK;
}

kiln_err kiln_dataset_open_ex(const char *path, unsigned flags, kiln_dataset **out) {
    *out = NULL;
    uint8_t digest[KILN_SHA256_BYTES];
    /* The digest is of the file's bytes as read here; the mapping below is of the same
     * file, and a file replaced in between is refused by nothing: datasets are written
     * atomically (renamed into place), so a reader sees one version or the other. */
    KILN_TRY(kiln_sha256_file(path, digest));
    kiln_st *st = NULL;
    KILN_TRY(kiln_st_open(path, &st));
    kiln_err rc = KILN_OK;
    kiln_dataset *ds = kiln_calloc(1, sizeof *ds);
    KILN_CHECK_IF(rc, fail, !ds, KILN_ERR_NOMEM, "out of memory opening '%s'", path);
    kiln_hex(digest, sizeof digest, ds->sha256);
    ds->path = kiln_strdup(path);
    KILN_CHECK_IF(rc, fail, !ds->path, KILN_ERR_NOMEM, "out of memory opening '%s'", path);
    const kiln_tensor *f, *t;
    KILN_CHECK(rc, fail, expect_2d(st, "features", &f));
    KILN_CHECK(rc, fail, expect_2d(st, "targets", &t));
    KILN_CHECK_IF(rc, fail, f->shape[0] != t->shape[0], KILN_ERR_FORMAT,
                  "'%s': 'features' has %lld rows but 'targets' has %lld", path,
                  (long long)f->shape[0], (long long)t->shape[0]);
    KILN_CHECK_IF(rc, fail, f->shape[0] == 0, KILN_ERR_FORMAT, "'%s': the dataset has no rows",
                  path);
    ds->rows = (size_t)f->shape[0];
    ds->n_features = (int)f->shape[1];
    ds->n_outputs = (int)t->shape[1];
    const char *cols = kiln_st_meta(st, "kiln.columns");
    if (cols) {
        char *label = kiln_asprintf("%s: kiln.columns", path);
        KILN_CHECK_IF(rc, fail, !label, KILN_ERR_NOMEM, "out of memory opening '%s'", path);
        rc = kiln_json_parse(cols, strlen(cols), label, &ds->columns);
        free(label);
        if (rc) goto fail;
        KILN_CHECK(rc, fail, check_columns(ds->columns, ds->n_features, ds->n_outputs, path));
    }
    ds->features = alloc_aligned(f->numel, path);
    ds->targets = alloc_aligned(t->numel, path);
    if (!ds->features || !ds->targets) { /* the message is set */
        rc = KILN_ERR_NOMEM;
        goto fail;
    }
    /* The mapping may be unaligned for f32: copy bytes (the format is little-endian, as is
     * every host kiln builds for). */
    memcpy(ds->features, f->data, f->nbytes);
    memcpy(ds->targets, t->data, t->nbytes);
    KILN_CHECK(rc, fail, open_extra(st, ds));
    if (!(flags & KILN_DATASET_ALLOW_NONFINITE)) {
        KILN_CHECK(rc, fail, check_finite(ds, false));
        KILN_CHECK(rc, fail, check_finite(ds, true));
    }
    kiln_st_close(st);
    *out = ds;
    return KILN_OK;
fail:
    kiln_st_close(st);
    kiln_dataset_free(ds);
    return rc;
}

kiln_err kiln_dataset_open(const char *path, kiln_dataset **out) {
    return kiln_dataset_open_ex(path, 0, out);
}

kiln_err kiln_dataset_out_ok(const char *path) {
    static const char *const tensors[] = {"features", "targets", NULL};
    return kiln_st_out_ok(path, tensors,
                          "a dataset (a safetensors file with 'features' and 'targets')");
}

kiln_err kiln_dataset_write_meta(const char *path, size_t rows, int n_features, int n_outputs,
                                 const float *features, const float *targets, const json_t *columns,
                                 const json_t *meta) {
    return kiln_dataset_write_extra(path, rows, n_features, n_outputs, features, targets, columns,
                                    meta, NULL);
}

kiln_err kiln_dataset_write_extra(const char *path, size_t rows, int n_features, int n_outputs,
                                  const float *features, const float *targets,
                                  const json_t *columns, const json_t *meta,
                                  const kiln_dataset_extra *x) {
    KILN_TRY(kiln_dataset_out_ok(path));
    KILN_FAIL_IF(rows == 0, KILN_ERR_USAGE, "'%s': a dataset needs at least one row", path);
    KILN_FAIL_IF(n_features < 1 || n_outputs < 1 || n_features > MAX_COLUMNS ||
                     n_outputs > MAX_COLUMNS,
                 KILN_ERR_USAGE, "'%s': %d features and %d targets: each must be 1 to %d", path,
                 n_features, n_outputs, MAX_COLUMNS);
    size_t nf, no;
    KILN_FAIL_IF(!kiln_mul_ok(rows, (size_t)n_features, &nf) ||
                     !kiln_mul_ok(rows, (size_t)n_outputs, &no) ||
                     !kiln_mul_ok(nf + no, sizeof(float), &(size_t){0}),
                 KILN_ERR_LIMIT, "'%s': dataset too large", path);
    for (size_t i = 0; i < nf; i++)
        KILN_FAIL_IF(!isfinite(features[i]), KILN_ERR_NUMERIC,
                     "'%s': features row %zu column %zu is not finite", path,
                     i / (size_t)n_features, i % (size_t)n_features);
    for (size_t i = 0; i < no; i++)
        KILN_FAIL_IF(!isfinite(targets[i]), KILN_ERR_NUMERIC,
                     "'%s': targets row %zu column %zu is not finite", path, i / (size_t)n_outputs,
                     i % (size_t)n_outputs);
    if (columns) KILN_TRY(check_columns(columns, n_features, n_outputs, path));
    KILN_FAIL_IF(x && x->group && (x->n_groups < 1 || !x->group_names), KILN_ERR_USAGE,
                 "'%s': a group column needs at least one group and its names", path);
    for (int g = 0; x && x->group && g < x->n_groups; g++)
        KILN_FAIL_IF(!x->group_names[g], KILN_ERR_USAGE, "'%s': group %d has no name", path, g);
    if (x) /* what kiln_dataset_open will check, so that no file is written it refuses */
        KILN_TRY(
            kiln_dataset_check_extra(path, rows, x->time, x->group, x->n_groups, KILN_ERR_USAGE));
    KILN_FAIL_IF(meta && !json_is_object(meta), KILN_ERR_USAGE,
                 "'%s': metadata is not a JSON object", path);
    kiln_st_writer *w;
    KILN_TRY(kiln_st_writer_new(&w));
    kiln_err rc = KILN_OK;
    char *text = NULL;
    json_t *xj = NULL;
    if (x && x->time) {
        KILN_CHECK(rc, out,
                   kiln_st_writer_add(w, "time", KILN_I64, 1, (int64_t[]){(int64_t)rows}, x->time));
        xj = json_pack("{s:s}", "column", x->time_column ? x->time_column : "time");
        text = xj ? kiln_json_canonical(xj) : NULL;
        KILN_CHECK_IF(rc, out, !text, KILN_ERR_NOMEM, "out of memory writing '%s'", path);
        KILN_CHECK(rc, out, kiln_st_writer_meta(w, "kiln.time", text));
        free(text), json_decref(xj);
        text = NULL, xj = NULL;
    }
    if (x && x->group) {
        KILN_CHECK(
            rc, out,
            kiln_st_writer_add(w, "group", KILN_I32, 1, (int64_t[]){(int64_t)rows}, x->group));
        json_t *names = json_array();
        for (int g = 0; names && g < x->n_groups; g++) {
            const char *gn = x->group_names[g];
            if (kiln_utf8_valid_prefix(gn, strlen(gn)) != strlen(gn)) {
                json_decref(names);
                rc = kiln_fail(KILN_ERR_USAGE, "'%s': group %d's name is not valid UTF-8", path, g);
                goto out;
            }
            if (json_array_append_new(names, json_string(gn)) != 0) {
                json_decref(names);
                names = NULL;
            }
        }
        xj = names ? json_pack("{s:s,s:o}", "column", x->group_column ? x->group_column : "group",
                               "names", names)
                   : NULL;
        text = xj ? kiln_json_canonical(xj) : NULL;
        KILN_CHECK_IF(rc, out, !text, KILN_ERR_NOMEM, "out of memory writing '%s'", path);
        KILN_CHECK(rc, out, kiln_st_writer_meta(w, "kiln.groups", text));
    }
    KILN_CHECK(rc, out,
               kiln_st_writer_add(w, "features", KILN_F32, 2,
                                  (int64_t[]){(int64_t)rows, n_features}, features));
    KILN_CHECK(rc, out,
               kiln_st_writer_add(w, "targets", KILN_F32, 2, (int64_t[]){(int64_t)rows, n_outputs},
                                  targets));
    if (columns) {
        char *text = kiln_json_canonical(columns);
        KILN_CHECK_IF(rc, out, !text, KILN_ERR_NOMEM, "out of memory writing '%s'", path);
        rc = kiln_st_writer_meta(w, "kiln.columns", text);
        free(text);
        if (rc) goto out;
    }
    if (meta) {
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)meta, key, v) {
            KILN_CHECK_IF(rc, out, !strcmp(key, "kiln.columns"), KILN_ERR_USAGE,
                          "'%s': kiln.columns goes in the columns argument", path);
            char *text = kiln_json_canonical(v);
            KILN_CHECK_IF(rc, out, !text, KILN_ERR_NOMEM, "out of memory writing '%s'", path);
            rc = kiln_st_writer_meta(w, key, text);
            free(text);
            if (rc) goto out;
        }
    }
    rc = kiln_st_writer_write(w, path);
out:
    free(text);
    json_decref(xj);
    kiln_st_writer_free(w);
    return rc;
}

kiln_err kiln_dataset_write(const char *path, size_t rows, int n_features, int n_outputs,
                            const float *features, const float *targets, const json_t *columns) {
    return kiln_dataset_write_meta(path, rows, n_features, n_outputs, features, targets, columns,
                                   NULL);
}

static kiln_err split_rows(const kiln_dataset *ds, double val_fraction, int seq_len,
                           kiln_split *out) {
    KILN_FAIL_IF(!(val_fraction >= 0 && val_fraction < 1), KILN_ERR_USAGE,
                 "validation fraction %g is outside [0, 1)", val_fraction);
    KILN_FAIL_IF(seq_len < 1, KILN_ERR_USAGE, "sequence length %d must be at least 1", seq_len);
    size_t n = ds->rows, S = (size_t)seq_len;
    if (val_fraction == 0) {
        KILN_FAIL_IF(n < S, KILN_ERR_USAGE, "'%s': %zu rows, fewer than one training window of %zu",
                     ds->path, n, S);
        *out = (kiln_split){.train_end = n, .val_begin = n, .val_end = n};
        return KILN_OK;
    }
    /* Validation rows: the fraction rounded to the nearest row, at least one window. Then a
     * gap of exactly S rows that neither split uses, then at least one training window. */
    KILN_FAIL_IF(
        n / 3 < S, KILN_ERR_USAGE,
        "'%s': %zu rows, too few for a training window, a purge gap and a validation window of "
        "%zu rows each (%zu needed)",
        ds->path, n, S, 3 * S);
    size_t n_val = (size_t)floor(val_fraction * (double)n + 0.5);
    if (n_val < S) n_val = S;
    KILN_FAIL_IF(n_val > n - 2 * S, KILN_ERR_USAGE,
                 "'%s': validation fraction %g leaves %zu of %zu rows for training and the purge "
                 "gap of %zu, "
                 "less than one training window",
                 ds->path, val_fraction, n - n_val, n, S);
    out->val_begin = n - n_val;
    out->val_end = n;
    out->train_end = out->val_begin - S;
    return KILN_OK;
}

void kiln_dataset_stats(const kiln_dataset *ds, kiln_column_stats *stats) {
    int F = ds->n_features, O = ds->n_outputs;
    for (int c = 0; c < F + O; c++) {
        const float *x = c < F ? ds->features + c : ds->targets + (c - F);
        size_t stride = (size_t)(c < F ? F : O), n = 0;
        kiln_column_stats s = {.min = INFINITY, .max = -INFINITY};
        double mean = 0, m2 = 0; /* Welford: stable for long columns with a large mean */
        for (size_t r = 0; r < ds->rows; r++) {
            double v = x[r * stride];
            if (isnan(v)) {
                s.n_nan++;
                continue;
            }
            if (isinf(v)) {
                s.n_inf++;
                continue;
            }
            n++;
            double d = v - mean;
            mean += d / (double)n;
            m2 += d * (v - mean);
            if (v < s.min) s.min = v;
            if (v > s.max) s.max = v;
        }
        if (n) {
            s.mean = mean;
            s.std = sqrt(m2 / (double)n);
        } else {
            s.mean = s.std = s.min = s.max = NAN;
        }
        stats[c] = s;
    }
}

void kiln_split_release(kiln_split *sp) {
    free(sp->ranges);
    sp->ranges = NULL;
    sp->n_ranges = 0;
}

const kiln_split_range *kiln_split_ranges(const kiln_split *sp, kiln_split_range *one, size_t *n) {
    if (sp->n_ranges) {
        *n = sp->n_ranges;
        return sp->ranges;
    }
    *one = (kiln_split_range){0, sp->train_end, sp->val_begin, sp->val_end};
    *n = 1;
    return one;
}

/* First row in [b, e) whose time is at least t (e when none): the times are sorted there. */
static size_t first_at(const int64_t *time, size_t b, size_t e, int64_t t) {
    while (b < e) {
        size_t m = b + (e - b) / 2;
        if (time[m] < t)
            b = m + 1;
        else
            e = m;
    }
    return b;
}

static int cmp_time(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

kiln_err kiln_dataset_split(const kiln_dataset *ds, double val_fraction, int seq_len,
                            kiln_split *out) {
    kiln_split_opts o = {.val_fraction = val_fraction, .seq_len = seq_len};
    return kiln_dataset_split_ex(ds, &o, out);
}

kiln_err kiln_dataset_split_ex(const kiln_dataset *ds, const kiln_split_opts *o, kiln_split *out) {
    memset(out, 0, sizeof *out);
    const bool by_time = o->val_from && *o->val_from;
    const size_t S = o->seq_len > 0 ? (size_t)o->seq_len : 1;
    KILN_FAIL_IF(o->seq_len < 1, KILN_ERR_USAGE, "sequence length %d must be at least 1",
                 o->seq_len);
    KILN_FAIL_IF(o->purge_rows < 0 || o->purge_secs < 0, KILN_ERR_USAGE,
                 "the purge gap must not be negative");
    KILN_FAIL_IF((by_time || o->purge_secs) && !ds->time, KILN_ERR_USAGE,
                 "'%s' has no time column (kiln data import --time): a split by time (val_from, "
                 "purge_time) needs one",
                 ds->path);
    int64_t from = 0;
    KILN_FAIL_IF(by_time && !kiln_time_parse(o->val_from, &from), KILN_ERR_USAGE,
                 "val_from '%s' is not a time (an ISO 8601 date or date-time, or epoch seconds)",
                 o->val_from);
    const size_t gap = (size_t)o->purge_rows > S ? (size_t)o->purge_rows : S;
    /* The old rule, bit for bit: by rows, the gap exactly seq_len, no groups. */
    if (!by_time && !ds->group && gap == S && !o->purge_secs) {
        KILN_TRY(split_rows(ds, o->val_fraction, o->seq_len, out));
        out->train_rows = out->train_end;
        out->val_rows = out->val_end - out->val_begin;
        out->gap_rows = out->val_begin - out->train_end;
        return KILN_OK;
    }
    KILN_FAIL_IF(!by_time && !(o->val_fraction >= 0 && o->val_fraction < 1), KILN_ERR_USAGE,
                 "validation fraction %g is outside [0, 1)", o->val_fraction);
    /* With groups and times but no val_from: the time at which val_fraction of all rows are
     * later, so every instrument is split at the same moment. */
    if (!by_time && ds->group && ds->time && o->val_fraction > 0) {
        int64_t *t = kiln_malloc(ds->rows * sizeof *t);
        if (!t) return KILN_ERR_NOMEM;
        memcpy(t, ds->time, ds->rows * sizeof *t);
        qsort(t, ds->rows, sizeof *t, cmp_time);
        size_t n_val = (size_t)floor(o->val_fraction * (double)ds->rows + 0.5);
        from = t[ds->rows - (n_val ? n_val : 1)];
        free(t);
    }
    const bool at_time = by_time || (ds->group && ds->time && o->val_fraction > 0);
    const size_t G = ds->group ? (size_t)ds->n_groups : 1;
    kiln_split_range *rg = kiln_calloc(G, sizeof *rg);
    if (!rg) return KILN_ERR_NOMEM;
    size_t b = 0, tr = 0, va = 0, train_starts = 0, val_windows = 0;
    for (size_t g = 0; g < G; g++) {
        size_t e = b;
        while (e < ds->rows && (!ds->group || (size_t)ds->group[e] == g))
            e++;
        size_t vb;
        if (at_time)
            vb = first_at(ds->time, b, e, from);
        else if (o->val_fraction > 0)
            vb = e - (size_t)floor(o->val_fraction * (double)(e - b) + 0.5);
        else
            vb = e;
        size_t te = vb >= b + gap ? vb - gap : b;
        if (o->purge_secs && at_time) {
            size_t tt = first_at(ds->time, b, e, from - o->purge_secs);
            if (tt < te) te = tt;
        }
        rg[g] = (kiln_split_range){b, te, vb, e};
        tr += te - b;
        va += e - vb;
        train_starts += te - b >= S ? te - b - S + 1 : 0;
        val_windows += (e - vb) / S;
        b = e;
    }
    char when[32] = "";
    if (at_time) kiln_time_format(from, when);
    kiln_err rc = KILN_OK;
    if (!train_starts)
        rc = kiln_fail(
            KILN_ERR_USAGE,
            "'%s': the split leaves no training window of %zu rows (%zu training rows%s%s)",
            ds->path, S, tr, at_time ? " before " : "", when);
    else if (!val_windows && (by_time || o->val_fraction > 0))
        rc = kiln_fail(KILN_ERR_USAGE,
                       "'%s': the split leaves no validation window of %zu rows (%zu validation "
                       "rows%s%s)",
                       ds->path, S, va, at_time ? " from " : "", when);
    if (rc) {
        free(rg);
        return rc;
    }
    out->train_rows = tr;
    out->val_rows = va;
    out->gap_rows = gap;
    out->by_time = at_time;
    out->val_from = from;
    if (ds->group) {
        out->ranges = rg;
        out->n_ranges = G;
    } else {
        out->train_end = rg[0].train_end;
        out->val_begin = rg[0].val_begin;
        out->val_end = rg[0].val_end;
        free(rg);
    }
    return KILN_OK;
}

size_t kiln_split_val_windows(const kiln_split *sp, int seq_len, size_t cap, size_t *starts) {
    kiln_split_range one;
    size_t nr, total = 0, n = 0;
    const kiln_split_range *r = kiln_split_ranges(sp, &one, &nr);
    for (size_t g = 0; g < nr; g++)
        total += r[g].val_end - r[g].val_begin;
    for (size_t g = 0; g < nr && n < cap; g++) {
        size_t len = r[g].val_end - r[g].val_begin, fit = len / (size_t)seq_len;
        /* this range's share of cap, by its rows (all of cap with one range) */
        size_t want = nr == 1 ? cap : (size_t)((double)cap * (double)len / (double)total);
        if (!want && fit) want = 1;
        size_t k = fit < want ? fit : want;
        if (k > cap - n) k = cap - n;
        if (!k) continue;
        /* Spread evenly: stride >= seq_len, so the windows never overlap. */
        size_t stride = len / k;
        for (size_t i = 0; i < k; i++)
            starts[n++] = r[g].val_begin + i * stride;
    }
    return n;
}

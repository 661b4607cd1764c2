/*
 * dataset.c - dataset files (DESIGN.md): safetensors with `features` [N,F] and `targets`
 * [N,O], both F32, rows in time order, and optional names in __metadata__["kiln.columns"].
 * Opening validates everything a trainer relies on before any value is handed out; the
 * split keeps a purge gap between training and validation rows so that no training window
 * overlaps a validation window.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

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
    KILN_FAIL_IF(meta && !json_is_object(meta), KILN_ERR_USAGE,
                 "'%s': metadata is not a JSON object", path);
    kiln_st_writer *w;
    KILN_TRY(kiln_st_writer_new(&w));
    kiln_err rc = KILN_OK;
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
    kiln_st_writer_free(w);
    return rc;
}

kiln_err kiln_dataset_write(const char *path, size_t rows, int n_features, int n_outputs,
                            const float *features, const float *targets, const json_t *columns) {
    return kiln_dataset_write_meta(path, rows, n_features, n_outputs, features, targets, columns,
                                   NULL);
}

kiln_err kiln_dataset_split(const kiln_dataset *ds, double val_fraction, int seq_len,
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

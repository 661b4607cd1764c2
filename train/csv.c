/*
 * csv.c - import a CSV file into a dataset. The dialect: a header row of names, then one
 * row per time step, fields separated by ',', spaces around a field ignored, '\n' or
 * "\r\n" line ends, a UTF-8 byte-order mark before the header ignored, empty lines skipped.
 * Quoted fields are refused rather than half supported: numeric data never needs them, and
 * a quote is more likely a sign that the file is not what the caller thinks.
 * The file is read a line at a time; only the chosen columns' f32 values are kept.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

typedef struct {
    float *v;
    size_t n, cap;
} fvec;

static bool fvec_push(fvec *a, float x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 4096;
        float *v = realloc(a->v, cap * sizeof *v);
        if (!v) return false;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return true;
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = 0;
    return s;
}

/* Cut line (without its end) at commas into fields[0..max); returns the field count,
 * which may exceed max (then only max are stored). */
static int split(char *line, char **fields, int max) {
    int n = 0;
    for (char *s = line;; s++) {
        char *e = strchr(s, ',');
        if (e) *e = 0;
        if (n < max) fields[n] = trim(s);
        n++;
        if (!e) break;
        s = e;
    }
    return n;
}

/* Strip the line end; false at end of file. */
static bool read_line(FILE *f, char **line, size_t *cap, ssize_t *len) {
    *len = getline(line, cap, f);
    if (*len < 0) return false;
    while (*len && ((*line)[*len - 1] == '\n' || (*line)[*len - 1] == '\r'))
        (*line)[--*len] = 0;
    return true;
}

kiln_err kiln_dataset_import_csv(const char *csv, const char *const *features, int n_features,
                                 const char *const *targets, int n_outputs, const char *out_path) {
    KILN_FAIL_IF(n_features < 1 || n_outputs < 1, KILN_ERR_USAGE,
                 "'%s': import needs at least one feature and one target", csv);
    /* Before the CSV is read: --out naming the CSV itself, or any file not a dataset. */
    KILN_TRY(kiln_dataset_out_ok(out_path));
    const int nsel = n_features + n_outputs;
    const char **names = kiln_calloc((size_t)nsel, sizeof *names);
    int *idx = kiln_calloc((size_t)nsel, sizeof *idx);
    char **fields = NULL, *line = NULL;
    size_t cap = 0, lineno = 0;
    fvec fx = {0}, ty = {0};
    json_t *cols = NULL;
    kiln_err rc = KILN_OK;
    FILE *f = NULL;
    KILN_CHECK_IF(rc, out, !names || !idx, KILN_ERR_NOMEM, "out of memory importing '%s'", csv);
    for (int i = 0; i < nsel; i++) {
        names[i] = i < n_features ? features[i] : targets[i - n_features];
        for (int j = 0; j < i; j++)
            KILN_CHECK_IF(rc, out, !strcmp(names[i], names[j]), KILN_ERR_USAGE,
                          "'%s': column '%s' is chosen twice", csv, names[i]);
    }
    f = fopen(csv, "r");
    KILN_CHECK_IF(rc, out, !f, KILN_ERR_IO, "cannot open '%s': %s", csv, strerror(errno));

    /* ---- header ---- */
    ssize_t len;
    KILN_CHECK_IF(rc, out, !read_line(f, &line, &cap, &len),
                  ferror(f) ? KILN_ERR_IO : KILN_ERR_FORMAT, "'%s': %s", csv,
                  ferror(f) ? "read error" : "empty file (no header row)");
    lineno = 1;
    KILN_CHECK_IF(rc, out, (size_t)len != strlen(line), KILN_ERR_FORMAT,
                  "'%s' line 1: a NUL byte (is the file UTF-16? kiln reads UTF-8 or ASCII)", csv);
    char *hdr = line;
    if (!strncmp(hdr, "\xEF\xBB\xBF", 3)) hdr += 3;
    KILN_CHECK_IF(rc, out, strchr(hdr, '"'), KILN_ERR_UNSUPPORTED,
                  "'%s' line 1: quoted fields are not supported", csv);
    int ncols = 1;
    for (const char *p = hdr; *p; p++)
        ncols += *p == ',';
    fields = kiln_calloc((size_t)ncols, sizeof *fields);
    KILN_CHECK_IF(rc, out, !fields, KILN_ERR_NOMEM, "out of memory importing '%s'", csv);
    split(hdr, fields, ncols);
    for (int i = 0; i < nsel; i++) {
        idx[i] = -1;
        for (int c = 0; c < ncols; c++) {
            if (strcmp(fields[c], names[i])) continue;
            KILN_CHECK_IF(
                rc, out, idx[i] >= 0, KILN_ERR_FORMAT,
                "'%s' line 1: column '%s' appears twice in the header (columns %d and %d)", csv,
                names[i], idx[i] + 1, c + 1);
            idx[i] = c;
        }
        KILN_CHECK_IF(rc, out, idx[i] < 0, KILN_ERR_NOTFOUND,
                      "'%s' line 1: no column '%s' in the header", csv, names[i]);
    }
    cols = json_pack("{s:[],s:[]}", "features", "targets");
    KILN_CHECK_IF(rc, out, !cols, KILN_ERR_NOMEM, "out of memory importing '%s'", csv);
    for (int i = 0; i < nsel; i++)
        json_array_append_new(json_object_get(cols, i < n_features ? "features" : "targets"),
                              json_string(names[i]));

    /* ---- rows ---- */
    size_t rows = 0;
    while (read_line(f, &line, &cap, &len)) {
        lineno++;
        if (len == 0) continue;
        KILN_CHECK_IF(rc, out, memchr(line, '"', (size_t)len), KILN_ERR_UNSUPPORTED,
                      "'%s' line %zu: quoted fields are not supported", csv, lineno);
        KILN_CHECK_IF(rc, out, (size_t)len != strlen(line), KILN_ERR_FORMAT,
                      "'%s' line %zu: a NUL byte", csv, lineno);
        int n = split(line, fields, ncols);
        KILN_CHECK_IF(rc, out, n != ncols, KILN_ERR_FORMAT,
                      "'%s' line %zu: %d fields, but the header has %d", csv, lineno, n, ncols);
        for (int i = 0; i < nsel; i++) {
            const char *s = fields[idx[i]];
            KILN_CHECK_IF(rc, out, !*s, KILN_ERR_FORMAT, "'%s' line %zu, column '%s': empty value",
                          csv, lineno, names[i]);
            char *end;
            errno = 0;
            double d = strtod(s, &end);
            KILN_CHECK_IF(rc, out, end == s || *end, KILN_ERR_FORMAT,
                          "'%s' line %zu, column '%s': '%s' is not a number", csv, lineno, names[i],
                          s);
            KILN_CHECK_IF(rc, out, !isfinite(d), KILN_ERR_NUMERIC,
                          "'%s' line %zu, column '%s': '%s' is not finite", csv, lineno, names[i],
                          s);
            KILN_CHECK_IF(rc, out, fabs(d) > FLT_MAX, KILN_ERR_NUMERIC,
                          "'%s' line %zu, column '%s': '%s' is out of range for f32", csv, lineno,
                          names[i], s);
            KILN_CHECK_IF(rc, out, !fvec_push(i < n_features ? &fx : &ty, (float)d), KILN_ERR_NOMEM,
                          "out of memory importing '%s' (line %zu)", csv, lineno);
        }
        rows++;
    }
    KILN_CHECK_IF(rc, out, ferror(f), KILN_ERR_IO, "cannot read '%s' (after line %zu)", csv,
                  lineno);
    KILN_CHECK_IF(rc, out, rows == 0, KILN_ERR_FORMAT, "'%s': no data rows after the header", csv);
    rc = kiln_dataset_write(out_path, rows, n_features, n_outputs, fx.v, ty.v, cols);
out:
    if (f) fclose(f);
    free(line);
    free(fields);
    free(names);
    free(idx);
    free(fx.v);
    free(ty.v);
    json_decref(cols);
    return rc;
}

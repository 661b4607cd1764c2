/* csv.c - fuzz entry point for `kiln data import` (data/csv.c): the bytes are a CSV file of
 * market data, from whatever exported it. The import chooses features "a" and "b" and the
 * target "y". A libFuzzer driver calls it from LLVMFuzzerTestOneInput; the C suite replays
 * tests/fuzz/corpus/csv through it. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "fuzz.h"

int kiln_fuzz_csv(const uint8_t *data, size_t size);

/* The format as this harness reads it (docs/data.md), written apart from csv.c and
 * libcsv: RFC 4180 records end at \r or \n outside quotes, records of nothing but spaces
 * and tabs are skipped, a UTF-8 BOM before the header is skipped, the first record is the header,
 * fields are cut at ',' outside quotes, a quoted part is copied with "" read as ", and
 * spaces and tabs around the field's value are dropped. Only called on files the import
 * accepted: every value of column col of data row `row` must be what strtod reads, as
 * f32. */
typedef struct ref {
    const uint8_t *d;
    size_t n, i;
    int col[3]; /* a, b, y */
} ref;

/* The next record's fields (each a new string; the caller frees them and *fields) into
 * *fields and *nf; false at the end of the data. */
static bool record(ref *r, char ***fields, int *nf) {
    *fields = NULL;
    *nf = 0;
    while (r->i < r->n && strchr("\r\n \t", r->d[r->i]) && r->d[r->i])
        r->i++;
    if (r->i >= r->n) return false;
    size_t cap = 64, len = 0;
    char *buf = malloc(cap);
    bool inq = false;
    for (;;) {
        int c = r->i < r->n ? r->d[r->i] : -1;
        bool end = c < 0 || (!inq && (c == '\r' || c == '\n'));
        if (end || (!inq && c == ',')) {
            size_t s = 0, e = len;
            while (s < e && (buf[s] == ' ' || buf[s] == '\t'))
                s++;
            while (e > s && (buf[e - 1] == ' ' || buf[e - 1] == '\t'))
                e--;
            *fields = realloc(*fields, (size_t)(*nf + 1) * sizeof **fields);
            (*fields)[(*nf)++] = strndup(buf + s, e - s);
            len = 0;
            if (end) break;
            r->i++;
            continue;
        }
        r->i++;
        if (c == '"') {
            if (inq && r->i < r->n && r->d[r->i] == '"') {
                r->i++;
            } else {
                inq = !inq;
                continue;
            }
        }
        if (len + 1 >= cap) buf = realloc(buf, cap *= 2);
        buf[len++] = (char)c;
    }
    free(buf);
    return true;
}

static void free_fields(char **f, int n) {
    for (int k = 0; k < n; k++)
        free(f[k]);
    free(f);
}

/* Walk the records: the header's columns into r->col, then each data row against ds. */
static bool ref_walk(ref *r, const kiln_dataset *ds) {
    static const char *const names[] = {"a", "b", "y"};
    size_t row = 0;
    if (r->n >= 3 && !memcmp(r->d, "\xEF\xBB\xBF", 3)) r->i = 3;
    char **f;
    int nf;
    if (!record(r, &f, &nf)) return false;
    for (int c = 0; c < 3; c++) {
        r->col[c] = -1;
        for (int k = 0; k < nf; k++)
            if (!strcmp(f[k], names[c])) r->col[c] = k;
    }
    free_fields(f, nf);
    for (int c = 0; c < 3; c++)
        if (r->col[c] < 0) return false;
    while (record(r, &f, &nf)) {
        bool ok = row < ds->rows;
        for (int c = 0; ok && c < 3; c++) {
            ok = r->col[c] < nf;
            if (!ok) break;
            float want = (float)strtod(f[r->col[c]], NULL);
            float got = c < 2 ? ds->features[row * 2 + (size_t)c] : ds->targets[row];
            ok = !memcmp(&want, &got, sizeof got);
        }
        free_fields(f, nf);
        if (!ok) return false;
        row++;
    }
    return row == ds->rows;
}

int kiln_fuzz_csv(const uint8_t *data, size_t size) {
    static const char *const feats[] = {"a", "b"}, *const targs[] = {"y"};
    char *in = kiln_fuzz_tmp_write("csv", data, size);
    char *out = in ? kiln_asprintf("%s.safetensors", in) : NULL;
    if (!out) {
        kiln_fuzz_tmp_done(in);
        return 0;
    }
    kiln_err rc = kiln_dataset_import_csv(in, feats, 2, targs, 1, out);
    if (rc == KILN_OK) {
        /* What was imported opens as a dataset of finite values, row for row and value for
         * value what the reference reading above finds. */
        kiln_dataset *ds = NULL;
        if (kiln_dataset_open(out, &ds) != KILN_OK) abort();
        if (ds->n_features != 2 || ds->n_outputs != 1 || ds->rows == 0) abort();
        ref r = {.d = data, .n = size};
        if (!ref_walk(&r, ds)) abort();
        for (size_t i = 0; i < ds->rows * 2; i++)
            if (!isfinite(ds->features[i])) abort();
        for (size_t i = 0; i < ds->rows; i++)
            if (!isfinite(ds->targets[i])) abort();
        char name[64];
        if (strcmp(kiln_dataset_column(ds, false, 1, name, sizeof name), "b") ||
            strcmp(kiln_dataset_column(ds, true, 0, name, sizeof name), "y"))
            abort();
        kiln_dataset_free(ds);
    } else {
        /* A refusal names the file and leaves no output behind. */
        if (!strstr(kiln_errmsg(), in)) abort();
        if (access(out, F_OK) == 0) abort();
    }
    unlink(out);
    /* Again with --time t --group g (kiln_time_parse and the grouping read the same bytes):
     * accepted, the rows are those of the plain import, regrouped, and the dataset opens
     * (times non-decreasing within each group); refused, the message names the file and
     * nothing is written. */
    kiln_csv_import ti = {.csv_path = in,
                          .out_path = out,
                          .features = feats,
                          .n_features = 2,
                          .targets = targs,
                          .n_outputs = 1,
                          .time_column = "t",
                          .group_column = "g"};
    kiln_csv_report rep;
    kiln_err rc2 = kiln_dataset_import_csv_ex(&ti, &rep);
    if (rc2 == KILN_OK) {
        kiln_dataset *ds = NULL;
        if (rc != KILN_OK) abort(); /* more columns read can only refuse more */
        if (kiln_dataset_open(out, &ds) != KILN_OK) abort();
        if (!ds->time || !ds->group || ds->n_groups != rep.n_groups || ds->rows != rep.rows)
            abort();
        kiln_dataset_free(ds);
    } else {
        if (!strstr(kiln_errmsg(), in)) abort();
        if (access(out, F_OK) == 0) abort();
    }
    unlink(out);
    free(out);
    kiln_fuzz_tmp_done(in);
    return 0;
}

/* csv.c - fuzz entry point for `kiln data import` (train/csv.c): the bytes are a CSV file of
 * market data, from whatever exported it. The import chooses features "a" and "b" and the
 * target "y". A libFuzzer driver calls it from LLVMFuzzerTestOneInput; the C suite replays
 * tests/fuzz/corpus/csv through it. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "train.h"

int kiln_fuzz_csv(const uint8_t *data, size_t size);

/* The format as this harness reads it (docs/data.md), written apart from csv.c: lines end
 * at \n, trailing \r are dropped, a UTF-8 BOM before the header is skipped, the first line
 * is the header, empty lines do not count, fields are cut at ',' and spaces and tabs around
 * them ignored. Only called on files the import accepted: every value of column col of
 * data row `row` must be what strtod reads, as f32. */
typedef struct ref {
    const uint8_t *d;
    size_t n;
    int col[3]; /* a, b, y */
} ref;

/* Field i of the line [s, e), trimmed, as a new string in *out (the caller frees); false
 * when the line has fewer fields. */
static bool field(const uint8_t *s, const uint8_t *e, int i, char **out) {
    for (; i > 0 && s < e; s++)
        if (*s == ',') i--;
    if (i > 0) return false;
    const uint8_t *f = s;
    while (f < e && *f != ',')
        f++;
    while (s < f && (*s == ' ' || *s == '\t'))
        s++;
    while (f > s && (f[-1] == ' ' || f[-1] == '\t'))
        f--;
    *out = strndup((const char *)s, (size_t)(f - s));
    return *out != NULL;
}

/* Walk the lines: the header's columns into r->col, then each data row against ds. */
static bool ref_walk(ref *r, const kiln_dataset *ds) {
    size_t i = 0, row = 0;
    bool header = true;
    if (r->n >= 3 && !memcmp(r->d, "\xEF\xBB\xBF", 3)) i = 3;
    while (i < r->n) {
        size_t j = i;
        while (j < r->n && r->d[j] != '\n')
            j++;
        size_t e = j;
        while (e > i && r->d[e - 1] == '\r')
            e--;
        const uint8_t *s = r->d + i, *t = r->d + e;
        char *v = NULL;
        if (header) {
            static const char *const names[] = {"a", "b", "y"};
            for (int c = 0; c < 3; c++) {
                r->col[c] = -1;
                for (int k = 0; field(s, t, k, &v); k++) {
                    if (!strcmp(v, names[c])) r->col[c] = k;
                    free(v);
                }
                if (r->col[c] < 0) return false;
            }
            header = false;
        } else if (e > i) {
            if (row >= ds->rows) return false;
            for (int c = 0; c < 3; c++) {
                if (!field(s, t, r->col[c], &v)) return false;
                float want = (float)strtod(v, NULL);
                free(v);
                float got = c < 2 ? ds->features[row * 2 + (size_t)c] : ds->targets[row];
                if (memcmp(&want, &got, sizeof got)) return false;
            }
            row++;
        }
        i = j + 1;
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
    free(out);
    kiln_fuzz_tmp_done(in);
    return 0;
}

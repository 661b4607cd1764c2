/* test_data.c - datasets: every validation error names the file and the problem, the split
 * keeps its purge gap, the synthetic market is deterministic and as learnable as documented,
 * CSV import reports the line and column of bad input and leaves an existing output alone. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "testutil.h"
#include "train.h"

static bool has(const char *needle) {
    return strstr(kiln_errmsg(), needle) != NULL;
}

/* A file with the given tensors, written by the raw safetensors writer so that it can hold
 * what kiln_dataset_write refuses. tname NULL leaves out targets. */
static char *raw_dataset(const char *file, kiln_dtype fdt, int fndim, const int64_t *fshape,
                         const void *fdata, const char *tname, const int64_t *tshape,
                         const void *tdata, const char *columns) {
    char *p = kiln_test_path(file);
    kiln_st_writer *w;
    if (kiln_st_writer_new(&w)) return p;
    kiln_err rc = kiln_st_writer_add(w, "features", fdt, fndim, fshape, fdata);
    if (!rc && tname) rc = kiln_st_writer_add(w, tname, KILN_F32, 2, tshape, tdata);
    if (!rc && columns) rc = kiln_st_writer_meta(w, "kiln.columns", columns);
    if (!rc) rc = kiln_st_writer_write(w, p);
    kiln_st_writer_free(w);
    return p;
}

KILN_TEST(data_round_trip) {
    float f[6] = {1, 2, 3, 4, 5, 6}, t[3] = {0.5f, -0.5f, 0.25f};
    json_t *cols = json_pack("{s:[s,s],s:[s]}", "features", "a", "b", "targets", "y");
    char *p = kiln_test_path("d.safetensors");
    CHECK("write", kiln_dataset_write(p, 3, 2, 1, f, t, cols) == KILN_OK);
    kiln_dataset *ds = NULL;
    if (!CHECK("open", kiln_dataset_open(p, &ds) == KILN_OK)) goto out;
    CHECK("shape", ds->rows == 3 && ds->n_features == 2 && ds->n_outputs == 1);
    CHECK("values", !memcmp(ds->features, f, sizeof f) && !memcmp(ds->targets, t, sizeof t));
    CHECK("aligned", ((uintptr_t)ds->features & 63) == 0 && ((uintptr_t)ds->targets & 63) == 0);
    uint8_t d[KILN_SHA256_BYTES];
    char hex[KILN_SHA256_HEX];
    CHECK("digest of the file", kiln_sha256_file(p, d) == KILN_OK &&
                                    (kiln_hex(d, sizeof d, hex), 1) && !strcmp(hex, ds->sha256));
    char buf[32];
    CHECK("names", !strcmp(kiln_dataset_column(ds, false, 1, buf, sizeof buf), "b") &&
                       !strcmp(kiln_dataset_column(ds, true, 0, buf, sizeof buf), "y"));
    CHECK("path kept", !strcmp(ds->path, p));
    kiln_dataset_free(ds);
    ds = NULL;
    /* Without names: generated ones. */
    CHECK("write unnamed", kiln_dataset_write(p, 3, 2, 1, f, t, NULL) == KILN_OK);
    if (CHECK("open unnamed", kiln_dataset_open(p, &ds) == KILN_OK)) {
        CHECK("no columns", ds->columns == NULL);
        CHECK("generated names",
              !strcmp(kiln_dataset_column(ds, false, 1, buf, sizeof buf), "feature[1]") &&
                  !strcmp(kiln_dataset_column(ds, true, 0, buf, sizeof buf), "target[0]"));
    }
out:
    kiln_dataset_free(ds);
    kiln_dataset_free(NULL);
    json_decref(cols);
    free(p);
}

KILN_TEST(data_open_refuses_nan_with_row_and_column) {
    float f[6] = {1, 2, 3, 4, NAN, 6}, t[3] = {0, 0, 0};
    char *p = raw_dataset("nan.safetensors", KILN_F32, 2, (int64_t[]){3, 2}, f, "targets",
                          (int64_t[]){3, 1}, t, "{\"features\":[\"a\",\"b\"],\"targets\":[\"y\"]}");
    kiln_dataset *ds = NULL;
    CHECK("refused", kiln_dataset_open(p, &ds) == KILN_ERR_NUMERIC && ds == NULL);
    CHECK("message names file, tensor, row, column and value",
          has(p) && has("'features'") && has("row 2") && has("column 0") && has("'a'") &&
              has("NaN"));
    /* inspection keeps them and counts them */
    if (CHECK("open for inspection",
              kiln_dataset_open_ex(p, KILN_DATASET_ALLOW_NONFINITE, &ds) == KILN_OK)) {
        kiln_column_stats st[3];
        kiln_dataset_stats(ds, st);
        CHECK("nan counted", st[0].n_nan == 1 && st[1].n_nan == 0 && st[2].n_nan == 0);
        CHECK("stats over the finite values",
              st[0].mean == 2 && st[0].min == 1 && st[0].max == 3 && fabs(st[0].std - 1) < 1e-12);
        kiln_dataset_free(ds);
    }
    free(p);
    float t2[3] = {0, -INFINITY, 0}, f2[6] = {0};
    p = raw_dataset("inf.safetensors", KILN_F32, 2, (int64_t[]){3, 2}, f2, "targets",
                    (int64_t[]){3, 1}, t2, NULL);
    CHECK("infinity refused", kiln_dataset_open(p, &ds) == KILN_ERR_NUMERIC && has(p) &&
                                  has("'targets'") && has("row 1") && has("'target[0]'") &&
                                  has("-infinity"));
    free(p);
}

KILN_TEST(data_open_refuses_wrong_dtype) {
    double f[6] = {0};
    float t[3] = {0};
    char *p = raw_dataset("f64.safetensors", KILN_F64, 2, (int64_t[]){3, 2}, f, "targets",
                          (int64_t[]){3, 1}, t, NULL);
    kiln_dataset *ds = NULL;
    CHECK("refused", kiln_dataset_open(p, &ds) == KILN_ERR_FORMAT && ds == NULL);
    CHECK("message", has(p) && has("'features'") && has("F64") && has("expected F32"));
    free(p);
}

KILN_TEST(data_open_refuses_mismatched_rows) {
    float f[6] = {0}, t[2] = {0};
    char *p = raw_dataset("rows.safetensors", KILN_F32, 2, (int64_t[]){3, 2}, f, "targets",
                          (int64_t[]){2, 1}, t, NULL);
    kiln_dataset *ds = NULL;
    CHECK("refused", kiln_dataset_open(p, &ds) == KILN_ERR_FORMAT);
    CHECK("message", has(p) && has("3 rows") && has("has 2"));
    free(p);
}

KILN_TEST(data_open_refuses_missing_tensor) {
    float f[6] = {0};
    char *p = raw_dataset("missing.safetensors", KILN_F32, 2, (int64_t[]){3, 2}, f, NULL, NULL,
                          NULL, NULL);
    kiln_dataset *ds = NULL;
    CHECK("refused", kiln_dataset_open(p, &ds) == KILN_ERR_FORMAT);
    CHECK("message", has(p) && has("'targets' is missing"));
    free(p);
    float t[3] = {0};
    p = raw_dataset("renamed.safetensors", KILN_F32, 2, (int64_t[]){3, 2}, f, "target",
                    (int64_t[]){3, 1}, t, NULL);
    CHECK("misnamed tensor",
          kiln_dataset_open(p, &ds) == KILN_ERR_FORMAT && has("'targets' is missing"));
    free(p);
    char *nofile = kiln_test_path("nope.safetensors");
    CHECK("no file", kiln_dataset_open(nofile, &ds) == KILN_ERR_IO && has(nofile));
    free(nofile);
}

KILN_TEST(data_open_refuses_bad_shapes_and_columns) {
    float f[6] = {0}, t[3] = {0};
    kiln_dataset *ds = NULL;
    char *p = raw_dataset("1d.safetensors", KILN_F32, 1, (int64_t[]){6}, f, "targets",
                          (int64_t[]){3, 1}, t, NULL);
    CHECK("1-D refused", kiln_dataset_open(p, &ds) == KILN_ERR_FORMAT && has(p) &&
                             has("1 dimensions") && has("expected 2"));
    free(p);
    p = raw_dataset("empty.safetensors", KILN_F32, 2, (int64_t[]){0, 2}, f, "targets",
                    (int64_t[]){0, 1}, t, NULL);
    CHECK("zero rows refused",
          kiln_dataset_open(p, &ds) == KILN_ERR_FORMAT && has(p) && has("no rows"));
    free(p);
    p = raw_dataset("nocols.safetensors", KILN_F32, 2, (int64_t[]){3, 0}, f, "targets",
                    (int64_t[]){3, 1}, t, NULL);
    CHECK("zero columns refused", kiln_dataset_open(p, &ds) == KILN_ERR_FORMAT && has("0 columns"));
    free(p);
    static const struct {
        const char *cols, *want;
    } bad[] = {
        {"{\"features\":[\"a\"],\"targets\":[\"y\"]}", "lists 1 names but the tensor has 2"},
        {"{\"features\":[\"a\",\"a\"],\"targets\":[\"y\"]}", "'a' is used twice"},
        {"{\"features\":[\"a\",\"b\"],\"targets\":[\"a\"]}", "'a' is used twice"},
        {"{\"features\":[\"a\",\"b\"]}", "'targets' is missing"},
        {"{\"features\":[\"a\",\"b\"],\"targets\":[\"y\"],\"x\":1}", "unknown key 'x'"},
        {"{\"features\":[\"a\",2],\"targets\":[\"y\"]}", "entry 1 is not a non-empty string"},
        {"[1,2]", "not a JSON object"},
        {"{\"features\":", "invalid JSON"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        p = raw_dataset("cols.safetensors", KILN_F32, 2, (int64_t[]){3, 2}, f, "targets",
                        (int64_t[]){3, 1}, t, bad[i].cols);
        kiln_err rc = kiln_dataset_open(p, &ds);
        if (!CHECK(bad[i].want,
                   rc == KILN_ERR_FORMAT && has(p) && has("kiln.columns") && has(bad[i].want)))
            fprintf(stderr, "    got: %s\n", kiln_errmsg());
        free(p);
    }
}

KILN_TEST(data_write_refuses_bad_input_and_keeps_the_old_file) {
    float f[4] = {1, 2, 3, 4}, t[2] = {1, 2};
    char *p = kiln_test_path("keep.safetensors"), *copy = kiln_test_path("copy.safetensors");
    CHECK("write", kiln_dataset_write(p, 2, 2, 1, f, t, NULL) == KILN_OK);
    CHECK("copy", kiln_dataset_write(copy, 2, 2, 1, f, t, NULL) == KILN_OK);
    float fn[4] = {1, 2, NAN, 4};
    CHECK("nan refused", kiln_dataset_write(p, 2, 2, 1, fn, t, NULL) == KILN_ERR_NUMERIC &&
                             has(p) && has("row 1") && has("column 0"));
    json_t *cols = json_pack("{s:[s],s:[s]}", "features", "a", "targets", "y");
    CHECK("columns checked", kiln_dataset_write(p, 2, 2, 1, f, t, cols) == KILN_ERR_FORMAT &&
                                 has(p) && has("lists 1 names"));
    CHECK("zero rows refused",
          kiln_dataset_write(p, 0, 2, 1, f, t, NULL) == KILN_ERR_USAGE && has(p));
    CHECK("old file intact", kiln_test_same_file(p, copy));
    json_decref(cols);
    free(p);
    free(copy);
}

static kiln_dataset fake(size_t rows) {
    return (kiln_dataset){.rows = rows, .n_features = 1, .n_outputs = 1, .path = (char *)"fake"};
}

KILN_TEST(data_split_boundaries_and_purge_gap) {
    kiln_split s;
    kiln_dataset ds = fake(100);
    CHECK("20% of 100, S=10", kiln_dataset_split(&ds, 0.2, 10, &s) == KILN_OK &&
                                  s.val_begin == 80 && s.val_end == 100 && s.train_end == 70);
    CHECK("no validation", kiln_dataset_split(&ds, 0, 10, &s) == KILN_OK && s.train_end == 100 &&
                               s.val_begin == 100 && s.val_end == 100);
    CHECK("small fraction widened to one window",
          kiln_dataset_split(&ds, 0.01, 10, &s) == KILN_OK && s.val_begin == 90 &&
              s.train_end == 80);
    CHECK("exactly three windows",
          (ds = fake(30), kiln_dataset_split(&ds, 0.2, 10, &s)) == KILN_OK && s.train_end == 10 &&
              s.val_begin == 20 && s.val_end == 30);
    CHECK("one row short",
          (ds = fake(29), kiln_dataset_split(&ds, 0.2, 10, &s)) == KILN_ERR_USAGE && has("fake") &&
              has("29 rows"));
    ds = fake(100);
    CHECK("fraction leaves no training window",
          kiln_dataset_split(&ds, 0.9, 10, &s) == KILN_ERR_USAGE &&
              has("less than one training window"));
    CHECK("fraction 1 refused",
          kiln_dataset_split(&ds, 1.0, 10, &s) == KILN_ERR_USAGE && has("outside [0, 1)"));
    CHECK("negative fraction refused", kiln_dataset_split(&ds, -0.1, 10, &s) == KILN_ERR_USAGE);
    CHECK("seq_len 0 refused", kiln_dataset_split(&ds, 0.2, 0, &s) == KILN_ERR_USAGE);
    CHECK("no validation but too short",
          (ds = fake(5), kiln_dataset_split(&ds, 0, 10, &s)) == KILN_ERR_USAGE);
    /* Every accepted split: a full window on each side and a gap of exactly S between. */
    bool ok = true;
    for (size_t n = 1; n < 200; n += 7)
        for (int S = 1; S < 40; S += 3)
            for (double vf = 0.05; vf < 1; vf += 0.15) {
                ds = fake(n);
                if (kiln_dataset_split(&ds, vf, S, &s)) continue;
                ok &= s.train_end >= (size_t)S && s.val_begin - s.train_end == (size_t)S &&
                      s.val_end - s.val_begin >= (size_t)S && s.val_end == n;
            }
    CHECK("every split keeps its windows and gap", ok);
}

KILN_TEST(data_stats_known_values) {
    float f[8] = {1, -1, 2, INFINITY, 3, -1, 4, NAN}, t[4] = {NAN, NAN, NAN, NAN};
    char *p = raw_dataset("stats.safetensors", KILN_F32, 2, (int64_t[]){4, 2}, f, "targets",
                          (int64_t[]){4, 1}, t, NULL);
    kiln_dataset *ds;
    if (CHECK("open", kiln_dataset_open_ex(p, KILN_DATASET_ALLOW_NONFINITE, &ds) == KILN_OK)) {
        kiln_column_stats st[3];
        kiln_dataset_stats(ds, st);
        CHECK("column 0", st[0].mean == 2.5 && fabs(st[0].std - sqrt(1.25)) < 1e-12 &&
                              st[0].min == 1 && st[0].max == 4 && st[0].n_nan == 0 &&
                              st[0].n_inf == 0);
        CHECK("column 1",
              st[1].mean == -1 && st[1].std == 0 && st[1].n_inf == 1 && st[1].n_nan == 1);
        CHECK("all-NaN column", st[2].n_nan == 4 && isnan(st[2].mean) && isnan(st[2].max));
        kiln_dataset_free(ds);
    }
    free(p);
}

static kiln_err synth(uint64_t seed, size_t rows, int F, int O, const char *name, kiln_synth_r2 *r2,
                      char **path) {
    *path = kiln_test_path(name);
    kiln_synth_opts o = {.seed = seed, .rows = rows, .n_features = F, .n_outputs = O};
    return kiln_synth_write(&o, *path, r2);
}

KILN_TEST(data_synth_is_deterministic) {
    char *a, *b, *c;
    CHECK("first", synth(7, 3000, 6, 3, "a.safetensors", NULL, &a) == KILN_OK);
    CHECK("second", synth(7, 3000, 6, 3, "b.safetensors", NULL, &b) == KILN_OK);
    CHECK("other seed", synth(8, 3000, 6, 3, "c.safetensors", NULL, &c) == KILN_OK);
    CHECK("same seed, same bytes", kiln_test_same_file(a, b));
    CHECK("other seed, other bytes", !kiln_test_same_file(a, c));
    kiln_dataset *da = NULL, *dc = NULL;
    if (CHECK("opens",
              kiln_dataset_open(a, &da) == KILN_OK && kiln_dataset_open(c, &dc) == KILN_OK)) {
        CHECK("shape", da->rows == 3000 && da->n_features == 6 && da->n_outputs == 3);
        size_t differ = 0;
        for (size_t i = 0; i < da->rows * 6; i++)
            differ += da->features[i] != dc->features[i];
        CHECK("other seed differs everywhere, not just somewhere", differ > da->rows * 6 * 9 / 10);
        char buf[32];
        CHECK("column names",
              !strcmp(kiln_dataset_column(da, false, 1, buf, sizeof buf), "flow") &&
                  !strcmp(kiln_dataset_column(da, false, 5, buf, sizeof buf), "noise1") &&
                  !strcmp(kiln_dataset_column(da, true, 2, buf, sizeof buf), "fwd_ret_4"));
        kiln_column_stats st[9];
        kiln_dataset_stats(da, st);
        bool unit = true;
        for (int k = 6; k < 9; k++)
            unit &= fabs(st[k].std - 1) < 1e-3;
        CHECK("targets scaled to unit variance", unit);
        CHECK("noise columns are standard normal",
              fabs(st[4].mean) < 0.1 && fabs(st[4].std - 1) < 0.1);
    }
    kiln_st *st = NULL;
    if (CHECK("reopen raw", kiln_st_open(a, &st) == KILN_OK)) {
        const char *m = kiln_st_meta(st, "kiln.synth");
        json_t *j = NULL;
        CHECK("kiln.synth is JSON",
              m && kiln_json_parse(m, strlen(m), "kiln.synth", &j) == KILN_OK);
        CHECK("seed and rows", j && !strcmp(json_string_value(json_object_get(j, "seed")), "7") &&
                                   json_integer_value(json_object_get(j, "rows")) == 3000);
        CHECK("oracle r2 per target",
              j && json_array_size(json_object_get(json_object_get(j, "r2"), "oracle")) == 3);
        json_decref(j);
        kiln_st_close(st);
    }
    kiln_dataset_free(da);
    kiln_dataset_free(dc);
    free(a);
    free(b);
    free(c);
}

/* The features at row t must not depend on anything after t: a longer file with the same
 * seed holds the same feature values in its first rows (targets are scaled per file). */
KILN_TEST(data_synth_has_no_look_ahead) {
    char *a, *b;
    CHECK("short", synth(3, 500, 5, 1, "short.safetensors", NULL, &a) == KILN_OK);
    CHECK("long", synth(3, 900, 5, 1, "long.safetensors", NULL, &b) == KILN_OK);
    kiln_dataset *da = NULL, *db = NULL;
    if (CHECK("open", kiln_dataset_open(a, &da) == KILN_OK && kiln_dataset_open(b, &db) == KILN_OK))
        CHECK("prefix equal", !memcmp(da->features, db->features, 500 * 5 * sizeof(float)));
    kiln_dataset_free(da);
    kiln_dataset_free(db);
    free(a);
    free(b);
}

KILN_TEST(data_synth_r2_in_band) {
    /* Under ASan the run is slower, not different: keep the size (the band needs the rows). */
    kiln_synth_r2 r2;
    char *p;
    bool ok = true;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        if (!CHECK("synth", synth(seed, 20000, 8, 2, "r2.safetensors", &r2, &p) == KILN_OK)) {
            free(p);
            return;
        }
        free(p);
        ok &=
            CHECK("1-step oracle R^2 in [0.12, 0.35]", r2.oracle[0] > 0.12 && r2.oracle[0] < 0.35);
        ok &= CHECK("filtered at most the oracle",
                    r2.filtered[0] <= r2.oracle[0] + 0.01 && r2.filtered[1] <= r2.oracle[1] + 0.01);
        ok &= CHECK("filtered close to the oracle (the regime is learnable)",
                    r2.filtered[0] > 0.75 * r2.oracle[0]);
        ok &= CHECK("a linear model on the current row gets clearly less",
                    r2.linear[0] < 0.5 * r2.oracle[0] && r2.linear[1] < 0.6 * r2.oracle[1]);
        ok &= CHECK("the linear model is not useless either", r2.linear[0] > 0.02);
    }
    if (!ok)
        fprintf(stderr, "    last: oracle %.3f filtered %.3f linear %.3f\n", r2.oracle[0],
                r2.filtered[0], r2.linear[0]);
}

KILN_TEST(data_synth_refuses_bad_sizes) {
    char *p;
    CHECK("3 features refused", synth(1, 1000, 3, 1, "x.safetensors", NULL, &p) == KILN_ERR_USAGE &&
                                    has("4 to") && has("not 3"));
    free(p);
    CHECK("9 outputs refused",
          synth(1, 1000, 4, 9, "x.safetensors", NULL, &p) == KILN_ERR_USAGE && has("not 9"));
    free(p);
    CHECK("too few rows refused",
          synth(1, 10, 4, 1, "x.safetensors", NULL, &p) == KILN_ERR_USAGE && has("not 10"));
    CHECK("nothing written", !kiln_path_exists(p));
    free(p);
}

static kiln_err import(const char *csv_text, const char *feats, const char *targs,
                       const char *out) {
    char *csv = kiln_test_write("in.csv", csv_text, strlen(csv_text));
    const char *f[8], *t[8];
    int nf = 0, nt = 0;
    char fb[128], tb[128];
    snprintf(fb, sizeof fb, "%s", feats);
    snprintf(tb, sizeof tb, "%s", targs);
    for (char *s = strtok(fb, ","); s; s = strtok(NULL, ","))
        f[nf++] = s;
    for (char *s = strtok(tb, ","); s; s = strtok(NULL, ","))
        t[nt++] = s;
    char *o = kiln_test_path(out);
    kiln_err rc = kiln_dataset_import_csv(csv, f, nf, t, nt, o);
    free(o);
    free(csv);
    return rc;
}

KILN_TEST(data_import_csv) {
    const char *good =
        "\xEF\xBB\xBFtime, a ,b,y,c\r\n1,1.5,2,0.25,x\r\n\r\n2, -3 ,4e2,-1,y\r\n3,0,0,0,z";
    if (!CHECK("imports", import(good, "b,a", "y", "ok.safetensors") == KILN_OK)) return;
    char *p = kiln_test_path("ok.safetensors");
    kiln_dataset *ds = NULL;
    if (CHECK("opens", kiln_dataset_open(p, &ds) == KILN_OK)) {
        CHECK("shape (empty line skipped)",
              ds->rows == 3 && ds->n_features == 2 && ds->n_outputs == 1);
        CHECK("columns in the order asked", ds->features[0] == 2 && ds->features[1] == 1.5f &&
                                                ds->features[2] == 400 && ds->features[3] == -3);
        CHECK("targets", ds->targets[0] == 0.25f && ds->targets[1] == -1 && ds->targets[2] == 0);
        char buf[32];
        CHECK("names recorded",
              !strcmp(kiln_dataset_column(ds, false, 0, buf, sizeof buf), "b") &&
                  !strcmp(kiln_dataset_column(ds, true, 0, buf, sizeof buf), "y"));
        kiln_dataset_free(ds);
    }
    char *keep = kiln_test_path("keep.safetensors");
    CHECK("reference copy", import(good, "b,a", "y", "keep.safetensors") == KILN_OK);
    static const struct {
        const char *csv, *f, *t, *want[3];
        kiln_err rc;
    } bad[] = {
        {"a,b,y\n1,2,3\n4,5\n",
         "a,b",
         "y",
         {"line 3", "2 fields", "header has 3"},
         KILN_ERR_FORMAT},
        {"a,b,y\n1,2,3\n4,5,6,7\n", "a,b", "y", {"line 3", "4 fields", ""}, KILN_ERR_FORMAT},
        {"a,b,y\n1,2,3\n4,abc,6\n",
         "a,b",
         "y",
         {"line 3", "column 'b'", "'abc' is not a number"},
         KILN_ERR_FORMAT},
        {"a,b,y\n1,2,3\n4,5,nan\n",
         "a,b",
         "y",
         {"line 3", "column 'y'", "not finite"},
         KILN_ERR_NUMERIC},
        {"a,b,y\n1,-inf,3\n", "a,b", "y", {"line 2", "column 'b'", "not finite"}, KILN_ERR_NUMERIC},
        {"a,b,y\n1,1e39,3\n",
         "a,b",
         "y",
         {"line 2", "column 'b'", "out of range for f32"},
         KILN_ERR_NUMERIC},
        {"a,b,y\n1,,3\n", "a,b", "y", {"line 2", "column 'b'", "empty value"}, KILN_ERR_FORMAT},
        {"a,b,y\n1,2,3\n", "a,q", "y", {"line 1", "no column 'q'", ""}, KILN_ERR_NOTFOUND},
        {"a,b,y\n1,\"2\",3\n",
         "a,b",
         "y",
         {"line 2", "quoted fields are not supported", ""},
         KILN_ERR_UNSUPPORTED},
        {"a,b,a\n1,2,3\n", "a,b", "b", {"chosen twice", "", ""}, KILN_ERR_USAGE},
        {"a,b,a\n1,2,3\n", "a", "b", {"line 1", "'a' appears twice", ""}, KILN_ERR_FORMAT},
        {"a,b,y\n", "a,b", "y", {"no data rows", "", ""}, KILN_ERR_FORMAT},
        {"", "a,b", "y", {"no header", "", ""}, KILN_ERR_FORMAT},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        kiln_err rc = import(bad[i].csv, bad[i].f, bad[i].t, "keep.safetensors");
        bool ok = rc == bad[i].rc && has("in.csv") && has(bad[i].want[0]) && has(bad[i].want[1]) &&
                  has(bad[i].want[2]);
        if (!CHECK(bad[i].want[0][0] ? bad[i].want[1][0] ? bad[i].want[1] : bad[i].want[0] : "?",
                   ok))
            fprintf(stderr, "    case %zu: rc %d: %s\n", i, rc, kiln_errmsg());
        CHECK("existing output left intact", kiln_test_same_file(keep, p));
    }
    char *nofile = kiln_test_path("absent.csv"), *o = kiln_test_path("x.safetensors");
    const char *f[1] = {"a"}, *t[1] = {"b"};
    /* A NUL in the header (a UTF-16 file, say) is refused as one in a row is, not read as
     * the end of the line (which took "a,b\0,c" as the columns a and b). */
    static const char utf16ish[] = "a,b\0,c\n1,2,3\n";
    char *u = kiln_test_write("nul.csv", utf16ish, sizeof utf16ish - 1);
    CHECK("a NUL byte in the header",
          u && kiln_dataset_import_csv(u, f, 1, t, 1, o) == KILN_ERR_FORMAT &&
              kiln_test_msg_has("nul.csv' line 1: a NUL byte", NULL) && !kiln_path_exists(o));
    free(u);
    CHECK("missing CSV",
          kiln_dataset_import_csv(nofile, f, 1, t, 1, o) == KILN_ERR_IO && has(nofile));
    CHECK("nothing written", !kiln_path_exists(o));
    /* The output replaces a dataset only: never the CSV itself, nor another file. */
    static const char prices[] = "a,b\n1,2\n3,4\n";
    char *in = kiln_test_write("prices.csv", prices, sizeof prices - 1);
    CHECK("--out naming the CSV being imported: refused before it is read",
          in && kiln_dataset_import_csv(in, f, 1, t, 1, in) == KILN_ERR_CONFLICT &&
              kiln_test_msg_has("prices.csv' exists and is not a dataset", NULL));
    char *back = NULL;
    size_t blen = 0;
    CHECK("and the CSV is as it was", kiln_read_file(in, 1024, &back, &blen) == KILN_OK &&
                                          blen == sizeof prices - 1 && !memcmp(back, prices, blen));
    free(back);
    char *other = kiln_test_write("positions.csv", "sym,qty\n", 8);
    CHECK("--out naming another file: refused",
          other && kiln_dataset_import_csv(in, f, 1, t, 1, other) == KILN_ERR_CONFLICT &&
              kiln_test_msg_has("positions.csv' exists and is not a dataset", NULL));
    CHECK("--out naming a dataset: replaced",
          kiln_dataset_import_csv(in, f, 1, t, 1, keep) == KILN_OK);
    kiln_synth_opts so = {.seed = 1, .rows = KILN_SYNTH_MIN_ROWS, .n_features = 4, .n_outputs = 1};
    kiln_synth_r2 r2;
    CHECK("kiln data synth over another file: refused",
          kiln_synth_write(&so, other, &r2) == KILN_ERR_CONFLICT &&
              kiln_test_msg_has("is not a dataset", NULL));
    free(in), free(other);
    free(nofile);
    free(o);
    free(keep);
    free(p);
}

/* Every allocation on the open and import paths can fail without a leak or a crash (the
 * sanitizer run checks the leaks). */
KILN_TEST(data_allocation_failures) {
    float f[4] = {1, 2, 3, 4}, t[2] = {1, 2};
    json_t *cols = json_pack("{s:[s,s],s:[s]}", "features", "a", "b", "targets", "y");
    char *p = kiln_test_path("d.safetensors");
    CHECK("write", kiln_dataset_write(p, 2, 2, 1, f, t, cols) == KILN_OK);
    int failed = 0, n;
    for (n = 1; n < 200; n++) {
        kiln_dataset *ds = NULL;
        kiln_alloc_fail_after(n);
        kiln_err rc = kiln_dataset_open(p, &ds);
        kiln_alloc_fail_after(0);
        kiln_dataset_free(ds);
        if (rc == KILN_OK) break;
        failed += rc == KILN_ERR_NOMEM;
    }
    CHECK("open fails cleanly, then succeeds", failed == n - 1 && n > 1 && n < 200);
    const char *csv_text = "a,b,y\n1,2,3\n";
    char *csv = kiln_test_write("in.csv", csv_text, strlen(csv_text)),
         *o = kiln_test_path("o.safetensors");
    const char *fs[2] = {"a", "b"}, *ts[1] = {"y"};
    failed = 0;
    for (n = 1; n < 200; n++) {
        kiln_alloc_fail_after(n);
        kiln_err rc = kiln_dataset_import_csv(csv, fs, 2, ts, 1, o);
        kiln_alloc_fail_after(0);
        if (rc == KILN_OK) break;
        failed += rc == KILN_ERR_NOMEM;
    }
    CHECK("import fails cleanly, then succeeds", failed == n - 1 && n > 1 && n < 200);
    json_decref(cols);
    free(csv);
    free(o);
    free(p);
}

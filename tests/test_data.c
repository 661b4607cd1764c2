/* test_data.c - datasets: every validation error names the file and the problem, the split
 * keeps its purge gap, the synthetic market is deterministic and as learnable as documented,
 * CSV import reports the line and column of bad input and leaves an existing output alone. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "testutil.h"
#include "train_int.h"

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

/* --scale S: the same file with every target times S (to f32 rounding), R^2 unchanged, the
 * scale recorded; scale 1 is the default's bytes. */
KILN_TEST(data_synth_scale) {
    char *one = kiln_test_path("one.st"), *dflt = kiln_test_path("dflt.st"),
         *small = kiln_test_path("small.st"), *big = kiln_test_path("big.st");
    kiln_synth_opts o = {.seed = 3, .rows = 2000, .n_features = 4, .n_outputs = 2};
    kiln_synth_r2 r1, r2;
    CHECK("default", kiln_synth_write(&o, dflt, &r1) == KILN_OK);
    o.scale = 1;
    CHECK("scale 1", kiln_synth_write(&o, one, NULL) == KILN_OK);
    CHECK("scale 1 is the default's bytes", kiln_test_same_file(one, dflt));
    o.scale = 0.01;
    CHECK("scale 0.01", kiln_synth_write(&o, small, &r2) == KILN_OK);
    o.scale = -1;
    CHECK("negative scale refused", kiln_synth_write(&o, big, NULL) == KILN_ERR_USAGE &&
                                        has("scale") && !kiln_path_exists(big));
    kiln_dataset *a = NULL, *b = NULL;
    if (CHECK("open",
              kiln_dataset_open(dflt, &a) == KILN_OK && kiln_dataset_open(small, &b) == KILN_OK)) {
        CHECK("features unchanged", !memcmp(a->features, b->features, a->rows * 4 * sizeof(float)));
        double worst = 0;
        for (size_t i = 0; i < a->rows * 2; i++) {
            double d = fabs(b->targets[i] - 0.01 * a->targets[i]);
            if (d > worst) worst = d;
        }
        CHECK("targets times 0.01", worst < 1e-7);
        kiln_column_stats st[6];
        kiln_dataset_stats(b, st);
        CHECK("target std 0.01", fabs(st[4].std - 0.01) < 1e-6 && fabs(st[5].std - 0.01) < 1e-6);
        bool same = true;
        for (int k = 0; k < 2; k++)
            same = same && fabs(r1.oracle[k] - r2.oracle[k]) < 1e-5 &&
                   fabs(r1.linear[k] - r2.linear[k]) < 1e-5;
        CHECK("R^2 unchanged", same);
    }
    kiln_dataset_free(a);
    kiln_dataset_free(b);
    free(one);
    free(dflt);
    free(small);
    free(big);
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
         {"line 3", "column 'y'", "missing value 'nan'"},
         KILN_ERR_FORMAT},
        {"a,b,y\n1,-inf,3\n", "a,b", "y", {"line 2", "column 'b'", "not finite"}, KILN_ERR_NUMERIC},
        {"a,b,y\n1,1e39,3\n",
         "a,b",
         "y",
         {"line 2", "column 'b'", "out of range for f32"},
         KILN_ERR_NUMERIC},
        {"a,b,y\n1,,3\n",
         "a,b",
         "y",
         {"line 2", "column 'b'", "missing value (empty)"},
         KILN_ERR_FORMAT},
        {"a,b,y\n1,2,3\n", "a,q", "y", {"line 1", "no column 'q'", ""}, KILN_ERR_NOTFOUND},
        {"a,b,y\n1,2\"x,3\n", "a,b", "y", {"line 2, column 4", "bad quoting", ""}, KILN_ERR_FORMAT},
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

static kiln_err import_ex(const char *csv_text, const char *out, kiln_missing missing,
                          kiln_csv_report *rep) {
    char *csv = kiln_test_write("in.csv", csv_text, strlen(csv_text));
    char *o = kiln_test_path(out);
    const char *f[2] = {"a", "b"}, *t[1] = {"y"};
    kiln_csv_import im = {.csv_path = csv,
                          .out_path = o,
                          .features = f,
                          .n_features = 2,
                          .targets = t,
                          .n_outputs = 1,
                          .missing = missing};
    kiln_err rc = kiln_dataset_import_csv_ex(&im, rep);
    free(o);
    free(csv);
    return rc;
}

/* What R's write.csv and pandas' to_csv write, CRLF line ends, quoted numbers and quotes
 * inside quoted fields all import to the bytes of the plain file; every malformed variant is
 * refused naming the line and the column, and nothing is written. */
KILN_TEST(data_import_csv_dialects) {
    const char *plain = "a,b,y\n1.5,2,0.25\n-3,400,-1\n";
    if (!CHECK("plain imports", import_ex(plain, "plain.st", 0, NULL) == KILN_OK)) return;
    char *want = kiln_test_path("plain.st"), *got = kiln_test_path("got.st");
    static const struct {
        const char *what, *csv;
    } same[] = {
        {"R write.csv (quoted header and strings, row names, a date)",
         "\"\",\"date\",\"a\",\"name\",\"b\",\"y\"\n"
         "\"1\",\"1928-01-03\",1.5,\"S&P, \"\"500\"\"\",2,0.25\n"
         "\"2\",\"1928-01-04\",-3,\"x\",400,-1\n"},
        {"pandas to_csv with its index column",
         ",date,a,b,y\n0,1928-01-03,1.5,2.0,0.25\n1,1928-01-04,-3.0,400.0,-1.0\n"},
        {"CRLF line ends", "a,b,y\r\n1.5,2,0.25\r\n-3,400,-1\r\n"},
        {"embedded quotes, commas and a line break",
         "a,note,b,y\n1.5,\"he said \"\"hi, there\"\"\r\nand left\",2,0.25\n-3,\"\",400,-1\n"},
        {"every field quoted",
         "\"a\",\"b\",\"y\"\n\"1.5\",\" 2 \",\"0.25\"\n\"-3\",\"400\",\"-1\""},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(same); i++) {
        kiln_err rc = import_ex(same[i].csv, "got.st", 0, NULL);
        if (!CHECK(same[i].what, rc == KILN_OK && kiln_test_same_file(want, got)))
            fprintf(stderr, "    rc %d: %s\n", rc, kiln_errmsg());
    }
    static const struct {
        const char *csv, *want[2];
    } bad[] = {
        {"a,b,y\n1.5,2,0.25\n-3,4\"00,-1\n", {"line 3, column 5", "bad quoting"}},
        {"a,b,y\n1.5,\"2\"0,0.25\n", {"line 2, column 8", "bad quoting"}},
        {"a,\"b\"x,y\n1.5,2,0.25\n", {"line 1, column 6", "bad quoting"}},
        {"a,b,y\n1.5,2,0.25\n-3,\"400,-1\n", {"line 3, column 4", "not closed"}},
        {"a,b,y\n1.5,2,0.25\n-3,400\n", {"line 3", "column 3 'y' is missing"}},
        {"a,b,y\n1.5,2,0.25\n-3,400,-1,7\n", {"line 3, column 4", "4 fields"}},
        {"a,b,y\n1.5,2,0.25\n-3,NA,-1\n", {"line 3, column 'b'", "missing value 'NA'"}},
        {"a,b,y\n1.5,2,0.25\n-3,x,-1\n", {"line 3, column 'b'", "'x' is not a number"}},
    };
    char *keep = kiln_test_path("keep.st"), *fresh = kiln_test_path("fresh.st");
    CHECK("reference copy", import_ex(plain, "keep.st", 0, NULL) == KILN_OK);
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        kiln_err rc = import_ex(bad[i].csv, "keep.st", 0, NULL);
        bool ok = rc != KILN_OK && has("in.csv") && has(bad[i].want[0]) && has(bad[i].want[1]);
        if (!CHECK(bad[i].want[0], ok)) fprintf(stderr, "    case %zu: %s\n", i, kiln_errmsg());
        CHECK("existing output left intact", kiln_test_same_file(keep, want));
        CHECK("nothing written",
              import_ex(bad[i].csv, "fresh.st", 0, NULL) != KILN_OK && !kiln_path_exists(fresh));
    }
    free(keep);
    free(fresh);
    free(want);
    free(got);
}

/* --missing: drop, ffill and zero each give the file written out by hand, and say what they
 * touched. */
KILN_TEST(data_import_csv_missing) {
    const char *in = "a,b,y\n1,2,3\nNA,5,6\n7,,9\n10,11,NaN\n12,13,14\n";
    static const struct {
        kiln_missing m;
        const char *plain;
        size_t rows, dropped, filled_rows, filled;
    } cases[] = {
        {KILN_MISSING_DROP, "a,b,y\n1,2,3\n12,13,14\n", 2, 3, 0, 0},
        {KILN_MISSING_FFILL, "a,b,y\n1,2,3\n1,5,6\n7,5,9\n10,11,9\n12,13,14\n", 5, 0, 3, 3},
        {KILN_MISSING_ZERO, "a,b,y\n1,2,3\n0,5,6\n7,0,9\n10,11,0\n12,13,14\n", 5, 0, 3, 3},
    };
    char *want = kiln_test_path("want.st"), *got = kiln_test_path("got.st");
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        kiln_csv_report r;
        CHECK("by hand", import_ex(cases[i].plain, "want.st", 0, NULL) == KILN_OK);
        kiln_err rc = import_ex(in, "got.st", cases[i].m, &r);
        CHECK("imports to the same bytes", rc == KILN_OK && kiln_test_same_file(want, got));
        CHECK("report",
              r.rows_read == 5 && r.rows == cases[i].rows && r.rows_dropped == cases[i].dropped &&
                  r.rows_filled == cases[i].filled_rows && r.values_filled == cases[i].filled);
    }
    CHECK("refused by default, naming the first",
          import_ex(in, "got.st", 0, NULL) == KILN_ERR_FORMAT &&
              has("line 3, column 'a': missing value 'NA'"));
    CHECK("ffill with nothing before",
          import_ex("a,b,y\n1,,3\n", "got.st", KILN_MISSING_FFILL, NULL) == KILN_ERR_FORMAT &&
              has("line 2, column 'b'") && has("no earlier value"));
    CHECK("drop of every row",
          import_ex("a,b,y\n1,,3\n", "x.st", KILN_MISSING_DROP, NULL) == KILN_ERR_FORMAT &&
              has("dropped all 1 rows"));
    free(want);
    free(got);
}

KILN_TEST(data_time_parse) {
    int64_t t;
    CHECK("date", kiln_time_parse("1985-01-02", &t) && t == 473472000);
    CHECK("before 1970", kiln_time_parse("1928-01-03", &t) && t == -1325289600);
    CHECK("date-time Z", kiln_time_parse("1985-01-02T15:30:00Z", &t) && t == 473472000 + 55800);
    CHECK("space, no seconds", kiln_time_parse("1985-01-02 15:30", &t) && t == 473472000 + 55800);
    CHECK("offset", kiln_time_parse("1985-01-02T17:30:00+02:00", &t) && t == 473472000 + 55800);
    CHECK("fraction", kiln_time_parse("1985-01-02T15:30:00.250Z", &t) && t == 473472000 + 55800);
    CHECK("epoch seconds", kiln_time_parse("473472000", &t) && t == 473472000);
    CHECK("negative epoch", kiln_time_parse("-86400", &t) && t == -86400);
    static const char *const bad[] = {
        "1985-02-30", "1985-13-01",       "1985-1-2",     "85-01-02", "x",
        "",           "1985-01-02T25:00", "1985-01-02Tx", "1.5",      "1900-02-29"};
    bool all = true;
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++)
        all = all && !kiln_time_parse(bad[i], &t);
    CHECK("not times", all);
    char buf[32];
    kiln_time_format(-1325289600, buf);
    CHECK("format a date", !strcmp(buf, "1928-01-03"));
    kiln_time_format(473472000 + 55800, buf);
    CHECK("format a date-time", !strcmp(buf, "1985-01-02T15:30:00Z"));
    int64_t d;
    CHECK("durations", kiln_duration_parse("30d", &d) && d == 30 * 86400 &&
                           kiln_duration_parse("12h", &d) && d == 43200 &&
                           kiln_duration_parse("90", &d) && d == 90 &&
                           !kiln_duration_parse("3w", &d) && !kiln_duration_parse("-1d", &d));
}

/* A long-format file (date, instrument, features, targets, as R writes it): --time keeps the
 * times, --group groups the rows by instrument in order of first appearance; times going
 * backwards within an instrument are refused naming the line; a file with neither option
 * keeps the plain format's bytes. */
KILN_TEST(data_import_time_and_groups) {
    const char *lng = "\"date\",\"sym\",\"a\",\"b\",\"y\"\n"
                      "\"1985-01-02\",\"SPX\",1,2,3\n"
                      "\"1985-01-02\",\"NDX\",4,5,6\n"
                      "\"1985-01-03\",\"SPX\",7,8,9\n"
                      "\"1985-01-07\",\"NDX\",10,11,12\n"
                      "\"1985-01-07\",\"SPX\",13,14,15\n";
    char *csv = kiln_test_write("in.csv", lng, strlen(lng)), *o = kiln_test_path("g.st");
    const char *f[2] = {"a", "b"}, *t[1] = {"y"};
    kiln_csv_import im = {.csv_path = csv,
                          .out_path = o,
                          .features = f,
                          .n_features = 2,
                          .targets = t,
                          .n_outputs = 1,
                          .time_column = "date",
                          .group_column = "sym"};
    kiln_csv_report rep;
    kiln_dataset *ds = NULL;
    if (CHECK("imports", kiln_dataset_import_csv_ex(&im, &rep) == KILN_OK && rep.n_groups == 2) &&
        CHECK("opens", kiln_dataset_open(o, &ds) == KILN_OK)) {
        static const float a[5] = {1, 7, 13, 4, 10};
        static const int32_t g[5] = {0, 0, 0, 1, 1};
        bool ok = ds->rows == 5 && ds->time && ds->group && ds->n_groups == 2;
        for (int r = 0; ok && r < 5; r++)
            ok = ds->features[r * 2] == a[r] && ds->group[r] == g[r];
        CHECK("rows grouped by instrument, in time order within", ok);
        CHECK("times", ds->time[0] == 473472000 && ds->time[1] == 473472000 + 86400 &&
                           ds->time[3] == 473472000);
        CHECK(
            "group names",
            !strcmp(json_string_value(json_array_get(json_object_get(ds->group_meta, "names"), 1)),
                    "NDX"));
    }
    kiln_dataset_free(ds);
    ds = NULL;
    /* Without the options the same file imports to the plain format's bytes. */
    char *plain = kiln_test_path("plain.st");
    const char *pl = "a,b,y\n1,2,3\n4,5,6\n7,8,9\n10,11,12\n13,14,15\n";
    char *pcsv = kiln_test_write("p.csv", pl, strlen(pl));
    kiln_csv_import pi = im;
    pi.csv_path = pcsv, pi.out_path = plain, pi.time_column = pi.group_column = NULL;
    im.time_column = im.group_column = NULL;
    CHECK("without --time and --group: the plain bytes",
          kiln_dataset_import_csv_ex(&im, NULL) == KILN_OK &&
              kiln_dataset_import_csv_ex(&pi, NULL) == KILN_OK && kiln_test_same_file(o, plain));
    char *keep = kiln_test_path("keep.st");
    CHECK("keep", kiln_test_same_file(o, plain));
    const char *back = "date,sym,a,b,y\n1985-01-02,SPX,1,2,3\n1985-01-03,NDX,4,5,6\n"
                       "1985-01-02,NDX,7,8,9\n";
    free(csv);
    csv = kiln_test_write("in.csv", back, strlen(back));
    im.csv_path = csv;
    im.time_column = "date";
    CHECK("backwards without groups refused, naming the line",
          kiln_dataset_import_csv_ex(&im, NULL) == KILN_ERR_FORMAT &&
              has("line 4, column 'date': the time goes backwards") &&
              has("1985-01-02 after 1985-01-03 on line 3") && kiln_test_same_file(o, plain));
    im.group_column = "sym";
    CHECK("backwards within a group refused",
          kiln_dataset_import_csv_ex(&im, NULL) == KILN_ERR_FORMAT && has("line 4") &&
              has("group 'NDX'"));
    const char *fwd_by_group = "date,sym,a,b,y\n1985-01-03,SPX,1,2,3\n1985-01-02,NDX,4,5,6\n";
    free(csv);
    csv = kiln_test_write("in.csv", fwd_by_group, strlen(fwd_by_group));
    im.csv_path = csv;
    CHECK("each group in order is accepted", kiln_dataset_import_csv_ex(&im, NULL) == KILN_OK);
    const char *badtime = "date,sym,a,b,y\n1985-01-02,SPX,1,2,3\n1985-02-30,SPX,4,5,6\n";
    free(csv);
    csv = kiln_test_write("in.csv", badtime, strlen(badtime));
    im.csv_path = csv;
    CHECK("a bad time refused", kiln_dataset_import_csv_ex(&im, NULL) == KILN_ERR_FORMAT &&
                                    has("line 3, column 'date': '1985-02-30' is not a time"));
    im.time_column = "nope";
    CHECK("no such time column",
          kiln_dataset_import_csv_ex(&im, NULL) == KILN_ERR_NOTFOUND && has("no column 'nope'"));
    im.time_column = "a";
    CHECK("a column both time and feature",
          kiln_dataset_import_csv_ex(&im, NULL) == KILN_ERR_USAGE && has("chosen twice"));
    free(keep);
    free(csv), free(pcsv), free(o), free(plain);
}

/* Windows never cross from one instrument to another, by construction: every training window
 * the sampler draws and every validation window lies inside one group's training or
 * validation rows, and the split is at the same time in every group. */
KILN_TEST(data_split_groups_and_time) {
    /* Three instruments of 300, 120 and 500 daily rows, starting on different days. */
    const size_t len[3] = {300, 120, 500}, N = 920;
    const int64_t day = 86400, start[3] = {0, 100 * day, 50 * day};
    float *fx = calloc(N, sizeof *fx), *ty = calloc(N, sizeof *ty);
    int64_t *tm = calloc(N, sizeof *tm);
    int32_t *gp = calloc(N, sizeof *gp);
    size_t r = 0;
    for (int g = 0; g < 3; g++)
        for (size_t k = 0; k < len[g]; k++, r++) {
            fx[r] = (float)r;
            ty[r] = (float)g;
            tm[r] = start[g] + (int64_t)k * day;
            gp[r] = g;
        }
    const char *names[3] = {"A", "B", "C"};
    kiln_dataset_extra x = {.time = tm,
                            .time_column = "date",
                            .group = gp,
                            .n_groups = 3,
                            .group_names = names,
                            .group_column = "sym"};
    char *p = kiln_test_path("g.st");
    kiln_dataset *ds = NULL;
    kiln_split sp = {0};
    if (!CHECK("write and open",
               kiln_dataset_write_extra(p, N, 1, 1, fx, ty, NULL, NULL, &x) == KILN_OK &&
                   kiln_dataset_open(p, &ds) == KILN_OK))
        goto out;
    const int S = 16;
    kiln_split_opts so = {
        .val_fraction = 0.2, .seq_len = S, .val_from = "1970-07-01", .purge_secs = 30 * day};
    if (!CHECK("split", kiln_dataset_split_ex(ds, &so, &sp) == KILN_OK && sp.n_ranges == 3))
        goto out;
    int64_t from;
    kiln_time_parse("1970-07-01", &from);
    bool in_time = true;
    for (size_t g = 0; g < 3; g++) {
        const kiln_split_range *q = &sp.ranges[g];
        for (size_t i = q->train_begin; i < q->train_end; i++)
            in_time = in_time && ds->time[i] < from - 30 * day && ds->group[i] == (int)g;
        for (size_t i = q->val_begin; i < q->val_end; i++)
            in_time = in_time && ds->time[i] >= from && ds->group[i] == (int)g;
        in_time = in_time && q->val_begin >= q->train_end + (size_t)S;
    }
    CHECK("every group split at val_from, purged 30 days and at least seq_len rows", in_time);
    bool one_group = true;
    size_t hits[3] = {0};
    for (long i = 0; i < 2000; i++) {
        size_t s0 = kiln_train_window_split(7, i, 1, 0, &sp, S);
        int g = ds->group[s0];
        hits[g]++;
        one_group = one_group && s0 + S <= sp.ranges[g].train_end && s0 >= sp.ranges[g].train_begin;
    }
    CHECK("training windows lie in one group's training rows", one_group);
    CHECK("every group with a window is drawn", hits[0] && hits[1] && hits[2]);
    size_t vs[64], nv = kiln_split_val_windows(&sp, S, 64, vs);
    bool vok = nv > 0;
    for (size_t k = 0; k < nv; k++) {
        int g = ds->group[vs[k]];
        vok = vok && vs[k] >= sp.ranges[g].val_begin && vs[k] + S <= sp.ranges[g].val_end;
    }
    CHECK("validation windows lie in one group's validation rows", vok);
    kiln_split_release(&sp);
    /* The same rows without groups (one series of times) are split by the time, too. */
    so.val_from = "1970-12-01";
    so.purge_secs = 0;
    kiln_dataset_free(ds);
    ds = NULL;
    x.group = NULL;
    for (size_t i = 0; i < N; i++)
        tm[i] = (int64_t)i * day;
    CHECK("one series", kiln_dataset_write_extra(p, N, 1, 1, fx, ty, NULL, NULL, &x) == KILN_OK &&
                            kiln_dataset_open(p, &ds) == KILN_OK &&
                            kiln_dataset_split_ex(ds, &so, &sp) == KILN_OK && !sp.n_ranges &&
                            sp.val_begin == 334 && sp.train_end == 334 - (size_t)S);
    so.val_from = "1975-01-01";
    CHECK("a val_from after the data refused",
          kiln_dataset_split_ex(ds, &so, &sp) == KILN_ERR_USAGE && has("no validation window"));
    so.val_from = "nope";
    CHECK("a bad val_from refused",
          kiln_dataset_split_ex(ds, &so, &sp) == KILN_ERR_USAGE && has("not a time"));
out:
    kiln_split_release(&sp);
    kiln_dataset_free(ds);
    free(p), free(fx), free(ty), free(tm), free(gp);
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

/* kiln_synth_write fails cleanly at each of its allocations (KILN_ERR_NOMEM, nothing written
 * at the path; under ASan, nothing leaked), then writes the bytes a run without failures
 * wrote. */
KILN_TEST(data_synth_allocation_failures) {
    char *ref = NULL, *p = kiln_test_path("synth-nomem.safetensors");
    CHECK("reference", synth(5, 300, 6, 3, "synth-ref.safetensors", NULL, &ref) == KILN_OK);
    kiln_synth_opts o = {.seed = 5, .rows = 300, .n_features = 6, .n_outputs = 3};
    int failed = 0, n;
    bool written = false;
    for (n = 1; n < 200; n++) {
        kiln_alloc_fail_after(n);
        kiln_err rc = kiln_synth_write(&o, p, NULL);
        kiln_alloc_fail_after(0);
        if (rc == KILN_OK) break;
        failed += rc == KILN_ERR_NOMEM;
        written |= kiln_path_exists(p);
    }
    CHECK("synth fails cleanly, then succeeds", failed == n - 1 && n > 1 && n < 200 && !written);
    CHECK("the same bytes", kiln_test_same_file(ref, p));
    free(ref);
    free(p);
}

/* Times are bounded to the years 0000 to 9999 (data.h): epoch seconds at int64's ends were
 * imported and made inspect print year 292277026596 and a negative median step. */
KILN_TEST(data_time_bounds) {
    int64_t t;
    CHECK("the first second of year 0", kiln_time_parse("0000-01-01", &t) && t == KILN_TIME_MIN);
    CHECK("the last second of 9999",
          kiln_time_parse("9999-12-31T23:59:59Z", &t) && t == KILN_TIME_MAX);
    CHECK("epoch seconds at the bounds",
          kiln_time_parse("-62167219200", &t) && t == KILN_TIME_MIN &&
              kiln_time_parse("253402300799", &t) && t == KILN_TIME_MAX);
    static const char *const out[] = {"-62167219201",           "253402300800",
                                      "9223372036854775807",    "-9223372036854775808",
                                      "0000-01-01T00:00+01:00", "9999-12-31T23:59:60Z"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(out); i++) {
        char d[96];
        snprintf(d, sizeof d, "'%s' refused", out[i]);
        CHECK(d, !kiln_time_parse(out[i], &t));
    }
    char buf[32];
    kiln_time_format(KILN_TIME_MIN, buf);
    CHECK("format year 0", !strcmp(buf, "0000-01-01"));
    kiln_time_format(KILN_TIME_MAX, buf);
    CHECK("format year 9999", !strcmp(buf, "9999-12-31T23:59:59Z"));
    kiln_time_format(INT64_MIN, buf);
    CHECK("format never overflows", !strcmp(buf, "epoch -9223372036854775808"));
    kiln_time_format(INT64_MAX, buf);
    CHECK("format never overflows (max)", !strcmp(buf, "epoch 9223372036854775807"));
    int64_t d;
    CHECK("a duration of the whole span", kiln_duration_parse("3652424d", &d));
    CHECK("longer durations refused",
          !kiln_duration_parse("3652425d", &d) && !kiln_duration_parse("9223372036854775807", &d));

    /* Import: the extremes refused naming the line; the bounds taken. */
    const char *ext = "t,a,y\n0,1,2\n9223372036854775807,3,4\n";
    char *csv = kiln_test_write("ext.csv", ext, strlen(ext)), *o = kiln_test_path("ext.st");
    const char *f[1] = {"a"}, *tg[1] = {"y"};
    kiln_csv_import im = {.csv_path = csv,
                          .out_path = o,
                          .features = f,
                          .n_features = 1,
                          .targets = tg,
                          .n_outputs = 1,
                          .time_column = "t"};
    CHECK("int64's end refused at import",
          kiln_dataset_import_csv_ex(&im, NULL) == KILN_ERR_FORMAT && has("line 3, column 't'") &&
              has("years 0000 to 9999") && !kiln_path_exists(o));
    const char *bounds = "t,a,y\n-62167219200,1,2\n253402300799,3,4\n";
    free(csv);
    csv = kiln_test_write("ext.csv", bounds, strlen(bounds));
    im.csv_path = csv;
    kiln_dataset *ds = NULL;
    CHECK("the bounds imported", kiln_dataset_import_csv_ex(&im, NULL) == KILN_OK &&
                                     kiln_dataset_open(o, &ds) == KILN_OK && ds->time &&
                                     ds->time[1] - ds->time[0] == KILN_TIME_MAX - KILN_TIME_MIN);
    kiln_dataset_free(ds);
    ds = NULL;

    /* The writer refuses them, and a file that holds them anyway does not open. */
    float fx[2] = {1, 2}, ty[2] = {3, 4};
    int64_t tm[2] = {INT64_MIN, INT64_MAX};
    kiln_dataset_extra x = {.time = tm, .time_column = "t"};
    char *w = kiln_test_path("w.st");
    CHECK("the writer refuses them",
          kiln_dataset_write_extra(w, 2, 1, 1, fx, ty, NULL, NULL, &x) == KILN_ERR_USAGE &&
              has("tensor 'time' row 0") && !kiln_path_exists(w));
    kiln_st_writer *sw;
    if (CHECK("raw writer", kiln_st_writer_new(&sw) == KILN_OK)) {
        kiln_err rc = kiln_st_writer_add(sw, "features", KILN_F32, 2, (int64_t[]){2, 1}, fx);
        if (!rc) rc = kiln_st_writer_add(sw, "targets", KILN_F32, 2, (int64_t[]){2, 1}, ty);
        if (!rc) rc = kiln_st_writer_add(sw, "time", KILN_I64, 1, (int64_t[]){2}, tm);
        if (!rc) rc = kiln_st_writer_meta(sw, "kiln.time", "{\"column\":\"t\"}");
        if (!rc) rc = kiln_st_writer_write(sw, w);
        kiln_st_writer_free(sw);
        CHECK("written raw", rc == KILN_OK);
        CHECK("open refuses them, naming the row", kiln_dataset_open(w, &ds) == KILN_ERR_FORMAT &&
                                                       has("tensor 'time' row 0") &&
                                                       has("outside the years 0000 to 9999"));
        kiln_dataset_free(ds);
    }
    free(w), free(csv), free(o);
}

/* CSV import, third round of hostile files (issue 29): a group name not UTF-8, a --time or
 * --group column named twice, f32's largest value as export writes it, a 4 MiB field. */
KILN_TEST(data_import_hostile_csv) {
    const char *f[1] = {"a"}, *tg[1] = {"y"};
    char *o = kiln_test_path("h.st"), *keep = kiln_test_path("keep.st");
    float fx[1] = {7}, ty[1] = {8};
    CHECK("an existing output", kiln_dataset_write(o, 1, 1, 1, fx, ty, NULL) == KILN_OK &&
                                    kiln_dataset_write(keep, 1, 1, 1, fx, ty, NULL) == KILN_OK);
    kiln_csv_import im = {
        .out_path = o, .features = f, .n_features = 1, .targets = tg, .n_outputs = 1};
    const char *latin1 = "g,a,y\nSPX,1,2\nCAC\xe9,3,4\n";
    char *csv = kiln_test_write("h.csv", latin1, strlen(latin1));
    im.csv_path = csv;
    im.group_column = "g";
    CHECK("a group name in Latin-1 refused, naming line, column and byte",
          kiln_dataset_import_csv_ex(&im, NULL) == KILN_ERR_FORMAT && has("line 3, column 'g'") &&
              has("not valid UTF-8") && has("byte 4") && kiln_test_same_file(o, keep));
    const char *overlong = "g,a,y\n\xc0\xaf,1,2\n";
    free(csv);
    csv = kiln_test_write("h.csv", overlong, strlen(overlong));
    im.csv_path = csv;
    CHECK("an overlong form refused", kiln_dataset_import_csv_ex(&im, NULL) == KILN_ERR_FORMAT &&
                                          has("line 2") && has("not valid UTF-8"));
    const char *utf8 = "g,a,y\n\xe6\x97\xa5\xe7\xb5\x8c,1,2\nSPX,3,4\n";
    free(csv);
    csv = kiln_test_write("h.csv", utf8, strlen(utf8));
    im.csv_path = csv;
    kiln_dataset *ds = NULL;
    CHECK("a UTF-8 group name taken, and the file opens",
          kiln_dataset_import_csv_ex(&im, NULL) == KILN_OK &&
              kiln_dataset_open(o, &ds) == KILN_OK && ds->n_groups == 2);
    kiln_dataset_free(ds);
    ds = NULL;
    const char *badname = "g\xff";
    im.group_column = badname;
    CHECK("a chosen column name not UTF-8 refused as such",
          kiln_dataset_import_csv_ex(&im, NULL) == KILN_ERR_USAGE && has("not valid UTF-8"));

    /* Two columns of the --time or --group name: refused like a feature named twice (the
     * last one won). */
    CHECK("keep", kiln_dataset_write(o, 1, 1, 1, fx, ty, NULL) == KILN_OK);
    const char *twot = "t,a,t,y\n1985-01-02,1,1985-01-01,2\n";
    free(csv);
    csv = kiln_test_write("h.csv", twot, strlen(twot));
    im.csv_path = csv;
    im.group_column = NULL;
    im.time_column = "t";
    CHECK("--time's column twice",
          kiln_dataset_import_csv_ex(&im, NULL) == KILN_ERR_FORMAT &&
              has("column 't' appears twice in the header (columns 1 and 3)") &&
              kiln_test_same_file(o, keep));
    const char *twog = "g,a,g,y\nSPX,1,NDX,2\n";
    free(csv);
    csv = kiln_test_write("h.csv", twog, strlen(twog));
    im.csv_path = csv;
    im.time_column = NULL;
    im.group_column = "g";
    CHECK("--group's column twice",
          kiln_dataset_import_csv_ex(&im, NULL) == KILN_ERR_FORMAT &&
              has("column 'g' appears twice in the header (columns 1 and 3)"));
    im.group_column = NULL;

    /* f32's largest value, as %.9g writes it, reads back as itself; past half a step, no. */
    const char *big = "a,y\n3.40282347e+38,-3.40282347e+38\n3.4028235e38,1\n";
    free(csv);
    csv = kiln_test_write("h.csv", big, strlen(big));
    im.csv_path = csv;
    CHECK("FLT_MAX as export writes it",
          kiln_dataset_import_csv_ex(&im, NULL) == KILN_OK &&
              kiln_dataset_open(o, &ds) == KILN_OK && ds->features[0] == FLT_MAX &&
              ds->targets[0] == -FLT_MAX && ds->features[1] == FLT_MAX);
    kiln_dataset_free(ds);
    ds = NULL;
    const char *over = "a,y\n3.4028236e38,1\n";
    free(csv);
    csv = kiln_test_write("h.csv", over, strlen(over));
    im.csv_path = csv;
    CHECK("past FLT_MAX and half a step: refused",
          kiln_dataset_import_csv_ex(&im, NULL) == KILN_ERR_NUMERIC && has("out of range for f32"));

    /* A 4 MiB field in a column not chosen: libcsv grew its buffer 128 bytes at a time (32768
     * growths, each an allocation: quadratic); now a few. */
    size_t n = (size_t)4 << 20;
    char *text = malloc(n + 64);
    if (CHECK("buffer", text)) {
        size_t k = (size_t)sprintf(text, "a,note,y\n1,\"");
        memset(text + k, 'x', n);
        k += n;
        k += (size_t)sprintf(text + k, "\",2\n");
        free(csv);
        csv = kiln_test_write("h.csv", text, k);
        im.csv_path = csv;
        /* Counted by the countdown kiln_alloc_fail_after sets: what the import left of it is
         * found by allocating until the failure comes. An import that used it all (and got
         * past the failure: libcsv retries a smaller growth) leaves none to find. */
        kiln_alloc_fail_after(1000);
        kiln_err rc = kiln_dataset_import_csv_ex(&im, NULL);
        long left = 0;
        for (void *q; left < 1000 && (q = kiln_malloc(1)); left++)
            free(q);
        kiln_alloc_fail_after(0);
        CHECK("the 4 MiB field imports", rc == KILN_OK);
        CHECK("in fewer than 1000 allocations", left < 1000);
        kiln_errclear();
        free(text);
    }
    free(csv), free(o), free(keep);
}

/* kiln data export's header: RFC 4180 quoting, and never a formula in a spreadsheet. */
KILN_TEST(data_csv_header_field) {
    static const char *const cases[][2] = {
        {"ret", "ret"},
        {"a,b", "\"a,b\""},
        {"say \"hi\"", "\"say \"\"hi\"\"\""},
        {"two\nlines", "\"two\nlines\""},
        {"cr\rhere", "\"cr\rhere\""},
        {"=SUM(A1:A9)", "'=SUM(A1:A9)"},
        {"+1", "'+1"},
        {"-x", "'-x"},
        {"@cmd", "'@cmd"},
        {"=a,\"b\"", "\"'=a,\"\"b\"\"\""},
        {"a=b", "a=b"},
        {"", ""},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        char *got = kiln_csv_header_field(cases[i][0]), d[128];
        snprintf(d, sizeof d, "header field of '%s' is '%s'", cases[i][0], got ? got : "(null)");
        CHECK(d, got && !strcmp(got, cases[i][1]));
        free(got);
    }
}

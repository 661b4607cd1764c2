/* test_api.c - kiln.h's datasets-and-runs section (data/data_api.c, runs/run_api.c), what
 * python/kiln calls: the dataset round trip with and without names, refusals that keep the
 * file, a run read back with its state, checkpoints and best one, and the runs list as
 * `kiln runs list --json` prints it.
 * (tests/python/ holds them against the CLI on real runs; this is for ASan.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"
#include "runs_int.h"
#include "test.h"
#include "testutil.h"
#include "train_int.h"

KILN_TEST(api_data_roundtrip) {
    const float x[6] = {1, 2, 3, 4, 5, 6}, y[3] = {0.5f, -1, 2};
    const char *fn[2] = {"a", "b"}, *tn[1] = {"t"};
    char *p = kiln_test_path("d.safetensors");
    CHECK("write with names", kiln_data_write(p, 3, 2, 1, x, y, fn, tn) == KILN_OK);
    kiln_data *d = NULL;
    if (!CHECK("open", kiln_data_open(p, &d) == KILN_OK)) goto out;
    size_t rows = 0;
    int F = 0, O = 0;
    kiln_data_shape(d, &rows, &F, &O);
    CHECK("shape", rows == 3 && F == 2 && O == 1);
    CHECK("features", !memcmp(kiln_data_features(d), x, sizeof x));
    CHECK("targets", !memcmp(kiln_data_targets(d), y, sizeof y));
    CHECK("names", !strcmp(kiln_data_column(d, 0, 1), "b") && !strcmp(kiln_data_column(d, 1, 0), "t"));
    CHECK("out of range", !kiln_data_column(d, 0, 2) && !kiln_data_column(d, 1, -1));
    CHECK("digest", strlen(kiln_data_sha256(d)) == 64);
    kiln_data_free(d);
    d = NULL;

    /* Refusals leave the file as it was. */
    char before[65] = "";
    if (CHECK("opens", kiln_data_open(p, &d) == KILN_OK))
        snprintf(before, sizeof before, "%s", kiln_data_sha256(d));
    kiln_data_free(d);
    d = NULL;
    const float bad[6] = {1, 2, 3, NAN, 5, 6};
    CHECK("non-finite refused", kiln_data_write(p, 3, 2, 1, bad, y, NULL, NULL) == KILN_ERR_NUMERIC &&
                                    strstr(kiln_errmsg(), "features row 1 column 1"));
    CHECK("one list of names refused",
          kiln_data_write(p, 3, 2, 1, x, y, fn, NULL) == KILN_ERR_USAGE &&
              strstr(kiln_errmsg(), "or neither"));
    const char *dup[2] = {"a", "a"};
    CHECK("a name twice refused", kiln_data_write(p, 3, 2, 1, x, y, dup, tn) != KILN_OK &&
                                      strstr(kiln_errmsg(), "used twice"));
    CHECK("no rows refused", kiln_data_write(p, 0, 2, 1, x, y, NULL, NULL) == KILN_ERR_USAGE);
    if (CHECK("reopens", kiln_data_open(p, &d) == KILN_OK))
        CHECK("file unchanged", !strcmp(before, kiln_data_sha256(d)));
    kiln_data_free(d);
    d = NULL;

    /* Without names: no kiln.columns. */
    char *q = kiln_test_path("n.safetensors");
    CHECK("write without names", kiln_data_write(q, 3, 2, 1, x, y, NULL, NULL) == KILN_OK);
    if (CHECK("open", kiln_data_open(q, &d) == KILN_OK))
        CHECK("no names", !kiln_data_column(d, 0, 0) && !kiln_data_column(d, 1, 0));
    kiln_data_free(d);
    free(q);
    char *missing = kiln_test_path("missing.safetensors");
    d = (kiln_data *)1;
    CHECK("missing file", kiln_data_open(missing, &d) != KILN_OK && !d &&
                              strstr(kiln_errmsg(), "missing.safetensors"));
    free(missing);
out:
    kiln_data_free(NULL);
    free(p);
}

/* A finished 4-step run: validations at 2 (0.5) and 4 (0.75), checkpoints at 2 and 4. */
static char *fake_run(const char *name) {
    char *dir = kiln_test_path(name);
    kiln_test_put(dir, "run.json",
                  "{\"format\":\"kiln-run/1\",\"run_id\":\"r1\",\"dataset_sha256\":\"ab\","
                  "\"config\":{\"steps\":4,\"lr\":0.001}}");
    kiln_test_put(dir, "ckpt/step-00000002.safetensors", "");
    kiln_test_put(dir, "ckpt/step-00000004.safetensors", "");
    char *db = kiln_path_join(dir, "metrics.db");
    kiln_run_metrics *mx;
    if (kiln_run_metrics_open(db, false, &mx) == KILN_OK) {
        kiln_run_metrics_event(mx, 0, "start", "run started");
        for (int i = 1; i <= 4; i++) {
            kiln_train_progress pr = {.step = i, .loss = 1.0 / i, .grad_norm = 1, .applied = true,
                                      .tokens_per_s = 1000, .has_val = i % 2 == 0,
                                      .val_loss = i == 2 ? 0.5 : 0.75, .val_r2 = 0.125};
            kiln_run_metrics_step(mx, &pr, NULL, 0);
        }
        kiln_run_metrics_close(mx);
    }
    free(db);
    return dir;
}

KILN_TEST(api_run_read) {
    char *dir = fake_run("sweep/a");
    char *text = NULL;
    if (CHECK("reads", kiln_run_read(dir, &text) == KILN_OK)) {
        json_t *j = json_loads(text, 0, NULL);
        json_t *ck = json_object_get(j, "checkpoints");
        CHECK("state", !strcmp(json_string_value(json_object_get(j, "state")), "finished"));
        CHECK("step", json_integer_value(json_object_get(j, "step")) == 4);
        CHECK("message null", json_is_null(json_object_get(j, "message")));
        CHECK("run.json", json_integer_value(json_object_get(
                              json_object_get(json_object_get(j, "run"), "config"), "steps")) == 4);
        CHECK("two checkpoints", json_array_size(ck) == 2 &&
                                     json_integer_value(json_object_get(json_array_get(ck, 1), "step")) == 4 &&
                                     strstr(json_string_value(json_object_get(json_array_get(ck, 0), "path")),
                                            "ckpt/step-00000002.safetensors"));
        CHECK("best: the lowest validation loss",
              json_integer_value(json_object_get(j, "best_checkpoint")) == 2);
        json_decref(j);
    }
    kiln_free(text);
    text = (char *)1;
    char *none = kiln_test_path("none");
    CHECK("no run", kiln_run_read(none, &text) == KILN_ERR_NOTFOUND && !text &&
                        strstr(kiln_errmsg(), "no run.json"));
    free(none);
    free(dir);
}

KILN_TEST(api_runs_list) {
    free(fake_run("sweep/a"));
    free(fake_run("sweep/b"));
    char *sweep = kiln_test_path("sweep");
    const char *paths[1] = {sweep}, *where[1] = {"lr=1e-3"};
    char *text = NULL;
    if (CHECK("lists", kiln_runs_list(paths, 1, where, 1, "-step", 1, &text) == KILN_OK)) {
        /* The text kiln runs list --json prints (cli/cmd_runs.c), less its newline. */
        const kiln_run_list_opts o = {where, 1, "-step", 1};
        kiln_run_list l = {0};
        char *want = NULL;
        if (CHECK("loads", kiln_run_list_load(paths, 1, &o, &l) == KILN_OK)) {
            json_t *doc = kiln_run_list_json(&l);
            want = json_dumps(doc, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
            json_decref(doc);
        }
        CHECK("the CLI's text", want && !strcmp(text, want));
        CHECK("top 1 of 2", strstr(text, "\"found\": 2") && strstr(text, "\"name\": \"a\"") &&
                                !strstr(text, "\"name\": \"b\""));
        free(want);
        kiln_run_list_release(&l);
    }
    kiln_free(text);
    text = (char *)1;
    CHECK("bad sort key", kiln_runs_list(paths, 1, NULL, 0, "bogus", 0, &text) == KILN_ERR_USAGE &&
                              !text && strstr(kiln_errmsg(), "bogus"));
    CHECK("no paths", kiln_runs_list(paths, 0, NULL, 0, NULL, 0, &text) == KILN_ERR_USAGE);
    free(sweep);
}

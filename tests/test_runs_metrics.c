/* test_runs_metrics.c - runs/'s metrics log as the trainer writes it (kiln_run_metrics_*)
 * and the readers over it: a run's info, diff, truncation on a resume, the series of
 * kiln runs plot and the refusals that name the run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "runs.h"
#include "test.h"
#include "testutil.h"

static bool has(const char *s) {
    return strstr(kiln_errmsg(), s) != NULL;
}

static void fake_run(const char *name, const double *losses, int n) {
    char *dir = kiln_test_path(name);
    kiln_mkdir_p(dir);
    char *rj = kiln_path_join(dir, "run.json"), *db = kiln_path_join(dir, "metrics.db");
    const char *text =
        "{\"run_id\":\"x\",\"dataset_sha256\":\"ab\",\"config\":{\"steps\":10,\"lr\":0.5}}";
    kiln_write_file_atomic(rj, text, strlen(text));
    kiln_run_metrics *mx;
    if (kiln_run_metrics_open(db, false, &mx) == KILN_OK) {
        float ent[1] = {0.5f}, load[2] = {1.0f, 0.0f}, ov[1] = {0}, rms[1] = {1};
        kiln_tsmoe_stats st = {1, 2, ent, ent, load, ov, rms, 3.0f};
        kiln_run_metrics_tensor t[1] = {{"head.weight", 0.25, 0.001}};
        for (int i = 0; i < n; i++) {
            kiln_train_progress p = {.step = i + 1,
                                     .steps = 10,
                                     .loss = losses[i],
                                     .lr = 0.5,
                                     .applied = true,
                                     .stats = &st,
                                     .has_val = i == 1,
                                     .val_loss = 0.75,
                                     .val_r2 = 0.25};
            kiln_run_metrics_step(mx, &p, t, 1);
        }
        kiln_run_metrics_event(mx, 2, "spike", "step 2: loss spike");
        kiln_run_metrics_close(mx);
    }
    free(rj), free(db), free(dir);
}

KILN_TEST(runs_metrics_info_and_diff) {
    double la[] = {1.0, 0.5, 0.25, 0.125}, lb[] = {1.0, 0.5, nextafter(0.25, 1), 0.125};
    fake_run("a", la, 4);
    fake_run("b", la, 4);
    fake_run("c", lb, 4);
    char *a = kiln_test_path("a"), *b = kiln_test_path("b"), *c = kiln_test_path("c");
    kiln_run_info ri;
    if (CHECK("info", kiln_run_info_load(a, 10, &ri) == KILN_OK)) {
        CHECK("last step", ri.last_step == 4 && ri.last_loss == 0.125);
        CHECK("validation",
              ri.best_val_step == 2 && ri.best_val_r2 == 0.25 && ri.last_val_step == 2);
        CHECK("events",
              ri.n_events == 1 && ri.total_events == 1 && !strcmp(ri.events[0].kind, "spike"));
        kiln_run_info_release(&ri);
    }
    kiln_run_diff d;
    if (CHECK("diff a b", kiln_run_diff_load(a, b, &d) == KILN_OK)) {
        CHECK("identical",
              d.first_diff == 0 && d.common_steps == 4 && json_object_size(d.config) == 0);
        kiln_run_diff_release(&d);
    }
    if (CHECK("diff a c", kiln_run_diff_load(a, c, &d) == KILN_OK)) {
        CHECK("one ulp found",
              d.first_diff == 3 && d.a_loss == 0.25 && d.b_loss == nextafter(0.25, 1));
        kiln_run_diff_release(&d);
    }
    /* A resume truncates: rows after the checkpoint go, the rest stay. */
    char *db = kiln_path_join(a, "metrics.db");
    kiln_run_metrics *mx;
    if (CHECK("reopen", kiln_run_metrics_open(db, false, &mx) == KILN_OK)) {
        CHECK("truncate", kiln_run_metrics_truncate(mx, 2) == KILN_OK);
        kiln_run_metrics_close(mx);
    }
    if (CHECK("info after truncate", kiln_run_info_load(a, 10, &ri) == KILN_OK)) {
        CHECK("rows after step 2 gone", ri.last_step == 2 && ri.n_events == 1);
        kiln_run_info_release(&ri);
    }
    if (CHECK("diff after truncate", kiln_run_diff_load(a, b, &d) == KILN_OK)) {
        CHECK("common prefix identical",
              d.first_diff == 0 && d.common_steps == 2 && d.a_steps == 2 && d.b_steps == 4);
        kiln_run_diff_release(&d);
    }
    char *none = kiln_test_path("none");
    CHECK("not a run",
          kiln_run_info_load(none, 10, &ri) == KILN_ERR_NOTFOUND && has("run.json") && has(none));
    /* A field of another type is a damaged run.json, not a "?" to show (and a differing one
     * to diff): refused by name, the run left as it was. */
    char *rj = kiln_path_join(c, "run.json"), *text = NULL;
    size_t len = 0;
    const char *bad = "{\"run_id\":[true],\"dataset_sha256\":\"ab\",\"config\":{\"steps\":10}}";
    if (CHECK("damage run.json", rj && kiln_write_file_atomic(rj, bad, strlen(bad)) == KILN_OK)) {
        CHECK("runs show refuses a run_id of the wrong type",
              kiln_run_info_load(c, 10, &ri) == KILN_ERR_FORMAT && has(rj) && has("run_id"));
        CHECK("runs diff too", kiln_run_diff_load(a, c, &d) == KILN_ERR_FORMAT && has(rj));
        CHECK("run.json unchanged", kiln_read_file(rj, 1 << 10, &text, &len) == KILN_OK &&
                                        len == strlen(bad) && !memcmp(text, bad, len));
    }
    free(text), free(rj);
    free(none), free(db), free(a), free(b), free(c);
}

/* kiln runs plot's series: every kind of metric, a non-finite step, the step range, and
 * the refusals that name the run and the metric. */
KILN_TEST(runs_metrics_series) {
    double la[] = {1.0, NAN, 0.25, 0.125};
    fake_run("s", la, 4);
    char *dir = kiln_test_path("s");
    kiln_run_series *s = NULL;
    size_t n = 0;
    if (CHECK("loss", kiln_run_series_load(dir, "loss", 0, 100, &s, &n) == KILN_OK && n == 1)) {
        CHECK("every step, the non-finite one as NAN",
              s->n == 4 && s->step[0] == 1 && s->value[0] == 1.0 && isnan(s->value[1]) &&
                  s->step[3] == 4 && s->value[3] == 0.125 && !strcmp(s->name, "loss"));
        kiln_run_series_free(s, n);
    }
    if (CHECK("range", kiln_run_series_load(dir, "loss", 2, 3, &s, &n) == KILN_OK && n == 1)) {
        CHECK("steps 2 and 3 only", s->n == 2 && s->step[0] == 2 && s->step[1] == 3);
        kiln_run_series_free(s, n);
    }
    if (CHECK("val_r2", kiln_run_series_load(dir, "val_r2", 0, 100, &s, &n) == KILN_OK)) {
        CHECK("only evaluated steps", s->n == 1 && s->step[0] == 2 && s->value[0] == 0.25);
        kiln_run_series_free(s, n);
    }
    if (CHECK("layer", kiln_run_series_load(dir, "router_entropy@0", 0, 100, &s, &n) == KILN_OK)) {
        CHECK("a value per step", s->n == 4 && s->value[2] == 0.5);
        kiln_run_series_free(s, n);
    }
    if (CHECK("experts", kiln_run_series_load(dir, "expert_load@0", 0, 100, &s, &n) == KILN_OK)) {
        CHECK("one series per expert", n == 2 && s[0].n == 4 && s[0].value[3] == 1.0 &&
                                           s[1].value[3] == 0.0 &&
                                           !strcmp(s[1].name, "expert_load@0/1"));
        kiln_run_series_free(s, n);
    }
    if (CHECK("tensor",
              kiln_run_series_load(dir, "update_ratio@head.weight", 0, 100, &s, &n) == KILN_OK)) {
        CHECK("its values", s->n == 4 && s->value[0] == 0.001);
        kiln_run_series_free(s, n);
    }
    CHECK("unknown metric", kiln_run_series_load(dir, "lossy", 0, 100, &s, &n) == KILN_ERR_USAGE &&
                                has(dir) && has("'lossy'") && !s && !n);
    CHECK("a step column is not a layer metric",
          kiln_run_series_load(dir, "loss@0", 0, 100, &s, &n) == KILN_ERR_USAGE);
    CHECK("bad layer", kiln_run_series_load(dir, "act_rms@x", 0, 100, &s, &n) == KILN_ERR_USAGE &&
                           has("a layer is a number"));
    CHECK("layer not logged",
          kiln_run_series_load(dir, "act_rms@3", 0, 100, &s, &n) == KILN_ERR_NOTFOUND &&
              has("no layer '3'"));
    CHECK("tensor not logged",
          kiln_run_series_load(dir, "grad_norm@nope", 0, 100, &s, &n) == KILN_ERR_NOTFOUND &&
              has("no tensor 'nope'"));
    char *list = NULL;
    if (CHECK("list", kiln_run_metrics_list(dir, &list) == KILN_OK)) {
        CHECK("names the layers and tensors",
              strstr(list, "layers 0 to 0") && strstr(list, "\n  head.weight"));
        free(list);
    }
    char *none = kiln_test_path("none");
    CHECK("not a run", kiln_run_series_load(none, "loss", 0, 100, &s, &n) == KILN_ERR_NOTFOUND &&
                           has("run.json") && has(none));
    free(none), free(dir);
}

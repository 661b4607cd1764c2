/* test_runs_explain.c - kiln runs explain on runs whose metrics are written to order: the
 * step it picks, the tensor that rose first, a router collapse, an update far past its
 * median, where a non-finite value arose (backward and forward), drift over the run, a calm
 * step, and the refusals. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runs_int.h"
#include "test.h"
#include "testutil.h"

#define N_STEPS 120
#define SPIKE 100
#define BACKWARD_NAN 110
#define FORWARD_NAN 115

static const char *const tensor_names[] = {"embed.weight",
                                           "blocks.0.attn.qkv.weight",
                                           "blocks.1.moe.router.weight",
                                           "head.weight",
                                           "norm.in_mean",
                                           "head.bias"};
enum { N_TENSORS = 6 };

/* A small wobble, so that medians are medians and not one value repeated. */
static double wob(int step, int k) {
    return 1.0 + 0.05 * sin(0.7 * step + k);
}

/* What kind of run: a troubled one (a rising router, a spike, non-finite steps), a calm one,
 * or one whose layer 0 attention entropy sinks over the run. */
typedef enum { TROUBLED, CALM, DRIFTING } kind;

static char *make_run(const char *name, kind k) {
    char *dir = kiln_test_path(name);
    kiln_test_put(dir, "run.json",
                  "{\"format\":\"kiln-run/1\",\"run_id\":\"x\",\"config\":{\"n_layers\":2,"
                  "\"n_experts\":4,\"steps\":120}}");
    char *db = kiln_path_join(dir, "metrics.db");
    kiln_run_metrics *mx = NULL;
    CHECK("open metrics.db", kiln_run_metrics_open(db, false, &mx) == KILN_OK);
    free(db);
    if (!mx) return dir;
    kiln_run_metrics_event(mx, 0, "start", "run started");
    for (int s = 1; s <= N_STEPS; s++) {
        float attn[2], router[2], load[8], overflow[2] = {0, 0}, act[2];
        for (int l = 0; l < 2; l++) {
            attn[l] = (float)(1.8 * wob(s, l));
            router[l] = (float)(1.35 * wob(s, l + 2));
            act[l] = (float)(1.0 * wob(s, l + 4));
            for (int e = 0; e < 4; e++)
                load[l * 4 + e] = 0.25f;
        }
        kiln_run_metrics_tensor t[N_TENSORS];
        double loss = 0.9 * wob(s, 7), gn = 0.5 * wob(s, 8);
        for (int i = 0; i < N_TENSORS; i++) {
            t[i].name = tensor_names[i];
            t[i].grad_norm = i == 4 ? 0 : 0.1 * (i + 1) * wob(s, i);
            t[i].update_ratio = i == 4 ? 0 : 0.001 * wob(s, i + 3);
        }
        if (k == DRIFTING) { /* layer 0 collapses; layer 1 focuses, as a run that learns */
            attn[0] = (float)(1.8 * exp(-0.04 * s));
            attn[1] = (float)(1.8 * (0.3 + 0.7 * exp(-0.04 * s)));
        }
        if (k == TROUBLED) {
            if (s >= 96 && s <= SPIKE) t[2].grad_norm *= s == SPIKE ? 40 : 5;
            if (s == 95) t[1].update_ratio = 0.5;
            if (s == 98) t[5].update_ratio = 100; /* a bias passing near 0: not a finding */
            if (s == SPIKE) {
                gn *= 20;
                loss *= 2;
                router[1] = 0.2f;
                load[4] = load[5] = 0;
                load[6] = load[7] = 0.5f;
            }
            if (s == BACKWARD_NAN) {
                gn = NAN;
                t[0].grad_norm = t[1].grad_norm = NAN;
            }
            if (s == FORWARD_NAN) {
                loss = gn = NAN;
                act[1] = NAN;
                for (int i = 0; i < N_TENSORS; i++)
                    if (i != 4) t[i].grad_norm = NAN;
            }
        }
        kiln_tsmoe_stats st = {.n_layers = 2,
                               .n_experts = 4,
                               .attn_entropy = attn,
                               .router_entropy = router,
                               .expert_load = load,
                               .overflow = overflow,
                               .act_rms = act,
                               .max_abs_output = 2};
        kiln_train_progress p = {.step = s,
                                 .steps = N_STEPS,
                                 .loss = loss,
                                 .mse = loss,
                                 .lr = 0.001,
                                 .grad_norm = gn,
                                 .applied = isfinite(gn) && s != SPIKE,
                                 .tokens_per_s = 1000,
                                 .stats = &st};
        CHECK("log a step", kiln_run_metrics_step(mx, &p, t, N_TENSORS) == KILN_OK);
        if (k == TROUBLED && s == SPIKE)
            kiln_run_metrics_event(mx, s, "spike", "step 100: a spike");
        if (k == TROUBLED && (s == BACKWARD_NAN || s == FORWARD_NAN))
            kiln_run_metrics_event(mx, s, "nonfinite", "a non-finite step");
    }
    kiln_run_metrics_close(mx);
    return dir;
}

/* The first finding that contains all of the words given (NULL-terminated), or NULL. */
static const char *finding(const json_t *doc, ...) {
    size_t i;
    const json_t *f;
    json_array_foreach(json_object_get(doc, "findings"), i, f) {
        const char *text = json_string_value(json_object_get(f, "text"));
        va_list ap;
        va_start(ap, doc);
        bool all = text != NULL;
        for (const char *w; all && (w = va_arg(ap, const char *));)
            all = strstr(text, w) != NULL;
        va_end(ap);
        if (all) return text;
    }
    return NULL;
}

static double stat_value(const json_t *doc, const char *metric, const char *field) {
    const json_t *v =
        json_object_get(json_object_get(json_object_get(doc, "step_metrics"), metric), field);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

KILN_TEST(runs_explain_finds_what_rose_first) {
    char *dir = make_run("troubled", TROUBLED);
    json_t *d = NULL;
    CHECK("explained", kiln_run_explain(dir, 0, 0, &d) == KILN_OK);
    CHECK("the first spike or non-finite step",
          json_integer_value(json_object_get(d, "step")) == SPIKE &&
              json_integer_value(json_object_get(d, "trouble_steps")) == 3);
    CHECK("its event", !strcmp(json_string_value(json_object_get(
                                   json_array_get(json_object_get(d, "events"), 0), "kind")),
                               "spike"));
    CHECK("the gradient norm's ratio", fabs(stat_value(d, "grad_norm", "ratio") - 20) < 2);
    CHECK("a baseline of the 64 steps before",
          json_integer_value(json_object_get(d, "baseline_steps")) == 64);
    const json_t *t0 = json_array_get(json_object_get(d, "tensors"), 0);
    CHECK("the tensor furthest from its median first",
          !strcmp(json_string_value(json_object_get(t0, "name")), "blocks.1.moe.router.weight"));
    CHECK("over 3x since step 96", json_integer_value(json_object_get(t0, "since")) == 96);
    CHECK("an untrained tensor is left out", json_array_size(json_object_get(d, "tensors")) == 5);
    CHECK("the finding names it", finding(d, "blocks.1.moe.router.weight rose first",
                                          "since step 96", "4 steps before", NULL));
    CHECK("the router collapse", finding(d, "layer 1's router entropy fell to 0.2", NULL));
    bool router_kind = false;
    size_t i;
    const json_t *f;
    json_array_foreach(json_object_get(d, "findings"), i, f) router_kind |=
        !strcmp(json_string_value(json_object_get(f, "kind")), "router") &&
        strstr(json_string_value(json_object_get(f, "text")), "layer 1's router");
    CHECK("a finding says its kind", router_kind);
    CHECK("the dead experts", finding(d, "layer 1: 2 of 4 experts got no tokens", NULL));
    CHECK("the update far past its median",
          finding(d, "largest update before it: blocks.0.attn.qkv.weight", "0.5", "step 95", NULL));
    CHECK("no finding on the calm layer 0", !finding(d, "layer 0", NULL));
    CHECK("a grad norm over 3x since the spike only",
          finding(d, "the gradient norm was", NULL) &&
              !finding(d, "the gradient norm was", "since", NULL));
    json_decref(d);

    /* A shorter baseline. */
    CHECK("window 8", kiln_run_explain(dir, SPIKE, 8, &d) == KILN_OK &&
                          json_integer_value(json_object_get(d, "baseline_steps")) == 8);
    json_decref(d);
    free(dir);
}

KILN_TEST(runs_explain_says_where_a_nonfinite_value_arose) {
    char *dir = make_run("nonfinite", TROUBLED);
    json_t *d = NULL;
    CHECK("backward", kiln_run_explain(dir, BACKWARD_NAN, 0, &d) == KILN_OK);
    CHECK("two tensors not finite",
          json_integer_value(json_object_get(d, "nonfinite_tensors")) == 2);
    CHECK("listed first", !json_is_number(json_object_get(
                              json_array_get(json_object_get(d, "tensors"), 0), "value")));
    CHECK("the backward pass broke in block 0",
          finding(d, "loss was finite", "2 of 5 tensors", "backward pass broke in block 0", NULL));
    CHECK("the update was skipped", json_is_false(json_object_get(d, "applied")));
    json_decref(d);
    CHECK("forward", kiln_run_explain(dir, FORWARD_NAN, 0, &d) == KILN_OK);
    CHECK("the forward pass broke in block 1",
          finding(d, "loss was not finite", "forward pass broke in block 1", NULL));
    CHECK("not the backward", !finding(d, "backward", NULL));
    CHECK("the loss shown as not finite", isnan(stat_value(d, "loss", "value")));
    json_decref(d);
    free(dir);
}

KILN_TEST(runs_explain_calm_and_drifting_runs) {
    char *calm = make_run("calm", CALM), *drifting = make_run("drifting", DRIFTING);
    json_t *d = NULL;
    CHECK("nothing to explain",
          kiln_run_explain(calm, 0, 0, &d) == KILN_OK && json_is_null(json_object_get(d, "step")) &&
              json_integer_value(json_object_get(d, "last_logged")) == N_STEPS);
    json_decref(d);
    CHECK("a step asked for", kiln_run_explain(calm, 90, 0, &d) == KILN_OK);
    CHECK("nothing stands out", json_array_size(json_object_get(d, "findings")) == 1 &&
                                    finding(d, "nothing stands out", NULL));
    json_decref(d);
    CHECK("drift", kiln_run_explain(drifting, N_STEPS, 0, &d) == KILN_OK);
    CHECK("layer 0's attention entropy sank",
          finding(d, "layer 0's attention entropy has fallen below a tenth", NULL));
    CHECK("layer 1's did not", !finding(d, "layer 1", NULL));
    const json_t *l0 = json_array_get(json_object_get(d, "layers"), 0);
    double first =
        json_number_value(json_object_get(json_object_get(l0, "attn_entropy"), "first_steps"));
    CHECK("where it began", first > 1.2 && first < 1.8);
    json_decref(d);
    free(calm);
    free(drifting);
}

KILN_TEST(runs_explain_refusals) {
    char *dir = make_run("refused", CALM);
    json_t *d = NULL;
    CHECK("a step not logged",
          kiln_run_explain(dir, 500, 0, &d) == KILN_ERR_NOTFOUND && !d &&
              strstr(kiln_errmsg(), dir) &&
              strstr(kiln_errmsg(), "step 500 was not logged (the run logged steps 1 to 120)"));
    char *none = kiln_test_path("not-a-run");
    kiln_test_put(none, "notes.txt", "hello");
    CHECK("no run", kiln_run_explain(none, 0, 0, &d) == KILN_ERR_NOTFOUND &&
                        strstr(kiln_errmsg(), none) &&
                        strstr(kiln_errmsg(), "not a run directory"));
    char *fresh = kiln_test_path("fresh");
    kiln_test_put(fresh, "run.json",
                  "{\"format\":\"kiln-run/1\",\"config\":{\"n_layers\":1,\"steps\":3}}");
    CHECK("no metrics.db", kiln_run_explain(fresh, 0, 0, &d) == KILN_ERR_NOTFOUND &&
                               strstr(kiln_errmsg(), "no metrics.db"));
    free(fresh);
    free(none);
    free(dir);
}

/* test_runs_curves.c - metrics.db's summary of the steps table (step_sums, runs/metrics.c)
 * and the run page's curves read through it (runs/curves.c): the same points as reading
 * every row, spikes and non-finite steps kept, across a resume, through the cache and up to
 * an exported step; a run logged before step_sums read row by row; the best validation
 * found through its index. The layers table's scalar columns the same through layer_sums
 * (a collapse between the sampled steps kept), an older run's layers sampled; and the
 * tensors table's through tensor_sums (a tensor's update-ratio peak between the sampled steps
 * kept, and the movers ranked by it). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "runs_int.h"
#include "test.h"
#include "testutil.h"

#define SPIKE 31337
#define DIP 27001
#define COLLAPSE 23456 /* layer 1's router entropy collapses: no loss spike, not sampled */
#define LAYERS 3
#define EXPERTS 4
#define PEAK 27777 /* b.weight's update ratio peaks: no spike, not sampled */
#define TENSORS 3
static const char *const tensor_names[TENSORS] = {"a.weight", "b.weight", "c.weight"};

/* The loss at step s of a run's phase (the phase after a resume logs other values):
 * falling with noise, a spike, a dip, NaN and infinities. */
static double loss_at(long s, int phase) {
    if (s == SPIKE) return 1e3;
    if (s == DIP) return -5;
    if (s % 4099 == 0) return NAN;
    if (s % 5003 == 0) return phase ? -INFINITY : INFINITY;
    unsigned h = (unsigned)s * 2654435761u;
    return 2 * exp(-3.0 * (double)s / 40000) + (phase ? 0.5 : 0) + (h >> 20) / 4096.0 * 0.01;
}

/* Steps [from, to] of a phase logged as the trainer logs them, with LAYERS layers'
 * diagnostics: noise, a router entropy collapse, a NaN attention entropy. */
static kiln_err log_steps(kiln_run_metrics *mx, long from, long to, int phase) {
    for (long s = from; s <= to; s++) {
        double l = loss_at(s, phase);
        float ae[LAYERS], re[LAYERS], ov[LAYERS], rms[LAYERS], load[LAYERS * EXPERTS];
        for (int k = 0; k < LAYERS; k++) {
            unsigned h = (unsigned)(s * LAYERS + k) * 2654435761u;
            ae[k] = s % 3001 == 0 && k == 2 ? NAN : 2.0f + (float)(h >> 24) / 256.0f;
            re[k] = s == COLLAPSE && k == 1 ? 0.001f : 1.2f + (float)phase + (float)(h >> 20 & 255) / 1024.0f;
            ov[k] = (float)(h & 15) / 64.0f;
            rms[k] = 1.0f + (float)k + (float)(s % 97) / 97.0f;
            for (int e = 0; e < EXPERTS; e++)
                load[k * EXPERTS + e] = e == (int)(h >> 28) % EXPERTS ? 0.4f : 0.2f;
        }
        kiln_tsmoe_stats stats = {.n_layers = LAYERS,
                                  .n_experts = EXPERTS,
                                  .attn_entropy = ae,
                                  .router_entropy = re,
                                  .expert_load = load,
                                  .overflow = ov,
                                  .act_rms = rms,
                                  .max_abs_output = 3};
        kiln_train_progress p = {.step = s,
                                 .loss = l,
                                 .mse = s % 7 == 0 ? 2 : 1, /* ties: the first one stays */
                                 .lr = 1e-3,
                                 .grad_norm = s == SPIKE ? 50 : 0.5,
                                 .applied = isfinite(l),
                                 .tokens_per_s = 1000,
                                 .has_val = s % 97 == 0,
                                 /* a non-finite validation loss: the step counts as not
                                    evaluated; a non-finite R^2 is a mark */
                                 .val_loss = s % (97 * 41) == 0 ? NAN : 1 + 1.0 / (double)s,
                                 .val_r2 = s % (97 * 13) == 0 ? NAN : 0.5,
                                 .stats = &stats};
        /* a.weight moves most but for b.weight's peak; a NaN gradient norm now and then */
        kiln_run_metrics_tensor t[TENSORS];
        for (int k = 0; k < TENSORS; k++) {
            unsigned h = (unsigned)(s * TENSORS + k) * 2654435761u;
            t[k] = (kiln_run_metrics_tensor){
                .name = tensor_names[k],
                .grad_norm = s % 2999 == 0 && k == 0 ? NAN : 0.1 * (k + 1) + (h >> 24) / 4096.0,
                .update_ratio = s == PEAK && k == 1 ? 0.5
                                                    : (0.01 - 0.004 * k) * (1 + phase) +
                                                          (double)(h >> 20 & 255) / 1e6};
        }
        KILN_TRY(kiln_run_metrics_step(mx, &p, t, TENSORS));
    }
    return KILN_OK;
}

static bool same_num(double a, double b) {
    return (isnan(a) && isnan(b)) || a == b;
}

/* The steps table's curves of a and b hold the same points. */
static bool same_step_curves(const kiln_run_curves *a, const kiln_run_curves *b) {
    if (a->first != b->first || a->last != b->last) return false;
    for (int k = 0; k < KILN_RUN_METRICS_SUM_COLS; k++) {
        const kiln_run_curve *x = kiln_run_curve_find(a, kiln_run_metrics_sum_cols[k]),
                             *y = kiln_run_curve_find(b, kiln_run_metrics_sum_cols[k]);
        if (!x || !y || x->n != y->n || !x->n) return false;
        for (size_t i = 0; i < x->n; i++)
            if (x->x[i] != y->x[i] || !same_num(x->y[i], y->y[i])) return false;
    }
    return true;
}

/* The layers' scalar curves of a and b hold the same points. */
static bool same_layer_curves(const kiln_run_curves *a, const kiln_run_curves *b) {
    static const char *const cols[] = {"attn_entropy", "router_entropy", "load_imbalance",
                                       "dead_experts", "overflow",       "act_rms"};
    if (a->n_layers != LAYERS || b->n_layers != LAYERS) return false;
    for (int l = 0; l < LAYERS; l++)
        for (int k = 0; k < 6; k++) {
            char name[64];
            snprintf(name, sizeof name, "%s@%d", cols[k], l);
            const kiln_run_curve *x = kiln_run_curve_find(a, name), *y = kiln_run_curve_find(b, name);
            if (!x || !y || x->n != y->n || !x->n) return false;
            for (size_t i = 0; i < x->n; i++)
                if (x->x[i] != y->x[i] || !same_num(x->y[i], y->y[i])) return false;
        }
    return true;
}

/* The tensors' curves of a and b hold the same points. */
static bool same_tensor_curves(const kiln_run_curves *a, const kiln_run_curves *b) {
    for (int t = 0; t < TENSORS; t++)
        for (int k = 0; k < 2; k++) {
            char name[64];
            snprintf(name, sizeof name, "%s@%s", k ? "update_ratio" : "grad_norm", tensor_names[t]);
            const kiln_run_curve *x = kiln_run_curve_find(a, name), *y = kiln_run_curve_find(b, name);
            if (!x || !y || x->n != y->n || !x->n) return false;
            for (size_t i = 0; i < x->n; i++)
                if (x->x[i] != y->x[i] || !same_num(x->y[i], y->y[i])) return false;
        }
    return true;
}

/* The movers of cs in order, as names. */
static bool movers_are(const kiln_run_curves *cs, const char *m0, const char *m1, const char *m2) {
    return cs->n_movers == 3 && !strcmp(cs->movers[0], m0) && !strcmp(cs->movers[1], m1) &&
           !strcmp(cs->movers[2], m2);
}

static bool has_point(const kiln_run_curves *cs, const char *name, double x, double y) {
    const kiln_run_curve *c = kiln_run_curve_find(cs, name);
    for (size_t i = 0; c && i < c->n; i++)
        if (c->x[i] == x && same_num(c->y[i], y)) return true;
    return false;
}

static void sql(const char *db, const char *q) {
    sqlite3 *h = NULL;
    if (sqlite3_open(db, &h) == SQLITE_OK) sqlite3_exec(h, q, NULL, NULL, NULL);
    sqlite3_close(h);
}

static long sql_long(const char *db, const char *q) {
    sqlite3 *h = NULL;
    sqlite3_stmt *st = NULL;
    long v = -1;
    if (sqlite3_open(db, &h) == SQLITE_OK && sqlite3_prepare_v2(h, q, -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        v = (long)sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(h);
    return v;
}

/* A run directory named name under the test's (its path in *dir, its metrics.db's in *db;
 * both freed by the caller): run.json and metrics.db opened for writing into *mx. */
static bool new_run(const char *name, char **dir, char **db, kiln_run_metrics **mx) {
    *dir = kiln_test_path(name);
    *db = kiln_path_join(*dir, "metrics.db");
    kiln_test_put(*dir, "run.json", "{\"format\":\"kiln-run/1\",\"run_id\":\"r\",\"config\":{}}");
    return kiln_run_metrics_open(*db, false, mx) == KILN_OK;
}

KILN_TEST(runs_curves_summary_equals_full_read) {
    char *dir, *db;
    kiln_run_cache *cache = NULL;
    kiln_run_curves live = {0}, cached = {0}, sums = {0}, full = {0}, upto = {0}, upto_full = {0},
                    old = {0};
    kiln_run_metrics *mx = NULL;
    CHECK("cache", kiln_run_cache_create(&cache) == KILN_OK);
    /* 30000 steps, a resume from 21234 (the trainer truncates and logs again), 40000. */
    CHECK("open", new_run("sums", &dir, &db, &mx));
    CHECK("phase 1", log_steps(mx, 1, 30000, 0) == KILN_OK);
    CHECK("cached, before the resume",
          kiln_run_curves_load_cached(cache, dir, 512, 8, &live) == KILN_OK && live.last == 30000);
    CHECK("truncate", kiln_run_metrics_truncate(mx, 21234) == KILN_OK);
    CHECK("resume event", kiln_run_metrics_event(mx, 21234, "resume", "resumed") == KILN_OK);
    kiln_run_metrics_close(mx);
    CHECK("reopen", kiln_run_metrics_open(db, false, &mx) == KILN_OK);
    CHECK("phase 2", log_steps(mx, 21235, 40000, 1) == KILN_OK);
    kiln_run_metrics_close(mx);
    /* Every bucket a later step closed is summed up, at every level up to what they allow. */
    CHECK("level 0 done",
          sql_long(db, "SELECT upto FROM step_sums_done WHERE level = 0") == 40000 / 16 * 16);
    CHECK("level 10 done", sql_long(db, "SELECT upto FROM step_sums_done WHERE level = 10") ==
                               40000 / 16384 * 16384);
    CHECK("no bucket past the resume from before it",
          sql_long(db, "SELECT count(*) FROM step_sums WHERE col = 0 AND level = 0 AND "
                       "bucket = 21248 / 16 AND miny > 0.5") == 1);
    CHECK("summed, cached", kiln_run_curves_load_cached(cache, dir, 512, 8, &cached) == KILN_OK);
    CHECK("summed", kiln_run_curves_load(dir, 512, 8, 0, &sums) == KILN_OK);
    CHECK("summed, up to a step", kiln_run_curves_load(dir, 332, 8, 33333, &upto) == KILN_OK);
    CHECK("layer_sums level 10 done",
          sql_long(db, "SELECT upto FROM layer_sums_done WHERE level = 10") ==
              40000 / 16384 * 16384);
    /* The same run as one logged before step_sums: read row by row; its layers too (a
     * layer_sums_done with nothing done: a run read whole). */
    CHECK("tensor_sums level 10 done",
          sql_long(db, "SELECT upto FROM tensor_sums_done WHERE level = 10") ==
              40000 / 16384 * 16384);
    sql(db, "DROP TABLE step_sums_done; DROP TABLE step_sums; UPDATE layer_sums_done SET upto = 0; "
            "UPDATE tensor_sums_done SET upto = 0");
    CHECK("every row", kiln_run_curves_load(dir, 512, 8, 0, &full) == KILN_OK);
    CHECK("every row, up to a step",
          kiln_run_curves_load(dir, 332, 8, 33333, &upto_full) == KILN_OK);
    /* A run logged before layer_sums and tensor_sums: its layers and tensors sampled. */
    sql(db, "DROP TABLE layer_sums_done; DROP TABLE tensor_sums_done");
    CHECK("sampled", kiln_run_curves_load(dir, 512, 8, 0, &old) == KILN_OK);
    CHECK("the summary's curves are the full read's", same_step_curves(&sums, &full));
    CHECK("and the cache's after a resume", same_step_curves(&cached, &full));
    CHECK("and up to a step", upto.last == 33333 && same_step_curves(&upto, &upto_full));
    CHECK("the spike kept",
          has_point(&sums, "loss", SPIKE, 1e3) && has_point(&sums, "grad_norm", SPIKE, 50));
    CHECK("the dip kept", has_point(&sums, "loss", DIP, -5));
    CHECK("a NaN step kept", has_point(&sums, "loss", 4099, NAN));
    CHECK("an infinity kept (as SQLite keeps it: NULL)", has_point(&sums, "loss", 25015, NAN));
    CHECK("the last step", has_point(&sums, "loss", 40000, loss_at(40000, 1)));
    /* The layers: through layer_sums as read whole, the collapse there (at a step not
     * sampled), which sampling misses. */
    CHECK("the layers summed up", sums.sampled && sums.layers_summed && upto.layers_summed &&
                                      cached.layers_summed && full.layers_summed);
    CHECK("the layers' curves through layer_sums are the full read's",
          same_layer_curves(&sums, &full));
    CHECK("and through the cache after a resume", same_layer_curves(&cached, &full));
    CHECK("and up to a step", same_layer_curves(&upto, &upto_full));
    bool at_sample = false, peak_sampled = false;
    for (long k = 0; k < KILN_RUN_CURVE_SAMPLES; k++) {
        long at = 1 + (long)(39999.0 * (double)k / (KILN_RUN_CURVE_SAMPLES - 1));
        at_sample |= at == COLLAPSE;
        peak_sampled |= at == PEAK;
    }
    CHECK("the collapse is at no sampled step", !at_sample);
    CHECK("the collapse kept", has_point(&sums, "router_entropy@1", COLLAPSE, 0.001f) &&
                                   has_point(&upto, "router_entropy@1", COLLAPSE, 0.001f));
    CHECK("a NaN attention entropy kept", has_point(&sums, "attn_entropy@2", 3001, NAN));
    CHECK("an old run's layers sampled (and the collapse missed)",
          old.sampled && !old.layers_summed && old.n_layers == LAYERS &&
              kiln_run_curve_find(&old, "router_entropy@1") &&
              !has_point(&old, "router_entropy@1", COLLAPSE, 0.001f) &&
              kiln_run_curve_find(&old, "expert_load@2/3"));
    CHECK("expert load stays sampled", kiln_run_curve_find(&sums, "expert_load@2/3") &&
                                           kiln_run_curve_find(&sums, "expert_load@2/3")->n ==
                                               kiln_run_curve_find(&old, "expert_load@2/3")->n);
    /* The tensors: through tensor_sums as read whole, b.weight's peak there (not at a
     * sampled step, nor a spike's), and the movers ranked by it; sampling misses both. */
    CHECK("the peak is at no sampled step nor a spike's",
          !peak_sampled && sql_long(db, "SELECT count(*) FROM events WHERE step = 27777") == 0);
    CHECK("the tensors summed up", sums.tensors_summed && upto.tensors_summed &&
                                       cached.tensors_summed && full.tensors_summed);
    CHECK("the tensors' curves through tensor_sums are the full read's",
          same_tensor_curves(&sums, &full));
    CHECK("and through the cache after a resume", same_tensor_curves(&cached, &full));
    CHECK("and up to a step", same_tensor_curves(&upto, &upto_full));
    CHECK("the peak kept", has_point(&sums, "update_ratio@b.weight", PEAK, 0.5) &&
                               has_point(&upto, "update_ratio@b.weight", PEAK, 0.5));
    CHECK("a NaN gradient norm kept", has_point(&sums, "grad_norm@a.weight", 2999, NAN));
    CHECK("the movers ranked by the peak",
          movers_are(&sums, "b.weight", "a.weight", "c.weight") &&
              movers_are(&full, "b.weight", "a.weight", "c.weight") &&
              movers_are(&upto, "b.weight", "a.weight", "c.weight"));
    CHECK("an old run's tensors sampled (the peak and its ranking missed)",
          !old.tensors_summed && movers_are(&old, "a.weight", "b.weight", "c.weight") &&
              !has_point(&old, "update_ratio@b.weight", PEAK, 0.5));
    const kiln_run_curve *v = kiln_run_curve_find(&sums, "val_loss");
    CHECK("validation only where evaluated",
          v && v->n > 2 && v->x[0] == 97 && v->y[0] == 1 + 1.0 / 97);
    kiln_run_curves_release(&live);
    kiln_run_curves_release(&cached);
    kiln_run_curves_release(&sums);
    kiln_run_curves_release(&full);
    kiln_run_curves_release(&upto);
    kiln_run_curves_release(&upto_full);
    kiln_run_curves_release(&old);
    kiln_run_cache_free(cache);
    free(db);
    free(dir);
}

/* A metrics.db written by other means (gen-run.sh's SQL) summed up afterwards, and an old
 * one a newer trainer logs a step to, get the summary the trainer writes step by step. */
KILN_TEST(runs_curves_summarize_afterwards) {
    char *dir, *db;
    kiln_run_metrics *mx = NULL;
    CHECK("open", new_run("sums-after", &dir, &db, &mx));
    CHECK("log", log_steps(mx, 1, 5000, 0) == KILN_OK);
    kiln_run_metrics_close(mx);
    sql(db, "CREATE TABLE kept AS SELECT * FROM step_sums; CREATE TABLE kept_l AS SELECT * FROM "
            "layer_sums; DELETE FROM step_sums; DROP TABLE step_sums_done; DELETE FROM "
            "layer_sums; DROP TABLE layer_sums_done; CREATE TABLE kept_t AS SELECT s.*, n.name "
            "FROM tensor_sums s JOIN tensor_names n ON n.id = s.tensor; DROP TABLE tensor_sums; "
            "DROP TABLE tensor_sums_done; DROP TABLE tensor_names");
    CHECK("reopen", kiln_run_metrics_open(db, false, &mx) == KILN_OK);
    CHECK("summarize", kiln_run_metrics_summarize(mx) == KILN_OK);
    kiln_run_metrics_close(mx);
    const char *same = "SELECT (SELECT count(*) FROM (SELECT * FROM kept EXCEPT SELECT * FROM "
                       "step_sums)) + (SELECT count(*) FROM (SELECT * FROM step_sums EXCEPT "
                       "SELECT * FROM kept))";
    const char *same_l = "SELECT (SELECT count(*) FROM (SELECT * FROM kept_l EXCEPT SELECT * FROM "
                         "layer_sums)) + (SELECT count(*) FROM (SELECT * FROM layer_sums EXCEPT "
                         "SELECT * FROM kept_l))";
    /* (the tensors by name: ids are given as the names are first summed up) */
    const char *same_t = "SELECT (SELECT count(*) FROM (SELECT * FROM kept_t EXCEPT SELECT s.*, "
                         "n.name FROM tensor_sums s JOIN tensor_names n ON n.id = s.tensor)) + "
                         "(SELECT count(*) FROM (SELECT s.*, n.name FROM tensor_sums s JOIN "
                         "tensor_names n ON n.id = s.tensor EXCEPT SELECT * FROM kept_t))";
    CHECK("the same tensor rows",
          sql_long(db, "SELECT count(*) FROM kept_t") > 300 && sql_long(db, same_t) == 0);
    CHECK("the same rows",
          sql_long(db, "SELECT count(*) FROM kept") > 300 && sql_long(db, same) == 0);
    CHECK("the same layer rows",
          sql_long(db, "SELECT count(*) FROM kept_l") > 300 && sql_long(db, same_l) == 0);
    /* A trainer resuming a run logged before step_sums sums the old rows up at its first step
     * (5001 closes no bucket that 5000 did not). */
    sql(db, "DELETE FROM step_sums; DROP TABLE step_sums_done; DELETE FROM layer_sums; DROP TABLE "
            "layer_sums_done; DROP TABLE tensor_sums; DROP TABLE tensor_sums_done; DROP TABLE "
            "tensor_names");
    CHECK("reopen for a step", kiln_run_metrics_open(db, false, &mx) == KILN_OK);
    CHECK("a step", log_steps(mx, 5001, 5001, 0) == KILN_OK);
    kiln_run_metrics_close(mx);
    CHECK("the same rows after a step", sql_long(db, same) == 0 && sql_long(db, same_l) == 0 &&
                                            sql_long(db, same_t) == 0);
    free(db);
    free(dir);
}

/* kiln runs list's and the sweep page's best validation: by its index, not every step. */
KILN_TEST(runs_curves_best_val_index) {
    char *dir, *db;
    kiln_run_metrics *mx = NULL;
    CHECK("open", new_run("sums-val", &dir, &db, &mx));
    kiln_run_metrics_close(mx);
    sqlite3 *h = NULL;
    sqlite3_stmt *st = NULL;
    bool indexed = false, sorted = false;
    if (CHECK("plan",
              sqlite3_open(db, &h) == SQLITE_OK &&
                  sqlite3_prepare_v2(h,
                                     "EXPLAIN QUERY PLAN SELECT step, val_loss, val_r2 FROM "
                                     "steps WHERE val_loss IS NOT NULL ORDER BY val_loss, "
                                     "step LIMIT 1",
                                     -1, &st, NULL) == SQLITE_OK))
        while (sqlite3_step(st) == SQLITE_ROW) {
            const char *d = (const char *)sqlite3_column_text(st, 3);
            indexed |= d && strstr(d, "INDEX steps_val");
            sorted |= d && strstr(d, "TEMP B-TREE");
        }
    sqlite3_finalize(st);
    sqlite3_close(h);
    CHECK("the best validation through steps_val, in its order", indexed && !sorted);
    free(db);
    free(dir);
}

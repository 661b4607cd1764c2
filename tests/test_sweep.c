/* test_sweep.c - sweep specs: expansion, names, checks, digest (sweep/spec.c); the local pool
 * and Slurm are driven by tests/e2e/52-sweep.sh. */
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "data.h"
#include "sweep.h"
#include "test.h"
#include "testutil.h"

/* A spec file whose "data" is a real dataset in the test directory; returns the load's code. */
static kiln_err load(const char *body, kiln_sweep_spec *s) {
    char *d = kiln_test_synth("d.st", 1, 400);
    char *text = kiln_asprintf("{\"data\": \"d.st\"%s%s}", *body ? ", " : "", body);
    char *p = kiln_test_write("spec.json", text, strlen(text));
    kiln_err rc = kiln_sweep_spec_load(p, s);
    free(d);
    free(text);
    free(p);
    return rc;
}

KILN_TEST(sweep_spec_grid_seeds) {
    kiln_sweep_spec s;
    if (!CHECK("loads", load("\"config\": {\"steps\": 7}, \"grid\": {\"lr\": [0.001, 0.003], "
                             "\"d_model\": [16, 32]}, \"seeds\": [1, 2]",
                             &s) == KILN_OK))
        return;
    CHECK("2 x 2 x 2 points", s.n_points == 8);
    /* Keys in sorted order, the last varying fastest; seeds innermost. */
    static const char *const names[] = {"d_model-16,lr-0.001,seed-1", "d_model-16,lr-0.001,seed-2",
                                        "d_model-16,lr-0.003,seed-1", "d_model-16,lr-0.003,seed-2",
                                        "d_model-32,lr-0.001,seed-1", "d_model-32,lr-0.001,seed-2",
                                        "d_model-32,lr-0.003,seed-1", "d_model-32,lr-0.003,seed-2"};
    for (size_t i = 0; i < s.n_points && i < 8; i++)
        CHECK(names[i], !strcmp(s.points[i].name, names[i]));
    const kiln_train_config *c = &s.points[7].config;
    CHECK("config: spec's steps", c->steps == 7);
    CHECK("config: the grid's d_model", c->model.d_model == 32);
    CHECK("config: the seed", c->seed == 2);
    CHECK("config: a default kept", c->model.n_layers == 2);
    CHECK("ranks default 1", s.points[0].ranks == 1);
    CHECK("data absolute", s.data && s.data[0] == '/');
    CHECK("digest hex", strlen(s.digest) == 64);
    char digest[65];
    memcpy(digest, s.digest, sizeof digest);
    kiln_sweep_spec_release(&s);
    /* The same spec with its keys in another order: the same digest (canonical JSON). */
    if (CHECK("reordered loads",
              load("\"seeds\": [1, 2], \"grid\": {\"d_model\": [16, 32], \"lr\": "
                   "[0.001, 0.003]}, \"config\": {\"steps\": 7}",
                   &s) == KILN_OK))
        CHECK("same digest", !strcmp(s.digest, digest));
    kiln_sweep_spec_release(&s);
}

KILN_TEST(sweep_spec_points_ranks) {
    kiln_sweep_spec s;
    if (!CHECK("loads", load("\"config\": {\"accum_steps\": 2}, \"points\": [{\"ranks\": 2}, "
                             "{\"optimizer\": \"sgd\", \"lr\": 1e-2}], \"slurm\": {\"time\": "
                             "\"1:00:00\", \"gpus\": 1}",
                             &s) == KILN_OK))
        return;
    CHECK("2 points", s.n_points == 2);
    CHECK("ranks-2",
          s.n_points == 2 && !strcmp(s.points[0].name, "ranks-2") && s.points[0].ranks == 2);
    json_t *cj = kiln_train_config_json(&s.points[0].config);
    CHECK("ranks is no config key", cj && !json_object_get(cj, "ranks"));
    json_decref(cj);
    CHECK("lr-0.01,optimizer-sgd",
          s.n_points == 2 && !strcmp(s.points[1].name, "lr-0.01,optimizer-sgd"));
    CHECK("slurm time", s.slurm.time && !strcmp(s.slurm.time, "1:00:00"));
    CHECK("slurm gpus, cpus default, signal default",
          s.slurm.gpus == 1 && s.slurm.cpus == 1 && s.slurm.signal_seconds == 60);
    kiln_sweep_spec_release(&s);
    CHECK("no grid, no points: one point 'base'",
          load("", &s) == KILN_OK && s.n_points == 1 && !strcmp(s.points[0].name, "base"));
    kiln_sweep_spec_release(&s);
}

KILN_TEST(sweep_spec_refused) {
    static const struct {
        const char *body, *says;
    } bad[] = {
        {"\"config\": {\"lrr\": 1}", "config: unknown config key 'lrr'"},
        {"\"grid\": {\"lr\": [0.001, \"x\"]}", "point 'lr-x': config key 'lr' must be a number"},
        {"\"points\": [{\"lr\": 0.001}, {\"lr\": 1e-3}]",
         "points 1 and 2 would both be named 'lr-0.001'"},
        {"\"points\": [{\"ranks\": 3}]", "not a multiple of the 3 ranks"},
        {"\"points\": [{}]", "point 1 must be a non-empty object"},
        {"\"grid\": {\"lr\": []}", "grid key 'lr' must be a non-empty array"},
        {"\"seeds\": [1], \"config\": {\"seed\": 3}", "'seeds' and a 'seed' key"},
        {"\"slurm\": {\"time\": \"1 hour\"}", "slurm key 'time' must be a word"},
        {"\"slurm\": {\"gpu\": 1}", "unknown slurm key 'gpu'"},
        {"\"shards\": 1", "unknown key 'shards'"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        kiln_sweep_spec s;
        kiln_err rc = load(bad[i].body, &s);
        CHECK(bad[i].says, rc == KILN_ERR_CONFIG && strstr(kiln_errmsg(), bad[i].says) &&
                               strstr(kiln_errmsg(), "spec.json") && !s.points);
        kiln_errclear();
    }
    kiln_sweep_spec s;
    static const char nodata[] = "{\"data\": \"none.st\"}";
    char *p = kiln_test_write("nodata.json", nodata, strlen(nodata));
    CHECK("a missing dataset",
          kiln_sweep_spec_load(p, &s) == KILN_ERR_IO && strstr(kiln_errmsg(), "dataset 'none.st'"));
    free(p);
}

/* A spec's size is (grid + points) x seeds, refused before one point is made: the grid's own
 * product was the only bound, and 1000 values x 1000 seeds expanded for 20+ minutes. Here the
 * first point would fail its config check (d_model 17): only a count made first says LIMIT. */
KILN_TEST(sweep_spec_size_bound) {
    char *vals = kiln_malloc(1000 * 8 + 64), *seeds = kiln_malloc(1000 * 8 + 64);
    if (!CHECK("alloc", vals && seeds)) {
        free(vals);
        free(seeds);
        return;
    }
    size_t n = 0, m = 0;
    for (int i = 0; i < 1000; i++) {
        n += (size_t)sprintf(vals + n, "%s%d", i ? "," : "", i + 1);
        m += (size_t)sprintf(seeds + m, "%s%d", i ? "," : "", i);
    }
    char *body = kiln_asprintf("\"grid\": {\"d_model\": [17], \"warmup_steps\": [%s]}, "
                               "\"seeds\": [%s]",
                               vals, seeds);
    kiln_sweep_spec s;
    kiln_err rc = load(body, &s);
    CHECK("10^6 points: LIMIT before expanding", rc == KILN_ERR_LIMIT && !s.points);
    CHECK("the message counts them",
          strstr(kiln_errmsg(), "spec.json': the sweep would have 1000000 points ((grid 1000 + 0 "
                                "points) x 1000 seeds), more than 100000"));
    kiln_errclear();
    free(body);
    /* Points multiply with seeds too: 100 explicit points x 1001 seeds. */
    char *pts = kiln_malloc(100 * 24 + 8);
    size_t k = 0;
    for (int i = 0; pts && i < 100; i++)
        k += (size_t)sprintf(pts + k, "%s{\"warmup_steps\": %d}", i ? "," : "", i + 1);
    body = pts ? kiln_asprintf("\"points\": [%s], \"seeds\": [%s,1000]", pts, seeds) : NULL;
    CHECK("points x seeds: LIMIT",
          body && load(body, &s) == KILN_ERR_LIMIT && strstr(kiln_errmsg(), "100100 points"));
    kiln_errclear();
    free(body);
    free(pts);
    free(vals);
    free(seeds);
}

/* 10^5 points, the most a spec may make, expand in linear time: each name was compared with
 * every earlier one (150 s on the build machine; 2 s now). */
KILN_TEST(sweep_spec_expansion_linear) {
    char *vals = kiln_malloc(100 * 8 + 64), *seeds = kiln_malloc(1000 * 8 + 64);
    size_t n = 0, m = 0;
    for (int i = 0; vals && i < 100; i++)
        n += (size_t)sprintf(vals + n, "%s%d", i ? "," : "", i + 1);
    for (int i = 0; seeds && i < 1000; i++)
        m += (size_t)sprintf(seeds + m, "%s%d", i ? "," : "", i);
    char *body = vals && seeds ? kiln_asprintf("\"grid\": {\"warmup_steps\": [%s]}, \"seeds\": "
                                               "[%s]",
                                               vals, seeds)
                               : NULL;
    kiln_sweep_spec s;
    uint64_t t0 = kiln_now_ns();
    kiln_err rc = body ? load(body, &s) : KILN_ERR_NOMEM;
    double secs = (double)(kiln_now_ns() - t0) / 1e9;
    if (CHECK("10^5 points load", rc == KILN_OK)) {
        CHECK("10^5 points", s.n_points == 100000);
        CHECK("the last one", !strcmp(s.points[99999].name, "seed-999,warmup_steps-100"));
        CHECK("in under 30 s (was 150 s)", secs < 30);
        kiln_sweep_spec_release(&s);
    }
    free(body);
    free(vals);
    free(seeds);
}

/* A point setting 15 keys had a name of 260+ bytes: no run directory can have it. It is cut
 * and given a digest of the whole name: short, stable, and distinct for distinct points. */
KILN_TEST(sweep_spec_long_names) {
    static const char pts[] =
        "\"points\": [{\"steps\": 20, \"batch_size\": 4, \"lr\": 0.00123456789012, \"min_lr\": "
        "0.000123456789012, \"warmup_steps\": 3, \"weight_decay\": 0.0123456789012, \"beta1\": "
        "0.912345678901, \"beta2\": 0.991234567890, \"adam_eps\": 1.23456789012e-08, "
        "\"grad_clip\": 1.23456789012, \"seed\": 123456789, \"val_fraction\": 0.123456789012, "
        "\"eval_every\": 10, \"ckpt_every\": 10, \"aux_loss_coef\": 0.0123456789012}, "
        "{\"steps\": 20, \"batch_size\": 4, \"lr\": 0.00123456789012, \"min_lr\": "
        "0.000123456789012, \"warmup_steps\": 3, \"weight_decay\": 0.0123456789013, \"beta1\": "
        "0.912345678901, \"beta2\": 0.991234567890, \"adam_eps\": 1.23456789012e-08, "
        "\"grad_clip\": 1.23456789012, \"seed\": 123456789, \"val_fraction\": 0.123456789012, "
        "\"eval_every\": 10, \"ckpt_every\": 10, \"aux_loss_coef\": 0.0123456789012}]";
    kiln_sweep_spec s;
    if (!CHECK("loads", load(pts, &s) == KILN_OK)) return;
    char first[KILN_SWEEP_NAME_MAX + 1] = "";
    if (CHECK("2 points", s.n_points == 2)) {
        const char *a = s.points[0].name, *b = s.points[1].name;
        CHECK("at most KILN_SWEEP_NAME_MAX bytes",
              strlen(a) <= KILN_SWEEP_NAME_MAX && strlen(b) <= KILN_SWEEP_NAME_MAX);
        /* Known answer: the whole pairs that fit in 103 bytes, '~', the first 16 hex digits
         * of the SHA-256 of the whole 303-byte name (Python's hashlib says the same). */
        CHECK("the cut name",
              !strcmp(a, "adam_eps-1.23456789012e-08,aux_loss_coef-0.0123456789012,batch_size-4,"
                         "beta1-0.912345678901~adf0c597d2295aec"));
        CHECK("points that differ only at the end: two names", strcmp(a, b));
        snprintf(first, sizeof first, "%s", a);
    }
    kiln_sweep_spec_release(&s);
    if (CHECK("loads again", load(pts, &s) == KILN_OK))
        CHECK("the same name again", s.n_points == 2 && !strcmp(s.points[0].name, first));
    kiln_sweep_spec_release(&s);
    /* The dataset's content digest is what kiln data inspect prints. */
    if (CHECK("loads", load("", &s) == KILN_OK)) {
        kiln_dataset *ds = NULL;
        CHECK("data_sha256 is the dataset's",
              !kiln_dataset_open(s.data, &ds) && !strcmp(s.data_sha256, ds->sha256));
        kiln_dataset_free(ds);
    }
    kiln_sweep_spec_release(&s);
}

/* test_sweep.c - sweep specs: expansion, names, checks, digest (sweep/spec.c); the local pool
 * and Slurm are driven by tests/e2e/46-sweep.sh. */
#include <stdlib.h>
#include <string.h>

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

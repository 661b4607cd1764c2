/* test_runs_list.c - kiln runs list: finding runs, the config keys a sweep varied, filters,
 * the sort with missing values, broken runs as rows, the states a real trainer leaves, and
 * the table, JSON and CSV. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "runs_int.h"
#include "test.h"
#include "testutil.h"

/* A run directory under the test directory: run.json with this config (JSON object text)
 * and digest, and metrics.db with steps 1..n of these losses (NAN: a non-finite step, as
 * the trainer logs it), validation at val_at (0: none) and the events kinds. */
typedef struct fake {
    const char *name, *config, *sha;
    int n;
    const double *loss;
    int val_at;
    double val_loss;
    const char *const *events;
} fake;

static char *make_run(const fake *f) {
    char *dir = kiln_test_path(f->name);
    char *text = kiln_asprintf("{\"format\":\"kiln-run/1\",\"run_id\":\"r-%s\",\"dataset_sha256\":"
                               "\"%s\",\"config\":%s}",
                               f->name, f->sha ? f->sha : "ab", f->config);
    kiln_test_put(dir, "run.json", text);
    free(text);
    char *db = kiln_path_join(dir, "metrics.db");
    kiln_run_metrics *mx;
    if (f->n && kiln_run_metrics_open(db, false, &mx) == KILN_OK) {
        kiln_run_metrics_event(mx, 0, "start", "run started");
        for (int i = 0; i < f->n; i++) {
            kiln_train_progress p = {.step = i + 1,
                                     .loss = f->loss[i],
                                     .grad_norm = 1,
                                     .applied = isfinite(f->loss[i]),
                                     .tokens_per_s = 1000,
                                     .has_val = i + 1 == f->val_at,
                                     .val_loss = f->val_loss,
                                     .val_r2 = 0.125};
            kiln_run_metrics_step(mx, &p, NULL, 0);
        }
        for (const char *const *e = f->events; e && *e; e++)
            kiln_run_metrics_event(mx, f->n, *e, "what happened");
        kiln_run_metrics_close(mx);
    }
    free(db);
    return dir;
}

static const double losses[] = {1.0, 0.75, 0.5, 0.25};

static const kiln_run_row *row_named(const kiln_run_list *l, const char *name) {
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->rows[i].name, name)) return &l->rows[i];
    return NULL;
}

static bool varied_is(const kiln_run_list *l, const char *const *keys, size_t n) {
    if (json_array_size(l->varied) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (strcmp(json_string_value(json_array_get(l->varied, i)), keys[i])) return false;
    return true;
}

/* The order of the rows' names, as "a b c". */
static bool order_is(const kiln_run_list *l, const char *want) {
    char got[256] = "";
    for (size_t i = 0; i < l->n; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", i ? " " : "",
                 l->rows[i].name);
    if (strcmp(got, want)) fprintf(stderr, "    order: %s (expected %s)\n", got, want);
    return !strcmp(got, want);
}

/* Equal numbers in other spellings are the same value; nested keys are compared one by one;
 * a key one run lacks, and the dataset, count as differences. */
KILN_TEST(runs_list_varied_keys) {
    const fake runs[] = {
        {"s/a", "{\"steps\":4,\"lr\":0.001,\"clip\":2,\"model\":{\"d\":32,\"e\":4},\"w\":0.1}",
         NULL, 4, losses, 0, 0, NULL},
        {"s/b", "{\"steps\":4,\"lr\":1e-3,\"clip\":2.0,\"model\":{\"d\":32,\"e\":8},\"w\":0.1}",
         NULL, 4, losses, 0, 0, NULL},
        {"s/c",
         "{\"steps\":4,\"lr\":0.0010,\"clip\":2,\"model\":{\"d\":32,\"e\":4},\"w\":0.1000000000000"
         "0001,\"extra\":true}",
         "cd", 4, losses, 0, 0, NULL},
    };
    char *dirs[3];
    for (int i = 0; i < 3; i++)
        dirs[i] = make_run(&runs[i]);
    char *sweep = kiln_test_path("s");
    const char *paths[] = {sweep};
    kiln_run_list l;
    if (CHECK("list", kiln_run_list_load(paths, 1, NULL, &l) == KILN_OK)) {
        CHECK("three runs named under the sweep", l.n == 3 && l.compared == 3 &&
                                                      row_named(&l, "a") && row_named(&l, "b") &&
                                                      row_named(&l, "c"));
        /* 0.1 and 0.10000000000000001 are one double: not a difference. */
        const char *want[] = {"dataset_sha256", "extra", "model.e"};
        CHECK("varied: the digest, the key c alone has, the nested key that differs",
              varied_is(&l, want, 3));
        CHECK("same: numbers by value, nested keys flattened",
              json_object_size(l.same) == 5 && json_object_get(l.same, "lr") &&
                  json_object_get(l.same, "clip") && json_object_get(l.same, "w") &&
                  json_integer_value(json_object_get(l.same, "model.d")) == 32 &&
                  json_object_get(l.same, "steps") && !json_object_get(l.same, "model"));
        kiln_run_list_release(&l);
    }
    /* Two runs alike in everything but a float's last bit. */
    const fake ulp[] = {
        {"u/x", "{\"steps\":4,\"lr\":0.3}", NULL, 1, losses, 0, 0, NULL},
        {"u/y", "{\"steps\":4,\"lr\":0.30000000000000004}", NULL, 1, losses, 0, 0, NULL}};
    for (int i = 0; i < 2; i++)
        free(make_run(&ulp[i]));
    char *u = kiln_test_path("u");
    paths[0] = u;
    const char *lr[] = {"lr"};
    if (CHECK("list ulp", kiln_run_list_load(paths, 1, NULL, &l) == KILN_OK)) {
        CHECK("a one-ulp difference is a difference", varied_is(&l, lr, 1));
        kiln_run_list_release(&l);
    }
    /* A run given itself is named as given; runs under several paths by their paths. */
    const char *two[] = {dirs[0], dirs[2]};
    if (CHECK("list two runs", kiln_run_list_load(two, 2, NULL, &l) == KILN_OK)) {
        CHECK("named by path", l.n == 2 && row_named(&l, dirs[0]) && row_named(&l, dirs[2]));
        const char *want[] = {"dataset_sha256", "extra"};
        CHECK("compared between those two only", varied_is(&l, want, 2));
        kiln_run_list_release(&l);
    }
    for (int i = 0; i < 3; i++)
        free(dirs[i]);
    free(u), free(sweep);
}

/* The default order is the best validation loss ascending; a run without validation and a
 * broken one come last in either direction; ties and names go by their numbers. */
KILN_TEST(runs_list_sort) {
    const fake runs[] = {
        {"s/r10", "{\"steps\":4,\"lr\":0.1,\"opt\":\"sgd\"}", NULL, 4, losses, 2, 0.5, NULL},
        {"s/r2", "{\"steps\":4,\"lr\":0.2,\"opt\":\"adamw\"}", NULL, 4, losses, 3, 0.25, NULL},
        {"s/r3", "{\"steps\":4,\"lr\":0.3}", NULL, 3, losses, 0, 0, NULL},
        {"s/r4", "{\"steps\":4,\"lr\":0.05,\"opt\":\"adamw\"}", NULL, 4, losses, 4, 0.5, NULL},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(runs); i++)
        free(make_run(&runs[i]));
    char *sweep = kiln_test_path("s");
    kiln_test_put(sweep, "r1/run.json", "{\"config\": ");
    const char *paths[] = {sweep};
    kiln_run_list l;
    struct {
        const char *sort, *order;
    } cases[] = {
        {NULL, "r2 r4 r10 r3 r1"},        /* ties (0.5) by name, r4 before r10 */
        {"val_loss", "r2 r4 r10 r3 r1"},  /* the same, named */
        {"-val_loss", "r4 r10 r2 r3 r1"}, /* descending; missing still last */
        {"lr", "r4 r10 r2 r3 r1"},        /* a config key */
        {"-lr", "r3 r2 r10 r4 r1"},       /* broken r1 has none: last */
        {"opt", "r2 r4 r10 r3 r1"},       /* text; r3 has no opt */
        {"name", "r2 r3 r4 r10 r1"},      /* natural order of numbers in names */
        {"-step", "r2 r4 r10 r3 r1"},     /* r3 logged 3 steps */
        {"state", "r2 r4 r10 r3 r1"},     /* finished, interrupted, error */
        {"val_step", "r10 r2 r4 r3 r1"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        kiln_run_list_opts o = {.sort = cases[i].sort};
        char what[64];
        snprintf(what, sizeof what, "sort %s", cases[i].sort ? cases[i].sort : "(default)");
        if (CHECK(what, kiln_run_list_load(paths, 1, &o, &l) == KILN_OK)) {
            CHECK(what, order_is(&l, cases[i].order));
            kiln_run_list_release(&l);
        }
    }
    kiln_run_list_opts o = {.sort = "-lrr"};
    CHECK("an unknown sort key is refused by name",
          kiln_run_list_load(paths, 1, &o, &l) == KILN_ERR_USAGE &&
              kiln_test_msg_has("'lrr'", "sort"));
    o = (kiln_run_list_opts){.top = 2};
    if (CHECK("top", kiln_run_list_load(paths, 1, &o, &l) == KILN_OK)) {
        CHECK("the first two of five", order_is(&l, "r2 r4") && l.found == 5 && l.matched == 5);
        CHECK("the comparison covers the sweep, not the two shown",
              json_object_size(l.same) == 2 && json_array_size(l.varied) == 2);
        kiln_run_list_release(&l);
    }
    free(sweep);
}

/* --where: config and column keys, numbers by value, one key's values any, keys all; a broken
 * run passes config filters (it cannot be judged) but not a state filter. */
KILN_TEST(runs_list_filters) {
    const fake runs[] = {
        {"s/a", "{\"steps\":4,\"lr\":0.001,\"e\":4,\"opt\":\"sgd\"}", NULL, 4, losses, 4, 0.5,
         NULL},
        {"s/b", "{\"steps\":4,\"lr\":0.01,\"e\":4,\"opt\":\"adamw\"}", NULL, 4, losses, 4, 0.4,
         NULL},
        {"s/c", "{\"steps\":4,\"lr\":0.001,\"e\":8,\"opt\":\"adamw\"}", NULL, 2, losses, 2, 0.3,
         NULL},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(runs); i++)
        free(make_run(&runs[i]));
    char *sweep = kiln_test_path("s");
    kiln_test_put(sweep, "bad/run.json", "[]");
    const char *paths[] = {sweep};
    struct {
        const char *where[3];
        const char *order;
    } cases[] = {
        {{"lr=1e-3"}, "c a bad"},       {{"e=4.0"}, "b a bad"},
        {{"lr=0.001", "e=4"}, "a bad"}, {{"e=4", "e=8"}, "c b a bad"},
        {{"opt=adamw"}, "c b bad"},     {{"opt=\"adamw\"", "lr=0.01"}, "b bad"},
        {{"state=finished"}, "b a"},    {{"state=interrupted"}, "c"},
        {{"state=error"}, "bad"},       {{"name=b"}, "b"},
        {{"step=2"}, "c bad"},          {{"lr=0.002"}, "bad"},
    };
    kiln_run_list l;
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        size_t n = 0;
        while (n < 3 && cases[i].where[n])
            n++;
        kiln_run_list_opts o = {.where = cases[i].where, .n_where = n};
        char what[96];
        snprintf(what, sizeof what, "where %s %s", cases[i].where[0],
                 n > 1 ? cases[i].where[1] : "");
        if (CHECK(what, kiln_run_list_load(paths, 1, &o, &l) == KILN_OK)) {
            CHECK(what, order_is(&l, cases[i].order) && l.found == 4 && l.errors == 1);
            kiln_run_list_release(&l);
        }
    }
    const char *w1[] = {"e=4"};
    kiln_run_list_opts o = {.where = w1, .n_where = 1};
    if (CHECK("where e=4", kiln_run_list_load(paths, 1, &o, &l) == KILN_OK)) {
        const char *want[] = {"lr", "opt"};
        CHECK("the varied keys are those of the runs kept",
              varied_is(&l, want, 2) && l.compared == 2 && l.matched == 3);
        kiln_run_list_release(&l);
    }
    const char *w2[] = {"lrate=1"};
    o.where = w2;
    CHECK("an unknown key is refused by name",
          kiln_run_list_load(paths, 1, &o, &l) == KILN_ERR_USAGE &&
              kiln_test_msg_has("'lrate'", NULL));
    const char *w3[] = {"lr"};
    o.where = w3;
    CHECK("a filter without '=' is refused",
          kiln_run_list_load(paths, 1, &o, &l) == KILN_ERR_USAGE &&
              kiln_test_msg_has("'lr'", "KEY=VALUE"));
    free(sweep);
}

/* A broken run is a row that says why, naming the file; the others are read; nothing is
 * written. A path that is neither a run nor holds one is refused by name. */
KILN_TEST(runs_list_broken_runs) {
    const fake ok = {"s/ok", "{\"steps\":4,\"lr\":0.001}", NULL, 4, losses, 4, 0.5, NULL};
    const fake db = {"s/db", "{\"steps\":4,\"lr\":0.002}", NULL, 0, NULL, 0, 0, NULL};
    free(make_run(&ok));
    char *dbdir = make_run(&db), *sweep = kiln_test_path("s");
    kiln_test_put(sweep, "json/run.json", "{\"config\": {\"steps\": 4}, \"run_id\": 7}");
    kiln_test_put(dbdir, "metrics.db", "this is not a database, it only sits where one goes");
    kiln_test_put(sweep, "nometa/ckpt/x", "");
    kiln_test_put(sweep, "notes/readme.txt", "a directory without a run");
    kiln_test_put(sweep, "file.txt", "a file");
    char *before = kiln_test_listing(sweep), *db_path = kiln_path_join(dbdir, "metrics.db");
    char *db_files = kiln_test_listing(dbdir);
    char *db_before = NULL;
    size_t db_len = 0;
    kiln_read_file(db_path, 1 << 20, &db_before, &db_len);
    const char *paths[] = {sweep};
    kiln_run_list l;
    if (CHECK("a broken run does not stop the list",
              kiln_run_list_load(paths, 1, NULL, &l) == KILN_OK)) {
        const kiln_run_row *j = row_named(&l, "json"), *d = row_named(&l, "db"),
                           *m = row_named(&l, "nometa"), *o = row_named(&l, "ok");
        CHECK("four runs; the directory without one skipped", l.n == 4 && !row_named(&l, "notes"));
        CHECK("the good run is read", o && o->state == KILN_RUN_FINISHED && o->val_loss == 0.5);
        CHECK("run.json of the wrong shape: an error row naming the file and the field",
              j && j->state == KILN_RUN_ERROR && strstr(j->message, "json/run.json") &&
                  strstr(j->message, "run_id") && !j->config);
        CHECK("metrics.db not a database: an error row naming it",
              d && d->state == KILN_RUN_ERROR && strstr(d->message, "db/metrics.db"));
        CHECK("no run.json: an error row", m && m->state == KILN_RUN_ERROR &&
                                               strstr(m->message, "nometa") &&
                                               strstr(m->message, "run.json"));
        CHECK("errors counted and kept",
              l.errors == 3 && l.error_messages && strstr(l.error_messages[0], "db/metrics.db"));
        CHECK("error rows sort last", l.rows[0].state == KILN_RUN_FINISHED);
        CHECK("compared over the readable run alone", l.compared == 1);
        char *text = NULL;
        if (CHECK("table", kiln_run_list_table(&l, 100, 0, &text) == KILN_OK))
            CHECK("the row says error: and why, the file named within its run",
                  strstr(text, "\ndb      error: 'metrics.db': ") &&
                      strstr(text, "\njson    error: 'run.json': \"run_id\" is not a string\n"));
        free(text);
        kiln_run_list_release(&l);
    }
    char *after = kiln_test_listing(sweep), *db_after = NULL;
    size_t da_len = 0;
    kiln_read_file(db_path, 1 << 20, &db_after, &da_len);
    char *db_files_after = kiln_test_listing(dbdir);
    CHECK("nothing written or created", before && after && !strcmp(before, after) && db_files &&
                                            db_files_after && !strcmp(db_files, db_files_after));
    free(db_files), free(db_files_after);
    CHECK("the broken database left as it was",
          db_before && db_after && db_len == da_len && !memcmp(db_before, db_after, db_len));
    free(before), free(after), free(db_before), free(db_after), free(db_path);
    char *missing = kiln_test_path("missing"), *notes = kiln_path_join(sweep, "notes"),
         *file = kiln_path_join(sweep, "file.txt");
    paths[0] = missing;
    CHECK("a missing path is refused by name",
          kiln_run_list_load(paths, 1, NULL, &l) == KILN_ERR_NOTFOUND &&
              kiln_test_msg_has(missing, "no such"));
    paths[0] = notes;
    CHECK("a directory that holds no run is refused by name",
          kiln_run_list_load(paths, 1, NULL, &l) == KILN_ERR_USAGE &&
              kiln_test_msg_has(notes, "holds none"));
    paths[0] = file;
    CHECK("a file is refused by name", kiln_run_list_load(paths, 1, NULL, &l) == KILN_ERR_USAGE &&
                                           kiln_test_msg_has(file, "not a directory"));
    const char *mixed[] = {sweep, notes};
    CHECK("one bad path among good ones fails the list",
          kiln_run_list_load(mixed, 2, NULL, &l) == KILN_ERR_USAGE &&
              kiln_test_msg_has(notes, NULL));
    free(missing), free(notes), free(file), free(dbdir), free(sweep);
}

/* What the trainer leaves: a run listed from inside its own progress callback (the trainer
 * holds the run and has just committed the step) is running at that step; stopped there it
 * is interrupted; max_bad_steps non-finite steps make it diverged with the trainer's
 * message, and a resume that finishes makes it finished. */
typedef struct probe {
    const char *dir;
    long at;
    kiln_run_state state;
    long step;
    volatile int stop;
    bool stop_at;
} probe;

static void probe_progress(void *ctx, const kiln_train_progress *p) {
    probe *pr = ctx;
    if (p->step != pr->at) return;
    const char *paths[] = {pr->dir};
    kiln_run_list l;
    if (kiln_run_list_load(paths, 1, NULL, &l) == KILN_OK && l.n == 1) {
        pr->state = l.rows[0].state;
        pr->step = l.rows[0].step;
        kiln_run_list_release(&l);
    }
    if (pr->stop_at) pr->stop = 1;
}

static kiln_run_state state_of(const char *dir, kiln_run_row *copy) {
    const char *paths[] = {dir};
    kiln_run_list l;
    if (kiln_run_list_load(paths, 1, NULL, &l) != KILN_OK || l.n != 1) return KILN_RUN_ERROR;
    kiln_run_state s = l.rows[0].state;
    if (copy) {
        *copy = l.rows[0];
        copy->name = copy->dir = NULL;
        copy->config = NULL;
        copy->message = copy->message ? kiln_strdup(copy->message) : NULL;
    }
    kiln_run_list_release(&l);
    return s;
}

KILN_TEST(runs_list_trainer_states) {
    kiln_log_set_level(KILN_LOG_ERROR);
    char *data = kiln_test_synth("d.st", 1, 400), *a = kiln_test_path("a"),
         *b = kiln_test_path("b"), *c = kiln_test_path("c");
    kiln_train_config cfg;
    kiln_test_tiny_run(&cfg, 8);
    cfg.batch_size = 4;
    cfg.ckpt_every = 2;
    probe pa = {.dir = a, .at = 3, .state = KILN_RUN_ERROR};
    kiln_train_opts o = {
        .run_dir = a, .data_path = data, .progress = probe_progress, .progress_ctx = &pa};
    if (!CHECK("train", data && kiln_train_start(&cfg, &o) == KILN_OK)) goto out;
    CHECK("listed while training: running, at the step just logged",
          pa.state == KILN_RUN_RUNNING && pa.step == 3);
    kiln_run_row r;
    CHECK("finished once the trainer is done", state_of(a, &r) == KILN_RUN_FINISHED);
    CHECK("with its numbers", r.step == 6 && r.steps == 6 && r.val_step > 0 &&
                                  isfinite(r.val_loss) && isfinite(r.tokens_per_s) &&
                                  r.tokens_per_s > 0 && isfinite(r.updated) && r.nonfinite == 0);
    free(r.message);
    probe pb = {.dir = b, .at = 3, .state = KILN_RUN_ERROR, .stop_at = true};
    kiln_train_opts ob = {.run_dir = b,
                          .data_path = data,
                          .progress = probe_progress,
                          .progress_ctx = &pb,
                          .stop = &pb.stop};
    CHECK("stopped",
          kiln_train_start(&cfg, &ob) == KILN_ERR_INTERRUPTED && pb.state == KILN_RUN_RUNNING);
    CHECK("stopped: interrupted", state_of(b, NULL) == KILN_RUN_INTERRUPTED);
    cfg.max_bad_steps = 2;
    long bad[] = {3, 4};
    kiln_train_opts oc = {.run_dir = c, .data_path = data, .poison_steps = bad, .n_poison = 2};
    CHECK("diverges", kiln_train_start(&cfg, &oc) == KILN_ERR_NUMERIC);
    CHECK("the trainer's message is kept", kiln_test_msg_has("max_bad_steps", NULL));
    CHECK("diverged, with the trainer's message and the non-finite steps counted",
          state_of(c, &r) == KILN_RUN_DIVERGED && r.message && strstr(r.message, "max_bad_steps") &&
              r.nonfinite == 2 && r.step == 4);
    free(r.message);
    kiln_train_opts oc2 = {.run_dir = c};
    CHECK("resumed to the end", kiln_train_resume(&oc2) == KILN_OK);
    CHECK("then finished", state_of(c, &r) == KILN_RUN_FINISHED && !r.message && r.nonfinite == 0);
    free(r.message);
out:
    kiln_log_set_level(KILN_LOG_INFO);
    free(data), free(a), free(b), free(c);
}

/* The table fits the width asked for, shortens a long name in the middle, shows exactly
 * the varied keys as columns and the shared ones on a line above; JSON has every field in a
 * fixed order; CSV quotes what needs it. */
KILN_TEST(runs_list_output) {
    const fake runs[] = {
        {"s/a-very-long-run-name-from-a-sweep-script-lr0.001-experts4-seed1",
         "{\"steps\":4,\"lr\":0.001,\"n_experts\":4,\"d_model\":32}", NULL, 4, losses, 4, 0.5,
         NULL},
        {"s/short,comma", "{\"steps\":4,\"lr\":0.01,\"n_experts\":8,\"d_model\":32}", NULL, 3,
         losses, 2, 0.25, NULL},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(runs); i++)
        free(make_run(&runs[i]));
    char *sweep = kiln_test_path("s");
    const char *paths[] = {sweep};
    kiln_run_list l;
    if (!CHECK("list", kiln_run_list_load(paths, 1, NULL, &l) == KILN_OK)) goto out;
    const int widths[] = {80, 100, 120};
    for (size_t w = 0; w < KILN_ARRAY_LEN(widths); w++) {
        char *text = NULL;
        if (!CHECK("table", kiln_run_list_table(&l, widths[w], 0, &text) == KILN_OK)) continue;
        int widest = 0, lines = 0;
        for (char *line = text; *line; lines++) {
            char *nl = strchr(line, '\n');
            int cols = 0;
            for (char *p = line; p < nl; p++)
                cols += ((unsigned char)*p & 0xC0) != 0x80;
            widest = cols > widest ? cols : widest;
            line = nl + 1;
        }
        CHECK("every line fits", widest <= widths[w] && lines == 4);
        CHECK("the shared keys above",
              !strncmp(text, "same in all 2 runs: steps=4 d_model=32", 38));
        char *head = strchr(text, '\n') + 1;
        CHECK("a column per varied key, none for the shared ones",
              strstr(head, " lr ") && strstr(head, " n_experts\n") && !strstr(head, "d_model"));
        CHECK("the long name shortened in the middle",
              strstr(text, "a-very") && strstr(text, "seed1 ") && strstr(text, "…") &&
                  !strstr(text, "experts4"));
        CHECK("4 significant digits", strstr(text, " 0.2500@2 ") && strstr(text, " 0.5000@4 "));
        free(text);
    }
    char *text = NULL;
    if (CHECK("no limit", kiln_run_list_table(&l, 0, 0, &text) == KILN_OK))
        CHECK("the whole name", strstr(text, runs[0].name + 2) != NULL);
    free(text);
    json_t *doc = kiln_run_list_json(&l);
    if (CHECK("json", doc)) {
        static const char *const order[] = {"name",      "dir",    "state",        "message",
                                            "step",      "steps",  "loss",         "val_loss",
                                            "val_step",  "val_r2", "tokens_per_s", "updated",
                                            "nonfinite", "spikes", "config"};
        json_t *r0 = json_array_get(json_object_get(doc, "runs"), 0);
        void *it = json_object_iter(r0);
        bool in_order = json_object_size(r0) == KILN_ARRAY_LEN(order);
        for (size_t k = 0; it && k < KILN_ARRAY_LEN(order); k++, it = json_object_iter_next(r0, it))
            in_order &= !strcmp(json_object_iter_key(it), order[k]);
        CHECK("every field, in a fixed order", in_order);
        CHECK("best first, with its validation",
              json_real_value(json_object_get(r0, "val_loss")) == 0.25 &&
                  json_integer_value(json_object_get(r0, "val_step")) == 2);
        CHECK("the comparison", json_array_size(json_object_get(doc, "varied")) == 2 &&
                                    json_object_size(json_object_get(doc, "same")) == 3);
        json_decref(doc);
    }
    if (CHECK("csv", kiln_run_list_csv(&l, &text) == KILN_OK)) {
        const char *hdr = "name,state,step,steps,loss,val_loss,val_step,val_r2,tokens_per_s,"
                          "updated,nonfinite,spikes,message,lr,n_experts\n";
        CHECK("header", !strncmp(text, hdr, strlen(hdr)));
        CHECK("a name with a comma quoted", strstr(text, "\n\"short,comma\",interrupted,3,4,"));
        CHECK("exact numbers", strstr(text, ",0.001,4\n") && strstr(text, ",0.01,8\n"));
    }
    free(text);
    kiln_run_list_release(&l);
out:
    free(sweep);
}

/* ---- kiln runs show --follow ---- */

static kiln_err log_steps(kiln_run_metrics *mx, long from, long to, long of) {
    for (long s = from; s <= to; s++) {
        kiln_train_progress p = {.step = s,
                                 .steps = of,
                                 .loss = 1.0 / (double)s,
                                 .lr = 1e-3,
                                 .applied = s != 3,
                                 .has_val = s % 4 == 0,
                                 .val_loss = 0.5};
        KILN_TRY(kiln_run_metrics_step(mx, &p, NULL, 0));
    }
    return KILN_OK;
}

/* The steps a read gave, as "1 2 3". */
static const char *news_steps(const kiln_run_news *n, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n->n_steps && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%ld", i ? " " : "", n->steps[i].step);
    return buf;
}

/* A follower's reads across a trainer's life: only what is new each time, oldest first,
 * a resume's re-logged steps again (after its event), the clock stepping back, no news from
 * a run that has logged nothing, and the newest `max` when more came. */
KILN_TEST(runs_follow_reads_what_is_new) {
    char *dir = kiln_test_path("follow"), *db = kiln_path_join(dir, "metrics.db");
    kiln_test_put(dir, "run.json", "{\"format\":\"kiln-run/1\",\"config\":{\"steps\":12}}");
    kiln_run_metrics *mx = NULL;
    kiln_run_cursor cur;
    kiln_run_news n;
    char got[256];
    CHECK("no metrics.db yet: a zero cursor and no news",
          kiln_run_cursor_end(dir, &cur) == KILN_OK && cur.step == 0 && cur.time == 0 &&
              kiln_run_follow(dir, &cur, 100, &n) == KILN_OK && n.n_steps == 0 && n.n_events == 0);
    if (!CHECK("metrics", kiln_run_metrics_open(db, false, &mx) == KILN_OK &&
                              kiln_run_metrics_event(mx, 0, "start", "run started") == KILN_OK &&
                              log_steps(mx, 1, 5, 12) == KILN_OK))
        goto out;
    CHECK("everything from a zero cursor, oldest first, each row as logged",
          kiln_run_follow(dir, &cur, 100, &n) == KILN_OK &&
              !strcmp(news_steps(&n, got, sizeof got), "1 2 3 4 5") && n.n_events == 1 &&
              !strcmp(n.events[0].kind, "start") && n.steps[1].loss == 0.5 &&
              n.steps[1].steps == 12 && !n.steps[2].applied && n.steps[0].applied &&
              n.steps[3].has_val && n.steps[3].val_loss == 0.5 && !n.steps[2].has_val &&
              n.step_times[0] <= n.step_times[4] && n.events[0].time <= n.step_times[0]);
    kiln_run_news_release(&n);
    CHECK("nothing new, nothing read",
          kiln_run_follow(dir, &cur, 100, &n) == KILN_OK && n.n_steps == 0 && n.n_events == 0);
    kiln_run_news_release(&n);
    CHECK("then only what came", log_steps(mx, 6, 8, 12) == KILN_OK &&
                                     kiln_run_follow(dir, &cur, 100, &n) == KILN_OK &&
                                     !strcmp(news_steps(&n, got, sizeof got), "6 7 8"));
    kiln_run_news_release(&n);
    /* A resume from the checkpoint at step 4: the rows after it go, and come again. */
    CHECK("a resume: its event, then steps 5.. again",
          kiln_run_metrics_truncate(mx, 4) == KILN_OK &&
              kiln_run_metrics_event(mx, 4, "resume", "resumed from step 4") == KILN_OK &&
              log_steps(mx, 5, 6, 12) == KILN_OK &&
              kiln_run_follow(dir, &cur, 100, &n) == KILN_OK &&
              !strcmp(news_steps(&n, got, sizeof got), "5 6") && n.n_events == 1 &&
              !strcmp(n.events[0].kind, "resume") && n.events[0].time <= n.step_times[0]);
    kiln_run_news_release(&n);
    kiln_run_cursor end;
    CHECK("the end cursor: the newest step and event",
          kiln_run_cursor_end(dir, &end) == KILN_OK && end.step == 6 && end.event_id == 2 &&
              kiln_run_follow(dir, &end, 100, &n) == KILN_OK && n.n_steps == 0 && n.n_events == 0);
    kiln_run_news_release(&n);
    /* The clock stepped back: a later step logged with an older time is still new. */
    sqlite3_exec(kiln_run_metrics_db(mx),
                 "INSERT INTO steps(step, time, loss, applied) VALUES(7, 1000.0, 0.1, 1)", NULL,
                 NULL, NULL);
    CHECK("a step past the cursor's with an older time",
          kiln_run_follow(dir, &cur, 100, &n) == KILN_OK &&
              !strcmp(news_steps(&n, got, sizeof got), "7"));
    kiln_run_news_release(&n);
    CHECK("more than max: the newest max", log_steps(mx, 8, 12, 12) == KILN_OK &&
                                               kiln_run_follow(dir, &cur, 2, &n) == KILN_OK &&
                                               !strcmp(news_steps(&n, got, sizeof got), "11 12"));
    kiln_run_news_release(&n);
    kiln_test_put(dir, "run.json", "[]");
    CHECK("a damaged run.json: an error naming it",
          kiln_run_follow(dir, &cur, 100, &n) == KILN_ERR_FORMAT &&
              kiln_test_msg_has("run.json", NULL) && n.n_steps == 0);
out:
    kiln_run_metrics_close(mx);
    free(db);
    free(dir);
}

/* One text for a config value, whoever shows it (runs list, show, diff, serve; issue 33):
 * as people type it, and exactly (the serve page's %.10g showed two learning rates that
 * differ in the 17th digit as one). */
KILN_TEST(runs_config_value_text_one_rule) {
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"0.003", "0.003"},
        {"1e-05", "1e-5"},
        {"0.0010000000000000002", "0.0010000000000000002"},
        {"600", "600"},
        {"\"adamw\"", "adamw"},
        {"true", "true"},
        {"null", "null"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        json_error_t je;
        json_t *v = json_loads(cases[i].json, JSON_DECODE_ANY, &je);
        char *t = v ? kiln_run_config_value_text(v) : NULL;
        if (!CHECK(cases[i].json, t && !strcmp(t, cases[i].want)))
            fprintf(stderr, "    %s -> '%s', want '%s'\n", cases[i].json, t ? t : "(null)",
                    cases[i].want);
        free(t);
        json_decref(v);
    }
}

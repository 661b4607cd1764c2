/* test_validate.c - kiln export (freezing checkpoints), golden sets and the validation
 * gate: a freshly trained and exported model passes; a perturbed weight, an altered golden
 * output, a better baseline and a bf16 export off by more than its tolerance each fail
 * with a reason naming the check. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "export.h"
#include "runtime_int.h" /* kiln_rt_ties_high */
#include "test.h"
#include "testutil.h"
#include "train.h"
#include "validate.h"

/* ---- fixtures -------------------------------------------------------------------- */

static char *slurp(const char *path, size_t *len) {
    char *buf = NULL;
    size_t n = 0;
    if (kiln_read_file(path, 1u << 30, &buf, &n) != KILN_OK) return NULL;
    if (len) *len = n;
    return buf;
}

static bool same_file(const char *a, const char *b) {
    size_t la, lb;
    char *x = slurp(a, &la), *y = slurp(b, &lb);
    bool same = x && y && la == lb && !memcmp(x, y, la);
    free(x);
    free(y);
    return same;
}

static char *join(const char *a, const char *b) {
    return kiln_path_join(a, b);
}

/* A small synthetic dataset and a run trained on it for `steps` steps with checkpoints
 * every `every` steps (a tiny MoE: a fraction of a second). */
static bool make_run(const char *data, const char *run_dir, long steps, long every) {
    kiln_synth_opts so = {.seed = 7, .rows = 2400, .n_features = 5, .n_outputs = 2};
    if (!kiln_path_exists(data) && kiln_synth_write(&so, data, NULL)) return false;
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.model.d_model = 16;
    c.model.d_ff = 24;
    c.model.seq_len = 16;
    c.model.attn_window = 8;
    c.batch_size = 8;
    c.steps = steps;
    c.warmup_steps = 5;
    c.eval_every = every;
    c.ckpt_every = every;
    c.keep = 0;
    kiln_train_opts o = {.run_dir = run_dir, .data_path = data};
    return kiln_train_start(&c, &o) == KILN_OK;
}

typedef struct fixture {
    char *data, *run, *model;
} fixture;

static void fixture_free(fixture *f) {
    free(f->data);
    free(f->run);
    free(f->model);
}

/* Train (checkpoints every `every` steps), export the newest checkpoint (f32), make its
 * golden set. */
static bool fixture_make(fixture *f, long steps, long every) {
    f->data = kiln_test_path("data.safetensors");
    f->run = kiln_test_path("run");
    f->model = kiln_test_path("model");
    if (!make_run(f->data, f->run, steps, every)) return false;
    kiln_export_opts eo = {
        .run_dir = f->run, .step_metrics = kiln_run_step_metrics, .out_dir = f->model};
    if (kiln_export_model(&eo, NULL)) return false;
    kiln_golden_opts go = {
        .model = f->model, .data = f->data, .windows = 6, .seed = 3, .val_fraction = -1};
    return kiln_golden_make(&go) == KILN_OK;
}

static kiln_err validate(const char *model, const char *data, const char *baseline,
                         const char *bf16, json_t **rep) {
    kiln_validate_opts o = {
        .model = model, .data = data, .baseline = baseline, .bf16 = bf16, .val_fraction = -1};
    return kiln_validate_run(&o, rep);
}

static const char *status(const json_t *rep, const char *check) {
    const char *s = json_string_value(
        json_object_get(json_object_get(json_object_get(rep, "checks"), check), "status"));
    return s ? s : "";
}

static const char *reason(const json_t *rep, const char *check) {
    const char *s = json_string_value(
        json_object_get(json_object_get(json_object_get(rep, "checks"), check), "reason"));
    return s ? s : "";
}

/* Copy a model directory's model.safetensors, card.json and golden set. */
static bool copy_model(const char *from, const char *to) {
    static const char *const files[] = {"model.safetensors", "card.json",
                                        "golden/golden.safetensors", "golden/golden.json"};
    char *g = join(to, "golden");
    bool ok = g && kiln_mkdir_p(g) == KILN_OK;
    free(g);
    for (size_t i = 0; ok && i < KILN_ARRAY_LEN(files); i++) {
        char *a = join(from, files[i]), *b = join(to, files[i]);
        size_t n;
        char *buf = a ? slurp(a, &n) : NULL;
        ok = buf && b && kiln_write_file_atomic(b, buf, n) == KILN_OK;
        free(buf);
        free(a);
        free(b);
    }
    return ok;
}

/* Rewrite a safetensors file with tensor `name` (F32) changed by fn (false: cannot). */
typedef bool (*edit_fn)(float *v, size_t n, void *ctx);

static bool edit_tensor_with(const char *path, const char *name, edit_fn fn, void *ctx) {
    kiln_st *st = NULL;
    kiln_st_writer *w = NULL;
    float **copies = NULL;
    bool ok = kiln_st_open(path, &st) == KILN_OK && kiln_st_writer_new(&w) == KILN_OK;
    size_t n = ok ? kiln_st_count(st) : 0;
    copies = calloc(n ? n : 1, sizeof *copies);
    ok = ok && copies;
    bool found = false;
    for (size_t i = 0; ok && i < n; i++) {
        const kiln_tensor *t = kiln_st_at(st, i);
        copies[i] = malloc(t->nbytes ? t->nbytes : 1);
        ok = copies[i] != NULL;
        if (!ok) break;
        memcpy(copies[i], t->data, t->nbytes);
        if (!strcmp(t->name, name) && t->dtype == KILN_F32 && fn(copies[i], t->numel, ctx))
            found = true;
        ok = kiln_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, copies[i]) == KILN_OK;
    }
    for (size_t i = 0; ok && i < kiln_st_meta_count(st); i++) {
        const char *k, *v;
        kiln_st_meta_at(st, i, &k, &v);
        ok = kiln_st_writer_meta(w, k, v) == KILN_OK;
    }
    ok = ok && found && kiln_st_writer_write(w, path) == KILN_OK;
    for (size_t i = 0; copies && i < n; i++)
        free(copies[i]);
    free(copies);
    kiln_st_writer_free(w);
    kiln_st_close(st);
    return ok;
}

typedef struct nudge {
    size_t index;
    float delta;
} nudge;

static bool nudge_one(float *v, size_t n, void *ctx) {
    const nudge *d = ctx;
    if (d->index >= n) return false;
    v[d->index] += d->delta;
    return true;
}

/* Rewrite a safetensors file with element `index` of tensor `name` (F32) changed by delta. */
static bool edit_tensor(const char *path, const char *name, size_t index, float delta) {
    nudge d = {index, delta};
    return edit_tensor_with(path, name, nudge_one, &d);
}

/* ---- export ---------------------------------------------------------------------- */

KILN_TEST(validate_export_deterministic) {
    char *data = kiln_test_path("d.safetensors"), *run = kiln_test_path("run");
    if (!CHECK("trains a run", make_run(data, run, 8, 4))) goto out;
    char *a = kiln_test_path("a"), *b = kiln_test_path("b"), *c = kiln_test_path("c");
    kiln_export_opts o = {.run_dir = run, .step_metrics = kiln_run_step_metrics, .out_dir = a};
    kiln_export_info info;
    CHECK("exports", kiln_export_model(&o, &info) == KILN_OK);
    CHECK("the newest checkpoint", info.step == 8 && info.n_skipped == 0);
    kiln_export_info_release(&info);
    sleep(1); /* a clock in the output would show now */
    o.out_dir = b;
    CHECK("exports again", kiln_export_model(&o, NULL) == KILN_OK);
    char *ma = join(a, "model.safetensors"), *mb = join(b, "model.safetensors");
    char *ca = join(a, "card.json"), *cb = join(b, "card.json");
    CHECK("same model bytes", same_file(ma, mb));
    CHECK("same card bytes", same_file(ca, cb));

    /* What the model file holds: the parameters and kiln.config, no optimizer state. */
    kiln_st *st = NULL;
    if (CHECK("model opens", kiln_st_open(ma, &st) == KILN_OK)) {
        kiln_model_config cfg;
        kiln_param *tab = NULL;
        size_t np = 0, tot;
        CHECK("has kiln.config", kiln_model_config_from_st(st, &cfg) == KILN_OK &&
                                     kiln_param_table(&cfg, &tab, &np, &tot) == KILN_OK);
        CHECK("exactly the parameters", kiln_st_count(st) == np && np > 0);
        CHECK("no moments",
              !kiln_st_find(st, "m.embed.weight") && !kiln_st_find(st, "v.head.bias"));
        CHECK("norm.in_std is there", kiln_st_find(st, "norm.in_std") != NULL);
        free(tab);
        kiln_st_close(st);
    }
    /* The card: lineage from the run, created from the checkpoint, and pack accepts it. */
    json_t *card = NULL;
    if (CHECK("card parses", kiln_json_load_file(ca, &card) == KILN_OK)) {
        const json_t *lin = json_object_get(card, "lineage");
        CHECK("lineage step", json_integer_value(json_object_get(lin, "step")) == 8);
        CHECK("lineage run id", json_string_length(json_object_get(lin, "run_id")) == 32);
        CHECK("lineage dataset digest",
              json_string_length(json_object_get(lin, "dataset_sha256")) == 64);
        CHECK("lineage val_loss",
              json_is_number(json_object_get(json_object_get(lin, "metrics"), "val_loss")));
        CHECK("run config",
              json_is_number(json_object_get(json_object_get(lin, "config"), "val_fraction")));
        int64_t t;
        CHECK("created is RFC 3339 near now",
              kiln_export_parse_time(json_string_value(json_object_get(card, "created")), &t) ==
                      KILN_OK &&
                  llabs(t - kiln_unix_time()) < 3600);
        json_decref(card);
    }
    kiln_manifest *m = NULL;
    CHECK("pack's manifest accepts the directory",
          kiln_manifest_build(a, "demo", "1.0.0", &m) == KILN_OK);
    kiln_manifest_free(m);

    /* bf16: trained tensors BF16 rounded to nearest even, norm.in_* F32. */
    o.out_dir = c;
    o.dtype = KILN_EXPORT_BF16;
    o.step = 4;
    CHECK("exports bf16 at step 4", kiln_export_model(&o, NULL) == KILN_OK);
    char *mc = join(c, "model.safetensors");
    kiln_st *s4 = NULL, *ck = NULL;
    char *ckp = join(run, "ckpt/step-00000004.safetensors");
    if (CHECK("bf16 model opens",
              kiln_st_open(mc, &s4) == KILN_OK && kiln_st_open(ckp, &ck) == KILN_OK)) {
        const kiln_tensor *w = kiln_st_find(s4, "head.weight"),
                          *f = kiln_st_find(ck, "head.weight");
        bool ok = w && f && w->dtype == KILN_BF16 && w->numel == f->numel && f->ndim == 2 &&
                  f->shape[0] <= 8;
        /* The head has the trainer's target standardisation folded in (W' = std W). */
        float mean[8], sd[8];
        bool present = false;
        ok = ok && kiln_target_norm_read(ck, (int)f->shape[0], mean, sd, &present) == KILN_OK &&
             present;
        for (size_t i = 0; ok && i < w->numel; i++) {
            uint16_t h;
            float x;
            memcpy(&h, (const char *)w->data + 2 * i, 2);
            memcpy(&x, (const char *)f->data + 4 * i, 4);
            ok = h == kiln_f32_to_bf16(x * sd[i / (size_t)f->shape[1]]);
        }
        CHECK("bf16 weights are the rounded checkpoint, standardisation folded", ok);
        CHECK("norm.in_mean stays F32", kiln_st_find(s4, "norm.in_mean")->dtype == KILN_F32);
    }
    kiln_st_close(s4);
    kiln_st_close(ck);
    free(ckp);
    free(mc);
    free(ma);
    free(mb);
    free(ca);
    free(cb);
    free(a);
    free(b);
    free(c);
out:
    free(data);
    free(run);
}

/* kiln reproduce makes a released card again: the card's created is the one given (not the
 * checkpoint's time), "dataset_withheld" is there when asked, and a created that is no time is
 * refused naming it, with nothing written. */
KILN_TEST(validate_export_created_and_withheld) {
    char *data = kiln_test_path("d.safetensors"), *run = kiln_test_path("run"),
         *a = kiln_test_path("a"), *b = kiln_test_path("b"), *ca = join(a, "card.json");
    json_t *card = NULL;
    if (!CHECK("trains a run", make_run(data, run, 4, 4))) goto out;
    kiln_export_opts o = {.run_dir = run,
                          .step_metrics = kiln_run_step_metrics,
                          .out_dir = a,
                          .created = "2030-01-02T03:04:05Z",
                          .data_withheld = true};
    if (!CHECK("exports", kiln_export_model(&o, NULL) == KILN_OK)) goto out;
    if (!CHECK("card parses", kiln_json_load_file(ca, &card) == KILN_OK)) goto out;
    CHECK("created is the one given",
          !strcmp(json_string_value(json_object_get(card, "created")), "2030-01-02T03:04:05Z"));
    CHECK("the lineage says the dataset was withheld",
          json_is_true(json_object_get(json_object_get(card, "lineage"), "dataset_withheld")));
    o.out_dir = b;
    o.created = "yesterday";
    CHECK("a created that is no time is refused",
          kiln_export_model(&o, NULL) == KILN_ERR_FORMAT &&
              kiln_test_msg_has("created time 'yesterday'", NULL));
    CHECK("nothing written", !kiln_path_exists(b));
out:
    json_decref(card);
    free(data), free(run), free(a), free(b), free(ca);
}

KILN_TEST(validate_export_refusals) {
    char *data = kiln_test_path("d.safetensors"), *run = kiln_test_path("run");
    if (!CHECK("trains a run", make_run(data, run, 8, 4))) goto out;
    char *ck = join(run, "ckpt/step-00000008.safetensors"), *out = kiln_test_path("m");
    /* Flip one byte of the newest checkpoint's tensor data (the file's last byte). */
    size_t n = 0;
    char *buf = slurp(ck, &n);
    if (!CHECK("reads the checkpoint", buf && n > 16)) goto out2;
    buf[n - 1] ^= 0x40;
    CHECK("writes it back", kiln_write_file_atomic(ck, buf, n) == KILN_OK);
    free(buf);

    kiln_export_opts o = {
        .run_dir = run, .step_metrics = kiln_run_step_metrics, .out_dir = out, .step = 8};
    kiln_err rc = kiln_export_model(&o, NULL);
    CHECK("the corrupt step is refused", rc == KILN_ERR_VERIFY);
    CHECK("the message names the file and the problem",
          strstr(kiln_errmsg(), "step-00000008.safetensors") &&
              strstr(kiln_errmsg(), "digest mismatch"));
    CHECK("nothing is left behind", !kiln_path_exists(out));

    /* The default falls back to the newest checkpoint that verifies. */
    o.step = 0;
    kiln_export_info info;
    CHECK("the default step exports", kiln_export_model(&o, &info) == KILN_OK);
    CHECK("from step 4, the corrupt one skipped",
          info.step == 4 && info.n_skipped == 1 && strstr(info.skipped[0], "digest mismatch"));
    kiln_export_info_release(&info);

    /* An existing non-empty directory is left alone unless forced. */
    char *card = join(out, "card.json");
    char *before = slurp(card, NULL);
    o.step = 4;
    o.name = "other";
    rc = kiln_export_model(&o, NULL);
    CHECK("a non-empty directory is refused", rc == KILN_ERR_CONFLICT &&
                                                  strstr(kiln_errmsg(), "not empty") &&
                                                  strstr(kiln_errmsg(), "'"));
    char *after = slurp(card, NULL);
    CHECK("and left as it was", before && after && !strcmp(before, after));
    free(after);
    o.force = true;
    /* --force replaces a model directory, not a directory of other files given by mistake. */
    char *users = kiln_test_path("users");
    kiln_test_put(users, "positions.csv", "sym,qty\n");
    kiln_test_put(users, "sub/config.ini", "[risk]\n");
    o.out_dir = users;
    rc = kiln_export_model(&o, NULL);
    CHECK("--force over a directory of other files: refused",
          rc == KILN_ERR_CONFLICT && kiln_test_msg_has("'positions.csv'", "--force replaces only"));
    char *pos = join(users, "positions.csv"), *ini = join(users, "sub/config.ini");
    char *pt = slurp(pos, NULL), *it = slurp(ini, NULL);
    CHECK("and left as it was", pt && it && !strcmp(pt, "sym,qty\n") && !strcmp(it, "[risk]\n"));
    free(pt), free(it), free(pos), free(ini), free(users);
    char *extra = join(out, "notes.txt");
    CHECK("a model directory with a file kiln does not write",
          kiln_write_file_atomic(extra, "x", 1) == KILN_OK);
    o.out_dir = out;
    CHECK("is refused too", kiln_export_model(&o, NULL) == KILN_ERR_CONFLICT &&
                                kiln_test_msg_has("'notes.txt'", NULL) && kiln_path_exists(extra));
    unlink(extra);
    free(extra);
    CHECK("--force replaces it", kiln_export_model(&o, NULL) == KILN_OK);
    after = slurp(card, NULL);
    CHECK("with the new card", after && strstr(after, "\"name\": \"other\""));
    free(after);
    free(before);
    free(card);
    o.step = 5;
    CHECK("a step with no checkpoint", kiln_export_model(&o, NULL) == KILN_ERR_NOTFOUND &&
                                           strstr(kiln_errmsg(), "no checkpoint of step 5"));
    o.step = 0;
    o.name = "Bad Name";
    CHECK("a bad name", kiln_export_model(&o, NULL) == KILN_ERR_USAGE);
out2:
    free(ck);
    free(out);
out:
    free(data);
    free(run);
}

/* ---- thresholds and comparisons ---------------------------------------------------- */

KILN_TEST(validate_thresholds) {
    kiln_thresholds t;
    kiln_thresholds_default(&t);
    CHECK("defaults", t.golden.rtol == 1e-5 && t.parity.rtol > 0 && t.heldout_windows == 256);
    CHECK("sets a key",
          kiln_thresholds_set(&t, "parity.rtol=3e-4") == KILN_OK && t.parity.rtol == 3e-4);
    kiln_thresholds before = t;
    CHECK("unknown key refused", kiln_thresholds_set(&t, "parity.rtool=1") == KILN_ERR_USAGE &&
                                     strstr(kiln_errmsg(), "unknown threshold 'parity.rtool'"));
    CHECK("not a number", kiln_thresholds_set(&t, "golden.atol=abc") == KILN_ERR_USAGE &&
                              strstr(kiln_errmsg(), "golden.atol"));
    CHECK("out of range", kiln_thresholds_set(&t, "golden.rtol=-1") == KILN_ERR_USAGE);
    CHECK("no '='", kiln_thresholds_set(&t, "golden.rtol") == KILN_ERR_USAGE);
    CHECK("whole windows", kiln_thresholds_set(&t, "heldout.windows=2.5") == KILN_ERR_USAGE);
    CHECK("unchanged by refusals", !memcmp(&before, &t, sizeof t));
    json_t *j = kiln_thresholds_json(&t);
    CHECK("every key in JSON", j && json_real_value(json_object_get(j, "parity.rtol")) == 3e-4 &&
                                   json_object_get(j, "baseline.rel_margin"));
    json_decref(j);

    kiln_tolerance tol = {1e-3, 1e-4, 0};
    const float ref[4] = {1.0f, -2.0f, 0.0f, 0.5f};
    float got[4] = {1.0005f, -2.0f, 5e-5f, 0.5f};
    kiln_compare c;
    kiln_compare_f32(got, ref, 4, &tol, &c);
    CHECK("inside: relative and absolute", c.passed && c.frac_outside == 0 && c.scale == 2.0);
    got[3] = 0.502f;
    kiln_compare_f32(got, ref, 4, &tol, &c);
    CHECK("one outside",
          !c.passed && c.frac_outside == 0.25 && c.worst == 3 && fabs(c.max_rel - 0.004) < 1e-6);
    tol.max_outside = 0.25;
    kiln_compare_f32(got, ref, 4, &tol, &c);
    CHECK("allowed share", c.passed);
    got[0] = NAN;
    kiln_compare_f32(got, ref, 4, &tol, &c);
    CHECK("NaN never passes", !c.passed && c.nonfinite);
}

/* The tolerances are relative to the outputs' own scale (atol a fraction of max |b|): the same
 * outputs in other units get the same verdict and figures (issue 30 asked whether bf16's
 * was; it is, as every check's). Scaled by powers of two, so every product is exact. */
KILN_TEST(validate_compare_is_scale_free) {
    kiln_thresholds th;
    kiln_thresholds_default(&th);
    enum { N = 200 };
    float a[N], b[N], as[N], bs[N];
    for (int i = 0; i < N; i++) {
        b[i] = (float)sin(0.37 * i) * (i % 7 ? 1.0f : 0.01f); /* some outputs near zero */
        a[i] = b[i] * (1 + (i % 3 ? 0.03f : 0.06f)) + (i % 5 ? 0 : 0.015f);
    }
    kiln_compare ref, c;
    kiln_compare_f32(a, b, N, &th.bf16, &ref);
    CHECK("some outside, some inside", ref.frac_outside > 0 && ref.frac_outside < 0.5);
    const float scales[] = {0x1p-7f, 0x1p-14f, 0x1p7f};
    for (size_t s = 0; s < KILN_ARRAY_LEN(scales); s++) {
        for (int i = 0; i < N; i++) {
            as[i] = a[i] * scales[s];
            bs[i] = b[i] * scales[s];
        }
        kiln_compare_f32(as, bs, N, &th.bf16, &c);
        CHECK("the same share outside, worst and relative error at another scale",
              c.frac_outside == ref.frac_outside && c.worst == ref.worst &&
                  c.max_rel == ref.max_rel && c.passed == ref.passed &&
                  c.scale == ref.scale * scales[s]);
    }
}

/* ---- golden sets and the gate ------------------------------------------------------ */

KILN_TEST(validate_golden_make) {
    fixture f = {0};
    if (!CHECK("fixture", fixture_make(&f, 10, 5))) goto out;
    char *gs = join(f.model, "golden/golden.safetensors"),
         *gj = join(f.model, "golden/golden.json");
    char *o2 = kiln_test_path("g2"), *s2 = join(o2, "golden.safetensors");
    kiln_golden_opts go = {
        .model = f.model, .data = f.data, .windows = 6, .seed = 3, .val_fraction = -1};
    CHECK("an existing set is refused", kiln_golden_make(&go) == KILN_ERR_CONFLICT &&
                                            strstr(kiln_errmsg(), "exists and is not empty") &&
                                            strstr(kiln_errmsg(), "--force"));
    go.out_dir = o2;
    CHECK("made again elsewhere", kiln_golden_make(&go) == KILN_OK);
    CHECK("same bytes", same_file(gs, s2));
    json_t *j = NULL;
    if (CHECK("golden.json", kiln_json_load_file(gj, &j) == KILN_OK)) {
        const json_t *wc = json_object_get(j, "windows_chosen"), *sp = json_object_get(wc, "split");
        const json_t *starts = json_object_get(wc, "starts");
        json_int_t vb = json_integer_value(json_object_get(sp, "val_begin")),
                   ve = json_integer_value(json_object_get(sp, "val_end"));
        bool inside = json_array_size(starts) == 6, distinct = true;
        for (size_t i = 0; i < json_array_size(starts); i++) {
            json_int_t s = json_integer_value(json_array_get(starts, i));
            inside = inside && s >= vb && s + 16 <= ve;
            for (size_t k = 0; k < i; k++)
                distinct = distinct && s != json_integer_value(json_array_get(starts, k));
        }
        CHECK("windows inside the held-out split", inside && vb > 0 && ve == 2400);
        CHECK("distinct windows", distinct);
        CHECK("the trainer's split (0.2 of 2400 rows)", vb == 2400 - 480);
        CHECK("seed recorded", json_integer_value(json_object_get(wc, "seed")) == 3);
        json_decref(j);
    }
    go.seed = 4;
    go.force = true;
    CHECK("another seed", kiln_golden_make(&go) == KILN_OK && !same_file(gs, s2));
    go.windows = 0;
    CHECK("zero windows refused", kiln_golden_make(&go) == KILN_ERR_USAGE);
    free(gs);
    free(gj);
    free(o2);
    free(s2);
out:
    fixture_free(&f);
}

KILN_TEST(validate_passes_fresh_model) {
    fixture f = {0};
    if (!CHECK("fixture", fixture_make(&f, 20, 10))) goto out;
    json_t *rep = NULL;
    kiln_validate_opts o = {.model = f.model, .data = f.data, .val_fraction = -1};
    kiln_err rc = kiln_validate_run(&o, &rep);
    CHECK("passes", rc == KILN_OK);
    CHECK("report passed", json_is_true(json_object_get(rep, "passed")));
    CHECK("golden passed", !strcmp(status(rep, "golden"), "passed"));
    /* By default, as kiln release runs it (issue 30: validate ran it only when asked). */
    CHECK("bf16 in memory passed, by default", !strcmp(status(rep, "parity_f32_bf16"), "passed"));
    CHECK("no baseline: not run", !strcmp(status(rep, "baseline_loss"), "not run"));
    CHECK("cuda: passed (a GPU), or not run with a reason",
          !strcmp(status(rep, "parity_cpu_cuda"), "passed") ||
              (!strcmp(status(rep, "parity_cpu_cuda"), "not run") &&
               *reason(rep, "parity_cpu_cuda")));
    const json_t *h = json_object_get(rep, "heldout");
    /* The run's val_loss is of its standardised targets: loss_standardised is in its units. */
    double loss = json_real_value(json_object_get(h, "loss_standardised")),
           card = json_real_value(json_object_get(h, "card_val_loss"));
    CHECK("held-out loss is the run's val_loss", card > 0 && fabs(loss - card) <= 1e-6 * card);
    CHECK("data digest in the report",
          json_string_length(json_object_get(json_object_get(rep, "data"), "sha256")) == 64);
    CHECK("tool version", json_is_string(json_object_get(rep, "kiln_version")));
    json_decref(rep);
    char *vp = join(f.model, "validation.json");
    json_t *file = NULL;
    CHECK("validation.json written with passed", kiln_json_load_file(vp, &file) == KILN_OK &&
                                                     json_is_true(json_object_get(file, "passed")));
    json_decref(file);
    free(vp);

    /* The real bf16 export of the same checkpoint passes too; pack reads the verdict. */
    char *mb = kiln_test_path("model-bf16");
    kiln_export_opts eo = {.run_dir = f.run,
                           .step_metrics = kiln_run_step_metrics,
                           .out_dir = mb,
                           .dtype = KILN_EXPORT_BF16};
    CHECK("bf16 export", kiln_export_model(&eo, NULL) == KILN_OK);
    CHECK("--bf16 with the export passes", validate(f.model, f.data, NULL, mb, &rep) == KILN_OK &&
                                               !strcmp(status(rep, "parity_f32_bf16"), "passed"));
    json_decref(rep);
    kiln_manifest *m = NULL;
    CHECK("pack sees the verdict", kiln_manifest_build(f.model, "demo", "1.0.0", &m) == KILN_OK &&
                                       m->validation_present && m->validation_passed);
    kiln_manifest_free(m);
    free(mb);
    /* Skipped only when asked, and the report says by what (issue 30: it said "no bf16 export
     * asked for", which release's --no-bf16 showed on the registry page). */
    kiln_validate_opts nb = {.model = f.model, .data = f.data, .no_bf16 = true, .val_fraction = -1};
    CHECK("no_bf16: passes, parity_f32_bf16 skipped by --no-bf16",
          kiln_validate_run(&nb, &rep) == KILN_OK &&
              !strcmp(status(rep, "parity_f32_bf16"), "not run") &&
              !strcmp(reason(rep, "parity_f32_bf16"), "skipped by --no-bf16"));
    json_decref(rep);
out:
    fixture_free(&f);
}

KILN_TEST(validate_fails_perturbed_weight) {
    fixture f = {0};
    if (!CHECK("fixture", fixture_make(&f, 10, 5))) goto out;
    char *p = kiln_test_path("perturbed"), *mp = join(p, "model.safetensors");
    CHECK("copies", copy_model(f.model, p));
    /* One weight of an expert of the first block moved by 1e-3 (weights are ~0.02): outputs
     * move by ~1e-3 relative, 100 times golden.rtol (docs/validation.md has the table). */
    CHECK("perturbs", edit_tensor(mp, "blocks.0.moe.fc.weight", 769, 1e-3f));
    json_t *rep = NULL;
    kiln_err rc = validate(p, f.data, NULL, NULL, &rep);
    CHECK("fails", rc == KILN_ERR_VERIFY);
    CHECK("the message names the check", strstr(kiln_errmsg(), "1 check failed: golden"));
    CHECK("golden failed", !strcmp(status(rep, "golden"), "failed"));
    CHECK("reason gives the error", strstr(reason(rep, "golden"), "outside tolerance"));
    CHECK("report says not passed", json_is_false(json_object_get(rep, "passed")));
    json_decref(rep);
    free(mp);
    free(p);
out:
    fixture_free(&f);
}

KILN_TEST(validate_fails_altered_golden) {
    fixture f = {0};
    if (!CHECK("fixture", fixture_make(&f, 10, 5))) goto out;
    char *gs = join(f.model, "golden/golden.safetensors");
    CHECK("alters one stored output", edit_tensor(gs, "outputs", 11, 1e-3f));
    json_t *rep = NULL;
    CHECK("fails", validate(f.model, f.data, NULL, NULL, &rep) == KILN_ERR_VERIFY);
    CHECK("golden failed at that output", !strcmp(status(rep, "golden"), "failed") &&
                                              strstr(reason(rep, "golden"), "step 5") &&
                                              strstr(reason(rep, "golden"), "output 1"));
    json_decref(rep);
    /* Inputs that are not the data's rows are named as such. */
    CHECK("restores", edit_tensor(gs, "outputs", 11, -1e-3f));
    CHECK("alters one stored input", edit_tensor(gs, "inputs", 3, 0.5f));
    CHECK("fails", validate(f.model, f.data, NULL, NULL, &rep) == KILN_ERR_VERIFY);
    CHECK("names the inputs", strstr(reason(rep, "golden"), "stored inputs or targets"));
    json_decref(rep);
    /* No golden set at all. */
    char *gj = join(f.model, "golden/golden.json");
    unlink(gj);
    CHECK("fails without a golden set",
          validate(f.model, f.data, NULL, NULL, &rep) == KILN_ERR_VERIFY &&
              strstr(reason(rep, "golden"), "no golden set"));
    json_decref(rep);
    free(gj);
    free(gs);
out:
    fixture_free(&f);
}

KILN_TEST(validate_fails_better_baseline) {
    fixture f = {0};
    if (!CHECK("fixture", fixture_make(&f, 40, 4))) goto out;
    /* The candidate: an early checkpoint of the same run (step 4 of 40, still warming up). */
    char *early = kiln_test_path("early");
    kiln_export_opts eo = {
        .run_dir = f.run, .step_metrics = kiln_run_step_metrics, .out_dir = early, .step = 4};
    CHECK("exports step 4", kiln_export_model(&eo, NULL) == KILN_OK);
    kiln_golden_opts go = {
        .model = early, .data = f.data, .windows = 4, .seed = 1, .val_fraction = -1};
    CHECK("golden for it", kiln_golden_make(&go) == KILN_OK);
    json_t *rep = NULL;
    kiln_err rc = validate(early, f.data, f.model, NULL, &rep);
    CHECK("fails", rc == KILN_ERR_VERIFY && strstr(kiln_errmsg(), "baseline_loss"));
    CHECK("baseline_loss failed",
          !strcmp(status(rep, "baseline_loss"), "failed") &&
              strstr(reason(rep, "baseline_loss"), "worse than the baseline"));
    CHECK("the baseline's golden still reproduces",
          !strcmp(status(rep, "baseline_golden"), "passed"));
    /* The report names the baseline: here a directory made by hand, known by its weights
     * only. */
    const json_t *bl = json_object_get(rep, "baseline");
    uint8_t d[KILN_SHA256_BYTES];
    char mhex[KILN_SHA256_HEX], ehex[KILN_SHA256_HEX];
    char *mw = join(f.model, "model.safetensors"), *ew = join(early, "model.safetensors");
    CHECK("hash the weights", mw && ew && kiln_sha256_file(mw, d) == KILN_OK);
    kiln_hex(d, sizeof d, mhex);
    CHECK("hash the early weights", ew && kiln_sha256_file(ew, d) == KILN_OK);
    kiln_hex(d, sizeof d, ehex);
    CHECK("baseline: its model_sha256, nothing else known",
          json_is_object(bl) &&
              !strcmp(json_string_value(json_object_get(bl, "model_sha256")), mhex) &&
              json_is_null(json_object_get(bl, "name")) &&
              json_is_null(json_object_get(bl, "digest")) &&
              json_is_null(json_object_get(bl, "manifest_sha256")));
    json_decref(rep);
    /* The other way round passes: the final model against the early one in production, which
     * carries a manifest.json as a pulled model does (one naming other weights is ignored). */
    char *man = kiln_asprintf("{\"files\":[{\"path\":\"model.safetensors\",\"sha256\":\"%s\"}],"
                              "\"name\":\"market\",\"version\":\"0.9.0\"}",
                              ehex);
    kiln_test_put(early, "manifest.json", man ? man : "");
    rc = validate(f.model, f.data, early, NULL, &rep);
    CHECK("a better candidate passes",
          rc == KILN_OK && !strcmp(status(rep, "baseline_loss"), "passed"));
    bl = json_object_get(rep, "baseline");
    kiln_sha256(man ? man : "", man ? strlen(man) : 0, d);
    kiln_hex(d, sizeof d, mhex);
    CHECK("baseline named by its manifest",
          !strcmp(json_string_value(json_object_get(bl, "name")), "market") &&
              !strcmp(json_string_value(json_object_get(bl, "version")), "0.9.0") &&
              !strcmp(json_string_value(json_object_get(bl, "manifest_sha256")), mhex) &&
              !strcmp(json_string_value(json_object_get(bl, "model_sha256")), ehex) &&
              json_is_null(json_object_get(bl, "channel")));
    json_decref(rep);
    /* kiln release says which archive and channel record it pulled. */
    const kiln_validate_baseline_ref ref = {.name = "market",
                                            .version = "0.9.0",
                                            .digest = "sha256:ab",
                                            .channel = "production",
                                            .seq = 7};
    kiln_validate_opts o = {.model = f.model,
                            .data = f.data,
                            .baseline = early,
                            .baseline_ref = &ref,
                            .report = "",
                            .val_fraction = -1};
    rc = kiln_validate_run(&o, &rep);
    bl = json_object_get(rep, "baseline");
    CHECK("baseline from the caller: digest, channel and seq",
          rc == KILN_OK && !strcmp(json_string_value(json_object_get(bl, "digest")), "sha256:ab") &&
              !strcmp(json_string_value(json_object_get(bl, "channel")), "production") &&
              json_integer_value(json_object_get(bl, "seq")) == 7 &&
              !strcmp(json_string_value(json_object_get(bl, "manifest_sha256")), mhex));
    json_decref(rep);
    rc = validate(f.model, f.data, NULL, NULL, &rep);
    CHECK("no baseline: null", rc == KILN_OK && json_is_null(json_object_get(rep, "baseline")));
    json_decref(rep);
    free(man), free(mw), free(ew);
    free(early);
out:
    fixture_free(&f);
}

KILN_TEST(validate_fails_bf16_off) {
    fixture f = {0};
    if (!CHECK("fixture", fixture_make(&f, 10, 5))) goto out;
    /* A bf16 export of another checkpoint of the run stands in for a broken conversion. */
    char *mb = kiln_test_path("bf16");
    kiln_export_opts eo = {.run_dir = f.run,
                           .step_metrics = kiln_run_step_metrics,
                           .out_dir = mb,
                           .dtype = KILN_EXPORT_BF16,
                           .step = 5};
    CHECK("exports", kiln_export_model(&eo, NULL) == KILN_OK);
    json_t *rep = NULL;
    CHECK("fails", validate(f.model, f.data, NULL, mb, &rep) == KILN_ERR_VERIFY);
    CHECK("parity_f32_bf16 failed", !strcmp(status(rep, "parity_f32_bf16"), "failed") &&
                                        strstr(reason(rep, "parity_f32_bf16"), "outside"));
    CHECK("golden still passed", !strcmp(status(rep, "golden"), "passed"));
    json_decref(rep);
    /* An f32 model given as the bf16 export is refused by name. */
    CHECK("an f32 'export' fails",
          validate(f.model, f.data, NULL, f.model, &rep) == KILN_ERR_VERIFY &&
              strstr(reason(rep, "parity_f32_bf16"), "no bf16 weights"));
    json_decref(rep);
    free(mb);
out:
    fixture_free(&f);
}

/* ---- router near-ties (docs/validation.md "Router ties") ---------------------------- */

/* Experts 1 and 2 of a router [E,D] given one row: their logits are then equal everywhere. */
static bool tie_rows(float *v, size_t n, void *ctx) {
    size_t D = *(const size_t *)ctx;
    if (n < 3 * D) return false;
    memcpy(v + 2 * D, v + D, D * sizeof *v);
    return true;
}

static const json_t *ties_of(const json_t *rep, const char *check) {
    return json_object_get(
        json_object_get(json_object_get(json_object_get(rep, "checks"), check), "figures"),
        "router_ties");
}

static json_int_t ties_int(const json_t *rep, const char *check, const char *key) {
    return json_integer_value(json_object_get(ties_of(rep, check), key));
}

KILN_TEST(validate_router_ties) {
    fixture f = {0};
    if (!CHECK("fixture", fixture_make(&f, 20, 10))) goto out;
    char *p = kiln_test_path("tied"), *mp = join(p, "model.safetensors");
    size_t D = 16; /* make_run's d_model */
    CHECK("copies", copy_model(f.model, p));
    CHECK("ties experts 1 and 2 of the last block",
          edit_tensor_with(mp, "blocks.1.moe.router.weight", tie_rows, &D));
    kiln_golden_opts go = {
        .model = p, .data = f.data, .windows = 6, .seed = 3, .val_fraction = -1, .force = true};
    CHECK("its golden set", kiln_golden_make(&go) == KILN_OK);

    /* Every engine breaks the exact ties alike: all pass, the near-ties counted, nothing
     * excused. */
    json_t *rep = NULL;
    CHECK("passes", validate(p, f.data, NULL, NULL, &rep) == KILN_OK);
    json_int_t near = ties_int(rep, "parity_batch_stream", "rows_near_tie");
    double share = json_real_value(json_object_get(ties_of(rep, "parity_batch_stream"), "share"));
    CHECK("rows near a tie counted, more than ties.max_share of them", near > 0 && share > 0.01);
    CHECK("nothing excused", ties_int(rep, "parity_batch_stream", "outputs_excused") == 0 &&
                                 !json_object_get(json_object_get(json_object_get(rep, "checks"),
                                                                  "parity_batch_stream"),
                                                  "note"));
    CHECK("the trainer's parity and golden count them too",
          ties_int(rep, "parity_trainer_runtime", "rows_near_tie") == near &&
              ties_int(rep, "golden", "rows_near_tie") > 0);
    json_decref(rep);

    /* Streams that break them the other way: so many rows near a tie is a router that does
     * not choose, and no difference is excused. */
    kiln_rt_ties_high = true;
    CHECK("fails", validate(p, f.data, NULL, NULL, &rep) == KILN_ERR_VERIFY);
    CHECK("parity_batch_stream failed, saying why nothing was excused",
          !strcmp(status(rep, "parity_batch_stream"), "failed") &&
              strstr(reason(rep, "parity_batch_stream"), "more than ties.max_share"));
    CHECK("the checks without streams passed", !strcmp(status(rep, "golden"), "passed") &&
                                                   !strcmp(status(rep, "parity_trainer_runtime"),
                                                           "passed"));
    json_decref(rep);

    /* Allowed that many: the differences are excused, and the check says so. */
    kiln_thresholds th;
    kiln_thresholds_default(&th);
    CHECK("--set ties.max_share=1", kiln_thresholds_set(&th, "ties.max_share=1") == KILN_OK);
    kiln_validate_opts o = {.model = p, .data = f.data, .thresholds = &th, .val_fraction = -1};
    CHECK("passes", kiln_validate_run(&o, &rep) == KILN_OK);
    const char *note = json_string_value(json_object_get(
        json_object_get(json_object_get(rep, "checks"), "parity_batch_stream"), "note"));
    CHECK("outputs excused, with a note", ties_int(rep, "parity_batch_stream", "outputs_excused") >
                                                  0 &&
                                              note && strstr(note, "router near-tie"));
    json_decref(rep);
    kiln_rt_ties_high = false;
    free(mp);
    free(p);
out:
    fixture_free(&f);
}

KILN_TEST(validate_bad_inputs) {
    fixture f = {0};
    if (!CHECK("fixture", fixture_make(&f, 4, 2))) goto out;
    char *other = kiln_test_path("other.safetensors");
    kiln_synth_opts so = {.seed = 1, .rows = 300, .n_features = 4, .n_outputs = 1};
    CHECK("other data", kiln_synth_write(&so, other, NULL) == KILN_OK);
    json_t *rep = NULL;
    kiln_err rc = validate(f.model, other, NULL, NULL, &rep);
    CHECK("data that does not fit is an error, not a failed check",
          rc == KILN_ERR_CONFIG && !rep && strstr(kiln_errmsg(), "other.safetensors") &&
              strstr(kiln_errmsg(), "features"));
    rc = validate(f.data, f.data, NULL, NULL, &rep);
    CHECK("a dataset as the model", rc != KILN_OK && rc != KILN_ERR_VERIFY && !rep);
    char *vp = join(f.model, "validation.json");
    CHECK("no report written", !kiln_path_exists(vp));
    free(vp);
    free(other);
out:
    fixture_free(&f);
}

/* Write REF: golden's stored outputs (the runtime's own) with n_windows windows (0: all),
 * output 0 moved by delta, and kiln.inputs_sha256 = inputs_sha (NULL: none). */
static bool write_ref(const char *golden, const char *ref, int64_t n_windows, float delta,
                      const char *inputs_sha) {
    kiln_st *st = NULL;
    kiln_st_writer *w = NULL;
    float *y = NULL;
    const kiln_tensor *t;
    bool ok = kiln_st_open(golden, &st) == KILN_OK && (t = kiln_st_find(st, "outputs")) &&
              kiln_st_writer_new(&w) == KILN_OK;
    if (ok) {
        int64_t shape[3] = {n_windows ? n_windows : t->shape[0], t->shape[1], t->shape[2]};
        size_t n = (size_t)(shape[0] * shape[1] * shape[2]);
        ok = (y = malloc(n * sizeof *y)) != NULL && n <= t->numel;
        if (ok) memcpy(y, t->data, n * sizeof *y);
        if (ok) y[0] += delta;
        ok = ok && kiln_st_writer_add(w, "outputs", KILN_F32, 3, shape, y) == KILN_OK;
        if (ok && inputs_sha) ok = kiln_st_writer_meta(w, "kiln.inputs_sha256", inputs_sha) == 0;
        ok = ok && kiln_st_writer_write(w, ref) == KILN_OK;
    }
    free(y);
    kiln_st_writer_free(w);
    kiln_st_close(st);
    return ok;
}

/* parity_reference (kiln validate --reference): not run without a REF; passed against the
 * runtime's own outputs; failed (and the verdict with it) when one output is off, or when REF
 * says it was computed on other inputs; a REF of another shape is an error naming it. */
KILN_TEST(validate_reference) {
    fixture f = {0};
    if (!CHECK("fixture", fixture_make(&f, 20, 10))) goto out;
    char *g = join(f.model, "golden/golden.safetensors"), *ref = kiln_test_path("ref.st");
    char *rp = kiln_test_path("v.json");
    json_t *rep = NULL;
    kiln_validate_opts o = {
        .model = f.model, .data = f.data, .val_fraction = -1, .report = rp, .reference = NULL};
    CHECK("no reference: passes", kiln_validate_run(&o, &rep) == KILN_OK);
    CHECK("not run", !strcmp(status(rep, "parity_reference"), "not run") &&
                         strstr(reason(rep, "parity_reference"), "--reference"));
    json_decref(rep);
    rep = NULL;

    o.reference = ref;
    CHECK("ref", write_ref(g, ref, 0, 0, NULL));
    CHECK("the runtime's own outputs pass", kiln_validate_run(&o, &rep) == KILN_OK);
    CHECK("passed", !strcmp(status(rep, "parity_reference"), "passed"));
    const json_t *fig =
        json_object_get(json_object_get(json_object_get(rep, "checks"), "parity_reference"),
                        "figures");
    CHECK("figures: windows 6, 0 error, router ties counted",
          json_integer_value(json_object_get(fig, "windows")) == 6 &&
              json_real_value(json_object_get(fig, "max_rel_err")) == 0 &&
              json_object_get(fig, "router_ties") &&
              json_is_false(json_object_get(fig, "inputs_digest_checked")));
    json_decref(rep);
    rep = NULL;

    CHECK("ref off by 1e-2", write_ref(g, ref, 0, 1e-2f, NULL));
    CHECK("one output off fails the run", kiln_validate_run(&o, &rep) == KILN_ERR_VERIFY &&
                                              strstr(kiln_errmsg(), "parity_reference"));
    CHECK("failed, verdict failed", !strcmp(status(rep, "parity_reference"), "failed") &&
                                        json_is_false(json_object_get(rep, "passed")) &&
                                        strstr(reason(rep, "parity_reference"), "window 0"));
    json_decref(rep);
    rep = NULL;

    CHECK("ref of other inputs", write_ref(g, ref, 0, 0, "00ff"));
    CHECK("other inputs fail", kiln_validate_run(&o, &rep) == KILN_ERR_VERIFY);
    CHECK("named", strstr(reason(rep, "parity_reference"), "other inputs"));
    json_decref(rep);
    rep = NULL;

    CHECK("ref of 2 windows", write_ref(g, ref, 2, 0, NULL));
    kiln_err rc = kiln_validate_run(&o, &rep);
    CHECK("another shape is an error naming REF", rc != KILN_OK && rc != KILN_ERR_VERIFY &&
                                                      !rep && strstr(kiln_errmsg(), "ref.st"));
    o.reference = g; /* golden.safetensors has "outputs" [N,S,O]: a valid REF */
    CHECK("golden itself passes", kiln_validate_run(&o, &rep) == KILN_OK);
    json_decref(rep);
    free(g);
    free(ref);
    free(rp);
out:
    fixture_free(&f);
}

/* A card whose config is not the model file's (issue 16): validation would vouch for a model
 * that the card misdescribes. Refused, naming the card, the key and both values, with no
 * report written; a card without a config is refused too; the card as exported passes. */
KILN_TEST(validate_card_config_must_match_model) {
    fixture f = {0};
    json_t *card = NULL, *orig = NULL, *rep = NULL;
    char *cp = NULL, *vp = NULL;
    if (!CHECK("fixture", fixture_make(&f, 4, 2))) goto out;
    cp = join(f.model, "card.json");
    vp = join(f.model, "validation.json");
    if (!CHECK("card", kiln_json_load_file(cp, &card) == KILN_OK)) goto out;
    orig = json_deep_copy(json_object_get(card, "config"));
    json_t *cfg = json_object_get(card, "config");
    json_int_t d = json_integer_value(json_object_get(cfg, "d_model"));
    json_object_set_new(cfg, "d_model", json_integer(2 * d));
    CHECK("write", kiln_json_write_file(cp, card) == KILN_OK);
    kiln_err rc = validate(f.model, f.data, NULL, NULL, &rep);
    CHECK("a card with another d_model is refused, naming the key",
          rc == KILN_ERR_FORMAT && !rep && strstr(kiln_errmsg(), "card.json") &&
              strstr(kiln_errmsg(), "'d_model'") && strstr(kiln_errmsg(), "model.safetensors"));
    json_object_set_new(cfg, "d_model", json_integer(d));
    json_object_set_new(cfg, "norm_eps", json_real(1e-3));
    CHECK("write", kiln_json_write_file(cp, card) == KILN_OK);
    CHECK("another norm_eps is refused",
          validate(f.model, f.data, NULL, NULL, &rep) == KILN_ERR_FORMAT && !rep &&
              strstr(kiln_errmsg(), "'norm_eps'"));
    json_object_del(card, "config");
    CHECK("write", kiln_json_write_file(cp, card) == KILN_OK);
    CHECK("a card without a config is refused",
          validate(f.model, f.data, NULL, NULL, &rep) == KILN_ERR_FORMAT && !rep &&
              strstr(kiln_errmsg(), "\"config\""));
    CHECK("no report written", !kiln_path_exists(vp));
    json_object_set(card, "config", orig);
    CHECK("write", kiln_json_write_file(cp, card) == KILN_OK);
    CHECK("the card as exported passes", validate(f.model, f.data, NULL, NULL, &rep) == KILN_OK);
out:
    json_decref(card);
    json_decref(orig);
    json_decref(rep);
    free(cp), free(vp);
    fixture_free(&f);
}

/* kiln golden make writes its two files under temporary names and renames them into place
 * once both are whole: a failure leaves the set that was there as it was (here golden.json
 * cannot be replaced, a directory stands in its way) and no temporary. Before, the new
 * golden.safetensors was already in place beside the old golden.json. */
KILN_TEST(validate_golden_make_failure_keeps_the_old_set) {
    fixture f = {0};
    char *g = NULL, *gst = NULL, *gj = NULL, *sub = NULL, *before = NULL, *after = NULL;
    size_t lb = 0, la = 0;
    if (!CHECK("fixture", fixture_make(&f, 4, 2))) goto out;
    g = join(f.model, "golden");
    gst = join(g, "golden.safetensors");
    gj = join(g, "golden.json");
    sub = join(gj, "x");
    if (!CHECK("old set", kiln_read_file(gst, 1 << 24, &before, &lb) == KILN_OK)) goto out;
    CHECK("golden.json made a directory",
          unlink(gj) == 0 && kiln_mkdir_p(sub) == KILN_OK);
    kiln_golden_opts go = {.model = f.model, .data = f.data, .windows = 6, .seed = 4,
                           .val_fraction = -1, .force = true};
    CHECK("golden make fails", kiln_golden_make(&go) != KILN_OK && strstr(kiln_errmsg(), gj));
    CHECK("golden.safetensors is the old one",
          kiln_read_file(gst, 1 << 24, &after, &la) == KILN_OK && la == lb &&
              !memcmp(before, after, lb));
    char *t1 = join(g, ".golden.safetensors.new"), *t2 = join(g, ".golden.json.new");
    CHECK("no temporaries", !kiln_path_exists(t1) && !kiln_path_exists(t2));
    free(t1), free(t2);
out:
    free(g), free(gst), free(gj), free(sub), free(before), free(after);
    fixture_free(&f);
}

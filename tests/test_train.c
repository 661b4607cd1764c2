/* test_train.c - the trainer's parts: config, schedule, optimizer, sampler, checkpoints, and
 * the loop. (Its metrics log and reading runs back are runs/'s: tests/test_runs_*.c.) */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "export.h"
#include "kiln.h"
#include "test.h"
#include "testutil.h"
#include "train_int.h"

static const kiln_model_config tiny = {.n_features = 2,
                                       .n_outputs = 1,
                                       .d_model = 4,
                                       .n_layers = 1,
                                       .n_heads = 1,
                                       .d_ff = 4,
                                       .n_experts = 2,
                                       .top_k = 1,
                                       .seq_len = 4,
                                       .attn_window = 4,
                                       .norm_eps = 1e-5f};

static bool has(const char *s) {
    return strstr(kiln_errmsg(), s) != NULL;
}

KILN_TEST(train_config_unknown_key) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    json_t *j;
    const char *text = "{\"lr\": 0.01, \"learning_rate\": 0.1}";
    if (!CHECK("parse", kiln_json_parse(text, strlen(text), "t", &j) == KILN_OK)) return;
    CHECK("unknown key refused", kiln_train_config_apply(&c, j, "'cfg.json'") == KILN_ERR_CONFIG);
    CHECK("message names the file and the key", has("'cfg.json'") && has("'learning_rate'"));
    json_decref(j);
    text = "{\"batch_size\": 2.5}";
    if (!CHECK("parse", kiln_json_parse(text, strlen(text), "t", &j) == KILN_OK)) return;
    CHECK("wrong type refused", kiln_train_config_apply(&c, j, "'cfg.json'") == KILN_ERR_CONFIG &&
                                    has("'batch_size'") && has("integer"));
    json_decref(j);
    text = "{\"beta2\": 1}";
    if (!CHECK("parse", kiln_json_parse(text, strlen(text), "t", &j) == KILN_OK)) return;
    CHECK("out of range refused",
          kiln_train_config_apply(&c, j, "'cfg.json'") == KILN_ERR_CONFIG && has("'beta2'"));
    json_decref(j);
    text = "{\"format\": \"other\"}";
    if (!CHECK("parse", kiln_json_parse(text, strlen(text), "t", &j) == KILN_OK)) return;
    CHECK("wrong format refused",
          kiln_train_config_apply(&c, j, "'cfg.json'") == KILN_ERR_CONFIG && has("format"));
    json_decref(j);
}

KILN_TEST(train_config_set) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    CHECK("lr", kiln_train_config_set(&c, "lr=0.001") == KILN_OK && c.lr == 0.001);
    CHECK("optimizer bare word",
          kiln_train_config_set(&c, "optimizer=sgd") == KILN_OK && c.optimizer == KILN_OPTIM_SGD);
    CHECK("optimizer quoted", kiln_train_config_set(&c, "optimizer=\"adamw\"") == KILN_OK &&
                                  c.optimizer == KILN_OPTIM_ADAMW);
    CHECK("bool", kiln_train_config_set(&c, "skip_spikes=true") == KILN_OK && c.skip_spikes);
    CHECK("int", kiln_train_config_set(&c, "steps=42") == KILN_OK && c.steps == 42);
    CHECK("integer for a real",
          kiln_train_config_set(&c, "grad_clip=2") == KILN_OK && c.grad_clip == 2.0);
    CHECK("seed", kiln_train_config_set(&c, "seed=18446744073709551") == KILN_OK &&
                      c.seed == 18446744073709551ull);
    CHECK("model key", kiln_train_config_set(&c, "d_model=48") == KILN_OK && c.model.d_model == 48);
    CHECK("unknown key named",
          kiln_train_config_set(&c, "nope=1") == KILN_ERR_CONFIG && has("'nope'"));
    CHECK("real for an int refused",
          kiln_train_config_set(&c, "steps=1.5") == KILN_ERR_CONFIG && has("'steps'"));
    CHECK("word for a number refused",
          kiln_train_config_set(&c, "lr=fast") == KILN_ERR_CONFIG && has("'lr'"));
    CHECK("bad optimizer",
          kiln_train_config_set(&c, "optimizer=adam") == KILN_ERR_CONFIG && has("'optimizer'"));
    CHECK("no '='", kiln_train_config_set(&c, "lr") == KILN_ERR_USAGE);
    CHECK("negative lr", kiln_train_config_set(&c, "lr=-1") == KILN_ERR_CONFIG);
    kiln_train_config_default(&c);
    CHECK("min_lr above lr", kiln_train_config_set(&c, "min_lr=1") == KILN_OK &&
                                 kiln_train_config_check(&c, "cfg") == KILN_ERR_CONFIG &&
                                 has("'min_lr'"));
    kiln_train_config_default(&c);
    CHECK("model constraint", kiln_train_config_set(&c, "n_heads=5") == KILN_OK &&
                                  kiln_train_config_check(&c, "cfg") == KILN_ERR_CONFIG &&
                                  has("n_heads"));
    CHECK("resumable keys",
          kiln_train_config_resumable("steps") && kiln_train_config_resumable("threads") &&
              !kiln_train_config_resumable("lr") && !kiln_train_config_resumable("seed") &&
              !kiln_train_config_resumable("d_model") && !kiln_train_config_resumable("bogus"));
}

KILN_TEST(train_config_defaults_round_trip) {
    kiln_train_config c, back;
    kiln_train_config_default(&c);
    CHECK("defaults pass the checks", kiln_train_config_check(&c, "defaults") == KILN_OK);
    char *text = kiln_train_config_text(&c, true);
    if (!CHECK("text", text)) return;
    CHECK("short numbers", strstr(text, "\"lr\": 0.003,") && strstr(text, "\"norm_eps\": 1e-5"));
    CHECK("dataset shapes left out", !strstr(text, "n_features") && !strstr(text, "n_outputs"));
    json_t *j;
    kiln_train_config_default(&back);
    back.lr = 99;
    back.model.d_model = 7;
    CHECK("parses back", kiln_json_parse(text, strlen(text), "t", &j) == KILN_OK &&
                             kiln_train_config_apply(&back, j, "t") == KILN_OK);
    char *again = kiln_train_config_text(&back, true);
    CHECK("same config", again && !strcmp(text, again) && back.lr == c.lr &&
                             back.model.d_model == c.model.d_model);
    json_decref(j);
    free(text);
    free(again);
    /* An awkward real survives exactly. */
    CHECK("set", kiln_train_config_set(&c, "lr=0.1234567890123456789") == KILN_OK);
    text = kiln_train_config_text(&c, false);
    kiln_train_config_default(&back);
    CHECK("exact", text && kiln_json_parse(text, strlen(text), "t", &j) == KILN_OK &&
                       kiln_train_config_apply(&back, j, "t") == KILN_OK && back.lr == c.lr);
    json_decref(j);
    free(text);
}

KILN_TEST(train_schedule) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.steps = 101;
    c.warmup_steps = 10;
    c.lr = 1.0;
    c.min_lr = 0.1;
    CHECK("warm-up starts at lr/warmup", fabs(kiln_train_lr(&c, 0) - 0.1) < 1e-15);
    CHECK("warm-up is linear", fabs(kiln_train_lr(&c, 4) - 0.5) < 1e-15);
    CHECK("peak at the end of warm-up",
          kiln_train_lr(&c, 9) == 1.0 && kiln_train_lr(&c, 10) == 1.0);
    CHECK("cosine midpoint", fabs(kiln_train_lr(&c, 55) - 0.55) < 1e-12);
    CHECK("ends at min_lr", fabs(kiln_train_lr(&c, 100) - 0.1) < 1e-15);
    bool down = true;
    for (long i = 11; i < 101; i++)
        down &= kiln_train_lr(&c, i) < kiln_train_lr(&c, i - 1);
    CHECK("decays monotonically", down);
    c.warmup_steps = 0;
    CHECK("no warm-up starts at lr", kiln_train_lr(&c, 0) == 1.0);
}

static void table(kiln_param **tab, size_t *n, size_t *numel) {
    if (kiln_param_table(&tiny, tab, n, numel) != KILN_OK) *tab = NULL;
}

KILN_TEST(train_adamw_step) {
    kiln_param *tab;
    size_t n, numel;
    table(&tab, &n, &numel);
    if (!CHECK("table", tab)) return;
    float *p = calloc(numel, 4), *g = calloc(numel, 4), *m = calloc(numel, 4),
          *v = calloc(numel, 4);
    for (size_t k = 0; k < numel; k++) {
        p[k] = 1.0f;
        g[k] = 0.5f;
    }
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.beta1 = 0.9;
    c.beta2 = 0.999;
    c.adam_eps = 1e-8;
    c.weight_decay = 0.1;
    double *un = calloc(n, sizeof *un), *wn = calloc(n, sizeof *wn);
    kiln_train_optim_step(&c, tab, n, p, g, m, v, 1, 0.1, un, wn);
    long we = kiln_param_find(tab, n, "embed.weight"), be = kiln_param_find(tab, n, "embed.bias"),
         gn = kiln_param_find(tab, n, "final_norm.weight"),
         mu = kiln_param_find(tab, n, "norm.in_mean"),
         rw = kiln_param_find(tab, n, "blocks.0.moe.router.weight");
    /* Step 1: mhat = g, vhat = g^2, so the Adam step is lr * g/|g| = 0.1; decay 0.1*0.1*1. */
    float pw = p[tab[we].offset], pb = p[tab[be].offset];
    CHECK("matrix: decay and step", fabsf(pw - 0.89f) < 1e-6f);
    CHECK("router decays too", fabsf(p[tab[rw].offset] - 0.89f) < 1e-6f);
    CHECK("bias: no decay", fabsf(pb - 0.9f) < 1e-6f);
    CHECK("norm gain: no decay", fabsf(p[tab[gn].offset] - 0.9f) < 1e-6f);
    CHECK("norm.in_mean untouched",
          p[tab[mu].offset] == 1.0f && m[tab[mu].offset] == 0 && v[tab[mu].offset] == 0);
    CHECK("moments",
          fabsf(m[tab[we].offset] - 0.05f) < 1e-7f && fabsf(v[tab[we].offset] - 0.00025f) < 1e-9f);
    CHECK("update norm reported",
          fabs(un[be] - 0.1 * sqrt((double)tab[be].numel)) < 1e-5 && un[mu] == 0);
    CHECK("weight norm reported", fabs(wn[be] - 0.9 * sqrt((double)tab[be].numel)) < 1e-5);
    /* Step 2 with g = -0.25, by the textbook formulas in double. */
    for (size_t k = 0; k < numel; k++)
        g[k] = -0.25f;
    kiln_train_optim_step(&c, tab, n, p, g, m, v, 2, 0.05, NULL, NULL);
    double m2 = 0.9 * 0.05 + 0.1 * -0.25, v2 = 0.999 * 0.00025 + 0.001 * 0.0625;
    double mh = m2 / (1 - 0.81), vh = v2 / (1 - 0.998001);
    double want_w = 0.89 - 0.05 * 0.1 * 0.89 - 0.05 * mh / (sqrt(vh) + 1e-8);
    double want_b = 0.9 - 0.05 * mh / (sqrt(vh) + 1e-8);
    CHECK("second step, matrix", fabs(p[tab[we].offset] - want_w) < 2e-6);
    CHECK("second step, bias", fabs(p[tab[be].offset] - want_b) < 2e-6);
    /* SGD: p - lr*wd*p - lr*g. */
    c.optimizer = KILN_OPTIM_SGD;
    for (size_t k = 0; k < numel; k++) {
        p[k] = 1.0f;
        g[k] = 0.5f;
    }
    kiln_train_optim_step(&c, tab, n, p, g, NULL, NULL, 1, 0.1, NULL, NULL);
    CHECK("sgd matrix", fabsf(p[tab[we].offset] - (1.0f - 0.01f - 0.05f)) < 1e-6f);
    CHECK("sgd bias", fabsf(p[tab[be].offset] - 0.95f) < 1e-6f);
    CHECK("sgd leaves norm.in_* alone", p[tab[mu].offset] == 1.0f);
    free(p), free(g), free(m), free(v), free(un), free(wn), free(tab);
}

KILN_TEST(train_grad_norm_and_clip) {
    kiln_param *tab;
    size_t n, numel;
    table(&tab, &n, &numel);
    if (!CHECK("table", tab)) return;
    float *g = calloc(numel, 4);
    for (size_t k = 0; k < numel; k++)
        g[k] = 2.0f;
    size_t trained = 0;
    for (size_t i = 0; i < n; i++)
        if (tab[i].flags & KILN_PARAM_TRAINED) trained += tab[i].numel;
    double *per = calloc(n, sizeof *per);
    double norm = kiln_train_grad_norm(tab, n, g, per);
    CHECK("norm counts trained params only", fabs(norm - 2.0 * sqrt((double)trained)) < 1e-9);
    CHECK("per tensor", per[0] == 0 && fabs(per[2] - 2.0 * sqrt((double)tab[2].numel)) < 1e-9);
    kiln_train_grad_scale(tab, n, g, 0.5f);
    CHECK("scaled", fabs(kiln_train_grad_norm(tab, n, g, NULL) - norm / 2) < 1e-9 && g[0] == 2.0f);
    free(g), free(per), free(tab);
}

KILN_TEST(train_sampler) {
    const size_t train_end = 1000;
    const int S = 32;
    bool inside = true, same = true;
    size_t hist[4] = {0};
    for (long i = 0; i < 200; i++)
        for (int s = 0; s < 16; s++) {
            size_t a = kiln_train_window(7, i, 16, s, train_end, S),
                   b = kiln_train_window(7, i, 16, s, train_end, S);
            same &= a == b;
            inside &= a + S <= train_end;
            hist[a * 4 / (train_end - S + 1)]++;
        }
    CHECK("a pure function of (seed, step, slot)", same);
    CHECK("windows stay in the training split", inside);
    CHECK("spread over the split",
          hist[0] > 600 && hist[1] > 600 && hist[2] > 600 && hist[3] > 600);
    CHECK("the step moves the data", kiln_train_window(7, 5, 16, 0, train_end, S) !=
                                             kiln_train_window(7, 6, 16, 0, train_end, S) ||
                                         kiln_train_window(7, 5, 16, 1, train_end, S) !=
                                             kiln_train_window(7, 6, 16, 1, train_end, S));
    CHECK("the seed moves the data", kiln_train_window(7, 5, 16, 0, train_end, S) !=
                                             kiln_train_window(8, 5, 16, 0, train_end, S) ||
                                         kiln_train_window(7, 5, 16, 1, train_end, S) !=
                                             kiln_train_window(8, 5, 16, 1, train_end, S));
    /* Counter = step*slots + slot: slot 16 of step 0 is slot 0 of step 1. */
    CHECK("counter layout", kiln_train_window(7, 1, 16, 0, train_end, S) ==
                                kiln_train_window(7, 0, 16, 16, train_end, S));
    CHECK("one start only", kiln_train_window(7, 3, 4, 1, S, S) == 0);

    kiln_split sp = {.train_end = 800, .val_begin = 832, .val_end = 1000};
    size_t starts[16];
    size_t nv = kiln_train_val_windows(&sp, S, 16, starts);
    CHECK("as many windows as fit", nv == 5);
    bool ok = true;
    for (size_t k = 0; k < nv; k++) {
        ok &= starts[k] >= sp.val_begin && starts[k] + S <= sp.val_end;
        if (k) ok &= starts[k] >= starts[k - 1] + S;
    }
    CHECK("inside the validation split, not overlapping", ok);
    CHECK("capped", kiln_train_val_windows(&sp, S, 3, starts) == 3 && starts[2] + S <= sp.val_end);
    kiln_split none = {.train_end = 1000, .val_begin = 1000, .val_end = 1000};
    CHECK("no validation split", kiln_train_val_windows(&none, S, 16, starts) == 0);

    float feats[10 * 2], targ[10];
    for (int r = 0; r < 10; r++) {
        feats[2 * r] = (float)r;
        feats[2 * r + 1] = (float)-r;
        targ[r] = (float)(100 + r);
    }
    kiln_dataset ds = {
        .rows = 10, .n_features = 2, .n_outputs = 1, .features = feats, .targets = targ};
    size_t st[2] = {3, 6};
    float x[2 * 3 * 2], y[2 * 3];
    kiln_train_gather(&ds, st, 2, 3, x, y);
    CHECK("gather",
          x[0] == 3 && x[1] == -3 && x[5] == -5 && x[6] == 6 && y[0] == 103 && y[5] == 108);
}

KILN_TEST(train_spike_detector) {
    kiln_spike s = {0};
    CHECK("quiet while empty", kiln_spike_z(&s, 1e9) == 0);
    for (int i = 0; i < 100; i++)
        kiln_spike_push(&s, 1.0 + 0.01 * (i % 5));
    CHECK("window full", s.n == KILN_SPIKE_WINDOW);
    CHECK("ordinary value", fabs(kiln_spike_z(&s, 1.02)) < 2);
    CHECK("spike", kiln_spike_z(&s, 2.0) > KILN_SPIKE_Z);
    json_t *j = kiln_spike_json(&s);
    kiln_spike back;
    CHECK("round trip", j && kiln_spike_from_json(j, "t", &back) == KILN_OK && back.n == s.n &&
                            back.pos == s.pos && memcmp(back.x, s.x, sizeof s.x) == 0);
    json_decref(j);
    j = json_pack("{s:i,s:[]}", "pos", 99, "x");
    CHECK("bad state refused",
          kiln_spike_from_json(j, "ck", &back) == KILN_ERR_FORMAT && has("'ck'"));
    json_decref(j);
}

/* A checkpoint of the tiny model with recognisable values. */
static char *write_ckpt(const char *dir_name, long step, float **params_out, kiln_param **tab_out,
                        size_t *n_out, size_t *numel_out) {
    kiln_param *tab;
    size_t n, numel;
    table(&tab, &n, &numel);
    if (!tab) return NULL;
    float *p = calloc(3 * numel, 4);
    for (size_t k = 0; k < 3 * numel; k++)
        p[k] = (float)k * 0.001f - 0.5f;
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.model = tiny;
    kiln_train_state st = {.step = step, .updates = step - 1, .bad_streak = 1};
    for (int i = 0; i < 20; i++)
        kiln_spike_push(&st.loss_spike, 1.0 / (i + 3));
    kiln_spike_push(&st.gnorm_spike, 0.1);
    kiln_ckpt_meta meta = {
        &c,  "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "run-x", &st, NULL,
        NULL};
    char *dir = kiln_test_path(dir_name);
    char *ckdir = kiln_path_join(dir, "ckpt");
    kiln_mkdir_p(ckdir);
    char *path = kiln_run_ckpt_path(dir, step);
    kiln_err rc = kiln_ckpt_write(path, tab, n, p, p + numel, p + 2 * numel, &meta);
    free(dir);
    free(ckdir);
    if (rc) {
        free(path);
        path = NULL;
    }
    *params_out = p;
    *tab_out = tab;
    *n_out = n;
    *numel_out = numel;
    return path;
}

KILN_TEST(train_ckpt_round_trip) {
    float *p;
    kiln_param *tab;
    size_t n, numel;
    char *path = write_ckpt("run", 7, &p, &tab, &n, &numel);
    if (!CHECK("write", path)) {
        free(p), free(tab);
        return;
    }
    CHECK("named by step", strstr(path, "/ckpt/step-00000007.safetensors") != NULL);
    kiln_ckpt ck;
    if (CHECK("open verifies", kiln_ckpt_open(path, &ck) == KILN_OK)) {
        CHECK("no kiln.target_norm (an older checkpoint): mean 0, std 1",
              !ck.has_target_norm && ck.target_mean[0] == 0 && ck.target_std[0] == 1);
        float *q = calloc(3 * numel, 4);
        CHECK("load", kiln_ckpt_load(&ck, tab, n, q, q + numel, q + 2 * numel) == KILN_OK);
        /* Moments exist for trained params only: compare those, and every parameter. */
        bool same = memcmp(q, p, numel * 4) == 0;
        for (size_t i = 0; i < n; i++)
            if (tab[i].flags & KILN_PARAM_TRAINED)
                same &= !memcmp(q + numel + tab[i].offset, p + numel + tab[i].offset,
                                tab[i].numel * 4) &&
                        !memcmp(q + 2 * numel + tab[i].offset, p + 2 * numel + tab[i].offset,
                                tab[i].numel * 4);
        CHECK("tensors come back bit for bit", same);
        CHECK("state", ck.state.step == 7 && ck.state.updates == 6 && ck.state.bad_streak == 1 &&
                           ck.state.loss_spike.n == 20 && ck.state.loss_spike.x[3] == 1.0 / 6 &&
                           ck.state.gnorm_spike.n == 1);
        CHECK("config",
              ck.cfg.model.d_model == 4 && ck.cfg.lr == 3e-3 && !strcmp(ck.run_id, "run-x"));
        CHECK("model names and metadata",
              kiln_st_find(ck.st, "blocks.0.moe.fc.weight") &&
                  kiln_st_find(ck.st, "m.head.weight") && kiln_st_find(ck.st, "v.embed.bias") &&
                  !kiln_st_find(ck.st, "m.norm.in_std") && kiln_st_meta(ck.st, "kiln.config") &&
                  kiln_st_meta(ck.st, "kiln.version"));
        kiln_model_config mc;
        CHECK("kiln.config is the model's",
              kiln_model_config_from_st(ck.st, &mc) == KILN_OK && mc.d_ff == 4);
        free(q);
    }
    kiln_ckpt_release(&ck);
    /* Two writes of the same state are the same bytes. */
    char *again = kiln_test_path("again.safetensors");
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.model = tiny;
    kiln_train_state st = {.step = 1};
    kiln_ckpt_meta meta = {&c,   "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                           "r",  &st,
                           NULL, NULL};
    char *a2 = kiln_test_path("again2.safetensors");
    char *b1 = NULL, *b2 = NULL;
    size_t l1 = 0, l2 = 0;
    CHECK("deterministic bytes", kiln_ckpt_write(again, tab, n, p, NULL, NULL, &meta) == KILN_OK &&
                                     kiln_ckpt_write(a2, tab, n, p, NULL, NULL, &meta) == KILN_OK &&
                                     kiln_read_file(again, 1 << 24, &b1, &l1) == KILN_OK &&
                                     kiln_read_file(a2, 1 << 24, &b2, &l2) == KILN_OK && l1 == l2 &&
                                     !memcmp(b1, b2, l1));
    free(b1), free(b2), free(again), free(a2), free(path), free(p), free(tab);
}

KILN_TEST(train_ckpt_corrupt_refused) {
    float *p;
    kiln_param *tab;
    size_t n, numel;
    char *path = write_ckpt("run", 3, &p, &tab, &n, &numel);
    if (!CHECK("write", path)) {
        free(p), free(tab);
        return;
    }
    char *buf;
    size_t len;
    if (!CHECK("read", kiln_read_file(path, 1 << 24, &buf, &len) == KILN_OK)) return;
    buf[len - 5] ^= 0x01; /* one bit of the last tensor */
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, len, f);
    fclose(f);
    kiln_ckpt ck;
    CHECK("flipped bit detected",
          kiln_ckpt_open(path, &ck) == KILN_ERR_VERIFY && has(path) && has("digest"));
    kiln_ckpt_release(&ck);
    f = fopen(path, "wb");
    fwrite(buf, 1, len / 2, f);
    fclose(f);
    CHECK("torn file refused", kiln_ckpt_open(path, &ck) != KILN_OK && has(path));
    kiln_ckpt_release(&ck);
    free(buf), free(path), free(p), free(tab);
}

KILN_TEST(train_ckpt_list_and_prune) {
    float *p;
    kiln_param *tab;
    size_t n, numel;
    long want[] = {40, 10, 30, 20};
    for (int i = 0; i < 4; i++) {
        char *path = write_ckpt("run", want[i], &p, &tab, &n, &numel);
        CHECK("write", path);
        free(path), free(p), free(tab);
    }
    char *dir = kiln_test_path("run");
    char *stray = kiln_path_join(dir, "ckpt/.step-00000050.safetensors.tmp-abc123");
    FILE *f = fopen(stray, "w");
    if (f) fclose(f);
    long *steps;
    size_t k;
    CHECK("list", kiln_run_ckpt_list(dir, &steps, &k) == KILN_OK && k == 4 && steps[0] == 10 &&
                      steps[3] == 40);
    free(steps);
    CHECK("prune, keeping step 10 too (the best)", kiln_ckpt_prune(dir, 2, 10) == KILN_OK);
    CHECK("newest and the best kept", kiln_run_ckpt_list(dir, &steps, &k) == KILN_OK && k == 3 &&
                                          steps[0] == 10 && steps[1] == 30 && steps[2] == 40);
    free(steps);
    CHECK("prune", kiln_ckpt_prune(dir, 2, -1) == KILN_OK);
    CHECK("newest kept", kiln_run_ckpt_list(dir, &steps, &k) == KILN_OK && k == 2 &&
                             steps[0] == 30 && steps[1] == 40);
    free(steps);
    char *none = kiln_test_path("nothing");
    CHECK("no ckpt dir is no checkpoints",
          kiln_run_ckpt_list(none, &steps, &k) == KILN_OK && k == 0 && !steps);
    free(none), free(stray), free(dir);
}

/* ---- the loop, on a very small model and synthetic data ---- */

static void small_config(kiln_train_config *c) {
    kiln_test_tiny_run(c, 8);
    c->batch_size = 4;
    c->ckpt_every = 2;
}

static char *synth(const char *name, uint64_t seed) {
    return kiln_test_synth(name, seed, 400);
}

static bool file_bytes(const char *path, char **buf, size_t *len) {
    return kiln_read_file(path, 1 << 26, buf, len) == KILN_OK;
}

static bool has_event(const char *dir, const char *kind) {
    kiln_run_info ri;
    if (kiln_run_info_load(dir, 100, &ri) != KILN_OK) return false;
    bool found = false;
    for (size_t i = 0; i < ri.n_events; i++)
        found |= !strcmp(ri.events[i].kind, kind);
    kiln_run_info_release(&ri);
    return found;
}

KILN_TEST(train_run_refusals) {
    kiln_log_set_level(KILN_LOG_ERROR);
    char *data = synth("d.safetensors", 1), *other = synth("e.safetensors", 2),
         *dir = kiln_test_path("run");
    if (!CHECK("data", data && other)) goto out;
    kiln_train_config c;
    small_config(&c);
    kiln_train_opts o = {.run_dir = dir, .data_path = data};
    c.model.n_features = 5;
    CHECK("feature count checked",
          kiln_train_start(&c, &o) == KILN_ERR_CONFIG && has("'n_features'") && has(data));
    CHECK("nothing written", !kiln_path_exists(dir));
    c.model.n_features = 0;
    if (!CHECK("train", kiln_train_start(&c, &o) == KILN_OK)) goto out;
    CHECK("second start refused", kiln_train_start(&c, &o) == KILN_ERR_CONFLICT && has("--resume"));
    kiln_train_opts r = {.run_dir = dir, .data_path = other};
    CHECK("other dataset refused",
          kiln_train_resume(&r) == KILN_ERR_CONFLICT && has("sha256") && has(other));
    const char *sets[] = {"steps=8", "lr=0.01"};
    kiln_train_opts r2 = {.run_dir = dir, .sets = sets, .n_sets = 2};
    CHECK("changed lr refused", kiln_train_resume(&r2) == KILN_ERR_CONFIG && has("'lr'"));
    char *lockp = kiln_path_join(dir, ".lock");
    int lfd = open(lockp, O_RDWR);
    CHECK("a run in use is refused", lfd >= 0 && flock(lfd, LOCK_EX) == 0 &&
                                         kiln_train_resume(&r) == KILN_ERR_CONFLICT &&
                                         has("another kiln process"));
    if (lfd >= 0) close(lfd);
    free(lockp);
    kiln_train_opts r3 = {.run_dir = dir, .sets = sets, .n_sets = 1};
    CHECK("longer run resumes", kiln_train_resume(&r3) == KILN_OK);
    char *p8 = kiln_run_ckpt_path(dir, 8);
    CHECK("reached step 8", kiln_path_exists(p8));
    free(p8);
    /* A dataset with NaN is refused before a run directory appears. */
    float f[3 * 1] = {1, NAN, 2}, y[3] = {0, 0, 0};
    kiln_st_writer *w;
    char *bad = kiln_test_path("nan.safetensors"), *dir2 = kiln_test_path("run2");
    if (kiln_st_writer_new(&w) == KILN_OK) {
        kiln_st_writer_add(w, "features", KILN_F32, 2, (int64_t[]){3, 1}, f);
        kiln_st_writer_add(w, "targets", KILN_F32, 2, (int64_t[]){3, 1}, y);
        kiln_st_writer_write(w, bad);
        kiln_st_writer_free(w);
    }
    kiln_train_opts o2 = {.run_dir = dir2, .data_path = bad};
    small_config(&c);
    CHECK("NaN data refused",
          kiln_train_start(&c, &o2) != KILN_OK && has("NaN") && !kiln_path_exists(dir2));
    free(bad), free(dir2);
out:
    kiln_log_set_level(KILN_LOG_INFO);
    free(data), free(other), free(dir);
}

/* A start SIGKILLed after creating ckpt/ but before its run.json was renamed into place
 * (found by the trainer soak, tests/soak/trainer.sh) left a directory that neither --resume
 * (no run.json) nor a new start (it saw ckpt/) would take. A new start takes it now, sweeps
 * the temporary and ends with the bytes of a clean start; checkpoints without a run.json are
 * still refused. */
KILN_TEST(train_run_killed_start_restarts) {
    kiln_log_set_level(KILN_LOG_ERROR);
    char *data = synth("d.safetensors", 1), *dir = kiln_test_path("run"),
         *clean = kiln_test_path("clean");
    char *ck = kiln_path_join(dir, "ckpt"), *tmp = kiln_path_join(dir, ".run.json.tmp-Ab12Cd"),
         *lock = kiln_path_join(dir, ".lock"), *rj = kiln_path_join(dir, "run.json");
    char *last = NULL, *last_clean = NULL, *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    kiln_train_config c;
    small_config(&c);
    kiln_train_opts o = {.run_dir = dir, .data_path = data},
                    oc = {.run_dir = clean, .data_path = data};
    if (!CHECK("set up", data && ck && tmp && lock && rj && kiln_mkdir_p(ck) == KILN_OK &&
                             kiln_write_file_atomic(tmp, "{\"form", 6) == KILN_OK &&
                             kiln_write_file_atomic(lock, "", 0) == KILN_OK))
        goto out;
    kiln_train_opts r = {.run_dir = dir};
    CHECK("resume refused: no run.json",
          kiln_train_resume(&r) == KILN_ERR_NOTFOUND && has("no run.json") && has(dir));
    CHECK("a new start takes the directory", kiln_train_start(&c, &o) == KILN_OK);
    CHECK("run.json's temporary is swept", !kiln_path_exists(tmp) && kiln_path_exists(rj));
    last = kiln_run_ckpt_path(dir, c.steps);
    last_clean = kiln_run_ckpt_path(clean, c.steps);
    CHECK("same bytes as a clean start",
          kiln_train_start(&c, &oc) == KILN_OK && file_bytes(last, &a, &la) &&
              file_bytes(last_clean, &b, &lb) && la == lb && !memcmp(a, b, la));
    CHECK("checkpoints without run.json are a run",
          unlink(rj) == 0 && kiln_train_start(&c, &o) == KILN_ERR_CONFLICT &&
              has("holds a run already"));
out:
    kiln_log_set_level(KILN_LOG_INFO);
    free(data), free(dir), free(clean), free(ck), free(tmp), free(lock), free(rj), free(last),
        free(last_clean), free(a), free(b);
}

/* A run SIGKILLed after its last checkpoint's rename but before the prune that follows it
 * (found by the trainer soak) kept a checkpoint past `keep`, and the resume, with no step
 * left to run, never pruned it. The resume prunes now when it resumes from the newest. */
KILN_TEST(train_run_resume_prunes) {
    kiln_log_set_level(KILN_LOG_ERROR);
    char *data = synth("d.safetensors", 1), *dir = kiln_test_path("run");
    char *last = NULL, *prev = NULL, *extra = NULL, *a = NULL, *b = NULL, *p = NULL;
    size_t la = 0, lb = 0, lp = 0;
    kiln_train_config c;
    small_config(&c);
    c.keep = 2;
    kiln_train_opts o = {.run_dir = dir, .data_path = data}, r = {.run_dir = dir};
    if (!CHECK("train", data && kiln_train_start(&c, &o) == KILN_OK)) goto out;
    last = kiln_run_ckpt_path(dir, c.steps);
    prev = kiln_run_ckpt_path(dir, c.steps - c.ckpt_every);
    extra = kiln_run_ckpt_path(dir, c.steps - 2 * c.ckpt_every);
    CHECK("keep 2", last && prev && extra && kiln_path_exists(last) && kiln_path_exists(prev) &&
                        !kiln_path_exists(extra));
    /* The state a kill before the last prune leaves: one checkpoint more. */
    if (!CHECK("copy", file_bytes(prev, &p, &lp) &&
                           kiln_write_file_atomic(extra, p, lp) == KILN_OK &&
                           file_bytes(last, &a, &la)))
        goto out;
    CHECK("resume", kiln_train_resume(&r) == KILN_OK);
    CHECK("the extra checkpoint is pruned", !kiln_path_exists(extra) && kiln_path_exists(prev));
    CHECK("the last is untouched", file_bytes(last, &b, &lb) && la == lb && !memcmp(a, b, la));
out:
    kiln_log_set_level(KILN_LOG_INFO);
    free(data), free(dir), free(last), free(prev), free(extra), free(a), free(b), free(p);
}

KILN_TEST(train_run_corrupt_ckpt_skipped) {
    kiln_log_set_level(KILN_LOG_ERROR);
    char *data = synth("d.safetensors", 1), *dir = kiln_test_path("run");
    char *p4 = kiln_run_ckpt_path(dir, 4), *p6 = kiln_run_ckpt_path(dir, 6);
    char *orig = NULL, *again = NULL;
    size_t lo = 0, la = 0;
    kiln_train_config c;
    small_config(&c);
    kiln_train_opts o = {.run_dir = dir, .data_path = data};
    if (!CHECK("train", data && kiln_train_start(&c, &o) == KILN_OK)) goto out;
    if (!CHECK("read", file_bytes(p6, &orig, &lo))) goto out;
    orig[lo - 1] ^= 0x40;
    kiln_write_file_atomic(p6, orig, lo);
    orig[lo - 1] ^= 0x40;
    kiln_train_opts r = {.run_dir = dir};
    CHECK("resume", kiln_train_resume(&r) == KILN_OK);
    CHECK("skip recorded", has_event(dir, "ckpt_skipped") && has_event(dir, "resume"));
    CHECK("step 4 kept", kiln_path_exists(p4));
    CHECK("step 6 redone bit for bit",
          file_bytes(p6, &again, &la) && la == lo && !memcmp(orig, again, lo));
    kiln_run_info ri;
    if (CHECK("info", kiln_run_info_load(dir, 100, &ri) == KILN_OK)) {
        CHECK("one row per step", ri.last_step == 6);
        kiln_run_info_release(&ri);
    }
out:
    kiln_log_set_level(KILN_LOG_INFO);
    free(orig), free(again), free(p4), free(p6), free(data), free(dir);
}

KILN_TEST(train_run_nonfinite_steps) {
    kiln_log_set_level(KILN_LOG_ERROR);
    char *data = synth("d.safetensors", 1), *dir = kiln_test_path("run"),
         *dir2 = kiln_test_path("run2");
    kiln_train_config c;
    small_config(&c);
    c.max_bad_steps = 2;
    long one[] = {3};
    kiln_train_opts o = {.run_dir = dir, .data_path = data, .poison_steps = one, .n_poison = 1};
    if (!CHECK("a lone bad step is survived", data && kiln_train_start(&c, &o) == KILN_OK))
        goto out;
    CHECK("logged as an event", has_event(dir, "nonfinite"));
    kiln_ckpt ck;
    char *p6 = kiln_run_ckpt_path(dir, 6);
    CHECK("not applied", kiln_ckpt_open(p6, &ck) == KILN_OK && ck.state.updates == 5 &&
                             ck.state.bad_streak == 0 && ck.state.loss_spike.n == 5);
    kiln_ckpt_release(&ck);
    free(p6);
    long two[] = {3, 4};
    kiln_train_opts o2 = {.run_dir = dir2, .data_path = data, .poison_steps = two, .n_poison = 2};
    CHECK("max_bad_steps in a row stop the run",
          kiln_train_start(&c, &o2) == KILN_ERR_NUMERIC && has("step 4") && has("max_bad_steps"));
    char *p2 = kiln_run_ckpt_path(dir2, 2), *p4 = kiln_run_ckpt_path(dir2, 4);
    CHECK("last good checkpoint intact",
          kiln_ckpt_open(p2, &ck) == KILN_OK && !kiln_path_exists(p4));
    kiln_ckpt_release(&ck);
    free(p2), free(p4);
out:
    kiln_log_set_level(KILN_LOG_INFO);
    free(data), free(dir), free(dir2);
}

KILN_TEST(train_run_split_gap) {
    char *data = synth("d.safetensors", 1);
    kiln_dataset *ds;
    if (!CHECK("open", data && kiln_dataset_open(data, &ds) == KILN_OK)) {
        free(data);
        return;
    }
    kiln_split sp;
    CHECK("split", kiln_dataset_split(ds, 0.2, 8, &sp) == KILN_OK);
    bool ok = true;
    for (long i = 0; i < 500; i++)
        ok &= kiln_train_window(3, i, 4, (int)(i % 4), sp.train_end, 8) + 8 <= sp.train_end;
    size_t starts[64];
    size_t n = kiln_train_val_windows(&sp, 8, 64, starts);
    CHECK("training windows end a purge gap before validation",
          ok && sp.val_begin >= sp.train_end + 8);
    CHECK("validation windows after the gap",
          n > 0 && starts[0] >= sp.val_begin && starts[n - 1] + 8 <= sp.val_end);
    kiln_dataset_free(ds);
    free(data);
}

/* A start that fails after making the run's files and before its first step (here: the
 * metrics cannot be opened, a directory stands where metrics.db goes) takes them away again:
 * no run.json is left to make the next start refuse the directory as a run ("holds a run
 * already") nor a resume find a run that never took a step. The directory's other contents
 * stay; a directory the start made goes too. (issue 16: no half-made run directory.) */
KILN_TEST(train_failed_start_leaves_no_run) {
    kiln_log_set_level(KILN_LOG_ERROR);
    char *data = synth("d.safetensors", 1), *dir = kiln_test_path("run");
    char *mdb = kiln_path_join(dir, "metrics.db"), *rj = kiln_path_join(dir, "run.json"),
         *ck = kiln_path_join(dir, "ckpt");
    kiln_train_config c;
    small_config(&c);
    kiln_train_opts o = {.run_dir = dir, .data_path = data};
    if (!CHECK("set up", data && mdb && rj && ck && kiln_mkdir_p(mdb) == KILN_OK)) goto out;
    CHECK("the start fails", kiln_train_start(&c, &o) != KILN_OK && has("metrics.db"));
    CHECK("no run.json left", !kiln_path_exists(rj));
    CHECK("no ckpt/ left", !kiln_path_exists(ck));
    CHECK("what was there stays", kiln_path_exists(mdb));
    rmdir(mdb);
    CHECK("the next start trains", kiln_train_start(&c, &o) == KILN_OK);
out:
    kiln_log_set_level(KILN_LOG_INFO);
    free(data), free(dir), free(mdb), free(rj), free(ck);
}

/* Targets at any scale: the trainer standardises them with the training split's mean and
 * std, so a market whose returns have a std of 0.01 trains as one of std 1 does (within 5% of
 * its held-out R^2, same seed), and the exported model predicts in the data's units: its
 * outputs are the trainer's forward unstandardised. */
KILN_TEST(train_target_scale) {
    kiln_log_set_level(KILN_LOG_ERROR);
    char *d1 = kiln_test_path("one.st"), *d2 = kiln_test_path("small.st"),
         *r1 = kiln_test_path("r1"), *r2 = kiln_test_path("r2"), *md = kiln_test_path("model"),
         *mf = kiln_test_path("model/model.safetensors"), *ckp = NULL;
    kiln_dataset *ds = NULL;
    kiln_model *m = NULL;
    kiln_tsmoe *net = NULL;
    kiln_ckpt ck = {0};
    float *x = NULL, *yr = NULL, *ym = NULL;
    kiln_run_info a = {0}, b = {0};
    kiln_synth_opts so = {.seed = 5, .rows = 4000, .n_features = 4, .n_outputs = 2, .scale = 1};
    CHECK("data", kiln_synth_write(&so, d1, NULL) == KILN_OK);
    so.scale = 0.01;
    CHECK("data at scale 0.01", kiln_synth_write(&so, d2, NULL) == KILN_OK);
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.steps = 80;
    c.warmup_steps = 10;
    c.eval_every = 0;
    c.ckpt_every = 0;
    c.seed = 3;
    kiln_train_opts o1 = {.run_dir = r1, .data_path = d1}, o2 = {.run_dir = r2, .data_path = d2};
    if (!CHECK("train both",
               kiln_train_start(&c, &o1) == KILN_OK && kiln_train_start(&c, &o2) == KILN_OK))
        goto out;
    if (!CHECK("runs", kiln_run_info_load(r1, 0, &a) == KILN_OK &&
                           kiln_run_info_load(r2, 0, &b) == KILN_OK))
        goto out;
    fprintf(stderr, "    held-out R^2: scale 1 %.5f, scale 0.01 %.5f\n", a.last_val_r2,
            b.last_val_r2);
    CHECK("scale 1 learns something", a.last_val_r2 > 0.02);
    CHECK("scale 0.01 within 5% of scale 1's R^2",
          fabs(b.last_val_r2 - a.last_val_r2) <= 0.05 * a.last_val_r2);
    {
        /* and scale 100 (a price change in cents) */
        char *d3 = kiln_test_path("big.st"), *r3 = kiln_test_path("r3");
        kiln_run_info ri = {0};
        so.scale = 100;
        kiln_train_opts o3 = {.run_dir = r3, .data_path = d3};
        CHECK("scale 100 within 5% of scale 1's R^2",
              kiln_synth_write(&so, d3, NULL) == KILN_OK && kiln_train_start(&c, &o3) == KILN_OK &&
                  kiln_run_info_load(r3, 0, &ri) == KILN_OK &&
                  fabs(ri.last_val_r2 - a.last_val_r2) <= 0.05 * a.last_val_r2);
        fprintf(stderr, "    held-out R^2 at scale 100: %.5f\n", ri.last_val_r2);
        kiln_run_info_release(&ri);
        free(d3), free(r3);
    }
    CHECK("R^2 per target recorded",
          json_array_size(b.last_val_targets) == 2 &&
              !strcmp(
                  json_string_value(json_object_get(json_array_get(b.last_val_targets, 1), "name")),
                  "fwd_ret_2"));

    /* The export against the trainer's forward on the last checkpoint, unstandardised. */
    kiln_export_opts eo = {.run_dir = r2, .step_metrics = kiln_run_step_metrics, .out_dir = md};
    if (!CHECK("export", kiln_export_model(&eo, NULL) == KILN_OK)) goto out;
    ckp = kiln_run_ckpt_path(r2, c.steps);
    if (!CHECK("checkpoint", ckp && kiln_ckpt_open(ckp, &ck) == KILN_OK)) goto out;
    CHECK("checkpoint records the scaling",
          ck.has_target_norm && ck.target_std[0] > 0.005 && ck.target_std[0] < 0.02);
    if (!CHECK("open", kiln_dataset_open(d2, &ds) == KILN_OK && kiln_model_open(mf, &m) == KILN_OK))
        goto out;
    const int B = 8, S = ck.cfg.model.seq_len, F = 4, O = 2;
    const size_t n = (size_t)B * S;
    x = malloc(n * F * sizeof *x), yr = malloc(n * O * sizeof *yr), ym = malloc(n * O * sizeof *ym);
    if (!CHECK("buffers", x && yr && ym)) goto out;
    for (int w = 0; w < B; w++) /* windows from the validation rows */
        memcpy(x + (size_t)w * S * F, ds->features + (3300 + (size_t)w * 80) * F,
               (size_t)S * F * sizeof *x);
    size_t np;
    if (!CHECK("trainer network", kiln_tsmoe_create(&ck.cfg.model, B, &net) == KILN_OK)) goto out;
    const kiln_param *tab = kiln_tsmoe_param_table(net, &np);
    CHECK("load", kiln_ckpt_load(&ck, tab, np, kiln_tsmoe_params(net), NULL, NULL) == KILN_OK);
    kiln_loss_opts lo = {(float)c.aux_loss_coef, (float)c.z_loss_coef, 0};
    CHECK("trainer forward", kiln_tsmoe_forward(net, x, NULL, B, &lo, NULL) == KILN_OK);
    memcpy(yr, kiln_tsmoe_outputs(net), n * O * sizeof *yr);
    CHECK("runtime forward", kiln_model_forward(m, x, B, S, ym) == KILN_OK);
    double worst = 0, big = 0, ss = 0, sum = 0;
    for (size_t k = 0; k < n * O; k++) {
        int oo = (int)(k % O);
        double ref = (double)yr[k] * ck.target_std[oo] + ck.target_mean[oo];
        double d = fabs(ym[k] - ref);
        if (d > worst) worst = d;
        if (fabs(ref) > big) big = fabs(ref);
        sum += ym[k];
        ss += (double)ym[k] * ym[k];
    }
    double sd = sqrt(ss / (double)(n * O) - (sum / (double)(n * O)) * (sum / (double)(n * O)));
    fprintf(stderr, "    exported vs trainer x std + mean: max |diff| %.3g (outputs up to %.3g)\n",
            worst, big);
    CHECK("exported outputs are the trainer's in the data's units", worst <= 1e-7 + 1e-4 * big);
    CHECK("at the data's scale (std 0.01, not 1)", sd > 1e-4 && sd < 0.01 && big < 0.1);
out:
    kiln_run_info_release(&a);
    kiln_run_info_release(&b);
    kiln_ckpt_release(&ck);
    kiln_tsmoe_free(net);
    kiln_model_free(m);
    kiln_dataset_free(ds);
    free(x), free(yr), free(ym), free(ckp);
    free(d1), free(d2), free(r1), free(r2), free(md), free(mf);
}

/* A checkpoint written before kiln.target_norm existed (the same file less that key) loads as
 * mean 0 and std 1: a run resumes from it and keeps training on unscaled targets, recording
 * 0 and 1 from then on, and export freezes its head as it is. A malformed one is refused. */
KILN_TEST(train_old_ckpt_without_target_norm) {
    kiln_log_set_level(KILN_LOG_ERROR);
    char *data = synth("d.safetensors", 1), *dir = kiln_test_path("run"),
         *md = kiln_test_path("model"), *mf = kiln_test_path("model/model.safetensors");
    char *mid = NULL, *last = NULL;
    kiln_st *st = NULL, *ms = NULL, *cs = NULL;
    kiln_st_writer *w = NULL;
    kiln_ckpt ck = {0};
    kiln_train_config c;
    small_config(&c);
    kiln_train_opts o = {.run_dir = dir, .data_path = data}, r = {.run_dir = dir};
    if (!CHECK("train", data && kiln_train_start(&c, &o) == KILN_OK)) goto out;
    mid = kiln_run_ckpt_path(dir, 4);
    last = kiln_run_ckpt_path(dir, c.steps);
    if (!CHECK("open", kiln_st_open(mid, &st) == KILN_OK && kiln_st_meta(st, "kiln.target_norm")))
        goto out;
    /* Rewrite step 4 without kiln.target_norm: the tensors (and so their digest) unchanged. */
    CHECK("writer", kiln_st_writer_new(&w) == KILN_OK);
    for (size_t i = 0; i < kiln_st_count(st); i++) {
        const kiln_tensor *t = kiln_st_at(st, i);
        CHECK("tensor", kiln_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data) ==
                            KILN_OK);
    }
    for (size_t i = 0; i < kiln_st_meta_count(st); i++) {
        const char *k, *v;
        kiln_st_meta_at(st, i, &k, &v);
        if (strcmp(k, "kiln.target_norm"))
            CHECK("meta", kiln_st_writer_meta(w, k, v) == KILN_OK);
    }
    char *tmp = kiln_test_path("old.safetensors");
    CHECK("write", kiln_st_writer_write(w, tmp) == KILN_OK && rename(tmp, mid) == 0);
    free(tmp);
    kiln_st_close(st);
    st = NULL;
    if (!CHECK("the old checkpoint opens as mean 0, std 1",
               kiln_ckpt_open(mid, &ck) == KILN_OK && !ck.has_target_norm &&
                   ck.target_mean[0] == 0 && ck.target_std[0] == 1))
        goto out;
    kiln_ckpt_release(&ck);
    /* Export of the old checkpoint: the head as it is. */
    kiln_export_opts eo = {
        .run_dir = dir, .step_metrics = kiln_run_step_metrics, .out_dir = md, .step = 4};
    if (CHECK("export", kiln_export_model(&eo, NULL) == KILN_OK) &&
        CHECK("open both", kiln_st_open(mf, &ms) == KILN_OK && kiln_st_open(mid, &cs) == KILN_OK)) {
        const kiln_tensor *a = kiln_st_find(ms, "head.bias"), *b = kiln_st_find(cs, "head.bias");
        CHECK("head unchanged", a && b && a->nbytes == b->nbytes && !memcmp(a->data, b->data, a->nbytes));
    }
    /* Resume from it (the later ones gone): trained on, recording mean 0 and std 1. */
    for (long s = 6; s <= c.steps; s += 2) {
        char *p = kiln_run_ckpt_path(dir, s);
        unlink(p);
        free(p);
    }
    CHECK("resume", kiln_train_resume(&r) == KILN_OK);
    CHECK("the resumed run records 0 and 1",
          kiln_ckpt_open(last, &ck) == KILN_OK && ck.has_target_norm && ck.target_mean[0] == 0 &&
              ck.target_std[0] == 1);
    kiln_ckpt_release(&ck);
    static const char *const bad[] = {"{\"mean\":[0],\"std\":[-1]}", "{\"mean\":[0]}",
                                      "{\"mean\":[0,1],\"std\":[1,1]}", "[1]", "nope"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        char *bp = kiln_test_path("bad.safetensors");
        kiln_st_writer *bw = NULL;
        kiln_st *bs = NULL;
        float one = 1, m, sd;
        bool present = true;
        bool ok = kiln_st_writer_new(&bw) == KILN_OK &&
                  kiln_st_writer_add(bw, "x", KILN_F32, 1, (int64_t[]){1}, &one) == KILN_OK &&
                  kiln_st_writer_meta(bw, "kiln.target_norm", bad[i]) == KILN_OK &&
                  kiln_st_writer_write(bw, bp) == KILN_OK && kiln_st_open(bp, &bs) == KILN_OK;
        CHECK("a malformed kiln.target_norm is refused",
              ok && kiln_target_norm_read(bs, 1, &m, &sd, &present) == KILN_ERR_FORMAT &&
                  !present && m == 0 && sd == 1);
        kiln_st_close(bs);
        kiln_st_writer_free(bw);
        free(bp);
    }
out:
    kiln_log_set_level(KILN_LOG_INFO);
    kiln_ckpt_release(&ck);
    kiln_st_close(st);
    kiln_st_close(ms);
    kiln_st_close(cs);
    kiln_st_writer_free(w);
    free(data), free(dir), free(md), free(mf), free(mid), free(last);
}

/*
 * freeze.c - kiln export: a training checkpoint frozen into a model directory.
 *
 * The checkpoint is read with core's safetensors reader and checked the way the trainer
 * checks it on resume (the SHA-256 of its data section against kiln.data_sha256), so a
 * torn or corrupted file is never frozen. Only the parameters of docs/model.md's table are
 * kept; the AdamW moments stay behind. Everything written is a function of the
 * checkpoint, run.json and the step's metrics (read by the caller's step_metrics, runs/'s: export
 * has no SQL): no clock, no host, no path, so freezing the same checkpoint twice gives the same
 * bytes.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "export_int.h"

void kiln_export_info_release(kiln_export_info *info) {
    if (!info) return;
    free(info->ckpt_path);
    for (size_t i = 0; i < info->n_skipped; i++)
        free(info->skipped[i]);
    free(info->skipped);
    memset(info, 0, sizeof *info);
}

/* ---- checkpoints -------------------------------------------------------------- */

/* An open checkpoint whose digest verified and whose parameters are all there. */
typedef struct ckpt {
    kiln_st *st;
    kiln_model_config cfg;
    kiln_param *tab;
    size_t np;
    long step;
    /* [O] the trainer's target standardisation (kiln.target_norm), folded into the head on
     * export; mean 0 and std 1 (has_norm false) for a checkpoint written before it. */
    float *tmean, *tstd;
    bool has_norm;
} ckpt;

static void ckpt_close(ckpt *c) {
    kiln_st_close(c->st);
    free(c->tab);
    free(c->tmean);
    free(c->tstd);
    memset(c, 0, sizeof *c);
}

static kiln_err ckpt_open(const char *path, ckpt *c) {
    memset(c, 0, sizeof *c);
    KILN_TRY(kiln_st_open(path, &c->st));
    kiln_err rc = KILN_OK;
    /* The data section is contiguous from its lowest tensor (kiln_st_open checked that the
     * offsets cover it without gaps): its digest is what the trainer stored. */
    const unsigned char *lo = NULL;
    size_t total = 0;
    for (size_t i = 0; i < kiln_st_count(c->st); i++) {
        const kiln_tensor *t = kiln_st_at(c->st, i);
        if (t->nbytes && (!lo || (const unsigned char *)t->data < lo)) lo = t->data;
        total += t->nbytes;
    }
    const char *want = kiln_st_meta(c->st, "kiln.data_sha256");
    KILN_CHECK_IF(rc, fail, !want, KILN_ERR_VERIFY,
                  "'%s': no kiln.data_sha256 in __metadata__ (not a checkpoint)", path);
    uint8_t dig[KILN_SHA256_BYTES];
    char hex[KILN_SHA256_HEX];
    kiln_sha256(lo ? (const void *)lo : (const void *)"", total, dig);
    kiln_hex(dig, sizeof dig, hex);
    KILN_CHECK_IF(rc, fail, strcmp(want, hex), KILN_ERR_VERIFY,
                  "'%s': tensor data digest mismatch (corrupted checkpoint)", path);

    const char *st = kiln_st_meta(c->st, "kiln.step");
    char *end = NULL;
    errno = 0;
    c->step = st ? strtol(st, &end, 10) : -1;
    KILN_CHECK_IF(rc, fail, !st || errno || end == st || *end || c->step < 0, KILN_ERR_FORMAT,
                  "'%s': kiln.step is missing or not a step number", path);
    KILN_CHECK(rc, fail, kiln_model_config_from_st(c->st, &c->cfg));
    size_t total_f;
    KILN_CHECK(rc, fail, kiln_param_table(&c->cfg, &c->tab, &c->np, &total_f));
    c->tmean = kiln_calloc((size_t)c->cfg.n_outputs, sizeof(float));
    c->tstd = kiln_calloc((size_t)c->cfg.n_outputs, sizeof(float));
    KILN_CHECK_IF(rc, fail, !c->tmean || !c->tstd, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, fail,
               kiln_target_norm_read(c->st, c->cfg.n_outputs, c->tmean, c->tstd, &c->has_norm));
    for (size_t i = 0; i < c->np; i++) {
        const kiln_param *p = &c->tab[i];
        const kiln_tensor *t;
        KILN_CHECK(rc, fail, kiln_st_expect(c->st, p->name, KILN_F32, p->ndim, p->shape, &t));
        for (size_t k = 0; k < t->numel; k++) {
            float v;
            memcpy(&v, (const char *)t->data + 4 * k, 4);
            KILN_CHECK_IF(rc, fail, !isfinite(v), KILN_ERR_NUMERIC,
                          "'%s': tensor '%s' holds a non-finite value at element %zu", path,
                          p->name, k);
        }
        if (!strcmp(p->name, "norm.in_std"))
            for (size_t k = 0; k < t->numel; k++) {
                float v;
                memcpy(&v, (const char *)t->data + 4 * k, 4);
                KILN_CHECK_IF(rc, fail, !(v > 0), KILN_ERR_NUMERIC,
                              "'%s': norm.in_std[%zu] is %g, not positive", path, k, (double)v);
            }
    }
    return KILN_OK;
fail:
    ckpt_close(c);
    return rc;
}

static kiln_err add_skipped(kiln_export_info *info, const char *path) {
    if (!info) return KILN_OK;
    char *s = kiln_asprintf("%s: %s", path, kiln_errmsg());
    char **t = s ? realloc(info->skipped, (info->n_skipped + 1) * sizeof *t) : NULL;
    if (!t) {
        free(s);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    info->skipped = t;
    info->skipped[info->n_skipped++] = s;
    return KILN_OK;
}

/* Open the asked step's checkpoint, the best (KILN_EXPORT_BEST), or the newest that
 * verifies. */
static kiln_err pick_ckpt(const kiln_export_opts *o, long want, ckpt *c, char **path_out,
                          kiln_export_info *info) {
    const char *run_dir = o->run_dir;
    char *dir = kiln_path_join(run_dir, "ckpt");
    if (!dir) return KILN_ERR_NOMEM;
    long *steps = NULL;
    size_t n = 0;
    kiln_err rc = kiln_ckpt_steps(dir, &steps, &n);
    if (rc) {
        free(dir);
        return rc;
    }
    KILN_CHECK_IF(rc, out, n == 0, KILN_ERR_NOTFOUND, "'%s': no checkpoints", dir);
    if (want == KILN_EXPORT_BEST) {
        KILN_CHECK_IF(rc, out, !o->best_step, KILN_ERR_USAGE,
                      "'%s': the best checkpoint asked for, with no way to rank them", run_dir);
        KILN_CHECK(rc, out, o->best_step(run_dir, steps, n, &want));
    }
    rc = KILN_ERR_NOTFOUND;
    for (size_t i = n; i-- > 0;) { /* newest first */
        if (want > 0 && steps[i] != want) continue;
        char name[KILN_CKPT_NAME_MAX];
        kiln_ckpt_name(steps[i], name);
        char *path = kiln_path_join(dir, name);
        KILN_CHECK_IF(rc, out, !path, KILN_ERR_NOMEM, "out of memory");
        rc = ckpt_open(path, c);
        if (!rc && c->step != steps[i]) {
            rc = kiln_fail(KILN_ERR_FORMAT, "'%s': kiln.step is %ld, not the file's step %ld", path,
                           c->step, steps[i]);
            ckpt_close(c);
        }
        if (!rc) {
            *path_out = path;
            goto out;
        }
        /* An asked-for step is frozen or refused; only the default falls back. */
        if (want > 0 || rc == KILN_ERR_NOMEM || add_skipped(info, path)) {
            free(path);
            goto out;
        }
        kiln_warn("skipping checkpoint: %s", kiln_errmsg());
        free(path);
    }
    if (want > 0)
        rc = kiln_fail(KILN_ERR_NOTFOUND, "'%s': no checkpoint of step %ld", dir, want);
    else
        rc = kiln_fail(KILN_ERR_VERIFY, "'%s': none of the %zu checkpoints verifies", dir, n);
out:
    free(steps);
    free(dir);
    return rc;
}

/* ---- lineage ------------------------------------------------------------------ */

static json_t *meta_json(const kiln_st *st, const char *key) {
    const char *s = kiln_st_meta(st, key);
    json_t *j = NULL;
    if (s && kiln_json_parse(s, strlen(s), key, &j) != KILN_OK) {
        kiln_errclear();
        return NULL;
    }
    return j;
}

static json_t *str_or_null(const char *s) {
    return s ? json_string(s) : json_null();
}

/* The card (without name) from the checkpoint, run.json and metrics.db. */
static kiln_err make_card(const kiln_export_opts *o, const char *ckpt_path, const ckpt *c,
                          const char *name, json_t **out) {
    const char *run_dir = o->run_dir, *created_at = o->created;
    kiln_err rc = KILN_OK;
    json_t *run = NULL, *metrics = NULL, *card = NULL, *lin = NULL, *tc = NULL, *ck = NULL;
    char *run_path = kiln_path_join(run_dir, "run.json");
    KILN_CHECK_IF(rc, out, !run_path, KILN_ERR_NOMEM, "out of memory");
    if (kiln_path_exists(run_path)) KILN_CHECK(rc, out, kiln_json_load_file(run_path, &run));
    KILN_CHECK_IF(rc, out, run && !json_is_object(run), KILN_ERR_FORMAT,
                  "'%s': must be a JSON object", run_path);

    const char *rid = kiln_st_meta(c->st, "kiln.run_id");
    const char *run_rid = run ? json_string_value(json_object_get(run, "run_id")) : NULL;
    /* A run id of another type would quietly skip the check that the checkpoint is the run's. */
    KILN_CHECK_IF(rc, out, run && json_object_get(run, "run_id") && !run_rid, KILN_ERR_FORMAT,
                  "'%s': \"run_id\" is not a string", run_path);
    KILN_CHECK_IF(rc, out, rid && run_rid && strcmp(rid, run_rid), KILN_ERR_VERIFY,
                  "'%s' belongs to run %s, but '%s' is run %s", ckpt_path, rid, run_path, run_rid);
    if (!rid) rid = run_rid;
    KILN_CHECK_IF(rc, out, !rid || !*rid, KILN_ERR_FORMAT,
                  "'%s': no kiln.run_id in __metadata__ and no run id in '%s'", ckpt_path,
                  run_path);
    const char *ds = kiln_st_meta(c->st, "kiln.dataset_sha256");
    if (!ds && run) ds = json_string_value(json_object_get(run, "dataset_sha256"));
    tc = meta_json(c->st, "kiln.train_config");
    if (!tc && run && json_is_object(json_object_get(run, "config")))
        tc = json_incref(json_object_get(run, "config"));

    /* created: the checkpoint's own time, never the clock. */
    int64_t secs = 0;
    const char *kc = kiln_st_meta(c->st, "kiln.created");
    double mtime = NAN;
    if (o->step_metrics) KILN_CHECK(rc, out, o->step_metrics(run_dir, c->step, &metrics, &mtime));
    if (created_at) {
        /* A card made again (kiln reproduce): the time the first one recorded. */
        if ((rc = kiln_export_parse_time(created_at, &secs))) {
            kiln_errprefix(rc, "created time '%s': ", created_at);
            goto out;
        }
    } else if (kc) {
        if ((rc = kiln_export_parse_time(kc, &secs))) {
            kiln_errprefix(rc, "'%s': kiln.created: ", ckpt_path);
            goto out;
        }
    } else if (isfinite(mtime) && mtime >= 0 && mtime < 8e9) {
        secs = (int64_t)floor(mtime);
    } else {
        struct stat sb;
        KILN_CHECK_IF(rc, out, stat(ckpt_path, &sb), KILN_ERR_IO, "'%s': %s", ckpt_path,
                      strerror(errno));
        secs = (int64_t)sb.st_mtime;
    }
    KILN_CHECK_IF(rc, out, secs < 0 || secs >= 8589934592LL, KILN_ERR_FORMAT,
                  "'%s': creation time is outside 1970..2242", ckpt_path);
    char created[21];
    kiln_format_time(secs, created);

    uint8_t fsha[KILN_SHA256_BYTES];
    char fhex[KILN_SHA256_HEX], cname[KILN_CKPT_NAME_MAX], file[KILN_CKPT_NAME_MAX + 8];
    KILN_CHECK(rc, out, kiln_sha256_file(ckpt_path, fsha));
    kiln_hex(fsha, sizeof fsha, fhex);
    kiln_ckpt_name(c->step, cname);
    snprintf(file, sizeof file, "ckpt/%s", cname);
    ck = json_pack("{s:s,s:s,s:s}", "file", file, "sha256", fhex, "data_sha256",
                   kiln_st_meta(c->st, "kiln.data_sha256"));
    lin =
        json_pack("{s:s,s:I,s:o,s:o,s:o,s:o,s:o}", "run_id", rid, "step", (json_int_t)c->step,
                  "checkpoint", ck, "config", tc ? tc : json_null(), "dataset_sha256",
                  str_or_null(ds), "code_version", str_or_null(kiln_st_meta(c->st, "kiln.version")),
                  "metrics", metrics ? metrics : json_null());
    /* What the bits depend on (kernels.h); absent from a checkpoint made before it. */
    if (lin && kiln_st_meta(c->st, "kiln.numerics"))
        KILN_CHECK_IF(rc, out,
                      json_object_set_new(lin, "numerics",
                                          json_string(kiln_st_meta(c->st, "kiln.numerics"))),
                      KILN_ERR_NOMEM, "out of memory");
    ck = tc = metrics = NULL; /* stolen by json_pack, even on failure */
    KILN_CHECK_IF(rc, out, !lin, KILN_ERR_NOMEM, "out of memory");
    /* How the run split its rows (in rows, and in time when the data has times). */
    const json_t *split = run ? json_object_get(run, "split") : NULL;
    if (json_is_object(split))
        KILN_CHECK_IF(rc, out, json_object_set_new(lin, "split", json_deep_copy(split)),
                      KILN_ERR_NOMEM, "out of memory");
    /* The model the run started from (--init), by digest: what a reproduction needs besides
     * the dataset. Its path stays out, as every path does. */
    const char *init_sha =
        run ? json_string_value(json_object_get(json_object_get(run, "init"), "sha256")) : NULL;
    if (init_sha)
        KILN_CHECK_IF(rc, out,
                      json_object_set_new(lin, "init", json_pack("{s:s}", "sha256", init_sha)),
                      KILN_ERR_NOMEM, "out of memory");
    if (o->data_withheld)
        KILN_CHECK_IF(rc, out, json_object_set_new(lin, "dataset_withheld", json_true()),
                      KILN_ERR_NOMEM, "out of memory");
    if (c->has_norm) {
        /* What the trainer's losses were measured in, and what export folded into the head. */
        json_t *m = json_array(), *sd = json_array();
        for (int o = 0; m && sd && o < c->cfg.n_outputs; o++) {
            json_array_append_new(m, json_real(c->tmean[o]));
            json_array_append_new(sd, json_real(c->tstd[o]));
        }
        json_t *tn = m && sd ? json_pack("{s:O,s:O,s:s}", "mean", m, "std", sd, "folded_into",
                                         "head.weight, head.bias")
                             : NULL;
        json_decref(m);
        json_decref(sd);
        KILN_CHECK_IF(rc, out, !tn || json_object_set_new(lin, "target_norm", tn), KILN_ERR_NOMEM,
                      "out of memory");
    }
    card = json_pack("{s:s,s:s,s:s,s:o,s:s,s:O}", "format", KILN_CARD_FORMAT, "name", name,
                     "created", created, "config", kiln_model_config_json(&c->cfg), "dtype",
                     o->dtype == KILN_EXPORT_BF16 ? "bf16" : "f32", "lineage", lin);
    KILN_CHECK_IF(rc, out, !card, KILN_ERR_NOMEM, "out of memory");
    *out = card;
out:
    json_decref(lin);
    json_decref(run);
    json_decref(metrics);
    json_decref(tc);
    json_decref(ck);
    free(run_path);
    return rc;
}

/* ---- writing ------------------------------------------------------------------ */

/* head.weight and head.bias with the target standardisation folded in (W' = std W,
 * b' = std b + mean), so that the model predicts in the data's units: into buf, or the
 * checkpoint's own bytes when there is nothing to fold. */
static const void *head_data(const ckpt *c, const kiln_param *p, const kiln_tensor *t, float *buf) {
    bool w = !strcmp(p->name, "head.weight"), b = !strcmp(p->name, "head.bias");
    if (!c->has_norm || (!w && !b)) return t->data;
    const size_t O = (size_t)c->cfg.n_outputs, per = p->numel / O;
    for (size_t k = 0; k < p->numel; k++) {
        float v;
        memcpy(&v, (const char *)t->data + 4 * k, 4);
        size_t o = k / per;
        buf[k] = w ? v * c->tstd[o] : v * c->tstd[o] + c->tmean[o];
    }
    return buf;
}

static kiln_err write_model(const char *path, const ckpt *c, kiln_export_dtype dtype) {
    kiln_st_writer *w = NULL;
    float *fold = NULL;
    uint16_t *half = NULL;
    char *ctext = NULL, num[32];
    kiln_err rc = KILN_OK;
    size_t nhalf = 0;
    for (size_t i = 0; i < c->np; i++)
        nhalf += c->tab[i].numel;
    if (dtype == KILN_EXPORT_BF16) {
        half = kiln_malloc((nhalf ? nhalf : 1) * sizeof *half);
        if (!half) return KILN_ERR_NOMEM;
    }
    /* head.weight [O, D] and head.bias [O], each into its own part */
    fold = kiln_malloc(((size_t)c->cfg.n_outputs * ((size_t)c->cfg.d_model + 1)) * sizeof *fold);
    KILN_CHECK_IF(rc, out, !fold, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_st_writer_new(&w));
    for (size_t i = 0; i < c->np; i++) {
        const kiln_param *p = &c->tab[i];
        const kiln_tensor *t = kiln_st_find(c->st, p->name); /* checked by ckpt_open */
        const void *data =
            head_data(c, p, t,
                      fold + (strcmp(p->name, "head.bias")
                                  ? 0
                                  : (size_t)c->cfg.n_outputs * (size_t)c->cfg.d_model));
        /* The input standardisation stays F32 (the runtime accepts both): it scales raw
         * features before anything else and bf16 would cost it 3 significant digits. */
        if (dtype == KILN_EXPORT_BF16 && p->flags & KILN_PARAM_TRAINED) {
            uint16_t *h = half + p->offset;
            for (size_t k = 0; k < p->numel; k++) {
                float v;
                memcpy(&v, (const char *)data + 4 * k, 4);
                h[k] = kiln_f32_to_bf16(v);
            }
            KILN_CHECK(rc, out, kiln_st_writer_add(w, p->name, KILN_BF16, p->ndim, p->shape, h));
        } else {
            KILN_CHECK(rc, out, kiln_st_writer_add(w, p->name, KILN_F32, p->ndim, p->shape, data));
        }
    }
    ctext = kiln_model_config_text(&c->cfg);
    KILN_CHECK_IF(rc, out, !ctext, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_st_writer_meta(w, "kiln.config", ctext));
    snprintf(num, sizeof num, "%ld", c->step);
    KILN_CHECK(rc, out, kiln_st_writer_meta(w, "kiln.step", num));
    const char *rid = kiln_st_meta(c->st, "kiln.run_id");
    if (rid) KILN_CHECK(rc, out, kiln_st_writer_meta(w, "kiln.run_id", rid));
    rc = kiln_st_writer_write(w, path);
out:
    kiln_st_writer_free(w);
    free(fold);
    free(half);
    free(ctext);
    return rc;
}

/* 0: absent; 1: an empty directory; 2: a non-empty directory; 3: something else. */
static int out_state(const char *path) {
    struct stat sb;
    if (lstat(path, &sb)) return errno == ENOENT ? 0 : 3;
    if (!S_ISDIR(sb.st_mode)) return 3;
    DIR *d = opendir(path);
    if (!d) return 3;
    struct dirent *e;
    int st = 1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            st = 2;
            break;
        }
    closedir(d);
    return st;
}

/* What --force may replace: a model directory as kiln makes one, and nothing else. Its files
 * are among those kiln writes there (export: model.safetensors, card.json; kiln golden make:
 * golden/golden.safetensors, golden/golden.json; kiln validate: validation.json; a pull or
 * an unpack: manifest.json) and card.json is one of them. Anything else is named and
 * refused: --force replaces a model, never a directory of other files given by mistake. */
static kiln_err force_replaceable(const char *out) {
    static const char *const kiln_files[] = {"model.safetensors",         "card.json",
                                             "validation.json",           KILN_MANIFEST_NAME,
                                             "golden/golden.safetensors", "golden/golden.json"};
    int fd = open(out, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return kiln_fail_errno(KILN_ERR_IO, "cannot open directory '%s'", out);
    kiln_export_entry *list = NULL;
    size_t n = 0;
    kiln_err rc = kiln_export_walk(fd, out, &list, &n);
    close(fd);
    if (rc == KILN_ERR_NOMEM) return rc;
    if (rc) {
        char why[512];
        snprintf(why, sizeof why, "%s", kiln_errmsg());
        return kiln_fail(KILN_ERR_CONFLICT,
                         "'%s' is not a model directory (%s); --force replaces only a model "
                         "directory kiln wrote",
                         out, why);
    }
    bool card = false;
    for (size_t i = 0; !rc && i < n; i++) {
        bool known = false;
        for (size_t k = 0; k < KILN_ARRAY_LEN(kiln_files); k++)
            known = known || !strcmp(list[i].path, kiln_files[k]);
        card = card || !strcmp(list[i].path, "card.json");
        if (!known)
            rc = kiln_fail(KILN_ERR_CONFLICT,
                           "'%s' holds '%s', which kiln does not write into a model directory: "
                           "--force replaces only a model directory kiln wrote, and leaves this "
                           "one as it is",
                           out, list[i].path);
    }
    if (!rc && !card)
        rc = kiln_fail(KILN_ERR_CONFLICT,
                       "'%s' is not a model directory (no card.json): --force replaces only a "
                       "model directory kiln wrote, and leaves this one as it is",
                       out);
    kiln_export_entries_free(list, n);
    return rc;
}

/* A fresh private directory beside path: "<dir>/.<base>.<tag>-XXXXXX". Caller frees. */
static char *sibling_tmpdir(const char *path, const char *tag) {
    char *dir = kiln_dirname(path);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char *t = dir ? kiln_asprintf("%s/.%s.%s-XXXXXX", dir, base, tag) : NULL;
    free(dir);
    if (!t) return NULL;
    if (!mkdtemp(t)) {
        kiln_fail_errno(KILN_ERR_IO, "'%s': cannot create a temporary directory", t);
        free(t);
        return NULL;
    }
    return t;
}

static kiln_err install_dir(const char *tmp, const char *out, bool force) {
    int st = out_state(out);
    KILN_FAIL_IF(st == 3, KILN_ERR_CONFLICT, "'%s' exists and is not a directory", out);
    KILN_FAIL_IF(st == 2 && !force, KILN_ERR_CONFLICT,
                 "'%s' exists and is not empty (--force replaces it)", out);
    if (st == 2) KILN_TRY(force_replaceable(out));
    char *old = NULL;
    if (st == 2) {
        /* rename() replaces only an empty directory: move the old one aside first. */
        if (!(old = sibling_tmpdir(out, "old"))) return KILN_ERR_IO;
        if (rename(out, old)) {
            kiln_err rc = kiln_fail_errno(KILN_ERR_IO, "'%s': cannot move aside", out);
            rmdir(old);
            free(old);
            return rc;
        }
    }
    kiln_err rc = KILN_OK;
    if (rename(tmp, out)) {
        rc = kiln_fail_errno(KILN_ERR_IO, "'%s': cannot rename into place", out);
        if (old && rename(old, out)) kiln_warn("'%s' was left at '%s'", out, old);
        free(old);
        return rc;
    }
    if (old) kiln_export_rmtree(old);
    free(old);
    char *parent = kiln_dirname(out);
    if (parent) rc = kiln_fsync_dir(parent);
    free(parent);
    return rc;
}

kiln_err kiln_export_model(const kiln_export_opts *o, kiln_export_info *info) {
    if (info) memset(info, 0, sizeof *info);
    KILN_FAIL_IF(!o || !o->run_dir || !o->out_dir || !*o->out_dir, KILN_ERR_USAGE,
                 "export needs a run directory and an output directory");
    KILN_FAIL_IF(o->step < 0 && o->step != KILN_EXPORT_BEST, KILN_ERR_USAGE, "step %ld is negative",
                 o->step);
    KILN_FAIL_IF(o->name && !kiln_export_name_ok(o->name), KILN_ERR_USAGE,
                 "model name '%s' must match [a-z0-9][a-z0-9._-]{0,63}", o->name);
    KILN_FAIL_IF(o->dtype != KILN_EXPORT_F32 && o->dtype != KILN_EXPORT_BF16, KILN_ERR_USAGE,
                 "unknown export dtype %d", (int)o->dtype);
    /* Refuse early, before reading gigabytes, what install_dir would refuse at the end. */
    int st = out_state(o->out_dir);
    KILN_FAIL_IF(st == 3, KILN_ERR_CONFLICT, "'%s' exists and is not a directory", o->out_dir);
    KILN_FAIL_IF(st == 2 && !o->force, KILN_ERR_CONFLICT,
                 "'%s' exists and is not empty (--force replaces it)", o->out_dir);
    if (st == 2) KILN_TRY(force_replaceable(o->out_dir));

    ckpt c = {0};
    char *ckpt_path = NULL, *tmp = NULL, *mpath = NULL, *cpath = NULL;
    json_t *card = NULL;
    kiln_err rc = pick_ckpt(o, o->step, &c, &ckpt_path, info);
    if (rc) goto out;
    char defname[32];
    const char *rid = kiln_st_meta(c.st, "kiln.run_id");
    snprintf(defname, sizeof defname, "run-%.12s", rid ? rid : "unknown");
    const char *name = o->name ? o->name : defname;
    KILN_CHECK_IF(rc, out, !kiln_export_name_ok(name), KILN_ERR_FORMAT,
                  "'%s': the run id gives no valid model name; pass --name", ckpt_path);
    KILN_CHECK(rc, out, make_card(o, ckpt_path, &c, name, &card));

    if (!(tmp = sibling_tmpdir(o->out_dir, "export"))) {
        rc = KILN_ERR_IO; /* the message is set */
        goto out;
    }
    KILN_CHECK_IF(rc, out, chmod(tmp, 0755), KILN_ERR_IO, "'%s': %s", tmp, strerror(errno));
    mpath = kiln_path_join(tmp, "model.safetensors");
    cpath = kiln_path_join(tmp, "card.json");
    KILN_CHECK_IF(rc, out, !mpath || !cpath, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, write_model(mpath, &c, o->dtype));
    KILN_CHECK(rc, out, kiln_json_write_file(cpath, card));
    if (o->add_files) KILN_CHECK(rc, out, o->add_files(o->add_files_ctx, c.step, tmp));
    KILN_CHECK(rc, out, install_dir(tmp, o->out_dir, o->force));
    free(tmp);
    tmp = NULL;
    if (info) {
        info->step = c.step;
        info->ckpt_path = ckpt_path;
        ckpt_path = NULL;
    }
out:
    if (tmp) kiln_export_rmtree(tmp);
    if (rc && info) kiln_export_info_release(info);
    free(tmp);
    free(mpath);
    free(cpath);
    free(ckpt_path);
    json_decref(card);
    ckpt_close(&c);
    return rc;
}

/* reproduce.c - kiln reproduce: a published model rebuilt from its signed lineage, and the
 * bytes compared (docs/reproduce.md).
 *
 *   pull (verified) -> lineage -> dataset digest -> train from scratch -> export -> pack ->
 *   compare
 *
 * The files training makes (model.safetensors, card.json) are made again; the archive's other
 * files are records of the release itself (its run summary holds tokens/s, its validation
 * report the baseline it was checked against and the paths it read) and are carried across
 * from the verified pull, so the archive's digest is the released one exactly when the two
 * rebuilt files are. Nothing here prints. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "export.h"
#include "registry.h"
#include "release.h"
#include "runs.h"
#include "train.h"

typedef struct repro {
    const kiln_reproduce_opts *o;
    kiln_reproduce_result *res;
    char *released, *run, *model, *archive, *summary;
    char *data;                     /* --data, or the dataset pulled by its digest */
    char data_sha[KILN_SHA256_HEX]; /* its sha256 */
    char data_from[KILN_SIGN_NAME_MAX + KILN_REGISTRY_NAME_MAX + 64]; /* how it was got */
    json_t *card;                                                     /* the released card */
    kiln_manifest *man;                                               /* the released manifest */
    long target;                                                      /* the step to train to */
    volatile int stop; /* set at the target step, or when the caller's stop is */
    bool stopped_here; /* the stop was ours */
    char line[1024];
} repro;

static void done(repro *r) {
    if (r->o->on_stage) r->o->on_stage(r->o->ctx, r->line);
    r->line[0] = 0;
}

/* Read the pulled directory's manifest.json and card.json. */
static kiln_err read_released(repro *r) {
    char *mp = kiln_path_join(r->released, KILN_MANIFEST_NAME),
         *cp = kiln_path_join(r->released, "card.json"), *buf = NULL;
    size_t len = 0;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !mp || !cp, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_read_file(mp, KILN_MANIFEST_MAX_BYTES, &buf, &len));
    KILN_CHECK(rc, out, kiln_manifest_parse(buf, len, mp, &r->man));
    KILN_CHECK(rc, out, kiln_json_load_file(cp, &r->card));
out:
    free(buf);
    free(mp);
    free(cp);
    return rc;
}

/* What the lineage must say before any training: a model kiln trained, on a device this host
 * has, with its config, step and dataset digest. */
static kiln_err check_lineage(repro *r, const json_t *lin, const char **ds_sha) {
    const char *who = r->res->model, *ver = r->res->version;
    const char *src = json_string_value(json_object_get(lin, "source"));
    KILN_FAIL_IF(src || json_object_get(lin, "framework"), KILN_ERR_UNSUPPORTED,
                 "%s@%s was trained outside kiln (lineage.source '%s'%s%s): kiln reproduce "
                 "rebuilds only models kiln's trainer made",
                 who, ver, src ? src : "?",
                 json_string_value(json_object_get(lin, "framework")) ? ", framework " : "",
                 json_string_value(json_object_get(lin, "framework"))
                     ? json_string_value(json_object_get(lin, "framework"))
                     : "");
    const char *num = json_string_value(json_object_get(lin, "numerics"));
    KILN_FAIL_IF(num && !strncmp(num, "cuda", 4) && kiln_train_cuda_devices() <= 0, KILN_ERR_DEVICE,
                 "%s@%s was trained on a GPU (lineage.numerics '%s') and this host has no usable "
                 "CUDA device: reproduce it on a host with one",
                 who, ver, num);
    KILN_FAIL_IF(!json_is_object(json_object_get(lin, "config")), KILN_ERR_FORMAT,
                 "%s@%s: the card's lineage has no config object: nothing to train with", who, ver);
    json_t *st = json_object_get(lin, "step");
    KILN_FAIL_IF(!json_is_integer(st) || json_integer_value(st) < 1, KILN_ERR_FORMAT,
                 "%s@%s: the card's lineage.step is missing or not a positive step", who, ver);
    r->target = (long)json_integer_value(st);
    *ds_sha = json_string_value(json_object_get(lin, "dataset_sha256"));
    KILN_FAIL_IF(!*ds_sha || strlen(*ds_sha) != 64, KILN_ERR_FORMAT,
                 "%s@%s: the card's lineage.dataset_sha256 is missing or not a digest", who, ver);
    KILN_FAIL_IF(!json_is_string(json_object_get(r->card, "created")) ||
                     !json_is_string(json_object_get(r->card, "name")),
                 KILN_ERR_FORMAT, "%s@%s: the card has no \"name\" or \"created\"", who, ver);
    const char *dtype = json_string_value(json_object_get(r->card, "dtype"));
    KILN_FAIL_IF(!dtype || (strcmp(dtype, "f32") && strcmp(dtype, "bf16")), KILN_ERR_FORMAT,
                 "%s@%s: the card's dtype is not f32 or bf16", who, ver);
    return KILN_OK;
}

/* The dataset (and the --init model) against the digests the lineage records. */
static kiln_err check_inputs(repro *r, const json_t *lin, const char *ds_sha) {
    const kiln_reproduce_opts *o = r->o;
    const char *who = r->res->model, *ver = r->res->version;
    if (!o->data) {
        KILN_FAIL_IF(json_is_true(json_object_get(lin, "dataset_withheld")), KILN_ERR_USAGE,
                     "%s@%s was released with its dataset withheld (kiln release --no-data): "
                     "give the dataset of sha256:%s with --data",
                     who, ver, ds_sha);
        /* Fetched by its digest, verified (a release key signed it) before it is read. */
        r->data = kiln_asprintf("%s/dataset-%.12s.st", o->workdir, ds_sha);
        KILN_FAIL_IF(!r->data, KILN_ERR_NOMEM, "out of memory");
        kiln_registry_data_pulled dp;
        kiln_err rc = kiln_registry_data_pull(o->client, NULL, ds_sha, o->trust, r->data, &dp);
        if (rc == KILN_ERR_NOTFOUND)
            return kiln_fail(KILN_ERR_NOTFOUND,
                             "%s@%s was trained on the dataset sha256:%s, which registry '%s' "
                             "does not hold (published with --no-data, or before kiln release "
                             "published datasets): give it with --data",
                             who, ver, ds_sha, o->client->url);
        KILN_TRY(rc);
        snprintf(r->data_from, sizeof r->data_from, "pulled as %s, signed by %s", dp.name,
                 dp.signed_by);
        kiln_dataset *ds = NULL;
        KILN_TRY(kiln_dataset_open(r->data, &ds));
        snprintf(r->data_sha, sizeof r->data_sha, "%s", ds->sha256);
        kiln_dataset_free(ds);
    }
    const char *got = r->data_sha;
    KILN_FAIL_IF(strcmp(got, ds_sha), KILN_ERR_VERIFY,
                 "'%s' is sha256:%s, but %s@%s was trained on sha256:%s: not its dataset "
                 "(refused before any training)",
                 r->data, got, who, ver, ds_sha);
    const char *init = json_string_value(json_object_get(json_object_get(lin, "init"), "sha256"));
    KILN_FAIL_IF(init && !o->init, KILN_ERR_USAGE,
                 "%s@%s started from a model (kiln train --init) of sha256:%s: give that model "
                 "with --init",
                 who, ver, init);
    KILN_FAIL_IF(!init && o->init, KILN_ERR_USAGE,
                 "%s@%s did not start from a model (its lineage names no init): --init '%s' "
                 "would train another one",
                 who, ver, o->init);
    if (init) {
        uint8_t d[KILN_SHA256_BYTES];
        char h[KILN_SHA256_HEX];
        KILN_TRY(kiln_sha256_file(o->init, d));
        kiln_hex(d, sizeof d, h);
        KILN_FAIL_IF(strcmp(h, init), KILN_ERR_VERIFY,
                     "--init '%s' is sha256:%s, but %s@%s started from sha256:%s: not its model",
                     o->init, h, who, ver, init);
    }
    return KILN_OK;
}

static void on_step(void *ctx, const kiln_train_progress *p) {
    repro *r = ctx;
    if (p->step >= r->target) {
        r->stopped_here = !(r->o->stop && *r->o->stop);
        r->stop = 1;
    }
    if (r->o->stop && *r->o->stop) r->stop = 1;
    if (r->o->progress) r->o->progress(r->o->ctx, p);
}

static kiln_err train(repro *r, const json_t *lin) {
    const kiln_reproduce_opts *o = r->o;
    kiln_train_config cfg;
    kiln_train_config_default(&cfg);
    char label[200];
    snprintf(label, sizeof label, "%s@%s's lineage.config", r->res->model, r->res->version);
    KILN_TRY(kiln_train_config_apply(&cfg, json_object_get(lin, "config"), label));
    cfg.threads = o->threads > 0 ? o->threads : 0;
    KILN_TRY(kiln_train_config_check(&cfg, label));
    KILN_FAIL_IF(r->target > cfg.steps, KILN_ERR_FORMAT,
                 "%s@%s: lineage.step %ld is past the config's %ld steps", r->res->model,
                 r->res->version, r->target, cfg.steps);
    kiln_train_opts to = {.run_dir = r->run,
                          .data_path = r->data,
                          .init_path = o->init,
                          .progress = on_step,
                          .progress_ctx = r,
                          .stop = &r->stop};
    kiln_err rc = kiln_train_start(&cfg, &to);
    /* Short of the config's steps: the trainer was stopped at the target and checkpointed
     * it, as a run stopped there by a signal is. */
    if (rc == KILN_ERR_INTERRUPTED && r->stopped_here) {
        kiln_errclear();
        rc = KILN_OK;
    }
    KILN_TRY(rc);
    r->res->step = r->target;
    snprintf(r->line, sizeof r->line, "trained %ld steps from scratch in '%s' (%s, %d thread%s)",
             r->target, r->run, kiln_train_device_name(cfg.device), kiln_train_threads(&cfg),
             kiln_train_threads(&cfg) == 1 ? "" : "s");
    return KILN_OK;
}

/* Export's add_files: the released archive's files that are no product of training, copied
 * from the verified pull. */
static kiln_err carry_files(void *ctx, long step, const char *dir) {
    (void)step;
    repro *r = ctx;
    kiln_err rc = KILN_OK;
    for (size_t i = 0; !rc && i < r->man->nfiles; i++) {
        const char *p = r->man->files[i].path;
        if (!strcmp(p, "model.safetensors") || !strcmp(p, "card.json")) continue;
        char *src = kiln_path_join(r->released, p), *dst = kiln_path_join(dir, p);
        char *parent = dst ? kiln_dirname(dst) : NULL, *buf = NULL;
        size_t len = 0;
        rc = src && parent ? kiln_mkdir_p(parent) : kiln_fail(KILN_ERR_NOMEM, "out of memory");
        if (!rc) rc = kiln_read_file(src, (size_t)1 << 40, &buf, &len);
        if (!rc) rc = kiln_write_file_atomic(dst, buf, len);
        free(buf);
        free(src);
        free(dst);
        free(parent);
    }
    return rc;
}

static kiln_err export_pack(repro *r) {
    json_t *c = r->card;
    kiln_export_opts eo = {
        .run_dir = r->run,
        .step = r->target,
        .out_dir = r->model,
        .dtype = strcmp(json_string_value(json_object_get(c, "dtype")), "bf16") ? KILN_EXPORT_F32
                                                                                : KILN_EXPORT_BF16,
        .name = json_string_value(json_object_get(c, "name")),
        .created = json_string_value(json_object_get(c, "created")),
        .add_files = carry_files,
        .add_files_ctx = r,
        .step_metrics = kiln_run_step_metrics,
        .data_withheld =
            json_is_true(json_object_get(json_object_get(c, "lineage"), "dataset_withheld"))};
    KILN_TRY(kiln_export_model(&eo, NULL));
    /* The rebuilt run's own summary, for the losses (not packed: it holds tokens/s). */
    KILN_TRY(kiln_run_summary_write(r->run, r->target, r->summary));
    uint8_t d[KILN_SHA256_BYTES];
    char h[KILN_SHA256_HEX];
    KILN_TRY(kiln_archive_pack(r->model, r->res->model, r->res->version, r->archive, d, NULL));
    kiln_hex(d, sizeof d, h);
    snprintf(r->res->rebuilt, sizeof r->res->rebuilt, "sha256:%s", h);
    snprintf(r->line, sizeof r->line, "exported step %ld into '%s', packed '%s' %s", r->target,
             r->model, r->archive, r->res->rebuilt);
    return KILN_OK;
}

static double elem(const kiln_tensor *t, size_t k) {
    if (t->dtype == KILN_BF16) {
        uint16_t b;
        memcpy(&b, (const char *)t->data + 2 * k, 2);
        return kiln_bf16_to_f32(b);
    }
    float f;
    memcpy(&f, (const char *)t->data + 4 * k, 4);
    return f;
}

/* The first tensor of the released model whose bytes the rebuilt one does not have. */
static kiln_err tensor_diff(repro *r, const char *want_path, const char *got_path) {
    kiln_st *a = NULL, *b = NULL;
    kiln_err rc = KILN_OK;
    char *out = r->res->tensor;
    size_t n = sizeof r->res->tensor;
    KILN_CHECK(rc, done, kiln_st_open(want_path, &a));
    KILN_CHECK(rc, done, kiln_st_open(got_path, &b));
    for (size_t i = 0; i < kiln_st_count(a); i++) {
        const kiln_tensor *x = kiln_st_at(a, i), *y = kiln_st_find(b, x->name);
        if (!y) {
            snprintf(out, n, "tensor '%s' is not in the rebuilt model", x->name);
            goto done;
        }
        if (x->dtype != y->dtype || x->ndim != y->ndim || x->nbytes != y->nbytes ||
            memcmp(x->shape, y->shape, sizeof x->shape)) {
            snprintf(out, n, "tensor '%s' has another dtype or shape in the rebuilt model",
                     x->name);
            goto done;
        }
        if (!memcmp(x->data, y->data, x->nbytes)) continue;
        size_t w = x->numel ? x->nbytes / x->numel : 1;
        for (size_t k = 0; k < x->numel; k++)
            if (memcmp((const char *)x->data + w * k, (const char *)y->data + w * k, w)) {
                snprintf(out, n,
                         "tensor '%s' first differs at index %zu: released %.9g, rebuilt %.9g",
                         x->name, k, elem(x, k), elem(y, k));
                goto done;
            }
    }
    for (size_t i = 0; i < kiln_st_count(b); i++)
        if (!kiln_st_find(a, kiln_st_at(b, i)->name)) {
            snprintf(out, n, "the rebuilt model has a tensor '%s' the released one lacks",
                     kiln_st_at(b, i)->name);
            goto done;
        }
    snprintf(out, n, "every tensor is the same: the files differ in their metadata");
done:
    kiln_st_close(a);
    kiln_st_close(b);
    return rc;
}

/* "key 'a' (this build 'b')" for each member of want and got that differs, prefix before each
 * name, appended at out[*len]. */
static void member_diff(const json_t *want, const json_t *got, const char *prefix, char *out,
                        size_t size, size_t *len) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)want, k, v) {
        json_t *g = json_object_get(got, k);
        if (g && json_equal(v, g)) continue;
        if (json_is_object(v) && json_is_object(g) && strcmp(k, "checkpoint")) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s%s.", prefix, k);
            member_diff(v, g, sub, out, size, len);
            continue;
        }
        /* Values that are objects or arrays (the checkpoint's digests) are only named. */
        bool whole = json_is_object(v) || json_is_array(v);
        char *a = whole ? NULL : json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT),
             *b = g && !whole ? json_dumps(g, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        if (*len < size && whole)
            *len += (size_t)snprintf(out + *len, size - *len, "%s%s%s differs", *len ? "; " : "",
                                     prefix, k);
        else if (*len < size)
            *len +=
                (size_t)snprintf(out + *len, size - *len, "%s%s%s released %.80s, rebuilt %.80s",
                                 *len ? "; " : "", prefix, k, a ? a : "?", b ? b : "absent");
        free(a);
        free(b);
    }
    json_object_foreach((json_t *)got, k, v) {
        if (json_object_get(want, k) || *len >= size) continue;
        *len += (size_t)snprintf(out + *len, size - *len, "%s%s%s absent from the release",
                                 *len ? "; " : "", prefix, k);
    }
}

static kiln_err card_diff(repro *r) {
    char *p = kiln_path_join(r->model, "card.json");
    json_t *got = NULL;
    kiln_err rc = p ? kiln_json_load_file(p, &got) : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    free(p);
    KILN_TRY(rc);
    size_t len = 0;
    const char *want_id = json_string_value(
                   json_object_get(json_object_get(r->card, "lineage"), "run_id")),
               *got_id =
                   json_string_value(json_object_get(json_object_get(got, "lineage"), "run_id"));
    /* The run id is the digest of the config, the dataset and the --init model (docs/train.md):
     * when the recorded ones do not give the recorded id, the card is not what was trained. */
    if (want_id && got_id && strcmp(want_id, got_id))
        len = (size_t)snprintf(r->res->card, sizeof r->res->card,
                               "the lineage's config, dataset and init do not give its run id %s "
                               "(they give %s): the card's config is not the one the run trained "
                               "with",
                               want_id, got_id);
    /* The run summary (signed with the archive) holds the config the run trained with: the
     * keys where the card's differs are named, with both values. */
    char *sp = kiln_path_join(r->released, KILN_RUN_SUMMARY_NAME);
    json_t *sum = NULL;
    if (sp && kiln_path_exists(sp) && kiln_json_load_file(sp, &sum) == KILN_OK) {
        const json_t *ran = json_object_get(sum, "config"),
                     *card = json_object_get(json_object_get(r->card, "lineage"), "config");
        const char *k;
        const json_t *v;
        if (json_is_object(ran) && json_is_object(card))
            json_object_foreach((json_t *)card, k, v) {
                const json_t *was = json_object_get(ran, k);
                if (!was || json_equal((json_t *)was, (json_t *)v) || len >= sizeof r->res->card)
                    continue;
                char *a = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT),
                     *b = json_dumps(was, JSON_ENCODE_ANY | JSON_COMPACT);
                len += (size_t)snprintf(r->res->card + len, sizeof r->res->card - len,
                                        "%sconfig key '%s' is %s in the card, %s in the run it "
                                        "claims (run_summary.json)",
                                        len ? "; " : "", k, a ? a : "?", b ? b : "?");
                free(a);
                free(b);
                if (len >= sizeof r->res->card) len = sizeof r->res->card - 1;
            }
    }
    kiln_errclear();
    json_decref(sum);
    free(sp);
    member_diff(r->card, got, "", r->res->card, sizeof r->res->card, &len);
    json_decref(got);
    return KILN_OK;
}

/* The first step whose loss in the released run summary is not the rebuilt run's. */
static kiln_err loss_diff(repro *r) {
    char *p = kiln_path_join(r->released, KILN_RUN_SUMMARY_NAME);
    json_t *want = NULL, *got = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !p, KILN_ERR_NOMEM, "out of memory");
    if (!kiln_path_exists(p)) {
        snprintf(r->res->loss, sizeof r->res->loss,
                 "the release has no run summary to compare the losses with");
        goto out;
    }
    KILN_CHECK(rc, out, kiln_json_load_file(p, &want));
    KILN_CHECK(rc, out, kiln_json_load_file(r->summary, &got));
    const json_t *ws = json_object_get(json_object_get(json_object_get(want, "series"), "loss"),
                                       "step"),
                 *wv = json_object_get(json_object_get(json_object_get(want, "series"), "loss"),
                                       "value"),
                 *gs = json_object_get(json_object_get(json_object_get(got, "series"), "loss"),
                                       "step"),
                 *gv = json_object_get(json_object_get(json_object_get(got, "series"), "loss"),
                                       "value");
    size_t j = 0;
    for (size_t i = 0; i < json_array_size(ws); i++) {
        json_int_t s = json_integer_value(json_array_get(ws, i));
        while (j < json_array_size(gs) && json_integer_value(json_array_get(gs, j)) < s)
            j++;
        if (j >= json_array_size(gs) || json_integer_value(json_array_get(gs, j)) != s) continue;
        if (json_equal(json_array_get(wv, i), json_array_get(gv, j))) continue;
        snprintf(r->res->loss, sizeof r->res->loss,
                 "the loss first differs at step %lld: released %.9g, rebuilt %.9g", (long long)s,
                 json_number_value(json_array_get(wv, i)),
                 json_number_value(json_array_get(gv, j)));
        goto out;
    }
    snprintf(r->res->loss, sizeof r->res->loss,
             "the loss of every step the run summary keeps (%zu) is the same", json_array_size(ws));
out:
    json_decref(want);
    json_decref(got);
    free(p);
    return rc;
}

static kiln_err compare(repro *r) {
    char *want = kiln_path_join(r->released, "model.safetensors"),
         *got = kiln_path_join(r->model, "model.safetensors");
    kiln_err rc = KILN_OK;
    uint8_t a[KILN_SHA256_BYTES], b[KILN_SHA256_BYTES];
    KILN_CHECK_IF(rc, out, !want || !got, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_sha256_file(want, a));
    KILN_CHECK(rc, out, kiln_sha256_file(got, b));
    r->res->model_same = !memcmp(a, b, sizeof a);
    r->res->identical = r->res->model_same && !strcmp(r->res->digest, r->res->rebuilt);
    if (r->res->identical) goto out;
    if (!r->res->model_same) {
        KILN_CHECK(rc, out, tensor_diff(r, want, got));
        KILN_CHECK(rc, out, loss_diff(r));
    }
    KILN_CHECK(rc, out, card_diff(r));
out:
    free(want);
    free(got);
    return rc;
}

/* The signed record of the verdict: WORKDIR/reproduction.json, then put to the registry. */
static kiln_err record(repro *r, const char *ds_sha) {
    char *text = NULL, *sig = NULL, *doc = NULL,
         *path = kiln_path_join(r->o->workdir, "reproduction.json");
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !path, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out,
               kiln_registry_repro_sign(r->o->sign_key, r->res->model, r->res->version,
                                        r->res->digest, ds_sha, r->o->host ? r->o->host : "?",
                                        kiln_unix_time(), r->res->identical, &text, &sig));
    doc = kiln_registry_repro_doc(text, sig);
    KILN_CHECK_IF(rc, out, !doc, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_write_file_atomic(path, doc, strlen(doc)));
    KILN_CHECK(rc, out, kiln_registry_repro_put(r->o->client, r->res->model, r->res->version, doc));
    r->res->recorded = true;
out:
    free(text);
    free(sig);
    free(doc);
    free(path);
    return rc;
}

kiln_err kiln_reproduce_run(const kiln_reproduce_opts *o, kiln_reproduce_result *res) {
    memset(res, 0, sizeof *res);
    KILN_FAIL_IF(!o || !o->client || !o->ref || !o->trust || !o->workdir, KILN_ERR_USAGE,
                 "a reproduction needs a registry, NAME@REF, a trust policy and a work directory");
    char what[KILN_REGISTRY_NAME_MAX + 1];
    bool is_version;
    KILN_TRY(kiln_registry_ref_parse(o->ref, res->model, what, &is_version));
    kiln_dir_state ws = kiln_path_dir_state(o->workdir);
    KILN_FAIL_IF(ws == KILN_DIR_FULL || ws == KILN_DIR_OTHER, KILN_ERR_CONFLICT,
                 "'%s' exists and is not an empty directory; a reproduction works in a new one",
                 o->workdir);
    repro r = {.o = o, .res = res};
    kiln_err rc = KILN_OK;
    r.released = kiln_path_join(o->workdir, "released");
    r.run = kiln_path_join(o->workdir, "run");
    r.model = kiln_path_join(o->workdir, "model");
    r.summary = kiln_path_join(o->workdir, "rebuilt_run_summary.json");
    KILN_CHECK_IF(rc, out, !r.released || !r.run || !r.model || !r.summary, KILN_ERR_NOMEM,
                  "out of memory");
    if (o->data) {
        /* --data is read (every check of the trainer's loader, its digest) before anything is
         * pulled or written: a bad file is refused naming it, and leaves nothing. */
        kiln_dataset *ds = NULL;
        KILN_CHECK(rc, out, kiln_dataset_open(o->data, &ds));
        snprintf(r.data_sha, sizeof r.data_sha, "%s", ds->sha256);
        kiln_dataset_free(ds);
        KILN_CHECK_IF(rc, out, !(r.data = kiln_strdup(o->data)), KILN_ERR_NOMEM, "out of memory");
    }
    if (o->init) {
        uint8_t d[KILN_SHA256_BYTES];
        KILN_CHECK(rc, out, kiln_sha256_file(o->init, d));
    }
    KILN_CHECK(rc, out, kiln_mkdir_p(o->workdir));

    kiln_registry_pull_opts p = {
        .ref = o->ref, .trust = o->trust, .out = r.released, .state = o->state};
    kiln_registry_pulled got;
    KILN_CHECK(rc, out, kiln_registry_pull(o->client, &p, &got));
    snprintf(res->version, sizeof res->version, "%s", got.version);
    snprintf(res->digest, sizeof res->digest, "%s", got.digest);
    snprintf(r.line, sizeof r.line, "pulled %s@%s %s, signed by %s", got.model, got.version,
             got.digest, got.signed_by);
    done(&r);
    KILN_CHECK(rc, out, read_released(&r));
    const json_t *lin = json_object_get(r.card, "lineage");
    const char *ds_sha = NULL;
    KILN_CHECK(rc, out, check_lineage(&r, lin, &ds_sha));
    KILN_CHECK(rc, out, check_inputs(&r, lin, ds_sha));
    if (r.data_from[0])
        snprintf(r.line, sizeof r.line, "dataset sha256:%s %s, into '%s'", ds_sha, r.data_from,
                 r.data);
    else
        snprintf(r.line, sizeof r.line, "dataset '%s' is sha256:%s, as the lineage records", r.data,
                 ds_sha);
    done(&r);
    r.archive = kiln_asprintf("%s/%s-%s.kiln", o->workdir, res->model, res->version);
    KILN_CHECK_IF(rc, out, !r.archive, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, train(&r, lin));
    done(&r);
    KILN_CHECK(rc, out, export_pack(&r));
    done(&r);
    KILN_CHECK(rc, out, compare(&r));
    if (o->sign_key) KILN_CHECK(rc, out, record(&r, ds_sha));
out:
    json_decref(r.card);
    kiln_manifest_free(r.man);
    free(r.released), free(r.run), free(r.model), free(r.archive), free(r.summary), free(r.data);
    return rc;
}

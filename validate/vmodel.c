/* vmodel.c - a model directory as validation sees it: the file, its card and its weights
 * in the trainer's network (the reference the runtime is held to). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime.h"
#include "validate_int.h"

void kiln_vmodel_close(vmodel *m) {
    if (!m) return;
    free(m->dir);
    free(m->file);
    json_decref(m->card);
    kiln_tsmoe_free(m->net);
    kiln_model_free(m->rt);
    memset(m, 0, sizeof *m);
}

char *kiln_vmodel_path(const vmodel *m, const char *rel) {
    return kiln_path_join(m->dir, rel);
}

static kiln_err load_weights(vmodel *m, const kiln_st *st) {
    size_t np;
    const kiln_param *tab = kiln_tsmoe_param_table(m->net, &np);
    float *w = kiln_tsmoe_params(m->net);
    size_t nbf = 0;
    for (size_t i = 0; i < np; i++) {
        const kiln_param *p = &tab[i];
        const kiln_tensor *t = kiln_st_find(st, p->name);
        KILN_FAIL_IF(!t, KILN_ERR_FORMAT, "'%s': no tensor '%s'", m->file, p->name);
        bool ok = t->ndim == p->ndim;
        for (int d = 0; ok && d < p->ndim; d++)
            ok = t->shape[d] == p->shape[d];
        KILN_FAIL_IF(!ok, KILN_ERR_FORMAT, "'%s': tensor '%s' has the wrong shape", m->file,
                     p->name);
        KILN_FAIL_IF(t->dtype != KILN_F32 && t->dtype != KILN_BF16, KILN_ERR_FORMAT,
                     "'%s': tensor '%s' is %s, not F32 or BF16", m->file, p->name,
                     kiln_dtype_name(t->dtype));
        if (t->dtype == KILN_BF16 && (p->flags & KILN_PARAM_TRAINED)) nbf++;
        KILN_TRY(kiln_tensor_to_f32(t, w + p->offset));
    }
    KILN_FAIL_IF(kiln_st_count(st) != np, KILN_ERR_FORMAT,
                 "'%s': %zu tensors, but the config has %zu parameters", m->file, kiln_st_count(st),
                 np);
    m->bf16 = nbf > 0;
    return KILN_OK;
}

/* The card's "config" must be the model file's (kiln.config): a card that describes another
 * model (edited, or copied beside the wrong weights) would have validation vouch for what
 * it says. Compared key by key after both are parsed (so 1e-05 and 1e-5 agree); the first
 * key that differs is named with both values. */
static kiln_err card_config_matches(const vmodel *m, const char *card) {
    const json_t *cj = json_object_get(m->card, "config");
    KILN_FAIL_IF(!json_is_object(cj), KILN_ERR_FORMAT,
                 "'%s': \"config\" is missing or not an object", card);
    char *label = kiln_asprintf("%s: config", card);
    if (!label) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_model_config cc;
    kiln_err rc = kiln_model_config_parse(cj, label, &cc);
    free(label);
    if (rc) return rc;
    json_t *want = kiln_model_config_json(&m->cfg), *got = kiln_model_config_json(&cc);
    const char *key;
    json_t *wv;
    if (!want || !got) rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    json_object_foreach(want, key, wv) {
        if (rc) break;
        const json_t *gv = json_object_get(got, key);
        if (gv && json_equal(wv, gv)) continue;
        char *a = json_dumps(gv, JSON_ENCODE_ANY), *b = json_dumps(wv, JSON_ENCODE_ANY);
        rc = kiln_fail(KILN_ERR_FORMAT,
                       "'%s': config key '%s' is %s, but the model file '%s' has %s", card, key,
                       a ? a : "?", m->file, b ? b : "?");
        free(a);
        free(b);
    }
    json_decref(want);
    json_decref(got);
    return rc;
}

kiln_err kiln_vmodel_open(const char *path, vmodel *m) {
    memset(m, 0, sizeof *m);
    struct stat sb;
    if (stat(path, &sb)) return kiln_fail_errno(KILN_ERR_NOTFOUND, "'%s'", path);
    kiln_err rc = KILN_OK;
    kiln_st *st = NULL;
    if (S_ISDIR(sb.st_mode)) {
        m->dir = kiln_strdup(path);
        m->file = kiln_path_join(path, "model.safetensors");
    } else {
        m->dir = kiln_dirname(path);
        m->file = kiln_strdup(path);
    }
    KILN_CHECK_IF(rc, fail, !m->dir || !m->file, KILN_ERR_NOMEM, "out of memory");
    /* A directory's files under the rule of every model directory's reader (core/modeldir.c):
     * the weights, the runtime's copy of them and the card, none through a symlink. */
    KILN_CHECK(rc, fail,
               S_ISDIR(sb.st_mode) ? kiln_modeldir_st(m->dir, "model.safetensors", &st)
                                   : kiln_st_open(m->file, &st));
    KILN_CHECK(rc, fail, kiln_model_config_from_st(st, &m->cfg));
    KILN_CHECK(rc, fail, kiln_tsmoe_create(&m->cfg, VBATCH, &m->net));
    KILN_CHECK(rc, fail, load_weights(m, st));
    KILN_CHECK(rc, fail, kiln_model_open(S_ISDIR(sb.st_mode) ? m->dir : m->file, &m->rt));
    KILN_CHECK_IF(rc, fail, !!kiln_model_is_bf16(m->rt) != m->bf16, KILN_ERR_INTERNAL,
                  "'%s': the runtime and the trainer disagree on whether it is bf16", m->file);
    /* Work that cannot fit this process's memory limits is refused here, before the first
     * forward, naming the need and the limit (issue 16).
     * The runtime's forwards run in slices of 64 windows (kiln_vmodel_forward). */
    {
        char what[64];
        snprintf(what, sizeof what, "windows of seq_len %d", m->cfg.seq_len);
        char *task = kiln_asprintf("checking '%s'", m->file);
        KILN_CHECK_IF(rc, fail, !task, KILN_ERR_NOMEM, "out of memory");
        uint64_t bytes =
            kiln_tsmoe_bytes(m->net) + kiln_model_workspace_size(m->rt, 64, m->cfg.seq_len);
        rc = kiln_train_check_memory(bytes, 1, task, what, "raise the limit");
        free(task);
        if (rc) goto fail;
    }
    uint8_t d[KILN_SHA256_BYTES];
    kiln_st_sha256(st, d); /* the bytes checked above, not the path read again */
    kiln_hex(d, sizeof d, m->sha256);
    char *card = kiln_path_join(m->dir, "card.json");
    KILN_CHECK_IF(rc, fail, !card, KILN_ERR_NOMEM, "out of memory");
    struct stat cb;
    if (lstat(card, &cb) == 0) rc = kiln_modeldir_json(m->dir, "card.json", 64u << 20, &m->card);
    if (!rc && m->card) {
        /* The card's val_fraction places the held-out split: one that is there but not a
         * fraction is refused, never replaced by the default. */
        const json_t *lc = json_object_get(json_object_get(m->card, "lineage"), "config");
        const json_t *v = json_object_get(lc, "val_fraction");
        if (!json_is_object(m->card))
            rc = kiln_fail(KILN_ERR_FORMAT, "'%s': must be a JSON object", card);
        else if (v && !(json_is_number(v) && json_number_value(v) >= 0 && json_number_value(v) < 1))
            rc = kiln_fail(KILN_ERR_FORMAT,
                           "'%s': lineage.config.val_fraction must be a number in [0, 1)", card);
        else
            rc = card_config_matches(m, card);
    }
    free(card);
    if (rc) goto fail;
    kiln_st_close(st);
    return KILN_OK;
fail:
    kiln_st_close(st);
    kiln_vmodel_close(m);
    return rc;
}

kiln_err kiln_vmodel_trainer_forward(vmodel *m, const float *x, size_t n, float *y) {
    const size_t S = (size_t)m->cfg.seq_len, F = (size_t)m->cfg.n_features,
                 O = (size_t)m->cfg.n_outputs;
    const kiln_loss_opts eval = {0.0f, 0.0f, 0.0f}; /* capacity 0: dropless */
    for (size_t w = 0; w < n; w += VBATCH) {
        int b = (int)(n - w < VBATCH ? n - w : VBATCH);
        KILN_TRY(kiln_tsmoe_forward(m->net, x + w * S * F, NULL, b, &eval, NULL));
        memcpy(y + w * S * O, kiln_tsmoe_outputs(m->net), (size_t)b * S * O * sizeof *y);
    }
    return KILN_OK;
}

kiln_err kiln_vmodel_forward(vmodel *m, const float *x, size_t n, int S, float *y) {
    return kiln_vmodel_forward_margins(m, x, n, S, y, NULL);
}

kiln_err kiln_vmodel_forward_margins(vmodel *m, const float *x, size_t n, int S, float *y,
                                     float *margins) {
    const size_t F = (size_t)m->cfg.n_features, O = (size_t)m->cfg.n_outputs,
                 L = (size_t)m->cfg.n_layers;
    /* In slices, so that the runtime's workspace stays small for long validations. */
    for (size_t w = 0; w < n; w += 64) {
        int b = (int)(n - w < 64 ? n - w : 64);
        const float *xs = x + w * S * F;
        float *ys = y + w * S * O;
        KILN_TRY(margins ? kiln_runtime_forward_margins(m->rt, xs, b, S, ys, margins + w * S * L)
                         : kiln_model_forward(m->rt, xs, b, S, ys));
    }
    return KILN_OK;
}

kiln_err kiln_vmodel_stream_forward(vmodel *m, const float *x, size_t n, int S, float *y) {
    const size_t F = (size_t)m->cfg.n_features, O = (size_t)m->cfg.n_outputs;
    kiln_stream *s;
    KILN_TRY(kiln_stream_open(m->rt, &s));
    kiln_err rc = KILN_OK;
    for (size_t w = 0; !rc && w < n; w++) {
        kiln_stream_reset(s);
        for (size_t t = 0; !rc && t < (size_t)S; t++)
            rc = kiln_stream_push(s, x + (w * S + t) * F, y + (w * S + t) * O);
    }
    kiln_stream_free(s);
    return rc;
}

double kiln_vmodel_val_fraction(const vmodel *m) {
    const json_t *c = json_object_get(json_object_get(m->card, "lineage"), "config");
    const json_t *v = json_object_get(c, "val_fraction");
    if (json_is_number(v)) {
        double f = json_number_value(v);
        if (f >= 0 && f < 1) return f;
    }
    return KILN_VALIDATE_DEFAULT_VAL_FRACTION;
}

kiln_err kiln_vmodel_split(const vmodel *m, const kiln_dataset *ds, double val_fraction,
                           kiln_split *sp) {
    memset(sp, 0, sizeof *sp);
    const double vf = val_fraction >= 0 ? val_fraction : kiln_vmodel_val_fraction(m);
    KILN_FAIL_IF(vf <= 0, KILN_ERR_USAGE,
                 "validation fraction %g leaves no held-out rows of '%s' to validate on", vf,
                 ds->path);
    const json_t *cfg = json_object_get(json_object_get(m->card, "lineage"), "config");
    kiln_train_config tc;
    kiln_train_config_default(&tc);
    tc.model.seq_len = m->cfg.seq_len;
    tc.val_fraction = vf;
    static const char *const keys[] = {"val_from", "purge_rows", "purge_time"};
    for (size_t k = 0; k < KILN_ARRAY_LEN(keys); k++) {
        const json_t *v = json_object_get(cfg, keys[k]);
        if (!v) continue;
        json_t *one = json_pack("{s:O}", keys[k], v);
        kiln_err rc = one ? kiln_train_config_apply(&tc, one, "the model card's config")
                          : kiln_fail(KILN_ERR_NOMEM, "out of memory");
        json_decref(one);
        KILN_TRY(rc);
    }
    kiln_split_opts so;
    KILN_TRY(kiln_train_split_opts(&tc, &so));
    return kiln_dataset_split_ex(ds, &so, sp);
}

json_t *kiln_vsplit_json(const kiln_split *sp) {
    json_t *j = json_pack("{s:I,s:I,s:I}", "train_end", (json_int_t)sp->train_end, "val_begin",
                          (json_int_t)sp->val_begin, "val_end", (json_int_t)sp->val_end);
    if (!j || !sp->n_ranges) return j;
    json_t *a = json_array();
    for (size_t g = 0; a && g < sp->n_ranges; g++) {
        const kiln_split_range *r = &sp->ranges[g];
        if (json_array_append_new(a, json_pack("[I,I,I,I]", (json_int_t)r->train_begin,
                                               (json_int_t)r->train_end, (json_int_t)r->val_begin,
                                               (json_int_t)r->val_end))) {
            json_decref(a);
            a = NULL;
        }
    }
    if (!a || json_object_set_new(j, "ranges", a)) {
        json_decref(j);
        return NULL;
    }
    return j;
}

kiln_err kiln_vmodel_check_data(const vmodel *m, const kiln_dataset *ds) {
    KILN_FAIL_IF(
        ds->n_features != m->cfg.n_features || ds->n_outputs != m->cfg.n_outputs, KILN_ERR_CONFIG,
        "'%s' has %d features and %d targets, but model '%s' takes %d and predicts %d", ds->path,
        ds->n_features, ds->n_outputs, m->file, m->cfg.n_features, m->cfg.n_outputs);
    return KILN_OK;
}

void kiln_vgather(const kiln_dataset *ds, const size_t *starts, size_t n, int S, float *x,
                  float *y) {
    const size_t F = (size_t)ds->n_features, O = (size_t)ds->n_outputs, s = (size_t)S;
    for (size_t b = 0; b < n; b++) {
        memcpy(x + b * s * F, ds->features + starts[b] * F, s * F * sizeof *x);
        memcpy(y + b * s * O, ds->targets + starts[b] * O, s * O * sizeof *y);
    }
}

double kiln_vmse(const float *y, const float *t, size_t count) {
    double s = 0;
    for (size_t i = 0; i < count; i++) {
        double d = (double)y[i] - (double)t[i];
        s += d * d;
    }
    return count ? s / (double)count : 0;
}

/* ckpt.c - checkpoints: parameters, AdamW moments and everything a continuation needs,
 * in one safetensors file written atomically, with a digest of the tensor data so that a
 * torn or corrupted file is recognised and skipped on resume. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "train_int.h"

typedef struct {
    char name[72];
    const float *data;
    const kiln_param *p;
} centry;

static int cmp_centry(const void *a, const void *b) {
    return strcmp(((const centry *)a)->name, ((const centry *)b)->name);
}

static json_t *state_json(const kiln_train_state *s) {
    json_t *ls = kiln_spike_json(&s->loss_spike), *gs = kiln_spike_json(&s->gnorm_spike);
    if (!ls || !gs) {
        json_decref(ls);
        json_decref(gs);
        return NULL;
    }
    return json_pack("{s:I,s:I,s:i,s:o,s:o}", "step", (json_int_t)s->step, "updates",
                     (json_int_t)s->updates, "bad_streak", s->bad_streak, "loss_spike", ls,
                     "grad_norm_spike", gs);
}

kiln_err kiln_ckpt_write(const char *path, const kiln_param *tab, size_t count, const float *params,
                         const float *m, const float *v, const kiln_ckpt_meta *meta) {
    kiln_err rc = KILN_OK;
    kiln_st_writer *w = NULL;
    char *mtext = NULL, *ttext = NULL, *stext = NULL, *ntext = NULL;
    json_t *sj = NULL;
    centry *e = kiln_calloc(3 * count + 1, sizeof *e);
    if (!e) return KILN_ERR_NOMEM;
    size_t n = 0;
    for (size_t i = 0; i < count; i++) {
        snprintf(e[n].name, sizeof e[n].name, "%s", tab[i].name);
        e[n].data = params + tab[i].offset;
        e[n++].p = &tab[i];
        if (m && (tab[i].flags & KILN_PARAM_TRAINED)) {
            snprintf(e[n].name, sizeof e[n].name, "m.%s", tab[i].name);
            e[n].data = m + tab[i].offset;
            e[n++].p = &tab[i];
            snprintf(e[n].name, sizeof e[n].name, "v.%s", tab[i].name);
            e[n].data = v + tab[i].offset;
            e[n++].p = &tab[i];
        }
    }
    /* The writer orders tensors by name too, so this is the data section's order. */
    qsort(e, n, sizeof *e, cmp_centry);
    crypto_hash_sha256_state hs;
    crypto_hash_sha256_init(&hs);
    for (size_t i = 0; i < n; i++)
        crypto_hash_sha256_update(&hs, (const unsigned char *)e[i].data,
                                  e[i].p->numel * sizeof(float));
    uint8_t dig[KILN_SHA256_BYTES];
    char hex[KILN_SHA256_HEX], num[32];
    crypto_hash_sha256_final(&hs, dig);
    kiln_hex(dig, sizeof dig, hex);

    KILN_CHECK(rc, out, kiln_st_writer_new(&w));
    for (size_t i = 0; i < n; i++)
        KILN_CHECK(
            rc, out,
            kiln_st_writer_add(w, e[i].name, KILN_F32, e[i].p->ndim, e[i].p->shape, e[i].data));
    mtext = kiln_model_config_text(&meta->cfg->model);
    ttext = kiln_train_config_run_text(meta->cfg);
    sj = state_json(meta->state);
    stext = sj ? kiln_json_canonical(sj) : NULL;
    KILN_CHECK_IF(rc, out, !mtext || !ttext || !stext, KILN_ERR_NOMEM, "out of memory writing '%s'",
                  path);
    snprintf(num, sizeof num, "%ld", meta->state->step);
    KILN_CHECK(rc, out, kiln_st_writer_meta(w, "kiln.config", mtext));
    KILN_CHECK(rc, out, kiln_st_writer_meta(w, "kiln.train_config", ttext));
    KILN_CHECK(rc, out, kiln_st_writer_meta(w, "kiln.step", num));
    KILN_CHECK(rc, out, kiln_st_writer_meta(w, "kiln.state", stext));
    KILN_CHECK(rc, out, kiln_st_writer_meta(w, "kiln.dataset_sha256", meta->dataset_sha256));
    KILN_CHECK(rc, out, kiln_st_writer_meta(w, "kiln.run_id", meta->run_id));
    KILN_CHECK(rc, out, kiln_st_writer_meta(w, "kiln.version", kiln_version()));
    KILN_CHECK(rc, out,
               kiln_st_writer_meta(w, "kiln.numerics",
                                   meta->cfg->device == KILN_TRAIN_CUDA ? KILN_NUMERICS_CUDA
                                                                        : KILN_NUMERICS_CPU));
    /* The instruction set this host's products ran on: informational (it cannot change a
     * bit), so it stays here and out of the card, whose bytes must not depend on the host. */
    if (meta->cfg->device != KILN_TRAIN_CUDA)
        KILN_CHECK(rc, out,
                   kiln_st_writer_meta(w, "kiln.gemm_isa", kiln_gemm_isa_name(kiln_gemm_isa_used())));
    KILN_CHECK(rc, out, kiln_st_writer_meta(w, "kiln.data_sha256", hex));
    KILN_CHECK(rc, out, kiln_st_writer_meta(w, "kiln.optimizer", m ? "adamw" : "sgd"));
    if (meta->target_mean) {
        ntext =
            kiln_target_norm_text(meta->cfg->model.n_outputs, meta->target_mean, meta->target_std);
        KILN_CHECK_IF(rc, out, !ntext, KILN_ERR_NOMEM, "out of memory writing '%s'", path);
        KILN_CHECK(rc, out, kiln_st_writer_meta(w, "kiln.target_norm", ntext));
    }
    rc = kiln_st_writer_write(w, path);
out:
    free(mtext);
    free(ttext);
    free(stext);
    free(ntext);
    json_decref(sj);
    kiln_st_writer_free(w);
    free(e);
    return rc;
}

void kiln_ckpt_release(kiln_ckpt *ck) {
    kiln_st_close(ck->st);
    ck->st = NULL;
    free(ck->target_mean);
    free(ck->target_std);
    ck->target_mean = ck->target_std = NULL;
}

static kiln_err meta_long(const kiln_st *st, const char *key, long *out) {
    const char *s = kiln_st_meta(st, key);
    char *end;
    KILN_FAIL_IF(!s, KILN_ERR_FORMAT, "'%s': no %s in __metadata__", kiln_st_path(st), key);
    errno = 0;
    long x = strtol(s, &end, 10);
    KILN_FAIL_IF(errno || end == s || *end || x < 0, KILN_ERR_FORMAT, "'%s': bad %s '%s'",
                 kiln_st_path(st), key, s);
    *out = x;
    return KILN_OK;
}

kiln_err kiln_ckpt_open(const char *path, kiln_ckpt *ck) {
    memset(ck, 0, sizeof *ck);
    KILN_TRY(kiln_st_open(path, &ck->st));
    const kiln_st *st = ck->st;
    /* The data section is contiguous from the first tensor's bytes (kiln_st_open checked
     * that the offsets cover it without gaps). */
    const unsigned char *lo = NULL;
    size_t total = 0;
    for (size_t i = 0; i < kiln_st_count(st); i++) {
        const kiln_tensor *t = kiln_st_at(st, i);
        if (t->nbytes && (!lo || (const unsigned char *)t->data < lo)) lo = t->data;
        total += t->nbytes;
    }
    uint8_t dig[KILN_SHA256_BYTES];
    char hex[KILN_SHA256_HEX];
    kiln_sha256(lo ? lo : (const unsigned char *)"", total, dig);
    kiln_hex(dig, sizeof dig, hex);
    const char *want = kiln_st_meta(st, "kiln.data_sha256");
    KILN_FAIL_IF(!want, KILN_ERR_VERIFY, "'%s': no kiln.data_sha256 in __metadata__", path);
    KILN_FAIL_IF(strcmp(want, hex), KILN_ERR_VERIFY,
                 "'%s': tensor data digest mismatch (corrupted checkpoint)", path);

    const char *tc = kiln_st_meta(st, "kiln.train_config"),
               *ds = kiln_st_meta(st, "kiln.dataset_sha256"),
               *rid = kiln_st_meta(st, "kiln.run_id"), *stt = kiln_st_meta(st, "kiln.state");
    KILN_FAIL_IF(!tc || !ds || !rid || !stt, KILN_ERR_FORMAT,
                 "'%s': checkpoint metadata incomplete", path);
    KILN_FAIL_IF(strlen(ds) != 64 || strlen(rid) >= sizeof ck->run_id, KILN_ERR_FORMAT,
                 "'%s': bad checkpoint metadata", path);
    memcpy(ck->dataset_sha256, ds, 65);
    memcpy(ck->run_id, rid, strlen(rid) + 1);
    json_t *j;
    KILN_TRY(kiln_json_parse(tc, strlen(tc), path, &j));
    kiln_train_config_default(&ck->cfg);
    char label[600];
    snprintf(label, sizeof label, "'%s' kiln.train_config", path);
    kiln_err rc = kiln_train_config_apply(&ck->cfg, j, label);
    json_decref(j);
    KILN_TRY(rc);
    KILN_TRY(kiln_train_config_check(&ck->cfg, label));
    KILN_TRY(meta_long(st, "kiln.step", &ck->state.step));
    const int O = ck->cfg.model.n_outputs > 0 ? ck->cfg.model.n_outputs : 1;
    ck->target_mean = kiln_calloc((size_t)O, sizeof(float));
    ck->target_std = kiln_calloc((size_t)O, sizeof(float));
    if (!ck->target_mean || !ck->target_std) return KILN_ERR_NOMEM;
    KILN_TRY(kiln_target_norm_read(st, O, ck->target_mean, ck->target_std, &ck->has_target_norm));
    KILN_TRY(kiln_json_parse(stt, strlen(stt), path, &j));
    json_t *up = json_object_get(j, "updates"), *bs = json_object_get(j, "bad_streak");
    rc = KILN_OK;
    if (!json_is_integer(up) || !json_is_integer(bs) || json_integer_value(up) < 0 ||
        json_integer_value(bs) < 0)
        rc = kiln_fail(KILN_ERR_FORMAT, "'%s': bad kiln.state", path);
    if (!rc) {
        ck->state.updates = (long)json_integer_value(up);
        ck->state.bad_streak = (int)json_integer_value(bs);
        rc = kiln_spike_from_json(json_object_get(j, "loss_spike"), path, &ck->state.loss_spike);
    }
    if (!rc)
        rc = kiln_spike_from_json(json_object_get(j, "grad_norm_spike"), path,
                                  &ck->state.gnorm_spike);
    json_decref(j);
    return rc;
}

kiln_err kiln_ckpt_load(const kiln_ckpt *ck, const kiln_param *tab, size_t count, float *params,
                        float *m, float *v) {
    for (size_t i = 0; i < count; i++) {
        const kiln_tensor *t;
        KILN_TRY(kiln_st_expect(ck->st, tab[i].name, KILN_F32, tab[i].ndim, tab[i].shape, &t));
        memcpy(params + tab[i].offset, t->data, t->nbytes);
        if (!m || !(tab[i].flags & KILN_PARAM_TRAINED)) continue;
        char name[72];
        snprintf(name, sizeof name, "m.%s", tab[i].name);
        KILN_TRY(kiln_st_expect(ck->st, name, KILN_F32, tab[i].ndim, tab[i].shape, &t));
        memcpy(m + tab[i].offset, t->data, t->nbytes);
        snprintf(name, sizeof name, "v.%s", tab[i].name);
        KILN_TRY(kiln_st_expect(ck->st, name, KILN_F32, tab[i].ndim, tab[i].shape, &t));
        memcpy(v + tab[i].offset, t->data, t->nbytes);
    }
    return KILN_OK;
}

kiln_err kiln_ckpt_prune(const char *run_dir, int keep, long also) {
    if (keep <= 0) return KILN_OK;
    long *steps;
    size_t n;
    KILN_TRY(kiln_run_ckpt_list(run_dir, &steps, &n));
    kiln_err rc = KILN_OK;
    for (size_t i = 0; i + (size_t)keep < n && !rc; i++) {
        if (steps[i] == also) continue;
        char *p = kiln_run_ckpt_path(run_dir, steps[i]);
        if (!p)
            rc = KILN_ERR_NOMEM;
        else if (unlink(p) != 0 && errno != ENOENT)
            rc = kiln_fail_errno(KILN_ERR_IO, "cannot delete '%s'", p);
        free(p);
    }
    free(steps);
    return rc;
}

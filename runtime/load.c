/* load.c - open a frozen kiln-tsmoe/1 model: find the file, check its config and every
 * tensor against docs/model.md's table, and copy the weights into two aligned blocks
 * (matrices as stored, f32 or bf16; vectors as f32) so that the file can be closed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime_int.h"

#define ALIGN_ELEMS 32 /* every tensor starts on a 64-byte boundary (bf16: 32 * 2 bytes) */

static size_t round_up(size_t n, size_t a) {
    return (n + a - 1) / a * a;
}

/* Biases, gains and the input standardisation are vectors, kept in f32; the rest are
 * matrices, kept as stored. */
static bool is_vector(const kiln_param *p) {
    size_t n = strlen(p->name);
    return p->ndim == 1 || (n >= 4 && !strcmp(p->name + n - 4, "bias"));
}

static bool is_input_norm(const kiln_param *p) {
    return !strncmp(p->name, "norm.in_", 8);
}

static void shape_text(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t o = 0;
    buf[0] = 0;
    for (int d = 0; d < ndim && o + 24 < len; d++)
        o += (size_t)snprintf(buf + o, len - o, d ? ",%lld" : "%lld", (long long)shape[d]);
}

/* Every tensor of the table present with its shape and an allowed dtype, nothing else in
 * the file. The weights' dtype is that of embed.weight; the others must follow it. */
static kiln_err check_tensors(const kiln_st *st, const kiln_param *tab, size_t n, bool *bf16) {
    const char *path = kiln_st_path(st);
    const kiln_tensor *embed = kiln_st_find(st, "embed.weight");
    *bf16 = embed && embed->dtype == KILN_BF16;
    const kiln_dtype want = *bf16 ? KILN_BF16 : KILN_F32;
    for (size_t i = 0; i < n; i++) {
        const kiln_tensor *t = kiln_st_find(st, tab[i].name);
        if (!t) {
            char s[128];
            shape_text(s, sizeof s, tab[i].ndim, tab[i].shape);
            return kiln_fail(KILN_ERR_FORMAT, "'%s': missing tensor '%s' (expected %s [%s])", path,
                             tab[i].name, kiln_dtype_name(want), s);
        }
        if (t->dtype != KILN_F32 && t->dtype != KILN_BF16)
            return kiln_fail(KILN_ERR_FORMAT,
                             "'%s': tensor '%s' has dtype %s, expected F32 or BF16", path,
                             tab[i].name, kiln_dtype_name(t->dtype));
        if (!is_input_norm(&tab[i]) && t->dtype != want)
            return kiln_fail(
                KILN_ERR_FORMAT,
                "'%s': tensor '%s' has dtype %s, expected %s like embed.weight (weights are "
                "all F32 or all BF16)",
                path, tab[i].name, kiln_dtype_name(t->dtype), kiln_dtype_name(want));
        KILN_TRY(kiln_st_expect(st, tab[i].name, t->dtype, tab[i].ndim, tab[i].shape, NULL));
    }
    for (size_t i = 0; i < kiln_st_count(st); i++) {
        const kiln_tensor *t = kiln_st_at(st, i);
        if (kiln_param_find(tab, n, t->name) < 0) {
            char s[128];
            shape_text(s, sizeof s, t->ndim, t->shape);
            return kiln_fail(KILN_ERR_FORMAT,
                             "'%s': extra tensor '%s' [%s] is not part of this kiln-tsmoe/1 config",
                             path, t->name, s);
        }
    }
    return KILN_OK;
}

/* Copy one tensor into the blocks, refusing non-finite values. */
static kiln_err load_tensor(kiln_model *m, const kiln_st *st, const kiln_param *p, float *vdst,
                            void *wdst) {
    const kiln_tensor *t = kiln_st_find(st, p->name);
    if (vdst) {
        KILN_TRY(kiln_tensor_to_f32(t, vdst));
        for (size_t i = 0; i < p->numel; i++)
            KILN_FAIL_IF(!isfinite(vdst[i]), KILN_ERR_NUMERIC,
                         "'%s': tensor '%s' element %zu is not finite", m->path, p->name, i);
        return KILN_OK;
    }
    memcpy(wdst, t->data, t->nbytes);
    if (m->bf16) {
        const uint16_t *w = wdst;
        for (size_t i = 0; i < p->numel; i++)
            KILN_FAIL_IF((w[i] & 0x7f80u) == 0x7f80u, KILN_ERR_NUMERIC,
                         "'%s': tensor '%s' element %zu is not finite", m->path, p->name, i);
    } else {
        const float *w = wdst;
        for (size_t i = 0; i < p->numel; i++)
            KILN_FAIL_IF(!isfinite(w[i]), KILN_ERR_NUMERIC,
                         "'%s': tensor '%s' element %zu is not finite", m->path, p->name, i);
    }
    return KILN_OK;
}

/* Point the model's views at the loaded tensors. */
static void bind(kiln_model *m, const kiln_param *tab, size_t n, const size_t *at) {
    for (size_t i = 0; i < n; i++) {
        const kiln_param *p = &tab[i];
        const void *w = (const char *)m->wblock + at[i] * m->wsize;
        const float *v = m->vblock + at[i];
        const void *ptr = is_vector(p) ? (const void *)v : w;
        int l = -1;
        char field[64] = "";
        if (sscanf(p->name, "blocks.%d.%63s", &l, field) == 2) {
            kiln_rt_layer *L = &m->layers[l];
            if (!strcmp(field, "attn_norm.weight"))
                L->attn_norm = ptr;
            else if (!strcmp(field, "attn.qkv.weight"))
                L->qkv_w = ptr;
            else if (!strcmp(field, "attn.qkv.bias"))
                L->qkv_b = ptr;
            else if (!strcmp(field, "attn.out.weight"))
                L->out_w = ptr;
            else if (!strcmp(field, "attn.out.bias"))
                L->out_b = ptr;
            else if (!strcmp(field, "ffn_norm.weight"))
                L->ffn_norm = ptr;
            else if (!strcmp(field, "moe.router.weight"))
                L->router_w = ptr;
            else if (!strcmp(field, "ffn.fc.weight") || !strcmp(field, "moe.fc.weight"))
                L->fc_w = ptr;
            else if (!strcmp(field, "ffn.fc.bias") || !strcmp(field, "moe.fc.bias"))
                L->fc_b = ptr;
            else if (!strcmp(field, "ffn.proj.weight") || !strcmp(field, "moe.proj.weight"))
                L->proj_w = ptr;
            else if (!strcmp(field, "ffn.proj.bias") || !strcmp(field, "moe.proj.bias"))
                L->proj_b = ptr;
            continue;
        }
        if (!strcmp(p->name, "norm.in_mean"))
            m->in_mean = ptr;
        else if (!strcmp(p->name, "norm.in_std"))
            m->in_std = ptr;
        else if (!strcmp(p->name, "embed.weight"))
            m->embed_w = ptr;
        else if (!strcmp(p->name, "embed.bias"))
            m->embed_b = ptr;
        else if (!strcmp(p->name, "final_norm.weight"))
            m->final_norm = ptr;
        else if (!strcmp(p->name, "head.weight"))
            m->head_w = ptr;
        else if (!strcmp(p->name, "head.bias"))
            m->head_b = ptr;
    }
}

static kiln_err load(kiln_model *m, const kiln_st *st) {
    KILN_TRY(kiln_model_config_from_st(st, &m->cfg));
    const kiln_model_config *c = &m->cfg;
    kiln_param *tab = NULL;
    size_t n, total, *at = NULL;
    kiln_err rc;
    KILN_CHECK(rc, out, kiln_param_table(c, &tab, &n, &total));
    KILN_CHECK(rc, out, check_tensors(st, tab, n, &m->bf16));
    m->wsize = m->bf16 ? 2 : 4;
    /* Lay out both blocks: each tensor aligned, vectors then the H slopes. */
    at = kiln_calloc(n, sizeof *at);
    KILN_CHECK_IF(rc, out, !at, KILN_ERR_NOMEM, "out of memory");
    size_t wn = 0, vn = 0;
    for (size_t i = 0; i < n; i++) {
        size_t *cur = is_vector(&tab[i]) ? &vn : &wn;
        at[i] = *cur;
        *cur = round_up(*cur + tab[i].numel, ALIGN_ELEMS);
        if (!is_vector(&tab[i])) {
            size_t one = tab[i].ndim == 3 ? tab[i].numel / (size_t)tab[i].shape[0] : tab[i].numel;
            m->max_matrix = one > m->max_matrix ? one : m->max_matrix;
            m->weight_bytes += tab[i].numel * m->wsize;
        }
    }
    size_t slopes_at = vn;
    vn += (size_t)c->n_heads;
    m->wcount = wn;
    m->vcount = vn;
    m->wblock = aligned_alloc(64, round_up(wn * m->wsize, 64));
    m->vblock = aligned_alloc(64, round_up(vn * sizeof(float), 64));
    m->layers = kiln_calloc((size_t)c->n_layers, sizeof *m->layers);
    KILN_CHECK_IF(rc, out, !m->wblock || !m->vblock || !m->layers, KILN_ERR_NOMEM,
                  "'%s': out of memory for %zu bytes of weights", m->path, wn * m->wsize);
    for (size_t i = 0; i < n; i++) {
        bool vec = is_vector(&tab[i]);
        KILN_CHECK(rc, out,
                   load_tensor(m, st, &tab[i], vec ? m->vblock + at[i] : NULL,
                               vec ? NULL : (char *)m->wblock + at[i] * m->wsize));
    }
    bind(m, tab, n, at);
    for (int f = 0; f < c->n_features; f++)
        KILN_CHECK_IF(rc, out, !(m->in_std[f] > 0), KILN_ERR_FORMAT,
                      "'%s': tensor 'norm.in_std' element %d is %g, must be positive", m->path, f,
                      (double)m->in_std[f]);
    m->slopes = m->vblock + slopes_at;
    for (int h = 0; h < c->n_heads; h++)
        m->slopes[h] = (float)exp2(-8.0 * (h + 1) / c->n_heads);
    m->attn_scale = (float)(1.0 / sqrt((double)(c->d_model / c->n_heads)));
out:
    free(at);
    free(tab);
    return rc;
}

KILN_API kiln_err kiln_model_open(const char *path, kiln_model **out) {
    return kiln_model_open_opts(path, NULL, out);
}

KILN_API kiln_err kiln_model_open_opts(const char *path, const kiln_model_opts *opts,
                                       kiln_model **out) {
    *out = NULL;
    const int device = opts ? opts->device : KILN_DEVICE_CPU;
    KILN_FAIL_IF(device < KILN_DEVICE_CPU, KILN_ERR_USAGE, "kiln_model_open: bad device %d",
                 device);
    KILN_FAIL_IF(!path || !*path, KILN_ERR_USAGE, "no model path given");
    struct stat sb;
    bool dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    kiln_model *m = kiln_calloc(1, sizeof *m);
    if (!m) return KILN_ERR_NOMEM;
    m->path = dir ? kiln_path_join(path, "model.safetensors") : kiln_strdup(path);
    if (!m->path) {
        free(m);
        return KILN_ERR_NOMEM;
    }
    kiln_st *st = NULL;
    /* A directory's model.safetensors under the rule of every model directory's reader (no
     * symlink to a file elsewhere); a file named outright is what the caller named. */
    kiln_err rc =
        dir ? kiln_modeldir_st(path, "model.safetensors", &st) : kiln_st_open(m->path, &st);
    if (rc == KILN_OK) rc = load(m, st);
    kiln_st_close(st);
    m->device = KILN_DEVICE_CPU;
    if (rc == KILN_OK && device != KILN_DEVICE_CPU) {
        rc = kiln_rt_dev_open(m, device);
        if (rc) kiln_errprefix(rc, "'%s': ", m->path);
    }
    if (rc != KILN_OK) {
        kiln_model_free(m);
        return rc;
    }
    *out = m;
    return KILN_OK;
}

KILN_API int kiln_model_device(const kiln_model *m) {
    return m->device;
}

KILN_API void kiln_model_free(kiln_model *m) {
    if (!m) return;
    kiln_rt_dev_free(m->dev);
    free(m->wblock);
    free(m->vblock);
    free(m->layers);
    free(m->path);
    free(m);
}

KILN_API const kiln_model_config *kiln_model_config_get(const kiln_model *m) {
    return &m->cfg;
}

KILN_API int kiln_model_is_bf16(const kiln_model *m) {
    return m->bf16;
}

/* layout.c - the plan of the kiln-tsmoe/1 network that the CPU network (model.c) and the
 * device network (model_cuda.c) share, so that the two cannot drift: where each parameter's
 * view points, which activations there are and how large, the size and capacity limits, and
 * how the loss is put together. */
#include <math.h>
#include <stdio.h>

#include "train_int.h"

static float *find(const kiln_param *table, size_t n_params, float *base, const char *fmt, int l) {
    char name[64];
    snprintf(name, sizeof name, fmt, l);
    long i = kiln_param_find(table, n_params, name);
    return i < 0 ? NULL : base + table[i].offset;
}

void kiln_tsmoe_view_point(const kiln_model_config *cfg, const kiln_param *table, size_t n_params,
                           float *base, kiln_tsmoe_view *v) {
#define FIND(fmt, l) find(table, n_params, base, (fmt), (l))
    v->in_mean = FIND("norm.in_mean", 0);
    v->in_std = FIND("norm.in_std", 0);
    v->embed_w = FIND("embed.weight", 0);
    v->embed_b = FIND("embed.bias", 0);
    v->final_norm = FIND("final_norm.weight", 0);
    v->head_w = FIND("head.weight", 0);
    v->head_b = FIND("head.bias", 0);
    const char *ffn = cfg->n_experts ? "moe" : "ffn";
    for (int l = 0; l < cfg->n_layers; l++) {
        kiln_tsmoe_layer_view *lv = &v->layers[l];
        char fmt[64];
        lv->attn_norm = FIND("blocks.%d.attn_norm.weight", l);
        lv->qkv_w = FIND("blocks.%d.attn.qkv.weight", l);
        lv->qkv_b = FIND("blocks.%d.attn.qkv.bias", l);
        lv->out_w = FIND("blocks.%d.attn.out.weight", l);
        lv->out_b = FIND("blocks.%d.attn.out.bias", l);
        lv->ffn_norm = FIND("blocks.%d.ffn_norm.weight", l);
        snprintf(fmt, sizeof fmt, "blocks.%%d.%s.fc.weight", ffn);
        lv->fc_w = FIND(fmt, l);
        snprintf(fmt, sizeof fmt, "blocks.%%d.%s.fc.bias", ffn);
        lv->fc_b = FIND(fmt, l);
        snprintf(fmt, sizeof fmt, "blocks.%%d.%s.proj.weight", ffn);
        lv->proj_w = FIND(fmt, l);
        snprintf(fmt, sizeof fmt, "blocks.%%d.%s.proj.bias", ffn);
        lv->proj_b = FIND(fmt, l);
        lv->router = cfg->n_experts ? FIND("blocks.%d.moe.router.weight", l) : NULL;
    }
#undef FIND
}

void kiln_tsmoe_carve_acts(const kiln_model_config *k, int max_batch, kiln_carver *c,
                           kiln_tsmoe_acts *m) {
    const size_t N = (size_t)max_batch * k->seq_len, D = k->d_model, E = k->n_experts, K = k->top_k;
    const size_t Fh = k->d_ff, R = E ? N * K : N;
    const size_t A = (size_t)max_batch * k->n_heads * k->seq_len * k->attn_window;
    for (int l = 0; l < k->n_layers; l++) {
        kiln_tsmoe_layer_acts *a = &m->layers[l];
        a->res = kiln_carve_f32(c, N * D);
        a->u1 = kiln_carve_f32(c, N * D);
        a->rstd1 = kiln_carve_f32(c, N);
        a->qkv = kiln_carve_f32(c, N * 3 * D);
        a->att = kiln_carve_f32(c, A);
        a->ao = kiln_carve_f32(c, N * D);
        a->mid = kiln_carve_f32(c, N * D);
        a->u2 = kiln_carve_f32(c, N * D);
        a->rstd2 = kiln_carve_f32(c, N);
        a->hpre = kiln_carve_f32(c, R * Fh);
        a->hact = kiln_carve_f32(c, R * Fh);
        if (E) {
            a->xg = kiln_carve_f32(c, N * K * D);
            a->yg = kiln_carve_f32(c, N * K * D);
            a->logits = kiln_carve_f32(c, N * E);
            a->probs = kiln_carve_f32(c, N * E);
            a->lse = kiln_carve_f32(c, N);
            a->gates = kiln_carve_f32(c, N * K);
            a->idx = kiln_carve_i32(c, N * K);
            a->pos = kiln_carve_i32(c, N * K);
            a->rows = kiln_carve_i32(c, N * K);
            a->offsets = kiln_carve_i32(c, E + 1);
        }
    }
    m->xs = kiln_carve_f32(c, N * k->n_features);
    m->hL = kiln_carve_f32(c, N * D);
    m->uf = kiln_carve_f32(c, N * D);
    m->rstdf = kiln_carve_f32(c, N);
    m->y = kiln_carve_f32(c, N * k->n_outputs);
    m->tmp = kiln_carve_f32(c, N * D);
    m->dres = kiln_carve_f32(c, N * D);
    m->du = kiln_carve_f32(c, N * D);
    m->dao = kiln_carve_f32(c, N * D);
    m->dqkv = kiln_carve_f32(c, N * 3 * D);
    m->datt = kiln_carve_f32(c, A);
    m->dh1 = kiln_carve_f32(c, R * Fh);
    m->dh2 = kiln_carve_f32(c, R * Fh);
    m->dxg = E ? kiln_carve_f32(c, N * K * D) : NULL;
    m->dyg = E ? kiln_carve_f32(c, N * K * D) : NULL;
    m->dgates = E ? kiln_carve_f32(c, N * K) : NULL;
    m->dlogits = E ? kiln_carve_f32(c, N * E) : NULL;
    m->dy = kiln_carve_f32(c, N * k->n_outputs);
    m->duf = kiln_carve_f32(c, N * D);
}

kiln_err kiln_tsmoe_check_batch(const kiln_model_config *cfg, int max_batch) {
    KILN_TRY(kiln_model_config_check(cfg, "model config"));
    KILN_FAIL_IF(max_batch < 1, KILN_ERR_CONFIG,
                 "'model config': max_batch must be at least 1 (is %d)", max_batch);
    /* Every activation index must fit comfortably: tokens times the widest row. */
    double widest = (double)cfg->d_ff * (cfg->top_k ? cfg->top_k : 1) + 3.0 * cfg->d_model +
                    (double)cfg->n_heads * cfg->attn_window;
    KILN_FAIL_IF((double)max_batch * cfg->seq_len * widest > 2e9, KILN_ERR_CONFIG,
                 "'model config': max_batch %d times seq_len %d is too large for this model",
                 max_batch, cfg->seq_len);
    return KILN_OK;
}

kiln_loss_opts kiln_tsmoe_loss_opts(const kiln_loss_opts *opts) {
    kiln_loss_opts o = {0.01f, 0.001f, 0.0f};
    if (opts) o = *opts;
    return o;
}

int kiln_tsmoe_capacity(const kiln_model_config *cfg, int N, float capacity_factor) {
    const int E = cfg->n_experts, K = cfg->top_k;
    int capacity = 0;
    if (E && capacity_factor > 0) {
        double cap = ceil((double)capacity_factor * N * K / E);
        capacity = cap > (double)N * K ? N * K : (int)cap;
        if (capacity < 1) capacity = 1;
    }
    return capacity;
}

kiln_loss kiln_tsmoe_loss_total(double mse, double lb_sum, double z_sum, const kiln_loss_opts *o) {
    kiln_loss out = {0, mse, lb_sum, z_sum};
    out.loss = mse + (double)o->aux_loss_coef * lb_sum + (double)o->z_loss_coef * z_sum;
    return out;
}

/* model.c - the kiln-tsmoe/1 network being trained: parameters, gradients and activations
 * each in one block (views into it, as llm.c's malloc_and_point_parameters), forward and
 * backward as MODEL.md, built from the ops of kernels.h. Nothing here allocates after
 * kiln_tsmoe_create. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "kernels.h"
#include "train_int.h"

struct kiln_tsmoe {
    kiln_model_config cfg;
    int max_batch;
    kiln_param *table;
    size_t n_params, numel;
    float *params, *grads; /* [numel] each */
    kiln_tsmoe_view p, g;
    void *act_block;
    size_t act_bytes;
    kiln_tsmoe_acts act;  /* views into act_block */
    const float *targets; /* [N,O], the caller's, until backward */
    /* last forward */
    int B;
    bool have_targets;
    kiln_loss_opts opts;
    /* stats */
    kiln_tsmoe_stats stats;
    float *st_attn, *st_router, *st_load, *st_overflow, *st_rms;
};

/* The activation block holds the plan's buffers (layout.c), then the stats. */
static void carve_acts(kiln_tsmoe *m, kiln_carver *c) {
    kiln_tsmoe_carve_acts(&m->cfg, m->max_batch, c, &m->act);
    const size_t L = (size_t)m->cfg.n_layers, Es = m->cfg.n_experts ? m->cfg.n_experts : 1;
    m->st_attn = kiln_carve_f32(c, L);
    m->st_router = kiln_carve_f32(c, L);
    m->st_load = kiln_carve_f32(c, L * Es);
    m->st_overflow = kiln_carve_f32(c, L);
    m->st_rms = kiln_carve_f32(c, L);
}

kiln_err kiln_tsmoe_create(const kiln_model_config *cfg, int max_batch, kiln_tsmoe **out) {
    *out = NULL;
    KILN_TRY(kiln_tsmoe_check_batch(cfg, max_batch));
    kiln_tsmoe *m = kiln_calloc(1, sizeof *m);
    if (!m) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    m->cfg = *cfg;
    m->max_batch = max_batch;
    KILN_CHECK(rc, fail, kiln_param_table(cfg, &m->table, &m->n_params, &m->numel));
    m->params = kiln_calloc(m->numel, sizeof(float));
    m->grads = kiln_calloc(m->numel, sizeof(float));
    m->p.layers = kiln_calloc((size_t)cfg->n_layers, sizeof(kiln_tsmoe_layer_view));
    m->g.layers = kiln_calloc((size_t)cfg->n_layers, sizeof(kiln_tsmoe_layer_view));
    m->act.layers = kiln_calloc((size_t)cfg->n_layers, sizeof(kiln_tsmoe_layer_acts));
    KILN_CHECK_IF(rc, fail,
                  !m->params || !m->grads || !m->p.layers || !m->g.layers || !m->act.layers,
                  KILN_ERR_NOMEM, "out of memory for a model of %zu parameters", m->numel);
    kiln_tsmoe_view_point(cfg, m->table, m->n_params, m->params, &m->p);
    kiln_tsmoe_view_point(cfg, m->table, m->n_params, m->grads, &m->g);
    kiln_carver c = {NULL, 0, 64};
    carve_acts(m, &c);
    m->act_bytes = c.used + 64;
    m->act_block = kiln_calloc(1, c.used + 64);
    KILN_CHECK_IF(rc, fail, !m->act_block, KILN_ERR_NOMEM,
                  "out of memory for %zu bytes of activations", c.used);
    c.base = (char *)(((uintptr_t)m->act_block + 63) & ~(uintptr_t)63);
    c.used = 0;
    carve_acts(m, &c);
    m->stats.n_layers = cfg->n_layers;
    m->stats.n_experts = cfg->n_experts;
    m->stats.attn_entropy = m->st_attn;
    m->stats.router_entropy = m->st_router;
    m->stats.expert_load = m->st_load;
    m->stats.overflow = m->st_overflow;
    m->stats.act_rms = m->st_rms;
    /* The ops run on one thread each (deterministic, and the trainer owns the cores);
     * OpenBLAS would otherwise start a thread pool of its own. */
    openblas_set_num_threads(1);
    *out = m;
    return KILN_OK;
fail:
    kiln_tsmoe_free(m);
    return rc;
}

void kiln_tsmoe_free(kiln_tsmoe *m) {
    if (!m) return;
    free(m->table);
    free(m->params);
    free(m->grads);
    free(m->p.layers);
    free(m->g.layers);
    free(m->act.layers);
    free(m->act_block);
    free(m);
}

const kiln_model_config *kiln_tsmoe_config(const kiln_tsmoe *m) {
    return &m->cfg;
}

const kiln_param *kiln_tsmoe_param_table(const kiln_tsmoe *m, size_t *count) {
    if (count) *count = m->n_params;
    return m->table;
}

size_t kiln_tsmoe_numel(const kiln_tsmoe *m) {
    return m->numel;
}
size_t kiln_tsmoe_bytes(const kiln_tsmoe *m) {
    return 2 * m->numel * sizeof(float) + m->act_bytes;
}
float *kiln_tsmoe_params(kiln_tsmoe *m) {
    return m->params;
}
float *kiln_tsmoe_grads(kiln_tsmoe *m) {
    return m->grads;
}
const float *kiln_tsmoe_outputs(const kiln_tsmoe *m) {
    return m->act.y;
}
const kiln_tsmoe_stats *kiln_tsmoe_last_stats(const kiln_tsmoe *m) {
    return &m->stats;
}
void kiln_tsmoe_zero_grads(kiln_tsmoe *m) {
    memset(m->grads, 0, m->numel * sizeof(float));
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

void kiln_tsmoe_init(kiln_tsmoe *m, uint64_t seed) {
    const double base = 0.02, scaled = 0.02 / sqrt(2.0 * m->cfg.n_layers);
    for (size_t i = 0; i < m->n_params; i++) {
        const kiln_param *p = &m->table[i];
        float *w = m->params + p->offset;
        double std = base;
        if (!strcmp(p->name, "norm.in_mean") || ends_with(p->name, ".bias")) {
            memset(w, 0, p->numel * sizeof *w);
            continue;
        }
        if (!strcmp(p->name, "norm.in_std") || ends_with(p->name, "norm.weight")) {
            for (size_t j = 0; j < p->numel; j++)
                w[j] = 1.0f;
            continue;
        }
        if (ends_with(p->name, "attn.out.weight") || ends_with(p->name, "proj.weight"))
            std = scaled;
        for (size_t j = 0; j < p->numel; j++) {
            uint32_t r[4];
            kiln_philox(seed, KILN_STREAM_INIT, p->offset + j, r);
            /* Box-Muller in double from the first two words. */
            double u1 = kiln_u32_to_unit(r[0]), u2 = kiln_u32_to_unit(r[1]);
            double z = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
            w[j] = (float)(std * z);
        }
    }
}

kiln_err kiln_tsmoe_forward(kiln_tsmoe *m, const float *x, const float *targets, int B,
                            const kiln_loss_opts *opts, kiln_loss *loss) {
    const kiln_model_config *k = &m->cfg;
    KILN_FAIL_IF(B < 1 || B > m->max_batch, KILN_ERR_USAGE, "'forward': batch %d is outside 1..%d",
                 B, m->max_batch);
    const int S = k->seq_len, D = k->d_model, H = k->n_heads, W = k->attn_window, E = k->n_experts,
              K = k->top_k, Fh = k->d_ff, F = k->n_features, O = k->n_outputs, L = k->n_layers;
    const int N = B * S;
    const kiln_loss_opts o = kiln_tsmoe_loss_opts(opts);
    m->B = B;
    m->opts = o;
    m->have_targets = targets != NULL;
    m->targets = targets;
    /* Capacity limits apply to training steps only: inference never drops a token. */
    const int capacity = targets ? kiln_tsmoe_capacity(k, N, o.capacity_factor) : 0;
    const kiln_tsmoe_view *p = &m->p;
    kiln_tsmoe_acts *ac = &m->act;
    double lb_sum = 0.0, z_sum = 0.0;

    kiln_standardize_forward(ac->xs, x, p->in_mean, p->in_std, N, F);
    float *h = L ? ac->layers[0].res : ac->hL;
    kiln_linear_forward(h, ac->xs, p->embed_w, p->embed_b, N, F, D);
    for (int l = 0; l < L; l++) {
        kiln_tsmoe_layer_acts *a = &ac->layers[l];
        const kiln_tsmoe_layer_view *w = &p->layers[l];
        float *next = l + 1 < L ? ac->layers[l + 1].res : ac->hL;
        kiln_rmsnorm_forward(a->u1, a->rstd1, a->res, w->attn_norm, k->norm_eps, N, D);
        kiln_linear_forward(a->qkv, a->u1, w->qkv_w, w->qkv_b, N, D, 3 * D);
        kiln_attention_forward(a->ao, a->att, a->qkv, B, S, D, H, W);
        kiln_linear_forward(ac->tmp, a->ao, w->out_w, w->out_b, N, D, D);
        kiln_residual_forward(a->mid, a->res, ac->tmp, (size_t)N * D);
        kiln_rmsnorm_forward(a->u2, a->rstd2, a->mid, w->ffn_norm, k->norm_eps, N, D);
        kiln_stats_entropy(&m->st_attn[l], a->att, (size_t)B * H * S, (size_t)W);
        if (!E) {
            kiln_linear_forward(a->hpre, a->u2, w->fc_w, w->fc_b, N, D, Fh);
            kiln_gelu_forward(a->hact, a->hpre, (size_t)N * Fh);
            kiln_linear_forward(ac->tmp, a->hact, w->proj_w, w->proj_b, N, Fh, D);
            kiln_residual_forward(next, a->mid, ac->tmp, (size_t)N * D);
            m->st_router[l] = 0.0f;
            m->st_load[l] = 0.0f;
            m->st_overflow[l] = 0.0f;
        } else {
            kiln_linear_forward(a->logits, a->u2, w->router, NULL, N, D, E);
            kiln_router_forward(a->probs, a->lse, a->idx, a->gates, a->logits, N, E, K);
            double aux[2];
            kiln_router_loss_forward(&m->st_load[(size_t)l * E], aux, a->probs, a->lse, a->idx, N,
                                     E, K);
            lb_sum += aux[0];
            z_sum += aux[1];
            int dropped = 0;
            kiln_moe_dispatch(a->offsets, a->pos, a->rows, &dropped, a->idx, capacity, N, E, K);
            kiln_moe_gather_forward(a->xg, a->u2, a->rows, a->offsets[E], D);
            for (int e = 0; e < E; e++) {
                size_t r0 = (size_t)a->offsets[e];
                int n = a->offsets[e + 1] - a->offsets[e];
                kiln_linear_forward(a->hpre + r0 * Fh, a->xg + r0 * D, w->fc_w + (size_t)e * Fh * D,
                                    w->fc_b + (size_t)e * Fh, n, D, Fh);
                kiln_gelu_forward(a->hact + r0 * Fh, a->hpre + r0 * Fh, (size_t)n * Fh);
                kiln_linear_forward(a->yg + r0 * D, a->hact + r0 * Fh,
                                    w->proj_w + (size_t)e * D * Fh, w->proj_b + (size_t)e * D, n,
                                    Fh, D);
            }
            kiln_moe_combine_forward(next, a->mid, a->yg, a->gates, a->pos, N, D, K);
            kiln_stats_entropy(&m->st_router[l], a->probs, (size_t)N, (size_t)E);
            m->st_overflow[l] = (float)dropped / (float)((size_t)N * K);
        }
        kiln_stats_rms(&m->st_rms[l], next, (size_t)N * D);
    }
    kiln_rmsnorm_forward(ac->uf, ac->rstdf, ac->hL, p->final_norm, k->norm_eps, N, D);
    kiln_linear_forward(ac->y, ac->uf, p->head_w, p->head_b, N, D, O);
    kiln_stats_maxabs(&m->stats.max_abs_output, ac->y, (size_t)N * O);
    kiln_loss out = {0, 0, 0, 0};
    if (targets) {
        double mse;
        kiln_mse_forward(&mse, ac->y, targets, (size_t)N * O);
        out = kiln_tsmoe_loss_total(mse, lb_sum, z_sum, &o);
    }
    if (loss) *loss = out;
    return KILN_OK;
}

kiln_err kiln_tsmoe_backward(kiln_tsmoe *m, float scale) {
    KILN_FAIL_IF(!m->have_targets, KILN_ERR_USAGE, "'backward': the last forward had no targets");
    const kiln_model_config *k = &m->cfg;
    const int B = m->B, S = k->seq_len, D = k->d_model, H = k->n_heads, W = k->attn_window,
              E = k->n_experts, K = k->top_k, Fh = k->d_ff, F = k->n_features, O = k->n_outputs,
              L = k->n_layers;
    const int N = B * S;
    const kiln_tsmoe_view *p = &m->p, *g = &m->g;
    kiln_tsmoe_acts *ac = &m->act;
    const size_t ND = (size_t)N * D;

    memset(ac->dy, 0, (size_t)N * O * sizeof(float));
    kiln_mse_backward(ac->dy, ac->y, m->targets, scale, (size_t)N * O);
    memset(ac->duf, 0, ND * sizeof(float));
    kiln_linear_backward(ac->duf, g->head_w, g->head_b, ac->dy, ac->uf, p->head_w, N, D, O);
    /* dres holds d loss / d h at the point the backward pass has reached. */
    memset(ac->dres, 0, ND * sizeof(float));
    kiln_rmsnorm_backward(ac->dres, g->final_norm, ac->duf, ac->hL, p->final_norm, ac->rstdf, N, D);
    for (int l = L - 1; l >= 0; l--) {
        kiln_tsmoe_layer_acts *a = &ac->layers[l];
        const kiln_tsmoe_layer_view *w = &p->layers[l], *gw = &g->layers[l];
        memset(ac->du, 0, ND * sizeof(float));
        if (!E) {
            memset(ac->dh2, 0, (size_t)N * Fh * sizeof(float));
            kiln_linear_backward(ac->dh2, gw->proj_w, gw->proj_b, ac->dres, a->hact, w->proj_w, N,
                                 Fh, D);
            memset(ac->dh1, 0, (size_t)N * Fh * sizeof(float));
            kiln_gelu_backward(ac->dh1, ac->dh2, a->hpre, (size_t)N * Fh);
            kiln_linear_backward(ac->du, gw->fc_w, gw->fc_b, ac->dh1, a->u2, w->fc_w, N, D, Fh);
        } else {
            const int M = a->offsets[E];
            memset(ac->dyg, 0, (size_t)M * D * sizeof(float));
            memset(ac->dgates, 0, (size_t)N * K * sizeof(float));
            kiln_moe_combine_backward(ac->dyg, ac->dgates, ac->dres, a->yg, a->gates, a->pos, N, D,
                                      K);
            memset(ac->dh1, 0, (size_t)M * Fh * sizeof(float));
            memset(ac->dh2, 0, (size_t)M * Fh * sizeof(float));
            memset(ac->dxg, 0, (size_t)M * D * sizeof(float));
            for (int e = 0; e < E; e++) {
                size_t r0 = (size_t)a->offsets[e];
                int n = a->offsets[e + 1] - a->offsets[e];
                kiln_linear_backward(ac->dh2 + r0 * Fh, gw->proj_w + (size_t)e * D * Fh,
                                     gw->proj_b + (size_t)e * D, ac->dyg + r0 * D,
                                     a->hact + r0 * Fh, w->proj_w + (size_t)e * D * Fh, n, Fh, D);
                kiln_gelu_backward(ac->dh1 + r0 * Fh, ac->dh2 + r0 * Fh, a->hpre + r0 * Fh,
                                   (size_t)n * Fh);
                kiln_linear_backward(ac->dxg + r0 * D, gw->fc_w + (size_t)e * Fh * D,
                                     gw->fc_b + (size_t)e * Fh, ac->dh1 + r0 * Fh, a->xg + r0 * D,
                                     w->fc_w + (size_t)e * Fh * D, n, D, Fh);
            }
            kiln_moe_gather_backward(ac->du, ac->dxg, a->rows, M, D);
            memset(ac->dlogits, 0, (size_t)N * E * sizeof(float));
            kiln_router_backward(ac->dlogits, ac->dgates, a->probs, a->lse, a->idx, a->gates,
                                 &m->st_load[(size_t)l * E], scale * m->opts.aux_loss_coef,
                                 scale * m->opts.z_loss_coef, N, E, K);
            kiln_linear_backward(ac->du, gw->router, NULL, ac->dlogits, a->u2, w->router, N, D, E);
        }
        /* The residual passes dres through unchanged; the norm's branch adds to it. */
        kiln_rmsnorm_backward(ac->dres, gw->ffn_norm, ac->du, a->mid, w->ffn_norm, a->rstd2, N, D);
        memset(ac->dao, 0, ND * sizeof(float));
        kiln_linear_backward(ac->dao, gw->out_w, gw->out_b, ac->dres, a->ao, w->out_w, N, D, D);
        memset(ac->dqkv, 0, ND * 3 * sizeof(float));
        kiln_attention_backward(ac->dqkv, ac->datt, ac->dao, a->qkv, a->att, B, S, D, H, W);
        memset(ac->du, 0, ND * sizeof(float));
        kiln_linear_backward(ac->du, gw->qkv_w, gw->qkv_b, ac->dqkv, a->u1, w->qkv_w, N, D, 3 * D);
        kiln_rmsnorm_backward(ac->dres, gw->attn_norm, ac->du, a->res, w->attn_norm, a->rstd1, N,
                              D);
    }
    kiln_linear_backward(NULL, g->embed_w, g->embed_b, ac->dres, ac->xs, p->embed_w, N, F, D);
    return KILN_OK;
}

double kiln_tsmoe_mean_window(int seq_len, int attn_window) {
    double w = 0;
    for (int i = 0; i < seq_len; i++)
        w += i + 1 < attn_window ? i + 1 : attn_window;
    return seq_len > 0 ? w / seq_len : 0;
}

double kiln_tsmoe_flops_per_token(const kiln_model_config *c, double *active) {
    const double D = c->d_model, F = c->n_features, O = c->n_outputs, Fh = c->d_ff,
                 E = c->n_experts, K = c->top_k, L = c->n_layers;
    const double ffn = E ? K * 2 * D * Fh + E * D : 2 * D * Fh;
    const double act = F * D + L * (4 * D * D + ffn) + D * O;
    if (active) *active = act;
    return 6 * act + 12 * L * D * kiln_tsmoe_mean_window(c->seq_len, c->attn_window);
}

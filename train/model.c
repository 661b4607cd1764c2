/* model.c - the kiln-tsmoe/1 network being trained: parameters, gradients and activations
 * each in one block (views into it, as llm.c's malloc_and_point_parameters), forward and
 * backward as MODEL.md, built from the ops of kernels.h. Nothing here allocates after
 * kiln_tsmoe_create. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "kernels.h"
#include "train.h"

/* Views of one block's tensors, in the parameter block or the gradient block. */
typedef struct layer_view {
    float *attn_norm, *qkv_w, *qkv_b, *out_w, *out_b, *ffn_norm;
    float *fc_w, *fc_b, *proj_w, *proj_b; /* ffn.* or moe.* */
    float *router;                        /* NULL when dense */
} layer_view;

typedef struct net_view {
    float *in_mean, *in_std, *embed_w, *embed_b, *final_norm, *head_w, *head_b;
    layer_view *layers; /* [L] */
} net_view;

/* Saved activations of one block. */
typedef struct layer_acts {
    float *res;            /* [N,D] block input h */
    float *u1;             /* [N,D] rmsnorm(h, attn_norm) */
    float *rstd1;          /* [N] */
    float *qkv;            /* [N,3D] */
    float *att;            /* [B,H,S,W] */
    float *ao;             /* [N,D] heads concatenated */
    float *mid;            /* [N,D] h after attention */
    float *u2;             /* [N,D] rmsnorm(mid, ffn_norm) */
    float *rstd2;          /* [N] */
    float *xg;             /* [N*K,D] tokens gathered per expert (mixture) */
    float *hpre;           /* [R,Fh] fc output, R = N (dense) or N*K */
    float *hact;           /* [R,Fh] gelu(hpre) */
    float *yg;             /* [N*K,D] expert outputs, bias included (mixture) */
    float *logits, *probs; /* [N,E] */
    float *lse;            /* [N] */
    float *gates;          /* [N,K] */
    int32_t *idx, *pos;    /* [N,K] */
    int32_t *rows;         /* [N*K] */
    int32_t *offsets;      /* [E+1] */
} layer_acts;

struct kiln_tsmoe {
    kiln_model_config cfg;
    int max_batch;
    kiln_param *table;
    size_t n_params, numel;
    float *params, *grads; /* [numel] each */
    net_view p, g;
    void *act_block;
    layer_acts *acts;     /* [L] */
    float *xs;            /* [N,F] standardised input */
    float *hL;            /* [N,D] output of the last block */
    float *uf, *rstdf;    /* [N,D], [N] */
    float *y;             /* [N,O] */
    const float *targets; /* [N,O], the caller's, until backward */
    /* backward scratch */
    float *dres, *du, *dao, *dqkv, *datt, *dh1, *dh2, *dxg, *dyg, *dgates, *dlogits, *dy, *duf;
    float *tmp; /* [N,D] projection output before the residual add */
    /* last forward */
    int B;
    bool have_targets;
    kiln_loss_opts opts;
    /* stats */
    kiln_tsmoe_stats stats;
    float *st_attn, *st_router, *st_load, *st_overflow, *st_rms;
};

static float *find(const kiln_tsmoe *m, float *base, const char *fmt, int l) {
    char name[64];
    snprintf(name, sizeof name, fmt, l);
    long i = kiln_param_find(m->table, m->n_params, name);
    return i < 0 ? NULL : base + m->table[i].offset;
}

static void point_views(const kiln_tsmoe *m, float *base, net_view *v) {
    v->in_mean = find(m, base, "norm.in_mean", 0);
    v->in_std = find(m, base, "norm.in_std", 0);
    v->embed_w = find(m, base, "embed.weight", 0);
    v->embed_b = find(m, base, "embed.bias", 0);
    v->final_norm = find(m, base, "final_norm.weight", 0);
    v->head_w = find(m, base, "head.weight", 0);
    v->head_b = find(m, base, "head.bias", 0);
    const char *ffn = m->cfg.n_experts ? "moe" : "ffn";
    for (int l = 0; l < m->cfg.n_layers; l++) {
        layer_view *lv = &v->layers[l];
        char fmt[64];
        lv->attn_norm = find(m, base, "blocks.%d.attn_norm.weight", l);
        lv->qkv_w = find(m, base, "blocks.%d.attn.qkv.weight", l);
        lv->qkv_b = find(m, base, "blocks.%d.attn.qkv.bias", l);
        lv->out_w = find(m, base, "blocks.%d.attn.out.weight", l);
        lv->out_b = find(m, base, "blocks.%d.attn.out.bias", l);
        lv->ffn_norm = find(m, base, "blocks.%d.ffn_norm.weight", l);
        snprintf(fmt, sizeof fmt, "blocks.%%d.%s.fc.weight", ffn);
        lv->fc_w = find(m, base, fmt, l);
        snprintf(fmt, sizeof fmt, "blocks.%%d.%s.fc.bias", ffn);
        lv->fc_b = find(m, base, fmt, l);
        snprintf(fmt, sizeof fmt, "blocks.%%d.%s.proj.weight", ffn);
        lv->proj_w = find(m, base, fmt, l);
        snprintf(fmt, sizeof fmt, "blocks.%%d.%s.proj.bias", ffn);
        lv->proj_b = find(m, base, fmt, l);
        lv->router = m->cfg.n_experts ? find(m, base, "blocks.%d.moe.router.weight", l) : NULL;
    }
}

/* The activation block is carved in two passes: the first (base NULL) only sums sizes. */
typedef struct carver {
    char *base;
    size_t used;
} carver;

static void *carve(carver *c, size_t n, size_t elem) {
    size_t at = (c->used + 63) & ~(size_t)63;
    c->used = at + n * elem;
    return c->base ? c->base + at : NULL;
}
#define CARVE_F(c, n) ((float *)carve((c), (n), sizeof(float)))
#define CARVE_I(c, n) ((int32_t *)carve((c), (n), sizeof(int32_t)))

static void carve_acts(kiln_tsmoe *m, carver *c) {
    const kiln_model_config *k = &m->cfg;
    const size_t N = (size_t)m->max_batch * k->seq_len, D = k->d_model, E = k->n_experts,
                 K = k->top_k;
    const size_t Fh = k->d_ff, R = E ? N * K : N;
    const size_t A = (size_t)m->max_batch * k->n_heads * k->seq_len * k->attn_window;
    for (int l = 0; l < k->n_layers; l++) {
        layer_acts *a = &m->acts[l];
        a->res = CARVE_F(c, N * D);
        a->u1 = CARVE_F(c, N * D);
        a->rstd1 = CARVE_F(c, N);
        a->qkv = CARVE_F(c, N * 3 * D);
        a->att = CARVE_F(c, A);
        a->ao = CARVE_F(c, N * D);
        a->mid = CARVE_F(c, N * D);
        a->u2 = CARVE_F(c, N * D);
        a->rstd2 = CARVE_F(c, N);
        a->hpre = CARVE_F(c, R * Fh);
        a->hact = CARVE_F(c, R * Fh);
        if (E) {
            a->xg = CARVE_F(c, N * K * D);
            a->yg = CARVE_F(c, N * K * D);
            a->logits = CARVE_F(c, N * E);
            a->probs = CARVE_F(c, N * E);
            a->lse = CARVE_F(c, N);
            a->gates = CARVE_F(c, N * K);
            a->idx = CARVE_I(c, N * K);
            a->pos = CARVE_I(c, N * K);
            a->rows = CARVE_I(c, N * K);
            a->offsets = CARVE_I(c, E + 1);
        }
    }
    m->xs = CARVE_F(c, N * k->n_features);
    m->hL = CARVE_F(c, N * D);
    m->uf = CARVE_F(c, N * D);
    m->rstdf = CARVE_F(c, N);
    m->y = CARVE_F(c, N * k->n_outputs);
    m->tmp = CARVE_F(c, N * D);
    m->dres = CARVE_F(c, N * D);
    m->du = CARVE_F(c, N * D);
    m->dao = CARVE_F(c, N * D);
    m->dqkv = CARVE_F(c, N * 3 * D);
    m->datt = CARVE_F(c, A);
    m->dh1 = CARVE_F(c, R * Fh);
    m->dh2 = CARVE_F(c, R * Fh);
    m->dxg = E ? CARVE_F(c, N * K * D) : NULL;
    m->dyg = E ? CARVE_F(c, N * K * D) : NULL;
    m->dgates = E ? CARVE_F(c, N * K) : NULL;
    m->dlogits = E ? CARVE_F(c, N * E) : NULL;
    m->dy = CARVE_F(c, N * k->n_outputs);
    m->duf = CARVE_F(c, N * D);
    size_t L = (size_t)k->n_layers, Es = E ? E : 1;
    m->st_attn = CARVE_F(c, L);
    m->st_router = CARVE_F(c, L);
    m->st_load = CARVE_F(c, L * Es);
    m->st_overflow = CARVE_F(c, L);
    m->st_rms = CARVE_F(c, L);
}

kiln_err kiln_tsmoe_create(const kiln_model_config *cfg, int max_batch, kiln_tsmoe **out) {
    *out = NULL;
    KILN_TRY(kiln_model_config_check(cfg, "model config"));
    KILN_FAIL_IF(max_batch < 1, KILN_ERR_CONFIG,
                 "'model config': max_batch must be at least 1 (is %d)", max_batch);
    /* Every activation index must fit comfortably: tokens times the widest row. */
    double widest = (double)cfg->d_ff * (cfg->top_k ? cfg->top_k : 1) + 3.0 * cfg->d_model +
                    (double)cfg->n_heads * cfg->attn_window;
    KILN_FAIL_IF((double)max_batch * cfg->seq_len * widest > 2e9, KILN_ERR_CONFIG,
                 "'model config': max_batch %d times seq_len %d is too large for this model",
                 max_batch, cfg->seq_len);
    kiln_tsmoe *m = kiln_calloc(1, sizeof *m);
    if (!m) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    m->cfg = *cfg;
    m->max_batch = max_batch;
    KILN_CHECK(rc, fail, kiln_param_table(cfg, &m->table, &m->n_params, &m->numel));
    m->params = kiln_calloc(m->numel, sizeof(float));
    m->grads = kiln_calloc(m->numel, sizeof(float));
    m->p.layers = kiln_calloc((size_t)cfg->n_layers, sizeof(layer_view));
    m->g.layers = kiln_calloc((size_t)cfg->n_layers, sizeof(layer_view));
    m->acts = kiln_calloc((size_t)cfg->n_layers, sizeof(layer_acts));
    KILN_CHECK_IF(rc, fail, !m->params || !m->grads || !m->p.layers || !m->g.layers || !m->acts,
                  KILN_ERR_NOMEM, "out of memory for a model of %zu parameters", m->numel);
    point_views(m, m->params, &m->p);
    point_views(m, m->grads, &m->g);
    carver c = {NULL, 0};
    carve_acts(m, &c);
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
    free(m->acts);
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
float *kiln_tsmoe_params(kiln_tsmoe *m) {
    return m->params;
}
float *kiln_tsmoe_grads(kiln_tsmoe *m) {
    return m->grads;
}
const float *kiln_tsmoe_outputs(const kiln_tsmoe *m) {
    return m->y;
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
    kiln_loss_opts o = {0.01f, 0.001f, 0.0f};
    if (opts) o = *opts;
    m->B = B;
    m->opts = o;
    m->have_targets = targets != NULL;
    m->targets = targets;
    /* Capacity limits apply to training steps only: inference never drops a token. */
    int capacity = 0;
    if (targets && E && o.capacity_factor > 0) {
        double cap = ceil((double)o.capacity_factor * N * K / E);
        capacity = cap > (double)N * K ? N * K : (int)cap;
        if (capacity < 1) capacity = 1;
    }
    const net_view *p = &m->p;
    double lb_sum = 0.0, z_sum = 0.0;

    kiln_standardize_forward(m->xs, x, p->in_mean, p->in_std, N, F);
    float *h = L ? m->acts[0].res : m->hL;
    kiln_linear_forward(h, m->xs, p->embed_w, p->embed_b, N, F, D);
    for (int l = 0; l < L; l++) {
        layer_acts *a = &m->acts[l];
        const layer_view *w = &p->layers[l];
        float *next = l + 1 < L ? m->acts[l + 1].res : m->hL;
        kiln_rmsnorm_forward(a->u1, a->rstd1, a->res, w->attn_norm, k->norm_eps, N, D);
        kiln_linear_forward(a->qkv, a->u1, w->qkv_w, w->qkv_b, N, D, 3 * D);
        kiln_attention_forward(a->ao, a->att, a->qkv, B, S, D, H, W);
        kiln_linear_forward(m->tmp, a->ao, w->out_w, w->out_b, N, D, D);
        kiln_residual_forward(a->mid, a->res, m->tmp, (size_t)N * D);
        kiln_rmsnorm_forward(a->u2, a->rstd2, a->mid, w->ffn_norm, k->norm_eps, N, D);
        kiln_stats_entropy(&m->st_attn[l], a->att, (size_t)B * H * S, (size_t)W);
        if (!E) {
            kiln_linear_forward(a->hpre, a->u2, w->fc_w, w->fc_b, N, D, Fh);
            kiln_gelu_forward(a->hact, a->hpre, (size_t)N * Fh);
            kiln_linear_forward(m->tmp, a->hact, w->proj_w, w->proj_b, N, Fh, D);
            kiln_residual_forward(next, a->mid, m->tmp, (size_t)N * D);
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
    kiln_rmsnorm_forward(m->uf, m->rstdf, m->hL, p->final_norm, k->norm_eps, N, D);
    kiln_linear_forward(m->y, m->uf, p->head_w, p->head_b, N, D, O);
    kiln_stats_maxabs(&m->stats.max_abs_output, m->y, (size_t)N * O);
    kiln_loss out = {0, 0, 0, 0};
    if (targets) {
        kiln_mse_forward(&out.mse, m->y, targets, (size_t)N * O);
        out.load_balance = lb_sum;
        out.z = z_sum;
        out.loss = out.mse + (double)o.aux_loss_coef * lb_sum + (double)o.z_loss_coef * z_sum;
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
    const net_view *p = &m->p, *g = &m->g;
    const size_t ND = (size_t)N * D;

    memset(m->dy, 0, (size_t)N * O * sizeof(float));
    kiln_mse_backward(m->dy, m->y, m->targets, scale, (size_t)N * O);
    memset(m->duf, 0, ND * sizeof(float));
    kiln_linear_backward(m->duf, g->head_w, g->head_b, m->dy, m->uf, p->head_w, N, D, O);
    /* dres holds d loss / d h at the point the backward pass has reached. */
    memset(m->dres, 0, ND * sizeof(float));
    kiln_rmsnorm_backward(m->dres, g->final_norm, m->duf, m->hL, p->final_norm, m->rstdf, N, D);
    for (int l = L - 1; l >= 0; l--) {
        layer_acts *a = &m->acts[l];
        const layer_view *w = &p->layers[l], *gw = &g->layers[l];
        memset(m->du, 0, ND * sizeof(float));
        if (!E) {
            memset(m->dh2, 0, (size_t)N * Fh * sizeof(float));
            kiln_linear_backward(m->dh2, gw->proj_w, gw->proj_b, m->dres, a->hact, w->proj_w, N, Fh,
                                 D);
            memset(m->dh1, 0, (size_t)N * Fh * sizeof(float));
            kiln_gelu_backward(m->dh1, m->dh2, a->hpre, (size_t)N * Fh);
            kiln_linear_backward(m->du, gw->fc_w, gw->fc_b, m->dh1, a->u2, w->fc_w, N, D, Fh);
        } else {
            const int M = a->offsets[E];
            memset(m->dyg, 0, (size_t)M * D * sizeof(float));
            memset(m->dgates, 0, (size_t)N * K * sizeof(float));
            kiln_moe_combine_backward(m->dyg, m->dgates, m->dres, a->yg, a->gates, a->pos, N, D, K);
            memset(m->dh1, 0, (size_t)M * Fh * sizeof(float));
            memset(m->dh2, 0, (size_t)M * Fh * sizeof(float));
            memset(m->dxg, 0, (size_t)M * D * sizeof(float));
            for (int e = 0; e < E; e++) {
                size_t r0 = (size_t)a->offsets[e];
                int n = a->offsets[e + 1] - a->offsets[e];
                kiln_linear_backward(m->dh2 + r0 * Fh, gw->proj_w + (size_t)e * D * Fh,
                                     gw->proj_b + (size_t)e * D, m->dyg + r0 * D, a->hact + r0 * Fh,
                                     w->proj_w + (size_t)e * D * Fh, n, Fh, D);
                kiln_gelu_backward(m->dh1 + r0 * Fh, m->dh2 + r0 * Fh, a->hpre + r0 * Fh,
                                   (size_t)n * Fh);
                kiln_linear_backward(m->dxg + r0 * D, gw->fc_w + (size_t)e * Fh * D,
                                     gw->fc_b + (size_t)e * Fh, m->dh1 + r0 * Fh, a->xg + r0 * D,
                                     w->fc_w + (size_t)e * Fh * D, n, D, Fh);
            }
            kiln_moe_gather_backward(m->du, m->dxg, a->rows, M, D);
            memset(m->dlogits, 0, (size_t)N * E * sizeof(float));
            kiln_router_backward(m->dlogits, m->dgates, a->probs, a->lse, a->idx, a->gates,
                                 &m->st_load[(size_t)l * E], scale * m->opts.aux_loss_coef,
                                 scale * m->opts.z_loss_coef, N, E, K);
            kiln_linear_backward(m->du, gw->router, NULL, m->dlogits, a->u2, w->router, N, D, E);
        }
        /* The residual passes dres through unchanged; the norm's branch adds to it. */
        kiln_rmsnorm_backward(m->dres, gw->ffn_norm, m->du, a->mid, w->ffn_norm, a->rstd2, N, D);
        memset(m->dao, 0, ND * sizeof(float));
        kiln_linear_backward(m->dao, gw->out_w, gw->out_b, m->dres, a->ao, w->out_w, N, D, D);
        memset(m->dqkv, 0, ND * 3 * sizeof(float));
        kiln_attention_backward(m->dqkv, m->datt, m->dao, a->qkv, a->att, B, S, D, H, W);
        memset(m->du, 0, ND * sizeof(float));
        kiln_linear_backward(m->du, gw->qkv_w, gw->qkv_b, m->dqkv, a->u1, w->qkv_w, N, D, 3 * D);
        kiln_rmsnorm_backward(m->dres, gw->attn_norm, m->du, a->res, w->attn_norm, a->rstd1, N, D);
    }
    kiln_linear_backward(NULL, g->embed_w, g->embed_b, m->dres, m->xs, p->embed_w, N, F, D);
    return KILN_OK;
}

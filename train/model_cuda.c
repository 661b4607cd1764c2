/* model_cuda.c - the kiln-tsmoe/1 network on a CUDA device: model.c's forward and backward,
 * step for step, through the kiln_cuda_* ops of kernels.h. Parameters, gradients and
 * activations each live in one device allocation (tensors are views into them); nothing is
 * allocated after create. The host waits on the device once per mixture layer in the
 * forward (the dispatch plan's offsets size the expert GEMMs) and once at its end (the loss
 * and the stats); the backward is queued without waiting. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "train_int.h"

#ifdef KILN_HAVE_CUDA

/* bf16 copies of the GEMM weights (same offsets as the parameter block). */
typedef struct layer_view16 {
    uint16_t *qkv_w, *out_w, *fc_w, *proj_w;
} layer_view16;

struct kiln_tsmoe_cuda {
    kiln_model_config cfg;
    int max_batch;
    kiln_precision precision;
    bool have_context;
    kiln_param *table;
    size_t n_params, numel;
    float *params, *grads; /* device [numel] each */
    uint16_t *params16;    /* device [numel], bf16 only */
    kiln_tsmoe_view p, g;
    uint16_t *embed_w16, *head_w16;
    layer_view16 *w16;   /* [L] */
    void *act_block;     /* device */
    kiln_tsmoe_acts act; /* device views (layers [L] on the host) */
    float *x, *targets;  /* [N,F], [N,O] device copies of the caller's */
    /* device results of a forward */
    double *r_losses; /* [2L+1]: lb_l, z_l per layer, then mse */
    float *r_stats;   /* [3L+1]: attn entropy [L], router entropy [L], rms [L], max |y| */
    float *r_load;    /* [L,E] */
    int *r_dropped;   /* [L] */
    /* host */
    int32_t *offsets_h; /* [L,E+1] */
    double *h_losses;
    float *h_stats, *h_load, *h_overflow;
    int *h_dropped;
    int B;
    bool have_targets;
    kiln_loss_opts opts;
    kiln_tsmoe_stats stats;
    /* the backward's gradient hook, and the table index of each block's first tensor */
    kiln_tsmoe_cuda_grad_hook hook;
    void *hook_ctx;
    size_t *layer_first; /* [L] */
};

/* The bf16 twin of a parameter pointer: the same offset in params16. */
static uint16_t *as16(const kiln_tsmoe_cuda *m, const float *w) {
    return m->params16 ? m->params16 + (w - m->params) : NULL;
}

/* The activation block holds the plan's buffers (layout.c), the caller's inputs, then the
 * forward's device results. */
static void carve_acts(kiln_tsmoe_cuda *m, kiln_carver *c) {
    const kiln_model_config *k = &m->cfg;
    const size_t N = (size_t)m->max_batch * k->seq_len, E = k->n_experts, L = k->n_layers;
    kiln_tsmoe_carve_acts(k, m->max_batch, c, &m->act);
    m->x = kiln_carve_f32(c, N * k->n_features);
    m->targets = kiln_carve_f32(c, N * k->n_outputs);
    m->r_losses = (double *)kiln_carve(c, 2 * L + 1, sizeof(double));
    m->r_stats = kiln_carve_f32(c, 3 * L + 1);
    m->r_load = kiln_carve_f32(c, L * (E ? E : 1));
    m->r_dropped = (int *)kiln_carve(c, L, sizeof(int));
}

kiln_err kiln_tsmoe_cuda_create(const kiln_model_config *cfg, int max_batch,
                                const kiln_cuda_opts *opts, kiln_tsmoe_cuda **out) {
    *out = NULL;
    kiln_cuda_opts o = {0, KILN_PRECISION_F32};
    if (opts) o = *opts;
    KILN_TRY(kiln_tsmoe_check_batch(cfg, max_batch));
    KILN_FAIL_IF(o.precision != KILN_PRECISION_F32 && o.precision != KILN_PRECISION_BF16,
                 KILN_ERR_USAGE, "'cuda network': unknown precision %d", (int)o.precision);
    kiln_tsmoe_cuda *m = kiln_calloc(1, sizeof *m);
    if (!m) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    m->cfg = *cfg;
    m->max_batch = max_batch;
    m->precision = o.precision;
    KILN_CHECK(rc, fail, kiln_cuda_init(o.device));
    m->have_context = true;
    const size_t L = (size_t)cfg->n_layers, E = (size_t)cfg->n_experts;
    KILN_CHECK(rc, fail, kiln_param_table(cfg, &m->table, &m->n_params, &m->numel));
    m->p.layers = kiln_calloc(L, sizeof(kiln_tsmoe_layer_view));
    m->g.layers = kiln_calloc(L, sizeof(kiln_tsmoe_layer_view));
    m->w16 = kiln_calloc(L, sizeof(layer_view16));
    m->act.layers = kiln_calloc(L, sizeof(kiln_tsmoe_layer_acts));
    m->offsets_h = kiln_calloc(L * (E + 1), sizeof(int32_t));
    m->h_losses = kiln_calloc(2 * L + 1, sizeof(double));
    m->h_stats = kiln_calloc(3 * L + 1, sizeof(float));
    m->h_load = kiln_calloc(L * (E ? E : 1), sizeof(float));
    m->h_overflow = kiln_calloc(L, sizeof(float));
    m->h_dropped = kiln_calloc(L, sizeof(int));
    m->layer_first = kiln_calloc(L ? L : 1, sizeof(size_t));
    KILN_CHECK_IF(rc, fail,
                  !m->p.layers || !m->g.layers || !m->w16 || !m->act.layers || !m->offsets_h ||
                      !m->h_losses || !m->h_stats || !m->h_load || !m->h_overflow || !m->h_dropped ||
                      !m->layer_first,
                  KILN_ERR_NOMEM, "out of memory for a cuda network");
    KILN_CHECK(rc, fail, kiln_cuda_malloc((void **)&m->params, m->numel * sizeof(float)));
    KILN_CHECK(rc, fail, kiln_cuda_malloc((void **)&m->grads, m->numel * sizeof(float)));
    KILN_CHECK(rc, fail, kiln_cuda_memset(m->params, 0, m->numel * sizeof(float)));
    KILN_CHECK(rc, fail, kiln_cuda_memset(m->grads, 0, m->numel * sizeof(float)));
    if (m->precision == KILN_PRECISION_BF16)
        KILN_CHECK(rc, fail, kiln_cuda_malloc((void **)&m->params16, m->numel * sizeof(uint16_t)));
    kiln_tsmoe_view_point(cfg, m->table, m->n_params, m->params, &m->p);
    kiln_tsmoe_view_point(cfg, m->table, m->n_params, m->grads, &m->g);
    for (size_t l = 0, i = 0; l < L; l++) {
        const size_t off = (size_t)(m->p.layers[l].attn_norm - m->params);
        while (m->table[i].offset != off)
            i++;
        m->layer_first[l] = i;
    }
    m->embed_w16 = as16(m, m->p.embed_w);
    m->head_w16 = as16(m, m->p.head_w);
    for (size_t l = 0; l < L; l++) {
        m->w16[l].qkv_w = as16(m, m->p.layers[l].qkv_w);
        m->w16[l].out_w = as16(m, m->p.layers[l].out_w);
        m->w16[l].fc_w = as16(m, m->p.layers[l].fc_w);
        m->w16[l].proj_w = as16(m, m->p.layers[l].proj_w);
    }
    kiln_carver c = {NULL, 0, 256};
    carve_acts(m, &c);
    KILN_CHECK(rc, fail, kiln_cuda_malloc(&m->act_block, c.used));
    c.base = m->act_block;
    c.used = 0;
    carve_acts(m, &c);
    /* The ops' scratch at its largest now, so that no step allocates: rows times the widest
     * row any op sums over or rounds to bf16. */
    size_t N = (size_t)max_batch * cfg->seq_len, R = E ? N * cfg->top_k : N;
    size_t need = kiln_cuda_scratch_bytes(N, 3 * (size_t)cfg->d_model + (size_t)cfg->n_features +
                                                 (size_t)cfg->n_outputs);
    size_t need2 = kiln_cuda_scratch_bytes(R, (size_t)cfg->d_ff + cfg->d_model);
    KILN_CHECK(rc, fail, kiln_cuda_reserve(need > need2 ? need : need2));
    KILN_CHECK(rc, fail, kiln_cuda_sync());
    m->stats.n_layers = cfg->n_layers;
    m->stats.n_experts = cfg->n_experts;
    m->stats.attn_entropy = m->h_stats;
    m->stats.router_entropy = m->h_stats + L;
    m->stats.act_rms = m->h_stats + 2 * L;
    m->stats.expert_load = m->h_load;
    m->stats.overflow = m->h_overflow;
    *out = m;
    return KILN_OK;
fail:
    kiln_tsmoe_cuda_free(m);
    return kiln_errprefix(rc, "'cuda network': ");
}

void kiln_tsmoe_cuda_free(kiln_tsmoe_cuda *m) {
    if (!m) return;
    kiln_cuda_free(m->params);
    kiln_cuda_free(m->grads);
    kiln_cuda_free(m->params16);
    kiln_cuda_free(m->act_block);
    if (m->have_context) kiln_cuda_release();
    free(m->table);
    free(m->p.layers);
    free(m->g.layers);
    free(m->w16);
    free(m->act.layers);
    free(m->offsets_h);
    free(m->h_losses);
    free(m->h_stats);
    free(m->h_load);
    free(m->h_overflow);
    free(m->h_dropped);
    free(m->layer_first);
    free(m);
}

const kiln_param *kiln_tsmoe_cuda_param_table(const kiln_tsmoe_cuda *m, size_t *count) {
    if (count) *count = m->n_params;
    return m->table;
}
size_t kiln_tsmoe_cuda_numel(const kiln_tsmoe_cuda *m) {
    return m->numel;
}
float *kiln_tsmoe_cuda_device_params(kiln_tsmoe_cuda *m) {
    return m->params;
}
float *kiln_tsmoe_cuda_device_grads(kiln_tsmoe_cuda *m) {
    return m->grads;
}
kiln_err kiln_tsmoe_cuda_upload_params(kiln_tsmoe_cuda *m, const float *params) {
    return kiln_cuda_upload(m->params, params, m->numel * sizeof(float));
}
kiln_err kiln_tsmoe_cuda_download_params(const kiln_tsmoe_cuda *m, float *params) {
    return kiln_cuda_download(params, m->params, m->numel * sizeof(float));
}
kiln_err kiln_tsmoe_cuda_download_grads(const kiln_tsmoe_cuda *m, float *grads) {
    return kiln_cuda_download(grads, m->grads, m->numel * sizeof(float));
}
kiln_err kiln_tsmoe_cuda_zero_grads(kiln_tsmoe_cuda *m) {
    return kiln_cuda_memset(m->grads, 0, m->numel * sizeof(float));
}
kiln_err kiln_tsmoe_cuda_outputs(const kiln_tsmoe_cuda *m, float *y) {
    return kiln_cuda_download(y, m->act.y,
                              (size_t)m->B * m->cfg.seq_len * m->cfg.n_outputs * sizeof(float));
}
const kiln_tsmoe_stats *kiln_tsmoe_cuda_last_stats(const kiln_tsmoe_cuda *m) {
    return &m->stats;
}
kiln_err kiln_tsmoe_cuda_sync(kiln_tsmoe_cuda *m) {
    (void)m;
    return kiln_cuda_sync();
}
void kiln_tsmoe_cuda_set_grad_hook(kiln_tsmoe_cuda *m, kiln_tsmoe_cuda_grad_hook fn, void *ctx) {
    m->hook = fn;
    m->hook_ctx = ctx;
}

/* The gradients of tensors first.. are complete once the work queued so far has run. */
#define GRADS_DONE(first)                                                                          \
    do {                                                                                           \
        if (m->hook) KILN_TRY(m->hook(m->hook_ctx, (first)));                                      \
    } while (0)

/* The GEMM of one layer in the network's precision. w is the f32 weight (a view into the
 * parameter block); in bf16 its twin in params16 is multiplied instead. */
static kiln_err lin_fwd(const kiln_tsmoe_cuda *m, float *out, const float *inp, const float *w,
                        const float *b, int N, int IC, int OC) {
    if (m->params16) return kiln_cuda_linear_forward_bf16(out, inp, as16(m, w), b, N, IC, OC);
    return kiln_cuda_linear_forward(out, inp, w, b, N, IC, OC);
}

static kiln_err lin_bwd(const kiln_tsmoe_cuda *m, float *dinp, float *dw, float *db,
                        const float *dout, const float *inp, const float *w, int N, int IC,
                        int OC) {
    if (m->params16)
        return kiln_cuda_linear_backward_bf16(dinp, dw, db, dout, inp, as16(m, w), N, IC, OC);
    return kiln_cuda_linear_backward(dinp, dw, db, dout, inp, w, N, IC, OC);
}

/* The experts of a layer: G weights [G,OC,IC] over the row runs of the host offsets off. */
static kiln_err lin_grouped_fwd(const kiln_tsmoe_cuda *m, float *out, const float *inp,
                                const float *w, const float *b, const int32_t *off, int G, int IC,
                                int OC) {
    if (m->params16)
        return kiln_cuda_linear_grouped_forward_bf16(out, inp, as16(m, w), b, off, G, IC, OC);
    return kiln_cuda_linear_grouped_forward(out, inp, w, b, off, G, IC, OC);
}

static kiln_err lin_grouped_bwd(const kiln_tsmoe_cuda *m, float *dinp, float *dw, float *db,
                                const float *dout, const float *inp, const float *w,
                                const int32_t *off, int G, int IC, int OC) {
    if (m->params16)
        return kiln_cuda_linear_grouped_backward_bf16(dinp, dw, db, dout, inp, as16(m, w), off, G,
                                                      IC, OC);
    return kiln_cuda_linear_grouped_backward(dinp, dw, db, dout, inp, w, off, G, IC, OC);
}

#define ZERO(ptr, n) KILN_TRY(kiln_cuda_memset((ptr), 0, (size_t)(n) * sizeof *(ptr)))

kiln_err kiln_tsmoe_cuda_forward(kiln_tsmoe_cuda *m, const float *x, const float *targets, int B,
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
    m->have_targets = false;
    const int capacity = targets ? kiln_tsmoe_capacity(k, N, o.capacity_factor) : 0;
    const kiln_tsmoe_view *p = &m->p;
    kiln_tsmoe_acts *ac = &m->act;
    KILN_TRY(kiln_cuda_upload(m->x, x, (size_t)N * F * sizeof(float)));
    if (targets) KILN_TRY(kiln_cuda_upload(m->targets, targets, (size_t)N * O * sizeof(float)));
    if (m->params16) KILN_TRY(kiln_cuda_to_bf16(m->params16, m->params, m->numel));
    ZERO(m->r_losses, 2 * L + 1);
    ZERO(m->r_stats, 3 * L + 1);
    ZERO(m->r_load, (size_t)L * (E ? E : 1));
    ZERO(m->r_dropped, L);

    KILN_TRY(kiln_cuda_standardize_forward(ac->xs, m->x, p->in_mean, p->in_std, N, F));
    float *h = L ? ac->layers[0].res : ac->hL;
    KILN_TRY(lin_fwd(m, h, ac->xs, p->embed_w, p->embed_b, N, F, D));
    /* normed: the residual add that made this layer's input also normed it (one kernel,
     * kiln_cuda_residual_rmsnorm_forward, the same bits as the add and the norm). */
    bool normed = false;
    for (int l = 0; l < L; l++) {
        kiln_tsmoe_layer_acts *a = &ac->layers[l];
        const kiln_tsmoe_layer_view *w = &p->layers[l];
        float *next = l + 1 < L ? ac->layers[l + 1].res : ac->hL;
        float *st_attn = m->r_stats + l, *st_router = m->r_stats + L + l,
              *st_rms = m->r_stats + 2 * L + l;
        if (!normed)
            KILN_TRY(kiln_cuda_rmsnorm_forward(a->u1, a->rstd1, a->res, w->attn_norm, k->norm_eps,
                                               N, D));
        normed = false;
        KILN_TRY(lin_fwd(m, a->qkv, a->u1, w->qkv_w, w->qkv_b, N, D, 3 * D));
        KILN_TRY(kiln_cuda_attention_forward(a->ao, a->att, a->qkv, B, S, D, H, W));
        KILN_TRY(lin_fwd(m, ac->tmp, a->ao, w->out_w, w->out_b, N, D, D));
        KILN_TRY(kiln_cuda_residual_rmsnorm_forward(a->mid, a->u2, a->rstd2, a->res, ac->tmp,
                                                    w->ffn_norm, k->norm_eps, N, D));
        KILN_TRY(kiln_cuda_stats_entropy(st_attn, a->att, (size_t)B * H * S, (size_t)W));
        if (!E) {
            KILN_TRY(lin_fwd(m, a->hpre, a->u2, w->fc_w, w->fc_b, N, D, Fh));
            KILN_TRY(kiln_cuda_gelu_forward(a->hact, a->hpre, (size_t)N * Fh));
            KILN_TRY(lin_fwd(m, ac->tmp, a->hact, w->proj_w, w->proj_b, N, Fh, D));
            /* next = mid + tmp, normed by the next layer's attention norm or the final one */
            if (l + 1 < L)
                KILN_TRY(kiln_cuda_residual_rmsnorm_forward(
                    next, ac->layers[l + 1].u1, ac->layers[l + 1].rstd1, a->mid, ac->tmp,
                    p->layers[l + 1].attn_norm, k->norm_eps, N, D));
            else
                KILN_TRY(kiln_cuda_residual_rmsnorm_forward(
                    next, ac->uf, ac->rstdf, a->mid, ac->tmp, p->final_norm, k->norm_eps, N, D));
            normed = true;
        } else {
            /* The router stays in f32 in every precision: its choices are discrete. */
            KILN_TRY(kiln_cuda_linear_forward(a->logits, a->u2, w->router, NULL, N, D, E));
            KILN_TRY(
                kiln_cuda_router_forward(a->probs, a->lse, a->idx, a->gates, a->logits, N, E, K));
            KILN_TRY(kiln_cuda_router_loss_forward(m->r_load + (size_t)l * E, m->r_losses + 2 * l,
                                                   a->probs, a->lse, a->idx, N, E, K));
            KILN_TRY(kiln_cuda_moe_dispatch(a->offsets, a->pos, a->rows, m->r_dropped + l, a->idx,
                                            capacity, N, E, K));
            int32_t *off = m->offsets_h + (size_t)l * (E + 1);
            KILN_TRY(kiln_cuda_download(off, a->offsets, (size_t)(E + 1) * sizeof(int32_t)));
            KILN_FAIL_IF(off[0] != 0 || off[E] < 0 || off[E] > N * K, KILN_ERR_INTERNAL,
                         "'forward': layer %d: dispatch plan out of range (%d rows)", l, off[E]);
            KILN_TRY(kiln_cuda_moe_gather_forward(a->xg, a->u2, a->rows, off[E], D));
            /* The experts: one grouped GEMM per weight, one GELU over all their rows. */
            KILN_TRY(lin_grouped_fwd(m, a->hpre, a->xg, w->fc_w, w->fc_b, off, E, D, Fh));
            KILN_TRY(kiln_cuda_gelu_forward(a->hact, a->hpre, (size_t)off[E] * Fh));
            KILN_TRY(lin_grouped_fwd(m, a->yg, a->hact, w->proj_w, w->proj_b, off, E, Fh, D));
            KILN_TRY(kiln_cuda_moe_combine_forward(next, a->mid, a->yg, a->gates, a->pos, N, D, K));
            KILN_TRY(kiln_cuda_stats_entropy(st_router, a->probs, (size_t)N, (size_t)E));
        }
        KILN_TRY(kiln_cuda_stats_rms(st_rms, next, (size_t)N * D));
    }
    if (!normed)
        KILN_TRY(
            kiln_cuda_rmsnorm_forward(ac->uf, ac->rstdf, ac->hL, p->final_norm, k->norm_eps, N, D));
    KILN_TRY(lin_fwd(m, ac->y, ac->uf, p->head_w, p->head_b, N, D, O));
    KILN_TRY(kiln_cuda_stats_maxabs(m->r_stats + 3 * L, ac->y, (size_t)N * O));
    if (targets)
        KILN_TRY(kiln_cuda_mse_forward(m->r_losses + 2 * L, ac->y, m->targets, (size_t)N * O));

    KILN_TRY(kiln_cuda_download(m->h_losses, m->r_losses, (2 * (size_t)L + 1) * sizeof(double)));
    KILN_TRY(kiln_cuda_download(m->h_stats, m->r_stats, (3 * (size_t)L + 1) * sizeof(float)));
    KILN_TRY(kiln_cuda_download(m->h_load, m->r_load, (size_t)L * (E ? E : 1) * sizeof(float)));
    KILN_TRY(kiln_cuda_download(m->h_dropped, m->r_dropped, (size_t)L * sizeof(int)));
    KILN_TRY(kiln_cuda_sync());
    m->stats.max_abs_output = m->h_stats[3 * L];
    double lb_sum = 0.0, z_sum = 0.0;
    for (int l = 0; l < L; l++) {
        lb_sum += m->h_losses[2 * l];
        z_sum += m->h_losses[2 * l + 1];
        m->h_overflow[l] = E ? (float)m->h_dropped[l] / (float)((size_t)N * K) : 0.0f;
    }
    kiln_loss out = {0, 0, 0, 0};
    if (targets) {
        out = kiln_tsmoe_loss_total(m->h_losses[2 * L], lb_sum, z_sum, &o);
        m->have_targets = true;
    }
    if (loss) *loss = out;
    return KILN_OK;
}

kiln_err kiln_tsmoe_cuda_backward(kiln_tsmoe_cuda *m, float scale) {
    KILN_FAIL_IF(!m->have_targets, KILN_ERR_USAGE, "'backward': the last forward had no targets");
    const kiln_model_config *k = &m->cfg;
    const int B = m->B, S = k->seq_len, D = k->d_model, H = k->n_heads, W = k->attn_window,
              E = k->n_experts, K = k->top_k, Fh = k->d_ff, F = k->n_features, O = k->n_outputs,
              L = k->n_layers;
    const int N = B * S;
    const kiln_tsmoe_view *p = &m->p, *g = &m->g;
    kiln_tsmoe_acts *ac = &m->act;
    const size_t ND = (size_t)N * D;

    ZERO(ac->dy, (size_t)N * O);
    KILN_TRY(kiln_cuda_mse_backward(ac->dy, ac->y, m->targets, scale, (size_t)N * O));
    ZERO(ac->duf, ND);
    KILN_TRY(lin_bwd(m, ac->duf, g->head_w, g->head_b, ac->dy, ac->uf, p->head_w, N, D, O));
    ZERO(ac->dres, ND);
    KILN_TRY(kiln_cuda_rmsnorm_backward(ac->dres, g->final_norm, ac->duf, ac->hL, p->final_norm,
                                        ac->rstdf, N, D));
    GRADS_DONE(m->n_params - 3); /* final_norm, head.weight, head.bias */
    for (int l = L - 1; l >= 0; l--) {
        kiln_tsmoe_layer_acts *a = &ac->layers[l];
        const kiln_tsmoe_layer_view *w = &p->layers[l], *gw = &g->layers[l];
        ZERO(ac->du, ND);
        if (!E) {
            ZERO(ac->dh2, (size_t)N * Fh);
            KILN_TRY(lin_bwd(m, ac->dh2, gw->proj_w, gw->proj_b, ac->dres, a->hact, w->proj_w, N,
                             Fh, D));
            ZERO(ac->dh1, (size_t)N * Fh);
            KILN_TRY(kiln_cuda_gelu_backward(ac->dh1, ac->dh2, a->hpre, (size_t)N * Fh));
            KILN_TRY(lin_bwd(m, ac->du, gw->fc_w, gw->fc_b, ac->dh1, a->u2, w->fc_w, N, D, Fh));
        } else {
            const int32_t *off = m->offsets_h + (size_t)l * (E + 1);
            const int M = off[E];
            ZERO(ac->dyg, (size_t)M * D);
            ZERO(ac->dgates, (size_t)N * K);
            KILN_TRY(kiln_cuda_moe_combine_backward(ac->dyg, ac->dgates, ac->dres, a->yg, a->gates,
                                                    a->pos, N, D, K));
            ZERO(ac->dh1, (size_t)M * Fh);
            ZERO(ac->dh2, (size_t)M * Fh);
            ZERO(ac->dxg, (size_t)M * D);
            KILN_TRY(lin_grouped_bwd(m, ac->dh2, gw->proj_w, gw->proj_b, ac->dyg, a->hact,
                                     w->proj_w, off, E, Fh, D));
            KILN_TRY(kiln_cuda_gelu_backward(ac->dh1, ac->dh2, a->hpre, (size_t)M * Fh));
            KILN_TRY(lin_grouped_bwd(m, ac->dxg, gw->fc_w, gw->fc_b, ac->dh1, a->xg, w->fc_w, off,
                                     E, D, Fh));
            KILN_TRY(kiln_cuda_moe_gather_backward(ac->du, ac->dxg, a->pos, N, D, K));
            ZERO(ac->dlogits, (size_t)N * E);
            KILN_TRY(kiln_cuda_router_backward(ac->dlogits, ac->dgates, a->probs, a->lse, a->idx,
                                               a->gates, m->r_load + (size_t)l * E,
                                               scale * m->opts.aux_loss_coef,
                                               scale * m->opts.z_loss_coef, N, E, K));
            KILN_TRY(kiln_cuda_linear_backward(ac->du, gw->router, NULL, ac->dlogits, a->u2,
                                               w->router, N, D, E));
        }
        KILN_TRY(kiln_cuda_rmsnorm_backward(ac->dres, gw->ffn_norm, ac->du, a->mid, w->ffn_norm,
                                            a->rstd2, N, D));
        ZERO(ac->dao, ND);
        KILN_TRY(lin_bwd(m, ac->dao, gw->out_w, gw->out_b, ac->dres, a->ao, w->out_w, N, D, D));
        ZERO(ac->dqkv, ND * 3);
        KILN_TRY(kiln_cuda_attention_backward(ac->dqkv, ac->datt, ac->dao, a->qkv, a->att, B, S, D,
                                              H, W));
        ZERO(ac->du, ND);
        KILN_TRY(lin_bwd(m, ac->du, gw->qkv_w, gw->qkv_b, ac->dqkv, a->u1, w->qkv_w, N, D, 3 * D));
        KILN_TRY(kiln_cuda_rmsnorm_backward(ac->dres, gw->attn_norm, ac->du, a->res, w->attn_norm,
                                            a->rstd1, N, D));
        GRADS_DONE(m->layer_first[l]);
    }
    KILN_TRY(lin_bwd(m, NULL, g->embed_w, g->embed_b, ac->dres, ac->xs, p->embed_w, N, F, D));
    GRADS_DONE(0);
    return KILN_OK;
}

#else /* no CUDA in this build: the API exists and says so */

#define NO_CUDA                                                                                    \
    kiln_fail(KILN_ERR_UNSUPPORTED, "'cuda network': this build of kiln has no CUDA (nvcc was "    \
                                    "not found when it was built)")

kiln_err kiln_tsmoe_cuda_create(const kiln_model_config *cfg, int max_batch,
                                const kiln_cuda_opts *opts, kiln_tsmoe_cuda **out) {
    (void)cfg, (void)max_batch, (void)opts;
    *out = NULL;
    return NO_CUDA;
}
void kiln_tsmoe_cuda_free(kiln_tsmoe_cuda *m) {
    (void)m;
}
const kiln_param *kiln_tsmoe_cuda_param_table(const kiln_tsmoe_cuda *m, size_t *count) {
    (void)m;
    if (count) *count = 0;
    return NULL;
}
size_t kiln_tsmoe_cuda_numel(const kiln_tsmoe_cuda *m) {
    (void)m;
    return 0;
}
kiln_err kiln_tsmoe_cuda_upload_params(kiln_tsmoe_cuda *m, const float *params) {
    (void)m, (void)params;
    return NO_CUDA;
}
kiln_err kiln_tsmoe_cuda_download_params(const kiln_tsmoe_cuda *m, float *params) {
    (void)m, (void)params;
    return NO_CUDA;
}
kiln_err kiln_tsmoe_cuda_download_grads(const kiln_tsmoe_cuda *m, float *grads) {
    (void)m, (void)grads;
    return NO_CUDA;
}
float *kiln_tsmoe_cuda_device_params(kiln_tsmoe_cuda *m) {
    (void)m;
    return NULL;
}
float *kiln_tsmoe_cuda_device_grads(kiln_tsmoe_cuda *m) {
    (void)m;
    return NULL;
}
kiln_err kiln_tsmoe_cuda_zero_grads(kiln_tsmoe_cuda *m) {
    (void)m;
    return NO_CUDA;
}
kiln_err kiln_tsmoe_cuda_forward(kiln_tsmoe_cuda *m, const float *x, const float *targets, int B,
                                 const kiln_loss_opts *opts, kiln_loss *loss) {
    (void)m, (void)x, (void)targets, (void)B, (void)opts, (void)loss;
    return NO_CUDA;
}
kiln_err kiln_tsmoe_cuda_outputs(const kiln_tsmoe_cuda *m, float *y) {
    (void)m, (void)y;
    return NO_CUDA;
}
const kiln_tsmoe_stats *kiln_tsmoe_cuda_last_stats(const kiln_tsmoe_cuda *m) {
    (void)m;
    return NULL;
}
kiln_err kiln_tsmoe_cuda_backward(kiln_tsmoe_cuda *m, float scale) {
    (void)m, (void)scale;
    return NO_CUDA;
}
kiln_err kiln_tsmoe_cuda_sync(kiln_tsmoe_cuda *m) {
    (void)m;
    return NO_CUDA;
}
void kiln_tsmoe_cuda_set_grad_hook(kiln_tsmoe_cuda *m, kiln_tsmoe_cuda_grad_hook fn, void *ctx) {
    (void)m, (void)fn, (void)ctx;
}
#endif

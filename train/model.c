/* model.c - the kiln-tsmoe/1 network being trained: parameters, gradients and activations
 * each in one block (views into it, as llm.c's malloc_and_point_parameters), forward and
 * backward as docs/model.md, built from the ops of kernels.h. Nothing here allocates after
 * kiln_tsmoe_create. */
#include <math.h>
#include <stdlib.h>
#include <string.h>


#include "kernels.h"
#include "route.h"
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
    /* threads (the work items below) */
    kiln_pool *pool; /* NULL: one thread */
    int stage, l;    /* the loop step_item runs */
    const float *x;  /* the last forward's input */
    int nwp, nwf;    /* weight blocks of an expert's proj and fc */
    float lb_scale, z_scale;
    float *npart;    /* [pieces(N),D] a norm's weight gradient per piece */
    double *spart;   /* [max_batch + 2 pieces(N) + E + 1] statistics per item */
    int32_t *eitems; /* [pieces(N K) + E, 3] the experts' row pieces: expert, first row, rows */
};

/* ---- work items ----
 * Every op of a step is cut into items whose bounds depend on the sizes only: PIECE rows of
 * tokens (or of an expert's gathered rows), WBLOCK output channels of a weight gradient (its
 * sum over the tokens is one kiln_gemm), or one sequence of the batch (attention). An item writes
 * outputs no other item of its loop writes, and a sum over items (a norm's weight gradient, a
 * statistic) is added up in item order after the loop. So the thread count decides which
 * thread computes an item, never an item's bits: a step gives the same result on 1 or 64
 * threads. kiln_gemm sums each element in one fixed order whatever the call's shape or the
 * CPU (kernels/cpu/gemm.c), so neither the thread count nor the host changes a bit either.
 * Items go to the threads of m->pool (train/pool.c) as they come free: any order is as good
 * as any other, and it evens out items of unequal cost (experts' unequal row counts). */
#define PIECE 64
#define WBLOCK 64

static inline int pieces(int n) {
    return (n + PIECE - 1) / PIECE;
}
static inline int piece_rows(int n, int i) {
    const int r = n - i * PIECE;
    return r < PIECE ? r : PIECE;
}
static inline int wblocks(int oc) {
    return (oc + WBLOCK - 1) / WBLOCK;
}

static double entropy_sum(const float *p, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        if (p[i] > 0.0f) s -= (double)p[i] * log((double)p[i]);
    return s;
}
static double square_sum(const float *x, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}
static double sum_in_order(const double *part, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += part[i];
    return s;
}

/* dinp[n,IC] += dout[n,OC] @ weight[OC,IC]: the input gradient of n rows. */
static void dinp_rows(float *dinp, const float *dout, const float *weight, int n, int IC, int OC) {
    kiln_gemm(n, IC, OC, dout, (size_t)OC, 1, weight, (size_t)IC, 1, dinp, (size_t)IC, true);
}

/* Output channels o0..o0+oc-1 of a weight gradient over N rows: dweight += dout^T @ inp and
 * dbias (or NULL) += the column sums, rows in order. */
static void dweight_block(float *dweight, float *dbias, const float *dout, const float *inp, int N,
                          int IC, int OC, int o0, int oc) {
    if (N <= 0) return;
    kiln_gemm(oc, IC, N, dout + o0, 1, (size_t)OC, inp, (size_t)IC, 1, dweight + (size_t)o0 * IC,
              (size_t)IC, true);
    if (dbias)
        for (int n = 0; n < N; n++) {
            const float *row = dout + (size_t)n * OC + o0;
            for (int o = 0; o < oc; o++)
                dbias[o0 + o] += row[o];
        }
}

/* Zero rows r0..r0+n-1 of a [*,C] buffer: an item clears the rows it is the first to add
 * into, so the clearing runs on the threads and next to its use (the same bits as clearing
 * the whole buffer before the loop). */
static void zero_rows(float *x, size_t r0, size_t n, size_t C) {
    memset(x + r0 * C, 0, n * C * sizeof *x);
}

/* kiln_linear_backward in items: the weight's blocks, then the input's pieces (which set
 * their rows of dinp to zero first when zero is set). A piece then runs then(then_arg, piece)
 * when set: the next op of the backward pass on the same rows, which needs only those rows
 * of dinp (a norm's or GELU's backward), in the same loop instead of one of its own. */
typedef struct lin_bwd {
    float *dinp, *dweight, *dbias;
    const float *dout, *inp, *weight;
    int N, IC, OC, nw;
    bool zero;
    kiln_pool_fn then;
    void *then_arg;
} lin_bwd;

static void lin_bwd_item(void *arg, int it) {
    const lin_bwd *a = arg;
    if (it < a->nw) {
        const int o0 = it * WBLOCK, oc = a->OC - o0 < WBLOCK ? a->OC - o0 : WBLOCK;
        dweight_block(a->dweight, a->dbias, a->dout, a->inp, a->N, a->IC, a->OC, o0, oc);
    } else {
        const int i = it - a->nw;
        const size_t r0 = (size_t)i * PIECE;
        if (a->zero) zero_rows(a->dinp, r0, (size_t)piece_rows(a->N, i), (size_t)a->IC);
        dinp_rows(a->dinp + r0 * a->IC, a->dout + r0 * a->OC, a->weight, piece_rows(a->N, i), a->IC,
                  a->OC);
        if (a->then) a->then(a->then_arg, i);
    }
}

/* zero: dinp is this pass's first gradient into dinp (its rows are set, not added to);
 * then, then_arg: lin_bwd's. */
static void linear_backward(const kiln_tsmoe *m, float *dinp, float *dweight, float *dbias,
                            const float *dout, const float *inp, const float *weight, int N, int IC,
                            int OC, bool zero, kiln_pool_fn then, void *then_arg) {
    lin_bwd a = {.dinp = dinp,
                 .dweight = dweight,
                 .dbias = dbias,
                 .dout = dout,
                 .inp = inp,
                 .weight = weight,
                 .N = N,
                 .IC = IC,
                 .OC = OC,
                 .nw = wblocks(OC),
                 .zero = zero,
                 .then = then,
                 .then_arg = then_arg};
    kiln_pool_run(m->pool, a.nw + (dinp ? pieces(N) : 0), lin_bwd_item, &a);
}

/* kiln_rmsnorm_backward in pieces (norm_bwd_item, run by the linear_backward before it as
 * its `then`): each piece's weight gradient into its own row of m->npart, those added to
 * dweight in piece order after the loop (norm_weight_sum); with zero, dinp's rows are set,
 * not added to. */
typedef struct norm_bwd {
    float *dinp, *npart;
    const float *dout, *inp, *weight, *rstd;
    int N, D;
    bool zero;
} norm_bwd;

static void norm_bwd_item(void *arg, int i) {
    const norm_bwd *a = arg;
    const size_t r0 = (size_t)i * PIECE, D = (size_t)a->D;
    float *part = a->npart + (size_t)i * D;
    memset(part, 0, D * sizeof *part);
    if (a->zero) zero_rows(a->dinp, r0, (size_t)piece_rows(a->N, i), D);
    kiln_rmsnorm_backward(a->dinp + r0 * D, part, a->dout + r0 * D, a->inp + r0 * D, a->weight,
                          a->rstd + r0, piece_rows(a->N, i), a->D);
}

static void norm_weight_sum(const kiln_tsmoe *m, float *dweight, int N, int D) {
    const int np = pieces(N);
    for (int i = 0; i < np; i++)
        for (int d = 0; d < D; d++)
            dweight[d] += m->npart[(size_t)i * D + d];
}

/* The experts' row pieces of one mixture layer into m->eitems; returns their count. */
static int expert_items(kiln_tsmoe *m, const int32_t *offsets, int E) {
    int n = 0;
    for (int e = 0; e < E; e++)
        for (int r = offsets[e]; r < offsets[e + 1]; r += PIECE) {
            int32_t *it = m->eitems + (size_t)n++ * 3;
            it[0] = e;
            it[1] = r;
            it[2] = offsets[e + 1] - r < PIECE ? offsets[e + 1] - r : PIECE;
        }
    return n;
}

kiln_err kiln_tsmoe_set_threads(kiln_tsmoe *m, int threads) {
    if (threads < 1) threads = 1;
    if (threads == kiln_pool_threads(m->pool)) return KILN_OK;
    kiln_pool_free(m->pool);
    m->pool = NULL;
    return threads > 1 ? kiln_pool_create(threads, &m->pool) : KILN_OK;
}

kiln_pool *kiln_tsmoe_pool(kiln_tsmoe *m) {
    return m->pool;
}

/* The activation block holds the plan's buffers (layout.c), then the stats. */
static void carve_acts(kiln_tsmoe *m, kiln_carver *c) {
    kiln_tsmoe_carve_acts(&m->cfg, m->max_batch, c, &m->act);
    const size_t L = (size_t)m->cfg.n_layers, Es = m->cfg.n_experts ? m->cfg.n_experts : 1;
    m->st_attn = kiln_carve_f32(c, L);
    m->st_router = kiln_carve_f32(c, L);
    m->st_load = kiln_carve_f32(c, L * Es);
    m->st_overflow = kiln_carve_f32(c, L);
    m->st_rms = kiln_carve_f32(c, L);
    const int N = m->max_batch * m->cfg.seq_len, K = m->cfg.top_k;
    const size_t np = (size_t)pieces(N);
    m->npart = kiln_carve_f32(c, np * (size_t)m->cfg.d_model);
    m->spart = kiln_carve(c, (size_t)m->max_batch + 2 * np + Es + 1, sizeof(double));
    m->eitems = kiln_carve_i32(c, 3 * ((size_t)pieces(N * K) + Es));
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
    kiln_carver c = {NULL, 0, 64}; /* 64: a cache line, and so a double's alignment */
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
    *out = m;
    return KILN_OK;
fail:
    kiln_tsmoe_free(m);
    return rc;
}

void kiln_tsmoe_free(kiln_tsmoe *m) {
    if (!m) return;
    kiln_pool_free(m->pool);
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
#define ZERO_CHUNK 65536

static void zero_item(void *arg, int i) {
    kiln_tsmoe *m = arg;
    const size_t k0 = (size_t)i * ZERO_CHUNK, n = m->numel - k0;
    memset(m->grads + k0, 0, (n < ZERO_CHUNK ? n : ZERO_CHUNK) * sizeof(float));
}

void kiln_tsmoe_zero_grads(kiln_tsmoe *m) {
    kiln_pool_run(m->pool, (int)((m->numel + ZERO_CHUNK - 1) / ZERO_CHUNK), zero_item, m);
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

/* dinp[t] += dxg[m] for the gathered rows m of token t, m ascending (as
 * kiln_moe_gather_backward, which walks m in order), for tokens t0..t0+n-1. */
static void gather_backward_tokens(float *dinp, const float *dxg, const int32_t *pos, int t0, int n,
                                   int D, int K) {
    for (int t = t0; t < t0 + n; t++) {
        float *dst = dinp + (size_t)t * D;
        const int32_t *ps = pos + (size_t)t * K;
        int32_t last = -1;
        for (;;) { /* the next larger row: K is small */
            int32_t mn = -1;
            for (int k = 0; k < K; k++)
                if (ps[k] > last && (mn < 0 || ps[k] < mn)) mn = ps[k];
            if (mn < 0) break;
            const float *src = dxg + (size_t)mn * D;
            for (int d = 0; d < D; d++)
                dst[d] += src[d];
            last = mn;
        }
    }
}

/* The next layer's attention norm and qkv (layer l < L) or the final norm and the head
 * (l == L) on rows r0..r0+n-1, whose input rows the piece that calls it has just written: the
 * end of the piece loop before (the embedding, the dense FFN or the combine), not a loop of
 * its own. */
static void attn_in_rows(kiln_tsmoe *m, int l, size_t r0, int n) {
    const kiln_model_config *k = &m->cfg;
    const int D = k->d_model, O = k->n_outputs;
    kiln_tsmoe_acts *ac = &m->act;
    if (l < k->n_layers) {
        kiln_tsmoe_layer_acts *a = &ac->layers[l];
        const kiln_tsmoe_layer_view *w = &m->p.layers[l];
        kiln_rmsnorm_forward(a->u1 + r0 * D, a->rstd1 + r0, a->res + r0 * D, w->attn_norm,
                             k->norm_eps, n, D);
        kiln_linear_forward(a->qkv + r0 * 3 * D, a->u1 + r0 * D, w->qkv_w, w->qkv_b, n, D, 3 * D);
    } else {
        kiln_rmsnorm_forward(ac->uf + r0 * D, ac->rstdf + r0, ac->hL + r0 * D, m->p.final_norm,
                             k->norm_eps, n, D);
        kiln_linear_forward(ac->y + r0 * O, ac->uf + r0 * D, m->p.head_w, m->p.head_b, n, D, O);
    }
}

/* The loops of a step, one item at a time: m->stage says which, m->l the layer, m->B the
 * batch of the last forward, m->x its input. */
enum {
    F_INPUT,   /* piece: standardise, embed; layer 0's attention norm, qkv */
    F_ATTN,    /* sequence: attention, its entropy */
    F_MID,     /* piece: out projection, residual, ffn norm; dense FFN (and the next layer's
                  attention norm and qkv, or the head) or router */
    F_EXPERTS, /* expert piece: gather, fc, GELU, proj */
    F_COMBINE, /* piece: combine, RMS; the next layer's attention norm and qkv, or the head;
                  then E + 1 items: an expert's load and auxiliary term, the router's z sum */
    B_GELU,    /* piece: dense GELU backward (the proj's input gradient pieces run it) */
    B_COMBINE, /* piece: combine backward */
    B_PROJ,    /* expert proj weight blocks, then expert pieces: dh2, GELU backward */
    B_FC,      /* expert fc weight blocks, then expert pieces: dxg */
    B_ROUTER,  /* piece: gather backward, router backward */
    B_ATTN     /* sequence: attention backward */
};

static void step_item(void *arg, int i) {
    kiln_tsmoe *m = arg;
    const kiln_model_config *k = &m->cfg;
    const int S = k->seq_len, D = k->d_model, H = k->n_heads, W = k->attn_window, E = k->n_experts,
              K = k->top_k, Fh = k->d_ff, F = k->n_features, L = k->n_layers;
    const int B = m->B, N = B * S, np = pieces(N), l = m->l;
    const kiln_tsmoe_view *p = &m->p, *g = &m->g;
    kiln_tsmoe_acts *ac = &m->act;
    kiln_tsmoe_layer_acts *a = l < L ? &ac->layers[l] : NULL;
    const kiln_tsmoe_layer_view *w = l < L ? &p->layers[l] : NULL,
                                *gw = l < L ? &g->layers[l] : NULL;
    float *next = l + 1 < L ? ac->layers[l + 1].res : ac->hL;
    double *s_att = m->spart, *s_router = s_att + m->max_batch, *s_rms = s_router + np,
           *s_aux = s_rms + np;
    const size_t r0 = (size_t)i * PIECE;
    const int n = piece_rows(N, i);
    switch (m->stage) {
    case F_INPUT: {
        float *h0 = L ? ac->layers[0].res : ac->hL;
        kiln_standardize_forward(ac->xs + r0 * F, m->x + r0 * F, p->in_mean, p->in_std, n, F);
        kiln_linear_forward(h0 + r0 * D, ac->xs + r0 * F, p->embed_w, p->embed_b, n, F, D);
        attn_in_rows(m, 0, r0, n);
        break;
    }
    case F_ATTN: {
        const size_t at = (size_t)i * H * S * W;
        kiln_attention_forward(a->ao + (size_t)i * S * D, a->att + at,
                               a->qkv + (size_t)i * S * 3 * D, 1, S, D, H, W);
        s_att[i] = entropy_sum(a->att + at, (size_t)H * S * W);
        break;
    }
    case F_MID: {
        float *tmp = ac->tmp + r0 * D;
        kiln_linear_forward(tmp, a->ao + r0 * D, w->out_w, w->out_b, n, D, D);
        kiln_residual_forward(a->mid + r0 * D, a->res + r0 * D, tmp, (size_t)n * D);
        kiln_rmsnorm_forward(a->u2 + r0 * D, a->rstd2 + r0, a->mid + r0 * D, w->ffn_norm,
                             k->norm_eps, n, D);
        if (!E) {
            kiln_linear_forward(a->hpre + r0 * Fh, a->u2 + r0 * D, w->fc_w, w->fc_b, n, D, Fh);
            kiln_gelu_forward(a->hact + r0 * Fh, a->hpre + r0 * Fh, (size_t)n * Fh);
            kiln_linear_forward(tmp, a->hact + r0 * Fh, w->proj_w, w->proj_b, n, Fh, D);
            kiln_residual_forward(next + r0 * D, a->mid + r0 * D, tmp, (size_t)n * D);
            s_rms[i] = square_sum(next + r0 * D, (size_t)n * D);
            attn_in_rows(m, l + 1, r0, n);
        } else {
            kiln_linear_forward(a->logits + r0 * E, a->u2 + r0 * D, w->router, NULL, n, D, E);
            kiln_router_forward(a->probs + r0 * E, a->lse + r0, a->idx + r0 * K, a->gates + r0 * K,
                                a->logits + r0 * E, n, E, K);
            s_router[i] = entropy_sum(a->probs + r0 * E, (size_t)n * E);
        }
        break;
    }
    case F_EXPERTS: {
        const int32_t *it = m->eitems + (size_t)i * 3;
        const int e = it[0], ne = it[2];
        const size_t q0 = (size_t)it[1];
        kiln_moe_gather_forward(a->xg + q0 * D, a->u2, a->rows + q0, ne, D);
        kiln_linear_forward(a->hpre + q0 * Fh, a->xg + q0 * D, w->fc_w + (size_t)e * Fh * D,
                            w->fc_b + (size_t)e * Fh, ne, D, Fh);
        kiln_gelu_forward(a->hact + q0 * Fh, a->hpre + q0 * Fh, (size_t)ne * Fh);
        kiln_linear_forward(a->yg + q0 * D, a->hact + q0 * Fh, w->proj_w + (size_t)e * D * Fh,
                            w->proj_b + (size_t)e * D, ne, Fh, D);
        break;
    }
    case F_COMBINE:
        if (i >= np) { /* kiln_router_loss_forward's parts: they need no combine */
            if (i - np < E)
                s_aux[i - np] = kiln_router_load_expert(&m->st_load[(size_t)l * E + (i - np)],
                                                        a->probs, a->idx, N, E, K, i - np);
            else
                s_aux[E] = kiln_router_z_sum(a->lse, N);
            break;
        }
        kiln_moe_combine_forward(next + r0 * D, a->mid + r0 * D, a->yg, a->gates + r0 * K,
                                 a->pos + r0 * K, n, D, K);
        s_rms[i] = square_sum(next + r0 * D, (size_t)n * D);
        attn_in_rows(m, l + 1, r0, n);
        break;
    case B_GELU:
        zero_rows(ac->dh1, r0, (size_t)n, (size_t)Fh);
        kiln_gelu_backward(ac->dh1 + r0 * Fh, ac->dh2 + r0 * Fh, a->hpre + r0 * Fh, (size_t)n * Fh);
        break;
    case B_COMBINE:
        /* Each gathered row is one token's choice, so its piece is the first to add to it. */
        zero_rows(ac->dgates, r0, (size_t)n, (size_t)K);
        for (size_t c = r0 * K; c < (r0 + (size_t)n) * K; c++)
            if (a->pos[c] >= 0) zero_rows(ac->dyg, (size_t)a->pos[c], 1, (size_t)D);
        kiln_moe_combine_backward(ac->dyg, ac->dgates + r0 * K, ac->dres + r0 * D, a->yg,
                                  a->gates + r0 * K, a->pos + r0 * K, n, D, K);
        break;
    case B_PROJ:
        if (i < E * m->nwp) {
            const int e = i / m->nwp, o0 = (i % m->nwp) * WBLOCK;
            const size_t q0 = (size_t)a->offsets[e];
            dweight_block(gw->proj_w + (size_t)e * D * Fh, gw->proj_b + (size_t)e * D,
                          ac->dyg + q0 * D, a->hact + q0 * Fh, a->offsets[e + 1] - a->offsets[e],
                          Fh, D, o0, D - o0 < WBLOCK ? D - o0 : WBLOCK);
        } else {
            const int32_t *it = m->eitems + (size_t)(i - E * m->nwp) * 3;
            const int e = it[0], ne = it[2];
            const size_t q0 = (size_t)it[1];
            zero_rows(ac->dh2, q0, (size_t)ne, (size_t)Fh);
            zero_rows(ac->dh1, q0, (size_t)ne, (size_t)Fh);
            dinp_rows(ac->dh2 + q0 * Fh, ac->dyg + q0 * D, w->proj_w + (size_t)e * D * Fh, ne, Fh,
                      D);
            kiln_gelu_backward(ac->dh1 + q0 * Fh, ac->dh2 + q0 * Fh, a->hpre + q0 * Fh,
                               (size_t)ne * Fh);
        }
        break;
    case B_FC:
        if (i < E * m->nwf) {
            const int e = i / m->nwf, o0 = (i % m->nwf) * WBLOCK;
            const size_t q0 = (size_t)a->offsets[e];
            dweight_block(gw->fc_w + (size_t)e * Fh * D, gw->fc_b + (size_t)e * Fh,
                          ac->dh1 + q0 * Fh, a->xg + q0 * D, a->offsets[e + 1] - a->offsets[e], D,
                          Fh, o0, Fh - o0 < WBLOCK ? Fh - o0 : WBLOCK);
        } else {
            const int32_t *it = m->eitems + (size_t)(i - E * m->nwf) * 3;
            const int e = it[0], ne = it[2];
            const size_t q0 = (size_t)it[1];
            zero_rows(ac->dxg, q0, (size_t)ne, (size_t)D);
            dinp_rows(ac->dxg + q0 * D, ac->dh1 + q0 * Fh, w->fc_w + (size_t)e * Fh * D, ne, D, Fh);
        }
        break;
    case B_ROUTER: {
        const float *load = &m->st_load[(size_t)l * E];
        zero_rows(ac->du, r0, (size_t)n, (size_t)D);
        zero_rows(ac->dlogits, r0, (size_t)n, (size_t)E);
        gather_backward_tokens(ac->du, ac->dxg, a->pos, (int)r0, n, D, K);
        for (size_t t = r0; t < r0 + (size_t)n; t++)
            kiln_route_train_backward(ac->dlogits + t * E, ac->dgates + t * K, a->probs + t * E,
                                      a->lse[t], a->idx + t * K, a->gates + t * K, load,
                                      m->lb_scale, m->z_scale, E, K);
        break;
    }
    case B_ATTN: {
        const size_t at = (size_t)i * H * S * W;
        zero_rows(ac->dqkv, (size_t)i * S, (size_t)S, 3 * (size_t)D);
        kiln_attention_backward(ac->dqkv + (size_t)i * S * 3 * D, ac->datt + at,
                                ac->dao + (size_t)i * S * D, a->qkv + (size_t)i * S * 3 * D,
                                a->att + at, 1, S, D, H, W);
        break;
    }
    }
}

/* Run stage over count items of layer l. */
static void run_stage(kiln_tsmoe *m, int stage, int l, int count) {
    m->stage = stage;
    m->l = l;
    kiln_pool_run(m->pool, count, step_item, m);
}

kiln_err kiln_tsmoe_forward(kiln_tsmoe *m, const float *x, const float *targets, int B,
                            const kiln_loss_opts *opts, kiln_loss *loss) {
    const kiln_model_config *k = &m->cfg;
    KILN_FAIL_IF(B < 1 || B > m->max_batch, KILN_ERR_USAGE, "'forward': batch %d is outside 1..%d",
                 B, m->max_batch);
    const int S = k->seq_len, D = k->d_model, H = k->n_heads, E = k->n_experts, K = k->top_k,
              O = k->n_outputs, L = k->n_layers;
    const int N = B * S, np = pieces(N);
    const kiln_loss_opts o = kiln_tsmoe_loss_opts(opts);
    m->B = B;
    m->x = x;
    m->opts = o;
    m->have_targets = targets != NULL;
    m->targets = targets;
    /* Capacity limits apply to training steps only: inference never drops a token. */
    const int capacity = targets ? kiln_tsmoe_capacity(k, N, o.capacity_factor) : 0;
    kiln_tsmoe_acts *ac = &m->act;
    double lb_sum = 0.0, z_sum = 0.0;
    /* Statistics per item: attention's per sequence, the router's and the RMS per piece. */
    const double *s_att = m->spart, *s_router = s_att + m->max_batch, *s_rms = s_router + np,
                 *s_aux = s_rms + np;

    run_stage(m, F_INPUT, L, np); /* and layer 0's attention norm and qkv, or the head */
    for (int l = 0; l < L; l++) {
        kiln_tsmoe_layer_acts *a = &ac->layers[l];
        run_stage(m, F_ATTN, l, B);
        m->st_attn[l] = (float)(sum_in_order(s_att, B) / ((double)B * H * S));
        run_stage(m, F_MID, l, np);
        if (!E) {
            m->st_router[l] = 0.0f;
            m->st_load[l] = 0.0f;
            m->st_overflow[l] = 0.0f;
        } else {
            int dropped = 0;
            kiln_moe_dispatch(a->offsets, a->pos, a->rows, &dropped, a->idx, capacity, N, E, K);
            run_stage(m, F_EXPERTS, l, expert_items(m, a->offsets, E));
            /* The combine's pieces, then the router's auxiliary losses in E + 1 items, added
             * as kiln_router_loss_forward adds them. */
            run_stage(m, F_COMBINE, l, np + E + 1);
            lb_sum += E * sum_in_order(s_aux, E);
            z_sum += s_aux[E] / N;
            m->st_router[l] = (float)(sum_in_order(s_router, np) / N);
            m->st_overflow[l] = (float)dropped / (float)((size_t)N * K);
        }
        m->st_rms[l] = (float)sqrt(sum_in_order(s_rms, np) / ((double)N * D));
    }
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
    const int B = m->B, S = k->seq_len, D = k->d_model, E = k->n_experts, Fh = k->d_ff,
              F = k->n_features, O = k->n_outputs, L = k->n_layers;
    const int N = B * S, np = pieces(N);
    const kiln_tsmoe_view *p = &m->p, *g = &m->g;
    kiln_tsmoe_acts *ac = &m->act;

    memset(ac->dy, 0, (size_t)N * O * sizeof(float));
    kiln_mse_backward(ac->dy, ac->y, m->targets, scale, (size_t)N * O);
    /* The activations' gradients are set by the first item that adds to each row (the
     * `zero` flags and zero_rows in step_item), not cleared here: the clearing runs on the
     * threads too. */
    /* dres holds d loss / d h at the point the backward pass has reached. */
    norm_bwd nf = {ac->dres, m->npart, ac->duf, ac->hL, p->final_norm, ac->rstdf, N, D, true};
    linear_backward(m, ac->duf, g->head_w, g->head_b, ac->dy, ac->uf, p->head_w, N, D, O, true,
                    norm_bwd_item, &nf);
    norm_weight_sum(m, g->final_norm, N, D);
    for (int l = L - 1; l >= 0; l--) {
        kiln_tsmoe_layer_acts *a = &ac->layers[l];
        const kiln_tsmoe_layer_view *w = &p->layers[l], *gw = &g->layers[l];
        /* The ffn norm's backward, run by the pieces of the last linear_backward before it. */
        norm_bwd n2 = {ac->dres, m->npart, ac->du, a->mid, w->ffn_norm, a->rstd2, N, D, false};
        if (!E) {
            m->stage = B_GELU; /* run by the proj's input pieces */
            m->l = l;
            linear_backward(m, ac->dh2, gw->proj_w, gw->proj_b, ac->dres, a->hact, w->proj_w, N, Fh,
                            D, true, step_item, m);
            linear_backward(m, ac->du, gw->fc_w, gw->fc_b, ac->dh1, a->u2, w->fc_w, N, D, Fh, true,
                            norm_bwd_item, &n2);
        } else {
            run_stage(m, B_COMBINE, l, np);
            /* Per expert: its proj's weight blocks and its row pieces (dh2, then GELU's
             * backward into dh1); then its fc's weight blocks and row pieces (dxg). */
            const int ni = expert_items(m, a->offsets, E);
            m->nwp = wblocks(D);
            m->nwf = wblocks(Fh);
            run_stage(m, B_PROJ, l, E * m->nwp + ni);
            run_stage(m, B_FC, l, E * m->nwf + ni);
            /* kiln_router_backward's scales, for all N tokens (a piece must not use its own
             * row count). */
            m->lb_scale = scale * m->opts.aux_loss_coef * (float)E / (float)N;
            m->z_scale = scale * m->opts.z_loss_coef * 2.0f / (float)N;
            run_stage(m, B_ROUTER, l, np);
            linear_backward(m, ac->du, gw->router, NULL, ac->dlogits, a->u2, w->router, N, D, E,
                            false, norm_bwd_item, &n2);
        }
        /* The residual passes dres through unchanged; the norm's branch adds to it. */
        norm_weight_sum(m, gw->ffn_norm, N, D);
        linear_backward(m, ac->dao, gw->out_w, gw->out_b, ac->dres, a->ao, w->out_w, N, D, D, true,
                        NULL, NULL);
        run_stage(m, B_ATTN, l, B);
        norm_bwd n1 = {ac->dres, m->npart, ac->du, a->res, w->attn_norm, a->rstd1, N, D, false};
        linear_backward(m, ac->du, gw->qkv_w, gw->qkv_b, ac->dqkv, a->u1, w->qkv_w, N, D, 3 * D,
                        true, norm_bwd_item, &n1);
        norm_weight_sum(m, gw->attn_norm, N, D);
    }
    linear_backward(m, NULL, g->embed_w, g->embed_b, ac->dres, ac->xs, p->embed_w, N, F, D, false,
                    NULL, NULL);
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

/* forward.c - the batch forward over [B,S,F] raw inputs.
 *
 * Rows go through the model in blocks of at most BLOCK_ROWS so that the workspace stays
 * bounded whatever B and S are: short sequences are grouped whole into a block; a
 * sequence longer than a block is cut into chunks in time order, and each layer carries
 * the keys and values of the previous chunk's last W-1 rows into the next, which is
 * exact (attention sees at most W-1 rows back) and recomputes nothing. Matrix products
 * are kiln_gemm calls (kiln_linear_forward); bf16 matrices are widened into a scratch
 * buffer first. The per-row math is shared with the stream: the CPU kernels' (kernels.h:
 * standardisation, RMSNorm, GELU, the residual add; route.h: routing) and runtime_int.h's
 * attention over runs of keys.
 *
 * kiln_gemm computes each output element in one fixed order, whatever the product's height
 * or the CPU (kernels/cpu/gemm.c): a row has the same bits alone, in a batch, or beside any
 * number of tokens that chose the same expert, on every host. (With OpenBLAS each product
 * was once padded to 64 rows, because its kernel, and with it the order of a sum, changed
 * with the product's size; it changed with the host's CPU too, which no padding cures.) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "runtime.h"
#include "runtime_int.h"

#define BLOCK_ROWS 1024

/* Where each buffer sits in the workspace, in floats (ints are float-sized). */
typedef struct plan {
    int nmax;     /* rows per block */
    bool chunked; /* S > BLOCK_ROWS: one sequence per block, with a carried cache */
    size_t xn, h, u, qkv, att, ff, acc, gath, scores, wbuf, logits, gates, chosen,
        tok, gsel, kc, vc;
    size_t cache_rows; /* rows each layer's carried cache holds: min(W-1, S) */
    size_t total;      /* floats */
} plan;

static size_t take(size_t *at, size_t n) {
    size_t o = *at;
    *at += (n + 15) / 16 * 16;
    return o;
}

static bool make_plan(const kiln_model *m, int B, int S, plan *p) {
    const kiln_model_config *c = &m->cfg;
    size_t N;
    if (B < 1 || S < 1 || !kiln_mul_ok((size_t)B, (size_t)S, &N)) return false;
    memset(p, 0, sizeof *p);
    p->chunked = S > BLOCK_ROWS;
    p->nmax = (int)(N < BLOCK_ROWS ? N : BLOCK_ROWS);
    const size_t n = (size_t)p->nmax, D = (size_t)c->d_model, E = (size_t)c->n_experts,
                 K = (size_t)c->top_k;
    size_t at = 0;
    p->xn = take(&at, n * (size_t)c->n_features);
    p->h = take(&at, n * D);
    p->u = take(&at, n * D);
    p->qkv = take(&at, n * 3 * D);
    p->att = take(&at, n * D);
    p->ff = take(&at, n * (size_t)c->d_ff);
    /* A row attends to min(W, S) keys at most: sized by what a call can use, not by the
     * window alone (a model file's attn_window of 2^20 would otherwise cost every call). */
    const size_t keys = (size_t)c->attn_window < (size_t)S ? (size_t)c->attn_window : (size_t)S;
    p->scores = take(&at, (size_t)c->n_heads * (keys + 2));
    p->wbuf = take(&at, m->bf16 ? m->max_matrix : 0);
    if (E) {
        p->acc = take(&at, n * D);
        p->gath = take(&at, n * D);
        p->logits = take(&at, n * E);
        p->gates = take(&at, n * K);
        p->chosen = take(&at, n * K);
        p->tok = take(&at, n);
        p->gsel = take(&at, n);
    }
    if (p->chunked) {
        p->cache_rows =
            (size_t)(c->attn_window - 1) < (size_t)S ? (size_t)(c->attn_window - 1) : (size_t)S;
        size_t cache = (size_t)c->n_layers * p->cache_rows * D;
        p->kc = take(&at, cache);
        p->vc = take(&at, cache);
    }
    p->total = at;
    return true;
}

KILN_API size_t kiln_model_workspace_size(const kiln_model *m, int B, int S) {
    plan p;
    if (!make_plan(m, B, S, &p)) return 0;
    return p.total * sizeof(float) + 64; /* + room to align the caller's pointer */
}

/* Scratch of a product: the widened matrix (bf16 models). */
typedef struct gemm_buf {
    float *w;
} gemm_buf;

/* y[n,rows] = x[n,cols] @ W^T + b (b may be NULL). */
static void linear(const kiln_model *m, float *y, const float *x, int n, const void *W,
                   const float *b, int rows, int cols, const gemm_buf *g) {
    if (n == 0) return;
    const float *Wf = W;
    if (m->bf16) {
        kiln_rt_widen(m, g->w, W, (size_t)rows * cols);
        Wf = g->w;
    }
    kiln_linear_forward(y, x, Wf, b, n, cols, rows);
}

typedef struct block {
    int nseq, T; /* nseq sequences of T rows each */
    int t0;      /* time of the first row (chunked mode; 0 otherwise) */
} block;

/* Attention of layer l for every row of the block, then (chunked) the cache update. */
static void attention(const kiln_model *m, const plan *p, float *ws, const block *bk, int l) {
    const int D = m->cfg.d_model, W = m->cfg.attn_window;
    const float *qkv = ws + p->qkv;
    /* (The cache never holds more than the rows before the chunk: cache_rows a layer.) */
    float *kc = p->chunked ? ws + p->kc + (size_t)l * p->cache_rows * D : NULL;
    float *vc = p->chunked ? ws + p->vc + (size_t)l * p->cache_rows * D : NULL;
    const int nc = p->chunked ? (bk->t0 < W - 1 ? bk->t0 : W - 1) : 0; /* cached rows before t0 */
    for (int sq = 0; sq < bk->nseq; sq++)
        for (int i = 0; i < bk->T; i++) {
            size_t row = (size_t)sq * bk->T + (size_t)i;
            int from_cache = W - 1 - i < nc ? W - 1 - i : nc;
            if (from_cache < 0) from_cache = 0;
            int j0 = i - (W - 1) > 0 ? i - (W - 1) : 0;
            const float *r0 = qkv + ((size_t)sq * bk->T + (size_t)j0) * 3 * D;
            kiln_rt_kv runs[2] = {
                {kc ? kc + (size_t)(nc - from_cache) * D : NULL,
                 vc ? vc + (size_t)(nc - from_cache) * D : NULL, from_cache, (size_t)D},
                {r0 + D, r0 + 2 * D, i - j0 + 1, 3 * (size_t)D},
            };
            kiln_rt_attend(m, ws + p->att + row * D, ws + p->scores, qkv + row * 3 * D, runs, 2);
        }
    if (!p->chunked || W == 1) return;
    /* Keep the last W-1 rows of (cache, this chunk) for the next chunk. */
    const int keep_total = W - 1, T = bk->T;
    int keep_old = keep_total - T < nc ? keep_total - T : nc;
    if (keep_old < 0) keep_old = 0;
    memmove(kc, kc + (size_t)(nc - keep_old) * D, (size_t)keep_old * D * sizeof *kc);
    memmove(vc, vc + (size_t)(nc - keep_old) * D, (size_t)keep_old * D * sizeof *vc);
    int take_new = T < keep_total ? T : keep_total;
    for (int i = 0; i < take_new; i++) {
        const float *r = qkv + (size_t)(T - take_new + i) * 3 * D;
        memcpy(kc + (size_t)(keep_old + i) * D, r + D, (size_t)D * sizeof *kc);
        memcpy(vc + (size_t)(keep_old + i) * D, r + 2 * D, (size_t)D * sizeof *vc);
    }
}

/* Each token's router margin (runtime.h, kiln_runtime_forward_margins) from its logits
 * lg [n,E] and router inputs u [n,D], into margin[t * stride]. W: the router matrix as
 * f32 (widened already for a bf16 model). */
static void router_margins(const kiln_model *m, const float *lg, const float *u, const float *W,
                           int n, float *margin, size_t stride) {
    const int D = m->cfg.d_model, E = m->cfg.n_experts, K = m->cfg.top_k;
    for (int t = 0; t < n; t++) {
        const float *l = lg + (size_t)t * E, *ut = u + (size_t)t * D;
        if (K >= E) {
            margin[(size_t)t * stride] = INFINITY; /* every expert runs: nothing to tie */
            continue;
        }
        /* The K-th and (K+1)-th experts in the routing order (the order of the logits is
         * that of their softmax), picked as kiln_route_stream picks. */
        int prev = -1, kth = -1, next = -1;
        for (int k = 0; k <= K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                if (prev >= 0 && !kiln_route_before(l, prev, e)) continue;
                if (best < 0 || kiln_route_before(l, e, best)) best = e;
            }
            prev = best;
            if (k == K - 1) kth = best;
            if (k == K) next = best;
        }
        /* The size of the terms each of the two logits sums: rounding moves a logit by a
         * fraction of that, not of the logit itself (which may cancel to near zero). */
        double ck = 0, cn = 0;
        for (int i = 0; i < D; i++) {
            ck += fabs((double)W[(size_t)kth * D + i] * ut[i]);
            cn += fabs((double)W[(size_t)next * D + i] * ut[i]);
        }
        double gap = (double)l[kth] - (double)l[next], cond = ck > cn ? ck : cn;
        margin[(size_t)t * stride] =
            !isfinite(gap) ? NAN : cond > 0 ? (float)(gap / cond) : (gap > 0 ? INFINITY : 0.0f);
    }
}

static void ffn(const kiln_model *m, const plan *p, float *ws, const kiln_rt_layer *L, int n,
                float *margin, size_t stride) {
    const int D = m->cfg.d_model, Fh = m->cfg.d_ff, E = m->cfg.n_experts, K = m->cfg.top_k;
    float *h = ws + p->h, *u = ws + p->u, *ff = ws + p->ff, *out = ws + p->att;
    const gemm_buf g = {ws + p->wbuf};
    if (E == 0) {
        linear(m, ff, u, n, L->fc_w, L->fc_b, Fh, D, &g);
        kiln_gelu_forward(ff, ff, (size_t)n * Fh);
        linear(m, out, ff, n, L->proj_w, L->proj_b, D, Fh, &g);
        kiln_residual_forward(h, h, out, (size_t)n * D);
        return;
    }
    float *logits = ws + p->logits, *gates = ws + p->gates, *acc = ws + p->acc,
          *gath = ws + p->gath;
    float *gsel = ws + p->gsel;
    int *chosen = (int *)(ws + p->chosen), *tok = (int *)(ws + p->tok);
    linear(m, logits, u, n, L->router_w, NULL, E, D, &g);
    if (margin) /* g.w still holds the widened router matrix of a bf16 model */
        router_margins(m, logits, u, m->bf16 ? g.w : (const float *)L->router_w, n, margin,
                       stride);
    for (int t = 0; t < n; t++)
        kiln_route_stream(logits + (size_t)t * E, E, K, chosen + (size_t)t * K,
                          gates + (size_t)t * K);
    memset(acc, 0, (size_t)n * D * sizeof *acc);
    /* Each expert runs once over the tokens that chose it (never dropping any). */
    for (int e = 0; e < E; e++) {
        int ne = 0;
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++)
                if (chosen[(size_t)t * K + k] == e) {
                    memcpy(gath + (size_t)ne * D, u + (size_t)t * D, (size_t)D * sizeof *gath);
                    tok[ne] = t;
                    gsel[ne++] = gates[(size_t)t * K + k];
                }
        if (!ne) continue;
        linear(m, ff, gath, ne, kiln_rt_wat(m, L->fc_w, (size_t)e * Fh * D),
               L->fc_b + (size_t)e * Fh, Fh, D, &g);
        kiln_gelu_forward(ff, ff, (size_t)ne * Fh);
        linear(m, out, ff, ne, kiln_rt_wat(m, L->proj_w, (size_t)e * D * Fh),
               L->proj_b + (size_t)e * D, D, Fh, &g);
        for (int j = 0; j < ne; j++)
            for (int i = 0; i < D; i++)
                acc[(size_t)tok[j] * D + i] += gsel[j] * out[(size_t)j * D + i];
    }
    kiln_residual_forward(h, h, acc, (size_t)n * D);
}

/* margin: NULL, or the block's first row's margins ([rows, L], runtime.h). */
static void run_block(const kiln_model *m, const plan *p, float *ws, const block *bk,
                      const float *x, float *y, float *margin) {
    const kiln_model_config *c = &m->cfg;
    const int F = c->n_features, D = c->d_model, n = bk->nseq * bk->T;
    float *xn = ws + p->xn, *h = ws + p->h, *u = ws + p->u;
    const gemm_buf g = {ws + p->wbuf};
    kiln_standardize_forward(xn, x, m->in_mean, m->in_std, n, F);
    linear(m, h, xn, n, m->embed_w, m->embed_b, D, F, &g);
    for (int l = 0; l < c->n_layers; l++) {
        const kiln_rt_layer *L = &m->layers[l];
        kiln_rmsnorm_f64_forward(u, h, L->attn_norm, c->norm_eps, n, D);
        linear(m, ws + p->qkv, u, n, L->qkv_w, L->qkv_b, 3 * D, D, &g);
        attention(m, p, ws, bk, l);
        linear(m, u, ws + p->att, n, L->out_w, L->out_b, D, D, &g);
        kiln_residual_forward(h, h, u, (size_t)n * D);
        kiln_rmsnorm_f64_forward(u, h, L->ffn_norm, c->norm_eps, n, D);
        ffn(m, p, ws, L, n, margin ? margin + l : NULL, (size_t)c->n_layers);
    }
    kiln_rmsnorm_f64_forward(u, h, m->final_norm, c->norm_eps, n, D);
    linear(m, y, u, n, m->head_w, m->head_b, c->n_outputs, D, &g);
}

static kiln_err forward(const kiln_model *m, const float *x, int B, int S, float *y, void *ws,
                        size_t ws_size, float *margin) {
    plan p;
    KILN_FAIL_IF(!m || !x || !y, KILN_ERR_USAGE, "kiln_model_forward: null model, input or output");
    KILN_FAIL_IF(!make_plan(m, B, S, &p), KILN_ERR_USAGE,
                 "kiln_model_forward: bad batch shape [%d,%d]", B, S);
    KILN_FAIL_IF(!ws || ws_size < kiln_model_workspace_size(m, B, S), KILN_ERR_USAGE,
                 "kiln_model_forward: workspace of %zu bytes, %zu needed", ws_size,
                 kiln_model_workspace_size(m, B, S));
    const int F = m->cfg.n_features, O = m->cfg.n_outputs;
    for (size_t i = 0; i < (size_t)B * S * F; i++)
        if (!isfinite(x[i])) {
            size_t f = i % (size_t)F, s = i / (size_t)F % (size_t)S, b = i / (size_t)F / (size_t)S;
            return kiln_fail(KILN_ERR_NUMERIC, "input [%zu,%zu,%zu] is not finite (%g)", b, s, f,
                             (double)x[i]);
        }
    if (m->dev) return kiln_rt_dev_forward(m, x, B, S, y);
    const size_t L = (size_t)m->cfg.n_layers;
    if (margin && m->cfg.n_experts == 0)
        for (size_t i = 0; i < (size_t)B * S * L; i++)
            margin[i] = INFINITY;
    if (m->cfg.n_experts == 0) margin = NULL;
    float *w = (float *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    if (p.chunked) {
        for (int b = 0; b < B; b++)
            for (int t0 = 0; t0 < S; t0 += BLOCK_ROWS) {
                block bk = {1, S - t0 < BLOCK_ROWS ? S - t0 : BLOCK_ROWS, t0};
                size_t row = (size_t)b * S + (size_t)t0;
                run_block(m, &p, w, &bk, x + row * F, y + row * O,
                          margin ? margin + row * L : NULL);
            }
        return KILN_OK;
    }
    const int per = p.nmax / S; /* whole sequences per block */
    for (int b = 0; b < B; b += per) {
        block bk = {B - b < per ? B - b : per, S, 0};
        size_t row = (size_t)b * S;
        run_block(m, &p, w, &bk, x + row * F, y + row * O, margin ? margin + row * L : NULL);
    }
    return KILN_OK;
}

KILN_API kiln_err kiln_model_forward_ws(const kiln_model *m, const float *x, int B, int S, float *y,
                                        void *ws, size_t ws_size) {
    return forward(m, x, B, S, y, ws, ws_size, NULL);
}

static kiln_err forward_alloc(const kiln_model *m, const float *x, int B, int S, float *y,
                              float *margin) {
    KILN_FAIL_IF(!m, KILN_ERR_USAGE, "kiln_model_forward: null model");
    size_t need = kiln_model_workspace_size(m, B, S);
    KILN_FAIL_IF(!need, KILN_ERR_USAGE, "kiln_model_forward: bad batch shape [%d,%d]", B, S);
    void *ws = kiln_malloc(need);
    if (!ws) return KILN_ERR_NOMEM;
    kiln_err rc = forward(m, x, B, S, y, ws, need, margin);
    free(ws);
    return rc;
}

KILN_API kiln_err kiln_model_forward(const kiln_model *m, const float *x, int B, int S, float *y) {
    return forward_alloc(m, x, B, S, y, NULL);
}

kiln_err kiln_runtime_forward_margins(const kiln_model *m, const float *x, int B, int S, float *y,
                                      float *margins) {
    KILN_FAIL_IF(m && m->dev, KILN_ERR_USAGE,
                 "kiln_runtime_forward_margins: the model is on a GPU; router margins are "
                 "measured on the CPU");
    KILN_FAIL_IF(!margins, KILN_ERR_USAGE, "kiln_runtime_forward_margins: null margins");
    return forward_alloc(m, x, B, S, y, margins);
}

size_t kiln_runtime_tie_reach(const kiln_model_config *c, const float *margins, size_t n, int S,
                              double tie_rtol, uint8_t *reach) {
    const size_t L = (size_t)c->n_layers, W = (size_t)c->attn_window, T = (size_t)S;
    memset(reach, 0, n * T);
    size_t near = 0;
    for (size_t w = 0; w < n; w++)
        for (size_t s = 0; s < T; s++) {
            bool flagged = false;
            for (size_t l = 0; l < L; l++) {
                float g = margins[(w * T + s) * L + l];
                if (!(g > tie_rtol)) { /* a NaN margin too: no routing to trust there */
                    flagged = true;
                    /* Layer l's choice moves row s; each later layer's attention carries
                     * it W-1 rows further. */
                    size_t end = s + (L - 1 - l) * (W - 1);
                    for (size_t r = s; r <= end && r < T; r++)
                        reach[w * T + r] = 1;
                }
            }
            near += flagged;
        }
    return near;
}

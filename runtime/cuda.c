/* cuda.c - the runtime on a CUDA device: a model's weights copied to the GPU (matrices widened
 * to f32), the batch forward built from the kiln_cuda_* ops, and streams whose tick is one
 * CUDA graph (kernels/cuda/tick.cu), captured once at open.
 *
 * Batch: rows go through in chunks of at most CH rows (CH fixed at open, with its device
 * workspace): whole sequences are grouped into a chunk; a sequence longer than a chunk is
 * cut in time order, and each piece is preceded by the L*(W-1) rows before it (or all of
 * them near the start), recomputed: an output depends on its input and the L*(W-1) before
 * it only (docs/model.md), so the piece's own rows are exact. The forward waits on the device once
 * per mixture layer (the plan's offsets size the expert GEMMs), as the trainer's does.
 *
 * Stream: the rings, the ring state {entries, position} and every per-tick buffer live on
 * the device; the features go through a pinned host buffer. The captured graph is: copy the
 * features in, the layers' per-tick kernels, move the ring on, copy the outputs out. A push
 * writes the features into the pinned buffer, launches the graph once and waits for it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "runtime_int.h"

#ifdef KILN_HAVE_CUDA
#include "kernels.h"

struct kiln_rt_dev {
    int device;
    float *w, *v;        /* device copies of wblock (as f32) and vblock */
    const float *slopes; /* [H] device */
    int CH;              /* rows per chunk */
    void *ws;            /* device workspace for CH rows */
    size_t ws_bytes;
    int32_t *offsets_h; /* [E+1] host */
    pthread_mutex_t lock;
    bool lock_ok;
};

/* Device twins of host weight pointers. */
static const float *dw(const kiln_model *m, const void *host) {
    return m->dev->w + ((const char *)host - (const char *)m->wblock) / m->wsize;
}
static const float *dv(const kiln_model *m, const float *host) {
    return m->dev->v + (host - m->vblock);
}

/* The batch workspace of n rows. */
typedef struct bws {
    float *x, *xs, *h, *h2, *u, *rstd, *qkv, *att, *ao, *tmp, *ff, *y;
    float *logits, *probs, *lse, *gates, *xg, *yg;
    int32_t *idx, *pos, *rows, *offsets;
    int *dropped;
} bws;

static void carve_bws(const kiln_model *m, int n, kiln_carver *c, bws *b) {
    const kiln_model_config *k = &m->cfg;
    const size_t N = (size_t)n, D = k->d_model, E = k->n_experts, K = k->top_k;
    const size_t R = E ? N * K : N;
    b->x = kiln_carve_f32(c, N * k->n_features);
    b->xs = kiln_carve_f32(c, N * k->n_features);
    b->h = kiln_carve_f32(c, N * D);
    b->h2 = kiln_carve_f32(c, N * D);
    b->u = kiln_carve_f32(c, N * D);
    b->rstd = kiln_carve_f32(c, N);
    b->qkv = kiln_carve_f32(c, N * 3 * D);
    b->att = kiln_carve_f32(c, N * k->n_heads * (size_t)k->attn_window);
    b->ao = kiln_carve_f32(c, N * D);
    b->tmp = kiln_carve_f32(c, N * D);
    b->ff = kiln_carve_f32(c, R * k->d_ff);
    b->y = kiln_carve_f32(c, N * k->n_outputs);
    if (E) {
        b->logits = kiln_carve_f32(c, N * E);
        b->probs = kiln_carve_f32(c, N * E);
        b->lse = kiln_carve_f32(c, N);
        b->gates = kiln_carve_f32(c, N * K);
        b->xg = kiln_carve_f32(c, N * K * D);
        b->yg = kiln_carve_f32(c, N * K * D);
        b->idx = kiln_carve_i32(c, N * K);
        b->pos = kiln_carve_i32(c, N * K);
        b->rows = kiln_carve_i32(c, N * K);
        b->offsets = kiln_carve_i32(c, E + 1);
        b->dropped = (int *)kiln_carve(c, 1, sizeof(int));
    }
}

void kiln_rt_dev_free(kiln_rt_dev *d) {
    if (!d) return;
    kiln_cuda_free(d->w);
    kiln_cuda_free(d->v);
    kiln_cuda_free(d->ws);
    free(d->offsets_h);
    if (d->lock_ok) pthread_mutex_destroy(&d->lock);
    free(d);
}

kiln_err kiln_rt_dev_open(kiln_model *m, int device) {
    const kiln_model_config *c = &m->cfg;
    KILN_TRY(kiln_cuda_init(device));
    kiln_err rc = KILN_OK;
    float *wide = NULL;
    kiln_rt_dev *d = kiln_calloc(1, sizeof *d);
    KILN_CHECK_IF(rc, out, !d, KILN_ERR_NOMEM, "out of memory");
    d->device = device;
    d->offsets_h = kiln_calloc((size_t)c->n_experts + 1, sizeof(int32_t));
    KILN_CHECK_IF(rc, out, !d->offsets_h || pthread_mutex_init(&d->lock, NULL), KILN_ERR_NOMEM,
                  "out of memory");
    d->lock_ok = true;
    KILN_CHECK(rc, out, kiln_cuda_malloc((void **)&d->w, m->wcount * sizeof(float)));
    KILN_CHECK(rc, out, kiln_cuda_malloc((void **)&d->v, m->vcount * sizeof(float)));
    if (m->bf16) {
        wide = kiln_malloc((m->wcount ? m->wcount : 1) * sizeof(float));
        KILN_CHECK_IF(rc, out, !wide, KILN_ERR_NOMEM, "out of memory widening the weights");
        kiln_rt_widen(m, wide, m->wblock, m->wcount);
    }
    KILN_CHECK(rc, out, kiln_cuda_upload(d->w, wide ? wide : m->wblock, m->wcount * sizeof(float)));
    KILN_CHECK(rc, out, kiln_cuda_upload(d->v, m->vblock, m->vcount * sizeof(float)));
    m->dev = d; /* dw/dv work from here on */
    d->slopes = dv(m, m->slopes);
    /* A chunk holds at least twice the rows a piece carries before it. */
    const size_t ctx = (size_t)c->n_layers * (size_t)(c->attn_window - 1);
    size_t ch = 2048;
    if (ch < 2 * ctx + 1) ch = 2 * ctx + 1;
    KILN_CHECK_IF(rc, out, ch > (1u << 24), KILN_ERR_LIMIT,
                  "a batch chunk of %zu rows (n_layers x attn_window) is too large for a GPU", ch);
    d->CH = (int)ch;
    kiln_carver cv = {NULL, 0, 256};
    bws b;
    carve_bws(m, d->CH, &cv, &b);
    d->ws_bytes = cv.used;
    KILN_CHECK(rc, out, kiln_cuda_malloc(&d->ws, d->ws_bytes));
    KILN_CHECK(rc, out, kiln_cuda_sync());
out:
    free(wide);
    if (rc) {
        m->dev = NULL;
        kiln_rt_dev_free(d);
    } else {
        m->device = device;
    }
    kiln_cuda_release();
    return rc;
}

kiln_err kiln_rt_dev_set_chunk(kiln_model *m, int rows) {
    KILN_FAIL_IF(!m->dev, KILN_ERR_USAGE, "the model is not on a GPU");
    const int ctx = m->cfg.n_layers * (m->cfg.attn_window - 1);
    KILN_FAIL_IF(rows < 2 * ctx + 1 || rows > m->dev->CH, KILN_ERR_USAGE,
                 "chunk of %d rows outside %d..%d", rows, 2 * ctx + 1, m->dev->CH);
    m->dev->CH = rows;
    return KILN_OK;
}

/* One chunk: nseq sequences of T rows at x [nseq*T, F]; outputs of rows skip.. of each (one
 * sequence when skip > 0) to y. */
static kiln_err run_chunk(const kiln_model *m, const bws *b, const float *x, int nseq, int T,
                          int skip, float *y) {
    const kiln_model_config *c = &m->cfg;
    const int F = c->n_features, D = c->d_model, H = c->n_heads, W = c->attn_window,
              E = c->n_experts, K = c->top_k, Fh = c->d_ff, O = c->n_outputs;
    const int N = nseq * T;
    kiln_rt_dev *d = m->dev;
    KILN_TRY(kiln_cuda_upload(b->x, x, (size_t)N * F * sizeof(float)));
    KILN_TRY(kiln_cuda_standardize_forward(b->xs, b->x, dv(m, m->in_mean), dv(m, m->in_std), N, F));
    float *h = b->h, *h2 = b->h2;
    KILN_TRY(kiln_cuda_linear_forward(h, b->xs, dw(m, m->embed_w), dv(m, m->embed_b), N, F, D));
    for (int l = 0; l < c->n_layers; l++) {
        const kiln_rt_layer *L = &m->layers[l];
        KILN_TRY(
            kiln_cuda_rmsnorm_forward(b->u, b->rstd, h, dv(m, L->attn_norm), c->norm_eps, N, D));
        KILN_TRY(
            kiln_cuda_linear_forward(b->qkv, b->u, dw(m, L->qkv_w), dv(m, L->qkv_b), N, D, 3 * D));
        KILN_TRY(kiln_cuda_attention_forward(b->ao, b->att, b->qkv, nseq, T, D, H, W));
        KILN_TRY(
            kiln_cuda_linear_forward(b->tmp, b->ao, dw(m, L->out_w), dv(m, L->out_b), N, D, D));
        KILN_TRY(kiln_cuda_residual_forward(h, h, b->tmp, (size_t)N * D));
        KILN_TRY(
            kiln_cuda_rmsnorm_forward(b->u, b->rstd, h, dv(m, L->ffn_norm), c->norm_eps, N, D));
        if (!E) {
            KILN_TRY(
                kiln_cuda_linear_forward(b->ff, b->u, dw(m, L->fc_w), dv(m, L->fc_b), N, D, Fh));
            KILN_TRY(kiln_cuda_gelu_forward(b->ff, b->ff, (size_t)N * Fh));
            KILN_TRY(kiln_cuda_linear_forward(b->tmp, b->ff, dw(m, L->proj_w), dv(m, L->proj_b), N,
                                              Fh, D));
            KILN_TRY(kiln_cuda_residual_forward(h, h, b->tmp, (size_t)N * D));
            continue;
        }
        KILN_TRY(kiln_cuda_linear_forward(b->logits, b->u, dw(m, L->router_w), NULL, N, D, E));
        KILN_TRY(kiln_cuda_router_forward(b->probs, b->lse, b->idx, b->gates, b->logits, N, E, K));
        KILN_TRY(
            kiln_cuda_moe_dispatch(b->offsets, b->pos, b->rows, b->dropped, b->idx, 0, N, E, K));
        int32_t *off = d->offsets_h;
        KILN_TRY(kiln_cuda_download(off, b->offsets, (size_t)(E + 1) * sizeof(int32_t)));
        KILN_FAIL_IF(off[0] != 0 || off[E] != N * K, KILN_ERR_INTERNAL,
                     "cuda forward: layer %d: dispatch plan of %d rows, not %d", l, off[E], N * K);
        KILN_TRY(kiln_cuda_moe_gather_forward(b->xg, b->u, b->rows, off[E], D));
        const float *fc = dw(m, L->fc_w), *fcb = dv(m, L->fc_b), *pj = dw(m, L->proj_w),
                    *pjb = dv(m, L->proj_b);
        for (int e = 0; e < E; e++) {
            const size_t r0 = (size_t)off[e];
            const int n = off[e + 1] - off[e];
            KILN_TRY(kiln_cuda_linear_forward(b->ff + r0 * Fh, b->xg + r0 * D,
                                              fc + (size_t)e * Fh * D, fcb + (size_t)e * Fh, n, D,
                                              Fh));
            KILN_TRY(kiln_cuda_gelu_forward(b->ff + r0 * Fh, b->ff + r0 * Fh, (size_t)n * Fh));
            KILN_TRY(kiln_cuda_linear_forward(b->yg + r0 * D, b->ff + r0 * Fh,
                                              pj + (size_t)e * D * Fh, pjb + (size_t)e * D, n, Fh,
                                              D));
        }
        KILN_TRY(kiln_cuda_moe_combine_forward(h2, h, b->yg, b->gates, b->pos, N, D, K));
        float *t = h;
        h = h2;
        h2 = t;
    }
    KILN_TRY(kiln_cuda_rmsnorm_forward(b->u, b->rstd, h, dv(m, m->final_norm), c->norm_eps, N, D));
    KILN_TRY(kiln_cuda_linear_forward(b->y, b->u, dw(m, m->head_w), dv(m, m->head_b), N, D, O));
    return kiln_cuda_download(y, b->y + (size_t)skip * O, (size_t)(N - skip) * O * sizeof(float));
}

static kiln_err dev_forward(const kiln_model *m, const float *x, int B, int S, float *y) {
    const kiln_model_config *c = &m->cfg;
    kiln_rt_dev *d = m->dev;
    const int F = c->n_features, O = c->n_outputs, CH = d->CH;
    const size_t D = (size_t)c->d_model, K = c->top_k ? (size_t)c->top_k : 1;
    size_t need = kiln_cuda_scratch_bytes((size_t)CH, 3 * D + (size_t)F + (size_t)O),
           need2 = kiln_cuda_scratch_bytes((size_t)CH * K, (size_t)c->d_ff + D);
    KILN_TRY(kiln_cuda_reserve(need > need2 ? need : need2));
    kiln_carver cv = {d->ws, 0, 256};
    bws b;
    carve_bws(m, CH, &cv, &b);
    if (S <= CH) {
        const int per = CH / S;
        for (int s0 = 0; s0 < B; s0 += per) {
            const int n = B - s0 < per ? B - s0 : per;
            const size_t row = (size_t)s0 * S;
            KILN_TRY(run_chunk(m, &b, x + row * F, n, S, 0, y + row * O));
        }
        return KILN_OK;
    }
    const int ctxmax = c->n_layers * (c->attn_window - 1), T = CH - ctxmax;
    for (int s0 = 0; s0 < B; s0++)
        for (int t0 = 0; t0 < S; t0 += T) {
            const int ctx = t0 < ctxmax ? t0 : ctxmax, n = S - t0 < T ? S - t0 : T;
            const size_t row = (size_t)s0 * S + (size_t)t0;
            KILN_TRY(run_chunk(m, &b, x + (row - (size_t)ctx) * F, 1, ctx + n, ctx, y + row * O));
        }
    return KILN_OK;
}

kiln_err kiln_rt_dev_forward(const kiln_model *m, const float *x, int B, int S, float *y) {
    kiln_rt_dev *d = m->dev;
    KILN_TRY(kiln_cuda_init(d->device));
    pthread_mutex_lock(&d->lock);
    kiln_err rc = dev_forward(m, x, B, S, y);
    if (!rc) rc = kiln_cuda_sync();
    pthread_mutex_unlock(&d->lock);
    kiln_cuda_release();
    return rc ? kiln_errprefix(rc, "cuda forward: ") : KILN_OK;
}

/* ---- streams ---- */

struct kiln_rt_dstream {
    const kiln_model *m;
    int device;
    void *stream, *exec;
    void *block;         /* device: every buffer below */
    float *h_in, *h_out; /* pinned host [F], [O] */
    float *kring, *vring, *x, *xn, *h, *u, *qkv, *att, *acc, *ff, *probs, *scores, *gates, *y;
    int32_t *ring, *chosen;
    kiln_err sticky; /* a failed reset, reported by the next push */
};

static void carve_stream(const kiln_model *m, kiln_carver *c, kiln_rt_dstream *s) {
    const kiln_model_config *k = &m->cfg;
    const size_t D = k->d_model, R = (size_t)k->attn_window - 1, L = k->n_layers;
    s->kring = kiln_carve_f32(c, L * R * D);
    s->vring = kiln_carve_f32(c, L * R * D);
    s->x = kiln_carve_f32(c, k->n_features);
    s->xn = kiln_carve_f32(c, k->n_features);
    s->h = kiln_carve_f32(c, D);
    s->u = kiln_carve_f32(c, D);
    s->qkv = kiln_carve_f32(c, 3 * D);
    s->att = kiln_carve_f32(c, D);
    s->acc = kiln_carve_f32(c, D);
    s->ff = kiln_carve_f32(c, k->d_ff);
    s->probs = kiln_carve_f32(c, k->n_experts ? k->n_experts : 1);
    s->scores = kiln_carve_f32(c, (size_t)k->n_heads * (R + 1));
    s->gates = kiln_carve_f32(c, k->top_k ? k->top_k : 1);
    s->y = kiln_carve_f32(c, k->n_outputs);
    s->ring = kiln_carve_i32(c, 2);
    s->chosen = kiln_carve_i32(c, k->top_k ? k->top_k : 1);
}

/* The kernels of one tick, on s->stream (captured). */
static kiln_err record_tick(kiln_rt_dstream *s) {
    const kiln_model *m = s->m;
    const kiln_model_config *c = &m->cfg;
    const int F = c->n_features, D = c->d_model, H = c->n_heads, R = c->attn_window - 1,
              E = c->n_experts, K = c->top_k, Fh = c->d_ff, O = c->n_outputs;
    void *st = s->stream;
    KILN_TRY(kiln_cuda_copy_async(st, s->x, s->h_in, (size_t)F * sizeof(float)));
    KILN_TRY(kiln_cuda_tick_standardize(st, s->xn, s->x, dv(m, m->in_mean), dv(m, m->in_std), F));
    KILN_TRY(kiln_cuda_tick_matvec(st, s->h, dw(m, m->embed_w), dv(m, m->embed_b), s->xn, D, F,
                                   KILN_TICK_STORE, NULL, 0, 0, 0, NULL));
    for (int l = 0; l < c->n_layers; l++) {
        const kiln_rt_layer *L = &m->layers[l];
        const size_t ro = (size_t)l * (size_t)R * (size_t)D;
        KILN_TRY(kiln_cuda_tick_rmsnorm(st, s->u, s->h, dv(m, L->attn_norm), D, c->norm_eps));
        KILN_TRY(kiln_cuda_tick_matvec(st, s->qkv, dw(m, L->qkv_w), dv(m, L->qkv_b), s->u, 3 * D, D,
                                       KILN_TICK_STORE, NULL, 0, 0, 0, NULL));
        KILN_TRY(kiln_cuda_tick_attend(st, s->att, s->scores, s->kring + ro, s->vring + ro, s->qkv,
                                       s->ring, D, H, R, m->dev->slopes, m->attn_scale));
        KILN_TRY(kiln_cuda_tick_matvec(st, s->h, dw(m, L->out_w), dv(m, L->out_b), s->att, D, D,
                                       KILN_TICK_ADD, NULL, 0, 0, 0, NULL));
        KILN_TRY(kiln_cuda_tick_rmsnorm(st, s->u, s->h, dv(m, L->ffn_norm), D, c->norm_eps));
        if (!E) {
            KILN_TRY(kiln_cuda_tick_matvec(st, s->ff, dw(m, L->fc_w), dv(m, L->fc_b), s->u, Fh, D,
                                           KILN_TICK_GELU, NULL, 0, 0, 0, NULL));
            KILN_TRY(kiln_cuda_tick_matvec(st, s->h, dw(m, L->proj_w), dv(m, L->proj_b), s->ff, D,
                                           Fh, KILN_TICK_ADD, NULL, 0, 0, 0, NULL));
            continue;
        }
        KILN_TRY(kiln_cuda_tick_matvec(st, s->probs, dw(m, L->router_w), NULL, s->u, E, D,
                                       KILN_TICK_STORE, NULL, 0, 0, 0, NULL));
        KILN_TRY(kiln_cuda_tick_route(st, s->chosen, s->gates, s->probs, E, K));
        KILN_TRY(kiln_cuda_memset_async(st, s->acc, 0, (size_t)D * sizeof(float)));
        for (int k = 0; k < K; k++) {
            KILN_TRY(kiln_cuda_tick_matvec(st, s->ff, dw(m, L->fc_w), dv(m, L->fc_b), s->u, Fh, D,
                                           KILN_TICK_GELU, s->chosen, k, (size_t)Fh * D, (size_t)Fh,
                                           NULL));
            KILN_TRY(kiln_cuda_tick_matvec(st, s->acc, dw(m, L->proj_w), dv(m, L->proj_b), s->ff, D,
                                           Fh, KILN_TICK_GATED_ADD, s->chosen, k, (size_t)D * Fh,
                                           (size_t)D, s->gates));
        }
        KILN_TRY(kiln_cuda_tick_add(st, s->h, s->acc, D));
    }
    KILN_TRY(kiln_cuda_tick_advance(st, s->ring, R));
    KILN_TRY(kiln_cuda_tick_rmsnorm(st, s->u, s->h, dv(m, m->final_norm), D, c->norm_eps));
    KILN_TRY(kiln_cuda_tick_matvec(st, s->y, dw(m, m->head_w), dv(m, m->head_b), s->u, O, D,
                                   KILN_TICK_STORE, NULL, 0, 0, 0, NULL));
    return kiln_cuda_copy_async(st, s->h_out, s->y, (size_t)O * sizeof(float));
}

void kiln_rt_dstream_free(kiln_rt_dstream *s) {
    if (!s) return;
    if (s->stream) (void)kiln_cuda_stream_sync(s->stream);
    kiln_cuda_graph_destroy(s->exec);
    kiln_cuda_stream_destroy(s->stream);
    kiln_cuda_free(s->block);
    kiln_cuda_host_free(s->h_in);
    kiln_cuda_host_free(s->h_out);
    free(s);
}

kiln_err kiln_rt_dstream_open(const kiln_model *m, kiln_rt_dstream **out) {
    *out = NULL;
    kiln_rt_dstream *s = kiln_calloc(1, sizeof *s);
    if (!s) return KILN_ERR_NOMEM;
    s->m = m;
    s->device = m->dev->device;
    kiln_err rc = KILN_OK;
    KILN_CHECK(rc, fail, kiln_cuda_stream_create(s->device, &s->stream));
    kiln_carver c = {NULL, 0, 256};
    carve_stream(m, &c, s);
    KILN_CHECK(rc, fail, kiln_cuda_malloc(&s->block, c.used));
    c.base = s->block;
    c.used = 0;
    carve_stream(m, &c, s);
    KILN_CHECK(rc, fail,
               kiln_cuda_host_alloc((void **)&s->h_in, (size_t)m->cfg.n_features * sizeof(float)));
    KILN_CHECK(rc, fail,
               kiln_cuda_host_alloc((void **)&s->h_out, (size_t)m->cfg.n_outputs * sizeof(float)));
    KILN_CHECK(rc, fail, kiln_cuda_memset_async(s->stream, s->block, 0, c.used));
    KILN_CHECK(rc, fail, kiln_cuda_stream_sync(s->stream));
    KILN_CHECK(rc, fail, kiln_cuda_capture_begin(s->stream));
    rc = kiln_cuda_capture_end(s->stream, record_tick(s), &s->exec);
    if (rc) goto fail;
    *out = s;
    return KILN_OK;
fail:
    kiln_rt_dstream_free(s);
    return kiln_errprefix(rc, "cuda stream: ");
}

kiln_err kiln_rt_dstream_push(kiln_rt_dstream *s, const float *features, float *outputs) {
    KILN_FAIL_IF(s->sticky, s->sticky, "cuda stream: the last reset failed; reopen the stream");
    memcpy(s->h_in, features, (size_t)s->m->cfg.n_features * sizeof(float));
    kiln_err rc = kiln_cuda_graph_run(s->exec, s->stream, s->device);
    if (rc) return kiln_errprefix(rc, "cuda stream: ");
    memcpy(outputs, s->h_out, (size_t)s->m->cfg.n_outputs * sizeof(float));
    return KILN_OK;
}

kiln_err kiln_rt_dstream_reset(kiln_rt_dstream *s) {
    kiln_err rc = kiln_cuda_memset_async(s->stream, s->ring, 0, 2 * sizeof(int32_t));
    if (!rc) rc = kiln_cuda_stream_sync(s->stream);
    s->sticky = rc;
    return rc;
}

#else /* no CUDA in this build */

kiln_err kiln_rt_dev_open(kiln_model *m, int device) {
    (void)m;
    return kiln_fail(KILN_ERR_UNSUPPORTED,
                     "cannot run on CUDA device %d: this build of kiln has no CUDA (nvcc was not "
                     "found when it was built)",
                     device);
}
void kiln_rt_dev_free(kiln_rt_dev *d) {
    (void)d;
}
kiln_err kiln_rt_dev_forward(const kiln_model *m, const float *x, int B, int S, float *y) {
    (void)m, (void)x, (void)B, (void)S, (void)y;
    return kiln_fail(KILN_ERR_UNSUPPORTED, "this build of kiln has no CUDA");
}
kiln_err kiln_rt_dev_set_chunk(kiln_model *m, int rows) {
    (void)m, (void)rows;
    return kiln_fail(KILN_ERR_UNSUPPORTED, "this build of kiln has no CUDA");
}
kiln_err kiln_rt_dstream_open(const kiln_model *m, kiln_rt_dstream **out) {
    (void)m;
    *out = NULL;
    return kiln_fail(KILN_ERR_UNSUPPORTED, "this build of kiln has no CUDA");
}
kiln_err kiln_rt_dstream_push(kiln_rt_dstream *s, const float *features, float *outputs) {
    (void)s, (void)features, (void)outputs;
    return kiln_fail(KILN_ERR_UNSUPPORTED, "this build of kiln has no CUDA");
}
kiln_err kiln_rt_dstream_reset(kiln_rt_dstream *s) {
    (void)s;
    return KILN_OK;
}
void kiln_rt_dstream_free(kiln_rt_dstream *s) {
    (void)s;
}
#endif

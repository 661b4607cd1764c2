/* stream.c - the streaming forward: one tick in, one tick's outputs out.
 *
 * Each layer keeps the keys and values of the last W-1 ticks in a ring buffer; a tick
 * computes its own q, k, v, attends over the ring plus itself, and then overwrites the
 * ring's oldest entry. Because ALiBi depends only on distance (MODEL.md), this is the
 * batch forward's row t for a sequence that began at the stream's first tick. Every
 * buffer is allocated by kiln_stream_open; a push allocates nothing and its work does
 * not depend on how long the stream has run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "runtime_int.h"

struct kiln_stream {
    const kiln_model *m;
    uint64_t ticks;
    int ring_n;           /* valid entries in each ring, <= W-1 */
    int ring_pos;         /* where the next entry goes */
    float *kring;         /* [L, W-1, D] */
    float *vring;         /* [L, W-1, D] */
    float *xn;            /* [F] standardised inputs */
    float *h;             /* [D] residual */
    float *u;             /* [D] normalised residual */
    float *qkv;           /* [3D] */
    float *att;           /* [D] */
    float *tmp;           /* [D] */
    float *acc;           /* [D] mixture sum */
    float *ff;            /* [Fh] */
    float *probs;         /* [E] */
    float *scores;        /* [W] */
    int *chosen;          /* [K] */
    float *gates;         /* [K] */
    kiln_rt_cost cost;    /* of the last push */
    void *block;          /* the one allocation behind every buffer above */
    kiln_rt_dstream *dev; /* the stream on the model's GPU; NULL on the CPU */
};

KILN_API kiln_err kiln_stream_open(const kiln_model *m, kiln_stream **out) {
    *out = NULL;
    KILN_FAIL_IF(!m, KILN_ERR_USAGE, "kiln_stream_open: no model");
    const kiln_model_config *c = &m->cfg;
    const size_t D = (size_t)c->d_model,
                 ring = (size_t)c->n_layers * (size_t)(c->attn_window - 1) * D;
    const size_t E = (size_t)c->n_experts, K = (size_t)c->top_k;
    /* Floats of every buffer, each rounded to 16 so that every one starts 64-byte aligned. */
    size_t sizes[] = {ring,
                      ring,
                      (size_t)c->n_features,
                      D,
                      D,
                      3 * D,
                      D,
                      D,
                      D,
                      (size_t)c->d_ff,
                      E,
                      (size_t)c->attn_window,
                      K,
                      K /* chosen, last */};
    size_t total = 0;
    for (size_t i = 0; i < KILN_ARRAY_LEN(sizes); i++)
        total += (sizes[i] + 15) / 16 * 16;
    kiln_stream *s = kiln_calloc(1, sizeof *s);
    if (!s) return KILN_ERR_NOMEM;
    s->block = aligned_alloc(64, total * sizeof(float));
    if (!s->block) {
        free(s);
        return kiln_fail(KILN_ERR_NOMEM, "'%s': out of memory for a stream (%zu bytes)", m->path,
                         total * sizeof(float));
    }
    memset(s->block, 0, total * sizeof(float));
    float *p = s->block;
    float **bufs[] = {&s->kring, &s->vring, &s->xn, &s->h,     &s->u,      &s->qkv,  &s->att,
                      &s->tmp,   &s->acc,   &s->ff, &s->probs, &s->scores, &s->gates};
    for (size_t i = 0; i < KILN_ARRAY_LEN(bufs); i++) {
        *bufs[i] = p;
        p += (sizes[i] + 15) / 16 * 16;
    }
    s->chosen = (int *)p; /* the last slot; int and float are both 4 bytes */
    s->m = m;
    if (m->dev) {
        kiln_err rc = kiln_rt_dstream_open(m, &s->dev);
        if (rc) {
            kiln_stream_free(s);
            return kiln_errprefix(rc, "'%s': ", m->path);
        }
    }
    *out = s;
    return KILN_OK;
}

KILN_API void kiln_stream_free(kiln_stream *s) {
    if (!s) return;
    kiln_rt_dstream_free(s->dev);
    free(s->block);
    free(s);
}

KILN_API void kiln_stream_reset(kiln_stream *s) {
    /* A device stream that fails to reset reports it at its next push. */
    if (s->dev) (void)kiln_rt_dstream_reset(s->dev);
    s->ticks = 0;
    s->ring_n = 0;
    s->ring_pos = 0;
    s->cost = (kiln_rt_cost){0, 0};
}

KILN_API uint64_t kiln_stream_ticks(const kiln_stream *s) {
    return s->ticks;
}

kiln_rt_cost kiln_rt_stream_last_cost(const kiln_stream *s) {
    return s->cost;
}

/* s->tmp = y = W x + b, counting the work. */
static void mv(kiln_stream *s, float *y, const void *W, const float *b, const float *x, int rows,
               int cols) {
    kiln_rt_matvec(s->m, y, W, b, x, rows, cols);
    s->cost.madds += (uint64_t)rows * (uint64_t)cols;
}

static void ffn(kiln_stream *s, const kiln_rt_layer *L) {
    const kiln_model *m = s->m;
    const int D = m->cfg.d_model, Fh = m->cfg.d_ff, E = m->cfg.n_experts, K = m->cfg.top_k;
    if (E == 0) {
        mv(s, s->ff, L->fc_w, L->fc_b, s->u, Fh, D);
        kiln_gelu_forward(s->ff, s->ff, (size_t)Fh);
        mv(s, s->tmp, L->proj_w, L->proj_b, s->ff, D, Fh);
        kiln_rt_axpy(s->h, 1.0f, s->tmp, D);
        return;
    }
    mv(s, s->probs, L->router_w, NULL, s->u, E, D);
    kiln_route_stream(s->probs, E, K, s->chosen, s->gates);
    memset(s->acc, 0, (size_t)D * sizeof *s->acc);
    for (int k = 0; k < K; k++) {
        size_t e = (size_t)s->chosen[k];
        mv(s, s->ff, kiln_rt_wat(m, L->fc_w, e * Fh * D), L->fc_b + e * Fh, s->u, Fh, D);
        kiln_gelu_forward(s->ff, s->ff, (size_t)Fh);
        mv(s, s->tmp, kiln_rt_wat(m, L->proj_w, e * D * Fh), L->proj_b + e * D, s->ff, D, Fh);
        kiln_rt_axpy(s->acc, s->gates[k], s->tmp, D);
    }
    kiln_rt_axpy(s->h, 1.0f, s->acc, D);
}

KILN_API kiln_err kiln_stream_push(kiln_stream *s, const float *features, float *outputs) {
    const kiln_model *m = s->m;
    const kiln_model_config *c = &m->cfg;
    const int F = c->n_features, D = c->d_model, R = c->attn_window - 1;
    for (int f = 0; f < F; f++)
        KILN_FAIL_IF(!isfinite(features[f]), KILN_ERR_NUMERIC,
                     "stream tick %llu: feature %d is not finite (%g); the stream is unchanged",
                     (unsigned long long)s->ticks, f, (double)features[f]);
    s->cost = (kiln_rt_cost){0, 0};
    if (s->dev) {
        KILN_TRY(kiln_rt_dstream_push(s->dev, features, outputs));
        s->ticks++;
        return KILN_OK;
    }
    for (int f = 0; f < F; f++)
        s->xn[f] = (features[f] - m->in_mean[f]) / m->in_std[f];
    mv(s, s->h, m->embed_w, m->embed_b, s->xn, D, F);
    for (int l = 0; l < c->n_layers; l++) {
        const kiln_rt_layer *L = &m->layers[l];
        kiln_rt_rmsnorm(s->u, s->h, L->attn_norm, D, c->norm_eps);
        mv(s, s->qkv, L->qkv_w, L->qkv_b, s->u, 3 * D, D);
        /* Keys oldest first: the ring from ring_pos on, then from 0, then this tick. */
        float *kr = s->kring + (size_t)l * R * D, *vr = s->vring + (size_t)l * R * D;
        int older = s->ring_n == R ? R - s->ring_pos : 0;
        kiln_rt_kv runs[3] = {
            {kr + (size_t)s->ring_pos * D, vr + (size_t)s->ring_pos * D, older, (size_t)D},
            {kr, vr, s->ring_n - older, (size_t)D},
            {s->qkv + D, s->qkv + 2 * D, 1, 0},
        };
        int nk = kiln_rt_attend(m, s->att, s->scores, s->qkv, runs, 3);
        s->cost.keys += (uint64_t)nk;
        s->cost.madds += 2 * (uint64_t)nk * (uint64_t)D;
        if (R > 0) {
            memcpy(kr + (size_t)s->ring_pos * D, s->qkv + D, (size_t)D * sizeof(float));
            memcpy(vr + (size_t)s->ring_pos * D, s->qkv + 2 * D, (size_t)D * sizeof(float));
        }
        mv(s, s->tmp, L->out_w, L->out_b, s->att, D, D);
        kiln_rt_axpy(s->h, 1.0f, s->tmp, D);
        kiln_rt_rmsnorm(s->u, s->h, L->ffn_norm, D, c->norm_eps);
        ffn(s, L);
    }
    if (R > 0) {
        s->ring_pos = (s->ring_pos + 1) % R;
        if (s->ring_n < R) s->ring_n++;
    }
    kiln_rt_rmsnorm(s->u, s->h, m->final_norm, D, c->norm_eps);
    mv(s, outputs, m->head_w, m->head_b, s->u, c->n_outputs, D);
    s->ticks++;
    return KILN_OK;
}

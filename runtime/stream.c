/* stream.c - the streaming forward: one tick in, one tick's outputs out.
 *
 * Each layer keeps the keys and values of the last W-1 ticks in a ring buffer; a tick
 * computes its own q, k, v, attends over the ring plus itself, and then overwrites the
 * ring's oldest entry. Because ALiBi depends only on distance (docs/model.md), this is the
 * batch forward's row t for a sequence that began at the stream's first tick. Every
 * buffer is allocated by kiln_stream_open except the rings (and the attention scores sized
 * with them): those start at kiln_rt_ring_start (256) ticks and double, up to W-1, as a
 * young stream fills them, so that a model whose window is huge (attn_window 2^20 made
 * every stream of a tiny model allocate 542 MiB at open) costs what its streams have seen.
 * A push allocates only then (at most log2(W / 256) times in a stream's life, never once
 * the ring is full or for a window of 257 or less), and its work does not depend on how
 * long the stream has run.
 *
 * A tick runs over a set of streams of one model (kiln_stream_push is the set of one):
 * each matrix-vector product goes through kiln_rt_matvec_many, which reads the matrix once
 * for the whole set, and everything else (norms, attention over each stream's own rings,
 * routing, the mixture's gated sum) runs per stream, in the order a single push runs it.
 * The experts that the streams' routers chose are run expert by expert, each over the
 * (stream, slot) pairs that chose it, into per-slot buffers that each stream then sums in
 * slot order; so a stream's numbers do not depend on which set it was pushed in. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "runtime_int.h"

struct kiln_stream {
    const kiln_model *m;
    uint64_t ticks;
    int ring_n;           /* valid entries in each ring, <= cap */
    int ring_pos;         /* where the next entry goes (== ring_n until the ring is full) */
    int cap;              /* entries each ring has room for: kiln_rt_ring_start .. W-1 */
    float *kring;         /* [L, cap, D] */
    float *vring;         /* [L, cap, D] */
    float *scores;        /* [H*(cap+1) + 2H] */
    void *ring_block;     /* the allocation behind the three above */
    float *xn;            /* [F] standardised inputs */
    float *h;             /* [D] residual */
    float *u;             /* [D] normalised residual */
    float *qkv;           /* [3D] */
    float *att;           /* [D] */
    float *tmp;           /* [D] */
    float *acc;           /* [D] mixture sum */
    float *ff;            /* [Fh] dense hidden */
    float *slot_ff;       /* [K, ffs] each chosen expert's hidden, ffs = Fh rounded to 16 */
    float *slot_out;      /* [K, outs] each chosen expert's output, outs = D rounded to 16 */
    float *probs;         /* [E] */
    int *chosen;          /* [K] */
    float *gates;         /* [K] */
    kiln_rt_cost cost;    /* of the last push */
    bool marked;          /* kiln_stream_push_many's duplicate check, false between calls */
    void *block;          /* the one allocation behind every other buffer above */
    kiln_rt_dstream *dev; /* the stream on the model's GPU; NULL on the CPU */
};

bool kiln_rt_ties_high = false;

static size_t round16(size_t n) {
    return (n + 15) / 16 * 16;
}

/* Ring entries a new stream has room for (all W-1 when the window is no larger); a test
 * hook, so that a ring grown from one entry can be compared with one made whole at open. */
int kiln_rt_ring_start = 256;

/* Make room for cap entries per ring (cap >= s->ring_n, and the ring not yet wrapped unless
 * it is full), moving what the rings hold; the stream is unchanged on failure. */
static kiln_err ring_resize(kiln_stream *s, int cap) {
    const kiln_model_config *c = &s->m->cfg;
    const size_t L = (size_t)c->n_layers, D = (size_t)c->d_model, H = (size_t)c->n_heads;
    const size_t ring = L * (size_t)cap * D, scores = H * ((size_t)cap + 1) + 2 * H;
    const size_t total = 2 * round16(ring) + round16(scores);
    float *b = aligned_alloc(64, total * sizeof(float));
    if (!b)
        return kiln_fail(KILN_ERR_NOMEM, "'%s': out of memory for a stream's rings (%zu bytes)",
                         s->m->path, total * sizeof(float));
    memset(b, 0, total * sizeof(float));
    float *kr = b, *vr = b + round16(ring), *sc = vr + round16(ring);
    for (size_t l = 0; l < L && s->ring_n; l++) {
        memcpy(kr + l * cap * D, s->kring + l * s->cap * D, (size_t)s->ring_n * D * sizeof(float));
        memcpy(vr + l * cap * D, s->vring + l * s->cap * D, (size_t)s->ring_n * D * sizeof(float));
    }
    free(s->ring_block);
    s->ring_block = b;
    s->kring = kr, s->vring = vr, s->scores = sc;
    s->cap = cap;
    return KILN_OK;
}

/* Before a tick: room for this tick's entry where a young stream's ring is full. */
static kiln_err ring_reserve(kiln_stream *s) {
    const int R = s->m->cfg.attn_window - 1;
    if (s->ring_n < s->cap || s->cap >= R) return KILN_OK;
    return ring_resize(s, s->cap > R / 2 ? R : 2 * s->cap);
}

KILN_API kiln_err kiln_stream_open(const kiln_model *m, kiln_stream **out) {
    *out = NULL;
    KILN_FAIL_IF(!m, KILN_ERR_USAGE, "kiln_stream_open: no model");
    const kiln_model_config *c = &m->cfg;
    const size_t D = (size_t)c->d_model;
    const size_t E = (size_t)c->n_experts, K = (size_t)c->top_k;
    /* Floats of every buffer, each rounded to 16 so that every one starts 64-byte aligned. */
    size_t sizes[] = {(size_t)c->n_features,
                      D,
                      D,
                      3 * D,
                      D,
                      D,
                      D,
                      (size_t)c->d_ff,
                      K * round16((size_t)c->d_ff),
                      K * round16(D),
                      E,
                      K,
                      K /* chosen, last */};
    size_t total = 0;
    for (size_t i = 0; i < KILN_ARRAY_LEN(sizes); i++)
        total += round16(sizes[i]);
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
    float **bufs[] = {&s->xn,  &s->h,   &s->u,       &s->qkv,      &s->att,   &s->tmp,
                      &s->acc, &s->ff,  &s->slot_ff, &s->slot_out, &s->probs, &s->gates};
    for (size_t i = 0; i < KILN_ARRAY_LEN(bufs); i++) {
        *bufs[i] = p;
        p += round16(sizes[i]);
    }
    s->chosen = (int *)p; /* the last slot; int and float are both 4 bytes */
    s->m = m;
    const int R = c->attn_window - 1;
    kiln_err rc = ring_resize(s, R < kiln_rt_ring_start ? R : kiln_rt_ring_start);
    if (rc) {
        kiln_stream_free(s);
        return rc;
    }
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
    free(s->ring_block);
    free(s->block);
    free(s);
}

KILN_API void kiln_stream_reset(kiln_stream *s) {
    /* A device stream that fails to reset reports it at its next push. */
    if (s->dev) (void)kiln_rt_dstream_reset(s->dev);
    s->ticks = 0;
    s->ring_n = 0;
    s->ring_pos = 0;
    s->cost = (kiln_rt_cost){0, 0, 0};
}

KILN_API uint64_t kiln_stream_ticks(const kiln_stream *s) {
    return s->ticks;
}

kiln_rt_cost kiln_rt_stream_last_cost(const kiln_stream *s) {
    return s->cost;
}

/* ---- one tick over a set of streams ---- */

/* The per-stream buffers a product reads or writes; OUTPUTS is the caller's row of the
 * stream's outputs. */
typedef enum buf { XN, H, U, QKV, ATT, TMP, FF, PROBS, OUTPUTS } buf;

static float *bufp(kiln_stream *s, buf b) {
    switch (b) {
    case XN:
        return s->xn;
    case H:
        return s->h;
    case U:
        return s->u;
    case QKV:
        return s->qkv;
    case ATT:
        return s->att;
    case TMP:
        return s->tmp;
    case FF:
        return s->ff;
    case PROBS:
        return s->probs;
    case OUTPUTS:
        break;
    }
    return NULL;
}

static float *slot_ff(const kiln_stream *s, int k) {
    return s->slot_ff + (size_t)k * round16((size_t)s->m->cfg.d_ff);
}

static float *slot_out(const kiln_stream *s, int k) {
    return s->slot_out + (size_t)k * round16((size_t)s->m->cfg.d_model);
}

/* The slot in which s's router chose expert e this tick, or -1. */
static int slot_of(const kiln_stream *s, int e) {
    for (int k = 0; k < s->m->cfg.top_k; k++)
        if (s->chosen[k] == e) return k;
    return -1;
}

/* One product over the set: which vectors of each stream (or, for the head, the caller's
 * outputs), or which expert. */
typedef struct prod {
    kiln_stream *const *ss;
    buf y, x;
    float *out; /* y == OUTPUTS: stream i's y is out + i*O */
    int e;      /* experts: the expert, and fc (x = u, y = its slot's hidden) or proj */
    bool proj;
} prod;

static bool vec_bufs(void *ctx, size_t i, float **y, const float **x) {
    const prod *p = ctx;
    kiln_stream *s = p->ss[i];
    *y = p->y == OUTPUTS ? p->out + i * (size_t)s->m->cfg.n_outputs : bufp(s, p->y);
    *x = bufp(s, p->x);
    return true;
}

static bool vec_expert(void *ctx, size_t i, float **y, const float **x) {
    const prod *p = ctx;
    const kiln_stream *s = p->ss[i];
    int k = slot_of(s, p->e);
    if (k < 0) return false;
    *y = p->proj ? slot_out(s, k) : slot_ff(s, k);
    *x = p->proj ? slot_ff(s, k) : s->u;
    return true;
}

/* y = W x + b for every stream of the set, counting the work. */
static void mv(kiln_stream *const *ss, size_t n, buf y, float *out, buf x, const void *W,
               const float *b, int rows, int cols) {
    prod p = {.ss = ss, .y = y, .x = x, .out = out};
    ss[0]->cost.wrows += kiln_rt_matvec_many(ss[0]->m, n, vec_bufs, &p, W, b, rows, cols);
    for (size_t i = 0; i < n; i++)
        ss[i]->cost.madds += (uint64_t)rows * (uint64_t)cols;
}

/* Attention of layer l for one stream over its ring and this tick; this tick's key and
 * value then take the ring's oldest entry (the ring position moves after the last layer). */
static void attend(kiln_stream *s, int l) {
    const kiln_model *m = s->m;
    const int D = m->cfg.d_model, R = m->cfg.attn_window - 1;
    /* Keys oldest first: the ring from ring_pos on, then from 0, then this tick. (Until the
     * ring is full nothing is older than position 0; once it is, cap is R.) */
    float *kr = s->kring + (size_t)l * s->cap * D, *vr = s->vring + (size_t)l * s->cap * D;
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
}

static void ffn(kiln_stream *const *ss, size_t n, const kiln_rt_layer *L) {
    const kiln_model *m = ss[0]->m;
    const int D = m->cfg.d_model, Fh = m->cfg.d_ff, E = m->cfg.n_experts, K = m->cfg.top_k;
    if (E == 0) {
        mv(ss, n, FF, NULL, U, L->fc_w, L->fc_b, Fh, D);
        for (size_t i = 0; i < n; i++)
            kiln_gelu_forward(ss[i]->ff, ss[i]->ff, (size_t)Fh);
        mv(ss, n, TMP, NULL, FF, L->proj_w, L->proj_b, D, Fh);
        for (size_t i = 0; i < n; i++)
            kiln_row_axpy(ss[i]->h, 1.0f, ss[i]->tmp, D);
        return;
    }
    mv(ss, n, PROBS, NULL, U, L->router_w, NULL, E, D);
    for (size_t i = 0; i < n; i++)
        kiln_rt_route(ss[i]->probs, E, K, ss[i]->chosen, ss[i]->gates);
    /* Each expert once, over the (stream, slot) pairs that chose it. */
    for (int e = 0; e < E; e++) {
        prod p = {.ss = ss, .e = e};
        size_t rows =
            kiln_rt_matvec_many(m, n, vec_expert, &p, kiln_rt_wat(m, L->fc_w, (size_t)e * Fh * D),
                                L->fc_b + (size_t)e * Fh, Fh, D);
        if (!rows) continue; /* no stream chose it */
        ss[0]->cost.wrows += rows;
        for (size_t i = 0; i < n; i++) {
            int k = slot_of(ss[i], e);
            if (k < 0) continue;
            kiln_gelu_forward(slot_ff(ss[i], k), slot_ff(ss[i], k), (size_t)Fh);
            ss[i]->cost.madds += 2 * (uint64_t)Fh * (uint64_t)D;
        }
        p.proj = true;
        ss[0]->cost.wrows +=
            kiln_rt_matvec_many(m, n, vec_expert, &p, kiln_rt_wat(m, L->proj_w, (size_t)e * D * Fh),
                                L->proj_b + (size_t)e * D, D, Fh);
    }
    /* Each stream sums its slots in slot order, as docs/model.md writes the sum. */
    for (size_t i = 0; i < n; i++) {
        kiln_stream *s = ss[i];
        memset(s->acc, 0, (size_t)D * sizeof *s->acc);
        for (int k = 0; k < K; k++)
            kiln_row_axpy(s->acc, s->gates[k], slot_out(s, k), D);
        kiln_row_axpy(s->h, 1.0f, s->acc, D);
    }
}

/* One tick for each of n streams of one CPU model, inputs already checked: features [n,F]
 * in, outputs [n,O] out. */
static void tick(kiln_stream *const *ss, size_t n, const float *features, float *outputs) {
    const kiln_model *m = ss[0]->m;
    const kiln_model_config *c = &m->cfg;
    const int F = c->n_features, D = c->d_model, R = c->attn_window - 1;
    for (size_t i = 0; i < n; i++) {
        kiln_stream *s = ss[i];
        const float *x = features + i * (size_t)F;
        s->cost = (kiln_rt_cost){0, 0, 0};
        kiln_standardize_forward(s->xn, x, m->in_mean, m->in_std, 1, F);
    }
    mv(ss, n, H, NULL, XN, m->embed_w, m->embed_b, D, F);
    for (int l = 0; l < c->n_layers; l++) {
        const kiln_rt_layer *L = &m->layers[l];
        for (size_t i = 0; i < n; i++)
            kiln_row_rmsnorm_f64(ss[i]->u, ss[i]->h, L->attn_norm, D, c->norm_eps);
        mv(ss, n, QKV, NULL, U, L->qkv_w, L->qkv_b, 3 * D, D);
        for (size_t i = 0; i < n; i++)
            attend(ss[i], l);
        mv(ss, n, TMP, NULL, ATT, L->out_w, L->out_b, D, D);
        for (size_t i = 0; i < n; i++) {
            kiln_row_axpy(ss[i]->h, 1.0f, ss[i]->tmp, D);
            kiln_row_rmsnorm_f64(ss[i]->u, ss[i]->h, L->ffn_norm, D, c->norm_eps);
        }
        ffn(ss, n, L);
    }
    for (size_t i = 0; i < n; i++) {
        kiln_stream *s = ss[i];
        if (R > 0) {
            s->ring_pos = (s->ring_pos + 1) % R;
            if (s->ring_n < R) s->ring_n++;
        }
        kiln_row_rmsnorm_f64(s->u, s->h, m->final_norm, D, c->norm_eps);
    }
    mv(ss, n, OUTPUTS, outputs, U, m->head_w, m->head_b, c->n_outputs, D);
    for (size_t i = 0; i < n; i++)
        ss[i]->ticks++;
}

KILN_API kiln_err kiln_stream_push(kiln_stream *s, const float *features, float *outputs) {
    const kiln_model *m = s->m;
    const int F = m->cfg.n_features;
    for (int f = 0; f < F; f++)
        KILN_FAIL_IF(!isfinite(features[f]), KILN_ERR_NUMERIC,
                     "stream tick %llu: feature %d is not finite (%g); the stream is unchanged",
                     (unsigned long long)s->ticks, f, (double)features[f]);
    if (s->dev) {
        s->cost = (kiln_rt_cost){0, 0, 0};
        KILN_TRY(kiln_rt_dstream_push(s->dev, features, outputs));
        s->ticks++;
        return KILN_OK;
    }
    KILN_TRY(ring_reserve(s));
    tick(&s, 1, features, outputs);
    return KILN_OK;
}

KILN_API kiln_err kiln_stream_push_many(kiln_stream *const *streams, size_t n,
                                        const float *features, float *outputs) {
    if (n == 0) return KILN_OK;
    KILN_FAIL_IF(!streams || !features || !outputs, KILN_ERR_USAGE,
                 "kiln_stream_push_many: null %s",
                 !streams    ? "streams"
                 : !features ? "features"
                             : "outputs");
    /* Every check before any stream changes, so that a refusal leaves them all as they were. */
    for (size_t i = 0; i < n; i++) {
        KILN_FAIL_IF(!streams[i], KILN_ERR_USAGE,
                     "kiln_stream_push_many: streams[%zu] is null; no stream was changed", i);
        KILN_FAIL_IF(streams[i]->m != streams[0]->m, KILN_ERR_USAGE,
                     "kiln_stream_push_many: streams[%zu] is on model '%s', streams[0] on another "
                     "('%s'); no stream was changed",
                     i, streams[i]->m->path, streams[0]->m->path);
    }
    const kiln_model *m = streams[0]->m;
    const size_t F = (size_t)m->cfg.n_features, O = (size_t)m->cfg.n_outputs;
    for (size_t i = 0; i < n; i++)
        for (size_t f = 0; f < F; f++)
            KILN_FAIL_IF(!isfinite(features[i * F + f]), KILN_ERR_NUMERIC,
                         "kiln_stream_push_many: streams[%zu] (tick %llu): feature %zu is not "
                         "finite (%g); no stream was changed",
                         i, (unsigned long long)streams[i]->ticks, f, (double)features[i * F + f]);
    /* A stream twice would take two ticks in one call. A mark per stream finds it in one
     * pass; every mark is cleared again before anything else happens. */
    size_t dup = n;
    for (size_t i = 0; i < n && dup == n; i++) {
        if (streams[i]->marked)
            dup = i;
        else
            streams[i]->marked = true;
    }
    for (size_t i = 0; i < dup; i++)
        streams[i]->marked = false;
    if (dup < n) {
        size_t first = 0;
        while (streams[first] != streams[dup])
            first++;
        return kiln_fail(KILN_ERR_USAGE,
                         "kiln_stream_push_many: streams[%zu] is streams[%zu] again (one tick per "
                         "stream per call); no stream was changed",
                         dup, first);
    }
    if (m->dev) {
        /* On a GPU each stream is its own CUDA graph: push them in turn. */
        for (size_t i = 0; i < n; i++) {
            kiln_err rc = kiln_stream_push(streams[i], features + i * F, outputs + i * O);
            if (rc)
                return kiln_errprefix(rc,
                                      "kiln_stream_push_many: streams[%zu] (streams before it "
                                      "took their tick): ",
                                      i);
        }
        return KILN_OK;
    }
    for (size_t i = 0; i < n; i++) {
        kiln_err rc = ring_reserve(streams[i]); /* a larger ring: no stream's state changes */
        if (rc) return kiln_errprefix(rc, "kiln_stream_push_many: streams[%zu]: ", i);
    }
    tick(streams, n, features, outputs);
    return KILN_OK;
}

/*
 * runtime_int.h - the runtime's private parts: the loaded model's layout, the math that
 * the batch and the streaming forward share (so that both compute docs/model.md the same
 * way), the per-tick kernels, and hooks for tests and benchmarks.
 */
#ifndef KILN_RUNTIME_INT_H
#define KILN_RUNTIME_INT_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "kiln.h"
#include "route.h" /* kiln_route_stream: MoE routing for one token */
#include "row.h"   /* kiln_row_dot, kiln_row_axpy: attention's inner loops */

/* One block's weights. Matrices (void *) are f32 or bf16 (kiln_model.bf16); vectors
 * (biases, gains) are always f32. */
typedef struct kiln_rt_layer {
    const float *attn_norm; /* [D] */
    const void *qkv_w;      /* [3D,D] */
    const float *qkv_b;     /* [3D] */
    const void *out_w;      /* [D,D] */
    const float *out_b;     /* [D] */
    const float *ffn_norm;  /* [D] */
    const void *router_w;   /* [E,D]; NULL when dense */
    const void *fc_w;       /* [Fh,D] dense, [E,Fh,D] mixture */
    const float *fc_b;      /* [Fh] or [E,Fh] */
    const void *proj_w;     /* [D,Fh] or [E,D,Fh] */
    const float *proj_b;    /* [D] or [E,D] */
} kiln_rt_layer;

struct kiln_model {
    kiln_model_config cfg;
    char *path;                    /* the model.safetensors it came from */
    bool bf16;                     /* matrices stored as bf16 */
    size_t wsize;                  /* bytes per matrix element: 4 or 2 */
    size_t max_matrix;             /* elements in the largest single matrix (one expert's) */
    size_t weight_bytes;           /* bytes of all matrices */
    const float *in_mean, *in_std; /* [F] */
    const void *embed_w;           /* [D,F] */
    const float *embed_b;          /* [D] */
    const float *final_norm;       /* [D] */
    const void *head_w;            /* [O,D] */
    const float *head_b;           /* [O] */
    float *slopes;                 /* [H] ALiBi m for each head */
    float attn_scale;              /* 1/sqrt(Dh) */
    kiln_rt_layer *layers;         /* [L] */
    void *wblock;                  /* every matrix, 64-byte aligned each */
    float *vblock;                 /* every vector, and slopes */
    size_t wcount, vcount;         /* elements in wblock and vblock */
    int device;                    /* KILN_DEVICE_CPU or a CUDA device */
    struct kiln_rt_dev *dev;       /* the copy on that device (cuda.c); NULL on the CPU */
    bool portable;                 /* tests: the portable kernels even where AVX2 runs */
};

/* Tests only (never set in kiln): every stream routes exact router ties to the higher
 * expert index. Set it before opening streams, with no stream pushing. */
extern bool kiln_rt_ties_high;
/* Ring entries a new stream starts with (stream.c; 256): a test hook. */
extern int kiln_rt_ring_start;

/* A stream's routing of one token (kiln_route_stream), with the test hook kiln_rt_ties_high: then
 * the logits are routed in reverse expert order and the picks mapped back, so that exact
 * ties go to the higher index, as a path summing in another order might resolve them
 * (docs/validation.md, "Router ties"); anything not tied routes alike. */
static inline void kiln_rt_route(float *p, int E, int K, int32_t *idx, float *gate) {
    if (!kiln_rt_ties_high) {
        kiln_route_stream(p, E, K, idx, gate);
        return;
    }
    for (int e = 0; e < E / 2; e++) {
        float v = p[e];
        p[e] = p[E - 1 - e];
        p[E - 1 - e] = v;
    }
    kiln_route_stream(p, E, K, idx, gate);
    for (int k = 0; k < K; k++)
        idx[k] = E - 1 - idx[k];
    for (int e = 0; e < E / 2; e++) {
        float v = p[e];
        p[e] = p[E - 1 - e];
        p[E - 1 - e] = v;
    }
}

/* Element i of a matrix block (f32 or bf16), as a pointer. */
static inline const void *kiln_rt_wat(const kiln_model *m, const void *w, size_t i) {
    return (const char *)w + i * m->wsize;
}

/* ---- shared math: attention over runs of keys ----
 * (The batch and the stream share the rest through kernels/: kiln_standardize_forward,
 * kiln_gelu_forward, the RMSNorm kiln_rmsnorm_f64_forward and the residual add
 * kiln_residual_forward, whose rows the tick inlines from row.h, and row.h's dot and axpy.) */

/* Keys and values of one attention, oldest first, in up to three runs (a ring buffer's
 * two halves and the rows being computed); row r of a run is at k + r*stride. */
typedef struct kiln_rt_kv {
    const float *k, *v;
    int n;
    size_t stride;
} kiln_rt_kv;

/* o[D] = windowed ALiBi attention of one query row q[D] over the runs' keys (the last
 * key is the query's own position, at distance 0). scores holds H*W + 2*H floats. Returns
 * the number of keys attended.
 * Keys are visited in order, each row (every head's part of it) once per pass, so that a
 * ring in memory is read as rows rather than as a column per head; each head's sums still
 * run over its keys in key order, so every head computes what a head-by-head loop does. */
static inline int kiln_rt_attend(const kiln_model *m, float *o, float *scores, const float *q,
                                 const kiln_rt_kv *runs, int nruns) {
    const int D = m->cfg.d_model, H = m->cfg.n_heads, Dh = D / H;
    int nk = 0;
    for (int r = 0; r < nruns; r++)
        nk += runs[r].n;
    float *mx = scores + (size_t)H * nk, *inv = mx + H; /* [H] each */
    for (int h = 0; h < H; h++)
        mx[h] = -INFINITY;
    int j = 0;
    for (int r = 0; r < nruns; r++)
        for (int i = 0; i < runs[r].n; i++, j++) {
            const float *k = runs[r].k + (size_t)i * runs[r].stride;
            for (int h = 0; h < H; h++) {
                float dot = kiln_row_dot(q + h * Dh, k + h * Dh, Dh);
                float s = dot * m->attn_scale - m->slopes[h] * (float)(nk - 1 - j);
                scores[(size_t)h * nk + j] = s;
                mx[h] = s > mx[h] ? s : mx[h];
            }
        }
    for (int h = 0; h < H; h++) {
        float *sh = scores + (size_t)h * nk, sum = 0;
        for (j = 0; j < nk; j++)
            sum += (sh[j] = expf(sh[j] - mx[h]));
        inv[h] = 1.0f / sum;
    }
    for (int d = 0; d < D; d++)
        o[d] = 0;
    j = 0;
    for (int r = 0; r < nruns; r++)
        for (int i = 0; i < runs[r].n; i++, j++) {
            const float *v = runs[r].v + (size_t)i * runs[r].stride;
            for (int h = 0; h < H; h++)
                kiln_row_axpy(o + h * Dh, scores[(size_t)h * nk + j] * inv[h], v + h * Dh, Dh);
        }
    return nk;
}

/* ---- per-tick kernels (matvec.c) ---- */

/* y[rows] = W[rows,cols] @ x[cols] + b (b may be NULL); W is f32 or bf16 per m. */
void kiln_rt_matvec(const kiln_model *m, float *y, const void *W, const float *b, const float *x,
                    int rows, int cols);
/* The same, always on the portable path (the one that runs where AVX2 is missing). */
void kiln_rt_matvec_portable(const kiln_model *m, float *y, const void *W, const float *b,
                             const float *x, int rows, int cols);
/* The vectors of kiln_rt_matvec_many: vector i's y [rows] and x [cols], or false when vector
 * i takes no part in this product. Called once per block of rows, so it must be cheap. */
typedef bool kiln_rt_vec_fn(void *ctx, size_t i, float **y, const float **x);
/* y_i = W x_i + b for each of n vectors, reading W from memory once: W's rows go in blocks
 * of about 16 KiB (a multiple of 4 rows), each block against every vector while it is in
 * cache, the vectors two at a time (each load of W serves both, and twice the sums are in
 * flight). For every (row, vector) the kernels do exactly the operations kiln_rt_matvec's
 * kernel does for that row, in the same order, so each y_i is bitwise kiln_rt_matvec's.
 * Returns the rows of W read (rows, or 0 when every vector declined). */
size_t kiln_rt_matvec_many(const kiln_model *m, size_t n, kiln_rt_vec_fn *vec, void *ctx,
                           const void *W, const float *b, int rows, int cols);
/* W[n] (f32 or bf16 per m) widened into dst[n]. */
void kiln_rt_widen(const kiln_model *m, float *dst, const void *W, size_t n);

/* ---- the model on a CUDA device (cuda.c; without CUDA every call fails cleanly) ---- */

typedef struct kiln_rt_dev kiln_rt_dev;
typedef struct kiln_rt_dstream kiln_rt_dstream;
/* Copy m's weights to a CUDA device (m->dev, m->device); its batch workspace too. */
kiln_err kiln_rt_dev_open(kiln_model *m, int device);
void kiln_rt_dev_free(kiln_rt_dev *d);
/* Tests: make the batch chunks smaller (rows >= 2*L*(W-1)+1, at most what open sized), so
 * that short sequences take the path of long ones. */
kiln_err kiln_rt_dev_set_chunk(kiln_model *m, int rows);
/* kiln_model_forward on the device (inputs already checked). */
kiln_err kiln_rt_dev_forward(const kiln_model *m, const float *x, int B, int S, float *y);
/* A stream on the device: rings and buffers there, one tick captured as a CUDA graph. */
kiln_err kiln_rt_dstream_open(const kiln_model *m, kiln_rt_dstream **out);
kiln_err kiln_rt_dstream_push(kiln_rt_dstream *s, const float *features, float *outputs);
kiln_err kiln_rt_dstream_reset(kiln_rt_dstream *s);
void kiln_rt_dstream_free(kiln_rt_dstream *s);

/* ---- stream accounting, for tests: the work of the last push ---- */

typedef struct kiln_rt_cost {
    uint64_t madds; /* multiply-adds in matrix-vector products and attention */
    uint64_t keys;  /* keys attended, summed over layers */
    uint64_t wrows; /* weight-matrix rows read; kiln_stream_push_many charges the rows the
                       whole call read to its first stream and 0 to the others */
} kiln_rt_cost;
kiln_rt_cost kiln_rt_stream_last_cost(const kiln_stream *s);

/* ---- random models, for tests and benchmarks ---- */

/* Write a model.safetensors for cfg with Philox(seed) weights scaled so that activations
 * stay O(1) (matrices N(0, 1/fan_in), biases N(0, 0.1^2), gains 1 + N(0, 0.1^2),
 * norm.in_std in [0.5, 2)); bf16 stores every tensor as BF16. */
kiln_err kiln_rt_random_model(const char *path, const kiln_model_config *cfg, uint64_t seed,
                              bool bf16);
/* A standard normal from Philox (seed, KILN_STREAM_TEST, counter). */
double kiln_rt_normal(uint64_t seed, uint64_t counter);

#endif

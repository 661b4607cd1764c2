// attention.cu - causal windowed multi-head attention with ALiBi. One warp per (b, h, i).
// Scores: the lanes split the head's features (coalesced loads of each key row), one warp sum
// per key, the keys in ascending order; lane w % 32 keeps score w, so the softmax (lanes over
// keys, warp max and sum) reads only what it wrote. The weighted values: lanes over feature
// columns. The backward is split by owner so that nothing is added twice to the same place at
// once: pass 1, per query, the score gradients (kept in scratch) and dq; pass 2, per key, dk
// and dv over the queries that saw it, in ascending query order.
//
// (The first version gave each lane a key and walked its features: 32 rows per load, 32 L1
// wavefronts per instruction. On the H200 that made attention most of a training step.)
#include "cuda_int.h"

#define WARPS 4

// a . b over n features, the lanes taking features lane, lane + 32, ...; every lane gets the
// same sum (the xor butterfly adds the same pairs on every lane).
__device__ __forceinline__ float dot_warp(const float *a, const float *b, int n, int lane) {
    float s = 0.0f;
    for (int d = lane; d < n; d += KILN_WARP)
        s += a[d] * b[d];
    return warp_sum(s);
}

__global__ static void attn_fwd(float *out, float *att, const float *qkv, int B, int S, int D,
                                int H, int W, float scale) {
    const int lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * WARPS + (threadIdx.x >> 5); // (b, h, i)
    if (row >= (size_t)B * H * S) return;
    const int i = (int)(row % S), h = (int)((row / S) % H), b = (int)(row / ((size_t)S * H));
    const int Dh = D / H;
    const size_t C = 3 * (size_t)D, tok = (size_t)b * S;
    const float m = exp2f(-8.0f * (float)(h + 1) / (float)H);
    const float *q = qkv + (tok + i) * C + (size_t)h * Dh;
    float *a = att + row * W;
    const int nw = i + 1 < W ? i + 1 : W;
    float mx = -INFINITY;
    for (int w = 0; w < nw; w++) {
        const float *k = qkv + (tok + i - w) * C + D + (size_t)h * Dh;
        float s = dot_warp(q, k, Dh, lane) * scale - m * (float)w;
        if ((w & (KILN_WARP - 1)) == lane) a[w] = s;
        mx = fmaxf(mx, s);
    }
    float sum = 0.0f;
    for (int w = lane; w < nw; w += KILN_WARP) {
        float e = expf(a[w] - mx);
        a[w] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    for (int w = lane; w < nw; w += KILN_WARP)
        a[w] *= inv;
    for (int w = nw + lane; w < W; w += KILN_WARP)
        a[w] = 0.0f;
    __syncwarp(); // the weights other lanes wrote, before every lane reads all of them
    float *o = out + (tok + i) * D + (size_t)h * Dh;
    for (int d = lane; d < Dh; d += KILN_WARP) {
        float acc = 0.0f;
        for (int w = 0; w < nw; w++)
            acc += a[w] * qkv[(tok + i - w) * C + 2 * (size_t)D + (size_t)h * Dh + d];
        o[d] = acc;
    }
}

// Per query: da_w = dy . v_{i-w}, ds_w = a_w (da_w - sum a da) scale into scratch,
// dq += sum_w ds_w k_{i-w}.
__global__ static void attn_bwd_query(float *dqkv, float *ds, const float *dout, const float *qkv,
                                      const float *att, int B, int S, int D, int H, int W,
                                      float scale) {
    const int lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (row >= (size_t)B * H * S) return;
    const int i = (int)(row % S), h = (int)((row / S) % H), b = (int)(row / ((size_t)S * H));
    const int Dh = D / H;
    const size_t C = 3 * (size_t)D, tok = (size_t)b * S;
    const float *dy = dout + (tok + i) * D + (size_t)h * Dh;
    const float *a = att + row * W;
    float *g = ds + row * W;
    const int nw = i + 1 < W ? i + 1 : W;
    float sum = 0.0f;
    for (int w = 0; w < nw; w++) {
        float da = dot_warp(dy, qkv + (tok + i - w) * C + 2 * (size_t)D + (size_t)h * Dh, Dh, lane);
        if ((w & (KILN_WARP - 1)) == lane) {
            g[w] = da;
            sum += a[w] * da;
        }
    }
    sum = warp_sum(sum);
    for (int w = lane; w < nw; w += KILN_WARP)
        g[w] = a[w] * (g[w] - sum) * scale;
    __syncwarp();
    float *dq = dqkv + (tok + i) * C + (size_t)h * Dh;
    for (int d = lane; d < Dh; d += KILN_WARP) {
        float acc = 0.0f;
        for (int w = 0; w < nw; w++)
            acc += g[w] * qkv[(tok + i - w) * C + D + (size_t)h * Dh + d];
        dq[d] += acc;
    }
}

// Per key j: dk_j += sum_i ds[i, i-j] q_i, dv_j += sum_i a[i, i-j] dy_i over j <= i < j+W.
__global__ static void attn_bwd_key(float *dqkv, const float *ds, const float *dout,
                                    const float *qkv, const float *att, int B, int S, int D, int H,
                                    int W) {
    const int lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * WARPS + (threadIdx.x >> 5); // (b, h, j)
    if (row >= (size_t)B * H * S) return;
    const int j = (int)(row % S), h = (int)((row / S) % H), b = (int)(row / ((size_t)S * H));
    const int Dh = D / H;
    const size_t C = 3 * (size_t)D, tok = (size_t)b * S;
    const size_t bh = row - j; // row of (b, h, 0)
    const int iend = j + W < S ? j + W : S;
    float *dk = dqkv + (tok + j) * C + D + (size_t)h * Dh;
    float *dv = dqkv + (tok + j) * C + 2 * (size_t)D + (size_t)h * Dh;
    for (int d = lane; d < Dh; d += KILN_WARP) {
        float acck = 0.0f, accv = 0.0f;
        for (int i = j; i < iend; i++) {
            const size_t at = (bh + i) * W + (i - j);
            acck += ds[at] * qkv[(tok + i) * C + (size_t)h * Dh + d];
            accv += att[at] * dout[(tok + i) * D + (size_t)h * Dh + d];
        }
        dk[d] += acck;
        dv[d] += accv;
    }
}

static unsigned warp_blocks(size_t rows) {
    return (unsigned)((rows + WARPS - 1) / WARPS);
}

extern "C" kiln_err kiln_cuda_attention_forward(float *out, float *att, const float *qkv, int B,
                                                int S, int D, int H, int W) {
    const size_t rows = (size_t)B * H * S;
    if (!rows) return KILN_OK;
    const float scale = 1.0f / sqrtf((float)(D / H));
    attn_fwd<<<warp_blocks(rows), WARPS * 32>>>(out, att, qkv, B, S, D, H, W, scale);
    CU_LAUNCHED("attention_forward", "attn_fwd");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_attention_backward(float *dqkv, float *scratch, const float *dout,
                                                 const float *qkv, const float *att, int B, int S,
                                                 int D, int H, int W) {
    const size_t rows = (size_t)B * H * S;
    if (!rows) return KILN_OK;
    const float scale = 1.0f / sqrtf((float)(D / H));
    attn_bwd_query<<<warp_blocks(rows), WARPS * 32>>>(dqkv, scratch, dout, qkv, att, B, S, D, H, W,
                                                      scale);
    CU_LAUNCHED("attention_backward", "attn_bwd_query");
    attn_bwd_key<<<warp_blocks(rows), WARPS * 32>>>(dqkv, scratch, dout, qkv, att, B, S, D, H, W);
    CU_LAUNCHED("attention_backward", "attn_bwd_key");
    return KILN_OK;
}

/* attention.c - causal, windowed multi-head attention with ALiBi. Only the W keys inside
 * the window are visited, so the cost is B*H*S*W*Dh, never S^2. */
#include <math.h>

#include "kernels.h"
#include "row.h" /* kiln_row_dot, kiln_row_axpy */

static float alibi_slope(int h, int H) {
    return exp2f(-8.0f * (float)(h + 1) / (float)H);
}

void kiln_attention_forward(float *out, float *att, const float *qkv, int B, int S, int D, int H,
                            int W) {
    const int Dh = D / H;
    const size_t C = 3 * (size_t)D;
    const float scale = 1.0f / sqrtf((float)Dh);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float m = alibi_slope(h, H);
            for (int i = 0; i < S; i++) {
                const float *q = qkv + ((size_t)b * S + i) * C + (size_t)h * Dh;
                float *a = att + (((size_t)b * H + h) * S + i) * W;
                int nw = i + 1 < W ? i + 1 : W;
                float mx = -INFINITY;
                for (int w = 0; w < nw; w++) {
                    const float *k = qkv + ((size_t)b * S + (i - w)) * C + D + (size_t)h * Dh;
                    float s = kiln_row_dot(q, k, Dh) * scale - m * (float)w;
                    a[w] = s;
                    if (s > mx) mx = s;
                }
                float sum = 0.0f;
                for (int w = 0; w < nw; w++) {
                    a[w] = expf(a[w] - mx);
                    sum += a[w];
                }
                float inv = 1.0f / sum;
                for (int w = 0; w < nw; w++)
                    a[w] *= inv;
                for (int w = nw; w < W; w++)
                    a[w] = 0.0f;
                float *o = out + ((size_t)b * S + i) * D + (size_t)h * Dh;
                for (int d = 0; d < Dh; d++)
                    o[d] = 0.0f;
                for (int w = 0; w < nw; w++)
                    kiln_row_axpy(
                        o, a[w],
                        qkv + ((size_t)b * S + (i - w)) * C + 2 * (size_t)D + (size_t)h * Dh, Dh);
            }
        }
}

/* With s = q.k scale - m w and a = softmax(s): dv_j += a_j dy, da_j = dy.v_j,
 * ds_j = a_j (da_j - sum_j' a_j' da_j'), dq += ds_j scale k_j, dk_j += ds_j scale q. */
void kiln_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                             const float *att, int B, int S, int D, int H, int W) {
    const int Dh = D / H;
    const size_t C = 3 * (size_t)D;
    const float scale = 1.0f / sqrtf((float)Dh);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                size_t arow = (((size_t)b * H + h) * S + i) * W;
                const float *a = att + arow;
                float *da = scratch + arow;
                const float *dy = dout + ((size_t)b * S + i) * D + (size_t)h * Dh;
                const float *q = qkv + ((size_t)b * S + i) * C + (size_t)h * Dh;
                float *dq = dqkv + ((size_t)b * S + i) * C + (size_t)h * Dh;
                int nw = i + 1 < W ? i + 1 : W;
                float sum = 0.0f;
                for (int w = 0; w < nw; w++) {
                    size_t j = (size_t)b * S + (i - w);
                    da[w] = kiln_row_dot(dy, qkv + j * C + 2 * (size_t)D + (size_t)h * Dh, Dh);
                    kiln_row_axpy(dqkv + j * C + 2 * (size_t)D + (size_t)h * Dh, a[w], dy, Dh);
                    sum += a[w] * da[w];
                }
                for (int w = 0; w < nw; w++) {
                    size_t j = (size_t)b * S + (i - w);
                    float ds = a[w] * (da[w] - sum) * scale;
                    kiln_row_axpy(dq, ds, qkv + j * C + D + (size_t)h * Dh, Dh);
                    kiln_row_axpy(dqkv + j * C + D + (size_t)h * Dh, ds, q, Dh);
                }
            }
}

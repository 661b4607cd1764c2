/* router.c - the mixture's router (softmax, top-k, renormalised gates), its auxiliary
 * losses, and the dispatch plan that groups choices by expert. */
#include <math.h>

#include "kernels.h"
#include "route.h"

void kiln_router_forward(float *probs, float *lse, int32_t *idx, float *gates, const float *logits,
                         int N, int E, int K) {
    for (int t = 0; t < N; t++)
        kiln_route_train_forward(probs + (size_t)t * E, &lse[t], idx + (size_t)t * K,
                                 gates + (size_t)t * K, logits + (size_t)t * E, E, K);
}

double kiln_router_load_expert(float *load_e, const float *probs, const int32_t *idx, int N, int E,
                               int K, int e) {
    size_t count = 0;
    for (size_t c = 0; c < (size_t)N * K; c++)
        count += idx[c] == e;
    double P = 0.0;
    for (int t = 0; t < N; t++)
        P += probs[(size_t)t * E + e];
    double f = (double)count / ((double)N * K);
    *load_e = (float)f;
    return f * (P / N);
}

double kiln_router_z_sum(const float *lse, int N) {
    double z = 0.0;
    for (int t = 0; t < N; t++)
        z += (double)lse[t] * lse[t];
    return z;
}

void kiln_router_loss_forward(float *load, double *losses, const float *probs, const float *lse,
                              const int32_t *idx, int N, int E, int K) {
    double lb = 0.0;
    for (int e = 0; e < E; e++)
        lb += kiln_router_load_expert(&load[e], probs, idx, N, E, K, e);
    losses[0] = E * lb;
    losses[1] = kiln_router_z_sum(lse, N) / N;
}

void kiln_router_backward(float *dlogits, const float *dgates, const float *probs, const float *lse,
                          const int32_t *idx, const float *gates, const float *load, float lb_coef,
                          float z_coef, int N, int E, int K) {
    const float lb_scale = lb_coef * (float)E / (float)N, z_scale = z_coef * 2.0f / (float)N;
    for (int t = 0; t < N; t++)
        kiln_route_train_backward(dlogits + (size_t)t * E, dgates + (size_t)t * K,
                                  probs + (size_t)t * E, lse[t], idx + (size_t)t * K,
                                  gates + (size_t)t * K, load, lb_scale, z_scale, E, K);
}

void kiln_moe_dispatch(int32_t *offsets, int32_t *pos, int32_t *rows, int *dropped,
                       const int32_t *idx, int capacity, int N, int E, int K) {
    /* First pass: each accepted choice's rank within its expert (token order), counts in
     * offsets[e+1]; then the prefix sum turns ranks into rows of the gathered buffers. */
    int drop = 0;
    for (int e = 0; e <= E; e++)
        offsets[e] = 0;
    for (size_t c = 0; c < (size_t)N * K; c++) {
        int e = idx[c];
        if (capacity > 0 && offsets[e + 1] >= capacity) {
            pos[c] = -1;
            drop++;
        } else {
            pos[c] = offsets[e + 1]++;
        }
    }
    for (int e = 0; e < E; e++)
        offsets[e + 1] += offsets[e];
    for (size_t c = 0; c < (size_t)N * K; c++) {
        if (pos[c] < 0) continue;
        pos[c] += offsets[idx[c]];
        rows[pos[c]] = (int32_t)(c / (size_t)K);
    }
    *dropped = drop;
}

void kiln_moe_gather_forward(float *xg, const float *inp, const int32_t *rows, int M, int D) {
    for (int m = 0; m < M; m++) {
        const float *src = inp + (size_t)rows[m] * D;
        float *dst = xg + (size_t)m * D;
        for (int d = 0; d < D; d++)
            dst[d] = src[d];
    }
}

void kiln_moe_gather_backward(float *dinp, const float *dxg, const int32_t *rows, int M, int D) {
    for (int m = 0; m < M; m++) {
        const float *src = dxg + (size_t)m * D;
        float *dst = dinp + (size_t)rows[m] * D;
        for (int d = 0; d < D; d++)
            dst[d] += src[d];
    }
}

void kiln_moe_combine_forward(float *out, const float *res, const float *yg, const float *gates,
                              const int32_t *pos, int N, int D, int K) {
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * D;
        const float *r = res + (size_t)t * D;
        for (int d = 0; d < D; d++)
            o[d] = 0.0f;
        for (int k = 0; k < K; k++) {
            int32_t m = pos[(size_t)t * K + k];
            if (m < 0) continue;
            float g = gates[(size_t)t * K + k];
            const float *y = yg + (size_t)m * D;
            for (int d = 0; d < D; d++)
                o[d] += g * y[d];
        }
        for (int d = 0; d < D; d++)
            o[d] += r[d];
    }
}

void kiln_moe_combine_backward(float *dyg, float *dgates, const float *dout, const float *yg,
                               const float *gates, const int32_t *pos, int N, int D, int K) {
    for (int t = 0; t < N; t++) {
        const float *dy = dout + (size_t)t * D;
        for (int k = 0; k < K; k++) {
            int32_t m = pos[(size_t)t * K + k];
            if (m < 0) continue;
            float g = gates[(size_t)t * K + k], s = 0.0f;
            const float *y = yg + (size_t)m * D;
            float *dyk = dyg + (size_t)m * D;
            for (int d = 0; d < D; d++) {
                s += dy[d] * y[d];
                dyk[d] += g * dy[d];
            }
            dgates[(size_t)t * K + k] += s;
        }
    }
}

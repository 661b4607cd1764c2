/* route.h - one token's routing: the single code that the host and the device both run
 * (KILN_HD, as core/philox.h), so that the same logits give the same experts, gates and
 * gradients, bit for bit, on either.
 *
 * Two routers: the trainer's (kiln_route_train_*: kernels/cpu/router.c, and one CUDA thread
 * per token in kernels/cuda/router.cu) and the runtime's (kiln_route_stream: runtime/forward.c
 * and runtime/stream.c, and the device stream's tick in kernels/cuda/tick.cu). They choose
 * alike but round differently (the runtime divides by the softmax's sum; the trainer
 * multiplies by its inverse and keeps the log-sum-exp), and the outputs of each are pinned
 * bit for bit by their tests, so the two stay two. */
#ifndef KILN_ROUTE_H
#define KILN_ROUTE_H

#include <math.h>
#include <stdint.h>

#include "philox.h" /* KILN_HD */

/* The trainer's router for one token: p[E] = softmax(r[E]), lse = logsumexp(r), the K
 * largest p into ix[K] (best first) and their p renormalised into g[K]. */
KILN_HD void kiln_route_train_forward(float *p, float *lse, int32_t *ix, float *g, const float *r,
                                      int E, int K) {
    float mx = -INFINITY;
    for (int e = 0; e < E; e++)
        if (r[e] > mx) mx = r[e];
    float sum = 0.0f;
    for (int e = 0; e < E; e++) {
        p[e] = expf(r[e] - mx);
        sum += p[e];
    }
    const float inv = 1.0f / sum;
    for (int e = 0; e < E; e++)
        p[e] *= inv;
    *lse = mx + logf(sum);
    /* K passes of an arg-max that only a strictly larger probability displaces, so of
     * equal probabilities the lower expert index is taken first. */
    float gsum = 0.0f;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int k2 = 0; k2 < k; k2++)
                taken |= ix[k2] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        ix[k] = best;
        g[k] = p[best];
        gsum += p[best];
    }
    for (int k = 0; k < K; k++)
        g[k] /= gsum;
}

/* Its gradient for one token: dr[E] += d loss / d logits from the gates' gradient dg[K], the
 * load-balance term (lb_scale * load[E]) and the z-loss term (z_scale * lse). */
KILN_HD void kiln_route_train_backward(float *dr, const float *dg, const float *p, float lse,
                                       const int32_t *ix, const float *g, const float *load,
                                       float lb_scale, float z_scale, int E, int K) {
    /* g_k = p_k / s with s the sum of the chosen p: dp_k = (dg_k - sum_k' dg_k' g_k') / s. */
    float psum = 0.0f, gdot = 0.0f;
    for (int k = 0; k < K; k++) {
        psum += p[ix[k]];
        gdot += dg[k] * g[k];
    }
    /* dp_e for every expert, then the softmax's Jacobian: dr = p (dp - sum p dp). */
    float pdp = 0.0f;
    for (int pass = 0; pass < 2; pass++) {
        for (int e = 0; e < E; e++) {
            float dp = lb_scale * load[e];
            for (int k = 0; k < K; k++)
                if (ix[k] == e) dp += (dg[k] - gdot) / psum;
            if (pass == 0)
                pdp += p[e] * dp;
            else
                dr[e] += p[e] * (dp - pdp) + z_scale * lse * p[e];
        }
    }
}

/* Expert a comes before expert b in the runtime's routing order of probabilities p:
 * p descending, then index ascending, and a NaN (from activations that overflowed) after
 * every number, so that the order is total. */
KILN_HD int kiln_route_before(const float *p, int a, int b) {
    int na = isnan(p[a]), nb = isnan(p[b]);
    if (na != nb) return nb;
    if (!na && p[a] != p[b]) return p[a] > p[b];
    return a < b;
}

/* The runtime's router for one token: p[E] holds the logits in and softmax(logits) out; the
 * K largest p, ties to the lower index, into idx[K] (best first) and their p renormalised
 * into gate[K]. */
KILN_HD void kiln_route_stream(float *p, int E, int K, int32_t *idx, float *gate) {
    float mx = p[0];
    for (int e = 1; e < E; e++)
        mx = p[e] > mx ? p[e] : mx;
    float sum = 0;
    for (int e = 0; e < E; e++)
        sum += (p[e] = expf(p[e] - mx));
    for (int e = 0; e < E; e++)
        p[e] /= sum;
    /* Each pick is the best expert strictly after the previous pick in the routing order,
     * so no "taken" flags are needed; the order is total, so every pick finds an expert
     * (K <= E) even when the probabilities are NaN: never an index out of range. */
    float chosen = 0;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            if (k > 0 && !kiln_route_before(p, idx[k - 1], e)) continue;
            if (best < 0 || kiln_route_before(p, e, best)) best = e;
        }
        idx[k] = best;
        chosen += p[best];
    }
    for (int k = 0; k < K; k++)
        gate[k] = p[idx[k]] / chosen;
}

#endif

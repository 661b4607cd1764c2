// router.cu - the mixture's router (one thread per token running the CPU's code, route.h, so
// the same logits give the same choices), its auxiliary losses (one block, double sums in a
// fixed tree), the dispatch plan (an integer block scan per expert: ranks are exact), and
// gather/combine without atomics (each output element has one owner).
#include "cuda_int.h"
#include "route.h"

__global__ static void router_fwd(float *probs, float *lse, int32_t *idx, float *gates,
                                  const float *logits, int N, int E, int K) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    kiln_route_train_forward(probs + (size_t)t * E, &lse[t], idx + (size_t)t * K,
                             gates + (size_t)t * K, logits + (size_t)t * E, E, K);
}

// One block: per expert the count of choices and the sum of its probabilities (double,
// thread-strided, fixed tree), then lb and z in expert order.
__global__ static void router_loss(float *load, double *losses, const float *probs,
                                   const float *lse, const int32_t *idx, int N, int E, int K) {
    __shared__ double sh[KILN_TOT_THREADS];
    const size_t NK = (size_t)N * K;
    double lb = 0.0;
    for (int e = 0; e < E; e++) {
        double cnt = 0.0, P = 0.0;
        for (size_t c = threadIdx.x; c < NK; c += KILN_TOT_THREADS)
            cnt += idx[c] == e ? 1.0 : 0.0;
        for (int t = threadIdx.x; t < N; t += KILN_TOT_THREADS)
            P += (double)probs[(size_t)t * E + e];
        cnt = block_sum_d(cnt, sh); // integers below 2^53: exact in any order
        P = block_sum_d(P, sh);
        const double f = cnt / ((double)N * K);
        if (threadIdx.x == 0) load[e] = (float)f;
        lb += f * (P / N);
    }
    double z = 0.0;
    for (int t = threadIdx.x; t < N; t += KILN_TOT_THREADS)
        z += (double)lse[t] * lse[t];
    z = block_sum_d(z, sh);
    if (threadIdx.x == 0) {
        losses[0] = E * lb;
        losses[1] = z / N;
    }
}

__global__ static void router_bwd(float *dlogits, const float *dgates, const float *probs,
                                  const float *lse, const int32_t *idx, const float *gates,
                                  const float *load, float lb_scale, float z_scale, int N, int E,
                                  int K) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    kiln_route_train_backward(dlogits + (size_t)t * E, dgates + (size_t)t * K,
                              probs + (size_t)t * E, lse[t], idx + (size_t)t * K,
                              gates + (size_t)t * K, load, lb_scale, z_scale, E, K);
}

// Block e ranks the choices of expert e in (t, k) order: a ballot scan per warp, the warps
// in order, chunk after chunk. Ranks at or past the capacity are refused (pos -1). The
// accepted count goes to offsets[e+1].
#define SCAN_THREADS 1024
__global__ static void dispatch_rank(int32_t *offsets, int32_t *pos, const int32_t *idx,
                                     int capacity, size_t NK) {
    __shared__ int warp_count[SCAN_THREADS / 32];
    const int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int base = 0;
    for (size_t c0 = 0; c0 < NK; c0 += SCAN_THREADS) {
        const size_t c = c0 + threadIdx.x;
        const bool mine = c < NK && idx[c] == e;
        const unsigned bal = __ballot_sync(KILN_FULL_MASK, mine);
        if (lane == 0) warp_count[warp] = __popc(bal);
        __syncthreads();
        int before = 0, total = 0;
        for (int w = 0; w < SCAN_THREADS / 32; w++) {
            before += w < warp ? warp_count[w] : 0;
            total += warp_count[w];
        }
        if (mine) {
            int r = base + before + __popc(bal & ((1u << lane) - 1u));
            pos[c] = capacity > 0 && r >= capacity ? -1 : r;
        }
        base += total;
        __syncthreads();
    }
    if (threadIdx.x == 0) offsets[e + 1] = capacity > 0 && base > capacity ? capacity : base;
}

__global__ static void dispatch_offsets(int32_t *offsets, int *dropped, int E, int NK) {
    offsets[0] = 0;
    for (int e = 0; e < E; e++)
        offsets[e + 1] += offsets[e];
    *dropped = NK - offsets[E];
}

__global__ static void dispatch_rows(int32_t *pos, int32_t *rows, const int32_t *idx,
                                     const int32_t *offsets, size_t NK, int K) {
    for (size_t c = blockIdx.x * (size_t)blockDim.x + threadIdx.x; c < NK;
         c += (size_t)gridDim.x * blockDim.x) {
        int32_t p = pos[c];
        if (p < 0) continue;
        p += offsets[idx[c]];
        pos[c] = p;
        rows[p] = (int32_t)(c / (size_t)K);
    }
}

__global__ static void gather_fwd(float *xg, const float *inp, const int32_t *rows, size_t n,
                                  int D) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t m = i / D;
        int d = (int)(i % D);
        xg[i] = inp[(size_t)rows[m] * D + d];
    }
}

// One thread per (t, d): the kept slots of t visited in ascending pos (the CPU's m order).
__global__ static void gather_bwd(float *dinp, const float *dxg, const int32_t *pos, size_t n,
                                  int D, int K) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / D;
        const int d = (int)(i % D);
        const int32_t *pt = pos + t * K;
        float acc = dinp[i];
        int32_t last = -1;
        for (int k = 0; k < K; k++) {
            int32_t next = INT32_MAX;
            for (int k2 = 0; k2 < K; k2++)
                if (pt[k2] > last && pt[k2] < next) next = pt[k2];
            if (next == INT32_MAX) break;
            acc += dxg[(size_t)next * D + d];
            last = next;
        }
        dinp[i] = acc;
    }
}

__global__ static void combine_fwd(float *out, const float *res, const float *yg,
                                   const float *gates, const int32_t *pos, size_t n, int D, int K) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i / D;
        const int d = (int)(i % D);
        float o = 0.0f;
        for (int k = 0; k < K; k++) {
            int32_t m = pos[t * K + k];
            if (m < 0) continue;
            o += gates[t * K + k] * yg[(size_t)m * D + d];
        }
        out[i] = o + res[i];
    }
}

// One warp per (t, k): dyg[m] += g dout[t] (m has this one owner), dgates += dout . yg[m].
__global__ static void combine_bwd(float *dyg, float *dgates, const float *dout, const float *yg,
                                   const float *gates, const int32_t *pos, size_t NK, int D,
                                   int K) {
    const int lane = threadIdx.x & 31;
    const size_t c = (size_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (c >= NK) return;
    const int32_t m = pos[c];
    if (m < 0) return;
    const float g = gates[c];
    const float *dy = dout + (c / K) * D, *y = yg + (size_t)m * D;
    float *dyk = dyg + (size_t)m * D;
    float s = 0.0f;
    for (int d = lane; d < D; d += KILN_WARP) {
        s += dy[d] * y[d];
        dyk[d] += g * dy[d];
    }
    s = warp_sum(s);
    if (lane == 0) dgates[c] += s;
}

extern "C" kiln_err kiln_cuda_router_forward(float *probs, float *lse, int32_t *idx, float *gates,
                                             const float *logits, int N, int E, int K) {
    if (N <= 0) return KILN_OK;
    router_fwd<<<(unsigned)((N + 127) / 128), 128>>>(probs, lse, idx, gates, logits, N, E, K);
    CU_LAUNCHED("router_forward", "router_fwd");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_router_loss_forward(float *load, double *losses, const float *probs,
                                                  const float *lse, const int32_t *idx, int N,
                                                  int E, int K) {
    if (N <= 0) return KILN_OK;
    router_loss<<<1, KILN_TOT_THREADS>>>(load, losses, probs, lse, idx, N, E, K);
    CU_LAUNCHED("router_loss_forward", "router_loss");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_router_backward(float *dlogits, const float *dgates,
                                              const float *probs, const float *lse,
                                              const int32_t *idx, const float *gates,
                                              const float *load, float lb_coef, float z_coef, int N,
                                              int E, int K) {
    if (N <= 0) return KILN_OK;
    // The CPU's scales, computed the CPU's way.
    const float lb_scale = lb_coef * (float)E / (float)N, z_scale = z_coef * 2.0f / (float)N;
    router_bwd<<<(unsigned)((N + 127) / 128), 128>>>(dlogits, dgates, probs, lse, idx, gates, load,
                                                     lb_scale, z_scale, N, E, K);
    CU_LAUNCHED("router_backward", "router_bwd");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_moe_dispatch(int32_t *offsets, int32_t *pos, int32_t *rows,
                                           int *dropped, const int32_t *idx, int capacity, int N,
                                           int E, int K) {
    const char *op = "moe_dispatch";
    const size_t NK = (size_t)(N > 0 ? N : 0) * K;
    if (E <= 0) return KILN_OK;
    dispatch_rank<<<(unsigned)E, SCAN_THREADS>>>(offsets, pos, idx, capacity, NK);
    CU_LAUNCHED(op, "dispatch_rank");
    dispatch_offsets<<<1, 1>>>(offsets, dropped, E, (int)NK);
    CU_LAUNCHED(op, "dispatch_offsets");
    if (NK) {
        dispatch_rows<<<kiln_blocks(NK, 256), 256>>>(pos, rows, idx, offsets, NK, K);
        CU_LAUNCHED(op, "dispatch_rows");
    }
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_moe_gather_forward(float *xg, const float *inp, const int32_t *rows,
                                                 int M, int D) {
    const size_t n = (size_t)(M > 0 ? M : 0) * D;
    if (!n) return KILN_OK;
    gather_fwd<<<kiln_blocks(n, 256), 256>>>(xg, inp, rows, n, D);
    CU_LAUNCHED("moe_gather_forward", "gather_fwd");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_moe_gather_backward(float *dinp, const float *dxg, const int32_t *pos,
                                                  int N, int D, int K) {
    const size_t n = (size_t)(N > 0 ? N : 0) * D;
    if (!n) return KILN_OK;
    gather_bwd<<<kiln_blocks(n, 256), 256>>>(dinp, dxg, pos, n, D, K);
    CU_LAUNCHED("moe_gather_backward", "gather_bwd");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_moe_combine_forward(float *out, const float *res, const float *yg,
                                                  const float *gates, const int32_t *pos, int N,
                                                  int D, int K) {
    const size_t n = (size_t)(N > 0 ? N : 0) * D;
    if (!n) return KILN_OK;
    combine_fwd<<<kiln_blocks(n, 256), 256>>>(out, res, yg, gates, pos, n, D, K);
    CU_LAUNCHED("moe_combine_forward", "combine_fwd");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_moe_combine_backward(float *dyg, float *dgates, const float *dout,
                                                   const float *yg, const float *gates,
                                                   const int32_t *pos, int N, int D, int K) {
    const size_t NK = (size_t)(N > 0 ? N : 0) * K;
    if (!NK) return KILN_OK;
    combine_bwd<<<(unsigned)((NK + 7) / 8), 256>>>(dyg, dgates, dout, yg, gates, pos, NK, D, K);
    CU_LAUNCHED("moe_combine_backward", "combine_bwd");
    return KILN_OK;
}

// norm.cu - RMSNorm: one warp per row (lane-strided partial sums, then the butterfly), the
// gain's gradient by the chunked column sum.
#include "cuda_int.h"

#define ROWS_PER_BLOCK 8

__global__ static void rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *weight,
                                   float eps, int N, int D) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (n >= N) return;
    const float *x = inp + (size_t)n * D;
    float ss = 0.0f;
    for (int d = lane; d < D; d += KILN_WARP)
        ss += x[d] * x[d];
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)D + eps);
    float *y = out + (size_t)n * D;
    for (int d = lane; d < D; d += KILN_WARP)
        y[d] = x[d] * r * weight[d];
    if (lane == 0) rstd[n] = r;
}

// The residual add and the RMSNorm after it in one pass: sum = a + b, out = rmsnorm(sum).
// Each element is the separate ops' (the same float add, the same products and warp sum).
__global__ static void add_rmsnorm_fwd(float *sum, float *out, float *rstd, const float *a,
                                       const float *b, const float *weight, float eps, int N,
                                       int D) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (n >= N) return;
    const size_t row = (size_t)n * D;
    float ss = 0.0f;
    for (int d = lane; d < D; d += KILN_WARP) {
        const float x = a[row + d] + b[row + d];
        sum[row + d] = x;
        ss += x * x;
    }
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)D + eps);
    for (int d = lane; d < D; d += KILN_WARP)
        out[row + d] = sum[row + d] * r * weight[d];
    if (lane == 0) rstd[n] = r;
}

// dx_i += r g_i dy_i - x_i r^3 / D * sum_j dy_j g_j x_j
__global__ static void rmsnorm_bwd(float *dinp, const float *dout, const float *inp,
                                   const float *weight, const float *rstd, int N, int D) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (n >= N) return;
    const float *x = inp + (size_t)n * D, *dy = dout + (size_t)n * D;
    float *dx = dinp + (size_t)n * D;
    const float r = rstd[n];
    float dot = 0.0f;
    for (int d = lane; d < D; d += KILN_WARP)
        dot += dy[d] * weight[d] * x[d];
    dot = warp_sum(dot);
    const float c = dot * r * r * r / (float)D;
    for (int d = lane; d < D; d += KILN_WARP)
        dx[d] += r * weight[d] * dy[d] - x[d] * c;
}

namespace {
struct gain_grad {
    const float *dy, *x, *rstd;
    int D;
    __device__ float operator()(int n, int d) const {
        size_t i = (size_t)n * D + d;
        return dy[i] * x[i] * rstd[n];
    }
};
} // namespace

extern "C" kiln_err kiln_cuda_rmsnorm_forward(float *out, float *rstd, const float *inp,
                                              const float *weight, float eps, int N, int D) {
    if (N <= 0 || D <= 0) return KILN_OK;
    rmsnorm_fwd<<<(unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK), ROWS_PER_BLOCK * 32>>>(
        out, rstd, inp, weight, eps, N, D);
    CU_LAUNCHED("rmsnorm_forward", "rmsnorm_fwd");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout,
                                               const float *inp, const float *weight,
                                               const float *rstd, int N, int D) {
    if (N <= 0 || D <= 0) return KILN_OK;
    rmsnorm_bwd<<<(unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK), ROWS_PER_BLOCK * 32>>>(
        dinp, dout, inp, weight, rstd, N, D);
    CU_LAUNCHED("rmsnorm_backward", "rmsnorm_bwd");
    gain_grad f = {dout, inp, rstd, D};
    return kiln_colsum(dweight, f, N, D, "rmsnorm_backward");
}

extern "C" kiln_err kiln_cuda_residual_rmsnorm_forward(float *sum, float *out, float *rstd,
                                                       const float *a, const float *b,
                                                       const float *weight, float eps, int N,
                                                       int D) {
    if (N <= 0 || D <= 0) return KILN_OK;
    add_rmsnorm_fwd<<<(unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK), ROWS_PER_BLOCK * 32>>>(
        sum, out, rstd, a, b, weight, eps, N, D);
    CU_LAUNCHED("residual_rmsnorm_forward", "add_rmsnorm_fwd");
    return KILN_OK;
}

// loss.cu - mean squared error and the diagnostics: double sums over a fixed partition.
#include "cuda_int.h"

namespace {
struct sq_diff {
    const float *y, *t;
    __device__ double operator()(size_t i) const {
        double d = (double)y[i] - (double)t[i];
        return d * d;
    }
};
struct sq {
    const float *x;
    __device__ double operator()(size_t i) const { return (double)x[i] * (double)x[i]; }
};
struct neg_plogp {
    const float *p;
    __device__ double operator()(size_t i) const {
        float v = p[i];
        return v > 0.0f ? -(double)v * log((double)v) : 0.0;
    }
};
} // namespace

__global__ static void mse_bwd(float *dy, const float *y, const float *t, float c, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dy[i] += c * (y[i] - t[i]);
}

// Max is exact in any order: one block, lane-strided, then a tree.
__global__ static void maxabs_kernel(float *out, const float *x, size_t n) {
    __shared__ float sh[256];
    float m = 0.0f;
    for (size_t i = threadIdx.x; i < n; i += 256)
        m = fmaxf(m, fabsf(x[i]));
    sh[threadIdx.x] = m;
    __syncthreads();
    for (int s = 128; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = sh[0];
}

extern "C" kiln_err kiln_cuda_mse_forward(double *loss, const float *y, const float *targets,
                                          size_t n) {
    sq_diff f = {y, targets};
    return kiln_total(loss, f, n, (double)n, TOTAL_DOUBLE, "mse_forward");
}

extern "C" kiln_err kiln_cuda_mse_backward(float *dy, const float *y, const float *targets,
                                           float scale, size_t n) {
    if (!n) return KILN_OK;
    const float c = 2.0f * scale / (float)n;
    mse_bwd<<<kiln_blocks(n, 256), 256>>>(dy, y, targets, c, n);
    CU_LAUNCHED("mse_backward", "mse_bwd");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_stats_rms(float *out, const float *x, size_t n) {
    sq f = {x};
    return kiln_total(out, f, n, (double)n, TOTAL_FLOAT_SQRT, "stats_rms");
}

extern "C" kiln_err kiln_cuda_stats_entropy(float *out, const float *p, size_t rows, size_t cols) {
    neg_plogp f = {p};
    return kiln_total(out, f, rows * cols, (double)rows, TOTAL_FLOAT, "stats_entropy");
}

extern "C" kiln_err kiln_cuda_stats_maxabs(float *out, const float *x, size_t n) {
    maxabs_kernel<<<1, 256>>>(out, x, n);
    CU_LAUNCHED("stats_maxabs", "maxabs_kernel");
    return KILN_OK;
}

// elementwise.cu - standardisation, GELU (the CPU's tanh through one expf) and the residual
// add: one thread per element, grid-stride, nothing to reduce.
#include "cuda_int.h"

#define GELU_C 0.7978845608028654f

__device__ __forceinline__ float fast_tanh(float x) {
    return 1.0f - 2.0f / (1.0f + expf(2.0f * x));
}

__global__ static void standardize_fwd(float *out, const float *x, const float *mean,
                                       const float *std, size_t n, int F) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int f = (int)(i % (size_t)F);
        out[i] = (x[i] - mean[f]) / std[f];
    }
}

__global__ static void standardize_bwd(float *dx, const float *dout, const float *std, size_t n,
                                       int F) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dx[i] += dout[i] / std[(int)(i % (size_t)F)];
}

__global__ static void gelu_fwd(float *out, const float *inp, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float u = inp[i];
        out[i] = 0.5f * u * (1.0f + fast_tanh(GELU_C * (u + 0.044715f * u * u * u)));
    }
}

__global__ static void gelu_bwd(float *dinp, const float *dout, const float *inp, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float u = inp[i];
        float t = fast_tanh(GELU_C * (u + 0.044715f * u * u * u));
        float dt = GELU_C * (1.0f + 3.0f * 0.044715f * u * u) * (1.0f - t * t);
        dinp[i] += dout[i] * (0.5f * (1.0f + t) + 0.5f * u * dt);
    }
}

__global__ static void add_fwd(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

__global__ static void accumulate(float *d, const float *dout, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        d[i] += dout[i];
}

extern "C" kiln_err kiln_cuda_standardize_forward(float *out, const float *x, const float *mean,
                                                  const float *std, int N, int F) {
    size_t n = (size_t)N * F;
    if (N <= 0 || F <= 0) return KILN_OK;
    standardize_fwd<<<kiln_blocks(n, 256), 256>>>(out, x, mean, std, n, F);
    CU_LAUNCHED("standardize_forward", "standardize_fwd");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_standardize_backward(float *dx, const float *dout, const float *std,
                                                   int N, int F) {
    size_t n = (size_t)N * F;
    if (N <= 0 || F <= 0) return KILN_OK;
    standardize_bwd<<<kiln_blocks(n, 256), 256>>>(dx, dout, std, n, F);
    CU_LAUNCHED("standardize_backward", "standardize_bwd");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_gelu_forward(float *out, const float *inp, size_t n) {
    if (!n) return KILN_OK;
    gelu_fwd<<<kiln_blocks(n, 256), 256>>>(out, inp, n);
    CU_LAUNCHED("gelu_forward", "gelu_fwd");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_gelu_backward(float *dinp, const float *dout, const float *inp,
                                            size_t n) {
    if (!n) return KILN_OK;
    gelu_bwd<<<kiln_blocks(n, 256), 256>>>(dinp, dout, inp, n);
    CU_LAUNCHED("gelu_backward", "gelu_bwd");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_residual_forward(float *out, const float *a, const float *b,
                                               size_t n) {
    if (!n) return KILN_OK;
    add_fwd<<<kiln_blocks(n, 256), 256>>>(out, a, b, n);
    CU_LAUNCHED("residual_forward", "add_fwd");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_residual_backward(float *da, float *db, const float *dout, size_t n) {
    if (!n) return KILN_OK;
    if (da) {
        accumulate<<<kiln_blocks(n, 256), 256>>>(da, dout, n);
        CU_LAUNCHED("residual_backward", "accumulate");
    }
    if (db) {
        accumulate<<<kiln_blocks(n, 256), 256>>>(db, dout, n);
        CU_LAUNCHED("residual_backward", "accumulate");
    }
    return KILN_OK;
}

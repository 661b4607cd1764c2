// linear.cu - dense layers through cuBLAS (column-major, so each row-major product is
// written transposed), the bias gradient by the chunked column sum.
#include <cuda_bf16.h>

#include "cuda_int.h"

__global__ static void fill_rows(float *out, const float *bias, size_t n, int OC) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = bias[(int)(i % (size_t)OC)];
}

namespace {
struct column_of {
    const float *a;
    int C;
    __device__ float operator()(int r, int c) const { return a[(size_t)r * C + c]; }
};
} // namespace

// out^T [OC,N] = W [OC,IC] (stored as col-major [IC,OC], transposed) x inp^T [IC,N].
extern "C" kiln_err kiln_cuda_linear_forward(float *out, const float *inp, const float *weight,
                                             const float *bias, int N, int IC, int OC) {
    const char *op = "linear_forward";
    if (N <= 0) return KILN_OK;
    cublasHandle_t h = kiln_cuda_blas(op);
    if (!h) return KILN_ERR_USAGE;
    float alpha = 1.0f, beta = 0.0f;
    if (bias) {
        size_t n = (size_t)N * OC;
        fill_rows<<<kiln_blocks(n, 256), 256>>>(out, bias, n, OC);
        CU_LAUNCHED(op, "fill_rows");
        beta = 1.0f;
    }
    CUBLAS_CALL(op, cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, &alpha, weight, IC, inp, IC,
                                &beta, out, OC));
    return KILN_OK;
}

// dinp^T [IC,N] += W^T [IC,OC] x dout^T [OC,N]; dweight^T [IC,OC] += inp^T [IC,N] x dout [N,OC].
extern "C" kiln_err kiln_cuda_linear_backward(float *dinp, float *dweight, float *dbias,
                                              const float *dout, const float *inp,
                                              const float *weight, int N, int IC, int OC) {
    const char *op = "linear_backward";
    if (N <= 0) return KILN_OK;
    cublasHandle_t h = kiln_cuda_blas(op);
    if (!h) return KILN_ERR_USAGE;
    float one = 1.0f;
    if (dinp)
        CUBLAS_CALL(op, cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, &one, weight, IC, dout,
                                    OC, &one, dinp, IC));
    CUBLAS_CALL(op, cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, &one, inp, IC, dout, OC,
                                &one, dweight, IC));
    if (dbias) {
        column_of f = {dout, OC};
        KILN_TRY(kiln_colsum(dbias, f, N, OC, op));
    }
    return KILN_OK;
}

// ---- bf16 operands, f32 accumulation ----

__global__ static void round_bf16(__nv_bfloat16 *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

static kiln_err to_bf16(__nv_bfloat16 *dst, const float *src, size_t n, const char *op) {
    if (!n) return KILN_OK;
    round_bf16<<<kiln_blocks(n, 256), 256>>>(dst, src, n);
    CU_LAUNCHED(op, "round_bf16");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_to_bf16(uint16_t *dst, const float *src, size_t n) {
    return to_bf16((__nv_bfloat16 *)dst, src, n, "to_bf16");
}

// Scratch: inp in bf16, 256-byte aligned, then dout in bf16 (backward).
static size_t bf16_bytes(size_t n) {
    return (n * sizeof(__nv_bfloat16) + 255) & ~(size_t)255;
}

static cublasStatus_t gemm_bf16(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                int n, int k, const void *A, int lda, const void *B, int ldb,
                                float beta, float *C, int ldc) {
    const float alpha = 1.0f;
    return cublasGemmEx(h, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta,
                        C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

extern "C" kiln_err kiln_cuda_linear_forward_bf16(float *out, const float *inp,
                                                  const uint16_t *weight, const float *bias, int N,
                                                  int IC, int OC) {
    const char *op = "linear_forward_bf16";
    if (N <= 0) return KILN_OK;
    cublasHandle_t h = kiln_cuda_blas(op);
    if (!h) return KILN_ERR_USAGE;
    char *ws = NULL;
    KILN_TRY(kiln_cuda_scratch(bf16_bytes((size_t)N * IC), (void **)&ws, op));
    __nv_bfloat16 *x = (__nv_bfloat16 *)ws;
    KILN_TRY(to_bf16(x, inp, (size_t)N * IC, op));
    float beta = 0.0f;
    if (bias) {
        size_t n = (size_t)N * OC;
        fill_rows<<<kiln_blocks(n, 256), 256>>>(out, bias, n, OC);
        CU_LAUNCHED(op, "fill_rows");
        beta = 1.0f;
    }
    CUBLAS_CALL(
        op, gemm_bf16(h, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, weight, IC, x, IC, beta, out, OC));
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_linear_backward_bf16(float *dinp, float *dweight, float *dbias,
                                                   const float *dout, const float *inp,
                                                   const uint16_t *weight, int N, int IC, int OC) {
    const char *op = "linear_backward_bf16";
    if (N <= 0) return KILN_OK;
    cublasHandle_t h = kiln_cuda_blas(op);
    if (!h) return KILN_ERR_USAGE;
    // The bias first: its column sum uses the start of the scratch too.
    if (dbias) {
        column_of f = {dout, OC};
        KILN_TRY(kiln_colsum(dbias, f, N, OC, op));
    }
    const size_t nx = bf16_bytes((size_t)N * IC);
    char *ws = NULL;
    KILN_TRY(kiln_cuda_scratch(nx + bf16_bytes((size_t)N * OC), (void **)&ws, op));
    __nv_bfloat16 *x = (__nv_bfloat16 *)ws, *dy = (__nv_bfloat16 *)(ws + nx);
    KILN_TRY(to_bf16(x, inp, (size_t)N * IC, op));
    KILN_TRY(to_bf16(dy, dout, (size_t)N * OC, op));
    if (dinp)
        CUBLAS_CALL(op, gemm_bf16(h, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, weight, IC, dy, OC, 1.0f,
                                  dinp, IC));
    CUBLAS_CALL(
        op, gemm_bf16(h, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, x, IC, dy, OC, 1.0f, dweight, IC));
    return KILN_OK;
}

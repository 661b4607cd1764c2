// linear.cu - dense layers through cuBLAS (column-major, so each row-major product is
// written transposed), the bias gradient by the chunked column sum.
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
    CUBLAS_CALL(op, cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, &alpha, weight, IC, inp,
                                IC, &beta, out, OC));
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

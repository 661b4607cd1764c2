// cuda_int.h - helpers shared by the CUDA ops (module-private): the thread's context, error
// mapping, launch sizes, warp reductions and the deterministic column and total sums.
#ifndef KILN_CUDA_INT_H
#define KILN_CUDA_INT_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "core.h"
#include "kernels.h"

// The calling thread's cuBLAS handle, or NULL (with the error set) without kiln_cuda_init.
cublasHandle_t kiln_cuda_blas(const char *op);
// Scratch of at least bytes from the thread's context (grown, after a sync, when too small).
kiln_err kiln_cuda_scratch(size_t bytes, void **out, const char *op);
// Groups one grouped GEMM call takes (more are split into calls of this many).
#define KILN_GROUP_MAX 64
// The context's device table of 3 x KILN_GROUP_MAX pointers for cuBLAS's grouped GEMM
// (written in stream order, so one table serves every call).
kiln_err kiln_cuda_ptr_table(void ***out, const char *op);

kiln_err kiln_cuda_fail(cudaError_t e, const char *op, const char *call);
kiln_err kiln_cublas_fail(cublasStatus_t s, const char *op, const char *call);

// Check a runtime call / the last launch / a cuBLAS call inside an op returning kiln_err.
#define CU_CALL(op, call)                                                                          \
    do {                                                                                           \
        cudaError_t cu_e_ = (call);                                                                \
        if (cu_e_ != cudaSuccess) return kiln_cuda_fail(cu_e_, (op), #call);                       \
    } while (0)
#define CU_LAUNCHED(op, kernel)                                                                    \
    do {                                                                                           \
        cudaError_t cu_e_ = cudaGetLastError();                                                    \
        if (cu_e_ != cudaSuccess) return kiln_cuda_fail(cu_e_, (op), kernel " launch");            \
    } while (0)
#define CUBLAS_CALL(op, call)                                                                      \
    do {                                                                                           \
        cublasStatus_t cb_s_ = (call);                                                             \
        if (cb_s_ != CUBLAS_STATUS_SUCCESS) return kiln_cublas_fail(cb_s_, (op), #call);           \
    } while (0)

#define KILN_WARP 32
#define KILN_FULL_MASK 0xffffffffu

// Blocks for a grid-stride loop over n items: enough to fill any GPU, never over the limit.
static inline unsigned kiln_blocks(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65536 ? (b ? b : 1) : 65536);
}

// Butterfly sums: every lane ends with the same bits (a + b == b + a at each level).
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(KILN_FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(KILN_FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(KILN_FULL_MASK, v, o));
    return v;
}

// ---- column sums: out[c] += sum over rows r of f(r, c), f a functor ----
// Rows are cut into chunks of KILN_COL_CHUNK; a block of 32 columns x 8 row lanes sums a chunk
// (lane y takes rows y, y+8, ... in order, then the 8 lanes in order), the chunk sums go to
// scratch, and a second kernel adds them per column in chunk order. The partition depends
// only on N, so the bits do not depend on the GPU.
#define KILN_COL_CHUNK 256
#define KILN_COL_LANES 8

template <class F> __global__ void colsum_chunks(float *part, F f, int N, int C, int nchunks) {
    __shared__ float sh[KILN_COL_LANES][KILN_WARP + 1];
    const int c = blockIdx.x * KILN_WARP + threadIdx.x;
    for (int ch = blockIdx.y; ch < nchunks; ch += gridDim.y) {
        const int r0 = ch * KILN_COL_CHUNK;
        const int r1 = min(N, r0 + KILN_COL_CHUNK);
        float s = 0.0f;
        if (c < C)
            for (int r = r0 + threadIdx.y; r < r1; r += KILN_COL_LANES)
                s += f(r, c);
        sh[threadIdx.y][threadIdx.x] = s;
        __syncthreads();
        if (threadIdx.y == 0 && c < C) {
            float t = sh[0][threadIdx.x];
            for (int y = 1; y < KILN_COL_LANES; y++)
                t += sh[y][threadIdx.x];
            part[(size_t)ch * C + c] = t;
        }
        __syncthreads();
    }
}

__global__ void colsum_finish(float *out, const float *part, int C, int nchunks);

template <class F> kiln_err kiln_colsum(float *out, F f, int N, int C, const char *op) {
    if (N <= 0 || C <= 0) return KILN_OK;
    const int nchunks = (N + KILN_COL_CHUNK - 1) / KILN_COL_CHUNK;
    float *part = NULL;
    KILN_TRY(kiln_cuda_scratch((size_t)nchunks * C * sizeof(float), (void **)&part, op));
    dim3 block(KILN_WARP, KILN_COL_LANES);
    dim3 grid((unsigned)((C + KILN_WARP - 1) / KILN_WARP), (unsigned)min(nchunks, 65535));
    colsum_chunks<<<grid, block>>>(part, f, N, C, nchunks);
    CU_LAUNCHED(op, "colsum_chunks");
    colsum_finish<<<(unsigned)((C + 255) / 256), 256>>>(out, part, C, nchunks);
    CU_LAUNCHED(op, "colsum_finish");
    return KILN_OK;
}

// ---- totals: a double sum (or a float max) over n items, f(i) per item ----
// At most KILN_TOT_PARTS parts of equal length (a function of n only), each summed by one
// block (thread j takes items j, j+256, ... in order, then a fixed tree), then the parts by
// one block's fixed tree.
#define KILN_TOT_PARTS 256
#define KILN_TOT_THREADS 256

__device__ __forceinline__ double block_sum_d(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = KILN_TOT_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

template <class F> __global__ void total_parts(double *part, F f, size_t n, size_t len) {
    __shared__ double sh[KILN_TOT_THREADS];
    const size_t i0 = (size_t)blockIdx.x * len, i1 = i0 + len < n ? i0 + len : n;
    double s = 0.0;
    for (size_t i = i0 + threadIdx.x; i < i1; i += KILN_TOT_THREADS)
        s += f(i);
    double r = block_sum_d(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = r;
}

// How a total ends: the double sum divided by div, written as double or float (sqrt first
// for an RMS).
enum total_mode { TOTAL_DOUBLE = 0, TOTAL_FLOAT = 1, TOTAL_FLOAT_SQRT = 2 };
__global__ void total_finish(void *out, const double *part, int nparts, double div, int mode);

template <class F>
kiln_err kiln_total(void *out, F f, size_t n, double div, int mode, const char *op) {
    size_t nparts = (n + 4095) / 4096;
    if (nparts > KILN_TOT_PARTS) nparts = KILN_TOT_PARTS;
    if (nparts == 0) nparts = 1;
    const size_t len = (n + nparts - 1) / nparts;
    double *part = NULL;
    KILN_TRY(kiln_cuda_scratch(nparts * sizeof(double), (void **)&part, op));
    total_parts<<<(unsigned)nparts, KILN_TOT_THREADS>>>(part, f, n, len ? len : 1);
    CU_LAUNCHED(op, "total_parts");
    total_finish<<<1, KILN_TOT_THREADS>>>(out, part, (int)nparts, div, mode);
    CU_LAUNCHED(op, "total_finish");
    return KILN_OK;
}

#endif

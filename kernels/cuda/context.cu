// context.cu - the thread's CUDA context (device, cuBLAS handle with a fixed workspace,
// scratch), device memory helpers, error mapping and the second passes of the
// deterministic sums.
#include <string.h>

#include "cuda_int.h"

#define KILN_CUBLAS_WORKSPACE (32u << 20)

namespace {
struct context {
    int refs;
    int device;
    cublasHandle_t blas;
    void *workspace;
    void *scratch;
    size_t scratch_bytes;
    void **ptrs; // [3 * KILN_GROUP_MAX], kiln_cuda_ptr_table
};
thread_local context ctx;
} // namespace

kiln_err kiln_cuda_fail(cudaError_t e, const char *op, const char *call) {
    (void)cudaGetLastError(); // clear a non-sticky error so that the next call starts clean
    return kiln_fail(KILN_ERR_DEVICE, "cuda: '%s': %s failed: %s (%s)", op, call,
                     cudaGetErrorString(e), cudaGetErrorName(e));
}

kiln_err kiln_cublas_fail(cublasStatus_t s, const char *op, const char *call) {
    return kiln_fail(KILN_ERR_DEVICE, "cuda: '%s': %s failed: %s", op, call,
                     cublasGetStatusString(s));
}

cublasHandle_t kiln_cuda_blas(const char *op) {
    if (!ctx.refs) {
        kiln_fail(KILN_ERR_USAGE, "cuda: '%s': no CUDA context on this thread (kiln_cuda_init)",
                  op);
        return NULL;
    }
    return ctx.blas;
}

kiln_err kiln_cuda_scratch(size_t bytes, void **out, const char *op) {
    *out = NULL;
    KILN_FAIL_IF(!ctx.refs, KILN_ERR_USAGE,
                 "cuda: '%s': no CUDA context on this thread (kiln_cuda_init)", op);
    if (bytes > ctx.scratch_bytes) {
        // Queued kernels may still read the old block.
        CU_CALL(op, cudaDeviceSynchronize());
        cudaFree(ctx.scratch);
        ctx.scratch = NULL;
        ctx.scratch_bytes = 0;
        size_t want = bytes < (1u << 20) ? (1u << 20) : bytes;
        CU_CALL(op, cudaMalloc(&ctx.scratch, want));
        ctx.scratch_bytes = want;
    }
    *out = ctx.scratch;
    return KILN_OK;
}

kiln_err kiln_cuda_ptr_table(void ***out, const char *op) {
    *out = NULL;
    KILN_FAIL_IF(!ctx.refs, KILN_ERR_USAGE,
                 "cuda: '%s': no CUDA context on this thread (kiln_cuda_init)", op);
    *out = ctx.ptrs;
    return KILN_OK;
}

static void context_close(void) {
    if (ctx.blas) cublasDestroy(ctx.blas);
    cudaFree(ctx.ptrs);
    cudaFree(ctx.workspace);
    cudaFree(ctx.scratch);
    memset(&ctx, 0, sizeof ctx);
}

extern "C" kiln_err kiln_cuda_init(int device) {
    const char *op = "init";
    if (ctx.refs) {
        KILN_FAIL_IF(device != ctx.device, KILN_ERR_USAGE,
                     "cuda: this thread's context is on device %d, not %d", ctx.device, device);
        ctx.refs++;
        return KILN_OK;
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kiln_fail(KILN_ERR_DEVICE, "cuda: no usable CUDA device: %s (%s)",
                         cudaGetErrorString(e), cudaGetErrorName(e));
    }
    KILN_FAIL_IF(n == 0, KILN_ERR_DEVICE, "cuda: no usable CUDA device: none is visible");
    KILN_FAIL_IF(device < 0 || device >= n, KILN_ERR_DEVICE,
                 "cuda: device %d does not exist (%d visible)", device, n);
    CU_CALL(op, cudaSetDevice(device));
    ctx.device = device;
    // cuBLAS is opened here, by the first context of the process (kernels/cuda/blas_dl.c).
    kiln_err rc = kiln_cuda_blas_load();
    if (rc) {
        context_close();
        return rc;
    }
    cublasStatus_t s = cublasCreate(&ctx.blas);
    if (s != CUBLAS_STATUS_SUCCESS) {
        ctx.blas = NULL;
        rc = kiln_cublas_fail(s, op, "cublasCreate");
        goto fail;
    }
    e = cudaMalloc(&ctx.workspace, KILN_CUBLAS_WORKSPACE);
    if (e != cudaSuccess) {
        ctx.workspace = NULL;
        rc = kiln_cuda_fail(e, op, "cudaMalloc(cublas workspace)");
        goto fail;
    }
    e = cudaMalloc((void **)&ctx.ptrs, 3 * KILN_GROUP_MAX * sizeof(void *));
    if (e != cudaSuccess) {
        ctx.ptrs = NULL;
        rc = kiln_cuda_fail(e, op, "cudaMalloc(grouped gemm pointers)");
        goto fail;
    }
    // The legacy default stream, a workspace of our own (cuBLAS then never allocates and
    // picks the same kernels every run), no atomics, no TF32 (default math for f32).
    if ((s = cublasSetStream(ctx.blas, 0)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasSetWorkspace(ctx.blas, ctx.workspace, KILN_CUBLAS_WORKSPACE)) !=
            CUBLAS_STATUS_SUCCESS ||
        (s = cublasSetAtomicsMode(ctx.blas, CUBLAS_ATOMICS_NOT_ALLOWED)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasSetMathMode(ctx.blas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasSetPointerMode(ctx.blas, CUBLAS_POINTER_MODE_HOST)) != CUBLAS_STATUS_SUCCESS) {
        rc = kiln_cublas_fail(s, op, "cublas setup");
        goto fail;
    }
    ctx.refs = 1;
    return KILN_OK;
fail:
    context_close();
    return rc;
}

extern "C" void kiln_cuda_release(void) {
    if (ctx.refs && --ctx.refs == 0) {
        cudaDeviceSynchronize();
        context_close();
    }
}

extern "C" kiln_err kiln_cuda_sync(void) {
    CU_CALL("sync", cudaDeviceSynchronize());
    CU_CALL("sync", cudaGetLastError());
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_malloc(void **ptr, size_t bytes) {
    *ptr = NULL;
    cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *ptr = NULL;
        (void)cudaGetLastError();
        return kiln_fail(e == cudaErrorMemoryAllocation ? KILN_ERR_NOMEM : KILN_ERR_DEVICE,
                         "cuda: cannot allocate %zu bytes of device memory: %s", bytes,
                         cudaGetErrorString(e));
    }
    return KILN_OK;
}

extern "C" void kiln_cuda_free(void *ptr) {
    if (ptr) cudaFree(ptr);
}

extern "C" kiln_err kiln_cuda_upload(void *dst, const void *src, size_t bytes) {
    if (bytes) CU_CALL("upload", cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_download(void *dst, const void *src, size_t bytes) {
    if (bytes) CU_CALL("download", cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) CU_CALL("copy", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_memset(void *dst, int byte, size_t bytes) {
    if (bytes) CU_CALL("memset", cudaMemsetAsync(dst, byte, bytes, 0));
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_reserve(size_t bytes) {
    void *p;
    return kiln_cuda_scratch(bytes, &p, "reserve");
}

extern "C" size_t kiln_cuda_scratch_bytes(size_t N, size_t C) {
    size_t col = (N + KILN_COL_CHUNK - 1) / KILN_COL_CHUNK * C * sizeof(float);
    size_t tot = KILN_TOT_PARTS * sizeof(double);
    size_t bf16 = 2 * ((N * C * 2 + 255) & ~(size_t)255); // the bf16 linear's two operands
    size_t most = col > tot ? col : tot;
    return most > bf16 ? most : bf16;
}

__global__ void colsum_finish(float *out, const float *part, int C, int nchunks) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int k = 0; k < nchunks; k++)
        s += part[(size_t)k * C + c];
    out[c] += s;
}

__global__ void total_finish(void *out, const double *part, int nparts, double div, int mode) {
    __shared__ double sh[KILN_TOT_THREADS];
    double s = 0.0;
    for (int i = threadIdx.x; i < nparts; i += KILN_TOT_THREADS)
        s += part[i];
    double r = block_sum_d(s, sh);
    if (threadIdx.x != 0) return;
    double v = div > 0 ? r / div : 0.0;
    if (mode == TOTAL_DOUBLE)
        *(double *)out = v;
    else if (mode == TOTAL_FLOAT)
        *(float *)out = (float)v;
    else
        *(float *)out = (float)sqrt(v);
}

/* blas_dl.c - the cuBLAS calls kiln makes, through libcublas opened on first use
 * (kiln_dl_load, core/dl.c) instead of linked: mapping cuBLAS costs a process 80-100 ms and
 * 200 MB, which every kiln command and every CPU service paid. Each function below has the
 * name and prototype cublas_v2.h declares (the _v2 ones through its macros), so the kernels
 * call cuBLAS as before; the compiler checks every prototype against the header. Built
 * with nvcc's toolkit only (the emulator, tests/gpu/emu, brings its own cuBLAS). */
#include <cublas_v2.h>

#include "core.h"
#include "kernels.h"

#define DL_STR_(x) #x
#define DL_STR(x) DL_STR_(x) /* the name after its macro expansion: cublasCreate_v2 */

/* name, parameters, arguments: every call returns a cublasStatus_t. */
#define BLAS_CALLS(X)                                                                              \
    X(cublasCreate, (cublasHandle_t * h), (h))                                                     \
    X(cublasDestroy, (cublasHandle_t h), (h))                                                      \
    X(cublasSetStream, (cublasHandle_t h, cudaStream_t s), (h, s))                                 \
    X(cublasSetWorkspace, (cublasHandle_t h, void *w, size_t n), (h, w, n))                        \
    X(cublasSetAtomicsMode, (cublasHandle_t h, cublasAtomicsMode_t m), (h, m))                     \
    X(cublasSetMathMode, (cublasHandle_t h, cublasMath_t m), (h, m))                               \
    X(cublasSetPointerMode, (cublasHandle_t h, cublasPointerMode_t m), (h, m))                     \
    X(cublasSgemm,                                                                                 \
      (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,          \
       const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,    \
       float *C, int ldc),                                                                         \
      (h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc))                                   \
    X(cublasGemmEx,                                                                                \
      (cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,          \
       const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt, \
       int ldb, const void *beta, void *C, cudaDataType ct, int ldc, cublasComputeType_t cp,       \
       cublasGemmAlgo_t algo),                                                                     \
      (h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, cp, algo))             \
    X(cublasGemmGroupedBatchedEx,                                                                  \
      (cublasHandle_t h, const cublasOperation_t ta[], const cublasOperation_t tb[],               \
       const int m[], const int n[], const int k[], const void *alpha, const void *const A[],      \
       cudaDataType_t at, const int lda[], const void *const B[], cudaDataType_t bt,               \
       const int ldb[], const void *beta, void *const C[], cudaDataType_t ct, const int ldc[],     \
       int count, const int size[], cublasComputeType_t cp),                                       \
      (h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, count, size, cp))

#define BLAS_INDEX(name, params, args) BLAS_##name,
enum { BLAS_CALLS(BLAS_INDEX) BLAS_GET_STATUS_STRING, BLAS_N };
#define BLAS_NAME(name, params, args) DL_STR(name),
static const char *const blas_names[BLAS_N] = {BLAS_CALLS(BLAS_NAME) "cublasGetStatusString"};
static void *blas_fns[BLAS_N];
static kiln_dl_lib blas_lib = {.soname = "libcublas.so." DL_STR(CUBLAS_VER_MAJOR),
                               .what = "cuBLAS",
                               .names = blas_names,
                               .n = BLAS_N,
                               .fns = blas_fns};

kiln_err kiln_cuda_blas_load(void) {
    return kiln_dl_load(&blas_lib);
}

/* A call before a successful load (the context loads first, so only a bug gets here) fails
 * like an uninitialised handle instead of jumping through NULL. */
#define BLAS_DEFINE(name, params, args)                                                            \
    cublasStatus_t name params {                                                                   \
        if (kiln_dl_load(&blas_lib)) return CUBLAS_STATUS_NOT_INITIALIZED;                         \
        return ((cublasStatus_t(*) params)blas_fns[BLAS_##name])args;                              \
    }
BLAS_CALLS(BLAS_DEFINE)

const char *cublasGetStatusString(cublasStatus_t s) {
    if (kiln_dl_load(&blas_lib)) return "cuBLAS not loaded";
    return ((const char *(*)(cublasStatus_t))blas_fns[BLAS_GET_STATUS_STRING])(s);
}

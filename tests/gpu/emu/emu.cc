// emu.cc - the CPU emulator's runtime: a fiber per CUDA thread (ucontext), run block after
// block; a fiber that reaches a warp or block barrier yields, and the barrier opens when
// every live fiber of its warp (or block) waits there. A barrier that can never open (a
// divergent __syncthreads) aborts with a message. cuBLAS calls go to OpenBLAS.
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#include <vector>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_runtime.h"

namespace emu {
fiber_state *cur;
dim3 block_idx, block_dim, grid_dim;

namespace {
enum { RUN, WAIT_WARP, WAIT_BLOCK, DONE };
struct fiber {
    ucontext_t ctx;
    fiber_state st;
    int state;
    char *stack;
};
const size_t STACK = 128 * 1024;
std::vector<fiber> fibers(1024);
struct stacks_owner {
    ~stacks_owner() {
        for (fiber &f : fibers)
            free(f.stack);
    }
} stacks; // destroyed before fibers: the stacks are cached across launches, freed at exit
ucontext_t sched;
const std::function<void()> *body;
int current;
uint64_t slots[32][32];
cudaError_t last_error = cudaSuccess;

void trampoline(int i) {
    (*body)();
    fibers[i].state = DONE;
}

void wait(int how) {
    fiber &f = fibers[current];
    f.state = how;
    swapcontext(&f.ctx, &sched);
}

void run_block(int n) {
    for (int i = 0; i < n; i++) {
        fiber &f = fibers[i];
        if (!f.stack) f.stack = (char *)malloc(STACK);
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack;
        f.ctx.uc_stack.ss_size = STACK;
        f.ctx.uc_link = &sched;
        makecontext(&f.ctx, (void (*)())trampoline, 1, i);
        f.state = RUN;
        f.st.linear = i;
        f.st.tid =
            dim3(i % block_dim.x, (i / block_dim.x) % block_dim.y, i / (block_dim.x * block_dim.y));
    }
    for (;;) {
        for (int i = 0; i < n; i++)
            if (fibers[i].state == RUN) {
                current = i;
                cur = &fibers[i].st;
                swapcontext(&sched, &fibers[i].ctx);
            }
        int alive = 0, at_block = 0;
        for (int i = 0; i < n; i++) {
            alive += fibers[i].state != DONE;
            at_block += fibers[i].state == WAIT_BLOCK;
        }
        if (!alive) return;
        bool released = false;
        if (at_block == alive) {
            for (int i = 0; i < n; i++)
                if (fibers[i].state == WAIT_BLOCK) fibers[i].state = RUN;
            released = true;
        } else {
            for (int w = 0; w * 32 < n; w++) {
                int live = 0, waiting = 0;
                for (int i = w * 32; i < n && i < w * 32 + 32; i++) {
                    live += fibers[i].state != DONE;
                    waiting += fibers[i].state == WAIT_WARP;
                }
                if (live && waiting == live) {
                    for (int i = w * 32; i < n && i < w * 32 + 32; i++)
                        fibers[i].state = RUN;
                    released = true;
                }
            }
        }
        if (!released) {
            fprintf(stderr, "emu: barrier deadlock in block (%u,%u,%u)\n", block_idx.x, block_idx.y,
                    block_idx.z);
            abort();
        }
    }
}
} // namespace

void warp_barrier() {
    wait(WAIT_WARP);
}
void block_barrier() {
    wait(WAIT_BLOCK);
}
uint64_t *warp_slots() {
    return slots[current / 32];
}
unsigned warp_live_mask() {
    unsigned m = 0;
    int w = current / 32;
    for (int l = 0; l < 32; l++) {
        size_t i = (size_t)w * 32 + l;
        if (i < fibers.size() && fibers[i].state != DONE &&
            (int)i < (int)(block_dim.x * block_dim.y * block_dim.z))
            m |= 1u << l;
    }
    return m;
}

} // namespace emu

// A stream: capturing or not; a graph: the recorded work, in order.
struct emu_graph {
    std::vector<std::function<void()>> steps;
};
struct emu_stream {
    emu_graph *capture; // non-NULL while capturing
};

namespace emu {
unsigned long graph_launches;
namespace {
int capturing; // streams capturing on this (the only) thread
void run_launch(dim3 grid, dim3 block, const std::function<void()> &b);
} // namespace

void launch(dim3 grid, dim3 block, const std::function<void()> &b) {
    // The legacy stream while a capture is on: CUDA refuses (cudaErrorStreamCaptureImplicit).
    if (capturing) {
        last_error = cudaErrorStreamCaptureImplicit;
        return;
    }
    run_launch(grid, block, b);
}

void launch(dim3 grid, dim3 block, size_t, cudaStream_t s, const std::function<void()> &b) {
    if (s && s->capture) {
        s->capture->steps.push_back([grid, block, b]() { run_launch(grid, block, b); });
        return;
    }
    run_launch(grid, block, b);
}

namespace {
void run_launch(dim3 grid, dim3 block, const std::function<void()> &b) {
    size_t n = (size_t)block.x * block.y * block.z;
    if (!n || n > 1024 || !grid.x || !grid.y || !grid.z || grid.y > 65535 || grid.z > 65535 ||
        grid.x > 2147483647u) {
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    body = &b;
    block_dim = block;
    grid_dim = grid;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                block_idx = dim3(x, y, z);
                run_block((int)n);
            }
}
} // namespace
} // namespace emu

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
    *s = new emu_stream{nullptr};
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (s) delete s->capture;
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    return s && s->capture ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
    return s && s->capture ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
    if (!s || s->capture) return cudaErrorInvalidValue;
    s->capture = new emu_graph();
    emu::capturing++;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    if (!s || !s->capture) return cudaErrorInvalidValue;
    *g = s->capture;
    s->capture = nullptr;
    emu::capturing--;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long) {
    *x = new emu_graph(*g);
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t) {
    emu::graph_launches++;
    for (auto &step : x->steps)
        step();
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
    delete x;
    return cudaSuccess;
}
struct emu_event {
    int unused;
};
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
    *e = new emu_event();
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    return e && !(s && s->capture) ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
    return e && !(s && s->capture) ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) {
    *p = malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *n) {
    const char *e = getenv("EMU_DEVICES");
    *n = e ? atoi(e) : 1;
    return *n ? cudaSuccess : cudaErrorNoDevice;
}
cudaError_t cudaSetDevice(int) {
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t bytes) {
    *p = aligned_alloc(256, (bytes + 255) & ~(size_t)255);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind) {
    memcpy(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k,
                            cudaStream_t s) {
    if (s && s->capture) {
        s->capture->steps.push_back([=]() { memcpy(dst, src, bytes); });
        return cudaSuccess;
    }
    if (!s && emu::capturing) return cudaErrorStreamCaptureImplicit;
    return cudaMemcpy(dst, src, bytes, k);
}
cudaError_t cudaMemsetAsync(void *dst, int byte, size_t bytes, cudaStream_t s) {
    if (s && s->capture) {
        s->capture->steps.push_back([=]() { memset(dst, byte, bytes); });
        return cudaSuccess;
    }
    if (!s && emu::capturing) return cudaErrorStreamCaptureImplicit;
    memset(dst, byte, bytes);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
    cudaError_t e = emu::last_error;
    emu::last_error = cudaSuccess;
    return e;
}
const char *cudaGetErrorString(cudaError_t e) {
    return e == cudaSuccess ? "no error" : "emulated error";
}
const char *cudaGetErrorName(cudaError_t e) {
    return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated";
}

// cuBLAS is part of the emulator, so there is nothing to open (a real build opens
// libcublas on first use: kernels/cuda/blas_dl.c, which the emulator does not compile).
extern "C" int kiln_cuda_blas_load(void) { // kiln_err, KILN_OK
    return 0;
}

struct emu_blas {
    int unused;
};
cublasStatus_t cublasCreate(cublasHandle_t *h) {
    *h = new emu_blas();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) {
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t, void *, size_t) {
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetAtomicsMode(cublasHandle_t, cublasAtomicsMode_t) {
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) {
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetPointerMode(cublasHandle_t, cublasPointerMode_t) {
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) {
    return s == CUBLAS_STATUS_SUCCESS ? "success" : "emulated cublas error";
}

static bool bad_dims(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, int lda,
                     int ldb, int ldc) {
    int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
    return m < 0 || n < 0 || k < 0 || lda < (arows > 1 ? arows : 1) ||
           ldb < (brows > 1 ? brows : 1) || ldc < (m > 1 ? m : 1);
}

cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B,
                           int ldb, const float *beta, float *C, int ldc) {
    if (bad_dims(ta, tb, m, n, k, lda, ldb, ldc)) return CUBLAS_STATUS_INVALID_VALUE;
    if (!m || !n) return CUBLAS_STATUS_SUCCESS;
    cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, *alpha, A, lda, B, ldb,
                *beta, C, ldc);
    return CUBLAS_STATUS_SUCCESS;
}

static std::vector<float> widen(const void *p, int ld, int rows, int cols) {
    std::vector<float> v((size_t)ld * cols);
    const uint16_t *b = (const uint16_t *)p;
    for (int c = 0; c < cols; c++)
        for (int r = 0; r < rows; r++) {
            uint32_t u = (uint32_t)b[(size_t)c * ld + r] << 16;
            memcpy(&v[(size_t)c * ld + r], &u, 4);
        }
    return v;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType at,
                            int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t) {
    if (at != bt || (at != CUDA_R_16BF && at != CUDA_R_32F) || ct != CUDA_R_32F ||
        compute != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (bad_dims(ta, tb, m, n, k, lda, ldb, ldc)) return CUBLAS_STATUS_INVALID_VALUE;
    if (!m || !n) return CUBLAS_STATUS_SUCCESS;
    if (at == CUDA_R_32F)
        return cublasSgemm(h, ta, tb, m, n, k, (const float *)alpha, (const float *)A, lda,
                           (const float *)B, ldb, (const float *)beta, (float *)C, ldc);
    std::vector<float> a = widen(A, lda, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m);
    std::vector<float> b = widen(B, ldb, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k);
    return cublasSgemm(h, ta, tb, m, n, k, (const float *)alpha, a.data(), lda, b.data(), ldb,
                       (const float *)beta, (float *)C, ldc);
}

// The grouped GEMM: each group's problems one after another through cublasGemmEx (the pointer
// tables are read from "device" memory, which is host memory here). EMU_NO_GROUPED=1 makes it
// refuse as a cuBLAS without the types would, so that kiln's fallback runs.
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t ta[],
                                          const cublasOperation_t tb[], const int m[],
                                          const int n[], const int k[], const void *alpha,
                                          const void *const A[], cudaDataType at, const int lda[],
                                          const void *const B[], cudaDataType bt, const int ldb[],
                                          const void *beta, void *const C[], cudaDataType ct,
                                          const int ldc[], int count, const int size[],
                                          cublasComputeType_t compute) {
    const char *no = getenv("EMU_NO_GROUPED");
    if (no && *no == '1') return CUBLAS_STATUS_NOT_SUPPORTED;
    if (count < 0) return CUBLAS_STATUS_INVALID_VALUE;
    for (int g = 0, p = 0; g < count; g++) {
        if (size[g] < 0) return CUBLAS_STATUS_INVALID_VALUE;
        for (int i = 0; i < size[g]; i++, p++) {
            cublasStatus_t s =
                cublasGemmEx(h, ta[g], tb[g], m[g], n[g], k[g], (const float *)alpha + g, A[p], at,
                             lda[g], B[p], bt, ldb[g], (const float *)beta + g, C[p], ct, ldc[g],
                             compute, CUBLAS_GEMM_DEFAULT);
            if (s != CUBLAS_STATUS_SUCCESS) return s;
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

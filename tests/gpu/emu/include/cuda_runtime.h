// cuda_runtime.h (emulator) - just enough of the CUDA runtime and device intrinsics to run
// kernels/cuda/*.cu on the CPU: every CUDA thread is a fiber; warp and block barriers
// (shuffles, ballots, __syncwarp, __syncthreads) wait for the other fibers of the warp or
// block, as on a GPU. For checking logic, not speed. See tests/gpu/emu/emu.sh.
#ifndef EMU_CUDA_RUNTIME_H
#define EMU_CUDA_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureImplicit = 906
} cudaError_t;
typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
} cudaMemcpyKind;
// Streams run their work at once, in order, as the legacy stream does; a stream that is
// capturing records it instead (kernels with their arguments copied, copies and fills),
// and a graph replays the record.
typedef struct emu_stream *cudaStream_t;
typedef struct emu_graph *cudaGraph_t;
typedef struct emu_graph *cudaGraphExec_t;
#define cudaStreamNonBlocking 0x01
typedef enum { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1 } cudaStreamCaptureMode;
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaMalloc(void **p, size_t bytes);
template <class T> cudaError_t cudaMalloc(T **p, size_t bytes) {
    return cudaMalloc((void **)p, bytes);
}
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemsetAsync(void *dst, int byte, size_t bytes, cudaStream_t s);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);

// ---- the fiber scheduler ----
namespace emu {
struct fiber_state {
    dim3 tid;
    int linear; // thread index within the block
};
extern fiber_state *cur;
extern dim3 block_idx, block_dim, grid_dim;
void launch(dim3 grid, dim3 block, const std::function<void()> &body);
void launch(dim3 grid, dim3 block, size_t shared, cudaStream_t s, const std::function<void()> &body);
// Graph launches since the start (a streaming tick should be exactly one).
extern unsigned long graph_launches;
void warp_barrier();
void block_barrier();
uint64_t *warp_slots(); // [32] exchange slots of the current warp
unsigned warp_live_mask();
} // namespace emu

#define threadIdx (emu::cur->tid)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

inline void __syncthreads() {
    emu::block_barrier();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    (void)mask;
    emu::warp_barrier();
}
template <class T> T __shfl_xor_sync(unsigned mask, T v, int o) {
    (void)mask;
    static_assert(sizeof(T) <= 8, "shuffle of a wide type");
    uint64_t *slots = emu::warp_slots();
    const int lane = emu::cur->linear & 31;
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    slots[lane] = bits;
    emu::warp_barrier();
    uint64_t got = slots[lane ^ o];
    emu::warp_barrier();
    T r;
    memcpy(&r, &got, sizeof r);
    return r;
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    (void)mask;
    uint64_t *slots = emu::warp_slots();
    const int lane = emu::cur->linear & 31;
    slots[lane] = pred ? 1 : 0;
    emu::warp_barrier();
    unsigned live = emu::warp_live_mask(), r = 0;
    for (int l = 0; l < 32; l++)
        if ((live >> l & 1) && slots[l]) r |= 1u << l;
    emu::warp_barrier();
    return r;
}
// IEEE round-to-nearest arithmetic: the host's own (built without FMA contraction).
inline float __fadd_rn(float a, float b) {
    return a + b;
}
inline float __fsub_rn(float a, float b) {
    return a - b;
}
inline float __fmul_rn(float a, float b) {
    return a * b;
}
inline float __fdiv_rn(float a, float b) {
    return a / b;
}
inline float __fsqrt_rn(float a) {
    return sqrtf(a);
}
inline int __popc(unsigned x) {
    return __builtin_popcount(x);
}
template <class A, class B> inline typename std::common_type<A, B>::type min(A a, B b) {
    return a < b ? a : b;
}
template <class A, class B> inline typename std::common_type<A, B>::type max(A a, B b) {
    return a < b ? b : a;
}

#endif

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
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

struct float4 {
    float x, y, z, w;
};

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

#include "cuda_runtime_api.h"

template <class T> cudaError_t cudaMalloc(T **p, size_t bytes) {
    return cudaMalloc((void **)p, bytes);
}

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

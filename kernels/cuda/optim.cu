// optim.cu - the optimizer update (AdamW or SGD) of train/optim.c, element for element, and
// the sum of squares behind the gradient norm. Every float operation of the update is an
// IEEE round-to-nearest intrinsic (no contraction into FMAs, no approximate division or
// square root), in the CPU loop's order, so the same parameters, moments and gradients give
// the CPU's bits; the sum of squares is a double total over a partition fixed by n.
#include "cuda_int.h"

namespace {
struct sq {
    const float *x;
    __device__ double operator()(size_t i) const { return (double)x[i] * (double)x[i]; }
};
} // namespace

__device__ __forceinline__ static void adamw_one(float *p, float *g, float *m, float *v, size_t i,
                                                 const kiln_optim_consts &o) {
    {
        const float gi = __fmul_rn(g[i], o.gscale);
        const float mm = __fadd_rn(__fmul_rn(o.b1, m[i]), __fmul_rn(o.omb1, gi));
        const float vv = __fadd_rn(__fmul_rn(o.b2, v[i]), __fmul_rn(__fmul_rn(o.omb2, gi), gi));
        m[i] = mm;
        v[i] = vv;
        const float old = p[i];
        float np = __fsub_rn(old, __fmul_rn(o.decay, old));
        const float den = __fadd_rn(__fmul_rn(__fsqrt_rn(vv), o.rsq_bc2), o.eps);
        np = __fsub_rn(np, __fdiv_rn(__fmul_rn(o.step, mm), den));
        p[i] = np;
        g[i] = __fsub_rn(np, old);
    }
}

__device__ __forceinline__ static void sgd_one(float *p, float *g, size_t i,
                                               const kiln_optim_consts &o) {
    const float gi = __fmul_rn(g[i], o.gscale);
    const float old = p[i];
    const float np = __fsub_rn(__fsub_rn(old, __fmul_rn(o.decay, old)), __fmul_rn(o.lr, gi));
    p[i] = np;
    g[i] = __fsub_rn(np, old);
}

__global__ static void adamw_update(float *p, float *g, float *m, float *v, size_t n,
                                    kiln_optim_consts o) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        adamw_one(p, g, m, v, i, o);
}

__global__ static void sgd_update(float *p, float *g, size_t n, kiln_optim_consts o) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        sgd_one(p, g, i, o);
}

// Elements a block of the multi-tensor update takes per chunk.
#define SEG_CHUNK 4096

// Chunk w of the plan: the segment holding it (the last whose chunk0 <= w), found by
// bisection; its elements are updated by the block's threads, strided.
__global__ static void multi_update(float *p, float *g, float *m, float *v,
                                    const kiln_cuda_seg *segs, int nsegs, size_t nchunks,
                                    kiln_optim_consts o) {
    for (size_t w = blockIdx.x; w < nchunks; w += gridDim.x) {
        int lo = 0, hi = nsegs - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (segs[mid].chunk0 <= w)
                lo = mid;
            else
                hi = mid - 1;
        }
        const kiln_cuda_seg s = segs[lo];
        kiln_optim_consts os = o;
        if (!s.decay) os.decay = 0.0f;
        const size_t i0 = s.off + (w - s.chunk0) * SEG_CHUNK;
        const size_t i1 = s.off + s.n < i0 + SEG_CHUNK ? s.off + s.n : i0 + SEG_CHUNK;
        for (size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
            if (o.adam)
                adamw_one(p, g, m, v, i, os);
            else
                sgd_one(p, g, i, os);
        }
    }
}

extern "C" size_t kiln_cuda_seg_plan(kiln_cuda_seg *segs, int nsegs) {
    size_t c = 0;
    for (int i = 0; i < nsegs; i++) {
        segs[i].chunk0 = c;
        c += (segs[i].n + SEG_CHUNK - 1) / SEG_CHUNK;
    }
    return c;
}

extern "C" kiln_err kiln_cuda_optim_update_multi(float *p, float *g, float *m, float *v,
                                                 const kiln_cuda_seg *segs, int nsegs,
                                                 size_t nchunks, const kiln_optim_consts *o) {
    if (!nchunks || nsegs <= 0) return KILN_OK;
    multi_update<<<kiln_blocks(nchunks * 256, 256), 256>>>(p, g, m, v, segs, nsegs, nchunks, *o);
    CU_LAUNCHED("optim_update_multi", "multi_update");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_optim_update(float *p, float *g, float *m, float *v, size_t n,
                                           const kiln_optim_consts *o) {
    if (!n) return KILN_OK;
    if (o->adam) {
        adamw_update<<<kiln_blocks(n, 256), 256>>>(p, g, m, v, n, *o);
        CU_LAUNCHED("optim_update", "adamw_update");
    } else {
        sgd_update<<<kiln_blocks(n, 256), 256>>>(p, g, n, *o);
        CU_LAUNCHED("optim_update", "sgd_update");
    }
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_sumsq(double *out, const float *x, size_t n) {
    sq f = {x};
    return kiln_total(out, f, n, 1.0, TOTAL_DOUBLE, "sumsq");
}

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

__global__ static void adamw_update(float *p, float *g, float *m, float *v, size_t n,
                                    kiln_cuda_optim o) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
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

__global__ static void sgd_update(float *p, float *g, size_t n, kiln_cuda_optim o) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float gi = __fmul_rn(g[i], o.gscale);
        const float old = p[i];
        const float np = __fsub_rn(__fsub_rn(old, __fmul_rn(o.decay, old)), __fmul_rn(o.lr, gi));
        p[i] = np;
        g[i] = __fsub_rn(np, old);
    }
}

extern "C" kiln_err kiln_cuda_optim_update(float *p, float *g, float *m, float *v, size_t n,
                                           const kiln_cuda_optim *o) {
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

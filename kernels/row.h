/* row.h - the small ops on one row that sit in other ops' innermost loops (the attention's
 * q . k and its weighted sum of values) or in the streaming tick (one token's RMSNorm), as
 * static inline functions: the trainer's attention (kernels/cpu/attention.c) and the
 * runtime's (runtime/runtime_int.h), and the runtime's RMSNorm kernel (kernels/cpu/norm.c)
 * and its tick (runtime/stream.c), use these, so each op has one home and every caller still
 * gets it inlined, where a call per head and key, or per row of a small model's tick, costs
 * more than the op (docs/runtime.md). C only (restrict). */

#ifndef KILN_ROW_H
#define KILN_ROW_H

#include <math.h>

/* a . b with eight partial sums, which the compiler turns into vector code without being
 * allowed to reorder float additions itself; the order is fixed, so the result is the same on
 * every run and in every caller. */
static inline float kiln_row_dot(const float *restrict a, const float *restrict b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[d + j] * b[d + j];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; d < n; d++)
        s += a[d] * b[d];
    return s;
}

/* y[n] += a * x[n]; restrict lets it vectorise. */
static inline void kiln_row_axpy(float *restrict y, float a, const float *restrict x, int n) {
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* out[n] = x / sqrt(mean(x*x) + eps) * g, the sum in double (kiln_rmsnorm_f64_forward for
 * one row); out may be x. */
static inline void kiln_row_rmsnorm_f64(float *out, const float *x, const float *g, int n,
                                        float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + (double)eps));
    for (int i = 0; i < n; i++)
        out[i] = x[i] * r * g[i];
}

#endif

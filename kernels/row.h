/* row.h - the small ops on one row that sit in other ops' innermost loops (the attention's
 * q . k and its weighted sum of values), as static inline functions: the trainer's attention
 * (kernels/cpu/attention.c) and the runtime's (runtime/runtime_int.h) both use these, so each
 * op has one home and every caller still gets it inlined into its loop, where a call per
 * head and key would cost more than the op (docs/runtime.md). C only (restrict). */
#ifndef KILN_ROW_H
#define KILN_ROW_H

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

#endif

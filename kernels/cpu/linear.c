/* linear.c - dense layers through kiln_gemm (gemm.c): the same bits on every CPU, for a row
 * alone or among any number of others. The bias sums are plain loops in row order. */
#include <string.h>

#include "kernels.h"

void kiln_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int N, int IC, int OC) {
    if (N <= 0) return;
    if (bias)
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof *out);
    /* B[k,o] = weight[o,k]: the weight read transposed, packed once per block. */
    kiln_gemm(N, OC, IC, inp, (size_t)IC, 1, weight, 1, (size_t)IC, out, (size_t)OC, bias != NULL);
}

void kiln_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int IC, int OC) {
    if (N <= 0) return;
    if (dinp) /* dinp[N,IC] += dout[N,OC] @ weight[OC,IC] */
        kiln_gemm(N, IC, OC, dout, (size_t)OC, 1, weight, (size_t)IC, 1, dinp, (size_t)IC, true);
    /* dweight[OC,IC] += dout^T @ inp: A[o,n] = dout[n,o] */
    kiln_gemm(OC, IC, N, dout, 1, (size_t)OC, inp, (size_t)IC, 1, dweight, (size_t)IC, true);
    if (dbias)
        for (int n = 0; n < N; n++) {
            const float *row = dout + (size_t)n * OC;
            for (int o = 0; o < OC; o++)
                dbias[o] += row[o];
        }
}

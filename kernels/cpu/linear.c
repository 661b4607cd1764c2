/* linear.c - dense layers through CBLAS (OpenBLAS); the bias sums are plain loops in a
 * fixed order so that the result does not depend on how the library splits work. */
#include <cblas.h>
#include <string.h>

#include "kernels.h"

void kiln_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int N, int IC, int OC) {
    if (N <= 0) return;
    float beta = 0.0f;
    if (bias) {
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof *out);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, weight, IC, beta,
                out, OC);
}

void kiln_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int IC, int OC) {
    if (N <= 0) return;
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, weight,
                    IC, 1.0f, dinp, IC);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f,
                dweight, IC);
    if (dbias)
        for (int n = 0; n < N; n++) {
            const float *row = dout + (size_t)n * OC;
            for (int o = 0; o < OC; o++)
                dbias[o] += row[o];
        }
}

/* norm.c - RMSNorm and the fixed input standardisation. */
#include <math.h>

#include "kernels.h"
#include "row.h" /* kiln_row_rmsnorm_f64 */

void kiln_standardize_forward(float *out, const float *x, const float *mean, const float *std,
                              int N, int F) {
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++) {
            size_t i = (size_t)n * F + f;
            out[i] = (x[i] - mean[f]) / std[f];
        }
}

void kiln_standardize_backward(float *dx, const float *dout, const float *std, int N, int F) {
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++) {
            size_t i = (size_t)n * F + f;
            dx[i] += dout[i] / std[f];
        }
}

void kiln_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, float eps,
                          int N, int D) {
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * D;
        float *y = out + (size_t)n * D;
        float ss = 0.0f;
        for (int d = 0; d < D; d++)
            ss += x[d] * x[d];
        float r = 1.0f / sqrtf(ss / (float)D + eps);
        for (int d = 0; d < D; d++)
            y[d] = x[d] * r * weight[d];
        rstd[n] = r;
    }
}

void kiln_rmsnorm_f64_forward(float *out, const float *inp, const float *weight, float eps, int N,
                              int D) {
    for (int n = 0; n < N; n++)
        kiln_row_rmsnorm_f64(out + (size_t)n * D, inp + (size_t)n * D, weight, D, eps);
}

/* y = x r g with r = (mean(x^2) + eps)^-1/2:
 * dx_i = r g_i dy_i - x_i r^3 / D * sum_j dy_j g_j x_j. */
void kiln_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int D) {
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * D, *dy = dout + (size_t)n * D;
        float *dx = dinp + (size_t)n * D;
        float r = rstd[n], dot = 0.0f;
        for (int d = 0; d < D; d++)
            dot += dy[d] * weight[d] * x[d];
        float c = dot * r * r * r / (float)D;
        for (int d = 0; d < D; d++) {
            dx[d] += r * weight[d] * dy[d] - x[d] * c;
            dweight[d] += dy[d] * x[d] * r;
        }
    }
}

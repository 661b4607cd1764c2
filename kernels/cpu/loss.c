/* loss.c - mean squared error, and the diagnostics the trainer logs. */
#include <math.h>

#include "kernels.h"

void kiln_mse_forward(double *loss, const float *y, const float *targets, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)y[i] - targets[i];
        s += d * d;
    }
    *loss = n ? s / (double)n : 0.0;
}

void kiln_mse_backward(float *dy, const float *y, const float *targets, float scale, size_t n) {
    const float c = 2.0f * scale / (float)n;
    for (size_t i = 0; i < n; i++)
        dy[i] += c * (y[i] - targets[i]);
}

void kiln_stats_rms(float *out, const float *x, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    *out = n ? (float)sqrt(s / (double)n) : 0.0f;
}

void kiln_stats_entropy(float *out, const float *p, size_t rows, size_t cols) {
    double s = 0.0;
    for (size_t i = 0; i < rows * cols; i++)
        if (p[i] > 0.0f) s -= (double)p[i] * log((double)p[i]);
    *out = rows ? (float)(s / (double)rows) : 0.0f;
}

void kiln_stats_maxabs(float *out, const float *x, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) > m) m = fabsf(x[i]);
    *out = m;
}

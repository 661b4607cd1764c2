/* elementwise.c - GELU (tanh form, for the trainer and the runtime) and the residual add. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */

/* e^x in plain float arithmetic, four at a time through GCC's vector extensions (a call to
 * glibc's expf per element kept GELU scalar: a fifth of a CPU training step). x = n ln2 + r
 * with |r| <= ln2/2 (n rounded by the 1.5 * 2^23 trick and read back from the float's low
 * bits, so no float-to-int conversion), e^r by its Taylor polynomial to r^7 (truncation below
 * 2e-8 relative; 9.5e-8 worst measured over [-87, 88] against exp in double), 2^n through the
 * exponent bits. x is clamped to [-87, 88], where 2^n stays a normal float (GELU's tanh has
 * saturated long before); a NaN stays a NaN. The scalar twin does the same operations in the
 * same order (no contraction in C11 mode), so an element's value does not depend on whether
 * it fell in a block of four or in the tail. */
typedef float v4f __attribute__((vector_size(16)));
typedef uint32_t v4u __attribute__((vector_size(16)));

#define SPLAT(x) {(x), (x), (x), (x)}
#define EXP_BIG 12582912.0f /* 1.5 * 2^23 */
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693145751953125f
#define EXP_LN2_LO 1.428606765330187e-06f

/* e^r's Taylor polynomial by Horner, for a float or a v4f r: one expression for both, so the
 * scalar and the vector code do the same operations in the same order. */
#define HORNER(p, r, c) ((p) * (r) + (c))
#define EXP_POLY(r)                                                                                \
    HORNER(HORNER(HORNER(HORNER(HORNER(HORNER(HORNER(1.0f / 5040.0f, r, 1.0f / 720.0f), r,        \
                                              1.0f / 120.0f),                                      \
                                       r, 1.0f / 24.0f),                                           \
                                r, 1.0f / 6.0f),                                                   \
                         r, 0.5f),                                                                 \
                  r, 1.0f),                                                                        \
           r, 1.0f)

static inline float exp1(float x) {
    const float big = EXP_BIG;
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float t = x * EXP_LOG2E + big, n = t - big;
    uint32_t tb, bigb; /* unsigned: a NaN's bits wrap instead of overflowing */
    memcpy(&tb, &t, sizeof tb);
    memcpy(&bigb, &big, sizeof bigb);
    const float r = (x - n * EXP_LN2_HI) - n * EXP_LN2_LO, p = EXP_POLY(r);
    const uint32_t sb = (tb - bigb + 127u) << 23;
    float s;
    memcpy(&s, &sb, sizeof s);
    return p * s;
}

static inline v4f exp4(v4f x) {
    const v4f lo = SPLAT(-87.0f), hi = SPLAT(88.0f), big = SPLAT(EXP_BIG);
    v4u m = (v4u)(x < lo); /* all ones where true; false for a NaN, which is kept */
    x = (v4f)(((v4u)x & ~m) | ((v4u)lo & m));
    m = (v4u)(x > hi);
    x = (v4f)(((v4u)x & ~m) | ((v4u)hi & m));
    const v4f t = x * EXP_LOG2E + big, n = t - big;
    const v4f r = (x - n * EXP_LN2_HI) - n * EXP_LN2_LO, p = EXP_POLY(r);
    const v4u sb = ((v4u)t - (v4u)big + 127u) << 23;
    return p * (v4f)sb;
}

/* GELU (docs/model.md's tanh form) as u * s with s = (1 + tanh z) / 2 = 1 / (1 + e^-2z), z =
 * sqrt(2/pi) (u + 0.044715 u^3): no 1 + tanh to cancel where u << 0, so the output keeps its
 * relative accuracy down to where it underflows. The derivative, s + u s (1 - s) 2 dz/du, takes
 * 1 - s as e^-2z s, which does not cancel where u >> 0. The runtime calls the same function
 * (runtime/forward.c, runtime/stream.c), so a trained network and its frozen twin apply the
 * same GELU. */
#define GELU_Z(u) (GELU_C * ((u) + 0.044715f * (u) * (u) * (u)))
#define GELU_DZ(u) (GELU_C * (1.0f + 3.0f * 0.044715f * (u) * (u)))

static inline v4f load4(const float *p) {
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void store4(float *p, v4f v) {
    memcpy(p, &v, sizeof v);
}

void kiln_gelu_forward(float *out, const float *inp, size_t n) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const v4f u = load4(inp + i), e = exp4(-2.0f * GELU_Z(u));
        store4(out + i, u * (1.0f / (1.0f + e)));
    }
    for (; i < n; i++) {
        const float u = inp[i], e = exp1(-2.0f * GELU_Z(u));
        out[i] = u * (1.0f / (1.0f + e));
    }
}

void kiln_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const v4f u = load4(inp + i), e = exp4(-2.0f * GELU_Z(u)), s = 1.0f / (1.0f + e);
        const v4f g = s + 2.0f * u * GELU_DZ(u) * (e * s) * s;
        store4(dinp + i, load4(dinp + i) + load4(dout + i) * g);
    }
    for (; i < n; i++) {
        const float u = inp[i], e = exp1(-2.0f * GELU_Z(u)), s = 1.0f / (1.0f + e);
        const float g = s + 2.0f * u * GELU_DZ(u) * (e * s) * s;
        dinp[i] += dout[i] * g;
    }
}

void kiln_residual_forward(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void kiln_residual_backward(float *da, float *db, const float *dout, size_t n) {
    if (da)
        for (size_t i = 0; i < n; i++)
            da[i] += dout[i];
    if (db)
        for (size_t i = 0; i < n; i++)
            db[i] += dout[i];
}

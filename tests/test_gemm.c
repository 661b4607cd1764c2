/* test_gemm.c - kiln_gemm (kernels/cpu/gemm.c): one fmaf chain per element in k order, the
 * same bits from every kernel the CPU has, for a row alone or among others, through every
 * layout the trainer and the runtime use. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "test.h"

/* Values of many magnitudes and both signs, so that any change of summation order shows. */
static void fill(float *x, size_t n, uint32_t seed) {
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float u = (float)(s >> 8) / 16777216.0f - 0.5f;
        int e = (int)((s >> 3) % 11) - 5;
        x[i] = ldexpf(u, e);
    }
}

typedef struct shape {
    int M, N, K;
} shape;

/* The layouts of kernels/cpu/linear.c and train/model.c: NT (out = inp W^T), NN (dinp += dout
 * W), TN (dweight += dout^T inp). */
enum { NT, NN, TN };

static void run(int layout, const shape *s, const float *a, const float *b, float *c,
                bool accumulate) {
    const size_t M = (size_t)s->M, N = (size_t)s->N, K = (size_t)s->K;
    switch (layout) {
    case NT: kiln_gemm(s->M, s->N, s->K, a, K, 1, b, 1, K, c, N, accumulate); break;
    case NN: kiln_gemm(s->M, s->N, s->K, a, K, 1, b, N, 1, c, N, accumulate); break;
    default: kiln_gemm(s->M, s->N, s->K, a, 1, M, b, N, 1, c, N, accumulate); break;
    }
}

/* A[i,k] and B[k,j] of a layout, to compute the chain by hand. */
static float at_a(int layout, const shape *s, const float *a, int i, int k) {
    return layout == TN ? a[(size_t)k * s->M + i] : a[(size_t)i * s->K + k];
}
static float at_b(int layout, const shape *s, const float *b, int k, int j) {
    return layout == NT ? b[(size_t)j * s->K + k] : b[(size_t)k * s->N + j];
}

static const shape shapes[] = {
    {1, 1, 1},     {5, 7, 3},    {6, 16, 8},     {7, 17, 257},  {64, 128, 128},
    {64, 512, 128}, {64, 128, 512}, {73, 129, 300}, {130, 33, 5}, {3, 300, 600},
};

KILN_TEST(gemm_known_chain) {
    /* 1e8 + 1 rounds back to 1e8 in float (its spacing there is 8): summed in k order the
     * chain is 1e8, 1e8, 0; any other grouping of the three products gives 1. */
    const float a[3] = {1e8f, 1.0f, -1e8f}, b[3] = {1.0f, 1.0f, 1.0f};
    const kiln_gemm_isa isas[] = {KILN_GEMM_SCALAR, KILN_GEMM_AVX2, KILN_GEMM_AVX512};
    for (size_t i = 0; i < sizeof isas / sizeof *isas; i++) {
        if (!kiln_gemm_force_isa(isas[i])) continue;
        float c = 5.0f;
        kiln_gemm(1, 1, 3, a, 3, 1, b, 1, 1, &c, 1, false);
        CHECK("the chain sums in k order from +0", c == 0.0f);
        c = 1.0f; /* accumulate: the chain starts at C: 1e8+1 -> 1e8, ... -> 0 */
        kiln_gemm(1, 1, 3, a, 3, 1, b, 1, 1, &c, 1, true);
        CHECK("an accumulating chain starts from C", c == 0.0f);
        /* Every product fused: 0.1f * 10 rounded once (fma) is not (0.1f*10 rounded) + 0. */
        const float x = 0.1f, y = 10.0f, z = -1.0f;
        float out = z;
        kiln_gemm(1, 1, 1, &x, 1, 1, &y, 1, 1, &out, 1, true);
        CHECK("each step is one fused multiply-add", out == fmaf(x, y, z));
    }
    kiln_gemm_force_isa(KILN_GEMM_NONE);
}

KILN_TEST(gemm_same_bits_every_kernel) {
    const kiln_gemm_isa isas[] = {KILN_GEMM_SCALAR, KILN_GEMM_AVX2, KILN_GEMM_AVX512};
    int kernels_run = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int layout = NT; layout <= TN; layout++)
            for (int acc = 0; acc < 2; acc++) {
                const shape *s = &shapes[si];
                const size_t na = (size_t)s->M * s->K, nb = (size_t)s->K * s->N,
                             nc = (size_t)s->M * s->N;
                float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b),
                      *c0 = malloc(nc * sizeof *c0), *ref = malloc(nc * sizeof *ref),
                      *got = malloc(nc * sizeof *got);
                if (!CHECK("allocates", a && b && c0 && ref && got)) goto next;
                fill(a, na, (uint32_t)(si * 7 + layout));
                fill(b, nb, (uint32_t)(si * 7 + layout + 100));
                fill(c0, nc, (uint32_t)(si * 7 + layout + 200));
                /* The contract, computed here by hand. */
                bool chain_ok = true, close_ok = true;
                for (int i = 0; i < s->M; i++)
                    for (int j = 0; j < s->N; j++) {
                        float c = acc ? c0[(size_t)i * s->N + j] : 0.0f;
                        double d = c;
                        for (int k = 0; k < s->K; k++) {
                            const float x = at_a(layout, s, a, i, k), y = at_b(layout, s, b, k, j);
                            c = fmaf(x, y, c);
                            d += (double)x * y;
                        }
                        ref[(size_t)i * s->N + j] = c;
                        close_ok &= fabs(c - d) <= 1e-5 * (1.0 + fabs(d)) + 1e-6 * s->K;
                    }
                CHECK("the chain is close to the float64 product", close_ok);
                for (size_t ki = 0; ki < sizeof isas / sizeof *isas; ki++) {
                    if (!kiln_gemm_force_isa(isas[ki])) continue;
                    memcpy(got, c0, nc * sizeof *got);
                    run(layout, s, a, b, got, acc);
                    kernels_run++;
                    chain_ok &= !memcmp(got, ref, nc * sizeof *got);
                    if (memcmp(got, ref, nc * sizeof *got))
                        fprintf(stderr, "    %s: M %d N %d K %d layout %d acc %d differs\n",
                                kiln_gemm_isa_name(isas[ki]), s->M, s->N, s->K, layout, acc);
                }
                CHECK("every kernel gives the chain's bits", chain_ok);
            next:
                free(a), free(b), free(c0), free(ref), free(got);
            }
    kiln_gemm_force_isa(KILN_GEMM_NONE);
    CHECK("at least the scalar and this CPU's kernels ran", kernels_run >= 2 * 60);
    fprintf(stderr, "    this CPU's kernel: %s\n", kiln_gemm_isa_name(kiln_gemm_isa_used()));
}

KILN_TEST(gemm_row_alone_equals_row_in_block) {
    /* A row's result does not depend on how many rows share the call (the runtime's batch
     * against one sequence; an expert's gathered rows against any count of them). */
    const int M = 100, N = 200, K = 300;
    float *a = malloc((size_t)M * K * sizeof *a), *b = malloc((size_t)K * N * sizeof *b),
          *all = calloc((size_t)M * N, sizeof *all), *one = calloc((size_t)N, sizeof *one);
    if (!CHECK("allocates", a && b && all && one)) goto out;
    fill(a, (size_t)M * K, 1), fill(b, (size_t)K * N, 2);
    kiln_gemm(M, N, K, a, (size_t)K, 1, b, 1, (size_t)K, all, (size_t)N, false);
    bool same = true;
    for (int i = 0; i < M; i += 7) {
        kiln_gemm(1, N, K, a + (size_t)i * K, (size_t)K, 1, b, 1, (size_t)K, one, (size_t)N, false);
        same &= !memcmp(one, all + (size_t)i * N, (size_t)N * sizeof *one);
    }
    CHECK("each row alone has the bits it had among 100", same);
out:
    free(a), free(b), free(all), free(one);
}

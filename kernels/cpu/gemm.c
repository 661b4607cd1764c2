/* gemm.c - kiln's own matrix product, with the same bits on every x86-64 CPU.
 *
 * Every element of C is one chain of fused multiply-adds in k order:
 *
 *     c = C[i,j] (accumulate) or +0;  for k = 0 .. K-1:  c = fmaf(A[i,k], B[k,j], c)
 *
 * That is the whole contract, and nothing an implementation chooses can change it: the
 * vector kernels run the chain of each output in a lane of its own (vectorised across j,
 * never across k), so a kernel 8 lanes wide (AVX2) and one 16 wide (AVX-512) compute the
 * same chain as the scalar reference (fmaf is exactly rounded, as the FMA instructions
 * are); K is cut into blocks of KC, and a chain crosses a block through C itself, a float
 * stored and loaded again, which is what a register holds between two FMAs anyway; rows
 * and columns are cut into tiles, and an element's chain never sees another element. So a
 * row's result does not depend on the rows beside it (a sequence alone equals the same
 * sequence in a batch), nor on the thread that computes it, nor on the kernel the CPU
 * supports, nor on anything an earlier call left behind. OpenBLAS, which kiln used before,
 * picks a kernel by CPU model at load time (OPENBLAS_CORETYPE) and by a product's size, and
 * each kernel sums k in its own order and in its own partial sums: the bits moved with the
 * host (issue 28).
 *
 * The layout is BLIS's: B is packed by blocks of KC x NC into panels NR columns wide, A by
 * blocks of MC x KC into panels MR rows tall, and a register-tile kernel of MR x NR runs
 * over them. The packing buffers live on the stack (about 200 KiB: no allocation, no
 * state between calls), sized for kiln's shapes: the trainer's pieces of 64 rows and the
 * widths of d_model and d_ff. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kernels.h"

#define MR 6
#define NR_MAX 32 /* the widest kernel's NR; panels are packed this wide or 16 */
#define KC 256
#define MC 72  /* 12 panels of MR */
#define NC 128 /* 4 panels of 32, 8 of 16 */

static int isa_forced = -1; /* tests only: kiln_gemm_force_isa */

/* The widest kernel this CPU runs (__builtin_cpu_supports reads a table libgcc fills
 * before main: no state of ours). */
static kiln_gemm_isa isa_of_cpu(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (__builtin_cpu_supports("avx512f")) return KILN_GEMM_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return KILN_GEMM_AVX2;
#endif
    return KILN_GEMM_SCALAR;
}

/* $KILN_GEMM=scalar|avx2|avx512 runs that kernel where the CPU has it (to show, as
 * tests/e2e/12-same-bits.sh does, that they agree); anything else, the widest, with a
 * warning (the bits are the same whichever runs: only the speed differs). */
static kiln_gemm_isa isa_of_env(void) {
    const kiln_gemm_isa cpu = isa_of_cpu();
    const char *e = getenv("KILN_GEMM");
    if (!e || !*e) return cpu;
    for (kiln_gemm_isa i = KILN_GEMM_SCALAR; i <= cpu; i++)
        if (!strcmp(e, kiln_gemm_isa_name(i))) return i;
    kiln_warn("KILN_GEMM=%s is not a GEMM kernel this CPU runs (it runs scalar%s%s): using %s", e,
              cpu >= KILN_GEMM_AVX2 ? ", avx2" : "", cpu >= KILN_GEMM_AVX512 ? ", avx512" : "",
              kiln_gemm_isa_name(cpu));
    return cpu;
}

kiln_gemm_isa kiln_gemm_isa_used(void) {
    if (isa_forced >= 0) return (kiln_gemm_isa)isa_forced;
    static kiln_gemm_isa chosen = KILN_GEMM_NONE;
    if (chosen == KILN_GEMM_NONE) chosen = isa_of_env(); /* the same value from any thread */
    return chosen;
}

const char *kiln_gemm_isa_name(kiln_gemm_isa isa) {
    switch (isa) {
    case KILN_GEMM_SCALAR: return "scalar";
    case KILN_GEMM_AVX2: return "avx2";
    case KILN_GEMM_AVX512: return "avx512";
    default: return "none";
    }
}

bool kiln_gemm_force_isa(kiln_gemm_isa isa) {
    if (isa == KILN_GEMM_NONE) {
        isa_forced = -1;
        return true;
    }
    if (isa != KILN_GEMM_SCALAR && isa > isa_of_cpu()) return false;
    isa_forced = (int)isa;
    return true;
}

/* ---- the reference: one fmaf chain per element ---- */

static void gemm_scalar(int M, int N, int K, const float *A, size_t rsa, size_t csa,
                        const float *B, size_t rsb, size_t csb, float *C, size_t ldc,
                        bool accumulate) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float c = accumulate ? C[(size_t)i * ldc + j] : 0.0f;
            for (int k = 0; k < K; k++)
                c = fmaf(A[(size_t)i * rsa + (size_t)k * csa], B[(size_t)k * rsb + (size_t)j * csb],
                         c);
            C[(size_t)i * ldc + j] = c;
        }
}

/* ---- packing ----
 * A block of mc x kc into panels of MR rows: panel p holds, for each k, its MR rows' values
 * (zero past the last row). A block of kc x nc of B into panels of nr columns: for each k,
 * the panel's nr values (zero past the last column). Each walks its source in the order
 * that reads it contiguously. */

static void pack_a(float *dst, const float *A, size_t rsa, size_t csa, int mc, int kc) {
    for (int p = 0; p < mc; p += MR) {
        const int rows = mc - p < MR ? mc - p : MR;
        float *d = dst + (size_t)p * kc;
        if (rows < MR) memset(d, 0, (size_t)kc * MR * sizeof *d);
        if (csa == 1)
            for (int r = 0; r < rows; r++) {
                const float *s = A + (size_t)(p + r) * rsa;
                for (int k = 0; k < kc; k++)
                    d[(size_t)k * MR + r] = s[k];
            }
        else
            for (int k = 0; k < kc; k++) {
                const float *s = A + (size_t)k * csa + (size_t)p * rsa;
                for (int r = 0; r < rows; r++)
                    d[(size_t)k * MR + r] = s[(size_t)r * rsa];
            }
    }
}

static void pack_b(float *dst, const float *B, size_t rsb, size_t csb, int kc, int nc, int nr) {
    for (int p = 0; p < nc; p += nr) {
        const int cols = nc - p < nr ? nc - p : nr;
        float *d = dst + (size_t)p * kc;
        if (cols < nr) memset(d, 0, (size_t)kc * nr * sizeof *d);
        if (csb == 1)
            for (int k = 0; k < kc; k++)
                memcpy(d + (size_t)k * nr, B + (size_t)k * rsb + p, (size_t)cols * sizeof *d);
        else
            for (int c = 0; c < cols; c++) {
                const float *s = B + (size_t)(p + c) * csb;
                for (int k = 0; k < kc; k++)
                    d[(size_t)k * nr + c] = s[(size_t)k * rsb];
            }
    }
}

/* A register-tile kernel: C[MR, nr] (row stride ldc) = (load ? C : 0) then, for k in
 * 0..kc-1, C += a[k] (MR values) x b[k] (nr values), one FMA per element and k. */
typedef void tile_fn(int kc, const float *a, const float *b, float *C, size_t ldc, bool load);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86_KERNELS 1

/* 6 x 16: twelve 8-lane accumulators, two loads of b and six broadcasts of a per k. */
__attribute__((target("avx2,fma"))) static void tile_avx2(int kc, const float *a, const float *b,
                                                          float *C, size_t ldc, bool load) {
    __m256 c[MR][2];
    for (int r = 0; r < MR; r++)
        for (int h = 0; h < 2; h++)
            c[r][h] = load ? _mm256_loadu_ps(C + r * ldc + 8 * h) : _mm256_setzero_ps();
    for (int k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        for (int r = 0; r < MR; r++) {
            const __m256 ar = _mm256_broadcast_ss(a + r);
            c[r][0] = _mm256_fmadd_ps(ar, b0, c[r][0]);
            c[r][1] = _mm256_fmadd_ps(ar, b1, c[r][1]);
        }
        a += MR;
        b += 16;
    }
    for (int r = 0; r < MR; r++)
        for (int h = 0; h < 2; h++)
            _mm256_storeu_ps(C + r * ldc + 8 * h, c[r][h]);
}

/* 6 x 32: the same with 16-lane accumulators. */
__attribute__((target("avx512f"))) static void tile_avx512(int kc, const float *a, const float *b,
                                                           float *C, size_t ldc, bool load) {
    __m512 c[MR][2];
    for (int r = 0; r < MR; r++)
        for (int h = 0; h < 2; h++)
            c[r][h] = load ? _mm512_loadu_ps(C + r * ldc + 16 * h) : _mm512_setzero_ps();
    for (int k = 0; k < kc; k++) {
        const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
        for (int r = 0; r < MR; r++) {
            const __m512 ar = _mm512_set1_ps(a[r]);
            c[r][0] = _mm512_fmadd_ps(ar, b0, c[r][0]);
            c[r][1] = _mm512_fmadd_ps(ar, b1, c[r][1]);
        }
        a += MR;
        b += 32;
    }
    for (int r = 0; r < MR; r++)
        for (int h = 0; h < 2; h++)
            _mm512_storeu_ps(C + r * ldc + 16 * h, c[r][h]);
}
#endif

/* The blocked product through a tile kernel nr columns wide. A tile that C does not fill
 * (the last rows or columns) runs on a copy and only its valid part is written back: the
 * padding's lanes compute chains of their own that touch no real element. */
static void gemm_tiled(tile_fn *tile, int nr, int M, int N, int K, const float *A, size_t rsa,
                       size_t csa, const float *B, size_t rsb, size_t csb, float *C, size_t ldc,
                       bool accumulate) {
    _Alignas(64) float pa[MC * KC];
    _Alignas(64) float pb[KC * NC];
    _Alignas(64) float edge[MR * NR_MAX];
    for (int j0 = 0; j0 < N; j0 += NC) {
        const int nc = N - j0 < NC ? N - j0 : NC;
        for (int k0 = 0; k0 < K; k0 += KC) {
            const int kc = K - k0 < KC ? K - k0 : KC;
            /* The chain goes on from what C holds after the blocks before this one. */
            const bool load = accumulate || k0 > 0;
            pack_b(pb, B + (size_t)k0 * rsb + (size_t)j0 * csb, rsb, csb, kc, nc, nr);
            for (int i0 = 0; i0 < M; i0 += MC) {
                const int mc = M - i0 < MC ? M - i0 : MC;
                pack_a(pa, A + (size_t)i0 * rsa + (size_t)k0 * csa, rsa, csa, mc, kc);
                for (int jr = 0; jr < nc; jr += nr) {
                    const int cols = nc - jr < nr ? nc - jr : nr;
                    for (int ir = 0; ir < mc; ir += MR) {
                        const int rows = mc - ir < MR ? mc - ir : MR;
                        float *c = C + (size_t)(i0 + ir) * ldc + j0 + jr;
                        const float *a = pa + (size_t)ir * kc, *b = pb + (size_t)jr * kc;
                        if (rows == MR && cols == nr) {
                            tile(kc, a, b, c, ldc, load);
                            continue;
                        }
                        memset(edge, 0, sizeof edge);
                        if (load)
                            for (int r = 0; r < rows; r++)
                                memcpy(edge + r * nr, c + (size_t)r * ldc,
                                       (size_t)cols * sizeof *c);
                        tile(kc, a, b, edge, (size_t)nr, true);
                        for (int r = 0; r < rows; r++)
                            memcpy(c + (size_t)r * ldc, edge + r * nr, (size_t)cols * sizeof *c);
                    }
                }
            }
        }
    }
}

void kiln_gemm(int M, int N, int K, const float *A, size_t rsa, size_t csa, const float *B,
               size_t rsb, size_t csb, float *C, size_t ldc, bool accumulate) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!accumulate)
            for (int i = 0; i < M; i++)
                memset(C + (size_t)i * ldc, 0, (size_t)N * sizeof *C);
        return;
    }
    switch (kiln_gemm_isa_used()) {
#ifdef HAVE_X86_KERNELS
    case KILN_GEMM_AVX512:
        gemm_tiled(tile_avx512, 32, M, N, K, A, rsa, csa, B, rsb, csb, C, ldc, accumulate);
        return;
    case KILN_GEMM_AVX2:
        gemm_tiled(tile_avx2, 16, M, N, K, A, rsa, csa, B, rsb, csb, C, ldc, accumulate);
        return;
#endif
    default: gemm_scalar(M, N, K, A, rsa, csa, B, rsb, csb, C, ldc, accumulate);
    }
}

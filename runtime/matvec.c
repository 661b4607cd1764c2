/* matvec.c - the per-tick inner loop: y = W x + b for one row, over f32 or bf16 weights
 * (bf16 is widened to f32 in registers; the arithmetic is f32 either way).
 *
 * Four rows share each load of x, and each row keeps its own accumulators, so the loop
 * is bound by reading W, which is the whole cost of a tick. On x86-64 with AVX2 and FMA
 * (checked once per process by the CPU's own report) the loop uses them; elsewhere a
 * portable version built on GCC/Clang vector types runs.
 *
 * kiln_rt_matvec_many runs several vectors against one matrix, a block of rows at a time,
 * so that a set of streams reads each weight once (stream.c); it takes the vectors two at a
 * time through kernels that do, per (row, vector), exactly the one-vector kernel's
 * operations, so each result is the same float kiln_rt_matvec gives. */
#include <string.h>

#include "runtime_int.h"

typedef void mv_fn(float *y, const void *W, const float *b, const float *x, int rows, int cols);
/* Two vectors against the same rows (kiln_rt_matvec_many): y0 = W x0 + b, y1 = W x1 + b. */
typedef void mv2_fn(float *y0, float *y1, const void *W, const float *b, const float *x0,
                    const float *x1, int rows, int cols);

/* ---- portable ---- */

/* 16-byte vectors: native on every 64-bit target, and no ABI questions. */
typedef float v4f __attribute__((vector_size(16)));
typedef uint16_t v4h __attribute__((vector_size(8)));
typedef uint32_t v4u __attribute__((vector_size(16)));

static inline v4f load_f32(const void *W, size_t i) {
    v4f v;
    memcpy(&v, (const float *)W + i, sizeof v);
    return v;
}

static inline v4f load_bf16(const void *W, size_t i) {
    v4h h;
    memcpy(&h, (const uint16_t *)W + i, sizeof h);
    v4u u = __builtin_convertvector(h, v4u) << 16;
    v4f f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float one_f32(const void *W, size_t i) {
    return ((const float *)W)[i];
}

static inline float one_bf16(const void *W, size_t i) {
    uint32_t u = (uint32_t)((const uint16_t *)W)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float hsum4(v4f v) {
    return (v[0] + v[2]) + (v[1] + v[3]);
}

/* What every kernel below does once its vector loop is done, shared by the portable and
 * AVX2 versions: the scalar tail of the columns (c .. cols-1), one multiply-add per
 * (column, row, vector) into the row's own sum in column order, then y = sum + bias. They
 * are macros, not functions, so that each expands inside its kernel as written there: the
 * same operations in the same order under the kernel's own target (so the same floats,
 * bitwise, as before they were shared). They use the kernel's names: W, b, cols, r, c, the
 * row offsets o0..o3 (o for one row), the sums s0..s3 and t0..t3 (s, t), x or x0/x1, y or
 * y0/y1. */
#define MV_STORE4(Y, S0, S1, S2, S3)                                                               \
    do {                                                                                           \
        Y[r] = S0 + (b ? b[r] : 0.0f);                                                             \
        Y[r + 1] = S1 + (b ? b[r + 1] : 0.0f);                                                     \
        Y[r + 2] = S2 + (b ? b[r + 2] : 0.0f);                                                     \
        Y[r + 3] = S3 + (b ? b[r + 3] : 0.0f);                                                     \
    } while (0)

/* Four rows, one vector. */
#define MV_TAIL4(ONE)                                                                              \
    do {                                                                                           \
        for (; c < cols; c++) {                                                                    \
            s0 += ONE(W, o0 + c) * x[c];                                                           \
            s1 += ONE(W, o1 + c) * x[c];                                                           \
            s2 += ONE(W, o2 + c) * x[c];                                                           \
            s3 += ONE(W, o3 + c) * x[c];                                                           \
        }                                                                                          \
        MV_STORE4(y, s0, s1, s2, s3);                                                              \
    } while (0)

/* One row, one vector. */
#define MV_TAIL1(ONE)                                                                              \
    do {                                                                                           \
        for (; c < cols; c++)                                                                      \
            s += ONE(W, o + c) * x[c];                                                             \
        y[r] = s + (b ? b[r] : 0.0f);                                                              \
    } while (0)

/* Four rows, two vectors (each W element read once for both). */
#define MV2_TAIL4(ONE)                                                                             \
    do {                                                                                           \
        for (; c < cols; c++) {                                                                    \
            s0 += ONE(W, o0 + c) * x0[c];                                                          \
            s1 += ONE(W, o1 + c) * x0[c];                                                          \
            s2 += ONE(W, o2 + c) * x0[c];                                                          \
            s3 += ONE(W, o3 + c) * x0[c];                                                          \
            t0 += ONE(W, o0 + c) * x1[c];                                                          \
            t1 += ONE(W, o1 + c) * x1[c];                                                          \
            t2 += ONE(W, o2 + c) * x1[c];                                                          \
            t3 += ONE(W, o3 + c) * x1[c];                                                          \
        }                                                                                          \
        MV_STORE4(y0, s0, s1, s2, s3);                                                             \
        MV_STORE4(y1, t0, t1, t2, t3);                                                             \
    } while (0)

/* One row, two vectors. */
#define MV2_TAIL1(ONE)                                                                             \
    do {                                                                                           \
        for (; c < cols; c++) {                                                                    \
            s += ONE(W, o + c) * x0[c];                                                            \
            t += ONE(W, o + c) * x1[c];                                                            \
        }                                                                                          \
        y0[r] = s + (b ? b[r] : 0.0f);                                                             \
        y1[r] = t + (b ? b[r] : 0.0f);                                                             \
    } while (0)

#define MV_PORTABLE(NAME, LOAD, ONE)                                                               \
    static void NAME(float *y, const void *W, const float *b, const float *x, int rows,            \
                     int cols) {                                                                   \
        int r = 0;                                                                                 \
        for (; r + 4 <= rows; r += 4) {                                                            \
            size_t o0 = (size_t)r * cols, o1 = o0 + cols, o2 = o1 + cols, o3 = o2 + cols;          \
            v4f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};                                            \
            int c = 0;                                                                             \
            for (; c + 4 <= cols; c += 4) {                                                        \
                v4f xv;                                                                            \
                memcpy(&xv, x + c, sizeof xv);                                                     \
                a0 += LOAD(W, o0 + c) * xv;                                                        \
                a1 += LOAD(W, o1 + c) * xv;                                                        \
                a2 += LOAD(W, o2 + c) * xv;                                                        \
                a3 += LOAD(W, o3 + c) * xv;                                                        \
            }                                                                                      \
            float s0 = hsum4(a0), s1 = hsum4(a1), s2 = hsum4(a2), s3 = hsum4(a3);                  \
            MV_TAIL4(ONE);                                                                         \
        }                                                                                          \
        for (; r < rows; r++) {                                                                    \
            size_t o = (size_t)r * cols;                                                           \
            v4f a = {0};                                                                           \
            int c = 0;                                                                             \
            for (; c + 4 <= cols; c += 4) {                                                        \
                v4f xv;                                                                            \
                memcpy(&xv, x + c, sizeof xv);                                                     \
                a += LOAD(W, o + c) * xv;                                                          \
            }                                                                                      \
            float s = hsum4(a);                                                                    \
            MV_TAIL1(ONE);                                                                         \
        }                                                                                          \
    }

MV_PORTABLE(mv_f32_portable, load_f32, one_f32)
MV_PORTABLE(mv_bf16_portable, load_bf16, one_bf16)

/* Two vectors at once. Every (row, vector) sum goes through exactly the operations of the
 * one-vector kernel above, in the same order (its own accumulator, the same horizontal
 * sum, tail and bias), so its result is the same float; what changes is that each load
 * of W serves both vectors and twice as many independent sums are in flight. */
#define MV2_PORTABLE(NAME, LOAD, ONE)                                                              \
    static void NAME(float *y0, float *y1, const void *W, const float *b, const float *x0,         \
                     const float *x1, int rows, int cols) {                                        \
        int r = 0;                                                                                 \
        for (; r + 4 <= rows; r += 4) {                                                            \
            size_t o0 = (size_t)r * cols, o1 = o0 + cols, o2 = o1 + cols, o3 = o2 + cols;          \
            v4f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, e0 = {0}, e1 = {0}, e2 = {0}, e3 = {0};    \
            int c = 0;                                                                             \
            for (; c + 4 <= cols; c += 4) {                                                        \
                v4f u, v, w;                                                                       \
                memcpy(&u, x0 + c, sizeof u);                                                      \
                memcpy(&v, x1 + c, sizeof v);                                                      \
                w = LOAD(W, o0 + c);                                                               \
                a0 += w * u;                                                                       \
                e0 += w * v;                                                                       \
                w = LOAD(W, o1 + c);                                                               \
                a1 += w * u;                                                                       \
                e1 += w * v;                                                                       \
                w = LOAD(W, o2 + c);                                                               \
                a2 += w * u;                                                                       \
                e2 += w * v;                                                                       \
                w = LOAD(W, o3 + c);                                                               \
                a3 += w * u;                                                                       \
                e3 += w * v;                                                                       \
            }                                                                                      \
            float s0 = hsum4(a0), s1 = hsum4(a1), s2 = hsum4(a2), s3 = hsum4(a3);                  \
            float t0 = hsum4(e0), t1 = hsum4(e1), t2 = hsum4(e2), t3 = hsum4(e3);                  \
            MV2_TAIL4(ONE);                                                                        \
        }                                                                                          \
        for (; r < rows; r++) {                                                                    \
            size_t o = (size_t)r * cols;                                                           \
            v4f a = {0}, e = {0};                                                                  \
            int c = 0;                                                                             \
            for (; c + 4 <= cols; c += 4) {                                                        \
                v4f u, v, w = LOAD(W, o + c);                                                      \
                memcpy(&u, x0 + c, sizeof u);                                                      \
                memcpy(&v, x1 + c, sizeof v);                                                      \
                a += w * u;                                                                        \
                e += w * v;                                                                        \
            }                                                                                      \
            float s = hsum4(a), t = hsum4(e);                                                      \
            MV2_TAIL1(ONE);                                                                        \
        }                                                                                          \
    }

MV2_PORTABLE(mv2_f32_portable, load_f32, one_f32)
MV2_PORTABLE(mv2_bf16_portable, load_bf16, one_bf16)

/* ---- x86-64: AVX2 + FMA ---- */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static inline __m256 avx_f32(const void *W, size_t i) {
    return _mm256_loadu_ps((const float *)W + i);
}
AVX2 static inline __m256 avx_bf16(const void *W, size_t i) {
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)W + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
AVX2 static inline float avx_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define MV_AVX2(NAME, LOAD, ONE)                                                                   \
    AVX2 static void NAME(float *y, const void *W, const float *b, const float *x, int rows,       \
                          int cols) {                                                              \
        int r = 0;                                                                                 \
        for (; r + 4 <= rows; r += 4) {                                                            \
            size_t o0 = (size_t)r * cols, o1 = o0 + cols, o2 = o1 + cols, o3 = o2 + cols;          \
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                            \
            int c = 0;                                                                             \
            for (; c + 8 <= cols; c += 8) {                                                        \
                __m256 xv = _mm256_loadu_ps(x + c);                                                \
                a0 = _mm256_fmadd_ps(LOAD(W, o0 + c), xv, a0);                                     \
                a1 = _mm256_fmadd_ps(LOAD(W, o1 + c), xv, a1);                                     \
                a2 = _mm256_fmadd_ps(LOAD(W, o2 + c), xv, a2);                                     \
                a3 = _mm256_fmadd_ps(LOAD(W, o3 + c), xv, a3);                                     \
            }                                                                                      \
            float s0 = avx_hsum(a0), s1 = avx_hsum(a1), s2 = avx_hsum(a2), s3 = avx_hsum(a3);      \
            MV_TAIL4(ONE);                                                                         \
        }                                                                                          \
        for (; r < rows; r++) {                                                                    \
            size_t o = (size_t)r * cols;                                                           \
            __m256 a = _mm256_setzero_ps();                                                        \
            int c = 0;                                                                             \
            for (; c + 8 <= cols; c += 8)                                                          \
                a = _mm256_fmadd_ps(LOAD(W, o + c), _mm256_loadu_ps(x + c), a);                    \
            float s = avx_hsum(a);                                                                 \
            MV_TAIL1(ONE);                                                                         \
        }                                                                                          \
    }

MV_AVX2(mv_f32_avx2, avx_f32, one_f32)
MV_AVX2(mv_bf16_avx2, avx_bf16, one_bf16)

/* Two vectors at once, as MV2_PORTABLE: the one-vector kernel's operations per (row,
 * vector), with 8 independent FMA chains instead of 4 and each W load used twice. */
#define MV2_AVX2(NAME, LOAD, ONE)                                                                  \
    AVX2 static void NAME(float *y0, float *y1, const void *W, const float *b, const float *x0,    \
                          const float *x1, int rows, int cols) {                                   \
        int r = 0;                                                                                 \
        for (; r + 4 <= rows; r += 4) {                                                            \
            size_t o0 = (size_t)r * cols, o1 = o0 + cols, o2 = o1 + cols, o3 = o2 + cols;          \
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                            \
            __m256 e0 = a0, e1 = a0, e2 = a0, e3 = a0;                                             \
            int c = 0;                                                                             \
            for (; c + 8 <= cols; c += 8) {                                                        \
                __m256 u = _mm256_loadu_ps(x0 + c), v = _mm256_loadu_ps(x1 + c), w;                \
                w = LOAD(W, o0 + c);                                                               \
                a0 = _mm256_fmadd_ps(w, u, a0);                                                    \
                e0 = _mm256_fmadd_ps(w, v, e0);                                                    \
                w = LOAD(W, o1 + c);                                                               \
                a1 = _mm256_fmadd_ps(w, u, a1);                                                    \
                e1 = _mm256_fmadd_ps(w, v, e1);                                                    \
                w = LOAD(W, o2 + c);                                                               \
                a2 = _mm256_fmadd_ps(w, u, a2);                                                    \
                e2 = _mm256_fmadd_ps(w, v, e2);                                                    \
                w = LOAD(W, o3 + c);                                                               \
                a3 = _mm256_fmadd_ps(w, u, a3);                                                    \
                e3 = _mm256_fmadd_ps(w, v, e3);                                                    \
            }                                                                                      \
            float s0 = avx_hsum(a0), s1 = avx_hsum(a1), s2 = avx_hsum(a2), s3 = avx_hsum(a3);      \
            float t0 = avx_hsum(e0), t1 = avx_hsum(e1), t2 = avx_hsum(e2), t3 = avx_hsum(e3);      \
            MV2_TAIL4(ONE);                                                                        \
        }                                                                                          \
        for (; r < rows; r++) {                                                                    \
            size_t o = (size_t)r * cols;                                                           \
            __m256 a = _mm256_setzero_ps(), e = a;                                                 \
            int c = 0;                                                                             \
            for (; c + 8 <= cols; c += 8) {                                                        \
                __m256 w = LOAD(W, o + c);                                                         \
                a = _mm256_fmadd_ps(w, _mm256_loadu_ps(x0 + c), a);                                \
                e = _mm256_fmadd_ps(w, _mm256_loadu_ps(x1 + c), e);                                \
            }                                                                                      \
            float s = avx_hsum(a), t = avx_hsum(e);                                                \
            MV2_TAIL1(ONE);                                                                        \
        }                                                                                          \
    }

MV2_AVX2(mv2_f32_avx2, avx_f32, one_f32)
MV2_AVX2(mv2_bf16_avx2, avx_bf16, one_bf16)
#endif

static bool use_avx2(void) {
#ifdef HAVE_AVX2_PATH
    /* __builtin_cpu_supports reads a table libgcc fills before main; no state of ours. */
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

/* The kernels for m on this machine: AVX2 where the CPU has it, unless a test asked for
 * the portable ones. */
typedef struct kernels {
    mv_fn *one;
    mv2_fn *two;
} kernels;

static kernels kernel(const kiln_model *m) {
#ifdef HAVE_AVX2_PATH
    if (!m->portable && use_avx2())
        return m->bf16 ? (kernels){mv_bf16_avx2, mv2_bf16_avx2}
                       : (kernels){mv_f32_avx2, mv2_f32_avx2};
#endif
    return m->bf16 ? (kernels){mv_bf16_portable, mv2_bf16_portable}
                   : (kernels){mv_f32_portable, mv2_f32_portable};
}

void kiln_rt_matvec(const kiln_model *m, float *y, const void *W, const float *b, const float *x,
                    int rows, int cols) {
    kernel(m).one(y, W, b, x, rows, cols);
}

/* Bytes of weights in a block of kiln_rt_matvec_many: with L1's 32-48 KiB, a block and the
 * vectors streaming past it both stay there. (8 and 32 KiB measured the same to within the
 * noise, d256 with 64 streams.) */
#define MANY_BLOCK_BYTES (16 * 1024)

size_t kiln_rt_matvec_many(const kiln_model *m, size_t n, kiln_rt_vec_fn *vec, void *ctx,
                           const void *W, const float *b, int rows, int cols) {
    const kernels k = kernel(m);
    /* Blocks start at multiples of 4 rows, so that a block's 4-row groups are those of one
     * call over all rows. (A row's operations are the same in any group and in the tail
     * loop, so its sum would be the same anyway; the tests compare the bits.) One vector
     * needs no blocks: it is kiln_rt_matvec. */
    int block = rows;
    if (n > 1) {
        size_t fit = MANY_BLOCK_BYTES / ((size_t)cols * m->wsize) / 4 * 4;
        block = fit < 4 ? 4 : fit < (size_t)rows ? (int)fit : rows;
    }
    size_t read = 0;
    for (int r0 = 0; r0 < rows; r0 += block) {
        const int nb = rows - r0 < block ? rows - r0 : block;
        const void *Wb = kiln_rt_wat(m, W, (size_t)r0 * (size_t)cols);
        const float *bb = b ? b + r0 : NULL;
        float *wait_y = NULL; /* a vector waiting for a second to go with it */
        const float *wait_x = NULL;
        bool used = false;
        for (size_t i = 0; i < n; i++) {
            float *y;
            const float *x;
            if (!vec(ctx, i, &y, &x)) continue;
            used = true;
            if (!wait_y) {
                wait_y = y, wait_x = x;
                continue;
            }
            k.two(wait_y + r0, y + r0, Wb, bb, wait_x, x, nb, cols);
            wait_y = NULL;
        }
        if (wait_y) k.one(wait_y + r0, Wb, bb, wait_x, nb, cols);
        read += used ? (size_t)nb : 0;
    }
    return read;
}

void kiln_rt_matvec_portable(const kiln_model *m, float *y, const void *W, const float *b,
                             const float *x, int rows, int cols) {
    (m->bf16 ? mv_bf16_portable : mv_f32_portable)(y, W, b, x, rows, cols);
}

void kiln_rt_widen(const kiln_model *m, float *dst, const void *W, size_t n) {
    if (!m->bf16) {
        memcpy(dst, W, n * sizeof *dst);
        return;
    }
    for (size_t i = 0; i < n; i++)
        dst[i] = one_bf16(W, i);
}

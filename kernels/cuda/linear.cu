// linear.cu - dense layers through cuBLAS (column-major, so each row-major product is
// written transposed), the bias gradient by the chunked column sum.
#include <cuda_bf16.h>

#include "cuda_int.h"

__global__ static void fill_rows(float *out, const float *bias, size_t n, int OC) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = bias[(int)(i % (size_t)OC)];
}

namespace {
struct column_of {
    const float *a;
    int C;
    __device__ float operator()(int r, int c) const { return a[(size_t)r * C + c]; }
};
} // namespace

// out^T [OC,N] = W [OC,IC] (stored as col-major [IC,OC], transposed) x inp^T [IC,N].
extern "C" kiln_err kiln_cuda_linear_forward(float *out, const float *inp, const float *weight,
                                             const float *bias, int N, int IC, int OC) {
    const char *op = "linear_forward";
    if (N <= 0) return KILN_OK;
    cublasHandle_t h = kiln_cuda_blas(op);
    if (!h) return KILN_ERR_USAGE;
    float alpha = 1.0f, beta = 0.0f;
    if (bias) {
        size_t n = (size_t)N * OC;
        fill_rows<<<kiln_blocks(n, 256), 256>>>(out, bias, n, OC);
        CU_LAUNCHED(op, "fill_rows");
        beta = 1.0f;
    }
    CUBLAS_CALL(op, cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, &alpha, weight, IC, inp, IC,
                                &beta, out, OC));
    return KILN_OK;
}

// dinp^T [IC,N] += W^T [IC,OC] x dout^T [OC,N]; dweight^T [IC,OC] += inp^T [IC,N] x dout [N,OC].
extern "C" kiln_err kiln_cuda_linear_backward(float *dinp, float *dweight, float *dbias,
                                              const float *dout, const float *inp,
                                              const float *weight, int N, int IC, int OC) {
    const char *op = "linear_backward";
    if (N <= 0) return KILN_OK;
    cublasHandle_t h = kiln_cuda_blas(op);
    if (!h) return KILN_ERR_USAGE;
    float one = 1.0f;
    if (dinp)
        CUBLAS_CALL(op, cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, &one, weight, IC, dout,
                                    OC, &one, dinp, IC));
    CUBLAS_CALL(op, cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, &one, inp, IC, dout, OC,
                                &one, dweight, IC));
    if (dbias) {
        column_of f = {dout, OC};
        KILN_TRY(kiln_colsum(dbias, f, N, OC, op));
    }
    return KILN_OK;
}

// ---- bf16 operands, f32 accumulation ----

__global__ static void round_bf16(__nv_bfloat16 *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

static kiln_err to_bf16(__nv_bfloat16 *dst, const float *src, size_t n, const char *op) {
    if (!n) return KILN_OK;
    round_bf16<<<kiln_blocks(n, 256), 256>>>(dst, src, n);
    CU_LAUNCHED(op, "round_bf16");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_to_bf16(uint16_t *dst, const float *src, size_t n) {
    return to_bf16((__nv_bfloat16 *)dst, src, n, "to_bf16");
}

// Scratch: inp in bf16, 256-byte aligned, then dout in bf16 (backward).
static size_t bf16_bytes(size_t n) {
    return (n * sizeof(__nv_bfloat16) + 255) & ~(size_t)255;
}

static cublasStatus_t gemm_bf16(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                int n, int k, const void *A, int lda, const void *B, int ldb,
                                float beta, float *C, int ldc) {
    const float alpha = 1.0f;
    return cublasGemmEx(h, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta,
                        C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

extern "C" kiln_err kiln_cuda_linear_forward_bf16(float *out, const float *inp,
                                                  const uint16_t *weight, const float *bias, int N,
                                                  int IC, int OC) {
    const char *op = "linear_forward_bf16";
    if (N <= 0) return KILN_OK;
    cublasHandle_t h = kiln_cuda_blas(op);
    if (!h) return KILN_ERR_USAGE;
    char *ws = NULL;
    KILN_TRY(kiln_cuda_scratch(bf16_bytes((size_t)N * IC), (void **)&ws, op));
    __nv_bfloat16 *x = (__nv_bfloat16 *)ws;
    KILN_TRY(to_bf16(x, inp, (size_t)N * IC, op));
    float beta = 0.0f;
    if (bias) {
        size_t n = (size_t)N * OC;
        fill_rows<<<kiln_blocks(n, 256), 256>>>(out, bias, n, OC);
        CU_LAUNCHED(op, "fill_rows");
        beta = 1.0f;
    }
    CUBLAS_CALL(
        op, gemm_bf16(h, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, weight, IC, x, IC, beta, out, OC));
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_linear_backward_bf16(float *dinp, float *dweight, float *dbias,
                                                   const float *dout, const float *inp,
                                                   const uint16_t *weight, int N, int IC, int OC) {
    const char *op = "linear_backward_bf16";
    if (N <= 0) return KILN_OK;
    cublasHandle_t h = kiln_cuda_blas(op);
    if (!h) return KILN_ERR_USAGE;
    // The bias first: its column sum uses the start of the scratch too.
    if (dbias) {
        column_of f = {dout, OC};
        KILN_TRY(kiln_colsum(dbias, f, N, OC, op));
    }
    const size_t nx = bf16_bytes((size_t)N * IC);
    char *ws = NULL;
    KILN_TRY(kiln_cuda_scratch(nx + bf16_bytes((size_t)N * OC), (void **)&ws, op));
    __nv_bfloat16 *x = (__nv_bfloat16 *)ws, *dy = (__nv_bfloat16 *)(ws + nx);
    KILN_TRY(to_bf16(x, inp, (size_t)N * IC, op));
    KILN_TRY(to_bf16(dy, dout, (size_t)N * OC, op));
    if (dinp)
        CUBLAS_CALL(op, gemm_bf16(h, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, weight, IC, dy, OC, 1.0f,
                                  dinp, IC));
    CUBLAS_CALL(
        op, gemm_bf16(h, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, x, IC, dy, OC, 1.0f, dweight, IC));
    return KILN_OK;
}

// ---- grouped: G weight matrices over consecutive runs of rows (the experts of a layer) ----
// One cuBLAS grouped GEMM per direction (cublasGemmGroupedBatchedEx), one bias fill, one
// conversion to bf16 and one bias-gradient column sum for all groups, instead of one launch
// of each per group. The device pointer tables cuBLAS reads are written by a kernel on the
// same stream (from a launch argument), so a queued GEMM's table is never overwritten before
// it runs and the host never waits. Groups without rows are left out of the GEMM lists.
// cuBLAS without atomics and without split-K across launches gives the same bits for the
// same shapes; the bias gradient sums each group's rows in chunks of 256 from the group's
// first row, as kiln_colsum does for one group, so its bits are the per-group op's.

namespace {
struct group_rows {
    int n;                       // groups in this batch
    int off[KILN_GROUP_MAX + 1]; // row offsets relative to the batch's first row
    int chunk0[KILN_GROUP_MAX + 1];
};
struct ptr_args {
    const void *p[3 * KILN_GROUP_MAX];
};
} // namespace

__global__ static void store_ptrs(const void **dst, ptr_args a, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        dst[i] = a.p[i];
}

__device__ static int group_of(const group_rows &g, int r) {
    int lo = 0, hi = g.n - 1; // the last group whose offset is <= r
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (g.off[mid] <= r)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

__global__ static void fill_rows_grouped(float *out, const float *bias, group_rows g, int OC) {
    const size_t n = (size_t)g.off[g.n] * OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(i / (size_t)OC), c = (int)(i % (size_t)OC);
        out[i] = bias[(size_t)group_of(g, r) * OC + c];
    }
}

__global__ static void colsum_grouped_chunks(float *part, const float *a, group_rows g, int C) {
    __shared__ float sh[KILN_COL_LANES][KILN_WARP + 1];
    const int c = blockIdx.x * KILN_WARP + threadIdx.x;
    const int nchunks = g.chunk0[g.n];
    for (int ch = blockIdx.y; ch < nchunks; ch += gridDim.y) {
        int gi = 0;
        while (g.chunk0[gi + 1] <= ch)
            gi++;
        const int r0 = g.off[gi] + (ch - g.chunk0[gi]) * KILN_COL_CHUNK;
        const int r1 = min(g.off[gi + 1], r0 + KILN_COL_CHUNK);
        float s = 0.0f;
        if (c < C)
            for (int r = r0 + threadIdx.y; r < r1; r += KILN_COL_LANES)
                s += a[(size_t)r * C + c];
        sh[threadIdx.y][threadIdx.x] = s;
        __syncthreads();
        if (threadIdx.y == 0 && c < C) {
            float t = sh[0][threadIdx.x];
            for (int y = 1; y < KILN_COL_LANES; y++)
                t += sh[y][threadIdx.x];
            part[(size_t)ch * C + c] = t;
        }
        __syncthreads();
    }
}

__global__ static void colsum_grouped_finish(float *out, const float *part, group_rows g, int C) {
    const size_t n = (size_t)g.n * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int gi = (int)(i / (size_t)C), c = (int)(i % (size_t)C);
        const int k0 = g.chunk0[gi], k1 = g.chunk0[gi + 1];
        if (k0 == k1) continue;
        float s = 0.0f;
        for (int k = k0; k < k1; k++)
            s += part[(size_t)k * C + c];
        out[(size_t)gi * C + c] += s;
    }
}

// The groups g0 .. g0+n-1 of offs as a launch argument, offsets from offs[g0].
static group_rows batch_rows(const int32_t *offs, int g0, int n) {
    group_rows g;
    g.n = n;
    g.chunk0[0] = 0;
    for (int i = 0; i <= n; i++) {
        g.off[i] = offs[g0 + i] - offs[g0];
        if (i)
            g.chunk0[i] =
                g.chunk0[i - 1] + (g.off[i] - g.off[i - 1] + KILN_COL_CHUNK - 1) / KILN_COL_CHUNK;
    }
    return g;
}

// One grouped product C_i = A_i op B_i (+ beta C_i) for the listed problems: cuBLAS's grouped
// GEMM, one problem per group (their n differ). Types: A, B in bf16 or f32, C in f32, f32
// accumulation. If this cuBLAS refuses the combination, the problems run one GEMM each (the
// same arithmetic, more launches); kiln_cuda_grouped_fallbacks counts those calls.
static int grouped_fallbacks;
extern "C" int kiln_cuda_grouped_fallbacks(void) {
    return grouped_fallbacks;
}

struct gemm_list {
    int n;
    cublasOperation_t ta[KILN_GROUP_MAX], tb[KILN_GROUP_MAX];
    int m[KILN_GROUP_MAX], nn[KILN_GROUP_MAX], k[KILN_GROUP_MAX], lda[KILN_GROUP_MAX],
        ldb[KILN_GROUP_MAX], ldc[KILN_GROUP_MAX], size[KILN_GROUP_MAX];
    float alpha[KILN_GROUP_MAX], beta[KILN_GROUP_MAX];
    ptr_args ptr; // A [n], then B [n], then C [n]
};

static kiln_err run_grouped(cublasHandle_t h, gemm_list *L, bool bf16, const char *op) {
    if (!L->n) return KILN_OK;
    const void **table = NULL;
    KILN_TRY(kiln_cuda_ptr_table((void ***)&table, op));
    // cuBLAS wants A [n] B [n] C [n] contiguous: compact them in the argument first.
    ptr_args a;
    for (int i = 0; i < L->n; i++) {
        a.p[i] = L->ptr.p[i];
        a.p[L->n + i] = L->ptr.p[KILN_GROUP_MAX + i];
        a.p[2 * L->n + i] = L->ptr.p[2 * KILN_GROUP_MAX + i];
    }
    store_ptrs<<<1, 128>>>(table, a, 3 * L->n);
    CU_LAUNCHED(op, "store_ptrs");
    const cudaDataType ab = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasStatus_t s = cublasGemmGroupedBatchedEx(
        h, L->ta, L->tb, L->m, L->nn, L->k, L->alpha, table, ab, L->lda, table + L->n, ab, L->ldb,
        L->beta, (void *const *)(table + 2 * L->n), CUDA_R_32F, L->ldc, L->n, L->size,
        CUBLAS_COMPUTE_32F);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
        grouped_fallbacks++;
        for (int i = 0; i < L->n; i++)
            CUBLAS_CALL(op,
                        cublasGemmEx(h, L->ta[i], L->tb[i], L->m[i], L->nn[i], L->k[i],
                                     &L->alpha[i], a.p[i], ab, L->lda[i], a.p[L->n + i], ab,
                                     L->ldb[i], &L->beta[i], (void *)a.p[2 * L->n + i], CUDA_R_32F,
                                     L->ldc[i], CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return KILN_OK;
    }
    CUBLAS_CALL(op, s);
    return KILN_OK;
}

static void list_add(gemm_list *L, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                     const void *A, int lda, const void *B, int ldb, float beta, float *C,
                     int ldc) {
    const int i = L->n++;
    L->ta[i] = ta, L->tb[i] = tb, L->m[i] = m, L->nn[i] = n, L->k[i] = k;
    L->lda[i] = lda, L->ldb[i] = ldb, L->ldc[i] = ldc, L->size[i] = 1;
    L->alpha[i] = 1.0f, L->beta[i] = beta;
    L->ptr.p[i] = A, L->ptr.p[KILN_GROUP_MAX + i] = B, L->ptr.p[2 * KILN_GROUP_MAX + i] = C;
}

static kiln_err check_offsets(const int32_t *offs, int G, const char *op) {
    KILN_FAIL_IF(G < 1 || offs[0] != 0, KILN_ERR_USAGE, "cuda: '%s': %d groups, first offset %d",
                 op, G, G > 0 ? offs[0] : 0);
    for (int g = 0; g < G; g++)
        KILN_FAIL_IF(offs[g + 1] < offs[g], KILN_ERR_USAGE,
                     "cuda: '%s': group %d's offsets decrease (%d, %d)", op, g, offs[g],
                     offs[g + 1]);
    return KILN_OK;
}

// out [M,OC] rows offs[g]..offs[g+1] = inp rows x W_g^T + b_g; weight [G,OC,IC] (f32, or
// bf16 when w16), bias [G,OC] or NULL; offs host [G+1].
static kiln_err grouped_forward(float *out, const float *inp, const float *w32, const uint16_t *w16,
                                const float *bias, const int32_t *offs, int G, int IC, int OC,
                                const char *op) {
    KILN_TRY(check_offsets(offs, G, op));
    const int M = offs[G];
    if (M <= 0) return KILN_OK;
    cublasHandle_t h = kiln_cuda_blas(op);
    if (!h) return KILN_ERR_USAGE;
    const bool bf16 = w16 != NULL;
    const void *x = inp;
    if (bf16) {
        char *ws = NULL;
        KILN_TRY(kiln_cuda_scratch(bf16_bytes((size_t)M * IC), (void **)&ws, op));
        KILN_TRY(to_bf16((__nv_bfloat16 *)ws, inp, (size_t)M * IC, op));
        x = ws;
    }
    const size_t es = bf16 ? sizeof(__nv_bfloat16) : sizeof(float);
    for (int g0 = 0; g0 < G; g0 += KILN_GROUP_MAX) {
        const int n = G - g0 < KILN_GROUP_MAX ? G - g0 : KILN_GROUP_MAX;
        const group_rows gr = batch_rows(offs, g0, n);
        const size_t r0 = (size_t)offs[g0];
        if (bias) {
            size_t cnt = (size_t)gr.off[n] * OC;
            if (cnt) {
                fill_rows_grouped<<<kiln_blocks(cnt, 256), 256>>>(out + r0 * OC,
                                                                  bias + (size_t)g0 * OC, gr, OC);
                CU_LAUNCHED(op, "fill_rows_grouped");
            }
        }
        gemm_list L;
        L.n = 0;
        for (int i = 0; i < n; i++) {
            const int g = g0 + i, rows = offs[g + 1] - offs[g];
            if (!rows) continue;
            const char *wg = bf16 ? (const char *)(w16 + (size_t)g * OC * IC)
                                  : (const char *)(w32 + (size_t)g * OC * IC);
            list_add(&L, CUBLAS_OP_T, CUBLAS_OP_N, OC, rows, IC, wg, IC,
                     (const char *)x + (size_t)offs[g] * IC * es, IC, bias ? 1.0f : 0.0f,
                     out + (size_t)offs[g] * OC, OC);
        }
        KILN_TRY(run_grouped(h, &L, bf16, op));
    }
    return KILN_OK;
}

// The backward of grouped_forward: dinp (may be NULL) += dout W_g, dweight_g += dout_g^T
// inp_g, dbias_g += column sums of dout_g.
static kiln_err grouped_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *w32, const uint16_t *w16,
                                 const int32_t *offs, int G, int IC, int OC, const char *op) {
    KILN_TRY(check_offsets(offs, G, op));
    const int M = offs[G];
    if (M <= 0) return KILN_OK;
    cublasHandle_t h = kiln_cuda_blas(op);
    if (!h) return KILN_ERR_USAGE;
    const bool bf16 = w16 != NULL;
    // The bias first: its chunk sums use the start of the scratch too.
    if (dbias)
        for (int g0 = 0; g0 < G; g0 += KILN_GROUP_MAX) {
            const int n = G - g0 < KILN_GROUP_MAX ? G - g0 : KILN_GROUP_MAX;
            const group_rows gr = batch_rows(offs, g0, n);
            const int nchunks = gr.chunk0[n];
            if (!nchunks) continue;
            float *part = NULL;
            KILN_TRY(kiln_cuda_scratch((size_t)nchunks * OC * sizeof(float), (void **)&part, op));
            dim3 block(KILN_WARP, KILN_COL_LANES);
            dim3 grid((unsigned)((OC + KILN_WARP - 1) / KILN_WARP), (unsigned)min(nchunks, 65535));
            colsum_grouped_chunks<<<grid, block>>>(part, dout + (size_t)offs[g0] * OC, gr, OC);
            CU_LAUNCHED(op, "colsum_grouped_chunks");
            const size_t cnt = (size_t)n * OC;
            colsum_grouped_finish<<<kiln_blocks(cnt, 256), 256>>>(dbias + (size_t)g0 * OC, part, gr,
                                                                  OC);
            CU_LAUNCHED(op, "colsum_grouped_finish");
        }
    const void *x = inp, *dy = dout;
    if (bf16) {
        const size_t nx = bf16_bytes((size_t)M * IC);
        char *ws = NULL;
        KILN_TRY(kiln_cuda_scratch(nx + bf16_bytes((size_t)M * OC), (void **)&ws, op));
        KILN_TRY(to_bf16((__nv_bfloat16 *)ws, inp, (size_t)M * IC, op));
        KILN_TRY(to_bf16((__nv_bfloat16 *)(ws + nx), dout, (size_t)M * OC, op));
        x = ws, dy = ws + nx;
    }
    const size_t es = bf16 ? sizeof(__nv_bfloat16) : sizeof(float);
    for (int g0 = 0; g0 < G; g0 += KILN_GROUP_MAX) {
        const int n = G - g0 < KILN_GROUP_MAX ? G - g0 : KILN_GROUP_MAX;
        gemm_list Ld, Lw;
        Ld.n = Lw.n = 0;
        for (int i = 0; i < n; i++) {
            const int g = g0 + i, rows = offs[g + 1] - offs[g];
            if (!rows) continue;
            const char *wg = bf16 ? (const char *)(w16 + (size_t)g * OC * IC)
                                  : (const char *)(w32 + (size_t)g * OC * IC);
            const char *xg = (const char *)x + (size_t)offs[g] * IC * es,
                       *dyg = (const char *)dy + (size_t)offs[g] * OC * es;
            if (dinp)
                list_add(&Ld, CUBLAS_OP_N, CUBLAS_OP_N, IC, rows, OC, wg, IC, dyg, OC, 1.0f,
                         dinp + (size_t)offs[g] * IC, IC);
            list_add(&Lw, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, rows, xg, IC, dyg, OC, 1.0f,
                     dweight + (size_t)g * OC * IC, IC);
        }
        KILN_TRY(run_grouped(h, &Ld, bf16, op));
        KILN_TRY(run_grouped(h, &Lw, bf16, op));
    }
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_linear_grouped_forward(float *out, const float *inp,
                                                     const float *weight, const float *bias,
                                                     const int32_t *offs, int G, int IC, int OC) {
    return grouped_forward(out, inp, weight, NULL, bias, offs, G, IC, OC, "linear_grouped_forward");
}

extern "C" kiln_err kiln_cuda_linear_grouped_backward(float *dinp, float *dweight, float *dbias,
                                                      const float *dout, const float *inp,
                                                      const float *weight, const int32_t *offs,
                                                      int G, int IC, int OC) {
    return grouped_backward(dinp, dweight, dbias, dout, inp, weight, NULL, offs, G, IC, OC,
                            "linear_grouped_backward");
}

extern "C" kiln_err kiln_cuda_linear_grouped_forward_bf16(float *out, const float *inp,
                                                          const uint16_t *weight, const float *bias,
                                                          const int32_t *offs, int G, int IC,
                                                          int OC) {
    return grouped_forward(out, inp, NULL, weight, bias, offs, G, IC, OC,
                           "linear_grouped_forward_bf16");
}

extern "C" kiln_err kiln_cuda_linear_grouped_backward_bf16(float *dinp, float *dweight,
                                                           float *dbias, const float *dout,
                                                           const float *inp, const uint16_t *weight,
                                                           const int32_t *offs, int G, int IC,
                                                           int OC) {
    return grouped_backward(dinp, dweight, dbias, dout, inp, NULL, weight, offs, G, IC, OC,
                            "linear_grouped_backward_bf16");
}

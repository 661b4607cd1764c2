// attention.cu - causal windowed multi-head attention with ALiBi, tiled through shared memory.
//
// Decomposition. A block of 256 threads owns one (b, h) and a tile of TQ = 64 consecutive
// queries i0..i0+63. Those queries see the keys jlo = max(0, i0-W+1) .. i0+63 (at most
// TQ+W-1 rows), which the block walks in chunks of TK = 64 keys, staging each chunk's rows in
// shared memory, so that a key or value row is read from global memory once per query tile
// (about 1 + (W-1)/64 times per head in all) instead of once per query that sees it (W times)
// as in the old one-warp-per-query kernel. Features are staged in chunks of DC = 64 too, so
// shared memory is 2 x 64 x 68 floats (35 KB) whatever W and Dh are; the score and output
// tiles are 64 x 64 products, each thread keeping a 4 x 4 piece in registers (rows 4ty..,
// columns 4tx.., tx = tid % 16, ty = tid / 16) and reading one float4 of each operand per
// step of the sum from tiles laid out [summed index][row] (68 = 64 + 4: float4-aligned rows).
//
// Forward, per query tile:
//   1. per key chunk: s = q.k scale - m_h w for the 64 x 64 (query, key) pairs; the pairs in
//      the window are written to att as raw scores (att is the block's own [64, W] rows), and
//      each query's running max and sum of exp (online softmax) are updated: the 16 lanes that
//      share a query row combine their columns with a fixed butterfly, the chunks in order.
//   2. per feature chunk, per key chunk: P[q][k] = exp(s - max) / sum read back from att (the
//      first feature chunk writes the weight over the raw score; later ones read it), V's rows
//      staged, out += P V. att's rows beyond each query's window are zeroed.
// Backward, split by owner so that no two blocks add to the same gradient:
//   attn_bwd_query, per query tile: 1. per key chunk, da = dy . v into scratch and the row sums
//   sum_w a da; 2. per feature chunk, per key chunk: ds = a (da - sum) scale (written over da
//   on the first feature chunk), dq += ds K.
//   attn_bwd_key, per tile of 64 keys, over the queries that see them (j..j+W-1) in chunks of
//   32 queries: dk += ds^T Q and dv += a^T dy, ds and a read from the band of scratch and att.
// Every sum has a fixed order (chunks ascending, the summed index ascending within a chunk,
// fixed butterflies), so two runs give the same bits; there are no atomics.
//
// Expected traffic at the training benchmark (B=64 S=512 D=1024 H=16 W=128, per layer):
// 8192 blocks; each reads 64 query rows and up to 191 (167 on average) key and value rows of
// 256 B (64 features): 0.13 + 0.70 GB of L1/L2 reads in all, where the old kernel read about
// 30 GB (each query its ~112 key and value rows). The qkv tensor's 0.4 GB comes from DRAM
// about once (a tile's key rows are its neighbour's, still in L2); att (0.27 GB) is written
// raw, read back and rewritten by the same block within its lifetime (L2), so DRAM sees it
// written about once. The products issue 64 x 64 pairs per key chunk where the window holds
// about two thirds of them (the band's end triangles are masked): 22.5 GFLOP of f32 FMA
// forward for 15 inside the window, 45 backward; compute-bound at tens of TFLOP/s, so well
// under a millisecond per layer forward. Not yet measured on a GPU: gpu-check's op timings,
// rows "attention fwd" and "attention bwd".
#include "cuda_int.h"

#define AT_THREADS 256
#define AT_TQ 64 // queries per tile (forward, dq)
#define AT_TK 64 // keys per chunk (forward, dq) and per tile (dk, dv)
#define AT_DC 64 // features per chunk
#define AT_QC 32 // queries per chunk of the key-side backward
static_assert(AT_TQ == AT_TK, "the key-side backward runs on the query tiles' grid");
#define AT_LD 68 // row stride of the shared tiles (float4-aligned, 4 spare columns)
// 3 blocks of 8 warps per SM: at most 80 registers a thread (65536 / 768), 105 KB of shared
// memory of the 228.
#define AT_MIN_BLOCKS 3

// The 16 lanes of a half-warp share one query row (one ty): butterflies over xor 8..1.
__device__ __forceinline__ float row_sum16(float v) {
    for (int o = 8; o > 0; o >>= 1)
        v += __shfl_xor_sync(KILN_FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ float row_max16(float v) {
    for (int o = 8; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(KILN_FULL_MASK, v, o));
    return v;
}

// dst[a * AT_LD + b] = f(b, a) for 64 rows b and 64 columns a: a transposing stage of 64
// global rows. A warp takes 8 columns of 4 rows, so its global loads are four full 32-byte
// sectors and its shared stores hit 32 different banks (4a + b mod 32).
template <class F> __device__ __forceinline__ void stage_t(float *dst, F f) {
    // Two loads in flight per thread: more would cost registers, hence occupancy.
#pragma unroll 2
    for (int e = threadIdx.x; e < 64 * 64; e += AT_THREADS) {
        const int a = (e & 7) | ((e >> 2) & 56), b = ((e >> 3) & 3) | ((e >> 6) & 60);
        dst[a * AT_LD + b] = f(b, a);
    }
}
// dst[b * AT_LD + a] = f(b, a) for `rows` rows b and 64 columns a (consecutive lanes,
// consecutive columns).
template <class F> __device__ __forceinline__ void stage_n(float *dst, int rows, F f) {
    // Two loads in flight per thread: more would cost registers, hence occupancy.
#pragma unroll 2
    for (int e = threadIdx.x; e < rows * 64; e += AT_THREADS) {
        const int a = e & 63, b = e >> 6;
        dst[b * AT_LD + a] = f(b, a);
    }
}

// acc[r][c] += sum over t < n of A[t][4ty + r] * B[t][4tx + c], t ascending.
__device__ __forceinline__ void tile_mma(float acc[4][4], const float *A, const float *B, int n,
                                         int ty, int tx) {
#pragma unroll 4
    for (int t = 0; t < n; t++) {
        const float4 a = *reinterpret_cast<const float4 *>(A + t * AT_LD + 4 * ty);
        const float4 b = *reinterpret_cast<const float4 *>(B + t * AT_LD + 4 * tx);
        const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                acc[r][c] += av[r] * bv[c];
    }
}

__device__ __forceinline__ void tile_zero(float acc[4][4]) {
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            acc[r][c] = 0.0f;
}

// Where a block is: (b, h) and the first row of its tile.
struct at_where {
    int b, h, bh, i0;
};
__device__ __forceinline__ at_where at_block(int H, int ntiles) {
    at_where p;
    p.bh = (int)(blockIdx.x / (unsigned)ntiles);
    p.i0 = (int)(blockIdx.x % (unsigned)ntiles) * AT_TQ;
    p.h = p.bh % H;
    p.b = p.bh / H;
    return p;
}

// Block: (b, h, tile of 64 queries); consecutive blocks are consecutive tiles of a head, so
// the key rows two tiles share are read while the first tile's are still in L2.
__global__ static void __launch_bounds__(AT_THREADS, AT_MIN_BLOCKS)
    attn_fwd(float *out, float *att, const float *qkv, int S, int D, int H, int W, float scale,
             int ntiles) {
    __shared__ __align__(16) float sa[AT_DC * AT_LD]; // Q^T [d][q], then P^T [k][q]
    __shared__ __align__(16) float sb[AT_DC * AT_LD]; // K^T [d][k], then V [k][d]
    __shared__ float smax[AT_TQ], sinv[AT_TQ];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const at_where p = at_block(H, ntiles);
    const int Dh = D / H, i0 = p.i0, i1 = min(S, i0 + AT_TQ);
    const int jlo = max(0, i0 - W + 1); // keys jlo..i1-1
    const size_t C = 3 * (size_t)D;
    const float *Q = qkv + (size_t)p.b * S * C + (size_t)p.h * Dh; // row r at Q + r C
    const float *K = Q + D, *V = Q + 2 * (size_t)D;
    float *A = att + (size_t)p.bh * S * W; // row i at A + i W
    const float m = exp2f(-8.0f * (float)(p.h + 1) / (float)H);

    // The weights beyond each query's window (w > i) are 0; only rows i < W-1 have any.
    for (int i = i0 + (tid >> 5); i < i1 && i + 1 < W; i += AT_THREADS / 32)
        for (int w = i + 1 + (tid & 31); w < W; w += 32)
            A[(size_t)i * W + w] = 0.0f;

    // 1. scores, raw into att, and each row's running max rm and sum rl of exp(s - rm).
    float rm[4], rl[4];
    for (int r = 0; r < 4; r++) {
        rm[r] = -INFINITY;
        rl[r] = 0.0f;
    }
    for (int j0 = jlo; j0 < i1; j0 += AT_TK) {
        float acc[4][4];
        tile_zero(acc);
        for (int f0 = 0; f0 < Dh; f0 += AT_DC) {
            const int dn = min(AT_DC, Dh - f0);
            if (Dh > AT_DC || j0 == jlo) // one feature chunk: Q stays staged
                stage_t(sa, [&](int q, int d) {
                    return i0 + q < i1 && d < dn ? Q[(size_t)(i0 + q) * C + f0 + d] : 0.0f;
                });
            stage_t(sb, [&](int k, int d) {
                return j0 + k < i1 && d < dn ? K[(size_t)(j0 + k) * C + f0 + d] : 0.0f;
            });
            __syncthreads();
            tile_mma(acc, sa, sb, dn, ty, tx);
            __syncthreads();
        }
        for (int r = 0; r < 4; r++) {
            const int i = i0 + 4 * ty + r;
            float cmx = -INFINITY;
            for (int c = 0; c < 4; c++) {
                const int j = j0 + 4 * tx + c, w = i - j;
                float s = -INFINITY;
                if (i < i1 && w >= 0 && w < W) {
                    s = acc[r][c] * scale - m * (float)w;
                    A[(size_t)i * W + w] = s;
                }
                acc[r][c] = s;
                cmx = fmaxf(cmx, s);
            }
            const float nm = fmaxf(rm[r], row_max16(cmx));
            float e = 0.0f;
            if (nm != -INFINITY)
                for (int c = 0; c < 4; c++)
                    e += expf(acc[r][c] - nm);
            e = row_sum16(e);
            if (nm != -INFINITY) {
                rl[r] = rl[r] * expf(rm[r] - nm) + e;
                rm[r] = nm;
            }
        }
    }
    if (tx == 0)
        for (int r = 0; r < 4; r++) {
            smax[4 * ty + r] = rm[r];
            sinv[4 * ty + r] = 1.0f / rl[r];
        }
    __syncthreads(); // also orders the raw scores before they are read back

    // 2. out = P V per feature chunk; P from att (normalised on the first chunk).
    float *O = out + (size_t)p.b * S * D + (size_t)p.h * Dh;
    for (int f0 = 0; f0 < Dh; f0 += AT_DC) {
        const int dn = min(AT_DC, Dh - f0);
        float acc[4][4];
        tile_zero(acc);
        for (int j0 = jlo; j0 < i1; j0 += AT_TK) {
            const int kn = min(AT_TK, i1 - j0);
            stage_t(sa, [&](int q, int k) {
                const int i = i0 + q, w = i - j0 - k;
                if (i >= i1 || w < 0 || w >= W) return 0.0f;
                float *a = A + (size_t)i * W + w;
                if (f0) return *a;
                const float pw = expf(*a - smax[q]) * sinv[q];
                *a = pw;
                return pw;
            });
            stage_n(sb, AT_TK, [&](int k, int d) {
                return k < kn && d < dn ? V[(size_t)(j0 + k) * C + f0 + d] : 0.0f;
            });
            __syncthreads();
            tile_mma(acc, sa, sb, kn, ty, tx);
            __syncthreads();
        }
        for (int r = 0; r < 4; r++) {
            const int i = i0 + 4 * ty + r;
            if (i >= i1) break;
            for (int c = 0; c < 4; c++) {
                const int d = 4 * tx + c;
                if (d < dn) O[(size_t)i * D + f0 + d] = acc[r][c];
            }
        }
    }
}

// Block: (b, h, tile of 64 queries). da_w = dy . v_{i-w} into scratch, the row sums
// sum_w a_w da_w, then ds_w = a_w (da_w - sum) scale over da, dq += sum_w ds_w k_{i-w}.
__global__ static void __launch_bounds__(AT_THREADS, AT_MIN_BLOCKS)
    attn_bwd_query(float *dqkv, float *ds, const float *dout, const float *qkv, const float *att,
                   int S, int D, int H, int W, float scale, int ntiles) {
    __shared__ __align__(16) float sa[AT_DC * AT_LD]; // dY^T [d][q], then dS^T [k][q]
    __shared__ __align__(16) float sb[AT_DC * AT_LD]; // V^T [d][k], then K [k][d]
    __shared__ float ssum[AT_TQ];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const at_where p = at_block(H, ntiles);
    const int Dh = D / H, i0 = p.i0, i1 = min(S, i0 + AT_TQ);
    const int jlo = max(0, i0 - W + 1);
    const size_t C = 3 * (size_t)D;
    const float *Qr = qkv + (size_t)p.b * S * C + (size_t)p.h * Dh;
    const float *K = Qr + D, *V = Qr + 2 * (size_t)D;
    const float *dY = dout + (size_t)p.b * S * D + (size_t)p.h * Dh; // row i at dY + i D
    const float *A = att + (size_t)p.bh * S * W;
    float *G = ds + (size_t)p.bh * S * W;

    // 1. da into scratch; per-thread partial row sums of a da, the chunks in order.
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int j0 = jlo; j0 < i1; j0 += AT_TK) {
        float acc[4][4];
        tile_zero(acc);
        for (int f0 = 0; f0 < Dh; f0 += AT_DC) {
            const int dn = min(AT_DC, Dh - f0);
            if (Dh > AT_DC || j0 == jlo)
                stage_t(sa, [&](int q, int d) {
                    return i0 + q < i1 && d < dn ? dY[(size_t)(i0 + q) * D + f0 + d] : 0.0f;
                });
            stage_t(sb, [&](int k, int d) {
                return j0 + k < i1 && d < dn ? V[(size_t)(j0 + k) * C + f0 + d] : 0.0f;
            });
            __syncthreads();
            tile_mma(acc, sa, sb, dn, ty, tx);
            __syncthreads();
        }
        for (int r = 0; r < 4; r++) {
            const int i = i0 + 4 * ty + r;
            for (int c = 0; c < 4; c++) {
                const int w = i - (j0 + 4 * tx + c);
                if (i < i1 && w >= 0 && w < W) {
                    const size_t at = (size_t)i * W + w;
                    G[at] = acc[r][c];
                    part[r] += A[at] * acc[r][c];
                }
            }
        }
    }
    for (int r = 0; r < 4; r++) {
        const float s = row_sum16(part[r]);
        if (tx == 0) ssum[4 * ty + r] = s;
    }
    __syncthreads(); // also orders da before it is read back

    // 2. dq += dS K per feature chunk; dS from scratch (made from da on the first chunk).
    float *dQ = dqkv + (size_t)p.b * S * C + (size_t)p.h * Dh;
    for (int f0 = 0; f0 < Dh; f0 += AT_DC) {
        const int dn = min(AT_DC, Dh - f0);
        float acc[4][4];
        tile_zero(acc);
        for (int j0 = jlo; j0 < i1; j0 += AT_TK) {
            const int kn = min(AT_TK, i1 - j0);
            stage_t(sa, [&](int q, int k) {
                const int i = i0 + q, w = i - j0 - k;
                if (i >= i1 || w < 0 || w >= W) return 0.0f;
                const size_t at = (size_t)i * W + w;
                if (f0) return G[at];
                const float g = A[at] * (G[at] - ssum[q]) * scale;
                G[at] = g;
                return g;
            });
            stage_n(sb, AT_TK, [&](int k, int d) {
                return k < kn && d < dn ? K[(size_t)(j0 + k) * C + f0 + d] : 0.0f;
            });
            __syncthreads();
            tile_mma(acc, sa, sb, kn, ty, tx);
            __syncthreads();
        }
        for (int r = 0; r < 4; r++) {
            const int i = i0 + 4 * ty + r;
            if (i >= i1) break;
            for (int c = 0; c < 4; c++) {
                const int d = 4 * tx + c;
                if (d < dn) dQ[(size_t)i * C + f0 + d] += acc[r][c];
            }
        }
    }
}

// Block: (b, h, tile of 64 keys j0..). The queries that see them, j0..j0+63+W-1, in chunks
// of 32: dk_j += sum_i ds[i, i-j] q_i, dv_j += sum_i a[i, i-j] dy_i, i ascending.
__global__ static void __launch_bounds__(AT_THREADS, AT_MIN_BLOCKS)
    attn_bwd_key(float *dqkv, const float *ds, const float *dout, const float *qkv,
                 const float *att, int S, int D, int H, int W, int ntiles) {
    __shared__ __align__(16) float sg[AT_QC * AT_LD]; // dS [q][k]
    __shared__ __align__(16) float sq[AT_QC * AT_LD]; // Q [q][d]
    __shared__ __align__(16) float sa[AT_QC * AT_LD]; // A [q][k]
    __shared__ __align__(16) float sy[AT_QC * AT_LD]; // dY [q][d]
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const at_where p = at_block(H, ntiles);
    const int Dh = D / H, j0 = p.i0, j1 = min(S, j0 + AT_TK);
    const int iend = (int)min((long long)S, (long long)j1 + W - 1); // queries j0..iend-1
    const size_t C = 3 * (size_t)D;
    const float *Q = qkv + (size_t)p.b * S * C + (size_t)p.h * Dh;
    const float *dY = dout + (size_t)p.b * S * D + (size_t)p.h * Dh;
    const float *A = att + (size_t)p.bh * S * W;
    const float *G = ds + (size_t)p.bh * S * W;
    float *dK = dqkv + (size_t)p.b * S * C + D + (size_t)p.h * Dh, *dV = dK + D;

    for (int f0 = 0; f0 < Dh; f0 += AT_DC) {
        const int dn = min(AT_DC, Dh - f0);
        float acck[4][4], accv[4][4];
        tile_zero(acck);
        tile_zero(accv);
        for (int c0 = j0; c0 < iend; c0 += AT_QC) {
            const int qn = min(AT_QC, iend - c0);
            stage_n(sg, AT_QC, [&](int q, int k) {
                const int i = c0 + q, j = j0 + k, w = i - j;
                return q < qn && j < j1 && w >= 0 && w < W ? G[(size_t)i * W + w] : 0.0f;
            });
            stage_n(sa, AT_QC, [&](int q, int k) {
                const int i = c0 + q, j = j0 + k, w = i - j;
                return q < qn && j < j1 && w >= 0 && w < W ? A[(size_t)i * W + w] : 0.0f;
            });
            stage_n(sq, AT_QC, [&](int q, int d) {
                return q < qn && d < dn ? Q[(size_t)(c0 + q) * C + f0 + d] : 0.0f;
            });
            stage_n(sy, AT_QC, [&](int q, int d) {
                return q < qn && d < dn ? dY[(size_t)(c0 + q) * D + f0 + d] : 0.0f;
            });
            __syncthreads();
            tile_mma(acck, sg, sq, qn, ty, tx);
            tile_mma(accv, sa, sy, qn, ty, tx);
            __syncthreads();
        }
        for (int r = 0; r < 4; r++) {
            const int j = j0 + 4 * ty + r;
            if (j >= j1) break;
            for (int c = 0; c < 4; c++) {
                const int d = 4 * tx + c;
                if (d < dn) {
                    dK[(size_t)j * C + f0 + d] += acck[r][c];
                    dV[(size_t)j * C + f0 + d] += accv[r][c];
                }
            }
        }
    }
}

// Blocks for B*H heads of ceil(S/64) tiles, or 0 when the grid would be too large.
static unsigned tile_blocks(int B, int S, int H, int *ntiles) {
    *ntiles = (S + AT_TQ - 1) / AT_TQ;
    const size_t n = (size_t)B * H * (size_t)*ntiles;
    return n <= 0x7fffffffu ? (unsigned)n : 0;
}

extern "C" kiln_err kiln_cuda_attention_forward(float *out, float *att, const float *qkv, int B,
                                                int S, int D, int H, int W) {
    if (!B || !S || !H) return KILN_OK;
    int ntiles;
    const unsigned blocks = tile_blocks(B, S, H, &ntiles);
    if (!blocks)
        return kiln_cuda_fail(cudaErrorInvalidConfiguration, "attention_forward", "grid size");
    const float scale = 1.0f / sqrtf((float)(D / H));
    attn_fwd<<<blocks, AT_THREADS>>>(out, att, qkv, S, D, H, W, scale, ntiles);
    CU_LAUNCHED("attention_forward", "attn_fwd");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_attention_backward(float *dqkv, float *scratch, const float *dout,
                                                 const float *qkv, const float *att, int B, int S,
                                                 int D, int H, int W) {
    if (!B || !S || !H) return KILN_OK;
    int ntiles;
    const unsigned blocks = tile_blocks(B, S, H, &ntiles);
    if (!blocks)
        return kiln_cuda_fail(cudaErrorInvalidConfiguration, "attention_backward", "grid size");
    const float scale = 1.0f / sqrtf((float)(D / H));
    attn_bwd_query<<<blocks, AT_THREADS>>>(dqkv, scratch, dout, qkv, att, S, D, H, W, scale,
                                           ntiles);
    CU_LAUNCHED("attention_backward", "attn_bwd_query");
    attn_bwd_key<<<blocks, AT_THREADS>>>(dqkv, scratch, dout, qkv, att, S, D, H, W, ntiles);
    CU_LAUNCHED("attention_backward", "attn_bwd_key");
    return KILN_OK;
}

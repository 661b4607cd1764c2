/*
 * kernels.h - every numeric op, as forward/backward pairs. kernels/cpu/<op>.c is the
 * reference; kernels/cuda/<op>.cu implements the same signature on device pointers.
 * Arguments: outputs, then buffers saved for the backward pass, then inputs, then
 * sizes. Backward functions add into gradients.
 */
#ifndef KILN_KERNELS_H
#define KILN_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- CPU reference (kernels/cpu) ----
 * N is a count of rows (tokens, B*S), the other sizes are docs/model.md's letters. Every op is
 * deterministic: fixed reduction order, no threads. No op allocates; scratch is passed in.
 * Backward functions ADD into every gradient they are given (callers zero them first). */

/* Input standardisation: out = (x - mean) / std. */
void kiln_standardize_forward(float *out,        /* [N,F] */
                              const float *x,    /* [N,F] */
                              const float *mean, /* [F] */
                              const float *std,  /* [F] */
                              int N, int F);
void kiln_standardize_backward(float *dx,         /* [N,F] */
                               const float *dout, /* [N,F] */
                               const float *std,  /* [F] */
                               int N, int F);

/* kiln's matrix product (kernels/cpu/gemm.c): C[M,N] = (accumulate ? C : 0) + A[M,K] B[K,N],
 * with A[i,k] at A[i*rsa + k*csa], B[k,j] at B[k*rsb + j*csb], C[i,j] at C[i*ldc + j]. Each
 * element is one fmaf chain in k order from its start value, whatever the CPU's vector width,
 * the call's shape or the thread: the same bits on every x86-64 host (docs/runtime.md). */
void kiln_gemm(int M, int N, int K, const float *A, size_t rsa, size_t csa, const float *B,
               size_t rsb, size_t csb, float *C, size_t ldc, bool accumulate);
/* Which kernel kiln_gemm runs: the widest this CPU has (they give the same bits; the name
 * goes into checkpoints and cards as what the bits were computed with). */
typedef enum {
    KILN_GEMM_NONE = -1,
    KILN_GEMM_SCALAR = 0,
    KILN_GEMM_AVX2 = 1,
    KILN_GEMM_AVX512 = 2
} kiln_gemm_isa;
kiln_gemm_isa kiln_gemm_isa_used(void);
const char *kiln_gemm_isa_name(kiln_gemm_isa isa);
/* Tests: run isa's kernel from now on (KILN_GEMM_NONE: the CPU's own again); false where the
 * CPU lacks it. Not thread-safe: set it between calls. */
bool kiln_gemm_force_isa(kiln_gemm_isa isa);
/* What a CPU result's bits depend on, as checkpoints (kiln.numerics), cards (lineage.numerics)
 * and golden sets record it: the GEMM's contract (one fmaf chain per output in k order), not
 * the kernel that ran it, which cannot change a bit; so any x86-64 CPU with AVX2 and FMA
 * computes what another did. A result made before kiln-gemm/1 (no field) followed the host's
 * OpenBLAS kernel. The CUDA trainer's results are the GPU's own (cuBLAS, fixed algorithms). */
#define KILN_NUMERICS_CPU "cpu kiln-gemm/1"
#define KILN_NUMERICS_CUDA "cuda cublas"

/* linear: out = inp @ weight^T + bias (bias may be NULL), through kiln_gemm: each output is
 * bias (or 0) then one FMA per input column, in column order. */
void kiln_linear_forward(float *out,          /* [N,OC] */
                         const float *inp,    /* [N,IC] */
                         const float *weight, /* [OC,IC] */
                         const float *bias,   /* [OC] or NULL */
                         int N, int IC, int OC);
/* dinp (or NULL) += dout @ weight; dweight += dout^T @ inp; dbias (or NULL) += sum of rows. */
void kiln_linear_backward(float *dinp,         /* [N,IC] or NULL */
                          float *dweight,      /* [OC,IC] */
                          float *dbias,        /* [OC] or NULL */
                          const float *dout,   /* [N,OC] */
                          const float *inp,    /* [N,IC] */
                          const float *weight, /* [OC,IC] */
                          int N, int IC, int OC);

/* rmsnorm: out = inp / sqrt(mean(inp^2) + eps) * weight; rstd keeps 1/sqrt(...). */
void kiln_rmsnorm_forward(float *out,          /* [N,D] */
                          float *rstd,         /* [N] saved */
                          const float *inp,    /* [N,D] */
                          const float *weight, /* [D] */
                          float eps, int N, int D);
void kiln_rmsnorm_backward(float *dinp,         /* [N,D] */
                           float *dweight,      /* [D] */
                           const float *dout,   /* [N,D] */
                           const float *inp,    /* [N,D] */
                           const float *weight, /* [D] */
                           const float *rstd,   /* [N] */
                           int N, int D);

/* The runtime's rmsnorm (no backward): out = inp / sqrt(mean(inp^2) + eps) * weight with the
 * sum of squares in double, so that the batch and the stream (and D up to thousands) round
 * alike; out may be inp. The CPU twin of kiln_cuda_tick_rmsnorm; each row is row.h's
 * kiln_row_rmsnorm_f64, which the streaming tick inlines. (kiln_rmsnorm_forward sums in float,
 * as the trainer always has: the two are pinned bit for bit by their own tests.) */
void kiln_rmsnorm_f64_forward(float *out,          /* [N,D] */
                              const float *inp,    /* [N,D] */
                              const float *weight, /* [D] */
                              float eps, int N, int D);

/* gelu, tanh form (docs/model.md), elementwise. */
void kiln_gelu_forward(float *out, const float *inp, size_t n); /* [n], [n] */
void kiln_gelu_backward(float *dinp,                            /* [n] */
                        const float *dout,                      /* [n] */
                        const float *inp,                       /* [n] */
                        size_t n);

/* out = a + b; backward da += dout, db += dout (either may be NULL). */
void kiln_residual_forward(float *out, const float *a, const float *b, size_t n); /* all [n] */
void kiln_residual_backward(float *da, float *db, const float *dout, size_t n);   /* all [n] */

/* Causal windowed multi-head attention with ALiBi (docs/model.md). qkv rows hold q, k, v of one
 * token; head h owns columns h*Dh..(h+1)*Dh-1 of each. att[b,h,i,w] is the weight of key
 * j = i - w (w < min(W, i+1); the rest are 0). Slope of head h: 2^(-8*(h+1)/H). */
void kiln_attention_forward(float *out,       /* [B,S,D] heads concatenated */
                            float *att,       /* [B,H,S,W] saved */
                            const float *qkv, /* [B,S,3D] */
                            int B, int S, int D, int H, int W);
void kiln_attention_backward(float *dqkv,       /* [B,S,3D] */
                             float *scratch,    /* [B,H,S,W] */
                             const float *dout, /* [B,S,D] */
                             const float *qkv,  /* [B,S,3D] */
                             const float *att,  /* [B,H,S,W] */
                             int B, int S, int D, int H, int W);

/* Router: probs = softmax(logits), lse = logsumexp(logits); idx = the K largest probs,
 * equal probs taken in ascending expert index; gates = those probs renormalised to sum 1. */
void kiln_router_forward(float *probs,        /* [N,E] */
                         float *lse,          /* [N] */
                         int32_t *idx,        /* [N,K] */
                         float *gates,        /* [N,K] */
                         const float *logits, /* [N,E] */
                         int N, int E, int K);
/* Auxiliary terms of one mixture layer: load[i] = f_i (share of the N*K choices that picked
 * expert i), losses[0] = lb = E * sum_i f_i * P_i, losses[1] = z = mean(lse^2). */
void kiln_router_loss_forward(float *load,        /* [E] */
                              double *losses,     /* [2] */
                              const float *probs, /* [N,E] */
                              const float *lse,   /* [N] */
                              const int32_t *idx, /* [N,K] */
                              int N, int E, int K);
/* kiln_router_loss_forward in parts a caller may run on several threads: expert e's
 * load[e] = f_e and its term f_e * P_e of lb / E (kiln_router_load_expert), and the sum of
 * lse^2 (kiln_router_z_sum); losses[0] = E * (the terms added for e ascending, from 0.0),
 * losses[1] = the sum / N, bit for bit. */
double kiln_router_load_expert(float *load_e, const float *probs, const int32_t *idx, int N, int E,
                               int K, int e);
double kiln_router_z_sum(const float *lse, int N);
/* dlogits += d/dlogits of (gates, lb_coef * lb + z_coef * z) given dgates; f_i is a
 * constant (no gradient through the counts). */
void kiln_router_backward(float *dlogits,      /* [N,E] */
                          const float *dgates, /* [N,K] */
                          const float *probs,  /* [N,E] */
                          const float *lse,    /* [N] */
                          const int32_t *idx,  /* [N,K] */
                          const float *gates,  /* [N,K] */
                          const float *load,   /* [E] */
                          float lb_coef, float z_coef, int N, int E, int K);

/* Dispatch plan: the (token, slot) choices grouped by expert, token order within each
 * (t ascending, then k). With capacity > 0 an expert keeps at most capacity choices and the
 * rest get pos -1. offsets[e]..offsets[e+1]-1 are expert e's rows of the gathered buffers,
 * rows[m] is the token of gathered row m, pos[t,k] the gathered row of a choice.
 * *dropped = number of choices refused. */
void kiln_moe_dispatch(int32_t *offsets,   /* [E+1] */
                       int32_t *pos,       /* [N,K] */
                       int32_t *rows,      /* [N*K], offsets[E] used */
                       int *dropped,       /* [1] */
                       const int32_t *idx, /* [N,K] */
                       int capacity, int N, int E, int K);
/* xg[m] = inp[rows[m]]; backward dinp[rows[m]] += dxg[m], m ascending. */
void kiln_moe_gather_forward(float *xg,           /* [M,D] */
                             const float *inp,    /* [N,D] */
                             const int32_t *rows, /* [M] */
                             int M, int D);
void kiln_moe_gather_backward(float *dinp,         /* [N,D] */
                              const float *dxg,    /* [M,D] */
                              const int32_t *rows, /* [M] */
                              int M, int D);
/* out[t] = res[t] + sum over kept slots k of gates[t,k] * yg[pos[t,k]]. */
void kiln_moe_combine_forward(float *out,         /* [N,D] */
                              const float *res,   /* [N,D] */
                              const float *yg,    /* [M,D] expert outputs */
                              const float *gates, /* [N,K] */
                              const int32_t *pos, /* [N,K] */
                              int N, int D, int K);
/* dyg += gate * dout, dgates += dout . yg (kept slots only); the residual's gradient is
 * dout itself, left to the caller. */
void kiln_moe_combine_backward(float *dyg,         /* [M,D] */
                               float *dgates,      /* [N,K] */
                               const float *dout,  /* [N,D] */
                               const float *yg,    /* [M,D] */
                               const float *gates, /* [N,K] */
                               const int32_t *pos, /* [N,K] */
                               int N, int D, int K);

/* Mean squared error: *loss = mean((y - t)^2); backward dy += scale * 2 (y - t) / n. */
void kiln_mse_forward(double *loss, const float *y, const float *targets, size_t n);
void kiln_mse_backward(float *dy, const float *y, const float *targets, float scale, size_t n);

/* Diagnostics (no backward): RMS of x; mean over rows of -sum p log p; max |x|. */
void kiln_stats_rms(float *out, const float *x, size_t n); /* [1], [n] */
void kiln_stats_entropy(float *out, const float *p, size_t rows,
                        size_t cols);                         /* [1], [rows,cols] */
void kiln_stats_maxabs(float *out, const float *x, size_t n); /* [1], [n] */

/* ---- CUDA (kernels/cuda; present when built with KILN_HAVE_CUDA) ----
 *
 * Context. Every CUDA call of a thread goes through that thread's context: its device, one
 * cuBLAS handle (a fixed 32 MiB workspace set with cublasSetWorkspace, atomics not allowed,
 * default math, so no TF32) and a grow-only scratch block the ops use for partial sums.
 * kiln_cuda_init(device) is counted: each success is paired with kiln_cuda_release() on the
 * same thread; the last release frees the handle and the scratch. One thread per GPU (the
 * NCCL layout) gives each GPU its own context. All work runs on the legacy default stream, in
 * call order, so no op needs a stream argument and an op's result is ready for the next op
 * without a synchronisation.
 *
 * Ops. kiln_cuda_<op> has the argument list of the CPU op of the same name above, every
 * pointer a device pointer (including the scalars the CPU op writes: *loss, losses[2],
 * *dropped, the stats), and the same semantics: backward functions ADD into gradients. They
 * return KILN_ERR_DEVICE naming the op and the failing call (a launch error, a cuBLAS
 * status); an error of a kernel's execution shows at the next synchronising call
 * (kiln_cuda_sync, a download). An op with nothing to do (N == 0) launches nothing.
 *
 * Determinism: no floating-point atomics anywhere. Row reductions (norms, softmax, dot
 * products) use one warp with a fixed lane order and a butterfly tree; column reductions
 * (bias, norm-gain gradients) sum fixed chunks of 256 rows, then the chunk sums in order;
 * whole-tensor sums (losses, stats) sum in double over a partition that depends only on the
 * element count. The attention backward is split by owner (a query tile's dq, then a key
 * tile's dk and dv), the MoE dispatch ranks choices by an integer block scan, and the gather
 * backward adds a token's slots in ascending gathered-row order, as the CPU does. Two runs
 * give the same bits; the CPU and CUDA results differ by float rounding only (FMA
 * contraction, expf, the order of partial sums), except the router's choices, which are the
 * CPU's exactly given the same probabilities.
 *
 * One argument list differs from the CPU op: kiln_cuda_moe_gather_backward takes the plan's
 * pos [N,K] instead of rows [M] (see there). */
/* The optimizer's constants for one step, made once (train/optim.c's kiln_train_optim_consts)
 * and read by both updates, the CPU's (train/optim.c) and the GPU's (kiln_cuda_optim_update):
 * the same floats, so the same bits. */
typedef struct kiln_optim_consts {
    int adam;                      /* 1 AdamW, 0 SGD */
    float b1, b2, omb1, omb2, eps; /* beta1, beta2, 1 - beta1, 1 - beta2, adam_eps */
    float step, rsq_bc2;           /* lr / (1 - beta1^t), 1 / sqrt(1 - beta2^t) */
    float lr, decay, gscale;       /* SGD's step, lr * weight_decay (or 0), gradient scale */
} kiln_optim_consts;

#ifdef KILN_HAVE_CUDA
/* Open cuBLAS (once per process; kiln_cuda_init does it before its first handle): the
 * library is loaded on use, not linked (kernels/cuda/blas_dl.c). KILN_ERR_DEVICE naming the
 * library when it cannot be found or lacks a call kiln makes. */
kiln_err kiln_cuda_blas_load(void);
/* Number of visible CUDA devices; 0 when there is no driver or GPU. */
int kiln_cuda_device_count(void);

/* Open (or count another use of) this thread's context on a device; KILN_ERR_DEVICE with the
 * reason when there is no such device or the driver cannot start. */
kiln_err kiln_cuda_init(int device);
void kiln_cuda_release(void);
/* Wait for all queued work; reports a failed kernel's error. */
kiln_err kiln_cuda_sync(void);
/* Device memory; free with kiln_cuda_free (NULL does nothing). */
kiln_err kiln_cuda_malloc(void **ptr, size_t bytes);
void kiln_cuda_free(void *ptr);
/* Copies between host and device (they wait for queued work) and a byte fill (queued). */
kiln_err kiln_cuda_upload(void *dst_dev, const void *src_host, size_t bytes);
kiln_err kiln_cuda_download(void *dst_host, const void *src_dev, size_t bytes);
kiln_err kiln_cuda_copy(void *dst_dev, const void *src_dev, size_t bytes);
kiln_err kiln_cuda_memset(void *dst_dev, int byte, size_t bytes);
/* Grow the context's scratch to at least bytes now, so that no op allocates later. */
kiln_err kiln_cuda_reserve(size_t bytes);
/* Scratch bytes the ops need for these sizes (rows N, widest row C): the networks reserve it. */
size_t kiln_cuda_scratch_bytes(size_t N, size_t C);

kiln_err kiln_cuda_standardize_forward(float *out, const float *x, const float *mean,
                                       const float *std, int N, int F);
/* Neither trainer calls this or kiln_cuda_residual_backward, nor their kernels/cpu twins (the
 * input's standardisation has nothing trained below it; a residual's gradient is summed in
 * place by the ops around it): only tests/gpu does, checking them against the CPU ops. They
 * stay as the backward halves of forward ops both trainers run, so that the op set has every
 * op's gradient, checked on both devices; moving them into tests/gpu would keep two CUDA
 * builds instead of one. */
kiln_err kiln_cuda_standardize_backward(float *dx, const float *dout, const float *std, int N,
                                        int F);
kiln_err kiln_cuda_linear_forward(float *out, const float *inp, const float *weight,
                                  const float *bias, int N, int IC, int OC);
kiln_err kiln_cuda_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                   const float *inp, const float *weight, int N, int IC, int OC);
/* bf16 twins of the linear op: weight is a bf16 copy (kiln_cuda_to_bf16) of the f32 weight;
 * inp and dout are rounded to bf16 into the context's scratch; cuBLAS multiplies the bf16
 * operands with f32 accumulation into f32 outputs (dinp, dweight, out); bias and dbias f32. */
kiln_err kiln_cuda_to_bf16(uint16_t *dst, const float *src, size_t n); /* round to nearest even */
kiln_err kiln_cuda_linear_forward_bf16(float *out, const float *inp, const uint16_t *weight,
                                       const float *bias, int N, int IC, int OC);
kiln_err kiln_cuda_linear_backward_bf16(float *dinp, float *dweight, float *dbias,
                                        const float *dout, const float *inp, const uint16_t *weight,
                                        int N, int IC, int OC);
/* Grouped linear: G weight matrices over consecutive runs of rows, rows offs[g]..offs[g+1]
 * of inp/out multiplied by weight g ([G,OC,IC], bias [G,OC] or NULL): the experts of a
 * layer in one grouped GEMM per direction instead of one linear op each. offs is a HOST
 * array [G+1] (offs[0] = 0, non-decreasing; the dispatch plan's offsets, which the network
 * downloads in its forward); the result is that of kiln_cuda_linear_* per group. No CPU twin:
 * the CPU network loops over kiln_linear_* per expert, which is what gpu-check compares with. */
kiln_err kiln_cuda_linear_grouped_forward(float *out, const float *inp, const float *weight,
                                          const float *bias, const int32_t *offs, int G, int IC,
                                          int OC);
kiln_err kiln_cuda_linear_grouped_backward(float *dinp, float *dweight, float *dbias,
                                           const float *dout, const float *inp, const float *weight,
                                           const int32_t *offs, int G, int IC, int OC);
kiln_err kiln_cuda_linear_grouped_forward_bf16(float *out, const float *inp, const uint16_t *weight,
                                               const float *bias, const int32_t *offs, int G,
                                               int IC, int OC);
kiln_err kiln_cuda_linear_grouped_backward_bf16(float *dinp, float *dweight, float *dbias,
                                                const float *dout, const float *inp,
                                                const uint16_t *weight, const int32_t *offs, int G,
                                                int IC, int OC);
/* How many grouped GEMM calls this process ran as one GEMM per group because cuBLAS refused
 * the grouped call's types (gpu-check reports it: 0 on a cuBLAS that takes them). */
int kiln_cuda_grouped_fallbacks(void);
kiln_err kiln_cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                                   float eps, int N, int D);
kiln_err kiln_cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout,
                                    const float *inp, const float *weight, const float *rstd, int N,
                                    int D);
/* The residual add and the RMSNorm after it in one kernel: sum [N,D] = a + b, then
 * kiln_cuda_rmsnorm_forward(out, rstd, sum, weight, eps, N, D); the same bits as the two ops
 * (the CPU twin is kiln_residual_forward, then kiln_rmsnorm_forward). */
kiln_err kiln_cuda_residual_rmsnorm_forward(float *sum, float *out, float *rstd, const float *a,
                                            const float *b, const float *weight, float eps, int N,
                                            int D);
kiln_err kiln_cuda_gelu_forward(float *out, const float *inp, size_t n);
kiln_err kiln_cuda_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n);
kiln_err kiln_cuda_residual_forward(float *out, const float *a, const float *b, size_t n);
kiln_err kiln_cuda_residual_backward(float *da, float *db, const float *dout, size_t n);
kiln_err kiln_cuda_attention_forward(float *out, float *att, const float *qkv, int B, int S, int D,
                                     int H, int W);
/* scratch [B,H,S,W] holds d score (not d att, as on the CPU) between the two passes. */
kiln_err kiln_cuda_attention_backward(float *dqkv, float *scratch, const float *dout,
                                      const float *qkv, const float *att, int B, int S, int D,
                                      int H, int W);
kiln_err kiln_cuda_router_forward(float *probs, float *lse, int32_t *idx, float *gates,
                                  const float *logits, int N, int E, int K);
kiln_err kiln_cuda_router_loss_forward(float *load, double *losses, const float *probs,
                                       const float *lse, const int32_t *idx, int N, int E, int K);
kiln_err kiln_cuda_router_backward(float *dlogits, const float *dgates, const float *probs,
                                   const float *lse, const int32_t *idx, const float *gates,
                                   const float *load, float lb_coef, float z_coef, int N, int E,
                                   int K);
kiln_err kiln_cuda_moe_dispatch(int32_t *offsets, int32_t *pos, int32_t *rows, int *dropped,
                                const int32_t *idx, int capacity, int N, int E, int K);
/* M is offsets[E] of the plan, which the caller reads back to size the expert GEMMs. */
kiln_err kiln_cuda_moe_gather_forward(float *xg, const float *inp, const int32_t *rows, int M,
                                      int D);
/* dinp[t] += dxg[pos[t,k]] over the kept slots (pos >= 0), in ascending pos: the same sums
 * in the same order as the CPU's loop over rows, without atomics (a token's slots are found
 * through pos, which the CPU signature does not carry). */
kiln_err kiln_cuda_moe_gather_backward(float *dinp,        /* [N,D] */
                                       const float *dxg,   /* [M,D] */
                                       const int32_t *pos, /* [N,K] */
                                       int N, int D, int K);
kiln_err kiln_cuda_moe_combine_forward(float *out, const float *res, const float *yg,
                                       const float *gates, const int32_t *pos, int N, int D, int K);
kiln_err kiln_cuda_moe_combine_backward(float *dyg, float *dgates, const float *dout,
                                        const float *yg, const float *gates, const int32_t *pos,
                                        int N, int D, int K);
kiln_err kiln_cuda_mse_forward(double *loss, const float *y, const float *targets, size_t n);
kiln_err kiln_cuda_mse_backward(float *dy, const float *y, const float *targets, float scale,
                                size_t n);
kiln_err kiln_cuda_stats_rms(float *out, const float *x, size_t n);
kiln_err kiln_cuda_stats_entropy(float *out, const float *p, size_t rows, size_t cols);
kiln_err kiln_cuda_stats_maxabs(float *out, const float *x, size_t n);

/* The optimizer step of one tensor (train/optim.c's kiln_train_optim_step, element for
 * element, with the same kiln_optim_consts): g *= gscale (clipping; 1 = none), then AdamW
 * (m, v the moments) or SGD (m, v unused, may be NULL), with decay = lr * weight_decay on decayed tensors and 0 elsewhere.
 * Afterwards g holds each element's update p_new - p_old (for the update norm). Every float
 * operation rounds to nearest in the CPU loop's order with no contraction, so the same
 * inputs give the CPU's bits. The trainer runs the multi-tensor form below; this one is the
 * reference tests/gpu and test_cuda_train check it against, segment for segment. */
kiln_err kiln_cuda_optim_update(float *p, float *g, float *m, float *v, size_t n,
                                const kiln_optim_consts *o); /* all [n] */
/* Many tensors of one block in one launch (the trainer's step: every trained tensor):
 * segment i is elements off..off+n of p, g, m and v, updated as kiln_cuda_optim_update with
 * o->decay where decay is set and 0 where not; the same bits as one call per segment.
 * kiln_cuda_seg_plan fills each segment's chunk0 on the host and returns the chunk count;
 * segs is then copied to the device, and the update reads it there. */
typedef struct kiln_cuda_seg {
    size_t off, n;
    size_t chunk0; /* kiln_cuda_seg_plan */
    int decay;
} kiln_cuda_seg;
size_t kiln_cuda_seg_plan(kiln_cuda_seg *segs, int nsegs);
kiln_err kiln_cuda_optim_update_multi(float *p, float *g, float *m, float *v,
                                      const kiln_cuda_seg *segs, int nsegs, size_t nchunks,
                                      const kiln_optim_consts *o); /* segs on the device */
/* *out (device) = sum of x[i]^2 in double, over a partition that depends only on n. */
kiln_err kiln_cuda_sumsq(double *out, const float *x, size_t n);

/* ---- per-tick ops of a streaming forward (kernels/cuda/tick.cu) ----
 * One token, each launch on the given stream (a cudaStream_t as void *), none using cuBLAS or
 * the context's scratch (no context needed), so a tick can be captured into a CUDA graph.
 * Values that change from tick to tick are read from device memory: the ring state
 * ring[2] = {entries held (<= R), next position} and the router's choices. */
enum { KILN_TICK_STORE = 0, KILN_TICK_GELU = 1, KILN_TICK_ADD = 2, KILN_TICK_GATED_ADD = 3 };
kiln_err kiln_cuda_tick_standardize(void *stream, float *xn, const float *x, const float *mean,
                                    const float *std, int F); /* all [F] */
/* v = W x + b (b may be NULL), W [rows,cols]; with sel, W and b are those of expert sel[k]
 * (W + sel[k]*w_stride, b + sel[k]*b_stride). mode: y = v, y = gelu(v), y += v, or
 * y += gates[k] * v. One warp per row. */
kiln_err kiln_cuda_tick_matvec(void *stream, float *y, const float *W, const float *b,
                               const float *x, int rows, int cols, int mode, const int32_t *sel,
                               int k, size_t w_stride, size_t b_stride, const float *gates);
/* out [D] = x / sqrt(mean(x^2) + eps) * g, the sum in double. */
kiln_err kiln_cuda_tick_rmsnorm(void *stream, float *out, const float *x, const float *g, int D,
                                float eps);
/* o [D] = the tick's windowed ALiBi attention over the ring's keys (oldest first) and its own
 * (qkv [3D]); then its key and value are stored at the ring's position. kring, vring [R,D];
 * scores [H,R+1] work space; slopes [H]; scale 1/sqrt(D/H). */
kiln_err kiln_cuda_tick_attend(void *stream, float *o, float *scores, float *kring, float *vring,
                               const float *qkv, const int32_t *ring, int D, int H, int R,
                               const float *slopes, float scale);
/* probs [E] holds the router logits in, the softmax out; chosen, gates [K] (kiln_route_stream). */
kiln_err kiln_cuda_tick_route(void *stream, int32_t *chosen, float *gates, float *probs, int E,
                              int K);
kiln_err kiln_cuda_tick_add(void *stream, float *y, const float *x, int n); /* y += x */
/* The ring moves on: position + 1 mod R, one more entry held up to R. */
kiln_err kiln_cuda_tick_advance(void *stream, int32_t *ring, int R);
/* Streams (non-blocking), pinned host memory, asynchronous copies (any direction), and graph
 * capture: capture_begin, the ops, then capture_end(stream, rc of the ops, &exec) ends the
 * capture in any case and instantiates the graph when rc is KILN_OK; graph_run launches it
 * (one launch) and waits for it. */
kiln_err kiln_cuda_stream_create(int device, void **stream); /* on that device */
void kiln_cuda_stream_destroy(void *stream);
kiln_err kiln_cuda_stream_sync(void *stream);
kiln_err kiln_cuda_host_alloc(void **ptr, size_t bytes); /* kiln_cuda_host_free */
void kiln_cuda_host_free(void *ptr);
kiln_err kiln_cuda_copy_async(void *stream, void *dst, const void *src, size_t bytes);
kiln_err kiln_cuda_memset_async(void *stream, void *dst, int byte, size_t bytes);
kiln_err kiln_cuda_capture_begin(void *stream);
kiln_err kiln_cuda_capture_end(void *stream, kiln_err rc, void **graph_exec);
kiln_err kiln_cuda_graph_run(void *graph_exec, void *stream, int device);
void kiln_cuda_graph_destroy(void *graph_exec);
/* Data parallelism (kernels/cuda/dist.cu). Events order one stream after a point of
 * another (stream NULL: the legacy stream the ops run on): record, then stream_wait makes
 * the waiting stream's later work start after everything queued before the record.
 * fold_shards, on stream: out[e] = ((s_0 + s_1) + s_2) + ... for e < n over the k*P shards,
 * shard g = q*k + j at in + (j*P + q)*chunk (the layout kiln_dist_sum_shards receives),
 * one float add at a time in that order, so it gives kiln_dist_sum_shards's bits. */
kiln_err kiln_cuda_event_create(void **event); /* kiln_cuda_event_destroy */
void kiln_cuda_event_destroy(void *event);
kiln_err kiln_cuda_event_record(void *event, void *stream);
kiln_err kiln_cuda_stream_wait(void *stream, void *event);
kiln_err kiln_cuda_fold_shards(void *stream, float *out, const float *in, int k, int P,
                               size_t chunk, size_t n);
#endif

#ifdef __cplusplus
}
#endif
#endif

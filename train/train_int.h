/* train_int.h - the trainer's parts, shared inside train/ and with its tests: schedule,
 * optimizer, sampler, spike detector, checkpoints. (The metrics database is runs/'s.) */
#ifndef KILN_TRAIN_INT_H
#define KILN_TRAIN_INT_H

#include "kernels.h"
#include "train.h"

/* ---- config (config.c) ---- */

/* The fewest significant digits that print every real among an object's values so that
 * it reads back exactly (for JSON_REAL_PRECISION). */
int kiln_train_json_precision(const json_t *obj);

/* ---- the network's plan (layout.c): what model.c and model_cuda.c both build on ---- */

/* Views of one block's tensors, in the parameter block or the gradient block. */
typedef struct kiln_tsmoe_layer_view {
    float *attn_norm, *qkv_w, *qkv_b, *out_w, *out_b, *ffn_norm;
    float *fc_w, *fc_b, *proj_w, *proj_b; /* ffn.* or moe.* */
    float *router;                        /* NULL when dense */
} kiln_tsmoe_layer_view;

typedef struct kiln_tsmoe_view {
    float *in_mean, *in_std, *embed_w, *embed_b, *final_norm, *head_w, *head_b;
    kiln_tsmoe_layer_view *layers; /* [L], the caller's */
} kiln_tsmoe_view;

/* Point v at the tensors of a block (host or device) laid out as the parameter table. */
void kiln_tsmoe_view_point(const kiln_model_config *cfg, const kiln_param *table, size_t n_params,
                           float *base, kiln_tsmoe_view *v);

/* Saved activations of one block (N = max_batch * seq_len tokens). */
typedef struct kiln_tsmoe_layer_acts {
    float *res;            /* [N,D] block input h */
    float *u1;             /* [N,D] rmsnorm(h, attn_norm) */
    float *rstd1;          /* [N] */
    float *qkv;            /* [N,3D] */
    float *att;            /* [B,H,S,W] */
    float *ao;             /* [N,D] heads concatenated */
    float *mid;            /* [N,D] h after attention */
    float *u2;             /* [N,D] rmsnorm(mid, ffn_norm) */
    float *rstd2;          /* [N] */
    float *xg;             /* [N*K,D] tokens gathered per expert (mixture) */
    float *hpre;           /* [R,Fh] fc output, R = N (dense) or N*K */
    float *hact;           /* [R,Fh] gelu(hpre) */
    float *yg;             /* [N*K,D] expert outputs, bias included (mixture) */
    float *logits, *probs; /* [N,E] */
    float *lse;            /* [N] */
    float *gates;          /* [N,K] */
    int32_t *idx, *pos;    /* [N,K] */
    int32_t *rows;         /* [N*K] */
    int32_t *offsets;      /* [E+1] */
} kiln_tsmoe_layer_acts;

/* Every activation and backward buffer of the network. */
typedef struct kiln_tsmoe_acts {
    kiln_tsmoe_layer_acts *layers; /* [L], the caller's */
    float *xs;                     /* [N,F] standardised input */
    float *hL;                     /* [N,D] output of the last block */
    float *uf, *rstdf;             /* [N,D], [N] */
    float *y;                      /* [N,O] */
    float *tmp;                    /* [N,D] projection output before the residual add */
    /* backward scratch (the mixture's four NULL when dense) */
    float *dres, *du, *dao, *dqkv, *datt, *dh1, *dh2, *dxg, *dyg, *dgates, *dlogits, *dy, *duf;
} kiln_tsmoe_acts;

/* Carve a's buffers for max_batch sequences (a->layers [L] given). */
void kiln_tsmoe_carve_acts(const kiln_model_config *cfg, int max_batch, kiln_carver *c,
                           kiln_tsmoe_acts *a);

/* The checks both networks' create makes: the config, and max_batch small enough that every
 * activation index fits comfortably. */
kiln_err kiln_tsmoe_check_batch(const kiln_model_config *cfg, int max_batch);

/* The loss options a forward uses: opts, or docs/model.md's defaults when NULL. */
kiln_loss_opts kiln_tsmoe_loss_opts(const kiln_loss_opts *opts);
/* Each expert's capacity in a training forward of N tokens: 0 (none) when dense or
 * dropless, else ceil(capacity_factor * N * K / E) within 1 .. N*K. */
int kiln_tsmoe_capacity(const kiln_model_config *cfg, int N, float capacity_factor);
/* The loss of a forward with targets from its parts (sums over the layers). */
kiln_loss kiln_tsmoe_loss_total(double mse, double lb_sum, double z_sum, const kiln_loss_opts *o);

/* ---- schedule and optimizer (optim.c) ---- */

/* Learning rate of the 0-based step index i: linear warm-up lr*(i+1)/warmup_steps over
 * the first warmup_steps, then cosine from lr down to min_lr at the last step. */
double kiln_train_lr(const kiln_train_config *c, long i);

/* Global L2 norm of the trained parameters' gradients, summed in double: each tensor in
 * chunks fixed by its size (train/optim.c), the tensors in table order; per_tensor (NULL or
 * [count]) gets each tensor's norm (0 for untrained ones). */
double kiln_train_grad_norm(const kiln_param *tab, size_t count, const float *grads,
                            double *per_tensor);
/* grads *= s over the trained parameters. */
void kiln_train_grad_scale(const kiln_param *tab, size_t count, float *grads, float s);

/* One update of every trained parameter (KILN_PARAM_TRAINED; norm.in_* never change).
 * AdamW: m, v [numel] are the moments, t the 1-based count of updates (bias correction),
 *   p -= lr*wd*p (KILN_PARAM_DECAY only), then p -= lr * mhat / (sqrt(vhat) + eps).
 * SGD: p -= lr*wd*p (decay params), then p -= lr * g; m and v untouched (may be NULL).
 * upd_norm, w_norm: NULL or [count]: each tensor's update and (new) weight L2 norms. */
/* ---- threads (pool.c) ---- */

/* A fixed set of threads that run the items of one loop at a time with the caller. */
typedef struct kiln_pool kiln_pool;
typedef void (*kiln_pool_fn)(void *ctx, int item);
/* threads - 1 workers (none for threads <= 1); free with kiln_pool_free (NULL does nothing). */
kiln_err kiln_pool_create(int threads, kiln_pool **out);
void kiln_pool_free(kiln_pool *p);
int kiln_pool_threads(const kiln_pool *p); /* workers + 1; 1 for NULL */
/* fn(ctx, i) for i in 0..count-1, on the caller and the workers, each once, in no particular
 * order; returns when all are done. p NULL: in order on the caller. */
void kiln_pool_run(kiln_pool *p, int count, kiln_pool_fn fn, void *ctx);
/* The model's pool (NULL on one thread), for the optimizer step. */
kiln_pool *kiln_tsmoe_pool(kiln_tsmoe *m);

/* Step t's optimizer constants at learning rate lr (bias corrections folded in; decay =
 * lr * weight_decay; gscale 1), the same for the CPU's update and the GPU's. */
void kiln_train_optim_consts(const kiln_train_config *c, long t, double lr, kiln_optim_consts *o);
void kiln_train_optim_step(const kiln_train_config *c, const kiln_param *tab, size_t count,
                           float *params, const float *grads, float *m, float *v, long t, double lr,
                           double *upd_norm, double *w_norm);
/* The same on pool's threads (NULL: the caller's), tensors in chunks fixed by their sizes:
 * the same bits for every thread count. */
void kiln_train_optim_run(kiln_pool *pool, const kiln_train_config *c, const kiln_param *tab,
                          size_t count, float *params, const float *grads, float *m, float *v,
                          long t, double lr, double *upd_norm, double *w_norm);
/* kiln_train_grad_norm and _scale on pool's threads (NULL: the caller's): the same bits. */
double kiln_train_grad_norm_run(kiln_pool *pool, const kiln_param *tab, size_t count,
                                const float *grads, double *per_tensor);
void kiln_train_grad_scale_run(kiln_pool *pool, const kiln_param *tab, size_t count, float *grads,
                               float s);

/* ---- the step on a CUDA device (trainer_cuda.c) ---- */

/* The device side of a run with device "cuda": the network (max_batch batch_size, the
 * config's precision, CUDA device 0), the AdamW moments and the sums behind the norms, all in
 * device memory. Create fails with KILN_ERR_UNSUPPORTED in a build without CUDA and with
 * KILN_ERR_DEVICE without a usable GPU. Every call on the creating thread. */
typedef struct kiln_dev_train kiln_dev_train;
/* The GPU of a rank: *device = local_rank modulo the visible devices, *visible their count.
 * KILN_ERR_DEVICE when none is visible, KILN_ERR_UNSUPPORTED in a build without CUDA. */
kiln_err kiln_dev_train_pick(int local_rank, int *device, int *visible);
kiln_err kiln_dev_train_create(const kiln_train_config *c, int device, kiln_dev_train **out);
void kiln_dev_train_free(kiln_dev_train *d);
kiln_tsmoe_cuda *kiln_dev_train_net(kiln_dev_train *d);
/* Host blocks in and out: params [numel], mom [2*numel] (m then v; ignored for SGD). */
kiln_err kiln_dev_train_upload(kiln_dev_train *d, const float *params, const float *mom);
kiln_err kiln_dev_train_download(kiln_dev_train *d, float *params, float *mom);
/* How a step's k micro-batches on this rank become its gradient. Without this call (or with
 * dc NULL and k 1) the backward adds them up in place. Otherwise each micro-batch's gradient
 * is computed alone (a shard) and the shards are folded in global shard order, ((s_0 + s_1)
 * + s_2) + ..., which is kiln_dist_sum_shards's sum: one process with accum_steps A and P
 * ranks with A/P each give the same bits. dc NULL: one process, the fold on the compute
 * stream (one extra gradient block). dc a device communicator ("nccl", P ranks, rank r
 * holding shards r*k .. r*k+k-1): the gradient block is cut into buckets of bucket_bytes
 * (kiln_dist_buckets; 0 = 25 MiB); during the last micro-batch's backward each bucket is
 * queued on dc's stream as soon as the backward has produced it (an event on the compute
 * stream; alltoall of slices, the fold, allgather, all through dc->exchange), and the
 * compute stream waits for the last bucket before the norm and the update. Call
 * micro_begin before micro-batch j's forward and micro_end after its backward. */
kiln_err kiln_dev_train_dist(kiln_dev_train *d, kiln_comm *dc, int k, size_t bucket_bytes);
kiln_err kiln_dev_train_micro_begin(kiln_dev_train *d, int j);
kiln_err kiln_dev_train_micro_end(kiln_dev_train *d, int j);
/* With a device communicator: the buckets, how many of the last step's the backward pass
 * queued itself (the rest were queued after it: the first bucket to complete last, or all of
 * them if the backward's hook never fired), and their size limit in bytes. */
void kiln_dev_train_buckets(const kiln_dev_train *d, size_t *count, size_t *early, size_t *bytes);
/* Make the gradient element at offset NaN (the poison_steps test hook). */
kiln_err kiln_dev_train_poison(kiln_dev_train *d, size_t offset);
/* kiln_train_grad_norm of the device gradients: per-tensor sums of squares in double on the
 * device (a fixed partition), then per_tensor [count] and the total in table order here. */
kiln_err kiln_dev_train_grad_norm(kiln_dev_train *d, const kiln_param *tab, double *per_tensor,
                                  double *norm);
/* kiln_train_optim_step on the device, gradients scaled by gscale first (clipping; 1 =
 * none): the same update, element for element (kiln_cuda_optim_update). upd_norm and
 * w_norm [count] get each tensor's update and weight norms. The gradients are spent. */
kiln_err kiln_dev_train_step(kiln_dev_train *d, const kiln_train_config *c, const kiln_param *tab,
                             long t, double lr, float gscale, double *upd_norm, double *w_norm);

/* ---- sampling (sampler.c) ---- */

/* First row of the training window for (seed, 0-based step i, slot) among slots windows a
 * step: kiln_philox(seed, KILN_STREAM_BATCH, i*slots + slot), uniform over the starts
 * 0 .. train_end - seq_len. train_end >= seq_len. */
size_t kiln_train_window(uint64_t seed, long i, int slots, int slot, size_t train_end, int seq_len);
/* kiln_train_window over a split's training rows: the same start as kiln_train_window
 * without groups; with them, uniform over every group's windows (none crosses groups). */
size_t kiln_train_window_split(uint64_t seed, long i, int slots, int slot, const kiln_split *sp,
                               int seq_len);
/* The fixed validation windows: up to cap non-overlapping windows spread evenly over
 * [val_begin, val_end); starts [cap] filled. Returns the count (0 if none fits). */
size_t kiln_train_val_windows(const kiln_split *sp, int seq_len, size_t cap, size_t *starts);
/* Copy windows starting at rows starts[0..n) into x [n,S,F] and y [n,S,O]. */
void kiln_train_gather(const kiln_dataset *ds, const size_t *starts, size_t n, int seq_len,
                       float *x, float *y);

/* ---- spike detector (optim.c) ---- */

#define KILN_SPIKE_WINDOW 64
#define KILN_SPIKE_MIN 16 /* samples before a spike can be called */
#define KILN_SPIKE_Z 6.0  /* z-score above the window's mean that makes a spike */

typedef struct kiln_spike {
    int n, pos;                  /* samples held (<= window), next slot */
    double x[KILN_SPIKE_WINDOW]; /* ring buffer */
} kiln_spike;

/* z-score of x against the window; 0 while too few samples or no spread. */
double kiln_spike_z(const kiln_spike *s, double x);
void kiln_spike_push(kiln_spike *s, double x);
json_t *kiln_spike_json(const kiln_spike *s); /* new reference or NULL */
kiln_err kiln_spike_from_json(const json_t *j, const char *label, kiln_spike *s);

/* ---- checkpoints (ckpt.c) ---- */

/* What a continuation needs besides the tensors. */
typedef struct kiln_train_state {
    long step;      /* steps done */
    long updates;   /* updates applied (AdamW's t) */
    int bad_streak; /* non-finite steps in a row just before */
    kiln_spike loss_spike, gnorm_spike;
} kiln_train_state;

typedef struct kiln_ckpt_meta {
    const kiln_train_config *cfg;
    const char *dataset_sha256;
    const char *run_id;
    const kiln_train_state *state;
    /* [cfg->model.n_outputs] the target standardisation (kiln.target_norm); NULL: none */
    const float *target_mean, *target_std;
} kiln_ckpt_meta;

/* Write a checkpoint atomically: every parameter under its docs/model.md name, "m.<name>" and
 * "v.<name>" for the trained ones when m is not NULL, and __metadata__ (docs/train.md). */
kiln_err kiln_ckpt_write(const char *path, const kiln_param *tab, size_t count, const float *params,
                         const float *m, const float *v, const kiln_ckpt_meta *meta);

typedef struct kiln_ckpt {
    kiln_st *st;
    kiln_train_config cfg;
    char dataset_sha256[KILN_SHA256_HEX];
    char run_id[64];
    kiln_train_state state;
    /* [cfg.model.n_outputs] kiln.target_norm, owned; mean 0 and std 1 with has_target_norm
     * false for a checkpoint written before it existed. */
    float *target_mean, *target_std;
    bool has_target_norm;
} kiln_ckpt;

/* Open a checkpoint and verify it: the digest of the tensor data matches kiln.data_sha256,
 * and the metadata parses. Release with kiln_ckpt_release (also after a failure). */
kiln_err kiln_ckpt_open(const char *path, kiln_ckpt *ck) KILN_MUST_CHECK;
/* Copy parameters (and moments when m is not NULL) into the blocks, checking every
 * name and shape against the table. */
kiln_err kiln_ckpt_load(const kiln_ckpt *ck, const kiln_param *tab, size_t count, float *params,
                        float *m, float *v);
void kiln_ckpt_release(kiln_ckpt *ck);
/* Delete all but the newest keep checkpoints (keep 0: none deleted) and the checkpoint of
 * step also (-1: none), which the trainer keeps as the one with the best validation loss. */
kiln_err kiln_ckpt_prune(const char *run_dir, int keep, long also);

/* Open NCCL (once per process; kiln_comm_nccl_create does it first): the library is loaded
 * on use, not linked (train/nccl_dl.c), so kiln runs where it is absent until data
 * parallelism on GPUs is asked for. KILN_ERR_DEVICE naming the library otherwise. Where
 * nccl.h is found only. */
kiln_err kiln_nccl_load(void);

#endif

/*
 * train.h - the trainer's face: the kiln-tsmoe/1 model (parameters, forward, backward,
 * diagnostics) and the training loop with its checkpoints. Datasets, which it trains on, are
 * data/'s (data.h); the run's logs (metrics.db, the checkpoint names, the .lock) and every
 * reader of runs are runs/'s (runs.h), which the trainer writes through. Used by validate/,
 * sweep/, release/ and cli/.
 * Everything returns kiln_err; nothing prints or exits.
 */
#ifndef KILN_TRAIN_H
#define KILN_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "data.h"
#include "runs.h"

/* ==== the network (train/model.c, kernels/) ========================================== */

typedef struct kiln_loss_opts {
    float aux_loss_coef;   /* docs/model.md, default 0.01 */
    float z_loss_coef;     /* docs/model.md, default 0.001 */
    float capacity_factor; /* 0 = dropless; else each expert takes at most
                              ceil(capacity_factor * N * K / E) (token, slot) choices in token
                              order, and the rest skip the expert (training only) */
} kiln_loss_opts;

typedef struct kiln_loss {
    double loss, mse, load_balance, z; /* load_balance = sum_l lb_l, z = sum_l z_l */
} kiln_loss;

/* The network being trained (the public kiln_model is the runtime's frozen model): one
 * block of parameters, one of gradients (same layout, kiln_param_table order) and one of
 * activations sized for up to max_batch sequences of seq_len. */
typedef struct kiln_tsmoe kiln_tsmoe;

kiln_err kiln_tsmoe_create(const kiln_model_config *cfg, int max_batch, kiln_tsmoe **out);
void kiln_tsmoe_free(kiln_tsmoe *m);
/* Threads the forward and backward passes run on (1 at create; below 1 means 1): the caller
 * and threads - 1 workers the model starts (and stops at free or the next change). Every op
 * is cut into work items fixed by the sizes alone and sums over items are taken in item
 * order, so the results are the same bits for every thread count. KILN_ERR_NOMEM when a
 * thread cannot start (the model is then on one thread). */
kiln_err kiln_tsmoe_set_threads(kiln_tsmoe *m, int threads);
const kiln_model_config *kiln_tsmoe_config(const kiln_tsmoe *m);
const kiln_param *kiln_tsmoe_param_table(const kiln_tsmoe *m, size_t *count);
size_t kiln_tsmoe_numel(const kiln_tsmoe *m); /* floats in the parameter block */
/* Bytes in the CPU network's blocks (parameters, gradients, activations). */
size_t kiln_tsmoe_bytes(const kiln_tsmoe *m);

/* Room kept for what a run allocates after setup (metrics, checkpoint writes, stdio). */
#define KILN_TRAIN_SPARE_BYTES (64ull << 20)
/* Refuse (KILN_ERR_LIMIT, naming the need and the limit) work whose sgemms cannot fit this
 * process's RLIMIT_AS, RLIMIT_DATA or cgroup v2 memory.max: called once kiln_bytes of
 * buffers for what ("batch_size 20000") are allocated for task ("this run"), whose message
 * ends with remedy ("lower batch_size or threads, or raise the limit"), and before the step's
 * threads start (the trainer's steps, the validation networks). */
kiln_err kiln_train_check_memory(uint64_t kiln_bytes, int threads, const char *task,
                                 const char *what, const char *remedy);

float *kiln_tsmoe_params(kiln_tsmoe *m);      /* [numel] */
float *kiln_tsmoe_grads(kiln_tsmoe *m);       /* [numel], zero for untrained params */
/* docs/model.md initialisation from the seed (Philox, KILN_STREAM_INIT, counter = the element's
 * index in the block): Normal(0, 0.02), out and proj weights Normal(0, 0.02/sqrt(2L)),
 * biases 0, gains 1, norm.in_mean 0 and norm.in_std 1 (the trainer sets them from data). */
void kiln_tsmoe_init(kiln_tsmoe *m, uint64_t seed);
/* Forward over x [B,S,F] raw inputs (B <= max_batch). With targets [B,S,O] the loss is
 * computed into *loss and the activations kept for backward; targets may be NULL (then
 * loss may be NULL too). */
kiln_err kiln_tsmoe_forward(kiln_tsmoe *m, const float *x, const float *targets, int B,
                            const kiln_loss_opts *opts, kiln_loss *loss);
const float *kiln_tsmoe_outputs(const kiln_tsmoe *m); /* [B,S,O] of the last forward */
const kiln_tsmoe_stats *kiln_tsmoe_last_stats(const kiln_tsmoe *m);
void kiln_tsmoe_zero_grads(kiln_tsmoe *m);
/* After a forward with targets: grads += scale * d loss / d params. */
kiln_err kiln_tsmoe_backward(kiln_tsmoe *m, float scale);
/* Training FLOPs per token of a config (forward + backward): 6 x the matrix weights a token
 * uses (top_k of n_experts experts' fc and proj, plus the router) + 12 x L x D x the mean
 * number of keys a query attends to. *active (may be NULL) gets those weights. The figure
 * behind MFU (gpu-check) and the CPU training benchmark. */
double kiln_tsmoe_flops_per_token(const kiln_model_config *c, double *active);
/* The mean number of keys a query attends to: min(i + 1, W) over positions i < S. */
double kiln_tsmoe_mean_window(int seq_len, int attn_window);

/* ==== data parallelism (train/comm.c; MPI and NCCL in build/libkiln_dist.a) ========== */

/* One point-to-point transfer of a group (kiln_comm.exchange). */
typedef struct kiln_comm_xfer {
    int peer;
    const void *send;
    size_t send_bytes;
    void *recv;
    size_t recv_bytes;
} kiln_comm_xfer;
/* A communicator: rank and size, and collectives that only move bytes. Every call is
 * collective: all ranks make the same calls in the same order with the same sizes.
 * Buffers are host memory ("single", "mpi") or device memory ("nccl"). The trainer's
 * sums are done by kiln_dist_sum_shards on top of alltoall and allgather, in an order
 * fixed by the shard numbers, so N ranks and one process compute the same bits. */
typedef struct kiln_comm kiln_comm;
struct kiln_comm {
    int rank, size;
    const char *name; /* "single", "mpi", "nccl" */
    /* buf [bytes] on every rank = root's. */
    kiln_err (*bcast)(kiln_comm *c, void *buf, size_t bytes, int root);
    /* recv [size*bytes]: block r = rank r's send [bytes]. */
    kiln_err (*allgather)(kiln_comm *c, const void *send, void *recv, size_t bytes);
    /* send, recv [size*bytes]: rank r's send block q lands in rank q's recv block r. */
    kiln_err (*alltoall)(kiln_comm *c, const void *send, void *recv, size_t bytes);
    /* buf [n] = the sum over ranks in an order the implementation picks (MPI_Allreduce,
     * ncclAllReduce): fast, not bit-reproducible across rank counts; the CPU trainer
     * does not use it. */
    kiln_err (*allreduce_sum)(kiln_comm *c, float *buf, size_t n);
    /* Device communicators only ("nccl"; NULL elsewhere): one group of point-to-point
     * transfers queued on `stream` without waiting for them (x[i]: send send_bytes to peer,
     * receive recv_bytes from peer; a 0 size moves nothing; transfers between two ranks
     * pair up in list order). The data-parallel CUDA trainer's buckets go through it. */
    kiln_err (*exchange)(kiln_comm *c, const kiln_comm_xfer *x, size_t n);
    void *stream; /* the device stream (cudaStream_t) the collectives run on, or NULL */
    void (*destroy)(kiln_comm *c); /* NULL for the static single-process communicator */
    void *impl;
};

/* The one-process communicator (rank 0 of 1; every collective is a copy). Static: never
 * freed. */
kiln_comm *kiln_comm_single(void);
/* Release a communicator (MPI_Finalize for "mpi"); NULL and the single one do nothing. */
void kiln_comm_free(kiln_comm *c);

/* Floats in a shard buffer for kiln_dist_sum_shards: n rounded up to a multiple of size
 * (0 on overflow). */
size_t kiln_dist_padded(int size, size_t n);
/* Floats of work space kiln_dist_sum_shards needs (0 on overflow). */
size_t kiln_dist_work_floats(int size, int k, size_t n);
/* The sum of size*k gradient shards on every rank, bit for bit the same for any size:
 * rank r holds shards r*k .. r*k+k-1 in shards[0..k), each kiln_dist_padded(size, n)
 * floats with zeros past n. out [n] = ((s_0 + s_1) + s_2) + ... in float, element by
 * element (the element's owner, rank e / ceil(n/size), adds them after an alltoall,
 * then an allgather spreads the sums). out may be shards[0]. With size 1 nothing moves. */
kiln_err kiln_dist_sum_shards(kiln_comm *c, float *const *shards, int k, size_t n, float *out,
                              float *work);
/* Agreement: every rank passes its rc and n doubles (mine [1+n]; mine[0] is set to rc
 * here); all [size*(1+n)] gets every rank's record (rank r's payload at all[r*(1+n)+1]).
 * When any rank's rc is not KILN_OK, the lowest such rank's code and message become
 * every rank's ("rank R: <message>" on the others) and that code is returned. */
kiln_err kiln_dist_agree(kiln_comm *c, kiln_err rc, double *mine, size_t n, double *all);

/* Gradient buckets for overlapping the reduction with the backward pass (NCCL): ranges
 * of the gradient block in backward order (the parameter table reversed), each made of
 * whole tensors and at least bucket_bytes unless it is the last. Bucket b covers floats
 * [offset, offset + numel) and tensors first_param down to last_param (table indices,
 * first_param >= last_param). */
typedef struct kiln_dist_bucket {
    size_t offset, numel;
    size_t first_param, last_param;
} kiln_dist_bucket;
/* Fill out[0..cap) and return the bucket count (which may exceed cap: call with cap 0
 * to size the array). */
size_t kiln_dist_buckets(const kiln_param *tab, size_t count, size_t bucket_bytes,
                         kiln_dist_bucket *out, size_t cap);

/* ---- in build/libkiln_dist.a only (the kiln binary; libkiln never links MPI) ---- */

/* Whether this process was started by mpirun (OMPI_COMM_WORLD_SIZE) or srun with PMIx
 * (PMIX_RANK): only then is MPI initialised, so a plain `kiln train` never starts Open
 * MPI's singleton machinery. */
bool kiln_comm_mpi_launched(void);
/* MPI_Init and a communicator over a duplicate of MPI_COMM_WORLD; free with
 * kiln_comm_free (which finalises MPI). */
kiln_err kiln_comm_mpi_create(int *argc, char ***argv, kiln_comm **out);
/* NCCL over one GPU per rank (cudaSetDevice(device)), bootstrapped through boot (rank 0
 * makes the unique id and broadcasts it); buffers are device memory. Built only where
 * nvcc and nccl.h are found; elsewhere KILN_ERR_UNSUPPORTED. Free with kiln_comm_free
 * before boot. */
kiln_err kiln_comm_nccl_create(kiln_comm *boot, int device, kiln_comm **out);

/* ==== the trainer (train/config.c, optim.c, sampler.c, ckpt.c, trainer.c) ============ */

typedef enum kiln_optim_kind { KILN_OPTIM_ADAMW = 0, KILN_OPTIM_SGD = 1 } kiln_optim_kind;

/* Where a run's steps run: the CPU network (kiln_tsmoe) or the CUDA one (kiln_tsmoe_cuda). */
typedef enum kiln_train_device { KILN_TRAIN_CPU = 0, KILN_TRAIN_CUDA = 1 } kiln_train_device;

typedef enum kiln_precision {
    KILN_PRECISION_F32 = 0, /* every GEMM in f32 (no TF32) */
    KILN_PRECISION_BF16 = 1 /* GEMM operands rounded to bf16, f32 accumulation and outputs;
                               f32 master weights, router, norms, softmax and losses */
} kiln_precision;

/* A run's settings: the model's keys (docs/model.md) and the trainer's, one JSON object in
 * files (docs/train.md lists every key). kiln_train_config_default gives the tiny config
 * the demo and tests use. */
typedef struct kiln_train_config {
    kiln_model_config model; /* n_features, n_outputs 0 = take the dataset's */
    long steps;              /* optimizer updates in the run */
    int batch_size;          /* windows per micro-batch */
    int accum_steps;         /* micro-batches per step */
    kiln_optim_kind optimizer;
    double lr, min_lr;   /* peak and final learning rate */
    long warmup_steps;   /* linear warm-up, then cosine decay to min_lr */
    double weight_decay; /* decoupled, matrices only (KILN_PARAM_DECAY) */
    double beta1, beta2, adam_eps;
    double grad_clip; /* global gradient-norm limit; 0 = off */
    uint64_t seed;
    double val_fraction; /* 0 = no validation split */
    long eval_every;     /* steps between validations; 0 = only at the end */
    long ckpt_every;     /* steps between checkpoints; 0 = only at the end */
    int keep;            /* checkpoints kept; 0 = all */
    double aux_loss_coef, z_loss_coef, capacity_factor;
    int max_bad_steps;        /* non-finite steps in a row that stop the run */
    bool skip_spikes;         /* skip the update on a loss or gradient-norm spike */
    int threads;              /* CPU threads; 0 = the CPUs the process may use */
    kiln_train_device device; /* "cpu" or "cuda" (CUDA device 0) */
    kiln_precision precision; /* "f32", or "bf16" (cuda only) */
    /* The split in time (kiln_split_opts; left out of the config's JSON while unset): */
    char val_from[40];   /* "" or a time: validation from it (val_fraction then unused) */
    long purge_rows;     /* 0 = seq_len */
    char purge_time[24]; /* "" or a duration ("30d") */
} kiln_train_config;

void kiln_train_config_default(kiln_train_config *c);
/* Overlay the keys of a JSON object onto *c. An unknown key, a value of the wrong type or
 * out of range is KILN_ERR_CONFIG with a message naming label and the key; *c may then
 * be partly changed. */
kiln_err kiln_train_config_apply(kiln_train_config *c, const json_t *j, const char *label);
/* One "key=value" assignment (--set): the value is a JSON scalar, or else a bare word
 * taken as a string ("optimizer=sgd"). */
kiln_err kiln_train_config_set(kiln_train_config *c, const char *assignment);
/* Cross-key checks (min_lr <= lr, the model's constraints once n_features and n_outputs
 * are known, ...). */
kiln_err kiln_train_config_check(const kiln_train_config *c, const char *label);
/* Every key as a new JSON object (n_features/n_outputs left out while 0); NULL on
 * allocation failure. */
json_t *kiln_train_config_json(const kiln_train_config *c);
/* kiln train --print-config: the config's text (pretty) with every accepted key, those
 * unset shown as null (n_features and n_outputs: the dataset's; val_from, purge_time,
 * purge_rows: no time split, no purge), which --config reads back. */
char *kiln_train_config_print_text(const kiln_train_config *c);
/* Text of the config: sorted keys, every number exact and as short as reads back the same.
 * pretty: 2-space indent and a trailing newline. Caller frees; NULL on failure. */
char *kiln_train_config_text(const kiln_train_config *c, bool pretty);
/* The compact text that names a run's computation: every key but `threads`, which changes
 * how fast a step runs and never its bits. What the run id is made from and what a
 * checkpoint's kiln.train_config holds, so neither depends on the thread count; caller frees
 * (NULL and NOMEM set on failure). */
char *kiln_train_config_run_text(const kiln_train_config *c);
/* The threads a CPU run uses: `threads`, or with 0 (the default) the CPUs this process may
 * run on (sched_getaffinity). */
int kiln_train_threads(const kiln_train_config *c);
/* Whether a key may change when a run is resumed (steps, eval_every, ckpt_every, keep,
 * max_bad_steps, skip_spikes, threads, device, precision); false for unknown keys. */
bool kiln_train_config_resumable(const char *key);
/* The CUDA devices a run with device "cuda" could train on: 0 without a driver or a GPU (and in
 * a build without CUDA). kiln reproduce asks before it pulls a GPU-trained model. */
int kiln_train_cuda_devices(void);
/* "cpu" or "cuda". */
const char *kiln_train_device_name(kiln_train_device d);
/* The split a config asks for (its strings stay c's). */
kiln_err kiln_train_split_opts(const kiln_train_config *c, kiln_split_opts *o);

typedef struct kiln_train_opts {
    const char *run_dir;
    const char *data_path; /* fresh run: required; resume: NULL = the path in run.json */
    const char
        *init_path; /* fresh run: NULL, or a model file whose weights and norm.in_* are kept */
    const char *const *sets; /* resume: "key=value" changes to the checkpoint's config */
    int n_sets;
    void (*progress)(void *ctx, const kiln_train_progress *p); /* NULL = none */
    void *progress_ctx;
    volatile int *stop; /* NULL, or set non-zero (e.g. by a signal handler) to checkpoint
                           and return KILN_ERR_INTERRUPTED */
    /* Tests only: at these 1-based steps the gradient is made NaN (a non-finite step). */
    const long *poison_steps;
    size_t n_poison;
    /* NULL = one process. With N ranks every rank calls kiln_train_start or _resume with
     * the same arguments; rank 0 reads and writes the run directory and reports progress,
     * the others receive the run's state from it and write nothing. accum_steps must be a
     * multiple of N: rank r computes micro-batches r*k .. r*k+k-1 (k = accum_steps / N). */
    kiln_comm *comm;
    /* Device "cuda" on several ranks (and on one, when set): NULL, or the function that
     * makes the device communicator the gradients are reduced through
     * (kiln_comm_nccl_create, which libkiln does not link); several ranks without it are
     * refused. Each rank trains on GPU local_rank modulo the visible count (local_rank: the
     * rank's index among the ranks of its machine, OMPI_COMM_WORLD_LOCAL_RANK).
     * bucket_bytes: the gradient buckets' size (kiln_dist_buckets; 0 = 25 MiB). */
    kiln_err (*device_comm)(kiln_comm *boot, int device, kiln_comm **out);
    int local_rank;
    size_t bucket_bytes;
} kiln_train_opts;

/* Start a new run in opts->run_dir (created; refused if it holds a run already). The
 * config is checked and the dataset opened before anything is written. */
kiln_err kiln_train_start(const kiln_train_config *cfg, const kiln_train_opts *opts);
/* Continue the run in opts->run_dir from its newest checkpoint whose digest verifies;
 * checkpoints skipped are reported as events and warnings. Another dataset, or a change
 * of a key that is not resumable, is refused naming the key. */
kiln_err kiln_train_resume(const kiln_train_opts *opts);

/* ==== the network on a CUDA device (train/model_cuda.c, kernels/cuda) ================
 * The same function as kiln_tsmoe (docs/model.md), with parameters, gradients and activations
 * each in one block of device memory, built from the kiln_cuda_* ops of kernels.h. It
 * agrees with the CPU network to float rounding (the router's choices exactly, given the
 * same probabilities), and two runs give the same bits. The device is driven by the thread
 * that created the network (kernels.h, "Context"): call every function on that thread.
 * In a build without CUDA, create fails with KILN_ERR_UNSUPPORTED; on a machine without a
 * usable GPU, with KILN_ERR_DEVICE and the driver's reason. */
typedef struct kiln_tsmoe_cuda kiln_tsmoe_cuda;

typedef struct kiln_cuda_opts {
    int device;               /* CUDA device index, default 0 */
    kiln_precision precision; /* default f32 */
} kiln_cuda_opts;

/* opts NULL: device 0, f32. Parameters and gradients start at zero. Free with
 * kiln_tsmoe_cuda_free. */
kiln_err kiln_tsmoe_cuda_create(const kiln_model_config *cfg, int max_batch,
                                const kiln_cuda_opts *opts, kiln_tsmoe_cuda **out);
void kiln_tsmoe_cuda_free(kiln_tsmoe_cuda *m);
/* The parameter layout: kiln_param_table order, the same as kiln_tsmoe's. */
const kiln_param *kiln_tsmoe_cuda_param_table(const kiln_tsmoe_cuda *m, size_t *count);
size_t kiln_tsmoe_cuda_numel(const kiln_tsmoe_cuda *m);
/* Host blocks of numel floats in and out (e.g. kiln_tsmoe_params of a CPU network). */
kiln_err kiln_tsmoe_cuda_upload_params(kiln_tsmoe_cuda *m, const float *params);
kiln_err kiln_tsmoe_cuda_download_params(const kiln_tsmoe_cuda *m, float *params);
kiln_err kiln_tsmoe_cuda_download_grads(const kiln_tsmoe_cuda *m, float *grads);
/* The device blocks themselves [numel], for an optimizer that runs on the device. */
float *kiln_tsmoe_cuda_device_params(kiln_tsmoe_cuda *m);
float *kiln_tsmoe_cuda_device_grads(kiln_tsmoe_cuda *m);
kiln_err kiln_tsmoe_cuda_zero_grads(kiln_tsmoe_cuda *m);
/* As kiln_tsmoe_forward: x [B,S,F] and targets [B,S,O] (or NULL) are host memory, copied
 * to the device. Returns when the loss and the stats are on the host. */
kiln_err kiln_tsmoe_cuda_forward(kiln_tsmoe_cuda *m, const float *x, const float *targets, int B,
                                 const kiln_loss_opts *opts, kiln_loss *loss);
/* y [B,S,O] of the last forward, copied to the host. */
kiln_err kiln_tsmoe_cuda_outputs(const kiln_tsmoe_cuda *m, float *y);
/* Host copies, valid until the next forward. */
const kiln_tsmoe_stats *kiln_tsmoe_cuda_last_stats(const kiln_tsmoe_cuda *m);
/* After a forward with targets: grads += scale * d loss / d params (queued on the device;
 * a download or kiln_tsmoe_cuda_sync waits for it and reports its errors). */
kiln_err kiln_tsmoe_cuda_backward(kiln_tsmoe_cuda *m, float scale);
/* Called by the backward each time the gradients of more tensors are complete on the
 * device: after the head and final norm, after each block (last to first), after the
 * embedding. Tensors from table index `first` on then have their final gradients for work
 * queued after this point of the legacy stream (record an event there). An error stops the
 * backward and is returned by it. fn NULL: no hook. */
typedef kiln_err (*kiln_tsmoe_cuda_grad_hook)(void *ctx, size_t first);
void kiln_tsmoe_cuda_set_grad_hook(kiln_tsmoe_cuda *m, kiln_tsmoe_cuda_grad_hook fn, void *ctx);
kiln_err kiln_tsmoe_cuda_sync(kiln_tsmoe_cuda *m);

#endif

/*
 * train.h - the trainer's face: the kiln-tsmoe/1 model (parameters, forward, backward,
 * diagnostics) and the training loop with its checkpoints and metrics. Datasets, which it
 * trains on, are data/'s (data.h). Used by validate/, sweep/, release/ and cli/.
 * Everything returns kiln_err; nothing prints or exits.
 */
#ifndef KILN_TRAIN_H
#define KILN_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "data.h"

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

/* Diagnostics of the last forward: views into the model, valid until the next forward. */
typedef struct kiln_tsmoe_stats {
    int n_layers, n_experts;
    const float *attn_entropy;   /* [L] mean attention entropy (nats) over tokens and heads */
    const float *router_entropy; /* [L] mean entropy of p_t over tokens; 0 when dense */
    const float *expert_load;    /* [L,E] f_i: share of the N*K choices that picked expert i */
    const float *overflow;       /* [L] share of (token, slot) choices dropped by capacity */
    const float *act_rms;        /* [L] RMS of the residual stream h after each block */
    float max_abs_output;        /* max |y| */
} kiln_tsmoe_stats;

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

/* ==== the trainer (train/config.c, optim.c, sampler.c, ckpt.c, metrics.c, trainer.c) ==== */

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
/* A config value as people type it (--set) and as every reader of runs shows it (kiln runs
 * list, show, diff and serve): 0.003, 1e-5 (the shortest text that reads back as the same
 * double), adamw, true; other JSON compact. Caller frees; NULL when out of memory. */
char *kiln_run_config_value_text(const json_t *v);
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

/* What the trainer reports after every step (to the progress callback). */
typedef struct kiln_train_progress {
    long step, steps; /* step is 1-based: steps done so far */
    long first_step;  /* the first step of this process (after a resume: ckpt + 1) */
    double loss, mse, load_balance, z, lr, grad_norm;
    bool applied; /* false: the update was skipped (non-finite or spike) */
    double tokens_per_s, elapsed_s, eta_s;
    bool has_val; /* validation ran after this step */
    double val_loss, val_r2;   /* on the standardised targets (R^2 does not change with it) */
    const double *val_r2_each; /* [O] R^2 per target when has_val, else NULL */
    const kiln_tsmoe_stats *stats;
} kiln_train_progress;

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

/* ---- reading runs (kiln runs show / diff) ---- */

typedef struct kiln_run_event {
    long step;
    char *kind, *message;
    double time; /* unix seconds */
} kiln_run_event;

typedef struct kiln_run_info {
    json_t *run;    /* run.json */
    long last_step; /* newest metrics row; 0 = none */
    double last_loss, last_lr, last_grad_norm;
    long best_val_step; /* 0 = no validation yet */
    double best_val_loss, best_val_r2;
    long last_val_step;
    double last_val_loss, last_val_r2;
    /* R^2 per target at last_val_step: an array of {target, name, r2}; empty for a run
     * logged before they were recorded. */
    json_t *last_val_targets;
    long *ckpts; /* checkpoint steps on disk, ascending */
    size_t n_ckpts;
    long best_ckpt;         /* the one whose step logged the lowest validation loss; -1: none */
    kiln_run_event *events; /* newest max_events, oldest first */
    size_t n_events, total_events;
    /* The router and attention diagnostics of every layer at last_step: an array of rows
     * {layer, attn_entropy, router_entropy, load_imbalance, dead_experts, overflow,
     * act_rms, expert_load: [E]}; empty when none were logged. */
    json_t *layers;
    double tokens_per_s; /* over the newest 100 steps (their tokens over their time); NAN: none */
    double updated;      /* unix seconds of the newest step row or event; NAN: none */
    size_t n_nonfinite, n_spikes; /* events of those kinds */
    /* How the last start or resume ended when the trainer recorded it: "diverged"
     * (max_bad_steps non-finite steps in a row) or "failed" (any other error), with its
     * message; NULL when the newest start or resume has no such event after it. */
    char *stop_kind, *stop_message;
} kiln_run_info;

/* Read a run directory's run.json, metrics.db and checkpoint list (read-only; the metrics
 * in one read transaction, so a trainer writing meanwhile cannot mix two moments).
 * Release with kiln_run_info_release. */
kiln_err kiln_run_info_load(const char *run_dir, size_t max_events, kiln_run_info *out);
/* The same without best_val_* (0: finding them reads every step; kiln runs serve takes them
 * from its curves), so that it costs the same at any length. */
kiln_err kiln_run_info_load_quick(const char *run_dir, size_t max_events, kiln_run_info *out);
void kiln_run_info_release(kiln_run_info *info);
/* Append an event to a run's log (metrics.db's events table) from outside the trainer: a
 * launcher's record of a preemption or a requeue (kiln sweep). step: the step it belongs to;
 * a resume deletes the events after its checkpoint, so a launcher uses the newest checkpoint's
 * step. KILN_ERR_NOTFOUND when the run has no metrics.db yet. */
kiln_err kiln_run_event_add(const char *run_dir, long step, const char *kind, const char *message);
/* Whether a trainer holds the run directory now (its OFD lock on RUN_DIR/.lock, tested
 * without taking anything: a reader never makes a trainer wait or fail). No .lock: false. */
kiln_err kiln_run_live(const char *run_dir, bool *live);

/* ---- following a run as it trains (kiln runs show --follow) ---- */

/* How far a follower has read: the newest step row and event it has seen (their step or id
 * and the time they were logged), plus the newest time seen. Zero: nothing seen. */
typedef struct kiln_run_cursor {
    long step, event_id;
    double time;
} kiln_run_cursor;

/* What was logged after a cursor, oldest first. A resume goes back to a checkpoint and logs
 * the steps after it again: a follower gets them again, after the resume event. */
typedef struct kiln_run_news {
    kiln_train_progress *steps; /* .steps the run's total, .stats NULL, times unset */
    double *step_times;         /* unix seconds each step was logged */
    size_t n_steps;
    kiln_run_event *events;
    size_t n_events;
} kiln_run_news;

/* A cursor at the run's newest rows now, so that kiln_run_follow then gives only what comes
 * later (zero when the run has logged nothing). */
kiln_err kiln_run_cursor_end(const char *run_dir, kiln_run_cursor *cur);
/* The steps and events logged after *cur (the newest max of each when more came), and *cur
 * moved past them. Each read walks down from the newest row to the first one seen, so a poll
 * costs what is new, not the run's length. Rows are logged in step order, each with its
 * time: a row is new when its step is past the cursor's or it was logged after the cursor's
 * time (a resume's re-logged steps), which also holds when the clock steps back. A run with
 * no metrics.db yet has no news. Release with kiln_run_news_release. */
kiln_err kiln_run_follow(const char *run_dir, kiln_run_cursor *cur, size_t max, kiln_run_news *out);
void kiln_run_news_release(kiln_run_news *n);

typedef struct kiln_run_diff {
    json_t *config;    /* {"key": [a, b]} for every key whose values differ */
    long common_steps; /* steps both runs have logged */
    long a_steps, b_steps;
    long first_diff;       /* first step whose losses differ bit for bit; 0 = none */
    double a_loss, b_loss; /* at first_diff */
} kiln_run_diff;
kiln_err kiln_run_diff_load(const char *a_dir, const char *b_dir, kiln_run_diff *out);
void kiln_run_diff_release(kiln_run_diff *d);

/* ---- why a step went wrong (kiln runs explain) ---- */

#define KILN_EXPLAIN_WINDOW 64        /* steps before the one explained that are its baseline */
#define KILN_EXPLAIN_MAX_TROUBLE 1000 /* trouble steps listed in "trouble" */

/* Set a step of a run against the `window` steps before it (< 1: KILN_EXPLAIN_WINDOW): its
 * loss, gradient norm, learning rate and largest output against their medians; every
 * trained tensor's gradient norm against its own median, since when it has been over 3x it,
 * and the largest update ratio of the 8 steps before; every layer's router and attention
 * entropies, dead experts, load imbalance, overflow and output RMS. Findings say in words
 * what stands out: where a non-finite value arose (the first block whose output is not
 * finite, or the top of the tensors whose gradients are not), which tensor rose first,
 * a router or attention collapse, an update far past its median. step 0: the run's first
 * spike or non-finite step ("step": null when it has none); "trouble" lists the steps of
 * every spike and non-finite step (the first KILN_EXPLAIN_MAX_TROUBLE). A step the run did not log,
 * a directory that is no run, or one without metrics.db fails naming it. *out is a document of
 * format "kiln-runs-explain/1" (docs/train.md); json_decref it. */
kiln_err kiln_run_explain(const char *run_dir, long step, long window, json_t **out);

/* ---- comparing runs (kiln runs list) ---- */

typedef enum kiln_run_state {
    KILN_RUN_FINISHED = 0,    /* logged its last step */
    KILN_RUN_RUNNING = 1,     /* a trainer holds it now (kiln_run_live) */
    KILN_RUN_INTERRUPTED = 2, /* not finished, nobody training it: resume it */
    KILN_RUN_DIVERGED = 3,    /* the trainer stopped it: max_bad_steps non-finite steps */
    KILN_RUN_FAILED = 4,      /* the trainer stopped on another error it recorded */
    KILN_RUN_ERROR = 5        /* the run directory could not be read */
} kiln_run_state;
/* "finished", "running", "interrupted", "diverged", "failed", "error". */
const char *kiln_run_state_name(kiln_run_state s);
/* A readable run's state from what kiln_run_info_load read and kiln_run_live said. */
kiln_run_state kiln_run_state_of(const kiln_run_info *ri, bool live);

/* One run of a list. Numbers a run has not logged are NAN (reals) or 0 (steps). */
typedef struct kiln_run_row {
    char *name; /* relative to the PATH it was found under, or the PATH itself */
    char *dir;  /* the run directory's path */
    kiln_run_state state;
    char *message;           /* ERROR: why it could not be read; DIVERGED, FAILED: the trainer's
                                message; NULL otherwise */
    long step, steps;        /* newest logged step, the config's steps */
    double loss;             /* at step */
    long val_step;           /* the best validation's step; 0 = none */
    double val_loss, val_r2; /* at val_step */
    double tokens_per_s;     /* kiln_run_info's */
    double updated;          /* unix seconds */
    long nonfinite, spikes;  /* events */
    /* The keys compared between runs: run.json's config, nested objects flattened to
     * "outer.inner", and dataset_sha256. Sorted by key; NULL for ERROR rows. */
    json_t *config;
} kiln_run_row;

typedef struct kiln_run_list {
    kiln_run_row *rows; /* sorted, filtered, cut to top */
    size_t n;
    size_t found;          /* runs found under the paths (rows before the filters and top) */
    size_t matched;        /* rows the filters kept (before top) */
    size_t errors;         /* ERROR rows among those found */
    char **error_messages; /* [errors]: theirs, in the order found (the filters may hide
                              their rows; a caller still reports them) */
    /* Over the readable rows the filters kept: the keys every one of them has with one
     * value ({"key": value}), and the others, sorted (["key", ...]). */
    json_t *same, *varied;
    size_t compared; /* how many rows same and varied describe */
} kiln_run_list;

typedef struct kiln_run_list_opts {
    /* "KEY=VALUE" filters on a column (name state step steps loss val_loss val_step val_r2
     * tokens_per_s updated nonfinite spikes) or a config key: rows whose
     * value equals VALUE (a JSON scalar or else a bare word; numbers compare by value, so
     * lr=1e-3 finds 0.001). Different keys must all match; one key given several times
     * matches any of its values. A row that could not be read passes config filters (it
     * cannot be judged, and a list must not hide a broken run); state=... judges it. */
    const char *const *where;
    size_t n_where;
    /* A column or config key, "-KEY" for descending; NULL: val_loss. Rows without a value
     * sort last either way; ties by name (numbers in names by value: lr-2 before lr-10). */
    const char *sort;
    size_t top; /* keep the first top rows; 0 = all */
} kiln_run_list_opts;

/* Find and read the runs under paths: each a run directory (run.json, metrics.db or ckpt/
 * in it) or a directory whose direct children include run directories (other children are
 * skipped). A run that cannot be read is a row in state ERROR, not a failure. Fails with
 * KILN_ERR_USAGE for a path that is neither (naming it), a bad filter or sort key; with
 * KILN_ERR_NOMEM. opts may be NULL. Release with kiln_run_list_release. */
kiln_err kiln_run_list_load(const char *const *paths, size_t n_paths,
                            const kiln_run_list_opts *opts, kiln_run_list *out);
void kiln_run_list_release(kiln_run_list *l);

/* The list as a table for a terminal of width columns (0 = no limit), "now" the unix time
 * ages are measured from: a line of the keys every run shares (cut to width, or to 120
 * columns without a limit: --json has them all), then a row per run with the columns that
 * hold a value and a column per varied key; an ERROR row's message runs on from its state
 * column. Columns are sized to their content; when the table is wider than width, names and
 * long values are shortened in the middle with '…' and the columns least needed to compare
 * runs dropped (updated, tok/s, spikes and nonfin when all 0, val_r2, loss). Caller frees
 * *out. */
kiln_err kiln_run_list_table(const kiln_run_list *l, int width, double now, char **out);
/* Every field of every row as a new JSON document (format "kiln-runs-list/1"; keys in a
 * fixed order, docs/train.md). NULL when out of memory. */
json_t *kiln_run_list_json(const kiln_run_list *l);
/* CSV: a header, then a row per run: the columns, message, then the varied keys; numbers
 * exact. Caller frees *out. */
kiln_err kiln_run_list_csv(const kiln_run_list *l, char **out);

/* One metric of a run over its steps (kiln runs plot). A metric is a column of the steps
 * table (loss, mse, load_balance, z, lr, grad_norm, tokens_per_s, max_abs_output, val_loss,
 * val_r2), a layer's diagnostic NAME@LAYER (attn_entropy, router_entropy, load_imbalance,
 * dead_experts, overflow, act_rms; expert_load@LAYER gives one series per expert), or a
 * tensor's NAME@TENSOR (grad_norm, update_ratio). A step whose value was not finite (SQLite
 * keeps NaN as NULL) is a NAN point; val_loss and val_r2 only have the steps that were
 * evaluated. */
typedef struct kiln_run_series {
    char *name; /* "loss", "router_entropy@1", "expert_load@0/3", "grad_norm@head.w" */
    size_t n;
    double *step, *value;
} kiln_run_series;

/* The series of metric over steps from..to (inclusive) of a run directory: *n_out of them
 * (one, or one per expert), each with at least the steps the run logged there (maybe none).
 * An unknown metric, a layer or tensor the run never logged, or a run without metrics.db
 * fails naming the run directory and the metric. Free with kiln_run_series_free. */
kiln_err kiln_run_series_load(const char *run_dir, const char *metric, long from, long to,
                              kiln_run_series **out, size_t *n_out);
void kiln_run_series_free(kiln_run_series *s, size_t n);
/* What metrics a run logged, in the names kiln_run_series_load takes (the step columns, the
 * layers' diagnostics and their layers, the tensors), as text for people (caller frees). */
kiln_err kiln_run_metrics_list(const char *run_dir, char **out);

/* ---- a run's curves for a picture (kiln runs serve, a release's run summary) ---- */

/* At most this many steps of the layers and tensors tables are read (see below). */
#define KILN_RUN_CURVE_SAMPLES 1000

typedef struct kiln_run_curve {
    char *name; /* as kiln_run_series names it: "loss", "router_entropy@1",
                   "expert_load@0/3", "update_ratio@embed.weight" */
    size_t n;
    double *x, *y; /* x the steps, ascending; y NAN where the value was not finite */
} kiln_run_curve;

typedef struct kiln_run_curves {
    long first, last; /* the steps logged; 0 0: none */
    kiln_run_curve *c;
    size_t n;
    int n_layers, n_experts; /* of the layers table's first step; 0: none logged */
    /* The tensors whose update/weight ratio rose highest over the steps read, highest
     * first: their grad_norm@ and update_ratio@ curves are in c. */
    char **movers;
    size_t n_movers;
    bool sampled; /* layers and tensors were read at sampled steps */
    bool layers_summed; /* but the layers' scalar curves (not expert_load) came whole from
                           metrics.db's layer_sums, as the steps table's from step_sums */
    bool tensors_summed; /* and the tensors' curves (the movers by their true highest update
                            ratio) from tensor_sums */
} kiln_run_curves;

/* Every curve a run's page draws, in one read transaction (a trainer writing meanwhile is
 * not slowed: WAL readers take no lock it waits on). The steps table's columns are read
 * whole, each cut to `buckets` buckets of the step range with kiln_downsample (its smallest
 * and largest value, and its first non-finite one: never a mean), so a one-step spike in a
 * million survives. The layers and tensors tables hold a row per layer and per tensor per
 * step (27 million rows for a million steps of the default model): a run of more than
 * KILN_RUN_CURVE_SAMPLES steps has them read at that many evenly spaced steps plus every
 * spike's and non-finite step's (by their keys), so the page costs the same at any length.
 * The steps table's columns are kept in a kiln_rollup each (core.h), so the buckets are
 * powers of two steps wide and what is kept does not depend on when the rows were read.
 * max_movers (0: 8) tensors are chosen as movers. Steps after `to` are left out (0: none).
 * A run without metrics.db fails naming it. Release with kiln_run_curves_release. */
kiln_err kiln_run_curves_load(const char *run_dir, size_t buckets, size_t max_movers, long to,
                              kiln_run_curves *out);
void kiln_run_curves_release(kiln_run_curves *c);

/* What a long-lived reader (kiln runs serve) keeps between reads of the same runs: the steps
 * table's buckets of each of 16 runs (the least recently read given over), so that a reload
 * reads only the rows logged since (a million-step run's full read happens once). A new
 * metrics.db, a resume or fewer steps than before start that run over. Thread-safe. */
typedef struct kiln_run_cache kiln_run_cache;
kiln_err kiln_run_cache_create(kiln_run_cache **out);
void kiln_run_cache_free(kiln_run_cache *c); /* NULL is fine */
/* kiln_run_curves_load (every step) through the cache. */
kiln_err kiln_run_curves_load_cached(kiln_run_cache *cache, const char *run_dir, size_t buckets,
                                     size_t max_movers, kiln_run_curves *out);
/* The curve named name, or NULL. */
const kiln_run_curve *kiln_run_curve_find(const kiln_run_curves *c, const char *name);

/* A run summary (format "kiln-run-summary/1", docs/runs-web.md): the curves above up to
 * `step` (the checkpoint a model was exported from), each at most KILN_RUN_SUMMARY_POINTS
 * points (kiln_downsample), and the run's spikes, non-finite steps, resumes and device
 * changes up to it. Written to path (atomically) as compact JSON with sorted keys and reals
 * to 9 digits, with no time of writing in it: the same run and step give the same bytes.
 * kiln export and kiln release put it in the model directory as run_summary.json, where the
 * manifest lists it and the signature covers it. */
#define KILN_RUN_SUMMARY_POINTS 1000
#define KILN_RUN_SUMMARY_NAME "run_summary.json"
kiln_err kiln_run_summary_write(const char *run_dir, long step, const char *path);
/* As a kiln_export_opts.add_files callback: ctx is the run directory (const char *); writes
 * dir/run_summary.json, or nothing when the run has no metrics.db (nothing was logged). */
kiln_err kiln_run_summary_add(void *run_dir, long step, const char *dir);
/* Of the checkpoint steps[0..n) of run_dir, the one whose step logged the lowest finite
 * validation loss (ties: the later), the rule the trainer's pruning keeps and kiln runs show
 * names as the best checkpoint; KILN_ERR_NOTFOUND when none logged one. What kiln export
 * --best and kiln release --best freeze (kiln_export_opts.best_step). */
kiln_err kiln_run_best_ckpt(const char *run_dir, const long *steps, size_t n, long *best);

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

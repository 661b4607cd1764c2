/*
 * train.h - the trainer's face: datasets, the kiln-tsmoe/1 model (parameters, forward,
 * backward, diagnostics) and the training loop with its checkpoints and metrics.
 * Used by validate/ and cli/. Everything returns kiln_err; nothing prints or exits.
 */
#ifndef KILN_TRAIN_H
#define KILN_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

/* ==== datasets (train/dataset.c, train/synth.c) ==================================== */

/* A dataset file (DESIGN.md): safetensors with `features` [N,F] f32 and `targets` [N,O]
 * f32, rows in time order; __metadata__ may hold `kiln.columns`, a JSON object
 * {"features": [names], "targets": [names]}. */
typedef struct kiln_dataset {
    size_t rows;
    int n_features, n_outputs;
    float *features; /* [rows, F], aligned copy */
    float *targets;  /* [rows, O], aligned copy */
    char sha256[KILN_SHA256_HEX]; /* digest of the file's bytes */
    char *path;
    json_t *columns; /* NULL or {"features": [...], "targets": [...]} */
} kiln_dataset;

/* Open and validate: both tensors present, F32, 2-D, same row count, at least one row,
 * every value finite (a NaN or infinity is an error naming the tensor, row and column).
 * Free with kiln_dataset_free. */
kiln_err kiln_dataset_open(const char *path, kiln_dataset **out);
void kiln_dataset_free(kiln_dataset *ds);
/* Write a dataset atomically; columns may be NULL. */
kiln_err kiln_dataset_write(const char *path, size_t rows, int n_features, int n_outputs,
                            const float *features, const float *targets, const json_t *columns);

/* Train and validation splits, contiguous in time: training rows [0, train_end), a purge
 * gap of at least seq_len rows, then validation rows [val_begin, rows). With
 * val_fraction 0 there is no validation split (val_begin == val_end == rows). */
typedef struct kiln_split {
    size_t train_end;
    size_t val_begin, val_end;
} kiln_split;
kiln_err kiln_dataset_split(const kiln_dataset *ds, double val_fraction, int seq_len, kiln_split *out);

/* kiln_dataset_open with options: KILN_DATASET_ALLOW_NONFINITE keeps NaN and infinity
 * (for inspection; a trainer must use kiln_dataset_open). Free with kiln_dataset_free. */
enum { KILN_DATASET_ALLOW_NONFINITE = 1 };
kiln_err kiln_dataset_open_ex(const char *path, unsigned flags, kiln_dataset **out);
/* As kiln_dataset_write, with more __metadata__ entries: meta is NULL or a JSON object
 * whose values are stored as canonical JSON text under their keys ("kiln.synth"). Every
 * value must be finite; columns must name F features and O targets, each once. */
kiln_err kiln_dataset_write_meta(const char *path, size_t rows, int n_features, int n_outputs,
                                 const float *features, const float *targets,
                                 const json_t *columns, const json_t *meta);
/* The name of feature (target false) or target (target true) column i: from kiln.columns,
 * else "feature[i]" / "target[i]" formatted into buf. Returns a pointer valid while ds
 * and buf are. */
const char *kiln_dataset_column(const kiln_dataset *ds, bool target, int i, char *buf, size_t len);

/* One column's summary: moments over its finite values (population std), NaN when it
 * has none; non-finite values are counted, not summed. */
typedef struct kiln_column_stats {
    double mean, std, min, max;
    size_t n_nan, n_inf;
} kiln_column_stats;
/* stats[0..F) for the features, stats[F..F+O) for the targets. */
void kiln_dataset_stats(const kiln_dataset *ds, kiln_column_stats *stats);

/* Import a CSV file with a header row: the named columns become the features and the
 * targets, in the order given, and kiln.columns records the names. Read line by line
 * (memory holds the f32 values, not the text). Quoted fields are refused. Every value
 * must be a finite number; an error names the file, the line and the column. out_path
 * is written atomically: on any error an existing file there is left as it was. */
kiln_err kiln_dataset_import_csv(const char *csv_path, const char *const *features, int n_features,
                                 const char *const *targets, int n_outputs, const char *out_path);

/* The synthetic market (train/synth.c, where the process is documented). */
typedef struct kiln_synth_opts {
    uint64_t seed;
    size_t rows;
    int n_features; /* >= KILN_SYNTH_MIN_FEATURES; the rest are noise */
    int n_outputs;  /* target k is the forward return over 2^k steps */
} kiln_synth_opts;
#define KILN_SYNTH_MIN_FEATURES 4
#define KILN_SYNTH_MAX_FEATURES 1024
#define KILN_SYNTH_MAX_OUTPUTS 8
#define KILN_SYNTH_MIN_ROWS 100
/* R^2 over the validation split (the last 20% of rows), per target: */
typedef struct kiln_synth_r2 {
    double oracle[KILN_SYNTH_MAX_OUTPUTS];   /* E[target | past and present, true regime] */
    double filtered[KILN_SYNTH_MAX_OUTPUTS]; /* E[target | past and present observables] */
    double linear[KILN_SYNTH_MAX_OUTPUTS];   /* least squares on the current row, fit on the
                                                first 80% */
} kiln_synth_r2;
/* Generate and write a dataset (with kiln.columns and kiln.synth) to path atomically;
 * r2 may be NULL. The same options give the same bytes. */
kiln_err kiln_synth_write(const kiln_synth_opts *opts, const char *path, kiln_synth_r2 *r2);

/* ==== the network (train/model.c, kernels/) ========================================== */

typedef struct kiln_loss_opts {
    float aux_loss_coef;   /* MODEL.md, default 0.01 */
    float z_loss_coef;     /* MODEL.md, default 0.001 */
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
const kiln_model_config *kiln_tsmoe_config(const kiln_tsmoe *m);
const kiln_param *kiln_tsmoe_param_table(const kiln_tsmoe *m, size_t *count);
size_t kiln_tsmoe_numel(const kiln_tsmoe *m); /* floats in the parameter block */
float *kiln_tsmoe_params(kiln_tsmoe *m);      /* [numel] */
float *kiln_tsmoe_grads(kiln_tsmoe *m);       /* [numel], zero for untrained params */
/* MODEL.md initialisation from the seed (Philox, KILN_STREAM_INIT, counter = the element's
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

/* ==== the network on a CUDA device (train/model_cuda.c, kernels/cuda) ================
 * The same function as kiln_tsmoe (MODEL.md), with parameters, gradients and activations
 * each in one block of device memory, built from the kiln_cuda_* ops of kernels.h. It
 * agrees with the CPU network to float rounding (the router's choices exactly, given the
 * same probabilities), and two runs give the same bits. The device is driven by the thread
 * that created the network (kernels.h, "Context"): call every function on that thread.
 * In a build without CUDA, create fails with KILN_ERR_UNSUPPORTED; on a machine without a
 * usable GPU, with KILN_ERR_DEVICE and the driver's reason. */
typedef struct kiln_tsmoe_cuda kiln_tsmoe_cuda;

typedef enum kiln_precision {
    KILN_PRECISION_F32 = 0, /* every GEMM in f32 (no TF32) */
    KILN_PRECISION_BF16 = 1 /* GEMM operands rounded to bf16, f32 accumulation and outputs;
                               f32 master weights, router, norms, softmax and losses */
} kiln_precision;

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
kiln_err kiln_tsmoe_cuda_sync(kiln_tsmoe_cuda *m);

#endif

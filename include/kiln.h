/*
 * kiln.h - the public face of libkiln, what a trading service links against.
 *
 * Every function returns a kiln_err; on failure the detail (which file, which
 * tensor, which byte) is in kiln_errmsg(), a per-thread buffer valid until the
 * next failing call on the same thread. This header never pulls in CUDA, MPI or
 * CLI headers.
 */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KILN_API __attribute__((visibility("default")))
#define KILN_MUST_CHECK __attribute__((warn_unused_result))
#else
#define KILN_API
#define KILN_MUST_CHECK
#endif

#define KILN_VERSION "0.1.0"

/* Error codes: appended, never renumbered. */
typedef enum kiln_err {
    KILN_OK = 0,
    KILN_ERR_IO = 1,          /* a file or socket operation failed */
    KILN_ERR_NOMEM = 2,       /* allocation failed */
    KILN_ERR_FORMAT = 3,      /* bytes that do not follow their documented format */
    KILN_ERR_CONFIG = 4,      /* a config key, value or combination is invalid */
    KILN_ERR_USAGE = 5,       /* a caller passed arguments that make no sense */
    KILN_ERR_VERIFY = 6,      /* a check ran and failed: digest, signature, validation */
    KILN_ERR_NUMERIC = 7,     /* NaN, infinity or divergence */
    KILN_ERR_NOTFOUND = 8,    /* a named thing does not exist */
    KILN_ERR_UNSUPPORTED = 9, /* valid, but not supported by this build */
    KILN_ERR_CONFLICT = 10,   /* the thing exists already with other content */
    KILN_ERR_AUTH = 11,       /* missing or insufficient credentials */
    KILN_ERR_NETWORK = 12,    /* a connection or protocol failure */
    KILN_ERR_DEVICE = 13,     /* CUDA, cuBLAS or NCCL failed */
    KILN_ERR_INTERNAL = 14,   /* a bug in kiln */
    KILN_ERR_LIMIT = 15,      /* a size, count or length limit was exceeded */
    KILN_ERR_INTERRUPTED = 16 /* stopped by a signal or a caller's request */
} kiln_err;

/* A short static description of a code ("i/o error"). */
KILN_API const char *kiln_strerror(kiln_err code);

/* The message of the last failure on this thread; "" if none. */
KILN_API const char *kiln_errmsg(void);

/* The library's version string, KILN_VERSION at build time plus the git revision. */
KILN_API const char *kiln_version(void);

/* ---- the model (kiln-tsmoe/1, docs/model.md) ---- */

#define KILN_MODEL_FORMAT "kiln-tsmoe/1"

typedef struct kiln_model_config {
    int n_features;  /* F */
    int n_outputs;   /* O */
    int d_model;     /* D */
    int n_layers;    /* L */
    int n_heads;     /* H, D % H == 0 */
    int d_ff;        /* Fh */
    int n_experts;   /* E, 0 = dense */
    int top_k;       /* K, 0 when dense */
    int seq_len;     /* S */
    int attn_window; /* W, 1 <= W <= S */
    float norm_eps;  /* 1e-5 unless set */
} kiln_model_config;

/* ---- the runtime: a frozen model, batch forward, streams (runtime/) ----
 *
 * Threads: a kiln_model is read-only once kiln_model_open returns, so any number of
 * threads may call kiln_model_forward and kiln_stream_open/push on one model at the
 * same time, as long as each kiln_stream is used by one thread at a time (one stream
 * per instrument, per thread). Nothing in the runtime keeps global state. */

typedef struct kiln_model kiln_model;   /* opaque: the loaded, validated weights */
typedef struct kiln_stream kiln_stream; /* opaque: one sequence fed tick by tick */

/* Load a model: path is a model directory holding model.safetensors, or the
 * model.safetensors file itself. Checks the config (kiln.config in __metadata__) and
 * every tensor against docs/model.md: a missing tensor, an extra tensor, a wrong shape, a
 * wrong dtype, non-finite weights or a non-positive norm.in_std fail with a message
 * naming the file and the tensor. Weights are F32, or BF16 throughout (norm.in_* may
 * be F32 or BF16); bf16 weights stay bf16 in memory and are widened to f32 for
 * arithmetic. The weights are copied out of the file, which is closed on return.
 * Free *out with kiln_model_free. */
KILN_API kiln_err kiln_model_open(const char *path, kiln_model **out) KILN_MUST_CHECK;
/* Where a model runs. KILN_DEVICE_CPU, or the index of a CUDA device (0 = the first). */
#define KILN_DEVICE_CPU (-1)
typedef struct kiln_model_opts {
    int device; /* KILN_DEVICE_CPU (what kiln_model_open does) or a CUDA device index */
} kiln_model_opts;
/* kiln_model_open with options (opts NULL: the CPU). On a CUDA device the weights are also
 * copied to that GPU (bf16 widened to f32) and kiln_model_forward and every stream opened on
 * the model run there, with the same results as the CPU to f32 rounding: a batch forward
 * serialises on the model and opens the calling thread's CUDA context for the call (cuBLAS);
 * a stream captures one tick as a CUDA graph at open, so that each push is one graph launch
 * plus the copies of its features and outputs. A build without CUDA fails with
 * KILN_ERR_UNSUPPORTED, a machine without that GPU with KILN_ERR_DEVICE, before anything is
 * returned. Free with kiln_model_free. */
KILN_API kiln_err kiln_model_open_opts(const char *path, const kiln_model_opts *opts,
                                       kiln_model **out) KILN_MUST_CHECK;
/* The device a model runs on: KILN_DEVICE_CPU or a CUDA device index. */
KILN_API int kiln_model_device(const kiln_model *m);
/* Free a model (NULL does nothing). Every stream opened on it must be freed first. */
KILN_API void kiln_model_free(kiln_model *m);
/* The model's config; owned by the model, valid until kiln_model_free. */
KILN_API const kiln_model_config *kiln_model_config_get(const kiln_model *m);
/* True when the weight matrices are stored as bf16. */
KILN_API int kiln_model_is_bf16(const kiln_model *m);

/* Batch forward over B sequences of S steps: x [B,S,F] raw inputs, y [B,S,O] outputs.
 * S may be any length >= 1 (not only seq_len): every position attends to itself and
 * the attn_window-1 positions before it within its own sequence. Each sequence starts
 * from its first row, exactly as a fresh stream fed the same rows would. Non-finite
 * inputs are refused (KILN_ERR_NUMERIC, naming the position).
 * Workspace: allocated for the call and freed before it returns (kiln_model_forward),
 * or passed by the caller (kiln_model_forward_ws, ws of at least
 * kiln_model_workspace_size(m, B, S) bytes, any alignment). It runs on the calling
 * thread (no thread pool), whose stack must have 256 KiB to spare (the GEMM packs its
 * panels there), and gives the same bits on every x86-64 CPU with AVX2 and FMA.
 * Thread-safe: concurrent calls on one model are fine (with distinct ws). */
KILN_API kiln_err kiln_model_forward(const kiln_model *m, const float *x, int B, int S,
                                     float *y) KILN_MUST_CHECK;
KILN_API size_t kiln_model_workspace_size(const kiln_model *m, int B, int S);
KILN_API kiln_err kiln_model_forward_ws(const kiln_model *m, const float *x, int B, int S, float *y,
                                        void *ws, size_t ws_size) KILN_MUST_CHECK;

/* Open a stream on a model: per-layer key/value ring buffers of attn_window-1 entries
 * and every per-tick buffer are allocated here, once; pushes never allocate. The model
 * must outlive the stream. Free *out with kiln_stream_free. */
KILN_API kiln_err kiln_stream_open(const kiln_model *m, kiln_stream **out) KILN_MUST_CHECK;
/* Feed one tick: features [F] raw inputs in, outputs [O] out. The outputs equal row t of
 * the batch forward over every tick pushed since open (or reset), to float rounding;
 * each push costs the same however long the stream has run (single-threaded, no
 * allocation, O(L*(W*D + D^2 + expert work))). A non-finite feature is refused
 * (KILN_ERR_NUMERIC) and leaves the stream as it was. Not thread-safe per stream. */
KILN_API kiln_err kiln_stream_push(kiln_stream *s, const float *features,
                                   float *outputs) KILN_MUST_CHECK;
/* One tick for each of n streams of one model: streams[i] takes features + i*F and writes
 * outputs + i*O (features [n,F], outputs [n,O]). Each stream's outputs, rings, tick count
 * and state afterwards are bit for bit what kiln_stream_push on each stream in turn gives:
 * the same kernels on each stream's own vectors, summed in the same order. What it saves
 * is memory traffic: on the CPU each weight matrix is read from memory once per call
 * instead of once per stream (rows in cache-sized blocks, each block against every
 * stream; the experts the streams' routers chose run once each, over the streams that
 * chose them), so n instruments ticking together cost far less than n pushes once the
 * weights do not fit in cache. Attention, norms and routing stay per stream.
 * Refused before any stream changes (every input is checked first, so a bad row leaves
 * every stream as it was): a null array or stream, streams of different models, the same
 * stream twice (KILN_ERR_USAGE), a non-finite feature (KILN_ERR_NUMERIC, naming streams[i]
 * and the feature). n == 0 does nothing and succeeds (the pointers are not read).
 * Memory: none per call. The only extra buffers, top_k * (d_ff + d_model) floats per
 * stream for the experts' per-slot results, are part of each stream (kiln_stream_open),
 * and the call keeps no state outside its streams; so threads may push disjoint sets of
 * streams on one shared model at once (each stream used by one thread at a time).
 * On a CUDA model (kiln_model_open_opts) the streams are pushed in turn, with the same
 * results as kiln_stream_push; the weight sharing is CPU-only for now. A device error
 * there is returned naming streams[i], and streams before i have taken their tick. */
KILN_API kiln_err kiln_stream_push_many(kiln_stream *const *streams, size_t n,
                                        const float *features, float *outputs) KILN_MUST_CHECK;
/* Forget every tick: the next push is a sequence's first row again. No allocation. */
KILN_API void kiln_stream_reset(kiln_stream *s);
/* Ticks pushed since open or reset. */
KILN_API uint64_t kiln_stream_ticks(const kiln_stream *s);
/* Free a stream (NULL does nothing). */
KILN_API void kiln_stream_free(kiln_stream *s);

/* ---- pulling a model from a registry (registry/, docs/registry.md) ---- */

typedef struct kiln_pull_opts {
    /* "http://127.0.0.1:8080" (kiln's server), or an OCI registry: "oci://HOST/PREFIX",
     * "oci+http://127.0.0.1:5000/PREFIX" (docs/registry.md, "On an OCI registry") */
    const char *registry;
    const char *token; /* bearer token, or NULL where reads are open */
    /* "NAME@CHANNEL" or "NAME@VERSION", read by the name alone: a version begins with a
     * digit or with 'v' and a digit, anything else is a channel, and a channel the registry
     * lacks is an error, never a version of that name (docs/registry.md, "Names"). */
    const char *ref;
    const char *trust; /* trust policy (trust.json) */
    /* The model directory to create, or to replace: only an empty directory or a model
     * directory kiln installed (a manifest.json and the files it lists, nothing else);
     * anything else is KILN_ERR_CONFLICT, left as it is. */
    const char *out;
    const char *state; /* anti-rollback state directory; NULL: $HOME/.local/state/kiln */
    /* Mirrors (docs/registry.md, "Mirrors"): more registries, tried after registry (which may
     * then be NULL), in this order. A pull takes the newest channel record that verifies from
     * any of them, and the archive from the first that holds one that verifies; a registry
     * that is down, answers 5xx, is stale or serves what does not verify is passed over. */
    const char *const *registries;
    size_t nregistries;
    /* Hears each registry passed over and why, one line ("registry URL1: ...; trying URL2");
     * NULL: logged as a warning on stderr. */
    void (*on_registry)(void *ctx, const char *line);
    void *registry_ctx;
    /* How long one registry may take to answer a small request (a trust version, the channel
     * record) or leave a download without a byte, in milliseconds, before it is passed over
     * (or, alone, the pull fails); 0: 5 s for a small request and 10 s for a stall with
     * several registries, 60 s each with one. */
    unsigned timeout_ms;
    /* For https:// registries: a PEM file of the certificate authorities to trust (a private
     * CA); NULL: $KILN_REGISTRY_CA when set, else the system's. */
    const char *ca_file;
    /* Limits (docs/registry.md, "Limits"): the largest archive accepted, in bytes (0: 16 GiB;
     * a registry declaring more is refused, or passed over, before the download starts, and
     * no more than declared is read); the slowest transfer, in bytes a second averaged over
     * each timeout_ms window (0: 16 KiB/s; a registry that trickles is passed over); the most
     * a whole pull (with kiln_watch: each poll) may take, in milliseconds (0: 1 h). */
    uint64_t max_size;
    unsigned min_rate;
    unsigned deadline_ms;
} kiln_pull_opts;

/* An archive's digest as the registry writes it, "sha256:" and 64 lowercase hex digits and the
 * NUL (72 bytes): one type for every buffer that holds one, so that its size is written once.
 * An array type: a field of it is read and written as a string. */
typedef char kiln_digest[72];

typedef struct kiln_pull_result {
    char model[65], version[65], channel[65]; /* channel "" when pulled by version */
    kiln_digest digest;                       /* "sha256:<hex>" of the archive */
    uint64_t size;
    int64_t seq; /* the channel record's; 0 when pulled by version */
} kiln_pull_result;

/* Download a model and verify it before anything lands at opts->out, in this order: the
 * trust policy is walked forward from opts->trust through the signed versions this client
 * accepted before (opts->state/trust/N.json) and those the registry has since, each verified
 * against the one before (docs/registry.md); then, under the newest, the
 * channel record's signatures meet the policy's threshold, its seq is not lower than the
 * last this client accepted (kept in state), it has not expired, the archive's size and
 * digest match, the archive's signature, the manifest's, every file's digest; then the
 * model is unpacked into a temporary directory and renamed to opts->out. A failed check is
 * KILN_ERR_VERIFY and leaves out as it was. The download goes to
 * STATE/downloads/<hex>.partial, resumed after a broken connection within the pull and removed
 * when the pull fails (one a killed process left is resumed by the next pull of that archive).
 * result may be NULL. Safe to call from several threads with different outs. */
KILN_API KILN_MUST_CHECK kiln_err kiln_pull(const kiln_pull_opts *opts, kiln_pull_result *result);

/* ---- following a channel: pull, load and swap in new versions ---- */

typedef struct kiln_watch kiln_watch; /* opaque */

typedef struct kiln_watch_opts {
    kiln_pull_opts pull;  /* ref is "NAME@CHANNEL" (a version is refused); out is the watch's
                             own directory, one subdirectory per version loaded (gen-N): new,
                             empty, or one a watch used (any other entry is refused) */
    unsigned interval_ms; /* how often the channel is polled; 0: 30000 */
    /* Called from the watcher's thread after each attempted update: KILN_OK and the new
     * version when one was swapped in (message "serving NAME@VERSION (channel C, seq N)
     * sha256:..."), else the failure (the old model stays in service);
     * and once from kiln_watch_start when the start served the kept model offline, refused
     * it, or kept it because the channel's current version was refused (r NULL, below).
     * Also what the watch hears of the trust policy (each poll walks it forward first,
     * docs/registry.md): KILN_OK with r NULL when a new version of the policy was accepted
     * (message: which, and what changed), and a failure with r NULL when the policy did not
     * walk (nothing is pulled that poll) or the record in service no longer verifies under
     * the new policy (the model stays in service). May be NULL. */
    void (*on_update)(void *ctx, kiln_err rc, const char *message, const kiln_pull_result *r);
    void *ctx;
    /* A file the watcher's thread rewrites (atomically) with kiln_watch_metrics after the
     * start and after every poll: a node_exporter textfile (name it *.prom in its
     * directory). NULL: none. */
    const char *metrics_file;
} kiln_watch_opts;

/* Pull and load the channel's current version (synchronously: an error if that fails),
 * then poll the channel from a thread of its own. When a new record appears the new
 * version is pulled and verified exactly as kiln_pull does, loaded with kiln_model_open,
 * and only then made current; on any failure the old model stays in service. Free with
 * kiln_watch_stop.
 *
 * The model in service when the watch stops stays in pull.out (gen-N), for the next start
 * (docs/registry.md, "Starting without a registry"): when the channel still names it, it is
 * checked and loaded without a download; when no registry answers at all, it is checked
 * again without one (the trust policy this client holds, the channel record and archive
 * signatures its pull kept in pull.state: signatures, seq as accepted, not expired, the
 * manifest they sign, every file) and served, on_update hearing KILN_ERR_NETWORK and what is
 * served, and the watch polls on until a registry answers. A kept model that does not verify
 * is never served (on_update hears why when a pull replaced it). When the channel's current
 * version is refused at the start (it does not verify, or its model does not load), the kept
 * model is checked the same way and served, as a running watch keeps its model then, and
 * on_update hears why; the refused record is not tried again until a newer one comes. */
KILN_API kiln_err kiln_watch_start(const kiln_watch_opts *opts, kiln_watch **out) KILN_MUST_CHECK;
/* The model in service, held until kiln_watch_release; *generation (may be NULL) counts the
 * swaps from 1. A service keeps its streams on the model it acquired and, when the
 * generation changes, opens new streams on the new model and releases the old one, which
 * is freed once no one holds it (by the watcher's thread, with its directory: neither call
 * does file I/O or waits on more than a short lock, so both may sit on a tick's path). */
KILN_API const kiln_model *kiln_watch_acquire(kiln_watch *w, uint64_t *generation);
KILN_API void kiln_watch_release(kiln_watch *w, const kiln_model *m);
/* What generation (0: the one in service now) is: model, version, channel, the archive's
 * digest and size (0 when it was started from a kept model, whose archive is not at hand) and
 * the record's seq; a service logs it, or exports it as a metric. KILN_ERR_NOTFOUND when that
 * generation is no longer held by anyone. */
KILN_API kiln_err kiln_watch_serving(kiln_watch *w, uint64_t generation, kiln_pull_result *out);
/* Stop polling and free the watcher; every acquired model must have been released; the
 * directory of the model in service stays for the next start (the others go). NULL ok.
 * A poll in flight is cancelled (within about a second, even while a registry hangs) and
 * not reported to on_update. */
KILN_API void kiln_watch_stop(kiln_watch *w);
/* What the watch serves and how its polls go, in the Prometheus text format (caller frees;
 * NULL when out of memory), for a service's own /metrics or metrics_file: the version in
 * service (kiln_watch_info{model,channel,version,digest} 1), its generation, record seq and
 * expiry (unix time), polls, failed polls and how many in a row, the time of the last poll
 * that reached a registry, swaps, records or models refused, the trust policy's version, and
 * whether the start served the kept model with no registry answering (docs/registry.md,
 * "A service's metrics"). Takes the watch's lock briefly; no I/O. */
KILN_API char *kiln_watch_metrics(kiln_watch *w);

/* ---- datasets and runs, for bindings (data/data_api.c, runs/run_api.c; docs/python.md) ----
 *
 * What a notebook reads and writes, through the code the CLI runs: a dataset written here is
 * byte for byte what `kiln data import` writes for the same numbers and names, and the runs
 * list is the text `kiln runs list --json` prints. Nothing here prints. */

typedef struct kiln_data kiln_data; /* opaque: a dataset file, loaded and checked */

/* Write a dataset file (docs/data.md): `features` [rows,F] and `targets` [rows,O] F32, and,
 * when feature_names [F] and target_names [O] are given, kiln.columns with those names
 * (both or neither: one alone is KILN_ERR_USAGE). Refused before anything is written: no
 * rows, a non-finite value (naming its row and column), a name empty or used twice. Written
 * atomically (temp file, fsync, rename): on any failure an existing file stays as it was. */
KILN_API kiln_err kiln_data_write(const char *path, size_t rows, int n_features, int n_outputs,
                                  const float *features, const float *targets,
                                  const char *const *feature_names,
                                  const char *const *target_names) KILN_MUST_CHECK;
/* Open a dataset with every check kiln train makes (docs/data.md, "Validation"); the values
 * are copied out and the file closed. Free *out with kiln_data_free. */
KILN_API kiln_err kiln_data_open(const char *path, kiln_data **out) KILN_MUST_CHECK;
/* Free a dataset (NULL does nothing). */
KILN_API void kiln_data_free(kiln_data *d);
/* Rows, feature and target columns (each pointer may be NULL). */
KILN_API void kiln_data_shape(const kiln_data *d, size_t *rows, int *n_features, int *n_outputs);
/* features [rows,F] and targets [rows,O]; owned by d, valid until kiln_data_free. */
KILN_API const float *kiln_data_features(const kiln_data *d);
KILN_API const float *kiln_data_targets(const kiln_data *d);
/* Name of feature (target 0) or target (target 1) column i from kiln.columns; NULL when the
 * file has no kiln.columns or i is out of range. Owned by d. */
KILN_API const char *kiln_data_column(const kiln_data *d, int target, int i);
/* SHA-256 of the file's bytes, lowercase hex (what sha256sum prints); owned by d. */
KILN_API const char *kiln_data_sha256(const kiln_data *d);

/* A dataset's time and group columns (docs/data.md; data/time_api.c), as `kiln data import
 * --time COLUMN --group COLUMN` writes them. */
typedef struct kiln_data_extra {
    const int64_t *time;            /* [rows] seconds since 1970 (UTC), or NULL: no time column;
                                       0000-01-01 to 9999-12-31, non-decreasing within each group */
    const char *time_column;        /* the name kiln.time records (NULL: "time") */
    const int32_t *group;           /* [rows] 0, 1, ... in contiguous runs of rows, or NULL */
    int n_groups;                   /* with group: the last row's group + 1 */
    const char *const *group_names; /* [n_groups], with group */
    const char *group_column;       /* the name kiln.groups records (NULL: "group") */
} kiln_data_extra;
/* kiln_data_write with the time and group columns of x (NULL, or both fields NULL: none, and
 * the bytes are kiln_data_write's). The same numbers, names, times and groups give the bytes
 * `kiln data import --time --group` writes. Times and groups that kiln_data_open would refuse
 * are refused before anything is written (KILN_ERR_USAGE naming the row). */
KILN_API kiln_err kiln_data_write_extra(const char *path, size_t rows, int n_features,
                                        int n_outputs, const float *features, const float *targets,
                                        const char *const *feature_names,
                                        const char *const *target_names,
                                        const kiln_data_extra *x) KILN_MUST_CHECK;
/* The time column [rows] (NULL without one), and in *column (may be NULL) its name. Owned
 * by d. */
KILN_API const int64_t *kiln_data_time(const kiln_data *d, const char **column);
/* The group column [rows] (NULL without one), *n_groups (0 without) and *column its name
 * (each may be NULL). Owned by d. */
KILN_API const int32_t *kiln_data_groups(const kiln_data *d, int *n_groups, const char **column);
/* The name of group g; NULL without groups or when g is out of range. Owned by d. */
KILN_API const char *kiln_data_group_name(const kiln_data *d, int g);

/* How to split, as kiln train's config keys of the same names say (docs/data.md, "Train and
 * validation split"). */
typedef struct kiln_data_split_opts {
    double val_fraction;
    int seq_len;
    const char *val_from;   /* NULL or "": by val_fraction; else a time (needs time) */
    long purge_rows;        /* the gap in rows, at least seq_len (0: seq_len) */
    const char *purge_time; /* NULL or "": none; else a duration such as "10d" (needs time) */
} kiln_data_split_opts;
/* One group's rows (the whole dataset's without groups): training rows [train_begin,
 * train_end), validation rows [val_begin, val_end). A window of seq_len rows starting at s
 * trains when train_begin <= s and s + seq_len <= train_end. */
typedef struct kiln_data_range {
    size_t train_begin, train_end, val_begin, val_end;
} kiln_data_range;
typedef struct kiln_data_split_info {
    size_t n_ranges;                       /* ranges filled: n_groups, or 1 without groups */
    size_t train_rows, val_rows, gap_rows; /* totals over the ranges; gap_rows per range */
    int by_time;                           /* the validation starts at a time, val_from */
    int64_t val_from;                      /* (by_time) seconds since 1970 */
    size_t n_val;                          /* val_starts filled */
} kiln_data_split_info;
/* The train/validation split `kiln train` makes (kiln_dataset_split_ex) of a dataset of rows
 * with these time and group columns (each NULL: none; as kiln_data_time and kiln_data_groups
 * give them), into ranges [n_groups, or 1 without groups], and the fixed validation windows
 * the trainer evaluates on (up to val_cap; kiln train takes 256) into val_starts [val_cap].
 * path names the dataset in messages (NULL: "the dataset"). A split that leaves no training
 * or validation window, or columns kiln_data_open would refuse, is KILN_ERR_USAGE. */
KILN_API kiln_err kiln_data_split(const char *path, size_t rows, const int64_t *time,
                                  const int32_t *group, int n_groups, const kiln_data_split_opts *o,
                                  kiln_data_range *ranges, size_t *val_starts, size_t val_cap,
                                  kiln_data_split_info *info) KILN_MUST_CHECK;

/* One run directory as JSON text (caller frees with kiln_free): {"dir", "run": run.json,
 * "state": "finished" | "running" | "interrupted" | "diverged" | "failed", "message" (the
 * trainer's, for diverged and failed; else null), "step" (the newest logged; 0 none),
 * "checkpoints": [{"step", "path"}] ascending, "best_checkpoint": the step of the one
 * `kiln export --best` takes, or null}. Read-only, as `kiln runs show` reads: a run being
 * trained may be read. A directory without run.json fails naming it. */
KILN_API kiln_err kiln_run_read(const char *run_dir, char **json) KILN_MUST_CHECK;
/* `kiln runs list --json PATH...` with its --where (n_where "KEY=VALUE" filters), --sort
 * (NULL: val_loss) and --top (0: all): the same text, format "kiln-runs-list/1", into *json
 * (caller frees with kiln_free). A run that cannot be read is a row in state "error", not a
 * failure; a path that is no run and holds none, a bad filter or sort key fail. */
KILN_API kiln_err kiln_runs_list(const char *const *paths, size_t n_paths,
                                 const char *const *where, size_t n_where, const char *sort,
                                 size_t top, char **json) KILN_MUST_CHECK;
/* Free what a kiln_run_read or kiln_runs_list returned (NULL does nothing). */
KILN_API void kiln_free(void *p);

#ifdef __cplusplus
}
#endif
#endif /* KILN_H */

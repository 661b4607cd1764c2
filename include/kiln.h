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

/* ---- the model (kiln-tsmoe/1, MODEL.md) ---- */

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

/* ---- pulling a model from a registry (registry/, docs/registry.md) ---- */

typedef struct kiln_pull_opts {
    const char *registry; /* "http://127.0.0.1:8080" */
    const char *token;    /* bearer token, or NULL where reads are open */
    const char *ref;      /* "NAME@CHANNEL" or "NAME@VERSION" */
    const char *trust;    /* trust policy (trust.json) */
    const char *out;      /* the model directory to create or replace */
    const char *state;    /* anti-rollback state directory; NULL: $HOME/.local/state/kiln */
} kiln_pull_opts;

typedef struct kiln_pull_result {
    char model[65], version[65], channel[65]; /* channel "" when pulled by version */
    char digest[72];                          /* "sha256:<hex>" of the archive */
    uint64_t size;
    int64_t seq; /* the channel record's; 0 when pulled by version */
} kiln_pull_result;

/* Download a model and verify it before anything lands at opts->out, in this order: the
 * channel record's signatures meet the policy's threshold, its seq is not lower than the
 * last this client accepted (kept in state), it has not expired, the archive's size and
 * digest match, the archive's signature, the manifest's, every file's digest; then the
 * model is unpacked into a temporary directory and renamed to opts->out. A failed check is
 * KILN_ERR_VERIFY and leaves out as it was. A partial download is resumed on the next call.
 * result may be NULL. Safe to call from several threads with different outs. */
KILN_API KILN_MUST_CHECK kiln_err kiln_pull(const kiln_pull_opts *opts, kiln_pull_result *result);

#ifdef __cplusplus
}
#endif
#endif /* KILN_H */

/*
 * release.h - kiln release: a run (or a model directory made elsewhere) to a published and
 * optionally promoted version in one call: export, golden set, baseline, validation, pack,
 * sign, publish, promote. Each stage is a library call the CLI also offers on its own; this
 * module only sequences them, so it is the one layer above registry/, validate/ and export/
 * that uses them all (docs/architecture.md). Nothing here prints or exits.
 */
#ifndef KILN_RELEASE_H
#define KILN_RELEASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "registry.h"
#include "sign.h"
#include "validate.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kiln_release_stage {
    KILN_RELEASE_CHECK = 0, /* options, keys, policy, dataset, output directory, version free */
    KILN_RELEASE_EXPORT,    /* the run's checkpoint frozen into OUT/model */
    KILN_RELEASE_GOLDEN,    /* OUT/model/golden */
    KILN_RELEASE_BASELINE,  /* the baseline channel's model pulled and verified (if any) */
    KILN_RELEASE_VALIDATE,  /* OUT/model/validation.json, every check passed */
    KILN_RELEASE_PACK,      /* OUT/NAME-VERSION.kiln */
    KILN_RELEASE_SIGN,      /* OUT/NAME-VERSION.kiln.minisig, verified under the policy */
    KILN_RELEASE_PUBLISH,
    KILN_RELEASE_PROMOTE, /* if asked */
    KILN_RELEASE_DONE
} kiln_release_stage;

/* "check", "export", ..., "done". */
const char *kiln_release_stage_name(kiln_release_stage s);

typedef struct kiln_release_opts {
    const char *run_dir;
    long step; /* 0: the newest checkpoint that verifies; KILN_EXPORT_BEST: the best */
    const char *name, *version;
    const char *data;    /* NULL: the run's dataset (run.json's dataset_path) */
    const char *out_dir; /* new or empty: model/, NAME-VERSION.kiln and its .minisig go here */
    const char *trust;   /* the policy services pull with: the baseline is pulled under it, and
                            the signed archive must verify under it before it is published */
    const char *state;   /* pull state (anti-rollback) for the baseline; NULL: the default */
    const char *baseline_channel; /* NULL or "": validate without a baseline */
    const char *promote;          /* NULL, or the channel to point at the new version */
    const kiln_sign_seckey *const *release_keys; /* each signs the archive */
    size_t n_release_keys;
    const kiln_sign_seckey *const *promote_keys; /* each signs the channel record */
    size_t n_promote_keys;
    const kiln_registry_client_opts *client;  /* the registry, with a publish (or admin) token */
    const char *promote_token;                /* NULL: the client's token */
    int windows;                              /* golden windows; 0: 64 */
    uint64_t seed;                            /* golden window seed; 0: 1 */
    const struct kiln_thresholds *thresholds; /* NULL: defaults */
    bool no_bf16;                             /* skip the f32-vs-bf16 check */
    /* Called after each stage with one line saying what it did (may be NULL). */
    void (*on_stage)(void *ctx, kiln_release_stage stage, const char *line);
    void *ctx;
    /* Instead of run_dir (exactly one of the two): a model directory made elsewhere (say by
     * kiln.torch's save_model_dir): its model.safetensors and card.json are copied into
     * OUT/model at the export stage, and every later stage runs as for a run. Its dataset is
     * data, else the card's lineage.dataset_path. */
    const char *model_dir;
    /* NULL, or a research framework's outputs on the golden inputs: validation runs
     * parity_reference against it (kiln validate --reference). */
    const char *reference;
    /* Do not publish the training dataset (it must not leave this machine): the card's
     * lineage then says "dataset_withheld": true. Without it the publish stage first publishes
     * the dataset the run was trained on (signed by the first release key, named as the
     * model), unless the registry holds its digest already. */
    bool no_data;
} kiln_release_opts;

typedef struct kiln_release_result {
    kiln_release_stage stage;                  /* the stage that failed, or KILN_RELEASE_DONE */
    long step;                                 /* the checkpoint exported */
    char baseline[KILN_REGISTRY_NAME_MAX + 1]; /* the baseline's version; "" for none */
    int64_t baseline_seq;
    kiln_digest baseline_digest; /* its archive's "sha256:<hex>" (also in validation.json) */
    kiln_digest digest;          /* the published archive's "sha256:<hex>" */
    uint64_t size;
    bool existed;
    uint64_t promoted_seq; /* 0 when not promoted */
    /* The training dataset: "published", "held" (the registry had its digest), "withheld"
     * (no_data) or "not published: why"; its "sha256:<hex>". */
    char data[256];
    kiln_digest data_digest;
} kiln_release_result;

/* Run the stages in order and stop at the first failure: the error's message begins
 * "release stopped at stage 'S': " and res->stage says which. A failed validation is
 * KILN_ERR_VERIFY and publishes nothing (OUT/model/validation.json says why). */
kiln_err kiln_release_run(const kiln_release_opts *o, kiln_release_result *res);

/* ---- kiln reproduce (release/reproduce.c, docs/reproduce.md) ----
 * A published model rebuilt from its signed lineage: pull and verify it, train from scratch
 * on the dataset its card names by digest with the recorded config and seed to the recorded
 * step, export with the recorded name, dtype and creation time, pack with the released
 * archive's other files (run summary, golden set, validation report: records of the release,
 * carried across as signed), and compare model.safetensors and the archive byte for byte. */

struct kiln_train_progress;

typedef struct kiln_reproduce_opts {
    const kiln_registry_client_opts *client; /* the registry (a read token) */
    const char *ref;                         /* NAME@VERSION or NAME@CHANNEL */
    const char *trust;                       /* the policy the model must meet to be pulled */
    const char *state;                       /* pull state; NULL: the default */
    const char *data;    /* the dataset, its digest the card's dataset_sha256; NULL: pulled from
                            the registry by that digest (kiln_registry_data_pull) */
    const char *init;    /* the --init model, for a card whose lineage names one; else NULL */
    const char *workdir; /* absent or empty: released/, run/, model/, the archive go here */
    int threads;         /* 0: the trainer's default (every CPU this process may run on) */
    volatile int *stop;  /* NULL, or set non-zero to stop (KILN_ERR_INTERRUPTED) */
    /* NULL, or a key (the reproduce role) that signs a reproduction record of the verdict,
     * written to WORKDIR/reproduction.json and put to the registry (client's token: publish
     * scope), host naming this machine in it. */
    const kiln_sign_seckey *sign_key;
    const char *host;
    /* Called once a stage is done with one line saying what it did (may be NULL). */
    void (*on_stage)(void *ctx, const char *line);
    /* Each training step (may be NULL): for a progress bar and an ETA. */
    void (*progress)(void *ctx, const struct kiln_train_progress *p);
    void *ctx;
} kiln_reproduce_opts;

typedef struct kiln_reproduce_result {
    bool identical;      /* model.safetensors and the archive are byte-identical */
    bool model_same;     /* model.safetensors is */
    char model[KILN_REGISTRY_NAME_MAX + 1], version[KILN_REGISTRY_NAME_MAX + 1];
    kiln_digest digest;  /* the released archive's */
    kiln_digest rebuilt; /* the rebuilt archive's */
    long step;           /* the step trained to */
    /* Where they part, one line each ("" when nothing to say): the first tensor that differs
     * (name, index, both values); the card's fields that differ (lineage.code_version,
     * numerics, ...: released, then this build's); the first step whose loss differs from the
     * released run summary's. */
    char tensor[512], card[1024], loss[256];
    bool recorded; /* a signed reproduction record was put to the registry */
} kiln_reproduce_result;

/* Run a reproduction. KILN_OK with res->identical saying the verdict; an error (no such model,
 * a model kiln did not train, a dataset whose digest is not the card's, a GPU-trained model
 * without a GPU, an --init model missing or another) when it could not run: then nothing
 * was compared. */
kiln_err kiln_reproduce_run(const kiln_reproduce_opts *o, kiln_reproduce_result *res);

#ifdef __cplusplus
}
#endif
#endif /* KILN_RELEASE_H */

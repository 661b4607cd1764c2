/* validate_int.h - helpers shared by the files of the validate module only. */
#ifndef KILN_VALIDATE_INT_H
#define KILN_VALIDATE_INT_H

#include "data.h"
#include "train.h"
#include "validate.h"

/* A model directory opened for validation: its file, its card, the runtime's model (what
 * services run) and a trainer network holding the same weights (bf16 widened to f32
 * exactly), the reference the runtime is held to. */
typedef struct vmodel {
    char *dir;  /* the directory (or the file's directory) */
    char *file; /* its model.safetensors */
    char sha256[KILN_SHA256_HEX];
    kiln_model_config cfg;
    bool bf16;       /* the trained weights are stored as bf16 */
    json_t *card;    /* card.json, or NULL when the directory has none */
    kiln_tsmoe *net; /* the trainer's network, max_batch VBATCH */
    kiln_model *rt;  /* the runtime's model */
} vmodel;

#define VBATCH 16

/* Open path (a model directory or its model.safetensors). Release with vmodel_close. */
kiln_err kiln_vmodel_open(const char *path, vmodel *m);
void kiln_vmodel_close(vmodel *m);
/* The model's outputs, as a service computes them: the runtime's batch forward over n
 * windows of S steps (any S >= 1): x [n,S,F] -> y [n,S,O]. */
kiln_err kiln_vmodel_forward(vmodel *m, const float *x, size_t n, int S, float *y);
/* The same, also writing each row's router margins [n,S,L] (kiln_runtime_forward_margins). */
kiln_err kiln_vmodel_forward_margins(vmodel *m, const float *x, size_t n, int S, float *y,
                                     float *margins);
/* The runtime's streaming forward, one fresh stream per window fed tick by tick. */
kiln_err kiln_vmodel_stream_forward(vmodel *m, const float *x, size_t n, int S, float *y);
/* What kiln_vmodel_forward is, for reports. */
#define KILN_VMODEL_ENGINE "runtime batch forward (kiln_model_forward)"
/* The trainer's forward (eval: no targets, so no capacity limit) over n windows of the
 * model's seq_len: x [n,S,F] -> y [n,S,O]. */
kiln_err kiln_vmodel_trainer_forward(vmodel *m, const float *x, size_t n, float *y);
/* The validation fraction: the card's lineage.config.val_fraction, else the default. */
double kiln_vmodel_val_fraction(const vmodel *m);
/* The split the model's run trained and validated on, of ds: val_fraction (val_fraction >= 0
 * overrides the card's), and the card's val_from, purge_rows and purge_time where it has
 * them; with groups every instrument is split alike (kiln_dataset_split_ex, as the trainer
 * splits). The one split of golden make and validate. Release *sp with kiln_split_release. */
kiln_err kiln_vmodel_split(const vmodel *m, const kiln_dataset *ds, double val_fraction,
                           kiln_split *sp);
/* A split as golden.json and the validation report give it: train_end, val_begin and
 * val_end (0 with groups, as kiln_split has them), and with groups "ranges": each
 * instrument's [train_begin, train_end, val_begin, val_end]. New reference; NULL when out
 * of memory. */
json_t *kiln_vsplit_json(const kiln_split *sp);
/* A file of the model's directory ("golden/golden.json"); caller frees. */
char *kiln_vmodel_path(const vmodel *m, const char *rel);

/* Check that the dataset fits the model (feature and output counts). */
kiln_err kiln_vmodel_check_data(const vmodel *m, const kiln_dataset *ds);
/* Copy n windows of S rows starting at starts[] into x [n,S,F] and y [n,S,O]. */
void kiln_vgather(const kiln_dataset *ds, const size_t *starts, size_t n, int S, float *x,
                  float *y);
/* MSE of one window of count values, in double. */
double kiln_vmse(const float *y, const float *t, size_t count);

#endif

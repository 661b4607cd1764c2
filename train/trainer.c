/* trainer.c - the training loop: start or resume a run, step, validate, checkpoint, and
 * record diagnostics. A step's outcome depends only on the checkpointed state and the
 * step number (the data position), so a run killed at any moment and resumed ends with
 * the same bytes as one that never stopped. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train_int.h"

#define VAL_WINDOWS_MAX 256

typedef struct trainer {
    kiln_train_config cfg;
    const kiln_train_opts *opts;
    kiln_dataset *ds;
    kiln_split split;
    kiln_tsmoe *m;
    const kiln_param *tab;
    size_t np, numel;
    float *params, *grads;
    float *mom;         /* [2*numel]: m then v; NULL for SGD */
    float *x, *y;       /* [B,S,F], [B,S,O] */
    size_t *starts;     /* [B] */
    size_t *val_starts; /* [VAL_WINDOWS_MAX] */
    size_t n_val;
    /* Targets at any scale (docs/train.md): the network fits (y - tmean) / tstd, from the
     * training split at the start and from the checkpoint on resume (mean 0 and std 1 for a
     * checkpoint written before they were recorded); ds->targets are standardised in place. */
    float *tmean, *tstd;     /* [O] */
    double *val_r2_each;     /* [O] the last validation's R^2 per target */
    double *gn, *un, *wn;    /* [np] per-tensor gradient, update and weight norms */
    kiln_run_metrics_tensor *mt; /* [np] */
    /* A copy of the last training forward's diagnostics (validation overwrites the model's). */
    kiln_tsmoe_stats stats;
    float *stats_buf;
    kiln_run_metrics *mx;
    kiln_train_state st;
    char run_id[64];
    int lock_fd; /* flock on RUN_DIR/.lock: one process per run; -1 = none */
    /* A start made the run's files (and the directory itself, when new_dir): until its first
     * step they go again on a failure (unmake_run), so that no half-made run is left. */
    bool made_files, new_dir;
    /* Data parallelism (docs/train.md): this rank computes micro-batches rank*k .. rank*k+k-1
     * of the step's accum_steps, each into its own shard, and the shards are summed in
     * micro-batch order, so the bits do not depend on the rank count. */
    kiln_comm *comm;
    int k;                   /* micro-batches per rank */
    bool direct;             /* one process, one micro-batch: the model's gradient is the step's */
    float *shard_block;      /* [k, padded] */
    float **shards;          /* [k] views into shard_block */
    float *red_work;         /* kiln_dist_work_floats */
    size_t n_stats;          /* floats in stats_buf, max_abs_output last */
    double *info, *info_all; /* per step [1+4k] (loss, mse, lb, z per micro-batch), [size*(1+4k)] */
    size_t n_vchunks;        /* validation batches of batch_size windows, rank c % size does c */
    double *vpart, *vall, *vtot; /* [1+n_vchunks*(3O+1)], [size*(1+...)], [3O] */
    double *end, *end_all;       /* end of step [1+5]: stop, parameter digest; [size*6] */
    bool stop_agreed;            /* a rank was asked to stop */
    /* Device "cuda": the step runs on the GPU (trainer_cuda.c); m is then a host network
     * of batch 1 that only holds the parameters (init, checkpoints), and params and mom are
     * host mirrors refreshed before each checkpoint. */
    kiln_dev_train *dev;
    kiln_tsmoe_cuda *gnet; /* the device network (owned by dev) */
    float *yval;           /* [B,S,O] validation outputs brought back from the device */
    /* Device "cuda" with a device communicator (opts->device_comm; NCCL): the gradients are
     * reduced on the GPUs through dcomm (trainer_cuda.c), host values through comm. */
    int gpu, gpus;      /* this rank's GPU (local rank modulo the visible count), count */
    kiln_comm *dcomm;   /* owned */
    char gpu_note[256]; /* rank 0: where the ranks run, for the events */
} trainer;

static void trainer_free(trainer *t) {
    if (t->lock_fd >= 0) close(t->lock_fd);
    kiln_run_metrics_close(t->mx);
    kiln_comm_free(t->dcomm); /* before the device's context goes */
    kiln_dev_train_free(t->dev);
    free(t->yval);
    kiln_tsmoe_free(t->m);
    kiln_dataset_free(t->ds);
    kiln_split_release(&t->split);
    free(t->mom);
    free(t->x);
    free(t->y);
    free(t->starts);
    free(t->val_starts);
    free(t->tmean);
    free(t->tstd);
    free(t->val_r2_each);
    free(t->gn);
    free(t->un);
    free(t->wn);
    free(t->mt);
    free(t->stats_buf);
    free(t->shard_block);
    free(t->shards);
    free(t->red_work);
    free(t->info);
    free(t->info_all);
    free(t->vpart);
    free(t->vall);
    free(t->vtot);
    free(t->end);
    free(t->end_all);
}

/* ---- setup ---- */

static kiln_err resolve_shapes(kiln_train_config *c, const kiln_dataset *ds, const char *label) {
    if (!c->model.n_features) c->model.n_features = ds->n_features;
    if (!c->model.n_outputs) c->model.n_outputs = ds->n_outputs;
    KILN_FAIL_IF(c->model.n_features != ds->n_features, KILN_ERR_CONFIG,
                 "%s: config key 'n_features' is %d but dataset '%s' has %d features", label,
                 c->model.n_features, ds->path, ds->n_features);
    KILN_FAIL_IF(c->model.n_outputs != ds->n_outputs, KILN_ERR_CONFIG,
                 "%s: config key 'n_outputs' is %d but dataset '%s' has %d outputs", label,
                 c->model.n_outputs, ds->path, ds->n_outputs);
    return kiln_model_config_check(&c->model, label);
}

/* The buffers data parallelism needs (also with one process: the same shards, summed the
 * same way, are what make one process and N ranks agree bit for bit). */
static kiln_err setup_dist(trainer *t) {
    const kiln_comm *cm = t->comm;
    const int A = t->cfg.accum_steps, size = cm->size;
    const size_t O = (size_t)t->cfg.model.n_outputs, B = (size_t)t->cfg.batch_size;
    KILN_FAIL_IF(A % size, KILN_ERR_CONFIG,
                 "config key 'accum_steps' (%d) is not a multiple of the %d ranks (each rank "
                 "computes accum_steps / ranks micro-batches of batch_size windows)",
                 A, size);
    t->k = A / size;
    /* On a GPU the shards live on the device (kiln_dev_train_dist), none here. */
    t->direct = t->dev || (size == 1 && t->k == 1);
    if (!t->direct) {
        size_t padded = kiln_dist_padded(size, t->numel), total,
               work = kiln_dist_work_floats(size, t->k, t->numel);
        KILN_FAIL_IF(!padded || !kiln_mul_ok(padded, (size_t)t->k, &total) || (size > 1 && !work),
                     KILN_ERR_LIMIT, "gradient shards of %zu floats overflow", t->numel);
        t->shard_block = kiln_calloc(total, sizeof(float));
        t->shards = kiln_calloc((size_t)t->k, sizeof *t->shards);
        if (!t->shard_block || !t->shards) return KILN_ERR_NOMEM;
        for (int j = 0; j < t->k; j++)
            t->shards[j] = t->shard_block + (size_t)j * padded;
        if (work && !(t->red_work = kiln_malloc(work * sizeof(float)))) return KILN_ERR_NOMEM;
    }
    const size_t rec = 1 + 4 * (size_t)t->k;
    t->n_vchunks = (t->n_val + B - 1) / B;
    const size_t vrec = 1 + t->n_vchunks * (3 * O + 1);
    t->info = kiln_calloc(rec, sizeof(double));
    t->info_all = kiln_calloc((size_t)size * rec, sizeof(double));
    t->vpart = kiln_calloc(vrec, sizeof(double));
    t->vall = kiln_calloc((size_t)size * vrec, sizeof(double));
    t->vtot = kiln_calloc(3 * O, sizeof(double));
    t->end = kiln_calloc(6, sizeof(double));
    t->end_all = kiln_calloc((size_t)size * 6, sizeof(double));
    if (!t->info || !t->info_all || !t->vpart || !t->vall || !t->vtot || !t->end || !t->end_all)
        return KILN_ERR_NOMEM;
    return KILN_OK;
}

/* Model, buffers, split and validation windows for t->cfg over t->ds. */
static kiln_err setup(trainer *t) {
    const kiln_train_config *c = &t->cfg;
    const int S = c->model.seq_len, B = c->batch_size, F = c->model.n_features,
              O = c->model.n_outputs;
    kiln_split_opts so;
    KILN_TRY(kiln_train_split_opts(c, &so));
    KILN_TRY(kiln_dataset_split_ex(t->ds, &so, &t->split));
    KILN_FAIL_IF(!t->split.n_ranges && t->split.train_end < (size_t)S, KILN_ERR_CONFIG,
                 "dataset '%s': the training split has %zu rows, fewer than seq_len %d",
                 t->ds->path, t->split.train_end, S);
    if (c->device == KILN_TRAIN_CUDA) {
        KILN_FAIL_IF(t->comm->size > 1 && !t->opts->device_comm, KILN_ERR_UNSUPPORTED,
                     "config key 'device' is \"cuda\": training one run on %d ranks of GPUs "
                     "needs a device communicator (NCCL), and none was given",
                     t->comm->size);
        (void)kiln_dev_train_pick(t->opts->local_rank, &t->gpu, &t->gpus); /* create says */
        kiln_err rc = kiln_dev_train_create(c, t->gpu, &t->dev);
        if (rc) return kiln_errprefix(rc, "cannot train on device \"cuda\": ");
        t->gnet = kiln_dev_train_net(t->dev);
        if (!(t->yval = kiln_malloc((size_t)B * S * O * sizeof(float)))) return KILN_ERR_NOMEM;
    }
    KILN_TRY(kiln_tsmoe_create(&c->model, t->dev ? 1 : B, &t->m));
    t->tab = kiln_tsmoe_param_table(t->m, &t->np);
    t->numel = kiln_tsmoe_numel(t->m);
    t->params = kiln_tsmoe_params(t->m);
    t->grads = kiln_tsmoe_grads(t->m);
    if (c->optimizer == KILN_OPTIM_ADAMW && !(t->mom = kiln_calloc(2 * t->numel, sizeof(float))))
        return KILN_ERR_NOMEM;
    size_t L = (size_t)c->model.n_layers, E = (size_t)c->model.n_experts;
    t->x = kiln_malloc((size_t)B * S * F * sizeof(float));
    t->y = kiln_malloc((size_t)B * S * O * sizeof(float));
    t->starts = kiln_calloc((size_t)B, sizeof(size_t));
    t->val_starts = kiln_calloc(VAL_WINDOWS_MAX, sizeof(size_t));
    t->tmean = kiln_calloc((size_t)O, sizeof(float));
    t->tstd = kiln_calloc((size_t)O, sizeof(float));
    t->val_r2_each = kiln_calloc((size_t)O, sizeof(double));
    if (!t->tmean || !t->tstd || !t->val_r2_each) return KILN_ERR_NOMEM;
    for (int o = 0; o < O; o++)
        t->tstd[o] = 1;
    t->gn = kiln_calloc(t->np, sizeof(double));
    t->un = kiln_calloc(t->np, sizeof(double));
    t->wn = kiln_calloc(t->np, sizeof(double));
    t->mt = kiln_calloc(t->np, sizeof *t->mt);
    t->n_stats = 5 * L + L * (E ? E : 1) + 1;
    t->stats_buf = kiln_calloc(t->n_stats, sizeof(float));
    if (!t->x || !t->y || !t->starts || !t->val_starts || !t->gn || !t->un || !t->wn || !t->mt ||
        !t->stats_buf)
        return KILN_ERR_NOMEM;
    t->n_val = kiln_train_val_windows(&t->split, S, VAL_WINDOWS_MAX, t->val_starts);
    KILN_TRY(setup_dist(t));
    if (!t->dev) {
        /* Before the step's threads start: a run that cannot fit is refused, not failed later. */
        uint64_t shards =
            t->shard_block
                ? (uint64_t)t->k * kiln_dist_padded(t->comm->size, t->numel) * sizeof(float)
                : 0;
        uint64_t bytes = kiln_tsmoe_bytes(t->m) + (t->mom ? 2 * t->numel * sizeof(float) : 0) +
                         (size_t)B * S * (F + O) * sizeof(float) + shards;
        char what[64];
        snprintf(what, sizeof what, "batch_size %d", B);
        KILN_TRY(kiln_train_check_memory(bytes, kiln_train_threads(c), "this run", what,
                                         "lower batch_size or threads, or raise the limit"));
    }
    /* The step's work items run on `threads` threads, each GEMM on its item's thread
     * (kiln_tsmoe_create): the checkpoints do not depend on the count (docs/train.md). A
     * run on a GPU never steps its host model, which stays on one thread. */
    return t->dev ? KILN_OK : kiln_tsmoe_set_threads(t->m, kiln_train_threads(c));
}

/* Mean and population standard deviation of column j of a [rows, width] table over the
 * training split's rows, summed in double in row order (two passes). */
static void train_column_stats(const trainer *t, const float *table, size_t width, size_t j,
                               double *mu, double *sd) {
    const size_t n = t->split.train_rows;
    kiln_split_range one;
    size_t nr;
    const kiln_split_range *rg = kiln_split_ranges(&t->split, &one, &nr);
    double s = 0, ss = 0;
    for (size_t g = 0; g < nr; g++)
        for (size_t r = rg[g].train_begin; r < rg[g].train_end; r++)
            s += table[r * width + j];
    *mu = s / (double)n;
    for (size_t g = 0; g < nr; g++)
        for (size_t r = rg[g].train_begin; r < rg[g].train_end; r++) {
            double d = table[r * width + j] - *mu;
            ss += d * d;
        }
    *sd = sqrt(ss / (double)n);
}

/* norm.in_mean / norm.in_std from the training split (population std, floored). */
static void set_input_norm(trainer *t) {
    const size_t F = (size_t)t->ds->n_features;
    float *mean = t->params + t->tab[0].offset, *std = t->params + t->tab[1].offset;
    for (size_t f = 0; f < F; f++) {
        double mu, sd;
        train_column_stats(t, t->ds->features, F, f, &mu, &sd);
        mean[f] = (float)mu;
        std[f] = (float)(sd > 1e-6 ? sd : 1e-6);
    }
}

/* tmean / tstd from the training split's targets (population std; a constant target keeps
 * std 1). */
static void set_target_norm(trainer *t) {
    const size_t O = (size_t)t->ds->n_outputs;
    for (size_t o = 0; o < O; o++) {
        double mu, sd;
        train_column_stats(t, t->ds->targets, O, o, &mu, &sd);
        t->tmean[o] = (float)mu;
        t->tstd[o] = sd > 0 && (float)sd > 0 ? (float)sd : 1.0f;
    }
}

/* The dataset's targets to (y - tmean) / tstd, in place, on every rank. Mean 0 and std 1
 * leave every bit as it was. */
static void standardize_targets(trainer *t) {
    const size_t O = (size_t)t->ds->n_outputs;
    for (size_t r = 0; r < t->ds->rows; r++)
        for (size_t o = 0; o < O; o++) {
            float *y = &t->ds->targets[r * O + o];
            *y = (*y - t->tmean[o]) / t->tstd[o];
        }
}

/* An --init model predicts in the data's units (export folded its run's scaling into the
 * head): unfold this run's, W = W' / std and b = (b' - mean) / std, so that the network
 * starts where the model was. */
static void unfold_head(trainer *t) {
    long w = kiln_param_find(t->tab, t->np, "head.weight"),
         b = kiln_param_find(t->tab, t->np, "head.bias");
    if (w < 0 || b < 0) return;
    const size_t O = (size_t)t->cfg.model.n_outputs, D = (size_t)t->cfg.model.d_model;
    float *hw = t->params + t->tab[w].offset, *hb = t->params + t->tab[b].offset;
    for (size_t o = 0; o < O; o++) {
        for (size_t d = 0; d < D; d++)
            hw[o * D + d] /= t->tstd[o];
        hb[o] = (hb[o] - t->tmean[o]) / t->tstd[o];
    }
}

#define MODEL_INTS(X)                                                                              \
    X(n_features)                                                                                  \
    X(n_outputs)                                                                                   \
    X(d_model) X(n_layers) X(n_heads) X(d_ff) X(n_experts) X(top_k) X(seq_len) X(attn_window)

static kiln_err load_init(trainer *t, const char *path, char sha_hex[KILN_SHA256_HEX]) {
    kiln_st *st;
    KILN_TRY(kiln_st_open(path, &st));
    kiln_model_config mc;
    kiln_err rc = kiln_model_config_from_st(st, &mc);
    const kiln_model_config *want = &t->cfg.model;
#define SAME(k)                                                                                    \
    if (!rc && mc.k != want->k)                                                                    \
        rc = kiln_fail(KILN_ERR_CONFIG,                                                            \
                       "'%s': config key '" #k                                                     \
                       "' is %d in the model file but %d in the run's config",                     \
                       path, mc.k, want->k);
    MODEL_INTS(SAME)
#undef SAME
    if (!rc && mc.norm_eps != want->norm_eps)
        rc = kiln_fail(
            KILN_ERR_CONFIG,
            "'%s': config key 'norm_eps' is %g in the model file but %g in the run's config", path,
            (double)mc.norm_eps, (double)want->norm_eps);
    for (size_t i = 0; !rc && i < t->np; i++) {
        const kiln_param *p = &t->tab[i];
        const kiln_tensor *x = kiln_st_find(st, p->name);
        if (!x) {
            rc = kiln_fail(KILN_ERR_FORMAT, "'%s': no tensor '%s'", path, p->name);
            break;
        }
        bool shape_ok = x->ndim == p->ndim;
        for (int d = 0; shape_ok && d < p->ndim; d++)
            shape_ok = x->shape[d] == p->shape[d];
        if (!shape_ok)
            rc = kiln_fail(KILN_ERR_FORMAT, "'%s': tensor '%s' has the wrong shape", path, p->name);
        else
            rc = kiln_tensor_to_f32(x, t->params + p->offset);
    }
    kiln_st_close(st);
    if (!rc) {
        uint8_t d[KILN_SHA256_BYTES];
        rc = kiln_sha256_file(path, d);
        if (!rc) kiln_hex(d, sizeof d, sha_hex);
    }
    return rc;
}

/* ---- the step ---- */

static void copy_stats(trainer *t) {
    const kiln_tsmoe_stats *s =
        t->dev ? kiln_tsmoe_cuda_last_stats(t->gnet) : kiln_tsmoe_last_stats(t->m);
    size_t L = (size_t)s->n_layers, E = (size_t)s->n_experts;
    float *b = t->stats_buf;
    t->stats.n_layers = s->n_layers;
    t->stats.n_experts = s->n_experts;
    t->stats.max_abs_output = s->max_abs_output;
#define CP(field, n)                                                                               \
    if (s->field)                                                                                  \
        memcpy(b, s->field, (n) * sizeof(float));                                                  \
    else                                                                                           \
        memset(b, 0, (n) * sizeof(float));                                                         \
    t->stats.field = b;                                                                            \
    b += (n);
    CP(attn_entropy, L)
    CP(router_entropy, L)
    CP(overflow, L)
    CP(act_rms, L)
    CP(expert_load, L * E)
#undef CP
    t->stats_buf[t->n_stats - 1] = s->max_abs_output;
}

/* Validation MSE and R^2 (1 - SSE/SST per output, averaged) over the fixed windows, in
 * batches of batch_size windows: rank r computes batches r, r + size, ..., and every batch's
 * sums are added in batch order, so any rank count gives the same bits. */
static kiln_err validate(trainer *t, double *val_mse, double *val_r2) {
    const int S = t->cfg.model.seq_len, B = t->cfg.batch_size, O = t->cfg.model.n_outputs;
    const size_t rec = 3 * (size_t)O + 1, vrec = 1 + t->n_vchunks * rec;
    kiln_comm *cm = t->comm;
    kiln_loss_opts lo = {(float)t->cfg.aux_loss_coef, (float)t->cfg.z_loss_coef,
                         0.0f}; /* dropless */
    kiln_err rc = KILN_OK;
    memset(t->vpart, 0, vrec * sizeof *t->vpart);
    for (size_t ch = (size_t)cm->rank; ch < t->n_vchunks; ch += (size_t)cm->size) {
        size_t w = ch * (size_t)B, n = t->n_val - w < (size_t)B ? t->n_val - w : (size_t)B;
        kiln_train_gather(t->ds, t->val_starts + w, n, S, t->x, t->y);
        const float *out;
        if (t->dev) {
            if ((rc = kiln_tsmoe_cuda_forward(t->gnet, t->x, NULL, (int)n, &lo, NULL)) ||
                (rc = kiln_tsmoe_cuda_outputs(t->gnet, t->yval)))
                break;
            out = t->yval;
        } else {
            if ((rc = kiln_tsmoe_forward(t->m, t->x, NULL, (int)n, &lo, NULL))) break;
            out = kiln_tsmoe_outputs(t->m);
        }
        double *e = t->vpart + 1 + ch * rec, *su = e + O, *sq = e + 2 * O;
        for (size_t k = 0; k < n * (size_t)S; k++)
            for (int o = 0; o < O; o++) {
                double yv = t->y[k * O + o], d = out[k * O + o] - yv;
                e[o] += d * d;
                su[o] += yv;
                sq[o] += yv * yv;
            }
        e[3 * O] = (double)n * S;
    }
    KILN_TRY(kiln_dist_agree(cm, rc, t->vpart, vrec - 1, t->vall));
    double *e = t->vtot, *su = e + O, *sq = e + 2 * O, cnt = 0;
    memset(t->vtot, 0, 3 * (size_t)O * sizeof *t->vtot);
    for (size_t ch = 0; ch < t->n_vchunks; ch++) {
        const double *q = t->vall + (ch % (size_t)cm->size) * vrec + 1 + ch * rec;
        for (size_t x = 0; x < 3 * (size_t)O; x++)
            e[x] += q[x];
        cnt += q[3 * O];
    }
    double tot = 0, r2 = 0;
    for (int o = 0; o < O; o++) {
        tot += e[o];
        double sst = sq[o] - su[o] * su[o] / cnt;
        t->val_r2_each[o] = sst > 0 ? 1.0 - e[o] / sst : 0.0;
        r2 += t->val_r2_each[o];
    }
    *val_mse = tot / (cnt * O);
    *val_r2 = r2 / O;
    return KILN_OK;
}

static bool poisoned(const kiln_train_opts *o, long step) {
    for (size_t i = 0; i < o->n_poison; i++)
        if (o->poison_steps[i] == step) return true;
    return false;
}

static void event(trainer *t, long step, const char *kind, const char *fmt, ...) KILN_PRINTF(4, 5);
static void event(trainer *t, long step, const char *kind, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (t->comm->rank != 0) return; /* every rank saw it; rank 0 reports it */
    kiln_warn("%s", msg);
    if (t->mx && kiln_run_metrics_event(t->mx, step, kind, msg)) kiln_warn("%s", kiln_errmsg());
}

/* Keep the newest cfg.keep checkpoints and the one whose step logged the best validation
 * loss (docs/train.md "Checkpoints"), so that a run that got worse keeps its best. */
static kiln_err prune(trainer *t, const char *run_dir) {
    if (t->cfg.keep <= 0) return KILN_OK;
    long *steps = NULL, best = -1;
    size_t n = 0;
    KILN_TRY(kiln_run_ckpt_list(run_dir, &steps, &n));
    kiln_err rc = t->mx ? kiln_run_metrics_best_val_step(t->mx, steps, n, &best) : KILN_OK;
    free(steps);
    return rc ? rc : kiln_ckpt_prune(run_dir, t->cfg.keep, best);
}

static kiln_err checkpoint(trainer *t, const char *run_dir) {
    char *path = kiln_run_ckpt_path(run_dir, t->st.step);
    if (!path) return KILN_ERR_NOMEM;
    kiln_ckpt_meta meta = {&t->cfg, t->ds->sha256, t->run_id, &t->st, t->tmean, t->tstd};
    kiln_err rc = t->dev ? kiln_dev_train_download(t->dev, t->params, t->mom) : KILN_OK;
    if (!rc)
        rc = kiln_ckpt_write(path, t->tab, t->np, t->params, t->mom,
                             t->mom ? t->mom + t->numel : NULL, &meta);
    free(path);
    if (!rc) rc = prune(t, run_dir);
    return rc;
}

/* Digest of the parameters and moments into d[0..4) (32 bytes), to check that the ranks
 * still hold the same state. */
static void state_digest(const trainer *t, double *d) {
    uint8_t h[32];
    kiln_blake2b(t->params, t->numel * sizeof(float), h, 16);
    if (t->mom)
        kiln_blake2b(t->mom, 2 * t->numel * sizeof(float), h + 16, 16);
    else
        memset(h + 16, 0, 16);
    memcpy(d, h, sizeof h);
}

/* ---- one training step, in the order the loop runs them ---- */

/* Before the first step on a GPU: the parameters up, the gradient reduction set, and where
 * the ranks run noted in the events. */
static kiln_err devices_start(trainer *t) {
    if (!t->dev) return KILN_OK;
    KILN_TRY(kiln_dev_train_upload(t->dev, t->params, t->mom));
    if (t->dcomm || t->k > 1)
        KILN_TRY(kiln_dev_train_dist(t->dev, t->dcomm, t->k, t->opts->bucket_bytes));
    if (t->gpu_note[0] && t->mx &&
        kiln_run_metrics_event(t->mx, t->st.step, "devices", t->gpu_note))
        kiln_warn("%s", kiln_errmsg());
    if (strstr(t->gpu_note, "GPUs are shared")) kiln_warn("%s", t->gpu_note);
    return KILN_OK;
}

/* A stop was asked for: rank 0 writes a checkpoint of the last step, every rank agrees, and
 * the run ends with KILN_ERR_INTERRUPTED. */
static kiln_err interrupt(trainer *t) {
    kiln_comm *cm = t->comm;
    KILN_TRY(kiln_dist_agree(cm, cm->rank == 0 ? checkpoint(t, t->opts->run_dir) : KILN_OK, t->end,
                             5, t->end_all));
    return kiln_fail(KILN_ERR_INTERRUPTED, "'%s': interrupted at step %ld (checkpoint written)",
                     t->opts->run_dir, t->st.step);
}

/* This rank's k micro-batches of step i + 1 (0-based i), forward and backward, each
 * gradient into its own shard and its losses into t->info. The error is not returned at
 * once: the ranks agree on it first (sum_micro_batches). */
static kiln_err micro_batches(trainer *t, long i, const kiln_loss_opts *lo) {
    const kiln_train_config *c = &t->cfg;
    const int B = c->batch_size, S = c->model.seq_len, A = c->accum_steps, slots = B * A;
    kiln_err rc = KILN_OK;
    for (int j = 0; j < t->k && !rc; j++) {
        const int a = t->comm->rank * t->k + j;
        if (!t->dev)
            kiln_tsmoe_zero_grads(t->m);
        else
            rc = kiln_dev_train_micro_begin(t->dev, j);
        for (int b = 0; b < B; b++)
            t->starts[b] = kiln_train_window_split(c->seed, i, slots, a * B + b, &t->split, S);
        kiln_train_gather(t->ds, t->starts, (size_t)B, S, t->x, t->y);
        kiln_loss l;
        if (t->dev) {
            if (!rc) rc = kiln_tsmoe_cuda_forward(t->gnet, t->x, t->y, B, lo, &l);
            if (!rc) rc = kiln_tsmoe_cuda_backward(t->gnet, 1.0f / (float)A);
            if (!rc) rc = kiln_dev_train_micro_end(t->dev, j);
        } else {
            rc = kiln_tsmoe_forward(t->m, t->x, t->y, B, lo, &l);
            if (!rc) rc = kiln_tsmoe_backward(t->m, 1.0f / (float)A);
        }
        if (rc) break;
        double *q = t->info + 1 + 4 * j;
        q[0] = l.loss, q[1] = l.mse, q[2] = l.load_balance, q[3] = l.z;
        if (!t->direct) memcpy(t->shards[j], t->grads, t->numel * sizeof(float));
    }
    return rc;
}

/* The ranks agree on the micro-batches' outcome (rc), the step's losses are their mean over
 * all accum_steps micro-batches, and the shards are summed into the step's gradient. */
static kiln_err sum_micro_batches(trainer *t, kiln_err rc, kiln_train_progress *p) {
    const int A = t->cfg.accum_steps, k = t->k;
    const size_t rec = 1 + 4 * (size_t)k;
    KILN_TRY(kiln_dist_agree(t->comm, rc, t->info, rec - 1, t->info_all));
    for (int a = 0; a < A; a++) {
        const double *q = t->info_all + (size_t)(a / k) * rec + 1 + 4 * (a % k);
        p->loss += q[0] / A;
        p->mse += q[1] / A;
        p->load_balance += q[2] / A;
        p->z += q[3] / A;
    }
    if (!t->direct)
        KILN_TRY(kiln_dist_sum_shards(t->comm, t->shards, k, t->numel, t->grads, t->red_work));
    return KILN_OK;
}

/* Where the reduction overlaps the backward pass, noted once per run (or resume). */
static void note_buckets(trainer *t, long s) {
    size_t nb, early, bytes;
    kiln_dev_train_buckets(t->dev, &nb, &early, &bytes);
    char msg[192];
    snprintf(msg, sizeof msg,
             "%zu gradient bucket%s of at most %zu bytes; %zu queued during the backward "
             "pass, %zu after it",
             nb, nb == 1 ? "" : "s", bytes, early, nb - early);
    if (kiln_run_metrics_event(t->mx, s, "buckets", msg)) kiln_warn("%s", kiln_errmsg());
}

/* The diagnostics are the last micro-batch's: the last rank's, sent to every rank. */
static kiln_err share_stats(trainer *t) {
    kiln_comm *cm = t->comm;
    copy_stats(t);
    if (cm->size > 1) {
        KILN_TRY(cm->bcast(cm, t->stats_buf, t->n_stats * sizeof(float), cm->size - 1));
        t->stats.max_abs_output = t->stats_buf[t->n_stats - 1];
    }
    return KILN_OK;
}

/* Tests (opts->poison_steps): the first trained tensor's first gradient made NaN. */
static kiln_err poison_gradient(trainer *t) {
    for (size_t q = 0; q < t->np; q++)
        if (t->tab[q].flags & KILN_PARAM_TRAINED) {
            if (t->dev)
                KILN_TRY(kiln_dev_train_poison(t->dev, t->tab[q].offset));
            else
                t->grads[t->tab[q].offset] = NAN;
            break;
        }
    return KILN_OK;
}

/* The optimizer step with the gradient clipped to cfg.grad_clip; per-tensor update and
 * weight norms into t->un and t->wn. */
static kiln_err apply_update(trainer *t, kiln_train_progress *p) {
    const kiln_train_config *c = &t->cfg;
    const bool clip = c->grad_clip > 0 && p->grad_norm > c->grad_clip;
    const float scale = clip ? (float)(c->grad_clip / p->grad_norm) : 1.0f;
    t->st.updates++;
    if (t->dev) {
        KILN_TRY(kiln_dev_train_step(t->dev, c, t->tab, t->st.updates, p->lr, scale, t->un, t->wn));
    } else {
        if (clip) kiln_train_grad_scale_run(kiln_tsmoe_pool(t->m), t->tab, t->np, t->grads, scale);
        kiln_train_optim_run(kiln_tsmoe_pool(t->m), c, t->tab, t->np, t->params, t->grads, t->mom,
                             t->mom ? t->mom + t->numel : NULL, t->st.updates, p->lr, t->un, t->wn);
    }
    p->applied = true;
    return KILN_OK;
}

/* The gradient norm, then the update unless the step is not finite (skipped and counted in
 * the bad streak) or a spike that cfg.skip_spikes skips; both are events. */
static kiln_err update(trainer *t, long s, kiln_train_progress *p) {
    const kiln_train_config *c = &t->cfg;
    if (t->dev)
        KILN_TRY(kiln_dev_train_grad_norm(t->dev, t->tab, t->gn, &p->grad_norm));
    else
        p->grad_norm =
            kiln_train_grad_norm_run(kiln_tsmoe_pool(t->m), t->tab, t->np, t->grads, t->gn);
    memset(t->un, 0, t->np * sizeof *t->un);
    if (!isfinite(p->loss) || !isfinite(p->grad_norm)) {
        t->st.bad_streak++;
        event(t, s, "nonfinite",
              "step %ld: loss %g, gradient norm %g: update skipped (%d in a row)", s, p->loss,
              p->grad_norm, t->st.bad_streak);
        return KILN_OK;
    }
    t->st.bad_streak = 0;
    double zl = kiln_spike_z(&t->st.loss_spike, p->loss),
           zg = kiln_spike_z(&t->st.gnorm_spike, p->grad_norm);
    bool spike = zl > KILN_SPIKE_Z || zg > KILN_SPIKE_Z;
    if (spike)
        event(t, s, "spike", "step %ld: loss %g (z %.1f), gradient norm %g (z %.1f)%s", s, p->loss,
              zl, p->grad_norm, zg, c->skip_spikes ? ": update skipped" : "");
    kiln_spike_push(&t->st.loss_spike, p->loss);
    kiln_spike_push(&t->st.gnorm_spike, p->grad_norm);
    if (spike && c->skip_spikes) return KILN_OK;
    return apply_update(t, p);
}

/* Wall-clock figures of step s: since the loop began (t0), since the step before (*prev). */
static void timing(const trainer *t, long s, long first, uint64_t t0, uint64_t *prev,
                   kiln_train_progress *p) {
    const kiln_train_config *c = &t->cfg;
    uint64_t now = kiln_now_ns();
    p->elapsed_s = (double)(now - t0) * 1e-9;
    double dt = (double)(now - *prev) * 1e-9;
    *prev = now;
    const int slots = c->batch_size * c->accum_steps;
    p->tokens_per_s = dt > 0 ? (double)slots * c->model.seq_len / dt : 0;
    p->eta_s = p->elapsed_s / (double)(s - first + 1) * (double)(c->steps - s);
}

/* Rank 0 writes the step's metrics (and the validation's per target) and reports progress;
 * a failure is returned for every rank to learn of at the end of the step. */
static kiln_err log_step(trainer *t, long s, const kiln_train_progress *p) {
    for (size_t q = 0; q < t->np; q++) {
        t->mt[q].name = t->tab[q].name;
        t->mt[q].grad_norm = t->gn[q];
        t->mt[q].update_ratio = t->wn[q] > 0 && p->applied ? t->un[q] / t->wn[q] : 0;
    }
    if (t->comm->rank != 0) return KILN_OK;
    kiln_err rc = kiln_run_metrics_step(t->mx, p, t->mt, t->np);
    if (!rc && p->has_val) rc = kiln_run_metrics_val_targets(t->mx, s, t->ds, t->val_r2_each);
    if (!rc && t->opts->progress) t->opts->progress(t->opts->progress_ctx, p);
    return rc;
}

/* The error that ends a run after cfg.max_bad_steps non-finite steps in a row, naming the
 * last checkpoint (which rank 0 lists). */
static kiln_err too_many_bad(trainer *t, long s) {
    const kiln_train_config *c = &t->cfg;
    long last = 0;
    long *steps;
    size_t n = 0;
    if (t->comm->rank == 0 && kiln_run_ckpt_list(t->opts->run_dir, &steps, &n) == KILN_OK && n) {
        last = steps[n - 1];
        free(steps);
    }
    return kiln_fail(KILN_ERR_NUMERIC,
                     "step %ld: %d non-finite steps in a row (max_bad_steps %d); the run stopped, "
                     "its last checkpoint is step %ld",
                     s, t->st.bad_streak, c->max_bad_steps, last);
}

/* The end of step s: too many bad steps, or a checkpoint when one is due (with the state's
 * digest, to compare across ranks); then every rank agrees on rc, on a stop request and, after
 * a checkpoint, on the parameters. */
static kiln_err end_step(trainer *t, long s, kiln_err rc) {
    const kiln_train_config *c = &t->cfg;
    const kiln_train_opts *o = t->opts;
    kiln_comm *cm = t->comm;
    const bool root = cm->rank == 0;
    const bool ckpt_due = s == c->steps || (c->ckpt_every > 0 && s % c->ckpt_every == 0);
    memset(t->end + 1, 0, 5 * sizeof *t->end);
    if (!rc && t->st.bad_streak >= c->max_bad_steps) {
        rc = too_many_bad(t, s);
    } else if (!rc && ckpt_due) {
        if (root) rc = checkpoint(t, o->run_dir);
        /* The other ranks' host mirrors of a GPU run are brought up to date to compare. */
        if (!rc && !root && t->dev) rc = kiln_dev_train_download(t->dev, t->params, t->mom);
        if (cm->size > 1) state_digest(t, t->end + 2);
    }
    t->end[1] = o->stop && *o->stop;
    KILN_TRY(kiln_dist_agree(cm, rc, t->end, 5, t->end_all));
    for (int r = 0; r < cm->size; r++) {
        const double *e = t->end_all + (size_t)r * 6;
        if (e[1] != 0) t->stop_agreed = true;
        KILN_FAIL_IF(ckpt_due && memcmp(e + 2, t->end_all + 2, 4 * sizeof *e), KILN_ERR_INTERNAL,
                     "step %ld: rank %d's parameters differ from rank 0's (the ranks "
                     "diverged; the checkpoint holds rank 0's)",
                     s, r);
    }
    return KILN_OK;
}

/* The loop's clock: when it began and when the last step ended. */
typedef struct step_clock {
    uint64_t t0, prev;
} step_clock;

/* Step s of the run (the first this process runs is `first`): micro-batches, gradient,
 * update, validation when due, metrics, checkpoint when due. */
static kiln_err step(trainer *t, long s, long first, step_clock *ck) {
    const kiln_train_config *c = &t->cfg;
    const kiln_loss_opts lo = {(float)c->aux_loss_coef, (float)c->z_loss_coef,
                               (float)c->capacity_factor};
    const long i = s - 1;
    kiln_train_progress p = {.step = s, .steps = c->steps, .first_step = first};
    p.lr = kiln_train_lr(c, i);
    KILN_TRY(sum_micro_batches(t, micro_batches(t, i, &lo), &p));
    if (s == first && t->dcomm && t->comm->rank == 0 && t->mx) note_buckets(t, s);
    KILN_TRY(share_stats(t));
    p.stats = &t->stats;
    if (poisoned(t->opts, s)) KILN_TRY(poison_gradient(t));
    KILN_TRY(update(t, s, &p));
    t->st.step = s;
    if (t->n_val && (s == c->steps || (c->eval_every > 0 && s % c->eval_every == 0))) {
        KILN_TRY(validate(t, &p.val_loss, &p.val_r2));
        p.has_val = true;
        p.val_r2_each = t->val_r2_each;
    }
    timing(t, s, first, ck->t0, &ck->prev, &p);
    return end_step(t, s, log_step(t, s, &p));
}

static kiln_err loop(trainer *t) {
    const kiln_train_opts *o = t->opts;
    const long first = t->st.step + 1;
    KILN_TRY(devices_start(t));
    step_clock ck = {kiln_now_ns(), 0};
    ck.prev = ck.t0;
    for (long s = first; s <= t->cfg.steps; s++) {
        if (t->stop_agreed || (t->comm->size == 1 && o->stop && *o->stop)) return interrupt(t);
        KILN_TRY(step(t, s, first, &ck));
    }
    return KILN_OK;
}

/* ---- run.json ---- */

static kiln_err write_run_json(const char *run_dir, json_t *run) {
    char *p = kiln_path_join(run_dir, "run.json");
    if (!p) return KILN_ERR_NOMEM;
    char *s = json_dumps(
        run, JSON_INDENT(2) | JSON_SORT_KEYS |
                 JSON_REAL_PRECISION(kiln_train_json_precision(json_object_get(run, "config"))));
    kiln_err rc = KILN_OK;
    char *t = s ? kiln_asprintf("%s\n", s) : NULL;
    if (!t)
        rc = kiln_fail(KILN_ERR_NOMEM, "out of memory writing '%s'", p);
    else
        rc = kiln_write_file_atomic(p, t, strlen(t));
    free(s);
    free(t);
    free(p);
    return rc;
}

/* The run id names the experiment: the same config, data and starting weights give the
 * same id, as they give the same bytes (docs/train.md). */
static void make_run_id(const char *cfg_text, const char *data_sha, const char *init_sha,
                        char out[64]) {
    char *s = kiln_asprintf("kiln-run/1\n%s\n%s\n%s", cfg_text, data_sha, init_sha ? init_sha : "");
    uint8_t d[KILN_SHA256_BYTES];
    kiln_sha256(s ? s : "", s ? strlen(s) : 0, d);
    free(s);
    kiln_hex(d, 16, out);
}

/* How a run's last attempt ended, when the loop failed: an event readers show (kiln runs
 * list's diverged or failed; an interrupt, which leaves the run to resume, for the history
 * and a follower). The caller's message is kept whatever happens here. */
static void record_stop(trainer *t, kiln_err rc) {
    if (rc == KILN_OK || t->comm->rank != 0 || !t->mx) return;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", kiln_errmsg());
    const char *kind = rc == KILN_ERR_INTERRUPTED ? "interrupted"
                       : rc == KILN_ERR_NUMERIC   ? "diverged"
                                                  : "failed";
    if (kiln_run_metrics_event(t->mx, t->st.step, kind, msg)) kiln_warn("%s", kiln_errmsg());
    kiln_fail(rc, "%s", msg);
}

/* A directory holds a run once its run.json is there (a start writes it before any
 * checkpoint) or once it holds a checkpoint. A start killed before its run.json landed
 * leaves ckpt/, .lock and perhaps a temporary: no run, so starting again must work (the
 * resume needs the run.json it never got). */
static kiln_err run_exists(const char *run_dir, bool *exists) {
    *exists = false;
    char *p = kiln_path_join(run_dir, "run.json");
    if (!p) return KILN_ERR_NOMEM;
    *exists = kiln_path_exists(p);
    free(p);
    if (*exists) return KILN_OK;
    long *steps;
    size_t n;
    KILN_TRY(kiln_run_ckpt_list(run_dir, &steps, &n));
    free(steps);
    *exists = n > 0;
    return KILN_OK;
}

static kiln_err open_metrics(trainer *t, const char *run_dir) {
    char *p = kiln_path_join(run_dir, "metrics.db");
    if (!p) return KILN_ERR_NOMEM;
    kiln_err rc = kiln_run_metrics_open(p, false, &t->mx);
    free(p);
    return rc;
}

/* "cpu", "cuda" or "cuda (bf16)": where a config's steps run. */
static const char *device_label(const kiln_train_config *c, char out[32]) {
    snprintf(out, 32, "%s%s", kiln_train_device_name(c->device),
             c->device == KILN_TRAIN_CUDA && c->precision == KILN_PRECISION_BF16 ? " (bf16)" : "");
    return out;
}

/* Remove the files in dir whose names start with prefix and hold infix. */
static void sweep_dir(const char *dir, const char *prefix, const char *infix) {
    DIR *d = dir ? opendir(dir) : NULL;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (strncmp(de->d_name, prefix, strlen(prefix)) || !strstr(de->d_name, infix)) continue;
        char *p = kiln_path_join(dir, de->d_name);
        if (p) unlink(p);
        free(p);
    }
    if (d) closedir(d);
}

/* Remove temp files a killed write left behind (kiln_write_file_atomic's ".NAME.tmp-*"):
 * a checkpoint's in ckpt/, run.json's in the run directory. Called holding the run's lock. */
static void sweep_temps(const char *run_dir) {
    sweep_dir(run_dir, ".run.json.tmp-", "");
    char *dir = kiln_path_join(run_dir, "ckpt");
    sweep_dir(dir, ".step-", ".safetensors.tmp-");
    free(dir);
}

/* Rank 0's part of a start: everything up to the first step. */
/* How the rows were split, for run.json and the model card: rows, and times when the data
 * has them. */
static json_t *split_json(const trainer *t) {
    const kiln_split *sp = &t->split;
    const kiln_dataset *ds = t->ds;
    json_t *j =
        json_pack("{s:s,s:I,s:I,s:I,s:I}", "by", sp->by_time ? "time" : "rows", "train_rows",
                  (json_int_t)sp->train_rows, "val_rows", (json_int_t)sp->val_rows, "gap_rows",
                  (json_int_t)sp->gap_rows, "val_windows", (json_int_t)t->n_val);
    if (!j) return NULL;
    if (!sp->n_ranges) {
        json_object_set_new(j, "train_end", json_integer((json_int_t)sp->train_end));
        json_object_set_new(j, "val_begin", json_integer((json_int_t)sp->val_begin));
        json_object_set_new(j, "val_end", json_integer((json_int_t)sp->val_end));
    } else {
        json_object_set_new(j, "groups", json_integer((json_int_t)sp->n_ranges));
    }
    if (sp->by_time) {
        char b[32];
        kiln_time_format(sp->val_from, b);
        json_object_set_new(j, "val_from", json_string(b));
    }
    if (t->cfg.purge_time[0]) json_object_set_new(j, "purge_time", json_string(t->cfg.purge_time));
    if (ds->time) {
        /* first and last time of each split over all groups */
        int64_t lo[2] = {INT64_MAX, INT64_MAX}, hi[2] = {INT64_MIN, INT64_MIN};
        kiln_split_range one;
        size_t nr;
        const kiln_split_range *rg = kiln_split_ranges(sp, &one, &nr);
        for (size_t g = 0; g < nr; g++) {
            size_t a[2] = {rg[g].train_begin, rg[g].val_begin},
                   e[2] = {rg[g].train_end, rg[g].val_end};
            for (int k = 0; k < 2; k++) {
                if (a[k] >= e[k]) continue;
                if (ds->time[a[k]] < lo[k]) lo[k] = ds->time[a[k]];
                if (ds->time[e[k] - 1] > hi[k]) hi[k] = ds->time[e[k] - 1];
            }
        }
        static const char *const names[2][2] = {{"train_first", "train_last"},
                                                {"val_first", "val_last"}};
        for (int k = 0; k < 2; k++) {
            if (lo[k] > hi[k]) continue;
            char a[32], b[32];
            kiln_time_format(lo[k], a);
            kiln_time_format(hi[k], b);
            json_object_set_new(j, names[k][0], json_string(a));
            json_object_set_new(j, names[k][1], json_string(b));
        }
    }
    return j;
}

static kiln_err prepare_start(trainer *t, const kiln_train_config *cfg) {
    const kiln_train_opts *opts = t->opts;
    t->cfg = *cfg;
    kiln_err rc = KILN_OK;
    json_t *run = NULL, *cj = NULL;
    char *text = NULL, *abs_data = NULL;
    char init_sha[KILN_SHA256_HEX] = "";
    KILN_CHECK(rc, out, kiln_train_config_check(&t->cfg, "config"));
    KILN_CHECK_IF(rc, out, !opts->data_path, KILN_ERR_USAGE, "no dataset given");
    bool exists;
    KILN_CHECK(rc, out, run_exists(opts->run_dir, &exists));
    KILN_CHECK_IF(rc, out, exists, KILN_ERR_CONFLICT,
                  "'%s' holds a run already (resume it with --resume, or choose another --run-dir)",
                  opts->run_dir);
    KILN_CHECK(rc, out, kiln_dataset_open(opts->data_path, &t->ds));
    KILN_CHECK(rc, out, resolve_shapes(&t->cfg, t->ds, "config"));
    KILN_CHECK(rc, out, setup(t));
    kiln_tsmoe_init(t->m, t->cfg.seed);
    set_target_norm(t);
    if (opts->init_path) {
        KILN_CHECK(rc, out, load_init(t, opts->init_path, init_sha));
        unfold_head(t);
    } else {
        set_input_norm(t);
    }
    KILN_CHECK_IF(rc, out, !(text = kiln_train_config_run_text(&t->cfg)), KILN_ERR_NOMEM,
                  "out of memory");
    make_run_id(text, t->ds->sha256, opts->init_path ? init_sha : NULL, t->run_id);

    /* Everything checked: now the run directory. */
    char *ck = kiln_path_join(opts->run_dir, "ckpt");
    KILN_CHECK_IF(rc, out, !ck, KILN_ERR_NOMEM, "out of memory");
    t->new_dir = !kiln_path_exists(opts->run_dir);
    rc = kiln_mkdir_p(ck);
    free(ck);
    if (rc) goto out;
    KILN_CHECK(rc, out, kiln_run_lock(opts->run_dir, &t->lock_fd));
    /* Again under the lock: the check above ran before it, and another start of the same
     * directory may have taken the lock, written its run and finished since (while this one
     * hashed its dataset). Nothing of that run may be touched. */
    KILN_CHECK(rc, out, run_exists(opts->run_dir, &exists));
    KILN_CHECK_IF(rc, out, exists, KILN_ERR_CONFLICT,
                  "'%s' holds a run already (another kiln train started it while this one set "
                  "up; resume it with --resume, or choose another --run-dir)",
                  opts->run_dir);
    t->made_files = true; /* under the lock: never another process's files */
    sweep_temps(opts->run_dir); /* a start killed while writing run.json */
    abs_data = realpath(opts->data_path, NULL);
    char created[21];
    kiln_format_time(kiln_unix_time(), created);
    cj = kiln_train_config_json(&t->cfg);
    KILN_CHECK_IF(rc, out, !cj, KILN_ERR_NOMEM, "out of memory");
    run = json_pack("{s:s,s:s,s:s,s:s,s:O,s:I,s:s,s:s}", "format", "kiln-run/1", "run_id",
                    t->run_id, "created", created, "kiln_version", kiln_version(), "config", cj,
                    "seed", (json_int_t)t->cfg.seed, "dataset_sha256", t->ds->sha256,
                    "dataset_path", abs_data ? abs_data : opts->data_path);
    KILN_CHECK_IF(rc, out, !run, KILN_ERR_NOMEM, "out of memory");
    if (opts->init_path)
        json_object_set_new(run, "init",
                            json_pack("{s:s,s:s}", "path", opts->init_path, "sha256", init_sha));
    KILN_CHECK_IF(rc, out, json_object_set_new(run, "split", split_json(t)), KILN_ERR_NOMEM,
                  "out of memory");
    KILN_CHECK(rc, out, write_run_json(opts->run_dir, run));
    KILN_CHECK(rc, out, open_metrics(t, opts->run_dir));
    KILN_CHECK(rc, out, kiln_run_metrics_truncate(t->mx, 0));
    char msg[64] = "run started", where[32];
    if (t->comm->size > 1) snprintf(msg, sizeof msg, "run started on %d ranks", t->comm->size);
    if (t->dev) snprintf(msg, sizeof msg, "run started on %s", device_label(&t->cfg, where));
    if (t->dev && t->comm->size > 1)
        snprintf(msg, sizeof msg, "run started on %d ranks of %s", t->comm->size,
                 device_label(&t->cfg, where));
    KILN_CHECK(rc, out, kiln_run_metrics_event(t->mx, 0, "start", msg));
out:
    json_decref(run);
    json_decref(cj);
    free(text);
    free(abs_data);
    return rc;
}

/* A resume's checkpoints: the steps on disk, oldest first; the newest that verifies in ck
 * (have; it is steps[n - 1] when it is the newest of all); each newer one skipped, and why, in
 * skipped[] (resume_ckpts_release frees them all). */
typedef struct resume_ckpts {
    long *steps;
    size_t n;
    char **skipped;
    size_t n_skipped;
    kiln_ckpt ck;
    bool have;
} resume_ckpts;

static void resume_ckpts_release(resume_ckpts *r) {
    kiln_ckpt_release(&r->ck);
    for (size_t k = 0; k < r->n_skipped; k++)
        free(r->skipped[k]);
    free(r->skipped);
    free(r->steps);
}

static kiln_err newest_checkpoint(const char *run_dir, resume_ckpts *r) {
    KILN_TRY(kiln_run_ckpt_list(run_dir, &r->steps, &r->n));
    r->skipped = kiln_calloc(r->n + 1, sizeof *r->skipped);
    if (!r->skipped) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    for (size_t k = r->n; k-- > 0;) {
        char *p = kiln_run_ckpt_path(run_dir, r->steps[k]);
        if (!p) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        kiln_err e = kiln_ckpt_open(p, &r->ck);
        if (!e && r->ck.state.step != r->steps[k])
            e = kiln_fail(KILN_ERR_VERIFY, "'%s': holds step %ld, not %ld", p, r->ck.state.step,
                          r->steps[k]);
        free(p);
        if (!e) {
            r->have = true;
            return KILN_OK;
        }
        kiln_ckpt_release(&r->ck);
        r->skipped[r->n_skipped] = kiln_strdup(kiln_errmsg());
        if (!r->skipped[r->n_skipped]) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        kiln_warn("skipping checkpoint: %s", r->skipped[r->n_skipped++]);
    }
    return KILN_OK;
}

/* The --set keys against the run's config (base): only the resumable ones may change. */
static kiln_err check_resumable(const char *run_dir, const kiln_train_config *base,
                                const kiln_train_config *cfg) {
    json_t *a = kiln_train_config_json(base), *b = kiln_train_config_json(cfg);
    kiln_err rc = !a || !b ? kiln_fail(KILN_ERR_NOMEM, "out of memory") : KILN_OK;
    const char *key;
    json_t *v;
    json_object_foreach(b, key, v) {
        if (rc) break;
        json_t *old = json_object_get(a, key);
        if ((old && json_equal(old, v)) || kiln_train_config_resumable(key)) continue;
        char *ov = old ? json_dumps(old, JSON_ENCODE_ANY) : NULL,
             *nv = json_dumps(v, JSON_ENCODE_ANY);
        rc = kiln_fail(KILN_ERR_CONFIG,
                       "'%s': config key '%s' cannot change on resume (the run has %s, asked %s)",
                       run_dir, key, ov ? ov : "none", nv ? nv : "?");
        free(ov);
        free(nv);
    }
    json_decref(a);
    json_decref(b);
    return rc;
}

/* The model's state: the checkpoint's, or from scratch as the start did (an --init model
 * cannot be replayed: refused). */
static kiln_err resume_state(trainer *t, resume_ckpts *r, const json_t *run) {
    if (r->have) {
        KILN_TRY(kiln_ckpt_load(&r->ck, t->tab, t->np, t->params, t->mom,
                                t->mom ? t->mom + t->numel : NULL));
        /* What the checkpoint was trained on: mean 0, std 1 when it predates the record. */
        memcpy(t->tmean, r->ck.target_mean, (size_t)t->cfg.model.n_outputs * sizeof(float));
        memcpy(t->tstd, r->ck.target_std, (size_t)t->cfg.model.n_outputs * sizeof(float));
        return KILN_OK;
    }
    KILN_FAIL_IF(json_object_get(run, "init"), KILN_ERR_NOTFOUND,
                 "'%s': no checkpoint verifies and the run started from an --init model",
                 t->opts->run_dir);
    kiln_tsmoe_init(t->m, t->cfg.seed);
    set_input_norm(t);
    set_target_norm(t);
    return KILN_OK;
}

/* metrics.db and run.json brought to the resume: rows after the step resumed from gone, the
 * events said, the config with its --set keys written. */
static kiln_err resume_record(trainer *t, const resume_ckpts *r, const kiln_train_config *base,
                              json_t *run) {
    const kiln_train_opts *opts = t->opts;
    KILN_TRY(open_metrics(t, opts->run_dir));
    KILN_TRY(kiln_run_metrics_truncate(t->mx, t->st.step));
    /* A run killed between a checkpoint's rename and the prune after it keeps one checkpoint
     * too many, and if that was the last step no later checkpoint prunes again (found by the
     * trainer soak): prune when the checkpoint resumed from is the newest. Not otherwise:
     * with a newer one skipped as corrupt, pruning by step could delete the one resumed from. */
    if (r->have && r->steps[r->n - 1] == t->st.step) KILN_TRY(prune(t, opts->run_dir));
    for (size_t k = 0; k < r->n_skipped; k++)
        KILN_TRY(kiln_run_metrics_event(t->mx, t->st.step, "ckpt_skipped", r->skipped[k]));
    char msg[128], where[32];
    snprintf(msg, sizeof msg, "resumed from step %ld", t->st.step);
    if (t->comm->size > 1)
        snprintf(msg + strlen(msg), sizeof msg - strlen(msg), " on %d ranks%s%s", t->comm->size,
                 t->dev ? " of " : "", t->dev ? device_label(&t->cfg, where) : "");
    KILN_TRY(kiln_run_metrics_event(t->mx, t->st.step, "resume", msg));
    char was[32], now[32];
    device_label(base, was);
    device_label(&t->cfg, now);
    if (r->have && strcmp(was, now)) {
        snprintf(msg, sizeof msg, "resumed on %s from a checkpoint written on %s", now, was);
        KILN_TRY(kiln_run_metrics_event(t->mx, t->st.step, "device_change", msg));
    }
    if (t->cfg.steps == base->steps && !opts->n_sets) return KILN_OK;
    json_t *cj = kiln_train_config_json(&t->cfg);
    KILN_FAIL_IF(!cj, KILN_ERR_NOMEM, "out of memory");
    json_object_set_new(run, "config", cj);
    return write_run_json(opts->run_dir, run);
}

/* Rank 0's part of a resume: everything up to the first step. */
static kiln_err prepare_resume(trainer *t) {
    const kiln_train_opts *opts = t->opts;
    kiln_err rc = KILN_OK;
    json_t *run = NULL;
    resume_ckpts r = {0};
    char *rp = kiln_path_join(opts->run_dir, "run.json");
    KILN_CHECK_IF(rc, out, !rp, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK_IF(rc, out, !kiln_path_exists(rp), KILN_ERR_NOTFOUND,
                  "'%s': not a run directory (no run.json)", opts->run_dir);
    KILN_CHECK(rc, out, kiln_run_lock(opts->run_dir, &t->lock_fd));
    KILN_CHECK(rc, out, kiln_json_load_file(rp, &run));
    const char *run_sha = json_string_value(json_object_get(run, "dataset_sha256"));
    const char *run_data = json_string_value(json_object_get(run, "dataset_path"));
    const char *rid = json_string_value(json_object_get(run, "run_id"));
    KILN_CHECK_IF(rc, out, !run_sha || !run_data || !rid || strlen(rid) >= sizeof t->run_id,
                  KILN_ERR_FORMAT, "'%s': incomplete run.json", rp);
    snprintf(t->run_id, sizeof t->run_id, "%s", rid);
    KILN_CHECK(rc, out, newest_checkpoint(opts->run_dir, &r));
    kiln_train_config base;
    if (r.have) {
        base = r.ck.cfg;
        t->st = r.ck.state;
        KILN_CHECK_IF(rc, out, strcmp(r.ck.dataset_sha256, run_sha) || strcmp(r.ck.run_id, rid),
                      KILN_ERR_VERIFY,
                      "'%s': checkpoint step %ld belongs to another run or dataset", opts->run_dir,
                      r.ck.state.step);
    } else {
        kiln_train_config_default(&base);
        KILN_CHECK(rc, out, kiln_train_config_apply(&base, json_object_get(run, "config"), rp));
        kiln_warn("'%s': no checkpoint verifies; starting over from step 0", opts->run_dir);
    }
    t->cfg = base;
    for (int k = 0; k < opts->n_sets; k++)
        KILN_CHECK(rc, out, kiln_train_config_set(&t->cfg, opts->sets[k]));
    KILN_CHECK(rc, out, check_resumable(opts->run_dir, &base, &t->cfg));
    KILN_CHECK(rc, out, kiln_train_config_check(&t->cfg, "config"));
    KILN_CHECK_IF(rc, out, t->cfg.steps < t->st.step, KILN_ERR_CONFIG,
                  "'%s': config key 'steps' (%ld) is below the checkpoint's step %ld",
                  opts->run_dir, t->cfg.steps, t->st.step);
    const char *data = opts->data_path ? opts->data_path : run_data;
    KILN_CHECK(rc, out, kiln_dataset_open(data, &t->ds));
    KILN_CHECK_IF(rc, out, strcmp(t->ds->sha256, run_sha), KILN_ERR_CONFLICT,
                  "dataset '%s' has sha256 %s, but run '%s' was trained on %s; resuming on other "
                  "data is refused",
                  data, t->ds->sha256, opts->run_dir, run_sha);
    KILN_CHECK(rc, out, resolve_shapes(&t->cfg, t->ds, "config"));
    KILN_CHECK(rc, out, setup(t));
    KILN_CHECK(rc, out, resume_state(t, &r, run));
    kiln_ckpt_release(&r.ck);
    sweep_temps(opts->run_dir);
    rc = resume_record(t, &r, &base, run);
out:
    resume_ckpts_release(&r);
    free(rp);
    json_decref(run);
    return rc;
}

/* ---- ranks ---- */

typedef struct run_header {
    kiln_train_config cfg; /* resolved: n_features and n_outputs set */
    kiln_train_state st;
    char sha256[KILN_SHA256_HEX];
    char run_id[64];
    char data_path[4096];
} run_header;

/* After rank 0 prepared the run (rc is its outcome): the others receive its config, state,
 * run id and dataset path, open the same dataset (checked by digest), set up, and receive
 * the parameters and moments. */
static kiln_err share_run(trainer *t, kiln_err rc) {
    kiln_comm *c = t->comm;
    if (c->size == 1) return rc;
    const bool root = c->rank == 0;
    double mine[1], *all = kiln_calloc((size_t)c->size, sizeof *all);
    run_header *h = kiln_calloc(1, sizeof *h);
    if (!all || !h) {
        free(all);
        free(h);
        return KILN_ERR_NOMEM;
    }
    if (!rc && root && strlen(t->ds->path) >= sizeof h->data_path)
        rc = kiln_fail(KILN_ERR_LIMIT, "dataset path '%s' is too long for the other ranks",
                       t->ds->path);
    KILN_CHECK(rc, out, kiln_dist_agree(c, rc, mine, 0, all));
    if (root) {
        h->cfg = t->cfg;
        h->st = t->st;
        memcpy(h->sha256, t->ds->sha256, sizeof h->sha256);
        memcpy(h->run_id, t->run_id, sizeof h->run_id);
        snprintf(h->data_path, sizeof h->data_path, "%s", t->ds->path);
    }
    KILN_CHECK(rc, out, c->bcast(c, h, sizeof *h, 0));
    if (!root) {
        t->cfg = h->cfg;
        t->st = h->st;
        memcpy(t->run_id, h->run_id, sizeof t->run_id);
        h->sha256[KILN_SHA256_HEX - 1] = 0;
        h->data_path[sizeof h->data_path - 1] = 0;
        rc = kiln_dataset_open(h->data_path, &t->ds);
        if (!rc && strcmp(t->ds->sha256, h->sha256))
            rc = kiln_fail(KILN_ERR_CONFLICT, "dataset '%s' has sha256 %s here, %s on rank 0",
                           h->data_path, t->ds->sha256, h->sha256);
        if (!rc) rc = setup(t);
    }
    KILN_CHECK(rc, out, kiln_dist_agree(c, rc, mine, 0, all));
    KILN_CHECK(rc, out, c->bcast(c, t->params, t->numel * sizeof(float), 0));
    if (t->mom) KILN_CHECK(rc, out, c->bcast(c, t->mom, 2 * t->numel * sizeof(float), 0));
    const size_t O = (size_t)t->cfg.model.n_outputs;
    KILN_CHECK(rc, out, c->bcast(c, t->tmean, O * sizeof(float), 0));
    rc = c->bcast(c, t->tstd, O * sizeof(float), 0);
out:
    free(all);
    free(h);
    return rc;
}

/* Device "cuda" with opts->device_comm, on every rank: each rank's GPU, then the device
 * communicator over them (collective; every rank learns of any rank's failure). */
static kiln_err open_dcomm(trainer *t, bool cuda) {
    kiln_comm *c = t->comm;
    if (!cuda || !t->opts->device_comm) return KILN_OK;
    const size_t P = (size_t)c->size;
    double rec[4], *all = kiln_calloc(P * 4, sizeof *all);
    if (!all) return KILN_ERR_NOMEM;
    kiln_err rc = kiln_dev_train_pick(t->opts->local_rank, &t->gpu, &t->gpus);
    rec[1] = t->gpu, rec[2] = t->gpus, rec[3] = t->opts->local_rank;
    rc = kiln_dist_agree(c, rc, rec, 3, all);
    if (!rc && c->rank == 0) {
        /* "2 ranks over NCCL: GPU 0, GPU 1", and whether local ranks share a GPU. */
        char *n = t->gpu_note;
        const size_t cap = sizeof t->gpu_note;
        int shared = 0, at = snprintf(n, cap, "%zu rank%s over NCCL:", P, P > 1 ? "s" : "");
        for (size_t r = 0; r < P; r++) {
            const double *e = all + r * 4 + 1;
            shared += e[2] >= e[1];
            if (r < 8 && at > 0 && (size_t)at < cap)
                at += snprintf(n + at, cap - (size_t)at, "%s GPU %d", r ? "," : "", (int)e[0]);
        }
        if (P > 8 && at > 0 && (size_t)at < cap) at += snprintf(n + at, cap - (size_t)at, ", ...");
        if (shared && at > 0 && (size_t)at < cap)
            snprintf(n + at, cap - (size_t)at,
                     "; GPUs are shared: more local ranks than visible GPUs on %d rank%s", shared,
                     shared > 1 ? "s" : "");
    }
    free(all);
    if (!rc) rc = t->opts->device_comm(c, t->gpu, &t->dcomm);
    return rc ? kiln_errprefix(rc, "cannot train on device \"cuda\" on %zu rank%s: ", P,
                               P > 1 ? "s" : "")
              : KILN_OK;
}

/* A start that failed before its first step (the metrics could not be opened, another rank
 * could not set up): what it made goes, while it still holds the run's lock. Only kiln's own
 * names; the directory itself only when the start made it and it is empty again. */
static void unmake_run(trainer *t) {
    const char *dir = t->opts->run_dir;
    kiln_run_metrics_close(t->mx);
    t->mx = NULL;
    sweep_temps(dir);
    static const char *const files[] = {"run.json", "metrics.db", "metrics.db-wal",
                                        "metrics.db-shm", "metrics.db-journal", ".lock"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(files); i++) {
        char *p = kiln_path_join(dir, files[i]);
        if (p) unlink(p);
        free(p);
    }
    char *ck = kiln_path_join(dir, "ckpt");
    if (ck) rmdir(ck);
    free(ck);
    if (t->new_dir) rmdir(dir);
}

kiln_err kiln_train_start(const kiln_train_config *cfg, const kiln_train_opts *opts) {
    trainer t = {.opts = opts, .lock_fd = -1, .comm = opts->comm ? opts->comm : kiln_comm_single()};
    /* The device communicator first: a failure leaves no run directory behind. */
    kiln_err rc = open_dcomm(&t, cfg->device == KILN_TRAIN_CUDA);
    if (rc) return rc;
    rc = t.comm->rank == 0 ? prepare_start(&t, cfg) : KILN_OK;
    rc = share_run(&t, rc);
    if (!rc) standardize_targets(&t);
    if (!rc) {
        rc = loop(&t);
        record_stop(&t, rc);
    } else if (t.made_files) {
        unmake_run(&t);
    }
    trainer_free(&t);
    return rc;
}

kiln_err kiln_train_resume(const kiln_train_opts *opts) {
    trainer t = {.opts = opts, .lock_fd = -1, .comm = opts->comm ? opts->comm : kiln_comm_single()};
    kiln_err rc = t.comm->rank == 0 ? prepare_resume(&t) : KILN_OK;
    rc = share_run(&t, rc);
    if (!rc) standardize_targets(&t);
    if (!rc) rc = open_dcomm(&t, t.cfg.device == KILN_TRAIN_CUDA);
    if (!rc) {
        rc = loop(&t);
        record_stop(&t, rc);
    }
    trainer_free(&t);
    return rc;
}

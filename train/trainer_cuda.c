/* trainer_cuda.c - the parts of a training step that run on a CUDA device (config key
 * "device": "cuda"): the network (kiln_tsmoe_cuda), the AdamW moments, the gradient norm and
 * the optimizer update, all on the device; the host keeps the sampler, the spike detector
 * and the checkpoints, which get the parameters and moments downloaded. Every reduction has
 * a fixed order and nothing uses atomics, so a step's bits depend only on the parameters,
 * the moments and the step number: two runs give the same checkpoints, and a run resumed
 * from a checkpoint continues exactly as if it had not stopped. */
#include <math.h>
#include <stdlib.h>

#include "train_int.h"

#ifdef KILN_HAVE_CUDA
#include "kernels.h"

struct kiln_dev_train {
    kiln_tsmoe_cuda *net;
    size_t numel, np;
    float *mom;    /* device [2*numel]: m then v; NULL for SGD */
    double *dsum;  /* device [2*np]: per-tensor sums of squares */
    double *hsum;  /* host [2*np] */
    float *params; /* device, the network's block */
    float *grads;  /* device, the network's block */
};

kiln_err kiln_dev_train_create(const kiln_train_config *c, kiln_dev_train **out) {
    *out = NULL;
    kiln_dev_train *d = kiln_calloc(1, sizeof *d);
    if (!d) return KILN_ERR_NOMEM;
    kiln_cuda_opts o = {0, c->precision};
    kiln_err rc = kiln_tsmoe_cuda_create(&c->model, c->batch_size, &o, &d->net);
    if (rc) {
        free(d);
        return rc;
    }
    d->numel = kiln_tsmoe_cuda_numel(d->net);
    (void)kiln_tsmoe_cuda_param_table(d->net, &d->np);
    d->params = kiln_tsmoe_cuda_device_params(d->net);
    d->grads = kiln_tsmoe_cuda_device_grads(d->net);
    d->hsum = kiln_calloc(2 * d->np, sizeof(double));
    KILN_CHECK_IF(rc, fail, !d->hsum, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, fail, kiln_cuda_malloc((void **)&d->dsum, 2 * d->np * sizeof(double)));
    if (c->optimizer == KILN_OPTIM_ADAMW) {
        KILN_CHECK(rc, fail, kiln_cuda_malloc((void **)&d->mom, 2 * d->numel * sizeof(float)));
        KILN_CHECK(rc, fail, kiln_cuda_memset(d->mom, 0, 2 * d->numel * sizeof(float)));
    }
    *out = d;
    return KILN_OK;
fail:
    kiln_dev_train_free(d);
    return rc;
}

void kiln_dev_train_free(kiln_dev_train *d) {
    if (!d) return;
    kiln_cuda_free(d->mom);
    kiln_cuda_free(d->dsum);
    free(d->hsum);
    kiln_tsmoe_cuda_free(d->net); /* last: it holds the thread's CUDA context */
    free(d);
}

kiln_tsmoe_cuda *kiln_dev_train_net(kiln_dev_train *d) {
    return d->net;
}

kiln_err kiln_dev_train_upload(kiln_dev_train *d, const float *params, const float *mom) {
    KILN_TRY(kiln_tsmoe_cuda_upload_params(d->net, params));
    if (d->mom && mom) KILN_TRY(kiln_cuda_upload(d->mom, mom, 2 * d->numel * sizeof(float)));
    return KILN_OK;
}

kiln_err kiln_dev_train_download(kiln_dev_train *d, float *params, float *mom) {
    KILN_TRY(kiln_tsmoe_cuda_download_params(d->net, params));
    if (d->mom && mom) KILN_TRY(kiln_cuda_download(mom, d->mom, 2 * d->numel * sizeof(float)));
    return KILN_OK;
}

kiln_err kiln_dev_train_poison(kiln_dev_train *d, size_t offset) {
    const float nan = NAN;
    return kiln_cuda_upload(d->grads + offset, &nan, sizeof nan);
}

/* sums[i] = sum of x[tensor i]^2 over the trained tensors (0 for the others), summed on the
 * device, then brought to the host. */
static kiln_err tensor_sumsq(kiln_dev_train *d, const kiln_param *tab, const float *x, double *dsum,
                             double *hsum) {
    KILN_TRY(kiln_cuda_memset(dsum, 0, d->np * sizeof(double)));
    for (size_t i = 0; i < d->np; i++)
        if (tab[i].flags & KILN_PARAM_TRAINED)
            KILN_TRY(kiln_cuda_sumsq(dsum + i, x + tab[i].offset, tab[i].numel));
    return kiln_cuda_download(hsum, dsum, d->np * sizeof(double));
}

kiln_err kiln_dev_train_grad_norm(kiln_dev_train *d, const kiln_param *tab, double *per_tensor,
                                  double *norm) {
    KILN_TRY(tensor_sumsq(d, tab, d->grads, d->dsum, d->hsum));
    double total = 0;
    for (size_t i = 0; i < d->np; i++) {
        per_tensor[i] = sqrt(d->hsum[i]);
        total += d->hsum[i];
    }
    *norm = sqrt(total);
    return KILN_OK;
}

kiln_err kiln_dev_train_step(kiln_dev_train *d, const kiln_train_config *c, const kiln_param *tab,
                             long t, double lr, float gscale, double *upd_norm, double *w_norm) {
    const bool adam = c->optimizer == KILN_OPTIM_ADAMW;
    /* The constants exactly as kiln_train_optim_step makes them. */
    const double bc1 = adam ? 1.0 - pow(c->beta1, (double)t) : 1.0;
    const double bc2 = adam ? 1.0 - pow(c->beta2, (double)t) : 1.0;
    kiln_cuda_optim o = {.adam = adam,
                         .b1 = (float)c->beta1,
                         .b2 = (float)c->beta2,
                         .omb1 = (float)(1.0 - c->beta1),
                         .omb2 = (float)(1.0 - c->beta2),
                         .eps = (float)c->adam_eps,
                         .step = (float)(lr / bc1),
                         .rsq_bc2 = (float)(1.0 / sqrt(bc2)),
                         .lr = (float)lr,
                         .gscale = gscale};
    for (size_t i = 0; i < d->np; i++) {
        if (!(tab[i].flags & KILN_PARAM_TRAINED)) continue;
        const size_t off = tab[i].offset;
        o.decay = (tab[i].flags & KILN_PARAM_DECAY) ? (float)(lr * c->weight_decay) : 0.0f;
        KILN_TRY(kiln_cuda_optim_update(d->params + off, d->grads + off,
                                        d->mom ? d->mom + off : NULL,
                                        d->mom ? d->mom + d->numel + off : NULL, tab[i].numel, &o));
    }
    /* The grads now hold the updates. */
    KILN_TRY(tensor_sumsq(d, tab, d->grads, d->dsum, d->hsum));
    KILN_TRY(tensor_sumsq(d, tab, d->params, d->dsum + d->np, d->hsum + d->np));
    for (size_t i = 0; i < d->np; i++) {
        upd_norm[i] = sqrt(d->hsum[i]);
        w_norm[i] = sqrt(d->hsum[d->np + i]);
    }
    return KILN_OK;
}

#else /* no CUDA in this build */

#define NO_CUDA                                                                                    \
    kiln_fail(KILN_ERR_UNSUPPORTED,                                                                \
              "this build of kiln has no CUDA (nvcc was not found when it was built)")

kiln_err kiln_dev_train_create(const kiln_train_config *c, kiln_dev_train **out) {
    (void)c;
    *out = NULL;
    return NO_CUDA;
}
void kiln_dev_train_free(kiln_dev_train *d) {
    (void)d;
}
kiln_tsmoe_cuda *kiln_dev_train_net(kiln_dev_train *d) {
    (void)d;
    return NULL;
}
kiln_err kiln_dev_train_upload(kiln_dev_train *d, const float *params, const float *mom) {
    (void)d, (void)params, (void)mom;
    return NO_CUDA;
}
kiln_err kiln_dev_train_download(kiln_dev_train *d, float *params, float *mom) {
    (void)d, (void)params, (void)mom;
    return NO_CUDA;
}
kiln_err kiln_dev_train_poison(kiln_dev_train *d, size_t offset) {
    (void)d, (void)offset;
    return NO_CUDA;
}
kiln_err kiln_dev_train_grad_norm(kiln_dev_train *d, const kiln_param *tab, double *per_tensor,
                                  double *norm) {
    (void)d, (void)tab, (void)per_tensor, (void)norm;
    return NO_CUDA;
}
kiln_err kiln_dev_train_step(kiln_dev_train *d, const kiln_train_config *c, const kiln_param *tab,
                             long t, double lr, float gscale, double *upd_norm, double *w_norm) {
    (void)d, (void)c, (void)tab, (void)t, (void)lr, (void)gscale, (void)upd_norm, (void)w_norm;
    return NO_CUDA;
}
#endif

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
    /* The step's micro-batches (kiln_dev_train_dist): k of them here; fold: each gradient
     * computed alone and the k (or k*P) of them added in shard order. */
    int k;
    bool fold;
    kiln_comm *dc;        /* NULL: one process, the fold on the legacy stream */
    float *acc;           /* device [numel]: the running fold (dc NULL, k > 1) */
    float *shards;        /* device [(k-1)*numel]: micro-batches 0..k-2 (dc) */
    float *recv;          /* device [k*P*chunk_max]: a bucket's slices (dc) */
    kiln_dist_bucket *bk; /* [nb] */
    size_t nb, next;      /* buckets, the first not yet queued this step */
    size_t early;         /* of the last step's buckets, those the backward queued */
    size_t bucket_bytes;
    kiln_comm_xfer *xf;       /* [k*P] */
    void *ev_ready, *ev_done; /* compute stream -> comm stream, and back */
    /* The optimizer step in one launch: the trained tensors as runs of the block, adjacent
     * ones with the same decay flag merged (kiln_cuda_optim_update_multi). */
    kiln_cuda_seg *segs; /* device [nsegs] */
    int nsegs;
    size_t nchunks;
};

int kiln_train_cuda_devices(void) {
    return kiln_cuda_device_count();
}

kiln_err kiln_dev_train_pick(int local_rank, int *device, int *visible) {
    *visible = kiln_cuda_device_count();
    *device = *visible > 0 && local_rank > 0 ? local_rank % *visible : 0;
    KILN_FAIL_IF(*visible == 0, KILN_ERR_DEVICE, "cuda: no usable CUDA device: none is visible");
    return KILN_OK;
}

kiln_err kiln_dev_train_create(const kiln_train_config *c, int device, kiln_dev_train **out) {
    *out = NULL;
    kiln_dev_train *d = kiln_calloc(1, sizeof *d);
    if (!d) return KILN_ERR_NOMEM;
    d->k = 1;
    kiln_cuda_opts o = {device, c->precision};
    kiln_err rc = kiln_tsmoe_cuda_create(&c->model, c->batch_size, &o, &d->net);
    if (rc) {
        free(d);
        return rc;
    }
    d->numel = kiln_tsmoe_cuda_numel(d->net);
    const kiln_param *tab = kiln_tsmoe_cuda_param_table(d->net, &d->np);
    d->params = kiln_tsmoe_cuda_device_params(d->net);
    d->grads = kiln_tsmoe_cuda_device_grads(d->net);
    d->hsum = kiln_calloc(2 * d->np, sizeof(double));
    KILN_CHECK_IF(rc, fail, !d->hsum, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, fail, kiln_cuda_malloc((void **)&d->dsum, 2 * d->np * sizeof(double)));
    if (c->optimizer == KILN_OPTIM_ADAMW) {
        KILN_CHECK(rc, fail, kiln_cuda_malloc((void **)&d->mom, 2 * d->numel * sizeof(float)));
        KILN_CHECK(rc, fail, kiln_cuda_memset(d->mom, 0, 2 * d->numel * sizeof(float)));
    }
    {
        kiln_cuda_seg *hs = kiln_calloc(d->np ? d->np : 1, sizeof *hs);
        KILN_CHECK_IF(rc, fail, !hs, KILN_ERR_NOMEM, "out of memory");
        int n = 0;
        for (size_t i = 0; i < d->np; i++) {
            if (!(tab[i].flags & KILN_PARAM_TRAINED) || !tab[i].numel) continue;
            const int decay = (tab[i].flags & KILN_PARAM_DECAY) != 0;
            if (n && hs[n - 1].decay == decay && hs[n - 1].off + hs[n - 1].n == tab[i].offset)
                hs[n - 1].n += tab[i].numel;
            else
                hs[n++] = (kiln_cuda_seg){.off = tab[i].offset, .n = tab[i].numel, .decay = decay};
        }
        d->nsegs = n;
        d->nchunks = kiln_cuda_seg_plan(hs, n);
        rc = kiln_cuda_malloc((void **)&d->segs, (n ? n : 1) * sizeof *hs);
        if (!rc && n) rc = kiln_cuda_upload(d->segs, hs, n * sizeof *hs);
        free(hs);
        if (rc) goto fail;
    }
    *out = d;
    return KILN_OK;
fail:
    kiln_dev_train_free(d);
    return rc;
}

void kiln_dev_train_free(kiln_dev_train *d) {
    if (!d) return;
    kiln_cuda_free(d->acc);
    kiln_cuda_free(d->shards);
    kiln_cuda_free(d->recv);
    kiln_cuda_event_destroy(d->ev_ready);
    kiln_cuda_event_destroy(d->ev_done);
    free(d->bk);
    free(d->xf);
    kiln_cuda_free(d->mom);
    kiln_cuda_free(d->segs);
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

/* ---- data parallelism ---- */

kiln_err kiln_dev_train_dist(kiln_dev_train *d, kiln_comm *dc, int k, size_t bucket_bytes) {
    KILN_FAIL_IF(k < 1 || (dc && !dc->exchange), KILN_ERR_USAGE,
                 "'dist': %d micro-batches, communicator '%s'", k, dc ? dc->name : "none");
    d->k = k;
    d->dc = dc;
    d->fold = dc || k > 1;
    if (!dc) {
        if (k > 1) KILN_TRY(kiln_cuda_malloc((void **)&d->acc, d->numel * sizeof(float)));
        return KILN_OK;
    }
    const size_t P = (size_t)dc->size;
    size_t np = 0;
    const kiln_param *tab = kiln_tsmoe_cuda_param_table(d->net, &np);
    d->bucket_bytes = bucket_bytes ? bucket_bytes : (size_t)25 << 20;
    d->nb = kiln_dist_buckets(tab, np, d->bucket_bytes, NULL, 0);
    d->bk = kiln_calloc(d->nb, sizeof *d->bk);
    d->xf = kiln_calloc((size_t)k * P, sizeof *d->xf);
    if (!d->bk || !d->xf) return KILN_ERR_NOMEM;
    kiln_dist_buckets(tab, np, d->bucket_bytes, d->bk, d->nb);
    size_t chunk = 0, n;
    for (size_t b = 0; b < d->nb; b++) {
        size_t c = (d->bk[b].numel + P - 1) / P;
        if (c > chunk) chunk = c;
    }
    KILN_FAIL_IF(!kiln_mul_ok(chunk, (size_t)k * P * sizeof(float), &n) ||
                     !kiln_mul_ok(d->numel, (size_t)(k - 1) * sizeof(float), &n),
                 KILN_ERR_LIMIT, "gradient shards of %zu floats overflow", d->numel);
    KILN_TRY(kiln_cuda_malloc((void **)&d->recv, chunk * (size_t)k * P * sizeof(float)));
    if (k > 1)
        KILN_TRY(kiln_cuda_malloc((void **)&d->shards, d->numel * (size_t)(k - 1) * sizeof(float)));
    KILN_TRY(kiln_cuda_event_create(&d->ev_ready));
    KILN_TRY(kiln_cuda_event_create(&d->ev_done));
    return KILN_OK;
}

static const float *shard(const kiln_dev_train *d, int j) {
    return j == d->k - 1 ? d->grads : d->shards + (size_t)j * d->numel;
}

/* The length of slice q of a bucket cut into slices of chunk elements (the last is shorter,
 * and with more ranks than elements some are empty). */
static size_t slice_len(const kiln_dist_bucket *b, size_t chunk, int q) {
    const size_t at = (size_t)q * chunk;
    return at >= b->numel ? 0 : b->numel - at < chunk ? b->numel - at : chunk;
}

/* Queue bucket b's reduction on the communicator's stream, after the compute stream's work
 * so far: alltoall of slices (slice q of every shard to rank q), the fold of this rank's
 * slice in shard order on the communicator's stream, written over its place in the
 * gradients, then every slice to every rank (an allgather into place). */
static kiln_err queue_bucket(kiln_dev_train *d, const kiln_dist_bucket *b) {
    kiln_comm *dc = d->dc;
    const int P = dc->size, r = dc->rank, k = d->k;
    const size_t chunk = (b->numel + (size_t)P - 1) / (size_t)P;
    const size_t mine = slice_len(b, chunk, r);
    float *dst = d->grads + b->offset + (size_t)r * chunk;
    KILN_TRY(kiln_cuda_event_record(d->ev_ready, NULL));
    KILN_TRY(kiln_cuda_stream_wait(dc->stream, d->ev_ready));
    size_t n = 0;
    for (int q = 0; q < P; q++)
        for (int j = 0; j < k; j++)
            d->xf[n++] = (kiln_comm_xfer){q, shard(d, j) + b->offset + (size_t)q * chunk,
                                          slice_len(b, chunk, q) * sizeof(float),
                                          d->recv + ((size_t)j * P + (size_t)q) * chunk,
                                          mine * sizeof(float)};
    KILN_TRY(dc->exchange(dc, d->xf, n));
    KILN_TRY(kiln_cuda_fold_shards(dc->stream, dst, d->recv, k, P, chunk, mine));
    n = 0;
    for (int q = 0; q < P; q++)
        if (q != r)
            d->xf[n++] = (kiln_comm_xfer){q, dst, mine * sizeof(float),
                                          d->grads + b->offset + (size_t)q * chunk,
                                          slice_len(b, chunk, q) * sizeof(float)};
    return n ? dc->exchange(dc, d->xf, n) : KILN_OK;
}

/* The backward's hook: queue every bucket whose tensors are all done. Buckets run from the
 * end of the table, so they complete in order. */
static kiln_err grads_done(void *ctx, size_t first) {
    kiln_dev_train *d = ctx;
    while (d->next < d->nb && d->bk[d->next].last_param >= first)
        KILN_TRY(queue_bucket(d, &d->bk[d->next++]));
    return KILN_OK;
}

kiln_err kiln_dev_train_micro_begin(kiln_dev_train *d, int j) {
    if (j == 0 || d->fold) KILN_TRY(kiln_tsmoe_cuda_zero_grads(d->net));
    if (d->dc && j == d->k - 1) {
        d->next = 0;
        kiln_tsmoe_cuda_set_grad_hook(d->net, grads_done, d);
    }
    return KILN_OK;
}

kiln_err kiln_dev_train_micro_end(kiln_dev_train *d, int j) {
    const size_t bytes = d->numel * sizeof(float);
    if (!d->fold) return KILN_OK;
    if (!d->dc) {
        /* One process: acc = s_0, acc += s_1, ..., grads = acc + s_(k-1). */
        if (j == 0) return kiln_cuda_copy(d->acc, d->grads, bytes);
        float *to = j == d->k - 1 ? d->grads : d->acc;
        return kiln_cuda_residual_forward(to, d->acc, d->grads, d->numel);
    }
    if (j < d->k - 1) return kiln_cuda_copy(d->shards + (size_t)j * d->numel, d->grads, bytes);
    kiln_tsmoe_cuda_set_grad_hook(d->net, NULL, NULL);
    d->early = d->next;
    KILN_TRY(grads_done(d, 0)); /* the backward queued them all unless it failed */
    /* The compute stream's next work (the norm, the update) waits for the last bucket. */
    KILN_TRY(kiln_cuda_event_record(d->ev_done, d->dc->stream));
    return kiln_cuda_stream_wait(NULL, d->ev_done);
}

void kiln_dev_train_buckets(const kiln_dev_train *d, size_t *count, size_t *early, size_t *bytes) {
    *count = d->nb;
    *early = d->early;
    *bytes = d->bucket_bytes;
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
    /* The constants kiln_train_optim_step uses. Every trained tensor in one launch (the
     * segments made at create from the same table; the same bits as one
     * kiln_cuda_optim_update per tensor). */
    kiln_optim_consts o;
    kiln_train_optim_consts(c, t, lr, &o);
    o.gscale = gscale;
    KILN_TRY(kiln_cuda_optim_update_multi(d->params, d->grads, d->mom,
                                          d->mom ? d->mom + d->numel : NULL, d->segs, d->nsegs,
                                          d->nchunks, &o));
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

int kiln_train_cuda_devices(void) {
    return 0;
}

kiln_err kiln_dev_train_pick(int local_rank, int *device, int *visible) {
    (void)local_rank;
    *device = *visible = 0;
    return NO_CUDA;
}
kiln_err kiln_dev_train_create(const kiln_train_config *c, int device, kiln_dev_train **out) {
    (void)c, (void)device;
    *out = NULL;
    return NO_CUDA;
}
kiln_err kiln_dev_train_dist(kiln_dev_train *d, kiln_comm *dc, int k, size_t bucket_bytes) {
    (void)d, (void)dc, (void)k, (void)bucket_bytes;
    return NO_CUDA;
}
kiln_err kiln_dev_train_micro_begin(kiln_dev_train *d, int j) {
    (void)d, (void)j;
    return NO_CUDA;
}
kiln_err kiln_dev_train_micro_end(kiln_dev_train *d, int j) {
    (void)d, (void)j;
    return NO_CUDA;
}
void kiln_dev_train_buckets(const kiln_dev_train *d, size_t *count, size_t *early, size_t *bytes) {
    (void)d;
    *count = *early = *bytes = 0;
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

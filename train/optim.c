/* optim.c - learning-rate schedule, gradient norm and clipping, AdamW and SGD, and the
 * spike detector. Every sum runs in a fixed order in double so that a run repeats
 * bit for bit. */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "train_int.h"

double kiln_train_lr(const kiln_train_config *c, long i) {
    if (i < c->warmup_steps) return c->lr * (double)(i + 1) / (double)c->warmup_steps;
    long span = c->steps - c->warmup_steps - 1;
    double progress = span > 0 ? (double)(i - c->warmup_steps) / (double)span : 1.0;
    if (progress > 1) progress = 1;
    if (progress < 0) progress = 0;
    return c->min_lr + 0.5 * (c->lr - c->min_lr) * (1.0 + cos(M_PI * progress));
}

/* A tensor's elements in at most OPTIM_CHUNKS chunks of at least OPTIM_CHUNK, sizes fixed by
 * its element count: the gradient norm, the clipping and the optimizer run a tensor's chunks
 * on the pool's threads and add their sums in chunk order, so no figure depends on the
 * thread count. */
#define OPTIM_CHUNK 16384
#define OPTIM_CHUNKS 256

static size_t chunk_of(size_t n, int *count) {
    size_t chunk = (n + OPTIM_CHUNKS - 1) / OPTIM_CHUNKS;
    if (chunk < OPTIM_CHUNK) chunk = OPTIM_CHUNK;
    *count = (int)((n + chunk - 1) / chunk);
    return chunk;
}

/* ---- every tensor's chunks as one loop ----
 * The chunks of all the trained tensors are the items of one pool loop (or of a few, BATCH
 * items at a time), not a loop per tensor: most tensors (biases, norms, d128's 128x128
 * matrices) are one chunk, which a loop of their own ran on the calling thread alone, with a
 * barrier after each (45 loops an AdamW step for d128 dense). Each item writes its two sums
 * into a slot of its own; after the loop each tensor's sums are added in chunk order and
 * handed to `done` in tensor order, as the loop per tensor did, so the bits are the same. */
#define BATCH 1024

/* Elements k0..k1-1 of tensor t: its two sums into out. */
typedef void (*chunk_fn)(void *ctx, const kiln_param *t, size_t k0, size_t k1, double out[2]);
/* Tensor i's sums (0 for a tensor that is not trained), in tensor order. */
typedef void (*tensor_done)(void *ctx, size_t i, double s0, double s1);

typedef struct chunk_batch {
    const kiln_param *tab;
    chunk_fn fn;
    tensor_done done;
    void *ctx;
    int n_items, n_tensors;
    uint32_t item_tensor[BATCH], item_chunk[BATCH], tensors[BATCH];
    double part[BATCH][2];
} chunk_batch;

static void chunk_item(void *arg, int it) {
    chunk_batch *b = arg;
    const kiln_param *t = &b->tab[b->item_tensor[it]];
    int nc;
    const size_t chunk = chunk_of(t->numel, &nc), k0 = (size_t)b->item_chunk[it] * chunk;
    b->fn(b->ctx, t, k0, k0 + chunk < t->numel ? k0 + chunk : t->numel, b->part[it]);
}

static void chunk_flush(kiln_pool *pool, chunk_batch *b) {
    kiln_pool_run(pool, b->n_items, chunk_item, b);
    int j = 0;
    for (int q = 0; q < b->n_tensors; q++) {
        const size_t i = b->tensors[q];
        double s0 = 0, s1 = 0;
        for (; j < b->n_items && b->item_tensor[j] == i; j++) {
            s0 += b->part[j][0];
            s1 += b->part[j][1];
        }
        if (b->done) b->done(b->ctx, i, s0, s1);
    }
    b->n_items = b->n_tensors = 0;
}

/* fn over every chunk of every trained tensor of tab[count], on the pool's threads. */
static void for_chunks(kiln_pool *pool, const kiln_param *tab, size_t count, chunk_fn fn,
                       tensor_done done, void *ctx) {
    static_assert(OPTIM_CHUNKS <= BATCH, "a tensor's chunks fit in one batch");
    chunk_batch b;
    b.tab = tab, b.fn = fn, b.done = done, b.ctx = ctx, b.n_items = b.n_tensors = 0;
    for (size_t i = 0; i < count; i++) {
        int nc = 0;
        if (tab[i].flags & KILN_PARAM_TRAINED) chunk_of(tab[i].numel, &nc);
        if (b.n_items + nc > BATCH || b.n_tensors == BATCH) chunk_flush(pool, &b);
        b.tensors[b.n_tensors++] = (uint32_t)i;
        for (int j = 0; j < nc; j++, b.n_items++) {
            b.item_tensor[b.n_items] = (uint32_t)i;
            b.item_chunk[b.n_items] = (uint32_t)j;
        }
    }
    chunk_flush(pool, &b);
}

typedef struct grad_job {
    float *g;
    float s;
    double total, *per_tensor;
} grad_job;

static void sumsq_chunk(void *arg, const kiln_param *t, size_t k0, size_t k1, double out[2]) {
    const float *g = ((const grad_job *)arg)->g + t->offset;
    double s = 0;
    for (size_t k = k0; k < k1; k++)
        s += (double)g[k] * g[k];
    out[0] = s;
    out[1] = 0;
}

static void sumsq_done(void *arg, size_t i, double s, double unused) {
    grad_job *o = arg;
    if (o->per_tensor) o->per_tensor[i] = sqrt(s);
    o->total += s;
}

static void scale_chunk(void *arg, const kiln_param *t, size_t k0, size_t k1, double out[2]) {
    const grad_job *o = arg;
    float *g = o->g + t->offset;
    for (size_t k = k0; k < k1; k++)
        g[k] *= o->s;
    out[0] = out[1] = 0;
}

double kiln_train_grad_norm(const kiln_param *tab, size_t count, const float *grads,
                            double *per_tensor) {
    return kiln_train_grad_norm_run(NULL, tab, count, grads, per_tensor);
}

double kiln_train_grad_norm_run(kiln_pool *pool, const kiln_param *tab, size_t count,
                                const float *grads, double *per_tensor) {
    grad_job job = {(float *)grads, 0.0f, 0.0, per_tensor};
    for_chunks(pool, tab, count, sumsq_chunk, sumsq_done, &job);
    return sqrt(job.total);
}

void kiln_train_grad_scale(const kiln_param *tab, size_t count, float *grads, float s) {
    kiln_train_grad_scale_run(NULL, tab, count, grads, s);
}

void kiln_train_grad_scale_run(kiln_pool *pool, const kiln_param *tab, size_t count, float *grads,
                               float s) {
    grad_job job = {grads, s, 0.0, NULL};
    for_chunks(pool, tab, count, scale_chunk, NULL, &job);
}

/* AdamW or SGD over elements k0..k1-1 of one tensor; the squared update and weight norms of
 * those elements into un and wn. */
void kiln_train_optim_consts(const kiln_train_config *c, long t, double lr, kiln_optim_consts *o) {
    const bool adam = c->optimizer == KILN_OPTIM_ADAMW;
    /* Bias corrections folded into the step size: lr_t = lr / (1 - b1^t), and
     * sqrt(vhat) = sqrt(v) / sqrt(1 - b2^t). */
    const double bc1 = adam ? 1.0 - pow(c->beta1, (double)t) : 1.0;
    const double bc2 = adam ? 1.0 - pow(c->beta2, (double)t) : 1.0;
    *o = (kiln_optim_consts){.adam = adam,
                             .b1 = (float)c->beta1,
                             .b2 = (float)c->beta2,
                             .omb1 = (float)(1.0 - c->beta1),
                             .omb2 = (float)(1.0 - c->beta2),
                             .eps = (float)c->adam_eps,
                             .step = (float)(lr / bc1),
                             .rsq_bc2 = (float)(1.0 / sqrt(bc2)),
                             .lr = (float)lr,
                             .decay = (float)(lr * c->weight_decay),
                             .gscale = 1.0f};
}

static void optim_range(const kiln_optim_consts *a, float *p, const float *g, float *mm, float *vv,
                        float decay, size_t k0, size_t k1, double *un_out, double *wn_out) {
    double un = 0, wn = 0;
    if (a->adam) {
        for (size_t k = k0; k < k1; k++) {
            mm[k] = a->b1 * mm[k] + a->omb1 * g[k];
            vv[k] = a->b2 * vv[k] + a->omb2 * g[k] * g[k];
            float old = p[k];
            float np = old - decay * old;
            np -= a->step * mm[k] / (sqrtf(vv[k]) * a->rsq_bc2 + a->eps);
            p[k] = np;
            double d = (double)np - old;
            un += d * d;
            wn += (double)np * np;
        }
    } else {
        for (size_t k = k0; k < k1; k++) {
            float old = p[k];
            float np = old - decay * old - a->lr * g[k];
            p[k] = np;
            double d = (double)np - old;
            un += d * d;
            wn += (double)np * np;
        }
    }
    *un_out = un;
    *wn_out = wn;
}

/* A tensor is updated in chunk_of's chunks, the update and weight norms summed per chunk and
 * added in chunk order. Each element's update is the same arithmetic wherever it runs. */
typedef struct optim_job {
    kiln_optim_consts a; /* a.decay for KILN_PARAM_DECAY tensors, 0 for the others */
    float *params, *m, *v;
    const float *grads;
    double *upd_norm, *w_norm;
} optim_job;

static void optim_chunk(void *arg, const kiln_param *t, size_t k0, size_t k1, double out[2]) {
    const optim_job *o = arg;
    const size_t off = t->offset;
    optim_range(&o->a, o->params + off, o->grads + off, o->a.adam ? o->m + off : NULL,
                o->a.adam ? o->v + off : NULL, (t->flags & KILN_PARAM_DECAY) ? o->a.decay : 0.0f, k0,
                k1, &out[0], &out[1]);
}

static void optim_done(void *arg, size_t i, double un, double wn) {
    const optim_job *o = arg;
    if (o->upd_norm) o->upd_norm[i] = sqrt(un);
    if (o->w_norm) o->w_norm[i] = sqrt(wn);
}

void kiln_train_optim_step(const kiln_train_config *c, const kiln_param *tab, size_t count,
                           float *params, const float *grads, float *m, float *v, long t, double lr,
                           double *upd_norm, double *w_norm) {
    kiln_train_optim_run(NULL, c, tab, count, params, grads, m, v, t, lr, upd_norm, w_norm);
}

void kiln_train_optim_run(kiln_pool *pool, const kiln_train_config *c, const kiln_param *tab,
                          size_t count, float *params, const float *grads, float *m, float *v,
                          long t, double lr, double *upd_norm, double *w_norm) {
    optim_job job = {.params = params,
                     .m = m,
                     .v = v,
                     .grads = grads,
                     .upd_norm = upd_norm,
                     .w_norm = w_norm};
    kiln_train_optim_consts(c, t, lr, &job.a);
    for_chunks(pool, tab, count, optim_chunk, optim_done, (void *)&job);
}

/* ---- spikes ---- */

double kiln_spike_z(const kiln_spike *s, double x) {
    if (s->n < KILN_SPIKE_MIN) return 0;
    double mean = 0, var = 0;
    for (int i = 0; i < s->n; i++)
        mean += s->x[i];
    mean /= s->n;
    for (int i = 0; i < s->n; i++)
        var += (s->x[i] - mean) * (s->x[i] - mean);
    var /= s->n - 1;
    double sd = sqrt(var);
    /* A floor on the spread: a flat window would make any wiggle a spike. */
    double floor = 1e-3 * fabs(mean) + 1e-12;
    return (x - mean) / (sd > floor ? sd : floor);
}

void kiln_spike_push(kiln_spike *s, double x) {
    s->x[s->pos] = x;
    s->pos = (s->pos + 1) % KILN_SPIKE_WINDOW;
    if (s->n < KILN_SPIKE_WINDOW) s->n++;
}

json_t *kiln_spike_json(const kiln_spike *s) {
    json_t *a = json_array();
    for (int i = 0; a && i < s->n; i++)
        if (json_array_append_new(a, json_real(s->x[i]))) {
            json_decref(a);
            return NULL;
        }
    json_t *j = a ? json_pack("{s:i,s:o}", "pos", s->pos, "x", a) : NULL;
    return j;
}

kiln_err kiln_spike_from_json(const json_t *j, const char *label, kiln_spike *s) {
    memset(s, 0, sizeof *s);
    json_t *pos = json_object_get(j, "pos"), *x = json_object_get(j, "x");
    KILN_FAIL_IF(!json_is_integer(pos) || !json_is_array(x) ||
                     json_array_size(x) > KILN_SPIKE_WINDOW || json_integer_value(pos) < 0 ||
                     json_integer_value(pos) >= KILN_SPIKE_WINDOW,
                 KILN_ERR_FORMAT, "'%s': bad spike detector state", label);
    s->n = (int)json_array_size(x);
    s->pos = (int)json_integer_value(pos);
    for (int i = 0; i < s->n; i++) {
        json_t *v = json_array_get(x, (size_t)i);
        KILN_FAIL_IF(!json_is_number(v), KILN_ERR_FORMAT, "'%s': bad spike detector state", label);
        s->x[i] = json_number_value(v);
    }
    return KILN_OK;
}

/* optim.c - learning-rate schedule, gradient norm and clipping, AdamW and SGD, and the
 * spike detector. Every sum runs in a fixed order in double so that a run repeats
 * bit for bit. */
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

typedef struct grad_job {
    float *g;
    size_t n, chunk;
    float s;
    double *part;
} grad_job;

static void sumsq_item(void *arg, int j) {
    const grad_job *o = arg;
    const size_t k0 = (size_t)j * o->chunk, k1 = k0 + o->chunk < o->n ? k0 + o->chunk : o->n;
    double s = 0;
    for (size_t k = k0; k < k1; k++)
        s += (double)o->g[k] * o->g[k];
    o->part[j] = s;
}

static void scale_item(void *arg, int j) {
    const grad_job *o = arg;
    const size_t k0 = (size_t)j * o->chunk, k1 = k0 + o->chunk < o->n ? k0 + o->chunk : o->n;
    for (size_t k = k0; k < k1; k++)
        o->g[k] *= o->s;
}

double kiln_train_grad_norm(const kiln_param *tab, size_t count, const float *grads,
                            double *per_tensor) {
    return kiln_train_grad_norm_run(NULL, tab, count, grads, per_tensor);
}

double kiln_train_grad_norm_run(kiln_pool *pool, const kiln_param *tab, size_t count,
                                const float *grads, double *per_tensor) {
    double total = 0;
    for (size_t i = 0; i < count; i++) {
        double s = 0;
        if (tab[i].flags & KILN_PARAM_TRAINED) {
            double part[OPTIM_CHUNKS];
            int nc;
            grad_job job = {(float *)(grads + tab[i].offset), tab[i].numel, 0, 0.0f, part};
            job.chunk = chunk_of(tab[i].numel, &nc);
            kiln_pool_run(pool, nc, sumsq_item, &job);
            for (int j = 0; j < nc; j++)
                s += part[j];
        }
        if (per_tensor) per_tensor[i] = sqrt(s);
        total += s;
    }
    return sqrt(total);
}

void kiln_train_grad_scale(const kiln_param *tab, size_t count, float *grads, float s) {
    kiln_train_grad_scale_run(NULL, tab, count, grads, s);
}

void kiln_train_grad_scale_run(kiln_pool *pool, const kiln_param *tab, size_t count, float *grads,
                               float s) {
    for (size_t i = 0; i < count; i++) {
        if (!(tab[i].flags & KILN_PARAM_TRAINED)) continue;
        int nc;
        grad_job job = {grads + tab[i].offset, tab[i].numel, 0, s, NULL};
        job.chunk = chunk_of(tab[i].numel, &nc);
        kiln_pool_run(pool, nc, scale_item, &job);
    }
}

/* AdamW or SGD over elements k0..k1-1 of one tensor; the squared update and weight norms of
 * those elements into un and wn. */
typedef struct optim_args {
    bool adam;
    float b1, b2, omb1, omb2, eps, step, rsq_bc2, lrf;
} optim_args;

static void optim_range(const optim_args *a, float *p, const float *g, float *mm, float *vv,
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
            float np = old - decay * old - a->lrf * g[k];
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
    const optim_args *a;
    float *p, *mm, *vv;
    const float *g;
    float decay;
    size_t n, chunk;
    double (*part)[2];
} optim_job;

static void optim_item(void *arg, int j) {
    const optim_job *o = arg;
    const size_t k0 = (size_t)j * o->chunk, k1 = k0 + o->chunk < o->n ? k0 + o->chunk : o->n;
    optim_range(o->a, o->p, o->g, o->mm, o->vv, o->decay, k0, k1, &o->part[j][0], &o->part[j][1]);
}

void kiln_train_optim_step(const kiln_train_config *c, const kiln_param *tab, size_t count,
                           float *params, const float *grads, float *m, float *v, long t, double lr,
                           double *upd_norm, double *w_norm) {
    kiln_train_optim_run(NULL, c, tab, count, params, grads, m, v, t, lr, upd_norm, w_norm);
}

void kiln_train_optim_run(kiln_pool *pool, const kiln_train_config *c, const kiln_param *tab,
                          size_t count, float *params, const float *grads, float *m, float *v,
                          long t, double lr, double *upd_norm, double *w_norm) {
    const bool adam = c->optimizer == KILN_OPTIM_ADAMW;
    /* Bias corrections folded into the step size: lr_t = lr / (1 - b1^t), and
     * sqrt(vhat) = sqrt(v) / sqrt(1 - b2^t). */
    const double bc1 = adam ? 1.0 - pow(c->beta1, (double)t) : 1.0;
    const double bc2 = adam ? 1.0 - pow(c->beta2, (double)t) : 1.0;
    const optim_args a = {.adam = adam,
                          .b1 = (float)c->beta1,
                          .b2 = (float)c->beta2,
                          .omb1 = (float)(1.0 - c->beta1),
                          .omb2 = (float)(1.0 - c->beta2),
                          .eps = (float)c->adam_eps,
                          .step = (float)(lr / bc1),
                          .rsq_bc2 = (float)(1.0 / sqrt(bc2)),
                          .lrf = (float)lr};
    for (size_t i = 0; i < count; i++) {
        double un = 0, wn = 0;
        if (tab[i].flags & KILN_PARAM_TRAINED) {
            const size_t off = tab[i].offset, n = tab[i].numel;
            float *p = params + off, *mm = adam ? m + off : NULL, *vv = adam ? v + off : NULL;
            const float *g = grads + off;
            const float decay =
                (tab[i].flags & KILN_PARAM_DECAY) ? (float)(lr * c->weight_decay) : 0.0f;
            int nc;
            const size_t chunk = chunk_of(n, &nc);
            double part[OPTIM_CHUNKS][2];
            optim_job job = {&a, p, mm, vv, g, decay, n, chunk, part};
            kiln_pool_run(pool, nc, optim_item, &job);
            for (int j = 0; j < nc; j++) {
                un += part[j][0];
                wn += part[j][1];
            }
        }
        if (upd_norm) upd_norm[i] = sqrt(un);
        if (w_norm) w_norm[i] = sqrt(wn);
    }
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

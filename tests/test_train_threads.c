/* test_train_threads.c - the CPU trainer's thread count changes its speed, never its bits:
 * runs of a mixture and a dense model with threads 1, 2 and 3 write the same checkpoint
 * files, and a run interrupted and resumed with another thread count ends with the bytes of
 * the uninterrupted one. The sizes are the smallest that give every parallel op several
 * fixed pieces with a partial last one (288 tokens = 4 pieces of 64 and one of 32; d_ff 96
 * = a weight-gradient block of 64 and one of 32) and that OpenBLAS itself would run on
 * several threads (more than 4 x 65536 multiply-adds per product), which is what made the
 * bits depend on the thread count before. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "testutil.h"
#include "train_int.h"

static void threads_config(kiln_train_config *c, int n_experts) {
    kiln_train_config_default(c);
    c->model = (kiln_model_config){.d_model = 32,
                                   .n_layers = 2,
                                   .n_heads = 4,
                                   .d_ff = 96,
                                   .n_experts = n_experts,
                                   .top_k = n_experts ? 2 : 0,
                                   .seq_len = 48,
                                   .attn_window = 16,
                                   .norm_eps = 1e-5f};
    c->batch_size = 6;
    c->steps = 4;
    c->warmup_steps = 2;
    c->eval_every = 2;
    c->ckpt_every = 2;
    c->keep = 0;
    /* Capacity 1.0: some choices are dropped, so the skipped slots' paths run too. */
    c->capacity_factor = n_experts ? 1.0 : 0.0;
}

static bool file_bytes(const char *path, char **buf, size_t *len) {
    return kiln_read_file(path, 1 << 26, buf, len) == KILN_OK;
}

/* Train cfg with `threads` into a fresh directory; the last checkpoint's bytes. */
static bool train_bytes(const kiln_train_config *cfg, const char *data, const char *name,
                        int threads, char **buf, size_t *len) {
    kiln_train_config c = *cfg;
    c.threads = threads;
    char *dir = kiln_test_path(name), *last = kiln_run_ckpt_path(dir, c.steps);
    kiln_train_opts o = {.run_dir = dir, .data_path = data};
    bool ok = dir && last && kiln_train_start(&c, &o) == KILN_OK && file_bytes(last, buf, len);
    free(dir), free(last);
    return ok;
}

/* The tensors' digest a checkpoint records: equal data, whatever the metadata says. */
static bool same_data(const char *a, size_t la, const char *b, size_t lb) {
    const char *key = "kiln.data_sha256";
    const char *pa = memmem(a, la, key, strlen(key)), *pb = memmem(b, lb, key, strlen(key));
    return pa && pb && !memcmp(pa, pb, strlen(key) + 70);
}

static void same_bytes_for_every_thread_count(int n_experts) {
    kiln_log_set_level(KILN_LOG_ERROR);
    char *data = kiln_test_synth("d.safetensors", 1, 600);
    char *b[3] = {NULL, NULL, NULL};
    size_t l[3] = {0, 0, 0};
    kiln_train_config c;
    threads_config(&c, n_experts);
    const char *names[3] = {"t1", "t2", "t3"};
    bool trained = data != NULL;
    for (int i = 0; trained && i < 3; i++)
        trained = CHECK(names[i], train_bytes(&c, data, names[i], i + 1, &b[i], &l[i]));
    if (trained) {
        CHECK("tensors: 2 threads = 1 thread", same_data(b[0], l[0], b[1], l[1]));
        CHECK("tensors: 3 threads = 1 thread", same_data(b[0], l[0], b[2], l[2]));
        CHECK("file: 2 threads = 1 thread", l[0] == l[1] && !memcmp(b[0], b[1], l[0]));
        CHECK("file: 3 threads = 1 thread", l[0] == l[2] && !memcmp(b[0], b[2], l[0]));
    }
    kiln_log_set_level(KILN_LOG_INFO);
    free(data);
    for (int i = 0; i < 3; i++)
        free(b[i]);
}

KILN_TEST(train_threads_moe_same_bytes) {
    same_bytes_for_every_thread_count(4);
}

KILN_TEST(train_threads_dense_same_bytes) {
    same_bytes_for_every_thread_count(0);
}

static void stop_at_2(void *ctx, const kiln_train_progress *p) {
    if (p->step == 2) *(volatile int *)ctx = 1;
}

/* Steps 1-2 on one thread, interrupted; resumed with threads=3: the bytes of 4 steps on 2. */
KILN_TEST(train_threads_resume_changes_threads) {
    kiln_log_set_level(KILN_LOG_ERROR);
    char *data = kiln_test_synth("d.safetensors", 1, 600), *dir = kiln_test_path("cut");
    char *last = kiln_run_ckpt_path(dir, 4), *whole = NULL, *cut = NULL;
    size_t lw = 0, lc = 0;
    volatile int stop = 0;
    kiln_train_config c;
    threads_config(&c, 4);
    c.threads = 1;
    kiln_train_opts o = {.run_dir = dir,
                         .data_path = data,
                         .progress = stop_at_2,
                         .progress_ctx = (void *)&stop,
                         .stop = &stop};
    const char *sets[] = {"threads=3"};
    kiln_train_opts r = {.run_dir = dir, .sets = sets, .n_sets = 1};
    if (!CHECK("uninterrupted, 2 threads",
               data && dir && last && train_bytes(&c, data, "whole", 2, &whole, &lw)))
        goto out;
    CHECK("interrupted at step 2", kiln_train_start(&c, &o) == KILN_ERR_INTERRUPTED);
    CHECK("resumed with threads=3", kiln_train_resume(&r) == KILN_OK);
    CHECK("same bytes", file_bytes(last, &cut, &lc) && lc == lw && !memcmp(cut, whole, lw));
out:
    kiln_log_set_level(KILN_LOG_INFO);
    free(data), free(dir), free(last), free(whole), free(cut);
}

/* The pool runs every item of every loop exactly once, loops back to back with item counts
 * that change from one to the next (a worker that wakes late must not take an item of a loop
 * whose fields it did not read, nor one past its count). */
typedef struct pool_job {
    int *hits;
} pool_job;

static void pool_item(void *ctx, int i) {
    volatile int spin = 0; /* long enough that the workers take items too */
    for (int k = 0; k < 200 * (i % 3); k++)
        spin += k;
    __atomic_fetch_add(&((pool_job *)ctx)->hits[i], 1, __ATOMIC_RELAXED);
}

KILN_TEST(train_threads_pool_each_item_once) {
    kiln_pool *p = NULL;
    if (!CHECK("pool", kiln_pool_create(3, &p) == KILN_OK && kiln_pool_threads(p) == 3)) return;
    int hits[16];
    bool ok = true;
    const int loops = kiln_test_sanitized() ? 20000 : 100000;
    for (int r = 0; r < loops && ok; r++) {
        const int count = 1 + (r * 7) % 16;
        memset(hits, 0, sizeof hits);
        pool_job job = {hits};
        kiln_pool_run(p, count, pool_item, &job);
        for (int i = 0; i < 16; i++)
            ok &= hits[i] == (i < count);
    }
    CHECK("each item once", ok);
    kiln_pool_free(p);
    kiln_pool_free(NULL);
}

/* AdamW, the gradient norm and the clipping run every trained tensor's chunks as the items
 * of one pool loop (of several past 1024 items or tensors): against a plain loop over the
 * elements, on 3 threads. The table has tensors of one chunk, of a chunk and one element, of
 * five chunks, an untrained one, and 1100 of three elements, so that batches fill up by
 * tensors and by items, and a tensor of several chunks starts a new batch. */
#define OT_SMALL 1100
KILN_TEST(train_threads_optim_one_loop) {
    const size_t big[] = {100, 16384, 16385, 50, 5 * 16384 + 7};
    const size_t nbig = sizeof big / sizeof *big, count = nbig + OT_SMALL + 1;
    kiln_param *tab = calloc(count, sizeof *tab);
    size_t numel = 0;
    for (size_t i = 0; tab && i < count; i++) {
        tab[i].numel = i < nbig ? big[i] : i < count - 1 ? 3 : big[4];
        tab[i].offset = numel;
        const bool off = i == 3 || (i >= nbig + OT_SMALL / 2 && i < count - 1 && i % 2);
        tab[i].flags = off ? 0 : KILN_PARAM_TRAINED | (i % 4 == 2 ? KILN_PARAM_DECAY : 0);
        numel += tab[i].numel;
    }
    float *f = tab ? malloc(7 * numel * sizeof *f) : NULL;
    double *norms = malloc(5 * count * sizeof *norms);
    kiln_pool *pool = NULL;
    if (!CHECK("setup", f && norms && kiln_pool_create(3, &pool) == KILN_OK)) goto out;
    float *p = f, *g = p + numel, *m = g + numel, *v = m + numel, *rp = v + numel, *rm = rp + numel,
          *rv = rm + numel;
    for (size_t k = 0; k < numel; k++) {
        rp[k] = p[k] = (float)((k * 2654435761u) % 2001) / 1000.0f - 1.0f;
        g[k] = (float)((k * 40503u) % 1999) / 500.0f - 2.0f;
        rm[k] = m[k] = g[k] / 8;
        rv[k] = v[k] = g[k] * g[k] / 4;
    }
    kiln_train_config c;
    kiln_train_config_default(&c);
    const long t = 3;
    const double lr = 1e-3, bc1 = 1.0 - pow(c.beta1, (double)t),
                 bc2 = 1.0 - pow(c.beta2, (double)t);
    double *gn = norms, *un = gn + count, *wn = un + count, *rgn = wn + count, *run = rgn + count;
    double total = 0;
    bool elems = true, sums = true;
    for (size_t i = 0; i < count; i++) {
        const kiln_param *q = &tab[i];
        double s = 0, u = 0;
        for (size_t k = q->offset; q->flags && k < q->offset + q->numel; k++) {
            s += (double)g[k] * g[k];
            rm[k] = (float)c.beta1 * rm[k] + (float)(1.0 - c.beta1) * g[k];
            rv[k] = (float)c.beta2 * rv[k] + (float)(1.0 - c.beta2) * g[k] * g[k];
            const float old = rp[k],
                        decay = (q->flags & KILN_PARAM_DECAY) ? (float)(lr * c.weight_decay) : 0;
            float np = old - decay * old;
            np -= (float)(lr / bc1) * rm[k] /
                  (sqrtf(rv[k]) * (float)(1.0 / sqrt(bc2)) + (float)c.adam_eps);
            rp[k] = np;
            u += ((double)np - old) * ((double)np - old);
        }
        rgn[i] = sqrt(s);
        run[i] = sqrt(u);
        total += s;
    }
    const double norm = kiln_train_grad_norm_run(pool, tab, count, g, gn);
    kiln_train_optim_run(pool, &c, tab, count, p, g, m, v, t, lr, un, wn);
    sums &= fabs(norm - sqrt(total)) <= 1e-12 * sqrt(total);
    for (size_t i = 0; i < count; i++)
        sums &= fabs(gn[i] - rgn[i]) <= 1e-12 * rgn[i] && fabs(un[i] - run[i]) <= 1e-9 * run[i];
    elems &= !memcmp(p, rp, numel * sizeof *p) && !memcmp(m, rm, numel * sizeof *m) &&
             !memcmp(v, rv, numel * sizeof *v);
    CHECK("AdamW: every element as a plain loop computes it", elems);
    CHECK("the norms: every tensor's, as plain sums (within rounding)", sums);
    kiln_train_grad_scale_run(pool, tab, count, g, 0.5f);
    bool scaled = true;
    for (size_t i = 0; i < count; i++)
        for (size_t k = tab[i].offset; tab[i].flags && k < tab[i].offset + tab[i].numel; k++)
            scaled &= g[k] == ((float)((k * 40503u) % 1999) / 500.0f - 2.0f) * 0.5f;
    CHECK("the clipping scales every trained element", scaled);
out:
    kiln_pool_free(pool);
    free(tab), free(f), free(norms);
}


/* pool.c - the trainer's threads: a fixed set of workers that run the items of one loop at a
 * time with the caller (kiln_pool_run). Items are claimed one by one from a ticket that
 * carries the loop's generation and item count with the next item, so a worker that wakes
 * late cannot take an item of a loop whose function it did not read, nor one past the count
 * (with the count in a field of its own, a worker that read the next loop's count took an
 * item past the end of the loop before: tests/test_train_threads.c, the pool test). A waiting
 * thread spins up to SPIN pauses (the next loop usually follows at once) and then sleeps on a
 * condition variable: on a machine with more runnable threads than cores a spinning thread would
 * take the core the others need (libgomp's default spin of some milliseconds made a 2-thread run of
 * the default config 15 times slower in CPU time on the loaded build machine). Results never depend
 * on which thread runs an item: the callers' items write disjoint outputs (train/model.c, "work
 * items"). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "train_int.h"

/* Checks before a waiting thread sleeps: about 10 us where a pause takes a few cycles (older
 * cores), 100-170 us on the build VM's Xeon (25-40 ns a pause). */
#define SPIN 4000

/* ticket: generation (24 bits) | item count (20 bits) | next item (20 bits) */
#define ITEM_BITS 20
#define MAX_ITEMS ((1 << ITEM_BITS) - 1)
#define GEN_SHIFT (2 * ITEM_BITS)
#define T_GEN(t) ((uint32_t)((t) >> GEN_SHIFT))
#define T_COUNT(t) ((int)(((t) >> ITEM_BITS) & MAX_ITEMS))
#define T_NEXT(t) ((int)((t)&MAX_ITEMS))

struct kiln_pool {
    int n_workers;
    pthread_t *workers;
    pthread_mutex_t mu;
    pthread_cond_t work, done_cv;
    _Atomic uint64_t ticket; /* T_GEN, T_COUNT, T_NEXT */
    _Atomic(kiln_pool_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int done, sleepers, caller_sleeps, quit;
};

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Run items of generation gen until none is left. fn and ctx are read after the ticket of
 * gen was seen; they are the loop's as long as an item of gen is left to claim (the caller
 * writes the next loop's only after every item of this one is done), and a claim succeeds
 * only then. */
static void run_items(kiln_pool *p, uint32_t gen) {
    kiln_pool_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
    void *ctx = atomic_load_explicit(&p->ctx, memory_order_relaxed);
    uint64_t t = atomic_load(&p->ticket);
    for (;;) {
        if (T_GEN(t) != gen || T_NEXT(t) >= T_COUNT(t)) return;
        if (!atomic_compare_exchange_weak(&p->ticket, &t, t + 1)) continue;
        fn(ctx, T_NEXT(t));
        if (atomic_fetch_add(&p->done, 1) + 1 == T_COUNT(t) && atomic_load(&p->caller_sleeps)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
        t = atomic_load(&p->ticket);
    }
}

static void *worker(void *arg) {
    kiln_pool *p = arg;
    uint32_t seen = 0;
    for (;;) {
        uint32_t gen = T_GEN(atomic_load(&p->ticket));
        for (int i = 0; gen == seen && i < SPIN && !atomic_load(&p->quit); i++) {
            relax();
            gen = T_GEN(atomic_load(&p->ticket));
        }
        if (gen == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((gen = T_GEN(atomic_load(&p->ticket))) == seen && !atomic_load(&p->quit))
                pthread_cond_wait(&p->work, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) return NULL;
        seen = gen;
        run_items(p, gen);
    }
}

kiln_err kiln_pool_create(int threads, kiln_pool **out) {
    *out = NULL;
    kiln_pool *p = kiln_calloc(1, sizeof *p);
    if (!p) return KILN_ERR_NOMEM;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    const int want = threads > 1 ? threads - 1 : 0;
    if (want && !(p->workers = kiln_calloc((size_t)want, sizeof *p->workers))) {
        kiln_pool_free(p);
        return KILN_ERR_NOMEM;
    }
    for (; p->n_workers < want; p->n_workers++) {
        int e = pthread_create(&p->workers[p->n_workers], NULL, worker, p);
        if (e) {
            kiln_pool_free(p);
            return kiln_fail(KILN_ERR_NOMEM, "cannot start trainer thread %d of %d: error %d",
                             p->n_workers + 2, threads, e);
        }
    }
    *out = p;
    return KILN_OK;
}

void kiln_pool_free(kiln_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_workers; i++)
        pthread_join(p->workers[i], NULL);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p);
}

int kiln_pool_threads(const kiln_pool *p) {
    return p ? p->n_workers + 1 : 1;
}

void kiln_pool_run(kiln_pool *p, int count, kiln_pool_fn fn, void *ctx) {
    if (count <= 0) return;
    if (!p || !p->n_workers || count == 1 || count > MAX_ITEMS) {
        for (int i = 0; i < count; i++)
            fn(ctx, i);
        return;
    }
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
    atomic_store(&p->done, 0);
    const uint32_t gen = (T_GEN(atomic_load(&p->ticket)) + 1) & 0xffffff;
    /* publishes the fields above */
    atomic_store(&p->ticket, (uint64_t)gen << GEN_SHIFT | (uint64_t)count << ITEM_BITS);
    if (atomic_load(&p->sleepers)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->work);
        pthread_mutex_unlock(&p->mu);
    }
    run_items(p, gen);
    for (int i = 0; atomic_load(&p->done) < count && i < SPIN; i++)
        relax();
    if (atomic_load(&p->done) < count) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_sleeps, 1);
        while (atomic_load(&p->done) < count)
            pthread_cond_wait(&p->done_cv, &p->mu);
        atomic_store(&p->caller_sleeps, 0);
        pthread_mutex_unlock(&p->mu);
    }
}

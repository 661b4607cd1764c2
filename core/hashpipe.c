/* hashpipe.c - SHA-256 and BLAKE2b-512 of a stream on threads of their own, fed from the
 * buffers its reader fills anyway (core.h, "hash pipe").
 *
 * A pull hashes every archive byte with SHA-256 (the digest the channel record names) and
 * BLAKE2b-512 (the prehash the release signatures sign), and decompresses the same bytes;
 * `kiln verify` hashes and decompresses. One thread per digest lets a second core take the
 * hashing while the first decompresses and writes, from one read of the bytes. */
#include <pthread.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core.h"

enum { NH_MAX = 2 };

struct kiln_hashpipe {
    crypto_generichash_state b2; /* first: 64-byte aligned by posix_memalign */
    kiln_sha256_state sha;
    int which;
    bool threaded, closing;
    int nh;           /* hashers: 0 SHA-256, 1 BLAKE2b (those asked for) */
    int kind[NH_MAX]; /* KILN_HASH_* of each */
    pthread_t th[NH_MAX];
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t posted;       /* chunks posted */
    uint64_t done[NH_MAX]; /* chunks each hasher finished */
    uint64_t bytes;        /* bytes posted since the start or the last reset */
    size_t len[KILN_HASHPIPE_SLOTS];
    uint8_t *buf;         /* KILN_HASHPIPE_SLOTS chunks */
    double cpu_s[NH_MAX]; /* each hasher thread's CPU time, for the debug log */
};

static double thread_cpu_s(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void hash_chunk(kiln_hashpipe *p, int kind, const uint8_t *b, size_t n) {
    if (kind == KILN_HASH_SHA256)
        kiln_sha256_update(&p->sha, b, n);
    else
        crypto_generichash_update(&p->b2, b, (unsigned long long)n);
}

static uint64_t min_done(const kiln_hashpipe *p) {
    uint64_t m = p->posted;
    for (int k = 0; k < p->nh; k++)
        if (p->done[k] < m) m = p->done[k];
    return m;
}

static void *hasher(void *arg) {
    kiln_hashpipe *p = arg;
    /* Which hasher this thread is: the first not yet claimed. */
    pthread_mutex_lock(&p->mu);
    int k = p->started++;
    pthread_cond_broadcast(&p->cv);
    for (;;) {
        while (p->done[k] == p->posted && !p->closing)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->done[k] == p->posted) break; /* closing, all done */
        uint64_t i = p->done[k];
        size_t n = p->len[i % KILN_HASHPIPE_SLOTS];
        pthread_mutex_unlock(&p->mu);
        hash_chunk(p, p->kind[k], p->buf + (i % KILN_HASHPIPE_SLOTS) * KILN_HASHPIPE_CHUNK, n);
        pthread_mutex_lock(&p->mu);
        p->done[k]++;
        pthread_cond_broadcast(&p->cv);
    }
    p->cpu_s[k] = thread_cpu_s();
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void states_init(kiln_hashpipe *p) {
    if (p->which & KILN_HASH_SHA256) kiln_sha256_init(&p->sha);
    if (p->which & KILN_HASH_BLAKE2B)
        crypto_generichash_init(&p->b2, NULL, 0, crypto_generichash_BYTES_MAX);
    p->bytes = 0;
}

kiln_err kiln_hashpipe_new(int which, bool threads, kiln_hashpipe **out) {
    *out = NULL;
    KILN_FAIL_IF(!(which & (KILN_HASH_SHA256 | KILN_HASH_BLAKE2B)), KILN_ERR_USAGE,
                 "a hash pipe needs a hash");
    KILN_FAIL_IF(sodium_init() < 0, KILN_ERR_INTERNAL, "libsodium failed to initialise");
    void *mem = NULL;
    if (posix_memalign(&mem, 64, sizeof(kiln_hashpipe)) != 0)
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_hashpipe *p = mem;
    memset(p, 0, sizeof *p);
    p->buf = kiln_malloc((size_t)KILN_HASHPIPE_SLOTS * KILN_HASHPIPE_CHUNK);
    if (!p->buf) {
        free(p);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    p->which = which;
    if (which & KILN_HASH_SHA256) p->kind[p->nh++] = KILN_HASH_SHA256;
    if (which & KILN_HASH_BLAKE2B) p->kind[p->nh++] = KILN_HASH_BLAKE2B;
    states_init(p);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (threads) {
        p->threaded = true;
        for (int k = 0; k < p->nh; k++) {
            if (pthread_create(&p->th[k], NULL, hasher, p) != 0) {
                /* Fewer threads than hashers: hash the rest in post, as unthreaded. */
                pthread_mutex_lock(&p->mu);
                while (p->started < k)
                    pthread_cond_wait(&p->cv, &p->mu);
                p->closing = true;
                pthread_cond_broadcast(&p->cv);
                pthread_mutex_unlock(&p->mu);
                for (int j = 0; j < k; j++)
                    pthread_join(p->th[j], NULL);
                p->closing = false;
                p->threaded = false;
                p->started = 0;
                break;
            }
        }
    }
    *out = p;
    return KILN_OK;
}

uint8_t *kiln_hashpipe_slot(kiln_hashpipe *p) {
    if (p->threaded) {
        pthread_mutex_lock(&p->mu);
        while (p->posted - min_done(p) >= KILN_HASHPIPE_SLOTS)
            pthread_cond_wait(&p->cv, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
    return p->buf + (p->posted % KILN_HASHPIPE_SLOTS) * KILN_HASHPIPE_CHUNK;
}

void kiln_hashpipe_post(kiln_hashpipe *p, size_t n) {
    if (n > KILN_HASHPIPE_CHUNK) n = KILN_HASHPIPE_CHUNK;
    if (!n) return;
    uint8_t *b = p->buf + (p->posted % KILN_HASHPIPE_SLOTS) * KILN_HASHPIPE_CHUNK;
    if (!p->threaded) {
        for (int k = 0; k < p->nh; k++)
            hash_chunk(p, p->kind[k], b, n);
        p->posted++;
        for (int k = 0; k < p->nh; k++)
            p->done[k] = p->posted;
        p->bytes += n;
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->len[p->posted % KILN_HASHPIPE_SLOTS] = n;
    p->posted++;
    p->bytes += n;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void wait_idle(kiln_hashpipe *p) {
    if (!p->threaded) return;
    pthread_mutex_lock(&p->mu);
    while (min_done(p) != p->posted)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void kiln_hashpipe_reset(kiln_hashpipe *p) {
    wait_idle(p); /* the hashers wait for the next chunk, touching no state */
    states_init(p);
}

static void stop(kiln_hashpipe *p) {
    if (!p->threaded) return;
    pthread_mutex_lock(&p->mu);
    p->closing = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int k = 0; k < p->nh; k++)
        pthread_join(p->th[k], NULL);
    p->threaded = false;
}

void kiln_hashpipe_finish(kiln_hashpipe *p, uint8_t *sha256, uint8_t *blake2b, uint64_t *bytes) {
    wait_idle(p);
    bool threaded = p->threaded;
    stop(p);
    /* Where the CPU went: on free cores, the slowest thread is the time the pass takes. */
    for (int k = 0; threaded && k < p->nh; k++)
        kiln_debug("hash pipe: the %s thread: %.3f s CPU for %.1f MB",
                   p->kind[k] == KILN_HASH_SHA256 ? "SHA-256" : "BLAKE2b", p->cpu_s[k],
                   (double)p->bytes / 1e6);
    uint8_t junk[crypto_generichash_BYTES_MAX];
    if (p->which & KILN_HASH_SHA256) kiln_sha256_final(&p->sha, sha256 ? sha256 : junk);
    if (p->which & KILN_HASH_BLAKE2B)
        crypto_generichash_final(&p->b2, blake2b ? blake2b : junk, crypto_generichash_BYTES_MAX);
    p->which = 0;
    if (bytes) *bytes = p->bytes;
}

void kiln_hashpipe_free(kiln_hashpipe *p) {
    if (!p) return;
    stop(p);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->buf);
    free(p);
}

double kiln_thread_cpu_s(void) {
    return thread_cpu_s();
}

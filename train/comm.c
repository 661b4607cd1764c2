/* comm.c - the single-process communicator and what the trainer builds on any
 * communicator: the gradient sum in shard order, error agreement, gradient buckets.
 * The arithmetic lives here, once; communicators only move bytes, so which one carries
 * the data (none, MPI, NCCL) cannot change a result. */
#include <string.h>

#include "train_int.h"

/* ---- one process ---- */

static kiln_err single_bcast(kiln_comm *c, void *buf, size_t bytes, int root) {
    KILN_FAIL_IF(root != 0, KILN_ERR_USAGE, "'bcast': root %d out of range (1 rank)", root);
    return KILN_OK;
}

static kiln_err single_copy(kiln_comm *c, const void *send, void *recv, size_t bytes) {
    if (send != recv && bytes) memmove(recv, send, bytes);
    return KILN_OK;
}

static kiln_err single_allreduce(kiln_comm *c, float *buf, size_t n) {
    return KILN_OK;
}

static kiln_comm single = {.rank = 0,
                           .size = 1,
                           .name = "single",
                           .bcast = single_bcast,
                           .allgather = single_copy,
                           .alltoall = single_copy,
                           .allreduce_sum = single_allreduce};

kiln_comm *kiln_comm_single(void) {
    return &single;
}

void kiln_comm_free(kiln_comm *c) {
    if (c && c->destroy) c->destroy(c);
}

/* ---- the gradient sum ---- */

size_t kiln_dist_padded(int size, size_t n) {
    size_t chunk = n / (size_t)size + (n % (size_t)size != 0), out;
    return kiln_mul_ok(chunk, (size_t)size, &out) ? out : 0;
}

size_t kiln_dist_work_floats(int size, int k, size_t n) {
    if (size == 1) return 0;
    size_t padded = kiln_dist_padded(size, n), chunk = padded / (size_t)size, w;
    /* recv [k][size][chunk], my sums [chunk], gathered sums [size*chunk] */
    if (!padded || !kiln_mul_ok(padded, (size_t)k + 1, &w)) return 0;
    return w + chunk;
}

kiln_err kiln_dist_sum_shards(kiln_comm *c, float *const *shards, int k, size_t n, float *out,
                              float *work) {
    KILN_FAIL_IF(k < 1, KILN_ERR_USAGE, "'sum_shards': %d shards per rank", k);
    if (c->size == 1) {
        if (out != shards[0]) memcpy(out, shards[0], n * sizeof *out);
        for (int j = 1; j < k; j++) {
            const float *s = shards[j];
            for (size_t e = 0; e < n; e++)
                out[e] += s[e];
        }
        return KILN_OK;
    }
    const size_t padded = kiln_dist_padded(c->size, n), chunk = padded / (size_t)c->size;
    float *recv = work, *mine = work + (size_t)k * padded, *all = mine + chunk;
    /* recv[j][q] = this rank's slice of shard q*k + j. */
    for (int j = 0; j < k; j++)
        KILN_TRY(c->alltoall(c, shards[j], recv + (size_t)j * padded, chunk * sizeof(float)));
    /* Shard g = q*k + j, in order g = 0, 1, ...: the same fold a single process does. */
    memcpy(mine, recv, chunk * sizeof *mine);
    for (int g = 1; g < c->size * k; g++) {
        const float *s = recv + (size_t)(g % k) * padded + (size_t)(g / k) * chunk;
        for (size_t e = 0; e < chunk; e++)
            mine[e] += s[e];
    }
    KILN_TRY(c->allgather(c, mine, all, chunk * sizeof *mine));
    memcpy(out, all, n * sizeof *out);
    return KILN_OK;
}

/* ---- agreement ---- */

kiln_err kiln_dist_agree(kiln_comm *c, kiln_err rc, double *mine, size_t n, double *all) {
    mine[0] = (double)rc;
    kiln_err crc = c->allgather(c, mine, all, (n + 1) * sizeof *mine);
    if (crc) return crc;
    int failed = -1;
    for (int r = 0; r < c->size && failed < 0; r++)
        if (all[(size_t)r * (n + 1)] != 0) failed = r;
    if (failed < 0 || c->size == 1) return failed < 0 ? KILN_OK : rc;
    kiln_err code = (kiln_err)all[(size_t)failed * (n + 1)];
    char msg[1024];
    memset(msg, 0, sizeof msg);
    if (c->rank == failed) snprintf(msg, sizeof msg, "%s", kiln_errmsg());
    KILN_TRY(c->bcast(c, msg, sizeof msg, failed));
    msg[sizeof msg - 1] = 0;
    if (c->rank == failed) return code;
    return kiln_fail(code, "rank %d: %s", failed, msg);
}

/* ---- buckets ---- */

size_t kiln_dist_buckets(const kiln_param *tab, size_t count, size_t bucket_bytes,
                         kiln_dist_bucket *out, size_t cap) {
    size_t nb = 0, end = 0;
    bool open = false;
    kiln_dist_bucket cur = {0};
    for (size_t i = count; i-- > 0;) {
        if (!open) {
            end = tab[i].offset + tab[i].numel;
            cur.first_param = i;
            open = true;
        }
        /* The block is laid out in table order, so walking the table backwards keeps a
         * bucket contiguous: it grows downwards from the end of its first tensor. */
        cur.offset = tab[i].offset;
        cur.numel = end - tab[i].offset;
        cur.last_param = i;
        if (cur.numel * sizeof(float) >= bucket_bytes || i == 0) {
            if (nb < cap) out[nb] = cur;
            nb++;
            open = false;
        }
    }
    return nb;
}

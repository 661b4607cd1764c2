/* sampler.c - which windows a step trains on and which the validation uses. Training
 * windows are a pure function of (seed, step, slot) through the counter-based
 * generator, so a resumed run draws exactly what the uninterrupted one would have. */
#include <string.h>

#include "train_int.h"

size_t kiln_train_window(uint64_t seed, long i, int slots, int slot, size_t train_end,
                         int seq_len) {
    uint32_t w[4];
    kiln_philox(seed, KILN_STREAM_BATCH, (uint64_t)i * (uint64_t)slots + (uint64_t)slot, w);
    uint64_t r = (uint64_t)w[0] << 32 | w[1];
    uint64_t starts = (uint64_t)(train_end - (size_t)seq_len) + 1;
    /* 64 random bits over at most ~2^40 starts: the modulo bias is below 2^-24. */
    return (size_t)(r % starts);
}

size_t kiln_train_window_split(uint64_t seed, long i, int slots, int slot, const kiln_split *sp,
                               int seq_len) {
    if (!sp->n_ranges) return kiln_train_window(seed, i, slots, slot, sp->train_end, seq_len);
    /* Groups: a start drawn uniformly over every group's training starts, so a window never
     * holds rows of two groups. */
    const size_t S = (size_t)seq_len;
    uint64_t total = 0;
    for (size_t g = 0; g < sp->n_ranges; g++) {
        size_t len = sp->ranges[g].train_end - sp->ranges[g].train_begin;
        total += len >= S ? len - S + 1 : 0;
    }
    uint32_t w[4];
    kiln_philox(seed, KILN_STREAM_BATCH, (uint64_t)i * (uint64_t)slots + (uint64_t)slot, w);
    uint64_t k = ((uint64_t)w[0] << 32 | w[1]) % total;
    for (size_t g = 0;; g++) {
        size_t len = sp->ranges[g].train_end - sp->ranges[g].train_begin;
        uint64_t n = len >= S ? len - S + 1 : 0;
        if (k < n) return sp->ranges[g].train_begin + (size_t)k;
        k -= n;
    }
}

size_t kiln_train_val_windows(const kiln_split *sp, int seq_len, size_t cap, size_t *starts) {
    return kiln_split_val_windows(sp, seq_len, cap, starts);
}

void kiln_train_gather(const kiln_dataset *ds, const size_t *starts, size_t n, int seq_len,
                       float *x, float *y) {
    const size_t F = (size_t)ds->n_features, O = (size_t)ds->n_outputs, S = (size_t)seq_len;
    for (size_t b = 0; b < n; b++) {
        memcpy(x + b * S * F, ds->features + starts[b] * F, S * F * sizeof *x);
        memcpy(y + b * S * O, ds->targets + starts[b] * O, S * O * sizeof *y);
    }
}

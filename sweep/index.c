/* index.c - a map from borrowed strings to positions (sweep_int.h): the point names of a
 * spec, the jobs of a root and the jobs Slurm knows, so that expansion, submission and status
 * look each name up once instead of scanning every earlier one. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "sweep_int.h"

/* FNV-1a, 64 bits. */
static uint64_t hash(const char *s) {
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

kiln_err sweep_index_init(sweep_index *x, size_t expect) {
    memset(x, 0, sizeof *x);
    size_t cap = 16;
    while (cap < expect * 2 && cap < ((size_t)1 << 40))
        cap *= 2;
    x->keys = kiln_calloc(cap, sizeof *x->keys);
    x->vals = kiln_calloc(cap, sizeof *x->vals);
    if (!x->keys || !x->vals) {
        sweep_index_release(x);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    x->cap = cap;
    return KILN_OK;
}

void sweep_index_release(sweep_index *x) {
    if (!x) return;
    free(x->keys);
    free(x->vals);
    memset(x, 0, sizeof *x);
}

/* The slot of key, or the empty slot where it would go. */
static size_t slot(const sweep_index *x, const char *key) {
    size_t i = (size_t)hash(key) & (x->cap - 1);
    while (x->keys[i] && strcmp(x->keys[i], key))
        i = (i + 1) & (x->cap - 1);
    return i;
}

kiln_err sweep_index_put(sweep_index *x, const char *key, size_t val) {
    if ((x->n + 1) * 2 > x->cap) {
        sweep_index bigger;
        KILN_TRY(sweep_index_init(&bigger, x->cap));
        for (size_t i = 0; i < x->cap; i++)
            if (x->keys[i]) {
                size_t j = slot(&bigger, x->keys[i]);
                bigger.keys[j] = x->keys[i];
                bigger.vals[j] = x->vals[i];
            }
        bigger.n = x->n;
        sweep_index_release(x);
        *x = bigger;
    }
    size_t i = slot(x, key);
    if (!x->keys[i]) x->n++;
    x->keys[i] = key;
    x->vals[i] = val;
    return KILN_OK;
}

size_t sweep_index_get(const sweep_index *x, const char *key) {
    if (!x->cap) return SIZE_MAX;
    size_t i = slot(x, key);
    return x->keys[i] ? x->vals[i] : SIZE_MAX;
}

/*
 * philox.h - Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as
 * 1, 2, 3", SC'11), the counter-based generator of Random123, cuRAND and JAX.
 *
 * The value for (seed, stream, counter) is a pure function: a sampler jumps to
 * any step without replaying, and host and device code draw the same 32-bit words.
 * Header-only so that CUDA kernels include the same code.
 */
#ifndef KILN_PHILOX_H
#define KILN_PHILOX_H

#include <stdint.h>

#if defined(__CUDACC__)
#define KILN_HD __host__ __device__ __forceinline__
#else
#define KILN_HD static inline
#endif

#define KILN_PHILOX_M0 0xD2511F53u
#define KILN_PHILOX_M1 0xCD9E8D57u
#define KILN_PHILOX_W0 0x9E3779B9u
#define KILN_PHILOX_W1 0xBB67AE85u

/* The raw block function: ctr[4] and key[2] in, out[4] out. */
KILN_HD void kiln_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)KILN_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)KILN_PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += KILN_PHILOX_W0;
        k1 += KILN_PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Four words for (seed, stream, counter): key = seed, counter = (counter, stream). */
KILN_HD void kiln_philox(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4]) {
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), (uint32_t)stream,
                       (uint32_t)(stream >> 32)};
    kiln_philox4x32_10(ctr, key, out);
}

/* A word to a double uniform in (0, 1): never 0, never 1. */
KILN_HD double kiln_u32_to_unit(uint32_t x) { return ((double)x + 0.5) * (1.0 / 4294967296.0); }

/* Streams: each consumer of randomness owns one, so that adding a consumer never
 * shifts another's numbers. */
enum {
    KILN_STREAM_INIT = 1,   /* parameter initialisation (counter = element index) */
    KILN_STREAM_BATCH = 2,  /* training windows (counter = step * slots + slot) */
    KILN_STREAM_SYNTH = 3,  /* synthetic data */
    KILN_STREAM_GOLDEN = 4, /* golden window choice */
    KILN_STREAM_TEST = 5    /* tests */
};

#endif /* KILN_PHILOX_H */

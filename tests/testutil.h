/* testutil.h - fixtures that several tests/test_*.c share: files in a directory, key
 * pairs, error-message checks, the smallest training run, runtime comparisons. (test.h is
 * the runner's interface; this is what tests build their inputs with.) */
#ifndef KILN_TESTUTIL_H
#define KILN_TESTUTIL_H

#include <math.h>
#include <stdbool.h>

#include "core.h"
#include "sign.h"
#include "train.h"

/* Write text to dir/rel, creating the directories on the way (a failure shows up when the
 * test reads the file back). */
void kiln_test_put(const char *dir, const char *rel, const char *text);

/* The sorted names in a directory, each followed by '\n' ("?" when it cannot be read);
 * caller frees. */
char *kiln_test_listing(const char *dir);

/* True when both files can be read (up to 1 GiB) and hold the same bytes. */
bool kiln_test_same_file(const char *a, const char *b);

/* Flip the low bit of the byte at off (from the end when negative) of a file in place. */
bool kiln_test_flip(const char *path, long off);

/* True when the last error message holds a, and b too when b is not NULL. */
bool kiln_test_msg_has(const char *a, const char *b);

/* How many times needle stands in hay, not overlapping (markup counted in a page). */
size_t kiln_test_count(const char *hay, const char *needle);

/* A fresh key pair: the secret key (kiln_sign_seckey_free it) and the public key in base64,
 * as a trust policy names it. */
bool kiln_test_keypair(kiln_sign_seckey **sk, char b64[KILN_SIGN_PUBKEY_B64]);

/* The trainer tests' smallest run: the defaults with a one-layer mixture (d_model 8, 2 heads,
 * d_ff 8, 2 experts, top 1, seq_len 8) of the given attention window, 6 steps of which 2
 * warm up, validation every 3, every checkpoint kept. The batch and the checkpoint interval
 * are the caller's to set. */
void kiln_test_tiny_run(kiln_train_config *c, int attn_window);

/* A synthetic dataset (seed, rows, 4 features, 1 output) written under name in the test
 * directory: its path (caller frees), or NULL when it could not be written. */
char *kiln_test_synth(const char *name, uint64_t seed, size_t rows);

/* True when the build has CUDA and a device answers. */
bool kiln_test_gpu_present(void);

/* Largest |a-b| relative to max(|b|, rms(b)): "1e-5 relative" per element, where values
 * smaller than the tensor's RMS are judged against the RMS rather than against zero. A NaN
 * anywhere wins. Inline so that tests/gpu/check.c, a program of its own (no testutil.o),
 * judges the runtime on the GPU the same way. */
static inline double kiln_test_rel_err(const float *a, const float *b, size_t n) {
    double rms = 0, worst = 0;
    for (size_t i = 0; i < n; i++)
        rms += (double)b[i] * b[i];
    rms = sqrt(rms / (double)n);
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / fmax(fabs(b[i]), rms);
        if (!(d <= worst)) worst = d;
    }
    return worst;
}

/* Push B sequences of S rows of x [B,S,F] through fresh streams into y [B,S,O]. */
bool kiln_test_stream_all(const kiln_model *m, const float *x, int B, int S, float *y);

#endif

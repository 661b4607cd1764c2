/*
 * runtime.h - the runtime's face inside the project (cli/, validate/). Services use
 * include/kiln.h (kiln_model, kiln_stream); this adds whole-file inference.
 */
#ifndef KILN_RUNTIME_H
#define KILN_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

/* Run a model over a dataset file (safetensors with `features` [N,F] F32; `targets` and
 * anything else are ignored) as ONE sequence from its first row, and write `outputs`
 * [N,O] F32 to out_path atomically (an existing file is replaced only on success). With
 * stream, rows go tick by tick through a kiln_stream; otherwise through the batch
 * forward; both give the same numbers to float rounding. device: KILN_DEVICE_CPU or a
 * CUDA device index (kiln_model_open_opts). *rows (may be NULL) gets N. */
kiln_err kiln_runtime_infer_file(const char *model_path, const char *input_path,
                                 const char *out_path, bool stream, int device,
                                 size_t *rows) KILN_MUST_CHECK;

/* Router near-ties (docs/validation.md, "Router ties"). Top-k routing is discontinuous:
 * where a token's K-th and (K+1)-th router logits are within rounding of each other, two
 * computations of the same model that sum in other orders (the batch forward's sgemm and a
 * stream's matvec, the trainer, a GPU) may route it to different experts, and its output
 * and those of the rows attending to it move by up to the whole output scale. Neither is
 * wrong. These two let a parity check tell that apart from a fault. */

/* kiln_model_forward (CPU models only) that also writes each token's router margin at each
 * layer: margins[(b*S + s)*L + l] = (K-th - (K+1)-th largest router logit) / the larger of
 * the two logits' sums of |w_i u_i| (what rounding moves a logit by a fraction of); +inf
 * where nothing can tie (a dense model, top_k == n_experts), NaN for non-finite logits. */
kiln_err kiln_runtime_forward_margins(const kiln_model *m, const float *x, int B, int S, float *y,
                                      float *margins) KILN_MUST_CHECK;

/* From margins [n,S,L] as above, mark reach[n*S] (0/1) with every row a router choice at a
 * margin <= tie_rtol (or NaN) may have moved: a near-tie at row s of layer l reaches rows
 * s .. s + (L-1-l)*(W-1) of its sequence. Returns how many rows had a near-tie. */
size_t kiln_runtime_tie_reach(const kiln_model_config *c, const float *margins, size_t n, int S,
                              double tie_rtol, uint8_t *reach);

#endif

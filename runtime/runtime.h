/*
 * runtime.h - the runtime's face inside the project (cli/, validate/). Services use
 * include/kiln.h (kiln_model, kiln_stream); this adds whole-file inference.
 */
#ifndef KILN_RUNTIME_H
#define KILN_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>

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

#endif

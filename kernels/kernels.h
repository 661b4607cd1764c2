/*
 * kernels.h - every numeric op, as forward/backward pairs. kernels/cpu/<op>.c is the
 * reference; kernels/cuda/<op>.cu implements the same signature on device pointers.
 * Arguments: outputs, then buffers saved for the backward pass, then inputs, then
 * sizes. Backward functions add into gradients.
 */
#ifndef KILN_KERNELS_H
#define KILN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- CUDA (kernels/cuda; present when built with KILN_HAVE_CUDA) ---- */
#ifdef KILN_HAVE_CUDA
/* Number of visible CUDA devices; 0 when there is no driver or GPU. */
int kiln_cuda_device_count(void);
/* n blocks of four Philox words for counters first..first+n-1, computed on the device. */
kiln_err kiln_cuda_philox(uint32_t *host_out, uint64_t seed, uint64_t stream, uint64_t first, size_t n);
#endif

#ifdef __cplusplus
}
#endif
#endif

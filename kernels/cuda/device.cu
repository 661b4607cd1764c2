// device.cu - CUDA device discovery, and a Philox kernel that proves host and device
// draw the same words (tests/gpu checks it on a GPU; CI only compiles it).
#include <cuda_runtime.h>

#include "core.h"
#include "kernels.h"

static kiln_err cuda_fail(cudaError_t e, const char *what) {
    return kiln_fail(KILN_ERR_DEVICE, "%s: %s", what, cudaGetErrorString(e));
}

extern "C" int kiln_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

__global__ static void philox_kernel(uint32_t *out, uint64_t seed, uint64_t stream, uint64_t first, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint32_t w[4];
    kiln_philox(seed, stream, first + i, w);
    for (int k = 0; k < 4; k++) out[4 * i + k] = w[k];
}

extern "C" kiln_err kiln_cuda_philox(uint32_t *host_out, uint64_t seed, uint64_t stream, uint64_t first, size_t n) {
    uint32_t *d = NULL;
    cudaError_t e = cudaMalloc(&d, 16 * n);
    if (e != cudaSuccess) return cuda_fail(e, "cudaMalloc");
    unsigned blocks = (unsigned)((n + 255) / 256);
    philox_kernel<<<blocks, 256>>>(d, seed, stream, first, n);
    e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(host_out, d, 16 * n, cudaMemcpyDeviceToHost);
    cudaFree(d);
    return e == cudaSuccess ? KILN_OK : cuda_fail(e, "philox kernel");
}

// device.cu - CUDA device discovery. (A Philox kernel that drew the host's words on the
// device lived here too; nothing called it, and the ops' own tests compare device results
// with the host's, so it went.)
#include <cuda_runtime.h>

#include "core.h"
#include "kernels.h"

extern "C" int kiln_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}


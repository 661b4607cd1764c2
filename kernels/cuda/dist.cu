// dist.cu - what data parallelism needs on the device (train/trainer_cuda.c): events that
// order a communicator's stream after the compute stream, and the fold of gradient shards
// in global shard order (train/comm.c's kiln_dist_sum_shards, element for element).
#include "cuda_int.h"

static cudaStream_t as_stream(void *s) {
    return (cudaStream_t)s;
}

extern "C" kiln_err kiln_cuda_event_create(void **event) {
    cudaEvent_t e = NULL;
    *event = NULL;
    CU_CALL("event", cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *event = e;
    return KILN_OK;
}

extern "C" void kiln_cuda_event_destroy(void *event) {
    if (event) cudaEventDestroy((cudaEvent_t)event);
}

extern "C" kiln_err kiln_cuda_event_record(void *event, void *stream) {
    CU_CALL("event", cudaEventRecord((cudaEvent_t)event, as_stream(stream)));
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_stream_wait(void *stream, void *event) {
    CU_CALL("event", cudaStreamWaitEvent(as_stream(stream), (cudaEvent_t)event, 0));
    return KILN_OK;
}

// out[e] = ((s_0 + s_1) + s_2) + ... over the G = P*k shards, shard g = q*k + j at
// in + (j*P + q)*chunk: the CPU fold's order, one IEEE add at a time.
__global__ static void fold_shards(float *out, const float *in, int k, int P, size_t chunk,
                                   size_t n) {
    const int G = k * P;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        float s = in[e];
        for (int g = 1; g < G; g++)
            s = __fadd_rn(s, in[((size_t)(g % k) * P + (size_t)(g / k)) * chunk + e]);
        out[e] = s;
    }
}

extern "C" kiln_err kiln_cuda_fold_shards(void *stream, float *out, const float *in, int k, int P,
                                          size_t chunk, size_t n) {
    if (!n) return KILN_OK;
    fold_shards<<<kiln_blocks(n, 256), 256, 0, as_stream(stream)>>>(out, in, k, P, chunk, n);
    CU_LAUNCHED("fold_shards", "fold_shards");
    return KILN_OK;
}

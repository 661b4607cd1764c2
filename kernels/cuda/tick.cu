// tick.cu - the per-tick kernels of a streaming forward on a GPU: one token at a time, each
// launch on the caller's stream, no cuBLAS and no scratch of the context, so that a whole
// tick can be captured once into a CUDA graph and replayed. What changes from tick to tick
// (the ring's fill and position, the experts the router chose) is read from device memory,
// never passed as an argument, because a graph keeps the arguments of its capture.
#include "cuda_int.h"
#include "route.h"

#define TICK_ROWS 8 // rows (warps) per block of a matrix-vector product

static inline cudaStream_t as_stream(void *s) {
    return (cudaStream_t)s;
}

__device__ __forceinline__ float tick_gelu(float u) {
    // docs/model.md's tanh GELU in the runtime's form: 0.5*(1 + tanh(z)) = 1/(1 + exp(-2z)).
    float z = 0.7978845608028654f * (u + 0.044715f * u * u * u);
    return u / (1.0f + expf(-2.0f * z));
}

__global__ static void tick_standardize_k(float *xn, const float *x, const float *mean,
                                          const float *std, int F) {
    for (int f = threadIdx.x; f < F; f += blockDim.x)
        xn[f] = (x[f] - mean[f]) / std[f];
}

// One warp per row: lane-strided partial sums, the butterfly, then the row's mode.
__global__ static void tick_matvec_k(float *y, const float *W, const float *b, const float *x,
                                     int rows, int cols, int mode, const int32_t *sel, int k,
                                     size_t w_stride, size_t b_stride, const float *gates) {
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * TICK_ROWS + (threadIdx.x >> 5);
    if (r >= rows) return;
    if (sel) {
        const size_t e = (size_t)sel[k];
        W += e * w_stride;
        if (b) b += e * b_stride;
    }
    const float *w = W + (size_t)r * cols;
    float s = 0.0f;
    for (int c = lane; c < cols; c += KILN_WARP)
        s += w[c] * x[c];
    s = warp_sum(s);
    if (lane) return;
    const float v = s + (b ? b[r] : 0.0f);
    switch (mode) {
    case KILN_TICK_STORE:
        y[r] = v;
        break;
    case KILN_TICK_GELU:
        y[r] = tick_gelu(v);
        break;
    case KILN_TICK_ADD:
        y[r] += v;
        break;
    default: // KILN_TICK_GATED_ADD
        y[r] += gates[k] * v;
        break;
    }
}

// One block: the sum of squares in double (as the CPU runtime), a fixed tree.
__global__ static void tick_rmsnorm_k(float *out, const float *x, const float *g, int D,
                                      float eps) {
    __shared__ double sh[KILN_TOT_THREADS];
    double s = 0.0;
    for (int i = threadIdx.x; i < D; i += KILN_TOT_THREADS)
        s += (double)x[i] * x[i];
    const double ss = block_sum_d(s, sh);
    const float r = (float)(1.0 / sqrt(ss / D + (double)eps));
    for (int i = threadIdx.x; i < D; i += KILN_TOT_THREADS)
        out[i] = x[i] * r * g[i];
}

// One warp per head. Keys oldest first: the ring's valid entries (from pos on once it is
// full), then this tick's own key at distance 0. Afterwards this tick's key and value go to
// the ring at pos (each head writes only its own columns, after reading them).
__global__ static void tick_attend_k(float *o, float *scores, float *kring, float *vring,
                                     const float *qkv, const int32_t *ring, int D, int H, int R,
                                     const float *slopes, float scale) {
    const int h = blockIdx.x, lane = threadIdx.x, Dh = D / H;
    const int n = R > 0 ? ring[0] : 0, pos = R > 0 ? ring[1] : 0, nk = n + 1;
    const float *q = qkv + h * Dh, *kself = qkv + D + h * Dh, *vself = qkv + 2 * D + h * Dh;
    float *sc = scores + (size_t)h * (R + 1);
    const float slope = slopes[h];
    float mx = -INFINITY;
    for (int j = lane; j < nk; j += KILN_WARP) {
        const float *kj = j < n ? kring + (size_t)(n == R ? (pos + j) % R : j) * D + h * Dh : kself;
        float dot = 0.0f;
        for (int d = 0; d < Dh; d++)
            dot += q[d] * kj[d];
        const float s = dot * scale - slope * (float)(nk - 1 - j);
        sc[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j < nk; j += KILN_WARP) {
        const float e = expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    __syncwarp();
    const float inv = 1.0f / sum;
    for (int d = lane; d < Dh; d += KILN_WARP) {
        float acc = 0.0f;
        for (int j = 0; j < nk; j++) {
            const float *vj =
                j < n ? vring + (size_t)(n == R ? (pos + j) % R : j) * D + h * Dh : vself;
            acc += sc[j] * inv * vj[d];
        }
        o[h * Dh + d] = acc;
    }
    __syncwarp();
    if (R > 0)
        for (int d = lane; d < Dh; d += KILN_WARP) {
            kring[(size_t)pos * D + h * Dh + d] = kself[d];
            vring[(size_t)pos * D + h * Dh + d] = vself[d];
        }
}

// The runtime's routing for one token (route.h, as on the host). One thread: E is small.
__global__ static void tick_route_k(int32_t *chosen, float *gates, float *p, int E, int K) {
    kiln_route_stream(p, E, K, chosen, gates);
}

__global__ static void tick_add_k(float *y, const float *x, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        y[i] += x[i];
}

__global__ static void tick_advance_k(int32_t *ring, int R) {
    if (R <= 0) return;
    ring[1] = (ring[1] + 1) % R;
    if (ring[0] < R) ring[0]++;
}

#define TICK_LAUNCHED(kernel) CU_LAUNCHED("tick", kernel)

extern "C" kiln_err kiln_cuda_tick_standardize(void *stream, float *xn, const float *x,
                                               const float *mean, const float *std, int F) {
    tick_standardize_k<<<1, 256, 0, as_stream(stream)>>>(xn, x, mean, std, F);
    TICK_LAUNCHED("tick_standardize_k");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_tick_matvec(void *stream, float *y, const float *W, const float *b,
                                          const float *x, int rows, int cols, int mode,
                                          const int32_t *sel, int k, size_t w_stride,
                                          size_t b_stride, const float *gates) {
    if (rows <= 0) return KILN_OK;
    unsigned blocks = (unsigned)((rows + TICK_ROWS - 1) / TICK_ROWS);
    tick_matvec_k<<<blocks, TICK_ROWS * KILN_WARP, 0, as_stream(stream)>>>(
        y, W, b, x, rows, cols, mode, sel, k, w_stride, b_stride, gates);
    TICK_LAUNCHED("tick_matvec_k");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_tick_rmsnorm(void *stream, float *out, const float *x, const float *g,
                                           int D, float eps) {
    tick_rmsnorm_k<<<1, KILN_TOT_THREADS, 0, as_stream(stream)>>>(out, x, g, D, eps);
    TICK_LAUNCHED("tick_rmsnorm_k");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_tick_attend(void *stream, float *o, float *scores, float *kring,
                                          float *vring, const float *qkv, const int32_t *ring,
                                          int D, int H, int R, const float *slopes, float scale) {
    tick_attend_k<<<(unsigned)H, KILN_WARP, 0, as_stream(stream)>>>(o, scores, kring, vring, qkv,
                                                                    ring, D, H, R, slopes, scale);
    TICK_LAUNCHED("tick_attend_k");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_tick_route(void *stream, int32_t *chosen, float *gates, float *probs,
                                         int E, int K) {
    tick_route_k<<<1, 1, 0, as_stream(stream)>>>(chosen, gates, probs, E, K);
    TICK_LAUNCHED("tick_route_k");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_tick_add(void *stream, float *y, const float *x, int n) {
    tick_add_k<<<1, 256, 0, as_stream(stream)>>>(y, x, n);
    TICK_LAUNCHED("tick_add_k");
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_tick_advance(void *stream, int32_t *ring, int R) {
    tick_advance_k<<<1, 1, 0, as_stream(stream)>>>(ring, R);
    TICK_LAUNCHED("tick_advance_k");
    return KILN_OK;
}

// ---- streams and graphs, for C callers (the runtime) ----

extern "C" kiln_err kiln_cuda_stream_create(int device, void **stream) {
    cudaStream_t s = NULL;
    *stream = NULL;
    CU_CALL("stream", cudaSetDevice(device));
    CU_CALL("stream", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *stream = s;
    return KILN_OK;
}

extern "C" void kiln_cuda_stream_destroy(void *stream) {
    if (stream) cudaStreamDestroy(as_stream(stream));
}

extern "C" kiln_err kiln_cuda_host_alloc(void **ptr, size_t bytes) {
    *ptr = NULL;
    CU_CALL("host_alloc", cudaMallocHost(ptr, bytes ? bytes : 1));
    return KILN_OK;
}

extern "C" void kiln_cuda_host_free(void *ptr) {
    if (ptr) cudaFreeHost(ptr);
}

extern "C" kiln_err kiln_cuda_copy_async(void *stream, void *dst, const void *src, size_t bytes) {
    if (bytes)
        CU_CALL("copy_async",
                cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)));
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_memset_async(void *stream, void *dst, int byte, size_t bytes) {
    if (bytes) CU_CALL("memset_async", cudaMemsetAsync(dst, byte, bytes, as_stream(stream)));
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_capture_begin(void *stream) {
    CU_CALL("capture", cudaStreamBeginCapture(as_stream(stream), cudaStreamCaptureModeThreadLocal));
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_capture_end(void *stream, kiln_err rc, void **graph_exec) {
    cudaGraph_t g = NULL;
    *graph_exec = NULL;
    // End the capture whatever happened inside it, so the stream is usable again.
    cudaError_t e = cudaStreamEndCapture(as_stream(stream), &g);
    if (rc) {
        if (g) cudaGraphDestroy(g);
        return rc;
    }
    if (e != cudaSuccess) return kiln_cuda_fail(e, "capture", "cudaStreamEndCapture");
    cudaGraphExec_t x = NULL;
    e = cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) return kiln_cuda_fail(e, "capture", "cudaGraphInstantiate");
    *graph_exec = x;
    return KILN_OK;
}

extern "C" kiln_err kiln_cuda_graph_run(void *graph_exec, void *stream, int device) {
    CU_CALL("graph", cudaSetDevice(device));
    CU_CALL("graph", cudaGraphLaunch((cudaGraphExec_t)graph_exec, as_stream(stream)));
    CU_CALL("graph", cudaStreamSynchronize(as_stream(stream)));
    return KILN_OK;
}

extern "C" void kiln_cuda_graph_destroy(void *graph_exec) {
    if (graph_exec) cudaGraphExecDestroy((cudaGraphExec_t)graph_exec);
}

extern "C" kiln_err kiln_cuda_stream_sync(void *stream) {
    CU_CALL("stream", cudaStreamSynchronize(as_stream(stream)));
    return KILN_OK;
}

/* nccl_dl.c - the NCCL calls comm_nccl.c makes, through libnccl opened on first use
 * (kiln_dl_load, core/dl.c) instead of linked, so that `kiln` starts, and trains on a CPU
 * or one GPU, on a machine without NCCL; only `mpirun ... kiln train --device cuda` needs
 * it. Each function has the name and prototype nccl.h declares (the compiler checks them).
 * Built where nccl.h is found; the emulator (tests/gpu/emu) brings its own NCCL. */
#include <nccl.h>

#include "train_int.h"

#define DL_STR_(x) #x
#define DL_STR(x) DL_STR_(x)

/* name, parameters, arguments: every call returns an ncclResult_t. */
#define NCCL_CALLS(X)                                                                              \
    X(ncclGetUniqueId, (ncclUniqueId * id), (id))                                                  \
    X(ncclCommInitRank, (ncclComm_t * c, int n, ncclUniqueId id, int rank), (c, n, id, rank))      \
    X(ncclCommDestroy, (ncclComm_t c), (c))                                                        \
    X(ncclCommAbort, (ncclComm_t c), (c))                                                          \
    X(ncclCommGetAsyncError, (ncclComm_t c, ncclResult_t * e), (c, e))                             \
    X(ncclAllReduce,                                                                               \
      (const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,           \
       cudaStream_t st),                                                                           \
      (s, r, n, t, op, c, st))                                                                     \
    X(ncclBroadcast,                                                                               \
      (const void *s, void *r, size_t n, ncclDataType_t t, int root, ncclComm_t c,                 \
       cudaStream_t st),                                                                           \
      (s, r, n, t, root, c, st))                                                                   \
    X(ncclAllGather,                                                                               \
      (const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st),         \
      (s, r, n, t, c, st))                                                                         \
    X(ncclSend,                                                                                    \
      (const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st),        \
      (s, n, t, peer, c, st))                                                                      \
    X(ncclRecv, (void *r, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st),    \
      (r, n, t, peer, c, st))                                                                      \
    X(ncclGroupStart, (void), ())                                                                  \
    X(ncclGroupEnd, (void), ())

#define NCCL_INDEX(name, params, args) NCCL_##name,
enum { NCCL_CALLS(NCCL_INDEX) NCCL_GET_ERROR_STRING, NCCL_N };
#define NCCL_NAME(name, params, args) DL_STR(name),
static const char *const nccl_names[NCCL_N] = {NCCL_CALLS(NCCL_NAME) "ncclGetErrorString"};
static void *nccl_fns[NCCL_N];
static kiln_dl_lib nccl_lib = {.soname = "libnccl.so." DL_STR(NCCL_MAJOR),
                               .what = "NCCL",
                               .names = nccl_names,
                               .n = NCCL_N,
                               .fns = nccl_fns};

kiln_err kiln_nccl_load(void) {
    return kiln_dl_load(&nccl_lib);
}

/* A call before a successful load (kiln_comm_nccl_init loads first, so only a bug gets
 * here) fails as NCCL's own "invalid usage" instead of jumping through NULL. */
#define NCCL_DEFINE(name, params, args)                                                            \
    ncclResult_t name params {                                                                     \
        if (kiln_dl_load(&nccl_lib)) return ncclInvalidUsage;                                      \
        return ((ncclResult_t(*) params)nccl_fns[NCCL_##name])args;                                \
    }
NCCL_CALLS(NCCL_DEFINE)

const char *ncclGetErrorString(ncclResult_t r) {
    if (kiln_dl_load(&nccl_lib)) return "NCCL not loaded";
    return ((const char *(*)(ncclResult_t))nccl_fns[NCCL_GET_ERROR_STRING])(r);
}

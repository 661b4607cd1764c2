/* comm_nccl.c - the kiln_comm over NCCL: one process per GPU, buffers in device memory,
 * bootstrapped through another communicator (MPI: rank 0 makes the unique id and
 * broadcasts it). Built into build/libkiln_dist.a only where nvcc and nccl.h are found.
 *
 * The collectives of the kiln_comm interface are synchronous on the communicator's own
 * stream; exchange (a group of sends and receives) only queues, and is what the CUDA
 * trainer's gradient buckets use: trainer_cuda.c orders each bucket's exchange after an
 * event recorded on the compute stream, folds the shards on this stream, and makes the
 * compute stream wait for the last bucket (docs/train.md "Data parallelism"). Run so far on
 * the CPU emulator only (tests/gpu/emu: nccl.h over MPI). */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "train_int.h"

typedef struct nccl_comm {
    kiln_comm base;
    ncclComm_t comm;
    cudaStream_t stream;
} nccl_comm;

static kiln_err nccl_fail(ncclResult_t e, const char *what) {
    return kiln_fail(KILN_ERR_DEVICE, "NCCL %s: %s", what, ncclGetErrorString(e));
}

static kiln_err cuda_fail(cudaError_t e, const char *what) {
    return kiln_fail(KILN_ERR_DEVICE, "CUDA %s: %s", what, cudaGetErrorString(e));
}

#define NCCL_TRY(call, what)                                                                       \
    do {                                                                                           \
        ncclResult_t nccl_rc_ = (call);                                                            \
        if (nccl_rc_ != ncclSuccess) return nccl_fail(nccl_rc_, what);                             \
    } while (0)

/* Wait for the stream: the interface is synchronous. */
static kiln_err finish(nccl_comm *m, const char *what) {
    cudaError_t e = cudaStreamSynchronize(m->stream);
    return e == cudaSuccess ? KILN_OK : cuda_fail(e, what);
}

static kiln_err nccl_bcast(kiln_comm *c, void *buf, size_t bytes, int root) {
    nccl_comm *m = c->impl;
    NCCL_TRY(ncclBroadcast(buf, buf, bytes, ncclUint8, root, m->comm, m->stream), "broadcast");
    return finish(m, "broadcast");
}

static kiln_err nccl_allgather(kiln_comm *c, const void *send, void *recv, size_t bytes) {
    nccl_comm *m = c->impl;
    NCCL_TRY(ncclAllGather(send, recv, bytes, ncclUint8, m->comm, m->stream), "allgather");
    return finish(m, "allgather");
}

/* NCCL has no alltoall: a group of sends and receives, one pair per peer. */
static kiln_err nccl_alltoall(kiln_comm *c, const void *send, void *recv, size_t bytes) {
    nccl_comm *m = c->impl;
    NCCL_TRY(ncclGroupStart(), "group start");
    ncclResult_t e = ncclSuccess;
    for (int q = 0; q < c->size && e == ncclSuccess; q++) {
        e = ncclSend((const char *)send + (size_t)q * bytes, bytes, ncclUint8, q, m->comm,
                     m->stream);
        if (e == ncclSuccess)
            e = ncclRecv((char *)recv + (size_t)q * bytes, bytes, ncclUint8, q, m->comm, m->stream);
    }
    ncclResult_t g = ncclGroupEnd();
    if (e != ncclSuccess) return nccl_fail(e, "alltoall");
    NCCL_TRY(g, "group end");
    return finish(m, "alltoall");
}

static kiln_err nccl_allreduce(kiln_comm *c, float *buf, size_t n) {
    nccl_comm *m = c->impl;
    NCCL_TRY(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, m->comm, m->stream), "allreduce");
    return finish(m, "allreduce");
}

static kiln_err nccl_exchange(kiln_comm *c, const kiln_comm_xfer *x, size_t n) {
    nccl_comm *m = c->impl;
    NCCL_TRY(ncclGroupStart(), "group start");
    ncclResult_t e = ncclSuccess;
    for (size_t i = 0; i < n && e == ncclSuccess; i++) {
        if (x[i].send_bytes)
            e = ncclSend(x[i].send, x[i].send_bytes, ncclUint8, x[i].peer, m->comm, m->stream);
        if (e == ncclSuccess && x[i].recv_bytes)
            e = ncclRecv(x[i].recv, x[i].recv_bytes, ncclUint8, x[i].peer, m->comm, m->stream);
    }
    ncclResult_t g = ncclGroupEnd();
    if (e != ncclSuccess) return nccl_fail(e, "exchange");
    NCCL_TRY(g, "group end");
    return KILN_OK;
}

/* A rank that fails in the middle of a step may leave transfers queued that wait for peers
 * which will never send (they are stopped by mpirun once this rank exits non-zero):
 * ncclCommDestroy would wait for them, so a communicator with work still queued, or with an
 * asynchronous error, is aborted instead. */
static void nccl_destroy(kiln_comm *c) {
    nccl_comm *m = c->impl;
    ncclResult_t async = ncclSuccess;
    const bool idle = cudaStreamQuery(m->stream) == cudaSuccess &&
                      ncclCommGetAsyncError(m->comm, &async) == ncclSuccess && async == ncclSuccess;
    if (idle)
        ncclCommDestroy(m->comm);
    else
        ncclCommAbort(m->comm);
    cudaStreamDestroy(m->stream);
    free(m);
}

kiln_err kiln_comm_nccl_create(kiln_comm *boot, int device, kiln_comm **out) {
    *out = NULL;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    double mine[1], *all = kiln_calloc((size_t)boot->size, sizeof *all);
    nccl_comm *m = kiln_calloc(1, sizeof *m);
    kiln_err rc = KILN_OK;
    if (!all || !m) rc = kiln_fail(KILN_ERR_NOMEM, "NCCL: out of memory");
    if (!rc) rc = kiln_nccl_load(); /* opened on first use (nccl_dl.c) */
    cudaError_t ce = rc ? cudaSuccess : cudaSetDevice(device);
    if (ce != cudaSuccess) rc = cuda_fail(ce, "set device");
    if (!rc && boot->rank == 0) {
        ncclResult_t e = ncclGetUniqueId(&id);
        if (e != ncclSuccess) rc = nccl_fail(e, "unique id");
    }
    /* Every rank learns whether rank 0 has an id (and every rank its device) before
     * anyone waits for the id. */
    rc = all ? kiln_dist_agree(boot, rc, mine, 0, all) : rc;
    if (!rc) rc = boot->bcast(boot, &id, sizeof id, 0);
    bool have_stream = false, have_comm = false;
    if (!rc) {
        ce = cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking);
        if (ce != cudaSuccess)
            rc = cuda_fail(ce, "stream");
        else
            have_stream = true;
    }
    if (!rc) {
        ncclResult_t e = ncclCommInitRank(&m->comm, boot->size, id, boot->rank);
        if (e != ncclSuccess)
            rc = nccl_fail(e, "init rank");
        else
            have_comm = true;
    }
    /* ... and whether every rank has its communicator, so that all of them stop together. */
    if (all) rc = kiln_dist_agree(boot, rc, mine, 0, all);
    free(all);
    if (rc) {
        if (have_comm) ncclCommDestroy(m->comm);
        if (have_stream) cudaStreamDestroy(m->stream);
        free(m);
        return rc;
    }
    m->base.rank = boot->rank;
    m->base.size = boot->size;
    m->base.name = "nccl";
    m->base.bcast = nccl_bcast;
    m->base.allgather = nccl_allgather;
    m->base.alltoall = nccl_alltoall;
    m->base.allreduce_sum = nccl_allreduce;
    m->base.exchange = nccl_exchange;
    m->base.stream = m->stream;
    m->base.destroy = nccl_destroy;
    m->base.impl = m;
    *out = &m->base;
    return KILN_OK;
}

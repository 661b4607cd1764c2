// nccl.cc - the emulator's NCCL (include/nccl.h) over MPI: a communicator of more than one
// rank is a duplicate of MPI_COMM_WORLD; point-to-point calls queue in a group and run at
// ncclGroupEnd (receives posted first, then sends, then a wait for all), pairing up between
// two ranks in call order as NCCL's do; a rank's transfers to itself are copies.
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "nccl.h"

struct emu_nccl_comm {
    int rank, size;
    MPI_Comm comm; // MPI_COMM_NULL for one rank
};

namespace {
struct op {
    bool send;
    void *buf;
    size_t bytes;
    int peer;
    ncclComm_t comm;
};
int depth;
std::vector<op> pending;

size_t width(ncclDataType_t t) {
    return t == ncclInt32 || t == ncclFloat32 ? 4 : 1;
}

ncclResult_t run_group() {
    std::vector<op> ops;
    ops.swap(pending);
    std::vector<MPI_Request> req;
    std::vector<op *> self_send, self_recv;
    for (op &o : ops) {
        if (o.peer < 0 || o.peer >= o.comm->size) return ncclInvalidArgument;
        if (o.peer == o.comm->rank) {
            (o.send ? self_send : self_recv).push_back(&o);
            continue;
        }
        if (o.bytes > 0x7fffffff) return ncclInvalidArgument;
        if (o.send) continue;
        req.push_back(MPI_REQUEST_NULL);
        if (MPI_Irecv(o.buf, (int)o.bytes, MPI_BYTE, o.peer, 0, o.comm->comm, &req.back()))
            return ncclSystemError;
    }
    for (op &o : ops) {
        if (!o.send || o.peer == o.comm->rank) continue;
        req.push_back(MPI_REQUEST_NULL);
        if (MPI_Isend(o.buf, (int)o.bytes, MPI_BYTE, o.peer, 0, o.comm->comm, &req.back()))
            return ncclSystemError;
    }
    if (self_send.size() != self_recv.size()) return ncclInvalidUsage;
    for (size_t i = 0; i < self_send.size(); i++) {
        if (self_send[i]->bytes != self_recv[i]->bytes) return ncclInvalidUsage;
        memmove(self_recv[i]->buf, self_send[i]->buf, self_send[i]->bytes);
    }
    if (!req.empty() && MPI_Waitall((int)req.size(), req.data(), MPI_STATUSES_IGNORE))
        return ncclSystemError;
    return ncclSuccess;
}

ncclResult_t queue(bool send, const void *buf, size_t count, ncclDataType_t t, int peer,
                   ncclComm_t comm) {
    if (!comm) return ncclInvalidArgument;
    pending.push_back({send, const_cast<void *>(buf), count * width(t), peer, comm});
    return depth ? ncclSuccess : run_group();
}
} // namespace

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error (emulated)";
    case ncclInvalidArgument: return "invalid argument (emulated)";
    case ncclInvalidUsage: return "invalid usage (emulated)";
    default: return "error (emulated)";
    }
}

// Nothing to open here (a real build opens libnccl on first use: train/nccl_dl.c, which the
// emulator does not compile).
extern "C" int kiln_nccl_load(void) { // kiln_err, KILN_OK
    return 0;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    strcpy(id->internal, "emu-nccl");
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    *comm = nullptr;
    if (strcmp(id.internal, "emu-nccl") || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    ncclComm_t c = new emu_nccl_comm{rank, nranks, MPI_COMM_NULL};
    ncclResult_t r = ncclSuccess;
    if (nranks > 1) {
        int inited = 0, wr = -1, ws = 0;
        MPI_Initialized(&inited);
        if (!inited || MPI_Comm_dup(MPI_COMM_WORLD, &c->comm)) {
            delete c;
            return ncclSystemError;
        }
        MPI_Comm_rank(c->comm, &wr);
        MPI_Comm_size(c->comm, &ws);
        if (wr != rank || ws != nranks) r = ncclInvalidUsage;
    }
    const char *f = getenv("EMU_NCCL_FAIL_INIT");
    if (!r && f && *f && atoi(f) == rank) r = ncclSystemError;
    if (r) {
        ncclCommDestroy(c);
        return r;
    }
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    return ncclCommDestroy(comm);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async) {
    (void)comm;
    *async = ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (comm && comm->comm != MPI_COMM_NULL) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Comm_free(&comm->comm);
    }
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
    depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (!depth) return ncclInvalidUsage;
    return --depth ? ncclSuccess : run_group();
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t) {
    return queue(true, buf, count, t, peer, comm);
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t) {
    return queue(false, buf, count, t, peer, comm);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t) {
    const size_t bytes = count * width(t);
    if (!comm || root < 0 || root >= comm->size || bytes > 0x7fffffff) return ncclInvalidArgument;
    if (comm->rank == root && send != recv) memmove(recv, send, bytes);
    if (comm->size == 1) return ncclSuccess;
    return MPI_Bcast(recv, (int)bytes, MPI_BYTE, root, comm->comm) ? ncclSystemError : ncclSuccess;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclComm_t comm, cudaStream_t) {
    const size_t bytes = count * width(t);
    if (!comm || bytes > 0x7fffffff) return ncclInvalidArgument;
    char *mine = (char *)recv + (size_t)comm->rank * bytes;
    if (send != mine) memmove(mine, send, bytes);
    if (comm->size == 1) return ncclSuccess;
    return MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, recv, (int)bytes, MPI_BYTE, comm->comm)
               ? ncclSystemError
               : ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
    if (!comm || t != ncclFloat32 || op != ncclSum || count > 0x7fffffff)
        return ncclInvalidArgument;
    if (send != recv) memmove(recv, send, count * 4);
    if (comm->size == 1) return ncclSuccess;
    return MPI_Allreduce(MPI_IN_PLACE, recv, (int)count, MPI_FLOAT, MPI_SUM, comm->comm)
               ? ncclSystemError
               : ncclSuccess;
}

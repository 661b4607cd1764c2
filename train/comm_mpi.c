/* comm_mpi.c - the kiln_comm over Open MPI, for data parallelism across processes on CPU.
 * Built into build/libkiln_dist.a, which only the kiln binary links: libkiln.so (what
 * services link) never depends on libmpi. Only bytes move here; every sum the trainer
 * makes is in comm.c, in a fixed order (MPI_Allreduce's order is not promised). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "train_int.h"

typedef struct mpi_comm {
    kiln_comm base;
    MPI_Comm comm;
} mpi_comm;

static MPI_Comm comm_of(const kiln_comm *c) {
    return ((const mpi_comm *)c)->comm;
}

static kiln_err mpi_fail(int e, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(e, s, &n) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", e);
    return kiln_fail(KILN_ERR_NETWORK, "MPI %s: %s", what, s);
}

#define MPI_TRY(call, what)                                                                        \
    do {                                                                                           \
        int mpi_rc_ = (call);                                                                      \
        if (mpi_rc_ != MPI_SUCCESS) return mpi_fail(mpi_rc_, what);                                \
    } while (0)

/* MPI counts are int: bytes go as MPI_BYTE, or as 8-byte words when that is what fits. */
static kiln_err units(size_t bytes, const char *what, MPI_Datatype *type, int *count) {
    if (bytes <= INT_MAX) {
        *type = MPI_BYTE;
        *count = (int)bytes;
        return KILN_OK;
    }
    KILN_FAIL_IF(bytes % 8 || bytes / 8 > INT_MAX, KILN_ERR_LIMIT,
                 "MPI %s: %zu bytes per rank is more than one call moves", what, bytes);
    *type = MPI_UINT64_T;
    *count = (int)(bytes / 8);
    return KILN_OK;
}

static kiln_err mpi_bcast(kiln_comm *c, void *buf, size_t bytes, int root) {
    /* In pieces of 1 GiB: a parameter block may pass 2^31 bytes. */
    const size_t piece = (size_t)1 << 30;
    for (size_t off = 0; off < bytes; off += piece) {
        size_t n = bytes - off < piece ? bytes - off : piece;
        MPI_TRY(MPI_Bcast((char *)buf + off, (int)n, MPI_BYTE, root, comm_of(c)), "broadcast");
    }
    return KILN_OK;
}

static kiln_err mpi_allgather(kiln_comm *c, const void *send, void *recv, size_t bytes) {
    MPI_Datatype t = MPI_BYTE;
    int n = 0;
    KILN_TRY(units(bytes, "allgather", &t, &n));
    MPI_TRY(MPI_Allgather(send, n, t, recv, n, t, comm_of(c)), "allgather");
    return KILN_OK;
}

static kiln_err mpi_alltoall(kiln_comm *c, const void *send, void *recv, size_t bytes) {
    MPI_Datatype t = MPI_BYTE;
    int n = 0;
    KILN_TRY(units(bytes, "alltoall", &t, &n));
    MPI_TRY(MPI_Alltoall(send, n, t, recv, n, t, comm_of(c)), "alltoall");
    return KILN_OK;
}

static kiln_err mpi_allreduce(kiln_comm *c, float *buf, size_t n) {
    KILN_FAIL_IF(n > INT_MAX, KILN_ERR_LIMIT,
                 "MPI allreduce: %zu floats is more than one call sums", n);
    MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, comm_of(c)), "allreduce");
    return KILN_OK;
}

static void mpi_destroy(kiln_comm *c) {
    mpi_comm *m = (mpi_comm *)c;
    MPI_Comm_free(&m->comm);
    free(m);
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

bool kiln_comm_mpi_launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMIX_RANK") != NULL;
}

kiln_err kiln_comm_mpi_create(int *argc, char ***argv, kiln_comm **out) {
    *out = NULL;
    int inited = 0;
    MPI_TRY(MPI_Initialized(&inited), "initialized");
    if (!inited) MPI_TRY(MPI_Init(argc, argv), "init");
    /* Errors come back as codes (and become kiln errors) instead of aborting the job. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    mpi_comm *m = kiln_calloc(1, sizeof *m);
    if (!m) return KILN_ERR_NOMEM;
    int e = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    if (e == MPI_SUCCESS) e = MPI_Comm_rank(m->comm, &m->base.rank);
    if (e == MPI_SUCCESS) e = MPI_Comm_size(m->comm, &m->base.size);
    if (e != MPI_SUCCESS) {
        free(m);
        return mpi_fail(e, "communicator");
    }
    m->base.name = "mpi";
    m->base.bcast = mpi_bcast;
    m->base.allgather = mpi_allgather;
    m->base.alltoall = mpi_alltoall;
    m->base.allreduce_sum = mpi_allreduce;
    m->base.destroy = mpi_destroy;
    m->base.impl = m;
    *out = &m->base;
    return KILN_OK;
}

#ifndef KILN_HAVE_NCCL
kiln_err kiln_comm_nccl_create(kiln_comm *boot, int device, kiln_comm **out) {
    *out = NULL;
    return kiln_fail(KILN_ERR_UNSUPPORTED,
                     "NCCL: this kiln was built without CUDA and nccl.h (no GPU data parallelism)");
}
#endif

/* comm_mpi.c - the kiln_comm over Open MPI, for data parallelism across processes on CPU.
 * Built into build/libkiln_dist.a, which only the kiln binary links: libkiln.so (what
 * services link) never depends on libmpi. Only bytes move here; every sum the trainer
 * makes is in comm.c, in a fixed order (MPI_Allreduce's order is not promised).
 *
 * libmpi is opened when a process started by mpirun makes its communicator (kiln_dl_load,
 * core/dl.c), not linked: every other `kiln` command then starts without mapping Open MPI
 * and its dozen libraries, and runs on a machine that has none (a trading host pulling
 * models). mpi.h gives the types and prototypes; the calls go through pointers typed from
 * those prototypes (so the compiler checks every call), and the predefined handles, which
 * Open MPI's mpi.h makes addresses of its exported objects (MPI_COMM_WORLD is
 * &ompi_mpi_comm_world), are looked up by those objects' names. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "train_int.h"

#if !defined(OMPI_MAJOR_VERSION) || OMPI_MAJOR_VERSION < 4 || OMPI_MAJOR_VERSION > 5
#error "comm_mpi.c opens Open MPI 4 or 5 (libmpi.so.40) and uses its handle names"
#endif

#define MPI_FNS(X)                                                                                 \
    X(MPI_Initialized) X(MPI_Init) X(MPI_Finalized) X(MPI_Finalize) X(MPI_Error_string)           \
    X(MPI_Comm_set_errhandler) X(MPI_Comm_dup) X(MPI_Comm_rank) X(MPI_Comm_size)                  \
    X(MPI_Comm_free) X(MPI_Bcast) X(MPI_Allgather) X(MPI_Alltoall) X(MPI_Allreduce)
/* The predefined handles used here: the objects mpi.h's macros take the address of. */
#define MPI_OBJS(X)                                                                                \
    X(ompi_mpi_comm_world) X(ompi_mpi_byte) X(ompi_mpi_uint64_t) X(ompi_mpi_float)                \
    X(ompi_mpi_op_sum) X(ompi_mpi_errors_return)

#define MPI_INDEX(name) I_##name,
enum { MPI_FNS(MPI_INDEX) MPI_OBJS(MPI_INDEX) MPI_NSYMS };
#define MPI_NAME(name) #name,
static const char *const mpi_names[MPI_NSYMS] = {MPI_FNS(MPI_NAME) MPI_OBJS(MPI_NAME)};
static void *mpi_syms[MPI_NSYMS];
/* Open MPI's plugins (its MCA components, opened by libmpi) resolve libmpi's symbols, so it
 * is opened RTLD_GLOBAL, as mpi4py and every other loader of it does. */
static kiln_dl_lib mpi_lib = {.soname = "libmpi.so.40",
                              .what = "Open MPI",
                              .names = mpi_names,
                              .n = MPI_NSYMS,
                              .fns = mpi_syms,
                              .global = true,
                              .hint = "`mpirun ... kiln train` needs Open MPI's library on the "
                                      "library path (Debian: apt-get install libopenmpi3)"};

/* The call `name` through its pointer, typed from mpi.h's prototype. */
#define CALL(name) ((__typeof__(&name))mpi_syms[I_##name])
/* The predefined handles, as mpi.h's macros would make them. */
#define WORLD ((MPI_Comm)mpi_syms[I_ompi_mpi_comm_world])
#define T_BYTE ((MPI_Datatype)mpi_syms[I_ompi_mpi_byte])
#define T_UINT64 ((MPI_Datatype)mpi_syms[I_ompi_mpi_uint64_t])
#define T_FLOAT ((MPI_Datatype)mpi_syms[I_ompi_mpi_float])
#define OP_SUM ((MPI_Op)mpi_syms[I_ompi_mpi_op_sum])
#define ERRORS_RETURN ((MPI_Errhandler)mpi_syms[I_ompi_mpi_errors_return])

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
    if (CALL(MPI_Error_string)(e, s, &n) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", e);
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
        *type = T_BYTE;
        *count = (int)bytes;
        return KILN_OK;
    }
    KILN_FAIL_IF(bytes % 8 || bytes / 8 > INT_MAX, KILN_ERR_LIMIT,
                 "MPI %s: %zu bytes per rank is more than one call moves", what, bytes);
    *type = T_UINT64;
    *count = (int)(bytes / 8);
    return KILN_OK;
}

static kiln_err mpi_bcast(kiln_comm *c, void *buf, size_t bytes, int root) {
    /* In pieces of 1 GiB: a parameter block may pass 2^31 bytes. */
    const size_t piece = (size_t)1 << 30;
    for (size_t off = 0; off < bytes; off += piece) {
        size_t n = bytes - off < piece ? bytes - off : piece;
        MPI_TRY(CALL(MPI_Bcast)((char *)buf + off, (int)n, T_BYTE, root, comm_of(c)),
                "broadcast");
    }
    return KILN_OK;
}

static kiln_err mpi_allgather(kiln_comm *c, const void *send, void *recv, size_t bytes) {
    MPI_Datatype t = T_BYTE;
    int n = 0;
    KILN_TRY(units(bytes, "allgather", &t, &n));
    MPI_TRY(CALL(MPI_Allgather)(send, n, t, recv, n, t, comm_of(c)), "allgather");
    return KILN_OK;
}

static kiln_err mpi_alltoall(kiln_comm *c, const void *send, void *recv, size_t bytes) {
    MPI_Datatype t = T_BYTE;
    int n = 0;
    KILN_TRY(units(bytes, "alltoall", &t, &n));
    MPI_TRY(CALL(MPI_Alltoall)(send, n, t, recv, n, t, comm_of(c)), "alltoall");
    return KILN_OK;
}

static kiln_err mpi_allreduce(kiln_comm *c, float *buf, size_t n) {
    KILN_FAIL_IF(n > INT_MAX, KILN_ERR_LIMIT,
                 "MPI allreduce: %zu floats is more than one call sums", n);
    MPI_TRY(CALL(MPI_Allreduce)(MPI_IN_PLACE, buf, (int)n, T_FLOAT, OP_SUM, comm_of(c)),
            "allreduce");
    return KILN_OK;
}

static void mpi_destroy(kiln_comm *c) {
    mpi_comm *m = (mpi_comm *)c;
    CALL(MPI_Comm_free)(&m->comm);
    free(m);
    int fin = 0;
    CALL(MPI_Finalized)(&fin);
    if (!fin) CALL(MPI_Finalize)();
}

bool kiln_comm_mpi_launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMIX_RANK") != NULL;
}

kiln_err kiln_comm_mpi_create(int *argc, char ***argv, kiln_comm **out) {
    *out = NULL;
    KILN_TRY(kiln_dl_load(&mpi_lib));
    int inited = 0;
    MPI_TRY(CALL(MPI_Initialized)(&inited), "initialized");
    if (!inited) MPI_TRY(CALL(MPI_Init)(argc, argv), "init");
    /* Errors come back as codes (and become kiln errors) instead of aborting the job. */
    CALL(MPI_Comm_set_errhandler)(WORLD, ERRORS_RETURN);
    mpi_comm *m = kiln_calloc(1, sizeof *m);
    if (!m) return KILN_ERR_NOMEM;
    int e = CALL(MPI_Comm_dup)(WORLD, &m->comm);
    if (e == MPI_SUCCESS) e = CALL(MPI_Comm_rank)(m->comm, &m->base.rank);
    if (e == MPI_SUCCESS) e = CALL(MPI_Comm_size)(m->comm, &m->base.size);
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

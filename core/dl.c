/* dl.c - shared libraries opened on first use (cuBLAS, NCCL, Open MPI). One
 * mutex for every table: a load happens once per process, so it is never contended. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "core.h"

static pthread_mutex_t dl_lock = PTHREAD_MUTEX_INITIALIZER;

/* 1 loaded, -1 not (lib->why says why). */
static int dl_open(kiln_dl_lib *lib) {
    void *h = dlopen(lib->soname, RTLD_NOW | (lib->global ? RTLD_GLOBAL : RTLD_LOCAL));
    if (!h) {
        const char *e = dlerror();
        snprintf(lib->why, sizeof lib->why, "%s", e ? e : "dlopen failed");
        return -1;
    }
    /* A global library's symbols are taken from the process's scope, as the dynamic linker
     * binds them: where the executable uses one of its data objects (Open MPI's
     * ompi_mpi_comm_world, through mpi.h's MPI_COMM_WORLD) it holds a copy (a copy
     * relocation) that the library itself then uses, and the handle would give the
     * library's own, never-initialised one. */
    void *scope = lib->global ? RTLD_DEFAULT : h;
    for (size_t i = 0; i < lib->n; i++) {
        dlerror();
        lib->fns[i] = dlsym(scope, lib->names[i]);
        if (!lib->fns[i]) {
            snprintf(lib->why, sizeof lib->why, "'%s' has no symbol '%s'", lib->soname,
                     lib->names[i]);
            dlclose(h);
            return -1;
        }
    }
    return 1; /* the handle stays open for the life of the process */
}

kiln_err kiln_dl_load(kiln_dl_lib *lib) {
    int st = __atomic_load_n(&lib->state, __ATOMIC_ACQUIRE);
    if (!st) {
        pthread_mutex_lock(&dl_lock);
        st = __atomic_load_n(&lib->state, __ATOMIC_ACQUIRE);
        if (!st) {
            st = dl_open(lib);
            __atomic_store_n(&lib->state, st, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&dl_lock);
    }
    if (st > 0) return KILN_OK;
    return kiln_fail(KILN_ERR_DEVICE, "%s could not be loaded (%s): %s", lib->what, lib->why,
                     lib->hint ? lib->hint
                               : "a GPU run needs it on the library path (LD_LIBRARY_PATH or "
                                 "the CUDA toolkit's lib64)");
}

/* memcheck.c - will a training step fit the memory limits this process has? Checked once
 * kiln's own buffers are allocated and before OpenBLAS is asked for threads or runs its first
 * sgemm: OpenBLAS (0.3.x, driver/others/memory.c) maps a work buffer of BUFFER_SIZE (128 MiB
 * on x86-64) per thread that calls it, and when that mmap fails it retries forever; a worker
 * thread that openblas_set_num_threads starts maps its own at once, and spins the same way.
 * Under an address-space limit a run whose own allocations just fit would hang in its first
 * step (issue 16, defect 6): refused here instead, naming the need and the limit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "train_int.h"

#define MIB (1024.0 * 1024.0)

/* OpenBLAS's own count of its threads (the caller's included), where the library exports
 * it (it does in 0.3.x); 0 when it does not. */
extern int blas_num_threads __attribute__((weak));

/* OpenBLAS's own (driver/others/blas_server.c; the trailing underscore is its Fortran-style
 * name); weak, so that another CBLAS links too. */
extern int blas_thread_shutdown_(void) __attribute__((weak));

void kiln_blas_threads_release(void) {
    if (blas_thread_shutdown_) (void)blas_thread_shutdown_();
}

/* "VmSize:" or "VmData:" of /proc/self/status in bytes; 0 if unknown. */
static uint64_t proc_status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "re");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && sscanf(line + n, " %llu", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* The tightest room left under memory.max along this process's cgroup v2 path (its own
 * group and each above it), into *room, and that group's limit into *limit; false where no
 * group has a limit (or this is no cgroup v2 system). */
static bool cgroup_room(uint64_t *room, uint64_t *limit, char *group, size_t cap) {
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f) return false;
    char line[4096], path[4096] = "";
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "0::", 3)) {
            snprintf(path, sizeof path, "%s", line + 3);
            path[strcspn(path, "\n")] = 0;
            break;
        }
    fclose(f);
    if (!path[0]) return false;
    bool found = false;
    for (;;) {
        char file[4200];
        unsigned long long max = 0, cur = 0;
        snprintf(file, sizeof file, "/sys/fs/cgroup%s/memory.max", strcmp(path, "/") ? path : "");
        FILE *m = fopen(file, "re");
        bool limited = m && fscanf(m, "%llu", &max) == 1;
        if (m) fclose(m);
        if (limited) {
            snprintf(file, sizeof file, "/sys/fs/cgroup%s/memory.current",
                     strcmp(path, "/") ? path : "");
            FILE *c = fopen(file, "re");
            if (c && fscanf(c, "%llu", &cur) != 1) cur = 0;
            if (c) fclose(c);
            uint64_t r = cur < max ? max - cur : 0;
            if (!found || r < *room) {
                *room = r;
                *limit = max;
                snprintf(group, cap, "%s", path);
            }
            found = true;
        }
        char *slash = strrchr(path, '/');
        if (!slash || slash == path) {
            if (!strcmp(path, "/")) break;
            strcpy(path, "/");
        } else {
            *slash = 0;
        }
    }
    return found;
}

kiln_err kiln_train_check_memory(uint64_t kiln_bytes, int threads, const char *task,
                                 const char *what, const char *remedy) {
    const uint64_t buf = KILN_OPENBLAS_BUFFER_BYTES;
    struct rlimit stack;
    uint64_t stack_bytes = 8ull << 20;
    if (getrlimit(RLIMIT_STACK, &stack) == 0 && stack.rlim_cur != RLIM_INFINITY &&
        stack.rlim_cur > 0)
        stack_bytes = stack.rlim_cur;
    /* The threads OpenBLAS has not started yet, each with a stack and its buffer; and the
     * calling thread's buffer, mapped at its first sgemm. */
    int started = &blas_num_threads && blas_num_threads > 0 ? blas_num_threads : 1;
    uint64_t new_threads = threads > started ? (uint64_t)(threads - started) : 0;
    /* The workers started when the library loaded map their buffers as they first run, which
     * on a busy machine can be after this check: those a step will use are counted again
     * (more than they need when they have mapped already, never less). */
    uint64_t used_workers = (uint64_t)((threads < started ? threads : started) - 1);
    uint64_t blas = buf + new_threads * (buf + stack_bytes) + used_workers * buf;
    const uint64_t spare = KILN_TRAIN_SPARE_BYTES;
    kiln_debug("train: memory: %.0f MiB of address space and %.0f MiB of data in use once set "
               "up (%.0f MiB of kiln's buffers for %s); %s needs %.0f MiB more (OpenBLAS "
               "with %d thread%s, and spare)",
               (double)proc_status_kb("VmSize:") / MIB, (double)proc_status_kb("VmData:") / MIB,
               (double)kiln_bytes / MIB, what, task, (double)(blas + spare) / MIB, threads,
               threads > 1 ? "s" : "");
    struct rlimit rl;
    static const struct {
        int res;
        const char *key, *name, *kind;
    } lims[] = {{RLIMIT_AS, "VmSize:", "RLIMIT_AS, ulimit -v", "address space"},
                {RLIMIT_DATA, "VmData:", "RLIMIT_DATA, ulimit -d", "data segment"}};
    for (size_t i = 0; i < sizeof lims / sizeof *lims; i++) {
        if (getrlimit(lims[i].res, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) continue;
        uint64_t now = proc_status_kb(lims[i].key), need = now + blas + spare;
        KILN_FAIL_IF(need > (uint64_t)rl.rlim_cur, KILN_ERR_LIMIT,
                     "not enough memory for %s: it needs about %.0f MiB of %s (%.0f MiB in "
                     "use once set up, %.0f MiB of it kiln's buffers for %s; %.0f MiB more for "
                     "OpenBLAS's work space with %d thread%s; %.0f MiB to spare) and this "
                     "process's limit (%s) is %.0f MiB: %s",
                     task, (double)need / MIB, lims[i].kind, (double)now / MIB,
                     (double)kiln_bytes / MIB, what, (double)blas / MIB, threads,
                     threads > 1 ? "s" : "", (double)spare / MIB, lims[i].name,
                     (double)rl.rlim_cur / MIB, remedy);
    }
    /* A cgroup counts memory once touched: kiln's buffers all will be (they are not yet: a
     * large calloc is untouched pages), and of OpenBLAS's buffers the part a step packs
     * into (KILN_OPENBLAS_TOUCH_BYTES a thread). */
    uint64_t room = 0, limit = 0;
    char group[1024];
    if (cgroup_room(&room, &limit, group, sizeof group)) {
        uint64_t touched = (uint64_t)threads * KILN_OPENBLAS_TOUCH_BYTES,
                 need = kiln_bytes + touched + spare;
        KILN_FAIL_IF(need > room, KILN_ERR_LIMIT,
                     "not enough memory for %s: it needs about %.0f MiB more (%.0f MiB of "
                     "kiln's buffers for %s; %.0f MiB of OpenBLAS's work space with %d "
                     "thread%s; %.0f MiB to spare) and cgroup '%s' has %.0f MiB left under its "
                     "memory.max of %.0f MiB: %s",
                     task, (double)need / MIB, (double)kiln_bytes / MIB, what,
                     (double)touched / MIB, threads, threads > 1 ? "s" : "", (double)spare / MIB,
                     group, (double)room / MIB, (double)limit / MIB, remedy);
    }
    return KILN_OK;
}

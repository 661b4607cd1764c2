/* memcheck.c - will a training step fit the memory limits this process has? Checked once
 * kiln's own buffers are allocated and before the step's threads start: each worker thread
 * maps a stack (RLIMIT_STACK's size, glibc's default), and the GEMM's packed panels live on
 * the stack of the thread that runs it (kernels/cpu/gemm.c, about 200 KiB). Until kiln had
 * its own GEMM, OpenBLAS mapped a 128 MiB work buffer per thread and retried a failed mmap
 * forever, so a run under `ulimit -v` just above kiln's own buffers hung in its first step
 * (issue 16, defect 6); with no library retrying behind kiln's back a failed allocation is
 * an error now, but a run that cannot fit is still refused here, before anything is written,
 * naming the need and the limit, rather than failing at some later step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "train_int.h"

#define MIB (1024.0 * 1024.0)

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
    struct rlimit stack;
    uint64_t stack_bytes = 8ull << 20;
    if (getrlimit(RLIMIT_STACK, &stack) == 0 && stack.rlim_cur != RLIM_INFINITY &&
        stack.rlim_cur > 0)
        stack_bytes = stack.rlim_cur;
    /* The worker threads the step will start (the caller is the first of `threads`), a
     * stack each. */
    uint64_t workers = threads > 1 ? (uint64_t)(threads - 1) : 0,
             stacks = workers * stack_bytes;
    const uint64_t spare = KILN_TRAIN_SPARE_BYTES;
    kiln_debug("train: memory: %.0f MiB of address space and %.0f MiB of data in use once set "
               "up (%.0f MiB of kiln's buffers for %s); %s needs %.0f MiB more (%d thread%s, "
               "and spare)",
               (double)proc_status_kb("VmSize:") / MIB, (double)proc_status_kb("VmData:") / MIB,
               (double)kiln_bytes / MIB, what, task, (double)(stacks + spare) / MIB, threads,
               threads > 1 ? "s" : "");
    struct rlimit rl;
    static const struct {
        int res;
        const char *key, *name, *kind;
    } lims[] = {{RLIMIT_AS, "VmSize:", "RLIMIT_AS, ulimit -v", "address space"},
                {RLIMIT_DATA, "VmData:", "RLIMIT_DATA, ulimit -d", "data segment"}};
    for (size_t i = 0; i < sizeof lims / sizeof *lims; i++) {
        if (getrlimit(lims[i].res, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) continue;
        /* Thread stacks are mappings, not data: RLIMIT_DATA does not count them. */
        uint64_t more = lims[i].res == RLIMIT_AS ? stacks : 0;
        uint64_t now = proc_status_kb(lims[i].key), need = now + more + spare;
        KILN_FAIL_IF(need > (uint64_t)rl.rlim_cur, KILN_ERR_LIMIT,
                     "not enough memory for %s: it needs about %.0f MiB of %s (%.0f MiB in "
                     "use once set up, %.0f MiB of it kiln's buffers for %s; %.0f MiB more for "
                     "the stacks of %llu more thread%s; %.0f MiB to spare) and this process's "
                     "limit (%s) is %.0f MiB: %s",
                     task, (double)need / MIB, lims[i].kind, (double)now / MIB,
                     (double)kiln_bytes / MIB, what, (double)more / MIB,
                     (unsigned long long)workers, workers == 1 ? "" : "s", (double)spare / MIB,
                     lims[i].name, (double)rl.rlim_cur / MIB, remedy);
    }
    /* A cgroup counts memory once touched: kiln's buffers all will be (they are not yet: a
     * large calloc is untouched pages); a stack only as deep as it is used. */
    uint64_t room = 0, limit = 0;
    char group[1024];
    if (cgroup_room(&room, &limit, group, sizeof group)) {
        uint64_t need = kiln_bytes + spare;
        KILN_FAIL_IF(need > room, KILN_ERR_LIMIT,
                     "not enough memory for %s: it needs about %.0f MiB more (%.0f MiB of "
                     "kiln's buffers for %s; %.0f MiB to spare) and cgroup '%s' has %.0f MiB "
                     "left under its memory.max of %.0f MiB: %s",
                     task, (double)need / MIB, (double)kiln_bytes / MIB, what,
                     (double)spare / MIB, group, (double)room / MIB, (double)limit / MIB, remedy);
    }
    return KILN_OK;
}

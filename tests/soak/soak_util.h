/* soak_util.h - what the soak drivers (pull.c, runtime.c) both measure and draw: one copy,
 * header only, so that each tests/soak/NAME.c still builds alone into build/soak/soak_NAME. */
#ifndef KILN_SOAK_UTIL_H
#define KILN_SOAK_UTIL_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

/* splitmix64: the next draw of the generator whose state is *s. */
static inline uint64_t soak_rng(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* This process's resident memory in KiB, or -1 where /proc does not say. */
static inline long soak_rss_kb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, res = -1;
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &res) != 2) res = -1;
        fclose(f);
    }
    return res < 0 ? -1 : res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* This process's open file descriptors, or -1 where /proc does not say. */
static inline int soak_fd_count(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n - 1; /* the directory's own */
}

#endif

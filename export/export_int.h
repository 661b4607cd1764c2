/* export_int.h - helpers shared by the files of the export module only. */
#ifndef KILN_EXPORT_INT_H
#define KILN_EXPORT_INT_H

#include <sys/types.h>

#include "export.h"

/* Streaming reads and writes go through one buffer of this size. */
#define KILN_EXPORT_BUF (1u << 20)

/* A regular file found by kiln_export_walk. */
typedef struct kiln_export_entry {
    char *path; /* relative to the walked directory */
    uint64_t size;
} kiln_export_entry;

/* Walk the directory open at rootfd (dir names it in messages) and list every regular
 * file, sorted by path (strcmp). Symlinks, devices, fifos, sockets, files with more than
 * one link, invalid names and paths longer than KILN_ARCHIVE_PATH_MAX are refused.
 * *list is new (kiln_export_entries_free). */
kiln_err kiln_export_walk(int rootfd, const char *dir, kiln_export_entry **list, size_t *n);
void kiln_export_entries_free(kiln_export_entry *list, size_t n);

/* Open rel (a path that passed kiln_export_path_ok) beneath rootfd without following a
 * symlink at any component. With O_CREAT in flags, missing parent directories are created
 * (mode 0755) and the file is created exclusively. Returns the fd or -1 with errno set. */
int kiln_export_openat(int rootfd, const char *rel, int flags, mode_t mode);

/* Open a regular file beneath rootfd for reading and check it is still a regular file with
 * one link and want_size bytes (label names it in messages). */
kiln_err kiln_export_open_regular(int rootfd, const char *rel, const char *label,
                                  uint64_t want_size, int *fd_out);

/* sha256 and length of everything readable from fd; buf is KILN_EXPORT_BUF bytes. */
kiln_err kiln_export_hash_fd(int fd, const char *label, unsigned char *buf,
                             uint8_t out[KILN_SHA256_BYTES], uint64_t *len);

/* Remove a directory tree without following symlinks (best effort). */
void kiln_export_rmtree(const char *path);

#endif

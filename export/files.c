/* files.c - the export module's file system helpers: a walk that refuses anything but
 * regular files and directories, opens that never follow a symlink, streaming hashes. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "export_int.h"

#define WALK_MAX_DEPTH 32

typedef struct walk {
    const char *dir;
    kiln_export_entry *list;
    size_t n, cap;
} walk;

static kiln_err walk_add(walk *w, char *path, uint64_t size) {
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        kiln_export_entry *l = realloc(w->list, cap * sizeof *l);
        if (!l) {
            free(path);
            return kiln_fail(KILN_ERR_NOMEM, "out of memory listing '%s'", w->dir);
        }
        w->list = l;
        w->cap = cap;
    }
    w->list[w->n].path = path;
    w->list[w->n].size = size;
    w->n++;
    return KILN_OK;
}

static kiln_err walk_dir(walk *w, int dfd, const char *prefix, int depth) {
    if (depth > WALK_MAX_DEPTH)
        return kiln_fail(KILN_ERR_LIMIT, "'%s/%s': directories nested more than %d deep", w->dir,
                         prefix, WALK_MAX_DEPTH);
    int fd2 = dup(dfd);
    if (fd2 < 0)
        return kiln_fail_errno(KILN_ERR_IO, "cannot read directory '%s/%s'", w->dir, prefix);
    DIR *d = fdopendir(fd2);
    if (!d) {
        close(fd2);
        return kiln_fail_errno(KILN_ERR_IO, "cannot read directory '%s/%s'", w->dir, prefix);
    }
    kiln_err rc = KILN_OK;
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(d);
        if (!de) {
            if (errno)
                rc = kiln_fail_errno(KILN_ERR_IO, "cannot read directory '%s/%s'", w->dir, prefix);
            break;
        }
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char *rel = *prefix ? kiln_asprintf("%s/%s", prefix, de->d_name) : kiln_strdup(de->d_name);
        if (!rel) {
            rc = KILN_ERR_NOMEM;
            break;
        }
        struct stat sb;
        if (fstatat(dfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
            rc = kiln_fail_errno(KILN_ERR_IO, "cannot stat '%s/%s'", w->dir, rel);
            free(rel);
            break;
        }
        if (!kiln_export_path_ok(rel, KILN_ARCHIVE_PATH_MAX)) {
            rc =
                kiln_fail(KILN_ERR_FORMAT,
                          "'%s/%s': name not allowed in an archive (components of [A-Za-z0-9._+-], "
                          "at most %d bytes in all)",
                          w->dir, rel, KILN_ARCHIVE_PATH_MAX);
            free(rel);
            break;
        }
        if (S_ISDIR(sb.st_mode)) {
            int sub = openat(dfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) {
                rc = kiln_fail_errno(KILN_ERR_IO, "cannot open directory '%s/%s'", w->dir, rel);
                free(rel);
                break;
            }
            rc = walk_dir(w, sub, rel, depth + 1);
            close(sub);
            free(rel);
            if (rc) break;
        } else if (S_ISREG(sb.st_mode)) {
            /* The rule of every model directory's reader (core/modeldir.c). */
            char *label = kiln_path_join(w->dir, rel);
            rc = label ? kiln_modeldir_file_ok(&sb, label) : KILN_ERR_NOMEM;
            free(label);
            if (rc) {
                free(rel);
                break;
            }
            if ((rc = walk_add(w, rel, (uint64_t)sb.st_size))) break;
        } else {
            rc = kiln_fail(KILN_ERR_FORMAT,
                           "'%s/%s': is %s; only regular files and directories are packed", w->dir,
                           rel, kiln_file_kind(sb.st_mode));
            free(rel);
            break;
        }
    }
    closedir(d);
    return rc;
}

static int entry_cmp(const void *a, const void *b) {
    return strcmp(((const kiln_export_entry *)a)->path, ((const kiln_export_entry *)b)->path);
}

kiln_err kiln_export_walk(int rootfd, const char *dir, kiln_export_entry **list, size_t *n) {
    walk w = {dir, NULL, 0, 0};
    *list = NULL;
    *n = 0;
    kiln_err rc = walk_dir(&w, rootfd, "", 0);
    if (rc) {
        kiln_export_entries_free(w.list, w.n);
        return rc;
    }
    if (w.n) qsort(w.list, w.n, sizeof *w.list, entry_cmp);
    *list = w.list;
    *n = w.n;
    return KILN_OK;
}

void kiln_export_entries_free(kiln_export_entry *list, size_t n) {
    for (size_t i = 0; list && i < n; i++)
        free(list[i].path);
    free(list);
}

int kiln_export_openat(int rootfd, const char *rel, int flags, mode_t mode) {
    bool create = (flags & O_CREAT) != 0;
    size_t len = strlen(rel);
    char *p = malloc(len + 1);
    if (!p) {
        errno = ENOMEM;
        return -1;
    }
    memcpy(p, rel, len + 1);
    int dfd = rootfd, fd = -1;
    char *s = p;
    for (;;) {
        char *slash = strchr(s, '/');
        if (!slash) break;
        *slash = 0;
        if (create && mkdirat(dfd, s, 0755) != 0 && errno != EEXIST) goto out;
        int nfd = openat(dfd, s, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (nfd < 0) goto out;
        if (dfd != rootfd) close(dfd);
        dfd = nfd;
        s = slash + 1;
    }
    fd = openat(dfd, s, flags | O_NOFOLLOW | O_CLOEXEC | (create ? O_EXCL : 0), mode);
out:;
    int e = errno;
    if (dfd != rootfd) close(dfd);
    free(p);
    errno = e;
    return fd;
}

kiln_err kiln_export_open_regular(int rootfd, const char *rel, const char *label,
                                  uint64_t want_size, int *fd_out) {
    /* The rule of every model directory's reader (core/modeldir.c), on the descriptor: a file
     * swapped for a link or a fifo after the walk is refused, not read through. */
    uint64_t size;
    KILN_TRY(kiln_modeldir_openat(rootfd, rel, label, fd_out, &size));
    if (size != want_size) {
        close(*fd_out);
        *fd_out = -1;
        return kiln_fail(KILN_ERR_CONFLICT,
                         "'%s': changed while being read (%ju bytes, expected %ju)", label,
                         (uintmax_t)size, (uintmax_t)want_size);
    }
    return KILN_OK;
}

kiln_err kiln_export_hash_fd(int fd, const char *label, unsigned char *buf,
                             uint8_t out[KILN_SHA256_BYTES], uint64_t *len) {
    kiln_sha256_state st;
    kiln_sha256_init(&st);
    uint64_t total = 0;
    for (;;) {
        ssize_t n = read(fd, buf, KILN_EXPORT_BUF);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0) return kiln_fail_errno(KILN_ERR_IO, "cannot read '%s'", label);
        if (n == 0) break;
        kiln_sha256_update(&st, buf, (size_t)n);
        total += (uint64_t)n;
    }
    kiln_sha256_final(&st, out);
    *len = total;
    return KILN_OK;
}

static void rm_at(int dfd, const char *name, int depth) {
    struct stat sb;
    if (fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0) return;
    if (S_ISDIR(sb.st_mode) && depth < 64) {
        int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0) {
            DIR *d = fdopendir(fd);
            if (!d) {
                close(fd);
            } else {
                struct dirent *de;
                while ((de = readdir(d)))
                    if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
                        rm_at(dirfd(d), de->d_name, depth + 1);
                closedir(d);
            }
        }
        unlinkat(dfd, name, AT_REMOVEDIR);
    } else {
        unlinkat(dfd, name, 0);
    }
}

void kiln_export_rmtree(const char *path) {
    rm_at(AT_FDCWD, path, 0);
}

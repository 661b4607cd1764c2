/* file.c - whole-file reads, atomic writes, directories. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"

const char *kiln_file_kind(unsigned mode) {
    mode_t m = (mode_t)mode;
    if (S_ISREG(m)) return "a regular file";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISLNK(m)) return "a symlink";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file or directory";
}

kiln_err kiln_open_input(const char *path, int *fd_out, uint64_t *size) {
    *fd_out = -1;
    if (size) *size = 0;
    /* O_NONBLOCK: a FIFO's open would wait for a writer (for ever, and SIGTERM would find
     * kiln in the kernel); with it the open returns and the FIFO is refused below. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return kiln_fail_errno(KILN_ERR_IO, "cannot open '%s'", path);
    struct stat sb;
    kiln_err rc = KILN_OK;
    int fl;
    /* The descriptor's own type, not the path's: a file swapped for a FIFO between a stat()
     * and the open is caught here. */
    if (fstat(fd, &sb) != 0)
        rc = kiln_fail_errno(KILN_ERR_IO, "cannot stat '%s'", path);
    else if (!S_ISREG(sb.st_mode))
        rc = kiln_fail(KILN_ERR_IO, "'%s': not a regular file (%s)", path, kiln_file_kind(sb.st_mode));
    else if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        rc = kiln_fail_errno(KILN_ERR_IO, "cannot set up reading '%s'", path);
    if (rc) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    if (size) *size = (uint64_t)sb.st_size;
    return KILN_OK;
}

kiln_err kiln_read_fd(int fd, uint64_t size, size_t limit, const char *label, char **buf,
                      size_t *len) {
    *buf = NULL;
    *len = 0;
    kiln_err rc = KILN_OK;
    char *p = NULL;
    KILN_CHECK_IF(rc, out, size > limit, KILN_ERR_LIMIT,
                  "'%s' is %llu bytes, more than the limit of %zu", label,
                  (unsigned long long)size, limit);
    size_t want = (size_t)size, got = 0;
    p = kiln_malloc(want + 1);
    KILN_CHECK_IF(rc, out, !p, KILN_ERR_NOMEM, "out of memory reading '%s'", label);
    while (got < want) {
        ssize_t n = read(fd, p + got, want - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            rc = kiln_fail_errno(KILN_ERR_IO, "cannot read '%s'", label);
            goto out;
        }
        if (n == 0) break; /* shrank under us: take what is there */
        got += (size_t)n;
    }
    p[got] = 0;
    *buf = p;
    *len = got;
    p = NULL;
out:
    free(p);
    close(fd);
    return rc;
}

kiln_err kiln_read_file(const char *path, size_t limit, char **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    int fd;
    uint64_t size;
    KILN_TRY(kiln_open_input(path, &fd, &size));
    return kiln_read_fd(fd, size, limit, path, buf, len);
}

char *kiln_dirname(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return kiln_strdup(".");
    if (slash == path) return kiln_strdup("/");
    size_t n = (size_t)(slash - path);
    char *d = kiln_malloc(n + 1);
    if (d) {
        memcpy(d, path, n);
        d[n] = 0;
    }
    return d;
}

char *kiln_path_join(const char *a, const char *b) {
    size_t la = strlen(a);
    if (la && a[la - 1] == '/') return kiln_asprintf("%s%s", a, b);
    return kiln_asprintf("%s/%s", a, b);
}

/* Past an entry that cannot be removed, on to the rest (best effort). */
static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

void kiln_rmtree(const char *path) {
    if (path) nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

bool kiln_path_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

kiln_dir_state kiln_path_dir_state(const char *path) {
    struct stat sb;
    if (stat(path, &sb)) return KILN_DIR_ABSENT;
    if (!S_ISDIR(sb.st_mode)) return KILN_DIR_OTHER;
    DIR *d = opendir(path);
    if (!d) return KILN_DIR_OTHER;
    kiln_dir_state st = KILN_DIR_EMPTY;
    for (struct dirent *e; st == KILN_DIR_EMPTY && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) st = KILN_DIR_FULL;
    closedir(d);
    return st;
}

kiln_err kiln_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return kiln_fail_errno(KILN_ERR_IO, "cannot open directory '%s'", dir);
    kiln_err rc = KILN_OK;
    if (fsync(fd) != 0 && errno != EINVAL) rc = kiln_fail_errno(KILN_ERR_IO, "cannot fsync '%s'", dir);
    close(fd);
    return rc;
}

kiln_err kiln_mkdir_p(const char *path) {
    char *p = kiln_strdup(path);
    if (!p) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == 0) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST) {
                rc = kiln_fail_errno(KILN_ERR_IO, "cannot create directory '%s'", p);
                break;
            }
            *s = c;
            if (!c) break;
        }
    }
    if (!rc) {
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
            rc = kiln_fail(KILN_ERR_IO, "'%s' exists and is not a directory", path);
    }
    free(p);
    return rc;
}

kiln_err kiln_atomic_begin(kiln_atomic *a, const char *path) {
    a->fd = -1;
    a->tmp = NULL;
    a->path = kiln_strdup(path);
    if (!a->path) return KILN_ERR_NOMEM;
    char *dir = kiln_dirname(path);
    if (!dir) {
        kiln_atomic_abort(a);
        return KILN_ERR_NOMEM;
    }
    a->tmp = kiln_asprintf("%s/.%s.tmp-XXXXXX", dir, strrchr(path, '/') ? strrchr(path, '/') + 1 : path);
    free(dir);
    if (!a->tmp) {
        kiln_atomic_abort(a);
        return KILN_ERR_NOMEM;
    }
    a->fd = mkostemp(a->tmp, O_CLOEXEC);
    if (a->fd < 0) {
        kiln_err rc = kiln_fail_errno(KILN_ERR_IO, "cannot create a temporary file for '%s'", path);
        free(a->tmp);
        a->tmp = NULL;
        kiln_atomic_abort(a);
        return rc;
    }
    /* mkostemp makes 0600; the result is an ordinary file. */
    (void)fchmod(a->fd, 0644);
    return KILN_OK;
}

kiln_err kiln_atomic_write(kiln_atomic *a, const void *data, size_t len) {
    const char *p = data;
    while (len) {
        ssize_t n = write(a->fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return kiln_fail_errno(KILN_ERR_IO, "cannot write '%s'", a->path);
        p += n;
        len -= (size_t)n;
    }
    return KILN_OK;
}

kiln_err kiln_atomic_commit(kiln_atomic *a) {
    kiln_err rc = KILN_OK;
    /* Before the rename, so that running out of memory cannot fail a write that replaced the
     * target already. */
    char *dir = kiln_dirname(a->path);
    if (!dir) {
        rc = kiln_fail(KILN_ERR_NOMEM, "out of memory writing '%s'", a->path);
        goto fail;
    }
    if (fsync(a->fd) != 0) {
        rc = kiln_fail_errno(KILN_ERR_IO, "cannot fsync '%s'", a->tmp);
        goto fail;
    }
    if (close(a->fd) != 0) {
        a->fd = -1;
        rc = kiln_fail_errno(KILN_ERR_IO, "cannot close '%s'", a->tmp);
        goto fail;
    }
    a->fd = -1;
    if (rename(a->tmp, a->path) != 0) {
        rc = kiln_fail_errno(KILN_ERR_IO, "cannot rename '%s' to '%s'", a->tmp, a->path);
        goto fail;
    }
    free(a->tmp);
    a->tmp = NULL;
    rc = kiln_fsync_dir(dir);
fail:
    free(dir);
    kiln_atomic_abort(a);
    return rc;
}

void kiln_atomic_abort(kiln_atomic *a) {
    if (a->fd >= 0) close(a->fd);
    a->fd = -1;
    if (a->tmp) unlink(a->tmp);
    free(a->tmp);
    free(a->path);
    a->tmp = NULL;
    a->path = NULL;
}

kiln_err kiln_write_file_atomic(const char *path, const void *data, size_t len) {
    kiln_atomic a;
    kiln_err rc = kiln_atomic_begin(&a, path);
    if (rc) return rc;
    rc = kiln_atomic_write(&a, data, len);
    if (rc) {
        kiln_atomic_abort(&a);
        return rc;
    }
    return kiln_atomic_commit(&a);
}

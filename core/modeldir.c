/* modeldir.c - the one rule for what a model directory may hold, for every reader of one
 * (kiln pack and its manifest, kiln release, the runtime's kiln_model_open and validate's
 * model): regular files with one link each, reached without a symlink at any component
 * below the directory named. Each file is opened with O_NOFOLLOW (and O_NONBLOCK, so that
 * a FIFO cannot hang the open) and checked on the descriptor it is then read through, so
 * nothing swapped in between a look and the read is read: a card.json or model.safetensors
 * linked to a file elsewhere is refused, never packed, signed and published. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"

kiln_err kiln_modeldir_file_ok(const struct stat *sb, const char *label) {
    KILN_FAIL_IF(!S_ISREG(sb->st_mode), KILN_ERR_FORMAT,
                 "'%s': is %s; a model directory holds regular files only", label,
                 kiln_file_kind(sb->st_mode));
    KILN_FAIL_IF(sb->st_nlink > 1, KILN_ERR_FORMAT,
                 "'%s': has %ju hard links; a model directory holds files with one link only",
                 label, (uintmax_t)sb->st_nlink);
    return KILN_OK;
}

kiln_err kiln_modeldir_openat(int dirfd, const char *rel, const char *label, int *fd_out,
                              uint64_t *size) {
    *fd_out = -1;
    char *p = kiln_strdup(rel);
    if (!p) return KILN_ERR_NOMEM;
    int dfd = dirfd, fd = -1;
    kiln_err rc = KILN_OK;
    char *s = p;
    for (char *slash; (slash = strchr(s, '/')); s = slash + 1) {
        *slash = 0;
        int nfd = openat(dfd, s, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (nfd < 0) {
            rc = kiln_fail_errno(errno == ENOENT ? KILN_ERR_NOTFOUND : KILN_ERR_IO,
                                 "cannot open '%s'%s", label,
                                 errno == ELOOP || errno == ENOTDIR
                                     ? " (a directory of a model directory is no symlink)"
                                     : "");
            goto out;
        }
        if (dfd != dirfd) close(dfd);
        dfd = nfd;
    }
    fd = openat(dfd, s, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        struct stat lb;
        /* ELOOP is what O_NOFOLLOW says of a symlink: named as such. */
        if (e == ELOOP && fstatat(dfd, s, &lb, AT_SYMLINK_NOFOLLOW) == 0)
            rc = kiln_modeldir_file_ok(&lb, label);
        errno = e;
        if (!rc)
            rc = kiln_fail_errno(e == ENOENT ? KILN_ERR_NOTFOUND : KILN_ERR_IO, "cannot open '%s'",
                                 label);
        goto out;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        rc = kiln_fail_errno(KILN_ERR_IO, "cannot stat '%s'", label);
    else
        rc = kiln_modeldir_file_ok(&sb, label);
    /* Reads of a regular file do not block: the flag only kept a FIFO from hanging open. */
    if (!rc && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
        rc = kiln_fail_errno(KILN_ERR_IO, "'%s'", label);
    if (!rc) {
        if (size) *size = (uint64_t)sb.st_size;
        *fd_out = fd;
        fd = -1;
    }
out:
    if (fd >= 0) close(fd);
    if (dfd != dirfd) close(dfd);
    free(p);
    return rc;
}

kiln_err kiln_modeldir_open(const char *dir, const char *rel, int *fd_out, uint64_t *size) {
    *fd_out = -1;
    char *label = kiln_path_join(dir, rel);
    if (!label) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    /* The directory itself as the caller names it (a link to it is the caller's choice). */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        rc = kiln_fail_errno(errno == ENOENT ? KILN_ERR_NOTFOUND : KILN_ERR_IO,
                             "cannot open model directory '%s'", dir);
    else
        rc = kiln_modeldir_openat(dfd, rel, label, fd_out, size);
    if (dfd >= 0) close(dfd);
    free(label);
    return rc;
}

kiln_err kiln_modeldir_read(const char *dir, const char *rel, size_t limit, char **buf,
                            size_t *len) {
    *buf = NULL;
    *len = 0;
    int fd;
    uint64_t size;
    KILN_TRY(kiln_modeldir_open(dir, rel, &fd, &size));
    char *label = kiln_path_join(dir, rel);
    if (!label) {
        close(fd);
        return KILN_ERR_NOMEM;
    }
    kiln_err rc = kiln_read_fd(fd, size, limit, label, buf, len);
    free(label);
    return rc;
}

kiln_err kiln_modeldir_json(const char *dir, const char *rel, size_t limit, json_t **out) {
    *out = NULL;
    char *buf = NULL, *label = NULL;
    size_t len = 0;
    KILN_TRY(kiln_modeldir_read(dir, rel, limit, &buf, &len));
    label = kiln_path_join(dir, rel);
    kiln_err rc =
        label ? kiln_json_parse(buf, len, label, out) : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    free(label);
    free(buf);
    return rc;
}

kiln_err kiln_modeldir_st(const char *dir, const char *rel, kiln_st **out) {
    *out = NULL;
    int fd;
    KILN_TRY(kiln_modeldir_open(dir, rel, &fd, NULL));
    char *label = kiln_path_join(dir, rel);
    kiln_err rc =
        label ? kiln_st_open_fd(fd, label, out) : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    free(label);
    close(fd);
    return rc;
}

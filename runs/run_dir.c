/* run_dir.c - what a run directory holds besides its logs, as its writer (the trainer) and
 * its readers agree on it: the checkpoints' names (RUN_DIR/ckpt/step-NNNNNNNN.safetensors) and
 * the .lock that says a trainer holds the run. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runs_int.h"

char *kiln_run_ckpt_path(const char *run_dir, long step) {
    char name[KILN_CKPT_NAME_MAX];
    kiln_ckpt_name(step, name);
    return kiln_asprintf("%s%sckpt/%s", run_dir,
                         run_dir[0] && run_dir[strlen(run_dir) - 1] == '/' ? "" : "/", name);
}

kiln_err kiln_run_ckpt_list(const char *run_dir, long **steps, size_t *n) {
    *steps = NULL;
    *n = 0;
    char *dir = kiln_path_join(run_dir, "ckpt");
    if (!dir) return KILN_ERR_NOMEM;
    kiln_err rc = kiln_ckpt_steps(dir, steps, n);
    free(dir);
    return rc;
}

/* One process per run directory: an exclusive flock on RUN_DIR/.lock, released by the
 * kernel however the process ends (SIGKILL included), so a stale lock cannot block.
 * The same open file also carries an OFD write lock over the whole file, the sign that the
 * run is live for readers (kiln_run_live): F_OFD_GETLK tests it without taking anything,
 * where a reader probing the flock would hold it for a moment and could make a trainer
 * starting then fail with "another kiln process". On Linux the two kinds of lock do not
 * interact. */
kiln_err kiln_run_lock(const char *run_dir, int *fd) {
    char *p = kiln_path_join(run_dir, ".lock");
    if (!p) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    *fd = open(p, O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (*fd < 0)
        rc = kiln_fail_errno(KILN_ERR_IO, "cannot open '%s'", p);
    else if (flock(*fd, LOCK_EX | LOCK_NB) != 0)
        rc = errno == EWOULDBLOCK
                 ? kiln_fail(KILN_ERR_CONFLICT, "'%s': another kiln process is training this run",
                             run_dir)
                 : kiln_fail_errno(KILN_ERR_IO, "cannot lock '%s'", p);
    struct flock live = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (!rc && fcntl(*fd, F_OFD_SETLK, &live) != 0)
        kiln_warn("cannot mark '%s' live (%s): kiln runs list will show the run as interrupted", p,
                  strerror(errno));
    free(p);
    return rc;
}

kiln_err kiln_run_live(const char *run_dir, bool *live) {
    *live = false;
    char *p = kiln_path_join(run_dir, ".lock");
    if (!p) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    /* O_NOFOLLOW and O_NONBLOCK: a .lock linked out of the run, or a FIFO in its place, is
     * neither followed nor waited on (a reader such as kiln runs serve would hang on it); and
     * anything but a regular file is refused, named. */
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat sb;
    if (fd < 0) {
        if (errno != ENOENT) rc = kiln_fail_errno(KILN_ERR_IO, "cannot open '%s'", p);
    } else if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        rc = kiln_fail(KILN_ERR_IO, "'%s': not a regular file", p);
        close(fd);
    } else {
        struct flock q = {.l_type = F_RDLCK, .l_whence = SEEK_SET};
        if (fcntl(fd, F_OFD_GETLK, &q) != 0)
            rc = kiln_fail_errno(KILN_ERR_IO, "cannot test the lock on '%s'", p);
        else
            *live = q.l_type != F_UNLCK;
        close(fd);
    }
    free(p);
    return rc;
}

/* proc.c - running the scheduler's commands and the trainer as child processes. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core.h"
#include "sweep_int.h"

extern char **environ;

/* environ plus add (NULL ended); the array is the caller's to free, its strings are not. */
static char **env_with(const char *const *add) {
    size_t n = 0, m = 0;
    while (environ[n])
        n++;
    while (add && add[m])
        m++;
    char **e = kiln_calloc(n + m + 1, sizeof *e);
    if (!e) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bool replaced = false;
        for (size_t j = 0; j < m && !replaced; j++) {
            const char *eq = strchr(add[j], '=');
            size_t len = eq ? (size_t)(eq - add[j]) + 1 : strlen(add[j]);
            replaced = !strncmp(environ[i], add[j], len);
        }
        if (!replaced) e[k++] = environ[i];
    }
    for (size_t j = 0; j < m; j++)
        e[k++] = (char *)add[j];
    return e;
}

kiln_err sweep_spawn(const char *const *argv, const char *const *env_add, bool own_group,
                     const char *log, pid_t *pid) {
    posix_spawnattr_t at;
    if (posix_spawnattr_init(&at)) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    /* The child starts with default signal handling, whatever this process set. */
    sigset_t def;
    sigemptyset(&def);
    sigaddset(&def, SIGTERM);
    sigaddset(&def, SIGINT);
    sigaddset(&def, SIGPIPE);
    short flags = POSIX_SPAWN_SETSIGDEF;
    posix_spawnattr_setsigdefault(&at, &def);
    if (own_group) {
        flags |= POSIX_SPAWN_SETPGROUP;
        posix_spawnattr_setpgroup(&at, 0);
    }
    posix_spawnattr_setflags(&at, flags);
    char **env = env_with(env_add);
    if (!env) {
        posix_spawnattr_destroy(&at);
        return KILN_ERR_NOMEM;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (log) {
        posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        posix_spawn_file_actions_adddup2(&fa, 1, 2);
    }
    int e = posix_spawnp(pid, argv[0], &fa, &at, (char *const *)argv, env);
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    posix_spawnattr_destroy(&at);
    if (e == ENOENT) return kiln_fail(KILN_ERR_NOTFOUND, "'%s' not found on PATH", argv[0]);
    if (e) return kiln_fail(KILN_ERR_IO, "cannot start '%s': %s", argv[0], strerror(e));
    return KILN_OK;
}

static kiln_err grow(char **buf, size_t *len, size_t *cap, const char *data, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t nc = (*len + n + 1) * 2;
        char *b = realloc(*buf, nc);
        if (!b) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        *buf = b;
        *cap = nc;
    }
    memcpy(*buf + *len, data, n);
    *len += n;
    (*buf)[*len] = 0;
    return KILN_OK;
}

kiln_err sweep_capture(const char *const *argv, char **out, char **err, int *status) {
    if (out) *out = NULL;
    if (err) *err = NULL;
    int po[2] = {-1, -1}, pe[2] = {-1, -1};
    if (pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC)) {
        kiln_err rc = kiln_fail_errno(KILN_ERR_IO, "pipe");
        if (po[0] >= 0) close(po[0]), close(po[1]);
        return rc;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, po[1], 1);
    posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    pid_t pid;
    int e = posix_spawnp(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(po[1]);
    close(pe[1]);
    if (e) {
        close(po[0]);
        close(pe[0]);
        if (e == ENOENT) return kiln_fail(KILN_ERR_NOTFOUND, "'%s' not found on PATH", argv[0]);
        return kiln_fail(KILN_ERR_IO, "cannot start '%s': %s", argv[0], strerror(e));
    }
    char *b[2] = {NULL, NULL};
    size_t len[2] = {0, 0}, cap[2] = {0, 0};
    struct pollfd fds[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
    int open_fds = 2;
    kiln_err rc = KILN_OK;
    while (open_fds) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            rc = kiln_fail_errno(KILN_ERR_IO, "poll");
            break;
        }
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !fds[i].revents) continue;
            char tmp[4096];
            ssize_t n = read(fds[i].fd, tmp, sizeof tmp);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
                continue;
            }
            if (!rc && len[i] < (1 << 24)) rc = grow(&b[i], &len[i], &cap[i], tmp, (size_t)n);
        }
    }
    for (int i = 0; i < 2; i++)
        if (fds[i].fd >= 0) close(fds[i].fd);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    *status = st;
    if (!rc) {
        for (int i = 0; i < 2; i++)
            if (!b[i] && !(b[i] = kiln_strdup(""))) rc = KILN_ERR_NOMEM;
    }
    if (rc || !out)
        free(b[0]);
    else
        *out = b[0];
    if (rc || !err)
        free(b[1]);
    else
        *err = b[1];
    return rc;
}

void sweep_status_text(int status, char *buf, size_t n) {
    if (WIFEXITED(status))
        snprintf(buf, n, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, n, "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(buf, n, "ended with wait status %d", status);
}

char *sweep_shell_quote(const char *s) {
    size_t n = 3;
    for (const char *c = s; *c; c++)
        n += *c == '\'' ? 4 : 1;
    char *q = kiln_malloc(n);
    if (!q) return NULL;
    char *o = q;
    *o++ = '\'';
    for (const char *c = s; *c; c++) {
        if (*c == '\'') {
            memcpy(o, "'\\''", 4);
            o += 4;
        } else {
            *o++ = *c;
        }
    }
    *o++ = '\'';
    *o = 0;
    return q;
}

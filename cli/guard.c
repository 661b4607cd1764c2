/* guard.c - what reaches the operator's terminal from a registry is text, not commands: a
 * compromised registry (or a record or card someone sent) can put escape sequences into a
 * reason, a publisher's name or a card, which a terminal would obey (retitle it, move the
 * cursor over earlier lines, on some terminals more). The commands that print such words
 * write through these streams, which pass every byte but the C0 controls other than tab,
 * newline and carriage return, DEL, and the C1 controls (U+0080-U+009F, 0xC2 0x80-0x9F in
 * UTF-8), each of which becomes '?'. Whole-stream, so that no printf in any command can miss
 * it; the commands that draw on the terminal themselves (train, runs plot) are not guarded. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cli.h"

typedef struct {
    int fd;
    bool held; /* the last byte written was 0xC2: the next says whether it began a C1 control */
} guard;

static bool put(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

size_t cli_guard_filter(bool *held, const char *in, size_t n, char *out) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)in[i];
        if (*held) {
            *held = false;
            if (c >= 0x80 && c <= 0x9f) {
                out[m++] = '?';
                continue;
            }
            out[m++] = (char)0xC2;
        }
        if (c == 0xC2)
            *held = true;
        else if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f)
            out[m++] = '?';
        else
            out[m++] = (char)c;
    }
    return m;
}

static ssize_t guard_write(void *cookie, const char *buf, size_t size) {
    guard *g = cookie;
    char out[4097];
    for (size_t at = 0; at < size;) {
        size_t n = size - at < 4096 ? size - at : 4096;
        size_t m = cli_guard_filter(&g->held, buf + at, n, out);
        if (!put(g->fd, out, m)) return -1;
        at += n;
    }
    return (ssize_t)size;
}

static int guard_close(void *cookie) {
    guard *g = cookie;
    return !g->held || put(g->fd, "\xC2", 1) ? 0 : -1;
}

/* The streams' state lives as long as the process (they are never closed, only flushed at
 * exit): static, so that nothing is left allocated. */
static guard guard_out = {STDOUT_FILENO, false}, guard_err = {STDERR_FILENO, false};

static FILE *guarded(guard *g, int mode) {
    cookie_io_functions_t io = {.write = guard_write, .close = guard_close};
    FILE *f = fopencookie(g, "w", io);
    if (f) setvbuf(f, NULL, mode, mode == _IONBF ? 0 : BUFSIZ);
    return f;
}

void cli_guard_terminal(void) {
    fflush(stdout);
    fflush(stderr);
    FILE *out = guarded(&guard_out, isatty(STDOUT_FILENO) ? _IOLBF : _IOFBF),
         *err = guarded(&guard_err, _IONBF);
    /* Out of memory this early: the plain streams, as before. */
    if (out) stdout = out;
    if (err) stderr = err;
}

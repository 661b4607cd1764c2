/* password.c - secret keys for the commands that sign: the password from
 * $KILN_PASSWORD_FILE or the terminal, into guarded memory. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

#include "cli.h"
#include "core.h"
#include "sign.h"

/* Read one line from the terminal with echo off into guarded memory. */
static kiln_err tty_password(const char *prompt, char *pw, size_t *len) {
    int fd = open("/dev/tty", O_RDWR | O_CLOEXEC | O_NOCTTY);
    KILN_FAIL_IF(fd < 0, KILN_ERR_USAGE,
                 "no terminal to read the password from; set KILN_PASSWORD_FILE to a file that "
                 "holds it");
    struct termios old, quiet;
    bool restore = tcgetattr(fd, &old) == 0;
    if (restore) {
        quiet = old;
        quiet.c_lflag &= ~(tcflag_t)ECHO;
        quiet.c_lflag |= ECHONL;
        tcsetattr(fd, TCSAFLUSH, &quiet);
    }
    if (write(fd, prompt, strlen(prompt)) < 0) { /* the prompt is a courtesy */
    }
    kiln_err rc = KILN_OK;
    size_t n = 0;
    for (;;) {
        char c;
        ssize_t r = read(fd, &c, 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0 || c == '\n') break;
        if (n >= KILN_SIGN_PASSWORD_MAX) {
            rc = kiln_fail(KILN_ERR_USAGE, "the password is longer than %d bytes",
                           KILN_SIGN_PASSWORD_MAX);
            break;
        }
        pw[n++] = c;
    }
    if (restore) tcsetattr(fd, TCSAFLUSH, &old);
    close(fd);
    if (n && pw[n - 1] == '\r') n--;
    pw[n] = 0;
    *len = n;
    return rc;
}

kiln_err cli_get_password(const char *prompt, bool confirm, char **out, size_t *len) {
    *out = NULL;
    char *pw = kiln_sign_secret_alloc(KILN_SIGN_PASSWORD_MAX + 1);
    if (!pw) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    const char *file = getenv("KILN_PASSWORD_FILE");
    if (file && *file) {
        char *buf;
        size_t n;
        KILN_CHECK(rc, fail, kiln_read_file(file, 64u << 10, &buf, &n));
        char *nl = memchr(buf, '\n', n);
        size_t l = nl ? (size_t)(nl - buf) : n;
        if (l && buf[l - 1] == '\r') l--;
        if (l > KILN_SIGN_PASSWORD_MAX) {
            rc = kiln_fail(KILN_ERR_USAGE, "'%s': the password is longer than %d bytes", file,
                           KILN_SIGN_PASSWORD_MAX);
        } else {
            memcpy(pw, buf, l);
            pw[l] = 0;
            *len = l;
        }
        kiln_sign_wipe(buf, n);
        free(buf);
        if (rc != KILN_OK) goto fail;
    } else {
        KILN_CHECK(rc, fail, tty_password(prompt, pw, len));
        if (confirm) {
            char *again = kiln_sign_secret_alloc(KILN_SIGN_PASSWORD_MAX + 1);
            size_t alen = 0;
            KILN_CHECK_IF(rc, fail, !again, KILN_ERR_NOMEM, "out of guarded memory");
            rc = tty_password("Password (again): ", again, &alen);
            bool same = rc == KILN_OK && alen == *len && kiln_sign_secret_equal(again, pw, alen);
            kiln_sign_secret_free(again);
            if (rc != KILN_OK) goto fail;
            KILN_CHECK_IF(rc, fail, !same, KILN_ERR_USAGE, "the passwords do not match");
        }
    }
    *out = pw;
    return KILN_OK;
fail:
    kiln_sign_secret_free(pw);
    return rc;
}

kiln_err cli_load_seckey(const char *path, kiln_sign_seckey **out) {
    KILN_TRY(kiln_sign_seckey_load(path, out));
    if (!kiln_sign_seckey_encrypted(*out)) return KILN_OK;
    char *pw, prompt[512];
    size_t len;
    snprintf(prompt, sizeof prompt, "Password for '%s': ", path);
    kiln_err rc = cli_get_password(prompt, false, &pw, &len);
    if (rc == KILN_OK) {
        rc = kiln_sign_seckey_decrypt(*out, pw, len);
        kiln_sign_secret_free(pw);
    }
    if (rc != KILN_OK) {
        kiln_sign_seckey_free(*out);
        *out = NULL;
    }
    return rc;
}

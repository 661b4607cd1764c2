/* sweep_int.h - helpers shared inside sweep/ (processes, records). */
#ifndef KILN_SWEEP_INT_H
#define KILN_SWEEP_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "sweep.h"

/* s, or def when s is NULL. */
static inline const char *sweep_or(const char *s, const char *def) {
    return s ? s : def;
}

/* A map from strings to positions (sweep/index.c). The keys are borrowed: they must outlive
 * the index. Release a zeroed or initialised one with sweep_index_release. */
typedef struct sweep_index {
    const char **keys;
    size_t *vals;
    size_t cap, n;
} sweep_index;
/* Room for expect keys before it grows. */
kiln_err sweep_index_init(sweep_index *x, size_t expect);
void sweep_index_release(sweep_index *x);
/* key -> val, replacing what key had. */
kiln_err sweep_index_put(sweep_index *x, const char *key, size_t val);
/* key's val, or SIZE_MAX when it has none. */
size_t sweep_index_get(const sweep_index *x, const char *key);

/* Significant digits, at least at_least, with which "%.*g" of x reads back as x: at_least
 * itself when it does, else few more (a binary search; 17 always do). For records, where
 * any exact text serves; point names count up from 1. */
int sweep_digits(double x, int at_least);

/* Run argv (PATH searched) to its end, its stdout into *out and its stderr into *err (both
 * NUL-terminated, caller frees; either pointer may be NULL to discard), *status waitpid's.
 * A program that cannot be started is KILN_ERR_NOTFOUND naming it. */
kiln_err sweep_capture(const char *const *argv, char **out, char **err, int *status);
/* Start argv (PATH searched), in a process group of its own when own_group, with env_add
 * ("K=V" strings, NULL ended, may be NULL) added to the environment and, when log is not
 * NULL, stdout and stderr appended to that file; *pid its id. */
kiln_err sweep_spawn(const char *const *argv, const char *const *env_add, bool own_group,
                     const char *log, pid_t *pid);
/* "exited with status N" / "was killed by signal N (NAME)" into buf. */
void sweep_status_text(int status, char *buf, size_t n);
/* s quoted for sh: '...' with each ' as '\''; caller frees. */
char *sweep_shell_quote(const char *s);

#endif

/* ckptdir.c - the names of a run's checkpoints, as the trainer writes them and runs/ and export/
 * read them: RUN_DIR/ckpt/step-NNNNNNNN.safetensors, the step in at least 8 decimal digits (a
 * step past 99999999 takes more). One rule for all three: runs/ once read exactly 8 digits and
 * export/ 8 to 18, so a run past step 99999999 had checkpoints that `kiln runs` did not see. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

void kiln_ckpt_name(long step, char out[KILN_CKPT_NAME_MAX]) {
    snprintf(out, KILN_CKPT_NAME_MAX, "step-%08ld.safetensors", step);
}

/* name's step, or -1 when name is no checkpoint's. */
static long name_step(const char *name) {
    if (strncmp(name, "step-", 5)) return -1;
    const char *p = name + 5, *q = p;
    while (*q >= '0' && *q <= '9')
        q++;
    if (q - p < 8 || q - p > 18 || strcmp(q, ".safetensors")) return -1;
    return strtol(p, NULL, 10);
}

static int cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

kiln_err kiln_ckpt_steps(const char *dir, long **steps, size_t *n) {
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? KILN_OK
                               : kiln_fail_errno(KILN_ERR_IO, "cannot read directory '%s'", dir);
    kiln_err rc = KILN_OK;
    size_t cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        long step = name_step(de->d_name);
        if (step < 0) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            long *s = realloc(*steps, cap * sizeof *s);
            if (!s) {
                rc = kiln_fail(KILN_ERR_NOMEM, "out of memory listing '%s'", dir);
                break;
            }
            *steps = s;
        }
        (*steps)[(*n)++] = step;
    }
    closedir(d);
    if (rc) {
        free(*steps);
        *steps = NULL;
        *n = 0;
        return rc;
    }
    if (*n) qsort(*steps, *n, sizeof **steps, cmp_long);
    return KILN_OK;
}

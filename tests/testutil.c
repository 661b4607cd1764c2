/* testutil.c - fixtures that several tests share (testutil.h). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

void kiln_test_put(const char *dir, const char *rel, const char *text) {
    char *p = kiln_path_join(dir, rel), *d = kiln_dirname(p);
    kiln_mkdir_p(d);
    FILE *f = fopen(p, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    free(d);
    free(p);
}

char *kiln_test_listing(const char *dir) {
    struct dirent **list;
    int n = scandir(dir, &list, NULL, alphasort);
    if (n < 0) return kiln_strdup("?");
    size_t cap = 1;
    for (int i = 0; i < n; i++)
        cap += strlen(list[i]->d_name) + 1;
    char *s = calloc(cap, 1);
    for (int i = 0; i < n; i++) {
        if (s) strcat(strcat(s, list[i]->d_name), "\n");
        free(list[i]);
    }
    free(list);
    return s;
}

bool kiln_test_same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t lx, ly;
    bool ok = !kiln_read_file(a, 1u << 30, &x, &lx) && !kiln_read_file(b, 1u << 30, &y, &ly) &&
              lx == ly && !memcmp(x, y, lx);
    free(x);
    free(y);
    return ok;
}

bool kiln_test_msg_has(const char *a, const char *b) {
    return strstr(kiln_errmsg(), a) != NULL && (!b || strstr(kiln_errmsg(), b) != NULL);
}

bool kiln_test_keypair(kiln_sign_seckey **sk, char b64[KILN_SIGN_PUBKEY_B64]) {
    kiln_sign_pubkey pk;
    if (kiln_sign_seckey_generate(sk) != KILN_OK || kiln_sign_seckey_pubkey(*sk, &pk) != KILN_OK)
        return false;
    kiln_sign_pubkey_base64(&pk, b64);
    return true;
}

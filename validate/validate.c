/*
 * validate.c - kiln validate: every check of docs/validation.md over one candidate model,
 * one report. A check is "passed", "failed" or "not run" (with the reason it could not
 * run, e.g. no GPU); the report passes when no check failed and the required golden check
 * ran. Problems that stop the checks themselves (a model that does not load, data that
 * does not fit) are errors, not failed checks.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels.h"
#include "runtime.h"
#include "validate_int.h"

/* ---- report helpers ------------------------------------------------------------ */

static json_t *tol_json(const kiln_tolerance *t) {
    return json_pack("{s:f,s:f,s:f}", "rtol", t->rtol, "atol", t->atol, "max_outside",
                     t->max_outside);
}

/* Figures of a comparison over [n, S, O] outputs. */
static json_t *cmp_json(const kiln_compare *c, const float *a, const float *b, int S, int O) {
    size_t i = c->worst, win = i / ((size_t)S * O), step = i / (size_t)O % (size_t)S,
           out = i % (size_t)O;
    return json_pack("{s:I,s:f,s:f,s:f,s:f,s:b,s:{s:I,s:I,s:I,s:f,s:f}}", "compared",
                     (json_int_t)c->n, "max_abs_err", c->max_abs, "max_rel_err", c->max_rel,
                     "frac_outside", c->frac_outside, "scale", c->scale, "nonfinite", c->nonfinite,
                     "worst", "window", (json_int_t)win, "step", (json_int_t)step, "output",
                     (json_int_t)out, "got", c->n ? (double)a[i] : 0.0, "want",
                     c->n ? (double)b[i] : 0.0);
}

/* The one-line reason of a failed comparison. */
static char *cmp_reason(const char *what, const kiln_compare *c, const kiln_tolerance *t,
                        const float *a, const float *b, int S, int O) {
    size_t i = c->worst;
    if (c->nonfinite) return kiln_asprintf("%s: non-finite outputs", what);
    return kiln_asprintf("%s: %.3g%% of %zu outputs outside tolerance (allowed %.3g%%), max "
                         "relative error %.3g (rtol %.3g, atol %.3g x max |output| %.3g), worst "
                         "at window %zu step %zu output %zu: %.9g vs %.9g",
                         what, 100 * c->frac_outside, c->n, 100 * t->max_outside, c->max_rel,
                         t->rtol, t->atol, c->scale, i / ((size_t)S * O), i / (size_t)O % (size_t)S,
                         i % (size_t)O, (double)a[i], (double)b[i]);
}

/* The rows of a reference's outputs that a router near-tie may have moved (runtime.h,
 * docs/validation.md "Router ties"): there another engine may rightly route otherwise. */
typedef struct ties {
    uint8_t *reach; /* [rows] */
    size_t near;    /* rows with a near-tie in some layer */
    size_t rows;
} ties;

static void ties_free(ties *t) {
    free(t->reach);
    memset(t, 0, sizeof *t);
}

/* The outputs of windows x [n,S,F] through the runtime's batch forward into y, and the
 * rows a near-tie reaches into *t. */
static kiln_err forward_ties(vmodel *m, const float *x, size_t n, int S,
                             const kiln_thresholds *th, float *y, ties *t) {
    t->rows = n * (size_t)S;
    t->reach = kiln_malloc(t->rows + 1);
    float *mg = kiln_malloc(t->rows * (size_t)m->cfg.n_layers * sizeof *mg + 1);
    kiln_err rc = t->reach && mg ? kiln_vmodel_forward_margins(m, x, n, S, y, mg)
                                 : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!rc) t->near = kiln_runtime_tie_reach(&m->cfg, mg, n, S, th->ties_rtol, t->reach);
    free(mg);
    return rc;
}

typedef struct run {
    json_t *checks;
    json_t *baseline; /* the report's "baseline": which model was validated against */
    int failed, ran;
    char fails[1024]; /* names of failed checks, for the error message */
} run;

/* Add a check; figures and thr are stolen (may be NULL); reason NULL for a pass. */
static kiln_err add_check(run *r, const char *name, const char *status, const char *reason,
                          json_t *figures, json_t *thr) {
    json_t *c =
        json_pack("{s:s,s:o,s:o}", "status", status, "figures", figures ? figures : json_object(),
                  "thresholds", thr ? thr : json_object());
    if (c && reason) json_object_set_new(c, "reason", json_string(reason));
    if (!c || json_object_set_new(r->checks, name, c))
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!strcmp(status, "failed")) {
        r->failed++;
        size_t l = strlen(r->fails);
        snprintf(r->fails + l, sizeof r->fails - l, "%s%s", l ? ", " : "", name);
    }
    if (strcmp(status, "not run")) r->ran++;
    return KILN_OK;
}

/* Compare candidate a with reference b ([count / (S*O), S, O]) and add the check. tz: the
 * reference's near-tie rows, whose differences are excused unless more than ties.max_share
 * of rows are near a tie; NULL for a comparison where ties are no excuse. */
static kiln_err add_compare(run *r, const char *name, const char *what, const float *a,
                            const float *b, size_t count, int S, int O, const kiln_tolerance *t,
                            json_t *extra, const ties *tz, const kiln_thresholds *th) {
    const double share = tz && tz->rows ? (double)tz->near / (double)tz->rows : 0;
    const bool excusable = tz && share <= th->ties_max_share;
    kiln_compare c;
    kiln_compare_f32_excused(a, b, count, t, excusable ? tz->reach : NULL, (size_t)O, &c);
    json_t *f = cmp_json(&c, a, b, S, O);
    if (f && extra) json_object_update(f, extra);
    json_decref(extra);
    if (f && tz)
        json_object_set_new(f, "router_ties",
                            json_pack("{s:I,s:f,s:b,s:I,s:f}", "rows_near_tie", (json_int_t)tz->near,
                                      "share", share, "excusable", excusable, "outputs_excused",
                                      (json_int_t)c.excused, "excused_max_rel", c.excused_max_rel));
    char *why = c.passed ? NULL : cmp_reason(what, &c, t, a, b, S, O);
    if (why && tz && tz->near && !excusable) {
        char *w2 = kiln_asprintf("%s; %.3g%% of rows are near a router tie, more than "
                                 "ties.max_share %.3g%%, so none is excused",
                                 why, 100 * share, 100 * th->ties_max_share);
        free(why);
        why = w2;
    }
    char *note = NULL;
    if (c.excused)
        note = kiln_asprintf("%zu output%s differ%s only where a router near-tie reaches (%zu of "
                             "%zu rows within ties.rtol %g; max relative error there %.3g): "
                             "excused",
                             c.excused, c.excused == 1 ? "" : "s", c.excused == 1 ? "s" : "",
                             tz->near, tz->rows, th->ties_rtol, c.excused_max_rel);
    kiln_err rc = (!f || (!c.passed && !why) || (c.excused && !note))
                      ? kiln_fail(KILN_ERR_NOMEM, "out of memory")
                      : add_check(r, name, c.passed ? "passed" : "failed", why, f, tol_json(t));
    if (rc) json_decref(f);
    if (!rc && note &&
        json_object_set_new(json_object_get(r->checks, name), "note", json_string(note)))
        rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    free(why);
    free(note);
    return rc;
}

/* ---- golden regression ------------------------------------------------------------ */

/* Hold m to its stored golden outputs. */
static kiln_err check_golden(run *r, const char *name, vmodel *m, const kiln_dataset *ds,
                             const kiln_thresholds *th) {
    char *sp = kiln_vmodel_path(m, "golden/golden.safetensors");
    char *jp = kiln_vmodel_path(m, "golden/golden.json");
    kiln_st *st = NULL;
    json_t *gj = NULL;
    float *x = NULL, *t = NULL, *want = NULL, *y = NULL;
    size_t *starts = NULL;
    ties tz = {0};
    char *why = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !sp || !jp, KILN_ERR_NOMEM, "out of memory");
    if (!kiln_path_exists(sp) || !kiln_path_exists(jp)) {
        why = kiln_asprintf("%s: no golden set in '%s/golden' (make one: kiln golden make)", name,
                            m->dir);
        KILN_CHECK_IF(rc, out, !why, KILN_ERR_NOMEM, "out of memory");
        rc = add_check(r, name, "failed", why, NULL, NULL);
        goto out;
    }
    KILN_CHECK(rc, out, kiln_st_open(sp, &st));
    KILN_CHECK(rc, out, kiln_json_load_file(jp, &gj));
    /* What golden make writes, typed: a field of the wrong type must not quietly turn a
     * check below off (a non-string data_sha256 would skip the inputs-are-the-data check). */
    const char *gfmt = json_string_value(json_object_get(gj, "format"));
    KILN_CHECK_IF(rc, out, !json_is_object(gj) || !gfmt || strcmp(gfmt, KILN_GOLDEN_FORMAT),
                  KILN_ERR_FORMAT, "'%s': \"format\" must be \"%s\"", jp, KILN_GOLDEN_FORMAT);
    static const char *const digests[] = {"data_sha256", "model_sha256"};
    for (size_t k = 0; k < KILN_ARRAY_LEN(digests); k++)
        KILN_CHECK_IF(rc, out, !json_is_string(json_object_get(gj, digests[k])), KILN_ERR_FORMAT,
                      "'%s': \"%s\" is missing or not a string", jp, digests[k]);
    KILN_CHECK_IF(
        rc, out, !json_is_array(json_object_get(json_object_get(gj, "windows_chosen"), "starts")),
        KILN_ERR_FORMAT, "'%s': \"windows_chosen\".\"starts\" is missing or not an array", jp);
    const int S = m->cfg.seq_len, F = m->cfg.n_features, O = m->cfg.n_outputs;
    const kiln_tensor *ti, *tt, *to;
    const int64_t sx[3] = {-1, S, F}, sy[3] = {-1, S, O};
    KILN_CHECK(rc, out, kiln_st_expect(st, "inputs", KILN_F32, 3, sx, &ti));
    const int64_t N = ti->shape[0];
    const int64_t sy2[3] = {N, S, O};
    KILN_CHECK(rc, out, kiln_st_expect(st, "targets", KILN_F32, 3, sy2, &tt));
    KILN_CHECK(rc, out, kiln_st_expect(st, "outputs", KILN_F32, 3, sy2, &to));
    (void)sy;
    KILN_CHECK_IF(rc, out, N < 1, KILN_ERR_FORMAT, "'%s': no windows", sp);
    const size_t nx = (size_t)N * S * F, ny = (size_t)N * S * O;
    x = kiln_malloc(nx * sizeof *x);
    t = kiln_malloc(ny * sizeof *t);
    want = kiln_malloc(ny * sizeof *want);
    y = kiln_malloc(ny * sizeof *y);
    KILN_CHECK_IF(rc, out, !x || !t || !want || !y, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_tensor_to_f32(ti, x));
    KILN_CHECK(rc, out, kiln_tensor_to_f32(tt, t));
    KILN_CHECK(rc, out, kiln_tensor_to_f32(to, want));
    KILN_CHECK(rc, out, forward_ties(m, x, (size_t)N, S, th, y, &tz));

    /* Where the golden set was drawn from this very data, its inputs must be those rows. */
    const char *gds = json_string_value(json_object_get(gj, "data_sha256"));
    const char *gms = json_string_value(json_object_get(gj, "model_sha256"));
    const json_t *js = json_object_get(json_object_get(gj, "windows_chosen"), "starts");
    json_t *extra = json_pack("{s:I,s:b,s:b,s:f,s:f}", "windows", (json_int_t)N,
                              "made_from_this_model_file", gms && !strcmp(gms, m->sha256),
                              "made_from_this_data", gds && !strcmp(gds, ds->sha256), "loss_mean",
                              kiln_vmse(y, t, ny), "stored_loss_mean", kiln_vmse(want, t, ny));
    KILN_CHECK_IF(rc, out, !extra, KILN_ERR_NOMEM, "out of memory");
    if (gds && !strcmp(gds, ds->sha256) && json_is_array(js) && json_array_size(js) == (size_t)N) {
        starts = kiln_calloc((size_t)N, sizeof *starts);
        float *dx = kiln_malloc(nx * sizeof *dx), *dt = kiln_malloc(ny * sizeof *dt);
        bool same = starts && dx && dt;
        for (size_t k = 0; same && k < (size_t)N; k++) {
            json_int_t s = json_integer_value(json_array_get(js, k));
            same = json_is_integer(json_array_get(js, k)) && s >= 0 &&
                   (size_t)s + (size_t)S <= ds->rows;
            if (same) starts[k] = (size_t)s;
        }
        if (same) {
            kiln_vgather(ds, starts, (size_t)N, S, dx, dt);
            same = !memcmp(dx, x, nx * sizeof *x) && !memcmp(dt, t, ny * sizeof *t);
        }
        free(dx);
        free(dt);
        json_object_set_new(extra, "inputs_match_data", json_boolean(same));
        if (!same) {
            json_decref(extra);
            why = kiln_asprintf("%s: the stored inputs or targets of '%s' are not the rows of "
                                "'%s' that golden.json names",
                                name, sp, ds->path);
            KILN_CHECK_IF(rc, out, !why, KILN_ERR_NOMEM, "out of memory");
            rc = add_check(r, name, "failed", why, NULL, NULL);
            goto out;
        }
    }
    const kiln_tolerance *tol = m->bf16 ? &th->golden_bf16 : &th->golden;
    char what[128];
    snprintf(what, sizeof what, "%s (%s model vs its stored outputs)", name,
             m->bf16 ? "bf16" : "f32");
    const char *gnum = json_string_value(json_object_get(gj, "numerics"));
    if (json_object_set_new(extra, "numerics", gnum ? json_string(gnum) : json_null()) ||
        json_object_set_new(extra, "numerics_here", json_string(KILN_NUMERICS_CPU))) {
        json_decref(extra);
        KILN_CHECK_IF(rc, out, true, KILN_ERR_NOMEM, "out of memory");
    }
    rc = add_compare(r, name, what, y, want, ny, S, O, tol, extra, &tz, th);
    /* Golden outputs computed with other numerics (before kiln-gemm/1, the host's OpenBLAS
     * kernel) may differ from this build's in the last bits on any host: say so beside the
     * result, so that a difference is read as what it is. */
    if (!rc && (!gnum || strcmp(gnum, KILN_NUMERICS_CPU))) {
        json_t *ck = json_object_get(r->checks, name);
        const char *prev = json_string_value(json_object_get(ck, "note"));
        char *note = kiln_asprintf(
            "%s%sthe golden outputs were computed with %s%s, this build with %s: the two can "
            "differ in the last bits on any host (results with the same numerics are the "
            "same bits on every x86-64 CPU with AVX2 and FMA)",
            prev ? prev : "", prev ? "; " : "", gnum ? "numerics " : "",
            gnum ? gnum : "the host's OpenBLAS kernel (made before kiln-gemm/1)",
            KILN_NUMERICS_CPU);
        KILN_CHECK_IF(rc, out, !note || json_object_set_new(ck, "note", json_string(note)),
                      KILN_ERR_NOMEM, "out of memory");
        free(note);
    }
out:
    if (rc && rc != KILN_ERR_NOMEM) kiln_errprefix(rc, "%s: ", name);
    ties_free(&tz);
    free(why);
    free(starts);
    free(x);
    free(t);
    free(want);
    free(y);
    json_decref(gj);
    kiln_st_close(st);
    free(sp);
    free(jp);
    return rc;
}

/* ---- held-out windows ------------------------------------------------------------- */

typedef struct heldout {
    size_t n;
    size_t *starts;
    float *x, *t; /* [n,S,F], [n,S,O] */
    float *y;     /* the candidate's outputs */
    ties tz;      /* where a router near-tie may have moved y */
    double loss;
} heldout;

static void heldout_free(heldout *h) {
    ties_free(&h->tz);
    free(h->starts);
    free(h->x);
    free(h->t);
    free(h->y);
    memset(h, 0, sizeof *h);
}

/* Up to cap non-overlapping windows spread evenly over the validation split, as the
 * trainer's validation picks them, so that the loss here is the run's val_loss. */
static kiln_err heldout_make(const kiln_dataset *ds, const kiln_split *sp, int S, int F, int O,
                             size_t cap, heldout *h) {
    memset(h, 0, sizeof *h);
    h->starts = kiln_calloc(cap ? cap : 1, sizeof *h->starts);
    if (!h->starts) return KILN_ERR_NOMEM;
    h->n = kiln_split_val_windows(sp, S, cap, h->starts);
    KILN_FAIL_IF(!h->n, KILN_ERR_USAGE, "'%s': the validation split holds no window of %d rows",
                 ds->path, S);
    h->x = kiln_malloc(h->n * S * F * sizeof(float));
    h->t = kiln_malloc(h->n * S * O * sizeof(float));
    h->y = kiln_malloc(h->n * S * O * sizeof(float));
    if (!h->starts || !h->x || !h->t || !h->y) {
        heldout_free(h);
        return KILN_ERR_NOMEM;
    }
    kiln_vgather(ds, h->starts, h->n, S, h->x, h->t);
    return KILN_OK;
}

/* ---- bf16 ------------------------------------------------------------------------- */

/* Write the candidate's weights rounded to bf16 (norm.in_* kept F32, as kiln export does)
 * into a fresh model file under dir. */
static kiln_err write_bf16(vmodel *m, const char *path) {
    size_t np;
    const kiln_param *tab = kiln_tsmoe_param_table(m->net, &np);
    const float *w = kiln_tsmoe_params(m->net);
    size_t total = kiln_tsmoe_numel(m->net);
    uint16_t *h = kiln_malloc((total ? total : 1) * sizeof *h);
    if (!h) return KILN_ERR_NOMEM;
    for (size_t i = 0; i < total; i++)
        h[i] = kiln_f32_to_bf16(w[i]);
    kiln_st_writer *wr = NULL;
    char *ct = kiln_model_config_text(&m->cfg);
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !ct, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_st_writer_new(&wr));
    for (size_t i = 0; i < np; i++) {
        const kiln_param *p = &tab[i];
        bool half = p->flags & KILN_PARAM_TRAINED;
        KILN_CHECK(rc, out,
                   kiln_st_writer_add(wr, p->name, half ? KILN_BF16 : KILN_F32, p->ndim, p->shape,
                                      half ? (const void *)(h + p->offset)
                                           : (const void *)(w + p->offset)));
    }
    KILN_CHECK(rc, out, kiln_st_writer_meta(wr, "kiln.config", ct));
    rc = kiln_st_writer_write(wr, path);
out:
    kiln_st_writer_free(wr);
    free(ct);
    free(h);
    return rc;
}

static bool same_config(const kiln_model_config *a, const kiln_model_config *b) {
    return a->n_features == b->n_features && a->n_outputs == b->n_outputs &&
           a->d_model == b->d_model && a->n_layers == b->n_layers && a->n_heads == b->n_heads &&
           a->d_ff == b->d_ff && a->n_experts == b->n_experts && a->top_k == b->top_k &&
           a->seq_len == b->seq_len && a->attn_window == b->attn_window &&
           a->norm_eps == b->norm_eps;
}

static kiln_err check_bf16(run *r, const kiln_validate_opts *o, vmodel *m, const heldout *h,
                           const kiln_thresholds *th) {
    const char *name = "parity_f32_bf16";
    if (o->no_bf16) return add_check(r, name, "not run", "skipped by --no-bf16", NULL, NULL);
    if (m->bf16) return add_check(r, name, "not run", "the model is bf16 already", NULL, NULL);
    vmodel b;
    char *path = NULL;
    const char *src = o->bf16;
    bool made = false;
    kiln_err rc = KILN_OK;
    if (!src) {
        const char *td = getenv("TMPDIR");
        char *dir = kiln_asprintf("%s/kiln-bf16-XXXXXX", td && *td ? td : "/tmp");
        if (!dir) return KILN_ERR_NOMEM;
        if (!mkdtemp(dir)) {
            rc = kiln_fail_errno(KILN_ERR_IO, "'%s': cannot create a temporary directory", dir);
            free(dir);
            return rc;
        }
        path = kiln_path_join(dir, "model.safetensors");
        rc = path ? write_bf16(m, path) : KILN_ERR_NOMEM;
        if (!rc) rc = kiln_vmodel_open(path, &b);
        if (path) unlink(path);
        rmdir(dir);
        free(dir);
        free(path);
        if (rc) return rc;
        made = true;
    } else {
        KILN_TRY(kiln_vmodel_open(src, &b));
    }
    const int S = m->cfg.seq_len, O = m->cfg.n_outputs;
    float *y = NULL;
    char *why = NULL;
    if (!same_config(&b.cfg, &m->cfg)) {
        why = kiln_asprintf("%s: '%s' has another config than '%s'", name, b.file, m->file);
        rc = why ? add_check(r, name, "failed", why, NULL, NULL) : KILN_ERR_NOMEM;
        goto out;
    }
    if (!b.bf16) {
        why = kiln_asprintf("%s: '%s' holds no bf16 weights", name, b.file);
        rc = why ? add_check(r, name, "failed", why, NULL, NULL) : KILN_ERR_NOMEM;
        goto out;
    }
    y = kiln_malloc(h->n * S * O * sizeof *y);
    KILN_CHECK_IF(rc, out, !y, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_vmodel_forward(&b, h->x, h->n, S, y));
    json_t *extra = json_pack("{s:s,s:f,s:f}", "bf16_model", made ? "rounded in memory" : b.file,
                              "loss", kiln_vmse(y, h->t, h->n * S * O), "f32_loss", h->loss);
    rc = add_compare(r, name, "parity_f32_bf16 (bf16 export vs f32 model)", y, h->y, h->n * S * O,
                     S, O, &th->bf16, extra, NULL, th);
out:
    free(why);
    free(y);
    kiln_vmodel_close(&b);
    return rc;
}

/* ---- runtime parity ------------------------------------------------------------- */

/* The trainer's forward (the reference, docs/model.md) against the runtime's batch forward, and
 * the runtime's batch forward against its streams, on the held-out windows. */
static kiln_err check_parity(run *r, vmodel *m, const heldout *h, const kiln_thresholds *th) {
    const int S = m->cfg.seq_len, O = m->cfg.n_outputs;
    const size_t ny = h->n * S * O;
    float *y = kiln_malloc(ny * sizeof *y);
    if (!y) return KILN_ERR_NOMEM;
    kiln_err rc = kiln_vmodel_trainer_forward(m, h->x, h->n, y);
    if (!rc)
        rc = add_compare(r, "parity_trainer_runtime",
                         "parity_trainer_runtime (runtime batch vs trainer forward)", h->y, y, ny,
                         S, O, &th->parity, json_pack("{s:I}", "windows", (json_int_t)h->n),
                         &h->tz, th);
    if (!rc) rc = kiln_vmodel_stream_forward(m, h->x, h->n, S, y);
    if (!rc)
        rc = add_compare(r, "parity_batch_stream",
                         "parity_batch_stream (runtime stream vs runtime batch)", y, h->y, ny, S, O,
                         &th->stream, json_pack("{s:I}", "windows", (json_int_t)h->n), &h->tz,
                         th);
    free(y);
    return rc;
}

/* ---- the run ---------------------------------------------------------------------- */

/* The CUDA network (f32, kiln_tsmoe_cuda) on the held-out windows against the runtime's batch
 * forward (what services run), with the cuda.* tolerance. Without a GPU: "not run". */
static kiln_err check_cuda(run *r, vmodel *m, const heldout *h, const kiln_thresholds *th) {
    const char *name = "parity_cpu_cuda";
#ifdef KILN_HAVE_CUDA
    int ndev = kiln_cuda_device_count();
    if (ndev == 0) return add_check(r, name, "not run", "no GPU", NULL, NULL);
    const int S = m->cfg.seq_len, F = m->cfg.n_features, O = m->cfg.n_outputs;
    const size_t ny = h->n * S * O;
    kiln_tsmoe_cuda *g = NULL;
    kiln_cuda_opts co = {0, KILN_PRECISION_F32};
    float *y = kiln_malloc(ny * sizeof *y);
    kiln_err rc = y ? KILN_OK : KILN_ERR_NOMEM;
    if (!rc) rc = kiln_tsmoe_cuda_create(&m->cfg, VBATCH, &co, &g);
    if (!rc) rc = kiln_tsmoe_cuda_upload_params(g, kiln_tsmoe_params(m->net));
    for (size_t w = 0; !rc && w < h->n; w += VBATCH) {
        int n = (int)(h->n - w < VBATCH ? h->n - w : VBATCH);
        rc = kiln_tsmoe_cuda_forward(g, h->x + w * S * F, NULL, n, NULL, NULL);
        if (!rc) rc = kiln_tsmoe_cuda_outputs(g, y + w * S * O);
    }
    kiln_tsmoe_cuda_free(g);
    if (!rc)
        rc = add_compare(r, name, "parity_cpu_cuda (CUDA network f32 vs runtime batch)", y, h->y,
                         ny, S, O, &th->cuda,
                         json_pack("{s:I,s:s,s:i}", "windows", (json_int_t)h->n, "engine",
                                   "kiln_tsmoe_cuda f32, device 0", "devices", ndev),
                         &h->tz, th);
    else
        kiln_errprefix(rc, "%s: ", name);
    free(y);
    return rc;
#else
    (void)m, (void)h, (void)th;
    return add_check(r, name, "not run", "no GPU (built without CUDA)", NULL, NULL);
#endif
}

static json_t *str_or_null(const char *s) {
    return s ? json_string(s) : json_null();
}

/* ---- parity with a research framework ------------------------------------------------ */

/* The runtime's batch forward on the inputs of the model's golden set against REF's
 * "outputs" [W,S,O], what a research framework (kiln.torch) computed on the same inputs
 * (kiln.torch writes kiln.inputs_sha256, the digest of the inputs it read: a REF made on
 * another golden set fails, naming that). A REF that is not such a file is an error. */
static kiln_err check_reference(run *r, const kiln_validate_opts *o, vmodel *m,
                                const kiln_thresholds *th) {
    const char *name = "parity_reference";
    if (!o->reference) return add_check(r, name, "not run", "no --reference", NULL, NULL);
    char *gp = kiln_vmodel_path(m, "golden/golden.safetensors"), *why = NULL;
    kiln_st *gs = NULL, *rs = NULL;
    float *x = NULL, *y = NULL, *want = NULL;
    ties tz = {0};
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !gp, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_st_open(o->reference, &rs));
    if (!kiln_path_exists(gp)) {
        why = kiln_asprintf("%s: no golden set in '%s/golden', whose inputs '%s' must be the "
                            "outputs of (make one: kiln golden make)",
                            name, m->dir, o->reference);
        rc = why ? add_check(r, name, "failed", why, NULL, NULL) : KILN_ERR_NOMEM;
        goto out;
    }
    KILN_CHECK(rc, out, kiln_st_open(gp, &gs));
    const int S = m->cfg.seq_len, F = m->cfg.n_features, O = m->cfg.n_outputs;
    const kiln_tensor *ti, *to;
    const int64_t sx[3] = {-1, S, F};
    KILN_CHECK(rc, out, kiln_st_expect(gs, "inputs", KILN_F32, 3, sx, &ti));
    const int64_t N = ti->shape[0], sy[3] = {N, S, O};
    KILN_CHECK(rc, out, kiln_st_expect(rs, "outputs", KILN_F32, 3, sy, &to));
    KILN_CHECK_IF(rc, out, N < 1, KILN_ERR_FORMAT, "'%s': no windows", gp);
    uint8_t d[KILN_SHA256_BYTES];
    char hex[KILN_SHA256_HEX];
    kiln_sha256(ti->data, ti->nbytes, d);
    kiln_hex(d, sizeof d, hex);
    const char *ih = kiln_st_meta(rs, "kiln.inputs_sha256");
    if (ih && strcmp(ih, hex)) {
        why = kiln_asprintf("%s: '%s' was computed on other inputs than those of '%s' (its "
                            "kiln.inputs_sha256 is %.12s..., the golden inputs' %.12s...)",
                            name, o->reference, gp, ih, hex);
        rc = why ? add_check(r, name, "failed", why, NULL, NULL) : KILN_ERR_NOMEM;
        goto out;
    }
    const size_t nx = (size_t)N * S * F, ny = (size_t)N * S * O;
    x = kiln_malloc(nx * sizeof *x);
    y = kiln_malloc(ny * sizeof *y);
    want = kiln_malloc(ny * sizeof *want);
    KILN_CHECK_IF(rc, out, !x || !y || !want, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_tensor_to_f32(ti, x));
    KILN_CHECK(rc, out, kiln_tensor_to_f32(to, want));
    KILN_CHECK(rc, out, forward_ties(m, x, (size_t)N, S, th, y, &tz));
    uint8_t rd[KILN_SHA256_BYTES];
    char rhex[KILN_SHA256_HEX];
    KILN_CHECK(rc, out, kiln_sha256_file(o->reference, rd));
    kiln_hex(rd, sizeof rd, rhex);
    const char *eng = kiln_st_meta(rs, "kiln.engine");
    json_t *extra = json_pack("{s:I,s:s,s:s,s:o,s:b}", "windows", (json_int_t)N, "reference",
                              o->reference, "reference_sha256", rhex, "engine",
                              str_or_null(eng), "inputs_digest_checked", ih != NULL);
    KILN_CHECK_IF(rc, out, !extra, KILN_ERR_NOMEM, "out of memory");
    rc = add_compare(r, name, "parity_reference (runtime batch vs the reference's outputs)", y,
                     want, ny, S, O, &th->reference, extra, &tz, th);
out:
    if (rc && rc != KILN_ERR_NOMEM) kiln_errprefix(rc, "%s: ", name);
    ties_free(&tz);
    free(why);
    free(x);
    free(y);
    free(want);
    kiln_st_close(gs);
    kiln_st_close(rs);
    free(gp);
    return rc;
}

/* What a baseline's directory says of itself: its manifest.json (a pulled or unpacked model
 * has one), when that lists the model.safetensors measured (b->sha256). The name, version and
 * the manifest's sha256 go into *name, *version (caller frees) and hex; false when there is
 * no such manifest, which is no error: a baseline made by hand has none. */
static bool baseline_manifest(const vmodel *b, char **name, char **version,
                              char hex[KILN_SHA256_HEX]) {
    *name = *version = NULL;
    char *path = kiln_vmodel_path(b, "manifest.json"), *text = NULL;
    size_t len = 0;
    json_t *j = NULL;
    bool ok = path && kiln_path_exists(path) &&
              kiln_read_file(path, 16u << 20, &text, &len) == KILN_OK &&
              kiln_json_parse(text, len, path, &j) == KILN_OK;
    const char *n = json_string_value(json_object_get(j, "name")),
               *v = json_string_value(json_object_get(j, "version"));
    bool lists = false;
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(j, "files"), i, f) {
        const char *p = json_string_value(json_object_get(f, "path")),
                   *h = json_string_value(json_object_get(f, "sha256"));
        if (p && h && !strcmp(p, "model.safetensors") && !strcmp(h, b->sha256)) lists = true;
    }
    ok = ok && n && v && lists;
    if (ok) {
        uint8_t d[KILN_SHA256_BYTES];
        kiln_sha256(text, len, d);
        kiln_hex(d, sizeof d, hex);
        *name = kiln_strdup(n);
        *version = kiln_strdup(v);
        ok = *name && *version;
    }
    if (!ok) {
        free(*name), free(*version);
        *name = *version = NULL;
    }
    kiln_errclear();
    json_decref(j);
    free(text);
    free(path);
    return ok;
}

/* The report's "baseline": {name, version, digest, channel, seq, manifest_sha256,
 * model_sha256}, null where unknown (docs/validation.md). */
static json_t *baseline_json(const kiln_validate_opts *o, const vmodel *b) {
    const kiln_validate_baseline_ref *ref = o->baseline_ref;
    char *name = NULL, *version = NULL, hex[KILN_SHA256_HEX];
    bool man = baseline_manifest(b, &name, &version, hex);
    json_t *j = json_pack(
        "{s:o,s:o,s:o,s:o,s:o,s:o,s:s}", "name", str_or_null(ref && ref->name ? ref->name : name),
        "version", str_or_null(ref && ref->version ? ref->version : version), "digest",
        str_or_null(ref ? ref->digest : NULL), "channel", str_or_null(ref ? ref->channel : NULL),
        "seq", ref && ref->seq > 0 ? json_integer(ref->seq) : json_null(), "manifest_sha256",
        str_or_null(man ? hex : NULL), "model_sha256", b->sha256);
    free(name);
    free(version);
    return j;
}

static kiln_err check_baseline(run *r, const kiln_validate_opts *o, const vmodel *m,
                               const heldout *h, const kiln_dataset *ds,
                               const kiln_thresholds *th) {
    if (!o->baseline) {
        KILN_TRY(add_check(r, "baseline_golden", "not run", "no --baseline", NULL, NULL));
        return add_check(r, "baseline_loss", "not run", "no --baseline", NULL, NULL);
    }
    vmodel b;
    KILN_TRY(kiln_vmodel_open(o->baseline, &b));
    kiln_err rc = KILN_OK;
    if (!(r->baseline = baseline_json(o, &b))) rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!rc) rc = kiln_vmodel_check_data(&b, ds);
    float *y = NULL;
    char *why = NULL;
    if (!rc) rc = check_golden(r, "baseline_golden", &b, ds, th);
    if (rc) goto out;
    /* The candidate's windows: the runtime takes any length, so a baseline trained with
     * another seq_len is measured on the same rows. */
    const int S = m->cfg.seq_len, O = m->cfg.n_outputs;
    y = kiln_malloc(h->n * S * O * sizeof *y);
    KILN_CHECK_IF(rc, out, !y, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_vmodel_forward(&b, h->x, h->n, S, y));
    const double bl = kiln_vmse(y, h->t, h->n * S * O);
    const double limit = bl * (1 + th->baseline_rel) + th->baseline_abs;
    const bool ok = h->loss <= limit;
    json_t *f = json_pack("{s:f,s:f,s:f,s:I,s:s}", "loss", h->loss, "baseline_loss", bl, "limit",
                          limit, "windows", (json_int_t)h->n, "baseline_sha256", b.sha256);
    json_t *t =
        json_pack("{s:f,s:f}", "rel_margin", th->baseline_rel, "abs_margin", th->baseline_abs);
    if (!ok)
        why = kiln_asprintf("baseline_loss: held-out loss %.6g is worse than the baseline's %.6g "
                            "by more than the margin (limit %.6g = baseline x (1 + %g) + %g)",
                            h->loss, bl, limit, th->baseline_rel, th->baseline_abs);
    if (!f || !t || (!ok && !why)) {
        json_decref(f);
        json_decref(t);
        rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    } else {
        rc = add_check(r, "baseline_loss", ok ? "passed" : "failed", why, f, t);
    }
out:
    free(why);
    free(y);
    kiln_vmodel_close(&b);
    return rc;
}

kiln_err kiln_validate_run(const kiln_validate_opts *o, json_t **report_out) {
    if (report_out) *report_out = NULL;
    KILN_FAIL_IF(!o || !o->model || !o->data, KILN_ERR_USAGE, "validate needs a model and data");
    kiln_thresholds defth;
    kiln_thresholds_default(&defth);
    const kiln_thresholds *th = o->thresholds ? o->thresholds : &defth;
    vmodel m;
    KILN_TRY(kiln_vmodel_open(o->model, &m));
    kiln_dataset *ds = NULL;
    heldout h = {0};
    kiln_split sp = {0};
    run r = {0};
    json_t *rep = NULL;
    char *rpath = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !(r.checks = json_object()), KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_dataset_open(o->data, &ds));
    KILN_CHECK(rc, out, kiln_vmodel_check_data(&m, ds));
    const int S = m.cfg.seq_len, F = m.cfg.n_features, O = m.cfg.n_outputs;
    const double vf = o->val_fraction >= 0 ? o->val_fraction : kiln_vmodel_val_fraction(&m);
    KILN_CHECK(rc, out, kiln_vmodel_split(&m, ds, vf, &sp));
    KILN_CHECK(rc, out, heldout_make(ds, &sp, S, F, O, (size_t)th->heldout_windows, &h));
    KILN_CHECK(rc, out, forward_ties(&m, h.x, h.n, S, th, h.y, &h.tz));
    h.loss = kiln_vmse(h.y, h.t, h.n * S * O);

    KILN_CHECK(rc, out, check_golden(&r, "golden", &m, ds, th));
    KILN_CHECK(rc, out, check_baseline(&r, o, &m, &h, ds, th));
    KILN_CHECK(rc, out, check_parity(&r, &m, &h, th));
    KILN_CHECK(rc, out, check_bf16(&r, o, &m, &h, th));
    KILN_CHECK(rc, out, check_cuda(&r, &m, &h, th));
    KILN_CHECK(rc, out, check_reference(&r, o, &m, th));

    /* The run's own figure on the same windows, for a reader to compare (an f32 export of
     * the checkpoint it validated at gives the same number to rounding). The trainer's
     * losses are of standardised targets (lineage.target_norm, which export folded into the
     * head): the held-out loss is given in those units too, as loss_standardised. */
    json_t *card_val =
        json_object_get(json_object_get(json_object_get(m.card, "lineage"), "metrics"), "val_loss");
    if (!json_is_number(card_val)) card_val = NULL;
    const json_t *tstd =
        json_object_get(json_object_get(json_object_get(m.card, "lineage"), "target_norm"), "std");
    double loss_std = NAN;
    if (json_array_size(tstd) == (size_t)O) {
        double sum = 0;
        for (size_t k = 0; k < h.n * (size_t)S * (size_t)O; k++) {
            double sd = json_number_value(json_array_get(tstd, k % (size_t)O));
            double d = sd > 0 ? ((double)h.y[k] - h.t[k]) / sd : NAN;
            sum += d * d;
        }
        loss_std = sum / (double)(h.n * (size_t)S * (size_t)O);
    }
    json_t *spj = kiln_vsplit_json(&sp);
    if (spj && json_object_set_new(spj, "val_fraction", json_real(vf))) {
        json_decref(spj);
        spj = NULL;
    }
    KILN_CHECK_IF(rc, out, !spj, KILN_ERR_NOMEM, "out of memory");
    json_t *golden = json_object_get(r.checks, "golden");
    const bool passed = r.failed == 0 && golden &&
                        !strcmp(json_string_value(json_object_get(golden, "status")), "passed");
    rep = json_pack(
        "{s:s,s:s,s:{s:s,s:s,s:s,s:O},s:{s:s,s:s,s:I},s:o,"
        "s:{s:I,s:f,s:O},s:o,s:O,s:O,s:b}",
        "format", KILN_VALIDATION_FORMAT, "kiln_version", kiln_version(), "model", "path", m.file,
        "sha256", m.sha256, "dtype", m.bf16 ? "bf16" : "f32", "config",
        json_object_get(m.card, "config") ? json_object_get(m.card, "config") : json_null(), "data",
        "path", ds->path, "sha256", ds->sha256, "rows", (json_int_t)ds->rows, "split", spj,
        "heldout", "windows",
        (json_int_t)h.n, "loss", h.loss, "card_val_loss", card_val ? card_val : json_null(),
        "thresholds", kiln_thresholds_json(th), "checks", r.checks, "baseline",
        r.baseline ? r.baseline : json_null(), "passed", passed);
    KILN_CHECK_IF(rc, out, !rep, KILN_ERR_NOMEM, "out of memory");
    if (isfinite(loss_std))
        json_object_set_new(json_object_get(rep, "heldout"), "loss_standardised",
                            json_real(loss_std));
    if (!o->report || *o->report) {
        rpath = o->report ? kiln_strdup(o->report) : kiln_vmodel_path(&m, "validation.json");
        KILN_CHECK_IF(rc, out, !rpath, KILN_ERR_NOMEM, "out of memory");
        KILN_CHECK(rc, out, kiln_json_write_file(rpath, rep));
        /* Where it went, for the caller only: the file itself does not name its path. */
        if (report_out) json_object_set_new(rep, "report", json_string(rpath));
    }
    if (!passed) {
        if (r.failed)
            rc = kiln_fail(KILN_ERR_VERIFY, "'%s': %d check%s failed: %s", m.file, r.failed,
                           r.failed == 1 ? "" : "s", r.fails);
        else
            rc = kiln_fail(KILN_ERR_VERIFY, "'%s': the golden check did not run", m.file);
    }
    if (report_out) {
        *report_out = rep;
        rep = NULL;
    }
out:
    json_decref(rep);
    json_decref(r.checks);
    json_decref(r.baseline);
    free(rpath);
    heldout_free(&h);
    kiln_split_release(&sp);
    kiln_dataset_free(ds);
    kiln_vmodel_close(&m);
    return rc;
}

/* infer.c - whole-file inference: a dataset's features in, an outputs file out. */
#include <stdlib.h>
#include <string.h>

#include "runtime.h"
#include "runtime_int.h"

static kiln_err run_stream(const kiln_model *m, const float *x, size_t N, float *y) {
    kiln_stream *s;
    KILN_TRY(kiln_stream_open(m, &s));
    const size_t F = (size_t)m->cfg.n_features, O = (size_t)m->cfg.n_outputs;
    kiln_err rc = KILN_OK;
    for (size_t t = 0; t < N && rc == KILN_OK; t++)
        rc = kiln_stream_push(s, x + t * F, y + t * O);
    kiln_stream_free(s);
    return rc;
}

kiln_err kiln_runtime_infer_file(const char *model_path, const char *input_path,
                                 const char *out_path, bool stream, int device, size_t *rows) {
    kiln_model *m = NULL;
    kiln_st *in = NULL;
    kiln_st_writer *w = NULL;
    float *x = NULL, *y = NULL;
    kiln_err rc;
    const kiln_model_opts mo = {device};
    KILN_CHECK(rc, out, kiln_model_open_opts(model_path, &mo, &m));
    KILN_CHECK(rc, out, kiln_st_open(input_path, &in));
    const kiln_tensor *t = kiln_st_find(in, "features");
    KILN_CHECK_IF(rc, out, !t, KILN_ERR_FORMAT, "'%s': tensor 'features' is missing", input_path);
    KILN_CHECK_IF(rc, out, t->dtype != KILN_F32, KILN_ERR_FORMAT,
                  "'%s': tensor 'features' is %s, expected F32", input_path,
                  kiln_dtype_name(t->dtype));
    KILN_CHECK_IF(rc, out, t->ndim != 2 || t->shape[1] != m->cfg.n_features, KILN_ERR_FORMAT,
                  "'%s': tensor 'features' must be [N,%d] (the model's n_features), not %d-D with "
                  "%lld columns",
                  input_path, m->cfg.n_features, t->ndim,
                  t->ndim ? (long long)t->shape[t->ndim - 1] : 0LL);
    const size_t N = (size_t)t->shape[0], O = (size_t)m->cfg.n_outputs;
    KILN_CHECK_IF(rc, out, N == 0, KILN_ERR_FORMAT, "'%s': tensor 'features' has no rows",
                  input_path);
    KILN_CHECK_IF(rc, out, N > (size_t)1 << 30, KILN_ERR_LIMIT,
                  "'%s': %zu rows is more than one sequence may hold", input_path, N);
    /* Before the run: --out naming the dataset itself, or any file that is not an earlier
     * outputs file, is refused rather than replaced. */
    static const char *const outputs[] = {"outputs", NULL};
    KILN_CHECK(rc, out,
               kiln_st_out_ok(out_path, outputs, "an outputs file (safetensors with 'outputs')"));
    x = kiln_malloc(t->numel * sizeof *x);
    y = kiln_malloc(N * O * sizeof *y);
    KILN_CHECK_IF(rc, out, !x || !y, KILN_ERR_NOMEM, "out of memory for %zu rows", N);
    KILN_CHECK(rc, out, kiln_tensor_to_f32(t, x));
    rc = stream ? run_stream(m, x, N, y) : kiln_model_forward(m, x, 1, (int)N, y);
    if (rc != KILN_OK) {
        kiln_errprefix(rc, "'%s': ", input_path);
        goto out;
    }
    KILN_CHECK(rc, out, kiln_st_writer_new(&w));
    KILN_CHECK(rc, out,
               kiln_st_writer_add(w, "outputs", KILN_F32, 2,
                                  (const int64_t[]){(int64_t)N, (int64_t)O}, y));
    KILN_CHECK(rc, out, kiln_st_writer_meta(w, "kiln.infer.mode", stream ? "stream" : "batch"));
    KILN_CHECK(rc, out, kiln_st_writer_write(w, out_path));
    if (rows) *rows = N;
out:
    kiln_st_writer_free(w);
    free(x);
    free(y);
    kiln_st_close(in);
    kiln_model_free(m);
    return rc;
}

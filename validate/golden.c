/*
 * golden.c - kiln golden make: a model's outputs on windows of held-out data, stored so
 * that a later build, machine or export can be held to them. The windows come from the
 * split the trainer validated on (kiln_vmodel_split: the run's val_fraction, val_from and
 * purge, every instrument of grouped data split alike), chosen by Philox
 * (KILN_STREAM_GOLDEN) so that the seed alone reproduces them.
 * The outputs are the runtime's (what a service computes); validate holds the trainer's
 * forward and the stream to them separately (parity).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels.h"
#include "validate_int.h"

/* Windows of S rows that start and end inside r's validation rows. */
static uint64_t windows_in(const kiln_split_range *r, int S) {
    size_t len = r->val_end - r->val_begin;
    return len >= (size_t)S ? len - (size_t)S + 1 : 0;
}

/* Draw n window starts from the validation ranges of sp, windows of S rows that stay inside
 * one range (one instrument): distinct while the split has enough of them, else with
 * repeats. The windows that fit are counted range after range, so that with one range a
 * draw x is the start val_begin + x. starts [n]; fit, the windows that fit, is at least 1. */
static void draw_starts(const kiln_split *sp, int S, uint64_t seed, size_t n, size_t *starts) {
    kiln_split_range one;
    size_t nr;
    const kiln_split_range *rg = kiln_split_ranges(sp, &one, &nr);
    uint64_t fit = 0;
    for (size_t g = 0; g < nr; g++)
        fit += windows_in(&rg[g], S);
    const bool distinct = n <= fit;
    uint64_t c = 0;
    for (size_t w = 0; w < n;) {
        uint32_t r[4];
        kiln_philox(seed, KILN_STREAM_GOLDEN, c++, r);
        uint64_t x = ((uint64_t)r[1] << 32 | r[0]) % fit;
        size_t g = 0;
        while (x >= windows_in(&rg[g], S))
            x -= windows_in(&rg[g++], S);
        size_t s = rg[g].val_begin + (size_t)x;
        bool dup = false;
        for (size_t k = 0; distinct && !dup && k < w; k++)
            dup = starts[k] == s;
        if (!dup) starts[w++] = s;
    }
}

kiln_err kiln_golden_make(const kiln_golden_opts *o) {
    KILN_FAIL_IF(!o || !o->model || !o->data, KILN_ERR_USAGE, "golden make needs a model and data");
    KILN_FAIL_IF(o->windows < 1, KILN_ERR_USAGE, "golden make: %d windows, at least 1 needed",
                 o->windows);
    vmodel m;
    KILN_TRY(kiln_vmodel_open(o->model, &m));
    kiln_err rc = KILN_OK;
    kiln_dataset *ds = NULL;
    kiln_st_writer *w = NULL;
    float *x = NULL, *t = NULL, *y = NULL, *loss = NULL;
    size_t *starts = NULL;
    char *out = NULL, *stpath = NULL, *jpath = NULL, *sttmp = NULL, *jtmp = NULL;
    bool made_out = false;
    json_t *gj = NULL, *js = NULL, *spj = NULL;
    kiln_split sp = {0};

    out = o->out_dir ? kiln_strdup(o->out_dir) : kiln_vmodel_path(&m, "golden");
    KILN_CHECK_IF(rc, done, !out, KILN_ERR_NOMEM, "out of memory");
    kiln_dir_state st = kiln_path_dir_state(out);
    KILN_CHECK_IF(rc, done, st == KILN_DIR_OTHER, KILN_ERR_CONFLICT,
                  "'%s' exists and is not a directory", out);
    KILN_CHECK_IF(rc, done, st == KILN_DIR_FULL && !o->force, KILN_ERR_CONFLICT,
                  "'%s' exists and is not empty (--force writes the golden set into it)", out);

    KILN_CHECK(rc, done, kiln_dataset_open(o->data, &ds));
    KILN_CHECK(rc, done, kiln_vmodel_check_data(&m, ds));
    const double vf = o->val_fraction >= 0 ? o->val_fraction : kiln_vmodel_val_fraction(&m);
    const int S = m.cfg.seq_len, F = m.cfg.n_features, O = m.cfg.n_outputs;
    KILN_CHECK(rc, done, kiln_vmodel_split(&m, ds, vf, &sp));
    const size_t N = (size_t)o->windows, nx = N * S * F, ny = N * S * O;
    starts = kiln_calloc(N, sizeof *starts);
    x = kiln_malloc(nx * sizeof *x);
    t = kiln_malloc(ny * sizeof *t);
    y = kiln_malloc(ny * sizeof *y);
    loss = kiln_malloc(N * sizeof *loss);
    KILN_CHECK_IF(rc, done, !starts || !x || !t || !y || !loss, KILN_ERR_NOMEM, "out of memory");
    draw_starts(&sp, S, o->seed, N, starts);
    kiln_vgather(ds, starts, N, S, x, t);
    KILN_CHECK(rc, done, kiln_vmodel_forward(&m, x, N, S, y));
    double mean = 0;
    for (size_t k = 0; k < N; k++) {
        double l = kiln_vmse(y + k * S * O, t + k * S * O, (size_t)S * O);
        loss[k] = (float)l;
        mean += l / (double)N;
    }

    /* Both files are written under temporary names and renamed into place once both are
     * whole: a failure leaves neither a half set nor a new file beside an old one (and no
     * directory the call made). */
    made_out = st == KILN_DIR_ABSENT;
    KILN_CHECK(rc, done, kiln_mkdir_p(out));
    stpath = kiln_path_join(out, "golden.safetensors");
    jpath = kiln_path_join(out, "golden.json");
    sttmp = kiln_path_join(out, ".golden.safetensors.new");
    jtmp = kiln_path_join(out, ".golden.json.new");
    KILN_CHECK_IF(rc, done, !stpath || !jpath || !sttmp || !jtmp, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, done, kiln_st_writer_new(&w));
    const int64_t sx[3] = {(int64_t)N, S, F}, sy[3] = {(int64_t)N, S, O}, sl[1] = {(int64_t)N};
    KILN_CHECK(rc, done, kiln_st_writer_add(w, "inputs", KILN_F32, 3, sx, x));
    KILN_CHECK(rc, done, kiln_st_writer_add(w, "targets", KILN_F32, 3, sy, t));
    KILN_CHECK(rc, done, kiln_st_writer_add(w, "outputs", KILN_F32, 3, sy, y));
    KILN_CHECK(rc, done, kiln_st_writer_add(w, "loss", KILN_F32, 1, sl, loss));
    KILN_CHECK(rc, done, kiln_st_writer_meta(w, "kiln.format", KILN_GOLDEN_FORMAT));
    KILN_CHECK(rc, done, kiln_st_writer_meta(w, "kiln.model_sha256", m.sha256));
    KILN_CHECK(rc, done, kiln_st_writer_meta(w, "kiln.data_sha256", ds->sha256));
    KILN_CHECK(rc, done, kiln_st_writer_write(w, sttmp));
    uint8_t d[KILN_SHA256_BYTES];
    char gh[KILN_SHA256_HEX];
    KILN_CHECK(rc, done, kiln_sha256_file(sttmp, d));
    kiln_hex(d, sizeof d, gh);

    js = json_array();
    for (size_t k = 0; js && k < N; k++)
        if (json_array_append_new(js, json_integer((json_int_t)starts[k]))) {
            json_decref(js);
            js = NULL;
        }
    spj = kiln_vsplit_json(&sp);
    KILN_CHECK_IF(rc, done, !js || !spj, KILN_ERR_NOMEM, "out of memory");
    gj = json_pack("{s:s,s:s,s:s,s:s,s:s,s:{s:I,s:s,s:f,s:i,s:o,s:o},s:I,s:f,s:s}", "format",
                   KILN_GOLDEN_FORMAT, "kiln_version", kiln_version(), "model_sha256", m.sha256,
                   "data_sha256", ds->sha256, "golden_sha256", gh, "windows_chosen", "seed",
                   (json_int_t)o->seed, "rng", "philox4x32-10, stream 4 (golden)", "val_fraction",
                   vf, "seq_len", S, "split", spj, "starts", js, "windows", (json_int_t)N,
                   "loss_mean", mean, "engine", KILN_VMODEL_ENGINE);
    js = spj = NULL;
    /* What the outputs' bits rest on (kernels.h); validate notes a golden set made with other
     * numerics. */
    if (gj && json_object_set_new(gj, "numerics", json_string(KILN_NUMERICS_CPU))) {
        json_decref(gj);
        gj = NULL;
    }
    KILN_CHECK_IF(rc, done, !gj, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, done, kiln_json_write_file(jtmp, gj));
    /* The description first: a set whose golden.json names another file's digest is refused
     * by validate, so a failure between the two renames is seen, never trusted. */
    KILN_CHECK_IF(rc, done, rename(jtmp, jpath) != 0, KILN_ERR_IO,
                  "'%s': cannot rename into place: %s", jpath, strerror(errno));
    KILN_CHECK_IF(rc, done, rename(sttmp, stpath) != 0, KILN_ERR_IO,
                  "'%s': cannot rename into place: %s", stpath, strerror(errno));
done:
    if (rc && sttmp) unlink(sttmp);
    if (rc && jtmp) unlink(jtmp);
    if (rc && made_out && out) rmdir(out);
    free(sttmp);
    free(jtmp);
    json_decref(js);
    json_decref(spj);
    json_decref(gj);
    kiln_split_release(&sp);
    kiln_st_writer_free(w);
    free(stpath);
    free(jpath);
    free(out);
    free(starts);
    free(x);
    free(t);
    free(y);
    free(loss);
    kiln_dataset_free(ds);
    kiln_vmodel_close(&m);
    return rc;
}

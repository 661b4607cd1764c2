/* safetensors.c - fuzz entry point for safetensors files (untrusted bytes: every model,
 * dataset and checkpoint kiln reads, and the model.safetensors of any archive pulled).
 * Parse with kiln_st_parse; when that succeeds, touch every tensor's bytes and check what
 * the reader promises (names sorted and unique, shapes and byte counts consistent, the
 * tensors tiling the data section, metadata findable), convert float tensors to f32 into a
 * bounded buffer, and read the model config. Through a temporary file, and only when the
 * header makes it possible, the same bytes are opened as a model (kiln_model_open, then one
 * forward and one stream tick) and as a dataset (kiln_dataset_open). */
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "fuzz.h"
#include "kiln.h"

int kiln_fuzz_safetensors(const uint8_t *data, size_t size);

#define F32_CAP 1024 /* floats converted per tensor */

static bool is_float(kiln_dtype dt) {
    return dt == KILN_F32 || dt == KILN_F64 || dt == KILN_BF16 || dt == KILN_F16;
}

/* Everything the reader promises about a file it accepted. */
static void check_st(const kiln_st *st, const uint8_t *data, size_t size) {
    static float f32[F32_CAP];
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | data[i];
    size_t covered = 0;
    for (size_t i = 0; i < kiln_st_count(st); i++) {
        const kiln_tensor *t = kiln_st_at(st, i);
        if (!t || !t->name || kiln_st_find(st, t->name) != t) abort();
        if (i && strcmp(kiln_st_at(st, i - 1)->name, t->name) >= 0) abort();
        if (!strcmp(t->name, "__metadata__")) abort();
        if (t->ndim < 0 || t->ndim > KILN_ST_MAX_DIMS) abort();
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0) abort();
            numel *= (size_t)t->shape[d]; /* cannot wrap: the reader checked */
        }
        if (numel != t->numel || t->nbytes != numel * kiln_dtype_size(t->dtype)) abort();
        /* Every byte readable (ASan sees a read past the copy). */
        const unsigned char *p = t->data;
        unsigned sum = 0;
        for (size_t b = 0; b < t->nbytes; b++) sum += p[b];
        (void)sum;
        covered += t->nbytes;
        if (kiln_st_expect(st, t->name, t->dtype, t->ndim, t->shape, NULL) != KILN_OK) abort();
        kiln_dtype other = t->dtype == KILN_F32 ? KILN_I32 : KILN_F32;
        if (kiln_st_expect(st, t->name, other, t->ndim, t->shape, NULL) == KILN_OK) abort();
        /* f32 conversion of at most F32_CAP elements: the same tensor, cut short. */
        kiln_tensor head = *t;
        if (head.numel > F32_CAP) {
            head.numel = F32_CAP;
            head.nbytes = F32_CAP * kiln_dtype_size(t->dtype);
        }
        kiln_err rc = kiln_tensor_to_f32(&head, f32);
        if ((rc == KILN_OK) != is_float(t->dtype)) abort();
    }
    if (covered != size - 8 - hlen) abort();
    kiln_errclear();
    for (size_t i = 0; i < kiln_st_meta_count(st); i++) {
        const char *k, *v;
        kiln_st_meta_at(st, i, &k, &v);
        if (!k || !v || kiln_st_meta(st, k) != v) abort();
        if (i) {
            const char *pk, *pv;
            kiln_st_meta_at(st, i - 1, &pk, &pv);
            if (strcmp(pk, k) >= 0) abort();
        }
    }
}

/* A config that parsed reads back from its own canonical text as the same config. */
static void check_config(const kiln_st *st, kiln_model_config *cfg) {
    if (kiln_model_config_check(cfg, "fuzz") != KILN_OK) abort();
    char *text = kiln_model_config_text(cfg);
    json_t *j = NULL;
    kiln_model_config again;
    if (!text || kiln_json_parse(text, strlen(text), "text", &j) != KILN_OK ||
        kiln_model_config_parse(j, "text", &again) != KILN_OK ||
        memcmp(&again, cfg, sizeof again) != 0)
        abort();
    json_decref(j);
    free(text);
    kiln_param *tab = NULL;
    size_t n = 0, total = 0;
    if (kiln_param_table(cfg, &tab, &n, &total) != KILN_OK) abort();
    for (size_t i = 0; i < n; i++)
        (void)kiln_st_expect(st, tab[i].name, KILN_F32, tab[i].ndim, tab[i].shape, NULL);
    free(tab);
    kiln_errclear();
}

static void open_model(const char *path) {
    kiln_model *m = NULL;
    if (kiln_model_open(path, &m) != KILN_OK) return;
    const kiln_model_config *c = kiln_model_config_get(m);
    enum { S = 2 };
    float *x = calloc((size_t)S * (size_t)c->n_features, sizeof *x);
    float *y = calloc((size_t)S * (size_t)c->n_outputs, sizeof *y);
    if (x && y) {
        for (size_t i = 0; i < (size_t)S * (size_t)c->n_features; i++) x[i] = (float)(i % 7) - 3;
        if (kiln_model_forward(m, x, 1, S, y) != KILN_OK) abort();
        kiln_stream *s = NULL;
        if (kiln_stream_open(m, &s) != KILN_OK || kiln_stream_push(s, x, y) != KILN_OK) abort();
        kiln_stream_free(s);
    }
    free(x);
    free(y);
    kiln_model_free(m);
}

static void open_dataset(const char *path) {
    kiln_dataset *ds = NULL;
    if (kiln_dataset_open_ex(path, KILN_DATASET_ALLOW_NONFINITE, &ds) != KILN_OK) return;
    if (!ds->rows || ds->n_features < 1 || ds->n_outputs < 1) abort();
    size_t ncol = (size_t)ds->n_features + (size_t)ds->n_outputs;
    kiln_column_stats *stats = calloc(ncol, sizeof *stats);
    if (stats) kiln_dataset_stats(ds, stats);
    free(stats);
    char buf[32];
    for (int i = 0; i < ds->n_features && i < 64; i++)
        if (!kiln_dataset_column(ds, false, i, buf, sizeof buf)) abort();
    for (int i = 0; i < ds->n_outputs && i < 64; i++)
        if (!kiln_dataset_column(ds, true, i, buf, sizeof buf)) abort();
    kiln_split sp;
    if (kiln_dataset_split(ds, 0.2, 1, &sp) == KILN_OK &&
        (sp.train_end > sp.val_begin || sp.val_begin > sp.val_end || sp.val_end > ds->rows))
        abort();
    kiln_dataset_free(ds);
    /* The strict open (finite values only) agrees or names a value. */
    if (kiln_dataset_open(path, &ds) == KILN_OK) kiln_dataset_free(ds);
}

int kiln_fuzz_safetensors(const uint8_t *data, size_t size) {
    kiln_st *st = NULL;
    if (kiln_st_parse(data, size, "fuzz.safetensors", &st) != KILN_OK) {
        kiln_errclear();
        return 0;
    }
    check_st(st, data, size);
    kiln_model_config cfg;
    bool model = kiln_model_config_from_st(st, &cfg) == KILN_OK;
    if (model) check_config(st, &cfg);
    bool dataset = kiln_st_find(st, "features") != NULL;
    kiln_st_close(st);
    kiln_errclear();
    if (model || dataset) {
        char *path = kiln_fuzz_tmp_write("st", data, size);
        if (path && model) open_model(path);
        if (path && dataset) open_dataset(path);
        kiln_fuzz_tmp_done(path);
    }
    kiln_errclear();
    return 0;
}

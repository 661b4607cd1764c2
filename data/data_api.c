/* data_api.c - the datasets half of include/kiln.h's section for bindings (python/kiln):
 * thin wrappers over the dataset loader and writer the CLI uses, so that a binding writes
 * the same bytes as `kiln data import` and reads what `kiln train` reads. (The runs half is
 * runs/run_api.c.) */
#include <stdlib.h>
#include <string.h>

#include "data.h"

static kiln_err nomem(void) {
    return kiln_fail(KILN_ERR_NOMEM, "out of memory");
}

kiln_err kiln_data_names_json(const char *path, int F, int O, const char *const *fn,
                              const char *const *tn, json_t **out) {
    *out = NULL;
    if (!fn && !tn) return KILN_OK;
    KILN_FAIL_IF(!fn || !tn, KILN_ERR_USAGE,
                 "'%s': give the names of both the features and the targets, or neither", path);
    json_t *cols = json_pack("{s:[],s:[]}", "features", "targets");
    if (!cols) return nomem();
    for (int k = 0; k < 2; k++) {
        json_t *a = json_object_get(cols, k ? "targets" : "features");
        for (int i = 0; i < (k ? O : F); i++) {
            const char *name = k ? tn[i] : fn[i];
            json_t *s = name ? json_string(name) : json_string("");
            if (!s || json_array_append_new(a, s)) {
                json_decref(cols);
                return name && !s ? kiln_fail(KILN_ERR_USAGE,
                                              "'%s': %s name %d is not valid UTF-8", path,
                                              k ? "target" : "feature", i)
                                  : nomem();
            }
        }
    }
    *out = cols;
    return KILN_OK;
}

KILN_API kiln_err kiln_data_write(const char *path, size_t rows, int n_features, int n_outputs,
                                  const float *features, const float *targets,
                                  const char *const *feature_names,
                                  const char *const *target_names) {
    KILN_FAIL_IF(!path || (rows && (!features || !targets)), KILN_ERR_USAGE,
                 "kiln_data_write: a null path or array");
    json_t *cols = NULL;
    if (n_features >= 1 && n_outputs >= 1 && n_features <= 1 << 20 && n_outputs <= 1 << 20)
        KILN_TRY(kiln_data_names_json(path, n_features, n_outputs, feature_names, target_names, &cols));
    kiln_err rc =
        kiln_dataset_write(path, rows, n_features, n_outputs, features, targets, cols);
    json_decref(cols);
    return rc;
}

KILN_API kiln_err kiln_data_open(const char *path, kiln_data **out) {
    *out = NULL;
    KILN_FAIL_IF(!path, KILN_ERR_USAGE, "kiln_data_open: a null path");
    kiln_data *d = kiln_calloc(1, sizeof *d);
    if (!d) return KILN_ERR_NOMEM;
    kiln_err rc = kiln_dataset_open(path, &d->ds);
    if (rc) {
        free(d);
        return rc;
    }
    *out = d;
    return KILN_OK;
}

KILN_API void kiln_data_free(kiln_data *d) {
    if (!d) return;
    kiln_dataset_free(d->ds);
    free(d);
}

KILN_API void kiln_data_shape(const kiln_data *d, size_t *rows, int *n_features, int *n_outputs) {
    if (rows) *rows = d->ds->rows;
    if (n_features) *n_features = d->ds->n_features;
    if (n_outputs) *n_outputs = d->ds->n_outputs;
}

KILN_API const float *kiln_data_features(const kiln_data *d) {
    return d->ds->features;
}

KILN_API const float *kiln_data_targets(const kiln_data *d) {
    return d->ds->targets;
}

KILN_API const char *kiln_data_column(const kiln_data *d, int target, int i) {
    if (!d->ds->columns || i < 0) return NULL;
    return json_string_value(
        json_array_get(json_object_get(d->ds->columns, target ? "targets" : "features"), (size_t)i));
}

KILN_API const char *kiln_data_sha256(const kiln_data *d) {
    return d->ds->sha256;
}

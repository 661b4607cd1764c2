/* api.c - the datasets-and-runs section of include/kiln.h, what bindings (python/kiln) call:
 * thin wrappers over the dataset loader and writer and the run readers the CLI uses, so
 * that a binding writes the same bytes and reads the same figures as the commands. */
#include <stdlib.h>
#include <string.h>

#include "train_int.h"

struct kiln_data {
    kiln_dataset *ds;
};

static kiln_err nomem(void) {
    return kiln_fail(KILN_ERR_NOMEM, "out of memory");
}

/* {"features": [F names], "targets": [O names]}; *out NULL when there are no names. */
static kiln_err names_json(const char *path, int F, int O, const char *const *fn,
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
        KILN_TRY(names_json(path, n_features, n_outputs, feature_names, target_names, &cols));
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

/* ---- runs ---- */

static kiln_err dump(json_t *doc, size_t flags, char **out) {
    *out = doc ? json_dumps(doc, flags) : NULL;
    json_decref(doc);
    return *out ? KILN_OK : nomem();
}

KILN_API kiln_err kiln_run_read(const char *run_dir, char **json) {
    *json = NULL;
    KILN_FAIL_IF(!run_dir, KILN_ERR_USAGE, "kiln_run_read: a null directory");
    bool live = false;
    kiln_run_info ri;
    KILN_TRY(kiln_run_live(run_dir, &live));
    KILN_TRY(kiln_run_info_load(run_dir, 0, &ri));
    kiln_run_state st = kiln_run_state_of(&ri, live);
    json_t *ckpts = json_array();
    bool bad = !ckpts;
    for (size_t i = 0; i < ri.n_ckpts && !bad; i++) {
        char *p = kiln_ckpt_path(run_dir, ri.ckpts[i]);
        json_t *c = p ? json_pack("{s:I,s:s}", "step", (json_int_t)ri.ckpts[i], "path", p) : NULL;
        free(p);
        bad = !c || json_array_append_new(ckpts, c);
    }
    json_t *doc = bad ? NULL
                      : json_pack("{s:s,s:O,s:s,s:o,s:I,s:o,s:o}", "dir", run_dir, "run", ri.run,
                                  "state", kiln_run_state_name(st), "message",
                                  ri.stop_kind && !live ? json_string(ri.stop_message)
                                                        : json_null(),
                                  "step", (json_int_t)ri.last_step, "checkpoints", ckpts,
                                  "best_checkpoint",
                                  ri.best_ckpt >= 0 ? json_integer(ri.best_ckpt) : json_null());
    if (bad) json_decref(ckpts);
    kiln_run_info_release(&ri);
    return dump(doc, JSON_COMPACT, json);
}

KILN_API kiln_err kiln_runs_list(const char *const *paths, size_t n_paths,
                                 const char *const *where, size_t n_where, const char *sort,
                                 size_t top, char **json) {
    *json = NULL;
    KILN_FAIL_IF(!paths || !n_paths || (n_where && !where), KILN_ERR_USAGE,
                 "kiln_runs_list: no paths, or a null filter array");
    const kiln_run_list_opts o = {where, n_where, sort, top};
    kiln_run_list l = {0};
    KILN_TRY(kiln_run_list_load(paths, n_paths, &o, &l));
    /* What kiln runs list --json prints (cli/cmd_runs.c), less its final newline. */
    kiln_err rc = dump(kiln_run_list_json(&l), JSON_INDENT(2) | JSON_REAL_PRECISION(15), json);
    kiln_run_list_release(&l);
    return rc;
}

KILN_API void kiln_free(void *p) {
    free(p);
}

/* time_api.c - the time and group columns of include/kiln.h's datasets-and-runs section, and
 * the trainer's split, for bindings (python/kiln; docs/python.md): a dataset written here with
 * times and groups is byte for byte what `kiln data import --time --group` writes, and a
 * split is kiln_dataset_split_ex, the call `kiln train`, `kiln golden make` and `kiln
 * validate` make, so that a notebook trains and validates on the rows kiln does. */
#include <stdlib.h>
#include <string.h>

#include "data.h"

KILN_API kiln_err kiln_data_write_extra(const char *path, size_t rows, int n_features,
                                        int n_outputs, const float *features, const float *targets,
                                        const char *const *feature_names,
                                        const char *const *target_names, const kiln_data_extra *x) {
    KILN_FAIL_IF(!path || !features || !targets, KILN_ERR_USAGE,
                 "kiln_data_write_extra: a null path or array");
    KILN_FAIL_IF(!feature_names != !target_names, KILN_ERR_USAGE,
                 "'%s': give the names of both the features and the targets, or neither", path);
    KILN_FAIL_IF(n_features < 1 || n_outputs < 1 || n_features > 1 << 20 || n_outputs > 1 << 20,
                 KILN_ERR_USAGE, "'%s': %d features and %d targets: each must be 1 to %d", path,
                 n_features, n_outputs, 1 << 20);
    json_t *cols = NULL;
    KILN_TRY(kiln_data_names_json(path, n_features, n_outputs, feature_names, target_names, &cols));
    kiln_dataset_extra ex = {0};
    if (x)
        ex = (kiln_dataset_extra){.time = x->time,
                                  .time_column = x->time_column,
                                  .group = x->group,
                                  .n_groups = x->n_groups,
                                  .group_names = x->group_names,
                                  .group_column = x->group_column};
    kiln_err rc = kiln_dataset_write_extra(path, rows, n_features, n_outputs, features, targets,
                                           cols, NULL, ex.time || ex.group ? &ex : NULL);
    json_decref(cols);
    return rc;
}

KILN_API const int64_t *kiln_data_time(const kiln_data *d, const char **column) {
    if (column)
        *column =
            d->ds->time ? json_string_value(json_object_get(d->ds->time_meta, "column")) : NULL;
    return d->ds->time;
}

KILN_API const int32_t *kiln_data_groups(const kiln_data *d, int *n_groups, const char **column) {
    if (n_groups) *n_groups = d->ds->n_groups;
    if (column)
        *column =
            d->ds->group ? json_string_value(json_object_get(d->ds->group_meta, "column")) : NULL;
    return d->ds->group;
}

KILN_API const char *kiln_data_group_name(const kiln_data *d, int g) {
    if (!d->ds->group || g < 0 || g >= d->ds->n_groups) return NULL;
    return json_string_value(
        json_array_get(json_object_get(d->ds->group_meta, "names"), (size_t)g));
}

KILN_API kiln_err kiln_data_split(const char *path, size_t rows, const int64_t *time,
                                  const int32_t *group, int n_groups, const kiln_data_split_opts *o,
                                  kiln_data_range *ranges, size_t *val_starts, size_t val_cap,
                                  kiln_data_split_info *info) {
    KILN_FAIL_IF(!o || !ranges || !info || (val_cap && !val_starts), KILN_ERR_USAGE,
                 "kiln_data_split: a null argument");
    memset(info, 0, sizeof *info);
    const char *label = path && *path ? path : "the dataset";
    KILN_FAIL_IF(!rows, KILN_ERR_USAGE, "'%s': the dataset has no rows", label);
    KILN_FAIL_IF(group && n_groups < 1, KILN_ERR_USAGE, "'%s': a group column needs a group",
                 label);
    KILN_TRY(kiln_dataset_check_extra(label, rows, time, group, n_groups, KILN_ERR_USAGE));
    kiln_split_opts so = {.val_fraction = o->val_fraction,
                          .seq_len = o->seq_len,
                          .val_from = o->val_from,
                          .purge_rows = o->purge_rows};
    KILN_FAIL_IF(
        o->purge_time && *o->purge_time && !kiln_duration_parse(o->purge_time, &so.purge_secs),
        KILN_ERR_USAGE, "purge_time '%s' is not a duration (10d, 12h, 90m, 3600s)", o->purge_time);
    /* The split reads the rows, the two columns and the path (for its messages) only. */
    kiln_dataset ds = {.rows = rows,
                       .path = (char *)label,
                       .time = (int64_t *)time,
                       .group = (int32_t *)group,
                       .n_groups = group ? n_groups : 0};
    kiln_split sp;
    KILN_TRY(kiln_dataset_split_ex(&ds, &so, &sp));
    kiln_split_range one;
    size_t n;
    const kiln_split_range *r = kiln_split_ranges(&sp, &one, &n);
    for (size_t g = 0; g < n; g++)
        ranges[g] =
            (kiln_data_range){r[g].train_begin, r[g].train_end, r[g].val_begin, r[g].val_end};
    *info = (kiln_data_split_info){.n_ranges = n,
                                   .train_rows = sp.train_rows,
                                   .val_rows = sp.val_rows,
                                   .gap_rows = sp.gap_rows,
                                   .by_time = sp.by_time,
                                   .val_from = sp.val_from};
    if (val_cap && o->seq_len > 0)
        info->n_val = kiln_split_val_windows(&sp, o->seq_len, val_cap, val_starts);
    kiln_split_release(&sp);
    return KILN_OK;
}

/* run_api.c - the runs half of include/kiln.h's section for bindings (python/kiln): thin
 * wrappers over the run readers the CLI uses, so that a binding reads the same figures as
 * `kiln runs show` and `kiln runs list --json`. (The datasets half is data/data_api.c.) */
#include <stdlib.h>
#include <string.h>

#include "runs_int.h"

static kiln_err dump(json_t *doc, size_t flags, char **out) {
    *out = doc ? json_dumps(doc, flags) : NULL;
    json_decref(doc);
    return *out ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "out of memory");
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
        char *p = kiln_run_ckpt_path(run_dir, ri.ckpts[i]);
        json_t *c = p ? json_pack("{s:I,s:s}", "step", (json_int_t)ri.ckpts[i], "path", p) : NULL;
        free(p);
        bad = !c || json_array_append_new(ckpts, c);
    }
    json_t *doc =
        bad ? NULL
            : json_pack("{s:s,s:O,s:s,s:o,s:I,s:o,s:o}", "dir", run_dir, "run", ri.run, "state",
                        kiln_run_state_name(st), "message",
                        ri.stop_kind && !live ? json_string(ri.stop_message) : json_null(), "step",
                        (json_int_t)ri.last_step, "checkpoints", ckpts, "best_checkpoint",
                        ri.best_ckpt >= 0 ? json_integer(ri.best_ckpt) : json_null());
    if (bad) json_decref(ckpts);
    kiln_run_info_release(&ri);
    return dump(doc, JSON_COMPACT, json);
}

KILN_API kiln_err kiln_runs_list(const char *const *paths, size_t n_paths, const char *const *where,
                                 size_t n_where, const char *sort, size_t top, char **json) {
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

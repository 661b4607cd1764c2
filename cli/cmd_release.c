/* cmd_release.c - kiln release: a run to a published, optionally promoted version in one
 * command (release/release.c does the work; this prints each stage). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "export.h"
#include "registry.h"
#include "release.h"
#include "sign.h"
#include "validate.h"

static void on_stage(void *ctx, kiln_release_stage stage, const char *line) {
    (void)ctx;
    printf("[%d/%d] %-9s %s\n", (int)stage + 1, (int)KILN_RELEASE_DONE,
           kiln_release_stage_name(stage), line);
    fflush(stdout);
}

static void free_keys(kiln_sign_seckey **k, int n) {
    for (int i = 0; k && i < n; i++)
        kiln_sign_seckey_free(k[i]);
    free(k);
}

static kiln_err load_keys(const cli_list *paths, kiln_sign_seckey ***out) {
    *out = NULL;
    if (!paths->n) return KILN_OK;
    kiln_sign_seckey **k = calloc((size_t)paths->n, sizeof *k);
    if (!k) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < paths->n; i++) {
        kiln_err rc = cli_load_seckey(paths->v[i], &k[i]);
        if (rc) {
            free_keys(k, i);
            return rc;
        }
    }
    *out = k;
    return KILN_OK;
}

int cmd_release(int argc, char **argv) {
    const char *name = NULL, *version = NULL, *url = NULL, *token = NULL, *ptoken = NULL,
               *data = NULL, *baseline = "production", *promote = NULL, *out = NULL, *trust = NULL,
               *state = NULL, *model = NULL, *reference = NULL;
    cli_list keys = {0}, pkeys = {0}, sets = {0};
    long step = 0, windows = 64;
    bool best = false;
    bool no_bf16 = false, no_data = false;
    const cli_opt opts[] = {
        {"name", CLI_STR, &name, "N", "the model's name in the registry", true},
        {"version", CLI_STR, &version, "V", "the new version (versions are immutable)", true},
        {"registry", CLI_STR, &url, "URL", "the registry", true},
        {"key", CLI_MULTI, &keys, "KEY", "a release key (repeat for several signers)", true},
        {"trust", CLI_STR, &trust, "FILE",
         "the trust policy services pull with: the baseline is verified with it and the signed "
         "archive must meet it",
         true},
        {"token", CLI_STR, &token, "T", "a publish token (default $KILN_REGISTRY_TOKEN)", false},
        {"data", CLI_STR, &data, "DATA", "dataset (default: the one the run was trained on)",
         false},
        {"baseline-channel", CLI_STR, &baseline, "C",
         "validate against the model in this channel (default production; '' for none)", false},
        {"promote", CLI_STR, &promote, "C", "point this channel at the new version", false},
        {"promote-key", CLI_MULTI, &pkeys, "KEY", "a promote key (repeatable; default: --key)",
         false},
        {"promote-token", CLI_STR, &ptoken, "T", "a promote token (default: --token)", false},
        {"out-dir", CLI_STR, &out, "DIR",
         "where the model directory and archive go (default release-N-V)", false},
        {"step", CLI_INT, &step, "N", "checkpoint step (default: the newest that verifies)", false},
        {"best", CLI_FLAG, &best, NULL,
         "the checkpoint whose step logged the lowest validation loss (kept by the trainer)",
         false},
        {"windows", CLI_INT, &windows, "N", "golden windows (default 64)", false},
        {"no-bf16", CLI_FLAG, &no_bf16, NULL, "skip the f32-vs-bf16 parity check", false},
        {"no-data", CLI_FLAG, &no_data, NULL,
         "do not publish the training dataset (the card then says it was withheld)", false},
        {"set", CLI_MULTI, &sets, "KEY=VALUE", "override a validation threshold (repeatable)",
         false},
        {"state", CLI_STR, &state, "DIR",
         "pull state for the baseline (default ~/.local/state/kiln)", false},
        {"model", CLI_STR, &model, "DIR",
         "release this model directory (kiln.torch's save_model_dir, say) instead of a run",
         false},
        {"reference", CLI_STR, &reference, "REF",
         "also hold the runtime to a research framework's outputs (validate's parity_reference)",
         false},
        {0},
    };
    const cli_spec spec = {
        "kiln release RUN_DIR | --model DIR --name N --version V --registry URL --key KEY "
        "--trust trust.json [--token T] [--data DATA] [--reference REF] [--baseline-channel "
        "production] [--promote staging] [--step N | --best] [--out-dir DIR]",
        "Export a run (or copy a model directory), make its golden data, validate it against the "
        "model in the baseline channel, pack, sign, publish and optionally promote it; stop at "
        "the first stage that fails.",
        opts, 0, 1};
    const char *run_dir;
    int status;
    if (!cli_parse_args(&spec, argc, argv, &run_dir, &status)) {
        free(keys.v), free(pkeys.v), free(sets.v);
        return status;
    }
    kiln_thresholds th;
    kiln_thresholds_default(&th);
    kiln_sign_seckey **rk = NULL, **pk = NULL;
    char *out_dir = NULL;
    kiln_err e = KILN_OK;
    if (step < 0 || windows < 1 || windows > 1000000) {
        status = cli_usage_error("--step must be positive and --windows between 1 and 1000000");
        goto done;
    }
    if (!run_dir == !model) {
        status = cli_usage_error("give a run directory or --model DIR (one of the two)");
        goto done;
    }
    if (model && (best || step)) {
        status = cli_usage_error("--step and --best choose a run's checkpoint; --model has none");
        goto done;
    }
    if (best && step) {
        status = cli_usage_error("--step and --best exclude each other");
        goto done;
    }
    if (best) step = KILN_EXPORT_BEST;
    for (int i = 0; i < sets.n && !e; i++)
        e = kiln_thresholds_set(&th, sets.v[i]);
    if (!e) e = load_keys(&keys, &rk);
    if (!e && pkeys.n) e = load_keys(&pkeys, &pk); /* else the release keys promote too */
    out_dir = out ? kiln_strdup(out) : kiln_asprintf("release-%s-%s", name, version);
    if (!e && !out_dir) e = KILN_ERR_NOMEM;
    if (e) {
        status = cli_fail(e);
        goto done;
    }
    kiln_registry_client_opts c;
    cli_client_opts(&c, url, token, NULL);
    kiln_release_opts o = {
        .run_dir = run_dir,
        .step = step,
        .name = name,
        .version = version,
        .data = data,
        .out_dir = out_dir,
        .trust = trust,
        .state = state,
        .baseline_channel = baseline,
        .promote = promote,
        .release_keys = (const kiln_sign_seckey *const *)rk,
        .n_release_keys = (size_t)keys.n,
        .promote_keys = (const kiln_sign_seckey *const *)(pk ? pk : rk),
        .n_promote_keys = (size_t)(pkeys.n ? pkeys.n : keys.n),
        .client = &c,
        .promote_token = ptoken,
        .windows = (int)windows,
        .thresholds = &th,
        .no_bf16 = no_bf16,
        .no_data = no_data,
        .on_stage = on_stage,
        .model_dir = model,
        .reference = reference,
    };
    printf("releasing %s@%s from '%s' to %s\n", name, version, run_dir ? run_dir : model, url);
    kiln_release_result res;
    e = kiln_release_run(&o, &res);
    if (e) {
        status = cli_fail(e);
        if (res.stage > KILN_RELEASE_CHECK && res.stage < KILN_RELEASE_PUBLISH &&
            kiln_path_exists(out_dir))
            fprintf(stderr, "kiln: nothing was published; what was made is in '%s'\n", out_dir);
        goto done;
    }
    printf("released %s@%s %s%s%s\n", name, version, res.digest,
           res.baseline[0] ? ", validated against " : "", res.baseline[0] ? res.baseline : "");
done:
    free_keys(rk, keys.n);
    free_keys(pk, pkeys.n);
    free(out_dir);
    free(keys.v), free(pkeys.v), free(sets.v);
    return status;
}

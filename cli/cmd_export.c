/* cmd_export.c - kiln export: freeze a run's checkpoint into a model directory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "export.h"
#include "runs.h"

int cmd_export(int argc, char **argv) {
    const char *out = NULL, *dtype = "f32", *name = NULL;
    long step = 0;
    bool force = false, best = false;
    const cli_opt opts[] = {
        {"out", CLI_STR, &out, "MODEL_DIR", "model directory to create", true},
        {"step", CLI_INT, &step, "N", "checkpoint step (default: the newest whose digest verifies)",
         false},
        {"best", CLI_FLAG, &best, NULL,
         "the checkpoint whose step logged the lowest validation loss (kept by the trainer)",
         false},
        {"dtype", CLI_STR, &dtype, "f32|bf16", "weight dtype (default f32; norm.in_* stay f32)",
         false},
        {"name", CLI_STR, &name, "NAME", "the card's model name (default run-<run id>)", false},
        {"force", CLI_FLAG, &force, NULL, "replace an existing non-empty MODEL_DIR", false},
        {0},
    };
    const cli_spec spec = {
        "kiln export RUN_DIR --out MODEL_DIR [--step N | --best] [--dtype f32|bf16] [--name NAME] "
        "[--force]",
        "Freeze a training checkpoint into a model directory (model.safetensors, card.json); "
        "the same checkpoint gives the same bytes.",
        opts, 1, 1};
    const char *run_dir;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &run_dir, &rc)) return rc;
    kiln_export_opts o = {
        .run_dir = run_dir, .step = step, .out_dir = out, .name = name, .force = force,
        .add_files = kiln_run_summary_add, .add_files_ctx = (void *)run_dir,
        .best_step = kiln_run_best_ckpt, .step_metrics = kiln_run_step_metrics};
    if (!strcmp(dtype, "bf16")) {
        o.dtype = KILN_EXPORT_BF16;
    } else if (strcmp(dtype, "f32")) {
        return cli_usage_error("--dtype must be f32 or bf16, not '%s'", dtype);
    }
    if (step < 0) return cli_usage_error("--step must be a positive step number");
    if (best && step) return cli_usage_error("--step and --best exclude each other");
    if (best) o.step = KILN_EXPORT_BEST;
    kiln_export_info info;
    kiln_err err = kiln_export_model(&o, &info);
    if (err) return cli_fail(err);
    printf("exported '%s' (step %ld, %s) into '%s'\n", info.ckpt_path, info.step, dtype, out);
    kiln_export_info_release(&info);
    return 0;
}

/* cmd_golden.c - kiln golden make: a model's outputs on held-out windows (validate/). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "validate.h"

int cmd_golden_make(int argc, char **argv) {
    const char *model = NULL, *data = NULL, *out = NULL;
    long windows = 0;
    uint64_t seed = 1;
    double vf = -1;
    bool force = false;
    const cli_opt opts[] = {
        {"model", CLI_STR, &model, "M", "model directory", true},
        {"data", CLI_STR, &data, "DATA", "dataset; windows come from its held-out split", true},
        {"windows", CLI_INT, &windows, "N", "windows to store", true},
        {"out", CLI_STR, &out, "DIR", "where to write (default M/golden)", false},
        {"seed", CLI_U64, &seed, "S", "seed of the window choice (default 1)", false},
        {"val-fraction", CLI_DBL, &vf, "F",
         "held-out fraction (default: the card's run config, else 0.2)", false},
        {"force", CLI_FLAG, &force, NULL, "replace an existing golden set", false},
        {0},
    };
    const cli_spec spec = {
        "kiln golden make --model M --data DATA --windows N [--out M/golden] [--seed S]",
        "Store a model's outputs on N held-out windows (golden.safetensors, golden.json) for "
        "kiln validate to hold it to.",
        opts, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) return rc;
    if (windows < 1 || windows > 1000000)
        return cli_usage_error("--windows must be between 1 and 1000000");
    if (vf != -1 && !(vf > 0 && vf < 1)) return cli_usage_error("--val-fraction must be in (0, 1)");
    kiln_golden_opts o = {.model = model,
                          .data = data,
                          .out_dir = out,
                          .windows = (int)windows,
                          .seed = seed,
                          .val_fraction = vf,
                          .force = force};
    kiln_err err = kiln_golden_make(&o);
    if (err) return cli_fail(err);
    size_t ml = strlen(model);
    char *dir = ml > 12 && !strcmp(model + ml - 12, ".safetensors") ? kiln_dirname(model)
                                                                    : kiln_strdup(model);
    char *where = out ? kiln_strdup(out) : dir ? kiln_path_join(dir, "golden") : NULL;
    printf("golden set of %ld windows written to '%s'\n", windows, where ? where : "?");
    free(where);
    free(dir);
    return 0;
}

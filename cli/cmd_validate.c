/* cmd_validate.c - kiln validate: the validation gate (validate/). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "validate.h"

static void print_keys(void) {
    printf("\nthresholds (--set KEY=VALUE):\n");
    double def;
    const char *doc, *k;
    for (size_t i = 0; (k = kiln_thresholds_key(i, &def, &doc)); i++)
        printf("  %-24s %-8g %s\n", k, def, doc);
}

int cmd_validate(int argc, char **argv) {
    const char *model = NULL, *data = NULL, *baseline = NULL, *report = NULL, *bf16 = NULL,
               *reference = NULL;
    bool make_bf16 = false, no_bf16 = false, help = false;
    double vf = -1;
    cli_list sets = {0};
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help")) help = true;
    const cli_opt opts[] = {
        {"model", CLI_STR, &model, "M", "candidate model directory (with golden/)", true},
        {"data", CLI_STR, &data, "DATA", "dataset (its held-out split is used)", true},
        {"baseline", CLI_STR, &baseline, "M0", "the model in production (with golden/)", false},
        {"report", CLI_STR, &report, "FILE", "report to write (default M/validation.json)", false},
        {"bf16", CLI_STR, &bf16, "M_BF16", "compare with this bf16 export of the model", false},
        {"make-bf16", CLI_FLAG, &make_bf16, NULL,
         "compare with a bf16 rounding made in memory (the default, as kiln release)", false},
        {"no-bf16", CLI_FLAG, &no_bf16, NULL, "skip the f32-vs-bf16 parity check", false},
        {"val-fraction", CLI_DBL, &vf, "F",
         "held-out fraction (default: the card's run config, else 0.2)", false},
        {"set", CLI_MULTI, &sets, "KEY=VALUE", "override a threshold (repeatable)", false},
        {"reference", CLI_STR, &reference, "REF",
         "a research framework's outputs on the golden inputs (kiln.torch), held against the "
         "runtime's (parity_reference)",
         false},
        {0},
    };
    const cli_spec spec = {
        "kiln validate --model M --data DATA [--baseline M0] [--report FILE] [--bf16 M_BF16 | "
        "--no-bf16] [--reference REF] [--set KEY=VALUE ...]",
        "Run the golden regression and inference parity checks and write one report; exit 0 "
        "only if every check that ran passed.",
        opts, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) {
        if (help) print_keys(); /* --help given, even beside a usage error */
        free(sets.v);
        return rc;
    }
    kiln_thresholds th;
    kiln_thresholds_default(&th);
    for (int i = 0; i < sets.n; i++) {
        kiln_err err = kiln_thresholds_set(&th, sets.v[i]);
        if (err) {
            free(sets.v);
            return cli_fail(err);
        }
    }
    free(sets.v);
    if (bf16 && make_bf16) return cli_usage_error("--bf16 and --make-bf16 exclude each other");
    if (no_bf16 && (bf16 || make_bf16))
        return cli_usage_error(bf16 ? "--bf16 and --no-bf16 exclude each other"
                                    : "--make-bf16 and --no-bf16 exclude each other");
    if (vf != -1 && !(vf > 0 && vf < 1)) return cli_usage_error("--val-fraction must be in (0, 1)");
    kiln_validate_opts o = {.model = model,
                            .data = data,
                            .baseline = baseline,
                            .bf16 = bf16,
                            .no_bf16 = no_bf16,
                            .report = report,
                            .thresholds = &th,
                            .val_fraction = vf,
                            .reference = reference};
    json_t *rep = NULL;
    kiln_err err = kiln_validate_run(&o, &rep);
    if (err && !rep) return cli_fail(err);
    /* One line per check with its reason or note; a failed one prints it on stderr too. */
    const char *name;
    json_t *c;
    json_object_foreach(json_object_get(rep, "checks"), name, c) {
        const char *st = json_string_value(json_object_get(c, "status"));
        const char *why = json_string_value(json_object_get(c, "reason"));
        if (!why) why = json_string_value(json_object_get(c, "note"));
        if (!strcmp(st, "failed")) fprintf(stderr, "kiln: failed: %s\n", why ? why : name);
        printf("%-24s %s%s%s\n", name, st, why && strcmp(st, "failed") ? ": " : "",
               why && strcmp(st, "failed") ? why : "");
    }
    const char *rp = json_string_value(json_object_get(rep, "report"));
    printf("validation %s; report '%s'\n", err ? "FAILED" : "passed", rp ? rp : "(none)");
    json_decref(rep);
    return err ? cli_fail(err) : 0;
}

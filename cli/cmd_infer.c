/* cmd_infer.c - kiln infer: run a model over a dataset file, batch or tick by tick. */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "runtime.h"

int cmd_infer(int argc, char **argv) {
    const char *model = NULL, *input = NULL, *out = NULL;
    bool stream = false;
    const cli_opt opts[] = {
        {"model", CLI_STR, &model, "M", "model directory, or its model.safetensors", true},
        {"input", CLI_STR, &input, "DATA",
         "dataset file: `features` [N,F] f32, one sequence from row 0", true},
        {"out", CLI_STR, &out, "OUT", "output file: `outputs` [N,O] f32 (safetensors)", true},
        {"stream", CLI_FLAG, &stream, NULL, "push the rows one tick at a time through a stream",
         false},
        {0},
    };
    const cli_spec spec = {
        "kiln infer --model M --input DATA.safetensors --out OUT.safetensors [--stream]",
        "Run a model over a dataset's features as one sequence and write its outputs.", opts, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) return rc;
    size_t rows;
    kiln_err err = kiln_runtime_infer_file(model, input, out, stream, &rows);
    if (err != KILN_OK) return cli_fail(err);
    printf("%s: %zu rows (%s)\n", out, rows, stream ? "stream" : "batch");
    return 0;
}

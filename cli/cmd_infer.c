/* cmd_infer.c - kiln infer: run a model over a dataset file, batch or tick by tick. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "runtime.h"

/* "cpu", "cuda" (device 0) or "cuda:N". */
static bool parse_device(const char *s, int *device) {
    if (!strcmp(s, "cpu")) {
        *device = KILN_DEVICE_CPU;
        return true;
    }
    if (!strcmp(s, "cuda")) {
        *device = 0;
        return true;
    }
    int n = 0;
    if (strncmp(s, "cuda:", 5) || !s[5] || strlen(s + 5) > 4) return false;
    for (const char *p = s + 5; *p; p++) {
        if (*p < '0' || *p > '9') return false;
        n = n * 10 + (*p - '0');
    }
    *device = n;
    return true;
}

int cmd_infer(int argc, char **argv) {
    const char *model = NULL, *input = NULL, *out = NULL, *device_name = "cpu";
    bool stream = false;
    const cli_opt opts[] = {
        {"model", CLI_STR, &model, "M", "model directory, or its model.safetensors", true},
        {"input", CLI_STR, &input, "DATA",
         "dataset file: `features` [N,F] f32, one sequence from row 0", true},
        {"out", CLI_STR, &out, "OUT", "output file: `outputs` [N,O] f32 (safetensors)", true},
        {"stream", CLI_FLAG, &stream, NULL, "push the rows one tick at a time through a stream",
         false},
        {"device", CLI_STR, &device_name, "cpu|cuda[:N]",
         "where the model runs (default cpu; cuda = the first GPU)", false},
        {0},
    };
    const cli_spec spec = {
        "kiln infer --model M --input DATA.safetensors --out OUT.safetensors [--stream] "
        "[--device cpu|cuda[:N]]",
        "Run a model over a dataset's features as one sequence and write its outputs.", opts, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) return rc;
    int device;
    if (!parse_device(device_name, &device)) {
        fprintf(stderr, "kiln: error: --device must be cpu, cuda or cuda:N, not \"%s\"\n",
                device_name);
        return 2;
    }
    size_t rows;
    kiln_err err = kiln_runtime_infer_file(model, input, out, stream, device, &rows);
    if (err != KILN_OK) return cli_fail(err);
    printf("%s: %zu rows (%s, %s)\n", out, rows, stream ? "stream" : "batch", device_name);
    return 0;
}

/* train_config.c - fuzz entry point for a run's config (train/config.c), as `kiln train
 * --config FILE` reads it: strict JSON, overlaid on the defaults, then the cross-key checks.
 * The same reader takes a checkpoint's config back on resume, so what a run writes must read
 * back as itself. A libFuzzer driver calls it from LLVMFuzzerTestOneInput; the C suite replays
 * tests/fuzz/corpus/train_config through it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "train.h"

int kiln_fuzz_train_config(const uint8_t *data, size_t size);

/* Read text as a config over the defaults: KILN_OK and *c, or the error. */
static kiln_err read_config(const char *text, size_t len, kiln_train_config *c) {
    json_t *j = NULL;
    kiln_train_config_default(c);
    kiln_err rc = kiln_json_parse(text, len, "fuzz.json", &j);
    if (!rc) rc = kiln_train_config_apply(c, j, "'fuzz.json'");
    if (!rc) rc = kiln_train_config_check(c, "'fuzz.json'");
    json_decref(j);
    return rc;
}

int kiln_fuzz_train_config(const uint8_t *data, size_t size) {
    kiln_train_config c, back;
    if (read_config((const char *)data, size, &c) != KILN_OK) {
        /* Every refusal names the file. */
        if (!strstr(kiln_errmsg(), "fuzz.json")) abort();
        return 0;
    }
    /* Accepted: its text (what a run's config.json and checkpoints hold) reads back as a
     * config that passes the same checks and writes the same text, in both layouts. */
    char *text = kiln_train_config_text(&c, false), *pretty = kiln_train_config_text(&c, true);
    if (!text || !pretty) abort();
    if (read_config(text, strlen(text), &back) != KILN_OK) {
        fprintf(stderr, "does not read back: %s\n%s\n", kiln_errmsg(), text);
        abort();
    }
    char *again = kiln_train_config_text(&back, false);
    if (!again || strcmp(again, text)) abort();
    if (read_config(pretty, strlen(pretty), &back) != KILN_OK) abort();
    free(again);
    again = kiln_train_config_text(&back, false);
    if (!again || strcmp(again, text)) abort();
    free(again);
    free(text);
    free(pretty);
    return 0;
}

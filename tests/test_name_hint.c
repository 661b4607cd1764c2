/* test_name_hint.c - an unknown name's error says what was likely meant and lists the names
 * (issue 30, "errors that say what to do"): kiln_name_hint, and the two tables that use it,
 * the trainer's config keys (--set, config files, sweep specs) and validate's thresholds. */
#include <string.h>

#include "test.h"
#include "train.h"
#include "validate.h"

typedef struct row {
    const char *name;
    int other;
} row;

KILN_TEST(name_hint_did_you_mean) {
    static const row t[] = {{"steps", 1}, {"lr", 2}, {"seq_len", 3}, {"val_fraction", 4}};
    char b[256];
    kiln_name_hint("stpes", t, 4, sizeof t[0], "keys", b, sizeof b);
    CHECK("a swap of neighbours", !strcmp(b, " (did you mean 'steps'?)\nkeys: steps, lr, "
                                             "seq_len, val_fraction"));
    kiln_name_hint("lrr", t, 4, sizeof t[0], "keys", b, sizeof b);
    CHECK("one too many", !strncmp(b, " (did you mean 'lr'?)\n", 21));
    kiln_name_hint("val_fractoin", t, 4, sizeof t[0], "keys", b, sizeof b);
    CHECK("a long name, two off", !strncmp(b, " (did you mean 'val_fraction'?)", 31));
    kiln_name_hint("colour", t, 4, sizeof t[0], "keys", b, sizeof b);
    CHECK("nothing close: the list alone", !strcmp(b, "\nkeys: steps, lr, seq_len, val_fraction"));
    kiln_name_hint("stpes", t, 4, sizeof t[0], "keys", b, 12);
    CHECK("cut to the buffer", strlen(b) == 11);
    kiln_name_hint("x", t, 0, sizeof t[0], "keys", b, sizeof b);
    CHECK("no names", !strcmp(b, "\nkeys: "));
}

KILN_TEST(name_hint_config_and_thresholds) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    CHECK("--set names the likely key and lists them",
          kiln_train_config_set(&c, "stpes=3") == KILN_ERR_CONFIG &&
              strstr(kiln_errmsg(), "unknown config key 'stpes' (did you mean 'steps'?)\n") &&
              strstr(kiln_errmsg(), "config keys: accum_steps, ") &&
              strstr(kiln_errmsg(), ", z_loss_coef"));
    kiln_thresholds th;
    kiln_thresholds_default(&th);
    CHECK("--set of validate alike",
          kiln_thresholds_set(&th, "parity.rtool=1") == KILN_ERR_USAGE &&
              strstr(kiln_errmsg(),
                     "unknown threshold 'parity.rtool' (did you mean 'parity.rtol'?)\n") &&
              strstr(kiln_errmsg(), "thresholds: golden.rtol, ") &&
              strstr(kiln_errmsg(), ", reference.max_outside"));
}

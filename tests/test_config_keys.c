/* test_config_keys.c - the trainer's config keys as a researcher meets them: an unknown key
 * names the likely one and lists them all (kiln_name_hint); --print-config shows every
 * accepted key and reads back (issue 30, "Errors" and "Onboarding"). */
#include <string.h>

#include "core.h"
#include "test.h"
#include "train.h"

KILN_TEST(config_unknown_key_suggests) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    CHECK("--set lrr=1 refused", kiln_train_config_set(&c, "lrr=1") == KILN_ERR_CONFIG);
    CHECK("naming lr", strstr(kiln_errmsg(), "unknown config key 'lrr' (did you mean 'lr'?)"));
    CHECK("and listing the keys on the next line",
          strstr(kiln_errmsg(), "?)\nconfig keys: accum_steps, adam_eps,") &&
              strstr(kiln_errmsg(), "z_loss_coef"));
    json_t *j = json_pack("{s:i}", "stepz", 5);
    CHECK("a config file's key too", kiln_train_config_apply(&c, j, "'c.json'") == KILN_ERR_CONFIG &&
                                         strstr(kiln_errmsg(), "'c.json': unknown config key "
                                                               "'stepz' (did you mean 'steps'?)"));
    json_decref(j);
}

KILN_TEST(config_print_every_key_reads_back) {
    kiln_train_config c, back;
    kiln_train_config_default(&c);
    char *text = kiln_train_config_print_text(&c);
    if (!CHECK("printed", text)) return;
    static const char *const unset[] = {"n_features", "n_outputs", "val_from", "purge_time",
                                        "purge_rows"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(unset); i++) {
        char want[64];
        snprintf(want, sizeof want, "\"%s\": null", unset[i]);
        CHECK(want, strstr(text, want));
    }
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    kiln_train_config_default(&back);
    CHECK("--config of what --print-config printed is accepted",
          j && kiln_train_config_apply(&back, j, "printed") == KILN_OK);
    char *again = kiln_train_config_print_text(&back);
    CHECK("and prints the same", again && !strcmp(again, text));
    CHECK("val_from stays unset", back.val_from[0] == 0 && back.purge_rows == 0);
    json_decref(j);
    free(text);
    free(again);
}

/* cmd_inspect.c - kiln inspect: a .kiln archive's manifest and card. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "export.h"
#include "registry.h"

static int print_json(const json_t *j) {
    return cli_print_json(j, JSON_INDENT(2) | JSON_SORT_KEYS);
}

int cmd_inspect(int argc, char **argv) {
    bool as_json = false;
    const cli_opt opts[] = {
        {"json", CLI_FLAG, &as_json, NULL, "one JSON object: manifest, manifest_sha256, card",
         false},
        {0},
    };
    const cli_spec spec = {"kiln inspect FILE.kiln [--json]",
                           "Print an archive's manifest and card without extracting it.", opts, 1,
                           1};
    const char *file;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &file, &rc)) return rc;
    kiln_manifest *m = NULL;
    json_t *card = NULL, *mj = NULL, *all = NULL;
    kiln_err err = kiln_archive_inspect(file, &m, &card);
    if (err) return cli_fail(err);
    char mh[KILN_SHA256_HEX];
    kiln_hex(m->sha256, KILN_SHA256_BYTES, mh);
    mj = json_loadb(m->text, m->text_len, JSON_REJECT_DUPLICATES, NULL);
    if (!mj) {
        rc = cli_usage_error("out of memory");
    } else if (as_json) {
        all = json_pack("{s:O,s:s,s:O}", "card", card, "manifest_sha256", mh, "manifest", mj);
        rc = print_json(all);
    } else {
        printf(
            "archive:         %s\nname:            %s\nversion:         %s\ncreated:         %s\n",
            file, m->name, m->version, m->created);
        if (m->validation_present) {
            char vh[KILN_SHA256_HEX];
            kiln_hex(m->validation_sha256, KILN_SHA256_BYTES, vh);
            printf("validation:      %s (validation.json sha256 %s)\n",
                   m->validation_passed ? "passed" : "failed", vh);
        } else {
            printf("validation:      absent\n");
        }
        printf("manifest sha256: %s\n\nmanifest.json:\n", mh);
        rc = print_json(mj);
        if (!rc) {
            printf("\ncard.json:\n");
            rc = print_json(card);
        }
    }
    json_decref(all);
    json_decref(mj);
    json_decref(card);
    kiln_manifest_free(m);
    return rc;
}

/* cmd_pack.c - kiln pack, kiln unpack, kiln inspect: .kiln archives (export/export.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "export.h"
#include "registry.h"

int cmd_pack(int argc, char **argv) {
    const char *name = NULL, *version = NULL, *out = NULL;
    const cli_opt opts[] = {
        {"name", CLI_STR, &name, "NAME", "model name, [a-z0-9][a-z0-9._-]{0,63}", true},
        {"version", CLI_STR, &version, "VERSION",
         "version: [0-9A-Za-z.+_-]{1,64} beginning with a digit or with v and a digit (1.2.0, "
         "v2), never a channel's name",
         true},
        {"out", CLI_STR, &out, "FILE.kiln", "archive to write (atomically)", true},
        {0},
    };
    const cli_spec spec = {
        "kiln pack MODEL_DIR --name NAME --version VERSION --out FILE.kiln",
        "Pack a model directory into a reproducible .kiln archive: the same files give "
        "the same bytes.",
        opts, 1, 1};
    const char *dir;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &dir, &rc)) return rc;
    /* The registry's naming rule, said here rather than at publish: a version that reads as a
     * channel's name (production) would make NAME@production ambiguous, and no registry takes
     * it (docs/registry.md, "Names"). */
    if (kiln_export_version_ok(version) && !kiln_registry_looks_like_version(version))
        return cli_fail(kiln_registry_check_version(version));
    uint8_t digest[KILN_SHA256_BYTES];
    kiln_manifest *m = NULL;
    kiln_err err = kiln_archive_pack(dir, name, version, out, digest, &m);
    if (err) return cli_fail(err);
    char ah[KILN_SHA256_HEX], mh[KILN_SHA256_HEX];
    kiln_hex(digest, KILN_SHA256_BYTES, ah);
    kiln_hex(m->sha256, KILN_SHA256_BYTES, mh);
    printf("packed '%s': %s %s, %zu files, validation %s\n", out, m->name, m->version, m->nfiles,
           !m->validation_present ? "absent"
           : m->validation_passed ? "passed"
                                  : "failed");
    printf("archive sha256  %s\nmanifest sha256 %s\n", ah, mh);
    kiln_manifest_free(m);
    return 0;
}

int cmd_unpack(int argc, char **argv) {
    const char *out = NULL;
    kiln_archive_limits lim;
    kiln_archive_limits_default(&lim);
    uint64_t max_bytes = lim.max_total_bytes, max_entries = lim.max_entries,
             max_path = lim.max_path;
    const cli_opt opts[] = {
        {"out", CLI_STR, &out, "DIR", "directory to create (must not exist)", true},
        {"max-bytes", CLI_U64, &max_bytes, "N", "limit on the sum of entry sizes (default 64 GiB)",
         false},
        {"max-entries", CLI_U64, &max_entries, "N",
         "limit on the number of entries (default 10000)", false},
        {"max-path", CLI_U64, &max_path, "N", "limit on one entry's path in bytes (default 255)",
         false},
        {0},
    };
    const cli_spec spec = {
        "kiln unpack FILE.kiln --out DIR",
        "Unpack and check a .kiln archive: every file must match the manifest; DIR "
        "appears only if all of it does.",
        opts, 1, 1};
    const char *file;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &file, &rc)) return rc;
    lim.max_total_bytes = max_bytes;
    lim.max_entries = max_entries;
    lim.max_path = max_path;
    kiln_manifest *m = NULL;
    kiln_err err = kiln_archive_unpack(file, out, &lim, &m);
    if (err) return cli_fail(err);
    char mh[KILN_SHA256_HEX];
    kiln_hex(m->sha256, KILN_SHA256_BYTES, mh);
    printf("unpacked '%s' into '%s': %s %s, %zu files checked against the manifest\n", file, out,
           m->name, m->version, m->nfiles);
    printf("manifest sha256 %s\n", mh);
    kiln_manifest_free(m);
    return 0;
}

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

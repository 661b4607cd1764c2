/* cmd_pack.c - kiln pack: a model directory into a reproducible .kiln archive (export/export.h). */
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

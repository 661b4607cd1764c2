/* cmd_unpack.c - kiln unpack: unpack a .kiln archive, every file checked. */
#include <stdio.h>

#include "cli.h"
#include "core.h"
#include "export.h"

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

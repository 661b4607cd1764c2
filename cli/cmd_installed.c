/* cmd_installed.c - kiln installed: check what a pull installed, without a registry. */
#include <stdio.h>

#include "cli.h"
#include "core.h"
#include "registry.h"

/* What a pull installed, checked on its host without a registry. */
int cmd_installed(int argc, char **argv) {
    const char *trust = NULL, *dir = NULL, *state = NULL;
    const cli_opt opts[] = {
        {"dir", CLI_STR, &dir, "DIR", "the model directory a pull (or kiln_watch) installed", true},
        {"trust", CLI_STR, &trust, "FILE", "trust policy (trust.json) it must meet", true},
        {"state", CLI_STR, &state, "DIR",
         "the state of the pull that installed it (default ~/.local/state/kiln)", false},
        {0},
    };
    const cli_spec spec = {
        "kiln installed NAME@CHANNEL --dir DIR --trust FILE [--state DIR]",
        "Check, without a registry, that DIR is what the last pull of NAME@CHANNEL installed "
        "and still verifies: the channel record it accepted (signatures, seq, expiry), the "
        "release signatures over its manifest, every file. Exit 0 verified, 1 not.",
        opts, 1, 1};
    const char *ref;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &ref, &rc)) return rc;
    kiln_registry_installed in;
    kiln_err e = kiln_registry_installed_verify(trust, state, ref, dir, &in);
    if (e) return cli_fail(e);
    char when[21];
    kiln_format_time(in.expires, when);
    int64_t left = in.expires - kiln_unix_time();
    printf("installed   %s@%s in '%s'\n", in.model, in.version, dir);
    printf("channel     %s seq %lld, the record this client accepted last; expires %s (in %lld "
           "d %lld h)\n",
           in.channel, (long long)in.seq, when, (long long)(left / 86400),
           (long long)(left % 86400 / 3600));
    printf("archive     %s, signed by %s\n", in.digest, in.signed_by);
    printf("files       %zu, %llu bytes, as manifest sha256:%s says\n", in.files,
           (unsigned long long)in.bytes, in.manifest_sha256);
    printf("verified    under trust policy version %llu, without a registry\n",
           (unsigned long long)in.trust_version);
    return 0;
}

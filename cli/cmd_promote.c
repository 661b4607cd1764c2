/* cmd_promote.c - kiln promote: point a registry channel at a version. */
#include <stdio.h>

#include "cli.h"
#include "core.h"

int cmd_promote(int argc, char **argv) {
    cli_chan_args a = {0};
    const cli_opt opts[] = {
        {"channel", CLI_STR, &a.channel, "C", "the channel (production, staging, ...)", true},
        {"key", CLI_STR, &a.key, "KEY", "a promote key (minisign secret key)", true},
        {"registry", CLI_STR, &a.url, "URL", "the registry", true},
        {"token", CLI_STR, &a.token, "T", "a promote token (default $KILN_REGISTRY_TOKEN)", false},
        {"expires", CLI_STR, &a.expires, "DUR",
         "how long the record holds: 30d (default), 12h, 90m, 3600s", false},
        {"reason", CLI_STR, &a.reason, "TEXT", "why (default 'promote')", false},
        {"digest", CLI_STR, &a.digest, "SHA256",
         "refuse unless the registry holds the version with this digest", false},
        {"out", CLI_STR, &a.out, "REC.json",
         "write the signed record here instead of putting it (to co-sign)", false},
        {0},
    };
    cli_spec spec = {
        "kiln promote NAME VERSION --channel C --key KEY --registry URL [--token T]",
        "Point a channel at a version: fetch its record, sign the next one (seq+1) and put it.",
        opts, 2, 2};
    const char *pos[2];
    int rc;
    if (!cli_parse_args(&spec, argc, argv, pos, &rc)) return rc;
    return cli_next_record(&a, pos[0], pos[1], a.reason ? a.reason : "promote");
}

/* cmd_rollback.c - kiln rollback: point a registry channel back at an older version. */
#include <stdio.h>

#include "cli.h"
#include "core.h"
#include "registry.h"

int cmd_rollback(int argc, char **argv) {
    cli_chan_args a = {0};
    const char *to = NULL, *trust = NULL, *state = NULL;
    const cli_opt opts[] = {
        {"channel", CLI_STR, &a.channel, "C", "the channel", true},
        {"to", CLI_STR, &to, "VERSION", "the version to go back to (default: the one before)",
         false},
        {"trust", CLI_STR, &trust, "FILE",
         "find the version (the one before, or --to's) in the history's records verified under "
         "this trust policy, and pin its digest (without: the registry's word)",
         false},
        {"state", CLI_STR, &state, "DIR",
         "with --trust: the current record may not be older than the seq this client accepted",
         false},
        {"key", CLI_STR, &a.key, "KEY", "a promote key", true},
        {"registry", CLI_STR, &a.url, "URL", "the registry", true},
        {"token", CLI_STR, &a.token, "T", "a promote token (default $KILN_REGISTRY_TOKEN)", false},
        {"expires", CLI_STR, &a.expires, "DUR", "how long the record holds (default 30d)", false},
        {"out", CLI_STR, &a.out, "REC.json", "write the signed record here instead of putting it",
         false},
        {0},
    };
    cli_spec spec = {
        "kiln rollback NAME --channel C [--to VERSION] [--trust FILE [--state DIR]] --key KEY "
        "--registry URL [--token T]",
        "Point a channel back at an older version with a new record (seq+1, reason 'rollback').",
        opts, 1, 1};
    const char *name;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &name, &rc)) return rc;
    char model[KILN_REGISTRY_NAME_MAX + 1], target[KILN_REGISTRY_NAME_MAX + 1] = "";
    snprintf(model, sizeof model, "%s", name);
    if (kiln_registry_check_name("model", model) || kiln_registry_check_channel(a.channel))
        return cli_fail(KILN_ERR_USAGE);
    if (state && !trust) return cli_usage_error("--state goes with --trust");
    kiln_digest digest = "";
    if (to && !trust) {
        snprintf(target, sizeof target, "%s", to);
    } else {
        kiln_registry_client_opts c;
        cli_client_opts(&c, a.url, a.token, NULL);
        kiln_err e = trust ? kiln_registry_previous_version_verified(
                                 &c, model, a.channel, to, trust, state, target, digest)
                           : kiln_registry_previous_version(&c, model, a.channel, target);
        if (e) return cli_fail(e);
        if (digest[0]) a.digest = digest; /* the verified record's, not the registry's word */
    }
    return cli_next_record(&a, model, target, "rollback");
}

/* cmd_renew.c - kiln renew: re-sign a channel's current version with a new expiry. */
#include <stdio.h>

#include "cli.h"
#include "core.h"
#include "registry.h"
#include "sign.h"

int cmd_renew(int argc, char **argv) {
    cli_chan_args a = {0};
    const char *trust = NULL, *state = NULL;
    const cli_opt opts[] = {
        {"channel", CLI_STR, &a.channel, "C", "the channel", true},
        {"key", CLI_STR, &a.key, "KEY", "a promote key", true},
        {"registry", CLI_STR, &a.url, "URL", "the registry", true},
        {"trust", CLI_STR, &trust, "FILE",
         "the trust policy the current record must verify under (walked as a pull walks it)", true},
        {"state", CLI_STR, &state, "DIR",
         "this client's state: the current record may not be older than the seq it accepted "
         "(default ~/.local/state/kiln)",
         false},
        {"token", CLI_STR, &a.token, "T", "a promote token (default $KILN_REGISTRY_TOKEN)", false},
        {"expires", CLI_STR, &a.expires, "DUR", "how long the new record holds (default 30d)",
         false},
        {"out", CLI_STR, &a.out, "REC.json", "write the signed record here instead of putting it",
         false},
        {0},
    };
    cli_spec spec = {"kiln renew NAME --channel C --key KEY --registry URL --trust FILE [--state "
                     "DIR] [--expires 30d] [--out REC.json]",
                     "Re-sign a channel's current version with a new expiry (seq+1, reason "
                     "'renew'), after verifying its current record.",
                     opts, 1, 1};
    const char *name;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &name, &rc)) return rc;
    int64_t secs;
    kiln_sign_seckey *sk;
    int status = cli_chan_signing(&a, &secs, &sk);
    if (status >= 0) return status;
    kiln_registry_client_opts c;
    cli_client_opts(&c, a.url, a.token, NULL);
    const kiln_sign_seckey *keys[] = {sk};
    kiln_registry_renew_opts o = {.model = name,
                                  .channel = a.channel,
                                  .trust = trust,
                                  .state = state,
                                  .keys = keys,
                                  .nkeys = 1,
                                  .expires_in = secs,
                                  .save_to = a.out};
    kiln_registry_promoted res;
    char version[KILN_REGISTRY_NAME_MAX + 1], was[21];
    int64_t was_expires;
    kiln_err e = kiln_registry_renew(&c, &o, &res, version, &was_expires);
    kiln_sign_seckey_free(sk);
    if (e) return cli_fail(e);
    kiln_format_time(was_expires, was);
    printf("%s/%s -> %s (%s) seq %llu, reason 'renew' (the record it renews, seq %llu, %s %s)\n",
           name, a.channel, version, res.digest, (unsigned long long)res.seq,
           (unsigned long long)res.seq - 1, was_expires <= kiln_unix_time() ? "expired" : "expires",
           was);
    if (a.out)
        printf("wrote %s, 1 signature: add signatures with 'kiln channel sign --add %s --key KEY', "
               "then 'kiln channel put %s --registry URL'\n",
               a.out, a.out, a.out);
    return 0;
}

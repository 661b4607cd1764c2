/* next_record.c - what promote, rollback and renew share: signing a channel's next record
 * and putting it (or writing it out for more signatures). */
#include <stdio.h>

#include "cli.h"
#include "core.h"
#include "registry.h"
#include "sign.h"

int cli_chan_signing(const cli_chan_args *a, int64_t *secs, kiln_sign_seckey **sk) {
    *secs = 30 * 86400;
    *sk = NULL;
    if (a->expires && !cli_parse_secs(a->expires, secs))
        return cli_usage_error("--expires '%s' is not a duration like 30d, 12h, 90m or 3600s",
                               a->expires);
    kiln_err rc = cli_load_seckey(a->key, sk);
    return rc ? cli_fail(rc) : -1;
}

int cli_next_record(const cli_chan_args *a, const char *model, const char *version,
                    const char *reason) {
    kiln_registry_client_opts c;
    cli_client_opts(&c, a->url, a->token, NULL);
    int64_t secs;
    kiln_sign_seckey *sk;
    int status = cli_chan_signing(a, &secs, &sk);
    if (status >= 0) return status;
    const kiln_sign_seckey *keys[] = {sk};
    kiln_registry_promote_opts o = {.model = model,
                                    .channel = a->channel,
                                    .version = version,
                                    .keys = keys,
                                    .nkeys = 1,
                                    .expires_in = secs,
                                    .reason = reason,
                                    .digest = a->digest,
                                    .save_to = a->out};
    kiln_registry_promoted res;
    kiln_err rc = kiln_registry_promote(&c, &o, &res);
    kiln_sign_seckey_free(sk);
    if (rc) return cli_fail(rc);
    if (a->out)
        printf("wrote %s: %s/%s -> %s (%s) seq %llu, 1 signature\n"
               "add signatures with 'kiln channel sign --add %s --key KEY', then 'kiln channel put "
               "%s --registry URL'\n",
               a->out, model, a->channel, version, res.digest, (unsigned long long)res.seq, a->out,
               a->out);
    else
        printf("%s/%s -> %s (%s) seq %llu, reason '%s'\n", model, a->channel, version, res.digest,
               (unsigned long long)res.seq, reason);
    return 0;
}

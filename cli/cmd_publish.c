/* cmd_publish.c - kiln publish: upload a signed .kiln archive to a registry. */
#include <stdio.h>

#include "cli.h"
#include "core.h"
#include "registry.h"

int cmd_publish(int argc, char **argv) {
    const char *url = NULL, *token = NULL, *sig = NULL;
    const cli_opt opts[] = {
        {"registry", CLI_STR, &url, "URL", "the registry, e.g. http://127.0.0.1:8080", true},
        {"token", CLI_STR, &token, "TOKEN", "a publish token (default $KILN_REGISTRY_TOKEN)",
         false},
        {"sig", CLI_STR, &sig, "FILE", "the archive's signature (default ARCHIVE.minisig)", false},
        {0},
    };
    cli_spec spec = {"kiln publish ARCHIVE --registry URL [--token T]",
                     "Upload a signed .kiln archive as the name@version its manifest gives.", opts,
                     1, 1};
    const char *archive;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &archive, &rc)) return rc;
    cli_bar b = {-1, "uploading"};
    kiln_registry_client_opts c;
    cli_client_opts(&c, url, token, &b);
    kiln_registry_published out;
    kiln_err e = kiln_registry_publish(&c, archive, sig, &out);
    if (e) return cli_fail(e);
    printf("%s %s (%llu bytes)\n", out.existed ? "already stored:" : "published:", out.digest,
           (unsigned long long)out.size);
    return 0;
}

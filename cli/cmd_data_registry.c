/* cmd_data_registry.c - kiln data publish | pull: datasets in a registry, signed by a release
 * key and named by the sha256 of their bytes (docs/registry.md, "Datasets"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "data.h"
#include "registry.h"
#include "sign.h"

int cmd_data_publish(int argc, char **argv) {
    const char *name = NULL, *url = NULL, *token = NULL, *key = NULL;
    const cli_opt opts[] = {
        {"name", CLI_STR, &name, "NAME", "the dataset's name in the registry", true},
        {"registry", CLI_STR, &url, "URL", "the registry", true},
        {"key", CLI_STR, &key, "KEY", "a release key of the registry's trust policy", true},
        {"token", CLI_STR, &token, "TOKEN", "a publish token (default $KILN_REGISTRY_TOKEN)",
         false},
        {0},
    };
    cli_spec spec = {"kiln data publish DATA --name NAME --registry URL --key KEY [--token T]",
                     "Sign a dataset with a release key and upload it, named by the sha256 that "
                     "'kiln data inspect' prints and cards record.",
                     opts, 1, 1};
    const char *path;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &path, &rc)) return rc;
    kiln_err e = kiln_registry_check_name("dataset", name);
    if (e) return cli_fail(e);
    /* A dataset kiln reads (every check of kiln train's loader), and its digest. */
    kiln_dataset *ds = NULL;
    if ((e = kiln_dataset_open(path, &ds))) return cli_fail(e);
    char hex[KILN_SHA256_HEX];
    snprintf(hex, sizeof hex, "%s", ds->sha256);
    kiln_dataset_free(ds);
    kiln_sign_seckey *sk = NULL;
    if ((e = cli_load_seckey(key, &sk))) return cli_fail(e);
    char *comment = kiln_registry_data_comment(name, hex), *sig = NULL;
    e = comment ? kiln_sign_file(sk, path, comment, &sig)
                : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_sign_seckey_free(sk);
    free(comment);
    if (e) return cli_fail(e);
    cli_bar b = {-1, "uploading"};
    kiln_registry_client_opts c;
    cli_client_opts(&c, url, token, &b);
    kiln_registry_published out;
    e = kiln_registry_data_publish(&c, path, name, sig, strlen(sig), &out);
    free(sig);
    if (e) return cli_fail(e);
    printf("%s dataset %s@%s (%llu bytes)\n", out.existed ? "already stored:" : "published:", name,
           out.digest, (unsigned long long)out.size);
    return 0;
}

int cmd_data_pull(int argc, char **argv) {
    const char *url = NULL, *token = NULL, *trust = NULL, *out = NULL;
    const cli_opt opts[] = {
        {"registry", CLI_STR, &url, "URL", "the registry", true},
        {"trust", CLI_STR, &trust, "FILE", "trust policy: a release key must have signed it", true},
        {"out", CLI_STR, &out, "FILE", "where the verified dataset goes (a new file)", true},
        {"token", CLI_STR, &token, "TOKEN", "a read token (default $KILN_REGISTRY_TOKEN)", false},
        {0},
    };
    cli_spec spec = {"kiln data pull NAME@sha256:HEX --registry URL --trust FILE --out FILE",
                     "Download a dataset by its digest, verify it (digest, signature, name) and "
                     "only then put it at --out.",
                     opts, 1, 1};
    const char *ref;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &ref, &rc)) return rc;
    const char *at = strchr(ref, '@');
    if (!at || strncmp(at + 1, "sha256:", 7) || at == ref ||
        (size_t)(at - ref) > KILN_REGISTRY_NAME_MAX)
        return cli_usage_error("'%s' is not NAME@sha256:<64 hex digits>", ref);
    char name[KILN_REGISTRY_NAME_MAX + 1];
    snprintf(name, sizeof name, "%.*s", (int)(at - ref), ref);
    cli_bar b = {-1, "downloading"};
    kiln_registry_client_opts c;
    cli_client_opts(&c, url, token, &b);
    kiln_registry_data_pulled res;
    kiln_err e = kiln_registry_data_pull(&c, name, at + 8, trust, out, &res);
    if (e) return cli_fail(e);
    printf("pulled dataset %s@%s (%llu bytes) into '%s'\nsigned by %s\n", res.name, res.digest,
           (unsigned long long)res.size, out, res.signed_by);
    return 0;
}

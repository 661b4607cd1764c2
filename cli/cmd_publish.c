/* cmd_publish.c - kiln publish | pull | promote | rollback: the registry's client side. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "registry.h"

typedef struct bar {
    int last;
    const char *what;
} bar;

/* A progress bar on stderr when it is a terminal. */
static int draw_bar(void *ctx, uint64_t done, uint64_t total) {
    bar *b = ctx;
    if (!total) return 0;
    int pct = (int)(done * 100 / total);
    if (pct == b->last) return 0;
    b->last = pct;
    int fill = pct * 30 / 100;
    fprintf(stderr, "\r%s [%.*s%*s] %3d%% %.1f/%.1f MiB", b->what, fill, "##############################", 30 - fill, "",
            pct, (double)done / 1048576.0, (double)total / 1048576.0);
    if (pct == 100) fputc('\n', stderr);
    return 0;
}

static void client_opts(kiln_registry_client_opts *c, const char *url, const char *token, bar *b) {
    memset(c, 0, sizeof *c);
    c->url = url;
    c->token = token ? token : getenv("KILN_REGISTRY_TOKEN");
    c->retries = -1;
    if (isatty(2)) {
        c->progress = draw_bar;
        c->progress_ctx = b;
    }
}

int cmd_publish(int argc, char **argv) {
    const char *url = NULL, *token = NULL, *sig = NULL;
    const cli_opt opts[] = {
        {"registry", CLI_STR, &url, "URL", "the registry, e.g. http://127.0.0.1:8080", true},
        {"token", CLI_STR, &token, "TOKEN", "a publish token (default $KILN_REGISTRY_TOKEN)", false},
        {"sig", CLI_STR, &sig, "FILE", "the archive's signature (default ARCHIVE.minisig)", false},
        {0},
    };
    cli_spec spec = {"kiln publish ARCHIVE --registry URL [--token T]",
                     "Upload a signed .kiln archive as the name@version its manifest gives.", opts, 1, 1};
    char **pos;
    int npos, rc = cli_parse(&spec, argc, argv, &pos, &npos);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    const char *archive = pos[0];
    free(pos);
    bar b = {-1, "uploading"};
    kiln_registry_client_opts c;
    client_opts(&c, url, token, &b);
    kiln_registry_published out;
    kiln_err e = kiln_registry_publish(&c, archive, sig, &out);
    if (e) return cli_fail(e);
    printf("%s %s (%llu bytes)\n", out.existed ? "already stored:" : "published:", out.digest,
           (unsigned long long)out.size);
    return 0;
}

int cmd_pull(int argc, char **argv) {
    const char *url = NULL, *token = NULL, *trust = NULL, *out_dir = NULL, *state = NULL;
    const cli_opt opts[] = {
        {"registry", CLI_STR, &url, "URL", "the registry", true},
        {"token", CLI_STR, &token, "TOKEN", "a read token (default $KILN_REGISTRY_TOKEN)", false},
        {"trust", CLI_STR, &trust, "FILE", "trust policy (trust.json) the model must meet", true},
        {"out", CLI_STR, &out_dir, "DIR", "where the verified model directory goes", true},
        {"state", CLI_STR, &state, "DIR", "anti-rollback state (default ~/.local/state/kiln)", false},
        {0},
    };
    cli_spec spec = {"kiln pull NAME@CHANNEL|NAME@VERSION --registry URL --trust FILE --out DIR [--state DIR]",
                     "Download a model, verify everything (channel record, seq, expiry, digest, signatures, "
                     "every file) and only then put it at DIR.",
                     opts, 1, 1};
    char **pos;
    int npos, rc = cli_parse(&spec, argc, argv, &pos, &npos);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    const char *ref = pos[0];
    free(pos);
    bar b = {-1, "downloading"};
    kiln_registry_client_opts c;
    client_opts(&c, url, token, &b);
    kiln_registry_pull_opts p = {.ref = ref, .trust = trust, .out = out_dir, .state = state};
    kiln_registry_pulled res;
    kiln_err e = kiln_registry_pull(&c, &p, &res);
    if (e) return cli_fail(e);
    if (res.channel[0])
        printf("pulled %s@%s (channel %s, seq %lld) %s into '%s'\n", res.model, res.version, res.channel,
               (long long)res.seq, res.digest, out_dir);
    else
        printf("pulled %s@%s %s into '%s'\n", res.model, res.version, res.digest, out_dir);
    return 0;
}

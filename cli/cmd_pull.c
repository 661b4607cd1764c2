/* cmd_pull.c - kiln pull: download a model from a registry (or its mirrors) and verify it. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "registry.h"

/* SIGINT or SIGTERM during a pull: the transfer is cut (the progress hook says so within a
 * second), the pull fails and removes its partial download; a second signal kills. */
static volatile sig_atomic_t pull_signal;

static void on_pull_signal(int sig) {
    pull_signal = sig;
}

static int pull_progress(void *ctx, uint64_t done, uint64_t total) {
    if (pull_signal) return 1;
    return ctx ? cli_draw_bar(ctx, done, total) : 0;
}

int cmd_pull(int argc, char **argv) {
    const char *trust = NULL, *out_dir = NULL, *state = NULL;
    cli_registries r = {0};
    const cli_opt opts[] = {
        {"registry", CLI_MULTI, &r.urls, "URL",
         "the registry; repeat it for mirrors, tried in order (the newest channel record wins)",
         true},
        {"token", CLI_STR, &r.token, "TOKEN", "a read token (default $KILN_REGISTRY_TOKEN)", false},
        {"trust", CLI_STR, &trust, "FILE", "trust policy (trust.json) the model must meet", true},
        {"out", CLI_STR, &out_dir, "DIR", "where the verified model directory goes", true},
        {"state", CLI_STR, &state, "DIR", "anti-rollback state (default ~/.local/state/kiln)",
         false},
        CLI_TIMEOUT_OPT(&r.timeout),
        CLI_LIMIT_OPTS(&r.max_size, &r.min_rate, &r.deadline),
        {0},
    };
    cli_spec spec = {
        "kiln pull NAME@CHANNEL|NAME@VERSION --registry URL [--registry MIRROR]... --trust FILE "
        "--out DIR [--state DIR] [--timeout 5s] [--max-size 16G] [--min-rate 16K] "
        "[--deadline 1h]",
        "Download a model, verify everything (channel record, seq, expiry, digest, signatures, "
        "every file) and only then put it at DIR.",
        opts, 1, 1};
    const char *ref;
    int rc;
    if (!cli_registry_args(&spec, argc, argv, &ref, &r, true, &rc)) return rc;
    for (size_t i = 0; i < r.n; i++) {
        r.cs[i].progress_ctx = r.cs[i].progress ? r.cs[i].progress_ctx : NULL;
        r.cs[i].progress = pull_progress;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_pull_signal;
    sa.sa_flags = SA_RESETHAND; /* the second one kills */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    kiln_registry_pull_opts p = {.ref = ref, .trust = trust, .out = out_dir, .state = state};
    kiln_registry_pulled res;
    kiln_err e = kiln_registry_pull_any(r.cs, r.n, &p, cli_print_note, NULL, &res);
    bool several = r.n > 1;
    cli_registries_release(&r);
    if (e && pull_signal) {
        fprintf(stderr,
                "kiln: error: pull stopped by %s; nothing installed, its download removed\n",
                pull_signal == SIGINT ? "SIGINT" : "SIGTERM");
        return 2;
    }
    if (e) return cli_fail(e);
    /* With several registries the line says which served it (and the record, when that was
     * another). */
    char from[1100] = "";
    if (several && res.record_from[0])
        snprintf(from, sizeof from, " from %s (record from %s)", res.registry, res.record_from);
    else if (several)
        snprintf(from, sizeof from, " from %s", res.registry);
    if (res.channel[0])
        printf("pulled %s@%s (channel %s, seq %lld) %s into '%s'%s\n", res.model, res.version,
               res.channel, (long long)res.seq, res.digest, out_dir, from);
    else
        printf("pulled %s@%s %s into '%s'%s\n", res.model, res.version, res.digest, out_dir, from);
    printf("signed by %s\n", res.signed_by);
    return 0;
}

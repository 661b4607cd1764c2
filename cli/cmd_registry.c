/* cmd_registry.c - kiln registry serve | token create | fsck | gc. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "registry.h"

int cmd_registry_serve(int argc, char **argv) {
    const char *root = NULL, *listen = NULL, *trust = NULL;
    bool read_required = false;
    long threads = 4;
    const cli_opt opts[] = {
        {"root", CLI_STR, &root, "DIR", "the registry's store (created if missing)", true},
        {"listen", CLI_STR, &listen, "HOST:PORT",
         "address to listen on, e.g. 127.0.0.1:8080 (port 0: any free one)", true},
        {"trust", CLI_STR, &trust, "FILE",
         "trust policy (trust.json) that uploads and channel records must meet", false},
        {"read-token-required", CLI_FLAG, &read_required, NULL, "reads need a token too", false},
        {"threads", CLI_INT, &threads, "N", "worker threads (default 4)", false},
        {0},
    };
    const cli_spec spec = {"kiln registry serve --root DIR --listen HOST:PORT [options]",
                           "Serve a model registry over HTTP until SIGTERM or SIGINT.", opts, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) return rc;
    if (threads < 1 || threads > 256) return cli_usage_error("--threads must be between 1 and 256");
    /* Block the stop signals before any thread starts, so that only sigwait sees them. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    kiln_registry_server_opts o = {.root = root,
                                   .listen = listen,
                                   .trust = trust,
                                   .read_token_required = read_required,
                                   .threads = (unsigned)threads};
    kiln_registry_server *srv;
    kiln_err e = kiln_registry_server_start(&o, &srv);
    if (e) return cli_fail(e);
    const char *host = listen;
    const char *colon = strrchr(listen, ':');
    printf("kiln registry: serving '%s' on http://%.*s:%u%s\n", root, (int)(colon - host), host,
           (unsigned)kiln_registry_server_port(srv),
           trust ? "" : " (no trust policy: uploads are refused)");
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "kiln registry: %s received, finishing requests in flight\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM");
    kiln_registry_server_stop(srv, 30000);
    fprintf(stderr, "kiln registry: stopped\n");
    return 0;
}

int cmd_registry_token(int argc, char **argv) {
    const char *root = NULL, *name = NULL, *scope = NULL;
    const cli_opt opts[] = {
        {"root", CLI_STR, &root, "DIR", "the registry's store", true},
        {"name", CLI_STR, &name, "NAME", "the token's name, recorded in the audit log", true},
        {"scope", CLI_STR, &scope, "SCOPE", "read, publish, promote or admin", true},
        {0},
    };
    const cli_spec spec = {
        "kiln registry token create --root DIR --name NAME --scope read|publish|promote|admin",
        "Create a token and print it once; the registry keeps only its sha256.", opts, 1, 1};
    const char *action;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &action, &rc)) return rc;
    if (strcmp(action, "create"))
        return cli_usage_error("unknown 'registry token' action (only 'create')");
    kiln_registry_scope sc;
    if (!kiln_registry_scope_parse(scope, &sc))
        return cli_usage_error("--scope '%s' is not one of read, publish, promote, admin", scope);
    char *token;
    kiln_err e = kiln_registry_token_create(root, name, sc, &token);
    if (e) return cli_fail(e);
    printf("%s\n", token);
    free(token);
    return 0;
}

static void print_problem(void *ctx, const char *problem) {
    (void)ctx;
    printf("problem: %s\n", problem);
}

int cmd_registry_fsck(int argc, char **argv) {
    const char *root = NULL, *trust = NULL;
    const cli_opt opts[] = {
        {"root", CLI_STR, &root, "DIR", "the registry's store", true},
        {"trust", CLI_STR, &trust, "FILE",
         "trust policy for channel records (default DIR/trust.json)", false},
        {0},
    };
    const cli_spec spec = {
        "kiln registry fsck --root DIR [--trust FILE]",
        "Check that every version's blob exists and hashes to its digest, that no "
        "temporaries are orphaned, and that channel records verify.",
        opts, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) return rc;
    size_t problems = 0;
    kiln_err e = kiln_registry_fsck(root, trust, print_problem, NULL, &problems);
    if (e) return cli_fail(e);
    printf("ok: '%s' is consistent\n", root);
    return 0;
}

int cmd_registry_gc(int argc, char **argv) {
    const char *root = NULL;
    const cli_opt opts[] = {{"root", CLI_STR, &root, "DIR", "the registry's store", true}, {0}};
    const cli_spec spec = {"kiln registry gc --root DIR",
                           "Remove blobs that no version references (the server must be stopped).",
                           opts, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) return rc;
    size_t removed;
    uint64_t bytes;
    kiln_err e = kiln_registry_gc(root, &removed, &bytes);
    if (e) return cli_fail(e);
    printf("removed %zu unreferenced blob%s (%llu bytes)\n", removed, removed == 1 ? "" : "s",
           (unsigned long long)bytes);
    return 0;
}

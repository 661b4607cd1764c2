/* cmd_registry.c - kiln registry serve | token create, list, revoke | fsck | gc. */
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "registry.h"

int cmd_registry_serve(int argc, char **argv) {
    const char *root = NULL, *listen = NULL, *trust = NULL, *cert = NULL, *key = NULL;
    bool read_required = false;
    long threads = 4, max_conn = -1, per_ip = 64; /* -1: not given (4096, said nothing of) */
    long header_timeout = KILN_REGISTRY_HEADER_TIMEOUT_S,
         idle_timeout = KILN_REGISTRY_IDLE_TIMEOUT_S;
    const cli_opt opts[] = {
        {"root", CLI_STR, &root, "DIR", "the registry's store (created if missing)", true},
        {"listen", CLI_STR, &listen, "HOST:PORT",
         "address to listen on, e.g. 127.0.0.1:8080 (port 0: any free one)", true},
        {"trust", CLI_STR, &trust, "FILE",
         "trust policy (trust.json) that uploads and channel records must meet", false},
        {"read-token-required", CLI_FLAG, &read_required, NULL, "reads need a token too", false},
        {"threads", CLI_INT, &threads, "N", "worker threads (default 4)", false},
        {"max-connections", CLI_INT, &max_conn, "N", "open connections at most (default 4096)",
         false},
        {"per-ip-connections", CLI_INT, &per_ip, "N",
         "open connections from one client address at most (default 64; 0: no limit, e.g. "
         "behind a proxy)",
         false},
        {"tls-cert", CLI_STR, &cert, "FILE", "serve HTTPS with this PEM certificate (chain)",
         false},
        {"tls-key", CLI_STR, &key, "FILE", "... and its PEM private key", false},
        {"header-timeout", CLI_INT, &header_timeout, "SECONDS",
         "close a connection silent this long before its request head is complete (default 10)",
         false},
        {"idle-timeout", CLI_INT, &idle_timeout, "SECONDS",
         "close a connection silent this long during a request or kept alive (default 120)",
         false},
        {0},
    };
    const cli_spec spec = {"kiln registry serve --root DIR --listen HOST:PORT [options]",
                           "Serve a model registry over HTTP until SIGTERM or SIGINT.", opts, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) return rc;
    if (threads < 1 || threads > 256) return cli_usage_error("--threads must be between 1 and 256");
    if (max_conn != -1 && (max_conn < 1 || max_conn > 1000000))
        return cli_usage_error("--max-connections must be between 1 and 1000000");
    if (per_ip < 0 || per_ip > 1000000)
        return cli_usage_error("--per-ip-connections must be between 0 (no limit) and 1000000");
    if (header_timeout < 1 || header_timeout > 86400 || idle_timeout < 1 || idle_timeout > 86400)
        return cli_usage_error("--header-timeout and --idle-timeout must be between 1 and 86400 "
                               "seconds");
    /* Room for the connections: the soft descriptor limit raised as far as the hard one
     * allows (the server warns if that is still too few). */
    struct rlimit rl;
    const rlim_t want =
        (rlim_t)(max_conn > 0 ? (unsigned long)max_conn : KILN_REGISTRY_MAX_CONNECTIONS) +
        KILN_REGISTRY_SPARE_FDS;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < want && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want ? rl.rlim_max : want;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
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
                                   .threads = (unsigned)threads,
                                   .max_connections = max_conn > 0 ? (unsigned)max_conn : 0,
                                   .per_ip_connections =
                                       per_ip ? (unsigned)per_ip : KILN_REGISTRY_NO_LIMIT,
                                   .tls_cert = cert,
                                   .tls_key = key,
                                   .header_timeout_s = (unsigned)header_timeout,
                                   .idle_timeout_s = (unsigned)idle_timeout};
    kiln_registry_server *srv;
    kiln_err e = kiln_registry_server_start(&o, &srv);
    if (e) return cli_fail(e);
    const char *host = listen;
    const char *colon = strrchr(listen, ':');
    printf("kiln registry: serving '%s' on http%s://%.*s:%u%s\n", root, cert ? "s" : "",
           (int)(colon - host), host,
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

static int token_create(int argc, char **argv) {
    const char *root = NULL, *name = NULL, *scope = NULL, *expires = NULL;
    const cli_opt opts[] = {
        {"root", CLI_STR, &root, "DIR", "the registry's store (created if missing)", true},
        {"name", CLI_STR, &name, "NAME", "the token's name, recorded in the audit log", true},
        {"scope", CLI_STR, &scope, "SCOPE", "read, publish, promote or admin", true},
        {"expires", CLI_STR, &expires, "DUR|TIME",
         "90d, 12h, 90m, 3600s or 2026-12-31T00:00:00Z (default: never)", false},
        {0},
    };
    const cli_spec spec = {"kiln registry token create --root DIR --name NAME --scope "
                           "read|publish|promote|admin [--expires DUR|TIME]",
                           "Create a token and print it once; the registry keeps only its sha256.",
                           opts, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) return rc;
    kiln_registry_scope sc;
    if (!kiln_registry_scope_parse(scope, &sc))
        return cli_usage_error("--scope '%s' is not one of read, publish, promote, admin", scope);
    int64_t until = 0, now = kiln_unix_time();
    if (expires) {
        kiln_err e = cli_parse_expiry(expires, now, &until);
        if (e) return cli_fail(e);
        if (until <= now) return cli_usage_error("--expires: '%s' is in the past", expires);
    }
    char *token;
    kiln_err e = kiln_registry_token_create_until(root, name, sc, until, &token);
    if (e) return cli_fail(e);
    printf("%s\n", token);
    free(token);
    return 0;
}

/* A time, or "never" for 0. */
static const char *when(int64_t t, char buf[21]) {
    if (!t) return "never";
    kiln_format_time(t, buf);
    return buf;
}

static int token_list(int argc, char **argv) {
    const char *root = NULL;
    bool as_json = false;
    const cli_opt opts[] = {
        {"root", CLI_STR, &root, "DIR", "the registry's store", true},
        {"json", CLI_FLAG, &as_json, NULL, "print JSON instead of a table", false},
        {0},
    };
    const cli_spec spec = {"kiln registry token list --root DIR [--json]",
                           "List the store's tokens: scope, created, expires, state (active, "
                           "expired, revoked) and last use. Never prints a token or its hash.",
                           opts, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) return rc;
    kiln_registry_token_info *t;
    size_t n;
    kiln_err e = kiln_registry_token_list(root, &t, &n);
    if (e) return cli_fail(e);
    int64_t now = kiln_unix_time();
    if (as_json) {
        json_t *j = kiln_registry_token_json(t, n, now);
        free(t);
        int status = cli_print_json(j, JSON_INDENT(2) | JSON_SORT_KEYS);
        json_decref(j);
        return status;
    }
    int w = 4;
    for (size_t i = 0; i < n; i++)
        if ((int)strlen(t[i].name) > w) w = (int)strlen(t[i].name);
    printf("%-*s  %-7s  %-20s  %-20s  %-20s  %s\n", w, "name", "scope", "created", "expires",
           "last used", "state");
    for (size_t i = 0; i < n; i++) {
        char c[21], x[21], u[21], r[21];
        kiln_registry_token_state st = kiln_registry_token_state_at(&t[i], now);
        printf("%-*s  %-7s  %-20s  %-20s  %-20s  %s", w, t[i].name, t[i].scope,
               when(t[i].created, c), when(t[i].expires, x), when(t[i].last_used, u),
               kiln_registry_token_state_name(st));
        if (st == KILN_TOKEN_REVOKED) printf(" %s", when(t[i].revoked, r));
        if (st == KILN_TOKEN_REVOKED && t[i].reason[0]) {
            /* The reason as text on one line, whatever the database holds. */
            for (char *p = t[i].reason; *p; p++)
                if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
            printf(": %s", t[i].reason);
        }
        putchar('\n');
    }
    free(t);
    return 0;
}

static int token_revoke(int argc, char **argv) {
    const char *root = NULL, *name = NULL, *reason = NULL;
    const cli_opt opts[] = {
        {"root", CLI_STR, &root, "DIR", "the registry's store", true},
        {"name", CLI_STR, &name, "NAME", "the token to revoke", true},
        {"reason", CLI_STR, &reason, "TEXT", "why (kept with the token and in the audit log)",
         false},
        {0},
    };
    const cli_spec spec = {
        "kiln registry token revoke --root DIR --name NAME [--reason TEXT]",
        "Revoke a token: a running server refuses it from the next request on (401). The "
        "token's row stays, so its name is not reused.",
        opts, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) return rc;
    int64_t at;
    kiln_err e = kiln_registry_token_revoke(root, name, reason, &at);
    if (e) return cli_fail(e);
    char t[21];
    kiln_format_time(at, t);
    printf("revoked token '%s' at %s\n", name, t);
    return 0;
}

int cmd_registry_token(int argc, char **argv) {
    static const char *const usage =
        "usage: kiln registry token create --root DIR --name NAME --scope "
        "read|publish|promote|admin [--expires DUR|TIME]\n"
        "       kiln registry token list --root DIR [--json]\n"
        "       kiln registry token revoke --root DIR --name NAME [--reason TEXT]\n"
        "\nCreate, list or revoke the registry's bearer tokens (kiln registry token ACTION "
        "--help for each).\n";
    const char *action = argc >= 2 ? argv[1] : NULL;
    if (action && (!strcmp(action, "--help") || !strcmp(action, "-h"))) {
        fputs(usage, stdout);
        return 0;
    }
    if (action && !strcmp(action, "create")) return token_create(argc - 1, argv + 1);
    if (action && !strcmp(action, "list")) return token_list(argc - 1, argv + 1);
    if (action && !strcmp(action, "revoke")) return token_revoke(argc - 1, argv + 1);
    fputs(usage, stderr);
    if (!action) return cli_usage_error("'registry token' needs an action: create, list or revoke");
    return cli_usage_error("unknown 'registry token' action '%s' (create, list or revoke)", action);
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

/* cmd_registry_mirror.c - kiln registry mirror: keep a verified copy of a registry in a store of
 * its own, once or every --interval (registry/server/mirror.c; docs/registry.md, "Mirrors"). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "core.h"
#include "registry.h"

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) {
    stop_signal = sig;
}

/* A progress bar on a terminal; any download stops at SIGINT or SIGTERM (the next sync
 * resumes it). */
static int progress(void *ctx, uint64_t done, uint64_t total) {
    int *last = ctx;
    if (stop_signal) return 1;
    if (!total || !isatty(2)) return 0;
    int pct = (int)(done * 100 / total);
    if (pct == *last) return 0;
    *last = pct;
    fprintf(stderr, "\rdownloading %3d%% %.1f/%.1f MiB%s", pct, (double)done / 1048576.0,
            (double)total / 1048576.0, pct == 100 ? "\n" : "");
    return 0;
}

static void print_line(void *ctx, const char *line) {
    (void)ctx;
    printf("%s\n", line);
    fflush(stdout);
}

static void print_problem(void *ctx, const char *line) {
    (void)ctx;
    printf("problem: %s\n", line);
    fflush(stdout);
}

/* "30s", "5m", "1h": seconds, at least 1 and at most a day. */
static bool parse_interval(const char *s, long *secs) {
    uint64_t ms;
    if (cli_parse_duration_ms(s, 86400 * 1000, &ms) != 1 || ms % 1000) return false;
    *secs = (long)(ms / 1000);
    return true;
}

static const char *plural(size_t n) {
    return n == 1 ? "" : "s";
}

int cmd_registry_mirror(int argc, char **argv) {
    const char *root = NULL, *from = NULL, *token = NULL, *trust = NULL, *interval = NULL,
               *timeout = NULL, *max_size = NULL, *min_rate = NULL, *deadline = NULL;
    bool once = false;
    const cli_opt opts[] = {
        {"root", CLI_STR, &root, "DIR",
         "the mirror's store (a new or empty directory, or a mirror of --from), or an OCI "
         "registry (oci://HOST/PREFIX) to copy into", true},
        {"from", CLI_STR, &from, "URL", "the primary registry", true},
        {"token", CLI_STR, &token, "T",
         "a read token for the primary (default $KILN_REGISTRY_TOKEN)", false},
        {"trust", CLI_STR, &trust, "FILE",
         "the trust policy everything copied must verify under (walked through the primary's "
         "versions)",
         true},
        {"once", CLI_FLAG, &once, NULL, "sync once and exit (1 when an item did not verify)",
         false},
        {"interval", CLI_STR, &interval, "DUR", "sync every DUR: 30s (default), 5m, 1h", false},
        {"timeout", CLI_STR, &timeout, "DUR",
         "how long the primary may take to answer (or stall a download) before a sync gives up "
         "(and retries, then waits for the next): 500ms, 5s, 1m (default 60 s)",
         false},
        CLI_LIMIT_OPTS(&max_size, &min_rate, &deadline),
        {0},
    };
    const cli_spec spec = {
        "kiln registry mirror --root DIR|oci://HOST/PREFIX --from URL --trust FILE [--token T] "
        "[--once | --interval 30s] [--timeout 60s] [--max-size 16G] [--min-rate 16K] "
        "[--deadline 1h]",
        "Copy a registry into a mirror store, verifying every trust version, archive and "
        "channel record;\nserve the copy read-only with 'kiln registry serve --root DIR'. "
        "Or copy it into an OCI registry\n(--root oci://...), through the checks a publish and "
        "a promote pass there.",
        opts, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) return rc;
    long every = 30;
    if (once && interval) return cli_usage_error("--once and --interval exclude each other");
    if (interval && !parse_interval(interval, &every))
        return cli_usage_error("--interval '%s' is not a duration like 30s, 5m or 1h (at most a "
                               "day)",
                               interval);
    uint64_t timeout_ms;
    if (cli_registry_timeout(timeout, &timeout_ms)) return cli_fail(KILN_ERR_USAGE);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: a sleep ends at the signal */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int last = -1;
    kiln_registry_client_opts c;
    cli_client_opts(&c, from, token, NULL);
    c.timeout_ms = c.stall_ms = (unsigned)timeout_ms;
    c.progress = progress;
    c.progress_ctx = &last;
    kiln_err le = cli_registry_limits(&c, 1, max_size, min_rate, deadline);
    if (le) return cli_fail(le);
    kiln_registry_mirror_opts o = {.root = root,
                                   .from = &c,
                                   .trust = trust,
                                   .on_copied = print_line,
                                   .on_problem = print_problem};
    for (;;) {
        kiln_registry_mirror_result res;
        uint64_t t0 = kiln_now_ns();
        kiln_err e = kiln_registry_mirror_sync(&o, &res);
        double secs = (double)(kiln_now_ns() - t0) / 1e9;
        if (stop_signal && once) {
            fprintf(stderr, "kiln: error: sync stopped by %s; the next one resumes it\n",
                    stop_signal == SIGINT ? "SIGINT" : "SIGTERM");
            return 2;
        }
        if (stop_signal) break;
        bool news =
            res.trust_versions || res.versions || res.records || res.datasets || res.problems;
        if (!e || e == KILN_ERR_VERIFY) {
            char data[48] = ""; /* said only when there were some */
            if (res.datasets)
                snprintf(data, sizeof data, ", %zu dataset%s", res.datasets, plural(res.datasets));
            if (once || news)
                printf("mirror of %s: copied %zu trust version%s, %zu version%s (%llu bytes "
                       "downloaded), %zu channel record%s%s; %zu problem%s (%zu requests, %.2f "
                       "s)\n",
                       from, res.trust_versions, plural(res.trust_versions), res.versions,
                       plural(res.versions), (unsigned long long)res.bytes, res.records,
                       plural(res.records), data, res.problems, plural(res.problems), res.requests,
                       secs);
            fflush(stdout);
        }
        if (once) return e ? cli_fail(e) : 0;
        /* A directory that cannot be a mirror stays so: stop. Anything else (the primary
         * down, another sync running) may pass: try again next time. */
        if (e == KILN_ERR_USAGE) return cli_fail(e);
        if (e && e != KILN_ERR_VERIFY) {
            fprintf(stderr, "kiln: error: %s (next sync in %ld s)\n", kiln_errmsg(), every);
            fflush(stderr);
        }
        struct timespec ts = {every, 0};
        while (!stop_signal && nanosleep(&ts, &ts) != 0) {
        }
        if (stop_signal) break;
    }
    fprintf(stderr,
            "kiln registry mirror: %s received, stopped (a download cut short resumes at "
            "the next sync)\n",
            stop_signal == SIGINT ? "SIGINT" : "SIGTERM");
    return 0;
}

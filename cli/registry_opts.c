/* registry_opts.c - the registry client options the commands that talk to a registry share:
 * --registry, --token (else $KILN_REGISTRY_TOKEN), --timeout and the download limits, and the
 * progress bar. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "core.h"
#include "registry.h"

/* A progress bar on stderr when it is a terminal. */
int cli_draw_bar(void *ctx, uint64_t done, uint64_t total) {
    cli_bar *b = ctx;
    if (!total) return 0;
    int pct = (int)(done * 100 / total);
    if (pct == b->last) return 0;
    b->last = pct;
    int fill = pct * 30 / 100;
    fprintf(stderr, "\r%s [%.*s%*s] %3d%% %.1f/%.1f MiB", b->what, fill,
            "##############################", 30 - fill, "", pct, (double)done / 1048576.0,
            (double)total / 1048576.0);
    if (pct == 100) fputc('\n', stderr);
    return 0;
}

void cli_print_note(void *ctx, const char *line) {
    (void)ctx;
    fprintf(stderr, "kiln: %s\n", line);
}

const char *cli_registry_token(const char *token) {
    return token ? token : getenv("KILN_REGISTRY_TOKEN");
}

void cli_client_opts(kiln_registry_client_opts *c, const char *url, const char *token, cli_bar *b) {
    memset(c, 0, sizeof *c);
    c->url = url;
    c->token = cli_registry_token(token);
    c->retries = -1;
    if (b && isatty(2)) {
        c->progress = cli_draw_bar;
        c->progress_ctx = b;
    }
}

kiln_err cli_registry_timeout(const char *timeout, uint64_t *ms) {
    *ms = 0;
    KILN_FAIL_IF(timeout && cli_parse_duration_ms(timeout, 3600 * 1000, ms) != 1, KILN_ERR_USAGE,
                 "--timeout '%s' is not a duration like 500ms, 5s or 1m (at most an hour)",
                 timeout);
    return KILN_OK;
}

/* One client option set per --registry given, the timeout on each, and a progress bar on a
 * terminal when progress, into r->cs. */
static kiln_err registry_clients(cli_registries *r, bool progress) {
    static cli_bar b;
    b = (cli_bar){-1, "downloading"};
    uint64_t ms;
    KILN_TRY(cli_registry_timeout(r->timeout, &ms));
    r->cs = calloc(r->urls.n > 0 ? (size_t)r->urls.n : 1, sizeof *r->cs);
    if (!r->cs) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    r->n = (size_t)r->urls.n;
    for (size_t i = 0; i < r->n; i++) {
        cli_client_opts(&r->cs[i], r->urls.v[i], r->token, progress ? &b : NULL);
        r->cs[i].timeout_ms = r->cs[i].stall_ms = (unsigned)ms;
    }
    return KILN_OK;
}

/* A byte count: digits, then nothing or a unit (K, M, G, T or KiB, MiB, GiB, TiB: powers of
 * 1024; B), then "/s" when rate; at least 1 and at most max. */
static bool parse_bytes(const char *s, bool rate, uint64_t max, uint64_t *out) {
    static const struct {
        const char *unit;
        unsigned shift;
    } units[] = {{"", 0},     {"B", 0},  {"K", 10},   {"KiB", 10}, {"M", 20},
                 {"MiB", 20}, {"G", 30}, {"GiB", 30}, {"T", 40},   {"TiB", 40}};
    if (*s < '0' || *s > '9') return false;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(s, &end, 10);
    if (errno || !n) return false;
    size_t len = strlen(end);
    if (rate && len >= 2 && !strcmp(end + len - 2, "/s")) len -= 2;
    for (size_t i = 0; i < KILN_ARRAY_LEN(units); i++)
        if (strlen(units[i].unit) == len && !strncmp(end, units[i].unit, len)) {
            if (n > (max >> units[i].shift)) return false;
            *out = (uint64_t)n << units[i].shift;
            return true;
        }
    return false;
}

kiln_err cli_registry_limits(kiln_registry_client_opts *cs, size_t n, const char *max_size,
                             const char *min_rate, const char *deadline) {
    uint64_t size = 0, rate = 0, ms = 0;
    KILN_FAIL_IF(max_size && !parse_bytes(max_size, false, UINT64_MAX >> 1, &size), KILN_ERR_USAGE,
                 "--max-size '%s' is not a size in bytes like 1048576, 512M or 16G", max_size);
    KILN_FAIL_IF(min_rate && !parse_bytes(min_rate, true, UINT32_MAX, &rate), KILN_ERR_USAGE,
                 "--min-rate '%s' is not a rate in bytes a second like 1K, 64K/s or 1M (at most "
                 "4 GiB/s)",
                 min_rate);
    KILN_FAIL_IF(
        deadline && cli_parse_duration_ms(deadline, 7 * 86400 * 1000ull, &ms) != 1, KILN_ERR_USAGE,
        "--deadline '%s' is not a duration like 30s, 10m or 2h (at most 7 days)", deadline);
    for (size_t i = 0; i < n; i++) {
        cs[i].max_size = size;
        cs[i].min_rate = (unsigned)rate;
        cs[i].deadline_ms = (unsigned)ms;
    }
    return KILN_OK;
}

bool cli_registry_args(const cli_spec *spec, int argc, char **argv, const char **args,
                       cli_registries *r, bool progress, int *status) {
    r->cs = NULL;
    r->n = 0;
    if (!cli_parse_args(spec, argc, argv, args, status)) {
        cli_registries_release(r);
        return false;
    }
    kiln_err e = registry_clients(r, progress);
    if (!e) e = cli_registry_limits(r->cs, r->n, r->max_size, r->min_rate, r->deadline);
    if (e) {
        cli_registries_release(r);
        *status = cli_fail(e);
        return false;
    }
    return true;
}

void cli_registries_release(cli_registries *r) {
    free(r->cs);
    free(r->urls.v);
    r->cs = NULL;
    r->urls.v = NULL;
    r->n = 0;
}

/* cmd_registry_audit.c - kiln registry audit: a registry's audit log read over HTTP (GET
 * /v1/audit, an admin token), filtered by model, action and time, as text or JSON lines, once or
 * following the log as it grows (docs/registry.md, "The audit log"). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "core.h"
#include "registry.h"
#include "sign.h"

/* Entries asked for per request: the server's default page. */
#define PAGE 1000

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) {
    stop_signal = sig;
}

typedef struct {
    const char *model;
    const char *actions; /* "promote,rollback": any of them; NULL: all */
    int64_t since;       /* unix seconds; 0: from the start */
    bool json;
    bool header; /* the text table's header line is out */
} audit_filter;

/* One of the comma-separated names in list, exactly. */
static bool listed(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return true;
        if (!end) break;
        p = end + 1;
    }
    return false;
}

/* Names of a-z and '.', 1 to 32 bytes each, at most 16: what the registry takes. */
static bool action_list_ok(const char *list) {
    size_t names = 0, len = 0;
    for (const char *p = list;; p++) {
        if (*p == ',' || !*p) {
            if (!len || ++names > 16) return false;
            if (!*p) return true;
            len = 0;
        } else if (!((*p >= 'a' && *p <= 'z') || *p == '.') || ++len > 32) {
            return false;
        }
    }
}

static bool wanted(const audit_filter *f, const json_t *e) {
    if (f->model && strcmp(cli_jstr(e, "model"), f->model)) return false;
    if (f->actions && !listed(f->actions, cli_jstr(e, "action"))) return false;
    if (f->since) {
        int64_t t;
        if (kiln_sign_parse_time(cli_jstr(e, "time"), "time", &t)) {
            kiln_errclear();
            return true; /* shown rather than lost */
        }
        if (t < f->since) return false;
    }
    return true;
}

/* A member as text on one line, cut at max bytes ("-" when null or absent). */
static void field(const json_t *e, const char *key, size_t max, char *out, size_t size) {
    const char *s = json_string_value(json_object_get(e, key));
    cli_clean(s ? s : "-", max, out, size);
}

/* "id  time  action  token  what": what is model@version for a publish, model/channel ->
 * version for a channel record, the trust version for trust.put; then the digest's first 12
 * hex digits and the reason. Every value from the registry is cleaned of control bytes. */
static void print_text(const json_t *e, bool *header) {
    char time[32], action[40], token[80], model[80], version[80], channel[80], digest[80],
        reason[260];
    field(e, "time", 24, time, sizeof time);
    field(e, "action", 32, action, sizeof action);
    field(e, "token", 64, token, sizeof token);
    field(e, "model", 64, model, sizeof model);
    field(e, "version", 64, version, sizeof version);
    field(e, "channel", 64, channel, sizeof channel);
    field(e, "digest", 64, digest, sizeof digest);
    digest[19] = 0; /* sha256: and 12 hex digits */
    field(e, "reason", 200, reason, sizeof reason);
    const bool has_model = strcmp(model, "-") != 0, has_version = strcmp(version, "-") != 0,
               has_channel = strcmp(channel, "-") != 0;
    char what[600] = "";
    size_t n = 0;
    if (has_model && has_channel)
        n = (size_t)snprintf(what, sizeof what, "%s/%s -> %s", model, channel,
                             has_version ? version : "?");
    else if (has_model && has_version)
        n = (size_t)snprintf(what, sizeof what, "%s@%s", model, version);
    else if (has_model)
        n = (size_t)snprintf(what, sizeof what, "%s", model);
    else if (has_version)
        n = (size_t)snprintf(what, sizeof what, "%sversion %s",
                             strncmp(action, "trust", 5) ? "" : "trust ", version);
    if (strcmp(digest, "-"))
        n += (size_t)snprintf(what + n, sizeof what - n, "%s%s", n ? " " : "", digest);
    if (strcmp(reason, "-") && strcmp(reason, action)) /* not "promote (promote)" */
        snprintf(what + n, sizeof what - n, "%s(%s)", n ? " " : "", reason);
    if (!*header) /* before the first entry: a failed request prints no table */
        printf("%6s  %-20s  %-13s  %-16s  %s\n", "id", "time", "action", "token", "what");
    *header = true;
    if (*what)
        printf("%6lld  %-20s  %-13s  %-16s  %s\n", cli_jint(e, "id"), time, action, token, what);
    else
        printf("%6lld  %-20s  %-13s  %s\n", cli_jint(e, "id"), time, action, token);
}

/* Read and print every entry after *after, page by page; *after moves to the last one read. */
static kiln_err drain(const kiln_registry_client_opts *c, audit_filter *f, int64_t *after,
                      size_t *shown) {
    for (;;) {
        /* The filters go to the registry too (it reads no more of the log than they take);
         * wanted() applies them again, for a registry from before it took them. */
        char path[700];
        int n0 =
            snprintf(path, sizeof path, "/v1/audit?after=%lld&limit=%d", (long long)*after, PAGE);
        if (f->since)
            n0 += snprintf(path + n0, sizeof path - (size_t)n0, "&since=%lld", (long long)f->since);
        if (f->model) n0 += snprintf(path + n0, sizeof path - (size_t)n0, "&model=%s", f->model);
        if (f->actions) snprintf(path + n0, sizeof path - (size_t)n0, "&action=%s", f->actions);
        json_t *j = NULL;
        KILN_TRY(kiln_registry_get_json(c, path, &j));
        const json_t *entries = json_object_get(j, "entries");
        size_t n = json_array_size(entries), i;
        json_t *e;
        kiln_err rc = KILN_OK;
        if (!json_is_array(entries))
            rc = kiln_fail(KILN_ERR_FORMAT, "registry %s: the audit log's answer has no entries",
                           c->url);
        json_array_foreach(entries, i, e) {
            json_int_t id = json_integer_value(json_object_get(e, "id"));
            if (rc || !json_is_integer(json_object_get(e, "id")) || id <= *after) {
                if (!rc)
                    rc = kiln_fail(KILN_ERR_FORMAT,
                                   "registry %s: audit entry ids must rise past %lld; got "
                                   "%lld",
                                   c->url, (long long)*after, (long long)id);
                break;
            }
            *after = id;
            if (!wanted(f, e)) continue;
            (*shown)++;
            if (f->json) {
                /* ASCII: a C1 control in a value stays \u0080-\u009f through guard.c */
                char *s = json_dumps(e, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII);
                if (!s) {
                    rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
                    break;
                }
                printf("%s\n", s);
                free(s);
            } else {
                print_text(e, &f->header);
            }
        }
        json_decref(j);
        fflush(stdout);
        if (rc) return rc;
        if (n < PAGE || stop_signal) return KILN_OK;
    }
}

static void nap(uint64_t ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (!stop_signal && nanosleep(&ts, &ts) != 0) {
    }
}

int cmd_registry_audit(int argc, char **argv) {
    const char *url = NULL, *token = NULL, *since = NULL, *interval = NULL;
    long after = 0;
    bool follow = false;
    audit_filter f = {0};
    const cli_opt opts[] = {
        {"registry", CLI_STR, &url, "URL", "the registry", true},
        {"token", CLI_STR, &token, "T", "an admin token (default $KILN_REGISTRY_TOKEN)", false},
        {"model", CLI_STR, &f.model, "NAME", "only this model's entries", false},
        {"action", CLI_STR, &f.actions, "A[,B...]",
         "only these actions (publish, promote, rollback, trust.put, token.create, "
         "token.revoke, mirror.sync, gc, ...)",
         false},
        {"since", CLI_STR, &since, "DUR|TIME",
         "only entries from this long ago (24h, 7d) or this time (2026-11-30T00:00:00Z) on", false},
        {"after", CLI_INT, &after, "ID", "only entries after this id (where the last read ended)",
         false},
        {"follow", CLI_FLAG, &follow, NULL,
         "then print new entries as they come, until SIGINT or SIGTERM", false},
        {"interval", CLI_STR, &interval, "DUR", "with --follow: poll every DUR (default 2s)",
         false},
        {"json", CLI_FLAG, &f.json, NULL, "one JSON object per entry and line (JSON Lines)", false},
        {0},
    };
    const cli_spec spec = {
        "kiln registry audit --registry URL [--token T] [--model NAME] [--action A[,B]] "
        "[--since 24h] [--after ID] [--follow [--interval 2s]] [--json]",
        "Print a registry's audit log (who published, promoted, rolled back, put a trust "
        "version, made or revoked a token, when), oldest first; an admin token reads it.",
        opts, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) return rc;
    if (after < 0) return cli_usage_error("--after must not be negative");
    if (interval && !follow) return cli_usage_error("--interval goes with --follow");
    uint64_t every_ms = 2000;
    if (interval && (cli_parse_duration_ms(interval, 3600 * 1000, &every_ms) != 1 || !every_ms))
        return cli_usage_error("--interval '%s' is not a duration like 500ms, 2s or 1m (at most "
                               "an hour)",
                               interval);
    if (f.model && kiln_registry_check_name("model", f.model)) return cli_fail(KILN_ERR_USAGE);
    if (f.actions && !action_list_ok(f.actions))
        return cli_usage_error("--action '%s': up to 16 comma-separated action names (a-z and "
                               "'.', as publish or token.revoke)",
                               f.actions);
    if (since) {
        int64_t secs, now = kiln_unix_time();
        if (cli_parse_secs(since, &secs)) {
            f.since = now - secs;
        } else if (kiln_sign_parse_time(since, "--since (a duration like 24h or 7d, or a time)",
                                        &f.since)) {
            return cli_fail(KILN_ERR_USAGE);
        }
        if (f.since < 1) f.since = 1; /* before 1970: everything */
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: a sleep ends at the signal */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    kiln_registry_client_opts c;
    cli_client_opts(&c, url, token, NULL);
    if (follow) c.retries = 0;
    int64_t last = after;
    size_t shown = 0;
    kiln_err e = drain(&c, &f, &last, &shown);
    if (!follow) {
        if (e) return cli_fail(e);
        if (!f.json) fprintf(stderr, "%zu entr%s\n", shown, shown == 1 ? "y" : "ies");
        return 0;
    }
    /* Following: a registry that stops answering is said once and polled on; entries are
     * read from the last id seen, so none is missed or printed twice. A refusal (a token that
     * is not admin, revoked) ends it. */
    bool down = false;
    int64_t from = last;
    for (;;) {
        if (e == KILN_ERR_AUTH || e == KILN_ERR_USAGE || e == KILN_ERR_FORMAT) return cli_fail(e);
        if (e && !down) {
            fprintf(stderr, "kiln: warning: %s; polling on every %.1f s\n", kiln_errmsg(),
                    (double)every_ms / 1000.0);
            down = true;
        } else if (!e && down) {
            fprintf(stderr, "kiln: registry %s answers again; read on from entry %lld\n", url,
                    (long long)from + 1);
            down = false;
        }
        kiln_errclear();
        nap(every_ms);
        if (stop_signal) return 0;
        from = last;
        e = drain(&c, &f, &last, &shown);
    }
}

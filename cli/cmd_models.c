/* cmd_models.c - kiln models: registry/client/models.c's answer as text (a line per model, a
 * row per channel, with NAME the model's versions too) or as the JSON itself; --expiring keeps the
 * channels whose record expires soon and fails when there is one, for cron and monitoring. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "registry.h"

/* "2026-12-30T10:17:45Z in 29 d", "... expires soon, in 23 h", "... expired 2 h ago": the web
 * page's rule and wording (sign/'s kiln_record_expiry_at decided "expiry"). */
static void expiry_text(const json_t *c, char *out, size_t size) {
    char span[KILN_SPAN_MAX];
    long long in = cli_jint(c, "expires_in");
    kiln_format_span(in, span);
    const char *state = cli_jstr(c, "expiry");
    if (!strcmp(state, "expired"))
        snprintf(out, size, "%s expired %s ago", cli_jstr(c, "expires"), span);
    else if (!strcmp(state, "expires soon"))
        snprintf(out, size, "%s expires soon, in %s", cli_jstr(c, "expires"), span);
    else
        snprintf(out, size, "%s in %s", cli_jstr(c, "expires"), span);
}

/* "verified" or "NOT VERIFIED: why"; "" without a trust policy. */
static void check_text(const json_t *c, char *out, size_t size) {
    const json_t *chk = json_object_get(c, "check");
    const char *st = cli_jstr(chk, "status");
    if (!strcmp(st, "verified"))
        snprintf(out, size, "verified");
    else if (!strcmp(st, "failed"))
        snprintf(out, size, "NOT VERIFIED: %s", cli_jstr(chk, "how"));
    else
        out[0] = 0;
}

#define REASON_SHOWN 48

typedef struct chan_line {
    char name[80], version[80], seq[24], expiry[96], reason[REASON_SHOWN * 4 + 8], check[1600];
} chan_line;

static void chan_fill(const json_t *c, chan_line *l) {
    cli_clean(cli_jstr(c, "name"), 64, l->name, sizeof l->name);
    cli_clean(cli_jstr(c, "version"), 64, l->version, sizeof l->version);
    snprintf(l->seq, sizeof l->seq, "%lld", cli_jint(c, "seq"));
    expiry_text(c, l->expiry, sizeof l->expiry);
    char r[REASON_SHOWN * 4 + 4];
    const json_t *rs = json_object_get(c, "reason");
    cli_clean(json_is_string(rs) ? json_string_value(rs) : "", REASON_SHOWN, r, sizeof r);
    snprintf(l->reason, sizeof l->reason, json_is_string(rs) ? "'%s'" : "-", r);
    check_text(c, l->check, sizeof l->check);
}

static int width(int w, const char *s) {
    int n = (int)strlen(s);
    return n > w ? n : w;
}

/* A model's channels as a table under its line. */
static void print_channels(const json_t *chans, bool checked) {
    size_t n = json_array_size(chans);
    if (!n) {
        printf("  no channel points at any of its versions\n");
        return;
    }
    chan_line *ls = calloc(n, sizeof *ls);
    if (!ls) return;
    int wn = 7, wv = 7, ws = 3, we = 7, wr = 6;
    for (size_t i = 0; i < n; i++) {
        chan_fill(json_array_get(chans, i), &ls[i]);
        wn = width(wn, ls[i].name), wv = width(wv, ls[i].version), ws = width(ws, ls[i].seq);
        we = width(we, ls[i].expiry), wr = width(wr, ls[i].reason);
    }
    printf("  %-*s  %-*s  %*s  %-*s  %-*s%s\n", wn, "channel", wv, "version", ws, "seq", we,
           "expires", checked ? wr : 0, "reason", checked ? "  record" : "");
    for (size_t i = 0; i < n; i++)
        printf("  %-*s  %-*s  %*s  %-*s  %-*s%s%s\n", wn, ls[i].name, wv, ls[i].version, ws,
               ls[i].seq, we, ls[i].expiry, checked ? wr : 0, ls[i].reason, checked ? "  " : "",
               ls[i].check);
    free(ls);
}

static void size_text(long long n, char *out, size_t size) {
    if (n < 1024)
        snprintf(out, size, "%lld B", n);
    else if (n < 1024 * 1024)
        snprintf(out, size, "%.1f KiB", (double)n / 1024);
    else if (n < 1024LL * 1024 * 1024)
        snprintf(out, size, "%.1f MiB", (double)n / (1024 * 1024));
    else
        snprintf(out, size, "%.2f GiB", (double)n / (1024.0 * 1024 * 1024));
}

/* A model's versions, newest first. */
static void print_versions(const json_t *vs) {
    size_t n = json_array_size(vs);
    int wv = 7, wp = 12;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(vs, i);
        wv = width(wv, cli_jstr(v, "version"));
        wp = width(wp, cli_jstr(v, "publisher"));
    }
    wv = wv > 64 ? 64 : wv, wp = wp > 64 ? 64 : wp;
    printf("  %-*s  %-19s  %10s  %-*s  %-20s  %s\n", wv, "version", "digest", "size", wp,
           "published by", "at", "validation");
    for (size_t i = n; i-- > 0;) {
        const json_t *v = json_array_get(vs, i);
        char ver[80], pub[80], size[32];
        cli_clean(cli_jstr(v, "version"), 64, ver, sizeof ver);
        cli_clean(cli_jstr(v, "publisher"), 64, pub, sizeof pub);
        size_text(cli_jint(v, "size"), size, sizeof size);
        const json_t *val = json_object_get(v, "validation");
        printf("  %-*s  %-19.19s  %10s  %-*s  %-20s  %s\n", wv, ver, cli_jstr(v, "digest"), size,
               wp, pub, cli_jstr(v, "created"), json_is_string(val) ? json_string_value(val) : "?");
    }
}

static void print_model_line(const json_t *m, bool named) {
    const json_t *latest = json_object_get(m, "latest"), *upd = json_object_get(m, "updated");
    long long nv = cli_jint(m, "version_count");
    printf("%s%s  %lld version%s, newest %s, last change %s\n", named ? "model " : "",
           cli_jstr(m, "name"), nv, nv == 1 ? "" : "s",
           json_is_string(latest) ? json_string_value(latest) : "none",
           json_is_string(upd) ? json_string_value(upd) : "unknown");
}

static void print_header(const json_t *j) {
    const json_t *t = json_object_get(j, "trust");
    if (!cli_print_registries(j, NULL)) printf("registry    %s\n", cli_jstr(j, "registry"));
    if (json_is_object(t))
        printf("records     verified under trust policy version %lld (walked from '%s', state "
               "'%s'), each against what the registry lists\n",
               cli_jint(t, "version"), cli_jstr(t, "file"), cli_jstr(t, "state"));
    else
        printf("records     shown as the registry states them, unverified (--trust verifies "
               "each signed record)\n");
}

static void print_text(const json_t *j) {
    print_header(j);
    bool named = json_is_string(json_object_get(j, "model")),
         checked = json_is_object(json_object_get(j, "trust"));
    const json_t *models = json_object_get(j, "models");
    if (!json_array_size(models)) printf("\nthe registry holds no models\n");
    size_t i;
    json_t *m;
    json_array_foreach(models, i, m) {
        putchar('\n');
        print_model_line(m, named);
        if (named) {
            printf("versions\n");
            print_versions(json_object_get(m, "versions"));
            printf("channels\n");
        }
        print_channels(json_object_get(m, "channels"), checked);
    }
    const json_t *ds = json_object_get(j, "datasets");
    if (json_array_size(ds)) printf("\ndatasets (kiln data pull NAME@sha256:... fetches one)\n");
    json_array_foreach(ds, i, m) {
        char n[80];
        cli_clean(cli_jstr(m, "name"), 64, n, sizeof n);
        printf("  %-20s %s  %lld bytes  published by %s at %s\n", n, cli_jstr(m, "digest"),
               cli_jint(m, "size"), cli_jstr(m, "publisher"), cli_jstr(m, "created"));
        const json_t *tr = json_object_get(m, "trained");
        size_t k;
        json_t *v;
        json_array_foreach(tr, k, v) printf("%s%s", k ? ", " : "    trained on it: ",
                                            json_string_value(v) ? json_string_value(v) : "?");
        if (json_array_size(tr)) putchar('\n');
    }
}

/* --expiring: only the channels it found, one line each. */
static void print_expiring(const json_t *j, const char *within) {
    print_header(j);
    size_t total = 0, n = json_array_size(json_object_get(j, "expiring"));
    size_t i, k;
    json_t *m, *c;
    json_array_foreach(json_object_get(j, "models"), i, m) total +=
        json_array_size(json_object_get(m, "channels"));
    printf("\n%zu of %zu channel record%s expire%s within %s (or expired)\n", n, total,
           total == 1 ? "" : "s", n == 1 ? "s" : "", within);
    json_array_foreach(json_object_get(j, "models"), i, m) {
        json_array_foreach(json_object_get(m, "channels"), k, c) {
            if (!json_is_true(json_object_get(c, "expiring"))) continue;
            chan_line l;
            chan_fill(c, &l);
            char model[80];
            cli_clean(cli_jstr(m, "name"), 64, model, sizeof model);
            printf("  %s/%s  %s  seq %s  %s  %s%s%s\n", model, l.name, l.version, l.seq, l.expiry,
                   l.reason, l.check[0] ? "  " : "", l.check);
        }
    }
    if (n)
        printf("(kiln renew NAME --channel C --key KEY --registry URL --trust FILE re-signs a "
               "channel's current version, its record verified first)\n");
}

/* Failover notes on stderr, as kiln pull says them. */
static void print_notes(const json_t *j) {
    size_t i;
    json_t *u;
    json_array_foreach(json_object_get(j, "failover"), i, u)
        fprintf(stderr, "kiln: %s\n", json_string_value(u));
}

int cmd_models(int argc, char **argv) {
    const char *trust = NULL, *state = NULL, *expiring = NULL;
    cli_registries r = {0};
    bool as_json = false;
    const cli_opt opts[] = {
        {"registry", CLI_MULTI, &r.urls, "URL",
         "the registry; repeat it for mirrors, tried in order (the newest channel record wins)",
         true},
        {"trust", CLI_STR, &trust, "FILE",
         "verify each channel's signed record under this trust policy", false},
        {"state", CLI_STR, &state, "DIR",
         "with --trust: pull state, whose seqs no record may be below (default "
         "~/.local/state/kiln)",
         false},
        {"token", CLI_STR, &r.token, "TOKEN", "a read token (default $KILN_REGISTRY_TOKEN)", false},
        {"expiring", CLI_STR, &expiring, "DURATION",
         "list only the channels whose record expires within DURATION (30d, 12h, 90m, 3600s) "
         "or has expired; exit 1 when there is one",
         false},
        {"json", CLI_FLAG, &as_json, NULL, "print one JSON object (kiln-models/1)", false},
        CLI_TIMEOUT_OPT(&r.timeout),
        {0},
    };
    cli_spec spec = {
        "kiln models [NAME] --registry URL [--registry MIRROR]... [--trust FILE] [--state DIR] "
        "[--token T] [--expiring DURATION] [--json] [--timeout 5s]",
        "List a registry's models (with NAME: that model's versions) and each channel's current "
        "record: version, seq, expiry, reason; with --trust each record verified on this side "
        "(exit 1 if one does not verify).",
        opts, 0, 1};
    const char *name = NULL;
    int rc;
    if (!cli_registry_args(&spec, argc, argv, &name, &r, false, &rc)) return rc;
    int64_t within = 0;
    if (expiring && !cli_parse_secs(expiring, &within)) {
        cli_registries_release(&r);
        return cli_usage_error("--expiring '%s' is not a duration like 30d, 12h, 90m or 3600s",
                               expiring);
    }
    if (state && !trust) {
        cli_registries_release(&r);
        return cli_usage_error("--state is read only to check records: give --trust too");
    }
    kiln_registry_models_opts o = {
        .model = name, .trust = trust, .state = state, .expiring = within};
    json_t *out = NULL;
    kiln_err e = kiln_registry_models(r.cs, r.n, &o, &out);
    cli_registries_release(&r);
    if (!out) return cli_fail(e);
    print_notes(out);
    int printed = 0;
    if (as_json) {
        printed = cli_print_json(out, JSON_INDENT(2));
    } else if (expiring) {
        print_expiring(out, expiring);
    } else {
        print_text(out);
    }
    fflush(stdout);
    int status = e ? cli_fail(e) : printed;
    const json_t *exp = json_object_get(out, "expiring");
    size_t n = json_array_size(exp);
    if (n) {
        /* For monitoring: the channels by name, on the error line cron mails. */
        fprintf(stderr, "kiln: error: %zu channel record%s expire%s within %s (or expired):", n,
                n == 1 ? "" : "s", n == 1 ? "s" : "", expiring);
        size_t i;
        json_t *c;
        json_array_foreach(exp, i, c) {
            char s[200];
            cli_clean(json_string_value(c) ? json_string_value(c) : "?", 130, s, sizeof s);
            fprintf(stderr, "%s %s", i ? "," : "", s);
        }
        fputc('\n', stderr);
        status = 1;
    }
    json_decref(out);
    return status;
}

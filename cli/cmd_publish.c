/* cmd_publish.c - kiln publish | pull | promote | rollback | channel put: the registry's
 * client side. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "core.h"
#include "registry.h"
#include "sign.h"

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
    fprintf(stderr, "\r%s [%.*s%*s] %3d%% %.1f/%.1f MiB", b->what, fill,
            "##############################", 30 - fill, "", pct, (double)done / 1048576.0,
            (double)total / 1048576.0);
    if (pct == 100) fputc('\n', stderr);
    return 0;
}

static void client_opts(kiln_registry_client_opts *c, const char *url, const char *token, bar *b) {
    memset(c, 0, sizeof *c);
    c->url = url;
    c->token = token ? token : getenv("KILN_REGISTRY_TOKEN");
    c->retries = -1;
    if (b && isatty(2)) {
        c->progress = draw_bar;
        c->progress_ctx = b;
    }
}

kiln_err cli_registry_clients(const cli_list *urls, const char *token, const char *timeout,
                              bool progress, kiln_registry_client_opts **out) {
    static bar b;
    b = (bar){-1, "downloading"};
    *out = NULL;
    uint64_t ms = 0;
    KILN_FAIL_IF(timeout && cli_parse_duration_ms(timeout, 3600 * 1000, &ms) != 1, KILN_ERR_USAGE,
                 "--timeout '%s' is not a duration like 500ms, 5s or 1m (at most an hour)",
                 timeout);
    kiln_registry_client_opts *cs = calloc(urls->n > 0 ? (size_t)urls->n : 1, sizeof *cs);
    if (!cs) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < urls->n; i++) {
        client_opts(&cs[i], urls->v[i], token, progress ? &b : NULL);
        cs[i].timeout_ms = cs[i].stall_ms = (unsigned)ms;
    }
    *out = cs;
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
                       cli_list *urls, const char *const *token, const char *const *timeout,
                       bool progress, kiln_registry_client_opts **out, int *status) {
    *out = NULL;
    if (!cli_parse_args(spec, argc, argv, args, status)) {
        free(urls->v);
        return false;
    }
    kiln_err e = cli_registry_clients(urls, *token, *timeout, progress, out);
    if (e) {
        free(urls->v);
        *status = cli_fail(e);
        return false;
    }
    return true;
}

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

/* "kiln: registry URL1: ...; trying URL2": a pull over several registries passing one over. */
static void print_note(void *ctx, const char *line) {
    (void)ctx;
    fprintf(stderr, "kiln: %s\n", line);
}

/* SIGINT or SIGTERM during a pull: the transfer is cut (the progress hook says so within a
 * second), the pull fails and removes its partial download; a second signal kills. */
static volatile sig_atomic_t pull_signal;

static void on_pull_signal(int sig) {
    pull_signal = sig;
}

static int pull_progress(void *ctx, uint64_t done, uint64_t total) {
    if (pull_signal) return 1;
    return ctx ? draw_bar(ctx, done, total) : 0;
}

int cmd_pull(int argc, char **argv) {
    const char *token = NULL, *trust = NULL, *out_dir = NULL, *state = NULL, *timeout = NULL,
               *max_size = NULL, *min_rate = NULL, *deadline = NULL;
    cli_list urls = {0};
    const cli_opt opts[] = {
        {"registry", CLI_MULTI, &urls, "URL",
         "the registry; repeat it for mirrors, tried in order (the newest channel record wins)",
         true},
        {"token", CLI_STR, &token, "TOKEN", "a read token (default $KILN_REGISTRY_TOKEN)", false},
        {"trust", CLI_STR, &trust, "FILE", "trust policy (trust.json) the model must meet", true},
        {"out", CLI_STR, &out_dir, "DIR", "where the verified model directory goes", true},
        {"state", CLI_STR, &state, "DIR", "anti-rollback state (default ~/.local/state/kiln)",
         false},
        CLI_TIMEOUT_OPT(&timeout),
        CLI_LIMIT_OPTS(&max_size, &min_rate, &deadline),
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
    kiln_registry_client_opts *cs;
    if (!cli_registry_args(&spec, argc, argv, &ref, &urls, &token, &timeout, true, &cs, &rc))
        return rc;
    kiln_err le = cli_registry_limits(cs, (size_t)urls.n, max_size, min_rate, deadline);
    if (le) {
        free(cs);
        free(urls.v);
        return cli_fail(le);
    }
    for (int i = 0; i < urls.n; i++) {
        cs[i].progress_ctx = cs[i].progress ? cs[i].progress_ctx : NULL;
        cs[i].progress = pull_progress;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_pull_signal;
    sa.sa_flags = SA_RESETHAND; /* the second one kills */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    kiln_registry_pull_opts p = {.ref = ref, .trust = trust, .out = out_dir, .state = state};
    kiln_registry_pulled res;
    kiln_err e = kiln_registry_pull_any(cs, (size_t)urls.n, &p, print_note, NULL, &res);
    bool several = urls.n > 1;
    free(cs);
    free(urls.v);
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

/* What a pull installed, checked on its host without a registry. */
int cmd_installed(int argc, char **argv) {
    const char *trust = NULL, *dir = NULL, *state = NULL;
    const cli_opt opts[] = {
        {"dir", CLI_STR, &dir, "DIR", "the model directory a pull (or kiln_watch) installed", true},
        {"trust", CLI_STR, &trust, "FILE", "trust policy (trust.json) it must meet", true},
        {"state", CLI_STR, &state, "DIR",
         "the state of the pull that installed it (default ~/.local/state/kiln)", false},
        {0},
    };
    const cli_spec spec = {
        "kiln installed NAME@CHANNEL --dir DIR --trust FILE [--state DIR]",
        "Check, without a registry, that DIR is what the last pull of NAME@CHANNEL installed "
        "and still verifies: the channel record it accepted (signatures, seq, expiry), the "
        "release signatures over its manifest, every file. Exit 0 verified, 1 not.",
        opts, 1, 1};
    const char *ref;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &ref, &rc)) return rc;
    kiln_registry_installed in;
    kiln_err e = kiln_registry_installed_verify(trust, state, ref, dir, &in);
    if (e) return cli_fail(e);
    char when[21];
    kiln_format_time(in.expires, when);
    int64_t left = in.expires - kiln_unix_time();
    printf("installed   %s@%s in '%s'\n", in.model, in.version, dir);
    printf("channel     %s seq %lld, the record this client accepted last; expires %s (in %lld "
           "d %lld h)\n",
           in.channel, (long long)in.seq, when, (long long)(left / 86400),
           (long long)(left % 86400 / 3600));
    printf("archive     %s, signed by %s\n", in.digest, in.signed_by);
    printf("files       %zu, %llu bytes, as manifest sha256:%s says\n", in.files,
           (unsigned long long)in.bytes, in.manifest_sha256);
    printf("verified    under trust policy version %llu, without a registry\n",
           (unsigned long long)in.trust_version);
    return 0;
}

/* ---- channels: promote, rollback, channel put ---- */

typedef struct chan_args {
    const char *url, *token, *channel, *key, *expires, *reason, *out, *digest;
} chan_args;

/* What signing a channel's next record needs from the command line: the record's lifetime
 * (--expires, default 30 d) and the promote key. -1 when both are in hand, else the exit
 * status (the error said). */
static int chan_signing(const chan_args *a, int64_t *secs, kiln_sign_seckey **sk) {
    *secs = 30 * 86400;
    *sk = NULL;
    if (a->expires && !cli_parse_secs(a->expires, secs))
        return cli_usage_error("--expires '%s' is not a duration like 30d, 12h, 90m or 3600s",
                               a->expires);
    kiln_err rc = cli_load_seckey(a->key, sk);
    return rc ? cli_fail(rc) : -1;
}

/* Sign the next record for version (registry/channel.c) and put it, or write it to a->out
 * for more signatures. */
static int next_record(const chan_args *a, const char *model, const char *version,
                       const char *reason) {
    kiln_registry_client_opts c;
    bar b = {-1, ""};
    client_opts(&c, a->url, a->token, &b);
    c.progress = NULL;
    int64_t secs;
    kiln_sign_seckey *sk;
    int status = chan_signing(a, &secs, &sk);
    if (status >= 0) return status;
    const kiln_sign_seckey *keys[] = {sk};
    kiln_registry_promote_opts o = {.model = model,
                                    .channel = a->channel,
                                    .version = version,
                                    .keys = keys,
                                    .nkeys = 1,
                                    .expires_in = secs,
                                    .reason = reason,
                                    .digest = a->digest,
                                    .save_to = a->out};
    kiln_registry_promoted res;
    kiln_err rc = kiln_registry_promote(&c, &o, &res);
    kiln_sign_seckey_free(sk);
    if (rc) return cli_fail(rc);
    if (a->out)
        printf("wrote %s: %s/%s -> %s (%s) seq %llu, 1 signature\n"
               "add signatures with 'kiln channel sign --add %s --key KEY', then 'kiln channel put "
               "%s --registry URL'\n",
               a->out, model, a->channel, version, res.digest, (unsigned long long)res.seq, a->out,
               a->out);
    else
        printf("%s/%s -> %s (%s) seq %llu, reason '%s'\n", model, a->channel, version, res.digest,
               (unsigned long long)res.seq, reason);
    return 0;
}

int cmd_promote(int argc, char **argv) {
    chan_args a = {0};
    const cli_opt opts[] = {
        {"channel", CLI_STR, &a.channel, "C", "the channel (production, staging, ...)", true},
        {"key", CLI_STR, &a.key, "KEY", "a promote key (minisign secret key)", true},
        {"registry", CLI_STR, &a.url, "URL", "the registry", true},
        {"token", CLI_STR, &a.token, "T", "a promote token (default $KILN_REGISTRY_TOKEN)", false},
        {"expires", CLI_STR, &a.expires, "DUR",
         "how long the record holds: 30d (default), 12h, 90m, 3600s", false},
        {"reason", CLI_STR, &a.reason, "TEXT", "why (default 'promote')", false},
        {"digest", CLI_STR, &a.digest, "SHA256",
         "refuse unless the registry holds the version with this digest", false},
        {"out", CLI_STR, &a.out, "REC.json",
         "write the signed record here instead of putting it (to co-sign)", false},
        {0},
    };
    cli_spec spec = {
        "kiln promote NAME VERSION --channel C --key KEY --registry URL [--token T]",
        "Point a channel at a version: fetch its record, sign the next one (seq+1) and put it.",
        opts, 2, 2};
    const char *pos[2];
    int rc;
    if (!cli_parse_args(&spec, argc, argv, pos, &rc)) return rc;
    return next_record(&a, pos[0], pos[1], a.reason ? a.reason : "promote");
}

int cmd_rollback(int argc, char **argv) {
    chan_args a = {0};
    const char *to = NULL, *trust = NULL, *state = NULL;
    const cli_opt opts[] = {
        {"channel", CLI_STR, &a.channel, "C", "the channel", true},
        {"to", CLI_STR, &to, "VERSION", "the version to go back to (default: the one before)",
         false},
        {"trust", CLI_STR, &trust, "FILE",
         "find the version (the one before, or --to's) in the history's records verified under "
         "this trust policy, and pin its digest (without: the registry's word)",
         false},
        {"state", CLI_STR, &state, "DIR",
         "with --trust: the current record may not be older than the seq this client accepted",
         false},
        {"key", CLI_STR, &a.key, "KEY", "a promote key", true},
        {"registry", CLI_STR, &a.url, "URL", "the registry", true},
        {"token", CLI_STR, &a.token, "T", "a promote token (default $KILN_REGISTRY_TOKEN)", false},
        {"expires", CLI_STR, &a.expires, "DUR", "how long the record holds (default 30d)", false},
        {"out", CLI_STR, &a.out, "REC.json", "write the signed record here instead of putting it",
         false},
        {0},
    };
    cli_spec spec = {
        "kiln rollback NAME --channel C [--to VERSION] [--trust FILE [--state DIR]] --key KEY "
        "--registry URL [--token T]",
        "Point a channel back at an older version with a new record (seq+1, reason 'rollback').",
        opts, 1, 1};
    const char *name;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &name, &rc)) return rc;
    char model[KILN_REGISTRY_NAME_MAX + 1], target[KILN_REGISTRY_NAME_MAX + 1] = "";
    snprintf(model, sizeof model, "%s", name);
    if (kiln_registry_check_name("model", model) || kiln_registry_check_channel(a.channel))
        return cli_fail(KILN_ERR_USAGE);
    if (state && !trust) return cli_usage_error("--state goes with --trust");
    char digest[72] = "";
    if (to && !trust) {
        snprintf(target, sizeof target, "%s", to);
    } else {
        kiln_registry_client_opts c;
        client_opts(&c, a.url, a.token, NULL);
        kiln_err e = trust ? kiln_registry_previous_version_verified(
                                 &c, model, a.channel, to, trust, state, target, digest)
                           : kiln_registry_previous_version(&c, model, a.channel, target);
        if (e) return cli_fail(e);
        if (digest[0]) a.digest = digest; /* the verified record's, not the registry's word */
    }
    return next_record(&a, model, target, "rollback");
}

int cmd_renew(int argc, char **argv) {
    chan_args a = {0};
    const char *trust = NULL, *state = NULL;
    const cli_opt opts[] = {
        {"channel", CLI_STR, &a.channel, "C", "the channel", true},
        {"key", CLI_STR, &a.key, "KEY", "a promote key", true},
        {"registry", CLI_STR, &a.url, "URL", "the registry", true},
        {"trust", CLI_STR, &trust, "FILE",
         "the trust policy the current record must verify under (walked as a pull walks it)", true},
        {"state", CLI_STR, &state, "DIR",
         "this client's state: the current record may not be older than the seq it accepted "
         "(default ~/.local/state/kiln)",
         false},
        {"token", CLI_STR, &a.token, "T", "a promote token (default $KILN_REGISTRY_TOKEN)", false},
        {"expires", CLI_STR, &a.expires, "DUR", "how long the new record holds (default 30d)",
         false},
        {"out", CLI_STR, &a.out, "REC.json", "write the signed record here instead of putting it",
         false},
        {0},
    };
    cli_spec spec = {"kiln renew NAME --channel C --key KEY --registry URL --trust FILE [--state "
                     "DIR] [--expires 30d] [--out REC.json]",
                     "Re-sign a channel's current version with a new expiry (seq+1, reason "
                     "'renew'), after verifying its current record.",
                     opts, 1, 1};
    const char *name;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &name, &rc)) return rc;
    int64_t secs;
    kiln_sign_seckey *sk;
    int status = chan_signing(&a, &secs, &sk);
    if (status >= 0) return status;
    kiln_registry_client_opts c;
    client_opts(&c, a.url, a.token, NULL);
    const kiln_sign_seckey *keys[] = {sk};
    kiln_registry_renew_opts o = {.model = name,
                                  .channel = a.channel,
                                  .trust = trust,
                                  .state = state,
                                  .keys = keys,
                                  .nkeys = 1,
                                  .expires_in = secs,
                                  .save_to = a.out};
    kiln_registry_promoted res;
    char version[KILN_REGISTRY_NAME_MAX + 1], was[21];
    int64_t was_expires;
    kiln_err e = kiln_registry_renew(&c, &o, &res, version, &was_expires);
    kiln_sign_seckey_free(sk);
    if (e) return cli_fail(e);
    kiln_format_time(was_expires, was);
    printf("%s/%s -> %s (%s) seq %llu, reason 'renew' (the record it renews, seq %llu, %s %s)\n",
           name, a.channel, version, res.digest, (unsigned long long)res.seq,
           (unsigned long long)res.seq - 1, was_expires <= kiln_unix_time() ? "expired" : "expires",
           was);
    if (a.out)
        printf("wrote %s, 1 signature: add signatures with 'kiln channel sign --add %s --key KEY', "
               "then 'kiln channel put %s --registry URL'\n",
               a.out, a.out, a.out);
    return 0;
}

int cmd_channel_put(int argc, char **argv) {
    const char *url = NULL, *token = NULL;
    const cli_opt opts[] = {
        {"registry", CLI_STR, &url, "URL", "the registry", true},
        {"token", CLI_STR, &token, "T", "a promote token (default $KILN_REGISTRY_TOKEN)", false},
        {0},
    };
    cli_spec spec = {
        "kiln channel put REC.json --registry URL [--token T]",
        "Put a signed channel record (from 'kiln channel sign', co-signed with --add).", opts, 1,
        1};
    const char *file;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &file, &rc)) return rc;
    kiln_registry_client_opts c;
    bar b = {-1, ""};
    client_opts(&c, url, token, &b);
    c.progress = NULL;
    char *text = NULL;
    size_t len = 0;
    kiln_sign_record r;
    kiln_sign_record_init(&r);
    kiln_err e = kiln_read_file(file, 1u << 20, &text, &len);
    if (!e) e = kiln_sign_record_parse(text, len, file, &r);
    if (!e) e = kiln_registry_put_channel(&c, r.model, r.channel, text, len);
    if (!e)
        printf("%s/%s -> %s seq %llu (%zu signature%s)\n", r.model, r.channel, r.version,
               (unsigned long long)r.seq, r.nsigs, r.nsigs == 1 ? "" : "s");
    kiln_sign_record_release(&r);
    free(text);
    return e ? cli_fail(e) : 0;
}

static const char *str_or(const json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "?";
}

int cmd_channel_history(int argc, char **argv) {
    const char *url = NULL, *token = NULL, *channel = NULL;
    const cli_opt opts[] = {
        {"channel", CLI_STR, &channel, "C", "the channel", true},
        {"registry", CLI_STR, &url, "URL", "the registry", true},
        {"token", CLI_STR, &token, "T", "a read token (default $KILN_REGISTRY_TOKEN)", false},
        {0},
    };
    cli_spec spec = {"kiln channel history NAME --channel C --registry URL [--token T]",
                     "List a channel's records by seq as the registry reports them (promotions "
                     "and rollbacks; kiln pull verifies the current one).",
                     opts, 1, 1};
    const char *name;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &name, &rc)) return rc;
    char model[KILN_REGISTRY_NAME_MAX + 1];
    snprintf(model, sizeof model, "%s", name);
    if (kiln_registry_check_name("model", model) || kiln_registry_check_name("channel", channel))
        return cli_fail(KILN_ERR_USAGE);
    kiln_registry_client_opts c;
    bar b = {-1, ""};
    client_opts(&c, url, token, &b);
    c.progress = NULL;
    char *path = kiln_asprintf("/v1/models/%s/channels/%s/history", model, channel);
    json_t *h = NULL;
    kiln_err e = path ? kiln_registry_get_json(&c, path, &h) : KILN_ERR_NOMEM;
    free(path);
    if (e) return cli_fail(e);
    /* Columns sized to what they hold; the reason, free text, goes last. */
    json_t *recs = json_object_get(h, "records"), *x;
    size_t i;
    int wv = 7, wp = 6, ws = 3, n;
    json_array_foreach(recs, i, x) {
        const json_t *body = json_object_get(json_object_get(x, "record"), "record");
        char seq[24];
        n = snprintf(seq, sizeof seq, "%lld",
                     (long long)json_integer_value(json_object_get(body, "seq")));
        if (n > ws) ws = n;
        if ((n = (int)strlen(str_or(body, "version"))) > wv) wv = n;
        if ((n = (int)strlen(str_or(x, "publisher"))) > wp) wp = n;
    }
    printf("%-*s  %-*s  %-19s  %-4s  %-*s  %-20s  %s\n", ws, "seq", wv, "version", "digest", "sigs",
           wp, "put by", "at", "reason");
    json_array_foreach(recs, i, x) {
        const json_t *file = json_object_get(x, "record"), *body = json_object_get(file, "record");
        printf("%-*lld  %-*s  %-19.19s  %-4zu  %-*s  %-20s  %s\n", ws,
               (long long)json_integer_value(json_object_get(body, "seq")), wv,
               str_or(body, "version"), str_or(body, "digest"),
               json_array_size(json_object_get(file, "signatures")), wp, str_or(x, "publisher"),
               str_or(x, "created"), str_or(body, "reason"));
    }
    json_decref(h);
    return 0;
}

/* cli.h - the shared option parser and the command table's entries. */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kiln.h"

typedef enum {
    CLI_STR,   /* const char * */
    CLI_INT,   /* long */
    CLI_U64,   /* uint64_t */
    CLI_DBL,   /* double */
    CLI_FLAG,  /* bool, takes no value */
    CLI_MULTI  /* cli_list, repeatable (--set a=1 --set b=2) */
} cli_kind;

typedef struct cli_list {
    const char **v;
    int n;
} cli_list; /* free(list.v) when done */

typedef struct cli_opt {
    const char *name; /* without the leading "--" */
    cli_kind kind;
    void *dst;
    const char *metavar; /* NULL for flags */
    const char *help;
    bool required;
} cli_opt;

typedef struct cli_spec {
    const char *usage;   /* "kiln data synth [options]" */
    const char *summary; /* one line */
    const cli_opt *opts; /* terminated by a zeroed entry */
    int min_pos, max_pos;
} cli_spec;

#define CLI_HELP_SHOWN (-1)

/* Parse argv[1..argc) (argv[0] is the command name). Unknown and repeated options,
 * missing values and required options, and the wrong number of positional arguments
 * are usage errors: printed to stderr, return 2. --help prints usage to stdout and
 * returns CLI_HELP_SHOWN. Positional arguments are left in *pos (npos of them, point-
 * ing into argv; free(*pos)). */
int cli_parse(const cli_spec *spec, int argc, char **argv, char ***pos, int *npos);

/* cli_parse for a command with a fixed number of positional arguments (spec->max_pos >= 0):
 * they are copied into args[0..spec->max_pos) (NULL where not given; they point into argv;
 * args may be NULL when max_pos is 0). Returns true when the command goes on, with *status
 * 0; false when it is done, with *status its exit status: 0 after --help, 2 after a usage
 * error (already printed). */
bool cli_parse_args(const cli_spec *spec, int argc, char **argv, const char **args, int *status);

/* Print "kiln: error: <kiln_errmsg()>" and map the code to the exit status:
 * 1 for a failed check (KILN_ERR_VERIFY), 2 for everything else. */
int cli_fail(kiln_err rc);
/* Print "kiln: error: ..." for a usage problem found after parsing; returns 2. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* --expires: "30d", "12h", "90m", "3600s" after now (at most 100 years), or an RFC 3339 UTC
 * time ("2026-12-31T00:00:00Z"); KILN_ERR_USAGE otherwise. Whether a time in the past is
 * allowed is the caller's to say. (channel sign, registry token create) */
kiln_err cli_parse_expiry(const char *s, int64_t now, int64_t *out);
/* A duration: digits and one of ms, s, m, h, d ("500ms", "30s", "5m", "12h", "30d"), into
 * *ms. 1 when it is one and positive and at most max_ms; 0 when it is one but zero or too
 * long; -1 when it is not a duration at all. */
int cli_parse_duration_ms(const char *s, uint64_t max_ms, uint64_t *ms);

/* A record's lifetime as `kiln promote --expires` takes it (and `kiln models --expiring`):
 * "30d", "12h", "90m", "3600s", positive whole seconds of at most 100 years, into *secs;
 * false when it is not one. */
bool cli_parse_secs(const char *s, int64_t *secs);

/* Reading the JSON documents the library returns (explain, models, provenance): a member's
 * string ("?" when absent or not one) and integer (0 likewise). */
struct json_t;
const char *cli_jstr(const struct json_t *o, const char *key);
long long cli_jint(const struct json_t *o, const char *key);
/* The line a report over several registries starts with: "registries  U answered, of A, B"
 * and the failover notes under it, from a document's "registry", "registries" and
 * "failover" (notes: NULL, none printed). False, printing nothing, for a single registry. */
bool cli_print_registries(const struct json_t *j, const char *notes);
/* j as JSON on stdout (json_dumps flags), a newline after: 0, or 2 having said "out of
 * memory" (j NULL counts as that). */
int cli_print_json(const struct json_t *j, size_t flags);
/* From here on stdout and stderr pass text only: C0 controls but tab, newline and carriage
 * return, DEL and C1 controls become '?' (guard.c), so that what a registry or a file from
 * someone else says cannot drive the terminal. For the commands that print such words. */
void cli_guard_terminal(void);
/* The filter itself: in[0..n) into out (n bytes at most), *held carrying a 0xC2 across calls
 * (false to start); returns the bytes written. */
size_t cli_guard_filter(bool *held, const char *in, size_t n, char *out);
/* s for a terminal: control characters (a registry's word may hold any) as '?', cut at max
 * bytes on a UTF-8 boundary with "..." after, into out (size bytes). */
void cli_clean(const char *s, size_t max, char *out, size_t size);

/* One training step as the trainer logs it when stderr is no terminal, and as `kiln runs
 * show --follow` prints it: "step S/N loss ... tok/s[ ETA t][ (update skipped)][ val_loss v
 * val_r2 r]" after prefix; no ETA when eta_s < 0. (runlog.c) */
struct kiln_train_progress;
void cli_print_step(FILE *f, const char *prefix, const struct kiln_train_progress *p);
/* A time left as h:mm:ss (m:ss under an hour), into out (n bytes). */
void cli_fmt_eta(double s, char *out, size_t n);
/* Which steps such a log shows besides validations, the first and the last: every this many
 * (a twentieth of the run). */
long cli_step_every(long steps);

/* "PREFIX{n} spikes, {m} non-finite steps: kiln runs explain DIR shows what led to the
 * first" when the run had any, else nothing (kiln train at its end, kiln runs show).
 */
struct kiln_run_info;
void cli_print_trouble(FILE *f, const char *prefix, const struct kiln_run_info *ri,
                       const char *dir);

/* Load a secret key, asking for its password when it is encrypted ($KILN_PASSWORD_FILE's
 * first line, else the terminal). Free with kiln_sign_seckey_free. (password.c) */
struct kiln_sign_seckey;
kiln_err cli_load_seckey(const char *path, struct kiln_sign_seckey **out);
/* A password in guarded memory (kiln_sign_secret_free it): $KILN_PASSWORD_FILE's first line
 * when set (for automation), else the terminal, asked twice when confirm. */
kiln_err cli_get_password(const char *prompt, bool confirm, char **out, size_t *len);

/* Failures of a check (a bad signature, a document that does not verify, a malformed
 * signature, record, policy or key given to verify) exit 1; usage and I/O problems 2: prints
 * "kiln: error: ..." and returns that status. (signed.c) */
int cli_check_fail(kiln_err rc);
/* A .kiln archive (by its name) is signed and verified as a signed archive
 * (docs/formats.md, "signed archive"); any other file as a plain minisign signature. */
bool cli_is_archive(const char *path);
/* "signed by NAME (KEYID), ...: N of T required<what>" for the keys of a policy that signed. */
struct kiln_sign_trust_key;
void cli_print_signers(const struct kiln_sign_trust_key *const *signers, size_t n, int threshold,
                       const char *what);

/* ---- registries (registry_opts.c) ---- */
struct kiln_registry_client_opts;
/* A progress bar on stderr (kiln_registry_client_opts.progress, ctx a cli_bar). */
typedef struct cli_bar {
    int last;
    const char *what;
} cli_bar;
int cli_draw_bar(void *ctx, uint64_t done, uint64_t total);
/* The registry token: token (--token) when given, else $KILN_REGISTRY_TOKEN (NULL when
 * neither). */
const char *cli_registry_token(const char *token);
/* One registry's client options: url, cli_registry_token(token), default retries, and b's
 * bar as its progress when b and stderr is a terminal. */
void cli_client_opts(struct kiln_registry_client_opts *c, const char *url, const char *token,
                     cli_bar *b);
/* --timeout (NULL: 0, the library's default) into *ms; KILN_ERR_USAGE naming a bad one. */
kiln_err cli_registry_timeout(const char *timeout, uint64_t *ms);
/* The registry options of the commands that fail over between registries (pull, models,
 * provenance, trust update): the command's option table fills urls (--registry, repeatable),
 * token (--token), timeout (CLI_TIMEOUT_OPT) and, where it has them, the limits
 * (CLI_LIMIT_OPTS); cli_registry_args makes cs[0..n), one client option set per registry. */
typedef struct cli_registries {
    cli_list urls;
    const char *token, *timeout, *max_size, *min_rate, *deadline;
    struct kiln_registry_client_opts *cs;
    size_t n;
} cli_registries;
/* cli_parse_args with spec, then r->cs: cli_client_opts for each --registry (a progress bar
 * on a terminal when progress), timeout_ms and stall_ms from --timeout, the limits
 * (cli_registry_limits). False with *status the exit status (r released) when any fails;
 * else the caller cli_registries_release()s r. */
bool cli_registry_args(const cli_spec *spec, int argc, char **argv, const char **args,
                       cli_registries *r, bool progress, int *status);
void cli_registries_release(cli_registries *r);
/* "kiln: registry URL1: ...; trying URL2" on stderr: the note a command over several
 * registries gets when one is passed over (kiln_registry_*_any's on_note). */
void cli_print_note(void *ctx, const char *line);
/* The --timeout option of the commands above. */
#define CLI_TIMEOUT_OPT(dst)                                                                       \
    {"timeout", CLI_STR, (dst), "DURATION",                                                         \
     "how long a registry may take to answer (or stall a download) before it is passed over: "   \
     "500ms, 5s, 1m (default 5 s with mirrors, 60 s alone)",                                     \
     false}
/* The limits of a download (docs/registry.md, "Limits"), parsed into each of cs[0..n):
 * --max-size (bytes: 1048576, 512M, 16G, 2T; K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024),
 * --min-rate (bytes a second, the same units, "/s" allowed: 16K, 1M/s) and --deadline (a
 * duration, at most 7 days); NULL leaves the library's default. KILN_ERR_USAGE naming a bad
 * value. */
kiln_err cli_registry_limits(struct kiln_registry_client_opts *cs, size_t n, const char *max_size,
                             const char *min_rate, const char *deadline);

/* The options cli_registry_limits reads. */
#define CLI_LIMIT_OPTS(max_size, min_rate, deadline)                                       \
    {"max-size", CLI_STR, (max_size), "BYTES",                                             \
    "the largest archive accepted: a registry declaring more is refused (or passed over) " \
    "before the download: 512M, 16G (default 16G)",                                        \
    false},                                                                                \
    {"min-rate", CLI_STR, (min_rate), "BYTES/s",                                           \
    "the slowest a registry may send, averaged over each --timeout window, before it is "  \
    "passed over: 1K, 1M (default 16K)",                                                   \
    false},                                                                                \
    {"deadline", CLI_STR, (deadline), "DURATION",                                          \
    "the most the whole operation may take, every registry and retry included: 30s, 10m, " \
    "2h (default 1h)",                                                                     \
    false}

/* A channel's next record as promote, rollback and renew sign it (next_record.c). */
typedef struct cli_chan_args {
    const char *url, *token, *channel, *key, *expires, *reason, *out, *digest;
} cli_chan_args;
/* What signing a channel's next record needs from the command line: the record's lifetime
 * (--expires, default 30 d) and the promote key. -1 when both are in hand, else the exit
 * status (the error said). */
int cli_chan_signing(const cli_chan_args *a, int64_t *secs, struct kiln_sign_seckey **sk);
/* Sign the next record for version (registry/client/channel.c) and put it, or write it to a->out
 * for more signatures; the exit status. */
int cli_next_record(const cli_chan_args *a, const char *model, const char *version,
                    const char *reason);

/* ---- the commands: one cmd_NAME.c per command or group of commands (cmd_GROUP_NAME.c for a
 * large one of a group), each a row of cli/kiln.c's table. argv[0] is the command's name. ---- */
int cmd_channel_history(int argc, char **argv); /* cmd_channel.c */
int cmd_channel_put(int argc, char **argv);
int cmd_channel_sign(int argc, char **argv);
int cmd_channel_verify(int argc, char **argv);
int cmd_data_export(int argc, char **argv); /* cmd_data.c */
int cmd_data_import(int argc, char **argv);
int cmd_data_inspect(int argc, char **argv);
int cmd_data_synth(int argc, char **argv);
int cmd_data_publish(int argc, char **argv); /* cmd_data_registry.c */
int cmd_data_pull(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_golden_make(int argc, char **argv); /* cmd_golden.c */
int cmd_infer(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_installed(int argc, char **argv);
int cmd_keygen(int argc, char **argv);
int cmd_models(int argc, char **argv);
int cmd_pack(int argc, char **argv);
int cmd_promote(int argc, char **argv);
int cmd_provenance(int argc, char **argv);
int cmd_publish(int argc, char **argv);
int cmd_pull(int argc, char **argv);
int cmd_registry_audit(int argc, char **argv);  /* cmd_registry_audit.c */
int cmd_registry_fsck(int argc, char **argv);   /* cmd_registry.c */
int cmd_registry_gc(int argc, char **argv);     /* cmd_registry.c */
int cmd_registry_mirror(int argc, char **argv); /* cmd_registry_mirror.c */
int cmd_registry_serve(int argc, char **argv);  /* cmd_registry.c */
int cmd_registry_token(int argc, char **argv);  /* cmd_registry.c */
int cmd_release(int argc, char **argv);
int cmd_renew(int argc, char **argv);
int cmd_reproduce(int argc, char **argv);
int cmd_rollback(int argc, char **argv);
int cmd_runs_diff(int argc, char **argv);    /* cmd_runs.c */
int cmd_runs_explain(int argc, char **argv); /* cmd_runs.c */
int cmd_runs_list(int argc, char **argv);    /* cmd_runs.c */
int cmd_runs_plot(int argc, char **argv);    /* cmd_runs.c */
int cmd_runs_serve(int argc, char **argv);   /* cmd_runs_serve.c */
int cmd_runs_show(int argc, char **argv);    /* cmd_runs.c */
int cmd_sign(int argc, char **argv);
int cmd_sweep(int argc, char **argv); /* cmd_sweep.c */
int cmd_sweep_job(int argc, char **argv);
int cmd_sweep_status(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_trust_init(int argc, char **argv); /* cmd_trust_init.c */
int cmd_trust_put(int argc, char **argv); /* cmd_trust.c */
int cmd_trust_sign(int argc, char **argv);
int cmd_trust_update(int argc, char **argv);
int cmd_trust_verify(int argc, char **argv);
int cmd_trust_withdraw(int argc, char **argv);
int cmd_unpack(int argc, char **argv);
int cmd_validate(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_version(int argc, char **argv);

#endif

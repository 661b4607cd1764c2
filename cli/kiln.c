/* kiln.c - the command table and dispatch; no logic of its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"

/* What the dispatcher does for a command besides calling it, a row's flags. */
enum {
    /* It prints what is in a record, policy, archive or card that someone else made: its
     * stdout and stderr go through guard.c. (train and runs plot draw on the terminal with
     * escape sequences of their own, and print only what this host wrote.) */
    KILN_CMD_GUARDED = 1 << 0,
    /* It is a registry's client (--registry or --from URL, --token or $KILN_REGISTRY_TOKEN,
     * registry_opts.c) and prints what the registry says: guarded too. */
    KILN_CMD_REGISTRY = 1 << 1,
};

typedef struct {
    const char *name; /* one or two words: "train", "data synth" */
    int (*fn)(int argc, char **argv);
    unsigned flags; /* KILN_CMD_* */
    const char *summary;
} command;

static const command commands[] = {
    {"channel history", cmd_channel_history, KILN_CMD_REGISTRY,
     "list a channel's records (promotions, rollbacks)"},
    {"channel put", cmd_channel_put, KILN_CMD_REGISTRY,
     "put a signed channel record into a registry"},
    {"channel sign", cmd_channel_sign, KILN_CMD_GUARDED, "create or countersign a channel record"},
    {"channel verify", cmd_channel_verify, KILN_CMD_GUARDED,
     "verify a channel record against a trust policy"},
    {"data import", cmd_data_import, 0, "convert a CSV file into a dataset"},
    {"data export", cmd_data_export, 0, "write a dataset's rows as CSV (the reverse of import)"},
    {"data inspect", cmd_data_inspect, 0, "show a dataset's shape, column statistics and digest"},
    {"data synth", cmd_data_synth, 0, "write a synthetic market dataset"},
    {"data publish", cmd_data_publish, KILN_CMD_REGISTRY,
     "sign a dataset and upload it to a registry, named by its sha256"},
    {"data pull", cmd_data_pull, KILN_CMD_REGISTRY,
     "download a dataset by its sha256 and verify it"},
    {"export", cmd_export, 0, "freeze a training checkpoint into a model directory"},
    {"golden make", cmd_golden_make, 0, "store a model's outputs on held-out windows"},
    {"infer", cmd_infer, 0, "run a model over a dataset file (batch or stream)"},
    {"inspect", cmd_inspect, KILN_CMD_GUARDED, "print a .kiln archive's manifest and card"},
    {"installed", cmd_installed, KILN_CMD_GUARDED,
     "check an installed model on its host, without a registry"},
    {"keygen", cmd_keygen, 0, "create a minisign-compatible key pair"},
    {"models", cmd_models, KILN_CMD_REGISTRY,
     "list a registry's models, versions and channels (records verified with --trust)"},
    {"pack", cmd_pack, 0, "pack a model directory into a reproducible .kiln archive"},
    {"promote", cmd_promote, KILN_CMD_REGISTRY,
     "point a registry channel at a version (signed record)"},
    {"provenance", cmd_provenance, KILN_CMD_REGISTRY,
     "who put a model in a channel, from what, checked how (verified)"},
    {"publish", cmd_publish, KILN_CMD_REGISTRY, "upload a signed .kiln archive to a registry"},
    {"pull", cmd_pull, KILN_CMD_REGISTRY, "download and verify a model from a registry"},
    {"registry audit", cmd_registry_audit, KILN_CMD_REGISTRY,
     "print a registry's audit log (who did what, when), or follow it"},
    {"registry fsck", cmd_registry_fsck, 0, "check a registry's store"},
    {"registry gc", cmd_registry_gc, 0, "remove blobs no version references"},
    {"registry mirror", cmd_registry_mirror, KILN_CMD_REGISTRY,
     "copy a registry into a verified, read-only mirror"},
    {"registry serve", cmd_registry_serve, 0, "serve a model registry over HTTP"},
    {"registry token", cmd_registry_token, 0, "create, list or revoke registry tokens"},
    {"release", cmd_release, KILN_CMD_REGISTRY,
     "export, validate, pack, sign, publish and promote a run in one go"},
    {"renew", cmd_renew, KILN_CMD_REGISTRY,
     "re-sign a channel's current version with a new expiry (verified first)"},
    {"reproduce", cmd_reproduce, KILN_CMD_REGISTRY,
     "train a published model again from its signed lineage and compare the bytes"},
    {"rollback", cmd_rollback, KILN_CMD_REGISTRY,
     "point a registry channel back at an older version"},
    {"runs diff", cmd_runs_diff, 0, "compare two runs: config and the first differing loss"},
    {"runs explain", cmd_runs_explain, 0,
     "why a step went wrong: a spike or non-finite step against the steps before"},
    {"runs list", cmd_runs_list, 0, "compare a sweep of runs: state, metrics, what differs"},
    {"runs plot", cmd_runs_plot, 0, "draw a run's metrics over its steps (several runs overlaid)"},
    {"runs serve", cmd_runs_serve, 0, "a read-only web page of a sweep's runs: curves, events"},
    {"runs show", cmd_runs_show, 0, "show a run's config, progress, metrics and events"},
    {"sign", cmd_sign, 0, "sign a file (minisign format)"},
    /* "sweep job" and "sweep status" before "sweep": the first row whose words match runs. */
    {"sweep job", cmd_sweep_job, 0, "run one point of a sweep (what its batch job runs)"},
    {"sweep status", cmd_sweep_status, 0,
     "each point of a sweep: state, scheduler, step, best loss"},
    {"sweep", cmd_sweep, 0,
     "train a spec's grid of runs as Slurm jobs or a local pool (resumable)"},
    {"train", cmd_train, 0, "train a model, or resume a run"},
    {"trust init", cmd_trust_init, 0,
     "write a trust policy from public key files and channel thresholds"},
    {"trust put", cmd_trust_put, KILN_CMD_REGISTRY,
     "give a registry the next signed version of its trust policy"},
    {"trust sign", cmd_trust_sign, KILN_CMD_GUARDED,
     "sign a version of the trust policy with a root key"},
    {"trust update", cmd_trust_update, KILN_CMD_REGISTRY,
     "walk the trust policy forward to the registry's newest"},
    {"trust verify", cmd_trust_verify, KILN_CMD_GUARDED,
     "check a signed trust policy as the next version"},
    {"trust withdraw", cmd_trust_withdraw, KILN_CMD_GUARDED,
     "write the next trust version, withdrawing an archive (then sign it with root keys)"},
    {"unpack", cmd_unpack, KILN_CMD_GUARDED, "unpack and check a .kiln archive"},
    {"validate", cmd_validate, 0, "run the golden and parity checks; write the validation report"},
    {"verify", cmd_verify, KILN_CMD_GUARDED, "verify a file's minisign signature"},
    {"version", cmd_version, 0, "print the version"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: kiln <command> [options]   (kiln <command> --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < KILN_ARRAY_LEN(commands); i++)
        fprintf(f, "  %-18s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv) {
    const char *lvl = getenv("KILN_LOG");
    if (lvl) {
        if (!strcmp(lvl, "debug")) kiln_log_set_level(KILN_LOG_DEBUG);
        else if (!strcmp(lvl, "warn")) kiln_log_set_level(KILN_LOG_WARN);
        else if (!strcmp(lvl, "error")) kiln_log_set_level(KILN_LOG_ERROR);
    }
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) return cmd_version(1, argv);
    for (size_t i = 0; i < KILN_ARRAY_LEN(commands); i++) {
        const char *name = commands[i].name, *sp = strchr(name, ' ');
        int words = 0; /* the command's name takes one or two arguments */
        if (!sp)
            words = !strcmp(argv[1], name);
        else if (argc >= 3 && strlen(argv[1]) == (size_t)(sp - name) &&
                 !strncmp(argv[1], name, (size_t)(sp - name)) && !strcmp(argv[2], sp + 1))
            words = 2;
        if (!words) continue;
        if (commands[i].flags & (KILN_CMD_GUARDED | KILN_CMD_REGISTRY)) cli_guard_terminal();
        return commands[i].fn(argc - words, argv + words);
    }
    fprintf(stderr, "kiln: error: unknown command '%s%s%s'\n", argv[1], argc >= 3 ? " " : "", argc >= 3 ? argv[2] : "");
    usage(stderr);
    return 2;
}

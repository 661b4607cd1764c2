/* cmd_reproduce.c - kiln reproduce: rebuild a published model from its signed lineage and say
 * whether the bytes are the same (release/reproduce.c does the work; this prints it). */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "core.h"
#include "registry.h"
#include "release.h"
#include "runs.h"

static volatile int repro_stop;

static void on_repro_signal(int sig) {
    (void)sig;
    repro_stop = 1;
}

typedef struct {
    bool tty;
    long every, target;
} repro_ui;

static void on_stage(void *ctx, const char *line) {
    repro_ui *u = ctx;
    /* Guarded output (what a registry's card says is printed): no escape sequences, so the
     * bar is rubbed out with spaces. */
    if (u->tty) fprintf(stderr, "\r%79s\r", "");
    fprintf(stderr, "kiln: %s\n", line);
}

/* The trainer's progress against the step the reproduction stops at (the config's steps may
 * be more): a bar with the ETA on a terminal, else a line every twentieth of the run. */
static void on_progress(void *ctx, const kiln_train_progress *p) {
    repro_ui *u = ctx;
    kiln_train_progress q = *p;
    long target = u->target > 0 && u->target < p->steps ? u->target : p->steps;
    long done = p->step - p->first_step + 1;
    q.steps = target;
    q.eta_s = done > 0 ? p->elapsed_s / (double)done * (double)(target - p->step) : -1;
    if (u->tty) {
        char eta[32];
        cli_fmt_eta(q.eta_s, eta, sizeof eta);
        int w = 30, fill = target > 0 ? (int)((double)w * (double)p->step / (double)target) : w;
        fprintf(stderr, "\rtraining [%.*s%*s] step %ld/%ld  loss %.5f  ETA %s   ", fill,
                "##############################", w - fill, "", p->step, target, p->loss, eta);
        fflush(stderr);
        return;
    }
    if (!u->every) u->every = cli_step_every(target);
    if (p->step == p->first_step || p->step == target || p->step % u->every == 0)
        cli_print_step(stderr, "kiln: training ", &q);
}

int cmd_reproduce(int argc, char **argv) {
    const char *trust = NULL, *state = NULL, *data = NULL, *init = NULL, *workdir = NULL,
               *sign = NULL;
    long threads = 0;
    cli_registries r = {0};
    const cli_opt opts[] = {
        {"registry", CLI_MULTI, &r.urls, "URL", "the registry the model was published to", true},
        {"token", CLI_STR, &r.token, "TOKEN", "a read token (default $KILN_REGISTRY_TOKEN)", false},
        {"trust", CLI_STR, &trust, "FILE", "trust policy (trust.json) the model must meet", true},
        {"data", CLI_STR, &data, "DATA",
         "the dataset the model was trained on, its digest the card's (default: pulled from "
         "the registry by that digest and verified)",
         false},
        {"init", CLI_STR, &init, "MODEL",
         "the model the run started from, for a card whose lineage names one (by digest)", false},
        {"workdir", CLI_STR, &workdir, "DIR",
         "a new directory for the pull, the run, the model and the archive (default: a "
         "temporary one, removed when the bytes are the same)",
         false},
        {"threads", CLI_INT, &threads, "N", "training threads (the bits do not depend on it)",
         false},
        {"state", CLI_STR, &state, "DIR", "pull state (default ~/.local/state/kiln)", false},
        {"sign", CLI_STR, &sign, "KEY",
         "sign a reproduction record of the verdict with this key (the reproduce role) and put "
         "it to the registry (--token: publish scope)",
         false},
        CLI_TIMEOUT_OPT(&r.timeout),
        {0},
    };
    cli_spec spec = {
        "kiln reproduce NAME@VERSION|NAME@CHANNEL --registry URL --trust FILE [--data DATA] "
        "[--workdir DIR] [--threads N] [--init MODEL] [--sign KEY --token T]",
        "Pull and verify a model, train it again from scratch from its signed lineage (config, "
        "seed, step, dataset digest), export and pack it, and compare: exit 0 when "
        "model.safetensors and the archive are byte-identical, 1 when they differ, 2 when it "
        "could not run.",
        opts, 1, 1};
    const char *ref;
    int rc;
    if (!cli_registry_args(&spec, argc, argv, &ref, &r, false, &rc)) return rc;
    if (r.n != 1) {
        cli_registries_release(&r);
        return cli_usage_error("kiln reproduce takes one --registry");
    }
    if (threads < 0 || threads > 1024) {
        cli_registries_release(&r);
        return cli_usage_error("--threads must be between 1 and 1024");
    }
    kiln_sign_seckey *sk = NULL;
    if (sign) {
        kiln_err ke = cli_load_seckey(sign, &sk);
        if (ke) {
            cli_registries_release(&r);
            return cli_fail(ke);
        }
    }
    char host[256] = "?";
    if (gethostname(host, sizeof host - 1)) snprintf(host, sizeof host, "?");
    char tmp[PATH_MAX] = "";
    /* What a run that could not run leaves: a work directory it made is removed. */
    kiln_dir_state was = workdir ? kiln_path_dir_state(workdir) : KILN_DIR_ABSENT;
    if (!workdir) {
        const char *t = getenv("TMPDIR");
        snprintf(tmp, sizeof tmp, "%s/kiln-reproduce-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(tmp)) {
            cli_registries_release(&r);
            kiln_sign_seckey_free(sk);
            fprintf(stderr, "kiln: error: cannot create a work directory '%s'\n", tmp);
            return 2;
        }
        workdir = tmp;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_repro_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    repro_ui ui = {isatty(2), 0, 0};
    kiln_reproduce_opts o = {.client = &r.cs[0],
                             .ref = ref,
                             .trust = trust,
                             .state = state,
                             .data = data,
                             .init = init,
                             .workdir = workdir,
                             .threads = (int)threads,
                             .stop = &repro_stop,
                             .sign_key = sk,
                             .host = host,
                             .on_stage = on_stage,
                             .progress = on_progress,
                             .ctx = &ui};
    kiln_reproduce_result res;
    kiln_err e = kiln_reproduce_run(&o, &res);
    cli_registries_release(&r);
    kiln_sign_seckey_free(sk);
    if (e && sign && res.rebuilt[0]) /* Compared, then the record failed: the verdict still said. */
        printf("%s %s@%s (its reproduction record was not stored)\n",
               res.identical ? "reproduced" : "not reproduced", res.model, res.version);
    if (ui.tty) fprintf(stderr, "\r%79s\r", "");
    if (e) {
        fprintf(stderr, "kiln: error: %s\n", kiln_errmsg());
        /* Compared already (the record failed): the rebuilt run is kept to be looked at. */
        if (res.rebuilt[0] && !tmp[0])
            fprintf(stderr, "kiln: work directory '%s' kept\n", workdir);
        else if (tmp[0] || was == KILN_DIR_ABSENT)
            kiln_rmtree(workdir);
        else if (was == KILN_DIR_EMPTY && kiln_path_dir_state(workdir) == KILN_DIR_FULL) {
            kiln_rmtree(workdir);
            (void)kiln_mkdir_p(workdir);
        }
        return 2;
    }
    if (res.identical) {
        printf("reproduced %s@%s: model.safetensors and the archive are byte-identical (%s)\n",
               res.model, res.version, res.digest);
        if (res.recorded)
            printf("reproduction record (identical) signed by '%s' put to the registry\n", sign);
        if (tmp[0]) kiln_rmtree(tmp);
        return 0;
    }
    printf("not reproduced %s@%s: %s\n", res.model, res.version,
           res.model_same ? "model.safetensors is byte-identical, the archive is not"
                          : "model.safetensors differs");
    printf("  archive   released %s, rebuilt %s\n", res.digest, res.rebuilt);
    if (res.tensor[0]) printf("  model     %s\n", res.tensor);
    if (res.card[0]) printf("  card      %s\n", res.card);
    if (res.loss[0]) printf("  training  %s\n", res.loss);
    printf("  this build %s; work directory '%s' kept\n", kiln_version(), workdir);
    if (res.recorded)
        printf("reproduction record (different) signed by '%s' put to the registry\n", sign);
    return 1;
}

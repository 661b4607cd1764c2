/* cmd_train.c - kiln train: start or resume a run; progress on stderr. */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "core.h"
#include "runs.h"
#include "train.h"

static volatile int stop_flag;

static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

typedef struct {
    bool tty;
    long every; /* plain log line every this many steps */
} progress_ctx;

static void progress(void *vctx, const kiln_train_progress *p) {
    progress_ctx *c = vctx;
    char eta[32];
    cli_fmt_eta(p->eta_s, eta, sizeof eta);
    if (c->tty) {
        fprintf(stderr, "\r\033[Kstep %ld/%ld  loss %.5f  %.0f tok/s  ETA %s", p->step, p->steps,
                p->loss, p->tokens_per_s, eta);
        if (p->has_val) fprintf(stderr, "  val %.5f r2 %.4f", p->val_loss, p->val_r2);
        if (p->step == p->steps) fputc('\n', stderr);
        fflush(stderr);
        return;
    }
    if (!c->every) c->every = cli_step_every(p->steps);
    if (!(p->has_val || p->step == p->first_step || p->step == p->steps || p->step % c->every == 0))
        return;
    cli_print_step(stderr, "kiln: ", p);
}

/* KILN_TEST_POISON_STEPS=5,6,7: tests make those steps non-finite. */
static int poison_from_env(long **out, size_t *n) {
    *out = NULL;
    *n = 0;
    const char *s = getenv("KILN_TEST_POISON_STEPS");
    if (!s || !*s) return 0;
    size_t cap = 1;
    for (const char *q = s; *q; q++)
        cap += *q == ',';
    long *v = calloc(cap, sizeof *v);
    if (!v) return cli_usage_error("out of memory");
    while (*s) {
        char *end;
        errno = 0;
        long x = strtol(s, &end, 10);
        if (errno || end == s || (*end && *end != ',')) {
            free(v);
            return cli_usage_error("KILN_TEST_POISON_STEPS: '%s' is not a list of steps",
                                   getenv("KILN_TEST_POISON_STEPS"));
        }
        v[(*n)++] = x;
        s = *end ? end + 1 : end;
    }
    *out = v;
    return 0;
}

/* A non-negative integer from the environment, or def when unset ("" too). */
static int env_size(const char *name, size_t def, size_t *out) {
    const char *s = getenv(name);
    *out = def;
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-' || v > SIZE_MAX / 2)
        return cli_usage_error("%s: '%s' is not a size", name, s);
    *out = (size_t)v;
    return 0;
}

/* After a run stopped or finished: where its spikes and non-finite steps can be looked into
 * (stderr; nothing when it had none, or its log cannot be read). */
static void trouble_hint(const char *dir) {
    kiln_run_info ri;
    if (kiln_run_info_load(dir, 0, &ri)) {
        kiln_errclear();
        return;
    }
    cli_print_trouble(stderr, "kiln: ", &ri, dir);
    kiln_run_info_release(&ri);
}

/* Under mpirun every rank runs this command; rank 0 speaks for the run. Other ranks print
 * only errors that may be theirs alone (transport, memory); the rest every rank agrees on
 * (kiln_dist_agree) and rank 0 prints. */
static int finish(const kiln_comm *comm, kiln_err err) {
    if (comm->rank == 0) return cli_fail(err);
    if (err == KILN_ERR_NETWORK || err == KILN_ERR_NOMEM || err == KILN_ERR_DEVICE)
        fprintf(stderr, "kiln: error: rank %d: %s\n", comm->rank, kiln_errmsg());
    return err == KILN_ERR_VERIFY ? 1 : 2;
}

int cmd_train(int argc, char **argv) {
    const char *config = NULL, *data = NULL, *run_dir = NULL, *init = NULL, *resume = NULL,
               *device = NULL;
    bool print_config = false;
    cli_list sets = {0};
    const cli_opt opts[] = {
        {"config", CLI_STR, &config, "FILE.json", "the run's config (defaults: --print-config)",
         false},
        {"set", CLI_MULTI, &sets, "KEY=VALUE",
         "override a config key (repeatable; VALUE is a JSON scalar)", false},
        {"data", CLI_STR, &data, "DATA", "dataset (safetensors); on --resume, the run's by default",
         false},
        {"run-dir", CLI_STR, &run_dir, "DIR", "new run directory", false},
        {"init", CLI_STR, &init, "MODEL",
         "start from this model file's weights and input normalisation", false},
        {"device", CLI_STR, &device, "cpu|cuda",
         "where the steps run (config key 'device'; the same as --set device=...)", false},
        {"resume", CLI_STR, &resume, "DIR",
         "continue the run in DIR from its newest good checkpoint", false},
        {"print-config", CLI_FLAG, &print_config, NULL,
         "print the config (defaults, --config, --set) and exit", false},
        {0},
    };
    const cli_spec spec = {
        "kiln train --config FILE.json [--set KEY=VALUE ...] [--device cpu|cuda] --data DATA "
        "--run-dir DIR [--init MODEL]\n"
        "       kiln train --resume DIR [--data DATA] [--set KEY=VALUE ...] [--device cpu|cuda]\n"
        "       kiln train --print-config [--config FILE.json] [--set KEY=VALUE ...]",
        "Train a kiln-tsmoe/1 model; checkpoints, run.json and metrics.db go into the run "
        "directory.",
        opts, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) {
        free(sets.v);
        return rc;
    }
    /* --device is one more --set, applied last. */
    char device_set[64];
    if (device) {
        snprintf(device_set, sizeof device_set, "device=%.40s", device);
        const char **v = realloc(sets.v, (size_t)(sets.n + 1) * sizeof *v);
        if (!v) {
            free(sets.v);
            return cli_usage_error("out of memory");
        }
        sets.v = v;
        sets.v[sets.n++] = device_set;
    }
    long *poison = NULL;
    size_t n_poison = 0;
    kiln_err err = KILN_OK;
    kiln_comm *comm = kiln_comm_single();
    const char *trained = NULL; /* the run directory, once training began */

    kiln_train_config cfg;
    if (resume) {
        if (config || init || run_dir || print_config) {
            rc = cli_usage_error("--resume takes only --data, --set and --device");
            goto out;
        }
    } else {
        kiln_train_config_default(&cfg);
        if (config) {
            json_t *j;
            if ((err = kiln_json_load_file(config, &j))) goto fail;
            char label[1024];
            snprintf(label, sizeof label, "'%s'", config);
            err = kiln_train_config_apply(&cfg, j, label);
            json_decref(j);
            if (err) goto fail;
        }
        for (int i = 0; i < sets.n; i++)
            if ((err = kiln_train_config_set(&cfg, sets.v[i]))) goto fail;
        if ((err = kiln_train_config_check(&cfg, config ? config : "config"))) goto fail;
        if (print_config) {
            char *s = kiln_train_config_print_text(&cfg);
            if (!s) goto fail;
            fputs(s, stdout);
            free(s);
            goto out;
        }
        if (!data || !run_dir) {
            rc = cli_usage_error("--data and --run-dir are required (see 'kiln train --help')");
            goto out;
        }
    }
    /* A new run and a resumed one run alike from here. */
    if ((rc = poison_from_env(&poison, &n_poison))) goto out;
    /* Under mpirun: the rank's index on its machine picks its GPU; KILN_TEST_BUCKET_BYTES
     * makes small gradient buckets so that a tiny model has several (tests). */
    size_t local_rank = 0, bucket_bytes = 0;
    /* srun starts the ranks itself (kiln sweep, --mpi=pmix): Slurm's SLURM_LOCALID then. */
    const char *lr_env = getenv("OMPI_COMM_WORLD_LOCAL_RANK") ? "OMPI_COMM_WORLD_LOCAL_RANK"
                                                              : "SLURM_LOCALID";
    if ((rc = env_size(lr_env, 0, &local_rank)) ||
        (rc = env_size("KILN_TEST_BUCKET_BYTES", 0, &bucket_bytes)))
        goto out;
    if (kiln_comm_mpi_launched()) {
        /* Into its own pointer: a failed create leaves comm the single-process one, which
         * reports the error. */
        kiln_comm *mc = NULL;
        if ((err = kiln_comm_mpi_create(NULL, NULL, &mc))) goto fail;
        comm = mc;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    progress_ctx pc = {isatty(2), 0};
    kiln_train_opts o = {.comm = comm,
                         .run_dir = resume ? resume : run_dir,
                         .data_path = data,
                         .init_path = init,
                         .progress = progress,
                         .progress_ctx = &pc,
                         .stop = &stop_flag,
                         .device_comm = kiln_comm_mpi_launched() ? kiln_comm_nccl_create : NULL,
                         .local_rank = local_rank < INT_MAX ? (int)local_rank : 0,
                         .bucket_bytes = bucket_bytes,
                         .poison_steps = poison,
                         .n_poison = n_poison};
    if (resume) {
        /* A resume applies the --set overrides to the run's own config. */
        o.sets = sets.v;
        o.n_sets = sets.n;
        trained = resume;
        if ((err = kiln_train_resume(&o))) goto fail;
        if (comm->rank == 0) printf("run '%s' finished\n", resume);
    } else {
        trained = run_dir;
        if ((err = kiln_train_start(&cfg, &o))) goto fail;
        if (comm->rank == 0) printf("run '%s' finished: %ld steps\n", run_dir, cfg.steps);
    }
    if (comm->rank == 0) trouble_hint(trained);
    goto out;
fail:
    if (isatty(2) && comm->rank == 0) fputc('\n', stderr);
    rc = finish(comm, err);
    /* A run that diverged is where its first non-finite step is looked into most. */
    if (err == KILN_ERR_NUMERIC && trained && comm->rank == 0) trouble_hint(trained);
out:
    kiln_comm_free(comm);
    free(poison);
    free(sets.v);
    return rc;
}

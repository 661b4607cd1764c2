/* cmd_sweep.c - kiln sweep: submit a spec's points to Slurm or a local pool; their status;
 * the body of one point's job. docs/orchestration.md. */
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"
#include "core.h"
#include "sweep.h"

static volatile int got_term;

static void on_term(int sig) {
    (void)sig;
    got_term = 1;
}

/* SIGTERM and SIGINT set got_term and interrupt waitpid (no SA_RESTART). */
static void catch_term(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

static void print_note(void *ctx, const char *line) {
    (void)ctx;
    printf("%s\n", line);
    fflush(stdout);
}

/* The kiln binary the jobs run: this one. */
static int self_path(char *buf, size_t n) {
    ssize_t len = readlink("/proc/self/exe", buf, n - 1);
    if (len <= 0) return cli_usage_error("cannot find the kiln binary (/proc/self/exe)");
    buf[len] = 0;
    return 0;
}

/* DIR made absolute (it need not exist): the batch scripts and the jobs name it. */
static int absolute(const char *dir, char *buf, size_t n) {
    char cwd[PATH_MAX];
    if (dir[0] == '/') {
        snprintf(buf, n, "%s", dir);
    } else if (!getcwd(cwd, sizeof cwd)) {
        return cli_usage_error("cannot read the current directory");
    } else if ((size_t)snprintf(buf, n, "%s/%s", cwd, dir) >= n) {
        return cli_usage_error("--root '%s': the path is too long", dir);
    }
    return 0;
}

static int sweep_submit(int argc, char **argv) {
    const char *root = NULL, *scheduler = "slurm";
    long max_parallel = 0;
    bool extend = false;
    const cli_opt opts[] = {
        {"root", CLI_STR, &root, "DIR", "the sweep's directory: a run directory per point", true},
        {"scheduler", CLI_STR, &scheduler, "slurm|local",
         "submit with sbatch (default), or run a pool of processes here until every point ends",
         false},
        {"max-parallel", CLI_INT, &max_parallel, "N",
         "jobs running at once (local: default the CPU count; Slurm: default no limit)", false},
        {"extend", CLI_FLAG, &extend, NULL,
         "accept a spec that only adds points to the sweep in --root", false},
        {0},
    };
    const cli_spec spec = {
        "kiln sweep SPEC.json --root DIR [--scheduler slurm|local] [--max-parallel N] [--extend]\n"
        "       kiln sweep status DIR [--json]",
        "Train every point of a sweep spec as a job: submitted to Slurm, or a local pool; "
        "points finished, queued or running are not submitted again.",
        opts, 1, 1};
    const char *args[1];
    int rc;
    if (!cli_parse_args(&spec, argc, argv, args, &rc)) return rc;
    char abs_root[PATH_MAX];
    if ((rc = absolute(root, abs_root, sizeof abs_root))) return rc;
    kiln_sweep_opts o = {.root = abs_root,
                         .max_parallel = (int)max_parallel,
                         .extend = extend,
                         .note = print_note,
                         .stop = &got_term};
    if (!strcmp(scheduler, "slurm"))
        o.scheduler = KILN_SWEEP_SLURM;
    else if (!strcmp(scheduler, "local"))
        o.scheduler = KILN_SWEEP_LOCAL;
    else
        return cli_usage_error("--scheduler '%s': expected slurm or local", scheduler);
    if (max_parallel < 0 || max_parallel > 100000)
        return cli_usage_error(
            "--max-parallel %ld: expected a number from 1 to 100000 (0: the default)",
            max_parallel);
    char self[PATH_MAX];
    if ((rc = self_path(self, sizeof self))) return rc;
    o.kiln = self;
    kiln_sweep_spec s;
    kiln_err err = kiln_sweep_spec_load(args[0], &s);
    if (err) return cli_fail(err);
    if (o.scheduler == KILN_SWEEP_LOCAL) catch_term();
    kiln_sweep_result r;
    err = kiln_sweep_submit(&s, &o, &r);
    size_t n = s.n_points;
    kiln_sweep_spec_release(&s);
    if (err) return cli_fail(err);
    if (o.scheduler == KILN_SWEEP_SLURM) {
        if (!r.submitted)
            printf("nothing to submit: %zu of %zu points finished, %zu queued or running\n",
                   r.finished, n, r.active);
        else
            printf("submitted %zu point%s to Slurm; %zu finished, %zu queued or running before\n",
                   r.submitted, r.submitted == 1 ? "" : "s", r.finished, r.active);
        return 0;
    }
    if (!r.submitted && !r.preemptions) {
        printf("nothing to submit: %zu of %zu points finished, %zu running\n", r.finished, n,
               r.active);
        return 0;
    }
    printf("%zu point%s run: %zu finished, %zu failed; %zu preemption%s resumed\n", r.submitted,
           r.submitted == 1 ? "" : "s", r.finished, r.failed, r.preemptions,
           r.preemptions == 1 ? "" : "s");
    if (r.failed) {
        fprintf(stderr, "kiln: error: %zu point%s failed (kiln sweep status %s)\n", r.failed,
                r.failed == 1 ? "" : "s", root);
        return 1;
    }
    return 0;
}

int cmd_sweep(int argc, char **argv) {
    return sweep_submit(argc, argv);
}

int cmd_sweep_job(int argc, char **argv) {
    const char *root = NULL, *point = NULL;
    const cli_opt opts[] = {
        {"root", CLI_STR, &root, "DIR", "the sweep's directory", true},
        {"point", CLI_STR, &point, "NAME", "the point to train", true},
        {0},
    };
    const cli_spec spec = {
        "kiln sweep job --root DIR --point NAME",
        "The body of a sweep point's job (its batch script runs it): train the point, or resume "
        "it; after SIGTERM record the preemption and requeue the job.",
        opts, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) return rc;
    char self[PATH_MAX];
    if ((rc = self_path(self, sizeof self))) return rc;
    catch_term();
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    const char *job = getenv("SLURM_JOB_ID"), *node = getenv("SLURMD_NODENAME");
    char local_id[32];
    snprintf(local_id, sizeof local_id, "local-%ld", (long)getpid());
    const char *rs = job ? getenv("SLURM_RESTART_COUNT") : getenv("KILN_SWEEP_RESTART");
    kiln_sweep_job_env env = {.root = root,
                              .point = point,
                              .kiln = self,
                              .slurm = job != NULL,
                              .job_id = job ? job : local_id,
                              .restart = rs ? strtol(rs, NULL, 10) : 0,
                              .node = node ? node : host,
                              .term = &got_term};
    kiln_sweep_job_end end;
    int code;
    kiln_err err = kiln_sweep_job(&env, &end, &code);
    if (err) return cli_fail(err);
    static const char *const said[] = {"finished", "stopped by SIGTERM; requeued",
                                       "stopped by SIGTERM; the pool runs it again", "failed"};
    fprintf(stderr, "kiln: sweep point '%s' (job %s, restart %ld): %s\n", point, env.job_id,
            env.restart, said[end]);
    return code;
}

static void fmt_loss(const json_t *v, char *out, size_t n) {
    if (json_is_number(v))
        snprintf(out, n, "%.6g", json_number_value(v));
    else
        snprintf(out, n, "-");
}

int cmd_sweep_status(int argc, char **argv) {
    bool as_json = false;
    const cli_opt opts[] = {
        {"json", CLI_FLAG, &as_json, NULL, "the whole status as JSON (kiln-sweep-status/1)", false},
        {0},
    };
    const cli_spec spec = {"kiln sweep status DIR [--json]",
                           "Each point of the sweep in DIR: its state, the scheduler's job, its "
                           "step and best validation loss.",
                           opts, 1, 1};
    const char *args[1];
    int rc;
    if (!cli_parse_args(&spec, argc, argv, args, &rc)) return rc;
    json_t *doc;
    kiln_err err = kiln_sweep_status(args[0], &doc);
    if (err) return cli_fail(err);
    if (as_json) {
        rc = cli_print_json(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        json_decref(doc);
        return rc;
    }
    const json_t *pts = json_object_get(doc, "points");
    int w = 5;
    size_t i;
    json_t *p;
    json_array_foreach(pts, i, p) {
        int l = (int)strlen(cli_jstr(p, "name"));
        if (l > w) w = l;
    }
    printf("%-*s  %-13s %-12s %-12s %-11s %-4s %-13s %s\n", w, "point", "state", "job", "scheduler",
           "step", "pre", "best val_loss", "node / why");
    size_t counts[6] = {0};
    static const char *const states[] = {"finished",  "running", "queued",
                                         "preempted", "failed",  "not submitted"};
    json_array_foreach(pts, i, p) {
        char step[32], loss[48];
        if (cli_jint(p, "steps"))
            snprintf(step, sizeof step, "%lld/%lld", cli_jint(p, "step"), cli_jint(p, "steps"));
        else
            snprintf(step, sizeof step, "-"); /* no run yet */
        fmt_loss(json_object_get(p, "best_val_loss"), loss, sizeof loss);
        if (cli_jint(p, "best_val_step")) {
            size_t l = strlen(loss);
            snprintf(loss + l, sizeof loss - l, " @%lld", cli_jint(p, "best_val_step"));
        }
        const char *node = json_string_value(json_object_get(p, "node"));
        const char *why = json_string_value(json_object_get(p, "why"));
        const char *job = json_string_value(json_object_get(p, "job"));
        const char *ss = json_string_value(json_object_get(p, "scheduler_state"));
        char pre[32];
        snprintf(pre, sizeof pre, "%lld", cli_jint(p, "preemptions"));
        printf("%-*s  %-13s %-12s %-12s %-11s %-4s %-13s %s\n", w, cli_jstr(p, "name"),
               cli_jstr(p, "state"), job ? job : "-", ss ? ss : "-", step, pre, loss,
               node  ? node
               : why ? why
                     : "");
        for (size_t k = 0; k < KILN_ARRAY_LEN(states); k++)
            counts[k] += !strcmp(cli_jstr(p, "state"), states[k]);
    }
    printf("%zu points:", json_array_size(pts));
    bool first = true;
    for (size_t k = 0; k < KILN_ARRAY_LEN(states); k++)
        if (counts[k]) {
            printf("%s %zu %s", first ? "" : ",", counts[k], states[k]);
            first = false;
        }
    printf("\n");
    const char *se = json_string_value(json_object_get(doc, "scheduler_error"));
    if (se) fprintf(stderr, "kiln: warning: %s (the states come from the runs alone)\n", se);
    json_decref(doc);
    return 0;
}

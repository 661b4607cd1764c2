/* sweep.c - a sweep's root (its records), submission to Slurm or the local pool, the job
 * that trains one point, and the status of every point. docs/orchestration.md. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "runs.h"
#include "sweep_int.h"
#include "train.h"

#define SWEEP_FORMAT "kiln-sweep/1"
#define JOBS_FORMAT "kiln-sweep-jobs/1"
/* A job that was stopped by SIGTERM after its checkpoint, for the local pool to rerun. */
#define EXIT_PREEMPTED 75

static void note(const kiln_sweep_opts *o, const char *fmt, ...) KILN_PRINTF(2, 3);
static void note(const kiln_sweep_opts *o, const char *fmt, ...) {
    if (!o->note) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    o->note(o->note_ctx, line);
}

static char *root_file(const char *root, const char *name) {
    char *p = kiln_path_join(root, name);
    if (!p) kiln_fail(KILN_ERR_NOMEM, "out of memory");
    return p;
}

/* ---- the root's records: sweep.json and jobs.json ---- */

/* ROOT/sweep.json, or *out NULL when there is none. */
static kiln_err load_record(const char *root, json_t **out) {
    *out = NULL;
    char *p = root_file(root, "sweep.json");
    if (!p) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    if (kiln_path_exists(p)) {
        rc = kiln_json_load_file(p, out);
        if (!rc && (!json_is_object(*out) ||
                    strcmp(sweep_or(json_string_value(json_object_get(*out, "format")), ""),
                           SWEEP_FORMAT) ||
                    !json_is_array(json_object_get(*out, "points")))) {
            json_decref(*out);
            *out = NULL;
            rc = kiln_fail(KILN_ERR_FORMAT, "'%s': not a kiln sweep record (format %s)", p,
                           SWEEP_FORMAT);
        }
    }
    free(p);
    return rc;
}

static kiln_err load_jobs(const char *root, json_t **out) {
    *out = NULL;
    char *p = root_file(root, "jobs.json");
    if (!p) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    if (kiln_path_exists(p)) {
        rc = kiln_json_load_file(p, out);
        if (!rc && !json_is_array(json_object_get(*out, "jobs"))) {
            json_decref(*out);
            *out = NULL;
            rc = kiln_fail(KILN_ERR_FORMAT, "'%s': not a kiln sweep job list (format %s)", p,
                           JOBS_FORMAT);
        }
    } else {
        *out = json_pack("{s:s, s:[]}", "format", JOBS_FORMAT, "jobs");
        if (!*out) rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    free(p);
    return rc;
}

/* The significant digits that make every real in j (nested too) read back exactly, at least
 * need (what the values before needed): few, so 0.003 stays 0.003, and enough that
 * 0.0010000000000000002 keeps its digits. */
static int exact_digits(const json_t *j, int need) {
    if (json_is_real(j)) return sweep_digits(json_real_value(j), need);
    const char *k;
    json_t *v;
    size_t i;
    if (json_is_object(j)) {
        json_object_foreach((json_t *)j, k, v) {
            if (need == 17) break;
            need = exact_digits(v, need);
        }
    } else if (json_is_array(j)) {
        json_array_foreach(j, i, v) {
            if (need == 17) break;
            need = exact_digits(v, need);
        }
    }
    return need;
}

/* kiln_json_load_file reads no more (core/json.c): a record must not be written larger. */
#define RECORD_LIMIT (64u << 20)

/* j's text for ROOT/NAME into *out (caller frees), *len bytes: pretty, with every value
 * exact (kiln_json_write_file keeps 15 digits, for documents people read; a sweep's records
 * are read back and compared), and no larger than RECORD_LIMIT. */
static kiln_err record_text(const char *root, const char *name, const json_t *j, char **out,
                            size_t *len) {
    *out = NULL;
    char *t =
        json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(exact_digits(j, 1)));
    char *u = t ? realloc(t, strlen(t) + 2) : NULL;
    if (!u) {
        free(t);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory encoding '%s/%s'", root, name);
    }
    size_t n = strlen(u);
    u[n] = '\n';
    u[n + 1] = 0;
    *len = n + 1;
    if (*len > RECORD_LIMIT) {
        free(u);
        return kiln_fail(KILN_ERR_LIMIT,
                         "'%s/%s' would be %zu bytes, more than kiln reads back (%u MiB): a "
                         "spec of fewer points, or shorter values",
                         root, name, *len, RECORD_LIMIT >> 20);
    }
    *out = u;
    return KILN_OK;
}

/* ROOT/NAME written atomically (record_text). */
static kiln_err save_json(const char *root, const char *name, const json_t *j) {
    size_t n;
    char *t;
    KILN_TRY(record_text(root, name, j, &t, &n));
    char *p = root_file(root, name);
    kiln_err rc = p ? kiln_write_file_atomic(p, t, n) : KILN_ERR_NOMEM;
    free(p);
    free(t);
    return rc;
}

/* Append {point, scheduler, job, submitted} to jobs.json (rewritten atomically). */
static kiln_err record_job(const char *root, json_t *jobs, const char *point, const char *sched,
                           const char *job) {
    char t[21];
    kiln_format_time(kiln_unix_time(), t);
    json_t *e = json_pack("{s:s, s:s, s:s, s:s}", "point", point, "scheduler", sched, "job", job,
                          "submitted", t);
    if (!e || json_array_append_new(json_object_get(jobs, "jobs"), e))
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    return save_json(root, "jobs.json", jobs);
}

/* *x: each point of jobs.json -> the index of its newest job (keys borrowed from jobs). */
static kiln_err index_jobs(const json_t *jobs, sweep_index *x) {
    const json_t *arr = json_object_get(jobs, "jobs");
    KILN_TRY(sweep_index_init(x, json_array_size(arr)));
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e) {
        const char *pt = json_string_value(json_object_get(e, "point"));
        if (pt) KILN_TRY(sweep_index_put(x, pt, i));
    }
    return KILN_OK;
}

/* The newest job recorded for a point, or NULL. */
static const json_t *last_job(const json_t *jobs, const sweep_index *x, const char *point) {
    size_t i = sweep_index_get(x, point);
    return i == SIZE_MAX ? NULL : json_array_get(json_object_get(jobs, "jobs"), i);
}

/* ---- what Slurm says ---- */

typedef struct sched_job {
    char id[32], state[32], node[128], reason[128];
} sched_job;

typedef struct sched_view {
    sched_job *jobs;
    size_t n;
} sched_view;

/* Every job the controller holds (squeue --states=all: pending, running and those that ended
 * less than MinJobAge ago). An unreachable controller or a missing squeue fails, saying so. */
static kiln_err slurm_view(sched_view *v) {
    memset(v, 0, sizeof *v);
    /* Slurm's clients retry a missing slurm.conf for a minute: say so at once instead. */
    const char *conf = getenv("SLURM_CONF");
    if (!conf || !*conf) conf = "/etc/slurm/slurm.conf";
    KILN_FAIL_IF(!kiln_path_exists(conf), KILN_ERR_NOTFOUND,
                 "no Slurm cluster configured here: '%s' does not exist (set SLURM_CONF to the "
                 "cluster's slurm.conf, or use --scheduler local)",
                 conf);
    const char *argv[] = {"squeue", "-h", "--states=all", "-o", "%i|%T|%N|%r", NULL};
    char *out = NULL, *err = NULL;
    int st;
    kiln_err rc = sweep_capture(argv, &out, &err, &st);
    if (rc == KILN_ERR_NOTFOUND)
        return kiln_fail(
            KILN_ERR_NOTFOUND,
            "Slurm's squeue is not installed here (Debian: apt-get install slurm-client)");
    if (rc) return rc;
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
        char *nl = strchr(err, '\n'), *msg = err;
        if (nl) *nl = 0;
        if (!strncmp(msg, "squeue: ", 8)) msg += 8;
        rc = kiln_fail(KILN_ERR_NETWORK, "the Slurm controller is not reachable: squeue: %s",
                       *msg ? msg : "failed");
        goto out;
    }
    for (char *line = out; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char *f[4] = {line, NULL, NULL, NULL};
        for (int i = 1; i < 4 && f[i - 1]; i++) {
            char *bar = strchr(f[i - 1], '|');
            if (bar) *bar = 0, f[i] = bar + 1;
        }
        if (f[3]) {
            sched_job *nj = realloc(v->jobs, (v->n + 1) * sizeof *nj);
            if (!nj) {
                rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
                goto out;
            }
            v->jobs = nj;
            sched_job *j = &v->jobs[v->n++];
            snprintf(j->id, sizeof j->id, "%s", f[0]);
            snprintf(j->state, sizeof j->state, "%s", f[1]);
            snprintf(j->node, sizeof j->node, "%s", f[2]);
            snprintf(j->reason, sizeof j->reason, "%s", f[3]);
        }
        line = nl ? nl + 1 : NULL;
    }
out:
    free(out);
    free(err);
    return rc;
}

/* *x: each job id of v -> its index (keys borrowed from v). */
static kiln_err index_view(const sched_view *v, sweep_index *x) {
    KILN_TRY(sweep_index_init(x, v->n));
    for (size_t i = 0; i < v->n; i++)
        KILN_TRY(sweep_index_put(x, v->jobs[i].id, i));
    return KILN_OK;
}

static const sched_job *view_find(const sched_view *v, const sweep_index *x, const char *id) {
    size_t i = sweep_index_get(x, id);
    return i == SIZE_MAX ? NULL : &v->jobs[i];
}

/* Queued or running in Slurm's eyes (a job being requeued counts: it comes back). */
static bool slurm_active(const char *state) {
    static const char *const active[] = {"PENDING",   "RUNNING",      "CONFIGURING", "COMPLETING",
                                         "REQUEUED",  "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
                                         "SUSPENDED", "STOPPED",      "SIGNALING",   "STAGE_OUT"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(active); i++)
        if (!strcmp(state, active[i])) return true;
    return false;
}

/* ---- a point's run ---- */

typedef struct run_view {
    bool exists; /* run.json or metrics.db */
    kiln_run_state state;
    bool live;
    long step, steps, best_step, ckpt;
    double best_val;
    char *message; /* the trainer's, when it failed */
    long preemptions, requeues;
    char *last_kind; /* the newest event's kind */
    long last_kind_step;
} run_view;

static void run_view_release(run_view *r) {
    free(r->message);
    free(r->last_kind);
}

static kiln_err load_run(const char *dir, run_view *r) {
    memset(r, 0, sizeof *r);
    r->best_val = NAN;
    char *a = kiln_path_join(dir, "run.json"), *b = kiln_path_join(dir, "metrics.db");
    if (!a || !b) {
        free(a);
        free(b);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    r->exists = kiln_path_exists(a) || kiln_path_exists(b);
    free(a);
    free(b);
    if (!r->exists) return KILN_OK;
    kiln_run_info ri;
    KILN_TRY(kiln_run_info_load(dir, 100000, &ri));
    kiln_err rc = kiln_run_live(dir, &r->live);
    if (rc) {
        kiln_run_info_release(&ri);
        return rc;
    }
    r->state = kiln_run_state_of(&ri, r->live);
    r->step = ri.last_step;
    json_t *steps = json_object_get(json_object_get(ri.run, "config"), "steps");
    r->steps = json_is_integer(steps) ? (long)json_integer_value(steps) : 0;
    r->best_step = ri.best_val_step;
    if (ri.best_val_step) r->best_val = ri.best_val_loss;
    r->ckpt = ri.n_ckpts ? ri.ckpts[ri.n_ckpts - 1] : 0;
    if (ri.stop_message) r->message = kiln_strdup(ri.stop_message);
    for (size_t i = 0; i < ri.n_events; i++) {
        r->preemptions += !strcmp(ri.events[i].kind, "preempted");
        r->requeues += !strcmp(ri.events[i].kind, "requeued");
    }
    if (ri.n_events) {
        r->last_kind = kiln_strdup(ri.events[ri.n_events - 1].kind);
        r->last_kind_step = ri.events[ri.n_events - 1].step;
    }
    kiln_run_info_release(&ri);
    return KILN_OK;
}

/* ---- submission ---- */

/* The record for spec: {format, digest, data, data_sha256, spec, points: [{name, ranks,
 * overrides}]}. */
static json_t *make_record(const kiln_sweep_spec *spec, const json_t *old) {
    json_t *pts = json_array();
    json_t *r = json_pack("{s:s, s:s, s:s, s:s, s:O, s:o}", "format", SWEEP_FORMAT, "digest",
                          spec->digest, "data", spec->data, "data_sha256", spec->data_sha256,
                          "spec", spec->spec, "points", pts);
    if (!r) return NULL;
    for (size_t i = 0; i < spec->n_points; i++) {
        const kiln_sweep_point *p = &spec->points[i];
        if (json_array_append_new(pts, json_pack("{s:s, s:i, s:O}", "name", p->name, "ranks",
                                                 p->ranks, "overrides", p->overrides))) {
            json_decref(r);
            return NULL;
        }
    }
    /* An extended sweep keeps the digests it was before. */
    json_t *hist = json_array();
    if (!hist || json_object_set_new(r, "extends", hist)) {
        json_decref(r);
        return NULL;
    }
    if (old) {
        json_t *prev = json_object_get(old, "extends");
        size_t i;
        json_t *v;
        json_array_foreach(prev, i, v) json_array_append(hist, v);
        json_array_append(hist, json_object_get(old, "digest"));
    }
    return r;
}

/* What a root holds: absent, empty (but for the lock file), or more. */
static kiln_dir_state root_state(const char *root) {
    struct stat sb;
    if (stat(root, &sb)) return KILN_DIR_ABSENT;
    if (!S_ISDIR(sb.st_mode)) return KILN_DIR_OTHER;
    DIR *d = opendir(root);
    if (!d) return KILN_DIR_OTHER;
    kiln_dir_state st = KILN_DIR_EMPTY;
    for (struct dirent *e; st == KILN_DIR_EMPTY && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, ".sweep.lock"))
            st = KILN_DIR_FULL;
    closedir(d);
    return st;
}

/* A config as the trainer reads it, as JSON: a recorded jobs/NAME.json and a spec's point
 * compare by value (an integer and the same real, any digits that read back the same). */
static json_t *config_value(const json_t *j) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    json_t *v =
        kiln_train_config_apply(&c, j, "recorded config") ? NULL : kiln_train_config_json(&c);
    kiln_errclear();
    return v;
}

/* The root must be new, empty, or hold this spec's sweep (or, with extend, one whose points
 * this spec all has, unchanged: checked when points), on the same dataset bytes. Called with
 * the root's lock held (and once before, without points, to refuse a foreign root without
 * making anything in it). *old: the record found (NULL: none). */
static kiln_err check_root(const kiln_sweep_spec *spec, const kiln_sweep_opts *o, bool points,
                           json_t **old) {
    *old = NULL;
    kiln_dir_state ds = root_state(o->root);
    KILN_FAIL_IF(ds == KILN_DIR_OTHER, KILN_ERR_USAGE, "--root '%s' is not a directory", o->root);
    if (ds == KILN_DIR_ABSENT || ds == KILN_DIR_EMPTY) return KILN_OK;
    KILN_TRY(load_record(o->root, old));
    if (!*old && !points) {
        /* Before the lock: a root another submitter is filling (its lock file is there, its
         * sweep.json not yet) is for the check under the lock to judge, once it is done. */
        char *lock = kiln_path_join(o->root, ".sweep.lock");
        bool filling = lock && kiln_path_exists(lock);
        free(lock);
        if (filling) return KILN_OK;
    }
    KILN_FAIL_IF(!*old, KILN_ERR_CONFLICT,
                 "--root '%s' is not empty and holds no sweep (no sweep.json): give a new or "
                 "empty directory",
                 o->root);
    kiln_err rc = KILN_OK;
    sweep_index names = {0};
    json_t *want = NULL;
    /* The dataset's bytes (recorded since kiln-sweep/1 roots carry data_sha256; an older
     * root's is taken as it is now). */
    const char *was_sha = json_string_value(json_object_get(*old, "data_sha256"));
    if (was_sha && strcmp(was_sha, spec->data_sha256)) {
        rc = kiln_fail(KILN_ERR_CONFLICT,
                       "the sweep in '%s' trained on other bytes of its dataset '%s' (sha256 "
                       "%.16s..., now %.16s...): its points would mix datasets; restore the "
                       "file, or use another root",
                       o->root, spec->data, was_sha, spec->data_sha256);
        goto fail;
    }
    const char *digest = sweep_or(json_string_value(json_object_get(*old, "digest")), "?");
    if (!strcmp(digest, spec->digest)) return KILN_OK;
    if (!o->extend) {
        rc = kiln_fail(KILN_ERR_CONFLICT,
                       "--root '%s' holds the runs of another spec (sha256 %.16s..., this one "
                       "%.16s...): use another root, or --extend if this spec only adds points",
                       o->root, digest, spec->digest);
        goto fail;
    }
    const char *data = sweep_or(json_string_value(json_object_get(*old, "data")), "");
    if (strcmp(data, spec->data)) {
        rc = kiln_fail(KILN_ERR_CONFLICT,
                       "--extend: the sweep in '%s' trains on '%s', this spec on '%s'", o->root,
                       data, spec->data);
        goto fail;
    }
    if (!points) return KILN_OK;
    KILN_CHECK(rc, fail, sweep_index_init(&names, spec->n_points));
    for (size_t k = 0; k < spec->n_points; k++)
        KILN_CHECK(rc, fail, sweep_index_put(&names, spec->points[k].name, k));
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(*old, "points"), i, p) {
        const char *name = sweep_or(json_string_value(json_object_get(p, "name")), "?");
        size_t k = sweep_index_get(&names, name);
        if (k == SIZE_MAX) {
            rc = kiln_fail(KILN_ERR_CONFLICT,
                           "--extend: point '%s' of the sweep in '%s' is not in the new spec (it "
                           "may only add points)",
                           name, o->root);
            goto fail;
        }
        const kiln_sweep_point *np = &spec->points[k];
        /* The point's whole config as recorded in jobs/NAME.json must not change either. */
        char *cp = kiln_asprintf("%s/jobs/%s.json", o->root, name);
        json_t *was = NULL, *had = NULL;
        KILN_CHECK_IF(rc, fail, !cp, KILN_ERR_NOMEM, "out of memory");
        want = kiln_train_config_json(&np->config);
        if (!want) {
            free(cp);
            rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
            goto fail;
        }
        bool same = !kiln_json_load_file(cp, &was) && (had = config_value(was)) &&
                    json_equal(had, want) &&
                    json_integer_value(json_object_get(p, "ranks")) == np->ranks;
        kiln_errclear();
        json_decref(was);
        json_decref(had);
        json_decref(want);
        want = NULL;
        free(cp);
        if (!same) {
            rc = kiln_fail(KILN_ERR_CONFLICT,
                           "--extend: point '%s' of the sweep in '%s' has another config in the "
                           "new spec (it may only add points)",
                           name, o->root);
            goto fail;
        }
    }
    sweep_index_release(&names);
    return KILN_OK;
fail:
    sweep_index_release(&names);
    json_decref(want);
    json_decref(*old);
    *old = NULL;
    return rc;
}

/* jobs/NAME.json (the whole config) and, for Slurm, jobs/NAME.sh (the batch script). */
static kiln_err write_point_files(const kiln_sweep_spec *spec, const kiln_sweep_opts *o,
                                  size_t idx) {
    const kiln_sweep_point *p = &spec->points[idx];
    kiln_err rc = KILN_OK;
    char *cfg = kiln_asprintf("%s/jobs/%s.json", o->root, p->name);
    char *sh = kiln_asprintf("%s/jobs/%s.sh", o->root, p->name);
    char *log = kiln_asprintf("%s/jobs/%s.log", o->root, p->name);
    char *qk = sweep_shell_quote(o->kiln), *qr = sweep_shell_quote(o->root),
         *qp = sweep_shell_quote(p->name);
    char *text = kiln_train_config_text(&p->config, true);
    KILN_CHECK_IF(rc, out, !cfg || !sh || !log || !qk || !qr || !qp || !text, KILN_ERR_NOMEM,
                  "out of memory");
    /* The trainer's own text of the config: every number exact. */
    KILN_CHECK(rc, out, kiln_write_file_atomic(cfg, text, strlen(text)));
    free(text);
    text = NULL;
    if (o->scheduler != KILN_SWEEP_SLURM) goto out;
    char extra[512] = "";
    size_t n = 0;
    const kiln_sweep_slurm *sl = &spec->slurm;
    if (sl->partition)
        n += (size_t)snprintf(extra + n, sizeof extra - n, "#SBATCH --partition=%s\n",
                              sl->partition);
    if (sl->time)
        n += (size_t)snprintf(extra + n, sizeof extra - n, "#SBATCH --time=%s\n", sl->time);
    if (sl->gpus)
        n +=
            (size_t)snprintf(extra + n, sizeof extra - n, "#SBATCH --gpus-per-task=%d\n", sl->gpus);
    /* --max-parallel N: N job names, each a singleton (one job of a name runs at a time). */
    char name[96];
    if (o->max_parallel > 0) {
        snprintf(name, sizeof name, "kiln-%.12s-%zu", spec->digest, idx % (size_t)o->max_parallel);
        n += (size_t)snprintf(extra + n, sizeof extra - n, "#SBATCH --dependency=singleton\n");
    } else {
        snprintf(name, sizeof name, "kiln-%.12s", spec->digest);
    }
    text = kiln_asprintf(
        "#!/bin/sh\n"
        "#SBATCH --job-name=%s\n"
        "#SBATCH --output=%s\n"
        "#SBATCH --open-mode=append\n"
        "#SBATCH --requeue\n"
        "#SBATCH --signal=TERM@%d\n"
        "#SBATCH --ntasks=%d\n"
        "#SBATCH --cpus-per-task=%d\n"
        "%s"
        "# Point '%s' of the kiln sweep in %s (spec sha256 %s).\n"
        "# Written by kiln sweep; docs/orchestration.md. The job trains the point, or resumes it\n"
        "# from its newest checkpoint after a requeue; SIGTERM (a preemption, or the time limit\n"
        "# coming) makes the trainer checkpoint, and the job requeues itself.\n"
        "exec %s sweep job --root %s --point %s\n",
        name, log, sl->signal_seconds, p->ranks, sl->cpus, extra, p->name, o->root, spec->digest,
        qk, qr, qp);
    KILN_CHECK_IF(rc, out, !text, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_write_file_atomic(sh, text, strlen(text)));
    if (chmod(sh, 0755)) rc = kiln_fail_errno(KILN_ERR_IO, "'%s': chmod", sh);
out:
    free(cfg);
    free(sh);
    free(log);
    free(qk);
    free(qr);
    free(qp);
    free(text);
    return rc;
}

/* scancel the jobs this call submitted (after a later submission failed). */
static void cancel_jobs(char **ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const char *argv[] = {"scancel", ids[i], NULL};
        int st;
        sweep_capture(argv, NULL, NULL, &st);
    }
    kiln_errclear();
}

static kiln_err submit_slurm(const kiln_sweep_spec *spec, const kiln_sweep_opts *o, json_t *jobs,
                             const bool *todo, kiln_sweep_result *res) {
    kiln_err rc = KILN_OK;
    char **ids = kiln_calloc(spec->n_points, sizeof *ids);
    size_t n_ids = 0;
    if (!ids) return KILN_ERR_NOMEM;
    for (size_t i = 0; i < spec->n_points && !rc; i++) {
        if (!todo[i]) continue;
        char *sh = kiln_asprintf("%s/jobs/%s.sh", o->root, spec->points[i].name);
        if (!sh) {
            rc = KILN_ERR_NOMEM;
            break;
        }
        const char *argv[] = {"sbatch", "--parsable", sh, NULL};
        char *out = NULL, *err = NULL;
        int st;
        rc = sweep_capture(argv, &out, &err, &st);
        if (!rc && (!WIFEXITED(st) || WEXITSTATUS(st))) {
            char *nl = strchr(err, '\n');
            if (nl) *nl = 0;
            rc = kiln_fail(KILN_ERR_NETWORK, "sbatch '%s': %s", sh, *err ? err : "failed");
        }
        if (!rc) {
            /* --parsable: "ID" or "ID;CLUSTER". */
            out[strcspn(out, ";\n")] = 0;
            ids[n_ids] = kiln_strdup(out);
            if (!ids[n_ids] || !*out)
                rc = kiln_fail(KILN_ERR_FORMAT, "sbatch printed no job id");
            else
                n_ids++;
        }
        if (!rc) rc = record_job(o->root, jobs, spec->points[i].name, "slurm", ids[n_ids - 1]);
        if (!rc) {
            res->submitted++;
            note(o, "submitted %s as Slurm job %s", spec->points[i].name, ids[n_ids - 1]);
        }
        free(out);
        free(err);
        free(sh);
    }
    if (rc && n_ids) {
        /* Nothing half-submitted: the jobs of this call are cancelled, and jobs.json says so. */
        kiln_err keep = rc;
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", kiln_errmsg());
        cancel_jobs(ids, n_ids);
        sweep_index mine = {0};
        bool indexed = !sweep_index_init(&mine, n_ids);
        for (size_t k = 0; k < n_ids && indexed; k++)
            indexed = !sweep_index_put(&mine, ids[k], k);
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(jobs, "jobs"), i, e) {
            const char *id = sweep_or(json_string_value(json_object_get(e, "job")), "");
            if (indexed && sweep_index_get(&mine, id) != SIZE_MAX)
                json_object_set_new(e, "cancelled", json_true());
        }
        sweep_index_release(&mine);
        save_json(o->root, "jobs.json", jobs);
        rc = kiln_fail(keep, "%s; the %zu job%s submitted before it were cancelled", msg, n_ids,
                       n_ids == 1 ? "" : "s");
        res->submitted = 0;
    }
    for (size_t i = 0; i < n_ids; i++)
        free(ids[i]);
    free(ids);
    return rc;
}

/* The local pool: up to max_parallel jobs at once, each `kiln sweep job` in a process group
 * of its own; a job that exits EXIT_PREEMPTED is started again (its restart count one more). */
static kiln_err run_local(const kiln_sweep_spec *spec, const kiln_sweep_opts *o, json_t *jobs,
                          const bool *todo, kiln_sweep_result *res) {
    typedef struct {
        pid_t pid;
        size_t point;
        long restart;
    } slot;
    size_t n_todo = 0;
    for (size_t i = 0; i < spec->n_points; i++)
        n_todo += todo[i];
    int width = o->max_parallel > 0 ? o->max_parallel : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (width < 1) width = 1;
    slot *run = kiln_calloc((size_t)width, sizeof *run);
    size_t *queue = kiln_calloc(n_todo + 1, sizeof *queue);
    long *restarts = kiln_calloc(spec->n_points + 1, sizeof *restarts);
    if (!run || !queue || !restarts) {
        free(run);
        free(queue);
        free(restarts);
        return KILN_ERR_NOMEM;
    }
    size_t qn = 0, qhead = 0;
    for (size_t i = 0; i < spec->n_points; i++)
        if (todo[i]) queue[qn++] = i;
    kiln_err rc = KILN_OK;
    int running = 0;
    bool stopping = false;
    for (;;) {
        while (!rc && !stopping && running < width && qhead < qn) {
            size_t pi = queue[qhead++];
            char rs[32];
            snprintf(rs, sizeof rs, "KILN_SWEEP_RESTART=%ld", restarts[pi]);
            const char *env[] = {rs, NULL};
            const char *argv[] = {
                o->kiln, "sweep", "job", "--root", o->root, "--point", spec->points[pi].name, NULL};
            pid_t pid;
            char *log = kiln_asprintf("%s/jobs/%s.log", o->root, spec->points[pi].name);
            if (!log) {
                rc = KILN_ERR_NOMEM;
                break;
            }
            rc = sweep_spawn(argv, env, true, log, &pid);
            free(log);
            if (rc) break;
            char id[32];
            snprintf(id, sizeof id, "local-%ld", (long)pid);
            int k = 0;
            while (run[k].pid)
                k++;
            run[k] = (slot){pid, pi, restarts[pi]};
            running++;
            if (!restarts[pi]) res->submitted++;
            note(o, "%s %s as %s", restarts[pi] ? "restarted" : "started", spec->points[pi].name,
                 id);
            if ((rc = record_job(o->root, jobs, spec->points[pi].name, "local", id))) break;
        }
        if (!running) break;
        int st;
        pid_t pid = waitpid(-1, &st, 0);
        if (pid < 0) {
            if (errno != EINTR) {
                rc = kiln_fail_errno(KILN_ERR_IO, "waitpid");
                break;
            }
            if (o->stop && *o->stop && !stopping) {
                stopping = true;
                for (int k = 0; k < width; k++)
                    if (run[k].pid) kill(-run[k].pid, SIGTERM);
            }
            continue;
        }
        int k = 0;
        while (k < width && run[k].pid != pid)
            k++;
        if (k == width) continue;
        size_t pi = run[k].point;
        run[k].pid = 0;
        running--;
        const char *name = spec->points[pi].name;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            res->finished++;
            note(o, "finished %s", name);
        } else if (WIFEXITED(st) && WEXITSTATUS(st) == EXIT_PREEMPTED && !stopping) {
            res->preemptions++;
            restarts[pi]++;
            note(o, "preempted %s: checkpoint written; requeued", name);
            /* Back into the queue, ahead of the points not started (the slot before qhead
             * held a point already started). */
            queue[--qhead] = pi;
        } else if (WIFEXITED(st) && WEXITSTATUS(st) == EXIT_PREEMPTED) {
            note(o, "stopped %s: checkpoint written", name);
        } else {
            char why[96];
            sweep_status_text(st, why, sizeof why);
            res->failed++;
            note(o, "failed %s: its job %s (jobs/%s.log)", name, why, name);
        }
        if (o->stop && *o->stop && !stopping) {
            stopping = true;
            for (int j = 0; j < width; j++)
                if (run[j].pid) kill(-run[j].pid, SIGTERM);
        }
    }
    free(run);
    free(queue);
    free(restarts);
    if (!rc && stopping)
        rc = kiln_fail(KILN_ERR_INTERRUPTED, "the sweep was stopped; run it again to go on");
    return rc;
}

/* Every path the points' files will have, checked before anything is written. */
static kiln_err check_paths(const kiln_sweep_spec *spec, const kiln_sweep_opts *o) {
    /* sbatch reads #SBATCH lines without a shell: the log path cannot be quoted, so a root
     * whose path holds white space or a quote is refused (the spec's words are checked, and
     * point names hold none). */
    KILN_FAIL_IF(o->scheduler == KILN_SWEEP_SLURM && strpbrk(o->root, " \t\n'\"\\%"),
                 KILN_ERR_USAGE,
                 "--root '%s': a Slurm sweep's root path must have no white space, quotes, '\\' "
                 "or '%%' (sbatch's --output takes it as it is)",
                 o->root);
    size_t rl = strlen(o->root);
    for (size_t i = 0; i < spec->n_points; i++) {
        const char *name = spec->points[i].name;
        /* ROOT/jobs/NAME.json and ROOT/NAME/ckpt/step-NNNNNNNN.safetensors and the like. */
        KILN_FAIL_IF(rl + strlen(name) + 64 >= PATH_MAX, KILN_ERR_USAGE,
                     "--root '%s': the files of point '%s' would have paths longer than %d "
                     "bytes: give a shorter root",
                     o->root, name, PATH_MAX);
    }
    return KILN_OK;
}

/* How long a submitter waits for another one of the same root to finish. */
#define LOCK_WAIT_SECONDS 300

/* The root's lock, held from before anything of the root is read until the submission (or the
 * local pool) ended, and what this call made to take it, taken back when it fails before
 * writing anything. */
typedef struct root_lock {
    int fd;
    bool held;      /* fd is flock'd */
    char *path;     /* ROOT/.sweep.lock */
    bool made_file; /* this call created it */
    char **made;    /* the directories this call made, the root last */
    size_t n_made;
} root_lock;

/* The root and the directories above it that do not exist, made (and recorded in l). */
static kiln_err make_root(const char *root, root_lock *l) {
    size_t depth = 1;
    for (const char *c = root; *c; c++)
        depth += *c == '/';
    char **made = realloc(l->made, (l->n_made + depth) * sizeof *made);
    if (!made) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    l->made = made;
    char *p = kiln_strdup(root);
    if (!p) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_err rc = KILN_OK;
    for (char *c = p + 1;; c++) {
        if (*c && *c != '/') continue;
        char keep = *c;
        *c = 0;
        if (!mkdir(p, 0755)) {
            l->made[l->n_made] = kiln_strdup(p);
            if (!l->made[l->n_made]) {
                rmdir(p);
                rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
                break;
            }
            l->n_made++;
        } else if (errno != EEXIST) {
            rc = kiln_fail_errno(KILN_ERR_IO, "cannot make directory '%s'", p);
            break;
        }
        *c = keep;
        if (!keep) break;
    }
    free(p);
    return rc;
}

/* Release l; undo: remove the lock file and directories this call made (they hold nothing
 * else: nothing was written). The lock file goes while still held, so that a submitter
 * waiting on it sees it gone and takes a new one. */
static void unlock_root(root_lock *l, bool undo) {
    if (l->fd >= 0) {
        if (l->held && undo && l->made_file) unlink(l->path);
        /* The holder's line goes with the hold (best effort: it only guides waiters). */
        if (l->held && ftruncate(l->fd, 0)) {
        }
        close(l->fd);
    }
    for (size_t i = l->n_made; i-- > 0;) {
        if (undo) rmdir(l->made[i]);
        free(l->made[i]);
    }
    free(l->made);
    free(l->path);
    memset(l, 0, sizeof *l);
    l->fd = -1;
}

/* "PID WHAT" into the lock file held: what a waiter reads. */
static kiln_err holder_line(root_lock *l, const char *what) {
    char line[64];
    int n = snprintf(line, sizeof line, "%ld %s\n", (long)getpid(), what);
    if (ftruncate(l->fd, 0) || pwrite(l->fd, line, (size_t)n, 0) != n)
        return kiln_fail_errno(KILN_ERR_IO, "'%s'", l->path);
    return KILN_OK;
}

/* Take the root's lock (ROOT/.sweep.lock, made with the root when absent). Another submitter
 * holds it for seconds: wait for it (LOCK_WAIT_SECONDS at most), so that a second submission
 * of a spec sees the first one's jobs and submits none; a local pool holds it while it runs:
 * refused at once. The holder writes "PID submitting", then "PID local" while its pool runs. */
static kiln_err lock_root(const kiln_sweep_opts *o, root_lock *l) {
    memset(l, 0, sizeof *l);
    l->fd = -1;
    l->path = kiln_path_join(o->root, ".sweep.lock");
    if (!l->path) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    time_t start = time(NULL);
    bool said = false;
    for (;;) {
        KILN_TRY(make_root(o->root, l));
        l->fd = open(l->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
        l->made_file = l->fd >= 0;
        if (l->fd < 0 && errno == EEXIST) l->fd = open(l->path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (l->fd < 0) {
            if (errno == ENOENT) continue; /* removed by a holder that failed: again */
            return kiln_fail_errno(KILN_ERR_IO, "'%s'", l->path);
        }
        while (flock(l->fd, LOCK_EX | LOCK_NB)) {
            if (errno == EINTR) continue;
            if (errno != EWOULDBLOCK) return kiln_fail_errno(KILN_ERR_IO, "'%s': flock", l->path);
            /* The holder's line: "PID submitting" or "PID local". */
            char who[64] = "", by[80] = "";
            ssize_t n = pread(l->fd, who, sizeof who - 1, 0);
            who[n > 0 ? n : 0] = 0;
            bool pool = strstr(who, " local") != NULL;
            who[strcspn(who, " \n")] = 0;
            if (*who) snprintf(by, sizeof by, " (pid %s)", who);
            KILN_FAIL_IF(pool, KILN_ERR_CONFLICT,
                         "'%s': another kiln sweep%s is running its local pool", o->root, by);
            KILN_FAIL_IF(time(NULL) - start >= LOCK_WAIT_SECONDS, KILN_ERR_CONFLICT,
                         "'%s': another kiln sweep%s is still submitting to it after %d s", o->root,
                         by, LOCK_WAIT_SECONDS);
            if (!said) note(o, "waiting for another kiln sweep%s submitting to '%s'", by, o->root);
            said = true;
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        /* The file held must still be the root's: a holder that failed removes the lock file
         * and the root it made, and a waiter then holds a lock nobody else sees. */
        struct stat a, b;
        l->held = true;
        if (!fstat(l->fd, &a) && !stat(l->path, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
            break;
        l->held = false;
        close(l->fd);
        l->fd = -1;
        l->made_file = false;
    }
    return holder_line(l, "submitting");
}

kiln_err kiln_sweep_submit(const kiln_sweep_spec *spec, const kiln_sweep_opts *o,
                           kiln_sweep_result *res) {
    memset(res, 0, sizeof *res);
    json_t *old = NULL, *jobs = NULL, *rec = NULL;
    sched_view view = {0};
    sweep_index jx = {0}, vx = {0};
    bool *todo = NULL, wrote = false;
    char *rec_text = NULL;
    size_t rec_len = 0;
    root_lock lock = {.fd = -1};
    kiln_err rc = KILN_OK;
    /* Before anything is made: every point's paths, and a root that holds something else or
     * another spec (checked again under the lock, which decides). */
    KILN_CHECK(rc, out, check_paths(spec, o));
    KILN_CHECK(rc, out, check_root(spec, o, false, &old));
    json_decref(old);
    old = NULL;
    /* One submitter at a time per root, from before the root's records and the scheduler's
     * view are read until the jobs are recorded: two submissions of one spec then submit
     * each point once, and two specs cannot both take an empty root. */
    KILN_CHECK(rc, out, lock_root(o, &lock));
    KILN_CHECK(rc, out, check_root(spec, o, true, &old));
    KILN_CHECK(rc, out, load_jobs(o->root, &jobs));
    /* The scheduler before anything is written: an unreachable one leaves the root as it was.
     * A local run of a sweep that went to Slurm before asks Slurm too: its jobs may still be
     * queued or running there. */
    bool slurm_jobs = false;
    size_t ji;
    json_t *je;
    json_array_foreach(json_object_get(jobs, "jobs"), ji, je) slurm_jobs |=
        !strcmp(sweep_or(json_string_value(json_object_get(je, "scheduler")), ""), "slurm");
    if (o->scheduler == KILN_SWEEP_LOCAL && slurm_jobs && slurm_view(&view)) {
        rc = kiln_errprefix(KILN_ERR_NETWORK,
                            "the sweep in '%s' has Slurm jobs, which may still run: ", o->root);
        goto out;
    }
    if (o->scheduler == KILN_SWEEP_SLURM) {
        KILN_CHECK(rc, out, slurm_view(&view));
        const char *argv[] = {"sbatch", "--version", NULL};
        int st;
        rc = sweep_capture(argv, NULL, NULL, &st);
        if (rc == KILN_ERR_NOTFOUND)
            rc = kiln_fail(rc, "Slurm's sbatch is not installed here (Debian: apt-get install "
                               "slurm-client)");
        if (rc) goto out;
    }
    KILN_CHECK(rc, out, index_jobs(jobs, &jx));
    KILN_CHECK(rc, out, index_view(&view, &vx));
    todo = kiln_calloc(spec->n_points + 1, sizeof *todo);
    KILN_CHECK_IF(rc, out, !todo, KILN_ERR_NOMEM, "out of memory");
    size_t n_todo = 0;
    for (size_t i = 0; i < spec->n_points; i++) {
        const kiln_sweep_point *p = &spec->points[i];
        char *dir = kiln_path_join(o->root, p->name);
        KILN_CHECK_IF(rc, out, !dir, KILN_ERR_NOMEM, "out of memory");
        run_view rv;
        rc = load_run(dir, &rv);
        free(dir);
        if (rc) goto out;
        bool done = rv.exists && rv.state == KILN_RUN_FINISHED, active = rv.exists && rv.live;
        run_view_release(&rv);
        const json_t *lj = last_job(jobs, &jx, p->name);
        if (!done && !active && lj &&
            !strcmp(sweep_or(json_string_value(json_object_get(lj, "scheduler")), ""), "slurm") &&
            !json_is_true(json_object_get(lj, "cancelled"))) {
            const sched_job *sj =
                view_find(&view, &vx, sweep_or(json_string_value(json_object_get(lj, "job")), ""));
            active = sj && slurm_active(sj->state);
        }
        if (done)
            res->finished++;
        else if (active)
            res->active++;
        else
            todo[i] = true, n_todo++;
    }
    rec = make_record(
        spec, strcmp(old ? sweep_or(json_string_value(json_object_get(old, "digest")), "") : "",
                     spec->digest)
                  ? old
                  : NULL);
    KILN_CHECK_IF(rc, out, !rec, KILN_ERR_NOMEM, "out of memory");
    /* The same spec again: the digests it grew from stay as they were. */
    json_t *was = old && !strcmp(sweep_or(json_string_value(json_object_get(old, "digest")), ""),
                                 spec->digest)
                      ? json_object_get(old, "extends")
                      : NULL;
    if (was) json_object_set(rec, "extends", was);
    KILN_CHECK(rc, out, record_text(o->root, "sweep.json", rec, &rec_text, &rec_len));
    /* From here the root is written: a failure leaves what was written. */
    wrote = true;
    char *jd = kiln_path_join(o->root, "jobs"), *rp = kiln_path_join(o->root, "sweep.json");
    rc = !jd || !rp ? kiln_fail(KILN_ERR_NOMEM, "out of memory") : kiln_mkdir_p(jd);
    if (!rc) rc = kiln_write_file_atomic(rp, rec_text, rec_len);
    free(jd);
    free(rp);
    if (rc) goto out;
    if (!n_todo) goto out;
    for (size_t i = 0; i < spec->n_points; i++)
        if (todo[i]) KILN_CHECK(rc, out, write_point_files(spec, o, i));
    if (o->scheduler == KILN_SWEEP_SLURM)
        rc = submit_slurm(spec, o, jobs, todo, res);
    else if (!(rc = holder_line(&lock, "local")))
        rc = run_local(spec, o, jobs, todo, res);
out:
    unlock_root(&lock, rc && !wrote);
    free(rec_text);
    sweep_index_release(&jx);
    sweep_index_release(&vx);
    free(todo);
    free(view.jobs);
    json_decref(old);
    json_decref(jobs);
    json_decref(rec);
    return rc;
}

/* ---- the job ---- */

kiln_err kiln_sweep_job(const kiln_sweep_job_env *env, kiln_sweep_job_end *end, int *exit_code) {
    *end = KILN_SWEEP_JOB_FAILED;
    *exit_code = 2;
    json_t *rec = NULL;
    char *dir = NULL, *cfg = NULL, *runjson = NULL;
    run_view rv = {0};
    kiln_err rc = KILN_OK;
    KILN_CHECK(rc, out, load_record(env->root, &rec));
    KILN_CHECK_IF(rc, out, !rec, KILN_ERR_NOTFOUND, "'%s' holds no sweep (no sweep.json)",
                  env->root);
    const json_t *pt = NULL;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(rec, "points"), i,
                       p) if (!strcmp(sweep_or(json_string_value(json_object_get(p, "name")), ""),
                                      env->point)) pt = p;
    KILN_CHECK_IF(rc, out, !pt, KILN_ERR_NOTFOUND, "the sweep in '%s' has no point '%s'", env->root,
                  env->point);
    int ranks = (int)json_integer_value(json_object_get(pt, "ranks"));
    if (ranks < 1) ranks = 1;
    const char *data = sweep_or(json_string_value(json_object_get(rec, "data")), "");
    dir = kiln_path_join(env->root, env->point);
    cfg = kiln_asprintf("%s/jobs/%s.json", env->root, env->point);
    runjson = kiln_path_join(dir ? dir : "", "run.json");
    KILN_CHECK_IF(rc, out, !dir || !cfg || !runjson, KILN_ERR_NOMEM, "out of memory");

    KILN_CHECK(rc, out, load_run(dir, &rv));
    if (rv.exists && rv.state == KILN_RUN_FINISHED) {
        *end = KILN_SWEEP_JOB_FINISHED;
        *exit_code = 0;
        goto out;
    }
    if (env->restart > 0 && rv.exists) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s job %s restarted on %s (restart %ld): resuming from step %ld",
                 env->slurm ? "Slurm" : "local", env->job_id, env->node, env->restart, rv.ckpt);
        rc = kiln_run_event_add(dir, rv.ckpt, "requeued", msg);
        if (rc == KILN_ERR_NOTFOUND) rc = KILN_OK, kiln_errclear();
        if (rc) goto out;
    }
    /* The dataset's bytes must be those the sweep was submitted on: a job queued before the
     * file was replaced would otherwise train a point of the sweep on others. */
    const char *want = json_string_value(json_object_get(rec, "data_sha256"));
    if (want) {
        uint8_t h[KILN_SHA256_BYTES];
        char hex[KILN_SHA256_HEX];
        KILN_CHECK(rc, out, kiln_sha256_file(data, h));
        kiln_hex(h, sizeof h, hex);
        KILN_CHECK_IF(rc, out, strcmp(hex, want), KILN_ERR_CONFLICT,
                      "the sweep in '%s' trained on other bytes of its dataset '%s' (sha256 "
                      "%.16s..., now %.16s...): point '%s' not started",
                      env->root, data, want, hex, env->point);
    }
    bool resume = kiln_path_exists(runjson);
    /* The trainer's command: srun tasks under Slurm (so that scancel --signal and --signal's
     * warning reach it, and ranks > 1 start through Open MPI's PMIx support), mpirun for
     * ranks > 1 locally, kiln train alone otherwise. */
    const char *argv[24];
    int n = 0;
    char ntasks[32], np[32];
    snprintf(ntasks, sizeof ntasks, "--ntasks=%d", ranks);
    snprintf(np, sizeof np, "%d", ranks);
    if (env->slurm) {
        argv[n++] = "srun";
        argv[n++] = ntasks;
        argv[n++] = ranks > 1 ? "--mpi=pmix" : "--mpi=none";
    } else if (ranks > 1) {
        argv[n++] = "mpirun";
        argv[n++] = "--oversubscribe";
        if (geteuid() == 0) argv[n++] = "--allow-run-as-root";
        argv[n++] = "-np";
        argv[n++] = np;
    }
    argv[n++] = env->kiln;
    argv[n++] = "train";
    if (resume) {
        argv[n++] = "--resume";
        argv[n++] = dir;
    } else {
        argv[n++] = "--config";
        argv[n++] = cfg;
        argv[n++] = "--data";
        argv[n++] = data;
        argv[n++] = "--run-dir";
        argv[n++] = dir;
    }
    argv[n] = NULL;
    pid_t pid;
    KILN_CHECK(rc, out, sweep_spawn(argv, NULL, false, NULL, &pid));
    int st = 0;
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR) {
            rc = kiln_fail_errno(KILN_ERR_IO, "waitpid");
            goto out;
        }
    }
    run_view_release(&rv);
    KILN_CHECK(rc, out, load_run(dir, &rv));
    if (rv.exists && rv.state == KILN_RUN_FINISHED) {
        *end = KILN_SWEEP_JOB_FINISHED;
        *exit_code = 0;
        goto out;
    }
    bool interrupted = rv.last_kind && !strcmp(rv.last_kind, "interrupted");
    bool signalled = (WIFSIGNALED(st) && (WTERMSIG(st) == SIGTERM || WTERMSIG(st) == SIGINT)) ||
                     (env->term && *env->term);
    if (interrupted || signalled) {
        /* A preemption, or the time limit's warning: the checkpoint is written (or the newest
         * one stands); the job goes back to the queue and resumes from it. */
        char msg[512];
        snprintf(msg, sizeof msg,
                 "SIGTERM at step %ld: checkpoint at step %ld; %s job %s on %s (restart %ld) "
                 "requeued",
                 rv.step, rv.ckpt, env->slurm ? "Slurm" : "local", env->job_id, env->node,
                 env->restart);
        if (rv.exists) {
            rc = kiln_run_event_add(dir, rv.ckpt, "preempted", msg);
            if (rc == KILN_ERR_NOTFOUND) rc = KILN_OK, kiln_errclear();
            if (rc) goto out;
        }
        if (env->slurm) {
            const char *rq[] = {"scontrol", "requeue", env->job_id, NULL};
            char *err = NULL;
            int rs;
            rc = sweep_capture(rq, NULL, &err, &rs);
            if (!rc && (!WIFEXITED(rs) || WEXITSTATUS(rs)) && !(env->term && *env->term)) {
                /* A preemption Slurm itself requeues (PreemptMode=REQUEUE) signals the whole
                 * job, this process too: then the job is requeued already. */
                char *nl = strchr(err, '\n');
                if (nl) *nl = 0;
                rc = kiln_fail(KILN_ERR_NETWORK, "scontrol requeue %s: %s", env->job_id, err);
            }
            free(err);
            if (rc) goto out;
            *end = KILN_SWEEP_JOB_REQUEUED;
            *exit_code = 0;
        } else {
            *end = KILN_SWEEP_JOB_PREEMPTED;
            *exit_code = EXIT_PREEMPTED;
        }
        goto out;
    }
    char why[96];
    sweep_status_text(st, why, sizeof why);
    *exit_code = WIFEXITED(st) && WEXITSTATUS(st) ? WEXITSTATUS(st) : 2;
    rc = kiln_fail(KILN_ERR_INTERNAL, "point '%s': kiln train %s%s%s", env->point, why,
                   rv.message ? ": " : "", rv.message ? rv.message : "");
    rc = KILN_OK; /* the trainer said why on stderr (the job's log); the end says failed */
    kiln_errclear();
out:
    run_view_release(&rv);
    json_decref(rec);
    free(dir);
    free(cfg);
    free(runjson);
    return rc;
}

/* ---- status ---- */

kiln_err kiln_sweep_status(const char *root, json_t **out) {
    *out = NULL;
    json_t *rec = NULL, *jobs = NULL, *doc = NULL;
    sched_view view = {0};
    sweep_index jx = {0}, vx = {0};
    kiln_err rc = KILN_OK;
    KILN_CHECK(rc, fail, load_record(root, &rec));
    KILN_CHECK_IF(rc, fail, !rec, KILN_ERR_NOTFOUND, "'%s' holds no sweep (no sweep.json)", root);
    KILN_CHECK(rc, fail, load_jobs(root, &jobs));
    /* Slurm's view when any job went there; an unreachable controller is reported, not fatal. */
    bool any_slurm = false;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(jobs, "jobs"), i, e) any_slurm |=
        !strcmp(sweep_or(json_string_value(json_object_get(e, "scheduler")), ""), "slurm");
    char sched_err[512] = "";
    if (any_slurm && slurm_view(&view)) {
        snprintf(sched_err, sizeof sched_err, "%s", kiln_errmsg());
        kiln_errclear();
    }
    KILN_CHECK(rc, fail, index_jobs(jobs, &jx));
    KILN_CHECK(rc, fail, index_view(&view, &vx));
    json_t *pts = json_array();
    doc = json_pack("{s:s, s:s, s:O, s:o}", "format", "kiln-sweep-status/1", "root", root, "digest",
                    json_object_get(rec, "digest"), "points", pts);
    KILN_CHECK_IF(rc, fail, !doc, KILN_ERR_NOMEM, "out of memory");
    if (*sched_err) json_object_set_new(doc, "scheduler_error", json_string(sched_err));
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    json_t *p;
    json_array_foreach(json_object_get(rec, "points"), i, p) {
        const char *name = sweep_or(json_string_value(json_object_get(p, "name")), "?");
        char *dir = kiln_path_join(root, name);
        KILN_CHECK_IF(rc, fail, !dir, KILN_ERR_NOMEM, "out of memory");
        run_view rv;
        kiln_err lr = load_run(dir, &rv);
        free(dir);
        char run_err[512] = "";
        if (lr) {
            if (lr == KILN_ERR_NOMEM) {
                rc = lr;
                goto fail;
            }
            snprintf(run_err, sizeof run_err, "%s", kiln_errmsg());
            kiln_errclear();
            memset(&rv, 0, sizeof rv);
        }
        const json_t *lj = last_job(jobs, &jx, name);
        const char *sched =
            lj ? sweep_or(json_string_value(json_object_get(lj, "scheduler")), "") : "";
        const char *job = lj ? sweep_or(json_string_value(json_object_get(lj, "job")), "") : NULL;
        const sched_job *sj = lj && !strcmp(sched, "slurm") ? view_find(&view, &vx, job) : NULL;
        const char *state, *node = NULL;
        char why[1024] = "";
        if (*run_err) {
            state = "failed";
            snprintf(why, sizeof why, "%s", run_err);
        } else if (rv.exists && rv.state == KILN_RUN_FINISHED) {
            state = "finished";
        } else if (sj && slurm_active(sj->state)) {
            bool run = !strcmp(sj->state, "RUNNING") || !strcmp(sj->state, "COMPLETING") ||
                       !strcmp(sj->state, "CONFIGURING") || !strcmp(sj->state, "SIGNALING");
            state = run ? "running" : "queued";
            if (run)
                node = sj->node;
            else
                snprintf(why, sizeof why, "%s", sj->reason);
        } else if (rv.exists && rv.live) {
            state = "running";
            node = host;
        } else if (!lj) {
            state = "not submitted";
        } else if (rv.exists && (rv.state == KILN_RUN_DIVERGED || rv.state == KILN_RUN_FAILED)) {
            state = "failed";
            snprintf(why, sizeof why, "%s",
                     rv.message ? rv.message : kiln_run_state_name(rv.state));
        } else if (json_is_true(json_object_get(lj, "cancelled"))) {
            state = "failed";
            snprintf(why, sizeof why, "its job %s was cancelled when the submission failed", job);
        } else if (rv.exists && rv.last_kind && !strcmp(rv.last_kind, "preempted")) {
            state = "preempted";
            snprintf(why, sizeof why, "checkpoint at step %ld; not queued: run the sweep again",
                     rv.ckpt);
        } else {
            state = "failed";
            if (sj)
                snprintf(why, sizeof why,
                         "Slurm job %s ended %s without finishing the run (jobs/%s.log)", job,
                         sj->state, name);
            else if (!strcmp(sched, "slurm") && !*sched_err)
                snprintf(why, sizeof why,
                         "Slurm job %s is gone without finishing the run (jobs/%s.log)", job, name);
            else if (!strcmp(sched, "slurm"))
                snprintf(why, sizeof why, "unknown: %s", sched_err);
            else
                snprintf(why, sizeof why,
                         "its job %s ended without finishing the run (jobs/%s.log)", job, name);
        }
        json_t *row = json_pack("{s:s, s:s, s:s?, s:s?, s:s?, s:s?, s:I, s:I, s:I, s:I, s:I}",
                                "name", name, "state", state, "scheduler", lj ? sched : NULL, "job",
                                job, "node", node, "scheduler_state", sj ? sj->state : NULL, "step",
                                (json_int_t)rv.step, "steps", (json_int_t)rv.steps, "preemptions",
                                (json_int_t)rv.preemptions, "requeues", (json_int_t)rv.requeues,
                                "best_val_step", (json_int_t)rv.best_step);
        if (row) {
            json_object_set_new(row, "best_val_loss",
                                isfinite(rv.best_val) ? json_real(rv.best_val) : json_null());
            json_object_set_new(row, "why", *why ? json_string(why) : json_null());
        }
        run_view_release(&rv);
        KILN_CHECK_IF(rc, fail, !row || json_array_append_new(pts, row), KILN_ERR_NOMEM,
                      "out of memory");
    }
    *out = doc;
    doc = NULL;
fail:
    json_decref(doc);
    json_decref(rec);
    json_decref(jobs);
    sweep_index_release(&jx);
    sweep_index_release(&vx);
    free(view.jobs);
    return rc;
}

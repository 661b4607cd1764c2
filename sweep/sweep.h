/*
 * sweep.h - sweeps of training runs on a scheduler (kiln sweep, docs/orchestration.md).
 *
 * A spec (JSON) names a dataset, a base config, a grid, explicit points and seeds; each point
 * becomes a run directory under the sweep's root and a job: a batch script submitted to Slurm
 * with sbatch, or a process of a local pool with the same semantics. The job trains the point
 * (kiln train, or kiln train --resume after a preemption) and, when the trainer was stopped by
 * SIGTERM after writing its checkpoint, has the job requeued. The library runs Slurm's
 * commands (sbatch, squeue, scontrol, srun) as processes; it never prints and never exits.
 */
#ifndef KILN_SWEEP_H
#define KILN_SWEEP_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "kiln.h"
#include "train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most points one spec may make: (grid product + explicit points) x seeds, checked
 * before expanding. */
#define KILN_SWEEP_MAX_POINTS 100000
/* The longest point name (a run directory's, and jobs/NAME.json's stem): a longer one is cut
 * and ends in '~' and 16 hex digits of the SHA-256 of the whole name. */
#define KILN_SWEEP_NAME_MAX 120

/* One point of a sweep. */
typedef struct kiln_sweep_point {
    char *name;        /* its run directory's name under the root: what it overrides */
    json_t *overrides; /* the keys the point sets over the spec's config (grid, point, seed) */
    kiln_train_config config; /* the whole run config: jobs/NAME.json is its text */
    int ranks;                /* processes that train it (srun tasks, or mpirun -np locally) */
} kiln_sweep_point;

/* The spec's "slurm" object. */
typedef struct kiln_sweep_slurm {
    char *partition, *time; /* NULL: the cluster's defaults */
    int cpus;               /* CPUs per task (default 1) */
    int gpus;               /* GPUs per task (default 0) */
    int signal_seconds;     /* SIGTERM this long before the time limit (default 60) */
} kiln_sweep_slurm;

typedef struct kiln_sweep_spec {
    json_t *spec;    /* the document as read */
    char digest[65]; /* hex SHA-256 of its canonical text (sorted keys, no white space) */
    char *data;      /* the dataset's absolute path (a relative one is the spec file's dir's) */
    char data_sha256[65]; /* hex SHA-256 of the dataset's bytes (kiln data inspect's) */
    kiln_sweep_point *points;
    size_t n_points;
    kiln_sweep_slurm slurm;
} kiln_sweep_spec;

/* Read and check a spec: its size (KILN_SWEEP_MAX_POINTS, KILN_ERR_LIMIT) before expanding,
 * every config key as `kiln train --set` checks it (the point and the key named), "ranks" a
 * positive divisor of accum_steps, two points with one name refused, the dataset opened and
 * its bytes hashed. KILN_ERR_CONFIG / KILN_ERR_FORMAT / KILN_ERR_IO naming the file.
 * Release with kiln_sweep_spec_release (a zeroed one too). */
kiln_err kiln_sweep_spec_load(const char *path, kiln_sweep_spec *out);
void kiln_sweep_spec_release(kiln_sweep_spec *s);

typedef enum kiln_sweep_scheduler {
    KILN_SWEEP_SLURM = 0,
    KILN_SWEEP_LOCAL = 1
} kiln_sweep_scheduler;

typedef struct kiln_sweep_opts {
    const char *root;
    kiln_sweep_scheduler scheduler;
    int max_parallel; /* jobs running at once; 0 = no limit (Slurm), the CPU count (local) */
    bool extend;      /* accept a spec that adds points to the root's */
    const char *kiln; /* the kiln binary the jobs run (absolute) */
    /* Lines for the user ("submitted lr-0.001 as job 12"); NULL = none. */
    void (*note)(void *ctx, const char *line);
    void *note_ctx;
    volatile int *stop; /* local: set non-zero to stop the pool (its jobs get SIGTERM) */
} kiln_sweep_opts;

/* What a submission did. */
typedef struct kiln_sweep_result {
    size_t submitted, finished, active, failed; /* points: sent now, done, queued or running,
                                                    failed (local: at the end of the pool) */
    size_t preemptions;                         /* local: jobs stopped by SIGTERM and rerun */
} kiln_sweep_result;

/* Submit the points of spec under opts->root that are neither finished nor queued nor
 * running. The root is made, or must hold this spec's sweep (sweep.json; another spec is
 * refused unless opts->extend and the new one only adds points). With Slurm the controller is
 * asked first (an unreachable one fails before anything is written) and the jobs are
 * submitted with sbatch; if one submission fails, those made by this call are cancelled.
 * With the local scheduler the pool runs here until every job ended. */
kiln_err kiln_sweep_submit(const kiln_sweep_spec *spec, const kiln_sweep_opts *opts,
                           kiln_sweep_result *out);

/* The environment a job runs in. */
typedef struct kiln_sweep_job_env {
    const char *root, *point, *kiln;
    bool slurm;         /* under sbatch (SLURM_JOB_ID set) */
    const char *job_id; /* SLURM_JOB_ID, or the local pool's id */
    long restart;       /* SLURM_RESTART_COUNT, or the local pool's count */
    const char *node;   /* SLURMD_NODENAME, or this host's name */
    volatile int *term; /* set by the caller's SIGTERM handler */
} kiln_sweep_job_env;

/* How a job ended. */
typedef enum kiln_sweep_job_end {
    KILN_SWEEP_JOB_FINISHED = 0,  /* the run logged its last step */
    KILN_SWEEP_JOB_REQUEUED = 1,  /* SIGTERM: checkpoint written; requeued (Slurm) */
    KILN_SWEEP_JOB_PREEMPTED = 2, /* SIGTERM: checkpoint written; the local pool reruns it */
    KILN_SWEEP_JOB_FAILED = 3     /* the trainer failed (*exit_code its status) */
} kiln_sweep_job_end;

/* The body of a point's job: train the point (or resume it), and after a SIGTERM record the
 * preemption in the run's events and have the job requeued. */
kiln_err kiln_sweep_job(const kiln_sweep_job_env *env, kiln_sweep_job_end *end, int *exit_code);

/* Every point of the sweep in root with its state, the scheduler's view and its progress, as
 * a document of format "kiln-sweep-status/1" (docs/orchestration.md); json_decref it. */
kiln_err kiln_sweep_status(const char *root, json_t **out);

#ifdef __cplusplus
}
#endif

#endif

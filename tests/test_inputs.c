/* test_inputs.c - every opener of a file the user names refuses a FIFO and a device at once,
 * naming the path: before kiln_open_input a FIFO hung the open for ever (no writer comes) and
 * /dev/zero was read for ever (hash_file reads to EOF). Each opener runs in a child process
 * with an alarm, so that a hang fails the test instead of stopping the suite. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "export.h"
#include "runs_int.h"
#include "test.h"
#include "testutil.h"
#include "train_int.h"

static kiln_err by_open_input(const char *p) {
    int fd;
    kiln_err rc = kiln_open_input(p, &fd, NULL);
    if (!rc) close(fd);
    return rc;
}

static kiln_err by_read_file(const char *p) {
    char *buf;
    size_t n;
    kiln_err rc = kiln_read_file(p, 1 << 20, &buf, &n);
    free(buf);
    return rc;
}

static kiln_err by_json(const char *p) { /* train --config, card.json, run.json, trust, ... */
    json_t *j;
    kiln_err rc = kiln_json_load_file(p, &j);
    json_decref(j);
    return rc;
}

static kiln_err by_st_open(const char *p) { /* infer --model FILE, validate --reference, --init */
    kiln_st *st;
    kiln_err rc = kiln_st_open(p, &st);
    kiln_st_close(st);
    return rc;
}

static kiln_err by_sha256(const char *p) { /* validate --reference's digest, publish */
    uint8_t h[KILN_SHA256_BYTES];
    return kiln_sha256_file(p, h);
}

static kiln_err by_blake2b(const char *p) {
    uint8_t h[64];
    return kiln_blake2b_file(p, h, sizeof h);
}

static kiln_err by_dataset(const char *p) { /* train --data, data inspect, data export */
    kiln_dataset *ds;
    kiln_err rc = kiln_dataset_open(p, &ds);
    kiln_dataset_free(ds);
    return rc;
}

static kiln_err by_data_api(const char *p) { /* kiln.read_dataset */
    kiln_data *d;
    kiln_err rc = kiln_data_open(p, &d);
    kiln_data_free(d);
    return rc;
}

static kiln_err by_model(const char *p) { /* kiln.Model, kiln infer --model */
    kiln_model *m;
    kiln_err rc = kiln_model_open(p, &m);
    kiln_model_free(m);
    return rc;
}

static kiln_err by_csv(const char *p) { /* kiln data import --csv */
    const char *f[] = {"a"}, *t[] = {"b"};
    char *out = kiln_test_path("csv-out.st");
    kiln_err rc = kiln_dataset_import_csv(p, f, 1, t, 1, out);
    free(out);
    return rc;
}

static kiln_err by_archive(const char *p) { /* kiln inspect, unpack, publish */
    kiln_manifest *m = NULL;
    json_t *card = NULL;
    kiln_err rc = kiln_archive_inspect(p, &m, &card);
    kiln_manifest_free(m);
    json_decref(card);
    return rc;
}

static kiln_err by_metrics(const char *p) { /* a run's metrics.db: runs show, list, export */
    kiln_run_metrics *mx = NULL;
    kiln_err rc = kiln_run_metrics_open(p, true, &mx);
    kiln_run_metrics_close(mx);
    return rc;
}

static kiln_err by_metrics_rw(const char *p) { /* train --resume: the run's own log */
    kiln_run_metrics *mx = NULL;
    kiln_err rc = kiln_run_metrics_open(p, false, &mx);
    kiln_run_metrics_close(mx);
    return rc;
}

static const struct {
    const char *name;
    kiln_err (*fn)(const char *);
} openers[] = {
    {"kiln_open_input", by_open_input},
    {"kiln_read_file", by_read_file},
    {"kiln_json_load_file", by_json},
    {"kiln_st_open", by_st_open},
    {"kiln_sha256_file", by_sha256},
    {"kiln_blake2b_file", by_blake2b},
    {"kiln_dataset_open", by_dataset},
    {"kiln_data_open", by_data_api},
    {"kiln_model_open", by_model},
    {"kiln_dataset_import_csv", by_csv},
    {"kiln_archive_inspect", by_archive},
    {"kiln_run_metrics_open", by_metrics},
    {"kiln_run_metrics_open (read-write)", by_metrics_rw},
};

/* Run fn(path) in a child that an alarm kills after 5 s. 0: refused within a second with a
 * message naming the path and "not a regular file"; else what went wrong. */
static const char *refused(kiln_err (*fn)(const char *), const char *path, char *msg, size_t cap) {
    int pfd[2];
    if (pipe(pfd) != 0) return "pipe failed";
    pid_t pid = fork();
    if (pid < 0) return "fork failed";
    if (pid == 0) {
        close(pfd[0]);
        alarm(5);
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        kiln_err rc = fn(path);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
        const char *m = rc ? kiln_errmsg() : "(accepted)";
        ssize_t w = write(pfd[1], m, strlen(m));
        (void)w;
        _exit(!rc ? 2 : s > 1 ? 3 : !strstr(m, path) || !strstr(m, "not a regular file") ? 4 : 0);
    }
    close(pfd[1]);
    size_t n = 0;
    for (ssize_t r; n + 1 < cap && (r = read(pfd[0], msg + n, cap - 1 - n)) != 0;)
        if (r > 0)
            n += (size_t)r;
        else if (errno != EINTR)
            break;
    msg[n] = 0;
    close(pfd[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(st)) return WTERMSIG(st) == SIGALRM ? "hung (killed after 5 s)" : "crashed";
    switch (WEXITSTATUS(st)) {
    case 0:
        return NULL;
    case 2:
        return "accepted it";
    case 3:
        return "took more than a second";
    default:
        return "the message does not name the path and say 'not a regular file'";
    }
}

KILN_TEST(inputs_fifo_and_device_refused_by_every_opener) {
    char *fifo = kiln_test_path("input.fifo");
    if (!CHECK("mkfifo", fifo && mkfifo(fifo, 0600) == 0)) {
        free(fifo);
        return;
    }
    const char *paths[] = {fifo, "/dev/zero"};
    for (size_t i = 0; i < sizeof openers / sizeof *openers; i++)
        for (size_t k = 0; k < 2; k++) {
            char msg[1024], descr[1400];
            const char *why = refused(openers[i].fn, paths[k], msg, sizeof msg);
            snprintf(descr, sizeof descr, "%s('%s'): %s [%s]", openers[i].name, paths[k],
                     why ? why : "refused", msg);
            CHECK(descr, !why);
            if (!why && k == 0) CHECK("the FIFO is named as such", strstr(msg, "(a FIFO)"));
            if (!why && k == 1)
                CHECK("the device is named as such", strstr(msg, "(a character device)"));
        }
    free(fifo);
}

/* A run directory's .lock is opened to test the trainer's lock (runs show, runs list): a FIFO
 * there hung both in the open. */
static kiln_err run_live_of(const char *fifo) {
    char *dir = kiln_dirname(fifo);
    bool live;
    kiln_err rc = dir ? kiln_run_live(dir, &live) : KILN_ERR_NOMEM;
    free(dir);
    return rc;
}

KILN_TEST(inputs_run_lock_fifo_refused) {
    char *run = kiln_test_path("run"), *lock = kiln_test_path("run/.lock");
    mkdir(run, 0755);
    bool live = true;
    CHECK("a run without .lock is not live",
          kiln_run_live(run, &live) == KILN_OK && !live && !*kiln_errmsg());
    if (CHECK("mkfifo", mkfifo(lock, 0600) == 0)) {
        char msg[1024];
        const char *why = refused(run_live_of, lock, msg, sizeof msg);
        if (why) fprintf(stderr, "    kiln_run_live: %s [%s]\n", why, msg);
        CHECK("a FIFO as .lock is refused at once, named", !why);
    }
    free(lock), free(run);
}

KILN_TEST(inputs_regular_file_reads_blocking) {
    /* The descriptor handed back reads as a plain one: O_NONBLOCK is cleared. */
    char *p = kiln_test_write("plain.txt", "hello\n", 6);
    int fd;
    uint64_t size = 0;
    if (!CHECK("a regular file opens", p && kiln_open_input(p, &fd, &size) == KILN_OK)) {
        free(p);
        return;
    }
    CHECK("its size", size == 6);
    CHECK("not O_NONBLOCK", !(fcntl(fd, F_GETFL) & O_NONBLOCK));
    CHECK("close-on-exec", fcntl(fd, F_GETFD) & FD_CLOEXEC);
    close(fd);
    char *d = kiln_test_path("a-dir");
    mkdir(d, 0755);
    CHECK("a directory is refused as one",
          kiln_open_input(d, &fd, NULL) == KILN_ERR_IO && fd == -1 &&
              strstr(kiln_errmsg(), "not a regular file (a directory)"));
    char *missing = kiln_test_path("missing");
    CHECK("a missing file names the path",
          kiln_open_input(missing, &fd, NULL) == KILN_ERR_IO && strstr(kiln_errmsg(), missing));
    free(missing);
    free(d);
    free(p);
}

/* test_dist.c - data parallelism without MPI: a kiln_comm whose ranks are threads of this
 * process (shared memory and a barrier), so the shard sum, the agreement and the whole
 * trainer on N ranks run in the C suite and under the sanitizers. tests/e2e/45-mpi.sh
 * does the same with Open MPI. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "testutil.h"
#include "train_int.h"

#define MAX_RANKS 4

typedef struct tshared {
    int size;
    pthread_barrier_t bar;
    const void *send[MAX_RANKS];
} tshared;

typedef struct tcomm {
    kiln_comm base;
    tshared *sh;
} tcomm;

static tshared *sh_of(kiln_comm *c) {
    return ((tcomm *)c)->sh;
}

static kiln_err t_bcast(kiln_comm *c, void *buf, size_t bytes, int root) {
    tshared *s = sh_of(c);
    s->send[c->rank] = buf;
    pthread_barrier_wait(&s->bar);
    if (c->rank != root) memcpy(buf, s->send[root], bytes);
    pthread_barrier_wait(&s->bar);
    return KILN_OK;
}

static kiln_err t_allgather(kiln_comm *c, const void *send, void *recv, size_t bytes) {
    tshared *s = sh_of(c);
    s->send[c->rank] = send;
    pthread_barrier_wait(&s->bar);
    for (int q = 0; q < c->size; q++)
        memcpy((char *)recv + (size_t)q * bytes, s->send[q], bytes);
    pthread_barrier_wait(&s->bar);
    return KILN_OK;
}

static kiln_err t_alltoall(kiln_comm *c, const void *send, void *recv, size_t bytes) {
    tshared *s = sh_of(c);
    s->send[c->rank] = send;
    pthread_barrier_wait(&s->bar);
    for (int q = 0; q < c->size; q++)
        memcpy((char *)recv + (size_t)q * bytes, (const char *)s->send[q] + c->rank * bytes, bytes);
    pthread_barrier_wait(&s->bar);
    return KILN_OK;
}

static kiln_err t_allreduce(kiln_comm *c, float *buf, size_t n) {
    return KILN_ERR_UNSUPPORTED;
}

static void tcomm_init(tshared *s, tcomm *tc, int size) {
    s->size = size;
    pthread_barrier_init(&s->bar, NULL, (unsigned)size);
    for (int r = 0; r < size; r++)
        tc[r] = (tcomm){{.rank = r,
                         .size = size,
                         .name = "threads",
                         .bcast = t_bcast,
                         .allgather = t_allgather,
                         .alltoall = t_alltoall,
                         .allreduce_sum = t_allreduce},
                        s};
}

/* Run fn(rank's comm, arg) on size threads and wait for them. */
typedef struct job {
    kiln_comm *comm;
    void *arg;
    void (*fn)(kiln_comm *, void *, kiln_err *, char *);
    kiln_err rc;
    char msg[1024];
} job;

static void *job_main(void *p) {
    job *j = p;
    j->fn(j->comm, j->arg, &j->rc, j->msg);
    return NULL;
}

static void run_ranks(int size, void (*fn)(kiln_comm *, void *, kiln_err *, char *), void *arg,
                      job *jobs) {
    tshared s;
    tcomm tc[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    tcomm_init(&s, tc, size);
    for (int r = 0; r < size; r++) {
        jobs[r] = (job){&tc[r].base, arg, fn, KILN_OK, ""};
        pthread_create(&th[r], NULL, job_main, &jobs[r]);
    }
    for (int r = 0; r < size; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&s.bar);
}

/* ---- the shard sum ---- */

#define SUM_N 1001 /* not a multiple of the rank count: the last slice is short */
#define SUM_SHARDS 12

typedef struct sum_case {
    const float *shards; /* [SUM_SHARDS][SUM_N] */
    float out[MAX_RANKS][SUM_N];
} sum_case;

static void sum_rank(kiln_comm *c, void *arg, kiln_err *rc, char *msg) {
    sum_case *sc = arg;
    const int k = SUM_SHARDS / c->size;
    size_t padded = kiln_dist_padded(c->size, SUM_N);
    float *buf = calloc((size_t)k * padded, sizeof(float)), *ptr[SUM_SHARDS];
    float *work = calloc(kiln_dist_work_floats(c->size, k, SUM_N) + 1, sizeof(float));
    for (int j = 0; j < k; j++) {
        ptr[j] = buf + (size_t)j * padded;
        memcpy(ptr[j], sc->shards + (size_t)(c->rank * k + j) * SUM_N, SUM_N * sizeof(float));
    }
    *rc = kiln_dist_sum_shards(c, ptr, k, SUM_N, sc->out[c->rank], work);
    free(buf);
    free(work);
}

KILN_TEST(dist_sum_shards_bitwise) {
    float *shards = malloc(SUM_SHARDS * SUM_N * sizeof(float)), ref[SUM_N];
    if (!CHECK("alloc", shards)) return;
    /* Values of mixed magnitude, so that another order would round differently. */
    for (size_t i = 0; i < SUM_SHARDS * SUM_N; i++) {
        uint32_t w[4];
        kiln_philox(7, 0, i, w);
        shards[i] = ((float)w[0] / 4294967296.0f - 0.5f) * (float)(1u << (w[1] % 20));
    }
    for (size_t e = 0; e < SUM_N; e++) {
        ref[e] = shards[e];
        for (int g = 1; g < SUM_SHARDS; g++)
            ref[e] += shards[(size_t)g * SUM_N + e];
    }
    /* The same shards summed pairwise give other bits somewhere: the order is what the
     * test pins down. */
    bool order_matters = false;
    for (size_t e = 0; e < SUM_N && !order_matters; e++) {
        float a = 0, b = 0;
        for (int g = 0; g < SUM_SHARDS; g += 2)
            a += shards[(size_t)g * SUM_N + e] + shards[(size_t)(g + 1) * SUM_N + e];
        b = ref[e];
        order_matters = a != b;
    }
    CHECK("the data is order-sensitive", order_matters);
    const int sizes[] = {1, 2, 3, 4};
    for (size_t t = 0; t < KILN_ARRAY_LEN(sizes); t++) {
        sum_case sc = {.shards = shards};
        job jobs[MAX_RANKS];
        run_ranks(sizes[t], sum_rank, &sc, jobs);
        bool ok = true;
        for (int r = 0; r < sizes[t]; r++)
            ok &= jobs[r].rc == KILN_OK && !memcmp(sc.out[r], ref, sizeof ref);
        char d[64];
        snprintf(d, sizeof d, "%d ranks give the one-process bits on every rank", sizes[t]);
        CHECK(d, ok);
    }
    free(shards);
}

/* ---- agreement ---- */

static void agree_rank(kiln_comm *c, void *arg, kiln_err *rc, char *msg) {
    double mine[2] = {0, 10.0 * c->rank}, all[2 * MAX_RANKS];
    kiln_err mine_rc = KILN_OK;
    if (c->rank >= 1) mine_rc = kiln_fail(KILN_ERR_IO, "cannot open 'x%d': no such file", c->rank);
    *rc = kiln_dist_agree(c, mine_rc, mine, 1, all);
    snprintf(msg, 1024, "%s", kiln_errmsg());
    if (*rc == KILN_OK && all[2 * (c->size - 1) + 1] != 10.0 * (c->size - 1))
        *rc = KILN_ERR_INTERNAL;
}

KILN_TEST(dist_agree_spreads_first_failure) {
    job jobs[MAX_RANKS];
    run_ranks(3, agree_rank, NULL, jobs);
    CHECK("every rank gets the code",
          jobs[0].rc == KILN_ERR_IO && jobs[1].rc == KILN_ERR_IO && jobs[2].rc == KILN_ERR_IO);
    CHECK("rank 0 reports the lowest failing rank's message",
          !strcmp(jobs[0].msg, "rank 1: cannot open 'x1': no such file"));
    CHECK("the failing rank keeps its own", !strcmp(jobs[1].msg, "cannot open 'x1': no such file"));
    CHECK("another failing rank takes the first one's",
          !strcmp(jobs[2].msg, "rank 1: cannot open 'x1': no such file"));
    run_ranks(1, agree_rank, NULL, jobs);
    CHECK("one rank: success and the payload", jobs[0].rc == KILN_OK);
}

/* ---- buckets ---- */

KILN_TEST(dist_buckets_backward_order) {
    kiln_train_config c;
    kiln_train_config_default(&c);
    c.model.n_features = 8;
    c.model.n_outputs = 2;
    kiln_param *tab;
    size_t np, numel;
    if (!CHECK("table", kiln_param_table(&c.model, &tab, &np, &numel) == KILN_OK)) return;
    const size_t bytes = 16384;
    size_t nb = kiln_dist_buckets(tab, np, bytes, NULL, 0);
    kiln_dist_bucket *b = calloc(nb ? nb : 1, sizeof *b);
    CHECK("several buckets", nb > 2 && kiln_dist_buckets(tab, np, bytes, b, nb) == nb);
    bool ok = b[0].first_param == np - 1 && b[0].offset + b[0].numel == numel &&
              b[nb - 1].last_param == 0 && b[nb - 1].offset == 0;
    for (size_t i = 0; i < nb; i++) {
        ok &= b[i].first_param >= b[i].last_param;
        ok &= b[i].offset == tab[b[i].last_param].offset;
        if (i + 1 < nb) {
            ok &= b[i + 1].first_param + 1 == b[i].last_param; /* backward order, no gaps */
            ok &= b[i + 1].offset + b[i + 1].numel == b[i].offset;
            ok &= b[i].numel * sizeof(float) >= bytes; /* only the last may be small */
            /* and it closed as soon as it was big enough */
            ok &= (b[i].numel - tab[b[i].last_param].numel) * sizeof(float) < bytes;
        }
    }
    CHECK("buckets tile the block backwards, whole tensors, closed at the size", ok);
    free(b);
    free(tab);
}

/* ---- the trainer on ranks ---- */

typedef struct train_case {
    const kiln_train_config *cfg;
    const char *data, *dir;
    bool resume;
} train_case;

static void train_rank(kiln_comm *c, void *arg, kiln_err *rc, char *msg) {
    train_case *tc = arg;
    kiln_train_opts o = {.run_dir = tc->dir, .data_path = tc->data, .comm = c};
    *rc = tc->resume ? kiln_train_resume(&o) : kiln_train_start(tc->cfg, &o);
    snprintf(msg, 1024, "%s", kiln_errmsg());
}

static kiln_err train_on(int size, const kiln_train_config *cfg, const char *data, const char *dir,
                         bool resume, char *msg0) {
    train_case tc = {cfg, data, dir, resume};
    job jobs[MAX_RANKS];
    run_ranks(size, train_rank, &tc, jobs);
    kiln_err rc = KILN_OK;
    for (int r = 0; r < size; r++)
        if (jobs[r].rc != jobs[0].rc) rc = KILN_ERR_INTERNAL; /* the ranks must agree */
    snprintf(msg0, 1024, "%s", jobs[0].msg);
    return rc ? rc : jobs[0].rc;
}

static bool same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    bool ok = kiln_read_file(a, 1 << 26, &x, &nx) == KILN_OK &&
              kiln_read_file(b, 1 << 26, &y, &ny) == KILN_OK && nx == ny && !memcmp(x, y, nx);
    free(x);
    free(y);
    return ok;
}

static bool same_losses(const char *a, const char *b) {
    kiln_run_diff d;
    if (kiln_run_diff_load(a, b, &d) != KILN_OK) return false;
    bool ok = d.first_diff == 0 && d.common_steps == d.a_steps && d.a_steps == d.b_steps &&
              d.a_steps > 0 && json_object_size(d.config) == 0;
    kiln_run_diff_release(&d);
    return ok;
}

KILN_TEST(dist_train_ranks_match_one_process) {
    kiln_log_set_level(KILN_LOG_ERROR);
    char *data = kiln_test_path("d.safetensors"), *one = kiln_test_path("one"),
         *two = kiln_test_path("two"), *four = kiln_test_path("four"), *mix = kiln_test_path("mix"),
         *bad = kiln_test_path("bad"), msg[1024];
    kiln_synth_opts so = {.seed = 3, .rows = 400, .n_features = 4, .n_outputs = 2};
    kiln_train_config c;
    kiln_test_tiny_run(&c, 8);
    c.batch_size = 3;
    c.accum_steps = 4;
    c.steps = kiln_test_sanitized() ? 6 : 12;
    c.ckpt_every = 2;
    if (!CHECK("data", kiln_synth_write(&so, data, NULL) == KILN_OK)) goto out;
    CHECK("one process", train_on(1, &c, data, one, false, msg) == KILN_OK);
    CHECK("two ranks", train_on(2, &c, data, two, false, msg) == KILN_OK);
    CHECK("four ranks", train_on(4, &c, data, four, false, msg) == KILN_OK);
    bool same = true;
    for (long s = c.ckpt_every; s <= c.steps; s += c.ckpt_every) {
        char *p1 = kiln_run_ckpt_path(one, s), *p2 = kiln_run_ckpt_path(two, s),
             *p4 = kiln_run_ckpt_path(four, s);
        same &= kiln_path_exists(p1) && same_file(p1, p2) && same_file(p1, p4);
        free(p1), free(p2), free(p4);
    }
    CHECK("every checkpoint has the same bytes on 1, 2 and 4 ranks", same);
    CHECK("the same losses, bit for bit", same_losses(one, two) && same_losses(one, four));

    /* Resume with another rank count: 2 ranks to step 4, then one process to the end. */
    /* (The schedule depends on steps, so the run is cut short by deleting checkpoints, as a
     * crash after step 4 would leave it.) */
    CHECK("two ranks again", train_on(2, &c, data, mix, false, msg) == KILN_OK);
    for (long s = 6; s <= c.steps; s += c.ckpt_every) {
        char *p = kiln_run_ckpt_path(mix, s);
        unlink(p);
        free(p);
    }
    CHECK("resumed on one process", train_on(1, &c, data, mix, true, msg) == KILN_OK);
    char *pa = kiln_run_ckpt_path(one, c.steps), *pb = kiln_run_ckpt_path(mix, c.steps);
    CHECK("2 ranks then 1 process ends with the same bytes", same_file(pa, pb));
    CHECK("and the same losses", same_losses(one, mix));
    free(pa), free(pb);

    /* accum_steps must split evenly; the refusal comes before anything is written. */
    c.accum_steps = 3;
    CHECK("3 micro-batches on 2 ranks refused",
          train_on(2, &c, data, bad, false, msg) == KILN_ERR_CONFIG &&
              strstr(msg, "'accum_steps'") && strstr(msg, "2 ranks"));
    CHECK("nothing written", !kiln_path_exists(bad));
out:
    kiln_log_set_level(KILN_LOG_INFO);
    free(data), free(one), free(two), free(four), free(mix), free(bad);
}

/* test_cuda_train.c - `device: "cuda"` in the trainer. Without a GPU (or without CUDA in the
 * build) a run on cuda is refused before anything is written, and a resume on cuda leaves
 * the run as it was. With a GPU (on the emulator, `make gpu-emu`): the device optimizer gives
 * the CPU optimizer's bits, two runs give the same checkpoint bytes, an interrupted run
 * resumed equals the uninterrupted one, the first steps' losses agree with the CPU trainer's,
 * and a run moves between cpu and cuda through its checkpoints (event "device_change"). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "export.h"
#include "kernels.h"
#include "test.h"
#include "testutil.h"
#include "train_int.h"
#include "validate.h"

static bool has(const char *s) {
    return strstr(kiln_errmsg(), s) != NULL;
}

static void tiny_run(kiln_train_config *c) {
    kiln_test_tiny_run(c, 4);
    c->batch_size = 2;
    c->ckpt_every = 3;
    c->device = KILN_TRAIN_CUDA;
}

static bool bytes(const char *path, char **buf, size_t *len) {
    *buf = NULL;
    return kiln_read_file(path, 1 << 26, buf, len) == KILN_OK;
}

static bool event_says(const char *dir, const char *kind, const char *text) {
    kiln_run_info ri;
    if (kiln_run_info_load(dir, 100, &ri) != KILN_OK) return false;
    bool found = false;
    for (size_t i = 0; i < ri.n_events; i++)
        found |= !strcmp(ri.events[i].kind, kind) && strstr(ri.events[i].message, text);
    kiln_run_info_release(&ri);
    return found;
}

/* Without a GPU: refused at the start, nothing written; a resume on cuda leaves the run. */
static void refused(const char *data) {
    char *dir = kiln_test_path("run"), *p6 = NULL;
    kiln_train_config c;
    tiny_run(&c);
    kiln_train_opts o = {.run_dir = dir, .data_path = data};
    kiln_err rc = kiln_train_start(&c, &o);
#ifdef KILN_HAVE_CUDA
    CHECK("no GPU: a device error", rc == KILN_ERR_DEVICE && has("no usable CUDA device"));
#else
    CHECK("no CUDA: unsupported", rc == KILN_ERR_UNSUPPORTED && has("has no CUDA"));
#endif
    CHECK("the message names the device", has("cannot train on device \"cuda\""));
    CHECK("nothing written", !kiln_path_exists(dir));
    c.device = KILN_TRAIN_CPU;
    if (!CHECK("the same run on the cpu", kiln_train_start(&c, &o) == KILN_OK)) goto out;
    p6 = kiln_run_ckpt_path(dir, 6);
    char *before = NULL;
    size_t n = 0;
    CHECK("read", bytes(p6, &before, &n));
    const char *sets[] = {"device=cuda", "steps=9"};
    kiln_train_opts r = {.run_dir = dir, .sets = sets, .n_sets = 2};
    CHECK("resume on cuda refused",
          kiln_train_resume(&r) != KILN_OK && has("cannot train on device \"cuda\""));
    char *after = NULL;
    size_t m = 0;
    CHECK("the checkpoint is untouched",
          bytes(p6, &after, &m) && m == n && before && !memcmp(before, after, n));
    CHECK("no resume event", !event_says(dir, "resume", "resumed"));
    free(before);
    free(after);
out:
    free(p6);
    free(dir);
}

#ifdef KILN_HAVE_CUDA
/* The device optimizer against kiln_train_optim_step: the same bits. */
static void optimizer_bits(void) {
    kiln_param *tab = NULL;
    size_t np, numel;
    kiln_model_config mc = {4, 1, 8, 1, 2, 8, 2, 1, 8, 4, 1e-5f};
    if (!CHECK("table", kiln_param_table(&mc, &tab, &np, &numel) == KILN_OK)) return;
    float *hp = malloc(numel * 4), *hg = malloc(numel * 4), *hm = malloc(numel * 4),
          *hv = malloc(numel * 4), *gp = malloc(numel * 4), *gm = malloc(numel * 8);
    float *dp = NULL, *dg = NULL, *dm = NULL;
    if (!CHECK("buffers", hp && hg && hm && hv && gp && gm) ||
        !CHECK("ctx", kiln_cuda_init(0) == 0))
        goto out;
    CHECK("device buffers", !kiln_cuda_malloc((void **)&dp, numel * 4) &&
                                !kiln_cuda_malloc((void **)&dg, numel * 4) &&
                                !kiln_cuda_malloc((void **)&dm, numel * 8));
    for (int opt = 0; opt < 2; opt++) {
        kiln_train_config c;
        kiln_train_config_default(&c);
        c.optimizer = opt ? KILN_OPTIM_SGD : KILN_OPTIM_ADAMW;
        for (size_t i = 0; i < numel; i++) {
            uint32_t w[4];
            kiln_philox(9, KILN_STREAM_TEST, i, w);
            hp[i] = (float)kiln_u32_to_unit(w[0]) - 0.5f;
            hg[i] = ((float)kiln_u32_to_unit(w[1]) - 0.5f) * 3.0f;
            hm[i] = ((float)kiln_u32_to_unit(w[2]) - 0.5f) * 0.1f;
            hv[i] = (float)kiln_u32_to_unit(w[3]) * 0.01f;
        }
        kiln_cuda_upload(dp, hp, numel * 4);
        kiln_cuda_upload(dm, hm, numel * 4);
        kiln_cuda_upload(dm + numel, hv, numel * 4);
        /* Clipped by 0.37 first, at update 5 with lr 0.003. */
        kiln_cuda_upload(dg, hg, numel * 4);
        kiln_train_grad_scale(tab, np, hg, 0.37f);
        kiln_train_optim_step(&c, tab, np, hp, hg, hm, hv, 5, 0.003, NULL, NULL);
        kiln_optim_consts o = {.adam = !opt,
                             .b1 = (float)c.beta1,
                             .b2 = (float)c.beta2,
                             .omb1 = (float)(1.0 - c.beta1),
                             .omb2 = (float)(1.0 - c.beta2),
                             .eps = (float)c.adam_eps,
                             .step = (float)(0.003 / (1.0 - pow(c.beta1, 5))),
                             .rsq_bc2 = (float)(1.0 / sqrt(1.0 - pow(c.beta2, 5))),
                             .lr = 0.003f,
                             .gscale = 0.37f};
        for (size_t i = 0; i < np; i++) {
            if (!(tab[i].flags & KILN_PARAM_TRAINED)) continue;
            size_t off = tab[i].offset;
            o.decay = tab[i].flags & KILN_PARAM_DECAY ? (float)(0.003 * c.weight_decay) : 0.0f;
            kiln_cuda_optim_update(dp + off, dg + off, dm + off, dm + numel + off, tab[i].numel,
                                   &o);
        }
        CHECK("download", kiln_cuda_download(gp, dp, numel * 4) == KILN_OK &&
                              kiln_cuda_download(gm, dm, numel * 8) == KILN_OK);
        CHECK(opt ? "sgd: the CPU's parameters, bit for bit"
                  : "adamw: the CPU's parameters, bit for bit",
              !memcmp(gp, hp, numel * 4));
        if (!opt)
            CHECK("adamw: the CPU's moments, bit for bit",
                  !memcmp(gm, hm, numel * 4) && !memcmp(gm + numel, hv, numel * 4));
    }
    kiln_cuda_free(dp);
    kiln_cuda_free(dg);
    kiln_cuda_free(dm);
    kiln_cuda_release();
out:
    free(tab);
    free(hp), free(hg), free(hm), free(hv), free(gp), free(gm);
}

typedef struct stopper {
    volatile int flag;
    long at;
    double loss[8];
} stopper;

static void on_progress(void *ctx, const kiln_train_progress *p) {
    stopper *s = ctx;
    if (p->step < 8) s->loss[p->step] = p->loss;
    if (p->step == s->at) s->flag = 1;
}

/* Runs on the device: repeatable, resumable, close to the CPU, and movable between them. */
static void on_device(const char *data) {
    char *a = kiln_test_path("a"), *b = kiln_test_path("b"), *r = kiln_test_path("r"),
         *cpu = kiln_test_path("cpu"), *x = kiln_test_path("x");
    char *a6 = kiln_run_ckpt_path(a, 6), *b6 = kiln_run_ckpt_path(b, 6),
         *r6 = kiln_run_ckpt_path(r, 6), *x6 = kiln_run_ckpt_path(x, 6),
         *cpu6 = kiln_run_ckpt_path(cpu, 6);
    kiln_train_config c;
    tiny_run(&c);
    stopper sa = {0, 0, {0}}, sc = {0, 0, {0}}, sr = {0, 3, {0}}, sx = {0, 2, {0}};
    kiln_train_opts oa = {
        .run_dir = a, .data_path = data, .progress = on_progress, .progress_ctx = &sa};
    if (!CHECK("a run on cuda", kiln_train_start(&c, &oa) == KILN_OK)) goto out;
    CHECK("its start says where", event_says(a, "start", "run started on cuda"));
    kiln_ckpt ck;
    CHECK("the checkpoint records the device", kiln_ckpt_open(a6, &ck) == KILN_OK &&
                                                   ck.cfg.device == KILN_TRAIN_CUDA &&
                                                   ck.state.updates == 6);
    kiln_ckpt_release(&ck);
    kiln_train_opts ob = {.run_dir = b, .data_path = data};
    CHECK("a second run", kiln_train_start(&c, &ob) == KILN_OK);
    CHECK("two runs: the same checkpoint bytes", kiln_test_same_file(a6, b6));
    /* Interrupted after step 3 (the stop flag is read before step 4), then resumed. */
    kiln_train_opts or = {.run_dir = r,
                          .data_path = data,
                          .stop = &sr.flag,
                          .progress = on_progress,
                          .progress_ctx = &sr};
    CHECK("interrupted", kiln_train_start(&c, & or) == KILN_ERR_INTERRUPTED);
    kiln_train_opts rr = {.run_dir = r};
    CHECK("resumed", kiln_train_resume(&rr) == KILN_OK);
    CHECK("interrupted and resumed: the uninterrupted run's bytes", kiln_test_same_file(a6, r6));
    /* The CPU trainer from the same start: the same losses to float rounding. */
    c.device = KILN_TRAIN_CPU;
    kiln_train_opts oc = {
        .run_dir = cpu, .data_path = data, .progress = on_progress, .progress_ctx = &sc};
    if (!CHECK("the cpu run", kiln_train_start(&c, &oc) == KILN_OK)) goto out;
    double worst = 0;
    for (int s = 1; s <= 6; s++)
        worst = fmax(worst, fabs(sa.loss[s] - sc.loss[s]) / fabs(sc.loss[s]));
    CHECK("losses within 1e-4 of the cpu's", worst <= 1e-4);
    CHECK("step 1's loss within 1e-5", fabs(sa.loss[1] - sc.loss[1]) <= 1e-5 * fabs(sc.loss[1]));
    /* cpu -> cuda: a cpu run stopped after step 2, resumed on cuda. */
    kiln_train_opts ox = {.run_dir = x,
                          .data_path = data,
                          .stop = &sx.flag,
                          .progress = on_progress,
                          .progress_ctx = &sx};
    CHECK("cpu run interrupted", kiln_train_start(&c, &ox) == KILN_ERR_INTERRUPTED);
    const char *to_cuda[] = {"device=cuda"};
    kiln_train_opts rx = {.run_dir = x, .sets = to_cuda, .n_sets = 1};
    CHECK("resumed on cuda", kiln_train_resume(&rx) == KILN_OK);
    CHECK("the event says so",
          event_says(x, "device_change", "resumed on cuda from a checkpoint written on cpu"));
    CHECK("the last checkpoint is cuda's", kiln_ckpt_open(x6, &ck) == KILN_OK &&
                                               ck.cfg.device == KILN_TRAIN_CUDA &&
                                               ck.state.updates == 6);
    kiln_ckpt_release(&ck);
    /* cuda -> cpu: the cuda run's step-3 checkpoint continued on the cpu. */
    char *r3 = kiln_run_ckpt_path(r, 3);
    kiln_ckpt_release(&ck);
    if (kiln_ckpt_open(r3, &ck) == KILN_OK) {
        kiln_ckpt_release(&ck);
        char *p6 = kiln_run_ckpt_path(r, 6);
        unlink(p6);
        free(p6);
        const char *to_cpu[] = {"device=cpu"};
        kiln_train_opts rc = {.run_dir = r, .sets = to_cpu, .n_sets = 1};
        CHECK("resumed on cpu", kiln_train_resume(&rc) == KILN_OK);
        CHECK("the event says so",
              event_says(r, "device_change", "resumed on cpu from a checkpoint written on cuda"));
    } else {
        CHECK("the step-3 checkpoint of the interrupted run", false);
    }
    free(r3);
    (void)cpu6;
out:
    free(a), free(b), free(r), free(cpu), free(x);
    free(a6), free(b6), free(r6), free(x6), free(cpu6);
}
#endif

KILN_TEST(cuda_train_device) {
    kiln_log_set_level(KILN_LOG_ERROR);
    char *data = kiln_test_synth("d.safetensors", 5, 300);
    if (!CHECK("data", data)) return;
    if (!kiln_test_gpu_present()) {
        refused(data);
    } else {
#ifdef KILN_HAVE_CUDA
        optimizer_bits();
        on_device(data);
#endif
    }
    kiln_log_set_level(KILN_LOG_INFO);
    free(data);
}

/* ---- the device communicator (data parallelism; NCCL in the kiln binary) ---- */

static kiln_err failing_comm(kiln_comm *boot, int device, kiln_comm **out) {
    (void)boot, (void)device;
    *out = NULL;
    return kiln_fail(KILN_ERR_DEVICE, "NCCL init rank: unhandled system error (test)");
}

#ifdef KILN_HAVE_CUDA
/* A device communicator of one rank without NCCL: each transfer is a device copy to itself
 * (a rank's sends and receives pair up in list order), on the legacy stream. */
static kiln_err loop_exchange(kiln_comm *c, const kiln_comm_xfer *x, size_t n) {
    (void)c;
    for (size_t i = 0; i < n; i++) {
        KILN_FAIL_IF(x[i].peer != 0 || x[i].send_bytes != x[i].recv_bytes, KILN_ERR_USAGE,
                     "loopback: transfer %zu does not pair up", i);
        KILN_TRY(kiln_cuda_copy(x[i].recv, x[i].send, x[i].send_bytes));
    }
    return KILN_OK;
}
static int loop_made;
static kiln_err loop_comm(kiln_comm *boot, int device, kiln_comm **out) {
    static kiln_comm c;
    (void)device;
    c = *boot;
    c.name = "loopback";
    c.exchange = loop_exchange;
    c.stream = NULL;
    c.destroy = NULL;
    loop_made++;
    *out = &c;
    return KILN_OK;
}

/* The bucketed path (every bucket queued from the backward hook, folded, put back) gives the
 * bytes of the plain one: accum_steps 1 (the backward's gradient) and 2 (folded in place). */
static void through_buckets(const char *data) {
    for (int accum = 1; accum <= 2; accum++) {
        char na[16], nb[16];
        snprintf(na, sizeof na, "plain%d", accum);
        snprintf(nb, sizeof nb, "buckets%d", accum);
        char *a = kiln_test_path(na), *b = kiln_test_path(nb);
        char *a6 = kiln_run_ckpt_path(a, 6), *b6 = kiln_run_ckpt_path(b, 6);
        kiln_train_config c;
        tiny_run(&c);
        c.accum_steps = accum;
        kiln_train_opts oa = {.run_dir = a, .data_path = data};
        kiln_train_opts ob = {
            .run_dir = b, .data_path = data, .device_comm = loop_comm, .bucket_bytes = 256};
        loop_made = 0;
        CHECK("plain run", kiln_train_start(&c, &oa) == KILN_OK);
        CHECK("bucketed run", kiln_train_start(&c, &ob) == KILN_OK);
        CHECK("the device communicator was used", loop_made == 1);
        CHECK("buckets: the plain run's checkpoint bytes", kiln_test_same_file(a6, b6));
        CHECK("the devices event", event_says(b, "devices", "1 rank over NCCL: GPU 0"));
        /* Every bucket is queued by the backward pass itself (its last hook comes after the
         * embedding), none after it: the reduction can overlap the backward. */
        CHECK("the buckets event: all queued during the backward pass",
              event_says(b, "buckets", "queued during the backward pass, 0 after it") &&
                  !event_says(b, "buckets", "; 0 queued"));
        free(a), free(b), free(a6), free(b6);
    }
}
#endif

KILN_TEST(cuda_train_device_comm) {
    kiln_log_set_level(KILN_LOG_ERROR);
    char *data = kiln_test_synth("d.safetensors", 6, 300), *dir = kiln_test_path("run");
    if (!CHECK("data", data && dir)) goto out;
    kiln_train_config c;
    tiny_run(&c);
    /* A device communicator that does not start: an error naming it, nothing written. */
    kiln_train_opts o = {.run_dir = dir, .data_path = data, .device_comm = failing_comm};
    kiln_err rc = kiln_train_start(&c, &o);
    CHECK("refused", rc != KILN_OK);
    CHECK("the message names the device and the rank count",
          has("cannot train on device \"cuda\" on 1 rank: "));
    if (kiln_test_gpu_present()) CHECK("the message names NCCL", has("NCCL init rank: "));
    CHECK("nothing written", !kiln_path_exists(dir));
#ifdef KILN_HAVE_CUDA
    if (kiln_test_gpu_present()) through_buckets(data);
#endif
out:
    kiln_log_set_level(KILN_LOG_INFO);
    free(data);
    free(dir);
}

/* validate's parity_cpu_cuda: passed on a GPU (the CUDA network against the runtime on the
 * held-out windows), "not run" with its reason without one; never counted as passed then. */
KILN_TEST(cuda_validate_parity) {
    kiln_log_set_level(KILN_LOG_ERROR);
    char *data = kiln_test_synth("d.safetensors", 5, 300), *run = kiln_test_path("run"),
         *model = kiln_test_path("model");
    json_t *rep = NULL;
    kiln_train_config c;
    tiny_run(&c);
    c.device = KILN_TRAIN_CPU;
    kiln_train_opts o = {.run_dir = run, .data_path = data};
    if (!CHECK("train", data && kiln_train_start(&c, &o) == KILN_OK)) goto out;
    kiln_export_opts eo = {.run_dir = run, .step_metrics = kiln_run_step_metrics, .out_dir = model};
    kiln_golden_opts go = {
        .model = model, .data = data, .windows = 2, .seed = 3, .val_fraction = -1};
    if (!CHECK("export and golden",
               kiln_export_model(&eo, NULL) == KILN_OK && kiln_golden_make(&go) == KILN_OK))
        goto out;
    kiln_thresholds th;
    kiln_thresholds_default(&th);
    th.heldout_windows = 6;
    kiln_validate_opts vo = {.model = model, .data = data, .val_fraction = -1, .thresholds = &th};
    kiln_err rc = kiln_validate_run(&vo, &rep);
    const json_t *ck = json_object_get(json_object_get(rep, "checks"), "parity_cpu_cuda");
    const char *st = json_string_value(json_object_get(ck, "status"));
    if (kiln_test_gpu_present()) {
        CHECK("validate passes", rc == KILN_OK);
        CHECK("parity_cpu_cuda passed", st && !strcmp(st, "passed"));
        const json_t *f = json_object_get(ck, "figures");
        CHECK("it compared every output of the held-out windows",
              json_integer_value(json_object_get(f, "compared")) == 6 * 8 * 1 &&
                  json_real_value(json_object_get(f, "max_rel_err")) <= th.cuda.rtol);
    } else {
        const char *why = json_string_value(json_object_get(ck, "reason"));
        CHECK("not run without a GPU", st && !strcmp(st, "not run"));
        CHECK("the reason says no GPU", why && strstr(why, "no GPU"));
        CHECK("the report does not count it", rc == KILN_OK);
    }
out:
    json_decref(rep);
    kiln_log_set_level(KILN_LOG_INFO);
    free(data), free(run), free(model);
}

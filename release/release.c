/* release.c - kiln release: one run directory to a published (and optionally promoted)
 * version, stage by stage, stopping at the first failure with the stage named.
 *
 *   check -> export -> golden -> baseline -> validate -> pack -> sign -> publish -> promote
 *
 * Every stage is a library call that the CLI also offers on its own (kiln export, golden
 * make, pull, validate, pack, sign, publish, promote); this file only sequences them and
 * passes files along, which is why it is a layer of its own above registry/, validate/ and
 * export/ (docs/architecture.md). Nothing is published unless validation passed and the
 * signed archive verifies under the same trust policy the pulling services use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "export.h"
#include "registry.h"
#include "release.h"
#include "runs.h"
#include "sign.h"
#include "validate.h"

static const char *const stage_names[] = {
    [KILN_RELEASE_CHECK] = "check",       [KILN_RELEASE_EXPORT] = "export",
    [KILN_RELEASE_GOLDEN] = "golden",     [KILN_RELEASE_BASELINE] = "baseline",
    [KILN_RELEASE_VALIDATE] = "validate", [KILN_RELEASE_PACK] = "pack",
    [KILN_RELEASE_SIGN] = "sign",         [KILN_RELEASE_PUBLISH] = "publish",
    [KILN_RELEASE_PROMOTE] = "promote",   [KILN_RELEASE_DONE] = "done",
};

const char *kiln_release_stage_name(kiln_release_stage s) {
    return (unsigned)s < KILN_ARRAY_LEN(stage_names) ? stage_names[s] : "?";
}

typedef struct rel {
    const kiln_release_opts *o;
    kiln_release_result *res;
    char *data, *model, *archive, *sigpath, *baseline_tmp, *baseline;
    kiln_sign_trust *trust;
    bool made_out; /* the check stage created o->out_dir */
    char *card_data; /* a model directory's card's lineage.dataset_path, or NULL */
    char line[1024];
} rel;

/* Tell the caller a stage is done (its one line is in r->line). */
static void done(rel *r, kiln_release_stage s) {
    if (r->o->on_stage) r->o->on_stage(r->o->ctx, s, r->line);
    r->line[0] = 0;
}

/* A model directory to release: model.safetensors and a card that kiln pack will take
 * (an object with an object "lineage" and a string "created"), checked before any work, each
 * under the rule every reader of a model directory follows (core/modeldir.c: a regular file,
 * not a symlink to one elsewhere). The model itself is checked by every later stage (golden
 * make and validate open it as the runtime does). */
static kiln_err model_dir_check(rel *r) {
    const char *d = r->o->model_dir;
    KILN_FAIL_IF(kiln_path_dir_state(d) == KILN_DIR_ABSENT, KILN_ERR_NOTFOUND,
                 "model directory '%s' does not exist", d);
    KILN_FAIL_IF(kiln_path_dir_state(d) == KILN_DIR_OTHER, KILN_ERR_USAGE,
                 "'%s' is not a model directory", d);
    json_t *card = NULL;
    kiln_err rc = KILN_OK;
    int fd = -1;
    rc = kiln_modeldir_open(d, "model.safetensors", &fd, NULL);
    if (fd >= 0) close(fd);
    if (rc == KILN_ERR_NOTFOUND)
        kiln_errprefix(rc, "'%s' is not a model directory: ", d);
    if (rc) return rc;
    rc = kiln_modeldir_json(d, "card.json", KILN_CARD_MAX_BYTES, &card);
    if (rc == KILN_ERR_NOTFOUND)
        kiln_errprefix(rc, "a released model needs a card saying where it came from: ");
    if (rc) return rc;
    KILN_CHECK_IF(rc, out,
                  !json_is_object(card) || !json_is_object(json_object_get(card, "lineage")) ||
                      !json_is_string(json_object_get(card, "created")),
                  KILN_ERR_FORMAT,
                  "'%s/card.json': must be an object with an object \"lineage\" and a string "
                  "\"created\"",
                  d);
    const char *dp =
        json_string_value(json_object_get(json_object_get(card, "lineage"), "dataset_path"));
    if (dp) KILN_CHECK_IF(rc, out, !(r->card_data = kiln_strdup(dp)), KILN_ERR_NOMEM, "out of memory");
out:
    json_decref(card);
    return rc;
}

/* Copy a model directory's model.safetensors and card.json into OUT/model (golden sets and
 * reports are made again by the stages after this one): into a temporary directory beside
 * it, renamed into place, so that a failed copy leaves nothing, as a failed export does. */
static kiln_err stage_copy_model(rel *r) {
    static const char *const files[] = {"model.safetensors", "card.json"};
    char *tmp = kiln_asprintf("%s/.model.copy-XXXXXX", r->o->out_dir);
    if (!tmp) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!mkdtemp(tmp)) {
        kiln_err e = kiln_fail_errno(KILN_ERR_IO, "cannot create a temporary directory in '%s'",
                                     r->o->out_dir);
        free(tmp);
        return e;
    }
    kiln_err rc = chmod(tmp, 0755) ? kiln_fail_errno(KILN_ERR_IO, "'%s': cannot chmod", tmp)
                                   : KILN_OK;
    for (size_t i = 0; !rc && i < KILN_ARRAY_LEN(files); i++) {
        char *dst = kiln_path_join(tmp, files[i]);
        char *buf = NULL;
        size_t len = 0;
        /* Through the model directory's rule again: what was checked is what is copied. */
        rc = dst ? kiln_modeldir_read(r->o->model_dir, files[i], (size_t)1 << 40, &buf, &len)
                 : kiln_fail(KILN_ERR_NOMEM, "out of memory");
        if (!rc) rc = kiln_write_file_atomic(dst, buf, len);
        free(buf);
        free(dst);
    }
    if (!rc && rename(tmp, r->model))
        rc = kiln_fail_errno(KILN_ERR_IO, "'%s': cannot rename into place", r->model);
    if (rc) kiln_rmtree(tmp);
    free(tmp);
    if (!rc)
        snprintf(r->line, sizeof r->line, "model directory '%s' copied into '%s'",
                 r->o->model_dir, r->model);
    return rc;
}

/* Options, keys, the policy, the dataset, the output directory, and that the registry
 * answers and does not hold name@version yet (versions are immutable). */
static kiln_err stage_check(rel *r) {
    const kiln_release_opts *o = r->o;
    KILN_FAIL_IF(!o->run_dir == !o->model_dir || !o->name || !o->version || !o->out_dir ||
                     !o->trust || !o->client || !o->client->url,
                 KILN_ERR_USAGE,
                 "a release needs a run directory or a model directory (one of the two), a name, "
                 "a version, a registry, a trust policy and an output directory");
    KILN_TRY(kiln_registry_check_name("model", o->name));
    KILN_TRY(kiln_registry_check_version(o->version));
    KILN_FAIL_IF(!o->n_release_keys, KILN_ERR_USAGE, "a release needs a release key to sign with");
    if (o->promote) {
        KILN_TRY(kiln_registry_check_channel(o->promote));
        KILN_FAIL_IF(!o->n_promote_keys, KILN_ERR_USAGE, "promoting to '%s' needs a promote key",
                     o->promote);
    }
    if (o->baseline_channel && *o->baseline_channel)
        KILN_TRY(kiln_registry_check_channel(o->baseline_channel));
    /* The policy the services will pull under: --trust walked to the registry's newest
     * version, so a release key revoked there cannot release. */
    KILN_TRY(kiln_registry_trust_walk(o->client, o->trust, o->state, NULL, NULL, &r->trust));
    if (o->model_dir) KILN_TRY(model_dir_check(r));
    if (o->data) {
        r->data = kiln_strdup(o->data);
    } else if (o->model_dir) {
        KILN_FAIL_IF(!r->card_data, KILN_ERR_USAGE,
                     "'%s/card.json' names no lineage.dataset_path; give --data", o->model_dir);
        r->data = kiln_strdup(r->card_data);
    } else {
        /* The dataset the run was trained on, as run.json records it. */
        char *rj = kiln_path_join(o->run_dir, "run.json");
        json_t *j = NULL;
        kiln_err rc = rj ? kiln_json_load_file(rj, &j) : KILN_ERR_NOMEM;
        const char *dp = json_string_value(json_object_get(j, "dataset_path"));
        if (!rc && !dp)
            rc = kiln_fail(KILN_ERR_FORMAT, "'%s' names no dataset_path; give --data", rj);
        if (!rc) r->data = kiln_strdup(dp);
        json_decref(j);
        free(rj);
        KILN_TRY(rc);
    }
    KILN_FAIL_IF(!r->data, KILN_ERR_NOMEM, "out of memory");
    KILN_FAIL_IF(!kiln_path_exists(r->data), KILN_ERR_NOTFOUND,
                 "dataset '%s' does not exist; give --data", r->data);
    /* Opened (every check of a dataset, its digest) before any work: a bad file stops the
     * release here, not at the golden stage after the export. */
    kiln_dataset *ds = NULL;
    KILN_TRY(kiln_dataset_open(r->data, &ds));
    kiln_dataset_free(ds);
    KILN_FAIL_IF(kiln_path_exists(o->out_dir) && kiln_path_dir_state(o->out_dir) != KILN_DIR_EMPTY,
                 KILN_ERR_CONFLICT,
                 "'%s' exists and is not empty; a release writes into a new directory", o->out_dir);
    r->model = kiln_path_join(o->out_dir, "model");
    r->archive = kiln_asprintf("%s/%s-%s.kiln", o->out_dir, o->name, o->version);
    r->sigpath = r->archive ? kiln_asprintf("%s.minisig", r->archive) : NULL;
    KILN_FAIL_IF(!r->model || !r->sigpath, KILN_ERR_NOMEM, "out of memory");
    char *vpath = kiln_asprintf("/v1/models/%s/versions/%s", o->name, o->version);
    KILN_FAIL_IF(!vpath, KILN_ERR_NOMEM, "out of memory");
    json_t *ver = NULL;
    kiln_err rc = kiln_registry_get_json(o->client, vpath, &ver);
    free(vpath);
    json_decref(ver);
    if (rc == KILN_OK)
        return kiln_fail(KILN_ERR_CONFLICT,
                         "the registry holds %s@%s already and versions are immutable; release "
                         "under another --version",
                         o->name, o->version);
    if (rc != KILN_ERR_NOTFOUND) return rc;
    /* The output directory last, so that a refusal above leaves no trace. */
    r->made_out = !kiln_path_exists(o->out_dir);
    KILN_TRY(kiln_mkdir_p(o->out_dir));
    snprintf(r->line, sizeof r->line, "%s@%s is free at %s; dataset '%s'", o->name, o->version,
             o->client->url, r->data);
    return KILN_OK;
}

/* The dataset stays off the registry: --no-data, or an OCI registry, which stores models
 * but no datasets yet (the card then says dataset_withheld, as with --no-data). */
static bool data_off(const rel *r) {
    return r->o->no_data || kiln_registry_is_oci(r->o->client->url);
}

static kiln_err stage_export(rel *r) {
    if (r->o->model_dir) return stage_copy_model(r);
    kiln_export_opts eo = {.run_dir = r->o->run_dir,
                           .step = r->o->step,
                           .out_dir = r->model,
                           .name = r->o->name,
                           .data_withheld = data_off(r),
                           /* the curves of the run, signed with the rest (runs.h) */
                           .add_files = kiln_run_summary_add,
                           .add_files_ctx = (void *)r->o->run_dir,
                           .best_step = kiln_run_best_ckpt,
                           .step_metrics = kiln_run_step_metrics};
    kiln_export_info info;
    KILN_TRY(kiln_export_model(&eo, &info));
    r->res->step = info.step;
    snprintf(r->line, sizeof r->line, "step %ld of '%s' frozen into '%s'", info.step, r->o->run_dir,
             r->model);
    kiln_export_info_release(&info);
    return KILN_OK;
}

static kiln_err stage_golden(rel *r) {
    int windows = r->o->windows > 0 ? r->o->windows : 64;
    kiln_golden_opts go = {.model = r->model,
                           .data = r->data,
                           .windows = windows,
                           .seed = r->o->seed ? r->o->seed : 1,
                           .val_fraction = -1};
    KILN_TRY(kiln_golden_make(&go));
    snprintf(r->line, sizeof r->line, "outputs on %d held-out windows in '%s/golden'", windows,
             r->model);
    return KILN_OK;
}

/* The model now in the baseline channel, pulled and verified with the client's policy
 * into a temporary directory; none when the channel is empty. */
static kiln_err stage_baseline(rel *r) {
    const kiln_release_opts *o = r->o;
    if (!o->baseline_channel || !*o->baseline_channel) {
        snprintf(r->line, sizeof r->line, "none asked for");
        return KILN_OK;
    }
    r->baseline_tmp = kiln_asprintf("%s/.baseline-XXXXXX", o->out_dir);
    KILN_FAIL_IF(!r->baseline_tmp, KILN_ERR_NOMEM, "out of memory");
    if (!mkdtemp(r->baseline_tmp)) {
        kiln_err rc =
            kiln_fail_errno(KILN_ERR_IO, "cannot create a temporary directory in '%s'", o->out_dir);
        free(r->baseline_tmp);
        r->baseline_tmp = NULL;
        return rc;
    }
    r->baseline = kiln_path_join(r->baseline_tmp, "model");
    KILN_FAIL_IF(!r->baseline, KILN_ERR_NOMEM, "out of memory");
    char ref[2 * KILN_REGISTRY_NAME_MAX + 2];
    snprintf(ref, sizeof ref, "%s@%s", o->name, o->baseline_channel);
    kiln_registry_pull_opts p = {
        .ref = ref, .trust = o->trust, .out = r->baseline, .state = o->state, .channel_only = true};
    kiln_registry_pulled got;
    kiln_err rc = kiln_registry_pull(o->client, &p, &got);
    if (rc == KILN_ERR_NOTFOUND) {
        free(r->baseline);
        r->baseline = NULL;
        snprintf(r->line, sizeof r->line, "channel '%s' of '%s' is empty: no baseline",
                 o->baseline_channel, o->name);
        return KILN_OK;
    }
    KILN_TRY(rc);
    snprintf(r->res->baseline, sizeof r->res->baseline, "%s", got.version);
    r->res->baseline_seq = got.seq;
    snprintf(r->res->baseline_digest, sizeof r->res->baseline_digest, "%s", got.digest);
    snprintf(r->line, sizeof r->line, "%s@%s (channel %s, seq %lld) %s, signed by %s", got.model,
             got.version, got.channel, (long long)got.seq, got.digest, got.signed_by);
    return KILN_OK;
}

/* "name, name" of the checks with this status, into buf. */
static void checks_with(const json_t *rep, const char *status, char *buf, size_t len) {
    size_t n = 0;
    const char *k;
    json_t *c;
    buf[0] = 0;
    json_object_foreach(json_object_get(rep, "checks"), k, c) {
        const char *st = json_string_value(json_object_get(c, "status"));
        if (st && !strcmp(st, status) && n < len)
            n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? ", " : "", k);
    }
}

static kiln_err stage_validate(rel *r) {
    /* The report names the baseline as it was pulled and verified: name@version, the
     * archive's digest and the channel record it came through (kiln provenance shows it). */
    const kiln_validate_baseline_ref ref = {.name = r->o->name,
                                            .version = r->res->baseline,
                                            .digest = r->res->baseline_digest,
                                            .channel = r->o->baseline_channel,
                                            .seq = r->res->baseline_seq};
    kiln_validate_opts vo = {.model = r->model,
                             .data = r->data,
                             .baseline = r->baseline,
                             .baseline_ref = r->baseline ? &ref : NULL,
                             .no_bf16 = r->o->no_bf16,
                             .thresholds = r->o->thresholds,
                             .val_fraction = -1,
                             .reference = r->o->reference};
    json_t *rep = NULL;
    kiln_err rc = kiln_validate_run(&vo, &rep);
    const json_t *checks = json_object_get(rep, "checks");
    const char *path = json_string_value(json_object_get(rep, "report"));
    if (rc == KILN_ERR_VERIFY && rep) {
        /* The failed checks' names on the first line, what failed; each one's reason (which
         * the report keeps) on a line of its own after it: one line of 500 characters was
         * hard to read (issue 30). */
        char names[300], why[700];
        size_t n = 0, nn = 0;
        int failed = 0;
        const char *k;
        json_t *c;
        why[0] = names[0] = 0;
        json_object_foreach((json_t *)checks, k, c) {
            const char *st = json_string_value(json_object_get(c, "status")),
                       *re = json_string_value(json_object_get(c, "reason"));
            if (!st || strcmp(st, "failed")) continue;
            failed++;
            if (nn < sizeof names)
                nn += (size_t)snprintf(names + nn, sizeof names - nn, "%s%s", nn ? ", " : "", k);
            if (n < sizeof why)
                n += (size_t)snprintf(why + n, sizeof why - n, "\n%s", re ? re : k);
        }
        rc = kiln_fail(KILN_ERR_VERIFY, "validation failed: %d check%s failed: %s (report '%s')%s",
                       failed, failed == 1 ? "" : "s", names, path ? path : r->model, why);
    } else if (rc == KILN_OK) {
        char passed[400], not_run[200];
        checks_with(rep, "passed", passed, sizeof passed);
        checks_with(rep, "not run", not_run, sizeof not_run);
        double loss = json_real_value(json_object_get(json_object_get(rep, "heldout"), "loss"));
        snprintf(r->line, sizeof r->line, "passed: %s%s%s; held-out loss %.6g", passed,
                 not_run[0] ? "; not run: " : "", not_run, loss);
        if (r->baseline) {
            const json_t *f =
                json_object_get(json_object_get((json_t *)checks, "baseline_loss"), "figures");
            size_t l = strlen(r->line);
            snprintf(r->line + l, sizeof r->line - l, ", baseline %s's %.6g", r->res->baseline,
                     json_real_value(json_object_get(f, "baseline_loss")));
        }
    }
    json_decref(rep);
    return rc;
}

static kiln_err stage_pack(rel *r) {
    uint8_t digest[KILN_SHA256_BYTES];
    kiln_manifest *m = NULL;
    KILN_TRY(kiln_archive_pack(r->model, r->o->name, r->o->version, r->archive, digest, &m));
    char dh[KILN_SHA256_HEX], mh[KILN_SHA256_HEX];
    kiln_hex(digest, sizeof digest, dh);
    kiln_hex(m->sha256, sizeof m->sha256, mh);
    snprintf(r->line, sizeof r->line, "'%s' sha256:%s (%zu files, manifest sha256:%s)", r->archive,
             dh, m->nfiles, mh);
    kiln_manifest_free(m);
    return KILN_OK;
}

/* Every release key signs; the signature file must then verify under the policy the
 * services pull with (its release threshold), or nothing is published. */
static kiln_err stage_sign(rel *r) {
    char *file = NULL, *sig = NULL, *next = NULL;
    size_t len = 0;
    kiln_err rc = KILN_OK;
    for (size_t i = 0; i < r->o->n_release_keys; i++) {
        KILN_CHECK(rc, out,
                   kiln_sign_archive(r->o->release_keys[i], r->archive, false, &sig, NULL));
        KILN_CHECK(rc, out, kiln_sign_archive_sigs_add(file, len, r->sigpath, sig, &next));
        free(file);
        free(sig);
        sig = NULL;
        file = next;
        next = NULL;
        len = strlen(file);
    }
    KILN_CHECK(rc, out, kiln_write_file_atomic(r->sigpath, file, len));
    kiln_sign_archive_report rep;
    KILN_CHECK(rc, out,
               kiln_sign_verify_archive_sigs(r->archive, file, len, r->sigpath, r->trust, &rep));
    char who[256];
    kiln_sign_signers_text(&rep, who, sizeof who);
    snprintf(r->line, sizeof r->line, "'%s': %s", r->sigpath, who);
out:
    free(file);
    free(sig);
    free(next);
    return rc;
}

/* Whether the registry lists a dataset of digest ("sha256:<hex>"). */
static kiln_err data_held(const kiln_registry_client_opts *c, const char *digest, bool *held) {
    json_t *j = NULL;
    *held = false;
    kiln_err rc = kiln_registry_get_json(c, "/v1/datasets", &j);
    size_t i;
    json_t *d;
    json_array_foreach(json_object_get(j, "datasets"), i, d) {
        const char *g = json_string_value(json_object_get(d, "digest"));
        if (g && !strcmp(g, digest)) *held = true;
    }
    json_decref(j);
    return rc;
}

/* The dataset the card names by digest, published before the archive (signed by the first
 * release key, named as the model) unless the registry holds it or no_data; r->res->data says
 * which. A --data whose digest is not the card's is not the training dataset: nothing is
 * published, and the line says so. */
static kiln_err publish_data(rel *r) {
    const kiln_release_opts *o = r->o;
    char *cp = kiln_path_join(r->model, "card.json"), *comment = NULL, *sig = NULL;
    json_t *card = NULL;
    kiln_dataset *ds = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !cp, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_json_load_file(cp, &card));
    const char *want =
        json_string_value(json_object_get(json_object_get(card, "lineage"), "dataset_sha256"));
    if (data_off(r)) {
        snprintf(r->res->data, sizeof r->res->data, "%s",
                 o->no_data ? "withheld (--no-data)"
                            : "not published: an OCI registry stores no datasets (kiln's "
                              "registry server does; kiln reproduce then needs --data)");
        goto out;
    }
    KILN_CHECK(rc, out, kiln_dataset_open(r->data, &ds));
    snprintf(r->res->data_digest, sizeof r->res->data_digest, "sha256:%s", ds->sha256);
    if (!want || strcmp(want, ds->sha256)) {
        snprintf(r->res->data, sizeof r->res->data,
                 "not published: '%s' is not the dataset the card names", r->data);
        goto out;
    }
    bool held;
    KILN_CHECK(rc, out, data_held(o->client, r->res->data_digest, &held));
    if (held) {
        snprintf(r->res->data, sizeof r->res->data, "held by the registry already");
        goto out;
    }
    comment = kiln_registry_data_comment(o->name, ds->sha256);
    KILN_CHECK_IF(rc, out, !comment, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_sign_file(o->release_keys[0], r->data, comment, &sig));
    kiln_registry_published pub;
    KILN_CHECK(rc, out,
               kiln_registry_data_publish(o->client, r->data, o->name, sig, strlen(sig), &pub));
    snprintf(r->res->data, sizeof r->res->data, "published as %s", o->name);
out:
    if (ds) kiln_dataset_free(ds);
    json_decref(card);
    free(cp);
    free(comment);
    free(sig);
    return rc;
}

static kiln_err stage_publish(rel *r) {
    KILN_TRY(publish_data(r));
    kiln_registry_published pub;
    KILN_TRY(kiln_registry_publish(r->o->client, r->archive, r->sigpath, &pub));
    snprintf(r->res->digest, sizeof r->res->digest, "%s", pub.digest);
    r->res->size = pub.size;
    r->res->existed = pub.existed;
    snprintf(r->line, sizeof r->line, "%s@%s %s (%llu bytes)%s; dataset %s %s", r->o->name,
             r->o->version, pub.digest, (unsigned long long)pub.size,
             pub.existed ? ", already stored" : "",
             r->res->data_digest[0] ? r->res->data_digest : "", r->res->data);
    return KILN_OK;
}

static kiln_err stage_promote(rel *r) {
    const kiln_release_opts *o = r->o;
    if (!o->promote) {
        snprintf(r->line, sizeof r->line, "not asked for");
        return KILN_OK;
    }
    kiln_registry_client_opts c = *o->client;
    if (o->promote_token) c.token = o->promote_token;
    c.progress = NULL;
    kiln_registry_promote_opts po = {.model = o->name,
                                     .channel = o->promote,
                                     .version = o->version,
                                     .keys = o->promote_keys,
                                     .nkeys = o->n_promote_keys,
                                     .reason = "release",
                                     .digest = r->res->digest};
    kiln_registry_promoted got;
    KILN_TRY(kiln_registry_promote(&c, &po, &got));
    r->res->promoted_seq = got.seq;
    snprintf(r->line, sizeof r->line, "%s/%s -> %s seq %llu (%zu signature%s)", o->name, o->promote,
             o->version, (unsigned long long)got.seq, got.nsigs, got.nsigs == 1 ? "" : "s");
    return KILN_OK;
}

kiln_err kiln_release_run(const kiln_release_opts *o, kiln_release_result *res) {
    memset(res, 0, sizeof *res);
    rel r = {.o = o, .res = res};
    static kiln_err (*const stages[])(rel *) = {
        [KILN_RELEASE_CHECK] = stage_check,       [KILN_RELEASE_EXPORT] = stage_export,
        [KILN_RELEASE_GOLDEN] = stage_golden,     [KILN_RELEASE_BASELINE] = stage_baseline,
        [KILN_RELEASE_VALIDATE] = stage_validate, [KILN_RELEASE_PACK] = stage_pack,
        [KILN_RELEASE_SIGN] = stage_sign,         [KILN_RELEASE_PUBLISH] = stage_publish,
        [KILN_RELEASE_PROMOTE] = stage_promote,
    };
    kiln_err rc = KILN_OK;
    for (res->stage = KILN_RELEASE_CHECK; res->stage < KILN_RELEASE_DONE; res->stage++) {
        r.line[0] = 0;
        rc = stages[res->stage](&r);
        if (rc) {
            rc = kiln_errprefix(
                rc, "release stopped at stage '%s': ", kiln_release_stage_name(res->stage));
            break;
        }
        done(&r, res->stage);
        /* The baseline is only needed to validate against. */
        if (res->stage == KILN_RELEASE_VALIDATE && r.baseline_tmp) {
            kiln_rmtree(r.baseline_tmp);
            free(r.baseline_tmp);
            r.baseline_tmp = NULL;
        }
    }
    if (r.baseline_tmp) kiln_rmtree(r.baseline_tmp);
    /* A release that stopped before making anything (the export is atomic) leaves no empty
     * output directory behind; one that made something keeps it to be looked at. */
    if (rc && r.made_out && kiln_path_dir_state(o->out_dir) == KILN_DIR_EMPTY) rmdir(o->out_dir);
    kiln_sign_trust_free(r.trust);
    free(r.data), free(r.model), free(r.archive), free(r.sigpath), free(r.baseline_tmp),
        free(r.baseline), free(r.card_data);
    return rc;
}

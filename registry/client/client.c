/* client.c - the pull: a channel record or a version checked against this client's trust
 * policy and state, the archive downloaded into the state directory (resumed, locked against
 * a second pull of the same digest) and verified as it lands, then installed beside its
 * target; and kiln_pull, the public API's pull over several registries. Nothing the
 * registry says is trusted until it has been verified. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client_int.h"
#include "export.h"

/* ---- pull ---- */

/* Put dir at out: a plain rename, or an exchange with an existing directory whose old
 * contents are then removed: only a model directory kiln installed, or an empty one
 * (kiln_archive_dir_replaceable, checked before the pull began and again here). */
static kiln_err install_dir(const char *tmp, const char *out) {
    KILN_TRY(kiln_archive_dir_replaceable(out, "a pull"));
    if (rename(tmp, out) == 0) return KILN_OK;
    if (errno != EEXIST && errno != ENOTEMPTY)
        return kiln_fail_errno(KILN_ERR_IO, "cannot rename '%s' to '%s'", tmp, out);
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, out, RENAME_EXCHANGE) != 0)
        return kiln_fail_errno(KILN_ERR_IO, "cannot replace '%s'", out);
    reg_rmtree(tmp); /* now the old contents */
    return KILN_OK;
}

/* Take the lock of a download (DOWNLOADS/<hex>.lock, flock): pulls of one archive that share
 * a state directory take turns with its partial file. The file is removed by the pull that
 * holds it when it is done, so a lock taken on a file that was removed meanwhile is taken
 * again on the one at path now. wait false: -1 in *fd when another holds it. */
static kiln_err lock_download(const char *path, bool wait, int *fd) {
    *fd = -1;
    for (;;) {
        int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (f < 0) return kiln_fail_errno(KILN_ERR_IO, "cannot open '%s'", path);
        while (flock(f, wait ? LOCK_EX : LOCK_EX | LOCK_NB) != 0) {
            if (errno == EINTR) continue;
            int err = errno;
            close(f);
            if (!wait && err == EWOULDBLOCK) return KILN_OK;
            errno = err;
            return kiln_fail_errno(KILN_ERR_IO, "cannot lock '%s'", path);
        }
        struct stat a, b;
        if (fstat(f, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino) {
            *fd = f;
            return KILN_OK;
        }
        close(f); /* removed by the pull that held it: take the new one */
    }
}

/* Release a download's lock, removing its file first (a pull waiting on it takes the next). */
static void unlock_download(const char *path, int fd) {
    if (fd < 0) return;
    unlink(path);
    close(fd);
}

/* How old a partial download nobody holds may get before a pull removes it: a pull that fails
 * removes its own, so these are what killed processes left. */
#define REG_PARTIAL_TTL_S (24 * 3600)

/* Remove the partial downloads in dir (and their lock files) that no pull holds and that have
 * not changed for REG_PARTIAL_TTL_S: a pull killed by a signal leaves its partial for the next
 * pull of that archive to resume, and this bounds how long. Best effort. */
static void sweep_downloads(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    int64_t now = kiln_unix_time();
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        bool partial = n > 8 && !strcmp(e->d_name + n - 8, ".partial");
        bool lock = n > 5 && !strcmp(e->d_name + n - 5, ".lock");
        if (!partial && !lock) continue;
        size_t base = n - (partial ? 8 : 5);
        char *p = kiln_asprintf("%s/%.*s.partial", dir, (int)base, e->d_name),
             *l = kiln_asprintf("%s/%.*s.lock", dir, (int)base, e->d_name);
        struct stat sb;
        const char *mine = partial ? p : l;
        int fd = -1;
        if (p && l && stat(mine, &sb) == 0 && S_ISREG(sb.st_mode) &&
            now - (int64_t)sb.st_mtime > REG_PARTIAL_TTL_S && (!lock || !kiln_path_exists(p)) &&
            lock_download(l, false, &fd) == KILN_OK && fd >= 0) {
            unlink(p);
            kiln_debug("removed the abandoned download '%s'", mine);
        }
        kiln_errclear();
        unlock_download(l, fd);
        free(p);
        free(l);
    }
    closedir(d);
}

/* The private directories of pulls into out (PARENT/.BASE.pull-XXXXXX) that no live pull
 * holds: a pull holds an flock on its directory while it runs, so one that takes it here was
 * left by a killed pull (the unpack runs while the download lands: such a directory may hold
 * part of a model, never at out). Best effort. */
static void sweep_pulls(const char *parent, const char *base) {
    DIR *d = opendir(parent);
    if (!d) return;
    char *prefix = kiln_asprintf(".%s.pull-", base);
    size_t pl = prefix ? strlen(prefix) : 0;
    struct dirent *e;
    while (prefix && (e = readdir(d))) {
        if (strncmp(e->d_name, prefix, pl) || strlen(e->d_name) != pl + 6) continue;
        char *path = kiln_path_join(parent, e->d_name);
        int fd = path ? open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
        if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0) {
            reg_rmtree(path);
            kiln_debug("removed '%s', left by a pull that was killed", path);
        }
        if (fd >= 0) close(fd);
        free(path);
    }
    kiln_errclear();
    free(prefix);
    closedir(d);
}

/* Where a pull's time goes, at debug level (KILN_LOG=debug): bench/bench_registry.sh reads
 * these lines. */
static void pull_phase(const char *what, uint64_t from_ns, uint64_t to_ns, uint64_t bytes) {
    double s = (double)(to_ns - from_ns) / 1e9;
    if (bytes && s > 0)
        kiln_debug("pull phase: %s: %.6f s (%.1f MB/s)", what, s, (double)bytes / 1e6 / s);
    else
        kiln_debug("pull phase: %s: %.6f s", what, s);
}

/* The arguments of a pull: a NAME@X reference (X a channel or a version by the naming
 * rule alone, never by what a registry has), a policy, an output. */
static kiln_err pull_args(const kiln_registry_pull_opts *p, char model[KILN_REGISTRY_NAME_MAX + 1],
                          char what[KILN_REGISTRY_NAME_MAX + 1], bool *is_version) {
    KILN_FAIL_IF(
        !p->ref || !p->trust || !p->out, KILN_ERR_USAGE,
        "pull needs a NAME@CHANNEL or NAME@VERSION, a trust policy and an output directory");
    if (p->exact_version) {
        KILN_FAIL_IF(!reg_ref_split(p->ref, model, what), KILN_ERR_USAGE,
                     "'%s' is not NAME@VERSION", p->ref);
        *is_version = true;
        KILN_TRY(kiln_registry_check_name("model", model));
        KILN_TRY(reg_check_version_chars(what));
    } else {
        KILN_TRY(kiln_registry_ref_parse(p->ref, model, what, is_version));
    }
    KILN_FAIL_IF(*is_version && (p->channel_only || p->record), KILN_ERR_USAGE,
                 "'%s' names a version ('%s' begins with a digit or with 'v' and a digit), and "
                 "this pull takes a channel only",
                 p->ref, what);
    return KILN_OK;
}

kiln_err kiln_registry_pull(const kiln_registry_client_opts *c, const kiln_registry_pull_opts *p,
                            kiln_registry_pulled *res) {
    memset(res, 0, sizeof *res);
    char model[KILN_REGISTRY_NAME_MAX + 1], what[KILN_REGISTRY_NAME_MAX + 1];
    bool is_version;
    KILN_TRY(pull_args(p, model, what, &is_version));
    KILN_TRY(kiln_archive_dir_replaceable(p->out, "a pull"));
    KILN_TRY(reg_client_init(c));
    /* The whole pull has a deadline (one the caller's operation started is kept). */
    kiln_registry_client_opts one = *c;
    if (!one.until_ns) reg_deadline_start(&one, 1);
    /* Step 0: the trust policy, walked from p->trust through the versions this client
     * accepted before and those the registry has since (trustwalk.c). */
    kiln_sign_trust *trust = NULL;
    KILN_TRY(kiln_registry_trust_walk(&one, p->trust, p->state, NULL, NULL, &trust));
    kiln_err rc = reg_pull_with_trust(&one, p, trust, res);
    kiln_sign_trust_free(trust);
    return rc;
}

/* One pull, from its arguments to its cleanup: what reg_pull_with_trust's steps hand on. */
typedef struct pull {
    const kiln_registry_client_opts *c;
    const kiln_registry_pull_opts *p;
    const kiln_sign_trust *trust;
    kiln_registry_pulled *res;
    char what[KILN_REGISTRY_NAME_MAX + 1]; /* X of NAME@X: a channel, or a version */
    bool is_version, by_channel;
    char *state;                  /* the state directory */
    char *state_dir, *state_file; /* a channel's: STATE/channels/MODEL, .../CHANNEL.json */
    char *record;                 /* the channel record as served (by_channel) */
    size_t record_len;
    reg_record rec;           /* ... and accepted */
    json_t *ver;              /* the registry's JSON of the version */
    const char *digest, *sig; /* in ver: "sha256:<hex>", the archive's signature file */
    char hex[KILN_SHA256_HEX];
    uint64_t size;           /* the archive's, as the registry declares it */
    kiln_manifest *signed_m; /* the manifest the release keys signed, when established */
    char label[200], sig_label[240];
    char *parent, *tmp, *staged; /* out's parent; the private directory beside out; its model/ */
    int tmp_fd;                  /* tmp, flock'd while the pull runs (sweep_pulls) */
    char *dl_dir, *partial, *lock_path; /* STATE/downloads; the archive's .partial and .lock */
    int lock_fd;
    reg_stream_result sr; /* what the download's follower found */
} pull;

/* Steps 1-3 by a channel: its record (served, or pinned by the caller: the newest of several
 * registries, failover.c) accepted against this client's state: signatures, seq, expiry. By a
 * version: its name only. */
static kiln_err pull_record(pull *u) {
    kiln_registry_pulled *res = u->res;
    if (u->is_version) {
        snprintf(res->version, sizeof res->version, "%s", u->what);
        return KILN_OK;
    }
    /* A channel or a version, as the name reads (kiln_registry_looks_like_version): a
     * registry without the channel is a failure, never a reason to look for a version of
     * that name (which would need only a release signature, not the channel's promote
     * keys). */
    u->state_dir = kiln_asprintf("%s/channels/%s", u->state, res->model);
    u->state_file = u->state_dir ? kiln_asprintf("%s/%s.json", u->state_dir, u->what) : NULL;
    KILN_FAIL_IF(!u->state_file, KILN_ERR_NOMEM, "out of memory");
    int64_t last;
    bool known;
    KILN_TRY(reg_channel_state(u->state, res->model, u->what, &last, &known));
    kiln_err rc;
    if (u->p->record) {
        u->record = kiln_malloc(u->p->record_len + 1);
        if (u->record) {
            memcpy(u->record, u->p->record, u->p->record_len);
            u->record[u->p->record_len] = 0;
        }
        u->record_len = u->p->record_len;
        rc = u->record ? KILN_OK : KILN_ERR_NOMEM;
    } else {
        rc = kiln_registry_get_channel(u->c, res->model, u->what, &u->record, &u->record_len);
    }
    if (rc == KILN_ERR_NOTFOUND) return reg_channel_missing(u->c, 1, u->state, res->model, u->what);
    KILN_TRY(rc);
    u->by_channel = true;
    KILN_TRY(reg_record_accept(u->trust, u->record, u->record_len, res->model, u->what, last, known,
                               &u->rec, NULL));
    KILN_TRY(reg_record_fork_check(u->state, res->model, u->what, &u->rec, u->record,
                                   u->record_len));
    snprintf(res->channel, sizeof res->channel, "%s", u->what);
    snprintf(res->version, sizeof res->version, "%s", u->rec.version);
    res->seq = u->rec.seq;
    return KILN_OK;
}

/* A channel whose policy asks for reproduction records (reproduced_by): the version's, from the
 * registry, verified here under this client's policy; too few is a refusal. */
static kiln_err pull_repro(pull *u) {
    const char *const *keys;
    size_t nkeys;
    if (!kiln_sign_trust_reproduced_by(u->trust, u->what, &keys, &nkeys)) return KILN_OK;
    char *path = kiln_asprintf("/v1/models/%s/versions/%s/reproductions", u->res->model,
                               u->res->version);
    KILN_FAIL_IF(!path, KILN_ERR_NOMEM, "out of memory");
    json_t *j = NULL;
    kiln_err rc = kiln_registry_get_json(u->c, path, &j);
    free(path);
    if (rc == KILN_ERR_NOTFOUND) { /* a registry from before reproduction records: none */
        kiln_errclear();
        rc = KILN_OK;
    }
    if (!rc)
        rc = reg_repro_required(u->trust, u->what, json_object_get(j, "reproductions"),
                                u->res->model, u->res->version, u->digest, "refusing the pull");
    json_decref(j);
    return rc;
}

/* The registry's record of the version: digest, size and signature, the digest the one the
 * channel record names (or, by version, not one the policy withdrew). */
static kiln_err pull_version(pull *u) {
    kiln_registry_pulled *res = u->res;
    /* A signed record may name a version stored before the naming rule: its characters only. */
    KILN_TRY(reg_check_version_chars(res->version));
    char *vpath = kiln_asprintf("/v1/models/%s/versions/%s", res->model, res->version);
    KILN_FAIL_IF(!vpath, KILN_ERR_NOMEM, "out of memory");
    kiln_err rc = kiln_registry_get_json(u->c, vpath, &u->ver);
    free(vpath);
    /* The channel is there: its signed record names a version the registry lacks. Not "not
     * found" (a release would read that as an empty baseline channel). */
    KILN_FAIL_IF(rc == KILN_ERR_NOTFOUND && u->by_channel, KILN_ERR_VERIFY,
                 "the channel record of %s/%s (seq %lld) names %s@%s, which the registry "
                 "does not hold; refusing",
                 res->model, u->what, (long long)u->rec.seq, res->model, res->version);
    KILN_TRY(rc);
    u->digest = json_string_value(json_object_get(u->ver, "digest"));
    u->sig = json_string_value(json_object_get(u->ver, "signature"));
    json_t *jsize = json_object_get(u->ver, "size");
    KILN_FAIL_IF(!reg_digest_hex(u->digest, u->hex) || !u->sig || !json_is_integer(jsize) ||
                     json_integer_value(jsize) < 0,
                 KILN_ERR_FORMAT, "registry's record of %s@%s lacks a digest, size or signature",
                 res->model, res->version);
    KILN_FAIL_IF(u->by_channel && strcmp(u->digest, u->rec.digest) != 0, KILN_ERR_VERIFY,
                 "registry holds %s@%s as %s, but the signed channel record says %s; refusing",
                 res->model, res->version, u->digest, u->rec.digest);
    char name[160];
    snprintf(name, sizeof name, "%s@%s", res->model, res->version);
    /* a channel's record was checked for it in reg_record_accept */
    if (!u->by_channel) KILN_TRY(reg_withdrawn(u->trust, u->digest, name));
    if (u->by_channel) KILN_TRY(pull_repro(u));
    u->size = (uint64_t)json_integer_value(jsize);
    snprintf(res->digest, sizeof res->digest, "%s", u->digest);
    res->size = u->size;
    /* 4a: the declared size, before a byte is downloaded: within the client's maximum, and
     * within what an archive of the manifest the release keys signed can be (the registry's
     * copy of the manifest, checked against the archive's signatures). */
    u->signed_m = reg_signed_manifest(u->ver, u->sig, u->trust, res->model, res->version);
    char sized[200];
    snprintf(sized, sizeof sized, "%s@%s", res->model, res->version);
    KILN_TRY(reg_size_accept(u->c, u->size,
                             u->signed_m ? reg_archive_bound(u->signed_m) : UINT64_MAX, sized));
    snprintf(u->label, sizeof u->label, "%s@%s (%s)", res->model, res->version, u->digest);
    snprintf(u->sig_label, sizeof u->sig_label, "signature of %s@%s", res->model, res->version);
    return KILN_OK;
}

/* The private directory beside out that the archive is unpacked into (as it lands, when the
 * signed manifest is known; after the checks otherwise), renamed to out only once every check
 * passed; locked while the pull runs. */
static kiln_err pull_stage(pull *u) {
    const char *out = u->p->out;
    u->parent = kiln_dirname(out);
    const char *base = strrchr(out, '/') ? strrchr(out, '/') + 1 : out;
    char *tmp = u->parent ? kiln_asprintf("%s/.%s.pull-XXXXXX", u->parent, base) : NULL;
    KILN_FAIL_IF(!tmp, KILN_ERR_NOMEM, "out of memory");
    kiln_err rc = kiln_mkdir_p(u->parent);
    if (rc) {
        free(tmp);
        return rc;
    }
    sweep_pulls(u->parent, base);
    if (!mkdtemp(tmp)) {
        rc = kiln_fail_errno(KILN_ERR_IO, "cannot create a temporary directory next to '%s'", out);
        free(tmp);
        return rc;
    }
    u->tmp = tmp; /* removed by pull_end on failure */
    u->tmp_fd = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    KILN_FAIL_IF(u->tmp_fd < 0 || flock(u->tmp_fd, LOCK_EX | LOCK_NB) != 0, KILN_ERR_IO,
                 "cannot lock '%s': %s", tmp, strerror(errno));
    u->staged = kiln_path_join(tmp, "model");
    KILN_FAIL_IF(!u->staged, KILN_ERR_NOMEM, "out of memory");
    return KILN_OK;
}

/* Step 4: the archive's size and digest, reading no more than declared; its SHA-256 and the
 * signatures' BLAKE2b-512 from the bytes as they land (pullstream.c), and, with the signed
 * manifest, the unpack too, each file checked against it as it is written. A download that
 * resumed a bad prefix is run once more from the start. */
static kiln_err pull_download(pull *u) {
    u->dl_dir = kiln_path_join(u->state, "downloads");
    KILN_FAIL_IF(!u->dl_dir, KILN_ERR_NOMEM, "out of memory");
    KILN_TRY(kiln_mkdir_p(u->dl_dir));
    u->partial = kiln_asprintf("%s/%s.partial", u->dl_dir, u->hex);
    u->lock_path = kiln_asprintf("%s/%s.lock", u->dl_dir, u->hex);
    KILN_FAIL_IF(!u->partial || !u->lock_path, KILN_ERR_NOMEM, "out of memory");
    KILN_TRY(lock_download(u->lock_path, true, &u->lock_fd));
    sweep_downloads(u->dl_dir);
    reg_stream_result *sr = &u->sr;
    for (int pass = 0;; pass++) {
        uint64_t t0 = kiln_now_ns();
        reg_follow *f = NULL;
        reg_stream *st = NULL;
        kiln_err rc = reg_follow_new(&f);
        if (!rc)
            rc = reg_stream_start(f, u->partial, u->size, u->label, u->staged, u->signed_m, &st);
        if (!rc) rc = reg_download_follow(u->c, u->hex, u->size, u->partial, f);
        reg_stream_join(st, sr);
        reg_follow_free(f);
        KILN_TRY(rc);
        uint64_t t1 = kiln_now_ns();
        pull_phase("download", t0, t1, u->size);
        kiln_debug("pull: this thread (the download) has used %.3f s CPU", kiln_thread_cpu_s());
        uint8_t h[KILN_SHA256_BYTES];
        char got[KILN_SHA256_HEX];
        if (sr->hashed) {
            memcpy(h, sr->sha256, sizeof h);
        } else {
            kiln_debug("pull: the download was not hashed as it landed; hashing '%s'", u->partial);
            KILN_TRY(kiln_sha256_file(u->partial, h));
            pull_phase("archive sha256", t1, kiln_now_ns(), u->size);
        }
        kiln_hex(h, sizeof h, got);
        if (!strcmp(got, u->hex)) return KILN_OK;
        kiln_manifest_free(sr->manifest);
        sr->manifest = NULL;
        if (sr->unpacked) reg_rmtree(u->staged);
        unlink(u->partial);
        /* A resumed download may have kept a bad prefix: once more from the start. */
        KILN_FAIL_IF(pass > 0, KILN_ERR_VERIFY,
                     "archive of %s@%s hashes to sha256:%s, not %s; refusing", u->res->model,
                     u->res->version, got, u->digest);
    }
}

/* Steps 5-8, by sign/ (what `kiln verify` runs): every signature block over the archive's
 * BLAKE2b-512 by a release key of this client's policy, each trusted comment naming the
 * archive's own manifest (the manifest's signature) and its validation verdict, the policy's
 * release_threshold and accept_unvalidated; and every file checked against that manifest.
 * When the unpack ran as the bytes landed, the signatures are checked over the prehash with
 * the manifest it found (byte for byte the signed one); otherwise (no signed manifest to hold
 * it to, a download that started over, an unpack that failed: its own words come after the
 * signatures' verdict) the strict path, from the file: signatures first, then the secure
 * unpack. */
static kiln_err pull_verify(pull *u) {
    const reg_stream_result *sr = &u->sr;
    kiln_registry_pulled *res = u->res;
    kiln_sign_archive_report rep;
    uint64_t t = kiln_now_ns();
    kiln_debug("pull: %s", sr->unpacked ? "hashed and unpacked as it landed"
                           : sr->hashed ? "hashed as it landed; unpacking after the signatures"
                                        : "checking from the file");
    kiln_err rc;
    size_t sig_len = strlen(u->sig);
    if (sr->unpacked) {
        rc = kiln_sign_verify_prehashed_sigs(sr->blake2b, sr->manifest, u->partial, u->sig, sig_len,
                                             u->sig_label, u->trust, &rep);
        rep.files_checked = rc == KILN_OK; /* by the unpack, against the manifest signed */
    } else if (sr->hashed) {
        rc = kiln_sign_verify_archive_prehashed(u->partial, sr->blake2b, u->sig, sig_len,
                                                u->sig_label, u->trust, u->staged, &rep);
    } else {
        rc = kiln_sign_verify_archive(u->partial, u->sig, sig_len, u->sig_label, u->trust,
                                      u->staged, &rep);
    }
    kiln_manifest_free(u->sr.manifest);
    u->sr.manifest = NULL;
    if (rc == KILN_ERR_FORMAT) rc = KILN_ERR_VERIFY;
    if (rc) return kiln_errprefix(rc, "%s: ", u->label);
    /* The signed manifest must be the one asked for, not another version's. */
    KILN_FAIL_IF(strcmp(rep.info.model, res->model) || strcmp(rep.info.version, res->version),
                 KILN_ERR_VERIFY, "%s: the signed manifest is %s@%s; refusing", u->label,
                 rep.info.model, rep.info.version);
    pull_phase("signatures, manifest and file digests", t, kiln_now_ns(), u->size);
    reg_signers_text(&rep, res->signed_by, sizeof res->signed_by);
    return KILN_OK;
}

/* The checked directory renamed to out; by a channel, the state of what was accepted. */
static kiln_err pull_install(pull *u) {
    uint64_t t = kiln_now_ns();
    KILN_TRY(install_dir(u->staged, u->p->out));
    reg_rmtree(u->tmp);
    free(u->tmp);
    u->tmp = NULL;
    KILN_TRY(kiln_fsync_dir(u->parent));
    pull_phase("install", t, kiln_now_ns(), 0);
    if (u->by_channel) {
        /* The accepted seq (anti-rollback), and the evidence for a service that must start
         * while no registry answers: the record and the archive's signatures, as served
         * (reg_installed_verify checks an installed directory against them). */
        const reg_record *rec = &u->rec;
        json_t *st =
            json_pack("{s:I, s:s, s:s, s:I, s:s%, s:s}", "seq", (json_int_t)rec->seq, "version",
                      rec->version, "digest", rec->digest, "expires", (json_int_t)rec->expires,
                      "record", u->record, u->record_len, "signature", u->sig);
        KILN_FAIL_IF(!st, KILN_ERR_NOMEM, "out of memory");
        bool defer = u->p->defer_state;
        char *pending = defer ? kiln_asprintf("%s.pending", u->state_file) : NULL;
        kiln_err rc = defer && !pending ? KILN_ERR_NOMEM : kiln_mkdir_p(u->state_dir);
        if (!rc) rc = kiln_json_write_file(pending ? pending : u->state_file, st);
        free(pending);
        json_decref(st);
        KILN_TRY(rc);
    }
    unlink(u->partial);
    return KILN_OK;
}

/* Whatever the outcome: a failed pull (a check, an error, a timeout, a cancel) leaves neither
 * its private directory nor a download behind; only a killed one does (sweep_pulls,
 * sweep_downloads). */
static kiln_err pull_end(pull *u, kiln_err rc) {
    if (rc && u->tmp) reg_rmtree(u->tmp);
    if (rc && u->lock_fd >= 0) unlink(u->partial);
    unlock_download(u->lock_path, u->lock_fd);
    if (u->tmp_fd >= 0) close(u->tmp_fd);
    kiln_manifest_free(u->sr.manifest);
    kiln_manifest_free(u->signed_m);
    json_decref(u->ver);
    free(u->lock_path), free(u->staged), free(u->state), free(u->state_file);
    free(u->state_dir), free(u->record), free(u->dl_dir), free(u->partial), free(u->parent);
    free(u->tmp);
    return rc;
}

kiln_err reg_pull_with_trust(const kiln_registry_client_opts *c, const kiln_registry_pull_opts *p,
                             const kiln_sign_trust *trust, kiln_registry_pulled *res) {
    memset(res, 0, sizeof *res);
    pull u = {.c = c, .p = p, .trust = trust, .res = res, .tmp_fd = -1, .lock_fd = -1};
    KILN_TRY(pull_args(p, res->model, u.what, &u.is_version));
    /* Before anything is fetched: DIR is new, empty or a model directory kiln installed. */
    KILN_TRY(kiln_archive_dir_replaceable(p->out, "a pull"));
    KILN_TRY(reg_client_init(c));
    u.state = p->state ? kiln_strdup(p->state) : reg_default_state();
    kiln_err rc = u.state ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!rc) rc = pull_record(&u);
    if (!rc) rc = pull_version(&u);
    if (!rc) rc = pull_stage(&u);
    if (!rc) rc = pull_download(&u);
    if (!rc) rc = pull_verify(&u);
    if (!rc) rc = pull_install(&u);
    return pull_end(&u, rc);
}

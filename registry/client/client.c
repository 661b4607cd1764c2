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
        const char *at = strchr(p->ref, '@');
        KILN_FAIL_IF(!at || at == p->ref || (size_t)(at - p->ref) > KILN_REGISTRY_NAME_MAX ||
                         strlen(at + 1) > KILN_REGISTRY_NAME_MAX,
                     KILN_ERR_USAGE, "'%s' is not NAME@VERSION", p->ref);
        snprintf(model, KILN_REGISTRY_NAME_MAX + 1, "%.*s", (int)(at - p->ref), p->ref);
        snprintf(what, KILN_REGISTRY_NAME_MAX + 1, "%s", at + 1);
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
     * accepted before and those the registry has since (registry/trustchain.c). */
    kiln_sign_trust *trust = NULL;
    KILN_TRY(kiln_registry_trust_walk(&one, p->trust, p->state, NULL, NULL, &trust));
    kiln_err rc = reg_pull_with_trust(&one, p, trust, res);
    kiln_sign_trust_free(trust);
    return rc;
}

kiln_err reg_pull_with_trust(const kiln_registry_client_opts *c, const kiln_registry_pull_opts *p,
                             const kiln_sign_trust *trust, kiln_registry_pulled *res) {
    memset(res, 0, sizeof *res);
    char what[KILN_REGISTRY_NAME_MAX + 1];
    bool is_version;
    KILN_TRY(pull_args(p, res->model, what, &is_version));
    /* Before anything is fetched: DIR is new, empty or a model directory kiln installed. */
    KILN_TRY(kiln_archive_dir_replaceable(p->out, "a pull"));
    KILN_TRY(reg_client_init(c));

    kiln_err rc = KILN_OK;
    char *state = NULL, *state_file = NULL, *state_dir = NULL, *record = NULL, *vpath = NULL,
         *dl_dir = NULL, *partial = NULL, *parent = NULL, *tmp = NULL;
    size_t record_len = 0;
    json_t *ver = NULL;
    bool by_channel = false;
    reg_record rec;
    memset(&rec, 0, sizeof rec);
    char *staged = NULL, *lock_path = NULL;
    int lock_fd = -1;
    kiln_manifest *signed_m = NULL;
    int tmp_fd = -1; /* flock'd while the pull runs (sweep_pulls) */

    state = p->state ? kiln_strdup(p->state) : reg_default_state();
    KILN_CHECK_IF(rc, out, !state, KILN_ERR_NOMEM, "out of memory");

    /* A channel or a version, as the name reads (kiln_registry_looks_like_version): a
     * registry without the channel is a failure, never a reason to look for a version of
     * that name (which would need only a release signature, not the channel's promote
     * keys). */
    if (!is_version) {
        state_dir = kiln_asprintf("%s/channels/%s", state, res->model);
        state_file = state_dir ? kiln_asprintf("%s/%s.json", state_dir, what) : NULL;
        KILN_CHECK_IF(rc, out, !state_file, KILN_ERR_NOMEM, "out of memory");
        int64_t last;
        bool known;
        KILN_CHECK(rc, out, reg_channel_state(state, res->model, what, &last, &known));
        if (p->record) { /* pinned: the newest record of several registries (failover.c) */
            record = kiln_malloc(p->record_len + 1);
            if (record) {
                memcpy(record, p->record, p->record_len);
                record[p->record_len] = 0;
            }
            record_len = p->record_len;
            rc = record ? KILN_OK : KILN_ERR_NOMEM;
        } else {
            rc = kiln_registry_get_channel(c, res->model, what, &record, &record_len);
        }
        if (rc == KILN_ERR_NOTFOUND) {
            rc = reg_channel_missing(state, res->model, what, false);
            goto out;
        }
        if (rc) goto out;
        by_channel = true;
        /* 1-3: signatures, seq, expiry. */
        KILN_CHECK(rc, out,
                   reg_record_accept(trust, record, record_len, res->model, what, last, known, &rec,
                                     NULL));
        snprintf(res->channel, sizeof res->channel, "%s", what);
        snprintf(res->version, sizeof res->version, "%s", rec.version);
        res->seq = rec.seq;
    } else {
        snprintf(res->version, sizeof res->version, "%s", what);
    }
    /* A signed record may name a version stored before the naming rule: its characters only. */
    KILN_CHECK(rc, out, reg_check_version_chars(res->version));
    vpath = kiln_asprintf("/v1/models/%s/versions/%s", res->model, res->version);
    KILN_CHECK_IF(rc, out, !vpath, KILN_ERR_NOMEM, "out of memory");
    rc = kiln_registry_get_json(c, vpath, &ver);
    if (rc == KILN_ERR_NOTFOUND && by_channel) {
        /* The channel is there: its signed record names a version the registry lacks. Not
         * "not found" (a release would read that as an empty baseline channel). */
        rc = kiln_fail(KILN_ERR_VERIFY,
                       "the channel record of %s/%s (seq %lld) names %s@%s, which the registry "
                       "does not hold; refusing",
                       res->model, what, (long long)rec.seq, res->model, res->version);
        goto out;
    }
    if (rc) goto out;
    const char *digest = json_string_value(json_object_get(ver, "digest")),
               *sig = json_string_value(json_object_get(ver, "signature"));
    json_t *jsize = json_object_get(ver, "size");
    char hex[KILN_SHA256_HEX];
    KILN_CHECK_IF(rc, out,
                  !reg_digest_hex(digest, hex) || !sig || !json_is_integer(jsize) ||
                      json_integer_value(jsize) < 0,
                  KILN_ERR_FORMAT, "registry's record of %s@%s lacks a digest, size or signature",
                  res->model, res->version);
    KILN_CHECK_IF(rc, out, by_channel && strcmp(digest, rec.digest) != 0, KILN_ERR_VERIFY,
                  "registry holds %s@%s as %s, but the signed channel record says %s; refusing",
                  res->model, res->version, digest, rec.digest);
    if (!by_channel) { /* a channel's record was checked for it in reg_record_accept */
        char what[160];
        snprintf(what, sizeof what, "%s@%s", res->model, res->version);
        KILN_CHECK(rc, out, reg_withdrawn(trust, digest, what));
    }
    uint64_t size = (uint64_t)json_integer_value(jsize);
    snprintf(res->digest, sizeof res->digest, "%s", digest);
    res->size = size;

    /* 4a: the declared size, before a byte is downloaded: within the client's maximum, and
     * within what an archive of the manifest the release keys signed can be (the registry's
     * copy of the manifest, checked against the archive's signatures). */
    signed_m = reg_signed_manifest(ver, sig, trust, res->model, res->version);
    {
        char what[200];
        snprintf(what, sizeof what, "%s@%s", res->model, res->version);
        KILN_CHECK(
            rc, out,
            reg_size_accept(c, size, signed_m ? reg_archive_bound(signed_m) : UINT64_MAX, what));
    }
    char label[200];
    snprintf(label, sizeof label, "%s@%s (%s)", res->model, res->version, digest);
    char sig_label[240];
    snprintf(sig_label, sizeof sig_label, "signature of %s@%s", res->model, res->version);
    /* The private directory beside out that the archive is unpacked into (as it lands, when
     * the signed manifest is known; after the checks otherwise), renamed to out only once
     * every check passed. */
    parent = kiln_dirname(p->out);
    const char *base = strrchr(p->out, '/') ? strrchr(p->out, '/') + 1 : p->out;
    tmp = parent ? kiln_asprintf("%s/.%s.pull-XXXXXX", parent, base) : NULL;
    KILN_CHECK_IF(rc, out, !tmp, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_mkdir_p(parent));
    sweep_pulls(parent, base);
    if (!mkdtemp(tmp)) {
        rc = kiln_fail_errno(KILN_ERR_IO, "cannot create a temporary directory next to '%s'",
                             p->out);
        free(tmp);
        tmp = NULL;
        goto out;
    }
    tmp_fd = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    KILN_CHECK_IF(rc, out, tmp_fd < 0 || flock(tmp_fd, LOCK_EX | LOCK_NB) != 0, KILN_ERR_IO,
                  "cannot lock '%s': %s", tmp, strerror(errno));
    staged = kiln_path_join(tmp, "model");
    KILN_CHECK_IF(rc, out, !staged, KILN_ERR_NOMEM, "out of memory");
    /* 4: the archive's size and digest, reading no more than declared; its SHA-256 and the
     * signatures' BLAKE2b-512 from the bytes as they land (stream.c), and, with the signed
     * manifest, the unpack too, each file checked against it as it is written. */
    dl_dir = kiln_path_join(state, "downloads");
    KILN_CHECK_IF(rc, out, !dl_dir, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_mkdir_p(dl_dir));
    partial = kiln_asprintf("%s/%s.partial", dl_dir, hex);
    lock_path = kiln_asprintf("%s/%s.lock", dl_dir, hex);
    KILN_CHECK_IF(rc, out, !partial || !lock_path, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, lock_download(lock_path, true, &lock_fd));
    sweep_downloads(dl_dir);
    reg_stream_result sr;
    memset(&sr, 0, sizeof sr);
    for (int pass = 0;; pass++) {
        uint64_t t0 = kiln_now_ns();
        reg_follow *f = NULL;
        reg_stream *st = NULL;
        rc = reg_follow_new(&f);
        if (!rc) rc = reg_stream_start(f, partial, size, label, staged, signed_m, &st);
        if (!rc) rc = reg_download_follow(c, hex, size, partial, f);
        reg_stream_join(st, &sr);
        reg_follow_free(f);
        if (rc) goto out;
        uint64_t t1 = kiln_now_ns();
        pull_phase("download", t0, t1, size);
        kiln_debug("pull: this thread (the download) has used %.3f s CPU", kiln_thread_cpu_s());
        uint8_t h[KILN_SHA256_BYTES];
        char got[KILN_SHA256_HEX];
        if (sr.hashed) {
            memcpy(h, sr.sha256, sizeof h);
        } else {
            kiln_debug("pull: the download was not hashed as it landed; hashing '%s'", partial);
            KILN_CHECK(rc, out, kiln_sha256_file(partial, h));
            pull_phase("archive sha256", t1, kiln_now_ns(), size);
        }
        kiln_hex(h, sizeof h, got);
        if (!strcmp(got, hex)) break;
        kiln_manifest_free(sr.manifest);
        sr.manifest = NULL;
        if (sr.unpacked) reg_rmtree(staged);
        unlink(partial);
        /* A resumed download may have kept a bad prefix: once more from the start. */
        KILN_CHECK_IF(rc, out, pass > 0, KILN_ERR_VERIFY,
                      "archive of %s@%s hashes to sha256:%s, not %s; refusing", res->model,
                      res->version, got, digest);
    }
    /* 5-8, by sign/ (what `kiln verify` runs): every signature block over the archive's
     * BLAKE2b-512 by a release key of this client's policy, each trusted comment naming the
     * archive's own manifest (the manifest's signature) and its validation verdict, the
     * policy's release_threshold and accept_unvalidated; and every file checked against
     * that manifest. When the unpack ran as the bytes landed, the signatures are checked
     * over the prehash with the manifest it found (byte for byte the signed one); otherwise
     * (no signed manifest to hold it to, a download that started over, an unpack that
     * failed: its own words come after the signatures' verdict) the strict path, from the
     * file: signatures first, then the secure unpack. */
    kiln_sign_archive_report rep;
    uint64_t t = kiln_now_ns();
    kiln_debug("pull: %s", sr.unpacked ? "hashed and unpacked as it landed"
                           : sr.hashed ? "hashed as it landed; unpacking after the signatures"
                                       : "checking from the file");
    if (sr.unpacked) {
        rc = kiln_sign_verify_prehashed_sigs(sr.blake2b, sr.manifest, partial, sig, strlen(sig),
                                             sig_label, trust, &rep);
        rep.files_checked = rc == KILN_OK; /* by the unpack, against the manifest signed */
    }
    else if (sr.hashed)
        rc = kiln_sign_verify_archive_prehashed(partial, sr.blake2b, sig, strlen(sig), sig_label,
                                                trust, staged, &rep);
    else
        rc = kiln_sign_verify_archive(partial, sig, strlen(sig), sig_label, trust, staged, &rep);
    kiln_manifest_free(sr.manifest);
    sr.manifest = NULL;
    if (rc == KILN_ERR_FORMAT) rc = KILN_ERR_VERIFY;
    if (rc) {
        rc = kiln_errprefix(rc, "%s: ", label);
        goto out;
    }
    /* The signed manifest must be the one asked for, not another version's. */
    KILN_CHECK_IF(rc, out,
                  strcmp(rep.info.model, res->model) || strcmp(rep.info.version, res->version),
                  KILN_ERR_VERIFY, "%s: the signed manifest is %s@%s; refusing", label,
                  rep.info.model, rep.info.version);
    pull_phase("signatures, manifest and file digests", t, kiln_now_ns(), size);
    reg_signers_text(&rep, res->signed_by, sizeof res->signed_by);
    t = kiln_now_ns();
    KILN_CHECK(rc, out, install_dir(staged, p->out));
    reg_rmtree(tmp);
    free(tmp);
    tmp = NULL;
    KILN_CHECK(rc, out, kiln_fsync_dir(parent));
    pull_phase("install", t, kiln_now_ns(), 0);
    if (by_channel) {
        /* The accepted seq (anti-rollback), and the evidence for a service that must start
         * while no registry answers: the record and the archive's signatures, as served
         * (reg_installed_verify checks an installed directory against them). */
        json_t *st =
            json_pack("{s:I, s:s, s:s, s:I, s:s%, s:s}", "seq", (json_int_t)rec.seq, "version",
                      rec.version, "digest", rec.digest, "expires", (json_int_t)rec.expires,
                      "record", record, record_len, "signature", sig);
        KILN_CHECK_IF(rc, out, !st, KILN_ERR_NOMEM, "out of memory");
        char *pending = p->defer_state ? kiln_asprintf("%s.pending", state_file) : NULL;
        rc = p->defer_state && !pending ? KILN_ERR_NOMEM : kiln_mkdir_p(state_dir);
        if (!rc) rc = kiln_json_write_file(pending ? pending : state_file, st);
        free(pending);
        json_decref(st);
        if (rc) goto out;
    }
    unlink(partial);
out:
    if (rc && tmp) reg_rmtree(tmp);
    /* A failed pull (a check, an error, a timeout, a cancel) leaves no download behind; only a
     * killed one does (sweep_downloads). */
    if (rc && lock_fd >= 0) unlink(partial);
    unlock_download(lock_path, lock_fd);
    if (tmp_fd >= 0) close(tmp_fd);
    kiln_manifest_free(signed_m);
    free(lock_path);
    free(staged);
    json_decref(ver);
    free(state);
    free(state_file);
    free(state_dir);
    free(record);
    free(vpath);
    free(dl_dir);
    free(partial);
    free(parent);
    free(tmp);
    return rc;
}

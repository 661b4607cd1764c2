/* mirror.c - kiln registry mirror: copy a primary registry into a store of its own, checking
 * everything as the server checks what it is given and as clients check what they pull, so
 * that the copy can be served read-only and clients can fail over to it (docs/registry.md,
 * "Mirrors"). The primary is trusted for nothing: trust versions are walked from the
 * mirror's own policy, archives are hashed and their signatures verified, channel records
 * verified; what does not verify is reported and not copied. What is copied goes in with
 * the server's own functions (reg_version_insert, reg_record_insert, reg_trust_store), the
 * blob first, as an upload's. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "export.h"
#include "server_int.h"

/* ---- the store's marks (the meta table) ---- */

/* *value: the row's value (caller frees) or NULL when there is none (or no meta table: a
 * store from before it, opened without being brought up to date). */
static kiln_err meta_get(sqlite3 *db, const char *key, char **value) {
    *value = NULL;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key = ?1", -1, &st, NULL) !=
        SQLITE_OK) {
        bool no_table = strstr(sqlite3_errmsg(db), "no such table") != NULL;
        return no_table ? KILN_OK : reg_db_fail(db, "reading the store's meta table");
    }
    sqlite3_bind_text(st, 1, key, -1, SQLITE_TRANSIENT);
    kiln_err rc = KILN_OK;
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) {
        *value = kiln_strdup((const char *)sqlite3_column_text(st, 0));
        if (!*value) rc = KILN_ERR_NOMEM;
    } else if (r != SQLITE_DONE) {
        rc = reg_db_fail(db, "reading the store's meta table");
    }
    sqlite3_finalize(st);
    return rc;
}

static kiln_err meta_set(sqlite3 *db, const char *key, const char *value) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO meta(key, value) VALUES(?1, ?2)", -1, &st,
                           NULL) != SQLITE_OK)
        return reg_db_fail(db, "writing the store's meta table");
    sqlite3_bind_text(st, 1, key, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, value, -1, SQLITE_TRANSIENT);
    int r = sqlite3_step(st);
    sqlite3_finalize(st);
    return r == SQLITE_DONE ? KILN_OK : reg_db_fail(db, "writing the store's meta table");
}

static int64_t meta_int(sqlite3 *db, const char *key) {
    char *v = NULL;
    int64_t n = 0;
    if (meta_get(db, key, &v) == KILN_OK && v) n = strtoll(v, NULL, 10);
    free(v);
    return n;
}

kiln_err reg_mirror_status_read(sqlite3 *db, reg_mirror_status *out) {
    memset(out, 0, sizeof *out);
    KILN_TRY(meta_get(db, "mirror_of", &out->of));
    if (!out->of) return KILN_OK;
    out->last_sync = meta_int(db, "mirror_last_sync");
    out->last_attempt = meta_int(db, "mirror_last_attempt");
    out->problems = meta_int(db, "mirror_last_problems");
    return KILN_OK;
}

void reg_mirror_status_release(reg_mirror_status *s) {
    free(s->of);
    s->of = NULL;
}

void reg_ui_mirror_line(sqlite3 *db, int64_t now, kiln_web_buf *b) {
    reg_mirror_status ms;
    if (reg_mirror_status_read(db, &ms) != KILN_OK || !ms.of) {
        kiln_errclear();
        reg_mirror_status_release(&ms);
        return;
    }
    char line[700];
    if (ms.last_sync)
        snprintf(line, sizeof line, "mirror of %s, synced %lld s ago (read-only: publish there)",
                 ms.of, (long long)(now - ms.last_sync));
    else
        snprintf(line, sizeof line, "mirror of %s, never synced (read-only: publish there)", ms.of);
    kiln_web_text(b, line); /* the URL is text like any other */
    reg_mirror_status_release(&ms);
}

/* The primary's URL as a mirror records it: without trailing slashes. Caller frees. */
static char *url_key(const char *url) {
    size_t n = strlen(url);
    while (n && url[n - 1] == '/')
        n--;
    return kiln_asprintf("%.*s", (int)n, url);
}

/* ---- which directories may become a mirror ---- */

/* A running `kiln registry serve` holds DIR/lock; looked at without making the file. */
static bool held_by_server(const char *root) {
    char *path = kiln_path_join(root, "lock");
    int fd = path ? open(path, O_RDWR | O_CLOEXEC) : -1;
    free(path);
    if (fd < 0) return false;
    bool held = flock(fd, LOCK_EX | LOCK_NB) != 0;
    close(fd);
    return held;
}

static int64_t count_rows(sqlite3 *db, const char *table) {
    char sql[96];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM %s", table);
    sqlite3_stmt *st = NULL;
    int64_t n = 0; /* a table the store does not have yet holds nothing */
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return n;
}

/* What a store holds that only a primary can have put there; 0 for a store with nothing
 * published in it (made by `token create`, say), which may become a mirror. */
static int64_t published_rows(sqlite3 *db, char *what, size_t len) {
    int64_t v = count_rows(db, "versions"), c = count_rows(db, "channel_records"),
            t = count_rows(db, "trust_versions");
    snprintf(what, len, "%lld version%s, %lld channel record%s, %lld trust version%s", (long long)v,
             v == 1 ? "" : "s", (long long)c, c == 1 ? "" : "s", (long long)t, t == 1 ? "" : "s");
    return v + c + t;
}

/* The directory a sync may write into, checked before anything is written: new or empty,
 * a mirror of url, or a store with nothing published that no server serves. *fresh: it
 * is not marked as a mirror yet. */
static kiln_err check_root(const char *root, const char *url, bool *fresh) {
    *fresh = true;
    kiln_dir_state ds = kiln_path_dir_state(root);
    if (ds == KILN_DIR_ABSENT || ds == KILN_DIR_EMPTY) return KILN_OK;
    KILN_FAIL_IF(ds == KILN_DIR_OTHER, KILN_ERR_USAGE,
                 "'%s' is not a directory (a mirror's store is one; give a new or empty "
                 "directory for a new mirror)",
                 root);
    char *dbpath = kiln_path_join(root, "registry.db");
    if (!dbpath) return KILN_ERR_NOMEM;
    bool store = kiln_path_exists(dbpath);
    free(dbpath);
    KILN_FAIL_IF(!store, KILN_ERR_USAGE,
                 "'%s' is not a registry store (no registry.db) and is not empty: give a "
                 "mirror's store, or a new or empty directory for a new mirror",
                 root);
    KILN_TRY(reg_store_check(root));
    sqlite3 *db = NULL;
    char *of = NULL, what[160];
    kiln_err rc = reg_db_connect(root, &db);
    if (!rc) rc = meta_get(db, "mirror_of", &of);
    int64_t published = rc ? 0 : published_rows(db, what, sizeof what);
    reg_db_close(db);
    KILN_TRY(rc);
    if (of) {
        *fresh = false;
        if (strcmp(of, url) != 0)
            rc = kiln_fail(KILN_ERR_USAGE,
                           "'%s' is a mirror of %s, not of %s: give that registry as --from, or "
                           "another directory for a mirror of %s",
                           root, of, url, url);
        free(of);
        return rc;
    }
    KILN_FAIL_IF(published > 0, KILN_ERR_USAGE,
                 "'%s' is a registry store that is not a mirror (a primary: it holds %s): a "
                 "mirror is made in a new or empty directory",
                 root, what);
    KILN_FAIL_IF(held_by_server(root), KILN_ERR_USAGE,
                 "'%s' is served by a running kiln registry serve as a primary: a mirror is made "
                 "in a new or empty directory, or in a store no server runs on",
                 root);
    return KILN_OK;
}

/* Mark the open store as a mirror of url: in one transaction with the check that it still
 * holds nothing published (a primary's store never becomes a mirror). */
static kiln_err mark(sqlite3 *db, const char *root, const char *url) {
    KILN_TRY(reg_db_exec(db, "BEGIN IMMEDIATE"));
    char *of = NULL, what[160];
    kiln_err rc = meta_get(db, "mirror_of", &of);
    if (!rc && of && strcmp(of, url) != 0)
        rc = kiln_fail(KILN_ERR_USAGE, "'%s' became a mirror of %s meanwhile", root, of);
    else if (!rc && !of && published_rows(db, what, sizeof what) > 0)
        rc = kiln_fail(KILN_ERR_USAGE, "'%s' holds %s meanwhile: not a new mirror", root, what);
    else if (!rc && !of)
        rc = meta_set(db, "mirror_of", url);
    free(of);
    if (!rc) rc = reg_db_exec(db, "COMMIT");
    if (rc) (void)reg_db_exec(db, "ROLLBACK");
    return rc;
}

/* ---- a sync ---- */

typedef struct mirror_run {
    const kiln_registry_mirror_opts *o;
    kiln_registry_client_opts c; /* the primary, its URL without trailing slashes */
    const char *root;
    sqlite3 *db;
    reg_trust_chain chain; /* the mirror's policy walked through the trust versions copied */
    kiln_registry_mirror_result *res;
    char reason[600]; /* the audit rows' "from URL" */
    pthread_mutex_t mu;         /* for what the versions in flight share: */
    struct mirror_job *oldest;  /* the one whose progress is reported */
    bool cancel;                /* the caller cancelled, or the sync stopped */
} mirror_run;

static void say(mirror_run *m, bool problem, const char *fmt, ...) KILN_PRINTF(3, 4);
static void say(mirror_run *m, bool problem, const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (problem) m->res->problems++;
    void (*cb)(void *, const char *) = problem ? m->o->on_problem : m->o->on_copied;
    if (cb) cb(m->o->ctx, line);
}

/* A failure that concerns one item (it did not verify, the primary refused or lacks it):
 * reported, and the sync goes on. Anything else (the primary unreachable, a disk or database
 * failure) stops the sync. */
static bool item_failure(kiln_err rc) {
    return rc == KILN_ERR_VERIFY || rc == KILN_ERR_FORMAT || rc == KILN_ERR_CONFLICT ||
           rc == KILN_ERR_NOTFOUND || rc == KILN_ERR_USAGE || rc == KILN_ERR_LIMIT;
}

static kiln_err get_json(mirror_run *m, const char *path, json_t **out) {
    m->res->requests++;
    return kiln_registry_get_json(&m->c, path, out);
}

/* Trust versions: the primary's above the newest the mirror holds, each accepted only as the
 * successor of the one before (as servers and clients walk them), stored with its audit
 * row. One that does not verify stops the walk there: the versions after it cannot be
 * checked. */
static kiln_err sync_trust(mirror_run *m) {
    for (;;) {
        const kiln_sign_trust *cur = m->chain.v[m->chain.n - 1];
        uint64_t v = kiln_sign_trust_version(cur) + 1;
        char path[64], label[700], *doc = NULL;
        size_t len = 0;
        snprintf(path, sizeof path, "/v1/trust/%llu", (unsigned long long)v);
        m->res->requests++;
        kiln_err rc = reg_get_text(&m->c, path, REG_TRUST_MAX, &doc, &len);
        if (rc == KILN_ERR_NOTFOUND) {
            kiln_errclear();
            return KILN_OK; /* the newest the primary has */
        }
        if (rc && !item_failure(rc)) return rc;
        if (rc) {
            say(m, true, "trust version %llu: %s", (unsigned long long)v, kiln_errmsg());
            return KILN_OK;
        }
        snprintf(label, sizeof label, "trust version %llu from %s", (unsigned long long)v,
                 m->c.url);
        kiln_sign_trust *next = NULL;
        rc = kiln_sign_trust_update(cur, doc, len, label, &next, NULL);
        if (rc == KILN_ERR_NOMEM) {
            free(doc);
            return rc;
        }
        if (rc) {
            say(m, true, "%s (not copied, nor any version after it)", kiln_errmsg());
            free(doc);
            return KILN_OK;
        }
        kiln_sign_trust **nv = realloc(m->chain.v, (m->chain.n + 1) * sizeof *nv);
        if (!nv) {
            kiln_sign_trust_free(next);
            free(doc);
            return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        }
        m->chain.v = nv;
        rc = reg_trust_store(m->db, v, doc, len, NULL, "mirror.sync", m->reason);
        free(doc);
        if (rc) {
            kiln_sign_trust_free(next);
            return rc;
        }
        m->chain.v[m->chain.n++] = next;
        m->res->trust_versions++;
        say(m, false, "copied trust version %llu", (unsigned long long)v);
    }
}

/* The archive's signatures under some version of the chain (the policy of the day the
 * primary took it may since have been followed by another), newest first; *rep from the one
 * that verified. With man (the manifest read as the bytes landed, which prehash is of) the
 * archive is not opened again. The message, when none does, is the newest's. */
static kiln_err verify_sigs(mirror_run *m, const char *file, const uint8_t *prehash,
                            const kiln_manifest *man, const char *sig, const char *label,
                            kiln_sign_archive_report *rep) {
    char msg[1024] = "";
    kiln_err first = KILN_OK;
    for (size_t i = m->chain.n; i-- > 0;) {
        /* With the prehash (computed as the download landed) each policy costs no pass. */
        kiln_err rc =
            prehash && man ? kiln_sign_verify_prehashed_sigs(prehash, man, file, sig, strlen(sig),
                                                             label, m->chain.v[i], rep)
            : prehash
                ? kiln_sign_verify_archive_sigs_prehashed(file, prehash, sig, strlen(sig), label,
                                                          m->chain.v[i], rep)
                : kiln_sign_verify_archive_sigs(file, sig, strlen(sig), label, m->chain.v[i], rep);
        if (!rc) return KILN_OK;
        if (rc == KILN_ERR_NOMEM || rc == KILN_ERR_IO) return rc;
        if (!first) {
            first = rc == KILN_ERR_FORMAT ? KILN_ERR_VERIFY : rc;
            snprintf(msg, sizeof msg, "%s", kiln_errmsg());
        }
    }
    return kiln_fail(first, "%s", msg);
}

static void stream_result_release(reg_stream_result *sr) {
    kiln_manifest_free(sr->manifest);
    reg_archive_meta_release(&sr->meta);
    memset(sr, 0, sizeof *sr);
}

/* ---- versions, two in flight ----
 *
 * A version is fetched and checked (its record, the download with both digests as the bytes
 * land, the signatures, the manifest) on a thread of its own, and committed (the blob's fsync
 * and link, the row) by the sync's thread, in the primary's order. While one version is
 * committed or its last bytes hashed, the next one downloads: a new mirror's many archives
 * keep both cores busy instead of waiting on each archive's hashing, fsync and commit in
 * turn. What the sync says (copied, problems) comes in the listing's order, as one at a time. */
enum { MIRROR_IN_FLIGHT = 2 };

typedef struct mirror_job {
    mirror_run *m;
    kiln_registry_client_opts c; /* the primary, progress through job_progress */
    const char *model, *version, *digest; /* the listing's */
    char hex[KILN_SHA256_HEX];
    uint64_t size;
    char label[200];
    /* what the fetch found */
    kiln_err rc;
    char msg[1024];
    size_t requests;
    uint64_t bytes;
    json_t *ver; /* the primary's record of the version */
    const char *sig, *publisher, *created;
    char *blob, *partial;
    bool have_blob;
    reg_archive_meta meta;
    pthread_t th;
    bool threaded;
} mirror_job;

/* Progress goes to the caller's callback from the oldest version in flight only (one bar, one
 * archive at a time); a cancel it asks for, or a sync that stopped, ends every download. */
static int job_progress(void *ctx, uint64_t done, uint64_t total) {
    mirror_job *j = ctx;
    mirror_run *m = j->m;
    pthread_mutex_lock(&m->mu);
    if (!m->cancel && j == m->oldest && m->c.progress &&
        m->c.progress(m->c.progress_ctx, done, total) != 0)
        m->cancel = true;
    bool cancel = m->cancel;
    pthread_mutex_unlock(&m->mu);
    return cancel;
}

/* Download blob hex into partial (resuming what is there) and check its digest; a resumed
 * file that does not hash right is fetched once more from the start, as kiln pull does. The
 * SHA-256 and the signatures' BLAKE2b-512 come from the bytes as they land (pullstream.c), and
 * with expect (the signed manifest) the archive's metadata too: *sr says which did (the
 * caller releases it). */
static kiln_err fetch_blob(mirror_job *j, const kiln_manifest *expect, bool report,
                           reg_stream_result *sr) {
    const char *hex = j->hex, *partial = j->partial, *label = j->label;
    uint64_t size = j->size;
    memset(sr, 0, sizeof *sr);
    for (int pass = 0;; pass++) {
        struct stat sb;
        uint64_t have = stat(partial, &sb) == 0 ? (uint64_t)sb.st_size : 0;
        j->requests++;
        reg_follow *f = NULL;
        reg_stream *st = NULL;
        stream_result_release(sr);
        /* The stream names the archive by its file, as reg_archive_meta_read would. */
        kiln_err rc = reg_follow_new(&f);
        if (!rc) rc = reg_stream_start_meta(f, partial, size, partial, expect, report, &st);
        if (!rc) rc = reg_download_follow(&j->c, hex, size, partial, f);
        reg_stream_join(st, sr);
        reg_follow_free(f);
        KILN_TRY(rc);
        j->bytes += have <= size ? size - have : size;
        uint8_t h[KILN_SHA256_BYTES];
        char got[KILN_SHA256_HEX];
        if (sr->hashed)
            memcpy(h, sr->sha256, sizeof h);
        else
            KILN_TRY(kiln_sha256_file(partial, h));
        kiln_hex(h, sizeof h, got);
        if (!strcmp(got, hex)) return KILN_OK;
        stream_result_release(sr);
        unlink(partial);
        KILN_FAIL_IF(pass > 0, KILN_ERR_VERIFY, "%s: the archive hashes to sha256:%s", label, got);
    }
}

/* Whether the bytes of validation.json need not be read from the archive: true when the
 * signed manifest m lists none or one over REG_VALIDATION_MAX (none is kept), or when the
 * primary's copy (ver's "validation_text") has the size and sha256 m lists: then *text is a
 * copy of it (the caller frees). False when they must be read from the archive. */
static bool report_of(const json_t *ver, const kiln_manifest *m, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    const kiln_manifest_file *f = kiln_manifest_find(m, "validation.json");
    if (!f || f->size > REG_VALIDATION_MAX) return true;
    const json_t *t = json_object_get(ver, "validation_text");
    if (!json_is_string(t) || json_string_length(t) != f->size) return false;
    uint8_t d[KILN_SHA256_BYTES];
    kiln_sha256(json_string_value(t), (size_t)f->size, d);
    if (memcmp(d, f->sha256, sizeof d) != 0) return false;
    *text = kiln_malloc((size_t)f->size + 1);
    if (!*text) return false;
    memcpy(*text, json_string_value(t), (size_t)f->size + 1);
    *len = (size_t)f->size;
    return true;
}

/* A blob the store holds, read once as a download is (pullstream.c): its digests and, with expect,
 * its metadata in *sr (the caller releases it). Not hashed (sr->hashed false) when it is not
 * size bytes long: the caller then hashes the file for the message. */
static kiln_err read_held(const char *blob, uint64_t size, const kiln_manifest *expect, bool report,
                          reg_stream_result *sr) {
    memset(sr, 0, sizeof *sr);
    struct stat sb;
    if (stat(blob, &sb) != 0 || (uint64_t)sb.st_size != size) return KILN_OK;
    reg_follow *f = NULL;
    reg_stream *st = NULL;
    KILN_TRY(reg_follow_new(&f));
    kiln_err rc = reg_stream_start_meta(f, blob, size, blob, expect, report, &st);
    reg_follow_grow(f, size); /* all there already */
    reg_follow_end(f, true);
    reg_stream_join(st, sr);
    reg_follow_free(f);
    return rc;
}

/* One version the primary lists, on its own thread (job_main): its record, its archive
 * downloaded, hashed, its signatures verified and the archive read as the server does on
 * upload. Touches nothing of the mirror's but its tmp/ partial (the store's rows and blobs
 * are the sync thread's: job_commit). */
static kiln_err job_fetch(mirror_job *j) {
    mirror_run *m = j->m;
    const char *model = j->model, *version = j->version, *label = j->label;
    char path[300];
    snprintf(path, sizeof path, "/v1/models/%s/versions/%s", model, version);
    kiln_manifest *signed_m = NULL;
    char *report = NULL;
    size_t report_len = 0;
    bool have_report = false;
    reg_stream_result sr;
    memset(&sr, 0, sizeof sr);
    j->requests++;
    kiln_err rc = kiln_registry_get_json(&j->c, path, &j->ver);
    if (rc) goto out;
    json_t *ver = j->ver;
    const char *sig = json_string_value(json_object_get(ver, "signature")),
               *vd = json_string_value(json_object_get(ver, "digest"));
    j->sig = sig;
    j->publisher = json_string_value(json_object_get(ver, "publisher"));
    j->created = json_string_value(json_object_get(ver, "created"));
    json_t *vs = json_object_get(ver, "size");
    KILN_CHECK_IF(rc, out,
                  !sig || !vd || strcmp(vd, j->digest) || !json_is_integer(vs) ||
                      (uint64_t)json_integer_value(vs) != j->size,
                  KILN_ERR_VERIFY,
                  "%s: the primary's record of the version lacks a signature or gives another "
                  "digest or size than its listing",
                  label);
    KILN_CHECK_IF(rc, out, strlen(sig) > REG_SIG_MAX, KILN_ERR_LIMIT,
                  "%s: its signature file is larger than %u bytes", label, REG_SIG_MAX);
    /* The declared size, before a byte is downloaded, as a pull checks it: within the
     * mirror's maximum and what an archive of the signed manifest can be (the primary's copy
     * of the manifest, under the newest version of the chain that verifies the signatures over
     * it). That manifest is also what the archive is read against as it lands. */
    for (size_t i = m->chain.n; i-- > 0 && !signed_m;)
        signed_m = reg_signed_manifest(ver, sig, m->chain.v[i], model, version);
    KILN_CHECK(rc, out,
               reg_size_accept(&j->c, j->size,
                               signed_m ? reg_archive_bound(signed_m) : UINT64_MAX, label));
    /* The validation report comes after the weights in the archive: its bytes are taken from
     * the primary's record of the version when they are the ones the signed manifest lists,
     * so that the archive is decompressed no further than its card. */
    have_report = signed_m && report_of(ver, signed_m, &report, &report_len);
    j->blob = reg_blob_path(m->root, j->hex);
    j->partial = kiln_asprintf("%s/tmp/mirror-%s.partial", m->root, j->hex);
    KILN_CHECK_IF(rc, out, !j->blob || !j->partial, KILN_ERR_NOMEM, "out of memory");
    /* A blob the store has (another version's, or one linked by a sync that stopped before
     * its row) is checked as a download is, read once as one is. */
    j->have_blob = kiln_path_exists(j->blob);
    const char *file = j->have_blob ? j->blob : j->partial;
    if (j->have_blob) {
        uint8_t h[KILN_SHA256_BYTES];
        char got[KILN_SHA256_HEX];
        KILN_CHECK(rc, out, read_held(j->blob, j->size, signed_m, !have_report, &sr));
        if (sr.hashed)
            memcpy(h, sr.sha256, sizeof h);
        else
            KILN_CHECK(rc, out, kiln_sha256_file(j->blob, h));
        kiln_hex(h, sizeof h, got);
        KILN_CHECK_IF(rc, out, strcmp(got, j->hex), KILN_ERR_VERIFY,
                      "%s: the blob held here '%s' hashes to sha256:%s", label, j->blob, got);
        unlink(j->partial); /* a sync stopped between the link and the partial's removal */
    } else {
        KILN_CHECK(rc, out, fetch_blob(j, signed_m, !have_report, &sr));
    }
    /* As the server on upload: every signature block under the policy, then the archive's
     * manifest (the one the signatures name) and its name and version. The manifest, card
     * and report were read from the bytes as they were hashed (against the signed manifest)
     * and are used only now, after the signatures verified; when they were not (no signed
     * manifest, a download that started over, a read that failed: its own words come after
     * the signatures' verdict), they are read from the file. */
    kiln_sign_archive_report rep;
    char sig_label[260];
    snprintf(sig_label, sizeof sig_label, "signature of %s", label);
    rc = verify_sigs(m, file, sr.hashed ? sr.blake2b : NULL, sr.inspected ? sr.manifest : NULL, sig,
                     sig_label, &rep);
    if (rc) { /* name the archive, not the temporary file it is in */
        rc = reg_relabel(rc, file, "the primary's archive");
        goto out;
    }
    reg_archive_meta *meta = &j->meta;
    if (sr.inspected) {
        *meta = sr.meta;
        memset(&sr.meta, 0, sizeof sr.meta);
        if (have_report && report && !memchr(report, 0, report_len)) {
            meta->validation_text = report; /* as reg_archive_meta_take keeps it */
            meta->validation_len = report_len;
            report = NULL;
        }
    } else {
        rc = reg_archive_meta_read(file, meta);
    }
    if (rc) {
        rc = kiln_errprefix(rc == KILN_ERR_FORMAT ? KILN_ERR_VERIFY : rc, "%s: ", label);
        goto out;
    }
    KILN_CHECK_IF(
        rc, out, memcmp(meta->manifest_sha256, rep.info.manifest_sha256, KILN_SHA256_BYTES) != 0,
        KILN_ERR_VERIFY, "%s: the manifest read is not the one the signatures name", label);
    KILN_CHECK_IF(rc, out, strcmp(meta->name, model) || strcmp(meta->version, version),
                  KILN_ERR_VERIFY, "%s: the archive's manifest names '%s@%s'", label, meta->name,
                  meta->version);
out:
    stream_result_release(&sr);
    kiln_manifest_free(signed_m);
    free(report);
    return rc;
}

static void *job_main(void *arg) {
    mirror_job *j = arg;
    j->rc = job_fetch(j);
    if (j->rc) snprintf(j->msg, sizeof j->msg, "%s", kiln_errmsg());
    return NULL;
}

static void job_free(mirror_job *j) {
    if (!j) return;
    reg_archive_meta_release(&j->meta);
    json_decref(j->ver);
    free(j->blob);
    free(j->partial);
    free(j);
}

/* The version's listing checked against the store, on the sync's thread; *j the fetch to
 * start (NULL: nothing to fetch). Problems are said by the caller once the versions before
 * this one are done, in *problem. */
static kiln_err job_new(mirror_run *m, const char *model, json_t *entry, mirror_job **j,
                        char *problem, size_t cap) {
    *j = NULL;
    problem[0] = 0;
    const char *version = json_string_value(json_object_get(entry, "version")),
               *digest = json_string_value(json_object_get(entry, "digest"));
    json_t *jsize = json_object_get(entry, "size");
    char hex[KILN_SHA256_HEX];
    if (!version || reg_check_version_chars(version) || !reg_digest_hex(digest, hex) ||
        !json_is_integer(jsize) || json_integer_value(jsize) < 0) {
        snprintf(problem, cap, "%s@%s: the primary lists it without a valid version, digest or size",
                 model, version && strlen(version) <= KILN_REGISTRY_NAME_MAX ? version : "?");
        return KILN_OK;
    }
    kiln_err rc;
    char *have = reg_version_digest(m->db, model, version, &rc);
    KILN_TRY(rc);
    if (have) {
        if (strcmp(have, digest) != 0)
            snprintf(problem, cap,
                     "%s@%s: the primary now gives it %s, but it was published as %s (held here): "
                     "a published version changed on the primary; not overwritten",
                     model, version, digest, have);
        free(have);
        return KILN_OK;
    }
    mirror_job *n = kiln_calloc(1, sizeof *n);
    if (!n) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    n->m = m;
    n->c = m->c;
    n->c.progress = job_progress;
    n->c.progress_ctx = n;
    n->model = model;
    n->version = version;
    n->digest = digest;
    memcpy(n->hex, hex, sizeof hex);
    n->size = (uint64_t)json_integer_value(jsize);
    snprintf(n->label, sizeof n->label, "%s@%s (%s)", model, version, digest);
    *j = n;
    return KILN_OK;
}

/* The blob committed (fsync, link) and the row inserted, on the sync's thread. */
static kiln_err job_commit(mirror_job *j) {
    mirror_run *m = j->m;
    if (!j->have_blob) {
        reg_upload u;
        KILN_TRY(reg_upload_adopt(&u, m->root, j->partial));
        kiln_err rc = reg_upload_commit(&u, j->hex);
        reg_upload_abort(&u);
        KILN_TRY(rc);
    }
    int64_t when = 0;
    if (!j->created || kiln_sign_parse_time(j->created, "created", &when) != KILN_OK) when = 0;
    kiln_errclear();
    reg_version_row row = {.model = j->model,
                           .version = j->version,
                           .digest = j->digest,
                           .size = j->size,
                           .meta = &j->meta,
                           .sig = j->sig,
                           .sig_len = strlen(j->sig),
                           .publisher = j->publisher ? j->publisher : "",
                           .created = when ? when : kiln_unix_time()};
    bool existed;
    KILN_TRY(reg_version_insert(m->db, &row, NULL, "mirror.sync", m->reason, &existed));
    if (!existed) {
        m->res->versions++;
        say(m, false, "copied %s@%s %s (%llu bytes)", j->model, j->version, j->digest,
            (unsigned long long)j->size);
    }
    return KILN_OK;
}

/* The oldest version in flight: waited for, then committed or its problem said. A download
 * whose bytes hash right stays even when its signature or manifest does not verify (the next
 * sync checks it again without fetching it); bytes that hash wrong were removed by
 * fetch_blob. */
static kiln_err job_finish(mirror_job *j) {
    mirror_run *m = j->m;
    if (j->threaded) pthread_join(j->th, NULL);
    m->res->requests += j->requests;
    m->res->bytes += j->bytes;
    kiln_err rc = j->rc ? kiln_fail(j->rc, "%s", j->msg) : job_commit(j);
    if (rc && item_failure(rc)) {
        say(m, true, "%s", kiln_errmsg());
        rc = KILN_OK;
    }
    return rc;
}

typedef struct job_queue {
    mirror_job *v[MIRROR_IN_FLIGHT];
    size_t first, n;
} job_queue;

static void queue_oldest(mirror_run *m, job_queue *q) {
    pthread_mutex_lock(&m->mu);
    m->oldest = q->n ? q->v[q->first] : NULL;
    pthread_mutex_unlock(&m->mu);
}

/* The oldest in flight, out of the queue. */
static mirror_job *queue_take(job_queue *q) {
    mirror_job *j = q->v[q->first];
    q->first = (q->first + 1) % MIRROR_IN_FLIGHT;
    q->n--;
    return j;
}

/* The oldest in flight finished and freed. */
static kiln_err queue_pop(mirror_run *m, job_queue *q) {
    mirror_job *j = queue_take(q);
    kiln_err rc = job_finish(j);
    job_free(j);
    queue_oldest(m, q);
    return rc;
}

/* Every version in flight finished, in order; after a failure the rest only waited for
 * (their downloads cancelled) and freed. */
static kiln_err queue_drain(mirror_run *m, job_queue *q, kiln_err rc) {
    while (q->n && !rc)
        rc = queue_pop(m, q);
    if (q->n) {
        pthread_mutex_lock(&m->mu);
        m->cancel = true;
        pthread_mutex_unlock(&m->mu);
    }
    while (q->n) {
        mirror_job *j = queue_take(q);
        if (j->threaded) pthread_join(j->th, NULL);
        job_free(j);
    }
    queue_oldest(m, q);
    return rc;
}

/* A model's versions, in the primary's order (so that publication order is kept), up to
 * MIRROR_IN_FLIGHT fetched at once. Two listings of one digest never are: the second is
 * checked against the blob the first committed, as one at a time. */
static kiln_err sync_versions(mirror_run *m, const char *model, json_t *versions) {
    job_queue q = {.n = 0};
    kiln_err rc = KILN_OK;
    for (size_t i = 0; !rc && i < json_array_size(versions); i++) {
        mirror_job *j = NULL;
        char problem[1024];
        rc = job_new(m, model, json_array_get(versions, i), &j, problem, sizeof problem);
        if (rc) break;
        if (problem[0]) {
            rc = queue_drain(m, &q, KILN_OK);
            if (!rc) say(m, true, "%s", problem);
        }
        if (!j) continue;
        bool same = false;
        for (size_t k = 0; k < q.n; k++)
            same = same || !strcmp(q.v[(q.first + k) % MIRROR_IN_FLIGHT]->hex, j->hex);
        if (!rc && same) rc = queue_drain(m, &q, KILN_OK);
        if (!rc && q.n == MIRROR_IN_FLIGHT) rc = queue_pop(m, &q);
        if (rc) {
            job_free(j);
            break;
        }
        q.v[(q.first + q.n) % MIRROR_IN_FLIGHT] = j;
        q.n++;
        queue_oldest(m, &q);
        /* No thread to be had: fetched here, as one at a time. */
        j->threaded = pthread_create(&j->th, NULL, job_main, j) == 0;
        if (!j->threaded) job_main(j);
    }
    return queue_drain(m, &q, rc);
}

static int64_t held_seq(mirror_run *m, const char *model, const char *channel, kiln_err *rc) {
    sqlite3_stmt *st = NULL;
    int64_t n = -1;
    *rc = KILN_OK;
    if (sqlite3_prepare_v2(m->db,
                           "SELECT coalesce(max(seq), 0) FROM channel_records WHERE model = ?1 AND "
                           "channel = ?2",
                           -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 2, channel, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW) n = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    if (n < 0) *rc = reg_db_fail(m->db, "reading channel records");
    return n;
}

/* One channel: the records after the newest the mirror holds, up to the seq the primary
 * listed (what it published meanwhile waits for the next sync), in seq order, each the bytes
 * the primary stored. Each is verified as the server verifies a record put to it: the
 * current one under the newest policy and unexpired, an older one under some version of
 * the chain (it was accepted under the policy of its day; it may have expired since). The
 * first that fails stops the channel: the records after it cannot follow it. */
static kiln_err sync_channel(mirror_run *m, const char *model, const char *channel,
                             int64_t listed) {
    kiln_err rc;
    int64_t held = held_seq(m, model, channel, &rc);
    KILN_TRY(rc);
    if (listed == held) return KILN_OK;
    if (listed < held) {
        say(m, true,
            "%s/%s: the primary's channel is at seq %lld, but seq %lld was copied from it: "
            "records went missing on the primary; the mirror keeps its own",
            model, channel, (long long)listed, (long long)held);
        return KILN_OK;
    }
    char path[300];
    snprintf(path, sizeof path, "/v1/models/%s/channels/%s/history?after=%lld", model, channel,
             (long long)held);
    json_t *h = NULL;
    rc = get_json(m, path, &h);
    if (rc) {
        if (!item_failure(rc)) return rc;
        say(m, true, "%s/%s: %s", model, channel, kiln_errmsg());
        return KILN_OK;
    }
    json_t *recs = json_object_get(h, "records");
    for (size_t i = 0; i < json_array_size(recs); i++) {
        json_t *e = json_array_get(recs, i), *jt = json_object_get(e, "text");
        char *owned = NULL;
        const char *text = json_string_value(jt);
        size_t len = text ? json_string_length(jt) : 0;
        if (!text) { /* a primary from before "text": the record as it parsed (signatures are
                      * over the canonical form, so they still verify) */
            owned = json_dumps(json_object_get(e, "record"), JSON_COMPACT | JSON_SORT_KEYS);
            text = owned;
            len = owned ? strlen(owned) : 0;
        }
        int64_t seq = json_integer_value(
            json_object_get(json_object_get(json_object_get(e, "record"), "record"), "seq"));
        if (seq <= held) { /* a primary that ignored ?after */
            free(owned);
            continue;
        }
        if (seq > listed) {
            free(owned);
            break;
        }
        char label[200];
        snprintf(label, sizeof label, "%s/%s seq %lld", model, channel, (long long)seq);
        bool current = seq == listed;
        reg_record rec;
        rc = KILN_OK;
        if (!text || strlen(text) != len || len > REG_RECORD_MAX)
            rc = kiln_fail(KILN_ERR_VERIFY,
                           "%s: the primary's record text is missing, too long "
                           "or holds a NUL byte",
                           label);
        if (!rc) {
            /* Newest first, the current record under the newest only; the message kept when
             * none verifies is the newest policy's. */
            char first[1024] = "";
            bool ok = false;
            for (size_t k = m->chain.n; k-- > 0 && !ok && !rc;) {
                if (current && k != m->chain.n - 1) break;
                kiln_err r = reg_record_verify(m->chain.v[k], text, len, label, &rec);
                if (!r)
                    ok = true;
                else if (r != KILN_ERR_VERIFY && r != KILN_ERR_FORMAT)
                    rc = r;
                else if (!first[0])
                    snprintf(first, sizeof first, "%s", kiln_errmsg());
            }
            if (!rc && !ok) rc = kiln_fail(KILN_ERR_VERIFY, "%s", first);
        }
        if (!rc && (strcmp(rec.model, model) || strcmp(rec.channel, channel) || rec.seq != seq))
            rc = kiln_fail(KILN_ERR_VERIFY, "%s: the signed record names %s/%s seq %lld", label,
                           rec.model, rec.channel, (long long)rec.seq);
        if (!rc && current && rec.expires <= kiln_unix_time()) {
            char when[21];
            kiln_format_time(rec.expires, when);
            rc = kiln_fail(KILN_ERR_VERIFY,
                           "%s: the channel's current record expired at %s (the server would "
                           "refuse it)",
                           label, when);
        }
        int64_t created = 0;
        const char *cs = json_string_value(json_object_get(e, "created")),
                   *publisher = json_string_value(json_object_get(e, "publisher"));
        if (!cs || kiln_sign_parse_time(cs, "created", &created) != KILN_OK) created = 0;
        if (!rc) kiln_errclear();
        if (!rc)
            rc = reg_record_insert(m->db, &rec, text, publisher ? publisher : "",
                                   created ? created : kiln_unix_time(), NULL, "mirror.sync",
                                   m->reason);
        free(owned);
        if (rc) {
            if (!item_failure(rc)) {
                json_decref(h);
                return rc;
            }
            say(m, true, "%s (not copied, nor any record after it)", kiln_errmsg());
            break;
        }
        m->res->records++;
        say(m, false, "copied %s/%s seq %lld -> %s", model, channel, (long long)seq, rec.version);
    }
    json_decref(h);
    return KILN_OK;
}

/* One model: its versions (in the primary's order, so that publication order is kept), then
 * its channels. */
/* The reproduction records of the versions the mirror holds (kiln reproduce --sign), each
 * verified under the mirror's newest policy before it is stored: a client whose policy asks
 * for them (reproduced_by) can then pull through the mirror. */
static kiln_err sync_repros(mirror_run *m, const char *model, json_t *versions) {
    const kiln_sign_trust *t = m->chain.n ? m->chain.v[m->chain.n - 1] : NULL;
    kiln_err rc = KILN_OK;
    for (size_t i = 0; t && !rc && i < json_array_size(versions); i++) {
        const json_t *entry = json_array_get(versions, i);
        const char *version = json_string_value(json_object_get(entry, "version"));
        /* Asked only when the primary lists more than the mirror holds (the listing says how
         * many; a primary from before the records says nothing): an idle sync asks nothing. */
        json_int_t theirs = json_integer_value(json_object_get(entry, "reproductions")), ours = 0;
        sqlite3_stmt *cnt = NULL;
        if (version && theirs > 0 &&
            sqlite3_prepare_v2(m->db,
                               "SELECT count(*) FROM reproductions WHERE model = ?1 AND "
                               "version = ?2",
                               -1, &cnt, NULL) == SQLITE_OK) {
            sqlite3_bind_text(cnt, 1, model, -1, SQLITE_TRANSIENT);
            sqlite3_bind_text(cnt, 2, version, -1, SQLITE_TRANSIENT);
            if (sqlite3_step(cnt) == SQLITE_ROW) ours = sqlite3_column_int64(cnt, 0);
        }
        sqlite3_finalize(cnt);
        if (theirs <= ours) continue;
        uint64_t size = 0;
        char *digest = version ? reg_version_digest_size(m->db, model, version, &size, &rc) : NULL;
        if (rc || !digest) {
            free(digest);
            continue;
        }
        char path[256];
        snprintf(path, sizeof path, "/v1/models/%s/versions/%s/reproductions", model, version);
        json_t *j = NULL;
        rc = get_json(m, path, &j);
        if (rc) {
            free(digest);
            json_decref(j);
            if (rc == KILN_ERR_NOTFOUND) { /* a primary from before the records */
                kiln_errclear();
                rc = KILN_OK;
                continue;
            }
            if (!item_failure(rc)) return rc;
            say(m, true, "%s@%s: reproduction records: %s", model, version, kiln_errmsg());
            rc = KILN_OK;
            continue;
        }
        size_t k;
        json_t *doc;
        json_array_foreach(json_object_get(j, "reproductions"), k, doc) {
            const char *text = json_string_value(json_object_get(doc, "record")),
                       *sig = json_string_value(json_object_get(doc, "signature"));
            const kiln_sign_trust_key *key = NULL;
            bool same = false;
            if (!text || !sig ||
                reg_repro_verify(t, text, sig, "reproduction record", model, version, digest, &key,
                                 &same) != KILN_OK) {
                say(m, true, "%s@%s: a reproduction record not copied: %s", model, version,
                    text && sig ? kiln_errmsg() : "malformed");
                kiln_errclear();
                continue;
            }
            sqlite3_stmt *st = NULL;
            if ((rc = reg_db_exec(m->db, "BEGIN IMMEDIATE"))) break;
            if (sqlite3_prepare_v2(m->db,
                                   "INSERT OR IGNORE INTO reproductions(model, version, digest, "
                                   "signer, verdict, record, signature, publisher, created) "
                                   "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                                   -1, &st, NULL) != SQLITE_OK)
                rc = reg_db_fail(m->db, "storing a reproduction record");
            if (!rc) {
                const char *pub = json_string_value(json_object_get(doc, "publisher"));
                sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
                sqlite3_bind_text(st, 2, version, -1, SQLITE_TRANSIENT);
                sqlite3_bind_text(st, 3, digest, -1, SQLITE_TRANSIENT);
                sqlite3_bind_text(st, 4, key->name, -1, SQLITE_TRANSIENT);
                sqlite3_bind_text(st, 5, same ? "identical" : "different", -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 6, text, -1, SQLITE_TRANSIENT);
                sqlite3_bind_text(st, 7, sig, -1, SQLITE_TRANSIENT);
                sqlite3_bind_text(st, 8, pub ? pub : "?", -1, SQLITE_TRANSIENT);
                sqlite3_bind_int64(st, 9, kiln_unix_time());
                if (sqlite3_step(st) != SQLITE_DONE)
                    rc = reg_db_fail(m->db, "storing a reproduction record");
            }
            bool added = !rc && sqlite3_changes(m->db) > 0;
            if (st) sqlite3_finalize(st);
            if (added)
                rc = reg_audit_full(m->db, NULL, "reproduce", model, version, NULL, digest,
                                    m->reason);
            if (!rc) rc = reg_db_exec(m->db, "COMMIT");
            if (rc) {
                (void)reg_db_exec(m->db, "ROLLBACK");
                break;
            }
            if (added)
                say(m, false, "copied %s@%s: reproduction record by %s", model, version, key->name);
        }
        json_decref(j);
        free(digest);
    }
    return rc;
}

/* Whether the mirror holds dataset name with digest. */
static bool dataset_held(sqlite3 *db, const char *name, const char *digest, kiln_err *rc) {
    sqlite3_stmt *st = NULL;
    *rc = KILN_OK;
    if (sqlite3_prepare_v2(db, "SELECT 1 FROM datasets WHERE name = ?1 AND digest = ?2", -1, &st,
                           NULL) != SQLITE_OK) {
        *rc = reg_db_fail(db, "reading datasets");
        return false;
    }
    sqlite3_bind_text(st, 1, name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, digest, -1, SQLITE_TRANSIENT);
    const int r = sqlite3_step(st);
    if (r != SQLITE_ROW && r != SQLITE_DONE) *rc = reg_db_fail(db, "reading datasets");
    sqlite3_finalize(st);
    return r == SQLITE_ROW;
}

/* One dataset the primary lists and the mirror lacks: its signature fetched, its bytes
 * downloaded into tmp/, checked as kiln data pull checks them (the sha256, one release key's
 * signature under the mirror's policy, the comment naming it), then stored as an upload is. */
static kiln_err copy_dataset(mirror_run *m, const kiln_sign_trust *t, const json_t *d) {
    const char *name = json_string_value(json_object_get(d, "name")),
               *digest = json_string_value(json_object_get(d, "digest")),
               *publisher = json_string_value(json_object_get(d, "publisher")),
               *created = json_string_value(json_object_get(d, "created"));
    char hex[KILN_SHA256_HEX];
    if (!name || kiln_registry_check_name("dataset", name) || !reg_digest_hex(digest, hex)) {
        kiln_errclear();
        say(m, true, "the primary lists a dataset without a valid name or digest");
        return KILN_OK;
    }
    kiln_err rc;
    if (dataset_held(m->db, name, digest, &rc) || rc) return rc;
    char path[64 + KILN_REGISTRY_NAME_MAX + KILN_SHA256_HEX];
    snprintf(path, sizeof path, "/v1/datasets/%s/sha256/%s", name, hex);
    json_t *j = NULL;
    char *partial = kiln_asprintf("%s/tmp/mirror-data-%s.partial", m->root, hex), *label = NULL;
    KILN_CHECK_IF(rc, out, !partial, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, get_json(m, path, &j));
    const char *sig = json_string_value(json_object_get(j, "signature"));
    const json_t *jsize = json_object_get(j, "size");
    KILN_CHECK_IF(rc, out, !sig || !json_is_integer(jsize) || json_integer_value(jsize) < 0,
                  KILN_ERR_FORMAT, "dataset %s@%s: the primary's answer has no signature or size",
                  name, digest);
    const uint64_t size = (uint64_t)json_integer_value(jsize);
    label = kiln_asprintf("the signature of dataset %s@%s", name, digest);
    KILN_CHECK_IF(rc, out, !label, KILN_ERR_NOMEM, "out of memory");
    m->res->requests++;
    KILN_CHECK(rc, out, reg_download(&m->c, hex, size, partial));
    m->res->bytes += size;
    char who[KILN_SIGN_NAME_MAX + 1];
    KILN_CHECK(rc, out,
               reg_dataset_verify(t, sig, strlen(sig), label, partial, name, hex, who, sizeof who));
    reg_upload u;
    KILN_CHECK(rc, out, reg_upload_adopt(&u, m->root, partial));
    rc = reg_upload_commit(&u, hex);
    reg_upload_abort(&u);
    if (rc) goto out;
    int64_t when = 0;
    if (!created || kiln_sign_parse_time(created, "created", &when) != KILN_OK) when = 0;
    kiln_errclear();
    reg_dataset_row row = {.name = name,
                           .digest = digest,
                           .size = size,
                           .sig = sig,
                           .sig_len = strlen(sig),
                           .publisher = publisher ? publisher : "",
                           .created = when ? when : kiln_unix_time()};
    bool existed;
    KILN_CHECK(rc, out, reg_dataset_insert(m->db, &row, &existed));
    if (!existed) {
        m->res->datasets++;
        say(m, false, "copied dataset %s@%s (%llu bytes, signed by %s)", name, digest,
            (unsigned long long)size, who);
    }
out:
    if (rc && partial) unlink(partial);
    if (rc && item_failure(rc)) {
        say(m, true, "dataset %s@%s: %s", name, digest, kiln_errmsg());
        kiln_errclear();
        rc = KILN_OK;
    }
    json_decref(j);
    free(partial);
    free(label);
    return rc;
}

/* The datasets (kiln data publish; kiln release publishes the one a version was trained on),
 * so that kiln reproduce against the mirror finds them. A primary from before datasets, and an
 * OCI registry (which holds none), list none. */
static kiln_err sync_datasets(mirror_run *m) {
    const kiln_sign_trust *t = m->chain.n ? m->chain.v[m->chain.n - 1] : NULL;
    if (!t || reg_oci_url(m->c.url)) return KILN_OK;
    json_t *list = NULL;
    kiln_err rc = get_json(m, "/v1/datasets", &list);
    if (rc == KILN_ERR_NOTFOUND) {
        kiln_errclear();
        return KILN_OK;
    }
    size_t i;
    json_t *d;
    json_array_foreach(json_object_get(list, "datasets"), i, d) {
        if (rc) break;
        rc = copy_dataset(m, t, d);
    }
    json_decref(list);
    return rc;
}

static kiln_err sync_model(mirror_run *m, const char *model) {
    char path[128];
    snprintf(path, sizeof path, "/v1/models/%s", model);
    json_t *j = NULL;
    kiln_err rc = get_json(m, path, &j);
    if (rc) {
        if (!item_failure(rc)) return rc;
        say(m, true, "%s: %s", model, kiln_errmsg());
        return KILN_OK;
    }
    json_t *versions = json_object_get(j, "versions"), *channels = json_object_get(j, "channels");
    rc = sync_versions(m, model, versions);
    if (!rc) rc = sync_repros(m, model, versions);
    const char *name;
    json_t *c;
    json_object_foreach(channels, name, c) {
        if (rc) break;
        json_t *seq = json_object_get(c, "seq");
        if (kiln_registry_check_name("channel", name) || !json_is_integer(seq) ||
            json_integer_value(seq) < 1) {
            say(m, true, "%s: the primary lists a channel without a valid name or seq", model);
            continue;
        }
        rc = sync_channel(m, model, name, json_integer_value(seq));
    }
    json_decref(j);
    return rc;
}

static void record_attempt(mirror_run *m, const char *key, int64_t value) {
    char v[24];
    snprintf(v, sizeof v, "%lld", (long long)value);
    if (meta_set(m->db, key, v) != KILN_OK) kiln_errclear(); /* advice: a sync is not undone */
}

kiln_err kiln_registry_mirror_sync(const kiln_registry_mirror_opts *o,
                                   kiln_registry_mirror_result *res) {
    memset(res, 0, sizeof *res);
    KILN_FAIL_IF(!o || !o->root || !o->from || !o->from->url || !o->trust, KILN_ERR_USAGE,
                 "a mirror needs a store directory, the primary's URL and a trust policy");
    /* Into an OCI registry: through the gate a publish and a promote pass there. */
    if (reg_oci_url(o->root)) return reg_oci_mirror_push(o, res);
    /* An OCI registry's objects are read through the same routes (oci_kiln.c). */
    KILN_FAIL_IF(strncmp(o->from->url, "http://", 7) && strncmp(o->from->url, "https://", 8) &&
                     !reg_oci_url(o->from->url),
                 KILN_ERR_USAGE, "registry URL '%s' is not http://, https://, oci:// or oci+http://",
                 o->from->url);
    mirror_run m = {.o = o, .root = o->root, .res = res, .c = *o->from};
    char *url = url_key(o->from->url);
    if (!url) return KILN_ERR_NOMEM;
    pthread_mutex_init(&m.mu, NULL);
    m.c.url = url;
    reg_deadline_start(&m.c, 1); /* the whole sync */
    snprintf(m.reason, sizeof m.reason, "from %s", url);
    kiln_sign_trust *start = NULL;
    json_t *models = NULL;
    int lock = -1;
    bool fresh;
    kiln_err rc = KILN_OK;
    /* Everything that can be refused is, before anything is written: the policy, the
     * directory, then the primary itself (a new mirror of a registry that does not answer is
     * not made). */
    KILN_CHECK(rc, out, kiln_sign_trust_load(o->trust, &start));
    KILN_CHECK(rc, out, check_root(o->root, url, &fresh));
    if (!fresh) {
        KILN_CHECK(rc, out, reg_lock_named(o->root, REG_MIRROR_LOCK, &lock));
        KILN_CHECK_IF(rc, out, lock < 0, KILN_ERR_CONFLICT,
                      "another kiln registry mirror is syncing '%s'", o->root);
    }
    KILN_CHECK(rc, out, get_json(&m, "/v1/models", &models));
    KILN_CHECK(rc, out, reg_db_open(o->root, &m.db));
    if (fresh) {
        KILN_CHECK(rc, out, mark(m.db, o->root, url));
        KILN_CHECK(rc, out, reg_lock_named(o->root, REG_MIRROR_LOCK, &lock));
        KILN_CHECK_IF(rc, out, lock < 0, KILN_ERR_CONFLICT,
                      "another kiln registry mirror is syncing '%s'", o->root);
    }
    record_attempt(&m, "mirror_last_attempt", kiln_unix_time());
    /* The policy: the mirror's, walked through the trust versions it holds, then the
     * primary's after them. */
    KILN_CHECK(rc, out, reg_trust_chain_load(m.db, o->root, start, o->trust, NULL, NULL, &m.chain));
    start = NULL; /* the chain's */
    KILN_CHECK(rc, out, sync_trust(&m));
    json_t *list = json_object_get(models, "models");
    for (size_t i = 0; i < json_array_size(list); i++) {
        const char *name = json_string_value(json_object_get(json_array_get(list, i), "name"));
        if (!name || kiln_registry_check_name("model", name)) {
            kiln_errclear();
            say(&m, true, "the primary lists a model without a valid name");
            continue;
        }
        KILN_CHECK(rc, out, sync_model(&m, name));
    }
    KILN_CHECK(rc, out, sync_datasets(&m));
    record_attempt(&m, "mirror_last_sync", kiln_unix_time());
    record_attempt(&m, "mirror_last_problems", (int64_t)res->problems);
    if (res->problems)
        rc = kiln_fail(KILN_ERR_VERIFY, "mirror of %s: %zu item%s did not verify and %s not copied",
                       url, res->problems, res->problems == 1 ? "" : "s",
                       res->problems == 1 ? "was" : "were");
out:
    /* The primary or the disk failed mid-sync: say which sync (the directory's own refusals
     * name it already). */
    if (rc == KILN_ERR_NETWORK || rc == KILN_ERR_AUTH || rc == KILN_ERR_IO ||
        rc == KILN_ERR_CONFLICT)
        kiln_errprefix(rc, "mirror of %s into '%s': ", url, o->root);
    json_decref(models);
    kiln_sign_trust_free(start);
    reg_trust_chain_release(&m.chain);
    reg_db_close(m.db);
    reg_unlock(lock);
    pthread_mutex_destroy(&m.mu);
    free(url);
    return rc;
}

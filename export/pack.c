/* pack.c - write a model directory as a reproducible .kiln archive: tar entries sorted by
 * path behind manifest.json, owner, permissions and times fixed, zstd through libarchive,
 * the output written atomically. Nothing in the bytes depends on the clock, the file
 * system's metadata or the process. */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "export_int.h"

/* zstd level: set, not left to libarchive's default, so that the bytes do not change
 * when that default does. */
#define PACK_ZSTD_LEVEL "3"

typedef struct pack_out {
    kiln_atomic at;
    kiln_sha256_state sha;
    kiln_err rc;  /* the first write failure, with its message */
    bool abandon; /* the pack failed: refuse every further write */
} pack_out;

static la_ssize_t pack_write_cb(struct archive *a, void *ud, const void *buf, size_t len) {
    (void)a;
    pack_out *o = ud;
    if (o->rc || o->abandon) return -1;
    o->rc = kiln_atomic_write(&o->at, buf, len);
    if (o->rc || o->abandon) return -1;
    kiln_sha256_update(&o->sha, buf, len);
    return (la_ssize_t)len;
}

static kiln_err ar_fail(struct archive *a, const pack_out *o, const char *out_path,
                        const char *what) {
    if (o->rc) return o->rc;
    return kiln_fail(KILN_ERR_IO, "'%s': %s: %s", out_path, what,
                     archive_error_string(a) ? archive_error_string(a) : "libarchive failed");
}

/* Header of one regular file with every field that could vary fixed. */
static kiln_err write_header(struct archive *a, struct archive_entry *e, const pack_out *o,
                             const char *out_path, const char *path, uint64_t size, int64_t mtime) {
    archive_entry_clear(e);
    archive_entry_set_pathname(e, path);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, (la_int64_t)size);
    archive_entry_set_uid(e, 0);
    archive_entry_set_gid(e, 0);
    archive_entry_set_uname(e, "root");
    archive_entry_set_gname(e, "root");
    archive_entry_set_mtime(e, (time_t)mtime, 0);
    if (archive_write_header(a, e) != ARCHIVE_OK) {
        kiln_err rc = ar_fail(a, o, out_path, "cannot write a header");
        return kiln_errprefix(rc, "entry '%s': ", path);
    }
    return KILN_OK;
}

static kiln_err write_data(struct archive *a, const pack_out *o, const char *out_path,
                           const char *path, const void *buf, size_t len) {
    if (len && archive_write_data(a, buf, len) != (la_ssize_t)len) {
        kiln_err rc = ar_fail(a, o, out_path, "cannot write data");
        return kiln_errprefix(rc, "entry '%s': ", path);
    }
    return KILN_OK;
}

/* Copy one file into the archive, hashing it again: a file changed since the manifest
 * was built makes the pack fail instead of writing an archive that does not verify. */
static kiln_err copy_file(struct archive *a, struct archive_entry *e, const pack_out *o, int rootfd,
                          const char *model_dir, const char *out_path, const kiln_manifest *m,
                          const kiln_manifest_file *f, unsigned char *buf) {
    char *label = kiln_path_join(model_dir, f->path);
    if (!label) return KILN_ERR_NOMEM;
    int fd = -1;
    kiln_err rc = KILN_OK;
    KILN_CHECK(rc, out, kiln_export_open_regular(rootfd, f->path, label, f->size, &fd));
    KILN_CHECK(rc, out, write_header(a, e, o, out_path, f->path, f->size, m->created_unix));
    kiln_sha256_state st;
    kiln_sha256_init(&st);
    uint64_t total = 0;
    for (;;) {
        ssize_t n = read(fd, buf, KILN_EXPORT_BUF);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        KILN_CHECK_IF(rc, out, n < 0, KILN_ERR_IO, "cannot read '%s': %s", label, strerror(errno));
        if (n == 0) break;
        total += (uint64_t)n;
        KILN_CHECK_IF(rc, out, total > f->size, KILN_ERR_CONFLICT,
                      "'%s': changed while being packed", label);
        kiln_sha256_update(&st, buf, (size_t)n);
        KILN_CHECK(rc, out, write_data(a, o, out_path, f->path, buf, (size_t)n));
    }
    uint8_t d[KILN_SHA256_BYTES];
    kiln_sha256_final(&st, d);
    KILN_CHECK_IF(rc, out, total != f->size || memcmp(d, f->sha256, sizeof d) != 0,
                  KILN_ERR_CONFLICT, "'%s': changed while being packed", label);
out:
    if (fd >= 0) close(fd);
    free(label);
    return rc;
}

/* Refuse an output inside the model directory: the next pack would include it. */
static kiln_err check_out_path(const char *model_dir, const char *out_path) {
    char *odir = kiln_dirname(out_path);
    if (!odir) return KILN_ERR_NOMEM;
    char rm[PATH_MAX], ro[PATH_MAX];
    kiln_err rc = KILN_OK;
    if (!realpath(model_dir, rm))
        rc = kiln_fail_errno(KILN_ERR_IO, "cannot resolve '%s'", model_dir);
    else if (!realpath(odir, ro))
        rc = kiln_fail_errno(KILN_ERR_IO, "cannot resolve the directory of '%s'", out_path);
    else {
        size_t l = strlen(rm);
        if (!strncmp(ro, rm, l) && (ro[l] == 0 || ro[l] == '/' || !strcmp(rm, "/")))
            rc = kiln_fail(KILN_ERR_USAGE, "'%s': the output is inside the model directory '%s'",
                           out_path, model_dir);
    }
    free(odir);
    return rc;
}

/* An existing output is replaced only when it is an archive (an earlier pack's): never a
 * dataset, a key or any other file named by mistake. */
static kiln_err check_out_replaceable(const char *out_path) {
    struct stat sb;
    if (lstat(out_path, &sb) != 0) {
        if (errno == ENOENT) return KILN_OK;
        return kiln_fail_errno(KILN_ERR_IO, "cannot look at '%s'", out_path);
    }
    KILN_FAIL_IF(!S_ISREG(sb.st_mode), KILN_ERR_CONFLICT,
                 "'%s' exists and is not a file; an archive is written to a new file or over an "
                 "archive",
                 out_path);
    kiln_manifest *m = NULL;
    kiln_err rc = kiln_archive_read_manifest(out_path, &m);
    kiln_manifest_free(m);
    if (rc == KILN_ERR_NOMEM) return rc;
    KILN_FAIL_IF(rc, KILN_ERR_CONFLICT,
                 "'%s' exists and is not a .kiln archive; an archive is written to a new file or "
                 "over an archive, never over another file: give another --out",
                 out_path);
    return KILN_OK;
}

kiln_err kiln_archive_pack(const char *model_dir, const char *name, const char *version,
                           const char *out_path, uint8_t archive_sha256[KILN_SHA256_BYTES],
                           kiln_manifest **manifest_out) {
    if (manifest_out) *manifest_out = NULL;
    KILN_TRY(check_out_path(model_dir, out_path));
    kiln_manifest *m = NULL;
    KILN_TRY(kiln_manifest_build(model_dir, name, version, &m));
    kiln_err rc = check_out_replaceable(out_path);
    if (rc) {
        kiln_manifest_free(m);
        return rc;
    }
    pack_out o = {.at = {.fd = -1}};
    struct archive *a = NULL;
    struct archive_entry *e = NULL;
    unsigned char *buf = NULL;
    int rootfd = open(model_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    KILN_CHECK_IF(rc, out, rootfd < 0, KILN_ERR_IO, "cannot open model directory '%s': %s",
                  model_dir, strerror(errno));
    buf = kiln_malloc(KILN_EXPORT_BUF);
    a = archive_write_new();
    e = archive_entry_new();
    KILN_CHECK_IF(rc, out, !buf || !a || !e, KILN_ERR_NOMEM, "out of memory packing '%s'",
                  model_dir);
    KILN_CHECK(rc, out, kiln_atomic_begin(&o.at, out_path));
    kiln_sha256_init(&o.sha);
    /* pax-restricted: plain ustar headers, plus a pax record only where ustar cannot say it
     * (a file of 8 GiB or more, a path ustar cannot split); its fields come from the entry. */
    if (archive_write_set_format_pax_restricted(a) != ARCHIVE_OK ||
        archive_write_add_filter_zstd(a) != ARCHIVE_OK ||
        archive_write_set_filter_option(a, "zstd", "compression-level", PACK_ZSTD_LEVEL) !=
            ARCHIVE_OK ||
        archive_write_set_bytes_in_last_block(a, 1) != ARCHIVE_OK ||
        archive_write_open2(a, &o, NULL, pack_write_cb, NULL, NULL) != ARCHIVE_OK) {
        rc = ar_fail(a, &o, out_path, "cannot start a zstd-compressed tar");
        goto out;
    }
    KILN_CHECK(rc, out,
               write_header(a, e, &o, out_path, KILN_MANIFEST_NAME, m->text_len, m->created_unix));
    KILN_CHECK(rc, out, write_data(a, &o, out_path, KILN_MANIFEST_NAME, m->text, m->text_len));
    for (size_t i = 0; i < m->nfiles; i++)
        KILN_CHECK(rc, out, copy_file(a, e, &o, rootfd, model_dir, out_path, m, &m->files[i], buf));
    if (archive_write_close(a) != ARCHIVE_OK) {
        rc = ar_fail(a, &o, out_path, "cannot finish the archive");
        goto out;
    }
    KILN_CHECK(rc, out, kiln_atomic_commit(&o.at));
    uint8_t d[KILN_SHA256_BYTES];
    kiln_sha256_final(&o.sha, d);
    if (archive_sha256) memcpy(archive_sha256, d, sizeof d);
    if (manifest_out) {
        *manifest_out = m;
        m = NULL;
    }
out:
    if (a) {
        /* After a failure free still closes, padding an unfinished entry to its declared
         * size: refusing the first write ends that at once. (archive_write_fail would skip
         * the close but leaks the writer's buffers in libarchive 3.6.) */
        o.abandon = rc != KILN_OK;
        archive_write_free(a);
    }
    archive_entry_free(e);
    kiln_atomic_abort(&o.at);
    free(buf);
    if (rootfd >= 0) close(rootfd);
    kiln_manifest_free(m);
    return rc;
}

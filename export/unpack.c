/* unpack.c - read .kiln archives: the manifest alone, inspect (manifest and card), and a
 * secure unpack that streams every file through sha256 into a private temporary directory,
 * checks it against the manifest and only then renames the directory into place.
 *
 * Files are created with openat() beneath the temporary directory's descriptor, each path
 * component opened with O_NOFOLLOW and each file with O_EXCL, after the entry's path was
 * checked to be relative, free of ".." and of odd characters. That enforces what libarchive's
 * ARCHIVE_EXTRACT_SECURE_NODOTDOT, _SECURE_SYMLINKS and _SECURE_NOABSOLUTEPATHS do, without
 * archive_write_disk's resolution against the process's working directory (its
 * NOABSOLUTEPATHS refuses the absolute path of our temporary directory, and chdir is not
 * something a library may do). Owners, permissions and times are never restored. */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "export_int.h"

void kiln_archive_limits_default(kiln_archive_limits *l) {
    l->max_total_bytes = 64ull << 30;
    l->max_entries = 10000;
    l->max_path = 255;
}

/* An entry's path as it may be printed: at most 120 bytes, control bytes as '?'. */
typedef struct shown {
    char s[128];
} shown;

static shown show(const char *p) {
    shown o;
    size_t i = 0;
    for (; p && p[i] && i < 120; i++)
        o.s[i] = (p[i] < 0x20 || p[i] == 0x7f) ? '?' : p[i];
    if (p && p[i]) {
        memcpy(o.s + i, "...", 3);
        i += 3;
    }
    o.s[i] = 0;
    return o;
}

static kiln_err ar_err(struct archive *a, kiln_err code, const char *path, const char *what) {
    const char *s = archive_error_string(a);
    return kiln_fail(code, "'%s': %s: %s", path, what, s ? s : "libarchive failed");
}

/* An archive file for libarchive: the descriptor kiln_open_input checked (a regular file), so
 * that what is read is what was checked, not whatever the path names a moment later. Freed by
 * libarchive's close callback, which it calls once, from archive_read_free, on every path (as
 * for archive_read_open_filename's own descriptor). */
typedef struct fd_source {
    int fd;
    unsigned char buf[1 << 16];
} fd_source;

static la_ssize_t fd_read(struct archive *a, void *ctx, const void **buf) {
    fd_source *s = ctx;
    *buf = s->buf;
    for (;;) {
        ssize_t n = read(s->fd, s->buf, sizeof s->buf);
        if (n >= 0) return (la_ssize_t)n;
        if (errno != EINTR) {
            archive_set_error(a, errno, "read failed: %s", strerror(errno));
            return -1;
        }
    }
}

static int fd_close(struct archive *a, void *ctx) {
    (void)a;
    fd_source *s = ctx;
    close(s->fd);
    free(s);
    return ARCHIVE_OK;
}

/* A reader of label that decodes only what kiln writes (zstd tar, and the uncompressed form):
 * no other decoder of libarchive's is reachable from an archive's bytes. The one place the
 * rule is written; both readers below start here. */
static kiln_err reader_new(const char *label, struct archive **out) {
    *out = NULL;
    struct archive *a = archive_read_new();
    if (!a) return kiln_fail(KILN_ERR_NOMEM, "out of memory opening '%s'", label);
    if (archive_read_support_filter_zstd(a) != ARCHIVE_OK ||
        archive_read_support_filter_none(a) != ARCHIVE_OK ||
        archive_read_support_format_tar(a) != ARCHIVE_OK) {
        kiln_err rc = ar_err(a, KILN_ERR_UNSUPPORTED, label, "cannot set up the reader");
        archive_read_free(a);
        return rc;
    }
    *out = a;
    return KILN_OK;
}

static kiln_err reader_open(const char *path, struct archive **out) {
    *out = NULL;
    struct archive *a;
    KILN_TRY(reader_new(path, &a));
    /* A regular file, refused at once when it is a FIFO or a device. */
    fd_source *src = kiln_malloc(sizeof *src);
    kiln_err orc = src ? kiln_open_input(path, &src->fd, NULL)
                       : kiln_fail(KILN_ERR_NOMEM, "out of memory opening '%s'", path);
    if (orc) {
        free(src);
        archive_read_free(a);
        return orc;
    }
    if (archive_read_open(a, src, NULL, fd_read, fd_close) != ARCHIVE_OK) {
        /* The file is there: what libarchive refuses is its content. */
        kiln_err rc = ar_err(a, KILN_ERR_FORMAT, path, "not a .kiln archive");
        archive_read_free(a);
        return rc;
    }
    *out = a;
    return KILN_OK;
}

typedef struct entry_info {
    char path[4097]; /* directories without their trailing '/' */
    bool is_dir;
    uint64_t size;
} entry_info;

/* Everything checked about an entry before a byte of its data is read. */
static kiln_err check_entry(struct archive_entry *e, const char *apath,
                            const kiln_archive_limits *lim, uint64_t *count, uint64_t *total,
                            entry_info *info) {
    ++*count;
    KILN_FAIL_IF(*count > lim->max_entries, KILN_ERR_LIMIT,
                 "'%s': more than %ju entries (the limit)", apath, (uintmax_t)lim->max_entries);
    const char *p = archive_entry_pathname(e);
    KILN_FAIL_IF(!p, KILN_ERR_FORMAT, "'%s': entry %ju has no readable path", apath,
                 (uintmax_t)*count);
    size_t len = strlen(p);
    KILN_FAIL_IF(len > lim->max_path || len >= sizeof info->path, KILN_ERR_LIMIT,
                 "'%s': entry '%s': path of %zu bytes, more than the limit of %ju", apath,
                 show(p).s, len, (uintmax_t)lim->max_path);
    if (archive_entry_hardlink(e))
        return kiln_fail(KILN_ERR_FORMAT,
                         "'%s': entry '%s': is a hard link to '%s'; only regular files and "
                         "directories are accepted",
                         apath, show(p).s, show(archive_entry_hardlink(e)).s);
    if (archive_entry_symlink(e) || archive_entry_filetype(e) == AE_IFLNK)
        return kiln_fail(KILN_ERR_FORMAT,
                         "'%s': entry '%s': is a symlink to '%s'; only regular files and "
                         "directories are accepted",
                         apath, show(p).s, show(archive_entry_symlink(e)).s);
    mode_t type = archive_entry_filetype(e);
    const char *what = type == AE_IFCHR    ? "a character device"
                       : type == AE_IFBLK  ? "a block device"
                       : type == AE_IFIFO  ? "a fifo"
                       : type == AE_IFSOCK ? "a socket"
                                           : "of an unknown type";
    KILN_FAIL_IF(type != AE_IFREG && type != AE_IFDIR, KILN_ERR_FORMAT,
                 "'%s': entry '%s': is %s; only regular files and directories are accepted", apath,
                 show(p).s, what);
    info->is_dir = type == AE_IFDIR;
    memcpy(info->path, p, len + 1);
    if (info->is_dir && len > 1 && info->path[len - 1] == '/') info->path[len - 1] = 0;
    KILN_FAIL_IF(
        !kiln_export_path_ok(info->path, sizeof info->path - 1), KILN_ERR_FORMAT,
        "'%s': entry '%s': path not allowed (absolute, with '.' or '..' components, or with "
        "characters outside [A-Za-z0-9._+-/])",
        apath, show(p).s);
    la_int64_t sz = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
    KILN_FAIL_IF(sz < 0, KILN_ERR_FORMAT, "'%s': entry '%s': negative size", apath, show(p).s);
    KILN_FAIL_IF(info->is_dir && sz != 0, KILN_ERR_FORMAT,
                 "'%s': entry '%s': a directory with data", apath, show(p).s);
    info->size = (uint64_t)sz;
    KILN_FAIL_IF(info->size > lim->max_total_bytes - *total, KILN_ERR_LIMIT,
                 "'%s': entry '%s': %ju bytes bring the total past the limit of %ju", apath,
                 show(p).s, (uintmax_t)info->size, (uintmax_t)lim->max_total_bytes);
    *total += info->size;
    return KILN_OK;
}

static kiln_err next_header(struct archive *a, const char *apath, struct archive_entry **e,
                            bool *eof) {
    int r = archive_read_next_header(a, e);
    *eof = r == ARCHIVE_EOF;
    if (r == ARCHIVE_OK || r == ARCHIVE_EOF) return KILN_OK;
    return ar_err(a, KILN_ERR_FORMAT, apath, "cannot read the next entry");
}

/* Read the current entry's data (size bytes, checked) into a new buffer. */
static kiln_err read_small(struct archive *a, const char *apath, const char *name, uint64_t size,
                           char **out) {
    *out = NULL;
    char *buf = kiln_malloc((size_t)size + 1);
    if (!buf) return KILN_ERR_NOMEM;
    size_t got = 0;
    for (;;) {
        la_ssize_t n = archive_read_data(a, buf + got, (size_t)size - got);
        if (n < 0) {
            free(buf);
            return kiln_errprefix(ar_err(a, KILN_ERR_FORMAT, apath, "cannot read data"),
                                  "entry '%s': ", name);
        }
        if (n == 0 || (got += (size_t)n) == size) break;
    }
    if (got != size) {
        free(buf);
        return kiln_fail(KILN_ERR_FORMAT, "'%s': entry '%s': truncated", apath, name);
    }
    buf[got] = 0;
    *out = buf;
    return KILN_OK;
}

/* The first entry must be manifest.json; parse it. With expect (verified by the caller), its
 * bytes must be expect's text before anything parses them. */
static kiln_err read_manifest_entry(struct archive *a, const char *apath,
                                    const kiln_archive_limits *lim, uint64_t *count,
                                    uint64_t *total, const kiln_manifest *expect,
                                    kiln_manifest **m) {
    *m = NULL;
    struct archive_entry *e;
    bool eof;
    entry_info info;
    KILN_TRY(next_header(a, apath, &e, &eof));
    KILN_FAIL_IF(eof, KILN_ERR_FORMAT, "'%s': empty archive (no %s)", apath, KILN_MANIFEST_NAME);
    KILN_TRY(check_entry(e, apath, lim, count, total, &info));
    KILN_FAIL_IF(info.is_dir || strcmp(info.path, KILN_MANIFEST_NAME), KILN_ERR_FORMAT,
                 "'%s': the first entry is '%s', not %s", apath, show(info.path).s,
                 KILN_MANIFEST_NAME);
    KILN_FAIL_IF(info.size > KILN_MANIFEST_MAX_BYTES, KILN_ERR_LIMIT,
                 "'%s': entry '%s': %ju bytes, more than the limit of %u", apath,
                 KILN_MANIFEST_NAME, (uintmax_t)info.size, KILN_MANIFEST_MAX_BYTES);
    KILN_FAIL_IF(expect && info.size != expect->text_len, KILN_ERR_VERIFY,
                 "'%s': entry '%s': %ju bytes, the signed manifest has %zu; not the signed "
                 "manifest",
                 apath, KILN_MANIFEST_NAME, (uintmax_t)info.size, expect->text_len);
    char *text;
    KILN_TRY(read_small(a, apath, KILN_MANIFEST_NAME, info.size, &text));
    if (expect && memcmp(text, expect->text, expect->text_len) != 0) {
        free(text);
        return kiln_fail(KILN_ERR_VERIFY, "'%s': entry '%s': not the signed manifest", apath,
                         KILN_MANIFEST_NAME);
    }
    kiln_err rc = kiln_manifest_parse(text, (size_t)info.size, KILN_MANIFEST_NAME, m);
    free(text);
    if (rc && rc != KILN_ERR_NOMEM) kiln_errprefix(rc, "'%s': entry ", apath);
    return rc;
}

kiln_err kiln_archive_read_manifest(const char *archive_path, kiln_manifest **out) {
    *out = NULL;
    kiln_archive_limits lim;
    kiln_archive_limits_default(&lim);
    struct archive *a;
    KILN_TRY(reader_open(archive_path, &a));
    uint64_t count = 0, total = 0;
    kiln_err rc = read_manifest_entry(a, archive_path, &lim, &count, &total, NULL, out);
    archive_read_free(a);
    return rc;
}

/* Read the current entry (info) as the listed file f: its size and sha256 against the
 * manifest's, the bytes into *text. */
static kiln_err read_listed(struct archive *a, const char *apath, const entry_info *info,
                            const kiln_manifest_file *f, char **text) {
    *text = NULL;
    KILN_FAIL_IF(info->size != f->size, KILN_ERR_VERIFY,
                 "'%s': entry '%s': %ju bytes, the manifest says %ju", apath, f->path,
                 (uintmax_t)info->size, (uintmax_t)f->size);
    KILN_TRY(read_small(a, apath, f->path, info->size, text));
    uint8_t d[KILN_SHA256_BYTES];
    kiln_sha256(*text, (size_t)info->size, d);
    if (memcmp(d, f->sha256, sizeof d) != 0) {
        free(*text);
        *text = NULL;
        return kiln_fail(KILN_ERR_VERIFY, "'%s': entry '%s': sha256 differs from the manifest",
                         apath, f->path);
    }
    return KILN_OK;
}

/* The source reader (below): a failure while its source failed is the source's. */
typedef struct src_reader src_reader;
static kiln_err open_either(const char *archive_path, src_reader *r, const char *label,
                            struct archive **a);
static kiln_err source_rc(const src_reader *r, kiln_err rc);

/* kiln_archive_inspect_with from archive_path or from sr's source (label naming it), the first
 * entry held to expect when not NULL. */
static kiln_err inspect_from(const char *archive_path, src_reader *sr, const char *label,
                             const kiln_manifest *expect, const char *also, uint64_t max,
                             kiln_manifest **manifest, json_t **card, char **bytes, size_t *len) {
    *manifest = NULL;
    *card = NULL;
    if (bytes) *bytes = NULL;
    if (len) *len = 0;
    kiln_archive_limits lim;
    kiln_archive_limits_default(&lim);
    struct archive *a;
    KILN_TRY(source_rc(sr, open_either(archive_path, sr, label, &a)));
    uint64_t count = 0, total = 0;
    kiln_manifest *m = NULL;
    char *text = NULL, *xtext = NULL;
    kiln_err rc;
    KILN_CHECK(rc, out, read_manifest_entry(a, label, &lim, &count, &total, expect, &m));
    const kiln_manifest_file *cf = kiln_manifest_find(m, "card.json");
    KILN_CHECK_IF(rc, out, cf->size > KILN_CARD_MAX_BYTES, KILN_ERR_LIMIT,
                  "'%s': entry 'card.json': %ju bytes, more than the limit of %u", label,
                  (uintmax_t)cf->size, KILN_CARD_MAX_BYTES);
    /* The other file, when asked for, listed and not over max (one over it: its size only). */
    const kiln_manifest_file *xf =
        also && bytes && len && strcmp(also, "card.json") ? kiln_manifest_find(m, also) : NULL;
    if (xf && (xf->size > max || xf->size > SIZE_MAX - 1)) {
        *len = (size_t)(xf->size > SIZE_MAX ? SIZE_MAX : xf->size);
        xf = NULL;
    }
    bool got_card = false, got_x = !xf;
    while (!got_card || !got_x) {
        struct archive_entry *e;
        bool eof;
        entry_info info;
        KILN_CHECK(rc, out, next_header(a, label, &e, &eof));
        KILN_CHECK_IF(rc, out, eof, KILN_ERR_VERIFY,
                      "'%s': entry '%s': listed in the manifest but missing", label,
                      got_card ? xf->path : "card.json");
        KILN_CHECK(rc, out, check_entry(e, label, &lim, &count, &total, &info));
        if (info.is_dir) continue; /* the reader skips the data of what is not read */
        if (!got_card && !strcmp(info.path, "card.json")) {
            KILN_CHECK(rc, out, read_listed(a, label, &info, cf, &text));
            if ((rc = kiln_json_parse(text, (size_t)info.size, "card.json", card))) {
                kiln_errprefix(rc, "'%s': entry ", label);
                goto out;
            }
            got_card = true;
        } else if (!got_x && !strcmp(info.path, xf->path)) {
            KILN_CHECK(rc, out, read_listed(a, label, &info, xf, &xtext));
            *len = (size_t)info.size;
            got_x = true;
        }
    }
out:
    free(text);
    archive_read_free(a);
    if (rc) {
        rc = source_rc(sr, rc);
        kiln_manifest_free(m);
        json_decref(*card);
        *card = NULL;
        free(xtext);
        if (len) *len = 0;
    } else {
        *manifest = m;
        if (bytes) *bytes = xtext;
    }
    return rc;
}

kiln_err kiln_archive_inspect(const char *archive_path, kiln_manifest **manifest, json_t **card) {
    return kiln_archive_inspect_with(archive_path, NULL, 0, manifest, card, NULL, NULL);
}

kiln_err kiln_archive_inspect_with(const char *archive_path, const char *also, uint64_t max,
                                   kiln_manifest **manifest, json_t **card, char **bytes,
                                   size_t *len) {
    return inspect_from(archive_path, NULL, archive_path, NULL, also, max, manifest, card, bytes,
                        len);
}

/* ---- unpack ------------------------------------------------------------------- */

static kiln_err write_all(int fd, const void *buf, size_t len, const char *apath,
                          const char *name) {
    const char *p = buf;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
            return kiln_fail_errno(KILN_ERR_IO, "'%s': entry '%s': cannot write", apath, name);
        p += n;
        len -= (size_t)n;
    }
    return KILN_OK;
}

/* Written bytes handed to the disk at a time (sync_file_range) while a file is unpacked. */
#define UNPACK_FLUSH_BYTES (8u << 20)

/* Stream the current entry into a new file beneath tmpfd, hashing as it goes; tmpfd < 0
 * (kiln_archive_check) hashes and checks the same way without writing anything. */
static kiln_err extract_file(struct archive *a, const char *apath, int tmpfd,
                             const entry_info *info, const kiln_manifest_file *f,
                             unsigned char *buf) {
    KILN_FAIL_IF(info->size != f->size, KILN_ERR_VERIFY,
                 "'%s': entry '%s': %ju bytes, the manifest says %ju", apath, info->path,
                 (uintmax_t)info->size, (uintmax_t)f->size);
    int fd = -1;
    if (tmpfd >= 0 && (fd = kiln_export_openat(tmpfd, info->path, O_WRONLY | O_CREAT, 0644)) < 0)
        return kiln_fail_errno(KILN_ERR_IO, "'%s': entry '%s': cannot create", apath, info->path);
    kiln_err rc = KILN_OK;
    kiln_sha256_state st;
    kiln_sha256_init(&st);
    uint64_t got = 0, flushed = 0;
    for (;;) {
        la_ssize_t n = archive_read_data(a, buf, KILN_EXPORT_BUF);
        if (n < 0) {
            rc = kiln_errprefix(ar_err(a, KILN_ERR_FORMAT, apath, "cannot read data"),
                                "entry '%s': ", info->path);
            goto out;
        }
        if (n == 0) break;
        got += (uint64_t)n;
        KILN_CHECK_IF(rc, out, got > f->size, KILN_ERR_VERIFY,
                      "'%s': entry '%s': more data than the manifest says", apath, info->path);
        kiln_sha256_update(&st, buf, (size_t)n);
        if (fd >= 0) KILN_CHECK(rc, out, write_all(fd, buf, (size_t)n, apath, info->path));
        /* Start the disk on what is written while the rest comes (a pull's download is still
         * landing): the fsync below then waits for the tail only, not for the whole file,
         * which the kernel would otherwise hold dirty until then. Best effort. */
        if (fd >= 0 && got - flushed >= UNPACK_FLUSH_BYTES) {
            (void)sync_file_range(fd, (off64_t)flushed, (off64_t)(got - flushed),
                                  SYNC_FILE_RANGE_WRITE);
            flushed = got;
        }
    }
    uint8_t d[KILN_SHA256_BYTES];
    kiln_sha256_final(&st, d);
    KILN_CHECK_IF(rc, out, got != f->size, KILN_ERR_FORMAT, "'%s': entry '%s': truncated", apath,
                  info->path);
    KILN_CHECK_IF(rc, out, memcmp(d, f->sha256, sizeof d) != 0, KILN_ERR_VERIFY,
                  "'%s': entry '%s': sha256 differs from the manifest", apath, info->path);
    KILN_CHECK_IF(rc, out, fd >= 0 && fsync(fd) != 0, KILN_ERR_IO,
                  "'%s': entry '%s': cannot fsync: %s", apath, info->path, strerror(errno));
out:
    if (fd >= 0) close(fd);
    return rc;
}

/* A directory entry is accepted only as the parent of a listed file. */
static bool is_listed_dir(const kiln_manifest *m, const char *dir) {
    size_t l = strlen(dir), lo = 0, hi = m->nfiles;
    while (lo < hi) { /* first path >= dir + "/" */
        size_t mid = lo + (hi - lo) / 2;
        int c = strncmp(m->files[mid].path, dir, l);
        if (c < 0 || (c == 0 && (unsigned char)m->files[mid].path[l] < '/'))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < m->nfiles && !strncmp(m->files[lo].path, dir, l) && m->files[lo].path[l] == '/';
}

static kiln_err unpack_into(struct archive *a, const char *apath, int tmpfd,
                            const kiln_archive_limits *lim, const kiln_manifest *expect,
                            kiln_manifest **mout) {
    uint64_t count = 0, total = 0;
    kiln_manifest *m = NULL;
    bool *seen = NULL;
    unsigned char *buf = NULL;
    kiln_err rc;
    KILN_CHECK(rc, out, read_manifest_entry(a, apath, lim, &count, &total, expect, &m));
    if (tmpfd >= 0) {
        int fd = kiln_export_openat(tmpfd, KILN_MANIFEST_NAME, O_WRONLY | O_CREAT, 0644);
        KILN_CHECK_IF(rc, out, fd < 0, KILN_ERR_IO, "'%s': entry '%s': cannot create: %s", apath,
                      KILN_MANIFEST_NAME, strerror(errno));
        rc = write_all(fd, m->text, m->text_len, apath, KILN_MANIFEST_NAME);
        close(fd);
        if (rc) goto out;
    }
    seen = kiln_calloc(m->nfiles, sizeof *seen);
    buf = kiln_malloc(KILN_EXPORT_BUF);
    KILN_CHECK_IF(rc, out, !seen || !buf, KILN_ERR_NOMEM, "out of memory unpacking '%s'", apath);
    for (;;) {
        struct archive_entry *e;
        bool eof;
        entry_info info;
        KILN_CHECK(rc, out, next_header(a, apath, &e, &eof));
        if (eof) break;
        KILN_CHECK(rc, out, check_entry(e, apath, lim, &count, &total, &info));
        if (info.is_dir) {
            /* Parents are created with their files; an empty or unlisted directory is extra. */
            KILN_CHECK_IF(rc, out, !is_listed_dir(m, info.path), KILN_ERR_VERIFY,
                          "'%s': entry '%s': a directory that holds no file of the manifest", apath,
                          info.path);
            continue;
        }
        const kiln_manifest_file *f = kiln_manifest_find(m, info.path);
        KILN_CHECK_IF(rc, out, !strcmp(info.path, KILN_MANIFEST_NAME), KILN_ERR_FORMAT,
                      "'%s': entry '%s': appears twice", apath, info.path);
        KILN_CHECK_IF(rc, out, !f, KILN_ERR_VERIFY, "'%s': entry '%s': not in the manifest", apath,
                      info.path);
        size_t idx = (size_t)(f - m->files);
        KILN_CHECK_IF(rc, out, seen[idx], KILN_ERR_FORMAT, "'%s': entry '%s': appears twice", apath,
                      info.path);
        seen[idx] = true;
        KILN_CHECK(rc, out, extract_file(a, apath, tmpfd, &info, f, buf));
    }
    for (size_t i = 0; i < m->nfiles; i++)
        KILN_CHECK_IF(rc, out, !seen[i], KILN_ERR_VERIFY,
                      "'%s': entry '%s': listed in the manifest but missing", apath,
                      m->files[i].path);
    if (mout) {
        *mout = m;
        m = NULL;
    }
out:
    free(buf);
    free(seen);
    kiln_manifest_free(m);
    return rc;
}

/* A source's bytes for libarchive; the source's own failure kept to be returned as such. */
struct src_reader {
    const kiln_archive_source *src;
    kiln_err rc;
    char msg[1024];
};

static la_ssize_t src_read(struct archive *a, void *ctx, const void **buf) {
    src_reader *r = ctx;
    size_t n = 0;
    kiln_err rc = r->src->read(r->src->ctx, buf, &n);
    if (rc) {
        r->rc = rc;
        snprintf(r->msg, sizeof r->msg, "%s", kiln_errmsg());
        archive_set_error(a, EIO, "%s", r->msg);
        return -1;
    }
    return (la_ssize_t)n;
}

static kiln_err source_open(src_reader *r, const char *label, struct archive **out) {
    *out = NULL;
    struct archive *a;
    KILN_TRY(reader_new(label, &a));
    if (archive_read_open(a, r, NULL, src_read, NULL) != ARCHIVE_OK) {
        kiln_err rc = r->rc ? kiln_fail(r->rc, "%s", r->msg)
                            : ar_err(a, KILN_ERR_FORMAT, label, "not a .kiln archive");
        archive_read_free(a);
        return rc;
    }
    *out = a;
    return KILN_OK;
}

/* The reader of archive_path, or of r's source. */
static kiln_err open_either(const char *archive_path, src_reader *r, const char *label,
                            struct archive **a) {
    return r ? source_open(r, label, a) : reader_open(archive_path, a);
}

/* A failure while r's source failed is the source's. */
static kiln_err source_rc(const src_reader *r, kiln_err rc) {
    if (rc && r && r->rc) return kiln_fail(r->rc, "%s", r->msg);
    return rc;
}

static kiln_err check_from(const char *archive_path, src_reader *r, const char *label,
                           const kiln_archive_limits *limits, const kiln_manifest *expect,
                           kiln_manifest **manifest_out) {
    if (manifest_out) *manifest_out = NULL;
    kiln_archive_limits lim;
    if (limits)
        lim = *limits;
    else
        kiln_archive_limits_default(&lim);
    struct archive *a;
    KILN_TRY(source_rc(r, open_either(archive_path, r, label, &a)));
    kiln_err rc = source_rc(r, unpack_into(a, label, -1, &lim, expect, manifest_out));
    archive_read_free(a);
    return rc;
}

kiln_err kiln_archive_check(const char *archive_path, const kiln_archive_limits *limits,
                            kiln_manifest **manifest_out) {
    return check_from(archive_path, NULL, archive_path, limits, NULL, manifest_out);
}

static kiln_err unpack_from(const char *archive_path, src_reader *sr, const char *label,
                            const char *out_dir, const kiln_archive_limits *limits,
                            const kiln_manifest *expect, kiln_manifest **manifest_out) {
    if (manifest_out) *manifest_out = NULL;
    kiln_archive_limits lim;
    if (limits)
        lim = *limits;
    else
        kiln_archive_limits_default(&lim);
    struct stat sb;
    KILN_FAIL_IF(lstat(out_dir, &sb) == 0, KILN_ERR_CONFLICT,
                 "'%s' exists already; unpack creates it", out_dir);
    if (errno != ENOENT) return kiln_fail_errno(KILN_ERR_IO, "cannot stat '%s'", out_dir);
    char *parent = kiln_dirname(out_dir);
    if (!parent) return KILN_ERR_NOMEM;
    const char *base = strrchr(out_dir, '/') ? strrchr(out_dir, '/') + 1 : out_dir;
    char *tmp = kiln_asprintf("%s/.%s.unpack-XXXXXX", parent, base);
    kiln_err rc = KILN_OK;
    int tmpfd = -1;
    struct archive *a = NULL;
    bool made = false;
    kiln_manifest *m = NULL;
    KILN_CHECK_IF(rc, out, !tmp, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK_IF(rc, out, !*base || !strcmp(base, ".") || !strcmp(base, ".."), KILN_ERR_USAGE,
                  "'%s' cannot be an unpack target", out_dir);
    KILN_CHECK_IF(rc, out, !mkdtemp(tmp), KILN_ERR_IO,
                  "cannot create a temporary directory beside '%s': %s", out_dir, strerror(errno));
    made = true;
    tmpfd = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    KILN_CHECK_IF(rc, out, tmpfd < 0, KILN_ERR_IO, "cannot open '%s': %s", tmp, strerror(errno));
    KILN_CHECK(rc, out, source_rc(sr, open_either(archive_path, sr, label, &a)));
    KILN_CHECK(rc, out, source_rc(sr, unpack_into(a, label, tmpfd, &lim, expect, &m)));
    KILN_CHECK_IF(rc, out, fchmod(tmpfd, 0755) != 0 || fsync(tmpfd) != 0, KILN_ERR_IO,
                  "cannot finish '%s': %s", tmp, strerror(errno));
    /* RENAME_NOREPLACE: a directory that appeared meanwhile (even empty) is not replaced. */
    int r = renameat2(AT_FDCWD, tmp, AT_FDCWD, out_dir, RENAME_NOREPLACE);
    if (r != 0 && (errno == EINVAL || errno == ENOSYS)) { /* a file system without it */
        errno = EEXIST;
        r = lstat(out_dir, &sb) == 0 ? -1 : rename(tmp, out_dir);
    }
    if (r != 0) {
        if (errno == EEXIST || errno == ENOTEMPTY)
            rc = kiln_fail(KILN_ERR_CONFLICT, "'%s' exists already; unpack creates it", out_dir);
        else
            rc = kiln_fail_errno(KILN_ERR_IO, "cannot rename '%s' to '%s'", tmp, out_dir);
        goto out;
    }
    made = false;
    KILN_CHECK(rc, out, kiln_fsync_dir(parent));
    if (manifest_out) {
        *manifest_out = m;
        m = NULL;
    }
out:
    if (a) archive_read_free(a);
    if (tmpfd >= 0) close(tmpfd);
    if (made) kiln_export_rmtree(tmp);
    kiln_manifest_free(m);
    free(tmp);
    free(parent);
    return rc;
}

kiln_err kiln_archive_unpack(const char *archive_path, const char *out_dir,
                             const kiln_archive_limits *limits, kiln_manifest **manifest_out) {
    return unpack_from(archive_path, NULL, archive_path, out_dir, limits, NULL, manifest_out);
}

kiln_err kiln_archive_unpack_source(const kiln_archive_source *src, const char *label,
                                    const char *out_dir, const kiln_archive_limits *limits,
                                    const kiln_manifest *expect, kiln_manifest **manifest_out) {
    src_reader r = {.src = src};
    if (!out_dir) return check_from(NULL, &r, label, limits, expect, manifest_out);
    return unpack_from(NULL, &r, label, out_dir, limits, expect, manifest_out);
}

kiln_err kiln_archive_inspect_source(const kiln_archive_source *src, const char *label,
                                     const kiln_manifest *expect, const char *also, uint64_t max,
                                     kiln_manifest **manifest, json_t **card, char **bytes,
                                     size_t *len) {
    src_reader r = {.src = src};
    return inspect_from(NULL, &r, label, expect, also, max, manifest, card, bytes, len);
}

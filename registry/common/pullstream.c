/* pullstream.c - a download read as it lands: the partial file followed by a thread of its own
 * that feeds every byte to the hash pipe (SHA-256 and BLAKE2b-512 for the record's digest and
 * the release signatures' prehash) and, when the pull has a signed manifest to hold it to, to
 * the secure unpack into the pull's private directory (a mirror's sync, which stores the archive
 * as it is: to reading its manifest, card and validation report). So a pull's checks are done,
 * or nearly, when its last byte lands, and every digest comes from one read of each byte.
 *
 * The download (http.c, reg_download_follow) says how far the partial file is written
 * (reg_follow_grow), that it starts over (reg_follow_reset: a registry that ignored Range, or
 * a partial longer than declared) and that it ended (reg_follow_end). What the follower read
 * before a reset is thrown away: the hashes start over, and an unpack that had begun is
 * marked spoiled, which sends the pull down the strict path from the file. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "export.h"
#include "registry_common.h"

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

void reg_rmtree(const char *path) {
    if (path) nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

struct reg_follow {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t avail; /* bytes of the partial written and valid, from its start */
    uint64_t need;  /* the avail its reader waits for: no wake-up before (0: any growth) */
    unsigned gen;   /* resets so far */
    bool ended, complete;
};

kiln_err reg_follow_new(reg_follow **out) {
    *out = NULL;
    reg_follow *f = kiln_calloc(1, sizeof *f);
    if (!f) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    *out = f;
    return KILN_OK;
}

void reg_follow_free(reg_follow *f) {
    if (!f) return;
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
}

void reg_follow_grow(reg_follow *f, uint64_t have) {
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    if (have > f->avail) {
        f->avail = have;
        /* The download writes what each recv() gave (16-64 KiB on loopback); the reader reads
         * a whole chunk at a time, so it is woken once a chunk, not once a write. */
        if (have >= f->need) pthread_cond_broadcast(&f->cv);
    }
    pthread_mutex_unlock(&f->mu);
}

void reg_follow_reset(reg_follow *f) {
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    f->gen++;
    f->avail = 0;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

void reg_follow_end(reg_follow *f, bool complete) {
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    if (!f->ended) {
        f->ended = true;
        f->complete = complete;
    }
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

struct reg_stream {
    reg_follow *f;
    const char *partial, *label, *staged;
    const kiln_manifest *expect;
    bool inspect; /* a mirror's: the metadata read (reg_stream_start_meta), nothing unpacked */
    bool report;  /* validation.json too (decompressing up to it: it comes after the weights) */
    uint64_t size;
    int fd;
    uint64_t off;
    unsigned gen;
    bool spoiled; /* a reset came after the unpack had begun */
    kiln_hashpipe *pipe;
    pthread_t th;
    bool started;
    reg_stream_result res;
};

/* The next bytes of the partial into the pipe's next slot: waits for the download; a reset
 * is KILN_ERR_INTERRUPTED (the caller starts over), and so is a download that ended short. */
static kiln_err follow_read(void *ctx, const void **buf, size_t *n) {
    reg_stream *s = ctx;
    *n = 0;
    *buf = NULL;
    reg_follow *f = s->f;
    /* A whole chunk, or the rest of the archive: fewer, larger reads and posts to the hashers
     * (a wake-up per write of the download cost more CPU than the hashing of small archives). */
    uint64_t want = s->size > s->off && s->size - s->off < KILN_HASHPIPE_CHUNK
                        ? s->size - s->off
                        : KILN_HASHPIPE_CHUNK;
    pthread_mutex_lock(&f->mu);
    f->need = s->off + want;
    while (f->avail < f->need && !f->ended && f->gen == s->gen)
        pthread_cond_wait(&f->cv, &f->mu);
    f->need = 0;
    bool reset = f->gen != s->gen, ended = f->ended, complete = f->complete;
    uint64_t avail = f->avail;
    pthread_mutex_unlock(&f->mu);
    if (reset)
        return kiln_fail(KILN_ERR_INTERRUPTED, "'%s': the download started over", s->partial);
    if (s->off >= avail) {
        if (ended && complete && s->off == s->size) return KILN_OK;
        return kiln_fail(KILN_ERR_INTERRUPTED, "'%s': the download ended after %llu bytes",
                         s->partial, (unsigned long long)s->off);
    }
    if (s->fd < 0) {
        s->fd = open(s->partial, O_RDONLY | O_CLOEXEC);
        if (s->fd < 0) return kiln_fail_errno(KILN_ERR_IO, "cannot open '%s'", s->partial);
    }
    uint8_t *slot = kiln_hashpipe_slot(s->pipe);
    size_t len =
        avail - s->off < KILN_HASHPIPE_CHUNK ? (size_t)(avail - s->off) : KILN_HASHPIPE_CHUNK;
    ssize_t got;
    do
        got = pread(s->fd, slot, len, (off_t)s->off);
    while (got < 0 && errno == EINTR);
    if (got < 0) return kiln_fail_errno(KILN_ERR_IO, "cannot read '%s'", s->partial);
    if (got == 0) return kiln_fail(KILN_ERR_IO, "'%s': shorter than written", s->partial);
    /* Bytes read across a reset may be the old or the new ones: thrown away. */
    pthread_mutex_lock(&f->mu);
    reset = f->gen != s->gen;
    pthread_mutex_unlock(&f->mu);
    if (reset)
        return kiln_fail(KILN_ERR_INTERRUPTED, "'%s': the download started over", s->partial);
    kiln_hashpipe_post(s->pipe, (size_t)got);
    s->off += (uint64_t)got;
    *buf = slot;
    *n = (size_t)got;
    return KILN_OK;
}

/* Hash what the unpack did not read (or everything, with no unpack), starting over at each
 * reset, until the download ended. */
static kiln_err drain(reg_stream *s) {
    for (;;) {
        const void *b;
        size_t n;
        kiln_err rc = follow_read(s, &b, &n);
        if (rc == KILN_ERR_INTERRUPTED) {
            pthread_mutex_lock(&s->f->mu);
            bool reset = s->f->gen != s->gen;
            s->gen = s->f->gen;
            pthread_mutex_unlock(&s->f->mu);
            if (!reset) return rc; /* ended short */
            kiln_errclear();
            kiln_hashpipe_reset(s->pipe);
            s->off = 0;
            s->spoiled = true;
            continue;
        }
        if (rc || n == 0) return rc;
    }
}

static void *stream_main(void *arg) {
    reg_stream *s = arg;
    reg_stream_result *r = &s->res;
    if (s->staged) {
        kiln_archive_source src = {follow_read, s};
        r->unpack_rc =
            kiln_archive_unpack_source(&src, s->label, s->staged, NULL, s->expect, &r->manifest);
        if (r->unpack_rc) snprintf(r->unpack_msg, sizeof r->unpack_msg, "%s", kiln_errmsg());
    } else if (s->inspect) {
        kiln_archive_source src = {follow_read, s};
        json_t *card = NULL;
        char *vtext = NULL;
        size_t vlen = 0;
        r->unpack_rc = kiln_archive_inspect_source(
            &src, s->label, s->expect, s->report ? "validation.json" : NULL, REG_VALIDATION_MAX,
            &r->manifest, &card, &vtext, &vlen);
        if (!r->unpack_rc)
            r->unpack_rc =
                reg_archive_meta_take(s->label, r->manifest, card, vtext, vlen, &r->meta);
        if (r->unpack_rc) snprintf(r->unpack_msg, sizeof r->unpack_msg, "%s", kiln_errmsg());
    }
    kiln_err rc = drain(s);
    kiln_hashpipe_finish(s->pipe, r->sha256, r->blake2b, &r->bytes);
    kiln_debug("download reader: %.3f s CPU (reading the partial%s)", kiln_thread_cpu_s(),
               s->staged ? ", decompressing, hashing and writing every file"
               : s->inspect
                   ? (s->report ? ", decompressing it to read the manifest, card and report"
                                : ", decompressing its manifest and card")
                   : "");
    r->hashed = rc == KILN_OK && r->bytes == s->size;
    r->unpacked = s->staged && !r->unpack_rc && !s->spoiled && r->hashed;
    r->inspected = s->inspect && !r->unpack_rc && !s->spoiled && r->hashed;
    if (s->staged && !r->unpack_rc && !r->unpacked) reg_rmtree(s->staged);
    if (!r->inspected) reg_archive_meta_release(&r->meta);
    if (!r->unpacked && !r->inspected) {
        kiln_manifest_free(r->manifest);
        r->manifest = NULL;
    }
    return NULL;
}

static kiln_err stream_start(reg_follow *f, const char *partial, uint64_t size, const char *label,
                             const char *staged, const kiln_manifest *expect, bool inspect,
                             bool report, reg_stream **out) {
    *out = NULL;
    reg_stream *s = kiln_calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    s->f = f;
    s->partial = partial;
    s->size = size;
    s->label = label;
    s->staged = expect ? staged : NULL;
    s->expect = expect;
    s->inspect = expect && inspect; /* nothing is read before a signed manifest holds it */
    s->report = report;
    s->fd = -1;
    pthread_mutex_lock(&f->mu);
    s->gen = f->gen;
    pthread_mutex_unlock(&f->mu);
    kiln_err rc = kiln_hashpipe_new(KILN_HASH_SHA256 | KILN_HASH_BLAKE2B, true, &s->pipe);
    if (!rc && pthread_create(&s->th, NULL, stream_main, s) != 0)
        rc = kiln_fail(KILN_ERR_INTERNAL, "cannot start the download's reader thread");
    if (rc) {
        kiln_hashpipe_free(s->pipe);
        free(s);
        return rc;
    }
    s->started = true;
    *out = s;
    return KILN_OK;
}

kiln_err reg_stream_start(reg_follow *f, const char *partial, uint64_t size, const char *label,
                          const char *staged, const kiln_manifest *expect, reg_stream **out) {
    return stream_start(f, partial, size, label, staged, expect, false, false, out);
}

kiln_err reg_stream_start_meta(reg_follow *f, const char *partial, uint64_t size, const char *label,
                               const kiln_manifest *expect, bool report, reg_stream **out) {
    return stream_start(f, partial, size, label, NULL, expect, true, report, out);
}

void reg_stream_join(reg_stream *s, reg_stream_result *res) {
    memset(res, 0, sizeof *res);
    if (!s) return;
    reg_follow_end(s->f, false); /* a download that never said: it is over */
    pthread_join(s->th, NULL);
    *res = s->res;
    if (s->fd >= 0) close(s->fd);
    kiln_hashpipe_free(s->pipe);
    free(s);
}

/*
 * core.h - shared plumbing for every module: errors, logging, JSON, hashing,
 * files written atomically, safetensors, the counter-based generator.
 * Nothing here prints to stdout or exits.
 */
#ifndef KILN_CORE_H
#define KILN_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "kiln.h"
#include "philox.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define KILN_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- errors ---------------------------------------------------------------- */

/* Set this thread's message and return code. */
kiln_err kiln_fail(kiln_err code, const char *fmt, ...) KILN_PRINTF(2, 3);
/* As kiln_fail, with ": <strerror(errno)>" appended (errno read on entry). */
kiln_err kiln_fail_errno(kiln_err code, const char *fmt, ...) KILN_PRINTF(2, 3);
/* The errno the current message came from (kiln_fail_errno), 0 when it came from none: what
 * kind of I/O failure it was (ENOSPC: a full disk). kiln_errprefix keeps it. */
int kiln_err_errno(void);
/* Prepend context to the current message ("'run/ckpt': " + msg); returns code. */
kiln_err kiln_errprefix(kiln_err code, const char *fmt, ...) KILN_PRINTF(2, 3);
/* Clear this thread's message. */
void kiln_errclear(void);

#define KILN_TRY(expr)                                                                             \
    do {                                                                                           \
        kiln_err kiln_try_rc_ = (expr);                                                            \
        if (kiln_try_rc_ != KILN_OK) return kiln_try_rc_;                                          \
    } while (0)

#define KILN_FAIL_IF(cond, code, ...)                                                              \
    do {                                                                                           \
        if (cond) return kiln_fail((code), __VA_ARGS__);                                           \
    } while (0)

/* For functions that clean up: set rc and jump to label on failure. */
#define KILN_CHECK(rc, label, expr)                                                                \
    do {                                                                                           \
        (rc) = (expr);                                                                             \
        if ((rc) != KILN_OK) goto label;                                                           \
    } while (0)

#define KILN_CHECK_IF(rc, label, cond, code, ...)                                                  \
    do {                                                                                           \
        if (cond) {                                                                                \
            (rc) = kiln_fail((code), __VA_ARGS__);                                                 \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* ---- logging (stderr) ------------------------------------------------------ */

typedef enum { KILN_LOG_DEBUG = 0, KILN_LOG_INFO = 1, KILN_LOG_WARN = 2, KILN_LOG_ERROR = 3 } kiln_log_level;

/* Messages below the level are dropped; the default is INFO, or $KILN_LOG
 * (debug|info|warn|error) read once by the CLI. */
void kiln_log_set_level(kiln_log_level level);
kiln_log_level kiln_log_get_level(void);
void kiln_log(kiln_log_level level, const char *fmt, ...) KILN_PRINTF(2, 3);
#define kiln_debug(...) kiln_log(KILN_LOG_DEBUG, __VA_ARGS__)
#define kiln_info(...) kiln_log(KILN_LOG_INFO, __VA_ARGS__)
#define kiln_warn(...) kiln_log(KILN_LOG_WARN, __VA_ARGS__)

/* ---- memory ------------------------------------------------------------------ */

/* calloc/malloc that set KILN_ERR_NOMEM with a message on failure; free() the result.
 * kiln_alloc_fail_after(n) makes the nth following allocation fail (tests; 0 = never). */
void *kiln_calloc(size_t n, size_t size);
void *kiln_malloc(size_t size);
char *kiln_strdup(const char *s);
void kiln_alloc_fail_after(long n);
/* Overflow-checked a*b; false on overflow. */
static inline bool kiln_mul_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
/* One allocation carved into many arrays, in two passes over the same calls: the first
 * (base NULL) only sums the bytes into used; the second, over a block of at least that many
 * bytes, hands out the arrays. Each starts at a multiple of align (a power of two) past base. */
typedef struct kiln_carver {
    char *base;
    size_t used, align;
} kiln_carver;
static inline void *kiln_carve(kiln_carver *c, size_t n, size_t elem) {
    size_t at = (c->used + c->align - 1) & ~(c->align - 1);
    c->used = at + n * elem;
    return c->base ? c->base + at : NULL;
}
static inline float *kiln_carve_f32(kiln_carver *c, size_t n) {
    return (float *)kiln_carve(c, n, sizeof(float));
}
static inline int32_t *kiln_carve_i32(kiln_carver *c, size_t n) {
    return (int32_t *)kiln_carve(c, n, sizeof(int32_t));
}
/* Formatted string into a new buffer; caller frees. NULL (and NOMEM set) on failure. */
char *kiln_asprintf(const char *fmt, ...) KILN_PRINTF(1, 2);
/* What an error about an unknown name adds, into buf: " (did you mean 'steps'?)" when one of
 * the n names is a likely typo of word (edit distance, a swap of neighbours counting one: 1
 * for words under 6 characters, else a third of the length; the closest, the first of
 * equals), then a new line and "<what>: a, b, c" listing every
 * name (what NULL: no list, for lists too long to print), so that the error's first line says
 * what failed and the detail follows. The names
 * are the first member (a const char *) of n structs stride bytes apart: a table's rows. */
void kiln_name_hint(const char *word, const void *table, size_t n, size_t stride,
                    const char *what, char *buf, size_t len);

/* ---- hashing (libsodium) --------------------------------------------------- */

#define KILN_SHA256_BYTES 32
#define KILN_SHA256_HEX 65 /* 64 hex digits and NUL */

/* SHA-256 is OpenSSL's libcrypto (the CPU's SHA extensions where it has them: about
 * 1.8 GB/s against libsodium's portable 0.33 GB/s on the bench machine, docs/PERFORMANCE.md);
 * BLAKE2b is libsodium's. */
void kiln_sha256(const void *data, size_t len, uint8_t out[KILN_SHA256_BYTES]);
kiln_err kiln_sha256_file(const char *path, uint8_t out[KILN_SHA256_BYTES]);
/* Streamed SHA-256: init, any number of updates, final. A plain struct: nothing to free,
 * nothing that fails. */
typedef union kiln_sha256_state {
    unsigned char opaque[128];
    uint64_t align_;
} kiln_sha256_state;
void kiln_sha256_init(kiln_sha256_state *s);
void kiln_sha256_update(kiln_sha256_state *s, const void *data, size_t len);
void kiln_sha256_final(kiln_sha256_state *s, uint8_t out[KILN_SHA256_BYTES]);
void kiln_blake2b(const void *data, size_t len, uint8_t *out, size_t outlen);
/* BLAKE2b of a file's bytes, outlen 16..64, streamed. */
kiln_err kiln_blake2b_file(const char *path, uint8_t *out, size_t outlen);
/* A hash pipe: chunks of a stream (an archive as it is read or downloaded) hashed with
 * SHA-256 and/or BLAKE2b-512 on threads of their own while the caller goes on with the same
 * bytes (decompressing them), so that every digest comes from one read. The caller takes a
 * slot, fills it, posts it; a slot is reused once every hasher is done with it (a ring of
 * KILN_HASHPIPE_SLOTS buffers of KILN_HASHPIPE_CHUNK bytes), and the slot posted last stays
 * valid until the next kiln_hashpipe_slot (what libarchive's read callback needs).
 * threads false hashes each chunk in kiln_hashpipe_post instead. Not shared between
 * callers: one thread takes, posts and finishes. */
#define KILN_HASHPIPE_CHUNK (1u << 20)
#define KILN_HASHPIPE_SLOTS 4
enum { KILN_HASH_SHA256 = 1, KILN_HASH_BLAKE2B = 2 };
typedef struct kiln_hashpipe kiln_hashpipe;
/* which: KILN_HASH_* bits. Caller frees with kiln_hashpipe_free. */
kiln_err kiln_hashpipe_new(int which, bool threads, kiln_hashpipe **out);
/* The next slot (KILN_HASHPIPE_CHUNK bytes), waiting for the hashers to free it. */
uint8_t *kiln_hashpipe_slot(kiln_hashpipe *p);
/* The slot taken last holds n bytes: hash them. */
void kiln_hashpipe_post(kiln_hashpipe *p, size_t n);
/* Start over (the stream was truncated and is sent again from its first byte). */
void kiln_hashpipe_reset(kiln_hashpipe *p);
/* Wait for every posted chunk; the digests of what was posted since the start (or the last
 * reset) into sha256 (32 bytes) and blake2b (64), each NULL when not asked for; *bytes the
 * length hashed. The pipe may not be used after, but freed. */
void kiln_hashpipe_finish(kiln_hashpipe *p, uint8_t *sha256, uint8_t *blake2b, uint64_t *bytes);
void kiln_hashpipe_free(kiln_hashpipe *p);
/* This thread's CPU seconds so far (CLOCK_THREAD_CPUTIME_ID), for debug lines that say where a
 * pass's time went. */
double kiln_thread_cpu_s(void);

/* Lowercase hex of len bytes into out (2*len+1 bytes). */
void kiln_hex(const uint8_t *bytes, size_t len, char *out);
/* Parse exactly 2*len hex digits; false on anything else. */
bool kiln_unhex(const char *hex, uint8_t *bytes, size_t len);

/* ---- files ------------------------------------------------------------------- */

/* Open a file the user named for reading: *fd (O_CLOEXEC, blocking) and, when size is not
 * NULL, its size. Anything but a regular file is refused on the opened descriptor with
 * "'PATH': not a regular file (a FIFO)" and the like, so that a FIFO, a device (/dev/zero)
 * or a socket in an input's place fails at once instead of hanging or reading for ever:
 * the open itself is O_NONBLOCK (a FIFO's open would wait for a writer), cleared once the
 * descriptor is known to be a regular file. Every reader of an input opens through this.
 * The caller closes *fd (-1 on failure). */
kiln_err kiln_open_input(const char *path, int *fd, uint64_t *size);

/* Read the rest of fd (size bytes as fstat gave them, at most limit) into a new buffer,
 * NUL-terminated, *len bytes; label names the file in messages. Closes fd, always. */
kiln_err kiln_read_fd(int fd, uint64_t size, size_t limit, const char *label, char **buf,
                      size_t *len);
/* Read a whole file (at most limit bytes, else KILN_ERR_LIMIT). *buf is NUL-terminated
 * past len; caller frees. */
kiln_err kiln_read_file(const char *path, size_t limit, char **buf, size_t *len);

/* An atomic write: data goes to a temp file in the target's directory, which is
 * fsync'd and renamed over the target, then the directory is fsync'd. Until commit
 * the target is untouched; abort (or a crash) leaves it as it was. */
typedef struct kiln_atomic {
    int fd;
    char *tmp;
    char *path;
} kiln_atomic;
kiln_err kiln_atomic_begin(kiln_atomic *a, const char *path);
kiln_err kiln_atomic_write(kiln_atomic *a, const void *data, size_t len);
kiln_err kiln_atomic_commit(kiln_atomic *a);
void kiln_atomic_abort(kiln_atomic *a); /* safe after commit or on a zeroed struct */
kiln_err kiln_write_file_atomic(const char *path, const void *data, size_t len);

kiln_err kiln_fsync_dir(const char *dir);
/* mkdir -p with mode 0755; existing directories are fine. */
kiln_err kiln_mkdir_p(const char *path);
bool kiln_path_exists(const char *path);
/* What is at a path a command was told to write into (following links): nothing (or it
 * cannot be looked at), an empty directory, a directory with entries, or something else (a
 * file, or a directory that cannot be read). */
typedef enum { KILN_DIR_ABSENT, KILN_DIR_EMPTY, KILN_DIR_FULL, KILN_DIR_OTHER } kiln_dir_state;
kiln_dir_state kiln_path_dir_state(const char *path);
/* Directory part of a path ("." if none); caller frees. */
char *kiln_dirname(const char *path);
/* Join with one '/'; caller frees. */
char *kiln_path_join(const char *a, const char *b);
/* Remove a tree without following symlinks, as much of it as can be (best effort: cleanup
 * paths). NULL is fine. */
void kiln_rmtree(const char *path);

/* ---- JSON (jansson) ---------------------------------------------------------- */

/* Parse strictly: duplicate keys refused, one value, nothing after it. label names the
 * source in messages. *out is a new reference. */
kiln_err kiln_json_parse(const char *buf, size_t len, const char *label, json_t **out);
kiln_err kiln_json_load_file(const char *path, json_t **out);
/* The length of the longest valid UTF-8 prefix of s[0..len): len when all of it is valid
 * (the UTF-8 jansson takes into a JSON string: no overlong forms, surrogates or code points
 * past U+10FFFF), else the offset of the first bad byte. */
size_t kiln_utf8_valid_prefix(const char *s, size_t len);
/* Canonical text: sorted keys, no insignificant white space; caller frees. */
char *kiln_json_canonical(const json_t *j);
/* Pretty (2-space indent, sorted keys, 15 significant digits for reals, trailing newline),
 * written atomically: for documents people read (cards, reports). */
kiln_err kiln_json_write_file(const char *path, const json_t *j);
/* The bytes kiln_json_write_file writes, *len of them; caller frees. NULL when out of
 * memory, with no message set: the caller names what it was encoding. */
char *kiln_json_document(const json_t *j, size_t *len);
/* The keys of object o, sorted by strcmp: an array of *n pointers into o (valid while o is);
 * caller frees the array, not the strings. NULL when out of memory. */
const char **kiln_json_sorted_keys(const json_t *o, size_t *n);

/* ---- a run's checkpoints (core/ckptdir.c) ------------------------------------------ */

/* The checkpoint of a step in a run's ckpt/ folder: step-NNNNNNNN.safetensors, the step in at
 * least 8 decimal digits. The trainer writes by this name, runs/ and export/ read by it. */
#define KILN_CKPT_NAME_MAX 48
void kiln_ckpt_name(long step, char out[KILN_CKPT_NAME_MAX]);
/* The steps of the checkpoints in the folder dir, ascending (*steps NULL when none; caller
 * frees); a missing folder holds none. KILN_ERR_IO when it cannot be read. */
kiln_err kiln_ckpt_steps(const char *dir, long **steps, size_t *n);

/* ---- downsampling a series for a picture (core/downsample.c) ------------------------ */

/* A series of any length cut to a fixed number of points that still shows every spike: the
 * x range [lo, hi] is split into `buckets` equal buckets and each keeps its smallest and
 * largest finite point (in x order; one point when they are the same) and its first
 * non-finite point, if any, with its y as it was (NaN, +inf or -inf); the series' first and
 * last finite points are kept too, so a line spans it. Never a mean: a
 * one-step spike in a million steps survives. Points are pushed in ascending x, one at a
 * time, so a reader streaming rows out of SQLite never holds the whole series. The caller's
 * x and y hold KILN_DOWNSAMPLE_MAX(buckets) points; what is kept is written there in
 * ascending x. Zero it with kiln_downsample_init; no allocation, nothing to release. */
#define KILN_DOWNSAMPLE_MAX(buckets) (3 * (size_t)(buckets) + 2)
typedef struct kiln_downsample {
    double lo, hi;
    size_t buckets;
    double *x, *y; /* the output */
    size_t n;      /* points written so far */
    size_t pushed; /* points pushed so far */
    /* the bucket being filled */
    size_t cur;
    bool open, finite, bad, first_out;
    double minx, miny, maxx, maxy, badx, bady;
    double firstx, firsty, lastx, lasty; /* the first finite point; the bucket's last one */
} kiln_downsample;
void kiln_downsample_init(kiln_downsample *d, double lo, double hi, size_t buckets, double *x,
                          double *y);
void kiln_downsample_push(kiln_downsample *d, double x, double y);
/* Close the last bucket; the number of points written. */
size_t kiln_downsample_end(kiln_downsample *d);
/* The same over arrays: n points of x (ascending) and y into ox, oy (KILN_DOWNSAMPLE_MAX
 * (buckets) each), over the series' own x range; the number kept. */
size_t kiln_downsample_array(const double *x, const double *y, size_t n, size_t buckets,
                             double *ox, double *oy);

/* The same rule kept as a series grows, for a reader that comes back for new rows only: the
 * steps from 0 are cut into KILN_ROLLUP_BUCKETS buckets of `width` steps (1 at first); when a
 * step falls past the last, neighbours are merged pairwise and the width doubles, each keeping
 * the smaller minimum, the larger maximum and the earlier non-finite point, so what it holds
 * is exactly what kiln_downsample would keep over buckets of that width, at any length.
 * About 110 KiB; zero it with kiln_rollup_init. */
#define KILN_ROLLUP_BUCKETS 2048
typedef struct kiln_rollup_bucket {
    double minx, miny, maxx, maxy, badx, bady;
    bool finite, bad;
} kiln_rollup_bucket;
typedef struct kiln_rollup {
    double width;
    size_t n; /* buckets up to the last one used */
    bool any;
    double firstx, firsty, lastx, lasty; /* the first and last finite points */
    kiln_rollup_bucket b[KILN_ROLLUP_BUCKETS];
} kiln_rollup;
void kiln_rollup_init(kiln_rollup *r);
void kiln_rollup_push(kiln_rollup *r, double x, double y); /* x >= 0, ascending */
/* The points held, ascending x, into x and y of KILN_ROLLUP_MAX each; how many. */
#define KILN_ROLLUP_MAX (3 * KILN_ROLLUP_BUCKETS + 2)
size_t kiln_rollup_points(const kiln_rollup *r, double *x, double *y);
/* A stretch [x0, x0 + width) of a series summed up ahead of time (metrics.db's step_sums):
 * what a rollup bucket keeps of it, and its first and last finite points. Adding a span to
 * a rollup equals pushing its points one by one, as long as width (a power of two, x0 a
 * multiple of it) is at most the width the rollup ends at. Zero it with
 * kiln_rollup_span_init. */
typedef struct kiln_rollup_span {
    double x0, width;
    kiln_rollup_bucket b;
    double firstx, firsty, lastx, lasty; /* when b.finite */
} kiln_rollup_span;
void kiln_rollup_span_init(kiln_rollup_span *s, double x0, double width);
void kiln_rollup_span_push(kiln_rollup_span *s, double x, double y); /* ascending x */
/* b's points follow a's: a becomes the two together (x0 and width stay a's). */
void kiln_rollup_span_merge(kiln_rollup_span *a, const kiln_rollup_span *b);
void kiln_rollup_add(kiln_rollup *r, const kiln_rollup_span *s); /* after every x pushed */

/* ---- libraries loaded on first use (core/dl.c) ------------------------------------ */

/* A shared library and the symbols kiln uses in it, opened the first time a caller needs
 * it (dlopen, RTLD_NOW | RTLD_LOCAL unless global) rather than by the dynamic linker at
 * start-up. The CUDA backends' vendor libraries are such: cuBLAS alone costs a process
 * 80-100 ms and 200 MB of memory to map, which every `kiln` command and every service paid
 * though most never touch a GPU; loaded on use, kiln also starts on machines that do not
 * have them. Open MPI too: only `mpirun ... kiln train` needs it. */
typedef struct kiln_dl_lib {
    const char *soname;       /* "libcublas.so.13": searched as dlopen searches */
    const char *what;         /* "cuBLAS", for messages */
    const char *const *names; /* n symbols */
    size_t n;
    void **fns; /* n entries, filled by kiln_dl_load */
    int state;  /* 0 not tried, 1 loaded, -1 failed; read and written by kiln_dl_load only */
    char why[384];
    bool global;      /* RTLD_GLOBAL: for a library whose own plugins need its symbols */
    const char *hint; /* what to do when it is missing; NULL: the GPU libraries' hint */
} kiln_dl_lib;

/* Open lib and resolve every name, once however many threads call at once; later calls
 * return at once with the same answer. KILN_ERR_DEVICE naming the library and what dlopen
 * or the first missing symbol said, when it cannot be loaded (then, and only then, every
 * later call fails the same way). */
kiln_err kiln_dl_load(kiln_dl_lib *lib);

/* ---- time --------------------------------------------------------------------- */

uint64_t kiln_now_ns(void);   /* monotonic */
int64_t kiln_unix_time(void); /* wall clock, seconds */
/* RFC 3339 UTC ("2026-11-29T21:03:00Z") into out[21]. */
void kiln_format_time(int64_t unix_secs, char out[21]);
/* The same as a JSON string (a new reference; NULL when out of memory). */
json_t *kiln_time_json(int64_t unix_secs);
/* A duration (of |secs|) as people read it, on the pages and in kiln models: "3 d", "5 h",
 * "12 min", "40 s". */
#define KILN_SPAN_MAX 32
void kiln_format_span(int64_t secs, char out[KILN_SPAN_MAX]);

/* ---- safetensors ------------------------------------------------------------- */

typedef enum kiln_dtype {
    KILN_F32 = 0,
    KILN_F16,
    KILN_BF16,
    KILN_F64,
    KILN_I8,
    KILN_I16,
    KILN_I32,
    KILN_I64,
    KILN_U8,
    KILN_U16,
    KILN_U32,
    KILN_U64,
    KILN_BOOL,
    KILN_DTYPE_COUNT
} kiln_dtype;

const char *kiln_dtype_name(kiln_dtype dt); /* "F32" */
size_t kiln_dtype_size(kiln_dtype dt);
bool kiln_dtype_parse(const char *name, kiln_dtype *out);

#define KILN_ST_MAX_DIMS 8
#define KILN_ST_MAX_HEADER (100u * 1000u * 1000u)

typedef struct kiln_tensor {
    const char *name;
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_ST_MAX_DIMS];
    size_t numel;
    const void *data; /* into the mapping; may be unaligned for dtypes > 1 byte */
    size_t nbytes;
} kiln_tensor;

typedef struct kiln_st kiln_st;

/* Map and validate a whole file: header length, strict JSON, every tensor's dtype,
 * shape and offsets (contiguous from 0, no gaps or overlaps, covering the data
 * section), duplicate names refused. Nothing is trusted before all of it passes.
 * Free with kiln_st_close. */
kiln_err kiln_st_open(const char *path, kiln_st **out);
/* The same over bytes in memory (copied); label names them in messages. */
kiln_err kiln_st_parse(const void *buf, size_t len, const char *label, kiln_st **out);
void kiln_st_close(kiln_st *st);

size_t kiln_st_count(const kiln_st *st);
const kiln_tensor *kiln_st_at(const kiln_st *st, size_t i); /* sorted by name */
const kiln_tensor *kiln_st_find(const kiln_st *st, const char *name);
/* A __metadata__ value, or NULL. */
const char *kiln_st_meta(const kiln_st *st, const char *key);
size_t kiln_st_meta_count(const kiln_st *st);
void kiln_st_meta_at(const kiln_st *st, size_t i, const char **key, const char **value);
const char *kiln_st_path(const kiln_st *st);
/* kiln_st_open over a descriptor open for reading (the caller keeps and closes it; the
 * mapping does not need it after); label names the file in messages. */
kiln_err kiln_st_open_fd(int fd, const char *label, kiln_st **out);
/* SHA-256 of the whole file as it was mapped and checked (not read again by its path). */
void kiln_st_sha256(const kiln_st *st, uint8_t out[KILN_SHA256_BYTES]);

/* ---- model directories (core/modeldir.c) -------------------------------------------- */

/* One rule for what a model directory may hold, for every reader of one (pack, release,
 * kiln_model_open and validate of a directory): regular files with one link each, reached
 * without a symlink at any component below the directory named (which may itself be named
 * through one: that is the caller's choice). Each is opened with O_NOFOLLOW and checked on
 * the descriptor it is then read through. A file that breaks the rule is KILN_ERR_FORMAT
 * naming it and what it is ("'m/card.json': is a symlink; ..."); a missing one
 * KILN_ERR_NOTFOUND. */
struct stat;
/* "a symlink", "a FIFO", ... of a st_mode (core/file.c). */
const char *kiln_file_kind(unsigned mode);
/* The rule on a file's lstat/fstat (label names it). */
kiln_err kiln_modeldir_file_ok(const struct stat *sb, const char *label);
/* rel (components without "." or "..") beneath dirfd, opened for reading; *fd_out the
 * caller closes; *size (may be NULL) its size. */
kiln_err kiln_modeldir_openat(int dirfd, const char *rel, const char *label, int *fd_out,
                              uint64_t *size);
/* The same beneath the directory dir. */
kiln_err kiln_modeldir_open(const char *dir, const char *rel, int *fd_out, uint64_t *size);
/* A whole file of dir (at most limit bytes), NUL-terminated past *len; caller frees. */
kiln_err kiln_modeldir_read(const char *dir, const char *rel, size_t limit, char **buf,
                            size_t *len);
/* A JSON file of dir (at most limit bytes), parsed strictly; *out a new reference. */
kiln_err kiln_modeldir_json(const char *dir, const char *rel, size_t limit, json_t **out);
/* A safetensors file of dir, opened as kiln_st_open does; free with kiln_st_close. */
kiln_err kiln_modeldir_st(const char *dir, const char *rel, kiln_st **out);
/* Whether a command may write a safetensors file of its kind at path: nothing is there, or a
 * regular file that opens as safetensors holding each of tensors (NULL-terminated), i.e. an
 * earlier output of that kind, which the new one replaces. Anything else (the input being
 * read, another file, a directory, a link) is KILN_ERR_CONFLICT naming path and what (e.g.
 * "a dataset (a safetensors file with 'features' and 'targets')"): an output never replaces
 * a file that is not one of its own kind. */
kiln_err kiln_st_out_ok(const char *path, const char *const *tensors, const char *what);
/* Find a tensor and check its dtype and shape (ndim dims, -1 matches any); the
 * message names the file and the tensor. */
kiln_err kiln_st_expect(const kiln_st *st, const char *name, kiln_dtype dt, int ndim,
                        const int64_t *shape, const kiln_tensor **out);
/* Copy a tensor of F32, F64, BF16 or F16 into f32 (dst holds numel floats). */
kiln_err kiln_tensor_to_f32(const kiln_tensor *t, float *dst);

/* Writer: collects tensors (data not copied: it must live until write) and metadata,
 * then writes the file atomically with tensors ordered by name and the header padded
 * with spaces to a multiple of 8. */
typedef struct kiln_st_writer kiln_st_writer;
kiln_err kiln_st_writer_new(kiln_st_writer **out);
void kiln_st_writer_free(kiln_st_writer *w);
kiln_err kiln_st_writer_add(kiln_st_writer *w, const char *name, kiln_dtype dt, int ndim,
                            const int64_t *shape, const void *data);
kiln_err kiln_st_writer_meta(kiln_st_writer *w, const char *key, const char *value);
kiln_err kiln_st_writer_write(kiln_st_writer *w, const char *path);

/* bf16 <-> f32, round to nearest even; NaN stays NaN. */
uint16_t kiln_f32_to_bf16(float f);
float kiln_bf16_to_f32(uint16_t b);
float kiln_f16_to_f32(uint16_t h);

/* ---- the model format (kiln-tsmoe/1): config and parameter table ---- */

/* Parse the JSON config object (the value of __metadata__["kiln.config"]): every key of
 * docs/model.md's table, "format" must be "kiln-tsmoe/1", norm_eps optional (1e-5), unknown
 * keys refused. label names the source in messages. */
kiln_err kiln_model_config_parse(const json_t *j, const char *label, kiln_model_config *cfg);
/* Check the constraints of docs/model.md (positive sizes, D % H, 1 <= K <= E or K == 0 == E,
 * 1 <= W <= S, and sizes small enough that every count fits in 32 bits). */
kiln_err kiln_model_config_check(const kiln_model_config *cfg, const char *label);
/* The config as a new JSON object with every key (sorted on output). */
json_t *kiln_model_config_json(const kiln_model_config *cfg);
/* Canonical text of the above, for kiln.config; caller frees. */
char *kiln_model_config_text(const kiln_model_config *cfg);
/* Read and check kiln.config from an open safetensors file. */
kiln_err kiln_model_config_from_st(const kiln_st *st, kiln_model_config *cfg);

enum {
    KILN_PARAM_TRAINED = 1, /* gets gradients and optimizer updates (not norm.in_*) */
    KILN_PARAM_DECAY = 2    /* weight decay applies: matrices (router, weights), not biases/gains */
};

typedef struct kiln_param {
    char name[64];            /* docs/model.md name, e.g. "blocks.0.attn.qkv.weight" */
    int ndim;
    int64_t shape[3];
    size_t numel;
    size_t offset;            /* in floats, into one contiguous parameter block */
    int flags;                /* KILN_PARAM_* */
} kiln_param;

/* Every parameter of the config in a fixed order: norm.in_mean, norm.in_std, embed.*,
 * then per block attn_norm, attn.qkv, attn.out, ffn_norm, ffn.* or moe.*, then
 * final_norm, head. *params is a new array (caller frees); *total is the block size
 * in floats. */
kiln_err kiln_param_table(const kiln_model_config *cfg, kiln_param **params, size_t *count, size_t *total);
/* Index of a name in the table, or -1. */
long kiln_param_find(const kiln_param *params, size_t count, const char *name);

/* A checkpoint's target standardisation, __metadata__["kiln.target_norm"] =
 * {"mean": [O], "std": [O]}: the trainer fits (y - mean) / std, and kiln export folds it
 * into head.weight and head.bias (W' = std W, b' = std b + mean) so the model predicts in the
 * data's units. Read into mean and std [O]; a checkpoint without it (written before it
 * existed) gives mean 0, std 1 and *present false; a malformed one is KILN_ERR_FORMAT. */
kiln_err kiln_target_norm_read(const kiln_st *st, int n_outputs, float *mean, float *std,
                               bool *present);
/* The metadata text of kiln.target_norm, every f32 exact (%.9g); caller frees, NULL when out
 * of memory. */
char *kiln_target_norm_text(int n_outputs, const float *mean, const float *std);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CORE_H */

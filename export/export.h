/*
 * export.h - the export module: reproducible .kiln archives (pack, secure unpack,
 * inspect) and their manifest. docs/formats.md ("archive and manifest") describes the
 * bytes; this header is what the rest of kiln (sign, registry, cli) may call.
 *
 * A .kiln archive is a zstd-compressed tar (pax-restricted: ustar headers) whose first entry is
 * manifest.json (canonical JSON: every file's path, size and sha256, the card's lineage and
 * creation time, the validation report's digest and verdict), followed by every file of the model
 * directory sorted by path. The manifest's bytes are what gets signed.
 */
#ifndef KILN_EXPORT_H
#define KILN_EXPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_MANIFEST_FORMAT "kiln-manifest/1"
#define KILN_MANIFEST_NAME "manifest.json"
/* The manifest and the card are read into memory; nothing else is. */
#define KILN_MANIFEST_MAX_BYTES (16u << 20)
#define KILN_CARD_MAX_BYTES (16u << 20)
/* Longest relative path packed or listed by pack. */
#define KILN_ARCHIVE_PATH_MAX 255

/* What unpack accepts; kiln_archive_limits_default fills the documented defaults. */
typedef struct kiln_archive_limits {
    uint64_t max_total_bytes; /* sum of all entry sizes; default 64 GiB */
    uint64_t max_entries;     /* entries of any type, the manifest included; default 10000 */
    uint64_t max_path;        /* bytes of one entry's path; default 255 */
} kiln_archive_limits;

void kiln_archive_limits_default(kiln_archive_limits *l);

typedef struct kiln_manifest_file {
    char *path; /* relative, '/'-separated, validated (see kiln_export_path_ok) */
    uint64_t size;
    uint8_t sha256[KILN_SHA256_BYTES];
} kiln_manifest_file;

/* A parsed manifest. Read-only for callers; free with kiln_manifest_free. */
typedef struct kiln_manifest {
    char *name, *version;
    char *created;           /* RFC 3339, as written in the card */
    int64_t created_unix;    /* the same in seconds since 1970 (UTC), the tar mtime */
    json_t *lineage;         /* the card's "lineage" object (a reference owned here) */
    bool validation_present; /* validation.json was in the model directory */
    bool validation_passed;  /* its "passed", meaningful only if present */
    uint8_t validation_sha256[KILN_SHA256_BYTES];
    size_t nfiles;
    kiln_manifest_file *files; /* sorted by path (strcmp), unique */
    char *text;                /* the canonical bytes, as stored in the archive */
    size_t text_len;
    uint8_t sha256[KILN_SHA256_BYTES]; /* sha256 of text: what a signer names */
} kiln_manifest;

KILN_API void kiln_manifest_free(kiln_manifest *m); /* NULL is fine */

/* True if name matches [a-z0-9][a-z0-9._-]{0,63} and has no "..". */
KILN_API bool kiln_export_name_ok(const char *name);
/* True if version matches [0-9A-Za-z][0-9A-Za-z.+_-]{0,63} and has no "..". */
KILN_API bool kiln_export_version_ok(const char *version);
/* True if path is relative, at most max bytes, made of '/'-separated components of
 * [A-Za-z0-9._+-] that are neither "." nor "..", with no empty component. */
KILN_API bool kiln_export_path_ok(const char *path, size_t max);
/* Parse an RFC 3339 date-time ("2026-11-29T21:03:00Z", fractions and offsets allowed)
 * into whole seconds since 1970 UTC (the fraction is dropped). */
KILN_API kiln_err kiln_export_parse_time(const char *s, int64_t *out);

/* Build the manifest of a model directory (model.safetensors, card.json, optional golden/
 * and validation.json): walks it, refuses symlinks, devices, fifos, sockets and files with
 * more than one link, hashes every file. label-free: messages name the directory's files.
 * *out is new (kiln_manifest_free). */
KILN_API kiln_err kiln_manifest_build(const char *model_dir, const char *name, const char *version,
                                      kiln_manifest **out);

/* Parse manifest bytes strictly: canonical form only (sorted keys, compact, exactly as
 * kiln_json_canonical writes it), every key required and no others, paths valid, sorted,
 * unique, card.json and model.safetensors present. label names the source in messages.
 * *out is new (kiln_manifest_free). This is the fuzzed parser. */
KILN_API kiln_err kiln_manifest_parse(const void *buf, size_t len, const char *label,
                                      kiln_manifest **out);

/* Find a file by path in the sorted list; NULL if absent. */
KILN_API const kiln_manifest_file *kiln_manifest_find(const kiln_manifest *m, const char *path);

/* Check a directory against a trusted manifest: every file present with its size and
 * sha256, no other file (a top-level manifest.json, if there, must equal m->text byte for
 * byte), no symlinks or special files. KILN_ERR_VERIFY names the first file that differs. */
KILN_API KILN_MUST_CHECK kiln_err kiln_manifest_verify_dir(const kiln_manifest *m, const char *dir);

/* Pack model_dir into out_path (written atomically; an existing file is left as it was on
 * any failure). The same directory content gives the same bytes whatever the clock, file
 * times, owners, permissions or umask. archive_sha256 (may be NULL) receives the digest of
 * the archive written; manifest_out (may be NULL) the manifest (kiln_manifest_free). */
KILN_API kiln_err kiln_archive_pack(const char *model_dir, const char *name, const char *version,
                                    const char *out_path, uint8_t archive_sha256[KILN_SHA256_BYTES],
                                    kiln_manifest **manifest_out);

/* Read and parse the manifest (the first entry) of an archive without extracting
 * anything. *out is new (kiln_manifest_free). */
KILN_API kiln_err kiln_archive_read_manifest(const char *archive_path, kiln_manifest **out);

/* The manifest and card.json of an archive, without extracting: the card is checked
 * against the manifest's size and sha256. *manifest and *card are new (kiln_manifest_free,
 * json_decref). */
KILN_API kiln_err kiln_archive_inspect(const char *archive_path, kiln_manifest **manifest,
                                       json_t **card);
/* The same, and the exact bytes of one more file the manifest lists (also, e.g.
 * "validation.json"), checked against its size and sha256 there: *bytes (caller frees;
 * NUL-terminated after *len bytes). A file not listed: *bytes NULL, *len 0; one listed with
 * more than max bytes is not read: *bytes NULL, *len its size. Files after card.json are read
 * through (decompressed and dropped) to reach it. */
KILN_API kiln_err kiln_archive_inspect_with(const char *archive_path, const char *also,
                                            uint64_t max, kiln_manifest **manifest, json_t **card,
                                            char **bytes, size_t *len);

/* Unpack an archive into out_dir, which must not exist. Entries go into a private
 * temporary directory beside out_dir; only regular files and directories are accepted
 * (symlinks, hard links, devices and fifos are refused), paths must pass
 * kiln_export_path_ok, limits (NULL: defaults) bound sizes, counts and path lengths, and
 * every file must match the manifest (first entry): a file not in it, a missing file or
 * one whose size or sha256 differs fails. Only then is the directory renamed into place;
 * on failure nothing is left behind. manifest_out (may be NULL) receives the manifest. */
KILN_API KILN_MUST_CHECK kiln_err kiln_archive_unpack(const char *archive_path, const char *out_dir,
                                                      const kiln_archive_limits *limits,
                                                      kiln_manifest **manifest_out);

/* Whether dir is a model directory as kiln installs one (kiln pull, kiln_watch, kiln unpack,
 * kiln verify --out): a directory (not a symbolic link) holding a manifest.json that parses
 * as a kiln manifest and nothing else but files that manifest lists (what they hold is not
 * looked at: kiln_manifest_verify_dir checks that). KILN_ERR_CONFLICT naming what is in the
 * way otherwise (no manifest, a file it does not list, a link, a device); KILN_ERR_NOTFOUND
 * when there is nothing at dir. */
KILN_API KILN_MUST_CHECK kiln_err kiln_archive_dir_installed(const char *dir);
/* Whether dir may be replaced by a model directory that kiln installs there: it does not
 * exist, it is an empty directory, or kiln_archive_dir_installed says it is one kiln
 * installed (whatever its files now hold: a changed file is replaced). Anything else (a
 * file, a symbolic link, a directory of other files) is KILN_ERR_CONFLICT, naming what is in
 * the way, so that an output directory never takes away what kiln did not put there. who
 * ("a pull") goes in the message. */
KILN_API KILN_MUST_CHECK kiln_err kiln_archive_dir_replaceable(const char *dir, const char *who);

/* Every check kiln_archive_unpack makes (entries, limits, every file's size and sha256
 * against the manifest, nothing missing or extra), with the data hashed and dropped
 * instead of written: for verifying an archive without unpacking it. manifest_out (may be
 * NULL) receives the manifest. */
KILN_API KILN_MUST_CHECK kiln_err kiln_archive_check(const char *archive_path,
                                                     const kiln_archive_limits *limits,
                                                     kiln_manifest **manifest_out);

/* Where the unpack's bytes come from when they are not a file: a download as it lands (the
 * registry's pull) or a file read once for several digests (kiln verify). read sets *buf and
 * *n to the next bytes of the archive (*n 0 at its end), valid until the next call; a
 * failure returns its code with the message set, and the unpack fails with that code. */
typedef struct kiln_archive_source {
    kiln_err (*read)(void *ctx, const void **buf, size_t *n);
    void *ctx;
} kiln_archive_source;

/* kiln_archive_unpack (out_dir) or kiln_archive_check (out_dir NULL) from a source, label
 * naming the archive in messages. With expect (a manifest the caller has verified already,
 * e.g. the registry's copy checked against the release signatures), the archive's first
 * entry must be byte for byte expect's text (compared, then parsed) and every file is
 * checked against it; NULL: as kiln_archive_unpack. Every limit of kiln_archive_unpack holds,
 * and a file is refused before its data when its size is not the manifest's. */
KILN_API KILN_MUST_CHECK kiln_err kiln_archive_unpack_source(const kiln_archive_source *src,
                                                             const char *label, const char *out_dir,
                                                             const kiln_archive_limits *limits,
                                                             const kiln_manifest *expect,
                                                             kiln_manifest **manifest_out);

/* kiln_archive_inspect_with from a source (label naming the archive in messages), the first
 * entry held to expect as kiln_archive_unpack_source holds it (byte for byte expect's text,
 * compared before it is parsed) when expect is not NULL. It reads the source only as far as
 * the last file it takes: the caller reads the rest (a download hashed as it lands). */
KILN_API kiln_err kiln_archive_inspect_source(const kiln_archive_source *src, const char *label,
                                              const kiln_manifest *expect, const char *also,
                                              uint64_t max, kiln_manifest **manifest, json_t **card,
                                              char **bytes, size_t *len);

/* ---- freezing a checkpoint into a model directory (export/freeze.c) ---- */

#define KILN_CARD_FORMAT "kiln-card/1"

typedef enum kiln_export_dtype { KILN_EXPORT_F32 = 0, KILN_EXPORT_BF16 = 1 } kiln_export_dtype;

#define KILN_EXPORT_BEST (-1L)

typedef struct kiln_export_opts {
    const char *run_dir;     /* a run directory: run.json, metrics.db, ckpt/ */
    long step;               /* 0: the newest checkpoint whose data digest verifies;
                                KILN_EXPORT_BEST: the one best_step picks */
    const char *out_dir;     /* the model directory to create */
    kiln_export_dtype dtype; /* weight matrices, vectors and biases; norm.in_* stay F32 */
    const char *name;        /* the card's name; NULL: "run-" and the run id's first 12 digits */
    bool force;              /* replace an existing non-empty out_dir */
    /* Called with the step frozen and the directory being made, before it is put in place:
     * the caller adds files there (kiln export and kiln release: run_summary.json, from
     * runs/). A failure stops the export and leaves nothing. NULL: none. */
    kiln_err (*add_files)(void *ctx, long step, const char *dir);
    void *add_files_ctx;
    /* With KILN_EXPORT_BEST: of the checkpoint steps[0..n) of run_dir, the one whose step
     * logged the lowest validation loss; KILN_ERR_NOTFOUND when none did. The run's metrics
     * are runs/'s to read (kiln_run_best_ckpt: the rule kiln runs show and the trainer's
     * pruning use, non-finite losses skipped), so export asks its caller rather than reading
     * metrics.db with SQL of its own, which ranked a -inf loss best. Required with
     * KILN_EXPORT_BEST. */
    kiln_err (*best_step)(const char *run_dir, const long *steps, size_t n, long *best);
    /* The card's lineage.metrics for the step frozen and the time it was logged (the card's
     * "created" when the checkpoint has no kiln.created), read by the caller for the same
     * reason (kiln_run_step_metrics: the step's loss, the newest finite validation at or
     * before it; *metrics NULL and *time NAN when the run logged none). NULL: the lineage's
     * metrics are null. */
    kiln_err (*step_metrics)(const char *run_dir, long step, json_t **metrics, double *time);
    /* NULL, or the card's "created" (RFC 3339) instead of the checkpoint's time: kiln
     * reproduce makes a released card again, with the time the release recorded. */
    const char *created;
    /* The card's lineage says "dataset_withheld": true: the dataset was kept off the
     * registry (kiln release --no-data), so a reproduction needs it from its owner. */
    bool data_withheld;
} kiln_export_opts;

/* What an export did; release with kiln_export_info_release. */
typedef struct kiln_export_info {
    long step;
    char *ckpt_path;  /* the checkpoint frozen */
    char **skipped;   /* newer checkpoints passed over (default step only): "path: reason" */
    size_t n_skipped;
} kiln_export_info;
KILN_API void kiln_export_info_release(kiln_export_info *info);

/* Freeze one checkpoint of a run into a model directory (docs/export.md): model.safetensors
 * with the trained parameters and norm.in_* (no optimizer state), config in kiln.config,
 * and card.json (format, name, dtype, config, created, lineage: run id, step, checkpoint
 * and its digests, run config, dataset digest, code version, the digest of the --init model
 * when the run started from one, the run's last validation metrics from metrics.db). `created` comes from the checkpoint (kiln.created in its
 * metadata, else the time metrics.db logged for its step, else the file's modification
 * time), never the clock, so the same checkpoint gives the same bytes. The directory is
 * built beside out_dir and renamed into place: on any failure nothing is left. An existing
 * non-empty out_dir is refused (KILN_ERR_CONFLICT) unless force. A checkpoint whose data
 * digest does not verify is refused (KILN_ERR_VERIFY); without a step, older checkpoints
 * are tried. info may be NULL. */
KILN_API kiln_err kiln_export_model(const kiln_export_opts *opts, kiln_export_info *info);

#ifdef __cplusplus
}
#endif
#endif /* KILN_EXPORT_H */

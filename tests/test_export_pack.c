/* test_export_pack.c - export/'s .kiln archives: the manifest's known answer, reproducible
 * bytes, refusals when packing, tamper detection, hostile archives built here with
 * libarchive's writer, limits, inspect, and the manifest fuzz corpus replayed. (Freezing a
 * checkpoint, export/freeze.c, is tested with validate's fixture: validate_export_* in
 * tests/test_validate.c.) */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <unistd.h>

#include "export.h"
#include "test.h"
#include "testutil.h"

int kiln_fuzz_manifest(const uint8_t *data, size_t size); /* tests/fuzz/manifest.c */

#define CARD_KAT                                                                                   \
    "{\"created\":\"2026-01-02T03:04:05.250+01:00\",\"lineage\":{\"code_version\":\"0.1.0\","      \
    "\"dataset_sha256\":\"00ff\",\"metrics\":{\"val_mse\":0.5},\"run_id\":\"run-7\",\"step\":"     \
    "1200},"                                                                                       \
    "\"name\":\"kat\"}"

/* ---- helpers ------------------------------------------------------------------ */

/* A small model directory; the caller frees the path. */
static char *model_dir(const char *name, bool validation) {
    char *dir = kiln_test_path(name);
    kiln_mkdir_p(dir);
    kiln_test_put(dir, "model.safetensors", "not really safetensors");
    kiln_test_put(dir, "card.json", CARD_KAT);
    kiln_test_put(dir, "golden/x.bin", "golden\n");
    if (validation) kiln_test_put(dir, "validation.json", "{\"passed\":false}");
    return dir;
}

static char *slurp(const char *path, size_t *len) {
    char *buf = NULL;
    size_t n = 0;
    if (kiln_read_file(path, 1u << 30, &buf, &n) != KILN_OK) return NULL;
    if (len) *len = n;
    return buf;
}

/* ---- hostile archives, written with libarchive --------------------------------- */

static struct archive *hw_open(const char *path) {
    struct archive *a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    archive_write_add_filter_zstd(a);
    archive_write_set_filter_option(a, "zstd", "compression-level", "1");
    archive_write_open_filename(a, path);
    return a;
}

static void hw_entry(struct archive *a, const char *path, mode_t type, int64_t size,
                     const char *link, bool hard) {
    struct archive_entry *e = archive_entry_new();
    archive_entry_set_pathname(e, path);
    archive_entry_set_filetype(e, type);
    archive_entry_set_perm(e, type == AE_IFDIR ? 0755 : 0644);
    archive_entry_set_size(e, size);
    if (link && hard)
        archive_entry_set_hardlink(e, link);
    else if (link)
        archive_entry_set_symlink(e, link);
    if (type == AE_IFCHR) archive_entry_set_rdev(e, makedev(1, 3));
    archive_write_header(a, e);
    archive_entry_free(e);
}

static void hw_file(struct archive *a, const char *path, const void *data, size_t len) {
    hw_entry(a, path, AE_IFREG, (int64_t)len, NULL, false);
    archive_write_data(a, data, len);
}

/* Copy the files of a model directory into an archive being written. */
static void hw_model_files(struct archive *a, const char *dir, const char *skip) {
    static const char *files[] = {"card.json", "golden/x.bin", "model.safetensors"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(files); i++) {
        if (skip && !strcmp(skip, files[i])) continue;
        char *p = kiln_path_join(dir, files[i]);
        size_t n = 0;
        char *b = slurp(p, &n);
        hw_file(a, files[i], b, n);
        free(b);
        free(p);
    }
}

typedef struct fd_sink {
    int fd;
    bool closed;
} fd_sink;

static la_ssize_t fd_write(struct archive *a, void *ud, const void *buf, size_t len) {
    (void)a;
    fd_sink *s = ud;
    return s->closed ? -1 : write(s->fd, buf, len);
}

static void hw_close(struct archive *a) {
    archive_write_close(a);
    archive_write_free(a);
}

/* Unpack must fail with want (and a message holding what and the archive's name) and leave
 * nothing in the test directory. */
static void refused(const char *archive, kiln_err want, const char *what, const char *descr) {
    char *out = kiln_test_path("out");
    char *before = kiln_test_listing(kiln_test_dir());
    kiln_manifest *m = NULL;
    kiln_err rc = kiln_archive_unpack(archive, out, NULL, &m);
    char *after = kiln_test_listing(kiln_test_dir());
    char buf[256];
    snprintf(buf, sizeof buf, "%s: refused", descr);
    CHECK(buf, rc == want);
    snprintf(buf, sizeof buf, "%s: message names the archive and '%s'", descr, what);
    CHECK(buf, kiln_test_msg_has(archive, what));
    snprintf(buf, sizeof buf, "%s: nothing left behind", descr);
    CHECK(buf, before && after && !strcmp(before, after) && !kiln_path_exists(out));
    CHECK("no manifest returned on failure", m == NULL);
    /* kiln_archive_check (verify without unpacking) refuses it the same way, writing nothing. */
    rc = kiln_archive_check(archive, NULL, &m);
    char *after_check = kiln_test_listing(kiln_test_dir());
    snprintf(buf, sizeof buf, "%s: check refuses it as unpack does", descr);
    CHECK(buf, rc == want && kiln_test_msg_has(archive, what) && m == NULL);
    snprintf(buf, sizeof buf, "%s: check writes nothing", descr);
    CHECK(buf, before && after_check && !strcmp(before, after_check));
    free(after_check);
    free(before);
    free(after);
    free(out);
}

/* ---- names, times ---------------------------------------------------------------- */

KILN_TEST(export_pack_names_and_times) {
    CHECK("plain name", kiln_export_name_ok("tsmoe-small.v2_x"));
    CHECK("name: no capitals", !kiln_export_name_ok("Tsmoe"));
    CHECK("name: no leading dot", !kiln_export_name_ok(".x"));
    CHECK("name: no ..", !kiln_export_name_ok("a..b"));
    CHECK("name: no slash", !kiln_export_name_ok("a/b"));
    CHECK("name: not empty", !kiln_export_name_ok(""));
    CHECK("name: 64 bytes",
          kiln_export_name_ok("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"));
    CHECK("name: not 65", !kiln_export_name_ok(
                              "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"));
    CHECK("semver version", kiln_export_version_ok("2.0.0-rc.1+b7"));
    CHECK("version: no ..", !kiln_export_version_ok("1..2"));
    CHECK("version: no slash", !kiln_export_version_ok("1/2"));
    CHECK("version: no leading dash", !kiln_export_version_ok("-1"));
    CHECK("path: nested", kiln_export_path_ok("golden/a-1.bin", 255));
    CHECK("path: absolute", !kiln_export_path_ok("/etc/passwd", 255));
    CHECK("path: dotdot", !kiln_export_path_ok("a/../b", 255));
    CHECK("path: dot", !kiln_export_path_ok("./a", 255));
    CHECK("path: double slash", !kiln_export_path_ok("a//b", 255));
    CHECK("path: trailing slash", !kiln_export_path_ok("a/", 255));
    CHECK("path: space", !kiln_export_path_ok("a b", 255));
    CHECK("path: too long", !kiln_export_path_ok("abcdef", 5));
    int64_t t = 0;
    CHECK("rfc3339 Z",
          kiln_export_parse_time("2000-02-29T23:59:59Z", &t) == KILN_OK && t == 951868799);
    CHECK("rfc3339 offset and fraction",
          kiln_export_parse_time("2026-01-02T03:04:05.250+01:00", &t) == KILN_OK &&
              t == 1767319445);
    CHECK("rfc3339: no 29 Feb 2001",
          kiln_export_parse_time("2001-02-29T00:00:00Z", &t) == KILN_ERR_FORMAT);
    CHECK("rfc3339: zone required",
          kiln_export_parse_time("2001-02-01T00:00:00", &t) == KILN_ERR_FORMAT);
    CHECK("rfc3339: message quotes the text",
          kiln_test_msg_has("'2001-02-01T00:00:00'", "RFC 3339"));
    CHECK("rfc3339: junk after",
          kiln_export_parse_time("2001-02-01T00:00:00Zx", &t) == KILN_ERR_FORMAT);
}

/* ---- pack ------------------------------------------------------------------------ */

KILN_TEST(export_pack_manifest_known_answer) {
    char *dir = model_dir("m", true);
    kiln_manifest *m = NULL;
    if (!CHECK("builds", kiln_manifest_build(dir, "kat", "2.0.0-rc.1+b7", &m) == KILN_OK)) goto out;
    static const char want[] =
        "{\"created\":\"2026-01-02T03:04:05.250+01:00\",\"files\":["
        "{\"path\":\"card.json\",\"sha256\":"
        "\"75c0e636e1c392b02d88e0ae698c99a98642d3466328fe1b7983c7ae7d72ac01\",\"size\":170},"
        "{\"path\":\"golden/x.bin\",\"sha256\":"
        "\"5ac03da17d7d5241b49a9a94f86b08a431d7052c8585ca997b373f0bc7da0dcc\",\"size\":7},"
        "{\"path\":\"model.safetensors\",\"sha256\":"
        "\"84c58b88943fcf6fad2514e8cd2e058ab370c1affc8f99b544b27d2646da6e97\",\"size\":22},"
        "{\"path\":\"validation.json\",\"sha256\":"
        "\"f456fddc65a1f27bbc6ddedb24647e90e8c2dc8baea14e670b60e75d7d1e8a0d\",\"size\":16}],"
        "\"format\":\"kiln-manifest/1\","
        "\"lineage\":{\"code_version\":\"0.1.0\",\"dataset_sha256\":\"00ff\","
        "\"metrics\":{\"val_mse\":0.5},\"run_id\":\"run-7\",\"step\":1200},\"name\":\"kat\","
        "\"validation\":{\"passed\":false,\"sha256\":"
        "\"f456fddc65a1f27bbc6ddedb24647e90e8c2dc8baea14e670b60e75d7d1e8a0d\"},"
        "\"version\":\"2.0.0-rc.1+b7\"}";
    CHECK("manifest text byte for byte",
          m->text_len == strlen(want) && !memcmp(m->text, want, m->text_len));
    uint8_t d[KILN_SHA256_BYTES];
    kiln_sha256(want, strlen(want), d);
    CHECK("manifest digest is sha256 of the text", !memcmp(d, m->sha256, sizeof d));
    CHECK("creation time from the card", m->created_unix == 1767319445);
    CHECK("verdict", m->validation_present && !m->validation_passed);
    CHECK("lineage kept", json_integer_value(json_object_get(m->lineage, "step")) == 1200);
    kiln_manifest_free(m);
    m = NULL;
    /* Without validation.json the verdict is null. */
    char *p = kiln_path_join(dir, "validation.json");
    unlink(p);
    free(p);
    CHECK("builds without validation", kiln_manifest_build(dir, "kat", "1", &m) == KILN_OK);
    CHECK("validation absent",
          m && !m->validation_present &&
              strstr(m->text, "\"validation\":{\"passed\":null,\"sha256\":null}"));
out:
    kiln_manifest_free(m);
    free(dir);
}

/* The tar's headers: manifest first, then sorted, fixed owner, mode and time. */
static void check_headers(const char *archive, int64_t mtime) {
    static const char *order[] = {"manifest.json", "card.json", "golden/x.bin", "model.safetensors",
                                  "validation.json"};
    struct archive *a = archive_read_new();
    archive_read_support_filter_zstd(a);
    archive_read_support_format_tar(a);
    bool ok = archive_read_open_filename(a, archive, 1 << 16) == ARCHIVE_OK, fields = true;
    struct archive_entry *e;
    size_t n = 0;
    while (ok && archive_read_next_header(a, &e) == ARCHIVE_OK) {
        fields &= n < KILN_ARRAY_LEN(order) && !strcmp(archive_entry_pathname(e), order[n]);
        fields &= archive_entry_uid(e) == 0 && archive_entry_gid(e) == 0;
        fields &=
            !strcmp(archive_entry_uname(e), "root") && !strcmp(archive_entry_gname(e), "root");
        fields &= archive_entry_perm(e) == 0644 && archive_entry_filetype(e) == AE_IFREG;
        fields &= archive_entry_mtime(e) == mtime && archive_entry_mtime_nsec(e) == 0;
        n++;
    }
    CHECK("archive readable by libarchive as zstd tar",
          ok && archive_filter_code(a, 0) == ARCHIVE_FILTER_ZSTD);
    CHECK("entries in order with fixed owner, mode and time", fields && n == KILN_ARRAY_LEN(order));
    archive_read_free(a);
}

KILN_TEST(export_pack_reproducible) {
    char *dir = model_dir("m", true), *a1 = kiln_test_path("a.kiln"),
         *a2 = kiln_test_path("b.kiln");
    uint8_t d1[KILN_SHA256_BYTES], d2[KILN_SHA256_BYTES], df[KILN_SHA256_BYTES];
    CHECK("first pack", kiln_archive_pack(dir, "kat", "1.0", a1, d1, NULL) == KILN_OK);
    /* Other times, permissions and umask: none of it may reach the bytes. */
    struct timeval tv[2] = {{1000000000, 123456}, {1000000000, 654321}};
    char *p = kiln_path_join(dir, "model.safetensors");
    utimes(p, tv);
    chmod(p, 0600);
    free(p);
    mode_t old = umask(077);
    CHECK("second pack", kiln_archive_pack(dir, "kat", "1.0", a2, d2, NULL) == KILN_OK);
    umask(old);
    CHECK("same digest", !memcmp(d1, d2, sizeof d1));
    CHECK("same bytes", kiln_test_same_file(a1, a2));
    CHECK("digest is the file's",
          kiln_sha256_file(a1, df) == KILN_OK && !memcmp(df, d1, sizeof df));
    check_headers(a1, 1767319445);
    free(dir);
    free(a1);
    free(a2);
}

/* pack must fail with want, naming what, and leave an existing output as it was. */
static void pack_refused(const char *dir, const char *name, const char *version, kiln_err want,
                         const char *what, const char *what2, const char *descr) {
    char *out = kiln_test_path("out.kiln");
    kiln_test_put(kiln_test_dir(), "out.kiln", "previous archive");
    char buf[256];
    snprintf(buf, sizeof buf, "%s: refused", descr);
    CHECK(buf, kiln_archive_pack(dir, name, version, out, NULL, NULL) == want);
    snprintf(buf, sizeof buf, "%s: message names '%s'", descr, what);
    CHECK(buf, kiln_test_msg_has(what, what2));
    size_t n = 0;
    char *b = slurp(out, &n);
    snprintf(buf, sizeof buf, "%s: existing output intact", descr);
    CHECK(buf, b && n == 16 && !memcmp(b, "previous archive", 16));
    free(b);
    char *listing = kiln_test_listing(kiln_test_dir());
    CHECK("no temporary file left", listing && !strstr(listing, ".tmp"));
    free(listing);
    free(out);
}

KILN_TEST(export_pack_refuses) {
    char *dir = model_dir("m", false);
    char *p = kiln_path_join(dir, "golden/link");
    symlink("/etc/passwd", p);
    pack_refused(dir, "x", "1", KILN_ERR_FORMAT, "golden/link", "symlink", "symlink");
    unlink(p);
    mkfifo(p, 0644);
    pack_refused(dir, "x", "1", KILN_ERR_FORMAT, "golden/link", "FIFO", "fifo");
    unlink(p);
    char *q = kiln_path_join(dir, "model.safetensors");
    link(q, p);
    pack_refused(dir, "x", "1", KILN_ERR_FORMAT, "hard links", NULL, "hard link");
    unlink(p);
    free(p);
    p = kiln_path_join(dir, "golden/bad name");
    kiln_test_put(dir, "golden/bad name", "x");
    pack_refused(dir, "x", "1", KILN_ERR_FORMAT, "golden/bad name", "not allowed", "odd file name");
    unlink(p);
    free(p);
    pack_refused(dir, "Bad", "1", KILN_ERR_USAGE, "name 'Bad'", NULL, "bad name");
    pack_refused(dir, "x", "../1", KILN_ERR_USAGE, "version '../1'", NULL, "bad version");
    kiln_test_put(dir, "manifest.json", "{}");
    pack_refused(dir, "x", "1", KILN_ERR_FORMAT, "manifest.json", "reserved", "reserved name");
    p = kiln_path_join(dir, "manifest.json");
    unlink(p);
    free(p);
    kiln_test_put(dir, "validation.json", "{\"passed\":\"yes\"}");
    pack_refused(dir, "x", "1", KILN_ERR_FORMAT, "validation.json", "passed",
                 "verdict not a boolean");
    p = kiln_path_join(dir, "validation.json");
    unlink(p);
    free(p);
    kiln_test_put(dir, "card.json", "{\"lineage\":{}}");
    pack_refused(dir, "x", "1", KILN_ERR_FORMAT, "card.json", "created", "card without created");
    kiln_test_put(dir, "card.json", "{\"created\":\"yesterday\",\"lineage\":{}}");
    pack_refused(dir, "x", "1", KILN_ERR_FORMAT, "card.json", "RFC 3339", "card with a bad time");
    kiln_test_put(dir, "card.json", "{\"created\":\"2026-01-01T00:00:00Z\"}");
    pack_refused(dir, "x", "1", KILN_ERR_FORMAT, "card.json", "lineage", "card without lineage");
    p = kiln_path_join(dir, "card.json");
    unlink(p);
    pack_refused(dir, "x", "1", KILN_ERR_NOTFOUND, "no card.json", NULL, "missing card");
    kiln_test_put(dir, "card.json", CARD_KAT);
    unlink(q);
    pack_refused(dir, "x", "1", KILN_ERR_NOTFOUND, "no model.safetensors", NULL, "missing weights");
    kiln_test_put(dir, "model.safetensors", "w");
    char *inside = kiln_path_join(dir, "golden/out.kiln");
    CHECK("output inside the model directory refused",
          kiln_archive_pack(dir, "x", "1", inside, NULL, NULL) == KILN_ERR_USAGE &&
              kiln_test_msg_has("inside", NULL));
    CHECK("and nothing written there", !kiln_path_exists(inside));
    free(inside);
    /* An existing output is replaced only when it is an archive: never another file. */
    char *other = kiln_test_write("positions.csv", "sym,qty\n", 8),
         *arch = kiln_test_path("a.kiln");
    CHECK("--out naming a file that is no archive: refused",
          kiln_archive_pack(dir, "x", "1", other, NULL, NULL) == KILN_ERR_CONFLICT &&
              kiln_test_msg_has("positions.csv' exists and is not a .kiln archive", NULL));
    size_t on = 0;
    char *ob = slurp(other, &on);
    CHECK("and left as it was", ob && on == 8 && !memcmp(ob, "sym,qty\n", 8));
    free(ob);
    CHECK("a new archive", kiln_archive_pack(dir, "x", "1", arch, NULL, NULL) == KILN_OK);
    CHECK("an archive over an archive",
          kiln_archive_pack(dir, "x", "2", arch, NULL, NULL) == KILN_OK);
    free(other), free(arch);
    free(p);
    free(q);
    free(dir);
}

/* ---- unpack, verify, tamper -------------------------------------------------------- */

KILN_TEST(export_pack_unpack_roundtrip_and_tamper) {
    char *dir = model_dir("m", true), *ar = kiln_test_path("a.kiln"), *out = kiln_test_path("u");
    kiln_manifest *pm = NULL, *um = NULL, *rm = NULL;
    if (!CHECK("packs", kiln_archive_pack(dir, "kat", "1.0", ar, NULL, &pm) == KILN_OK)) goto out;
    kiln_manifest *cm = NULL;
    CHECK("checks without unpacking", kiln_archive_check(ar, NULL, &cm) == KILN_OK && cm &&
                                          !memcmp(cm->sha256, pm->sha256, 32) &&
                                          cm->nfiles == pm->nfiles && !kiln_path_exists(out));
    kiln_manifest_free(cm);
    if (!CHECK("unpacks", kiln_archive_unpack(ar, out, NULL, &um) == KILN_OK)) goto out;
    CHECK("same manifest",
          um->text_len == pm->text_len && !memcmp(um->text, pm->text, pm->text_len));
    CHECK("reads the manifest alone", kiln_archive_read_manifest(ar, &rm) == KILN_OK && rm &&
                                          !memcmp(rm->sha256, pm->sha256, sizeof rm->sha256));
    CHECK("unpacked directory verifies", kiln_manifest_verify_dir(pm, out) == KILN_OK);
    const char *rels[] = {"card.json", "golden/x.bin", "model.safetensors", "validation.json",
                          "manifest.json"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(rels); i++) {
        char *src = kiln_path_join(dir, rels[i]), *dst = kiln_path_join(out, rels[i]);
        if (i < 4) CHECK("file content identical", kiln_test_same_file(src, dst));
        /* Flip one byte in place: the check must fail and name this file. */
        int fd = open(dst, O_RDWR);
        char c = 0;
        CHECK("open", fd >= 0 && pread(fd, &c, 1, 0) == 1);
        c ^= 1;
        CHECK("tamper", pwrite(fd, &c, 1, 0) == 1);
        kiln_err rc = kiln_manifest_verify_dir(pm, out);
        CHECK("tampered file fails the check", rc == KILN_ERR_VERIFY);
        CHECK("message names the file", kiln_test_msg_has(rels[i], "differs"));
        c ^= 1;
        CHECK("restore", pwrite(fd, &c, 1, 0) == 1);
        close(fd);
        CHECK("verifies again", kiln_manifest_verify_dir(pm, out) == KILN_OK);
        free(src);
        free(dst);
    }
    kiln_test_put(out, "golden/extra.bin", "x");
    CHECK("extra file fails", kiln_manifest_verify_dir(pm, out) == KILN_ERR_VERIFY &&
                                  kiln_test_msg_has("golden/extra.bin", "not in the manifest"));
    char *p = kiln_path_join(out, "golden/extra.bin");
    unlink(p);
    free(p);
    p = kiln_path_join(out, "golden/x.bin");
    char *moved = kiln_test_path("x.bin");
    rename(p, moved);
    CHECK("missing file fails", kiln_manifest_verify_dir(pm, out) == KILN_ERR_VERIFY &&
                                    kiln_test_msg_has("golden/x.bin", "missing"));
    symlink(moved, p);
    CHECK("symlink in place of a file fails",
          kiln_manifest_verify_dir(pm, out) == KILN_ERR_VERIFY &&
              kiln_test_msg_has("golden/x.bin", "symlink"));
    free(p);
    free(moved);
    CHECK("unpack onto an existing directory refused",
          kiln_archive_unpack(ar, out, NULL, NULL) == KILN_ERR_CONFLICT &&
              kiln_test_msg_has(out, "exists"));
    CHECK("the existing directory is untouched", kiln_path_exists(out));
out:
    kiln_manifest_free(pm);
    kiln_manifest_free(um);
    kiln_manifest_free(rm);
    free(dir);
    free(ar);
    free(out);
}

KILN_TEST(export_pack_inspect) {
    char *dir = model_dir("m", false), *ar = kiln_test_path("a.kiln");
    kiln_manifest *m = NULL;
    json_t *card = NULL;
    CHECK("packs", kiln_archive_pack(dir, "kat", "1.0", ar, NULL, NULL) == KILN_OK);
    CHECK("inspects", kiln_archive_inspect(ar, &m, &card) == KILN_OK);
    CHECK("card read", card && !strcmp(json_string_value(json_object_get(card, "name")), "kat"));
    CHECK("manifest read", m && !strcmp(m->version, "1.0") && !m->validation_present);
    json_decref(card);
    kiln_manifest_free(m);
    /* An archive whose card differs from its manifest's digest is refused. */
    kiln_manifest *good = NULL;
    CHECK("builds", kiln_manifest_build(dir, "kat", "1.0", &good) == KILN_OK);
    char *bad = kiln_test_path("bad.kiln");
    struct archive *a = hw_open(bad);
    hw_file(a, "manifest.json", good->text, good->text_len);
    char card2[] = CARD_KAT;
    card2[3] = 'C';
    hw_file(a, "card.json", card2, strlen(card2));
    hw_close(a);
    m = NULL;
    card = NULL;
    CHECK("changed card refused", kiln_archive_inspect(bad, &m, &card) == KILN_ERR_VERIFY &&
                                      kiln_test_msg_has("entry 'card.json'", "sha256 differs"));
    CHECK("nothing returned", !m && !card);
    CHECK("not an archive refused", kiln_archive_read_manifest(dir, &m) != KILN_OK && !m);
    kiln_manifest_free(good);
    free(bad);
    free(dir);
    free(ar);
}

KILN_TEST(export_pack_hostile_archives) {
    char *dir = model_dir("m", false), *ar = kiln_test_path("h.kiln");
    kiln_manifest *m = NULL;
    if (!CHECK("builds", kiln_manifest_build(dir, "kat", "1.0", &m) == KILN_OK)) goto out;
    static const struct {
        const char *path;
        mode_t type;
        int64_t size;
        const char *link;
        bool hard;
        kiln_err want;
        const char *what;
    } cases[] = {
        {"../x", AE_IFREG, 0, NULL, false, KILN_ERR_FORMAT, "entry '../x': path not allowed"},
        {"golden/../../x", AE_IFREG, 0, NULL, false, KILN_ERR_FORMAT, "path not allowed"},
        {"/tmp/kiln-hostile-abs", AE_IFREG, 0, NULL, false, KILN_ERR_FORMAT,
         "'/tmp/kiln-hostile-abs': path not allowed"},
        {"etc", AE_IFLNK, 0, "/etc", false, KILN_ERR_FORMAT, "entry 'etc': is a symlink to '/etc'"},
        {"golden", AE_IFLNK, 0, "/etc", false, KILN_ERR_FORMAT, "symlink"},
        {"hard", AE_IFREG, 0, "card.json", true, KILN_ERR_FORMAT, "entry 'hard': is a hard link"},
        {"null", AE_IFCHR, 0, NULL, false, KILN_ERR_FORMAT, "character device"},
        {"fifo", AE_IFIFO, 0, NULL, false, KILN_ERR_FORMAT, "fifo"},
        {"extra.bin", AE_IFREG, 3, NULL, false, KILN_ERR_VERIFY,
         "entry 'extra.bin': not in the manifest"},
        {"golden/empty", AE_IFDIR, 0, NULL, false, KILN_ERR_VERIFY,
         "holds no file of the manifest"},
        {"card.json", AE_IFREG, 170, NULL, false, KILN_ERR_FORMAT,
         "entry 'card.json': appears twice"},
        {"manifest.json", AE_IFREG, 3, NULL, false, KILN_ERR_FORMAT, "appears twice"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(cases); i++) {
        unlink(ar);
        struct archive *a = hw_open(ar);
        hw_file(a, "manifest.json", m->text, m->text_len);
        hw_file(a, "card.json", CARD_KAT, strlen(CARD_KAT)); /* a valid file is extracted first */
        hw_entry(a, cases[i].path, cases[i].type, cases[i].size, cases[i].link, cases[i].hard);
        if (cases[i].size) archive_write_data(a, CARD_KAT, (size_t)cases[i].size);
        hw_model_files(a, dir, "card.json");
        hw_close(a);
        refused(ar, cases[i].want, cases[i].what, cases[i].path);
    }
    CHECK("nothing escaped to /tmp", !kiln_path_exists("/tmp/kiln-hostile-abs"));

    /* A file listed in the manifest but absent from the archive. */
    unlink(ar);
    struct archive *a = hw_open(ar);
    hw_file(a, "manifest.json", m->text, m->text_len);
    hw_model_files(a, dir, "golden/x.bin");
    hw_close(a);
    refused(ar, KILN_ERR_VERIFY, "entry 'golden/x.bin': listed in the manifest but missing",
            "missing file");

    /* Right size, other bytes; and a manifest whose digest for a file was changed. */
    unlink(ar);
    a = hw_open(ar);
    hw_file(a, "manifest.json", m->text, m->text_len);
    hw_file(a, "model.safetensors", "NOT really safetensors", 22);
    hw_close(a);
    refused(ar, KILN_ERR_VERIFY, "entry 'model.safetensors': sha256 differs", "changed file");
    char *t = kiln_strdup(m->text);
    char *h = strstr(t, "84c58b88");
    if (h) *h = '9';
    unlink(ar);
    a = hw_open(ar);
    hw_file(a, "manifest.json", t, m->text_len);
    hw_model_files(a, dir, NULL);
    hw_close(a);
    refused(ar, KILN_ERR_VERIFY, "entry 'model.safetensors': sha256 differs",
            "manifest digest changed");
    if (h) *h = ' ';
    unlink(ar);
    a = hw_open(ar);
    hw_file(a, "manifest.json", t, m->text_len);
    hw_model_files(a, dir, NULL);
    hw_close(a);
    refused(ar, KILN_ERR_FORMAT, "entry 'manifest.json'", "manifest byte changed");
    free(t);

    /* The manifest must come first. */
    unlink(ar);
    a = hw_open(ar);
    hw_model_files(a, dir, NULL);
    hw_file(a, "manifest.json", m->text, m->text_len);
    hw_close(a);
    refused(ar, KILN_ERR_FORMAT, "the first entry is 'card.json'", "manifest not first");

    /* A header that claims 1 TB: written without blocking and abandoned after the header,
     * so the file holds the header and no data. */
    unlink(ar);
    fd_sink sink = {open(ar, O_WRONLY | O_CREAT | O_EXCL, 0644), false};
    a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    archive_write_set_bytes_per_block(a, 0);
    archive_write_open(a, &sink, NULL, fd_write, NULL);
    hw_file(a, "manifest.json", m->text, m->text_len);
    hw_entry(a, "model.safetensors", AE_IFREG, (int64_t)1 << 40, NULL, false);
    sink.closed = true; /* the padding free() would write is refused */
    archive_write_free(a);
    close(sink.fd);
    refused(ar, KILN_ERR_LIMIT, "entry 'model.safetensors': 1099511627776 bytes", "1 TB entry");

    /* 100000 empty entries (directories that would be accepted): the count limit stops it. */
    unlink(ar);
    a = hw_open(ar);
    hw_file(a, "manifest.json", m->text, m->text_len);
    for (int i = 0; i < 100000; i++)
        hw_entry(a, "golden", AE_IFDIR, 0, NULL, false);
    hw_model_files(a, dir, NULL);
    hw_close(a);
    refused(ar, KILN_ERR_LIMIT, "more than 10000 entries", "100000 entries");

    /* Garbage, and an empty file. */
    kiln_test_put(kiln_test_dir(), "g.kiln",
                  "this is not an archive at all, not even close to one.");
    char *g = kiln_test_path("g.kiln");
    refused(g, KILN_ERR_FORMAT, "g.kiln", "garbage");
    kiln_test_put(kiln_test_dir(), "g.kiln", "");
    refused(g, KILN_ERR_FORMAT, "g.kiln", "empty file");
    free(g);
out:
    kiln_manifest_free(m);
    free(dir);
    free(ar);
}

KILN_TEST(export_pack_unpack_limits) {
    char *dir = model_dir("m", true), *ar = kiln_test_path("a.kiln"), *out = kiln_test_path("u");
    CHECK("packs", kiln_archive_pack(dir, "kat", "1.0", ar, NULL, NULL) == KILN_OK);
    kiln_archive_limits lim;
    kiln_archive_limits_default(&lim);
    CHECK("documented defaults",
          lim.max_total_bytes == 64ull << 30 && lim.max_entries == 10000 && lim.max_path == 255);
    lim.max_entries = 4; /* manifest + 4 files = 5 */
    CHECK("entry limit", kiln_archive_unpack(ar, out, &lim, NULL) == KILN_ERR_LIMIT &&
                             kiln_test_msg_has("more than 4 entries", NULL));
    kiln_archive_limits_default(&lim);
    lim.max_path = 16; /* manifest.json 13, golden/x.bin 12, model.safetensors 17 */
    CHECK("path limit", kiln_archive_unpack(ar, out, &lim, NULL) == KILN_ERR_LIMIT &&
                            kiln_test_msg_has("entry 'model.safetensors': path of 17 bytes", NULL));
    kiln_archive_limits_default(&lim);
    lim.max_total_bytes = 200; /* manifest alone is longer */
    CHECK("size limit", kiln_archive_unpack(ar, out, &lim, NULL) == KILN_ERR_LIMIT &&
                            kiln_test_msg_has("past the limit of 200", NULL));
    CHECK("nothing left behind", !kiln_path_exists(out));
    char *listing = kiln_test_listing(kiln_test_dir());
    CHECK("no temporary directory left", listing && !strstr(listing, ".unpack-"));
    free(listing);
    lim.max_total_bytes = 2000;
    CHECK("raised limits pass", kiln_archive_unpack(ar, out, &lim, NULL) == KILN_OK);
    free(dir);
    free(ar);
    free(out);
}

/* Every allocation failing in turn: a clean error each time, no leaks (ASan checks). */
KILN_TEST(export_pack_alloc_failures) {
    char *dir = model_dir("m", true), *ar = kiln_test_path("a.kiln"), *out = kiln_test_path("u");
    bool clean = true;
    int n;
    for (n = 1; n < 200; n++) {
        kiln_alloc_fail_after(n);
        kiln_err rc = kiln_archive_pack(dir, "kat", "1.0", ar, NULL, NULL);
        kiln_alloc_fail_after(0);
        if (rc == KILN_OK) break;
        clean &= rc == KILN_ERR_NOMEM; /* core's atomic commit may fail after its rename */
    }
    CHECK("pack fails cleanly until it succeeds", clean && n < 200);
    unlink(ar);
    CHECK("packs again", kiln_archive_pack(dir, "kat", "1.0", ar, NULL, NULL) == KILN_OK);
    for (n = 1; n < 200; n++) {
        kiln_alloc_fail_after(n);
        kiln_err rc = kiln_archive_unpack(ar, out, NULL, NULL);
        kiln_alloc_fail_after(0);
        if (rc == KILN_OK) break;
        clean &= rc == KILN_ERR_NOMEM && !kiln_path_exists(out);
    }
    CHECK("unpack fails cleanly until it succeeds", clean && n < 200);
    free(dir);
    free(ar);
    free(out);
}

/* ---- the manifest parser -------------------------------------------------------- */

KILN_TEST(export_pack_manifest_parse_strict) {
    char *dir = model_dir("m", false);
    kiln_manifest *m = NULL, *x = NULL;
    if (!CHECK("builds", kiln_manifest_build(dir, "kat", "1.0", &m) == KILN_OK)) goto out;
    CHECK("own text parses", kiln_manifest_parse(m->text, m->text_len, "m", &x) == KILN_OK);
    kiln_manifest_free(x);
    x = NULL;
    static const struct {
        const char *from, *to, *what;
    } edits[] = {
        {"{\"created\"", "{ \"created\"", "canonical"},
        {"\"format\":\"kiln-manifest/1\"", "\"format\":\"kiln-manifest/2\"", "format"},
        {"\"name\":\"kat\"", "\"name\":\"../x\"", "name"},
        {"\"path\":\"card.json\"", "\"path\":\"/card.json\"", "not allowed"},
        {"\"path\":\"golden/x.bin\"", "\"path\":\"card.json\"", "sorted and unique"},
        {"\"path\":\"golden/x.bin\"", "\"path\":\"card.json/x\"", "as a file and as a directory"},
        {"\"size\":7", "\"size\":-7", "negative size"},
        {"\"version\":", "\"zzz\":1,\"version\":", "unknown key"},
        {"\"lineage\":{", "\"lineage\":[{", "JSON"},
        {"\"validation\":{\"passed\":null", "\"validation\":{\"passed\":true", "validation"},
        {"\"created\":\"2026-01-02T03:04:05.250+01:00\"", "\"created\":\"2026-13-02T03:04:05Z\"",
         "RFC 3339"},
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(edits); i++) {
        const char *at = strstr(m->text, edits[i].from);
        if (!CHECK("edit applies", at)) continue;
        char *t = kiln_asprintf("%.*s%s%s", (int)(at - m->text), m->text, edits[i].to,
                                at + strlen(edits[i].from));
        kiln_err rc = kiln_manifest_parse(t, strlen(t), "edited.json", &x);
        char buf[160];
        snprintf(buf, sizeof buf, "refused: %s", edits[i].to);
        CHECK(buf, rc != KILN_OK && !x && kiln_test_msg_has("edited.json", edits[i].what));
        kiln_manifest_free(x);
        x = NULL;
        free(t);
    }
out:
    kiln_manifest_free(m);
    free(dir);
}

/* Replay the seed corpus through the fuzz entry point; ok-* seeds must parse, the rest not. */
KILN_TEST(export_pack_fuzz_corpus_replay) {
    const char *cdir = "tests/fuzz/corpus/manifest";
    struct dirent **list;
    int n = scandir(cdir, &list, NULL, alphasort), ok = 0, bad = 0;
    if (!CHECK("corpus directory present", n > 0)) return;
    for (int i = 0; i < n; i++) {
        const char *nm = list[i]->d_name;
        if (nm[0] != '.') {
            char *p = kiln_path_join(cdir, nm);
            size_t len = 0;
            char *buf = slurp(p, &len);
            CHECK("seed readable", buf != NULL);
            if (buf) {
                kiln_fuzz_manifest((const uint8_t *)buf, len);
                kiln_manifest *m = NULL;
                kiln_err rc = kiln_manifest_parse(buf, len, nm, &m);
                bool want_ok = !strncmp(nm, "ok-", 3);
                char d[300];
                snprintf(d, sizeof d, "seed %s %s", nm, want_ok ? "parses" : "is refused");
                CHECK(d, want_ok ? rc == KILN_OK : rc != KILN_OK);
                want_ok ? ok++ : bad++;
                kiln_manifest_free(m);
            }
            free(buf);
            free(p);
        }
        free(list[i]);
    }
    free(list);
    CHECK("corpus has valid and invalid seeds", ok >= 1 && bad >= 5);
}

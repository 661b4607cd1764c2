/* archive.c - fuzz entry point for .kiln archives (untrusted bytes: whatever a registry or a
 * user hands to pull, verify, inspect or unpack). The bytes go to a temporary file, which is
 * read the ways kiln reads archives: the manifest alone, inspect (manifest and card), and the
 * full check of every entry against the manifest. An archive that passes the check is then
 * unpacked into a temporary directory, which must verify against its manifest, and removed. */
#include <stdlib.h>
#include <string.h>

#include "export_int.h"
#include "fuzz.h"

int kiln_fuzz_archive(const uint8_t *data, size_t size);

/* What read_manifest, inspect and check all promise about a manifest they return. */
static void check_manifest(const kiln_manifest *m) {
    if (!m || !kiln_manifest_find(m, "card.json") || !kiln_manifest_find(m, "model.safetensors"))
        abort();
    for (size_t i = 0; i < m->nfiles; i++)
        if (!kiln_export_path_ok(m->files[i].path, KILN_ARCHIVE_PATH_MAX) ||
            (i && strcmp(m->files[i - 1].path, m->files[i].path) >= 0))
            abort();
}

static bool same_manifest(const kiln_manifest *a, const kiln_manifest *b) {
    return a->text_len == b->text_len && !memcmp(a->text, b->text, a->text_len);
}

static void unpack(const char *path, const kiln_manifest *checked) {
    const char *tmp = getenv("TMPDIR");
    char *dir = kiln_asprintf("%s/kiln-fuzz-unpack-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!dir || !mkdtemp(dir)) {
        free(dir);
        return;
    }
    char *out = kiln_path_join(dir, "out");
    kiln_manifest *m = NULL;
    /* The check passed, so the unpack must too, and leave exactly what the manifest lists. */
    if (!out || kiln_archive_unpack(path, out, NULL, &m) != KILN_OK || !same_manifest(m, checked) ||
        kiln_manifest_verify_dir(m, out) != KILN_OK)
        abort();
    kiln_manifest_free(m);
    kiln_export_rmtree(dir);
    free(out);
    free(dir);
}

int kiln_fuzz_archive(const uint8_t *data, size_t size) {
    char *path = kiln_fuzz_tmp_write("kiln", data, size);
    if (!path) return 0;
    kiln_manifest *first = NULL, *inspected = NULL, *checked = NULL;
    json_t *card = NULL;
    if (kiln_archive_read_manifest(path, &first) == KILN_OK) check_manifest(first);
    if (kiln_archive_inspect(path, &inspected, &card) == KILN_OK) {
        check_manifest(inspected);
        if (!first || !same_manifest(first, inspected) || !card) abort();
    }
    if (kiln_archive_check(path, NULL, &checked) == KILN_OK) {
        check_manifest(checked);
        if (!first || !same_manifest(first, checked)) abort();
        unpack(path, checked);
    }
    kiln_manifest_free(first);
    kiln_manifest_free(inspected);
    kiln_manifest_free(checked);
    json_decref(card);
    kiln_fuzz_tmp_done(path);
    kiln_errclear();
    return 0;
}

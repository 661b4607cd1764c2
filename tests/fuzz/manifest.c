/* manifest.c - fuzz entry point for the .kiln manifest parser (untrusted bytes: the first
 * entry of any archive). A libFuzzer driver calls it from LLVMFuzzerTestOneInput; the C
 * suite replays tests/fuzz/corpus/manifest through it (tests/test_export_pack.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "export.h"

int kiln_fuzz_manifest(const uint8_t *data, size_t size);

int kiln_fuzz_manifest(const uint8_t *data, size_t size) {
    kiln_manifest *m = NULL;
    if (kiln_manifest_parse(data, size, "fuzz", &m) == KILN_OK) {
        /* What parsed must be self-consistent: canonical text, sorted unique paths. */
        if (m->text_len != size || memcmp(m->text, data, size) != 0) abort();
        for (size_t i = 0; i < m->nfiles; i++) {
            if (kiln_manifest_find(m, m->files[i].path) != &m->files[i]) abort();
            if (!kiln_export_path_ok(m->files[i].path, 4096)) abort();
        }
        if (!kiln_manifest_find(m, "card.json") || !kiln_manifest_find(m, "model.safetensors"))
            abort();
    }
    kiln_manifest_free(m);
    return 0;
}

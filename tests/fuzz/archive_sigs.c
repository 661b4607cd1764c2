/* archive_sigs.c - fuzz entry point for a signed archive's signature file (one or more
 * minisign blocks): split and parse every block, then each trusted comment as an archive's. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "sign.h"

int kiln_fuzz_archive_sigs(const uint8_t *data, size_t size);

int kiln_fuzz_archive_sigs(const uint8_t *data, size_t size) {
    kiln_sign_sig *sigs = NULL;
    size_t n = 0;
    if (kiln_sign_archive_sigs_parse((const char *)data, size, "fuzz.minisig", &sigs, &n) ==
        KILN_OK) {
        for (size_t i = 0; i < n; i++) {
            kiln_sign_archive_info info;
            if (kiln_sign_archive_comment_parse(sigs[i].trusted_comment, "tc", &info) == KILN_OK) {
                char *again = kiln_sign_archive_comment(&info);
                free(again);
            }
        }
        kiln_sign_archive_sigs_free(sigs, n);
    }
    kiln_errclear();
    return 0;
}

/* sig.c - fuzz entry point for minisign signature files: parse, then verify against the
 * vector key and message, so that well-formed inputs reach every check. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "sign.h"

int kiln_fuzz_sig(const uint8_t *data, size_t size);

int kiln_fuzz_sig(const uint8_t *data, size_t size) {
    kiln_sign_sig sig;
    kiln_sign_sig_init(&sig);
    kiln_sign_pubkey pk;
    if (kiln_sign_sig_parse((const char *)data, size, "fuzz.minisig", &sig) == KILN_OK &&
        kiln_sign_pubkey_from_base64(KILN_FUZZ_PUBKEY, "key", &pk) == KILN_OK) {
        kiln_err rc =
            kiln_sign_verify_buffer(&pk, &sig, KILN_FUZZ_MESSAGE, strlen(KILN_FUZZ_MESSAGE), "msg");
        kiln_sign_archive_info info;
        (void)kiln_sign_archive_comment_parse(sig.trusted_comment, "tc", &info);
        (void)rc;
    }
    kiln_sign_sig_release(&sig);
    kiln_errclear();
    return 0;
}

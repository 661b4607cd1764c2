/* seckey.c - fuzz entry point for minisign secret key files. Encrypted keys are parsed but
 * not decrypted: scrypt at minisign's parameters takes a gigabyte and seconds. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "sign.h"

int kiln_fuzz_seckey(const uint8_t *data, size_t size);

int kiln_fuzz_seckey(const uint8_t *data, size_t size) {
    kiln_sign_seckey *sk = NULL;
    if (kiln_sign_seckey_parse((const char *)data, size, "fuzz.key", &sk) == KILN_OK &&
        !kiln_sign_seckey_encrypted(sk)) {
        /* An accepted unencrypted key must sign what its public half verifies. */
        kiln_sign_pubkey pk;
        kiln_sign_sig sig;
        char *text = NULL;
        kiln_sign_sig_init(&sig);
        if (kiln_sign_seckey_pubkey(sk, &pk) != KILN_OK ||
            kiln_sign_buffer(sk, "m", 1, "t", KILN_SIGN_PREHASHED, &text) != KILN_OK ||
            kiln_sign_sig_parse(text, strlen(text), "s", &sig) != KILN_OK ||
            kiln_sign_verify_buffer(&pk, &sig, "m", 1, "m") != KILN_OK)
            __builtin_trap();
        kiln_sign_sig_release(&sig);
        free(text);
    }
    kiln_sign_seckey_free(sk);
    kiln_errclear();
    return 0;
}

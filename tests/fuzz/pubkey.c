/* pubkey.c - fuzz entry point for minisign public key files. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "sign.h"

int kiln_fuzz_pubkey(const uint8_t *data, size_t size);

int kiln_fuzz_pubkey(const uint8_t *data, size_t size) {
    kiln_sign_pubkey pk;
    if (kiln_sign_pubkey_parse((const char *)data, size, "fuzz.pub", &pk) == KILN_OK) {
        /* What parses must print back as a file that parses to the same key. */
        char *text = kiln_sign_pubkey_format(&pk);
        kiln_sign_pubkey again;
        if (!text || kiln_sign_pubkey_parse(text, strlen(text), "again", &again) != KILN_OK ||
            memcmp(&pk, &again, sizeof pk) != 0)
            __builtin_trap();
        free(text);
    }
    kiln_errclear();
    return 0;
}

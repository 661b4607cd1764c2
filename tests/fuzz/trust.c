/* trust.c - fuzz entry point for trust policies (trust.json). */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "sign.h"

int kiln_fuzz_trust(const uint8_t *data, size_t size);

int kiln_fuzz_trust(const uint8_t *data, size_t size) {
    kiln_sign_trust *t = NULL;
    if (kiln_sign_trust_parse((const char *)data, size, "fuzz.json", &t) == KILN_OK) {
        for (size_t i = 0; i < kiln_sign_trust_key_count(t); i++) {
            const kiln_sign_trust_key *k = kiln_sign_trust_key_at(t, i);
            if (kiln_sign_trust_find(t, k->pub.keyid) != k || !k->roles) __builtin_trap();
        }
        int th;
        if (kiln_sign_trust_threshold(t, "production", &th) == KILN_OK && th < 1) __builtin_trap();
    }
    kiln_sign_trust_free(t);
    kiln_errclear();
    return 0;
}

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
        /* each withdrawn digest found by itself, with its reason, and named once */
        for (size_t i = 0; i < kiln_sign_trust_withdrawn_count(t); i++) {
            const char *why, *d = kiln_sign_trust_withdrawn_at(t, i, &why);
            if (!d || strlen(d) != 71 || !why || !*why || kiln_sign_trust_withdrawn(t, d) != why)
                __builtin_trap();
            for (size_t j = 0; j < i; j++)
                if (!strcmp(kiln_sign_trust_withdrawn_at(t, j, NULL), d)) __builtin_trap();
        }
    }
    kiln_sign_trust_free(t);
    kiln_errclear();
    return 0;
}

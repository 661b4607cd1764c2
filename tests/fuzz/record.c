/* record.c - fuzz entry point for channel records: parse, then verify against a fixed
 * policy whose promote key (the vector key) signed the seed records. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "sign.h"

int kiln_fuzz_record(const uint8_t *data, size_t size);

static const char policy[] =
    "{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"vector\",\"pubkey\":\"" KILN_FUZZ_PUBKEY
    "\",\"roles\":[\"promote\",\"release\"]}],\"channels\":{\"production\":{\"threshold\":1},"
    "\"staging\":{\"threshold\":1}}}";

int kiln_fuzz_record(const uint8_t *data, size_t size) {
    kiln_sign_record r;
    kiln_sign_record_init(&r);
    if (kiln_sign_record_parse((const char *)data, size, "fuzz.json", &r) == KILN_OK) {
        kiln_sign_trust *t = NULL;
        kiln_sign_record_result res;
        if (kiln_sign_trust_parse(policy, sizeof policy - 1, "policy", &t) != KILN_OK)
            __builtin_trap();
        if (kiln_sign_record_verify(&r, t, 1800000000, 0, "fuzz.json", &res) == KILN_OK &&
            res.nsigners < (size_t)res.threshold)
            __builtin_trap();
        kiln_sign_trust_free(t);
    }
    kiln_sign_record_release(&r);
    kiln_errclear();
    return 0;
}

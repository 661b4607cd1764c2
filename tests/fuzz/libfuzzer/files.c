/* files.c - a main for one fuzz entry point without libFuzzer (gcc, no clang needed): each
 * file named on the command line goes through KILN_FUZZ_ENTRY once. For reproducing a crash
 * file under a debugger and for recording seeds (tests/fuzz/registry_client_seeds.sh);
 * `make build/fuzz-run-NAME` builds it for tests/fuzz/NAME.c. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core.h"

int KILN_FUZZ_ENTRY(const uint8_t *data, size_t size);

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        char *buf = NULL;
        size_t len = 0;
        if (kiln_read_file(argv[i], (size_t)1 << 30, &buf, &len) != KILN_OK) {
            fprintf(stderr, "%s: %s\n", argv[i], kiln_errmsg());
            return 2;
        }
        KILN_FUZZ_ENTRY((const uint8_t *)buf, len);
        free(buf);
    }
    return 0;
}

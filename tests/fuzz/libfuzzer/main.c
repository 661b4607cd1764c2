/* main.c - the libFuzzer wrapper `make fuzz` links with each tests/fuzz/NAME.c, built with
 * -DKILN_FUZZ_ENTRY=kiln_fuzz_NAME. The entry points stay plain functions so that
 * tests/test_fuzz_replay.c can replay the saved corpus without libFuzzer. */
#include <stddef.h>
#include <stdint.h>

int KILN_FUZZ_ENTRY(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    KILN_FUZZ_ENTRY(data, size);
    return 0;
}

/* fuzz.h - shared by the fuzz entry points in tests/fuzz/NAME.c: each defines
 * int kiln_fuzz_NAME(const uint8_t *data, size_t size), which takes any bytes, never
 * crashes or leaks, and returns 0. `make fuzz` runs them under libFuzzer;
 * tests/test_fuzz_replay.c replays tests/fuzz/corpus/NAME/ through them in `make test`. */
#ifndef KILN_FUZZ_H
#define KILN_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

/* The public key of shared/vectors/minisign/test.pub, which signed the seed inputs. */
#define KILN_FUZZ_PUBKEY "RWSZOapHYy2q7zXTxbL987oMDpT8r5AkK2m4nBviI9hT6h4CWkywdCKn"
/* What the seed signatures sign (shared/vectors/minisign/msg.txt). */
#define KILN_FUZZ_MESSAGE "hello model\n"

#endif

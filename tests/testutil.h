/* testutil.h - fixtures that several tests/test_*.c share: files in a directory, key
 * pairs, error-message checks. (test.h is the runner's interface; this is what tests
 * build their inputs with.) */
#ifndef KILN_TESTUTIL_H
#define KILN_TESTUTIL_H

#include <stdbool.h>

#include "core.h"
#include "sign.h"

/* Write text to dir/rel, creating the directories on the way (a failure shows up when the
 * test reads the file back). */
void kiln_test_put(const char *dir, const char *rel, const char *text);

/* The sorted names in a directory, each followed by '\n' ("?" when it cannot be read);
 * caller frees. */
char *kiln_test_listing(const char *dir);

/* True when both files can be read (up to 1 GiB) and hold the same bytes. */
bool kiln_test_same_file(const char *a, const char *b);

/* True when the last error message holds a, and b too when b is not NULL. */
bool kiln_test_msg_has(const char *a, const char *b);

/* A fresh key pair: the secret key (kiln_sign_seckey_free it) and the public key in base64,
 * as a trust policy names it. */
bool kiln_test_keypair(kiln_sign_seckey **sk, char b64[KILN_SIGN_PUBKEY_B64]);

#endif

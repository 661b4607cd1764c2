/* test.h - the C test runner's interface. A test is KILN_TEST(name) { CHECK(...); }
 * in any tests/NAME.c; the build collects them into one table. */
#ifndef KILN_TEST_H
#define KILN_TEST_H

#include <stdbool.h>
#include <stddef.h>

#include "core.h"

#define KILN_TEST(name) void test_##name(void)

/* Record a check; a failed one prints its description, file, line and the last
 * kiln error message. Returns cond so that a test can stop early:
 *   if (!CHECK("opens", rc == KILN_OK)) return; */
#define CHECK(descr, cond) kiln_check(!!(cond), (descr), __FILE__, __LINE__)
bool kiln_check(bool ok, const char *descr, const char *file, int line);

/* A fresh empty directory for the running test, removed after it passes. */
const char *kiln_test_dir(void);
/* Path (in a static buffer per call slot) of a file in the test directory. */
char *kiln_test_path(const char *name); /* caller frees */
/* Path of a file in tests/vectors (or $KILN_VECTORS); caller frees. */
char *kiln_test_vector(const char *name);
/* True under AddressSanitizer: heavy tests shrink their sizes, never their checks. */
bool kiln_test_sanitized(void);
/* Write bytes to a file in the test directory; returns its path (caller frees). */
char *kiln_test_write(const char *name, const void *data, size_t len);

#endif

#!/bin/sh
# The command table and the option parser, through the real binary.
. "$(dirname "$0")/lib.sh"
$KILN version | grep -q '^kiln ' || fail "version"
# The CUDA libraries are opened on first use, never by the dynamic linker at start-up:
# mapping cuBLAS cost every command 80-100 ms and 200 MB, and a machine without them could
# not start kiln at all (Makefile, CU_LIBS).
! ldd "$KILN" | grep -E 'libcublas|libcudart|libnccl' || fail "kiln links a CUDA library at start-up"
# The revision is the checkout's HEAD, not the one the objects were first built at.
rev=$(git -C "$(dirname "$0")" rev-parse --short=12 HEAD 2>/dev/null || true)
[ -z "$rev" ] || $KILN version | grep -q "($rev)" || fail "version: not HEAD's revision $rev: $($KILN version)"
$KILN --help | grep -q 'commands:' || fail "help"
expect_fail 2 $KILN no-such-command
expect_fail 2 $KILN version --bogus
expect_fail 2 $KILN version extra-arg
$KILN version --help | grep -q 'usage: kiln version' || fail "command help"

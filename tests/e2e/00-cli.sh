#!/bin/sh
# The command table and the option parser, through the real binary.
. "$(dirname "$0")/lib.sh"
$KILN version | grep -q '^kiln ' || fail "version"
$KILN --help | grep -q 'commands:' || fail "help"
expect_fail 2 $KILN no-such-command
expect_fail 2 $KILN version --bogus
expect_fail 2 $KILN version extra-arg
$KILN version --help | grep -q 'usage: kiln version' || fail "command help"

# Shared helpers for the end-to-end scripts: a scratch directory, and checks that
# print what went wrong. Source it: . "$(dirname "$0")/lib.sh"
set -eu
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-e2e-XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# expect_fail CODE CMD...: the command exits with CODE and prints "kiln: error:".
expect_fail() {
    want=$1; shift
    set +e; "$@" >"$T/out" 2>"$T/err"; got=$?; set -e
    [ "$got" -eq "$want" ] || { cat "$T/err" >&2; fail "'$*' exited $got, expected $want"; }
    grep -q 'kiln: error:' "$T/err" || fail "'$*' printed no error line"
}

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
# serve_url OUT ERR: waits (5 s at most) for the `kiln registry serve` writing its output to
# OUT and its errors to ERR to say where it listens, and sets URL to that address.
serve_url() {
    _w=0
    while ! grep -q 'http://' "$1" 2>/dev/null; do
        _w=$((_w + 1)); [ $_w -lt 100 ] || fail "server did not start: $(cat "$2")"; sleep 0.05
    done
    URL=$(sed -n 's/.* on \(http:\/\/127\.0\.0\.1:[0-9]*\).*/\1/p' "$1")
}

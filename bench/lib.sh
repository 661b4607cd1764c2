# lib.sh - sourced by the benchmark scripts that time a registry over loopback.
# serve_store ROOT: `$KILN registry serve` of the store ROOT on a free loopback port in the
# background (its output in $T/out, errors in $T/err); sets PID (the caller's EXIT trap stops
# it) and URL once the server says where it listens (5 s at most, else exit 2).
serve_store() {
    $KILN registry serve --root "$1" --listen 127.0.0.1:0 >"$T/out" 2>"$T/err" &
    PID=$!
    wait_url
}
# wait_url: URL once the server started in the background says in $T/out where it listens
# (5 s at most, else its errors from $T/err and exit 2).
wait_url() {
    _i=0
    while ! grep -q 'http://' "$T/out" 2>/dev/null; do
        _i=$((_i + 1)); [ $_i -lt 100 ] || { cat "$T/err" >&2; exit 2; }; sleep 0.05
    done
    URL=$(sed -n 's/.* on \(http:\/\/127\.0\.0\.1:[0-9]*\).*/\1/p' "$T/out")
}
# median FILE SCALE: the median of the numbers in FILE (one a line) times SCALE, to 3 places.
median() {
    sort -g "$1" | awk -v k="$2" '{ v[NR] = $1 } END { printf "%.3f", k * v[int((NR + 1) / 2)] }'
}

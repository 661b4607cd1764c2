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
# OUT and its errors to ERR to say where it listens, and sets URL to that address. OUT must
# have been emptied before the server started (a restart on the same file).
serve_url() {
    _w=0
    while ! grep -q 'https\{0,1\}://' "$1" 2>/dev/null; do
        _w=$((_w + 1)); [ $_w -lt 100 ] || fail "server did not start: $(cat "$2")"; sleep 0.05
    done
    URL=$(sed -n 's/.* on \(https\{0,1\}:\/\/127\.0\.0\.1:[0-9]*\).*/\1/p' "$1")
}
# serve_registry ROOT [OPTION...]: `kiln registry serve` of the store ROOT on a free loopback
# port, in the background (its output in $T/serve.out, its errors in $T/serve.err); sets PID
# and URL, and stops the server when the script exits.
serve_registry() {
    _root=$1; shift
    # Emptied here, not only by the background redirection: a restart's serve_url could
    # otherwise read the previous server's address before the new process truncated the file.
    : >"$T/serve.out"
    $KILN registry serve --root "$_root" --listen 127.0.0.1:0 "$@" >"$T/serve.out" 2>"$T/serve.err" &
    PID=$!
    trap 'kill $PID 2>/dev/null || true; rm -rf "$T"' EXIT
    serve_url "$T/serve.out" "$T/serve.err"
}
# tiny_run SEED: the trained run the release scripts start from, in $T: d.st (3000 rows of 6
# features and 2 outputs) and run/, 40 steps of a small model (d_model 16, d_ff 32, seq_len
# 16, window 8) with a checkpoint every 4 steps, all kept.
tiny_run() {
    $KILN data synth --seed "$1" --rows 3000 --features 6 --outputs 2 --out "$T/d.st" >/dev/null 2>&1 ||
        fail "synth"
    $KILN train --data "$T/d.st" --run-dir "$T/run" --set steps=40 --set ckpt_every=4 --set eval_every=4 \
        --set keep=0 --set d_model=16 --set d_ff=32 --set seq_len=16 --set attn_window=8 >/dev/null 2>"$T/train.log" ||
        { cat "$T/train.log" >&2; fail "train"; }
}
# rel_prom_trust: unencrypted key pairs $T/rel (release) and $T/prom (promote), and
# $T/trust.json trusting them with a threshold of 1 on production and unvalidated archives
# accepted: the registry scripts' policy.
rel_prom_trust() {
    for _k in rel prom; do $KILN keygen --out "$T/$_k" --no-password >/dev/null; done
    cat >"$T/trust.json" <<JSON
{"format":"kiln-trust/1","keys":[
 {"name":"rel","pubkey":"$(sed -n 2p "$T/rel.pub")","roles":["release"]},
 {"name":"prom","pubkey":"$(sed -n 2p "$T/prom.pub")","roles":["promote"]}],
 "channels":{"production":{"threshold":1}}, "accept_unvalidated": true}
JSON
}
# signed_archive CONTENT VERSION OUT KEY: a model of a few bytes ("weights CONTENT" and a card,
# in $T/m-VERSION-CONTENT) packed as demo VERSION into OUT and signed by KEY with
# --allow-unvalidated (the trusted comment binds the manifest and says the model is
# unvalidated): for the registry's scripts, which need signed archives, not models that load.
signed_archive() {
    mkdir -p "$T/m-$2-$1"
    printf 'weights %s' "$1" >"$T/m-$2-$1/model.safetensors"
    printf '%s' '{"name":"demo","created":"2026-03-04T05:06:07Z","lineage":{"run_id":"r-1","step":40,"dataset_sha256":"abcd","code_version":"0.1.0","metrics":{}}}' >"$T/m-$2-$1/card.json"
    $KILN pack "$T/m-$2-$1" --name demo --version "$2" --out "$3" >/dev/null
    $KILN sign "$3" --key "$4" --allow-unvalidated >/dev/null
}

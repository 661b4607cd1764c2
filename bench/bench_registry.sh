#!/bin/bash
# bench_registry.sh BUILD_DIR OUT_FILE - the registry's pull and verify throughput on a
# ~1 GiB archive over loopback, against baselines measured in the same run:
#   kiln pull NAME@CHANNEL        vs  curl -o of the same archive from nginx-light (sendfile)
#   kiln verify ARCHIVE --trust   vs  b2sum ARCHIVE and sha256sum ARCHIVE
#   kiln installed (the pulled directory checked again, as a restarted service does) vs the pull
#   kiln pull from an OCI registry (Debian's docker-registry, oci+http://) vs curl of the same
#     blob from it, and vs kiln pull from kiln's server (the OCI rows; skipped, and said so,
#     without docker-registry)
# Every figure is the median of KILN_BENCH_REPS runs (default 5). The archive is a real
# `kiln pack` of a model directory whose model.safetensors holds KILN_BENCH_MB MiB (default
# 1024) of random f32 weights, signed with a fresh key, published to `kiln registry serve`
# and promoted to a channel. Loopback only; every server started here is stopped and the
# temporary directory (several GiB) removed on exit, failure included.
# `make bench-registry` runs it (and installs nginx-light and curl when missing).
set -euo pipefail

BUILD=${1:?usage: bench_registry.sh BUILD_DIR OUT_FILE}
OUT=${2:?usage: bench_registry.sh BUILD_DIR OUT_FILE}
KILN=$(realpath "$BUILD/kiln")
REPS=${KILN_BENCH_REPS:-5}
MB=${KILN_BENCH_MB:-1024}
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
for t in "$NGINX" curl b2sum sha256sum lscpu openssl; do
    command -v "$t" >/dev/null || { echo "bench_registry: '$t' is missing" >&2; exit 2; }
done

T=$(mktemp -d /tmp/kiln-bench-registry.XXXXXX)
REG_PID=
PRIM2_PID=
MIR_PID=
NGINX_PID=
OCI_PID=
cleanup() {
    local rc=$?
    if [ -n "$REG_PID" ]; then kill -TERM "$REG_PID" 2>/dev/null && wait "$REG_PID" 2>/dev/null || true; fi
    if [ -n "$PRIM2_PID" ]; then kill -TERM "$PRIM2_PID" 2>/dev/null && wait "$PRIM2_PID" 2>/dev/null || true; fi
    if [ -n "$MIR_PID" ]; then kill -TERM "$MIR_PID" 2>/dev/null && wait "$MIR_PID" 2>/dev/null || true; fi
    if [ -n "$OCI_PID" ]; then kill -TERM "$OCI_PID" 2>/dev/null && wait "$OCI_PID" 2>/dev/null || true; fi
    if [ -n "$NGINX_PID" ]; then
        kill -QUIT "$NGINX_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$NGINX_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$NGINX_PID" 2>/dev/null || true
    fi
    rm -rf "$T"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
say() { echo "bench_registry: $*" >&2; }
# cpu KEY CMD...: run CMD, recording the CPU seconds (user + system) it and its children took as
# cpu:KEY (the machine is shared: wall time is noise when it is loaded, CPU time much less).
cpu() {
    local key=$1
    shift
    /usr/bin/time -f '%U %S' -o "$T/cpu.out" "$@"
    add "cpu:$key" "$(awk '{ printf "%.3f", $1 + $2 }' "$T/cpu.out")"
}

# Seconds taken by a command (its output discarded unless redirected by the caller).
now_ns() { date +%s%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.6f", (b - a) / 1e9 }'; }
median() { tr ' ' '\n' | { grep . || true; } | sort -g | awk '{ v[NR] = $1 } END {
    if (NR == 0) { print "nan"; exit }
    if (NR % 2) printf "%.6f", v[(NR + 1) / 2]; else printf "%.6f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# ---- the model directory and the archive ----
# model_dir DIR BYTES: a valid safetensors file of BYTES random f32 weights, a card and a
# passing validation report.
model_dir() {
    mkdir -p "$1"
    local bytes=$2 hdr n
    hdr="{\"weights\":{\"dtype\":\"F32\",\"shape\":[$((bytes / 4))],\"data_offsets\":[0,$bytes]}}"
    while [ $(((${#hdr} + 8) % 8)) -ne 0 ]; do hdr="$hdr "; done # data 8-byte aligned
    n=${#hdr}
    {
        printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x\\x00\\x00\\x00\\x00' $((n & 255)) $(((n >> 8) & 255)) \
            $(((n >> 16) & 255)) $(((n >> 24) & 255)))"
        printf '%s' "$hdr"
        head -c "$bytes" /dev/urandom
    } >"$1/model.safetensors"
    printf '%s' '{"name":"bench","created":"2026-01-01T00:00:00Z","lineage":{"run_id":"bench","step":1,"dataset_sha256":"0000","code_version":"0.1.0","metrics":{}}}' >"$1/card.json"
    printf '%s' '{"passed":true}' >"$1/validation.json"
}
say "writing a ${MB} MiB model.safetensors of random weights in $T"
M=$T/model
model_dir "$M" $((MB * 1024 * 1024))

A=$T/www/bench-1.0.0.kiln
mkdir -p "$T/www"
say "packing"
t0=$(now_ns)
mh=$("$KILN" pack "$M" --name bench --version 1.0.0 --out "$A" | sed -n 's/^manifest sha256 //p')
PACK_S=$(secs "$t0" "$(now_ns)")
rm -rf "$M" # 1 GiB less on the disk
ABYTES=$(stat -c %s "$A")
ADIGEST=$(sha256sum "$A" | cut -d' ' -f1)

for k in rel prom; do "$KILN" keygen --out "$T/$k" --no-password >/dev/null; done
pk() { sed -n 2p "$T/$1.pub"; }
cat >"$T/trust.json" <<JSON
{"format":"kiln-trust/1","keys":[
 {"name":"rel","pubkey":"$(pk rel)","roles":["release"]},
 {"name":"prom","pubkey":"$(pk prom)","roles":["promote"]}],
 "channels":{"production":{"threshold":1}}}
JSON
say "signing"
if "$KILN" sign --help 2>&1 | grep -q -- --allow-unvalidated; then
    # Signed-archive support: kiln writes the archive's trusted comment itself.
    "$KILN" sign "$A" --key "$T/rel.key" >/dev/null
else
    "$KILN" sign "$A" --key "$T/rel.key" \
        --trusted-comment "$(printf 'kiln-archive/1\tmodel:bench\tversion:1.0.0\tmanifest:sha256:%s' "$mh")" >/dev/null
fi

# ---- the registry ----
# serve NAME ROOT [OPTION...]: kiln registry serve of ROOT on a free loopback port in the
# background (its output in $T/NAME.out, .err); SERVED_PID and SERVED_URL (http or https) set.
serve() {
    local name=$1 root=$2
    shift 2
    "$KILN" registry serve --root "$root" --listen 127.0.0.1:0 --trust "$T/trust.json" "$@" \
        >"$T/$name.out" 2>"$T/$name.err" &
    SERVED_PID=$!
    for i in $(seq 200); do grep -q 'https\{0,1\}://' "$T/$name.out" 2>/dev/null && break; sleep 0.05; done
    SERVED_URL=$(sed -n 's/.* on \(https\{0,1\}:\/\/127\.0\.0\.1:[0-9]*\).*/\1/p' "$T/$name.out")
    [ -n "$SERVED_URL" ] || { say "$name did not start: $(cat "$T/$name.err")"; exit 2; }
}
R=$T/reg
PUB=$("$KILN" registry token create --root "$R" --name ci --scope publish)
PROM=$("$KILN" registry token create --root "$R" --name rm --scope promote)
serve serve "$R"
REG_PID=$SERVED_PID URL=$SERVED_URL
say "publishing to $URL"
t0=$(now_ns)
"$KILN" publish "$A" --registry "$URL" --token "$PUB" >/dev/null
PUBLISH_S=$(secs "$t0" "$(now_ns)")
"$KILN" promote bench 1.0.0 --channel production --key "$T/prom.key" --registry "$URL" \
    --token "$PROM" >/dev/null

# ---- an OCI registry: Debian's docker-registry on another loopback port, the same archive ----
OCI_URL=
if command -v docker-registry >/dev/null; then
    OCI_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    mkdir -p "$T/oci"
    printf 'version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: 127.0.0.1:%s\nlog:\n  level: error\n' \
        "$T/oci/data" "$OCI_PORT" >"$T/oci/config.yml"
    docker-registry serve "$T/oci/config.yml" >"$T/oci/log" 2>&1 &
    OCI_PID=$!
    for i in $(seq 200); do curl -s -o /dev/null "http://127.0.0.1:$OCI_PORT/v2/" && break; sleep 0.05; done
    OCI_URL=oci+http://127.0.0.1:$OCI_PORT/bench
    "$KILN" trust put "$T/trust.json" --registry "$OCI_URL" >/dev/null
    t0=$(now_ns)
    "$KILN" publish "$A" --registry "$OCI_URL" >/dev/null
    OCI_PUBLISH_S=$(secs "$t0" "$(now_ns)")
    "$KILN" promote bench 1.0.0 --channel production --key "$T/prom.key" --registry "$OCI_URL" >/dev/null
    say "OCI registry on $OCI_URL"
else
    say "docker-registry is not installed: no OCI rows"
fi

# ---- a certificate for 127.0.0.1 (self-signed), for the HTTPS rows ----
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$T/tls.key" \
    -out "$T/tls.pem" -days 30 -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
    2>"$T/tls.err" || { say "openssl: $(cat "$T/tls.err")"; exit 2; }

# ---- nginx-light on another loopback port, serving the archive's directory ----
mkdir -p "$T/nginx"
NGINX_URL=
NGINX_TLS_URL=
for try in $(seq 20); do
    port=$((20000 + RANDOM % 40000))
    tport=$((port + 1))
    cat >"$T/nginx/nginx.conf" <<CONF
daemon on;
master_process on;
worker_processes 1;
user root;
pid $T/nginx/nginx.pid;
error_log $T/nginx/error.log;
events { worker_connections 64; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    default_type application/octet-stream;
    client_body_temp_path $T/nginx/body;
    proxy_temp_path $T/nginx/proxy;
    server { listen 127.0.0.1:$port; root $T/www; }
    server {
        listen 127.0.0.1:$tport ssl;
        ssl_certificate $T/tls.pem;
        ssl_certificate_key $T/tls.key;
        root $T/www;
    }
}
CONF
    if "$NGINX" -p "$T/nginx" -e "$T/nginx/error.log" -c "$T/nginx/nginx.conf" 2>"$T/nginx/start.err"; then
        NGINX_PID=$(cat "$T/nginx/nginx.pid")
        NGINX_URL=http://127.0.0.1:$port
        NGINX_TLS_URL=https://127.0.0.1:$tport
        break
    fi
done
[ -n "$NGINX_URL" ] || { say "nginx did not start: $(cat "$T/nginx/start.err")"; exit 2; }
say "nginx-light on $NGINX_URL"

# ---- the measurements ----
# Every file read is in the page cache (just written, RAM permitting); writes go to $T's disk.
# sync between runs, outside the timed part, so one run's writeback does not land in the next.
declare -A RUNS
add() { RUNS[$1]="${RUNS[$1]:-} $2"; }
# download: since 2026-12-01 the archive is hashed and unpacked as it lands, so this phase
# holds nearly all of a pull; archive sha256 appears only when the pull fell back to a pass.
PHASES=("download" "archive sha256" "signatures, manifest and file digests" "install")
VERIFY_WHAT="signature only (BLAKE2b-512 of the file, Ed25519)"
for r in $(seq "$REPS"); do
    say "run $r of $REPS"
    rm -rf "$T/dl" "$T/pulled" "$T/state"
    sync
    t0=$(now_ns)
    cpu curl_nginx curl -sS -f -o "$T/dl" "$NGINX_URL/$(basename "$A")"
    add curl_nginx "$(secs "$t0" "$(now_ns)")"
    [ "$(stat -c %s "$T/dl")" = "$ABYTES" ] || { say "curl from nginx got a different size"; exit 2; }
    rm -f "$T/dl"
    sync
    t0=$(now_ns)
    cpu curl_registry curl -sS -f -o "$T/dl" "$URL/v1/blobs/sha256/$ADIGEST"
    add curl_registry "$(secs "$t0" "$(now_ns)")"
    [ "$(stat -c %s "$T/dl")" = "$ABYTES" ] || { say "curl from the registry got a different size"; exit 2; }
    rm -f "$T/dl"
    sync
    t0=$(now_ns)
    KILN_LOG=debug cpu pull "$KILN" pull bench@production --registry "$URL" --trust "$T/trust.json" \
        --state "$T/state" --out "$T/pulled" >/dev/null 2>"$T/pull.err"
    add pull "$(secs "$t0" "$(now_ns)")"
    [ -s "$T/pulled/model.safetensors" ] || { say "pull left no model"; exit 2; }
    for ph in "${PHASES[@]}"; do
        v=$(sed -n "s/^kiln: debug: pull phase: $ph: \([0-9.]*\) s.*/\1/p" "$T/pull.err" | tail -1)
        [ -n "$v" ] && add "phase:$ph" "$v"
    done
    if [ -n "$OCI_URL" ]; then
        rm -rf "$T/pulled" "$T/state"
        sync
        t0=$(now_ns)
        cpu curl_oci curl -sS -f -o "$T/dl" "http://127.0.0.1:$OCI_PORT/v2/bench/bench/blobs/sha256:$ADIGEST"
        add curl_oci "$(secs "$t0" "$(now_ns)")"
        [ "$(stat -c %s "$T/dl")" = "$ABYTES" ] || { say "curl from docker-registry got a different size"; exit 2; }
        rm -f "$T/dl"
        sync
        t0=$(now_ns)
        cpu pull_oci "$KILN" pull bench@production --registry "$OCI_URL" --trust "$T/trust.json" \
            --state "$T/state" --out "$T/pulled" >/dev/null 2>"$T/pull-oci.err"
        add pull_oci "$(secs "$t0" "$(now_ns)")"
        [ -s "$T/pulled/model.safetensors" ] || { say "pull from the OCI registry left no model"; exit 2; }
        # The kiln-server pull's directory again, for kiln installed below.
        rm -rf "$T/pulled" "$T/state"
        "$KILN" pull bench@production --registry "$URL" --trust "$T/trust.json" --state "$T/state" \
            --out "$T/pulled" >/dev/null 2>&1
    fi
    # What a restarted service checks instead of pulling again (its kept model; no registry).
    sync
    t0=$(now_ns)
    "$KILN" installed bench@production --dir "$T/pulled" --trust "$T/trust.json" --state "$T/state" \
        >"$T/inst.out" || { say "kiln installed failed: $(cat "$T/inst.out")"; exit 2; }
    add installed "$(secs "$t0" "$(now_ns)")"
    rm -rf "$T/pulled" "$T/state"
    sync
    t0=$(now_ns)
    cpu verify "$KILN" verify "$A" --trust "$T/trust.json" >"$T/verify.out"
    add verify "$(secs "$t0" "$(now_ns)")"
    grep -q 'every file matches the manifest' "$T/verify.out" &&
        VERIFY_WHAT="signatures, manifest and every file's sha256"
    t0=$(now_ns)
    cpu b2sum b2sum "$A" >/dev/null
    add b2sum "$(secs "$t0" "$(now_ns)")"
    t0=$(now_ns)
    cpu sha256sum sha256sum "$A" >/dev/null
    add sha256sum "$(secs "$t0" "$(now_ns)")"
done

med() { echo "${RUNS[$1]:-}" | median; }
mbs() { awk -v s="$1" -v b="$ABYTES" 'BEGIN { if (s > 0) printf "%.0f", b / 1e6 / s; else print "-" }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
row() { printf '%-44s %10.3f %9s %8s\n' "$1" "$2" "$3" "${4:-}"; }
cpus() { local v; v=$(med "cpu:$1"); [ "$v" = nan ] && echo "" || printf '%.3f' "$v"; }

C=$(med curl_nginx) CR=$(med curl_registry) P=$(med pull) V=$(med verify) B=$(med b2sum) S=$(med sha256sum)
I=$(med installed)
D=$(med "phase:download")
{
    echo "registry pull and verify, ${MB} MiB of random weights (median of $REPS runs)"
    echo "archive: $ABYTES bytes (kiln pack, zstd -3: random bytes do not shrink)"
    echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r)"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "versions: $("$KILN" version) at commit $(git -C "$(dirname "$0")" rev-parse --short=12 HEAD 2>/dev/null || echo unknown), nginx-light $(dpkg-query -W -f '${Version}' nginx-light 2>/dev/null || "$NGINX" -v 2>&1),"
    echo "  $(curl --version | head -1 | cut -d' ' -f1-2), libcurl $(dpkg-query -W -f '${Version}' libcurl4 2>/dev/null), libmicrohttpd $(dpkg-query -W -f '${Version}' libmicrohttpd12 2>/dev/null), libsodium $(dpkg-query -W -f '${Version}' libsodium23 2>/dev/null), coreutils $(dpkg-query -W -f '${Version}' coreutils 2>/dev/null)"
    echo "setup (once): pack $PACK_S s, publish $PUBLISH_S s"
    echo
    printf '%-44s %10s %9s %8s\n' "what" "seconds" "MB/s" "CPU s"
    row "curl -o from nginx-light (baseline)" "$C" "$(mbs "$C")" "$(cpus curl_nginx)"
    row "curl -o from kiln registry serve" "$CR" "$(mbs "$CR")" "$(cpus curl_registry)"
    row "kiln pull NAME@CHANNEL (everything)" "$P" "$(mbs "$P")" "$(cpus pull)"
    for ph in "${PHASES[@]}"; do
        v=$(med "phase:$ph")
        [ "$v" = nan ] && continue
        if [ "$ph" = install ]; then
            printf '%-44s %10.3f %9s\n' "  $ph" "$v" ""
        else
            row "  $ph" "$v" "$(mbs "$v")"
        fi
    done
    if [ -n "$OCI_URL" ]; then
        row "curl -o from docker-registry (OCI)" "$(med curl_oci)" "$(mbs "$(med curl_oci)")" "$(cpus curl_oci)"
        row "kiln pull NAME@CHANNEL from docker-registry" "$(med pull_oci)" "$(mbs "$(med pull_oci)")" "$(cpus pull_oci)"
    fi
    row "kiln installed (the pulled dir, re-checked)" "$I" "$(mbs "$I")"
    row "kiln verify ARCHIVE --trust" "$V" "$(mbs "$V")" "$(cpus verify)"
    row "b2sum ARCHIVE (baseline)" "$B" "$(mbs "$B")" "$(cpus b2sum)"
    row "sha256sum ARCHIVE" "$S" "$(mbs "$S")" "$(cpus sha256sum)"
    echo
    echo "kiln pull / curl from nginx:            $(ratio "$P" "$C")"
    [ "$D" != nan ] && echo "kiln pull's download / curl from nginx:  $(ratio "$D" "$C")"
    echo "curl from registry / curl from nginx:   $(ratio "$CR" "$C")"
    if [ -n "$OCI_URL" ]; then
        echo "kiln pull from OCI / kiln pull from kiln's server: $(ratio "$(med pull_oci)" "$P")  (the aim: at most 1.15)"
        echo "kiln pull from OCI / curl from docker-registry:    $(ratio "$(med pull_oci)" "$(med curl_oci)")"
        echo "OCI: docker-registry $(dpkg-query -W -f '${Version}' docker-registry 2>/dev/null); publish to it $OCI_PUBLISH_S s (trust put, then the blobs and the manifest)"
    fi
    echo "kiln verify / b2sum:                    $(ratio "$V" "$B")"
    echo "kiln verify / sha256sum:                $(ratio "$V" "$S")"
    echo "kiln installed / kiln pull:             $(ratio "$I" "$P")  (a service's restart on its kept model, against pulling it again)"
    echo "kiln installed / sha256sum:             $(ratio "$I" "$S")"
    echo "floor of a pull: max(curl, b2sum): the release signatures sign the archive's BLAKE2b-512,"
    echo "  one sequential pass over every byte; max(curl, b2sum) / curl: $(awk -v c="$C" -v b="$B" 'BEGIN { printf "%.2f", (b > c ? b : c) / c }')"
    echo "CPU s (user + system, the command and its threads; the servers' not counted):"
    echo "  kiln pull / curl from nginx: $(awk -v a="$(cpus pull)" -v b="$(cpus curl_nginx)" 'BEGIN { if (b > 0) printf "%.2f", a / b }')," \
        "kiln verify / b2sum: $(awk -v a="$(cpus verify)" -v b="$(cpus b2sum)" 'BEGIN { if (b > 0) printf "%.2f", a / b }')"
    echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "kiln verify checks: $VERIFY_WHAT"
    echo "pull phases: from the client's own log (KILN_LOG=debug, 'pull phase:' lines)"
} >"$OUT"

# ---- the same over HTTPS: the registry restarted on its store with a certificate ----
# (libmicrohttpd over GnuTLS, which cannot sendfile; nginx over OpenSSL is the baseline.)
kill -TERM "$REG_PID" && wait "$REG_PID" 2>/dev/null || true
REG_PID=
serve serve-tls "$R" --tls-cert "$T/tls.pem" --tls-key "$T/tls.key"
REG_PID=$SERVED_PID TURL=$SERVED_URL
say "HTTPS: registry $TURL, nginx $NGINX_TLS_URL"
for r in $(seq "$REPS"); do
    say "HTTPS run $r of $REPS"
    rm -rf "$T/dl" "$T/pulled" "$T/state"
    sync
    t0=$(now_ns)
    curl -sS -f --cacert "$T/tls.pem" -o "$T/dl" "$NGINX_TLS_URL/$(basename "$A")"
    add tls_nginx "$(secs "$t0" "$(now_ns)")"
    [ "$(stat -c %s "$T/dl")" = "$ABYTES" ] || { say "curl from nginx over HTTPS got a different size"; exit 2; }
    rm -f "$T/dl"
    sync
    t0=$(now_ns)
    curl -sS -f --cacert "$T/tls.pem" -o "$T/dl" "$TURL/v1/blobs/sha256/$ADIGEST"
    add tls_registry "$(secs "$t0" "$(now_ns)")"
    [ "$(stat -c %s "$T/dl")" = "$ABYTES" ] || { say "curl from the HTTPS registry got a different size"; exit 2; }
    rm -f "$T/dl"
    sync
    t0=$(now_ns)
    KILN_REGISTRY_CA="$T/tls.pem" "$KILN" pull bench@production --registry "$TURL" \
        --trust "$T/trust.json" --state "$T/state" --out "$T/pulled" >/dev/null 2>"$T/pull.err"
    add tls_pull "$(secs "$t0" "$(now_ns)")"
    [ -s "$T/pulled/model.safetensors" ] || { say "the HTTPS pull left no model: $(cat "$T/pull.err")"; exit 2; }
    rm -rf "$T/pulled" "$T/state"
done
TN=$(med tls_nginx) TR=$(med tls_registry) TP=$(med tls_pull)
{
    echo
    echo "over HTTPS (a self-signed P-256 certificate; the registry's libmicrohttpd over GnuTLS,"
    echo "  nginx over OpenSSL, curl and kiln over OpenSSL; median of $REPS runs)"
    printf '%-44s %10s %9s\n' "what" "seconds" "MB/s"
    row "curl -o from nginx-light, HTTPS (baseline)" "$TN" "$(mbs "$TN")"
    row "curl -o from kiln registry serve, HTTPS" "$TR" "$(mbs "$TR")"
    row "kiln pull NAME@CHANNEL, HTTPS" "$TP" "$(mbs "$TP")"
    echo
    echo "HTTPS curl from registry / from nginx:  $(ratio "$TR" "$TN")"
    echo "HTTPS curl from registry / HTTP:        $(ratio "$TR" "$CR")"
    echo "kiln pull over HTTPS / over HTTP:       $(ratio "$TP" "$P")"
} >>"$OUT"

# ---- mirrors: a sync of many versions, and pulls through a mirror ----
# KILN_BENCH_MIRROR_N archives of KILN_BENCH_MIRROR_MB MiB each (default 20 of 4), published
# to a second registry (it holds only those) and the newest promoted; nginx serves the same
# files. Each run: curl
# fetches the N files from nginx in one process (one kept-alive connection), then
# `kiln registry mirror --once` copies them (and verifies every one) into a new mirror, then
# again with nothing new; then `kiln pull` of the promoted one from the primary, from a
# served mirror, and with the primary down (--registry DOWN --registry MIRROR; port 1 refuses
# at once).
MN=${KILN_BENCH_MIRROR_N:-20}
MMB=${KILN_BENCH_MIRROR_MB:-4}
say "mirror: $MN archives of $MMB MiB"
mkdir -p "$T/www/mirror"
PUB2=$("$KILN" registry token create --root "$T/reg2" --name ci --scope publish)
PROM2=$("$KILN" registry token create --root "$T/reg2" --name rm --scope promote)
serve serve2 "$T/reg2"
PRIM2_PID=$SERVED_PID URL2=$SERVED_URL
for i in $(seq "$MN"); do
    rm -rf "$T/mm"
    model_dir "$T/mm" $((MMB * 1024 * 1024))
    "$KILN" pack "$T/mm" --name mirrored --version "1.0.$i" --out "$T/www/mirror/m-$i.kiln" >/dev/null
    "$KILN" sign "$T/www/mirror/m-$i.kiln" --key "$T/rel.key" >/dev/null
    "$KILN" publish "$T/www/mirror/m-$i.kiln" --registry "$URL2" --token "$PUB2" >/dev/null
done
rm -rf "$T/mm"
"$KILN" promote mirrored "1.0.$MN" --channel production --key "$T/prom.key" --registry "$URL2" \
    --token "$PROM2" >/dev/null
MBYTES=$(cat "$T"/www/mirror/*.kiln | wc -c)
ONE=$(stat -c %s "$T/www/mirror/m-$MN.kiln")
"$KILN" registry mirror --root "$T/served-mirror" --from "$URL2" --trust "$T/trust.json" --once >/dev/null
serve mserve "$T/served-mirror"
MIR_PID=$SERVED_PID MURL=$SERVED_URL
CURL_ARGS=()
for i in $(seq "$MN"); do CURL_ARGS+=(-o "$T/dl/m-$i" "$NGINX_URL/mirror/m-$i.kiln"); done
for r in $(seq "$REPS"); do
    say "mirror run $r of $REPS"
    rm -rf "$T/dl" "$T/mir"; mkdir -p "$T/dl"
    sync
    t0=$(now_ns)
    cpu m_curl curl -sS -f "${CURL_ARGS[@]}"
    add m_curl "$(secs "$t0" "$(now_ns)")"
    [ "$(cat "$T"/dl/* | wc -c)" = "$MBYTES" ] || { say "curl got other sizes"; exit 2; }
    rm -rf "$T/dl"
    sync
    t0=$(now_ns)
    cpu m_sync "$KILN" registry mirror --root "$T/mir" --from "$URL2" --trust "$T/trust.json" --once >"$T/mir.out"
    add m_sync "$(secs "$t0" "$(now_ns)")"
    grep -q "copied 0 trust versions, $MN versions" "$T/mir.out" || { say "sync: $(cat "$T/mir.out")"; exit 2; }
    t0=$(now_ns)
    "$KILN" registry mirror --root "$T/mir" --from "$URL2" --trust "$T/trust.json" --once >"$T/mir.out"
    add m_sync0 "$(secs "$t0" "$(now_ns)")"
    grep -q "0 versions (0 bytes downloaded)" "$T/mir.out" || { say "second sync: $(cat "$T/mir.out")"; exit 2; }
    rm -rf "$T/mir"
    for how in primary mirror failover; do
        case $how in
        primary) regs=(--registry "$URL2") ;;
        mirror) regs=(--registry "$MURL") ;;
        failover) regs=(--registry http://127.0.0.1:1 --registry "$MURL") ;;
        esac
        rm -rf "$T/pulled" "$T/state"
        sync
        t0=$(now_ns)
        "$KILN" pull mirrored@production "${regs[@]}" --trust "$T/trust.json" --state "$T/state" \
            --out "$T/pulled" >/dev/null 2>"$T/pull.err"
        add "m_pull_$how" "$(secs "$t0" "$(now_ns)")"
        [ -s "$T/pulled/model.safetensors" ] || { say "pull ($how) left no model: $(cat "$T/pull.err")"; exit 2; }
    done
done
rm -rf "$T/pulled" "$T/state"
mmbs() { awk -v s="$1" -v b="$2" 'BEGIN { if (s > 0) printf "%.0f", b / 1e6 / s; else print "-" }'; }
MC=$(med m_curl) MS=$(med m_sync) M0=$(med m_sync0)
PP=$(med m_pull_primary) PM=$(med m_pull_mirror) PF=$(med m_pull_failover)
{
    echo
    echo "mirrors: $MN archives of $MMB MiB of random weights, $MBYTES bytes in all (median of $REPS runs)"
    echo
    printf '%-52s %10s %9s\n' "what" "seconds" "MB/s"
    printf '%-52s %10.3f %9s\n' "curl -o of the $MN archives from nginx-light (baseline)" "$MC" "$(mmbs "$MC" "$MBYTES")"
    printf '%-52s %10.3f %9s\n' "kiln registry mirror --once (new mirror)" "$MS" "$(mmbs "$MS" "$MBYTES")"
    printf '%-52s %10.3f %9s\n' "kiln registry mirror --once (nothing new)" "$M0" ""
    printf '%-52s %10.3f %9s\n' "kiln pull of one ($ONE bytes) from the primary" "$PP" "$(mmbs "$PP" "$ONE")"
    printf '%-52s %10.3f %9s\n' "  from a mirror" "$PM" "$(mmbs "$PM" "$ONE")"
    printf '%-52s %10.3f %9s\n' "  primary down: --registry DOWN --registry MIRROR" "$PF" "$(mmbs "$PF" "$ONE")"
    echo
    echo "kiln registry mirror (new) / curl:        $(ratio "$MS" "$MC")"
    echo "  CPU s: mirror $(cpus m_sync), curl $(cpus m_curl)"
    echo "pull from a mirror / from the primary:    $(ratio "$PM" "$PP")"
    echo "pull with the primary down / from it:     $(ratio "$PF" "$PP")"
} >>"$OUT"

# ---- a model swap on a service's tick path (bench/bench_watch.c) ----
# A real (tiny) model with a file of ${MB} MiB of random bytes beside it (golden data, say), so
# that the generation a swap retires is a directory of that size, published to the second
# registry and promoted; bench_watch follows the channel and ticks a stream every 200 us while
# a small second version is promoted. Baseline: rm -rf of a copy of the retired directory,
# the work the last kiln_watch_release did on the tick path (under the watch's lock, so every
# kiln_watch_acquire waited too) before 2026-11-30; now the watcher's thread does it.
say "watch: a service swapping away from a ${MB} MiB model"
"$KILN" data synth --seed 1 --rows 600 --features 4 --outputs 1 --out "$T/w.st" >/dev/null 2>&1
"$KILN" train --data "$T/w.st" --run-dir "$T/wrun" --set steps=2 --set d_model=16 --set d_ff=32 \
    --set seq_len=16 --set attn_window=8 >/dev/null 2>&1
for v in 1 2; do
    "$KILN" export "$T/wrun" --out "$T/wm$v" --name watchbench >/dev/null
    printf '%s' '{"passed":true}' >"$T/wm$v/validation.json"
done
head -c $((MB * 1024 * 1024)) /dev/urandom >"$T/wm1/extra.bin"
for v in 1 2; do
    "$KILN" pack "$T/wm$v" --name watchbench --version "1.0.$v" --out "$T/w$v.kiln" >/dev/null
    "$KILN" sign "$T/w$v.kiln" --key "$T/rel.key" >/dev/null
    "$KILN" publish "$T/w$v.kiln" --registry "$URL2" --token "$PUB2" >/dev/null
done
rm -f "$T/w1.kiln" "$T/w2.kiln"
"$KILN" promote watchbench 1.0.1 --channel production --key "$T/prom.key" --registry "$URL2" \
    --token "$PROM2" >/dev/null
sync
"$BUILD/bench_watch" watchbench@production "$URL2" "$T/trust.json" "$T/wstate" "$T/wout" \
    >"$T/watch.out" 2>"$T/watch.err" &
WPID=$!
for _ in $(seq 1200); do
    grep -q '^ready$' "$T/watch.out" 2>/dev/null && break
    kill -0 "$WPID" 2>/dev/null || break
    sleep 0.1
done
grep -q '^ready$' "$T/watch.out" || { say "bench_watch did not start: $(cat "$T/watch.err")"; exit 2; }
"$KILN" promote watchbench 1.0.2 --channel production --key "$T/prom.key" --registry "$URL2" \
    --token "$PROM2" >/dev/null
wait "$WPID" || { say "bench_watch failed: $(cat "$T/watch.err")"; exit 2; }
RMS=()
for r in $(seq "$REPS"); do
    cp -R "$T/wm1" "$T/wcopy"
    sync
    t0=$(now_ns)
    rm -rf "$T/wcopy"
    RMS+=("$(secs "$t0" "$(now_ns)")")
done
RM=$(echo "${RMS[*]}" | median)
TMAX=$(awk '$1 == "swap" && $2 == "whole" { print $6 }' "$T/watch.out")
{
    echo
    echo "a model swap on a service's tick path: the retired generation a ${MB} MiB directory"
    echo "  (a tiny model and a file of random bytes), a stream ticked every 200 us (bench/bench_watch.c)"
    grep -v '^ready$' "$T/watch.out"
    printf 'rm -rf of a copy of the retired directory (baseline, median of %s): %.3f s\n' "$REPS" "$RM"
    echo "  (what the tick that released the old model did, holding the watch's lock, before 2026-11-30)"
    awk -v m="$TMAX" -v r="$RM" 'BEGIN { printf "slowest tick during the swap / rm -rf:  %.5f\n", m / 1e6 / r }'
} >>"$OUT"

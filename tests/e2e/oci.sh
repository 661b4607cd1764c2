# Helpers for the OCI scripts (72-74): Debian's docker-registry (CNCF distribution) on a
# loopback port, filesystem storage in $T, started here and stopped by its PID. Source it
# after lib.sh. Not numbered: run-all runs only NN-name.sh.
command -v docker-registry >/dev/null || fail "docker-registry is not installed (Debian: docker-registry)"
OCI_PIDS=
trap 'for _p in $OCI_PIDS; do kill "$_p" 2>/dev/null || true; done; rm -rf "$T"' EXIT
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# oci_registry NAME [AUTH]: a registry with its store and config.yml in $T/NAME; AUTH is the
# config's auth section (YAML, indented two spaces), none by default. Sets OCI_ADDR
# (127.0.0.1:PORT) and NAME_PID (e.g. a_PID), and remembers the PID for the exit.
oci_registry() {
    _n=$1 _port=$(free_port)
    mkdir -p "$T/$_n"
    {
        printf 'version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s\n' "$T/$_n/data"
        printf '  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:%s\nlog:\n  level: error\n' "$_port"
        [ $# -lt 2 ] || printf 'auth:\n%s\n' "$2"
    } >"$T/$_n/config.yml"
    oci_start "$_n" "$_port"
}
# oci_start NAME PORT: (re)start NAME's registry on its config.
oci_start() {
    docker-registry serve "$T/$1/config.yml" >"$T/$1/log" 2>&1 &
    eval "$1_PID=$!"
    OCI_PIDS="$OCI_PIDS $!"
    OCI_ADDR=127.0.0.1:$2
    _w=0
    until curl -s -o /dev/null "http://$OCI_ADDR/v2/"; do
        _w=$((_w + 1)); [ $_w -lt 100 ] || fail "docker-registry $1 did not start: $(cat "$T/$1/log")"; sleep 0.05
    done
}
# oci_stop NAME: stop NAME's registry by its PID and wait for it.
oci_stop() {
    eval "_p=\$$1_PID"
    kill "$_p" 2>/dev/null || true
    wait "$_p" 2>/dev/null || true
}
# manifest ADDR REPO REF: the manifest's bytes, as the registry serves them.
manifest() {
    curl -sf -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://$1/v2/$2/manifests/$3"
}

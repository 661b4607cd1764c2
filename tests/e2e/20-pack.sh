#!/bin/sh
# kiln pack / unpack / inspect as a user runs them: reproducible bytes across processes,
# times, file times and umasks; refusals that leave existing files alone.
. "$(dirname "$0")/lib.sh"

mk_model() {
    mkdir -p "$1/golden"
    printf 'weights, any bytes will do' >"$1/model.safetensors"
    printf '%s' '{"name":"demo","created":"2026-03-04T05:06:07Z","lineage":{"run_id":"r-1","step":40,"dataset_sha256":"abcd","code_version":"0.1.0","metrics":{"val_mse":0.125}}}' >"$1/card.json"
    printf 'golden rows\n' >"$1/golden/set-0.bin"
    printf '{"passed":true,"cases":3}\n' >"$1/validation.json"
}
M=$T/model
mk_model "$M"

# Reproducible: two processes, a second apart, other mtimes, modes and umask.
$KILN pack "$M" --name demo --version 1.2.0 --out "$T/a.kiln" >"$T/pack1.out"
grep -q "^packed '$T/a.kiln': demo 1.2.0, 4 files, validation passed" "$T/pack1.out" || fail "pack output: $(cat "$T/pack1.out")"
sleep 1
touch "$M/model.safetensors" "$M/golden/set-0.bin" "$M/golden"
chmod 600 "$M/card.json"
(umask 077 && $KILN pack "$M" --name demo --version 1.2.0 --out "$T/b.kiln" >/dev/null)
a=$(sha256sum "$T/a.kiln" | cut -d' ' -f1)
b=$(sha256sum "$T/b.kiln" | cut -d' ' -f1)
[ "$a" = "$b" ] || fail "two packs of the same directory differ: $a $b"
grep -q "^archive sha256  $a\$" "$T/pack1.out" || fail "printed archive digest is not the file's"

# The tar as other tools see it: zstd, manifest first, fixed owner and time.
if command -v zstd >/dev/null && command -v tar >/dev/null; then
    zstd -dcq "$T/a.kiln" | TZ=UTC tar -tvf - >"$T/list"
    head -1 "$T/list" | grep -q 'manifest.json$' || fail "manifest is not the first entry"
    [ "$(grep -c 'root/root' "$T/list")" -eq 5 ] || fail "owner not fixed: $(cat "$T/list")"
    [ "$(grep -c '2026-03-04 05:06' "$T/list")" -eq 5 ] || fail "mtime not the card's: $(cat "$T/list")"
fi

# Inspect without extracting.
$KILN inspect "$T/a.kiln" >"$T/insp"
grep -q '"version": "1.2.0"' "$T/insp" || fail "inspect shows no manifest"
grep -q '"run_id": "r-1"' "$T/insp" || fail "inspect shows no card"
grep -q '^validation: *passed' "$T/insp" || fail "inspect shows no verdict"
$KILN inspect --json "$T/a.kiln" >"$T/insp.json"
grep -q '"manifest_sha256": "[0-9a-f]\{64\}"' "$T/insp.json" || fail "inspect --json"

# Unpack: same files, manifest alongside; an existing directory is refused.
$KILN unpack "$T/a.kiln" --out "$T/u" >/dev/null
for f in model.safetensors card.json golden/set-0.bin validation.json; do
    cmp -s "$M/$f" "$T/u/$f" || fail "unpacked $f differs"
done
[ -f "$T/u/manifest.json" ] || fail "no manifest.json unpacked"
expect_fail 2 $KILN unpack "$T/a.kiln" --out "$T/u"
grep -q "exists already" "$T/err" || fail "unpack onto an existing directory: $(cat "$T/err")"
expect_fail 2 $KILN unpack "$T/a.kiln" --out "$T/v" --max-entries 3
grep -q "more than 3 entries" "$T/err" || fail "entry limit: $(cat "$T/err")"
[ ! -e "$T/v" ] || fail "a refused unpack left its directory"
ls -a "$T" | grep -q '\.unpack-' && fail "a refused unpack left its temporary directory"

# Refusals when packing leave an existing archive as it was.
printf 'old archive' >"$T/keep.kiln"
ln -s /etc/passwd "$M/golden/link"
expect_fail 2 $KILN pack "$M" --name demo --version 1.2.0 --out "$T/keep.kiln"
grep -q "golden/link': is a symlink" "$T/err" || fail "symlink: $(cat "$T/err")"
rm "$M/golden/link"
ln "$M/model.safetensors" "$M/golden/hard"
expect_fail 2 $KILN pack "$M" --name demo --version 1.2.0 --out "$T/keep.kiln"
grep -q "hard links" "$T/err" || fail "hard link: $(cat "$T/err")"
rm "$M/golden/hard"
expect_fail 2 $KILN pack "$M" --name Demo --version 1.2.0 --out "$T/keep.kiln"
expect_fail 2 $KILN pack "$M" --name demo --version ../1 --out "$T/keep.kiln"
mv "$M/card.json" "$T/card.json"
expect_fail 2 $KILN pack "$M" --name demo --version 1.2.0 --out "$T/keep.kiln"
grep -q "no card.json" "$T/err" || fail "missing card: $(cat "$T/err")"
[ "$(cat "$T/keep.kiln")" = "old archive" ] || fail "a refused pack changed the existing output"
ls -a "$T" | grep -q '\.tmp-' && fail "a refused pack left a temporary file"

# Not an archive.
expect_fail 2 $KILN inspect "$T/card.json"
expect_fail 2 $KILN unpack "$T/card.json" --out "$T/w"
[ ! -e "$T/w" ] || fail "unpack of garbage left a directory"
exit 0

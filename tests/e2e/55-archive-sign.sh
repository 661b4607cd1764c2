#!/bin/sh
# Signed .kiln archives as a release engineer uses them: pack, sign by two release keys,
# verify against a trust policy with release_threshold 2, unpack the verified directory;
# minisign -V reads the signatures; tampering with the archive, a file, the manifest, a
# signature, a trusted comment or a public key fails with a message naming it; unvalidated
# archives are refused unless signed with --allow-unvalidated, which the comment shows.
. "$(dirname "$0")/lib.sh"
cd "$T"
TAB=$(printf '\t')
# swapchar FILE LINE COL: print FILE with the base64 character at LINE, COL swapped for another.
swapchar() {
    awk -v l="$2" -v c="$3" 'NR == l { ch = substr($0, c, 1); r = (ch == "A") ? "B" : "A"
        $0 = substr($0, 1, c - 1) r substr($0, c + 1) } 1' "$1"
}

mk_model() {
    mkdir -p "$1/golden"
    printf 'weights, any bytes will do' >"$1/model.safetensors"
    printf '%s' '{"name":"demo","created":"2026-03-04T05:06:07Z","lineage":{"run_id":"r-1","step":40}}' >"$1/card.json"
    printf 'golden rows\n' >"$1/golden/set-0.bin"
}
mk_model m
printf '{"passed":true,"cases":3}\n' >m/validation.json
$KILN pack m --name demo --version 1.2.0 --out a.kiln >/dev/null || fail "pack"
mk_model u
$KILN pack u --name demo --version 1.2.1 --out u.kiln >/dev/null || fail "pack unvalidated"

for k in alice bob carol eve; do $KILN keygen --out $k --no-password >/dev/null || fail "keygen $k"; done
policy() { # policy FILE EXTRA [ALICE_PUBKEY]
    cat >"$1" <<EOF
{"format": "kiln-trust/1", "keys": [
  {"name": "alice", "pubkey": "${3:-$(tail -1 alice.pub)}", "roles": ["release"]},
  {"name": "bob", "pubkey": "$(tail -1 bob.pub)", "roles": ["release"]},
  {"name": "carol", "pubkey": "$(tail -1 carol.pub)", "roles": ["promote"]}],
 "channels": {}$2}
EOF
}
policy trust.json ', "release_threshold": 2'

# One signer is not enough; the same key twice is refused; a second key meets the threshold.
$KILN sign a.kiln --key alice.key >out || fail "sign alice"
grep -q '^wrote a.kiln.minisig (key id [0-9A-F]\{16\}, first signature)$' out || fail "sign output: $(cat out)"
grep -q "^trusted comment: kiln-archive/1${TAB}model:demo${TAB}version:1.2.0${TAB}manifest:sha256:[0-9a-f]\{64\}${TAB}validation:passed\$" a.kiln.minisig ||
    fail "archive comment: $(cat a.kiln.minisig)"
expect_fail 1 $KILN verify a.kiln --trust trust.json
grep -q "needs 2 distinct release keys, the archive is signed by 1 ('alice')" err || fail "threshold message: $(cat err)"
expect_fail 2 $KILN sign a.kiln --key alice.key
grep -q 'has signed this archive already' err || fail "same key twice: $(cat err)"
cat a.kiln.minisig a.kiln.minisig >twice.minisig
expect_fail 1 $KILN verify a.kiln --trust trust.json --sig twice.minisig
grep -q 'a key that signs twice counts once' err || fail "key counted twice: $(cat err)"
$KILN sign a.kiln --key bob.key >out || fail "sign bob"
grep -q 'another signature' out || fail "second signer output"
[ "$(grep -c '^trusted comment: kiln-archive/1' a.kiln.minisig)" -eq 2 ] || fail "two blocks"
$KILN verify a.kiln --trust trust.json >out || fail "verify: $(cat out)"
grep -q '^archive verified: a.kiln$' out || fail "verify output"
grep -q '^signed by alice ([0-9A-F]\{16\}), bob ([0-9A-F]\{16\}): 2 of 2 required release keys$' out || fail "signers: $(cat out)"
grep -q 'checked without unpacking' out || fail "no-out message"
ls -a | grep -q '\.verify-' && fail "temporary directory left behind"

# --out: the verified directory in place; an existing one refused.
$KILN verify a.kiln --trust trust.json --out v >/dev/null || fail "verify --out"
for f in model.safetensors card.json golden/set-0.bin validation.json manifest.json; do
    [ -f "v/$f" ] || fail "v/$f missing"
done
cmp -s m/golden/set-0.bin v/golden/set-0.bin || fail "unpacked file differs"
expect_fail 2 $KILN verify a.kiln --trust trust.json --out v
grep -q "exists already" err || fail "existing --out"

# Interop: minisign -V reads the first block as it stands, and any block cut out.
minisign -V -m a.kiln -p alice.pub >out || fail "minisign rejects the archive's signature"
grep -q "Trusted comment: kiln-archive/1${TAB}model:demo" out || fail "minisign comment"
sed -n '5,8p' a.kiln.minisig >bob.minisig
minisign -V -m a.kiln -p bob.pub -x bob.minisig >/dev/null || fail "minisign rejects bob's block"

# Tampering, each named; exit 1.
cp a.kiln t.kiln; cp a.kiln.minisig t.kiln.minisig
printf '\001' | dd of=t.kiln bs=1 seek=200 conv=notrunc 2>/dev/null
expect_fail 1 $KILN verify t.kiln --trust trust.json
grep -q "signature verification failed: 't.kiln' is not what key id" err || fail "archive byte: $(cat err)"

# A file changed by one byte, repacked (plain tar) under the same manifest, signed by both:
# the signatures pass and the unpack names the file.
$KILN unpack a.kiln --out x >/dev/null || fail "unpack"
printf 'golden rowz\n' >x/golden/set-0.bin
tar --format=ustar -cf f.kiln -C x manifest.json card.json golden/set-0.bin model.safetensors validation.json
$KILN sign f.kiln --key alice.key >/dev/null && $KILN sign f.kiln --key bob.key >/dev/null || fail "sign repacked"
expect_fail 1 $KILN verify f.kiln --trust trust.json --out fv
grep -q "entry 'golden/set-0.bin': sha256 differs from the manifest" err || fail "file byte: $(cat err)"
[ -e fv ] && fail "a failed verification left its --out"
ls -a | grep -q '\.verify-' && fail "temporary directory left behind after a failure"

# The manifest changed by one byte, signed (with minisign) over the new bytes but with the
# comment that named the old manifest.
sed 's/"step":40/"step":41/' x/manifest.json >x/m2 && mv x/m2 x/manifest.json
printf 'golden rows\n' >x/golden/set-0.bin
tar --format=ustar -cf g.kiln -C x manifest.json card.json golden/set-0.bin model.safetensors validation.json
TC=$(sed -n '3s/^trusted comment: //p' a.kiln.minisig)
minisign -S -s alice.key -m g.kiln -x g1 -t "$TC" >/dev/null && minisign -S -s bob.key -m g.kiln -x g2 -t "$TC" >/dev/null || fail "minisign -S"
cat g1 g2 >g.kiln.minisig
expect_fail 1 $KILN verify g.kiln --trust trust.json
grep -q "the trusted comment names manifest sha256:[0-9a-f]*, the manifest in 'g.kiln' is" err || fail "manifest byte: $(cat err)"

# A byte of a signature, of a trusted comment, of the global signature.
swapchar a.kiln.minisig 6 41 >s.minisig
expect_fail 1 $KILN verify a.kiln --trust trust.json --sig s.minisig
grep -q "signature 2': signature verification failed" err || fail "signature byte: $(cat err)"
sed '3s/version:1.2.0/version:1.2.9/' a.kiln.minisig >c.minisig
expect_fail 1 $KILN verify a.kiln --trust trust.json --sig c.minisig
grep -q "signature 1': global signature verification failed: the trusted comment" err || fail "comment byte: $(cat err)"

# A byte of a public key in the policy.
policy bad-trust.json ', "release_threshold": 2' "$(swapchar alice.pub 2 31 | tail -1)"
expect_fail 1 $KILN verify a.kiln --trust bad-trust.json
grep -q "signature 1': signature verification failed" err || fail "public key byte: $(cat err)"

# Keys outside the policy or the release role.
$KILN sign a.kiln --key eve.key --out eve.minisig >/dev/null || fail "sign eve"
cat a.kiln.minisig eve.minisig >mixed.minisig
expect_fail 1 $KILN verify a.kiln --trust trust.json --sig mixed.minisig
grep -q "signature 3': signed by key id [0-9A-F]*, which is not in the trust policy 'trust.json'" err || fail "foreign key: $(cat err)"
$KILN sign a.kiln --key carol.key --out carol.minisig >/dev/null || fail "sign carol"
expect_fail 1 $KILN verify a.kiln --trust trust.json --sig carol.minisig
grep -q "key 'carol' .* does not hold the 'release' role" err || fail "promote key: $(cat err)"

# Unvalidated: refused without the flag (nothing written), shown in the comment with it,
# refused by a policy without accept_unvalidated, accepted by one with it.
expect_fail 1 $KILN sign u.kiln --key alice.key
grep -q "'u.kiln': refusing to sign an unvalidated archive: its manifest names no validation report" err || fail "unvalidated: $(cat err)"
[ -e u.kiln.minisig ] && fail "a refused sign wrote a signature"
$KILN sign u.kiln --key alice.key --allow-unvalidated >out || fail "sign --allow-unvalidated"
grep -q 'validation absent (signed with --allow-unvalidated)' out || fail "sign output names the flag"
grep -q "${TAB}validation:absent${TAB}allow-unvalidated\$" u.kiln.minisig || fail "comment lacks the flag: $(cat u.kiln.minisig)"
policy one.json ''
expect_fail 1 $KILN verify u.kiln --trust one.json
grep -q "key 'alice' signed an unvalidated archive (validation:absent, allow-unvalidated) and the trust policy 'one.json' does not accept" err || fail "policy refusal: $(cat err)"
policy lenient.json ', "accept_unvalidated": true'
$KILN verify u.kiln --trust lenient.json >out || fail "lenient policy: $(cat out)"
grep -q '^validation absent (signed with allow-unvalidated; the policy accepts it)$' out || fail "verify names the flag"

# Archives take --trust; non-archives keep plain signatures.
expect_fail 2 $KILN verify a.kiln --pub alice.pub
expect_fail 2 $KILN sign a.kiln --key alice.key --trusted-comment x
printf 'plain\n' >p.bin
$KILN sign p.bin --key alice.key >/dev/null && $KILN verify p.bin --pub alice.pub | grep -q '^trusted comment: timestamp:' || fail "plain files"
exit 0

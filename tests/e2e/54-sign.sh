#!/bin/sh
# Keys, signatures and channel records through the real binary, and interoperability with
# Debian's minisign both ways (keys encrypted and not, prehashed and legacy signatures).
. "$(dirname "$0")/lib.sh"
cd "$T"
printf 'model bytes\n' > model.bin

# keygen: minisign's formats; never over an existing key.
$KILN keygen --out rel --no-password > out || fail "keygen"
grep -q '^key id [0-9A-F]\{16\}$' out || fail "keygen prints the key id"
[ "$(stat -c %a rel.key)" = 600 ] || fail "secret key mode"
cp rel.key rel.key.orig
expect_fail 2 $KILN keygen --out rel --no-password
grep -q "rel.key' exists already" "$T/err" || fail "overwrite message"
cmp -s rel.key rel.key.orig || fail "existing key changed"

# kiln signs, minisign verifies; kiln verifies and prints the trusted comment.
$KILN sign model.bin --key rel.key --trusted-comment 'build 42' > /dev/null || fail "sign"
minisign -Vm model.bin -p rel.pub > out || fail "minisign rejects kiln's signature"
grep -q 'Trusted comment: build 42' out || fail "minisign reads the trusted comment"
$KILN verify model.bin --pub rel.pub > out || fail "verify"
grep -q '^trusted comment: build 42$' out || fail "verify prints the trusted comment"

# minisign signs with kiln's key, kiln verifies (prehashed and legacy).
minisign -S -s rel.key -m model.bin -x m.minisig -t 'from minisign' > /dev/null || fail "minisign reads kiln's key"
$KILN verify model.bin --pub rel.pub --sig m.minisig | grep -q 'from minisign' || fail "kiln verifies minisign"
minisign -S -l -s rel.key -m model.bin -x l.minisig > /dev/null || fail "minisign legacy"
$KILN verify model.bin --pub rel.pub --sig l.minisig > /dev/null || fail "kiln verifies legacy"

# A key pair made by minisign: kiln signs with it, minisign verifies.
minisign -G -W -p mm.pub -s mm.key > /dev/null || fail "minisign -G"
$KILN sign model.bin --key mm.key --out mm.minisig > /dev/null || fail "kiln reads minisign's key"
minisign -Vm model.bin -p mm.pub -x mm.minisig > /dev/null || fail "minisign verifies kiln with its key"

# Tampering: each part named, exit 1.
cp model.bin bad.bin; printf 'x' >> bad.bin; cp model.bin.minisig bad.bin.minisig
expect_fail 1 $KILN verify bad.bin --pub rel.pub
grep -q 'signature verification failed' "$T/err" || fail "changed file"
sed '3s/build 42/build 43/' model.bin.minisig > tc.minisig
expect_fail 1 $KILN verify model.bin --pub rel.pub --sig tc.minisig
grep -q 'global signature verification failed' "$T/err" || fail "changed trusted comment"
expect_fail 1 $KILN verify model.bin --pub mm.pub
grep -q 'key id mismatch' "$T/err" || fail "other key"
head -n 3 model.bin.minisig > short.minisig
expect_fail 1 $KILN verify model.bin --pub rel.pub --sig short.minisig
grep -q "short.minisig' line 4" "$T/err" || fail "malformed names the line"
expect_fail 2 $KILN verify model.bin --pub no-such.pub

# An encrypted key (password from KILN_PASSWORD_FILE): minisign signs with it.
printf 'correct horse\n' > pw
KILN_PASSWORD_FILE=pw $KILN keygen --out enc > /dev/null || fail "encrypted keygen"
sed -n 2p enc.key | base64 -d | head -c 4 | grep -q 'EdSc' || fail "scrypt-encrypted key"
printf 'correct horse\n' | minisign -S -s enc.key -m model.bin -x e.minisig > /dev/null 2>&1 ||
    fail "minisign decrypts kiln's encrypted key"
$KILN verify model.bin --pub enc.pub --sig e.minisig > /dev/null || fail "verify with encrypted key's pub"
: > empty
KILN_PASSWORD_FILE=empty expect_fail 2 $KILN keygen --out enc2
grep -q "empty password" "$T/err" || fail "empty password refused"
[ ! -e enc2.key ] || fail "no key written on an empty password"

# Trust policy and channel records: production needs 2 of 3 promote keys.
for k in p1 p2 p3 stranger; do $KILN keygen --out $k --no-password > /dev/null; done
pub() { sed -n 2p "$1.pub"; }
cat > trust.json <<JSON
{
  "format": "kiln-trust/1",
  "keys": [
    {"name": "release-bot", "pubkey": "$(pub rel)", "roles": ["release"]},
    {"name": "alice", "pubkey": "$(pub p1)", "roles": ["promote"]},
    {"name": "bob", "pubkey": "$(pub p2)", "roles": ["promote"]},
    {"name": "carol", "pubkey": "$(pub p3)", "roles": ["promote"]}
  ],
  "channels": {"production": {"threshold": 2}, "staging": {"threshold": 1}}
}
JSON
$KILN verify model.bin --trust trust.json | grep -q "key 'release-bot'" || fail "release key accepted"
$KILN sign model.bin --key p1.key --out p1.minisig > /dev/null
expect_fail 1 $KILN verify model.bin --trust trust.json --sig p1.minisig
grep -q "does not hold the 'release' role" "$T/err" || fail "promote key cannot release"

D=$(sha256sum model.bin | cut -c1-64)
$KILN channel sign --model alpha --channel production --version 1.2.0 --digest "$D" --seq 7 \
    --expires 30d --reason 'weekly retrain' --key p1.key --out rec.json > /dev/null || fail "channel sign"
expect_fail 1 $KILN channel verify rec.json --trust trust.json
grep -q 'needs 2 distinct promote keys, the record is signed by 1' "$T/err" || fail "threshold"
expect_fail 2 $KILN channel sign --add rec.json --key p1.key
grep -q 'already signed by key id' "$T/err" || fail "same key twice"
$KILN channel sign --add rec.json --key p2.key > /dev/null || fail "second signer"
$KILN channel verify rec.json --trust trust.json > out || fail "2 of 3 verifies"
grep -q 'signed by alice .*, bob .*: 2 of 2 required' out || fail "signers listed"
expect_fail 1 $KILN channel verify rec.json --trust trust.json --now 2099-01-01T00:00:00Z
grep -q 'expired at' "$T/err" || fail "expiry"
expect_fail 1 $KILN channel verify rec.json --trust trust.json --min-seq 8
grep -q 'rollback' "$T/err" || fail "rollback"
cp rec.json rec3.json
$KILN channel sign --add rec3.json --key stranger.key > /dev/null
expect_fail 1 $KILN channel verify rec3.json --trust trust.json
grep -q 'not in the trust policy' "$T/err" || fail "stranger refused"
sed 's/"version": "1.2.0"/"version": "1.2.1"/' rec.json > forged.json
expect_fail 1 $KILN channel verify forged.json --trust trust.json
grep -q 'signature verification failed' "$T/err" || fail "forged record"
expect_fail 2 $KILN channel sign --model alpha --channel staging --version 1 --digest "$D" --seq 1 \
    --expires 30d --reason r --key p1.key --out rec.json
expect_fail 2 $KILN channel sign --add rec.json --key p3.key --seq 9

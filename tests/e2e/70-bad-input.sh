#!/bin/sh
# Bad input, swept: every kiln command that reads a file or directory the user names gets, in
# each such slot and one at a time with everything else valid, a missing path, a directory
# where a file goes (a file where a directory goes), an empty file, random bytes, a valid file
# of another kind, the valid file cut at 1 byte, at half and short of its last byte, a FIFO
# and a link to /dev/zero (which every row takes: nothing may wait on a FIFO's writer or read
# a device for ever), and for JSON invalid JSON, a duplicate key and a wrong type; a directory
# slot gets each of its members damaged in turn, and a FIFO and /dev/zero in its place. Each case must exit 1 or 2 (as its row says; never 0, a signal or a
# hang), print one 'kiln: error:' line that names the offending path and says what is wrong,
# and leave every file as it was: nothing the command was told to write appears, no input
# changes. Adding a command is one row in the table below (docs/architecture.md, "Bad input").
. "$(dirname "$0")/lib.sh"
JOBS=${KILN_SWEEP_JOBS:-2} # lanes of cases run side by side, each in its own copy of the files
LIMIT=${KILN_SWEEP_LIMIT:-60} # seconds after which a case is hung (a shorter one to hunt hangs)
# KILN_SWEEP_LABELS=fifo,zero runs only the variants of those labels (a quicker look).

# ---- valid fixtures (in $T/pristine, which each lane copies) -------------------------------
L0=$T/pristine
F=$L0/fx
mkdir -p "$F" "$L0/bad" "$L0/out"
printf 'not the password\n' >"$T/wrong-pw"
printf 'correct horse\n' >"$T/good-pw"
export KILN_PASSWORD_FILE="$T/wrong-pw" # a key that asks for a password never waits on a tty
q() { "$@" >"$T/fixture.log" 2>&1 || { cat "$T/fixture.log" >&2; fail "fixture: $*"; }; }
q $KILN data synth --seed 3 --rows 600 --features 6 --outputs 2 --out "$F/d.st"
$KILN data export "$F/d.st" --rows 64 >"$F/d.csv" || fail "fixture: data export"
FEATS=ret,flow,volume,basis,noise0,noise1
TARGS=fwd_ret_1,fwd_ret_2
head -1 "$F/d.csv" | grep -q "^$FEATS,$TARGS\$" || fail "fixture: csv header $(head -1 "$F/d.csv")"
$KILN train --print-config --set steps=4 --set ckpt_every=4 --set eval_every=4 --set keep=0 \
    --set d_model=16 --set d_ff=32 --set seq_len=16 --set attn_window=8 >"$F/cfg.json" ||
    fail "fixture: config"
q $KILN train --config "$F/cfg.json" --data "$F/d.st" --run-dir "$F/run"
q $KILN export "$F/run" --out "$F/m"
q $KILN golden make --model "$F/m" --data "$F/d.st" --windows 2
q $KILN validate --model "$F/m" --data "$F/d.st" --make-bf16
q $KILN export "$F/run" --dtype bf16 --out "$F/m16"
q $KILN pack "$F/m" --name demo --version 1.0.0 --out "$F/m.kiln"
q $KILN pack "$F/m" --name demo --version 1.0.1 --out "$F/m2.kiln"
for k in rel prom root; do q $KILN keygen --out "$F/$k" --no-password; done
# A self-signed certificate for 127.0.0.1 and its key (registry serve --tls-cert/--tls-key).
q openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$F/srv.key" \
    -out "$F/srv.pem" -days 3650 -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1
KILN_PASSWORD_FILE="$T/good-pw" q $KILN keygen --out "$F/enc"
cat >"$F/trust.json" <<JSON
{"format": "kiln-trust/1", "keys": [
 {"name": "rel", "pubkey": "$(tail -1 "$F/rel.pub")", "roles": ["release"]},
 {"name": "prom", "pubkey": "$(tail -1 "$F/prom.pub")", "roles": ["promote"]}],
 "channels": {"staging": {"threshold": 1}, "production": {"threshold": 1}}}
JSON
# A policy with a root key, and its version 2 signed by that key (kiln trust).
cat >"$F/trustr.json" <<JSON
{"format": "kiln-trust/1", "keys": [
 {"name": "root", "pubkey": "$(tail -1 "$F/root.pub")", "roles": ["root"]},
 {"name": "prom", "pubkey": "$(tail -1 "$F/prom.pub")", "roles": ["promote"]}],
 "channels": {"staging": {"threshold": 1}}}
JSON
sed 's/"format": "kiln-trust\/1",/"format": "kiln-trust\/1", "version": 2,/' "$F/trustr.json" >"$F/v2.json"
q $KILN trust sign "$F/v2.json" --key "$F/root.key" --out "$F/v2.signed.json"
q $KILN sign "$F/m.kiln" --key "$F/rel.key"
q $KILN sign "$F/m2.kiln" --key "$F/rel.key"
printf 'any bytes at all\n' >"$F/file.bin"
q $KILN sign "$F/file.bin" --key "$F/rel.key"
D=$(sha256sum "$F/m.kiln" | cut -c1-64)
q $KILN channel sign --model demo --channel staging --version 1.0.0 --digest "$D" --seq 1 \
    --expires 30d --reason sweep --key "$F/prom.key" --out "$F/rec.json"
cp "$F/rec.json" "$F/recadd.json" # signed in place by the --add rows
q $KILN registry token create --root "$F/reg" --name sweep --scope read

# A registry the network rows talk to (outside the lanes: its store changes as it serves).
PUB=$($KILN registry token create --root "$T/srv" --name ci --scope publish)
PROM=$($KILN registry token create --root "$T/srv" --name rm --scope promote)
ADM=$($KILN registry token create --root "$T/srv" --name ops --scope admin)
serve_registry "$T/srv" --trust "$F/trust.json"
q $KILN publish "$F/m.kiln" --registry "$URL" --token "$PUB"
# A dataset in the registry (kiln data pull), and its digest.
q $KILN data publish "$F/d.st" --name ds --registry "$URL" --key "$F/rel.key" --token "$PUB"
DH=$(sha256sum "$F/d.st" | cut -c1-64)
# A model a pull installed, and the state that pull left (kiln installed).
q $KILN channel put "$F/rec.json" --registry "$URL" --token "$PROM"
q $KILN pull demo@staging --registry "$URL" --trust "$F/trust.json" --state "$F/istate" --out "$F/inst"
# A primary's store with a version in it (kiln registry mirror refuses it): the served one's
# database, copied consistently.
mkdir -p "$F/prim/blobs/sha256" "$F/prim/tmp"
sqlite3 "$T/srv/registry.db" ".backup '$F/prim/registry.db'" || fail "fixture: a primary's store"

# ---- corrupted variants --------------------------------------------------------------------
# Each kind gets $B/KIND.list: "LABEL PATH NEEDLE" per variant; NEEDLE is what the error must
# name (the variant's basename: every variant's name is its own).
B=$L0/bad
# Fixed pseudo-random bytes (Park-Miller, seed 42): the same on every machine.
printf "$(awk 'BEGIN { s = 42; for (i = 0; i < 4096; i++) { s = (s * 16807) % 2147483647; printf "\\%03o", s % 256 } }')" >"$T/random"
[ "$(wc -c <"$T/random")" -eq 4096 ] || fail "random bytes"

fixture_of() { # KIND: the valid fixture of that kind
    case $1 in
    dataset) echo "$F/d.st" ;; csv) echo "$F/d.csv" ;; config) echo "$F/cfg.json" ;;
    modelfile) echo "$F/m/model.safetensors" ;; archive) echo "$F/m.kiln" ;;
    asig) echo "$F/m.kiln.minisig" ;; key) echo "$F/rel.key" ;; pub) echo "$F/rel.pub" ;;
    sig) echo "$F/file.bin.minisig" ;; blob) echo "$F/file.bin" ;; trust) echo "$F/trust.json" ;;
    record) echo "$F/rec.json" ;; run) echo "$F/run" ;; model) echo "$F/m" ;; m16) echo "$F/m16" ;;
    signedtrust) echo "$F/v2.signed.json" ;;
    cert) echo "$F/srv.pem" ;; certkey) echo "$F/srv.key" ;;
    root) echo "$F/reg" ;; inst) echo "$F/inst" ;;
    *) fail "no fixture of kind $1" ;;
    esac
}
add() { printf '%s %s %s\n' "$1" "${2#$L0/}" "${3:-${2##*/}}" >>"$list"; } # paths from the lane's root
# cut SRC DST HOW: the first byte, half, or all but the last (a text file's last byte before
# its final newline, so that the cut always removes content).
cut_file() {
    n=$(wc -c <"$1")
    [ "$(tail -c 1 "$1" | od -An -c | tr -d ' ')" = '\n' ] && n=$((n - 1))
    case $3 in 1) m=1 ;; half) m=$((n / 2)) ;; last) m=$((n - 1)) ;; esac
    head -c "$m" "$1" >"$2"
}
# JSON damage to SRC into DST: invalid (the first ':' made '='), a duplicate of KEY's first
# scalar pair, KEY's first value made an array.
json_bad() {
    case $3 in
    invalid) sed '0,/:/s/:/ =/' "$1" >"$2" ;;
    dupkey) sed -E "0,/\"$4\": *(\"[^\"]*\"|[-0-9.eE+]+|true|false|null)/s//&, &/" "$1" >"$2" ;;
    wrongtype) sed -E "0,/\"$4\": *(\"[^\"]*\"|[-0-9.eE+]+|true|false|null)/s//\"$4\": [true]/" "$1" >"$2" ;;
    esac
    cmp -s "$1" "$2" && fail "json_bad $3 $4 changed nothing in $1"
    return 0
}
# file_kind KIND JSONKEY OTHER...: the variants of a file slot.
file_kind() {
    kind=$1 key=$2; shift 2
    src=$(fixture_of "$kind") d=$B/$kind list=$B/$kind.list base=${src##*/}
    mkdir -p "$d"; : >"$list"
    add missing "$d/missing-$base"
    mkdir "$d/dir-$base"; add dir "$d/dir-$base"
    : >"$d/empty-$base"; add empty "$d/empty-$base"
    cp "$T/random" "$d/random-$base"; add random "$d/random-$base"
    mkfifo "$d/fifo-$base"; add fifo "$d/fifo-$base"
    ln -s /dev/zero "$d/zero-$base"; add zero "$d/zero-$base"
    for o; do cp -R "$(fixture_of "$o")" "$d/kind-$o-$base"; add "kind-$o" "$d/kind-$o-$base"; done
    for c in 1 half last; do cut_file "$src" "$d/cut$c-$base" $c; add "cut$c" "$d/cut$c-$base"; done
    if [ "$key" != - ]; then
        for c in invalid dupkey wrongtype; do json_bad "$src" "$d/$c-$base" $c "$key"; add "$c" "$d/$c-$base"; done
    fi
}
# dir_kind KIND OTHER MEMBER=PATH[:KEY...]...: the variants of a directory slot: missing, a
# file, empty, a FIFO, /dev/zero, another kind of directory, and each member gone, empty,
# random, cut in half, a FIFO (and for JSON members invalid, a duplicate of the first KEY, each
# KEY of the wrong type: label wrongtype-KEY), one at a time.
dir_kind() {
    kind=$1 other=$2; shift 2
    src=$(fixture_of "$kind") d=$B/$kind list=$B/$kind.list base=${src##*/}
    mkdir -p "$d"; : >"$list"
    add missing "$d/missing-$base"
    cp "$F/file.bin" "$d/file-$base"; add file "$d/file-$base"
    mkdir "$d/empty-$base"; add empty "$d/empty-$base"
    mkfifo "$d/fifo-$base"; add fifo "$d/fifo-$base"
    ln -s /dev/zero "$d/zero-$base"; add zero "$d/zero-$base"
    cp -R "$(fixture_of "$other")" "$d/kind-$other-$base"; add "kind-$other" "$d/kind-$other-$base"
    for mem; do
        label=${mem%%=*} p=${mem#*=} keys=
        case $p in *:*) keys=$(echo "${p#*:}" | tr : ' ') p=${p%%:*} ;; esac
        cs="gone empty random cuthalf fifo"
        [ -z "$keys" ] || cs="$cs invalid dupkey"
        for k in $keys; do cs="$cs wrongtype-$k"; done
        for c in $cs; do
            v=$d/$label-$c-$base
            cp -R "$src" "$v"
            case $c in
            gone) rm "$v/$p" ;; empty) : >"$v/$p" ;; random) cp "$T/random" "$v/$p" ;;
            fifo) rm "$v/$p"; mkfifo "$v/$p" ;;
            cuthalf) cut_file "$src/$p" "$v/$p" half ;;
            invalid | dupkey) json_bad "$src/$p" "$v/$p" $c ${keys%% *} ;;
            wrongtype-*) json_bad "$src/$p" "$v/$p" wrongtype "${c#wrongtype-}" ;;
            esac
            add "$label/$c" "$v"
        done
    done
}
file_kind dataset - modelfile archive
file_kind csv - dataset trust
file_kind config steps trust record
file_kind modelfile - dataset archive
file_kind archive - dataset asig
file_kind asig - pub record
file_kind key - pub trust
list=$B/key.list; add encrypted "$F/enc.key" # encrypted, and KILN_PASSWORD_FILE is wrong
file_kind pub - key sig
file_kind sig - pub dataset
file_kind blob - dataset
file_kind trust format record config
file_kind record seq trust asig
file_kind signedtrust format trust record
file_kind cert - certkey pub
file_kind certkey - cert key
dir_kind run model run.json=run.json:run_id ckpt=ckpt/step-00000004.safetensors metrics.db=metrics.db
dir_kind model run model=model.safetensors card=card.json:val_fraction:created \
    golden=golden/golden.safetensors golden.json=golden/golden.json:format:data_sha256 \
    validation=validation.json:passed
dir_kind m16 model model=model.safetensors card=card.json:val_fraction
dir_kind root model registry.db=registry.db
dir_kind inst model model=model.safetensors card=card.json manifest=manifest.json
# Outputs: where a command is told to write, paths it must refuse without leaving anything.
d=$B/out list=$B/outfile.list; mkdir -p "$d"; : >"$list"
add noparent "$d/no-such-dir/x.out" no-such-dir
: >"$d/a-file"; add parentfile "$d/a-file/x.out" a-file
mkdir "$d/dir-x.out"; add isdir "$d/dir-x.out"
list=$B/outdir.list; : >"$list"
add noparent "$d/no-such-dir/x" no-such-dir
add parentfile "$d/a-file/x" a-file
cp "$F/file.bin" "$d/file-x"; add isfile "$d/file-x"
mkdir "$d/full-x"; cp "$F/file.bin" "$d/full-x/"; add nonempty "$d/full-x"
list=$B/primary.list; : >"$list"; add primary "$F/prim"
list=$B/keybase.list; : >"$list"
cp "$F/rel.key" "$d/haskey.key"; add keyexists "$d/haskey" haskey.key
cp "$F/rel.pub" "$d/haspub.pub"; add pubexists "$d/haspub" haspub.pub
mkdir "$d/keydir.key"; add keyisdir "$d/keydir" keydir.key
add noparent "$d/no-such-dir/k" no-such-dir

# ---- the table -----------------------------------------------------------------------------
# row STATUS KIND ONLY EXTRA ARGS: run 'kiln ARGS' once per variant of KIND whose label ONLY
# admits (comma-separated shell patterns; !PATTERN excludes), with $S the variant's path, $F
# the valid fixtures, $O an empty directory for outputs, $c the case's number. STATUS: the exit
# statuses allowed (12: 1 or 2). EXTRA: a pattern other stderr lines may match (a documented
# multi-line form), or -. vrow: kiln validate, which prints 'kiln: failed:' lines and, when a
# check fails (exit 1), writes its report $O/v.json by design.
: >"$T/rows"
row() { printf '%s|%s|%s|%s|-|%s\n' "$1" "$2" "$3" "$4" "$5" >>"$T/rows"; }
vrow() { printf '%s|%s|%s|kiln: failed: *|v.json|%s\n' "$1" "$2" "$3" "$4" >>"$T/rows"; }
TRAIN='--config $F/cfg.json'
REL='--name rel --version 9.$c.0 --registry $URL --token $PUB --windows 2 --no-bf16 --out-dir $O/rel --state $O/state'
# A parser is swept in full by one row (data inspect, train --config, runs show, validate,
# inspect, verify --pub/--sig/--trust, channel verify, ...); the other rows that load the same
# kind of file with it get a few variants, enough to see their own message and exit status.
Q='missing,dir,empty,random,kind-*,cuthalf'
STORED='missing,file,empty,kind-*'
# Checkpoints: a run skips those that do not verify (a warning each); none verifying is exit 1
# for export (docs/validation.md) and a start over from step 0 for a resume (docs/train.md).
# metrics.db and run.json are optional to export (the card's metrics are null without them);
# metrics.db to runs show, diff and list (a run that has logged nothing yet), and a resume
# makes a missing or empty one anew (it is the run's log; the checkpoint holds the state).
CKPT='kiln: warning: skipping checkpoint: *'
# datasets
row 2 dataset '*' - 'data inspect $S'
row 2 dataset "$Q" - 'data export $S'
row 2 dataset "$Q" - "train $TRAIN --data \$S --run-dir \$O/run"
row 2 dataset "$Q" - 'infer --model $F/m --input $S --out $O/y.st'
row 2 dataset "$Q" - 'golden make --model $F/m --data $S --windows 2 --out $O/golden'
vrow 2 dataset "$Q" 'validate --model $F/m --data $S --report $O/v.json'
row 2 dataset "$Q" - "release \$F/run --data \$S --key \$F/rel.key --trust \$F/trust.json $REL"
# A CSV cut short of its last byte is a CSV whose last number lost a digit.
row 2 csv '*,!cutlast' - "data import --csv \$S --features $FEATS --targets $TARGS --out \$O/x.st"
# training
row 2 config '*' - "train --config \$S --data \$F/d.st --run-dir \$O/run"
row 2 config 'invalid,dupkey,wrongtype' - 'train --print-config --config $S'
row 2 modelfile "$Q" - "train $TRAIN --data \$F/d.st --run-dir \$O/run --init \$S"
row 2 run '*,!ckpt/*,!metrics.db/gone,!metrics.db/empty' - 'train --resume $S'
# sweeps: a spec is a JSON file like a config (a config's keys are no spec's); a directory
# that holds no sweep.json has no status (docs/orchestration.md)
row 2 config '*' - 'sweep $S --root $O/sw --scheduler local'
row 2 run 'missing,file,empty,run.json/gone' - 'sweep status $S'
# run directories
row 2 run '*,!ckpt/*,!metrics.db/gone' - 'runs show $S'
row 2 run "$STORED,run.json/*,metrics.db/random" - 'runs diff $S $F/run'
row 2 run "$STORED,run.json/invalid,run.json/wrongtype-*,metrics.db/cuthalf" - 'runs diff $F/run $S'
row 2 run 'missing,file,metrics.db/*' - 'runs plot $S'
row 2 run 'missing,file,metrics.db/*,run.json/*' - 'runs explain $S'
# runs list: a path that is no run and holds none exits 2; a broken run is a row of its own
# with its error line on stderr, and exit 1 (docs/train.md); a FIFO or /dev/zero is no run (2).
row 2 run "$STORED" - 'runs list $S'
row 1 run 'run.json/*,metrics.db/empty,metrics.db/random,metrics.db/cuthalf,!fifo,!zero' - 'runs list $S'
row 12 run "$STORED,run.json/invalid,run.json/wrongtype-*,ckpt/*" "$CKPT" 'export $S --out $O/m'
row 12 run "$STORED,run.json/wrongtype-*,ckpt/random" "$CKPT" "release \$S --key \$F/rel.key --trust \$F/trust.json $REL"
# model directories and files: a model without card.json holds out 0.2 of the data
# (docs/validation.md); pack reads the card's created and lineage only, validate and golden
# make its val_fraction only; infer reads model.safetensors only.
row 2 model "$STORED,model/random,card/invalid,card/wrongtype-val_fraction" - 'golden make --model $S --data $F/d.st --windows 2 --out $O/golden'
vrow 12 model "$STORED,model/random,model/cuthalf,card/invalid,card/wrongtype-val_fraction,golden/gone,golden/cuthalf,golden.json/invalid,golden.json/dupkey,golden.json/wrongtype-*" 'validate --model $S --data $F/d.st --report $O/v.json'
vrow 12 model 'missing,file,golden/cuthalf,golden.json/wrongtype-format' 'validate --model $F/m --data $F/d.st --baseline $S --report $O/v.json'
vrow 12 m16 "$STORED,model/random,card/wrongtype-val_fraction" 'validate --model $F/m --data $F/d.st --bf16 $S --report $O/v.json'
# --reference: a file without `outputs` [W,S,O] for the golden inputs is an error, not a check.
vrow 2 modelfile "$Q" 'validate --model $F/m --data $F/d.st --reference $S --report $O/v.json'
# release --model: the directory and its card are checked before anything is written.
row 2 model "$STORED,model/gone,card/gone,card/invalid,card/wrongtype-created" - "release --model \$S --data \$F/d.st --key \$F/rel.key --trust \$F/trust.json $REL"
row 2 model "$STORED,model/*" - 'infer --model $S --input $F/d.st --out $O/y.st'
row 2 modelfile "$Q" - 'infer --model $S --input $F/d.st --out $O/y.st'
# A model directory without validation.json packs as "validation absent".
row 2 model "$STORED,card/gone,card/invalid,card/wrongtype-created,validation/random,validation/wrongtype-passed" - 'pack $S --name demo --version 1.0.0 --out $O/x.kiln'
# archives and signatures
row 2 archive '*' - 'inspect $S'
row 2 archive '*' - 'unpack $S --out $O/u'
row 2 archive "$Q" - 'sign $S --key $F/rel.key --out $O/x.minisig'
row 12 archive "$Q" - 'verify $S --trust $F/trust.json --sig $F/m.kiln.minisig'
row 12 asig '*' - 'verify $F/m.kiln --trust $F/trust.json --sig $S'
row 12 blob '*' - 'verify $S --pub $F/rel.pub --sig $F/file.bin.minisig'
row 12 pub '*' - 'verify $F/file.bin --pub $S'
row 12 sig '*' - 'verify $F/file.bin --pub $F/rel.pub --sig $S'
row 2 trust '*' - 'verify $F/file.bin --trust $S'
row 2 trust 'missing,invalid' - 'verify $F/m.kiln --trust $S'
row 2 key '*' - 'sign $F/file.bin --key $S --out $O/x.minisig'
row 2 key "$Q" - 'sign $F/m.kiln --key $S --out $O/x.minisig'
row 2 keybase '*' - 'keygen --out $S --no-password'
# channel records
row 12 record '*' - 'channel verify $S --trust $F/trust.json'
row 2 trust 'missing,cuthalf,dupkey' - 'channel verify $F/rec.json --trust $S'
row 2 record 'missing,random,invalid,dupkey,wrongtype' - 'channel sign --add $S --key $F/prom.key'
row 2 key "$Q" - 'channel sign --add $F/recadd.json --key $S'
row 2 key "$Q" - "channel sign --model demo --channel staging --version 1.0.0 --digest $D --seq 2 --expires 30d --reason r --key \$S --out \$O/r.json"
# trust policy versions (a signed policy is a trust file too: the sweep's trust rows read it)
row 12 signedtrust '*' - 'trust verify $S --trust $F/trustr.json'
row 2 trust "$Q,invalid,dupkey" - 'trust verify $F/v2.signed.json --trust $S'
row 2 trust "$Q,invalid,wrongtype" - 'trust sign $S --key $F/root.key --out $O/s.json'
row 2 key "$Q" - 'trust sign $F/trustr.json --key $S --out $O/s.json'
row 2 outfile '*' - 'trust sign $F/trustr.json --key $F/root.key --out $S'
row 2 signedtrust "$Q,invalid,dupkey,wrongtype" - 'trust sign --add $S --key $F/root.key'
row 2 signedtrust "$Q,invalid,wrongtype" - 'trust put $S --registry $URL --token $ADM'
row 2 signedtrust 'missing,random,dupkey' - 'channel verify $F/rec.json --trust $S'
# the registry
row 2 record 'missing,empty,invalid,wrongtype' - 'channel put $S --registry $URL --token $PROM'
row 2 archive "$Q" - 'publish $S --sig $F/m2.kiln.minisig --registry $URL --token $PUB'
row 12 asig "$Q" - 'publish $F/m2.kiln --sig $S --registry $URL --token $PUB'
row 2 trust 'missing,dir,invalid,wrongtype' - 'pull demo@1.0.0 --registry $URL --trust $S --out $O/p --state $O/state'
row 2 trust 'missing,dir,empty,invalid,wrongtype' - 'provenance demo@1.0.0 --registry $URL --trust $S --state $O/state'
row 2 dataset "$Q" - 'data publish $S --name ds$c --registry $URL --key $F/rel.key --token $PUB'
row 2 key "$Q" - 'data publish $F/d.st --name ds$c --registry $URL --key $S --token $PUB'
row 2 trust 'missing,dir,invalid,wrongtype' - "data pull ds@sha256:$DH --registry \$URL --trust \$S --out \$O/d.st"
row 2 dataset "$Q" - 'reproduce demo@1.0.0 --registry $URL --trust $F/trust.json --state $O/state --workdir $O/w --data $S'
row 2 trust 'missing,dir,invalid,wrongtype' - 'reproduce demo@1.0.0 --registry $URL --trust $S --state $O/state --workdir $O/w --data $F/d.st'
row 2 outdir 'isfile' - 'provenance demo@1.0.0 --registry $URL --trust $F/trust.json --state $S'
row 2 outdir 'isfile,parentfile' - 'provenance demo@1.0.0 --registry $URL --trust $F/trust.json --state $S --download'
row 2 trust 'missing,dir,empty,invalid,wrongtype' - 'models --registry $URL --trust $S --state $O/state'
row 2 outdir 'isfile' - 'models demo --registry $URL --trust $F/trust.json --state $S'
row 12 inst '*' - 'installed demo@staging --dir $S --trust $F/trust.json --state $F/istate'
row 2 trust "$Q,invalid,wrongtype" - 'installed demo@staging --dir $F/inst --trust $S --state $F/istate'
row 2 key "$Q" - 'promote demo 1.0.0 --channel staging --key $S --registry $URL --token $PROM --out $O/r.json'
row 2 key "$Q" - 'renew demo --channel staging --key $S --registry $URL --trust $F/trust.json --state $O/state --out $O/r.json'
row 2 trust 'missing,dir,empty,invalid,wrongtype' - 'renew demo --channel staging --key $F/prom.key --registry $URL --trust $S --state $O/state --out $O/r.json'
row 2 root '*' - 'registry fsck --root $S'
row 2 trust 'missing,invalid,wrongtype' - 'registry fsck --root $F/reg --trust $S'
row 2 trust 'missing,dir,invalid,wrongtype' - 'registry serve --root $O/srv --listen 127.0.0.1:0 --trust $S'
# The certificate and its key: each refused before the store is made (a key that parses but
# is not the certificate's is exit 1).
row 12 cert '*' - 'registry serve --root $O/srv --listen 127.0.0.1:0 --tls-cert $S --tls-key $F/srv.key'
row 12 certkey '*' - 'registry serve --root $O/srv --listen 127.0.0.1:0 --tls-cert $F/srv.pem --tls-key $S'
# A missing or empty root becomes a new store, so those are not bad input for serve.
row 2 root 'file,kind-*,registry.db/gone,registry.db/random,registry.db/cuthalf' - 'registry serve --root $S --listen 127.0.0.1:0'
row 2 root '*' - 'registry gc --root $S'
row 2 root 'file,kind-*,registry.db/gone,registry.db/random,registry.db/cuthalf' - 'registry token create --root $S --name sweep2 --scope read'
row 2 root '*' - 'registry token list --root $S'
row 2 root '*' - 'registry token revoke --root $S --name sweep --reason sweep'
# A missing or empty root becomes a new mirror; a store with nothing published in it (the
# fixture's, tokens only) may become one too.
row 2 root 'file,kind-*,registry.db/gone,registry.db/random,registry.db/cuthalf' - 'registry mirror --root $S --from $URL --trust $F/trust.json --once'
row 2 primary '*' - 'registry mirror --root $S --from $URL --trust $F/trust.json --once'
row 2 trust 'missing,dir,invalid,wrongtype' - 'registry mirror --root $O/mir --from $URL --trust $S --once'
row 2 key "$Q" - "release \$F/run $REL --key \$S --trust \$F/trust.json"
row 2 trust 'missing,invalid,wrongtype' - "release \$F/run $REL --trust \$S --key \$F/rel.key"
# outputs that cannot be written (train and golden make make a missing directory and its
# parents, and train takes an existing directory that holds no run)
row 2 outfile '*' - 'data synth --seed 1 --rows 100 --features 4 --outputs 1 --out $S'
row 2 outfile '*' - 'validate --model $F/m --data $F/d.st --report $S'
row 2 outdir '*,!noparent' - 'golden make --model $F/m --data $F/d.st --windows 2 --out $S'
row 2 outfile '*' - 'pack $F/m --name demo --version 1.0.0 --out $S'
row 2 outfile '*' - 'infer --model $F/m --input $F/d.st --out $S'
row 2 outfile '*' - 'sign $F/file.bin --key $F/rel.key --out $S'
row 2 outdir '*' - 'unpack $F/m.kiln --out $S'
row 2 outdir '*' - 'export $F/run --out $S'
row 2 outdir '*,!noparent,!nonempty' - "train $TRAIN --data \$F/d.st --run-dir \$S"

# ---- the sweep -----------------------------------------------------------------------------
# Everything a lane holds, with size, mode, times, inode and link count (a write changes the
# mtime and ctime; a rename the inode), directories by name: compared after every case.
# SQLite's -wal and -shm files beside a database are left out: any reader of a WAL database
# may create, truncate or remove them; the database file itself is compared.
snap() {
    find "$L" \( -name '*.db-wal' -o -name '*.db-shm' \) -prune -o \
        -type d -printf 'd %p %m\n' -o -printf 'f %p %s %m %T@ %C@ %i %n\n'
}
admits() { # LABEL ONLY: every row takes fifo and zero unless it says !fifo or !zero
    ok=1 rest=$2,
    case $1 in fifo | zero) ok=0 ;; esac
    while [ -n "$rest" ]; do
        p=${rest%%,*} rest=${rest#*,}
        case $p in
        !*) case $1 in ${p#!}) return 1 ;; esac ;;
        *) case $1 in $p) ok=0 ;; esac ;;
        esac
    done
    return $ok
}
lane() { # N: run every JOBS-th case
    me=$1 L=$T/lane$1 F=$T/lane$1/fx B=$T/lane$1/bad O=$T/lane$1/out
    tmp=$T/tmp$1 fails=$T/tmp$1/fails
    mkdir -p "$tmp"; : >"$fails"
    cp -a "$T/pristine" "$L"
    n=0 c=0
    snap >"$tmp/snap0"
    while IFS='|' read -r st kind only extra keep args; do
        while read -r label rel needle; do
            S=$L/$rel
            admits "$label" "$only" || continue
            case ,${KILN_SWEEP_LABELS:-$label}, in *,"$label",*) ;; *) continue ;; esac
            c=$((c + 1))
            [ $((c % JOBS)) -eq "$me" ] || continue
            n=$((n + 1))
            eval "set -- $args"
            [ -z "${KILN_SWEEP_TIMES:-}" ] || t0=$(date +%s%N)
            # -k: a kiln stuck in the kernel (a FIFO's open) has its SIGTERM handler run and
            # goes on waiting, so a hang is killed outright 5 s after the TERM.
            timeout -k 5 "$LIMIT" "$KILN" "$@" </dev/null >"$tmp/out" 2>"$tmp/err"
            rc=$?
            [ -z "${KILN_SWEEP_TIMES:-}" ] || echo "$((($(date +%s%N) - t0) / 1000000)) ms $kind/$label kiln $*" >>"$KILN_SWEEP_TIMES"
            why=
            case $rc in
            0) why="exited 0" ;;
            124) why="hung (stopped by SIGTERM after $LIMIT s)" ;;
            137) why="hung (SIGTERM ignored, SIGKILL after $((LIMIT + 5)) s)" ;;
            *) if [ $rc -ge 128 ]; then why="killed by signal $((rc - 128))"
               else case $st in *$rc*) ;; *) why="exited $rc, not $st" ;; esac; fi ;;
            esac
            # One error line; lines of the row's documented form may precede it, and the path
            # may be named in either. Lines after the error line that are no line of kiln's
            # own ("kiln: ...") are its detail: an error's first line says what failed and the
            # detail follows (issue 30).
            nerr=0 msg= other= named=
            while IFS= read -r line; do
                case $line in
                "kiln: error: "*) nerr=$((nerr + 1)) msg=$line ;;
                "kiln: "*) [ "$extra" != - ] && case $line in $extra) true ;; *) false ;; esac || other=$line ;;
                *) [ $nerr -eq 1 ] || { [ "$extra" != - ] && case $line in $extra) true ;; *) false ;; esac; } || other=$line ;;
                esac
                case $line in *"$needle"*) named=1 ;; esac
            done <"$tmp/err"
            if [ $nerr -ne 1 ]; then why="${why:+$why; }$nerr 'kiln: error:' lines"
            elif [ -n "$other" ]; then why="${why:+$why; }stray stderr line: $other"
            elif [ -z "$named" ]; then why="${why:+$why; }the error does not name '$needle'"
            elif [ ${#msg} -le 40 ]; then why="${why:+$why; }the error says too little"
            fi
            [ "$keep" = - ] || [ $rc -ne 1 ] || rm -f "$O/$keep"
            snap >"$tmp/snap1"
            if ! cmp -s "$tmp/snap0" "$tmp/snap1"; then
                why="${why:+$why; }files changed: $(diff "$tmp/snap0" "$tmp/snap1" | grep '^[<>]' | head -4 | tr '\n' ' ')"
                rm -rf "$L"; cp -a "$T/pristine" "$L"; snap >"$tmp/snap0" # a clean slate for the next case
            fi
            if [ -n "$why" ]; then
                { echo "FAIL [$kind/$label] kiln $*" | sed "s|$L/||g"; echo "     $why"; sed 's/^/     stderr: /' "$tmp/err" | head -5; } >>"$fails"
            fi
        done <"$B/$kind.list"
    done <"$T/rows"
    echo "$n" >"$tmp/count"
}
set +e
start=$(date +%s)
i=0 pids=
while [ $i -lt "$JOBS" ]; do lane $i & pids="$pids $!"; i=$((i + 1)); done
for p in $pids; do wait "$p"; done
set -e
total=0
i=0
while [ $i -lt "$JOBS" ]; do
    total=$((total + $(cat "$T/tmp$i/count"))); cat "$T/tmp$i/fails"; i=$((i + 1))
done >"$T/allfails"
bad=$(grep -c '^FAIL' "$T/allfails" || true)
if [ "$bad" -ne 0 ]; then
    cat "$T/allfails" >&2
    fail "$bad of $total cases were not refused cleanly"
fi
echo "$total cases, all refused cleanly ($(($(date +%s) - start)) s)"

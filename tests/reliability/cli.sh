#!/usr/bin/env bash
# tests/reliability/cli.sh BIN_DIR WORK_DIR — issue 20's bad inputs through dew-run and dew-tokenize, black box:
# each must end with one clear error and the documented exit status (2 usage, 1 runtime), never a signal, a
# hang or a changed run directory. Every case here failed on the code before issue 20 (a segfault, a
# rewritten config.ini, an error only after every update, a silent acceptance, or a confusing message).
set -uo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
tiny="$here/../train/tiny.ini"
py=/usr/bin/python3
rm -rf "$work" && mkdir -p "$work"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

# expect NAME RC TEXT CMD...: exit status RC, TEXT on stderr, no signal, within 120 s.
expect() {
  local name=$1 want_rc=$2 text=$3; shift 3
  out=$(timeout 120 "$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne "$want_rc" ] || { [ -n "$text" ] && ! printf '%s' "$out" | grep -qF -- "$text"; }; then
    fail "$name: rc=$rc (want $want_rc), want '$text' in:"; printf '%s\n' "$out" | head -5
  else
    ok "$name -> $(printf '%s' "$out" | head -1 | cut -c1-220)"
  fi
}
snapshot() { (cd "$1" && find . -type f -printf '%p %s %T@\n' | sort && cat config.ini) | md5sum; }
train() { "$bin/dew-run" train --config "$tiny" "$@" >/dev/null 2>&1; }

# ---- checkpoints: damaged bytes never crash; the error names the newest intact checkpoint ----
train --run-dir "$work/a" --trainer.steps 20 --trainer.keep 3 || fail "training the base run"
good="$work/a/checkpoints/step-00000020.h5"
cp "$good" "$work/good.h5"
size=$(stat -c %s "$good")
crashes=0
for back in 8 120 200 400 800 1600 3000; do  # a few bytes flipped near the end (HDF5's metadata lives there)
  $py -c "import sys; b=bytearray(open(sys.argv[1],'rb').read()); o=len(b)-int(sys.argv[3]); b[o:o+4]=bytes(x^0xFF for x in b[o:o+4]); open(sys.argv[2],'wb').write(b)" "$work/good.h5" "$good" "$back"
  out=$(timeout 60 "$bin/dew-run" eval --run-dir "$work/a" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne 1 ] || ! printf '%s' "$out" | grep -q "corrupt" || ! printf '%s' "$out" | grep -qF "step-00000010.h5 is intact: pass --step 10"; then
    crashes=$((crashes + 1)); fail "eval of a checkpoint with 4 bytes flipped $back bytes before its end: rc=$rc: $out"
  fi
done
[ "$crashes" -eq 0 ] && ok "7 checkpoints damaged near their end: each refused (rc 1) naming the intact step-00000010.h5"
expect "eval --step 10 of the intact one" 0 "" "$bin/dew-run" eval --run-dir "$work/a" --step 10
before=$(snapshot "$work/a")
expect "train --resume on the damaged latest" 1 "pass --step 10" "$bin/dew-run" train --run-dir "$work/a" --resume
[ "$(snapshot "$work/a")" = "$before" ] && ok "the failed --resume changed nothing in the run directory" || fail "the failed --resume changed the run directory"
expect "train --resume --step 10" 0 "" "$bin/dew-run" train --run-dir "$work/a" --resume --step 10
[ -f "$work/a/checkpoints/step-00000020.h5.discarded" ] && ok "the damaged later checkpoint was set aside as .discarded" || fail "no step-00000020.h5.discarded"
expect "eval of the re-trained step 20" 0 "" "$bin/dew-run" eval --run-dir "$work/a"
expect "train --step without --resume" 2 "--step 10 needs --resume" "$bin/dew-run" train --config "$tiny" --run-dir "$work/nostep" --step 10
chmod 000 "$work/a/checkpoints/step-00000020.h5"
if [ "$(id -u)" -ne 0 ]; then
  expect "an unreadable checkpoint" 1 "permission denied" "$bin/dew-run" eval --run-dir "$work/a"
fi
chmod 644 "$work/a/checkpoints/step-00000020.h5"

# ---- a failed --resume (another model, a wrong override) leaves the run directory untouched ----
train --run-dir "$work/b" --trainer.steps 10 || fail "training run b"
before=$(snapshot "$work/b")
expect "--resume with a wrong override" 1 "checkpoint does not match the model" "$bin/dew-run" train --run-dir "$work/b" --resume --model.hidden 64
sed 's/^hidden = 32/hidden = 16/' "$tiny" > "$work/other-model.ini"
expect "--resume with another model's config" 1 "does not match the model" "$bin/dew-run" train --config "$work/other-model.ini" --run-dir "$work/b" --resume
[ "$(snapshot "$work/b")" = "$before" ] && ok "config.ini and every file of run b unchanged" || fail "a failed --resume changed run b"
expect "the untouched run still evaluates" 0 "" "$bin/dew-run" eval --run-dir "$work/b"
expect "--resume past trainer.steps" 2 "past trainer.steps" "$bin/dew-run" train --run-dir "$work/b" --resume --trainer.steps 5

# ---- checkpoints from before checksums still load; their counters are checked ----
mkdir -p "$work/legacy/checkpoints"
cp "$here/../checkpoint/data/legacy-config.ini" "$work/legacy/config.ini"
cp "$here/../checkpoint/data/legacy-step-00000010.h5" "$work/legacy/checkpoints/step-00000010.h5"
expect "eval of a checkpoint written before checksums" 0 "" "$bin/dew-run" eval --run-dir "$work/legacy"
if $py -c 'import h5py' 2>/dev/null; then
  cp -r "$work/legacy" "$work/absurd"
  $py -c "import h5py,sys; f=h5py.File(sys.argv[1],'r+'); f['state'].attrs['updates']=10**15; f.close()" "$work/absurd/checkpoints/step-00000010.h5"
  expect "absurd update counter" 1 "inconsistent counters" "$bin/dew-run" train --run-dir "$work/absurd" --resume --trainer.steps 40
  cp -r "$work/legacy" "$work/missing"
  $py -c "import h5py,sys; f=h5py.File(sys.argv[1],'r+'); del f['state'].attrs['attempts']; f.close()" "$work/missing/checkpoints/step-00000010.h5"
  expect "missing counter" 1 "has no counter state/@attempts" "$bin/dew-run" train --run-dir "$work/missing" --resume
  cp -r "$work/legacy" "$work/position"
  $py -c "import h5py,sys; f=h5py.File(sys.argv[1],'r+'); f['state'].attrs['data.next']=10**15; f.close()" "$work/position/checkpoints/step-00000010.h5"
  expect "absurd data position" 1 "has data position 1000000000000000" "$bin/dew-run" train --run-dir "$work/position" --resume
  cp -r "$work/legacy" "$work/nan"
  $py -c "import h5py,sys,numpy as np; f=h5py.File(sys.argv[1],'r+'); d=f['params/model.layers.0.weight']; a=d[...]; a[0,0]=np.nan; d[...]=a; f.close()" "$work/nan/checkpoints/step-00000010.h5"
  expect "NaN weights refused" 1 "non-finite value" "$bin/dew-run" eval --run-dir "$work/nan"
  DEW_ALLOW_NONFINITE_WEIGHTS=1 expect "NaN weights loaded when asked for" 0 "" "$bin/dew-run" eval --run-dir "$work/nan"
else
  echo "skip: /usr/bin/python3 has no h5py (counter cases)"
fi

# ---- values a later stage reads are checked before the first update (no checkpoint is written) ----
grep -v '^size = \|^image_size = ' "$tiny" > "$work/idx.ini"  # the synthetic source's keys out
no_ckpt() { if ls "$1"/checkpoints/*.h5 >/dev/null 2>&1; then fail "$2: training ran before the error"; else ok "$2: refused before any update"; fi; }
$py "$here/make_idx.py" "$work/idx-badlabel" train 64 8 0,1,2,3
$py "$here/make_idx.py" "$work/idx-badlabel" t10k 16 8 0,1,2,9
expect "a validation label out of range" 2 "validation label 9" "$bin/dew-run" train --config "$work/idx.ini" --run-dir "$work/r-label" --data.source idx --data.path "$work/idx-badlabel"
no_ckpt "$work/r-label" "label out of range"
$py "$here/make_idx.py" "$work/idx-shape" train 64 8 0,1,2,3
$py "$here/make_idx.py" "$work/idx-shape" t10k 16 10 0,1,2,3
expect "validation images of another shape" 2 "does not fit the model" "$bin/dew-run" train --config "$work/idx.ini" --run-dir "$work/r-shape" --data.source idx --data.path "$work/idx-shape"
no_ckpt "$work/r-shape" "validation shape"
expect "batch_size = 1000000" 2 "data.batch_size' = 1000000" "$bin/dew-run" train --config "$tiny" --run-dir "$work/r-batch" --data.batch_size 1000000
expect "--run.threads 100000" 2 "run.threads' = 100000" "$bin/dew-run" train --config "$tiny" --run-dir "$work/r-threads" --run.threads 100000
expect "OMP_NUM_THREADS=100000" 2 "OMP_NUM_THREADS=100000" env OMP_NUM_THREADS=100000 "$bin/dew-run" train --config "$tiny" --run-dir "$work/r-omp"

# a language model on a byte-token folder
for i in $(seq 1 300); do echo "line $i of a small corpus for the reliability tests"; done > "$work/corpus.txt"
"$bin/dew-tokenize" --input "$work/corpus.txt" --out "$work/tokens" --tokenizer byte >/dev/null 2>&1 || fail "dew-tokenize"
cat > "$work/lm.ini" <<INI
[run]
name = lm-rel
seed = 1
backend = ref
[model]
plugin = causal_transformer
dim = 16
n_layers = 1
n_heads = 2
[objective]
plugin = lm
sample_tokens = 4
[data]
source = tokens
path = $work/tokens
seq_len = 16
batch_size = 4
[optim]
name = adamw
lr = 0.01
[trainer]
steps = 4
log_every = 1
checkpoint_every = 2
INI
expect "a bad sampling temperature for validation" 2 "objective.sample_temperature" "$bin/dew-run" train --config "$work/lm.ini" --run-dir "$work/r-temp" --objective.sample_temperature -1
no_ckpt "$work/r-temp" "sampling temperature"
# a BPE folder (uint16 ids, vocabulary 300), then the id 60000 near the end of val.bin
"$bin/dew-tokenize" --input "$work/corpus.txt" --out "$work/tokens-badval" --tokenizer bpe --vocab-size 300 >/dev/null 2>&1 || fail "dew-tokenize bpe"
$py -c "import sys; p=sys.argv[1]+'/val.bin'; b=bytearray(open(p,'rb').read()); b[-40:-38]=(60000).to_bytes(2,'little'); open(p,'wb').write(b)" "$work/tokens-badval"
expect "an out-of-range id late in val.bin" 1 "holds the id 60000" "$bin/dew-run" train --config "$work/lm.ini" --run-dir "$work/r-ids" --data.path "$work/tokens-badval"
no_ckpt "$work/r-ids" "out-of-range id in val.bin"
"$bin/dew-run" train --config "$work/lm.ini" --run-dir "$work/lm" >/dev/null 2>&1 || fail "training the lm run"
expect "sample --max_new_tokens 99999999999" 2 "max_new_tokens must be in [0, 16777216]" "$bin/dew-run" sample --run-dir "$work/lm" --max_new_tokens 99999999999
# a text key without its value is refused (it sampled from the prompt "true")
expect "sample --prompt without a value" 2 "option 'sample.prompt' needs a value" "$bin/dew-run" sample --run-dir "$work/lm" --prompt
# --kv-cache: a dtype it does not know is refused; bf16 decodes (f32 weights over a bf16 cache), and dew-bench generate
# reports the cache it decoded with: bf16 when asked, f32 under bf16 weights when asked, the weights' otherwise
expect "sample --kv-cache f16" 2 "--kv-cache 'f16'" "$bin/dew-run" sample --run-dir "$work/lm" --kv-cache f16
expect "sample --kv-cache bf16" 0 "" "$bin/dew-run" sample --run-dir "$work/lm" --kv-cache bf16 --max_new_tokens 8
kv_of() { "$bin/dew-bench" generate --config "$work/lm.ini" --backend ref --tokens 4 --repeats 1 "$@" 2>/dev/null |
  $py -c "import json,sys; print(json.loads(sys.stdin.readline())['kv_dtype'])"; }
for c in "bf16:--kv-cache bf16" "f32:--weights bf16 --kv-cache f32" "bf16:--weights bf16" "f32:"; do
  want=${c%%:*} args=${c#*:}
  # shellcheck disable=SC2086
  got=$(kv_of $args)
  [ "$got" = "$want" ] && ok "dew-bench generate $args: a $got cache" || fail "dew-bench generate $args: cache '$got', want $want"
done
# stray positional arguments are refused, not ignored
expect "export with a stray argument" 2 "too many positional options" "$bin/dew-run" export --run-dir "$work/lm" --out "$work/lm-export" extra

# an override config.ini could not read back as given (found by fuzz/config_ini.cpp): refused, not mangled
expect "an override value with ' #'" 2 "would be read back from config.ini as a comment" "$bin/dew-run" train --config "$tiny" --run-dir "$work/r-hash" --data.path "/data/my #1"

# an export over an earlier one: the earlier export's model files go (a stale shard index sent import to old shards)
mkdir -p "$work/export" && echo '{"weight_map": {}}' > "$work/export/model.safetensors.index.json"
expect "export over an earlier export" 0 "" "$bin/dew-run" export --run-dir "$work/b" --out "$work/export"
[ ! -f "$work/export/model.safetensors.index.json" ] && [ -f "$work/export/model.safetensors" ] && ok "the stale shard index is gone" || fail "export kept the stale shard index"

# ---- dew-tokenize never replaces an existing token folder silently ----
expect "dew-tokenize over an existing --out" 2 "pass --force" "$bin/dew-tokenize" --input "$work/corpus.txt" --out "$work/tokens" --tokenizer byte
expect "dew-tokenize --force" 0 "" "$bin/dew-tokenize" --input "$work/corpus.txt" --out "$work/tokens" --tokenizer byte --force

# ---- --help for every command; a truncated plugin is refused, not SIGBUS ----
for c in train eval sample export import serve plugins demo; do
  out=$("$bin/dew-run" $c --help 2>&1); rc=$?
  if [ "$rc" -ne 0 ] || ! printf '%s' "$out" | grep -q -- "--"; then fail "dew-run $c --help: rc=$rc $out"; else ok "dew-run $c --help"; fi
done
plugdir=$(dirname "$bin")/lib/dew/plugins
mkdir -p "$work/plugins"
so=$(ls "$plugdir"/dew_ref.so)
head -c $(( $(stat -c %s "$so") / 2 )) "$so" > "$work/plugins/dew_ref.so"
expect "a truncated plugin .so" 1 "truncated" "$bin/dew-run" plugins --plugin-dir "$work/plugins"

echo "$fails failure(s)"
exit $fails

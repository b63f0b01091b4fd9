#!/usr/bin/env bash
# tests/train/recompute.sh BIN_DIR WORK_DIR — [trainer] recompute = blocks through dew-run train, on ref and cpu.
# A 4-layer causal_transformer with dropout 0.1 on a byte-token corpus, 4 updates, once with recompute = none and
# once with blocks: every logged loss and gradient norm must be the same digits (%.17g), the final weights
# (exported to safetensors) the same bytes, and the activation memory (mem_peak_mb minus mem_params_mb,
# mem_grads_mb and mem_optim_mb) must fall; log.txt says how many block forwards were recomputed, and an mlp (no
# blocks) is told that nothing is.
set -euo pipefail
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
for i in $(seq 1 400); do echo "fortune $i: a small corpus for the recompute test, line by line"; done > "$work/corpus.txt"
"$bin/dew-tokenize" --input "$work/corpus.txt" --out "$work/tokens" --tokenizer byte > "$work/tok.log" 2>&1 ||
  { cat "$work/tok.log"; exit 1; }
cat > "$work/lm.ini" <<INI
[run]
name = recompute
seed = 4
[model]
plugin = causal_transformer
dim = 32
n_layers = 4
n_heads = 4
n_kv_heads = 2
dropout = 0.1
[objective]
plugin = lm
sample_tokens = 4
[data]
source = tokens
path = $work/tokens
seq_len = 64
batch_size = 8
[optim]
name = adamw
lr = 0.01
clip_grad_norm = 1.0
[trainer]
steps = 4
log_every = 1
INI
run() { "$bin/dew-run" "$@" > "$work/last.log" 2>&1 || { cat "$work/last.log"; exit 1; }; }
for backend in ref cpu; do
  for mode in none blocks; do
    run train --config "$work/lm.ini" --backend $backend --run-dir "$work/$backend-$mode" --trainer.recompute $mode
    run export --run-dir "$work/$backend-$mode" --out "$work/$backend-$mode.export" --backend $backend
  done
  fields() { grep '"loss"' "$1/metrics.jsonl" | sed -E 's/.*"step":([0-9]+),"loss":([^,]+),"lr":[^,]+,"grad_norm":([^,]+),.*/\1 \2 \3/'; }
  fields "$work/$backend-none" > "$work/$backend-none.txt"
  fields "$work/$backend-blocks" > "$work/$backend-blocks.txt"
  [ "$(wc -l < "$work/$backend-none.txt")" -eq 4 ] || { echo "$backend: expected 4 logged steps"; exit 1; }
  diff "$work/$backend-none.txt" "$work/$backend-blocks.txt" ||
    { echo "$backend: recompute = blocks changed a loss or a gradient norm"; exit 1; }
  cmp "$work/$backend-none.export/model.safetensors" "$work/$backend-blocks.export/model.safetensors" ||
    { echo "$backend: recompute = blocks changed the trained weights"; exit 1; }
  /usr/bin/python3 - "$work/$backend-none/metrics.jsonl" "$work/$backend-blocks/metrics.jsonl" "$backend" <<'PY'
import json, sys
def activations(path):
    lines = [json.loads(l) for l in open(path) if '"loss"' in l]
    state = sum(lines[0][k] for k in ("mem_params_mb", "mem_grads_mb", "mem_optim_mb"))
    return lines[-1]["mem_peak_mb"] - state
none, blocks = activations(sys.argv[1]), activations(sys.argv[2])
print(f"{sys.argv[3]}: activation memory none {none:.3f} MiB, blocks {blocks:.3f} MiB ({blocks / none:.2f}x)")
assert blocks < 0.8 * none, "recompute = blocks did not lower the activation memory"
PY
  # The run says what recompute = blocks did: the 4 layers' forwards recomputed per micro-batch.
  grep -q "recompute = blocks: each micro-batch recomputes 4 block forwards in its backward" "$work/$backend-blocks/log.txt" ||
    { echo "$backend: no recompute = blocks line in log.txt"; exit 1; }
done
# A model without recomputable blocks (tests/train/tiny.ini: an mlp) trains as before and says nothing is recomputed.
here=$(cd "$(dirname "$0")" && pwd)
run train --config "$here/tiny.ini" --run-dir "$work/mlp-blocks" --trainer.steps 2 --trainer.recompute blocks
grep -q "the model (mlp) has no block that recomputes: nothing is recomputed" "$work/mlp-blocks/log.txt" ||
  { echo "no warning for recompute = blocks on an mlp"; exit 1; }
echo "recompute = blocks: the same losses, gradient norms and weights, less activation memory"

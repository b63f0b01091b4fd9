#!/usr/bin/env bash
# tests/train/config_errors.sh BIN_DIR WORK_DIR — user mistakes exit 2 with one line naming the culprit.
set -uo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
fails=0
config=$here/tiny.ini
expect() {  # expect EXPECTED_TEXT ARGS...   (with $config)
  local expected=$1; shift
  out=$("$bin/dew-run" train --config "$config" --run-dir "$work/run-$RANDOM" "$@" 2>&1 >/dev/null)
  rc=$?
  lines=$(printf '%s\n' "$out" | grep -c .)
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! printf '%s' "$out" | grep -qF -- "$expected"; then
    echo "FAIL ($*): rc=$rc lines=$lines, expected '$expected' in:"; printf '%s\n' "$out"; fails=$((fails + 1))
  else
    echo "ok: $* -> $out"
  fi
}
expect "optim.lrr" --optim.lrr 0.1                       # unknown key
expect "unknown option 'optim.lrr'; did you mean 'optim.lr'?" --optim.lrr 0.1   # the nearest key looked for
expect "did you mean 'trainer.steps'?" --trainer.step 3   # a misspelt override of a key the config sets
expect "unknown options 'optim.lrr', 'optim.weight_decy'; did you mean 'optim.lr' for 'lrr', 'optim.weight_decay' for 'weight_decy'" --optim.lrr 0.1 --optim.weight_decy 0.1
expect "unknown option 'data.siz'; did you mean 'data.size'?" --data.siz 64   # a data source's key (its own reader)
# a key of another optimizer: what this one looks for instead (sgd takes momentum, not betas)
expect "unknown option 'optim.betas'; [optim]'s reader also looks for: dampening" --optim.name sgd --optim.betas 0.9,0.95
expect "unknown option 'nosuch.key'" --nosuch.key 1       # unknown section
# fine-tuning: targets matching no linear layer (the layers named), freeze globs, QK-Clip on frozen q/k
expect "option 'lora.targets' = *.q_proj matches none of the model's linear layers: layers.0, layers.1" --lora.rank 4 --lora.targets "*.q_proj"
expect "option 'lora.rank' must be >= 0" --lora.rank -1
expect "option 'optim.freeze': 'model.nope.*' matches no parameter" --optim.freeze "model.nope.*"
expect "nothing is left to train" --optim.freeze "*"
expect "option 'lora.train': 'x*' matches no parameter" --lora.rank 2 --lora.train "x*"
expect "optim.freeze' with [lora]" --lora.rank 2 --optim.freeze "model.layers.0.*"
expect "optim.lr' must be a number" --optim.lr fast      # bad value
expect "option 'trainer.ema_decay' must be in [0, 1) (0 = no EMA), got -0.5" --trainer.ema_decay -0.5
expect "trainer.steps" --trainer.steps 0                 # bad value
expect "unknown objective 'nope'" --objective.plugin nope  # unknown plugin
expect "unknown model 'resnet999'" --model.plugin resnet999
expect "unknown optimizer" --optim.name adam2
expect "trainer.profile" --trainer.profile -1   # bad value
expect "run.matmul_precision' = 'bf16x'" --run.matmul_precision bf16x --backend cpu   # bad precision
expect "option 'isa' = 'sse9'" --backend.isa sse9 --backend cpu   # [backend] reaches the backend, which refuses
expect "unknown option 'backend.bf16_dotx'" --backend.bf16_dotx widened --backend cpu   # a key no backend reads
expect "set it as [run] threads" --backend.threads 2 --backend cpu   # [run]'s own keys are not duplicated
expect "/no/such/folder" --data.source idx --data.path /no/such/folder   # missing data file
# a model whose shape disagrees with its data: refused at start, not sampled at another shape later
config=$here/../diffusion_objective/tiny.ini
expect "diffusion: model.image_size = 16x16 but the data's images are 8x8" --model.image_size 16
expect "diffusion: model.in_channels = 3 but the data's images have 1 channels" --model.in_channels 3
config=$work/lm.ini
printf '[objective]\nplugin = lm\n[model]\nplugin = causal_transformer\ndim = 16\nn_layers = 1\nn_heads = 2\n[data]\nsource = synthetic\nkind = tokens\nseq_len = 16\nvocab = 16\nbatch_size = 4\n[trainer]\nsteps = 1\n' > "$config"
expect "lm: the data's sequences of 16 tokens are longer than model.max_seq_len = 8" --model.max_seq_len 8
config=$here/tiny.ini
# an existing run directory is never trained over without --resume
"$bin/dew-run" train --config "$here/tiny.ini" --run-dir "$work/existing" --trainer.steps 2 >/dev/null 2>&1
out=$("$bin/dew-run" train --config "$here/tiny.ini" --run-dir "$work/existing" --trainer.steps 2 2>&1 >/dev/null); rc=$?
if [ "$rc" -ne 2 ] || ! printf '%s' "$out" | grep -q -- "--resume"; then echo "FAIL: existing run dir: rc=$rc $out"; fails=$((fails+1)); else echo "ok: existing run dir refused"; fi
# a [backend] option the backend takes is used and kept in the run's config.ini (so --resume keeps it)
"$bin/dew-run" train --config "$here/tiny.ini" --run-dir "$work/isa" --trainer.steps 2 --backend cpu --backend.isa portable >/dev/null 2>&1
if ! grep -A1 -F '[backend]' "$work/isa/config.ini" 2>/dev/null | grep -qx 'isa = portable'; then
  echo "FAIL: [backend] isa = portable not kept in config.ini"; fails=$((fails+1)); else echo "ok: [backend] kept"; fi
exit $fails

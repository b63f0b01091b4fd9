#!/usr/bin/env bash
# tests/train/lion_optimizer.sh CMAKE BUILD_DIR SOURCE_DIR WORK_DIR CXX
#
# An optimizer from a plugin built out of tree (examples/lion_optimizer): installs the dew build into a
# fresh prefix, builds the plugin against it alone, then with the installed dew-run
#  1. `plugins` lists the plugin's optimizer and the core's built-in ones, with their kinds;
#  2. `train --help` shows the plugin optimizer's options;
#  3. 300 updates of configs/fmnist-mlp.ini with --optim.name lion: the training loss falls and the
#     validation accuracy is well above chance (a wrong sign or a missing step fails this);
#  4. resume is bit-exact with the plugin's state: 40 updates straight and 20 + 20 in two processes give
#     the same losses and the same final weights, byte for byte.
# Exits 77 (skipped) when Fashion-MNIST is not installed (tools/setup.sh installs dataset-fashion-mnist).
set -euo pipefail
cmake=$1 build=$2 src=$3 work=$4 cxx=$5
here=$(cd "$(dirname "$0")" && pwd)
fashion=/usr/share/datasets/fashion-mnist
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix

echo "== install $build into $prefix"
"$cmake" --install "$build" --prefix "$prefix" > "$work/install.log"
echo "== configure and build $src/examples/lion_optimizer"
"$cmake" -S "$src/examples/lion_optimizer" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$cxx" > "$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
"$cmake" --build "$work/build" > "$work/build.log" || { cat "$work/build.log"; exit 1; }
test -f "$work/build/dew_lion.so"
"$here/../registry/exports_only_entry.sh" "$work/build/dew_lion.so"

dew() { "$prefix/bin/dew-run" "$@" --plugin-dir "$work/build" > "$work/last.log" 2>&1 || { cat "$work/last.log"; exit 1; }; }

echo "== dew-run plugins"
dew plugins
grep -q "^lion  version 0.1.0  abi 1  $work/build/dew_lion.so\$" "$work/last.log"
grep -q "^    optimizer lion  — Lion" "$work/last.log"
grep -q "^core  version " "$work/last.log"
grep -q "^    optimizer adamw  — " "$work/last.log"
grep -q "^    schedule cosine  — " "$work/last.log"

echo "== dew-run train --help names lion's options"
dew train --config "$src/configs/fmnist-mlp.ini" --optim.name lion --help
grep -q "^\[optim\] options of optimizer 'lion' (plugin 'lion' (" "$work/last.log"
grep -q "^  --optim.betas (default 0.9, 0.99)" "$work/last.log"
grep -q "^\[schedule\] options of schedule 'cosine' (plugin 'core'" "$work/last.log"

if [ -f "$fashion/train-images-idx3-ubyte.gz" ]; then
  echo "== 300 updates of fmnist-mlp with lion"
  dew train --config "$src/configs/fmnist-mlp.ini" --run-dir "$work/fmnist" --optim.name lion --optim.lr 2e-4 \
    --optim.weight_decay 0.1 --trainer.steps 300 --trainer.log_every 50 --trainer.eval_every 0 \
    --trainer.checkpoint_every 0 --schedule.warmup_steps 20
  losses=$(grep '"loss"' "$work/fmnist/metrics.jsonl" | sed -E 's/.*"step":([0-9]+),"loss":([^,]+),.*/\2/')
  first=$(echo "$losses" | head -1) last=$(echo "$losses" | tail -1)
  acc=$(grep -o '"val/accuracy":[^,}]*' "$work/fmnist/metrics.jsonl" | tail -1 | cut -d: -f2)
  echo "lion on fmnist-mlp: mean loss of updates 1-50 $first, of 251-300 $last; val accuracy $acc"
  awk -v f="$first" -v l="$last" -v a="$acc" 'BEGIN { exit !(l < 0.7 * f && a > 0.75) }' ||
    { echo "FAIL: the loss did not fall enough or the accuracy is low"; cat "$work/fmnist/metrics.jsonl"; exit 1; }
else
  echo "skipped the fmnist run: $fashion is absent (install dataset-fashion-mnist)"
  skipped=1
fi

echo "== resume with lion's state is bit-exact"
tiny=(--config "$here/tiny.ini" --backend cpu --optim.name lion --optim.lr 0.002 --optim.weight_decay 0.1)
dew train "${tiny[@]}" --run-dir "$work/A"
dew train "${tiny[@]}" --run-dir "$work/B" --trainer.stop_at 20
dew train --run-dir "$work/B" --resume --backend cpu --trainer.stop_at 40
losses() { grep '"loss"' "$1/metrics.jsonl" | sed -E 's/.*"step":([0-9]+),"loss":([^,]+),.*/\1 \2/'; }
losses "$work/A" > "$work/A.losses"
losses "$work/B" > "$work/B.losses"
[ "$(wc -l < "$work/A.losses")" -eq 40 ] || { echo "expected 40 logged steps in A"; exit 1; }
diff "$work/A.losses" "$work/B.losses" || { echo "FAIL: losses differ after resume"; exit 1; }
dew export --run-dir "$work/A" --out "$work/A.export" --no-ema
dew export --run-dir "$work/B" --out "$work/B.export" --no-ema
cmp "$work/A.export/model.safetensors" "$work/B.export/model.safetensors" || { echo "FAIL: weights differ"; exit 1; }
if [ "${skipped:-0}" = 1 ]; then exit 77; fi
echo "PASS"

#!/usr/bin/env bash
# tests/train/checkpoint_h5dump.sh BIN_DIR WORK_DIR — a trained run's checkpoint is read by an
# independent HDF5 client (h5dump) and holds the groups and attributes docs/checkpoint-format.md promises.
set -euo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
"$bin/dew-run" train --config "$here/tiny.ini" --run-dir "$work/run" --trainer.steps 10 > "$work/log" 2>&1 || {
  cat "$work/log"; exit 1; }
f=$work/run/checkpoints/step-00000010.h5
h5dump -H "$f" > "$work/dump"
for want in 'GROUP "params"' 'GROUP "ema"' 'GROUP "optim"' 'GROUP "m"' 'GROUP "v"' 'GROUP "state"' \
  'ATTRIBUTE "dew.format_version"' 'ATTRIBUTE "dew.config"' 'ATTRIBUTE "dew.plugins"' 'ATTRIBUTE "updates"' \
  'ATTRIBUTE "data.order"' 'DATASET "model.'; do
  grep -qF "$want" "$work/dump" || { echo "h5dump lacks $want"; cat "$work/dump"; exit 1; }
done
test -f "$work/run/config.ini" && test -f "$work/run/metrics.jsonl" && test -f "$work/run/log.txt"
echo "h5dump reads the checkpoint with every promised group and attribute"

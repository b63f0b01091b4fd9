#!/usr/bin/env bash
# tests/train/nonfinite.sh BIN_DIR WORK_DIR — a diverging run skips non-finite updates and stops after
# 5 in a row with one clear message and exit status 1.
set -uo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
out=$("$bin/dew-run" train --config "$here/tiny.ini" --run-dir "$work/run" --optim.name sgd --optim.lr 1e30 \
  --optim.clip_grad_norm 0 --optim.weight_decay 0 --schedule.warmup_steps 0 --trainer.ema_decay 0 2>&1); rc=$?
[ "$rc" -eq 1 ] || { echo "expected exit 1, got $rc"; printf '%s\n' "$out"; exit 1; }
printf '%s\n' "$out" | grep -q "5 non-finite updates in a row" || { echo "no stop message"; printf '%s\n' "$out"; exit 1; }
[ "$(printf '%s\n' "$out" | grep -c 'skipped (')" -eq 5 ] || { echo "expected 5 skip warnings"; printf '%s\n' "$out"; exit 1; }
echo "non-finite guard: 5 skips then a clear stop"

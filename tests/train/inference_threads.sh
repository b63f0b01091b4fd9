#!/usr/bin/env bash
# tests/train/inference_threads.sh BIN_DIR WORK_DIR — `dew-run eval --threads N` replaces the run's stored
# [run] threads (it used to be refused as an unknown objective key): a run trained with 1 thread evaluates
# with 1 and 2, a negative count is one clear error (exit 2), and the stored config is left as it was;
# --weights bf16 evaluates with the matmul weights kept in bf16, --weights int8 in int8 (per-block scales):
# both losses within 1 % of the f32 weights' loss, and not equal to it (the weights really are rounded).
set -uo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
"$bin/dew-run" train --config "$here/tiny.ini" --backend cpu --run-dir "$work/run" --run.threads 1 \
  --trainer.steps 4 > "$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }
cp "$work/run/config.ini" "$work/config.before"
for n in 1 2; do
  out=$("$bin/dew-run" eval --run-dir "$work/run" --threads $n 2>&1) || { echo "eval --threads $n failed: $out"; exit 1; }
  printf '%s' "$out" | grep -q '"step": 4' || { echo "eval --threads $n printed: $out"; exit 1; }
done
out=$("$bin/dew-run" eval --run-dir "$work/run" --threads -1 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 2 ] && printf '%s' "$out" | grep -qF -- "--threads -1" || { echo "--threads -1: rc=$rc: $out"; exit 1; }
# --weights bf16: the matmul weights kept in bf16 (f32 activations); the metrics come out, an unknown
# storage is refused
loss() { printf '%s' "$1" | python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['loss'])"; }
out=$("$bin/dew-run" eval --run-dir "$work/run" --backend cpu --threads 2 2>&1) || { echo "eval failed: $out"; exit 1; }
base=$(loss "$out")
for w in bf16 int8; do
  out=$("$bin/dew-run" eval --run-dir "$work/run" --backend cpu --threads 2 --weights $w 2>&1) || { echo "eval --weights $w failed: $out"; exit 1; }
  printf '%s' "$out" | grep -q '"step": 4' || { echo "eval --weights $w printed: $out"; exit 1; }
  l=$(loss "$out")
  python3 -c "import sys; b, l = $base, $l; sys.exit(0 if l != b and abs(l - b) <= 0.01 * abs(b) else 1)" ||
    { echo "eval --weights $w: loss $l against f32's $base"; exit 1; }
done
out=$("$bin/dew-run" eval --run-dir "$work/run" --weights int4 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 2 ] && printf '%s' "$out" | grep -qF -- "--weights 'int4'" || { echo "--weights int4: rc=$rc: $out"; exit 1; }
cmp -s "$work/config.before" "$work/run/config.ini" || { echo "eval --threads rewrote the run's config.ini"; exit 1; }
echo "eval --threads overrides the stored count; a negative count is refused"

#!/usr/bin/env bash
# tests/dist/equivalence.sh BIN_DIR BACKEND WORK_DIR — N ranks x batch B train the same model as one
# process x batch N*B: 20 updates of 1 x 16 (no communicator) against 2 ranks x 8, and against 2 ranks
# x 4 x grad_accum 2 with tiny buckets (several buckets, launched during the backward pass). Per-step
# losses and final weights (and EMA) agree within 1e-5 relative; they cannot be bit-exact, since each
# rank's gradient is already a partial sum over its rows. On ref, a 2-rank run is bit-reproducible.
set -euo pipefail
bin=$1 backend=$2 work=$3
source "$(dirname "$0")/common.sh"
rm -rf "$work" && mkdir -p "$work"
common=(train --config "$here/tiny.ini" --backend "$backend" --trainer.steps 20)
run "$work/one.log" "${common[@]}" --run-dir "$work/one" --data.batch_size 16
run_mpi 2 "$work/two.log" "${common[@]}" --run-dir "$work/two" --data.batch_size 8 --run.dist mpi
run_mpi 2 "$work/accum.log" "${common[@]}" --run-dir "$work/accum" --data.batch_size 4 --trainer.grad_accum 2 \
  --run.dist mpi --run.bucket_mb 0.002
grep -qE "in [2-9] buckets" "$work/accum.log" || { echo "expected several buckets"; cat "$work/accum.log"; exit 1; }
[ "$(grep -c '"loss"' "$work/two/metrics.jsonl")" -eq 20 ] || { echo "rank 0 should log 20 steps"; exit 1; }
grep -q '"allreduce_ms"' "$work/two/metrics.jsonl" || { echo "no allreduce_ms in metrics.jsonl"; exit 1; }
for r in two accum; do
  compare losses "$work/$r/metrics.jsonl" "$work/one/metrics.jsonl" 1e-5
  for ema in "" --no-ema; do
    run "$work/export.log" export --run-dir "$work/$r" --out "$work/$r.export$ema" $ema --backend "$backend"
    run "$work/export.log" export --run-dir "$work/one" --out "$work/one.export$ema" $ema --backend "$backend"
    compare weights "$work/$r.export$ema/model.safetensors" "$work/one.export$ema/model.safetensors" 1e-5
  done
done
if [ "$backend" = ref ]; then
  run_mpi 2 "$work/again.log" "${common[@]}" --run-dir "$work/again" --data.batch_size 8 --run.dist mpi
  run "$work/export.log" export --run-dir "$work/again" --out "$work/again.export" --no-ema --backend "$backend"
  cmp "$work/again.export/model.safetensors" "$work/two.export--no-ema/model.safetensors" ||
    { echo "two 2-rank runs differ"; exit 1; }
  compare losses "$work/again/metrics.jsonl" "$work/two/metrics.jsonl" 0
fi
echo "data parallel on $backend: 2 x 8 and 2 x 4 x accum 2 match 1 x 16 within 1e-5"

#!/usr/bin/env bash
# tests/dist/resume.sh BIN_DIR BACKEND WORK_DIR — a run resumes with another number of ranks and the data
# continues the global order: no record skipped or repeated.
# A: 1 process x 16, 40 updates straight. B: 2 ranks x 8 paused at 20 (trainer.stop_at), resumed by one
# process x 16. C: one process x 16 paused at 20, resumed by 2 ranks x 8. The checkpoints at 20 and 40
# hold the same global data position in all three (20 x 16, 40 x 16), and B's and C's per-step losses
# (each step's batch) and final weights match A's within 1e-5 relative.
set -euo pipefail
bin=$1 backend=$2 work=$3
source "$(dirname "$0")/common.sh"
rm -rf "$work" && mkdir -p "$work"
common=(train --config "$here/tiny.ini" --backend "$backend")
run "$work/A.log" "${common[@]}" --run-dir "$work/A" --data.batch_size 16
run_mpi 2 "$work/B1.log" "${common[@]}" --run-dir "$work/B" --data.batch_size 8 --run.dist mpi --trainer.stop_at 20
run "$work/B2.log" train --run-dir "$work/B" --resume --backend "$backend" --trainer.stop_at 40 --run.dist none \
  --data.batch_size 16
run "$work/C1.log" "${common[@]}" --run-dir "$work/C" --data.batch_size 16 --trainer.stop_at 20
run_mpi 2 "$work/C2.log" train --run-dir "$work/C" --resume --backend "$backend" --trainer.stop_at 40 --run.dist mpi \
  --data.batch_size 8
for r in A B C; do
  for step in 20 40; do
    got=$(data_next "$work/$r/checkpoints/step-000000$step.h5")
    [ "$got" = $((step * 16)) ] || { echo "$r: data position at update $step is $got, expected $((step * 16))"; exit 1; }
  done
done
for r in B C; do
  compare losses "$work/$r/metrics.jsonl" "$work/A/metrics.jsonl" 1e-5
  [ "$(grep -c '"loss"' "$work/$r/metrics.jsonl")" -eq 40 ] || { echo "$r: expected 40 logged steps"; exit 1; }
  for ema in "" --no-ema; do
    run "$work/export.log" export --run-dir "$work/$r" --out "$work/$r.export$ema" $ema --backend "$backend"
    run "$work/export.log" export --run-dir "$work/A" --out "$work/A.export$ema" $ema --backend "$backend"
    compare weights "$work/$r.export$ema/model.safetensors" "$work/A.export$ema/model.safetensors" 1e-5
  done
done
echo "resume across world sizes on $backend: 2 -> 1 and 1 -> 2 ranks continue the global data order"

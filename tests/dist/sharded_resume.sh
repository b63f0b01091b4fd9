#!/usr/bin/env bash
# tests/dist/sharded_resume.sh BIN_DIR BACKEND WORK_DIR — checkpoints of sharded runs load at any rank count
# and in any shard mode (one file layout: every tensor whole), and the run continues.
#   A: 1 process x 16, 20 updates straight.  D: 2 ranks x 8, shard = none, 20 updates straight.
#   B: 2 ranks x 8, shard = parameters, paused at 10, resumed by 1 process x 16 (2 -> 1).
#   C: 1 process x 16, paused at 10, resumed by 2 ranks x 8 with shard = gradients (1 -> 2).
#   E: 2 ranks x 8, shard = parameters, paused at 10, resumed with shard = none (parameters -> none).
#   F: 2 ranks x 8, shard = none, paused at 10, resumed with shard = optimizer (none -> optimizer).
# B and C match A within 1e-5 (another world size sums in another order); E and F match D bit for bit
# (the same arithmetic), losses and every checkpoint tensor. Data positions are 10 x 16 and 20 x 16.
set -euo pipefail
bin=$1 backend=$2 work=$3
source "$(dirname "$0")/common.sh"
rm -rf "$work" && mkdir -p "$work"
common=(train --config "$here/tiny.ini" --backend "$backend" --trainer.steps 20 --trainer.eval_every 10)
two=(--data.batch_size 8 --run.dist mpi)
one=(--data.batch_size 16 --run.dist none)
resume() { local dir=$1; shift; echo train --run-dir "$work/$dir" --resume --backend "$backend" --trainer.stop_at 20 "$@"; }
run "$work/A.log" "${common[@]}" "${one[@]}" --run-dir "$work/A"
run_mpi 2 "$work/D.log" "${common[@]}" "${two[@]}" --run-dir "$work/D"
run_mpi 2 "$work/B1.log" "${common[@]}" "${two[@]}" --run-dir "$work/B" --run.shard parameters --trainer.stop_at 10
run "$work/B2.log" $(resume B "${one[@]}")
run "$work/C1.log" "${common[@]}" "${one[@]}" --run-dir "$work/C" --trainer.stop_at 10
run_mpi 2 "$work/C2.log" $(resume C "${two[@]}" --run.shard gradients)
run_mpi 2 "$work/E1.log" "${common[@]}" "${two[@]}" --run-dir "$work/E" --run.shard parameters --trainer.stop_at 10
run_mpi 2 "$work/E2.log" $(resume E "${two[@]}" --run.shard none)
run_mpi 2 "$work/F1.log" "${common[@]}" "${two[@]}" --run-dir "$work/F" --trainer.stop_at 10
run_mpi 2 "$work/F2.log" $(resume F "${two[@]}" --run.shard optimizer)
grep -q "run.shard = gradients over 2 ranks" "$work/C2.log" || { echo "C2 not sharded"; cat "$work/C2.log"; exit 1; }
grep -q "run.shard = optimizer over 2 ranks" "$work/F2.log" || { echo "F2 not sharded"; cat "$work/F2.log"; exit 1; }
for r in A B C D E F; do
  for step in 10 20; do
    got=$(data_next "$work/$r/checkpoints/step-000000$step.h5")
    [ "$got" = $((step * 16)) ] || { echo "$r: data position at update $step is $got, expected $((step * 16))"; exit 1; }
  done
  [ "$(grep -c '"loss"' "$work/$r/metrics.jsonl")" -eq 20 ] || { echo "$r: expected 20 logged steps"; exit 1; }
done
for r in B C; do
  echo "== $r against A"
  compare losses "$work/$r/metrics.jsonl" "$work/A/metrics.jsonl" 1e-5
  "$PYTHON" "$here/compare_checkpoints.py" "$work/$r/checkpoints/step-00000020.h5" "$work/A/checkpoints/step-00000020.h5" 1e-5
done
for r in E F; do
  echo "== $r against D"
  compare losses "$work/$r/metrics.jsonl" "$work/D/metrics.jsonl" 0
  "$PYTHON" "$here/compare_checkpoints.py" "$work/$r/checkpoints/step-00000020.h5" "$work/D/checkpoints/step-00000020.h5" 0
done
echo "sharded checkpoints resume 2 -> 1, 1 -> 2, parameters -> none and none -> optimizer"

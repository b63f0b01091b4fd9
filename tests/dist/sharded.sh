#!/usr/bin/env bash
# tests/dist/sharded.sh BIN_DIR BACKEND WORK_DIR LION_DIR — [run] shard against shard = none.
# 1. On 2 ranks x batch 8, every shard mode (optimizer, gradients, parameters) with every optimizer
#    (adamw with clipping, weight decay and EMA from tiny.ini; sgd, lamb, muon; the example plugin lion
#    from LION_DIR) gives the per-step losses of shard = none within 1e-6 relative over 6 updates, and
#    the same parameters, EMA and optimizer state in the checkpoint (read with h5py) within 1e-6.
# 2. The same with grad_accum 2 and tiny buckets (several buckets, owners changing between them).
# 3. One rank (dist = mpi without mpirun): every shard mode is a no-op, bit for bit.
# The log must say the run is sharded (a silently ignored option fails here).
set -euo pipefail
bin=$1 backend=$2 work=$3 lion=$4
source "$(dirname "$0")/common.sh"
rm -rf "$work" && mkdir -p "$work"
common=(train --config "$here/tiny.ini" --backend "$backend" --trainer.steps 6 --trainer.eval_every 3
        --trainer.checkpoint_every 0 --run.dist mpi)
ckpt=checkpoints/step-00000006.h5
check() {  # check RUN REFERENCE RTOL
  compare losses "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" "$3"
  "$PYTHON" "$here/compare_checkpoints.py" "$work/$1/$ckpt" "$work/$2/$ckpt" "$3"
}
for optim in adamw sgd lamb muon lion; do
  extra=(--optim.name "$optim")
  [ "$optim" = lion ] && extra+=(--plugin-dir "$lion" --optim.lr 1e-3)
  run_mpi 2 "$work/$optim-none.log" "${common[@]}" "${extra[@]}" --run-dir "$work/$optim-none" --data.batch_size 8
  for mode in optimizer gradients parameters; do
    r=$optim-$mode
    run_mpi 2 "$work/$r.log" "${common[@]}" "${extra[@]}" --run-dir "$work/$r" --data.batch_size 8 --run.shard $mode
    grep -q "run.shard = $mode over 2 ranks" "$work/$r.log" || { echo "$r: not sharded?"; cat "$work/$r.log"; exit 1; }
    echo "== $r"
    check "$r" "$optim-none" 1e-6
  done
done
run_mpi 2 "$work/accum-none.log" "${common[@]}" --run-dir "$work/accum-none" --data.batch_size 4 \
  --trainer.grad_accum 2 --run.bucket_mb 0.0005
for mode in optimizer gradients parameters; do
  run_mpi 2 "$work/accum-$mode.log" "${common[@]}" --run-dir "$work/accum-$mode" --data.batch_size 4 \
    --trainer.grad_accum 2 --run.bucket_mb 0.0005 --run.shard $mode
  grep -qE "in [3-9] buckets" "$work/accum-$mode.log" || { echo "expected several buckets"; cat "$work/accum-$mode.log"; exit 1; }
  echo "== accum-$mode"
  check "accum-$mode" accum-none 1e-6
done
run "$work/one-none.log" "${common[@]}" --run-dir "$work/one-none" --data.batch_size 16
for mode in optimizer gradients parameters; do
  run "$work/one-$mode.log" "${common[@]}" --run-dir "$work/one-$mode" --data.batch_size 16 --run.shard $mode
  echo "== one rank, $mode"
  check "one-$mode" one-none 0
done
echo "shard = optimizer / gradients / parameters match shard = none on 2 ranks (1e-6) and are a no-op on one"

#!/usr/bin/env bash
# tools/bench/validation_sharded.sh [OLD_BIN_DIR] — the wall time of a validation pass of configs/lm-fortunes.ini
# (128,000 validation tokens, 1,000 windows of 128) in one process x batch 32 and on 2 MPI ranks x 16 (sharded
# validation), 1 OpenMP thread per process. With OLD_BIN_DIR (a build from before sharded validation, e.g. a
# copy of build/ at 6a0ec83 with LD_LIBRARY_PATH to its lib/), also its 2 ranks, each scoring the whole split.
# Validation time = T(the run with the whole split) - T(the run with objective.eval_batches 1); two rounds.
set -u
cd "$(dirname "$0")/../.."
old=${1:-}
lscpu | grep "Model name"
common=(train --config configs/lm-fortunes.ini --trainer.steps 1 --trainer.checkpoint_every 0 --objective.sample_tokens 0
        --run.threads 1)
mpi=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -np 2)
work=$(mktemp -d)
t() { local s; s=$(date +%s.%N); "$@" > "$work/last.log" 2>&1 || { cat "$work/last.log"; exit 1; }; echo "$(date +%s.%N) - $s" | bc; }
for round in 1 2; do
  declare -A T=()
  for eb in 1 0; do
    rm -rf "$work"/v-*
    T[one$eb]=$(t env OMP_NUM_THREADS=1 build/bin/dew-run "${common[@]}" --run-dir "$work/v-one" --data.batch_size 32 --objective.eval_batches $eb)
    T[two$eb]=$(t "${mpi[@]}" build/bin/dew-run "${common[@]}" --run-dir "$work/v-two" --data.batch_size 16 --run.dist mpi --objective.eval_batches $eb)
    [ -n "$old" ] && T[old$eb]=$(t "${mpi[@]}" -x LD_LIBRARY_PATH="$old/../lib" "$old/dew-run" "${common[@]}" --run-dir "$work/v-old" --data.batch_size 16 --run.dist mpi --objective.eval_batches $eb)
  done
  line="round $round validation seconds: 1 process $(echo "${T[one0]} - ${T[one1]}" | bc)  2 ranks sharded $(echo "${T[two0]} - ${T[two1]}" | bc)"
  [ -n "$old" ] && line+="  2 ranks whole split (old) $(echo "${T[old0]} - ${T[old1]}" | bc)"
  echo "$line"
done
grep -ho '"val/tokens":[0-9.]*' "$work"/v-*/metrics.jsonl | sort | uniq -c
rm -rf "$work"

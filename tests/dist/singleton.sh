#!/usr/bin/env bash
# tests/dist/singleton.sh BIN_DIR WORK_DIR — run.dist = mpi without mpirun is a world of one (MPI
# singleton): it trains like dist = none and eval/export of such a run need no communicator.
set -euo pipefail
bin=$1 work=$2
source "$(dirname "$0")/common.sh"
rm -rf "$work" && mkdir -p "$work"
run "$work/one.log" train --config "$here/tiny.ini" --run-dir "$work/one" --trainer.steps 5 --run.dist mpi
grep -q "data parallel: 1 ranks" "$work/one.log" || { echo "expected a world of one"; cat "$work/one.log"; exit 1; }
[ "$(grep -c '"allreduce_ms"' "$work/one/metrics.jsonl")" -eq 5 ] || { echo "expected 5 logged steps"; exit 1; }
run "$work/eval.log" eval --run-dir "$work/one"
run "$work/export.log" export --run-dir "$work/one" --out "$work/export"
echo "dist = mpi without mpirun trains as a world of one; eval and export work"

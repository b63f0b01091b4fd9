#!/usr/bin/env bash
# tools/bench/omp-wait.sh [BUILD_DIR] [STEPS] — dew-run train's speed under OpenMP waiting policies: the diffusion
# config (a small DiT: thousands of short parallel regions per step) for STEPS updates (150) at 1 thread, then
# 2 threads waiting passively, spinning ~0.1 ms (GOMP_SPINCOUNT=10000), ~1 ms (100000), ~10 us (1000), and with
# dew-run's own choice (no variable set). Prints samples/s of the last two log windows and the wall time of each.
# Run it once on an idle machine and once with another job on one core (docs/benchmarks.md, "OpenMP set-up").
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
steps=${2:-150}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() {  # run LABEL THREADS [VAR=VALUE ...]
  local label=$1 threads=$2
  shift 2
  local extra=()
  [ "$threads" != auto ] && extra=(--run.threads "$threads")
  local s e
  s=$(date +%s.%N)
  env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OMP_NUM_THREADS "$@" "$build/bin/dew-run" train \
    --config configs/diffusion-fmnist.ini --run-dir "$work/$label" --trainer.steps "$steps" --trainer.eval_every 0 \
    --trainer.checkpoint_every 0 --trainer.log_every 50 --trainer.keep 1 "${extra[@]}" >"$work/$label.log" 2>&1
  e=$(date +%s.%N)
  printf '%-22s %s wall %.1f s\n' "$label" "$(grep -o '[0-9]* samples/s' "$work/$label.log" | tail -n 2 | tr '\n' ' ')" \
    "$(echo "$e - $s" | bc)"
}
echo "# load $(cut -d' ' -f1-3 /proc/loadavg)"
run t1 1 OMP_WAIT_POLICY=PASSIVE
run t2-passive 2 OMP_WAIT_POLICY=PASSIVE
run t2-spin10k 2 GOMP_SPINCOUNT=10000
run t2-spin100k 2 GOMP_SPINCOUNT=100000
run t2-spin1k 2 GOMP_SPINCOUNT=1000
run auto auto
echo "# load $(cut -d' ' -f1-3 /proc/loadavg)"

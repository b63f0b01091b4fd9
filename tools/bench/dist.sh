#!/usr/bin/env bash
# tools/bench/dist.sh [BUILD_DIR] [UPDATES] — data-parallel throughput on this machine (a tool, not a test).
#
# DEW_BENCH_CONFIG=configs/char-small.ini DEW_BENCH_BATCH=8 picks another workload (global batch B: the
# 2-rank layout runs B/2 per rank); language-model configs also report tokens/s.
# Trains configs/fmnist-classifier.ini (convnet, Fashion-MNIST, global batch 128) by default, for UPDATES updates
# (default 60; no validation: trainer.stop_at < trainer.steps) in three layouts of the same global batch:
#   1x1  one process, 1 thread,  batch 128          (the per-core baseline)
#   1x2  one process, 2 threads, batch 128          (threads: what 2 cores give without MPI)
#   2x1  two ranks (mpirun), 1 thread each, batch 64 per rank (run.dist = mpi)
# and prints samples/s (global samples, mean of the logged windows after the first), ms per update,
# the synchronisation time per update (allreduce_ms of metrics.jsonl: bucket copies, MPI calls, waits
# not hidden behind backward, averaging) and the scaling efficiency 2x1 / (2 x 1x1), plus 2x1 / 1x2.
# Figures are noisy when other work shares the cores (OpenMP threads suffer most): the layouts run in
# DEW_BENCH_REPEATS (3) interleaved rounds; best and median are printed, with the load average.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
updates=${2:-60}
repeats=${DEW_BENCH_REPEATS:-3}  # rounds of the three layouts; best and median are reported
bin=$build/bin
work=${DEW_BENCH_WORK:-$(mktemp -d /tmp/dew-bench-dist.XXXXXX)}
config=${DEW_BENCH_CONFIG:-$root/configs/fmnist-classifier.ini}
batch=${DEW_BENCH_BATCH:-128}
[ -x "$bin/dew-run" ] || { echo "no $bin/dew-run: build first (or pass BUILD_DIR)"; exit 2; }
[ -f "$build/lib/dew/plugins/dew_mpi.so" ] || { echo "no mpi plugin in $build (MPI not found at configure?)"; exit 2; }
common=(train --config "$config" --data.batch_size "$batch" --trainer.steps 2000 --trainer.stop_at "$updates" --trainer.log_every 10
        --trainer.eval_every 0 --trainer.checkpoint_every 0)

echo "dist benchmark: $updates updates of $(basename "$config") (global batch $batch), $repeats rounds; work dir $work"
mkdir -p "$work"
for round in $(seq "$repeats"); do
  echo "round $round: load average $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf "$work/1x1-$round" "$work/1x2-$round" "$work/2x1-$round"
  OMP_NUM_THREADS=1 "$bin/dew-run" "${common[@]}" --run-dir "$work/1x1-$round" --run.threads 1 > "$work/1x1-$round.log" 2>&1
  OMP_NUM_THREADS=2 "$bin/dew-run" "${common[@]}" --run-dir "$work/1x2-$round" --run.threads 2 > "$work/1x2-$round.log" 2>&1
  mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$bin/dew-run" "${common[@]}" \
    --run-dir "$work/2x1-$round" --run.threads 1 --data.batch_size $((batch / 2)) --run.dist mpi > "$work/2x1-$round.log" 2>&1 < /dev/null
done
echo "after: load average $(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/python3 - "$work" "$repeats" <<'PY'
import json, statistics, sys
work, repeats = sys.argv[1], int(sys.argv[2])
def window_means(run):
    rows = [json.loads(l) for l in open(f"{work}/{run}/metrics.jsonl") if '"loss"' in l][1:]  # skip warm-up
    return (statistics.mean(r["samples_per_sec"] for r in rows), statistics.mean(r["step_time_ms"] for r in rows),
            statistics.mean(r.get("allreduce_ms", 0.0) for r in rows),
            statistics.mean(r.get("tokens_per_sec", 0.0) for r in rows))
layouts = [("1x1", "1 process x 1 thread"), ("1x2", "1 process x 2 threads"), ("2x1", "2 ranks x 1 thread")]
res = {k: [window_means(f"{k}-{r}") for r in range(1, repeats + 1)] for k, _ in layouts}
print(f"{'layout':34} {'samples/s best':>15} {'median':>8} {'tokens/s best':>14} {'ms/update':>10} {'allreduce_ms':>13}")
best = {}
for k, name in layouts:
    runs = sorted(res[k], key=lambda x: -x[0])
    best[k] = runs[0][0]
    ar = f"{runs[0][2]:.2f}" if k == "2x1" else "-"
    print(f"{name:34} {runs[0][0]:15.0f} {statistics.median(x[0] for x in runs):8.0f} {runs[0][3]:14.0f} {runs[0][1]:10.1f} {ar:>13}")
print(f"scaling efficiency, 2 ranks vs 1 process x 1 thread (best): {best['2x1'] / (2 * best['1x1']):.0%}")
print(f"2 ranks x 1 thread vs 1 process x 2 threads (best):         {best['2x1'] / best['1x2']:.2f}x")
print(f"2 threads vs 1 thread in one process (best):                {best['1x2'] / best['1x1']:.2f}x")
PY

#!/usr/bin/env bash
# tools/bench/shard.sh [BUILD_DIR] [UPDATES] [MODES...] — [run] shard on configs/llama-150m.ini, 2 ranks x 1
# thread (mpirun), UPDATES updates (default 3) per mode (default: none parameters optimizer gradients,
# and parameters with recompute = blocks), one after another in one sitting. A mode is a shard mode with
# optional suffixes: +recompute (--trainer.recompute blocks), +noprefetch (--run.shard_prefetch false), e.g.
# parameters+recompute+noprefetch. Prints, from rank 0's
# metrics.jsonl, per mode: the step time (median over the updates after the first), the memory rank 0
# holds (mem_params_mb + mem_grads_mb + mem_optim_mb), its peak (mem_peak_mb at the last update) and the
# ratios to the first mode (shard = none by default), and checks every mode's losses against its (1e-6
# relative); under shard = parameters also the block gathers that were prefetched / waited for on the spot.
# Needs data/fortunes (build/bin/dew-tokenize --input /usr/share/games/fortunes --out data/fortunes
# --tokenizer byte). Run directories go to ${SHARD_BENCH_DIR:-/tmp/dew-shard-bench}; SHARD_BENCH_ARGS adds
# dew-run options to every run (e.g. "--model.n_layers 4" for a shorter sitting).
set -euo pipefail
build=${1:-build}
updates=${2:-3}
shift 2 2> /dev/null || true
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(none parameters optimizer gradients parameters+recompute)
work=${SHARD_BENCH_DIR:-/tmp/dew-shard-bench}
rm -rf "$work" && mkdir -p "$work"
grep -m1 "model name" /proc/cpuinfo
for m in "${modes[@]}"; do
  shard=${m%%+*}
  extra=()
  case "$m" in *+recompute*) extra+=(--trainer.recompute blocks) ;; esac
  case "$m" in *+noprefetch*) extra+=(--run.shard_prefetch false) ;; esac
  mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$build/bin/dew-run" train \
    --config configs/llama-150m.ini --run-dir "$work/$m" --run.dist mpi --run.threads 1 --run.shard "$shard" \
    --trainer.steps 1000 --trainer.stop_at "$updates" --trainer.eval_every 0 --trainer.checkpoint_every 0 \
    --trainer.log_every 1 "${extra[@]}" ${SHARD_BENCH_ARGS:-} > "$work/$m.log" 2>&1 || { echo "$m failed"; tail -20 "$work/$m.log"; exit 1; }
  echo "done: $m"
done
/usr/bin/python3 - "$work" "${modes[@]}" << 'PY'
import json, statistics, sys
work, modes = sys.argv[1], sys.argv[2:]
def read(m):
    with open(f"{work}/{m}/metrics.jsonl") as f:
        lines = [json.loads(l) for l in f if '"loss"' in l]
    first = next(l for l in lines if "mem_params_mb" in l)
    held = first["mem_params_mb"] + first["mem_grads_mb"] + first["mem_optim_mb"]
    times = [l["step_time_ms"] for l in lines[1:]] or [lines[0]["step_time_ms"]]
    gathers = (f" gathers {lines[-1]['gathers_prefetched']:.0f} prefetched / {lines[-1]['gathers_blocking']:.0f} on the spot"
               if "gathers_blocking" in lines[-1] else "")
    return dict(loss=[l["loss"] for l in lines], held=held, parts=(first["mem_params_mb"], first["mem_grads_mb"],
                first["mem_optim_mb"]), peak=lines[-1]["mem_peak_mb"], ms=statistics.median(times), gathers=gathers)
r = {m: read(m) for m in modes}
base = r[modes[0]]
print(f"{'mode':24} {'step ms':>9} {'x first':>7} {'params/grads/optim MB':>24} {'held MB':>8} {'x first':>7} {'peak MB':>8} {'x first':>7}  losses")
for m in modes:
    x = r[m]
    same = all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(x["loss"], base["loss"]))
    parts = "/".join(f"{v:.0f}" for v in x["parts"])
    print(f"{m:24} {x['ms']:9.0f} {x['ms'] / base['ms']:7.2f} {parts:>24} {x['held']:8.0f} {x['held'] / base['held']:7.2f} "
          f"{x['peak']:8.0f} {x['peak'] / base['peak']:7.2f}  {'= first (1e-6)' if same else 'DIFFER'} {[round(v, 6) for v in x['loss']]}{x['gathers']}")
PY

#!/usr/bin/env bash
# tools/bench/run-mixed.sh [ROUNDS] [BUILD_DIR] — issue 17's mixed-precision table on this CPU: `dew-bench train
# --config char-small --threads 1` in f32 and in bf16-mixed next to PyTorch's bf16 autocast on the same config
# (torch_gpt_train.py --autocast bf16, RMSNorm + SwiGLU, foreach AdamW), alternating the three within each round.
# Prints each JSON line with the load average after it, then the medians of tokens/s and of the per-round
# ratios (bf16-mixed over dew f32: bar 1.5x; over the autocast peer: bar 1.3x) and dew's activation memory
# (mem_activations_mb, bar <= 0.6x f32) and peak memory of the two precisions.
# On CPUs without AVX512-BF16 PyTorch 1.13's bf16 autocast has no native kernel (minutes a run) and dew's bf16
# products convert around f32 ones: the script says so and measures dew only (so under DEW_CPU_MAX_ISA=avx2 too).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tools/bench/pin.sh
rounds=${1:-3}
build=${2:-build}
peers=${DEW_PEERS:-../shared/peers}
peer=1
grep -qw avx512_bf16 /proc/cpuinfo || { peer=0; echo "# no AVX512-BF16 on this CPU: dew only"; }
if [ "${DEW_CPU_MAX_ISA:-}" = avx2 ]; then peer=0; echo "# standing in for an AVX2 CPU (DEW_CPU_MAX_ISA=avx2): dew only"; fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
load() { echo "# load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"; }
for r in $(seq "$rounds"); do
  echo "# round $r" | tee -a "$log"
  for p in f32 bf16-mixed; do
    pinned 1 "$build/bin/dew-bench" train --config char-small --threads 1 --precision "$p" |
      tee -a "$log"
    load
  done
  if [ "$peer" = 1 ]; then
    DEW_PEERS="$peers" tools/bench/torch_env.sh 1 /usr/bin/python3 "$peers/torch_gpt_train.py" --config char-small \
      --norm rms --mlp swiglu --foreach on --threads 1 --autocast bf16 2>/dev/null | tail -n 1 | tee -a "$log"
    load
  fi
done
python3 - "$log" <<'PY'
import json, statistics, sys
runs, mem = {}, {}
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    who = d.get("precision", "f32") if d.get("backend") == "cpu" else "torch"
    runs.setdefault(who, []).append(d["tokens_per_sec"])
    if who != "torch":
        mem.setdefault(who, []).append((d.get("mem_activations_mb"), d.get("mem_peak_mb")))
def med(who):
    return statistics.median(runs[who]) if who in runs else float("nan")
print("# tokens/s medians: " + ", ".join(f"{w} {med(w):,.1f}" for w in ("f32", "bf16-mixed", "torch") if w in runs))
def ratio(a, b, label, bar):
    if a not in runs or b not in runs:
        return
    rs = [x / y for x, y in zip(runs[a], runs[b])]
    print(f"# {label}: median {statistics.median(rs):.2f}x (bar {bar}; rounds: {', '.join(f'{v:.2f}' for v in rs)})")
ratio("bf16-mixed", "f32", "bf16-mixed / dew f32", "1.5x")
ratio("bf16-mixed", "torch", "bf16-mixed / PyTorch bf16 autocast", "1.3x")
if "f32" in mem and "bf16-mixed" in mem:
    (fa, fp), (ba, bp) = mem["f32"][0], mem["bf16-mixed"][0]
    print(f"# memory: activations {fa} -> {ba} MB ({ba / fa:.2f}x, bar <= 0.6x), peak {fp} -> {bp} MB ({bp / fp:.2f}x)")
PY

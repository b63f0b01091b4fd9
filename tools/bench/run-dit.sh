#!/usr/bin/env bash
# tools/bench/run-dit.sh [ROUNDS] [BUILD_DIR] — `dew-bench train --config dit` next to the PyTorch peer
# torch_dit_train.py (same DiT step: 32x32x3, patch 4, d 256, 6 layers, 4 heads, batch 16, AdamW, fp32) at 1 and
# 2 threads, alternating dew and torch runs in the same minutes (the machine is shared). Prints each JSON line
# and the load average after it, then per thread count the medians of images/s and of the per-round ratios.
# Needs `apt-get install python3-torch python3-numpy libopenblas0-openmp` for the peer.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
build=${2:-build}
peers=${DEW_PEERS:-../shared/peers}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
load() { echo "# load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"; }
for r in $(seq "$rounds"); do
  for t in 1 2; do
    echo "# round $r threads $t" | tee -a "$log"
    OMP_PROC_BIND=close OMP_PLACES=cores "$build/bin/dew-bench" train --config dit --threads "$t" | tee -a "$log"
    load
    "$peers/peer_env.sh" tuned "$t" /usr/bin/python3 "$peers/torch_dit_train.py" --threads "$t" 2>/dev/null |
      tail -n 1 | tee -a "$log"
    load
  done
done
python3 - "$log" <<'PY'
import json, statistics, sys
runs = {}  # (threads, who) -> [images/s] in round order
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    who = "dew" if "cpu_ms_per_step_median" in d or d.get("backend") == "cpu" else "torch"
    t = d.get("threads", d.get("threads_requested"))
    runs.setdefault((t, who), []).append(d["images_per_sec"])
for t in sorted({k[0] for k in runs}):
    dew, torch = runs.get((t, "dew"), []), runs.get((t, "torch"), [])
    ratios = [a / b for a, b in zip(dew, torch)]
    print(f"# threads {t}: dew {statistics.median(dew):.1f} img/s, torch {statistics.median(torch):.1f} img/s, "
          f"median ratio {statistics.median(ratios):.2f}x (rounds: {', '.join(f'{x:.2f}' for x in ratios)})")
PY

#!/usr/bin/env bash
# tools/bench/run-dit.sh [ROUNDS] [BUILD_DIR] — `dew-bench train --config dit` next to the PyTorch peer
# torch_dit_train.py (same DiT step: 32x32x3, patch 4, d 256, 6 layers, 4 heads, batch 16, AdamW) at 1 and
# 2 threads, in two precisions, alternating dew and torch runs in the same minutes (the machine is shared):
#   f32:  dew --matmul-precision highest  vs  the peer as it is (fp32);
#   medium:     dew --matmul-precision medium (bf16 matmul operands, f32 accumulation and activations;
#               cpu: AVX512-BF16 CPUs)  vs  the peer under bf16 autocast (tools/bench/torch_dit_autocast.py);
#   bf16-mixed: dew --precision bf16-mixed (autocast: bf16 activations and operands, f32 master weights,
#               statistics and loss; docs/precision.md)  vs  the same autocast peer.
# Prints each JSON line and the load average after it, then per thread count the medians of images/s and
# of the per-round ratios: each precision against its own peer, and bf16 dew against the fp32 peer.
# DEW_DIT_PRECISIONS (default "highest medium bf16-mixed") picks the modes. Needs `apt-get install python3-torch python3-numpy
# libopenblas0-openmp` for the peer.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tools/bench/pin.sh
rounds=${1:-3}
build=${2:-build}
peers=${DEW_PEERS:-../shared/peers}
precisions=${DEW_DIT_PRECISIONS:-highest medium bf16-mixed}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
load() { echo "# load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"; }
for r in $(seq "$rounds"); do
  for t in 1 2; do
    for p in $precisions; do
      echo "# round $r threads $t precision $p" | tee -a "$log"
      mode=(--matmul-precision "$p")
      [ "$p" = bf16-mixed ] && mode=(--precision bf16-mixed)
      pinned "$t" "$build/bin/dew-bench" train --config dit --threads "$t" \
        "${mode[@]}" | tee -a "$log"
      load
      peer="$peers/torch_dit_train.py"
      [ "$p" != highest ] && peer=tools/bench/torch_dit_autocast.py
      DEW_PEERS="$peers" tools/bench/torch_env.sh "$t" /usr/bin/python3 "$peer" --threads "$t" 2>/dev/null |
        tail -n 1 | tee -a "$log"
      load
    done
  done
done
python3 - "$log" <<'PY'
import statistics, sys
sys.path.insert(0, "tools/bench")
from sitting_bars import runs_of  # the one parser and pairing rule (each autocast run keyed by the dew run it follows)
runs = {(k[2], k[1], k[3]): v for k, v in runs_of(open(sys.argv[1]).read().splitlines()).items() if k[0] == "dit"}
def line(t, a, b, label):
    x, y = runs.get((t,) + a, []), runs.get((t,) + b, [])
    if not x or not y:
        return
    ratios = [p / q for p, q in zip(x, y)]
    print(f"# threads {t} {label}: dew {statistics.median(x):.1f} img/s, torch {statistics.median(y):.1f} img/s, "
          f"median ratio {statistics.median(ratios):.2f}x (rounds: {', '.join(f'{v:.2f}' for v in ratios)})")
for t in sorted({k[0] for k in runs}):
    line(t, ("dew", "f32"), ("torch", "f32"), "f32 vs f32")
    line(t, ("dew", "bf16"), ("torch", "bf16"), "bf16 operands vs bf16-autocast")
    line(t, ("dew", "bf16-mixed"), ("torch", "bf16 after bf16-mixed"), "bf16-mixed vs bf16-autocast")
    line(t, ("dew", "bf16"), ("torch", "f32"), "bf16 operands vs f32 peer")
PY

#!/usr/bin/env bash
# tools/bench/run-lm.sh [ROUNDS] [BUILD_DIR] — dew-bench train (char-small, gpt-mini) and generate
# (char-small) next to the PyTorch peers on the same configs and threads (1 and 2), alternating dew and
# torch runs (the machine is shared: compare medians; each line is followed by the load average). Ends with the
# ratios of issue 18's bars these runs measure (sitting_bars.py: medians of the per-round ratios, 2-thread scaling).
# Needs `apt-get install python3-torch python3-numpy libopenblas0-openmp` for the peers.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tools/bench/pin.sh
rounds=${1:-2}
build=${2:-build}
peers=${DEW_PEERS:-../shared/peers}
load() { echo "# load $(cut -d' ' -f1-3 /proc/loadavg)"; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
runs() {
  for r in $(seq "$rounds"); do
    for t in 1 2; do
      for c in char-small gpt-mini; do
        pinned "$t" "$build/bin/dew-bench" train --config "$c" --threads "$t"; load
        DEW_PEERS="$peers" tools/bench/torch_env.sh "$t" /usr/bin/python3 "$peers/torch_gpt_train.py" --config "$c" --norm rms \
          --mlp swiglu --foreach on --threads "$t" 2>/dev/null | tail -n 1; load
      done
      pinned "$t" "$build/bin/dew-bench" generate --config char-small --threads "$t"; load
      DEW_PEERS="$peers" tools/bench/torch_env.sh "$t" /usr/bin/python3 "$peers/torch_generate.py" --config char-small --norm rms \
        --mlp swiglu --threads "$t" 2>/dev/null | tail -n 1; load
    done
  done
}
runs | tee "$log"
python3 tools/bench/sitting_bars.py "$log"

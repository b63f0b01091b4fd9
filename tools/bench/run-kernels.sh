#!/usr/bin/env bash
# tools/bench/run-kernels.sh [ROUNDS] — dew-bench kernels next to PyTorch on the same shapes and threads,
# alternating dew and torch runs (the machine is shared: compare medians). Prints JSON lines; needs
# `apt-get install python3-torch python3-numpy libopenblas0-openmp` for the peers.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tools/bench/pin.sh
rounds=${1:-3}
peers=${DEW_PEERS:-../shared/peers}
shapes=256x256x256,1024x1024x1024,2048x2048x2048,2048x384x1152,2048x384x384,2048x384x1024,2048x1024x384,2048x384x1536,2048x1536x384,2048x384x256
for r in $(seq "$rounds"); do
  for t in 1 2; do
    pinned "$t" build/bin/dew-bench kernels --threads "$t"
    DEW_PEERS="$peers" tools/bench/torch_env.sh "$t" /usr/bin/python3 "$peers/torch_matmul.py" --threads "$t" --shapes "$shapes" --min-time 0.5 | tail -n 1
    DEW_PEERS="$peers" tools/bench/torch_env.sh "$t" /usr/bin/python3 tools/bench/torch_attention.py --threads "$t" | tail -n 1
  done
done

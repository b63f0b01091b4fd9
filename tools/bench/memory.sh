#!/usr/bin/env bash
# tools/bench/memory.sh [ROUNDS] [BUILD_DIR] — activation memory side by side: the resident memory the first
# training forward adds (its graph and the tensors saved for the backward), dew against PyTorch on the same
# models (the language models char-small and gpt-mini, RMSNorm + SwiGLU as the speed sittings run them, and the
# DiT of the diffusion sittings), in f32 and in bf16 (dew's bf16-mixed, PyTorch's bf16 autocast), at 1 thread. Both processes run under
# MALLOC_MMAP_THRESHOLD_=65536, so glibc maps big blocks and returns freed ones: resident memory follows the tensors
# alive. dew's side is `dew-bench train --activation-memory` (its cpu backend without the block cache, so freed
# buffers leave the process as PyTorch's do), which also prints mem_activations_mb: the backend's own count of the
# step's peak over the parameters, gradients and optimizer state. PyTorch's is torch_activation_memory.py (the
# peer's model). Prints each JSON line, then the medians per config and precision and the dew / PyTorch ratio.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-2}
build=${2:-build}
peers=${DEW_PEERS:-../shared/peers}
export MALLOC_MMAP_THRESHOLD_=65536
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for r in $(seq "$rounds"); do
  for c in char-small gpt-mini dit; do
    for p in f32 bf16-mixed; do
      "$build/bin/dew-bench" train --config "$c" --threads 1 --precision "$p" --steps 1 --warmup 0 \
        --activation-memory | tail -n 1 | tee -a "$log"
      autocast=off
      [ "$p" = bf16-mixed ] && autocast=bf16
      peer=(--model gpt --config "$c" --norm rms --mlp swiglu)
      [ "$c" = dit ] && peer=(--model dit)
      DEW_PEERS="$peers" tools/bench/torch_env.sh 1 /usr/bin/python3 tools/bench/torch_activation_memory.py \
        "${peer[@]}" --threads 1 --autocast "$autocast" 2>/dev/null | tail -n 1 | tee -a "$log"
    done
  done
done
python3 - "$log" <<'PY'
import json, statistics, sys
dew, dew_alloc, torch = {}, {}, {}
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    j = json.loads(line)
    if j.get("bench") == "torch_activation_memory":
        key = (j["config"], "f32" if j["autocast"] == "off" else "bf16-mixed")
        torch.setdefault(key, []).append(j["activation_rss_mb"])
    elif "activation_rss_mb" in j:
        key = ("dit" if j["bench"] == "dit_train" else j["config"], j["precision"])
        dew.setdefault(key, []).append(j["activation_rss_mb"])
        dew_alloc.setdefault(key, []).append(j["mem_activations_mb"])
print("| config | precision | dew MiB (RSS) | dew MiB (allocator) | PyTorch MiB (RSS) | dew / PyTorch |")
print("| --- | --- | --- | --- | --- | --- |")
for key in sorted(dew):
    d, a = statistics.median(dew[key]), statistics.median(dew_alloc[key])
    t = statistics.median(torch[key]) if key in torch else float("nan")
    print(f"| {key[0]} | {key[1]} | {d:.1f} | {a:.1f} | {t:.1f} | {d / t:.2f} |")
PY

#!/usr/bin/env bash
# tools/bench/sitting.sh [ROUNDS] [BUILD_DIR] — issue 18's speed table in one sitting on this machine: the CPU
# model and flags first, then decode.sh (dew / llama.cpp / PyTorch decode), dew-bench roofline (char-small,
# 1 thread), run-lm.sh (char-small and gpt-mini training, char-small decode, against PyTorch, 1 and 2
# threads), run-dit.sh (the DiT step against PyTorch) and run-mixed.sh (issue 17: char-small in bf16-mixed against
# dew f32 and PyTorch's bf16 autocast), each with its own medians; last, the issues' bars as one table, met or not
# (sitting_bars.py over the whole output). Run it with nothing else
# on the machine: every ratio is read from runs that alternate within these minutes.
# DEW_SITTING_RT=1 runs every measurement (dew and its peers alike) at real-time priority (`chrt -f 10`) for a
# sitting on a shared host: a neighbour's job then waits instead of taking a core from a 2-thread step mid-barrier
# (session 21, under two other engineers' compiles: oneDNN's char-small products ran 0.34-1.0x faster at 2 threads
# than at 1 at normal priority, 1.89-2.09x at real-time priority). Off by default: real-time tasks are throttled
# here (~5 % of the wall time, in stalls of ~50 ms; tools/bench/isolated.sh), which a quiet host does not need.
# On CPUs without AVX512-BF16 run-dit.sh runs f32 only (DEW_DIT_PRECISIONS overrides): dew's `medium` stays f32
# there, and PyTorch 1.13's bf16 autocast has no native kernel (gpt-mini: 395 tokens/s against 6,900 in f32 on
# the AVX2 EPYC), so one autocast peer run takes minutes and says nothing about dew.
# DEW_CPU_MAX_ISA=avx2 stands the sitting in for an AVX2-only CPU on an AVX-512 one: dew's kernels on their avx2
# path, oneDNN capped alike (ONEDNN_MAX_CPU_ISA=AVX2, set here when unset), PyTorch on OpenBLAS's Haswell kernels
# and ATen AVX2 (torch_env.sh), the DiT in f32 only; point DEW_LLAMA_BENCH at a llama.cpp built without AVX-512
# (-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-2}
build=${2:-build}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
sitting() {
  echo "# cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), family $(lscpu | sed -n 's/^CPU family: *//p'), model $(lscpu | sed -n 's/^Model: *//p'), $(nproc) cores"
  echo "# flags: $(grep -o -w -E 'avx2|fma|avx512f|avx512_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "# dew: $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (modified)'), $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
  # the cpu backend's bf16 choice on this CPU (plugins/backends/cpu/bf16_dot.cpp: what medium and bf16-mixed multiply in)
  echo "# cpu backend: $("$build/bin/dew-run" plugins 2>/dev/null | grep -o 'bf16 products[^)]*)' | head -1)"
  rt=()
  if [ "${DEW_SITTING_RT:-0}" = 1 ] && chrt -f 10 true 2>/dev/null; then rt=(chrt -f 10); fi
  echo "# priority: ${rt[*]:-normal}"
  if [ "${DEW_CPU_MAX_ISA:-}" = avx2 ]; then
    export ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-AVX2}
    echo "# standing in for an AVX2 CPU: DEW_CPU_MAX_ISA=avx2 ONEDNN_MAX_CPU_ISA=$ONEDNN_MAX_CPU_ISA, llama.cpp ${DEW_LLAMA_BENCH:-(default build: set DEW_LLAMA_BENCH to an AVX2 one)}"
  fi
  if [ -z "${DEW_DIT_PRECISIONS:-}" ] && { ! grep -qw avx512_bf16 /proc/cpuinfo || [ "${DEW_CPU_MAX_ISA:-}" = avx2 ]; }; then
    export DEW_DIT_PRECISIONS="highest"
  fi
  echo "## decode"; "${rt[@]}" tools/bench/decode.sh "$rounds" "$build"
  echo "## roofline"; "${rt[@]}" env OMP_PROC_BIND=close OMP_PLACES=cores "$build/bin/dew-bench" roofline --config char-small --threads 1
  echo "## training (run-lm.sh)"; "${rt[@]}" tools/bench/run-lm.sh "$rounds" "$build"
  echo "## DiT (run-dit.sh)"; "${rt[@]}" tools/bench/run-dit.sh "$rounds" "$build"
  echo "## mixed precision, issue 17 (run-mixed.sh)"; "${rt[@]}" tools/bench/run-mixed.sh "$rounds" "$build"
  echo "# end: $(date -u '+%H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
}
sitting 2>&1 | tee "$log"
echo "## bars (tools/bench/sitting_bars.py: medians of the per-round ratios)"
python3 tools/bench/sitting_bars.py "$log"

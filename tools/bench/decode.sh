#!/usr/bin/env bash
# tools/bench/decode.sh [ROUNDS] [BUILD_DIR] — KV-cached decoding of the char-small shape (batch 1, greedy,
# 16-token prompt, 256 new tokens) side by side in one sitting: dew (f32, --weights bf16, --weights int8), llama.cpp
# (f32, bf16, q8_0 GGUFs of the same shape, random weights) and PyTorch (torch_generate.py, f32 and bf16, in
# tools/bench/torch_env.sh's set-up for this CPU), at 1 and 2 threads, alternating the systems within each
# round; then the medians per system.
# The machine may be shared: each run's line is followed by the load average, and dew's lines carry the
# CPU time per token (cpu_ms_per_token), which starvation does not inflate. Prints the CPU model first.
# DEW_BASELINE_BUILD=DIR adds DIR/bin/dew-bench (another build, e.g. main's) after each dew run: before /
# after in the same sitting (f32 and bf16: a build before int8 refuses it). DEW_DECODE_THREADS (default "1 2") picks
# the thread counts, DEW_DECODE_WEIGHTS (default "f32 bf16 int8") dew's weight storages.
#
# Needs (never inside this repository):
#   llama.cpp built per ../shared/peers/llamacpp/README.md, with the GGUFs made by its make_gguf.py:
#     DEW_LLAMA_BENCH (default /work/peers/llamacpp-src/build/bin/llama-bench), DEW_LLAMA_MODELS (default
#     /work/peers/models, holding char-small-{f32,bf16,q8_0}.gguf); skipped with a note when missing.
#   PyTorch: apt-get install -y python3-torch python3-numpy libopenblas0-openmp (run with /usr/bin/python3);
#     skipped with a note when missing.
# llama-bench's tg256 decodes 256 tokens from an empty cache (its default f16 K/V), dew and torch after a
# 16-token prompt (f32 K/V; torch bf16: bf16 K/V): the same weight bytes per token, slightly fewer cache bytes
# for llama.cpp. ms/token = 1000 / llama-bench's mean tokens per second.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tools/bench/pin.sh
rounds=${1:-3}
build=${2:-build}
peers=${DEW_PEERS:-../shared/peers}  # the checkout's sibling shared/ (set DEW_PEERS from a worktree elsewhere)
llama=${DEW_LLAMA_BENCH:-/work/peers/llamacpp-src/build/bin/llama-bench}
models=${DEW_LLAMA_MODELS:-/work/peers/models}
threads=${DEW_DECODE_THREADS:-1 2}
baseline=${DEW_BASELINE_BUILD:-}  # optional: another build's folder (e.g. main's), run as "dew-baseline" 
out=$(mktemp)
trap 'rm -f "$out"' EXIT
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "# cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
echo "# load at start: $(load)"
have_llama=1
[ -x "$llama" ] && [ -f "$models/char-small-f32.gguf" ] || { have_llama=0; echo "# llama.cpp: $llama or $models missing, skipped"; }
have_torch=1
/usr/bin/python3 -c 'import torch' 2>/dev/null && [ -f "$peers/torch_generate.py" ] ||
  { have_torch=0; echo "# PyTorch: not importable by /usr/bin/python3, or no $peers/torch_generate.py: skipped"; }

# One line per run into $out: system weights threads ms_per_token cpu_ms_per_token(or -) load1
record() { echo "$1 $2 $3 $4 $5 $(load | cut -d' ' -f1)" | tee -a "$out"; }
field() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(d.get('$1', '-'))"; }

for r in $(seq "$rounds"); do
  for t in $threads; do
    for w in ${DEW_DECODE_WEIGHTS:-f32 bf16 int8}; do
      j=$(pinned "$t" "$build/bin/dew-bench" generate --config char-small --threads "$t" \
        --weights "$w" --repeats 5)
      record dew "$w" "$t" "$(echo "$j" | field ms_per_token)" "$(echo "$j" | field cpu_ms_per_token)"
      if [ -n "$baseline" ] && [ "$w" != int8 ]; then
        j=$(pinned "$t" "$baseline/bin/dew-bench" generate --config char-small --threads "$t" \
          --weights "$w" --repeats 5)
        record dew-baseline "$w" "$t" "$(echo "$j" | field ms_per_token)" "$(echo "$j" | field cpu_ms_per_token)"
      fi
    done
    if [ "$have_llama" = 1 ]; then
      for w in f32 bf16 q8_0; do
        ts=$("$llama" -m "$models/char-small-$w.gguf" -t "$t" -p 0 -n 256 -r 3 -o jsonl 2>/dev/null |
          python3 -c "import json,sys; print([json.loads(l) for l in sys.stdin if l.strip()][-1]['avg_ts'])")
        record llama.cpp "$w" "$t" "$(python3 -c "print(round(1000 / $ts, 3))")" -
      done
    fi
    if [ "$have_torch" = 1 ]; then
      for w in fp32 bf16; do
        j=$(DEW_PEERS="$peers" tools/bench/torch_env.sh "$t" /usr/bin/python3 "$peers/torch_generate.py" --config char-small \
          --norm rms --mlp swiglu --threads "$t" --dtype "$w" 2>/dev/null | tail -n 1 || true)
        if [ -z "$j" ]; then  # e.g. its bf16 under ONEDNN_MAX_CPU_ISA=AVX2 (sitting.sh standing in for an AVX2 CPU)
          echo "# torch ${w/fp32/f32} at $t threads: no result (the peer failed), skipped"
          continue
        fi
        record torch "${w/fp32/f32}" "$t" "$(echo "$j" | field ms_per_token)" -
      done
    fi
  done
done

echo "# load at end: $(load)"
echo "# medians over $rounds rounds (ms per token; cpu: dew's CPU time per token)"
python3 - "$out" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    s, w, t, ms, cpu, _ = line.split()
    rows.setdefault((s, w, int(t)), []).append((float(ms), None if cpu == '-' else float(cpu)))
order = {'dew': 0, 'dew-baseline': 1, 'llama.cpp': 2, 'torch': 3}
print('| system | weights | threads | ms/token | cpu ms/token | runs |')
print('| --- | --- | --- | --- | --- | --- |')
for (s, w, t), v in sorted(rows.items(), key=lambda kv: (kv[0][2], order[kv[0][0]], kv[0][1])):
    ms = statistics.median(x for x, _ in v)
    cpus = [c for _, c in v if c is not None]
    cpu = '%.3f' % statistics.median(cpus) if cpus else '-'
    print('| %s | %s | %d | %.3f | %s | %d |' % (s, w, t, ms, cpu, len(v)))
PY

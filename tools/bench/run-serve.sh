#!/usr/bin/env bash
# tools/bench/run-serve.sh [ROUNDS] [BUILD_DIR] — the serving benchmark of docs/benchmarks.md: trains char-small
# for $STEPS updates (default 60, about a minute or two on 2 cores) into $RUN unless it already holds a
# checkpoint, serves it with `dew-run serve --slots 16` on a free port, and drives it with
# `dew-bench serve` at 1, 4 and 16 concurrent clients ($CLIENTS; 16 streamed requests of 64 tokens per level:
# the 1-client level is the 16 sequential requests), then stops the server with SIGTERM. ROUNDS (default 1)
# repeats that, alternating with the peers below, and ends with each system's medians (tokens/s).
#   THREADS: the server's --threads (default: the run's, every core).
#   DEW_BASELINE_BUILD=DIR: the same server from another build (DIR/bin/dew-run, e.g. main before a change),
#     run after dew's in every round as "dew-baseline".
#   DEW_BASELINE_BACKEND_OPTION=KEY=VALUE: the baseline is this build serving a copy of the run whose config.ini adds
#     [backend] KEY = VALUE (e.g. slot_attention=rows: the serving step's attention row by row, docs/benchmarks.md
#     session 48), as "dew-baseline". SERVE_ARGS: more `dew-run serve` arguments for both (e.g. --kv-cache bf16).
#   BASELINE_SERVE_ARGS: the baseline is this build serving the same run with these arguments added (e.g.
#     --no-prefix-cache), as "dew-baseline".
#   REQUESTS (16) and MAX_TOKENS (64): each level's requests and the tokens each generates; PROMPT_LEN (16) and
#     SHARED_PREFIX (0): each prompt's own bytes, after the bytes every prompt starts with (a system prompt).
#   LABEL (char-small): the JSON lines' config label, for a $RUN of another shape.
#   llama.cpp's llama-batched-bench (DEW_LLAMA_BATCHED, default /work/peers/llamacpp-src/build/bin/
#     llama-batched-bench; built like llama-bench per ../shared/peers/llamacpp/README.md, target
#     llama-batched-bench) on the same shape's f32 GGUF (DEW_LLAMA_MODELS, default /work/peers/models): 16-token
#     prompts, 64 generated tokens, as many parallel sequences as clients, the same threads; in-process (no HTTP,
#     greedy): generated tokens over its whole time (prompts and generation), as dew-bench serve counts them
#     (S_TG, generation alone, beside it): skipped with a note when missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-1}
build=${2:-build}
run=${RUN:-runs/char-small-serve}
steps=${STEPS:-60}
clients=${CLIENTS:-1,4,16}
baseline=${DEW_BASELINE_BUILD:-}
baseline_option=${DEW_BASELINE_BACKEND_OPTION:-}
serve_args=${SERVE_ARGS:-}
baseline_serve_args=${BASELINE_SERVE_ARGS:-}
prompt_len=${PROMPT_LEN:-16}
shared_prefix=${SHARED_PREFIX:-0}
label_config=${LABEL:-char-small}  # the JSON lines' "config" (another $RUN: say which)
requests=${REQUESTS:-16}
max_tokens=${MAX_TOKENS:-64}
llama=${DEW_LLAMA_BATCHED:-/work/peers/llamacpp-src/build/bin/llama-batched-bench}
models=${DEW_LLAMA_MODELS:-/work/peers/models}
threads=${THREADS:-}
if [ ! -f data/fortunes/meta.json ]; then
  "$build/bin/dew-tokenize" --input /usr/share/games/fortunes --out data/fortunes --tokenizer byte
fi
if ! ls "$run"/checkpoints/*.h5 >/dev/null 2>&1; then
  "$build/bin/dew-run" train --config configs/char-small.ini --run-dir "$run" --trainer.steps "$steps" \
    --trainer.checkpoint_every "$steps" --trainer.eval_every 0 --trainer.log_every 20
fi
echo "# cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; dew $(git rev-parse --short HEAD)"
have_llama=1
[ -x "$llama" ] && [ -f "$models/char-small-f32.gguf" ] || { have_llama=0; echo "# llama.cpp: $llama or $models missing, skipped"; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT

serve_levels() {  # serve_levels BUILD LABEL [RUN [ARGS]]: one server, every client level; one JSON line per level
  local b=$1 label=$2 served=${3:-$run} more=${4:-} out pid port
  out=$(mktemp)
  # shellcheck disable=SC2086
  "$b/bin/dew-run" serve --run-dir "$served" --port 0 --slots 16 ${threads:+--threads "$threads"} $serve_args $more \
    >"$out" 2>&1 &
  pid=$!
  for _ in $(seq 600); do grep -q "listening on" "$out" && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  port=$(sed -n 's/.*http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$out")
  echo "# $label: $(head -n 1 "$out"); load $(cut -d' ' -f1-3 /proc/loadavg)"
  { "$build/bin/dew-bench" serve --url "http://127.0.0.1:$port" --clients "$clients" --requests "$requests" \
    --max-tokens "$max_tokens" --prompt-len "$prompt_len" --shared-prefix "$shared_prefix" --config "$label_config" | sed "s/^{/{\"system\":\"$label\",/"; } ||
    echo "# $label: dew-bench serve failed (server log: $(tail -n 1 "$out"))"
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -f "$out"
}

llama_levels() {  # one JSON line per parallel-sequence count, from llama-batched-bench's table
  local t=${threads:-$(nproc)}
  "$llama" -m "$models/char-small-f32.gguf" -c 4096 -b 2048 -ub 512 -npp 16 -ntg 64 -npl "$clients" -t "$t" 2>/dev/null |
    awk -F'|' -v t="$t" '$2 ~ /^ *[0-9]+ *$/ { gsub(/ /, ""); printf "{\"system\":\"llama.cpp\",\"clients\":%s,\"threads\":%s,\"tokens_per_sec\":%.1f,\"decode_tokens_per_sec\":%s}\n", $4, t, $4 * $3 / $10, $9 }'
}

if [ -n "$baseline_option" ]; then  # a copy of the run with the backend option in its config.ini
  rm -rf "$run-baseline" && cp -r "$run" "$run-baseline"
  printf '\n[backend]\n%s = %s\n' "${baseline_option%%=*}" "${baseline_option#*=}" >> "$run-baseline/config.ini"
fi
for r in $(seq "$rounds"); do
  echo "## round $r"
  serve_levels "$build" dew | tee -a "$log"
  if [ -n "$baseline" ]; then serve_levels "$baseline" dew-baseline | tee -a "$log"; fi
  if [ -n "$baseline_option" ]; then serve_levels "$build" dew-baseline "$run-baseline" | tee -a "$log"; fi
  if [ -n "$baseline_serve_args" ]; then serve_levels "$build" dew-baseline "$run" "$baseline_serve_args" | tee -a "$log"; fi
  if [ "$have_llama" = 1 ]; then llama_levels | tee -a "$log"; fi
done
echo "## medians over $rounds round(s), tokens/s [TTFT p50 ms] (dew: served through HTTP, clients on this machine; llama.cpp: in-process)"
python3 - "$log" <<'EOF'
import json, statistics, sys
rows, ttft = {}, {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith('{'):
        d = json.loads(line)
        rows.setdefault((d['system'], int(d['clients'])), []).append(d['tokens_per_sec'])
        if 'ttft_ms_p50' in d:
            ttft.setdefault((d['system'], int(d['clients'])), []).append(d['ttft_ms_p50'])
for (system, c), v in sorted(rows.items()):
    t = ttft.get((system, c))
    t = f"  [TTFT {statistics.median(t):.1f} ms]" if t else ""
    print(f"{system:13s} clients {c:3d}: {statistics.median(v):8.1f}  ({', '.join(f'{x:.0f}' for x in v)}){t}")
EOF

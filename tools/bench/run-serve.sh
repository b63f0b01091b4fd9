#!/usr/bin/env bash
# tools/bench/run-serve.sh [BUILD_DIR] — the serving benchmark of docs/benchmarks.md: trains char-small
# for $STEPS updates (default 60, about a minute or two on 2 cores) into $RUN unless it already holds a
# checkpoint, serves it with `dew-run serve --slots 16` on a free port, and drives it with
# `dew-bench serve` at 1, 4 and 16 concurrent clients (16 streamed requests of 64 tokens per level:
# the 1-client level is the 16 sequential requests), then stops the server with SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
run=${RUN:-runs/char-small-serve}
steps=${STEPS:-60}
if [ ! -f data/fortunes/meta.json ]; then
  "$build/bin/dew-tokenize" --input /usr/share/games/fortunes --out data/fortunes --tokenizer byte
fi
if ! ls "$run"/checkpoints/*.h5 >/dev/null 2>&1; then
  "$build/bin/dew-run" train --config configs/char-small.ini --run-dir "$run" --trainer.steps "$steps" \
    --trainer.checkpoint_every "$steps" --trainer.eval_every 0 --trainer.log_every 20
fi
out=$(mktemp)
"$build/bin/dew-run" serve --run-dir "$run" --port 0 --slots 16 >"$out" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; rm -f "$out"' EXIT
for _ in $(seq 600); do grep -q "listening on" "$out" && break; sleep 0.1; done
port=$(sed -n 's/.*http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$out")
echo "# $(head -n 1 "$out")"
echo "# load $(cut -d' ' -f1-3 /proc/loadavg)"
"$build/bin/dew-bench" serve --url "http://127.0.0.1:$port" --clients "${CLIENTS:-1,4,16}" --requests 16 \
  --max-tokens 64 --prompt-len 16 --config char-small
echo "# load $(cut -d' ' -f1-3 /proc/loadavg)"
kill -TERM $pid
wait $pid
trap - EXIT
rm -f "$out"

#!/usr/bin/env bash
# tests/serve/openai_client.sh — trains a tiny byte-level run, serves it with `dew-run serve` and runs
# openai_client.cjs (the official `openai` npm package) against it: with the run's own template (dew's
# default; then its /metrics through metrics_check.py), then with --chat-template pointing at the Gemma fixture.
#   openai_client.sh DEW_RUN DEW_TOKENIZE WORK_DIR
# The package is installed into WORK_DIR/npm with `npm install --prefix` when it is not there yet (the
# npm registry must be reachable; CI installs it here, on a fresh machine).
set -euo pipefail
DEW_RUN=$1 DEW_TOKENIZE=$2 WORK=$3
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$WORK"
if [ ! -f "$WORK/npm/node_modules/openai/package.json" ]; then
  npm install --prefix "$WORK/npm" --no-audit --no-fund --loglevel=error openai@6 >/dev/null
fi
rm -rf "$WORK/data" "$WORK/run" "$WORK/text" "$WORK"/serve*.out "$WORK"/serve*.err  # no stale port from a previous run
mkdir -p "$WORK/text"
for i in $(seq 1 60); do echo "The quick brown fox jumps over the lazy dog. A riddle: what has keys but no locks?"; done \
  > "$WORK/text/corpus.txt"
"$DEW_TOKENIZE" --input "$WORK/text/corpus.txt" --out "$WORK/data" --tokenizer byte >/dev/null
cat > "$WORK/tiny.ini" <<INI
[run]
name = tiny-chat
backend = ref
seed = 1
[model]
plugin = causal_transformer
dim = 16
n_layers = 1
n_heads = 2
[objective]
plugin = lm
sample_tokens = 0
[data]
source = tokens
path = $WORK/data
seq_len = 32
batch_size = 4
[optim]
name = adamw
lr = 0.01
[trainer]
steps = 6
log_every = 3
INI
"$DEW_RUN" train --config "$WORK/tiny.ini" --run-dir "$WORK/run" >/dev/null
# The output files exist before the server starts: the background job opens them asynchronously, and a sed on a
# file not there yet fails the PORT pipeline (pipefail) and with it the script (set -e).
: > "$WORK/serve.out"; : > "$WORK/serve2.out"
"$DEW_RUN" serve --run-dir "$WORK/run" --port 0 --slots 4 --backend ref > "$WORK/serve.out" 2> "$WORK/serve.err" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
PORT=""
for _ in $(seq 1 300); do
  PORT=$(sed -n 's|.*http://127.0.0.1:\([0-9]*\).*|\1|p' "$WORK/serve.out" | head -1)
  [ -n "$PORT" ] && break
  kill -0 $SERVER 2>/dev/null || { cat "$WORK/serve.err"; exit 1; }
  sleep 0.1
done
[ -n "$PORT" ] || { echo "openai_client.sh: the server did not start"; cat "$WORK/serve.err"; exit 1; }
node "$HERE/openai_client.cjs" "$WORK/npm" "http://127.0.0.1:$PORT/v1" tiny-chat
# The server's /metrics after that traffic, read by Prometheus's Python client (Debian's python3-prometheus-client).
/usr/bin/python3 "$HERE/metrics_check.py" "http://127.0.0.1:$PORT"
kill $SERVER; wait $SERVER 2>/dev/null || true
# Again with another template (--chat-template): the Gemma fixture.
"$DEW_RUN" serve --run-dir "$WORK/run" --port 0 --slots 2 --backend ref \
  --chat-template "$HERE/../text/chat_template/gemma" > "$WORK/serve2.out" 2> "$WORK/serve2.err" &
SERVER=$!
PORT=""
for _ in $(seq 1 300); do
  PORT=$(sed -n 's|.*http://127.0.0.1:\([0-9]*\).*|\1|p' "$WORK/serve2.out" | head -1)
  [ -n "$PORT" ] && break
  kill -0 $SERVER 2>/dev/null || { cat "$WORK/serve2.err"; exit 1; }
  sleep 0.1
done
[ -n "$PORT" ] || { echo "openai_client.sh: the second server did not start"; cat "$WORK/serve2.err"; exit 1; }
node "$HERE/openai_client.cjs" "$WORK/npm" "http://127.0.0.1:$PORT/v1" tiny-chat gemma

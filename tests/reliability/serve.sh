#!/usr/bin/env bash
# tests/reliability/serve.sh BIN_DIR WORK_DIR [SOAK_SECONDS] — dew-run serve under hostile input (issue 20):
# a million nested arrays, temperature 1e999, a busy port, --port 99999, 200 clients trickling half requests
# while /health must answer, then a short soak (tools/soak.py): no crash, no 5xx, memory bounded.
set -uo pipefail
bin=$1 work=$2 soak=${3:-10}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
rm -rf "$work" && mkdir -p "$work"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

for i in $(seq 1 300); do echo "line $i of a small corpus for the reliability tests"; done > "$work/corpus.txt"
"$bin/dew-tokenize" --input "$work/corpus.txt" --out "$work/tokens" --tokenizer byte >/dev/null 2>&1 || fail "dew-tokenize"
cat > "$work/lm.ini" <<INI
[run]
name = lm-rel
seed = 1
backend = ref
[model]
plugin = causal_transformer
dim = 16
n_layers = 1
n_heads = 2
[objective]
plugin = lm
sample_tokens = 4
[data]
source = tokens
path = $work/tokens
seq_len = 16
batch_size = 4
[optim]
name = adamw
lr = 0.01
[trainer]
steps = 2
log_every = 1
INI
"$bin/dew-run" train --config "$work/lm.ini" --run-dir "$work/lm" >/dev/null 2>&1 || { echo "FAIL: training"; exit 1; }

"$bin/dew-run" serve --run-dir "$work/lm" --port 0 --backend ref >"$work/serve.out" 2>"$work/serve.err" &
pid=$!
for _ in $(seq 1 100); do grep -q "listening on" "$work/serve.out" 2>/dev/null && break; sleep 0.1; done
port=$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/serve.out" | head -1)
[ -n "$port" ] || { echo "FAIL: serve did not start"; cat "$work/serve.err"; kill $pid; exit 1; }
ok "serving on $port (pid $pid)"

$py - "$port" <<'PY' || fails=$((fails + 1))
import http.client, json, socket, sys, time
port = int(sys.argv[1])
def post(body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse(); return r.status, r.read().decode(errors="replace")
def health():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/health"); r = c.getresponse(); r.read(); return r.status
bad = 0
def check(name, cond, detail=""):
    global bad
    print(("ok: " if cond else "FAIL: ") + name + ("" if cond else " " + detail)); bad += 0 if cond else 1
st, body = post('{"prompt": ' + "[" * 1000000 + "]" * 1000000 + "}")
check("a million nested arrays -> 400 naming the depth", st == 400 and "nests deeper" in body, f"{st} {body[:200]}")
check("the server lives after it", health() == 200)
st, body = post('{"prompt": "x", "temperature": 1e999}')
check("temperature 1e999 -> 400", st == 400 and "1e999" in body, f"{st} {body[:200]}")
st, body = post('{"prompt": "' + "a" * (5 << 20) + '"}')
check("a 5 MiB prompt string -> 400", st == 400 and "longer than" in body, f"{st} {body[:200]}")
# 200 clients that send half a request and trickle a byte a second: /health and completions still answer
socks = []
for i in range(200):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
    socks.append(s)
worst = 0.0
for _ in range(5):
    for s in socks:
        try: s.sendall(b" ")
        except OSError: pass
    t0 = time.time(); h = health(); worst = max(worst, time.time() - t0)
    time.sleep(1)
st, body = post('{"prompt": "line 1", "max_tokens": 4}')
check("200 stalled clients: /health within 2 s (worst %.3f s) and a completion answers" % worst, worst < 2 and st == 200, f"{st}")
for s in socks: s.close()
sys.exit(bad)
PY

out=$("$bin/dew-run" serve --run-dir "$work/lm" --port "$port" --backend ref 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 2 ] && printf '%s' "$out" | grep -q "cannot listen" && ok "a second serve on the busy port is refused" || fail "second serve on $port: rc=$rc $out"
out=$("$bin/dew-run" serve --run-dir "$work/lm" --port 99999 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 2 ] && printf '%s' "$out" | grep -q "not a TCP port" && ok "--port 99999 refused" || fail "--port 99999: rc=$rc $out"

if $py "$here/../../tools/soak.py" --port "$port" --pid "$pid" --clients 64 --seconds "$soak" --max-tokens 4 > "$work/soak.json"; then
  ok "soak ($soak s, 64 clients): $(tr -d '\n ' < "$work/soak.json" | cut -c1-300)"
else
  fail "soak: $(cat "$work/soak.json")"
fi
kill -TERM $pid; wait $pid; rc=$?
[ "$rc" -eq 0 ] && ok "SIGTERM drains and exits 0" || fail "serve exited $rc after SIGTERM"
echo "$fails failure(s)"
exit $fails

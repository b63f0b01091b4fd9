#!/usr/bin/env bash
# tests/bench/sitting_bars.sh — tools/bench/sitting_bars.py on a made-up sitting log whose ratios are known:
# 1. per-round pairing (the i-th dew run with the i-th peer run of the same key) and the median of the ratios,
#    tokens/s as dew / peer, ms per token as peer / dew, 2-thread scaling as 2 threads / 1 thread;
# 2. sections: run-mixed.sh's char-small f32 runs (after its "## mixed precision" header) neither join run-lm.sh's
#    nor pair with its peers, and the activation-memory bar is met below its target;
# 3. met / not met against each target; a log without runs says so (exit 0); no argument: usage, exit 1;
# 4. a decode bar against PyTorch under its bar is "bounded here" when PyTorch's ms over the roofline section's f32
#    decode floor (roofline_ms) is under the bar too (run-lm's row: 1.5 / 1.0), and plainly not met otherwise.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bars=$here/../../tools/bench/sitting_bars.py
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 - "$work/log" <<'PY'
import json, sys
out = open(sys.argv[1], "w")
def j(**d): out.write(json.dumps(d) + "\n")
out.write("## decode\n")
for dew32, dew16, torch32, llama32 in ((1.0, 0.5, 2.5, 1.2), (1.1, 0.7, 2.0, 1.0), (0.9, 0.5, 1.9, 1.0)):
    out.write(f"dew f32 1 {dew32} {dew32} 1.0\ndew bf16 1 {dew16} {dew16} 1.0\nllama.cpp f32 1 {llama32} - 1.0\n")
    out.write(f"torch f32 1 {torch32} - 1.0\n")
out.write("## roofline\n")
j(bench="roofline_train", threads=1, fraction=0.91)
j(bench="roofline_decode", threads=1, weights="f32", fraction=0.79, roofline_ms=1.0)
out.write("## training (run-lm.sh)\n{not json\n")
for d1, t1, d2 in ((300, 200, 560), (260, 200, 520), (280, 210, 470)):
    j(bench="gpt_train", backend="cpu", config="char-small", threads=1, precision="f32", tokens_per_sec=d1,
      mem_activations_mb=100)
    j(bench="gpt_train", config="char-small", threads_requested=1, dtype="fp32", tokens_per_sec=t1)
    j(bench="gpt_train", backend="cpu", config="char-small", threads=2, precision="f32", tokens_per_sec=d2)
    j(bench="generate", backend="cpu", threads=1, weights="f32", ms_per_token=1.0)
    j(bench="generate", threads_requested=1, dtype="fp32", ms_per_token=1.5)
out.write("## DiT (run-dit.sh)\n")
# as run-dit.sh: the autocast peer runs after medium and again after bf16-mixed (each pairs with the run it follows)
for dew, medium, mixed, tf, ta, ta_mixed in ((140, 150, 180, 100, 90, 100), (150, 170, 190, 100, 90, 95)):
    j(bench="dit_train", backend="cpu", threads=1, matmul_precision="highest", images_per_sec=dew)
    j(bench="dit_train", threads_requested=1, dtype="fp32", images_per_sec=tf)
    j(bench="dit_train", backend="cpu", threads=1, matmul_precision="medium", images_per_sec=medium)
    j(bench="dit_train", threads_requested=1, dtype="bf16-autocast", images_per_sec=ta)
    j(bench="dit_train", backend="cpu", threads=1, matmul_precision="highest", precision="bf16-mixed",
      images_per_sec=mixed)
    j(bench="dit_train", threads_requested=1, dtype="bf16-autocast", images_per_sec=ta_mixed)
out.write("## mixed precision, issue 17 (run-mixed.sh)\n")
for f32, mixed, auto in ((100, 160, 120), (1000, 1600, 1300)):
    j(bench="gpt_train", backend="cpu", config="char-small", threads=1, precision="f32", tokens_per_sec=f32,
      mem_activations_mb=400)
    j(bench="gpt_train", backend="cpu", config="char-small", threads=1, precision="bf16-mixed", tokens_per_sec=mixed,
      mem_activations_mb=200)
    j(bench="gpt_train", config="char-small", threads_requested=1, dtype="bf16-autocast", tokens_per_sec=auto)
PY
/usr/bin/python3 "$bars" "$work/log" > "$work/table.md"
cat "$work/table.md"
/usr/bin/python3 - "$work/table.md" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 5 and cells[0] not in ("bar", "---"):
        rows[cells[0]] = cells[1:]
def check(bar, value, rounds, met):
    got = rows.pop(bar)
    assert got[1:] == [value, rounds, "met" if met is True else "**not met**" if met is False else met], (bar, got)
check("decode f32, PyTorch / dew ms, 1 thread (decode.sh)", "2.11", "2.50, 1.82, 2.11", True)
check("decode bf16 weights / dew f32 decode, 1 thread", "1.80", "2.00, 1.57, 1.80", True)
check("decode f32, llama.cpp / dew ms, 1 thread", "1.11", "1.20, 0.91, 1.11", True)
check("char-small decode f32, PyTorch / dew ms, 1 thread (run-lm)", "1.50", "1.50, 1.50, 1.50",
      "**not met** (bounded here: at most 1.50, the peer's time over the bandwidth floor)")
check("roofline fraction, char-small training step, 1 thread", "0.91", "0.91", True)
check("roofline fraction, char-small decode f32, 1 thread", "0.79", "0.79", False)
check("char-small train, dew / PyTorch, 1 thread", "1.33", "1.50, 1.30, 1.33", False)
check("char-small train, 2 threads / 1 thread (dew)", "1.87", "1.87, 2.00, 1.68", True)
check("DiT train f32, dew / PyTorch, 1 thread", "1.45", "1.40, 1.50", True)
check("DiT bf16 operands (medium) / PyTorch bf16 autocast, 1 thread", "1.78", "1.67, 1.89", False)
check("DiT bf16-mixed / PyTorch bf16 autocast, 1 thread (medium's counterpart: bf16 activations, as autocast's)", "1.90",
      "1.80, 2.00", True)
check("bf16-mixed / dew f32, char-small (issue 17)", "1.60", "1.60, 1.60", True)
check("bf16-mixed / PyTorch bf16 autocast, char-small (issue 17)", "1.28", "1.33, 1.23", False)
check("activation memory bf16-mixed / f32, char-small (issue 17)", "0.50", "0.50, 0.50", True)
assert not rows, rows  # no bar without its runs (gpt-mini, 2 threads' decode, DiT 2 threads)
PY
echo "# nothing here" > "$work/empty"
/usr/bin/python3 "$bars" "$work/empty" | grep -q "no runs" || { echo "FAIL: empty log"; exit 1; }
if /usr/bin/python3 "$bars" > /dev/null 2>&1; then echo "FAIL: no argument accepted"; exit 1; fi
echo "sitting_bars: ok"

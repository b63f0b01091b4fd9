#!/usr/bin/env bash
# tests/backends_cuda/lm_matches_cpu.sh BIN_DIR WORK_DIR [BACKEND [TRAIN_ARGS...]] — lm-d64.ini (bf16-mixed, head
# width 64, GQA, packed documents: the tensor-core attention forward and backward, the bf16 casts, norms, SwiGLU, cross-entropy
# and AdamW of a language-model step) trained 12 updates on BACKEND (default cuda; cuda-emulated for the plugin
# run on the CPU) and on cpu: every logged loss must agree within 2e-3 relative (bf16-mixed on both; measured
# 2e-4 on the emulation). TRAIN_ARGS go to both trainings (e.g. --run.precision f32 --data.seq_len 160: f32, with
# T * S large enough for the f32 attention by cuBLASLt products). Exits 77 (skipped) where BACKEND cannot run.
set -uo pipefail
bin=$1 work=$2 backend=${3:-cuda}
shift $(( $# < 3 ? $# : 3 ))
here=$(cd "$(dirname "$0")" && pwd)
if ! "$bin/dew-run" plugins 2>/dev/null | grep -E "^ +backend $backend " | grep -qF '[can run here]'; then
  echo "skipped: the $backend backend cannot run on this machine"; exit 77
fi
rm -rf "$work" && mkdir -p "$work"
# ~400 short documents of varied length separated by % lines (as tests/packing/resume_packed.sh)
awk 'BEGIN { srand(7); for (i = 0; i < 400; i++) { n = 1 + int(rand() * 6);
       for (j = 0; j < n; j++) { w = ""; for (k = 0; k < 1 + int(rand() * 8); k++) w = w sprintf("%c", 97 + int(rand() * 26)); printf "%s ", w }
       printf "\n%%\n" } }' > "$work/docs.txt"
"$bin/dew-tokenize" --input "$work/docs.txt" --out "$work/corpus" --separator % --val-fraction 0.1 > "$work/tok.log" ||
  { cat "$work/tok.log"; exit 1; }
for be in cpu "$backend"; do
  "$bin/dew-run" train --config "$here/lm-d64.ini" --data.path "$work/corpus" --run-dir "$work/$be" --backend "$be" "$@" \
    >"$work/$be.log" 2>&1 || { echo "FAIL: training on $be:"; cat "$work/$be.log"; exit 1; }
done
python3 - "$work/cpu/metrics.jsonl" "$work/$backend/metrics.jsonl" "$backend" <<'PY'
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "loss" in r and "step" in r: out[r["step"]] = r["loss"]
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
steps = sorted(set(a) & set(b))
if len(steps) < 12: sys.exit(f"FAIL: only {len(steps)} common logged steps")
worst = max(abs(a[s] - b[s]) / max(abs(a[s]), 1e-6) for s in steps)
name = sys.argv[3]
print(f"{len(steps)} steps, worst relative loss difference cpu vs {name}: {worst:.2e}; final cpu {a[steps[-1]]:.6f} {name} {b[steps[-1]]:.6f}")
sys.exit(0 if worst <= 2e-3 else 1)
PY

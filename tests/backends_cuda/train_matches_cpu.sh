#!/usr/bin/env bash
# tests/backends_cuda/train_matches_cpu.sh BIN_DIR CONFIG WORK_DIR [BACKEND] — the same short training run (the
# training tests' tiny classifier) on BACKEND (default cuda; cuda-emulated for the plugin run on the CPU) and on
# cpu: every logged loss must agree within 1e-3 relative (f32 everywhere; the cuda side at matmul_precision =
# highest). Exits 77 (skipped) where BACKEND cannot run.
set -uo pipefail
bin=$1 config=$2 work=$3 backend=${4:-cuda}
if ! "$bin/dew-run" plugins 2>/dev/null | grep -E "^ +backend $backend " | grep -qF '[can run here]'; then
  echo "skipped: the $backend backend cannot run on this machine"; exit 77
fi
rm -rf "$work" && mkdir -p "$work"
for be in cpu "$backend"; do
  "$bin/dew-run" train --config "$config" --run-dir "$work/$be" --backend "$be" --trainer.steps 30 \
    --trainer.checkpoint_every 100 --trainer.eval_every 100 >"$work/$be.log" 2>&1 || {
    echo "FAIL: training on $be:"; cat "$work/$be.log"; exit 1; }
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
if len(steps) < 10: sys.exit(f"FAIL: only {len(steps)} common logged steps")
worst = max(abs(a[s] - b[s]) / max(abs(a[s]), 1e-6) for s in steps)
name = sys.argv[3]
print(f"{len(steps)} steps, worst relative loss difference cpu vs {name}: {worst:.2e}; final cpu {a[steps[-1]]:.6f} {name} {b[steps[-1]]:.6f}")
sys.exit(0 if worst <= 1e-3 else 1)
PY

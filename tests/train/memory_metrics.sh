#!/usr/bin/env bash
# tests/train/memory_metrics.sh BIN_DIR WORK_DIR — memory accounting in metrics.jsonl, on ref and cpu.
# tiny.ini (an mlp, AdamW, EMA): the first logged line holds mem_params_mb = 4 bytes x the parameter count
# the log prints, mem_grads_mb the same (every parameter gets an f32 gradient), mem_optim_mb three times it
# (AdamW's m and v and the EMA copy); no later line repeats them; every step line has mem_peak_mb, never
# decreasing and at least the three states together.
set -euo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
for backend in ref cpu; do
  "$bin/dew-run" train --config "$here/tiny.ini" --backend $backend --run-dir "$work/$backend" --trainer.steps 12 \
    --trainer.log_every 3 > "$work/$backend.log" 2>&1 || { cat "$work/$backend.log"; exit 1; }
  n=$(sed -nE 's/.*training ([0-9]+) parameters.*/\1/p' "$work/$backend/log.txt" | head -1)
  test -n "$n" || { echo "no parameter count in the log"; exit 1; }
  /usr/bin/python3 - "$work/$backend/metrics.jsonl" "$n" "$backend" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
n, backend = int(sys.argv[2]), sys.argv[3]
steps = [l for l in lines if "loss" in l]
assert len(steps) == 4, f"{backend}: expected 4 logged steps, got {len(steps)}"
first = steps[0]
mib = 1024.0 * 1024.0
want = {"mem_params_mb": 4 * n / mib, "mem_grads_mb": 4 * n / mib, "mem_optim_mb": 3 * 4 * n / mib}
for k, v in want.items():
    assert k in first, f"{backend}: the first line lacks {k}: {first}"
    assert abs(first[k] - v) <= 1e-12 * v, f"{backend}: {k} = {first[k]}, expected {v} ({n} parameters)"
for l in lines[1:]:
    for k in want:
        assert k not in l, f"{backend}: {k} repeated at step {l['step']}"
state = sum(want.values())
peaks = [l["mem_peak_mb"] for l in steps]
assert all(p >= state for p in peaks), f"{backend}: a peak below the training state {state}: {peaks}"
assert peaks == sorted(peaks), f"{backend}: the high-water mark went down: {peaks}"
print(f"{backend}: {n} parameters, state {state:.4f} MiB, peaks {peaks}")
PY
done
echo "memory accounting: the three states once, the peak on every step"

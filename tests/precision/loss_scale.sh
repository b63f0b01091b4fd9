#!/usr/bin/env bash
# tests/precision/loss_scale.sh BIN_DIR BACKEND WORK_DIR — f16-mixed's dynamic loss scale through dew-run.
# The tiny classifier (tests/train/tiny.ini) in f16-mixed with an initial scale of 2^30: its scaled
# gradients overflow f16 (65504), so the first attempts are rejected (counted in "skipped" and
# "overflows", the weights untouched), each halving the scale, until the gradients fit; then every
# 3 finite updates (loss_scale_growth_interval) double it again. The run still applies its 40 updates.
set -euo pipefail
bin=$1 backend=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
"$bin/dew-run" train --config "$here/../train/tiny.ini" --backend "$backend" --run-dir "$work/run" \
  --run.precision f16-mixed --run.loss_scale_init 1073741824 --run.loss_scale_growth_interval 3 \
  > "$work/log" 2>&1 || { cat "$work/log"; exit 1; }
/usr/bin/python3 - "$work/run/metrics.jsonl" "$work/log" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"loss_scale"' in l]
assert len(lines) == 40, f"expected 40 update lines, got {len(lines)}"
scales = [l["loss_scale"] for l in lines]
over = [l["overflows"] for l in lines]
skipped = [l["skipped"] for l in lines]
first = scales[0]
assert over[0] >= 1 and skipped[0] == over[0], f"the first update should follow rejected overflows: {over[0]}, {skipped[0]}"
assert first * 2**over[0] == 2**30, f"each overflow halves the scale: {first} after {over[0]} overflows"
# After the first good update the scale doubles every 3 finite updates unless an overflow intervenes.
grew = any(b == 2 * a for a, b in zip(scales, scales[1:]))
assert grew, f"the scale never grew back: {scales}"
for a, b, oa, ob in zip(scales, scales[1:], over, over[1:]):
    if ob == oa:
        assert b in (a, 2 * a), f"without an overflow the scale only grows: {a} -> {b}"
    else:  # between two logged updates: at most one growth, and a halving per overflow
        assert b in (a * 0.5 ** (ob - oa), 2 * a * 0.5 ** (ob - oa)), f"an overflow halves it: {a} -> {b}"
log = open(sys.argv[2]).read()
assert "f16 gradients overflowed at loss scale" in log, "the trainer did not report the overflow"
print(f"loss scale: {over[-1]} overflows rejected, scale {first:g} at the first update, {scales[-1]:g} at the end")
PY

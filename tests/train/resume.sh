#!/usr/bin/env bash
# tests/train/resume.sh BIN_DIR BACKEND WORK_DIR [OVERRIDE...] — resume is bit-exact.
# Run A trains 40 updates straight. Run B stops at 20 (trainer.stop_at: same schedule), then a new
# process resumes it (--resume alone: on to trainer.steps = 40). Their per-step losses in metrics.jsonl and their final parameters and EMA
# weights (exported to safetensors) must be identical, byte for byte. OVERRIDEs (e.g.
# --run.matmul_precision medium) go to the first two runs; the resume reads them from B's config.ini.
# DEW_RESUME_CONFIG names another config (default tiny.ini: 40 steps, checkpoints every 10, an EMA).
set -euo pipefail
bin=$1 backend=$2 work=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
config=${DEW_RESUME_CONFIG:-$here/tiny.ini}
rm -rf "$work" && mkdir -p "$work"
run() { "$bin/dew-run" "$@" > "$work/last.log" 2>&1 || { cat "$work/last.log"; exit 1; }; }
run train --config "$config" --backend "$backend" --run-dir "$work/A" "$@"
run train --config "$config" --backend "$backend" --run-dir "$work/B" --trainer.stop_at 20 "$@"
test -f "$work/B/checkpoints/step-00000020.h5" || { echo "no checkpoint at the pause"; exit 1; }
# No stop_at here: the pause point is not kept in B's config.ini, so the resume goes on to trainer.steps (40).
grep -q "stop_at" "$work/B/config.ini" && { echo "config.ini keeps trainer.stop_at (a resume would stop at once)"; exit 1; }
run train --run-dir "$work/B" --resume --backend "$backend"
losses() { grep '"loss"' "$1/metrics.jsonl" | sed -E 's/.*"step":([0-9]+),"loss":([^,]+),.*/\1 \2/'; }
losses "$work/A" > "$work/A.losses"
losses "$work/B" > "$work/B.losses"
[ "$(wc -l < "$work/A.losses")" -eq 40 ] || { echo "expected 40 logged steps in A"; exit 1; }
diff "$work/A.losses" "$work/B.losses" || { echo "losses differ after resume"; exit 1; }
for ema in "" "--no-ema"; do
  run export --run-dir "$work/A" --out "$work/A.export" $ema --backend "$backend"
  run export --run-dir "$work/B" --out "$work/B.export" $ema --backend "$backend"
  cmp "$work/A.export/model.safetensors" "$work/B.export/model.safetensors" || { echo "parameters differ ($ema)"; exit 1; }
done
echo "resume on $backend $* is bit-exact: 40 losses and the final weights match"

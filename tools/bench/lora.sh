#!/usr/bin/env bash
# tools/bench/lora.sh — LoRA against full fine-tuning on lm-fortunes (dim 192, 4 layers, seq 128, batch 32), 1 thread, 12 updates:
# median step_time_ms of updates 3..12, and the memory lines (mem_params/grads/optim_mb, mem_peak_mb).
set -u
work=$(mktemp -d)
cd "$(dirname "$0")/../.."
common=(train --config configs/lm-fortunes.ini --trainer.steps 12 --trainer.log_every 1 --trainer.checkpoint_every 0
        --objective.sample_tokens 0 --objective.eval_batches 1 --run.threads 1)
lscpu | grep "Model name"
for round in 1 2; do
  for mode in full lora; do
    extra=(); [ $mode = lora ] && extra=(--lora.rank 16 --lora.alpha 32)
    rm -rf "$work"/l-$mode
    OMP_NUM_THREADS=1 build/bin/dew-run "${common[@]}" --run-dir "$work"/l-$mode "${extra[@]}" > "$work"/l-$mode.log 2>&1 || { cat "$work"/l-$mode.log; exit 1; }
    /usr/bin/python3 - "$work/l-$mode/metrics.jsonl" $mode $round <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l and '"val/' not in l]
st = statistics.median(r["step_time_ms"] for r in rows[2:])
first = rows[0]
print(f"round {sys.argv[3]} {sys.argv[2]:4s}: step {st:.1f} ms  params {first.get('mem_params_mb')} MB  grads {first.get('mem_grads_mb')} MB  optim {first.get('mem_optim_mb')} MB  peak {rows[-1].get('mem_peak_mb')} MB")
PY
  done
done
grep "fine-tuning" "$work"/l-lora.log
rm -rf "$work"

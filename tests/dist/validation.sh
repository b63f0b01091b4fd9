#!/usr/bin/env bash
# tests/dist/validation.sh BIN_DIR WORK_DIR — sharded validation through the trainer: 2 ranks x batch B
# validate like 1 process x 2B. Each rank scores its share of the split and the trainer adds the ranks'
# sums (Objective::shards_validation), so every validated step's val/* metrics agree within 1e-5 (the
# weights themselves agree to ~1e-7) and the LM's val/tokens exactly (a rank scoring the whole split
# would double it, sums left unadded would halve it). The classifier (tiny.ini) and a byte-level LM with a
# validation sample (written once per validation, by rank 0); the log says validation is sharded, and for
# JEPA (its probes are no sum over records) that every rank scores the whole split.
set -euo pipefail
bin=$1 work=$2
source "$(dirname "$0")/common.sh"
rm -rf "$work" && mkdir -p "$work"
sharded="validation: each rank scores its share of the split"
classify=(train --config "$here/tiny.ini" --backend cpu --trainer.steps 4 --trainer.eval_every 2
          --trainer.checkpoint_every 0)
run "$work/classify-one.log" "${classify[@]}" --run-dir "$work/classify-one" --data.batch_size 16
run_mpi 2 "$work/classify-two.log" "${classify[@]}" --run-dir "$work/classify-two" --data.batch_size 8 --run.dist mpi
grep -q "$sharded" "$work/classify-two.log" || { echo "classify: validation not sharded?"; cat "$work/classify-two.log"; exit 1; }
compare val "$work/classify-two/metrics.jsonl" "$work/classify-one/metrics.jsonl" 1e-5

"$bin/dew-tokenize" --input /usr/share/games/fortunes/magic --out "$work/magic" > "$work/tok.log" 2>&1 ||
  { cat "$work/tok.log"; exit 1; }
lm=(train --config "$here/../report/lm-tiny.ini" --data.path "$work/magic" --trainer.steps 6 --trainer.eval_every 3
    --trainer.checkpoint_every 0)
run "$work/lm-one.log" "${lm[@]}" --run-dir "$work/lm-one" --data.batch_size 8
run_mpi 2 "$work/lm-two.log" "${lm[@]}" --run-dir "$work/lm-two" --data.batch_size 4 --run.dist mpi
grep -q "$sharded" "$work/lm-two.log" || { echo "lm: validation not sharded?"; cat "$work/lm-two.log"; exit 1; }
compare val "$work/lm-two/metrics.jsonl" "$work/lm-one/metrics.jsonl" 1e-5
[ "$(ls "$work/lm-two/samples" | grep -c '^sample-step-')" -eq 2 ] || { echo "lm: expected 2 samples"; ls "$work/lm-two/samples"; exit 1; }

run_mpi 2 "$work/jepa.log" train --config "$here/../jepa/tiny.ini" --trainer.steps 2 --trainer.checkpoint_every 0 \
  --data.batch_size 4 --run.dist mpi --run-dir "$work/jepa"
grep -q "validation: every rank scores the whole split" "$work/jepa.log" || { echo "jepa: no whole-split line"; cat "$work/jepa.log"; exit 1; }
echo "sharded validation: 2 ranks x B = 1 process x 2B for classify and lm"

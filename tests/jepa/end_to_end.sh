#!/usr/bin/env bash
# tests/jepa/end_to_end.sh BIN_DIR WORK_DIR — I-JEPA through dew-run on the synthetic source.
# 1. Resume is bit-exact: run A trains 20 updates straight; run B pauses at 10 and a new process resumes
#    it. Their losses and health metrics, and the exported encoders (the target encoder, which lives only
#    in the checkpoints' state/), must be identical byte for byte; a run whose target were not restored
#    would diverge after the pause.
# 2. The checkpoint holds the target encoder under state/objective.target_encoder.*.
# 3. dew-run eval prints one JSON with the probes of the trained encoder, a fresh one and raw pixels.
# 4. export writes the encoder alone (vit_encoder names, no predictor).
set -euo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
run() { "$bin/dew-run" "$@" > "$work/last.log" 2>&1 || { cat "$work/last.log"; exit 1; }; }
run train --config "$here/tiny.ini" --run-dir "$work/A"
run train --config "$here/tiny.ini" --run-dir "$work/B" --trainer.stop_at 10
run train --run-dir "$work/B" --resume --trainer.stop_at 20
metrics() { grep '"loss"' "$1/metrics.jsonl" | grep -v '"val/' | sed -E 's/"step_time_ms":[^,]*,"samples_per_sec":[^,]*,//; s/"mfu":[^,]*,//; s/"rss_mb":[^,}]*,?//; s/"mem_[a-z]*_mb":[^,}]*,?//g'; }
metrics "$work/A" > "$work/A.m"
metrics "$work/B" > "$work/B.m"
[ "$(wc -l < "$work/A.m")" -eq 20 ] || { echo "expected 20 logged steps"; exit 1; }
grep -q '"repr_std"' "$work/A.m" || { echo "no health metrics in metrics.jsonl"; exit 1; }
diff "$work/A.m" "$work/B.m" || { echo "metrics differ after resume"; exit 1; }
grep -q '"val/knn_accuracy"' "$work/A/metrics.jsonl" || { echo "no probe at validation"; exit 1; }
if command -v h5ls > /dev/null; then
  h5ls "$work/A/checkpoints/step-00000020.h5/state" | grep -q 'objective.target_encoder.patch_embed.proj.weight' ||
    { echo "no target encoder in the checkpoint"; exit 1; }
fi
run export --run-dir "$work/A" --out "$work/A.export"
run export --run-dir "$work/B" --out "$work/B.export"
cmp "$work/A.export/model.safetensors" "$work/B.export/model.safetensors" || { echo "encoders differ"; exit 1; }
grep -a -q '"patch_embed.proj.weight"' "$work/A.export/model.safetensors" || { echo "export lacks the encoder"; exit 1; }
if grep -a -q 'predictor' "$work/A.export/model.safetensors"; then echo "export holds the predictor"; exit 1; fi
grep -q '"model_type": "vit_encoder"' "$work/A.export/config.json" || { echo "config.json is not the encoder's"; exit 1; }
"$bin/dew-run" eval --run-dir "$work/A" --probe-train-samples 100 --probe-test-samples 50 --knn-k 5 > "$work/eval.json"
for k in trained.knn_accuracy trained.linear_accuracy random.knn_accuracy random.linear_accuracy \
         pixels.knn_accuracy pixels.linear_accuracy; do
  grep -q "\"$k\"" "$work/eval.json" || { echo "eval JSON lacks $k"; cat "$work/eval.json"; exit 1; }
done
# An unknown eval key is refused (exit 2).
set +e
"$bin/dew-run" eval --run-dir "$work/A" --knn-kk 5 > /dev/null 2>&1
[ $? -eq 2 ] || { echo "an unknown eval key was not refused"; exit 1; }
set -e
echo "jepa end to end: resume bit-exact, target encoder checkpointed, eval JSON and encoder export"

#!/usr/bin/env bash
# tests/grpo/grpo_cli.sh BIN_DIR WORK_DIR — GRPO through dew-run as a user drives it: a config with two weighted
# reward functions, one of them reading its option from [reward] (scoring about a quarter of the completions); a
# run paused at 2 updates and resumed to 4 logs the straight run's losses and rewards bit for bit; metrics.jsonl has
# each reward's mean and the validation reward; the run samples and evaluates as an lm run; a missing reward option,
# an unknown [reward] key and a bad prompt line are each refused in one line with exit status 2; with LoRA adapters
# the KL penalty's reference is the adapters-off base, not a checkpointed copy; `train --help` shows the rewards'
# [reward] options; a bf16-mixed run trains (its rollout decodes under autocast).
set -euo pipefail
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
run() { "$bin/dew-run" "$@" > "$work/last.log" 2>&1 || { cat "$work/last.log"; exit 1; }; }
refused() {  # refused MESSAGE ARGS...: exit status 2 and MESSAGE in the output
  local want=$1 rc
  shift
  set +e
  "$bin/dew-run" "$@" > "$work/refused.log" 2>&1
  rc=$?
  set -e
  [ "$rc" -eq 2 ] && grep -qF -- "$want" "$work/refused.log" || { cat "$work/refused.log"; echo "rc $rc, wanted: $want"; exit 1; }
}
printf 'placeholder\n' > "$work/corpus.txt"
"$bin/dew-tokenize" --input "$work/corpus.txt" --out "$work/bytes" > "$work/tok.log"
for i in $(seq 0 23); do printf '{"prompt": "%d+%d=", "answer": "%d"}\n' $((i % 7)) $((i % 5)) $((i % 7 + i % 5)); done > "$work/prompts.jsonl"
here=$(cd "$(dirname "$0")" && pwd)
common=(--config "$here/tiny.ini" --data.path "$work/prompts.jsonl" --data.tokenizer "$work/bytes"
        --objective.rewards "format, contains" --objective.reward_weights "1, 0.5" --objective.beta 0.02
        --reward.format_pattern "[a-m]")
run train "${common[@]}" --help
grep -q "^\[reward\] options of reward 'format' (plugin 'grpo'" "$work/last.log" &&
  grep -q "^  --reward.format_pattern  " "$work/last.log" || { cat "$work/last.log"; echo "help lacks [reward]"; exit 1; }
run train "${common[@]}" --run-dir "$work/A"
run train "${common[@]}" --run-dir "$work/B" --trainer.stop_at 2
run train --run-dir "$work/B" --resume
lines() { grep -o '"step":[0-9]*,"loss":[^,}]*' "$1/metrics.jsonl"; }
rewards() { grep -o '"reward_contains":[^,}]*\|"reward_format":[^,}]*\|"kl":[^,}]*' "$1/metrics.jsonl"; }
[ "$(lines "$work/A" | wc -l)" -eq 4 ] || { cat "$work/A/metrics.jsonl"; echo "expected 4 logged steps"; exit 1; }
diff <(lines "$work/A") <(lines "$work/B") || { echo "losses differ after resume"; exit 1; }
diff <(rewards "$work/A") <(rewards "$work/B") || { echo "rewards differ after resume"; exit 1; }
[ "$(rewards "$work/A" | grep -c reward_format)" -eq 4 ] || { echo "no reward_format per step"; exit 1; }
# format_pattern [a-m]: an untrained byte model's 6-token completion holds one of those 13 bytes about a quarter of
# the time, so the rewards vary and the steps have gradients.
grep -o '"reward_format":[^,}]*' "$work/A/metrics.jsonl" | awk -F: '$2 > 0 { n++ } END { exit !(n >= 2) }' ||
  { echo "reward_format was 0 on most steps"; exit 1; }
grep -q '"val/reward":' "$work/A/metrics.jsonl" || { echo "no val/reward"; exit 1; }
out=$("$bin/dew-run" sample --run-dir "$work/A" --prompt "3+4=" --max_new_tokens 4 --temperature 0 2>/dev/null)
[ -n "$out" ] || { echo "sample printed nothing"; exit 1; }
"$bin/dew-run" eval --run-dir "$work/A" > "$work/eval.json" 2> "$work/eval.log" || { cat "$work/eval.log"; exit 1; }
grep -q '"reward_format"' "$work/eval.json" || { cat "$work/eval.json"; echo "eval has no reward_format"; exit 1; }
# LoRA adapters with beta > 0: the reference is the policy's adapters-off base — no copy in the checkpoint — and the
# KL to it grows from 0 as the adapters train.
run train "${common[@]}" --run-dir "$work/L" --lora.rank 4 --lora.alpha 8
grep -o '"kl":[^,}]*' "$work/L/metrics.jsonl" | tail -1 | awk -F: '{ exit !($2 > 0) }' ||
  { grep -o '"kl":[^,}]*' "$work/L/metrics.jsonl"; echo "no KL to the adapters-off base"; exit 1; }
if command -v h5dump > /dev/null; then
  ckpt=$(ls "$work/L/checkpoints/"*.h5 | tail -1)
  h5dump -n "$ckpt" | grep -q "objective.reference_ready" || { echo "no reference flag in $ckpt"; exit 1; }
  ! h5dump -n "$ckpt" | grep -q "objective.reference\.model" || { echo "a LoRA run checkpointed a reference copy"; exit 1; }
  h5dump -n "$work/A/checkpoints/step-00000004.h5" | grep -q "objective.reference.model.embed_tokens.weight" ||
    { echo "the full run's reference copy is not in its checkpoint"; exit 1; }
fi
# bf16-mixed: the rollout decodes under autocast (q lowered, the slot cache f32: attention_slots' per-row form)
run train "${common[@]}" --run-dir "$work/M" --run.precision bf16-mixed
grep -q '"reward"' "$work/M/metrics.jsonl" || { cat "$work/M/metrics.jsonl"; echo "no rewards under bf16-mixed"; exit 1; }
refused "needs [reward] format_pattern" train "${common[@]}" --run-dir "$work/C" --reward.format_pattern ""
refused "reward.bogus" train "${common[@]}" --run-dir "$work/D" --reward.bogus 1
printf '{"prompt": 7}\n' >> "$work/prompts.jsonl"
refused "prompts.jsonl:25: a line is" train "${common[@]}" --run-dir "$work/E"
echo "grpo through dew-run: resume bit-exact, rewards and validation logged, sample and eval run, refusals in one line"

#!/usr/bin/env bash
# tests/grpo/dist.sh BIN_DIR WORK_DIR — data-parallel GRPO equals one process: 6 updates of 1 rank x 4 prompts
# against 2 ranks x 2 prompts and against 2 ranks x 1 prompt x grad_accum 2 (loss_type grpo, whose per-completion
# means average over micro-batches and ranks to the one-process mean; beta > 0, so the reference copy runs too).
# Each completion draws from the stream of its record's global position, so every rank draws what the one process
# drew: the per-step losses (1e-5) and the validation rewards (sharded over the ranks; 1e-9) agree, and the final
# weights within 1e-4 of their largest value (the ranks' gradients are partial sums, and AdamW divides those rounding
# differences by the small second moments of the few weights a 16-wide model's policy gradient barely moves).
# And loss_type bnpo under [trainer] loss_weighting = token (TRL's dapo): 2 ranks x 1 prompt x grad_accum 2 = 1 x 4
# (the completions here mostly run to the length limit, so micro-batches count alike: this checks that GRPO runs
# token-weighted across ranks and micro-batches; that the weighting weighs is tests/dist/token_weighting.sh's).
set -euo pipefail
bin=$1 work=$2
source "$(dirname "$0")/../dist/common.sh"
rm -rf "$work" && mkdir -p "$work"
printf 'placeholder\n' > "$work/corpus.txt"
"$bin/dew-tokenize" --input "$work/corpus.txt" --out "$work/bytes" > "$work/tok.log"
"$PYTHON" -c '
import json
ascii = "abcdefgh"
for i in range(40):
    print(json.dumps({"prompt": "%d>" % i, "answer": ascii[i % 8]}))' > "$work/prompts.jsonl"
common=(train --config "$here/../grpo/tiny.ini" --data.path "$work/prompts.jsonl" --data.tokenizer "$work/bytes"
        --run.seed 4 --objective.rewards format --reward.format_pattern "[a-z]" --objective.loss_type grpo
        --objective.max_completion_length 5 --objective.beta 0.05 --data.prompt_len 4 --data.val_count 8
        --trainer.steps 6 --trainer.eval_every 6 --trainer.checkpoint_every 0)
run "$work/one.log" "${common[@]}" --run-dir "$work/one" --data.batch_size 4
run_mpi 2 "$work/two.log" "${common[@]}" --run-dir "$work/two" --data.batch_size 2 --run.dist mpi
run_mpi 2 "$work/accum.log" "${common[@]}" --run-dir "$work/accum" --data.batch_size 1 --trainer.grad_accum 2 \
  --run.dist mpi
grep -o '"reward":[^,}]*' "$work/one/metrics.jsonl" | awk -F: '$2 > 0 { n++ } END { exit !(n >= 3) }' ||
  { echo "the rewards were 0 on most steps: the comparison would see no gradient"; exit 1; }
for r in two accum; do
  compare losses "$work/$r/metrics.jsonl" "$work/one/metrics.jsonl" 1e-5
  compare val "$work/$r/metrics.jsonl" "$work/one/metrics.jsonl" 1e-9
  run "$work/export.log" export --run-dir "$work/$r" --out "$work/$r.export"
  run "$work/export.log" export --run-dir "$work/one" --out "$work/one.export"
  compare weights "$work/$r.export/model.safetensors" "$work/one.export/model.safetensors" 1e-4
done
# loss_type bnpo with [trainer] loss_weighting = token (TRL's dapo: one token mean over the update's completions on
# every rank and micro-batch): 2 ranks x 1 prompt x grad_accum 2 equal one process of 4 prompts
bnpo=(--objective.loss_type bnpo --trainer.loss_weighting token)
run "$work/bnpo-one.log" "${common[@]}" "${bnpo[@]}" --run-dir "$work/bnpo-one" --data.batch_size 4
run_mpi 2 "$work/bnpo-accum.log" "${common[@]}" "${bnpo[@]}" --run-dir "$work/bnpo-accum" --data.batch_size 1 \
  --trainer.grad_accum 2 --run.dist mpi
compare losses "$work/bnpo-accum/metrics.jsonl" "$work/bnpo-one/metrics.jsonl" 1e-5
run "$work/export.log" export --run-dir "$work/bnpo-accum" --out "$work/bnpo-accum.export"
run "$work/export.log" export --run-dir "$work/bnpo-one" --out "$work/bnpo-one.export"
compare weights "$work/bnpo-accum.export/model.safetensors" "$work/bnpo-one.export/model.safetensors" 1e-4
echo "grpo data parallel: 2 x 2 and 2 x 1 x accum 2 match 1 x 4 (grpo; bnpo token-weighted)"

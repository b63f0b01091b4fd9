#!/usr/bin/env bash
# tests/dist/token_weighting.sh BIN_DIR BACKEND WORK_DIR — [trainer] loss_weighting = token: every counted token of
# an update weighs alike, however the update's rows are split into micro-batches and ranks. Chat SFT (the loss on
# each row's assistant reply only: rows count different numbers of tokens) of a small language model, 12 updates as
# 1 x 8 rows, equals 1 x 4 rows x grad_accum 2, 2 ranks x 4 rows and 2 ranks x 2 rows x grad_accum 2: per-step
# losses, gradient norms and final weights within 1e-5 relative (SGD: AdamW's first steps turn a gradient element
# near its eps into +-lr, so float noise in tiny gradients would show in the weights). The default micro_batch
# weighting (each micro-batch's own token mean counts alike) does not: its losses at grad_accum 2 differ from the
# 8-row run's (what the option is for). A token-weighted run resumed midway equals the straight run bit for bit.
# Refusals: an unknown weighting; an objective whose loss is no token mean (a classifier), at the start.
set -euo pipefail
bin=$1 backend=$2 work=$3
source "$(dirname "$0")/common.sh"
rm -rf "$work" && mkdir -p "$work"
# conversations whose assistant replies differ in length (rows of 160 bytes: the loss counts each row's reply only)
/usr/bin/python3 - "$work" <<'PY'
import json, random, sys
random.seed(3)
words = lambda n: " ".join("".join(random.choice("abcdefghij") for _ in range(random.randint(1, 6))) for _ in range(n))
with open(sys.argv[1] + "/chat.jsonl", "w") as f:
    for i in range(200):
        f.write(json.dumps({"messages": [{"role": "user", "content": words(random.randint(1, 4))},
                                         {"role": "assistant", "content": words(random.randint(1, 9))}]}) + "\n")
with open(sys.argv[1] + "/text.txt", "w") as f:
    f.write(words(400))
PY
"$bin/dew-tokenize" --input "$work/text.txt" --out "$work/tok" --tokenizer byte > "$work/tok.log"
common=(train --config "$here/../packing/lm-packed.ini" --backend "$backend" --data.source chat_jsonl
        --data.path "$work/chat.jsonl" --data.tokenizer "$work/tok" --data.pack false --data.seq_len 160
        --data.truncate true --data.val_count 8
        --trainer.steps 12 --trainer.eval_every 0 --trainer.checkpoint_every 0 --optim.name sgd --optim.lr 0.3)
tok=(--trainer.loss_weighting token)
run "$work/one.log" "${common[@]}" "${tok[@]}" --run-dir "$work/one" --data.batch_size 8
run "$work/accum.log" "${common[@]}" "${tok[@]}" --run-dir "$work/accum" --data.batch_size 4 --trainer.grad_accum 2
run_mpi 2 "$work/two.log" "${common[@]}" "${tok[@]}" --run-dir "$work/two" --data.batch_size 4 --run.dist mpi
run_mpi 2 "$work/two-accum.log" "${common[@]}" "${tok[@]}" --run-dir "$work/two-accum" --data.batch_size 2 \
  --trainer.grad_accum 2 --run.dist mpi
run "$work/export.log" export --run-dir "$work/one" --out "$work/one.export" --backend "$backend"
for r in accum two two-accum; do
  compare losses "$work/$r/metrics.jsonl" "$work/one/metrics.jsonl" 1e-5
  compare grad_norms "$work/$r/metrics.jsonl" "$work/one/metrics.jsonl" 1e-5
  run "$work/export.log" export --run-dir "$work/$r" --out "$work/$r.export" --backend "$backend"
  compare weights "$work/$r.export/model.safetensors" "$work/one.export/model.safetensors" 1e-5
done
# resumed: 6 updates, a new process to 12, bit for bit the straight run (nothing of the weighting is kept between updates)
run "$work/half.log" "${common[@]}" "${tok[@]}" --run-dir "$work/half" --data.batch_size 4 --trainer.grad_accum 2 \
  --trainer.stop_at 6
run "$work/resume.log" train --run-dir "$work/half" --resume --backend "$backend"
compare losses "$work/half/metrics.jsonl" "$work/accum/metrics.jsonl" 0
run "$work/export.log" export --run-dir "$work/half" --out "$work/half.export" --backend "$backend"
cmp "$work/half.export/model.safetensors" "$work/accum.export/model.safetensors" || { echo "resumed weights differ"; exit 1; }
# micro_batch weighting at grad_accum 2 is another update (the micro-batches count different numbers of tokens)
run "$work/micro.log" "${common[@]}" --run-dir "$work/micro" --data.batch_size 4 --trainer.grad_accum 2
run "$work/micro1.log" "${common[@]}" --run-dir "$work/micro1" --data.batch_size 8
if compare losses "$work/micro/metrics.jsonl" "$work/micro1/metrics.jsonl" 1e-5 > "$work/micro.cmp" 2>&1; then
  echo "micro_batch weighting at grad_accum 2 matched the 8-row run: the workload does not tell the weightings apart"
  cat "$work/micro.cmp"; exit 1
fi
# refusals
if "$bin/dew-run" "${common[@]}" --run-dir "$work/bad" --trainer.loss_weighting tokens > "$work/bad.log" 2>&1; then
  echo "an unknown loss_weighting was accepted"; exit 1
fi
grep -q "trainer.loss_weighting' = 'tokens'" "$work/bad.log" || { cat "$work/bad.log"; exit 1; }
if "$bin/dew-run" train --config "$here/tiny.ini" --backend "$backend" --run-dir "$work/classify" "${tok[@]}" \
  > "$work/classify.log" 2>&1; then
  echo "a classifier under loss_weighting = token was accepted"; exit 1
fi
grep -q "classify objective's loss is not a mean over tokens" "$work/classify.log" || { cat "$work/classify.log"; exit 1; }
echo "loss_weighting = token on $backend: 1 x 8 = 1 x 4 x accum 2 = 2 x 4 = 2 x 2 x accum 2 within 1e-5; micro_batch differs"

#!/usr/bin/env bash
# tests/interop/moe_train.sh BIN_DIR BACKEND WORK_DIR — a mixture-of-experts language model trains through
# dew-run end to end: [model] moe_experts 4, top 2, qk-norm (the qwen3_moe family) on a small byte corpus.
# Checks: the loss falls; metrics.jsonl logs the load-balancing loss (aux_loss, weighted: between 0.001 * top_k
# and 0.001 * experts); a run paused at 6 and resumed to 12 gives the straight run's losses and final weights bit
# for bit; the HF export (qwen3_moe) imports again with the same parameters and the same sampled tokens;
# recompute = blocks with the balancing loss is refused in one line (exit status 2).
set -euo pipefail
bin=$1 backend=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
run() { "$bin/dew-run" "$@" > "$work/last.log" 2>&1 || { cat "$work/last.log"; exit 1; }; }
awk 'BEGIN { srand(3); for (i = 0; i < 300; i++) { n = 1 + int(rand() * 6);
       for (j = 0; j < n; j++) { w = ""; for (k = 0; k < 1 + int(rand() * 5); k++) w = w sprintf("%c", 97 + int(rand() * 6)); printf "%s ", w }
       printf "\n%%\n" } }' > "$work/docs.txt"
"$bin/dew-tokenize" --input "$work/docs.txt" --out "$work/corpus" --separator % --val-fraction 0.1 > "$work/tok.log"
common=(--config "$here/../packing/lm-packed.ini" --backend "$backend" --data.path "$work/corpus"
        --model.moe_experts 4 --model.moe_top_k 2 --model.moe_hidden 32 --model.qk_norm true
        --trainer.steps 12 --trainer.eval_every 12 --trainer.checkpoint_every 6)
run train "${common[@]}" --run-dir "$work/A"
run train "${common[@]}" --run-dir "$work/B" --trainer.stop_at 6
run train --run-dir "$work/B" --resume --backend "$backend"
losses() { grep -o '"step":[0-9]*,"loss":[^,}]*' "$1/metrics.jsonl"; }
[ "$(losses "$work/A" | wc -l)" -eq 12 ] || { echo "expected 12 logged steps"; exit 1; }
diff <(losses "$work/A") <(losses "$work/B") || { echo "losses differ after resume"; exit 1; }
first=$(losses "$work/A" | head -1 | sed 's/.*"loss"://'); last=$(losses "$work/A" | tail -1 | sed 's/.*"loss"://')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }' || { echo "the loss did not fall: $first -> $last"; exit 1; }
aux=$(grep -o '"aux_loss":[^,}]*' "$work/A/metrics.jsonl" | tail -1 | sed 's/.*://')
[ -n "$aux" ] || { echo "no aux_loss in metrics.jsonl"; exit 1; }
awk -v x="$aux" 'BEGIN { exit !(x >= 0.002 - 1e-6 && x <= 0.004) }' || { echo "aux_loss $aux outside [0.002, 0.004]"; exit 1; }
run export --run-dir "$work/A" --out "$work/A.st" --backend "$backend"
run export --run-dir "$work/B" --out "$work/B.st" --backend "$backend"
cmp "$work/A.st/model.safetensors" "$work/B.st/model.safetensors" || { echo "weights differ after resume"; exit 1; }
run export --run-dir "$work/A" --format hf --out "$work/A.hf" --backend "$backend"
grep -q '"model_type": "qwen3_moe"' "$work/A.hf/config.json" || { cat "$work/A.hf/config.json"; exit 1; }
grep -q '"num_experts": 4' "$work/A.hf/config.json" || { cat "$work/A.hf/config.json"; exit 1; }
run import --from "$work/A.hf" --run-dir "$work/I" --backend "$backend"
s1=$("$bin/dew-run" sample --run-dir "$work/A" --backend "$backend" --prompt "ab " --max_new_tokens 24 --temperature 0 2>/dev/null)
s2=$("$bin/dew-run" sample --run-dir "$work/I" --backend "$backend" --prompt "ab " --max_new_tokens 24 --temperature 0 2>/dev/null)
[ -n "$s1" ] && [ "$s1" = "$s2" ] || { echo "the imported export samples otherwise: '$s1' / '$s2'"; exit 1; }
set +e
"$bin/dew-run" train "${common[@]}" --run-dir "$work/R" --trainer.recompute blocks > "$work/R.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "moe_aux_loss = 0" "$work/R.log" || { cat "$work/R.log"; echo "recompute with MoE: rc $rc"; exit 1; }
echo "moe on $backend: loss $first -> $last, aux_loss $aux, resume bit-exact, the HF export samples alike"

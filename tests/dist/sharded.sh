#!/usr/bin/env bash
# tests/dist/sharded.sh BIN_DIR BACKEND WORK_DIR LION_DIR — [run] shard against shard = none.
# 1. On 2 ranks x batch 8, every shard mode (optimizer, gradients, parameters) with every optimizer
#    (adamw with clipping, weight decay and EMA from tiny.ini; sgd, lamb, muon; the example plugin lion
#    from LION_DIR) gives the per-step losses of shard = none within 1e-6 relative over 6 updates, and
#    the same parameters, EMA and optimizer state in the checkpoint (read with h5py) within 1e-6.
# 2. The same with grad_accum 2 and tiny buckets (several buckets, owners changing between them).
# 3. Other objectives: JEPA (vit encoder + predictor, the target encoder updated in after_update, EMA on)
#    and a byte-level LM (causal_transformer on a fortune file), shard = gradients and parameters, bit
#    for bit against none (same arithmetic) within the 1e-6 checks, also in f16-mixed and bf16-mixed (with
#    recomputation; the gradient norms too), and with LoRA adapters (the frozen base kept whole on every
#    rank); the LM's shard = parameters also with
#    gradient accumulation with and without recomputation and with run.shard_prefetch = false, and its
#    gather counters show the next block's gather was prefetched (none gathered on the spot after update 1).
# 4. One rank (dist = mpi without mpirun): every shard mode is a no-op, bit for bit.
# The log must say the run is sharded (a silently ignored option fails here).
set -euo pipefail
bin=$1 backend=$2 work=$3 lion=$4
source "$(dirname "$0")/common.sh"
rm -rf "$work" && mkdir -p "$work"
common=(train --config "$here/tiny.ini" --backend "$backend" --trainer.steps 6 --trainer.eval_every 3
        --trainer.checkpoint_every 0 --run.dist mpi)
ckpt=checkpoints/step-00000006.h5
check() {  # check RUN REFERENCE RTOL
  compare losses "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" "$3"
  "$PYTHON" "$here/compare_checkpoints.py" "$work/$1/$ckpt" "$work/$2/$ckpt" "$3"
}
for optim in adamw sgd lamb muon lion; do
  extra=(--optim.name "$optim")
  [ "$optim" = lion ] && extra+=(--plugin-dir "$lion" --optim.lr 1e-3)
  run_mpi 2 "$work/$optim-none.log" "${common[@]}" "${extra[@]}" --run-dir "$work/$optim-none" --data.batch_size 8
  for mode in optimizer gradients parameters; do
    r=$optim-$mode
    run_mpi 2 "$work/$r.log" "${common[@]}" "${extra[@]}" --run-dir "$work/$r" --data.batch_size 8 --run.shard $mode
    grep -q "run.shard = $mode over 2 ranks" "$work/$r.log" || { echo "$r: not sharded?"; cat "$work/$r.log"; exit 1; }
    # Every shard mode (optimizer too: ZeRO-1's traffic) reduces each bucket onto its owner only.
    grep -q "gradients reduce-scattered to their owners" "$work/$r.log" || { echo "$r: all-reduced?"; exit 1; }
    echo "== $r"
    check "$r" "$optim-none" 1e-6
  done
done
run_mpi 2 "$work/accum-none.log" "${common[@]}" --run-dir "$work/accum-none" --data.batch_size 4 \
  --trainer.grad_accum 2 --run.bucket_mb 0.0005
for mode in optimizer gradients parameters; do
  run_mpi 2 "$work/accum-$mode.log" "${common[@]}" --run-dir "$work/accum-$mode" --data.batch_size 4 \
    --trainer.grad_accum 2 --run.bucket_mb 0.0005 --run.shard $mode
  grep -qE "in [3-9] buckets" "$work/accum-$mode.log" || { echo "expected several buckets"; cat "$work/accum-$mode.log"; exit 1; }
  echo "== accum-$mode"
  check "accum-$mode" accum-none 1e-6
done
"$bin/dew-tokenize" --input /usr/share/games/fortunes/magic --out "$work/magic" > "$work/tok.log" 2>&1 ||
  { cat "$work/tok.log"; exit 1; }
objective_runs() {  # NAME CONFIG ARGS...
  local name=$1 config=$2; shift 2
  local args=(train --config "$config" --backend "$backend" --trainer.steps 6 --trainer.eval_every 3
              --trainer.checkpoint_every 0 --run.dist mpi "$@")
  run_mpi 2 "$work/$name-none.log" "${args[@]}" --run-dir "$work/$name-none"
  for mode in gradients parameters; do
    run_mpi 2 "$work/$name-$mode.log" "${args[@]}" --run-dir "$work/$name-$mode" --run.shard $mode
    echo "== $name-$mode"
    check "$name-$mode" "$name-none" 1e-6
  done
}
objective_runs jepa "$here/../jepa/tiny.ini" --data.batch_size 4 --trainer.ema_decay 0.9
# The LM: 4 layers (balanced shares), also with every block recomputed and with gradient accumulation.
lm=(--data.batch_size 4 --data.path "$work/magic" --model.n_layers 4)
objective_runs lm "$here/../report/lm-tiny.ini" "${lm[@]}" --trainer.log_every 1
# LoRA fine-tuning: only the adapters and norms trained (and sharded); the frozen weights stay whole on every rank.
objective_runs lm-lora "$here/../report/lm-tiny.ini" "${lm[@]}" --trainer.log_every 1 --lora.rank 4 \
  --lora.train "*norm.weight"
objective_runs lm-recompute "$here/../report/lm-tiny.ini" "${lm[@]}" --trainer.recompute blocks --trainer.grad_accum 2 \
  --data.batch_size 2 --trainer.log_every 1
# Mixed precision: f16-mixed (its dynamic loss scale divided out of the global gradient norm that the clip reads,
# sharded or not) and bf16-mixed with recomputed blocks, clipping on, every update's loss and grad_norm.
for precision in f16-mixed bf16-mixed; do
  objective_runs lm-$precision "$here/../report/lm-tiny.ini" "${lm[@]}" --trainer.log_every 1 --run.precision $precision \
    --optim.clip_grad_norm 0.5 --trainer.recompute blocks
  for mode in gradients parameters; do
    compare grad_norms "$work/lm-$precision-$mode/metrics.jsonl" "$work/lm-$precision-none/metrics.jsonl" 1e-6
  done
done
# shard = parameters prefetches the next block's gather (default): gradient accumulation without
# recomputation, and the same with run.shard_prefetch = false (blocking gathers), both = none.
lm_accum=(train --config "$here/../report/lm-tiny.ini" --backend "$backend" --trainer.steps 6 --trainer.eval_every 3
          --trainer.checkpoint_every 0 --run.dist mpi "${lm[@]}" --trainer.log_every 1 --trainer.grad_accum 2
          --data.batch_size 2)
run_mpi 2 "$work/lm-accum-none.log" "${lm_accum[@]}" --run-dir "$work/lm-accum-none"
for prefetch in true false; do
  run_mpi 2 "$work/lm-accum-prefetch-$prefetch.log" "${lm_accum[@]}" --run-dir "$work/lm-accum-prefetch-$prefetch" \
    --run.shard parameters --run.shard_prefetch $prefetch
  echo "== lm-accum-prefetch-$prefetch"
  check "lm-accum-prefetch-$prefetch" lm-accum-none 1e-6
done
# The prefetch happened (gathers_prefetched / gathers_blocking: block acquires so far, metrics.jsonl): the
# first pass learns the block sequence and gathers on the spot; from the second update on, every pass of
# the 4 blocks has its 8 acquires (4 forward, 4 backward) served by a gather launched ahead, except the
# last block's backward (kept whole since its forward): no more blocking gathers, >= 7 prefetched per pass.
# Without prefetch none is prefetched.
"$PYTHON" - "$work" << 'PY'
import json, sys
work = sys.argv[1]
def lines(run):
    with open(f"{work}/{run}/metrics.jsonl") as f:
        return [json.loads(l) for l in f if '"gathers_blocking"' in l]
ok = True
for run, accum in (("lm-parameters", 1), ("lm-recompute-parameters", 2), ("lm-accum-prefetch-true", 2)):
    ls = lines(run)
    first, last = ls[0], ls[-1]
    grew = last["gathers_prefetched"] - first["gathers_prefetched"]
    good = len(ls) == 6 and last["gathers_blocking"] == first["gathers_blocking"] and grew >= 5 * accum * 7
    ok = ok and good
    print(f"{run}: prefetched {[l['gathers_prefetched'] for l in ls]}, blocking {[l['gathers_blocking'] for l in ls]}"
          f" ({'ok' if good else 'expected no blocking gather after update 1 and >= 7 prefetched per pass'})")
off = lines("lm-accum-prefetch-false")
good = all(l["gathers_prefetched"] == 0 for l in off) and off[-1]["gathers_blocking"] > 0
ok = ok and good
print(f"lm-accum-prefetch-false: prefetched {[l['gathers_prefetched'] for l in off]} ({'ok' if good else 'expected 0'})")
sys.exit(0 if ok else 1)
PY
run_mpi 2 "$work/lm-optimizer.log" train --config "$here/../report/lm-tiny.ini" --backend "$backend" --trainer.steps 6 \
  --trainer.eval_every 3 --trainer.checkpoint_every 0 --run.dist mpi "${lm[@]}" --trainer.log_every 1 \
  --run-dir "$work/lm-optimizer" --run.shard optimizer
check lm-optimizer lm-none 1e-6
# What rank 0 holds (memory accounting, the first logged line, after the update's sync): optimizer state
# and gradients halve under optimizer and gradients, and parameters + gradients + optimizer state under parameters.
"$PYTHON" - "$work" << 'PY'
import json, sys
work = sys.argv[1]
def mem(run):
    with open(f"{work}/{run}/metrics.jsonl") as f:
        first = next(json.loads(l) for l in f if '"mem_params_mb"' in l)
    return {k: first[k] for k in ("mem_params_mb", "mem_grads_mb", "mem_optim_mb")}
none = mem("lm-none")
ok = True
def ratio(run, key, lo, hi):
    global ok
    m = mem(run)
    value = sum(m.values()) / sum(none.values()) if key == "total" else m[key] / none[key]
    good = lo <= value <= hi
    ok = ok and good
    print(f"{run}: {key} {value:.3f} of shard = none ({'ok' if good else f'outside [{lo}, {hi}]'})  {m}")
print("lm-none:", none)
ratio("lm-optimizer", "mem_optim_mb", 0.4, 0.6)
ratio("lm-optimizer", "mem_params_mb", 1.0, 1.0)
ratio("lm-optimizer", "mem_grads_mb", 0.4, 0.6)  # after the sync: the reduced gradients of its own parameters
ratio("lm-gradients", "mem_optim_mb", 0.4, 0.6)
ratio("lm-gradients", "mem_grads_mb", 0.4, 0.6)
ratio("lm-parameters", "total", 0.4, 0.6)
ratio("lm-parameters", "mem_params_mb", 0.4, 0.6)
sys.exit(0 if ok else 1)
PY
run "$work/one-none.log" "${common[@]}" --run-dir "$work/one-none" --data.batch_size 16
for mode in optimizer gradients parameters; do
  run "$work/one-$mode.log" "${common[@]}" --run-dir "$work/one-$mode" --data.batch_size 16 --run.shard $mode
  echo "== one rank, $mode"
  check "one-$mode" one-none 0
done
echo "shard = optimizer / gradients / parameters match shard = none on 2 ranks (1e-6) and are a no-op on one"

#!/usr/bin/env bash
# tests/train/interrupt.sh BIN_DIR WORK_DIR — Ctrl-C writes a checkpoint and exits 130; the run resumes. SIGTERM
# to a one-process run (what systemd, docker stop and Slurm's preemption send) does the same.
set -uo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
interrupt() {  # interrupt SIGNAL RUN: a long run, signalled after its third update, must pause with a checkpoint
  local sig=$1 run=$2
  "$bin/dew-run" train --config "$here/tiny.ini" --run-dir "$work/$run" --trainer.steps 100000 --trainer.eval_every 0 \
    --trainer.checkpoint_every 0 > "$work/$run.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do grep -q '"step":3,' "$work/$run/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
  kill -"$sig" $pid
  wait $pid; local rc=$?
  [ "$rc" -eq 130 ] || { echo "$sig: expected exit 130, got $rc"; cat "$work/$run.log"; exit 1; }
  ls "$work/$run/checkpoints"/step-*.h5 >/dev/null || { echo "no checkpoint after $sig"; exit 1; }
  grep -q "interrupted" "$work/$run.log" || { echo "$sig: no interruption message"; exit 1; }
}
interrupt INT run
"$bin/dew-run" train --run-dir "$work/run" --resume --trainer.stop_at 8 --trainer.steps 100000 > "$work/log2" 2>&1 || {
  cat "$work/log2"; exit 1; }
interrupt TERM term
echo "Ctrl-C and SIGTERM saved a checkpoint, exited 130 and the run resumed"

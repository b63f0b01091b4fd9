#!/usr/bin/env bash
# tests/train/interrupt.sh BIN_DIR WORK_DIR — Ctrl-C writes a checkpoint and exits 130; the run resumes. SIGTERM
# to a one-process run does the same.
set -uo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
"$bin/dew-run" train --config "$here/tiny.ini" --run-dir "$work/run" --trainer.steps 100000 --trainer.eval_every 0 \
  --trainer.checkpoint_every 0 > "$work/log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q '"step":3,' "$work/run/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
kill -INT $pid
wait $pid; rc=$?
[ "$rc" -eq 130 ] || { echo "expected exit 130, got $rc"; cat "$work/log"; exit 1; }
ls "$work/run/checkpoints"/step-*.h5 >/dev/null || { echo "no checkpoint after Ctrl-C"; exit 1; }
grep -q "interrupted" "$work/log" || { echo "no interruption message"; exit 1; }
"$bin/dew-run" train --run-dir "$work/run" --resume --trainer.stop_at 8 --trainer.steps 100000 > "$work/log2" 2>&1 || {
  cat "$work/log2"; exit 1; }
# SIGTERM (systemd, docker stop, Slurm's preemption) pauses a one-process run the same way.
"$bin/dew-run" train --config "$here/tiny.ini" --run-dir "$work/term" --trainer.steps 100000 --trainer.eval_every 0 \
  --trainer.checkpoint_every 0 > "$work/log3" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q '"step":3,' "$work/term/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
kill -TERM $pid
wait $pid; rc=$?
[ "$rc" -eq 130 ] || { echo "SIGTERM: expected exit 130, got $rc"; cat "$work/log3"; exit 1; }
ls "$work/term/checkpoints"/step-*.h5 >/dev/null || { echo "no checkpoint after SIGTERM"; exit 1; }
echo "Ctrl-C and SIGTERM saved a checkpoint, exited 130 and the run resumed"


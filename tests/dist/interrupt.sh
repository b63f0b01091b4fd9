#!/usr/bin/env bash
# tests/dist/interrupt.sh BIN_DIR WORK_DIR — `kill -USR1 <mpirun pid>` (mpirun forwards SIGUSR1 to every
# rank; Ctrl-C becomes SIGTERM, which allows no checkpoint) pauses a 2-rank run: the ranks agree on the
# update to stop at, rank 0 writes a checkpoint, the job exits 130, and --resume continues it to the end.
set -euo pipefail
bin=$1 work=$2
source "$(dirname "$0")/common.sh"
rm -rf "$work" && mkdir -p "$work"
args=(--backend cpu --data.batch_size 8 --run.dist mpi)
"$MPIRUN" "${mpi_flags[@]}" -np 2 "$bin/dew-run" train --config "$here/tiny.ini" --run-dir "$work/run" "${args[@]}" \
  --trainer.steps 100000000 --trainer.eval_every 0 --trainer.checkpoint_every 0 --trainer.log_every 10 \
  > "$work/log" 2>&1 < /dev/null &
launcher=$!
trap 'kill -9 $launcher 2> /dev/null || true' EXIT
for _ in $(seq 600); do
  [ -s "$work/run/metrics.jsonl" ] && [ "$(wc -l < "$work/run/metrics.jsonl")" -ge 3 ] && break
  kill -0 "$launcher" 2> /dev/null || { echo "the job ended early"; cat "$work/log"; exit 1; }
  sleep 0.1
done
kill -USR1 "$launcher"
status=0
for _ in $(seq 600); do kill -0 "$launcher" 2> /dev/null || break; sleep 0.1; done
wait "$launcher" || status=$?
trap - EXIT
[ "$status" -eq 130 ] || { echo "expected exit status 130, got $status"; cat "$work/log"; exit 1; }
grep -q "interrupted: saved" "$work/log" || { echo "no checkpoint message"; cat "$work/log"; exit 1; }
ckpt=$(ls "$work/run/checkpoints" | tail -1)
at=$((10#$(sed -E 's/step-0*([0-9]+)\.h5/\1/' <<< "$ckpt")))
[ "$at" -gt 0 ] || { echo "no checkpoint written"; exit 1; }
[ "$(data_next "$work/run/checkpoints/$ckpt")" = $((at * 16)) ] || { echo "wrong data position in $ckpt"; exit 1; }
run_mpi 2 "$work/resume.log" train --run-dir "$work/run" --resume "${args[@]}" --trainer.steps $((at + 5)) \
  --trainer.stop_at $((at + 5))
grep -q "done: $((at + 5)) updates" "$work/resume.log" || { echo "resume did not finish"; cat "$work/resume.log"; exit 1; }
echo "SIGUSR1 paused the 2-rank run at update $at with a checkpoint; --resume finished it"

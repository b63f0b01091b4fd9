#!/usr/bin/env bash
# tests/dist/failure.sh BIN_DIR WORK_DIR MODE [ARGS...] — a rank that loses its peer stops with an error, never hangs.
# Two ranks train (an endless schedule); once a few updates are logged, rank 1 is
#   kill:  killed (SIGKILL): mpirun notices and ends rank 0, which says so on stderr;
#   stop:  stopped (SIGSTOP), alive but silent, which mpirun cannot notice: rank 0's collective times out
#          (run.dist_timeout = 5 here) and it stops the job with "did not complete within 5 s".
# ARGS go to dew-run (e.g. --run.shard parameters: the same with sharded data parallel).
# Either way the job must end with a non-zero status and a clear message within 60 s of the fault.
set -euo pipefail
bin=$1 work=$2 mode=$3
shift 3
source "$(dirname "$0")/common.sh"
rm -rf "$work" && mkdir -p "$work"
tag=dew-dist-failure-$$-$RANDOM
"$MPIRUN" "${mpi_flags[@]}" -x DEW_TEST_TAG=$tag -np 2 "$bin/dew-run" train --config "$here/tiny.ini" --backend cpu \
  --run-dir "$work/run" --data.batch_size 8 --run.dist mpi --run.dist_timeout 5 --trainer.steps 100000000 \
  --trainer.eval_every 0 --trainer.checkpoint_every 0 --trainer.log_every 50 "$@" > "$work/log" 2>&1 < /dev/null &
launcher=$!
cleanup() { kill -9 "$launcher" 2> /dev/null || true; }
trap cleanup EXIT
for _ in $(seq 600); do  # up to 60 s for the job to start training
  [ -s "$work/run/metrics.jsonl" ] && [ "$(wc -l < "$work/run/metrics.jsonl")" -ge 3 ] && break
  kill -0 "$launcher" 2> /dev/null || { echo "the job ended before the fault"; cat "$work/log"; exit 1; }
  sleep 0.1
done
victim=$(rank_pid 1)
[ -n "$victim" ] || { echo "rank 1 not found"; cat "$work/log"; exit 1; }
if [ "$mode" = kill ]; then kill -9 "$victim"; else kill -STOP "$victim"; fi
start=$(date +%s.%N)
status=0
for _ in $(seq 900); do  # poll up to 90 s; more than 60 s fails below
  kill -0 "$launcher" 2> /dev/null || break
  sleep 0.1
done
if kill -0 "$launcher" 2> /dev/null; then
  [ "$mode" = stop ] && kill -CONT "$victim" 2> /dev/null || true
  echo "the job still runs 90 s after the fault"; tail -20 "$work/log"; exit 1
fi
wait "$launcher" || status=$?
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
trap - EXIT
echo "mode $mode: the job ended $elapsed s after the fault with status $status"
[ "$status" -ne 0 ] || { echo "expected a non-zero status"; cat "$work/log"; exit 1; }
[ "$(echo "$elapsed < 60" | bc)" = 1 ] || { echo "took longer than 60 s"; cat "$work/log"; exit 1; }
if [ "$mode" = kill ]; then
  want='exited on signal 9|dew: rank 0 of 2: terminated by SIGTERM'
else
  want='dew: rank 0 of 2: .* did not complete within 5 s'
fi
grep -Eq "$want" "$work/log" || { echo "no clear message ($want) in the output:"; cat "$work/log"; exit 1; }
grep -E "$want" "$work/log" | head -3

#!/usr/bin/env bash
# tests/dist/sharded_kill.sh BIN_DIR WORK_DIR VICTIM — kill -9 of rank VICTIM while a sharded run (2 ranks,
# shard = parameters) writes a checkpoint: the job ends with an error within 60 s, and the newest
# step-*.h5 is the previous complete checkpoint, which loads: one process resumes from it and trains on.
# DEW_TEST_SLOW_SAVE stretches each save (100 ms per tensor) so the kill lands inside one; the kill
# happens once a checkpoint exists and a later one's temporary file is being written.
set -euo pipefail
bin=$1 work=$2 victim_rank=$3
source "$(dirname "$0")/common.sh"
rm -rf "$work" && mkdir -p "$work"
tag=dew-sharded-kill-$$-$RANDOM
ck=$work/run/checkpoints
"$MPIRUN" "${mpi_flags[@]}" -x DEW_TEST_TAG=$tag -x DEW_TEST_SLOW_SAVE=1 -np 2 "$bin/dew-run" train \
  --config "$here/tiny.ini" --backend cpu --run-dir "$work/run" --data.batch_size 8 --run.dist mpi \
  --run.shard parameters --trainer.steps 100000000 --trainer.eval_every 0 --trainer.checkpoint_every 3 \
  --trainer.keep 100 > "$work/log" 2>&1 < /dev/null &
launcher=$!
cleanup() { kill -9 "$launcher" 2> /dev/null || true; }
trap cleanup EXIT
in_save=0
for _ in $(seq 1200); do  # up to 60 s: a first checkpoint, then a later save in progress
  kill -0 "$launcher" 2> /dev/null || { echo "the job ended before the fault"; cat "$work/log"; exit 1; }
  if [ -e "$ck/step-00000003.h5" ] && compgen -G "$ck/*.tmp-*" > /dev/null; then in_save=1; break; fi
  sleep 0.05
done
[ $in_save = 1 ] || { echo "no save in progress seen"; cat "$work/log"; exit 1; }
victim=$(rank_pid "$victim_rank")
[ -n "$victim" ] || { echo "rank $victim_rank not found"; cat "$work/log"; exit 1; }
kill -9 "$victim"
echo "killed rank $victim_rank during the save of $(ls "$ck" | grep tmp- || true)"
start=$(date +%s.%N)
for _ in $(seq 900); do
  kill -0 "$launcher" 2> /dev/null || break
  sleep 0.1
done
kill -0 "$launcher" 2> /dev/null && { echo "the job still runs 90 s after the kill"; tail -20 "$work/log"; exit 1; }
status=0
wait "$launcher" || status=$?
trap - EXIT
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
echo "the job ended $elapsed s after the kill with status $status"
[ "$status" -ne 0 ] || { echo "expected a non-zero status"; cat "$work/log"; exit 1; }
[ "$(echo "$elapsed < 60" | bc)" = 1 ] || { echo "took longer than 60 s"; cat "$work/log"; exit 1; }
latest=$(ls "$ck" | grep -E '^step-[0-9]+\.h5$' | sort | tail -1)
step=${latest#step-}; step=$((10#${step%.h5}))
echo "newest complete checkpoint: $latest (update $step); left over: $(ls "$ck" | grep -c tmp- || true) temporary file(s)"
"$PYTHON" "$here/compare_checkpoints.py" "$ck/$latest" "$ck/$latest" 0  # h5py reads every tensor
run "$work/resume.log" train --run-dir "$work/run" --resume --backend cpu --run.dist none --data.batch_size 16 \
  --trainer.steps $((step + 2)) --trainer.checkpoint_every 0
grep -q "resumed .*$latest at update $step" "$work/resume.log" || { echo "did not resume from $latest"; cat "$work/resume.log"; exit 1; }
[ -z "$(ls "$ck" | grep tmp- || true)" ] || { echo "the resumed run left the temporary file"; ls "$ck"; exit 1; }
echo "kill -9 of rank $victim_rank during a sharded save: stopped in $elapsed s; $latest loads and training continues"

#!/usr/bin/env bash
# tests/report/tensorboard.sh BIN_DIR WORK_DIR — [trainer] tensorboard = true, read back by an independent
# decoder (read_events.py: CRC-32C, protobuf wire format and the TensorBoard messages written from their
# specifications) on lm-tiny.ini (a byte-level LM on one fortune file):
# 1. A straight run: one event file; every scalar of metrics.jsonl at its step as float32 and nothing else;
#    the validation samples as text-plugin summaries; config.ini as text.
# 2. Resume appends: a run paused at update 6 and resumed keeps its event file byte for byte and grows it,
#    and the whole file still matches metrics.jsonl (no duplicates).
# 3. A crash after the last checkpoint: the run reached update 10 but its newest checkpoint is 8 (the one of
#    10 deleted) and the file ends in a torn record; --resume continues from 8: the records of steps <= 8
#    are kept byte for byte, those of 9..10 and the torn bytes are cut (as metrics.jsonl is rewound), the
#    file is valid and matches metrics.jsonl again.
# 4. Without the option no tb/ is written; a diffusion run's grids arrive as PNG images of the right size.
# 5. Data parallel (mpirun, 2 ranks; when MPIRUN names one and the mpi plugin is built): one writer.
set -euo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-/usr/bin/python3}
rm -rf "$work" && mkdir -p "$work"
cd "$work"
fail() { echo "FAIL: $*"; exit 1; }
run() { "$bin/dew-run" "$@" > last.log 2>&1 < /dev/null || { cat last.log; fail "dew-run $*"; }; }
reader() { "$PY" "$here/read_events.py" "$@"; }
events_of() { ls "$1"/tb/events.out.tfevents.*; }
"$bin/dew-tokenize" --input /usr/share/games/fortunes/magic --out data/magic > tok.log 2>&1 || { cat tok.log; fail tokenize; }
cfg=$here/lm-tiny.ini

# ---- 1: a straight run
run train --config "$cfg" --run-dir A --trainer.tensorboard true
[ "$(ls A/tb | wc -l)" -eq 1 ] || fail "expected one event file in A/tb: $(ls A/tb)"
[ "$(ls A/samples/*.txt | wc -l)" -eq 2 ] || fail "expected 2 text samples"
reader check A
grep -q '"rss_mb"' A/metrics.jsonl || fail "no rss_mb in metrics.jsonl"

# ---- 2: paused at 6, resumed: the file is appended to
run train --config "$cfg" --run-dir B --trainer.tensorboard true --trainer.stop_at 6
reader check B
cp "$(events_of B)" B.before
run train --run-dir B --resume --trainer.stop_at 12
grep -q "resumed" last.log || fail "B did not resume"
[ "$(ls B/tb | wc -l)" -eq 1 ] || fail "resume made a second event file: $(ls B/tb)"
before=$(stat -c %s B.before)
[ "$(stat -c %s "$(events_of B)")" -gt "$before" ] || fail "the resumed run did not append"
cmp -n "$before" B.before "$(events_of B)" || fail "resume changed the records written before it"
reader check B
# The resumed run logged the same losses as the straight one (resume is bit-exact): so do the event files.
diff <(grep -o '"loss":[^,]*' A/metrics.jsonl) <(grep -o '"loss":[^,]*' B/metrics.jsonl) || fail "losses differ"

# ---- 3: crash after update 10 with the checkpoint of 10 lost, and a torn record at the end
run train --config "$cfg" --run-dir C --trainer.tensorboard true --trainer.stop_at 10
ev=$(events_of C)
cp "$ev" C.before
keep=$(reader prefix "$ev" 8)
[ "$keep" -gt 0 ] && [ "$keep" -lt "$(stat -c %s "$ev")" ] || fail "prefix of steps <= 8: $keep bytes"
rm C/checkpoints/step-00000010.h5
printf '\x40\x00\x00\x00\x00\x00\x00\x00\x01\x02' >> "$ev"  # half a record header: a write cut short
run train --run-dir C --resume --trainer.stop_at 12
grep -q "resumed .*step-00000008.h5 at update 8" last.log || { cat last.log; fail "C did not resume from 8"; }
[ "$(ls C/tb | wc -l)" -eq 1 ] || fail "C: more than one event file"
cmp -n "$keep" C.before "$(events_of C)" || fail "the records of steps <= 8 changed"
reader check C
[ "$(grep -c '"step":10,"loss"' C/metrics.jsonl)" -eq 1 ] || fail "metrics.jsonl holds step 10 twice"

# ---- 4: off by default; images from a diffusion run
run train --config "$here/../diffusion_objective/tiny.ini" --run-dir D
[ ! -e D/tb ] || fail "tb/ written without trainer.tensorboard"
run train --config "$here/../diffusion_objective/tiny.ini" --run-dir E --trainer.tensorboard true
[ "$(ls E/samples/*.png | wc -l)" -eq 2 ] || fail "expected 2 grids"
reader check E | tee E.check
grep -q " 2 images" E.check || fail "the grids are not in the event file"

# ---- 5: data parallel: rank 0 alone writes
if [ -n "${MPIRUN:-}" ] && [ -e "$bin/../lib/dew/plugins/dew_mpi.so" ]; then
  "$MPIRUN" --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -np 2 "$bin/dew-run" train --config "$cfg" \
    --run-dir F --trainer.tensorboard true --run.dist mpi > mpi.log 2>&1 < /dev/null || { cat mpi.log; fail mpirun; }
  reader check F
  echo "data parallel: one event file, written by rank 0"
fi
echo "tensorboard: event files decoded independently match metrics.jsonl, samples and config; resume appends"

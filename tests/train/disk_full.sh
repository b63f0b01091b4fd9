#!/usr/bin/env bash
# tests/train/disk_full.sh BIN_DIR WORK_DIR — a checkpoint that does not fit the file system is refused with
# one error line and exit status 1, before HDF5 writes (a write that fills the disk fails inside HDF5's close,
# and the library then crashed at exit: SIGSEGV after the error); the earlier checkpoints stay intact.
# Needs a small tmpfs (mount as root); skipped (77) where mounting is not allowed.
set -uo pipefail
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work/small"
mount -t tmpfs -o size=4M tmpfs "$work/small" 2> /dev/null || { echo "cannot mount a tmpfs here: skipped"; exit 77; }
trap 'umount "$work/small" 2> /dev/null' EXIT
"$bin/dew-tokenize" --input /usr/share/games/fortunes/magic --out "$work/magic" > "$work/tok.log" 2>&1 || { cat "$work/tok.log"; exit 1; }
"$bin/dew-run" train --config "$(dirname "$0")/../report/lm-tiny.ini" --data.path "$work/magic" --model.dim 64 \
  --run-dir "$work/small/run" --trainer.steps 12 --trainer.checkpoint_every 3 --trainer.keep 3 --trainer.eval_every 0 \
  --objective.sample_tokens 0 > "$work/out.log" 2> "$work/err.log"
rc=$?
[ "$rc" -eq 1 ] || { echo "exit status $rc, expected 1"; cat "$work/err.log"; exit 1; }
grep -q "cannot write checkpoint .* MiB free (the earlier checkpoints are kept)" "$work/err.log" ||
  { echo "no disk-full error line"; cat "$work/err.log"; exit 1; }
ls "$work/small/run/checkpoints"/step-*.h5 > /dev/null 2>&1 || { echo "no earlier checkpoint left"; exit 1; }
ls "$work/small/run/checkpoints" | grep -q tmp && { echo "a temporary file was left"; exit 1; }
"$bin/dew-run" eval --run-dir "$work/small/run" > "$work/eval.log" 2>&1 || { echo "the kept checkpoint does not load"; cat "$work/eval.log"; exit 1; }
echo "disk full: refused in one line, exit 1, $(ls "$work/small/run/checkpoints" | tr '\n' ' ')kept"

#!/usr/bin/env bash
# tests/train/profile.sh BIN_DIR WORK_DIR — [trainer] profile times every kernel without changing a result.
# Two cpu runs of tiny.ini, one with --trainer.profile 5: the per-step losses must be identical, and the
# profiled run's log and RUN_DIR/profile.txt must hold the table (the optimizer and matmul lines, the
# share outside the kernels, every row's longest call no shorter than its mean call).
set -euo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
run() { "$bin/dew-run" "$@" > "$work/last.log" 2>&1 || { cat "$work/last.log"; exit 1; }; }
run train --config "$here/tiny.ini" --backend cpu --run-dir "$work/plain" --data.batch_size 48
run train --config "$here/tiny.ini" --backend cpu --run-dir "$work/profiled" --data.batch_size 48 --trainer.profile 5
losses() { grep '"loss"' "$1/metrics.jsonl" | sed -E 's/.*"step":([0-9]+),"loss":([^,]+),.*/\1 \2/'; }
diff <(losses "$work/plain") <(losses "$work/profiled") || { echo "profiling changed the losses"; exit 1; }
table="$work/profiled/profile.txt"
test -f "$table" || { echo "no profile.txt"; exit 1; }
for want in "profile: 5 steps" "adamw_update_group" "matmul 48x64x32 Bt +bias" "outside the kernels"; do
  grep -qF -- "$want" "$table" || { echo "profile.txt lacks '$want':"; cat "$table"; exit 1; }
  grep -qF -- "$want" "$work/profiled/log.txt" || { echo "the log lacks '$want'"; exit 1; }
done
# 5 profiled steps, each one AdamW call for its 4 tensors (two weights, two biases): 1.0 call per step
grep -E '^ +[0-9.]+ +1\.0 +[0-9.]+% +[0-9.]+  adamw_update_group$' "$table" > /dev/null || { echo "adamw_update_group is not 1 call per step:"; cat "$table"; exit 1; }
# the longest call of a row is at least its mean call (ms/step / calls), to the table's 3 decimals
awk '$3 ~ /%$/ && $2 > 0 && $4 + 0.0015 < $1 / $2 { print "longest " $4 " below the mean call " $1 / $2 ": " $0; bad = 1 }
     END { exit bad }' "$table" || { cat "$table"; exit 1; }
test ! -f "$work/plain/profile.txt" || { echo "an unprofiled run wrote profile.txt"; exit 1; }
echo "profiling leaves the losses unchanged and writes the table"

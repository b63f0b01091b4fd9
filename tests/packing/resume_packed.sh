#!/usr/bin/env bash
# tests/packing/resume_packed.sh BIN_DIR BACKEND WORK_DIR — a packed lm run ([data] pack = true on a corpus
# of short documents split at "%" lines, as the fortune files are) resumes bit for bit: run A trains 16
# updates straight; run B stops at 8 and a new process resumes it to 16. Their per-step losses and
# validation metrics in metrics.jsonl and their final weights (safetensors export) must be identical.
# Also: the unpacked run of the same config trains on other losses (packing is in effect); on a corpus of
# one document (nothing to mask) packed and unpacked runs train bit for bit alike (the packing path adds
# nothing of its own); and a corpus written with --document-token none refuses pack = true with one line.
set -euo pipefail
bin=$1 backend=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
run() { "$bin/dew-run" "$@" > "$work/last.log" 2>&1 || { cat "$work/last.log"; exit 1; }; }
# ~400 short documents of varied length separated by % lines
awk 'BEGIN { srand(7); for (i = 0; i < 400; i++) { n = 1 + int(rand() * 6);
       for (j = 0; j < n; j++) { w = ""; for (k = 0; k < 1 + int(rand() * 8); k++) w = w sprintf("%c", 97 + int(rand() * 26)); printf "%s ", w }
       printf "\n%%\n" } }' > "$work/docs.txt"
"$bin/dew-tokenize" --input "$work/docs.txt" --out "$work/corpus" --separator % --val-fraction 0.1 > "$work/tok.log"
grep -q '"documents": 400' "$work/corpus/meta.json" || { cat "$work/corpus/meta.json"; echo "no document count"; exit 1; }
common=(--config "$here/lm-packed.ini" --backend "$backend" --data.path "$work/corpus")
run train "${common[@]}" --run-dir "$work/A"
run train "${common[@]}" --run-dir "$work/B" --trainer.stop_at 8
test -f "$work/B/checkpoints/step-00000008.h5" || { echo "no checkpoint at the pause"; exit 1; }
run train --run-dir "$work/B" --resume --backend "$backend" --trainer.stop_at 16
losses() { grep -o '"step":[0-9]*,"loss":[^,}]*' "$1/metrics.jsonl"; }
vals() { grep -o '"val/[a-z_]*":[^,}]*' "$1/metrics.jsonl"; }
losses "$work/A" > "$work/A.losses"
losses "$work/B" > "$work/B.losses"
[ "$(wc -l < "$work/A.losses")" -eq 16 ] || { echo "expected 16 logged steps in A"; exit 1; }
diff "$work/A.losses" "$work/B.losses" || { echo "losses differ after resume"; exit 1; }
[ "$(vals "$work/A" | wc -l)" -gt 0 ] || { echo "no validation metrics in A"; exit 1; }
diff <(vals "$work/A") <(vals "$work/B") || { echo "validation metrics differ after resume"; exit 1; }
run export --run-dir "$work/A" --out "$work/A.export" --backend "$backend"
run export --run-dir "$work/B" --out "$work/B.export" --backend "$backend"
cmp "$work/A.export/model.safetensors" "$work/B.export/model.safetensors" || { echo "parameters differ"; exit 1; }
# packing is in effect: the unpacked run's first losses differ
run train "${common[@]}" --run-dir "$work/U" --data.pack false --trainer.steps 2
a1=$(grep -o '"step":1,"loss":[^,]*' "$work/A/metrics.jsonl"); u1=$(grep -o '"step":1,"loss":[^,]*' "$work/U/metrics.jsonl")
[ -n "$a1" ] && [ "$a1" != "$u1" ] || { echo "the packed and unpacked first losses agree ($a1 / $u1)"; exit 1; }
# the packing path itself costs nothing: on a corpus of one document (the train split holds no boundary, so
# there is nothing to mask) the packed run's losses and validation are bit for bit the unpacked run's
tr -d '\n' < "$work/docs.txt" | tr '%' '\n' > "$work/one.txt"
"$bin/dew-tokenize" --input "$work/one.txt" --out "$work/one" --val-fraction 0.1 > /dev/null
grep -q '"documents": 1' "$work/one/meta.json" || { cat "$work/one/meta.json"; echo "not one document"; exit 1; }
run train "${common[@]}" --data.path "$work/one" --trainer.steps 8 --trainer.eval_every 8 --run-dir "$work/O1"
run train "${common[@]}" --data.path "$work/one" --trainer.steps 8 --trainer.eval_every 8 --data.pack false --run-dir "$work/O0"
[ "$(losses "$work/O1" | wc -l)" -eq 8 ] || { echo "expected 8 logged steps in O1"; exit 1; }
diff <(losses "$work/O1"; vals "$work/O1") <(losses "$work/O0"; vals "$work/O0") ||
  { echo "one document: the packed run trains otherwise than the unpacked one"; exit 1; }
# a corpus without document boundaries refuses pack = true in one line, exit status 2
"$bin/dew-tokenize" --input "$work/docs.txt" --out "$work/plain" --document-token none > /dev/null
set +e
"$bin/dew-run" train "${common[@]}" --data.path "$work/plain" --run-dir "$work/P" > "$work/P.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "needs document boundaries" "$work/P.log" || { cat "$work/P.log"; echo "pack on a plain corpus: rc $rc"; exit 1; }
echo "packed resume on $backend is bit-exact: 16 losses, the validation and the final weights match"

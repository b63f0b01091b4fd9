#!/usr/bin/env bash
# tests/backends_cuda/no_device.sh BIN_DIR CONFIG WORK_DIR — on a machine where the cuda backend cannot run
# (no driver, no device, cuDNN mismatch): `dew-run plugins` lists it as present but unable to run, with the
# reason, and `dew-run train --backend cuda` exits 2 with one line carrying that reason. Exits 77 (skipped)
# where cuda can run.
set -uo pipefail
bin=$1 config=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
listing=$("$bin/dew-run" plugins 2>&1)
line=$(printf '%s\n' "$listing" | grep -E '^ +backend cuda ')
if [ -z "$line" ]; then echo "FAIL: dew-run plugins does not list the cuda backend:"; printf '%s\n' "$listing"; exit 1; fi
case "$line" in
  *"[can run here]"*) echo "skipped: the cuda backend can run on this machine"; exit 77 ;;
esac
reason=$(printf '%s\n' "$line" | sed -n 's/.*\[cannot run here: \(.*\)\].*/\1/p')
if [ -z "$reason" ]; then echo "FAIL: no reason in: $line"; exit 1; fi
echo "ok: dew-run plugins: $line"
out=$("$bin/dew-run" train --config "$config" --run-dir "$work/run" --backend cuda --trainer.steps 2 2>&1 >/dev/null)
rc=$?
lines=$(printf '%s\n' "$out" | grep -c .)
if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! printf '%s' "$out" | grep -qF -- "$reason"; then
  echo "FAIL: dew-run train --backend cuda: rc=$rc lines=$lines, expected rc 2 and one line with '$reason':"
  printf '%s\n' "$out"
  exit 1
fi
echo "ok: dew-run train --backend cuda -> rc 2: $out"

#!/usr/bin/env bash
# tests/train/muonclip.sh BIN_DIR BACKEND WORK_DIR [OVERRIDE...] — MuonClip (optim.name = muonclip) on
# muonclip-tiny.ini, OVERRIDEs (e.g. --run.precision bf16-mixed --trainer.recompute blocks) passed to resume.sh:
# resume is bit-exact (resume.sh: 40 updates straight = 20 + 20 in two processes, losses and final weights
# byte for byte), and QK-Clip really ran: every logged update has max_logit, and some updates clipped
# groups (qk_clipped > 0) while the max logit stayed bounded near tau afterwards.
set -euo pipefail
bin=$1 backend=$2 work=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
DEW_RESUME_CONFIG="$here/muonclip-tiny.ini" bash "$here/resume.sh" "$bin" "$backend" "$work" "$@"
m="$work/A/metrics.jsonl"
n_logit=$(grep -c '"max_logit":' "$m" || true)
clipped=$(grep -o '"qk_clipped":[0-9.e+-]*' "$m" | awk -F: '$2 > 0' | wc -l)
[ "$n_logit" -eq 40 ] || { echo "expected max_logit on 40 updates, got $n_logit"; exit 1; }
[ "$clipped" -gt 0 ] || { echo "QK-Clip never clipped a group (tau too high for the workload?)"; exit 1; }
worst=$(grep -o '"max_logit":[0-9.e+-]*' "$m" | cut -d: -f2 | sort -g | tail -1)
echo "muonclip on $backend $*: $clipped of 40 updates clipped groups; largest recorded max logit $worst (tau 1.5)"

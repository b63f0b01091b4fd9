#!/usr/bin/env bash
# tests/report/cli.sh BIN_DIR WORK_DIR — `dew-run report` and the trainer's report hook, without a browser:
# 1. `train` writes RUN_DIR/report.html at its end and prints its path; `report` with one run defaults to
#    RUN_DIR/report.html, with several to ./report.html, and --out anywhere.
# 2. trainer.report_every N rewrites the report while the run goes: it exists mid-run (the run is killed
#    then) with the updates so far; without the option it appears only at the end.
# 3. The last line of a metrics.jsonl still being written (no newline yet) is left out.
# 4. Refusals exit 2 with one line: no --run-dir, a missing directory, a directory that is not a run, a
#    malformed metrics line (named by file and line), a negative report_every, a non-boolean tensorboard.
set -euo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-/usr/bin/python3}
rm -rf "$work" && mkdir -p "$work"
cd "$work"
fail() { echo "FAIL: $*"; exit 1; }
run() { "$bin/dew-run" "$@" > last.log 2>&1 < /dev/null || { cat last.log; fail "dew-run $*"; }; }
refused() {
  local want=$1; shift
  set +e
  "$bin/dew-run" "$@" > refused.out 2> refused.err < /dev/null
  local rc=$?
  set -e
  [ $rc -eq 2 ] || { cat refused.err; fail "exit $rc (not 2) for: dew-run $*"; }
  [ "$(wc -l < refused.err)" -eq 1 ] || { cat refused.err; fail "not one line for: dew-run $*"; }
  grep -q -F -- "$want" refused.err || { cat refused.err; fail "no '$want' in the refusal of: dew-run $*"; }
}
# The largest step of the first run's metrics in a report page.
max_step() {
  "$PY" -c 'import json, re, sys
page = open(sys.argv[1]).read()
data = json.loads(re.search(r"id=\"dew-data\">(.*?)</script>", page, re.S).group(1))
print(max(p[0] for s in data["runs"][0]["series"].values() for p in s))' "$1"
}
"$bin/dew-tokenize" --input /usr/share/games/fortunes/magic --out data/magic > tok.log 2>&1 || { cat tok.log; fail tokenize; }
cfg=$here/lm-tiny.ini

# ---- 1
run train --config "$cfg" --run-dir A
grep -q "^report: A/report.html$" last.log || { cat last.log; fail "train did not print the report's path"; }
[ "$(max_step A/report.html)" -eq 12 ] || fail "A/report.html does not reach update 12"
rm A/report.html
run report --run-dir A
[ "$(cat last.log)" = "A/report.html" ] && [ -s A/report.html ] || fail "report --run-dir A: $(cat last.log)"
run train --config "$cfg" --run-dir B --optim.lr 0.001
run report --run-dir A --run-dir B
[ "$(cat last.log)" = "report.html" ] && [ -s report.html ] || fail "two runs: $(cat last.log)"
run report --run-dir A --run-dir B --out sub/dir/both.html
[ -s sub/dir/both.html ] && [ ! -e sub/dir/both.html.tmp ] || fail "--out sub/dir/both.html"
"$PY" "$here/check_page.py" html sub/dir/both.html A B
# --out naming a folder: one refusal, and no stray DIR.tmp
refused "is a folder" report --run-dir A --out sub/dir
[ ! -e sub/dir.tmp ] || fail "report --out DIR left DIR.tmp"

# ---- 2: report_every, seen mid-run; without it, no report before the end
long=(--trainer.steps 2000 --trainer.log_every 1 --trainer.eval_every 0 --trainer.checkpoint_every 0)
watch_run() {  # DIR WANT_REPORT ARGS...: starts a long run, waits for its first logged updates, kills it
  local dir=$1 want=$2; shift 2
  "$bin/dew-run" train --config "$cfg" --run-dir "$dir" "${long[@]}" "$@" > "$dir.log" 2>&1 < /dev/null &
  local pid=$! waited=0
  while :; do
    if [ "$want" = yes ] && [ -e "$dir/report.html" ]; then break; fi
    if [ "$want" = no ] && [ -e "$dir/metrics.jsonl" ] && [ "$(wc -l < "$dir/metrics.jsonl")" -ge 6 ]; then break; fi
    kill -0 $pid 2> /dev/null || { cat "$dir.log"; fail "$dir: the run ended before it was looked at"; }
    sleep 0.1
    waited=$((waited + 1))
    [ $waited -lt 1200 ] || { kill -9 $pid; fail "$dir: nothing after 120 s"; }
  done
  if [ "$want" = no ]; then [ ! -e "$dir/report.html" ] || fail "$dir: a report mid-run without report_every"; fi
  kill -9 $pid 2> /dev/null || fail "$dir: the run was already over"
  wait $pid 2> /dev/null || true
}
watch_run R yes --trainer.report_every 2
steps=$(max_step R/report.html)
[ "$steps" -ge 2 ] && [ "$steps" -lt 2000 ] || fail "mid-run report covers $steps updates"
watch_run N no

# ---- 3: a line being written is left out
cp -r A P
printf '{"step":13,"loss":1.5,"lr"' >> P/metrics.jsonl
run report --run-dir P
[ "$(max_step P/report.html)" -eq 12 ] || fail "the unfinished line was read"

# ---- 4: refusals
refused "report needs --run-dir" report
refused "no such directory" report --run-dir nowhere
mkdir empty
refused "is not a run directory" report --run-dir empty
cp -r A M
sed -i '3s/.*/{"step":6,"loss":oops}/' M/metrics.jsonl
refused "M/metrics.jsonl:3: not a JSON object" report --run-dir M
sed -i '3s/.*/{"loss":1}/' M/metrics.jsonl
refused 'M/metrics.jsonl:3: no numeric "step"' report --run-dir M
refused "trainer.report_every" train --config "$cfg" --run-dir X --trainer.report_every -1
refused "trainer.tensorboard" train --config "$cfg" --run-dir X --trainer.tensorboard maybe
echo "report: written by train (and every report_every updates), by report for one or several runs; refusals"

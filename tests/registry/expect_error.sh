#!/usr/bin/env bash
# tests/registry/expect_error.sh EXPECTED CMD [ARGS...]
#
# Runs CMD and passes when it fails cleanly: a non-zero exit status that is not a signal (no crash, no
# std::terminate), and exactly one error line containing EXPECTED (a fixed string); a hint, when there
# is one, sits on that same line. Prints what it saw when it fails.
set -u
expected=$1
shift
out=$("$@" 2>&1)
rc=$?
fail() {
  echo "FAIL: $1"
  echo "command: $*"
  echo "exit status: $rc"
  echo "output:"
  printf '%s\n' "$out"
  exit 1
}
[ "$rc" -ne 0 ] || fail "expected a non-zero exit status"
[ "$rc" -lt 128 ] || fail "killed by a signal"
if printf '%s\n' "$out" | grep -qiE 'terminate called|segmentation|aborted|core dumped|internal error'; then
  fail "crashed instead of refusing cleanly"
fi
lines=$(printf '%s\n' "$out" | wc -l)
first=$(printf '%s\n' "$out" | head -n 1)
case "$first" in
  *"$expected"*) ;;
  *) fail "the first line does not contain: $expected" ;;
esac
[ "$lines" -eq 1 ] || fail "expected exactly one line, got $lines"
printf '%s\n' "$out"
exit 0

#!/usr/bin/env bash
# tools/fuzz.sh SECONDS — builds the libFuzzer targets of fuzz/ (clang-14, ASan + UBSan, only the parser
# sources each needs: no libdew, no plugins) into build-fuzz/, runs each for SECONDS on a copy of its
# committed seed corpus (fuzz/corpus/<target>/), and prints per target its executions and findings.
# Exit status non-zero on any crash, leak, timeout or sanitizer report. Findings are kept under
# build-fuzz/findings/<target>/ (add each as a regression test).
set -uo pipefail
seconds=${1:-20}
cd "$(dirname "$0")/.."
root=$(pwd)
out=build-fuzz
cxx=${CXX_FUZZ:-clang++-14}
command -v "$cxx" >/dev/null || { echo "tools/fuzz.sh: $cxx not found (apt-get install clang-14 libclang-rt-14-dev)"; exit 2; }
mkdir -p "$out"
flags=(-std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$root/sdk/include" -I"$root/core" -I"$root/tools/dew-run")
declare -A sources=(
  [config_ini]="fuzz/config_ini.cpp core/config/config.cpp core/registry/options.cpp core/error.cpp"
  [checkpoint_block]="fuzz/checkpoint_block.cpp core/checkpoint/integrity.cpp -lz"
  [http_body]="fuzz/http_body.cpp tools/dew-run/request_limits.cpp"
  [token_files]="fuzz/token_files.cpp $(ls core/text/*.cpp | tr '\n' ' ') core/error.cpp"
)
targets=(config_ini checkpoint_block http_body token_files)
status=0
printf '%-18s %12s %10s %s\n' target executions findings note
for t in "${targets[@]}"; do
  bin="$out/$t"
  # shellcheck disable=SC2086
  srcs=$(printf '%s\n' ${sources[$t]} | grep -v '^-')
  fresh=1
  [ -x "$bin" ] && [ -z "$(find $srcs sdk/include core/checkpoint/integrity.h tools/dew-run/request_limits.hpp -newer "$bin" -name '*' -type f 2>/dev/null | head -1)" ] && fresh=0
  # shellcheck disable=SC2086
  if [ "$fresh" -eq 1 ] && ! "$cxx" "${flags[@]}" ${sources[$t]} -o "$bin" 2>"$out/$t.build.log"; then
    printf '%-18s %12s %10s %s\n' "$t" - - "BUILD FAILED (see $out/$t.build.log)"; status=1; continue
  fi
  # Past findings first (fuzz/regressions/<target>/): each must now run clean.
  if [ -d "fuzz/regressions/$t" ] && ls fuzz/regressions/"$t"/* >/dev/null 2>&1; then
    if ! "$bin" fuzz/regressions/"$t"/* >"$out/$t.regressions.log" 2>&1; then
      printf '%-18s %12s %10s %s\n' "$t" - - "REGRESSION (see $out/$t.regressions.log)"; status=1; continue
    fi
  fi
  corpus="$out/corpus/$t" findings="$out/findings/$t"
  rm -rf "$findings" && mkdir -p "$corpus" "$findings"
  cp -n fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$bin" "$corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -artifact_prefix="$findings/" -print_final_stats=1 >"$out/$t.log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$t.log" | tail -1)
  found=$(find "$findings" -type f | wc -l)
  note=""
  if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then status=1; note="FINDING (rc $rc; $out/$t.log)"; fi
  printf '%-18s %12s %10s %s\n' "$t" "${execs:-?}" "$found" "$note"
done
exit $status

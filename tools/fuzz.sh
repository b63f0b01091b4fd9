#!/usr/bin/env bash
# tools/fuzz.sh SECONDS [TARGET...] — builds the libFuzzer targets of fuzz/ (clang-14, ASan + UBSan) into
# build-fuzz/, runs each for SECONDS on a copy of its committed seed corpus (fuzz/corpus/<target>/), and
# prints per target its executions and findings. Exit status non-zero on any crash, leak, timeout or
# sanitizer report. Findings are kept under build-fuzz/findings/<target>/ (add each as a regression test).
#
# Two kinds of target: "parser only" ones compile just the sources they fuzz (no libdew); "with libdew" ones
# compile the parser's own sources instrumented (coverage, ASan, UBSan) and link the rest (tensors, options,
# the registry) from build/lib/libdew.so, which tools/build.sh makes first (its copies of the fuzzed
# functions are not used: the executable's instrumented ones take their place). TARGETs: a subset.
# FUZZ_JOBS=N: N targets at a time. FUZZ_SEED=N: libFuzzer's -seed (tools/test.sh's smoke run uses 1, so
# CI's mutations repeat); unset, random.
set -uo pipefail
seconds=${1:-20}
cd "$(dirname "$0")/.."
root=$(pwd)
out=build-fuzz
cxx=${CXX_FUZZ:-clang++-14}
command -v "$cxx" >/dev/null || { echo "tools/fuzz.sh: $cxx not found (apt-get install clang-14 libclang-rt-14-dev)"; exit 2; }
mkdir -p "$out"
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$root/sdk/include" -I"$root/core" -I"$root/tools/dew-run" -I/usr/include/hdf5/serial)
h5="-I/usr/include/hdf5/serial -L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5"
libdew="-L$root/build/lib -Wl,-rpath,$root/build/lib -ldew"
# Targets that make a backend (checkpoint_hdf5: tensors on ref) find the plugins of build/, not of build-fuzz/.
export DEW_PLUGIN_PATH="$root/build/lib/dew/plugins"
# A damaged legacy checkpoint that makes libhdf5 loop is refused after this many seconds (not 30).
export DEW_CHECKPOINT_PROBE_SECONDS=3
declare -A sources=(
  [config_ini]="fuzz/config_ini.cpp core/config/config.cpp core/registry/options.cpp core/error.cpp"
  [checkpoint_block]="fuzz/checkpoint_block.cpp core/checkpoint/integrity.cpp -lz"
  [http_body]="fuzz/http_body.cpp tools/dew-run/request_limits.cpp"
  [token_files]="fuzz/token_files.cpp $(ls core/text/*.cpp | tr '\n' ' ') core/error.cpp"
  [chat_template]="fuzz/chat_template.cpp $(ls core/text/*.cpp | tr '\n' ' ') core/error.cpp"
  [png]="fuzz/png.cpp core/image/png.cpp -lpng $libdew"
  [safetensors]="fuzz/safetensors.cpp core/checkpoint/safetensors.cpp $libdew"
  [idx]="fuzz/idx.cpp -lz $libdew"
  [hf_config]="fuzz/hf_config.cpp $libdew"
  [checkpoint_hdf5]="fuzz/checkpoint_hdf5.cpp core/checkpoint/checkpoint.cpp core/checkpoint/integrity.cpp $h5 -lz $libdew"
  [http_routes]="fuzz/http_routes.cpp tools/dew-run/request_limits.cpp tools/dew-run/route_bodies.cpp tools/dew-run/chat_completions.cpp $libdew"
)
# Sources a target includes rather than lists (a change rebuilds it).
declare -A included=([idx]="plugins/data/idx/idx.cpp" [hf_config]="plugins/models/causal_transformer/hf_converter.cpp")
# Inputs larger than the default 64 KiB: whole checkpoints.
declare -A max_len=([checkpoint_hdf5]=131072)
# Extra libFuzzer flags. checkpoint_hdf5: on a damaged legacy file (no checksum block, so libhdf5 parses
# it unverified) libhdf5 sizes buffers from the damaged metadata before it finds the bytes are not there: a
# single 3 GB malloc (reserved, never touched) and up to ~1 GB touched, freed when the file is refused
# (docs/reliability.md). So no per-malloc limit there, and a 4 GB RSS limit instead of 2 GB.
declare -A extra=([checkpoint_hdf5]="-malloc_limit_mb=1048576")
declare -A rss_limit=([checkpoint_hdf5]=4096)
# Sanitizer settings, for the regressions and the fuzzing alike. allocator_may_return_null: an impossible
# size gets NULL, as from glibc, so C libraries (libhdf5, libpng) take their own error paths; dew's
# operator new still throws. fuzz/lsan.supp: libhdf5's own leaks on its error paths.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$root/fuzz/lsan.supp
targets=(config_ini checkpoint_block http_body token_files chat_template png safetensors idx hf_config checkpoint_hdf5
         http_routes)
[ $# -gt 1 ] && targets=("${@:2}")
status=0
# Objects: each source compiled once for every target that lists it (build-fuzz/obj/), in parallel, again
# when it or any header is newer than its object.
objects_of() {  # target -> its objects
  local w
  for w in ${sources[$1]}; do case "$w" in *.cpp) echo "$out/obj/${w%.cpp}.o" ;; esac; done
}
compile_one() {  # source object [a source it includes]
  if [ -f "$2" ] && [ ! "$1" -nt "$2" ] && { [ -z "${3:-}" ] || [ ! "$3" -nt "$2" ]; } &&
     [ -z "$(find sdk/include core tools/dew-run fuzz \( -name '*.h' -o -name '*.hpp' -o -name '*.inc' \) \
             -newer "$2" -type f 2>/dev/null | head -1)" ]; then return 0; fi
  mkdir -p "$(dirname "$2")"
  "$cxx" "${flags[@]}" -c "$1" -o "$2" 2>"$2.log" || { echo "$1"; return 1; }
}
export -f compile_one
export cxx out
export FUZZ_FLAGS="${flags[*]}"
declare -A wanted=()
for t in "${targets[@]}"; do
  for w in ${sources[$t]}; do case "$w" in *.cpp) wanted[$w]=1 ;; esac; done
done
# (the included sources of a target: its own .cpp is recompiled when they change)
failed=$(for w in "${!wanted[@]}"; do
  inc=""
  for t in "${!included[@]}"; do [[ " ${sources[$t]} " == *" $w "* ]] && inc=${included[$t]}; done
  printf '%s\0%s\0%s\0' "$w" "$out/obj/${w%.cpp}.o" "$inc"
done | xargs -0 -n 3 -P "$(nproc)" bash -c 'flags=($FUZZ_FLAGS); compile_one "$0" "$1" "$2"')
# One target: link, regressions, fuzzing; prints its row and fails on any problem.
fuzz_target() {
  local t=$1 bin objs libs broken relink w corpus findings rc execs found note
  bin="$out/$t"
  objs=$(objects_of "$t")
  libs=$(printf '%s\n' ${sources[$t]} | grep -v '\.cpp$' | tr '\n' ' ')
  case "$libs" in *-ldew*)
    [ -f build/lib/libdew.so ] || { printf '%-18s %12s %10s %s\n' "$t" - - "NOT BUILT: needs build/lib/libdew.so (tools/build.sh)"; return 1; } ;;
  esac
  broken=""
  for w in ${sources[$t]}; do case "$w" in *.cpp) grep -qxF "$w" <<<"$failed" && broken="$out/obj/${w%.cpp}.o.log" ;; esac; done
  if [ -n "$broken" ]; then
    printf '%-18s %12s %10s %s\n' "$t" - - "BUILD FAILED (see $broken)"; return 1
  fi
  relink=1
  # shellcheck disable=SC2086
  [ -x "$bin" ] && [ -z "$(find $objs build/lib/libdew.so -newer "$bin" 2>/dev/null | head -1)" ] && relink=0
  # shellcheck disable=SC2086
  if [ "$relink" -eq 1 ] && ! "$cxx" "${flags[@]}" $objs $libs -o "$bin" 2>"$out/$t.build.log"; then
    printf '%-18s %12s %10s %s\n' "$t" - - "BUILD FAILED (see $out/$t.build.log)"; return 1
  fi
  # Past findings first (fuzz/regressions/<target>/): each must now run clean.
  if [ -d "fuzz/regressions/$t" ] && ls fuzz/regressions/"$t"/* >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    if ! "$bin" -rss_limit_mb="${rss_limit[$t]:-2048}" ${extra[$t]:-} fuzz/regressions/"$t"/* >"$out/$t.regressions.log" 2>&1; then
      printf '%-18s %12s %10s %s\n' "$t" - - "REGRESSION (see $out/$t.regressions.log)"; return 1
    fi
  fi
  corpus="$out/corpus/$t" findings="$out/findings/$t"
  rm -rf "$findings" && mkdir -p "$corpus" "$findings"
  cp -n fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null
  # shellcheck disable=SC2086
  "$bin" "$corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb="${rss_limit[$t]:-2048}" -max_len="${max_len[$t]:-65536}" ${extra[$t]:-} \
    -artifact_prefix="$findings/" -print_final_stats=1 ${FUZZ_SEED:+-seed=$FUZZ_SEED} >"$out/$t.log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$t.log" | tail -1)
  found=$(find "$findings" -type f | wc -l)
  note=""
  [ "$rc" -ne 0 ] || [ "$found" -ne 0 ] && note="FINDING (rc $rc; $out/$t.log)"
  printf '%-18s %12s %10s %s\n' "$t" "${execs:-?}" "$found" "$note"
  [ -z "$note" ]
}
printf '%-18s %12s %10s %s\n' target executions findings note
# FUZZ_JOBS=N runs N targets at a time (each is one process: tools/fuzz.sh 600 on 2 cores takes half as
# long with FUZZ_JOBS=2); their rows print in the order above.
jobs=${FUZZ_JOBS:-1}
if [ "$jobs" -le 1 ]; then
  for t in "${targets[@]}"; do fuzz_target "$t" || status=1; done
else
  running=0
  for t in "${targets[@]}"; do
    ( fuzz_target "$t" >"$out/$t.row"; echo $? >"$out/$t.rc" ) &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
  done
  wait
  for t in "${targets[@]}"; do cat "$out/$t.row"; [ "$(cat "$out/$t.rc")" = 0 ] || status=1; done
fi
exit $status

#!/usr/bin/env bash
# The README's test command: installs the packages, builds, and runs the whole test suite, then every
# fuzz target for 20 s (tools/fuzz.sh; no finding allowed).
#   tools/test.sh             the suite (build/) + the fuzz smoke run
#   tools/test.sh --sanitize  the suite built with ASan + UBSan into build-asan/ (slow: a full rebuild)
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
if [ "${1:-}" = "--sanitize" ]; then
  # ASan + UBSan over everything (libdew, plugins, tools, tests). Leak checking stays on; the CUDA
  # backend is left out (nvcc does not take -fsanitize). ASAN_OPTIONS: libgomp and oneDNN keep
  # thread pools alive at exit, which LeakSanitizer would report as leaks of their own.
  san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEW_WITH_CUDA=OFF \
    -DCMAKE_CXX_FLAGS="$san" -DCMAKE_C_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
  ninja -C build-asan -j"$(nproc)"
  cd build-asan
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --output-on-failure -j"$(nproc)" --timeout 1800
  exit 0
fi
tools/build.sh
(cd build && ctest --output-on-failure -j"$(nproc)" --timeout 900)
tools/fuzz.sh 20

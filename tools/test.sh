#!/usr/bin/env bash
# The README's test command: installs the packages, builds, and runs the whole test suite, then every
# fuzz target for 20 s (tools/fuzz.sh; no finding allowed), from a fixed seed so that a red run repeats.
#   tools/test.sh             the suite (build/) + the fuzz smoke run
#   tools/test.sh --sanitize  the suite built with ASan + UBSan into build-asan/ (slow: a full rebuild)
#   tools/test.sh --tsan      ThreadSanitizer over the threaded parts: the loader (data.*), serving (serve.*,
#                             the HTTP server and the scheduler thread) and data-parallel (dist.*, test_dist)
#                             tests, built into build-tsan/ (only those tests and what they load)
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
if [ "${1:-}" = "--sanitize" ]; then
  # ASan + UBSan over everything (libdew, plugins, tools, tests). Leak checking stays on; the CUDA
  # backend is left out (nvcc does not take -fsanitize). ASAN_OPTIONS: libgomp and oneDNN keep
  # thread pools alive at exit, which LeakSanitizer would report as leaks of their own.
  # -O1 -g1 (line tables): ASan's recommended level, and about a third less compile time than -O2 -g on 2
  # cores; NDEBUG as in the Release build, so the suite checks the code that ships.
  san="-O1 -g1 -DNDEBUG -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=None -DDEW_WITH_CUDA=OFF \
    -DCMAKE_CXX_FLAGS="$san" -DCMAKE_C_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
  ninja -C build-asan -j"$(nproc)"
  cd build-asan
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --output-on-failure -j"$(nproc)" --timeout 1800
  exit 0
fi
if [ "${1:-}" = "--tsan" ]; then
  # libgomp and oneDNN are not built with TSan: their own synchronisation is invisible to it, so reports
  # whose every frame is inside them are suppressed (tools/tsan.supp); dew's code is checked in full.
  # -O1 -g1 as for ASan (TSan's recommended level, a third less compile time on 2 cores). Built: every
  # plugin (`dew_plugins`: the dist scripts load mpi, classify, an example optimizer...) and the
  # executables the selected tests run.
  tsan="-O1 -g1 -DNDEBUG -fsanitize=thread -fno-omit-frame-pointer"
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=None -DDEW_WITH_CUDA=OFF \
    -DCMAKE_CXX_FLAGS="$tsan" -DCMAKE_C_FLAGS="$tsan" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=thread" >/dev/null
  targets=(dew_plugins dew-run dew-tokenize test_data test_serve test_dist)
  for t in test_collectives test_block_params; do  # defined only where the mpi plugin is built
    if ninja -C build-tsan -t query "$t" >/dev/null 2>&1; then targets+=("$t"); fi
  done
  ninja -C build-tsan -j"$(nproc)" "${targets[@]}"
  cd build-tsan
  # OMP_NUM_THREADS=1: GCC's TSan cannot see libgomp's barriers (libgomp would have to be rebuilt with TSan),
  # so every OpenMP region with a team reports races on its own shared variables; with one thread libgomp
  # starts no team. What is checked is dew's own threads: the loader's workers, the HTTP server's pool and
  # the scheduler thread, the MPI ranks' processes and the communicator's abort watchdog.
  OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/../tools/tsan.supp" \
    ctest --output-on-failure -j"$(nproc)" --timeout 1800 \
    -R '^(data\.|slot decoding|scheduler|http|dew-run serve|serve\.|dist\.|leaf-ready|buckets|broadcast)'
  exit 0
fi
tools/build.sh
(cd build && ctest --output-on-failure -j"$(nproc)" --timeout 900)
FUZZ_SEED=1 tools/fuzz.sh 20

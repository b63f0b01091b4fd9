#!/usr/bin/env bash
# Configures and builds dew (Release, Ninja, ccache when present) into build/.
# The CUDA backend is built when nvcc is found (on PATH or under /usr/local/cuda/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
# ccache keys on paths relative to the checkout, so a fresh clone reuses an earlier build's cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
ninja -C build -j"$(nproc)"

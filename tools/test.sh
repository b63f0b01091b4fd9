#!/usr/bin/env bash
# The README's test command: installs the packages, builds, and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/build.sh
cd build && ctest --output-on-failure -j"$(nproc)" --timeout 900

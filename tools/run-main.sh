#!/usr/bin/env bash
# The README's main command: installs the packages, builds, lists the plugins and runs the demo job.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/build.sh
build/bin/dew-run plugins
build/bin/dew-run demo --backend cpu "$@"

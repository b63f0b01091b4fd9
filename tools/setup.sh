#!/usr/bin/env bash
# Installs every Debian package dew needs to build, test and run (idempotent, non-interactive).
# CUDA and cuDNN are not installed here: they are picked up from /usr/local/cuda when present.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PKGS=(
  cmake ninja-build g++ pkg-config ccache
  libboost-dev libboost-filesystem-dev libboost-program-options-dev
  libdnnl-dev ocl-icd-opencl-dev opencl-c-headers libhdf5-dev hdf5-tools python3-h5py python3-numpy
  python3-jinja2 python3-prometheus-client
  libspdlog-dev libfmt-dev doctest-dev zlib1g-dev nlohmann-json3-dev libpng-dev
  libopenmpi-dev openmpi-bin
  libcpp-httplib-dev
  clang-14 libclang-rt-14-dev
  dataset-fashion-mnist fortunes
  chromium
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
# The OpenAI client test of `dew-run serve` (tests/serve/openai_client.sh) runs npm's `openai` package on
# node: Debian's nodejs and npm when neither is there (a NodeSource nodejs brings its own npm).
node_pkgs=()
command -v node >/dev/null 2>&1 || node_pkgs+=(nodejs)
command -v npm >/dev/null 2>&1 || node_pkgs+=(npm)
if [ ${#node_pkgs[@]} -gt 0 ]; then
  echo "setup: installing ${node_pkgs[*]}"
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends "${node_pkgs[@]}"
fi

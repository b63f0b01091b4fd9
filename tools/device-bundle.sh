#!/usr/bin/env bash
# tools/device-bundle.sh [BUILD_DIR] — packs what tools/device-check.sh needs into device-bundle.tar.xz, for a
# GPU machine that cannot install Debian packages (the `device` tool's machines reach no package registry
# and run another distribution with its own CUDA and cuDNN).
#
# Builds (here, where the -dev packages are) the tools, the GPU unit test and every plugin into BUILD_DIR
# (default build), then lays out device-bundle/ as an install tree the binaries already understand
# (bin/, lib/libdew.so*, lib/dew/plugins/ — the registry looks in bin/../lib/dew/plugins) and copies every
# shared library they load from this machine into lib/sys/, except
#   * glibc (libc, libm, libdl, libpthread, librt, libresolv, the loader): the GPU machine's own, newer;
#   * the driver (libcuda, libnvidia-*) and the CUDA toolkit (cudart, cuBLAS(Lt), cuDNN, NCCL: gigabytes):
#     device-check.sh --prebuilt finds the GPU machine's own (CUDA 13, cuDNN 9, as the plugin was built);
#   * libstdc++, libgcc_s, libgomp go to lib/fallback/: used only when the GPU machine's are older than
#     this compiler's (a newer libstdc++ also serves what CUDA's libraries were built against).
# Then on the GPU machine (the `device` tool, carry ["device-bundle.tar.xz"]):
#   tar -xJf device-bundle.tar.xz && DEW_PREBUILT=device-bundle tools/device-check.sh
# Prints the bundle's size; the device tool carries at most 64 MiB with the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=device-bundle
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
command -v nvcc >/dev/null 2>&1 || { echo "device-bundle: nvcc not found: the cuda backend would not be built" >&2; exit 1; }
[ -f "$build/build.ninja" ] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
plugins=$(ninja -C "$build" -t targets all | sed -n 's|^\(lib/dew/plugins/[^:]*\.so\):.*|\1|p' | sort -u)
ninja -C "$build" -j"$(nproc)" dew-run dew-conformance dew-bench dew-tokenize test_backend_cuda_gpu $plugins
[ -f "$build/lib/dew/plugins/dew_cuda.so" ] || { echo "device-bundle: $build has no dew_cuda.so" >&2; exit 1; }

rm -rf "$out" "$out.tar.xz"
mkdir -p "$out/bin" "$out/lib/dew/plugins" "$out/lib/sys" "$out/lib/fallback"
cp "$build"/bin/{dew-run,dew-conformance,dew-bench,dew-tokenize,test_backend_cuda_gpu} "$out/bin/"
cp -P "$build"/lib/libdew.so* "$out/lib/"
cp "$build"/lib/dew/plugins/*.so "$out/lib/dew/plugins/"

skip='/(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64)\.so|/libcuda\.so|/libnvidia|/libcudart\.so|/libcublas(Lt)?\.so|/libcudnn[a-z_]*\.so|/libnccl\.so'
fallback='/(libstdc\+\+|libgcc_s|libgomp)\.so'
for f in "$out"/bin/* "$out"/lib/dew/plugins/*.so; do ldd "$f"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
  sort -u | grep -v -E "$skip" | grep -v -F "$(realpath "$build")" | while read -r lib; do
  if echo "$lib" | grep -q -E "$fallback"; then cp -L "$lib" "$out/lib/fallback/"; else cp -L "$lib" "$out/lib/sys/"; fi
done
missing=$(for f in "$out"/bin/* "$out"/lib/dew/plugins/*.so; do ldd "$f"; done | grep "not found" | sort -u || true)
[ -z "$missing" ] || { echo "device-bundle: unresolved here: $missing" >&2; exit 1; }
# What each library's own SONAME needs is resolved above transitively (ldd lists the whole closure).
tar -cJf "$out.tar.xz" "$out"
echo "device-bundle: $(find "$out" -type f | wc -l) files, $(du -sh "$out" | cut -f1) unpacked, $(du -h "$out.tar.xz" | cut -f1) packed -> $out.tar.xz"
echo "on the GPU machine: tar -xJf $out.tar.xz && DEW_PREBUILT=$out tools/device-check.sh"

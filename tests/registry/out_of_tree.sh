#!/usr/bin/env bash
# tests/registry/out_of_tree.sh CMAKE BUILD_DIR EXAMPLE_SRC WORK_DIR CXX CC
#
# What a third party does: installs the dew build in BUILD_DIR into a fresh prefix, configures and
# builds examples/hello_plugin against it (find_package(dew) with only CMAKE_PREFIX_PATH, so the
# installed package must not need dew's private dependencies), then runs the installed dew-run on the
# plugin's build folder and checks the plugin and its component are listed.
set -eu
cmake=$1 build=$2 src=$3 work=$4 cxx=$5 cc=$6
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix

echo "== install $build into $prefix"
"$cmake" --install "$build" --prefix "$prefix" > "$work/install.log"
test -f "$prefix/lib/cmake/dew/dewConfig.cmake"
test -x "$prefix/bin/dew-run"

echo "== configure and build $src"
"$cmake" -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" > "$work/configure.log" || { cat "$work/configure.log"; exit 1; }
"$cmake" --build "$work/build" > "$work/build.log" || { cat "$work/build.log"; exit 1; }
plugin=$work/build/dew_hello.so
test -f "$plugin"
"$here/exports_only_entry.sh" "$plugin"

echo "== $prefix/bin/dew-run plugins --plugin-dir $work/build --plugins hello"
out=$("$prefix/bin/dew-run" plugins --plugin-dir "$work/build" --plugins hello 2>&1) || {
  echo "$out"
  exit 1
}
echo "$out"
echo "$out" | grep -q "^hello  version 0.1.0  abi 1  $plugin\$"
echo "$out" | grep -q "^    greeter hello  — says hello"
echo "PASS"

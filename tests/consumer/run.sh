#!/usr/bin/env bash
# Installs the build into a fresh prefix, builds tests/consumer against it with find_package(stealbatch), runs it.
# Usage: run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src/tests/consumer" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DTRAINER_SOURCE="$src/examples/custom_trainer/main.cpp" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
# The consumer must have used the installed headers, not the source tree's.
grep -q -- "-isystem $work/prefix/include\|-I$work/prefix/include" "$work/build/build.ninja" || { echo "consumer did not use the installed include dir"; exit 1; }
"$work/build/custom_trainer" cpu:2

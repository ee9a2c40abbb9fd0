#!/usr/bin/env bash
# Installs the build into a fresh prefix, builds tests/consumer against it with find_package(stealbatch), runs it.
# Then checks the installed headers' include closure: no header of Boost or TBB may be read when a user includes
# every installed header (they are the library's private dependencies; the GPU machine has neither).
# Usage: run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
# One file that includes every installed header of the package.
(cd "$work/prefix/include" && find stealbatch -name '*.hpp' | sort | sed 's/.*/#include <&>/') > "$work/all_headers.cpp"
echo "int sb_all_headers_included = $(wc -l < "$work/all_headers.cpp");" >> "$work/all_headers.cpp"
cmake -S "$src/tests/consumer" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DTRAINER_SOURCE="$src/examples/custom_trainer/main.cpp" -DALL_HEADERS_SOURCE="$work/all_headers.cpp" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
# The consumer must have used the installed headers, not the source tree's.
grep -q -- "-isystem $work/prefix/include\|-I$work/prefix/include" "$work/build/build.ninja" || { echo "consumer did not use the installed include dir"; exit 1; }
# The include closure, as the compiler recorded it (ninja's deps log).
ninja -C "$work/build" -t deps > "$work/deps.txt"
headers=$(grep -c "stealbatch/" "$work/deps.txt" || true)
[ "$headers" -gt 0 ] || { echo "the deps log names no stealbatch header: the closure check would prove nothing"; exit 1; }
if grep -E "/(boost|tbb|oneapi/tbb)/" "$work/deps.txt" | sort -u > "$work/private.txt" && [ -s "$work/private.txt" ]; then
  echo "an installed header pulls in a private dependency (Boost or TBB):"
  head -20 "$work/private.txt"
  exit 1
fi
echo "consumer: $(wc -l < "$work/all_headers.cpp") lines of includes, $headers stealbatch header reads, none of Boost or TBB"
"$work/build/custom_trainer" cpu:2

#!/usr/bin/env bash
# The full test suite: install what is missing, then build and run every test in these configurations:
#   build/          Release, CUDA compiled and linked (GPU tests report "skipped" without a GPU), MPI tests through mpirun
#   build-tsan/     ThreadSanitizer over the scheduler, runtime, data, models and checkpoint tests (MPI off: Open MPI is not
#                   built with it)
#   build-tsan-mpi/ ThreadSanitizer over the runtime across 2 and 4 MPI ranks (test_mpi_cluster's cases; Open MPI's
#                   own internals suppressed, tests/tsan-mpi.supp)
#   build-asan/     AddressSanitizer + UndefinedBehaviorSanitizer over the unit tests (not the install test)
#   build-fuzz/     the libFuzzer targets: the dataset reader and its splits, the checkpoint reader, the metadata a
#                   load reads past the checksum, and a checkpoint folder's entries, 20 s each over their seeds
# Every configuration treats warnings in the project's own code as errors (STEALBATCH_WERROR=ON; a user's build does
# not). Exits non-zero on the first failing configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)
status=0

run_suite() {  # name, build dir, ctest args... [--then ctest args of a second pass...], -- cmake args...
  local name=$1 dir=$2; shift 2
  local ctest_args=() then_args=() cmake_args=()
  while [ $# -gt 0 ] && [ "$1" != "--" ] && [ "$1" != "--then" ]; do ctest_args+=("$1"); shift; done
  if [ "${1:-}" = "--then" ]; then
    shift
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do then_args+=("$1"); shift; done
  fi
  [ $# -gt 0 ] && shift
  cmake_args=("$@")
  echo "=== ${name}: configure and build (${dir})"
  local start=$SECONDS
  # Called as `run_suite ... || status=1`, where errexit is off: every step checks its own status.
  mkdir -p "$dir"
  cmake -S . -B "$dir" -G Ninja -DSTEALBATCH_WERROR=ON "${cmake_args[@]}" >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; return 1; }
  grep -E "^-- (stealbatch|  )" "$dir/configure.log" || true
  cmake --build "$dir" --parallel "$jobs" || return 1
  echo "=== ${name}: ctest"
  (cd "$dir" && ctest --output-on-failure "${ctest_args[@]}") || return 1
  if [ ${#then_args[@]} -gt 0 ]; then
    echo "=== ${name}: ctest ${then_args[*]}"
    (cd "$dir" && ctest --output-on-failure "${then_args[@]}") || return 1
  fi
  echo "=== ${name}: done in $((SECONDS - start)) s"
}

# Two at a time but for the `perf` tests (those that time the wall clock: step times, latencies, a deadline), which
# then run one at a time; tests that need the machine alone (MPI, the emulated cluster) say RUN_SERIAL.
run_suite "release" build -j "$jobs" -LE perf --then -L perf -- -DCMAKE_BUILD_TYPE=Release || status=1
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp" \
  run_suite "tsan" build-tsan -L "scheduler|runtime|data|models|checkpoint" -- -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTEALBATCH_SANITIZE=thread \
  -DSTEALBATCH_CUDA=OFF -DSTEALBATCH_MPI=OFF -DSTEALBATCH_TORCH=OFF -DSTEALBATCH_PERF=OFF -DSTEALBATCH_EXAMPLES=OFF || status=1
# The cross-rank runtime under ThreadSanitizer: its threads (devices claiming and stealing chunks through the window,
# the watch) on 2 ranks. Open MPI is not built with TSan: its internals are suppressed (tests/tsan-mpi.supp), and
# its UCX memory hooks, which crash under TSan at thread exit, are kept out (ob1, vader, osc sm).
run_tsan_mpi() {
  command -v mpirun >/dev/null || { echo "=== tsan-mpi: no mpirun, skipped"; return 0; }
  echo "=== tsan-mpi: configure and build (build-tsan-mpi)"
  local start=$SECONDS supp
  mkdir -p build-tsan-mpi
  cmake -S . -B build-tsan-mpi -G Ninja -DSTEALBATCH_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTEALBATCH_SANITIZE=thread -DSTEALBATCH_CUDA=OFF \
    -DSTEALBATCH_PERF=OFF -DSTEALBATCH_EXAMPLES=OFF -DSTEALBATCH_MPI=ON -DSTEALBATCH_TORCH=OFF >build-tsan-mpi/configure.log 2>&1 || { cat build-tsan-mpi/configure.log; return 1; }
  cmake --build build-tsan-mpi --target test_mpi_cluster --parallel "$jobs" || return 1
  supp=build-tsan-mpi/tsan-all.supp
  cat tests/tsan.supp tests/tsan-mpi.supp >"$supp"
  # probes on 4 ranks (posing as 2 nodes of 2: the drawn calls for work), the sums in two levels on 4 (ring-2: the ring
  # case with STEALBATCH_MPI_RING=2), the rest on 2.
  for c in exactly-once gradient identical checkpoint throw remote-steal long-but-alive costs deterministic bf16 probes ring-2; do
    local np=2 sums=1
    [ "$c" = probes ] && np=4
    [ "$c" = ring-2 ] && np=4 sums=2
    echo "=== tsan-mpi: $c on $np ranks"
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/$supp" SB_MPI_STEPS=1000 UCX_MEM_MMAP_HOOK_MODE=none STEALBATCH_MPI_RING=$sums \
      timeout 600 mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader --mca osc sm \
      -x TSAN_OPTIONS -x SB_MPI_STEPS -x UCX_MEM_MMAP_HOOK_MODE -x STEALBATCH_MPI_RING -np "$np" build-tsan-mpi/tests/mpi/test_mpi_cluster "${c%-2}" \
      >build-tsan-mpi/$c.log 2>&1 || { tail -60 build-tsan-mpi/$c.log; return 1; }
    grep -a "PASSED" build-tsan-mpi/$c.log || { tail -60 build-tsan-mpi/$c.log; return 1; }
  done
  echo "=== tsan-mpi: done in $((SECONDS - start)) s"
}
run_tsan_mpi || status=1
ASAN_OPTIONS="detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1" \
  run_suite "asan+ubsan" build-asan -LE package -- -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTEALBATCH_SANITIZE=address,undefined \
  -DSTEALBATCH_CUDA=OFF -DSTEALBATCH_MPI=OFF -DSTEALBATCH_TORCH=OFF -DSTEALBATCH_PERF=OFF -DSTEALBATCH_EXAMPLES=OFF || status=1

# The libFuzzer targets (clang, ASan+UBSan), each over its seed corpus for 20 seconds: the dataset reader (any
# exception other than DataError is a crash), the checkpoint reader (any other than CheckpointError), a dataset's
# four files cut from one input and checked as splits (DataError), a checkpoint's metadata rewritten past its
# checksum and loaded by the runtime (CheckpointError, and a runtime that still steps), and a checkpoint folder's
# entries (names, links, foreign files) listed and pruned (its order and what pruning keeps).
run_fuzz() {
  echo "=== fuzz: configure and build (build-fuzz)"
  local start=$SECONDS
  mkdir -p build-fuzz
  cmake -S . -B build-fuzz -G Ninja -DSTEALBATCH_WERROR=ON -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTEALBATCH_FUZZ=ON \
    -DSTEALBATCH_SANITIZE=address,undefined -DSTEALBATCH_CUDA=OFF -DSTEALBATCH_TESTS=OFF -DSTEALBATCH_EXAMPLES=OFF \
    -DSTEALBATCH_PERF=OFF -DSTEALBATCH_MPI=OFF -DSTEALBATCH_TORCH=OFF >build-fuzz/configure.log 2>&1 || { cat build-fuzz/configure.log; return 1; }
  cmake --build build-fuzz --target fuzz_idx fuzz_checkpoint fuzz_splits fuzz_checkpoint_metadata fuzz_checkpoint_dir --parallel "$jobs" || return 1
  local target seeds corpus
  for target in fuzz_idx:tests/fuzz/corpus fuzz_checkpoint:tests/fuzz/checkpoint_corpus fuzz_splits:tests/fuzz/splits_corpus \
    fuzz_checkpoint_metadata:tests/fuzz/metadata_corpus fuzz_checkpoint_dir:tests/fuzz/checkpoint_dir_corpus; do
    seeds=${target#*:} target=${target%%:*}
    corpus=$(mktemp -d)
    echo "=== fuzz: $target for 20 s over $seeds"
    build-fuzz/tests/fuzz/$target -max_total_time=20 -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 "$corpus" "$seeds" \
      >build-fuzz/$target.log 2>&1 || { tail -40 build-fuzz/$target.log; rm -rf "$corpus"; return 1; }
    grep -E "^stat::(number_of_executed_units|average_exec_per_sec|new_units_added)" build-fuzz/$target.log || true
    rm -rf "$corpus"
  done
  echo "=== fuzz: done in $((SECONDS - start)) s"
}
run_fuzz || status=1

if [ $status -ne 0 ]; then echo "=== FAILED: see the configuration above"; else echo "=== all configurations passed"; fi
exit $status

# python: the Python package. Python chunk functions against the C++ adapter on torch_mlp's MLP (threads in one
# process, and one process a device under mpirun; perf/python_vs_adapter.py, 3 interleaved rounds), then the Python
# transformer beside its DDP script on grouped and shuffled batches (examples/python/compare.py, 3 rounds). The Python
# is the build's (Debian's torch) for the first, TORCH_PYTHON (PyPI's torch, DDP's gloo) for the second when given.
# Last, with TORCH_PYTHON, the transformer launched four ways (perf/python_launches.sh: DDP and stealbatch under
# torchrun, stealbatch under mpirun, one process; 3 rounds).
section_python() {
  [ -d "$build/python/stealbatch" ] || skip "no Python package in this build (STEALBATCH_PYTHON: needs pybind11)"
  [ -x "$build/examples/torch_mlp" ] || skip "no examples/torch_mlp in this build (STEALBATCH_TORCH: needs libtorch)"
  local py
  py=$(sed -n 's/^Python3_EXECUTABLE:FILEPATH=//p' "$build/CMakeCache.txt")
  {
    echo "# python: $(machine)"
    PYTHONPATH="$build/python" "${py:-python3}" perf/python_vs_adapter.py --build "$build" --devices cpu:2,cpu:4 --rounds 3 --epochs 3 --ranks
    PYTHONPATH="$build/python" "${TORCH_PYTHON:-${py:-python3}}" examples/python/compare.py --build "$build" --rounds 3 --epochs 3 --limit 512
    if [ -n "${TORCH_PYTHON:-}" ]; then
      bash perf/python_launches.sh --build "$build" --python "$TORCH_PYTHON" --rounds 3
    else
      echo "the launches (torchrun against mpirun and DDP): skipped (TORCH_PYTHON)"
    fi
  } | tee "$out/python.txt"
  return "${PIPESTATUS[0]}"
}

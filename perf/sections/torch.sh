# torch: the examples against PyTorch (2 threads) and DDP (4 processes), interleaved, and the default runs' accuracy.
section_torch() {
  [ -n "${TORCH_PYTHON:-}" ] || skip "set TORCH_PYTHON to a Python with torch"
  python3 perf/compare_torch.py --torch-python "$TORCH_PYTHON" --build "$build" --runs 3 --accuracy --json "$out/compare_torch.json" \
    | tee "$out/compare_torch.txt"
}

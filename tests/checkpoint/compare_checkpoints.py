#!/usr/bin/env python3
"""Compares the parameter tensors (not the optimizer's) of two stealbatch checkpoints: bit-identical, or the largest
difference relative to each tensor's largest magnitude. Standard library only.

  compare_checkpoints.py A.safetensors B.safetensors [--bitwise]   exit 1 when --bitwise and they differ
"""
import json
import math
import struct
import sys


def tensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__" or name.startswith("optimizer."):
            continue
        b, end = e["data_offsets"]
        out[name] = data[b:end]
    return out, header.get("__metadata__", {})


def main():
    a, ma = tensors(sys.argv[1])
    b, mb = tensors(sys.argv[2])
    bitwise = "--bitwise" in sys.argv
    if sorted(a) != sorted(b):
        print(f"different tensors: {sorted(a)} against {sorted(b)}")
        return 1
    same, worst = True, 0.0
    for name in a:
        if a[name] == b[name]:
            continue
        same = False
        va = struct.unpack(f"<{len(a[name]) // 4}f", a[name])
        vb = struct.unpack(f"<{len(b[name]) // 4}f", b[name])
        if not all(math.isfinite(x) for x in va + vb):  # max() passes over a NaN: a non-finite value is the worst
            worst = math.inf
            continue
        scale = max(max(abs(x) for x in va), 1e-30)
        worst = max(worst, max(abs(x - y) for x, y in zip(va, vb)) / scale)
    print(f"parameters: {'bit-identical' if same else f'largest difference {worst:.3g} of the tensor scale'}"
          f" (steps {ma.get('step')} and {mb.get('step')})")
    return 1 if bitwise and not same else 0


if __name__ == "__main__":
    sys.exit(main())

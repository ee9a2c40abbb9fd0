#!/usr/bin/env python3
"""A stealbatch checkpoint read by PyTorch: trains the mlp (or cnn) example with --save, loads its newest checkpoint
with safetensors.torch.load_file into the same model written as torch.nn layers (perf/torch_ref.py), and compares
PyTorch's test accuracy with the example's. safetensors and torch are measuring peers, installed by hand in a
virtual environment outside the repository (pip install torch safetensors); nothing in the build or tests needs them.

  python3 perf/checkpoint_interop.py --torch-python ~/torch-venv/bin/python [--build build] [--model mlp] [--epochs 1]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# The examples' tensor names on torch_ref's nn.Sequential models.
NAMES = {
    "mlp": {"fc1": "0", "fc2": "2", "fc3": "4"},
    "cnn": {"conv1": "1", "conv2": "4", "fc1": "8", "fc2": "10"},
}


def check(a):
    """Runs under the torch Python: loads the file, maps its names, returns PyTorch's test accuracy."""
    sys.path.insert(0, HERE)
    import torch
    import torch_ref
    from safetensors import safe_open
    from safetensors.torch import load_file

    tensors = load_file(a.check)
    with safe_open(a.check, framework="pt") as f:
        meta = f.metadata()
    model = torch_ref.mlp() if a.model == "mlp" else torch_ref.cnn()
    state = {}
    for name, t in tensors.items():
        if name.startswith("optimizer."):
            continue
        layer, kind = name.split(".")
        state[f"{NAMES[a.model][layer]}.{kind}"] = t
    model.load_state_dict(state, strict=True)  # every name and shape as torch's own model has them
    x, y = torch_ref.load(a.data, "test")
    acc = torch_ref.accuracy(model, x, y)
    optimizer = sorted({n.rsplit(".", 1)[1] for n in tensors if n.startswith("optimizer.")})
    print(json.dumps({"accuracy": acc, "tensors": len(tensors), "optimizer_state": optimizer, "metadata": meta}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--torch-python", help="a Python with torch and safetensors (required unless --check)")
    p.add_argument("--build", default="build")
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--devices", default="cpu:2")
    p.add_argument("--check", help=argparse.SUPPRESS)  # internal: the file to check, under the torch Python
    a = p.parse_args()
    if a.check:
        check(a)
        return
    if not a.torch_python:
        p.error("--torch-python is required")
    with tempfile.TemporaryDirectory() as d:
        ckpt, out = os.path.join(d, "ckpt"), os.path.join(d, "run.json")
        cmd = [os.path.join(a.build, "examples", a.model), "--devices", a.devices, "--epochs", str(a.epochs), "--data", a.data,
               "--save", ckpt, "--json", out]
        print("#", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ours = json.load(open(out))["test_accuracy"]
        latest = sorted(f for f in os.listdir(ckpt) if f.startswith("step-"))[-1]
        r = subprocess.run([a.torch_python, __file__, "--model", a.model, "--data", a.data, "--check", os.path.join(ckpt, latest)], check=True,
                           capture_output=True, text=True)
        theirs = json.loads(r.stdout.strip().splitlines()[-1])
    diff = abs(theirs["accuracy"] - ours)
    print(f"# {a.model}: {a.epochs} epochs on {a.devices}; {latest} ({theirs['tensors']} tensors, optimizer state {theirs['optimizer_state']}),"
          f" metadata {sorted(theirs['metadata'])}")
    print(f"{a.model} test accuracy: stealbatch {ours:.4f}, PyTorch from the checkpoint {theirs['accuracy']:.4f}, difference {diff:.4f}"
          f" (target <= 0.001): {'ok' if diff <= 0.001 else 'MISSED'}")
    sys.exit(0 if diff <= 0.001 else 1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Python chunk functions against the C++ libtorch adapter, on the same module, data and batch: the MLP of torch_mlp
(784-256-128-10, Fashion-MNIST, batch 1024, Adam) trained by the stealbatch Python package (stealbatch.Runtime, the
loss a Python function) and by the torch_mlp example (ModuleChunks, C++). Rounds alternate between the two; each
round is one process per side running --epochs epochs; the figure is each epoch's samples/s past the first, the
median over rounds, and the ratio of medians. It shows whether the GIL serialises the devices: the Python side's
workers each take the GIL for their chunk's Python and release it inside torch.

  build/python/python3 perf/python_vs_adapter.py --build build --devices cpu:2,cpu:4 [--rounds 3] [--epochs 3] [--ranks]

--ranks adds the other way to keep Python's devices apart: one process a device, started by mpirun and joined by
the runtime's cross-rank stealing (cluster="mpi"), no GIL shared.
"""
import argparse
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = "/usr/share/datasets/fashion-mnist"


def load_fashion_mnist(torch):
    def read(name, header):
        with gzip.open(os.path.join(DATA, name)) as f:
            return f.read()[header:]
    x = torch.frombuffer(bytearray(read("train-images-idx3-ubyte.gz", 16)), dtype=torch.uint8).float().div_(255).view(-1, 784)
    y = torch.frombuffer(bytearray(read("train-labels-idx1-ubyte.gz", 8)), dtype=torch.uint8).long()
    return x, y


def python_side(a):
    """One run of the package: prints each epoch's samples/s."""
    import torch
    import torch.nn.functional as F
    import stealbatch as sb
    torch.manual_seed(a.seed)
    x, y = load_fashion_mnist(torch)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    rank, world, _ = sb.launch_environment()
    # Under mpirun: one device a rank, the cores shared out among the ranks.
    threads = max(1, (os.cpu_count() or 1) // world) if world > 1 else 0
    rt = sb.Runtime(model, devices=a.python, optimizer="adam", lr=0.003, threads_per_device=threads)

    def loss_fn(m, xb, yb):
        return F.cross_entropy(m(xb), yb, reduction="sum")

    g = torch.Generator().manual_seed(a.seed)
    for epoch in range(a.epochs):
        order = torch.randperm(x.shape[0], generator=g)
        t0 = time.perf_counter()
        loss = 0.0
        for b in range(0, x.shape[0], a.batch):
            loss = rt.step(order[b:b + a.batch], loss_fn, data=(x, y)).loss
        dt = time.perf_counter() - t0
        if rank == 0:
            print(f"epoch {epoch + 1} {x.shape[0] / dt:.0f} samples/s loss {loss:.4f}", flush=True)


def run_python(a, devices, ranks=1):
    cmd = [sys.executable, os.path.abspath(__file__), "--python", devices, "--epochs", str(a.epochs), "--batch", str(a.batch)]
    if ranks > 1:  # one process a device, joined through MPI (cross-rank stealing)
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), "-x", "PYTHONPATH"] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"python side failed:\n{out.stderr[-3000:]}")
    return [float(m.group(1)) for m in re.finditer(r"^epoch \d+ (\d+) samples/s", out.stdout, re.M)]


def run_cpp(a, devices):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.json")
        cmd = [os.path.join(a.build, "examples", "torch_mlp"), "--devices", devices, "--epochs", str(a.epochs), "--batch", str(a.batch),
               "--json", path]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            sys.exit(f"torch_mlp failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
        with open(path) as f:
            run = json.load(f)["runs"][0]
    return [60000 / s for s in run["epoch_seconds"]]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--devices", default="cpu:2,cpu:4", help="comma-separated cpu:N specs, each measured")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ranks", action="store_true", help="also one process a device under mpirun (cross-rank stealing)")
    p.add_argument("--python", help=argparse.SUPPRESS)  # internal: run the package's side on these devices
    a = p.parse_args()
    if a.epochs < 2 or a.rounds < 1 or a.batch < 1:
        p.error("--epochs must be at least 2 (the first is warm-up), --rounds and --batch at least 1")
    if a.python:
        return python_side(a)
    sys.path.insert(0, HERE)
    import machine_info
    specs = re.findall(r"cpu:\d+", a.devices)
    if not specs or ",".join(specs) != a.devices:
        p.error(f"--devices '{a.devices}': a comma-separated list of cpu:N")
    print(f"# python_vs_adapter: {machine_info.cpu_model()}, {os.cpu_count()} cores, commit {machine_info.commit()}, "
          f"batch {a.batch}, {a.epochs} epochs x {a.rounds} rounds (epochs past the first)")
    print(f"{'devices':8} {'python, threads':>16} {'python, ranks':>14} {'C++ adapter':>12} {'threads/C++':>12} {'ranks/C++':>10}  (samples/s)")
    for spec in specs:
        n = int(spec.split(":")[1])
        py, ranks, cpp = [], [], []
        for _ in range(a.rounds):
            py += run_python(a, spec)[1:]
            if a.ranks and n > 1:
                ranks += run_python(a, "cpu:1", ranks=n)[1:]
            cpp += run_cpp(a, spec)[1:]
        mp, mc = statistics.median(py), statistics.median(cpp)
        mr = statistics.median(ranks) if ranks else float("nan")
        print(f"{spec:8} {mp:16.0f} {mr:14.0f} {mc:12.0f} {mp / mc:12.2f} {mr / mc:10.2f}", flush=True)


if __name__ == "__main__":
    main()

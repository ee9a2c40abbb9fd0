#!/usr/bin/env python3
"""stealbatch's examples against PyTorch on this machine, interleaved run by run, with the ratios.

  python3 perf/compare_torch.py --torch-python /path/to/venv/bin/python [--runs 3] [--json FILE]

PyTorch is a measuring peer, installed by hand from PyPI into a virtual environment outside the repository
(python3 -m venv ~/torch-venv && ~/torch-venv/bin/pip install torch numpy); nothing in the build or the tests
needs it. Each row runs ours and theirs alternately --runs times on the same model, data, batch, optimizer,
threads and sample order (perf/torch_ref.py); a run's figure is samples/s over its median epoch after the first,
and the row's is the median over runs:

  mlp cpu:2            mlp --devices cpu:2                 vs torch_ref.py cpu --model mlp --threads 2
  cnn cpu:2            cnn --devices cpu:2                 vs torch_ref.py cpu --model cnn --threads 2
  mlp cpu:4 slowed     mlp --devices cpu:4 --slowdown S    vs torch_ref.py ddp --procs 4 --slowdown S (gloo)
  mlp cpu:4            mlp --devices cpu:4                 vs torch_ref.py ddp --procs 4
  mpi slowed           mpirun -np 4 mlp --devices cpu:1 --slowdown S   vs torch_ref.py ddp --procs 4 --slowdown S
  mpi                  mpirun -np 4 mlp --devices cpu:1                vs torch_ref.py ddp --procs 4

The last two (--rows mpi-slowed,mpi) run ours as 4 MPI processes, one CPU device each, as DDP runs.

With --accuracy it also trains mlp and cnn for their default epochs once and reports the test accuracy.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from machine_info import commit, cpu_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLOW = "6.6,6.6,1,1"


def run(cmd, out_json):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"compare_torch: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    with open(out_json) as f:
        return json.load(f)


MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "4"]


def ours(build, example, args, tmp, launcher=()):
    path = os.path.join(tmp, "ours.json")
    j = run([*launcher, os.path.join(build, "examples", example), *args, "--json", path], path)
    r = j["runs"][-1]
    e = r["epoch_seconds"]
    timed = e[1:] if len(e) > 1 else e
    per_epoch = r["samples_per_s"] * sum(e) / len(e)  # the run's samples over its epochs
    return {"samples_per_s": per_epoch / statistics.median(timed), "utilization": r["utilization"], "chunk_samples": r.get("chunk_samples"),
            "test_accuracy": j["test_accuracy"], "kernels": j.get("kernels")}


def theirs(python, args, tmp):
    path = os.path.join(tmp, "theirs.json")
    j = run([python, os.path.join(ROOT, "perf", "torch_ref.py"), *args, "--json", path], path)
    return j


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torch-python", required=True, help="a Python with torch installed (a virtual environment outside the repository)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mlp-epochs", type=int, default=3)
    ap.add_argument("--cnn-epochs", type=int, default=2)
    ap.add_argument("--rows", default="mlp,cnn,slowed,ddp", help="which rows: mlp, cnn, slowed, ddp, mpi-slowed, mpi")
    ap.add_argument("--accuracy", action="store_true", help="also train mlp and cnn for their default epochs once")
    ap.add_argument("--json", help="write the table as JSON")
    a = ap.parse_args()
    me, ce = str(a.mlp_epochs), str(a.cnn_epochs)
    rows = {
        "mlp": ("mlp cpu:2", ("mlp", ["--devices", "cpu:2", "--epochs", me]), ["cpu", "--model", "mlp", "--threads", "2", "--epochs", me], 1.0),
        "cnn": ("cnn cpu:2", ("cnn", ["--devices", "cpu:2", "--epochs", ce]), ["cpu", "--model", "cnn", "--threads", "2", "--epochs", ce], 1.0),
        "slowed": (f"mlp cpu:4, slowdown {SLOW}, vs DDP", ("mlp", ["--devices", "cpu:4", "--slowdown", SLOW, "--epochs", me]),
                   ["ddp", "--model", "mlp", "--procs", "4", "--slowdown", SLOW, "--epochs", me], 3.0),
        "ddp": ("mlp cpu:4 vs DDP", ("mlp", ["--devices", "cpu:4", "--epochs", me]), ["ddp", "--model", "mlp", "--procs", "4", "--epochs", me], 1.0),
        "mpi-slowed": (f"mlp 4 ranks x cpu:1, slowdown {SLOW}, vs DDP", ("mlp", ["--devices", "cpu:1", "--slowdown", SLOW, "--epochs", me], MPIRUN),
                       ["ddp", "--model", "mlp", "--procs", "4", "--slowdown", SLOW, "--epochs", me], 3.0),
        "mpi": ("mlp 4 ranks x cpu:1 vs DDP", ("mlp", ["--devices", "cpu:1", "--epochs", me], MPIRUN),
                ["ddp", "--model", "mlp", "--procs", "4", "--epochs", me], 1.0),
    }
    version = subprocess.run([a.torch_python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True).stdout.strip()
    print(f"# compare_torch: stealbatch {commit()} against PyTorch {version}, {os.cpu_count()} cores, {cpu_model()}")
    print(f"# {a.runs} interleaved runs a row; samples/s over a run's median epoch after the first; the row: medians over runs")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for key in a.rows.split(","):
            name, ours_cmd, targs, bar = rows[key]
            example, args, launcher = (*ours_cmd, ())[:3]
            mine, peer = [], []
            last = None
            for _ in range(a.runs):
                last = ours(a.build, example, args, tmp, launcher)
                mine.append(last["samples_per_s"])
                peer.append(theirs(a.torch_python, targs, tmp)["samples_per_s"])
            m, p = statistics.median(mine), statistics.median(peer)
            row = {"row": name, "ours": m, "theirs": p, "ratio": m / p, "target": bar, "ours_runs": mine, "theirs_runs": peer,
                   "utilization": last["utilization"], "chunk_samples": last["chunk_samples"], "kernels": last["kernels"]}
            results.append(row)
            util = ", ".join(f"{u:.2f}" for u in last["utilization"])
            print(f"{name:<40} {m:>10.0f} {p:>10.0f} {m / p:>7.2f}x  (target >= {bar:.1f}x; last run's utilization {util}; "
                  f"chunks {last['chunk_samples']})", flush=True)
        if a.accuracy:
            for example, bar in (("mlp", 0.88), ("cnn", 0.91)):
                r = ours(a.build, example, ["--devices", "cpu:2"], tmp)
                results.append({"row": f"{example} accuracy (default epochs)", "test_accuracy": r["test_accuracy"], "target": bar})
                print(f"{example} test accuracy after its default epochs: {r['test_accuracy']:.4f} (target >= {bar})", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"commit": commit(), "torch": version, "cpu": cpu_model(), "cores": os.cpu_count(), "rows": results}, f, indent=2)


if __name__ == "__main__":
    main()

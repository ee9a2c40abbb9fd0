#!/usr/bin/env python3
"""The Python example beside its DDP script, in one run: torch_lm's documents exported in grouped and shuffled order,
then train_ddp.py (one process a rank, gloo, started as torchrun starts them on one node) and train_stealbatch.py
(one process, one device a rank's share) alternately, --rounds times each. Prints each one's tokens/s (median epoch
after the first, the median over rounds), their ratio, and both validation bits/byte.

  build/python/python3 examples/python/compare.py --build build [--devices 2] [--rounds 3] [--limit 512]
"""
import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def result(out, who):
    m = re.search(r"^result: (\d+) tokens/s .* validation bits/byte ([\d.]+)", out, re.M)
    if not m:
        sys.exit(f"compare: {who} printed no result:\n{out[-3000:]}")
    return float(m.group(1)), float(m.group(2))


def run_ddp(a, work):
    """torchrun's single-node start, by hand (Debian's torch 1.13 torchrun fails on Python 3.11): RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR and MASTER_PORT for each of --devices processes."""
    port, procs = free_port(), []
    for rank in range(a.devices):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(a.devices), LOCAL_WORLD_SIZE=str(a.devices),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([a.python, os.path.join(HERE, "train_ddp.py"), "--work", work], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=3600)[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        sys.exit("compare: train_ddp.py failed:\n" + "\n".join(o[-2000:] for o in outs))
    return result(outs[0], "train_ddp.py")


def run_stealbatch(a, work):
    out = subprocess.run([a.python, os.path.join(HERE, "train_stealbatch.py"), "--work", work, "--devices", f"cpu:{a.devices}"],
                         capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        sys.exit(f"compare: train_stealbatch.py failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return result(out.stdout, "train_stealbatch.py")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build with examples/torch_lm")
    p.add_argument("--python", default=sys.executable, help="the Python (and so the torch) both scripts run on")
    p.add_argument("--devices", type=int, default=2, help="DDP's processes, stealbatch's CPU devices")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--limit", type=int, default=512, help="training documents")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--orders", default="grouped,shuffled")
    a = p.parse_args()
    if a.devices < 1 or a.rounds < 1 or a.epochs < 1:
        p.error("--devices, --rounds and --epochs must be at least 1")
    sys.path.insert(0, os.path.join(ROOT, "perf"))
    import machine_info
    torch_version = subprocess.run([a.python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True).stdout.strip()
    print(f"# compare: {machine_info.cpu_model()}, {os.cpu_count()} cores, commit {machine_info.commit()}, torch {torch_version}, "
          f"{a.limit} documents, {a.epochs} epochs, {a.rounds} rounds, {a.devices} devices / DDP processes", flush=True)
    print(f"{'order':9} {'DDP tokens/s':>13} {'stealbatch':>11} {'ratio':>6}  bits/byte DDP, stealbatch", flush=True)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for order in a.orders.split(","):
            work = os.path.join(tmp, f"{order}.json")
            export = [os.path.join(a.build, "examples", "torch_lm"), "--devices", f"cpu:{a.devices}", "--limit", str(a.limit),
                      "--epochs", str(a.epochs), "--order", order, "--export", work]
            out = subprocess.run(export, capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                sys.exit(f"compare: {' '.join(export)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
            ddp, ours = [], []
            for _ in range(a.rounds):
                ddp.append(run_ddp(a, work))
                ours.append(run_stealbatch(a, work))
            d, s = statistics.median(r[0] for r in ddp), statistics.median(r[0] for r in ours)
            print(f"{order:9} {d:13.0f} {s:11.0f} {s / d:5.2f}x  {ddp[-1][1]:.4f}, {ours[-1][1]:.4f}", flush=True)
            # The same model, batches and Adam from the same weights: the same held-out bits/byte, within float sums'
            # order (the runtime sums a batch's chunks in another order than DDP's two halves).
            if abs(ddp[-1][1] - ours[-1][1]) > 1e-3:
                failed = True
                print(f"compare: {order}: bits/byte {ours[-1][1]:.4f} with stealbatch, {ddp[-1][1]:.4f} with DDP: more than 0.001 apart",
                      file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

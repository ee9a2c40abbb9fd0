#!/usr/bin/env python3
"""torch_lm's transformer trained with stealbatch: train_ddp.py with the lines marked "# stealbatch" changed. One
process drives its devices; idle devices steal documents from busy ones; each step's gradient is the whole batch's.

  build/examples/torch_lm --export run.json [--order grouped|shuffled] ...     the documents, orders and settings
  build/python/python3 examples/python/train_stealbatch.py --work run.json --devices cpu:2
"""
import argparse
import math
import os
import statistics
import sys
import time

import stealbatch as sb  # stealbatch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lm_model import bits_per_byte, cosine_lr, load_run, make_model, summed_loss  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, help="torch_lm --export's file: the documents, orders and settings")
    p.add_argument("--epochs", type=int, default=0, help="at most this many of the run's epochs (0: all)")
    p.add_argument("--devices", default="cpu:2", help="stealbatch's devices: cpu:N, cuda:all, vgpu:...")  # stealbatch
    a = p.parse_args()
    run = load_run(a.work)
    model = make_model(run)
    rt = sb.Runtime(model, devices=a.devices, optimizer="adam", lr=run["lr"])  # stealbatch
    docs, batch = run["train"], run["batch"]
    orders = run["orders"][:a.epochs or None]
    total, step, epochs, tokens = len(orders) * math.ceil(len(docs) / batch), 0, [], sum(len(d) for d in docs)
    for epoch, order in enumerate(orders, 1):
        t0 = time.perf_counter()
        for start in range(0, len(order), batch):
            ids = order[start:start + batch]
            lr = cosine_lr(run["lr"], step, total) if run["schedule"] == "cosine" else run["lr"]
            rt.lr = lr  # stealbatch
            report = rt.step(ids, lambda m, chunk: summed_loss(m, [docs[i] for i in chunk.tolist()]),  # stealbatch
                             cost=[float(len(docs[i])) for i in ids])  # stealbatch: a document's cost, its bytes
            step += 1
            if step == 1:
                print(f"step 1: loss {report.loss:.4f}, {report.steals} chunks stolen", flush=True)  # stealbatch
        epochs.append(time.perf_counter() - t0)
        print(f"epoch {epoch}/{len(orders)}: {epochs[-1]:.3f} s, {tokens / epochs[-1]:.0f} tokens/s", flush=True)
    timed = epochs[1:] if len(epochs) > 1 else epochs
    bpb = bits_per_byte(rt.copy_to(), run["validation"])  # stealbatch
    print(f"result: {tokens / statistics.median(timed):.0f} tokens/s (median epoch), validation bits/byte {bpb:.4f}", flush=True)


if __name__ == "__main__":
    main()

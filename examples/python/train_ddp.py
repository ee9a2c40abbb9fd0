#!/usr/bin/env python3
"""torch_lm's transformer trained with PyTorch DDP: a plain DistributedDataParallel script, launched by torchrun.

  build/examples/torch_lm --export run.json [--order grouped|shuffled] ...     the documents, orders and settings
  torchrun --nproc_per_node 2 examples/python/train_ddp.py --work run.json

train_stealbatch.py is this script with the lines marked "# DDP" changed: the same model, documents, batches, order
and Adam, each batch's exact gradient.
"""
import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist  # DDP
from torch.nn.parallel import DistributedDataParallel  # DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lm_model import bits_per_byte, cosine_lr, load_run, make_model, summed_loss  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, help="torch_lm --export's file: the documents, orders and settings")
    p.add_argument("--epochs", type=int, default=0, help="at most this many of the run's epochs (0: all)")
    a = p.parse_args()
    run = load_run(a.work)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # DDP
    rank, world = dist.get_rank(), dist.get_world_size()  # DDP
    model = DistributedDataParallel(make_model(run))  # DDP
    opt = torch.optim.Adam(model.parameters(), lr=run["lr"])  # DDP
    docs, batch = run["train"], run["batch"]
    orders = run["orders"][:a.epochs or None]
    total, step, epochs, tokens = len(orders) * math.ceil(len(docs) / batch), 0, [], sum(len(d) for d in docs)
    for epoch, order in enumerate(orders, 1):
        t0 = time.perf_counter()
        for start in range(0, len(order), batch):
            ids = order[start:start + batch]
            lr = cosine_lr(run["lr"], step, total) if run["schedule"] == "cosine" else run["lr"]
            mine = ids[len(ids) * rank // world:len(ids) * (rank + 1) // world]  # DDP: this rank's equal share
            opt.param_groups[0]["lr"] = lr  # DDP
            opt.zero_grad(set_to_none=True)  # DDP
            loss = summed_loss(model, [docs[i] for i in mine]) * world / len(ids)  # DDP: the ranks' mean is the batch's
            loss.backward()  # DDP
            opt.step()  # DDP
            step += 1
            if step == 1:
                print(f"rank {rank}, step 1: loss {loss.item():.4f}", flush=True)
        epochs.append(time.perf_counter() - t0)
        if rank == 0:  # DDP
            print(f"epoch {epoch}/{len(orders)}: {epochs[-1]:.3f} s, {tokens / epochs[-1]:.0f} tokens/s", flush=True)
    timed = epochs[1:] if len(epochs) > 1 else epochs
    if rank == 0:  # DDP
        bpb = bits_per_byte(model.module, run["validation"])  # DDP
        print(f"result: {tokens / statistics.median(timed):.0f} tokens/s (median epoch), validation bits/byte {bpb:.4f}", flush=True)
    dist.destroy_process_group()  # DDP


if __name__ == "__main__":
    main()

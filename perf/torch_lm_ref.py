#!/usr/bin/env python3
"""PyTorch on torch_lm's work: the same byte-level causal transformer, documents, batches, order and optimizer, for
side-by-side figures. PyTorch is a measuring peer: install it by hand (pip, in a virtual environment outside the
repository); nothing in the build or the tests needs it.

  torch_lm --export run.json [torch_lm's flags]       writes the run: settings, documents, each epoch's order
  torch_lm_ref.py cpu --run run.json --threads 2      one process, N intra-op threads, each batch in one pass
  torch_lm_ref.py ddp --run run.json --procs 2 [--slowdown 2,1]
                                                      DistributedDataParallel over gloo, one thread per process;
                                                      each global batch split equally and in order (rank r takes
                                                      the r-th contiguous share, as stealbatch's static split does);
                                                      rank r idles (factor_r - 1) x the CPU time of its pass after
                                                      each step, as a slowed device does after each chunk

The model is torch_lm's TorchLm: token and position embeddings, pre-norm blocks (causal self-attention within each
document, a 4x GELU MLP), a final norm and a 256-way head, with attention written as torch_lm writes it (matmul,
masked softmax, matmul; libtorch 1.13 has no fused attention), documents packed end to end and attended one at a
time. Each mode prints one line per epoch and writes --json with the epoch times, tokens/s (median epoch, all but
the first when there are several) and the validation bits per byte.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "python"))
from torch_ref import spawn_ddp  # noqa: E402  (the same process start and slowdown as the examples' DDP peer)
from lm_model import bits_per_byte, cosine_lr, load_run, make_model, summed_loss  # noqa: E402  (torch_lm's model in PyTorch)


def train(run, model, rank=0, world=1, factor=1.0, log=print, mode="cpu"):
    docs, batch = run["train"], run["batch"]
    opt = torch.optim.Adam(model.parameters(), lr=run["lr"])
    steps_per_epoch = (len(docs) + batch - 1) // batch
    total, step, epochs = steps_per_epoch * run["epochs"], 0, []
    tokens = sum(len(d) for d in docs)
    for epoch, order in enumerate(run["orders"], 1):
        t0 = time.perf_counter()
        loss_sum = 0.0
        for start in range(0, len(order), batch):
            ids = order[start:start + batch]
            lo, hi = len(ids) * rank // world, len(ids) * (rank + 1) // world  # an equal split of the global batch
            if run["schedule"] == "cosine":
                for g in opt.param_groups:
                    g["lr"] = cosine_lr(run["lr"], step, total)
            step += 1
            c0 = time.thread_time()
            opt.zero_grad(set_to_none=True)
            # Summed over the rank's documents, over the global batch, times the ranks: DDP's mean over the ranks is
            # then the summed loss over the batch's documents, as the runtime's.
            loss = summed_loss(model, [docs[i] for i in ids[lo:hi]]) * (world / len(ids))
            loss.backward()  # DDP: the gradient AllReduce runs here
            compute = time.thread_time() - c0
            opt.step()
            loss_sum += loss.item() * len(ids) / world
            if factor > 1.0:
                time.sleep(compute * (factor - 1.0))
        epochs.append(time.perf_counter() - t0)
        log(f"[torch {mode} lm] epoch {epoch}/{run['epochs']} {epochs[-1]:.3f} s, {tokens / epochs[-1]:.0f} tokens/s")
    timed = epochs[1:] if len(epochs) > 1 else epochs
    return {"epoch_seconds": epochs, "tokens_per_s": tokens / statistics.median(timed),
            "validation_bits_per_byte": bits_per_byte(model.module if world > 1 else model, run["validation"])}


def run_cpu(a):
    torch.set_num_threads(a.threads)
    run = load_run(a.run)
    r = train(run, make_model(run))
    print(f"[torch cpu lm] {a.threads} threads: {r['tokens_per_s']:.0f} tokens/s, validation bits/byte {r['validation_bits_per_byte']:.4f}")
    return {"mode": "cpu", "threads": a.threads, "torch": torch.__version__, **r}


def ddp_worker(rank, a, factors, port, queue):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=a.procs)
    run = load_run(a.run)
    model = torch.nn.parallel.DistributedDataParallel(make_model(run))
    r = train(run, model, rank, a.procs, factors[rank], log=print if rank == 0 else (lambda *_: None), mode="ddp")
    queue.put((rank, r))
    torch.distributed.destroy_process_group()


def run_ddp(a):
    r0, factors = spawn_ddp(ddp_worker, a)
    print(f"[torch ddp lm] {a.procs} processes, slowdown {a.slowdown or 'none'}: {r0['tokens_per_s']:.0f} tokens/s, "
          f"validation bits/byte {r0['validation_bits_per_byte']:.4f}")
    return {"mode": "ddp", "procs": a.procs, "slowdown": factors, "torch": torch.__version__, **r0}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["cpu", "ddp"])
    ap.add_argument("--run", required=True, help="torch_lm --export's file")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="cpu mode: torch's intra-op threads")
    ap.add_argument("--procs", type=int, default=2, help="ddp mode: processes")
    ap.add_argument("--slowdown", default="", help="ddp mode: per-process slowdown factors, e.g. 2,1")
    ap.add_argument("--json", default="", help="write the result here")
    a = ap.parse_args()
    out = run_cpu(a) if a.mode == "cpu" else run_ddp(a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

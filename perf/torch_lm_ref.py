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
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ref import spawn_ddp  # noqa: E402  (the same process start and slowdown as the examples' DDP peer)


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def attend(self, x):
        b, l, w = x.shape
        dh = w // self.heads
        h = self.qkv(x).view(b, l, 3, self.heads, dh).permute(2, 0, 3, 1, 4)
        att = torch.matmul(h[0], h[1].transpose(-2, -1)) * (1.0 / math.sqrt(dh))
        later = torch.ones(l, l, dtype=torch.bool).triu(1)
        att = att.masked_fill(later, float("-inf")).softmax(-1)
        return self.proj(torch.matmul(att, h[2]).transpose(1, 2).reshape(b, l, w))

    def forward(self, x, lengths):
        y = self.ln1(x)
        x = x + torch.cat([self.attend(part) for part in y.split(lengths, 1)], 1)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TorchLm(nn.Module):
    def __init__(self, width, layers, heads, max_len):
        super().__init__()
        self.tok = nn.Embedding(256, width)
        self.pos = nn.Embedding(max_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256)

    def forward(self, tokens, positions, lengths):
        x = self.tok(tokens) + self.pos(positions)
        for b in self.blocks:
            x = b(x, lengths)
        return self.head(self.ln(x))


def packed(docs):
    """The documents end to end: tokens, positions, next-byte targets (-100 after each document's last byte)."""
    tokens, positions, targets, lengths = [], [], [], []
    for d in docs:
        tokens += d
        positions += range(len(d))
        targets += d[1:] + [-100]
        lengths.append(len(d))
    t = lambda v: torch.tensor([v], dtype=torch.long)
    return t(tokens), t(positions), t(targets), lengths


def summed_loss(model, docs):
    tokens, positions, targets, lengths = packed(docs)
    logits = model(tokens, positions, lengths)
    return F.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1), reduction="sum", ignore_index=-100)


def bits_per_byte(model, docs):
    with torch.no_grad():
        nats = sum(summed_loss(model, docs[i:i + 16]).item() for i in range(0, len(docs), 16))
    return nats / math.log(2) / sum(len(d) - 1 for d in docs)


def cosine_lr(lr, step, total):
    return max(1e-6, lr * 0.5 * (1.0 + math.cos(math.pi * step / total)))


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


def make_model(run):
    torch.manual_seed(run["seed"])
    m = run["model"]
    return TorchLm(m["width"], m["layers"], m["heads"], m["max_len"])


def load_run(path):
    with open(path) as f:
        run = json.load(f)
    if run.get("form") != "packed":
        sys.exit(f"torch_lm_ref: {path} was exported with --form {run.get('form')}; this peer runs the packed form")
    return run


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

#!/usr/bin/env python3
"""PyTorch on the same models, data, batch, optimizer and sample order as the examples, for side-by-side figures.
PyTorch is a measuring peer: install it by hand (pip, in a virtual environment outside the repository); nothing
in the build or the tests needs it.

  torch_ref.py gpu --data DIR --json F        one GPU: MLP and CNN samples/s at batch 256, fp32 (TF32 off), SGD,
                                              each step's batch gathered on the host and copied, as gpu_check does;
                                              and a variant with the data resident on the GPU
  torch_ref.py cpu --model mlp --threads 2    one process, N intra-op threads, --epochs epochs, Adam; the
                                              examples' epoch order (examples::epoch_order)
  torch_ref.py ddp --model mlp --procs 4 --slowdown 6.6,6.6,1,1
                                              DistributedDataParallel over gloo, one thread per process, each
                                              global batch split equally; rank r idles (factor_r - 1) x the CPU
                                              time of its forward and backward pass after each step, as a
                                              slowed device does after each chunk in the examples
  torch_ref.py ddp --procs 2 --rank R --master ADDR:PORT ...
                                              one rank of that run only, in this process (one per node of the
                                              emulated cluster: scripts/cluster.sh exec NODE ...); rank 0 prints

cpu and ddp print one line per epoch and write --json with the epoch times, samples/s (all epochs but the first)
and the test accuracy.
"""
import argparse
import gzip
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn

MASK = (1 << 64) - 1


def epoch_order(n, seed, epoch):
    """examples::epoch_order: Fisher-Yates with SplitMix64 from seed * 1000003 + epoch, j = (r * (i + 1)) >> 64."""
    order = list(range(n))
    state = (seed * 1000003 + epoch) & MASK
    for i in range(n - 1, 0, -1):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        j = (z * (i + 1)) >> 64
        order[i], order[j] = order[j], order[i]
    return np.array(order, dtype=np.int64)


def load_images(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    n, rows, cols = int.from_bytes(raw[4:8], "big"), int.from_bytes(raw[8:12], "big"), int.from_bytes(raw[12:16], "big")
    return np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, rows * cols).astype(np.float32) / 255.0


def load_labels(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    return np.frombuffer(raw, dtype=np.uint8, offset=8).astype(np.int64)


def load(data, split):
    prefix = "train" if split == "train" else "t10k"
    x = torch.from_numpy(load_images(f"{data}/{prefix}-images-idx3-ubyte.gz"))
    y = torch.from_numpy(load_labels(f"{data}/{prefix}-labels-idx1-ubyte.gz"))
    return x, y


def mlp(hidden=(256, 128)):
    layers, width = [], 784
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, 10))


def cnn():
    return nn.Sequential(
        nn.Unflatten(1, (1, 28, 28)),
        nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(1568, 128), nn.ReLU(), nn.Linear(128, 10))


# The examples' defaults (examples/mlp/main.cpp, examples/cnn/main.cpp).
DEFAULTS = {"mlp": {"batch": 1024, "lr": 0.003, "epochs": 10}, "cnn": {"batch": 64, "lr": 0.002, "epochs": 4}}


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        correct = sum(int((model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum()) for i in range(0, len(x), 1000))
    model.train()
    return correct / len(x)


def cosine_lr(lr, step, total):
    """The examples' schedule: cosine decay from --lr towards 0 over the run, floored at 1e-6."""
    return max(1e-6, lr * 0.5 * (1.0 + np.cos(np.pi * step / total)))


def train(a, model, x, y, xt, yt, rank=0, world=1, factor=1.0, log=print):
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    loss_fn = nn.CrossEntropyLoss()
    n = len(x)
    steps_per_epoch = (n + a.batch - 1) // a.batch
    total, step, epochs = steps_per_epoch * a.epochs, 0, []
    for epoch in range(1, a.epochs + 1):
        order = torch.from_numpy(epoch_order(n, a.seed, epoch))
        t0 = time.perf_counter()
        for start in range(0, n, a.batch):
            idx = order[start:start + a.batch]
            lo, hi = len(idx) * rank // world, len(idx) * (rank + 1) // world  # an equal split of the global batch
            xb, yb = x[idx[lo:hi]], y[idx[lo:hi]]
            for g in opt.param_groups:
                g["lr"] = cosine_lr(a.lr, step, total)
            step += 1
            c0 = time.thread_time()
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()  # DDP: the gradient AllReduce (mean over ranks) runs here
            compute = time.thread_time() - c0
            opt.step()
            if factor > 1.0:
                time.sleep(compute * (factor - 1.0))
        epochs.append(time.perf_counter() - t0)
        log(f"[torch {a.mode} {a.model}] epoch {epoch}/{a.epochs} {epochs[-1]:.3f} s, {n / epochs[-1]:.0f} samples/s")
    timed = epochs[1:] if len(epochs) > 1 else epochs
    return {"epoch_seconds": epochs, "samples_per_s": n / statistics.median(timed), "test_accuracy": accuracy(model, xt, yt)}


def make_model(a):
    torch.manual_seed(a.seed)
    return mlp(tuple(int(h) for h in a.hidden.split(","))) if a.model == "mlp" else cnn()


def header(a, extra):
    return {"mode": a.mode, "model": a.model, "torch": torch.__version__, "batch": a.batch, "lr": a.lr, "epochs": a.epochs, "limit": a.limit,
            **extra}


def run_cpu(a):
    torch.set_num_threads(a.threads)
    x, y = load(a.data, "train")
    if a.limit:
        x, y = x[:a.limit], y[:a.limit]
    xt, yt = load(a.data, "test")
    r = train(a, make_model(a), x, y, xt, yt)
    out = {**header(a, {"threads": a.threads}), **r}
    print(f"[torch cpu {a.model}] {r['samples_per_s']:.0f} samples/s (median epoch after the first), test accuracy {r['test_accuracy']:.4f}")
    return out


def ddp_worker(rank, a, factors, port, queue, addr="127.0.0.1"):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=a.procs)
    x, y = load(a.data, "train")
    if a.limit:
        x, y = x[:a.limit], y[:a.limit]
    xt, yt = load(a.data, "test")
    model = torch.nn.parallel.DistributedDataParallel(make_model(a))
    r = train(a, model, x, y, xt, yt, rank, a.procs, factors[rank], log=print if rank == 0 else (lambda *_: None))
    if queue is not None:
        queue.put((rank, r))
    torch.distributed.destroy_process_group()
    return r


def spawn_ddp(worker, a):
    """Starts a.procs processes of worker(rank, a, factors, port, queue), each slowed by its --slowdown factor, and
    returns rank 0's result and the factors (torch_lm_ref.py's DDP runs the same way)."""
    import torch.multiprocessing as mp
    factors = [float(f) for f in a.slowdown.split(",")] if a.slowdown else [1.0] * a.procs
    if len(factors) != a.procs:
        sys.exit(f"{os.path.basename(sys.argv[0])}: --slowdown has {len(factors)} factors for {a.procs} processes")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=worker, args=(r, a, factors, port, queue)) for r in range(a.procs)]
    for p in procs:
        p.start()
    results = dict(queue.get() for _ in procs)
    for p in procs:
        p.join()
    return results[0], factors


def run_ddp(a):
    if a.rank >= 0:
        factors = [float(f) for f in a.slowdown.split(",")] if a.slowdown else [1.0] * a.procs
        if len(factors) != a.procs or not 0 <= a.rank < a.procs or ":" not in a.master:
            sys.exit(f"{os.path.basename(sys.argv[0])}: --rank needs 0 <= rank < --procs, --master ADDR:PORT and one --slowdown factor per process")
        addr, port = a.master.rsplit(":", 1)
        r0 = ddp_worker(a.rank, a, factors, int(port), None, addr)
        if a.rank != 0:
            return {"rank": a.rank}
    else:
        r0, factors = spawn_ddp(ddp_worker, a)
    out = {**header(a, {"procs": a.procs, "slowdown": factors}), **r0}
    print(f"[torch ddp {a.model}] {a.procs} processes, slowdown {a.slowdown or 'none'}: {r0['samples_per_s']:.0f} samples/s "
          f"(median epoch after the first), test accuracy {r0['test_accuracy']:.4f}")
    return out


def time_gpu_model(make, x_host, y_host, x_dev, y_dev, batch, warmup, steps, resident):
    torch.manual_seed(0)
    model = make().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    n = x_host.shape[0]
    times = []
    for i in range(warmup + steps):
        idx = torch.arange(i * batch, (i + 1) * batch) % n
        t0 = time.perf_counter()
        if resident:
            xb, yb = x_dev[idx.cuda(non_blocking=True)], y_dev[idx.cuda(non_blocking=True)]
        else:
            xb = x_host[idx].pin_memory().cuda(non_blocking=True)
            yb = y_host[idx].pin_memory().cuda(non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb) / batch
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"step_ms_median": med * 1e3, "samples_per_s": batch / med}


def run_gpu(a):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    x, y = load(a.data, "train")
    x_host, y_host = x.pin_memory(), y.pin_memory()
    x_dev, y_dev = x.cuda(), y.cuda()
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "batch": a.batch, "steps": a.steps}
    for name, make in (("mlp", mlp), ("cnn", cnn)):
        for resident in (False, True):
            r = time_gpu_model(make, x_host, y_host, x_dev, y_dev, a.batch, 20, a.steps, resident)
            key = name + ("_resident" if resident else "")
            out[key] = r
            print(f"torch {key}: {r['step_ms_median']:.3f} ms/step, {r['samples_per_s']:.0f} samples/s", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", choices=("gpu", "cpu", "ddp"), default="gpu")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--json", default="torch_ref.json")
    ap.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    ap.add_argument("--hidden", default="256,128", help="the MLP's hidden sizes")
    ap.add_argument("--batch", type=int, help="default: the example's (mlp 1024, cnn 64; gpu mode 256)")
    ap.add_argument("--lr", type=float, help="default: the example's (mlp 0.003, cnn 0.002)")
    ap.add_argument("--epochs", type=int, help="default: the example's (mlp 10, cnn 4)")
    ap.add_argument("--limit", type=int, default=0, help="train on the first N samples only")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="cpu mode: intra-op threads")
    ap.add_argument("--procs", type=int, default=4, help="ddp mode: processes (one thread each)")
    ap.add_argument("--slowdown", default="", help="ddp mode: per-process slowdown factors, e.g. 6.6,6.6,1,1")
    ap.add_argument("--steps", type=int, default=100, help="gpu mode: timed steps")
    ap.add_argument("--rank", type=int, default=-1, help="ddp mode: run this rank only, in this process (with --master)")
    ap.add_argument("--master", default="", help="ddp mode with --rank: rank 0's ADDR:PORT")
    a = ap.parse_args()
    d = DEFAULTS[a.model]
    a.batch = a.batch or (256 if a.mode == "gpu" else d["batch"])
    a.lr = a.lr or d["lr"]
    a.epochs = a.epochs or d["epochs"]
    out = {"gpu": run_gpu, "cpu": run_cpu, "ddp": run_ddp}[a.mode](a)
    with open(a.json, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()

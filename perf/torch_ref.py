#!/usr/bin/env python3
"""PyTorch on the same models, data, batch, optimizer and sample order as the examples, for side-by-side figures.
PyTorch is a measuring peer: install it by hand (pip, in a virtual environment outside the repository); nothing
in the build or the tests needs it.

  torch_ref.py gpu --data DIR --json F        one GPU, fp32 (TF32 off), SGD: the MLP and the CNN at batch 256 and
                                              the wide MLP (784-2048-2048-10) at batch 16384, each step run by
                                              every peer below; samples/s of each, and the best one named
  torch_ref.py gpu --device cpu --peers eager,compile --models mlp --steps 5
                                              the same code on the CPU, to try it where there is no GPU (its figures
                                              are not the device check's)
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

gpu mode's peers (--peers, default all on cuda) are the ways a careful PyTorch user runs one training step:
  eager_host  eager, each batch gathered on the host, pinned and copied (gpu_check's host staging);
  eager       eager, the data set resident on the GPU, each batch gathered there by index;
  graph       the whole step, gather and optimizer included, captured once in one CUDA graph and replayed (PyTorch's
              whole-network capture recipe; see graph_peer). Without a CUDA device it is a usage error, never eager;
  compile     torch.compile of the gather, forward and loss, the optimizer step compiled too.
Its mode is "reduce-overhead" unless --compile-mode says otherwise. At batch 256 these steps are bound by kernel
launches, not by arithmetic (on the H200, eager 174-204k samples/s against 1.32M for the same step in one CUDA
graph): what removes launches is CUDA graphs, and reduce-overhead is Inductor's fused kernels replayed as CUDA graphs,
the mode PyTorch's documentation gives for small batches. "max-autotune-no-cudagraphs" keeps every launch and
benchmarks Triton templates against cuBLAS for each matmul shape while compiling, which on a cold cache costs minutes,
beyond the device check's budget, for fp32 GEMMs with TF32 off where cuBLAS is hard to beat; it is there by hand
(--compile-mode max-autotune-no-cudagraphs). The wide MLP at batch 16384 is bound by its GEMMs, where no mode gains
much: it has eager, graph and compile peers all the same, so that its row is judged against the best too.

Every peer trains the same model from the same seed on the same batches; its loss after the warm-up must agree with
eager's (the #wrong column), and the best peer is the fastest of those that agree. The JSON has "models" ->
NAME -> "peers" -> PEER (samples/s, its runs, ms/step, setup seconds, the loss check) and "best"; "errors" names each
peer that did not run and why. Exit status 1 when a peer failed or disagrees (the JSON is written all the same).
"""
import argparse
import gzip
import json
import math
import os
import statistics
import sys
import time
import traceback

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
    if a.bf16_hook:  # DDP's bfloat16 gradients on the wire (its buckets compressed before the allreduce)
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
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


# The gpu mode's peers: one training step (each batch gathered by index, forward, summed cross-entropy / batch,
# backward, SGD with momentum) run each way a careful PyTorch user would run it.
PEERS = {
    "eager_host": "eager; each batch gathered on the host, pinned and copied (gpu_check's host staging)",
    "eager": "eager; the data resident on the device, each batch gathered there by index",
    "graph": "the whole step (gather, forward, backward, optimizer) captured once in one CUDA graph, replayed",
    "compile": "torch.compile of the gather, forward and loss (--compile-mode); the optimizer step compiled too",
}
PEER_MODELS = {  # name: (what it is, how to make it); the batch comes from --batch, the wide MLP's from --wide-batch
    "mlp": ("MLP 784-256-128-10", lambda: mlp()),
    "cnn": ("CNN conv5x5x16-pool-conv5x5x32-pool-128-10", cnn),
    "wide": ("MLP 784-2048-2048-10", lambda: mlp((2048, 2048))),
}
SGD_LR, SGD_MOMENTUM = 0.01, 0.9
# PyTorch's recipe warms the step up on a side stream before capturing it ("Whole-network capture" in the CUDA
# semantics notes); it uses 3 iterations.
GRAPH_SIDE_STREAM_WARMUP = 3
# Every peer trains the same model from the same seed on the same batches, so the loss of the last warm-up step
# differs between peers only by summation order (about 1e-6 of it); a peer that dropped its updates (a replay that
# leaves the weights as they were captured) is off by far more: over the default 20 warm-up steps the MLP's and the
# CNN's loss fall by about 3.5% (2.300 to 2.220).
LOSS_AGREE_REL = 1e-3


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class DeviceData:
    """The training set on the host (pinned, on CUDA) and on the device, and each step's indices: step i of every peer
    trains on the samples (i * batch + k) mod n, k < batch, precomputed on the device so that no step copies them."""

    def __init__(self, x, y, device):
        self.device = device
        self.x_host = x.pin_memory() if device.type == "cuda" else x
        self.y_host = y.pin_memory() if device.type == "cuda" else y
        self.x, self.y = x.to(device), y.to(device)
        self.n = x.shape[0]

    def order(self, batch, total_steps):
        return (torch.arange(total_steps * batch, device=self.device) % self.n).view(total_steps, batch)


def make_sgd(params, device, compiled=False):
    # Fused SGD (one kernel for every parameter) on CUDA for the eager and graph peers; the compiled optimizer is the
    # default (foreach) one, which Inductor fuses itself (PyTorch's "torch.compile the optimizer" recipe).
    fused = device.type == "cuda" and not compiled
    return torch.optim.SGD(params, lr=SGD_LR, momentum=SGD_MOMENTUM, **({"fused": True} if fused else {}))


def eager_peer(model, data, order, batch, host):
    opt = make_sgd(model.parameters(), data.device)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    order_host = order.cpu() if host else None
    last = [None]

    def step(i):
        if host:
            idx = order_host[i]
            xb = data.x_host[idx].pin_memory().to(data.device, non_blocking=True)
            yb = data.y_host[idx].pin_memory().to(data.device, non_blocking=True)
        else:
            idx = order[i]
            xb, yb = data.x[idx], data.y[idx]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb) / batch
        loss.backward()
        opt.step()
        last[0] = loss

    return step, lambda: last[0].item()


def graph_peer(model, data, order, batch):
    """The whole step in one CUDA graph, by PyTorch's documented recipe (CUDA semantics notes, "CUDA Graphs" >
    "Whole-network capture": https://pytorch.org/docs/stable/notes/cuda.html#whole-network-capture): warm up on a side
    stream, set the gradients to None so that backward allocates them from the graph's private pool, capture forward,
    backward and optimizer.step() into static buffers, then for each batch copy its data into the static input and
    replay. The static input is the batch's index vector: the gather from the resident data set is captured too.
    SGD keeps no step count on the host, so it needs no capturable=True (Adam would); its momentum buffers exist
    after the warm-up, before the capture."""
    if data.device.type != "cuda":
        raise RuntimeError(f"the CUDA-graph peer needs a CUDA device, not {data.device}")
    opt = make_sgd(model.parameters(), data.device)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    static_idx = order[0].clone()

    def body():
        xb, yb = data.x.index_select(0, static_idx), data.y.index_select(0, static_idx)
        loss = loss_fn(model(xb), yb) / batch
        loss.backward()
        opt.step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(GRAPH_SIDE_STREAM_WARMUP):  # real batches: the warm-up steps the optimizer
            static_idx.copy_(order[i])
            opt.zero_grad(set_to_none=True)
            body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = body()

    def step(i):
        static_idx.copy_(order[i])
        graph.replay()

    return step, lambda: static_loss.item(), GRAPH_SIDE_STREAM_WARMUP


def compile_peer(model, data, order, batch, mode):
    """torch.compile of the gather, forward and loss, with the batch's indices in one static buffer as the graph peer
    has them, and the optimizer step compiled by PyTorch's recipe (https://pytorch.org/tutorials/recipes/compiling_optimizer.html).
    The data set and the index buffer are marked static, so that "reduce-overhead"'s CUDA graphs read them in place
    rather than copying them in before each replay; each step is marked as a new iteration for those graphs."""
    torch._dynamo.reset()  # one model's compiled code at a time, as in a user's own process
    opt = make_sgd(model.parameters(), data.device, compiled=True)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    static_idx = order[0].clone()
    for t in (data.x, data.y, static_idx):
        torch._dynamo.mark_static_address(t)

    def forward_loss(idx):
        return loss_fn(model(data.x[idx]), data.y[idx]) / batch

    forward_loss = torch.compile(forward_loss, mode=mode)

    @torch.compile(fullgraph=False)
    def opt_step():
        opt.step()

    mark_step = getattr(torch.compiler, "cudagraph_mark_step_begin", lambda: None)
    last = [None]

    def step(i):
        static_idx.copy_(order[i])
        mark_step()
        opt.zero_grad(set_to_none=True)
        loss = forward_loss(static_idx)
        loss.backward()
        opt_step()
        last[0] = loss

    return step, lambda: last[0].item()


def compile_precheck(device):
    """What Inductor needs besides torch, checked before a model is traced: a C compiler, and on CUDA the Python
    headers that Triton compiles its kernel launcher against. None when both are there, else what is missing."""
    import shutil
    import sysconfig
    if not (shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")):
        return "no C compiler (cc, gcc or clang on PATH, or $CC): Inductor compiles its kernels with one"
    include = sysconfig.get_paths()["include"]
    if device.type == "cuda" and not os.path.exists(os.path.join(include, "Python.h")):
        return f"no Python.h in {include}: Triton compiles its kernel launcher against the Python headers (python3-dev)"
    return None


def build_peer(peer, make, data, order, batch, a):
    """(step, loss, steps already taken): step(i) queues step i without waiting; loss() is the last step's loss."""
    torch.manual_seed(0)
    model = make().to(data.device)
    if peer in ("eager", "eager_host"):
        return (*eager_peer(model, data, order, batch, host=peer == "eager_host"), 0)
    if peer == "graph":
        return graph_peer(model, data, order, batch)
    why = compile_precheck(data.device)
    if why:
        raise RuntimeError(why)
    return (*compile_peer(model, data, order, batch, a.compile_mode), 0)


def first_line(e):
    """The exception's type and its first two non-empty lines (Inductor's errors name the failing backend first and the
    cause next), for the JSON and the summary."""
    lines = [l.strip() for l in str(e).splitlines() if l.strip()][:2]
    return f"{e.__class__.__name__}: {' | '.join(lines)}"[:300]


def run_peers(name, data, batch, steps, a, t_start, errors):
    """Builds each peer of one model and warms it up (capture and compilation happen there, untimed), checks that
    every peer's loss after the warm-up agrees with eager's, then times a.repeats runs of `steps` back-to-back steps
    of each peer, interleaved, with one sync a run (what a training loop that reads no loss does)."""
    what, make = PEER_MODELS[name]
    total = a.warmup + a.repeats * steps
    order = data.order(batch, total)
    built = {}
    for peer in a.peer_list:
        if peer == "eager_host" and name == "wide":
            continue  # the wide MLP's peer is the issue's: eager with the data on the GPU
        if peer == "compile" and a.budget_s and time.perf_counter() - t_start > a.budget_s:
            errors[f"{name}.{peer}"] = f"not built: {time.perf_counter() - t_start:.0f} s of --budget-s {a.budget_s:.0f} used before it"
            print(f"torch_ref: {name} {peer}: {errors[f'{name}.{peer}']}", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            step, loss, taken = build_peer(peer, make, data, order, batch, a)
            for i in range(taken, a.warmup):
                step(i)
            sync(data.device)
            built[peer] = {"step": step, "loss": loss(), "setup_s": time.perf_counter() - t0}
        except Exception as e:  # a peer that fails is reported, never replaced by another
            errors[f"{name}.{peer}"] = first_line(e)
            print(f"torch_ref: {name} {peer}: FAILED after {time.perf_counter() - t0:.1f} s: {errors[f'{name}.{peer}']}", flush=True)
            print("".join(traceback.format_exc().splitlines(keepends=True)[-12:]), end="", flush=True)
    runs = {p: [] for p in built}
    for rep in range(a.repeats):
        for peer, b in built.items():
            first = a.warmup + rep * steps
            sync(data.device)
            t0 = time.perf_counter()
            for i in range(first, first + steps):
                b["step"](i)
            sync(data.device)
            runs[peer].append(time.perf_counter() - t0)
    ref = built.get("eager", {}).get("loss")
    out = {"model": what, "batch": batch, "steps": steps, "repeats": a.repeats, "warmup": a.warmup, "peers": {}}
    for peer, b in built.items():
        med = statistics.median(runs[peer])
        diff = abs(b["loss"] - ref) / abs(ref) if ref is not None and ref != 0 else None
        agrees = math.isfinite(b["loss"]) and (diff is None or diff <= LOSS_AGREE_REL)
        out["peers"][peer] = {"samples_per_s": batch * steps / med, "samples_per_s_runs": [batch * steps / t for t in runs[peer]],
                              "step_ms_median": med / steps * 1e3, "setup_s": b["setup_s"], "loss_after_warmup": b["loss"],
                              "loss_rel_diff_vs_eager": diff, "agrees": agrees}
    ok = {p: r["samples_per_s"] for p, r in out["peers"].items() if r["agrees"]}
    if ok:
        best = max(ok, key=ok.get)
        out["best"] = {"peer": best, "samples_per_s": ok[best]}
    return out


def print_rows(name, r, errors):
    for peer in PEERS:
        p = r["peers"].get(peer)
        if p is None:
            if f"{name}.{peer}" in errors:
                print(f"  {name:<5} {r['batch']:>6}  {peer:<10}  {'missing: ' + errors[f'{name}.{peer}']}")
            continue
        diff = "-" if p["loss_rel_diff_vs_eager"] is None else f"{p['loss_rel_diff_vs_eager']:.1e}"
        runs = ",".join(f"{s:.0f}" for s in p["samples_per_s_runs"])
        print(f"  {name:<5} {r['batch']:>6}  {peer:<10}  {p['setup_s']:>7.1f}  {p['step_ms_median']:>8.3f}  {p['samples_per_s']:>11.0f}  "
              f"{runs:<26}  {p['loss_after_warmup']:>9.5f}  {diff:>8}  {0 if p['agrees'] else 1:>6}", flush=True)


def gpu_header(a, device):
    return {"mode": "gpu", "torch": torch.__version__, "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "batch": a.batch, "wide_batch": a.wide_batch, "steps": a.steps, "wide_steps": a.wide_steps, "repeats": a.repeats,
            "warmup": a.warmup, "peers_asked": a.peer_list, "compile_mode": a.compile_mode, "precision": "fp32, TF32 off",
            "cudnn_benchmark": device.type == "cuda", "optimizer": f"SGD lr {SGD_LR} momentum {SGD_MOMENTUM} (fused on CUDA; "
            "compiled: foreach)", "loss": "sum cross-entropy / batch", "loss_agree_rel": LOSS_AGREE_REL,
            "timing": "median of repeats, each steps back-to-back steps between two device syncs; warm-up untimed"}


def usage_error(msg):
    """Exit status 2 with one line naming what was wrong, before anything is loaded or written (as the perf tools do)."""
    print(f"{os.path.basename(sys.argv[0])}: {msg}", file=sys.stderr)
    sys.exit(2)


def check_peers(a, device):
    """Usage errors, before anything loads: the peers asked for, and the device they need."""
    a.peer_list = [p.strip() for p in a.peers.split(",") if p.strip()] if a.peers else (
        list(PEERS) if device.type == "cuda" else ["eager", "compile"])
    a.model_list = [m.strip() for m in a.models.split(",") if m.strip()]
    bad = [p for p in a.peer_list if p not in PEERS] + [m for m in a.model_list if m not in PEER_MODELS]
    if bad or not a.peer_list or not a.model_list:
        usage_error(f"gpu: --peers takes some of {','.join(PEERS)} and --models some of {','.join(PEER_MODELS)}; got {bad or 'none'}")
    if device.type == "cuda" and not torch.cuda.is_available():
        usage_error(f"gpu: no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda or 'none: a CPU-only build'}) sees none. "
                    "The peers run on cuda; to try the eager and compile peers' code on this machine: --device cpu --peers eager,compile")
    if device.type != "cuda" and "graph" in a.peer_list:
        usage_error(f"gpu: --peers graph needs --device cuda, not {device}: a CUDA graph captures CUDA work only, and the peer has no "
                    "eager stand-in")
    if device.type != "cuda" and "eager_host" in a.peer_list:
        usage_error(f"gpu: --peers eager_host needs --device cuda, not {device}: it copies each batch from the host to the GPU")


def run_gpu(a):
    try:
        device = torch.device(a.device)
    except RuntimeError as e:
        usage_error(f"gpu: --device {a.device}: {first_line(e)}; cuda, cuda:N or cpu would do")
    check_peers(a, device)
    if not os.access(os.path.dirname(os.path.abspath(a.json)), os.W_OK):
        usage_error(f"gpu: --json {a.json}: its folder is not writable")
    t_start = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = device.type == "cuda"  # fixed shapes: what a careful user turns on
    if device.type == "cpu":
        torch.set_num_threads(a.threads)
    x, y = load(a.data, "train")
    if a.limit:
        x, y = x[:a.limit], y[:a.limit]
    data = DeviceData(x, y, device)
    out, errors = gpu_header(a, device), {}
    out.update({"models": {}, "errors": errors})
    print(f"# torch_ref gpu: torch {torch.__version__} on {out['gpu'] or device}; {out['precision']}; cudnn.benchmark "
          f"{'on' if out['cudnn_benchmark'] else 'off'}; {out['optimizer']}; loss {out['loss']}")
    for peer in a.peer_list:
        print(f"#   {peer:<10} {PEERS[peer]}" + (f" (mode {a.compile_mode})" if peer == "compile" else ""))
    print(f"# each peer: {a.warmup} warm-up steps (untimed: capture and compilation happen there), then {a.repeats} runs of "
          f"{a.steps} (wide: {a.wide_steps}) back-to-back steps, peers interleaved, one sync a run; samples/s is the median run's")
    print(f"# wrong: 1 when the loss after the warm-up differs from eager's by more than {LOSS_AGREE_REL:g} of it")
    print(f"  {'model':<5} {'batch':>6}  {'peer':<10}  {'setup_s':>7}  {'ms/step':>8}  {'samples/s':>11}  {'runs (samples/s)':<26}  "
          f"{'loss@warm':>9}  {'vs eager':>8}  {'#wrong':>6}", flush=True)

    def write():
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)

    for name in a.model_list:
        wide = name == "wide"
        r = run_peers(name, data, a.wide_batch if wide else a.batch, a.wide_steps if wide else a.steps, a, t_start, errors)
        out["models"][name] = r
        print_rows(name, r, errors)
        write()  # each model's figures are kept even if a later one runs out of time
    wrong = sum(not p["agrees"] for r in out["models"].values() for p in r["peers"].values())
    best = "; ".join(f"{n} {r['best']['peer']} {r['best']['samples_per_s']:.0f}" for n, r in out["models"].items() if "best" in r)
    print(f"# best peer (samples/s): {best or 'none'}")
    print(f"# {wrong} peer(s) wrong, {len(errors)} missing{': ' + '; '.join(f'{k}: {v}' for k, v in errors.items()) if errors else ''}; "
          f"{time.perf_counter() - t_start:.1f} s")
    out["seconds"] = time.perf_counter() - t_start
    a.failed = bool(wrong or errors)
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
    ap.add_argument("--steps", type=int, default=100, help="gpu mode: timed steps a run, MLP and CNN")
    ap.add_argument("--device", default="cuda", help="gpu mode: cuda (the default), or cpu to try the eager and compile peers' code")
    ap.add_argument("--peers", default="", help=f"gpu mode: some of {','.join(PEERS)} (default: all on cuda, eager,compile on cpu)")
    ap.add_argument("--models", default="mlp,cnn,wide", help=f"gpu mode: some of {','.join(PEER_MODELS)}")
    ap.add_argument("--compile-mode", default="reduce-overhead", choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
                    help="gpu mode: torch.compile's mode for the compile peer")
    ap.add_argument("--repeats", type=int, default=3, help="gpu mode: timed runs of each peer, interleaved")
    ap.add_argument("--warmup", type=int, default=20, help="gpu mode: untimed steps of each peer before its runs")
    ap.add_argument("--wide-batch", type=int, default=16384, help="gpu mode: the wide MLP's batch")
    ap.add_argument("--wide-steps", type=int, default=20, help="gpu mode: the wide MLP's timed steps a run")
    ap.add_argument("--budget-s", type=float, default=0, help="gpu mode: build no compile peer once this many seconds have gone (0: no limit)")
    ap.add_argument("--rank", type=int, default=-1, help="ddp mode: run this rank only, in this process (with --master)")
    ap.add_argument("--master", default="", help="ddp mode with --rank: rank 0's ADDR:PORT")
    ap.add_argument("--bf16-hook", action="store_true", help="ddp mode: bf16_compress_hook (bfloat16 gradients on the wire)")
    a = ap.parse_args()
    d = DEFAULTS[a.model]
    a.batch = a.batch or (256 if a.mode == "gpu" else d["batch"])
    a.lr = a.lr or d["lr"]
    a.epochs = a.epochs or d["epochs"]
    if min(a.steps, a.repeats, a.wide_batch, a.wide_steps, a.batch) < 1 or a.warmup < GRAPH_SIDE_STREAM_WARMUP + 2:
        usage_error(f"--steps, --repeats, --batch, --wide-batch and --wide-steps must be at least 1, "
                    f"--warmup at least {GRAPH_SIDE_STREAM_WARMUP + 2} (the graph peer's side-stream warm-up and two replays)")
    a.failed = False
    out = {"gpu": run_gpu, "cpu": run_cpu, "ddp": run_ddp}[a.mode](a)
    with open(a.json, "w") as f:
        json.dump(out, f, indent=2)
    sys.exit(1 if a.failed else 0)


if __name__ == "__main__":
    main()

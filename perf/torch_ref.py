#!/usr/bin/env python3
"""The PyTorch side of perf/device_check.sh: the same MLP (784-256-128-10) and CNN as examples/common, batch 256,
fp32 (TF32 off), SGD with momentum, timed the way gpu_check times stealbatch: each step gathers its batch's rows
on the host from a pinned tensor, copies them to the GPU, runs forward, backward and the optimizer, and the
step ends with a synchronize. A second figure keeps the whole dataset on the GPU (no host gather or copy).

  python3 perf/torch_ref.py --data DIR --json torch_ref.json [--steps 100]
"""
import argparse
import gzip
import json
import statistics
import time

import numpy as np
import torch
import torch.nn as nn


def load_images(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    n, rows, cols = int.from_bytes(raw[4:8], "big"), int.from_bytes(raw[8:12], "big"), int.from_bytes(raw[12:16], "big")
    return np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, rows * cols).astype(np.float32) / 255.0


def load_labels(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    return np.frombuffer(raw, dtype=np.uint8, offset=8).astype(np.int64)


def mlp():
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def cnn():
    return nn.Sequential(
        nn.Unflatten(1, (1, 28, 28)),
        nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(1568, 128), nn.ReLU(), nn.Linear(128, 10))


def time_model(make, x_host, y_host, x_dev, y_dev, batch, warmup, steps, resident):
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--json", default="torch_ref.json")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=256)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    x = torch.from_numpy(load_images(f"{a.data}/train-images-idx3-ubyte.gz"))
    y = torch.from_numpy(load_labels(f"{a.data}/train-labels-idx1-ubyte.gz"))
    x_host, y_host = x.pin_memory(), y.pin_memory()
    x_dev, y_dev = x.cuda(), y.cuda()
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "batch": a.batch, "steps": a.steps}
    for name, make in (("mlp", mlp), ("cnn", cnn)):
        for resident in (False, True):
            r = time_model(make, x_host, y_host, x_dev, y_dev, a.batch, 20, a.steps, resident)
            key = name + ("_resident" if resident else "")
            out[key] = r
            print(f"torch {key}: {r['step_ms_median']:.3f} ms/step, {r['samples_per_s']:.0f} samples/s", flush=True)
    with open(a.json, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()

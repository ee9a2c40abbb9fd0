#!/usr/bin/env python3
"""The Python package on cuda:0 (perf/device_check.sh, step 4d): torch_gpu_check's MLP (784-256-128-10, batch 1024,
16,384 synthetic samples, Adam 1e-3) trained through stealbatch.Runtime with a Python loss, against

  - PyTorch's own gradient on the same GPU, from the same weights and batch (fp32: TF32 off): max relative error;
  - the C++ adapter's samples/s in torch_gpu_check's JSON (the same model, batch, warm-up and steps, run just before);
  - eager PyTorch in this process (the same batches, torch.optim.Adam), for scale.

  PYTHONPATH=BUILD python3 perf/python_gpu_check.py [--adapter-json torch_gpu_check.json] [--json out.json]
Exit status: 0 the figures within their bars (gradient 1e-5, 0.9x the adapter where its figure came); 1 otherwise.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

SAMPLES, BATCH, WARM = 16384, 1024, 60


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def summed(m, x, y):
    return F.cross_entropy(m(x), y, reduction="sum")


def batches(steps):
    g = torch.Generator().manual_seed(11)
    order = torch.randperm(SAMPLES, generator=g)
    return [order[(s * BATCH) % (SAMPLES - BATCH):(s * BATCH) % (SAMPLES - BATCH) + BATCH] for s in range(steps)]


def gradient_error(sb, x, y):
    torch.manual_seed(1)
    model = mlp()
    ref = mlp().cuda()
    ref.load_state_dict(model.state_dict())
    ids = batches(1)[0]
    rt = sb.Runtime(model, devices="cuda:0")
    rt.compute_gradient(ids, summed, data=(x, y))
    torch.cuda.synchronize()
    F.cross_entropy(ref(x[ids.cuda()]), y[ids.cuda()]).backward()
    want = torch.cat([p.grad.reshape(-1) for p in ref.parameters()]).cpu()
    return ((rt.gradient() - want).abs().max() / want.abs().max()).item()


def package_rate(sb, x, y, steps):
    torch.manual_seed(1)
    rt = sb.Runtime(mlp(), devices="cuda:0", optimizer="adam", lr=1e-3)
    b = batches(WARM + steps)
    for s in range(WARM):
        rt.step(b[s], summed, data=(x, y))
    t0 = time.perf_counter()
    for s in range(WARM, WARM + steps):
        r = rt.step(b[s], summed, data=(x, y))
    return steps * BATCH / (time.perf_counter() - t0), r.devices[0].chunk_samples


def eager_rate(x, y, steps):
    torch.manual_seed(1)
    m = mlp().cuda()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    b = [i.cuda() for i in batches(10 + steps)]
    for s in range(10 + steps):
        if s == 10:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        (summed(m, x[b[s]], y[b[s]]) / BATCH).backward()
        opt.step()
    torch.cuda.synchronize()
    return steps * BATCH / (time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--adapter-json", default="", help="torch_gpu_check's JSON: the C++ adapter's samples/s on the same MLP")
    p.add_argument("--json", default="", help="write the figures here")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=200)
    a = p.parse_args()
    out = {"torch": torch.__version__}
    try:
        import stealbatch as sb
        if not torch.cuda.is_available() or not sb.has_cuda:
            raise RuntimeError(f"no GPU here (torch sees {torch.cuda.device_count()}, the package's CUDA backend: {sb.has_cuda})")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        g = torch.Generator().manual_seed(7)
        x = torch.rand(SAMPLES, 784, generator=g).cuda()
        y = torch.randint(0, 10, (SAMPLES,), generator=g).cuda()
        out["gradient_error"] = gradient_error(sb, x, y)
        print(f"python mlp: gradient on cuda:0 against PyTorch's, batch {BATCH}: max relative error {out['gradient_error']:.3g} (bar 1e-5)", flush=True)
        ours, eager = [], []
        for r in range(a.rounds):
            rate, chunk = package_rate(sb, x, y, a.steps)
            ours.append(rate)
            eager.append(eager_rate(x, y, a.steps))
            print(f"python mlp: round {r + 1}: package {ours[-1]:.0f} samples/s (chunk {chunk}), eager {eager[-1]:.0f}", flush=True)
        out["package_samples_per_s"], out["eager_samples_per_s"] = statistics.median(ours), statistics.median(eager)
    except Exception as e:  # noqa: BLE001  every failure becomes the JSON's error and exit 1
        out["error"] = f"{type(e).__name__}: {e}"
        print(f"python_gpu_check: {out['error']}", file=sys.stderr)
    if a.adapter_json and "package_samples_per_s" in out:
        try:
            with open(a.adapter_json) as f:
                rows = [m for m in json.load(f).get("models", []) if m.get("model") == "torch_mlp"]
            if rows:
                out["adapter_samples_per_s"] = rows[0]["adapter_samples_per_s"]
                out["ratio_to_adapter"] = out["package_samples_per_s"] / out["adapter_samples_per_s"]
                print(f"python mlp: package/adapter on cuda:0: {out['ratio_to_adapter']:.3f}x (bar 0.9x)", flush=True)
        except (OSError, ValueError, KeyError) as e:
            out["adapter_error"] = str(e)
    ok = "error" not in out and out.get("gradient_error", 1) <= 1e-5 and out.get("ratio_to_adapter", 1) >= 0.9
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

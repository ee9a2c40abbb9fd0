#!/usr/bin/env python3
"""Samples/s against chunk size, end to end: an example trained at each fixed --chunk and at --chunk auto, the sizes
interleaved run by run, with the automatic choice and the runtime's own measured curve (Runtime::chunk_curve).

  python3 perf/efficiency_curve.py [--example mlp] [--devices cpu:2] [--runs 3] [--json FILE] [--svg FILE]

A run's figure is samples/s over its median epoch after the first; a point's, the median over runs. The SVG
(perf/plotting.py, matplotlib) plots them on a log2 chunk axis with the automatic choice marked
(perf/charts/efficiency_curve_mlp.svg).
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


def one_run(a, chunk, tmp):
    path = os.path.join(tmp, "run.json")
    cmd = [os.path.join(a.build, "examples", a.example), "--devices", a.devices, "--epochs", str(a.epochs), "--chunk", chunk, "--json", path,
           *a.extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"efficiency_curve: {' '.join(cmd)} exited {p.returncode}: {p.stderr[-1000:]}")
    with open(path) as f:
        j = json.load(f)
    r = j["runs"][-1]
    e = r["epoch_seconds"]
    per_epoch = r["samples_per_s"] * sum(e) / len(e)
    return per_epoch / statistics.median(e[1:] if len(e) > 1 else e), r.get("chunk_samples"), r.get("chunk_curves"), j.get("kernels")


def svg(points, auto, curves, title, path):
    from plotting import figure, save, values_x  # matplotlib only for --svg: the measurement runs without it

    fig, ax = figure(640, 380, title)
    ax.plot([x for x, _ in points], [y for _, y in points], color="#1f77b4", lw=2, marker="o", ms=4,
            label="end to end at each fixed --chunk (median of runs)")
    for i, cs in enumerate(c for c in curves if c):
        ax.plot([x for x, _ in cs], [y * len(curves) for _, y in cs], color="#aaaaaa", lw=1, ls="--",
                label="each device's curve as the runtime measured it, x devices" if i == 0 else None)
    ax.plot([auto[0]], [auto[1]], marker="o", ms=12, mfc="none", mec="#d62728", mew=2, ls="none")
    ax.annotate(f"auto: {auto[0]} ({auto[1] / 1e3:.0f}k)", auto, xytext=(9, 8), textcoords="offset points", color="#d62728")
    values_x(ax, [p[0] for p in points] + [c[0] for cs in curves for c in cs], log2=True)
    ys = [p[1] for p in points] + [auto[1]] + [c[1] * len(curves) for cs in curves for c in cs]
    ax.set_ylim(0, max(ys) * 1.1)
    ax.yaxis.set_major_formatter(lambda v, _: f"{v / 1e3:.0f}k")
    ax.set_xlabel("samples per chunk (log scale)")
    ax.set_ylabel("samples/s")
    ax.legend(loc="lower right", frameon=False)
    fig.tight_layout()
    save(fig, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", default="mlp")
    ap.add_argument("--devices", default="cpu:2")
    ap.add_argument("--chunks", default="8,16,32,64,128,256,512")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--json")
    ap.add_argument("--svg")
    ap.add_argument("extra", nargs="*", help="more flags for the example (after --)")
    a = ap.parse_args()
    sizes = a.chunks.split(",") + ["auto"]
    rates = {s: [] for s in sizes}
    chosen, curves, kernels = None, None, None
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(a.runs):
            for s in sizes:
                rate, cs, cv, kernels = one_run(a, s, tmp)
                rates[s].append(rate)
                if s == "auto":
                    chosen, curves = cs, cv
    head = f"{a.example} --devices {a.devices}, {a.epochs} epochs, {a.runs} interleaved runs; {kernels}; {os.cpu_count()} cores, {cpu_model()}; {commit()}"
    print(f"# efficiency_curve: {head}")
    print(f"{'chunk':>6} {'samples/s':>10} {'runs'}")
    points = []
    for s in sizes:
        m = statistics.median(rates[s])
        print(f"{s:>6} {m:>10.0f} {' '.join(f'{x:.0f}' for x in rates[s])}")
        if s != "auto":
            points.append((int(s), m))
    auto_rate = statistics.median(rates["auto"])
    print(f"# auto chose {chosen} (per device); its measured curves: {curves}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"header": head, "points": points, "auto": {"chunk_samples": chosen, "samples_per_s": auto_rate, "runs": rates["auto"]},
                       "measured_curves": curves}, f, indent=2)
    if a.svg:
        svg(points, (max(chosen) if chosen else 1, auto_rate), curves or [], f"{a.example} on {a.devices}: samples/s against chunk size", a.svg)


if __name__ == "__main__":
    main()

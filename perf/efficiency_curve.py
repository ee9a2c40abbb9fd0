#!/usr/bin/env python3
"""Samples/s against chunk size, end to end: an example trained at each fixed --chunk and at --chunk auto, the sizes
interleaved run by run, with the automatic choice and the runtime's own measured curve (Runtime::chunk_curve).

  python3 perf/efficiency_curve.py [--example mlp] [--devices cpu:2] [--runs 3] [--json FILE] [--svg FILE]

A run's figure is samples/s over its median epoch after the first; a point's, the median over runs. The SVG
plots them on a log2 chunk axis with the automatic choice marked (perf/charts/efficiency_curve.svg).
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
    w, h, l, r, t, b = 640, 380, 64, 24, 60, 48
    xs = [p[0] for p in points] + [c[0] for cs in curves for c in cs]
    ys = [p[1] for p in points] + [auto[1]] + [c[1] * len(curves) for cs in curves for c in cs]
    import math
    x0, x1 = math.log2(min(xs)), math.log2(max(xs))
    y1 = max(ys) * 1.1
    X = lambda v: l + (math.log2(v) - x0) / max(1e-9, x1 - x0) * (w - l - r)
    Y = lambda v: h - b - v / y1 * (h - t - b)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<rect width="{w}" height="{h}" fill="white"/>', f'<text x="{l}" y="20" font-size="13">{title}</text>']
    for k in range(6):
        v = y1 * k / 5
        out.append(f'<line x1="{l}" x2="{w - r}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{l - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v / 1e3:.0f}k</text>')
    for v in sorted(set(xs)):
        out.append(f'<text x="{X(v):.1f}" y="{h - b + 16}" text-anchor="middle">{v}</text>')
    out.append(f'<text x="{(l + w - r) / 2}" y="{h - 10}" text-anchor="middle">samples per chunk (log scale)</text>')
    out.append(f'<text x="14" y="{(t + h - b) / 2}" transform="rotate(-90 14 {(t + h - b) / 2})" text-anchor="middle">samples/s</text>')
    pts = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in points)
    out.append(f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
    for x, y in points:
        out.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="3" fill="#1f77b4"/>')
    for i, cs in enumerate(curves):
        if cs:
            p = " ".join(f"{X(x):.1f},{Y(y * len(curves)):.1f}" for x, y in cs)
            out.append(f'<polyline points="{p}" fill="none" stroke="#aaa" stroke-dasharray="4 3"/>')
    ax = auto[0]
    out.append(f'<circle cx="{X(ax):.1f}" cy="{Y(auto[1]):.1f}" r="6" fill="none" stroke="#d62728" stroke-width="2"/>')
    out.append(f'<text x="{X(ax) + 9:.1f}" y="{Y(auto[1]) - 8:.1f}" fill="#d62728">auto: {ax} ({auto[1] / 1e3:.0f}k)</text>')
    out.append(f'<text x="{w - r}" y="{t - 18}" text-anchor="end" fill="#1f77b4">solid: end to end at each fixed --chunk (median of runs)</text>')
    out.append(f'<text x="{w - r}" y="{t - 6}" text-anchor="end" fill="#777">dashed: each device\'s curve as the runtime measured it, x devices</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


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

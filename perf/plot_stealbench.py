#!/usr/bin/env python3
"""Draws stealbench's JSON as SVG line charts, with no dependency beyond the standard library.

  plot_stealbench.py scale.json --x devices --y efficiency --out efficiency_vs_devices.svg
  plot_stealbench.py chunks.json --x chunk --y efficiency --y2 step_ms_median --out chunk_size.svg --mark 16

One line per policy; the axes carry labels and units; --mark draws a dashed vertical line (the chosen default).
"""
import argparse
import json
import math
import sys

COLORS = {"static": "#d62728", "oracle": "#7f7f7f", "lbbsp": "#ff7f0e", "central": "#9467bd", "steal": "#1f77b4", "steal-adaptive": "#2ca02c"}
LABELS = {
    "devices": "devices",
    "chunk": "chunk size (samples on the fastest device)",
    "efficiency": "efficiency (ideal / measured step)",
    "step_ms_median": "step time (ms, median)",
}


def nice_ticks(lo, hi, n=5):
    if hi <= lo:
        hi = lo + 1
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t <= hi + 1e-12:
        ticks.append(round(t, 10))
        t += step
    return ticks


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--x", required=True)
    ap.add_argument("--y", required=True)
    ap.add_argument("--y2", help="a second series on a right-hand axis, drawn dashed")
    ap.add_argument("--scenario", help="only rows of this scenario")
    ap.add_argument("--logx", action="store_true")
    ap.add_argument("--mark", type=float, help="x value to mark with a dashed line")
    ap.add_argument("--title", default="")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    rows = json.load(open(a.json))
    if a.scenario:
        rows = [r for r in rows if r["scenario"] == a.scenario]
    if not rows:
        sys.exit("plot_stealbench: no rows to draw")
    policies = []
    for r in rows:
        if r["policy"] not in policies:
            policies.append(r["policy"])

    W, H, L, R, T, B = 720, 420, 80, 90 if a.y2 else 30, 40, 60
    xs = [r[a.x] for r in rows]
    fx = (lambda v: math.log2(v)) if a.logx else (lambda v: v)
    xlo, xhi = min(map(fx, xs)), max(map(fx, xs))
    if xhi == xlo:
        xhi = xlo + 1
    ys = [r[a.y] for r in rows]
    ylo, yhi = 0.0, max(ys) * 1.08
    px = lambda v: L + (fx(v) - xlo) / (xhi - xlo) * (W - L - R)
    py = lambda v, lo=ylo, hi=yhi: H - B - (v - lo) / (hi - lo) * (H - T - B)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W/2}" y="22" text-anchor="middle" font-size="14">{a.title}</text>',
           f'<line x1="{L}" y1="{H-B}" x2="{W-R}" y2="{H-B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H-B}" stroke="black"/>']
    for t in nice_ticks(ylo, yhi):
        if t > yhi:
            continue
        out.append(f'<line x1="{L-4}" y1="{py(t):.1f}" x2="{W-R}" y2="{py(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{L-8}" y="{py(t)+4:.1f}" text-anchor="end">{t:g}</text>')
    for v in sorted(set(xs)):
        out.append(f'<text x="{px(v):.1f}" y="{H-B+18}" text-anchor="middle">{v:g}</text>')
    out.append(f'<text x="{(L+W-R)/2}" y="{H-18}" text-anchor="middle">{LABELS.get(a.x, a.x)}{" (log scale)" if a.logx else ""}</text>')
    out.append(f'<text transform="translate(20,{(T+H-B)/2}) rotate(-90)" text-anchor="middle">{LABELS.get(a.y, a.y)}</text>')
    if a.y2:
        y2s = [r[a.y2] for r in rows]
        y2hi = max(y2s) * 1.08
        py2 = lambda v: py(v, 0.0, y2hi)
        out.append(f'<line x1="{W-R}" y1="{T}" x2="{W-R}" y2="{H-B}" stroke="black"/>')
        for t in nice_ticks(0, y2hi):
            if t <= y2hi:
                out.append(f'<text x="{W-R+8}" y="{py2(t)+4:.1f}">{t:g}</text>')
        out.append(f'<text transform="translate({W-20},{(T+H-B)/2}) rotate(90)" text-anchor="middle">{LABELS.get(a.y2, a.y2)} (dashed)</text>')
    if a.mark is not None:
        out.append(f'<line x1="{px(a.mark):.1f}" y1="{T}" x2="{px(a.mark):.1f}" y2="{H-B}" stroke="black" stroke-dasharray="2,3"/>')
        out.append(f'<text x="{px(a.mark)+4:.1f}" y="{T+12}">default</text>')
    for i, p in enumerate(policies):
        pts = sorted((r[a.x], r[a.y], r.get(a.y2)) for r in rows if r["policy"] == p)
        c = COLORS.get(p, "#000")
        out.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (c, " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y, _ in pts)))
        for x, y, _ in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{c}"/>')
        if a.y2:
            out.append('<polyline fill="none" stroke="%s" stroke-width="1.5" stroke-dasharray="5,4" points="%s"/>'
                       % (c, " ".join(f"{px(x):.1f},{py2(y2):.1f}" for x, _, y2 in pts)))
        # The legend sits in the lower right, where these charts have room.
        lx, ly = W - R - 150, H - B - 14 - 16 * (len(policies) - 1 - i)
        out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx+20}" y2="{ly}" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{lx+26}" y="{ly+4}">{p}</text>')
    out.append("</svg>")
    open(a.out, "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()

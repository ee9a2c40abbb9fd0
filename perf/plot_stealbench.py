#!/usr/bin/env python3
"""Draws stealbench's JSON as line charts (SVG, through perf/plotting.py).

  plot_stealbench.py scale.json --x devices --y efficiency --out efficiency_vs_devices.svg
  plot_stealbench.py chunks.json --x chunk --y efficiency --y2 step_ms_median --out chunk_size.svg --mark 16

One line per policy; the axes carry labels and units; --mark draws a dashed vertical line (the chosen default).
"""
import argparse
import json
import sys

from plotting import color, figure, save, values_x

LABELS = {
    "devices": "devices",
    "chunk": "chunk size (samples on the fastest device)",
    "efficiency": "efficiency (ideal / measured step)",
    "step_ms_median": "step time (ms, median)",
}


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

    fig, ax = figure(720, 420, a.title)
    ax2 = ax.twinx() if a.y2 else None
    for p in policies:
        pts = sorted((r[a.x], r[a.y], r.get(a.y2)) for r in rows if r["policy"] == p)
        ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], color=color(p), lw=2, marker="o", ms=4, label=p)
        if ax2:
            ax2.plot([x for x, _, _ in pts], [y2 for _, _, y2 in pts], color=color(p), lw=1.5, ls="--")
    values_x(ax, [r[a.x] for r in rows], log2=a.logx)
    ax.set_ylim(0, max(r[a.y] for r in rows) * 1.08)
    ax.set_xlabel(LABELS.get(a.x, a.x) + (" (log scale)" if a.logx else ""))
    ax.set_ylabel(LABELS.get(a.y, a.y))
    if ax2:
        ax2.set_ylim(0, max(r[a.y2] for r in rows) * 1.08)
        ax2.set_ylabel(LABELS.get(a.y2, a.y2) + " (dashed)")
        ax2.grid(False)
        ax2.spines["top"].set_visible(False)
    if a.mark is not None:
        ax.axvline(a.mark, color="black", lw=1, ls=":")
        ax.annotate("default", (a.mark, 1), xycoords=("data", "axes fraction"), xytext=(4, -12), textcoords="offset points")
    (ax2 or ax).legend(*ax.get_legend_handles_labels(), loc="lower right", frameon=False)  # on top of both axes' lines
    fig.tight_layout()
    save(fig, a.out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The perf charts, on matplotlib (Debian's python3-matplotlib): what every chart shares (the policies' colours, a
figure sized in pixels, x axes ticked at the data's values, SVG written the same way twice from the same data), and
the stealbench charts as commands (perf/sections/charts.sh runs them):

  plotting.py lines a.json [b.json ...] --x devices --y efficiency [--y2 step_ms_median] [--mark 16] --out chart.svg
        stealbench's JSON rows (from every file) as one line per policy; --mark draws a dashed vertical line
  plotting.py util rows.json --out util.svg
        per-device utilization, static against steal-adaptive, one panel per scenario (the rows' "util" arrays)
  plotting.py gantt DIR --scenario S --devices N --out gantt.svg
        one step of each policy as a timeline: the last step in each DIR/trace_S_POLICY_N.json (stealbench --trace-dir)

As a library:

  from plotting import color, figure, save
  fig, ax = figure(720, 420, "title")
  ax.plot(xs, ys, color=color("steal"), label="steal")
  save(fig, "chart.svg")
"""
import argparse
import json
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
except ImportError:
    sys.exit("the perf charts need matplotlib: apt-get install python3-matplotlib (scripts/setup.sh installs it)")

COLORS = {"static": "#d62728", "oracle": "#7f7f7f", "lbbsp": "#ff7f0e", "central": "#9467bd", "steal": "#1f77b4", "steal-adaptive": "#2ca02c"}

matplotlib.rcParams.update({
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.titlesize": 10,
    "figure.titlesize": 11,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.color": "#eeeeee",
    "axes.spines.top": False,
    "svg.fonttype": "none",      # text stays text: smaller files, and searchable
    "svg.hashsalt": "stealbatch",  # the same ids on every run: a redrawn chart differs only where its data does
})


def color(policy):
    return COLORS.get(policy, "#000000")


def policy_legend(fig, policies, **legend):
    """A legend of coloured squares, one a policy, for the whole figure."""
    fig.legend(handles=[Patch(color=color(p), label=p) for p in policies], frameon=False, **legend)


def figure(width_px, height_px, title="", nrows=1, ncols=1, **subplots):
    """A figure of width_px x height_px (at 100 dpi) with a title; the axes as plt.subplots returns them."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(width_px / 100, height_px / 100), dpi=100, **subplots)
    if title:
        fig.suptitle(title)
    return fig, axes


def values_x(ax, values, log2=False):
    """An x axis with a tick at each of the data's values, labelled with the value itself (on a log2 axis 2, 4, 8
    rather than 2^1, 2^2, 2^3)."""
    if log2:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(values))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())


def save(fig, path):
    """Writes the figure in the format its file name says (.svg, .png, .pdf) and frees it."""
    fig.savefig(path, metadata={"Date": None} if path.endswith((".svg", ".pdf")) else None)
    plt.close(fig)


# ---- the stealbench charts ----

LABELS = {
    "devices": "devices",
    "chunk": "chunk size (samples on the fastest device)",
    "efficiency": "efficiency (ideal / measured step)",
    "step_ms_median": "step time (ms, median)",
}


def in_order(values):
    """The distinct values, in the order they first appear."""
    return list(dict.fromkeys(values))


def lines_chart(a):
    rows = [r for path in a.json for r in json.load(open(path))]
    if a.scenario:
        rows = [r for r in rows if r["scenario"] == a.scenario]
    if not rows:
        sys.exit("plotting lines: no rows to draw")
    fig, ax = figure(720, 420, a.title)
    ax2 = ax.twinx() if a.y2 else None
    for p in in_order(r["policy"] for r in rows):
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


def util_chart(a):
    policies = a.policies.split(",")
    rows = [r for r in json.load(open(a.json)) if r["policy"] in policies and r.get("util")]
    scenarios = in_order(r["scenario"] for r in rows)
    if not scenarios:
        sys.exit("plotting util: no rows with per-device utilization")
    fig, axes = figure(60 + 360 * len(scenarios) + 20, 380, a.title, ncols=len(scenarios), sharey=True, squeeze=False)
    for ax, sc in zip(axes[0], scenarios):
        by = {r["policy"]: r for r in rows if r["scenario"] == sc}
        n = max(len(r["util"]) for r in by.values())
        width = 1 / (len(policies) + 0.6)
        for pi, p in enumerate(policies):
            if p not in by:
                continue
            u = by[p]["util"]
            bars = ax.bar([d + (pi - (len(policies) - 1) / 2) * width for d in range(len(u))], u, width * 0.9, color=color(p))
            ax.bar_label(bars, labels=[f"{v * 100:.0f}" for v in u], fontsize=7, padding=1)
        ax.set_title(sc, fontweight="bold")
        ax.set_xticks(range(n), [f"dev {d}" for d in range(n)])
        ax.grid(axis="x", visible=False)
        st = by.get("static", {}).get("step_ms_median")
        sa = by.get(policies[-1], {}).get("step_ms_median")
        if st and sa:
            ax.set_xlabel(f"step {st:.1f} ms vs {sa:.1f} ms ({st / sa:.2f}x)")
    axes[0][0].set_ylim(0, 1.08)
    axes[0][0].set_ylabel("utilization (busy / step, median)")
    policy_legend(fig, policies, loc="lower center", ncol=len(policies))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save(fig, a.out)


def last_step(path):
    """The chunk spans of the last step in a runtime trace: those after the second-to-last AllReduce span ends."""
    ev = json.load(open(path))["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M"}
    spans = [e for e in ev if e.get("ph") == "X"]
    ar_spans = sorted((e for e in spans if e["cat"] == "allreduce"), key=lambda e: e["ts"])
    if len(ar_spans) < 2:
        sys.exit(f"plotting gantt: {path}: fewer than two steps")
    lo = ar_spans[-2]["ts"] + ar_spans[-2]["dur"]  # the previous step's spans (its barrier too) end by then
    end = max(e["ts"] + e["dur"] for e in ar_spans if e["ts"] >= ar_spans[-1]["ts"])
    chunks = [e for e in spans if e["cat"] in ("chunk", "barrier") and lo <= e["ts"] < end]
    start = min(e["ts"] for e in chunks if e["cat"] == "chunk")
    devices = sorted(t for t in names if names[t] != "host")
    return [(e["tid"], e["ts"] - start, e["dur"], e["cat"]) for e in chunks], [names[t] for t in devices], end - start


def gantt_chart(a):
    panels = []
    for p in a.policies.split(","):
        path = os.path.join(a.dir, f"trace_{a.scenario}_{p}_{a.devices}.json")
        if os.path.exists(path):
            panels.append((p,) + last_step(path))
    if not panels:
        sys.exit(f"plotting gantt: no traces for {a.scenario} with {a.devices} devices in {a.dir}")
    tmax_ms = max(p[3] for p in panels) / 1e3
    rows = [len(p[2]) for p in panels]
    fig, axes = figure(900, 70 + sum(16 * (r + 2) for r in rows) + 50, a.title, nrows=len(panels), sharex=True, squeeze=False,
                       gridspec_kw={"height_ratios": rows})
    for ax, (p, spans, names, length) in zip(axes[:, 0], panels):
        for tid, ts, dur, cat in spans:
            if tid < len(names):
                ax.broken_barh([(ts / 1e3, dur / 1e3)], (tid - 0.4, 0.8), facecolor=color(p) if cat == "chunk" else "#dddddd",
                               edgecolor="white", linewidth=0.5)
        ax.set_yticks(range(len(names)), names)
        ax.set_ylim(len(names) - 0.5, -0.5)  # device 0 on top
        ax.set_title(p, loc="left", fontweight="bold")
        ax.set_title(f"step {length / 1e3:.2f} ms", loc="right")
        ax.grid(axis="y", visible=False)
    axes[-1, 0].set_xlim(0, tmax_ms)
    axes[-1, 0].set_xlabel("time since the step's first chunk (ms); coloured: chunks, grey: waiting at the barrier")
    fig.tight_layout()
    save(fig, a.out)


def main():
    ap = argparse.ArgumentParser(description="the stealbench charts (SVG)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ln = sub.add_parser("lines", help="stealbench rows as one line per policy")
    ln.add_argument("json", nargs="+")
    ln.add_argument("--x", required=True)
    ln.add_argument("--y", required=True)
    ln.add_argument("--y2", help="a second series on a right-hand axis, drawn dashed")
    ln.add_argument("--scenario", help="only rows of this scenario")
    ln.add_argument("--logx", action="store_true")
    ln.add_argument("--mark", type=float, help="x value to mark with a dashed line")
    u = sub.add_parser("util", help="per-device utilization, one panel per scenario")
    u.add_argument("json")
    u.add_argument("--policies", default="static,steal-adaptive")
    g = sub.add_parser("gantt", help="one step of each policy as a timeline")
    g.add_argument("dir")
    g.add_argument("--scenario", required=True)
    g.add_argument("--devices", type=int, default=4)
    g.add_argument("--policies", default="static,oracle,lbbsp,central,steal,steal-adaptive")
    for p in (ln, u, g):
        p.add_argument("--title", default="")
        p.add_argument("--out", required=True)
    a = ap.parse_args()
    {"lines": lines_chart, "util": util_chart, "gantt": gantt_chart}[a.cmd](a)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The dashboard pictures of stealbench (SVG, through perf/plotting.py):

  plot_dashboards.py util  rows.json --out util.svg         per-device utilization, static against steal-adaptive,
                                                            one panel per scenario (the rows' "util" arrays)
  plot_dashboards.py gantt DIR --scenario S --devices N --out gantt.svg
                                                            one step of each policy as a timeline: the last step in
                                                            each DIR/trace_S_POLICY_N.json (stealbench --trace-dir)
"""
import argparse
import json
import os
import sys

from plotting import color, figure, policy_legend, save


def util_chart(a):
    policies = a.policies.split(",")
    rows = [r for r in json.load(open(a.json)) if r["policy"] in policies and r.get("util")]
    scenarios = []
    for r in rows:
        if r["scenario"] not in scenarios:
            scenarios.append(r["scenario"])
    if not scenarios:
        sys.exit("plot_dashboards: no rows with per-device utilization")
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
    ars = [e["ts"] for e in ar_spans]
    if len(ars) < 2:
        sys.exit(f"plot_dashboards: {path}: fewer than two steps")
    lo = ar_spans[-2]["ts"] + ar_spans[-2]["dur"]  # the previous step's spans (its barrier too) end by then
    end = max(e["ts"] + e["dur"] for e in spans if e["cat"] == "allreduce" and e["ts"] >= ars[-1])
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
        sys.exit(f"plot_dashboards: no traces for {a.scenario} with {a.devices} devices in {a.dir}")
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("util")
    u.add_argument("json")
    u.add_argument("--policies", default="static,steal-adaptive")
    u.add_argument("--title", default="")
    u.add_argument("--out", required=True)
    g = sub.add_parser("gantt")
    g.add_argument("dir")
    g.add_argument("--scenario", required=True)
    g.add_argument("--devices", type=int, default=4)
    g.add_argument("--policies", default="static,oracle,lbbsp,central,steal,steal-adaptive")
    g.add_argument("--title", default="")
    g.add_argument("--out", required=True)
    a = ap.parse_args()
    (util_chart if a.cmd == "util" else gantt_chart)(a)


if __name__ == "__main__":
    main()

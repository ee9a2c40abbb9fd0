#!/usr/bin/env python3
"""The dashboard pictures of stealbench, as SVG with the standard library only:

  plot_dashboards.py util  rows.json --out util.svg         per-device utilization, static against steal-adaptive,
                                                            one panel per scenario (the rows' "util" arrays)
  plot_dashboards.py gantt DIR --scenario S --devices N --out gantt.svg
                                                            one step of each policy as a timeline: the last step in
                                                            each DIR/trace_S_POLICY_N.json (stealbench --trace-dir)
"""
import argparse
import glob
import json
import os
import sys

from plot_stealbench import COLORS, nice_ticks


def svg_open(w, h, title):
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
            f'<rect width="{w}" height="{h}" fill="white"/>',
            f'<text x="{w / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>']


def util_chart(a):
    rows = [r for r in json.load(open(a.json)) if r["policy"] in a.policies.split(",") and r.get("util")]
    scenarios = []
    for r in rows:
        if r["scenario"] not in scenarios:
            scenarios.append(r["scenario"])
    if not scenarios:
        sys.exit("plot_dashboards: no rows with per-device utilization")
    policies = a.policies.split(",")
    pw, H, L, T, B = 360, 380, 60, 50, 60
    W = L + pw * len(scenarios) + 20
    out = svg_open(W, H, a.title)
    py = lambda v: H - B - v * (H - T - B)
    out.append(f'<text transform="translate(18,{(T + H - B) / 2}) rotate(-90)" text-anchor="middle">utilization (busy / step, median)</text>')
    for t in nice_ticks(0, 1):
        out.append(f'<line x1="{L - 4}" y1="{py(t):.1f}" x2="{W - 20}" y2="{py(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{L - 8}" y="{py(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for si, sc in enumerate(scenarios):
        x0 = L + si * pw
        out.append(f'<text x="{x0 + pw / 2}" y="{T - 10}" text-anchor="middle" font-weight="bold">{sc}</text>')
        out.append(f'<line x1="{x0}" y1="{H - B}" x2="{x0 + pw - 20}" y2="{H - B}" stroke="black"/>')
        by = {r["policy"]: r for r in rows if r["scenario"] == sc}
        n = max(len(r["util"]) for r in by.values())
        gw = (pw - 40) / n
        bw = gw / (len(policies) + 0.6)
        for d in range(n):
            gx = x0 + 10 + d * gw
            for pi, p in enumerate(policies):
                if p not in by or d >= len(by[p]["util"]):
                    continue
                u = by[p]["util"][d]
                x = gx + pi * bw
                out.append(f'<rect x="{x:.1f}" y="{py(u):.1f}" width="{bw * 0.9:.1f}" height="{py(0) - py(u):.1f}" fill="{COLORS.get(p, "#000")}"/>')
                out.append(f'<text x="{x + bw * 0.45:.1f}" y="{py(u) - 3:.1f}" text-anchor="middle" font-size="9">{u * 100:.0f}</text>')
            out.append(f'<text x="{gx + bw * len(policies) / 2:.1f}" y="{H - B + 16}" text-anchor="middle">dev {d}</text>')
        st = by.get("static", {}).get("step_ms_median")
        sa = by.get(policies[-1], {}).get("step_ms_median")
        if st and sa:
            out.append(f'<text x="{x0 + pw / 2}" y="{H - B + 34}" text-anchor="middle" font-size="11">step {st:.1f} ms vs {sa:.1f} ms ({st / sa:.2f}x)</text>')
    for i, p in enumerate(policies):
        lx = L + 10 + i * 170
        out.append(f'<rect x="{lx}" y="{H - 16}" width="14" height="10" fill="{COLORS.get(p, "#000")}"/>')
        out.append(f'<text x="{lx + 20}" y="{H - 7}">{p}</text>')
    out.append("</svg>")
    open(a.out, "w").write("\n".join(out) + "\n")


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
    tmax = max(p[3] for p in panels)
    rowh, L, R, T = 16, 110, 30, 40
    W = 900
    H = T + sum((len(p[2]) + 2) * rowh for p in panels) + 50
    out = svg_open(W, H, a.title)
    px = lambda us: L + us / tmax * (W - L - R)
    y = T
    for p, spans, names, length in panels:
        out.append(f'<text x="8" y="{y + 12}" font-weight="bold">{p}</text>')
        out.append(f'<text x="{W - R}" y="{y + 12}" text-anchor="end">step {length / 1e3:.2f} ms</text>')
        y += rowh
        for d, name in enumerate(names):
            out.append(f'<text x="{L - 6}" y="{y + d * rowh + 11}" text-anchor="end">{name}</text>')
        for tid, ts, dur, cat in spans:
            if tid >= len(names):
                continue
            fill = COLORS.get(p, "#000") if cat == "chunk" else "#ddd"
            out.append(f'<rect x="{px(ts):.1f}" y="{y + tid * rowh + 2}" width="{max(0.8, px(ts + dur) - px(ts)):.1f}" height="{rowh - 4}" '
                       f'fill="{fill}" stroke="white" stroke-width="0.5"/>')
        y += (len(names) + 1) * rowh
    for t in nice_ticks(0, tmax / 1e3):
        if t * 1e3 <= tmax:
            out.append(f'<line x1="{px(t * 1e3):.1f}" y1="{T}" x2="{px(t * 1e3):.1f}" y2="{y}" stroke="#eee"/>')
            out.append(f'<text x="{px(t * 1e3):.1f}" y="{y + 14}" text-anchor="middle">{t:g}</text>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{y + 32}" text-anchor="middle">time since the step\'s first chunk (ms); '
               f'coloured: chunks, grey: waiting at the barrier</text>')
    out.append("</svg>")
    open(a.out, "w").write("\n".join(out) + "\n")


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

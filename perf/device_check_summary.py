#!/usr/bin/env python3
"""Joins gpu_check.json, torch_ref.json and stealbench16/32.json into the device check's summary table and JSON,
with the targets.

  python3 perf/device_check_summary.py OUT_DIR     (reads those files in OUT_DIR)
"""
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"summary: {path}: {e}", file=sys.stderr)
        return {}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    g, t = load(os.path.join(out, "gpu_check.json")), load(os.path.join(out, "torch_ref.json"))
    rows = []  # (check, figure, target, verdict)

    def add(check, figure, target, ok):
        rows.append((check, figure, target, "PASS" if ok else ("FAIL" if ok is not None else "n/a")))

    eq = g.get("equivalence", {})
    for m in ("mlp", "cnn"):
        e = eq.get(f"{m}_rel_err")
        add(f"{m} GPU vs CPU gradient", f"{e:.3g}" if e is not None else "missing", "<= 1e-4", None if e is None else e <= 1e-4)
    thr = g.get("throughput", {})
    for m in ("mlp", "cnn"):
        ours, ref, res = thr.get(m, {}).get("samples_per_s"), t.get(m, {}).get("samples_per_s"), t.get(f"{m}_resident", {}).get("samples_per_s")
        if ours and ref:
            ratio = ours / ref
            extra = f" (torch with data on GPU: {res:.0f}, ratio {ours / res:.2f})" if res else ""
            add(f"{m} samples/s vs PyTorch", f"{ours:.0f} vs {ref:.0f} = {ratio:.2f}x{extra}", ">= 1.0x (mlp)", ratio >= 1.0 if m == "mlp" else None)
        else:
            add(f"{m} samples/s vs PyTorch", "missing", ">= 1.0x", None if m == "cnn" else False)
    v = g.get("vgpu", {})
    if v:
        st, sl = v.get("static", {}), v.get("steal", {})
        add("vgpu static efficiency", f"{st.get('efficiency', 0):.3f} ({st.get('step_ms_median', 0):.2f} ms)", "(baseline)", None)
        add("vgpu steal efficiency", f"{sl.get('efficiency', 0):.3f} ({sl.get('step_ms_median', 0):.2f} ms, ideal {v.get('ideal_ms', 0):.2f})", ">= 0.9",
            sl.get("efficiency", 0) >= 0.9)
        r = v.get("speedup_over_ideal_speedup", 0)
        add("vgpu steal speedup vs ideal speedup", f"{v.get('speedup', 0):.2f}x of {v.get('ideal_speedup', 0):.2f}x = {r:.3f}", ">= 0.9", r >= 0.9)
    else:
        add("vgpu", "missing", "", False)
    for a in g.get("allreduce", []):
        add(f"allreduce {a['buffer']} ({a['floats']} floats, {a['ranks']} rank)", f"{a['us_median']:.1f} us", "(reported)", None)
    # stealbench on this machine's cores (simulated devices): issue 4's targets for steal-adaptive.
    benches = {}
    for n in (16, 32):
        path = os.path.join(out, f"stealbench{n}.json")
        if os.path.exists(path):
            benches[n] = load(path) or []
        else:
            add(f"stealbench {n} devices", "missing", "", False)
    for n, recs in benches.items():
        by = {(r.get("scenario"), r.get("policy")): r for r in recs if isinstance(r, dict)}
        for sc in ("seed-slow", "seed-skew", "hetero", "varcost", "slowdown"):
            ours, lb = by.get((sc, "steal-adaptive")), by.get((sc, "lbbsp"))
            if not ours:
                add(f"stealbench {n} {sc}", "missing", ">= 0.95", False)
                continue
            over = ours.get("overhead_pct")
            fig = f"{ours['efficiency']:.3f}, overhead {over:.2f}%" if over is not None else f"{ours['efficiency']:.3f}"
            add(f"stealbench {n} {sc} steal-adaptive efficiency", fig, ">= 0.95", ours["efficiency"] >= 0.95 and ours.get("wrong", 1) == 0)
            if lb and sc in ("varcost", "slowdown", "hetero"):
                x = lb["step_ms_median"] / ours["step_ms_median"]
                bar = 0.98 if sc == "hetero" else 1.2
                add(f"stealbench {n} {sc} vs lbbsp", f"{x:.3f}x (lbbsp efficiency {lb['efficiency']:.3f})", f">= {bar}x", x >= bar)
    w = max(len(r[0]) for r in rows)
    fw = max(len(r[1]) for r in rows)
    print(f"{'check':<{w}}  {'figure':<{fw}}  {'target':<14}  verdict")
    for c, f_, tg, vd in rows:
        print(f"{c:<{w}}  {f_:<{fw}}  {tg:<14}  {vd}")
    summary = {"gpu": g.get("gpu"), "torch": t.get("torch"), "rows": [dict(zip(("check", "figure", "target", "verdict"), r)) for r in rows],
               "gpu_check": g, "torch_ref": t}
    with open(os.path.join(out, "device_check.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return 1 if any(r[3] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

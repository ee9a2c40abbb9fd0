#!/usr/bin/env python3
"""Joins steps.tsv, gpu_check.json, torch_ref.json, mlp_gpu.json, cnn_gpu.json, the checkpoint runs,
torch_gpu_check.json and stealbench16/32.json into the
device check's summary table and device_check.json, with the targets. Every figure that did not come is a row
that says "missing" (with the section's error where gpu_check recorded one), so a cut-short run still says what
it lacks.

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
        print(f"summary: {os.path.basename(path)}: {e.__class__.__name__}: {e.strerror if isinstance(e, OSError) else e}", file=sys.stderr)
        return {}


def steps(out):
    try:
        with open(os.path.join(out, "steps.tsv")) as f:
            return [line.rstrip("\n").split("\t") for line in f][1:]
    except OSError:
        return []


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    g, t = load(os.path.join(out, "gpu_check.json")), load(os.path.join(out, "torch_ref.json"))
    rows = []  # (check, figure, target, verdict)

    def add(check, figure, target, ok):
        rows.append((check, figure, target, "PASS" if ok else ("FAIL" if ok is not None else "n/a")))

    def missing(section):
        err = g.get("errors", {}).get(section)
        return f"missing ({err[:120]})" if err else "missing"

    for name, status, secs in steps(out):
        if status != "ok":
            add(f"step {name}", f"{status} after {secs} s" if status != "skipped" else "skipped: deadline", "ran", False)

    eq = g.get("equivalence", {})
    for m in ("mlp", "cnn"):
        e = eq.get(f"{m}_rel_err")
        add(f"{m} GPU vs CPU gradient", f"{e:.3g}" if e is not None else missing("equivalence"), "<= 1e-4", False if e is None else e <= 1e-4)
    thr = g.get("throughput", {})
    for m in ("mlp", "cnn"):
        ours, ref, res = thr.get(m, {}).get("samples_per_s_auto"), t.get(m, {}).get("samples_per_s"), t.get(f"{m}_resident", {}).get("samples_per_s")
        if ours and ref:
            ratio = ours / ref
            extra = f" (torch with data on GPU: {res:.0f}, ratio {ours / res:.2f})" if res else ""
            chunk = thr.get(m, {}).get("auto_chunk")
            add(f"{m} samples/s (chunk auto: {chunk}) vs PyTorch", f"{ours:.0f} vs {ref:.0f} = {ratio:.2f}x{extra}", ">= 1.0x", ratio >= 1.0)
        else:
            why = missing("throughput") if not ours else "missing (torch_ref)"
            add(f"{m} samples/s vs PyTorch", why, ">= 1.0x", False)
        spin, block = thr.get(m, {}).get("samples_per_s"), thr.get(m, {}).get("samples_per_s_block")
        if spin and block:
            add(f"{m} GPU wait: spin (default) vs blocking sync", f"{spin:.0f} vs {block:.0f} samples/s = {spin / block:.3f}", "(default = faster)",
                spin >= block * 0.98)
    v = g.get("vgpu", {})
    if v:
        st, sl = v.get("static", {}), v.get("steal", {})
        add("vgpu static efficiency", f"{st.get('efficiency', 0):.3f} ({st.get('step_ms_median', 0):.2f} ms)", "(baseline)", None)
        add("vgpu steal efficiency", f"{sl.get('efficiency', 0):.3f} ({sl.get('step_ms_median', 0):.2f} ms, ideal {v.get('ideal_ms', 0):.2f})", ">= 0.9",
            sl.get("efficiency", 0) >= 0.9)
        r = v.get("speedup_over_ideal_speedup", 0)
        add("vgpu steal speedup vs ideal speedup", f"{v.get('speedup', 0):.2f}x of {v.get('ideal_speedup', 0):.2f}x = {r:.3f}", ">= 0.9", r >= 0.9)
    else:
        add("vgpu static/steal/ideal", missing("vgpu"), ">= 0.9", False)
    for a in g.get("allreduce", []):
        add(f"allreduce {a['buffer']} ({a['floats']} floats, {a['ranks']} rank)", f"{a['us_median']:.1f} us", "(reported)", None)
    for row in g.get("curve", []):
        add(f"curve: mlp batch 4096, chunk {row['chunk']}", f"{row['samples_per_s']:.0f} samples/s (chunk {row['chunk_samples']})", "(reported)", None)
    if not g.get("curve"):
        add("curve", missing("curve"), "(reported)", None)
    if not g.get("allreduce"):
        add("allreduce", missing("allreduce"), "(reported)", None)
    for m in ("mlp", "cnn"):
        e = load(os.path.join(out, f"{m}_gpu.json")) if os.path.exists(os.path.join(out, f"{m}_gpu.json")) else {}
        acc = e.get("test_accuracy")
        runs = e.get("runs") or [{}]
        bar = 0.88 if m == "mlp" else 0.91
        fig = f"accuracy {acc:.4f}, {runs[-1].get('samples_per_s', 0):.0f} samples/s" if acc is not None else "missing"
        add(f"{m} example on cuda:0", fig, f">= {bar}", False if acc is None else acc >= bar)
    # Checkpoints across GPU and CPU: each round trip's accuracy against an uninterrupted cpu:2 run of the same 4 epochs.
    straight = load(os.path.join(out, "ckpt_straight.json")) if os.path.exists(os.path.join(out, "ckpt_straight.json")) else {}
    for name, label in (("ckpt_gpu_cpu", "checkpoint cuda:0 -> cpu:2"), ("ckpt_cpu_gpu", "checkpoint cpu:2 -> cuda:0")):
        e = load(os.path.join(out, f"{name}.json")) if os.path.exists(os.path.join(out, f"{name}.json")) else {}
        acc, ref = e.get("test_accuracy"), straight.get("test_accuracy")
        if acc is None or ref is None:
            add(label, "missing", "accuracy within 0.002 of cpu:2 straight", False)
        else:
            add(label, f"accuracy {acc:.4f} (straight {ref:.4f})", "within 0.002", abs(acc - ref) <= 0.002)
    # The libtorch adapter on cuda:0, built here against this machine's PyTorch (torch_gpu_check).
    tg = load(os.path.join(out, "torch_gpu_check.json")) if os.path.exists(os.path.join(out, "torch_gpu_check.json")) else {}
    by_model = {m.get("model"): m for m in tg.get("models", []) if isinstance(m, dict)}
    for m in ("torch_mlp", "torch_cnn"):
        r = by_model.get(m)
        if not r:
            add(f"{m} adapter on cuda:0", "missing", "gradient <= 1e-4, >= 0.9x eager", False)
            continue
        e = r.get("gradient_error", -1)
        add(f"{m} adapter gradient cuda:0 vs cpu:1", f"{e:.3g} (batch {r.get('batch')})", "<= 1e-4", 0 <= e <= 1e-4)
        add(f"{m} adapter vs libtorch eager on cuda:0 (chunk {r.get('chunk')})",
            f"{r.get('adapter_samples_per_s', 0):.0f} vs {r.get('eager_samples_per_s', 0):.0f} samples/s = {r.get('ratio', 0):.3f}x", ">= 0.9x",
            r.get("ratio", 0) >= 0.9)
    # stealbench on this machine's cores (simulated devices): the targets for steal-adaptive (perf/README.md).
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

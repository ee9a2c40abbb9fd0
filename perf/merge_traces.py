#!/usr/bin/env python3
"""Joins the per-rank Chrome traces of a multi-process run into one trace: one process row per rank.

  python3 perf/merge_traces.py trace.rank*.json -o trace.json

Each rank's runtime writes PATH.rank<N>.json (RuntimeOptions::trace_path = PATH.json) with its events already on
rank 0's timeline: the clock offset measured at start-up is applied, and recorded in the file's clock_offset
metadata. This only concatenates the events, so the result opens in chrome://tracing or Perfetto as one timeline.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", help="the per-rank files, PATH.rank<N>.json")
    ap.add_argument("-o", "--out", required=True, help="the joined trace")
    a = ap.parse_args()
    events = []
    for path in a.traces:
        try:
            with open(path) as f:
                events += json.load(f)["traceEvents"]
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"merge_traces: {path}: not a complete trace ({e})")
    with open(a.out, "w") as f:
        json.dump({"displayTimeUnit": "ms", "traceEvents": events}, f)
    ranks = sorted({e.get("pid", 0) for e in events})
    print(f"merge_traces: {len(events)} events from {len(a.traces)} files, process rows {ranks}, written to {a.out}")


if __name__ == "__main__":
    main()

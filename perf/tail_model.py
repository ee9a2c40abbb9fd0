#!/usr/bin/python3
"""What stealing can reach on stealbench's varcost when nothing else costs anything.

A model, not a measurement: equal devices, per-sample costs lognormal (sigma 1) x 100 us as in stealbench's
varcost, each device's share cut as the runtime cuts it (full chunks, then the last kTailChunks = 6 chunks' worth
in sixths of what is left, down to a quarter chunk), no dispatch cost, no transfers, no timer, no host. A device
runs its own share in order; an idle one steals half the deque holding the most chunks, from its end, as
soon as it is idle. Nobody knows a sample's cost before it has run (the runtime does not either): that, and a
chunk never being split once it runs, is the tail. Efficiency is (fluid ideal + AllReduce) / (makespan +
AllReduce), the ideal stealbench reports.

Rows:
  chunked        the runtime's chunking, a thief that does not know costs (what stealbench's runtime does)
  clairvoyant    the same chunks, but the thief picks the victim that will finish last (knows every cost)
  per-sample     every sample its own chunk, thief as in `chunked` (no per-chunk cost is charged here)

Usage: perf/tail_model.py [--devices 4,16,32] [--per-device 256] [--chunk 16] [--steps 200] [--seed 1]
Pure Python (no NumPy): a few seconds for the defaults.
"""
import argparse
import heapq
import math
import random
import statistics

TAIL_CHUNKS = 6       # detail::kTailChunks
SAMPLE_MS = 0.1       # 5 us x --time-scale 20
ALLREDUCE_MB = 100.0  # stealbench's defaults: 100 MB at 100 GB/s bus bandwidth, 10 us latency
BUSBW_GBPS = 100.0
LATENCY_MS = 0.01


def share_chunks(per_device, chunk):
    """Chunk sizes of one share, as detail::cut_share cuts it with equal costs."""
    out, left = [], per_device
    while left > 0:
        # the floor as the runtime sets it for equal costs: a quarter chunk, in whole samples, at least one
        size = chunk if left > TAIL_CHUNKS * chunk else max(max(1, chunk // 4), math.ceil(left / TAIL_CHUNKS))
        size = min(size, left)
        out.append(size)
        left -= size
    return out


def makespan(deques, victim_rule):
    """Greedy list schedule: each device runs its deque from the front; an idle device steals half of a victim's."""
    n = len(deques)
    queues = [list(q) for q in deques]
    heads = [0] * n
    busy_until = [0.0] * n
    events = [(0.0, d) for d in range(n)]
    heapq.heapify(events)
    end = 0.0
    while events:
        now, d = heapq.heappop(events)
        if heads[d] < len(queues[d]):
            cost = queues[d][heads[d]]
            heads[d] += 1
        else:
            victims = [v for v in range(n) if heads[v] < len(queues[v])]
            if not victims:
                end = max(end, now)
                continue
            v = max(victims, key=lambda v: victim_rule(v, queues, heads, busy_until))
            take = max(1, (len(queues[v]) - heads[v]) // 2)
            stolen = queues[v][len(queues[v]) - take:]
            del queues[v][len(queues[v]) - take:]
            queues[d] = stolen[::-1]  # the thief runs them from the victim's end inwards
            heads[d] = 1
            cost = queues[d][0]
        busy_until[d] = now + cost
        heapq.heappush(events, (now + cost, d))
    return end


def by_count(v, queues, heads, busy_until):
    return len(queues[v]) - heads[v]


def clairvoyant(v, queues, heads, busy_until):
    return busy_until[v] + sum(queues[v][heads[v]:])


def efficiency(devices, per_device, chunk, steps, seed):
    rng = random.Random(seed)
    t_ar = 2.0 * (devices - 1) / devices * ALLREDUCE_MB / BUSBW_GBPS + LATENCY_MS  # MB / (GB/s) = ms
    rows = {"chunked": [], "clairvoyant": [], "per-sample": []}
    for _ in range(steps):
        costs = [rng.lognormvariate(0.0, 1.0) * SAMPLE_MS for _ in range(devices * per_device)]
        ideal = sum(costs) / devices + t_ar
        chunked, singles, at = [], [], 0
        for _d in range(devices):
            q = []
            for size in share_chunks(per_device, chunk):
                q.append(sum(costs[at:at + size]))
                at += size
            chunked.append(q)
            singles.append(costs[at - per_device:at])
        rows["chunked"].append(ideal / (makespan(chunked, by_count) + t_ar))
        rows["clairvoyant"].append(ideal / (makespan(chunked, clairvoyant) + t_ar))
        rows["per-sample"].append(ideal / (makespan(singles, by_count) + t_ar))
    return {k: statistics.median(v) for k, v in rows.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default="4,16,32", help="comma-separated device counts")
    ap.add_argument("--per-device", type=int, default=256, help="samples per device per step (stealbench: batch / devices)")
    ap.add_argument("--chunk", type=int, default=16, help="samples per chunk")
    ap.add_argument("--steps", type=int, default=200, help="steps per device count (median reported)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    print(f"# varcost model: {a.per_device} samples per device, chunk {a.chunk}, {a.steps} steps, median efficiency")
    print(f"# {'devices':>7} {'chunked':>8} {'clairvoyant':>12} {'per-sample':>11}")
    for n in (int(x) for x in a.devices.split(",")):
        e = efficiency(n, a.per_device, a.chunk, a.steps, a.seed)
        print(f"  {n:>7} {e['chunked']:>8.3f} {e['clairvoyant']:>12.3f} {e['per-sample']:>11.3f}")


if __name__ == "__main__":
    main()

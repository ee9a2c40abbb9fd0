#!/usr/bin/python3
"""A discrete-event model of one step across ranks: where its fixed cost grows from 2 to 10,000 ranks.

What it models, as runtime/src/cluster/cluster_step.cpp runs it (docs/DESIGN.md, "Across processes and nodes"):
  - the chunk table every rank builds alike: shares in proportion to the ranks' speeds, each cut into chunks of its
    rank's size (the fastest rank's chunk, scaled by speed), the last six chunks' worth in sixths of what is left,
    down to a quarter chunk (detail::cut_share);
  - each rank's share word: the owner claims one chunk per local device from the front (a compare-and-swap on its
    own word), a thief reads a victim's word and takes detail::steal_amount chunks off its back with one CAS, a CAS
    that finds the word changed retries against what it saw;
  - the victims in the runtime's order (the own node's ranks, then the rest, each list starting after the thief), or
    with --probes P the bounded list (the own node, then P others drawn afresh at every call);
  - the last call for work: a rank whose own word is empty reads every victim before it leaves;
  - each device as the simulated device runs chunks: back to back on its timeline, at most --in-flight unfinished,
    the next taken when the queued work ends within --lead-us; its worker wakes --overshoot-us late from a sleep;
    the devices of one rank share the rank's chunks (a worker with none takes half of a sibling's) and ask the source
    one at a time;
  - the step's two collectives: the agreement at its start and the tally at its end (it ends when the last rank
    arrives, plus the allreduce's time), and building the chunk table (--plan-ns per chunk, on every rank).
What it does not: the in-rank end game with several devices a rank (every device always takes), queueing at a
target's agent (the last call's reads start after the thief, so at any moment they spread over the targets), the
heartbeat's and the stall watch's reads (off the step's path; --scale prints their load), noise in device speed.

Inputs: the unit costs that `dequebench --remote --costs` measures (mpirun -np R), as `name value` lines, and the
scenario of perf/stealbench.cpp (hetero: device speeds 1, 0.8, 0.5, 0.25 repeating; seed-slow: 1/6.6, 1/6.6, 1, 1).

Modes:
  perf/cluster_model.py --costs FILE --ranks R [--nodes N] --scenario hetero [--batch-per-rank 128] ...
      one configuration: the step's time and what it is made of
  perf/cluster_model.py --validate results/cluster_model_validation.txt [--tolerance 0.10]
      every measured row of the file against the model with that row's measured costs; exit 1 if one is off by more
  perf/cluster_model.py --scale [--probes-at-scale P]
      100, 1,000 and 10,000 ranks with the costs measured across emulated nodes, and with RDMA-class costs
Pure Python (no NumPy). A 10,000-rank step takes about a minute.
"""
import argparse
import bisect
import heapq
import math
import random
import statistics
import sys

TAIL_CHUNKS = 6  # detail::kTailChunks


def cut_share(n, target, floor):
    """Chunk sizes of a share of n equal-cost samples, as detail::cut_share cuts it."""
    out, left = [], n
    while left > 0:
        size = target if left > TAIL_CHUNKS * target else max(floor, math.ceil(left / TAIL_CHUNKS))
        size = int(min(max(1, size), left))
        out.append(size)
        left -= size
    return out


def place_proportional(batch, weights):
    """Largest-remainder split of batch samples by weight."""
    total = sum(weights)
    exact = [batch * w / total for w in weights]
    base = [int(math.floor(x)) for x in exact]
    rest = batch - sum(base)
    order = sorted(range(len(weights)), key=lambda i: exact[i] - base[i], reverse=True)
    for i in order[:rest]:
        base[i] += 1
    return base


def steal_amount(left, thief, victim):
    if left == 0:
        return 0
    return int(min(left, math.floor(left * thief / (thief + victim) + 0.5)))


SCENARIOS = {"hetero": [1.0, 0.8, 0.5, 0.25], "seed-slow": [1 / 6.6, 1 / 6.6, 1.0, 1.0], "equal": [1.0], "slowdown": [1.0]}
WATCH_US = 10e3  # the stall watch's period while a rank waits in a collective
DROP_FACTOR, DROP_PERIOD = 0.3, 3  # slowdown: the job's device 0 at 30% from a third of the ideal step on, every third step


class Costs:
    """The unit costs, in microseconds."""

    def __init__(self, kv):
        self.read_same = kv.get("read_same_node_us", 0.15)
        self.cas_same = kv.get("cas_same_node_us", 0.2)
        self.read_other = kv.get("read_other_node_us", self.read_same)
        self.cas_other = kv.get("cas_other_node_us", self.cas_same)
        self.agree = kv.get("allreduce_16_doubles_us", 2.0)
        self.tally = kv.get("allreduce_tally_us", self.agree)
        self.overshoot = kv.get("sleep_overshoot_us", 55.0)
        # The runtime's whole step with no compute (stealbench --time-scale 0.01 at the same ranks and placement),
        # where it was measured: what it holds beyond the model's own step with no compute (the runtime's thread
        # wake-ups and planning, and on an oversubscribed machine the collectives' waits for a core) is added to
        # every step as one constant.
        self.step_overhead = kv.get("step_overhead_us")
        if self.read_same < 0:
            self.read_same, self.cas_same = self.read_other, self.cas_other
        if self.read_other < 0:
            self.read_other, self.cas_other = self.read_same, self.cas_same
        self.own = kv.get("own_word_us", 0.5)  # the owner's claim: a read and a CAS of its own word


def cost_line(line):
    """A `name value` line of the unit costs as (name, value), else None."""
    parts = line.split()
    if len(parts) != 2 or line.startswith("#"):
        return None
    try:
        return parts[0], float(parts[1])
    except ValueError:
        return None


def read_costs(path):
    with open(path) as f:
        return dict(kv for kv in map(cost_line, f) if kv)


class Model:
    def __init__(self, ranks, nodes, devices, speeds, batch, chunk, sample_us, in_flight, lead_us, costs, probes, plan_ns, seed=1, rank_fixed_us=0.0):
        self.rank_fixed_us = rank_fixed_us  # the runtime's own per-step work on a rank, beyond the parts modelled
        self.fingers = probes is not None  # the bounded runtime watches fingers in large jobs (detail::watched_ranks)
        self.budget_us = None  # per rank: how long a call may read other nodes' words (None: no budget)
        self.R, self.D = ranks, devices
        self.per_node = max(1, ranks // nodes)
        self.node = [r // self.per_node for r in range(ranks)]
        # device speeds, rank by rank (the scenario's pattern over the job's devices, as stealbench assigns them)
        self.dev_speed = [[speeds[(r * devices + d) % len(speeds)] for d in range(devices)] for r in range(ranks)]
        self.rank_speed = [sum(s) for s in self.dev_speed]
        self.batch, self.sample_us, self.in_flight, self.lead = batch, sample_us, in_flight, lead_us
        self.c, self.probes, self.plan_ns = costs, probes, plan_ns
        self.rng = random.Random(seed)
        self.scenario = "slowdown" if speeds is SCENARIOS["slowdown"] else ""
        fastest = max(self.rank_speed)
        share = place_proportional(batch, self.rank_speed)
        self.chunks = []  # per rank: chunk sizes in samples
        for r in range(ranks):
            size = max(1, round(chunk * self.rank_speed[r] / fastest))
            self.chunks.append(cut_share(share[r], size, max(1, size // 4)))
        self.total_chunks = sum(len(c) for c in self.chunks)

    def read_cost(self, a, b):
        return self.c.read_same if self.node[a] == self.node[b] else self.c.read_other

    def cas_cost(self, a, b):
        return self.c.cas_same if self.node[a] == self.node[b] else self.c.cas_other

    def node_ranks(self, me):
        """The other ranks of me's node, in the runtime's order (cyclic from me)."""
        R = self.R
        first = self.node[me] * self.per_node
        return sorted((u for u in range(first, min(R, first + self.per_node)) if u != me), key=lambda u: (u - me) % R)

    def find_victim(self, me, left):
        """The thief's call for work past its own word: the victim it takes from (or None) and how many reads that
        took, (same node, other nodes). The words are seen as they are when the call starts."""
        R, speed = self.R, self.rank_speed
        same = 0
        for v in self.node_ranks(me):
            same += 1
            if steal_amount(left(v), speed[me], speed[v]) > 0:
                return v, same, 0
        others = R - 1 - same
        if self.probes is None or self.probes >= others:
            # every other node's rank in cyclic order from me: jump from one non-empty word to the next
            nonempty = self.nonempty
            i = bisect.bisect_right(nonempty, me)
            for j in range(len(nonempty)):
                v = nonempty[(i + j) % len(nonempty)]
                if v == me or self.node[v] == self.node[me]:
                    continue
                if steal_amount(left(v), speed[me], speed[v]) > 0:
                    dist = (v - me) % R  # its place among the other nodes' ranks: the cyclic distance, less this node's
                    return v, same, dist - sum(1 for u in self.node_ranks(me) if (u - me) % R < dist)
            return None, same, others
        drawn = set()
        # with a budget: no more reads of other nodes' words once they took as long as one of the thief's own chunks
        limit = self.probes if self.budget_us is None else min(self.probes, max(1, int(self.budget_us[me] // self.c.read_other) + 1))
        while len(drawn) < limit:  # drawn afresh at every call, distinct within it
            v = self.rng.randrange(R)
            if self.node[v] == self.node[me] or v in drawn:
                continue
            drawn.add(v)
            if steal_amount(left(v), speed[me], speed[v]) > 0:
                return v, same, len(drawn)
        return None, same, len(drawn)

    def step(self, drop=False):
        """One step's times in microseconds: (step, chunk phase end of the last rank, mean last call, remote chunks).
        drop: the slowdown scenario's drop step (device 0 of rank 0 at 30% from a third of the ideal step on)."""
        drop_at = self.batch * self.sample_us / (self.R * self.D) / 3 if drop else math.inf
        R, D, c = self.R, self.D, self.c
        start = c.agree + self.plan_ns * self.total_chunks / 1e3 + c.own  # agreement, table, publish
        front = [0] * R
        back = [len(ch) for ch in self.chunks]
        self.nonempty = list(range(R))  # the ranks whose word holds chunks, in order
        # per device: its timeline's end, the ends of its unfinished chunks, its worker's queue of chunk durations
        dev_end = [[start] * D for _ in range(R)]
        running = [[[] for _ in range(D)] for _ in range(R)]
        queue = [[[] for _ in range(D)] for _ in range(R)]
        source_free = [start] * R  # one worker of a rank asks the source at a time
        closed = [False] * R  # a rank's source, once a call found nothing (the scheduler closes it)
        done = [[False] * D for _ in range(R)]
        rank_end = [start] * R
        leave, remote = [], 0
        events = [(start, r, d, 0) for r in range(R) for d in range(D)]
        heapq.heapify(events)

        def dur(r, d, victim, n):
            return self.chunks[victim][n]

        def launch(r, d, t, samples):
            """Launches a chunk of `samples` at t (its speed: the one at its start); returns when the worker is free."""
            begin = max(t, dev_end[r][d])
            factor = DROP_FACTOR if r == 0 and d == 0 and begin - start >= drop_at else 1.0
            length = samples * self.sample_us / (self.dev_speed[r][d] * factor)
            dev_end[r][d] = begin + length
            run = running[r][d]
            run.append(begin + length)
            while run and run[0] <= t:
                run.pop(0)
            due = dev_end[r][d] - self.lead
            if len(run) >= self.in_flight:
                due = max(due, run[0])
            return max(t, due + c.overshoot) if due > t else t

        while events:
            t, r, d, _ = heapq.heappop(events)
            if done[r][d]:
                continue
            q = queue[r][d]
            if not q:  # a sibling's queue, else the source
                sib = max(range(D), key=lambda e: len(queue[r][e]))
                if len(queue[r][sib]) > 1:
                    k = len(queue[r][sib]) // 2
                    q.extend(queue[r][sib][-k:])
                    del queue[r][sib][-k:]
            if not q and closed[r]:  # the source said no more: this device is done too
                done[r][d] = True
                rank_end[r] = max(rank_end[r], t, dev_end[r][d] + c.overshoot)
                continue
            if not q:
                if source_free[r] > t:
                    heapq.heappush(events, (source_free[r], r, d, 1))
                    continue
                t0 = t
                if front[r] < back[r]:
                    t += c.own
                    k = min(D, back[r] - front[r])
                    q.extend(dur(r, d, r, i) for i in range(front[r], front[r] + k))
                    front[r] += k
                    if back[r] == front[r]:
                        self.nonempty.remove(r)
                else:
                    v, n_same, n_other = self.find_victim(r, lambda u: back[u] - front[u])
                    t += n_same * c.read_same + n_other * c.read_other
                    if v is not None:
                        k = steal_amount(back[v] - front[v], self.rank_speed[r], self.rank_speed[v])
                        t += self.cas_cost(r, v)
                        q.extend(dur(r, d, v, i) for i in range(back[v] - k, back[v]))
                        back[v] -= k
                        remote += k
                        if back[v] == front[v]:
                            self.nonempty.remove(v)
                source_free[r] = t
                if not q:  # nothing anywhere: the rank's source closes, and this device is done
                    closed[r] = True
                    leave.append(t - t0)
                    done[r][d] = True
                    rank_end[r] = max(rank_end[r], t, dev_end[r][d] + c.overshoot)
                    continue
            heapq.heappush(events, (launch(r, d, t, q.pop(0)), r, d, 0))
        phase_end = max(rank_end)
        # The tally's allreduce ends once the last rank is in, but a rank notices only between its stall watch's
        # sweeps: every 10 ms of its wait it reads the progress word of every rank it watches.
        done_at = phase_end + c.tally
        end = done_at
        for r in range(R):
            sweep = self.sweep_us(r)
            k = max(1, math.ceil((done_at - rank_end[r] - WATCH_US) / max(WATCH_US, sweep)))  # the sweep that may cover done_at
            at = rank_end[r] + WATCH_US + (k - 1) * max(WATCH_US, sweep)
            if at <= done_at < at + sweep:
                end = max(end, at + sweep)
        return end + self.rank_fixed_us, phase_end, statistics.mean(leave), remote

    def watched(self, me):
        """The ranks me's watches read (detail::watched_ranks): all, or with fingers me + 1, 2, 4, ..."""
        if not self.fingers or self.R - 1 <= 64:
            return None
        out, d = [], 1
        while d < self.R:
            out.append((me + d) % self.R)
            d *= 2
        return out

    def sweep_us(self, me):
        w = self.watched(me)
        if w is None:
            same = self.per_node - 1
            return same * self.c.read_same + (self.R - 1 - same) * self.c.read_other
        return sum(self.c.read_same if self.node[v] == self.node[me] else self.c.read_other for v in w)

    def ideal(self):
        return self.batch * self.sample_us / sum(self.rank_speed)

    def reported(self):
        """What stealbench reports: the median step; slowdown: the mean over a period of three steps, one a drop."""
        if self.scenario != "slowdown":
            return self.step()
        steps = [self.step(drop=True), self.step(), self.step()]
        return tuple(statistics.mean(s[i] for s in steps) for i in range(4))


def run_one(a, costs):
    speeds = SCENARIOS[a.scenario]
    if a.probes == 0:  # as the runtime's 0: auto
        a.probes = auto_probes(a.ranks, max(1, a.ranks // a.nodes))
    m = Model(a.ranks, a.nodes, a.devices, speeds, a.batch_per_rank * a.ranks, a.chunk, a.sample_us, a.in_flight, a.lead_us, costs,
              a.probes, a.plan_ns, a.seed, a.rank_fixed_us)
    return m, m.reported()


def residual(R, N, D, batch, c, plan_ns):
    """The measured step with no compute beyond the model's own (0 where none was measured)."""
    if c.step_overhead is None:
        return 0.0
    empty = Model(R, N, D, SCENARIOS["hetero"], batch, 16, 100.0 * 0.01 / 20, 2, 500.0, c, None, plan_ns)
    return max(0.0, c.step_overhead - empty.step()[0])


def validate(path, tolerance, plan_ns):
    """Every `measured ranks R nodes N devices D scenario S batch B ... step_ms X gate G` row against the model with
    the unit costs of its block."""
    rows = [(kv, row) for _, kv, measured in blocks(path) for row in measured]
    worst, bad, gates = 0.0, 0, 0
    print(f"# cluster_model --validate {path}: the model with each row's measured unit costs against the step stealbench measured")
    print(f"{'# ranks':>7} {'nodes':>5} {'scenario':<10} {'measured(ms)':>12} {'model(ms)':>10} {'error':>7} {'ideal(ms)':>9}  model: last call(us) remote chunks")
    for kv_, f_ in rows:
        R, N, D = int(f_["ranks"]), int(f_["nodes"]), int(f_["devices"])
        gated = f_.get("gate", "1") == "1"
        c = Costs(kv_)
        m = Model(R, N, D, SCENARIOS[f_["scenario"]], int(f_["batch"]), int(f_.get("chunk", 16)), 100.0, 2, 500.0, c, None, plan_ns,
                  rank_fixed_us=residual(R, N, D, int(f_["batch"]), c, plan_ns))
        step, _, leave, remote = m.reported()
        measured = float(f_["step_ms"])
        err = step / 1e3 / measured - 1
        if gated:
            worst = max(worst, abs(err))
            bad += abs(err) > tolerance
            gates += 1
        print(f"{R:7d} {N:5d} {f_['scenario']:<10} {measured:12.3f} {step / 1e3:10.3f} {err * 100:+6.1f}% {m.ideal() / 1e3:9.3f}  {leave:10.1f} "
              f"{remote:8.1f}{'' if gated else '  (not gated: ranks share a core, see below)'}")
    print(f"# {gates} gated rows, largest error {worst * 100:.1f}%, {bad} beyond {tolerance * 100:.0f}%; {len(rows) - gates} not gated")
    if gates < len(rows):
        print("#   not gated: emulated nodes whose ranks share a core (two ranks a node, or two nodes a core). A rank that waits in a")
        print("#   one-sided read spins, and the target's progress agent that must answer it then waits for that core: the reads the")
        print("#   unit costs time one at a time take tens of ms when every rank reads at once (last_call_us). Real nodes give each")
        print("#   rank its cores; the model takes the unit costs as they come and does not model that contention.")
    return 1 if bad or not gates else 0


def auto_probes(R, per_node):
    """ClusterOptions::probes = 0: every other node's rank up to 64 of them, else 2 x ceil(log2 R), at least 16."""
    others = R - per_node
    return None if others <= 64 else max(16, 2 * math.ceil(math.log2(R)))


def blocks(path):
    """The validation file's blocks in order: (label, costs, measured rows), each row a dict of its `name value` pairs."""
    out = []
    with open(path) as f:
        for line in f:
            if line.startswith("## "):
                out.append((line[3:].strip(), {}, []))
            elif not out:
                continue
            elif line.startswith("measured "):
                p = line.split()[1:]
                out[-1][2].append(dict(zip(p[0::2], p[1::2])))
            elif pair := cost_line(line):
                out[-1][1][pair[0]] = pair[1]
    return out


def scale(a):
    """The step at 100, 1,000 and 10,000 ranks, unbounded (every rank read at the last
    call, every rank watched) and with the bounds, on the costs measured across emulated nodes and on RDMA-class ones."""
    b = blocks(a.inputs)
    one = next(kv for label, kv, _ in b if label.startswith("one node, 8 ranks"))
    two = next(kv for label, kv, _ in b if label.startswith("one node, 2 ranks"))
    net = next(kv for label, kv, _ in b if label.startswith("2 emulated nodes x 1 rank"))
    if a.plan_ns == 0:
        a.plan_ns = two.get("table_cut_ns_per_chunk", 20.0)
    c2 = Costs(two)
    fixed = residual(2, 1, 1, 256, c2, 0.0)  # the runtime's own per-step work, measured where nothing is oversubscribed
    sets = {
        # across nodes: measured between two emulated nodes (TCP, 50 us one way, the progress agent answering);
        # within a node: measured on one node at 8 ranks (osc sm). One allreduce round: the 2-node allreduce.
        "emulated TCP": dict(read_same=one["read_same_node_us"], cas_same=one["cas_same_node_us"], read_other=net["read_other_node_us"],
                             cas_other=net["cas_other_node_us"], own=net.get("own_word_us", 0.5), round_us=net["allreduce_16_doubles_us"]),
        # assumed, not measured here: remote atomics in hardware (osc ucx on InfiniBand or RoCE)
        "RDMA (assumed)": dict(read_same=one["read_same_node_us"], cas_same=one["cas_same_node_us"], read_other=2.0, cas_other=2.5,
                               own=0.5, round_us=3.0),
    }
    print(f"# cluster_model --scale: hetero (speeds 1, 0.8, 0.5, 0.25), {a.per_node} ranks a node x 1 device, 128 samples a rank "
          f"(weak scaling), 100 us a sample at speed 1, chunk 16")
    print(f"#   inputs: {a.inputs}; the runtime's own per-step work {fixed:.0f} us (one node, 2 ranks); overshoot "
          f"{one['sleep_overshoot_us']:.0f} us; the chunk table {a.plan_ns:.0f} ns a chunk on every rank (measured: the cut alone);")
    print(f"#   allreduce = ceil(log2 R) rounds + 2 x the tally's bytes (doubles: 8 per chunk, 96 per rank) at {a.gbps:g} Gbit/s")
    print("#   unbounded: every rank read at the last call, every rank watched; bounded: probes auto (the node + 2 ceil(log2 R) >= 16 others)"
          f"{', a call reading for one chunk at most' if a.budget else ''}, fingers watched")
    print("#   last call: a rank's mean; watch sweep: the stall watch's reads every 10 ms of a wait (and the heartbeat's each period,")
    print("#   its share of a 1 s period in the last column); table: every rank cuts every rank's share each step")
    print(f"{'# costs':<15} {'scenario':<9} {'ranks':>6} {'runtime':>8} {'step(ms)':>9} {'ideal(ms)':>9} {'eff':>6} {'last call(ms)':>13} {'watch sweep(ms)':>15} "
          f"{'table(ms)':>9} {'tally(ms)':>9} {'heartbeat':>9}")
    for name, st in sets.items():
        for scen in a.scale_scenarios:
            for R in a.scale_ranks:
                for bounded in (False, True):
                    rounds = math.ceil(math.log2(R))
                    c = Costs({"read_same_node_us": st["read_same"], "cas_same_node_us": st["cas_same"], "read_other_node_us": st["read_other"],
                               "cas_other_node_us": st["cas_other"], "own_word_us": st["own"], "allreduce_16_doubles_us": rounds * st["round_us"],
                               "sleep_overshoot_us": one["sleep_overshoot_us"]})
                    probes = auto_probes(R, a.per_node) if bounded else None
                    m = Model(R, max(1, R // a.per_node), 1, SCENARIOS[scen], 128 * R, 16, 100.0, 2, 500.0, c, probes, a.plan_ns, a.seed, fixed)
                    # the tally, in doubles: one a chunk of the table and 12 a rank (5 of its own, 7 of its device), twice
                    # over the link, plus the rounds
                    c.tally = rounds * st["round_us"] + 2 * 8 * (m.total_chunks + 12 * R) * 8 / (a.gbps * 1e3)
                    m.fingers = bounded
                    if bounded and a.budget:
                        m.budget_us = [max(m.chunks[r]) * 100.0 / m.rank_speed[r] for r in range(R)]  # one full chunk's time
                    step, _, leave, _ = m.reported()
                    sweep = m.sweep_us(0)
                    # the heartbeat sweeps the same ranks every tenth of its timeout (1 s by default) under the rank's MPI lock
                    print(f"{name:<15} {scen:<9} {R:6d} {'bounded' if bounded else 'unbounded':>8} {step / 1e3:9.2f} {m.ideal() / 1e3:9.2f} {m.ideal() / step:6.3f} "
                          f"{leave / 1e3:13.3f} {sweep / 1e3:15.3f} {a.plan_ns * m.total_chunks / 1e6:9.3f} {c.tally / 1e3:9.3f} {sweep / 1e6 * 100:8.1f}%")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--validate", metavar="FILE")
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--scale", action="store_true")
    ap.add_argument("--costs", metavar="FILE", help="`dequebench --remote --costs` output")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--devices", type=int, default=1, help="devices a rank")
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), default="hetero")
    ap.add_argument("--batch-per-rank", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=16)
    ap.add_argument("--sample-us", type=float, default=100.0)
    ap.add_argument("--in-flight", type=int, default=2)
    ap.add_argument("--lead-us", type=float, default=500.0)
    ap.add_argument("--probes", type=int, default=None, help="bounded victims: the own node and this many others drawn per call (0: auto, as ClusterOptions::probes; default: all)")
    ap.add_argument("--plan-ns", type=float, default=0.0, help="building the chunk table, ns per chunk (every rank); --scale: "
                    "default the measured table_cut_ns_per_chunk")
    ap.add_argument("--seed", type=int, default=1)
    # --scale's inputs
    ap.add_argument("--scale-scenarios", type=lambda s: s.split(","), default=["hetero", "slowdown"])
    ap.add_argument("--scale-ranks", type=lambda s: [int(x) for x in s.split(",")], default=[100, 1000, 10000])
    ap.add_argument("--inputs", default="perf/cluster_model_measured.txt", help="--scale: the measured unit costs (a validation file)")
    ap.add_argument("--per-node", type=int, default=8, help="--scale: ranks a node")
    ap.add_argument("--budget", action="store_true", help="--scale: bounded calls also stop reading other nodes after one chunk's time")
    ap.add_argument("--gbps", type=float, default=10.0, help="--scale: the link rate for the tally's bytes")
    a = ap.parse_args()
    if a.validate:
        return validate(a.validate, a.tolerance, a.plan_ns)
    if a.scale:
        scale(a)
        return 0
    costs = Costs(read_costs(a.costs) if a.costs else {})
    a.rank_fixed_us = residual(a.ranks, a.nodes, a.devices, a.batch_per_rank * a.ranks, costs, a.plan_ns)
    m, (step, phase, leave, remote) = run_one(a, costs)
    print(f"ranks {a.ranks} nodes {a.nodes} devices {a.devices} scenario {a.scenario}: step {step / 1e3:.3f} ms (ideal {m.ideal() / 1e3:.3f}), "
          f"chunk phase ends {phase / 1e3:.3f} ms, last call {leave:.1f} us, {remote} chunks stolen across ranks, {m.total_chunks} chunks")
    return 0


if __name__ == "__main__":
    sys.exit(main())

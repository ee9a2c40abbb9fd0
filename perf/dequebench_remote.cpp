// dequebench --remote: what one steal across ranks costs on this machine, beside a local one. Two ranks (mpirun -np 2):
// rank 1 reads rank 0's share word and takes one chunk off its back with a compare-and-swap (MpiCluster::read +
// compare_and_swap, each flushed), again and again, while rank 0 computes without calling MPI; rank 0 does the same on
// its own word (a local steal through the window). Prints p50 and p99 of each, in dequebench's style. With --costs, on
// any number of ranks: the unit costs of the cross-rank step that perf/cluster_model.py takes as its inputs.
//
//   mpirun --allow-run-as-root -np 2 ./build/perf/dequebench --remote [--steals N]
#include "dequebench_remote.hpp"

#include <stealbatch/mpi/mpi_cluster.hpp>
#include <stealbatch/runtime/detail/cost_profile.hpp>
#include <stealbatch/runtime/detail/timer_slack.hpp>
#include <stealbatch/stats.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace stealbatch::perf {
namespace {

using Clock = std::chrono::steady_clock;

// n steals of one chunk each from `victim`'s word, which starts with n chunks; the time of each, in microseconds.
std::vector<double> steals(mpi::MpiCluster& c, int victim, std::uint32_t n) {
  std::vector<double> us;
  us.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    for (std::uint64_t old = c.read(victim, Cluster::kShare);;) {
      const detail::ShareWord s = detail::ShareWord::unpack(old);
      if (s.left() == 0) break;
      const std::uint64_t seen = c.compare_and_swap(victim, Cluster::kShare, old, detail::ShareWord{s.tag, s.front, s.back - 1}.pack());
      if (seen == old) break;
      old = seen;
    }
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return us;
}

}  // namespace

int run_remote_steal(std::uint32_t n) {
  auto c = mpi::MpiCluster::world();
  if (c->size() != 2) {
    if (c->rank() == 0) std::fprintf(stderr, "dequebench --remote: run it on 2 ranks (mpirun -np 2)\n");
    return 2;
  }
  const int me = c->rank();
  c->write(me, Cluster::kShare, detail::ShareWord{1, 0, n}.pack());
  std::vector<double> sync{0};
  c->allreduce_sum(sync);
  std::vector<double> us;
  if (me == 1) {
    us = steals(*c, 0, n);  // remote: rank 0's word, rank 0 busy below
  } else {
    // The victim computes without calling MPI for as long as the thief needs (a spin on a plain counter).
    volatile std::uint64_t x = 0;
    const auto until = Clock::now() + std::chrono::seconds(2);
    while (Clock::now() < until) x = x + 1;
  }
  std::vector<double> local;
  c->allreduce_sum(sync);
  if (me == 0) {
    c->write(0, Cluster::kShare, detail::ShareWord{2, 0, n}.pack());
    local = steals(*c, 0, n);  // the owner's own word through the window
  }
  std::vector<double> out{0, 0, 0, 0};
  if (me == 1) out[0] = percentile(us, 0.5), out[1] = percentile(us, 0.99);
  if (me == 0) out[2] = percentile(local, 0.5), out[3] = percentile(local, 0.99);
  c->allreduce_sum(out);
  if (me == 0) {
    const std::string where = c->same_node(1) ? "on one node (" + c->node_name(0) + ")" : "on two nodes (" + c->node_name(0) + ", " + c->node_name(1) + ")";
    std::printf("# dequebench --remote: 2 ranks %s, %u one-chunk steals each (read + compare-and-swap, flushed)\n", where.c_str(), n);
    std::printf("%-36s %10s %10s\n", "#steal", "p50(us)", "p99(us)");
    std::printf("%-36s %10.2f %10.2f\n", "remote (victim computing, no MPI)", out[0], out[1]);
    std::printf("%-36s %10.2f %10.2f\n", "own word through the window", out[2], out[3]);
  }
  return 0;
}

namespace {

double p50(std::vector<double> v) { return v.empty() ? 0.0 : percentile(v, 0.5); }

}  // namespace

int run_remote_costs(std::uint32_t n) {
  auto c = mpi::MpiCluster::world();
  const int me = c->rank(), ranks = c->size();
  if (ranks < 2) {
    std::fprintf(stderr, "dequebench --remote --costs: run it on 2 or more ranks (mpirun -np N)\n");
    return 2;
  }
  c->write(me, Cluster::kShare, detail::ShareWord{1, 0, n}.pack());
  c->write(me, Cluster::kWhere, 0);
  std::vector<double> sync{0};
  c->allreduce_sum(sync);
  // A thief's read and compare-and-swap of a victim's word while the victim's threads sleep, as a simulated device's
  // do in a step: in phase 0 the even ranks read the next rank's word (on a node of an even number of ranks, a rank
  // of their own node), in phase 1 the odd ranks (with such nodes, a rank of the next node). The victim sleeps in
  // 1 ms steps until its thief marks its kWhere word.
  std::vector<double> read_us, cas_us;
  bool read_same = false;
  for (int phase = 0; phase < 2; ++phase) {
    const int next = (me + 1) % ranks, prev = (me + ranks - 1) % ranks;
    if (me % 2 == phase && !(ranks % 2 == 1 && me == ranks - 1)) {
      read_same = c->same_node(next);
      for (std::uint32_t i = 0; i < n / 2; ++i) {
        const auto t0 = Clock::now();
        const std::uint64_t old = c->read(next, Cluster::kShare);
        const auto t1 = Clock::now();
        const detail::ShareWord s = detail::ShareWord::unpack(old);
        if (s.left() == 0) break;
        c->compare_and_swap(next, Cluster::kShare, old, detail::ShareWord{s.tag, s.front, s.back - 1}.pack());
        const auto t2 = Clock::now();
        read_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        cas_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
      }
      c->write(next, Cluster::kWhere, static_cast<std::uint64_t>(phase) + 1);
    } else if (prev % 2 == phase && !(ranks % 2 == 1 && prev == ranks - 1)) {
      while (c->read(me, Cluster::kWhere) != static_cast<std::uint64_t>(phase) + 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    c->allreduce_sum(sync);
  }
  // The owner's claim: a read and a compare-and-swap of its own word through the window.
  std::vector<double> own_us;
  c->write(me, Cluster::kShare, detail::ShareWord{2, 0, n}.pack());
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    const std::uint64_t old = c->read(me, Cluster::kShare);
    const detail::ShareWord s = detail::ShareWord::unpack(old);
    c->compare_and_swap(me, Cluster::kShare, old, detail::ShareWord{s.tag, s.front + 1, s.back}.pack());
    own_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  c->allreduce_sum(sync);
  // The last call for work: one read of every other rank's word in turn (the node's first), every rank at once.
  std::vector<double> sweep_us;
  for (int round = 0; round < 50; ++round) {
    const auto t0 = Clock::now();
    for (int pass = 0; pass < 2; ++pass) {
      for (int i = 1; i < ranks; ++i) {
        const int v = (me + i) % ranks;
        if (c->same_node(v) == (pass == 0)) (void)c->read(v, Cluster::kShare);
      }
    }
    sweep_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  // The step's collectives: the agreement's 16 doubles and a tally of 32 floats a rank, back to back.
  std::vector<double> small_us, tally_us;
  std::vector<double> agree(16, 1.0);
  std::vector<float> tally(static_cast<std::size_t>(32 * ranks), 1.0f);
  for (int i = 0; i < 200; ++i) {
    auto t0 = Clock::now();
    c->allreduce_sum(agree, {});
    small_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    t0 = Clock::now();
    c->allreduce_sum(tally, {});
    tally_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  // A simulated device's sleep overshoot with every rank's threads about.
  const std::vector<double> over_us = detail::sleep_overshoots_us(200, std::chrono::milliseconds(1));
  // Cutting the chunk table, which every rank does for every rank's share at each step: 10,000 shares of 128 equal
  // samples into chunks of 16 (detail::cut_share), ns per chunk; the best of 5.
  double cut_ns = 1e300;
  {
    std::vector<std::uint32_t> sizes;
    for (int round = 0; round < 5; ++round) {
      std::size_t chunks = 0;
      const auto t0 = Clock::now();
      for (std::uint32_t r = 0; r < 10000; ++r) {
        sizes.clear();
        detail::cut_share(r * 128, (r + 1) * 128, 16, 4, {}, sizes);
        chunks += sizes.size();
      }
      cut_ns = std::min(cut_ns, std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(chunks));
    }
  }
  // Each rank's medians, gathered; rank 0 prints the median over ranks of each.
  constexpr int kFields = 9;
  std::vector<double> all(static_cast<std::size_t>(kFields * ranks), 0.0);
  double* mine = all.data() + static_cast<std::ptrdiff_t>(kFields * me);
  mine[0] = p50(read_us), mine[1] = p50(cas_us), mine[2] = p50(sweep_us), mine[3] = p50(small_us), mine[4] = p50(tally_us);
  mine[5] = p50(over_us), mine[6] = read_us.empty() ? -1.0 : read_same ? 1.0 : 0.0, mine[7] = p50(own_us), mine[8] = cut_ns;
  c->allreduce_sum(all);
  if (me != 0) return 0;
  std::set<std::string> names;
  for (int r = 0; r < ranks; ++r) names.insert(c->node_name(r));
  const int nodes = static_cast<int>(names.size());
  auto over_ranks = [&](int f, int same) {  // same: 1 the thieves whose victim is on their node, 0 the others, -1 all
    std::vector<double> v;
    for (int r = 0; r < ranks; ++r) {
      const double where = all[static_cast<std::size_t>(kFields * r + 6)];
      if (same < 0 || where == same) v.push_back(all[static_cast<std::size_t>(kFields * r + f)]);
    }
    return v.empty() ? -1.0 : p50(v);
  };
  std::printf("# dequebench --remote --costs: %d ranks on %d node(s); victims asleep, the rest every rank at once; medians over ranks of each rank's median\n", ranks, nodes);
  std::printf("ranks %d\nnodes %d\n", ranks, nodes);
  std::printf("read_same_node_us %.3f\ncas_same_node_us %.3f\n", over_ranks(0, 1), over_ranks(1, 1));
  std::printf("read_other_node_us %.3f\ncas_other_node_us %.3f\n", over_ranks(0, 0), over_ranks(1, 0));
  std::printf("own_word_us %.3f\n", over_ranks(7, -1));
  std::printf("last_call_us %.3f\n", over_ranks(2, -1));
  std::printf("allreduce_16_doubles_us %.3f\nallreduce_tally_us %.3f\ntally_floats %d\n", over_ranks(3, -1), over_ranks(4, -1), 32 * ranks);
  std::printf("sleep_overshoot_us %.3f\n", over_ranks(5, -1));
  std::printf("table_cut_ns_per_chunk %.3f\n", over_ranks(8, -1));
  return 0;
}

}  // namespace stealbatch::perf

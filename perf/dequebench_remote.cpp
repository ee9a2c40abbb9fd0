// dequebench --remote: what one steal across ranks costs on this machine, beside a local one. Two ranks (mpirun -np 2):
// rank 1 reads rank 0's share word and takes one chunk off its back with a compare-and-swap (MpiCluster::read +
// compare_and_swap, each flushed), again and again, while rank 0 computes without calling MPI; rank 0 does the same on
// its own word (a local steal through the window). Prints p50 and p99 of each, in dequebench's style.
//
//   mpirun --allow-run-as-root -np 2 ./build/perf/dequebench --remote [--steals N]
#include "dequebench_remote.hpp"

#include <stealbatch/mpi/mpi_cluster.hpp>
#include <stealbatch/stats.hpp>

#include <chrono>
#include <cstdio>
#include <string>
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

}  // namespace stealbatch::perf

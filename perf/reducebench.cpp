// reducebench: the sum of a gradient-sized buffer across ranks, alone (no step around it): MpiCluster's float32 sum
// and its bfloat16 one, the median over repetitions, each begun together (a small sum first). Large sums take the
// cluster's pipelined ring, or two levels where a node holds several ranks; STEALBATCH_MPI_RING=0 gives MPI's own
// allreduce instead, 1 the ring and 2 two levels, for the comparison.
//
//   mpirun -np R build/perf/reducebench [--count N] [--reps K]      # N floats (5,800,000: the wide MLP), K rounds
#include <stealbatch/mpi/mpi_cluster.hpp>
#include <stealbatch/stats.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  std::size_t count = 5800000, reps = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--count") == 0) {
      count = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (std::strcmp(argv[i], "--reps") == 0) {
      reps = std::strtoull(argv[i + 1], nullptr, 10);
    } else {
      std::fprintf(stderr, "reducebench: unknown option '%s' (--count N, --reps K)\n", argv[i]);
      return 2;
    }
  }
  if (count == 0 || reps == 0) {
    std::fprintf(stderr, "reducebench: --count and --reps take a positive number\n");
    return 2;
  }
  using namespace stealbatch;
  const auto cluster = mpi::MpiCluster::world();
  std::vector<float> data(count);
  for (const bool bf16 : {false, true}) {
    std::vector<double> ms;
    for (std::size_t r = 0; r < reps; ++r) {
      for (std::size_t i = 0; i < count; ++i)
        data[i] = static_cast<float>((i + static_cast<std::size_t>(cluster->rank())) % 7) * 0.25f;
      std::vector<double> together{0.0};
      cluster->allreduce_sum(together);
      const auto t0 = std::chrono::steady_clock::now();
      if (bf16) {
        cluster->allreduce_sum_bf16(data, {});
      } else {
        cluster->allreduce_sum(std::span<float>(data), {});
      }
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    // The job's figure: the slowest rank's median.
    std::vector<double> all(static_cast<std::size_t>(cluster->size()), 0.0);
    all[static_cast<std::size_t>(cluster->rank())] = median(ms);
    cluster->allreduce_sum(all);
    double slowest = 0;
    for (double v : all) slowest = std::max(slowest, v);
    if (cluster->rank() == 0) {
      std::printf(
          "reducebench: %d ranks, %zu values (%.1f MB float), %s, %s: median %.1f ms (slowest rank's), %zu rounds\n",
          cluster->size(), count, static_cast<double>(count) * 4e-6, bf16 ? "bf16 on the wire" : "float32",
          cluster->large_sums(), slowest, reps);
    }
  }
  return 0;
}

// Runs across MPI ranks (mpirun -np R test_mpi_cluster CASE): exactly-once over many steps with random slowdowns, the
// gradient against one process's, bit-identical parameters, a chunk that throws on one rank, a remote steal while
// the victim computes, given sample costs across ranks, deterministic mode's bits against one process's, and the
// failures that must end the job (a stall, a hung rank, a dead rank). Each rank checks what it sees; the exit status
// is non-zero on any rank's failure (mpirun passes it on).
#include <stealbatch/error.hpp>
#include <stealbatch/mpi/mpi_cluster.hpp>
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/runtime/testing.hpp>
#include <stealbatch/sha256.hpp>

#include "ring_allreduce.hpp"
#include "two_level.hpp"

#include <mpi.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

using namespace stealbatch;
using stealbatch::testing::Fault;

namespace {

int g_failures = 0;
std::shared_ptr<mpi::MpiCluster> g_cluster;

#define EXPECT(cond)                                                                                          \
  do {                                                                                                        \
    if (!(cond)) {                                                                                            \
      std::fprintf(stderr, "rank %d: %s:%d: EXPECT(%s) failed\n", g_cluster->rank(), __FILE__, __LINE__, #cond); \
      ++g_failures;                                                                                           \
    }                                                                                                         \
  } while (0)

// A linear least-squares model on made-up data: sample s has features x_j = sin(s * (j + 1) * 0.37) and target
// y = cos(s * 0.11). A chunk adds (w.x - y) x for each of its samples: the gradient of half the squared error.
constexpr std::size_t kDim = 16;
float feature(std::uint32_t s, std::size_t j) { return std::sin(static_cast<float>(s) * static_cast<float>(j + 1) * 0.37f); }
float target(std::uint32_t s) { return std::cos(static_cast<float>(s) * 0.11f); }

void linear_chunk(ChunkContext& ctx) {
  double loss = 0;
  for (std::uint32_t s : ctx.samples) {
    float pred = ctx.params[kDim];  // bias
    for (std::size_t j = 0; j < kDim; ++j) pred += ctx.params[j] * feature(s, j);
    const float err = pred - target(s);
    for (std::size_t j = 0; j < kDim; ++j) ctx.grad[j] += err * feature(s, j);
    ctx.grad[kDim] += err;
    loss += 0.5 * err * err;
  }
  *ctx.loss_sum += loss;
}

ParameterLayout layout() {
  ParameterLayout l;
  l.add("w", kDim);
  l.add("b", 1);
  return l;
}

std::vector<float> initial() {
  std::vector<float> v(kDim + 1);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i);
  return v;
}

std::vector<std::uint32_t> batch_of(std::size_t n, std::uint64_t step) {
  std::vector<std::uint32_t> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::uint32_t>((i * 2654435761u + step * 97) % 100000);
  return b;
}

// A sample's given cost, long-tailed as documents' lengths are (1 to 249), from its id alone: the simulated devices
// take it as their time too (SimOptions::sample_cost), so a chunk's time follows the cost the runtime is given.
double cost_of(std::uint32_t s) {
  const double x = static_cast<double>((s * 2654435761u >> 7) % 64);
  return 1.0 + x * x / 16.0;
}

std::vector<double> costs_of(std::span<const std::uint32_t> b) {
  std::vector<double> c(b.size());
  for (std::size_t i = 0; i < b.size(); ++i) c[i] = cost_of(b[i]);
  return c;
}

std::uint64_t hash_floats(std::span<const float> v) {
  std::uint64_t h = 1469598103934665603ull;
  for (float f : v) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &f, 4);
    h = (h ^ bits) * 1099511628211ull;
  }
  return h;
}

// Options for a runtime on this job's ranks: the devices, the chunk size and, for simulated devices, a sample's time.
RuntimeOptions on_cluster(const std::string& devices, std::size_t chunk, double sample_seconds = 1e-5) {
  RuntimeOptions o;
  o.devices = devices;
  o.cluster.job = g_cluster;
  o.schedule.chunk_size = chunk;
  o.sim.sample_seconds = sample_seconds;
  return o;
}

// A simulated device's speed factor, new at random each step for each device of each rank: lo to lo + span.
std::function<double(std::size_t, std::uint64_t, double)> random_speeds(int me, double lo, double span) {
  return [me, lo, span](std::size_t d, std::uint64_t step, double) {
    const std::uint64_t h = (step * 0x9e3779b97f4a7c15ull) ^ (static_cast<std::uint64_t>(me) * 31 + d) * 0xbf58476d1ce4e5b9ull;
    return lo + span * static_cast<double>((h >> 40) % 1000) / 1000.0;
  };
}

// The samples of a step not run exactly once across the ranks: each rank's counts (from its chunk function), summed.
std::uint64_t not_run_once(const std::vector<std::atomic<int>>& count) {
  std::vector<double> seen(count.size());
  for (std::size_t i = 0; i < count.size(); ++i) seen[i] = count[i].load();
  g_cluster->allreduce_sum(seen);
  std::uint64_t wrong = 0;
  for (double c : seen) wrong += c != 1.0;
  return wrong;
}

// Every chunk of every step runs exactly once across the ranks: the runtime checks it in each step (it throws on a
// violation), and this test counts again from the chunk function, per sample, over 10^4 steps whose devices change
// speed at random.
void exactly_once() {
  const int me = g_cluster->rank();
  RuntimeOptions o = on_cluster("sim:1,1", 4, 2e-6);
  o.sim.speed_factor = random_speeds(me, 0.1, 5.0);
  o.stall_timeout = 60;
  Runtime rt(o);
  rt.register_parameters(layout(), initial());
  const std::size_t steps = std::getenv("SB_MPI_STEPS") ? std::strtoull(std::getenv("SB_MPI_STEPS"), nullptr, 10) : 10000;
  std::uint64_t remote = 0, wrong = 0;
  for (std::size_t s = 0; s < steps; ++s) {
    const std::size_t n = 64 + (s * 37) % 200;
    const std::vector<std::uint32_t> b = batch_of(n, s);
    std::vector<std::atomic<int>> count(n);
    const StepReport r = rt.compute_gradient(b, [&](ChunkContext& ctx) {
      const std::size_t first = static_cast<std::size_t>(ctx.samples.data() - b.data());
      for (std::size_t i = 0; i < ctx.samples.size(); ++i) count[first + i].fetch_add(1, std::memory_order_relaxed);
      linear_chunk(ctx);
    });
    remote += r.remote_chunks;
    wrong += not_run_once(count);
  }
  std::vector<double> total{static_cast<double>(remote)};
  g_cluster->allreduce_sum(total);
  if (me == 0) std::printf("exactly-once: %zu steps, %.0f chunks ran on another rank, %llu samples not run exactly once\n", steps, total[0], static_cast<unsigned long long>(wrong));
  EXPECT(wrong == 0);
  EXPECT(total[0] > 0);  // the ranks did steal from each other
}

// The ranks of this job as if on nodes of `per_node` ranks each (rank r on node r / per_node, named "groupN"): every
// call but same_node() and node_name() goes to the real cluster. So one machine can run the paths that only ranks of
// other nodes take. The decorators below override what they change.
class Grouped : public Cluster {
 public:
  Grouped(std::shared_ptr<Cluster> c, int per_node) : m_c(std::move(c)), m_per(per_node) {}
  int rank() const noexcept override { return m_c->rank(); }
  int size() const noexcept override { return m_c->size(); }
  bool same_node(int r) const noexcept override { return r / m_per == m_c->rank() / m_per; }
  std::string node_name(int r) const override { return "group" + std::to_string(r / m_per); }
  std::uint64_t read(int r, Word w) override { return m_c->read(r, w); }
  std::uint64_t compare_and_swap(int r, Word w, std::uint64_t e, std::uint64_t d) override { return m_c->compare_and_swap(r, w, e, d); }
  void write(int r, Word w, std::uint64_t v) override { m_c->write(r, w, v); }
  Access access_in_flight() const noexcept override { return m_c->access_in_flight(); }
  bool has_node_pulse() const noexcept override { return m_c->has_node_pulse(); }
  void set_node_pulse(std::uint64_t v) noexcept override { m_c->set_node_pulse(v); }
  std::uint64_t node_pulse(int r) const noexcept override { return m_c->node_pulse(r); }
  void allreduce_sum(std::span<float> d, const std::function<void()>& f) override { m_c->allreduce_sum(d, f); }
  void allreduce_sum(std::span<double> d, const std::function<void()>& f) override { m_c->allreduce_sum(d, f); }
  void allreduce_sum(std::span<std::int64_t> d, const std::function<void()>& f) override { m_c->allreduce_sum(d, f); }
  void broadcast(std::span<char> d, int root) override { m_c->broadcast(d, root); }
  [[noreturn]] void abort(const std::string& why, int code) noexcept override {
    m_c->abort(why, code);
    std::abort();  // not reached: the cluster's abort does not return
  }

 private:
  std::shared_ptr<Cluster> m_c;
  int m_per;
};

// ... counting the steals that cross a group.
class GroupedNodes final : public Grouped {
 public:
  using Grouped::Grouped;
  std::uint64_t compare_and_swap(int r, Word w, std::uint64_t e, std::uint64_t d) override {
    const std::uint64_t seen = Grouped::compare_and_swap(r, w, e, d);
    if (w == kShare && seen == e && !same_node(r)) crossed.fetch_add(1, std::memory_order_relaxed);  // a steal from another group
    return seen;
  }
  std::atomic<std::uint64_t> crossed{0};  // successful compare-and-swaps of another group's share word
};

// ... counting this rank's reads of the other ranks' share words.
class CountedShareReads final : public Grouped {
 public:
  using Grouped::Grouped;
  std::uint64_t read(int r, Word w) override {
    if (w == kShare && r != rank()) others.fetch_add(1, std::memory_order_relaxed);
    return Grouped::read(r, w);
  }
  std::atomic<std::uint64_t> others{0};
};

// Bounded calls for work (ClusterOptions::probes): 4 ranks posing as 2 nodes of 2 with probes 1 (each call reads
// its node's other rank, then one rank of the other node), then as 4 nodes of 1 with probes 2 (two of the three
// others drawn, distinct, per call). Every sample of 1,000 steps a case, whose devices change speed at random, runs
// exactly once, counted from the chunk function, and chunks are taken from the other nodes' share words (steals that
// cross a node, counted at the window). Owners drain their shares, so every step ends whatever the draws find.
void bounded_probes() {
  const int me = g_cluster->rank();
  const std::size_t steps = std::getenv("SB_MPI_STEPS") ? std::strtoull(std::getenv("SB_MPI_STEPS"), nullptr, 10) : 1000;
  for (const auto& [per_node, probes] : {std::pair{2, 1}, std::pair{1, 2}}) {
    RuntimeOptions o = on_cluster("sim:1,1", 4, 2e-6);
    auto grouped = std::make_shared<GroupedNodes>(g_cluster, per_node);
    o.cluster.job = grouped;
    o.cluster.probes = static_cast<std::size_t>(probes);
    o.sim.speed_factor = random_speeds(me, 0.05, 2.0);
    o.stall_timeout = 60;
    Runtime rt(o);
    rt.register_parameters(layout(), initial());
    std::uint64_t wrong = 0;
    for (std::size_t s = 0; s < steps; ++s) {
      const std::size_t n = 64 + (s * 37) % 200;
      const std::vector<std::uint32_t> b = batch_of(n, s);
      std::vector<std::atomic<int>> count(n);
      rt.compute_gradient(b, [&](ChunkContext& ctx) {
        const std::size_t first = static_cast<std::size_t>(ctx.samples.data() - b.data());
        for (std::size_t i = 0; i < ctx.samples.size(); ++i) count[first + i].fetch_add(1, std::memory_order_relaxed);
        linear_chunk(ctx);
      });
      wrong += not_run_once(count);
    }
    std::vector<double> total{static_cast<double>(grouped->crossed.load())};
    g_cluster->allreduce_sum(total);
    if (me == 0) {
      std::printf("bounded probes (%d ranks a node, probes %d): %zu steps, %.0f steals across nodes, %llu samples not run exactly once\n", per_node,
                  probes, steps, total[0], static_cast<unsigned long long>(wrong));
    }
    EXPECT(wrong == 0);
    EXPECT(total[0] > 0);
  }
}

// The full-batch gradient with R ranks equals one process's (each rank computes that one itself).
// The mean gradient across the ranks (`devices` on each; with `costs`, each batch's sample costs given) against one
// process's, over five batches.
void gradient_matches_one_process(const char* devices, bool costs, const char* label) {
  RuntimeOptions o = on_cluster(devices, 8);
  o.host.threads_per_device = 1;
  Runtime rt(o);
  rt.register_parameters(layout(), initial());
  RuntimeOptions solo;
  solo.devices = "cpu:1";
  solo.host.threads_per_device = 1;
  solo.schedule.chunk_size = 8;
  Runtime one(solo);
  one.register_parameters(layout(), initial());
  for (std::uint64_t s = 0; s < 5; ++s) {
    const std::vector<std::uint32_t> b = batch_of(1000 + s * 13, s);
    rt.compute_gradient(b, linear_chunk, costs ? costs_of(b) : std::vector<double>{});
    one.compute_gradient(b, linear_chunk);
    double worst = 0;
    for (std::size_t i = 0; i < kDim + 1; ++i) {
      const double a = rt.gradient()[i], e = one.gradient()[i];
      const double err = std::abs(a - e) / std::max(1e-6, std::abs(e));
      worst = std::isfinite(err) ? std::max(worst, err) : std::numeric_limits<double>::infinity();  // a NaN fails
    }
    if (g_cluster->rank() == 0) std::printf("%s: step %llu, worst relative error %.3g\n", label, static_cast<unsigned long long>(s), worst);
    EXPECT(worst <= 1e-5);
  }
}

void gradient() { gradient_matches_one_process("cpu:2", false, "gradient"); }

// The way the cluster sums large buffers: as STEALBATCH_MPI_RING says (0, 1, 2), else on one node the ring.
void expect_large_sums() {
  const char* v = std::getenv("STEALBATCH_MPI_RING");
  const std::string want = v == nullptr || std::strcmp(v, "1") == 0 ? "ring" : std::strcmp(v, "2") == 0 ? "two levels" : "MPI's allreduce";
  if (g_cluster->rank() == 0) std::printf("large sums: %s\n", g_cluster->large_sums());
  EXPECT(g_cluster->large_sums() == want);
}

// bfloat16 on the wire. The collective: every element of the sum within bf16_sum_bound(R) x the sum of the ranks'
// magnitudes of the exact sum (each rank rebuilds every rank's values to know it), through MPI's own operation and
// through the default rounding around a float sum; and most elements not float's sum, so bfloat16 did cross. The
// runtime: 20 Adam steps with the gradient in bfloat16 across the ranks stay within 3% of the largest of float's
// parameters (20 runs on 4 ranks: 0.29% at most; which rank sums which chunks moves it, and Adam's step is bounded
// by the learning rate), and are not theirs.
void bf16_wire() {
  const int ranks = g_cluster->size(), me = g_cluster->rank();
  expect_large_sums();
  constexpr std::size_t kN = 4400003;  // odd, and 8.8 MB in bfloat16: 2 to 3 of the ring's 1 MiB segments a block
  const auto value = [](int r, std::size_t i) {  // magnitudes over 2^-20 .. 2^20, either sign
    const std::uint64_t h = (i * 0x9e3779b97f4a7c15ull) ^ (static_cast<std::uint64_t>(r) + 1) * 0xbf58476d1ce4e5b9ull;
    const double unit = static_cast<double>(h >> 11) / 9007199254740992.0;
    return static_cast<float>(std::ldexp(unit - 0.5, static_cast<int>((h >> 3) % 41) - 20));
  };
  std::vector<double> exact(kN, 0.0), magnitude(kN, 0.0);
  for (int r = 0; r < ranks; ++r) {
    for (std::size_t i = 0; i < kN; ++i) exact[i] += value(r, i), magnitude[i] += std::abs(value(r, i));
  }
  std::vector<float> as_float(kN);
  for (std::size_t i = 0; i < kN; ++i) as_float[i] = value(me, i);
  g_cluster->allreduce_sum(std::span<float>(as_float), {});
  const double bound = bf16_sum_bound(ranks);
  for (const bool mpi_op : {true, false}) {
    std::vector<float> sum(kN);
    for (std::size_t i = 0; i < kN; ++i) sum[i] = value(me, i);
    if (mpi_op) {
      g_cluster->allreduce_sum_bf16(sum, {});
    } else {
      g_cluster->Cluster::allreduce_sum_bf16(sum, {});  // the default, around a float sum
    }
    double worst = 0;
    std::size_t not_float = 0;
    for (std::size_t i = 0; i < kN; ++i) {
      worst = std::max(worst, std::abs(sum[i] - exact[i]) / magnitude[i]);
      not_float += sum[i] != as_float[i] ? 1 : 0;
    }
    if (me == 0) std::printf("bf16 %s: worst error %.3g of the magnitudes (bound %.3g), %zu of %zu elements not float's sum\n", mpi_op ? "MpiCluster" : "default", worst, bound, not_float, kN);
    EXPECT(worst <= bound);
    EXPECT(not_float > kN / 2);
  }
  const auto train = [](WireFormat wire) {
    RuntimeOptions o = on_cluster("cpu:1", 8);
    o.cluster.wire = wire;
    o.optimizer.kind = OptimizerKind::kAdam;
    o.optimizer.lr = 0.01f;
    Runtime rt(o);
    rt.register_parameters(layout(), initial());
    for (std::uint64_t s = 0; s < 20; ++s) rt.step(batch_of(512, s), linear_chunk);
    return rt.parameters();
  };
  const std::vector<float> f = train(WireFormat::kFloat32), b = train(WireFormat::kBfloat16);
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < f.size(); ++i) diff = std::max(diff, static_cast<double>(std::abs(f[i] - b[i]))), norm = std::max(norm, static_cast<double>(std::abs(f[i])));
  if (me == 0) std::printf("bf16 wire: 20 Adam steps, parameters within %.3g of float's (largest %.3g)\n", diff, norm);
  EXPECT(diff <= 0.03 * norm);
  EXPECT(diff > 0);
}

// The two-level sum (mpi/src/two_level.hpp) over the world's ranks posing as nodes: of 2 ranks each (the last alone
// at an odd count); all but the last rank on one node and the last on another; every rank its own node (a ring of
// every rank, no one to send to a leader); ranks 0 and 1 on one node and every other rank alone (a ring of 3 or more
// leaders, one with a follower); and the even and the odd ranks (a node's ranks not next to each other). Counts from
// 0 to ranks + 1 (empty blocks) and past the ring's segments; every rank ends with the exact sum. (The ring's hooks
// come in the order two_level.cpp expects, or it throws.)
void two_level_sums(const mpi::detail::RingType& as_int64) {
  const int ranks = g_cluster->size(), me = g_cluster->rank();
  const auto value = [](int r, std::size_t i) { return static_cast<std::int64_t>((i * 40503u + static_cast<std::size_t>(r) * 2654435761u) % 4001) - 2000; };
  std::vector<std::size_t> counts;
  for (std::size_t n = 0; n <= static_cast<std::size_t>(ranks) + 1; ++n) counts.push_back(n);
  counts.push_back(static_cast<std::size_t>(ranks) * 300000 + 7);
  std::mutex lock;
  const std::pair<const char*, int> layouts[] = {{"nodes of 2", me / 2},
                                                 {"the last rank alone", me == ranks - 1 ? 1 : 0},
                                                 {"every rank alone", me},
                                                 {"ranks 0 and 1 together", std::max(0, me - 1)},
                                                 {"even and odd", me % 2}};
  for (const auto& [layout, node] : layouts) {
    mpi::detail::TwoLevel levels;
    MPI_Comm_split(MPI_COMM_WORLD, node, me, &levels.node);
    MPI_Comm_rank(levels.node, &levels.node_rank);
    MPI_Comm_size(levels.node, &levels.node_size);
    MPI_Comm leaders = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, levels.node_rank == 0 ? 0 : MPI_UNDEFINED, me, &leaders);
    int ring[2] = {0, 1};
    if (leaders != MPI_COMM_NULL) {
      MPI_Comm_rank(leaders, &ring[0]);
      MPI_Comm_size(leaders, &ring[1]);
      std::vector<int> own(static_cast<std::size_t>(ring[1]));
      std::iota(own.begin(), own.end(), 0);
      levels.leaders = mpi::detail::ring_of(leaders, ring[0], own);
    }
    MPI_Bcast(ring, 2, MPI_INT, 0, levels.node);
    levels.position = ring[0], levels.nodes = ring[1];
    for (const std::size_t n : counts) {
      std::vector<std::int64_t> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = value(me, i);
      mpi::detail::two_level_allreduce(v.data(), n, as_int64, levels, lock, [](MPI_Request& r) { MPI_Wait(&r, MPI_STATUS_IGNORE); });
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < n; ++i) {
        std::int64_t sum = 0;
        for (int r = 0; r < ranks; ++r) sum += value(r, i);
        wrong += v[i] != sum ? 1 : 0;
      }
      if (me == 0 && (n <= 1 || n > 1000)) std::printf("two levels (%s), %zu elements: %zu wrong on rank 0\n", layout, n, wrong);
      EXPECT(wrong == 0);
    }
    if (leaders != MPI_COMM_NULL) MPI_Comm_free(&leaders);
    MPI_Comm_free(&levels.node);
  }
}

// The sums of large buffers (the ring, mpi/src/ring_allreduce.hpp) and of small ones (MPI_Iallreduce): float, double
// and int64 of integer values, so that every order of addition gives the exact sum; sizes below and above the
// ring's threshold, not divisible by the rank count, of one segment and of many; every rank ends with the same bits.
// And the ring's order puts each node's ranks next to each other.
void ring_sums() {
  const int ranks = g_cluster->size(), me = g_cluster->rank();
  expect_large_sums();
  const auto value = [](int r, std::size_t i) { return static_cast<std::int64_t>((i * 2654435761u + static_cast<std::size_t>(r) * 40503u) % 2001) - 1000; };
  for (const std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{16383}, std::size_t{16384}, std::size_t{100003}, std::size_t{1} << 20, std::size_t{2500007}}) {
    std::vector<float> f(n);
    std::vector<double> d(n);
    std::vector<std::int64_t> q(n);
    for (std::size_t i = 0; i < n; ++i) f[i] = static_cast<float>(value(me, i)), d[i] = static_cast<double>(value(me, i)) * 0.5, q[i] = value(me, i) << 40;
    g_cluster->allreduce_sum(std::span<float>(f), {});
    g_cluster->allreduce_sum(std::span<double>(d), {});
    g_cluster->allreduce_sum(std::span<std::int64_t>(q), {});
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      std::int64_t sum = 0;
      for (int r = 0; r < ranks; ++r) sum += value(r, i);
      wrong += f[i] != static_cast<float>(sum) || d[i] != static_cast<double>(sum) * 0.5 || q[i] != sum << 40 ? 1 : 0;
    }
    std::vector<double> hashes(static_cast<std::size_t>(ranks), 0.0);
    hashes[static_cast<std::size_t>(me)] = static_cast<double>(hash_floats(f) >> 12);
    g_cluster->allreduce_sum(hashes);
    const bool same = std::all_of(hashes.begin(), hashes.end(), [&](double h) { return h == hashes[0]; });
    if (me == 0) std::printf("ring sums of %zu elements: %zu wrong on rank 0, %s bits on every rank\n", n, wrong, same ? "the same" : "DIFFERENT");
    EXPECT(wrong == 0);
    EXPECT(same);
  }
  // The ring itself over the world's communicator, in an order that interleaves two made-up nodes (rank r on node
  // r % 2): counts from 0 to ranks + 1 (empty blocks), and one of several segments a block, of unequal blocks.
  std::vector<int> halves(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) halves[static_cast<std::size_t>(r)] = r % 2;
  const mpi::detail::Ring interleaved = mpi::detail::ring_of(MPI_COMM_WORLD, me, halves);
  const mpi::detail::RingType as_int64{sizeof(std::int64_t), MPI_INT64_T, [](const void* in, void* inout, std::size_t k) {
                                         for (std::size_t i = 0; i < k; ++i) static_cast<std::int64_t*>(inout)[i] += static_cast<const std::int64_t*>(in)[i];
                                       }};
  std::mutex lock;
  std::vector<std::size_t> counts;
  for (std::size_t n = 0; n <= static_cast<std::size_t>(ranks) + 1; ++n) counts.push_back(n);
  counts.push_back(static_cast<std::size_t>(ranks) * 300000 + 7);
  for (const std::size_t n : counts) {
    std::vector<std::int64_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = value(me, i);
    mpi::detail::ring_allreduce(v.data(), n, as_int64, interleaved, lock, [](MPI_Request& r) { MPI_Wait(&r, MPI_STATUS_IGNORE); });
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      std::int64_t sum = 0;
      for (int r = 0; r < ranks; ++r) sum += value(r, i);
      wrong += v[i] != sum ? 1 : 0;
    }
    if (me == 0 && (n <= 2 || n > 1000)) std::printf("ring over interleaved nodes, %zu elements: %zu wrong on rank 0\n", n, wrong);
    EXPECT(wrong == 0);
  }
  two_level_sums(as_int64);
  // Nodes {0, 2, 5}, {1, 4}, {3}: the ring visits 0 2 5 1 4 3.
  const std::vector<int> node_first{0, 1, 0, 3, 1, 0};
  const std::vector<int> order{0, 2, 5, 1, 4, 3};
  for (std::size_t i = 0; i < order.size(); ++i) {
    const mpi::detail::Ring ring = mpi::detail::ring_of(MPI_COMM_NULL, order[i], node_first);
    EXPECT(ring.position == static_cast<int>(i));
    EXPECT(ring.next == order[(i + 1) % order.size()]);
    EXPECT(ring.prev == order[(i + order.size() - 1) % order.size()]);
  }
}

// Counts cross the ranks exactly past float's 2^24: each rank runs 17 chunks of 1,000,001 samples (17,000,017, odd
// and over 2^24, where a float holds only even integers) with a chunk function that only counts, and every rank's
// report gives each device of the job its exact samples.
void large_counts() {
  constexpr std::size_t kChunk = 1000001, kBatch = 34 * kChunk;
  RuntimeOptions o = on_cluster("cpu:1", kChunk);
  o.schedule.policy = SchedulePolicy::kStatic;
  Runtime rt(o);
  rt.register_parameters(layout(), initial());
  std::vector<std::uint32_t> batch(kBatch);
  for (std::size_t i = 0; i < kBatch; ++i) batch[i] = static_cast<std::uint32_t>(i);
  const StepReport rep = rt.compute_gradient(batch, [](ChunkContext& ctx) { ctx.grad[kDim] += static_cast<float>(ctx.samples.size()); });
  std::uint64_t total = 0;
  for (const DeviceReport& d : rep.devices) {
    if (g_cluster->rank() == 0) std::printf("large counts: %s ran %llu samples\n", d.name.c_str(), static_cast<unsigned long long>(d.samples));
    EXPECT(d.samples == 17 * kChunk);
    total += d.samples;
  }
  EXPECT(rep.devices.size() == static_cast<std::size_t>(g_cluster->size()));
  EXPECT(total == kBatch);
}

// Automatic chunk sizes across ranks respect a call's fixed cost: with 3 ms a call beside 20 us a sample, a chunk
// under 2,850 samples spends more than 5% of its time on the fixed part, so once the ranks measured their chunk
// times each rank runs its share of 256 in one call or two, not in the 32-sample chunks (and finer ends) that the
// batch alone would give. Every sample still runs exactly once. A static run cuts no finer ends. And once a rank's
// share is one chunk, no rank's last call for work reads it (its owner claims it whole as it begins the step).
void efficient_chunks() {
  RuntimeOptions o = on_cluster("cpu:1", 0);
  auto counted = std::make_shared<CountedShareReads>(g_cluster, g_cluster->size());
  o.cluster.job = counted;
  Runtime rt(o);
  rt.register_parameters(layout(), initial());
  const auto fn = [](ChunkContext& ctx) {  // busy, as a call's own work is (a CPU device times its thread's CPU)
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(3000 + 20 * ctx.samples.size());
    while (std::chrono::steady_clock::now() < until) {
    }
    ctx.grad[kDim] += static_cast<float>(ctx.samples.size());
  };
  std::uint64_t first = 0, last = 0, whole_steps = 0;
  for (std::uint64_t s = 0; s < 12; ++s) {
    const std::uint64_t reads_before = counted->others.load();
    const StepReport rep = rt.compute_gradient(batch_of(256, s), fn);
    const std::uint64_t reads = counted->others.load() - reads_before;
    std::uint64_t calls = 0, samples = 0;
    for (const DeviceReport& d : rep.devices) calls += d.chunks_run, samples += d.samples;
    EXPECT(samples == 256);
    if (s == 0) first = calls;
    last = calls;
    // A share of several chunks is read once its owner's own share is empty (the last call for work); a share of one
    // chunk on a rank of one device is its owner's at once, and no rank reads it.
    if (s == 0) EXPECT(reads > 0);
    if (calls == static_cast<std::uint64_t>(g_cluster->size())) {
      EXPECT(reads == 0);
      ++whole_steps;
    }
  }
  if (g_cluster->rank() == 0) {
    std::printf("efficient chunks: %llu chunks in the first step, %llu in the last; %llu steps of one chunk a rank\n", static_cast<unsigned long long>(first),
                static_cast<unsigned long long>(last), static_cast<unsigned long long>(whole_steps));
  }
  EXPECT(first >= 8);
  EXPECT(last <= 4);
  EXPECT(whole_steps > 0);
  // A static run's shares are not stolen from: whole chunks of 32, no finer ends (4 a rank).
  o.schedule.policy = SchedulePolicy::kStatic;
  Runtime fixed(o);
  fixed.register_parameters(layout(), initial());
  std::uint64_t calls = 0;
  for (const DeviceReport& d : fixed.compute_gradient(batch_of(256, 0), fn).devices) calls += d.chunks_run;
  if (g_cluster->rank() == 0) std::printf("efficient chunks: static, %llu chunks in the first step\n", static_cast<unsigned long long>(calls));
  EXPECT(calls == 8);
}

// After 50 Adam steps every rank's parameters are bit-identical, and equal to one process's within float rounding.
void identical_parameters() {
  RuntimeOptions o = on_cluster(g_cluster->rank() % 2 == 0 ? "sim:1,0.5" : "sim:2", 8, 5e-6);
  o.optimizer.kind = OptimizerKind::kAdam;
  o.optimizer.lr = 0.01f;
  Runtime rt(o);
  rt.register_parameters(layout(), initial());
  for (std::uint64_t s = 0; s < 50; ++s) rt.step(batch_of(512, s), linear_chunk);
  const std::vector<float> p = rt.parameters();
  const std::uint64_t h = hash_floats(p);
  std::vector<double> mine(static_cast<std::size_t>(g_cluster->size()), 0.0);
  mine[static_cast<std::size_t>(g_cluster->rank())] = static_cast<double>(h >> 12);  // exact in a double
  g_cluster->allreduce_sum(mine);
  for (double v : mine) EXPECT(v == mine[0]);
  if (g_cluster->rank() == 0) std::printf("identical parameters: hash %016llx on every rank\n", static_cast<unsigned long long>(h));
}

// Deterministic mode: after 50 Adam steps the parameters are the same bytes on every rank count and every mix of
// devices as in one process on one device (each rank trains that reference itself first), with every third batch
// given sample costs (cells of a cost budget) and the simulated devices' speeds new at random each step.
void deterministic_across_ranks() {
  const auto train = [](RuntimeOptions o) {
    o.schedule.deterministic = true;
    o.schedule.chunk_size = 8;
    o.optimizer.kind = OptimizerKind::kAdam;
    o.optimizer.lr = 0.01f;
    Runtime rt(o);
    rt.register_parameters(layout(), initial());
    std::uint32_t redone = 0;
    for (std::uint64_t s = 0; s < 50; ++s) {
      const std::vector<std::uint32_t> b = batch_of(300 + s % 7 * 13, s);
      redone += rt.step(b, linear_chunk, s % 3 == 0 ? costs_of(b) : std::vector<double>{}).redone;
    }
    return std::pair(rt.parameters(), redone);
  };
  RuntimeOptions one;
  one.devices = "cpu:1";
  const auto [ref, ref_redone] = train(one);
  const int me = g_cluster->rank();
  RuntimeOptions o = on_cluster(me % 2 == 0 ? "sim:1,0.5" : "sim:2", 8, 5e-6);
  o.sim.speed_factor = random_speeds(me, 0.3, 1.4);
  const auto [p, redone] = train(o);
  EXPECT(std::memcmp(p.data(), ref.data(), p.size() * sizeof(float)) == 0);
  EXPECT(redone == ref_redone);
  EXPECT(redone >= 1);
  if (me == 0) {
    std::printf("deterministic: parameters sha256 %s on %d ranks and in one process on cpu:1 (%u steps redone)\n",
                sha256_hex(std::as_bytes(std::span<const float>(p))).c_str(), g_cluster->size(), redone);
  }
}

// Every rank agrees with rank 0's bits: true on all ranks, or false on all.
bool same_on_every_rank(std::span<const float> v) {
  std::vector<double> mine(static_cast<std::size_t>(g_cluster->size()), 0.0);
  mine[static_cast<std::size_t>(g_cluster->rank())] = static_cast<double>(hash_floats(v) >> 12);
  g_cluster->allreduce_sum(mine);
  for (double x : mine) {
    if (x != mine[0]) return false;
  }
  return true;
}

// A checkpoint across ranks: rank 0 writes, every rank loads, and the parameters are bit-identical on every rank
// after the load and after more steps; a file that one rank cannot read, or reads with other bytes, is applied by
// none of them.
void checkpoint() {
  // One path for the job: rank 0's, sent to the others.
  std::string dir = (std::filesystem::temp_directory_path() / ("sb_mpi_ckpt_" + std::to_string(::getpid()))).string();
  dir.resize(256, '\0');
  g_cluster->broadcast(dir, 0);
  dir.resize(dir.find('\0'));
  if (g_cluster->rank() == 0) std::filesystem::create_directories(dir);
  const std::string path = dir + "/c.safetensors";
  RuntimeOptions o = on_cluster(g_cluster->rank() % 2 == 0 ? "sim:1,0.5" : "sim:2", 8, 5e-6);
  o.optimizer.kind = OptimizerKind::kAdam;
  o.optimizer.lr = 0.01f;
  std::vector<float> saved;
  {
    Runtime rt(o);
    rt.register_parameters(layout(), initial());
    for (std::uint64_t s = 0; s < 20; ++s) rt.step(batch_of(512, s), linear_chunk);
    rt.save_checkpoint(path, {{"step", "20"}});
    saved = rt.parameters();
  }
  Runtime resumed(o);
  resumed.register_parameters(layout(), initial());
  const CheckpointMetadata meta = resumed.load_checkpoint(path);
  EXPECT(meta.at("step") == "20");
  const std::vector<float> loaded = resumed.parameters();
  EXPECT(loaded == saved);
  EXPECT(same_on_every_rank(loaded));
  for (std::uint64_t s = 20; s < 40; ++s) resumed.step(batch_of(512, s), linear_chunk);
  const std::vector<float> after = resumed.parameters();
  EXPECT(same_on_every_rank(after));
  // The last rank cannot read the file (as on a node without the shared file system): no rank applies it.
  const bool last = g_cluster->rank() == g_cluster->size() - 1;
  std::string message;
  try {
    resumed.load_checkpoint(last ? path + ".missing" : path);
  } catch (const CheckpointError& e) {
    message = e.what();
  }
  EXPECT(!message.empty());
  if (!last) EXPECT(message.find("another rank could not load it") != std::string::npos);
  const std::vector<float> kept = resumed.parameters();
  EXPECT(kept == after);
  double done[1] = {0};
  g_cluster->allreduce_sum(done);  // every rank is done with the files
  if (g_cluster->rank() == 0) {
    std::filesystem::remove_all(dir);
    std::printf("checkpoint: saved by rank 0, loaded by %d ranks, bit-identical after 20 more steps; a file one rank could not read "
                "was applied by none\n", g_cluster->size());
  }
}

// A chunk that throws on rank 1 fails that step on every rank, with a message that names rank 1 and its device;
// nothing is applied, and the next step runs on every rank.
void chunk_throws() {
  const int me = g_cluster->rank();
  RuntimeOptions o = on_cluster("sim:1", 8, 1e-5);
  o.schedule.policy = SchedulePolicy::kStatic;  // rank 1 runs its own share, so the fault fires there whatever the timing
  auto thrown = std::make_shared<std::atomic<bool>>(false);
  const stealbatch::testing::FaultInjector faults = [me, thrown](std::size_t, std::uint64_t step, ChunkId) {
    return me == 1 && step == 3 && !thrown->exchange(true) ? Fault::kThrow : Fault::kNone;
  };
  Runtime rt(o);
  stealbatch::testing::inject_faults(rt, faults);
  rt.register_parameters(layout(), initial());
  for (std::uint64_t s = 0; s < 2; ++s) rt.step(batch_of(256, s), linear_chunk);
  const std::vector<float> before = rt.parameters();
  std::string what;
  try {
    rt.step(batch_of(256, 2), linear_chunk);
  } catch (const std::exception& e) {
    what = e.what();
  }
  std::printf("rank %d: the failed step said: %s\n", me, what.c_str());
  EXPECT(!what.empty());
  if (me != 1) EXPECT(what.find("rank 1") != std::string::npos);
  EXPECT(what.find("sim0") != std::string::npos);
  const std::vector<float> after = rt.parameters();
  EXPECT(before == after);
  const StepReport r = rt.step(batch_of(256, 3), linear_chunk);
  EXPECT(r.step == 3);
}

// The victim's devices are inside 200 ms chunks and call no MPI; the thief still takes chunks from the victim's share
// (passive-target progress). kForced: the victim's first chunk lasts until the thief has started 5 of the victim's
// chunks (told through a file, not MPI; 20 s at most), so the thief can only get there by taking them while the victim
// computes, however late either rank runs. kTimed (a perf case): nothing waits, and the thief takes them within
// milliseconds of running out, so the step lasts about one victim chunk, not the victim's whole share.
enum class StealCheck { kForced, kTimed };

void remote_steal_while_victim_computes(StealCheck check) {
  const int me = g_cluster->rank();
  std::vector<char> dir(256, '\0');
  if (check == StealCheck::kForced && me == 0) {
    char tmpl[] = "/tmp/sb_steal_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    std::strncpy(dir.data(), tmpl, dir.size() - 1);
  }
  if (check == StealCheck::kForced) g_cluster->broadcast(dir, 0);
  const std::filesystem::path taken_five = std::filesystem::path(dir.data()) / "taken_five";
  RuntimeOptions o;
  o.devices = "sim:1";
  o.cluster.job = g_cluster;
  o.schedule.chunk_size = 10;
  o.sim.sample_seconds = 0.02;  // a 10-sample chunk: 200 ms on rank 0
  o.sim.speed_factor = [me](std::size_t, std::uint64_t, double) { return me == 0 ? 1.0 : 1000.0; };
  Runtime rt(o);
  rt.register_parameters(layout(), initial());
  using Clock = std::chrono::steady_clock;
  std::vector<Clock::time_point> starts;
  std::vector<bool> remote;
  std::size_t remote_started = 0;
  bool waited_out = false;
  const std::size_t batch = 160;  // 8 chunks per rank in the first step (speeds not yet known: equal shares)
  const std::vector<std::uint32_t> b = batch_of(batch, 0);
  const auto t0 = Clock::now();
  const StepReport r = rt.compute_gradient(b, [&](ChunkContext& ctx) {
    starts.push_back(Clock::now());
    remote.push_back(static_cast<std::size_t>(ctx.samples.data() - b.data()) < batch / 2);
    if (check == StealCheck::kForced) {
      if (me == 1 && remote.back() && ++remote_started == 5) std::ofstream(taken_five).put('5');
      if (me == 0 && starts.size() == 1) {
        const auto until = Clock::now() + std::chrono::seconds(20);
        while (!std::filesystem::exists(taken_five)) {
          if (Clock::now() > until) {
            waited_out = true;
            break;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
    }
    linear_chunk(ctx);
  });
  const double step_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (me == 1) {
    // The gap between running out of own chunks and starting the first one taken from rank 0.
    double gap_ms = -1;
    for (std::size_t i = 1; i < starts.size(); ++i) {
      if (remote[i] && !remote[i - 1]) gap_ms = std::chrono::duration<double, std::milli>(starts[i] - starts[i - 1]).count();
    }
    std::printf("remote steal: step %.3f s, %llu chunks taken from rank 0, first remote chunk %.2f ms after the last own one started\n", step_s,
                static_cast<unsigned long long>(r.remote_chunks), gap_ms);
    EXPECT(r.remote_chunks >= 5);
    if (check == StealCheck::kTimed) EXPECT(gap_ms >= 0 && gap_ms < 50);
  }
  if (check == StealCheck::kTimed) EXPECT(step_s < 0.8);  // rank 0 alone would take 8 x 200 ms
  if (check == StealCheck::kForced) {
    EXPECT(!waited_out);
    std::vector<double> sync{0};
    g_cluster->allreduce_sum(sync);  // rank 1 is done with the file
    if (me == 0) std::filesystem::remove_all(dir.data());
  }
}

// Sample costs across ranks: every sample once over 2000 steps (SB_MPI_STEPS) whose devices change speed at random,
// each chunk cut to the cost budget (no chunk more than one sample past it; chunks of cheap samples hold more than
// chunk_size), every device's cost in every rank's report, the gradient of one process, and the packer's ranks within
// one sample's cost of each other.
void given_costs() {
  const int me = g_cluster->rank();
  constexpr std::size_t kChunk = 8;
  double worst_over = 0;
  std::size_t most = 0;
  {
    RuntimeOptions o = on_cluster("sim:1,1", kChunk, 2e-7);
    o.sim.sample_cost = cost_of;
    o.sim.speed_factor = random_speeds(me, 0.2, 4.0);
    o.stall_timeout = 60;
    Runtime rt(o);
    rt.register_parameters(layout(), initial());
    std::uint64_t wrong = 0, cost_off = 0, remote = 0;
    const std::size_t steps = std::getenv("SB_MPI_STEPS") ? std::strtoull(std::getenv("SB_MPI_STEPS"), nullptr, 10) : 2000;
    for (std::uint64_t s = 0; s < steps; ++s) {
      const std::size_t n = 64 + (s * 37) % 200;
      std::vector<std::uint32_t> b = batch_of(n, s);
      // Every fourth batch grouped, longest first: a chunk cut by count there would hold kChunk of the longest.
      if (s % 4 == 0) std::sort(b.begin(), b.end(), [](std::uint32_t x, std::uint32_t y) { return cost_of(x) > cost_of(y); });
      const std::vector<double> cost = costs_of(b);
      double total = 0, biggest = 0;
      for (double c : cost) total += c, biggest = std::max(biggest, c);
      const double budget = static_cast<double>(kChunk) * total / static_cast<double>(n);  // kChunk samples of the mean cost
      std::vector<std::atomic<int>> count(n);
      std::mutex m;
      const StepReport r = rt.compute_gradient(b, [&](ChunkContext& ctx) {
        const std::size_t first = static_cast<std::size_t>(ctx.samples.data() - b.data());
        double c = 0;
        for (std::size_t i = 0; i < ctx.samples.size(); ++i) count[first + i].fetch_add(1, std::memory_order_relaxed), c += cost[first + i];
        {
          const std::lock_guard lock(m);
          worst_over = std::max(worst_over, (c - biggest) / budget);  // a chunk ends at most one sample past its budget
          most = std::max(most, ctx.samples.size());
        }
        linear_chunk(ctx);
      }, cost);
      remote += r.remote_chunks;
      double reported = 0;
      for (const DeviceReport& d : r.devices) reported += d.cost;  // every rank's devices, from the reduction
      cost_off += std::abs(reported - total) > 1e-4 * total;
      wrong += not_run_once(count);
    }
    std::vector<double> total{static_cast<double>(remote)};
    g_cluster->allreduce_sum(total);
    std::printf("costs: rank %d: %zu steps, %.0f chunks ran on another rank, %llu samples not run exactly once, %llu steps with a wrong cost sum; "
                "a chunk's cost at most %.3f budgets past its last sample; at most %zu samples a chunk\n",
                me, steps, total[0], static_cast<unsigned long long>(wrong), static_cast<unsigned long long>(cost_off), worst_over, most);
    EXPECT(wrong == 0);
    EXPECT(cost_off == 0);
    EXPECT(total[0] > 0);  // the ranks did steal from each other
    EXPECT(worst_over <= 1.0);
    EXPECT(most > kChunk);  // by count, no chunk would hold more than kChunk
  }
  gradient_matches_one_process("cpu:1", true, "costs: gradient");  // with costs and stealing
  {  // The packer across ranks (static, one device each): greedy packing leaves no rank more than one sample's cost
     // above another.
    RuntimeOptions o = on_cluster("sim:1", kChunk, 1e-7);
    o.schedule.policy = SchedulePolicy::kStatic;
    o.schedule.placement = PlacementPolicy::kPacked;
    Runtime rt(o);
    rt.register_parameters(layout(), initial());
    double worst = 0;
    for (std::uint64_t s = 0; s < 20; ++s) {
      std::vector<std::uint32_t> b = batch_of(200 + s * 7, s);
      std::sort(b.begin(), b.end(), [](std::uint32_t x, std::uint32_t y) { return cost_of(x) > cost_of(y); });  // grouped: the worst for an equal split
      const std::vector<double> cost = costs_of(b);
      const StepReport r = rt.compute_gradient(b, linear_chunk, cost);
      double lo = 1e300, hi = 0, biggest = 0;
      for (const DeviceReport& d : r.devices) lo = std::min(lo, d.cost), hi = std::max(hi, d.cost);
      for (double c : cost) biggest = std::max(biggest, c);
      EXPECT(r.devices.size() == static_cast<std::size_t>(g_cluster->size()));
      EXPECT(r.remote_chunks == 0);
      worst = std::max(worst, (hi - lo) / biggest);
    }
    if (me == 0) std::printf("costs: packed across %d ranks, the ranks' costs at most %.3f of the largest sample's apart\n", g_cluster->size(), worst);
    EXPECT(worst <= 1.0 + 1e-6);
  }
}

// Each rank writes its own trace, on rank 0's timeline: rank 1 makes its runtime 300 ms after rank 0, and its chunk
// spans still start with rank 0's, since the offset measured at start-up moves them (and is in its file).
void trace_across_ranks() {
  const int me = g_cluster->rank();
  std::vector<char> dir(256, '\0');
  if (me == 0) {
    char tmpl[] = "/tmp/sb_trace_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    std::strncpy(dir.data(), tmpl, dir.size() - 1);
  }
  g_cluster->broadcast(dir, 0);
  const std::string base = std::string(dir.data()) + "/trace.json";
  if (me == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  {
    RuntimeOptions o;
    o.devices = "sim:1,1";
    o.cluster.job = g_cluster;
    o.schedule.chunk_size = 8;
    o.schedule.policy = SchedulePolicy::kStatic;  // every rank runs chunks of its own
    o.sim.sample_seconds = 1e-4;
    o.trace_path = base;
    Runtime rt(o);
    rt.register_parameters(layout(), initial());
    for (std::uint64_t s = 0; s < 3; ++s) rt.step(batch_of(256, s), linear_chunk);
  }
  std::vector<double> sync{0};
  g_cluster->allreduce_sum(sync);  // every rank's trace is closed
  if (me != 0) return;
  double first[2] = {0, 0}, offset[2] = {0, 0};
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(std::string(dir.data()) + "/trace.rank" + std::to_string(r) + ".json");
    const nlohmann::json j = nlohmann::json::parse(in);
    bool named = false;
    first[r] = 1e300;
    for (const auto& e : j["traceEvents"]) {
      EXPECT(e["pid"] == r);
      if (e["name"] == "process_name") named = e["args"]["name"] == "rank " + std::to_string(r);
      if (e["name"] == "clock_offset") offset[r] = e["args"]["offset_ns"].get<double>() / 1e6;
      if (e["ph"] == "X" && e["cat"] == "chunk") first[r] = std::min(first[r], e["ts"].get<double>() / 1e3);
    }
    EXPECT(named);
    EXPECT(first[r] < 1e300);
  }
  std::printf("trace: rank 1's clock offset %.1f ms; first chunk at %.1f ms on rank 0, %.1f ms on rank 1 (rank 0's timeline)\n", offset[1], first[0],
              first[1]);
  EXPECT(offset[0] == 0.0);
  EXPECT(offset[1] > 250 && offset[1] < 5000);
  EXPECT(std::abs(first[1] - first[0]) < 100);
}

// What a cluster cannot take fails on every rank with a ConfigError that says why, before any device is made.
void config_errors() {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"vgpu:4,4", "cannot be NCCL ranks"}, {"cuda:all", "name each rank's GPUs"}};
  for (const auto& [spec, why] : cases) {
    std::string what;
    try {
      RuntimeOptions o;
      o.devices = spec;
      o.cluster.job = g_cluster;
      Runtime rt(o);
    } catch (const ConfigError& e) {
      what = e.what();
    }
    EXPECT(what.find(why) != std::string::npos);
  }
  std::string what;
  try {
    RuntimeOptions o;
    o.devices = "cpu:1";
    o.cluster.job = g_cluster;
    o.on_device_failure = OnDeviceFailure::kExclude;
    Runtime rt(o);
  } catch (const ConfigError& e) {
    what = e.what();
  }
  EXPECT(what.find("on_device_failure = exclude with a cluster") != std::string::npos);
  if (g_cluster->rank() == 0) std::printf("config: the cluster's impossible configurations fail with their reasons\n");
}

// Ranks that disagree, where it would corrupt the job: rank 1 differs from the others in one thing at a time. Every
// rank gets the same ConfigError naming the field, the ranks and both values, and the runtime stays usable.
void ranks_disagree() {
  const int me = g_cluster->rank();
  const bool odd = me == 1;
  const auto fails_with = [&](const char* what, const std::function<void()>& body, const std::string& want) {
    std::string got;
    try {
      body();
    } catch (const ConfigError& e) {
      got = e.what();
    }
    if (got.find(want) == std::string::npos) {
      std::fprintf(stderr, "rank %d: %s: got '%s', want '%s'\n", me, what, got.c_str(), want.c_str());
      ++g_failures;
    }
  };
  fails_with("chunk_size", [&] { Runtime rt(on_cluster("sim:1", odd ? 16 : 8)); },
             "disagree when they join on 'chunk_size': rank 0 has 8, rank 1 has 16 (ranks that differ from rank 0: 1)");
  fails_with("agree_on", [&] {
    RuntimeOptions o = on_cluster("sim:1", 8);
    o.cluster.agree_on = {{"--epochs", "10"}, {"--seed", odd ? "2" : "1"}};
    Runtime rt(o);
  }, "on '--seed': rank 0 has 1, rank 1 has 2");
  Runtime rt(on_cluster(odd ? "sim:1,1" : "sim:1", 8));  // the devices may differ
  fails_with("initial values", [&] {
    std::vector<float> p = initial();
    if (odd) p[3] += 1.0f;
    rt.register_parameters(layout(), p);
  }, "at register_parameters on 'initial parameters (hash of their bytes)'");
  rt.register_parameters(layout(), initial());
  fails_with("batch size", [&] { rt.step(batch_of(odd ? 128 : 256, 0), linear_chunk); },
             "at a step on 'batch size': rank 0 has 256, rank 1 has 128");
  fails_with("batch ids", [&] { rt.step(batch_of(256, odd ? 1 : 0), linear_chunk); }, "at a step on 'batch (hash of its sample ids)'");
  fails_with("sample costs", [&] {
    const std::vector<std::uint32_t> b = batch_of(256, 0);
    std::vector<double> cost = costs_of(b);
    if (odd) cost[17] *= 2;
    rt.step(b, linear_chunk, cost);
  }, "at a step on 'sample costs (hash of their bytes)'");
  fails_with("learning rate", [&] {
    rt.set_learning_rate(odd ? 0.02f : 0.01f);
    rt.step(batch_of(256, 0), linear_chunk);
  }, "on 'learning rate': rank 0 has 0.00999999978, rank 1 has 0.0199999996");
  // The job goes on once they agree again.
  rt.set_learning_rate(0.01f);
  const StepReport r = rt.step(batch_of(256, 0), linear_chunk);
  EXPECT(r.samples == 256);
  if (me == 0) std::printf("disagree: every rank named the field, the ranks and both values, and the runtime went on\n");
}

// These end the job: the launcher's exit status and the message are checked by expect_abort.sh. The fault tests run
// the static policy across ranks, so that the faulty rank runs chunks of its own in the faulty step whatever the
// timing (under stealing, the others may take its whole share).
void stall() {
  RuntimeOptions o = on_cluster("sim:1", 8, 1e-5);
  o.stall_timeout = 1.0;
  o.schedule.policy = SchedulePolicy::kStatic;  // as in chunk_throws
  const int me = g_cluster->rank();
  const stealbatch::testing::FaultInjector faults = [me](std::size_t, std::uint64_t step, ChunkId) { return me == 1 && step == 2 ? Fault::kStall : Fault::kNone; };
  Runtime rt(o);
  stealbatch::testing::inject_faults(rt, faults);
  rt.register_parameters(layout(), initial());
  for (std::uint64_t s = 0; s < 5; ++s) rt.step(batch_of(256, s), linear_chunk);
  std::printf("rank %d: the stalled step did not end the job\n", me);
  ++g_failures;
}

// One CPU device a rank, chunks of 8, the heartbeat's timeout 1 s and the step's watch 60 s: a fault that stops a
// process is the heartbeat's to find. Static, as in chunk_throws: each rank runs chunks of its own in every step.
RuntimeOptions heartbeat_only(std::shared_ptr<Cluster> job) {
  RuntimeOptions o;
  o.devices = "cpu:1";
  o.host.threads_per_device = 1;
  o.cluster.job = std::move(job);
  o.schedule.chunk_size = 8;
  o.stall_timeout = 60;
  o.cluster.heartbeat_timeout = 1.0;
  o.schedule.policy = SchedulePolicy::kStatic;
  return o;
}

// A rank whose process stops (SIGSTOP inside a chunk) or dies: the heartbeat ends the job, not the step's watch,
// whose stall_timeout is far longer here.
void hang_or_die(bool die) {
  const int me = g_cluster->rank();
  Runtime rt(heartbeat_only(g_cluster));
  rt.register_parameters(layout(), initial());
  std::atomic<bool> done{false};
  for (std::uint64_t s = 0; s < 5; ++s) {
    rt.step(batch_of(256, s), [&](ChunkContext& ctx) {
      if (me == 1 && s == 2 && !done.exchange(true)) {
        if (die) std::_Exit(9);
        // Inside the chunk long enough for the rank's watch to publish where it is, then the whole process stops:
        // its own watchdog and its heartbeat stop with it.
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        std::raise(SIGSTOP);
      }
      linear_chunk(ctx);
    });
  }
  std::printf("rank %d: the %s rank did not end the job\n", me, die ? "dead" : "hung");
  ++g_failures;
}

// A rank that runs but does not call step() with the others (here it sleeps between steps past stall_timeout): its
// heartbeat goes on, and the others' step watch ends the job.
void absent() {
  RuntimeOptions o = on_cluster("sim:1", 8, 1e-5);
  o.stall_timeout = 1.0;
  o.cluster.heartbeat_timeout = 60;
  o.schedule.policy = SchedulePolicy::kStatic;
  const int me = g_cluster->rank();
  Runtime rt(o);
  rt.register_parameters(layout(), initial());
  for (std::uint64_t s = 0; s < 5; ++s) {
    if (me == 1 && s == 2) std::this_thread::sleep_for(std::chrono::seconds(30));
    rt.step(batch_of(256, s), linear_chunk);
  }
  std::printf("rank %d: the absent rank did not end the job\n", me);
  ++g_failures;
}

// A node whose window never answers again, as when a rank of another node took the window's lock (Open MPI 4.1's
// osc ucx locks the target's window around every atomic) an instant before it was cut off: once wedge() is called,
// every one-sided access of this rank waits for ever, and access_in_flight() reports it. Ranks pose as nodes of
// `per_node` (Grouped); the node pulses are the real cluster's (every rank here shares one machine).
class Wedged final : public Grouped {
 public:
  using Grouped::Grouped;
  void wedge() { m_wedged.store(true); }
  std::uint64_t read(int r, Word w) override { return stall(r) ? 0 : Grouped::read(r, w); }
  std::uint64_t compare_and_swap(int r, Word w, std::uint64_t e, std::uint64_t d) override { return stall(r) ? 0 : Grouped::compare_and_swap(r, w, e, d); }
  void write(int r, Word w, std::uint64_t v) override {
    if (!stall(r)) Grouped::write(r, w, v);
  }
  Access access_in_flight() const noexcept override {
    const std::uint64_t w = m_stalled.load();
    if (w == 0) return Grouped::access_in_flight();
    const double since = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count() - static_cast<double>(w & 0xffffffffffff) / 1e3;
    return {static_cast<int>(w >> 48) - 1, since};
  }

 private:
  // Once wedged, the first access to stall is recorded (target + 1 in the top 16 bits, its start in ms below) and
  // every access waits for ever; the job ends by MPI_Abort from another thread.
  bool stall(int target) {
    if (!m_wedged.load()) return false;
    const auto ms = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
    std::uint64_t none = 0;
    m_stalled.compare_exchange_strong(none, (static_cast<std::uint64_t>(target) + 1) << 48 | (ms & 0xffffffffffff));
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::atomic<bool> m_wedged{false};
  std::atomic<std::uint64_t> m_stalled{0};
};

// A wedged node: ranks 0 and 1 wedge (above) in step 2, and rank 2 stops (SIGSTOP), so that nobody's heartbeat can
// name it. With `two_nodes`, rank 2 poses as a node of its own: the sentinels of 0 and 1 find every pulse of their
// node going on and name the other node. On one node, they find rank 2's pulse still and name it.
void wedged(bool two_nodes) {
  auto job = std::make_shared<Wedged>(g_cluster, two_nodes ? 2 : 3);
  const int me = g_cluster->rank();
  Runtime rt(heartbeat_only(job));
  rt.register_parameters(layout(), initial());
  for (std::uint64_t s = 0; s < 5; ++s) {
    rt.step(batch_of(256, s), [&](ChunkContext& ctx) {
      if (s == 2) {
        if (me == 2) std::raise(SIGSTOP);
        job->wedge();
      }
      linear_chunk(ctx);
    });
  }
  std::printf("rank %d: the wedged node did not end the job\n", me);
  ++g_failures;
}

// What must not end the job, with a heartbeat_timeout of 1.5 s: a chunk of 3 s, 3 s outside any step on one rank
// while the others wait in the next one, and a rank whose runtime goes 3 s before another's.
void long_but_alive() {
  RuntimeOptions o = on_cluster("cpu:1", 8);
  o.cluster.heartbeat_timeout = 1.5;
  o.stall_timeout = 60;
  o.schedule.policy = SchedulePolicy::kStatic;  // the long chunk runs on rank 1 whatever the timing
  const int me = g_cluster->rank();
  const auto pause = std::chrono::seconds(3);
  {
    Runtime rt(o);
    rt.register_parameters(layout(), initial());
    std::atomic<bool> once{false};
    for (std::uint64_t s = 0; s < 6; ++s) {
      if (me == 0 && s == 4) std::this_thread::sleep_for(pause);  // an evaluation, say
      const StepReport r = rt.step(batch_of(256, s), [&](ChunkContext& ctx) {
        if (me == 1 && s == 2 && !once.exchange(true)) std::this_thread::sleep_for(pause);
        linear_chunk(ctx);
      });
      EXPECT(r.samples == 256);
    }
    if (me != 0) std::this_thread::sleep_for(pause);  // rank 0's runtime goes first
  }
  if (me == 0) std::printf("long-but-alive: a long chunk, a long pause between steps and an early exit did not end the job\n");
}

}  // namespace

// The cluster: mpirun's world, or (SB_JOIN_RANK, SB_JOIN_SIZE and SB_JOIN_PORT_FILE set, as joined.sh starts
// processes without mpirun) ranks joined through a port whose name rank 0 writes to the file, one at a time.
std::shared_ptr<mpi::MpiCluster> make_cluster() {
  const char* rank = std::getenv("SB_JOIN_RANK");
  const char* size = std::getenv("SB_JOIN_SIZE");
  const char* file = std::getenv("SB_JOIN_PORT_FILE");
  if (rank == nullptr || size == nullptr || file == nullptr) return mpi::MpiCluster::world();
  const int r = std::atoi(rank);
  std::string port;
  if (r == 0) {
    port = mpi::MpiCluster::open_port();
    const std::string tmp = std::string(file) + ".tmp";
    std::ofstream(tmp) << port;
    std::filesystem::rename(tmp, file);  // the others never read half a name
  } else {
    while (!std::filesystem::exists(file)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::ifstream(file) >> port;
  }
  // Turns through files beside the port's: rank r connects once FILE.in<r-1> exists, and writes FILE.in<r> when in.
  const auto turn_file = [file](int k) { return std::string(file) + ".in" + std::to_string(k); };
  const auto wait_turn = [&] {
    while (!std::filesystem::exists(turn_file(r - 1))) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  };
  const auto pass_turn = [&] { std::ofstream(turn_file(r)) << "in"; };
  return mpi::MpiCluster::joined(r, std::atoi(size), port, wait_turn, pass_turn);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: mpirun -np R %s exactly-once|gradient|identical|checkpoint|throw|remote-steal|remote-steal-timed|trace|config|disagree|long-but-alive|costs|deterministic|probes|bf16|ring|large-counts|efficient-chunks|stall|hang|die|absent|wedged-node|wedged-neighbour\n", argv[0]);
    return 2;
  }
  const std::string which = argv[1];
  const std::map<std::string, std::function<void()>> cases = {
      {"exactly-once", exactly_once}, {"gradient", gradient},         {"identical", identical_parameters}, {"checkpoint", checkpoint},
      {"throw", chunk_throws},       {"remote-steal", [] { remote_steal_while_victim_computes(StealCheck::kForced); }},
      {"remote-steal-timed", [] { remote_steal_while_victim_computes(StealCheck::kTimed); }}, {"stall", stall},
      {"hang", [] { hang_or_die(false); }}, {"die", [] { hang_or_die(true); }}, {"trace", trace_across_ranks}, {"config", config_errors},
      {"disagree", ranks_disagree}, {"absent", absent}, {"long-but-alive", long_but_alive}, {"costs", given_costs},
      {"deterministic", deterministic_across_ranks}, {"probes", bounded_probes}, {"bf16", bf16_wire}, {"ring", ring_sums}, {"large-counts", large_counts}, {"efficient-chunks", efficient_chunks},
      {"wedged-node", [] { wedged(true); }}, {"wedged-neighbour", [] { wedged(false); }}};
  const auto it = cases.find(which);
  if (it == cases.end()) {
    std::fprintf(stderr, "unknown case '%s'\n", which.c_str());
    return 2;
  }
  int failed = 0;
  {
    g_cluster = make_cluster();
    try {
      it->second();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s threw: %s\n", g_cluster->rank(), which.c_str(), e.what());
      ++g_failures;
    }
    std::vector<double> f{static_cast<double>(g_failures)};
    g_cluster->allreduce_sum(f);
    failed = static_cast<int>(f[0]);
    if (g_cluster->rank() == 0) std::printf("%s: %s (%d failures over %d ranks)\n", which.c_str(), failed == 0 ? "PASSED" : "FAILED", failed, g_cluster->size());
    g_cluster.reset();
  }
  return failed == 0 ? 0 : 1;
}

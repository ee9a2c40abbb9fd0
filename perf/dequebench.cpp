// dequebench: the chunk deque against a central lock-free queue, TBB's concurrent queue and a mutex deque,
// pattern by pattern, side by side in one run, with an exactly-once check on every draining pattern; with --remote
// (under mpirun -np 2, in a build with MPI), one steal across ranks (dequebench_remote.cpp).
// Exit status: 0 every row exact and the JSON written; 1 a row's #wrong is not 0, or the JSON could not be written
// at the end; 2 a usage error (a flag, its value, an unwritable --json), found before anything runs.
#include "tool_cli.hpp"
#ifdef STEALBATCH_HAS_MPI
#include "dequebench_remote.hpp"
#endif

#include <stealbatch/runtime/cluster.hpp>
#include <stealbatch/runtime/version.hpp>
#include <stealbatch/scheduler/chunk_deque.hpp>
#include <stealbatch/scheduler/scheduler.hpp>
#include <stealbatch/stats.hpp>

#include <CLI/CLI.hpp>
#include <boost/lockfree/queue.hpp>
#include <nlohmann/json.hpp>
#include <tbb/concurrent_queue.h>
#include <tbb/version.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace stealbatch;
using Clock = std::chrono::steady_clock;

namespace {

// ---- the four implementations behind one owner/thief interface ----

struct StealbatchImpl {
  static constexpr const char* kName = "stealbatch";
  ChunkDeque q{1024};
  Stealer s = q.stealer();
  void push(ChunkId c) { q.push(c); }
  void push_bulk(std::span<const ChunkId> cs) { q.push_bulk(cs); }
  std::optional<ChunkId> pop() { return q.pop(); }
  // Returns the chunk, or nothing on kEmpty; retries a lost race, as a scheduler would.
  std::optional<ChunkId> steal() {
    for (;;) {
      const Stolen r = s.steal();
      if (r.status == StealStatus::kTaken) return r.chunk;
      if (r.status == StealStatus::kEmpty) return std::nullopt;
    }
  }
  // Steals half (capped) into the thief's own deque and drains it; returns how many it took.
  std::size_t steal_half(ChunkDeque& mine, std::size_t cap, std::vector<ChunkId>& out) {
    for (;;) {
      const StolenBatch b = s.steal_batch_and_pop(mine, cap);
      if (b.status == StealStatus::kEmpty) return 0;
      if (b.status == StealStatus::kRetry) continue;
      out.push_back(b.chunk);
      while (auto c = mine.pop()) out.push_back(*c);
      return 1 + b.moved;
    }
  }
};

// A central FIFO queue: the owner and every thief take from the same end. Queue supplies try_push and try_pop.
template <class Queue>
struct CentralQueueImpl {
  Queue q;
  void push(ChunkId c) {
    while (!q.try_push(c)) {
    }
  }
  void push_bulk(std::span<const ChunkId> cs) {
    for (ChunkId c : cs) push(c);
  }
  std::optional<ChunkId> pop() {
    ChunkId c = 0;
    if (q.try_pop(c)) return c;
    return std::nullopt;
  }
  std::optional<ChunkId> steal() { return pop(); }
  std::size_t steal_half(ChunkDeque&, std::size_t cap, std::vector<ChunkId>& out) {
    std::size_t n = 0;
    ChunkId c = 0;
    while (n < cap && q.try_pop(c)) out.push_back(c), ++n;
    return n;
  }
};

struct BoostQueue {
  boost::lockfree::queue<ChunkId> q{1024};
  bool try_push(ChunkId c) { return q.push(c); }
  bool try_pop(ChunkId& c) { return q.pop(c); }
};
struct BoostQueueImpl : CentralQueueImpl<BoostQueue> {
  static constexpr const char* kName = "boost_lockfree_queue";
};

struct TbbQueue {
  tbb::concurrent_queue<ChunkId> q;
  bool try_push(ChunkId c) { return q.push(c), true; }
  bool try_pop(ChunkId& c) { return q.try_pop(c); }
};
struct TbbQueueImpl : CentralQueueImpl<TbbQueue> {
  static constexpr const char* kName = "tbb_concurrent_queue";
};

struct MutexDequeImpl {
  static constexpr const char* kName = "mutex_deque";
  std::mutex m;
  std::deque<ChunkId> q;
  void push(ChunkId c) {
    std::lock_guard lock(m);
    q.push_back(c);
  }
  void push_bulk(std::span<const ChunkId> cs) {
    std::lock_guard lock(m);
    q.insert(q.end(), cs.begin(), cs.end());
  }
  std::optional<ChunkId> pop() {
    std::lock_guard lock(m);
    if (q.empty()) return std::nullopt;
    const ChunkId c = q.back();
    q.pop_back();
    return c;
  }
  std::optional<ChunkId> steal() {
    std::lock_guard lock(m);
    if (q.empty()) return std::nullopt;
    const ChunkId c = q.front();
    q.pop_front();
    return c;
  }
  std::size_t steal_half(ChunkDeque&, std::size_t cap, std::vector<ChunkId>& out) {
    std::lock_guard lock(m);
    const std::size_t n = std::min(cap, (q.size() + 1) / 2);
    for (std::size_t i = 0; i < n; ++i) out.push_back(q.front()), q.pop_front();
    return n;
  }
};

// ---- measurement ----

struct Sample {
  double seconds = 0;
  std::uint64_t ops = 0;
  std::uint64_t wrong = 0;
  std::vector<double> latencies_us;  // wake only
};

std::uint64_t count_wrong(std::vector<std::vector<ChunkId>>& taken, std::size_t n) {
  std::vector<std::uint32_t> seen(n, 0);
  std::uint64_t wrong = 0;
  for (auto& v : taken) {
    for (ChunkId c : v) {
      if (c >= n) ++wrong;
      else ++seen[c];
    }
  }
  for (auto s : seen) wrong += s != 1;
  return wrong;
}

// The owner's pattern in a step: push a run of chunks one at a time, then pop them all, with no thief.
template <class Impl>
Sample owner_push_pop(std::size_t n) {
  constexpr std::size_t kRun = 256;
  Impl impl;
  std::uint64_t sum = 0;
  const std::size_t runs = n / kRun;
  const auto t0 = Clock::now();
  for (std::size_t r = 0; r < runs; ++r) {
    for (std::size_t i = 0; i < kRun; ++i) impl.push(static_cast<ChunkId>(r * kRun + i));
    for (std::size_t i = 0; i < kRun; ++i) sum += *impl.pop();
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::uint64_t m = runs * kRun;
  return {s, 2 * m, sum == m * (m - 1) / 2 ? 0u : 1u, {}};
}

template <class Impl>
Sample steal_empty(std::size_t n) {
  Impl impl;
  std::uint64_t found = 0;
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < n; ++i) found += impl.steal().has_value();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return {s, n, found, {}};
}

template <class Impl>
Sample drain(std::size_t n, std::size_t thieves) {
  Impl impl;
  std::vector<ChunkId> items(n);
  for (std::size_t i = 0; i < n; ++i) items[i] = static_cast<ChunkId>(i);
  impl.push_bulk(items);
  std::vector<std::vector<ChunkId>> taken(thieves + 1);
  for (auto& t : taken) t.reserve(n);
  std::atomic<std::size_t> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (std::size_t k = 0; k < thieves; ++k) {
    ts.emplace_back([&, k] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      while (auto c = impl.steal()) taken[k + 1].push_back(*c);
    });
  }
  while (ready.load() != thieves) std::this_thread::yield();
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  while (auto c = impl.pop()) taken[0].push_back(*c);
  for (auto& t : ts) t.join();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return {s, n, count_wrong(taken, n), {}};
}

template <class Impl>
Sample bulk_steal_half(std::size_t n) {
  // The owner pushes blocks of 64; one thief steals half (at most 32) at a time until everything has moved.
  Impl impl;
  std::vector<std::vector<ChunkId>> taken(1);
  taken[0].reserve(n);
  std::atomic<bool> pushed{false};
  const auto t0 = Clock::now();
  std::thread thief([&] {
    ChunkDeque mine(64);
    for (;;) {
      const bool last = pushed.load(std::memory_order_acquire);
      if (impl.steal_half(mine, 32, taken[0]) == 0 && last) break;
    }
  });
  std::vector<ChunkId> block(64);
  for (std::size_t at = 0; at < n; at += block.size()) {
    const std::size_t k = std::min(block.size(), n - at);
    for (std::size_t i = 0; i < k; ++i) block[i] = static_cast<ChunkId>(at + i);
    impl.push_bulk(std::span<const ChunkId>(block.data(), k));
  }
  pushed.store(true, std::memory_order_release);
  thief.join();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return {s, n, count_wrong(taken, n), {}};
}

// Wake: one consumer parks; the producer waits until it is asleep, then publishes one chunk and wakes it. The
// latency is from before the publish to the consumer holding the chunk. stealbatch goes through the real
// scheduler (one worker parked between steps); the peers, which have no parking of their own, pair their queue
// with a std::condition_variable, the usual way to block on them.
Sample wake_stealbatch(std::size_t wakes) {
  Scheduler sched({.workers = 1});
  Sample out;
  std::vector<ChunkRange> one = {{0, 1}};
  for (std::size_t i = 0; i < wakes; ++i) {
    while (sched.parked_workers() != 1) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // from "announced" to asleep in the futex
    Clock::time_point t1;
    const auto t0 = Clock::now();
    (void)sched.run(one, [&](std::size_t, ChunkId) { t1 = Clock::now(); });
    out.latencies_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  out.ops = wakes;
  return out;
}

template <class Impl>
Sample wake_peer(std::size_t wakes) {
  Impl impl;
  std::mutex m;
  std::condition_variable cv;
  bool waiting = false, stop = false;
  std::atomic<std::int64_t> got_ns{0};
  std::atomic<std::size_t> got{0};
  std::thread consumer([&] {
    for (;;) {
      std::unique_lock lock(m);
      waiting = true;
      cv.notify_all();
      cv.wait(lock, [&] {
        if (stop) return true;
        if (!impl.steal()) return false;
        got_ns.store(Clock::now().time_since_epoch().count());
        return true;
      });
      waiting = false;
      if (stop) return;
      got.fetch_add(1, std::memory_order_release);
    }
  });
  Sample out;
  for (std::size_t i = 0; i < wakes; ++i) {
    {
      std::unique_lock lock(m);
      cv.wait(lock, [&] { return waiting; });
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    const auto before = got.load(std::memory_order_acquire);
    const auto t0 = Clock::now();
    {
      std::lock_guard lock(m);
      impl.push(static_cast<ChunkId>(i));
    }
    cv.notify_one();
    while (got.load(std::memory_order_acquire) == before) std::this_thread::yield();
    out.latencies_us.push_back(static_cast<double>(got_ns.load() - t0.time_since_epoch().count()) / 1e3);
  }
  {
    std::lock_guard lock(m);
    stop = true;
  }
  cv.notify_all();
  consumer.join();
  out.ops = wakes;
  return out;
}

struct Row {
  std::string impl, pattern;
  int threads = 1;
  double mops = 0, ns = 0, p50 = -1, p99 = -1;
  double p50_pooled = -1, p99_pooled = -1;  // wake: over every wake of every repetition together
  std::uint64_t wrong = 0;
};

template <class F>
Row measure(const char* impl, const char* pattern, int threads, int reps, F&& run) {
  (void)run();  // warm-up, not timed
  std::vector<double> mops, ns;
  Row r{impl, pattern, threads};
  for (int i = 0; i < reps; ++i) {
    const Sample s = run();
    mops.push_back(static_cast<double>(s.ops) / s.seconds / 1e6);
    ns.push_back(s.seconds * 1e9 / static_cast<double>(s.ops));
    r.wrong += s.wrong;
  }
  r.mops = median(mops);
  r.ns = median(ns);
  return r;
}

void print_row(const Row& r) {
  if (r.p50 >= 0) {
    std::printf("%-22s %-16s %7d %12.2f %10.2f %9.2f %9.2f %7llu\n", r.impl.c_str(), r.pattern.c_str(), r.threads, r.mops, r.ns,
                r.p50, r.p99, static_cast<unsigned long long>(r.wrong));
  } else {
    std::printf("%-22s %-16s %7d %12.2f %10.2f %9s %9s %7llu\n", r.impl.c_str(), r.pattern.c_str(), r.threads, r.mops, r.ns, "-", "-",
                static_cast<unsigned long long>(r.wrong));
  }
  std::fflush(stdout);
}

template <class Impl>
void run_impl(std::vector<Row>& rows, int reps, std::size_t n, const std::vector<std::string>& only) {
  auto want = [&](const char* p) { return only.empty() || std::find(only.begin(), only.end(), p) != only.end(); };
  const char* name = Impl::kName;
  auto add = [&](Row r) { rows.push_back(std::move(r)), print_row(rows.back()); };
  if (want("owner_push_pop")) add(measure(name, "owner_push_pop", 1, reps, [&] { return owner_push_pop<Impl>(n); }));
  if (want("steal_empty")) add(measure(name, "steal_empty", 1, reps, [&] { return steal_empty<Impl>(n); }));
  if (want("drain_1thief")) add(measure(name, "drain_1thief", 2, reps, [&] { return drain<Impl>(n / 4, 1); }));
  if (want("drain_3thieves")) add(measure(name, "drain_3thieves", 4, reps, [&] { return drain<Impl>(n / 4, 3); }));
  if (want("bulk_steal_half")) add(measure(name, "bulk_steal_half", 2, reps, [&] { return bulk_steal_half<Impl>(n / 4); }));
}

// The wake rows come last, with the implementations interleaved repetition by repetition: the wake-up of a parked
// thread is set mostly by the kernel and the hypervisor, which drift over a run, and interleaving spreads that
// drift evenly instead of handing it to whichever implementation happens to run at a bad moment.
void run_wakes(std::vector<Row>& rows, int reps, std::size_t wakes, const std::vector<const char*>& impls) {
  struct Candidate {
    const char* name;
    Sample (*run)(std::size_t);
  };
  const Candidate all[] = {{StealbatchImpl::kName, wake_stealbatch},
                           {BoostQueueImpl::kName, wake_peer<BoostQueueImpl>},
                           {TbbQueueImpl::kName, wake_peer<TbbQueueImpl>},
                           {MutexDequeImpl::kName, wake_peer<MutexDequeImpl>}};
  std::vector<Candidate> chosen;
  for (const Candidate& c : all) {
    if (std::find_if(impls.begin(), impls.end(), [&](const char* i) { return std::string(i) == c.name; }) != impls.end()) {
      chosen.push_back(c);
    }
  }
  for (const Candidate& c : chosen) (void)c.run(std::max<std::size_t>(wakes / 10, 10));  // warm-up, not timed
  // Each repetition gives a p50 and a p99 over its own wakes; the row shows their medians over the repetitions,
  // as every other row shows medians. A burst of host noise then moves one repetition, not the row. The pooled
  // percentiles (every wake of every repetition) go to the JSON beside them.
  std::vector<std::vector<double>> lat(chosen.size()), p50s(chosen.size()), p99s(chosen.size());
  for (int rep = 0; rep < reps; ++rep) {
    for (std::size_t i = 0; i < chosen.size(); ++i) {
      const Sample s = chosen[i].run(wakes);
      p50s[i].push_back(percentile(s.latencies_us, 0.50));
      p99s[i].push_back(percentile(s.latencies_us, 0.99));
      lat[i].insert(lat[i].end(), s.latencies_us.begin(), s.latencies_us.end());
    }
  }
  for (std::size_t i = 0; i < chosen.size(); ++i) {
    Row r{chosen[i].name, "wake", 2};
    r.p50 = median(p50s[i]);
    r.p99 = median(p99s[i]);
    r.p50_pooled = percentile(lat[i], 0.50);
    r.p99_pooled = percentile(lat[i], 0.99);
    r.ns = r.p50 * 1e3;
    r.mops = 1.0 / r.p50;  // wakes per microsecond = M wakes/s, at the median latency
    rows.push_back(r);
    print_row(r);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dequebench: the chunk deque against its peers, side by side in one run"};
  app.footer("Exit status: 0 every row exact and the JSON written; 1 a row's #wrong is not 0, or the JSON could not be written at the end; "
             "2 a usage error (a flag, its value, an unwritable --json), found before anything runs.");
  int reps = 7;
  std::size_t n = 4'000'000, wakes = 1000;
  std::string json_path;
  std::vector<std::string> impls, patterns;
  app.add_option("--reps", reps, "timed repetitions per row; the table shows medians")->check(CLI::Range(1, 1000));
  app.add_option("--ops", n, "operations per repetition (draining patterns use a quarter)")->check(CLI::Range(1000, 1'000'000'000));
  app.add_option("--wakes", wakes, "wakes per repetition of the wake pattern")->check(CLI::Range(10, 1'000'000));
  app.add_option("--impl", impls, "only these: stealbatch boost_lockfree_queue tbb_concurrent_queue mutex_deque")
      ->check(CLI::IsMember({"stealbatch", "boost_lockfree_queue", "tbb_concurrent_queue", "mutex_deque"}));
  app.add_option("--pattern", patterns, "only these: owner_push_pop steal_empty drain_1thief drain_3thieves bulk_steal_half wake")
      ->check(CLI::IsMember({"owner_push_pop", "steal_empty", "drain_1thief", "drain_3thieves", "bulk_steal_half", "wake"}));
  auto* json_opt = app.add_option("--json", json_path, "also write the rows as JSON to this file");
  bool remote = false;
  std::uint32_t steals = 100000;
  auto* remote_flag = app.add_flag("--remote", remote,
                                   "instead: one steal across 2 MPI ranks (read + compare-and-swap) against one on the own word, "
                                   "p50 and p99; mpirun -np 2, builds with MPI only");
  app.add_option("--steals", steals, "--remote: one-chunk steals timed on each word")
      ->check(CLI::Range(100u, detail::ShareWord::kMaxChunk - 1))->capture_default_str()->needs(remote_flag);
  bool costs = false;
  app.add_flag("--costs", costs, "--remote on any number of ranks: the cross-rank step's unit costs, every rank at once (inputs of perf/cluster_model.py)")
      ->needs(remote_flag);
  for (const char* other : {"--reps", "--ops", "--wakes", "--impl", "--pattern"}) remote_flag->excludes(app.get_option(other));
  remote_flag->excludes(json_opt);
  if (const int rc = perf::parse(app, argc, argv); rc >= 0) return rc;
  if (!perf::check_output_file("dequebench", app, "--json", json_path)) return perf::kExitUsage;
  if (remote) {
#ifdef STEALBATCH_HAS_MPI
    return costs ? perf::run_remote_costs(steals) : perf::run_remote_steal(steals);
#else
    std::fprintf(stderr, "dequebench: --remote needs a build with MPI (STEALBATCH_MPI)\n");
    return 2;
#endif
  }

  std::printf("# dequebench, stealbatch %s\n", kVersionString);
  std::printf("# cores %u, TBB %d.%d, Boost %d.%d, %s\n", std::thread::hardware_concurrency(), TBB_VERSION_MAJOR,
              TBB_VERSION_MINOR, BOOST_VERSION / 100000, BOOST_VERSION / 100 % 1000, __VERSION__);
  std::printf("# ops %zu per repetition (draining patterns %zu), wakes %zu, 1 warm-up + %d timed repetitions; medians\n", n, n / 4,
              wakes, reps);
  std::printf("# wake rows: measured last, implementations interleaved repetition by repetition; p50 and p99 over the %zu wakes of "
              "each repetition, median over the %d repetitions (the JSON also has them over all %zu wakes pooled)\n",
              wakes, reps, wakes * static_cast<std::size_t>(reps));
  std::printf("# owner_push_pop pushes runs of 256 chunks one at a time, then pops them; ns/op: per push or pop (owner_push_pop), per steal call (steal_empty), per chunk moved (others), per wake (wake)\n");
  std::printf("#\n%-22s %-16s %7s %12s %10s %9s %9s %7s\n", "# impl", "pattern", "threads", "Mops/s", "ns/op", "p50(us)", "p99(us)", "#wrong");

  auto want = [&](const char* i) { return impls.empty() || std::find(impls.begin(), impls.end(), i) != impls.end(); };
  std::vector<Row> rows;
  if (want("stealbatch")) run_impl<StealbatchImpl>(rows, reps, n, patterns);
  if (want("boost_lockfree_queue")) run_impl<BoostQueueImpl>(rows, reps, n, patterns);
  if (want("tbb_concurrent_queue")) run_impl<TbbQueueImpl>(rows, reps, n, patterns);
  if (want("mutex_deque")) run_impl<MutexDequeImpl>(rows, reps, n, patterns);
  if (patterns.empty() || std::find(patterns.begin(), patterns.end(), "wake") != patterns.end()) {
    std::vector<const char*> wake_impls;
    for (const char* i : {StealbatchImpl::kName, BoostQueueImpl::kName, TbbQueueImpl::kName, MutexDequeImpl::kName}) {
      if (want(i)) wake_impls.push_back(i);
    }
    run_wakes(rows, reps, wakes, wake_impls);
  }

  std::uint64_t wrong = 0;
  for (const Row& r : rows) wrong += r.wrong;
  auto find = [&](const char* impl, const char* pattern) -> const Row* {
    for (const Row& r : rows) {
      if (r.impl == impl && r.pattern == pattern) return &r;
    }
    return nullptr;
  };
  std::printf("#\n# summary: #wrong total %llu\n", static_cast<unsigned long long>(wrong));
  for (const char* p : {"owner_push_pop", "drain_1thief", "drain_3thieves", "bulk_steal_half"}) {
    const Row* a = find("stealbatch", p);
    const Row* b = find("boost_lockfree_queue", p);
    if (a && b) std::printf("# stealbatch / boost_lockfree_queue on %-16s %6.2fx (same run)\n", p, a->mops / b->mops);
  }

  if (!json_path.empty()) {
    nlohmann::json j = nlohmann::json::array();
    for (const Row& r : rows) {
      nlohmann::json o = {{"impl", r.impl}, {"pattern", r.pattern}, {"threads", r.threads}, {"mops_per_s", r.mops}, {"ns_per_op", r.ns}, {"wrong", r.wrong}};
      if (r.p50 >= 0) o["p50_us"] = r.p50, o["p99_us"] = r.p99, o["p50_pooled_us"] = r.p50_pooled, o["p99_pooled_us"] = r.p99_pooled;
      j.push_back(o);
    }
    if (!perf::write_output("dequebench", "--json", json_path, j.dump(2) + "\n")) return 1;
    std::printf("# wrote %s\n", json_path.c_str());
  }
  return wrong == 0 ? 0 : 1;
}

// Scheduler: exactly-once over many random steps, failures reaching the caller, static vs steal, parking cost.
#include <stealbatch/error.hpp>
#include <stealbatch/scheduler/scheduler.hpp>

#include <doctest/doctest.h>
#include <test_support.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>
#include <mutex>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace stealbatch;
using stealbatch::test::scaled;
using namespace std::chrono_literals;

namespace {

void spin_for(std::chrono::nanoseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end) {
  }
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Waits (bounded) for a condition instead of sleeping a fixed time.
template <class Pred>
bool wait_for(Pred pred, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace

TEST_CASE("Scheduler.ExactlyOnceRandomSteps") {
  // 10,000 steps in all, over every victim and steal policy and 1 to 8 workers, with random chunk counts,
  // random placement (arbitrary lists and ranges) and random per-chunk delays.
  const std::size_t total_steps = scaled(10000);
  struct Config {
    std::size_t workers;
    VictimPolicy victim;
    StealPolicy steal;
  };
  const std::vector<Config> configs = {
      {1, VictimPolicy::kRandom, StealPolicy::kOne},     {2, VictimPolicy::kSticky, StealPolicy::kHalf},
      {3, VictimPolicy::kMostLoaded, StealPolicy::kHalf}, {4, VictimPolicy::kRandom, StealPolicy::kHalf},
      {5, VictimPolicy::kSticky, StealPolicy::kOne},      {8, VictimPolicy::kMostLoaded, StealPolicy::kOne},
      {8, VictimPolicy::kSticky, StealPolicy::kHalf},
  };
  std::mt19937_64 rng(2024);
  std::size_t steps_done = 0, chunks_done = 0, stolen = 0, declines = 0;
  for (std::size_t ci = 0; ci < configs.size(); ++ci) {
    const Config& cfg = configs[ci];
    CAPTURE(cfg.workers);
    Scheduler sched({.workers = cfg.workers, .victim = cfg.victim, .steal = cfg.steal, .steal_batch_cap = 1 + ci,
                     .seed = rng()});
    const std::size_t steps = total_steps / configs.size() + (ci == 0 ? total_steps % configs.size() : 0);
    std::vector<std::atomic<std::uint32_t>> runs(300);
    for (std::size_t step = 0; step < steps; ++step) {
      const std::size_t chunks = rng() % 300;
      for (std::size_t i = 0; i < chunks; ++i) runs[i].store(0, std::memory_order_relaxed);
      // Every third step runs with random chunk costs, so the end-game rule declines chunks on the slow workers.
      std::vector<double> costs;
      if (step % 3 == 0) {
        costs.resize(cfg.workers);
        for (auto& c : costs) c = 1.0 + static_cast<double>(rng() % 10);
      }
      sched.set_chunk_costs(costs);
      std::vector<std::uint32_t> delay_ns(chunks);
      for (auto& d : delay_ns) d = (rng() % 4 == 0) ? static_cast<std::uint32_t>(rng() % 20000) : 0;
      auto fn = [&](std::size_t, ChunkId c) {
        runs[c].fetch_add(1, std::memory_order_relaxed);
        if (delay_ns[c]) spin_for(std::chrono::nanoseconds(delay_ns[c]));
      };
      StepStats st;
      if (step % 2 == 0) {
        std::vector<std::vector<ChunkId>> lists(cfg.workers);
        for (ChunkId c = 0; c < chunks; ++c) lists[rng() % cfg.workers].push_back(c);
        st = sched.run(lists, fn);
      } else {
        std::vector<double> w(cfg.workers);
        for (auto& x : w) x = static_cast<double>(rng() % 5);
        w[0] += 1;  // at least one positive weight
        st = sched.run(place_proportional(chunks, w), fn);
      }
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < chunks; ++i) wrong += runs[i].load(std::memory_order_relaxed) != 1;
      REQUIRE(wrong == 0);
      std::uint64_t ran = 0;
      for (const auto& wc : st.workers) ran += wc.chunks_run, stolen += wc.chunks_stolen, declines += wc.endgame_declines;
      REQUIRE(ran == chunks);
      ++steps_done;
      chunks_done += chunks;
    }
  }
  CHECK(steps_done == total_steps);
  CHECK(stolen > 0);    // the random placements did make workers steal
  CHECK(declines > 0);  // and the end-game rule did decline chunks
  MESSAGE(steps_done << " steps, " << chunks_done << " chunks, " << stolen << " stolen, " << declines
                     << " end-game declines, each chunk run exactly once");
}

TEST_CASE("Scheduler.ExceptionReachesCallerAndNextStepRuns") {
  Scheduler sched({.workers = 4});
  std::vector<std::atomic<int>> runs(64);
  auto ranges = place_equal(64, 4);
  for (int round = 0; round < 20; ++round) {
    const ChunkId bad = static_cast<ChunkId>((round * 13) % 64);
    CHECK_THROWS_WITH_AS(sched.run(ranges,
                                   [&](std::size_t, ChunkId c) {
                                     if (c == bad) throw std::runtime_error("chunk " + std::to_string(c) + " failed");
                                     spin_for(2us);
                                   }),
                         ("chunk " + std::to_string(bad) + " failed").c_str(), std::runtime_error);
    for (auto& r : runs) r.store(0);
    const StepStats st = sched.run(ranges, [&](std::size_t, ChunkId c) { runs[c].fetch_add(1); });
    int wrong = 0;
    for (auto& r : runs) wrong += r.load() != 1;
    CHECK(wrong == 0);
    CHECK(st.chunks == 64);
  }
}

TEST_CASE("Scheduler.EveryChunkThrows") {
  Scheduler sched({.workers = 3});
  CHECK_THROWS_AS(sched.run(place_equal(100, 3), [](std::size_t, ChunkId) { throw std::logic_error("always"); }),
                  std::logic_error);
  std::atomic<int> n{0};
  (void)sched.run(place_equal(100, 3), [&](std::size_t, ChunkId) { n.fetch_add(1); });
  CHECK(n.load() == 100);
}

TEST_CASE("Scheduler.StaticRunsOnlyWhatWasPlaced") {
  Scheduler sched({.workers = 4, .schedule = SchedulePolicy::kStatic});
  const auto ranges = place_proportional(40, std::vector<double>{10, 0, 0, 0});  // everything on worker 0
  std::vector<std::atomic<int>> owner(40);
  const StepStats st = sched.run(ranges, [&](std::size_t w, ChunkId c) {
    owner[c].store(static_cast<int>(w));
    std::this_thread::sleep_for(100us);  // device time, not CPU
  });
  for (ChunkId c = 0; c < 40; ++c) CHECK(owner[c].load() == 0);
  CHECK(st.workers[0].chunks_run == 40);
  for (const auto& w : st.workers) CHECK(w.chunks_stolen == 0);
}

TEST_CASE("Scheduler.StealingMovesWorkOffTheLoadedWorker") {
  Scheduler sched({.workers = 4});
  const auto ranges = place_proportional(80, std::vector<double>{10, 0, 0, 0});
  std::vector<std::atomic<int>> runs(80);
  // Worker 0's first chunk lasts until the others have run 30 (5 s at most): they can get there only by stealing from
  // its deque, however late they wake.
  std::atomic<int> by_thieves{0};
  std::atomic<bool> first{true}, waited_out{false};
  const StepStats st = sched.run(ranges, [&](std::size_t w, ChunkId c) {
    runs[c].fetch_add(1);
    if (w != 0) by_thieves.fetch_add(1);
    if (w == 0 && first.exchange(false)) waited_out = !wait_for([&] { return by_thieves.load() >= 30; }, 5000ms);
    std::this_thread::sleep_for(200us);  // emulated device time: frees the core for the thieves
  });
  CHECK_FALSE(waited_out.load());
  std::uint64_t stolen = 0, by_others = 0;
  for (std::size_t w = 0; w < 4; ++w) stolen += st.workers[w].chunks_stolen;
  for (std::size_t w = 1; w < 4; ++w) by_others += st.workers[w].chunks_run;
  int wrong = 0;
  for (auto& r : runs) wrong += r.load() != 1;
  CHECK(wrong == 0);
  CHECK(stolen > 0);
  CHECK(by_others >= 30);  // a balanced split would give the others 60 of 80
  MESSAGE("others ran " << by_others << " of 80 chunks placed on worker 0");
}

TEST_CASE("Scheduler.AThiefRunsWhatItMergesInOneCallAndPushesTheRest") {
  // Worker 0 holds chunks 0-15 and blocks in chunk 0 until worker 1 has made a merged call; worker 1, with nothing of
  // its own, steals half of 1-15 (15 down to 8: the cap of 8), merges the first three after 15 and pushes the rest.
  Scheduler sched({.workers = 2, .steal_batch_cap = 8});
  const auto ranges = place_proportional(16, std::vector<double>{1, 0});
  std::vector<std::atomic<int>> runs(16);
  std::vector<ChunkId> seen_first, seen_more, merged_call;
  std::mutex m;
  std::atomic<bool> merged{false}, waited_out{false};
  auto one = [&](std::size_t w, ChunkId c) {
    runs[c].fetch_add(1);
    if (w == 0 && c == 0) waited_out = !wait_for([&] { return merged.load(); }, 5000ms);
  };
  auto choose = [&](std::size_t w, ChunkId first, std::span<const ChunkId> more) -> std::size_t {
    const std::lock_guard lock(m);
    if (w == 1 && seen_first.empty()) seen_first.push_back(first), seen_more.assign(more.begin(), more.end());
    return 3;
  };
  auto group = [&](std::size_t, std::span<const ChunkId> chunks) {
    for (ChunkId c : chunks) runs[c].fetch_add(1);
    {
      const std::lock_guard lock(m);
      if (merged_call.empty()) merged_call.assign(chunks.begin(), chunks.end());
    }
    merged = true;
  };
  const ChunkMerge merge{choose, group};
  const StepStats st = sched.run(ranges, one, {}, &merge);
  CHECK_FALSE(waited_out.load());
  int wrong = 0;
  for (auto& r : runs) wrong += r.load() != 1;
  CHECK(wrong == 0);
  REQUIRE(seen_first.size() == 1);
  CHECK(seen_first[0] == 15);
  CHECK(seen_more == std::vector<ChunkId>{14, 13, 12, 11, 10, 9, 8});  // the victim's order: its top end, descending
  CHECK(merged_call == std::vector<ChunkId>{15, 14, 13, 12});
  CHECK(st.workers[1].chunks_stolen >= 8);
  CHECK(st.workers[1].chunks_merged >= 3);
  CHECK(st.workers[0].chunks_run + st.workers[1].chunks_run == 16);
}

TEST_CASE("Scheduler.MergedStealsRunEveryChunkOnce") {
  // Random merge choices (none, some, all, and more than offered) over random placements and delays, with the end
  // game on every other step: each chunk runs exactly once, in a merged call or alone, and the counts add up.
  const std::size_t steps = scaled(3000);
  std::mt19937_64 rng(77);
  std::uint64_t merged_total = 0;
  for (std::size_t workers : {2, 3, 4}) {
    Scheduler sched({.workers = workers, .steal_batch_cap = 1 + workers * 3, .seed = rng()});
    std::vector<std::atomic<std::uint32_t>> runs(256);
    std::vector<std::uint32_t> delay_ns(256);
    for (std::size_t step = 0; step < steps / 3; ++step) {
      const std::size_t chunks = 1 + rng() % 256;
      for (std::size_t i = 0; i < chunks; ++i) {
        runs[i].store(0, std::memory_order_relaxed);
        delay_ns[i] = rng() % 3 == 0 ? static_cast<std::uint32_t>(rng() % 20000) : 0;
      }
      std::vector<double> costs;
      if (step % 2 == 0) {
        costs.resize(workers);
        for (auto& c : costs) c = 1.0 + static_cast<double>(rng() % 8);
      }
      sched.set_chunk_costs(costs);
      const std::uint64_t salt = rng();
      auto one = [&](std::size_t, ChunkId c) {
        runs[c].fetch_add(1, std::memory_order_relaxed);
        if (delay_ns[c]) spin_for(std::chrono::nanoseconds(delay_ns[c]));
      };
      // A choice that depends only on the chunks offered: any prefix, sometimes past the end (the scheduler clamps).
      auto choose = [&](std::size_t, ChunkId first, std::span<const ChunkId> more) -> std::size_t {
        return static_cast<std::size_t>((first * 2654435761u + salt) % (more.size() + 2));
      };
      auto group = [&](std::size_t, std::span<const ChunkId> cs) {
        for (ChunkId c : cs) runs[c].fetch_add(1, std::memory_order_relaxed);
        if (delay_ns[cs[0]]) spin_for(std::chrono::nanoseconds(delay_ns[cs[0]]));
      };
      const ChunkMerge merge{choose, group};
      std::vector<double> w(workers);
      for (auto& x : w) x = static_cast<double>(rng() % 4);
      w[rng() % workers] += 1;
      const StepStats st = sched.run(place_proportional(chunks, w), one, {}, &merge);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < chunks; ++i) wrong += runs[i].load(std::memory_order_relaxed) != 1;
      REQUIRE(wrong == 0);
      std::uint64_t ran = 0;
      for (const auto& wc : st.workers) ran += wc.chunks_run, merged_total += wc.chunks_merged;
      REQUIRE(ran == chunks);
    }
  }
  CHECK(merged_total > 0);
  MESSAGE(steps << " steps with merging thieves, " << merged_total << " chunks merged into another's call, each chunk run exactly once");
}

TEST_CASE("Scheduler.AMergeChoiceThatThrowsFailsTheStepAndTheNextRuns") {
  Scheduler sched({.workers = 2});
  const auto ranges = place_proportional(16, std::vector<double>{1, 0});
  std::atomic<bool> thrown{false};
  auto one = [&](std::size_t w, ChunkId c) {
    if (w == 0 && c == 0) (void)wait_for([&] { return thrown.load(); }, 5000ms);
  };
  auto choose = [&](std::size_t, ChunkId, std::span<const ChunkId>) -> std::size_t {
    thrown = true;
    throw std::runtime_error("choice failed");
  };
  auto group = [](std::size_t, std::span<const ChunkId>) {};
  const ChunkMerge merge{choose, group};
  CHECK_THROWS_WITH_AS(sched.run(ranges, one, {}, &merge), "choice failed", std::runtime_error);
  std::atomic<int> ran{0};
  const StepStats st = sched.run(ranges, [&](std::size_t, ChunkId) { ran.fetch_add(1); });
  CHECK(ran.load() == 16);
  CHECK(st.workers[0].chunks_merged + st.workers[1].chunks_merged == 0);
}

TEST_CASE("Scheduler.EmptyStep") {
  Scheduler sched({.workers = 2});
  const StepStats st = sched.run(place_equal(0, 2), [](std::size_t, ChunkId) { FAIL("no chunk should run"); });
  CHECK(st.chunks == 0);
  CHECK(st.workers.size() == 2);
}

TEST_CASE("Scheduler.ParkedUsesNoCpu") {
  Scheduler sched({.workers = 4});
  (void)sched.run(place_equal(16, 4), [](std::size_t, ChunkId) {});
  REQUIRE(wait_for([&] { return sched.parked_workers() == 4; }, 5000ms));
  const double cpu0 = process_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(200ms);  // the scenario under test: 200 ms of idling
  const double cpu = process_cpu_seconds() - cpu0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("parked scheduler: " << cpu * 1e3 << " ms CPU over " << wall * 1e3 << " ms");
  CHECK(cpu <= 0.05 * wall);
  // And new work still wakes them.
  std::atomic<int> n{0};
  (void)sched.run(place_equal(8, 4), [&](std::size_t, ChunkId) { n.fetch_add(1); });
  CHECK(n.load() == 8);
}

TEST_CASE("Scheduler.ConfigErrors") {
  CHECK_THROWS_WITH_AS(Scheduler({.workers = 0}), "scheduler: workers = 0; valid range is [1, 4096]", ConfigError);
  CHECK_THROWS_WITH_AS(Scheduler({.workers = 2, .steal_batch_cap = 0}),
                       "scheduler: steal_batch_cap = 0; valid range is [1, 64]", ConfigError);
  CHECK_THROWS_WITH_AS(Scheduler({.workers = 2, .steal_batch_cap = 65}),
                       "scheduler: steal_batch_cap = 65; valid range is [1, 64]", ConfigError);
  Scheduler sched({.workers = 2});
  CHECK_THROWS_WITH_AS(sched.run(place_equal(4, 3), [](std::size_t, ChunkId) {}),
                       "scheduler: placement.size() = 3; valid range is [2, 2]", ConfigError);
}

TEST_CASE("Scheduler.WorkerStartFailure") {
  auto make = [] {
    SchedulerOptions o;
    o.workers = 4;
    o.on_worker_start = [](std::size_t w) {
      if (w == 2) throw std::runtime_error("worker 2 could not bind its device");
    };
    return Scheduler(std::move(o));
  };
  CHECK_THROWS_WITH_AS(make(), "worker 2 could not bind its device", std::runtime_error);

  std::vector<std::atomic<int>> started(3);
  SchedulerOptions ok;
  ok.workers = 3;
  ok.on_worker_start = [&](std::size_t w) { started[w].fetch_add(1); };
  Scheduler sched(std::move(ok));
  for (auto& s : started) CHECK(s.load() == 1);
}

TEST_CASE("Scheduler.BroadcastRunsOnceOnEveryWorkerThread") {
  Scheduler sched({.workers = 5});
  std::vector<std::thread::id> ids(5);
  std::vector<std::atomic<int>> calls(5);
  sched.broadcast([&](std::size_t w) {
    calls[w].fetch_add(1);
    ids[w] = std::this_thread::get_id();
  });
  for (std::size_t w = 0; w < 5; ++w) {
    CHECK(calls[w].load() == 1);
    CHECK(ids[w] != std::this_thread::get_id());
    for (std::size_t v = 0; v < w; ++v) CHECK(ids[v] != ids[w]);
  }
  // A run and a broadcast interleave cleanly, and a broadcast lands on the same threads that ran chunks.
  std::vector<std::thread::id> chunk_ids(5);
  (void)sched.run(place_equal(5, 5), [&](std::size_t w, ChunkId) { chunk_ids[w] = std::this_thread::get_id(); });
  for (std::size_t w = 0; w < 5; ++w) {
    if (chunk_ids[w] != std::thread::id{}) CHECK(chunk_ids[w] == ids[w]);
  }
  sched.broadcast([&](std::size_t w) { CHECK(std::this_thread::get_id() == ids[w]); });
  CHECK_THROWS_WITH_AS(sched.broadcast([](std::size_t w) {
    if (w == 3) throw std::runtime_error("worker 3 failed");
  }),
                       "worker 3 failed", std::runtime_error);
  std::atomic<int> after{0};
  sched.broadcast([&](std::size_t) { after.fetch_add(1); });
  CHECK(after.load() == 5);
}

TEST_CASE("Scheduler.MeanwhileRunsOnTheCallerWhileTheWorkersRun") {
  Scheduler sched({.workers = 4});
  const std::thread::id caller = std::this_thread::get_id();
  // Overlap: every chunk waits (bounded) for `meanwhile` to have started, and `meanwhile` waits for a chunk to have
  // started. Run one after the other, either wait would time out.
  std::atomic<bool> learning{false}, chunk_started{false}, gave_up{false};
  std::atomic<int> calls{0}, chunks_run{0};
  std::thread::id where{};
  bool saw_a_chunk = false;
  std::vector<std::atomic<int>> runs(40);
  (void)sched.run(
      place_equal(40, 4),
      [&](std::size_t, ChunkId c) {
        chunk_started.store(true);
        if (!gave_up.load() && !wait_for([&] { return learning.load(); }, 5s)) gave_up.store(true);
        runs[c].fetch_add(1);
        chunks_run.fetch_add(1);
      },
      [&] {
        calls.fetch_add(1);
        where = std::this_thread::get_id();
        learning.store(true);
        saw_a_chunk = wait_for([&] { return chunk_started.load(); }, 5s);
      });
  CHECK(calls.load() == 1);
  CHECK(where == caller);
  CHECK(saw_a_chunk);
  CHECK_FALSE(gave_up.load());
  CHECK(chunks_run.load() == 40);
  for (auto& r : runs) CHECK(r.load() == 1);

  // A `meanwhile` that throws fails the step with its exception; no chunk runs twice, and the next step is clean.
  for (auto& r : runs) r.store(0);
  CHECK_THROWS_WITH_AS(sched.run(
                           place_equal(40, 4), [&](std::size_t, ChunkId c) { runs[c].fetch_add(1); },
                           [] { throw std::runtime_error("the caller's work failed"); }),
                       "the caller's work failed", std::runtime_error);
  for (auto& r : runs) CHECK(r.load() <= 1);
  for (auto& r : runs) r.store(0);
  (void)sched.run(place_equal(40, 4), [&](std::size_t, ChunkId c) { runs[c].fetch_add(1); });
  for (auto& r : runs) CHECK(r.load() == 1);

  // With nothing to run it still runs, once.
  calls.store(0);
  (void)sched.run(
      place_equal(0, 4), [](std::size_t, ChunkId) {}, [&] { calls.fetch_add(1); });
  CHECK(calls.load() == 1);
}

TEST_CASE("Scheduler.EndGameLeavesTheTailToFastWorkers") {
  // Worker 0 is 10x slower. Without the rule it would start one of the last chunks and hold the step up; with it,
  // it stops once the fast workers would finish the rest sooner, and they run what is left in its deque.
  // The order is forced, not timed. The fast workers start only once worker 0 is inside its first chunk, which lasts
  // until both fast workers are inside a chunk they hold, having started 38 in all. They hold it (5 s at most) until
  // worker 0 has declined and parked: with both of them inside chunks, a parked worker is worker 0. So worker 0
  // decides with 22 or 23 chunks left (2 x 1 per unit: 11 or more units for the others, worth its 10), takes chunks
  // until fewer than 20 are left, and then declines with most of its share still in its deque.
  Scheduler sched({.workers = 3});
  sched.set_chunk_costs({10, 1, 1});
  std::vector<std::atomic<int>> runs(60);
  std::atomic<int> fast_started{0}, holding{0};
  std::atomic<bool> w0_started{false}, released{false};
  const StepStats st = sched.run(place_equal(60, 3), [&](std::size_t w, ChunkId c) {
    runs[c].fetch_add(1);
    if (w == 0) {
      if (!w0_started.exchange(true)) (void)wait_for([&] { return holding.load() == 2; }, 5000ms);
      return;
    }
    (void)wait_for([&] { return w0_started.load(); }, 5000ms);
    if (fast_started.fetch_add(1) + 1 <= 36) return;
    holding.fetch_add(1);
    (void)wait_for([&] { return released.load() || (holding.load() == 2 && sched.parked_workers() > 0); }, 5000ms);
    released = true;
  });
  int wrong = 0;
  for (auto& r : runs) wrong += r.load() != 1;
  CHECK(wrong == 0);
  CHECK(st.workers[0].endgame_declines == 1);
  CHECK(st.workers[1].endgame_declines == 0);  // the fastest always take
  CHECK(st.workers[2].endgame_declines == 0);
  CHECK(st.workers[0].chunks_run < 20);        // it gave part of its equal share to the fast workers
  CHECK(st.workers[1].chunks_stolen + st.workers[2].chunks_stolen > 0);
  MESSAGE("slow worker ran " << st.workers[0].chunks_run << " of its 20 chunks");

  CHECK_THROWS_AS(sched.set_chunk_costs({1, 2}), ConfigError);
  CHECK_THROWS_AS(sched.set_chunk_costs({1, 0, 1}), ConfigError);
  sched.set_chunk_costs({});  // off again
  const StepStats st2 = sched.run(place_equal(30, 3), [](std::size_t, ChunkId) {});
  for (const auto& wc : st2.workers) CHECK(wc.endgame_declines == 0);
}

TEST_CASE("Scheduler.OwnAlwaysKeepsASlowWorkersOwnChunk") {
  // Worker 0 is 10x slower and holds one chunk, worker 1 another: by the rule, 2 chunks left at 1 unit each for the
  // others is less than worker 0's 10, so it declines its own and worker 1 runs both (whenever worker 0 decides: with
  // one chunk left it declines too). With set_own_always (shares placed by a cost model to end together) it runs its
  // own: worker 1 holds its chunk until worker 0 is inside its own (5 s at most), so it cannot steal it first.
  for (const bool own_always : {false, true}) {
    CAPTURE(own_always);
    Scheduler sched({.workers = 2});
    sched.set_chunk_costs({10, 1});
    sched.set_own_always(own_always);
    std::vector<std::atomic<int>> runs(2);
    std::atomic<bool> w0_started{false};
    const StepStats st = sched.run(place_equal(2, 2), [&](std::size_t w, ChunkId c) {
      runs[c].fetch_add(1);
      if (w == 0) {
        w0_started = true;
        return;
      }
      if (own_always) (void)wait_for([&] { return w0_started.load(); }, 5000ms);
    });
    CHECK(runs[0].load() == 1);
    CHECK(runs[1].load() == 1);
    CHECK(st.workers[0].chunks_run == (own_always ? 1u : 0u));
    CHECK(st.workers[1].chunks_stolen == (own_always ? 0u : 1u));
  }
}

TEST_CASE("Scheduler.AWeightedEndGameCountsWhatIsLeftByWeight") {
  // Three equal workers; worker 0's first chunk reports that it now runs `factor` times slower, and it decides on
  // its second with the other two inside their first chunks: its first chunk ends only once both are inside theirs,
  // and they wait there (5 s at most each) until worker 0 has taken a second chunk or, after its first, parked (the
  // others are inside chunks, so a parked worker is worker 0, declining). So what is left when it decides is known
  // exactly.
  struct Case {
    std::string what;
    std::vector<std::vector<ChunkId>> placement;
    std::vector<double> weights;
    double factor;
    bool leaves;
  };
  const std::vector<Case> cases{
      // 11 chunks left: counted as chunks, another is worth its taking (4 <= 11 / 2). Weighed as quarter chunks (a
      // share's small end pieces), they are 2.5 full chunks of work (the two running count half), which the other
      // two finish in 1.25 units: it leaves them.
      {"counted", {{0, 1}, {2, 3, 4, 5, 6}, {7, 8, 9, 10, 11}}, {}, 4.0, false},
      {"weighed", {{0, 1}, {2, 3, 4, 5, 6}, {7, 8, 9, 10, 11}}, std::vector<double>(12, 0.25), 4.0, true},
      // 3 chunks left, 2 of them running: counted whole, 1.25 <= 3 / 2 takes; weighed, a started chunk counts half,
      // so 1 + 0.5 + 0.5 = 2 and 1.25 > 2 / 2 leaves.
      {"running count half", {{0, 1}, {2}, {3}}, {1, 1, 1, 1}, 1.25, true},
      {"running count whole", {{0, 1}, {2}, {3}}, {}, 1.25, false},
      // Its next chunk is a quarter of its largest placed one, so it costs 2 x 0.25 = 0.5, and 0.25 + 0.5 + 0.5 left
      // take the others 0.625: it takes the piece. A whole chunk there costs 2 against 1 left for the others: it leaves.
      {"a small piece costs its weight", {{0, 1}, {2}, {3}}, {1, 0.25, 1, 1}, 2.0, false},
      {"a whole chunk costs it all", {{0, 1}, {2}, {3}}, {1, 1, 1, 1}, 2.0, true},
  };
  for (const Case& k : cases) {
    CAPTURE(k.what);
    Scheduler sched({.workers = 3});
    sched.set_chunk_costs({1, 1, 1});
    sched.set_chunk_weights(k.weights);
    std::size_t total = 0;
    for (const auto& list : k.placement) total += list.size();
    std::vector<std::atomic<int>> runs(total);
    std::atomic<int> w0_started{0}, w0_done{0}, others_inside{0};
    const StepStats st = sched.run(k.placement, [&](std::size_t w, ChunkId c) {
      runs[c].fetch_add(1);
      if (w == 0) {
        w0_started.fetch_add(1);
        (void)wait_for([&] { return others_inside.load() >= 2; }, 5000ms);
        sched.set_live_factor(0, k.factor);
        w0_done.fetch_add(1);
      } else {
        others_inside.fetch_add(1);
        (void)wait_for([&] { return w0_started.load() >= 2 || (w0_done.load() >= 1 && sched.parked_workers() > 0); }, 5000ms);
      }
    });
    int wrong = 0;
    for (auto& r : runs) wrong += r.load() != 1;
    CHECK(wrong == 0);
    if (k.leaves) {
      CHECK(st.workers[0].chunks_run == 1);
      CHECK(st.workers[0].endgame_declines == 1);
      CHECK(st.workers[1].chunks_run + st.workers[2].chunks_run == total - 1);
    } else {
      CHECK(st.workers[0].chunks_run >= 2);
    }
    CHECK(st.workers[1].endgame_declines == 0);
    CHECK(st.workers[2].endgame_declines == 0);
  }

  Scheduler sched({.workers = 2});
  sched.set_chunk_costs({1, 1});
  CHECK_THROWS_WITH_AS(sched.set_chunk_weights({1, 0}), "scheduler: chunk weight of chunk 1 = 0.000000; need a finite value in (0, 2^40]",
                       ConfigError);
  CHECK_THROWS_AS(sched.set_chunk_weights({std::nan("")}), ConfigError);
  // A step with a chunk past the weights runs nothing and leaves nothing behind for the next.
  sched.set_chunk_weights({1, 1, 1});
  std::atomic<int> n{0};
  CHECK_THROWS_WITH_AS((void)sched.run(place_equal(4, 2), [&](std::size_t, ChunkId) { n.fetch_add(1); }),
                       "scheduler: chunk weights: chunk id 3 placed; valid range is [0, 3) (set_chunk_weights() for this step's chunks, or {})",
                       ConfigError);
  CHECK(n.load() == 0);
  sched.set_chunk_weights({});
  (void)sched.run(place_equal(4, 2), [&](std::size_t, ChunkId) { n.fetch_add(1); });
  CHECK(n.load() == 4);
}

TEST_CASE("Scheduler.AWorkerThatSlowsDownMidStepLeavesTheEndToTheOthers") {
  // Equal costs as placed, so both workers are among the fastest and, by the placed costs alone, always take.
  // Worker 0's first chunk reports it now runs 100x slower: with 62 chunks left at most it is not worth another
  // one, so it leaves the step (worker 1 is still taking), and worker 1 runs everything else, its deque included.
  Scheduler sched({.workers = 2});
  sched.set_chunk_costs({1, 1});
  std::vector<std::atomic<int>> runs(64);
  // Worker 1 starts only once worker 0 is inside its first chunk (5 s at most), so worker 0 surely runs one.
  std::atomic<int> w0_runs{0};
  auto after = [&](int k) { (void)wait_for([&] { return w0_runs.load() >= k; }, 5000ms); };
  const StepStats st = sched.run(place_equal(64, 2), [&](std::size_t w, ChunkId c) {
    runs[c].fetch_add(1);
    if (w == 0) sched.set_live_factor(0, 100.0), w0_runs.fetch_add(1);
    if (w == 1) after(1);
    std::this_thread::sleep_for(200us);  // worker 1 is busy with its own 32 chunks (6 ms) while worker 0 runs its first
  });
  int wrong = 0;
  for (auto& r : runs) wrong += r.load() != 1;
  CHECK(wrong == 0);
  CHECK(st.workers[0].chunks_run == 1);
  CHECK(st.workers[0].endgame_declines == 1);
  CHECK(st.workers[1].chunks_run == 63);
  CHECK(st.workers[1].endgame_declines == 0);

  // The factor lasts one step: in the next, worker 0 takes its share again.
  w0_runs = 0;
  const StepStats st2 = sched.run(place_equal(64, 2), [&](std::size_t w, ChunkId) {
    if (w == 0) w0_runs.fetch_add(1);
    if (w == 1) after(2);  // worker 0 gets to run two before worker 1 starts
    std::this_thread::sleep_for(50us);
  });
  CHECK(st2.workers[0].endgame_declines == 0);
  CHECK(st2.workers[0].chunks_run > 1);

  // Work already queued on a device counts too: worker 0 (2x slower as placed, so not among the fastest) reports
  // 1000 units still in flight after each chunk; a chunk it takes now would end after everything left is done
  // elsewhere, so it takes no second one.
  sched.set_chunk_costs({2, 1});
  std::vector<std::atomic<int>> runs3(64);
  w0_runs = 0;
  const StepStats st3 = sched.run(place_equal(64, 2), [&](std::size_t w, ChunkId c) {
    runs3[c].fetch_add(1);
    if (w == 0) sched.set_live_factor(0, 1.0, 1000.0), w0_runs.fetch_add(1);
    if (w == 1) after(1);
    std::this_thread::sleep_for(200us);
  });
  wrong = 0;
  for (auto& r : runs3) wrong += r.load() != 1;
  CHECK(wrong == 0);
  CHECK(st3.workers[0].chunks_run == 1);
  CHECK(st3.workers[1].chunks_run == 63);
}

TEST_CASE("Scheduler.ASourcedEndGameCountsTheWorkersOutside") {
  // A sourced step, as one rank of a multi-process job sees it: the source hands out 40 chunks one at a time, and
  // `pending` counts those not yet given. Worker 0's first chunk reports that it now runs 8x slower. Among these
  // two workers alone, what the source holds is worth another chunk to it (38 left > 8): it takes a second one.
  // With workers outside the scheduler that take from the same source at 100 chunks per cost unit (other ranks'
  // devices), the whole job would finish everything left long before that chunk: it leaves the step after its first.
  for (const double outside : {0.0, 100.0}) {
    CAPTURE(outside);
    Scheduler sched({.workers = 2});
    sched.set_chunk_costs({1, 1});
    sched.set_outside_rate(outside);
    constexpr std::size_t kTotal = 40;
    std::atomic<std::size_t> given{0};
    std::vector<std::atomic<int>> runs(kTotal);
    auto source = [&](std::size_t, std::span<ChunkId> out) -> std::size_t {
      const std::size_t at = given.load();
      if (at == kTotal) return 0;
      out[0] = static_cast<ChunkId>(at);
      given.store(at + 1);
      return 1;
    };
    const std::function<std::uint64_t()> pending = [&]() -> std::uint64_t { return kTotal - given.load(); };
    std::atomic<int> w0_runs{0};
    // Worker 1 waits inside its first chunk (5 s at most) until worker 0 has run what the rule should let it run.
    const int expect = outside > 0 ? 1 : 2;
    const StepStats st = sched.run_sourced(source, [&](std::size_t w, ChunkId c) {
      runs[c].fetch_add(1);
      if (w == 0) sched.set_live_factor(0, 8.0), w0_runs.fetch_add(1);
      if (w == 1) (void)wait_for([&] { return w0_runs.load() >= expect; }, 5000ms);
      std::this_thread::sleep_for(200us);
    }, pending);
    int wrong = 0;
    for (auto& r : runs) wrong += r.load() != 1;
    CHECK(wrong == 0);
    CHECK(st.chunks == kTotal);
    if (outside > 0) {
      CHECK(st.workers[0].chunks_run == 1);
      CHECK(st.workers[0].endgame_declines == 1);
    } else {
      CHECK(st.workers[0].chunks_run >= 2);
    }
    CHECK(st.workers[1].endgame_declines == 0);
  }
}

TEST_CASE("Scheduler.WhenEveryWorkerSlowsDownTheLastOneStillTakes") {
  // Every worker reports a 1000x slowdown after each chunk, so each would rather leave the rest to the others. The
  // fastest workers may leave only while another of them still takes: the last one keeps taking, and the step
  // ends with every chunk run exactly once instead of hanging with chunks left and nobody to take them.
  Scheduler sched({.workers = 4});
  sched.set_chunk_costs({1, 1, 1, 1});
  for (int round = 0; round < 20; ++round) {
    std::vector<std::atomic<int>> runs(200);
    const StepStats st = sched.run(place_equal(200, 4), [&](std::size_t w, ChunkId c) {
      runs[c].fetch_add(1);
      sched.set_live_factor(w, 1000.0);
    });
    int wrong = 0;
    for (auto& r : runs) wrong += r.load() != 1;
    REQUIRE(wrong == 0);
    std::uint64_t stayed = 0, ran = 0;
    for (const auto& wc : st.workers) stayed += wc.endgame_declines == 0, ran += wc.chunks_run;
    CHECK(ran == 200);
    CHECK(stayed >= 1);
  }
}

TEST_CASE("Scheduler.ChunkCostsAreValidated") {
  Scheduler sched({.workers = 2});
  // Own chunks dearer than stolen ones would let the fastest worker refuse its own chunks while the other refuses
  // to steal them: a hang. It is refused at the door.
  CHECK_THROWS_WITH_AS(sched.set_chunk_costs({10, 1}, {1, 10}),
                       "scheduler: chunk cost of worker 0: own 10.000000 > stolen 1.000000; need own <= stolen", ConfigError);
  CHECK_THROWS_AS(sched.set_chunk_costs({1, 1}, {}), ConfigError);
  sched.set_chunk_costs({1, 2}, {1, 8});
  std::atomic<int> n{0};
  (void)sched.run(place_equal(40, 2), [&](std::size_t, ChunkId) { n.fetch_add(1); });
  CHECK(n.load() == 40);
}

TEST_CASE("Scheduler.SlowThiefStealsSmallBatches") {
  // Everything is placed on fast worker 1; slow worker 0 (10x) steals, but with the end game on its batches are
  // capped at what it would still finish in time, so it never carries off a long tail.
  Scheduler sched({.workers = 3, .steal_batch_cap = 8});
  sched.set_chunk_costs({10, 1, 1});
  std::vector<std::atomic<int>> runs(60);
  // The order is forced, not timed: the fast workers wait (5 s at most) until the slow one has started its first
  // chunk, which it steals with all 60 left; that chunk lasts until the others have run 41 more, so when it ends at
  // most 18 are left and it is worth no further steal.
  std::atomic<bool> slow_started{false};
  std::atomic<int> fast_done{0};
  const StepStats st = sched.run(place_proportional(60, std::vector<double>{0, 1, 0}), [&](std::size_t w, ChunkId c) {
    runs[c].fetch_add(1);
    if (w == 0) {
      if (!slow_started.exchange(true)) (void)wait_for([&] { return fast_done.load() >= 41; }, 5000ms);
    } else {
      (void)wait_for([&] { return slow_started.load(); }, 5000ms);
      fast_done.fetch_add(1);
    }
    std::this_thread::sleep_for(w == 0 ? 2000us : 200us);
  });
  int wrong = 0;
  for (auto& r : runs) wrong += r.load() != 1;
  CHECK(wrong == 0);
  // With 60 chunks left and the two others draining 2 chunks per cost unit, the first steal is worth at most
  // 60 / 2 / 10 = 3 chunks. An uncapped half-steal would have taken 8 (or 4 of a stolen batch of 7).
  CHECK(st.workers[0].chunks_stolen >= 1);
  CHECK(st.workers[0].chunks_stolen <= 3);
  MESSAGE("slow thief ran " << st.workers[0].chunks_run << " chunks, stole " << st.workers[0].chunks_stolen);
}

TEST_CASE("Scheduler.CentralQueueRunsEveryChunkOnce") {
  Scheduler sched({.workers = 4, .schedule = SchedulePolicy::kCentral});
  std::mt19937_64 rng(5);
  std::vector<std::atomic<int>> runs(500);
  for (int step = 0; step < static_cast<int>(scaled(1000)); ++step) {
    const std::size_t chunks = rng() % 500;
    for (std::size_t i = 0; i < chunks; ++i) runs[i].store(0);
    const StepStats st = sched.run(place_equal(chunks, 4), [&](std::size_t, ChunkId c) { runs[c].fetch_add(1); });
    int wrong = 0;
    for (std::size_t i = 0; i < chunks; ++i) wrong += runs[i].load() != 1;
    REQUIRE(wrong == 0);
    REQUIRE(st.chunks == chunks);
  }
  // A failure stops the step, the rest is discarded, and the next step runs every chunk.
  CHECK_THROWS_AS(sched.run(place_equal(200, 4), [](std::size_t, ChunkId c) {
    if (c == 17) throw std::runtime_error("boom");
  }),
                  std::runtime_error);
  for (auto& r : runs) r.store(0);
  (void)sched.run(place_equal(300, 4), [&](std::size_t, ChunkId c) { runs[c].fetch_add(1); });
  int wrong = 0;
  for (std::size_t i = 0; i < 300; ++i) wrong += runs[i].load() != 1;
  CHECK(wrong == 0);
}

TEST_CASE("Scheduler.SourcedStepsRunEveryChunkOnce") {
  // Chunks handed out by a source in blocks of random size (as a rank claims its share and steals from others),
  // 1 to 6 workers, steal and static, random chunk delays: every chunk the source gave runs exactly once, and the
  // step ends only once the source is exhausted.
  const std::size_t steps = scaled(2000);
  std::mt19937_64 rng(42);
  for (std::size_t workers : {1u, 2u, 3u, 6u}) {
    for (SchedulePolicy policy : {SchedulePolicy::kSteal, SchedulePolicy::kStatic}) {
      Scheduler sched({.workers = workers, .schedule = policy});
      for (std::size_t s = 0; s < steps / 8; ++s) {
        const std::size_t total = std::uniform_int_distribution<std::size_t>(0, 300)(rng);
        const std::size_t block_max = std::uniform_int_distribution<std::size_t>(1, 40)(rng);
        std::atomic<std::size_t> next{0};
        std::atomic<int> calls_after_exhausted{0};
        std::atomic<bool> exhausted{false};
        std::vector<std::atomic<int>> runs(total);
        std::mt19937_64 src_rng(s);  // used under the source's one-caller-at-a-time guarantee
        auto source = [&](std::size_t, std::span<ChunkId> out) -> std::size_t {
          if (exhausted.load()) ++calls_after_exhausted;
          const std::size_t begin = next.load(std::memory_order_relaxed);
          const std::size_t k = std::min({total - begin, std::uniform_int_distribution<std::size_t>(1, block_max)(src_rng), out.size()});
          for (std::size_t i = 0; i < k; ++i) out[i] = static_cast<ChunkId>(begin + i);
          next.store(begin + k, std::memory_order_relaxed);
          if (k == 0) exhausted.store(true);
          return k;
        };
        const StepStats st = sched.run_sourced(source, [&](std::size_t, ChunkId c) {
          if (c % 7 == 0) spin_for(std::chrono::microseconds(c % 50));
          runs[c].fetch_add(1, std::memory_order_relaxed);
        });
        REQUIRE(st.chunks == total);
        REQUIRE(next.load() == total);
        REQUIRE(calls_after_exhausted.load() == 0);
        for (std::size_t c = 0; c < total; ++c) REQUIRE(runs[c].load() == 1);
      }
    }
  }
}

TEST_CASE("Scheduler.SourcedStepFailsWhenTheSourceThrowsAndTheNextStepRuns") {
  Scheduler sched({.workers = 3});
  std::atomic<int> calls{0};
  auto bad = [&](std::size_t, std::span<ChunkId> out) -> std::size_t {
    if (calls.fetch_add(1) == 2) throw std::runtime_error("source failed");
    out[0] = static_cast<ChunkId>(calls.load());
    out[1] = static_cast<ChunkId>(calls.load() + 100);
    return 2;
  };
  CHECK_THROWS_WITH_AS(sched.run_sourced(bad, [](std::size_t, ChunkId) {}), "source failed", std::runtime_error);
  std::atomic<int> ran{0};
  std::size_t given = 0;
  auto good = [&](std::size_t, std::span<ChunkId> out) -> std::size_t {
    if (given == 10) return 0;
    out[0] = static_cast<ChunkId>(given++);
    return 1;
  };
  const StepStats st = sched.run_sourced(good, [&](std::size_t, ChunkId) { ++ran; });
  CHECK(st.chunks == 10);
  CHECK(ran.load() == 10);
  // A placed step after sourced ones is unaffected.
  std::atomic<int> placed{0};
  const auto ranges = place_equal(12, 3);
  CHECK(sched.run(ranges, [&](std::size_t, ChunkId) { ++placed; }).chunks == 12);
  CHECK(placed.load() == 12);
}

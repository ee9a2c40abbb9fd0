// Victim selection, the spin budget and the event count's two-phase wait.
#include <stealbatch/scheduler/event_count.hpp>
#include <stealbatch/scheduler/idle.hpp>
#include <stealbatch/scheduler/victim.hpp>

#include <doctest/doctest.h>
#include <test_support.hpp>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

using namespace stealbatch;
using stealbatch::test::scaled;

namespace {

std::vector<Stealer> stealers_of(std::vector<ChunkDeque>& qs) {
  std::vector<Stealer> s;
  for (auto& q : qs) s.push_back(q.stealer());
  return s;
}

}  // namespace

TEST_CASE("Victim.RandomNeverPicksSelfAndCoversEveryone") {
  std::vector<ChunkDeque> qs(6);
  const auto st = stealers_of(qs);
  VictimSelector sel(2, 6, VictimPolicy::kRandom, 1);
  std::set<std::size_t> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::size_t v = sel.first(st);
    CHECK(v != 2);
    CHECK(v < 6);
    seen.insert(v);
  }
  CHECK(seen == std::set<std::size_t>{0, 1, 3, 4, 5});
}

TEST_CASE("Victim.ARoundVisitsEveryOtherWorkerOnce") {
  std::vector<ChunkDeque> qs(5);
  const auto st = stealers_of(qs);
  for (auto policy : {VictimPolicy::kRandom, VictimPolicy::kSticky, VictimPolicy::kMostLoaded}) {
    VictimSelector sel(4, 5, policy, 9);
    for (int round = 0; round < 50; ++round) {
      std::multiset<std::size_t> visited;
      std::size_t v = sel.first(st);
      for (std::size_t i = 0; i + 1 < 5; ++i, v = sel.after(v)) visited.insert(v);
      CHECK(visited == std::multiset<std::size_t>{0, 1, 2, 3});
    }
  }
}

TEST_CASE("Victim.StickyReturnsToTheLastSuccess") {
  std::vector<ChunkDeque> qs(4);
  const auto st = stealers_of(qs);
  VictimSelector sel(0, 4, VictimPolicy::kSticky, 3);
  sel.on_success(3);
  for (int i = 0; i < 10; ++i) CHECK(sel.first(st) == 3);
  sel.on_empty(3);
  std::set<std::size_t> seen;
  for (int i = 0; i < 200; ++i) seen.insert(sel.first(st));
  CHECK(seen.size() == 3);  // back to random once the sticky victim ran dry
}

TEST_CASE("Victim.MostLoadedPicksTheLongestDeque") {
  std::vector<ChunkDeque> qs(4);
  for (ChunkId i = 0; i < 5; ++i) qs[1].push(i);
  for (ChunkId i = 0; i < 9; ++i) qs[2].push(i);
  for (ChunkId i = 0; i < 50; ++i) qs[0].push(i);  // the selector's own deque is never a victim
  const auto st = stealers_of(qs);
  VictimSelector sel(0, 4, VictimPolicy::kMostLoaded, 5);
  for (int i = 0; i < 20; ++i) CHECK(sel.first(st) == 2);
}

TEST_CASE("Idle.SpinBudgetNeverExceedsItsCap") {
  SpinBudget budget(2);
  std::atomic<int> inside{0}, worst{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 6; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        if (!budget.try_acquire()) continue;
        const int now = inside.fetch_add(1) + 1;
        int w = worst.load();
        while (now > w && !worst.compare_exchange_weak(w, now)) {
        }
        inside.fetch_sub(1);
        budget.release();
      }
    });
  }
  for (auto& t : ts) t.join();
  CHECK(worst.load() <= 2);
  CHECK(worst.load() >= 1);
  CHECK(budget.spinning() == 0);
}

TEST_CASE("EventCount.NoLostWakeups") {
  // Ping-pong through two flags, each side parking with prepare/re-check/commit. A lost wake-up hangs the test,
  // which CTest's timeout then reports.
  const int rounds = static_cast<int>(scaled(100000));
  EventCount ev;
  std::atomic<int> ball{0};  // even: the main thread's turn; odd: the helper's
  auto wait_for_parity = [&](int parity) {
    for (;;) {
      const int b = ball.load(std::memory_order_acquire);
      if (b % 2 == parity) return b;
      auto key = ev.prepare_wait();
      if (ball.load(std::memory_order_acquire) % 2 == parity) {
        ev.cancel_wait();
        continue;
      }
      ev.commit_wait(key);
    }
  };
  std::thread helper([&] {
    for (int i = 0; i < rounds; ++i) {
      const int b = wait_for_parity(1);
      ball.store(b + 1, std::memory_order_release);
      ev.notify_all();
    }
  });
  for (int i = 0; i < rounds; ++i) {
    const int b = wait_for_parity(0);
    ball.store(b + 1, std::memory_order_release);
    ev.notify_all();
  }
  helper.join();
  CHECK(ball.load() == 2 * rounds);
  CHECK(ev.waiters() == 0);
}

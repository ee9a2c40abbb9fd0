// ChunkDeque: the crossbeam set (smoke, empty, spsc, stampede, stress, no-starvation, destructors) plus resize
// under steal, batch steals and the last-item race, each checked exactly: sorted(popped ∪ stolen) == pushed.
#include <stealbatch/scheduler/chunk_deque.hpp>
#include <stealbatch/scheduler/idle.hpp>

#include <doctest/doctest.h>
#include <test_support.hpp>

#include <array>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

using namespace stealbatch;
using stealbatch::test::exactly_once;
using stealbatch::test::scaled;

namespace {

// Thieves run until told to stop, then make one last pass so nothing is left behind by the stop itself.
struct Thieves {
  std::atomic<bool> stop{false};
  std::vector<std::vector<ChunkId>> got;
  std::vector<std::thread> threads;

  template <class Body>
  Thieves(std::size_t n, Body body) : got(n) {
    for (std::size_t i = 0; i < n; ++i) threads.emplace_back([this, i, body] { body(i, got[i], stop); });
  }
  void join() {
    stop.store(true);
    for (auto& t : threads) t.join();
  }
};

void drain_with(const Stealer& s, std::vector<ChunkId>& out) {
  for (;;) {
    const Stolen r = s.steal();
    if (r.status == StealStatus::kTaken) out.push_back(r.chunk);
    if (r.status == StealStatus::kEmpty) return;
  }
}

}  // namespace

TEST_CASE("ChunkDeque.Smoke") {
  ChunkDeque q;
  Stealer s = q.stealer();
  q.push(1);
  q.push(2);
  q.push(3);
  CHECK(q.size() == 3);
  CHECK(q.pop() == 3u);  // the owner takes the newest
  const Stolen a = s.steal();
  CHECK(a.status == StealStatus::kTaken);
  CHECK(a.chunk == 1u);  // a thief takes the oldest
  CHECK(q.pop() == 2u);
  CHECK_FALSE(q.pop().has_value());
  CHECK(s.steal().status == StealStatus::kEmpty);
}

TEST_CASE("ChunkDeque.PeekShowsWhatPopTakesNext") {
  ChunkDeque q(2);  // grows on the third push: peek reads the ring in use
  Stealer s = q.stealer();
  CHECK_FALSE(q.peek().has_value());
  q.push_bulk(std::vector<ChunkId>{4, 5, 6});
  CHECK(q.peek() == 6u);
  CHECK(q.size() == 3);  // peeking takes nothing
  CHECK(q.pop() == 6u);
  CHECK(s.steal().chunk == 4u);
  CHECK(q.peek() == 5u);
  CHECK(s.steal().chunk == 5u);  // a thief took what the owner saw
  CHECK_FALSE(q.peek().has_value());
  CHECK_FALSE(q.pop().has_value());
  CHECK_FALSE(q.peek().has_value());  // after an empty pop too
}

TEST_CASE("ChunkDeque.Empty") {
  ChunkDeque q(2);
  Stealer s = q.stealer();
  ChunkDeque dest;
  CHECK(q.empty());
  CHECK_FALSE(q.pop().has_value());
  CHECK(s.steal().status == StealStatus::kEmpty);
  CHECK(s.steal_batch_and_pop(dest, 8).status == StealStatus::kEmpty);
  for (ChunkId i = 0; i < 100; ++i) {
    q.push(i);
    CHECK(q.pop() == i);
    CHECK_FALSE(q.pop().has_value());  // an empty pop restores bottom; the next push must still work
  }
  CHECK(q.empty());
  CHECK(s.size_hint() == 0);
  CHECK(dest.empty());
}

TEST_CASE("ChunkDeque.OwnerLifoThiefFifo") {
  ChunkDeque q(2);  // tiny, so the pushes below grow it several times
  for (ChunkId i = 0; i < 1000; ++i) q.push(i);
  CHECK(q.capacity() >= 1000);
  CHECK(q.retired_buffers() > 0);
  for (ChunkId i = 1000; i-- > 500;) CHECK(q.pop() == i);
  Stealer s = q.stealer();
  for (ChunkId i = 0; i < 500; ++i) {
    const Stolen r = s.steal();
    REQUIRE(r.status == StealStatus::kTaken);
    CHECK(r.chunk == i);
  }
  CHECK(q.empty());
}

TEST_CASE("ChunkDeque.BulkPush") {
  ChunkDeque q(4);
  std::vector<ChunkId> items(300);
  for (ChunkId i = 0; i < items.size(); ++i) items[i] = i;
  q.push_bulk(std::span<const ChunkId>(items).first(3));
  q.push_bulk(std::span<const ChunkId>(items).subspan(3));  // grows in one go
  CHECK(q.size() == 300);
  Stealer s = q.stealer();
  CHECK(s.steal().chunk == 0u);
  CHECK(q.pop() == 299u);
  std::vector<ChunkId> rest;
  while (auto c = q.pop()) rest.push_back(*c);
  CHECK(rest.size() == 298);
  CHECK(rest.front() == 298u);
  CHECK(rest.back() == 1u);
  q.push_bulk({});  // a no-op, not a publication of garbage
  CHECK(q.empty());
}

TEST_CASE("ChunkDeque.StealBatch") {
  ChunkDeque victim, mine;
  Stealer s = victim.stealer();
  for (ChunkId i = 0; i < 10; ++i) victim.push(i);

  SUBCASE("half of the victim, rounded up, within the cap") {
    const StolenBatch b = s.steal_batch_and_pop(mine, 8);
    REQUIRE(b.status == StealStatus::kTaken);
    CHECK(b.chunk == 0u);
    CHECK(b.moved == 4);  // 5 taken: one to run, four into `mine`
    CHECK(victim.size() == 5);
    for (ChunkId want = 4; want >= 1; --want) CHECK(mine.pop() == want);
    CHECK(mine.empty());
  }
  SUBCASE("the cap bounds the batch") {
    const StolenBatch b = s.steal_batch_and_pop(mine, 2);
    CHECK(b.chunk == 0u);
    CHECK(b.moved == 1);
    CHECK(victim.size() == 8);
  }
  SUBCASE("a cap of one takes a single chunk") {
    const StolenBatch b = s.steal_batch_and_pop(mine, 1);
    CHECK(b.chunk == 0u);
    CHECK(b.moved == 0);
    CHECK(mine.empty());
  }
  SUBCASE("handed back: the same chunks, in the victim's order, and the thief's deque untouched") {
    std::array<ChunkId, kMaxStealBatch> more{};
    const StolenBatch b = s.steal_batch(more, 8);
    REQUIRE(b.status == StealStatus::kTaken);
    CHECK(b.chunk == 0u);
    REQUIRE(b.moved == 4);
    for (std::size_t i = 0; i < 4; ++i) CHECK(more[i] == i + 1);
    CHECK(victim.size() == 5);
    CHECK(mine.empty());
  }
  SUBCASE("one chunk left: it is taken alone") {
    while (victim.size() > 1) (void)victim.pop();
    const StolenBatch b = s.steal_batch_and_pop(mine, 8);
    CHECK(b.chunk == 0u);
    CHECK(b.moved == 0);
    CHECK(s.steal().status == StealStatus::kEmpty);
  }
}

TEST_CASE("ChunkDeque.Spsc") {
  const std::size_t n = scaled(400000);
  ChunkDeque q(16);
  Stealer s = q.stealer();
  std::vector<ChunkId> popped;
  Thieves thieves(1, [&](std::size_t, std::vector<ChunkId>& got, std::atomic<bool>& stop) {
    while (!stop.load(std::memory_order_relaxed)) {
      const Stolen r = s.steal();
      if (r.status == StealStatus::kTaken) got.push_back(r.chunk);
    }
    drain_with(s, got);
  });
  for (ChunkId i = 0; i < n; ++i) {
    q.push(i);
    if (i % 3 == 0) {
      if (auto c = q.pop()) popped.push_back(*c);
    }
  }
  thieves.join();
  while (auto c = q.pop()) popped.push_back(*c);
  thieves.got.push_back(popped);
  CHECK(exactly_once(thieves.got, n));
}

TEST_CASE("ChunkDeque.Stampede") {
  // One owner that pushes everything, then pops, while 1 to 8 thieves steal from the start.
  for (std::size_t nthieves : {1, 2, 3, 4, 8}) {
    CAPTURE(nthieves);
    const std::size_t n = scaled(200000);
    ChunkDeque q(64);
    Stealer s = q.stealer();
    std::atomic<bool> go{false};
    Thieves thieves(nthieves, [&](std::size_t, std::vector<ChunkId>& got, std::atomic<bool>& stop) {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      while (!stop.load(std::memory_order_relaxed)) {
        const Stolen r = s.steal();
        if (r.status == StealStatus::kTaken) got.push_back(r.chunk);
      }
      drain_with(s, got);
    });
    go.store(true, std::memory_order_release);
    std::vector<ChunkId> popped;
    for (ChunkId i = 0; i < n; ++i) q.push(i);  // grows from 64 under concurrent steals
    while (auto c = q.pop()) popped.push_back(*c);
    thieves.join();
    while (auto c = q.pop()) popped.push_back(*c);
    thieves.got.push_back(popped);
    CHECK(exactly_once(thieves.got, n));
  }
}

TEST_CASE("ChunkDeque.StressResizeUnderSteal") {
  // A ring of capacity 2 that the owner grows in random bursts while four thieves steal one or a batch (pushed onto
  // their own deques, which they drain, or handed back), and the owner pops. Every chunk must surface exactly once.
  const std::size_t n = scaled(400000);
  ChunkDeque q(2);
  Stealer s = q.stealer();
  std::vector<ChunkId> popped;
  Thieves thieves(4, [&](std::size_t id, std::vector<ChunkId>& got, std::atomic<bool>& stop) {
    ChunkDeque mine(2);
    auto once = [&] {
      if (id % 2 == 0) {
        const Stolen r = s.steal();
        if (r.status == StealStatus::kTaken) got.push_back(r.chunk);
        return r.status;
      }
      if (id == 3) {  // the batch handed back instead of pushed (a thief that merges what it steals)
        std::array<ChunkId, kMaxStealBatch> more;
        const StolenBatch b = s.steal_batch(more, 9);
        if (b.status == StealStatus::kTaken) got.push_back(b.chunk), got.insert(got.end(), more.begin(), more.begin() + static_cast<std::ptrdiff_t>(b.moved));
        return b.status;
      }
      const StolenBatch b = s.steal_batch_and_pop(mine, 1 + id * 3);
      if (b.status == StealStatus::kTaken) got.push_back(b.chunk);
      while (auto c = mine.pop()) got.push_back(*c);
      return b.status;
    };
    while (!stop.load(std::memory_order_relaxed)) (void)once();
    while (once() != StealStatus::kEmpty) {
    }
  });
  std::mt19937 rng(42);
  std::vector<ChunkId> burst;
  ChunkId next = 0;
  while (next < n) {
    burst.clear();
    const std::size_t k = std::min<std::size_t>(1 + rng() % 300, n - next);
    for (std::size_t i = 0; i < k; ++i) burst.push_back(next++);
    if (rng() % 2) {
      q.push_bulk(burst);
    } else {
      for (ChunkId c : burst) q.push(c);
    }
    const std::size_t pops = rng() % (k + 1);
    for (std::size_t i = 0; i < pops; ++i) {
      if (auto c = q.pop()) popped.push_back(*c);
    }
  }
  thieves.join();
  while (auto c = q.pop()) popped.push_back(*c);
  thieves.got.push_back(popped);
  CHECK(q.retired_buffers() > 0);  // the ring did grow while thieves were reading it
  CHECK(exactly_once(thieves.got, n));
}

TEST_CASE("ChunkDeque.LastItemRace") {
  // The fence path: in each round the owner pushes one or two chunks and pops them while every thief tries to
  // steal at the same moment, so the owner's last-item CAS and the thieves' CAS collide as often as possible.
  const std::size_t rounds = scaled(300000);
  const std::size_t nthieves = 2;
  ChunkDeque q(4);
  Stealer s = q.stealer();
  std::atomic<std::size_t> round{0};
  std::atomic<std::size_t> done{0};
  Thieves thieves(nthieves, [&](std::size_t, std::vector<ChunkId>& got, std::atomic<bool>& stop) {
    std::size_t seen = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      const std::size_t r = round.load(std::memory_order_acquire);
      if (r == seen) {
        std::this_thread::yield();  // two cores: let the owner run
        continue;
      }
      seen = r;
      for (int tries = 0; tries < 4; ++tries) {
        const Stolen x = s.steal();
        if (x.status == StealStatus::kTaken) got.push_back(x.chunk);
        if (x.status == StealStatus::kEmpty) break;
      }
      done.fetch_add(1, std::memory_order_acq_rel);
    }
  });
  std::vector<ChunkId> popped;
  ChunkId next = 0;
  for (std::size_t r = 1; r <= rounds; ++r) {
    const std::size_t before = done.load(std::memory_order_acquire);
    q.push(next++);
    if (r % 2 == 0) q.push(next++);
    round.store(r, std::memory_order_release);
    // A varying delay walks the owner's pop across the thieves' steal window.
    for (std::size_t k = 0, pauses = (r * 2654435761u) % 192; k < pauses; ++k) cpu_relax();
    while (auto c = q.pop()) popped.push_back(*c);
    // Wait for every thief to finish this round before the next push; no sleeping, just the counter.
    while (done.load(std::memory_order_acquire) < before + nthieves) std::this_thread::yield();
  }
  thieves.join();
  thieves.got.push_back(popped);
  CHECK(exactly_once(thieves.got, next));
  std::size_t stolen = 0;
  for (std::size_t i = 0; i < nthieves; ++i) stolen += thieves.got[i].size();
  MESSAGE("last-item race: " << next << " chunks, " << stolen << " won by thieves, " << popped.size() << " by the owner");
}

TEST_CASE("ChunkDeque.NoStarvation") {
  // While the owner keeps pushing and popping, every thief still gets work. The owner goes on past n until each
  // thief has stolen at least once, so five threads on two cores get their turns; but not for ever: a thief
  // still starved after 20n chunks fails the test.
  const std::size_t n = scaled(300000);
  const std::size_t nthieves = 4;
  ChunkDeque q(32);
  Stealer s = q.stealer();
  std::vector<std::atomic<std::size_t>> stolen(nthieves);
  Thieves thieves(nthieves, [&](std::size_t id, std::vector<ChunkId>& got, std::atomic<bool>& stop) {
    while (!stop.load(std::memory_order_relaxed)) {
      const Stolen r = s.steal();
      if (r.status == StealStatus::kTaken) got.push_back(r.chunk), stolen[id].fetch_add(1, std::memory_order_relaxed);
    }
    drain_with(s, got);
  });
  auto all_fed = [&] {
    for (auto& c : stolen) {
      if (c.load(std::memory_order_relaxed) == 0) return false;
    }
    return true;
  };
  std::vector<ChunkId> popped;
  ChunkId next = 0;
  const std::size_t limit = 20 * n;
  while ((next < n || !all_fed()) && next < limit) {
    for (int i = 0; i < 64; ++i) q.push(next++);
    for (int i = 0; i < 16; ++i) {
      if (auto c = q.pop()) popped.push_back(*c);
    }
    if (next % 4096 == 0) std::this_thread::yield();  // two cores, five threads: let the thieves in
  }
  CHECK(all_fed());
  while (auto c = q.pop()) popped.push_back(*c);
  thieves.join();
  thieves.got.push_back(popped);
  CHECK(exactly_once(thieves.got, next));
}

TEST_CASE("ChunkDeque.Destructors") {
  SUBCASE("a stealer keeps the state alive after the owner is gone") {
    Stealer s = ChunkDeque(2).stealer();
    CHECK(s.steal().status == StealStatus::kEmpty);
    std::optional<Stealer> keep;
    {
      ChunkDeque q(2);
      for (ChunkId i = 0; i < 100; ++i) q.push(i);  // retires several buffers
      keep.emplace(q.stealer());
    }
    std::vector<ChunkId> got;
    drain_with(*keep, got);
    CHECK(exactly_once(std::vector<std::vector<ChunkId>>{got}, 100));
  }
  SUBCASE("reclaim at a quiescent point frees retired buffers and keeps the chunks") {
    ChunkDeque q(2);
    for (ChunkId i = 0; i < 100; ++i) q.push(i);
    CHECK(q.retired_buffers() > 0);
    q.reclaim();
    CHECK(q.retired_buffers() == 0);
    std::vector<ChunkId> got;
    while (auto c = q.pop()) got.push_back(*c);
    CHECK(exactly_once(std::vector<std::vector<ChunkId>>{got}, 100));
  }
  SUBCASE("moved-from and destroyed with chunks inside") {
    ChunkDeque a(8);
    for (ChunkId i = 0; i < 50; ++i) a.push(i);
    ChunkDeque b = std::move(a);
    CHECK(b.size() == 50);
  }
}

// Which deque an idle worker tries to steal from first.
#pragma once

#include <stealbatch/scheduler/chunk_deque.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

namespace stealbatch {

enum class VictimPolicy {
  kRandom,      // a uniformly random other worker
  kSticky,      // the last victim that yielded work, else random: keeps a thief on one busy device
  kMostLoaded,  // the worker whose deque looks longest (racy size estimate), else random
};

// A small, fast PRNG (splitmix64 to seed, xorshift64* to draw). Not for anything but victim order.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) noexcept {
    std::uint64_t z = seed + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    m_state = (z ^ (z >> 31)) | 1;  // xorshift needs a non-zero state
  }
  std::uint64_t next() noexcept {
    m_state ^= m_state >> 12;
    m_state ^= m_state << 25;
    m_state ^= m_state >> 27;
    return m_state * 0x2545f4914f6cdd1dULL;
  }
  // Uniform in [0, n) for 0 < n < 2^32, by Lemire's multiply-shift on 32 random bits (bias below n / 2^32).
  std::size_t below(std::size_t n) noexcept {
    return static_cast<std::size_t>(((next() >> 32) * static_cast<std::uint64_t>(n)) >> 32);
  }

 private:
  std::uint64_t m_state;
};

// One per worker. A steal round visits every other worker once: first the policy's pick, then the rest in
// ring order from there, so no victim is starved and a round that finds everyone empty really saw everyone.
//
//   VictimSelector sel(self, n, VictimPolicy::kSticky, seed);
//   for (std::size_t i = 0, v = sel.first(stealers); i + 1 < n; ++i, v = sel.after(v)) { ... }
class VictimSelector {
 public:
  VictimSelector(std::size_t self, std::size_t workers, VictimPolicy policy, std::uint64_t seed) noexcept
      : m_self(self), m_n(workers), m_policy(policy), m_rng(seed ^ (0x9e37ULL * (self + 1))), m_last(self) {}

  std::size_t first(std::span<const Stealer> stealers) noexcept {
    switch (m_policy) {
      case VictimPolicy::kSticky:
        if (m_last != m_self) return m_last;
        break;
      case VictimPolicy::kMostLoaded: {
        std::size_t best = m_self, best_size = 0;
        const std::size_t start = m_rng.below(m_n);  // random start: ties do not always go to the same worker
        for (std::size_t k = 0; k < m_n; ++k) {
          const std::size_t v = (start + k) % m_n;
          if (v == m_self) continue;
          const std::size_t s = stealers[v].size_hint();
          if (s > best_size) best = v, best_size = s;
        }
        if (best != m_self) return best;
        break;
      }
      case VictimPolicy::kRandom:
        break;
    }
    return random_other();
  }

  std::size_t after(std::size_t v) const noexcept {
    v = (v + 1) % m_n;
    return v == m_self ? (v + 1) % m_n : v;
  }

  void on_success(std::size_t victim) noexcept { m_last = victim; }
  void on_empty(std::size_t victim) noexcept {
    if (victim == m_last) m_last = m_self;
  }

 private:
  std::size_t random_other() noexcept {
    const std::size_t r = m_rng.below(m_n - 1);  // callers guarantee m_n >= 2
    return r >= m_self ? r + 1 : r;
  }

  std::size_t m_self;
  std::size_t m_n;
  VictimPolicy m_policy;
  Rng m_rng;
  std::size_t m_last;  // m_self when there is no sticky victim
};

}  // namespace stealbatch

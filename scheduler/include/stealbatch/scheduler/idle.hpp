// How a worker with nothing to run waits: a bounded spin, then yields, then a park that uses no CPU.
#pragma once

#include <stealbatch/cores.hpp>
#include <stealbatch/scheduler/detail/atomics.hpp>

#include <atomic>
#include <cstdint>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace stealbatch {

// Spinning only pays while another core is free to produce work, so at most max_spinners workers spin at once
// (by default half the cores, at least one); the others go straight to yielding, then park.
//
//   IdleOptions idle;
//   idle.spin_rounds = 0;   // never spin: park as soon as the yields are spent
struct IdleOptions {
  std::uint32_t spin_rounds = 64;    // steal rounds while spinning, each followed by kPausesPerSpin pauses
  std::uint32_t yield_rounds = 8;    // steal rounds followed by std::this_thread::yield()
  std::uint32_t max_spinners = default_max_spinners();

  static std::uint32_t default_max_spinners() noexcept {
    const unsigned cores = usable_cores();
    return cores >= 2 ? cores / 2 : 1;
  }
};

inline constexpr int kPausesPerSpin = 32;

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Caps the number of workers spinning at once. A worker holds a slot for the whole of its spin phase.
class SpinBudget {
 public:
  explicit SpinBudget(std::uint32_t max_spinners) : m_max(max_spinners) {}

  bool try_acquire() noexcept {
    // Relaxed throughout: the count guards no data, it only rations CPU; an overshoot by a race is bounded by the
    // CAS, which never lets the count pass m_max.
    std::uint32_t n = m_spinning.load(std::memory_order_relaxed);
    while (n < m_max) {
      if (m_spinning.compare_exchange_weak(n, n + 1, std::memory_order_relaxed)) return true;
    }
    return false;
  }
  void release() noexcept { m_spinning.fetch_sub(1, std::memory_order_relaxed); }  // relaxed: as above
  std::uint32_t spinning() const noexcept { return m_spinning.load(std::memory_order_relaxed); }

 private:
  std::uint32_t m_max;
  alignas(detail::kCacheLine) std::atomic<std::uint32_t> m_spinning{0};
};

}  // namespace stealbatch

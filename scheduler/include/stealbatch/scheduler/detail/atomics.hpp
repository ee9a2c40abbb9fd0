// The full-barrier points of the Chase–Lev pairing, and their TSan-visible replacement.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#if defined(__SANITIZE_THREAD__)
#define SB_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SB_TSAN 1
#endif
#endif
#ifndef SB_TSAN
#define SB_TSAN 0
#endif

namespace stealbatch::detail {

inline constexpr std::size_t kCacheLine = 64;

// The owner's "store bottom, full barrier, load top" and the thief's "load top, full barrier, load bottom" form
// a store-buffering (Dekker) pair: at least one side must see the other's write. Lê et al. put a seq_cst fence
// between the two accesses. TSan does not model stand-alone fences (GCC refuses them under -fsanitize=thread),
// so the TSan build makes both accesses seq_cst instead: a stronger order than the algorithm needs, with the
// same total-order guarantee for this pair. The fence build is covered by the deterministic last-item race and
// the exactly-once stress tests in tests/scheduler, which run in the normal and ASan builds.
inline void store_then_full_barrier(std::atomic<std::int64_t>& a, std::int64_t v) noexcept {
#if SB_TSAN
  a.store(v, std::memory_order_seq_cst);
#else
  // Release: a thief's acquire load of bottom that reads this value sees every slot written before it.
  a.store(v, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

inline void full_barrier_between_loads() noexcept {
#if !SB_TSAN
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

// The load that follows the barrier: relaxed after a real fence, seq_cst when the fence is elided for TSan.
inline std::int64_t load_after_barrier(const std::atomic<std::int64_t>& a,
                                       std::memory_order fenced_order) noexcept {
#if SB_TSAN
  (void)fenced_order;
  return a.load(std::memory_order_seq_cst);
#else
  return a.load(fenced_order);
#endif
}

// The load that precedes the barrier on the thief's side.
inline std::int64_t load_before_barrier(const std::atomic<std::int64_t>& a) noexcept {
#if SB_TSAN
  return a.load(std::memory_order_seq_cst);
#else
  // Acquire, as in Lê et al.: synchronizes with the CAS that advanced top to this value.
  return a.load(std::memory_order_acquire);
#endif
}

}  // namespace stealbatch::detail

// Sleep on a 32-bit atomic until it changes, and wake its sleepers: a raw futex on Linux, std::atomic elsewhere.
#pragma once

#include <atomic>
#include <cstdint>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

namespace stealbatch::detail {

// libstdc++'s std::atomic::wait/notify add a shared waiter table and a spin-then-backoff on top of the futex, which
// made a step's hand-off several times slower. The kernel compares the word with `seen` atomically with the sleep,
// so a change between the caller's load and the sleep is not lost; a spurious return is possible, so callers
// re-check in a loop.
static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) && std::atomic<std::uint32_t>::is_always_lock_free,
              "a futex word must be a plain 32-bit integer");

inline constexpr int kWakeAll = 0x7fffffff;

inline void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t seen) noexcept {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
#else
  word.wait(seen, std::memory_order_acquire);
#endif
}

// As futex_wait, for at most `timeout_ns` (a spurious or timed-out return looks the same: callers re-check).
inline void futex_wait_for(std::atomic<std::uint32_t>& word, std::uint32_t seen, long long timeout_ns) noexcept {
#if defined(__linux__)
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout_ns / 1000000000LL);
  ts.tv_nsec = static_cast<long>(timeout_ns % 1000000000LL);
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, seen, &ts, nullptr, 0);
#else
  (void)timeout_ns;
  word.wait(seen, std::memory_order_acquire);
#endif
}

inline void futex_wake(std::atomic<std::uint32_t>& word, int count) noexcept {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, count, nullptr, nullptr, 0);
#else
  if (count == 1) {
    word.notify_one();
  } else {
    word.notify_all();
  }
#endif
}

}  // namespace stealbatch::detail

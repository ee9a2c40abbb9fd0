// A two-phase (prepare/commit) wait, so that a worker can park without missing work published meanwhile.
#pragma once

#include <stealbatch/scheduler/detail/atomics.hpp>
#include <stealbatch/scheduler/detail/futex.hpp>

#include <atomic>
#include <cstdint>

namespace stealbatch {

// An event count in the style of folly::EventCount and Taskflow's Notifier. A waiter announces itself, then
// re-checks its condition, then either cancels or commits to sleep; a notifier publishes its change, then
// notifies. Either the waiter's re-check sees the change, or the notifier sees the waiter and bumps the epoch,
// so the commit does not sleep (or wakes).
//
//   auto key = ev.prepare_wait();
//   if (work_visible()) ev.cancel_wait(); else ev.commit_wait(key);
//   ...
//   publish_work(); ev.notify_one();
//
// Why no stand-alone fence is needed (and so TSan sees every edge): both the waiter's announcement and the
// notifier's look at the waiter count are read-modify-writes on m_waiters, and RMWs on one object are totally
// ordered. If the notifier's RMW comes first, the waiter's RMW reads its value and synchronizes with it, so the
// waiter's re-check sees the published work. If the waiter's comes first, the notifier sees a waiter and bumps
// the epoch. A key read before the bump differs from the epoch, so the commit does not sleep; a key read after
// it synchronizes with the bump, so the re-check that follows sees the work.
class EventCount {
 public:
  class Key {
    friend class EventCount;
    explicit Key(std::uint32_t e) : m_epoch(e) {}
    std::uint32_t m_epoch;
  };

  Key prepare_wait() noexcept {
    // Seq_cst RMW: pairs with the RMW in notify() (see the class comment).
    m_waiters.fetch_add(1, std::memory_order_seq_cst);
    // Acquire: pairs with the release in notify()'s epoch bump; a key read after a bump sees what it published.
    return Key(m_epoch.load(std::memory_order_acquire));
  }

  // Relaxed: leaving early only makes a later notify() bump the epoch once for nobody, which is harmless.
  void cancel_wait() noexcept { m_waiters.fetch_sub(1, std::memory_order_relaxed); }

  void commit_wait(Key key) noexcept {
    // Acquire: pairs with the release bump in notify(). The futex re-checks the word atomically with the sleep, so
    // a bump between the load and the sleep is not missed.
    while (m_epoch.load(std::memory_order_acquire) == key.m_epoch) detail::futex_wait(m_epoch, key.m_epoch);
    m_waiters.fetch_sub(1, std::memory_order_relaxed);  // relaxed: as in cancel_wait()
  }

  void notify_one() noexcept {
    if (has_waiters()) {
      m_epoch.fetch_add(1, std::memory_order_release);  // release: pairs with the acquire loads in the waiter
      detail::futex_wake(m_epoch, 1);
    }
  }

  void notify_all() noexcept {
    if (has_waiters()) {
      m_epoch.fetch_add(1, std::memory_order_release);  // release: as in notify_one()
      detail::futex_wake(m_epoch, detail::kWakeAll);
    }
  }

  // Waiters that have announced themselves and not yet left; racy, for diagnostics.
  std::uint32_t waiters() const noexcept { return m_waiters.load(std::memory_order_relaxed); }

 private:
  bool has_waiters() noexcept {
    // An RMW, not a load: it reads the latest waiter count in modification order and pairs with prepare_wait().
    return m_waiters.fetch_add(0, std::memory_order_seq_cst) != 0;
  }

  alignas(detail::kCacheLine) std::atomic<std::uint32_t> m_epoch{0};  // the futex word
  alignas(detail::kCacheLine) std::atomic<std::uint32_t> m_waiters{0};
};

}  // namespace stealbatch

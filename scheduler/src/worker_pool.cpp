// The worker pool: the options' checks, starting one thread per worker (and its deque), and stopping them.
#include "scheduler_impl.hpp"

#include <stealbatch/error.hpp>

#include <string>
#include <utility>

namespace stealbatch {

void detail::check_range(const char* field, std::size_t value, std::size_t lo, std::size_t hi) {
  if (value < lo || value > hi) {
    throw ConfigError(std::string("scheduler: ") + field + " = " + std::to_string(value) + "; valid range is [" +
                      std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
}

Scheduler::Scheduler(SchedulerOptions options) : m_options(std::move(options)), m_spin(m_options.idle.max_spinners) {
  detail::check_range("workers", m_options.workers, 1, 4096);
  detail::check_range("steal_batch_cap", m_options.steal_batch_cap, 1, kMaxStealBatch);
  detail::check_range("deque_capacity", m_options.deque_capacity, 2, std::size_t{1} << 30);

  const std::size_t n = m_options.workers;
  m_launch_spins = n < usable_cores() ? kLaunchSpins : 0;  // a core left beside the workers (launch.cpp)
  if (m_options.schedule == SchedulePolicy::kCentral) m_central = std::make_unique<Central>();
  m_workers.reserve(n);
  m_stealers.reserve(n);
  for (std::size_t w = 0; w < n; ++w) {
    m_workers.push_back(std::make_unique<Worker>(w, m_options));
    m_stealers.push_back(m_workers.back()->deque.stealer());
  }

  std::size_t launched = 0;
  try {
    for (; launched < n; ++launched) {
      m_workers[launched]->thread = std::thread([this, w = launched] {
        try {
          if (m_options.on_worker_start) m_options.on_worker_start(w);
        } catch (...) {
          bool expected = false;
          // Acq_rel: only the first failure writes m_start_error; the caller reads it after m_started.
          if (m_start_failed.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
            m_start_error = std::current_exception();
          }
        }
        // Release: publishes m_start_error; pairs with the caller's acquire loads of m_started.
        m_started.fetch_add(1, std::memory_order_release);
        detail::futex_wake(m_started, 1);
        worker_main(w);
      });
    }
  } catch (...) {
    // std::thread could not start: stop the ones that did, then report.
    m_shutdown.store(true, std::memory_order_relaxed);  // relaxed: the RMW in notify_all() publishes it
    m_event.notify_all();
    for (std::size_t w = 0; w < launched; ++w) m_workers[w]->thread.join();
    throw;
  }

  for (std::uint32_t s; (s = m_started.load(std::memory_order_acquire)) != n;) detail::futex_wait(m_started, s);
  if (m_start_failed.load(std::memory_order_relaxed)) {  // relaxed: ordered by the acquire of m_started above
    m_shutdown.store(true, std::memory_order_relaxed);     // relaxed: the RMW in notify_all() publishes it
    m_event.notify_all();
    for (auto& w : m_workers) w->thread.join();
    std::rethrow_exception(m_start_error);
  }
}

Scheduler::~Scheduler() {
  // Relaxed: the seq_cst RMW inside notify_all() orders it before any waiter's re-check (see EventCount).
  m_shutdown.store(true, std::memory_order_relaxed);
  m_event.notify_all();
  for (auto& w : m_workers) {
    if (w->thread.joinable()) w->thread.join();
  }
}

}  // namespace stealbatch

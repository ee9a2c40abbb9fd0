// A step's launch: publish it and wake the workers, wait for them under the watchdog, collect and check the counts.
#include "scheduler_impl.hpp"

#include <stealbatch/error.hpp>

#include <stdexcept>
#include <string>
#include <utility>

namespace stealbatch {

StepStats Scheduler::launch(std::uint64_t chunks, ChunkFn fn, const std::function<void()>& meanwhile) {
  StepStats stats;
  stats.chunks = chunks;
  if (chunks == 0) {
    if (meanwhile) meanwhile();  // nothing to overlap it with; an exception propagates to the caller
    stats.workers.resize(m_workers.size());
    return stats;
  }

  const auto t0 = Clock::now();
  m_step_start = t0;
  m_fn = &fn;
  m_error = nullptr;
  m_strategy = pick_strategy();
  start_step(chunks);
  if (meanwhile) {
    // The caller's own work while the workers run; it touches nothing of the step's (the workers own that now).
    try {
      meanwhile();
    } catch (...) {
      fail_step(std::current_exception());
    }
  }
  wait_for_workers();
  stats.wall = Clock::now() - t0;
  m_fn = nullptr;
  finish_step(stats);
  return stats;
}

void Scheduler::start_step(std::uint64_t chunks) noexcept {
  // Relaxed: the release bump of m_step_seq below publishes these, and the deques, to the workers.
  m_abort.store(false, std::memory_order_relaxed);
  m_remaining.store(chunks, std::memory_order_relaxed);
  m_left_units.store(m_weighted ? m_placed_units : 0, std::memory_order_relaxed);
  for (auto& worker : m_workers) worker->live_factor = 1.0, worker->live_ahead = 0.0, worker->left_takers = false;
  m_takers.store(m_endgame.fastest_count(), std::memory_order_relaxed);
  m_in_step.store(static_cast<std::uint32_t>(m_workers.size()), std::memory_order_relaxed);
  // Release: pairs with the workers' acquire loads of m_step_seq.
  m_step_seq.fetch_add(1, std::memory_order_release);
  m_event.notify_all();
}

void Scheduler::wait_for_workers() {
  // A launch often ends within microseconds (a broadcast's small job, a step of one short chunk): look for the end a
  // while before sleeping, since a futex wake-up costs the caller more than such a launch (10-20 us on a virtual
  // machine). Only where a core is left beside the workers: on fewer, the spin would take a worker's core. Bounded:
  // a long step costs one short spin.
  for (int i = 0; i < m_launch_spins && m_in_step.load(std::memory_order_acquire) != 0; ++i) cpu_relax();  // acquire: as below
  if (m_watch_check) {
    watch_step();
    return;
  }
  // Acquire: pairs with each worker's release decrement, so their counters and deques are settled.
  for (std::uint32_t left; (left = m_in_step.load(std::memory_order_acquire)) != 0;) {
    detail::futex_wait(m_in_step, left);
  }
}

void Scheduler::watch_step() {
  bool fired = false;
  // Acquire: pairs with each worker's release decrement, as in wait_for_workers().
  for (std::uint32_t left; (left = m_in_step.load(std::memory_order_acquire)) != 0;) {
    detail::futex_wait_for(m_in_step, left, m_watch_period.count());
    if (fired || m_in_step.load(std::memory_order_acquire) == 0) continue;
    std::exception_ptr e;
    try {
      e = m_watch_check();
    } catch (...) {
      e = std::current_exception();
    }
    if (e) {
      fired = true;
      fail_step(std::move(e));
      if (m_watch_fail) m_watch_fail();
    }
  }
}

void Scheduler::finish_step(StepStats& stats) {
  // Allocated only now, so the path from placement to the wake-up does not touch the heap.
  stats.workers.resize(m_workers.size());

  std::uint64_t ran = 0;
  for (std::size_t w = 0; w < m_workers.size(); ++w) {
    stats.workers[w] = m_workers[w]->counters;
    ran += stats.workers[w].chunks_run;
  }
  if (m_error) std::rethrow_exception(m_error);
  if (m_source) {
    // Relaxed: the workers' release decrements of m_in_step, acquired above, ordered every refill before this.
    stats.chunks = m_sourced.load(std::memory_order_relaxed);
  }
  // The invariant the whole design rests on; cheap enough to check on every step.
  bool drained = !m_central || m_central->queue.empty();
  for (const auto& w : m_workers) drained = drained && w->deque.empty();
  if (ran != stats.chunks || !drained) {
    discard_all();
    throw std::logic_error("scheduler: a step placed " + std::to_string(stats.chunks) + " chunks but ran " +
                           std::to_string(ran) + (drained ? "" : " and left some queued") + ": exactly-once violated");
  }
}

void Scheduler::set_watchdog(std::chrono::nanoseconds period, std::function<std::exception_ptr()> check, std::function<void()> on_fail) {
  if (check && period <= std::chrono::nanoseconds(0)) throw ConfigError("watchdog period must be > 0");
  m_watch_period = period;
  m_watch_check = std::move(check);
  m_watch_fail = std::move(on_fail);
}

void Scheduler::fail_step(std::exception_ptr e) noexcept {
  bool expected = false;
  // Acq_rel: only the first failure writes m_error; the caller reads it after the step (through m_in_step).
  if (m_abort.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) m_error = std::move(e);
  m_event.notify_all();
}

}  // namespace stealbatch

// What the Scheduler's source files share: a worker's state, the central queue, and the idle wait.
#pragma once

#include <stealbatch/scheduler/scheduler.hpp>

#include <boost/lockfree/queue.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

namespace stealbatch {

namespace detail {

// Throws ConfigError naming the field and its valid range unless lo <= value <= hi.
void check_range(const char* field, std::size_t value, std::size_t lo, std::size_t hi);

}  // namespace detail

// The caller's look for a launch's end before it sleeps (wait_for_workers()): about 10-40 us of pauses.
inline constexpr int kLaunchSpins = 1024;

struct Scheduler::Central {
  boost::lockfree::queue<ChunkId> queue{1024};
  std::size_t reserved = 1024;  // nodes in the queue's free list; reserve() adds, so only the shortfall is asked for
};

struct alignas(detail::kCacheLine) Scheduler::Worker {
  Worker(std::size_t i, const SchedulerOptions& o)
      : index(i), deque(o.deque_capacity), victims(i, o.workers, o.victim, o.seed) {}

  std::size_t index;
  ChunkDeque deque;
  VictimSelector victims;
  WorkerCounters counters;
  std::uint32_t seen_seq = 0;
  // This step's observed slowdown (set_live_factor) and whether this worker, one of the fastest as placed, has
  // left the rest of the step to the others. Touched only by this worker during a step, reset by the caller
  // between steps (ordered by the step hand-off).
  double live_factor = 1.0;
  double live_ahead = 0.0;
  bool left_takers = false;
  std::vector<ChunkId> sourced;  // a sourced step: what the source wrote (sized by run_sourced, between steps)
  // A merging steal: group[0] the chunk to run, group[1, group_size) the others that run in the same call; the
  // steal writes what it took after the first into group[1, ...). Owned by this worker from the steal to execute().
  std::array<ChunkId, kMaxStealBatch + 1> group{};
  std::size_t group_size = 0;
  std::thread thread;
};

template <class Poll, class Ready>
void Scheduler::wait_until(Poll&& poll, Ready&& ready, std::uint64_t* parks) {
  const IdleOptions& idle = m_options.idle;
  std::uint32_t spins = 0, yields = 0;
  bool spinning = false;
  while (!poll()) {
    if (spins < idle.spin_rounds && (spinning || (spinning = m_spin.try_acquire()))) {
      ++spins;
      for (int k = 0; k < kPausesPerSpin; ++k) cpu_relax();
      continue;
    }
    if (spinning) m_spin.release(), spinning = false;
    if (yields < idle.yield_rounds) {
      ++yields;
      std::this_thread::yield();
      continue;
    }
    const EventCount::Key key = m_event.prepare_wait();
    if (ready()) {
      m_event.cancel_wait();
      continue;
    }
    m_parked.fetch_add(1, std::memory_order_relaxed);  // relaxed: a diagnostic count
    if (parks) ++*parks;
    m_event.commit_wait(key);
    m_parked.fetch_sub(1, std::memory_order_relaxed);
    spins = yields = 0;
  }
  if (spinning) m_spin.release();
}

}  // namespace stealbatch

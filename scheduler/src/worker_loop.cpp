// The worker loop: a worker's life across steps, and within one: run my own chunks, then find more, until it ends.
#include "scheduler_impl.hpp"

#include <algorithm>
#include <utility>

namespace stealbatch {

void Scheduler::worker_main(std::size_t w) {
  Worker& me = *m_workers[w];
  for (;;) {
    // Acquire on m_step_seq: pairs with the release bump in start_step(). Acquire on m_shutdown is not needed: it
    // guards no data.
    auto next_phase = [&] {
      return m_shutdown.load(std::memory_order_relaxed) || m_step_seq.load(std::memory_order_acquire) != me.seen_seq;
    };
    wait_until(next_phase, next_phase, nullptr);
    if (m_shutdown.load(std::memory_order_relaxed)) return;
    me.seen_seq = m_step_seq.load(std::memory_order_acquire);
    run_step(me);
    // Release: publishes this worker's counters and its last deque operations; pairs with the acquire in
    // wait_for_workers().
    if (m_in_step.fetch_sub(1, std::memory_order_release) == 1) detail::futex_wake(m_in_step, 1);
  }
}

// As Taskflow's worker loop (_exploit_task, then _wait_for_task): run my own chunks; then steal, ask or wait for
// more, and run what I found, until the step is over for me. The step's strategy decides what each call does.
void Scheduler::run_step(Worker& me) {
  me.counters = WorkerCounters{};
  ChunkId c = 0;
  while (run_own(me) && find_more(me, c)) execute(me, c);
  (this->*m_strategy.drain)(me);
}

Scheduler::Strategy Scheduler::pick_strategy() const noexcept {
  if (m_broadcast != nullptr) return {&Scheduler::run_broadcast, &Scheduler::wait_out, &Scheduler::drain_nothing};
  // The central queue: take until it is empty, then wait for the chunks still running elsewhere.
  if (m_central) return {&Scheduler::run_central, &Scheduler::wait_out, &Scheduler::drain_central};
  // Stealing; a sourced step also asks its source when every deque looks empty.
  if (m_options.schedule == SchedulePolicy::kSteal && m_workers.size() > 1) {
    return {&Scheduler::run_deque, &Scheduler::steal, &Scheduler::drain_deque};
  }
  // Static (or a lone worker, with no one to steal from), sourced: only the source, no stealing from other deques.
  if (m_source != nullptr) return {&Scheduler::run_deque, &Scheduler::ask_source, &Scheduler::drain_deque};
  // Static: idle until the others finish, as at a DDP barrier.
  return {&Scheduler::run_deque, &Scheduler::wait_out, &Scheduler::drain_deque};
}

bool Scheduler::run_own(Worker& me) { return (this->*m_strategy.own)(me); }

bool Scheduler::find_more(Worker& me, ChunkId& out) {
  const auto t0 = Clock::now();
  const bool found = (this->*m_strategy.more)(me, out);
  me.counters.idle += Clock::now() - t0;
  return found;
}

bool Scheduler::run_deque(Worker& me) {
  for (;;) {
    // Relaxed: the abort flag guards no data (the error itself reaches the caller through m_in_step).
    if (m_abort.load(std::memory_order_relaxed)) return false;
    if (!me.deque.empty() ? !worth_taking(me.index, Source::kOwn) : !worth_taking(me.index, Source::kStolen)) {
      leave_to_others(me);
      return false;
    }
    const auto c = me.deque.pop();
    if (!c) return true;
    execute(me, *c);
  }
}

void Scheduler::leave_to_others(Worker& me) {
  // The end game: the others finish what is left sooner. Whatever is still in this deque, they steal; wake
  // them, since a worker that parked before these chunks were visible might otherwise sleep through them.
  const auto t0 = Clock::now();
  me.counters.endgame_declines = 1;
  if (!me.deque.empty()) m_event.notify_all();
  wait_step_over(me);
  me.counters.idle += Clock::now() - t0;
}

bool Scheduler::run_central(Worker& me) {
  ChunkId c = 0;
  // Relaxed: as in run_deque().
  while (!m_abort.load(std::memory_order_relaxed) && m_central->queue.pop(c)) execute(me, c);
  return true;
}

bool Scheduler::run_broadcast(Worker& me) {
  const auto t0 = Clock::now();
  try {
    (*m_broadcast)(me.index);
  } catch (...) {
    fail_step(std::current_exception());
  }
  me.counters.busy = Clock::now() - t0;
  me.counters.last_end = me.counters.busy;
  me.counters.chunks_run = 1;
  m_remaining.fetch_sub(1, std::memory_order_relaxed);  // relaxed: as in execute(); nobody waits on it here
  return false;  // its one call is all it runs
}

bool Scheduler::wait_out(Worker& me, ChunkId& /*out*/) {
  wait_step_over(me);
  return false;
}

void Scheduler::wait_step_over(Worker& me) {
  auto over = [&] { return step_over(); };
  wait_until(over, over, &me.counters.parks);
}

void Scheduler::drain_deque(Worker& me) noexcept {
  // After a failure, discard what is left here. Only this worker pushes to its deque, and it pushes no more this
  // step, so once every worker has drained its own, every deque is empty for the next step.
  while (me.deque.pop()) {
  }
}

void Scheduler::drain_central(Worker& /*me*/) noexcept {
  if (m_abort.load(std::memory_order_relaxed)) {  // relaxed: as in run_deque()
    ChunkId c = 0;
    while (m_central->queue.pop(c)) {  // after a failure, discard the rest (every worker may help)
    }
  }
}

void Scheduler::drain_nothing(Worker& /*me*/) noexcept {}  // a broadcast touches no deque

bool Scheduler::step_over() const noexcept {
  // Relaxed on m_remaining and m_abort: they guard no data. A worker that leaves the step on either has nothing
  // left to read from the step; what it wrote reaches the caller through m_in_step.
  return m_remaining.load(std::memory_order_relaxed) == 0 || m_abort.load(std::memory_order_relaxed);
}

void Scheduler::execute(Worker& me, ChunkId c) {
  const std::size_t n = std::max<std::size_t>(1, std::exchange(me.group_size, 0));
  if (m_abort.load(std::memory_order_relaxed)) return;  // the step has failed: discard (relaxed: as in step_over)
  // A weighted step's count of what is left: a chunk that has started is, seen at a random moment, half done, so
  // half its weight leaves the count now and half when it ends. (Counting it whole until it ends made a slow worker
  // see the chunks the others are finishing as still to do, and start one more of its own at the very end.)
  // Relaxed: an estimate for the end game; every placed chunk runs once, so the count ends at 0, never below.
  std::uint64_t units = 0;
  if (m_weighted) {
    for (std::size_t i = 0; i < n; ++i) units += m_weight_units[n > 1 ? me.group[i] : c];
    m_left_units.fetch_sub(units / 2, std::memory_order_relaxed);
  }
  const auto t0 = Clock::now();
  try {
    if (n > 1) {
      m_merge->run(me.index, std::span<const ChunkId>(me.group.data(), n));
    } else {
      (*m_fn)(me.index, c);
    }
  } catch (...) {
    fail_step(std::current_exception());
  }
  const auto t1 = Clock::now();
  me.counters.busy += t1 - t0;
  me.counters.last_end = t1 - m_step_start;
  me.counters.chunks_run += n;
  me.counters.chunks_merged += n - 1;
  if (m_weighted) m_left_units.fetch_sub(units - units / 2, std::memory_order_relaxed);  // relaxed: as above
  // Relaxed: the RMW alone makes exactly one worker see the count reach zero. The notify_all() that follows is
  // an RMW on the waiter count, which orders the zero before any parked worker's re-check (see EventCount).
  if (m_remaining.fetch_sub(n, std::memory_order_relaxed) == n) m_event.notify_all();
}

}  // namespace stealbatch

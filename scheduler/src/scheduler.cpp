// The worker loop: pop own chunks, steal when empty, spin then yield then park, and exactly-once step accounting.
#include "scheduler_impl.hpp"

#include <stealbatch/error.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace stealbatch {

void Scheduler::worker_main(std::size_t w) {
  Worker& me = *m_workers[w];
  for (;;) {
    // Acquire on m_step_seq: pairs with the release bump in launch(). Acquire on m_shutdown is not needed: it
    // guards no data.
    auto next_phase = [&] {
      return m_shutdown.load(std::memory_order_relaxed) || m_step_seq.load(std::memory_order_acquire) != me.seen_seq;
    };
    wait_until(next_phase, next_phase, nullptr);
    if (m_shutdown.load(std::memory_order_relaxed)) return;
    me.seen_seq = m_step_seq.load(std::memory_order_acquire);
    run_step(me);
    // Release: publishes this worker's counters and its last deque operations; pairs with launch()'s acquire.
    if (m_in_step.fetch_sub(1, std::memory_order_release) == 1) detail::futex_wake(m_in_step, 1);
  }
}

void Scheduler::run_step(Worker& me) {
  me.counters = WorkerCounters{};
  if (m_broadcast != nullptr) {
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
    return;
  }
  auto over = [&] { return step_over(); };
  if (m_central) {
    // The central queue: take until it is empty, then wait for the chunks still running elsewhere.
    ChunkId c = 0;
    while (!m_abort.load(std::memory_order_relaxed) && m_central->queue.pop(c)) execute(me, c);  // relaxed: as below
    const auto t0 = Clock::now();
    wait_until(over, over, &me.counters.parks);
    me.counters.idle += Clock::now() - t0;
    if (m_abort.load(std::memory_order_relaxed)) {
      while (m_central->queue.pop(c)) {  // after a failure, discard the rest (every worker may help)
      }
    }
    return;
  }
  for (;;) {
    // Relaxed: the abort flag guards no data (the error itself reaches the caller through m_in_step).
    if (m_abort.load(std::memory_order_relaxed)) break;
    if (!me.deque.empty() ? !worth_taking(me.index, Source::kOwn) : !worth_taking(me.index, Source::kStolen)) {
      // The end game: the others finish what is left sooner. Whatever is still in this deque, they steal; wake
      // them, since a worker that parked before these chunks were visible might otherwise sleep through them.
      const auto t0 = Clock::now();
      me.counters.endgame_declines = 1;
      if (!me.deque.empty()) m_event.notify_all();
      wait_until(over, over, &me.counters.parks);
      me.counters.idle += Clock::now() - t0;
      break;
    }
    if (auto c = me.deque.pop()) {
      execute(me, *c);
      continue;
    }
    const auto t0 = Clock::now();
    ChunkId stolen = 0;
    Found f = Found::kStepOver;
    if (m_options.schedule == SchedulePolicy::kSteal) {
      f = find_work(me, stolen);
    } else if (m_source) {
      // Static, sourced: only the source, no stealing from the other deques.
      if (wait_for_source(me, stolen)) {
        f = Found::kChunk;
      } else {
        wait_until(over, over, &me.counters.parks);
      }
    } else {
      wait_until(over, over, &me.counters.parks);  // static: idle until the others finish, as at a DDP barrier
    }
    me.counters.idle += Clock::now() - t0;
    if (f == Found::kStepOver) break;
    execute(me, stolen);
  }
  // After a failure, discard what is left here. Only this worker pushes to its deque, and it pushes no more this
  // step, so once every worker has drained its own, every deque is empty for the next step.
  while (me.deque.pop()) {
  }
}

Scheduler::Found Scheduler::find_work(Worker& me, ChunkId& out) {
  const std::size_t n = m_workers.size();
  if (n == 1) {
    auto over = [&] { return step_over(); };
    if (m_source && wait_for_source(me, out)) return Found::kChunk;
    wait_until(over, over, &me.counters.parks);
    return Found::kStepOver;
  }
  Found found = Found::kStepOver;
  auto steal_round = [&] {
    for (;;) {
      if (step_over()) return true;
      if (!worth_taking(me.index, Source::kStolen)) {  // the end game, as in run_step(): wait for the others to finish
        me.counters.endgame_declines = 1;
        return true;
      }
      bool retry = false;
      std::size_t v = me.victims.first(m_stealers);
      for (std::size_t i = 0; i + 1 < n; ++i, v = me.victims.after(v)) {
        ++me.counters.steal_attempts;
        StealStatus status;
        ChunkId c = 0;
        std::size_t moved = 0;
        std::size_t pushed = 0;  // of `moved`, what went onto our deque (the rest runs with c in one call)
        if (m_merge != nullptr) {
          const StolenBatch s = m_stealers[v].steal_batch(std::span<ChunkId, kMaxStealBatch>(me.group.data() + 1, kMaxStealBatch), steal_cap(me.index));
          status = s.status, c = s.chunk, moved = s.moved;
          if (status == StealStatus::kTaken) {
            // Every chunk taken is ours now: the chosen ones run with c, the rest go onto our deque, where others
            // may steal them again. None is dropped, so exactly-once rests on the steal's CASes as without merging.
            const std::size_t k = merged_prefix(me, c, moved);
            me.group[0] = c;
            me.group_size = 1 + k;
            pushed = moved - k;
            if (pushed > 0) me.deque.push_bulk(std::span<const ChunkId>(me.group.data() + 1 + k, pushed));
          }
        } else if (m_options.steal == StealPolicy::kHalf) {
          const StolenBatch s = m_stealers[v].steal_batch_and_pop(me.deque, steal_cap(me.index));
          status = s.status, c = s.chunk, moved = s.moved, pushed = s.moved;
        } else {
          const Stolen s = m_stealers[v].steal();
          status = s.status, c = s.chunk;
        }
        if (status == StealStatus::kTaken) {
          me.victims.on_success(v);
          me.counters.chunks_stolen += 1 + moved;
          out = c;
          found = Found::kChunk;
          // The batch in our deque is stealable work that a parked worker may be waiting for.
          // With the end game on, a parked worker may be one that declined and will not take it, so wake all.
          if (pushed > 0) m_endgame.active() ? m_event.notify_all() : m_event.notify_one();
          return true;
        }
        ++me.counters.failed_steals;
        if (status == StealStatus::kRetry) {
          retry = true;
        } else {
          me.victims.on_empty(v);
        }
      }
      // kRetry means another thread made progress on a deque that may still hold work: look again at once.
      if (retry) continue;
      // Every deque was empty: a sourced step asks its source (if no other worker is asking it now).
      if (m_source && refill(me, out)) {
        found = Found::kChunk;
        return true;
      }
      return false;
    }
  };
  auto ready = [&] { return step_over() || work_visible(me.index) || source_ready(); };
  wait_until(steal_round, ready, &me.counters.parks);
  if (found == Found::kStepOver && !step_over()) {
    auto over = [&] { return step_over(); };
    wait_until(over, over, &me.counters.parks);  // declined: idle until the step ends
  }
  return found;
}

bool Scheduler::step_over() const noexcept {
  // Relaxed on m_remaining and m_abort: they guard no data. A worker that leaves the step on either has nothing
  // left to read from the step; what it wrote reaches the caller through m_in_step.
  return m_remaining.load(std::memory_order_relaxed) == 0 || m_abort.load(std::memory_order_relaxed);
}

bool Scheduler::work_visible(std::size_t self) const noexcept {
  for (std::size_t v = 0; v < m_stealers.size(); ++v) {
    if (v != self && m_stealers[v].size_hint() > 0) return true;
  }
  return false;
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

std::size_t Scheduler::merged_prefix(Worker& me, ChunkId first, std::size_t moved) noexcept {
  if (moved == 0) return 0;
  try {
    return std::min(moved, m_merge->choose(me.index, first, std::span<const ChunkId>(me.group.data() + 1, moved)));
  } catch (...) {
    fail_step(std::current_exception());
    return 0;
  }
}

}  // namespace stealbatch

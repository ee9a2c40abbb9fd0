// Stealing: a worker with an empty deque takes from the others' (one chunk, half a victim, or half to run merged).
#include "scheduler_impl.hpp"

#include <algorithm>

namespace stealbatch {

bool Scheduler::steal(Worker& me, ChunkId& out) {
  Round round = Round::kEmpty;
  auto look = [&] { return (round = steal_round(me, out)) != Round::kEmpty; };
  auto ready = [&] { return step_over() || work_visible(me.index) || source_ready(); };
  wait_until(look, ready, &me.counters.parks);
  if (round == Round::kChunk) return true;
  if (!step_over()) wait_step_over(me);  // declined: idle until the step ends
  return false;
}

Scheduler::Round Scheduler::steal_round(Worker& me, ChunkId& out) {
  for (;;) {
    if (step_over()) return Round::kStop;
    if (!worth_taking(me.index, Source::kStolen)) {  // the end game, as in run_deque(): wait for the others to finish
      me.counters.endgame_declines = 1;
      return Round::kStop;
    }
    bool retry = false;
    std::size_t v = me.victims.first(m_stealers);
    for (std::size_t i = 0; i + 1 < m_workers.size(); ++i, v = me.victims.after(v)) {
      ++me.counters.steal_attempts;
      const StealStatus status = steal_from(me, v, out);
      if (status == StealStatus::kTaken) return Round::kChunk;
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
    if (m_source && refill(me, out)) return Round::kChunk;
    return Round::kEmpty;
  }
}

StealStatus Scheduler::steal_from(Worker& me, std::size_t v, ChunkId& out) {
  StealStatus status;
  ChunkId c = 0;
  std::size_t moved = 0;
  std::size_t pushed = 0;  // of `moved`, what went onto our deque (the rest runs with c in one call)
  if (m_merge != nullptr) {
    const StolenBatch s = m_stealers[v].steal_batch(std::span<ChunkId, kMaxStealBatch>(me.group.data() + 1, kMaxStealBatch), steal_cap(me.index));
    status = s.status, c = s.chunk, moved = s.moved;
    if (status == StealStatus::kTaken) pushed = group_stolen(me, c, moved);
  } else if (m_options.steal == StealPolicy::kHalf) {
    const StolenBatch s = m_stealers[v].steal_batch_and_pop(me.deque, steal_cap(me.index));
    status = s.status, c = s.chunk, moved = s.moved, pushed = s.moved;
  } else {
    const Stolen s = m_stealers[v].steal();
    status = s.status, c = s.chunk;
  }
  if (status != StealStatus::kTaken) return status;
  me.victims.on_success(v);
  me.counters.chunks_stolen += 1 + moved;
  out = c;
  // The batch in our deque is stealable work that a parked worker may be waiting for.
  // With the end game on, a parked worker may be one that declined and will not take it, so wake all.
  if (pushed > 0) m_endgame.active() ? m_event.notify_all() : m_event.notify_one();
  return status;
}

std::size_t Scheduler::group_stolen(Worker& me, ChunkId first, std::size_t moved) {
  // Every chunk taken is ours now: the chosen ones run with `first`, the rest go onto our deque, where others
  // may steal them again. None is dropped, so exactly-once rests on the steal's CASes as without merging.
  const std::size_t k = merged_prefix(me, first, moved);
  me.group[0] = first;
  me.group_size = 1 + k;
  const std::size_t pushed = moved - k;
  if (pushed > 0) me.deque.push_bulk(std::span<const ChunkId>(me.group.data() + 1 + k, pushed));
  return pushed;
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

bool Scheduler::work_visible(std::size_t self) const noexcept {
  for (std::size_t v = 0; v < m_stealers.size(); ++v) {
    if (v != self && m_stealers[v].size_hint() > 0) return true;
  }
  return false;
}

}  // namespace stealbatch

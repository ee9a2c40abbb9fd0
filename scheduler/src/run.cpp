// A step's entry points (run, run_sourced, broadcast): check the request, place the chunks, launch the step.
#include "scheduler_impl.hpp"

#include <stealbatch/error.hpp>

#include <algorithm>
#include <string>

namespace stealbatch {

StepStats Scheduler::run(std::span<const ChunkRange> placement, ChunkFn fn, const std::function<void()>& meanwhile, const ChunkMerge* merge) {
  detail::check_range("placement.size()", placement.size(), m_workers.size(), m_workers.size());
  std::uint64_t total = 0;
  for (const ChunkRange& r : placement) {
    if (r.end < r.begin) throw ConfigError("scheduler: a placement range has end < begin");
    total += r.size();
  }
  place_all(total, [&](std::size_t w) {
    // Pushed high to low, so the owner pops ascending and thieves take the high end.
    m_scratch.resize(placement[w].size());
    for (std::size_t i = 0; i < m_scratch.size(); ++i) m_scratch[i] = static_cast<ChunkId>(placement[w].end - 1 - i);
  });
  // Published to the workers by the release bump in launch(), like the rest of the step state; cleared however
  // the step ends, so no later step sees it.
  struct Clear {
    const ChunkMerge*& p;
    ~Clear() { p = nullptr; }
  } clear{m_merge};
  m_merge = m_options.steal == StealPolicy::kHalf ? merge : nullptr;
  return launch(total, fn, meanwhile);
}

StepStats Scheduler::run(std::span<const std::vector<ChunkId>> placement, ChunkFn fn) {
  detail::check_range("placement.size()", placement.size(), m_workers.size(), m_workers.size());
  std::uint64_t total = 0;
  for (const auto& list : placement) total += list.size();
  place_all(total, [&](std::size_t w) { m_scratch.assign(placement[w].rbegin(), placement[w].rend()); });
  return launch(total, fn);
}

StepStats Scheduler::run_sourced(ChunkSource source, ChunkFn fn, const std::function<std::uint64_t()>& pending) {
  if (m_central) throw ConfigError("scheduler: run_sourced() needs the steal or static policy, not central");
  for (auto& w : m_workers) {
    w->deque.reclaim();  // quiescent, as in place_scratch()
    if (w->sourced.size() != kMaxSourced) w->sourced.resize(kMaxSourced);
  }
  // Published to the workers by the release bump in launch(), like the rest of the step state.
  m_source = &source;
  m_sourced.store(0, std::memory_order_relaxed);
  m_refilling.store(false, std::memory_order_relaxed);
  m_source_open.store(true, std::memory_order_relaxed);
  m_pending = pending ? &pending : nullptr;
  m_weighted = false;  // a sourced step's ids are not known before it, and its pending count is in chunks
  struct Reset {
    const ChunkSource*& p;
    const std::function<std::uint64_t()>*& q;
    ~Reset() { p = nullptr, q = nullptr; }
  } reset{m_source, m_pending};
  return launch(1, fn);  // one count: the source's token
}

StepStats Scheduler::broadcast(WorkerFn fn) {
  // Published to the workers by the release bump in launch(), like the rest of the step state.
  m_broadcast = &fn;
  m_weighted = false;
  struct Reset {
    const WorkerFn*& p;
    ~Reset() { p = nullptr; }
  } reset{m_broadcast};
  // One "chunk" per worker keeps launch()'s exactly-once accounting; no deque is touched.
  return launch(m_workers.size(), [](std::size_t, ChunkId) {});
}

template <class Fill>
void Scheduler::place_all(std::uint64_t total, Fill&& fill) {
  m_weighted = !m_weight_units.empty() && m_options.schedule == SchedulePolicy::kSteal;
  m_placed_units = 0;
  m_own_full_units.assign(m_workers.size(), 0);
  // The placed chunks' weight, summed as each worker's list is filled (before anything is pushed, for the central
  // queue too, so a bad id leaves nothing behind either way).
  auto weigh = [&](std::size_t w) {
    if (!m_weighted) return;
    for (ChunkId c : m_scratch) {
      if (c >= m_weight_units.size()) {
        throw ConfigError("scheduler: chunk weights: chunk id " + std::to_string(c) + " placed; valid range is [0, " +
                          std::to_string(m_weight_units.size()) + ") (set_chunk_weights() for this step's chunks, or {})");
      }
      m_placed_units += m_weight_units[c];
      m_own_full_units[w] = std::max(m_own_full_units[w], m_weight_units[c]);
    }
  };
  try {
    if (m_central) {
      // One shared queue, in placement order. reserve() allocates the nodes now (it is not thread-safe, and the
      // workers are parked), so the pushes below never allocate.
      if (total > m_central->reserved) {
        m_central->queue.reserve(static_cast<std::size_t>(total) - m_central->reserved);
        m_central->reserved = static_cast<std::size_t>(total);
      }
      for (std::size_t w = 0; w < m_workers.size(); ++w) {
        fill(w);
        weigh(w);
        for (auto it = m_scratch.rbegin(); it != m_scratch.rend(); ++it) {
          if (!m_central->queue.bounded_push(*it)) m_central->queue.push(*it);  // out of nodes: allocate one
        }
      }
      return;
    }
    for (std::size_t w = 0; w < m_workers.size(); ++w) {
      fill(w);
      weigh(w);
      place_scratch(w, total);
    }
  } catch (...) {
    discard_all();  // an allocation failed part-way: leave no chunk of this step behind for the next one
    throw;
  }
}

void Scheduler::place_scratch(std::size_t w, std::uint64_t total) {
  ChunkDeque& q = m_workers[w]->deque;
  q.reclaim();        // quiescent: no worker is inside a steal between steps
  q.reserve(total);   // no deque can hold more than the step, so no steal grows one (growth allocates, may throw)
  q.push_bulk(m_scratch);
}

void Scheduler::discard_all() noexcept {
  for (auto& w : m_workers) {
    while (w->deque.pop()) {
    }
  }
  if (m_central) {
    ChunkId c = 0;
    while (m_central->queue.pop(c)) {
    }
  }
}

}  // namespace stealbatch

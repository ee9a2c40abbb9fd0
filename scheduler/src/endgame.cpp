// The end game: EndGameRule, which keeps a slow worker from ending a step late, and the Scheduler pricing takes by it.
#include "scheduler_impl.hpp"

#include <stealbatch/error.hpp>
#include <stealbatch/scheduler/endgame.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

namespace stealbatch {

void EndGameRule::set_costs(std::size_t workers, std::vector<double> own, std::vector<double> stolen) {
  if (own.empty() != stolen.empty()) throw ConfigError("scheduler: chunk costs: give both lists or neither");
  for (const std::vector<double>* list : {&own, &stolen}) {
    if (list->empty()) continue;
    if (list->size() != workers) {
      throw ConfigError("scheduler: chunk costs size = " + std::to_string(list->size()) + "; valid range is [" + std::to_string(workers) + ", " +
                        std::to_string(workers) + "]");
    }
    for (std::size_t w = 0; w < list->size(); ++w) {
      if (!std::isfinite((*list)[w]) || !((*list)[w] > 0)) {
        throw ConfigError("scheduler: chunk cost of worker " + std::to_string(w) + " = " + std::to_string((*list)[w]) + "; need a finite value > 0");
      }
    }
  }
  for (std::size_t w = 0; w < own.size(); ++w) {
    // The guarantee that the fastest workers always take (so the step ends) is stated on the stolen costs.
    if (own[w] > stolen[w]) {
      throw ConfigError("scheduler: chunk cost of worker " + std::to_string(w) + ": own " + std::to_string(own[w]) + " > stolen " +
                        std::to_string(stolen[w]) + "; need own <= stolen");
    }
  }
  m_own = std::move(own);
  m_stolen = std::move(stolen);
  m_rate_sum = 0;
  m_min = m_stolen.empty() ? 0 : *std::min_element(m_stolen.begin(), m_stolen.end());
  for (double c : m_stolen) m_rate_sum += 1.0 / c;
}

std::uint32_t EndGameRule::fastest_count() const noexcept {
  std::uint32_t n = 0;
  for (std::size_t w = 0; w < m_stolen.size(); ++w) n += fastest(w);
  return n;
}

bool EndGameRule::worth(std::size_t w, double cost, double left, double outside) const noexcept {
  const double others = others_rate(w) + (std::isfinite(outside) && outside > 0 ? outside : 0.0);
  return others <= 0 || cost <= left / others;
}

std::size_t EndGameRule::steal_cap(std::size_t w, std::size_t cap, double left) const noexcept {
  if (!active() || fastest(w)) return cap;
  // A batch lands in the thief's deque and is then run at its own-chunk cost: cap it at what the rule would still
  // let this worker take, so a slow worker cannot carry a long tail out of a fast one's deque.
  const double others = others_rate(w);
  const double take = others > 0 ? left / others / m_stolen[w] : static_cast<double>(cap);
  return std::clamp<std::size_t>(static_cast<std::size_t>(take), 1, cap);
}

void Scheduler::set_chunk_costs(std::vector<double> costs) {
  std::vector<double> copy = costs;
  set_chunk_costs(std::move(costs), std::move(copy));
}

void Scheduler::set_chunk_costs(std::vector<double> own, std::vector<double> stolen) {
  m_endgame.set_costs(m_workers.size(), std::move(own), std::move(stolen));
}

void Scheduler::set_outside_rate(double chunks_per_unit) noexcept {
  m_outside_rate = std::isfinite(chunks_per_unit) && chunks_per_unit > 0 ? chunks_per_unit : 0.0;
}

void Scheduler::set_chunk_weights(std::vector<double> weights) {
  std::vector<std::uint64_t> units(weights.size());
  for (std::size_t c = 0; c < weights.size(); ++c) {
    // Below 2^40 full chunks, so a step's sum of weights cannot overflow 64 bits.
    if (!std::isfinite(weights[c]) || !(weights[c] > 0) || weights[c] > 0x1p40) {
      throw ConfigError("scheduler: chunk weight of chunk " + std::to_string(c) + " = " + std::to_string(weights[c]) +
                        "; need a finite value in (0, 2^40]");
    }
    units[c] = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::llround(weights[c] * kWeightUnit)));
  }
  m_weight_units = std::move(units);
}

void Scheduler::set_live_factor(std::size_t w, double factor, double ahead) noexcept {
  m_workers[w]->live_factor = std::isfinite(factor) && factor > 1.0 ? factor : 1.0;
  m_workers[w]->live_ahead = std::isfinite(ahead) && ahead > 0.0 ? ahead : 0.0;
}

double Scheduler::left_now() const noexcept {
  // Relaxed: an estimate (see worth_by_rule()).
  if (m_weighted) return static_cast<double>(m_left_units.load(std::memory_order_relaxed)) / kWeightUnit;
  return static_cast<double>(m_remaining.load(std::memory_order_relaxed));
}

bool Scheduler::worth_taking(std::size_t w, Source from) noexcept {
  // A sourced step without a count of what its source still holds has no end game: the source decides.
  if (!m_endgame.active() || m_options.schedule != SchedulePolicy::kSteal || (m_source != nullptr && m_pending == nullptr)) return true;
  Worker& me = *m_workers[w];
  // One of the fastest as placed. These always take, so the step always ends; one that has slowed down in this
  // step (its live factor) may leave the rest to the others like any slow worker, but only while another fastest
  // worker still takes: m_takers counts those, and the last one never leaves. Once left, it stays out this step.
  // One that has not slowed down takes either way, so it needs no cost and no count of what is left: the worker
  // loop's common case stops here.
  const bool fastest = m_endgame.fastest(w);
  if ((fastest || (m_own_always && from == Source::kOwn)) && me.live_factor <= 1.0) return !me.left_takers;
  const bool worth = worth_by_rule(me, from);
  if (!fastest) return worth;
  if (worth) return !me.left_takers;
  return !leave_takers(me);
}

double Scheduler::cost_now(const Worker& me, Source from) const noexcept {
  const std::size_t w = me.index;
  double placed = from == Source::kOwn ? m_endgame.own_cost(w) : m_endgame.stolen_cost(w);
  // Weighted, the next own chunk costs the own cost (the worker's largest placed chunk) in proportion to its weight.
  if (from == Source::kOwn && m_weighted && m_own_full_units[w] > 0) {
    if (const auto next = me.deque.peek()) placed *= static_cast<double>(m_weight_units[*next]) / static_cast<double>(m_own_full_units[w]);
  }
  return placed * me.live_factor + me.live_ahead;
}

bool Scheduler::worth_by_rule(const Worker& me, Source from) const noexcept {
  const double cost = cost_now(me, from);
  // Relaxed: an estimate; the chunks still running elsewhere are counted as left (a weighted step counts them at
  // half their weight: on average, half done), which only makes this take more. A weighted step counts what is left
  // by weight (set_chunk_weights()). A sourced step's count holds a token while its source is open (relaxed: the same
  // estimate); what the source still holds is added only when what is given does not already make the chunk worth
  // taking: more left never makes it less so, and the count may cost remote reads (the ranks' share words), which
  // the common case then skips. What the source holds, others outside this scheduler may take too
  // (set_outside_rate()): that check counts their rate.
  double left = left_now();
  if (m_source != nullptr) left -= m_source_open.load(std::memory_order_relaxed) ? 1.0 : 0.0;
  if (m_endgame.worth(me.index, cost, left)) return true;
  if (m_source == nullptr) return false;
  return m_endgame.worth(me.index, cost, left + static_cast<double>((*m_pending)()), m_outside_rate);
}

bool Scheduler::leave_takers(Worker& me) noexcept {
  if (me.left_takers) return true;
  // Relaxed: the count guards no data; the RMW alone keeps it from dropping below 1.
  std::uint32_t k = m_takers.load(std::memory_order_relaxed);
  while (k >= 2) {
    if (m_takers.compare_exchange_weak(k, k - 1, std::memory_order_relaxed)) return me.left_takers = true;
  }
  return false;
}

std::size_t Scheduler::steal_cap(std::size_t w) const noexcept {
  if (m_options.steal == StealPolicy::kOne) return 1;
  return m_endgame.steal_cap(w, m_options.steal_batch_cap, left_now());
}

}  // namespace stealbatch

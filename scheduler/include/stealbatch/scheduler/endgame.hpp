// The end game on unequal workers: when a worker leaves a step's last chunks to faster ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stealbatch {

// The rule, stated once: with R chunks of the step left (full chunks' worth, where the scheduler weighs them), worker
// w takes one more only while its cost for that chunk is at most R / (the sum of the other workers' chunk rates): the
// time the others would need to finish everything left. A worker whose chunks cost at most kFastestWithin times the
// cheapest is one of the fastest, and always takes, so the step always ends. Costs are per worker and per chunk, in
// any unit: one for a chunk from its own deque (placement may size a worker's chunks to its speed), one for a stolen
// chunk (at most a full chunk), on which the rates are stated. A worker's batch steal is capped at the chunks the
// rule would still let it take.
//
//   EndGameRule e;
//   e.set_costs({6.6, 6.6, 1, 1}, {6.6, 6.6, 1, 1});
//   if (!e.worth(w, e.own_cost(w), remaining)) leave_the_rest_to_the_others();
class EndGameRule {
 public:
  // Within this factor of the cheapest cost a worker counts as one of the fastest: the rule must let some workers
  // always take, and equal devices measure a little apart by noise (a CPU device's window: 7-28% between steps).
  static constexpr double kFastestWithin = 1.5;

  // Sets both lists (one cost per worker, finite and > 0, own <= stolen), or clears the rule with two empty ones.
  // Throws ConfigError naming the worker and the value.
  void set_costs(std::size_t workers, std::vector<double> own, std::vector<double> stolen);
  bool active() const noexcept { return !m_stolen.empty(); }
  double own_cost(std::size_t w) const noexcept { return m_own[w]; }
  double stolen_cost(std::size_t w) const noexcept { return m_stolen[w]; }
  bool fastest(std::size_t w) const noexcept { return active() && m_stolen[w] <= kFastestWithin * m_min; }
  std::uint32_t fastest_count() const noexcept;
  // Whether a chunk costing `cost` (the worker's cost for it now) is worth worker w's taking with `left` chunks left.
  // `outside` adds the chunk rate (chunks per cost unit) of workers outside this rule that also take from what
  // `left` counts: the devices of other ranks, which steal from this rank's share once their own is done.
  bool worth(std::size_t w, double cost, double left, double outside = 0) const noexcept;
  // The most chunks a batch steal may give worker w with `left` left: `cap` for the fastest, else what the rule
  // would still let it take (at least 1).
  std::size_t steal_cap(std::size_t w, std::size_t cap, double left) const noexcept;

 private:
  double others_rate(std::size_t w) const noexcept { return m_rate_sum - 1.0 / m_stolen[w]; }
  std::vector<double> m_own, m_stolen;
  double m_rate_sum = 0;  // the sum of 1 / stolen cost
  double m_min = 0;       // the cheapest stolen cost
};

}  // namespace stealbatch

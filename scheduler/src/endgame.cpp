// EndGameRule: the costs' checks, and the rule that keeps a slow worker from finishing a step late.
#include <stealbatch/error.hpp>
#include <stealbatch/scheduler/endgame.hpp>

#include <algorithm>
#include <cmath>
#include <string>

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

}  // namespace stealbatch

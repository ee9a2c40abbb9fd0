// The step's sample costs (given_costs.hpp).
#include "cost/given_costs.hpp"

#include <stealbatch/error.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace stealbatch {

namespace detail {

std::vector<std::uint32_t> pack_by_cost(std::span<const double> cost, std::size_t bins) {
  std::vector<std::uint32_t> by_cost(cost.size());
  std::iota(by_cost.begin(), by_cost.end(), 0u);
  // Largest first; equal costs in position order, so a packing depends on the costs alone.
  std::stable_sort(by_cost.begin(), by_cost.end(), [&](std::uint32_t a, std::uint32_t b) { return cost[a] > cost[b]; });
  std::vector<double> load(bins, 0.0);
  std::vector<std::uint32_t> bin(cost.size(), 0);
  for (std::uint32_t x : by_cost) {
    const auto least = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    bin[x] = static_cast<std::uint32_t>(least);
    load[least] += cost[x];
  }
  return bin;
}

}  // namespace detail

std::span<const std::uint32_t> GivenCosts::take(std::span<const std::uint32_t> samples, std::span<const double> cost, std::size_t pack_for) {
  norm.clear(), order.clear(), packed_len.clear();
  mean = 0;
  if (cost.empty()) {
    if (pack_for > 0) throw ConfigError("placement = packed needs each sample's cost with every step (step(samples, fn, cost))");
    return samples;
  }
  if (cost.size() != samples.size()) {
    throw ConfigError("cost has " + std::to_string(cost.size()) + " values for a batch of " + std::to_string(samples.size()) + "; give one per sample");
  }
  double total = 0;
  for (std::size_t i = 0; i < cost.size(); ++i) {
    if (!std::isfinite(cost[i]) || !(cost[i] > 0)) {
      throw ConfigError("cost[" + std::to_string(i) + "] = " + std::to_string(cost[i]) + " (sample " + std::to_string(samples[i]) +
                        "); a sample's cost must be finite and > 0");
    }
    total += cost[i];
  }
  if (!std::isfinite(total)) throw ConfigError("the batch's costs sum to infinity; give them in smaller units");
  mean = total / static_cast<double>(cost.size());
  norm.resize(cost.size());
  if (pack_for == 0) {
    for (std::size_t i = 0; i < cost.size(); ++i) norm[i] = cost[i] / mean;
    return samples;
  }
  // Packed: each device's samples together, in batch order within a device.
  const std::vector<std::uint32_t> bin = detail::pack_by_cost(cost, pack_for);
  packed_len.assign(pack_for, 0);
  for (std::uint32_t b : bin) ++packed_len[b];
  std::vector<std::uint32_t> at(pack_for, 0);
  for (std::size_t d = 1; d < pack_for; ++d) at[d] = at[d - 1] + packed_len[d - 1];
  order.resize(samples.size());
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const std::uint32_t to = at[bin[i]]++;
    order[to] = samples[i];
    norm[to] = cost[i] / mean;
  }
  return order;
}

}  // namespace stealbatch

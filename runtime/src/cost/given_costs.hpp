// The step's sample costs as the trainer gave them (Runtime::step's `cost`: tokens, or any positive number per batch
// position), in the units the step's plan works in: each position's cost over the batch's mean, so that a chunk of
// chunk_size holds chunk_size samples of mean cost. With PlacementPolicy::kPacked, the batch reordered too: each
// device's samples together, packed greedily by cost (detail::pack_by_cost()). Empty when the step has no costs: the step then runs
// as without them. Invariant: norm is empty or has one finite positive entry per position of the order the step
// runs (`order` when packed, the trainer's batch otherwise), with mean 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace stealbatch {

struct GivenCosts {
  std::vector<double> norm;              // each position's cost over `mean`
  double mean = 0;                       // the batch's mean cost, in the trainer's units
  std::vector<std::uint32_t> order;      // packed: the batch's sample ids, device after device
  std::vector<std::uint32_t> packed_len; // packed: each device's sample count in `order`

  bool given() const noexcept { return !norm.empty(); }
  bool packed() const noexcept { return !packed_len.empty(); }
  // Takes a step's costs (empty: none): throws ConfigError naming the position of a cost that is not finite and
  // positive, or a count that differs from the batch's. `pack_for` > 0: packs the batch for that many devices
  // (costs required). Returns the samples in the order the step runs them.
  std::span<const std::uint32_t> take(std::span<const std::uint32_t> samples, std::span<const double> cost, std::size_t pack_for);
  // The cost of positions [begin, begin + size) of the order the step runs, in the trainer's units.
  double trainer_cost(std::uint32_t begin, std::uint32_t size) const noexcept {
    double c = 0;
    for (std::uint32_t x = begin; x < begin + size; ++x) c += norm[x];
    return c * mean;
  }
};

namespace detail {
// Greedy bin packing of costs onto `bins` equal bins, largest cost first, each to the bin with the least cost so far
// (longest processing time first: within 4/3 of the best makespan). Returns each position's bin.
std::vector<std::uint32_t> pack_by_cost(std::span<const double> cost, std::size_t bins);
}  // namespace detail

}  // namespace stealbatch

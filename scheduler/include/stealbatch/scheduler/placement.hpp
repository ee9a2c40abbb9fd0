// Where each chunk of a step starts: contiguous ranges per worker, equal or in proportion to weights.
#pragma once

#include <stealbatch/scheduler/chunk_deque.hpp>

#include <cstddef>
#include <span>
#include <vector>

namespace stealbatch {

// The chunks [begin, end) of one worker.
struct ChunkRange {
  ChunkId begin = 0;
  ChunkId end = 0;
  std::size_t size() const noexcept { return end - begin; }
  friend bool operator==(const ChunkRange&, const ChunkRange&) = default;
};

// Splits `chunks` into `workers` contiguous ranges whose sizes differ by at most one; the larger ones come first.
// Throws ConfigError when workers is 0.
//
//   auto ranges = place_equal(10, 4);   // [0,3) [3,6) [6,8) [8,10)
std::vector<ChunkRange> place_equal(std::size_t chunks, std::size_t workers);

// Splits `chunks` into contiguous ranges in proportion to `weights` (for instance measured samples/s), rounding
// by largest remainder: every range gets the floor of its quota, and the chunks left over go one each to the
// largest fractional parts (ties to the lower index). Throws ConfigError for an empty list, or a negative,
// non-finite or all-zero weight.
//
//   auto ranges = place_proportional(10, std::vector<double>{3, 1});   // [0,8) [8,10)
std::vector<ChunkRange> place_proportional(std::size_t chunks, std::span<const double> weights);

}  // namespace stealbatch

// Equal and proportional placement with largest-remainder rounding.
#include <stealbatch/error.hpp>
#include <stealbatch/scheduler/placement.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

namespace stealbatch {

namespace {

void check_chunk_count(std::size_t chunks) {
  if (chunks > std::numeric_limits<ChunkId>::max()) {
    throw ConfigError("placement: chunks = " + std::to_string(chunks) + " exceeds the ChunkId range (at most " +
                      std::to_string(std::numeric_limits<ChunkId>::max()) + ")");
  }
}

}  // namespace

std::vector<ChunkRange> place_equal(std::size_t chunks, std::size_t workers) {
  if (workers == 0) throw ConfigError("placement: workers = 0; need at least 1");
  check_chunk_count(chunks);
  std::vector<ChunkRange> out(workers);
  const std::size_t base = chunks / workers, extra = chunks % workers;
  std::size_t at = 0;
  for (std::size_t w = 0; w < workers; ++w) {
    const std::size_t n = base + (w < extra ? 1 : 0);
    out[w] = {static_cast<ChunkId>(at), static_cast<ChunkId>(at + n)};
    at += n;
  }
  return out;
}

std::vector<ChunkRange> place_proportional(std::size_t chunks, std::span<const double> weights) {
  if (weights.empty()) throw ConfigError("placement: weights is empty; need one weight per worker");
  check_chunk_count(chunks);
  double sum = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    if (!std::isfinite(weights[i]) || weights[i] < 0) {
      throw ConfigError("placement: weights[" + std::to_string(i) + "] = " + std::to_string(weights[i]) +
                        "; need a finite value >= 0");
    }
    sum += weights[i];
  }
  if (!(sum > 0)) throw ConfigError("placement: every weight is 0; need at least one weight > 0");

  const std::size_t n = weights.size();
  std::vector<std::size_t> count(n);
  std::vector<double> frac(n);
  std::size_t given = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double quota = static_cast<double>(chunks) * (weights[i] / sum);
    count[i] = std::min(chunks, static_cast<std::size_t>(std::floor(quota)));
    frac[i] = quota - std::floor(quota);
    given += count[i];
  }
  // Largest remainder: the chunks the floors left over go one each to the largest fractional parts. In exact
  // arithmetic the leftover is below the number of positive weights; the modulo only guards rounding.
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return frac[a] > frac[b]; });
  for (std::size_t k = 0; given < chunks; k = (k + 1) % n) {
    if (weights[order[k]] > 0) ++count[order[k]], ++given;
  }
  // Rounding can also push the floors one over; take the excess back from the smallest remainders.
  for (std::size_t k = n - 1; given > chunks; k = (k == 0 ? n - 1 : k - 1)) {
    if (count[order[k]] > 0) --count[order[k]], --given;
  }

  std::vector<ChunkRange> out(n);
  std::size_t at = 0;
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = {static_cast<ChunkId>(at), static_cast<ChunkId>(at + count[i])};
    at += count[i];
  }
  return out;
}

}  // namespace stealbatch

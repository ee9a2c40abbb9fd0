// Placement: equal and proportional splits into contiguous ranges, largest-remainder rounding, bad weights.
#include <stealbatch/error.hpp>
#include <stealbatch/scheduler/placement.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

using namespace stealbatch;

namespace {

void check_contiguous_cover(const std::vector<ChunkRange>& r, std::size_t chunks) {
  REQUIRE_FALSE(r.empty());
  CHECK(r.front().begin == 0u);
  for (std::size_t i = 1; i < r.size(); ++i) CHECK(r[i].begin == r[i - 1].end);
  CHECK(r.back().end == chunks);
}

}  // namespace

TEST_CASE("Placement.EqualMatchesTheDocumentedExample") {
  const auto r = place_equal(10, 4);
  CHECK(r == std::vector<ChunkRange>{{0, 3}, {3, 6}, {6, 8}, {8, 10}});
}

TEST_CASE("Placement.EqualSizesDifferByAtMostOne") {
  for (std::size_t workers = 1; workers <= 9; ++workers) {
    for (std::size_t chunks = 0; chunks <= 50; ++chunks) {
      const auto r = place_equal(chunks, workers);
      REQUIRE(r.size() == workers);
      check_contiguous_cover(r, chunks);
      std::size_t lo = chunks, hi = 0;
      for (const auto& x : r) lo = std::min(lo, x.size()), hi = std::max(hi, x.size());
      CHECK(hi - lo <= 1);
    }
  }
}

TEST_CASE("Placement.ProportionalMatchesTheDocumentedExample") {
  CHECK(place_proportional(10, std::vector<double>{3, 1}) == std::vector<ChunkRange>{{0, 8}, {8, 10}});
}

TEST_CASE("Placement.ProportionalIsLargestRemainder") {
  // Quotas 6.6 / 2.2 / 1.2 for 10 chunks: floors 6, 2, 1 and the one left over goes to the largest fraction (0.6).
  CHECK(place_proportional(10, std::vector<double>{6.6, 2.2, 1.2}) ==
        std::vector<ChunkRange>{{0, 7}, {7, 9}, {9, 10}});
  // Ties go to the lower index.
  CHECK(place_proportional(3, std::vector<double>{1, 1}) == std::vector<ChunkRange>{{0, 2}, {2, 3}});
  // A zero weight gets nothing.
  CHECK(place_proportional(7, std::vector<double>{0, 1, 0}) == std::vector<ChunkRange>{{0, 0}, {0, 7}, {7, 7}});

  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::size_t n = 1 + rng() % 16, chunks = rng() % 500;
    std::vector<double> w(n);
    double sum = 0;
    for (auto& x : w) sum += (x = (rng() % 4 == 0) ? 0.0 : std::ldexp(static_cast<double>(rng() % 1000 + 1), -5));
    if (sum == 0) w[0] = sum = 1;
    const auto r = place_proportional(chunks, w);
    check_contiguous_cover(r, chunks);
    for (std::size_t i = 0; i < n; ++i) {
      const double quota = static_cast<double>(chunks) * w[i] / sum;
      CHECK(std::abs(static_cast<double>(r[i].size()) - quota) < 1.0);  // floor or ceil of its quota
    }
  }
}

TEST_CASE("Placement.BadInputNamesTheProblem") {
  CHECK_THROWS_WITH_AS(place_equal(5, 0), "placement: workers = 0; need at least 1", ConfigError);
  CHECK_THROWS_WITH_AS(place_proportional(5, std::vector<double>{}), "placement: weights is empty; need one weight per worker",
                       ConfigError);
  CHECK_THROWS_WITH_AS(place_proportional(5, std::vector<double>{1, -2}),
                       "placement: weights[1] = -2.000000; need a finite value >= 0", ConfigError);
  CHECK_THROWS_AS(place_proportional(5, std::vector<double>{std::numeric_limits<double>::quiet_NaN()}), ConfigError);
  CHECK_THROWS_WITH_AS(place_proportional(5, std::vector<double>{0, 0}),
                       "placement: every weight is 0; need at least one weight > 0", ConfigError);
}

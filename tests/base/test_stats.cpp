// The median and percentiles: which element each picks, on copies and in place.
#include <stealbatch/stats.hpp>

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <span>
#include <vector>

using namespace stealbatch;

TEST_CASE("Stats.MedianIsTheUpperMiddleElement") {
  CHECK(median({}) == 0);
  CHECK(median({7}) == 7);
  CHECK(median({3, 1}) == 3);
  CHECK(median({5, 1, 3}) == 3);
  CHECK(median({4, 1, 3, 2}) == 3);
  CHECK(median({6, 5, 4, 3, 2, 1}) == 4);
}

TEST_CASE("Stats.PercentileTakesIndexFloorOfPTimesCount") {
  std::vector<double> v(200);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(v.size() - i);  // 200 down to 1
  CHECK(percentile(v, 0.99) == 199);  // sorted index 198
  CHECK(percentile(v, 0.5) == median(v));
  CHECK(percentile(v, 0.1) == 21);
  CHECK(percentile(v, 0.0) == 1);
  CHECK(percentile(v, 1.0) == 200);
  CHECK(percentile(v, 7.0) == 200);
  CHECK(percentile(v, -1.0) == 1);
  CHECK(percentile(v, std::nan("")) == 1);
  CHECK(percentile({}, 0.99) == 0);
  CHECK(v.front() == 200);  // the copy was reordered, not the caller's values
}

TEST_CASE("Stats.InPlaceOnAPartOfAWindow") {
  std::array<double, 8> window{9, 1, 8, 2, 0, 0, 0, 0};
  CHECK(median_in_place(std::span(window.data(), 4)) == 8);
  CHECK(percentile_in_place(std::span(window.data(), 4), 0.25) == 2);
  CHECK(window[4] == 0);  // past the part: untouched
}

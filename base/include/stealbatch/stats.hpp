// The median and the percentiles that every reported figure, and the runtime's speed estimates, are taken with.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace stealbatch {

// The p-quantile of `values`, p in [0, 1]: the element at index floor(p * n) of the sorted values (the largest for
// p = 1, 0 for no values). Reorders `values` (std::nth_element) and allocates nothing:
//   std::array<double, 8> window = ...;  const double p90 = percentile_in_place(std::span(window.data(), filled), 0.9);
inline double percentile_in_place(std::span<double> values, double p) noexcept {
  if (values.empty()) return 0;
  const double q = p > 0 ? std::min(p, 1.0) : 0.0;  // a NaN too: 0
  const std::size_t k = std::min(values.size() - 1, static_cast<std::size_t>(q * static_cast<double>(values.size())));
  const auto kth = values.begin() + static_cast<std::ptrdiff_t>(k);
  std::nth_element(values.begin(), kth, values.end());
  return *kth;
}

// The median as percentile_in_place(values, 0.5) takes it: the upper middle element for an even count.
inline double median_in_place(std::span<double> values) noexcept { return percentile_in_place(values, 0.5); }

// The same on a copy:
//   const double step_ms = median(step_seconds) * 1e3;  const double p99 = percentile(latencies_us, 0.99);
inline double percentile(std::vector<double> values, double p) { return percentile_in_place(values, p); }
inline double median(std::vector<double> values) { return median_in_place(values); }

}  // namespace stealbatch

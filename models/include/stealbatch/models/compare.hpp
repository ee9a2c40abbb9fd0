// How far a result is from a reference: the measure every gradient check of the tests and perf tools uses.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>

namespace stealbatch::examples {

// max |a - b| / max |b|: how far a gradient is from a reference, relative to the reference's scale. +infinity when
// the two differ in size or when any element on either side is not finite: a NaN or an infinity must fail every
// gate that compares with `<=` (std::max(x, NaN) is x, which would score an all-NaN gradient 0).
inline double max_relative_error(std::span<const float> a, std::span<const float> b) {
  constexpr double kWorst = std::numeric_limits<double>::infinity();
  if (a.size() != b.size()) return kWorst;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i];
    if (!std::isfinite(x) || !std::isfinite(y)) return kWorst;
    num = std::max(num, std::abs(x - y));
    den = std::max(den, std::abs(y));
  }
  return den > 0 ? num / den : num;
}

}  // namespace stealbatch::examples

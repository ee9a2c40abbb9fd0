// Helpers shared by the tests: sanitizer-aware sizes and the exactly-once check.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

namespace stealbatch::test {

#ifdef STEALBATCH_SANITIZED
inline constexpr std::size_t kScale = 4;   // sanitizer builds run smaller sizes, never weaker assertions
#else
inline constexpr std::size_t kScale = 1;
#endif

inline std::size_t scaled(std::size_t n) { return std::max<std::size_t>(n / kScale, 1); }

// True when the items taken (in any order, from any threads) are exactly 0..n-1, each once.
template <class T>
bool exactly_once(std::vector<std::vector<T>> taken, std::size_t n) {
  std::vector<T> all;
  for (auto& v : taken) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  if (all.size() != n) return false;
  for (std::size_t i = 0; i < n; ++i) {
    if (all[i] != static_cast<T>(i)) return false;
  }
  return true;
}

}  // namespace stealbatch::test

// The median every perf tool reports: the upper middle of the sorted values (0 for none).
#pragma once

#include <algorithm>
#include <vector>

namespace stealbatch::perf {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace stealbatch::perf

// What the model-level tests share: a synthetic data set, the error measure, and the sequential reference gradient.
#pragma once

#include "layers.hpp"
#include "mlp_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace stealbatch::testing {

using examples::DenseData;
using examples::MlpModel;

// A small random classification set: dense features in [-1, 1], labels in [0, classes).
struct Synthetic {
  // lo, hi: the feature range
  std::vector<float> x;
  std::vector<std::uint8_t> y;
  DenseData data;
  Synthetic(std::size_t count, std::size_t features, std::size_t classes, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    x.resize(count * features);
    for (float& v : x) v = u(rng);
    y.resize(count);
    for (auto& v : y) v = static_cast<std::uint8_t>(rng() % classes);
    data = {count, features, x, y};
  }
};

// max |a - b| / max |b| (examples/common/layers.hpp).
inline double relative_error(std::span<const float> a, std::span<const float> b) { return examples::max_relative_error(a, b); }

// One model's gradient of the samples in one call, divided by their count: what the runtime's reduction must give.
// Any model with MlpModel's interface (MlpModel, CnnModel).
template <class Model>
std::vector<float> sequential_mean_gradient(const Model& m, std::span<const float> params, const DenseData& d,
                                            std::span<const std::uint32_t> samples) {
  std::vector<float> g(m.layout().size(), 0.0f);
  typename Model::Workspace ws;
  m.accumulate_gradient(params, g, d, samples, ws);
  for (float& v : g) v /= static_cast<float>(samples.size());
  return g;
}

}  // namespace stealbatch::testing

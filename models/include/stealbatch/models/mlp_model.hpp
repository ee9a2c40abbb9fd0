// A multilayer perceptron with ReLU and softmax cross-entropy, on oneDNN GEMMs: the model the MLP example trains.
#pragma once

#include <stealbatch/models/dense_data.hpp>
#include <stealbatch/models/layers.hpp>

#include <stealbatch/runtime/parameters.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace stealbatch::examples {

// sizes = {inputs, hidden..., classes}; {784, 10} is a linear softmax classifier.
//
//   MlpModel model({784, 256, 128, 10});
//   MlpModel::Workspace ws;
//   double loss = model.accumulate_gradient(params, grad, data, samples, ws);   // grad += sum over samples
class MlpModel {
 public:
  // The per-device scratch: activations and deltas for one chunk, grown on demand and reused.
  struct Workspace {
    std::vector<std::vector<float>> act;    // act[0] is the input batch, act[L] the logits
    std::vector<std::vector<float>> delta;
  };

  explicit MlpModel(std::vector<std::size_t> sizes);  // throws ConfigError for fewer than 2 sizes or a 0

  const ParameterLayout& layout() const noexcept { return m_layout; }
  const std::vector<std::size_t>& sizes() const noexcept { return m_sizes; }
  // He-uniform weights, zero biases, from a fixed seed.
  std::vector<float> initial_parameters(std::uint64_t seed) const;

  // Adds the summed (not averaged) cross-entropy gradient of the samples to grad; returns the summed loss.
  double accumulate_gradient(std::span<const float> params, std::span<float> grad, const DenseData& data,
                             std::span<const std::uint32_t> samples, Workspace& ws) const;
  // The fraction of data classified correctly.
  double accuracy(std::span<const float> params, const DenseData& data, Workspace& ws) const;

 private:
  void forward(std::span<const float> params, const DenseData& data, std::span<const std::uint32_t> samples, Workspace& ws) const;

  std::vector<std::size_t> m_sizes;
  ParameterLayout m_layout;
  std::vector<std::size_t> m_weight, m_bias;  // tensor indices per layer
};

}  // namespace stealbatch::examples

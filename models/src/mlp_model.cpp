// The MLP's forward and backward passes: one GEMM per layer and direction, accumulating into the gradient.
#include <stealbatch/models/mlp_model.hpp>

#include <stealbatch/error.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

namespace stealbatch::examples {

MlpModel::MlpModel(std::vector<std::size_t> sizes) : m_sizes(std::move(sizes)) {
  if (m_sizes.size() < 2) throw ConfigError("mlp: need at least an input and an output size");
  for (std::size_t l = 0; l + 1 < m_sizes.size(); ++l) {
    if (m_sizes[l] == 0 || m_sizes[l + 1] == 0) throw ConfigError("mlp: layer sizes must be at least 1");
    m_weight.push_back(m_layout.add("fc" + std::to_string(l + 1) + ".weight", {m_sizes[l + 1], m_sizes[l]}));
    m_bias.push_back(m_layout.add("fc" + std::to_string(l + 1) + ".bias", m_sizes[l + 1]));
  }
}

std::vector<float> MlpModel::initial_parameters(std::uint64_t seed) const {
  std::vector<float> p(m_layout.size(), 0.0f);
  std::mt19937_64 rng(seed);
  for (std::size_t l = 0; l < m_weight.size(); ++l) {
    const float bound = std::sqrt(6.0f / static_cast<float>(m_sizes[l]));
    std::uniform_real_distribution<float> u(-bound, bound);
    for (float& w : m_layout.view(std::span<float>(p), m_weight[l])) w = u(rng);
  }
  return p;
}

void MlpModel::forward(std::span<const float> params, const DenseData& data, std::span<const std::uint32_t> samples,
                       Workspace& ws) const {
  check_input(data, m_sizes[0], samples, "mlp");
  const std::size_t layers = m_weight.size(), b = samples.size();
  ws.act.resize(layers + 1);
  ws.delta.resize(layers + 1);
  ws.act[0].resize(b * m_sizes[0]);
  for (std::size_t i = 0; i < b; ++i) {
    const float* row = data.x.data() + static_cast<std::size_t>(samples[i]) * data.features;
    std::copy(row, row + data.features, ws.act[0].begin() + static_cast<std::ptrdiff_t>(i * m_sizes[0]));
  }
  for (std::size_t l = 0; l < layers; ++l) {
    dense_forward(ws.act[l], b, m_sizes[l], m_sizes[l + 1], m_layout.view(params, m_weight[l]), m_layout.view(params, m_bias[l]),
                  ws.act[l + 1]);
    if (l + 1 < layers) relu(ws.act[l + 1]);
  }
}

double MlpModel::accumulate_gradient(std::span<const float> params, std::span<float> grad, const DenseData& data,
                                     std::span<const std::uint32_t> samples, Workspace& ws) const {
  forward(params, data, samples, ws);
  const std::size_t layers = m_weight.size(), b = samples.size();
  const double loss = softmax_cross_entropy(ws.act[layers], m_sizes.back(), data, samples, ws.delta[layers]);
  for (std::size_t l = layers; l-- > 0;) {
    // The input layer needs no dx; every other one passes dx back through the ReLU of the layer below.
    dense_backward(ws.act[l], ws.delta[l + 1], b, m_sizes[l], m_sizes[l + 1], m_layout.view(params, m_weight[l]),
                   m_layout.view(grad, m_weight[l]), m_layout.view(grad, m_bias[l]), l == 0 ? nullptr : &ws.delta[l]);
    if (l > 0) relu_backward(ws.act[l], ws.delta[l]);
  }
  return loss;
}

double MlpModel::accuracy(std::span<const float> params, const DenseData& data, Workspace& ws) const {
  return batched_accuracy(data, m_sizes.back(), 512, [&](std::span<const std::uint32_t> samples) {
    forward(params, data, samples, ws);
    return std::span<const float>(ws.act.back());
  });
}

}  // namespace stealbatch::examples

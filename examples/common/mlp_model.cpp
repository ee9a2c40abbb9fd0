// The MLP's forward and backward passes: one GEMM per layer and direction, accumulating into the gradient.
#include "mlp_model.hpp"

#include <stealbatch/error.hpp>

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

namespace stealbatch::examples {

void use_single_threaded_blas() { openblas_set_num_threads(1); }

MlpModel::MlpModel(std::vector<std::size_t> sizes) : m_sizes(std::move(sizes)) {
  if (m_sizes.size() < 2) throw ConfigError("mlp: need at least an input and an output size");
  for (std::size_t l = 0; l + 1 < m_sizes.size(); ++l) {
    if (m_sizes[l] == 0 || m_sizes[l + 1] == 0) throw ConfigError("mlp: layer sizes must be at least 1");
    m_weight.push_back(m_layout.add("fc" + std::to_string(l + 1) + ".weight", m_sizes[l + 1] * m_sizes[l]));
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
  const std::size_t layers = m_weight.size(), b = samples.size();
  ws.act.resize(layers + 1);
  ws.delta.resize(layers + 1);
  ws.act[0].resize(b * m_sizes[0]);
  for (std::size_t i = 0; i < b; ++i) {
    const float* row = data.x.data() + static_cast<std::size_t>(samples[i]) * data.features;
    std::copy(row, row + data.features, ws.act[0].begin() + static_cast<std::ptrdiff_t>(i * m_sizes[0]));
  }
  for (std::size_t l = 0; l < layers; ++l) {
    const std::size_t in = m_sizes[l], out = m_sizes[l + 1];
    std::vector<float>& y = ws.act[l + 1];
    y.resize(b * out);
    const std::span<const float> bias = m_layout.view(params, m_bias[l]);
    for (std::size_t i = 0; i < b; ++i) std::copy(bias.begin(), bias.end(), y.begin() + static_cast<std::ptrdiff_t>(i * out));
    // y (b x out) += x (b x in) * W^T, with W stored out x in.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(b), static_cast<int>(out), static_cast<int>(in), 1.0f,
                ws.act[l].data(), static_cast<int>(in), m_layout.view(params, m_weight[l]).data(), static_cast<int>(in), 1.0f, y.data(),
                static_cast<int>(out));
    if (l + 1 < layers) {
      for (float& v : y) v = std::max(v, 0.0f);
    }
  }
}

double MlpModel::accumulate_gradient(std::span<const float> params, std::span<float> grad, const DenseData& data,
                                     std::span<const std::uint32_t> samples, Workspace& ws) const {
  forward(params, data, samples, ws);
  const std::size_t layers = m_weight.size(), b = samples.size(), classes = m_sizes.back();
  // Softmax cross-entropy: the loss and dL/dlogits = softmax - onehot, per sample (summed, not averaged).
  double loss = 0;
  std::vector<float>& d = ws.delta[layers];
  d.resize(b * classes);
  for (std::size_t i = 0; i < b; ++i) {
    const float* z = ws.act[layers].data() + i * classes;
    float* g = d.data() + i * classes;
    const float zmax = *std::max_element(z, z + classes);
    double denom = 0;
    for (std::size_t k = 0; k < classes; ++k) denom += std::exp(static_cast<double>(z[k] - zmax));
    const std::size_t label = data.y[samples[i]];
    for (std::size_t k = 0; k < classes; ++k) {
      g[k] = static_cast<float>(std::exp(static_cast<double>(z[k] - zmax)) / denom) - (k == label ? 1.0f : 0.0f);
    }
    loss += std::log(denom) - static_cast<double>(z[label] - zmax);
  }
  for (std::size_t l = layers; l-- > 0;) {
    const std::size_t in = m_sizes[l], out = m_sizes[l + 1];
    const std::vector<float>& dl = ws.delta[l + 1];
    // dW (out x in) += dl^T (out x b) * x (b x in); beta = 1 accumulates across chunks.
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(out), static_cast<int>(in), static_cast<int>(b), 1.0f, dl.data(),
                static_cast<int>(out), ws.act[l].data(), static_cast<int>(in), 1.0f, m_layout.view(grad, m_weight[l]).data(),
                static_cast<int>(in));
    std::span<float> db = m_layout.view(grad, m_bias[l]);
    for (std::size_t i = 0; i < b; ++i) {
      for (std::size_t k = 0; k < out; ++k) db[k] += dl[i * out + k];
    }
    if (l == 0) break;
    // dx (b x in) = dl (b x out) * W (out x in), then through the ReLU of the layer below.
    std::vector<float>& dx = ws.delta[l];
    dx.resize(b * in);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(b), static_cast<int>(in), static_cast<int>(out), 1.0f, dl.data(),
                static_cast<int>(out), m_layout.view(params, m_weight[l]).data(), static_cast<int>(in), 0.0f, dx.data(), static_cast<int>(in));
    const std::vector<float>& a = ws.act[l];
    for (std::size_t i = 0; i < dx.size(); ++i) {
      if (a[i] <= 0.0f) dx[i] = 0.0f;
    }
  }
  return loss;
}

double MlpModel::accuracy(std::span<const float> params, const DenseData& data, Workspace& ws) const {
  constexpr std::size_t kBatch = 512;
  std::vector<std::uint32_t> idx;
  std::size_t correct = 0;
  const std::size_t classes = m_sizes.back();
  for (std::size_t start = 0; start < data.count; start += kBatch) {
    const std::size_t b = std::min(kBatch, data.count - start);
    idx.resize(b);
    for (std::size_t i = 0; i < b; ++i) idx[i] = static_cast<std::uint32_t>(start + i);
    forward(params, data, idx, ws);
    const std::vector<float>& z = ws.act.back();
    for (std::size_t i = 0; i < b; ++i) {
      const float* row = z.data() + i * classes;
      correct += static_cast<std::size_t>(std::max_element(row, row + classes) - row) == data.y[start + i];
    }
  }
  return data.count ? static_cast<double>(correct) / static_cast<double>(data.count) : 0.0;
}

}  // namespace stealbatch::examples

// The shared cblas building blocks: one GEMM per dense layer and direction, the loss in double.
#include "layers.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>

namespace stealbatch::examples {

void use_single_threaded_blas() { openblas_set_num_threads(1); }

double max_relative_error(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

void dense_forward(std::span<const float> x, std::size_t b, std::size_t in, std::size_t out, std::span<const float> weight,
                   std::span<const float> bias, std::vector<float>& y) {
  y.resize(b * out);
  for (std::size_t i = 0; i < b; ++i) std::copy(bias.begin(), bias.end(), y.begin() + static_cast<std::ptrdiff_t>(i * out));
  // y (b x out) += x (b x in) * W^T, with W stored out x in.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(b), static_cast<int>(out), static_cast<int>(in), 1.0f, x.data(),
              static_cast<int>(in), weight.data(), static_cast<int>(in), 1.0f, y.data(), static_cast<int>(out));
}

void dense_backward(std::span<const float> x, std::span<const float> dy, std::size_t b, std::size_t in, std::size_t out,
                    std::span<const float> weight, std::span<float> dweight, std::span<float> dbias, std::vector<float>* dx) {
  // dW (out x in) += dy^T (out x b) * x (b x in); beta = 1 accumulates across chunks.
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(out), static_cast<int>(in), static_cast<int>(b), 1.0f, dy.data(),
              static_cast<int>(out), x.data(), static_cast<int>(in), 1.0f, dweight.data(), static_cast<int>(in));
  for (std::size_t i = 0; i < b; ++i) {
    for (std::size_t k = 0; k < out; ++k) dbias[k] += dy[i * out + k];
  }
  if (dx == nullptr) return;
  // dx (b x in) = dy (b x out) * W (out x in).
  dx->resize(b * in);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(b), static_cast<int>(in), static_cast<int>(out), 1.0f, dy.data(),
              static_cast<int>(out), weight.data(), static_cast<int>(in), 0.0f, dx->data(), static_cast<int>(in));
}

void relu(std::span<float> v) {
  for (float& x : v) x = std::max(x, 0.0f);
}

void relu_backward(std::span<const float> out, std::span<float> grad) {
  for (std::size_t i = 0; i < grad.size(); ++i) {
    if (out[i] <= 0.0f) grad[i] = 0.0f;
  }
}

double softmax_cross_entropy(std::span<const float> logits, std::size_t classes, const DenseData& data,
                             std::span<const std::uint32_t> samples, std::vector<float>& dlogits) {
  const std::size_t b = samples.size();
  double loss = 0;
  dlogits.resize(b * classes);
  for (std::size_t i = 0; i < b; ++i) {
    const float* z = logits.data() + i * classes;
    float* g = dlogits.data() + i * classes;
    const float zmax = *std::max_element(z, z + classes);
    double denom = 0;
    for (std::size_t k = 0; k < classes; ++k) denom += std::exp(static_cast<double>(z[k] - zmax));
    const std::size_t label = data.y[samples[i]];
    for (std::size_t k = 0; k < classes; ++k) {
      g[k] = static_cast<float>(std::exp(static_cast<double>(z[k] - zmax)) / denom) - (k == label ? 1.0f : 0.0f);
    }
    loss += std::log(denom) - static_cast<double>(z[label] - zmax);
  }
  return loss;
}

double batched_accuracy(const DenseData& data, std::size_t classes, std::size_t batch,
                        const std::function<std::span<const float>(std::span<const std::uint32_t>)>& logits) {
  std::vector<std::uint32_t> idx;
  std::size_t correct = 0;
  for (std::size_t start = 0; start < data.count; start += batch) {
    const std::size_t b = std::min(batch, data.count - start);
    idx.resize(b);
    for (std::size_t i = 0; i < b; ++i) idx[i] = static_cast<std::uint32_t>(start + i);
    const std::span<const float> z = logits(idx);
    for (std::size_t i = 0; i < b; ++i) {
      const float* row = z.data() + i * classes;
      correct += static_cast<std::size_t>(std::max_element(row, row + classes) - row) == data.y[start + i];
    }
  }
  return data.count ? static_cast<double>(correct) / static_cast<double>(data.count) : 0.0;
}

}  // namespace stealbatch::examples

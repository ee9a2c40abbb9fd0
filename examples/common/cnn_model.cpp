// The CNN's forward and backward passes: each convolution is one im2col and one GEMM over the whole chunk.
#include "cnn_model.hpp"

#include <stealbatch/error.hpp>

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>

namespace stealbatch::examples {
namespace {

constexpr std::size_t kK = CnnModel::kKernel, kPad = CnnModel::kPad;

// col[(c, ky, kx)][(n, y, x)] = in[n][c][y + ky - 2][x + kx - 2], 0 outside the image: a 5x5 convolution with
// padding 2 keeps the side, so the columns are the output pixels of all b samples.
void im2col(std::span<const float> in, std::size_t b, std::size_t channels, std::size_t side, std::vector<float>& col) {
  const std::size_t hw = side * side, cols = b * hw;
  col.resize(channels * kK * kK * cols);
  for (std::size_t c = 0; c < channels; ++c) {
    for (std::size_t ky = 0; ky < kK; ++ky) {
      for (std::size_t kx = 0; kx < kK; ++kx) {
        float* row = col.data() + ((c * kK + ky) * kK + kx) * cols;
        // The x whose source x + kx - 2 lies inside the image.
        const std::size_t x0 = kx < kPad ? kPad - kx : 0, x1 = kx > kPad ? side - (kx - kPad) : side;
        for (std::size_t n = 0; n < b; ++n) {
          for (std::size_t y = 0; y < side; ++y) {
            float* dst = row + n * hw + y * side;
            if (y + ky < kPad || y + ky - kPad >= side) {
              std::fill(dst, dst + side, 0.0f);
              continue;
            }
            const float* src = in.data() + (n * channels + c) * hw + (y + ky - kPad) * side + (x0 + kx - kPad);
            std::fill(dst, dst + x0, 0.0f);
            std::copy(src, src + (x1 - x0), dst + x0);
            std::fill(dst + x1, dst + side, 0.0f);
          }
        }
      }
    }
  }
}

// The adjoint of im2col: din[n][c][sy][sx] = the sum of the dcol entries im2col copied from it.
void col2im(std::span<const float> dcol, std::size_t b, std::size_t channels, std::size_t side, std::vector<float>& din) {
  const std::size_t hw = side * side, cols = b * hw;
  din.assign(b * channels * hw, 0.0f);
  for (std::size_t c = 0; c < channels; ++c) {
    for (std::size_t ky = 0; ky < kK; ++ky) {
      for (std::size_t kx = 0; kx < kK; ++kx) {
        const float* row = dcol.data() + ((c * kK + ky) * kK + kx) * cols;
        const std::size_t x0 = kx < kPad ? kPad - kx : 0, x1 = kx > kPad ? side - (kx - kPad) : side;
        for (std::size_t n = 0; n < b; ++n) {
          for (std::size_t y = 0; y < side; ++y) {
            if (y + ky < kPad || y + ky - kPad >= side) continue;
            const float* src = row + n * hw + y * side;
            float* dst = din.data() + (n * channels + c) * hw + (y + ky - kPad) * side + (x0 + kx - kPad);
            for (std::size_t x = x0; x < x1; ++x) dst[x - x0] += src[x];
          }
        }
      }
    }
  }
}

// out (outs x cols) = ReLU(W (outs x k) * col (k x cols) + bias), with W stored [out][in][ky][kx].
void conv_forward(std::span<const float> weight, std::span<const float> bias, std::span<const float> col, std::size_t outs,
                  std::size_t k, std::size_t cols, std::vector<float>& out) {
  out.resize(outs * cols);
  for (std::size_t o = 0; o < outs; ++o) std::fill_n(out.begin() + static_cast<std::ptrdiff_t>(o * cols), cols, bias[o]);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(outs), static_cast<int>(cols), static_cast<int>(k), 1.0f,
              weight.data(), static_cast<int>(k), col.data(), static_cast<int>(cols), 1.0f, out.data(), static_cast<int>(cols));
  relu(out);
}

// dW (outs x k) += dout (outs x cols) * col^T and dbias += dout's row sums; then, when dcol is given,
// dcol (k x cols) = W^T * dout.
void conv_backward(std::span<const float> col, std::span<const float> dout, std::span<const float> weight, std::size_t outs,
                   std::size_t k, std::size_t cols, std::span<float> dweight, std::span<float> dbias, std::vector<float>* dcol) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(outs), static_cast<int>(k), static_cast<int>(cols), 1.0f,
              dout.data(), static_cast<int>(cols), col.data(), static_cast<int>(cols), 1.0f, dweight.data(), static_cast<int>(k));
  for (std::size_t o = 0; o < outs; ++o) {
    const float* row = dout.data() + o * cols;
    double sum = 0;  // a row holds every pixel of the chunk: tens of thousands of terms
    for (std::size_t j = 0; j < cols; ++j) sum += row[j];
    dbias[o] += static_cast<float>(sum);
  }
  if (dcol == nullptr) return;
  dcol->resize(k * cols);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(k), static_cast<int>(cols), static_cast<int>(outs), 1.0f,
              weight.data(), static_cast<int>(k), dout.data(), static_cast<int>(cols), 0.0f, dcol->data(), static_cast<int>(cols));
}

// 2x2 max-pooling, stride 2, from conv [c][n][y][x] to pool [n][c][y/2][x/2]; arg records the first maximum
// (strict '>' in the order (0,0), (0,1), (1,0), (1,1)) as 2 * row + column.
void pool_forward(std::span<const float> conv, std::size_t b, std::size_t channels, std::size_t side, std::vector<float>& pool,
                  std::vector<std::uint8_t>& arg) {
  const std::size_t ps = side / 2, hw = side * side;
  pool.resize(b * channels * ps * ps);
  arg.resize(pool.size());
  for (std::size_t c = 0; c < channels; ++c) {
    for (std::size_t n = 0; n < b; ++n) {
      const float* map = conv.data() + (c * b + n) * hw;
      const std::size_t base = (n * channels + c) * ps * ps;
      for (std::size_t py = 0; py < ps; ++py) {
        for (std::size_t px = 0; px < ps; ++px) {
          const float* w = map + 2 * py * side + 2 * px;
          const float v[4] = {w[0], w[1], w[side], w[side + 1]};
          std::uint8_t at = 0;
          for (std::uint8_t i = 1; i < 4; ++i) {
            if (v[i] > v[at]) at = i;
          }
          pool[base + py * ps + px] = v[at];
          arg[base + py * ps + px] = at;
        }
      }
    }
  }
}

// Routes dpool [n][c][y/2][x/2] to each window's recorded maximum in dconv [c][n][y][x] (0 elsewhere), and through
// the ReLU below it (0 where its output is 0).
void pool_backward(std::span<const float> dpool, std::span<const std::uint8_t> arg, std::span<const float> conv, std::size_t b,
                   std::size_t channels, std::size_t side, std::vector<float>& dconv) {
  const std::size_t ps = side / 2, hw = side * side;
  dconv.assign(channels * b * hw, 0.0f);
  for (std::size_t c = 0; c < channels; ++c) {
    for (std::size_t n = 0; n < b; ++n) {
      const std::size_t map = (c * b + n) * hw, base = (n * channels + c) * ps * ps;
      for (std::size_t py = 0; py < ps; ++py) {
        for (std::size_t px = 0; px < ps; ++px) {
          const std::uint8_t at = arg[base + py * ps + px];
          const std::size_t pos = map + (2 * py + at / 2) * side + 2 * px + at % 2;
          if (conv[pos] > 0.0f) dconv[pos] = dpool[base + py * ps + px];
        }
      }
    }
  }
}

}  // namespace

CnnModel::CnnModel() {
  m_conv1_w = m_layout.add("conv1.weight", kConv1 * 1 * kKernel * kKernel);
  m_conv1_b = m_layout.add("conv1.bias", kConv1);
  m_conv2_w = m_layout.add("conv2.weight", kConv2 * kConv1 * kKernel * kKernel);
  m_conv2_b = m_layout.add("conv2.bias", kConv2);
  m_fc1_w = m_layout.add("fc1.weight", kHidden * kFlat);
  m_fc1_b = m_layout.add("fc1.bias", kHidden);
  m_fc2_w = m_layout.add("fc2.weight", kClasses * kHidden);
  m_fc2_b = m_layout.add("fc2.bias", kClasses);
}

std::vector<float> CnnModel::initial_parameters(std::uint64_t seed) const {
  std::vector<float> p(m_layout.size(), 0.0f);
  std::mt19937_64 rng(seed);
  const std::pair<std::size_t, std::size_t> weights[] = {
      {m_conv1_w, 1 * kKernel * kKernel}, {m_conv2_w, kConv1 * kKernel * kKernel}, {m_fc1_w, kFlat}, {m_fc2_w, kHidden}};
  for (const auto& [tensor, fan_in] : weights) {
    const float bound = std::sqrt(6.0f / static_cast<float>(fan_in));
    std::uniform_real_distribution<float> u(-bound, bound);
    for (float& w : m_layout.view(std::span<float>(p), tensor)) w = u(rng);
  }
  return p;
}

void CnnModel::forward(std::span<const float> params, const DenseData& data, std::span<const std::uint32_t> samples,
                       Workspace& ws) const {
  if (data.features != kSide * kSide) {
    throw ConfigError("cnn: data has " + std::to_string(data.features) + " features per sample; the CNN reads 28x28 = 784");
  }
  const std::size_t b = samples.size(), half = kSide / 2;
  ws.input.resize(b * kSide * kSide);
  for (std::size_t i = 0; i < b; ++i) {
    const float* row = data.x.data() + static_cast<std::size_t>(samples[i]) * data.features;
    std::copy(row, row + data.features, ws.input.begin() + static_cast<std::ptrdiff_t>(i * data.features));
  }
  im2col(ws.input, b, 1, kSide, ws.col1);
  conv_forward(m_layout.view(params, m_conv1_w), m_layout.view(params, m_conv1_b), ws.col1, kConv1, kKernel * kKernel, b * kSide * kSide,
               ws.conv1);
  pool_forward(ws.conv1, b, kConv1, kSide, ws.pool1, ws.arg1);
  im2col(ws.pool1, b, kConv1, half, ws.col2);
  conv_forward(m_layout.view(params, m_conv2_w), m_layout.view(params, m_conv2_b), ws.col2, kConv2, kConv1 * kKernel * kKernel,
               b * half * half, ws.conv2);
  pool_forward(ws.conv2, b, kConv2, half, ws.pool2, ws.arg2);
  dense_forward(ws.pool2, b, kFlat, kHidden, m_layout.view(params, m_fc1_w), m_layout.view(params, m_fc1_b), ws.hidden);
  relu(ws.hidden);
  dense_forward(ws.hidden, b, kHidden, kClasses, m_layout.view(params, m_fc2_w), m_layout.view(params, m_fc2_b), ws.logits);
}

double CnnModel::accumulate_gradient(std::span<const float> params, std::span<float> grad, const DenseData& data,
                                     std::span<const std::uint32_t> samples, Workspace& ws) const {
  forward(params, data, samples, ws);
  const std::size_t b = samples.size(), half = kSide / 2;
  const double loss = softmax_cross_entropy(ws.logits, kClasses, data, samples, ws.d_logits);
  dense_backward(ws.hidden, ws.d_logits, b, kHidden, kClasses, m_layout.view(params, m_fc2_w), m_layout.view(grad, m_fc2_w),
                 m_layout.view(grad, m_fc2_b), &ws.d_hidden);
  relu_backward(ws.hidden, ws.d_hidden);
  dense_backward(ws.pool2, ws.d_hidden, b, kFlat, kHidden, m_layout.view(params, m_fc1_w), m_layout.view(grad, m_fc1_w),
                 m_layout.view(grad, m_fc1_b), &ws.d_pool2);
  pool_backward(ws.d_pool2, ws.arg2, ws.conv2, b, kConv2, half, ws.d_conv2);
  conv_backward(ws.col2, ws.d_conv2, m_layout.view(params, m_conv2_w), kConv2, kConv1 * kKernel * kKernel, b * half * half,
                m_layout.view(grad, m_conv2_w), m_layout.view(grad, m_conv2_b), &ws.d_col2);
  col2im(ws.d_col2, b, kConv1, half, ws.d_pool1);
  pool_backward(ws.d_pool1, ws.arg1, ws.conv1, b, kConv1, kSide, ws.d_conv1);
  // The input needs no gradient: conv1 stops at its weights.
  conv_backward(ws.col1, ws.d_conv1, m_layout.view(params, m_conv1_w), kConv1, kKernel * kKernel, b * kSide * kSide,
                m_layout.view(grad, m_conv1_w), m_layout.view(grad, m_conv1_b), nullptr);
  return loss;
}

double CnnModel::accuracy(std::span<const float> params, const DenseData& data, Workspace& ws) const {
  // 128 samples keep conv2's im2col at 40 MB.
  return batched_accuracy(data, kClasses, 128, [&](std::span<const std::uint32_t> samples) {
    forward(params, data, samples, ws);
    return std::span<const float>(ws.logits);
  });
}

}  // namespace stealbatch::examples

// A small convolutional network for 28x28 grey images, on oneDNN: the model the CNN example trains.
#pragma once

#include <stealbatch/models/dense_data.hpp>
#include <stealbatch/models/layers.hpp>

#include <stealbatch/runtime/parameters.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace stealbatch::examples {

// The network, exactly (a GPU version must match it in parameter layout and in math):
//
//   input  1x28x28 (a DenseData row of 784 floats, [y][x])
//   conv1  16 channels, 5x5, stride 1, zero padding 2 -> 16x28x28, + bias, ReLU; max-pool 2x2 stride 2 -> 16x14x14
//   conv2  32 channels, 5x5, stride 1, zero padding 2 -> 32x14x14, + bias, ReLU; max-pool 2x2 stride 2 -> 32x7x7
//   flatten per sample in (channel, y, x) order -> 1568
//   fc1    1568 -> 128, + bias, ReLU
//   fc2    128 -> 10, softmax cross-entropy (summed over samples, dL/dlogits = softmax - onehot, as MlpModel)
//
// Parameters, in this order: conv1.weight [16][1][5][5], conv1.bias [16], conv2.weight [32][16][5][5],
// conv2.bias [32], fc1.weight [128][1568], fc1.bias [128], fc2.weight [10][128], fc2.bias [10], all row-major.
// A convolution computes out[o][y][x] = bias[o] + sum over (i, ky, kx) of w[o][i][ky][kx] * in[i][y + ky - 2][x + kx - 2],
// reading 0 outside the image (a cross-correlation, as in every framework).
//
// Max-pooling runs on the ReLU's output. Its backward pass sends each window's gradient to the window's FIRST
// maximum, scanning (0,0), (0,1), (1,0), (1,1) (row, column) and replacing the candidate only on a strictly
// greater value, so a tie goes to the earliest. The ReLU's derivative at 0 is 0.
//
//   CnnModel model;
//   std::vector<float> params = model.initial_parameters(1);
//   CnnModel::Workspace ws;
//   double loss = model.accumulate_gradient(params, grad, data, samples, ws);   // grad += sum over samples
class CnnModel {
 public:
  static constexpr std::size_t kSide = 28, kKernel = 5, kPad = 2, kConv1 = 16, kConv2 = 32, kHidden = 128, kClasses = 10;
  static constexpr std::size_t kFlat = kConv2 * (kSide / 4) * (kSide / 4);  // fc1's inputs: 32x7x7

  // The per-device scratch for one chunk, grown on demand and reused, with oneDNN's convolutions for each chunk size
  // met so far (made on first use). Maps are in the layouts oneDNN's convolutions choose (channels blocked by 16 on
  // AVX-512); pool2, the input of fc1, is [sample][channel][y][x].
  struct Workspace {
    struct Kernels;
    Workspace();
    ~Workspace();
    Workspace(Workspace&&) noexcept;
    Workspace& operator=(Workspace&&) noexcept;
    std::unique_ptr<Kernels> kernels;
  };

  CnnModel();

  const ParameterLayout& layout() const noexcept { return m_layout; }
  // He-uniform weights (bound sqrt(6 / fan_in), fan_in = in*5*5 or in) drawn tensor after tensor in layout order
  // from one std::mt19937_64(seed); zero biases.
  std::vector<float> initial_parameters(std::uint64_t seed) const;

  // Adds the summed (not averaged) cross-entropy gradient of the samples to grad; returns the summed loss.
  // Throws ConfigError unless data has 784 features.
  double accumulate_gradient(std::span<const float> params, std::span<float> grad, const DenseData& data,
                             std::span<const std::uint32_t> samples, Workspace& ws) const;
  // The fraction of data classified correctly.
  double accuracy(std::span<const float> params, const DenseData& data, Workspace& ws) const;

 private:
  void forward(std::span<const float> params, const DenseData& data, std::span<const std::uint32_t> samples, Workspace& ws) const;

  ParameterLayout m_layout;
  std::size_t m_conv1_w, m_conv1_b, m_conv2_w, m_conv2_b, m_fc1_w, m_fc1_b, m_fc2_w, m_fc2_b;  // tensor indices
};

}  // namespace stealbatch::examples

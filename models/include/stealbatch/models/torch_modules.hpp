// The example models as torch::nn modules, for the libtorch adapter: the same networks, parameter names, shapes and
// order as the hand-written MlpModel and CnnModel, so a layout, a start and a gradient carry over between them.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace stealbatch::examples {

// sizes[0] inputs, ReLU between layers, sizes.back() outputs: fc1, fc2, ... (fcN.weight [out, in], fcN.bias).
struct TorchMlpImpl : ::torch::nn::Module {
  explicit TorchMlpImpl(const std::vector<std::int64_t>& sizes) {
    for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
      layers.push_back(register_module("fc" + std::to_string(l + 1), ::torch::nn::Linear(sizes[l], sizes[l + 1])));
    }
  }
  ::torch::Tensor forward(::torch::Tensor x) {
    for (std::size_t l = 0; l < layers.size(); ++l) {
      x = layers[l](x);
      if (l + 1 < layers.size()) x = ::torch::relu(x);
    }
    return x;
  }
  std::vector<::torch::nn::Linear> layers;
};

// CnnModel's network: 28x28 rows in, conv5x5x16 (pad 2) + ReLU + 2x2 max-pool, conv5x5x32 + ReLU + pool, then
// fc1 (1568 -> 128) + ReLU and fc2 (128 -> 10); the flattening is [channel][y][x], as CnnModel's.
struct TorchCnnImpl : ::torch::nn::Module {
  TorchCnnImpl()
      : conv1(register_module("conv1", ::torch::nn::Conv2d(::torch::nn::Conv2dOptions(1, 16, 5).padding(2)))),
        conv2(register_module("conv2", ::torch::nn::Conv2d(::torch::nn::Conv2dOptions(16, 32, 5).padding(2)))),
        fc1(register_module("fc1", ::torch::nn::Linear(32 * 7 * 7, 128))),
        fc2(register_module("fc2", ::torch::nn::Linear(128, 10))) {}
  ::torch::Tensor forward(::torch::Tensor x) {
    x = x.view({-1, 1, 28, 28});
    x = ::torch::max_pool2d(::torch::relu(conv1(x)), 2);
    x = ::torch::max_pool2d(::torch::relu(conv2(x)), 2);
    return fc2(::torch::relu(fc1(x.flatten(1))));
  }
  ::torch::nn::Conv2d conv1, conv2;
  ::torch::nn::Linear fc1, fc2;
};

}  // namespace stealbatch::examples

// What the model-level tests share: a synthetic data set, the error measure, and the sequential reference gradient.
#pragma once

#include <stealbatch/models/layers.hpp>
#include <stealbatch/models/mlp_model.hpp>

#include <stealbatch/data/idx.hpp>
#include <stealbatch/runtime/runtime.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <numeric>
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

// Puts back whatever backend served cuda: specs when a test that registered a stand-in ends.
struct RestoreCudaBackend {
  std::shared_ptr<DeviceBackend> before = device_backend(DeviceKind::kCuda);
  ~RestoreCudaBackend() { register_device_backend(DeviceKind::kCuda, before); }
  RestoreCudaBackend() = default;
  RestoreCudaBackend(const RestoreCudaBackend&) = delete;
  RestoreCudaBackend& operator=(const RestoreCudaBackend&) = delete;
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

// One epoch on the first 10k Fashion-MNIST training samples on cpu:2 (Adam 1e-3, batch 64, chunk 16), then the
// test accuracy; -1 (after printing the SB_SKIP marker) where the dataset is not installed.
template <class Model>
double smoke_train_accuracy(const Model& model) {
  const std::filesystem::path dir = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(dir / "train-images-idx3-ubyte.gz")) {
    std::printf("SB_SKIP: no Fashion-MNIST at %s\n", dir.c_str());
    return -1;
  }
  const Dataset train = load_fashion_mnist(dir, DataSplit::kTrain);
  const Dataset test = load_fashion_mnist(dir, DataSplit::kTest);
  const std::size_t n = 10000;
  const DenseData train_set{n, train.features, std::span<const float>(train.x).first(n * train.features), std::span<const std::uint8_t>(train.y).first(n)};
  const DenseData test_set{test.count, test.features, test.x, test.y};
  Runtime rt({.devices = "cpu:2", .schedule = {.chunk_size = 16}, .optimizer = {.kind = OptimizerKind::kAdam, .lr = 0.001f}});
  rt.register_parameters(model.layout(), model.initial_parameters(1));
  std::vector<typename Model::Workspace> ws(2);
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(7));
  for (std::size_t start = 0; start < n; start += 64) {
    (void)rt.step(std::span<const std::uint32_t>(order).subspan(start, std::min<std::size_t>(64, n - start)), [&](ChunkContext& ctx) {
      ctx.add_loss(model.accumulate_gradient(ctx.params, ctx.grad, train_set, ctx.samples, ws[ctx.device]));
    });
  }
  typename Model::Workspace eval;
  return model.accuracy(rt.parameters(0), test_set, eval);
}

}  // namespace stealbatch::testing

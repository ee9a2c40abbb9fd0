// The libtorch adapter: torch::nn::Module versions of the MLP and the CNN give the same full-batch gradient as the
// hand-written ones on the same weights and batch, on 1 to 4 CPU devices with stealing; their layouts (names, shapes,
// order) are the hand-written ones'; a module that does not match a layout is refused.
#include <stealbatch/models/cnn_model.hpp>
#include <stealbatch/models/layers.hpp>
#include <stealbatch/models/mlp_model.hpp>
#include <stealbatch/models/torch_modules.hpp>
#include <stealbatch/torch.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

using namespace stealbatch;
using examples::CnnModel;
using examples::DenseData;
using examples::MlpModel;
using examples::TorchCnnImpl;
using examples::TorchMlpImpl;

namespace {

struct Data {
  std::size_t count = 512, features = 32;  // the MLP's; the CNN's data is Images below
  std::vector<float> x;
  std::vector<std::uint8_t> y;
  ::torch::Tensor tx, ty;
  Data() : x(count * features), y(count) {
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& v : x) v = u(rng);
    for (auto& v : y) v = static_cast<std::uint8_t>(rng() % 10);
    tx = ::torch::from_blob(x.data(), {static_cast<std::int64_t>(count), static_cast<std::int64_t>(features)}, ::torch::kFloat);
    ty = ::torch::empty({static_cast<std::int64_t>(count)}, ::torch::kLong);
    for (std::size_t i = 0; i < count; ++i) ty[static_cast<std::int64_t>(i)] = static_cast<std::int64_t>(y[i]);
  }
  DenseData dense() const { return {count, features, x, y}; }
};

libtorch::ModuleChunks<TorchMlpImpl> torch_mlp(const Data& data, std::size_t devices) {
  return libtorch::ModuleChunks<TorchMlpImpl>(
      [] { return std::make_shared<TorchMlpImpl>(std::vector<std::int64_t>{32, 24, 16, 10}); }, devices, [&data](std::span<const std::uint32_t> s) { return libtorch::rows(data.tx, s); },
      [&data](const ::torch::Tensor& out, std::span<const std::uint32_t> s) {
        return ::torch::nn::functional::cross_entropy(out, libtorch::rows(data.ty, s),
                                                      ::torch::nn::functional::CrossEntropyFuncOptions().reduction(::torch::kSum));
      });
}

}  // namespace

TEST_CASE("Torch.LayoutIsTheHandWrittenModelsLayout") {
  const Data data;
  auto chunks = torch_mlp(data, 1);
  const MlpModel model({32, 24, 16, 10});
  REQUIRE(chunks.layout().tensors().size() == model.layout().tensors().size());
  for (std::size_t i = 0; i < model.layout().tensors().size(); ++i) {
    CHECK(chunks.layout().tensors()[i].name == model.layout().tensors()[i].name);
    CHECK(chunks.layout().tensors()[i].size == model.layout().tensors()[i].size);
    CHECK(chunks.layout().tensors()[i].offset == model.layout().tensors()[i].offset);
    CHECK(chunks.layout().tensors()[i].shape == model.layout().tensors()[i].shape);
  }
}

namespace {

// 28x28 images with values in [0, 1] (as the dataset's), and labels.
struct Images {
  std::size_t count = 96;
  std::vector<float> x;
  std::vector<std::uint8_t> y;
  ::torch::Tensor tx, ty;
  Images() : x(count * 784), y(count) {
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (float& v : x) v = u(rng);
    for (auto& v : y) v = static_cast<std::uint8_t>(rng() % 10);
    tx = ::torch::from_blob(x.data(), {static_cast<std::int64_t>(count), 784}, ::torch::kFloat);
    ty = ::torch::empty({static_cast<std::int64_t>(count)}, ::torch::kLong);
    for (std::size_t i = 0; i < count; ++i) ty[static_cast<std::int64_t>(i)] = static_cast<std::int64_t>(y[i]);
  }
  DenseData dense() const { return {count, 784, x, y}; }
};

}  // namespace

TEST_CASE("Torch.CnnGradientEqualsTheHandWrittenCnnsOnOneToFourDevices") {
  ::torch::set_num_threads(1);
  const Images data;
  const CnnModel model;
  const std::vector<float> weights = model.initial_parameters(3);
  std::vector<std::uint32_t> batch(60);
  for (std::size_t i = 0; i < batch.size(); ++i) batch[i] = static_cast<std::uint32_t>((i * 7) % data.count);
  std::vector<float> ref(model.layout().size(), 0.0f);
  CnnModel::Workspace ws;
  model.accumulate_gradient(weights, ref, data.dense(), batch, ws);
  for (float& g : ref) g /= static_cast<float>(batch.size());
  for (const char* devices : {"cpu:1", "cpu:2", "cpu:3", "cpu:4"}) {
    CAPTURE(devices);
    Runtime rt({.devices = devices, .schedule = {.chunk_size = 8}, .host = {.threads_per_device = 1}});
    libtorch::ModuleChunks<TorchCnnImpl> chunks(
        [] { return std::make_shared<TorchCnnImpl>(); }, rt.device_count(), [&data](std::span<const std::uint32_t> s) { return libtorch::rows(data.tx, s); },
        [&data](const ::torch::Tensor& out, std::span<const std::uint32_t> s) {
          return ::torch::nn::functional::cross_entropy(out, libtorch::rows(data.ty, s),
                                                        ::torch::nn::functional::CrossEntropyFuncOptions().reduction(::torch::kSum));
        });
    REQUIRE(chunks.layout().tensor_count() == model.layout().tensor_count());
    for (std::size_t i = 0; i < model.layout().tensor_count(); ++i) {
      CHECK(chunks.layout().tensor(i).name == model.layout().tensor(i).name);
      CHECK(chunks.layout().tensor(i).shape == model.layout().tensor(i).shape);
    }
    rt.register_parameters(chunks.layout(), weights);
    for (int rep = 0; rep < 2; ++rep) {
      rt.compute_gradient(batch, chunks.function());
      const double err = examples::max_relative_error(rt.gradient(), ref);
      CAPTURE(err);
      CHECK(err <= 1e-5);
    }
  }
}

TEST_CASE("Torch.GradientEqualsTheHandWrittenModelsOnOneToFourDevices") {
  ::torch::set_num_threads(1);
  const Data data;
  const DenseData dense = data.dense();
  const MlpModel model({32, 24, 16, 10});
  const std::vector<float> weights = model.initial_parameters(7);
  std::vector<std::uint32_t> batch(300);
  for (std::size_t i = 0; i < batch.size(); ++i) batch[i] = static_cast<std::uint32_t>((i * 37) % data.count);
  std::vector<float> ref(model.layout().size(), 0.0f);
  MlpModel::Workspace ws;
  model.accumulate_gradient(weights, ref, dense, batch, ws);
  for (float& g : ref) g /= static_cast<float>(batch.size());
  // Steps of the same batch from the same weights: every one's gradient is the hand-written model's.
  auto check_steps = [&](Runtime& rt, int steps) {
    auto chunks = torch_mlp(data, rt.device_count());
    rt.register_parameters(chunks.layout(), weights);
    for (int rep = 0; rep < steps; ++rep) {
      rt.compute_gradient(batch, chunks.function());
      CHECK(examples::max_relative_error(rt.gradient(), ref) <= 1e-5);
    }
  };
  for (const char* devices : {"cpu:1", "cpu:2", "cpu:3", "cpu:4"}) {
    CAPTURE(devices);
    Runtime rt({.devices = devices, .schedule = {.chunk_size = 16}, .host = {.threads_per_device = 1}});
    check_steps(rt, 3);
  }
  // As the torch examples run: one device slowed 4x, so its chunks are cut smaller, and thieves that merge what they
  // steal into one call (RuntimeOptions::schedule.merge_stolen). The module then sees chunks of several chunks' samples.
  for (const char* devices : {"cpu:2", "cpu:3"}) {
    CAPTURE(devices);
    std::vector<double> slowdown(static_cast<std::size_t>(devices[4] - '0'), 1.0);
    slowdown[0] = 4.0;
    Runtime rt({.devices = devices, .schedule = {.chunk_size = 16, .merge_stolen = true}, .host = {.slowdown = slowdown, .threads_per_device = 1}});
    check_steps(rt, 5);
  }
}

TEST_CASE("Torch.TrainingStepsLowerTheLoss") {
  ::torch::set_num_threads(1);
  const Data data;
  Runtime rt({.devices = "cpu:2", .schedule = {.chunk_size = 32}, .optimizer = {.kind = OptimizerKind::kAdam, .lr = 0.01f}, .host = {.threads_per_device = 1}});
  auto chunks = torch_mlp(data, rt.device_count());
  rt.register_parameters(chunks.layout(), chunks.initial());
  std::vector<std::uint32_t> all(data.count);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint32_t>(i);
  const double first = rt.step(all, chunks.function()).loss;
  double last = first;
  for (int s = 0; s < 60; ++s) last = rt.step(all, chunks.function()).loss;
  CHECK(last < 0.7 * first);
}

TEST_CASE("Torch.AModuleThatDoesNotMatchTheLayoutIsRefused") {
  const Data data;
  auto chunks = torch_mlp(data, 1);
  ParameterLayout other;
  other.add("fc1.weight", 32 * 24);
  std::vector<float> p(other.size()), g(other.size());
  std::string what;
  try {
    libtorch::bind_module(chunks.replica(0), other, p, g);
  } catch (const ConfigError& e) {
    what = e.what();
  }
  CHECK(what.find("the module has 6 parameters; the layout has 1") != std::string::npos);
}

TEST_CASE("Torch.DeviceDataGivesHostRowsOnCpuChunks") {
  const Data data;
  const libtorch::DeviceData x(data.tx);
  CHECK(libtorch::chunk_device() == ::torch::Device(::torch::kCPU));
  const std::vector<std::uint32_t> ids{5, 0, 511};
  const ::torch::Tensor r = x.rows(ids);
  REQUIRE(r.size(0) == 3);
  CHECK(r.device() == ::torch::Device(::torch::kCPU));
  for (std::size_t i = 0; i < ids.size(); ++i) CHECK(::torch::equal(r[static_cast<std::int64_t>(i)], data.tx[ids[i]]));
  CHECK(x.on(::torch::kCPU).data_ptr() == data.tx.data_ptr());  // the host tensor itself, not a copy
}

#if !defined(STEALBATCH_TORCH_CUDA)
TEST_CASE("Torch.AGpuChunkWithACpuOnlyLibtorchIsAClearError") {
  // A chunk from a GPU device (its stream set) cannot run on a libtorch without CUDA: a ConfigError that says so
  // and how to build against a CUDA libtorch, before anything is bound or run.
  const Data data;
  auto chunks = torch_mlp(data, 1);
  std::vector<float> params = chunks.initial(), grad(params.size(), 0.0f);
  const std::vector<std::uint32_t> ids{1, 2, 3};
  double loss = 0;
  int stream = 0;
  ChunkContext ctx;
  ctx.samples = ids;
  ctx.params = params;
  ctx.grad = grad;
  ctx.loss_sum = &loss;
  ctx.stream = &stream;
  std::string what;
  try {
    chunks.function()(ctx);
  } catch (const ConfigError& e) {
    what = e.what();
  }
  CHECK(what.find("is a GPU, and this adapter was built against a libtorch without CUDA") != std::string::npos);
  CHECK(what.find("torch.utils.cmake_prefix_path") != std::string::npos);
  CHECK(std::all_of(grad.begin(), grad.end(), [](float g) { return g == 0.0f; }));
  CHECK(loss == 0);
}
#endif

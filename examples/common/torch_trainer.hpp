// What the libtorch examples share: the data as tensors, the summed loss, accuracy, the epoch loop with plain
// libtorch (--plain, for comparison), and the TrainerModel that runs a module on stealbatch through the adapter.
#pragma once

#include "trainer_cli.hpp"

#include <stealbatch/cores.hpp>
#include <stealbatch/stats.hpp>
#include <stealbatch/torch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace stealbatch::examples {

struct Tensors {
  ::torch::Tensor x, y;
};

inline Tensors tensors_of(const DenseData& d) {
  Tensors t;
  t.x = ::torch::from_blob(const_cast<float*>(d.x.data()), {static_cast<std::int64_t>(d.count), static_cast<std::int64_t>(d.features)}, ::torch::kFloat);
  t.y = ::torch::empty({static_cast<std::int64_t>(d.count)}, ::torch::kLong);
  auto* y = t.y.data_ptr<std::int64_t>();
  for (std::size_t i = 0; i < d.count; ++i) y[i] = d.y[i];
  return t;
}

// Summed, not averaged: the runtime divides by the step's sample count.
inline ::torch::Tensor summed_cross_entropy(const ::torch::Tensor& logits, const ::torch::Tensor& labels) {
  return ::torch::nn::functional::cross_entropy(logits, labels, ::torch::nn::functional::CrossEntropyFuncOptions().reduction(::torch::kSum));
}

template <class Net>
double torch_accuracy(Net& net, const Tensors& test) {
  const ::torch::NoGradGuard no_grad;
  std::int64_t correct = 0;
  const std::int64_t n = test.x.size(0);
  for (std::int64_t b = 0; b < n; b += 1000) {  // in slices: the CNN's activations for 10,000 images at once are large
    const std::int64_t e = std::min(n, b + 1000);
    correct += net.forward(test.x.slice(0, b, e)).argmax(1).eq(test.y.slice(0, b, e)).sum().template item<std::int64_t>();
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

// scheduled_lr() on every parameter group of a torch optimizer.
inline void set_scheduled_lr(::torch::optim::Optimizer& opt, const TrainerFlags& f, std::size_t step, std::size_t total) {
  for (auto& g : opt.param_groups()) g.options().set_lr(scheduled_lr(f, step, total));
}

// The same module and epochs with plain libtorch: one process, torch's own threads, torch::optim::Adam, the same
// batch, learning-rate schedule and sample order, starting from `initial` (the stealbatch run's start).
template <class Net>
void train_plain(const TrainerFlags& f, const std::function<std::shared_ptr<Net>()>& make, std::span<const float> initial, const TrainingData& data,
                 int threads) {
  ::torch::set_num_threads(threads);
  auto net = make();
  {
    const ::torch::NoGradGuard no_grad;
    std::size_t at = 0;
    for (auto& p : net->parameters()) {
      std::copy_n(initial.begin() + static_cast<std::ptrdiff_t>(at), p.numel(), p.template data_ptr<float>());
      at += static_cast<std::size_t>(p.numel());
    }
  }
  const Tensors train = tensors_of(data.train), test = tensors_of(data.test);
  ::torch::optim::Adam opt(net->parameters(), ::torch::optim::AdamOptions(f.lr));
  const std::size_t steps_per_epoch = (data.train.count + f.batch - 1) / f.batch, total = steps_per_epoch * f.epochs;
  std::size_t step = 0;
  std::vector<double> epoch_s;
  for (std::size_t epoch = 1; epoch <= f.epochs; ++epoch) {
    const std::vector<std::uint32_t> order = epoch_order(data.train.count, f.seed, epoch);
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t start = 0; start < order.size(); start += f.batch) {
      const auto ids = std::span<const std::uint32_t>(order).subspan(start, std::min(f.batch, order.size() - start));
      set_scheduled_lr(opt, f, step, total);
      ++step;
      opt.zero_grad();
      // The runtime's convention: the summed loss divided by the batch, i.e. the mean.
      const ::torch::Tensor loss =
          summed_cross_entropy(net->forward(libtorch::rows(train.x, ids)), libtorch::rows(train.y, ids)) / static_cast<double>(ids.size());
      loss.backward();
      opt.step();
    }
    epoch_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::fprintf(stderr, "[plain libtorch] epoch %zu/%zu  %.3f s\n", epoch, f.epochs, epoch_s.back());
  }
  const double med = median(std::vector<double>(epoch_s.size() > 1 ? epoch_s.begin() + 1 : epoch_s.begin(), epoch_s.end()));
  std::printf("plain libtorch, %d threads: %.0f samples/s (median epoch after the first %.3f s), test accuracy %.4f\n", threads,
              static_cast<double>(data.train.count) / med, med, torch_accuracy(*net, test));
}

// A module on stealbatch: its layout from one instance, `initial` as the start, one replica of the module per device
// (torch's intra-op threads: the cores shared among the devices), and the test accuracy on the runtime's parameters.
// `first` and `train`/`test` must outlive the returned model.
template <class Net>
TrainerModel torch_trainer_model(libtorch::ModuleChunks<Net>& first, const std::function<std::shared_ptr<Net>()>& make, std::vector<float> initial,
                                 const Tensors& train, const Tensors& test) {
  TrainerModel tm;
  tm.layout = &first.layout();
  tm.initial = std::move(initial);
  tm.chunk_function = [make, &train](std::size_t devices, int one) -> ChunkFunction {
    const int threads = one > 0 ? one : std::max(1, static_cast<int>(stealbatch::usable_cores() / devices));
    // The training set where each chunk runs: the host's tensors, and a copy on each GPU that runs chunks.
    auto x = std::make_shared<libtorch::DeviceData>(train.x), y = std::make_shared<libtorch::DeviceData>(train.y);
    auto chunks = std::make_shared<libtorch::ModuleChunks<Net>>(
        make, devices, [x](std::span<const std::uint32_t> s) { return x->rows(s); },
        [y](const ::torch::Tensor& out, std::span<const std::uint32_t> s) { return summed_cross_entropy(out, y->rows(s)); }, threads);
    ChunkFunction fn = chunks->function();
    return [chunks, fn](ChunkContext& ctx) { fn(ctx); };
  };
#if defined(STEALBATCH_TORCH_CUDA)
  tm.chunk_function_on_gpus = true;  // the adapter runs on GPU devices, on the device's copy of the training set
#else
  tm.no_gpu_reason = "this program's libtorch is CPU-only (libtorch " TORCH_VERSION " without CUDA): its modules run on cpu: devices only";
#endif
  tm.test_accuracy = [&first, &test](std::span<const float> params) {
    return first.with_parameters(params, [&](Net& net) { return torch_accuracy(net, test); });
  };
  return tm;
}

}  // namespace stealbatch::examples

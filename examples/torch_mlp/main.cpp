// torch_mlp: the MLP of `mlp` written as a torch::nn::Module, trained on stealbatch through the libtorch adapter, with
// the same flags; --plain trains the same module with plain libtorch instead (no stealbatch), for comparison.
#include "trainer_cli.hpp"

#include <stealbatch/error.hpp>
#include <stealbatch/models/mlp_model.hpp>
#include <stealbatch/torch.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

using namespace stealbatch;
using namespace stealbatch::examples;

namespace {

// 784-256-128-10 with ReLU: fc1, fc2, fc3 give the hand-written MlpModel's layout (fcN.weight out x in, fcN.bias).
struct MlpNetImpl : ::torch::nn::Module {
  explicit MlpNetImpl(const std::vector<std::int64_t>& sizes) {
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

struct Tensors {
  ::torch::Tensor x, y;
};

Tensors tensors_of(const DenseData& d) {
  Tensors t;
  t.x = ::torch::from_blob(const_cast<float*>(d.x.data()), {static_cast<std::int64_t>(d.count), static_cast<std::int64_t>(d.features)}, ::torch::kFloat);
  t.y = ::torch::empty({static_cast<std::int64_t>(d.count)}, ::torch::kLong);
  auto* y = t.y.data_ptr<std::int64_t>();
  for (std::size_t i = 0; i < d.count; ++i) y[i] = d.y[i];
  return t;
}

::torch::Tensor summed_cross_entropy(const ::torch::Tensor& logits, const ::torch::Tensor& labels) {
  return ::torch::nn::functional::cross_entropy(logits, labels, ::torch::nn::functional::CrossEntropyFuncOptions().reduction(::torch::kSum));
}

double accuracy(MlpNetImpl& net, const Tensors& test) {
  const ::torch::NoGradGuard no_grad;
  const ::torch::Tensor pred = net.forward(test.x).argmax(1);
  return pred.eq(test.y).to(::torch::kDouble).mean().item<double>();
}

// The same module and epochs with plain libtorch: one process, torch's own threads, torch::optim::Adam, the same
// batch, learning-rate schedule and sample order.
void train_plain(const TrainerFlags& f, const std::vector<std::int64_t>& sizes, const TrainingData& data, int threads) {
  ::torch::manual_seed(static_cast<std::uint64_t>(f.seed));
  ::torch::set_num_threads(threads);
  auto net = std::make_shared<MlpNetImpl>(sizes);
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
      if (f.schedule == "cosine") {
        const double progress = static_cast<double>(step) / static_cast<double>(total);
        for (auto& g : opt.param_groups()) g.options().set_lr(std::max(1e-6, f.lr * 0.5 * (1.0 + std::cos(3.141592653589793 * progress))));
      }
      ++step;
      opt.zero_grad();
      // The runtime's convention: the summed loss divided by the batch, i.e. the mean.
      const ::torch::Tensor loss = summed_cross_entropy(net->forward(libtorch::rows(train.x, ids)), libtorch::rows(train.y, ids)) /
                                   static_cast<double>(ids.size());
      loss.backward();
      opt.step();
    }
    epoch_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::fprintf(stderr, "[plain libtorch] epoch %zu/%zu  %.3f s\n", epoch, f.epochs, epoch_s.back());
  }
  std::vector<double> timed(epoch_s.size() > 1 ? epoch_s.begin() + 1 : epoch_s.begin(), epoch_s.end());
  std::sort(timed.begin(), timed.end());
  const double med = timed[timed.size() / 2];
  std::printf("plain libtorch, %d threads: %.0f samples/s (median epoch after the first %.3f s), test accuracy %.4f\n", threads,
              static_cast<double>(data.train.count) / med, med, accuracy(*net, test));
}

}  // namespace

int main(int argc, char** argv) {
  TrainerFlags f{.batch = 1024, .lr = 0.003f, .optimizer = "adam"};
  std::string hidden = "256,128";
  bool plain = false;
  int plain_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  CLI::App app{"torch_mlp: train the MLP as a torch::nn::Module on stealbatch (the libtorch adapter)"};
  add_trainer_options(app, f, [&](CLI::App& a) {
    a.add_option("--hidden", hidden, "hidden layer sizes")->capture_default_str();
    a.add_flag("--plain", plain, "train with plain libtorch instead (no stealbatch), for comparison");
    a.add_option("--plain-threads", plain_threads, "--plain: torch's intra-op threads")->check(CLI::Range(1, 256))->capture_default_str();
  });
  CLI11_PARSE(app, argc, argv);

  return run_reporting_errors("torch_mlp", [&] {
    const TrainingData data(f);
    std::vector<std::int64_t> sizes{static_cast<std::int64_t>(data.train.features)};
    for (double h : parse_number_list(hidden, "hidden")) {
      if (h < 1 || h > 65536 || h != std::floor(h)) throw ConfigError("hidden = '" + hidden + "': sizes must be whole numbers in [1, 65536]");
      sizes.push_back(static_cast<std::int64_t>(h));
    }
    sizes.push_back(10);
    std::printf("# torch_mlp: %zu train / %zu test samples, libtorch %s, %s\n", data.train.count, data.test.count, TORCH_VERSION,
                describe_configuration(f).c_str());
    if (plain) return train_plain(f, sizes, data, plain_threads);

    const Tensors train = tensors_of(data.train), test = tensors_of(data.test);
    ::torch::manual_seed(static_cast<std::uint64_t>(f.seed));
    // The layout and initial values from one module (every replica has the same layout; the runtime's values win).
    auto first = libtorch::ModuleChunks<MlpNetImpl>([&] { return std::make_shared<MlpNetImpl>(sizes); }, 1, {}, {});
    TrainerModel tm;
    tm.layout = &first.layout();
    // The hand-written MLP's He-uniform start from the same seed (the layouts are the same), so the two examples
    // train from the same weights.
    std::vector<std::size_t> usizes(sizes.begin(), sizes.end());
    tm.initial = MlpModel(usizes).initial_parameters(f.seed);
    tm.chunk_function = [&](std::size_t devices) -> ChunkFunction {
      // Each CPU device runs torch on its own threads: the cores shared among the devices.
      const int threads = std::max(1, static_cast<int>(std::max(1u, std::thread::hardware_concurrency()) / devices));
      auto chunks = std::make_shared<libtorch::ModuleChunks<MlpNetImpl>>(
          [&] { return std::make_shared<MlpNetImpl>(sizes); }, devices, [&train](std::span<const std::uint32_t> s) { return libtorch::rows(train.x, s); },
          [&train](const ::torch::Tensor& out, std::span<const std::uint32_t> s) { return summed_cross_entropy(out, libtorch::rows(train.y, s)); },
          threads);
      ChunkFunction fn = chunks->function();
      return [chunks, fn](ChunkContext& ctx) { fn(ctx); };
    };
    tm.test_accuracy = [&](std::span<const float> params) {
      return first.with_parameters(params, [&](MlpNetImpl& net) { return accuracy(net, test); });
    };
    report(f, train_policies(f, tm, data.train));
  });
}

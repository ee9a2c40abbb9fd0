// torch_gpu_check: the libtorch adapter on a GPU. Built on the GPU machine against the PyTorch there
// (perf/device_torch/), it measures, for the MLP and the CNN modules of the examples:
//   - the full-batch gradient through the adapter on cuda:0 against cpu:1, same start and batch (fp32: TF32 off);
//   - the adapter's samples/s on cuda:0 against plain libtorch eager on the same GPU: the same module, start, batch
//     and sample order, Adam, the data on the GPU; rounds interleaved, the median of the rounds' ratios.
// Synthetic data (random 28x28 images and labels): the work per sample is the dataset's.
//
//   torch_gpu_check [--json FILE] [--rounds N] [--steps N]
#include <stealbatch/cuda/backend.hpp>
#include <stealbatch/models/compare.hpp>
#include <stealbatch/models/torch_modules.hpp>
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/stats.hpp>
#include <stealbatch/torch.hpp>

#include <ATen/Context.h>
#include <CLI/CLI.hpp>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace stealbatch;
using examples::TorchCnnImpl;
using examples::TorchMlpImpl;

namespace {

constexpr std::int64_t kSamples = 16384;

struct Data {
  libtorch::DeviceData x, y;
};

Data synthetic() {
  ::torch::manual_seed(7);
  return {libtorch::DeviceData(::torch::rand({kSamples, 784})), libtorch::DeviceData(::torch::randint(0, 10, {kSamples}, ::torch::kLong))};
}

::torch::Tensor summed_loss(const ::torch::Tensor& out, const ::torch::Tensor& labels) {
  return ::torch::nn::functional::cross_entropy(out, labels, ::torch::nn::functional::CrossEntropyFuncOptions().reduction(::torch::kSum));
}

template <class Net>
std::unique_ptr<libtorch::ModuleChunks<Net>> chunks_of(const std::function<std::shared_ptr<Net>()>& make, const Data& d, std::size_t devices) {
  return std::make_unique<libtorch::ModuleChunks<Net>>(
      make, devices, [&d](std::span<const std::uint32_t> s) { return d.x.rows(s); },
      [&d](const ::torch::Tensor& out, std::span<const std::uint32_t> s) { return summed_loss(out, d.y.rows(s)); });
}

std::vector<std::uint32_t> order(std::uint64_t seed) {
  std::vector<std::uint32_t> o(kSamples);
  std::iota(o.begin(), o.end(), 0u);
  std::shuffle(o.begin(), o.end(), std::mt19937_64(seed));
  return o;
}

// The mean gradient over `batch` samples through the adapter on `devices`, from `weights`.
template <class Net>
std::vector<float> gradient(const char* devices, const std::function<std::shared_ptr<Net>()>& make, const Data& d, std::span<const float> weights,
                            std::size_t batch) {
  Runtime rt({.devices = devices, .schedule = {.chunk_size = 64}, .host = {.threads_per_device = 1}});
  auto chunks = chunks_of(make, d, rt.device_count());
  rt.register_parameters(chunks->layout(), weights);
  const std::vector<std::uint32_t> ids = order(3);
  rt.compute_gradient(std::span<const std::uint32_t>(ids).first(batch), chunks->function());
  return {rt.gradient().begin(), rt.gradient().end()};
}

double seconds_since(std::chrono::steady_clock::time_point t0) { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }

// samples/s of `steps` steps of `batch` on cuda:0 through the adapter (automatic chunk sizes, explored in `warm` steps first).
template <class Net>
double adapter_rate(const std::function<std::shared_ptr<Net>()>& make, const Data& d, std::span<const float> weights, std::size_t batch,
                    std::size_t warm, std::size_t steps, std::size_t& chunk) {
  Runtime rt({.devices = "cuda:0", .optimizer = {.kind = OptimizerKind::kAdam, .lr = 1e-3f}});
  auto chunks = chunks_of(make, d, rt.device_count());
  rt.register_parameters(chunks->layout(), weights);
  const std::vector<std::uint32_t> ids = order(11);
  const auto fn = chunks->function();
  auto batch_at = [&](std::size_t s) { return std::span<const std::uint32_t>(ids).subspan((s * batch) % (kSamples - batch), batch); };
  StepReport last;
  for (std::size_t s = 0; s < warm; ++s) last = rt.step(batch_at(s), fn);
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t s = 0; s < steps; ++s) last = rt.step(batch_at(warm + s), fn);  // a step returns once its update is done
  const double t = seconds_since(t0);
  chunk = last.devices.empty() ? 0 : last.devices[0].chunk_samples;
  return static_cast<double>(steps * batch) / t;
}

// The same with plain libtorch eager on cuda:0: one forward and backward a batch, the mean loss, torch::optim::Adam.
template <class Net>
double eager_rate(const std::function<std::shared_ptr<Net>()>& make, const Data& d, std::span<const float> weights, std::size_t batch, std::size_t warm,
                  std::size_t steps) {
  const ::torch::Device gpu(::torch::kCUDA, 0);
  auto net = make();
  {
    const ::torch::NoGradGuard no_grad;
    std::size_t at = 0;
    for (auto& p : net->parameters()) {
      p.copy_(::torch::from_blob(const_cast<float*>(weights.data() + at), p.sizes(), ::torch::kFloat));
      at += static_cast<std::size_t>(p.numel());
    }
  }
  net->to(gpu);
  ::torch::optim::Adam opt(net->parameters(), ::torch::optim::AdamOptions(1e-3));
  const ::torch::Tensor x = d.x.on(gpu), y = d.y.on(gpu);
  const std::vector<std::uint32_t> ids = order(11);
  auto one = [&](std::size_t s) {
    const auto b = std::span<const std::uint32_t>(ids).subspan((s * batch) % (kSamples - batch), batch);
    opt.zero_grad();
    const ::torch::Tensor loss = summed_loss(net->forward(libtorch::rows(x, b)), libtorch::rows(y, b)) / static_cast<double>(batch);
    loss.backward();
    opt.step();
  };
  for (std::size_t s = 0; s < warm; ++s) one(s);
  ::torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t s = 0; s < steps; ++s) one(warm + s);
  ::torch::cuda::synchronize();
  return static_cast<double>(steps * batch) / seconds_since(t0);
}

struct Figures {
  std::string model;
  std::size_t batch = 0, chunk = 0;
  double gradient_error = -1, ours = 0, eager = 0, ratio = 0;
};

template <class Net>
Figures check(const char* name, const std::function<std::shared_ptr<Net>()>& make, const Data& d, std::size_t batch, std::size_t rounds,
              std::size_t steps) {
  Figures f{name, batch};
  ::torch::manual_seed(1);
  const std::vector<float> weights = libtorch::values_of(*make());
  f.gradient_error = examples::max_relative_error(gradient<Net>("cuda:0", make, d, weights, batch), gradient<Net>("cpu:1", make, d, weights, batch));
  std::printf("%s: gradient on cuda:0 against cpu:1, batch %zu: max relative error %.3g (target 1e-4)\n", name, batch, f.gradient_error);
  std::fflush(stdout);
  std::vector<double> ratios, ours, eager;
  for (std::size_t r = 0; r < rounds; ++r) {
    ours.push_back(adapter_rate<Net>(make, d, weights, batch, 60, steps, f.chunk));
    eager.push_back(eager_rate<Net>(make, d, weights, batch, 10, steps));
    ratios.push_back(ours.back() / eager.back());
    std::printf("%s: round %zu: adapter %.0f samples/s (chunk %zu), eager %.0f samples/s, ratio %.3f\n", name, r + 1, ours.back(), f.chunk,
                eager.back(), ratios.back());
    std::fflush(stdout);
  }
  f.ours = median(ours), f.eager = median(eager), f.ratio = median(ratios);
  std::printf("%s: adapter/eager on cuda:0, batch %zu: %.3fx (median of %zu rounds; target 0.9x)\n", name, batch, f.ratio, rounds);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json;
  std::size_t rounds = 3, steps = 100;
  CLI::App app{"torch_gpu_check: the libtorch adapter on cuda:0, its gradient against cpu:1 and its samples/s against eager libtorch"};
  app.add_option("--json", json, "also write the figures to this file");
  app.add_option("--rounds", rounds, "interleaved rounds of adapter and eager (the median ratio is reported)")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--steps", steps, "timed steps per round and side")->check(CLI::Range(1, 100000))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    cuda::enable();
    if (!::torch::cuda::is_available()) throw ConfigError("torch sees no GPU");
    // fp32 on both sides: TF32 would differ from the CPU by far more than the 1e-4 compared.
    at::globalContext().setAllowTF32CuBLAS(false);
    at::globalContext().setAllowTF32CuDNN(false);
    ::torch::set_num_threads(1);
    const Data d = synthetic();
    const std::function<std::shared_ptr<TorchMlpImpl>()> mlp = [] { return std::make_shared<TorchMlpImpl>(std::vector<std::int64_t>{784, 256, 128, 10}); };
    const std::function<std::shared_ptr<TorchCnnImpl>()> cnn = [] { return std::make_shared<TorchCnnImpl>(); };
    // Each model on its own: a failure in one (an exception, a CUDA error that torch reports) is recorded, and the
    // other still runs.
    std::vector<Figures> all;
    std::string errors;
    const auto attempt = [&](const char* name, const std::function<Figures()>& body) {
      try {
        all.push_back(body());
      } catch (const std::exception& e) {
        std::string what = e.what();
        what = what.substr(0, what.find('\n'));  // torch's messages carry a backtrace after the first line
        for (char& c : what) c = (c == '"' || c == '\\') ? '\'' : (static_cast<unsigned char>(c) < 0x20 ? ' ' : c);  // a JSON string
        errors += std::string(errors.empty() ? "" : ", ") + "\"" + name + "\": \"" + what + "\"";
        std::fprintf(stderr, "torch_gpu_check: %s: %s\n", name, what.c_str());
      }
    };
    attempt("torch_mlp", [&] { return check<TorchMlpImpl>("torch_mlp", mlp, d, 1024, rounds, steps); });
    attempt("torch_cnn", [&] { return check<TorchCnnImpl>("torch_cnn", cnn, d, 256, rounds, steps); });
    bool ok = errors.empty();
    // A figure in JSON: a NaN or an infinity (a broken gradient) as a string, which no gate reads as a pass.
    const auto figure = [](double x) {
      char b[64];
      if (std::isfinite(x)) std::snprintf(b, sizeof b, "%.6g", x);
      else std::snprintf(b, sizeof b, "\"%s\"", std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf"));
      return std::string(b);
    };
    std::string out = "{\"torch\": \"" TORCH_VERSION "\", \"models\": [";
    for (std::size_t i = 0; i < all.size(); ++i) {
      const Figures& f = all[i];
      ok = ok && f.gradient_error >= 0 && f.gradient_error <= 1e-4;
      char row[512];
      std::snprintf(row, sizeof row,
                    "%s{\"model\": \"%s\", \"batch\": %zu, \"chunk\": %zu, \"gradient_error\": %s, \"adapter_samples_per_s\": %.1f, "
                    "\"eager_samples_per_s\": %.1f, \"ratio\": %.4f}",
                    i ? ", " : "", f.model.c_str(), f.batch, f.chunk, figure(f.gradient_error).c_str(), f.ours, f.eager, f.ratio);
      out += row;
    }
    out += "], \"errors\": {" + errors + "}}\n";
    if (!json.empty()) {
      if (std::FILE* fp = std::fopen(json.c_str(), "w")) {
        std::fputs(out.c_str(), fp);
        std::fclose(fp);
      }
    }
    std::fputs(out.c_str(), stdout);
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_gpu_check: %s\n", e.what());
    return 1;
  }
}

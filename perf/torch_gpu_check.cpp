// torch_gpu_check: the libtorch adapter on a GPU. Built on the GPU machine against the PyTorch there
// (perf/device_torch/), it measures, for the MLP and the CNN modules of the examples:
//   - the full-batch gradient through the adapter on cuda:0 against cpu:1, same start and batch (fp32: TF32 off);
//   - the adapter's samples/s on cuda:0 against plain libtorch eager on the same GPU: the same module, start, batch
//     and sample order, Adam, the data on the GPU; rounds interleaved, the median of the rounds' ratios.
// Synthetic data (random 28x28 images and labels): the work per sample is the dataset's. Then TorchLm, the byte-level
// transformer of examples/torch_lm, on synthetic documents of long-tailed lengths (lognormal, median 300 bytes, within
// [16, 512]), packed, each step given each document's tokens as its cost:
//   - the gradient of a 64-document batch through the adapter on cuda:0 against cpu:1;
//   - tokens/s through the adapter on cuda:0 against plain libtorch eager on it (the same batches, Adam);
//   - tokens/s of static against steal on four equal vgpu parts of GPU 0, each batch grouped by length (longest
//     first): the equal split gives the first part the long documents;
//   - at a realistic size (256 documents a step, median 600 bytes, up to 2048): static, steal and the packer on four
//     equal parts and on parts of 48, 24, 24 and 24 SMs, grouped and shuffled (one run each, within a time budget).
//
//   torch_gpu_check [--json FILE] [--rounds N] [--steps N]
//
// Exit status: 0 every figure within its bound and the JSON written; 1 otherwise (no GPU, a model failed, the JSON
// could not be written); 2 a usage error (a flag, its value, an unwritable --json), found before anything runs.
#include "tool_cli.hpp"

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
using examples::TorchLmImpl;
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

// A module for plain libtorch: made, its parameters set to `weights` (values_of()'s order), moved to `gpu`.
template <class Net>
std::shared_ptr<Net> on_gpu(const std::function<std::shared_ptr<Net>()>& make, std::span<const float> weights, const ::torch::Device& gpu) {
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
  return net;
}

// The same with plain libtorch eager on cuda:0: one forward and backward a batch, the mean loss, torch::optim::Adam.
template <class Net>
double eager_rate(const std::function<std::shared_ptr<Net>()>& make, const Data& d, std::span<const float> weights, std::size_t batch, std::size_t warm,
                  std::size_t steps) {
  const ::torch::Device gpu(::torch::kCUDA, 0);
  auto net = on_gpu(make, weights, gpu);
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

// TorchLm's documents: synthetic bytes (printable ASCII) of long-tailed lengths. The adapter's row: 64 a step, up to
// 512 bytes; the realistic one: 256 a step, up to 2048 bytes.
constexpr std::int64_t kLmMaxLen = 512, kLargeMaxLen = 2048;
constexpr std::size_t kDocs = 4096, kLmBatch = 64, kLargeBatch = 256;  // kDocs a multiple of both batches
const char* const kLmParts = "vgpu:4";  // four equal parts of what the driver can partition (24 SMs each on an H200)
// The realistic row's parts: four equal ones, and unequal ones that fit the H200's 15 groups of 8 SMs (120).
const char* const kLargeParts[] = {"vgpu:4", "vgpu:48,24,24,24"};

struct Docs {
  std::vector<std::vector<std::uint8_t>> bytes;
  std::vector<std::uint32_t> order;  // shuffled once; batch s is order[s * per_batch, (s + 1) * per_batch) (mod kDocs)
  std::size_t per_batch = kLmBatch;
  std::span<const std::uint8_t> of(std::uint32_t i) const { return bytes[i]; }
  std::vector<std::uint32_t> batch(std::size_t s, bool grouped) const {
    const auto at = static_cast<std::ptrdiff_t>((s * per_batch) % kDocs);
    std::vector<std::uint32_t> b(order.begin() + at, order.begin() + at + static_cast<std::ptrdiff_t>(per_batch));
    if (grouped) std::stable_sort(b.begin(), b.end(), [this](std::uint32_t x, std::uint32_t y) { return bytes[x].size() > bytes[y].size(); });
    return b;
  }
  std::vector<double> tokens(std::span<const std::uint32_t> b) const {
    std::vector<double> t(b.size());
    for (std::size_t i = 0; i < b.size(); ++i) t[i] = static_cast<double>(bytes[b[i]].size());
    return t;
  }
};

Docs synthetic_docs(std::size_t per_batch = kLmBatch, std::int64_t max_len = kLmMaxLen, double median_len = 300) {
  std::mt19937_64 rng(5);
  std::lognormal_distribution<double> len(std::log(median_len), 0.9);
  std::uniform_int_distribution<int> byte(32, 126);
  Docs d;
  d.per_batch = per_batch;
  d.bytes.resize(kDocs);
  for (auto& doc : d.bytes) {
    doc.resize(static_cast<std::size_t>(std::clamp(std::round(len(rng)), 16.0, static_cast<double>(max_len))));
    for (auto& b : doc) b = static_cast<std::uint8_t>(byte(rng));
  }
  d.order.resize(kDocs);
  std::iota(d.order.begin(), d.order.end(), 0u);
  std::shuffle(d.order.begin(), d.order.end(), std::mt19937_64(13));
  return d;
}

// A chunk's documents, built on the chunk's device by the input function and read by the loss in the same call.
libtorch::Sequences& last_sequences() {
  thread_local libtorch::Sequences s;
  return s;
}

using LmChunks = libtorch::ModuleChunks<TorchLmImpl, libtorch::Sequences>;
using MakeLm = std::function<std::shared_ptr<TorchLmImpl>()>;

std::unique_ptr<LmChunks> lm_chunks(const MakeLm& make, const Docs& d, std::size_t devices) {
  return std::make_unique<LmChunks>(
      make, devices,
      [&d](std::span<const std::uint32_t> s) {
        return last_sequences() = libtorch::make_sequences(s, [&d](std::uint32_t i) { return d.of(i); }, libtorch::SequenceForm::kPacked,
                                                           libtorch::SequenceMask::kNone).to(libtorch::chunk_device());
      },
      [](const ::torch::Tensor& out, std::span<const std::uint32_t>) { return examples::next_byte_loss(out, libtorch::to_device(last_sequences(), out.device())); });
}

std::vector<float> lm_gradient(const char* devices, const MakeLm& make, const Docs& d, std::span<const float> weights) {
  Runtime rt({.devices = devices, .schedule = {.chunk_size = 8}, .host = {.threads_per_device = 1}});
  auto chunks = lm_chunks(make, d, rt.device_count());
  rt.register_parameters(chunks->layout(), weights);
  const std::vector<std::uint32_t> b = d.batch(0, false);
  rt.compute_gradient(b, chunks->function(), d.tokens(b));
  return {rt.gradient().begin(), rt.gradient().end()};
}

// tokens/s of `steps` steps through the adapter on `devices` (after `warm` untimed ones), each step given its tokens.
double lm_adapter_rate(const char* devices, SchedulePolicy policy, std::size_t chunk, bool grouped, const MakeLm& make, const Docs& d,
                       std::span<const float> weights, std::size_t warm, std::size_t steps, PlacementPolicy placement = PlacementPolicy::kAuto) {
  Runtime rt({.devices = devices,
              .schedule = {.chunk_size = chunk, .policy = policy, .placement = placement},
              .optimizer = {.kind = OptimizerKind::kAdam, .lr = 1e-3f}});
  auto chunks = lm_chunks(make, d, rt.device_count());
  rt.register_parameters(chunks->layout(), weights);
  const auto fn = chunks->function();
  for (std::size_t s = 0; s < warm; ++s) {
    const std::vector<std::uint32_t> b = d.batch(s, grouped);
    rt.step(b, fn, d.tokens(b));
  }
  double tokens = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t s = 0; s < steps; ++s) {
    const std::vector<std::uint32_t> b = d.batch(warm + s, grouped);
    const std::vector<double> t = d.tokens(b);
    rt.step(b, fn, t);  // a step returns once its update is done
    tokens += std::accumulate(t.begin(), t.end(), 0.0);
  }
  return tokens / seconds_since(t0);
}

// The same batches with plain libtorch eager on cuda:0: the batch packed, one forward and backward, torch::optim::Adam.
double lm_eager_rate(const MakeLm& make, const Docs& d, std::span<const float> weights, std::size_t warm, std::size_t steps) {
  const ::torch::Device gpu(::torch::kCUDA, 0);
  auto net = on_gpu(make, weights, gpu);
  ::torch::optim::Adam opt(net->parameters(), ::torch::optim::AdamOptions(1e-3));
  double tokens = 0;
  auto one = [&](std::size_t s) {
    const std::vector<std::uint32_t> b = d.batch(s, false);
    const libtorch::Sequences x =
        libtorch::make_sequences(b, [&d](std::uint32_t i) { return d.of(i); }, libtorch::SequenceForm::kPacked, libtorch::SequenceMask::kNone).to(gpu);
    opt.zero_grad();
    const ::torch::Tensor loss = examples::next_byte_loss(net->forward(x), x) / static_cast<double>(b.size());
    loss.backward();
    opt.step();
    return static_cast<double>(x.token_count());
  };
  for (std::size_t s = 0; s < warm; ++s) one(s);
  ::torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t s = 0; s < steps; ++s) tokens += one(warm + s);
  ::torch::cuda::synchronize();
  return tokens / seconds_since(t0);
}

struct LmFigures {
  double gradient_error = -1, ours = 0, eager = 0, ratio = 0, part_static = 0, part_steal = 0, part_speedup = 0;
};

LmFigures check_lm(const Docs& d, std::size_t rounds, std::size_t steps) {
  const MakeLm make = [] { return std::make_shared<TorchLmImpl>(examples::TorchLmOptions{.width = 128, .layers = 2, .heads = 4, .max_len = kLmMaxLen}); };
  LmFigures f;
  ::torch::manual_seed(1);
  const std::vector<float> weights = libtorch::values_of(*make());
  f.gradient_error = examples::max_relative_error(lm_gradient("cuda:0", make, d, weights), lm_gradient("cpu:1", make, d, weights));
  std::printf("torch_lm: gradient on cuda:0 against cpu:1, %zu documents packed: max relative error %.3g (target 1e-4)\n", kLmBatch, f.gradient_error);
  std::fflush(stdout);
  const std::size_t lm_steps = std::max<std::size_t>(10, steps / 4);
  std::vector<double> ours, eager, ratios, part_static, part_steal, speedups;
  for (std::size_t r = 0; r < rounds; ++r) {
    ours.push_back(lm_adapter_rate("cuda:0", SchedulePolicy::kSteal, 0, false, make, d, weights, 5, lm_steps));
    eager.push_back(lm_eager_rate(make, d, weights, 5, lm_steps));
    ratios.push_back(ours.back() / eager.back());
    part_static.push_back(lm_adapter_rate(kLmParts, SchedulePolicy::kStatic, 4, true, make, d, weights, 5, lm_steps));
    part_steal.push_back(lm_adapter_rate(kLmParts, SchedulePolicy::kSteal, 4, true, make, d, weights, 5, lm_steps));
    speedups.push_back(part_steal.back() / part_static.back());
    std::printf("torch_lm: round %zu: adapter %.0f tokens/s, eager %.0f, ratio %.3f; %s grouped: static %.0f, steal %.0f tokens/s, %.2fx\n", r + 1,
                ours.back(), eager.back(), ratios.back(), kLmParts, part_static.back(), part_steal.back(), speedups.back());
    std::fflush(stdout);
  }
  f.ours = median(ours), f.eager = median(eager), f.ratio = median(ratios);
  f.part_static = median(part_static), f.part_steal = median(part_steal), f.part_speedup = median(speedups);
  std::printf("torch_lm: adapter/eager on cuda:0: %.3fx; steal/static on %s, grouped: %.2fx (medians of %zu rounds)\n", f.ratio, kLmParts,
              f.part_speedup, rounds);
  return f;
}

// TorchLm at a realistic size: 256 documents a step of up to 2048 bytes, on equal and unequal parts, each batch grouped
// by length and shuffled; static (equal samples), steal (each step's tokens as its costs) and the packer (static,
// packed by tokens, blind to the parts' speeds). One timed run of each, in that order, part spec after part spec,
// until kLargeBudgetS have gone (the rest is left out and said so: the device check's step has a deadline, and the
// JSON is written at the end).
constexpr double kLargeBudgetS = 75;
struct LargeRow {
  std::string parts, order;
  double static_rate = 0, steal_rate = 0, packer_rate = 0;
};

std::vector<LargeRow> check_lm_large(std::size_t steps) {
  const MakeLm make = [] { return std::make_shared<TorchLmImpl>(examples::TorchLmOptions{.width = 128, .layers = 2, .heads = 4, .max_len = kLargeMaxLen}); };
  ::torch::manual_seed(2);
  const std::vector<float> weights = libtorch::values_of(*make());
  const Docs d = synthetic_docs(kLargeBatch, kLargeMaxLen, 600);
  std::vector<LargeRow> rows;
  const auto t0 = std::chrono::steady_clock::now();
  for (const char* parts : kLargeParts) {
    for (const bool grouped : {true, false}) {
      if (seconds_since(t0) > kLargeBudgetS) {
        std::printf("torch_lm large: %s %s left out: %.0f s of its %.0f s budget used\n", parts, grouped ? "grouped" : "shuffled", seconds_since(t0),
                    kLargeBudgetS);
        continue;
      }
      LargeRow r{parts, grouped ? "grouped" : "shuffled"};
      r.static_rate = lm_adapter_rate(parts, SchedulePolicy::kStatic, 8, grouped, make, d, weights, 2, steps);
      r.steal_rate = lm_adapter_rate(parts, SchedulePolicy::kSteal, 8, grouped, make, d, weights, 2, steps);
      r.packer_rate = lm_adapter_rate(parts, SchedulePolicy::kStatic, 8, grouped, make, d, weights, 2, steps, PlacementPolicy::kPacked);
      std::printf("torch_lm large: %s %s, %zu documents up to %lld bytes: static %.0f, steal %.0f, packer %.0f tokens/s; steal %.2fx static, "
                  "%.2fx the packer\n",
                  parts, r.order.c_str(), kLargeBatch, static_cast<long long>(kLargeMaxLen), r.static_rate, r.steal_rate, r.packer_rate,
                  r.steal_rate / r.static_rate, r.steal_rate / r.packer_rate);
      std::fflush(stdout);
      rows.push_back(r);
    }
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json;
  std::size_t rounds = 3, steps = 100;
  CLI::App app{"torch_gpu_check: the libtorch adapter on cuda:0 (MLP, CNN, TorchLm), its gradient against cpu:1 and its throughput against eager "
               "libtorch; TorchLm's static against steal on vgpu parts"};
  app.add_option("--json", json, "also write the figures to this file");
  app.add_option("--rounds", rounds, "interleaved rounds of adapter and eager (the median ratio is reported)")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--steps", steps, "timed steps per round and side")->check(CLI::Range(1, 100000))->capture_default_str();
  app.footer("Exit status: 0 every figure within its bound and the JSON written; 1 otherwise (no GPU, a model failed, the JSON could not "
             "be written); 2 a usage error (a flag, its value, an unwritable --json), found before anything runs.");
  if (const int rc = perf::parse(app, argc, argv); rc >= 0) return rc;
  if (!perf::check_output_file("torch_gpu_check", app, "--json", json)) return perf::kExitUsage;
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
    const auto attempt = [&](const char* name, const std::function<void()>& body) {
      try {
        body();
      } catch (const std::exception& e) {
        std::string what = e.what();
        what = what.substr(0, what.find('\n'));  // torch's messages carry a backtrace after the first line
        for (char& c : what) c = (c == '"' || c == '\\') ? '\'' : (static_cast<unsigned char>(c) < 0x20 ? ' ' : c);  // a JSON string
        errors += std::string(errors.empty() ? "" : ", ") + "\"" + name + "\": \"" + what + "\"";
        std::fprintf(stderr, "torch_gpu_check: %s: %s\n", name, what.c_str());
      }
    };
    attempt("torch_mlp", [&] { all.push_back(check<TorchMlpImpl>("torch_mlp", mlp, d, 1024, rounds, steps)); });
    attempt("torch_cnn", [&] { all.push_back(check<TorchCnnImpl>("torch_cnn", cnn, d, 256, rounds, steps)); });
    LmFigures lm;
    bool lm_ran = false;
    attempt("torch_lm", [&] {
      lm = check_lm(synthetic_docs(), rounds, steps);
      lm_ran = true;
    });
    std::vector<LargeRow> large;
    attempt("torch_lm_large", [&] { large = check_lm_large(std::max<std::size_t>(4, steps / 16)); });
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
    out += "]";
    if (lm_ran) {
      ok = ok && lm.gradient_error >= 0 && lm.gradient_error <= 1e-4;
      char row[768];
      std::snprintf(row, sizeof row,
                    ", \"lm\": {\"model\": \"torch_lm\", \"documents\": %zu, \"gradient_error\": %s, \"adapter_tokens_per_s\": %.1f, "
                    "\"eager_tokens_per_s\": %.1f, \"ratio\": %.4f, \"parts\": \"%s\", \"static_tokens_per_s\": %.1f, \"steal_tokens_per_s\": %.1f, "
                    "\"steal_over_static\": %.4f}",
                    kLmBatch, figure(lm.gradient_error).c_str(), lm.ours, lm.eager, lm.ratio, kLmParts, lm.part_static, lm.part_steal, lm.part_speedup);
      out += row;
    }
    if (!large.empty()) {
      out += ", \"lm_large\": [";
      for (std::size_t i = 0; i < large.size(); ++i) {
        const LargeRow& r = large[i];
        char row[512];
        std::snprintf(row, sizeof row,
                      "%s{\"parts\": \"%s\", \"order\": \"%s\", \"documents\": %zu, \"max_bytes\": %lld, \"static_tokens_per_s\": %.1f, "
                      "\"steal_tokens_per_s\": %.1f, \"packer_tokens_per_s\": %.1f}",
                      i ? ", " : "", r.parts.c_str(), r.order.c_str(), kLargeBatch, static_cast<long long>(kLargeMaxLen), r.static_rate, r.steal_rate,
                      r.packer_rate);
        out += row;
      }
      out += "]";
    }
    out += ", \"errors\": {" + errors + "}}\n";
    std::fputs(out.c_str(), stdout);
    if (!json.empty() && !perf::write_output("torch_gpu_check", "--json", json, out)) return 1;
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_gpu_check: %s\n", e.what());
    return 1;
  }
}

// custom_trainer: the smallest complete trainer on the stealbatch API: a model, a chunk function, steps.
//
// It fits a linear model y = w.x + b to noisy synthetic data by mean squared error. Everything a trainer must
// provide is here: a parameter layout with initial values, and a chunk function that adds the gradient of its
// samples (a sum, not a mean) to ctx.grad. The runtime does the rest: it cuts each batch into chunks, lets idle
// devices steal them, sums the devices' gradients, divides by the batch size, and applies the optimizer.
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/sha256.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  using namespace stealbatch;
  // custom_trainer [DEVICES] [--deterministic]: the same parameter bytes on any devices with the second.
  const std::string devices = argc > 1 ? argv[1] : "cpu:2";
  const bool deterministic = argc > 2 && std::string(argv[2]) == "--deterministic";
  constexpr std::size_t kFeatures = 16, kSamples = 4096, kBatch = 256;

  // The data: y = true_w . x + 0.5, plus a little noise.
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> true_w(kFeatures), x(kSamples * kFeatures), y(kSamples);
  for (float& w : true_w) w = normal(rng);
  for (std::size_t i = 0; i < kSamples; ++i) {
    float dot = 0.5f;
    for (std::size_t j = 0; j < kFeatures; ++j) dot += true_w[j] * (x[i * kFeatures + j] = normal(rng));
    y[i] = dot + 0.01f * normal(rng);
  }

  // The model: one weight vector and one bias in a flat buffer.
  ParameterLayout layout;
  const std::size_t w_id = layout.add("w", kFeatures);
  const std::size_t b_id = layout.add("b", 1);
  const std::vector<float> initial(layout.size(), 0.0f);

  // The chunk function: squared error 0.5 (w.x + b - y)^2, gradient added (not assigned) into ctx.grad.
  const ChunkFunction fn = [&](ChunkContext& ctx) {
    const std::span<const float> w = ctx.layout->view(ctx.params, w_id);
    const float b = ctx.layout->view(ctx.params, b_id)[0];
    std::span<float> gw = ctx.layout->view(ctx.grad, w_id);
    std::span<float> gb = ctx.layout->view(ctx.grad, b_id);
    double loss = 0;
    for (std::uint32_t s : ctx.samples) {
      const float* xs = &x[s * kFeatures];
      const float err = std::inner_product(w.begin(), w.end(), xs, b) - y[s];
      for (std::size_t j = 0; j < kFeatures; ++j) gw[j] += err * xs[j];
      gb[0] += err;
      loss += 0.5 * err * err;
    }
    ctx.add_loss(loss);
  };

  try {
    Runtime rt({.devices = devices, .schedule = {.chunk_size = 16, .deterministic = deterministic}, .optimizer = {.kind = OptimizerKind::kSgd, .lr = 0.1f}});
    rt.register_parameters(layout, initial);
    std::vector<std::uint32_t> order(kSamples);
    std::iota(order.begin(), order.end(), 0u);
    for (int epoch = 1; epoch <= 8; ++epoch) {
      std::shuffle(order.begin(), order.end(), rng);
      double loss = 0, seconds = 0;
      std::uint64_t steals = 0;
      for (std::size_t start = 0; start < kSamples; start += kBatch) {
        const StepReport r = rt.step(std::span<const std::uint32_t>(order).subspan(start, kBatch), fn);
        loss += r.loss * static_cast<double>(r.samples);
        seconds += r.step_s;
        steals += r.steals;
      }
      std::printf("epoch %d: mean loss %.6f, %.1f ms, %llu chunks stolen\n", epoch, loss / kSamples, seconds * 1e3,
                  static_cast<unsigned long long>(steals));
    }
    // How close the learned weights are to the truth (every replica holds the same values).
    const std::vector<float> kept = rt.parameters(0);
    const std::span<const float> params(kept);
    const std::span<const float> w = layout.view(params, w_id);
    double err = 0;
    for (std::size_t j = 0; j < kFeatures; ++j) err = std::max(err, static_cast<double>(std::abs(w[j] - true_w[j])));
    const float b = layout.view(params, b_id)[0];
    std::printf("max |w - true w| = %.4f, b = %.4f (true 0.5), on %zu devices\n", err, b, rt.device_count());
    std::printf("parameters sha256 %s\n", sha256_hex(std::as_bytes(params)).c_str());
    return err < 0.05 && std::abs(b - 0.5f) < 0.05f ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "custom_trainer: %s\n", e.what());
    return 2;
  }
}

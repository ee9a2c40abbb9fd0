// CnnModel: the specified layout and initialization, the pooling tie rule, the gradient against finite differences,
// the Runtime's gradient against the sequential one, and a short training run on Fashion-MNIST that learns.
#include <stealbatch/models/cnn_model.hpp>
#include "model_test_support.hpp"

#include <stealbatch/error.hpp>
#include <stealbatch/data/idx.hpp>
#include <stealbatch/runtime/runtime.hpp>

#include <doctest/doctest.h>
#include <test_support.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace stealbatch;
using examples::CnnModel;
using examples::DenseData;
using namespace stealbatch::testing;

namespace {

// The network in double, written from the specification with direct loops (no im2col, no BLAS): an independent
// forward pass. Returns the summed cross-entropy of the samples.
double reference_loss(const ParameterLayout& layout, std::span<const double> p, const DenseData& d, std::span<const std::uint32_t> samples) {
  auto tensor = [&](std::size_t i) { return layout.view(p, i); };
  // 5x5 cross-correlation, zero padding 2, + bias, ReLU, then 2x2 max-pooling: [c][side][side] -> [o][side/2][side/2].
  auto conv_relu_pool = [](const std::vector<double>& in, std::size_t channels, std::size_t side, std::span<const double> w,
                           std::span<const double> b, std::size_t outs) {
    const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(side);
    std::vector<double> conv(outs * side * side);
    for (std::size_t o = 0; o < outs; ++o) {
      for (std::size_t y = 0; y < side; ++y) {
        for (std::size_t x = 0; x < side; ++x) {
          double s = b[o];
          for (std::size_t c = 0; c < channels; ++c) {
            for (std::size_t ky = 0; ky < 5; ++ky) {
              for (std::size_t kx = 0; kx < 5; ++kx) {
                const std::ptrdiff_t sy = static_cast<std::ptrdiff_t>(y + ky) - 2, sx = static_cast<std::ptrdiff_t>(x + kx) - 2;
                if (sy < 0 || sy >= n || sx < 0 || sx >= n) continue;
                s += w[((o * channels + c) * 5 + ky) * 5 + kx] * in[(c * side + static_cast<std::size_t>(sy)) * side + static_cast<std::size_t>(sx)];
              }
            }
          }
          conv[(o * side + y) * side + x] = std::max(s, 0.0);
        }
      }
    }
    const std::size_t half = side / 2;
    std::vector<double> pool(outs * half * half);
    for (std::size_t o = 0; o < outs; ++o) {
      for (std::size_t y = 0; y < half; ++y) {
        for (std::size_t x = 0; x < half; ++x) {
          const double* w0 = conv.data() + (o * side + 2 * y) * side + 2 * x;
          pool[(o * half + y) * half + x] = std::max({w0[0], w0[1], w0[side], w0[side + 1]});
        }
      }
    }
    return pool;
  };
  auto dense = [](const std::vector<double>& in, std::span<const double> w, std::span<const double> b, bool relu) {
    std::vector<double> out(b.size());
    for (std::size_t o = 0; o < out.size(); ++o) {
      double s = b[o];
      for (std::size_t i = 0; i < in.size(); ++i) s += w[o * in.size() + i] * in[i];
      out[o] = relu ? std::max(s, 0.0) : s;
    }
    return out;
  };
  double loss = 0;
  for (std::uint32_t s : samples) {
    const std::vector<double> image(d.x.begin() + static_cast<std::ptrdiff_t>(s * d.features),
                                    d.x.begin() + static_cast<std::ptrdiff_t>((s + 1) * d.features));
    const std::vector<double> pool1 = conv_relu_pool(image, 1, 28, tensor(0), tensor(1), 16);
    const std::vector<double> pool2 = conv_relu_pool(pool1, 16, 14, tensor(2), tensor(3), 32);  // flattened (c, y, x)
    const std::vector<double> hidden = dense(pool2, tensor(4), tensor(5), true);
    const std::vector<double> z = dense(hidden, tensor(6), tensor(7), false);
    const double zmax = *std::max_element(z.begin(), z.end());
    double denom = 0;
    for (double v : z) denom += std::exp(v - zmax);
    loss += std::log(denom) - (z[d.y[s]] - zmax);
  }
  return loss;
}

}  // namespace

TEST_CASE("Cnn.LayoutAndInitializationAreTheSpecifiedOnes") {
  const CnnModel model;
  const std::vector<std::pair<std::string, std::size_t>> expected = {
      {"conv1.weight", 16 * 1 * 5 * 5}, {"conv1.bias", 16}, {"conv2.weight", 32 * 16 * 5 * 5}, {"conv2.bias", 32},
      {"fc1.weight", 128 * 1568},       {"fc1.bias", 128},  {"fc2.weight", 10 * 128},         {"fc2.bias", 10}};
  REQUIRE(model.layout().tensor_count() == expected.size());
  std::size_t offset = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(i);
    CHECK(model.layout().tensor(i).name == expected[i].first);
    CHECK(model.layout().tensor(i).size == expected[i].second);
    CHECK(model.layout().tensor(i).offset == offset);
    offset += expected[i].second;
  }
  CHECK(model.layout().size() == offset);

  // The weights, drawn in layout order from one generator; the biases 0.
  const std::vector<float> p = model.initial_parameters(42);
  std::mt19937_64 rng(42);
  std::vector<float> want(p.size(), 0.0f);
  const std::pair<std::size_t, std::size_t> weights[] = {{0, 25}, {2, 400}, {4, 1568}, {6, 128}};  // tensor, fan_in
  for (const auto& [tensor, fan_in] : weights) {
    const float bound = std::sqrt(6.0f / static_cast<float>(fan_in));
    std::uniform_real_distribution<float> u(-bound, bound);
    const TensorView& t = model.layout().tensor(tensor);
    for (std::size_t i = 0; i < t.size; ++i) want[t.offset + i] = u(rng);
  }
  CHECK(p == want);
  CHECK(model.initial_parameters(42) == p);
  CHECK(model.initial_parameters(43) != p);

  // Rows that are not 28x28 images are refused, not misread.
  const std::vector<float> rows(2 * 100, 0.5f);
  const std::vector<std::uint8_t> labels(2, 1);
  std::vector<float> grad(p.size(), 0.0f);
  CnnModel::Workspace ws;
  const std::vector<std::uint32_t> both{0, 1};
  CHECK_THROWS_AS(model.accumulate_gradient(p, grad, DenseData{2, 100, rows, labels}, both, ws), DataError);
}

TEST_CASE("Cnn.PoolTieGoesToTheFirstMaximum") {
  // conv1's weights at 0 and its biases at 1 make every conv1 output 1: every 2x2 window ties. The input is nonzero
  // only at odd (y, x), so conv1's weight gradient at tap (ky, kx), a sum of d(conv1) * input[y + ky - 2][x + kx - 2]
  // over the windows' winners (y, x), is nonzero only where (y + ky, x + kx) is odd: with the winner at the window's
  // (0, 0) (even y and x), exactly at the taps with odd ky and odd kx.
  const CnnModel model;
  std::vector<float> params = model.initial_parameters(3);
  const std::span<float> all(params);
  std::ranges::fill(model.layout().view(all, 0), 0.0f);
  std::ranges::fill(model.layout().view(all, 1), 1.0f);
  std::vector<float> x(28 * 28, 0.0f);
  for (std::size_t y = 1; y < 28; y += 2) {
    for (std::size_t c = 1; c < 28; c += 2) x[y * 28 + c] = 0.25f + static_cast<float>((y * 7 + c * 3) % 11) / 11.0f;
  }
  const std::vector<std::uint8_t> label{3};
  const DenseData data{1, 784, x, label};
  std::vector<float> grad(params.size(), 0.0f);
  CnnModel::Workspace ws;
  const std::uint32_t sample = 0;
  (void)model.accumulate_gradient(params, grad, data, std::span<const std::uint32_t>(&sample, 1), ws);
  const std::span<const float> dw1 = model.layout().view(std::span<const float>(grad), 0);
  for (std::size_t o = 0; o < 16; ++o) {
    for (std::size_t ky = 0; ky < 5; ++ky) {
      for (std::size_t kx = 0; kx < 5; ++kx) {
        CAPTURE(o);
        CAPTURE(ky);
        CAPTURE(kx);
        const float g = dw1[(o * 5 + ky) * 5 + kx];
        if (ky % 2 == 1 && kx % 2 == 1) {
          CHECK(g != 0.0f);
        } else {
          CHECK(g == 0.0f);
        }
      }
    }
  }
}

TEST_CASE("Cnn.GradientMatchesFiniteDifferences") {
  // Central differences of the reference network in double, against the model's float gradient, on random
  // entries of every tensor. In double the steps can be tiny, so they rarely cross a kink of the piecewise smooth
  // network (ReLU, max-pooling); each difference is still taken twice, with steps h and h/2, and an entry whose two
  // differences disagree sits at a kink and is left out (there must be few of those).
  const CnnModel model;
  std::vector<float> params = model.initial_parameters(7);
  // Generic pixels, uniform in [0, 1): no unit sits exactly at a ReLU's kink and no two positive pooling candidates
  // tie, so the loss is smooth where the gradient is checked. (Images with flat regions are not: equal pixels make
  // exact ties there, which a step can break either way.)
  const Synthetic img(3, 784, 10, 17, 0.0f, 1.0f);
  // Small nonzero biases, so the network is checked away from its all-zero-bias start too.
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> small(-0.05f, 0.05f);
  for (std::size_t t : {1, 3, 5, 7}) {
    for (float& b : model.layout().view(std::span<float>(params), t)) b = small(rng);
  }
  std::vector<std::uint32_t> samples(img.data.count);
  std::iota(samples.begin(), samples.end(), 0u);
  CnnModel::Workspace ws;
  std::vector<float> grad(params.size(), 0.0f);
  const double loss = model.accumulate_gradient(params, grad, img.data, samples, ws);

  std::vector<double> p(params.begin(), params.end());
  const double ref = reference_loss(model.layout(), p, img.data, samples);
  MESSAGE("loss: model (float) " << loss << ", reference (double) " << ref);
  CHECK(std::abs(loss - ref) <= 1e-5 * ref);

  auto central = [&](std::size_t i, double h) {
    const double saved = p[i];
    p[i] = saved + h;
    const double hi = reference_loss(model.layout(), p, img.data, samples);
    p[i] = saved - h;
    const double lo = reference_loss(model.layout(), p, img.data, samples);
    p[i] = saved;
    return (hi - lo) / (2 * h);
  };

  constexpr double kStep = 1e-5;
  const std::size_t per_tensor = test::scaled(16);
  double worst = 0;
  std::size_t checked = 0, kinks = 0;
  for (std::size_t t = 0; t < model.layout().tensor_count(); ++t) {
    const TensorView& tv = model.layout().tensor(t);
    const std::span<const float> g = model.layout().view(std::span<const float>(grad), t);
    double scale = 0;  // the tensor's gradient scale: its largest entry
    for (float v : g) {
      REQUIRE(std::isfinite(v));  // std::max below would pass over a NaN
      scale = std::max(scale, static_cast<double>(std::abs(v)));
    }
    REQUIRE(scale > 0);
    std::vector<std::size_t> picks(tv.size);
    std::iota(picks.begin(), picks.end(), 0u);
    std::shuffle(picks.begin(), picks.end(), rng);
    picks.resize(std::min(per_tensor, tv.size));
    double tensor_worst = 0;
    for (std::size_t k : picks) {
      const double fd = central(tv.offset + k, kStep), fd_half = central(tv.offset + k, kStep / 2);
      if (std::abs(fd - fd_half) > 1e-6 * scale) {
        ++kinks;
        continue;
      }
      tensor_worst = std::max(tensor_worst, std::abs(fd - static_cast<double>(g[k])) / scale);
      ++checked;
    }
    MESSAGE(tv.name << ": worst |fd - grad| / max|grad| = " << tensor_worst << " (max|grad| " << scale << ")");
    CHECK(tensor_worst < 1e-4);
    worst = std::max(worst, tensor_worst);
  }
  MESSAGE(checked << " entries checked, " << kinks << " left out at a kink; worst relative error " << worst);
  CHECK(kinks * 10 <= checked + kinks);
}

TEST_CASE("Cnn.RuntimeGradientEqualsSequential") {
  const Synthetic img(160, 784, 10, 23, 0.0f, 1.0f);
  const CnnModel model;
  const std::vector<float> init = model.initial_parameters(9);
  std::mt19937_64 rng(13);
  double worst = 0;
  for (std::size_t devices : {2, 3}) {
    for (std::size_t chunk : {5, 16}) {
      std::vector<std::uint32_t> batch(70 + rng() % 40);  // a partial last chunk
      for (auto& s : batch) s = static_cast<std::uint32_t>(rng() % img.data.count);
      Runtime rt({.devices = "cpu:" + std::to_string(devices), .schedule = {.chunk_size = chunk, .policy = SchedulePolicy::kSteal}, .host = {.threads_per_device = 1}});
      rt.register_parameters(model.layout(), init);
      std::vector<CnnModel::Workspace> ws(devices);
      const StepReport r = rt.compute_gradient(batch, [&](ChunkContext& ctx) {
        ctx.add_loss(model.accumulate_gradient(ctx.params, ctx.grad, img.data, ctx.samples, ws[ctx.device]));
      });
      const double err = relative_error(rt.gradient(), sequential_mean_gradient(model, init, img.data, batch));
      CAPTURE(devices);
      CAPTURE(chunk);
      CAPTURE(batch.size());
      CHECK(err <= 1e-5);
      CHECK(r.samples == batch.size());
      worst = std::max(worst, err);
    }
  }
  MESSAGE("cpu:2 and cpu:3 with stealing: worst relative error " << worst);
}

TEST_CASE("Cnn.SmokeTrainingLearnsFashionMnist") {
  const CnnModel model;
  const double acc = smoke_train_accuracy(model);
  if (acc < 0) return;  // no dataset: skipped
  MESSAGE("1 epoch on 10k samples, cpu:2: test accuracy " << acc);
  CHECK(acc >= 0.75);
}

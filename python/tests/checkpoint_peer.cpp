// The C++ side of the Python package's checkpoint tests: a runtime with the layout of the tests' Affine module
// (lin.weight [2, 3], lin.bias [2]), trained by SGD on the loss 0.5 |w x_s + b - y_s|^2 summed over each step's
// samples, its gradient written out by hand. The Python side trains the same module through autograd.
//
//   checkpoint_peer write PATH STEPS   trains STEPS steps from the tests' start and saves (metadata "from" = "c++")
//   checkpoint_peer read PATH STEPS    loads PATH, prints its metadata, trains STEPS more steps
// Both print the parameters, one %.9g number a line after "params", and exit 1 with the error on a failure.
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/runtime.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

using namespace stealbatch;

namespace {

constexpr std::uint32_t kSamples = 32;

// Sample s: x = (s % 5 - 2, s % 3 - 1, s % 7 * 0.25), y = (s % 2, 1 - s % 4 * 0.5): the Python tests' data.
void sample(std::uint32_t s, float x[3], float y[2]) {
  x[0] = static_cast<float>(s % 5) - 2.0f, x[1] = static_cast<float>(s % 3) - 1.0f, x[2] = static_cast<float>(s % 7) * 0.25f;
  y[0] = static_cast<float>(s % 2), y[1] = 1.0f - static_cast<float>(s % 4) * 0.5f;
}

void chunk(ChunkContext& ctx) {
  const float* w = ctx.params.data();  // w: [2][3] row-major (torch's Linear weight), then b: [2]
  const float* b = w + 6;
  double loss = 0;
  for (std::uint32_t s : ctx.samples) {
    float x[3], y[2];
    sample(s, x, y);
    for (int o = 0; o < 2; ++o) {
      const float r = w[o * 3] * x[0] + w[o * 3 + 1] * x[1] + w[o * 3 + 2] * x[2] + b[o] - y[o];
      loss += 0.5 * r * r;
      for (int i = 0; i < 3; ++i) ctx.grad[static_cast<std::size_t>(o * 3 + i)] += r * x[i];
      ctx.grad[static_cast<std::size_t>(6 + o)] += r;
    }
  }
  ctx.add_loss(loss);
}

void train(Runtime& rt, int steps) {
  std::vector<std::uint32_t> batch(kSamples);
  for (std::uint32_t i = 0; i < kSamples; ++i) batch[i] = i;
  for (int i = 0; i < steps; ++i) rt.step(batch, chunk);
}

void print(const Runtime& rt) {
  std::printf("params\n");
  for (float v : rt.parameters()) std::printf("%.9g\n", static_cast<double>(v));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 || (std::string(argv[1]) != "write" && std::string(argv[1]) != "read")) {
    std::fprintf(stderr, "usage: checkpoint_peer write|read PATH STEPS\n");
    return 2;
  }
  try {
    Runtime rt({.devices = "cpu:1", .schedule = {.chunk_size = 8}, .optimizer = {.kind = OptimizerKind::kSgd, .lr = 0.05f, .momentum = 0.9f}});
    ParameterLayout layout;
    layout.add("lin.weight", std::vector<std::size_t>{2, 3});
    layout.add("lin.bias", std::vector<std::size_t>{2});
    // The tests' start: w = 0.1 (i + 1) for its 6 entries, b = (-0.2, 0.3).
    rt.register_parameters(layout, std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, -0.2f, 0.3f});
    const int steps = std::atoi(argv[3]);
    if (std::string(argv[1]) == "write") {
      train(rt, steps);
      rt.save_checkpoint(argv[2], {{"from", "c++"}});
    } else {
      for (const auto& [k, v] : rt.load_checkpoint(argv[2])) std::printf("meta %s=%s\n", k.c_str(), v.c_str());
      train(rt, steps);
    }
    print(rt);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_peer: %s\n", e.what());
    return 1;
  }
}

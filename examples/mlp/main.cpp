// mlp: trains a multilayer perceptron on Fashion-MNIST with stealbatch, and compares stealing with a static split.
#include <stealbatch/models/mlp_model.hpp>
#include "trainer_cli.hpp"

#include <stealbatch/error.hpp>

#ifdef STEALBATCH_HAS_CUDA
#include <stealbatch/models/models_cuda.hpp>

#include <stealbatch/cuda/backend.hpp>
#endif

#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

using namespace stealbatch;
using namespace stealbatch::examples;

int main(int argc, char** argv) {
  // Batch 1024 (256 per device on cpu:4) with Adam: a step long enough that the per-step costs (the AllReduce, the
  // update of every replica, waking the devices) stay small next to the chunks, and 0.88 test accuracy in 10 epochs
  // (perf/README.md, torch).
  TrainerFlags f{.batch = 1024, .lr = 0.003f, .optimizer = "adam"};
  std::string hidden = "256,128";
  CLI::App app{"mlp: train an MLP on Fashion-MNIST with stealbatch"};
  add_trainer_options(app, f, [&](CLI::App& a) { a.add_option("--hidden", hidden, "hidden layer sizes")->capture_default_str(); });
  if (const int rc = parse_command_line("mlp", app, f, argc, argv); rc >= 0) return rc;

  return run_reporting_errors("mlp", [&] {
    const TrainingData data(f);
    std::vector<std::size_t> sizes{data.train.features};
    for (double h : parse_number_list(hidden, "hidden")) {
      if (h < 1 || h > 65536 || h != static_cast<double>(static_cast<std::size_t>(h))) throw ConfigError("hidden = '" + hidden + "': sizes must be whole numbers in [1, 65536]");
      sizes.push_back(static_cast<std::size_t>(h));
    }
    sizes.push_back(10);
    const MlpModel model(sizes);

    std::printf("# mlp: %zu train / %zu test samples, model", data.train.count, data.test.count);
    for (std::size_t s : sizes) std::printf(" %zu", s);
    std::printf(", %s\n", describe_configuration(f).c_str());
    print_kernels();
    TrainerModel tm = trainer_model(model, data, f.seed);
#ifdef STEALBATCH_HAS_CUDA
    stealbatch::cuda::enable();  // cuda: and vgpu: device specs
    const examples::MlpCuda gpu(sizes);
    tm.gpu_chunk = [&gpu](ChunkContext& ctx) { gpu.accumulate(ctx); };
#endif
    report(f, train_policies(f, tm, data.train));
  });
}

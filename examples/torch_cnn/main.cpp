// torch_cnn: the CNN of `cnn` written as a torch::nn::Module, trained on stealbatch through the libtorch adapter, with
// the same flags; --plain trains the same module with plain libtorch instead (no stealbatch), for comparison.
#include "torch_trainer.hpp"

#include <stealbatch/cores.hpp>
#include <stealbatch/models/cnn_model.hpp>
#include <stealbatch/models/torch_modules.hpp>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <thread>
#include <vector>

using namespace stealbatch;
using namespace stealbatch::examples;

int main(int argc, char** argv) {
  TrainerFlags f{.epochs = 4, .batch = 64, .lr = 0.002f, .optimizer = "adam"};  // cnn's defaults
  bool plain = false;
  int plain_threads = static_cast<int>(stealbatch::usable_cores());
  CLI::App app{"torch_cnn: train the CNN as a torch::nn::Module on stealbatch (the libtorch adapter)"};
  add_trainer_options(app, f, [&](CLI::App& a) {
    a.add_flag("--plain", plain, "train with plain libtorch instead (no stealbatch), for comparison");
    a.add_option("--plain-threads", plain_threads, "--plain: torch's intra-op threads")->check(CLI::Range(1, 256))->capture_default_str();
  });
  if (const int rc = parse_command_line("torch_cnn", app, f, argc, argv); rc >= 0) return rc;

  return run_reporting_errors("torch_cnn", [&] {
    const TrainingData data(f);
    std::printf("# torch_cnn: %zu train / %zu test samples, libtorch %s, model conv5x5x16-pool-conv5x5x32-pool-fc128-fc10, %s\n", data.train.count,
                data.test.count, TORCH_VERSION, describe_configuration(f).c_str());
    const std::function<std::shared_ptr<TorchCnnImpl>()> make = [] { return std::make_shared<TorchCnnImpl>(); };
    // The hand-written CNN's start from the same seed (the same layout), so the two examples train from the same weights.
    std::vector<float> initial = CnnModel().initial_parameters(f.seed);
    if (plain) return train_plain<TorchCnnImpl>(f, make, initial, data, plain_threads);
    const Tensors train = tensors_of(data.train), test = tensors_of(data.test);
    libtorch::ModuleChunks<TorchCnnImpl> first(make, 1, {}, {});
    report(f, train_policies(f, torch_trainer_model<TorchCnnImpl>(first, make, std::move(initial), train, test), data.train));
  });
}

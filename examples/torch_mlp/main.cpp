// torch_mlp: the MLP of `mlp` written as a torch::nn::Module, trained on stealbatch through the libtorch adapter, with
// the same flags; --plain trains the same module with plain libtorch instead (no stealbatch), for comparison.
#include "torch_trainer.hpp"

#include <stealbatch/cores.hpp>
#include <stealbatch/error.hpp>
#include <stealbatch/models/mlp_model.hpp>
#include <stealbatch/models/torch_modules.hpp>

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

using namespace stealbatch;
using namespace stealbatch::examples;

int main(int argc, char** argv) {
  TrainerFlags f{.batch = 1024, .lr = 0.003f, .optimizer = "adam"};
  std::string hidden = "256,128";
  bool plain = false;
  int plain_threads = static_cast<int>(stealbatch::usable_cores());
  CLI::App app{"torch_mlp: train the MLP as a torch::nn::Module on stealbatch (the libtorch adapter)"};
  add_trainer_options(app, f, [&](CLI::App& a) {
    a.add_option("--hidden", hidden, "hidden layer sizes")->capture_default_str();
    a.add_flag("--plain", plain, "train with plain libtorch instead (no stealbatch), for comparison");
    a.add_option("--plain-threads", plain_threads, "--plain: torch's intra-op threads")->check(CLI::Range(1, 256))->capture_default_str();
  });
  if (const int rc = parse_command_line("torch_mlp", app, f, argc, argv); rc >= 0) return rc;

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
    const std::function<std::shared_ptr<TorchMlpImpl>()> make = [sizes] { return std::make_shared<TorchMlpImpl>(sizes); };
    // The hand-written MLP's He-uniform start from the same seed (the layouts are the same), so the two examples
    // train from the same weights.
    std::vector<float> initial = MlpModel(std::vector<std::size_t>(sizes.begin(), sizes.end())).initial_parameters(f.seed);
    if (plain) return train_plain<TorchMlpImpl>(f, make, initial, data, plain_threads);
    const Tensors train = tensors_of(data.train), test = tensors_of(data.test);
    libtorch::ModuleChunks<TorchMlpImpl> first(make, 1, {}, {});
    report(f, train_policies(f, torch_trainer_model<TorchMlpImpl>(first, make, std::move(initial), train, test), data.train));
  });
}

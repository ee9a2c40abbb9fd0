// What the example trainers share: the flags, the data, the epoch loop with its progress line, and the report.
#pragma once

#include <stealbatch/models/dense_data.hpp>

#include <stealbatch/data/idx.hpp>
#include <stealbatch/runtime/runtime.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace stealbatch::examples {

// The flags every trainer takes. A trainer sets its own defaults here before add_trainer_options().
struct TrainerFlags {
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::string devices = "cpu:4";
  std::size_t epochs = 10;
  std::size_t batch = 256;
  std::string chunk = "auto";  // "auto" (each device's measured size) or samples per chunk
  std::size_t limit = 0;  // train on the first N samples only (0 = all)
  float lr = 0.1f;
  std::string optimizer = "sgd";
  std::string policy = "steal";
  std::string compare_policies = "static,steal";  // what --compare runs, alternating epoch by epoch
  std::string slowdown{};
  bool compare = false;
  std::string json{};
  std::string trace{};
  std::uint64_t seed = 1;
  std::string endgame = "on";
  std::string chunk_sizing = "speed";
  std::string merge_stolen = "on";  // "on": a thief runs what it steals in one call (RuntimeOptions::schedule.merge_stolen)
  std::string schedule = "cosine";
  std::string gpu_wait = "spin";
  std::string gpu_data = "host";   // "device": the training set held on each GPU, chunks gathered there (RuntimeOptions::gpu.resident)
  std::string gpu_graphs = "off";  // "on": the GPU models' chunks replayed from CUDA graphs (RuntimeOptions::gpu.graphs)
  std::string save{};            // checkpoint folder; empty = no checkpoints
  std::size_t save_every = 0;    // steps between checkpoints (0 = at each epoch's end only)
  std::size_t keep = 3;          // checkpoints kept in --save
  std::string resume{};          // checkpoint folder to continue from
  bool save_overwrite = false;   // --save may replace the checkpoints of another run in its folder
  std::size_t stop_after = 0;    // epochs this process runs before it ends (0 = to --epochs)
  double stall_timeout = 600;    // RuntimeOptions::stall_timeout
  double heartbeat_timeout = 10; // RuntimeOptions::cluster.heartbeat_timeout (across ranks)
  std::string wire = "float32";  // "bf16": RuntimeOptions::cluster.wire, the gradient in bfloat16 across ranks
  bool deterministic = false;    // RuntimeOptions::schedule.deterministic: bit-identical parameters
};

// Adds the shared flags to app, with f's values as the defaults; model_options adds the model's own flags
// (they follow --slowdown in the help).
//
//   TrainerFlags f{.epochs = 4};
//   CLI::App app{"cnn: ..."};
//   add_trainer_options(app, f, [&](CLI::App& a) { a.add_option("--hidden", hidden, "..."); });
void add_trainer_options(CLI::App& app, TrainerFlags& f, const std::function<void(CLI::App&)>& model_options = {});

// Parses the command line into app's flags and checks what no single flag's check can see (--compare with --policy,
// the device spec, that --json can be written). Returns -1 to go on, else the exit status: 0 after --help, 2 for a
// usage error (CLI11's own codes are not the README's), with the message printed.
//
//   if (const int rc = parse_command_line("mlp", app, f, argc, argv); rc >= 0) return rc;
int parse_command_line(const char* program, CLI::App& app, const TrainerFlags& f, int argc, char** argv);

// That the output file `path` (named by `flag`, "--json") can be written, found before anything loads or trains: a
// folder is refused; else the file is opened for appending (nothing in it lost) and removed again when it was not
// there. ConfigError naming the flag, the path and the system's reason.
void check_output_file(const char* flag, const std::string& path);

// Fashion-MNIST from --data, the training set cut to --limit. Not movable: train and test view the Datasets.
struct TrainingData {
  explicit TrainingData(const TrainerFlags& f);
  TrainingData(const TrainingData&) = delete;
  TrainingData& operator=(const TrainingData&) = delete;

  Dataset train_full, test_full;
  DenseData train, test;
};

// What the epoch loop needs of a model; trainer_model() makes one from a model with MlpModel's interface.
struct TrainerModel {
  const ParameterLayout* layout = nullptr;
  std::vector<float> initial;
  // The chunk function for a runtime of `devices` devices (each gets its own workspace), its kernels on `threads`
  // threads each (0: the model's choice; 1 in deterministic mode).
  std::function<ChunkFunction(std::size_t devices, int threads)> chunk_function;
  std::function<double(std::span<const float>)> test_accuracy;
  // The chunk function on GPU devices (cuda:, vgpu:); empty in a build without CUDA.
  ChunkFunction gpu_chunk{};
  // Why GPU devices cannot run this model, when neither gpu_chunk nor chunk_function_on_gpus serves them.
  std::string no_gpu_reason = "this program was built without the CUDA backend (STEALBATCH_CUDA=OFF)";
  // chunk_function() also runs on GPU devices and reads its inputs there itself (the libtorch adapter built against
  // a CUDA libtorch): used in place of gpu_chunk, and no inputs are gathered for it.
  bool chunk_function_on_gpus = false;
  // Variable-length samples (torch_lm). sample_cost: each sample's cost, given with each step to the policies that
  // use costs (packer, steal); sample_units: what a sample counts for the throughput line, in `units`; order: each
  // epoch's sample order. Empty: no costs, one unit a sample, epoch_order().
  std::function<double(std::uint32_t)> sample_cost{};
  std::function<double(std::uint32_t)> sample_units{};
  std::string units = "samples";
  std::function<std::vector<std::uint32_t>(std::size_t epoch)> order{};
  std::string metric = "test accuracy";  // what test_accuracy() returns
};

template <class Model>
TrainerModel trainer_model(const Model& model, const TrainingData& data, std::uint64_t seed) {
  TrainerModel t;
  t.layout = &model.layout();
  t.initial = model.initial_parameters(seed);
  // Its kernels take their threads from the device's arena (use_arena_threads()), one in deterministic mode.
  t.chunk_function = [&model, &data](std::size_t devices, int) -> ChunkFunction {
    auto ws = std::make_shared<std::vector<typename Model::Workspace>>(devices);
    return [&model, &data, ws](ChunkContext& ctx) {
      ctx.add_loss(model.accumulate_gradient(ctx.params, ctx.grad, data.train, ctx.samples, (*ws)[ctx.device]));
    };
  };
  t.test_accuracy = [&model, &data](std::span<const float> params) {
    typename Model::Workspace ws;
    return model.accuracy(params, data.test, ws);
  };
  return t;
}

struct RunResult {
  std::string policy;
  std::string metric = "test accuracy", units = "samples";
  double units_per_s = 0;  // the model's units (tokens) over the epochs' time; samples_per_s without units
  // The ideal's share of the run's time: the ideal is each step's summed chunk time over the devices (each device's
  // time divided by its --slowdown factor, over the devices' summed speed), plus its reduction and update
  // (stealbatch::ideal_seconds). At most 1 in one process: a device's chunk time, its drain included, lies within the
  // chunk phase, and the reduction starts after it.
  double ideal_fraction = 0;
  std::vector<double> epoch_seconds;
  std::vector<double> epoch_loss;  // each epoch's mean training loss (this process's epochs: after --resume, from there)
  double samples_per_s = 0;
  std::uint64_t steals = 0;
  double test_accuracy = 0;
  StepReport total;
  std::vector<std::vector<std::pair<std::size_t, double>>> chunk_curves;  // per device, with --chunk auto
  std::string parameters_sha256;     // of the final parameters' bytes: runs compare bit for bit (--deterministic)
  std::vector<double> save_seconds;  // each checkpoint's save (fsync included), not counted in epoch_seconds
  double load_seconds = 0;           // the --resume load
};

// The policies a trainer runs by name: static (equal split, no stealing: the DDP baseline), steal (with the model's
// sample costs when it gives them), steal-nocosts (steal, the costs withheld), packer (a greedy bin-packing of each
// batch on the costs, no stealing: needs costs), central (one shared queue).
struct PolicyChoice {
  std::string name;
  SchedulePolicy schedule = SchedulePolicy::kSteal;
  PlacementPolicy placement = PlacementPolicy::kAuto;
  bool costs = false;  // give the model's sample costs with each step
};
// ConfigError for an unknown name, or for packer with a model that gives no costs.
PolicyChoice policy_choice(const std::string& name, const TrainerModel& model);

// Trains from the model's initial parameters for --epochs under --policy, or under each of --compare-policies on the
// same work with --compare, and returns one result per policy.
std::vector<RunResult> train_policies(const TrainerFlags& f, const TrainerModel& model, const DenseData& train_set);

// The learning rate at `step` (from 0) of `total`: --lr, or with --schedule cosine its decay towards 0 (at least 1e-6).
double scheduled_lr(const TrainerFlags& f, std::size_t step, std::size_t total);

// Under mpirun: each value replaced by its mean over the ranks, bit-identical on every rank (each rank's values are
// gathered exactly and summed in rank order on each), for what each rank measures but all must agree on (torch_lm's
// cost fit: the ranks' step agreement checks the costs). Returns the rank count (1 in one process: a no-op).
std::size_t mean_over_ranks(std::span<double> values);

// "devices cpu:4, slowdown none, batch 256, ...": the configuration for a trainer's header line.
std::string describe_configuration(const TrainerFlags& f);

// The "# kernels: ..." header line (the CPU kernels' library and instruction set), and a warning on stderr when they
// run older code than the CPU could.
void print_kernels();

// Prints each run's dashboard, the speedup with --compare and the test accuracy, and writes --json.
void report(const TrainerFlags& f, const std::vector<RunResult>& runs);

// Runs body and turns its exceptions into a message prefixed with `program` and an exit code: 2 for ConfigError,
// 3 for DataError, 1 for anything else; 0 when body returns.
int run_reporting_errors(const char* program, const std::function<void()>& body);

}  // namespace stealbatch::examples

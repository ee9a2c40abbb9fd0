// The example trainers' shared command line, epoch loop and report.
#include "trainer_cli.hpp"

#include <stealbatch/models/layers.hpp>

#include <stealbatch/checkpoint/checkpoint_dir.hpp>
#include <stealbatch/error.hpp>
#include <stealbatch/sha256.hpp>
#include <stealbatch/stats.hpp>
#ifdef STEALBATCH_HAS_MPI
#include <stealbatch/mpi/mpi_cluster.hpp>
#endif

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <system_error>

#include <unistd.h>

namespace stealbatch::examples {
namespace {

using Clock = std::chrono::steady_clock;

// Under mpirun: the job's ranks (every rank trains; rank 0 alone prints). Null in a process of its own.
std::shared_ptr<Cluster> g_cluster;
bool quiet_rank() { return g_cluster && g_cluster->rank() != 0; }

// Every flag of the command line as given (else its default), in the order of the help, that the ranks of a job must
// share: all but those naming what each rank has or writes of its own. Set by parse_command_line(); checked across
// the ranks before anything else that they do together (run_reporting_errors()).
std::vector<std::pair<std::string, std::string>> g_shared_flags;
const std::set<std::string, std::less<>> kPerRankFlags{"--help", "--devices", "--slowdown", "--gpu-wait", "--gpu-data", "--gpu-graphs", "--json", "--trace", "--cache", "--plain-threads"};

// The progress line: epoch, samples, samples/s, ETA, loss. On a terminal it is redrawn in place; into a file or a pipe
// it is one plain line at each epoch's end (and every 10 s of a long epoch).
bool to_terminal() {
  static const bool tty = isatty(fileno(stderr)) != 0;
  return tty;
}

void progress(const std::string& tag, std::size_t epoch, std::size_t epochs, std::size_t done, std::size_t total, double elapsed,
              double loss) {
  if (quiet_rank()) return;
  const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0;
  const double eta = rate > 0 ? static_cast<double>(total - done) / rate : 0;
  const bool tty = to_terminal();
  std::fprintf(stderr, "%s[%s] epoch %zu/%zu  %6zu/%zu samples  %8.0f samples/s  ETA %5.1f s  loss %.4f%s", tty ? "\r" : "", tag.c_str(), epoch,
               epochs, done, total, rate, eta, loss, tty ? "   " : "\n");
}

// That --save can be written: its folder, or the nearest one above it that exists (where it would be made), takes
// new files. Found before anything loads or trains, as an unwritable --json is; the save's own probe
// (CheckpointDir::check_writable) follows when the folder is locked.
void check_save_folder(const std::string& save) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(save, ec);
  if (ec) throw ConfigError("save = '" + save + "': " + ec.message());
  while (!std::filesystem::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
  if (!std::filesystem::is_directory(p, ec)) throw ConfigError("save = '" + save + "': '" + p.string() + "' is not a folder");
  if (::access(p.c_str(), W_OK | X_OK) != 0) {
    throw ConfigError("save = '" + save + "': cannot write checkpoints into '" + p.string() + "': " + std::strerror(errno));
  }
}

// Where a run stands, as its checkpoints record it: the epoch in progress (from 1), the samples of it done, the steps
// taken. A checkpoint also names the seed, the batch and the training set's size, which a resumed run must share.
struct RunPosition {
  std::size_t epoch = 1, position = 0, step = 0;
};

std::size_t meta_count(const CheckpointMetadata& meta, const char* key, const std::string& path) {
  const auto it = meta.find(key);
  if (it == meta.end() || it->second.empty() || it->second.find_first_not_of("0123456789") != std::string::npos || it->second.size() > 19) {
    throw CheckpointError(CheckpointError::Reason::kFormat, path, std::string("the trainer's '") + key + "' is missing or not a count");
  }
  return static_cast<std::size_t>(std::stoull(it->second));
}

// What makes a run the run it is, as "key=value" words: what a checkpoint records (metadata "run") and what --resume
// compares. Not the devices or the policy, which a run may move between, nor --epochs, which a resumed run may extend.
std::string run_identity(const TrainerFlags& f, const ParameterLayout& layout, std::size_t train_count) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a over the layout's names and sizes
  for (const auto& t : layout.tensors()) {
    for (const char c : t.name + "=" + std::to_string(t.size) + ";") h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  }
  char buf[512];
  std::snprintf(buf, sizeof buf, "seed=%llu batch=%zu lr=%g optimizer=%s schedule=%s train_samples=%zu parameters=%zu layout=%016llx",
                static_cast<unsigned long long>(f.seed), f.batch, static_cast<double>(f.lr), f.optimizer.c_str(), f.schedule.c_str(), train_count,
                layout.size(), static_cast<unsigned long long>(h));
  return buf;
}

// The words of two identities that differ, as "lr: 0.003 there, 0.01 here".
std::string identity_difference(const std::string& theirs, const std::string& mine) {
  const auto words = [](const std::string& s) {
    std::map<std::string, std::string> m;
    std::size_t at = 0;
    while (at < s.size()) {
      const std::size_t end = std::min(s.find(' ', at), s.size()), eq = s.find('=', at);
      if (eq < end) m[s.substr(at, eq - at)] = s.substr(eq + 1, end - eq - 1);
      at = end + 1;
    }
    return m;
  };
  const auto a = words(theirs), b = words(mine);
  std::string out;
  for (const auto& [k, v] : b) {
    const auto it = a.find(k);
    const std::string there = it == a.end() ? "(none)" : it->second;
    if (there != v) out += (out.empty() ? "" : ", ") + k + ": " + there + " there, " + v + " here";
  }
  return out.empty() ? "(no word differs: '" + theirs + "')" : out;
}

// Loads --resume's newest checkpoint into rt and returns where the run stood; ConfigError when it is another run's.
RunPosition resume_from(const TrainerFlags& f, Runtime& rt, std::size_t train_count, RunResult& res) {
  const CheckpointDir dir(f.resume, CheckpointDir::Open::kExisting);
  const auto latest = dir.latest();
  if (!latest) throw CheckpointError(CheckpointError::Reason::kIo, f.resume, "no checkpoint (step-N.safetensors) in that folder");
  const auto t0 = Clock::now();
  const CheckpointMetadata meta = rt.load_checkpoint(*latest);
  res.load_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string path = latest->string();
  const auto same = [&](const char* key, std::size_t mine, const char* flag) {
    if (meta_count(meta, key, path) != mine) {
      throw ConfigError("resume = '" + path + "': it was saved with " + flag + " " + meta.at(key) + ", this run has " + std::to_string(mine));
    }
  };
  same("seed", static_cast<std::size_t>(f.seed), "--seed");
  same("batch", f.batch, "--batch");
  same("train_samples", train_count, "a training set of");
  // The whole identity: a resumed run must be the run that saved it (--lr, --optimizer, --epochs, the model...).
  const std::string mine = run_identity(f, rt.layout(), train_count);
  const auto run = meta.find("run");
  if (run == meta.end()) throw CheckpointError(CheckpointError::Reason::kFormat, path, "it records no run identity (metadata 'run')");
  if (run->second != mine) {
    throw ConfigError("resume = '" + path + "': it is another run's checkpoint (" + identity_difference(run->second, mine) +
                      "); resume with that run's flags, or start a new run");
  }
  RunPosition at{meta_count(meta, "epoch", path), meta_count(meta, "position", path), meta_count(meta, "step", path)};
  if (at.epoch > f.epochs) {
    const std::size_t trained = at.epoch - 1;  // whole epochs; `position` samples of the next one
    throw ConfigError("resume = '" + path + "': its run has trained " + std::to_string(trained) + " epoch(s)" +
                      (at.position > 0 ? " and " + std::to_string(at.position) + " samples of the next" : std::string()) + ", and --epochs is " +
                      std::to_string(f.epochs) + ": nothing is left to run (--epochs " + std::to_string(trained + 1) + " or more continues it)");
  }
  // --deterministic promises the same bits whatever the devices and the policy: from a checkpoint of a run without it,
  // whose bits followed where its chunks fell, that promise would be false.
  if (f.deterministic) {
    const auto it = meta.find("deterministic");
    if (it == meta.end() || it->second != "on") {
      throw ConfigError("resume = '" + path + "': it was saved by a run without --deterministic, whose parameters depend on where its chunks ran; " +
                        "resumed with --deterministic the run's bits would still differ from run to run. Resume without --deterministic, or " +
                        "start afresh with it");
    }
  }
  if (!quiet_rank()) {
    std::printf("# resumed from %s: epoch %zu, sample %zu of it, step %zu (loaded in %.1f ms)\n", path.c_str(), at.epoch, at.position, at.step,
                res.load_seconds * 1e3);
  }
  return at;
}

// Writes a checkpoint of where the run stands into --save and keeps the newest --keep; returns its seconds. `replaced`
// (another run's checkpoints, --save-overwrite) are removed once this one is written, before the pruning, which
// would otherwise keep theirs over this run's by step.
double save_to(const TrainerFlags& f, const Runtime& rt, const CheckpointDir& dir, std::size_t train_count, const RunPosition& at,
               std::vector<std::filesystem::path>& replaced) {
  const auto t0 = Clock::now();
  const std::filesystem::path path = dir.path_for(at.step);
  rt.save_checkpoint(path, {{"epoch", std::to_string(at.epoch)}, {"position", std::to_string(at.position)},
                            {"step", std::to_string(at.step)}, {"seed", std::to_string(f.seed)},
                            {"batch", std::to_string(f.batch)}, {"train_samples", std::to_string(train_count)},
                            {"run", run_identity(f, rt.layout(), train_count)}, {"deterministic", f.deterministic ? "on" : "off"}});
  for (const std::filesystem::path& old : replaced) {
    std::error_code ec;
    if (old != path) std::filesystem::remove(old, ec);  // one the new file replaced under its name is gone already
    if (ec) throw CheckpointError(CheckpointError::Reason::kIo, old.string(), "cannot remove it (--save-overwrite): " + ec.message());
  }
  replaced.clear();
  if (!quiet_rank()) dir.prune(f.keep);  // across ranks, rank 0 wrote it
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Warns once, on standard error, when the training loss is not finite or has grown a thousandfold over the first
// step's: a learning rate too large for the model, most likely.
void warn_if_diverging(double loss, std::size_t step, double& first_loss) {
  static bool warned = false;
  if (warned || quiet_rank()) return;
  if (first_loss == 0 && std::isfinite(loss) && loss > 0) first_loss = loss;
  if (std::isfinite(loss) && !(first_loss > 0 && loss > 1e3 * first_loss)) return;
  warned = true;
  std::fprintf(stderr, "%swarning: the training loss is %g at step %zu (%g at this run's first step): training is diverging; a smaller --lr may help\n",
               to_terminal() ? "\n" : "", loss, step, first_loss);
}

// --chunk's samples: "auto" is 0; else at most 7 digits (parse_command_line checked the range), so stoull cannot throw.
std::size_t chunk_size(const TrainerFlags& f) { return f.chunk == "auto" ? 0 : static_cast<std::size_t>(std::stoull(f.chunk)); }

// One policy's run, an epoch at a time, so that --compare can alternate the policies epoch by epoch.
class PolicyRun {
 public:
  PolicyRun(const TrainerFlags& f, const PolicyChoice& policy, const TrainerModel& model, const DenseData& train_set);
  std::size_t first_epoch() const { return from.epoch; }
  std::size_t last_epoch() const { return f.stop_after ? std::min(f.epochs, from.epoch + f.stop_after - 1) : f.epochs; }
  // One untimed gradient (no update) on the first epoch's first batch: what the first step in a process pays and a
  // steady state does not (the kernels' JIT, the data's first touch, the devices' first chunks, the first speeds).
  void warm_up();
  void run_epoch(std::size_t epoch);
  RunResult finish();

 private:
  std::vector<std::uint32_t> order_of(std::size_t epoch) const {
    return model.order ? model.order(epoch) : epoch_order(train_set.count, f.seed, epoch);
  }
  StepReport step(std::span<const std::uint32_t> ids, bool update);

  const TrainerFlags& f;
  const TrainerModel& model;
  const DenseData& train_set;
  RuntimeOptions ro;
  std::unique_ptr<Runtime> rt;
  ChunkFunction fn;
  std::size_t steps_per_epoch = 0, total_steps = 0;
  RunResult res;
  RunPosition from;
  std::optional<CheckpointDir> save_dir;
  std::optional<CheckpointDir::Lock> save_lock;
  std::vector<std::filesystem::path> replaced;  // --save-overwrite: another run's checkpoints, removed after this run's first
  std::size_t step_no = 0;
  bool costs = false;        // the step gets the model's sample costs
  std::vector<double> cost;  // the step's, when it does
  double units = 0;          // the model's units (tokens) in the timed steps
  double first_loss = 0;  // the first step's loss of this process, for warn_if_diverging
  std::vector<StepReport> all;
};

PolicyRun::PolicyRun(const TrainerFlags& flags, const PolicyChoice& policy, const TrainerModel& m, const DenseData& data)
    // With --deterministic every policy gets the model's costs: its cells are cut by them, and must be the same cells.
    : f(flags), model(m), train_set(data), costs(policy.costs || (flags.deterministic && static_cast<bool>(m.sample_cost))) {
  ro.devices = f.devices;
  ro.schedule.chunk_size = chunk_size(f);
  ro.schedule.policy = policy.schedule;
  ro.schedule.placement = policy.placement;
  ro.optimizer.kind = parse_optimizer(f.optimizer);
  ro.optimizer.lr = f.lr;
  ro.trace_path = f.trace.empty() ? "" : (f.compare ? f.trace + "." + policy.name + ".json" : f.trace);
  ro.schedule.seed = f.seed;
  ro.schedule.endgame = f.endgame == "on" ? EndGame::kOn : EndGame::kOff;
  ro.schedule.chunk_sizing = f.chunk_sizing == "speed" ? ChunkSizing::kBySpeed : ChunkSizing::kFixed;
  ro.schedule.merge_stolen = f.merge_stolen == "on";
  ro.schedule.deterministic = f.deterministic;
  ro.stall_timeout = f.stall_timeout;
  ro.cluster.heartbeat_timeout = f.heartbeat_timeout;
  ro.cluster.wire = f.wire == "bf16" ? WireFormat::kBfloat16 : WireFormat::kFloat32;
  const DeviceSpec spec = parse_device_spec(f.devices);
  ro.cluster.job = g_cluster;
  // What every rank must share besides the runtime's own options: the flags that shape the run.
  ro.cluster.agree_on = {{"--seed", std::to_string(f.seed)},       {"--epochs", std::to_string(f.epochs)}, {"--batch", std::to_string(f.batch)},
                 {"--data", f.data},                        {"--limit", std::to_string(f.limit)},   {"training samples", std::to_string(train_set.count)},
                 {"--schedule", f.schedule},                {"--save-every", std::to_string(f.save_every)},
                 {"--resume", f.resume},                    {"--stop-after", std::to_string(f.stop_after)}};
  // Across ranks the factors may name every device of the job, in rank order (the runtime keeps this rank's).
  ro.host.slowdown = g_cluster ? (f.slowdown.empty() ? std::vector<double>{} : parse_number_list(f.slowdown, "slowdown"))
                          : parse_slowdown_list(f.slowdown, spec.count);
  const bool gpu = spec.kind == DeviceKind::kCuda || spec.kind == DeviceKind::kVgpu;
  ro.gpu.wait = f.gpu_wait == "block" ? GpuWait::kBlock : GpuWait::kSpin;
  if (spec.kind == DeviceKind::kVgpu && std::getenv("CUDA_DEVICE_MAX_CONNECTIONS") == nullptr) {
    std::fprintf(stderr, "note: CUDA_DEVICE_MAX_CONNECTIONS is unset (8 hardware queues): vgpu parts may wait on each other; set it to 32\n");
  }
  if (f.gpu_graphs == "on" && !gpu) throw ConfigError("--gpu-graphs on: devices = '" + f.devices + "' are not GPUs (cuda: or vgpu:)");
  if (f.gpu_graphs == "on" && model.chunk_function_on_gpus) {
    throw ConfigError("--gpu-graphs on: this model's chunk function runs host code at every call (libtorch), which a graph's replay would skip");
  }
  if (f.gpu_data == "device" && !gpu) throw ConfigError("--gpu-data device: devices = '" + f.devices + "' are not GPUs (cuda: or vgpu:)");
  if (f.gpu_data == "device" && model.chunk_function_on_gpus) {
    throw ConfigError("--gpu-data device: this model's chunk function holds its own copy of the data on each GPU (libtorch); leave --gpu-data at host");
  }
  ro.gpu.graphs = gpu && f.gpu_graphs == "on";
  if (gpu && !model.chunk_function_on_gpus) {
    if (!model.gpu_chunk) throw ConfigError("devices = '" + f.devices + "': " + model.no_gpu_reason);
    // A GPU chunk's samples travel as rows of features + label, gathered on the host into pinned staging.
    ro.gpu.input_bytes = gpu_input_bytes(train_set);
    ro.gpu.gather = [&set = train_set](std::uint32_t s, std::byte* dst) { gather_sample(set, s, dst); };
    if (f.gpu_data == "device") ro.gpu.resident = train_set.count;
  }
  rt = std::make_unique<Runtime>(ro);
  rt->register_parameters(*model.layout, model.initial);
  fn = gpu && !model.chunk_function_on_gpus ? model.gpu_chunk : model.chunk_function(rt->device_count(), f.deterministic ? 1 : 0);

  steps_per_epoch = (train_set.count + f.batch - 1) / f.batch;
  total_steps = steps_per_epoch * f.epochs;
  res.policy = policy.name;
  res.metric = model.metric;
  res.units = model.units;
  from = f.resume.empty() ? RunPosition{} : resume_from(f, *rt, train_set.count, res);
  if (!f.save.empty()) {
    save_dir.emplace(f.save);
    if (!quiet_rank()) {  // across ranks rank 0 writes
      // One writer a folder, and one run: a folder that holds checkpoints is continued (--resume from it) or replaced
      // when asked to, never mixed into.
      save_lock.emplace(save_dir->lock());
      save_dir->check_writable();  // a save that cannot succeed fails now, not after an epoch
      const auto held = save_dir->list();
      std::error_code ec;
      const bool resuming_here = !f.resume.empty() && std::filesystem::equivalent(f.resume, f.save, ec);
      if (!held.empty() && resuming_here) {
        // This run's own checkpoints, continued: pruned as it saves, never removed before (--save-overwrite or not).
      } else if (!held.empty() && f.save_overwrite) {
        // Replaced only once this run's first checkpoint is written: a run that fails before then leaves them.
        for (const auto& h : held) replaced.push_back(h.second);
      } else if (!held.empty()) {
        throw ConfigError("save = '" + f.save + "': the folder holds " + std::to_string(held.size()) + " checkpoint(s) already (the newest at step " +
                          std::to_string(held.back().first) + "): continue that run with --resume " + f.save +
                          ", save elsewhere, or pass --save-overwrite to replace them");
      }
    }
  }
  step_no = from.step;
}

StepReport PolicyRun::step(std::span<const std::uint32_t> ids, bool update) {
  cost.clear();
  if (costs) {
    for (std::uint32_t s : ids) cost.push_back(model.sample_cost(s));
  }
  return update ? rt->step(ids, fn, cost) : rt->compute_gradient(ids, fn, cost);
}

void PolicyRun::warm_up() {
  const std::vector<std::uint32_t> order = order_of(from.epoch);
  (void)step(std::span<const std::uint32_t>(order).subspan(0, std::min(f.batch, order.size())), false);
}

void PolicyRun::run_epoch(std::size_t epoch) {
  const std::vector<std::uint32_t> order = order_of(epoch);  // the same order for every policy, and for perf/torch_ref.py
  const auto t0 = Clock::now();
  auto last_print = t0;
  double loss_sum = 0, saving = 0;
  const std::size_t first = epoch == from.epoch ? from.position : 0;
  std::size_t done = 0, saved_at = 0;
  for (std::size_t start = first; start < order.size(); start += f.batch) {
    const std::size_t b = std::min(f.batch, order.size() - start);
    if (f.schedule == "cosine") rt->set_learning_rate(static_cast<float>(scheduled_lr(f, step_no, total_steps)));
    ++step_no;
    const auto ids = std::span<const std::uint32_t>(order).subspan(start, b);
    const StepReport r = step(ids, true);
    if (step_no == from.step + 1 && from.step > 0 && !quiet_rank()) {
      // When a resumed run is training again, on the wall clock (an elastic launcher times a node's loss to this).
      const double unix_s = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      std::printf("# first step after resuming: step %zu done at unix time %.3f\n", step_no, unix_s);
      std::fflush(stdout);
    }
    for (std::uint32_t s : ids) units += model.sample_units ? model.sample_units(s) : 1.0;
    warn_if_diverging(r.loss, step_no, first_loss);
    loss_sum += r.loss * static_cast<double>(r.samples);
    done += b;
    all.push_back(r);
    if (save_dir && f.save_every && step_no % f.save_every == 0 && start + b < order.size()) {
      res.save_seconds.push_back(save_to(f, *rt, *save_dir, train_set.count, {epoch, start + b, step_no}, replaced));
      saving += res.save_seconds.back(), saved_at = step_no;
    }
    const auto now = Clock::now();
    if (now - last_print > std::chrono::milliseconds(to_terminal() ? 250 : 10000) || start + b == order.size()) {
      progress(res.policy, epoch, f.epochs, first + done, order.size(), std::chrono::duration<double>(now - t0).count() - saving,
               loss_sum / static_cast<double>(done));
      last_print = now;
    }
  }
  if (save_dir && saved_at != step_no) {
    res.save_seconds.push_back(save_to(f, *rt, *save_dir, train_set.count, {epoch + 1, 0, step_no}, replaced));
    saving += res.save_seconds.back();
  }
  res.epoch_seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count() - saving);
  res.epoch_loss.push_back(done > 0 ? loss_sum / static_cast<double>(done) : 0);
  if (to_terminal() && !quiet_rank()) std::fprintf(stderr, "\n");
}

RunResult PolicyRun::finish() {
  res.total = stealbatch::accumulate(all);
  res.total.step = all.size();  // the dashboard's "N steps": the steps timed here, not --compare's warm-up
  res.steals = res.total.steals;
  const double secs = std::accumulate(res.epoch_seconds.begin(), res.epoch_seconds.end(), 0.0);
  res.samples_per_s = secs > 0 ? static_cast<double>(res.total.samples) / secs : 0;
  res.units_per_s = secs > 0 ? units / secs : 0;
  // The ideal (stealbatch::ideal_seconds): each device's chunk time at full speed (its time over its slowdown
  // factor), spread over the devices' summed speed, plus the reduction and the update that every step pays; in one
  // process no step beats it. Across ranks a step reports every rank's devices, in rank order, as --slowdown names them.
  double ideal = 0, actual = 0;
  for (const StepReport& r : all) ideal += ideal_seconds(r, ro.host.slowdown), actual += r.step_s;
  res.ideal_fraction = actual > 0 ? ideal / actual : 0;
  const std::vector<float> params = rt->parameters(0);
  res.test_accuracy = model.test_accuracy(params);
  res.parameters_sha256 = sha256_hex(std::as_bytes(std::span<const float>(params)));
  if (ro.schedule.chunk_size == 0) {
    for (std::size_t d = 0; d < rt->device_count(); ++d) res.chunk_curves.push_back(rt->chunk_curve(d));
  }
  rt.reset();  // its devices and threads go before the next policy's run
  return res;
}

double mean(const std::vector<double>& v) { return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size()); }

}  // namespace

void add_trainer_options(CLI::App& app, TrainerFlags& f, const std::function<void(CLI::App&)>& model_options) {
  app.add_option("--data", f.data, "directory with the Fashion-MNIST IDX .gz files")->capture_default_str();
  app.add_option("--devices", f.devices, "cpu:N, cuda:all, cuda:I[,J...] or vgpu:SM1,SM2,... (parts of GPU 0); GPU specs need a CUDA build")->capture_default_str();
  // Every numeric flag's range, here in one place: an unsigned flag given a negative number would otherwise wrap to
  // 2^64 - 1 in CLI11's conversion.
  const auto count = [&app](const std::string& flag, auto& value, const std::string& what, double lo, double hi) {
    return app.add_option(flag, value, what)->check(CLI::Range(lo, hi))->capture_default_str();
  };
  // A path flag given "" would be silently ignored: it must name something.
  const CLI::Validator a_path([](const std::string& v) { return v.empty() ? std::string("an empty path; name a file or folder") : std::string(); }, "PATH");
  count("--epochs", f.epochs, "epochs to train", 1, 1000);
  count("--batch", f.batch, "samples per step (mini-batch)", 1, 1 << 20);
  app.add_option("--chunk", f.chunk, "samples per chunk, 1 to 1048576; auto: each device measures its chunk time (a fixed cost per call plus a cost per sample) in its first step and runs the smallest size within 95% of its best throughput; alone or with --policy static, its fastest size")
      ->check([](const std::string& v) {
        // At most 7 digits before stoull: a longer number is out of range, and stoull would throw on one past 2^64.
        const bool size = !v.empty() && v.size() <= 7 && v.find_first_not_of("0123456789") == std::string::npos && std::stoull(v) >= 1 && std::stoull(v) <= (1u << 20);
        return v == "auto" || size ? std::string() : "'" + v + "': expected auto or a size in [1, 1048576]";
      })
      ->capture_default_str();
  count("--limit", f.limit, "train on the first N training samples only (0 = all)", 0, 1e9);
  count("--lr", f.lr, "learning rate (the runtime's range, (0, 10])", 1e-12, 10);
  app.add_option("--optimizer", f.optimizer, "sgd (momentum 0.9) or adam")->check(CLI::IsMember({"sgd", "adam"}))->capture_default_str();
  app.add_option("--policy", f.policy, "static (equal split, no stealing: the DDP baseline), steal, central (one shared queue); with sample costs (torch_lm) also packer (greedy bin-packing by cost, no stealing) and steal-nocosts (steal, the costs withheld)")
      ->check(CLI::IsMember({"static", "steal", "central", "packer", "steal-nocosts"}))->capture_default_str();
  app.add_option("--slowdown", f.slowdown, "per-device slowdown factors, e.g. 6.6,6.6,1,1 (1 = full speed)");
  if (model_options) model_options(app);
  app.add_option("--schedule", f.schedule, "learning rate: cosine (decays --lr to 0 over the run) or constant")
      ->check(CLI::IsMember({"cosine", "constant"}))->capture_default_str();
  app.add_option("--endgame", f.endgame, "on: slow devices leave a step's last chunks to faster ones (shorter steps); off: every device takes chunks until none is left")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  app.add_option("--chunk-sizing", f.chunk_sizing, "fixed: every chunk holds --chunk samples; speed: each device's chunks are sized to its measured speed (--chunk on the fastest)")
      ->check(CLI::IsMember({"fixed", "speed"}))->capture_default_str();
  app.add_option("--merge-stolen", f.merge_stolen, "on: a device runs the chunks it steals in one call, up to its chunk size (for models with a fixed cost per call); off: one call per chunk")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  app.add_flag("--deterministic", f.deterministic,
               "bit-identical parameters whatever the devices, the policy, the stealing and the rank count: fixed cells of --chunk samples (auto: the batch / 16, at most 64) "
               "summed in 64-bit fixed point, each on one thread; compare runs by the 'parameters sha256' line (CPU devices)");
  app.add_option("--gpu-wait", f.gpu_wait, "GPU devices: spin (CUDA's default scheduling, as PyTorch waits) or block (blocking-sync events: no CPU, a wake-up per wait)")
      ->check(CLI::IsMember({"spin", "block"}))->capture_default_str();
  app.add_option("--gpu-data", f.gpu_data, "GPU devices, the mlp and cnn examples: host gathers each chunk's samples on the host and copies them; device holds the training set on each GPU and gathers there by index")
      ->check(CLI::IsMember({"host", "device"}))->capture_default_str();
  app.add_option("--gpu-graphs", f.gpu_graphs, "GPU devices, the mlp and cnn examples: on replays each chunk size's kernels from a CUDA graph (one launch a chunk); off launches them one by one")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  app.add_flag("--compare", f.compare, "run each of --compare-policies on the same work, each warmed up by one untimed step, alternating epoch by epoch; print every dashboard and each one's speedup over the first, of the median epochs");
  app.add_option("--compare-policies", f.compare_policies, "--compare: the policies, comma-separated (names as --policy's), the first the baseline")->capture_default_str();
  app.add_option("--json", f.json, "write the results as JSON to this file")->check(a_path);
  app.add_option("--trace", f.trace, "write a Chrome trace (with --compare: FILE.POLICY.json for each policy, FILE.POLICY.2.json for a policy named again)")->check(a_path);
  count("--seed", f.seed, "seed for initialization, shuffling and victim choice", 0, 9007199254740992.0);
  app.add_option("--save", f.save, "write checkpoints (DIR/step-N.safetensors, crash-safe) at each epoch's end and every --save-every steps")->check(a_path);
  count("--save-every", f.save_every, "steps between checkpoints with --save (0 = at each epoch's end only)", 0, 1e12);
  count("--keep", f.keep, "checkpoints kept in --save, the newest", 1, 1000000);
  app.add_flag("--save-overwrite", f.save_overwrite, "let --save replace the checkpoints already in its folder (another run's), once this run's first checkpoint is written; a run resumed from its --save folder keeps its own");
  app.add_option("--resume", f.resume, "continue from DIR's newest checkpoint (the same --seed, --batch and data; --epochs counts the whole run)")->check(a_path);
  count("--stall-timeout", f.stall_timeout, "seconds a device may spend in one chunk before its step fails (across ranks: before the job ends; also how long a rank may stay out of the others' step)", 0.001, 86400);
  count("--heartbeat-timeout", f.heartbeat_timeout, "across ranks: seconds without a rank's heartbeat (its process frozen or gone, its node unreachable) before the job ends, naming it; the heartbeat beats whatever the rank is doing, long chunks included", 0.001, 86400);
  app.add_option("--wire", f.wire, "across ranks: the gradient's format on the wire, float32 or bf16 (half the bytes, each value rounded; refused in one process and with --deterministic)")
      ->check(CLI::IsMember({"float32", "bf16"}))->capture_default_str();
  count("--stop-after", f.stop_after, "end this process after this many epochs, the schedule still spanning --epochs (runs in time slots, with --save and --resume; 0 = never)", 0, 1000);
}

int parse_command_line(const char* program, CLI::App& app, const TrainerFlags& f, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints the help (0) or the error, with CLI11's hint
    return rc == 0 ? 0 : 2;     // a usage error exits 2 (the README's table), whatever CLI11's own code
  }
  try {
    // What no single flag's check can see.
    if (f.compare && app.count("--policy") > 0) {
      throw ConfigError("--compare runs static and steal on the same work; --policy " + f.policy + " does not apply to it (drop one of the two)");
    }
    if (!f.compare && app.count("--compare-policies") > 0) {
      throw ConfigError("--compare-policies " + f.compare_policies + " without --compare: the policies are compared only with --compare (add it, or use --policy for one)");
    }
    if (!f.save.empty()) check_save_folder(f.save);
    (void)parse_device_spec(f.devices);  // also where a variant (--plain) never builds a runtime from it
    // An unwritable output is found now, not after the training.
    if (!f.json.empty()) check_output_file("--json", f.json);
    // --trace with --compare writes FILE.POLICY.json, one a policy: the first policy's name stands for them all.
    if (!f.trace.empty()) check_output_file("--trace", f.compare ? f.trace + "." + f.compare_policies.substr(0, f.compare_policies.find(',')) + ".json" : f.trace);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "%s: bad configuration: %s\n", program, e.what());
    return 2;
  }
  g_shared_flags.clear();
  for (const CLI::Option* o : app.get_options()) {
    const std::string name = o->get_name();
    if (kPerRankFlags.contains(name)) continue;
    std::string value;
    for (const std::string& r : o->results()) value += (value.empty() ? "" : ",") + r;
    g_shared_flags.emplace_back(name, o->count() > 0 ? value : o->get_default_str());
  }
  return -1;
}

void check_output_file(const char* flag, const std::string& path) {
  const std::string name = std::string(flag + 2) + " = '" + path + "'";
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw ConfigError(name + " is a folder; name a file");
  const bool existed = std::filesystem::exists(path, ec);
  errno = 0;
  if (!std::ofstream(path, std::ios::app)) throw ConfigError(name + ": cannot open it for writing: " + std::generic_category().message(errno));
  if (!existed) std::filesystem::remove(path, ec);
}

TrainingData::TrainingData(const TrainerFlags& f)
    : train_full(load_fashion_mnist(f.data, DataSplit::kTrain)), test_full(load_fashion_mnist(f.data, DataSplit::kTest)) {
  const std::size_t n_train = f.limit ? std::min(f.limit, train_full.count) : train_full.count;
  train = {n_train, train_full.features, std::span<const float>(train_full.x).first(n_train * train_full.features),
           std::span<const std::uint8_t>(train_full.y).first(n_train)};
  test = {test_full.count, test_full.features, test_full.x, test_full.y};
  check_splits(train_full, test_full, f.data);  // before any training
}

std::vector<RunResult> train_policies(const TrainerFlags& f, const TrainerModel& model, const DenseData& train_set) {
  if (f.compare && (!f.save.empty() || !f.resume.empty())) throw ConfigError("--save and --resume are for one run, not --compare's two");
  std::vector<RunResult> runs;
  const auto refuse_packer = [&f](const PolicyChoice& p) {
    if (f.deterministic && p.placement == PlacementPolicy::kPacked) {
      throw ConfigError(std::string(f.compare ? "--compare-policies with packer" : "--policy packer") +
                        " and --deterministic: the packer reorders each batch's samples across the devices, and deterministic cells are cut in "
                        "the batch's own order; use steal or static");
    }
  };
  if (!f.compare) {
    const PolicyChoice choice = policy_choice(f.policy, model);
    refuse_packer(choice);
    PolicyRun run(f, choice, model, train_set);
    for (std::size_t e = run.first_epoch(); e <= run.last_epoch(); ++e) run.run_epoch(e);
    runs.push_back(run.finish());
    return runs;
  }
  // --compare: neither policy may pay what the other does not. Each is warmed up by one untimed gradient before
  // anything is timed, and within one process the two alternate epoch by epoch, static first, so that a machine
  // whose load drifts slows both alike (report() takes each one's median epoch). Across ranks the two runtimes may
  // not live at once (their share words would meet in the cluster's window): there each policy runs whole, in turn.
  std::vector<PolicyChoice> choices;
  std::map<std::string, int> named;
  for (std::size_t at = 0; at <= f.compare_policies.size();) {
    const std::size_t end = std::min(f.compare_policies.find(',', at), f.compare_policies.size());
    choices.push_back(policy_choice(f.compare_policies.substr(at, end - at), model));
    refuse_packer(choices.back());
    // A policy named again is its own run: "steal.2" on its dashboard, in the JSON and in its trace's file name.
    if (const int n = ++named[choices.back().name]; n > 1) choices.back().name += "." + std::to_string(n);
    at = end + 1;
  }
  if (choices.size() < 2) throw ConfigError("compare-policies = '" + f.compare_policies + "': --compare needs two policies or more");
  if (g_cluster) {
    for (const PolicyChoice& p : choices) {
      PolicyRun run(f, p, model, train_set);
      run.warm_up();
      for (std::size_t e = run.first_epoch(); e <= run.last_epoch(); ++e) run.run_epoch(e);
      runs.push_back(run.finish());
    }
    return runs;
  }
  std::vector<std::unique_ptr<PolicyRun>> all;
  for (const PolicyChoice& p : choices) all.push_back(std::make_unique<PolicyRun>(f, p, model, train_set));
  for (auto& r : all) r->warm_up();
  for (std::size_t e = all[0]->first_epoch(); e <= all[0]->last_epoch(); ++e) {
    for (auto& r : all) r->run_epoch(e);
  }
  for (auto& r : all) runs.push_back(r->finish());
  return runs;
}

PolicyChoice policy_choice(const std::string& name, const TrainerModel& model) {
  const bool given = static_cast<bool>(model.sample_cost);
  if (name == "static") return {name, SchedulePolicy::kStatic, PlacementPolicy::kAuto, false};
  if (name == "steal") return {name, SchedulePolicy::kSteal, PlacementPolicy::kAuto, given};
  if (name == "steal-nocosts") return {name, SchedulePolicy::kSteal, PlacementPolicy::kAuto, false};
  if (name == "central") return {name, SchedulePolicy::kCentral, PlacementPolicy::kAuto, false};
  if (name == "packer") {
    if (!given) throw ConfigError("policy = 'packer': it packs each batch by its samples' costs, and this model gives none (torch_lm does)");
    return {name, SchedulePolicy::kStatic, PlacementPolicy::kPacked, true};
  }
  throw ConfigError("policy = '" + name + "': expected static, steal, steal-nocosts, packer or central");
}

double scheduled_lr(const TrainerFlags& f, std::size_t step, std::size_t total) {
  if (f.schedule != "cosine" || total == 0) return f.lr;
  const double progress = static_cast<double>(step) / static_cast<double>(total);
  return std::max(1e-6, static_cast<double>(f.lr) * 0.5 * (1.0 + std::cos(3.141592653589793 * progress)));
}

std::size_t mean_over_ranks(std::span<double> values) {
  if (!g_cluster || g_cluster->size() <= 1) return 1;
  const auto ranks = static_cast<std::size_t>(g_cluster->size()), me = static_cast<std::size_t>(g_cluster->rank());
  // A gather: each rank's values in its own slots, zeros elsewhere (adding zeros is exact, whatever the sum's order).
  std::vector<double> all(ranks * values.size(), 0.0);
  std::copy(values.begin(), values.end(), all.begin() + static_cast<std::ptrdiff_t>(me * values.size()));
  g_cluster->allreduce_sum(all);
  for (std::size_t i = 0; i < values.size(); ++i) {
    double sum = 0;
    for (std::size_t r = 0; r < ranks; ++r) sum += all[r * values.size() + i];
    values[i] = sum / static_cast<double>(ranks);
  }
  return ranks;
}

std::string describe_configuration(const TrainerFlags& f) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "devices %s, slowdown %s, batch %zu, chunk %s, %s lr %g (%s), %zu epochs, end game %s, chunk sizing %s, merge stolen %s",
                f.devices.c_str(), f.slowdown.empty() ? "none" : f.slowdown.c_str(), f.batch, f.chunk.c_str(), f.optimizer.c_str(), static_cast<double>(f.lr),
                f.schedule.c_str(), f.epochs, f.endgame.c_str(), f.chunk_sizing.c_str(), f.merge_stolen.c_str());
  return buf;
}

void print_kernels() {
  std::printf("# kernels: %s\n", kernels_in_use().c_str());
  if (const std::string w = kernel_warning(); !w.empty()) std::fprintf(stderr, "warning: %s\n", w.c_str());
}

void report(const TrainerFlags& f, const std::vector<RunResult>& runs) {
  for (const RunResult& r : runs) {
    std::printf("\n%s", format_dashboard(r.total, "policy " + r.policy).c_str());
    std::printf("| epoch time %.3f s (mean of %zu), %.0f samples/s", mean(r.epoch_seconds), r.epoch_seconds.size(), r.samples_per_s);
    if (r.units != "samples") std::printf(", %.0f %s/s", r.units_per_s, r.units.c_str());
    std::printf(", %.2f of the ideal, %s %.4f\n", r.ideal_fraction, r.metric.c_str(), r.test_accuracy);
  }
  double speedup = 0;
  if (f.compare) {
    std::printf("\n");
    const double a = median(runs[0].epoch_seconds);
    for (std::size_t i = 1; i < runs.size(); ++i) {
      const double b = median(runs[i].epoch_seconds);
      if (i + 1 == runs.size()) speedup = a / b;
      std::printf("%s vs %s: %.2fx faster per epoch (median epoch: %s %.3f s, %s %.3f s; %zu epoch(s) each, %s, after one untimed step each)\n",
                  runs[i].policy.c_str(), runs[0].policy.c_str(), a / b, runs[0].policy.c_str(), a, runs[i].policy.c_str(), b, runs[i].epoch_seconds.size(),
                  g_cluster ? "one policy after the other" : "alternating");
    }
  }
  std::printf("%s %.4f\n", runs.back().metric.c_str(), runs.back().test_accuracy);
  for (const RunResult& r : runs) {
    std::printf("parameters sha256 %s%s%s\n", r.parameters_sha256.c_str(), runs.size() > 1 ? (" (" + r.policy + ")").c_str() : "",
                f.deterministic ? ", deterministic: the same bits on any devices, policy and rank count" : "");
  }
  if (const auto& saves = runs.back().save_seconds; !saves.empty()) {
    std::printf("checkpoints: %zu saved to %s, median %.1f ms each (fsync included, not in the epoch times)\n", saves.size(), f.save.c_str(),
                median(saves) * 1e3);
  }

  if (!f.json.empty() && !quiet_rank()) {  // across ranks rank 0 writes it: every rank holds the same figures
    nlohmann::json j;
    j["test_accuracy"] = runs.back().test_accuracy;
    j["kernels"] = kernels_in_use();
    j["epochs"] = f.epochs;
    j["runs"] = nlohmann::json::array();
    for (const RunResult& r : runs) {
      std::vector<double> util;
      std::vector<std::size_t> sizes;
      for (const DeviceReport& d : r.total.devices) util.push_back(d.utilization), sizes.push_back(d.chunk_samples);
      j["runs"].push_back({{"policy", r.policy}, {"epoch_seconds", r.epoch_seconds}, {"epoch_loss", r.epoch_loss}, {"samples_per_s", r.samples_per_s}, {"steals", r.steals},
                           {"units", r.units}, {"units_per_s", r.units_per_s}, {"ideal_fraction", r.ideal_fraction}, {"metric", r.metric},
                           {"utilization", util}, {"chunk_samples", sizes}, {"chunk_curves", r.chunk_curves}, {"test_accuracy", r.test_accuracy},
                           {"checkpoint_save_seconds", r.save_seconds}, {"checkpoint_load_seconds", r.load_seconds},
                           {"parameters_sha256", r.parameters_sha256}});
    }
    if (f.compare) j["speedup_steal_vs_static"] = speedup;  // of the median epochs: the last policy over the first
    std::ofstream out(f.json);
    if (!out) throw Error("cannot write --json file '" + f.json + "'");
    out << j.dump(2) << "\n";
    out.close();  // a full disk shows here: the figures were not written, and the exit status says so
    if (!out) throw Error("writing --json file '" + f.json + "' failed: " + std::generic_category().message(errno));
  }
}

int run_reporting_errors(const char* program, const std::function<void()>& body) {
  // A failure on one rank ends the whole job at once (the others would wait for it in the next reduction).
  const auto fail = [program](const char* what, const char* text, int rc) {
    char line[2048];
    std::snprintf(line, sizeof line, "%s%s: %s%s", g_cluster ? ("rank " + std::to_string(g_cluster->rank()) + ": ").c_str() : "", program, what, text);
    if (g_cluster && g_cluster->size() > 1) g_cluster->abort(line, rc);  // the same exit status as one process
    std::fprintf(stderr, "%s\n", line);
    g_cluster.reset();
    return rc;
  };
  try {
#ifdef STEALBATCH_HAS_MPI
    if (mpi::MpiCluster::launched_by_mpirun()) {
      g_cluster = mpi::MpiCluster::world();
      if (g_cluster->rank() != 0 && std::freopen("/dev/null", "w", stdout) == nullptr) throw Error("cannot silence rank's output");
      // Before anything the ranks do together (a cost fit averaged over them, the runtime's own collectives): ranks
      // launched with other flags would meet in collectives of other sizes, or none.
      check_ranks_agree(*g_cluster, g_shared_flags, "when they join");
    }
#endif
    body();
  } catch (const ConfigError& e) {
    return fail("bad configuration: ", e.what(), 2);
  } catch (const DataError& e) {
    return fail("bad data: ", e.what(), 3);
  } catch (const CheckpointError& e) {
    return fail("bad checkpoint: ", e.what(), 4);
  } catch (const std::exception& e) {
    return fail("", e.what(), 1);
  }
  g_cluster.reset();
  return 0;
}

}  // namespace stealbatch::examples

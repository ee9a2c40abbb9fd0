// The example trainers' shared command line, epoch loop and report.
#include "trainer_cli.hpp"

#include <stealbatch/models/layers.hpp>

#include <stealbatch/error.hpp>
#ifdef STEALBATCH_HAS_MPI
#include <stealbatch/mpi/mpi_cluster.hpp>
#endif

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>

#include <unistd.h>

namespace stealbatch::examples {
namespace {

using Clock = std::chrono::steady_clock;

// Under mpirun: the job's ranks (every rank trains; rank 0 alone prints). Null in a process of its own.
std::shared_ptr<Cluster> g_cluster;
bool quiet_rank() { return g_cluster && g_cluster->rank() != 0; }

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

std::size_t chunk_size(const TrainerFlags& f) { return f.chunk == "auto" ? 0 : static_cast<std::size_t>(std::stoull(f.chunk)); }

RunResult train(const TrainerFlags& f, SchedulePolicy policy, const TrainerModel& model, const DenseData& train_set) {
  RuntimeOptions ro;
  ro.devices = f.devices;
  ro.chunk_size = chunk_size(f);
  ro.policy = policy;
  ro.optimizer.kind = parse_optimizer(f.optimizer);
  ro.optimizer.lr = f.lr;
  ro.trace_path = f.trace.empty() ? "" : (f.compare ? f.trace + (policy == SchedulePolicy::kSteal ? ".steal.json" : ".static.json") : f.trace);
  ro.seed = f.seed;
  ro.endgame = f.endgame == "on" ? EndGame::kOn : EndGame::kOff;
  ro.chunk_sizing = f.chunk_sizing == "speed" ? ChunkSizing::kBySpeed : ChunkSizing::kFixed;
  const DeviceSpec spec = parse_device_spec(f.devices);
  ro.cluster = g_cluster;
  // Across ranks the factors may name every device of the job, in rank order (the runtime keeps this rank's).
  ro.slowdown = g_cluster ? (f.slowdown.empty() ? std::vector<double>{} : parse_number_list(f.slowdown, "slowdown"))
                          : parse_slowdown_list(f.slowdown, spec.count);
  const bool gpu = spec.kind == DeviceKind::kCuda || spec.kind == DeviceKind::kVgpu;
  ro.gpu_wait = f.gpu_wait == "block" ? GpuWait::kBlock : GpuWait::kSpin;
  if (spec.kind == DeviceKind::kVgpu && std::getenv("CUDA_DEVICE_MAX_CONNECTIONS") == nullptr) {
    std::fprintf(stderr, "note: CUDA_DEVICE_MAX_CONNECTIONS is unset (8 hardware queues): vgpu parts may wait on each other; set it to 32\n");
  }
  if (gpu) {
    if (!model.gpu_chunk) throw ConfigError("devices = '" + f.devices + "': this program was built without the CUDA backend (STEALBATCH_CUDA=OFF)");
    // A GPU chunk's samples travel as rows of features + label, gathered on the host into pinned staging.
    ro.input_bytes = gpu_input_bytes(train_set);
    ro.gather = [&train_set](std::uint32_t s, std::byte* dst) { gather_sample(train_set, s, dst); };
  }
  Runtime rt(ro);
  rt.register_parameters(*model.layout, model.initial);
  const ChunkFunction fn = gpu ? model.gpu_chunk : model.chunk_function(rt.device_count());

  const std::size_t steps_per_epoch = (train_set.count + f.batch - 1) / f.batch;
  const std::size_t total_steps = steps_per_epoch * f.epochs;
  std::size_t step_no = 0;
  RunResult res;
  res.policy = policy == SchedulePolicy::kSteal ? "steal" : policy == SchedulePolicy::kStatic ? "static" : "central";
  std::vector<std::uint32_t> order;
  std::vector<StepReport> all;
  for (std::size_t epoch = 1; epoch <= f.epochs; ++epoch) {
    order = epoch_order(train_set.count, f.seed, epoch);  // the same order for every policy, and for perf/torch_ref.py
    const auto t0 = Clock::now();
    auto last_print = t0;
    double loss_sum = 0;
    std::size_t done = 0;
    for (std::size_t start = 0; start < order.size(); start += f.batch) {
      const std::size_t b = std::min(f.batch, order.size() - start);
      if (f.schedule == "cosine") {  // cosine decay from --lr towards 0 over the whole run
        const double progress = static_cast<double>(step_no) / static_cast<double>(total_steps);
        rt.set_learning_rate(std::max(1e-6f, static_cast<float>(f.lr * 0.5 * (1.0 + std::cos(3.141592653589793 * progress)))));
      }
      ++step_no;
      const StepReport r = rt.step(std::span<const std::uint32_t>(order).subspan(start, b), fn);
      loss_sum += r.loss * static_cast<double>(r.samples);
      done += b;
      all.push_back(r);
      const auto now = Clock::now();
      if (now - last_print > std::chrono::milliseconds(to_terminal() ? 250 : 10000) || done == order.size()) {
        progress(res.policy, epoch, f.epochs, done, order.size(), std::chrono::duration<double>(now - t0).count(), loss_sum / static_cast<double>(done));
        last_print = now;
      }
    }
    res.epoch_seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (to_terminal() && !quiet_rank()) std::fprintf(stderr, "\n");
  }
  res.total = stealbatch::accumulate(all);
  res.steals = res.total.steals;
  const double secs = std::accumulate(res.epoch_seconds.begin(), res.epoch_seconds.end(), 0.0);
  res.samples_per_s = secs > 0 ? static_cast<double>(res.total.samples) / secs : 0;
  res.test_accuracy = model.test_accuracy(rt.parameters(0));
  if (ro.chunk_size == 0) {
    for (std::size_t d = 0; d < rt.device_count(); ++d) res.chunk_curves.push_back(rt.chunk_curve(d));
  }
  return res;
}

double mean(const std::vector<double>& v) { return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size()); }

}  // namespace

void add_trainer_options(CLI::App& app, TrainerFlags& f, const std::function<void(CLI::App&)>& model_options) {
  app.add_option("--data", f.data, "directory with the Fashion-MNIST IDX .gz files")->capture_default_str();
  app.add_option("--devices", f.devices, "cpu:N, cuda:all, cuda:I[,J...] or vgpu:SM1,SM2,... (parts of GPU 0); GPU specs need a CUDA build")->capture_default_str();
  app.add_option("--epochs", f.epochs, "epochs to train")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--batch", f.batch, "samples per step (mini-batch)")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--chunk", f.chunk, "samples per chunk, 1 to 1048576; auto: each device's chunk is the smallest size that reaches 95% of its best measured throughput")
      ->check([](const std::string& v) { return v == "auto" || (!v.empty() && v.find_first_not_of("0123456789") == std::string::npos && std::stoull(v) >= 1 && std::stoull(v) <= (1u << 20)) ? std::string() : std::string("expected auto or a size in [1, 1048576]"); })
      ->capture_default_str();
  app.add_option("--limit", f.limit, "train on the first N training samples only (0 = all)")->capture_default_str();
  app.add_option("--lr", f.lr, "learning rate")->capture_default_str();
  app.add_option("--optimizer", f.optimizer, "sgd (momentum 0.9) or adam")->check(CLI::IsMember({"sgd", "adam"}))->capture_default_str();
  app.add_option("--policy", f.policy, "static (equal split, no stealing: the DDP baseline), steal, or central (one shared queue)")
      ->check(CLI::IsMember({"static", "steal", "central"}))->capture_default_str();
  app.add_option("--slowdown", f.slowdown, "per-device slowdown factors, e.g. 6.6,6.6,1,1 (1 = full speed)");
  if (model_options) model_options(app);
  app.add_option("--schedule", f.schedule, "learning rate: cosine (decays --lr to 0 over the run) or constant")
      ->check(CLI::IsMember({"cosine", "constant"}))->capture_default_str();
  app.add_option("--endgame", f.endgame, "on: slow devices leave a step's last chunks to faster ones (shorter steps); off: every device takes chunks until none is left")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  app.add_option("--chunk-sizing", f.chunk_sizing, "fixed: every chunk holds --chunk samples; speed: each device's chunks are sized to its measured speed (--chunk on the fastest)")
      ->check(CLI::IsMember({"fixed", "speed"}))->capture_default_str();
  app.add_option("--gpu-wait", f.gpu_wait, "GPU devices: spin (CUDA's default scheduling, as PyTorch waits) or block (blocking-sync events: no CPU, a wake-up per wait)")
      ->check(CLI::IsMember({"spin", "block"}))->capture_default_str();
  app.add_flag("--compare", f.compare, "run static and steal on the same work and print both dashboards and the speedup");
  app.add_option("--json", f.json, "write the results as JSON to this file");
  app.add_option("--trace", f.trace, "write a Chrome trace (with --compare: FILE.static.json and FILE.steal.json)");
  app.add_option("--seed", f.seed, "seed for initialization, shuffling and victim choice")->capture_default_str();
}

TrainingData::TrainingData(const TrainerFlags& f)
    : train_full(load_fashion_mnist(f.data, DataSplit::kTrain)), test_full(load_fashion_mnist(f.data, DataSplit::kTest)) {
  const std::size_t n_train = f.limit ? std::min(f.limit, train_full.count) : train_full.count;
  train = {n_train, train_full.features, std::span<const float>(train_full.x).first(n_train * train_full.features),
           std::span<const std::uint8_t>(train_full.y).first(n_train)};
  test = {test_full.count, test_full.features, test_full.x, test_full.y};
}

std::vector<RunResult> train_policies(const TrainerFlags& f, const TrainerModel& model, const DenseData& train_set) {
  std::vector<SchedulePolicy> policies;
  if (f.compare) {
    policies = {SchedulePolicy::kStatic, SchedulePolicy::kSteal};
  } else {
    policies = {parse_policy(f.policy)};
  }
  std::vector<RunResult> runs;
  for (SchedulePolicy p : policies) runs.push_back(train(f, p, model, train_set));
  return runs;
}

std::string describe_configuration(const TrainerFlags& f) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "devices %s, slowdown %s, batch %zu, chunk %s, %s lr %g (%s), %zu epochs, end game %s, chunk sizing %s",
                f.devices.c_str(), f.slowdown.empty() ? "none" : f.slowdown.c_str(), f.batch, f.chunk.c_str(), f.optimizer.c_str(), static_cast<double>(f.lr),
                f.schedule.c_str(), f.epochs, f.endgame.c_str(), f.chunk_sizing.c_str());
  return buf;
}

void print_kernels() {
  std::printf("# kernels: %s\n", kernels_in_use().c_str());
  if (const std::string w = kernel_warning(); !w.empty()) std::fprintf(stderr, "warning: %s\n", w.c_str());
}

void report(const TrainerFlags& f, const std::vector<RunResult>& runs) {
  for (const RunResult& r : runs) {
    std::printf("\n%s", format_dashboard(r.total, "policy " + r.policy).c_str());
    std::printf("| epoch time %.3f s (mean of %zu), %.0f samples/s, test accuracy %.4f\n", mean(r.epoch_seconds), r.epoch_seconds.size(),
                r.samples_per_s, r.test_accuracy);
  }
  double speedup = 0;
  if (f.compare) {
    speedup = mean(runs[0].epoch_seconds) / mean(runs[1].epoch_seconds);
    std::printf("\nsteal vs static: %.2fx faster per epoch (static %.3f s, steal %.3f s, same run)\n", speedup, mean(runs[0].epoch_seconds),
                mean(runs[1].epoch_seconds));
  }
  std::printf("test accuracy %.4f\n", runs.back().test_accuracy);

  if (!f.json.empty()) {
    nlohmann::json j;
    j["test_accuracy"] = runs.back().test_accuracy;
    j["kernels"] = kernels_in_use();
    j["epochs"] = f.epochs;
    j["runs"] = nlohmann::json::array();
    for (const RunResult& r : runs) {
      std::vector<double> util;
      std::vector<std::size_t> sizes;
      for (const DeviceReport& d : r.total.devices) util.push_back(d.utilization), sizes.push_back(d.chunk_samples);
      j["runs"].push_back({{"policy", r.policy}, {"epoch_seconds", r.epoch_seconds}, {"samples_per_s", r.samples_per_s}, {"steals", r.steals},
                           {"utilization", util}, {"chunk_samples", sizes}, {"chunk_curves", r.chunk_curves}, {"test_accuracy", r.test_accuracy}});
    }
    if (f.compare) j["speedup_steal_vs_static"] = speedup;
    std::ofstream out(f.json);
    if (!out) throw Error("cannot write --json file '" + f.json + "'");
    out << j.dump(2) << "\n";
  }
}

int run_reporting_errors(const char* program, const std::function<void()>& body) {
  // A failure on one rank ends the whole job at once (the others would wait for it in the next reduction).
  const auto fail = [program](const char* what, const char* text, int rc) {
    char line[2048];
    std::snprintf(line, sizeof line, "%s%s: %s%s", g_cluster ? ("rank " + std::to_string(g_cluster->rank()) + ": ").c_str() : "", program, what, text);
    if (g_cluster && g_cluster->size() > 1) g_cluster->abort(line);
    std::fprintf(stderr, "%s\n", line);
    g_cluster.reset();
    return rc;
  };
  try {
#ifdef STEALBATCH_HAS_MPI
    if (mpi::MpiCluster::launched_by_mpirun()) {
      g_cluster = mpi::MpiCluster::world();
      if (g_cluster->rank() != 0 && std::freopen("/dev/null", "w", stdout) == nullptr) throw Error("cannot silence rank's output");
    }
#endif
    body();
  } catch (const ConfigError& e) {
    return fail("bad configuration: ", e.what(), 2);
  } catch (const DataError& e) {
    return fail("bad data: ", e.what(), 3);
  } catch (const std::exception& e) {
    return fail("", e.what(), 1);
  }
  g_cluster.reset();
  return 0;
}

}  // namespace stealbatch::examples

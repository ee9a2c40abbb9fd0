// soak: many steps on simulated and CPU devices under random slowdowns, stalls, throwing chunks and device
// deaths. Every step checks that each chunk counted exactly once (on a device that survived the step) and that
// the gradient equals the sequential reference, or that the injected fault surfaced as the error the policy
// promises. Prints a # header, a progress line (redrawn on a terminal; one line every 10 s otherwise), a table of the
// counts against their bounds with a #wrong column, a summary line, and a JSON summary; exits non-zero on any lost or
// duplicated chunk, gradient mismatch, hang, unexpected error, fault that neither surfaced nor recovered, or a stall
// that surfaced far later than its timeout.
// Exit status: 0 every check passed and the JSON written; 1 a check failed, or the JSON could not be written at the
// end; 2 a usage error (a flag, its value, an unwritable --json), found before anything runs; 3 a hang.
//
//   soak --seconds 600 --json soak.json
#include "tool_cli.hpp"

#include <stealbatch/models/layers.hpp>
#include <stealbatch/models/mlp_model.hpp>

#include <stealbatch/error.hpp>
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/runtime/testing.hpp>
#include <stealbatch/runtime/version.hpp>
#ifdef STEALBATCH_HAS_MPI
#include <stealbatch/mpi/mpi_cluster.hpp>
#endif

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace stealbatch;
using stealbatch::testing::Fault;
using examples::DenseData;
using examples::max_relative_error;
using examples::MlpModel;
using Clock = std::chrono::steady_clock;

namespace {

struct Tally {
  std::uint64_t lost_samples = 0, duplicated_samples = 0;
  std::uint64_t steps = 0, faults_injected = 0, faults_surfaced = 0, faults_recovered = 0, lost_chunks = 0, duplicated_chunks = 0,
                gradient_mismatches = 0, hangs = 0, unexpected = 0, unaccounted = 0, runtimes = 0;
  double max_fault_to_error_ms = 0;
  std::map<std::string, std::uint64_t> by_kind;
  nlohmann::json to_json() const {
    return {{"steps", steps},
            {"faults_injected", faults_injected},
            {"faults_surfaced", faults_surfaced},
            {"faults_recovered", faults_recovered},
            {"lost_chunks", lost_chunks},
            {"duplicated_chunks", duplicated_chunks},
            {"gradient_mismatches", gradient_mismatches},
            {"hangs", hangs},
            {"max_fault_to_error_ms", max_fault_to_error_ms},
            {"unexpected_errors", unexpected},
            {"faults_unaccounted", unaccounted},
            {"lost_samples", lost_samples},
            {"duplicated_samples", duplicated_samples},
            {"runtimes", runtimes},
            {"faults_by_kind", by_kind}};
  }
  bool ok() const {
    return lost_chunks == 0 && duplicated_chunks == 0 && lost_samples == 0 && duplicated_samples == 0 && gradient_mismatches == 0 && hangs == 0 && unexpected == 0 && unaccounted == 0 &&
           faults_surfaced + faults_recovered == faults_injected;
  }
};


const char* kind_name(Fault f) {
  switch (f) {
    case Fault::kThrow: return "throw";
    case Fault::kStall: return "stall";
    case Fault::kDeviceLoss: return "device_loss";
    default: return "none";
  }
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 60;
  std::string json_path;
  std::uint64_t seed = 1;
  double timeout = 0.2;
  double fault_rate = 1.0 / 3.0;
  CLI::App app{"soak: random faults against exactly-once execution and the exact gradient"};
  app.footer("Exit status: 0 every check passed and the JSON written; 1 a check failed, or the JSON could not be written at the end; 2 a "
             "usage error (a flag, its value, an unwritable --json), found before anything runs; 3 a hang.");
  app.add_option("--seconds", seconds, "how long to run")->check(perf::finite_range(1.0, 86400.0))->capture_default_str();
  app.add_option("--json", json_path, "write the summary here");
  app.add_option("--seed", seed, "random seed")->capture_default_str();
  app.add_option("--stall-timeout", timeout, "the runtime's stall_timeout (s)")->check(perf::finite_range(0.05, 10.0))->capture_default_str();
  app.add_option("--fault-rate", fault_rate, "the share of steps with an injected fault")->check(perf::finite_range(0.0, 1.0))->capture_default_str();
  std::string only;
  app.add_option("--faults", only, "only these kinds: throw,stall,device_loss (default all)");
  bool across = false;
  app.add_flag("--across-ranks", across,
               "under mpirun: every rank runs the same steps on its own devices and chunks move between ranks; faults throw and "
               "device_loss (a stall ends the job across ranks, by design); every rank checks every sample once across the job");
  if (const int rc = perf::parse(app, argc, argv); rc >= 0) return rc;
  if (!only.empty()) {
    std::stringstream list(only);
    for (std::string kind; std::getline(list, kind, ',');) {
      if (kind != "throw" && kind != "stall" && kind != "device_loss") {
        return perf::usage_error("soak", "--faults = '" + kind + "': expected throw, stall or device_loss, comma-separated");
      }
    }
  }
  if (!perf::check_output_file("soak", app, "--json", json_path)) return perf::kExitUsage;
  std::shared_ptr<Cluster> cluster;
  if (across) {
#ifdef STEALBATCH_HAS_MPI
    cluster = mpi::MpiCluster::world();
    if (cluster->rank() != 0 && std::freopen("/dev/null", "w", stdout) == nullptr) return 2;
    if (only.empty()) only = "throw,device_loss";
    if (only.find("stall") != std::string::npos) {
      std::fprintf(stderr, "soak: --across-ranks takes throw and device_loss faults (a stall ends the job across ranks)\n");
      return 2;
    }
#else
    std::fprintf(stderr, "soak: --across-ranks needs a build with MPI (STEALBATCH_MPI)\n");
    return 2;
#endif
  }
  const int rank = cluster ? cluster->rank() : 0, ranks = cluster ? cluster->size() : 1;
  // Sums over the ranks (each rank adds its part): what the job saw.
  auto over_ranks = [&](std::vector<double> v) {
    if (cluster) cluster->allreduce_sum(v);
    return v;
  };
  std::vector<Fault> kinds;
  for (Fault f : {Fault::kThrow, Fault::kStall, Fault::kDeviceLoss}) {
    if (only.empty() || only.find(kind_name(f)) != std::string::npos) kinds.push_back(f);
  }
  if (kinds.empty()) kinds.push_back(Fault::kThrow);

  // Every rank draws the same steps (the batch, the policy, the fault's rank) from rng, and its own devices from its own.
  std::mt19937_64 rng(seed), own_rng(seed * 1000003 + static_cast<std::uint64_t>(rank));
  // A random classification set and a linear softmax model: smooth, so the runtime's gradient (summed chunk by
  // chunk) and the sequential one (one pass over the batch) differ by rounding alone. A ReLU network would not
  // do: a pre-activation within rounding of 0 goes either way depending on the GEMM's blocking, which depends on
  // the chunk size, and moves that sample's gradient by far more than 1e-5 (seen here: 0.7% once in a few
  // thousand steps, with the runtime agreeing with the sequential pass over the same chunks to 4e-7).
  const std::size_t count = 4096, features = 32;
  std::vector<float> x(count * features);
  std::vector<std::uint8_t> y(count);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : x) v = u(rng);
  for (auto& v : y) v = static_cast<std::uint8_t>(rng() % 10);
  const DenseData data{count, features, x, y};
  const MlpModel model({features, 10});

  const bool tty = isatty(fileno(stderr)) != 0;
  std::printf("# soak, stealbatch %s: %.0f s, seed %llu, stall_timeout %.3f s, fault rate %.2f, faults %s; sim and cpu devices%s\n", kVersionString,
              seconds, static_cast<unsigned long long>(seed), timeout, fault_rate, only.empty() ? "throw,stall,device_loss" : only.c_str(),
              cluster ? (", across " + std::to_string(ranks) + " ranks").c_str() : "");
  std::printf("# each step: every chunk counted exactly once on a surviving device, the gradient against the sequential one (1e-5), every\n"
              "# injected fault surfaced as the promised error or recovered from; a step not back within 30 s is a hang\n");
  std::fflush(stdout);
  Tally t;
  std::atomic<std::int64_t> step_started{0};  // ns since the epoch of Clock; 0 between steps
  std::atomic<bool> done{false};
  std::mutex out_mutex;
  auto write_json = [&] {
    const std::lock_guard lock(out_mutex);
    if (json_path.empty() || rank != 0) return true;
    return perf::write_output("soak", "--json", json_path, t.to_json().dump(2) + "\n");
  };
  // The hang detector: a step that has not returned after 30 s (150 timeouts) is a hang; there is nothing to do
  // but report it and stop.
  std::thread monitor([&] {
    while (!done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const std::int64_t s = step_started.load();
      if (s != 0 && Clock::now().time_since_epoch().count() - s > 30'000'000'000LL) {
        ++t.hangs;
        std::fprintf(stderr, "\nsoak: a step has not returned for 30 s: hang\n");
        (void)write_json();
        std::_Exit(3);
      }
    }
  });

  const auto t_end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  auto last_print = Clock::now();
  // Whether to run another step: rank 0's clock decides for every rank, so that all run the same steps.
  auto keep_going = [&] { return over_ranks({rank == 0 && Clock::now() < t_end ? 1.0 : 0.0})[0] > 0; };
  while (keep_going()) {
    // One runtime: random devices, policy and failure policy; a few dozen steps.
    RuntimeOptions o;
    std::mt19937_64& dev_rng = cluster ? own_rng : rng;
    const bool sim = dev_rng() % 2 == 0;
    const std::size_t n = (cluster ? 1 : 2) + dev_rng() % (cluster ? 3 : 4);
    if (sim) {
      o.devices = "sim:";
      for (std::size_t d = 0; d < n; ++d) o.devices += (d ? "," : "") + std::to_string(0.2 + 0.8 * static_cast<double>(dev_rng() % 100) / 100.0);
      o.sim.sample_seconds = 5e-6;
    } else {
      o.devices = "cpu:" + std::to_string(n);
      o.host.threads_per_device = 1;
      o.host.slowdown.resize(n);
      for (double& f : o.host.slowdown) f = 1.0 + static_cast<double>(dev_rng() % 300) / 100.0;
    }
    o.schedule.policy = rng() % 3 == 0 ? SchedulePolicy::kStatic : SchedulePolicy::kSteal;
    o.schedule.chunk_size = 1 + rng() % 16;
    o.schedule.merge_stolen = rng() % 2 == 0;
    o.on_device_failure = rng() % 2 == 0 ? OnDeviceFailure::kExclude : OnDeviceFailure::kFail;
    if (cluster) o.on_device_failure = OnDeviceFailure::kFail, o.cluster.job = cluster;  // across ranks a loss fails the step
    o.stall_timeout = timeout;
    o.schedule.seed = rng();
    // This step's fault: kind, device, and the how-manieth chunk of that device it hits (it may never come).
    struct Plan {
      Fault kind = Fault::kNone;
      int rank = 0;  // across ranks: the rank whose device it hits
      std::size_t device = 0;
      int at = 0;
      std::atomic<int> seen{0};
      std::atomic<bool> fired{false};
      std::atomic<std::int64_t> fired_ns{0};
    } plan;
    const stealbatch::testing::FaultInjector faults = [&plan, rank](std::size_t device, std::uint64_t, ChunkId) {
      if (plan.kind == Fault::kNone || rank != plan.rank || device != plan.device || plan.seen.fetch_add(1) != plan.at) return Fault::kNone;
      plan.fired_ns.store(Clock::now().time_since_epoch().count());
      plan.fired.store(true);
      return plan.kind;
    };
    Runtime rt(o);
    stealbatch::testing::inject_faults(rt, faults);
    ++t.runtimes;
    std::vector<float> params = model.initial_parameters(rng());
    rt.register_parameters(model.layout(), params);
    // Every call of the chunk function this step: the device that ran it (its name), the chunks it ran (one, or a
    // thief's merged steal), and the span of the batch it covered; to count every chunk, and every sample, on a
    // device that survived the step.
    struct Call {
      std::string device;
      std::vector<ChunkId> chunks;
      std::size_t at = 0, size = 0;
    };
    std::vector<Call> calls;
    const std::uint32_t* batch_base = nullptr;
    std::mutex calls_mutex;
    auto fn = [&](ChunkContext& ctx) {
      thread_local MlpModel::Workspace ws;
      ctx.add_loss(model.accumulate_gradient(ctx.params, ctx.grad, data, ctx.samples, ws));
      const std::lock_guard lock(calls_mutex);
      calls.push_back({ctx.owner->name(), std::vector<ChunkId>(ctx.chunks.begin(), ctx.chunks.end()),
                       static_cast<std::size_t>(ctx.samples.data() - batch_base), ctx.samples.size()});
    };
    const std::size_t steps = 10 + rng() % 30;
    for (std::size_t s = 0; s < steps && (s == 0 || keep_going()); ++s) {
      const std::size_t batch = 32 + rng() % 480;
      std::vector<std::uint32_t> idx(batch);
      for (auto& i : idx) i = static_cast<std::uint32_t>(rng() % count);
      calls.clear();
      batch_base = idx.data();
      plan.kind = Fault::kNone;
      plan.seen = 0;
      plan.fired = false;
      if (std::uniform_real_distribution<double>(0, 1)(rng) < fault_rate && (cluster || rt.device_count() > 1)) {
        plan.kind = kinds[rng() % kinds.size()];
        plan.rank = static_cast<int>(rng() % static_cast<std::uint64_t>(ranks));
        plan.device = static_cast<std::size_t>(rng() % 4) % n;  // an index at creation; an excluded one never runs, and the fault never fires
        plan.at = static_cast<int>(rng() % 3);
      }
      const std::vector<float> before = rt.parameters(0);
      std::vector<float> ref(model.layout().size(), 0.0f);
      {
        MlpModel::Workspace ws;
        model.accumulate_gradient(before, ref, data, idx, ws);
        for (float& g : ref) g /= static_cast<float>(batch);
      }
      const std::size_t devices_before = rt.device_count();
      step_started.store(Clock::now().time_since_epoch().count());
      std::string error_kind;
      bool can_continue = true;
      StepReport rep;
      try {
        rep = rt.compute_gradient(idx, fn);
      } catch (const TimeoutError&) {
        error_kind = "timeout";
      } catch (const ChunkError& e) {
        can_continue = e.can_continue();
        try {
          std::rethrow_if_nested(e);
          error_kind = "chunk";
        } catch (const DeviceLostError&) {
          error_kind = "lost";
        } catch (...) {
          error_kind = "chunk";
        }
      } catch (const std::exception& e) {
        const std::string what = e.what();
        // Across ranks, a fault on another rank fails this rank's step with that rank's message.
        error_kind = cluster && what.find("failed on rank " + std::to_string(plan.rank) + ":") != std::string::npos ? "remote"
                                                                                                                    : "unexpected: " + what;
      }
      const std::int64_t now = Clock::now().time_since_epoch().count();
      step_started.store(0);
      ++t.steps;
      const bool fired = plan.fired.load();
      if (fired) ++t.faults_injected, ++t.by_kind[kind_name(plan.kind)];
      const bool fired_anywhere = cluster ? over_ranks({fired ? 1.0 : 0.0})[0] > 0 : fired;
      if (error_kind.rfind("unexpected", 0) == 0 || (!error_kind.empty() && !fired_anywhere) || (error_kind == "remote" && fired)) {
        ++t.unexpected;
        std::fprintf(stderr, "\nsoak: rank %d, step %llu: %s (fault fired: %d)\n", rank, static_cast<unsigned long long>(t.steps),
                     error_kind.empty() ? "?" : error_kind.c_str(), fired);
        if (cluster) cluster->abort("soak: ending the job on an unexpected outcome", 1);
        break;
      }
      if (cluster && fired_anywhere && !fired) {
        // Another rank's fault: this rank's step must have failed with its message; a loss ends every rank's runtime.
        if (error_kind != "remote") {
          ++t.unaccounted;
          std::fprintf(stderr, "\nsoak: rank %d, step %llu: rank %d's fault ended here as '%s'\n", rank, static_cast<unsigned long long>(t.steps),
                       plan.rank, error_kind.c_str());
        }
        if (plan.kind == Fault::kDeviceLoss) break;
        continue;
      }
      if (fired) {
        // What the policy promises for this fault.
        const bool excluded = !rep.excluded_devices.empty();
        if (plan.kind == Fault::kThrow && error_kind == "chunk" && can_continue) {
          ++t.faults_surfaced;
        } else if (plan.kind == Fault::kStall && error_kind == "timeout") {
          ++t.faults_surfaced;
          t.max_fault_to_error_ms = std::max(t.max_fault_to_error_ms, static_cast<double>(now - plan.fired_ns.load()) / 1e6);
        } else if (plan.kind == Fault::kDeviceLoss && o.on_device_failure == OnDeviceFailure::kFail && error_kind == "lost" && !can_continue) {
          ++t.faults_surfaced;
        } else if (plan.kind == Fault::kDeviceLoss && o.on_device_failure == OnDeviceFailure::kExclude && error_kind.empty() && excluded &&
                   rt.device_count() == devices_before - 1) {
          ++t.faults_recovered;
        } else {
          ++t.unaccounted;
          std::fprintf(stderr, "\nsoak: step %llu: fault %s ended as '%s'\n", static_cast<unsigned long long>(t.steps), kind_name(plan.kind),
                       error_kind.c_str());
        }
      }
      if (!error_kind.empty()) {
        if (!can_continue) break;  // a lost device under fail: a new runtime
        continue;
      }
      // Exactly once: every chunk counted on exactly one device that survived the step.
      std::vector<std::string> alive;
      for (std::size_t d = 0; d < rt.device_count(); ++d) alive.push_back(rt.device(d).name());
      // Across ranks each rank counts what its devices ran, and the sums must be 1 (chunk by chunk, then sample by
      // sample); rank 0 keeps the job's tally.
      std::vector<double> chunk_runs(rep.chunks, 0.0), covered(batch, 0.0);
      for (const Call& call : calls) {
        if (std::find(alive.begin(), alive.end(), call.device) == alive.end()) continue;
        for (ChunkId c : call.chunks) {
          if (c >= rep.chunks) throw std::logic_error("soak: chunk id " + std::to_string(c) + " beyond the step's " + std::to_string(rep.chunks));
          chunk_runs[c] += 1;
        }
        for (std::size_t i = 0; i < call.size; ++i) covered[call.at + i] += 1;
      }
      chunk_runs = over_ranks(std::move(chunk_runs));
      covered = over_ranks(std::move(covered));
      if (rank == 0) {
        for (double c : chunk_runs) t.lost_chunks += c == 0, t.duplicated_chunks += c > 1;
        // And sample by sample: every position of the batch in exactly one chunk that counted.
        for (double c : covered) t.lost_samples += c == 0, t.duplicated_samples += c > 1;
      }
      if (const double err = max_relative_error(rt.gradient(), ref); err > 1e-5) {
        ++t.gradient_mismatches;
        std::fprintf(stderr, "\nsoak: step %llu: gradient relative error %.3g on %s (%s, chunk %zu, batch %zu, fault %s%s)\n",
                     static_cast<unsigned long long>(t.steps), err, o.devices.c_str(), o.schedule.policy == SchedulePolicy::kStatic ? "static" : "steal",
                     o.schedule.chunk_size, batch, fired ? kind_name(plan.kind) : "none", rep.excluded_devices.empty() ? "" : ", a device excluded");
      }
      // On a terminal the progress line is redrawn every 2 s; into a log, a plain line every 10 s.
      if (rank == 0 && Clock::now() - last_print > std::chrono::seconds(tty ? 2 : 10)) {
        last_print = Clock::now();
        std::fprintf(stderr, "%s[soak] %6llu steps  %4llu faults (%llu surfaced, %llu recovered)  lost %llu  dup %llu  mismatch %llu  max fault->error %.0f ms%s",
                     tty ? "\r" : "", static_cast<unsigned long long>(t.steps), static_cast<unsigned long long>(t.faults_injected),
                     static_cast<unsigned long long>(t.faults_surfaced), static_cast<unsigned long long>(t.faults_recovered),
                     static_cast<unsigned long long>(t.lost_chunks), static_cast<unsigned long long>(t.duplicated_chunks),
                     static_cast<unsigned long long>(t.gradient_mismatches), t.max_fault_to_error_ms, tty ? "   " : "\n");
      }
    }
  }
  done = true;
  monitor.join();
  if (cluster) {
    // The job's tally: every rank's faults and mismatches added; the steps and runtimes are the same on every rank.
    std::vector<double> v{static_cast<double>(t.faults_injected), static_cast<double>(t.faults_surfaced), static_cast<double>(t.faults_recovered),
                          static_cast<double>(t.gradient_mismatches), static_cast<double>(t.unexpected),        static_cast<double>(t.unaccounted),
                          static_cast<double>(t.lost_chunks),      static_cast<double>(t.duplicated_chunks), static_cast<double>(t.lost_samples),
                          static_cast<double>(t.duplicated_samples)};
    v = over_ranks(std::move(v));
    std::uint64_t* fields[] = {&t.faults_injected, &t.faults_surfaced, &t.faults_recovered, &t.gradient_mismatches, &t.unexpected,
                               &t.unaccounted,     &t.lost_chunks,     &t.duplicated_chunks, &t.lost_samples,       &t.duplicated_samples};
    for (std::size_t i = 0; i < std::size(fields); ++i) *fields[i] = static_cast<std::uint64_t>(v[i]);
  }
  if (tty) std::fprintf(stderr, "\n");
  const bool written = write_json();
  // The stall watchdog's target is timeout + 50 ms, reported here; the bound it must keep is looser, since a step's
  // threads may each wait a timer tick for a core on a loaded host, and a watchdog that never fired is a hang.
  const double late_bound = 2 * timeout * 1e3 + 250;
  struct Row {
    const char* what;
    double value;
    double bound;  // the largest value that passes
  };
  const double injected = static_cast<double>(t.faults_injected);
  const Row rows[] = {{"lost chunks", static_cast<double>(t.lost_chunks), 0},
                      {"duplicated chunks", static_cast<double>(t.duplicated_chunks), 0},
                      {"lost samples", static_cast<double>(t.lost_samples), 0},
                      {"duplicated samples", static_cast<double>(t.duplicated_samples), 0},
                      {"gradient mismatches", static_cast<double>(t.gradient_mismatches), 0},
                      {"hangs", static_cast<double>(t.hangs), 0},
                      {"unexpected errors", static_cast<double>(t.unexpected), 0},
                      {"faults unaccounted", static_cast<double>(t.unaccounted) + injected - static_cast<double>(t.faults_surfaced + t.faults_recovered), 0},
                      {"max fault->error (ms)", t.max_fault_to_error_ms, late_bound}};
  std::printf("%-24s %12s %12s %7s\n", "check", "value", "bound", "#wrong");
  std::size_t wrong = 0;
  for (const Row& r : rows) {
    const bool bad = r.value > r.bound;
    wrong += bad;
    std::printf("%-24s %12.1f %12.1f %7d\n", r.what, r.value, r.bound, bad ? 1 : 0);
  }
  std::printf("# %llu steps on %llu runtimes; %llu faults injected (%llu surfaced, %llu recovered); the stall target is %.0f ms\n",
              static_cast<unsigned long long>(t.steps), static_cast<unsigned long long>(t.runtimes), static_cast<unsigned long long>(t.faults_injected),
              static_cast<unsigned long long>(t.faults_surfaced), static_cast<unsigned long long>(t.faults_recovered), timeout * 1e3 + 50);
  const bool ok = t.ok() && wrong == 0 && written;
  if (cluster) std::printf("# across %d ranks: every sample counted once over the job's devices, faults counted on the rank they hit\n", ranks);
  std::printf("# summary: %zu checks, #wrong total %zu: %s\n", std::size(rows), wrong, ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

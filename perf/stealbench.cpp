// stealbench: the real runtime on simulated devices, scenario by policy, against the ideal step time; with
// --chunk-overhead, the runtime's cost per chunk on real devices (stealbench_overhead.cpp).
// Exit status: 0 every row exact and the outputs written; 1 a row's #wrong is not 0, or an output could not be
// written at the end; 2 a usage error (a flag, its value, an unwritable output), found before anything runs.
#include "stealbench_overhead.hpp"
#include "tool_cli.hpp"

#include <stealbatch/runtime/detail/timer_slack.hpp>
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/runtime/version.hpp>
#include <stealbatch/stats.hpp>
#ifdef STEALBATCH_HAS_MPI
#include <stealbatch/mpi/mpi_cluster.hpp>
#endif

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using namespace stealbatch;
using Clock = std::chrono::steady_clock;

namespace {

struct Scenario {
  std::string name;
  std::vector<double> speeds;                     // true relative speeds
  std::function<double(std::uint32_t)> cost{};    // relative cost of a sample (empty: 1)
  // What a trainer would give as a sample's cost (its tokens), for the policies that take costs (steal-cost, packer);
  // empty: the true cost. It may differ from the true one, as a token count misses attention's quadratic term.
  std::function<double(std::uint32_t)> tokens{};
  // A factor on a device's speed at (step, seconds into the step); empty: constant speeds.
  std::function<double(std::size_t, std::uint64_t, double)> speed_factor{};
  // A fixed cost of every call, whatever it holds and whatever the device's speed, in sample times at speed 1 (a
  // GPU's launches and waits); 0: none. Chunk sizes are then the runtime's own (chunk_size = 0, every policy), as
  // a fixed --chunk would be a choice no user makes on such a device.
  double call_samples = 0;
};

std::vector<double> repeat(const std::vector<double>& pattern, std::size_t n) {
  std::vector<double> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = pattern[i % pattern.size()];
  return out;
}

// seed-skew: equal devices, but under an equal split the first half of the devices get samples 6.6x as costly as
// the second half's, so static busy times are 1, 1, 0.15, 0.15.
// Step i runs samples [i * batch, (i + 1) * batch): a fresh batch every step, as in training. `total` is the
// number of samples over all steps.
Scenario make_scenario(const std::string& name, std::size_t n, std::size_t batch, std::size_t total, double attention_c,
                       const std::vector<double>& lengths) {
  if (name == "seed-slow") return {name, repeat({1 / 6.6, 1 / 6.6, 1, 1}, n), {}};
  if (name == "hetero") return {name, repeat({1.0, 0.8, 0.5, 0.25}, n), {}};
  if (name == "seed-skew") {
    const std::size_t heavy = (batch / n) * (n / 2);  // the shards of the first n/2 devices under an equal split
    return {name, std::vector<double>(n, 1.0), [heavy, batch](std::uint32_t s) { return (s % batch) < heavy ? 1.0 : 0.15; }};
  }
  if (name == "varcost") {
    // Per-sample cost lognormal with sigma 1 (like variable sequence lengths), fixed per sample index.
    auto costs = std::make_shared<std::vector<double>>(total);
    std::mt19937_64 rng(7);
    std::lognormal_distribution<double> ln(0.0, 1.0);
    for (double& c : *costs) c = ln(rng);
    return {name, std::vector<double>(n, 1.0), [costs](std::uint32_t s) { return (*costs)[s % costs->size()]; }};
  }
  if (name == "doclen" || name == "doclen-grouped") {
    // Documents of length L drawn from --lengths (a corpus's own lengths: torch_lm's documents), else lognormal
    // (median 245 tokens, sigma 1, within [8, 2048]); each a transformer's cost L + L^2 / c relative to its mean:
    // attention's part equals the rest's at L = c (--attention-c; torch_lm fits c = b / e to its measured times at
    // start-up). The trainer gives L alone, so its cost misses the quadratic part. Grouped: each batch sorted by
    // length, longest first, as length-grouped samplers order it, so an equal split gives the first devices the long
    // ones.
    auto len = std::make_shared<std::vector<double>>(total);
    std::mt19937_64 rng(11);
    std::lognormal_distribution<double> ln(std::log(245.0), 1.0);
    std::uniform_int_distribution<std::size_t> pick(0, lengths.empty() ? 0 : lengths.size() - 1);
    for (double& l : *len) l = lengths.empty() ? std::clamp(std::round(ln(rng)), 8.0, 2048.0) : lengths[pick(rng)];
    if (name == "doclen-grouped") {
      for (std::size_t at = 0; at < total; at += batch) std::sort(len->begin() + static_cast<std::ptrdiff_t>(at), len->begin() + static_cast<std::ptrdiff_t>(std::min(total, at + batch)), std::greater<>());
    }
    const double c = attention_c;
    double mean = 0;
    for (double l : *len) mean += l + l * l / c;
    mean /= static_cast<double>(total);
    Scenario sc{name, std::vector<double>(n, 1.0)};
    sc.cost = [len, mean, c](std::uint32_t s) { const double l = (*len)[s % len->size()]; return (l + l * l / c) / mean; };
    sc.tokens = [len](std::uint32_t s) { return (*len)[s % len->size()]; };
    return sc;
  }
  if (name == "launch-bound") {
    // The H200's parts 64,16,16,16 as the MLP runs on them: every call costs 180 us at the default time scale (1.8
    // samples of cost 1), and a sample 1/256 of that on the fastest part, so that a call must hold about 5,000 samples
    // before its fixed cost is 5% of it.
    constexpr double kCall = 1.8;
    Scenario sc{name, repeat({1.0, 0.25, 0.25, 0.25}, n), [](std::uint32_t) { return kCall / 256; }};
    sc.call_samples = kCall;
    return sc;
  }
  if (name == "slowdown") {
    // Equal devices; every third step, device 0 drops to 30% of its speed a third of the way into the step.
    return {name, std::vector<double>(n, 1.0)};
  }
  throw ConfigError("scenario = '" + name + "': expected seed-slow, seed-skew, hetero, varcost, doclen, doclen-grouped, launch-bound, slowdown or scale");
}

const std::vector<std::string> kScenarios{"seed-slow", "seed-skew", "hetero", "varcost", "doclen", "doclen-grouped", "launch-bound", "slowdown", "scale"};
const std::vector<std::string> kPolicies{"static", "oracle", "lbbsp", "central", "steal", "steal-adaptive", "steal-cost", "packer", "packer-steal"};

// The policies that take each sample's cost, which only the doclen scenarios give.
bool takes_costs(const std::string& policy) { return policy == "steal-cost" || policy == "packer" || policy == "packer-steal"; }

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t at = 0;
  for (std::size_t comma; (comma = s.find(',', at)) != std::string::npos; at = comma + 1) out.push_back(s.substr(at, comma - at));
  out.push_back(s.substr(at));
  return out;
}

struct PolicySetup {
  std::string name;
  RuntimeOptions options;
};

PolicySetup make_policy(const std::string& name, const Scenario& sc) {
  RuntimeOptions o;
  if (name == "static") {
    o.schedule.policy = SchedulePolicy::kStatic, o.schedule.placement = PlacementPolicy::kEqual;
  } else if (name == "oracle") {
    o.schedule.policy = SchedulePolicy::kStatic, o.schedule.placement = PlacementPolicy::kGiven, o.schedule.placement_weights = sc.speeds;
  } else if (name == "lbbsp") {
    // LB-BSP / DBS: static, with every step's shares resized from the previous step's measured throughput.
    o.schedule.policy = SchedulePolicy::kStatic, o.schedule.placement = PlacementPolicy::kPreviousStep;
  } else if (name == "central") {
    // One shared lock-free queue (boost::lockfree::queue) that every device takes from: no placement, no locality.
    o.schedule.policy = SchedulePolicy::kCentral, o.schedule.placement = PlacementPolicy::kEqual, o.schedule.endgame = EndGame::kOff;
    o.schedule.chunk_sizing = ChunkSizing::kFixed;
  } else if (name == "steal") {
    o.schedule.policy = SchedulePolicy::kSteal, o.schedule.placement = PlacementPolicy::kEqual, o.schedule.endgame = EndGame::kOff;
    o.schedule.chunk_sizing = ChunkSizing::kFixed;
  } else if (name == "steal-adaptive" || name == "steal-cost") {
    // steal-cost: the same, given each sample's cost with every step (the scenario's tokens).
    o.schedule.policy = SchedulePolicy::kSteal, o.schedule.placement = PlacementPolicy::kThroughput, o.schedule.endgame = EndGame::kOn;
    o.schedule.chunk_sizing = ChunkSizing::kBySpeed;
  } else if (name == "packer" || name == "packer-steal") {
    // A token-balanced packer: static, each step's samples packed onto the devices by the given cost (the tokens);
    // packer-steal: the packer's placement, with stealing to correct it.
    o.schedule.policy = name == "packer" ? SchedulePolicy::kStatic : SchedulePolicy::kSteal, o.schedule.placement = PlacementPolicy::kPacked;
  } else {
    throw ConfigError("policy = '" + name + "': expected static, oracle, lbbsp, central, steal, steal-adaptive, steal-cost, packer or packer-steal");
  }
  return {name, o};
}

struct Row {
  std::string scenario, policy;
  std::size_t devices = 0, chunk = 0, steps = 0;
  double step_ms = 0, ideal_ms = 0, efficiency = 0, speedup = 0, steals = 0, moved_mb = 0, util_min = 0, util_max = 0;
  std::uint64_t wrong = 0;
  std::vector<double> util;        // each device's median utilization
  double overhead_ms = -1;         // --overhead: the same steps with every simulated cost removed (median)
  double ideal_speedup = 0;        // the static split's ideal step / the ideal step (medians): the most stealing can gain
  double step_ms_per_step = 0;     // the median over single steps (the same as step_ms except for slowdown)
  double remote = 0;               // across ranks: chunks per step that ran on another rank than placed (median)
  double leave_us = -1;            // across ranks: a rank's last call for work, which found none (median, mean over ranks)
  std::size_t by_cost = 0;         // timed steps the runtime placed by learnt position costs
};


// The machine's sleep overshoot, with the 1 us timer slack the device threads use: what the ideal cannot include.
// Median and p99 over 200 sleeps of 1 ms.
std::pair<double, double> timer_jitter_us() {
  std::vector<double> over = detail::sleep_overshoots_us(200, std::chrono::milliseconds(1));
  return {median(over), percentile(over, 0.99)};
}

}  // namespace

int main(int argc, char** argv) {
  // A mode with flags of its own: there --devices is a device spec (cpu:2), here a count of simulated devices.
  if (std::any_of(argv + 1, argv + argc, [](const char* a) { return std::string_view(a) == "--chunk-overhead"; })) {
    return perf::run_chunk_overhead(argc, argv);
  }
  std::string scenarios_arg = "all", policies_arg = "all", json_path;
  std::size_t devices = 4, steps = 20, warmup = 3, chunk = 16, batch = 1024;
  double time_scale = 20.0;
  double attention_c = 1024;  // doclen: the length where attention's cost equals the rest's
  std::string lengths_path;   // doclen: the documents' lengths, one a line (empty: lognormal)
  double bytes_per_sample = 150e3, link_gbps = 25, allreduce_mb = 100, busbw_gbps = 100, latency_us = 10;
  double noise_pct = 0;                 // every chunk's speed x (1 +- noise_pct%), uniformly
  std::vector<double> step_change;      // {step, factor}: device 0's speed x factor from that step on
  CLI::App app{"stealbench: the runtime on simulated devices, scenario by policy, against the ideal"};
  app.footer("Mode: stealbench --chunk-overhead [--devices cpu:2] [--policy steal] [--chunks 4096] [--steps 50]: the runtime's cost per "
             "chunk with empty chunk functions on real devices (stealbench --chunk-overhead --help).\n"
             "Exit status: 0 every row exact and the outputs written; 1 a row's #wrong is not 0, or an output could not be written at the "
             "end; 2 a usage error (a flag, its value, an unwritable --json or --trace-dir), found before anything runs.");
  app.add_option("--scenario", scenarios_arg, "seed-slow,seed-skew,hetero,varcost,doclen,doclen-grouped,launch-bound,slowdown,scale or all (all: not the doclen ones nor launch-bound)")->capture_default_str();
  app.add_option("--policy", policies_arg, "static,oracle,lbbsp,central,steal,steal-adaptive,steal-cost,packer,packer-steal or all (the last three: doclen scenarios)")->capture_default_str();
  app.add_option("--devices", devices, "simulated devices (scale uses 4 to 64)")->check(CLI::Range(2, 1024))->capture_default_str();
  app.add_option("--steps", steps, "timed steps per row")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first (they also measure the devices)")->check(CLI::Range(0, 1000))->capture_default_str();
  app.add_option("--chunk", chunk, "samples per chunk (on the fastest device)")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--batch", batch, "samples per step (scale: per --devices devices, grown with the device count)")->check(CLI::Range(1, 1 << 24))->capture_default_str();
  app.add_option("--attention-c", attention_c, "doclen scenarios: a document's cost is L + L^2/c (torch_lm prints the c it fits)")
      ->check(perf::finite_range(1.0, 1e9))->capture_default_str();
  app.add_option("--lengths", lengths_path, "doclen scenarios: draw the documents' lengths from this file, one number in [1, 1e6] a line "
                 "(perf/sections/stealbench.sh writes torch_lm's); default: lognormal, median 245");
  app.add_option("--time-scale", time_scale, "simulated cost per sample = 5 us x this (larger: less timer noise, slower runs)")
      ->check(perf::finite_range(0.01, 1000.0))->capture_default_str();
  app.add_option("--bytes-per-sample", bytes_per_sample, "input bytes a stolen sample moves (150 kB: a 224x224 RGB image)")
      ->check(perf::finite_range(0.0, 1e9))->capture_default_str();
  app.add_option("--link-gbps", link_gbps, "link bandwidth for stolen inputs, GB/s")->check(perf::finite_range(0.001, 1e6))->capture_default_str();
  app.add_option("--allreduce-mb", allreduce_mb, "gradient bytes reduced per step, MB (100: 25M fp32 parameters)")
      ->check(perf::finite_range(0.0, 1e6))->capture_default_str();
  app.add_option("--busbw-gbps", busbw_gbps, "AllReduce bus bandwidth, GB/s")->check(perf::finite_range(0.001, 1e6))->capture_default_str();
  app.add_option("--latency-us", latency_us, "latency of a transfer and of the AllReduce, us")->check(perf::finite_range(0.0, 1e6))->capture_default_str();
  app.add_option("--noise", noise_pct, "random speed noise: each chunk runs at speed x (1 +- this %), uniformly")
      ->check(perf::finite_range(0.0, 90.0))->capture_default_str();
  app.add_option("--step-change", step_change, "STEP FACTOR: from that timed step on (0 to --steps - 1), device 0 runs at speed x FACTOR "
                 "(0.01 to 100)")->expected(2);
  std::size_t in_flight = 2;
  app.add_option("--in-flight", in_flight, "chunks a simulated device has launched and not finished, as on a GPU stream (1: synchronous)")
      ->check(CLI::Range(1, 16))->capture_default_str();
  double lead_us = RuntimeOptions{}.sim.launch_lead * 1e6;
  app.add_option("--launch-lead-us", lead_us,
                 "a device takes its next chunk when its queued work ends within this many us (0: as soon as fewer than --in-flight are queued)")
      ->check(perf::finite_range(0.0, 1e6))->capture_default_str();
  app.add_option("--json", json_path, "write the rows as JSON to this file");
  std::size_t per_rank = 0;
  app.add_option("--devices-per-rank", per_rank,
                 "under mpirun: each rank drives this many of the simulated devices (--devices is then ranks x this), and chunks "
                 "are stolen across ranks; policies static and steal-adaptive; compute only (no simulated transfers or AllReduce: "
                 "the real MPI reduction is in the step)")
      ->check(CLI::Range(0, 64))->capture_default_str();
  std::size_t probes = 0;
  app.add_option("--probes", probes, "across ranks: the other nodes' ranks a call for work reads (0: auto, every one up to 64; "
                 "ClusterOptions::probes)")->check(CLI::Range(std::size_t{0}, std::size_t{1} << 20))->capture_default_str();
  bool overhead = false;
  std::string trace_dir;
  app.add_flag("--overhead", overhead,
               "also run each row with every simulated cost removed (compute, transfers, AllReduce): what is left is the "
               "runtime's own time, reported as overhead(ms) and a percentage of the step");
  app.add_option("--trace-dir", trace_dir, "write a Chrome trace of each row's steps to DIR/trace_SCENARIO_POLICY_N.json (across ranks: one file a rank, "
                 "trace_SCENARIO_POLICY_N.rankR.json, which perf/merge_traces.py joins)");
  if (const int rc = perf::parse(app, argc, argv); rc >= 0) return rc;
  const auto refuse = [](const std::string& message) { return perf::usage_error("stealbench", message); };
  const auto num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return std::string(b);
  };

  // What no single flag's check can see, and the outputs: all found before the run.
  std::vector<std::string> scen = scenarios_arg == "all"
                                      ? std::vector<std::string>{"seed-slow", "seed-skew", "hetero", "varcost", "slowdown", "scale"}
                                      : split(scenarios_arg);
  for (const std::string& s : scen) {
    if (std::find(kScenarios.begin(), kScenarios.end(), s) == kScenarios.end()) {
      return refuse("--scenario = '" + s + "': expected seed-slow, seed-skew, hetero, varcost, doclen, doclen-grouped, launch-bound, slowdown or scale, "
                    "comma-separated, or all");
    }
  }
  std::vector<std::string> pols = policies_arg == "all" ? (per_rank > 0 ? std::vector<std::string>{"static", "steal-adaptive"} : kPolicies)
                                                        : split(policies_arg);
  const bool doclen_only = std::all_of(scen.begin(), scen.end(), [](const std::string& s) { return s.rfind("doclen", 0) == 0; });
  for (const std::string& p : pols) {
    if (std::find(kPolicies.begin(), kPolicies.end(), p) == kPolicies.end()) {
      return refuse("--policy = '" + p + "': expected static, oracle, lbbsp, central, steal, steal-adaptive, steal-cost, packer or "
                    "packer-steal, comma-separated, or all");
    }
    if (policies_arg != "all" && takes_costs(p) && (per_rank > 0 || !doclen_only)) {
      return refuse("--policy " + p + " needs doclen scenarios (they give each sample's cost), in one process; --scenario is " + scenarios_arg +
                    (per_rank > 0 ? ", with --devices-per-rank" : ""));
    }
  }
  if (!step_change.empty()) {
    const double at = step_change[0], by = step_change[1];
    if (!(at >= 0 && at < static_cast<double>(steps) && at == std::floor(at))) {
      return refuse("--step-change STEP = " + num(at) + ": expected a whole number in [0, " + std::to_string(steps - 1) + "] (a timed step of this run)");
    }
    if (!(by >= 0.01 && by <= 100)) return refuse("--step-change FACTOR = " + num(by) + ": expected a number in [0.01, 100] (device 0's speed x this)");
  }
  {
    // Sample ids are 32-bit, and varcost and doclen keep a cost for every sample of a row; scale grows the batch
    // with the device count, up to 64.
    constexpr std::size_t kMaxRowSamples = std::size_t{1} << 28;
    const bool scale = per_rank == 0 && std::find(scen.begin(), scen.end(), "scale") != scen.end();
    const std::size_t row_batch = scale ? std::max(batch, batch * 64 / devices) : batch;
    if (row_batch * (warmup + steps) > kMaxRowSamples) {
      return refuse("--batch x (--warmup + --steps) = " + std::to_string(row_batch) + " x " + std::to_string(warmup + steps) + " samples a row" +
                    (scale ? " (scale: at 64 devices)" : "") + ": at most " + std::to_string(kMaxRowSamples));
    }
  }
  if (!perf::check_output_file("stealbench", app, "--json", json_path) || !perf::check_output_dir("stealbench", app, "--trace-dir", trace_dir)) {
    return perf::kExitUsage;
  }
  std::vector<double> lengths;
  if (!lengths_path.empty()) {
    errno = 0;
    std::ifstream in(lengths_path);
    if (!in) return refuse("--lengths = '" + lengths_path + "': cannot open it: " + (errno != 0 ? std::strerror(errno) : "unknown reason"));
    std::string line;
    for (std::size_t no = 1; std::getline(in, line); ++no) {
      while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
      if (line.empty()) continue;
      char* end = nullptr;
      const double v = std::strtod(line.c_str(), &end);
      // A document's length in tokens; at most a million keeps L^2 / c, and the mean of the costs, finite.
      if (end == line.c_str() || *end != '\0' || !(v >= 1 && v <= 1e6)) {
        return refuse("--lengths = '" + lengths_path + "', line " + std::to_string(no) + ": '" + line + "' is not a number in [1, 1e+06]");
      }
      lengths.push_back(v);
    }
    if (lengths.empty()) return refuse("--lengths = '" + lengths_path + "': the file holds no lengths");
  }

  std::shared_ptr<Cluster> cluster;
  int rank = 0, ranks = 1;
  if (per_rank > 0) {
#ifdef STEALBATCH_HAS_MPI
    cluster = mpi::MpiCluster::world();
    rank = cluster->rank(), ranks = cluster->size();
    devices = per_rank * static_cast<std::size_t>(ranks);
    bytes_per_sample = 0, allreduce_mb = 0, overhead = false;
    if (rank != 0 && std::freopen("/dev/null", "w", stdout) == nullptr) return 2;
#else
    std::fprintf(stderr, "stealbench: --devices-per-rank needs a build with MPI (STEALBATCH_MPI)\n");
    return 2;
#endif
  }
  const bool quiet = rank != 0;
  // Across ranks: what every rank saw, summed (each rank puts its own in its slot, or adds its part).
  auto sum_over_ranks = [&](std::vector<double> v) {
    if (cluster) cluster->allreduce_sum(v);
    return v;
  };

  // static first, whatever the order asked: every other row's speedup is against it.
  std::stable_sort(pols.begin(), pols.end(), [&](const std::string& a, const std::string& b) {
    return std::find(kPolicies.begin(), kPolicies.end(), a) < std::find(kPolicies.begin(), kPolicies.end(), b);
  });
  const double sample_seconds = 5e-6 * time_scale;

  const auto [jit50, jit99] = timer_jitter_us();
  std::printf("# stealbench, stealbatch %s: batch %zu, chunk %zu, %zu warm-up + %zu timed steps per row, %.1f us per sample at speed 1, "
              "%zu chunk%s in flight per device, the next taken %.0f us before the queue runs out\n",
              kVersionString, batch, chunk, warmup, steps, sample_seconds * 1e6, in_flight, in_flight == 1 ? "" : "s", lead_us);
  std::printf("# timer overshoot of a 1 ms sleep on this machine: median %.1f us, p99 %.1f us (the ideal does not include it)\n", jit50, jit99);
  std::printf("# stolen inputs: %.0f bytes per sample over %.0f GB/s + %.0f us; AllReduce: %.0f MB at busbw %.0f GB/s, ring model\n",
              bytes_per_sample, link_gbps, latency_us, allreduce_mb, busbw_gbps);
  std::printf("# ideal = the step's sample costs / the devices' summed speed + 2(n-1)/n x AllReduce bytes / busbw + latency,\n");
  std::printf("#   median over steps (slowdown: step and ideal are medians over 3-step periods, each holding one drop, and the\n"
              "#   ideal of a drop step has device 0 at 30%% from the drop on);\n");
  std::printf("# efficiency = ideal / step (medians)\n");
  std::printf("# speedup = static step / this step, same scenario and devices; steals per step; util = busy / step (min and max over devices)\n#\n");
  if (overhead) std::printf("# overhead = the same steps with every simulated cost at zero (median): the runtime's own time, and its share of step\n");
  std::printf("# ideal-x = the static split's ideal step / the ideal step: the largest speedup over static there is\n");
  if (cluster) {
    std::printf("# across %d ranks x %zu devices (mpirun): remote = chunks per step run on another rank than placed; leave(us) = a rank's last\n"
                "#   call for work, which read every other rank's share and found none (median over steps, mean over ranks);\n"
                "#   the ideal includes each step's measured reduction: the wait in it of the rank that reached it last\n", ranks, per_rank);
  }
  std::printf("# bycost = timed steps the runtime placed by cost: given sample costs (steal-cost, packer) or learnt batch-position ones (schedule.cost_by_position)\n");
  std::printf("%-10s %-15s %5s %10s %10s %6s %8s %8s %8s %9s %6s %6s %7s %6s%s%s\n", "# scenario", "policy", "devs", "step(ms)", "ideal(ms)", "eff",
              "speedup", "ideal-x", "steals", "moved(MB)", "umin", "umax", "#wrong", "bycost", overhead ? " overhead(ms)  share" : "",
              cluster ? "  remote leave(us)" : "");

  std::vector<Row> rows;
  try {
    for (const std::string& sname : scen) {
      // Across ranks the device count is the job's (ranks x --devices-per-rank): scale then runs that one count.
      const std::vector<std::size_t> counts =
          sname == "scale" && !cluster ? std::vector<std::size_t>{4, 8, 16, 32, 64} : std::vector<std::size_t>{devices};
      for (std::size_t n : counts) {
        // scale keeps the samples per device of --devices (weak scaling, as a data-parallel run grows its batch).
        const std::size_t step_batch = sname == "scale" ? std::max<std::size_t>(1, batch * n / devices) : batch;
        Scenario sc = make_scenario(sname == "scale" ? "hetero" : sname, n, step_batch, step_batch * (warmup + steps), attention_c, lengths);
        if (noise_pct > 0 || !step_change.empty()) {
          // Speed schedules on top of the scenario's own: a step change of device 0 and per-chunk noise. The noise
          // generator is per device, so the device threads never share one.
          auto inner = sc.speed_factor;
          auto rngs = std::make_shared<std::vector<std::mt19937_64>>();
          for (std::size_t d = 0; d < n; ++d) rngs->emplace_back(1000 + d);
          const double noise = noise_pct / 100.0;
          // The runtime numbers its steps from 1: timed step k (from 0) is step warmup + k + 1.
          const bool changes = !step_change.empty();
          const std::uint64_t change_at = changes ? static_cast<std::uint64_t>(step_change[0]) + warmup : 0;
          const double change_by = changes ? step_change[1] : 1.0;
          sc.speed_factor = [inner, rngs, noise, changes, change_at, change_by](std::size_t d, std::uint64_t step, double t) {
            double f = inner ? inner(d, step, t) : 1.0;
            if (changes && d == 0 && step > change_at) f *= change_by;
            if (noise > 0) f *= 1.0 + noise * std::uniform_real_distribution<double>(-1.0, 1.0)((*rngs)[d]);
            return f;
          };
        }
        // slowdown: a third of the way into the ideal step, device 0 drops to 30%, every third step. Its step and
        // ideal are medians over periods of three steps (each holds one drop), not over steps: the median step of a
        // three-step cycle is never a drop step, so a per-step median leaves out the very event the scenario is about.
        const bool drops = sname == "slowdown";
        constexpr std::size_t kDropPeriod = 3;
        constexpr double kDropFactor = 0.3;
        const double drop_at = 1.0 / 3.0 * static_cast<double>(step_batch) * sample_seconds / static_cast<double>(n);
        // The runtime numbers its steps from 1; loop index i runs step i + 1.
        auto drop_step = [&](std::size_t i) { return drops && (i + 1) % kDropPeriod == 0; };
        if (drops) {
          auto inner = sc.speed_factor;  // --noise and --step-change, on top of the drop
          sc.speed_factor = [inner, drop_at](std::size_t d, std::uint64_t step, double t) {
            const double f = inner ? inner(d, step, t) : 1.0;
            return (d == 0 && step % kDropPeriod == 0 && t >= drop_at) ? f * kDropFactor : f;
          };
        }
        // Time to do `work` seconds of speed-1 compute at `speed`, or at speed x kDropFactor from drop_at on when
        // `lose` of that speed drops (the fluid bound: work moves freely between devices).
        auto finish_time = [&](double work_s, double speed, double lose, bool dropped) {
          if (!dropped || work_s / speed <= drop_at) return work_s / speed;
          return drop_at + (work_s - speed * drop_at) / (speed - lose * (1.0 - kDropFactor));
        };
        double static_ms = 0;
        for (const std::string& pname : pols) {
          // The policies given costs: the doclen scenarios in one process, left out of "all" elsewhere (asked for
          // by name elsewhere, they were refused before the run).
          const bool given = takes_costs(pname);
          if (given && (cluster || !sc.tokens)) continue;
          PolicySetup ps = make_policy(pname, sc);
          std::string spec = "sim:";
          // Across ranks, rank r drives devices [r x per_rank, (r + 1) x per_rank) of the scenario.
          const std::size_t d0 = cluster ? static_cast<std::size_t>(rank) * per_rank : 0, d1 = cluster ? d0 + per_rank : n;
          for (std::size_t i = d0; i < d1; ++i) spec += (i > d0 ? "," : "") + std::to_string(sc.speeds[i]);
          ps.options.devices = spec;
          ps.options.cluster.job = cluster;
          ps.options.cluster.probes = probes;
          if (cluster && sc.speed_factor) {
            auto global = sc.speed_factor;  // the scenario indexes the job's devices
            ps.options.sim.speed_factor = [global, d0](std::size_t d, std::uint64_t step, double t) { return global(d0 + d, step, t); };
          }
          ps.options.schedule.chunk_size = sc.call_samples > 0 ? 0 : chunk;
          ps.options.sim.call_seconds = sc.call_samples * sample_seconds;
          ps.options.sim.sample_seconds = sample_seconds;
          ps.options.sim.sample_cost = sc.cost;
          if (!cluster) ps.options.sim.speed_factor = sc.speed_factor;
          ps.options.sim.bytes_per_sample = bytes_per_sample;
          ps.options.sim.link_bw = link_gbps * 1e9;
          ps.options.sim.link_latency = latency_us * 1e-6;
          ps.options.sim.allreduce_bytes = allreduce_mb * 1e6;
          ps.options.sim.busbw = busbw_gbps * 1e9;
          ps.options.gpu.in_flight = in_flight;
          ps.options.sim.launch_lead = lead_us * 1e-6;
          // The ring AllReduce floor of nccl-tests' PERFORMANCE.md, plus its latency: part of the ideal.
          const double nd = static_cast<double>(n);
          const double t_ar = allreduce_mb > 0 ? 2.0 * (nd - 1.0) / nd * allreduce_mb * 1e6 / (busbw_gbps * 1e9) + latency_us * 1e-6 : 0.0;
          if (!trace_dir.empty()) ps.options.trace_path = trace_dir + "/trace_" + sname + "_" + pname + "_" + std::to_string(n) + ".json";
          Runtime rt(ps.options);
          ParameterLayout layout;
          layout.add("counts", 1);
          rt.register_parameters(layout, std::vector<float>{0.0f});
          std::vector<std::uint32_t> samples(step_batch);
          std::vector<std::atomic<std::uint32_t>> seen(step_batch);
          const double speed_sum = std::accumulate(sc.speeds.begin(), sc.speeds.end(), 0.0);
          std::vector<double> step_s, ideal_s, ideal_static_s, umin, umax, steals, moved, remote, leave;
          std::vector<std::vector<double>> util(n);
          std::uint64_t wrong = 0;
          std::size_t by_cost = 0;  // timed steps placed by position costs
          std::vector<double> given_cost(given ? step_batch : 0);
          for (std::size_t i = 0; i < warmup + steps; ++i) {
            const auto first = static_cast<std::uint32_t>(i * step_batch);
            std::iota(samples.begin(), samples.end(), first);
            double work = 0;
            for (std::uint32_t s : samples) work += sc.cost ? sc.cost(s) : 1.0;
            for (auto& c : seen) c.store(0, std::memory_order_relaxed);
            for (std::size_t k = 0; k < given_cost.size(); ++k) given_cost[k] = sc.tokens(samples[k]);
            const StepReport r = rt.compute_gradient(samples, [&](ChunkContext& ctx) {
              for (std::uint32_t s : ctx.samples) seen[s - first].fetch_add(1, std::memory_order_relaxed);
              ctx.grad[0] += static_cast<float>(ctx.samples.size());
            }, given_cost);
            double t_reduce = 0;  // across ranks: the step's measured reduction, part of its ideal
            {
              std::vector<double> runs(step_batch + 2 + static_cast<std::size_t>(ranks));
              for (std::size_t k = 0; k < step_batch; ++k) runs[k] = seen[k].load(std::memory_order_relaxed);
              runs[step_batch] = static_cast<double>(r.remote_chunks);
              runs[step_batch + 1] = r.leave_s;
              runs[step_batch + 2 + static_cast<std::size_t>(rank)] = r.reduce_s;
              runs = sum_over_ranks(std::move(runs));
              for (std::size_t k = 0; k < step_batch; ++k) wrong += runs[k] != 1.0;
              if (i >= warmup) remote.push_back(runs[step_batch]), leave.push_back(runs[step_batch + 1] / ranks * 1e6);
              // Each rank's wait in the reduction; the rank that reached it last waited for no one: its wait is the
              // reduction's own time (the tally through MPI_Allreduce, and the in-rank sum).
              if (cluster) t_reduce = *std::min_element(runs.begin() + static_cast<std::ptrdiff_t>(step_batch + 2), runs.end());
            }
            if (i < warmup) continue;
            // A step change sets device 0's speed from its step on (and so what a drop takes from it).
            const double speed0_now = sc.speeds[0] * (!step_change.empty() && i + 1 > static_cast<std::size_t>(step_change[0]) + warmup ? step_change[1] : 1.0);
            const double speeds_now = speed_sum - sc.speeds[0] + speed0_now;
            // A fixed cost a call: every device runs its share in one call and all end together, a + W / S (a device
            // left idle would leave the others more).
            const double t_call = sc.call_samples * sample_seconds;
            ideal_s.push_back(t_call + finish_time(work * sample_seconds, speeds_now, speed0_now, drop_step(i)) + t_ar + t_reduce);
            if (t_call > 0) {
              // The static split at its best: an equal share per device, each in one call.
              double worst = 0;
              for (std::size_t d = 0; d < n; ++d) {
                double w = 0;
                for (std::size_t s = d * step_batch / n; s < (d + 1) * step_batch / n; ++s) w += sc.cost ? sc.cost(samples[s]) : 1.0;
                worst = std::max(worst, t_call + w * sample_seconds / sc.speeds[d]);
              }
              ideal_static_s.push_back(worst + t_ar + t_reduce);
            } else {
              // The static split at its best: an equal share of the chunks per device, each at its true speed.
              const std::size_t nchunks = (step_batch + chunk - 1) / chunk;
              const std::vector<ChunkRange> share = place_equal(nchunks, n);
              double worst = 0;
              for (std::size_t d = 0; d < n; ++d) {
                double w = 0;
                for (std::size_t s = share[d].begin * chunk; s < std::min<std::size_t>(share[d].end * chunk, step_batch); ++s) {
                  w += sc.cost ? sc.cost(samples[s]) : 1.0;
                }
                const double speed_d = sc.speeds[d] * (d == 0 && !step_change.empty() && i + 1 > static_cast<std::size_t>(step_change[0]) + warmup ? step_change[1] : 1.0);
                worst = std::max(worst, finish_time(w * sample_seconds, speed_d, d == 0 ? speed_d : 0.0, drop_step(i)));
              }
              ideal_static_s.push_back(worst + t_ar + t_reduce);
            }
            step_s.push_back(r.step_s);
            by_cost += r.placed_by_cost ? 1 : 0;
            steals.push_back(static_cast<double>(r.steals));
            moved.push_back(r.bytes_moved);
            double lo = 1e9, hi = 0;
            for (const DeviceReport& d : r.devices) lo = std::min(lo, d.utilization), hi = std::max(hi, d.utilization);
            for (std::size_t d = 0; d < r.devices.size() && d < n; ++d) util[d].push_back(r.devices[d].utilization);
            umin.push_back(lo), umax.push_back(hi);
            if (!quiet) std::fprintf(stderr, "\r%s %s n=%zu: step %zu/%zu   ", sname.c_str(), pname.c_str(), n, i + 1 - warmup, steps);
          }
          if (!quiet) std::fprintf(stderr, "\r%60s\r", "");
          Row row;
          row.scenario = sname, row.policy = pname, row.devices = n, row.chunk = ps.options.schedule.chunk_size, row.steps = steps;
          row.step_ms_per_step = median(step_s) * 1e3;
          if (drops) {
            // Means over whole periods (each holds exactly one drop step), then the median over the periods.
            auto by_period = [&](const std::vector<double>& v) {
              std::vector<double> out;
              for (std::size_t at = 0; at + kDropPeriod <= v.size(); at += kDropPeriod) {
                out.push_back(std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(at), v.begin() + static_cast<std::ptrdiff_t>(at + kDropPeriod), 0.0) /
                              static_cast<double>(kDropPeriod));
              }
              return out.empty() ? v : out;  // fewer steps than a period: per step
            };
            step_s = by_period(step_s), ideal_s = by_period(ideal_s), ideal_static_s = by_period(ideal_static_s);
          }
          row.step_ms = median(step_s) * 1e3;
          row.ideal_ms = median(ideal_s) * 1e3;
          row.efficiency = row.ideal_ms / row.step_ms;
          row.ideal_speedup = median(ideal_static_s) * 1e3 / row.ideal_ms;
          if (pname == "static") static_ms = row.step_ms;
          row.speedup = static_ms > 0 ? static_ms / row.step_ms : 0;
          row.steals = median(steals);
          row.moved_mb = median(moved) / 1e6;
          row.util_min = median(umin);
          row.util_max = median(umax);
          row.wrong = wrong;
          row.by_cost = by_cost;
          if (cluster) row.remote = median(remote), row.leave_us = median(leave);
          for (auto& u : util) row.util.push_back(median(u));
          if (overhead) {
            // The same runtime, policy, chunking and placement machinery with every simulated cost at zero: the
            // steps then take only what the runtime itself spends (dispatch, steals, wake-ups, the reduction's
            // bookkeeping, the step's set-up).
            RuntimeOptions zo = ps.options;
            zo.sim.sample_seconds = 0, zo.sim.call_seconds = 0, zo.sim.bytes_per_sample = 0, zo.sim.allreduce_bytes = 0, zo.sim.speed_factor = {}, zo.trace_path.clear();
            Runtime zr(zo);
            ParameterLayout zl;
            zl.add("counts", 1);
            zr.register_parameters(zl, std::vector<float>{0.0f});
            std::vector<double> zs;
            for (std::size_t i = 0; i < warmup + steps; ++i) {
              std::iota(samples.begin(), samples.end(), static_cast<std::uint32_t>(i * step_batch));
              const StepReport r = zr.compute_gradient(samples, [](ChunkContext& ctx) { ctx.grad[0] += static_cast<float>(ctx.samples.size()); });
              if (i >= warmup) zs.push_back(r.step_s);
            }
            row.overhead_ms = median(zs) * 1e3;
          }
          rows.push_back(row);
          std::printf("%-10s %-15s %5zu %10.3f %10.3f %6.3f %8.2f %8.2f %8.1f %9.2f %6.2f %6.2f %7llu", row.scenario.c_str(), row.policy.c_str(),
                      row.devices, row.step_ms, row.ideal_ms, row.efficiency, row.speedup, row.ideal_speedup, row.steals, row.moved_mb, row.util_min,
                      row.util_max, static_cast<unsigned long long>(row.wrong));
          std::printf(" %6zu", row.by_cost);
          if (overhead) std::printf(" %9.3f %6.2f%%", row.overhead_ms, 100.0 * row.overhead_ms / row.step_ms);
          if (cluster) std::printf(" %7.1f %9.1f", row.remote, row.leave_us);
          std::printf("\n");
          std::fflush(stdout);
        }
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "stealbench: %s\n", e.what());
    return 2;
  }
  std::uint64_t wrong = 0;
  for (const Row& r : rows) wrong += r.wrong;
  std::printf("#\n# summary: %zu rows, #wrong total %llu\n", rows.size(), static_cast<unsigned long long>(wrong));
  if (!json_path.empty() && !quiet) {
    nlohmann::json j = nlohmann::json::array();
    for (const Row& r : rows) {
      j.push_back({{"scenario", r.scenario}, {"policy", r.policy}, {"devices", r.devices}, {"chunk", r.chunk}, {"steps", r.steps},
                   {"step_ms_median", r.step_ms}, {"ideal_ms", r.ideal_ms}, {"efficiency", r.efficiency}, {"speedup_vs_static", r.speedup},
                   {"steals_per_step", r.steals}, {"bytes_moved_per_step", r.moved_mb * 1e6}, {"util_min", r.util_min}, {"util_max", r.util_max}, {"wrong", r.wrong},
                   {"util", r.util}, {"ideal_speedup", r.ideal_speedup}, {"step_ms_median_per_step", r.step_ms_per_step},
                   {"steps_placed_by_cost", r.by_cost}, {"statistic", r.scenario == "slowdown" ? "median over 3-step periods" : "median over steps"},
                   {"ranks", ranks}, {"devices_per_rank", per_rank}, {"remote_chunks_per_step", r.remote}, {"leave_us", r.leave_us}});
      if (r.overhead_ms >= 0) j.back()["overhead_ms"] = r.overhead_ms, j.back()["overhead_pct"] = 100.0 * r.overhead_ms / r.step_ms;
    }
    if (!perf::write_output("stealbench", "--json", json_path, j.dump(2) + "\n")) return 1;
    std::printf("# wrote %s\n", json_path.c_str());
  }
  return wrong == 0 ? 0 : 1;
}

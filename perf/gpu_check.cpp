// gpu_check: the GPU half of perf/device_check.sh. On a machine with a GPU it measures, in sections:
//   equivalence-mlp, equivalence-cnn  the GPU gradient against the CPU device's on fixed Fashion-MNIST batches
//   throughput-mlp, throughput-cnn    training samples/s on one GPU (to set against perf/torch_ref.py)
//   vgpu      static against steal against the ideal on unequal green-context parts of one GPU
//   curve     samples/s against chunk size on one GPU
//   reduce    the reduction phase of real steps (cuda:0, and across vgpu parts), and NCCL's AllReduce over every GPU
//             (on one GPU an in-place AllReduce of one rank, which moves no data: labelled so)
//   deterministic  the MLP trained 30 Adam steps in deterministic mode on cuda:0 (steal, static) and on vgpu parts
//             (steal, static): the parameters' SHA-256 must be one; and the mode's samples/s against the default's
//             on cuda:0, interleaved
// and writes one JSON. `--section NAME` runs one section (the device check runs each in its own process, so that a
// sticky CUDA error loses only its own section). Without a GPU it says so and exits 2.
// Exit status: 0 every section passed and the JSON written; 1 a section failed, or the JSON could not be written; 2 a
// usage error (a flag, its value, an unwritable --json), found before anything runs, or no GPU.
#include "tool_cli.hpp"

#include <stealbatch/models/cnn_model.hpp>
#include <stealbatch/models/layers.hpp>
#include <stealbatch/models/mlp_model.hpp>
#include <stealbatch/models/models_cuda.hpp>

#include <stealbatch/cuda/backend.hpp>
#include <stealbatch/cuda/check.hpp>
#include <stealbatch/cuda/device_info.hpp>
#include <stealbatch/cuda/green.hpp>
#include <stealbatch/cuda/handles.hpp>
#include <stealbatch/error.hpp>
#include <stealbatch/data/idx.hpp>
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/sha256.hpp>
#include <stealbatch/stats.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <vector>

using namespace stealbatch;
using examples::DenseData;
using examples::max_relative_error;
using json = nlohmann::json;

namespace {

RuntimeOptions options(const std::string& devices, SchedulePolicy policy, std::size_t chunk, const DenseData& d, GpuWait wait = GpuWait::kSpin) {
  RuntimeOptions o;
  o.devices = devices;
  o.gpu.wait = wait;
  o.schedule.policy = policy;
  o.schedule.chunk_size = chunk;
  o.gpu.input_bytes = examples::gpu_input_bytes(d);
  o.gpu.gather = [&d](std::uint32_t s, std::byte* dst) { examples::gather_sample(d, s, dst); };
  o.optimizer.lr = 0.01f;
  return o;
}

std::vector<float> mean_gradient(RuntimeOptions o, const ParameterLayout& layout, std::span<const float> p, std::size_t batch,
                                 const ChunkFunction& fn) {
  Runtime rt(std::move(o));
  rt.register_parameters(layout, p);
  std::vector<std::uint32_t> idx(batch);
  std::iota(idx.begin(), idx.end(), 0u);
  rt.compute_gradient(idx, fn);
  return {rt.gradient().begin(), rt.gradient().end()};
}

// Median step time and samples/s of `steps` training steps after `warmup`, over consecutive batches.
struct Timing {
  double step_ms = 0, samples_per_s = 0, reduce_ms = 0;
  double tail_ms = 0;  // median of the reduction and the update, after the chunks
  std::uint64_t steals = 0;
  std::size_t chunk_samples = 0;  // device 0's, in the last step
  std::vector<double> util;
  // Each device's samples/s while all of them ran: its samples over its device-timed compute (StepReport's
  // compute_s; on a GPU the sum of its chunks' CUDA-event times), summed over the timed steps.
  std::vector<double> rate;
};

Timing time_steps(Runtime& rt, const DenseData& d, std::size_t batch, std::size_t warmup, std::size_t steps, const ChunkFunction& fn) {
  std::vector<std::uint32_t> idx(batch);
  std::vector<double> step_s, reduce_s, tail_s;
  Timing t;
  std::vector<std::vector<double>> util(rt.device_count());
  std::vector<double> samples(rt.device_count()), busy(rt.device_count());
  StepReport last;
  for (std::size_t i = 0; i < warmup + steps; ++i) {
    for (std::size_t k = 0; k < batch; ++k) idx[k] = static_cast<std::uint32_t>((i * batch + k) % d.count);
    const StepReport r = rt.step(idx, fn);
    last = r;
    if (i < warmup) continue;
    step_s.push_back(r.step_s);
    reduce_s.push_back(r.reduce_s);
    tail_s.push_back(r.reduce_s + r.optimizer_s);
    t.steals += r.steals;
    for (std::size_t dv = 0; dv < r.devices.size(); ++dv) {
      util[dv].push_back(r.devices[dv].utilization);
      if (dv < samples.size()) samples[dv] += static_cast<double>(r.devices[dv].samples), busy[dv] += r.devices[dv].compute_s;
    }
  }
  t.tail_ms = median(tail_s) * 1e3;
  for (std::size_t dv = 0; dv < samples.size(); ++dv) t.rate.push_back(busy[dv] > 0 ? samples[dv] / busy[dv] : 0.0);
  t.step_ms = median(step_s) * 1e3;
  t.reduce_ms = median(reduce_s) * 1e3;
  t.samples_per_s = static_cast<double>(batch) / median(step_s);
  t.chunk_samples = last.devices.empty() ? 0 : last.devices[0].chunk_samples;
  for (auto& u : util) t.util.push_back(median(u));
  return t;
}

// A figure for the JSON: nlohmann writes a NaN or an infinity as null, which would read as "missing"; say what it was.
json figure(double x) {
  if (std::isfinite(x)) return x;
  return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
}

void line(const char* fmt, auto... args) {
  std::printf(fmt, args...);
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpu_check: GPU gradient equivalence, throughput, virtual-GPU balance, the chunk curve and the reduction, as one JSON"};
  std::string data = "/usr/share/datasets/fashion-mnist", out = "gpu_check.json", vgpu = "64,16,16,16", only;
  std::size_t steps = 100, vgpu_steps = 20, vgpu_batch = 16384, vgpu_chunk = 512, vgpu_hidden = 2048;
  bool quick = false;
  const std::vector<std::string> kSections = {"equivalence-mlp", "equivalence-cnn", "throughput-mlp", "throughput-cnn", "vgpu", "curve", "reduce",
                                              "deterministic"};
  app.add_option("--data", data, "Fashion-MNIST folder (the IDX .gz files)");
  app.add_option("--json", out, "where to write the figures");
  app.add_option("--section", only, "run this section only (equivalence-mlp, equivalence-cnn, throughput-mlp, throughput-cnn, vgpu, curve, reduce, deterministic)")
      ->check(CLI::IsMember(kSections));
  app.add_option("--steps", steps, "timed steps per throughput figure (after 20 warm-up steps)")->check(CLI::Range(2, 100000));
  app.add_option("--vgpu", vgpu, "SM counts of the virtual GPUs (rounded up to the GPU's partition granularity)");
  app.add_option("--vgpu-steps", vgpu_steps, "timed steps per vgpu policy")->check(CLI::Range(1, 10000));
  app.add_option("--vgpu-batch", vgpu_batch, "the vgpu check's batch")->check(CLI::Range(1, 1 << 20));
  app.add_option("--vgpu-chunk", vgpu_chunk, "the vgpu check's chunk size (0: automatic)")->check(CLI::Range(0, 1 << 20));
  app.add_option("--vgpu-hidden", vgpu_hidden, "the vgpu check's MLP width (784-H-H-10), large enough to fill the SMs")->check(CLI::Range(1, 16384));
  app.add_flag("--quick", quick, "fewer steps (a rehearsal)");
  app.footer("Exit status: 0 every section passed and the JSON written; 1 a section failed, or the JSON could not be written; 2 a usage "
             "error (a flag, its value, an unwritable --json), found before anything runs, or no GPU.");
  if (const int rc = perf::parse(app, argc, argv); rc >= 0) return rc;
  if (!perf::check_output_file("gpu_check", app, "--json", out)) return perf::kExitUsage;
  if (quick) steps = 10, vgpu_steps = 4;

  cuda::enable();
  json j;
  if (cuda::device_count() == 0) {
    std::fprintf(stderr, "gpu_check: no GPU: %s\n", cuda::no_device_reason().c_str());
    return 2;
  }
  const auto write = [&] { return perf::write_output("gpu_check", "--json", out, j.dump(2) + "\n"); };
  try {
    cudaDeviceProp prop{};
    SB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    j["gpu"] = {{"name", prop.name}, {"count", cuda::device_count()}, {"sms", prop.multiProcessorCount}, {"nccl", cuda::nccl_version()},
                {"cuda_device_max_connections", connections ? connections : "unset (8)"}};
    line("GPU: %s x%d, %d SMs, NCCL %d, CUDA_DEVICE_MAX_CONNECTIONS %s", prop.name, cuda::device_count(), prop.multiProcessorCount,
         cuda::nccl_version(), connections ? connections : "unset (8)");

    const Dataset train_ds = load_fashion_mnist(data, DataSplit::kTrain);
    const DenseData train{train_ds.count, train_ds.features, train_ds.x, train_ds.y};
    const examples::MlpModel mlp({784, 256, 128, 10});
    const examples::MlpCuda mlp_gpu({784, 256, 128, 10});
    const examples::CnnModel cnn;
    const examples::CnnCuda cnn_gpu;
    auto mlp_cpu_fn = [&](ChunkContext& c) {
      thread_local examples::MlpModel::Workspace ws;
      c.add_loss(mlp.accumulate_gradient(c.params, c.grad, train, c.samples, ws));
    };
    auto cnn_cpu_fn = [&](ChunkContext& c) {
      thread_local examples::CnnModel::Workspace ws;
      c.add_loss(cnn.accumulate_gradient(c.params, c.grad, train, c.samples, ws));
    };
    auto mlp_fn = [&](ChunkContext& c) { mlp_gpu.accumulate(c); };
    auto cnn_fn = [&](ChunkContext& c) { cnn_gpu.accumulate(c); };

    // 1. Equivalence: the same batch, parameters and chunking on the CPU device and on the GPU.
    const auto equivalence = [&](const char* name, const ParameterLayout& layout, const std::vector<float>& p, std::size_t batch,
                                 const ChunkFunction& cpu_fn, const ChunkFunction& gpu_fn) {
      const auto ref = mean_gradient(options("cpu:1", SchedulePolicy::kSteal, 64, train), layout, p, batch, cpu_fn);
      const auto g = mean_gradient(options("cuda:0", SchedulePolicy::kSteal, 64, train), layout, p, batch, gpu_fn);
      const double e = max_relative_error(g, ref);  // +infinity when either side holds a NaN or an infinity
      j["equivalence"][std::string(name) + "_rel_err"] = figure(e);
      j["equivalence"][std::string(name) + "_batch"] = batch;
      j["equivalence"]["target"] = 1e-4;
      line("equivalence: %s rel err %.3g (batch %zu); target <= 1e-4: %s", name, e, batch, e <= 1e-4 ? "PASS" : "FAIL");
      if (!(e <= 1e-4)) throw Error(std::string("equivalence: ") + name + " GPU gradient differs from the CPU's by " + std::to_string(e));
    };

    // 2. Throughput on one GPU: batch 256, one chunk per step (what a one-GPU trainer would do), SGD; with each way
    // of waiting for the GPU (GpuWait), interleaved, so that the default can be the faster one.
    const auto throughput = [&](const std::string& name, const ParameterLayout& layout, const std::vector<float>& params, const ChunkFunction& fn) {
      // chunk 256 (one chunk a step) with each wait, the automatic size (after its ladder is explored), chunk 256
      // replayed from CUDA graphs (gpu.graphs), and that with the training set held on the GPU (gpu.resident).
      std::vector<double> rate[5];
      std::size_t chosen = 0;
      for (int round = 0; round < 3; ++round) {
        for (int run = 0; run < 5; ++run) {
          const GpuWait w = run == 1 ? GpuWait::kBlock : GpuWait::kSpin;
          RuntimeOptions o = options("cuda:0", SchedulePolicy::kSteal, run == 2 ? 0 : 256, train, w);
          o.gpu.graphs = run >= 3;
          o.gpu.resident = run == 4 ? train.count : 0;
          Runtime rt(std::move(o));
          rt.register_parameters(layout, params);
          const Timing tm = time_steps(rt, train, 256, run == 2 ? 60 : 10, steps / 2, fn);
          rate[run].push_back(tm.samples_per_s);
          if (run == 2) chosen = tm.chunk_samples;
        }
      }
      const double spin = median(rate[0]), block = median(rate[1]), automatic = median(rate[2]), graphs = median(rate[3]), resident = median(rate[4]);
      j["throughput"][name] = {{"batch", 256}, {"chunk", 256}, {"steps", steps / 2 * 3}, {"samples_per_s", spin}, {"samples_per_s_block", block},
                               {"wait_default", "spin"}, {"spin_over_block", spin / block}, {"samples_per_s_auto", automatic}, {"auto_chunk", chosen},
                               {"samples_per_s_graphs", graphs}, {"graphs_over_eager", graphs / spin}, {"samples_per_s_graphs_resident", resident}};
      line("throughput: %s batch 256 on 1 GPU: %.0f samples/s at chunk 256 waiting by spinning (the default), %.0f with blocking-sync "
           "events (spin/block %.3f); %.0f at the automatic chunk (%zu); %.0f replayed from CUDA graphs (graphs/eager %.3f), %.0f with the "
           "data held on the GPU too; medians of 3 interleaved runs of %zu steps",
           name.c_str(), spin, block, spin / block, automatic, chosen, graphs, graphs / spin, resident, steps / 2);
    };

    // The wide MLP the vgpu parts run: large enough to fill their SMs.
    const std::vector<std::size_t> wide_sizes = {784, vgpu_hidden, vgpu_hidden, 10};
    const examples::MlpModel wide(wide_sizes);
    const examples::MlpCuda wide_gpu(wide_sizes);
    auto wide_fn = [&](ChunkContext& c) { wide_gpu.accumulate(c); };

    // 3. Virtual GPUs: unequal parts, static vs steal vs the ideal from each part's measured speed alone.
    const auto vgpu_section = [&] {
      const cuda::SmInfo sm = cuda::sm_info(0);  // throws where green contexts are unavailable: this section fails alone
      j["gpu"]["sm_granularity"] = sm.granularity;
      line("vgpu: %d SMs in partitionable groups of %d", sm.total, sm.granularity);
      const auto p = wide.initial_parameters(3);
      const std::vector<double> req = parse_number_list(vgpu, "vgpu");
      // Samples/s of each part alone, from its whole step (median): on a GPU the chunk phase ends when the last chunk is
      // launched, so the chunk phase alone would leave out that chunk's run, the reduction and the update.
      std::vector<double> speed;
      std::vector<int> sms;
      for (double r : req) {
        Runtime rt(options("vgpu:" + std::to_string(static_cast<int>(r)), SchedulePolicy::kStatic, vgpu_chunk, train));
        rt.register_parameters(wide.layout(), p);
        const Timing tm = time_steps(rt, train, vgpu_batch, 3, std::max<std::size_t>(3, vgpu_steps / 2), wide_fn);
        speed.push_back(static_cast<double>(vgpu_batch) / (tm.step_ms * 1e-3));
        const std::string nm = rt.device(0).name();
        sms.push_back(std::stoi(nm.substr(nm.find('(') + 1)));
        line("vgpu: part of %d SMs alone: %.0f samples/s (%.2f ms per %zu-sample step)", sms.back(), speed.back(), tm.step_ms, vgpu_batch);
      }
      const double total = std::accumulate(speed.begin(), speed.end(), 0.0);
      const double ideal_ms = static_cast<double>(vgpu_batch) / total * 1e3;  // T* = W / sum of s_i; each s_i holds its part's update, not the sum across parts
      double static_ideal_ms = 0;
      for (double s : speed) static_ideal_ms = std::max(static_ideal_ms, static_cast<double>(vgpu_batch) / static_cast<double>(req.size()) / s * 1e3);
      json v = {{"spec", "vgpu:" + vgpu}, {"sms", sms}, {"speeds", speed}, {"batch", vgpu_batch}, {"chunk", vgpu_chunk},
                {"model", "mlp 784-" + std::to_string(vgpu_hidden) + "-" + std::to_string(vgpu_hidden) + "-10"}, {"ideal_ms", ideal_ms},
                {"ideal_speedup", static_ideal_ms / ideal_ms}};
      Timing timed[2];  // static, steal
      for (const auto& [pname, pol] : {std::pair{std::string("static"), SchedulePolicy::kStatic}, std::pair{std::string("steal"), SchedulePolicy::kSteal}}) {
        Runtime rt(options("vgpu:" + vgpu, pol, vgpu_chunk, train));
        rt.register_parameters(wide.layout(), p);
        const Timing tm = time_steps(rt, train, vgpu_batch, 5, vgpu_steps, wide_fn);
        timed[pol == SchedulePolicy::kSteal] = tm;
        v[pname] = {{"step_ms_median", tm.step_ms}, {"efficiency", ideal_ms / tm.step_ms}, {"steals_per_step", static_cast<double>(tm.steals) / vgpu_steps},
                    {"utilization", tm.util}, {"reduce_ms_median", tm.reduce_ms}};
        std::string us;
        for (double u : tm.util) us += (us.empty() ? "" : ",") + std::to_string(u).substr(0, 4);
        line("vgpu: %-6s %.2f ms/step (ideal %.2f), efficiency %.3f, util %s", pname.c_str(), tm.step_ms, ideal_ms, ideal_ms / tm.step_ms, us.c_str());
      }
      const double t_static = timed[0].step_ms, t_steal = timed[1].step_ms;
      // The ideal in situ: each part's speed while every part runs (the static run's: each runs its share at once, as
      // they share the memory bandwidth and the L2), so T* = W / sum of those speeds, plus the steal run's own
      // reduction and update. The ideal from the parts alone overrates them when they run together.
      const double in_situ = std::accumulate(timed[0].rate.begin(), timed[0].rate.end(), 0.0);
      const double in_situ_ms = in_situ > 0 ? static_cast<double>(vgpu_batch) / in_situ * 1e3 + timed[1].tail_ms : 0.0;
      v["in_situ_speeds"] = timed[0].rate;
      v["in_situ_ideal_ms"] = in_situ_ms;
      v["steal"]["efficiency_in_situ"] = in_situ_ms > 0 ? in_situ_ms / t_steal : 0.0;
      line("vgpu: ideal in situ %.2f ms (the parts' speeds while all run, from the static run's device-timed chunks, plus steal's "
           "reduction and update %.2f ms); steal %.3f of it (target >= 0.9)",
           in_situ_ms, timed[1].tail_ms, in_situ_ms > 0 ? in_situ_ms / t_steal : 0.0);
      v["speedup"] = t_static / t_steal;
      v["speedup_over_ideal_speedup"] = (t_static / t_steal) / (static_ideal_ms / ideal_ms);
      line("vgpu: steal %.2fx faster than static; ideal speedup %.2fx (ratio %.3f; target >= 0.9); steal efficiency %.3f (target >= 0.9)",
           t_static / t_steal, static_ideal_ms / ideal_ms, (t_static / t_steal) / (static_ideal_ms / ideal_ms), ideal_ms / t_steal);
      j["vgpu"] = v;
    };

    // The efficiency curve on one GPU: samples/s against chunk size, the MLP at batch 4096, and the automatic choice
    // with the runtime's own measured curve.
    const auto curve = [&] {
      json c = json::array();
      for (std::size_t chunk : {16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 0}) {
        Runtime rt(options("cuda:0", SchedulePolicy::kSteal, chunk, train));
        rt.register_parameters(mlp.layout(), mlp.initial_parameters(4));
        const Timing tm = time_steps(rt, train, 4096, chunk == 0 ? 60 : 5, 20, mlp_fn);
        json row = {{"chunk", chunk == 0 ? json("auto") : json(chunk)}, {"chunk_samples", tm.chunk_samples}, {"samples_per_s", tm.samples_per_s}};
        if (chunk == 0) row["measured_curve"] = rt.chunk_curve(0);
        c.push_back(row);
        line("curve: mlp batch 4096 on 1 GPU, chunk %s: %.0f samples/s", chunk == 0 ? ("auto (" + std::to_string(tm.chunk_samples) + ")").c_str()
                                                                                    : std::to_string(chunk).c_str(), tm.samples_per_s);
      }
      j["curve"] = c;
    };

    // 4. The reduction. What one GPU can measure honestly is the reduction phase of real steps: on cuda:0 alone (one
    // device: nothing to reduce, so the phase is the runtime's own bookkeeping) and across the vgpu parts (a reduction
    // over four buffers of the wide MLP on the device). Then NCCL's AllReduce of each flat buffer over every GPU of
    // this machine, one rank per GPU: with one GPU that is an in-place AllReduce of one rank, which moves no data
    // (a launch and a synchronisation, not a reduction), and it is labelled so.
    const auto reduce = [&] {
      json r;
      {
        Runtime rt(options("cuda:0", SchedulePolicy::kSteal, 256, train));
        rt.register_parameters(mlp.layout(), mlp.initial_parameters(5));
        const Timing tm = time_steps(rt, train, 1024, 5, 30, mlp_fn);
        r["cuda0_mlp"] = {{"devices", "cuda:0"}, {"floats", mlp.layout().size()}, {"reduce_ms_median", tm.reduce_ms}, {"step_ms_median", tm.step_ms}};
        line("reduce: mlp on cuda:0 alone: reduction phase %.3f ms of a %.3f ms step (one device: nothing to reduce)", tm.reduce_ms, tm.step_ms);
      }
      {
        Runtime rt(options("vgpu:" + vgpu, SchedulePolicy::kSteal, vgpu_chunk, train));
        rt.register_parameters(wide.layout(), wide.initial_parameters(5));
        const Timing tm = time_steps(rt, train, vgpu_batch, 3, std::max<std::size_t>(5, vgpu_steps / 2), wide_fn);
        r["vgpu_wide"] = {{"devices", "vgpu:" + vgpu}, {"floats", wide.layout().size()}, {"reduce_ms_median", tm.reduce_ms}, {"step_ms_median", tm.step_ms}};
        line("reduce: wide mlp (%zu floats) across vgpu:%s: reduction phase %.3f ms of a %.3f ms step", wide.layout().size(), vgpu.c_str(), tm.reduce_ms,
             tm.step_ms);
      }
      j["reduce"] = r;
      const int n = cuda::device_count();
      std::vector<ncclComm_t> comms(static_cast<std::size_t>(n));
      std::vector<int> devs(static_cast<std::size_t>(n));
      std::iota(devs.begin(), devs.end(), 0);
      SB_NCCL_CHECK(ncclCommInitAll(comms.data(), n, devs.data()));
      const std::string what = n == 1 ? "in-place AllReduce of 1 rank: moves no data (launch and sync only, not a reduction)"
                                      : "AllReduce over " + std::to_string(n) + " GPUs, one rank each";
      json a = json::array();
      for (const auto& [name, floats] : {std::pair{std::string("mlp"), mlp.layout().size() + 1}, std::pair{std::string("cnn"), cnn.layout().size() + 1},
                                         std::pair{std::string("mlp-wide"), wide.layout().size() + 1}}) {
        std::vector<cuda::DeviceBuffer<float>> bufs;
        std::vector<cuda::Stream> streams;
        for (int d = 0; d < n; ++d) {
          cuda::DeviceScope on(d);
          bufs.emplace_back(floats);
          streams.push_back(cuda::make_stream());
        }
        std::vector<double> us;
        for (int it = 0; it < 60; ++it) {
          const auto t0 = std::chrono::steady_clock::now();
          SB_NCCL_CHECK(ncclGroupStart());
          for (int d = 0; d < n; ++d) {
            SB_NCCL_CHECK(ncclAllReduce(bufs[d].data(), bufs[d].data(), floats, ncclFloat, ncclSum, comms[d], streams[d].get()));
          }
          SB_NCCL_CHECK(ncclGroupEnd());
          for (int d = 0; d < n; ++d) SB_CUDA_CHECK(cudaStreamSynchronize(streams[d].get()));
          if (it >= 10) us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
        a.push_back({{"buffer", name}, {"floats", floats}, {"ranks", n}, {"us_median", median(us)}, {"what", what}});
        line("allreduce: %s buffer %zu floats, %s: %.1f us (median of 50, host-timed incl. sync)", name.c_str(), floats, what.c_str(), median(us));
      }
      for (ncclComm_t c : comms) ncclCommDestroy(c);
      j["allreduce"] = a;
    };

    // 7. Deterministic mode: one SHA-256 of the parameters whichever devices and policy, and its cost on one GPU.
    const auto deterministic = [&] {
      const auto p = mlp.initial_parameters(4);
      const auto train_det = [&](const std::string& devices, SchedulePolicy policy) {
        RuntimeOptions o = options(devices, policy, 32, train);
        o.schedule.deterministic = true;
        o.optimizer = {.kind = OptimizerKind::kAdam, .lr = 1e-3f};
        Runtime rt(o);
        rt.register_parameters(mlp.layout(), p);
        (void)time_steps(rt, train, 512, 0, 30, mlp_fn);
        const std::vector<float> w = rt.parameters(0);
        return sha256_hex(std::as_bytes(std::span<const float>(w)));
      };
      const std::string parts = "vgpu:" + vgpu;
      json runs = json::array();
      std::string first;
      bool same = true;
      for (const auto& [devices, policy] : {std::pair{std::string("cuda:0"), SchedulePolicy::kSteal}, std::pair{std::string("cuda:0"), SchedulePolicy::kStatic},
                                            std::pair{parts, SchedulePolicy::kSteal}, std::pair{parts, SchedulePolicy::kStatic}}) {
        const std::string h = train_det(devices, policy);
        if (first.empty()) first = h;
        same = same && h == first;
        const char* pol = policy == SchedulePolicy::kSteal ? "steal" : "static";
        runs.push_back({{"devices", devices}, {"policy", pol}, {"sha256", h}});
        line("deterministic: mlp 30 Adam steps of 512 on %s %s: parameters sha256 %s", devices.c_str(), pol, h.c_str());
      }
      // Its cost on cuda:0: samples/s with and without, batch 512, chunk 32, interleaved, medians of 3.
      std::vector<double> rate[2];
      for (int round = 0; round < 3; ++round) {
        for (int det = 0; det < 2; ++det) {
          RuntimeOptions o = options("cuda:0", SchedulePolicy::kSteal, 32, train);
          o.schedule.deterministic = det == 1;
          Runtime rt(o);
          rt.register_parameters(mlp.layout(), p);
          rate[det].push_back(time_steps(rt, train, 512, 5, 20, mlp_fn).samples_per_s);
        }
      }
      const double plain = median(rate[0]), det = median(rate[1]);
      j["deterministic"] = {{"runs", runs}, {"same", same}, {"samples_per_s_default", plain}, {"samples_per_s_deterministic", det}, {"cost", det / plain}};
      line("deterministic: one hash over 4 runs: %s; samples/s on cuda:0 (batch 512, chunk 32): default %.0f, deterministic %.0f (%.3fx)",
           same ? "PASS" : "FAIL", plain, det, det / plain);
      if (!same) throw Error("deterministic: the parameters differ across devices or policies");
    };

    const std::vector<std::pair<std::string, std::function<void()>>> sections = {
        {"equivalence-mlp", [&] { equivalence("mlp", mlp.layout(), mlp.initial_parameters(1), 1024, mlp_cpu_fn, mlp_fn); }},
        {"equivalence-cnn", [&] { equivalence("cnn", cnn.layout(), cnn.initial_parameters(1), 256, cnn_cpu_fn, cnn_fn); }},
        {"throughput-mlp", [&] { throughput("mlp", mlp.layout(), mlp.initial_parameters(2), mlp_fn); }},
        {"throughput-cnn", [&] { throughput("cnn", cnn.layout(), cnn.initial_parameters(2), cnn_fn); }},
        {"vgpu", vgpu_section},
        {"curve", curve},
        {"reduce", reduce},
        {"deterministic", deterministic}};
    int failed_sections = 0;
    for (const auto& [name, body] : sections) {
      if (!only.empty() && name != only) continue;
      // Each section runs on its own: a failure is recorded in the JSON and the next section still runs (in this
      // process; a sticky CUDA error fails the later ones too, which is why the device check runs one a process).
      try {
        body();
      } catch (const std::exception& e) {
        ++failed_sections;
        j["errors"][name] = e.what();
        line("%s: FAILED: %s", name.c_str(), e.what());
      }
    }
    if (!write()) return 1;
    line("wrote %s%s", out.c_str(), failed_sections > 0 ? (" (" + std::to_string(failed_sections) + " section(s) failed)").c_str() : "");
    return failed_sections > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    j["errors"][only.empty() ? "setup" : only] = e.what();
    std::fprintf(stderr, "gpu_check: %s\n", e.what());
    (void)write();
    return 1;
  }
}

// The runtime on CUDA devices: the GPU gradient equals the CPU one (MLP and CNN), stealing across the parts of
// one GPU gives the same gradient as one whole GPU, replicas stay bit-identical, and the spec errors where there
// is no GPU (these run everywhere).
#include <stealbatch/models/cnn_model.hpp>
#include <stealbatch/models/layers.hpp>
#include <stealbatch/models/mlp_model.hpp>
#include <stealbatch/models/models_cuda.hpp>

#include <stealbatch/cuda/backend.hpp>
#include <stealbatch/cuda/cuda_device.hpp>
#include <stealbatch/cuda/device_info.hpp>
#include <stealbatch/cuda/handles.hpp>
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/runtime/testing.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>

using namespace stealbatch;
using examples::DenseData;
using examples::max_relative_error;

namespace {

bool skip_without_gpu() {
  if (cuda::device_count() > 0) return false;
  std::printf("SB_SKIP: %s\n", cuda::no_device_reason().c_str());
  return true;
}

struct Synthetic {
  std::vector<float> x;
  std::vector<std::uint8_t> y;
  DenseData data;
  Synthetic(std::size_t count, std::size_t features, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    x.resize(count * features);
    for (float& v : x) v = u(rng);
    y.resize(count);
    for (auto& v : y) v = static_cast<std::uint8_t>(rng() % 10);
    data = {count, features, x, y};
  }
};


// Options for `devices` whose chunks take their samples' rows of `d` as gathered input.
RuntimeOptions gpu_options(const std::string& devices, std::size_t chunk, const DenseData& d) {
  RuntimeOptions o;
  o.devices = devices;
  o.schedule.chunk_size = chunk;
  o.gpu.input_bytes = examples::gpu_input_bytes(d);
  o.gpu.gather = [&d](std::uint32_t s, std::byte* dst) { examples::gather_sample(d, s, dst); };
  return o;
}

// The 784-256-128-10 MLP on `count` synthetic samples: the CPU model, the GPU one, its parameters and chunk function.
struct GpuMlp {
  Synthetic s;
  examples::MlpModel cpu{{784, 256, 128, 10}};
  examples::MlpCuda gpu{{784, 256, 128, 10}};
  std::vector<float> p;
  ChunkFunction fn;
  GpuMlp(std::size_t count, std::uint64_t data_seed, std::uint64_t param_seed)
      : s(count, 784, data_seed), p(cpu.initial_parameters(param_seed)), fn([this](ChunkContext& c) { gpu.accumulate(c); }) {}
  GpuMlp(const GpuMlp&) = delete;
  GpuMlp& operator=(const GpuMlp&) = delete;
};

// The full-batch mean gradient of `fn` over the first `batch` samples on `devices`.
std::vector<float> gradient(const std::string& devices, SchedulePolicy policy, const ParameterLayout& layout, std::span<const float> params,
                            const DenseData& d, std::size_t batch, std::size_t chunk, const ChunkFunction& fn, bool deterministic = false) {
  RuntimeOptions o = gpu_options(devices, chunk, d);
  o.schedule.policy = policy;
  o.schedule.deterministic = deterministic;
  Runtime rt(o);
  rt.register_parameters(layout, params);
  std::vector<std::uint32_t> idx(batch);
  std::iota(idx.begin(), idx.end(), 0u);
  rt.compute_gradient(idx, fn);
  return {rt.gradient().begin(), rt.gradient().end()};
}

}  // namespace

TEST_CASE("CudaRuntime.SpecErrorsWithoutAGpuOrBackend") {
  cuda::enable();
  if (cuda::device_count() == 0) {
    try {
      Runtime rt({.devices = "cuda:all"});
      FAIL("cuda:all without a GPU must throw");
    } catch (const ConfigError& e) {
      CHECK(std::string(e.what()).find("no usable GPU") != std::string::npos);
    }
    Runtime rt({});  // no spec and no GPU: CPU devices
    CHECK(rt.device(0).name().rfind("cpu", 0) == 0);
  }
  CHECK_THROWS_AS(parse_device_spec("vgpu:0,8"), ConfigError);
  CHECK(parse_device_spec("vgpu:64,16,16,16").ids == std::vector<int>{64, 16, 16, 16});
}

// The GPU model's full-batch gradient against the CPU model's, same parameters, batch and chunking.
template <class CpuModel, class GpuModel>
double gpu_vs_cpu(const CpuModel& cpu, const GpuModel& gpu, std::size_t batch, std::size_t chunk, std::uint64_t seed) {
  const Synthetic s(batch, 784, seed);
  const std::vector<float> p = cpu.initial_parameters(7);
  const auto ref = gradient("cpu:1", SchedulePolicy::kSteal, cpu.layout(), p, s.data, batch, chunk, [&](ChunkContext& c) {
    thread_local typename CpuModel::Workspace ws;
    c.add_loss(cpu.accumulate_gradient(c.params, c.grad, s.data, c.samples, ws));
  });
  const auto g = gradient("cuda:0", SchedulePolicy::kSteal, cpu.layout(), p, s.data, batch, chunk, [&](ChunkContext& c) { gpu.accumulate(c); });
  return max_relative_error(g, ref);
}

TEST_CASE("CudaRuntime.MlpGradientMatchesCpu") {
  if (skip_without_gpu()) return;
  cuda::enable();
  const double err = gpu_vs_cpu(examples::MlpModel({784, 256, 128, 10}), examples::MlpCuda({784, 256, 128, 10}), 512, 64, 3);
  MESSAGE("MLP GPU vs CPU relative error " << err);
  CHECK(err <= 1e-4);
}

TEST_CASE("CudaRuntime.CnnGradientMatchesCpu") {
  if (skip_without_gpu()) return;
  cuda::enable();
  const double err = gpu_vs_cpu(examples::CnnModel(), examples::CnnCuda(), 128, 32, 4);
  MESSAGE("CNN GPU vs CPU relative error " << err);
  CHECK(err <= 1e-4);
}

TEST_CASE("CudaRuntime.VirtualGpusStealAndStayExact") {
  if (skip_without_gpu()) return;
  cuda::enable();
  Synthetic s(2048, 784, 5);
  const examples::MlpModel cpu({784, 256, 128, 10});
  const examples::MlpCuda gpu({784, 256, 128, 10});
  const std::vector<float> p = cpu.initial_parameters(9);
  auto fn = [&](ChunkContext& c) { gpu.accumulate(c); };
  const auto whole = gradient("cuda:0", SchedulePolicy::kStatic, cpu.layout(), p, s.data, 2048, 16, fn);
  const auto parts = gradient("vgpu:32,8,8", SchedulePolicy::kSteal, cpu.layout(), p, s.data, 2048, 16, fn);
  const double err = max_relative_error(parts, whole);
  MESSAGE("vgpu steal vs one GPU relative error " << err);
  CHECK(err <= 1e-5);

  Runtime rt(gpu_options("vgpu:32,8,8", 16, s.data));
  rt.register_parameters(cpu.layout(), p);
  std::vector<std::uint32_t> idx(1024);
  std::uint64_t steals = 0;
  for (int step = 0; step < 5; ++step) {
    std::iota(idx.begin(), idx.end(), static_cast<std::uint32_t>(step * 200));
    steals += rt.step(idx, fn).steals;
  }
  MESSAGE("steals over 5 steps: " << steals);
  const std::vector<float> p0 = rt.parameters(0);
  for (std::size_t d = 1; d < rt.device_count(); ++d) {
    const auto pd = rt.parameters(d);
    CHECK(std::equal(pd.begin(), pd.end(), p0.begin()));
  }
}

TEST_CASE("CudaRuntime.VirtualGpusLeaveTheCallersContextUsable") {
  // A green context is current to its worker alone: after vgpu runtimes have stepped and gone, the caller's thread
  // still has a live context, so the next CUDA call there (an allocation, a kernel, NCCL's set-up) works.
  if (skip_without_gpu()) return;
  cuda::enable();
  Synthetic s(512, 784, 6);
  const examples::MlpModel cpu({784, 64, 10});
  const examples::MlpCuda gpu({784, 64, 10});
  const std::vector<float> p = cpu.initial_parameters(2);
  for (int round = 0; round < 2; ++round) {
    const auto g = gradient("vgpu:16,8", SchedulePolicy::kSteal, cpu.layout(), p, s.data, 512, 32, [&](ChunkContext& c) { gpu.accumulate(c); });
    CHECK(g.size() == cpu.layout().size());
  }
  cuda::Stream st = cuda::make_stream();
  cuda::DeviceBuffer<float> d(4096);
  cuda::PinnedBuffer<float> h(d.size());
  cuda::fill(d.data(), d.size(), 1.5f, st.get());
  SB_CUDA_CHECK(cudaMemcpyAsync(h.data(), d.data(), d.bytes(), cudaMemcpyDeviceToHost, st.get()));
  SB_CUDA_CHECK(cudaStreamSynchronize(st.get()));
  CHECK(std::all_of(h.data(), h.data() + h.size(), [](float v) { return v == 1.5f; }));
}

// A step waits for the GPU once, in its drain: the parts' sum, the update and the zeroing are queued behind the
// chunks and ordered by events, and the next step's chunks queue behind them. Training with them must be training:
// 6 SGD steps with momentum on the whole GPU and on its parts, stealing, end within float tolerance of the CPU
// model's, and each step's loss is the CPU's.
TEST_CASE("CudaRuntime.StepsQueuedWithoutHostWaitsTrainAsTheCpu") {
  if (skip_without_gpu()) return;
  cuda::enable();
  const GpuMlp m(4096, 12, 6);
  const auto& [s, cpu, gpu, p, plain] = m;
  auto train = [&](const std::string& devices, const ChunkFunction& fn) {
    RuntimeOptions o = gpu_options(devices, 32, s.data);
    o.optimizer = {.kind = OptimizerKind::kSgd, .lr = 0.05f, .momentum = 0.9f};
    Runtime rt(o);
    rt.register_parameters(cpu.layout(), p);
    std::vector<std::uint32_t> idx(512);
    std::vector<double> losses;
    for (std::uint32_t step = 0; step < 6; ++step) {
      std::iota(idx.begin(), idx.end(), step * 500u);
      losses.push_back(rt.step(idx, fn).loss);
    }
    return std::pair{rt.parameters(0), losses};
  };
  const auto [ref, ref_loss] = train("cpu:1", [&](ChunkContext& c) {
    thread_local examples::MlpModel::Workspace ws;
    c.add_loss(cpu.accumulate_gradient(c.params, c.grad, s.data, c.samples, ws));
  });
  for (const char* devices : {"cuda:0", "vgpu:32,8,8", "vgpu:16,16,16,16"}) {
    const auto [params, losses] = train(devices, [&](ChunkContext& c) { gpu.accumulate(c); });
    const double err = max_relative_error(params, ref);
    MESSAGE(devices << ": parameters after 6 steps vs the CPU's, relative error " << err);
    CHECK(err <= 1e-4);
    for (std::size_t i = 0; i < losses.size(); ++i) CHECK(losses[i] == doctest::Approx(ref_loss[i]).epsilon(1e-4));
  }
}

// gpu.graphs: each sample count and slot runs eagerly first, is captured at a later call and replayed after. The
// replayed kernels are the eager ones, so 6 steps end where they end without graphs, and 6 more after the parameters
// are registered again (a new replica: every graph stale), with the samples held on the device too; a chunk function
// that cannot be captured (it queries its stream) runs eagerly, with the same result.
TEST_CASE("CudaRuntime.GraphsReplayChunksAndTrainAsWithout") {
  if (skip_without_gpu()) return;
  cuda::enable();
  const GpuMlp m(4096, 13, 8);
  const auto& [s, cpu, gpu, p, plain] = m;
  const ChunkFunction uncapturable = [&](ChunkContext& c) {
    gpu.accumulate(c);
    (void)cudaStreamQuery(static_cast<cudaStream_t>(c.stream));  // not allowed while capturing: the capture fails
    (void)cudaGetLastError();                                    // (not ready is no error of the chunk)
  };
  auto train = [&](const std::string& devices, bool graphs, const ChunkFunction& fn, std::size_t resident = 0) {
    RuntimeOptions o = gpu_options(devices, 32, s.data);
    o.schedule.policy = SchedulePolicy::kStatic;  // the same chunks on the same devices, with graphs or without
    o.gpu.graphs = graphs;
    o.gpu.resident = resident;
    Runtime rt(o);
    std::vector<std::uint32_t> idx(512);
    for (int round = 0; round < 2; ++round) {
      rt.register_parameters(cpu.layout(), round == 0 ? p : rt.parameters(0));  // the second: a new replica, where the first ended
      for (std::uint32_t step = 0; step < 6; ++step) {
        std::iota(idx.begin(), idx.end(), step * 500u);
        (void)rt.step(idx, fn);
      }
    }
    cuda::GraphCache<cudaGraphExec_t>::Stats total;
    for (std::size_t d = 0; d < rt.device_count(); ++d) {
      const auto& st = dynamic_cast<const cuda::CudaDevice&>(rt.device(d)).graph_stats();
      total.eager += st.eager, total.captured += st.captured, total.replayed += st.replayed, total.failed += st.failed;
    }
    return std::pair{rt.parameters(0), total};
  };
  for (const char* devices : {"cuda:0", "vgpu:32,8,8"}) {
    INFO(devices);
    const auto [without, none] = train(devices, false, plain);
    CHECK(none.eager + none.captured + none.replayed == 0);
    const auto [with, st] = train(devices, true, plain);
    MESSAGE(devices << ": graphs eager " << st.eager << ", captured " << st.captured << ", replayed " << st.replayed << "; identical bits "
                    << (with == without));
    CHECK(st.captured > 0);
    CHECK(st.replayed > st.captured);
    CHECK(st.failed == 0);
    CHECK(max_relative_error(with, without) <= 1e-6);
    const auto [held, held_st] = train(devices, true, plain, s.data.count);
    CHECK(held_st.replayed > held_st.captured);
    CHECK(held == with);  // the same input bytes, the same kernels (cuBLAS with the same workspace)
    const auto [eager, failed] = train(devices, true, uncapturable);
    CHECK(failed.failed > 0);
    CHECK(failed.replayed == 0);
    CHECK(max_relative_error(eager, without) <= 1e-6);
  }
}

// gpu.resident: the samples held on the device and a chunk's rows gathered there by id give the very bytes the host's
// gather copies, so the gradient is the same bits; a sample beyond those held fails its chunk, naming it.
TEST_CASE("CudaRuntime.ResidentSamplesGiveTheHostGathersGradient") {
  if (skip_without_gpu()) return;
  cuda::enable();
  const GpuMlp m(1024, 14, 9);
  const auto& [s, cpu, gpu, p, fn] = m;
  for (const char* devices : {"cuda:0", "vgpu:16,8"}) {
    INFO(devices);
    std::vector<float> g[2];
    for (const std::size_t resident : {std::size_t{0}, std::size_t{1024}}) {
      RuntimeOptions o = gpu_options(devices, 64, s.data);
      o.schedule.policy = SchedulePolicy::kStatic;
      o.gpu.resident = resident;
      Runtime rt(o);
      rt.register_parameters(cpu.layout(), p);
      std::vector<std::uint32_t> idx(512);
      for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::uint32_t>((i * 7) % 1024);  // not in order
      rt.compute_gradient(idx, fn);
      g[resident > 0].assign(rt.gradient().begin(), rt.gradient().end());
    }
    CHECK(g[0] == g[1]);
  }
  RuntimeOptions o = gpu_options("cuda:0", 64, s.data);
  o.gpu.resident = 100;
  Runtime rt(o);
  rt.register_parameters(cpu.layout(), p);
  std::vector<std::uint32_t> idx(128);
  std::iota(idx.begin(), idx.end(), 0u);
  try {
    rt.compute_gradient(idx, fn);
    FAIL("a sample beyond gpu.resident must fail its chunk");
  } catch (const ChunkError& e) {
    CHECK(std::string(e.what()).find("sample 100 is not among the 100 samples held on the device (gpu.resident)") != std::string::npos);
  }
}

// A part of the GPU lost mid-step (on_device_failure = exclude): the step ends on the other parts with the whole GPU's
// gradient (what the lost part had run is run again on them), and training goes on without it.
TEST_CASE("CudaRuntime.ALostPartEndsTheStepOnTheOthersExactly") {
  if (skip_without_gpu()) return;
  cuda::enable();
  const GpuMlp m(1024, 15, 10);
  const auto& [s, cpu, gpu, p, fn] = m;
  std::vector<std::uint32_t> idx(768);
  std::iota(idx.begin(), idx.end(), 0u);
  const auto whole = gradient("cuda:0", SchedulePolicy::kStatic, cpu.layout(), p, s.data, idx.size(), 32, fn);

  RuntimeOptions o = gpu_options("vgpu:16,16,16", 32, s.data);
  o.on_device_failure = OnDeviceFailure::kExclude;
  o.schedule.placement = PlacementPolicy::kEqual;  // part 1 surely runs its own chunks, in order
  o.schedule.policy = SchedulePolicy::kStatic;
  std::atomic<int> seen{0};
  Runtime rt(o);
  stealbatch::testing::inject_faults(rt, [&](std::size_t device, std::uint64_t step, ChunkId) {
    return device == 1 && step == 2 && seen.fetch_add(1) == 2 ? stealbatch::testing::Fault::kDeviceLoss : stealbatch::testing::Fault::kNone;
  });
  rt.register_parameters(cpu.layout(), p);
  rt.compute_gradient(idx, fn);
  const StepReport r = rt.compute_gradient(idx, fn);
  REQUIRE(r.excluded_devices.size() == 1);
  CHECK(r.rerun_chunks >= 2);
  CHECK(rt.device_count() == 2);
  const double err = max_relative_error(rt.gradient(), whole);
  MESSAGE("a lost vgpu part: gradient vs the whole GPU's, relative error " << err);
  CHECK(err <= 1e-5);
  const StepReport r3 = rt.step(idx, fn);
  CHECK(r3.excluded_devices.empty());
  CHECK(r3.devices.size() == 2);
  CHECK(std::isfinite(r3.loss));
}

TEST_CASE("CudaRuntime.MlpCudaRefusesLayerCountsItCannotRun") {  // runs everywhere: nothing touches a GPU
  CHECK_THROWS_AS(examples::MlpCuda({784}), ConfigError);
  CHECK_THROWS_AS(examples::MlpCuda(std::vector<std::size_t>(examples::MlpCuda::kMaxLayers + 2, 8)), ConfigError);
  CHECK_NOTHROW(examples::MlpCuda(std::vector<std::size_t>(examples::MlpCuda::kMaxLayers + 1, 8)));
}

TEST_CASE("CudaRuntime.BothGpuWaitsGiveTheSameGradient") {
  if (skip_without_gpu()) return;
  cuda::enable();
  Synthetic s(1024, 784, 8);
  const examples::MlpModel cpu({784, 256, 128, 10});
  const examples::MlpCuda gpu({784, 256, 128, 10});
  const std::vector<float> p = cpu.initial_parameters(3);
  std::vector<float> g[2];
  for (const GpuWait w : {GpuWait::kSpin, GpuWait::kBlock}) {
    RuntimeOptions o = gpu_options("cuda:0", 64, s.data);
    o.gpu.wait = w;
    Runtime rt(o);
    rt.register_parameters(cpu.layout(), p);
    std::vector<std::uint32_t> idx(1024);
    std::iota(idx.begin(), idx.end(), 0u);
    rt.compute_gradient(idx, [&](ChunkContext& c) { gpu.accumulate(c); });
    g[w == GpuWait::kBlock].assign(rt.gradient().begin(), rt.gradient().end());
  }
  CHECK(g[0] == g[1]);  // the same kernels in the same order: bit-identical
}

// Deterministic mode on GPUs: the parameters after 12 Adam steps are the same bytes on the whole GPU and on its parts,
// stealing or not; and the deterministic gradient is the CPU's within float tolerance.
TEST_CASE("CudaRuntime.DeterministicSameBitsOnTheGpuAndItsParts") {
  if (skip_without_gpu()) return;
  cuda::enable();
  Synthetic s(4096, 784, 11);
  const examples::MlpModel cpu({784, 256, 128, 10});
  const examples::MlpCuda gpu({784, 256, 128, 10});
  const std::vector<float> p = cpu.initial_parameters(5);
  auto fn = [&](ChunkContext& c) { gpu.accumulate(c); };
  auto train = [&](const std::string& devices, SchedulePolicy policy) {
    RuntimeOptions o = gpu_options(devices, 32, s.data);
    o.schedule.policy = policy;
    o.schedule.deterministic = true;
    o.optimizer = {.kind = OptimizerKind::kAdam, .lr = 1e-3f};
    Runtime rt(o);
    rt.register_parameters(cpu.layout(), p);
    std::vector<std::uint32_t> idx(512);
    for (std::uint32_t step = 0; step < 12; ++step) {
      std::iota(idx.begin(), idx.end(), step * 300u);
      (void)rt.step(idx, fn);
    }
    return rt.parameters(0);
  };
  const std::vector<float> whole = train("cuda:0", SchedulePolicy::kSteal);
  for (const auto& [devices, policy] : {std::pair{"cuda:0", SchedulePolicy::kStatic}, std::pair{"vgpu:32,8,8", SchedulePolicy::kSteal},
                                        std::pair{"vgpu:16,16,16,16", SchedulePolicy::kSteal}, std::pair{"vgpu:16,16,16,16", SchedulePolicy::kStatic}}) {
    const std::vector<float> other = train(devices, policy);
    INFO(devices << (policy == SchedulePolicy::kStatic ? " static" : " steal"));
    CHECK(other == whole);
  }

  // The gradient itself: within float tolerance of the CPU model's, on the GPU and on its parts.
  const std::size_t batch = 1024;
  const auto ref = gradient("cpu:1", SchedulePolicy::kSteal, cpu.layout(), p, s.data, batch, 32, [&](ChunkContext& c) {
    thread_local examples::MlpModel::Workspace ws;
    c.add_loss(cpu.accumulate_gradient(c.params, c.grad, s.data, c.samples, ws));
  });
  for (const char* devices : {"cuda:0", "vgpu:32,8,8"}) {
    const auto g = gradient(devices, SchedulePolicy::kSteal, cpu.layout(), p, s.data, batch, 32, fn, /*deterministic=*/true);
    const double err = max_relative_error(g, ref);
    MESSAGE(devices << " deterministic GPU vs CPU relative error " << err);
    CHECK(err <= 1e-4);
  }
}

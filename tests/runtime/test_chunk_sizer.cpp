// ChunkSizer and the runtime's automatic chunk sizes (chunk_size = 0): the ladder explored upward, the smallest
// good-enough rung chosen, noise and one-time costs kept out, and every step still exact while sizes change.
#include <stealbatch/models/mlp_model.hpp>
#include "model_test_support.hpp"

#include <stealbatch/runtime/detail/chunk_sizer.hpp>
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/runtime/sim_device.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <numeric>
#include <optional>
#include <set>

using namespace stealbatch;
using namespace stealbatch::testing;
using detail::ChunkSizer;

namespace {

// A chunk of m samples costs a fixed a seconds plus b a sample: samples/s m / (a + b m), rising with m and
// flattening (a launch-bound GPU kernel, a GEMM too small for its cache blocking).
struct Curve {
  double a, b;
  double seconds(std::size_t m) const { return a + b * static_cast<double>(m); }
  double rate(std::size_t m) const { return static_cast<double>(m) / seconds(m); }
  // The rung the rule must choose among rungs 8 .. top: the smallest within 95% of the best.
  std::size_t expected(std::size_t top) const {
    double best = 0;
    for (std::size_t m = ChunkSizer::kFirstRung; m <= top; m *= 2) best = std::max(best, rate(m));
    for (std::size_t m = ChunkSizer::kFirstRung; m <= top; m *= 2) {
      if (rate(m) >= ChunkSizer::kGoodEnough * best) return m;
    }
    return top;
  }
};

// Drives one device of a sizer through steps of `share` samples cut into its sizes, each chunk timed by `curve`
// times slow(step, size) (1: on the curve); returns the steps it explored.
std::size_t explore(ChunkSizer& s, const Curve& curve, std::size_t share,
                    const std::function<double(std::size_t, std::size_t)>& slow = [](std::size_t, std::size_t) { return 1.0; }) {
  std::size_t steps = 0;
  while (s.exploring(0) && steps < 200) {
    const std::size_t size = s.size(0, share);
    for (std::size_t at = 0; at < share; at += size) {
      const std::size_t m = std::min(size, share - at);
      s.observe_chunk(0, m, curve.seconds(m) * slow(steps, size));
    }
    s.end_step(0, share);
    ++steps;
  }
  return steps;
}

}  // namespace

TEST_CASE("ChunkSizer.ChoosesTheSmallestRungWithin95PercentOfTheBest") {
  // Curves from chunk overhead dominant (the largest rung wins) to negligible (the smallest does); shares from one
  // that fits only the first rungs to one that fits the whole ladder used here.
  for (const Curve c : {Curve{2e-3, 1e-5}, Curve{2e-4, 1e-5}, Curve{2e-5, 1e-5}, Curve{1e-7, 1e-5}}) {
    for (std::size_t share : {40, 512, 3000}) {
      ChunkSizer s(1);
      CAPTURE(c.a);
      CAPTURE(share);
      const std::size_t steps = explore(s, c, share);
      CHECK(!s.exploring(0));
      // Exploring stops at the last rung that fits the share, or earlier on a flat curve (the best then lies below).
      std::size_t top = ChunkSizer::kFirstRung;
      while (top * 2 <= share) top *= 2;
      const std::size_t chosen = s.size(0, share);
      CHECK(chosen <= c.expected(top));
      CHECK(c.rate(chosen) >= ChunkSizer::kGoodEnough * c.rate(c.expected(top)) * 0.999);
      CHECK(steps >= 2);
      CHECK(steps <= 40);
    }
  }
}

TEST_CASE("ChunkSizer.ExploresOneRungAStepAndIgnoresEachRungsFirstChunk") {
  ChunkSizer s(1);
  CHECK(s.exploring(0));
  CHECK(s.size(0, 1000) == 8);
  // One-time costs on each rung's first chunk (a JIT compiling for the size): 50 ms, far off the curve.
  const Curve c{2e-4, 1e-5};
  std::vector<std::size_t> sizes;
  while (s.exploring(0)) {
    const std::size_t size = s.size(0, 256);
    sizes.push_back(size);
    bool first = std::find(sizes.begin(), sizes.end() - 1, size) == sizes.end() - 1;
    for (std::size_t at = 0; at < 256; at += size) {
      s.observe_chunk(0, size, first ? 0.05 : c.seconds(size));
      first = false;
    }
    s.end_step(0, 256);
  }
  // The first step counts for nothing (the device's threads start in it). Then a rung moves on once 3 of its chunks
  // are counted, after its first: 8 to 64 fit that many in one step of 256 samples; 128 fits 2 a step (1 + 2
  // counted: 2 steps), 256 one (4 steps: the first ignored, then 3).
  CHECK(sizes == std::vector<std::size_t>{8, 8, 16, 32, 64, 128, 128, 256, 256, 256, 256});
  CHECK(s.size(0, 256) == c.expected(256));
  const auto curve = s.curve(0);
  REQUIRE(curve.size() == 6);
  for (const auto& [m, rate] : curve) CHECK(rate == doctest::Approx(c.rate(m)).epsilon(1e-9));
}

TEST_CASE("ChunkSizer.AFlatCurveStopsEarlyAndOutliersDoNotMoveTheChoice") {
  // A flat curve (no chunk overhead): three rungs with no gain end the exploration (after the first step, which
  // counts for nothing), and the first rung is chosen. One chunk in five at 3x its time (a preempted thread) does not
  // change that: each rung's figure is a median.
  ChunkSizer s(1);
  const Curve c{0.0, 1e-5};
  std::size_t steps = 0, k = 0;
  while (s.exploring(0)) {
    const std::size_t size = s.size(0, 4096);
    for (std::size_t at = 0; at < 4096; at += size) s.observe_chunk(0, size, c.seconds(size) * (++k % 5 == 0 ? 3.0 : 1.0));
    s.end_step(0, 4096);
    ++steps;
  }
  CHECK(steps <= 5);
  CHECK(s.size(0, 4096) == 8);
}

TEST_CASE("ChunkSizer.TheFirstStepCountsForNothing") {
  // A device's first step runs while its threads and pools start: on the CPU a small chunk ran there on one thread
  // at 4.5x the speed it ran at afterwards, on two (measured: 90k against 20k samples/s for 8-sample MLP chunks).
  // Counted, that figure made the first rung the best of a rising curve and ended the exploration on it.
  ChunkSizer s(1);
  const Curve c{2e-4, 1e-5};
  explore(s, c, 1024, [](std::size_t step, std::size_t) { return step == 0 ? 0.2 : 1.0; });
  CHECK(s.size(0, 1024) == c.expected(1024));
  CHECK(s.size(0, 1024) > ChunkSizer::kFirstRung);
}

TEST_CASE("ChunkSizer.TwoRungsOfNoiseDoNotEndTheExploration") {
  // A rising curve whose 32 and 64 rungs were measured during a burst of load (at half speed, below the 16 rung): two
  // rungs without gain can be noise, and the ladder goes on to where the curve flattens.
  ChunkSizer s(1);
  const Curve c{2e-4, 1e-5};
  explore(s, c, 1024, [](std::size_t, std::size_t size) { return size == 32 || size == 64 ? 2.0 : 1.0; });
  CHECK(c.rate(16) > c.rate(32) / 2.0);  // the burst does hide the gain at both rungs
  CHECK(s.size(0, 1024) == c.expected(1024));
}

TEST_CASE("ChunkSizer.WithoutThievesTheFastestRung") {
  // The static split: no tail to share, so the best rung, where the stealing runtime takes the smallest within 95%.
  const Curve c{2e-5, 1e-5};
  ChunkSizer tail(1), fastest(1, ChunkSizer::Choice::kFastest);
  explore(tail, c, 1024);
  explore(fastest, c, 1024);
  CHECK(tail.size(0, 1024) == c.expected(1024));
  double best = 0;
  for (const auto& [m, rate] : fastest.curve(0)) best = std::max(best, rate);
  CHECK(c.rate(fastest.size(0, 1024)) == doctest::Approx(best).epsilon(1e-9));  // the curve rises to the top, by under 5% over its last rungs
  CHECK(tail.size(0, 1024) < fastest.size(0, 1024));
}

TEST_CASE("ChunkSizer.MeasuresAgainAfterTheRefreshPeriod") {
  ChunkSizer s(1);
  explore(s, Curve{2e-4, 1e-5}, 512);
  CHECK(!s.exploring(0));
  for (std::uint64_t i = 0; i < ChunkSizer::kRefreshSteps; ++i) s.end_step(0, 512);
  CHECK(s.exploring(0));
  CHECK(s.size(0, 512) == 8);
}

namespace {

// A device whose chunks take a + b m seconds on a timeline of its own, reported by the step (as a GPU's are):
// the runtime's sizer sees only those times, so its choice is exact and independent of the machine's load.
struct TimedDevice final : Device {
  std::size_t index;
  Curve curve;
  double step_seconds = 0;
  TimedDevice(std::size_t i, Curve c) : index(i), curve(c) {}
  TimedDevice(std::size_t i, Curve c, double slower) : index(i), curve{c.a * slower, c.b * slower} {}
  std::string name() const override { return "timed" + std::to_string(index); }
  void begin_step(std::uint64_t, std::chrono::steady_clock::time_point) override { step_seconds = 0; }
  ChunkTiming run_chunk(ChunkContext& ctx, const ChunkFunction& fn) override {
    fn(ctx);
    step_seconds += curve.seconds(ctx.samples.size());
    return {};
  }
  std::optional<double> step_device_seconds() const override { return step_seconds; }
};

struct TimedBackend final : DeviceBackend {
  Curve curve;
  std::vector<double> slower{1.0, 1.0};  // each device's times are its factor x the curve's
  explicit TimedBackend(Curve c) : curve(c) {}
  TimedBackend(Curve c, std::vector<double> factors) : curve(c), slower(std::move(factors)) {}
  std::size_t available() const noexcept override { return slower.size(); }
  std::vector<std::unique_ptr<Device>> make_devices(const DeviceSpec&, const RuntimeOptions&) override {
    std::vector<std::unique_ptr<Device>> out;
    for (std::size_t i = 0; i < slower.size(); ++i) out.push_back(std::make_unique<TimedDevice>(i, curve, slower[i]));
    return out;
  }
  std::unique_ptr<Communicator> make_communicator(std::span<Device* const>) override { return std::make_unique<InProcessCommunicator>(); }
};

}  // namespace

TEST_CASE("Runtime.AutoChunkSizeIsEachDevicesBestRungUnderStatic") {
  // Two devices timed by the step (a GPU's way), a + b m a chunk: the runtime explores their ladders within each
  // device's share and, under the static policy, which has no tail to share, settles on the best rung, then reports
  // it in every step. (Stealing's smallest good-enough rung: ChunkSizer.ChoosesTheSmallestRungWithin95PercentOfTheBest;
  // here its thieves would take chunks by timing, and the exploration with them.)
  const RestoreCudaBackend restore;  // the test registers a stand-in
  const Curve c{2e-4, 1e-5};
  register_device_backend(DeviceKind::kCuda, std::make_shared<TimedBackend>(c));
  Runtime rt({.devices = "cuda:all", .schedule = {.policy = SchedulePolicy::kStatic}});  // chunk_size = 0 is the default
  ParameterLayout layout;
  layout.add("p", 1);
  rt.register_parameters(layout, std::vector<float>(1, 0.0f));
  std::vector<std::uint32_t> batch(1024);
  std::iota(batch.begin(), batch.end(), 0u);
  StepReport last;
  for (int step = 0; step < 40; ++step) {
    last = rt.step(batch, [](ChunkContext& ctx) { ctx.grad[0] += static_cast<float>(ctx.samples.size()); });
    CHECK(last.samples == 1024);
  }
  CHECK(c.expected(512) == 256);  // what stealing would take: the static split takes its best, each share whole
  for (const DeviceReport& d : last.devices) CHECK(d.chunk_samples == 512);
  CHECK(last.chunks == 2);
  CHECK(rt.chunk_curve(0).size() == 7);  // rungs 8 .. 512
}

TEST_CASE("Runtime.AutoChunkSizesKeepEveryStepExact") {
  // Sizes change from step to step while the ladders are explored and after: every step's gradient is still the
  // sequential one, with stealing across unequal CPU devices.
  const Synthetic syn(600, 20, 5, 9);
  const MlpModel model({20, 12, 5});
  const std::vector<float> init = model.initial_parameters(2);
  Runtime rt({.devices = "cpu:3", .host = {.slowdown = {1, 2, 1}, .threads_per_device = 1}});
  rt.register_parameters(model.layout(), init);
  std::vector<MlpModel::Workspace> ws(3);
  std::set<std::size_t> sizes;
  for (int step = 0; step < 16; ++step) {
    std::vector<std::uint32_t> batch(300 + static_cast<std::size_t>(step) * 7);
    std::iota(batch.begin(), batch.end(), static_cast<std::uint32_t>(step));
    const StepReport r = rt.compute_gradient(batch, [&](ChunkContext& ctx) {
      ctx.add_loss(model.accumulate_gradient(ctx.params, ctx.grad, syn.data, ctx.samples, ws[ctx.device]));
    });
    CAPTURE(step);
    CHECK(r.samples == batch.size());
    CHECK(relative_error(rt.gradient(), sequential_mean_gradient(model, init, syn.data, batch)) <= 1e-5);
    for (const DeviceReport& d : r.devices) sizes.insert(d.chunk_samples);
  }
  CHECK(sizes.size() >= 2);  // the ladder was explored
}

TEST_CASE("Runtime.AutoChunkSizesKeepASlowDevicesChunksAsShortAsTheFastOnes") {
  // Placed by speed with stealing, a device at under half the fastest one's speed runs chunks about as long in time as
  // the fastest device's: its size is the fast one's scaled by their speeds compared at a rung both ran, not its own
  // good-enough rung. So the step's tail stays about one fast chunk long.
  const RestoreCudaBackend restore;  // the test registers a stand-in
  const Curve c{2e-4, 1e-5};
  register_device_backend(DeviceKind::kCuda, std::make_shared<TimedBackend>(c, std::vector<double>{1.0, 6.0}));
  Runtime rt({.devices = "cuda:all"});
  ParameterLayout layout;
  layout.add("p", 1);
  rt.register_parameters(layout, std::vector<float>(1, 0.0f));
  std::vector<std::uint32_t> batch(2048);
  std::iota(batch.begin(), batch.end(), 0u);
  StepReport last;
  for (int step = 0; step < 60; ++step) last = rt.step(batch, [](ChunkContext& ctx) { ctx.grad[0] += 1.0f; });
  REQUIRE(last.devices.size() == 2);
  const std::size_t fast = last.devices[0].chunk_samples, slow = last.devices[1].chunk_samples;
  MESSAGE("chunk sizes: fast " << fast << ", slow " << slow);
  // Which rung the fast device settles on depends on what it stole while exploring (64 to 512 here); the slow one's
  // size follows it: the fast one's scaled by their speeds (exactly 1/6 on these timelines), or the slow one's
  // smallest measured rung when that is already smaller. Its own good-enough rung would be as large as the fast one's.
  CHECK(fast >= 64);
  CHECK(slow >= 1);
  CHECK(slow <= std::max<std::size_t>(ChunkSizer::kFirstRung, static_cast<std::size_t>(std::lround(static_cast<double>(fast) / 6.0))));
}

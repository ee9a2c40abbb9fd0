// Failure semantics: an injected stall fails the step with a TimeoutError soon after the timeout and the runtime
// goes on; a lost device fails the step (on_device_failure = fail) or is dropped with its chunks re-run and the
// gradient still exact (exclude); every failure names the device, the step and the chunk.
#include "model_test_support.hpp"

#include <stealbatch/error.hpp>
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/runtime/testing.hpp>
#include <stealbatch/runtime/sim_device.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <numeric>
#include <string>
#include <thread>

using namespace stealbatch;
using stealbatch::testing::Fault;
using namespace stealbatch::testing;
using Clock = std::chrono::steady_clock;

namespace {

struct Fixture {
  Synthetic syn{512, 8, 3, 11};
  MlpModel model{{8, 3}};  // linear: smooth, so chunking changes only the rounding (see perf/soak.cpp)
  std::vector<float> init = model.initial_parameters(5);
  std::vector<std::uint32_t> batch = [] {
    std::vector<std::uint32_t> b(256);
    std::iota(b.begin(), b.end(), 0u);
    return b;
  }();
  // pause: per chunk, so that every device gets to run some (a tiny model's chunks take a microsecond, and the
  // first worker awake would drain the step alone).
  ChunkFunction fn(std::chrono::microseconds pause = std::chrono::microseconds(0)) {
    return [this, pause](ChunkContext& ctx) {
      thread_local MlpModel::Workspace ws;
      ctx.add_loss(model.accumulate_gradient(ctx.params, ctx.grad, syn.data, ctx.samples, ws));
      if (pause.count() > 0) std::this_thread::sleep_for(pause);
    };
  }
};

}  // namespace

TEST_CASE("Faults.StallFailsTheStepWithATimeoutAndTheRuntimeGoesOn") {
  Fixture fx;
  std::atomic<std::int64_t> stall_at{0};
  RuntimeOptions o;
  o.devices = "sim:1,1,1";
  o.schedule.chunk_size = 8;
  o.schedule.policy = SchedulePolicy::kStatic;  // device 1 surely runs its own chunks: nobody steals them first
  o.sim.sample_seconds = 20e-6;
  o.stall_timeout = 2;  // at 0.2 s a starved host tripped it in an ordinary chunk
  const stealbatch::testing::FaultInjector faults = [&](std::size_t device, std::uint64_t step, ChunkId chunk) {
    std::int64_t zero = 0;  // one stall: the first chunk device 1 runs in step 2
    (void)chunk;
    if (device == 1 && step == 2 && stall_at.compare_exchange_strong(zero, Clock::now().time_since_epoch().count())) {
      return Fault::kStall;
    }
    return Fault::kNone;
  };
  Runtime rt(o);
  stealbatch::testing::inject_faults(rt, faults);
  rt.register_parameters(fx.model.layout(), fx.init);
  rt.step(fx.batch, fx.fn());
  const std::vector<float> before = rt.parameters(0);
  std::string what;
  try {
    rt.step(fx.batch, fx.fn());
    FAIL("a stalled device must fail the step");
  } catch (const TimeoutError& e) {
    what = e.what();
  }
  const double ms = static_cast<double>(Clock::now().time_since_epoch().count() - stall_at.load()) / 1e6;
  MESSAGE("stall to TimeoutError: " << ms << " ms (timeout 2000 ms): " << what);
  // The watchdog times the stall from the chunk's stamp, taken a moment before the fault fires; it looks every 10 ms,
  // and the target is timeout + 50 ms (perf/soak reports the figure). Here only that it fired, not before the
  // timeout, and within 5 times it: a loaded machine delays the watchdog by milliseconds, not by 8 s.
  CHECK(ms >= 1995);
  CHECK(ms < 10000);
  CHECK(what.find("sim1") != std::string::npos);
  CHECK(what.find("step 2") != std::string::npos);
  CHECK(what.find("can run another step") != std::string::npos);
  const auto after = rt.parameters(0);
  CHECK(std::equal(after.begin(), after.end(), before.begin()));  // nothing applied
  // The next step runs normally and is exact.
  rt.compute_gradient(fx.batch, fx.fn());
  CHECK(relative_error(rt.gradient(), sequential_mean_gradient(fx.model, before, fx.syn.data, fx.batch)) <= 1e-5);
}

TEST_CASE("Faults.LostDeviceFailsTheStepByDefault") {
  Fixture fx;
  RuntimeOptions o;
  o.devices = "sim:1,1,1";
  o.sim.sample_seconds = 20e-6;
  o.schedule.chunk_size = 8;
  o.host.threads_per_device = 1;
  o.schedule.policy = SchedulePolicy::kStatic;  // device 2 surely runs its own chunks (22 to 31): nobody steals them first
  const stealbatch::testing::FaultInjector faults = [](std::size_t device, std::uint64_t, ChunkId chunk) { return device == 2 && chunk >= 20 ? Fault::kDeviceLoss : Fault::kNone; };
  Runtime rt(o);
  stealbatch::testing::inject_faults(rt, faults);
  rt.register_parameters(fx.model.layout(), fx.init);
  try {
    rt.step(fx.batch, fx.fn());
    FAIL("a lost device must fail the step with on_device_failure = fail");
  } catch (const ChunkError& e) {
    CHECK_FALSE(e.can_continue());
    CHECK(e.device() == "sim2");
    CHECK_THROWS_AS(std::rethrow_if_nested(e), DeviceLostError);
  }
}

TEST_CASE("Faults.ExcludedDeviceIsDroppedAndTheGradientStaysExact") {
  Fixture fx;
  for (const std::string devices : {"cpu:3", "sim:1,0.5,1,0.25"}) {
    CAPTURE(devices);
    RuntimeOptions o;
    o.devices = devices;
    o.schedule.chunk_size = 4;
    o.host.threads_per_device = 1;
    o.sim.sample_seconds = 20e-6;
    o.on_device_failure = OnDeviceFailure::kExclude;
    // Placed equally and never stolen: device 1 surely runs its own range, in order, and dies at its third chunk.
    o.schedule.placement = PlacementPolicy::kEqual;
    o.schedule.policy = SchedulePolicy::kStatic;
    // Device 1 dies at its third chunk of step 2 (after running two: their gradient is lost with it).
    std::atomic<int> seen{0};
    const stealbatch::testing::FaultInjector faults = [&](std::size_t device, std::uint64_t step, ChunkId) {
      return device == 1 && step == 2 && seen.fetch_add(1) == 2 ? Fault::kDeviceLoss : Fault::kNone;
    };
    Runtime rt(o);
    stealbatch::testing::inject_faults(rt, faults);
    const std::size_t n = rt.device_count();
    rt.register_parameters(fx.model.layout(), fx.init);
    const auto pause = std::chrono::microseconds(200);
    rt.compute_gradient(fx.batch, fx.fn(pause));
    const StepReport r = rt.compute_gradient(fx.batch, fx.fn(pause));
    REQUIRE(r.excluded_devices.size() == 1);
    CHECK(r.excluded_devices[0].back() == '1');
    CHECK(r.rerun_chunks >= 2);
    CHECK(rt.device_count() == n - 1);
    CHECK(relative_error(rt.gradient(), sequential_mean_gradient(fx.model, fx.init, fx.syn.data, fx.batch)) <= 1e-5);
    // Later steps run on the survivors, exactly, and training goes on.
    const StepReport r3 = rt.step(fx.batch, fx.fn(pause));
    CHECK(r3.excluded_devices.empty());
    CHECK(r3.devices.size() == n - 1);
    const StepReport r4 = rt.compute_gradient(fx.batch, fx.fn(pause));
    CHECK(r4.samples == fx.batch.size());
  }
}

TEST_CASE("Faults.StalledReductionTimesOutToo") {
  // The simulated ring AllReduce takes 2 (n - 1) / n * bytes / busbw: 40 s here, twenty times the timeout. The
  // timeout is 2 s, which no chunk of this step comes near however loaded the machine (at 0.2 s a starved host
  // tripped it inside a chunk), and the bound of 20 s only tells a wait cut short by the timeout from one slept out in
  // full (a precise sleep never ends early).
  Fixture fx;
  RuntimeOptions o;
  o.devices = "sim:1,1";
  o.sim.sample_seconds = 0;
  o.sim.allreduce_bytes = 4e10;
  o.sim.busbw = 1e9;
  o.stall_timeout = 2;
  Runtime rt(o);
  rt.register_parameters(fx.model.layout(), fx.init);
  const auto t0 = Clock::now();
  std::string what;
  try {
    rt.step(fx.batch, fx.fn());
    FAIL("a reduction that outlasts the timeout must fail the step");
  } catch (const TimeoutError& e) {
    what = e.what();
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  MESSAGE("step with a 40 s reduction failed after " << ms << " ms: " << what);
  CHECK(ms >= 2000);
  CHECK(ms < 20000);
  CHECK(what.find("in the reduction or the update") != std::string::npos);
  const auto p = rt.parameters(0);
  CHECK(std::equal(p.begin(), p.end(), fx.init.begin()));
}

TEST_CASE("Faults.APreciseSleepNeverEndsEarlyAndStillCancels") {
  // The simulated AllReduce's wait: asleep until shortly before its deadline, then yielding until it. (How late it
  // ends is measured, not tested: 2.8 us at the median against 58 us for a plain timed sleep, stealbench 32 devices.)
  SimDevice dev(0, 1.0, 1e-4);
  for (int i = 0; i < 20; ++i) {
    const auto until = Clock::now() + std::chrono::milliseconds(2);
    CHECK(dev.sleep_precisely_until_or_cancel(until));
    CHECK(Clock::now() >= until);
  }
  // Cancelled in either phase it returns false at once: while asleep (a 10 s deadline, the default spin) and while
  // yielding (a spin longer than the whole wait).
  using std::chrono::nanoseconds;
  for (const nanoseconds spin : {nanoseconds(std::chrono::microseconds(150)), nanoseconds(std::chrono::seconds(20))}) {
    dev.reset_cancel();
    std::thread canceller([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      dev.cancel();
    });
    const auto t0 = Clock::now();
    CHECK_FALSE(dev.sleep_precisely_until_or_cancel(t0 + std::chrono::seconds(10), spin));
    CHECK(Clock::now() - t0 < std::chrono::seconds(5));
    canceller.join();
  }
  dev.reset_cancel();
  CHECK(dev.sleep_precisely_until_or_cancel(Clock::now()));  // a deadline already reached returns at once
}

// Sample costs given with a step (Runtime::step's `cost`): their checks, chunks cut to a cost budget, shares placed by
// cost, the packer, the gradient, and the call-time fit the runtime learns from them.
#include "model_test_support.hpp"

#include <stealbatch/error.hpp>
#include <stealbatch/runtime/detail/call_fit.hpp>
#include <stealbatch/runtime/runtime.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <vector>

// The packer is internal (runtime/src/cost/given_costs.hpp); its declaration, to test it alone.
namespace stealbatch::detail {
std::vector<std::uint32_t> pack_by_cost(std::span<const double> cost, std::size_t bins);
}

using namespace stealbatch;
using namespace stealbatch::testing;

namespace {

// Costs with the long tail of document lengths: most short, a few 20-50x longer.
std::vector<double> long_tailed(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> len(3.5, 1.0);
  std::vector<double> c(n);
  for (double& x : c) x = std::clamp(std::round(len(rng)), 1.0, 1024.0);
  return c;
}

// What each call of a step saw: its chunks, the cost of its samples and the device it was placed on.
struct Seen {
  std::mutex m;
  struct Call {
    std::size_t chunks = 0, home = 0, samples = 0;
    double cost = 0;
    bool first = false;  // holds the batch's first sample
  };
  std::vector<Call> calls;
};

}  // namespace

TEST_CASE("GivenCosts.BadCostsAreRefusedByPosition") {
  const Synthetic syn(64, 4, 2, 1);
  const MlpModel model({4, 2});
  Runtime rt({.devices = "cpu:2", .host = {.threads_per_device = 1}});
  rt.register_parameters(model.layout(), model.initial_parameters(1));
  std::vector<std::uint32_t> batch(16);
  std::iota(batch.begin(), batch.end(), 0u);
  const auto fn = [](ChunkContext&) {};
  std::vector<double> cost(16, 1.0);
  CHECK_THROWS_WITH_AS(rt.step(batch, fn, std::span<const double>(cost).first(15)), "cost has 15 values for a batch of 16; give one per sample", ConfigError);
  for (double bad : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    cost.assign(16, 1.0);
    cost[7] = bad;
    CAPTURE(bad);
    CHECK_THROWS_AS(rt.step(batch, fn, cost), ConfigError);
    try {
      rt.step(batch, fn, cost);
    } catch (const ConfigError& e) {
      CHECK(std::string(e.what()).find("cost[7]") != std::string::npos);
    }
  }
  // The packer needs costs with every step.
  Runtime packed({.devices = "cpu:2", .schedule = {.policy = SchedulePolicy::kStatic, .placement = PlacementPolicy::kPacked}, .host = {.threads_per_device = 1}});
  packed.register_parameters(model.layout(), model.initial_parameters(1));
  CHECK_THROWS_WITH_AS(packed.step(batch, fn), doctest::Contains("placement = packed needs each sample's cost"), ConfigError);
  CHECK_THROWS_AS(Runtime({.devices = "cpu:2", .schedule = {.policy = SchedulePolicy::kCentral, .placement = PlacementPolicy::kPacked}}), ConfigError);
}

TEST_CASE("GivenCosts.CallFitRecoversALineAndItsBudget") {
  detail::CallFit f;
  CHECK(f.line().per_unit == 0);
  // t = 2 ms + 1 us per unit, with a little noise that averages out.
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200; ++i) {
    const double c = 10.0 + static_cast<double>(rng() % 2000);
    const double noise = 1.0 + 0.01 * (static_cast<double>(rng() % 201) - 100.0) / 100.0;
    f.add(c, (2e-3 + 1e-6 * c) * noise);
  }
  CHECK(f.calls() == detail::CallFit::kWindow);
  const auto l = f.line();
  CHECK(l.per_call == doctest::Approx(2e-3).epsilon(0.1));
  CHECK(l.per_unit == doctest::Approx(1e-6).epsilon(0.05));
  // Its fixed part at most a tenth of a call: c >= 9 a / b = 18,000 units.
  CHECK(f.overhead_cost(0.9) == doctest::Approx(9 * l.per_call / l.per_unit));
  CHECK(f.overhead_cost(0.9) == doctest::Approx(18000).epsilon(0.15));
  CHECK(f.scatter() < 0.02);  // 1% noise about the line
  // Calls whose cost is not their size (8 samples at the long end of a length-grouped batch take 4x those at the
  // short end): the line they give does not hold them, and scatter() says so.
  detail::CallFit varied;
  for (int i = 0; i < 40; ++i) {
    const double n = 8.0 * static_cast<double>(1 + i % 4);
    varied.add(n, (i % 2 == 0 ? 4.0 : 1.0) * 1e-3 * n);
  }
  CHECK(varied.scatter() > 0.3);
  // Calls of one cost: no fixed part to tell, time over cost.
  detail::CallFit one;
  for (int i = 0; i < 10; ++i) one.add(100, 0.5);
  CHECK(one.line().per_call == 0);
  CHECK(one.line().per_unit == doctest::Approx(0.005));
  CHECK(one.overhead_cost(0.9) == 0);
  // A line that would cross below 0: through the origin instead.
  detail::CallFit neg;
  for (int i = 1; i <= 10; ++i) neg.add(i, std::max(1e-6, 2.0 * i - 3.0));
  CHECK(neg.line().per_call == 0);
  CHECK(neg.line().per_unit > 0);
  // What is not finite and positive is not a call.
  detail::CallFit junk;
  for (double bad : {0.0, -1.0, std::nan(""), HUGE_VAL}) junk.add(bad, 1.0), junk.add(1.0, bad);
  CHECK(junk.calls() == 0);
}

TEST_CASE("GivenCosts.PackerBalancesWithinOneSampleAndIsDeterministic") {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    const std::vector<double> cost = long_tailed(500, seed);
    for (std::size_t bins : {2u, 3u, 4u, 7u}) {
      const std::vector<std::uint32_t> bin = detail::pack_by_cost(cost, bins);
      REQUIRE(bin.size() == cost.size());
      std::vector<double> load(bins, 0.0);
      for (std::size_t i = 0; i < cost.size(); ++i) {
        REQUIRE(bin[i] < bins);
        load[bin[i]] += cost[i];
      }
      const double total = std::accumulate(cost.begin(), cost.end(), 0.0), largest = *std::max_element(cost.begin(), cost.end());
      CAPTURE(bins);
      // Greedy by largest first: no bin above the mean by more than one sample (the last one it took).
      CHECK(*std::max_element(load.begin(), load.end()) <= total / static_cast<double>(bins) + largest);
      CHECK(detail::pack_by_cost(cost, bins) == bin);
    }
  }
}

// Every step's gradient is the sequential one, with costs, for each policy that reads them; chunks hold a chunk's
// budget of cost (a chunk of long documents fewer of them); a packed or an equal-cost placement puts about equal cost
// on each device.
TEST_CASE("GivenCosts.ChunksAreCutByCostPlacedByCostAndTheGradientIsExact") {
  const Synthetic syn(600, 12, 4, 7);
  const MlpModel model({12, 8, 4});
  const std::vector<float> init = model.initial_parameters(2);
  struct Case {
    const char* name;
    SchedulePolicy policy;
    PlacementPolicy placement;
  };
  for (const Case& k : {Case{"steal, auto", SchedulePolicy::kSteal, PlacementPolicy::kAuto}, Case{"steal, equal", SchedulePolicy::kSteal, PlacementPolicy::kEqual},
                        Case{"static, packed", SchedulePolicy::kStatic, PlacementPolicy::kPacked}, Case{"steal, packed", SchedulePolicy::kSteal, PlacementPolicy::kPacked},
                        Case{"static, equal samples", SchedulePolicy::kStatic, PlacementPolicy::kAuto}}) {
    for (std::size_t chunk : {0u, 4u, 16u}) {
      CAPTURE(k.name);
      CAPTURE(chunk);
      // merge_stolen off: each call is one chunk, whose cost the budget bounds.
      Runtime rt({.devices = "cpu:3", .schedule = {.chunk_size = chunk, .policy = k.policy, .placement = k.placement, .merge_stolen = false},
                  .host = {.threads_per_device = 1}});
      rt.register_parameters(model.layout(), init);
      std::vector<MlpModel::Workspace> ws(3);
      for (int step = 0; step < 4; ++step) {
        std::vector<std::uint32_t> batch(240);
        std::iota(batch.begin(), batch.end(), static_cast<std::uint32_t>(step * 90));
        // A grouped batch: the long documents all at its front, where an equal split of samples gives them to one device.
        std::vector<double> cost = long_tailed(batch.size(), 10 + step);
        std::sort(cost.begin(), cost.end(), std::greater<>());
        std::map<std::uint32_t, double> cost_of;
        for (std::size_t i = 0; i < batch.size(); ++i) cost_of[batch[i]] = cost[i];
        Seen seen;
        const StepReport r = rt.compute_gradient(
            batch,
            [&](ChunkContext& ctx) {
              ctx.add_loss(model.accumulate_gradient(ctx.params, ctx.grad, syn.data, ctx.samples, ws[ctx.device]));
              double c = 0;
              for (std::uint32_t s : ctx.samples) c += cost_of.at(s);
              const std::lock_guard lock(seen.m);
              const bool first = std::find(ctx.samples.begin(), ctx.samples.end(), batch[0]) != ctx.samples.end();
              seen.calls.push_back({ctx.chunks.size(), ctx.home_device, ctx.samples.size(), c, first});
            },
            cost);
        CHECK(relative_error(rt.gradient(), sequential_mean_gradient(model, init, syn.data, batch)) <= 1e-5);
        const double total = std::accumulate(cost.begin(), cost.end(), 0.0), mean = total / static_cast<double>(cost.size());
        const double largest = cost.front();
        double reported = 0;
        for (const DeviceReport& d : r.devices) reported += d.cost;
        CHECK(reported == doctest::Approx(total));
        const bool in_cost = k.policy == SchedulePolicy::kSteal || k.placement == PlacementPolicy::kPacked;
        CHECK(r.placed_by_cost == in_cost);
        if (!in_cost) continue;
        // Each chunk at most its budget (chunk_size mean samples; with 0, what the fit asks, at most the batch over the
        // devices) and half a sample more; a chunk of several samples in the long front holds fewer of them.
        const double budget = chunk > 0 ? static_cast<double>(chunk) * mean : total / 3;
        std::vector<double> placed(3, 0.0);
        for (const auto& call : seen.calls) {
          CHECK(call.chunks == 1);
          if (call.samples > 1) CHECK(call.cost <= budget + largest / 2 + 1e-9);
          placed[call.home] += call.cost;
        }
        if (chunk == 16) {
          // The chunk that holds the costliest sample (the batch's first) holds fewer than 16.
          const auto first = std::find_if(seen.calls.begin(), seen.calls.end(), [&](const auto& c) { return c.first; });
          CHECK(first != seen.calls.end());
          if (first != seen.calls.end()) CHECK(first->samples < 16);
        }
        // The first step is placed before anything is measured: in equal cost. The packer every step.
        if (step == 0 || k.placement == PlacementPolicy::kPacked || k.placement == PlacementPolicy::kEqual) {
          for (double p : placed) CHECK(p <= total / 3 + largest + 1e-9);
        }
      }
    }
  }
}

// The runtime learns each device's cost per second and its call-time line from the calls (host devices); the first
// needs every device to have run, the second 8 calls.
TEST_CASE("GivenCosts.TheCallLineIsLearntFromTheCalls") {
  const Synthetic syn(256, 8, 3, 4);
  const MlpModel model({8, 3});
  Runtime rt({.devices = "cpu:2", .schedule = {.chunk_size = 4}, .host = {.threads_per_device = 1}});
  rt.register_parameters(model.layout(), model.initial_parameters(1));
  CHECK(rt.call_cost(0).calls == 0);
  std::vector<MlpModel::Workspace> ws(2);
  std::vector<std::uint32_t> batch(128);
  std::iota(batch.begin(), batch.end(), 0u);
  const std::vector<double> cost = long_tailed(batch.size(), 5);
  for (int step = 0; step < 3; ++step) {
    rt.step(batch, [&](ChunkContext& ctx) { model.accumulate_gradient(ctx.params, ctx.grad, syn.data, ctx.samples, ws[ctx.device]); }, cost);
  }
  std::size_t calls = 0;
  for (std::size_t d = 0; d < 2; ++d) {
    const Runtime::CallCost c = rt.call_cost(d);
    calls += c.calls;
    if (c.calls > 0) {
      CHECK(c.per_unit > 0);
      CHECK(c.per_call >= 0);
    }
  }
  CHECK(calls >= detail::CallFit::kMinCalls);  // 3 steps of 128 samples in chunks of about 4: dozens of calls
  CHECK_THROWS_AS((void)rt.call_cost(2), std::out_of_range);
}

// The batch-position cost model: it tells costly positions from slow devices, stays out of the way where samples/s
// is right or a position's past says nothing, and the runtime places by it only then, with every chunk still run once.
#include <stealbatch/runtime/detail/cost_profile.hpp>
#include <stealbatch/runtime/runtime.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

using namespace stealbatch;
using detail::CostProfile;

namespace {

// One synthetic step: the batch cut into 16-sample chunks, contiguous shares shifted by `offset` positions (so
// positions change devices from step to step, as a moving placement and steals make them), each chunk's time its
// positions' costs over its device's speed, times (1 +- noise). Returns the chunk times; `flat` gets each device's
// samples/s in that step.
std::vector<CostProfile::ChunkTime> synthetic_step(const std::vector<double>& cost, const std::vector<double>& speed, std::size_t offset,
                                                   double noise, std::mt19937_64& rng, std::vector<double>& flat) {
  const std::size_t batch = cost.size(), n = speed.size(), share = batch / n;
  std::uniform_real_distribution<double> u(-noise, noise);
  std::vector<CostProfile::ChunkTime> out;
  std::vector<double> busy(n, 0.0), samples(n, 0.0);
  for (std::uint32_t at = 0; at < batch; at += 16) {
    const auto d = static_cast<std::uint32_t>(((at + batch - offset) % batch) / share % n);
    double c = 0;
    for (std::uint32_t x = at; x < at + 16; ++x) c += cost[x];
    const double t = c / speed[d] * (1 + u(rng));
    out.push_back({at, 16, d, t});
    busy[d] += t, samples[d] += 16;
  }
  flat.resize(n);
  for (std::size_t d = 0; d < n; ++d) flat[d] = samples[d] / busy[d];
  return out;
}

// Feeds `steps` synthetic steps to a profile, shares shifted by `shift` positions a step, each step compared against
// the samples/s of the one before (as the runtime places it); calls after(step) after each.
void feed(CostProfile& p, const std::vector<double>& cost, const std::vector<double>& speed, std::size_t steps, std::size_t shift,
          std::uint64_t seed, const std::function<void(std::size_t)>& after = {}) {
  std::mt19937_64 rng(seed);
  std::vector<double> flat, placed_with;
  for (std::size_t step = 0; step < steps; ++step) {
    p.observe(cost.size(), speed.size(), synthetic_step(cost, speed, step * shift, 0.02, rng, flat), placed_with);
    if (after) after(step);
    placed_with = flat;
  }
}

}  // namespace

TEST_CASE("CostProfile.TellsCostlyPositionsFromSlowDevices") {
  // The first half of the batch costs 6.6x the second (stealbench's seed-skew), and the devices' speeds differ too.
  const std::size_t batch = 512;
  std::vector<double> cost(batch);
  for (std::size_t x = 0; x < batch; ++x) cost[x] = x < batch / 2 ? 1.0 : 0.15;
  const std::vector<double> speed = {1.0, 0.5, 0.25, 1.0};
  CostProfile p;
  feed(p, cost, speed, 8, 37, 1);
  REQUIRE(p.active(batch, speed.size()));
  CHECK_FALSE(p.active(batch + 1, speed.size()));  // another batch size: other positions
  CHECK_FALSE(p.active(batch, speed.size() + 1));
  // Samples/s was far off (a costly share reads as a slow device); the profile predicts within the noise.
  CHECK(p.error_by_samples() > 0.1);
  CHECK(p.error_by_position() < 0.01);
  const auto c = p.costs();
  const auto v = p.speeds();
  double costly = 0, cheap = 0;
  for (std::size_t x = 0; x < batch; ++x) (x < batch / 2 ? costly : cheap) += c[x];
  CHECK(costly / cheap == doctest::Approx(1.0 / 0.15).epsilon(0.05));
  CHECK(std::accumulate(c.begin(), c.end(), 0.0) == doctest::Approx(static_cast<double>(batch)));  // mean 1
  CHECK(v[1] / v[0] == doctest::Approx(0.5).epsilon(0.05));
  CHECK(v[2] / v[0] == doctest::Approx(0.25).epsilon(0.05));
  CHECK(v[3] / v[0] == doctest::Approx(1.0).epsilon(0.05));
}

TEST_CASE("CostProfile.StaysUnusedWhereSamplesPerSecondIsRight") {
  // Equal costs, unequal speeds (seed-slow, hetero): samples/s predicts every chunk, nothing to gain.
  const std::size_t batch = 512;
  const std::vector<double> cost(batch, 1.0), speed = {1.0, 0.8, 0.5, 0.25};
  CostProfile p;
  feed(p, cost, speed, 10, 37, 2, [&](std::size_t) { CHECK_FALSE(p.active(batch, speed.size())); });
  CHECK(p.error_by_samples() >= 0);
  CHECK(p.error_by_samples() < 0.01);
}

TEST_CASE("CostProfile.StaysUnusedWhenAPositionsPastSaysNothing") {
  // Costs drawn afresh every step, lognormal with sigma 1 (varcost): last step's costs by position predict this
  // step's worse than samples/s does, every step.
  const std::size_t batch = 1024;
  const std::vector<double> speed = {1.0, 1.0, 1.0, 1.0};
  std::mt19937_64 rng(3);
  std::lognormal_distribution<double> ln(0.0, 1.0);
  CostProfile p;
  std::vector<double> flat, placed_with, cost(batch);
  for (std::size_t step = 0; step < 20; ++step) {
    for (double& c : cost) c = ln(rng);
    const auto times = synthetic_step(cost, speed, step * 37, 0.0, rng, flat);
    p.observe(batch, speed.size(), times, placed_with);
    CAPTURE(step);
    CHECK_FALSE(p.active(batch, speed.size()));
    if (step >= 2) CHECK(p.error_by_position() > 0.5 * p.error_by_samples());  // 0.80-1.78x its error over these steps
    placed_with = flat;
  }
}

TEST_CASE("CostProfile.DevicesThatNeverShareAPositionAreNotCompared") {
  // Shares that never move, on devices of speeds 1 and 0.5, with costs that alternate chunk by chunk inside each
  // share: samples/s is off for every chunk, but no position ever ran on two devices, so a device's speed cannot be
  // told from its positions' costs (half the speed and twice the costs fit as well). The profile stays off.
  const std::size_t batch = 256;
  std::vector<double> cost(batch);
  for (std::size_t x = 0; x < batch; ++x) cost[x] = (x / 16) % 2 == 0 ? 1.0 : 0.2;
  const std::vector<double> speed = {1.0, 0.5};
  CostProfile p;
  feed(p, cost, speed, 6, 0, 4, [&](std::size_t) { CHECK_FALSE(p.active(batch, 2)); });
  CHECK(p.error_by_samples() > 0.1);  // samples/s is far off: only the missing comparison keeps the profile off
}

TEST_CASE("CostProfile.SplitsByCostAndCutsChunksByCost") {
  using detail::cut_share;
  using detail::split_by_cost;
  using Range = std::pair<std::uint32_t, std::uint32_t>;
  // Each boundary at the position nearest its share of the cumulative cost.
  CHECK(split_by_cost(std::vector<double>{3, 1, 1, 1}, std::vector<double>{1, 1}) == std::vector<Range>{{0, 1}, {1, 4}});
  CHECK(split_by_cost(std::vector<double>(10, 1.0), std::vector<double>{1, 1}) == std::vector<Range>{{0, 5}, {5, 10}});
  CHECK(split_by_cost(std::vector<double>(10, 1.0), std::vector<double>{0, 1, 0}) == std::vector<Range>{{0, 0}, {0, 10}, {10, 10}});
  CHECK(split_by_cost(std::vector<double>{1, 1, 1, 1, 6}, std::vector<double>{1, 1}) == std::vector<Range>{{0, 4}, {4, 5}});

  // Equal costs: exactly the rule in whole samples (full chunks while more than kTailChunks chunks are left, then
  // a kTailChunks-th of what is left rounded up, down to the floor), for every share and chunk size.
  for (std::uint32_t share = 1; share <= 150; ++share) {
    for (std::size_t chunk = 1; chunk <= 40; ++chunk) {
      std::vector<std::uint32_t> got, want;
      const std::size_t floor = std::max<std::size_t>(1, chunk / 4);
      cut_share(100, 100 + share, static_cast<double>(chunk), static_cast<double>(floor), {}, got);
      for (std::size_t left = share; left > 0;) {
        constexpr auto tail = static_cast<std::size_t>(detail::kTailChunks);
        const std::size_t size = left > tail * chunk ? chunk : std::min(left, std::max(floor, (left + tail - 1) / tail));
        want.push_back(static_cast<std::uint32_t>(size));
        left -= size;
      }
      CAPTURE(share);
      CAPTURE(chunk);
      REQUIRE(got == want);
    }
  }
  // By cost: where samples cost 4, a chunk of cost 16 holds 4 of them; where they cost 1, 16. The end gets finer.
  std::vector<double> cost(256, 1.0);
  std::fill(cost.begin(), cost.begin() + 32, 4.0);
  std::vector<std::uint32_t> sizes;
  cut_share(0, 256, 16.0, 4.0, cost, sizes);
  REQUIRE(sizes.size() >= 10);
  CHECK(std::vector<std::uint32_t>(sizes.begin(), sizes.begin() + 9) == std::vector<std::uint32_t>{4, 4, 4, 4, 4, 4, 4, 4, 16});
  CHECK(std::accumulate(sizes.begin(), sizes.end(), 0u) == 256);
  CHECK(sizes.back() <= 4);  // the floor, or what is left
  CHECK(std::is_sorted(sizes.begin() + 8, sizes.end(), std::greater<>()));
  // A hard floor (the cost model's efficient size): no chunk under it unless the share is; the last pieces join.
  for (std::uint32_t share = 1; share <= 300; ++share) {
    std::vector<std::uint32_t> hard;
    cut_share(0, share, 64.0, 40.0, {}, hard, true);
    CAPTURE(share);
    CHECK(std::accumulate(hard.begin(), hard.end(), 0u) == share);
    for (std::uint32_t size : hard) CHECK((size >= 40 || hard.size() == 1));
  }
}

TEST_CASE("CostProfile.RuntimePlacesByCostWhenTheBatchCostsByPosition") {
  // Four equal simulated devices, the first half of every batch 6.6x as costly (seed-skew). After a few steps the
  // runtime places by cost: the devices that hold the costly half get fewer samples, each chunk still runs once.
  const std::size_t batch = 512;
  auto cost = [batch](std::uint32_t s) { return (s % batch) < batch / 2 ? 1.0 : 0.15; };
  for (const bool enabled : {true, false}) {
    Runtime rt({.devices = "sim:1,1,1,1", .schedule = {.chunk_size = 8, .cost_by_position = enabled}, .sim = {.sample_seconds = 50e-6, .sample_cost = cost}});
    ParameterLayout layout;
    layout.add("p", 1);
    rt.register_parameters(layout, std::vector<float>{0.0f});
    std::vector<std::uint32_t> samples(batch);
    std::vector<std::atomic<int>> seen(batch);
    std::size_t by_cost = 0;
    StepReport last;
    std::vector<double> placed(4);  // the cost of the samples placed on each device (ChunkContext::home_device), last step
    for (std::uint32_t step = 0; step < 12; ++step) {
      std::iota(samples.begin(), samples.end(), step * static_cast<std::uint32_t>(batch));
      for (auto& s : seen) s.store(0);
      std::fill(placed.begin(), placed.end(), 0.0);
      last = rt.compute_gradient(samples, [&](ChunkContext& ctx) {
        double c = 0;
        for (std::uint32_t s : ctx.samples) seen[s % batch].fetch_add(1), c += cost(s);
        std::atomic_ref<double>(placed[ctx.home_device]).fetch_add(c);
        ctx.grad[0] += static_cast<float>(ctx.samples.size());
      });
      for (auto& s : seen) REQUIRE(s.load() == 1);
      CHECK(rt.gradient()[0] == doctest::Approx(1.0));  // the mean of one per sample
      by_cost += last.placed_by_cost ? 1 : 0;
    }
    CAPTURE(enabled);
    if (!enabled) {
      CHECK(by_cost == 0);
      continue;
    }
    CHECK(by_cost >= 6);
    CHECK(last.placed_by_cost);
    // A quarter of the cost placed on each (256 + 256 x 0.15 = 294.4 in all): about 74 costly samples apiece on
    // devices 0 to 2, and the other 34 costly ones and the whole cheap half on device 3. By samples/s, the devices
    // holding the costly half would measure slow and get its cheap end instead.
    for (double c : placed) CHECK(c == doctest::Approx(294.4 / 4).epsilon(0.1));
  }
}

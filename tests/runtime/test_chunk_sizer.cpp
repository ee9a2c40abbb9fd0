// ChunkSizer and the runtime's automatic chunk sizes (chunk_size = 0): the ladder explored upward, the smallest
// good-enough rung chosen, noise and one-time costs kept out, and every step still exact while sizes change.
#include <stealbatch/models/mlp_model.hpp>
#include "model_test_support.hpp"

#include <stealbatch/runtime/detail/chunk_sizer.hpp>
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/runtime/sim_device.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <functional>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

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

// The MLP's chunk times on one H200 (gpu-runs/2026-12-04): 16 samples a chunk ran at 136k samples/s, 128 at 616k and
// 2048 at 2.67M; between and beyond them, the line through the nearest two. About 170 us a call whatever it holds,
// and 0.29 us a sample above 128: the time of small chunks is nearly all fixed cost.
struct H200Mlp {
  static constexpr std::array<std::pair<double, double>, 3> kPoints{{{16, 16 / 136e3}, {128, 128 / 616e3}, {2048, 2048 / 2.67e6}}};
  static double seconds(std::size_t m) {
    const double x = static_cast<double>(m);
    const std::size_t i = x <= kPoints[1].first ? 0 : 1;  // the segment: its line, extended past the end points
    const auto [x0, t0] = kPoints[i];
    const auto [x1, t1] = kPoints[i + 1];
    return t0 + (x - x0) * (t1 - t0) / (x1 - x0);
  }
  static double rate(std::size_t m) { return static_cast<double>(m) / seconds(m); }
  // The best samples/s of the rungs that fit a share.
  static double best(std::size_t share) {
    double b = 0;
    for (std::size_t m = ChunkSizer::kFirstRung; m <= share; m *= 2) b = std::max(b, rate(m));
    return b;
  }
};

std::string joined(const std::vector<std::size_t>& v) {
  std::string out;
  for (std::size_t x : v) out += (out.empty() ? "" : " ") + std::to_string(x);
  return out;
}

// Drives device 0 of a sizer as the runtime does, through steps of `share` samples: its first step cut into the probe
// (where it probes), the rest into its sizes, each chunk timed by `seconds`. Returns each step's size (the probe's
// largest chunk in a probing step) and the steps it explored.
struct Driven {
  std::vector<std::size_t> sizes;
  std::size_t explored = 0;
};
Driven drive(ChunkSizer& s, const std::function<double(std::size_t)>& seconds, std::size_t share, std::size_t steps) {
  Driven out;
  std::vector<std::uint32_t> cut;
  for (std::size_t step = 0; step < steps; ++step) {
    if (s.exploring(0)) ++out.explored;
    cut.clear();
    if (s.probing(0)) ChunkSizer::probe_sizes(share, cut);
    if (cut.empty()) {
      const std::size_t size = s.size(0, share);
      for (std::size_t at = 0; at < share; at += size) cut.push_back(static_cast<std::uint32_t>(std::min(size, share - at)));
    }
    for (std::uint32_t m : cut) s.observe_chunk(0, m, seconds(m));
    out.sizes.push_back(*std::max_element(cut.begin(), cut.end()));
    s.end_step(0, share);
  }
  return out;
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

TEST_CASE("ChunkSizer.TheProbeHoldsTheShareAndEnoughCallsForALine") {
  std::vector<std::uint32_t> p;
  ChunkSizer::probe_sizes(119, p);  // two rungs five times each hold 120
  CHECK(p.empty());
  ChunkSizer::probe_sizes(4096, p);
  CHECK(p == std::vector<std::uint32_t>{8, 8, 16, 16, 32, 32, 64, 64, 128, 128, 256, 256, 512, 512, 1024, 1024, 16});
  for (const std::size_t share : std::vector<std::size_t>{120, 121, 360, 1000, 2048, 4096, 8192, 100000, std::size_t{1} << 22}) {
    CAPTURE(share);
    ChunkSizer::probe_sizes(share, p);
    REQUIRE(!p.empty());
    CHECK(std::accumulate(p.begin(), p.end(), std::size_t{0}) == share);
    // Each rung's first chunk pays its one-time costs; the others are the line's calls.
    std::set<std::uint32_t> rungs;
    std::size_t calls = 0;
    for (std::uint32_t m : p) {
      if (m >= ChunkSizer::kFirstRung && std::has_single_bit(m) && !rungs.insert(m).second) ++calls;
    }
    CHECK(rungs.size() >= 2);
    CHECK(calls >= detail::CallFit::kMinCalls);
  }
}

TEST_CASE("ChunkSizer.AProbeWhoseChunksWereStolenIsRunAgain") {
  // Thieves took most of a device's probe (the large chunks at its share's end): too few calls ran on it to fit its
  // line, so its next step probes again, instead of climbing a ladder from 8 samples on a device whose calls may each
  // cost hundreds of microseconds. After kMaxProbeSteps probes it goes on without a line.
  const Curve c{1e-3, 1e-5};
  ChunkSizer s(1);
  for (std::size_t probe = 0; probe < ChunkSizer::kMaxProbeSteps; ++probe) {
    CAPTURE(probe);
    REQUIRE(s.probing(0));
    for (std::size_t m : {8, 8, 16}) s.observe_chunk(0, m, c.seconds(m));  // the rest of the probe ran elsewhere
    s.end_step(0, 4096);
    CHECK(!s.fit(0).known());
  }
  CHECK(!s.probing(0));
  CHECK(s.line(0).per_call == 0);

  // Enough of its probe ran on it: one probe, a line, and its start from that line.
  ChunkSizer t(1);
  std::vector<std::uint32_t> probe;
  ChunkSizer::probe_sizes(4096, probe);
  for (std::uint32_t m : probe) t.observe_chunk(0, m, c.seconds(m));
  t.end_step(0, 4096);
  CHECK(!t.probing(0));
  CHECK(t.line(0).per_call == doctest::Approx(c.a).epsilon(1e-6));
  CHECK(t.line(0).per_unit == doctest::Approx(c.b).epsilon(1e-6));
}

TEST_CASE("ChunkSizer.ALineHoldsThroughAHostsNoiseAndNotThroughCostsThatVary") {
  // Calls a + b n scattered by up to 25% either way (a Python chunk function on two busy cores scatters 9-18% about its
  // line): the line holds, and the cost model keeps cutting by it. Calls whose cost is not their size (4x at one end
  // of the batch) drop it.
  const Curve c{4e-4, 1.2e-5};
  const auto noisy = [&](std::size_t i, std::size_t m) { return c.seconds(m) * (1.0 + 0.25 * std::sin(1.7 * static_cast<double>(i))); };
  ChunkSizer s(1);
  std::vector<std::uint32_t> probe;
  ChunkSizer::probe_sizes(4096, probe);
  std::size_t i = 0;
  for (std::uint32_t m : probe) s.observe_chunk(0, m, noisy(i++, m));
  s.end_step(0, 4096);
  for (int step = 0; step < 20; ++step) {
    for (std::size_t m : {64, 128, 256, 512, 1024}) s.observe_chunk(0, m, noisy(i++, m));
    s.end_step(0, 4096);
    CAPTURE(step);
    CHECK(s.fit(0).scatter() > ChunkSizer::kFitted / 2);
    REQUIRE(s.line(0).per_call > 0);
    CHECK(s.line(0).per_call == doctest::Approx(c.a).epsilon(0.35));
    CHECK(s.line(0).per_unit == doctest::Approx(c.b).epsilon(0.15));
  }
  for (int step = 0; step < 30; ++step) {
    for (std::size_t m : {64, 128, 256, 512, 1024}) s.observe_chunk(0, m, (step % 2 == 0 ? 4.0 : 1.0) * c.seconds(m));
    s.end_step(0, 4096);
  }
  CHECK(s.fit(0).scatter() > ChunkSizer::kLineHolds);
  CHECK(s.line(0).per_call == 0);
}

TEST_CASE("ChunkSizer.ALineStartsAtItsChoiceAndSettlesInAFewSteps") {
  // Chunk times a + b n: the first step's chunks give a and b, and the second step runs the rung the line says the
  // rule chooses, the same rung a ladder climbed from 8 chooses. The fastest rung's choice is then made; the smallest
  // good-enough rung's once the share's largest rung is measured and the rung below falls short. A few steps instead
  // of a dozen.
  for (const Curve c : {Curve{2e-3, 1e-5}, Curve{1.8e-4, 0.29e-6}, Curve{2e-4, 1e-5}, Curve{2e-5, 1e-5}}) {
    for (std::size_t share : {512, 4096, 30000}) {
      CAPTURE(c.a);
      CAPTURE(c.b);
      CAPTURE(share);
      std::size_t top = ChunkSizer::kFirstRung;
      while (top * 2 <= share) top *= 2;
      ChunkSizer tail(1), fastest(1, ChunkSizer::Choice::kFastest), ladder(1);
      const auto seconds = [c](std::size_t m) { return c.seconds(m); };
      const Driven t = drive(tail, seconds, share, 6), f = drive(fastest, seconds, share, 6);
      const std::size_t climbed = explore(ladder, c, share);
      ChunkSizer first(1);  // the first step's chunks give a and b
      (void)drive(first, seconds, share, 1);
      CHECK(first.fit(0).line().per_call == doctest::Approx(c.a).epsilon(1e-6));
      CHECK(first.fit(0).line().per_unit == doctest::Approx(c.b).epsilon(1e-6));
      CHECK(!tail.exploring(0));
      CHECK(!fastest.exploring(0));
      CHECK(t.sizes[1] == c.expected(top));
      CHECK(t.explored <= 5);  // the probe, the rung, the largest (two steps where a step holds one), the rung below
      CHECK(f.explored <= 3);  // the probe, the rung, and its first chunk where a step holds one
      CHECK(tail.size(0, share) == c.expected(top));
      CHECK(tail.size(0, share) == ladder.size(0, share));
      CHECK(c.rate(fastest.size(0, share)) * ChunkSizer::kFlat >= c.rate(top));
      CHECK(t.explored < climbed);
    }
  }
}

TEST_CASE("ChunkSizer.OnTheH200CurveWithin90PercentOfTheBestFromTheSecondStep") {
  // The H200's curve is no line: small chunks cost more a sample than large ones, so a line through the first step's
  // chunks (up to a quarter of the share) predicts large chunks slower than they run. Alone, the device runs its
  // share whole from the second step on. With thieves, it runs the line's choice in its second step; where that is
  // the share's largest rung, faster than the line says, it checks the rung below (0.82x of the best at least), and
  // stays on the largest.
  for (std::size_t share : {2048, 4096, 8192, 16384}) {
    for (const ChunkSizer::Choice choice : {ChunkSizer::Choice::kFastest, ChunkSizer::Choice::kSmallestGoodEnough}) {
      const bool alone = choice == ChunkSizer::Choice::kFastest;
      CAPTURE(share);
      CAPTURE(alone);
      ChunkSizer s(1, choice);
      const Driven r = drive(s, &H200Mlp::seconds, share, 16);
      MESSAGE("share " << share << (alone ? std::string(", alone: ") : std::string(", with thieves: ")) << joined(r.sizes) << ", explored " << r.explored);
      CHECK(H200Mlp::rate(r.sizes[1]) >= 0.9 * H200Mlp::best(share));
      for (std::size_t step = 1; step < r.sizes.size(); ++step) {
        CAPTURE(step);
        CHECK(H200Mlp::rate(r.sizes[step]) >= (alone ? 0.9 : 0.8) * H200Mlp::best(share));
      }
      CHECK(!s.exploring(0));
      CHECK(H200Mlp::rate(r.sizes.back()) >= 0.9 * H200Mlp::best(share));
      CHECK(r.explored <= (alone ? 2u : 8u));
      if (alone) CHECK(r.sizes.back() == share);
    }
  }
}

TEST_CASE("ChunkSizer.ADeviceLeftAloneTakesItsFastestRung") {
  // Its thieves gone (devices excluded), a settled device chooses again among the rungs it measured.
  const Curve c{2e-5, 1e-5};
  ChunkSizer s(1);
  explore(s, c, 1024);
  REQUIRE(s.size(0, 1024) == c.expected(1024));
  s.set_choice(ChunkSizer::Choice::kFastest);
  double best = 0;
  for (const auto& [m, rate] : s.curve(0)) best = std::max(best, rate);
  CHECK(c.rate(s.size(0, 1024)) == doctest::Approx(best).epsilon(1e-9));
  CHECK(s.size(0, 1024) > c.expected(1024));
}

TEST_CASE("ChunkSizer.ADeviceTimedByTheStepCountsEveryStep") {
  // A GPU timed by the step, with thieves, climbs from 8 a rung a step (not three: each step measures its rung) to
  // the smallest good-enough one.
  const Curve c{2e-4, 1e-5};
  ChunkSizer s(1, ChunkSizer::Choice::kSmallestGoodEnough, ChunkSizer::Timing::kByStep);
  constexpr std::size_t kShare = 4096;
  std::vector<std::size_t> sizes;
  while (s.exploring(0) && sizes.size() < 40) {
    const std::size_t size = s.size(0, kShare);
    sizes.push_back(size);
    s.observe_step(0, kShare, static_cast<double>(kShare / size) * c.seconds(size));
    s.end_step(0, kShare);
  }
  CHECK(sizes == std::vector<std::size_t>{8, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096});
  CHECK(s.size(0, kShare) == c.expected(kShare));
  // Alone (or static), it runs the largest rung from its first step and keeps it.
  ChunkSizer alone(1, ChunkSizer::Choice::kFastest, ChunkSizer::Timing::kByStep);
  for (int step = 0; step < 2; ++step) {
    alone.observe_step(0, kShare, c.seconds(alone.size(0, kShare)));
    alone.end_step(0, kShare);
  }
  CHECK(!alone.exploring(0));
  CHECK(alone.size(0, kShare) == kShare);
}

TEST_CASE("ChunkSizer.ALineThatDoesNotHoldFallsBackToTheLadder") {
  // Chunk times that grow faster than their samples past 128 (a working set that leaves the cache): the line through
  // the first step's chunks is wrong there, the rung it predicts runs off it, and the ladder finds the best rung.
  const auto seconds = [](std::size_t m) {
    const double x = static_cast<double>(m);
    return 2e-4 + 1e-5 * std::min(x, 128.0) + 4e-5 * std::max(0.0, x - 128.0);
  };
  for (const ChunkSizer::Choice choice : {ChunkSizer::Choice::kFastest, ChunkSizer::Choice::kSmallestGoodEnough}) {
    CAPTURE(static_cast<int>(choice));
    ChunkSizer s(1, choice);
    const Driven r = drive(s, seconds, 4096, 40);
    MESSAGE(joined(r.sizes) << ", explored " << r.explored);
    CHECK(!s.exploring(0));
    const std::size_t m = s.size(0, 4096);
    CHECK(static_cast<double>(m) / seconds(m) >= ChunkSizer::kGoodEnough * 128 / seconds(128));
  }
}

TEST_CASE("ChunkSizer.ARungOffItsLineSendsTheDeviceUpTheLadder") {
  // A clean line a + b n up to 1024 samples (all the first step's chunks), then 4x the cost a sample (a working set
  // that leaves the cache): the line's choice, 2048, runs far off it. The device predicts once more, with that step's
  // chunks in its line, then climbs and descends the ladder from there, and ends on the best rung, 1024.
  const auto seconds = [](std::size_t m) {
    const double x = static_cast<double>(m);
    return 2e-3 + 1e-5 * std::min(x, 1024.0) + 4e-5 * std::max(0.0, x - 1024.0);
  };
  ChunkSizer s(1);
  const Driven r = drive(s, seconds, 4096, 30);
  MESSAGE(joined(r.sizes) << ", explored " << r.explored);
  CHECK(r.sizes[1] == 2048);  // the line's choice: within 95% of its 4096
  CHECK(!s.exploring(0));
  CHECK(s.size(0, 4096) == 1024);
  CHECK(r.explored <= 16);
}

namespace {

// A device whose chunks take a + b m seconds on a timeline of its own, reported by the step (as a GPU's are):
// the runtime's sizer sees only those times, so its choice is exact and independent of the machine's load.
struct TimedDevice final : Device {
  std::size_t index;
  std::function<double(std::size_t)> seconds;  // a chunk's time by its samples
  double step_seconds = 0;
  TimedDevice(std::size_t i, std::function<double(std::size_t)> s) : index(i), seconds(std::move(s)) {}
  std::string name() const override { return "timed" + std::to_string(index); }
  void begin_step(std::uint64_t, std::chrono::steady_clock::time_point) override { step_seconds = 0; }
  ChunkTiming run_chunk(ChunkContext& ctx, const ChunkFunction& fn) override {
    fn(ctx);
    step_seconds += seconds(ctx.samples.size());
    return {};
  }
  std::optional<double> step_device_seconds() const override { return step_seconds; }
};

// Devices of type D (made from an index and a time curve), one per factor, each with the curve times its factor.
template <class D>
struct CurveBackend final : DeviceBackend {
  std::function<double(std::size_t)> seconds;
  std::vector<double> slower{1.0, 1.0};  // each device's times are its factor x the curve's
  explicit CurveBackend(Curve c) : seconds([c](std::size_t m) { return c.seconds(m); }) {}
  CurveBackend(Curve c, std::vector<double> factors) : seconds([c](std::size_t m) { return c.seconds(m); }), slower(std::move(factors)) {}
  CurveBackend(std::function<double(std::size_t)> s, std::vector<double> factors) : seconds(std::move(s)), slower(std::move(factors)) {}
  std::size_t available() const noexcept override { return slower.size(); }
  std::vector<std::unique_ptr<Device>> make_devices(const DeviceSpec&, const RuntimeOptions&) override {
    std::vector<std::unique_ptr<Device>> out;
    for (std::size_t i = 0; i < slower.size(); ++i) {
      out.push_back(std::make_unique<D>(i, [s = seconds, f = slower[i]](std::size_t m) { return f * s(m); }));
    }
    return out;
  }
  std::unique_ptr<Communicator> make_communicator(std::span<Device* const>) override { return std::make_unique<InProcessCommunicator>(); }
};
using TimedBackend = CurveBackend<TimedDevice>;

}  // namespace

TEST_CASE("Runtime.AutoChunkSizeIsEachDevicesBestRungUnderStatic") {
  // Two devices timed by the step (a GPU's way), a + b m a chunk: the runtime sizes each device's chunks within its
  // share and, under the static policy, which has no tail to share, settles on the best rung, then reports
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
  // Timed by the step, a device starts at its share's largest rung, which its fastest choice keeps: it measures no other.
  const auto curve = rt.chunk_curve(0);
  REQUIRE(curve.size() == 1);
  CHECK(curve[0].first == 512);
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
  // Which rung the fast device settles on depends on what it stole while exploring (64 to 1024 here); the slow one's
  // size follows it: the fast one's scaled by their speeds, or the slow one's smallest measured rung when that is
  // already smaller. The speeds are 1/6 apart on these timelines, and compared within 10%: timed by the step, a rung's
  // figure holds whatever else the device ran in its steps (the smaller chunks it stole), and where a loaded host
  // leaves a device without chunks for a step, the two climb their ladders a step apart. Its own good-enough rung
  // would be as large as the fast one's.
  CHECK(fast >= 64);
  CHECK(slow >= 1);
  CHECK(slow <= std::max<std::size_t>(ChunkSizer::kFirstRung, static_cast<std::size_t>(std::lround(1.1 * static_cast<double>(fast) / 6.0))));
}

namespace {

// Devices in host memory whose chunks take a + b n by the clock they report (ChunkTiming::compute_seconds), each as
// the call returns, as a device timed by events would: exact, whatever the machine's load.
struct CallTimedDevice final : Device {
  std::size_t index;
  std::function<double(std::size_t)> seconds;
  CallTimedDevice(std::size_t i, std::function<double(std::size_t)> s) : index(i), seconds(std::move(s)) {}
  std::string name() const override { return "calltimed" + std::to_string(index); }
  ChunkTiming run_chunk(ChunkContext& ctx, const ChunkFunction& fn) override {
    fn(ctx);
    return {.compute_seconds = seconds(ctx.samples.size())};
  }
};

struct CallTimedBackend final : DeviceBackend {
  std::function<double(std::size_t)> seconds;
  std::size_t count;
  CallTimedBackend(std::function<double(std::size_t)> s, std::size_t n) : seconds(std::move(s)), count(n) {}
  std::size_t available() const noexcept override { return count; }
  bool shares_host_memory() const noexcept override { return true; }
  std::vector<std::unique_ptr<Device>> make_devices(const DeviceSpec&, const RuntimeOptions&) override {
    std::vector<std::unique_ptr<Device>> out;
    for (std::size_t i = 0; i < count; ++i) out.push_back(std::make_unique<CallTimedDevice>(i, seconds));
    return out;
  }
  std::unique_ptr<Communicator> make_communicator(std::span<Device* const>) override { return std::make_unique<InProcessCommunicator>(); }
};


// Each step's report from a runtime with one parameter, over `steps` steps of `batch` samples, each of them run.
std::vector<StepReport> run_steps(Runtime& rt, std::size_t batch, int steps) {
  ParameterLayout layout;
  layout.add("p", 1);
  rt.register_parameters(layout, std::vector<float>(1, 0.0f));
  std::vector<std::uint32_t> samples(batch);
  std::iota(samples.begin(), samples.end(), 0u);
  std::vector<StepReport> out;
  for (int step = 0; step < steps; ++step) {
    out.push_back(rt.step(samples, [](ChunkContext& ctx) { ctx.grad[0] += static_cast<float>(ctx.samples.size()); }));
    REQUIRE(out.back().samples == batch);
  }
  return out;
}

// Each step's chunk size on device 0, as run_steps() runs them.
std::vector<std::size_t> sizes_over_steps(Runtime& rt, std::size_t batch, int steps) {
  std::vector<std::size_t> sizes;
  for (const StepReport& r : run_steps(rt, batch, steps)) sizes.push_back(r.devices[0].chunk_samples);
  return sizes;
}

}  // namespace

TEST_CASE("Runtime.AutoChunkSizeOnAnH200RunsEfficientChunksFromTheSecondStep") {
  // A lone device with the H200 MLP's chunk times, each chunk timed as it ends: the first step's chunks tell the
  // fixed cost from the per-sample one, and from the second step on the device runs within 0.9x of its best rung
  // (the share whole: alone, it has no tail to share). The 8-sample rung runs at 0.02x of it.
  const RestoreCudaBackend restore;
  register_device_backend(DeviceKind::kCuda, std::make_shared<CallTimedBackend>(&H200Mlp::seconds, 1));
  Runtime rt({.devices = "cuda:all"});
  constexpr std::size_t kBatch = 4096;
  const std::vector<std::size_t> sizes = sizes_over_steps(rt, kBatch, 8);
  MESSAGE("chunk sizes by step: " << joined(sizes));
  for (std::size_t step = 1; step < sizes.size(); ++step) {
    CAPTURE(step);
    CHECK(H200Mlp::rate(sizes[step]) >= 0.9 * H200Mlp::best(kBatch));
  }
  CHECK(sizes.back() == kBatch);
  const auto curve = rt.chunk_curve(0);
  REQUIRE(!curve.empty());
  CHECK(curve.size() <= 2);  // no ladder climbed from 8 samples
}

namespace {

// A device in its own memory whose calls return before their chunks run and are timed afterwards on its own clock, a
// + b n each, as a GPU's events time them (Device::call_device_times(), read after the chunk phase).
struct EventTimedDevice final : Device {
  std::size_t index;
  std::function<double(std::size_t)> seconds;
  std::vector<DeviceCallTime> times;
  EventTimedDevice(std::size_t i, std::function<double(std::size_t)> s) : index(i), seconds(std::move(s)) {}
  std::string name() const override { return "events" + std::to_string(index); }
  void begin_step(std::uint64_t, std::chrono::steady_clock::time_point) override { times.clear(); }
  ChunkTiming run_chunk(ChunkContext& ctx, const ChunkFunction& fn) override {
    fn(ctx);
    times.push_back(call_time(ctx, seconds(ctx.samples.size())));
    return {};  // what a GPU's launch knows: nothing yet
  }
  bool times_calls() const noexcept override { return true; }
  std::span<const DeviceCallTime> call_device_times() const override { return times; }
  std::optional<double> step_device_seconds() const override {
    double sum = 0;
    for (const DeviceCallTime& t : times) sum += t.seconds;
    return sum;
  }
};

using EventTimedBackend = CurveBackend<EventTimedDevice>;

}  // namespace

namespace {

// A lone device of `backend` with the H200 MLP's chunk times, 4096 samples a step: each step's chunk size, each from
// step `from` on within 0.9x of its best rung, the last the share whole (alone: no tail to share).
std::vector<std::size_t> lone_h200_sizes(std::shared_ptr<DeviceBackend> backend, int steps, std::size_t from) {
  constexpr std::size_t kBatch = 4096;
  register_device_backend(DeviceKind::kCuda, std::move(backend));
  Runtime rt({.devices = "cuda:all"});
  const std::vector<std::size_t> sizes = sizes_over_steps(rt, kBatch, steps);
  MESSAGE("chunk sizes by step: " << joined(sizes));
  for (std::size_t step = from; step < sizes.size(); ++step) {
    CAPTURE(step);
    CHECK(H200Mlp::rate(sizes[step]) >= 0.9 * H200Mlp::best(kBatch));
  }
  CHECK(sizes.back() == kBatch);
  return sizes;
}

}  // namespace

TEST_CASE("Runtime.AutoChunkSizeOnAGpuTimedByEventsFitsItsFirstStep") {
  // The H200 MLP's chunk times on a device that times each call on its own clock after the chunk phase (a GPU's
  // events): its first step probes several sizes and fits a + b n, as a host device's does, and from the second step
  // on it runs within 0.9x of its best rung. Timed only by the step, it could measure nothing but the rung it ran.
  const RestoreCudaBackend restore;
  const auto sizes = lone_h200_sizes(std::make_shared<EventTimedBackend>(&H200Mlp::seconds, std::vector<double>{1.0}), 8, 1);
  CHECK(sizes.front() < 4096);  // the probe: several sizes in the first step
}

TEST_CASE("Device.ACallTimeNamesItsLowestChunk") {
  // A thief's merged call runs its chunks from the highest id down (ChunkContext::chunk first): its time names the
  // lowest and the count, so the runtime finds every chunk it ran.
  ChunkContext ctx;
  const std::vector<ChunkId> merged{7, 6, 5};
  ctx.chunk = 7, ctx.chunks = merged;
  const DeviceCallTime t = Device::call_time(ctx, 0.25);
  CHECK(t.first == 5);
  CHECK(t.chunks == 3);
  CHECK(t.seconds == 0.25);
  ctx.chunk = 9, ctx.chunks = {};
  CHECK(Device::call_time(ctx, 1).first == 9);
  CHECK(Device::call_time(ctx, 1).chunks == 1);
}

TEST_CASE("Runtime.CallCostOfAGpuComesFromItsEventTimes") {
  // Given costs on a device timed by events: each call's device time against the cost it held gives the line a + b
  // cost, exactly (the times are exact here), where the launches' wall times would give a GPU's launch overhead. One
  // device at a time, so that which device runs which call is no matter of the host's timing.
  const Curve c{2e-4, 1e-6};
  for (const double f : {1.0, 2.0}) {
    CAPTURE(f);
    const RestoreCudaBackend restore;
    register_device_backend(DeviceKind::kCuda,
                            std::make_shared<EventTimedBackend>([c](std::size_t m) { return c.seconds(m); }, std::vector<double>{f}));
    Runtime rt({.devices = "cuda:all", .schedule = {.chunk_size = 64}});
    ParameterLayout layout;
    layout.add("p", 1);
    rt.register_parameters(layout, std::vector<float>(1, 0.0f));
    std::vector<std::uint32_t> batch(1000);  // 64s and a shorter last chunk: calls of two costs
    std::iota(batch.begin(), batch.end(), 0u);
    const std::vector<double> cost(batch.size(), 1.0);
    for (int step = 0; step < 6; ++step) {
      const StepReport r = rt.step(batch, [](ChunkContext& ctx) { ctx.grad[0] += static_cast<float>(ctx.samples.size()); }, cost);
      REQUIRE(r.samples == batch.size());
    }
    const Runtime::CallCost k = rt.call_cost(0);
    REQUIRE(k.calls > 0);
    CHECK(k.per_call == doctest::Approx(f * c.a).epsilon(0.02));
    CHECK(k.per_unit == doctest::Approx(f * c.b).epsilon(0.02));
  }
}

TEST_CASE("Runtime.AutoChunkSizeOnAGpuTimedByTheStepStartsAtItsShare") {
  // The same curve on a device whose chunks are timed only by the step (a GPU without per-chunk events): one step
  // cannot tell the fixed cost from the per-sample one, so it starts at its share's largest rung, which, alone (no
  // tail to share, and a GPU's time a call only falls with fewer calls), it keeps.
  const RestoreCudaBackend restore;
  (void)lone_h200_sizes(std::make_shared<TimedBackend>(&H200Mlp::seconds, std::vector<double>{1.0}), 6, 0);
}

TEST_CASE("Runtime.AutoChunkSizeOnASimDeviceWithACallCost") {
  // A simulated device whose calls cost 1 ms each whatever they hold, and 2 us a sample (the fixed cost of 500 samples'
  // time): alone, with 2048 samples a step, it runs its share whole by its third step, where a ladder from 8 samples
  // would spend over 250 ms a step on its first rungs. Its chunks are timed on its own timeline, so the machine's
  // load does not move them.
  RuntimeOptions o{.devices = "sim:1"};
  o.sim.call_seconds = 1e-3;
  o.sim.sample_seconds = 2e-6;
  Runtime rt(o);
  const std::vector<std::size_t> sizes = sizes_over_steps(rt, 2048, 6);
  MESSAGE("chunk sizes by step: " << joined(sizes));
  for (std::size_t step = 2; step < sizes.size(); ++step) {
    CAPTURE(step);
    CHECK(sizes[step] == 2048);
  }
}

TEST_CASE("Runtime.LaunchBoundDevicesRunEfficientChunksInSharesThatEndTogether") {
  // Simulated parts of one GPU as 64,16,16,16 SMs, every call costing 1 ms whatever it holds and a sample 4 us on the
  // fastest (the fixed cost is 250 samples' time there). Once each device's line a + b n is known, the cost model
  // places the shares so that each ends at the same time (the fastest part gets 4/7 of the batch, not its 4/7 of
  // the speed minus its calls), and cuts no chunk below the device's efficient size (the fixed cost at most 5%: 4,750
  // samples on the fastest, 1,188 on the others), a share smaller than that in one call. The chunk table is the
  // plan's, from lines fitted to the devices' own timelines: the machine's load moves none of it.
  RuntimeOptions o{.devices = "sim:1,0.25,0.25,0.25"};
  o.sim.call_seconds = 1e-3;
  o.sim.sample_seconds = 4e-6;
  Runtime rt(o);
  const StepReport r = run_steps(rt, 8192, 8).back();
  // T = a + b_d share_d for all d: shares in proportion to speed here (one fixed cost for all), 4/7 and 1/7 each.
  REQUIRE(r.devices.size() == 4);
  const double fast_share = 8192.0 * 4 / 7, slow_share = 8192.0 / 7;
  MESSAGE("chunks " << r.chunks << "; sizes " << r.devices[0].chunk_samples << " " << r.devices[1].chunk_samples);
  CHECK(r.devices[0].chunk_samples == static_cast<std::size_t>(std::lround(fast_share)));  // one call: under 4,750
  for (std::size_t d = 1; d < 4; ++d) {
    CAPTURE(d);
    CHECK(r.devices[d].chunk_samples >= static_cast<std::size_t>(slow_share) - 1);  // one call each: below 1,188
  }
  CHECK(r.chunks == 4);
  CHECK(rt.chunk_curve(0).size() <= 3);  // no ladder climbed from 8 samples
}

TEST_CASE("Runtime.LaunchBoundSharesFollowADeviceThatSlowsDown") {
  // The same parts; from step 12 the fastest runs at half its speed. Its steps then no longer follow its line, which
  // it forgets; the next line fitted to what it does now gives it its new share, 0.5 / 1.25 of the batch (before,
  // 1 / 1.75), in one call again: its efficient size is now 2,375 samples, and the 902 past it would be a chunk
  // under it. Simulated timelines: the load of the machine moves none of it.
  RuntimeOptions o{.devices = "sim:1,0.25,0.25,0.25"};
  o.sim.call_seconds = 1e-3;
  o.sim.sample_seconds = 4e-6;
  o.sim.speed_factor = [](std::size_t d, std::uint64_t step, double) { return d == 0 && step > 12 ? 0.5 : 1.0; };
  Runtime rt(o);
  const std::vector<StepReport> r = run_steps(rt, 8192, 40);
  // The plan's sizes (its share in one chunk), not the samples it ran: a late worker's chunk may be stolen.
  CHECK(r[11].devices[0].chunk_samples == static_cast<std::size_t>(std::lround(8192.0 / 1.75)));
  std::vector<std::size_t> fast;
  for (const StepReport& s : r) fast.push_back(s.devices[0].chunk_samples);
  MESSAGE("the fastest part's chunk by step: " << joined(fast));
  CHECK(r.back().chunks == 4);
  CHECK(static_cast<double>(r.back().devices[0].chunk_samples) == doctest::Approx(8192.0 * 0.5 / 1.25).epsilon(0.02));
}

TEST_CASE("Runtime.AutoChunkSizeOfALoneDeviceIsItsFastestRung") {
  // One device has no thieves and no tail to share: it runs its fastest rung, as the static split does, not the
  // smallest within 95% of it. A small fixed cost (2 samples' time), so that the two differ by several rungs.
  const RestoreCudaBackend restore;
  const Curve c{2e-5, 1e-5};
  register_device_backend(DeviceKind::kCuda, std::make_shared<CallTimedBackend>([c](std::size_t m) { return c.seconds(m); }, 1));
  Runtime rt({.devices = "cuda:all"});
  const std::vector<std::size_t> sizes = sizes_over_steps(rt, 1024, 30);
  MESSAGE("chunk sizes by step: " << joined(sizes));
  double best = 0;
  for (const auto& [m, rate] : rt.chunk_curve(0)) best = std::max(best, rate);
  CHECK(c.rate(sizes.back()) >= best / ChunkSizer::kFlat);
  CHECK(sizes.back() > c.expected(1024));  // the smallest rung within 95%: what a device with thieves runs
}

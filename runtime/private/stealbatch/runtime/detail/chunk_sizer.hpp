// Each device's chunk size, chosen from its own measured throughput against chunk size (RuntimeOptions::schedule.chunk_size = 0).
#pragma once

#include <stealbatch/runtime/detail/call_fit.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace stealbatch::detail {

// Sizes are rungs of a ladder: 8, 16, 32, ... samples. A chunk of n samples takes about a + b n: a, what a call costs
// whatever it holds (a GPU's launches, an eager framework's dispatch), b, a sample. Where a is large, the small rungs
// are nearly all fixed cost, and a ladder climbed from 8 samples would spend its first steps there.
//
// A device whose chunks are timed each (Timing::kByChunk: host devices, a simulated device's timeline) therefore
// probes in its first step: its share is cut into chunks of several rungs, a few of each (probe_sizes()), and a and b
// are fitted to their times (CallFit). It starts at the rung that line predicts it will choose (see Choice), and runs
// one step there: a rung whose throughput lies within kFitted of the line's confirms it (so does the share's largest
// rung running faster than its line). For the fastest rung, that is the choice. For the smallest good-enough one, the
// share's largest rung is measured too (a line can overrate the large rungs it never saw), then the rungs below the
// choice, down to one that falls short. Where the rung is off its line (a curve that is no line), the device predicts
// once more from all the calls it has seen, then climbs the ladder from there. A device whose first step shows no
// fixed part a > 0 (one size, in a share too small to probe; a flat curve; times that grow faster than their
// samples) climbs from 8.
//
// A device whose chunks run asynchronously and are timed only by the step (Timing::kByStep: a GPU) cannot fit a line
// from one step. Without thieves (Choice::kFastest) it runs the largest rung its share holds from its first step, and
// keeps it: a GPU's time a call only falls with fewer calls. With thieves it climbs from 8, a rung a step: devices
// that steal each other's chunks then run chunks of one size, and a step's time measures its rung.
//
// Climbing, the device moves up a rung once its rung has kMinChunks chunk times (a device timed by the step: once a
// step has run on it), and stops at the first rung that does not fit its share, at the top, or once the curve has
// flattened: three rungs in a row that gain under 2% on the best below them (two can be noise). A rung's first chunk
// is not counted: it pays one-time costs, such as a JIT compiling the kernels for that size, or buffers growing; nor
// is anything of the device's first step, which runs while its threads and pools start (a small chunk can look
// several times faster there, on one thread, than it will): its chunks only feed the line. Where the rung below the
// choice was not measured (a device that started above 8), it is measured too, and so on down to one that falls
// short of the choice's bar: the choice is then the smallest rung that meets it (checking a line's choice, a rung is
// measured by as many chunks as a step holds, up to kMinChunks). After kRefreshSteps steps every curve is measured
// again.
//
//   ChunkSizer sizer(devices);
//   if (sizer.probing(d)) ChunkSizer::probe_sizes(share, sizes);  // the first step's chunks
//   const std::size_t size = sizer.size(d, share);        // else the chunk size to cut device d's share into
//   sizer.observe_chunk(d, samples, seconds);             // each chunk's time on the device that ran it
//   sizer.end_step(d, share);                             // then the next rung, or the choice
class ChunkSizer {
 public:
  static constexpr std::size_t kFirstRung = 8;
  static constexpr std::size_t kRungs = 18;  // 8 .. 2^20 samples, the largest chunk_size
  static constexpr std::size_t kMinChunks = 3, kWindow = 8;
  static constexpr double kGoodEnough = 0.95, kFlat = 1.02;
  static constexpr std::size_t kFlatRungs = 3;
  // A rung measured within this of the line's prediction confirms the line: about the spread of a rung's median
  // under the noise of a shared host, and well inside the 2x per rung of a launch-bound device.
  static constexpr double kFitted = 0.1;
  // A line holds a device's calls while they scatter about it by at most this (CallFit::scatter()), and its steps
  // while they run within this of it: a shared host's noise scatters calls by 10-20% (a Python chunk function on two
  // busy cores: 9-18%), costs that vary by position by 30% and more, and a device that slowed down is off by its
  // slowdown.
  static constexpr double kLineHolds = 0.25;
  static constexpr std::uint64_t kRefreshSteps = 1000;
  static constexpr std::uint64_t kMaxExploreSteps = 48;  // a device whose chunks are always stolen stops exploring
  // Probe steps a device timed by chunk runs at most while its line is not known (fewer than CallFit::kMinCalls of
  // its probe's chunks ran on it: thieves took the rest).
  static constexpr std::size_t kMaxProbeSteps = 3;

  // What a device's exploration ends on: the smallest rung within kGoodEnough of the best (a step's tail, which
  // thieves share, is then short), or the fastest rung (no thieves: a static split or a lone device, where a smaller
  // chunk only costs throughput, and DDP runs a device's share in one call). By a line a + b n, samples/s rise with
  // the rung, so the fastest is the smallest rung within kFlat of the share's largest: no gain a climb would count.
  enum class Choice { kSmallestGoodEnough, kFastest };
  // How the device's chunks are timed: each on its own (observe_chunk()), or only as a whole step (observe_step()).
  enum class Timing { kByChunk, kByStep };

  explicit ChunkSizer(std::size_t devices = 0, Choice choice = Choice::kSmallestGoodEnough, Timing timing = Timing::kByChunk)
      : m_choice(choice), m_timing(timing) {
    reset(devices);
  }
  void reset(std::size_t devices);
  // A device that has settled chooses again among its measured rungs by the new rule (a device set down to one).
  void set_choice(Choice c) noexcept;
  void set_timing(Timing t) noexcept { m_timing = t; }
  void erase(std::size_t device);  // a device left the runtime

  // Whether device d's share is cut by probe_sizes() this step (its first, timed by chunk), not into size()'s chunks.
  bool probing(std::size_t device) const noexcept;
  // A probing device's chunks, in the order its share holds them: k rungs from the first, each 1 + ceil(kMinCalls / k)
  // times in a row (its first chunk pays the size's one-time costs, the rest make CallFit::kMinCalls calls), as many
  // rungs as the share holds, then what is left in one chunk. Empty where the share holds fewer than two rungs so: it
  // is then cut into size()'s chunks.
  static void probe_sizes(std::size_t share, std::vector<std::uint32_t>& out);
  // The chunk size for device d this step, whose share holds `share` samples (at least 1): its rung, or the whole
  // share where the fastest rung is chosen and it is the largest the share holds.
  std::size_t size(std::size_t device, std::size_t share) const noexcept;
  bool exploring(std::size_t device) const noexcept { return m_devices[device].exploring; }
  // A chunk of `samples` that took `seconds` on the device (host devices: the call). Rung-sized chunks measure their
  // rung and the line; others (after the first step) the line alone.
  void observe_chunk(std::size_t device, std::size_t samples, double seconds) noexcept;
  // A whole step of an exploring device whose chunks are timed by the step (a GPU): `samples` in `seconds`.
  void observe_step(std::size_t device, std::size_t samples, double seconds) noexcept;
  // After the step's observations: advances the device's exploration, given its share this step.
  void end_step(std::size_t device, std::size_t share) noexcept;
  // Ends the device's exploration now, choosing among the rungs measured so far (a device that will not run chunks
  // larger than its current rung: a slower one whose chunks are capped by the fastest device's chunk time).
  void stop_exploring(std::size_t device) noexcept;
  // Ends the device's exploration on the smallest rung of at least `samples` (the ladder's top if none): a device whose
  // chunks the cost model keeps at an efficient size runs no rung below it, so none would be measured there.
  void settle_at_least(std::size_t device, std::size_t samples) noexcept;
  // Device a's speed over device b's, at the largest rung both have measured: apart from the rungs' efficiencies,
  // which differ while the ladders are explored. 0 when they have none in common.
  double relative_speed(std::size_t a, std::size_t b) const noexcept;
  // The device's measured samples/s per rung: (rung size, samples/s), rungs with no time left out.
  std::vector<std::pair<std::size_t, double>> curve(std::size_t device) const;
  // The device's call time against its chunk's samples, from its rung-sized chunks (Timing::kByChunk).
  const CallFit& fit(std::size_t device) const noexcept { return m_devices[device].fit; }
  // The device's last line that told a fixed part a > 0 from b > 0 and held its calls' times within kLineHolds ({0, 0}
  // until one did, and again once its calls scatter about it). Kept while its calls no longer tell a from b: a device
  // that runs one size for 128 calls still has the line it was cut by.
  CallFit::Line line(std::size_t device) const noexcept { return m_devices[device].line; }
  // Forgets the device's line and the calls it was fitted to (its time no longer follows it: a device that slowed
  // down); the calls from here on fit the next one.
  void forget_line(std::size_t device) noexcept { m_devices[device].line = {}, m_devices[device].fit.clear(); }

 private:
  struct Rung {
    std::array<double, kWindow> per_sample{};  // seconds per sample of the last kWindow observations
    std::size_t entries = 0;                  // observations written (the window holds the last kWindow)
    std::size_t count = 0;                    // what they count for exploring: a chunk 1, a step kMinChunks
    void add(double seconds_per_sample, std::size_t weight) noexcept;
    bool warm = false;                        // the first chunk of this size was seen (and not counted)
    double first = 0;                         // its seconds per sample
    double samples_per_s() const noexcept;    // from the median of the window; 0 without observations
  };
  // Where a device's exploration stands: checking the rung its line predicted, climbing, or measuring below its
  // choice.
  enum class Phase : std::uint8_t { kVerify, kClimb, kDescend };
  struct State {
    std::array<Rung, kRungs> rungs{};
    CallFit fit;
    std::size_t at = 0;  // the rung being explored, then the chosen one
    bool exploring = true;
    Phase phase = Phase::kClimb;
    bool predicted_again = false;  // kVerify: the line was corrected once already
    double expected = 0;           // kVerify: the line's samples/s at the rung, as predicted
    std::uint64_t steps = 0;
    std::size_t probes = 0;        // probe steps run again: thieves took too many of the chunks to fit a line
    CallFit::Line line;            // line(): the last that told a from b
  };
  static std::size_t rung_size(std::size_t r) noexcept { return kFirstRung << r; }
  static std::size_t top_rung(std::size_t share) noexcept;  // the largest rung that fits the share (0 if none does)
  std::size_t choose(const State& s) const noexcept;
  std::size_t predict(const State& s, std::size_t top) const noexcept;  // the rung the device's line says it will choose
  void start(State& s, std::size_t share) const noexcept;
  bool verify(State& s, std::size_t share) const noexcept;  // true: the step is dealt with (settled, or checking on)
  bool climb(State& s, std::size_t share) const noexcept;   // true: moved up a rung; false: the climb is over
  void descend(State& s) const noexcept;                    // the rung below the choice, or the choice
  static void settle(State& s, std::size_t rung) noexcept { s.exploring = false, s.at = rung; }
  std::vector<State> m_devices;
  Choice m_choice;
  Timing m_timing;
};

}  // namespace stealbatch::detail

// Each device's chunk size, chosen from its own measured throughput against chunk size (RuntimeOptions::schedule.chunk_size = 0).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace stealbatch::detail {

// Sizes are rungs of a ladder: 8, 16, 32, ... samples. A device explores it upward, one rung a step: its share is
// cut into chunks of that rung, and the rung's throughput is what those chunks' times say. It moves up once the
// rung has kMinChunks chunk times (or kMinSteps step times, for a device whose chunks run asynchronously and are
// timed by the step; a device's first chunk of each rung is not counted: it pays one-time costs, such as a JIT
// compiling the kernels for that size, or buffers growing; nor is anything of the device's first step, which runs
// while its threads and pools start: a small chunk can look several times faster there, on one thread, than it
// will), and stops at the first rung that does not fit its share, at the top, or once the curve has flattened:
// three rungs in a row that gain under 2% on the best below them (two can be noise). Its chunk is then the smallest rung
// whose throughput is within kGoodEnough of the best rung's: large enough for the device's kernels, and as small
// as that allows, for the step's tail (or, without thieves, the best rung: Choice). After kRefreshSteps steps every
// curve is measured again.
//
//   ChunkSizer sizer(devices);
//   const std::size_t size = sizer.size(d, share);        // the chunk size to cut device d's share into
//   sizer.observe_chunk(d, samples, seconds);             // each chunk's time on the device that ran it
//   sizer.end_step(d, share);                             // then the next rung, or the choice
class ChunkSizer {
 public:
  static constexpr std::size_t kFirstRung = 8;
  static constexpr std::size_t kRungs = 18;  // 8 .. 2^20 samples, the largest chunk_size
  static constexpr std::size_t kMinChunks = 3, kMinSteps = 2, kWindow = 8;
  static constexpr double kGoodEnough = 0.95, kFlat = 1.02;
  static constexpr std::size_t kFlatRungs = 3;
  static constexpr std::uint64_t kRefreshSteps = 1000;
  static constexpr std::uint64_t kMaxExploreSteps = 48;  // a device whose chunks are always stolen stops exploring

  // What a device's exploration ends on: the smallest rung within kGoodEnough of the best (a step's tail, which
  // thieves share, is then short), or the best rung itself (no thieves: a static split, where a smaller chunk only
  // costs throughput, and DDP runs a device's share in one call).
  enum class Choice { kSmallestGoodEnough, kFastest };

  explicit ChunkSizer(std::size_t devices = 0, Choice choice = Choice::kSmallestGoodEnough) : m_choice(choice) { reset(devices); }
  void reset(std::size_t devices);
  void set_choice(Choice c) noexcept { m_choice = c; }
  void erase(std::size_t device);  // a device left the runtime

  // The chunk size for device d this step, whose share holds `share` samples (at least 1).
  std::size_t size(std::size_t device, std::size_t share) const noexcept;
  bool exploring(std::size_t device) const noexcept { return m_devices[device].exploring; }
  // A chunk of `samples` that took `seconds` on the device (host devices: the call). Only rung-sized chunks count.
  void observe_chunk(std::size_t device, std::size_t samples, double seconds) noexcept;
  // A whole step of an exploring device whose chunks are timed by the step (a GPU): `samples` in `seconds`.
  void observe_step(std::size_t device, std::size_t samples, double seconds) noexcept;
  // After the step's observations: advances the device's exploration, given its share this step.
  void end_step(std::size_t device, std::size_t share) noexcept;
  // Ends the device's exploration now, choosing among the rungs measured so far (a device that will not run chunks
  // larger than its current rung: a slower one whose chunks are capped by the fastest device's chunk time).
  void stop_exploring(std::size_t device) noexcept;
  // Device a's speed over device b's, at the largest rung both have measured: apart from the rungs' efficiencies,
  // which differ while the ladders are explored. 0 when they have none in common.
  double relative_speed(std::size_t a, std::size_t b) const noexcept;
  // The device's measured samples/s per rung: (rung size, samples/s), rungs with no time left out.
  std::vector<std::pair<std::size_t, double>> curve(std::size_t device) const;

 private:
  struct Rung {
    std::array<double, kWindow> per_sample{};  // seconds per sample of the last kWindow observations
    std::size_t entries = 0;                  // observations written (the window holds the last kWindow)
    std::size_t count = 0;                    // what they count for exploring: a chunk 1, a step more
    void add(double seconds_per_sample, std::size_t weight) noexcept;
    bool warm = false;                        // the first chunk of this size was seen (and not counted)
    double samples_per_s() const noexcept;    // from the median of the window; 0 without observations
  };
  struct State {
    std::array<Rung, kRungs> rungs{};
    std::size_t at = 0;  // the rung being explored, then the chosen one
    bool exploring = true;
    std::uint64_t steps = 0;
  };
  static std::size_t rung_size(std::size_t r) noexcept { return kFirstRung << r; }
  std::size_t choose(const State& s) const noexcept;
  std::vector<State> m_devices;
  Choice m_choice;
};

}  // namespace stealbatch::detail

// A step's types: its plan, its chunk table, what its chunk phase and its reduction leave for the report. Shared by the
// step's phases (run_step.cpp and the files it names) and the parts of the runtime that learn from a step.
#pragma once

#include <stealbatch/runtime/detail/call_fit.hpp>

#include <stealbatch/runtime/cluster.hpp>
#include <stealbatch/runtime/telemetry.hpp>
#include <stealbatch/scheduler/scheduler.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace stealbatch {

using Clock = std::chrono::steady_clock;

inline double seconds(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }
// What turns a step's gradient sum into its mean, on every device kind: 1 / the step's sample count, divided in double
// from the exact count and then rounded to float (1.0f / float(samples) would round a count past 2^24 first; up to
// it the two give the same bits: a quotient of floats rounded to double and then to float is rounded correctly, as
// double has at least 2 x 24 + 2 bits).
inline float mean_scale(std::size_t samples) noexcept { return static_cast<float>(1.0 / static_cast<double>(samples)); }

// The watchdog's mark for a device busy in the reduction or the update rather than in a chunk.
inline constexpr ChunkId kReductionPhase = ~ChunkId{0};
// A chunk's home device when that device was lost during the step (the chunk counts as moved wherever it ran).
inline constexpr std::uint32_t kHomeLost = ~std::uint32_t{0};

// Appends `value` to a window of the last `size` (>= 1) values, dropping the oldest.
inline void push_window(std::vector<double>& window, double value, std::size_t size) {
  if (window.size() >= size) window.erase(window.begin(), window.end() - static_cast<std::ptrdiff_t>(size - 1));
  window.push_back(value);
}

struct ChunkSpan {
  std::uint32_t begin;
  std::uint32_t size;
};

// A step across ranks: what every rank computes alike from the same inputs (the step's tag, the ranks' speeds, each
// rank's share of the global chunk ids), and this rank's victims. Empty in one process.
struct RankShares {
  std::uint16_t tag = 0;                // 1 to 65535, from the step count: never a fresh share word's 0
  std::size_t me = 0;                   // this rank
  std::vector<double> speed;            // each rank's speed in the plan's cost units per second: samples/s, or with given
                                        // costs mean-cost samples of this batch per second (equal placeholders until
                                        // every rank is measured)
  bool measured = false;
  std::vector<double> chunk;            // each rank's full chunk, in the plan's cost units
  std::vector<double> least;            // automatic sizes: each rank's smallest chunk (its efficient size; 0: none)
  std::vector<ChunkRange> share;        // each rank's chunk ids
  std::vector<double> before;           // the cost of chunks [0, c): what a share word holds, from two reads
  std::vector<int> victims;             // the other ranks of this node first, then the rest, each list starting after this rank
  std::size_t node_victims = 0;         // how many of victims are on this node
  std::size_t probes = 0;               // how many of the other nodes' ranks each call reads (all: victims.size() - node_victims)
  bool active() const noexcept { return !share.empty(); }
  detail::ShareWord word_of(std::size_t r) const noexcept {
    return {tag, static_cast<std::uint32_t>(share[r].begin), static_cast<std::uint32_t>(share[r].end)};
  }
};

// How the step's samples are divided: equally (or by given weights), by measured samples/s, or by cost: the step's
// given sample costs (GivenCosts), or learnt batch-position ones (detail::CostProfile).
enum class Placement { kEqualOrGiven, kBySpeed, kByCost };
// How shares are cut into chunks: chunk_size everywhere (the last may hold fewer); each device's chunk from its
// measured curve (chunk_size = 0, detail::ChunkSizer); chunks sized to each device's speed with a share's end cut
// finer (stealing, 2+ devices); across ranks, each rank's share cut to its speed (cluster_step.cpp); or each device's
// packed share (PlacementPolicy::kPacked) cut to the cost budget; or in deterministic mode cells that no device
// decides, each device's share whole cells (across ranks, kRankShares cuts cells too).
enum class Cutting { kFixed, kSized, kBySpeed, kRankShares, kPacked, kCells };

// How a step is placed: what is known of the devices and which rules apply (planner.cpp).
struct StepPlan {
  std::vector<double> speeds;  // samples/s per device; empty until measured
  std::vector<double> rate;    // each device's speed in cost units per second (samples/s, or the profile's speeds)
  // kSized on 2+ devices placed by measure: each device's call line a_d + b_d n (seconds, n samples), where every
  // device's is known; the shares, chunk sizes and end game then follow it (cut_sized(), set_endgame()).
  std::vector<detail::CallFit::Line> lines;
  std::span<const double> position_cost;  // kByCost: each batch position's cost (read before the chunk phase only)
  double cost_chunk = 0;       // given costs: a full chunk's cost, in the units of position_cost (mean 1 a sample)
  bool known = false;          // every device has a measured speed
  Placement placement = Placement::kEqualOrGiven;
  Cutting cutting = Cutting::kFixed;
  bool finer_ends = false;     // a share's end cut finer (kSized with stealing on 2+ measured devices)
  bool learn_costs = false;    // the cost profile learns from this step
  bool watch_speed = false;    // the end game weighs a device at what its chunks take now (set_live_factor)
  double outside_rate = 0;     // across ranks: the other ranks' devices, in this rank's full chunks per second
  RankShares ranks;            // across ranks: the shares of the step's global chunk ids
  bool by_cost() const noexcept { return placement == Placement::kByCost; }
  bool sized() const noexcept { return cutting == Cutting::kSized; }
  // A chunk of the rank's own share (across ranks, any of its devices may have claimed it): it tells the device that
  // ran it its speed, as a device's own chunks do in one process.
  bool in_rank_share(ChunkId c) const noexcept {
    return ranks.active() && c >= ranks.share[ranks.me].begin && c < ranks.share[ranks.me].end;
  }
};

// The step's chunks and where they were placed and ran (planner.cpp fills the first part; the chunk phase the
// second).
struct ChunkTable {
  std::vector<ChunkSpan> spans;          // chunk c covers samples [spans[c].begin, spans[c].begin + spans[c].size)
  std::vector<ChunkRange> ranges;        // each device's placed chunks
  std::vector<double> chunk_cost;        // each chunk's cost in the units of StepPlan::rate
  std::vector<double> own_cost;          // each device's own chunk, in cost units (samples when flat)
  std::vector<std::size_t> own_size;     // each device's own chunk, in samples
  std::vector<std::uint32_t> share_len;  // each device's share, in samples (sized)
  double full_chunk = 0;                 // a full chunk in the plan's cost units (samples when flat): what a stolen
                                         // chunk is at most

  std::vector<std::uint32_t> home;      // where each chunk was placed (kHomeLost once its device was lost)
  std::vector<std::uint32_t> ran_on;    // which device ran it
  std::vector<std::uint8_t> runs;       // how many times it ran: the exactly-once check, chunk by chunk
  std::vector<float> stolen_ratio;      // watch_speed: a stolen chunk's time over what its thief's speed predicts
  std::vector<double> took_s;           // learn_costs: its time on its device
  std::vector<double> compute_s;        // sized, or across ranks: its compute time where the device knows it, else its time
  std::vector<double> given_cost;       // given costs: its samples' cost, in the trainer's units
  // Given costs on host devices: each device's calls, (given cost, seconds); written by that device's worker only.
  std::vector<std::vector<std::pair<double, double>>> calls;
  std::size_t size() const noexcept { return spans.size(); }
  // Device `dead` was lost mid-step: the tables re-indexed to the devices that remain, and what it ran or held marked
  // as not run. Returns the chunks nobody has run now, in id order.
  std::vector<ChunkId> drop_device(std::size_t dead);
};

// What the chunk phase left for the report.
struct ChunkPhase {
  StepStats stats;
  std::vector<std::string> excluded;  // devices lost and dropped this step
  std::uint64_t rerun = 0;            // chunks re-run on the survivors
  Clock::time_point start, end;
  // Across ranks: a failure is carried to every rank by the reduction (and rethrown there), not thrown here; the
  // chunks taken from other ranks' shares and the steals that took them; the last call for work that found none.
  std::exception_ptr failure;
  std::string failure_text;
  std::uint64_t remote_chunks = 0, remote_steals = 0;
  double leave_s = 0;
};

// Deterministic mode's cell: chunk_size samples, or with 0 a function of the batch alone (planner.cpp), so that every
// device count and every rank cuts the same grid.
std::size_t cell_size(std::size_t batch, std::size_t chunk_size) noexcept;

// Tallies per device that travel with the reduction across ranks: compute seconds, chunks run, chunks stolen,
// samples, chunk size, its kind (0 cpu, 1 sim, 2 cuda: its name), and the given cost it ran.
inline constexpr std::size_t kTallyDeviceFields = 7;

// Automatic chunk sizes (chunk_size = 0) where a call has a fixed cost a beside b per sample: no chunk below the
// device's efficient size, where a is at most this share of the call's time (planner.cpp, cluster_step.cpp).
inline constexpr double kFixedShareAtMost = 0.05;

// What crosses the ranks with the reduction. The gradient: this rank's sum of its host devices' gradients, then the
// job's (float, or bfloat16 on the wire; empty on GPUs, whose own collective sums it). Beside it, in doubles, so that
// a count is exact to 2^53 whatever the batch: every rank's speeds (samples/s, and given cost per second), failure
// flag, loss sum and efficient chunk size, every chunk's run count and every device's tallies; each rank writes its own entries and leaves
// the others 0, so their sum is a gather. Empty in one process.
//
// Deterministic mode: the gradient travels in `exact` instead (int64 fixed point, summed exactly, see ExactSum), and
// after it every rank's largest exponent of each tensor (a gather too); `count` is then 0.
struct RankTally {
  std::size_t count = 0, ranks = 0, chunks = 0, devices = 0;
  std::vector<float> gradient;
  std::vector<double> tallies;
  std::size_t exact_count = 0, tensors = 0;
  std::vector<std::int64_t> exact;
  std::vector<float> exact_float;  // the job's sum in float, for the update
  RankTally() = default;
  RankTally(std::size_t c, std::size_t r, std::size_t k, std::size_t d)
      : count(c), ranks(r), chunks(k), devices(d), gradient(c, 0.0f), tallies(5 * r + k + kTallyDeviceFields * d, 0.0) {}
  // Deterministic mode: the int64 part, `c` parameters and `t` tensors.
  void use_exact(std::size_t c, std::size_t t) { exact_count = c, tensors = t, exact.assign(c + ranks * t, 0); }
  std::int64_t* exact_grad() { return exact.data(); }
  std::int64_t* exponents(std::size_t rank) { return exact.data() + exact_count + rank * tensors; }
  float* grad() { return gradient.data(); }
  double* speed() { return tallies.data(); }
  double* cost_speed() { return speed() + ranks; }  // given cost per second, in mean-cost samples; 0 without costs
  double* failed() { return cost_speed() + ranks; }
  double* loss() { return failed() + ranks; }
  double* efficient() { return loss() + ranks; }  // the rank's efficient chunk in samples (ClusterState::rank_efficient)
  double* runs() { return efficient() + ranks; }
  double* device(std::size_t d) { return runs() + chunks + kTallyDeviceFields * d; }
};

// What the reduction phase left for the report: each device's counters in it (within the process, and across ranks
// the update from the job's sum after it), this process's device reports, the sum's tallies across ranks, and when
// it ended.
struct Reduced {
  StepStats within, applied;
  std::vector<DeviceReport> local;
  RankTally tally;
  Clock::time_point end;
};

// What the reduction phase leaves: the sum in every device's buffer (kSum); or, on host devices only, fused into
// that phase slice by slice with the buffers zeroed after, the optimizer update of the shared parameters
// (kUpdate) or the mean gradient in mean_next (kMean).
enum class Reduce { kSum, kUpdate, kMean };

}  // namespace stealbatch

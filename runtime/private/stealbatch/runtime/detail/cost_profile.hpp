// Costs that belong to batch positions, told apart from the devices' speeds.
//
// Placement by samples/s assumes every sample costs the same. When the cost depends on where a sample sits in the
// batch (a loader that builds each batch from several sources in fixed proportions, or sorts by length), a device
// whose share holds the costly part measures slow, the next step gives it fewer samples and its costly part to
// someone else, and the placement chases its own tail. This model fits, from the chunk times of the last steps,
//   time of a chunk on device d = (sum of its positions' costs) / speed of d,
// with the costs per position and the speeds per device both unknown. Speeds come from positions that ran on one
// device in one step and on another in a later one (the placement moves, thieves take the ends of shares): the
// ratio of their times per sample is the ratio of the devices' speeds. Over a graph of such pairs the log speeds
// are a least-squares fit (a Laplacian system, solved directly). Costs are then each position's recent times
// times the speed of the device that ran it, mean 1 over the batch.
//
// The runtime places by it only when it earns it: before learning from a step, both models predict that step's
// chunk times (out of sample), and the profile is used for the next placement only if its mean squared log error
// is under half that of samples/s, and samples/s was off by more than 10% (RMS). (The runtime learns from step k
// while step k + 1 runs, so what step k taught places step k + 2.) With equal sample costs (seed-slow,
// hetero) samples/s is exact and stays; with costs drawn afresh per step (varcost) a position's past says nothing
// and samples/s stays too.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace stealbatch::detail {

class CostProfile {
 public:
  // The largest device count it models (a dense n x n system, solved on the caller's thread when it is in use);
  // above it, placement is by samples/s.
  static constexpr std::size_t kMaxDevices = 64;

  struct ChunkTime {
    std::uint32_t begin = 0;   // first batch position
    std::uint32_t size = 0;    // samples
    std::uint32_t device = 0;  // where it ran
    double seconds = 0;        // its time on that device (<= 0: unknown, ignored)
  };

  // Learns from one step. flat_speeds: the samples/s per device the step was placed with (empty: none yet).
  void observe(std::size_t batch, std::size_t devices, std::span<const ChunkTime> chunks, std::span<const double> flat_speeds);
  // Whether the next step, of `batch` samples on `devices` devices, should be placed by position costs.
  bool active(std::size_t batch, std::size_t devices) const noexcept;
  // Relative cost per batch position (mean 1), and each device's speed in those units per second.
  std::span<const double> costs() const noexcept { return m_cost; }
  std::span<const double> speeds() const noexcept { return m_speed; }
  // The last step's out-of-sample mean squared log errors of the chunk times (negative: not measured).
  double error_by_position() const noexcept { return m_err_profile; }
  double error_by_samples() const noexcept { return m_err_flat; }
  void reset();

 private:
  // The phases of observe(): how well each model predicted this step (1), the pairs of positions run on two devices
  // (2), the devices' log speeds from the pairs (3), each position's cost (4). The fits return false when they fail.
  bool valid(const ChunkTime& c, std::size_t batch) const noexcept;
  void score_models(std::size_t batch, std::span<const ChunkTime> chunks, std::span<const double> flat_speeds);
  void add_pairs(std::size_t batch, std::span<const ChunkTime> chunks);
  bool fit_speeds(bool& connected);
  bool fit_costs(std::size_t batch, bool& unseen);
  static constexpr std::size_t kRing = 4;  // steps whose chunks are kept: at most kRing observations of a position
  std::size_t m_batch = 0, m_devices = 0;
  // The chunks of the last kRing steps (valid ones, sorted by position): positions [begin, end), the device, and
  // its seconds per sample (and their log).
  struct Seen {
    std::uint32_t begin, end, device;
    double tau, log_tau;
  };
  std::array<std::vector<Seen>, kRing> m_ring;
  std::size_t m_ring_size = 0, m_ring_next = 0;
  // n x n, row d: pairs seen of d with each other device, and their summed log speed differences (d's minus the other's)
  std::vector<double> m_pair_weight, m_pair_sum;
  std::vector<double> m_log_speed;
  std::vector<double> m_cost, m_speed;
  double m_err_profile = -1, m_err_flat = -1;
  bool m_active = false;
};

// Splits positions [0, costs.size()) into contiguous ranges whose costs are in proportion to `weights` (each
// boundary at the position nearest its share of the cumulative cost). Weights: finite, >= 0, not all 0.
std::vector<std::pair<std::uint32_t, std::uint32_t>> split_by_cost(std::span<const double> costs, std::span<const double> weights);

// The end of a share is cut finer: full chunks while more than kTailChunks chunks' worth is left, then each
// chunk a kTailChunks-th of what is left, down to the floor (the factoring of guided self-scheduling). Thieves take
// from the end of a share, so the step ends on small chunks wherever its last work lies. Six was the best of 2, 4, 6
// and 8 on stealbench's varcost from 4 to 32 devices; more cuts cost per-chunk work (perf/README.md).
inline constexpr double kTailChunks = 6;

// Cuts one device's share, positions [begin, end), into chunks of `target` cost, the end as kTailChunks says,
// each chunk ending at the position nearest its cost. Empty `costs`: every position costs 1, and a chunk holds
// whole samples (a kTailChunks-th rounded up). Appends each chunk's size. With `hard_floor`, no chunk costs less than
// the floor unless the whole share does: a piece that would leave less than the floor after it takes the rest (the
// cost model's efficient size, below which a chunk's fixed cost is more than its share).
void cut_share(std::uint32_t begin, std::uint32_t end, double target, double floor, std::span<const double> costs,
               std::vector<std::uint32_t>& sizes, bool hard_floor = false);

}  // namespace stealbatch::detail

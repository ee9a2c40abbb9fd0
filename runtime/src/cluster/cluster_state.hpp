// This rank's part of a job across ranks (RuntimeOptions::cluster): its state, and the step's phases that are the
// cluster's own (cluster_step.cpp): joining the job, the step's agreement and the progress word, the ranks' shares,
// the chunk phase from the share words, the tally's collectives, and the watch that ends the job when a rank stops
// making progress. The state: the cluster, each rank's device count and this rank's first device's global index, each
// rank's measured samples/s over the last steps and, of steps with given sample costs, its cost per second in the
// trainer's units (the same on every rank: gathered with the reduction), the steps run across the ranks (every rank
// counts the same, failed ones too: the share words' tag), this rank's progress word, for the watch, the last progress
// word seen of each rank and since when, and each rank's efficient chunk size. Empty (false) in one process.
//
// What every rank holds alike: rank_devices, the histories and rank_efficient, which only the collectives of join() and
// sum() write, with the same values on every rank; and steps, which plan() advances alike on every rank (and
// load_checkpoint restores). The rest is this rank's own.
#pragma once

#include "cost/given_costs.hpp"
#include "devices/device_set.hpp"
#include "reduction/exact_sum.hpp"
#include "step/step_types.hpp"

#include <stealbatch/runtime/cluster.hpp>
#include <stealbatch/runtime/detail/call_fit.hpp>
#include <stealbatch/runtime/detail/heartbeat.hpp>
#include <stealbatch/scheduler/scheduler.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

namespace stealbatch {

// The runtime's parts a step across ranks reads and writes.
struct ClusterParts {
  const RuntimeOptions& options;
  const DeviceSet& dev;
  const GivenCosts& costs;
  ExactSum& exact;                          // deterministic mode: the fixed-point sum crosses the ranks
  const Clock::time_point& epoch;           // this rank's clock
  const std::uint64_t& steps;               // steps completed (error messages)
};

class ClusterState {
 public:
  explicit ClusterState(ClusterParts parts) : m_p(parts) {}

  // This rank joins `job` (every rank's device count, the clocks' offsets); the rank's part of a job-wide slowdown and
  // its threads per device into `host`, and cuda:local resolved in `spec`.
  void join(std::shared_ptr<Cluster> job, DeviceSpec& spec, HostOptions& host);
  // Before the step's first collective: every rank at the same step, with the same batch, costs and learning rate.
  void begin_step(std::span<const std::uint32_t> samples, std::span<const double> cost, Reduce reduce_to);
  // The ranks' speeds, shares' chunk sizes, the step's tag, the victims (StepPlan::ranks).
  void plan(std::size_t batch, StepPlan& plan);
  // The chunk phase from the ranks' share words, claimed a few chunks at a time and stolen across ranks: `sched`'s
  // workers ask for chunks, and each one they get runs as `run`.
  ChunkPhase run_from_shares(ChunkTable& t, const StepPlan& plan, Clock::time_point step_start, Scheduler& sched, ChunkFn run);
  // The tally across ranks (the reduction's AcrossRanks calls it), with the step's watch while waiting; a failure
  // anywhere rethrown everywhere, exactly-once checked over the job, the ranks' speeds learnt. False: deterministic
  // mode's verdict is to run the step again.
  bool sum(const ChunkTable& t, const ChunkPhase& phase, const std::vector<DeviceReport>& local, RankTally& tally);
  // Every rank's devices in the report, this rank's from `local`.
  void add_devices(StepReport& rep, RankTally& tally, std::vector<DeviceReport> local) const;
  // Publishes this rank's progress and where it is; ends the job when another rank has stopped making progress.
  void watch();

  std::shared_ptr<Cluster> job;
  std::vector<std::size_t> rank_devices;
  std::size_t first_device = 0;
  std::vector<std::vector<double>> rank_speed_history;
  std::vector<std::vector<double>> rank_cost_history;  // in the trainer's cost units per second
  std::uint64_t steps = 0;        // steps begun across the ranks
  std::uint64_t step_now = 0;     // the step this rank is in, or last was in (1, 2, ...): the progress word's high half
  std::uint64_t progress = 0;     // this rank's progress word's low half (bumped by the watch)
  std::int64_t clock_offset_ns = 0;  // add to this rank's times (since its epoch) to put them on rank 0's timeline
  std::vector<detail::StillWord> peers_seen;  // each rank's progress word, as the step's watch last read it
  std::vector<int> watched;                   // the ranks whose progress the step's watch reads (detail::watched_ranks)
  std::unique_ptr<detail::Heartbeat> heartbeat;  // this rank's pulse and the watch on the others'
  // Automatic chunk sizes: this rank's chunk times against their samples, and each rank's efficient chunk (the
  // smallest whose fixed part is at most kFixedShareAtMost of its time; 0 until known), the same on every rank
  // (gathered with the reduction).
  detail::CallFit chunk_fit;
  std::vector<double> rank_efficient;

  explicit operator bool() const noexcept { return job != nullptr; }
  Cluster* operator->() const noexcept { return job.get(); }
  Cluster& operator*() const noexcept { return *job; }
  std::size_t total_devices() const noexcept { return std::accumulate(rank_devices.begin(), rank_devices.end(), std::size_t{0}); }

 private:
  void publish_progress();  // this rank's progress word: the step it is in, and one more beat
  // sum(): this rank's entries of the tally; what every rank concludes from the job's.
  void fill_tally(const ChunkTable& t, const ChunkPhase& phase, const std::vector<DeviceReport>& local, RankTally& tally);
  bool conclude(const ChunkPhase& phase, RankTally& tally);

  ClusterParts m_p;
};

}  // namespace stealbatch

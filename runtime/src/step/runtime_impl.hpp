// The Runtime's state, and the phases of a step; each phase lives in the source file named beside it. The state is
// a few owned parts (device_set.hpp, speed_model.hpp, shared_parameters.hpp, cluster_state.hpp) and the step's own;
// the step's types are in step_types.hpp.
#pragma once

#include "cluster/cluster_state.hpp"
#include "cost/given_costs.hpp"
#include "cost/speed_model.hpp"
#include "devices/device_set.hpp"
#include "parameters/shared_parameters.hpp"
#include "reduction/exact_sum.hpp"
#include "step/planner.hpp"
#include "step/step_types.hpp"

#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/runtime/testing.hpp>
#include <stealbatch/scheduler/scheduler.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace stealbatch {

class Reduction;

struct Runtime::Impl {
  explicit Impl(RuntimeOptions options);
  ~Impl();

  // One step, for one process and across ranks alike: plan, cut and place the chunks, run them, reduce, report
  // (run_step.cpp). Across ranks, where the devices get their chunks (the ranks' share words) and how the sum crosses
  // processes (the tally) are cluster_step.cpp's; every other phase is the same code.
  StepReport run_step(std::span<const std::uint32_t> samples, const ChunkFunction& fn, Reduce reduce_to, std::span<const double> cost);
  // run_chunks.cpp
  void begin_chunk_phase(const ChunkTable& t, Clock::time_point step_start);
  // The chunk phase, from the step's chunk source: each device's own deque, placed per device (one process, with
  // recovery from a lost device), or the ranks' share words, claimed a few chunks at a time (run_from_shares()).
  ChunkPhase run_chunk_phase(std::span<const std::uint32_t> samples, const ChunkFunction& fn, ChunkTable& t, StepPlan& plan,
                             Clock::time_point step_start);
  void run_one(std::size_t w, ChunkId c, std::span<const std::uint32_t> samples, const ChunkFunction& fn, ChunkTable& t, const StepPlan& plan);
  // One call of the chunk function over `chunks`: one chunk, or several contiguous ones a thief stole together
  // (descending, as mergeable() chose them), with every chunk's bookkeeping.
  void run_call(std::size_t w, std::span<const ChunkId> chunks, std::span<const std::uint32_t> samples, const ChunkFunction& fn, ChunkTable& t,
                const StepPlan& plan);
  ChunkTiming run_guarded(std::size_t w, std::span<const ChunkId> chunks, ChunkContext& ctx, const ChunkFunction& fn);  // faults, and errors named
  void record_call(std::size_t w, std::span<const ChunkId> chunks, const ChunkTiming& timing, Clock::time_point t0, ChunkTable& t, const StepPlan& plan);
  void take_call_times(ChunkTable& t);
  void watch_live_speed(std::size_t w, std::span<const ChunkId> chunks, double ratio, double took, ChunkTable& t, const StepPlan& plan);
  // How many of `more` (stolen after `first`, in the victim's order) run with it in one call on device w: those that
  // continue its span downward, up to w's own chunk size and `largest` (what the devices reserved for).
  std::size_t mergeable(std::size_t w, ChunkId first, std::span<const ChunkId> more, const ChunkTable& t, std::size_t largest) const noexcept;
  ChunkPhase run_with_recovery(std::span<const std::uint32_t> samples, const ChunkFunction& fn, ChunkTable& t, StepPlan& plan,
                               Clock::time_point step_start);
  void recover_lost_device(std::size_t dead, ChunkTable& t, StepPlan& plan, ChunkPhase& phase, const ChunkFn& run);
  void exclude_device(std::size_t position);
  // step_report.cpp
  std::vector<DeviceReport> device_reports(const ChunkTable& t, const ChunkPhase& phase);
  StepReport build_report(std::size_t batch, const ChunkTable& t, const StepPlan& plan, ChunkPhase& phase, std::vector<DeviceReport> local,
                          Reduced& reduced);
  // cluster_step.cpp: this rank's part of a job across ranks (options.cluster.job)
  void join_cluster(DeviceSpec& spec);
  void begin_rank_step(std::span<const std::uint32_t> samples, std::span<const double> cost, Reduce reduce_to);  // the step's agreement, and the progress word
  void plan_ranks(std::size_t batch, StepPlan& plan);                    // the ranks' speeds, the step's tag, the victims
  ChunkPhase run_from_shares(std::span<const std::uint32_t> samples, const ChunkFunction& fn, ChunkTable& t, StepPlan& plan,
                             Clock::time_point step_start);
  // The tally across ranks (the reduction's AcrossRanks calls it), with the step's watch while waiting; a failure
  // anywhere rethrown everywhere, exactly-once checked over the job, the ranks' speeds learnt. False: deterministic mode's verdict is to run the step again.
  bool sum_across_ranks(const ChunkTable& t, const ChunkPhase& phase, const std::vector<DeviceReport>& local, RankTally& tally);
  void add_rank_devices(StepReport& rep, RankTally& tally, std::vector<DeviceReport> local);
  void publish_progress();  // this rank's progress word: the step it is in, and one more beat
  void watch_cluster();     // publishes this rank's progress and where it is; ends the job when another rank has stopped making progress
  // runtime.cpp: what step() and compute_gradient() do after the step's reduction (reduction/reduction.hpp)
  void switch_shared_params(StepReport& rep);
  void update_replicas(StepReport& rep, std::size_t batch);
  void take_mean_gradient(std::size_t batch);
  StepReport finish_step(StepReport rep, Clock::time_point t_start);
  // runtime.cpp
  void make_communicator();
  void make_scheduler();
  std::exception_ptr check_stalls();

  // The parts, each with its own invariants (their headers); what is left here is the step's own state.
  RuntimeOptions options;
  DeviceSet dev;              // the devices, their replicas' tallies, ids, and the devices lost
  SpeedModel speed;           // what the steps taught of the devices' speeds and the positions' costs
  GivenCosts costs;           // the step's sample costs, as the trainer gave them (empty: none)
  SharedParameters shared;    // host devices: the one copy of the parameters and the optimizer
  ClusterState cluster;       // across ranks: this rank's part of the job (false in one process)
  ExactSum exact;             // deterministic mode: the fixed-point sum (false otherwise)
  StepPlanner planner;        // the step's plan, chunk table and end game, from the parts above (planner.hpp)
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Reduction> reduction;  // the step's sum and what follows from it (reduction/reduction.hpp)
  std::unique_ptr<TraceWriter> trace;
  ParameterLayout layout;
  std::vector<float> mean_grad;
  std::vector<float> mean_next;  // host devices: the mean being written in the reduction phase
  Clock::time_point epoch;
  std::uint64_t steps = 0;
  bool grads_dirty = false;
  bool lr_pending = false;      // set_learning_rate() ran since the last update: the replicas take options.optimizer.lr
  testing::FaultInjector inject_fault;  // tests and the soak only (testing::inject_faults)
  std::unique_ptr<Scheduler> sched;  // last: its workers stop before the devices and replicas go
};

}  // namespace stealbatch

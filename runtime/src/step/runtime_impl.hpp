// The Runtime's parts, and what holds them together: a step's phases in order (run_step.cpp), the chunk phase's
// bounds and its recovery from a lost device, the report, and what follows the reduction. The parts own their
// behaviour and guard their invariants, each in its own header: the devices (device_set.hpp), the speed model
// (speed_model.hpp), the shared parameters (shared_parameters.hpp), this rank's part of a job across ranks and its
// phases (cluster_state.hpp), the step's planner (planner.hpp), each chunk call (chunk_runner.hpp) and the reduction
// (reduction.hpp). The step's types are in step_types.hpp.
#pragma once

#include "cluster/cluster_state.hpp"
#include "cost/given_costs.hpp"
#include "cost/speed_model.hpp"
#include "devices/device_set.hpp"
#include "parameters/shared_parameters.hpp"
#include "reduction/exact_sum.hpp"
#include "step/chunk_runner.hpp"
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
  // recovery from a lost device), or the ranks' share words, claimed a few chunks at a time (ClusterState::run_from_shares()).
  ChunkPhase run_chunk_phase(std::span<const std::uint32_t> samples, const ChunkFunction& fn, ChunkTable& t, StepPlan& plan,
                             Clock::time_point step_start);
  ChunkPhase run_with_recovery(std::span<const std::uint32_t> samples, const ChunkFunction& fn, ChunkTable& t, StepPlan& plan,
                               Clock::time_point step_start);
  void recover_lost_device(std::size_t dead, ChunkTable& t, StepPlan& plan, ChunkPhase& phase, const ChunkFn& run);
  void exclude_device(std::size_t position);
  // step_report.cpp
  std::vector<DeviceReport> device_reports(const ChunkTable& t, const ChunkPhase& phase);
  StepReport build_report(std::size_t batch, const ChunkTable& t, const StepPlan& plan, ChunkPhase& phase, std::vector<DeviceReport> local,
                          Reduced& reduced);
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
  // The step's own parts, on the parts above (they keep references: the Impl never moves).
  StepPlanner planner;  // the step's plan, chunk table and end game (planner.hpp)
  ChunkRunner runner;   // each call of the chunk function and what the step keeps of it (chunk_runner.hpp)
  std::unique_ptr<Scheduler> sched;  // last: its workers stop before the devices and replicas go
};

}  // namespace stealbatch

// A step's plan and chunk table, from what the runtime's parts know: the devices (device_set.hpp), what the steps
// taught of their speeds and the positions' costs (speed_model.hpp), the trainer's sample costs (given_costs.hpp) and,
// across ranks, the ranks' shares (cluster_state.hpp). The planner decides how the batch is placed and cut (StepPlan,
// ChunkTable) and the end game's costs; it owns no state of its own, and writes only to the speed model's chunk sizer
// (a device that settles or stops exploring) and, across ranks, through ClusterState::plan() (the steps begun).
#pragma once

#include "cluster/cluster_state.hpp"
#include "cost/given_costs.hpp"
#include "cost/speed_model.hpp"
#include "devices/device_set.hpp"
#include "step/step_types.hpp"

#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/scheduler/scheduler.hpp>

#include <cstddef>
#include <span>
#include <vector>

namespace stealbatch {

class StepPlanner {
 public:
  // Across ranks, `cluster` plans the ranks' part: their speeds, shares, chunk sizes and victims (StepPlan::ranks).
  StepPlanner(const RuntimeOptions& options, const DeviceSet& dev, SpeedModel& speed, const GivenCosts& costs, ClusterState& cluster)
      : m_options(options), m_dev(dev), m_speed(speed), m_costs(costs), m_cluster(cluster) {}

  // What is known of the devices and which rules place and cut this step (placement, cutting, the cost model's lines).
  StepPlan plan(std::size_t batch);
  // The chunks, each device's share of them (or across ranks each rank's), sizes and costs.
  ChunkTable cut_and_place(std::size_t batch, StepPlan& plan);
  // The end game's costs and weights, to the scheduler; off where nothing is measured.
  void set_endgame(ChunkTable& table, StepPlan& plan, Scheduler& sched) const;

 private:
  void plan_given_costs(std::size_t batch, StepPlan& plan);  // the step's sample costs: placement and chunks in cost
  double cost_chunk(std::size_t batch) const;                 // a full chunk's cost, in mean samples of the batch
  std::vector<double> measured_cost_rates() const;           // each device's cost per second in mean samples; empty until known
  void cut_sized(std::size_t batch, const StepPlan& plan, ChunkTable& t);
  void cut_by_speed(std::size_t batch, const StepPlan& plan, ChunkTable& t);
  void cut_fixed(std::size_t batch, const StepPlan& plan, ChunkTable& t) const;
  void cut_packed(const StepPlan& plan, ChunkTable& t) const;
  void cut_rank_shares(std::size_t batch, StepPlan& plan, ChunkTable& t) const;
  // Deterministic mode: the cells and their placement.
  void cut_cell_grid(std::size_t batch, ChunkTable& t) const;
  std::vector<ChunkRange> split_cells(const ChunkTable& t, const StepPlan& plan, std::span<const double> weights) const;
  void cut_cells(std::size_t batch, const StepPlan& plan, ChunkTable& t) const;

  const RuntimeOptions& m_options;
  const DeviceSet& m_dev;
  SpeedModel& m_speed;
  const GivenCosts& m_costs;
  ClusterState& m_cluster;
};

}  // namespace stealbatch

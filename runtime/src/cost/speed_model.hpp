// What the runtime has learnt of its devices' speeds, in the device set's order: each device's samples/s over the last
// steps, how much slower the chunks stolen from it ran on their thieves (its data, not the device), its chunk-size
// curve, and, apart from the devices, what each batch position costs. A step's plan reads it (planner.cpp); each
// step that completes teaches it (learn_from_step()). Invariant: every per-device list has one entry per live device
// (drop_device() keeps them so, and forgets what was indexed by the devices as they were).
#pragma once

#include "step/step_types.hpp"

#include <stealbatch/runtime/detail/call_fit.hpp>
#include <stealbatch/runtime/detail/chunk_sizer.hpp>
#include <stealbatch/runtime/detail/cost_profile.hpp>
#include <stealbatch/runtime/telemetry.hpp>

#include <cstddef>
#include <span>
#include <vector>

namespace stealbatch {

struct SpeedModel {
  // n devices; `window` steps in each device's median; a static run sizes chunks for speed alone (no thieves);
  // `by_chunk`: each chunk's time is known (host devices when its call returns, GPUs by their events after the chunk
  // phase), else only each step's; `learn_later`: devices that leave the cores idle, so the profile
  // learns from a step while the next one's chunks run (learn_pending()).
  void reset(std::size_t n, std::size_t window, bool static_policy, bool by_chunk, bool learn_later);
  // Each device's samples/s: its median over the window, pooled where the devices differ no more than their noise
  // (detail::pooled_speeds); empty until every device has a figure.
  std::vector<double> estimates() const;
  // What a completed step teaches: each device's speed (a device idle for many steps forgets its own), its chunk
  // sizes' throughput, the positions' costs, and the slowness of the data stolen from each device. Nothing from a step
  // with a re-run round (its counters cover that round only).
  void learn_from_step(std::size_t batch, const ChunkTable& t, const StepPlan& plan, bool rerun, std::span<const DeviceReport> local);
  // Each device's given cost per second (the trainer's units: step()'s `cost`), its median over the window; empty
  // until every device has a figure.
  std::vector<double> cost_estimates() const;
  // The cost profile learns from the last step's chunk times, if they wait (noexcept: the profile is advice).
  void learn_pending() noexcept;
  bool pending() const noexcept { return m_pending.ready; }
  void drop_device(std::size_t position);

  std::vector<std::vector<double>> history;          // per device, its last samples/s figures
  std::vector<std::vector<double>> stolen_slowness;  // per device, its stolen chunks' time over what their thieves' speed predicts
  detail::CostProfile cost_profile;                  // costs by batch position, apart from device speeds (cost_by_position)
  detail::ChunkSizer chunk_sizer;                    // each device's chunk size (chunk_size = 0)
  std::vector<std::vector<double>> cost_rate;        // per device, its last given-cost-per-second figures
  std::vector<detail::CallFit> call_fit;             // per device, its call time against the given cost it held

 private:
  // The last step's chunk times, for the profile to learn from (devices that leave the cores idle: while the next
  // step's chunks run).
  struct PendingObservation {
    std::vector<detail::CostProfile::ChunkTime> chunks;
    std::vector<double> flat_speeds;
    std::size_t batch = 0, devices = 0;
    bool ready = false;
  } m_pending;
  std::vector<std::size_t> m_idle_steps;  // per device, consecutive steps in which it ran nothing
  std::size_t m_window = 5;
  bool m_by_chunk = false, m_learn_later = false;
};

}  // namespace stealbatch

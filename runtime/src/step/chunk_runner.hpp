// One call of the chunk function on a device, and what the step keeps of it: the call run with its faults and errors
// named (a ChunkError with the device, step and chunk; a lost device's DeviceLostError passed on where the runtime
// excludes it), deterministic mode's cell into fixed point, the call's time into the chunk table where the speed model
// reads it, the device's live speed for the end game, and the trace. Thieves' merged calls are chosen here too
// (mergeable()). The chunk phase (which device runs what) is the scheduler's; the runtime hands it these calls.
//
// Called concurrently from the scheduler's workers, one worker per device w: a call writes only device w's replica,
// the table's entries of the chunks it ran and device w's list of calls, so no two workers write the same place.
#pragma once

#include "devices/device_set.hpp"
#include "reduction/exact_sum.hpp"
#include "step/step_types.hpp"

#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/runtime/telemetry.hpp>
#include <stealbatch/runtime/testing.hpp>
#include <stealbatch/scheduler/scheduler.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace stealbatch {

// The runtime's parts a call reads and writes.
struct ChunkRunnerParts {
  const RuntimeOptions& options;
  DeviceSet& dev;
  const ParameterLayout& layout;
  ExactSum& exact;                               // deterministic mode
  const std::unique_ptr<Scheduler>& sched;       // the device's live speed, for the end game
  const std::unique_ptr<TraceWriter>& trace;     // each call's span, where traced
  const testing::FaultInjector& inject_fault;    // tests and the soak only
  const Clock::time_point& epoch;                // the watchdog's stamps and the trace's times
  const std::uint64_t& steps;                    // steps completed: this step is steps + 1
};

class ChunkRunner {
 public:
  explicit ChunkRunner(ChunkRunnerParts parts) : m_p(parts) {}

  // Chunk c on device w (worker w).
  void run_one(std::size_t w, ChunkId c, std::span<const std::uint32_t> samples, const ChunkFunction& fn, ChunkTable& t, const StepPlan& plan);
  // One call of the chunk function over `chunks`: one chunk, or several contiguous ones a thief stole together
  // (descending, as mergeable() chose them), with every chunk's bookkeeping.
  void run_call(std::size_t w, std::span<const ChunkId> chunks, std::span<const std::uint32_t> samples, const ChunkFunction& fn, ChunkTable& t,
                const StepPlan& plan);
  // How many of `more` (stolen after `first`, in the victim's order) run with it in one call on device w: those that
  // continue its span downward, up to w's own chunk size and `largest` (what the devices reserved for).
  static std::size_t mergeable(std::size_t w, ChunkId first, std::span<const ChunkId> more, const ChunkTable& t, std::size_t largest) noexcept;
  // Devices that time their calls on their own clock (GPUs): their calls' times into the table, after the chunk phase.
  void take_call_times(ChunkTable& t) const;

 private:
  ChunkTiming run_guarded(std::size_t w, std::span<const ChunkId> chunks, ChunkContext& ctx, const ChunkFunction& fn);  // faults, and errors named
  void record_call(std::size_t w, std::span<const ChunkId> chunks, const ChunkTiming& timing, Clock::time_point t0, ChunkTable& t, const StepPlan& plan);
  void watch_live_speed(std::size_t w, std::span<const ChunkId> chunks, double ratio, double took, ChunkTable& t, const StepPlan& plan);

  ChunkRunnerParts m_p;
};

}  // namespace stealbatch

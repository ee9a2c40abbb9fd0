// The chunk phase: the scheduler runs each chunk on a device (each call is the ChunkRunner's, chunk_runner.hpp), and,
// when a device is lost with on_device_failure = exclude, the device is dropped and its chunks re-run on the survivors.
#include "step/runtime_impl.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>

namespace stealbatch {

void Runtime::Impl::begin_chunk_phase(const ChunkTable& t, Clock::time_point step_start) {
  if (grads_dirty) {  // after compute_gradient() or a failed step; a completed step() leaves them zeroed
    sched->broadcast([&](std::size_t d) { dev.devices[d]->zero_grad(); });
    if (exact) exact.discard();  // ... or an attempt of this step that is run again
  }
  if (exact) exact.begin_attempt(t.size());
  for (auto& r : dev.replicas) r->reset_step();
  grads_dirty = true;
  std::size_t largest = 0;
  for (const ChunkSpan& c : t.spans) largest = std::max<std::size_t>(largest, c.size);
  for (auto& d : dev.devices) d->reset_cancel(), d->begin_step(steps + 1, step_start), d->reserve(largest);
  comm->begin_step();
}

ChunkPhase Runtime::Impl::run_chunk_phase(std::span<const std::uint32_t> samples, const ChunkFunction& fn, ChunkTable& t, StepPlan& plan,
                                          Clock::time_point step_start) {
  if (cluster) {  // cluster_step.cpp
    return cluster.run_from_shares(t, plan, step_start, *sched, [&](std::size_t w, ChunkId c) { runner.run_one(w, c, samples, fn, t, plan); });
  }
  ChunkPhase phase = run_with_recovery(samples, fn, t, plan, step_start);
  for (std::size_t c = 0; c < t.size(); ++c) {
    if (t.runs[c] != 1) {
      throw std::logic_error("runtime: chunk " + std::to_string(c) + " ran " + std::to_string(t.runs[c]) + " times in step " + std::to_string(steps + 1) +
                             ": exactly-once violated");
    }
  }
  return phase;
}

ChunkPhase Runtime::Impl::run_with_recovery(std::span<const std::uint32_t> samples, const ChunkFunction& fn, ChunkTable& t, StepPlan& plan,
                                            Clock::time_point step_start) {
  std::size_t largest = 0;
  for (const ChunkSpan& c : t.spans) largest = std::max<std::size_t>(largest, c.size);
  auto run = [&](std::size_t w, ChunkId c) { runner.run_one(w, c, samples, fn, t, plan); };
  ChunkPhase phase;
  phase.start = step_start;
  try {
    // Devices that sleep through their chunks: the profile learns from the last step while this one's chunks run,
    // off the step's critical path. This step is placed by what the profile knew before it.
    std::function<void()> learn;
    if (speed.pending()) learn = [this] { speed.learn_pending(); };
    // Thieves run what they steal in one call up to their own chunk size, where asked (RuntimeOptions::schedule.merge_stolen).
    auto choose = [&](std::size_t w, ChunkId first, std::span<const ChunkId> more) { return ChunkRunner::mergeable(w, first, more, t, largest); };
    auto run_merged = [&](std::size_t w, std::span<const ChunkId> chunks) { runner.run_call(w, chunks, samples, fn, t, plan); };
    const ChunkMerge merge{choose, run_merged};
    // Deterministic mode: a cell's gradient is summed on its own, so every cell runs in a call of its own.
    phase.stats = sched->run(t.ranges, run, learn, options.schedule.merge_stolen && !exact ? &merge : nullptr);
  } catch (const DeviceLostError& first) {
    // on_device_failure = exclude: drop the device, then re-run on the survivors what it had run this step (its
    // gradient buffer leaves the reduction) and what nobody ran; again if another device is lost meanwhile.
    recover_lost_device(first.index(), t, plan, phase, run);
    phase.excluded.insert(phase.excluded.begin(), first.device());
  }
  phase.end = Clock::now();
  return phase;
}

void Runtime::Impl::recover_lost_device(std::size_t dead, ChunkTable& t, StepPlan& plan, ChunkPhase& phase, const ChunkFn& run) {
  for (std::optional<std::size_t> lost_now = dead; lost_now;) {
    plan.watch_speed = false;  // the speeds are indexed by the devices as they were
    exclude_device(*lost_now);
    const std::vector<ChunkId> redo = t.drop_device(*lost_now);  // the report reads the tables by the new indices
    lost_now.reset();
    phase.rerun += redo.size();
    const std::size_t n = dev.devices.size();
    std::vector<std::vector<ChunkId>> lists(n);
    const std::vector<ChunkRange> share = place_equal(redo.size(), n);
    for (std::size_t w = 0; w < n; ++w) {
      for (std::size_t i = share[w].begin; i < share[w].end; ++i) lists[w].push_back(redo[i]), t.home[redo[i]] = static_cast<std::uint32_t>(w);
    }
    for (auto& d : dev.devices) d->reset_cancel();
    comm->begin_step();
    try {
      phase.stats = sched->run(lists, run);
    } catch (const DeviceLostError& again) {
      phase.excluded.push_back(again.device());
      lost_now = again.index();
    }
  }
}

void Runtime::Impl::exclude_device(std::size_t position) {
  sched.reset();  // joins the workers: they are parked between steps
  dev.exclude(position);
  speed.drop_device(position);
  if (exact) exact.drop_device(position);  // its cells are run again on the survivors
  if (auto& w = options.schedule.placement_weights; options.schedule.placement == PlacementPolicy::kGiven) {
    w.erase(w.begin() + static_cast<std::ptrdiff_t>(position));
  }
  if (dev.devices.empty()) throw Error("runtime: every device was lost; nothing is left to run on");
  make_communicator();
  make_scheduler();
}

}  // namespace stealbatch

// One step, phase after phase, for one process and across ranks alike: plan, cut and place the chunks, set the end
// game, run the chunks, reduce, report. Two things differ across ranks, each behind one call:
//   - the chunk source: each device's own deque (one process), or the ranks' share words (ClusterState::run_from_shares());
//   - the reduction: within the process, or within the rank and then across ranks (reduction/reduction.hpp).
#include "reduction/reduction.hpp"
#include "step/runtime_impl.hpp"

#include <limits>
#include <string>

namespace stealbatch {

StepReport Runtime::Impl::run_step(std::span<const std::uint32_t> batch_samples, const ChunkFunction& fn, Reduce reduce_to,
                                   std::span<const double> cost) {
  if (batch_samples.empty()) throw ConfigError("batch = 0 samples; a step needs at least 1");
  if (batch_samples.size() > std::numeric_limits<std::uint32_t>::max()) {
    throw ConfigError("batch = " + std::to_string(batch_samples.size()) + " samples; at most 4294967295 per step");
  }
  if (layout.size() == 0) throw ConfigError("step: no parameters registered; call register_parameters() first");
  const auto t_start = Clock::now();
  if (cluster) cluster.begin_step(batch_samples, cost, reduce_to);  // cluster_step.cpp: every rank at the same step
  // The samples in the order the step runs them: the trainer's, or packed device after device (kPacked; across ranks
  // over the job's devices, in rank order).
  const bool pack = options.schedule.placement == PlacementPolicy::kPacked;
  const std::size_t bins = cluster ? cluster.total_devices() : dev.devices.size();
  const std::span<const std::uint32_t> samples = costs.take(batch_samples, cost, pack ? bins : 0);
  const std::size_t batch = samples.size();
  // Deterministic mode: an attempt whose cells left the fixed-point window runs again (exact_sum.hpp): the
  // reduction's verdict. It reads only the job's exponents, so every rank redoes it alike; in one process it comes
  // before the sum, which is fused with the update.
  for (std::uint32_t redone = 0;; ++redone) {
    StepPlan plan = planner.plan(batch);                       // planner.cpp
    ChunkTable table = planner.cut_and_place(batch, plan);     // planner.cpp
    planner.set_endgame(table, plan, *sched);                  // planner.cpp
    begin_chunk_phase(table, t_start);                         // run_chunks.cpp
    ChunkPhase phase = run_chunk_phase(samples, fn, table, plan, t_start);  // run_chunks.cpp, or cluster_step.cpp's share words
    Reduced reduced;
    if (!reduction->reduce({batch, reduce_to, table, phase}, reduced)) continue;  // reduction/
    reduced.end = Clock::now();
    StepReport rep = build_report(batch, table, plan, phase, std::move(reduced.local), reduced);  // step_report.cpp
    rep.redone = redone;
    return rep;
  }
}

}  // namespace stealbatch

// One step, phase after phase: plan, cut and place the chunks, set the end game, run with recovery, reduce, report.
#include "runtime_impl.hpp"

#include <limits>
#include <string>

namespace stealbatch {

StepReport Runtime::Impl::run_step(std::span<const std::uint32_t> samples, const ChunkFunction& fn, Reduce reduce_to) {
  if (samples.empty()) throw ConfigError("batch = 0 samples; a step needs at least 1");
  if (samples.size() > std::numeric_limits<std::uint32_t>::max()) {
    throw ConfigError("batch = " + std::to_string(samples.size()) + " samples; at most 4294967295 per step");
  }
  if (layout.size() == 0) throw ConfigError("step: no parameters registered; call register_parameters() first");
  if (cluster) return run_cluster_step(samples, fn, reduce_to);  // cluster_step.cpp
  const auto t_start = Clock::now();
  StepPlan plan = plan_step(samples.size());                 // chunk_table.cpp
  ChunkTable table = cut_and_place(samples.size(), plan);    // chunk_table.cpp
  set_endgame_costs(table, plan);                            // chunk_table.cpp
  ChunkPhase phase = run_with_recovery(samples, fn, table, plan, t_start);  // run_chunks.cpp: exclusion and re-runs
  const StepStats reduced = reduce(samples.size(), reduce_to);   // reduce.cpp
  return build_report(samples.size(), table, plan, phase, reduced, Clock::now());  // step_report.cpp
}

}  // namespace stealbatch

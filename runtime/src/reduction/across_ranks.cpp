// The reduction across ranks (reduction.hpp): the sum within the rank, composed with the sum across ranks.
#include "reduction/reduction.hpp"

#include <algorithm>
#include <utility>
#include <vector>

namespace stealbatch {

namespace {

// Within the rank, into the tally, never applied here: host devices each sum slice d of the rank's gradient (float,
// or in deterministic mode fixed point) into it; GPUs in deterministic mode handed their fixed-point sums over after
// the chunk phase (take_device_cells()), and the rank's whole sum goes in at once; GPUs otherwise leave their
// gradient on the device, for their own collective over the job. Across the ranks: the tally
// (ClusterState::sum(), cluster_step.cpp: the gradient in float or bfloat16 on the wire, the counts in
// doubles, the fixed-point sum in int64; a failure anywhere rethrown everywhere, exactly-once checked over the job,
// the verdict on a deterministic attempt from the job's exponents). Then the update (or the mean) from the job's sum
// divided by the global batch, slice by slice on this rank's devices; or the job's exact sum loaded into the GPUs;
// or the GPUs' collective, queued after their chunks.
class AcrossRanks final : public ReductionBase {
 public:
  using ReductionBase::ReductionBase;

  bool reduce(const ReductionStep& step, Reduced& out) override {
    const bool exact = m_p.options.schedule.deterministic, gpu_cells = exact && !m_p.dev.host;
    if (gpu_cells) take_device_cells();
    sum_within(step, out);
    report_devices(step, out);
    if (!m_p.cluster.sum(step.table, step.phase, out.local, out.tally)) return false;
    out.applied = apply(step, out.tally);
    return true;
  }

 private:
  void sum_within(const ReductionStep& step, Reduced& out) {
    const bool exact = m_p.options.schedule.deterministic, gpu_cells = exact && !m_p.dev.host;
    const std::size_t n = m_p.dev.devices.size(), count = m_p.layout.size();
    const std::vector<float*> bufs = buffers();
    const bool sliced = step.reduce_to != Reduce::kSum;
    RankTally& tally = out.tally;
    tally = RankTally(m_p.dev.host && !exact ? count : 0, static_cast<std::size_t>(m_p.cluster->size()),
                      step.table.size(), m_p.cluster.total_devices());
    if (exact) tally.use_exact(count, m_p.exact.tensors());
    if (gpu_cells) m_p.exact.sum_slice(0, count, tally.exact);
    take_learning_rate(step.reduce_to);
    out.within = m_p.sched->broadcast([&](std::size_t d) {
      Replica& r = *m_p.dev.replicas[d];
      const WatchStamp stamp(r, kReductionPhase, m_p.epoch);
      if (!gpu_cells) drain(d);
      take_loss(d);
      if (gpu_cells || !sliced) return;
      const auto [b, e] = InProcessCommunicator::slice(d, n, count);
      if (exact) {
        m_p.exact.sum_slice(b, e, tally.exact);
      } else {
        InProcessCommunicator::sum_slice(d, bufs, count);
        std::copy(bufs[0] + b, bufs[0] + e, tally.grad() + b);
      }
    });
  }

  StepStats apply(const ReductionStep& step, RankTally& tally) {
    const bool exact = m_p.options.schedule.deterministic;
    const std::size_t n = m_p.dev.devices.size(), count = m_p.layout.size();
    if (exact && !m_p.dev.host) {
      std::vector<float> sum(count, 0.0f);
      m_p.exact.to_float(0, count, tally.exact, sum);
      return m_p.sched->broadcast([&](std::size_t d) {
        const WatchStamp stamp(*m_p.dev.replicas[d], kReductionPhase, m_p.epoch);
        m_p.dev.devices[d]->load_grad(sum);
      });
    }
    if (m_p.dev.host) {
      const float scale = mean_scale(step.batch);
      // Deterministic mode: the job's fixed-point sum in float first, each device its slice.
      if (exact) tally.exact_float.assign(count, 0.0f);
      const std::span<const float> sum(exact ? tally.exact_float.data() : tally.grad(), count);
      return m_p.sched->broadcast([&](std::size_t d) {
        const WatchStamp stamp(*m_p.dev.replicas[d], kReductionPhase, m_p.epoch);
        if (exact) {
          const auto [b, e] = InProcessCommunicator::slice(d, n, count);
          m_p.exact.to_float(b, e, tally.exact, tally.exact_float);
        }
        update_slice(d, sum, scale, step.reduce_to);
      });
    }
    std::vector<float*> bufs = buffers();
    m_p.comm->allreduce_all(bufs, count);  // NCCL across the ranks' GPUs
    return StepStats{std::vector<WorkerCounters>(n), {}, 0};
  }
};

}  // namespace

std::unique_ptr<Reduction> across_ranks(ReductionParts parts) {
  return std::make_unique<AcrossRanks>(std::move(parts));
}

}  // namespace stealbatch

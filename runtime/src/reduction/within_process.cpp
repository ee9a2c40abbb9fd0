// The reduction within one process (reduction.hpp): InProcess (float) and ExactInProcess (deterministic mode), and
// what every strategy does on a device's worker.
#include "reduction/reduction.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace stealbatch {

std::unique_ptr<Reduction> across_ranks(ReductionParts parts);  // across_ranks.cpp

std::vector<float*> ReductionBase::buffers() const {
  std::vector<float*> bufs;
  for (const auto& d : m_p.dev.devices) bufs.push_back(d->grad().data());
  return bufs;
}

void ReductionBase::drain(std::size_t d) {
  Replica& r = *m_p.dev.replicas[d];
  const auto f0 = Clock::now();
  m_p.dev.devices[d]->finish_chunks();
  r.drained = Clock::now();
  r.finish = r.drained - f0;
}

void ReductionBase::update_slice(std::size_t d, std::span<const float> sum, float scale, Reduce reduce_to) {
  const std::size_t n = m_p.dev.devices.size(), count = m_p.layout.size();
  const auto u0 = Clock::now();
  const auto [b, e] = InProcessCommunicator::slice(d, n, count);
  if (reduce_to == Reduce::kUpdate) {
    m_p.shared.optimizer->update_into(m_p.shared.live(), m_p.shared.next(), sum, scale, b, e);
  } else {
    for (std::size_t i = b; i < e; ++i) m_p.mean_next[i] = sum[i] * scale;  // compute_gradient() swaps it in on success
  }
  for (const auto& device : m_p.dev.devices) std::fill(device->grad().data() + b, device->grad().data() + e, 0.0f);
  m_p.dev.replicas[d]->update = Clock::now() - u0;
}

void ReductionBase::take_loss(std::size_t d) { m_p.dev.replicas[d]->loss += m_p.dev.devices[d]->take_device_loss(); }

void ReductionBase::take_learning_rate(Reduce reduce_to) {
  if (reduce_to == Reduce::kUpdate && m_p.lr_pending)
    m_p.shared.optimizer->set_lr(m_p.options.optimizer.lr), m_p.lr_pending = false;
}

// Each drains first, so that the hand-over is the reduction's and the chunks' end is timed as in the other devices'
// reduction. A value that is not finite fails the step, naming the device and the tensor.
void ReductionBase::take_device_cells() {
  std::vector<long> bad(m_p.dev.devices.size(), -1);
  m_p.sched->broadcast([&](std::size_t d) {
    const WatchStamp stamp(*m_p.dev.replicas[d], kReductionPhase, m_p.epoch);
    drain(d);
    bad[d] = m_p.dev.devices[d]->take_cells_fixed(m_p.exact.accumulator(d), m_p.exact.largest(d));
  });
  for (std::size_t d = 0; d < bad.size(); ++d) {
    if (bad[d] < 0) continue;
    throw ChunkError(m_p.dev.devices[d]->name(), m_p.steps + 1, 0,
                     m_p.exact.not_finite(static_cast<std::size_t>(bad[d])) +
                         " (found after the chunk phase; chunk 0 stands for the device's chunks of the step)",
                     true);
  }
}

void ReductionBase::fused(const ReductionStep& step, Reduced& out,
                          const std::function<void(std::size_t, std::span<float* const>)>& part) {
  const std::size_t count = m_p.layout.size();
  const std::vector<float*> bufs = buffers();
  const float scale = mean_scale(step.batch);
  const bool sliced = step.reduce_to != Reduce::kSum;
  take_learning_rate(step.reduce_to);
  out.within = m_p.sched->broadcast([&](std::size_t d) {
    Device& device = *m_p.dev.devices[d];
    Replica& r = *m_p.dev.replicas[d];
    const WatchStamp stamp(r, kReductionPhase, m_p.epoch);  // the watchdog covers the reduction too
    const auto f0 = Clock::now();
    drain(d);
    take_loss(d);
    part(d, bufs);
    // A modelled reduction (simulated devices) starts once the device is ready: when its part was issued or its last
    // chunk ended on its own timeline, whichever is later, as a GPU stream starts a collective queued behind a kernel;
    // not when its worker woke from waiting for that chunk (a host thread's lateness, not the device's).
    r.model_wait = m_p.comm->wait_for_model(d, std::max(f0, r.device_end), device);
    if (sliced) update_slice(d, std::span<const float>(bufs[0], count), scale, step.reduce_to);
  });
  report_devices(step, out);
  m_p.comm->allreduce_all(bufs,
                          count);  // a collective issued from one thread (NCCL's group call); a no-op on host devices
  out.applied = StepStats{std::vector<WorkerCounters>(m_p.dev.devices.size()), {}, 0};
}

void ReductionBase::report_devices(const ReductionStep& step, Reduced& out) {
  out.local = m_p.device_reports(step.table, step.phase);
}

namespace {

// The float sum within the process. Sliced (an update or a mean follows, host devices): slice d of every device's
// gradient is complete (the chunk phase is over, and a host device's chunks write their gradient before their call
// returns), and no other device touches slice d: device d sums it into device 0's buffer, from which update_slice()
// writes slice d of the next parameters and zeroes it in every buffer. No device waits for another, so the reduction
// and the update are one phase, done once, not once a device; step() switches to the next parameters once every
// device has done its slice. Otherwise each device's part of the communicator's sum (GPUs: NCCL, completed by its
// group call after the phase).
class InProcess final : public ReductionBase {
 public:
  using ReductionBase::ReductionBase;
  bool reduce(const ReductionStep& step, Reduced& out) override {
    const std::size_t count = m_p.layout.size();
    const bool sliced = step.reduce_to != Reduce::kSum;
    fused(step, out, [&](std::size_t d, std::span<float* const> bufs) {
      if (sliced) {
        InProcessCommunicator::sum_slice(d, bufs, count);
      } else {
        m_p.comm->allreduce_sum(d, bufs, count);
      }
    });
    return true;
  }
};

// Deterministic mode in one process: the devices' fixed-point sums (ExactSum). The verdict on the attempt comes
// first, from this process's exponents: an attempt whose cells left the fixed-point window runs again. Host devices
// then sum slice d each into float and update from it as InProcess does; GPUs, which summed their cells themselves
// and handed them over after the chunk phase (take_device_cells(), which drained them), get the host's exact sum in
// float, loaded where NCCL's float sum would have been.
class ExactInProcess final : public ReductionBase {
 public:
  using ReductionBase::ReductionBase;
  bool reduce(const ReductionStep& step, Reduced& out) override {
    const bool gpus = !m_p.dev.host;
    if (gpus) take_device_cells();
    if (!m_p.exact.settle(m_p.exact.exponents())) return false;
    const std::size_t n = m_p.dev.devices.size(), count = m_p.layout.size();
    if (!gpus) {
      const bool sliced = step.reduce_to != Reduce::kSum;
      fused(step, out, [&](std::size_t d, std::span<float* const> bufs) {
        if (sliced) {
          const auto [b, e] = InProcessCommunicator::slice(d, n, count);
          m_p.exact.sum_to_float(b, e, std::span<float>(bufs[0], count));
        } else {
          m_p.comm->allreduce_sum(d, bufs, count);
        }
      });
      return true;
    }
    take_learning_rate(step.reduce_to);
    out.within = m_p.sched->broadcast([&](std::size_t d) {
      const WatchStamp stamp(*m_p.dev.replicas[d], kReductionPhase, m_p.epoch);
      take_loss(d);  // drained by take_device_cells()
    });
    report_devices(step, out);
    std::vector<float> sum(count, 0.0f);
    m_p.exact.sum_to_float(0, count, sum);
    out.applied = m_p.sched->broadcast([&](std::size_t d) {
      const WatchStamp stamp(*m_p.dev.replicas[d], kReductionPhase, m_p.epoch);
      m_p.dev.devices[d]->load_grad(sum);
    });
    return true;
  }
};

}  // namespace

std::unique_ptr<Reduction> make_reduction(ReductionParts parts) {
  if (parts.cluster) return across_ranks(std::move(parts));
  if (parts.options.schedule.deterministic) return std::make_unique<ExactInProcess>(std::move(parts));
  return std::make_unique<InProcess>(std::move(parts));
}

}  // namespace stealbatch

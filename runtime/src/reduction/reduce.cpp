// The reduction phase: each device finishes its chunks in flight and reduces its part; on host devices the update
// (or the mean) is fused into the same phase, slice by slice. Across ranks the sum crosses the cluster between the
// two (cluster_step.cpp), and the update from the job's sum is a phase of its own.
#include "step/runtime_impl.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace stealbatch {

void Runtime::Impl::update_slice(std::size_t d, std::span<const float> sum, float scale, Reduce reduce_to) {
  const std::size_t n = dev.devices.size(), count = layout.size();
  const auto u0 = Clock::now();
  const auto [b, e] = InProcessCommunicator::slice(d, n, count);
  if (reduce_to == Reduce::kUpdate) {
    shared.optimizer->update_into(shared.live(), shared.next(), sum, scale, b, e);
  } else {
    for (std::size_t i = b; i < e; ++i) mean_next[i] = sum[i] * scale;  // compute_gradient() swaps it in on success
  }
  for (const auto& device : dev.devices) std::fill(device->grad().data() + b, device->grad().data() + e, 0.0f);
  dev.replicas[d]->update = Clock::now() - u0;
}

// The device's chunks still in flight (a GPU's stream, a simulated device's queue), waited for: device time of its
// chunks, part of its compute_s, and the end of its chunk phase (step_report.cpp), not the reduction's start.
void Runtime::Impl::drain(std::size_t d) {
  Replica& r = *dev.replicas[d];
  const auto f0 = Clock::now();
  dev.devices[d]->finish_chunks();
  r.drained = Clock::now();
  r.finish = r.drained - f0;
}

// Deterministic mode on devices that sum their cells themselves (GPUs): each hands over its accumulator and its
// tensors' largest exponents, behind its last cell, so that the verdict and the sum read them as they read a host
// device's. A value that is not finite fails the step, naming the device and the tensor. Each drains first, so that the
// hand-over is the reduction's and the chunks' end is timed as in reduce_within().
void Runtime::Impl::take_device_cells() {
  std::vector<long> bad(dev.devices.size(), -1);
  sched->broadcast([&](std::size_t d) {
    const WatchStamp stamp(*dev.replicas[d], kReductionPhase, epoch);
    drain(d);
    bad[d] = dev.devices[d]->take_cells_fixed(exact.accumulator(d), exact.largest(d));
  });
  for (std::size_t d = 0; d < bad.size(); ++d) {
    if (bad[d] < 0) continue;
    throw ChunkError(dev.devices[d]->name(), steps + 1, 0,
                     exact.not_finite(static_cast<std::size_t>(bad[d])) + " (found after the chunk phase; chunk 0 stands for the device's chunks of the step)",
                     true);
  }
}

// Device d's part of the process's sum. Sliced (an update or a mean follows): slice d of every device's gradient is
// complete (the chunk phase is over, and a host device's chunks write their gradient before their call returns), and
// no other device touches slice d: sum it into device 0's buffer, from which update_slice() writes slice d of the next
// parameters (and optimizer state) and zeroes it in every buffer for the next step. No device waits for another, so
// the reduction and the update are one phase, done once, not once a device; step() switches to the next parameters
// once every device has done its slice. Deterministic mode: the slice of the devices' fixed-point sums instead (their
// float buffers are zero). Across ranks the rank's sum of slice d goes into the tally, which crosses the ranks (GPUs:
// their own collective, once every rank agreed that the step succeeded). Returns whether d's reduction goes on in
// this process (false: its part is in the tally).
bool Runtime::Impl::sum_part(std::size_t d, std::span<float* const> bufs, bool sliced, RankTally& tally) {
  const std::size_t n = dev.devices.size(), count = layout.size();
  const auto [b, e] = InProcessCommunicator::slice(d, n, count);
  if (sliced && exact) {
    if (cluster) {
      exact.sum_slice(b, e, tally.exact);
      return false;
    }
    exact.sum_to_float(b, e, std::span<float>(bufs[0], count));
  } else if (sliced) {
    InProcessCommunicator::sum_slice(d, bufs, count);
  } else if (!cluster) {
    comm->allreduce_sum(d, bufs, count);
  }
  if (!cluster) return true;
  if (sliced) std::copy(bufs[0] + b, bufs[0] + e, tally.grad() + b);
  return false;
}

StepStats Runtime::Impl::reduce_within(std::size_t batch, Reduce reduce_to, const ChunkTable& t, RankTally& tally) {
  const std::size_t n = dev.devices.size(), count = layout.size();
  std::vector<float*> bufs(n);
  for (std::size_t d = 0; d < n; ++d) bufs[d] = dev.devices[d]->grad().data();
  const float scale = 1.0f / static_cast<float>(batch);
  const bool sliced = reduce_to != Reduce::kSum;
  // Across ranks the update waits for the job's sum (finish_reduction()); in one process it is fused in here.
  const bool fused = sliced && !cluster;
  if (cluster) {
    const std::size_t ranks = static_cast<std::size_t>(cluster->size());
    tally = RankTally(dev.host && !exact ? count : 0, ranks, t.size(), cluster.total_devices());
    if (exact) tally.use_exact(count, exact.tensors());
  }
  // Deterministic mode on GPUs: their fixed-point sums were handed over after the chunk phase (take_device_cells(),
  // which drained them); across ranks this rank's sum goes into the tally now, and finish_reduction() loads the sum
  // into every device.
  const bool host_sums = exact && !dev.host;
  if (host_sums && cluster) exact.sum_slice(0, count, tally.exact);
  if (reduce_to == Reduce::kUpdate && lr_pending) shared.optimizer->set_lr(options.optimizer.lr), lr_pending = false;  // set since the last update
  return sched->broadcast([&](std::size_t d) {
    Device& device = *dev.devices[d];
    Replica& r = *dev.replicas[d];
    const WatchStamp stamp(r, kReductionPhase, epoch);  // the watchdog covers the reduction too
    const auto f0 = Clock::now();
    if (!host_sums) drain(d);
    r.loss += device.take_device_loss();
    if (host_sums) return;
    device.set_sample_count(r.samples);
    if (!sum_part(d, bufs, sliced, tally)) return;
    // A modelled reduction (simulated devices) starts once the device is ready: when its part was issued or its last
    // chunk ended on its own timeline, whichever is later, as a GPU stream starts a collective queued behind a
    // kernel; not when its worker woke from waiting for that chunk (a host thread's lateness, not the device's).
    r.model_wait = comm->wait_for_model(d, std::max(f0, r.device_end), device);
    if (fused) update_slice(d, std::span<const float>(bufs[0], count), scale, reduce_to);
  });
}

StepStats Runtime::Impl::finish_reduction(std::size_t batch, Reduce reduce_to, RankTally& tally) {
  if (exact && !dev.host) {
    // Deterministic mode on GPUs: the host's exact sum (this process's devices', or the job's from the tally) in
    // float, loaded into every device where NCCL's float sum would have been.
    std::vector<float> sum(layout.size(), 0.0f);
    if (cluster) {
      exact.to_float(0, layout.size(), tally.exact, sum);
    } else {
      exact.sum_to_float(0, layout.size(), sum);
    }
    return sched->broadcast([&](std::size_t d) {
      const WatchStamp stamp(*dev.replicas[d], kReductionPhase, epoch);
      dev.devices[d]->load_grad(sum, batch);
    });
  }
  if (cluster && dev.host) {
    // The update (or the mean) from the job's sum divided by the global batch, slice by slice on this rank's devices.
    const float scale = 1.0f / static_cast<float>(batch);
    const std::size_t count = layout.size(), n = dev.devices.size();
    // Deterministic mode: the job's fixed-point sum in float first, each device its slice.
    if (exact) tally.exact_float.assign(count, 0.0f);
    const std::span<const float> sum(exact ? tally.exact_float.data() : tally.grad(), count);
    return sched->broadcast([&](std::size_t d) {
      const WatchStamp stamp(*dev.replicas[d], kReductionPhase, epoch);
      if (exact) {
        const auto [b, e] = InProcessCommunicator::slice(d, n, count);
        exact.to_float(b, e, tally.exact, tally.exact_float);
      }
      update_slice(d, sum, scale, reduce_to);
    });
  }
  // A collective issued from one thread (NCCL's group call): across ranks the job-wide sum on the devices, queued
  // after their chunks; step() and compute_gradient() then update or read each replica from it.
  std::vector<float*> bufs;
  for (auto& d : dev.devices) bufs.push_back(d->grad().data());
  comm->allreduce_all(bufs, layout.size());
  return StepStats{std::vector<WorkerCounters>(dev.devices.size()), {}, 0};
}

}  // namespace stealbatch

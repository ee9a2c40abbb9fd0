// The reduction phase: each device finishes its chunks in flight and reduces its part; on host devices the update
// (or the mean) is fused into the same phase, slice by slice.
#include "runtime_impl.hpp"

#include <algorithm>

namespace stealbatch {

StepStats Runtime::Impl::reduce(std::size_t batch, Reduce reduce_to) {
  const std::size_t n = devices.size(), count = layout.size();
  std::vector<float*> bufs(n);
  for (std::size_t d = 0; d < n; ++d) bufs[d] = devices[d]->grad().data();
  const float scale = 1.0f / static_cast<float>(batch);
  const bool update = reduce_to == Reduce::kUpdate, sliced = reduce_to != Reduce::kSum;
  if (update && lr_pending) shared_optimizer->set_lr(options.optimizer.lr), lr_pending = false;  // set since the last update
  const StepStats stats = sched->broadcast([&](std::size_t d) {
    Device& dev = *devices[d];
    Replica& r = *replicas[d];
    const WatchStamp stamp(r, kReductionPhase, epoch);  // the watchdog covers the reduction too
    const auto f0 = Clock::now();
    dev.finish_chunks();  // chunks still in flight (GPU, simulated device)
    r.finish = Clock::now() - f0;
    r.loss += dev.take_device_loss();
    dev.set_sample_count(r.samples);
    if (sliced) {
      // Slice d of every device's gradient is complete (the chunk phase is over, and a host device's chunks write
      // their gradient before their call returns), and no other device touches slice d: sum it, write slice d of the
      // next parameters (and optimizer state) from it, and zero it in every buffer for the next step. No device waits
      // for another, so the reduction and the update are one phase, done once, not once a device. step() switches to
      // the next parameters once every device has done its slice.
      InProcessCommunicator::sum_slice(d, bufs, count);
    } else {
      comm->allreduce_sum(d, bufs, count);
    }
    // A modelled reduction (simulated devices) starts once the device is ready: when its part was issued or its last
    // chunk ended on its own timeline, whichever is later, as a GPU stream starts a collective queued behind a
    // kernel; not when its worker woke from waiting for that chunk (a host thread's lateness, not the device's).
    r.model_wait = comm->wait_for_model(d, std::max(f0, r.device_end), dev);
    if (sliced) {
      const auto u0 = Clock::now();
      const auto [b, e] = InProcessCommunicator::slice(d, n, count);
      if (update) {
        shared_optimizer->update_into(shared_params[shared_live], shared_params[1 - shared_live], std::span<const float>(bufs[0], count), scale, b, e);
      } else {
        for (std::size_t i = b; i < e; ++i) mean_next[i] = bufs[0][i] * scale;  // compute_gradient() swaps it in on success
      }
      for (float* g : bufs) std::fill(g + b, g + e, 0.0f);
      r.update = Clock::now() - u0;
    }
  });
  comm->allreduce_all(bufs, count);  // a collective issued from one thread (NCCL's group call)
  return stats;
}

}  // namespace stealbatch

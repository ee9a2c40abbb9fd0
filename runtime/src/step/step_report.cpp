// The step report, and what the runtime learns from each step: speeds, chunk sizes, batch-position costs, data
// slowness, and the trace's barrier and reduction spans.
#include "step/runtime_impl.hpp"

#include <algorithm>
#include <memory>
#include <vector>

namespace stealbatch {

namespace {

// The end of the chunk phase: when the last device's chunks were all done. The scheduler's part ends when the last
// chunk was launched; a device with chunks in flight (a GPU, a simulated device) finishes them in drain(), and that
// wait is its compute (compute_s holds it), not the reduction's. So each device's compute_s lies within the chunk
// phase, and the reduction starts where it ends: the step pays the drain once.
Clock::time_point chunks_done(const ChunkPhase& phase, const std::vector<std::unique_ptr<Replica>>& replicas) {
  Clock::time_point end = phase.end;
  for (const auto& r : replicas) end = std::max(end, r->drained);
  return end;
}

}  // namespace

std::vector<DeviceReport> Runtime::Impl::device_reports(const ChunkTable& t, const ChunkPhase& phase) {
  const std::size_t n = dev.devices.size();
  const StepStats& st = phase.stats;
  const Clock::time_point chunks_end = chunks_done(phase, dev.replicas);
  std::vector<DeviceReport> out(n);
  for (std::size_t d = 0; d < n; ++d) {
    const WorkerCounters& wc = st.workers[d];
    const Replica& r = *dev.replicas[d];
    DeviceReport& dr = out[d];
    dr.name = dev.devices[d]->name();
    // The device's time for its chunks: its own figure when it keeps one (chunks in flight), else its worker's busy
    // time in the chunk phase plus the wait in finish_chunks() for what was still in flight when that phase ended
    // (without it a device with K chunks in flight looks faster the fewer chunks it ran).
    const std::optional<double> own = dev.devices[d]->step_device_seconds();
    dr.compute_s = own ? *own : seconds(wc.busy) + seconds(r.finish);
    // Waiting for the others: from its last chunk's end (on the device's own timeline when it keeps one, where the
    // last chunk may end after the worker's last call returned; else its worker's last call, then its drain) to the
    // end of the chunk phase.
    if (wc.chunks_run == 0) {
      dr.barrier_wait_s = seconds(st.wall);
    } else if (r.device_end != Clock::time_point{}) {
      dr.barrier_wait_s = std::max(0.0, seconds(chunks_end - r.device_end));
    } else {
      dr.barrier_wait_s = std::max(0.0, seconds(st.wall - wc.last_end) + seconds(chunks_end - phase.end) - seconds(r.finish));
    }
    dr.chunks_run = wc.chunks_run;
    dr.samples = r.samples;
    dr.chunk_samples = t.own_size[d];
  }
  // A chunk that ran on another device than the one it was placed on (across ranks: the one that claimed it) was
  // stolen by the device that ran it.
  for (std::size_t c = 0; c < t.size(); ++c) {
    if (t.runs[c] != 0 && t.ran_on[c] != t.home[c]) ++out[t.ran_on[c]].chunks_stolen;
    if (t.runs[c] != 0 && !t.given_cost.empty()) out[t.ran_on[c]].cost += t.given_cost[c];
  }
  return out;
}

StepReport Runtime::Impl::build_report(std::size_t batch, const ChunkTable& t, const StepPlan& plan, ChunkPhase& phase, std::vector<DeviceReport> local,
                                       Reduced& reduced) {
  const std::size_t n = dev.devices.size();
  StepReport rep;
  rep.step = ++steps;
  const Clock::time_point chunks_end = chunks_done(phase, dev.replicas);
  rep.chunks_s = seconds(chunks_end - phase.start);
  rep.reduce_s = seconds(reduced.end - chunks_end);  // step() takes the update's part out of it
  rep.samples = batch;
  rep.chunks = t.size();
  // Busy: a device's chunks and the rest of its part of the reduction (as a GPU's utilization counts its NCCL
  // kernels). A modelled reduction counts once for every device, whichever worker slept it out.
  const double model_s = cluster ? 0.0 : comm->model_seconds();
  const bool drained_before = exact && !dev.host;  // take_device_cells() drained the devices, outside these counters
  double loss = 0;
  for (std::size_t d = 0; d < n; ++d) {
    const Replica& r = *dev.replicas[d];
    const double in_reduction = seconds(reduced.within.workers[d].busy) + seconds(reduced.applied.workers[d].busy);
    const double drain = drained_before ? 0.0 : seconds(r.finish);  // in compute_s already
    local[d].busy_s = local[d].compute_s + std::max(0.0, in_reduction - drain - seconds(r.model_wait)) + model_s;
    loss += r.loss;
  }
  for (std::size_t c = 0; dev.kind == DeviceKind::kSim && c < t.size(); ++c) {
    if (t.runs[c] != 0 && t.ran_on[c] != t.home[c]) rep.bytes_moved += options.sim.bytes_per_sample * t.spans[c].size;  // a stolen chunk's inputs
  }
  rep.loss = loss / static_cast<double>(batch);
  rep.placed_by_cost = plan.by_cost();
  rep.rerun_chunks = phase.rerun;
  speed.learn_from_step(batch, t, plan, !phase.excluded.empty(), local);
  rep.excluded_devices = std::move(phase.excluded);
  if (trace) {
    // Each device's wait for the others, from its last chunk to the barrier: the end of the chunk phase, or the end
    // of the last chunk still in flight then (on a device with its own timeline), whichever is later.
    const StepStats& st = phase.stats;
    Clock::time_point barrier = chunks_end;
    for (const auto& r : dev.replicas) barrier = std::max(barrier, std::min(r->device_end, reduced.end));
    for (std::size_t d = 0; d < n; ++d) {
      const auto last = st.workers[d].chunks_run > 0 ? st.workers[d].last_end : std::chrono::nanoseconds(0);
      const auto from = std::max(phase.start + last, std::min(dev.replicas[d]->device_end, barrier));
      trace->add({static_cast<std::uint32_t>(dev.ids[d]), 0, (from - epoch).count(), (barrier - epoch).count(), TraceKind::kBarrier});
    }
    trace->add({static_cast<std::uint32_t>(dev.ever()), 0, (chunks_end - epoch).count(), (reduced.end - epoch).count(), TraceKind::kAllReduce});
  }
  if (cluster) {
    // Every rank's devices and loss, from the tallies; what this rank took from the others.
    rep.remote_chunks = phase.remote_chunks, rep.remote_steals = phase.remote_steals, rep.leave_s = phase.leave_s;
    cluster.add_devices(rep, reduced.tally, std::move(local));
  } else {
    rep.devices = std::move(local);
  }
  for (const DeviceReport& dr : rep.devices) rep.steals += dr.chunks_stolen;
  return rep;
}

}  // namespace stealbatch

// One call of the chunk function on a device, and what the step keeps of it (chunk_runner.hpp).
#include "step/chunk_runner.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace stealbatch {

namespace {

// Two own chunks in a row that take more than this many times what the device's measured speed predicts mark the
// device as slowed down for the rest of the step (Scheduler::set_live_factor). Well above the chunk-to-chunk spread
// of real devices and of simulated variable costs, so only a real change of speed trips it.
constexpr double kSlowedDown = 2.0;
// ... and by at least this much (seconds): a chunk of microseconds that took three times as long says nothing about
// the device (a cache miss, a timer read, a context switch).
constexpr double kSlowedDownAtLeast = 100e-6;

}  // namespace

void ChunkRunner::run_one(std::size_t w, ChunkId c, std::span<const std::uint32_t> samples, const ChunkFunction& fn, ChunkTable& t,
                          const StepPlan& plan) {
  run_call(w, std::span<const ChunkId>(&c, 1), samples, fn, t, plan);
}

std::size_t ChunkRunner::mergeable(std::size_t w, ChunkId first, std::span<const ChunkId> more, const ChunkTable& t, std::size_t largest) noexcept {
  // Up to the thief's own chunk size (what it runs well in one call), and no more than the devices reserved for.
  const std::size_t budget = std::min(t.own_size[w], largest);
  std::size_t total = t.spans[first].size, k = 0;
  std::uint32_t lo = t.spans[first].begin;
  // In the victim's order a placed share's chunks descend: each one taken must end where the span so far begins.
  for (ChunkId id : more) {
    const ChunkSpan& s = t.spans[id];
    if (s.begin + s.size != lo || total + s.size > budget) break;
    lo = s.begin, total += s.size, ++k;
  }
  return k;
}

void ChunkRunner::run_call(std::size_t w, std::span<const ChunkId> chunks, std::span<const std::uint32_t> samples, const ChunkFunction& fn,
                           ChunkTable& t, const StepPlan& plan) {
  Replica& r = *m_p.dev.replicas[w];
  const ChunkId c = chunks.front();
  // A merged call's chunks descend, each ending where the one before began (mergeable()): the last one begins the
  // call's span and the first one ends it.
  const std::uint32_t lo = t.spans[chunks.back()].begin, hi = t.spans[c].begin + t.spans[c].size;
  ChunkContext ctx;
  ctx.device = w;
  ctx.chunk = c;
  ctx.chunks = chunks;
  ctx.home_device = t.home[c];
  ctx.samples = samples.subspan(lo, hi - lo);
  ctx.params = m_p.dev.devices[w]->params();
  ctx.grad = m_p.dev.devices[w]->grad();
  ctx.owner = m_p.dev.devices[w].get();
  ctx.layout = &m_p.layout;
  ctx.loss_sum = &r.loss;
  const auto t0 = Clock::now();
  ChunkTiming timing;
  {
    const WatchStamp stamp(r, c, m_p.epoch, t0);
    timing = run_guarded(w, chunks, ctx, fn);
  }
  r.samples += ctx.samples.size();
  for (ChunkId id : chunks) t.ran_on[id] = static_cast<std::uint32_t>(w), ++t.runs[id];
  record_call(w, chunks, timing, t0, t, plan);
}

ChunkTiming ChunkRunner::run_guarded(std::size_t w, std::span<const ChunkId> chunks, ChunkContext& ctx, const ChunkFunction& fn) {
  Device& device = *m_p.dev.devices[w];
  const std::uint64_t step_no = m_p.steps + 1;
  const ChunkId c = chunks.front();
  ChunkId at = c;  // the chunk an error names: the one whose fault fired, else the call's first
  try {
    using testing::Fault;
    Fault fault = Fault::kNone;
    for (ChunkId id : chunks) {
      if (fault != Fault::kNone || !m_p.inject_fault) break;
      fault = m_p.inject_fault(m_p.dev.ids[w], step_no, id);
      at = id;
    }
    if (fault == Fault::kNone) at = c;
    if (fault == Fault::kDeviceLoss) throw DeviceLostError(device.name(), w, step_no, at, "injected fault");
    if (fault == Fault::kThrow) throw std::runtime_error("injected fault: the chunk function threw");
    if (fault == Fault::kStall) {
      device.sleep_until_or_cancel(Clock::time_point::max());  // never completes on its own
      throw std::runtime_error("injected stall, cancelled by the watchdog");
    }
    const ChunkTiming timing = device.run_chunk(ctx, fn);
    // Deterministic mode: the cell's gradient into fixed point (one chunk a call): by the runtime on host devices,
    // queued behind the cell's kernels on a GPU (its accumulator is handed over after the chunk phase).
    if (m_p.exact) {
      if (device.sums_cells_itself()) {
        device.add_cell_fixed(m_p.exact.tensor_begins(), m_p.exact.attempt_shifts());
      } else {
        m_p.exact.add_cell(w, ctx.grad);
      }
    }
    return timing;
  } catch (const DeviceLostError& e) {
    if (m_p.options.on_device_failure == OnDeviceFailure::kExclude) throw;  // run_with_recovery() drops the device and re-runs its chunks
    std::throw_with_nested(ChunkError(device.name(), step_no, at, e.what(), false));
  } catch (const std::exception& e) {
    const bool gpu_error = dynamic_cast<const CudaError*>(&e) != nullptr || dynamic_cast<const NcclError*>(&e) != nullptr;
    std::throw_with_nested(ChunkError(device.name(), step_no, at, e.what(), !gpu_error));
  } catch (...) {
    std::throw_with_nested(ChunkError(device.name(), step_no, at, "a non-standard exception", true));
  }
}

namespace {

// A call's time in the table, where the speed model reads it: shared among its chunks by cost (took_s, for the cost
// profile); the compute time of its chunk, where it ran one (a merged call's is no chunk's of its size: one call's
// fixed cost spread over several chunks, so the chunk sizer does not see it, 0 meaning "not measured"); and, with
// `list`, the device's list of calls against the given cost each held (only the device's own worker, or the runtime
// after the chunk phase, writes it). Returns the call's cost in the units of the plan's rate.
double enter_call(ChunkTable& t, std::size_t w, std::span<const ChunkId> ids, double took, double compute, bool list) {
  const auto k = static_cast<double>(ids.size());
  double cost = 0;
  for (const ChunkId id : ids) cost += t.chunk_cost[id];
  for (const ChunkId id : ids) {
    const double part = k == 1 || !(cost > 0) ? 1.0 / k : t.chunk_cost[id] / cost;
    if (!t.took_s.empty()) t.took_s[id] = took * part;
    if (!t.compute_s.empty()) t.compute_s[id] = k > 1 ? 0.0 : compute;
  }
  if (list && !t.calls.empty()) {  // kept with given costs only
    double given = 0;
    for (const ChunkId id : ids) given += t.given_cost[id];
    t.calls[w].emplace_back(given, took);
  }
  return cost;
}

}  // namespace

void ChunkRunner::record_call(std::size_t w, std::span<const ChunkId> chunks, const ChunkTiming& timing, Clock::time_point t0, ChunkTable& t,
                              const StepPlan& plan) {
  Replica& r = *m_p.dev.replicas[w];
  const ChunkId c = chunks.front();
  const bool own = timing.device_end != Clock::time_point{};  // the device's timeline, when it keeps one
  if (own) r.device_end = std::max(r.device_end, timing.device_end);
  // The call's span: on the device's timeline when it keeps one, else the worker's call (read once, for every use).
  const auto begin = own ? timing.device_begin : t0;
  const bool timed = plan.watch_speed || !t.took_s.empty() || !t.compute_s.empty() || !t.calls.empty() || m_p.trace;
  const auto end = own ? timing.device_end : (timed ? Clock::now() : t0);
  const double took = seconds(end - begin);
  // Devices that time their calls themselves enter them after the chunk phase (take_call_times()).
  const double cost = enter_call(t, w, chunks, took, timing.compute_seconds > 0 ? timing.compute_seconds : took, !m_p.dev.times_calls);
  if (plan.watch_speed) watch_live_speed(w, chunks, took * plan.rate[w] / cost, took, t, plan);
  if (m_p.trace) m_p.trace->push(w, {static_cast<std::uint32_t>(m_p.dev.ids[w]), c, (begin - m_p.epoch).count(), (end - m_p.epoch).count(), TraceKind::kChunk});
}

// Devices that time their calls on their own clock (GPUs): each call's time replaces its launch's, which is all its
// worker saw, in what the speed model learns from (the chunk sizer, the call line). Their chunks are done: after the
// reduction's drain, or take_device_cells()'s.
void ChunkRunner::take_call_times(ChunkTable& t) const {
  if (!m_p.dev.times_calls) return;
  std::vector<ChunkId> ids;  // a call's chunks
  for (std::size_t d = 0; d < m_p.dev.devices.size(); ++d) {
    for (const DeviceCallTime& call : m_p.dev.devices[d]->call_device_times()) {
      const std::size_t first = call.first, end = first + std::max<std::uint32_t>(call.chunks, 1);
      // Not chunks this step ran there (a failed attempt's): left out whole.
      if (end > t.size() || !std::all_of(t.ran_on.begin() + static_cast<std::ptrdiff_t>(first), t.ran_on.begin() + static_cast<std::ptrdiff_t>(end),
                                          [&](std::uint32_t on) { return on == d; })) {
        continue;
      }
      ids.clear();
      for (std::size_t id = first; id < end; ++id) ids.push_back(static_cast<ChunkId>(id));
      (void)enter_call(t, d, ids, call.seconds, call.seconds, true);
    }
  }
}

void ChunkRunner::watch_live_speed(std::size_t w, std::span<const ChunkId> chunks, double ratio, double took, ChunkTable& t, const StepPlan& plan) {
  Replica& r = *m_p.dev.replicas[w];
  const ChunkId c = chunks.front();
  // The factor from its own chunks only (across ranks, any of its rank's share): a stolen one may hold samples of
  // another cost (another device's share of a batch whose cost varies by position), which says nothing about this
  // device's speed.
  if (t.home[c] != w) {
    for (ChunkId id : chunks) t.stolen_ratio[id] = static_cast<float>(ratio);
  }
  if (t.home[c] == w || plan.in_rank_share(c)) {
    // Two in a row: one slow chunk is as often a chunk that lost its core for a while as a device that slowed down.
    const bool slow = ratio > kSlowedDown && took * (1.0 - 1.0 / ratio) > kSlowedDownAtLeast;  // took - expected
    r.live_factor = slow && r.last_ratio > kSlowedDown ? std::min(ratio, r.last_ratio) : 1.0;
    r.last_ratio = slow ? ratio : 0.0;
  }
  // With chunks in flight, the next one starts only when those are done.
  m_p.sched->set_live_factor(w, r.live_factor, m_p.dev.devices[w]->queued_seconds());
}

}  // namespace stealbatch

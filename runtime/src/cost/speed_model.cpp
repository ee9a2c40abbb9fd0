// What the runtime has learnt of its devices' speeds (speed_model.hpp).
#include "cost/speed_model.hpp"

#include <stealbatch/runtime/detail/speed_shares.hpp>
#include <stealbatch/stats.hpp>

#include <cmath>

namespace stealbatch {

namespace {

// A device that ran nothing for this many steps in a row forgets its speed (see learn_from_step()).
constexpr std::size_t kStaleAfterIdleSteps = 10;
// The stolen chunks a device's data slowness is the median of (see detail::data_slowness()).
constexpr std::size_t kSlownessWindow = 16;

}  // namespace

void SpeedModel::reset(std::size_t n, std::size_t window, bool static_policy, bool by_chunk, bool learn_later) {
  history.assign(n, {});
  stolen_slowness.assign(n, {});
  cost_rate.assign(n, {});
  call_fit.assign(n, {});
  m_idle_steps.assign(n, 0);
  chunk_sizer.reset(n);
  // No thieves under the static policy, nor for a lone device: each device's fastest rung, not the smallest
  // good-enough one.
  chunk_sizer.set_choice(static_policy || n == 1 ? detail::ChunkSizer::Choice::kFastest : detail::ChunkSizer::Choice::kSmallestGoodEnough);
  // A GPU's chunks run asynchronously, and its worker's calls do not time them: its events do, or else the step
  // (learn_from_step()).
  chunk_sizer.set_timing(by_chunk ? detail::ChunkSizer::Timing::kByChunk : detail::ChunkSizer::Timing::kByStep);
  cost_profile.reset();
  m_pending = {};
  m_window = window, m_by_chunk = by_chunk, m_learn_later = learn_later;
}

namespace {

// Each device's median over its window, pooled where the devices differ no more than their noise; empty until every
// device has a figure.
std::vector<double> pooled_medians(const std::vector<std::vector<double>>& windows) {
  std::vector<double> out;
  for (const auto& h : windows) {
    if (h.empty()) return {};
    out.push_back(median(h));
  }
  return detail::pooled_speeds(out, windows);
}

}  // namespace

std::vector<double> SpeedModel::estimates() const { return pooled_medians(history); }

std::vector<double> SpeedModel::cost_estimates() const { return pooled_medians(cost_rate); }

void SpeedModel::learn_pending() noexcept {
  PendingObservation& p = m_pending;
  if (!p.ready) return;
  p.ready = false;  // taken here, not before a run: a run that throws before it gets here keeps the observation
  try {
    cost_profile.observe(p.batch, p.devices, p.chunks, p.flat_speeds);
  } catch (...) {  // out of memory: the profile is advice, and starts over
    cost_profile.reset();
  }
}

void SpeedModel::drop_device(std::size_t position) {
  const auto at = [position](auto& v) { v.erase(v.begin() + static_cast<std::ptrdiff_t>(position)); };
  at(history), at(stolen_slowness), at(m_idle_steps), at(cost_rate), at(call_fit);
  cost_profile.reset();  // indexed by the devices as they were
  chunk_sizer.erase(position);
  if (history.size() == 1) chunk_sizer.set_choice(detail::ChunkSizer::Choice::kFastest);  // the survivor has no thieves left
  m_pending.ready = false;
}

void SpeedModel::learn_from_step(std::size_t batch, const ChunkTable& t, const StepPlan& plan, bool rerun, std::span<const DeviceReport> local) {
  if (rerun) return;
  const std::size_t n = history.size();
  for (std::size_t d = 0; d < n; ++d) {
    const DeviceReport& dr = local[d];
    // A GPU without per-call events: its worker's calls do not time its chunks; while it explores, the step does.
    if (plan.sized() && !m_by_chunk) chunk_sizer.observe_step(d, dr.samples, dr.compute_s);
    auto& h = history[d];
    if (dr.compute_s > 0 && dr.samples > 0) {
      push_window(h, static_cast<double>(dr.samples) / dr.compute_s, m_window);
      if (dr.cost > 0) push_window(cost_rate[d], dr.cost / dr.compute_s, m_window);
      m_idle_steps[d] = 0;
    } else if (++m_idle_steps[d] >= kStaleAfterIdleSteps) {
      // A device that runs nothing gets no fresh figure, and a wrong low one (a slow first step, a passing stall)
      // would keep it idle for good: few chunks placed, every chunk declined in the end game. After a while, forget
      // it; the next step splits equally and measures every device again.
      h.clear();
      cost_rate[d].clear();
      m_idle_steps[d] = 0;
    }
  }
  // Each call's time against the given cost it held (where calls are timed: host devices, GPUs' events).
  for (std::size_t d = 0; d < n && d < t.calls.size(); ++d) {
    for (const auto& [cost, seconds] : t.calls[d]) call_fit[d].add(cost, seconds);
  }
  // Where the cost model cut this step, a device whose step no longer follows its line (off by more than kLineHolds:
  // it slowed down, or sped up) loses it: the model then waits for a line fitted to what the device does now.
  for (std::size_t d = 0; d < n && !plan.lines.empty(); ++d) {
    const detail::CallFit::Line l = chunk_sizer.line(d);
    const DeviceReport& dr = local[d];
    if (!(l.per_unit > 0) || dr.chunks_run == 0 || !(dr.compute_s > 0)) continue;
    const double predicted = static_cast<double>(dr.chunks_run) * l.per_call + l.per_unit * static_cast<double>(dr.samples);
    if (std::abs(dr.compute_s / predicted - 1) > detail::ChunkSizer::kLineHolds) chunk_sizer.forget_line(d);
  }
  if (plan.sized()) {
    if (m_by_chunk) {
      for (std::size_t c = 0; c < t.size(); ++c) chunk_sizer.observe_chunk(t.ran_on[c], t.spans[c].size, t.compute_s[c]);
    }
    for (std::size_t d = 0; d < n; ++d) chunk_sizer.end_step(d, t.share_len[d]);
  }
  if (plan.learn_costs) {
    // Learnt from during the next step's chunk phase where the devices leave the cores idle, else now, between steps:
    // learning while CPU devices compute takes a core from one of them (and it then looks slower).
    PendingObservation& p = m_pending;
    p.chunks.resize(t.size());
    for (std::size_t c = 0; c < t.size(); ++c) p.chunks[c] = {t.spans[c].begin, t.spans[c].size, t.ran_on[c], t.took_s[c]};
    p.flat_speeds = plan.speeds;  // samples/s as this step began: the flat model
    p.batch = batch, p.devices = n, p.ready = true;
    if (!m_learn_later) learn_pending();
  }
  if (t.stolen_ratio.empty() || plan.by_cost()) return;  // placed by cost, the ratios are against chunk costs, about 1
  for (std::size_t c = 0; c < t.size(); ++c) {
    if (t.ran_on[c] == t.home[c] || !(t.stolen_ratio[c] > 0)) continue;
    push_window(stolen_slowness[t.home[c]], t.stolen_ratio[c], kSlownessWindow);
  }
}

}  // namespace stealbatch

// ChunkSizer: a ladder of chunk sizes explored upward per device, and the smallest good-enough rung chosen.
#include <stealbatch/runtime/detail/chunk_sizer.hpp>

#include <stealbatch/stats.hpp>

#include <algorithm>
#include <bit>
#include <span>

namespace stealbatch::detail {

void ChunkSizer::Rung::add(double seconds_per_sample, std::size_t weight) noexcept {
  per_sample[entries++ % kWindow] = seconds_per_sample;
  count += weight;
}

double ChunkSizer::Rung::samples_per_s() const noexcept {
  const std::size_t n = std::min(entries, kWindow);
  if (n == 0) return 0;
  std::array<double, kWindow> v = per_sample;
  const double median = median_in_place(std::span(v.data(), n));
  return median > 0 ? 1.0 / median : 0;
}

void ChunkSizer::reset(std::size_t devices) { m_devices.assign(devices, State{}); }

void ChunkSizer::erase(std::size_t device) { m_devices.erase(m_devices.begin() + static_cast<std::ptrdiff_t>(device)); }

std::size_t ChunkSizer::size(std::size_t device, std::size_t share) const noexcept {
  return std::max<std::size_t>(1, std::min(share, rung_size(m_devices[device].at)));
}

void ChunkSizer::observe_chunk(std::size_t device, std::size_t samples, double seconds) noexcept {
  if (samples < kFirstRung || !std::has_single_bit(samples) || !(seconds > 0)) return;
  const auto r = static_cast<std::size_t>(std::countr_zero(samples) - std::countr_zero(kFirstRung));
  if (r >= kRungs || m_devices[device].steps == 0) return;  // the device's first step: see the header
  Rung& g = m_devices[device].rungs[r];
  if (!g.warm) {
    g.warm = true;
    return;
  }
  g.add(seconds / static_cast<double>(samples), 1);
}

void ChunkSizer::observe_step(std::size_t device, std::size_t samples, double seconds) noexcept {
  State& s = m_devices[device];
  if (!s.exploring || samples == 0 || !(seconds > 0) || s.steps == 0) return;
  Rung& g = s.rungs[s.at];
  if (!g.warm) {
    g.warm = true;
    return;
  }
  g.add(seconds / static_cast<double>(samples), (kMinChunks + kMinSteps - 1) / kMinSteps);  // kMinSteps steps suffice
}

std::size_t ChunkSizer::choose(const State& s) const noexcept {
  double best = 0;
  for (const Rung& g : s.rungs) best = std::max(best, g.samples_per_s());
  const double bar = m_choice == Choice::kFastest ? best : kGoodEnough * best;
  for (std::size_t r = 0; r < kRungs; ++r) {
    if (s.rungs[r].entries > 0 && s.rungs[r].samples_per_s() >= bar) return r;
  }
  return 0;
}

void ChunkSizer::stop_exploring(std::size_t device) noexcept {
  State& s = m_devices[device];
  if (!s.exploring) return;
  s.exploring = false;
  s.at = choose(s);
}

void ChunkSizer::end_step(std::size_t device, std::size_t share) noexcept {
  State& s = m_devices[device];
  if (++s.steps >= kRefreshSteps) {  // devices change (a throttled GPU, a noisy neighbour): measure again
    s = State{};
    return;
  }
  if (!s.exploring) return;
  if (rung_size(s.at) > share) {  // the rung no longer fits the share (its share shrank as speeds were measured)
    stop_exploring(device);
    return;
  }
  if (s.rungs[s.at].count < kMinChunks && s.steps < kMaxExploreSteps) return;
  // The rung is measured: stop where the next one cannot be cut from the share, at the top, or on a flat curve.
  auto best_below = [&](std::size_t r) {
    double b = 0;
    for (std::size_t i = 0; i < r; ++i) b = std::max(b, s.rungs[i].samples_per_s());
    return b;
  };
  bool flat = s.at >= kFlatRungs;
  for (std::size_t r = s.at + 1 - std::min(s.at + 1, kFlatRungs); flat && r <= s.at; ++r) flat = s.rungs[r].samples_per_s() < kFlat * best_below(r);
  if (s.at + 1 >= kRungs || rung_size(s.at + 1) > share || flat || s.steps >= kMaxExploreSteps) {
    stop_exploring(device);
    return;
  }
  ++s.at;
}

double ChunkSizer::relative_speed(std::size_t a, std::size_t b) const noexcept {
  for (std::size_t r = kRungs; r-- > 0;) {
    const Rung &x = m_devices[a].rungs[r], &y = m_devices[b].rungs[r];
    if (x.entries > 0 && y.entries > 0 && y.samples_per_s() > 0) return x.samples_per_s() / y.samples_per_s();
  }
  return 0;
}

std::vector<std::pair<std::size_t, double>> ChunkSizer::curve(std::size_t device) const {
  std::vector<std::pair<std::size_t, double>> out;
  for (std::size_t r = 0; r < kRungs; ++r) {
    if (m_devices[device].rungs[r].entries > 0) out.emplace_back(rung_size(r), m_devices[device].rungs[r].samples_per_s());
  }
  return out;
}

}  // namespace stealbatch::detail

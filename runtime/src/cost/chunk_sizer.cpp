// ChunkSizer: a first step that fits each device's call time, a start at the rung that line predicts, and a ladder
// explored from there where it does not hold.
#include <stealbatch/runtime/detail/chunk_sizer.hpp>

#include <stealbatch/stats.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <span>

namespace stealbatch::detail {

namespace {

// Samples/s of a chunk of m samples by the line a + b m.
double line_rate(const CallFit::Line& l, std::size_t m) noexcept {
  const double x = static_cast<double>(m), t = l.seconds(x);
  return t > 0 ? x / t : 0;
}

// Whether the device's calls tell a fixed part a > 0 from the per-sample one. Without one (a curve flat from 8, or
// times that grow faster than the samples: no line fits them) there is nothing to start from but the first rung.
bool has_fixed_part(const CallFit& f) noexcept { return f.separates() && f.line().per_call > 0; }

}  // namespace

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

void ChunkSizer::set_choice(Choice c) noexcept {
  m_choice = c;
  for (State& s : m_devices) {
    const bool measured = std::any_of(s.rungs.begin(), s.rungs.end(), [](const Rung& g) { return g.entries > 0; });
    if (!s.exploring && measured) s.at = choose(s);
  }
}

void ChunkSizer::erase(std::size_t device) { m_devices.erase(m_devices.begin() + static_cast<std::ptrdiff_t>(device)); }

std::size_t ChunkSizer::top_rung(std::size_t share) noexcept {
  std::size_t r = 0;
  while (r + 1 < kRungs && rung_size(r + 1) <= share) ++r;
  return r;
}

bool ChunkSizer::probing(std::size_t device) const noexcept {
  const State& s = m_devices[device];
  return m_timing == Timing::kByChunk && s.exploring && s.steps == 0;
}

void ChunkSizer::probe_sizes(std::size_t share, std::vector<std::uint32_t>& out) {
  out.clear();
  std::size_t rungs = 0, each = 0;
  for (std::size_t k = 2; k <= kRungs; ++k) {
    const std::size_t times = 1 + (CallFit::kMinCalls + k - 1) / k;
    if (times * kFirstRung * ((std::size_t{1} << k) - 1) > share) break;  // grows with k
    rungs = k, each = times;
  }
  std::size_t used = 0;
  for (std::size_t r = 0; r < rungs; ++r) {
    for (std::size_t i = 0; i < each; ++i) out.push_back(static_cast<std::uint32_t>(rung_size(r))), used += rung_size(r);
  }
  if (rungs > 0 && used < share) out.push_back(static_cast<std::uint32_t>(share - used));
}

std::size_t ChunkSizer::size(std::size_t device, std::size_t share) const noexcept {
  const State& s = m_devices[device];
  // Timed by the step, a device without thieves runs its first step at its start (see start()): no faster at 8.
  const bool first = m_timing == Timing::kByStep && m_choice == Choice::kFastest && s.exploring && s.steps == 0;
  const std::size_t r = first ? top_rung(share) : s.at;
  // The fastest choice at the share's largest rung takes the share whole: what is left past the rung would be one
  // more call, for less than a rung (up to twice the ladder's top, 2^20).
  if (m_choice == Choice::kFastest && (first || !s.exploring) && r == top_rung(share) && share < 2 * rung_size(r)) return share;
  return std::max<std::size_t>(1, std::min(share, rung_size(r)));
}

void ChunkSizer::observe_chunk(std::size_t device, std::size_t samples, double seconds) noexcept {
  if (samples < kFirstRung || !(seconds > 0)) return;
  State& s = m_devices[device];
  if (!std::has_single_bit(samples)) {
    // Not a rung (a share the cost model runs in one call, a finer end): no rung's figure, but a call on the line, so
    // that the line follows a device that changes (after the first step, whose calls pay one-time costs).
    if (s.steps > 0) s.fit.add(static_cast<double>(samples), seconds);
    return;
  }
  const auto r = static_cast<std::size_t>(std::countr_zero(samples) - std::countr_zero(kFirstRung));
  if (r >= kRungs) return;
  Rung& g = s.rungs[r];
  const double per_sample = seconds / static_cast<double>(samples);
  if (!g.warm) {
    g.warm = true, g.first = per_sample;
    return;
  }
  s.fit.add(static_cast<double>(samples), seconds);
  if (s.steps == 0) return;  // the device's first step: only the line (see the header)
  g.add(per_sample, 1);
}

void ChunkSizer::observe_step(std::size_t device, std::size_t samples, double seconds) noexcept {
  State& s = m_devices[device];
  // A step that ran no chunk of the rung (its share was smaller) says nothing of it.
  if (!s.exploring || samples < rung_size(s.at) || !(seconds > 0) || s.steps == 0) return;
  s.rungs[s.at].add(seconds / static_cast<double>(samples), kMinChunks);  // every step counts: one measures the rung
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

std::size_t ChunkSizer::predict(const State& s, std::size_t top) const noexcept {
  const CallFit::Line l = s.fit.line();
  const double bar = (m_choice == Choice::kFastest ? 1 / kFlat : kGoodEnough) * line_rate(l, rung_size(top));
  std::size_t r = 0;
  while (r < top && line_rate(l, rung_size(r)) < bar) ++r;
  return r;
}

void ChunkSizer::start(State& s, std::size_t share) const noexcept {
  const std::size_t top = top_rung(share);
  s.phase = Phase::kClimb;
  if (m_timing == Timing::kByStep) {
    s.at = m_choice == Choice::kFastest ? top : 0;
  } else if (has_fixed_part(s.fit)) {
    s.at = predict(s, top);
    s.expected = line_rate(s.fit.line(), rung_size(s.at));
    s.phase = Phase::kVerify;
  } else {
    s.at = 0;
  }
}

bool ChunkSizer::verify(State& s, std::size_t share) const noexcept {
  const Rung& g = s.rungs[s.at];
  const std::size_t top = top_rung(share);
  // Only the rung's first chunk so far: it may have paid one-time costs, but where it lies on the line it did not.
  const double seen = g.entries > 0 ? g.samples_per_s() : g.first > 0 ? 1 / g.first : 0;
  const double off = seen > 0 && s.expected > 0 ? seen / s.expected - 1 : -1;
  // A rung on its line confirms it; so does the largest rung running faster than its line (a line fitted to smaller
  // chunks, whose time is more than a + b n, puts b too high). The fastest rung's choice is then made. The smallest
  // good-enough rung's needs the best measured, as the line may overrate the large rungs it never saw (a CPU's curve
  // flattens where the line's rises on): the largest rung, then the rungs below the choice, down to one that falls
  // short (descend()).
  if (std::abs(off) <= kFitted || (off > 0 && s.at == top)) {
    if (m_choice == Choice::kFastest) {
      settle(s, s.at);
      return true;
    }
    s.phase = Phase::kDescend;
    if (s.at == top) return false;  // measured: descend now
    s.at = top;
    return true;
  }
  if (g.entries == 0) return true;  // the next step counts its chunks
  // Off the line: once, the line again, with this step's chunks in it; then the ladder, from here.
  const std::size_t again = has_fixed_part(s.fit) ? predict(s, top) : s.at;
  if (!s.predicted_again && again != s.at && s.rungs[again].entries == 0) {
    s.predicted_again = true;
    s.at = again;
    s.expected = line_rate(s.fit.line(), rung_size(again));
    return true;
  }
  s.phase = Phase::kClimb;
  return false;
}

void ChunkSizer::stop_exploring(std::size_t device) noexcept {
  State& s = m_devices[device];
  if (s.exploring) settle(s, choose(s));
}

void ChunkSizer::settle_at_least(std::size_t device, std::size_t samples) noexcept {
  std::size_t r = 0;
  while (r + 1 < kRungs && rung_size(r) < samples) ++r;
  settle(m_devices[device], r);
}

void ChunkSizer::end_step(std::size_t device, std::size_t share) noexcept {
  State& s = m_devices[device];
  // The line the cost model cuts by: one that tells a fixed part and holds the calls' times (within kLineHolds); calls
  // of one size keep the last, calls that scatter about it (costs that vary by position) drop it.
  if (s.fit.separates() && s.fit.scatter() > kLineHolds) {
    s.line = {};
  } else if (has_fixed_part(s.fit)) {
    s.line = s.fit.line();
  }
  if (++s.steps >= kRefreshSteps) {  // devices change (a throttled GPU, a noisy neighbour): measure again
    s = State{};
    return;
  }
  if (!s.exploring) return;
  if (s.steps == 1 && m_timing == Timing::kByChunk && !s.fit.known() && s.probes + 1 < kMaxProbeSteps) {
    ++s.probes, s.steps = 0;  // too few of its probe's chunks ran here to fit a line: probe again
    return;
  }
  const std::size_t top = top_rung(share);
  const bool measured_below = std::any_of(s.rungs.begin(), s.rungs.begin() + static_cast<std::ptrdiff_t>(top + 1), [](const Rung& g) { return g.entries > 0; });
  // After the first step; or, where the share shrank below the rung (as speeds were measured) and below every rung
  // measured, again for the share it has now.
  if (s.steps == 1 || (rung_size(s.at) > share && !measured_below)) {
    start(s, share);
    return;
  }
  if (rung_size(s.at) > share || s.steps >= kMaxExploreSteps) {
    settle(s, choose(s));
    return;
  }
  if (s.phase == Phase::kVerify && verify(s, share)) return;
  // Climbing, a rung is measured by kMinChunks chunks; checking a line's choice, by as many as one step holds, up to
  // kMinChunks (the share's largest rung: one).
  const std::size_t needed = s.phase == Phase::kClimb ? kMinChunks : std::clamp<std::size_t>(share / rung_size(s.at), 1, kMinChunks);
  if (s.rungs[s.at].count < needed) return;
  if (s.phase == Phase::kClimb && climb(s, share)) return;
  descend(s);
}

bool ChunkSizer::climb(State& s, std::size_t share) const noexcept {
  // The rung is measured: climb on, unless the next one cannot be cut from the share, this is the top, or the curve
  // has flattened.
  auto best_below = [&](std::size_t r) {
    double b = 0;
    for (std::size_t i = 0; i < r; ++i) b = std::max(b, s.rungs[i].samples_per_s());
    return b;
  };
  bool flat = s.at >= kFlatRungs;
  for (std::size_t r = s.at + 1 - std::min(s.at + 1, kFlatRungs); flat && r <= s.at; ++r) flat = s.rungs[r].samples_per_s() < kFlat * best_below(r);
  if (s.at + 1 < kRungs && rung_size(s.at + 1) <= share && !flat) {
    ++s.at;
    return true;
  }
  s.phase = Phase::kDescend;
  return false;
}

void ChunkSizer::descend(State& s) const noexcept {
  // The choice, once the rung below it is measured and falls short (or it is the first rung). A GPU timed by the step
  // that takes its fastest rung keeps the largest: its time per call only falls with fewer calls.
  const std::size_t c = choose(s);
  if (c > 0 && s.rungs[c - 1].entries == 0 && (m_timing == Timing::kByChunk || m_choice == Choice::kSmallestGoodEnough)) {
    s.at = c - 1;
    return;
  }
  settle(s, c);
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

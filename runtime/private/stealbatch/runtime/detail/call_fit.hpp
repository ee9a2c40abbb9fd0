// A device's call time against the cost of what the call ran, t = a + b c: a, what one call costs whatever it holds
// (an eager framework's dispatch, a kernel launch, the autograd graph), b, the seconds per unit of the trainer's
// sample cost (Runtime::step's `cost`). Least squares over the device's last kWindow calls, with a >= 0: where the
// unconstrained fit puts a below 0, the line through the origin. Calls of one cost cannot separate a from b: then
// a = 0 and b is their mean time over their mean cost (separates() tells). The chunk sizer fits the same line to a
// device's chunk times against their samples (detail::ChunkSizer).
//
// The chunk budget follows from it: a call of cost c spends a / (a + b c) of its time on its fixed part, which is at
// most 1 - e where c >= e / (1 - e) * a / b (overhead_cost()).
#pragma once

#include <array>
#include <cmath>
#include <cstddef>

namespace stealbatch::detail {

class CallFit {
 public:
  static constexpr std::size_t kWindow = 128;
  static constexpr std::size_t kMinCalls = 8;  // fewer calls fit nothing

  // One call: its cost (trainer's units) and its time. Ignores what is not finite and positive.
  void add(double cost, double seconds) noexcept {
    if (!std::isfinite(cost) || !std::isfinite(seconds) || !(cost > 0) || !(seconds > 0)) return;
    m_calls[m_next] = {cost, seconds};
    m_next = (m_next + 1) % kWindow;
    if (m_count < kWindow) ++m_count;
  }
  void clear() noexcept { m_count = 0, m_next = 0; }
  bool known() const noexcept { return m_count >= kMinCalls; }
  std::size_t calls() const noexcept { return m_count; }

  struct Line {
    double per_call = 0;  // a, seconds
    double per_unit = 0;  // b, seconds per cost unit
    // A call of `cost`: a + b cost seconds.
    double seconds(double cost) const noexcept { return per_call + per_unit * cost; }
    // The smallest call cost whose fixed part is at most 1 - efficiency of its time (0 without a fixed part).
    double cost_at(double efficiency) const noexcept {
      return per_unit > 0 && per_call > 0 ? efficiency / (1 - efficiency) * per_call / per_unit : 0;
    }
  };
  // The fit; {0, 0} until known().
  Line line() const noexcept {
    if (!known()) return {};
    const Sums s = sums();
    const double n = static_cast<double>(m_count), mc = s.c / n, mt = s.t / n;
    const double var = s.cc / n - mc * mc, cov = s.ct / n - mc * mt;
    if (spread(s)) {
      const double b = cov / var, a = mt - b * mc;
      if (a >= 0 && b > 0) return {a, b};
      if (a < 0) return {0, s.ct / s.cc};  // through the origin
    }
    return {0, s.t / s.c};  // one cost, or time falling with cost (noise): no fixed part to tell
  }
  // Whether the calls' costs differ enough to tell a from b (calls of one cost cannot: line() then puts a at 0).
  bool separates() const noexcept {
    return known() && spread(sums());
  }
  // How far the calls' times lie from the line: the root mean square of their residuals over their mean time (0 until
  // known()). Large where a call's cost is not what its size says (samples that cost more at one end of a batch).
  double scatter() const noexcept {
    if (!known()) return 0;
    const Line l = line();
    double r2 = 0, t = 0;
    for (std::size_t i = 0; i < m_count; ++i) {
      const auto [c, s] = m_calls[i];
      const double r = s - l.seconds(c);
      r2 += r * r, t += s;
    }
    const double n = static_cast<double>(m_count);
    return t > 0 ? std::sqrt(r2 / n) / (t / n) : 0;
  }
  // The smallest call cost whose fixed part is at most 1 - efficiency of its time (0 without a fixed part, or unknown).
  double overhead_cost(double efficiency) const noexcept { return line().cost_at(efficiency); }

 private:
  static constexpr double kSpread = 1e-9;  // the costs' variance over their squared mean below which they are one cost
  struct Call {
    double cost = 0, seconds = 0;
  };
  struct Sums {
    double c = 0, t = 0, cc = 0, ct = 0;
  };
  Sums sums() const noexcept {
    Sums s;
    for (std::size_t i = 0; i < m_count; ++i) {
      const auto [c, t] = m_calls[i];
      s.c += c, s.t += t, s.cc += c * c, s.ct += c * t;
    }
    return s;
  }
  // The costs' variance over their squared mean above kSpread: more than one cost among the calls.
  bool spread(const Sums& s) const noexcept {
    const double n = static_cast<double>(m_count), mc = s.c / n;
    return s.cc / n - mc * mc > kSpread * mc * mc;
  }
  std::array<Call, kWindow> m_calls{};
  std::size_t m_count = 0, m_next = 0;
};

}  // namespace stealbatch::detail

// Position costs and device speeds from chunk times (see cost_profile.hpp).
#include <stealbatch/runtime/detail/cost_profile.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace stealbatch::detail {

namespace {

// A pair seen k steps ago weighs kDecay^k: old pairs fade as speeds drift, and about ten steps' pairs hold
// the fit together while a settled placement moves few positions between devices.
constexpr double kDecay = 0.8;
// Use the profile when samples/s was off by more than 10% (RMS of log errors) and the profile halved its squared error.
constexpr double kFlatErrorFloor = 0.01;
constexpr double kMustBeBetter = 0.5;

// Solves A x = b for a symmetric positive definite n x n matrix (row-major) in place; false if a pivot is not positive.
bool cholesky_solve(std::vector<double>& a, std::vector<double>& b, std::size_t n) {
  for (std::size_t j = 0; j < n; ++j) {
    double d = a[j * n + j];
    for (std::size_t k = 0; k < j; ++k) d -= a[j * n + k] * a[j * n + k];
    if (!(d > 0)) return false;
    const double l = std::sqrt(d);
    a[j * n + j] = l;
    for (std::size_t i = j + 1; i < n; ++i) {
      double s = a[i * n + j];
      for (std::size_t k = 0; k < j; ++k) s -= a[i * n + k] * a[j * n + k];
      a[i * n + j] = s / l;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {  // L y = b
    double s = b[i];
    for (std::size_t k = 0; k < i; ++k) s -= a[i * n + k] * b[k];
    b[i] = s / a[i * n + i];
  }
  for (std::size_t i = n; i-- > 0;) {  // L^T x = y
    double s = b[i];
    for (std::size_t k = i + 1; k < n; ++k) s -= a[k * n + i] * b[k];
    b[i] = s / a[i * n + i];
  }
  return true;
}

}  // namespace

void CostProfile::reset() {
  m_batch = m_devices = 0;
  for (auto& step : m_ring) step.clear();
  m_ring_size = m_ring_next = 0;
  m_pair_weight.clear(), m_pair_sum.clear(), m_log_speed.clear();
  m_cost.clear(), m_speed.clear();
  m_err_profile = m_err_flat = -1;
  m_active = false;
}

bool CostProfile::active(std::size_t batch, std::size_t devices) const noexcept {
  return m_active && batch == m_batch && devices == m_devices && m_cost.size() == batch && m_speed.size() == devices;
}

void CostProfile::observe(std::size_t batch, std::size_t devices, std::span<const ChunkTime> chunks, std::span<const double> flat_speeds) {
  m_active = false;
  if (devices == 0 || devices > kMaxDevices || batch == 0) {
    reset();
    return;
  }
  const std::size_t n = devices;
  if (n != m_devices) {
    reset();
    m_devices = n;
    m_pair_weight.assign(n * n, 0.0), m_pair_sum.assign(n * n, 0.0), m_log_speed.assign(n, 0.0);
  }
  if (batch != m_batch) {  // positions of another batch size are other positions
    m_batch = batch;
    for (auto& step : m_ring) step.clear();
    m_ring_size = m_ring_next = 0;
    m_cost.clear(), m_speed.clear();
  }

  score_models(batch, chunks, flat_speeds);
  add_pairs(batch, chunks);
  // Where samples/s already predicts the chunk times (equal sample costs), the profile cannot be used for the next
  // placement anyway: the pairs above keep accumulating, and the fit and the costs wait, as they stood, until samples/s
  // is off (the first step after that compares against them, the next against a fresh fit).
  if (m_err_flat >= 0 && m_err_flat <= kFlatErrorFloor) return;

  bool connected = false;
  if (!fit_speeds(connected)) return reset();
  bool unseen = false;
  if (!fit_costs(batch, unseen)) return reset();
  m_active = connected && !unseen && m_err_flat > kFlatErrorFloor && m_err_profile >= 0 && m_err_profile < kMustBeBetter * m_err_flat;
}

bool CostProfile::valid(const ChunkTime& c, std::size_t batch) const noexcept {
  return c.seconds > 0 && std::isfinite(c.seconds) && c.size > 0 && c.device < m_devices && std::size_t{c.begin} + c.size <= batch;
}

void CostProfile::score_models(std::size_t batch, std::span<const ChunkTime> chunks, std::span<const double> flat_speeds) {
  const std::size_t n = m_devices;
  // 1. Out of sample: how well each model, as it stood, predicted this step's chunk times.
  m_err_profile = m_err_flat = -1;
  bool flat_known = flat_speeds.size() == n;
  for (double v : flat_speeds) flat_known = flat_known && v > 0 && std::isfinite(v);
  if (flat_known && m_cost.size() == batch && m_speed.size() == n) {
    std::vector<double> before(batch + 1, 0.0);  // prefix sums of the costs: a chunk's cost in O(1)
    for (std::size_t x = 0; x < batch; ++x) before[x + 1] = before[x] + m_cost[x];
    double ep = 0, ef = 0;
    std::size_t k = 0;
    for (const ChunkTime& c : chunks) {
      if (!valid(c, batch)) continue;
      const double cost = before[c.begin + c.size] - before[c.begin];
      const double lp = std::log(c.seconds * m_speed[c.device] / std::max(cost, 1e-300));
      const double lf = std::log(c.seconds * flat_speeds[c.device] / c.size);
      ep += lp * lp, ef += lf * lf, ++k;
    }
    if (k > 0) m_err_profile = ep / static_cast<double>(k), m_err_flat = ef / static_cast<double>(k);
  }

}

void CostProfile::add_pairs(std::size_t batch, std::span<const ChunkTime> chunks) {
  const std::size_t n = m_devices;
  // 2. Pairs: positions this step ran on device d that an earlier step ran on d': their times per sample differ
  // by log speed(d) - log speed(d') when the positions cost the same both times. Chunk against chunk (two sorted
  // lists of ranges, merged), weighted by the positions they share; kept one-sided here (row d only), the system
  // below adds both directions.
  std::vector<Seen> now;
  now.reserve(chunks.size());
  for (const ChunkTime& c : chunks) {
    if (!valid(c, batch)) continue;
    const double tau = c.seconds / c.size;
    now.push_back({c.begin, c.begin + c.size, c.device, tau, std::log(tau)});
  }
  std::sort(now.begin(), now.end(), [](const Seen& a, const Seen& b) { return a.begin < b.begin; });
  for (double& w : m_pair_weight) w *= kDecay;
  for (double& s : m_pair_sum) s *= kDecay;
  for (std::size_t k = 0; k < m_ring_size; ++k) {
    const std::vector<Seen>& then = m_ring[k];
    for (std::size_t i = 0, j = 0; i < now.size() && j < then.size();) {
      const Seen &a = now[i], &b = then[j];
      const std::uint32_t lo = std::max(a.begin, b.begin), hi = std::min(a.end, b.end);
      if (hi > lo && a.device != b.device) {
        const double w = hi - lo;
        m_pair_weight[std::size_t{a.device} * n + b.device] += w;
        m_pair_sum[std::size_t{a.device} * n + b.device] += w * (b.log_tau - a.log_tau);  // log speed(a) - log speed(b)
      }
      (a.end <= b.end ? i : j) += 1;
    }
  }
  m_ring[m_ring_next] = std::move(now);  // this step joins the last kRing
  m_ring_next = (m_ring_next + 1) % kRing;
  m_ring_size = std::min(m_ring_size + 1, kRing);

}

bool CostProfile::fit_speeds(bool& connected) {
  const std::size_t n = m_devices;
  // 3. The log speeds: minimize sum over pairs of w (phi_d - phi_d' - mean difference)^2, a Laplacian system.
  // The fit fixes speeds only up to a common factor, and only within a connected set of devices: a tiny pull
  // towards the last solution pins the common factor, and a graph in pieces leaves the profile unused.
  std::vector<bool> seen(n, false);
  std::vector<std::size_t> stack{0};
  seen[0] = true;
  std::size_t reached = 1;
  while (!stack.empty()) {
    const std::size_t d = stack.back();
    stack.pop_back();
    for (std::size_t e = 0; e < n; ++e) {
      if (!seen[e] && m_pair_weight[d * n + e] + m_pair_weight[e * n + d] > 0) seen[e] = true, ++reached, stack.push_back(e);
    }
  }
  connected = reached == n;
  std::vector<double> a(n * n, 0.0), b(n, 0.0);
  double trace = 0;
  for (std::size_t d = 0; d < n; ++d) {
    for (std::size_t e = 0; e < n; ++e) {
      if (e == d) continue;
      const double w = m_pair_weight[d * n + e] + m_pair_weight[e * n + d];
      a[d * n + e] = -w;
      a[d * n + d] += w;
      b[d] += m_pair_sum[d * n + e] - m_pair_sum[e * n + d];
    }
    trace += a[d * n + d];
  }
  const double pull = 1e-9 * trace / static_cast<double>(n) + 1e-12;
  for (std::size_t d = 0; d < n; ++d) a[d * n + d] += pull, b[d] += pull * m_log_speed[d];
  if (!cholesky_solve(a, b, n)) return false;
  const double mean = std::accumulate(b.begin(), b.end(), 0.0) / static_cast<double>(n);
  for (std::size_t d = 0; d < n; ++d) m_log_speed[d] = b[d] - mean;

  return true;
}

bool CostProfile::fit_costs(std::size_t batch, bool& unseen) {
  const std::size_t n = m_devices;
  // 4. Costs: each position's recent times per sample times the speed of the device that ran them, mean 1.
  std::vector<double> speed(n);
  for (std::size_t d = 0; d < n; ++d) speed[d] = std::exp(m_log_speed[d]);
  // Sums over the ranges as difference arrays (O(chunks + batch)): each range adds its cost and a count from its
  // first position and takes them back after its last.
  std::vector<double> add(batch + 1, 0.0);
  std::vector<int> count(batch + 1, 0);
  for (std::size_t k = 0; k < m_ring_size; ++k) {
    for (const Seen& c : m_ring[k]) {
      const double cost = c.tau * speed[c.device];
      add[c.begin] += cost, add[c.end] -= cost, ++count[c.begin], --count[c.end];
    }
  }
  std::array<double, kRing + 1> inverse{};  // a position is seen at most once a step, so at most kRing times
  for (std::size_t k = 1; k <= kRing; ++k) inverse[k] = 1.0 / static_cast<double>(k);
  m_cost.assign(batch, 0.0);
  double total = 0, running = 0;
  int times = 0;
  for (std::size_t x = 0; x < batch; ++x) {
    running += add[x], times += count[x];
    if (times <= 0 || times > static_cast<int>(kRing)) {
      unseen = true;  // never seen, or (more than kRing) chunks of one step that overlap: no profile to place by
      continue;
    }
    m_cost[x] = std::max(0.0, running) * inverse[static_cast<std::size_t>(times)];
    total += m_cost[x];
  }
  if (!(total > 0) || !std::isfinite(total)) return false;
  const double scale = static_cast<double>(batch) / total;
  for (double& c : m_cost) c *= scale;
  m_speed.resize(n);
  for (std::size_t d = 0; d < n; ++d) {
    m_speed[d] = speed[d] * scale;
    if (!std::isfinite(m_speed[d]) || !(m_speed[d] > 0)) return false;  // a fit thrown off by absurd times: start over
  }
  return true;
}

std::vector<std::pair<std::uint32_t, std::uint32_t>> split_by_cost(std::span<const double> costs, std::span<const double> weights) {
  const double wsum = std::accumulate(weights.begin(), weights.end(), 0.0);
  const double total = std::accumulate(costs.begin(), costs.end(), 0.0);
  std::vector<std::pair<std::uint32_t, std::uint32_t>> out(weights.size());
  std::size_t at = 0;
  double before = 0, wanted = 0;  // the cost of [0, at), and the cumulative share up to this device
  for (std::size_t d = 0; d < weights.size(); ++d) {
    wanted += weights[d] / wsum * total;
    const std::size_t begin = at;
    if (d + 1 == weights.size()) {
      at = costs.size();
    } else {
      // Take a position while that leaves the cumulative cost nearer the wanted one.
      while (at < costs.size() && before + costs[at] / 2 < wanted) before += costs[at++];
    }
    out[d] = {static_cast<std::uint32_t>(begin), static_cast<std::uint32_t>(at)};
  }
  return out;
}

void cut_share(std::uint32_t begin, std::uint32_t end, double target, double floor, std::span<const double> costs,
               std::vector<std::uint32_t>& sizes, bool hard_floor) {
  auto cost = [&](std::uint32_t x) { return costs.empty() ? 1.0 : costs[x]; };
  double left = 0;
  for (std::uint32_t x = begin; x < end; ++x) left += cost(x);
  for (std::uint32_t at = begin; at < end;) {
    double want = left > kTailChunks * target ? target : std::max(floor, costs.empty() ? std::ceil(left / kTailChunks) : left / kTailChunks);
    if (hard_floor && left - want < floor) want = left;
    std::uint32_t size = 0;
    double got = 0;
    // At least one position; then a position while that leaves the chunk's cost nearer the wanted one.
    while (at + size < end && (size == 0 || got + cost(at + size) / 2 < want)) got += cost(at + size++);
    sizes.push_back(size);
    at += size;
    left -= got;
  }
}

}  // namespace stealbatch::detail

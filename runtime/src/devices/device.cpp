// The host replica every CPU and simulated device keeps: parameters, gradient sum and optimizer state in memory.
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/device.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>

namespace stealbatch {

void check_in_flight(std::size_t in_flight) {
  if (in_flight < 1 || in_flight > kMaxInFlight) {
    throw ConfigError("in_flight = " + std::to_string(in_flight) + "; valid range is [1, " + std::to_string(kMaxInFlight) + "]");
  }
}

void Device::init_replica(std::span<const float> initial, const OptimizerOptions& options) {
  m_params.assign(initial.begin(), initial.end());
  m_grad.assign(initial.size(), 0.0f);
  m_optimizer = std::make_unique<Optimizer>(options, initial.size());
  m_shares = false, m_shared_params = {};
}

void Device::share_replica(std::span<const float> shared_params) {
  m_params.clear(), m_params.shrink_to_fit();
  m_optimizer.reset();
  m_grad.assign(shared_params.size(), 0.0f);
  m_shares = true, m_shared_params = shared_params;
}

void Device::zero_grad() { std::fill(m_grad.begin(), m_grad.end(), 0.0f); }

void Device::apply_update(float grad_scale) {
  if (m_shares) throw std::logic_error(name() + ": apply_update() on a device that shares the runtime's parameters");
  m_optimizer->step(m_params, m_grad, grad_scale);
  zero_grad();
}

void Device::set_lr(float lr) {
  if (m_shares) throw std::logic_error(name() + ": set_lr() on a device that shares the runtime's parameters");
  m_optimizer->set_lr(lr);
}

OptimizerState Device::optimizer_state() const {
  if (m_shares) throw std::logic_error(name() + ": optimizer_state() on a device that shares the runtime's parameters");
  const auto first = m_optimizer->first_moment(), second = m_optimizer->second_moment();
  return {{first.begin(), first.end()}, {second.begin(), second.end()}, m_optimizer->steps()};
}

void Device::load_replica(std::span<const float> params, const OptimizerState& state) {
  if (m_shares) throw std::logic_error(name() + ": load_replica() on a device that shares the runtime's parameters");
  if (params.size() != m_params.size()) throw std::logic_error(name() + ": load_replica() with " + std::to_string(params.size()) + " parameters");
  m_optimizer->restore(state.first, state.second, state.steps);
  m_params.assign(params.begin(), params.end());
}

void Device::copy_params(std::span<float> out) const {
  const std::span<const float> p = params();
  std::copy(p.begin(), p.end(), out.begin());
}

void Device::copy_grad(std::span<float> out) const { std::copy(m_grad.begin(), m_grad.end(), out.begin()); }

void Device::add_cell_fixed(std::span<const std::size_t>, std::span<const int>) {
  throw std::logic_error(name() + ": add_cell_fixed() on a device whose cells the runtime sums");
}
long Device::take_cells_fixed(std::span<std::int64_t>, std::span<int>) {
  throw std::logic_error(name() + ": take_cells_fixed() on a device whose cells the runtime sums");
}
void Device::load_grad(std::span<const float>) { throw std::logic_error(name() + ": load_grad() on a device whose cells the runtime sums"); }

void Device::cancel() {
  {
    const std::lock_guard lock(m_cancel_mutex);
    m_cancelled = true;
  }
  m_cancel_cv.notify_all();
}

void Device::reset_cancel() {
  const std::lock_guard lock(m_cancel_mutex);
  m_cancelled = false;
}

bool Device::sleep_until_or_cancel(std::chrono::steady_clock::time_point until) {
  // A deadline already past returns at once: a timed wait that has expired still costs a trip through the
  // kernel's timers, tens of microseconds.
  if (until != std::chrono::steady_clock::time_point::max() && until <= std::chrono::steady_clock::now()) {
    const std::lock_guard lock(m_cancel_mutex);
    return !m_cancelled;
  }
  std::unique_lock lock(m_cancel_mutex);
  if (until == std::chrono::steady_clock::time_point::max()) {
    m_cancel_cv.wait(lock, [&] { return m_cancelled; });
    return false;
  }
  return !m_cancel_cv.wait_until(lock, until, [&] { return m_cancelled; });
}

bool Device::sleep_precisely_until_or_cancel(std::chrono::steady_clock::time_point until,
                                             std::chrono::nanoseconds spin) {
  using std::chrono::steady_clock;
  if (until == steady_clock::time_point::max()) return sleep_until_or_cancel(until);
  if (until - spin > steady_clock::now() && !sleep_until_or_cancel(until - spin)) return false;
  while (steady_clock::now() < until) {
    {
      const std::lock_guard lock(m_cancel_mutex);
      if (m_cancelled) return false;
    }
    std::this_thread::yield();
  }
  const std::lock_guard lock(m_cancel_mutex);
  return !m_cancelled;
}

void* Device::workspace(std::size_t bytes) {
  if (m_workspace.size() < bytes) m_workspace.resize(bytes);
  return m_workspace.data();
}

DeviceCallTime Device::call_time(const ChunkContext& ctx, double seconds) noexcept {
  ChunkId lowest = ctx.chunk;
  for (ChunkId c : ctx.chunks) lowest = std::min(lowest, c);
  return {.first = lowest, .chunks = static_cast<std::uint32_t>(std::max<std::size_t>(ctx.chunks.size(), 1)), .seconds = seconds};
}

}  // namespace stealbatch

// The in-process AllReduce (each device's worker reduces its own slice across all devices and writes it back), and the
// simulated ring's time.
#include <stealbatch/runtime/communicator.hpp>

#include <algorithm>

namespace stealbatch {

void InProcessCommunicator::sum_slice(std::size_t device, std::span<float* const> buffers, std::size_t count) noexcept {
  const std::size_t n = buffers.size();
  if (n <= 1 || count == 0) return;  // one device: nothing to reduce
  const auto [begin, end] = slice(device, n, count);
  float* out = buffers[0];
  for (std::size_t d = 1; d < n; ++d) {
    const float* in = buffers[d];
    for (std::size_t i = begin; i < end; ++i) out[i] += in[i];
  }
}

void InProcessCommunicator::allreduce_sum(std::size_t device, std::span<float* const> buffers, std::size_t count) {
  const std::size_t n = buffers.size();
  if (n <= 1 || count == 0) return;
  sum_slice(device, buffers, count);
  const auto [begin, end] = slice(device, n, count);
  for (std::size_t d = 1; d < n; ++d) std::copy(buffers[0] + begin, buffers[0] + end, buffers[d] + begin);
}

SimRingCommunicator::SimRingCommunicator(std::size_t devices, double bytes, double busbw, double latency)
    : m_seconds(devices > 1 && bytes > 0 ? 2.0 * (static_cast<double>(devices) - 1.0) / static_cast<double>(devices) * bytes / busbw + latency : 0.0),
      m_ready(devices) {}

std::chrono::nanoseconds SimRingCommunicator::wait_for_model(std::size_t device, std::chrono::steady_clock::time_point ready, Device& on) {
  if (m_seconds <= 0) return {};
  m_ready[device] = ready;
  // acq_rel: each worker's ready time, written before its increment, is visible to the worker whose increment is the
  // last one (a release sequence on one counter); a step that fails before it is never the last.
  if (m_arrived.fetch_add(1, std::memory_order_acq_rel) + 1 != m_ready.size()) return {};
  const auto latest = *std::max_element(m_ready.begin(), m_ready.end());
  const auto s0 = std::chrono::steady_clock::now();
  on.sleep_precisely_until_or_cancel(latest + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(m_seconds)));
  return std::chrono::steady_clock::now() - s0;
}

}  // namespace stealbatch

// The in-process AllReduce: each device's worker reduces its own slice across all devices and writes it back.
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

}  // namespace stealbatch

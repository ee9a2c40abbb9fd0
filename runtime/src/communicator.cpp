// The in-process AllReduce: each device's worker reduces its own slice across all devices and writes it back.
#include <stealbatch/runtime/communicator.hpp>

#include <algorithm>

namespace stealbatch {

void InProcessCommunicator::allreduce_sum(std::size_t device, std::span<float* const> buffers, std::size_t count) {
  const std::size_t n = buffers.size();
  if (n <= 1 || count == 0) return;  // one device: nothing to reduce
  const std::size_t begin = count * device / n, end = count * (device + 1) / n;
  float* out = buffers[0];
  for (std::size_t d = 1; d < n; ++d) {
    const float* in = buffers[d];
    for (std::size_t i = begin; i < end; ++i) out[i] += in[i];
  }
  for (std::size_t d = 1; d < n; ++d) std::copy(out + begin, out + end, buffers[d] + begin);
}

}  // namespace stealbatch

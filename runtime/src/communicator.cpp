// The in-process AllReduce: a parallel, fixed-order sum into the first buffer, then copies to the others.
#include <stealbatch/runtime/communicator.hpp>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>

namespace stealbatch {

void InProcessCommunicator::allreduce_sum(std::span<float* const> buffers, std::size_t count) {
  if (buffers.size() <= 1 || count == 0) return;  // one device: nothing to reduce
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, count, 16384), [&](const tbb::blocked_range<std::size_t>& r) {
    float* out = buffers[0];
    for (std::size_t d = 1; d < buffers.size(); ++d) {
      const float* in = buffers[d];
      for (std::size_t i = r.begin(); i < r.end(); ++i) out[i] += in[i];
    }
    for (std::size_t d = 1; d < buffers.size(); ++d) std::copy(out + r.begin(), out + r.end(), buffers[d] + r.begin());
  });
}

}  // namespace stealbatch

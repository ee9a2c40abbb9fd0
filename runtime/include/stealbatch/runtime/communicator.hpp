// The reduction at the end of a step: every device's gradient buffer ends up holding the sum over all devices.
#pragma once

#include <cstddef>
#include <span>

namespace stealbatch {

class Communicator {
 public:
  virtual ~Communicator() = default;
  // An in-place AllReduce (sum): afterwards every buffer holds the element-wise sum of all of them.
  virtual void allreduce_sum(std::span<float* const> buffers, std::size_t count) = 0;
};

// Devices in one process that share host memory (CPU and simulated devices). The sum runs in parallel over the
// buffer, adding the devices in a fixed order for every element, so the result does not depend on the threads.
//
//   InProcessCommunicator comm;
//   comm.allreduce_sum(grad_pointers, layout.size());
class InProcessCommunicator final : public Communicator {
 public:
  void allreduce_sum(std::span<float* const> buffers, std::size_t count) override;
};

}  // namespace stealbatch

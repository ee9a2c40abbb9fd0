// The reduction at the end of a step: every device's gradient buffer ends up holding the sum over all devices.
#pragma once

#include <cstddef>
#include <span>
#include <utility>

namespace stealbatch {

// An in-place AllReduce (sum) over one buffer per device. Every device's worker thread calls allreduce_sum once
// per step, concurrently, with its own device index (the way one thread per GPU calls ncclAllReduce on its own
// communicator); when every call has returned, every buffer holds the element-wise sum of all of them.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual void allreduce_sum(std::size_t device, std::span<float* const> buffers, std::size_t count) = 0;
  // Called once per step from the runtime's thread after every allreduce_sum call has returned: for a collective
  // issued from one thread for all local devices (NCCL's group call). The default does nothing.
  virtual void allreduce_all(std::span<float* const> /*buffers*/, std::size_t /*count*/) {}
  // The stall watchdog's last resort: make a reduction that will never finish return (NCCL: ncclCommAbort), from
  // another thread than the one waiting. Returns whether the communicator can still reduce afterwards.
  virtual bool abort() noexcept { return true; }
  // Whether abort() leaves the communicator usable (for the TimeoutError's message, before aborting).
  virtual bool survives_abort() const noexcept { return true; }
};

// Devices in one process that share host memory (CPU and simulated devices). Device d sums slice d of the buffer
// over all devices, in device order, and writes the sum into that slice of every buffer: the result does not
// depend on the threads' timing, and no slice is touched by two callers.
//
//   InProcessCommunicator comm;
//   sched.broadcast([&](std::size_t d) { comm.allreduce_sum(d, grad_pointers, layout.size()); });
class InProcessCommunicator final : public Communicator {
 public:
  void allreduce_sum(std::size_t device, std::span<float* const> buffers, std::size_t count) override;
  // Device `device`'s slice of the buffers: [count x device / n, count x (device + 1) / n).
  static std::pair<std::size_t, std::size_t> slice(std::size_t device, std::size_t n, std::size_t count) noexcept {
    return {count * device / n, count * (device + 1) / n};
  }
  // The first half of allreduce_sum(): the sum of the device's slice over all buffers, in device order, left in
  // buffers[0] only (for a caller that consumes it there: the runtime's update of shared host parameters).
  static void sum_slice(std::size_t device, std::span<float* const> buffers, std::size_t count) noexcept;
};

}  // namespace stealbatch

// The reduction at the end of a step: every device's gradient buffer ends up holding the sum over all devices.
#pragma once

#include <stealbatch/runtime/device.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

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

  // A reduction whose time is modelled rather than spent (simulated devices): model_seconds() per step, during which
  // every device counts as busy. Each device's worker calls wait_for_model() once per step, in the reduction phase,
  // with the time its last chunk ended; it returns how long that worker slept out the model for all. The runtime
  // calls begin_step() between steps. By default there is no model.
  virtual double model_seconds() const noexcept { return 0; }
  virtual void begin_step() noexcept {}
  virtual std::chrono::nanoseconds wait_for_model(std::size_t /*device*/, std::chrono::steady_clock::time_point /*ready*/, Device& /*on*/) {
    return {};
  }
};

// Devices in one process that share host memory (CPU and simulated devices). Device d sums slice d of the buffer
// over all devices, in device order, and writes the sum into that slice of every buffer: the result does not
// depend on the threads' timing, and no slice is touched by two callers.
//
//   InProcessCommunicator comm;
//   sched.broadcast([&](std::size_t d) { comm.allreduce_sum(d, grad_pointers, layout.size()); });
class InProcessCommunicator : public Communicator {
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

namespace stealbatch {

// Simulated devices' AllReduce: the in-process sum, plus the time a ring AllReduce of `bytes` would take among them,
// 2 (n - 1) / n * bytes / busbw + latency (nccl-tests' bus bandwidth model). It starts when the last device is ready
// and ends the same time later for all; the last worker to arrive sleeps it out for all (precisely: its lateness would
// be the whole step's), the others go on.
//
//   SimRingCommunicator comm(8, /*bytes=*/940e3, /*busbw=*/100e9, /*latency=*/10e-6);
class SimRingCommunicator final : public InProcessCommunicator {
 public:
  SimRingCommunicator(std::size_t devices, double bytes, double busbw, double latency);
  double model_seconds() const noexcept override { return m_seconds; }
  void begin_step() noexcept override { m_arrived.store(0, std::memory_order_relaxed); }  // published by the next step's hand-off
  std::chrono::nanoseconds wait_for_model(std::size_t device, std::chrono::steady_clock::time_point ready, Device& on) override;

 private:
  double m_seconds;
  std::vector<std::chrono::steady_clock::time_point> m_ready;  // each written by its own worker only
  std::atomic<std::size_t> m_arrived{0};
};

}  // namespace stealbatch

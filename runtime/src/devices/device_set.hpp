// The runtime's devices: each live device with its step's tallies (Replica) and its index at the runtime's creation,
// and the devices lost during the run, kept until the runtime goes (their workers may still hold pointers to them
// until the scheduler is rebuilt). Invariant: devices, replicas and ids have one entry per live device, in the same
// order; a device's position is its worker's index in the scheduler.
#pragma once

#include "step/step_types.hpp"

#include <stealbatch/runtime/device.hpp>
#include <stealbatch/runtime/device_spec.hpp>
#include <stealbatch/runtime/runtime.hpp>
#include <stealbatch/scheduler/detail/atomics.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace stealbatch {

// A device's tallies for this step (the replica itself lives in the Device). Aligned so that two devices' tallies
// never share a cache line.
struct alignas(detail::kCacheLine) Replica {
  double loss = 0;
  std::uint64_t samples = 0;
  // How long finish_chunks() waited this step for chunks still in flight (a GPU, a simulated device): device time
  // of this step's chunks that the worker's busy time in the chunk phase does not hold. And when it returned: the
  // device's chunks were all done then, and the chunk phase lasts until every device's were (step_report.cpp).
  Clock::duration finish{};
  Clock::time_point drained{};
  Clock::time_point device_end{};  // the end of the device's last chunk this step, on its own timeline (if it keeps one)
  Clock::duration update{};         // its part of the fused update this step (shared host parameters)
  Clock::duration model_wait{};     // how long it slept out a modelled reduction for all (0 for all but one)
  double live_factor = 1.0;         // this step: how much slower than measured its own chunks now run
  double last_ratio = 0.0;          // this step: its last own chunk's time over what its measured speed predicted
  // The stall watchdog's view, written by the device's worker and read by the caller's thread: when the chunk
  // now running started (ns since the runtime's creation; 0 when none runs), and which chunk. Relaxed: a timer
  // that may read a value a moment old, nothing is published through it.
  std::atomic<std::int64_t> chunk_started_ns{0};
  std::atomic<ChunkId> current_chunk{0};

  void reset_step() noexcept {
    loss = 0, samples = 0, finish = {}, drained = {}, device_end = {}, live_factor = 1.0, last_ratio = 0.0, model_wait = {};
  }
};

// Marks a device as busy (in chunk `what`, or kReductionPhase) for the stall watchdog, for the stamp's lifetime.
// Relaxed stores: see Replica.
struct WatchStamp {
  std::atomic<std::int64_t>& started;
  WatchStamp(Replica& r, ChunkId what, Clock::time_point epoch, Clock::time_point now = Clock::now()) : started(r.chunk_started_ns) {
    r.current_chunk.store(what, std::memory_order_relaxed);
    started.store(std::max<std::int64_t>(1, (now - epoch).count()), std::memory_order_relaxed);
  }
  ~WatchStamp() { started.store(0, std::memory_order_relaxed); }
  WatchStamp(const WatchStamp&) = delete;
  WatchStamp& operator=(const WatchStamp&) = delete;
};

struct DeviceSet {
  DeviceKind kind = DeviceKind::kCpu;
  std::shared_ptr<DeviceBackend> backend;
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<std::unique_ptr<Replica>> replicas;
  std::vector<std::size_t> ids;               // each device's index at creation (stable across exclusions)
  std::vector<std::unique_ptr<Device>> lost;  // excluded devices
  // CPU or simulated devices: one address space with the host, and a chunk's time is known when its call returns.
  bool host = false;
  // Devices that time each call on their own clock (GPUs, by events): a chunk's time is known after the chunk phase.
  bool times_calls = false;
  // Devices that sleep through their chunks (simulated): the host's cores are free while they run.
  bool leaves_cores_idle = false;

  // Takes the devices the backend made for `spec` (at least one), with a fresh replica and its index each.
  void adopt(DeviceKind k, std::shared_ptr<DeviceBackend> b, std::vector<std::unique_ptr<Device>> made);
  // Device `position` is lost: it leaves the live lists (its replica with it) and is kept in `lost`. The positions
  // after it move down by one; ids keep naming the devices as they were created.
  void exclude(std::size_t position);
  std::size_t size() const noexcept { return devices.size(); }
  // The devices this runtime ever had: the trace's lane for runtime-wide events comes after theirs.
  std::size_t ever() const noexcept { return ids.size() + lost.size(); }
  std::vector<Device*> raw() const;
};

}  // namespace stealbatch

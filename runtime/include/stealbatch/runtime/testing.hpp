// Hooks for tests and the soak (perf/soak.cpp): faults injected into a runtime's chunks. Not for training.
#pragma once

#include <stealbatch/runtime/runtime.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace stealbatch::testing {

// What happens to a chunk: kThrow, its function throws; kStall, it never completes (until the stall watchdog cancels
// it); kDeviceLoss, its device dies before running it.
enum class Fault { kNone, kThrow, kStall, kDeviceLoss };

// Called on the device's worker before each chunk, with the device's index at the runtime's creation; what it returns
// happens to the chunk.
using FaultInjector = std::function<Fault(std::size_t device, std::uint64_t step, ChunkId chunk)>;

struct RuntimeAccess {
  static void inject_faults(Runtime& rt, FaultInjector f);
};

// From the next step on, every chunk of `rt` asks `f` first (empty: no faults). Call it between steps.
inline void inject_faults(Runtime& rt, FaultInjector f) { RuntimeAccess::inject_faults(rt, std::move(f)); }

}  // namespace stealbatch::testing

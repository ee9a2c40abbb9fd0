// The cores this process may run on: its CPU affinity mask (what a launcher's binding, a container's or a batch
// system's cpuset, or taskset leaves it), not the machine's count. Used wherever the runtime and the examples size
// their threads, so that ranks bound to a few cores do not start a thread for every core of the machine.
#pragma once

#include <algorithm>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

namespace stealbatch {

inline unsigned usable_cores() noexcept {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<unsigned>(n);
  }
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace stealbatch

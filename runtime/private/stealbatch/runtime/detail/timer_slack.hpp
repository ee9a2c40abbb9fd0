// Makes the calling thread's sleeps end on time: the devices that emulate slowness or device time sleep a lot.
#pragma once

#include <chrono>
#include <cstddef>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

namespace stealbatch::detail {

// Linux lets a sleeping thread oversleep by its timer slack, 50 us by default, to batch wake-ups. A simulated
// chunk of 100 us would then last 150 us. 1 us keeps the emulated times within a few microseconds.
inline void tighten_timer_slack() noexcept {
#if defined(__linux__)
  (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
#endif
}

// How late `n` sleeps of `period` each wake, in microseconds, with the timer slack tightened as above: what a
// simulated device's chunk can overshoot by on this machine.
inline std::vector<double> sleep_overshoots_us(int n, std::chrono::microseconds period) {
  tighten_timer_slack();
  std::vector<double> over;
  over.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const auto due = std::chrono::steady_clock::now() + period;
    std::this_thread::sleep_until(due);
    over.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - due).count());
  }
  return over;
}

}  // namespace stealbatch::detail

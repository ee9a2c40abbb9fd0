// Makes the calling thread's sleeps end on time: the devices that emulate slowness or device time sleep a lot.
#pragma once

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

}  // namespace stealbatch::detail

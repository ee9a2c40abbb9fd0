// CpuDevice: the chunk runs inside the device's arena; a slowdown idles the device after the chunk.
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/detail/timer_slack.hpp>
#include <stealbatch/runtime/cpu_device.hpp>

#include <tbb/task_arena.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <string>
#include <thread>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace stealbatch {

namespace {

// CPU time consumed so far by the calling thread.
std::chrono::nanoseconds thread_cpu_time() noexcept {
  timespec ts{};
  (void)clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

// Asks the kernel for a short scheduling slice for the calling thread (Linux 6.12 and later, EEVDF: a SCHED_OTHER
// thread's sched_runtime is its slice; older kernels ignore the field). A thread with a shorter slice gets an
// earlier virtual deadline, so when it wakes it takes a core from a thread that has been computing for a while.
void request_short_slice() noexcept {
#if defined(__linux__) && defined(SYS_sched_setattr) && defined(SYS_sched_getattr)
  struct {  // the kernel's struct sched_attr (glibc has no wrapper; <linux/sched/types.h> clashes with <sched.h>)
    std::uint32_t size, sched_policy;
    std::uint64_t sched_flags;
    std::int32_t sched_nice;
    std::uint32_t sched_priority;
    std::uint64_t sched_runtime, sched_deadline, sched_period;
    std::uint32_t sched_util_min, sched_util_max;
  } attr{};
  // Read the thread's settings and change only the slice, and only under SCHED_OTHER (a thread the user put under
  // SCHED_BATCH, SCHED_IDLE or a real-time policy keeps it). Best effort: on any failure the default slice stays.
  if (syscall(SYS_sched_getattr, 0, &attr, static_cast<unsigned>(sizeof attr), 0U) != 0 || attr.sched_policy != 0) return;
  attr.size = sizeof attr;
  attr.sched_runtime = 100'000;  // ns: the shortest slice the kernel accepts
  (void)syscall(SYS_sched_setattr, 0, &attr, 0U);
#endif
}

}  // namespace

struct CpuDevice::Arena {
  explicit Arena(int threads) : arena(threads) {}
  tbb::task_arena arena;
};

CpuDevice::CpuDevice(std::size_t index, int threads, double slowdown) : m_index(index), m_threads(threads), m_slowdown(slowdown) {
  if (threads < 1) throw ConfigError("cpu device: threads = " + std::to_string(threads) + "; need at least 1");
  if (!std::isfinite(slowdown) || slowdown < 1.0) {
    throw ConfigError("cpu device: slowdown = " + std::to_string(slowdown) + "; need a finite factor >= 1");
  }
  m_arena = std::make_unique<Arena>(threads);
}

CpuDevice::~CpuDevice() = default;

void CpuDevice::bind() {
  detail::tighten_timer_slack();
  // A slowed device sleeps after each chunk and must get a core promptly when it wakes; queued behind the full-speed
  // devices' compute it loses the time it waits, which then stretches its chunks and step starts.
  if (m_slowdown > 1.0) request_short_slice();
}

std::string CpuDevice::name() const { return "cpu" + std::to_string(m_index); }

ChunkTiming CpuDevice::run_chunk(ChunkContext& ctx, const ChunkFunction& fn) {
  // With one thread, the chunk's compute time is the CPU time this thread spent in it: on a machine with fewer cores
  // than devices the wall time also holds the time the thread waited for a core. That is what the device reports
  // (ChunkTiming::compute_seconds, its slowdown included), and what a slowed device multiplies: multiplying the
  // wait would make the device far slower than asked. With more threads the work is spread over the arena's threads,
  // whose CPU time this thread does not see, so the wall time stands in. The clock reads are also a system call per
  // chunk, the preemption point of set_preemption_point(): on a kernel without full preemption (preempt=none or
  // lazy), a device thread that wakes while the others compute may wait for a core until the next timer tick (4 ms
  // at HZ=250), unless a running thread enters the kernel; entering it once per chunk hands the core over at the
  // chunk boundary instead.
  if (m_slowdown <= 1.0 && !m_compute_time) {
    m_arena->arena.execute([&] { fn(ctx); });
    if (m_preemption_point) (void)thread_cpu_time();
    return {};
  }
  const bool cpu_clock = m_threads == 1;
  const auto w0 = std::chrono::steady_clock::now();
  const auto c0 = cpu_clock ? thread_cpu_time() : std::chrono::nanoseconds(0);
  m_arena->arena.execute([&] { fn(ctx); });
  const auto compute = cpu_clock ? thread_cpu_time() - c0 : std::chrono::steady_clock::now() - w0;
  const ChunkTiming timing{.compute_seconds = std::chrono::duration<double>(compute).count() * m_slowdown};
  if (m_slowdown > 1.0) {
    // Slowed: the device idles for (slowdown - 1) x the chunk's compute time.
    sleep_until_or_cancel(std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(compute * (m_slowdown - 1.0)));
  }
  return timing;
}

}  // namespace stealbatch

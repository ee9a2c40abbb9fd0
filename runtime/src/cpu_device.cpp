// CpuDevice: the chunk runs inside the device's arena; a slowdown idles the device after the chunk.
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/detail/timer_slack.hpp>
#include <stealbatch/runtime/cpu_device.hpp>

#include <chrono>
#include <cmath>
#include <ctime>
#include <string>
#include <thread>

namespace stealbatch {

namespace {

// CPU time consumed so far by the calling thread.
std::chrono::nanoseconds thread_cpu_time() noexcept {
  timespec ts{};
  (void)clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

}  // namespace

CpuDevice::CpuDevice(std::size_t index, int threads, double slowdown)
    : m_index(index), m_threads(threads), m_slowdown(slowdown), m_arena(threads) {
  if (threads < 1) throw ConfigError("cpu device: threads = " + std::to_string(threads) + "; need at least 1");
  if (!std::isfinite(slowdown) || slowdown < 1.0) {
    throw ConfigError("cpu device: slowdown = " + std::to_string(slowdown) + "; need a finite factor >= 1");
  }
}

void CpuDevice::bind() { detail::tighten_timer_slack(); }

std::string CpuDevice::name() const { return "cpu" + std::to_string(m_index); }

void CpuDevice::run_chunk(ChunkContext& ctx, const ChunkFunction& fn) {
  // The chunk's compute time, for the slowdown: with one thread, the CPU time this thread spent in it. On a
  // machine with fewer cores than devices the wall time also holds the time the thread waited for a core, and
  // multiplying that wait by the slowdown makes the device far slower than asked (measured on 2 cores, cpu:4,
  // slowdown 6.6,6.6,1,1: the slowed threads waited for a core 30% of the time and took 4.4% of the samples
  // each instead of about 6.6%). With more threads the work is spread over the arena's threads, whose CPU time
  // this thread does not see, so the wall time stands in.
  const bool slowed = m_slowdown > 1.0;
  const auto w0 = std::chrono::steady_clock::now();
  const auto c0 = slowed ? thread_cpu_time() : std::chrono::nanoseconds(0);
  m_arena.execute([&] { fn(ctx); });
  // Reading the thread's CPU clock is a system call on every chunk, slowed or not, and that is on purpose: on a
  // kernel without full preemption (preempt=none or lazy), a device thread that wakes while the others compute
  // may wait for a core until the next timer tick (4 ms at HZ=250), unless a running thread enters the kernel.
  // Entering it once per chunk hands the core over at the chunk boundary instead. Measured on the 2-core build
  // machine (kernel 6.18, preempt=none), cpu:4 with slowdown 6.6,6.6,1,1 at batch 1024, three runs each: the
  // slowed devices' utilization 0.66-0.73 without it, 0.78-0.81 with it.
  const auto c1 = thread_cpu_time();
  if (!slowed) return;
  const auto compute = m_threads == 1 ? c1 - c0 : std::chrono::steady_clock::now() - w0;
  sleep_until_or_cancel(std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(compute * (m_slowdown - 1.0)));
}

}  // namespace stealbatch

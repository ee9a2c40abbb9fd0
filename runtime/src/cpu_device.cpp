// CpuDevice: the chunk runs inside the device's arena; a slowdown idles the device after the chunk.
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/detail/timer_slack.hpp>
#include <stealbatch/runtime/cpu_device.hpp>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>

namespace stealbatch {

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
  const auto t0 = std::chrono::steady_clock::now();
  m_arena.execute([&] { fn(ctx); });
  if (m_slowdown > 1.0) {
    const auto compute = std::chrono::steady_clock::now() - t0;
    sleep_until_or_cancel(std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(compute * (m_slowdown - 1.0)));
  }
}

}  // namespace stealbatch

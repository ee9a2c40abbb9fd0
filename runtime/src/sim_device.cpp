// SimDevice: the chunk's simulated duration is samples * sample_seconds / speed, slept out after the real work.
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/detail/timer_slack.hpp>
#include <stealbatch/runtime/sim_device.hpp>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>

namespace stealbatch {

SimDevice::SimDevice(std::size_t index, double speed, double sample_seconds, std::function<double(std::uint32_t)> sample_cost)
    : m_index(index), m_speed(speed), m_sample_seconds(sample_seconds), m_sample_cost(std::move(sample_cost)) {
  if (!std::isfinite(speed) || !(speed > 0)) throw ConfigError("sim device: speed = " + std::to_string(speed) + "; need a finite value > 0");
  if (!std::isfinite(sample_seconds) || sample_seconds < 0 || sample_seconds > 1) {
    throw ConfigError("sim_sample_seconds = " + std::to_string(sample_seconds) + "; valid range is [0, 1]");
  }
}

void SimDevice::bind() { detail::tighten_timer_slack(); }

std::string SimDevice::name() const { return "sim" + std::to_string(m_index); }

void SimDevice::begin_step(std::uint64_t step, std::chrono::steady_clock::time_point start) {
  m_step = step;
  m_step_start = start;
}

void SimDevice::run_chunk(ChunkContext& ctx, const ChunkFunction& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  double speed = m_speed;
  if (m_factor) {
    const double f = m_factor(m_step, std::chrono::duration<double>(t0 - m_step_start).count());
    if (std::isfinite(f) && f > 0) speed *= f;
  }
  fn(ctx);
  double work = static_cast<double>(ctx.samples.size());
  if (m_sample_cost) {
    work = 0;
    for (std::uint32_t s : ctx.samples) work += m_sample_cost(s);
  }
  double seconds = work * m_sample_seconds / speed;
  if (ctx.home_device != m_index && m_bytes_per_sample > 0) {
    seconds += m_bytes_per_sample * static_cast<double>(ctx.samples.size()) / m_link_bw + m_latency;
  }
  const auto due = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  sleep_until_or_cancel(due);
}

}  // namespace stealbatch

// SimDevice: the chunk's simulated duration is call_seconds + samples * sample_seconds / speed, slept out after the real work.
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/detail/timer_slack.hpp>
#include <stealbatch/runtime/sim_device.hpp>

#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>

namespace stealbatch {

SimDevice::SimDevice(std::size_t index, double speed, double sample_seconds, std::function<double(std::uint32_t)> sample_cost)
    : m_index(index), m_speed(speed), m_sample_seconds(sample_seconds), m_sample_cost(std::move(sample_cost)) {
  if (!std::isfinite(speed) || !(speed > 0)) throw ConfigError("sim device: speed = " + std::to_string(speed) + "; need a finite value > 0");
  if (!std::isfinite(sample_seconds) || sample_seconds < 0 || sample_seconds > 1) {
    throw ConfigError("sim.sample_seconds = " + std::to_string(sample_seconds) + "; valid range is [0, 1]");
  }
}

struct SimDevice::Arena {
  tbb::task_arena arena{1};
};

SimDevice::~SimDevice() = default;

void SimDevice::set_one_thread() { m_arena = std::make_unique<Arena>(); }

void SimDevice::bind() { detail::tighten_timer_slack(); }

std::string SimDevice::name() const { return "sim" + std::to_string(m_index); }

void SimDevice::begin_step(std::uint64_t step, std::chrono::steady_clock::time_point start) {
  m_step = step;
  m_step_start = start;
  m_count = 0;  // a failed step may have left chunks unfinished: they hold up nothing in this one
  m_step_seconds = 0;
}

void SimDevice::set_call_seconds(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 1) throw ConfigError("sim.call_seconds = " + std::to_string(seconds) + " s; valid range is [0, 1]");
  m_call_seconds = seconds;
}

void SimDevice::set_in_flight(std::size_t k, double lead) {
  check_in_flight(k);
  if (!std::isfinite(lead) || lead < 0 || lead > 1) throw ConfigError("sim.launch_lead = " + std::to_string(lead) + " s; valid range is [0, 1]");
  m_in_flight = k;
  m_lead = std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(lead));
}

ChunkTiming SimDevice::run_chunk(ChunkContext& ctx, const ChunkFunction& fn) {
  using Clock = std::chrono::steady_clock;
  const auto launched = Clock::now();
  const auto start = m_count == 0 ? launched : std::max(launched, last_end());
  double speed = m_speed;
  if (m_factor) {
    const double f = m_factor(m_step, std::chrono::duration<double>(start - m_step_start).count());
    if (std::isfinite(f) && f > 0) speed *= f;
  }
  if (m_arena) {
    m_arena->arena.execute([&] { fn(ctx); });
  } else {
    fn(ctx);
  }
  double work = static_cast<double>(ctx.samples.size());
  if (m_sample_cost) {
    work = 0;
    for (std::uint32_t s : ctx.samples) work += m_sample_cost(s);
  }
  double seconds = m_call_seconds + work * m_sample_seconds / speed;
  if (ctx.home_device != m_index && m_bytes_per_sample > 0) {
    seconds += m_bytes_per_sample * static_cast<double>(ctx.samples.size()) / m_link_bw + m_latency;
  }
  // The chunk ends when its simulated time is up, or when its function returns if that took longer (a chunk
  // function doing real host work): with one in flight this is the synchronous device's max(work, simulated).
  const auto end = std::max(start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)), Clock::now());
  m_step_seconds += std::chrono::duration<double>(end - start).count();
  m_running[(m_head + m_count++) % m_running.size()] = end;
  const ChunkTiming timing{.device_begin = start, .device_end = end};
  // Return once fewer than m_in_flight chunks are unfinished (with 1: once this one is done), and, with a lead,
  // once the queued work ends within the lead: one sleep, until the later of the two.
  for (;;) {
    const auto now = Clock::now();
    while (m_count > 0 && m_running[m_head] <= now) m_head = (m_head + 1) % m_running.size(), --m_count;
    if (m_count == 0) return timing;
    const bool full = m_count >= m_in_flight;
    const auto due = m_lead > Clock::duration::zero() ? last_end() - m_lead : now;  // when only the lead is left
    if (!full && due <= now) return timing;
    if (!sleep_until_or_cancel(std::max(full ? m_running[m_head] : now, due))) {
      m_count = 0;  // cancelled by the watchdog: the step fails, nothing of it is left to finish
      return timing;
    }
  }
}

double SimDevice::queued_seconds() const {
  if (m_count == 0) return 0.0;
  return std::max(0.0, std::chrono::duration<double>(last_end() - std::chrono::steady_clock::now()).count());
}

void SimDevice::finish_chunks() {
  if (m_count > 0) (void)sleep_until_or_cancel(last_end());
  m_count = 0;
}

}  // namespace stealbatch

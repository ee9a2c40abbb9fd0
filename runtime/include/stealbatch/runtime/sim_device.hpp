// A simulated device: runs the chunk function on the host, then holds the chunk until its simulated time is up.
#pragma once

#include <stealbatch/runtime/device.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

namespace stealbatch {

// A chunk takes call_seconds (0 unless set) + sample_seconds * (the sum of its samples' relative costs, 1 each by
// default) / speed of simulated time, measured from the chunk's start: the device sleeps (burning no CPU) for whatever
// the chunk function's own host time left of it. The gradient is the chunk function's real one, so a run on simulated
// devices is as exact as one on CPU devices.
//
//   SimDevice slow(3, /*speed=*/0.25, /*sample_seconds=*/100e-6);   // 400 us per sample
class SimDevice final : public Device {
 public:
  SimDevice(std::size_t index, double speed, double sample_seconds, std::function<double(std::uint32_t)> sample_cost = {});
  ~SimDevice() override;
  std::string name() const override;
  void bind() override;
  ChunkTiming run_chunk(ChunkContext& ctx, const ChunkFunction& fn) override;
  double speed() const noexcept { return m_speed; }
  void begin_step(std::uint64_t step, std::chrono::steady_clock::time_point start) override;
  // A factor on the speed at (step, seconds into the step), evaluated at each chunk's start. Set before the runtime runs.
  void set_speed_factor(std::function<double(std::uint64_t, double)> f) { m_factor = std::move(f); }
  // A stolen chunk (ctx.home_device != this device) first waits for its inputs: bytes_per_sample * samples /
  // link_bw + latency seconds.
  void set_link(double bytes_per_sample, double link_bw, double latency) {
    m_bytes_per_sample = bytes_per_sample, m_link_bw = link_bw, m_latency = latency;
  }
  // A fixed cost of every call, whatever it holds and at any speed (a GPU's kernel launches): seconds, [0, 1]. Set
  // before the runtime runs.
  void set_call_seconds(double seconds);
  // Chunks launched and not yet finished, as on a GPU stream (1: each run_chunk() returns when its chunk is done).
  // The device runs its chunks back to back on a timeline of its own: a chunk starts when it is launched or when
  // the one before it ends, whichever is later, so a worker that wakes late (timer overshoot, a busy core) costs
  // the device nothing while a launched chunk is still queued. With a lead > 0, run_chunk() also returns only
  // once the queued work would run out within `lead` seconds: the worker then takes its next chunk just in time,
  // and until then the chunk stays where a thief can take it. Set before the runtime runs; k in [1, kMaxInFlight], lead
  // in [0, 1].
  void set_in_flight(std::size_t k, double lead = 0.0);
  // Runs each chunk function inside a task arena of one thread, as a CPU device of one thread does: kernels that size
  // their threads to the arena (oneDNN through use_arena_threads()) then run on one (deterministic mode). Set before
  // the runtime runs.
  void set_one_thread();
  void finish_chunks() override;
  double queued_seconds() const override;
  std::optional<double> step_device_seconds() const override { return m_step_seconds; }

 private:
  std::size_t m_index;
  double m_speed;
  double m_sample_seconds;
  std::function<double(std::uint32_t)> m_sample_cost;
  std::function<double(std::uint64_t, double)> m_factor;
  double m_call_seconds = 0;
  double m_bytes_per_sample = 0, m_link_bw = 1, m_latency = 0;
  std::size_t m_in_flight = 1;
  std::chrono::steady_clock::duration m_lead{};
  // Worker-thread state: the end times of the launched, unfinished chunks, a ring of at most m_in_flight,
  // oldest at m_head. A fixed ring: the chunk path allocates nothing.
  std::array<std::chrono::steady_clock::time_point, kMaxInFlight> m_running{};
  std::size_t m_head = 0, m_count = 0;
  // The end of the last launched chunk (m_count > 0): when a chunk launched now could start.
  std::chrono::steady_clock::time_point last_end() const { return m_running[(m_head + m_count - 1) % m_running.size()]; }
  struct Arena;
  std::unique_ptr<Arena> m_arena;  // set_one_thread()
  double m_step_seconds = 0;  // this step's simulated chunk time so far
  // Written by the runtime's thread before a step and read by this device's worker during it: ordered by the
  // scheduler's step hand-off (its release/acquire of the step sequence).
  std::uint64_t m_step = 0;
  std::chrono::steady_clock::time_point m_step_start{};
};

}  // namespace stealbatch

// A simulated device: runs the chunk function on the host, then holds the chunk until its simulated time is up.
#pragma once

#include <stealbatch/runtime/device.hpp>

#include <cstdint>
#include <functional>

namespace stealbatch {

// A chunk takes sample_seconds * (the sum of its samples' relative costs, 1 each by default) / speed of simulated
// time, measured from the chunk's start: the device sleeps (burning no CPU) for whatever the chunk function's own
// host time left of it. The gradient is the
// chunk function's real one, so a run on simulated devices is as exact as one on CPU devices.
//
//   SimDevice slow(3, /*speed=*/0.25, /*sample_seconds=*/100e-6);   // 400 us per sample
class SimDevice final : public Device {
 public:
  SimDevice(std::size_t index, double speed, double sample_seconds, std::function<double(std::uint32_t)> sample_cost = {});
  std::string name() const override;
  void bind() override;
  void run_chunk(ChunkContext& ctx, const ChunkFunction& fn) override;
  double speed() const noexcept { return m_speed; }

 private:
  std::size_t m_index;
  double m_speed;
  double m_sample_seconds;
  std::function<double(std::uint32_t)> m_sample_cost;
};

}  // namespace stealbatch

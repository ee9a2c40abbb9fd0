// Host devices (CPU, simulated) share one copy of the parameters and one optimizer: each device's worker reduces and
// updates its own slice of them in one phase (reduction/), instead of every device updating a full replica of its
// own. Double-buffered: the update writes next() (and the optimizer's next state), and only a step that completed
// switches to it (commit()), so a step that fails in that phase leaves nothing applied.
#pragma once

#include <stealbatch/runtime/optimizer.hpp>

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

namespace stealbatch {

struct SharedParameters {
  // The parameters' first values in both buffers, and a fresh optimizer for them.
  void init(std::span<const float> initial, const OptimizerOptions& o) {
    for (auto& b : m_buffers) b.assign(initial.begin(), initial.end());
    m_live = 0;
    optimizer = std::make_unique<Optimizer>(o, initial.size(), /*double_buffered=*/true);
  }
  // Both buffers hold `values` (a checkpoint's), with the optimizer's state restored by the caller.
  void assign(std::span<const float> values) {
    for (auto& b : m_buffers) b.assign(values.begin(), values.end());
  }
  std::span<const float> live() const noexcept { return m_buffers[m_live]; }  // what the devices read
  std::span<float> next() noexcept { return m_buffers[1 - m_live]; }          // what this step's update writes
  // The step completed: the optimizer's next state and the next buffer become the live ones.
  void commit() {
    optimizer->commit();
    m_live = 1 - m_live;
  }

  std::unique_ptr<Optimizer> optimizer;

 private:
  std::array<std::vector<float>, 2> m_buffers;
  std::size_t m_live = 0;
};

}  // namespace stealbatch

// SGD with momentum and Adam over flat buffers: the same update on every replica keeps the replicas identical.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace stealbatch {

enum class OptimizerKind { kSgd, kAdam };

//   OptimizerOptions o{.kind = OptimizerKind::kAdam, .lr = 1e-3f};
struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;
  float lr = 0.05f;            // (0, 10]
  float momentum = 0.9f;       // SGD, [0, 1)
  float beta1 = 0.9f;          // Adam, [0, 1)
  float beta2 = 0.999f;        // Adam, [0, 1)
  float eps = 1e-8f;           // Adam, (0, 1)
  float weight_decay = 0.0f;   // [0, 1): added to the gradient as weight_decay * param
};

// Throws ConfigError naming the field, the value and the valid range.
void validate(const OptimizerOptions& o);

// An optimizer's state in host memory, as a checkpoint holds it: the first moment (SGD's velocity, Adam's m), the
// second (Adam's v; empty for SGD) and the steps taken (Adam's bias correction counts them).
struct OptimizerState {
  std::vector<float> first, second;
  std::uint64_t steps = 0;
};
// "sgd" or "adam"; throws ConfigError naming the field ("optimizer").
OptimizerKind parse_optimizer(std::string_view name);

// One replica's optimizer state (SGD velocity, or Adam's moments and step count).
class Optimizer {
 public:
  Optimizer(const OptimizerOptions& options, std::size_t size, bool double_buffered = false);
  // params -= update(grad_sum * grad_scale): grad_scale turns the reduced sum into the full-batch mean.
  void step(std::span<float> params, std::span<const float> grad_sum, float grad_scale);
  // The same step in parts and out of place, for an optimizer made with double_buffered: update_into() reads
  // `params` and the current state and writes `next_params` and the next state, over [begin, end); calls for
  // ranges that do not overlap may run on any threads at once. commit() then makes the next state current and
  // counts the step. Without commit() (a step that failed part way) the current state is untouched and the next
  // update_into() starts over. Element for element the result is step()'s, so the parts may be split any way.
  //   parallel_for(slices, [&](auto s) { opt.update_into(params, next, grad, scale, s.begin, s.end); });
  //   opt.commit(); std::swap(params, next);
  void update_into(std::span<const float> params, std::span<float> next_params, std::span<const float> grad_sum, float grad_scale,
                   std::size_t begin, std::size_t end);
  void commit() noexcept;
  std::uint64_t steps() const noexcept { return m_t; }
  const OptimizerOptions& options() const noexcept { return m_o; }
  // The state a checkpoint holds: the first moment (SGD's velocity, Adam's m) and the second (Adam's v; empty for SGD).
  std::span<const float> first_moment() const noexcept { return m_m; }
  std::span<const float> second_moment() const noexcept { return m_v; }
  // Replaces the state (a resumed run). Throws ConfigError when a size differs from this optimizer's.
  void restore(std::span<const float> first, std::span<const float> second, std::uint64_t steps);
  // For learning-rate schedules; throws ConfigError outside (0, 10].
  void set_lr(float lr);

 private:
  OptimizerOptions m_o;
  std::vector<float> m_m;  // SGD velocity, or Adam's first moment
  std::vector<float> m_v;  // Adam's second moment
  std::vector<float> m_m_next, m_v_next;  // double-buffered: the state update_into() writes
  std::uint64_t m_t = 0;
};

}  // namespace stealbatch

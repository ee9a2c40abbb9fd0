// The Device interface a runtime drives, and what a chunk function is handed.
#pragma once

#include <stealbatch/runtime/parameters.hpp>
#include <stealbatch/scheduler/chunk_deque.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

namespace stealbatch {

// Everything a chunk function needs: which device runs it, which samples, the device's replica of the
// parameters (read-only during a step), and the device's gradient buffer to accumulate into (add, never assign:
// other chunks of the step accumulate into the same buffer). The gradient is a sum over samples, not a mean:
// the runtime divides by the step's sample count after the reduction.
//
//   auto fn = [&](ChunkContext& ctx) {
//     for (std::uint32_t s : ctx.samples) loss += accumulate_grad(ctx.params, ctx.grad, s);
//     ctx.add_loss(loss);
//   };
struct ChunkContext {
  std::size_t device = 0;
  std::size_t home_device = 0;   // where the chunk was placed; != device when it was stolen (its inputs moved)
  ChunkId chunk = 0;
  std::span<const std::uint32_t> samples;
  std::span<const float> params;
  std::span<float> grad;
  const ParameterLayout* layout = nullptr;
  void* stream = nullptr;        // the device's compute stream (cudaStream_t) on a GPU; nullptr on a CPU device
  double* loss_sum = nullptr;    // the device's running loss for this step
  void add_loss(double sum_over_chunk) const { *loss_sum += sum_over_chunk; }
};

using ChunkFunction = std::function<void(ChunkContext&)>;

// One compute device. Each device is driven by one worker thread of the runtime.
class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;
  // Called once on the device's worker thread before it runs anything (bind a GPU, pin a thread).
  virtual void bind() {}
  // Runs one chunk; returns once its gradient is in ctx.grad.
  virtual void run_chunk(ChunkContext& ctx, const ChunkFunction& fn) = 0;
  // Called by the runtime's thread before each step's chunks, with the step's number (from 1) and start time.
  virtual void begin_step(std::uint64_t /*step*/, std::chrono::steady_clock::time_point /*start*/) {}
};

}  // namespace stealbatch
